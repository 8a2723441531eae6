//! Descriptor calls: dup, dup2, dup3, fcntl, flock. The kernel duplicates the backing memfd
//! (so numbering, close-on-exec and inheritance are the kernel's); we share the entry.

use super::*;
use libc::{c_int, c_ulong};

pub(crate) fn entry(fd: c_int) -> Option<Arc<Entry>> {
    lookup(fd)
}

/// Records that `new` (made by the kernel from `old`) refers to the same description.
fn share(old: &Arc<Entry>, new: c_int) -> c_int {
    if new < 0 {
        return new;
    }
    if new as usize >= MAX_FDS {
        // SAFETY: closing a descriptor we were just given.
        unsafe { libc::syscall(libc::SYS_close, new) };
        set_errno(libc::EMFILE);
        return -1;
    }
    if let Some(prev) = unregister(new) {
        if let Ok(s) = store() {
            s.release_description(prev.desc);
        }
    }
    if let Some(d) = old.description() {
        d.add_ref();
    }
    register(new, old.clone());
    stdio::follow_standard_stream(new);
    new
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dup"))]
#[boundary]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let new = call_real!(dup: fn(c_int) -> c_int, -1; fd);
    match lookup(fd) {
        Some(e) => share(&e, new),
        None => new,
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dup2"))]
#[boundary]
pub unsafe extern "C" fn dup2(fd: c_int, fd2: c_int) -> c_int {
    let src = lookup(fd);
    if src.is_none() && !is_cascade_fd(fd2) {
        return call_real!(dup2: fn(c_int, c_int) -> c_int, -1; fd, fd2);
    }
    if fd == fd2 {
        return call_real!(dup2: fn(c_int, c_int) -> c_int, -1; fd, fd2);
    }
    let new = call_real!(dup2: fn(c_int, c_int) -> c_int, -1; fd, fd2);
    if new < 0 {
        return new;
    }
    match src {
        Some(e) => share(&e, new),
        None => {
            // A Cascade descriptor was replaced by a foreign one.
            if let Some(prev) = unregister(fd2) {
                if let Ok(s) = store() {
                    s.release_description(prev.desc);
                }
            }
            new
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dup3"))]
#[boundary]
pub unsafe extern "C" fn dup3(fd: c_int, fd2: c_int, flags: c_int) -> c_int {
    let src = lookup(fd);
    let new = call_real!(dup3: fn(c_int, c_int, c_int) -> c_int, -1; fd, fd2, flags);
    if new < 0 {
        return new;
    }
    match src {
        Some(e) => share(&e, new),
        None => {
            if let Some(prev) = unregister(fd2) {
                if let Ok(s) = store() {
                    s.release_description(prev.desc);
                }
            }
            new
        }
    }
}

fn fcntl_impl(e: &Arc<Entry>, fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let new = call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg);
            share(e, new)
        }
        libc::F_GETFL => match e.description() {
            Some(d) => d.flags() | libc::O_LARGEFILE,
            None => fail(&Error::new(libc::EBADF, "")),
        },
        libc::F_SETFL => match e.description() {
            // Only O_APPEND (and the no-op O_NONBLOCK/O_DIRECT/O_NOATIME) can change.
            Some(d) => {
                let keep = d.flags() & !libc::O_APPEND;
                d.set_flags(keep | (arg as c_int & libc::O_APPEND));
                0
            }
            None => fail(&Error::new(libc::EBADF, "")),
        },
        // A lock the descriptor's access mode does not allow: EBADF, as the kernel says
        // (the lock file itself is open for reading and writing).
        cmd if is_set_lock_cmd(cmd) && !lock_allowed(e, arg) => fail(&Error::new(libc::EBADF, "")),
        // Record locks go to the file's lock file (see lock_fd).
        cmd if is_lock_cmd(cmd) => match lock_fd(e) {
            Ok(lfd) => call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; lfd, cmd, arg),
            Err(err) => fail(&err),
        },
        // Descriptor flags, leases and the rest act on the backing memfd.
        _ => call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

/// # Safety
/// C ABI (the variadic argument is passed through as a machine word).
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fcntl"))]
#[boundary]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match lookup(fd) {
        Some(e) => fcntl_impl(&e, fd, cmd, arg),
        None => call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fcntl64"))]
#[boundary]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match lookup(fd) {
        Some(e) => fcntl_impl(&e, fd, cmd, arg),
        None => call_real!(fcntl64: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

// ---- locks --------------------------------------------------------------------------------

/// Lock files live in `Store::lock_dir`, one per Cascade file (<inode>.<generation>), so
/// flock and fcntl record locks get the kernel's exact semantics (conflicts between separate
/// opens and processes, release when a process dies).
pub(crate) fn lock_file_path(store: &Store, ino: u64, generation: u32) -> String {
    format!(
        "{}/{ino}.{generation}",
        Store::lock_dir(store.name()).display()
    )
}

/// This entry's lock-file descriptor (one per open file description, as flock wants).
fn lock_fd(e: &Entry) -> Result<c_int, Error> {
    if let Some(fd) = e.lock_fd.get() {
        return Ok(*fd);
    }
    let s = store()?;
    s.note_lock_file();
    let path = lock_file_path(s, e.file.ino(), e.file.generation());
    if let Some(dir) = std::path::Path::new(&path).parent() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    }
    let c = std::ffi::CString::new(path.clone()).map_err(|_| Error::new(libc::EINVAL, ""))?;
    let fd = call_real!(open: fn(*const std::ffi::c_char, c_int, libc::c_uint) -> c_int, -1;
        c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600);
    if fd < 0 {
        return Err(Error::last_os(path));
    }
    match e.lock_fd.set(fd) {
        Ok(()) => Ok(fd),
        Err(_) => {
            // Another thread won the race: use its descriptor.
            // SAFETY: closing the descriptor we just opened.
            unsafe { libc::syscall(libc::SYS_close, fd) };
            e.lock_fd
                .get()
                .copied()
                .ok_or_else(|| Error::new(libc::EIO, ""))
        }
    }
}

fn is_set_lock_cmd(cmd: c_int) -> bool {
    matches!(
        cmd,
        libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
    )
}

/// A read lock needs a readable description, a write lock a writable one.
fn lock_allowed(e: &Entry, arg: c_ulong) -> bool {
    let Some(d) = e.description() else {
        return false;
    };
    if arg == 0 {
        return true;
    }
    // SAFETY: for the set-lock commands the argument is the caller's struct flock.
    let kind = unsafe { (*(arg as *const libc::flock)).l_type } as c_int;
    let acc = d.flags() & libc::O_ACCMODE;
    match kind {
        libc::F_RDLCK => acc != libc::O_WRONLY,
        libc::F_WRLCK => acc != libc::O_RDONLY,
        _ => true,
    }
}

fn is_lock_cmd(cmd: c_int) -> bool {
    matches!(
        cmd,
        libc::F_GETLK
            | libc::F_SETLK
            | libc::F_SETLKW
            | libc::F_OFD_GETLK
            | libc::F_OFD_SETLK
            | libc::F_OFD_SETLKW
    )
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "flock"))]
#[boundary]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    match lookup(fd) {
        Some(e) => match lock_fd(&e) {
            Ok(lfd) => call_real!(flock: fn(c_int, c_int) -> c_int, -1; lfd, op),
            Err(err) => fail(&err),
        },
        None => call_real!(flock: fn(c_int, c_int) -> c_int, -1; fd, op),
    }
}
