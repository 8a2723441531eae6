//! Running and loading files of the store: the kernel cannot open a store path, so exec of a
//! stored program and dlopen of a stored library are turned into things it can do.
//!
//! - A script (`#!interpreter [arg]`) is run as the kernel's binfmt_script would: the
//!   interpreter, its one argument, the script's path as given, then the arguments. The
//!   interpreter runs under the preload and opens the script through it, so `$0` and the
//!   script's view of itself are the store path.
//! - An ELF program or library is copied into a close-on-exec memfd and run or loaded as
//!   `/proc/self/fd/N` (the kernel opens it by that path before it closes the descriptor at
//!   exec). Its `/proc/self/exe` names the memfd.
//! - Anything else is ENOEXEC, as from the kernel; a stored directory, or a file without an
//!   execute bit for the caller, EACCES.

use super::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Interpreters of interpreters followed before ELOOP (the kernel allows 4 levels).
const MAX_INTERPRETERS: usize = 4;
/// The most of a `#!` line read, as the kernel's BINPRM_BUF_SIZE.
const SHEBANG_MAX: usize = 256;

/// How to run a stored program.
pub(crate) struct Plan {
    /// The path to hand to the real exec.
    pub(crate) path: CString,
    /// The arguments, when they change (scripts); else the caller's.
    pub(crate) argv: Option<Vec<CString>>,
    /// The memfd holding an ELF copy, kept open until the exec.
    _copy: Option<OwnedFd>,
}

impl Plan {
    /// A NULL-terminated argv: the plan's, or `caller`'s.
    pub(crate) fn argv_ptrs(&self, caller: *const *const c_char) -> Vec<*const c_char> {
        match &self.argv {
            Some(argv) => argv
                .iter()
                .map(|a| a.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect(),
            None => {
                // SAFETY: the caller's argv is null or NULL-terminated.
                let mut v = unsafe { c_array(caller) };
                v.push(std::ptr::null());
                v
            }
        }
    }
}

/// The caller's argv as owned strings.
///
/// # Safety
/// `argv` is null or a NULL-terminated array of C strings.
unsafe fn owned_args(argv: *const *const c_char) -> Vec<CString> {
    // SAFETY: per the contract.
    let args = unsafe { c_array(argv) };
    args.into_iter()
        // SAFETY: each entry is a C string.
        .map(|p| unsafe { CStr::from_ptr(p) }.to_owned())
        .collect()
}

/// The plan for running `path` (as the caller wrote it) with `argv`: None when the path is
/// not Cascade's (the real exec runs it).
///
/// # Safety
/// `path` is NUL-terminated; `argv` is null or a NULL-terminated array of C strings.
pub(crate) unsafe fn plan(
    path: *const c_char,
    argv: *const *const c_char,
) -> Option<Result<Plan, Error>> {
    // SAFETY: per the contract.
    let store_path = unsafe { classify(path) }?;
    // SAFETY: per the contract.
    let given = unsafe { CStr::from_ptr(path) }.to_owned();
    // SAFETY: per the contract.
    let args = unsafe { owned_args(argv) };
    Some(plan_store(&store_path, given, args, 0))
}

fn plan_store(p: &str, given: CString, args: Vec<CString>, depth: usize) -> Result<Plan, Error> {
    if depth > MAX_INTERPRETERS {
        return Err(Error::new(libc::ELOOP, ""));
    }
    let s = store()?;
    let file = readthrough::with_fetch(p, || s.open(p, &cascade_store::OpenOptions::new()))?;
    if file.is_dir() || stat::check_access(p, libc::X_OK) != 0 {
        return Err(Error::new(libc::EACCES, ""));
    }
    let mut head = [0u8; SHEBANG_MAX];
    let n = file.read_at(&mut head, 0)?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|b| *b == b'\n').next().unwrap_or(line);
        let line = String::from_utf8_lossy(line);
        let line = line.trim_matches(|c| c == ' ' || c == '\t');
        let (interpreter, arg) = match line.split_once([' ', '\t']) {
            Some((i, a)) => (i, Some(a.trim_matches(|c| c == ' ' || c == '\t'))),
            None => (line, None),
        };
        if interpreter.is_empty() {
            return Err(Error::new(libc::ENOEXEC, ""));
        }
        let to_c = |t: &str| CString::new(t).map_err(|_| Error::new(libc::ENOEXEC, ""));
        let mut argv = vec![to_c(interpreter)?];
        if let Some(a) = arg.filter(|a| !a.is_empty()) {
            argv.push(to_c(a)?);
        }
        argv.push(given);
        argv.extend(args.into_iter().skip(1));
        let interp = to_c(interpreter)?;
        // An interpreter stored in the store is planned in turn.
        return match store_path_of_relative(interpreter) {
            Some(ip) => plan_store(&ip, interp, argv, depth + 1),
            None => Ok(Plan {
                path: interp,
                argv: Some(argv),
                _copy: None,
            }),
        };
    }
    if !head.starts_with(b"\x7fELF") {
        return Err(Error::new(libc::ENOEXEC, ""));
    }
    let copy = copy_to_memfd(&file, "cascade-exec")?;
    let path = CString::new(format!("/proc/self/fd/{}", copy.as_raw_fd()))
        .map_err(|_| Error::new(libc::ENOEXEC, ""))?;
    Ok(Plan {
        path,
        argv: (depth > 0).then_some(args),
        _copy: Some(copy),
    })
}

/// The store path of an interpreter named in a `#!` line (absolute, or relative to the
/// working directory as the kernel takes it).
fn store_path_of_relative(path: &str) -> Option<String> {
    let c = CString::new(path).ok()?;
    // SAFETY: a NUL-terminated string, alive until the path is copied out of it.
    unsafe { classify(c.as_ptr()) }.map(Cow::into_owned)
}

/// A close-on-exec memfd holding the whole of store file `file`.
fn copy_to_memfd(file: &cascade_store::File, name: &str) -> Result<OwnedFd, Error> {
    let cname = CString::new(name).map_err(|_| Error::new(libc::EINVAL, ""))?;
    // SAFETY: a valid name; the flags are constants.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: a descriptor just made and owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            return Ok(fd);
        }
        let mut done = 0;
        while done < n {
            // SAFETY: writing initialised bytes of `buf` to our own descriptor, bypassing
            // the wrappers (it is not a Cascade fd).
            let w = unsafe {
                libc::syscall(
                    libc::SYS_pwrite64,
                    raw,
                    buf[done..n].as_ptr(),
                    n - done,
                    (at + done as u64) as i64,
                )
            };
            if w < 0 {
                return Err(Error::last_os("write to memfd"));
            }
            done += w as usize;
        }
        at += n as u64;
    }
}

/// Stored libraries loaded so far: store path -> (version, memfd). Kept open so that a
/// second dlopen of the same unchanged file finds the same object (glibc matches loaded
/// objects by device and inode).
type Loaded = HashMap<String, ((u64, u32, u64), OwnedFd)>;
static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

/// `/proc/self/fd/N` of a memfd copy of the stored library at `p`.
fn library_copy(p: &str) -> Result<CString, Error> {
    let s = store()?;
    let file = readthrough::with_fetch(p, || s.open(p, &cascade_store::OpenOptions::new()))?;
    if file.is_dir() {
        return Err(Error::new(libc::EISDIR, ""));
    }
    let m = file.metadata()?;
    let version = (file.ino(), file.generation(), m.size);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = loaded.get_or_insert_with(HashMap::new);
    let fd = match loaded.get(p) {
        Some((v, fd)) if *v == version => fd.as_raw_fd(),
        _ => {
            let copy = copy_to_memfd(&file, "cascade-lib")?;
            let raw = copy.as_raw_fd();
            loaded.insert(p.to_string(), (version, copy));
            raw
        }
    };
    CString::new(format!("/proc/self/fd/{fd}")).map_err(|_| Error::new(libc::EINVAL, ""))
}

/// Sets dlerror's text the only way there is: a failed dlopen of a path that cannot exist.
fn dl_fail(e: &Error, p: &str) -> *mut c_void {
    let text = cascade_store::errno_text(e.errno());
    if let Ok(c) = CString::new(format!("{}{p}: {text}", mount())) {
        if let Some(f) = real!(dlopen: fn(*const c_char, c_int) -> *mut c_void) {
            // SAFETY: a NUL-terminated path that does not exist on the host (under the mount
            // prefix's empty host directory): glibc records "cannot open shared object".
            unsafe { f(c.as_ptr(), libc::RTLD_NOW) };
        }
    }
    std::ptr::null_mut()
}

use libc::{c_int, c_void};

/// The store path of a library path given to dlopen: only a path with a '/' (a bare name is
/// searched by the loader, never in the store).
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn stored_library(path: *const c_char) -> Option<String> {
    if path.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if !bytes.contains(&b'/') {
        return None;
    }
    // SAFETY: as above.
    unsafe { classify(path) }.map(Cow::into_owned)
}

/// # Safety
/// C ABI: `path` is null or NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dlopen"))]
#[boundary]
pub unsafe extern "C" fn dlopen(path: *const c_char, flags: c_int) -> *mut c_void {
    // SAFETY: per the C contract.
    let store_path = unsafe { stored_library(path) };
    match store_path {
        Some(p) => match library_copy(&p) {
            Ok(copy) => {
                call_real!(dlopen: fn(*const c_char, c_int) -> *mut c_void, std::ptr::null_mut(); copy.as_ptr(), flags)
            }
            Err(e) => dl_fail(&e, &p),
        },
        None => {
            call_real!(dlopen: fn(*const c_char, c_int) -> *mut c_void, std::ptr::null_mut(); path, flags)
        }
    }
}

/// # Safety
/// C ABI: `path` is null or NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "dlmopen"))]
#[boundary]
pub unsafe extern "C" fn dlmopen(
    lmid: libc::Lmid_t,
    path: *const c_char,
    flags: c_int,
) -> *mut c_void {
    // SAFETY: per the C contract.
    let store_path = unsafe { stored_library(path) };
    match store_path {
        Some(p) => match library_copy(&p) {
            Ok(copy) => {
                call_real!(dlmopen: fn(libc::Lmid_t, *const c_char, c_int) -> *mut c_void, std::ptr::null_mut(); lmid, copy.as_ptr(), flags)
            }
            Err(e) => dl_fail(&e, &p),
        },
        None => {
            call_real!(dlmopen: fn(libc::Lmid_t, *const c_char, c_int) -> *mut c_void, std::ptr::null_mut(); lmid, path, flags)
        }
    }
}
