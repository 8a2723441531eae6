//! Temporary files: the mkstemp family, mkdtemp and tempnam. glibc makes their files
//! through its internal open/mkdir, which no preload sees, so for a template under the
//! mount (absolute, or relative to a virtual working directory inside it) the name is
//! drawn and the file or directory made here, with glibc's semantics: the last six
//! characters before the suffix must be `XXXXXX` (EINVAL), they are replaced in place,
//! files are created O_RDWR|O_CREAT|O_EXCL mode 0600, directories mode 0700, and a name
//! that exists already is drawn again. `tmpfile` and `tmpnam` always use /tmp (P_tmpdir),
//! on any file system, so they need nothing.

use super::*;
use libc::c_int;
use std::ffi::c_char;
use std::sync::atomic::AtomicU64;

/// Names tried before giving up with EEXIST (glibc tries 62^3; a store with that many
/// collisions is not one a program can use anyway).
const ATTEMPTS: u32 = 10_000;
const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// A fresh 64-bit value per call: time, pid and a counter through a mixer.
fn random_bits() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let mut x = (ts.tv_sec as u64) << 32
        ^ ts.tv_nsec as u64
        ^ (std::process::id() as u64) << 20
        ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed);
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Six random characters of `[A-Za-z0-9]`, as glibc draws for the X's.
fn random_letters() -> [u8; 6] {
    let mut bits = random_bits();
    std::array::from_fn(|_| {
        let c = LETTERS[(bits % 62) as usize];
        bits /= 62;
        c
    })
}

/// The six `X`s of `template` (a C string of `len` bytes) before a suffix of `suffix`
/// bytes: their offset, or EINVAL.
fn x_run(template: &[u8], suffix: c_int) -> Result<usize, Error> {
    let suffix = usize::try_from(suffix).map_err(|_| Error::new(libc::EINVAL, ""))?;
    let end = template
        .len()
        .checked_sub(suffix)
        .filter(|end| *end >= 6)
        .ok_or_else(|| Error::new(libc::EINVAL, ""))?;
    if &template[end - 6..end] != b"XXXXXX" {
        return Err(Error::new(libc::EINVAL, ""));
    }
    Ok(end - 6)
}

/// Draws names into `template` (in place, a NUL-terminated buffer) until `make` succeeds
/// with one of them or fails otherwise than EEXIST; `make` gets the store path of the name.
///
/// # Safety
/// `template` is a writable NUL-terminated string.
unsafe fn draw<T>(
    template: *mut c_char,
    suffix: c_int,
    mut make: impl FnMut(&str) -> Result<T, Error>,
) -> Option<Result<T, Error>> {
    // SAFETY: per the caller's contract.
    let len = unsafe { libc::strlen(template) };
    // SAFETY: `len` bytes before the NUL are the caller's, writable.
    let bytes = unsafe { std::slice::from_raw_parts_mut(template as *mut u8, len) };
    // Only templates Cascade serves; the X's do not change that.
    // SAFETY: NUL-terminated.
    unsafe { classify(template) }?;
    let at = match x_run(bytes, suffix) {
        Ok(at) => at,
        Err(e) => return Some(Err(e)),
    };
    for _ in 0..ATTEMPTS {
        bytes[at..at + 6].copy_from_slice(&random_letters());
        // SAFETY: still NUL-terminated; only the X's changed. Copied out: the next attempt
        // writes new X's into the template.
        let Some(path) = (unsafe { classify(template) }).map(Cow::into_owned) else {
            return Some(Err(Error::new(libc::EINVAL, "")));
        };
        match make(&path) {
            Err(e) if e.errno() == libc::EEXIST => continue,
            other => return Some(other),
        }
    }
    Some(Err(Error::new(libc::EEXIST, "")))
}

/// mkostemps and the forms that call it: None when the template is not Cascade's.
///
/// # Safety
/// `template` is a writable NUL-terminated string.
unsafe fn make_file(template: *mut c_char, suffix: c_int, flags: c_int) -> Option<c_int> {
    // Only the flags glibc lets through (O_APPEND, O_CLOEXEC, O_SYNC...); never a mode.
    let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    // SAFETY: per the caller's contract.
    let made = unsafe {
        draw(template, suffix, |path| {
            sysio::open_store_path(path, flags, 0o600)
        })
    }?;
    Some(made.unwrap_or_else(|e| fail(&e)))
}

macro_rules! mkstemp_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `template` is a writable NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(template: *mut c_char) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { make_file(template, 0, 0) } {
                Some(fd) => fd,
                None => call_real!($name: fn(*mut c_char) -> c_int, -1; template),
            }
        }
    };
}
mkstemp_wrapper!(mkstemp);
mkstemp_wrapper!(mkstemp64);

macro_rules! mkostemp_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `template` is a writable NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(template: *mut c_char, flags: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { make_file(template, 0, flags) } {
                Some(fd) => fd,
                None => call_real!($name: fn(*mut c_char, c_int) -> c_int, -1; template, flags),
            }
        }
    };
}
mkostemp_wrapper!(mkostemp);
mkostemp_wrapper!(mkostemp64);

macro_rules! mkstemps_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `template` is a writable NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(template: *mut c_char, suffix: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { make_file(template, suffix, 0) } {
                Some(fd) => fd,
                None => call_real!($name: fn(*mut c_char, c_int) -> c_int, -1; template, suffix),
            }
        }
    };
}
mkstemps_wrapper!(mkstemps);
mkstemps_wrapper!(mkstemps64);

macro_rules! mkostemps_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `template` is a writable NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { make_file(template, suffix, flags) } {
                Some(fd) => fd,
                None => call_real!($name: fn(*mut c_char, c_int, c_int) -> c_int, -1; template, suffix, flags),
            }
        }
    };
}
mkostemps_wrapper!(mkostemps);
mkostemps_wrapper!(mkostemps64);

/// # Safety
/// C ABI: `template` is a writable NUL-terminated string.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "mkdtemp"))]
#[boundary]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: per the C contract.
    let made = unsafe {
        draw(template, 0, |path| {
            let s = store()?;
            s.mkdir(path, 0o700 & !names::umask_now())
        })
    };
    match made {
        Some(Ok(())) => template,
        Some(Err(e)) => {
            set_errno(e.errno());
            std::ptr::null_mut()
        }
        None => call_real!(mkdtemp: fn(*mut c_char) -> *mut c_char, std::ptr::null_mut(); template),
    }
}

/// tempnam(dir, prefix): with `dir` (or TMPDIR, which glibc prefers) under the mount, a
/// name there that does not exist yet (only a name: the caller creates the file).
///
/// # Safety
/// C ABI: `dir` and `prefix` are null or NUL-terminated strings.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "tempnam"))]
#[boundary]
pub unsafe extern "C" fn tempnam(dir: *const c_char, prefix: *const c_char) -> *mut c_char {
    let from_env = std::env::var("TMPDIR").ok().filter(|d| !d.is_empty());
    let given = (!dir.is_null()).then(|| {
        // SAFETY: non-null and NUL-terminated per the contract.
        let d = unsafe { CStr::from_ptr(dir) };
        d.to_string_lossy().into_owned()
    });
    // glibc: TMPDIR if it is a directory, else `dir` if it is one, else P_tmpdir.
    let is_store_dir = |d: &str| {
        store_path_of(d)
            .is_some_and(|p| store().is_ok_and(|s| s.stat(&p).is_ok_and(|m| m.is_dir())))
    };
    let host_dir = |d: &str| std::fs::metadata(d).is_ok_and(|m| m.is_dir());
    let chosen = [from_env, given]
        .into_iter()
        .flatten()
        .find(|d| is_store_dir(d) || host_dir(d));
    let Some(chosen) = chosen.filter(|d| is_store_dir(d)) else {
        return call_real!(tempnam: fn(*const c_char, *const c_char) -> *mut c_char, std::ptr::null_mut(); dir, prefix);
    };
    let prefix = if prefix.is_null() {
        "file".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated per the contract.
        let p = unsafe { CStr::from_ptr(prefix) }
            .to_string_lossy()
            .into_owned();
        p.chars().take(5).collect()
    };
    let Ok(s) = store() else {
        set_errno(libc::EIO);
        return std::ptr::null_mut();
    };
    for _ in 0..ATTEMPTS {
        let suffix = String::from_utf8_lossy(&random_letters()).into_owned();
        let name = format!("{}/{prefix}{suffix}", chosen.trim_end_matches('/'));
        let taken = store_path_of(&name).is_some_and(|p| s.stat(&p).is_ok());
        if !taken {
            return match std::ffi::CString::new(name) {
                // SAFETY: strdup copies a NUL-terminated string into malloc'ed memory, which
                // the caller frees.
                Ok(c) => unsafe { libc::strdup(c.as_ptr()) },
                Err(_) => std::ptr::null_mut(),
            };
        }
    }
    set_errno(libc::EEXIST);
    std::ptr::null_mut()
}
