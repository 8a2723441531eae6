//! mmap of Cascade files (each chunk mapped from the store's shared-memory object or spill
//! file), the copy calls (sendfile, copy_file_range, splice) and extended attributes.

use super::*;
use cascade_store::MapSource;
use libc::{c_int, c_void, loff_t, off64_t, off_t, size_t, ssize_t};
use std::ffi::c_char;
use std::sync::atomic::{
    AtomicU32, AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Release,
};

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

/// Most mappings of Cascade files one process holds at once.
const MAX_PINS: usize = 4096;

/// A mapping of a Cascade file in this process and what pins its data: a description
/// ([`Store::pin_mapping`]) and one page of that description's memfd, mapped so that a
/// sweep (/proc/*/maps) sees the pin alive as long as this process (or a child it forked)
/// exists. Lock-free (claimed by compare-and-swap on `state`), so that the fork child
/// handler and munmap never wait for a lock another thread held.
struct PinSlot {
    /// FREE, BUSY (being filled or emptied by one thread) or LIVE.
    state: AtomicU32,
    base: AtomicUsize,
    len: AtomicUsize,
    page: AtomicUsize,
    desc_slot: AtomicU32,
    desc_nonce: AtomicU64,
}

const FREE: u32 = 0;
const BUSY: u32 = 1;
const LIVE: u32 = 2;

impl PinSlot {
    const fn new() -> PinSlot {
        PinSlot {
            state: AtomicU32::new(FREE),
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            page: AtomicUsize::new(0),
            desc_slot: AtomicU32::new(0),
            desc_nonce: AtomicU64::new(0),
        }
    }

    fn desc(&self) -> OpenDescription {
        OpenDescription {
            slot: self.desc_slot.load(Relaxed),
            nonce: self.desc_nonce.load(Relaxed),
        }
    }
}

static PINS: [PinSlot; MAX_PINS] = [const { PinSlot::new() }; MAX_PINS];
/// LIVE slots: munmap looks at the table only when some exist.
static LIVE_PINS: AtomicUsize = AtomicUsize::new(0);

/// Pins the data of `e`'s file for the mapping at `base` (`len` bytes).
fn pin(e: &Entry, base: *mut c_void, len: u64) -> Result<(), Error> {
    let Some(slot) = PINS.iter().find(|p| {
        p.state
            .compare_exchange(FREE, BUSY, AcqRel, Relaxed)
            .is_ok()
    }) else {
        return Err(Error::new(
            libc::ENOMEM,
            format!("more than {MAX_PINS} mappings of Cascade files in one process"),
        ));
    };
    let pinned = pin_page(e);
    match pinned {
        Ok((desc, page)) => {
            slot.base.store(base as usize, Relaxed);
            slot.len.store(len as usize, Relaxed);
            slot.page.store(page, Relaxed);
            slot.desc_slot.store(desc.slot, Relaxed);
            slot.desc_nonce.store(desc.nonce, Relaxed);
            LIVE_PINS.fetch_add(1, AcqRel);
            slot.state.store(LIVE, Release);
            Ok(())
        }
        Err(err) => {
            slot.state.store(FREE, Release);
            Err(err)
        }
    }
}

/// The pin description of `e`'s file and the address of its memfd page.
fn pin_page(e: &Entry) -> Result<(OpenDescription, usize), Error> {
    let store = store()?;
    let desc = store.pin_mapping(&e.file)?;
    let page = page_size() as usize;
    let name = desc.memfd_name();
    // SAFETY: `name` is a valid C string.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: sizing the memfd we just made (a negative fd fails with EBADF).
    let sized = fd >= 0 && unsafe { libc::ftruncate(fd, page as off_t) } == 0;
    let at = if sized {
        call_real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void, libc::MAP_FAILED;
            std::ptr::null_mut(), page, libc::PROT_NONE, libc::MAP_SHARED, fd, 0)
    } else {
        libc::MAP_FAILED
    };
    let err = Error::last_os("pinning a mapping");
    if fd >= 0 {
        // SAFETY: the memfd is ours; its page mapping keeps it referenced.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
    if at == libc::MAP_FAILED {
        store.release_description(desc);
        return Err(err);
    }
    Ok((desc, at as usize))
}

/// Releases the pins of the mappings wholly inside `[addr, addr + len)` (just unmapped);
/// every pin with `all` (a normal exit).
pub(crate) fn unpin_range(addr: usize, len: usize, all: bool) {
    if LIVE_PINS.load(Acquire) == 0 {
        return;
    }
    // The kernel unmaps whole pages, and a pin records its mapping's length in whole pages:
    // a caller passes the length it mapped, a file's size.
    let page = page_size() as usize;
    let end = addr.saturating_add(len.div_ceil(page).saturating_mul(page));
    let Ok(store) = store() else {
        return;
    };
    for p in &PINS {
        if p.state.load(Acquire) != LIVE {
            continue;
        }
        let (base, plen) = (p.base.load(Relaxed), p.len.load(Relaxed));
        let inside = all || (base >= addr && base.saturating_add(plen) <= end);
        if !inside
            || p.state
                .compare_exchange(LIVE, BUSY, AcqRel, Relaxed)
                .is_err()
        {
            continue;
        }
        call_real!(munmap: fn(*mut c_void, size_t) -> c_int, -1; p.page.load(Relaxed) as *mut c_void, page_size() as size_t);
        store.release_description(p.desc());
        LIVE_PINS.fetch_sub(1, AcqRel);
        p.state.store(FREE, Release);
    }
}

/// After fork: the child maps what the parent mapped, so each pin has one more holder.
pub(crate) fn pins_after_fork() {
    if LIVE_PINS.load(Acquire) == 0 {
        return;
    }
    let Ok(store) = store() else {
        return;
    };
    for p in PINS.iter().filter(|p| p.state.load(Acquire) == LIVE) {
        if let Some(d) = store.description(p.desc()) {
            d.add_ref();
        }
    }
}

fn map_store(
    e: &Entry,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: i64,
) -> Result<*mut c_void, Error> {
    let page = page_size();
    if len == 0 || off < 0 || off as u64 % page != 0 {
        return Err(Error::new(libc::EINVAL, ""));
    }
    let d = e.description().ok_or_else(|| Error::new(libc::EBADF, ""))?;
    let acc = d.flags() & libc::O_ACCMODE;
    let shared = flags & libc::MAP_SHARED != 0;
    if acc == libc::O_WRONLY || (shared && prot & libc::PROT_WRITE != 0 && acc != libc::O_RDWR) {
        return Err(Error::new(libc::EACCES, ""));
    }
    let len = (len as u64).div_ceil(page) * page;
    let writable_shared = shared && prot & libc::PROT_WRITE != 0;
    let sources = e.file.map_sources(off as u64, len, writable_shared)?;
    let (shm_fd, spill_fd) = store()?.map_fds()?;
    // Reserve the whole range, then map each piece over it.
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE);
    let base = call_real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void, libc::MAP_FAILED;
        addr, len as size_t, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed, -1, 0);
    if base == libc::MAP_FAILED {
        return Err(Error::last_os("mmap"));
    }
    let kind = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    let mut at = 0u64;
    for s in sources {
        // SAFETY: `at` stays within the reserved range of `len` bytes.
        let target = unsafe { (base as *mut u8).add(at as usize) } as *mut c_void;
        let (fd, file_off, n, flags) = match s {
            MapSource::Shm { offset, len } => (shm_fd, offset, len, kind),
            MapSource::Spill { offset, len } => (spill_fd.unwrap_or(-1), offset, len, kind),
            MapSource::Zeros { len } => (-1, 0, len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS),
        };
        let n = n.min(len - at);
        let got = call_real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void, libc::MAP_FAILED;
            target, n as size_t, prot, flags | libc::MAP_FIXED, fd, file_off as off_t);
        if got == libc::MAP_FAILED {
            let err = Error::last_os("mmap of a chunk");
            // SAFETY: unmapping the range we reserved.
            unsafe { libc::munmap(base, len as size_t) };
            return Err(err);
        }
        at += n;
    }
    if let Err(err) = pin(e, base, len) {
        // SAFETY: unmapping the range we just mapped.
        unsafe { libc::munmap(base, len as size_t) };
        return Err(err);
    }
    Ok(base)
}

macro_rules! mmap_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::MAP_FAILED)]
        pub unsafe extern "C" fn $name(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: $off) -> *mut c_void {
            match lookup(fd) {
                Some(_) if flags & libc::MAP_ANONYMOUS != 0 => {
                    call_real!($name: fn(*mut c_void, size_t, c_int, c_int, c_int, $off) -> *mut c_void, libc::MAP_FAILED; addr, len, prot, flags, fd, off)
                }
                Some(e) => map_store(&e, addr, len, prot, flags, off as i64).unwrap_or_else(|err| {
                    set_errno(err.errno());
                    libc::MAP_FAILED
                }),
                None => call_real!($name: fn(*mut c_void, size_t, c_int, c_int, c_int, $off) -> *mut c_void, libc::MAP_FAILED; addr, len, prot, flags, fd, off),
            }
        }
    };
}
mmap_wrapper!(mmap, off_t);
mmap_wrapper!(mmap64, off64_t);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "munmap"))]
#[boundary]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let rc = call_real!(munmap: fn(*mut c_void, size_t) -> c_int, -1; addr, len);
    if rc == 0 {
        unpin_range(addr as usize, len, false);
    }
    rc
}

// ---- copies -------------------------------------------------------------------------------

/// sendfile with a Cascade end: read and write through the wrappers, 1 MiB at a time.
fn sendfile_emulated(out_fd: c_int, in_fd: c_int, offset: *mut off64_t, count: size_t) -> ssize_t {
    let mut buf = vec![0u8; count.min(1 << 20)];
    let mut done = 0usize;
    let mut pos = if offset.is_null() {
        None
    } else {
        // SAFETY: `offset` is not null, so it points at the caller's offset.
        Some(unsafe { *offset })
    };
    while done < count {
        let want = (count - done).min(buf.len());
        // SAFETY: buf holds `want` bytes; fds are the caller's.
        let got = unsafe {
            match pos {
                Some(p) => sysio::pread64(in_fd, buf.as_mut_ptr() as *mut c_void, want, p),
                None => sysio::read(in_fd, buf.as_mut_ptr() as *mut c_void, want),
            }
        };
        if got < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        if got == 0 {
            break;
        }
        let mut put = 0usize;
        while put < got as usize {
            // SAFETY: writing bytes we just read.
            let w = unsafe {
                sysio::write(
                    out_fd,
                    buf[put..].as_ptr() as *const c_void,
                    got as usize - put,
                )
            };
            if w <= 0 {
                return if done + put > 0 {
                    (done + put) as ssize_t
                } else {
                    -1
                };
            }
            put += w as usize;
        }
        done += got as usize;
        if let Some(p) = pos.as_mut() {
            *p += got as off64_t;
        }
    }
    if let Some(p) = pos {
        // SAFETY: as above.
        unsafe { *offset = p };
    }
    done as ssize_t
}

macro_rules! sendfile_wrapper {
    ($name:ident, $off:ty) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(out_fd: c_int, in_fd: c_int, offset: *mut $off, count: size_t) -> ssize_t {
            if is_cascade_fd(out_fd) || is_cascade_fd(in_fd) {
                sendfile_emulated(out_fd, in_fd, offset as *mut off64_t, count)
            } else {
                call_real!($name: fn(c_int, c_int, *mut $off, size_t) -> ssize_t, -1; out_fd, in_fd, offset, count)
            }
        }
    };
}
sendfile_wrapper!(sendfile, off_t);
sendfile_wrapper!(sendfile64, off64_t);

/// # Safety
/// C ABI. With a Cascade end it fails with EXDEV, which makes cp, Python's shutil and
/// others fall back to read/write.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "copy_file_range"))]
#[boundary]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    if is_cascade_fd(fd_in) || is_cascade_fd(fd_out) {
        set_errno(libc::EXDEV);
        return -1;
    }
    call_real!(copy_file_range: fn(c_int, *mut loff_t, c_int, *mut loff_t, size_t, libc::c_uint) -> ssize_t, -1; fd_in, off_in, fd_out, off_out, len, flags)
}

/// # Safety
/// C ABI. A Cascade end is not a pipe-able kernel file: EINVAL, the documented "not
/// supported for this file" answer.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "splice"))]
#[boundary]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    if is_cascade_fd(fd_in) || is_cascade_fd(fd_out) {
        set_errno(libc::EINVAL);
        return -1;
    }
    call_real!(splice: fn(c_int, *mut loff_t, c_int, *mut loff_t, size_t, libc::c_uint) -> ssize_t, -1; fd_in, off_in, fd_out, off_out, len, flags)
}

// ---- extended attributes: none are stored (ENOTSUP, which ls and cp treat as "none") ----

fn no_xattr() -> ssize_t {
    set_errno(libc::ENOTSUP);
    -1
}

macro_rules! xattr_path_wrapper {
    ($name:ident, ($($arg:ident : $t:ty),*)) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, $($arg: $t),*) -> ssize_t {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(p) => match store().and_then(|s| s.stat(&p)) {
                    Ok(_) => no_xattr(),
                    Err(e) => fail_ssize(&e),
                },
                None => call_real!($name: fn(*const c_char $(, $t)*) -> ssize_t, -1; path $(, $arg)*),
            }
        }
    };
}
xattr_path_wrapper!(getxattr, (name: *const c_char, value: *mut c_void, size: size_t));
xattr_path_wrapper!(lgetxattr, (name: *const c_char, value: *mut c_void, size: size_t));
xattr_path_wrapper!(listxattr, (list: *mut c_char, size: size_t));
xattr_path_wrapper!(llistxattr, (list: *mut c_char, size: size_t));

macro_rules! xattr_fd_wrapper {
    ($name:ident, ($($arg:ident : $t:ty),*)) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(fd: c_int, $($arg: $t),*) -> ssize_t {
            if is_cascade_fd(fd) {
                no_xattr()
            } else {
                call_real!($name: fn(c_int $(, $t)*) -> ssize_t, -1; fd $(, $arg)*)
            }
        }
    };
}
xattr_fd_wrapper!(fgetxattr, (name: *const c_char, value: *mut c_void, size: size_t));
xattr_fd_wrapper!(flistxattr, (list: *mut c_char, size: size_t));

macro_rules! setxattr_path_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, name: *const c_char, value: *const c_void, size: size_t, flags: c_int) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(_) => no_xattr() as c_int,
                None => call_real!($name: fn(*const c_char, *const c_char, *const c_void, size_t, c_int) -> c_int, -1; path, name, value, size, flags),
            }
        }
    };
}
setxattr_path_wrapper!(setxattr);
setxattr_path_wrapper!(lsetxattr);

macro_rules! removexattr_path_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, name: *const c_char) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(path) } {
                Some(_) => no_xattr() as c_int,
                None => call_real!($name: fn(*const c_char, *const c_char) -> c_int, -1; path, name),
            }
        }
    };
}
removexattr_path_wrapper!(removexattr);
removexattr_path_wrapper!(lremovexattr);

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fremovexattr"))]
#[boundary]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    if is_cascade_fd(fd) {
        return no_xattr() as c_int;
    }
    call_real!(fremovexattr: fn(c_int, *const c_char) -> c_int, -1; fd, name)
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "fsetxattr"))]
#[boundary]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    if is_cascade_fd(fd) {
        return no_xattr() as c_int;
    }
    call_real!(fsetxattr: fn(c_int, *const c_char, *const c_void, size_t, c_int) -> c_int, -1; fd, name, value, size, flags)
}
