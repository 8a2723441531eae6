//! The staging server's storage engine: file versions appended to log-structured arenas
//! on local SSD, described by a checksummed index log, made durable by group commit,
//! drained to the durable store and reclaimed. Formats, the durability argument and the
//! limits are in docs/staging-arenas.md.
//!
//! Concurrency: one `Mutex` guards the in-memory state; it is never held across a pwrite,
//! pread or fsync. `sync` elects one caller as leader of a round (Mutex + Condvar); the
//! leader alone writes the index, the others wait for the round that covers them.

mod model;
mod record;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use model::Model;
use record::Record;

/// The arenas' levels, as a server's Status reply carries them.
pub use cascade_wire::status::Usage;

/// Appends longer than this are stored as several extents, so that a read never has to
/// load (and checksum) more than this for one extent.
pub const MAX_EXTENT: usize = 4 << 20;

/// Direct mode: an active arena is preallocated this far ahead of its reserved end (at most
/// a quarter of `arena_size`). O_DIRECT writes past a file's end extend it, and ext4 runs
/// those one at a time under the inode's exclusive lock, the waiting writers spinning on it;
/// writes inside it take the lock shared and overlap (docs/staging-arenas.md).
pub const PREALLOCATE_AHEAD: u64 = 64 << 20;

/// Extents kept after a partial read, so that small sequential reads do not load and
/// checksum the same extent again for every call.
const READ_CACHE: usize = 4;

/// Version and manifest ids are reserved in blocks of this many by a durable IdReserve
/// record, so an id handed out before a crash is never handed out again.
const ID_RESERVE: u64 = 1 << 20;

/// In direct mode every extent starts at a multiple of this in its arena and its bytes are
/// followed by zeros up to the next multiple (docs/staging-arenas.md, "Arenas").
pub const BLOCK: usize = 4096;

/// Probe file for O_DIRECT support, created and removed by `open` (a `*.tmp` file, so a
/// crash between the two leaves nothing a later open does not remove).
const DIRECT_PROBE: &str = "direct-probe.tmp";

const INDEX: &str = "index.log";
const INDEX_TMP: &str = "index.log.tmp";

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Arena file size at which the writer slot rotates to a new arena (default 256 MiB);
    /// `open` lowers it to a quarter of `capacity` (but not below 1 MiB).
    pub arena_size: u64,
    /// Maximum total bytes of arena files on disk; an append past it fails with
    /// Error::Full (None = only the file system limits).
    pub capacity: Option<u64>,
    /// Number of writer slots (one active arena each, used concurrently by IO threads);
    /// default 2.
    pub writers: usize,
    /// index.log is compacted when it is larger than this and more than half of its
    /// records describe dead state (default 64 MiB).
    pub index_compact_bytes: u64,
    /// Write arenas with O_DIRECT (block-aligned, padded extents) where the file system
    /// supports it, else buffered (default true). See [`Engine::io_mode`].
    pub direct: bool,
}

/// How the engine writes arenas ([`Engine::io_mode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT appends, each extent at a multiple of [`BLOCK`] and padded with zeros to
    /// one: no page-cache copy, no writeback.
    Direct,
    /// Buffered `pwrite`s, extents back to back; the reason direct I/O is not used.
    Buffered(String),
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoMode::Direct => write!(f, "O_DIRECT ({BLOCK}-byte aligned extents)"),
            IoMode::Buffered(why) => write!(f, "buffered ({why})"),
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            arena_size: 256 << 20,
            capacity: None,
            writers: 2,
            index_compact_bytes: 64 << 20,
            direct: true,
        }
    }
}

/// Server-local, monotonically increasing, never reused (reserved durably in blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionId(pub u64);

impl std::fmt::Display for VersionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.0)
    }
}

#[derive(Debug, Clone)]
pub struct VersionInfo {
    pub id: VersionId,
    pub key: String,
    pub stamp: u64,
    pub size: u64,
    pub blake3: [u8; 32],
    /// The writer's tag (cascade_wire::auth::JobKey::version_tag), if it sent one.
    pub tag: Option<[u8; 32]>,
    pub drained: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    pub path: String,
    pub size: u64,
    pub blake3: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub checkpoint: String,
    pub single_file: bool,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}")]
    Full { what: String },
    #[error("{what}")]
    Corrupt { what: String },
    #[error("{what}")]
    Invalid { what: String },
    #[error("staging directory {dir} is in use by another process (it holds {dir}/LOCK)")]
    Locked { dir: String },
}

pub type Result<T> = std::result::Result<T, Error>;

fn io_err(what: impl Into<String>, source: io::Error) -> Error {
    Error::Io {
        what: what.into(),
        source,
    }
}

fn invalid(what: impl Into<String>) -> Error {
    Error::Invalid { what: what.into() }
}

fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// "1.5 GiB", for messages.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn arena_name(n: u32) -> String {
    numbered_log_name("arena", n)
}

/// The arena number of a file name `arena-NNNNNNNN.log`.
fn parse_arena_name(name: &str) -> Option<u32> {
    parse_numbered_log_name("arena", name)
}

/// `STEM-NNNNNNNN.log`: a numbered log file (arenas here, the chunk store's segments).
pub(crate) fn numbered_log_name(stem: &str, n: u32) -> String {
    format!("{stem}-{n:08}.log")
}

/// The number of a file named `STEM-NNNNNNNN.log` (exactly eight digits).
pub(crate) fn parse_numbered_log_name(stem: &str, name: &str) -> Option<u32> {
    let digits = name
        .strip_prefix(stem)?
        .strip_prefix('-')?
        .strip_suffix(".log")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Makes a directory's entries (files created, renamed or removed in it) durable.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Something to do once the records up to a sequence number are durable.
enum Deferred {
    /// The version is superseded or drained: its extents become garbage.
    Release(u64),
    /// Ids below these are covered by a durable IdReserve.
    Reserve { versions: u64, manifests: u64 },
}

/// State under the engine's main lock.
struct Inner {
    m: Model,
    /// Active arena of each writer slot.
    slots: Vec<Option<u32>>,
    /// Framed records not yet in index.log.
    pending: Vec<u8>,
    pending_records: u64,
    /// Sequence number of the last record queued.
    seq: u64,
    deferred: VecDeque<(u64, Deferred)>,
    /// Arenas with writes not yet fdatasynced.
    dirty: HashMap<u32, Arc<File>>,
    /// An arena was created since the last round: its directory entry needs an fsync.
    dir_dirty: bool,
    versions_durable: u64,
    manifests_durable: u64,
    versions_queued: u64,
    manifests_queued: u64,
    reserve_queued: bool,
    arena_bytes: u64,
    index_len: u64,
    index_records: u64,
    next_compact_check: u64,
    /// After a failed fsync (or an index that could not be restored) nothing more can be
    /// promised durable: every later sync fails until the server restarts and recovers.
    poisoned: Option<String>,
    warnings: Vec<String>,
}

impl Inner {
    fn queue(&mut self, rec: &Record) -> u64 {
        rec.frame_into(&mut self.pending);
        self.pending_records += 1;
        self.seq += 1;
        self.seq
    }

    fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            None => Ok(()),
            Some(why) => Err(io_err(
                "staging engine stopped after an earlier failure; restart the server to recover",
                io::Error::other(why.clone()),
            )),
        }
    }

    /// Queues a new IdReserve (once) when ids ran out of the durable reservation.
    fn queue_reserve(&mut self) {
        if self.reserve_queued {
            return;
        }
        let versions = self.m.next_version.max(self.versions_queued) + ID_RESERVE;
        let manifests = self.m.next_manifest.max(self.manifests_queued) + ID_RESERVE;
        let seq = self.queue(&Record::IdReserve {
            versions_below: versions,
            manifests_below: manifests,
            arenas_below: self.m.next_arena,
        });
        self.deferred.push_back((
            seq,
            Deferred::Reserve {
                versions,
                manifests,
            },
        ));
        self.versions_queued = versions;
        self.manifests_queued = manifests;
        self.reserve_queued = true;
    }

    /// Applies what became durable with the records up to `upto`; returns arenas to check.
    fn apply_deferred(&mut self, upto: u64) -> Vec<u32> {
        let mut touched = Vec::new();
        while self.deferred.front().is_some_and(|(s, _)| *s <= upto) {
            let Some((_, d)) = self.deferred.pop_front() else {
                break;
            };
            match d {
                Deferred::Release(id) => touched.extend(self.m.release(id)),
                Deferred::Reserve {
                    versions,
                    manifests,
                } => {
                    self.versions_durable = self.versions_durable.max(versions);
                    self.manifests_durable = self.manifests_durable.max(manifests);
                    self.reserve_queued = false;
                }
            }
        }
        touched
    }

    /// Deletes (from the state) every candidate arena that is rotated, has no append in
    /// flight and holds no live byte. Returns the files to unlink.
    fn reclaim(&mut self, dir: &Path, candidates: Vec<u32>) -> Vec<PathBuf> {
        let mut work = candidates;
        let mut paths = Vec::new();
        while let Some(n) = work.pop() {
            let Some(a) = self.m.arenas.get(&n) else {
                continue;
            };
            if a.active || a.inflight > 0 || a.live > 0 {
                continue;
            }
            if let Some((a, touched)) = self.m.delete_arena(n) {
                self.arena_bytes = self.arena_bytes.saturating_sub(a.size);
                self.dirty.remove(&n);
                self.queue(&Record::ArenaDeleted { arena: n });
                paths.push(dir.join(arena_name(n)));
                work.extend(touched);
            }
        }
        paths
    }

    /// Records a snapshot would hold (for the compaction decision).
    fn live_records(&self) -> u64 {
        let mut n = 1; // IdReserve
        self.m.snapshot_records(|_| n += 1);
        n
    }

    /// A whole index file describing the current state; (bytes, records).
    fn snapshot(&self) -> (Vec<u8>, u64) {
        let mut out = record::header().to_vec();
        Record::IdReserve {
            versions_below: self.versions_queued.max(self.m.next_version),
            manifests_below: self.manifests_queued.max(self.m.next_manifest),
            arenas_below: self.m.next_arena,
        }
        .frame_into(&mut out);
        let mut n = 1;
        self.m.snapshot_records(|r| {
            r.frame_into(&mut out);
            n += 1;
        });
        (out, n)
    }
}

/// The index file, used by the sync leader only.
struct IndexLog {
    file: File,
    len: u64,
}

struct SyncCtl {
    running: bool,
    started: u64,
    done: u64,
    /// Last round that succeeded.
    last_ok: u64,
    /// Error of the last round that failed: (kind, message).
    last_err: Option<(ErrKind, String)>,
}

#[derive(Clone, Copy)]
enum ErrKind {
    Io(io::ErrorKind),
    Full,
    Corrupt,
    Invalid,
}

fn summarize(e: &Error) -> (ErrKind, String) {
    let kind = match e {
        Error::Io { source, .. } => ErrKind::Io(source.kind()),
        Error::Full { .. } => ErrKind::Full,
        Error::Corrupt { .. } => ErrKind::Corrupt,
        Error::Invalid { .. } | Error::Locked { .. } => ErrKind::Invalid,
    };
    (kind, e.to_string())
}

fn unsummarize(kind: ErrKind, msg: &str) -> Error {
    let what = msg.to_string();
    match kind {
        ErrKind::Io(k) => io_err("staging sync round failed", io::Error::new(k, what)),
        ErrKind::Full => Error::Full { what },
        ErrKind::Corrupt => Error::Corrupt { what },
        ErrKind::Invalid => Error::Invalid { what },
    }
}

/// Where an append goes.
struct Reserved {
    arena: u32,
    /// For the fdatasync (and buffered writes).
    file: Arc<File>,
    /// The O_DIRECT handle, in direct mode.
    direct: Option<Arc<File>>,
    pos: u64,
    /// Direct mode: preallocate the arena from `.0` to `.1` before writing.
    preallocate: Option<(u64, u64)>,
    /// The arena the slot rotated away from and its reserved end: its preallocated tail
    /// is cut off.
    trim: Option<(Arc<File>, u64)>,
}

/// A heap buffer with a [`BLOCK`]-aligned window, for O_DIRECT writes of bytes that are not
/// aligned in memory (and of the padded last block of an extent).
struct Bounce(Vec<u8>);

impl Bounce {
    fn new(len: usize) -> Bounce {
        Bounce(vec![0u8; len + BLOCK])
    }
    /// `len` bytes starting at an aligned address (`len` at most the size it was made for).
    fn window(&mut self, len: usize) -> &mut [u8] {
        let skew = (BLOCK - self.0.as_ptr() as usize % BLOCK) % BLOCK;
        &mut self.0[skew..skew + len]
    }
}

/// `len` rounded up to a multiple of [`BLOCK`].
fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// ((arena, position), the extent's verified bytes).
type CachedExtent = ((u32, u64), Arc<[u8]>);

/// One piece of a read: `len` bytes at `within` in an extent, to `buf[at..]`.
/// A sealed version mapped from the arenas ([`Engine::map_version`]).
pub struct Mapped {
    pieces: Vec<MappedPiece>,
    label: String,
}

struct MappedPiece {
    /// The version's bytes in this extent.
    slice: bytes::Bytes,
    /// The whole extent, which its crc32c covers.
    extent: bytes::Bytes,
    crc: u32,
    arena: u32,
    position: u64,
}

impl Mapped {
    /// The version's bytes in order, as views of the mapped arenas (no copy).
    pub fn parts(&self) -> Vec<bytes::Bytes> {
        self.pieces.iter().map(|p| p.slice.clone()).collect()
    }

    /// Checks every extent's crc32c and returns the BLAKE3 of the version's bytes.
    pub fn verify(&self) -> Result<[u8; 32]> {
        let mut hasher = blake3::Hasher::new();
        let mut checked: Option<(u32, u64)> = None;
        for p in &self.pieces {
            // A version's pieces of one extent are adjacent: each extent is checked once.
            if checked != Some((p.arena, p.position)) {
                let got = crc32c::crc32c(&p.extent);
                if got != p.crc {
                    return Err(Error::Corrupt {
                        what: format!(
                            "arena {} at {}: checksum mismatch (index says {:#010x}, data {got:#010x}) in a {}-byte extent of {}",
                            arena_name(p.arena),
                            p.position,
                            p.crc,
                            p.extent.len(),
                            self.label
                        ),
                    });
                }
                checked = Some((p.arena, p.position));
            }
            hasher.update(&p.slice);
        }
        Ok(*hasher.finalize().as_bytes())
    }
}

struct Piece {
    file: Arc<File>,
    arena: u32,
    position: u64,
    ext_len: u32,
    crc: u32,
    within: u64,
    len: usize,
    at: usize,
}

pub struct Engine {
    dir: PathBuf,
    opts: EngineOptions,
    state: Mutex<Inner>,
    ctl: Mutex<SyncCtl>,
    ctl_cv: Condvar,
    index: Mutex<IndexLog>,
    /// Verified extents, newest last: ((arena, position), bytes). Arena numbers are never
    /// reused and extents never change, so entries cannot go stale.
    read_cache: Mutex<VecDeque<CachedExtent>>,
    /// Direct or buffered arena writes, decided once by `open`.
    mode: IoMode,
    /// Aligned buffers of `MAX_EXTENT + BLOCK` bytes for direct writes of unaligned data.
    bounce: Mutex<Vec<Bounce>>,
    /// Reclaimed arenas are left for [`Engine::unlink_reclaimed`] instead of being deleted
    /// in the sync that reclaimed them ([`Engine::defer_unlinks`]).
    defer_unlink: std::sync::atomic::AtomicBool,
    unlink_later: Mutex<Vec<PathBuf>>,
    /// Holds the flock on dir/LOCK for the engine's lifetime (last field: dropped last).
    _lock: DirLock,
}

/// An exclusive flock on a staging directory's LOCK file, released explicitly on drop.
///
/// A flock belongs to the open file description, which a child forked by any thread of
/// this process shares until it execs (or for good, if it never does): closing our
/// descriptor alone would then leave the directory locked. LOCK_UN releases it for every
/// holder at once.
struct DirLock(File);

impl DirLock {
    fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join("LOCK");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err(format!("open {}", path.display()), e))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(Error::Locked {
                    dir: dir.display().to_string(),
                });
            }
            return Err(io_err(format!("flock {}", path.display()), e));
        }
        Ok(DirLock(file))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this value owns; no memory is involved. A failure
        // leaves the lock to the close that follows, as before.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves state no worse than a crash would;
    // keep serving rather than propagate the panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Creates `dir` if missing, takes an exclusive flock on `dir/LOCK`, replays the index
    /// (truncating a torn or garbled tail), drops versions that were never sealed, deletes
    /// arena files nothing live references and stray temp files.
    pub fn open(dir: &Path, mut opts: EngineOptions) -> Result<Engine> {
        if opts.arena_size == 0 || opts.writers == 0 {
            return Err(invalid(
                "staging engine options: arena_size and writers must be at least 1",
            ));
        }
        if let Some(capacity) = opts.capacity {
            // An arena is deleted only once it is no longer written to and all its data has
            // drained: with arenas as large as the capacity, the active one fills it and the
            // engine stays full for good. A quarter of it keeps room for the active arenas.
            opts.arena_size = opts.arena_size.min((capacity / 4).max(1 << 20));
        }
        let d = dir.display().to_string();
        std::fs::create_dir_all(dir).map_err(|e| io_err(format!("create {d}"), e))?;
        let dir_lock = DirLock::acquire(dir)?;

        // Stray temp files (a compaction cut short) and the arena files on disk.
        let mut on_disk: Vec<u32> = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| io_err(format!("list {d}"), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_err(format!("list {d}"), e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".tmp") {
                std::fs::remove_file(entry.path())
                    .map_err(|e| io_err(format!("remove {}", entry.path().display()), e))?;
            } else if let Some(n) = parse_arena_name(name) {
                on_disk.push(n);
            }
        }

        let index_path = dir.join(INDEX);
        if !index_path.exists() {
            create_index(dir).map_err(|e| io_err(format!("create {}", index_path.display()), e))?;
        }
        let ip = index_path.display().to_string();
        let mut index_file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&index_path)
            .map_err(|e| io_err(format!("open {ip}"), e))?;
        let mut data = Vec::new();
        index_file
            .read_to_end(&mut data)
            .map_err(|e| io_err(format!("read {ip}"), e))?;
        record::check_header(&data).map_err(|why| Error::Corrupt {
            what: format!("staging index {ip}: {why}"),
        })?;
        let scan = record::scan(&data).map_err(|why| Error::Corrupt {
            what: format!("staging index {ip}: {why}"),
        })?;
        drop(data);
        let mut warnings = Vec::new();
        if let Some(tail) = &scan.tail {
            // A torn append: its round never returned, so nothing in it was acknowledged.
            warnings.push(format!(
                "{ip}: dropped an incomplete tail at offset {} ({tail:?})",
                scan.valid_len
            ));
            index_file
                .set_len(scan.valid_len)
                .and_then(|()| index_file.sync_data())
                .map_err(|e| io_err(format!("truncate {ip}"), e))?;
        }

        let mut m = Model::default();
        for rec in &scan.records {
            for id in m.apply(rec) {
                m.release(id);
            }
        }
        // Never sealed: their client was never told they were staged.
        let unsealed: Vec<u64> = m
            .versions
            .iter()
            .filter(|(_, v)| v.seal.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in unsealed {
            m.remove_version(id);
        }
        if let Some(&max) = on_disk.iter().max() {
            m.next_arena = m.next_arena.max(max.saturating_add(1));
        }
        recover_arenas(dir, &mut m, &on_disk, &mut warnings)?;
        let mode = if opts.direct {
            probe_direct(dir)
        } else {
            IoMode::Buffered("O_DIRECT not asked for".into())
        };
        let arena_bytes = m.arenas.values().map(|a| a.size).sum();
        let next_version = m.next_version;
        let next_manifest = m.next_manifest;
        let inner = Inner {
            m,
            slots: vec![None; opts.writers],
            pending: Vec::new(),
            pending_records: 0,
            seq: 0,
            deferred: VecDeque::new(),
            dirty: HashMap::new(),
            dir_dirty: false,
            versions_durable: 0,
            manifests_durable: 0,
            versions_queued: next_version,
            manifests_queued: next_manifest,
            reserve_queued: false,
            arena_bytes,
            index_len: scan.valid_len,
            index_records: scan.records.len() as u64,
            next_compact_check: 0,
            poisoned: None,
            warnings,
        };
        let engine = Engine {
            dir: dir.to_path_buf(),
            opts,
            state: Mutex::new(inner),
            ctl: Mutex::new(SyncCtl {
                running: false,
                started: 0,
                done: 0,
                last_ok: 0,
                last_err: None,
            }),
            ctl_cv: Condvar::new(),
            index: Mutex::new(IndexLog {
                file: index_file,
                len: scan.valid_len,
            }),
            read_cache: Mutex::new(VecDeque::new()),
            mode,
            bounce: Mutex::new(Vec::new()),
            defer_unlink: std::sync::atomic::AtomicBool::new(false),
            unlink_later: Mutex::new(Vec::new()),
            _lock: dir_lock,
        };
        // Ids below the recovered maximum (and every reservation before it) may have been
        // handed out by the previous run: reserve a fresh block before issuing any.
        lock(&engine.state).queue_reserve();
        engine.sync()?;
        Ok(engine)
    }

    /// How arenas are written: O_DIRECT, or buffered and why (the file system refused
    /// O_DIRECT, e.g. tmpfs, or it was not asked for).
    pub fn io_mode(&self) -> &IoMode {
        &self.mode
    }

    /// Problems open() recovered from (torn index tail, missing or short arena files),
    /// one line each, for the server's log.
    pub fn recovery_warnings(&self) -> Vec<String> {
        lock(&self.state).warnings.clone()
    }

    /// Starts (or resumes) absorbing version `stamp` of `key`, whose final size is `size`.
    /// The same (key, stamp) still in memory returns the same id, sealed or not (a resend).
    pub fn begin_version(&self, key: &str, stamp: u64, size: u64) -> Result<VersionId> {
        if key.is_empty() || !record::valid_str_len(key) {
            return Err(invalid(format!(
                "staging key must be 1 to 65535 bytes, got {}",
                key.len()
            )));
        }
        loop {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            if let Some(id) = g.m.find(key, stamp) {
                let v = &g.m.versions[&id];
                if v.size != size {
                    return Err(invalid(format!(
                        "{key}@{stamp} was begun with size {} and is now sent with size {size}",
                        v.size
                    )));
                }
                return Ok(VersionId(id));
            }
            if g.m.next_version < g.versions_durable {
                let id = g.m.next_version;
                let rec = Record::Version {
                    id,
                    stamp,
                    size,
                    key: key.to_string(),
                };
                g.m.apply(&rec);
                g.queue(&rec);
                return Ok(VersionId(id));
            }
            g.queue_reserve();
            drop(g);
            self.sync()?;
        }
    }

    /// Appends `data` as bytes `offset..offset+len` of version `v` at the end of writer
    /// slot `slot % writers`'s active arena. No-op on a sealed version.
    pub fn append(&self, slot: usize, v: VersionId, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            let g = lock(&self.state);
            return match g.m.versions.get(&v.0) {
                Some(_) => Ok(()),
                None => Err(invalid(format!("unknown version {v}"))),
            };
        }
        let mut off = offset;
        for chunk in data.chunks(MAX_EXTENT) {
            self.append_extent(slot, v, off, chunk)?;
            off += chunk.len() as u64;
        }
        Ok(())
    }

    fn append_extent(&self, slot: usize, v: VersionId, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        let crc = crc32c::crc32c(data);
        // Room taken in the arena: in direct mode the extent is padded to whole blocks.
        let span = match self.mode {
            IoMode::Direct => padded(len),
            IoMode::Buffered(_) => len,
        };
        let Reserved {
            arena: n,
            file,
            direct,
            pos,
            preallocate,
            trim,
        } = {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            let Some(ver) = g.m.versions.get(&v.0) else {
                return Err(invalid(format!("unknown version {v}")));
            };
            if ver.seal.is_some() {
                return Ok(()); // a resend of a sealed version
            }
            if offset.checked_add(len).is_none_or(|end| end > ver.size) {
                return Err(invalid(format!(
                    "{}@{}: bytes {offset}..{} are past its size {}",
                    ver.key,
                    ver.stamp,
                    offset.saturating_add(len),
                    ver.size
                )));
            }
            let (reserved, paths) = self.reserve(&mut g, slot, span);
            drop(g);
            self.unlink(paths);
            reserved?
        };
        // Outside the lock: other slots (and this one, at other positions) keep writing.
        // Both only make writes faster or the file shorter: a failure is ignored (a write
        // past the end still works; ENOSPC shows in the write).
        if let Some((file, end)) = trim {
            let _ = file.set_len(end);
        }
        if let (Some(d), Some((from, to))) = (&direct, preallocate) {
            // SAFETY: fallocate on a descriptor this engine holds open; no memory is involved.
            unsafe {
                libc::fallocate(
                    d.as_raw_fd(),
                    0,
                    from as libc::off_t,
                    (to - from) as libc::off_t,
                )
            };
        }
        let res = match &direct {
            Some(d) => self.write_direct(d, data, pos),
            None => {
                let res = file.write_all_at(data, pos);
                if res.is_ok() {
                    start_writeback(&file, pos, len);
                }
                res
            }
        };
        let paths = {
            let mut g = lock(&self.state);
            if let Some(a) = g.m.arenas.get_mut(&n) {
                a.inflight -= 1;
            }
            let open = g.m.versions.get(&v.0).is_some_and(|x| x.seal.is_none());
            if res.is_ok() && open {
                let rec = Record::Extent {
                    id: v.0,
                    offset,
                    len: len as u32,
                    arena: n,
                    position: pos,
                    crc,
                };
                g.m.apply(&rec);
                g.queue(&rec);
                g.dirty.insert(n, file);
            }
            // The bytes may be garbage (failed write, abandoned or dead extent): the
            // slot has moved past them, nothing will reference them.
            g.reclaim(&self.dir, vec![n])
        };
        self.unlink(paths);
        match res {
            Ok(()) => Ok(()),
            Err(e) if is_no_space(&e) => Err(Error::Full {
                what: format!(
                    "staging directory {} is full: {} writing {} bytes to {} at {pos}",
                    self.dir.display(),
                    e,
                    len,
                    arena_name(n)
                ),
            }),
            Err(e) => Err(io_err(format!("write {} at {pos}", arena_name(n)), e)),
        }
    }

    /// Writes `data` at `pos` (a multiple of BLOCK) of an O_DIRECT handle, followed by zeros
    /// up to the next multiple of BLOCK. Bytes aligned in memory go straight from `data`
    /// (only the last partial block through a bounce buffer); others are copied into one.
    fn write_direct(&self, f: &File, data: &[u8], pos: u64) -> io::Result<()> {
        let bulk = data.len() / BLOCK * BLOCK;
        let aligned = data.as_ptr() as usize % BLOCK == 0;
        if aligned && bulk > 0 {
            f.write_all_at(&data[..bulk], pos)?;
            if bulk == data.len() {
                return Ok(());
            }
        }
        let (from, at) = if aligned {
            (bulk, pos + bulk as u64)
        } else {
            (0, pos)
        };
        let rest = &data[from..];
        let span = padded(rest.len() as u64) as usize;
        let mut b = lock(&self.bounce)
            .pop()
            .unwrap_or_else(|| Bounce::new(MAX_EXTENT));
        let w = b.window(span);
        w[..rest.len()].copy_from_slice(rest);
        w[rest.len()..].fill(0);
        let res = f.write_all_at(w, at);
        lock(&self.bounce).push(b);
        res
    }

    /// Reserves `len` bytes at the end of the slot's arena (rotating if needed).
    /// Returns the place and the arena files to unlink (a rotated-away arena).
    fn reserve(&self, g: &mut Inner, slot: usize, len: u64) -> (Result<Reserved>, Vec<PathBuf>) {
        if let Some(cap) = self.opts.capacity {
            if g.arena_bytes + len > cap {
                return (
                    Err(Error::Full {
                        what: format!(
                            "staging directory {} is full: {} of {} used, {} more requested",
                            self.dir.display(),
                            human(g.arena_bytes),
                            human(cap),
                            human(len)
                        ),
                    }),
                    Vec::new(),
                );
            }
        }
        let s = slot % g.slots.len();
        let current = g.slots[s].filter(|n| {
            g.m.arenas
                .get(n)
                .is_some_and(|a| a.size == 0 || a.size + len <= self.opts.arena_size)
        });
        let mut paths = Vec::new();
        let mut trim = None;
        let n = match current {
            Some(n) => n,
            None => {
                if let Some(old) = g.slots[s].take() {
                    if let Some(a) = g.m.arenas.get_mut(&old) {
                        a.active = false;
                        a.direct = None;
                        if a.allocated > a.size {
                            trim = a.file.clone().map(|f| (f, a.size));
                            a.allocated = a.size;
                        }
                    }
                    paths = g.reclaim(&self.dir, vec![old]);
                }
                let n = g.m.next_arena;
                g.m.next_arena = n.saturating_add(1);
                let path = self.dir.join(arena_name(n));
                let file = match OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                {
                    Ok(f) => Arc::new(f),
                    Err(e) if is_no_space(&e) => {
                        let what = format!(
                            "staging directory {} is full: cannot create {}: {e}",
                            self.dir.display(),
                            arena_name(n)
                        );
                        return (Err(Error::Full { what }), paths);
                    }
                    Err(e) => return (Err(io_err(format!("create {}", path.display()), e)), paths),
                };
                // A second handle for the appends, with O_DIRECT: reads, maps and fdatasync
                // keep the buffered one.
                let direct = match self.mode {
                    IoMode::Direct => match open_direct(&path, false) {
                        Ok(f) => Some(Arc::new(f)),
                        Err(e) => {
                            // The file exists and is empty: delete it, and its number is
                            // simply never used.
                            let _ = std::fs::remove_file(&path);
                            let what = format!("open {} with O_DIRECT", path.display());
                            return (Err(io_err(what, e)), paths);
                        }
                    },
                    IoMode::Buffered(_) => None,
                };
                let rec = Record::NewArena { arena: n };
                g.m.apply(&rec);
                g.queue(&rec);
                g.dir_dirty = true;
                if let Some(a) = g.m.arenas.get_mut(&n) {
                    a.file = Some(file);
                    a.direct = direct;
                    a.active = true;
                }
                g.slots[s] = Some(n);
                n
            }
        };
        let Some(a) = g.m.arenas.get_mut(&n) else {
            return (Err(invalid(format!("arena {n} vanished"))), paths);
        };
        let Some(file) = a.file.clone() else {
            return (Err(invalid(format!("arena {n} has no open file"))), paths);
        };
        let direct = a.direct.clone();
        let pos = a.size;
        a.size += len;
        a.inflight += 1;
        let mut preallocate = None;
        if direct.is_some() && a.size > a.allocated {
            let ahead = PREALLOCATE_AHEAD.min(self.opts.arena_size / 4);
            let to = self.opts.arena_size.min(a.size + ahead).max(a.size);
            preallocate = Some((a.allocated.max(pos), to));
            a.allocated = to;
        }
        g.arena_bytes += len;
        (
            Ok(Reserved {
                arena: n,
                file,
                direct,
                pos,
                preallocate,
                trim,
            }),
            paths,
        )
    }

    /// The version is complete: its extents must cover 0..size. No-op if already sealed.
    /// `tag` is its writer's tag, kept and served with it (readers check it).
    pub fn seal(&self, v: VersionId, blake3: [u8; 32], tag: Option<[u8; 32]>) -> Result<()> {
        let mut g = lock(&self.state);
        g.check_poisoned()?;
        let Some(ver) = g.m.versions.get(&v.0) else {
            return Err(invalid(format!("unknown version {v}")));
        };
        if let Some((sealed, _)) = ver.seal {
            // A resend of the same file changes nothing; another file under the same name
            // and stamp must not be acknowledged as stored.
            if sealed != blake3 {
                return Err(invalid(format!(
                    "{}@{} is already sealed with another BLAKE3: a different file under the \
                     same name and stamp is not stored",
                    ver.key, ver.stamp
                )));
            }
            return Ok(());
        }
        if let Some(missing) = g.m.missing_byte(v.0) {
            let ver = &g.m.versions[&v.0];
            return Err(invalid(format!(
                "{}@{} ({} bytes) cannot be sealed: byte {missing} was never received",
                ver.key, ver.stamp, ver.size
            )));
        }
        let rec = Record::Seal {
            id: v.0,
            blake3,
            tag,
        };
        let garbage = g.m.apply(&rec);
        let seq = g.queue(&rec);
        // Superseded data is reclaimed only once this seal is durable: until then a crash
        // would bring the older version back as the newest.
        for id in garbage {
            g.deferred.push_back((seq, Deferred::Release(id)));
        }
        Ok(())
    }

    /// The client went away before sealing: the version's extents become garbage.
    pub fn abandon(&self, v: VersionId) {
        let paths = {
            let mut g = lock(&self.state);
            if g.m.versions.get(&v.0).is_none_or(|x| x.seal.is_some()) {
                return;
            }
            // Safe to reclaim at once: recovery drops unsealed versions anyway.
            let touched = g.m.remove_version(v.0);
            g.reclaim(&self.dir, touched)
        };
        self.unlink(paths);
    }

    /// Group commit: on return, everything begun, appended, sealed or recorded before the
    /// call started is durable.
    pub fn sync(&self) -> Result<()> {
        let mut c = lock(&self.ctl);
        // A round already running may have taken its batch before our records were
        // queued: we need one that starts after now.
        let target = c.started + 1;
        loop {
            if c.done >= target {
                // A failed round puts its batch back in front of the queue, so any
                // successful round from `target` on covers our records.
                if c.last_ok >= target {
                    return Ok(());
                }
                return Err(match &c.last_err {
                    Some((kind, msg)) => unsummarize(*kind, msg),
                    None => io_err("staging sync", io::Error::other("round failed")),
                });
            }
            if !c.running {
                c.running = true;
                c.started += 1;
                let round = c.started;
                drop(c);
                let res = self.round();
                let mut c = lock(&self.ctl);
                c.running = false;
                c.done = round;
                match &res {
                    Ok(()) => c.last_ok = round,
                    Err(e) => c.last_err = Some(summarize(e)),
                }
                self.ctl_cv.notify_all();
                return res;
            }
            c = self.ctl_cv.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// One group-commit round (the caller is the only leader).
    fn round(&self) -> Result<()> {
        let mut ix = lock(&self.index);
        let (batch, nrec, upto, files, dir_dirty, snapshot) = {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            let batch = std::mem::take(&mut g.pending);
            let nrec = std::mem::take(&mut g.pending_records);
            let upto = g.seq;
            let files: Vec<Arc<File>> = g.dirty.drain().map(|(_, f)| f).collect();
            let dir_dirty = std::mem::take(&mut g.dir_dirty);
            let projected = g.index_len + batch.len() as u64;
            let mut snapshot = None;
            if projected > self.opts.index_compact_bytes && projected >= g.next_compact_check {
                // Taken under the lock right after the batch: the state is exactly what
                // the log plus this batch describe.
                if g.index_records + nrec > 2 * g.live_records() {
                    snapshot = Some(g.snapshot());
                } else {
                    g.next_compact_check = projected + self.opts.index_compact_bytes / 2;
                }
            }
            (batch, nrec, upto, files, dir_dirty, snapshot)
        };
        // Arena data first: a record may reach the index only after its bytes are on the SSD.
        for f in &files {
            f.sync_data()
                .map_err(|e| self.poison("fdatasync of an arena", e))?;
        }
        if dir_dirty {
            fsync_dir(&self.dir).map_err(|e| self.poison("fsync of the staging directory", e))?;
        }
        let records = if let Some((snap, n)) = snapshot {
            match self.write_snapshot(&snap) {
                Ok(file) => {
                    ix.file = file;
                    ix.len = snap.len() as u64;
                    lock(&self.state).next_compact_check = 0;
                    Some(n)
                }
                Err((renamed, e)) => {
                    if renamed {
                        return Err(self.poison("compaction of the staging index", e));
                    }
                    self.requeue(batch, nrec);
                    return Err(io_err("compaction of the staging index", e));
                }
            }
        } else {
            if !batch.is_empty() {
                if let Err(e) = ix.file.write_all_at(&batch, ix.len) {
                    // Cut a partial append back off: records after a torn one would be
                    // lost at recovery.
                    if let Err(e2) = ix.file.set_len(ix.len) {
                        return Err(
                            self.poison("truncating the staging index after a failed write", e2)
                        );
                    }
                    self.requeue(batch, nrec);
                    if is_no_space(&e) {
                        return Err(Error::Full {
                            what: format!(
                                "staging directory {} is full: cannot append to {INDEX}: {e}",
                                self.dir.display()
                            ),
                        });
                    }
                    return Err(io_err(format!("append to {INDEX}"), e));
                }
                ix.file
                    .sync_data()
                    .map_err(|e| self.poison("fdatasync of the staging index", e))?;
                ix.len += batch.len() as u64;
            }
            None
        };
        let paths = {
            let mut g = lock(&self.state);
            g.index_len = ix.len;
            match records {
                Some(n) => g.index_records = n,
                None => g.index_records += nrec,
            }
            let touched = g.apply_deferred(upto);
            g.reclaim(&self.dir, touched)
        };
        drop(ix);
        if self.defer_unlink.load(std::sync::atomic::Ordering::Relaxed) {
            lock(&self.unlink_later).extend(paths);
        } else {
            self.unlink(paths);
        }
        Ok(())
    }

    /// Puts a batch that did not reach the index back in front of the queue.
    fn requeue(&self, mut batch: Vec<u8>, nrec: u64) {
        let mut g = lock(&self.state);
        batch.extend_from_slice(&g.pending);
        g.pending = batch;
        g.pending_records += nrec;
    }

    fn poison(&self, what: &str, e: io::Error) -> Error {
        let mut g = lock(&self.state);
        let msg = format!("{what} failed: {e}");
        if g.poisoned.is_none() {
            g.poisoned = Some(msg);
        }
        io_err(what.to_string(), e)
    }

    /// Writes, syncs and renames a snapshot over index.log. Err((renamed, error)).
    fn write_snapshot(&self, snap: &[u8]) -> std::result::Result<File, (bool, io::Error)> {
        let tmp = self.dir.join(INDEX_TMP);
        let written = (|| {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all_at(snap, 0)?;
            f.sync_data()?;
            std::fs::rename(&tmp, self.dir.join(INDEX))?;
            Ok(f)
        })();
        let f = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err((false, e));
            }
        };
        // Appends to the new file must not become durable before the rename does.
        fsync_dir(&self.dir).map_err(|e| (true, e))?;
        Ok(f)
    }

    /// From now on, arenas reclaimed by a sync are deleted only by
    /// [`Engine::unlink_reclaimed`]: deleting them takes time (0.14 s for 768 MiB of arenas on
    /// ext4 mounted with `discard`, measured on the bench's disk), which the caller of the
    /// sync (the drain, before a checkpoint's marker) need not wait for. They are garbage
    /// already (nothing live is in them, the index says so): one left behind by a crash is
    /// deleted by the next `open`.
    pub fn defer_unlinks(&self) {
        self.defer_unlink
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Deletes the arenas reclaimed since the last call (see [`Engine::defer_unlinks`]).
    pub fn unlink_reclaimed(&self) {
        let paths = std::mem::take(&mut *lock(&self.unlink_later));
        self.unlink(paths);
    }

    fn unlink(&self, paths: Vec<PathBuf>) {
        for p in paths {
            // A file left behind is unreferenced and removed by the next open().
            let _ = std::fs::remove_file(p);
        }
    }

    /// Newest sealed version of `key` still present (drained ones included).
    pub fn lookup(&self, key: &str) -> Option<VersionInfo> {
        let g = lock(&self.state);
        let id = g.m.current(key)?;
        g.m.info(id)
    }

    /// Sealed version `v` mapped from its arenas, extent by extent, for an upload in one
    /// request without a copy; [`Mapped::verify`] checks every extent's crc32c and hashes it.
    pub fn map_version(&self, v: VersionId) -> Result<Mapped> {
        let size = {
            let g = lock(&self.state);
            match g.m.versions.get(&v.0) {
                Some(ver) => ver.size,
                None => {
                    return Err(invalid(format!(
                        "unknown version {v} (never staged, or reclaimed)"
                    )))
                }
            }
        };
        let (pieces, _, label) = self.plan(v, 0, size as usize)?;
        let mut parts = Vec::with_capacity(pieces.len());
        for p in pieces {
            let name = arena_name(p.arena);
            let page = 4096u64;
            let start = p.position - p.position % page;
            let lead = (p.position - start) as usize;
            let map_len = lead + p.ext_len as usize;
            if p.file
                .metadata()
                .map_err(|e| io_err(format!("stat {name}"), e))?
                .len()
                < p.position + u64::from(p.ext_len)
            {
                return Err(Error::Corrupt {
                    what: format!(
                        "arena {name} at {}: file ends inside a {}-byte extent of {label}",
                        p.position, p.ext_len
                    ),
                });
            }
            // SAFETY: the arena file is only ever appended to, and an arena is deleted (never
            // truncated) once every extent in it is drained or superseded, which this version
            // is not until its upload ends; the range was checked to lie within the file.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .offset(start)
                    .len(map_len)
                    .map(&*p.file)
            }
            .map_err(|e| io_err(format!("map {name} at {}", p.position), e))?;
            let extent = bytes::Bytes::from_owner(map).slice(lead..map_len);
            let from = p.within as usize;
            parts.push(MappedPiece {
                slice: extent.slice(from..from + p.len),
                extent,
                crc: p.crc,
                arena: p.arena,
                position: p.position,
            });
        }
        Ok(Mapped {
            pieces: parts,
            label,
        })
    }

    /// Reads up to `buf.len()` bytes of sealed version `v` at `offset` (short only at the
    /// end of the file), verifying the crc32c of every extent it touches.
    pub fn read_at(&self, v: VersionId, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let (pieces, total, label) = self.plan(v, offset, buf.len())?;
        for p in pieces {
            let dst = &mut buf[p.at..p.at + p.len];
            if p.within == 0 && p.len == p.ext_len as usize {
                read_extent(&p, dst, &label)?;
                continue;
            }
            let key = (p.arena, p.position);
            let cached = lock(&self.read_cache)
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, b)| b.clone());
            let bytes = match cached {
                Some(b) => b,
                None => {
                    let mut v = vec![0u8; p.ext_len as usize];
                    read_extent(&p, &mut v, &label)?;
                    let b: Arc<[u8]> = v.into();
                    let mut c = lock(&self.read_cache);
                    if c.len() >= READ_CACHE {
                        c.pop_front();
                    }
                    c.push_back((key, b.clone()));
                    b
                }
            };
            let from = p.within as usize;
            dst.copy_from_slice(&bytes[from..from + p.len]);
        }
        Ok(total)
    }

    /// The extent pieces holding bytes `offset..offset + want` of sealed version `v` (cut at
    /// its end), their total length and the version's label for messages.
    fn plan(&self, v: VersionId, offset: u64, want: usize) -> Result<(Vec<Piece>, usize, String)> {
        {
            let g = lock(&self.state);
            let Some(ver) = g.m.versions.get(&v.0) else {
                return Err(invalid(format!(
                    "unknown version {v} (never staged, or reclaimed)"
                )));
            };
            if ver.seal.is_none() {
                return Err(invalid(format!("{}@{} is not sealed", ver.key, ver.stamp)));
            }
            if offset >= ver.size || want == 0 {
                return Ok((Vec::new(), 0, String::new()));
            }
            let end = ver.size.min(offset + want as u64);
            let mut pieces = Vec::new();
            let mut pos = offset;
            let first = ver
                .views
                .range(..=offset)
                .next_back()
                .map_or(offset, |(&s, _)| s);
            for (&s, view) in ver.views.range(first..end) {
                if s + view.len <= pos {
                    continue;
                }
                if s > pos {
                    break;
                }
                let e = &ver.extents[view.ext];
                let Some(file) = g.m.arenas.get(&e.arena).and_then(|a| a.file.clone()) else {
                    return Err(invalid(format!(
                        "{}@{}: {} was reclaimed",
                        ver.key,
                        ver.stamp,
                        arena_name(e.arena)
                    )));
                };
                let to = end.min(s + view.len);
                pieces.push(Piece {
                    file,
                    arena: e.arena,
                    position: e.position,
                    ext_len: e.len,
                    crc: e.crc,
                    within: view.skip + (pos - s),
                    len: (to - pos) as usize,
                    at: (pos - offset) as usize,
                });
                pos = to;
                if pos >= end {
                    break;
                }
            }
            if pos < end {
                return Err(Error::Corrupt {
                    what: format!(
                        "{}@{}: no extent holds byte {pos} of the sealed version",
                        ver.key, ver.stamp
                    ),
                });
            }
            Ok((
                pieces,
                (end - offset) as usize,
                format!("{}@{}", ver.key, ver.stamp),
            ))
        }
    }

    /// Sealed versions that are neither drained nor superseded, oldest seal first.
    pub fn drainable(&self) -> Vec<VersionInfo> {
        lock(&self.state).m.drainable()
    }

    /// Whether `v` is known and neither drained nor superseded: still being received, or
    /// sealed and waiting to drain.
    pub fn is_live(&self, v: VersionId) -> bool {
        lock(&self.state)
            .m
            .versions
            .get(&v.0)
            .is_some_and(|x| !x.drained && !x.superseded)
    }

    /// Records (and syncs) that `v` is in the durable store; its extents become garbage
    /// and every rotated arena left with no live byte is deleted.
    pub fn mark_drained(&self, v: VersionId) -> Result<()> {
        {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            let Some(ver) = g.m.versions.get(&v.0) else {
                return Err(invalid(format!(
                    "unknown version {v} (never staged, or reclaimed)"
                )));
            };
            if ver.seal.is_none() {
                return Err(invalid(format!(
                    "{}@{} cannot be drained: it is not sealed",
                    ver.key, ver.stamp
                )));
            }
            if !ver.drained {
                let rec = Record::Drained { id: v.0 };
                let garbage = g.m.apply(&rec);
                let seq = g.queue(&rec);
                for id in garbage {
                    g.deferred.push_back((seq, Deferred::Release(id)));
                }
            }
        }
        self.sync()
    }

    /// Records a checkpoint manifest (pending until the next sync); returns its id. The
    /// same checkpoint name again replaces the older manifest.
    pub fn record_manifest(&self, m: Manifest) -> Result<u64> {
        let strings_ok = !m.checkpoint.is_empty()
            && record::valid_str_len(&m.checkpoint)
            && m.files.iter().all(|f| record::valid_str_len(&f.path));
        if !strings_ok {
            return Err(invalid(format!(
                "manifest of {:?}: the checkpoint name must be 1 to 65535 bytes and every path at most 65535",
                m.checkpoint
            )));
        }
        let len = model::manifest_record(0, &m).framed_len() - record::FRAME_LEN;
        if len > record::MAX_BODY {
            return Err(invalid(format!(
                "manifest of {}: {} files take {len} bytes, more than the index's {}-byte record limit",
                m.checkpoint,
                m.files.len(),
                record::MAX_BODY
            )));
        }
        loop {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            if g.m.next_manifest < g.manifests_durable {
                let id = g.m.next_manifest;
                let rec = model::manifest_record(id, &m);
                g.m.apply(&rec);
                g.queue(&rec);
                return Ok(id);
            }
            g.queue_reserve();
            drop(g);
            self.sync()?;
        }
    }

    /// Manifests not yet marked done, oldest first.
    pub fn pending_manifests(&self) -> Vec<(u64, Manifest)> {
        lock(&self.state)
            .m
            .manifests
            .iter()
            .filter(|(_, (_, done))| !done)
            .map(|(&id, (m, _))| (id, m.clone()))
            .collect()
    }

    /// None = unknown checkpoint; Some(false) = recorded, marker not yet written;
    /// Some(true) = done.
    pub fn manifest_state(&self, checkpoint: &str) -> Option<bool> {
        lock(&self.state).m.manifest_state(checkpoint)
    }

    /// Records (and syncs) that the manifest's marker was written.
    pub fn mark_manifest_done(&self, id: u64) -> Result<()> {
        {
            let mut g = lock(&self.state);
            g.check_poisoned()?;
            let Some((_, done)) = g.m.manifests.get(&id) else {
                return Err(invalid(format!("unknown manifest {id}")));
            };
            if !done {
                let rec = Record::ManifestDone { id };
                g.m.apply(&rec);
                g.queue(&rec);
            }
        }
        self.sync()
    }

    pub fn usage(&self) -> Usage {
        let g = lock(&self.state);
        Usage {
            arena_files: g.m.arenas.len() as u64,
            arena_bytes: g.arena_bytes,
            capacity: self.opts.capacity,
            live_versions: g.m.live_versions(),
            pending_bytes: g.m.pending_bytes,
            index_bytes: g.index_len,
            manifests_held: g.m.manifests.len() as u64,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Step 7 and 8 of recovery: deletes arenas with no live byte, opens the others (an arena
/// that is missing or too short loses its versions, with a warning), and deletes arena
/// files the state does not know.
fn recover_arenas(
    dir: &Path,
    m: &mut Model,
    on_disk: &[u32],
    warnings: &mut Vec<String>,
) -> Result<()> {
    // Bytes each arena must hold for the extents that will be read from it.
    let mut need: HashMap<u32, u64> = HashMap::new();
    for v in m.versions.values() {
        for e in v.extents.iter().filter(|e| e.useful) {
            let end = e.position + u64::from(e.len);
            let n = need.entry(e.arena).or_insert(0);
            *n = (*n).max(end);
        }
    }
    loop {
        let mut changed = false;
        let numbers: Vec<u32> = m.arenas.keys().copied().collect();
        for n in numbers {
            let Some(a) = m.arenas.get(&n) else { continue };
            if a.live == 0 {
                m.delete_arena(n);
                changed = true;
                continue;
            }
            if a.file.is_some() {
                continue;
            }
            let path = dir.join(arena_name(n));
            let opened = File::open(&path).and_then(|f| {
                let len = f.metadata()?.len();
                Ok((f, len))
            });
            let want = need.get(&n).copied().unwrap_or(0);
            let problem = match opened {
                Ok((f, len)) if len >= want => {
                    if let Some(a) = m.arenas.get_mut(&n) {
                        a.file = Some(Arc::new(f));
                        a.size = len;
                    }
                    None
                }
                Ok((_, len)) => Some(format!("is {len} bytes but its extents need {want}")),
                Err(e) => Some(format!("cannot be opened: {e}")),
            };
            if let Some(problem) = problem {
                let lost = m.arenas.get(&n).map_or(0, |a| a.refs.len());
                warnings.push(format!(
                    "{}: {problem}; dropped the {lost} version(s) with data in it",
                    path.display()
                ));
                m.delete_arena(n);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for &n in on_disk {
        if !m.arenas.contains_key(&n) {
            let path = dir.join(arena_name(n));
            std::fs::remove_file(&path)
                .map_err(|e| io_err(format!("remove {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// Opens `path` for writing with O_DIRECT (creating it if `create`).
fn open_direct(path: &Path, create: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .create_new(create)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Whether arenas in `dir` can be written with O_DIRECT in BLOCK units: a probe file opened
/// with O_DIRECT must report (statx STATX_DIOALIGN) memory and offset alignments that divide
/// BLOCK, and take one aligned block. tmpfs, for one, reports no direct I/O alignment.
fn probe_direct(dir: &Path) -> IoMode {
    let path = dir.join(DIRECT_PROBE);
    let _ = std::fs::remove_file(&path);
    let res = (|| -> std::result::Result<(), String> {
        let f = open_direct(&path, true).map_err(|e| format!("open with O_DIRECT: {e}"))?;
        // SAFETY: an all-zero statx is a valid value of this plain C struct.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is owned by `f`, open for the call; the empty path is a
        // NUL-terminated static string; `st` is a valid, writable statx.
        let rc = unsafe {
            libc::statx(
                f.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_DIOALIGN,
                &mut st,
            )
        };
        if rc != 0 {
            return Err(format!("statx: {}", io::Error::last_os_error()));
        }
        let (mem, off) = (
            st.stx_dio_mem_align as usize,
            st.stx_dio_offset_align as usize,
        );
        if st.stx_mask & libc::STATX_DIOALIGN == 0 || mem == 0 || off == 0 {
            return Err("the file system reports no O_DIRECT alignment".into());
        }
        if BLOCK % mem != 0 || BLOCK % off != 0 {
            return Err(format!(
                "O_DIRECT needs {mem}-byte memory and {off}-byte offset alignment, more than {BLOCK}"
            ));
        }
        let mut b = Bounce::new(BLOCK);
        f.write_all_at(b.window(BLOCK), 0)
            .map_err(|e| format!("an O_DIRECT write: {e}"))?;
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    match res {
        Ok(()) => IoMode::Direct,
        Err(why) => IoMode::Buffered(format!("O_DIRECT refused in {}: {why}", dir.display())),
    }
}

/// Starts the writeback of bytes `pos..pos + len` of `file` now (SYNC_FILE_RANGE_WRITE: it
/// does not wait for them), so that dirty pages do not pile up for the next Sync's
/// fdatasync to write all at once. Advisory: a failure shows at that fdatasync.
fn start_writeback(file: &File, pos: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(pos), Ok(len)) = (i64::try_from(pos), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range only reads its integer arguments; the descriptor is owned by
    // `file`, open for the duration of the call.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), pos, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Reads a whole extent into `dst` (its length) and checks its crc32c.
fn read_extent(p: &Piece, dst: &mut [u8], label: &str) -> Result<()> {
    let name = arena_name(p.arena);
    p.file.read_exact_at(dst, p.position).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::Corrupt {
                what: format!(
                    "arena {name} at {}: file ends inside a {}-byte extent of {label}",
                    p.position, p.ext_len
                ),
            }
        } else {
            io_err(format!("read {name} at {}", p.position), e)
        }
    })?;
    let got = crc32c::crc32c(dst);
    if got != p.crc {
        return Err(Error::Corrupt {
            what: format!(
                "arena {name} at {}: checksum mismatch (index says {:#010x}, data {got:#010x}) in a {}-byte extent of {label}",
                p.position, p.crc, p.ext_len
            ),
        });
    }
    Ok(())
}

/// A fresh index (header only), created under a temporary name and renamed, so index.log
/// never exists without its header.
fn create_index(dir: &Path) -> io::Result<()> {
    let tmp = dir.join(INDEX_TMP);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all_at(&record::header(), 0)?;
    f.sync_data()?;
    std::fs::rename(&tmp, dir.join(INDEX))?;
    fsync_dir(dir)
}
