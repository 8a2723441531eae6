//! sysio: open, close, read, write, seek, truncate, sync, allocate.

use super::*;
use cascade_store::OpenOptions;
use libc::{c_int, c_uint, c_void, iovec, off64_t, off_t, size_t, ssize_t};
use std::ffi::c_char;
use std::sync::atomic::Ordering::{AcqRel, Acquire};

/// Opens a Cascade path: a store file, a shared description and a real kernel fd (memfd).
pub(crate) fn open_store_path(path: &str, flags: c_int, mode: c_uint) -> Result<c_int, Error> {
    if flags & (libc::O_CREAT | libc::O_DIRECTORY) == libc::O_CREAT | libc::O_DIRECTORY
        && kernel_rejects_creat_directory()
    {
        return Err(Error::new(
            libc::EINVAL,
            format!("{path}: O_CREAT with O_DIRECTORY"),
        ));
    }
    let store = store()?;
    let acc = flags & libc::O_ACCMODE;
    let opts = OpenOptions {
        read: acc != libc::O_WRONLY,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        create: flags & libc::O_CREAT != 0,
        create_new: flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        // O_APPEND is the description's (fcntl(F_SETFL) sets and clears it): `do_write`
        // reads it there on every write and appends with `File::append`. A handle opened to
        // append would append even after the flag was cleared.
        append: false,
        directory: flags & libc::O_DIRECTORY != 0,
        mode: mode & 0o7777 & !names::umask_now(),
        described: true,
    };
    // Read-through: a path the store lacks may be in the durable store (not for creation),
    // and a remote file (its content only below) is fetched before it is used.
    let mut file = if opts.create {
        store.open(path, &opts)?
    } else {
        readthrough::with_fetch(path, || store.open(path, &opts))?
    };
    // A remote file is fetched first. A handle that went stale before it was described
    // (another process's fetch replaced the remote file it named, and the inode was reused)
    // is opened again: reading through it would fail with ESTALE.
    let again = OpenOptions {
        create_new: false,
        ..opts
    };
    let mut described = None;
    for _ in 0..4 {
        if file.is_stale() {
            file = store.open(path, &again)?;
            continue;
        }
        if file.is_remote() {
            drop(file);
            readthrough::fetch_remote(path)?;
            file = store.open(path, &again)?;
            continue;
        }
        if flags & libc::O_DIRECTORY != 0 && !file.is_dir() {
            return Err(Error::new(libc::ENOTDIR, path.to_string()));
        }
        match store.describe_open(&file, flags & (libc::O_ACCMODE | libc::O_APPEND)) {
            Err(e) if e.errno() == libc::ESTALE => file = store.open(path, &again)?,
            other => {
                described = Some(other?);
                break;
            }
        }
    }
    let desc = described.ok_or_else(|| {
        Error::new(
            libc::EIO,
            format!("{path}: replaced by other processes each time it was opened"),
        )
    })?;
    let is_dir = file.is_dir();
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let made = match anchor_fd() {
        Some(anchor) if store.anchor_description(desc) => duplicate_anchor(anchor, cloexec),
        _ => named_memfd(&desc, cloexec),
    };
    let fd = match made {
        Ok(fd) => fd,
        Err(e) => {
            store.release_description(desc);
            return Err(e);
        }
    };
    if fd as usize >= MAX_FDS {
        // SAFETY: closing the fd we just made.
        unsafe { libc::close(fd) };
        store.release_description(desc);
        return Err(Error::new(
            libc::EMFILE,
            "descriptor number too large for Cascade",
        ));
    }
    register(
        fd,
        Arc::new(Entry {
            file,
            desc,
            path: path.to_string(),
            lock_fd: OnceLock::new(),
            is_dir,
        }),
    );
    Ok(fd)
}

/// The process's anchor: a memfd (`cascade-anchor`) of which each Cascade descriptor is a
/// duplicate while only this process holds its description (docs/interposition.md, "File
/// descriptors"): F_DUPFD is a tenth of a memfd_create. None if it cannot be made.
fn anchor_fd() -> Option<c_int> {
    if let Some(fd) = existing_anchor() {
        return Some(fd);
    }
    if !owns_its_table() {
        // A vfork child would make it in its own table and name it in its parent's memory.
        return None;
    }
    // SAFETY: a constant, NUL-terminated name.
    let made = unsafe { libc::memfd_create(c"cascade-anchor".as_ptr(), libc::MFD_CLOEXEC) };
    if made < 0 {
        return None;
    }
    match ANCHOR.compare_exchange(-1, made, AcqRel, Acquire) {
        Ok(_) => Some(made),
        Err(other) => {
            // SAFETY: closing the memfd this call made; another thread's won.
            unsafe { libc::syscall(libc::SYS_close, made) };
            Some(other)
        }
    }
}

static ANCHOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The anchor if this process made one. Never made here: a vfork child shares this
/// variable with its parent but not its descriptor table.
fn existing_anchor() -> Option<c_int> {
    let fd = ANCHOR.load(Acquire);
    (fd >= 0).then_some(fd)
}

/// The anchor's (device, inode), to tell anchored descriptors from named ones.
fn anchor_identity() -> Option<(u64, u64)> {
    identity(existing_anchor()?)
}

/// The (device, inode) of what `fd` is in the kernel (the real fstat, not the wrapper,
/// which describes the store file; so are the calls below: `libc::syscall` is wrapped too).
fn identity(fd: c_int) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    let rc = call_real!(fstat: fn(c_int, *mut libc::stat) -> c_int, -1; fd, st.as_mut_ptr());
    // SAFETY: a successful fstat initialised it.
    (rc == 0)
        .then(|| unsafe { st.assume_init() })
        .map(|st| (st.st_dev, st.st_ino))
}

/// The lowest free descriptor, a duplicate of the anchor.
fn duplicate_anchor(anchor: c_int, cloexec: bool) -> Result<c_int, Error> {
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    let fd = call_real!(fcntl: fn(c_int, c_int, libc::c_ulong) -> c_int, -1; anchor, cmd, 0);
    if fd < 0 {
        return Err(Error::last_os("fcntl(F_DUPFD)"));
    }
    Ok(fd as c_int)
}

/// A memfd named after description `desc` (`cascade-ofd:<slot>:<nonce>`), which other
/// processes' sweeps and an exec'd image recognise.
fn named_memfd(desc: &OpenDescription, cloexec: bool) -> Result<c_int, Error> {
    let name = desc.memfd_name();
    let memfd_flags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: `name` is a valid C string.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), memfd_flags) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    Ok(fd)
}

/// Before another process can inherit this one's descriptors (fork, exec, posix_spawn,
/// system, popen): each anchored Cascade descriptor is replaced, under its number and with
/// its close-on-exec flag, by a memfd named after its description, so that the heir's
/// descriptors keep the description alive in sweeps after this process is gone, and an
/// exec'd image can adopt them.
pub(crate) fn name_anchored_descriptors() {
    let Some(anchor) = anchor_identity() else {
        return;
    };
    for (fd, entry) in all_entries() {
        if identity(fd) != Some(anchor) {
            continue;
        }
        let fd_flags =
            call_real!(fcntl: fn(c_int, c_int, libc::c_ulong) -> c_int, -1; fd, libc::F_GETFD, 0);
        let cloexec = fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0;
        let Ok(named) = named_memfd(&entry.desc, cloexec) else {
            continue;
        };
        let dup_flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // The real dup3: the entry stays registered under `fd`.
        call_real!(dup3: fn(c_int, c_int, c_int) -> c_int, -1; named, fd, dup_flags);
        call_real!(close: fn(c_int) -> c_int, -1; named);
    }
}

/// Whether the running kernel refuses `O_CREAT|O_DIRECTORY` with EINVAL (Linux 6.4 and
/// later) rather than creating a regular file; Cascade does what the kernel does. Asked once,
/// with an `openat` on a descriptor that is none (-1): a kernel that checks these flags first
/// answers EINVAL, an older one EBADF. Nothing is looked up or created.
fn kernel_rejects_creat_directory() -> bool {
    static ANSWER: OnceLock<bool> = OnceLock::new();
    *ANSWER.get_or_init(|| {
        // SAFETY: a NUL-terminated path and a bad descriptor; the result is checked.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_openat,
                -1,
                c"cascade-probe".as_ptr(),
                libc::O_CREAT | libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
                0o600,
            )
        };
        if rc >= 0 {
            // SAFETY: closing the descriptor the probe got (it cannot, but if it did).
            unsafe { libc::syscall(libc::SYS_close, rc) };
            return false;
        }
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() == libc::EINVAL }
    })
}

fn open_impl(path: &str, flags: c_int, mode: c_uint) -> c_int {
    open_store_path(path, flags, mode).unwrap_or_else(|e| fail(&e))
}

macro_rules! open_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `path` is a NUL-terminated string (or null, which the real call rejects).
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            // SAFETY: per the C contract of open().
            match unsafe { classify(path) } {
                Some(p) => open_impl(&p, flags, mode),
                None => call_real!($name: fn(*const c_char, c_int, c_uint) -> c_int, -1; path, flags, mode),
            }
        }
    };
}
open_wrapper!(open);
open_wrapper!(open64);
open_wrapper!(__open_2);
open_wrapper!(__open64_2);

macro_rules! openat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `path` is a NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            // SAFETY: per the C contract of openat().
            match unsafe { classify_at(dirfd, path) } {
                Some(p) => open_impl(&p, flags, mode),
                None => call_real!($name: fn(c_int, *const c_char, c_int, c_uint) -> c_int, -1; dirfd, path, flags, mode),
            }
        }
    };
}
openat_wrapper!(openat);
openat_wrapper!(openat64);
openat_wrapper!(__openat_2);
openat_wrapper!(__openat64_2);

macro_rules! creat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `path` is a NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: c_uint) -> c_int {
            // SAFETY: per the C contract of creat().
            match unsafe { classify(path) } {
                Some(p) => open_impl(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode),
                None => call_real!($name: fn(*const c_char, c_uint) -> c_int, -1; path, mode),
            }
        }
    };
}
creat_wrapper!(creat);
creat_wrapper!(creat64);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "close"))]
#[boundary]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(e) = unregister(fd) {
        if let Ok(s) = store() {
            s.release_description(e.desc);
        }
    }
    call_real!(close: fn(c_int) -> c_int, -1; fd)
}

/// Forgets the Cascade descriptors in `first..=last` (their descriptions released) before
/// the kernel closes them all.
fn release_range(first: c_uint, last: c_uint) {
    let last = last.min(MAX_FDS as c_uint - 1);
    for fd in first..=last {
        if let Some(e) = unregister(fd as c_int) {
            if let Ok(s) = store() {
                s.release_description(e.desc);
            }
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "close_range"))]
#[boundary]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // CLOSE_RANGE_CLOEXEC only marks them; the kernel closes them at exec.
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        release_range(first, last);
    }
    call_real!(close_range: fn(c_uint, c_uint, c_int) -> c_int, -1; first, last, flags)
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "closefrom"))]
#[boundary]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    if let Ok(first) = c_uint::try_from(lowfd) {
        release_range(first, c_uint::MAX);
    }
    if let Some(f) = real!(closefrom: fn(c_int) -> ()) {
        // SAFETY: forwarding the caller's argument.
        unsafe { f(lowfd) }
    }
}

macro_rules! exit_wrapper {
    ($name:ident) => {
        /// A normal end without exit's handlers: Cascade files are closed first (not torn).
        ///
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[allow(non_snake_case)] // _Exit is C's name.
        pub unsafe extern "C" fn $name(status: c_int) -> ! {
            // The process ends either way (no #[boundary]: nothing is returned).
            catch_panic(stringify!($name), || close_all_at_exit(false));
            if let Some(f) = real!($name: fn(c_int) -> ()) {
                // SAFETY: forwarding the caller's argument; it does not return.
                unsafe { f(status) };
            }
            // No next definition: the process ends as _exit would end it.
            std::process::exit(status)
        }
    };
}
exit_wrapper!(_exit);
exit_wrapper!(_Exit);

// ---- data ---------------------------------------------------------------------------------

fn readable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_WRONLY
}

fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

fn ebadf() -> Error {
    Error::new(libc::EBADF, "")
}

/// Reads at the shared offset (or at `at`) and advances it when positional is false.
/// Reads take no lock (the caller is for [`do_write`]'s signature).
#[inline(always)]
fn do_read(e: &Entry, _: &Caller, buf: &mut [u8], at: Option<u64>) -> Result<usize, Error> {
    let d = e.description().ok_or_else(ebadf)?;
    if !readable(d.flags()) {
        return Err(ebadf());
    }
    if e.is_dir {
        return Err(Error::new(libc::EISDIR, ""));
    }
    let Some(off) = at else {
        // read(2): claim the bytes read by moving the shared offset past them; a call that
        // raced another on the same description reads again at the offset that one left.
        let offset = d.offset();
        loop {
            let off = offset.load(Acquire);
            let n = e.file.read_at(buf, off)?;
            if offset
                .compare_exchange(off, off + n as u64, AcqRel, Relaxed)
                .is_ok()
            {
                return Ok(n);
            }
        }
    };
    e.file.read_at(buf, off)
}

#[inline(always)]
fn do_write(e: &Entry, caller: &Caller, buf: &[u8], at: Option<u64>) -> Result<usize, Error> {
    let d = e.description().ok_or_else(ebadf)?;
    let flags = d.flags();
    if !writable(flags) {
        return Err(ebadf());
    }
    if buf.is_empty() {
        // Nothing written: even O_APPEND leaves the offset alone (as Linux does).
        return Ok(0);
    }
    match at {
        // Linux appends even for pwrite on an O_APPEND descriptor (pwrite(2), BUGS).
        Some(_) if flags & libc::O_APPEND != 0 => e.file.append(buf).map(|_| buf.len()),
        Some(off) => e.file.write_at_as(caller.holder(), buf, off),
        None if flags & libc::O_APPEND != 0 => {
            let at = e.file.append(buf)?;
            d.offset().store(at + buf.len() as u64, Relaxed);
            Ok(buf.len())
        }
        None => e.file.write_advancing_as(caller.holder(), buf, d.offset()),
    }
}

fn ssize(r: Result<usize, Error>) -> ssize_t {
    r.map(|n| n as ssize_t).unwrap_or_else(|e| fail_ssize(&e))
}

// read, write, pread and pwrite ask whether the descriptor is Cascade's before the panic
// boundary: a call on any other descriptor (the pass-through the bench holds under 5 %)
// then costs one flag load and the call of the real function, without the boundary's
// frame (and the wrapper's prologue, which saves the registers of the fast path below).
// Nothing on that path can panic. Neither on the next: the usual small write or read is
// tried whole (`try_write_fast`, `try_read_fast`) before the boundary, and the general path
// runs inside it only when that declines.

/// `fd`'s entry for a fast read or write of `count` bytes at `buf`: None for a call the
/// fast paths leave to the general one (nothing to move, a null buffer, a count past
/// `isize::MAX`) and where [`HeldEntry::of`] finds none.
#[inline(always)]
fn held_for_io(fd: c_int, buf: *const c_void, count: size_t) -> Option<HeldEntry> {
    // count in 1..=isize::MAX with one compare: 0 wraps to usize::MAX.
    if count.wrapping_sub(1) >= isize::MAX as usize || buf.is_null() {
        return None;
    }
    HeldEntry::of(fd)
}

/// The usual small write(2) or pwrite(2) on a Cascade descriptor, or None having changed
/// nothing (`File::try_write_advancing_fast`: this thread holds the file's bias, the bytes
/// go into the hinted chunk, no O_APPEND). It cannot panic: every check is one that
/// declines, so it runs without the boundary's frame and `Result`.
///
/// # Safety
/// As the wrapper's: `buf` holds `count` bytes.
#[inline(always)]
unsafe fn try_write_fast(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    at: Option<i64>,
) -> Option<ssize_t> {
    let held = held_for_io(fd, buf, count)?;
    let e = held.entry();
    let d = e.description()?;
    let flags = d.flags();
    if !writable(flags) || flags & libc::O_APPEND != 0 {
        return None;
    }
    // SAFETY: the caller provides `count` bytes at `buf` (not null: held_for_io).
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, count) };
    let n = match at {
        None => e
            .file
            .try_write_advancing_fast(held.holder(), data, d.offset()),
        Some(off) => e
            .file
            .try_write_at_fast(held.holder(), data, u64::try_from(off).ok()?),
    }?;
    Some(n as ssize_t)
}

/// The usual small read(2) or pread(2) on a Cascade descriptor, or None
/// (`File::try_read_at_fast`: the bytes lie in the chunk the handle last read), as
/// [`try_write_fast`] for writes. A read(2) claims its bytes by moving the shared offset
/// past them with one compare-and-swap; when another call moved it first, the general path
/// reads again (as `do_read` does) and overwrites `buf`.
///
/// # Safety
/// As the wrapper's: `buf` is writable for `count` bytes.
#[inline(always)]
unsafe fn try_read_fast(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    at: Option<i64>,
) -> Option<ssize_t> {
    let held = held_for_io(fd, buf.cast_const(), count)?;
    let e = held.entry();
    let d = e.description()?;
    if !readable(d.flags()) || e.is_dir {
        return None;
    }
    // SAFETY: the caller provides `count` writable bytes at `buf` (not null: held_for_io).
    let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count) };
    let n = match at {
        None => {
            let offset = d.offset();
            let at = offset.load(Acquire);
            let n = e.file.try_read_at_fast(out, at)?;
            offset
                .compare_exchange(at, at + n as u64, AcqRel, Relaxed)
                .ok()?;
            n
        }
        Some(off) => e.file.try_read_at_fast(out, u64::try_from(off).ok()?)?,
    };
    Some(n as ssize_t)
}

macro_rules! io_wrapper {
    ($name:ident, $cascade:ident, $ptr:ty, $slice:ident, $do:ident, $fast:ident; $($off:ident: $off_ty:ty)?) => {
        /// # Safety
        /// C ABI: `buf` holds `count` bytes (writable for a read).
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        pub unsafe extern "C" fn $name(fd: c_int, buf: $ptr, count: size_t $(, $off: $off_ty)?) -> ssize_t {
            if !is_cascade_fd(fd) {
                return call_real!($name: fn(c_int, $ptr, size_t $(, $off_ty)?) -> ssize_t, -1; fd, buf, count $(, $off)?);
            }
            // SAFETY: the caller's contract, passed on.
            if let Some(n) = unsafe { $fast(fd, buf, count, None $(.or(Some($off as i64)))?) } {
                return n;
            }
            // SAFETY: the caller's contract, passed on.
            unsafe { $cascade(fd, buf, count $(, $off)?) }
        }

        /// The call on a Cascade descriptor (or one closed meanwhile), inside the boundary.
        ///
        /// # Safety
        /// As the wrapper's.
        #[inline(never)]
        #[boundary]
        unsafe fn $cascade(fd: c_int, buf: $ptr, count: size_t $(, $off: $off_ty)?) -> ssize_t {
            let done = with_entry(fd, |e, caller| {
                // The offset of pread/pwrite; none for read/write.
                let at: Option<i64> = None $(.or(Some($off as i64)))?;
                if at.is_some_and(|o| o < 0) {
                    return Err(Error::new(libc::EINVAL, ""));
                }
                // SAFETY: the caller provides `count` bytes at `buf`.
                $do(e, caller, unsafe { $slice(buf, count) }, at.map(|o| o as u64))
            });
            match done {
                Some(r) => ssize(r),
                None => call_real!($name: fn(c_int, $ptr, size_t $(, $off_ty)?) -> ssize_t, -1; fd, buf, count $(, $off)?),
            }
        }
    };
}
io_wrapper!(read, cascade_read, *mut c_void, slice_mut, do_read, try_read_fast;);
io_wrapper!(write, cascade_write, *const c_void, slice, do_write, try_write_fast;);
io_wrapper!(pread, cascade_pread, *mut c_void, slice_mut, do_read, try_read_fast; offset: off_t);
io_wrapper!(pread64, cascade_pread64, *mut c_void, slice_mut, do_read, try_read_fast; offset: off64_t);
io_wrapper!(pwrite, cascade_pwrite, *const c_void, slice, do_write, try_write_fast; offset: off_t);
io_wrapper!(pwrite64, cascade_pwrite64, *const c_void, slice, do_write, try_write_fast; offset: off64_t);

/// # Safety
/// `buf` is null only with `len == 0`, else valid for `len` bytes.
unsafe fn slice<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 || buf.is_null() {
        &[]
    } else {
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(buf as *const u8, len) }
    }
}

/// # Safety
/// As [`slice`], for writing.
unsafe fn slice_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 || buf.is_null() {
        &mut []
    } else {
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) }
    }
}

/// Vectored I/O: one call per buffer, stopping at a short transfer.
fn vectored(
    e: &Entry,
    caller: &Caller,
    iov: *const iovec,
    cnt: c_int,
    mut at: Option<u64>,
    write: bool,
) -> Result<usize, Error> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(Error::new(libc::EINVAL, ""));
    }
    // SAFETY: the caller passes `cnt` iovecs at `iov`.
    let total: usize = (0..cnt as usize)
        .map(|i| unsafe { (*iov.add(i)).iov_len })
        .sum();
    if total == 0 {
        // Like the kernel: nothing to transfer is 0, once the descriptor checks pass.
        let d = e.description().ok_or_else(ebadf)?;
        let ok = if write {
            writable(d.flags())
        } else {
            readable(d.flags())
        };
        return if ok { Ok(0) } else { Err(ebadf()) };
    }
    let mut total = 0;
    for i in 0..cnt as usize {
        // SAFETY: the caller passes `cnt` iovecs at `iov`.
        let v = unsafe { &*iov.add(i) };
        let n = if write {
            // SAFETY: each iovec describes readable memory.
            do_write(e, caller, unsafe { slice(v.iov_base, v.iov_len) }, at)?
        } else {
            // SAFETY: each iovec describes writable memory.
            do_read(e, caller, unsafe { slice_mut(v.iov_base, v.iov_len) }, at)?
        };
        total += n;
        if let Some(a) = at.as_mut() {
            *a += n as u64;
        }
        if n < v.iov_len {
            break;
        }
    }
    Ok(total)
}

/// # Safety
/// C ABI: `iov` points at `cnt` iovecs.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "readv"))]
#[boundary]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match with_entry(fd, |e, caller| vectored(e, caller, iov, cnt, None, false)) {
        Some(r) => ssize(r),
        None => call_real!(readv: fn(c_int, *const iovec, c_int) -> ssize_t, -1; fd, iov, cnt),
    }
}

/// # Safety
/// C ABI: `iov` points at `cnt` iovecs.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "writev"))]
#[boundary]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match with_entry(fd, |e, caller| vectored(e, caller, iov, cnt, None, true)) {
        Some(r) => ssize(r),
        None => call_real!(writev: fn(c_int, *const iovec, c_int) -> ssize_t, -1; fd, iov, cnt),
    }
}

macro_rules! preadv_wrapper {
    ($name:ident, $write:expr) => {
        /// # Safety
        /// C ABI: `iov` points at `cnt` iovecs.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, offset: off64_t) -> ssize_t {
            // preadv/pwritev with offset -1 (the *v2 forms) use the file offset.
            match with_entry(fd, |e, caller| vectored(e, caller, iov, cnt, (offset >= 0).then_some(offset as u64), $write)) {
                Some(r) => ssize(r),
                None => call_real!($name: fn(c_int, *const iovec, c_int, off64_t) -> ssize_t, -1; fd, iov, cnt, offset),
            }
        }
    };
}
preadv_wrapper!(preadv, false);
preadv_wrapper!(preadv64, false);
preadv_wrapper!(pwritev, true);
preadv_wrapper!(pwritev64, true);

macro_rules! preadv2_wrapper {
    ($name:ident, $write:expr) => {
        /// # Safety
        /// C ABI: `iov` points at `cnt` iovecs.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, offset: off64_t, flags: c_int) -> ssize_t {
            match with_entry(fd, |e, caller| vectored(e, caller, iov, cnt, (offset >= 0).then_some(offset as u64), $write)) {
                Some(r) => ssize(r),
                None => call_real!($name: fn(c_int, *const iovec, c_int, off64_t, c_int) -> ssize_t, -1; fd, iov, cnt, offset, flags),
            }
        }
    };
}
preadv2_wrapper!(preadv2, false);
preadv2_wrapper!(preadv64v2, false);
preadv2_wrapper!(pwritev2, true);
preadv2_wrapper!(pwritev64v2, true);

// ---- fortified reads (_FORTIFY_SOURCE): glibc's check, then its internal read ----------

/// What glibc's __chk_fail does: the buffer is smaller than the read asked for.
fn buffer_overflow() -> ! {
    const MSG: &[u8] = b"*** buffer overflow detected ***: terminated\n";
    // SAFETY: writing a constant message to stderr, then aborting, as glibc does.
    unsafe { libc::syscall(libc::SYS_write, 2, MSG.as_ptr(), MSG.len()) };
    std::process::abort()
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "__read_chk"))]
#[boundary]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    buflen: size_t,
) -> ssize_t {
    if !is_cascade_fd(fd) {
        return call_real!(__read_chk: fn(c_int, *mut c_void, size_t, size_t) -> ssize_t, -1; fd, buf, count, buflen);
    }
    if count > buflen {
        buffer_overflow();
    }
    // SAFETY: per the C contract.
    unsafe { read(fd, buf, count) }
}

macro_rules! pread_chk_wrapper {
    ($name:ident, $plain:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut c_void, count: size_t, offset: off64_t, buflen: size_t) -> ssize_t {
            if !is_cascade_fd(fd) {
                return call_real!($name: fn(c_int, *mut c_void, size_t, off64_t, size_t) -> ssize_t, -1; fd, buf, count, offset, buflen);
            }
            if count > buflen {
                buffer_overflow();
            }
            // SAFETY: per the C contract.
            unsafe { $plain(fd, buf, count, offset) }
        }
    };
}
pread_chk_wrapper!(__pread_chk, pread);
pread_chk_wrapper!(__pread64_chk, pread64);

fn do_lseek(e: &Entry, offset: i64, whence: c_int) -> Result<i64, Error> {
    let d = e.description().ok_or_else(ebadf)?;
    if e.is_dir {
        // A directory's offset counts getdents entries; only rewinding is portable.
        return match (whence, offset) {
            (libc::SEEK_SET, o) if o >= 0 => {
                d.offset().store(o as u64, Relaxed);
                Ok(o)
            }
            (libc::SEEK_CUR, 0) => Ok(d.offset().load(Relaxed) as i64),
            _ => Err(Error::new(libc::EINVAL, "")),
        };
    }
    let size = e.file.len()? as i64;
    let cur = d.offset().load(Relaxed) as i64;
    let new = match whence {
        libc::SEEK_SET => offset,
        libc::SEEK_CUR => cur
            .checked_add(offset)
            .ok_or_else(|| Error::new(libc::EOVERFLOW, ""))?,
        libc::SEEK_END => size
            .checked_add(offset)
            .ok_or_else(|| Error::new(libc::EOVERFLOW, ""))?,
        // Holes are not tracked per byte: data runs to the end, the only hole is at the end.
        libc::SEEK_DATA if offset < size => offset,
        libc::SEEK_HOLE if offset < size => size,
        libc::SEEK_DATA | libc::SEEK_HOLE => return Err(Error::new(libc::ENXIO, "")),
        _ => return Err(Error::new(libc::EINVAL, "")),
    };
    if new < 0 {
        return Err(Error::new(libc::EINVAL, ""));
    }
    d.offset().store(new as u64, Relaxed);
    Ok(new)
}

macro_rules! lseek_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, offset: $off, whence: c_int) -> $off {
            match lookup(fd) {
                Some(e) => do_lseek(&e, offset as i64, whence).map(|v| v as $off).unwrap_or_else(|err| fail(&err) as $off),
                None => call_real!($name: fn(c_int, $off, c_int) -> $off, -1; fd, offset, whence),
            }
        }
    };
}
lseek_wrapper!(lseek, off_t);
lseek_wrapper!(lseek64, off64_t);

fn set_len(e: &Entry, len: i64) -> c_int {
    if len < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match e.description() {
        Some(d) if writable(d.flags()) => e
            .file
            .set_len(len as u64)
            .map(|_| 0)
            .unwrap_or_else(|err| fail(&err)),
        Some(_) => {
            set_errno(libc::EINVAL);
            -1
        }
        None => fail(&ebadf()),
    }
}

macro_rules! ftruncate_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, len: $off) -> c_int {
            match lookup(fd) {
                Some(e) => set_len(&e, len as i64),
                None => call_real!($name: fn(c_int, $off) -> c_int, -1; fd, len),
            }
        }
    };
}
ftruncate_wrapper!(ftruncate, off_t);
ftruncate_wrapper!(ftruncate64, off64_t);

macro_rules! truncate_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI: `path` is a NUL-terminated string.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, len: $off) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(_) if len < 0 => {
                    set_errno(libc::EINVAL);
                    -1
                }
                Some(p) => store()
                    .and_then(|s| s.truncate(&p, len as u64))
                    .map(|_| 0)
                    .unwrap_or_else(|e| fail(&e)),
                None => call_real!($name: fn(*const c_char, $off) -> c_int, -1; path, len),
            }
        }
    };
}
truncate_wrapper!(truncate, off_t);
truncate_wrapper!(truncate64, off64_t);

macro_rules! sync_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int) -> c_int {
            match lookup(fd) {
                Some(e) => e.file.sync().map(|_| 0).unwrap_or_else(|err| fail(&err)),
                None => call_real!($name: fn(c_int) -> c_int, -1; fd),
            }
        }
    };
}
sync_wrapper!(fsync);
sync_wrapper!(fdatasync);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "sync_file_range"))]
#[boundary]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    offset: off64_t,
    nbytes: off64_t,
    flags: c_uint,
) -> c_int {
    match lookup(fd) {
        Some(e) => e.file.sync().map(|_| 0).unwrap_or_else(|err| fail(&err)),
        None => {
            call_real!(sync_file_range: fn(c_int, off64_t, off64_t, c_uint) -> c_int, -1; fd, offset, nbytes, flags)
        }
    }
}

/// Reserving space: extending the file size is what callers observe (mode 0); the store
/// allocates chunks on write, so nothing else is needed. KEEP_SIZE and hole punching are
/// not offered (EOPNOTSUPP, as on file systems without them).
fn allocate(e: &Entry, mode: c_int, offset: i64, len: i64) -> Result<(), Error> {
    if offset < 0 || len <= 0 {
        return Err(Error::new(libc::EINVAL, ""));
    }
    if mode != 0 {
        return Err(Error::new(libc::EOPNOTSUPP, ""));
    }
    let d = e.description().ok_or_else(ebadf)?;
    if !writable(d.flags()) {
        return Err(ebadf());
    }
    let end = (offset as u64).saturating_add(len as u64);
    if end > e.file.len()? {
        e.file.set_len(end)?;
    }
    Ok(())
}

macro_rules! fallocate_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, mode: c_int, offset: $off, len: $off) -> c_int {
            match lookup(fd) {
                Some(e) => allocate(&e, mode, offset as i64, len as i64).map(|_| 0).unwrap_or_else(|err| fail(&err)),
                None => call_real!($name: fn(c_int, c_int, $off, $off) -> c_int, -1; fd, mode, offset, len),
            }
        }
    };
}
fallocate_wrapper!(fallocate, off_t);
fallocate_wrapper!(fallocate64, off64_t);

macro_rules! posix_fallocate_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI. Returns an error number instead of setting errno, like posix_fallocate.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::EIO)]
        pub unsafe extern "C" fn $name(fd: c_int, offset: $off, len: $off) -> c_int {
            match lookup(fd) {
                Some(e) => allocate(&e, 0, offset as i64, len as i64).map(|_| 0).unwrap_or_else(|err| err.errno()),
                None => call_real!($name: fn(c_int, $off, $off) -> c_int, libc::ENOSYS; fd, offset, len),
            }
        }
    };
}
posix_fallocate_wrapper!(posix_fallocate, off_t);
posix_fallocate_wrapper!(posix_fallocate64, off64_t);

macro_rules! fadvise_wrapper {
    ($name:ident, $off:ty) => {
        /// Advice is accepted and ignored for Cascade files (their data is in memory already).
        ///
        /// # Safety
        /// C ABI. Returns an error number, like posix_fadvise.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::EIO)]
        pub unsafe extern "C" fn $name(fd: c_int, offset: $off, len: $off, advice: c_int) -> c_int {
            if is_cascade_fd(fd) {
                0
            } else {
                call_real!($name: fn(c_int, $off, $off, c_int) -> c_int, libc::ENOSYS; fd, offset, len, advice)
            }
        }
    };
}
fadvise_wrapper!(posix_fadvise, off_t);
fadvise_wrapper!(posix_fadvise64, off64_t);
