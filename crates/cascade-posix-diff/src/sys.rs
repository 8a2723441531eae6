//! Thin wrappers over the raw libc calls the harness makes. Each returns the call's result or
//! its errno; nothing here goes through `std::fs`, so under LD_PRELOAD every call reaches the
//! interposed libc symbol (std uses raw `statx`/`getdents64` syscalls in places, which an
//! LD_PRELOAD library cannot see).

use std::ffi::{CStr, CString};

use libc::{c_int, c_void, mode_t, off_t};

/// An errno value.
pub type Errno = i32;

/// The calling thread's errno.
pub fn errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sets the calling thread's errno to 0 (before a call that reports errors only there).
pub fn clear_errno() {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() = 0 };
}

/// 0 → Ok, -1 → the errno; any other return value is passed on as Ok(value) for the caller
/// to report (a call documented to return 0 that returns something else is a difference too).
fn int_result(ret: c_int) -> Result<c_int, Errno> {
    if ret == -1 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

fn size_result(ret: isize) -> Result<usize, Errno> {
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

pub fn open(path: &CStr, flags: c_int, mode: mode_t) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string; mode is passed as the variadic argument
    // open reads when O_CREAT is set (and ignores otherwise).
    int_result(unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) })
}

pub fn openat(dirfd: c_int, path: &CStr, flags: c_int, mode: mode_t) -> Result<c_int, Errno> {
    // SAFETY: as for open; dirfd is any integer (a bad one is an EBADF/ENOTDIR error).
    int_result(unsafe { libc::openat(dirfd, path.as_ptr(), flags, mode as libc::c_uint) })
}

pub fn close(fd: c_int) -> Result<c_int, Errno> {
    // SAFETY: closes an fd of the harness's own tables (or a bad number, which is EBADF).
    int_result(unsafe { libc::close(fd) })
}

pub fn read(fd: c_int, len: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; len];
    // SAFETY: buf is valid for writes of len bytes.
    let n = size_result(unsafe { libc::read(fd, buf.as_mut_ptr().cast::<c_void>(), len) })?;
    buf.truncate(n);
    Ok(buf)
}

pub fn pread(fd: c_int, len: usize, offset: i64) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; len];
    // SAFETY: buf is valid for writes of len bytes.
    let n = size_result(unsafe {
        libc::pread(fd, buf.as_mut_ptr().cast::<c_void>(), len, offset as off_t)
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// readv into buffers of the given lengths; returns the bytes read, in order.
pub fn readv(fd: c_int, lens: &[usize]) -> Result<Vec<u8>, Errno> {
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast::<c_void>(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: each iovec points to a live buffer of iov_len bytes, and iov has iov.len()
    // entries; the buffers outlive the call.
    let n = size_result(unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as c_int) })?;
    let mut out: Vec<u8> = bufs.concat();
    out.truncate(n);
    Ok(out)
}

pub fn write(fd: c_int, data: &[u8]) -> Result<usize, Errno> {
    // SAFETY: data is valid for reads of data.len() bytes.
    size_result(unsafe { libc::write(fd, data.as_ptr().cast::<c_void>(), data.len()) })
}

pub fn pwrite(fd: c_int, data: &[u8], offset: i64) -> Result<usize, Errno> {
    // SAFETY: data is valid for reads of data.len() bytes.
    size_result(unsafe {
        libc::pwrite(
            fd,
            data.as_ptr().cast::<c_void>(),
            data.len(),
            offset as off_t,
        )
    })
}

pub fn writev(fd: c_int, chunks: &[&[u8]]) -> Result<usize, Errno> {
    let iov: Vec<libc::iovec> = chunks
        .iter()
        .map(|c| libc::iovec {
            iov_base: c.as_ptr() as *mut c_void,
            iov_len: c.len(),
        })
        .collect();
    // SAFETY: each iovec points to a live buffer of iov_len bytes that writev only reads;
    // iov has iov.len() entries.
    size_result(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as c_int) })
}

pub fn lseek(fd: c_int, offset: i64, whence: c_int) -> Result<i64, Errno> {
    // SAFETY: lseek takes no pointers.
    let ret = unsafe { libc::lseek(fd, offset as off_t, whence) };
    if ret == -1 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

pub fn ftruncate(fd: c_int, len: i64) -> Result<c_int, Errno> {
    // SAFETY: ftruncate takes no pointers.
    int_result(unsafe { libc::ftruncate(fd, len as off_t) })
}

pub fn truncate(path: &CStr, len: i64) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::truncate(path.as_ptr(), len as off_t) })
}

pub fn fstat(fd: c_int) -> Result<libc::stat, Errno> {
    // SAFETY: struct stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid, writable struct stat.
    int_result(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

pub fn stat(path: &CStr) -> Result<libc::stat, Errno> {
    // SAFETY: struct stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated; st is a valid, writable struct stat.
    int_result(unsafe { libc::stat(path.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn lstat(path: &CStr) -> Result<libc::stat, Errno> {
    // SAFETY: struct stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated; st is a valid, writable struct stat.
    int_result(unsafe { libc::lstat(path.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn rename(from: &CStr, to: &CStr) -> Result<c_int, Errno> {
    // SAFETY: both paths are valid NUL-terminated strings.
    int_result(unsafe { libc::rename(from.as_ptr(), to.as_ptr()) })
}

pub fn unlink(path: &CStr) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::unlink(path.as_ptr()) })
}

pub fn mkdir(path: &CStr, mode: mode_t) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::mkdir(path.as_ptr(), mode) })
}

pub fn rmdir(path: &CStr) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::rmdir(path.as_ptr()) })
}

pub fn dup(fd: c_int) -> Result<c_int, Errno> {
    // SAFETY: dup takes no pointers.
    int_result(unsafe { libc::dup(fd) })
}

pub fn dup2(fd: c_int, target: c_int) -> Result<c_int, Errno> {
    // SAFETY: dup2 takes no pointers; target is one of the harness's own open fds.
    int_result(unsafe { libc::dup2(fd, target) })
}

pub fn fsync(fd: c_int) -> Result<c_int, Errno> {
    // SAFETY: fsync takes no pointers.
    int_result(unsafe { libc::fsync(fd) })
}

/// Sets or clears O_APPEND among the descriptor's status flags (F_GETFL, then F_SETFL).
pub fn set_append(fd: c_int, on: bool) -> Result<c_int, Errno> {
    // SAFETY: fcntl with F_GETFL and F_SETFL takes no pointers.
    let flags = int_result(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_APPEND
    } else {
        flags & !libc::O_APPEND
    };
    // SAFETY: as above.
    int_result(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })
}

pub fn access(path: &CStr, mode: c_int) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::access(path.as_ptr(), mode) })
}

pub fn chdir(path: &CStr) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::chdir(path.as_ptr()) })
}

pub fn chmod(path: &CStr, mode: mode_t) -> Result<c_int, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    int_result(unsafe { libc::chmod(path.as_ptr(), mode) })
}

/// The working directory, through libc's getcwd (which the preload library answers for a
/// directory inside the mount).
pub fn getcwd() -> Result<CString, Errno> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for its length.
    let r = unsafe { libc::getcwd(buf.as_mut_ptr().cast(), buf.len()) };
    if r.is_null() {
        return Err(errno());
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(len);
    CString::new(buf).map_err(|_| libc::EINVAL)
}

/// One directory entry: name and d_type.
pub type DirEntry = (String, u8);

/// Reads every entry of an open DIR stream (readdir until NULL; errno tells end from error),
/// then closes it. An error from readdir wins over one from closedir.
///
/// # Safety
/// `dir` must be a valid stream from opendir/fdopendir, not used afterwards.
unsafe fn drain_and_close(dir: *mut libc::DIR) -> Result<Vec<DirEntry>, Errno> {
    let mut entries = Vec::new();
    let mut failure = None;
    loop {
        clear_errno();
        // SAFETY: dir is a valid, open DIR stream (the caller's contract).
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            let e = errno();
            if e != 0 {
                failure = Some(e);
            }
            break;
        }
        // SAFETY: a non-null readdir result points to a dirent that stays valid until the
        // next readdir/closedir on dir; d_name is NUL-terminated.
        let (name, kind) = unsafe {
            (
                CStr::from_ptr((*ent).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                (*ent).d_type,
            )
        };
        entries.push((name, kind));
    }
    // SAFETY: dir is valid and is not used after this call.
    let closed = unsafe { libc::closedir(dir) };
    if let Some(e) = failure {
        return Err(e);
    }
    if closed != 0 {
        return Err(errno());
    }
    entries.sort();
    Ok(entries)
}

/// opendir + readdir until the end + closedir: the sorted entries, "." and ".." included.
pub fn list_dir(path: &CStr) -> Result<Vec<DirEntry>, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    let dir = unsafe { libc::opendir(path.as_ptr()) };
    if dir.is_null() {
        return Err(errno());
    }
    // SAFETY: dir is a fresh stream from opendir, not used again.
    unsafe { drain_and_close(dir) }
}

/// The listing of an open directory fd, through fdopendir on a dup of it (the fd itself
/// stays open): dup, fdopendir, rewinddir (the dup shares the offset, which an earlier
/// listing left at the end), readdir until the end, closedir.
pub fn list_fd(fd: c_int) -> Result<Vec<DirEntry>, Errno> {
    let copy = dup(fd)?;
    // SAFETY: fdopendir takes ownership of copy on success only.
    let dir = unsafe { libc::fdopendir(copy) };
    if dir.is_null() {
        let e = errno();
        close(copy)?;
        return Err(e);
    }
    // SAFETY: dir is a valid stream from fdopendir.
    unsafe { libc::rewinddir(dir) };
    // SAFETY: dir is a valid stream, not used again.
    unsafe { drain_and_close(dir) }
}

/// `root/rel` as a C string (`root` alone for an empty rel).
pub fn join(root: &str, rel: &str) -> CString {
    let path = if rel.is_empty() {
        root.to_string()
    } else {
        format!("{root}/{rel}")
    };
    CString::new(path).expect("paths never contain NUL")
}

/// Reads a whole file by path: open, read until EOF, close.
pub fn read_file(path: &CStr) -> Result<Vec<u8>, Errno> {
    let fd = open(path, libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
    let mut out = Vec::new();
    let result = loop {
        match read(fd, 1 << 20) {
            Ok(chunk) if chunk.is_empty() => break Ok(()),
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(e) => break Err(e),
        }
    };
    close(fd)?;
    result.map(|()| out)
}

/// The name of an errno value (ENOENT, ...), or its number.
pub fn errno_name(e: Errno) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(libc::ENOTEMPTY), "ENOTEMPTY");
        assert_eq!(errno_name(4242), "errno 4242");
    }

    #[test]
    fn join_paths() {
        assert_eq!(join("/r", "").to_str().unwrap(), "/r");
        assert_eq!(join("/r", "a/b").to_str().unwrap(), "/r/a/b");
    }
}
