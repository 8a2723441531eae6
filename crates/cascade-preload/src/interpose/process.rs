//! Exec: the new program gets the virtual working directory, a stored program is run (see
//! exec.rs), and the references the process gives up at exec are handed back.
//!
//! Inside the mount, the working directory is virtual (see dirops.rs); a new program learns
//! it from CASCADE_CWD. Programs that build their own environment list for exec (shells,
//! Python's subprocess with env=...) would drop it, or pass on a stale one, so the outgoing
//! list is rewritten here: CASCADE_CWD set to the current virtual directory, or removed.
//! glibc's execv/execvp reach execve internally, so they are wrapped too.

use super::*;
use libc::c_int;
use std::ffi::{c_char, CString};

/// The environment to hand to the new program, as owned strings plus a NULL-terminated
/// pointer array borrowing them.
pub(crate) struct Envp {
    _owned: Vec<CString>,
    pub(crate) ptrs: Vec<*const c_char>,
}

/// `envp` with CASCADE_CWD set to `cwd` (the virtual working directory when None), or
/// removed when there is none, and the new program told which inherited Cascade
/// descriptors' references are its own (`handed`, see [`HANDED_FDS_ENV`]).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of C strings.
pub(crate) unsafe fn rewrite_env(
    envp: *const *const c_char,
    cwd: Option<String>,
    handed: &[c_int],
) -> Envp {
    let ours = |entry: &[u8]| {
        entry.starts_with(b"CASCADE_CWD=")
            || entry.starts_with(HANDED_FDS_ENV.as_bytes())
                && entry.get(HANDED_FDS_ENV.len()) == Some(&b'=')
    };
    let mut owned = Vec::new();
    // SAFETY: per the contract, the array is null or ends with NULL.
    for p in unsafe { c_array(envp) } {
        // SAFETY: each entry is a C string.
        let entry = unsafe { std::ffi::CStr::from_ptr(p) };
        if !ours(entry.to_bytes()) {
            owned.push(entry.to_owned());
        }
    }
    if let Some(cwd) = cwd.or_else(virtual_cwd) {
        if let Ok(c) = CString::new(format!("CASCADE_CWD={cwd}")) {
            owned.push(c);
        }
    }
    if !handed.is_empty() {
        let list: Vec<String> = handed.iter().map(|fd| fd.to_string()).collect();
        if let Ok(c) = CString::new(format!("{HANDED_FDS_ENV}={}", list.join(","))) {
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

/// The process's Cascade descriptors whose close-on-exec flag is `cloexec` and whose
/// reference this image holds.
pub(crate) fn owned_fds(cloexec: bool) -> Vec<(c_int, Arc<Entry>)> {
    all_entries()
        .into_iter()
        .filter(|(fd, _)| {
            // SAFETY: F_GETFD only reads the descriptor's flags (raw, not the wrapper).
            let flags = unsafe { libc::syscall(libc::SYS_fcntl, *fd, libc::F_GETFD) };
            owns(*fd) && flags >= 0 && (flags as c_int & libc::FD_CLOEXEC != 0) == cloexec
        })
        .collect()
}

/// Runs an exec: `run(path, argv, envp)` with the store's plan for `path` applied (a stored
/// script or program) and the environment rewritten (CASCADE_CWD; the inheritable
/// descriptors whose references pass to the new image). The references of close-on-exec
/// descriptors, which the kernel closes at exec, are handed back first (but a last one: the
/// store's sweep frees it) and taken again if the exec fails. A vfork child shares its
/// parent's references and hands on none.
///
/// # Safety
/// `path` is NUL-terminated; `argv` and `envp` are null or NULL-terminated arrays of C
/// strings.
unsafe fn exec_with(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    run: impl FnOnce(*const c_char, *const *const c_char, *const *const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the contract.
    let plan = match unsafe { exec::plan(path, argv) } {
        Some(Err(e)) => return fail(&e),
        Some(Ok(plan)) => Some(plan),
        None => None,
    };
    let own_image = owns_its_table();
    // Also in a vfork child (its descriptor table is its own): the new image adopts only
    // descriptors named after their descriptions.
    super::sysio::name_anchored_descriptors();
    let handed: Vec<c_int> = if own_image {
        owned_fds(false).into_iter().map(|(fd, _)| fd).collect()
    } else {
        Vec::new()
    };
    // SAFETY: per the contract.
    let env = unsafe { rewrite_env(envp, None, &handed) };
    let store = store().ok();
    let handed_back: Vec<Arc<Entry>> = match store.filter(|_| own_image) {
        Some(s) => owned_fds(true)
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| s.description(e.desc).is_some_and(|d| d.drop_shared_ref()))
            .collect(),
        None => Vec::new(),
    };
    let result = match &plan {
        Some(plan) => {
            let args = plan.argv_ptrs(argv);
            run(plan.path.as_ptr(), args.as_ptr(), env.ptrs.as_ptr())
        }
        None => run(path, argv, env.ptrs.as_ptr()),
    };
    // Still here: the exec failed, and this process keeps its descriptors.
    let errno = std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    if let Some(s) = store {
        for e in &handed_back {
            if let Some(d) = s.description(e.desc) {
                d.add_ref();
            }
        }
    }
    set_errno(errno);
    result
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execve"))]
#[boundary]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let run = |path, argv, envp| call_real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int, -1; path, argv, envp);
    // SAFETY: per the C contract of execve.
    unsafe { exec_with(path, argv, envp, run) }
}

extern "C" {
    static environ: *const *const c_char;
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execv"))]
#[boundary]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the process's environment, as execv passes it.
    unsafe { execve(path, argv, environ) }
}

/// execvp and execvpe: a name with a '/' is run as it is; else each directory of PATH
/// (default "/bin:/usr/bin") in turn, the store's through the store; a file that is not a
/// program (ENOEXEC) is run by /bin/sh, as glibc does.
///
/// # Safety
/// `file` is NUL-terminated; `argv` and `envp` are NULL-terminated arrays of C strings.
unsafe fn exec_search(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if file.is_null() {
        set_errno(libc::ENOENT);
        return -1;
    }
    // SAFETY: NUL-terminated per the contract.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    if name.is_empty() {
        set_errno(libc::ENOENT);
        return -1;
    }
    if name.contains(&b'/') {
        // SAFETY: per the contract.
        return unsafe { exec_or_shell(file, argv, envp) };
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin".to_string());
    let mut denied = false;
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let mut candidate = dir.as_bytes().to_vec();
        candidate.push(b'/');
        candidate.extend_from_slice(name);
        let Ok(candidate) = CString::new(candidate) else {
            continue;
        };
        // SAFETY: a NUL-terminated path; the caller's arrays.
        unsafe { exec_or_shell(candidate.as_ptr(), argv, envp) };
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EACCES) => denied = true,
            Some(libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT) => {}
            _ => return -1,
        }
    }
    set_errno(if denied { libc::EACCES } else { libc::ENOENT });
    -1
}

/// execve, and on ENOEXEC /bin/sh with the file as its script.
///
/// # Safety
/// As [`exec_search`].
unsafe fn exec_or_shell(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { execve(file, argv, envp) };
    if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOEXEC) {
        return -1;
    }
    let mut args: Vec<*const c_char> = vec![c"/bin/sh".as_ptr(), file];
    // SAFETY: NULL-terminated per the contract; argv[0] gives way to the file.
    args.extend(unsafe { c_array(argv) }.into_iter().skip(1));
    args.push(std::ptr::null());
    // SAFETY: a NULL-terminated argv of C strings that outlive the call.
    unsafe { execve(c"/bin/sh".as_ptr(), args.as_ptr(), envp) };
    -1
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execvp"))]
#[boundary]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: per the C contract; the process's environment.
    unsafe { exec_search(file, argv, environ) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "execvpe"))]
#[boundary]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    unsafe { exec_search(file, argv, envp) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fexecve"))]
#[boundary]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // A Cascade descriptor's memfd is empty: its file is run by the path it was opened at.
    if let Some(e) = lookup(fd).filter(|e| !e.path.is_empty()) {
        let Ok(path) = CString::new(format!("{}{}", mount(), e.path)) else {
            set_errno(libc::ENOENT);
            return -1;
        };
        // SAFETY: a NUL-terminated path; the caller's arrays.
        return unsafe { execve(path.as_ptr(), argv, envp) };
    }
    // A host descriptor: exec_with has no path to plan (the null path is never the store's).
    let run = |_, argv, envp| call_real!(fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int, -1; fd, argv, envp);
    // SAFETY: per the C contract.
    unsafe { exec_with(std::ptr::null(), argv, envp, run) }
}

// ---- symbolic links cannot be made in the store ------------------------------------------

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "symlink"))]
#[boundary]
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
#[boundary]
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
#[boundary]
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
#[boundary]
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
