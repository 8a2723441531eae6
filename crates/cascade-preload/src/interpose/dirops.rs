//! Directory calls: opendir/readdir family, getdents64, chdir/fchdir/getcwd.

use super::*;
use cascade_store::FileKind;
use libc::{c_int, c_long, dirent64, size_t, DIR};
use std::collections::HashSet;
use std::ffi::c_char;

/// A directory stream of ours, handed to C as an opaque `DIR *`.
struct CascadeDir {
    /// The backing descriptor (dirfd returns it).
    fd: c_int,
    entries: Vec<(Vec<u8>, u64, u8)>,
    pos: usize,
    dirent: dirent64,
}

/// Addresses of the streams we made, to tell them from glibc's.
static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn streams() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    STREAMS.lock().unwrap_or_else(|p| p.into_inner())
}

fn ours(dirp: *mut DIR) -> Option<&'static mut CascadeDir> {
    if dirp.is_null() {
        return None;
    }
    let known = streams()
        .as_ref()
        .is_some_and(|s| s.contains(&(dirp as usize)));
    // SAFETY: the address is one of the boxes we leaked in make_stream and not yet freed.
    known.then(|| unsafe { &mut *(dirp as *mut CascadeDir) })
}

/// ".", ".." and the directory's entries, with inode numbers and d_type. `from_start`: a
/// listing that starts, which first shows what the levels below hold (restarts find their
/// newest checkpoint by listing, on a node whose store is empty).
fn listing(e: &Entry, from_start: bool) -> Result<Vec<(Vec<u8>, u64, u8)>, Error> {
    let store = store()?;
    // A removed directory lists nothing, not even "." and "..", as on Linux.
    if e.file.metadata().map(|m| m.links == 0).unwrap_or(true) {
        return Ok(Vec::new());
    }
    if from_start {
        if let Ok(path) = e.file.current_path() {
            readthrough::list_below(&path);
        }
    }
    // By inode, not by the path it was opened with: the directory may have been renamed.
    let path = e.file.anchored("");
    let me = e.file.ino() + 1;
    let parent = store
        .stat(&e.file.anchored(".."))
        .map(|m| m.ino + 1)
        .unwrap_or(me);
    let mut out = vec![
        (b".".to_vec(), me, libc::DT_DIR),
        (b"..".to_vec(), parent, libc::DT_DIR),
    ];
    for d in store.read_dir(&path)? {
        let t = if d.kind == FileKind::Dir {
            libc::DT_DIR
        } else {
            libc::DT_REG
        };
        out.push((d.name.into_bytes(), d.ino + 1, t));
    }
    Ok(out)
}

fn make_stream(fd: c_int) -> *mut DIR {
    let Some(e) = lookup(fd) else {
        set_errno(libc::EBADF);
        return std::ptr::null_mut();
    };
    if !e.file.is_dir() {
        set_errno(libc::ENOTDIR);
        return std::ptr::null_mut();
    }
    match listing(&e, true) {
        Ok(entries) => {
            let dir = Box::new(CascadeDir {
                fd,
                entries,
                pos: 0,
                // SAFETY: all-zero is a valid dirent64.
                dirent: unsafe { std::mem::zeroed() },
            });
            let p = Box::into_raw(dir) as usize;
            streams().get_or_insert_with(HashSet::new).insert(p);
            p as *mut DIR
        }
        Err(err) => {
            set_errno(err.errno());
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "opendir"))]
#[boundary]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => match sysio::open_store_path(
            &p,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        ) {
            Ok(fd) => {
                let d = make_stream(fd);
                if d.is_null() {
                    // SAFETY: closing our own descriptor.
                    unsafe { sysio::close(fd) };
                }
                d
            }
            Err(e) => {
                set_errno(e.errno());
                std::ptr::null_mut()
            }
        },
        None => call_real!(opendir: fn(*const c_char) -> *mut DIR, std::ptr::null_mut(); path),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fdopendir"))]
#[boundary]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    if is_cascade_fd(fd) {
        make_stream(fd)
    } else {
        call_real!(fdopendir: fn(c_int) -> *mut DIR, std::ptr::null_mut(); fd)
    }
}

fn next_entry(d: &mut CascadeDir) -> *mut dirent64 {
    let Some((name, ino, t)) = d.entries.get(d.pos) else {
        return std::ptr::null_mut();
    };
    d.pos += 1;
    let n = name.len().min(255);
    d.dirent.d_ino = *ino;
    d.dirent.d_off = d.pos as i64;
    d.dirent.d_reclen = std::mem::size_of::<dirent64>() as u16;
    d.dirent.d_type = *t;
    for (dst, &src) in d.dirent.d_name.iter_mut().zip(&name[..n]) {
        *dst = src as c_char;
    }
    d.dirent.d_name[n] = 0;
    &mut d.dirent
}

macro_rules! readdir_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(dirp: *mut DIR) -> *mut dirent64 {
            match ours(dirp) {
                Some(d) => next_entry(d),
                None => call_real!($name: fn(*mut DIR) -> *mut dirent64, std::ptr::null_mut(); dirp),
            }
        }
    };
}
readdir_wrapper!(readdir);
readdir_wrapper!(readdir64);

macro_rules! readdir_r_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::EIO)]
        pub unsafe extern "C" fn $name(dirp: *mut DIR, entry: *mut dirent64, result: *mut *mut dirent64) -> c_int {
            match ours(dirp) {
                Some(d) => {
                    let next = next_entry(d);
                    // SAFETY: the caller passes a dirent buffer and a result pointer.
                    unsafe {
                        if next.is_null() {
                            *result = std::ptr::null_mut();
                        } else {
                            *entry = *next;
                            *result = entry;
                        }
                    }
                    0
                }
                None => call_real!($name: fn(*mut DIR, *mut dirent64, *mut *mut dirent64) -> c_int, libc::ENOSYS; dirp, entry, result),
            }
        }
    };
}
readdir_r_wrapper!(readdir_r);
readdir_r_wrapper!(readdir64_r);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "rewinddir"))]
#[boundary]
pub unsafe extern "C" fn rewinddir(dirp: *mut DIR) {
    match ours(dirp) {
        Some(d) => {
            if let Some(e) = lookup(d.fd) {
                if let Ok(entries) = listing(&e, true) {
                    d.entries = entries;
                }
            }
            d.pos = 0;
        }
        None => call_real!(rewinddir: fn(*mut DIR) -> (), (); dirp),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "seekdir"))]
#[boundary]
pub unsafe extern "C" fn seekdir(dirp: *mut DIR, loc: c_long) {
    match ours(dirp) {
        Some(d) => d.pos = loc.max(0) as usize,
        None => call_real!(seekdir: fn(*mut DIR, c_long) -> (), (); dirp, loc),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "telldir"))]
#[boundary]
pub unsafe extern "C" fn telldir(dirp: *mut DIR) -> c_long {
    match ours(dirp) {
        Some(d) => d.pos as c_long,
        None => call_real!(telldir: fn(*mut DIR) -> c_long, -1; dirp),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dirfd"))]
#[boundary]
pub unsafe extern "C" fn dirfd(dirp: *mut DIR) -> c_int {
    match ours(dirp) {
        Some(d) => d.fd,
        None => call_real!(dirfd: fn(*mut DIR) -> c_int, -1; dirp),
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "closedir"))]
#[boundary]
pub unsafe extern "C" fn closedir(dirp: *mut DIR) -> c_int {
    if ours(dirp).is_some() {
        if let Some(set) = streams().as_mut() {
            set.remove(&(dirp as usize));
        }
        // SAFETY: the pointer came from Box::into_raw in make_stream and is removed from
        // the registry, so it is freed once.
        let d = unsafe { Box::from_raw(dirp as *mut CascadeDir) };
        // SAFETY: closing the stream's own descriptor.
        return unsafe { sysio::close(d.fd) };
    }
    call_real!(closedir: fn(*mut DIR) -> c_int, -1; dirp)
}

/// getdents64 on a Cascade directory descriptor: the description's offset counts entries.
fn getdents_store(e: &Entry, buf: *mut u8, count: usize) -> Result<usize, Error> {
    let d = e.description().ok_or_else(|| Error::new(libc::EBADF, ""))?;
    if !e.file.is_dir() {
        return Err(Error::new(libc::ENOTDIR, ""));
    }
    let mut at = d.offset().load(Relaxed) as usize;
    let entries = listing(e, at == 0)?;
    let mut used = 0;
    while let Some((name, ino, t)) = entries.get(at) {
        let reclen = (19 + name.len() + 1).div_ceil(8) * 8;
        if used + reclen > count {
            if used == 0 {
                return Err(Error::new(libc::EINVAL, "buffer too small"));
            }
            break;
        }
        // SAFETY: [used, used + reclen) lies within the caller's `count`-byte buffer.
        unsafe {
            let rec = buf.add(used);
            std::ptr::write_bytes(rec, 0, reclen);
            std::ptr::write_unaligned(rec as *mut u64, *ino);
            std::ptr::write_unaligned(rec.add(8) as *mut i64, (at + 1) as i64);
            std::ptr::write_unaligned(rec.add(16) as *mut u16, reclen as u16);
            *rec.add(18) = *t;
            std::ptr::copy_nonoverlapping(name.as_ptr(), rec.add(19), name.len());
        }
        used += reclen;
        at += 1;
    }
    d.offset().store(at as u64, Relaxed);
    Ok(used)
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "getdents64"))]
#[boundary]
pub unsafe extern "C" fn getdents64(
    fd: c_int,
    buf: *mut libc::c_void,
    count: size_t,
) -> libc::ssize_t {
    match lookup(fd) {
        Some(e) => getdents_store(&e, buf as *mut u8, count)
            .map(|n| n as isize)
            .unwrap_or_else(|err| fail_ssize(&err)),
        None => {
            call_real!(getdents64: fn(c_int, *mut libc::c_void, size_t) -> libc::ssize_t, -1; fd, buf, count)
        }
    }
}

// ---- working directory --------------------------------------------------------------------

/// Makes store directory `p` the virtual cwd; `fetch`: a path the store lacks is asked of
/// the node agent (chdir, not fchdir).
fn enter(p: String, fetch: bool) -> c_int {
    let meta = store().and_then(|s| {
        if fetch {
            readthrough::with_fetch(&p, || s.stat(&p))
        } else {
            s.stat(&p)
        }
    });
    match meta {
        Ok(m) if m.is_dir() => {
            std::env::set_var("CASCADE_CWD", &p);
            set_virtual_cwd(Some(p));
            0
        }
        Ok(_) => fail(&Error::new(libc::ENOTDIR, p)),
        Err(e) => fail(&e),
    }
}

fn leave() {
    if virtual_cwd().is_some() {
        std::env::remove_var("CASCADE_CWD");
        set_virtual_cwd(None);
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "chdir"))]
#[boundary]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => enter(p.into_owned(), true),
        None => {
            let rc = call_real!(chdir: fn(*const c_char) -> c_int, -1; path);
            if rc == 0 {
                leave();
            }
            rc
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fchdir"))]
#[boundary]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    match lookup(fd) {
        Some(e) if !e.path.is_empty() => enter(e.path.clone(), false),
        Some(_) => fail(&Error::new(
            libc::EBADF,
            "directory descriptor of unknown path",
        )),
        None => {
            let rc = call_real!(fchdir: fn(c_int) -> c_int, -1; fd);
            if rc == 0 {
                leave();
            }
            rc
        }
    }
}

fn virtual_cwd_host() -> Option<String> {
    virtual_cwd().map(|p| {
        if p == "/" {
            mount().to_string()
        } else {
            format!("{}{}", mount(), p)
        }
    })
}

fn copy_cwd(cwd: &str, buf: *mut c_char, size: size_t) -> *mut c_char {
    let bytes = cwd.as_bytes();
    let out = if buf.is_null() {
        let n = if size == 0 { bytes.len() + 1 } else { size };
        if n < bytes.len() + 1 {
            set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        // SAFETY: malloc; checked for null below.
        unsafe { libc::malloc(n) as *mut c_char }
    } else {
        if size < bytes.len() + 1 {
            set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        buf
    };
    if out.is_null() {
        set_errno(libc::ENOMEM);
        return out;
    }
    // SAFETY: `out` has room for len+1 bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, bytes.len());
        *out.add(bytes.len()) = 0;
    }
    out
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "getcwd"))]
#[boundary]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    match virtual_cwd_host() {
        Some(cwd) => copy_cwd(&cwd, buf, size),
        None => {
            call_real!(getcwd: fn(*mut c_char, size_t) -> *mut c_char, std::ptr::null_mut(); buf, size)
        }
    }
}

/// # Safety
/// C ABI (the fortified getcwd).
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "__getcwd_chk"))]
#[boundary]
pub unsafe extern "C" fn __getcwd_chk(
    buf: *mut c_char,
    size: size_t,
    buflen: size_t,
) -> *mut c_char {
    match virtual_cwd_host() {
        Some(cwd) => copy_cwd(&cwd, buf, size),
        None => {
            call_real!(__getcwd_chk: fn(*mut c_char, size_t, size_t) -> *mut c_char, std::ptr::null_mut(); buf, size, buflen)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "get_current_dir_name"))]
#[boundary]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    match virtual_cwd_host() {
        Some(cwd) => copy_cwd(&cwd, std::ptr::null_mut(), 0),
        None => call_real!(get_current_dir_name: fn() -> *mut c_char, std::ptr::null_mut();),
    }
}
