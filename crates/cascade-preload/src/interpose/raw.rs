//! `syscall(2)`: programs and libraries that make file system calls by number (Rust's
//! standard library makes statx this way; libstdc++, hwloc and libudev use it too). The
//! numbers of the calls wrapped elsewhere are sent to their wrapper when a path or
//! descriptor is Cascade's; every other call goes to glibc's syscall unchanged.
//!
//! syscall is variadic; on x86_64 and aarch64 Linux variadic integer arguments travel in
//! the same registers (and stack slots) as fixed ones, so it is defined with six fixed
//! `long` arguments after the number (those a call does not pass are never read for its
//! number). Elsewhere it is not wrapped.

use super::*;
use libc::{c_int, c_long, c_uint, c_void, size_t};
use std::ffi::c_char;

/// The call's path argument at `path` is Cascade's (relative to `dirfd`).
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn path_is_ours(dirfd: c_int, path: *const c_char) -> bool {
    // SAFETY: per the contract.
    unsafe { classify_at(dirfd, path) }.is_some()
}

/// # Safety
/// C ABI of syscall(2): the arguments are those of system call `n`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "syscall"))]
#[boundary]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    let ai = a as c_int;
    // SAFETY: each wrapper gets the arguments of its own system call, as the caller passed
    // them; they check what they use as the real call would.
    let handled: Option<c_long> = unsafe {
        match n {
            libc::SYS_statx if path_is_ours(ai, b as *const c_char) => Some(stat::statx(
                ai,
                b as *const c_char,
                c as c_int,
                d as c_uint,
                e as *mut libc::statx,
            )
                as c_long),
            libc::SYS_openat if path_is_ours(ai, b as *const c_char) => {
                Some(sysio::openat(ai, b as *const c_char, c as c_int, d as c_uint) as c_long)
            }
            libc::SYS_newfstatat if path_is_ours(ai, b as *const c_char) => {
                Some(
                    stat::fstatat64(ai, b as *const c_char, c as *mut libc::stat64, d as c_int)
                        as c_long,
                )
            }
            libc::SYS_unlinkat if path_is_ours(ai, b as *const c_char) => {
                Some(names::unlinkat(ai, b as *const c_char, c as c_int) as c_long)
            }
            libc::SYS_mkdirat if path_is_ours(ai, b as *const c_char) => {
                Some(names::mkdirat(ai, b as *const c_char, c as c_uint) as c_long)
            }
            libc::SYS_renameat2
                if path_is_ours(ai, b as *const c_char)
                    || path_is_ours(c as c_int, d as *const c_char) =>
            {
                Some(names::renameat2(
                    ai,
                    b as *const c_char,
                    c as c_int,
                    d as *const c_char,
                    e as c_uint,
                ) as c_long)
            }
            libc::SYS_faccessat | libc::SYS_faccessat2 if path_is_ours(ai, b as *const c_char) => {
                Some(stat::faccessat(ai, b as *const c_char, c as c_int, d as c_int) as c_long)
            }
            libc::SYS_close if is_cascade_fd(ai) => Some(sysio::close(ai) as c_long),
            libc::SYS_read if is_cascade_fd(ai) => {
                Some(sysio::read(ai, b as *mut c_void, c as size_t) as c_long)
            }
            libc::SYS_write if is_cascade_fd(ai) => {
                Some(sysio::write(ai, b as *const c_void, c as size_t) as c_long)
            }
            libc::SYS_pread64 if is_cascade_fd(ai) => {
                Some(sysio::pread64(ai, b as *mut c_void, c as size_t, d) as c_long)
            }
            libc::SYS_pwrite64 if is_cascade_fd(ai) => {
                Some(sysio::pwrite64(ai, b as *const c_void, c as size_t, d) as c_long)
            }
            libc::SYS_lseek if is_cascade_fd(ai) => {
                Some(sysio::lseek64(ai, b, c as c_int) as c_long)
            }
            libc::SYS_fstat if is_cascade_fd(ai) => {
                Some(stat::fstat64(ai, b as *mut libc::stat64) as c_long)
            }
            libc::SYS_fsync if is_cascade_fd(ai) => Some(sysio::fsync(ai) as c_long),
            libc::SYS_fdatasync if is_cascade_fd(ai) => Some(sysio::fdatasync(ai) as c_long),
            libc::SYS_ftruncate if is_cascade_fd(ai) => Some(sysio::ftruncate64(ai, b) as c_long),
            libc::SYS_getdents64 if is_cascade_fd(ai) => {
                Some(dirops::getdents64(ai, b as *mut c_void, c as size_t) as c_long)
            }
            _ => None,
        }
    };
    match handled {
        Some(r) => r,
        None => {
            let r = call_real!(syscall: fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long, -1; n, a, b, c, d, e, f);
            if n == libc::SYS_umask {
                names::umask_cache::invalidate();
            }
            if credentials::changes_a_threads_ids(n) {
                cascade_store::ownership::creator_ids::per_thread();
            }
            r
        }
    }
}
