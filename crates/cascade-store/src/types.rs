//! Public value types of the store API.

use std::path::PathBuf;

/// How the data region's memory is faulted in when a store is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// Fault every page before `create` returns (a checkpoint write never faults).
    Foreground,
    /// Return at once; a background thread of the creating process faults the pages in.
    /// Writes that race ahead of it take the faults themselves (correct, just slower).
    Background,
    /// Leave pages to be faulted on first write (tests, tiny stores).
    Off,
}

/// Where spilled chunks go once memory chunks run out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillConfig {
    /// A file on local SSD; created and reserved with fallocate at store creation.
    pub path: PathBuf,
    /// Bytes to reserve; rounded down to whole chunks.
    pub size: u64,
}

/// Parameters fixed when a store is created (they are recorded in the block's header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// POSIX shared-memory object name, e.g. "/cascade-1000".
    pub name: String,
    /// Bytes of memory for file data; rounded down to whole chunks.
    pub capacity: u64,
    /// Chunk size in bytes: a power of two, 4 KiB ..= 64 MiB.
    pub chunk_size: u64,
    /// Maximum number of files plus directories (the root counts as one).
    pub max_files: u32,
    pub spill: Option<SpillConfig>,
    pub prefault: Prefault,
}

/// Nanoseconds since the Unix epoch.
pub type TimeNs = i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
}

/// What `stat` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits only (no file-type bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: TimeNs,
    pub mtime: TimeNs,
    pub ctime: TimeNs,
    /// Names the file has: 1 (2 for a directory), 0 once unlinked while still open.
    pub links: u32,
    /// Chunks of this file held in memory / in the spill file.
    pub chunks_in_memory: u64,
    pub chunks_spilled: u64,
    pub chunk_size: u64,
    /// The content is only in a level below (listed from there, or evicted from memory):
    /// reads fail until read-through fetches it.
    pub remote: bool,
}

impl Metadata {
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
    /// Bytes of storage the file occupies (what `st_blocks * 512` should report).
    pub fn allocated_bytes(&self) -> u64 {
        (self.chunks_in_memory + self.chunks_spilled) * self.chunk_size
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: FileKind,
}

/// Where one chunk of a file lives (the paper's get_chunk_meta_list entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkLocation {
    /// In the shared-memory data region, at this byte offset from the region's start.
    Memory { offset: u64 },
    /// In the spill file, at this byte offset.
    Spill { offset: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    /// Logical chunk number within the file (file offset / chunk size).
    pub index: u64,
    /// Physical chunk id in the store.
    pub chunk_id: u32,
    pub location: ChunkLocation,
    /// Bytes of file data in this chunk (chunk size, less at end of file).
    pub length: u64,
}

/// What one piece of a file mapping maps (see `File::map_sources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapSource {
    /// Bytes of the shared-memory object at this offset.
    Shm { offset: u64, len: u64 },
    /// Bytes of the spill file at this offset.
    Spill { offset: u64, len: u64 },
    /// A hole (or past the end of file): anonymous zero pages.
    Zeros { len: u64 },
}

/// The memory data region of a store, as mapped in this process.
#[derive(Debug, Clone, Copy)]
pub struct DataRegion {
    pub addr: *mut u8,
    pub len: usize,
}

/// Why the last write failed with ENOSPC (kept in the block for `cascade status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnospcRecord {
    pub time: TimeNs,
    pub pid: u32,
    pub reason: String,
}

/// A snapshot of the store's occupancy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    pub block_bytes: u64,
    pub chunk_size: u64,
    pub memory_capacity: u64,
    pub memory_used: u64,
    pub spill_path: Option<PathBuf>,
    pub spill_capacity: u64,
    pub spill_used: u64,
    /// Free chunks held in per-process batches (not yet used, not in the shared pool).
    pub leased_bytes: u64,
    pub files: u64,
    pub dirs: u64,
    pub max_files: u64,
    pub map_nodes_used: u64,
    pub map_nodes_total: u64,
    pub attached_pids: Vec<u32>,
    pub created: TimeNs,
    /// Bytes of the data region faulted in so far (equals capacity once prefault is done).
    pub prefaulted_bytes: u64,
    pub last_enospc: Option<EnospcRecord>,
}

/// Result of `Store::fsck`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// Violated invariants (corruption): a clean store has none.
    pub errors: Vec<String>,
    /// Recoverable leftovers of crashes (leaked chunks, dead leases).
    pub warnings: Vec<String>,
    /// What `repair` fixed.
    pub repaired: Vec<String>,
    pub files: u64,
    pub dirs: u64,
    pub chunks_used: u64,
    pub chunks_free: u64,
    pub chunks_leased: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}
