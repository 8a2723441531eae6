//! stdio: a Cascade stream is a real glibc `FILE` made with `fopencookie`, whose read, write,
//! seek and close go through our descriptor wrappers. Every stdio function (fprintf, fgets,
//! getline, fscanf, fseek, ...) then works inside glibc unchanged; `fileno` reports the
//! backing descriptor.

use super::*;
use libc::{c_int, c_void, size_t, ssize_t, FILE};
use std::collections::HashMap;
use std::ffi::c_char;

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

/// Our streams and their descriptors.
static STREAMS: Mutex<Option<HashMap<usize, c_int>>> = Mutex::new(None);

fn streams() -> std::sync::MutexGuard<'static, Option<HashMap<usize, c_int>>> {
    STREAMS.lock().unwrap_or_else(|p| p.into_inner())
}

#[boundary]
unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: glibc hands back the cookie we gave it (a boxed fd) and a buffer of n bytes.
    unsafe { sysio::read(*(cookie as *const c_int), buf as *mut c_void, n) }
}

#[boundary]
unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: as above.
    let r = unsafe { sysio::write(*(cookie as *const c_int), buf as *const c_void, n) };
    // A cookie write returning less than asked must not be negative except on error; glibc
    // treats 0 as an error, which is what ENOSPC should be.
    if r < 0 {
        0
    } else {
        r
    }
}

#[boundary]
unsafe extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut i64, whence: c_int) -> c_int {
    // SAFETY: as above; `off` points at glibc's offset.
    unsafe {
        let r = sysio::lseek64(*(cookie as *const c_int), *off, whence);
        if r < 0 {
            return -1;
        }
        *off = r;
    }
    0
}

#[boundary]
unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the cookie is the Box made in make_stream; glibc calls close exactly once.
    let fd = unsafe { Box::from_raw(cookie as *mut c_int) };
    if let Some(m) = streams().as_mut() {
        m.retain(|_, v| *v != *fd);
    }
    // SAFETY: closing the stream's own descriptor.
    unsafe { sysio::close(*fd) }
}

/// Wraps Cascade descriptor `fd` in a stream (`mode` as given to fopen).
fn make_stream(fd: c_int, mode: *const c_char) -> *mut FILE {
    let cookie = Box::into_raw(Box::new(fd)) as *mut c_void;
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: valid cookie, mode string and function table.
    let f = unsafe { fopencookie(cookie, mode, io) };
    if f.is_null() {
        // SAFETY: fopencookie failed, so the cookie was not taken.
        drop(unsafe { Box::from_raw(cookie as *mut c_int) });
        return f;
    }
    streams()
        .get_or_insert_with(HashMap::new)
        .insert(f as usize, fd);
    f
}

/// open(2) flags for an fopen mode string.
///
/// # Safety
/// `mode` is NUL-terminated.
unsafe fn mode_flags(mode: *const c_char) -> Option<c_int> {
    if mode.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    let m = unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes();
    let plus = m.contains(&b'+');
    let mut flags = match m.first()? {
        b'r' if plus => libc::O_RDWR,
        b'r' => libc::O_RDONLY,
        b'w' if plus => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' if plus => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    if m.contains(&b'x') {
        flags |= libc::O_EXCL;
    }
    if m.contains(&b'e') {
        flags |= libc::O_CLOEXEC;
    }
    Some(flags)
}

fn fopen_store(path: &str, mode: *const c_char) -> *mut FILE {
    // SAFETY: mode comes from the caller of fopen (NUL-terminated).
    let Some(flags) = (unsafe { mode_flags(mode) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    match sysio::open_store_path(path, flags, 0o666) {
        Ok(fd) => {
            let f = make_stream(fd, mode);
            if f.is_null() {
                // SAFETY: closing our own descriptor.
                unsafe { sysio::close(fd) };
            }
            f
        }
        Err(e) => {
            set_errno(e.errno());
            std::ptr::null_mut()
        }
    }
}

macro_rules! fopen_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char) -> *mut FILE {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => fopen_store(&p, mode),
                None => call_real!($name: fn(*const c_char, *const c_char) -> *mut FILE, std::ptr::null_mut(); path, mode),
            }
        }
    };
}
fopen_wrapper!(fopen);
fopen_wrapper!(fopen64);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fdopen"))]
#[boundary]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if is_cascade_fd(fd) {
        make_stream(fd, mode)
    } else {
        call_real!(fdopen: fn(c_int, *const c_char) -> *mut FILE, std::ptr::null_mut(); fd, mode)
    }
}

macro_rules! freopen_wrapper {
    ($name:ident) => {
        /// Reopening onto a Cascade path closes `stream` and returns a new stream: the
        /// same `FILE` object cannot be turned into a cookie stream (documented limit).
        ///
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => {
                    // SAFETY: the caller's stream, closed as freopen would.
                    unsafe { libc::fclose(stream) };
                    fopen_store(&p, mode)
                }
                None => call_real!($name: fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE, std::ptr::null_mut(); path, mode, stream),
            }
        }
    };
}
freopen_wrapper!(freopen);
freopen_wrapper!(freopen64);

fn stream_fd(f: *mut FILE) -> Option<c_int> {
    streams()
        .as_ref()
        .and_then(|m| m.get(&(f as usize)).copied())
}

macro_rules! fileno_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(f: *mut FILE) -> c_int {
            match stream_fd(f) {
                Some(fd) => fd,
                None => call_real!($name: fn(*mut FILE) -> c_int, -1; f),
            }
        }
    };
}
fileno_wrapper!(fileno);
fileno_wrapper!(fileno_unlocked);

/// At start-up, a standard stream whose descriptor is a Cascade file (a shell redirection
/// like `prog > /cascade/out`) is replaced by a cookie stream, because glibc's own stdout
/// writes would bypass the `write` wrapper and land in the backing memfd.
pub(crate) fn adopt_standard_streams() {
    for fd in 0..3 {
        if !is_cascade_fd(fd) {
            continue;
        }
        let mode: &[u8] = if fd == 0 { b"r\0" } else { b"w\0" };
        // SAFETY: dup of a live descriptor; the duplicate becomes the stream's own.
        let own = unsafe { fds::dup(fd) };
        if own < 0 {
            continue;
        }
        let f = make_stream(own, mode.as_ptr() as *const c_char);
        if f.is_null() {
            continue;
        }
        if fd == 2 {
            // stderr stays unbuffered.
            // SAFETY: a freshly made stream.
            unsafe { libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0) };
        }
        // SAFETY: replacing glibc's standard stream pointers at start-up, before the
        // program's main runs; the old streams stay open (their fds are the program's).
        unsafe {
            match fd {
                0 => stdin = f,
                1 => stdout = f,
                _ => stderr = f,
            }
        }
    }
}

/// Descriptor `fd` (0, 1 or 2) just became a Cascade file inside the process (a shell's
/// `builtin > /cascade/f`: dup2 onto 1, write, dup2 back). glibc's standard stream on it
/// would write with its internal write into the backing memfd, so it is replaced, once, by
/// a stream bound to the descriptor number itself: its writes go through the write wrapper
/// to whatever the descriptor is at the time (the store, or the host file after the shell
/// puts it back). The old stream is flushed first (its data belongs to the old target).
pub(crate) fn follow_standard_stream(fd: c_int) {
    if !(0..3).contains(&fd) {
        return;
    }
    // SAFETY: reading glibc's standard stream pointers.
    let current = unsafe {
        match fd {
            0 => stdin,
            1 => stdout,
            _ => stderr,
        }
    };
    if streams()
        .as_ref()
        .is_some_and(|m| m.contains_key(&(current as usize)))
    {
        return;
    }
    if fd > 0 && !current.is_null() {
        // SAFETY: flushing a live stream.
        unsafe { libc::fflush(current) };
    }
    let mode: &[u8] = if fd == 0 { b"r\0" } else { b"w\0" };
    let f = make_stream(fd, mode.as_ptr() as *const c_char);
    if f.is_null() {
        return;
    }
    let buffering = if fd == 2 { libc::_IONBF } else { libc::_IOLBF };
    // SAFETY: a freshly made stream.
    unsafe { libc::setvbuf(f, std::ptr::null_mut(), buffering, 0) };
    // SAFETY: replacing glibc's standard stream pointer; the old FILE is left open, since
    // it does not own the descriptor alone any more.
    unsafe {
        match fd {
            0 => stdin = f,
            1 => stdout = f,
            _ => stderr = f,
        }
    }
}
