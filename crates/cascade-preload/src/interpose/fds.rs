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
    new
}

/// # Safety
/// C ABI.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let new = call_real!(dup: fn(c_int) -> c_int, -1; fd);
    match lookup(fd) {
        Some(e) => share(&e, new),
        None => new,
    }
}

/// # Safety
/// C ABI.
#[no_mangle]
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
#[no_mangle]
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
        // Descriptor flags, record locks, leases and the rest act on the backing memfd.
        _ => call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

/// # Safety
/// C ABI (the variadic argument is passed through as a machine word).
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match lookup(fd) {
        Some(e) => fcntl_impl(&e, fd, cmd, arg),
        None => call_real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

/// # Safety
/// C ABI.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match lookup(fd) {
        Some(e) => fcntl_impl(&e, fd, cmd, arg),
        None => call_real!(fcntl64: fn(c_int, c_int, c_ulong) -> c_int, -1; fd, cmd, arg),
    }
}

// flock on the backing memfd gives well-defined, crash-safe semantics per open description;
// it is passed through unchanged (see docs/interposition-design.md for the per-inode plan).
