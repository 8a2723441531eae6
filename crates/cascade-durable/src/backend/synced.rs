//! A directory store whose writes are durable when they return.
//!
//! object_store's `LocalFileSystem` writes an object to a staging file `<name>#<n>` and
//! renames (or, for a conditional put, hard-links) it into place, and never calls fsync: a
//! crash of the machine could lose an object that Cascade had already called durable (the
//! agent evicts, staging servers reclaim their arenas). [`SyncedDir`] delegates reads,
//! listings, deletes, copies and multipart uploads to it and, before a write returns, fsyncs
//! the object and every directory from its parent up to the store root (an entry created in
//! a new directory is durable only once that directory's own entry is; a directory whose
//! entry this store already synced is not synced again, [`DurableDirs`]), and after a delete
//! that removed something, the directory it was in. Writes the caller awaits in order
//! therefore reach the disk in that order: a completion marker written after its files is
//! never durable without them.
//!
//! A single put (packs, markers, checksums, data files up to one part) is written by this
//! module itself, to the same kind of staging file, whose data is synced *before* the rename
//! (or hard link): an object is never found partial under its name after a crash, even where
//! it replaced an older one. Objects of at least [`DIRECT_MIN`] bytes are written with
//! O_DIRECT (all but their last partial page, which goes through the page cache; not on
//! tmpfs, whose storage is the page cache): the page cache copy, its writeback and its
//! reclaim cost this 2-core VM about 0.35-0.45 s of kernel CPU per GB written, O_DIRECT
//! about 0.1 (docs/dedup.md, "What bounds the ingest on 2 cores").

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

use super::Trace;

/// `LocalFileSystem` with fsync of what it writes (see the module documentation).
pub(super) struct SyncedDir {
    inner: LocalFileSystem,
    trace: Arc<Trace>,
    direct: Arc<DirectWrites>,
    durable_dirs: Arc<DurableDirs>,
}

/// Directories of the store whose own entry, and every directory's above it up to the root,
/// this store has fsynced since they were last created: a write into one syncs only the
/// directory that holds the object, not the whole chain again (each fsync of a directory
/// flushes the disk's write cache: four of them per 4 MiB pack halved the disk store's
/// ingest). Directories are never removed by the store; one removed and created again by
/// someone else while the store is open would be missed, one the store creates again is
/// dropped from the set first.
#[derive(Debug, Default)]
struct DurableDirs(Mutex<HashSet<PathBuf>>);

impl DurableDirs {
    fn contains(&self, dir: &std::path::Path) -> bool {
        self.0.lock().is_ok_and(|dirs| dirs.contains(dir))
    }

    fn insert(&self, dirs: Vec<PathBuf>) {
        if let Ok(mut known) = self.0.lock() {
            known.extend(dirs);
        }
    }

    fn forget(&self, dir: &std::path::Path) {
        if let Ok(mut known) = self.0.lock() {
            known.remove(dir);
        }
    }
}

impl SyncedDir {
    pub(super) fn new(inner: LocalFileSystem, trace: Arc<Trace>) -> Self {
        SyncedDir {
            inner,
            trace,
            direct: Arc::default(),
            durable_dirs: Arc::default(),
        }
    }

    /// What to fsync for a write (`file`) or a delete (not `file`) of `location`.
    fn sync_job(&self, location: &Path, file: bool) -> Result<SyncJob> {
        Ok(SyncJob {
            path: self.inner.path_to_filesystem(location)?,
            rel: location.to_string(),
            file,
            durable_dirs: Arc::clone(&self.durable_dirs),
            trace: Arc::clone(&self.trace),
        })
    }
}

/// The fsyncs that make one write or delete durable, run on a blocking thread.
#[derive(Debug)]
struct SyncJob {
    /// The object's path in the file system.
    path: std::path::PathBuf,
    /// Its key, for the trace.
    rel: String,
    /// True after a write: fsync the file and the directories up to the root
    /// ([`DurableDirs`]). False after a delete: fsync the directory that held it.
    file: bool,
    trace: Arc<Trace>,
    durable_dirs: Arc<DurableDirs>,
}

impl SyncJob {
    async fn run(self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.run_blocking())
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })?
    }

    fn run_blocking(&self) -> Result<()> {
        if self.file {
            self.fsync("fsync", &self.path, &self.rel)?;
        }
        self.sync_dirs()
    }

    /// fsync of the directories that hold the object (see [`SyncJob::file`]): after a write,
    /// its parent, and above it every directory whose child on the way is not known durable
    /// ([`DurableDirs`]).
    fn sync_dirs(&self) -> Result<()> {
        // The directories from the object's parent up: as many as the key has components
        // (`a/b/c` is in `root/a/b`, whose entry is in `root/a`, whose entry is in the root).
        let depth = if self.file {
            self.rel.split('/').count()
        } else {
            1
        };
        let mut entry = self.path.as_path();
        let mut dir_rel = self.rel.as_str();
        let mut now_durable = Vec::new();
        for level in 0..depth {
            let Some(dir) = entry.parent() else { break };
            // `entry` is a directory whose own entry (in `dir`) is durable already.
            if level > 0 && self.durable_dirs.contains(entry) {
                break;
            }
            dir_rel = dir_rel.rsplit_once('/').map_or("", |(d, _)| d);
            self.fsync("fsync_dir", dir, dir_rel)?;
            if level > 0 {
                now_durable.push(entry.to_path_buf());
            }
            entry = dir;
        }
        if self.file {
            self.durable_dirs.insert(now_durable);
        }
        Ok(())
    }

    /// Creates the directories missing above the object, each recorded as `mkdir` in the
    /// trace and dropped from [`DurableDirs`] (so that the write syncs the chain above it).
    fn create_dirs(&self) -> Result<()> {
        let mut missing = Vec::new();
        let mut dir = self.path.parent();
        let mut dir_rel = self.rel.rsplit_once('/').map(|(d, _)| d);
        while let (Some(d), Some(rel)) = (dir, dir_rel) {
            if d.is_dir() {
                break;
            }
            missing.push((d, rel));
            dir = d.parent();
            dir_rel = rel.rsplit_once('/').map(|(up, _)| up);
        }
        for (d, rel) in missing.into_iter().rev() {
            match std::fs::create_dir(d) {
                Ok(()) => {}
                // Another writer made it meanwhile: its entry may not be durable yet either.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(store_error(e, "mkdir", d)),
            }
            self.durable_dirs.forget(d);
            self.trace.note("mkdir", rel);
        }
        Ok(())
    }

    /// fsync(2) of a file or directory (a directory opened read-only can be synced), then
    /// recorded in the trace as `op` of `rel`.
    fn fsync(&self, op: &'static str, path: &std::path::Path, rel: &str) -> Result<()> {
        let sync = || std::fs::File::open(path)?.sync_all();
        sync().map_err(|e| store_error(e, "fsync", path))?;
        self.trace.note(op, rel);
        Ok(())
    }

    /// Creates the first free `<path>#<n>` (and the missing directories above it).
    fn create_staging(&self) -> Result<(File, PathBuf)> {
        let mut n = 1u32;
        let mut created_dirs = false;
        loop {
            let mut staging = self.path.as_os_str().to_owned();
            staging.push(format!("#{n}"));
            let staging = PathBuf::from(staging);
            match File::options().write(true).create_new(true).open(&staging) {
                Ok(file) => return Ok((file, staging)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => n += 1,
                Err(e) if e.kind() == ErrorKind::NotFound && !created_dirs => {
                    self.create_dirs()?;
                    created_dirs = true;
                }
                Err(e) => return Err(store_error(e, "create", &staging)),
            }
        }
    }

    /// A single put: the payload into a new staging file `<name>#<n>` (the name
    /// `LocalFileSystem` uses, which its listings skip), its data synced, renamed into place,
    /// then the directories synced (see the module documentation). With `create` (a
    /// conditional put), hard-linked into place instead, failing with `AlreadyExists` if the
    /// name is taken.
    fn put_blocking(
        &self,
        payload: &PutPayload,
        create: bool,
        direct: &DirectWrites,
    ) -> Result<PutResult> {
        let (file, staging) = self.create_staging()?;
        let written = (|| -> Result<std::fs::Metadata> {
            direct
                .write(&file, payload)
                .map_err(|e| store_error(e, "write", &staging))?;
            file.sync_data()
                .map_err(|e| store_error(e, "fsync", &staging))?;
            let meta = file
                .metadata()
                .map_err(|e| store_error(e, "stat", &staging))?;
            drop(file);
            if !create {
                return std::fs::rename(&staging, &self.path)
                    .map(|()| meta)
                    .map_err(|e| store_error(e, "rename", &self.path));
            }
            let linked = std::fs::hard_link(&staging, &self.path);
            let _ = std::fs::remove_file(&staging);
            match linked {
                Ok(()) => Ok(meta),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    Err(object_store::Error::AlreadyExists {
                        path: self.path.display().to_string(),
                        source: Box::new(e),
                    })
                }
                Err(e) => Err(store_error(e, "link", &self.path)),
            }
        })();
        let meta = match written {
            Ok(meta) => meta,
            Err(e) => {
                // (Already gone after a conditional put's link.)
                let _ = std::fs::remove_file(&staging);
                return Err(e);
            }
        };
        // The object's bytes were synced before it took its name.
        self.trace.note("fsync", &self.rel);
        self.sync_dirs()?;
        Ok(PutResult {
            e_tag: Some(e_tag(&meta)),
            version: None,
        })
    }
}

/// An I/O error of the directory store, naming what failed.
fn store_error(e: std::io::Error, what: &str, path: &std::path::Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(std::io::Error::new(
            e.kind(),
            format!("{what} {}: {e}", path.display()),
        )),
    }
}

/// The e-tag `LocalFileSystem` gives an object: inode, mtime in µs and size, in hex.
fn e_tag(meta: &std::fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("{:x}-{mtime:x}-{:x}", meta.ino(), meta.len())
}

/// Objects at least this long are written with O_DIRECT; smaller ones (markers, checksums,
/// manifests) gain nothing from it.
const DIRECT_MIN: usize = 64 << 10;
/// Alignment of O_DIRECT writes (memory, file offset and length): the page size, a multiple
/// of every block device's logical block.
const DIRECT_ALIGN: usize = 4096;
/// Largest piece copied into an aligned buffer and written at once (a pack is 4 MiB and a
/// single put at most 8 MiB by default: one write each).
const BOUNCE_MAX: usize = 16 << 20;
/// Aligned buffers kept for reuse (fresh memory costs page faults on every write).
const SPARE_BOUNCES: usize = 4;

/// O_DIRECT writes of one store: whether its file system takes them, and aligned buffers.
#[derive(Debug, Default)]
struct DirectWrites {
    /// The file system refused O_DIRECT once (e.g. an older tmpfs): write through the page
    /// cache from then on.
    refused: AtomicBool,
    /// The store is in memory (tmpfs, ramfs): O_DIRECT would only add the copy through the
    /// aligned buffer to the kernel's own. Set at the first write of [`DIRECT_MIN`] bytes.
    in_memory: std::sync::OnceLock<bool>,
    spare: Mutex<Vec<Vec<u8>>>,
}

impl DirectWrites {
    /// Writes `payload` to the new, empty `file`: whole pages with O_DIRECT (straight from the
    /// payload where its memory is page-aligned, else copied through an aligned buffer), the
    /// rest through the page cache. Falls back to the page cache for everything left when the
    /// file system refuses.
    fn write(&self, file: &File, payload: &PutPayload) -> std::io::Result<()> {
        let total = payload.content_length();
        let mut offset = 0u64;
        let mut slices = payload.iter().map(|b| b.as_ref()).filter(|b| !b.is_empty());
        let mut current: &[u8] = slices.next().unwrap_or_default();
        let mut direct_left = if total >= DIRECT_MIN && !self.refused.load(Ordering::Relaxed) {
            total - total % DIRECT_ALIGN
        } else {
            0
        };
        if direct_left > 0
            && (*self.in_memory.get_or_init(|| in_memory(file)) || !self.set_direct(file, true)?)
        {
            direct_left = 0;
        }
        if direct_left > 0 {
            // Only for payload memory that is not aligned (packs are: upload::PACK_ALIGN).
            let mut bounce: Option<Vec<u8>> = None;
            while direct_left > 0 {
                if current.is_empty() {
                    current = slices.next().unwrap_or_default();
                }
                let straight = if current.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
                    let n = current.len().min(direct_left);
                    n - n % DIRECT_ALIGN
                } else {
                    0
                };
                let piece: &[u8] = if straight > 0 {
                    let (piece, rest) = current.split_at(straight);
                    current = rest;
                    piece
                } else {
                    let buffer =
                        bounce.get_or_insert_with(|| self.bounce(direct_left.min(BOUNCE_MAX)));
                    let (start, cap) = aligned_window(buffer, direct_left.min(BOUNCE_MAX));
                    let want = direct_left.min(cap);
                    let window = &mut buffer[start..start + want];
                    let mut filled = 0;
                    while filled < want {
                        if current.is_empty() {
                            current = slices.next().unwrap_or_default();
                        }
                        let n = current.len().min(want - filled);
                        window[filled..filled + n].copy_from_slice(&current[..n]);
                        filled += n;
                        current = &current[n..];
                    }
                    window
                };
                match file.write_all_at(piece, offset) {
                    Ok(()) => direct_left -= piece.len(),
                    // Refused at write time (an alignment the file system wants larger): this
                    // piece again, and the rest, through the page cache.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.refused.store(true, Ordering::Relaxed);
                        self.set_direct(file, false)?;
                        file.write_all_at(piece, offset)?;
                        direct_left = 0;
                    }
                    Err(e) => return Err(e),
                }
                offset += piece.len() as u64;
            }
            if let Some(buffer) = bounce {
                self.give_back(buffer);
            }
            self.set_direct(file, false)?;
        }
        file.write_all_at(current, offset)?;
        offset += current.len() as u64;
        for slice in slices {
            file.write_all_at(slice, offset)?;
            offset += slice.len() as u64;
        }
        Ok(())
    }

    /// Turns O_DIRECT on or off for `file`; false if the file system refuses it (and then it
    /// is not asked again).
    fn set_direct(&self, file: &File, on: bool) -> std::io::Result<bool> {
        let fd = file.as_raw_fd();
        // SAFETY: fcntl(F_GETFL) on a descriptor `file` owns and keeps open; no memory passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_DIRECT
        } else {
            flags & !libc::O_DIRECT
        };
        // SAFETY: fcntl(F_SETFL) with an int argument on the same open descriptor.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        if on && e.raw_os_error() == Some(libc::EINVAL) {
            self.refused.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        Err(e)
    }

    /// A buffer holding an aligned window of at least `len` bytes.
    fn bounce(&self, len: usize) -> Vec<u8> {
        let need = len + DIRECT_ALIGN;
        let reused = self.spare.lock().ok().and_then(|mut spare| {
            let at = spare.iter().position(|b| b.len() >= need)?;
            Some(spare.swap_remove(at))
        });
        reused.unwrap_or_else(|| vec![0u8; need])
    }

    fn give_back(&self, bounce: Vec<u8>) {
        if let Ok(mut spare) = self.spare.lock() {
            if spare.len() < SPARE_BOUNCES {
                spare.push(bounce);
            }
        }
    }
}

/// Whether `file` is on a file system whose storage is the page cache itself.
fn in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: `statfs` is plain data (integers and arrays of them), valid when all zero.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into `stat`, which lives across the call, for an open descriptor.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs between targets
    let kind = stat.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Where the aligned window of `buffer` starts, and its length (at most `len`, a multiple of
/// [`DIRECT_ALIGN`]).
fn aligned_window(buffer: &[u8], len: usize) -> (usize, usize) {
    let start = buffer.as_ptr().align_offset(DIRECT_ALIGN).min(buffer.len());
    let cap = (buffer.len() - start).min(len);
    (start, cap - cap % DIRECT_ALIGN)
}

impl fmt::Display for SyncedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Synced({})", self.inner)
    }
}

impl fmt::Debug for SyncedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncedDir")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ObjectStore for SyncedDir {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let job = self.sync_job(location, true)?;
        let create = match opts.mode {
            PutMode::Overwrite => false,
            PutMode::Create => true,
            // Not supported by `LocalFileSystem` either: its error.
            PutMode::Update(_) => return self.inner.put_opts(location, payload, opts).await,
        };
        if !opts.attributes.is_empty() {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let direct = Arc::clone(&self.direct);
        tokio::task::spawn_blocking(move || job.put_blocking(&payload, create, &direct))
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })?
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let job = self.sync_job(location, true)?;
        // The directories it needs, made here so that the sync at completion knows them.
        if !job.path.parent().is_some_and(|d| d.is_dir()) {
            job.create_dirs()?;
        }
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(SyncedUpload {
            inner,
            job: Some(job),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_range(
        &self,
        location: &Path,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes> {
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let job = self.sync_job(location, false)?;
        self.inner.delete(location).await?;
        job.run().await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        self.inner.copy(from, to).await?;
        job.run().await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        let gone = self.sync_job(from, false)?;
        self.inner.rename(from, to).await?;
        job.run().await?;
        gone.run().await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        self.inner.copy_if_not_exists(from, to).await?;
        job.run().await
    }
}

/// A multipart upload that fsyncs the object once it is complete.
#[derive(Debug)]
struct SyncedUpload {
    inner: Box<dyn MultipartUpload>,
    job: Option<SyncJob>,
}

#[async_trait]
impl MultipartUpload for SyncedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let done = self.inner.complete().await?;
        if let Some(job) = self.job.take() {
            job.run().await?;
        }
        Ok(done)
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}
