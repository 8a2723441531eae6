//! Process calls that carry the virtual working directory to a new program.
//!
//! Inside the mount, the working directory is virtual (see dirops.rs); a new program learns
//! it from CASCADE_CWD. Programs that build their own environment list for exec (shells,
//! Python's subprocess with env=...) would drop it, or pass on a stale one, so the outgoing
//! list is rewritten here: CASCADE_CWD set to the current virtual directory, or removed.

use super::*;
use libc::c_int;
use std::ffi::{c_char, CString};

/// The environment to hand to the new program, as owned strings plus a NULL-terminated
/// pointer array borrowing them.
struct Envp {
    _owned: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

/// # Safety
/// `envp` is null or a NULL-terminated array of C strings.
unsafe fn rewrite_env(envp: *const *const c_char) -> Envp {
    let mut owned = Vec::new();
    if !envp.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: per the contract, the array ends with NULL.
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: each entry is a C string.
            let entry = unsafe { std::ffi::CStr::from_ptr(p) };
            if !entry.to_bytes().starts_with(b"CASCADE_CWD=") {
                owned.push(entry.to_owned());
            }
            i += 1;
        }
    }
    if let Some(cwd) = virtual_cwd() {
        if let Ok(c) = CString::new(format!("CASCADE_CWD={cwd}")) {
            owned.push(c);
        }
    }
    let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Envp {
        _owned: owned,
        ptrs,
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execve"))]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the C contract of execve.
    let env = unsafe { rewrite_env(envp) };
    call_real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int, -1; path, argv, env.ptrs.as_ptr())
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execvpe"))]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    let env = unsafe { rewrite_env(envp) };
    call_real!(execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int, -1; file, argv, env.ptrs.as_ptr())
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fexecve"))]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    let env = unsafe { rewrite_env(envp) };
    call_real!(fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int, -1; fd, argv, env.ptrs.as_ptr())
}

macro_rules! spawn_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            path: *const c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut c_char,
            envp: *const *mut c_char,
        ) -> c_int {
            // SAFETY: per the C contract.
            let env = unsafe { rewrite_env(envp as *const *const c_char) };
            call_real!($name: fn(*mut libc::pid_t, *const c_char, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int, libc::ENOSYS;
                pid, path, actions, attr, argv, env.ptrs.as_ptr() as *const *mut c_char)
        }
    };
}
spawn_wrapper!(posix_spawn);
spawn_wrapper!(posix_spawnp);

// ---- symbolic links cannot be made in the store ------------------------------------------

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "symlink"))]
pub unsafe extern "C" fn symlink(target: *const c_char, link: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(link) } {
        Some(p) => fail(&Error::new(
            libc::EPERM,
            format!("{p}: the Cascade store has no symbolic links"),
        )),
        None => call_real!(symlink: fn(*const c_char, *const c_char) -> c_int, -1; target, link),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "symlinkat"))]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    link: *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, link) } {
        Some(p) => fail(&Error::new(
            libc::EPERM,
            format!("{p}: the Cascade store has no symbolic links"),
        )),
        None => {
            call_real!(symlinkat: fn(*const c_char, c_int, *const c_char) -> c_int, -1; target, dirfd, link)
        }
    }
}

/// # Safety
/// C ABI. Hard links are not supported either (one name per file).
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "link"))]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { (classify(old), classify(new)) } {
        (None, None) => call_real!(link: fn(*const c_char, *const c_char) -> c_int, -1; old, new),
        (Some(_), Some(_)) => fail(&Error::new(
            libc::EPERM,
            "the Cascade store has no hard links",
        )),
        _ => fail(&Error::new(libc::EXDEV, "")),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "linkat"))]
pub unsafe extern "C" fn linkat(
    fd1: c_int,
    old: *const c_char,
    fd2: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { (classify_at(fd1, old), classify_at(fd2, new)) } {
        (None, None) => {
            call_real!(linkat: fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int, -1; fd1, old, fd2, new, flags)
        }
        (Some(_), Some(_)) => fail(&Error::new(
            libc::EPERM,
            "the Cascade store has no hard links",
        )),
        _ => fail(&Error::new(libc::EXDEV, "")),
    }
}
