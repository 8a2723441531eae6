//! The C ABI of the Cascade node store (`include/cascade.h` at the repository root).
//!
//! Built as `libcascade.so` and `libcascade.a`. Every exported function:
//! - checks its pointer arguments for NULL (EINVAL),
//! - never lets a Rust panic unwind into C (it is caught and reported as EIO),
//! - on failure returns NULL / -1, sets `errno` and records a one-line message that
//!   [`cascade_strerror_last`] returns (per thread).
//!
//! `unsafe` appears only where C hands us raw pointers; each block says why it is sound.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cascade_store::{default_store_name, ChunkLocation, Error, OpenOptions, Store};

/// `cascade_chunk_meta.location` of a chunk held in the shared-memory data region.
pub const CASCADE_CHUNK_MEMORY: u32 = 0;
/// `cascade_chunk_meta.location` of a chunk held in the spill file.
pub const CASCADE_CHUNK_SPILL: u32 = 1;

/// An attached store (`cascade_store` in C; opaque there).
pub struct CascadeStore {
    store: Store,
    /// Kept here so `cascade_spill_path` can hand out a pointer that lives as long as the handle.
    spill_path: Option<CString>,
}

/// One chunk of a file (`cascade_chunk_meta` in C). The layout is fixed: keep it in step with
/// include/cascade.h (a unit test checks sizes and offsets).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CascadeChunkMeta {
    /// Logical chunk number within the file (file offset / chunk size).
    pub index: u64,
    /// File offset of the chunk's first byte (index * chunk size).
    pub file_offset: u64,
    /// Physical chunk id in the store.
    pub chunk_id: u32,
    /// CASCADE_CHUNK_MEMORY or CASCADE_CHUNK_SPILL.
    pub location: u32,
    /// Memory chunks: the chunk's address in this process. Spilled chunks: NULL.
    pub addr: *mut c_void,
    /// Spilled chunks: byte offset in the spill file. Memory chunks: 0.
    pub spill_offset: u64,
    /// Bytes of file data in this chunk (the chunk size, less at end of file).
    pub length: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Records a failure: the message for `cascade_strerror_last`, then errno (last, so nothing
/// done while recording the message can clobber it).
fn record_failure(errno: c_int, message: String) {
    // A message with an interior NUL cannot happen for our texts, but never fail here.
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = text;
        }
    });
    set_errno(errno);
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.as_str()
    } else {
        "unknown panic"
    }
}

/// Runs `f`, turning an error or a panic into `on_error` plus errno and the last-error message.
fn guarded<T>(function: &str, on_error: T, f: impl FnOnce() -> Result<T, Error>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            record_failure(err.errno(), format!("{function}: {err}"));
            on_error
        }
        Err(payload) => {
            let text = panic_text(payload.as_ref()).to_string();
            record_failure(
                libc::EIO,
                format!("{function}: internal error (Rust panic): {text}"),
            );
            on_error
        }
    }
}

fn einval(what: &str) -> Error {
    Error::new(libc::EINVAL, what)
}

/// Borrows the store behind a handle, failing with EINVAL on NULL.
///
/// # Safety
/// `handle` must be NULL or a pointer returned by `cascade_attach` that has not been detached.
unsafe fn handle_ref<'a>(handle: *const CascadeStore) -> Result<&'a CascadeStore, Error> {
    // SAFETY: the caller guarantees a non-NULL handle is live (see the function's contract).
    unsafe { handle.as_ref() }.ok_or_else(|| einval("store handle is NULL"))
}

/// Reads a C string argument as UTF-8, failing with EINVAL on NULL or invalid UTF-8.
///
/// # Safety
/// `s` must be NULL or point to a NUL-terminated string that stays valid during the call.
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, Error> {
    if s.is_null() {
        return Err(einval(&format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let cstr = unsafe { CStr::from_ptr(s) };
    cstr.to_str()
        .map_err(|_| einval(&format!("{what} is not valid UTF-8")))
}

/// Attaches the store `name` (NULL: the default store of this user, "/cascade-<uid>").
/// Returns NULL and sets errno on failure.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cascade_attach(name: *const c_char) -> *mut CascadeStore {
    guarded("cascade_attach", std::ptr::null_mut(), || {
        let name = if name.is_null() {
            default_store_name()
        } else {
            // SAFETY: non-NULL and NUL-terminated by this function's contract.
            unsafe { str_arg(name, "store name") }?.to_string()
        };
        let store = Store::attach(&name)?;
        let spill_path = store
            .spill_path()
            .map(|p| CString::new(p.as_os_str().as_bytes()))
            .transpose()
            .map_err(|_| Error::new(libc::EINVAL, "spill path contains a NUL byte"))?;
        Ok(Box::into_raw(Box::new(CascadeStore { store, spill_path })))
    })
}

/// Detaches and frees a handle. NULL is ignored.
///
/// # Safety
/// `handle` must be NULL or a live handle from `cascade_attach`, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn cascade_detach(handle: *mut CascadeStore) {
    guarded("cascade_detach", (), || {
        if !handle.is_null() {
            // SAFETY: the handle came from Box::into_raw in cascade_attach and the caller
            // gives up its ownership here.
            drop(unsafe { Box::from_raw(handle) });
        }
        Ok(())
    })
}

/// The shared-memory data region as mapped in this process (the paper's get_data_region).
///
/// # Safety
/// `handle` must be a live handle; `addr` and `len` must be NULL or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn cascade_get_data_region(
    handle: *const CascadeStore,
    addr: *mut *mut c_void,
    len: *mut usize,
) -> c_int {
    guarded("cascade_get_data_region", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        if addr.is_null() || len.is_null() {
            return Err(einval("addr and len must not be NULL"));
        }
        let region = h.store.data_region();
        // SAFETY: both pointers are non-NULL and valid for writes by the caller's contract.
        unsafe {
            *addr = region.addr.cast::<c_void>();
            *len = region.len;
        }
        Ok(0)
    })
}

fn chunk_metas(h: &CascadeStore, path: &str) -> Result<Vec<CascadeChunkMeta>, Error> {
    let region = h.store.data_region();
    let chunk_size = h.store.chunk_size();
    let chunks = h.store.chunk_list(path)?;
    chunks
        .iter()
        .map(|c| {
            let (location, addr, spill_offset) = match c.location {
                ChunkLocation::Memory { offset } => {
                    let end = offset.checked_add(c.length);
                    let inside = end.is_some_and(|end| end <= region.len as u64);
                    if !inside {
                        return Err(Error::new(
                            libc::EIO,
                            format!(
                                "{path}: chunk {} at offset {offset} lies outside the data region",
                                c.index
                            ),
                        ));
                    }
                    // In bounds (checked above), so the address is inside the mapping.
                    let addr = region.addr.wrapping_add(offset as usize);
                    (CASCADE_CHUNK_MEMORY, addr.cast::<c_void>(), 0)
                }
                ChunkLocation::Spill { offset } => {
                    (CASCADE_CHUNK_SPILL, std::ptr::null_mut(), offset)
                }
            };
            let file_offset = c.index.checked_mul(chunk_size).ok_or_else(|| {
                Error::new(
                    libc::EIO,
                    format!("{path}: chunk index {} out of range", c.index),
                )
            })?;
            Ok(CascadeChunkMeta {
                index: c.index,
                file_offset,
                chunk_id: c.chunk_id,
                location,
                addr,
                spill_offset,
                length: c.length,
            })
        })
        .collect()
}

/// Lists the chunks of a file (the paper's get_chunk_meta_list). Fills up to `capacity`
/// entries of `out` and sets `*count` to the number of chunks. If `capacity` is too small it
/// writes nothing, sets `*count` to the number needed and fails with ERANGE.
///
/// # Safety
/// `handle` must be a live handle, `path` a NUL-terminated string, `out` valid for writing
/// `capacity` entries (it may be NULL when `capacity` is 0), `count` valid for writing.
#[no_mangle]
pub unsafe extern "C" fn cascade_get_chunk_meta_list(
    handle: *const CascadeStore,
    path: *const c_char,
    out: *mut CascadeChunkMeta,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    guarded("cascade_get_chunk_meta_list", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        if count.is_null() {
            return Err(einval("count must not be NULL"));
        }
        if out.is_null() && capacity != 0 {
            return Err(einval("out is NULL but capacity is not 0"));
        }
        let metas = chunk_metas(h, path)?;
        // SAFETY: count is non-NULL and valid for writes by the caller's contract.
        unsafe { *count = metas.len() };
        if metas.len() > capacity {
            return Err(Error::new(
                libc::ERANGE,
                format!(
                    "{path}: {} chunks do not fit in {capacity} entries",
                    metas.len()
                ),
            ));
        }
        if !metas.is_empty() {
            // SAFETY: out is non-NULL (capacity >= metas.len() > 0) and valid for writing
            // `capacity` entries; MaybeUninit makes no claim about their current contents.
            let slots = unsafe {
                std::slice::from_raw_parts_mut(
                    out.cast::<MaybeUninit<CascadeChunkMeta>>(),
                    capacity,
                )
            };
            for (slot, meta) in slots.iter_mut().zip(metas) {
                slot.write(meta);
            }
        }
        Ok(0)
    })
}

/// The spill file's path, or NULL (errno ENOENT) if the store has none. The string belongs to
/// the handle and stays valid until `cascade_detach`.
///
/// # Safety
/// `handle` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn cascade_spill_path(handle: *const CascadeStore) -> *const c_char {
    guarded("cascade_spill_path", std::ptr::null(), || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        match &h.spill_path {
            Some(p) => Ok(p.as_ptr()),
            None => Err(Error::new(libc::ENOENT, "the store has no spill file")),
        }
    })
}

/// Creates (or truncates) the file `path` and writes `len` bytes of `buf` at offset 0.
///
/// # Safety
/// `handle` must be a live handle, `path` a NUL-terminated string, `buf` valid for reading
/// `len` bytes (it may be NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn cascade_write_file(
    handle: *const CascadeStore,
    path: *const c_char,
    buf: *const c_void,
    len: usize,
) -> c_int {
    guarded("cascade_write_file", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        let data: &[u8] = if len == 0 {
            &[]
        } else if buf.is_null() {
            return Err(einval("buf is NULL but len is not 0"));
        } else {
            // SAFETY: buf is non-NULL and valid for reading len bytes by the caller's contract.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
        };
        let opts = OpenOptions::new()
            .read(false)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644);
        let file = h.store.open(path, &opts)?;
        file.write_all_at(data, 0)?;
        Ok(0)
    })
}

/// Reads up to `len` bytes of `path` at `offset` into `buf`. Returns the number of bytes read
/// (less than `len` only at end of file, 0 at or past it), or -1.
///
/// # Safety
/// `handle` must be a live handle, `path` a NUL-terminated string, `buf` valid for writing
/// `len` bytes (it may be NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn cascade_read_file(
    handle: *const CascadeStore,
    path: *const c_char,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> libc::ssize_t {
    guarded("cascade_read_file", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        if len > isize::MAX as usize {
            return Err(einval("len is larger than SSIZE_MAX"));
        }
        let out: &mut [u8] = if len == 0 {
            &mut []
        } else if buf.is_null() {
            return Err(einval("buf is NULL but len is not 0"));
        } else {
            // SAFETY: buf is non-NULL and valid for writing len bytes by the caller's
            // contract; zeroing first means we never expose uninitialised memory as &mut [u8].
            unsafe {
                std::ptr::write_bytes(buf.cast::<u8>(), 0, len);
                std::slice::from_raw_parts_mut(buf.cast::<u8>(), len)
            }
        };
        let file = h.store.open(path, &OpenOptions::new())?;
        let mut done = 0usize;
        while done < out.len() {
            let n = file.read_at(&mut out[done..], offset.saturating_add(done as u64))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done as libc::ssize_t)
    })
}

/// Creates a directory (its parent must exist).
///
/// # Safety
/// `handle` must be a live handle and `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cascade_mkdir(
    handle: *const CascadeStore,
    path: *const c_char,
    mode: u32,
) -> c_int {
    guarded("cascade_mkdir", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        h.store.mkdir(path, mode)?;
        Ok(0)
    })
}

/// Removes a file and frees its chunks.
///
/// # Safety
/// `handle` must be a live handle and `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cascade_unlink(handle: *const CascadeStore, path: *const c_char) -> c_int {
    guarded("cascade_unlink", -1, || {
        // SAFETY: the caller passes a live handle or NULL (checked).
        let h = unsafe { handle_ref(handle) }?;
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        h.store.unlink(path)?;
        Ok(0)
    })
}

/// Commits the checkpoint at `path`, an application path (under the mount prefix, or
/// relative to the current directory, the virtual one included), in the process's own store
/// (the one the interposition uses): from now on the node agent drains it and retention
/// counts it.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cascade_commit(path: *const c_char) -> c_int {
    guarded("cascade_commit", -1, || {
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let path = unsafe { str_arg(path, "path") }?;
        let store_path = crate::interpose::app_store_path(path)?;
        let store = crate::interpose::store()?;
        match store.commit(&store_path, false) {
            Ok(_) => Ok(0),
            Err(e) => {
                // The store's reasons name store paths; the caller knows application paths.
                let context = e.context();
                let message = if context.is_empty() || context == store_path {
                    path.to_string()
                } else if context.starts_with('/') {
                    application_paths(context)
                } else {
                    format!("{path}: {}", application_paths(context))
                };
                Err(Error::new(e.errno(), message))
            }
        }
    })
}

/// A store message with every word that is a store path ("/ckpt.1/a.dat") turned into the
/// application's path under the mount prefix ("/cascade/ckpt.1/a.dat").
fn application_paths(message: &str) -> String {
    let mount = crate::interpose::mount();
    message
        .split(' ')
        .map(|word| match word.strip_prefix('/') {
            Some(rest) if !rest.starts_with('/') => format!("{mount}/{rest}"),
            _ => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

static EMPTY: &CStr = c"";

/// The message of the last failed cascade_* call on this thread ("" if none). Valid until the
/// next failing cascade_* call on this thread.
#[no_mangle]
pub extern "C" fn cascade_strerror_last() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| match slot.try_borrow() {
                // The CString's heap buffer does not move until the slot is overwritten by
                // the next failure on this thread, which is what the header promises.
                Ok(s) => s.as_ptr(),
                Err(_) => EMPTY.as_ptr(),
            })
            .unwrap_or(EMPTY.as_ptr())
    })
    .unwrap_or(EMPTY.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn chunk_meta_layout_matches_header() {
        // include/cascade.h declares the same fields in the same order.
        assert_eq!(offset_of!(CascadeChunkMeta, index), 0);
        assert_eq!(offset_of!(CascadeChunkMeta, file_offset), 8);
        assert_eq!(offset_of!(CascadeChunkMeta, chunk_id), 16);
        assert_eq!(offset_of!(CascadeChunkMeta, location), 20);
        assert_eq!(offset_of!(CascadeChunkMeta, addr), 24);
        assert_eq!(offset_of!(CascadeChunkMeta, spill_offset), 32);
        assert_eq!(offset_of!(CascadeChunkMeta, length), 40);
        assert_eq!(size_of::<CascadeChunkMeta>(), 48);
    }

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    fn last_message() -> String {
        // SAFETY: cascade_strerror_last always returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(cascade_strerror_last()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn null_arguments_fail_with_einval_and_a_message() {
        let mut n = 0usize;
        // SAFETY: NULL handles are allowed (and rejected); the other pointers are valid.
        let rc = unsafe {
            cascade_get_chunk_meta_list(
                std::ptr::null(),
                c"/x".as_ptr(),
                std::ptr::null_mut(),
                0,
                &mut n,
            )
        };
        assert_eq!(rc, -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!(
            last_message().contains("handle is NULL"),
            "{}",
            last_message()
        );

        // SAFETY: as above.
        let rc =
            unsafe { cascade_write_file(std::ptr::null(), std::ptr::null(), std::ptr::null(), 0) };
        assert_eq!(rc, -1);
        assert_eq!(errno(), libc::EINVAL);

        // SAFETY: as above.
        let p = unsafe { cascade_spill_path(std::ptr::null()) };
        assert!(p.is_null());
        assert_eq!(errno(), libc::EINVAL);

        // SAFETY: detaching NULL is a documented no-op.
        unsafe { cascade_detach(std::ptr::null_mut()) };
    }

    #[test]
    fn attach_to_a_missing_store_is_enoent() {
        let name = CString::new(format!("/cascade-capi-missing-{}", std::process::id())).unwrap();
        // SAFETY: a valid NUL-terminated name.
        let h = unsafe { cascade_attach(name.as_ptr()) };
        assert!(h.is_null());
        assert_eq!(errno(), libc::ENOENT);
        assert!(
            last_message().starts_with("cascade_attach: "),
            "{}",
            last_message()
        );
    }

    #[test]
    fn invalid_utf8_path_is_einval() {
        let bad = [0xffu8, 0xfe, 0];
        // SAFETY: a NUL-terminated byte string.
        let r = unsafe { str_arg(bad.as_ptr().cast(), "path") };
        assert_eq!(r.unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn panics_are_caught_and_reported_as_eio() {
        let v = guarded("probe", 7, || -> Result<i32, Error> { panic!("boom") });
        assert_eq!(v, 7);
        assert_eq!(errno(), libc::EIO);
        assert!(last_message().contains("boom"), "{}", last_message());
    }

    #[test]
    fn commit_messages_name_application_paths() {
        let m = crate::interpose::mount();
        assert_eq!(
            application_paths("/ckpt.1/a.dat is inside the committed checkpoint /ckpt.1; commit that one instead"),
            format!("{m}/ckpt.1/a.dat is inside the committed checkpoint {m}/ckpt.1; commit that one instead")
        );
        assert_eq!(application_paths("no paths here"), "no paths here");
    }

    #[test]
    fn commit_of_null_or_outside_the_mount_is_einval() {
        // SAFETY: NULL is allowed (and rejected).
        assert_eq!(unsafe { cascade_commit(std::ptr::null()) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { cascade_commit(c"/proc/self".as_ptr()) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!(
            last_message()
                .starts_with("cascade_commit: /proc/self is not under the Cascade mount prefix"),
            "{}",
            last_message()
        );
    }

    #[test]
    fn last_error_is_per_thread() {
        record_failure(libc::ENOENT, "main thread failure".into());
        let other = std::thread::spawn(last_message).join().unwrap();
        assert_eq!(other, "");
        assert_eq!(last_message(), "main thread failure");
    }
}
