//! Namespace calls: unlink, rename, mkdir, rmdir, chmod, chown, utimens, realpath.

use super::*;
use libc::{c_int, c_uint};
use std::ffi::c_char;

fn status(r: Result<(), Error>) -> c_int {
    r.map(|_| 0).unwrap_or_else(|e| fail(&e))
}

pub(crate) fn umask_now() -> u32 {
    umask_cache::get()
}

/// The process's umask, read without changing it: swapping it (`umask(0)` then back) races
/// with other threads that set it or create files. Read once from /proc/self/status
/// ("Umask:") and kept while nothing changes it; the [`umask`] wrapper (and `syscall(SYS_umask)`)
/// invalidates it. A generation counter keeps a reader that raced with a change from caching
/// the old value.
pub(crate) mod umask_cache {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    /// Bits 0..=11 the mask, bit 12 "valid", bits 32.. the generation.
    static CACHE: AtomicU64 = AtomicU64::new(0);
    const VALID: u64 = 1 << 12;

    pub(crate) fn get() -> u32 {
        let seen = CACHE.load(SeqCst);
        if seen & VALID != 0 {
            return (seen & 0o7777) as u32;
        }
        let mask = read_proc().unwrap_or_else(swap_read);
        // Cached only if no umask call came in between (same generation).
        let _ = CACHE.compare_exchange(seen, seen | VALID | mask as u64, SeqCst, SeqCst);
        mask
    }

    /// After a umask call: the next reader reads it again.
    pub(crate) fn invalidate() {
        let mut cur = CACHE.load(SeqCst);
        loop {
            let next = ((cur >> 32).wrapping_add(1) << 32) & !(VALID | 0o7777);
            match CACHE.compare_exchange(cur, next, SeqCst, SeqCst) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// The "Umask:" line of /proc/self/status (Linux 4.7 and later), read with raw system
    /// calls (no wrapper is entered).
    fn read_proc() -> Option<u32> {
        // SAFETY: a NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                c"/proc/self/status".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return None;
        }
        let mut buf = [0u8; 4096];
        let mut len = 0;
        while len < buf.len() {
            let rest = &mut buf[len..];
            // SAFETY: reading into a live buffer of rest.len() bytes.
            let n = unsafe { libc::syscall(libc::SYS_read, fd, rest.as_mut_ptr(), rest.len()) };
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::syscall(libc::SYS_close, fd) };
        let text = std::str::from_utf8(&buf[..len]).ok()?;
        let line = text.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(line.trim(), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
    }

    /// Without /proc: the old way, swapping the mask and back (racy, but the only way).
    fn swap_read() -> u32 {
        // SAFETY: umask swaps a process attribute; it is restored at once.
        unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m
        }
    }
}

/// umask: the real call, then the cached mask is read again on next use.
///
/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "umask"))]
#[boundary]
pub unsafe extern "C" fn umask(mask: libc::mode_t) -> libc::mode_t {
    let old = call_real!(umask: fn(libc::mode_t) -> libc::mode_t, 0o022; mask);
    umask_cache::invalidate();
    old
}

/// Unlinks a store file and removes its lock file, if locks were ever taken on it. While no
/// lock file was ever made in this store, that is the unlink alone (no open to learn the
/// file's inode, no failing unlink of a lock file that is not there).
fn unlink_store(p: &str) -> Result<(), Error> {
    let s = store()?;
    let lock = if s.may_have_lock_files() {
        s.open(p, &cascade_store::OpenOptions::new())
            .ok()
            .map(|f| fds::lock_file_path(s, f.ino(), f.generation()))
    } else {
        None
    };
    s.unlink(p)?;
    if let Some(l) = lock {
        let _ = std::fs::remove_file(l);
    }
    Ok(())
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "unlink"))]
#[boundary]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => status(unlink_store(&p)),
        None => call_real!(unlink: fn(*const c_char) -> c_int, -1; path),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "unlinkat"))]
#[boundary]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) if flags & libc::AT_REMOVEDIR != 0 => status(store().and_then(|s| s.rmdir(&p))),
        Some(p) => status(unlink_store(&p)),
        None => {
            call_real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int, -1; dirfd, path, flags)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "rmdir"))]
#[boundary]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => status(store().and_then(|s| s.rmdir(&p))),
        None => call_real!(rmdir: fn(*const c_char) -> c_int, -1; path),
    }
}

fn mkdir_store(p: &str, mode: c_uint) -> c_int {
    status(store().and_then(|s| s.mkdir(p, mode & 0o7777 & !umask_now())))
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mkdir"))]
#[boundary]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => mkdir_store(&p, mode),
        None => call_real!(mkdir: fn(*const c_char, c_uint) -> c_int, -1; path, mode),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mkdirat"))]
#[boundary]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => mkdir_store(&p, mode),
        None => {
            call_real!(mkdirat: fn(c_int, *const c_char, c_uint) -> c_int, -1; dirfd, path, mode)
        }
    }
}

/// A rename with exactly one side in the store crosses file systems.
fn rename_pair(from: Option<Cow<str>>, to: Option<Cow<str>>, flags: c_uint) -> Option<c_int> {
    match (from, to) {
        (None, None) => None,
        (Some(f), Some(t)) => {
            if flags & libc::RENAME_NOREPLACE != 0 {
                if let Ok(s) = store() {
                    if s.stat(&t).is_ok() {
                        return Some(fail(&Error::new(libc::EEXIST, t.into_owned())));
                    }
                }
            } else if flags != 0 {
                return Some(fail(&Error::new(libc::EINVAL, "unsupported rename flags")));
            }
            Some(status(store().and_then(|s| s.rename(&f, &t))))
        }
        _ => Some(fail(&Error::new(libc::EXDEV, ""))),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "rename"))]
#[boundary]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    let pair = unsafe { (classify(from), classify(to)) };
    rename_pair(pair.0, pair.1, 0).unwrap_or_else(
        || call_real!(rename: fn(*const c_char, *const c_char) -> c_int, -1; from, to),
    )
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "renameat"))]
#[boundary]
pub unsafe extern "C" fn renameat(
    fd1: c_int,
    from: *const c_char,
    fd2: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    let pair = unsafe { (classify_at(fd1, from), classify_at(fd2, to)) };
    rename_pair(pair.0, pair.1, 0).unwrap_or_else(
        || call_real!(renameat: fn(c_int, *const c_char, c_int, *const c_char) -> c_int, -1; fd1, from, fd2, to),
    )
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "renameat2"))]
#[boundary]
pub unsafe extern "C" fn renameat2(
    fd1: c_int,
    from: *const c_char,
    fd2: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: per the C contract.
    let pair = unsafe { (classify_at(fd1, from), classify_at(fd2, to)) };
    rename_pair(pair.0, pair.1, flags).unwrap_or_else(|| {
        call_real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int, -1; fd1, from, fd2, to, flags)
    })
}

// ---- attributes ---------------------------------------------------------------------------

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "chmod"))]
#[boundary]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: c_uint) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => status(store().and_then(|s| s.set_mode(&p, mode))),
        None => call_real!(chmod: fn(*const c_char, c_uint) -> c_int, -1; path, mode),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fchmodat"))]
#[boundary]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_uint,
    flags: c_int,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => status(store().and_then(|s| s.set_mode(&p, mode))),
        None => {
            call_real!(fchmodat: fn(c_int, *const c_char, c_uint, c_int) -> c_int, -1; dirfd, path, mode, flags)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fchmod"))]
#[boundary]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: c_uint) -> c_int {
    match lookup(fd) {
        Some(e) => status(e.file.set_mode(mode)),
        None => call_real!(fchmod: fn(c_int, c_uint) -> c_int, -1; fd, mode),
    }
}

fn id(v: c_uint) -> Option<u32> {
    (v != u32::MAX).then_some(v)
}

macro_rules! chown_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, uid: c_uint, gid: c_uint) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => status(store().and_then(|s| s.set_owner(&p, id(uid), id(gid)))),
                None => call_real!($name: fn(*const c_char, c_uint, c_uint) -> c_int, -1; path, uid, gid),
            }
        }
    };
}
chown_wrapper!(chown);
chown_wrapper!(lchown);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fchown"))]
#[boundary]
pub unsafe extern "C" fn fchown(fd: c_int, uid: c_uint, gid: c_uint) -> c_int {
    match lookup(fd) {
        Some(e) => status(e.file.set_owner(id(uid), id(gid))),
        None => call_real!(fchown: fn(c_int, c_uint, c_uint) -> c_int, -1; fd, uid, gid),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fchownat"))]
#[boundary]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: c_uint,
    gid: c_uint,
    flags: c_int,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => status(store().and_then(|s| s.set_owner(&p, id(uid), id(gid)))),
        None => {
            call_real!(fchownat: fn(c_int, *const c_char, c_uint, c_uint, c_int) -> c_int, -1; dirfd, path, uid, gid, flags)
        }
    }
}

/// Turns a utimensat-style pair into (atime, mtime) for the store: null = now for both,
/// UTIME_NOW = now, UTIME_OMIT = unchanged.
///
/// # Safety
/// `times` is null or points at two timespecs.
unsafe fn times_of(times: *const libc::timespec) -> (Option<i64>, Option<i64>) {
    let now = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    };
    if times.is_null() {
        return (Some(now), Some(now));
    }
    let conv = |t: &libc::timespec| match t.tv_nsec {
        libc::UTIME_OMIT => None,
        libc::UTIME_NOW => Some(now),
        ns => Some(t.tv_sec * 1_000_000_000 + ns),
    };
    // SAFETY: per this function's contract.
    unsafe { (conv(&*times), conv(&*times.add(1))) }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "utimensat"))]
#[boundary]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() {
        // utimensat(fd, NULL, ...) is futimens.
        if let Some(e) = lookup(dirfd) {
            // SAFETY: per the C contract.
            let (a, m) = unsafe { times_of(times) };
            return status(e.file.set_times(a, m));
        }
    }
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => {
            // SAFETY: per the C contract.
            let (a, m) = unsafe { times_of(times) };
            status(store().and_then(|s| s.set_times(&p, a, m)))
        }
        None => {
            call_real!(utimensat: fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int, -1; dirfd, path, times, flags)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "futimens"))]
#[boundary]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    match lookup(fd) {
        Some(e) => {
            // SAFETY: per the C contract.
            let (a, m) = unsafe { times_of(times) };
            status(e.file.set_times(a, m))
        }
        None => call_real!(futimens: fn(c_int, *const libc::timespec) -> c_int, -1; fd, times),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "utimes"))]
#[boundary]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => {
            let (a, m) = if tv.is_null() {
                // SAFETY: null means "now".
                unsafe { times_of(std::ptr::null()) }
            } else {
                // SAFETY: the caller passes two timevals.
                let (ta, tm) = unsafe { (&*tv, &*tv.add(1)) };
                (
                    Some(ta.tv_sec * 1_000_000_000 + ta.tv_usec * 1000),
                    Some(tm.tv_sec * 1_000_000_000 + tm.tv_usec * 1000),
                )
            };
            status(store().and_then(|s| s.set_times(&p, a, m)))
        }
        None => call_real!(utimes: fn(*const c_char, *const libc::timeval) -> c_int, -1; path, tv),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "utime"))]
#[boundary]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => {
            let (a, m) = if times.is_null() {
                // SAFETY: null means "now".
                unsafe { times_of(std::ptr::null()) }
            } else {
                // SAFETY: the caller passes a utimbuf.
                let t = unsafe { &*times };
                (
                    Some(t.actime * 1_000_000_000),
                    Some(t.modtime * 1_000_000_000),
                )
            };
            status(store().and_then(|s| s.set_times(&p, a, m)))
        }
        None => {
            call_real!(utime: fn(*const c_char, *const libc::utimbuf) -> c_int, -1; path, times)
        }
    }
}

// ---- realpath -----------------------------------------------------------------------------

/// The host path of an existing Cascade path, into `resolved` (PATH_MAX bytes) or a
/// malloc'ed buffer the caller frees.
fn realpath_store(p: &str, resolved: *mut c_char) -> *mut c_char {
    // The canonical path is where the inode is, whatever ".." and "." the caller used.
    let canonical = store()
        .and_then(|s| s.open(p, &cascade_store::OpenOptions::new()))
        .and_then(|f| f.current_path());
    let p = match canonical {
        Ok(c) => c,
        Err(e) => {
            set_errno(e.errno());
            return std::ptr::null_mut();
        }
    };
    let full = if p == "/" {
        mount().to_string()
    } else {
        format!("{}{}", mount(), p)
    };
    let bytes = full.as_bytes();
    if bytes.len() >= libc::PATH_MAX as usize {
        set_errno(libc::ENAMETOOLONG);
        return std::ptr::null_mut();
    }
    let out = if resolved.is_null() {
        // SAFETY: malloc of len+1 bytes; checked for null below.
        unsafe { libc::malloc(bytes.len() + 1) as *mut c_char }
    } else {
        resolved
    };
    if out.is_null() {
        set_errno(libc::ENOMEM);
        return out;
    }
    // SAFETY: `out` holds at least len+1 bytes (PATH_MAX per the realpath contract, or ours).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, bytes.len());
        *out.add(bytes.len()) = 0;
    }
    out
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "realpath"))]
#[boundary]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => realpath_store(&p, resolved),
        None => {
            call_real!(realpath: fn(*const c_char, *mut c_char) -> *mut c_char, std::ptr::null_mut(); path, resolved)
        }
    }
}

/// # Safety
/// C ABI (the fortified realpath).
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "__realpath_chk"))]
#[boundary]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    len: usize,
) -> *mut c_char {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => realpath_store(&p, resolved),
        None => {
            call_real!(__realpath_chk: fn(*const c_char, *mut c_char, usize) -> *mut c_char, std::ptr::null_mut(); path, resolved, len)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "canonicalize_file_name"))]
#[boundary]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => realpath_store(&p, std::ptr::null_mut()),
        None => {
            call_real!(canonicalize_file_name: fn(*const c_char) -> *mut c_char, std::ptr::null_mut(); path)
        }
    }
}

// ---- symbolic links: the store has none ---------------------------------------------------

fn readlink_store(p: &str) -> isize {
    match store().and_then(|s| s.stat(p)) {
        // An existing non-link: EINVAL, as the kernel says.
        Ok(_) => fail_ssize(&Error::new(libc::EINVAL, "")),
        Err(e) => fail_ssize(&e),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "readlink"))]
#[boundary]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => readlink_store(&p),
        None => {
            call_real!(readlink: fn(*const c_char, *mut c_char, usize) -> isize, -1; path, buf, size)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "readlinkat"))]
#[boundary]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> isize {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => readlink_store(&p),
        None => {
            call_real!(readlinkat: fn(c_int, *const c_char, *mut c_char, usize) -> isize, -1; dirfd, path, buf, size)
        }
    }
}
