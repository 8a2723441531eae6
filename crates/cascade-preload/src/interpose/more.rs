//! Calls glibc builds on other calls internally, so that wrapping those is not enough:
//! remove (unlink, then rmdir), lockf (fcntl locks), lutimes/futimes/futimesat
//! (utimensat), lchmod (fchmodat), mknod/mkfifo (the store holds only regular files and
//! directories: a regular mknod creates a file, anything else is EPERM, as for links),
//! pathconf (the limits of a tmpfs, which the store's names follow); and two things the store
//! does not have: file handles and change notification (EOPNOTSUPP).

use super::*;
use libc::{c_int, c_long, c_uint};
use std::ffi::c_char;

/// # Safety
/// C ABI: `path` is NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "remove"))]
#[boundary]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    if unsafe { classify(path) }.is_none() {
        return call_real!(remove: fn(*const c_char) -> c_int, -1; path);
    }
    // SAFETY: per the C contract; the wrappers serve the store path.
    let unlinked = unsafe { names::unlink(path) };
    if unlinked == 0 {
        return 0;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    if errno == Some(libc::EISDIR) {
        // SAFETY: as above.
        return unsafe { names::rmdir(path) };
    }
    unlinked
}

macro_rules! lockf_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, len: libc::off64_t) -> c_int {
            if !is_cascade_fd(fd) {
                return call_real!($name: fn(c_int, c_int, libc::off64_t) -> c_int, -1; fd, cmd, len);
            }
            lockf_store(fd, cmd, len)
        }
    };
}
lockf_wrapper!(lockf);
lockf_wrapper!(lockf64);

/// lockf as glibc builds it: a record lock from the current offset, through fcntl.
fn lockf_store(fd: c_int, cmd: c_int, len: libc::off64_t) -> c_int {
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_whence = libc::SEEK_CUR as i16;
    fl.l_start = 0;
    fl.l_len = len;
    let (op, kind) = match cmd {
        libc::F_TEST => (libc::F_GETLK, libc::F_RDLCK),
        libc::F_ULOCK => (libc::F_SETLK, libc::F_UNLCK),
        libc::F_LOCK => (libc::F_SETLKW, libc::F_WRLCK),
        libc::F_TLOCK => (libc::F_SETLK, libc::F_WRLCK),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    fl.l_type = kind as i16;
    // SAFETY: the fcntl wrapper with a flock it may read and write.
    let r = unsafe { fds::fcntl(fd, op, &mut fl as *mut libc::flock as libc::c_ulong) };
    if r < 0 || cmd != libc::F_TEST {
        return r;
    }
    // SAFETY: getpid cannot fail.
    if fl.l_type == libc::F_UNLCK as i16 || fl.l_pid == unsafe { libc::getpid() } {
        0
    } else {
        set_errno(libc::EACCES);
        -1
    }
}

/// Two timevals as utimensat's timespecs (null stays null: now).
///
/// # Safety
/// `tv` is null or points at two timevals.
unsafe fn timespecs(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let (a, m) = unsafe { (*tv, *tv.add(1)) };
    let ts = |t: libc::timeval| libc::timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_usec * 1000,
    };
    Some([ts(a), ts(m)])
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "lutimes"))]
#[boundary]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: per the C contract.
    if unsafe { classify(path) }.is_none() {
        return call_real!(lutimes: fn(*const c_char, *const libc::timeval) -> c_int, -1; path, tv);
    }
    // SAFETY: per the C contract.
    let ts = unsafe { timespecs(tv) };
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the wrapper with the same path and converted times.
    unsafe { names::utimensat(libc::AT_FDCWD, path, ptr, libc::AT_SYMLINK_NOFOLLOW) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "futimes"))]
#[boundary]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if !is_cascade_fd(fd) {
        return call_real!(futimes: fn(c_int, *const libc::timeval) -> c_int, -1; fd, tv);
    }
    // SAFETY: per the C contract.
    let ts = unsafe { timespecs(tv) };
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the wrapper with converted times.
    unsafe { names::futimens(fd, ptr) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "futimesat"))]
#[boundary]
pub unsafe extern "C" fn futimesat(
    dirfd: c_int,
    path: *const c_char,
    tv: *const libc::timeval,
) -> c_int {
    // SAFETY: per the C contract.
    let ours = (!path.is_null() && unsafe { classify_at(dirfd, path) }.is_some())
        || (path.is_null() && is_cascade_fd(dirfd));
    if !ours {
        return call_real!(futimesat: fn(c_int, *const c_char, *const libc::timeval) -> c_int, -1; dirfd, path, tv);
    }
    // SAFETY: per the C contract.
    let ts = unsafe { timespecs(tv) };
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: the wrapper with the same path and converted times.
    unsafe { names::utimensat(dirfd, path, ptr, 0) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "lchmod"))]
#[boundary]
pub unsafe extern "C" fn lchmod(path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    if unsafe { classify(path) }.is_none() {
        return call_real!(lchmod: fn(*const c_char, c_uint) -> c_int, -1; path, mode);
    }
    // The store has no symbolic links: the path itself changes.
    // SAFETY: the wrapper with the caller's arguments.
    unsafe { names::fchmodat(libc::AT_FDCWD, path, mode, 0) }
}

/// mknod of a store path: a regular file (type 0 or S_IFREG) is created as by open with
/// O_CREAT|O_EXCL; other types are EPERM.
fn mknod_store(p: &str, mode: c_uint) -> c_int {
    let kind = mode & libc::S_IFMT;
    if kind != 0 && kind != libc::S_IFREG {
        // The kernel's checks come first: an existing name, a missing or non-directory
        // parent.
        let checked = store().and_then(|s| {
            if s.stat(p).is_ok() {
                return Err(Error::new(libc::EEXIST, ""));
            }
            let parent = p
                .rsplit_once('/')
                .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
            if !s.stat(parent)?.is_dir() {
                return Err(Error::new(libc::ENOTDIR, ""));
            }
            Ok(())
        });
        return fail(&checked.err().unwrap_or_else(|| {
            Error::new(
                libc::EPERM,
                format!("{p}: the Cascade store holds only regular files and directories"),
            )
        }));
    }
    match sysio::open_store_path(
        p,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode & 0o7777,
    ) {
        Ok(fd) => {
            // SAFETY: the descriptor just opened, through the close wrapper.
            unsafe { sysio::close(fd) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mknod"))]
#[boundary]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: c_uint, dev: libc::dev_t) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => mknod_store(&p, mode),
        None => {
            call_real!(mknod: fn(*const c_char, c_uint, libc::dev_t) -> c_int, -1; path, mode, dev)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mknodat"))]
#[boundary]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_uint,
    dev: libc::dev_t,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => mknod_store(&p, mode),
        None => {
            call_real!(mknodat: fn(c_int, *const c_char, c_uint, libc::dev_t) -> c_int, -1; dirfd, path, mode, dev)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mkfifo"))]
#[boundary]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => mknod_store(&p, libc::S_IFIFO | mode),
        None => call_real!(mkfifo: fn(*const c_char, c_uint) -> c_int, -1; path, mode),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mkfifoat"))]
#[boundary]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => mknod_store(&p, libc::S_IFIFO | mode),
        None => {
            call_real!(mkfifoat: fn(c_int, *const c_char, c_uint) -> c_int, -1; dirfd, path, mode)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "pathconf"))]
#[boundary]
pub unsafe extern "C" fn pathconf(path: *const c_char, name: c_int) -> c_long {
    // SAFETY: per the C contract.
    let Some(p) = (unsafe { classify(path) }) else {
        return call_real!(pathconf: fn(*const c_char, c_int) -> c_long, -1; path, name);
    };
    if let Err(e) = store().and_then(|s| readthrough::with_fetch(&p, || s.stat(&p))) {
        set_errno(e.errno());
        return -1;
    }
    // The limits of a tmpfs (names up to 255 bytes, paths up to 4096).
    call_real!(pathconf: fn(*const c_char, c_int) -> c_long, -1; c"/dev/shm".as_ptr(), name)
}

/// Store files have no kernel file handles: EOPNOTSUPP, as from a file system without
/// export support.
///
/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "name_to_handle_at"))]
#[boundary]
pub unsafe extern "C" fn name_to_handle_at(
    dirfd: c_int,
    path: *const c_char,
    handle: *mut libc::c_void,
    mount_id: *mut c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => match store().and_then(|s| s.stat(&p)) {
            Ok(_) => fail(&Error::new(libc::EOPNOTSUPP, "")),
            Err(e) => fail(&e),
        },
        None => {
            call_real!(name_to_handle_at: fn(c_int, *const c_char, *mut libc::c_void, *mut c_int, c_int) -> c_int, -1; dirfd, path, handle, mount_id, flags)
        }
    }
}

/// The store sends no change notifications: a watch on a store path is EOPNOTSUPP (after
/// the checks the kernel makes first: the path exists).
///
/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "inotify_add_watch"))]
#[boundary]
pub unsafe extern "C" fn inotify_add_watch(fd: c_int, path: *const c_char, mask: u32) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => match store().and_then(|s| s.stat(&p)) {
            Ok(_) => fail(&Error::new(libc::EOPNOTSUPP, "")),
            Err(e) => fail(&e),
        },
        None => {
            call_real!(inotify_add_watch: fn(c_int, *const c_char, u32) -> c_int, -1; fd, path, mask)
        }
    }
}
