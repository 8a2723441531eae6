//! The stat family (with glibc's __xstat aliases), statx, statfs/statvfs, access.

use super::*;
use cascade_store::{FileKind, Metadata};
use libc::{c_int, c_uint};
use std::ffi::c_char;

/// st_dev of every Cascade file ("CA5C").
const CASCADE_DEV: u64 = 0xCA5C;
/// f_type reported by statfs.
const CASCADE_MAGIC: i64 = 0x0CA5_CADE;

fn type_bits(m: &Metadata) -> u32 {
    match m.kind {
        FileKind::Dir => libc::S_IFDIR,
        FileKind::File => libc::S_IFREG,
    }
}

/// st_blksize: the preferred I/O size (stdio sizes its buffers from it); a chunk, capped.
fn blksize(m: &Metadata) -> i64 {
    m.chunk_size.min(1 << 20) as i64
}

fn fill_stat(m: &Metadata, st: &mut libc::stat64) {
    // SAFETY: all-zero is a valid stat64.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = CASCADE_DEV;
    st.st_ino = m.ino + 1; // inode 0 (the root) would look like "no inode" to some tools
    st.st_mode = type_bits(m) | m.mode;
    st.st_nlink = m.links as u64;
    st.st_uid = m.uid;
    st.st_gid = m.gid;
    st.st_size = m.size as i64;
    st.st_blksize = blksize(m);
    st.st_blocks = (m.allocated_bytes() / 512) as i64;
    st.st_atime = m.atime.div_euclid(1_000_000_000);
    st.st_atime_nsec = m.atime.rem_euclid(1_000_000_000);
    st.st_mtime = m.mtime.div_euclid(1_000_000_000);
    st.st_mtime_nsec = m.mtime.rem_euclid(1_000_000_000);
    st.st_ctime = m.ctime.div_euclid(1_000_000_000);
    st.st_ctime_nsec = m.ctime.rem_euclid(1_000_000_000);
}

fn stamp(ns: i64) -> libc::statx_timestamp {
    // SAFETY: all-zero is a valid statx_timestamp.
    let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    t.tv_sec = ns.div_euclid(1_000_000_000);
    t.tv_nsec = ns.rem_euclid(1_000_000_000) as u32;
    t
}

fn fill_statx(m: &Metadata, sx: &mut libc::statx) {
    // SAFETY: all-zero is a valid statx.
    *sx = unsafe { std::mem::zeroed() };
    sx.stx_mask = libc::STATX_BASIC_STATS;
    sx.stx_blksize = blksize(m) as u32;
    sx.stx_nlink = m.links;
    sx.stx_uid = m.uid;
    sx.stx_gid = m.gid;
    sx.stx_mode = (type_bits(m) | m.mode) as u16;
    sx.stx_ino = m.ino + 1;
    sx.stx_size = m.size;
    sx.stx_blocks = m.allocated_bytes() / 512;
    sx.stx_atime = stamp(m.atime);
    sx.stx_mtime = stamp(m.mtime);
    sx.stx_ctime = stamp(m.ctime);
    sx.stx_dev_major = (CASCADE_DEV >> 8) as u32;
    sx.stx_dev_minor = (CASCADE_DEV & 0xff) as u32;
}

/// The metadata behind every path-based call here (stat family, statfs, access); a path
/// the store lacks is asked of the node agent first (read-through).
fn path_meta(p: &str) -> Result<Metadata, Error> {
    let store = store()?;
    readthrough::with_fetch(p, || store.stat(p))
}

fn fd_meta(e: &Entry) -> Result<Metadata, Error> {
    e.file.metadata()
}

/// Where a stat-like call's target is: a Cascade path, a Cascade fd, or not ours.
enum Target<'a> {
    Path(Cow<'a, str>),
    Fd(Arc<Entry>),
    Foreign,
}

/// # Safety
/// `path` is null or NUL-terminated, unchanged for `'a`.
unsafe fn target_at<'a>(dirfd: c_int, path: *const c_char, flags: c_int) -> Target<'a> {
    // SAFETY: per the caller's contract.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        return lookup(dirfd).map(Target::Fd).unwrap_or(Target::Foreign);
    }
    // SAFETY: per the caller's contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => Target::Path(p),
        None => Target::Foreign,
    }
}

fn stat_into(r: Result<Metadata, Error>, buf: *mut libc::stat64) -> c_int {
    match r {
        Ok(m) => {
            if buf.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller passes a writable struct stat (same layout as stat64 here).
            fill_stat(&m, unsafe { &mut *buf });
            0
        }
        Err(e) => fail(&e),
    }
}

macro_rules! stat_path_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut libc::stat64) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => stat_into(path_meta(&p), buf),
                None => call_real!($name: fn(*const c_char, *mut libc::stat64) -> c_int, -1; path, buf),
            }
        }
    };
}
stat_path_wrapper!(stat);
stat_path_wrapper!(stat64);
stat_path_wrapper!(lstat);
stat_path_wrapper!(lstat64);

macro_rules! fstat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut libc::stat64) -> c_int {
            match lookup(fd) {
                Some(e) => stat_into(fd_meta(&e), buf),
                None => call_real!($name: fn(c_int, *mut libc::stat64) -> c_int, -1; fd, buf),
            }
        }
    };
}
fstat_wrapper!(fstat);
fstat_wrapper!(fstat64);

macro_rules! fstatat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { target_at(dirfd, path, flags) } {
                Target::Path(p) => stat_into(path_meta(&p), buf),
                Target::Fd(e) => stat_into(fd_meta(&e), buf),
                Target::Foreign => call_real!($name: fn(c_int, *const c_char, *mut libc::stat64, c_int) -> c_int, -1; dirfd, path, buf, flags),
            }
        }
    };
}
fstatat_wrapper!(fstatat);
fstatat_wrapper!(fstatat64);
fstatat_wrapper!(newfstatat);

macro_rules! xstat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI (glibc's versioned stat entry points).
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(ver: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => stat_into(path_meta(&p), buf),
                None => call_real!($name: fn(c_int, *const c_char, *mut libc::stat64) -> c_int, -1; ver, path, buf),
            }
        }
    };
}
xstat_wrapper!(__xstat);
xstat_wrapper!(__xstat64);
xstat_wrapper!(__lxstat);
xstat_wrapper!(__lxstat64);

macro_rules! fxstat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int {
            match lookup(fd) {
                Some(e) => stat_into(fd_meta(&e), buf),
                None => call_real!($name: fn(c_int, c_int, *mut libc::stat64) -> c_int, -1; ver, fd, buf),
            }
        }
    };
}
fxstat_wrapper!(__fxstat);
fxstat_wrapper!(__fxstat64);

macro_rules! fxstatat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { target_at(dirfd, path, flags) } {
                Target::Path(p) => stat_into(path_meta(&p), buf),
                Target::Fd(e) => stat_into(fd_meta(&e), buf),
                Target::Foreign => call_real!($name: fn(c_int, c_int, *const c_char, *mut libc::stat64, c_int) -> c_int, -1; ver, dirfd, path, buf, flags),
            }
        }
    };
}
fxstatat_wrapper!(__fxstatat);
fxstatat_wrapper!(__fxstatat64);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "statx"))]
#[boundary]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: per the C contract.
    let meta = match unsafe { target_at(dirfd, path, flags) } {
        Target::Path(p) => path_meta(&p),
        Target::Fd(e) => fd_meta(&e),
        Target::Foreign => {
            return call_real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int, -1; dirfd, path, flags, mask, buf)
        }
    };
    match meta {
        Ok(_) if buf.is_null() => {
            set_errno(libc::EFAULT);
            -1
        }
        Ok(m) => {
            // SAFETY: `buf` is not null (checked above): the caller's writable struct statx.
            fill_statx(&m, unsafe { &mut *buf });
            0
        }
        Err(e) => fail(&e),
    }
}

// ---- statfs / statvfs: the store's capacity ---------------------------------------------

struct Capacity {
    bsize: u64,
    blocks: u64,
    free: u64,
    files: u64,
    ffree: u64,
}

fn capacity() -> Result<Capacity, Error> {
    let s = store()?.status();
    let total = s.memory_capacity + s.spill_capacity;
    let used = s.memory_used + s.spill_used;
    Ok(Capacity {
        bsize: s.chunk_size,
        blocks: total / s.chunk_size,
        free: total.saturating_sub(used) / s.chunk_size,
        files: s.max_files,
        ffree: s.max_files.saturating_sub(s.files + s.dirs),
    })
}

fn fill_statfs(buf: *mut libc::statfs64) -> c_int {
    match capacity() {
        Ok(_) if buf.is_null() => {
            set_errno(libc::EFAULT);
            -1
        }
        Ok(c) => {
            // SAFETY: the caller passes a writable struct statfs; all-zero is valid.
            let st = unsafe { &mut *buf };
            // SAFETY: all-zero is a valid statfs64.
            *st = unsafe { std::mem::zeroed() };
            st.f_type = CASCADE_MAGIC;
            st.f_bsize = c.bsize as i64;
            st.f_frsize = c.bsize as i64;
            st.f_blocks = c.blocks;
            st.f_bfree = c.free;
            st.f_bavail = c.free;
            st.f_files = c.files;
            st.f_ffree = c.ffree;
            st.f_namelen = 255;
            0
        }
        Err(e) => fail(&e),
    }
}

fn fill_statvfs(buf: *mut libc::statvfs64) -> c_int {
    match capacity() {
        Ok(_) if buf.is_null() => {
            set_errno(libc::EFAULT);
            -1
        }
        Ok(c) => {
            // SAFETY: the caller passes a writable struct statvfs.
            let st = unsafe { &mut *buf };
            // SAFETY: all-zero is a valid statvfs64.
            *st = unsafe { std::mem::zeroed() };
            st.f_bsize = c.bsize;
            st.f_frsize = c.bsize;
            st.f_blocks = c.blocks;
            st.f_bfree = c.free;
            st.f_bavail = c.free;
            st.f_files = c.files;
            st.f_ffree = c.ffree;
            st.f_favail = c.ffree;
            st.f_fsid = CASCADE_DEV;
            st.f_namemax = 255;
            0
        }
        Err(e) => fail(&e),
    }
}

macro_rules! statfs_wrapper {
    ($name:ident, $path_fill:ident, $t:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $t) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => match path_meta(&p) {
                    Ok(_) => $path_fill(buf),
                    Err(e) => fail(&e),
                },
                None => call_real!($name: fn(*const c_char, *mut $t) -> c_int, -1; path, buf),
            }
        }
    };
}
statfs_wrapper!(statfs, fill_statfs, libc::statfs64);
statfs_wrapper!(statfs64, fill_statfs, libc::statfs64);
statfs_wrapper!(statvfs, fill_statvfs, libc::statvfs64);
statfs_wrapper!(statvfs64, fill_statvfs, libc::statvfs64);

macro_rules! fstatfs_wrapper {
    ($name:ident, $fill:ident, $t:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut $t) -> c_int {
            match lookup(fd) {
                Some(_) => $fill(buf),
                None => call_real!($name: fn(c_int, *mut $t) -> c_int, -1; fd, buf),
            }
        }
    };
}
fstatfs_wrapper!(fstatfs, fill_statfs, libc::statfs64);
fstatfs_wrapper!(fstatfs64, fill_statfs, libc::statfs64);
fstatfs_wrapper!(fstatvfs, fill_statvfs, libc::statvfs64);
fstatfs_wrapper!(fstatvfs64, fill_statvfs, libc::statvfs64);

// ---- access -------------------------------------------------------------------------------

pub(crate) fn check_access(p: &str, mode: c_int) -> c_int {
    match path_meta(p) {
        Ok(m) => {
            // SAFETY: geteuid cannot fail.
            let euid = unsafe { libc::geteuid() };
            let bits = if euid == 0 {
                // root may read and write anything; execute needs some x bit.
                0o6 | if m.mode & 0o111 != 0 || m.is_dir() {
                    1
                } else {
                    0
                }
            } else if euid == m.uid {
                (m.mode >> 6) & 7
            } else {
                m.mode & 7
            };
            let want = (mode & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32;
            if want & !bits != 0 {
                set_errno(libc::EACCES);
                -1
            } else {
                0
            }
        }
        Err(e) => fail(&e),
    }
}

macro_rules! access_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => check_access(&p, mode),
                None => call_real!($name: fn(*const c_char, c_int) -> c_int, -1; path, mode),
            }
        }
    };
}
access_wrapper!(access);
access_wrapper!(eaccess);
access_wrapper!(euidaccess);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "faccessat"))]
#[boundary]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify_at(dirfd, path) } {
        Some(p) => check_access(&p, mode),
        None => {
            call_real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int, -1; dirfd, path, mode, flags)
        }
    }
}
