//! The public API: [`Store`] (an attached block) and [`File`] (an open file in it).

use crate::alloc::EnospcReason;
use crate::block::{process_alive, Block};
use crate::error::{Error, Result};
use crate::file::{OneChunkRead, OneChunkWrite, WriteLimits};
use crate::layout::*;
use crate::lock::LockHolder;
use crate::namespace::parse_path;
use crate::types::*;
use crate::OpenOptions;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// The environment variable that bounds a read-through request ([`Store::fetch_timeout`]).
pub const FETCH_TIMEOUT_ENV: &str = "CASCADE_FETCH_TIMEOUT";

/// A node store attached in this process. Cheap to clone; detaches when the last clone and
/// the last [`File`] are dropped (the block itself lives on until destroyed).
#[derive(Clone)]
pub struct Store {
    block: Arc<Block>,
}

impl Drop for Block {
    fn drop(&mut self) {
        // Mapping the rest of the block into a process that is detaching is wasted work;
        // the creator's prefault (allocating the pages) still runs to its end.
        self.stop_populate
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.wait_prefault();
        let _ = self.sync_spill();
        self.release_lease();
    }
}

fn kind(state: u32) -> FileKind {
    if is_dir_state(state) {
        FileKind::Dir
    } else {
        FileKind::File
    }
}

impl Store {
    /// Creates a new store; EEXIST if one with this name exists.
    pub fn create(cfg: &StoreConfig) -> Result<Store> {
        Ok(Store {
            block: Arc::new(Block::create(cfg)?),
        })
    }

    /// Attaches an existing store.
    pub fn attach(name: &str) -> Result<Store> {
        Ok(Store {
            block: Arc::new(Block::attach(name)?),
        })
    }

    /// Attaches the store if it exists (its parameters must match `cfg`), else creates it.
    pub fn attach_or_create(cfg: &StoreConfig) -> Result<Store> {
        match Store::attach(&cfg.name) {
            Ok(store) => {
                let have = store.config();
                let spill_differs = match (&have.spill, &cfg.spill) {
                    (None, None) => false,
                    (Some(a), Some(b)) => {
                        a.path != b.path || a.size != b.size / cfg.chunk_size * cfg.chunk_size
                    }
                    (None, Some(b)) => b.size >= cfg.chunk_size,
                    (Some(_), None) => true,
                };
                if have.chunk_size != cfg.chunk_size
                    || have.capacity != cfg.capacity / cfg.chunk_size.max(1) * cfg.chunk_size
                    || have.max_files != cfg.max_files
                    || spill_differs
                {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!(
                            "store {} exists with different parameters (capacity {}, chunk size {}, max files {}); destroy it first or use its parameters",
                            cfg.name, have.capacity, have.chunk_size, have.max_files
                        ),
                    ));
                }
                Ok(store)
            }
            Err(e) if e.errno() == libc::ENOENT => match Store::create(cfg) {
                // Someone else created it in between: attach to theirs.
                Err(e) if e.errno() == libc::EEXIST => Store::attach(&cfg.name),
                other => other,
            },
            Err(e) => Err(e),
        }
    }

    /// Removes the store and its spill file. EBUSY while live processes are attached.
    pub fn destroy(name: &str) -> Result<()> {
        Block::destroy(name, false)
    }

    /// Removes the store even if processes are attached (their mappings stay valid until
    /// they exit, but nobody new can attach).
    pub fn destroy_forced(name: &str) -> Result<()> {
        Block::destroy(name, true)
    }

    /// Directory of the lock files the interposition library keeps for this store's files
    /// (so flock/fcntl locks get kernel semantics); removed by `destroy`.
    pub fn lock_dir(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/dev/shm/{}.locks", name.trim_start_matches('/')))
    }

    /// Records that a lock file is about to be made for a file of this store (before it is
    /// made), so that removals look for lock files from then on.
    pub fn note_lock_file(&self) {
        let flag = &self.block.header().lock_files;
        if flag.load(Relaxed) == 0 {
            flag.store(1, Release);
        }
    }

    /// False while no lock file was ever made for a file of this store: a removal then has
    /// none to delete (docs/store-layout.md, `lock_files`).
    pub fn may_have_lock_files(&self) -> bool {
        self.block.header().lock_files.load(Acquire) != 0
    }

    /// The node agent's control socket (docs/agent.md): read-through requests.
    pub fn agent_socket_path(name: &str) -> std::path::PathBuf {
        Self::lock_dir(name).join("agent.sock")
    }

    /// How long a read-through request may wait for the node agent without a byte moving:
    /// `CASCADE_FETCH_TIMEOUT` in seconds (a decimal number; 0: None, no limit), else, or
    /// when unreadable, 300 s (a large file takes as long as the link needs). For every
    /// client of the control socket: the preload library and the Python package.
    pub fn fetch_timeout() -> Option<std::time::Duration> {
        const DEFAULT: std::time::Duration = std::time::Duration::from_secs(300);
        let Ok(text) = std::env::var(FETCH_TIMEOUT_ENV) else {
            return Some(DEFAULT);
        };
        match text.trim().parse::<f64>() {
            Ok(0.0) => None,
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => {
                // At least a microsecond: a zero timeval would mean "no timeout".
                Some(std::time::Duration::from_secs_f64(s).max(std::time::Duration::from_micros(1)))
            }
            _ => Some(DEFAULT),
        }
    }

    /// The error text of a read-through request that got no answer within `timeout`.
    pub fn fetch_timed_out(timeout: Option<std::time::Duration>) -> String {
        format!(
            "read-through: the node agent did not answer within {} s ({FETCH_TIMEOUT_ENV}; is it hung?)",
            timeout.map_or(0.0, |t| t.as_secs_f64())
        )
    }

    pub fn exists(name: &str) -> bool {
        match std::ffi::CString::new(name) {
            Ok(c) => {
                // SAFETY: valid C string; the fd is closed right away.
                let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDONLY, 0) };
                if fd >= 0 {
                    // SAFETY: fd was just opened by us.
                    unsafe { libc::close(fd) };
                }
                fd >= 0
            }
            Err(_) => false,
        }
    }

    pub fn name(&self) -> &str {
        &self.block.name
    }

    pub fn chunk_size(&self) -> u64 {
        self.block.geo.chunk_size
    }

    /// The parameters recorded in the block's header.
    pub fn config(&self) -> StoreConfig {
        let g = &self.block.geo;
        StoreConfig {
            name: self.block.name.clone(),
            capacity: g.mem_chunks as u64 * g.chunk_size,
            chunk_size: g.chunk_size,
            max_files: g.max_inodes,
            spill: self.block.spill.as_ref().map(|s| SpillConfig {
                path: s.path.clone(),
                size: g.spill_chunks as u64 * g.chunk_size,
            }),
            prefault: if self.block.header().prefaulted.load(Relaxed) > 0 {
                Prefault::Foreground
            } else {
                Prefault::Off
            },
        }
    }

    /// Largest file size this store allows.
    pub fn max_file_size(&self) -> u64 {
        self.block.geo.max_file_bytes()
    }

    pub fn spill_path(&self) -> Option<PathBuf> {
        self.block.spill.as_ref().map(|s| s.path.clone())
    }

    /// Blocks until this process's prefault/populate threads are done.
    pub fn wait_prefault(&self) {
        self.block.wait_prefault();
    }

    /// Maps the store's memory into this process now and blocks until that is done (the
    /// populate otherwise starts in the background at the first data access). For a
    /// process about to time its writes.
    pub fn map_in(&self) {
        self.block.will_touch_data();
        self.block.wait_prefault();
    }

    /// Starts mapping the store's memory into this process in the background, as the first
    /// data access would, without waiting: for a process that will write checkpoints soon
    /// (the job `cascade run` started), so that its first one finds its chunks mapped.
    pub fn start_map_in(&self) {
        self.block.will_touch_data();
    }

    /// Bytes of the store this process maps in huge pages (`ShmemPmdMapped` of the block's
    /// mapping in /proc/self/smaps); None if that cannot be read. Zero where /dev/shm gives
    /// only 4 KiB pages, which makes a process's first writes pay for its page tables
    /// (docs/store-layout.md, "Memory and faults").
    pub fn huge_page_bytes(&self) -> Option<u64> {
        let g = &self.block.geo;
        let block = self.block.base as u64;
        let block_end = block + g.off.data + g.mem_chunks as u64 * g.chunk_size;
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        // The block is several mappings (MADV_HUGEPAGE on the data region splits it): sum
        // the field over every mapping inside it.
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((start, _)) = first.split_once('-') {
                inside = u64::from_str_radix(start, 16).is_ok_and(|a| a >= block && a < block_end);
            } else if let Some(value) = line.strip_prefix("ShmemPmdMapped:").filter(|_| inside) {
                kib += value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()?;
            }
        }
        Some(kib << 10)
    }

    pub fn data_region(&self) -> DataRegion {
        self.block.will_touch_data();
        let g = &self.block.geo;
        DataRegion {
            addr: self.block.data_ptr(),
            len: (g.mem_chunks as u64 * g.chunk_size) as usize,
        }
    }

    // ---- namespace ------------------------------------------------------------------------

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let b = &self.block;
        let _g = b.lock_ns_entries()?;
        let (parent, name) = b.resolve_parent(path)?;
        let name = name.ok_or_else(|| Error::new(libc::EEXIST, path.to_string()))?;
        if b.lookup(parent, name)?.is_some() {
            return Err(Error::new(libc::EEXIST, path.to_string()));
        }
        b.create_inode(parent, name, INODE_DIR, mode).map(|_| ())
    }

    pub fn create_dir_all(&self, path: &str, mode: u32) -> Result<()> {
        let comps = parse_path(path)?;
        let mut prefix = String::new();
        for c in comps {
            prefix.push('/');
            prefix.push_str(c);
            match self.mkdir(&prefix, mode) {
                Ok(()) => {}
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.stat(&prefix)?.is_dir() {
                        return Err(Error::new(libc::ENOTDIR, prefix));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn open(&self, path: &str, opts: &OpenOptions) -> Result<File> {
        let b = &self.block;
        let writable = opts.write || opts.append;
        // The generation is read under the namespace lock: once that is released, the name may
        // be removed and its inode reused by another file.
        let (ino, gen, counts_writer) = {
            let early = b.resolve_parent_early(path);
            if let Some(e) = &early {
                b.prefetch_for(e, opts.create || opts.create_new);
            }
            // Creates an entry at most: lock-free lookups need not retry.
            let _g = b.lock_ns_entries()?;
            let (parent, name) = b.resolve_parent_with(path, early)?;
            let existing = match name {
                None => Some(parent),
                Some(n) => b.lookup(parent, n)?,
            };
            // "name/" names a directory: creating with it is EISDIR (even when the directory
            // exists, as on Linux), and an existing file is ENOTDIR.
            if path.ends_with('/') {
                let is_dir = existing.is_some_and(|i| b.inode(i).state.load(Acquire) == INODE_DIR);
                if opts.create || opts.create_new {
                    return Err(Error::new(libc::EISDIR, path.to_string()));
                }
                if existing.is_some() && !is_dir {
                    return Err(Error::new(libc::ENOTDIR, path.to_string()));
                }
            }
            if opts.directory {
                match existing {
                    Some(i) if b.inode(i).state.load(Acquire) != INODE_DIR => {
                        return Err(Error::new(libc::ENOTDIR, path.to_string()))
                    }
                    None if !(opts.create || opts.create_new) => {
                        return Err(Error::new(libc::ENOENT, path.to_string()))
                    }
                    _ => {}
                }
            }
            let ino = match (existing, name) {
                (Some(_), _) if opts.create_new => {
                    return Err(Error::new(libc::EEXIST, path.to_string()))
                }
                (Some(ino), _) => {
                    if b.inode(ino).state.load(Acquire) == INODE_DIR
                        && (writable || opts.truncate || opts.create)
                    {
                        return Err(Error::new(libc::EISDIR, path.to_string()));
                    }
                    ino
                }
                (None, Some(n)) if opts.create || opts.create_new => {
                    b.create_inode(parent, n, INODE_FILE, opts.mode)?
                }
                _ => return Err(Error::new(libc::ENOENT, path.to_string())),
            };
            // The writer before the new version (see describe_open).
            let counts_writer = writable && !opts.described;
            if counts_writer {
                b.add_writer(ino);
            }
            if writable || opts.truncate {
                b.begin_modify(ino);
            }
            (ino, b.inode(ino).gen.load(Acquire), counts_writer)
        };
        let file = File::new(&self.block, ino, gen, writable, opts.append, counts_writer);
        // Like Linux, O_TRUNC truncates even a read-only open.
        if opts.truncate {
            let _g = b.lock_inode(ino)?;
            file.check_file()?;
            b.set_len_locked(ino, 0)?;
        }
        Ok(file)
    }

    pub fn stat(&self, path: &str) -> Result<Metadata> {
        let b = &self.block;
        b.read_namespace(|seen| {
            b.resolve_probed(path, seen)
                .map(|ino| self.metadata_of(ino))
        })
    }

    /// Metadata and generation of inode `ino` if it is in use (a file, a directory, or one
    /// removed while still open): the FUSE front end addresses files by inode number.
    pub fn stat_inode(&self, ino: u64) -> Result<(Metadata, u32)> {
        let b = &self.block;
        let _g = b.lock_ns_entries()?;
        let gone = || Error::new(libc::ENOENT, format!("inode {ino} is not in use"));
        let n = u32::try_from(ino)
            .ok()
            .filter(|&n| n < b.geo.max_inodes)
            .ok_or_else(gone)?;
        if b.inode(n).state.load(Acquire) == INODE_FREE {
            return Err(gone());
        }
        Ok((self.metadata_of(n), b.inode(n).gen.load(Acquire)))
    }

    /// A store path that names inode `ino` of generation `gen` directly and then `rel` below
    /// it ("" for the inode itself); it stays right across renames, and gives ENOENT once
    /// that incarnation is gone.
    pub fn inode_path(ino: u64, gen: u32, rel: &str) -> String {
        let anchor = crate::namespace::ANCHOR;
        if rel.is_empty() {
            format!("{anchor}{ino}:{gen}")
        } else {
            format!("{anchor}{ino}:{gen}/{rel}")
        }
    }

    fn metadata_of(&self, ino: u32) -> Metadata {
        let i = self.block.inode(ino);
        let (mtime, ctime) = self.block.file_times(ino);
        Metadata {
            ino: ino as u64,
            kind: kind(i.state.load(Acquire)),
            size: i.size.load(Acquire),
            mode: i.mode.load(Relaxed),
            uid: i.uid.load(Relaxed),
            gid: i.gid.load(Relaxed),
            atime: i.atime.load(Relaxed),
            mtime,
            ctime,
            links: match i.state.load(Acquire) {
                INODE_DIR => 2,
                INODE_ORPHAN | INODE_ORPHAN_DIR => 0,
                _ => 1,
            },
            chunks_in_memory: i.chunks_mem.load(Relaxed) as u64,
            chunks_spilled: i.chunks_spill.load(Relaxed) as u64,
            chunk_size: self.block.geo.chunk_size,
            remote: i.life.load(Acquire) & LIFE_REMOTE != 0,
        }
    }

    pub fn read_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let b = &self.block;
        let _g = b.lock_ns_entries()?;
        let ino = b.resolve(path)?;
        if !is_dir_state(b.inode(ino).state.load(Acquire)) {
            return Err(Error::new(libc::ENOTDIR, path.to_string()));
        }
        b.list_dir_checked(ino)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let _g = self.block.lock_ns()?;
        self.block.rename_locked(from, to)
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        let b = &self.block;
        let early = b.resolve_parent_early(path);
        if let Some(e) = &early {
            b.prefetch_for(e, false);
        }
        // Removes a file only, marking the stripes of the name index it changes.
        let _g = b.lock_ns_entries()?;
        let (parent, name) = b.resolve_parent_with(path, early)?;
        let name = name.ok_or_else(|| Error::new(libc::EISDIR, path.to_string()))?;
        let ino = b
            .lookup(parent, name)?
            .ok_or_else(|| Error::new(libc::ENOENT, path.to_string()))?;
        if b.inode(ino).state.load(Acquire) == INODE_DIR {
            return Err(Error::new(libc::EISDIR, path.to_string()));
        }
        if path.ends_with('/') {
            return Err(Error::new(libc::ENOTDIR, path.to_string()));
        }
        b.remove_inode(parent, ino)
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        let b = &self.block;
        let _g = b.lock_ns()?;
        let (parent, name) = b.resolve_parent(path)?;
        let name =
            name.ok_or_else(|| Error::new(libc::EBUSY, "cannot remove the root directory"))?;
        let ino = b
            .lookup(parent, name)?
            .ok_or_else(|| Error::new(libc::ENOENT, path.to_string()))?;
        let inode = b.inode(ino);
        if inode.state.load(Acquire) != INODE_DIR {
            return Err(Error::new(libc::ENOTDIR, path.to_string()));
        }
        if inode.first_child.load(Relaxed) != NIL {
            return Err(Error::new(libc::ENOTEMPTY, path.to_string()));
        }
        b.remove_inode(parent, ino)
    }

    pub fn truncate(&self, path: &str, len: u64) -> Result<()> {
        self.open(path, &OpenOptions::new().write(true))?
            .set_len(len)
    }

    /// Runs `f` on the inode at `path` under the namespace lock (attribute changes).
    fn with_inode(&self, path: &str, f: impl FnOnce(&Inode)) -> Result<()> {
        let b = &self.block;
        let _g = b.lock_ns()?;
        let ino = b.resolve(path)?;
        let inode = b.inode(ino);
        f(inode);
        inode.ctime.store(crate::block::now_ns(), Relaxed);
        Ok(())
    }

    pub fn set_mode(&self, path: &str, mode: u32) -> Result<()> {
        self.with_inode(path, |i| i.mode.store(mode & 0o7777, Relaxed))
    }

    pub fn set_owner(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        self.with_inode(path, |i| {
            if let Some(u) = uid {
                i.uid.store(u, Relaxed);
            }
            if let Some(g) = gid {
                i.gid.store(g, Relaxed);
            }
        })
    }

    pub fn set_times(
        &self,
        path: &str,
        atime: Option<TimeNs>,
        mtime: Option<TimeNs>,
    ) -> Result<()> {
        self.with_inode(path, |i| {
            if let Some(t) = atime {
                i.atime.store(t, Relaxed);
            }
            if let Some(t) = mtime {
                i.mtime.store(explicit_time(t), Relaxed);
            }
        })
    }

    pub fn chunk_list(&self, path: &str) -> Result<Vec<ChunkInfo>> {
        self.open(path, &OpenOptions::new())?.chunk_list()
    }

    // ---- status and verification ----------------------------------------------------------

    /// A snapshot of occupancy (no locks taken: numbers may lag a concurrent writer).
    pub fn status(&self) -> Status {
        let b = &self.block;
        let g = &b.geo;
        let h = b.header();
        let (mut mem_used, mut spill_used, mut leased_chunks) = (0u64, 0u64, 0u64);
        for (c, st) in b.chunk_states().iter().enumerate() {
            match state_tag(st.load(Relaxed)) {
                TAG_USED if b.is_spill(c as u32) => spill_used += 1,
                TAG_USED => mem_used += 1,
                TAG_LEASED => leased_chunks += 1,
                _ => {}
            }
        }
        let (mut files, mut dirs) = (0, 0);
        for ino in 0..g.max_inodes {
            match b.inode(ino).state.load(Relaxed) {
                INODE_FILE => files += 1,
                INODE_DIR => dirs += 1,
                _ => {}
            }
        }
        let map_nodes_used = b
            .node_states()
            .iter()
            .filter(|s| s.load(Relaxed) != 0)
            .count() as u64;
        let mut attached_pids = Vec::new();
        for s in 0..g.lease_slots {
            let slot = b.lease_slot(s);
            let pid = slot.pid.load(Acquire);
            if pid != 0 && process_alive(pid, slot.start_time.load(Relaxed)) {
                attached_pids.push(pid);
            }
        }
        let last_enospc =
            EnospcReason::from_code(h.enospc_reason.load(Acquire)).map(|r| EnospcRecord {
                time: h.enospc_time.load(Relaxed),
                pid: h.enospc_pid.load(Relaxed),
                reason: r.describe().to_string(),
            });
        Status {
            name: b.name.clone(),
            block_bytes: g.block_size,
            chunk_size: g.chunk_size,
            memory_capacity: g.mem_chunks as u64 * g.chunk_size,
            memory_used: mem_used * g.chunk_size,
            spill_path: self.spill_path(),
            spill_capacity: g.spill_chunks as u64 * g.chunk_size,
            spill_used: spill_used * g.chunk_size,
            leased_bytes: leased_chunks * g.chunk_size,
            files,
            dirs,
            max_files: g.max_inodes as u64,
            map_nodes_used,
            map_nodes_total: g.map_nodes as u64,
            attached_pids,
            created: h.created_ns,
            prefaulted_bytes: h.prefaulted.load(Acquire),
            last_enospc,
        }
    }

    /// Checks every invariant of the block (see docs/store-layout.md); with `repair`, frees
    /// what crashes leaked. Takes the store's locks in turn, so it can run beside writers.
    pub fn fsck(&self, repair: bool) -> Result<FsckReport> {
        if repair {
            // Descriptions of dead processes first: a writer killed with its file open, whose
            // file was removed since, is an orphan nobody else would ever free.
            self.sweep_descriptions();
        }
        crate::fsck::run(&self.block, repair)
    }

    /// Files and directories removed while still open (orphans): freed when their last
    /// description closes, or by a sweep once their holders died.
    pub fn orphans(&self) -> usize {
        let b = &self.block;
        (0..b.geo.max_inodes)
            .filter(|&i| {
                matches!(
                    b.inode(i).state.load(Acquire),
                    INODE_ORPHAN | INODE_ORPHAN_DIR
                )
            })
            .count()
    }

    /// The descriptors `map_sources` offsets refer to: the shared-memory object and the
    /// spill file, valid in the calling process (opened again here if the store was
    /// attached by a vfork child, whose descriptors the parent does not have).
    pub fn map_fds(&self) -> Result<(i32, Option<i32>)> {
        self.block.map_fds()
    }

    #[inline]
    pub(crate) fn block(&self) -> &Block {
        &self.block
    }

    /// Gives this process's batch of free chunks back to the shared pool and frees its slot
    /// (what dropping the last handle does; for holders of a store that is never dropped,
    /// like the interposition library, at process exit).
    pub fn release_batch(&self) {
        self.block.release_lease();
    }

    /// For tests and tools: size of this process's mapping of the block.
    pub fn block_bytes(&self) -> usize {
        self.block.mapping_len()
    }
}

/// An open file of a [`Store`]. Dropping it ("close") makes spilled data durable.
pub struct File {
    block: Arc<Block>,
    ino: u32,
    gen: u32,
    writable: bool,
    append: bool,
    wrote_spill: AtomicBool,
    /// The chunk this handle last read (`Block::read_hinted`): process-local, so readers
    /// in many processes do not share a cache line.
    read_hint: AtomicU64,
    /// The memory chunk this handle last wrote through the short path, as `idx << 32 |
    /// chunk + 1` (the inode's hint word): process-local as `read_hint`, and only ever a
    /// chunk this process has mapped (mappings are never taken back).
    write_hint: AtomicU64,
    hot: HotAddresses,
    /// This handle is one of the inode's `writers` (a writable open not registered as an
    /// open file description); dropping it is the close that hands the file to the agent.
    counts_writer: bool,
}

/// What a handle's small writes and reads address in the block, worked out when the handle
/// is made (the block is never remapped): the fast paths load each from the handle instead
/// of deriving it on every call from the block's geometry, behind one more pointer
/// (docs/interposition.md, "What a small write costs").
struct HotAddresses {
    /// The handle's inode.
    inode: NonNull<Inode>,
    /// Description slot 0.
    ofds: NonNull<OfdSlot>,
    /// Chunk 0's state word.
    chunk_states: NonNull<AtomicU64>,
    /// Memory chunk 0's first byte in this process.
    data: NonNull<u8>,
    mem_chunks: u32,
    limits: WriteLimits,
}

// SAFETY: the addresses point into the block's shared mapping, which the handle's
// `Arc<Block>` keeps mapped; through them only atomics are used, and chunk bytes under the
// inode's lock, as through the block itself.
unsafe impl Send for HotAddresses {}
// SAFETY: as above.
unsafe impl Sync for HotAddresses {}

impl HotAddresses {
    fn of(block: &Block, ino: u32) -> HotAddresses {
        let first = |offset: u64| {
            // SAFETY: every region offset of the geometry lies inside the mapping.
            let p = unsafe { block.base.add(offset as usize) };
            NonNull::new(p).expect("the block's mapping is not at address 0")
        };
        HotAddresses {
            inode: NonNull::from(block.inode(ino)),
            ofds: first(block.geo.off.ofds).cast(),
            chunk_states: first(block.geo.off.chunk_states).cast(),
            data: first(block.geo.off.data),
            mem_chunks: block.geo.mem_chunks,
            limits: block.geo.write_limits(),
        }
    }

    #[inline(always)]
    fn inode(&self) -> &Inode {
        // SAFETY: the handle's inode (in range: `File::new`), in the mapping that outlives
        // `self`.
        unsafe { self.inode.as_ref() }
    }

    /// Description slot `slot`'s description if it is still the one claimed with `nonce`.
    #[inline(always)]
    fn description(&self, d: crate::OpenDescription) -> Option<crate::Description<'_>> {
        if d.slot >= OFD_SLOTS {
            return None;
        }
        // SAFETY: the region holds OFD_SLOTS slots (checked above), in the mapping.
        let slot = unsafe { &*self.ofds.as_ptr().add(d.slot as usize) };
        crate::Description::if_live(slot, d.nonce)
    }

    /// The state word of chunk `c`, which the caller checked to be a memory chunk.
    #[inline(always)]
    fn chunk_state(&self, c: u32) -> &AtomicU64 {
        // SAFETY: c < mem_chunks (the caller's check) <= the chunks the state region counts.
        unsafe { &*self.chunk_states.as_ptr().add(c as usize) }
    }

    /// Memory chunk `c`'s first byte, which the caller checked to be a memory chunk.
    #[inline(always)]
    fn memory_chunk(&self, c: u32) -> *mut u8 {
        // SAFETY: c < mem_chunks (the caller's check), so the chunk lies in the data region.
        unsafe {
            self.data
                .as_ptr()
                .add(c as usize * self.limits.chunk_size as usize)
        }
    }
}

impl File {
    fn new(
        block: &Arc<Block>,
        ino: u32,
        gen: u32,
        writable: bool,
        append: bool,
        counts_writer: bool,
    ) -> File {
        File {
            hot: HotAddresses::of(block, ino),
            block: block.clone(),
            ino,
            gen,
            writable,
            append,
            wrote_spill: AtomicBool::new(false),
            read_hint: AtomicU64::new(0),
            write_hint: AtomicU64::new(0),
            counts_writer,
        }
    }

    /// Checks that the file still exists (it may have been unlinked or replaced meanwhile).
    fn check_live(&self) -> Result<()> {
        self.live_state().map(|_| ())
    }

    /// The inode's state, if the file was not removed while open.
    #[inline]
    fn live_state(&self) -> Result<u32> {
        self.state_if_live(self.block.inode(self.ino))
    }

    /// [`Self::live_state`], given this handle's inode.
    #[inline(always)]
    fn state_if_live(&self, i: &Inode) -> Result<u32> {
        let state = i.state.load(Acquire);
        if state == INODE_FREE || i.gen.load(Acquire) != self.gen {
            return Err(removed_while_open());
        }
        Ok(state)
    }

    /// [`Self::check_live`], and not a directory: one load of the state (every write).
    #[inline]
    fn check_file(&self) -> Result<()> {
        if is_dir_state(self.live_state()?) {
            return Err(is_a_directory());
        }
        Ok(())
    }

    pub fn ino(&self) -> u64 {
        self.ino as u64
    }

    /// The incarnation of the inode this handle refers to.
    pub fn generation(&self) -> u32 {
        self.gen
    }

    /// chmod through an open handle (permission bits only).
    pub fn set_mode(&self, mode: u32) -> Result<()> {
        self.check_live()?;
        let i = self.block.inode(self.ino);
        i.mode.store(mode & 0o7777, Relaxed);
        i.ctime.store(crate::block::now_ns(), Relaxed);
        Ok(())
    }

    /// chown through an open handle.
    pub fn set_owner(&self, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        self.check_live()?;
        let i = self.block.inode(self.ino);
        if let Some(u) = uid {
            i.uid.store(u, Relaxed);
        }
        if let Some(g) = gid {
            i.gid.store(g, Relaxed);
        }
        i.ctime.store(crate::block::now_ns(), Relaxed);
        Ok(())
    }

    /// utimens through an open handle (None leaves a time unchanged).
    pub fn set_times(&self, atime: Option<TimeNs>, mtime: Option<TimeNs>) -> Result<()> {
        self.check_live()?;
        let i = self.block.inode(self.ino);
        if let Some(t) = atime {
            i.atime.store(t, Relaxed);
        }
        if let Some(t) = mtime {
            i.mtime.store(explicit_time(t), Relaxed);
        }
        i.ctime.store(crate::block::now_ns(), Relaxed);
        Ok(())
    }

    /// Where each chunk-sized piece of `[offset, offset + len)` can be mapped from, for
    /// mmap of a Cascade file. With `allocate`, holes inside the file are filled with
    /// zero chunks first (a shared writable mapping must have somewhere to write).
    pub fn map_sources(&self, offset: u64, len: u64, allocate: bool) -> Result<Vec<MapSource>> {
        self.check_file()?;
        self.block.check_local(self.ino)?;
        let cs = self.block.geo.chunk_size;
        let size = self.len()?;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let (idx, within) = self.block.geo.chunk_of(pos);
            let n = (cs - within).min(end - pos);
            let lookup = || {
                self.block
                    .map_stable(self.ino, || self.block.map_lookup(self.ino, idx))
            };
            let mut c = lookup()?;
            if c.is_none() && allocate && pos < size {
                // Allocate the hole by writing zeros over the part of it inside the file.
                let start = idx * cs;
                let stop = (start + cs).min(size);
                let zeros = vec![0u8; (stop - start) as usize];
                self.write_all_at(&zeros, start)?;
                c = lookup()?;
            }
            out.push(match c {
                Some(c) if self.block.is_spill(c) => MapSource::Spill {
                    offset: self.block.spill_offset(c) + within,
                    len: n,
                },
                Some(c) => MapSource::Shm {
                    offset: self.block.geo.off.data + c as u64 * cs + within,
                    len: n,
                },
                None => MapSource::Zeros { len: n },
            });
            pos += n;
        }
        Ok(out)
    }

    /// A store path for `rel` relative to this file (an `*at` call with this file as the
    /// directory): it follows the inode, so it stays right after renames, and a file or a
    /// removed directory gives ENOTDIR / ENOENT like the kernel.
    pub fn anchored(&self, rel: &str) -> String {
        format!(
            "{}{}:{}/{rel}",
            crate::namespace::ANCHOR,
            self.ino,
            self.gen
        )
    }

    /// The file's current path in the store (it may have been renamed since it was opened);
    /// ENOENT once it was removed.
    pub fn current_path(&self) -> Result<String> {
        let _g = self.block.lock_ns()?;
        self.check_live()?;
        self.block
            .path_of(self.ino)?
            .ok_or_else(|| Error::new(libc::ENOENT, "the file was removed"))
    }

    /// True for a handle on a directory.
    pub fn is_dir(&self) -> bool {
        is_dir_state(self.block.inode(self.ino).state.load(Acquire))
    }

    /// True if the file's content is only in a level below (listed or evicted): reads,
    /// writes and mappings fail until read-through fetches it or it is truncated to zero.
    pub fn is_remote(&self) -> bool {
        self.block.check_local(self.ino).is_err()
    }

    /// True if the file this handle named is gone (removed or replaced, its inode freed or
    /// reused): every use of the handle fails with ESTALE.
    pub fn is_stale(&self) -> bool {
        self.check_live().is_err()
    }

    pub(crate) fn reopen(store: &Store, ino: u64, gen: u32, flags: i32) -> Result<File> {
        let b = &store.block;
        if ino >= b.geo.max_inodes as u64 {
            return Err(Error::new(
                libc::EBADF,
                format!("inode {ino} does not exist"),
            ));
        }
        let acc = flags & libc::O_ACCMODE;
        let file = File::new(
            b,
            ino as u32,
            gen,
            acc == libc::O_WRONLY || acc == libc::O_RDWR,
            false,
            false,
        );
        file.check_live()?;
        Ok(file)
    }

    #[inline]
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.check_file()?;
        match self
            .block
            .read_hinted(self.ino, buf, offset, &self.read_hint)
        {
            Some(n) => Ok(n),
            None => self.block.read(self.ino, buf, offset),
        }
    }

    /// Writes at `offset` (at the end with `append`). On a full store, waits for the agent
    /// to free space when the store's policy says so (docs/store-layout.md, "Lifecycle").
    #[inline]
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        self.write_to(buf, Position::At(offset), LockHolder::this_thread())
    }

    /// [`Self::write_at`] by the thread `me` names (the interposition library keeps it per
    /// thread: [`LockHolder`]).
    #[inline]
    pub fn write_at_as(&self, me: LockHolder, buf: &[u8], offset: u64) -> Result<usize> {
        self.write_to(buf, Position::At(offset), me)
    }

    /// Writes at the shared file offset `position` and advances it, both under the file's
    /// lock (write(2) on a description: calls on it from any thread or process serialise,
    /// as the kernel's f_pos lock makes them). At the end, and `position` after it, with
    /// `append`.
    #[inline]
    pub fn write_advancing(&self, buf: &[u8], position: &AtomicU64) -> Result<usize> {
        self.write_to(buf, Position::Shared(position), LockHolder::this_thread())
    }

    /// [`Self::write_advancing`] by the thread `me` names.
    #[inline]
    pub fn write_advancing_as(
        &self,
        me: LockHolder,
        buf: &[u8],
        position: &AtomicU64,
    ) -> Result<usize> {
        self.write_to(buf, Position::Shared(position), me)
    }

    #[inline(always)]
    fn write_to(&self, buf: &[u8], position: Position<'_>, me: LockHolder) -> Result<usize> {
        // Read before the attempt: a wake-up between a failed attempt and the wait is seen.
        let seen = self.block.header().space_wake.load(Acquire);
        match self.write_once(buf, position, me) {
            Err(e) if e.errno() == libc::ENOSPC => self.write_when_full(buf, position, me, seen, e),
            other => other,
        }
    }

    /// [`Self::write_to`] after an attempt found the store full (`err`, with the space
    /// wake-up counter `seen` before it): retries after a sweep, then as the store's policy
    /// says (docs/store-layout.md, "Lifecycle").
    #[cold]
    fn write_when_full(
        &self,
        buf: &[u8],
        position: Position<'_>,
        me: LockHolder,
        mut seen: u32,
        mut err: Error,
    ) -> Result<usize> {
        let mut deadline = None;
        let mut swept = false;
        loop {
            // The space may be held by dead writers' files removed since: freed by a sweep
            // (once per write), whether or not an agent runs.
            let freed = !swept && {
                swept = true;
                let store = Store {
                    block: self.block.clone(),
                };
                store.sweep_descriptions() > 0
            };
            if !freed && !self.block.wait_for_space(&mut deadline, seen) {
                return Err(err);
            }
            seen = self.block.header().space_wake.load(Acquire);
            match self.write_once(buf, position, me) {
                Err(e) if e.errno() == libc::ENOSPC => err = e,
                other => return other,
            }
        }
    }

    #[inline(always)]
    fn write_once(&self, buf: &[u8], position: Position<'_>, me: LockHolder) -> Result<usize> {
        if !self.writable {
            return Err(Error::new(libc::EBADF, "file not open for writing"));
        }
        // The inode once: every atomic load with Acquire after this would make the compiler
        // load the block's fields and bounds-check the index again.
        let inode = self.block.inode(self.ino);
        // The bias apart from the general path, so that its guard stays in registers
        // (merged with the general path's `Result`, returned through memory, it was copied
        // through the stack four times).
        let guard = match inode.lock.enter_bias(me) {
            Some(guard) => guard,
            None => self.lock_as(me)?,
        };
        let written = self.write_under_lock(inode, buf, position);
        guard.release();
        written
    }

    /// The usual small write(2) whole, or nothing: the calling thread `me` holds the file's
    /// bias, the handle is writable without O_APPEND, and the bytes go at the shared offset
    /// `position` into the hinted memory chunk (`Self::write_hinted`). None, having changed
    /// nothing, when any of that does not hold; the caller then takes
    /// [`Self::write_advancing_as`], which does the same and everything else. It cannot
    /// fail, wait or panic, so a caller may run it outside its panic boundary.
    #[inline(always)]
    pub fn try_write_advancing_fast(
        &self,
        me: LockHolder,
        buf: &[u8],
        position: &AtomicU64,
    ) -> Option<usize> {
        self.try_write_fast(me, buf, Position::Shared(position))
    }

    /// [`Self::try_write_advancing_fast`] at `offset` (pwrite(2)): None for
    /// [`Self::write_at_as`].
    #[inline(always)]
    pub fn try_write_at_fast(&self, me: LockHolder, buf: &[u8], offset: u64) -> Option<usize> {
        self.try_write_fast(me, buf, Position::At(offset))
    }

    #[inline(always)]
    fn try_write_fast(&self, me: LockHolder, buf: &[u8], position: Position<'_>) -> Option<usize> {
        if !self.writable || self.append {
            return None;
        }
        let inode = self.hot.inode();
        if !inode.lock.try_enter_bias(me) {
            return None;
        }
        // Nothing under the lock can panic (the fast path's promise): no guard needed. The
        // count alone crosses the unlock, 0 for none (a write of no bytes declines), so it
        // stays in a register.
        let written = self
            .write_fast_under_lock(inode, buf, position)
            .unwrap_or(0);
        inode.lock.leave_entered_bias(me);
        (written != 0).then_some(written)
    }

    /// [`Self::write_under_lock`] for [`Self::try_write_fast`]: only its hinted path, and
    /// None where that reports an error.
    #[inline(always)]
    fn write_fast_under_lock(
        &self,
        inode: &Inode,
        buf: &[u8],
        position: Position<'_>,
    ) -> Option<usize> {
        if !self.is_live_file(inode) {
            return None;
        }
        let offset = match position {
            Position::At(offset) => offset,
            Position::Shared(p) => p.load(Acquire),
        };
        let n = self.write_hinted(inode, buf, offset)?;
        if let Position::Shared(p) = position {
            p.store(offset + n as u64, Release);
        }
        // No spill was written: nothing for `wrote_spill`.
        Some(n)
    }

    /// The usual small write without the general loop (inode lock held): `buf` lies inside
    /// one memory chunk this process has mapped, the one this handle or the file's lock hint
    /// names, and starts at or before the end of the file. None when any of that does not
    /// hold, having changed nothing: the caller takes `Block::write_locked`. The same
    /// effects as that, without its loop, its hole and boundary handling or its frame, and
    /// without a call or a panic (docs/interposition.md, "What a small write costs").
    #[inline(always)]
    fn write_hinted(&self, inode: &Inode, buf: &[u8], offset: u64) -> Option<usize> {
        let write = OneChunkWrite::of(self.hot.limits, inode, buf.len(), offset)?;
        let chunk = self.chunk_to_write(inode, write.idx)?;
        // SAFETY: `chunk_to_write` gives the mapped memory chunk the file owns at
        // `write.idx`; the caller holds the inode's lock.
        Some(unsafe { write.finish(inode, chunk, buf) })
    }

    /// Memory chunk `idx` of the file, mapped in this process, to write (inode lock held):
    /// the one this handle's write hint names if its state still says it is that, else the
    /// one the inode's hint names (remembered in the handle's hint). None otherwise.
    #[inline(always)]
    fn chunk_to_write(&self, inode: &Inode, idx: u64) -> Option<*mut u8> {
        match self.memory_chunk_if_hinted(self.write_hint.load(Relaxed), idx) {
            Some(c) => Some(self.hot.memory_chunk(c)),
            None => self.chunk_to_write_by_inode_hint(inode, idx),
        }
    }

    /// [`Self::chunk_to_write`] when this handle's hint does not name the chunk: once per
    /// chunk a writer enters, out of line so that the usual path stays short.
    #[cold]
    #[inline(never)]
    fn chunk_to_write_by_inode_hint(&self, inode: &Inode, idx: u64) -> Option<*mut u8> {
        let c = self
            .block
            .chunk_if_hinted(self.ino, idx, inode.lock.hint.load(Relaxed))?;
        let chunk = self.block.mapped_memory_chunk(c)?;
        if let Some(word) = crate::file::hint_word(idx, c) {
            self.write_hint.store(word, Relaxed);
        }
        Some(chunk)
    }

    /// [`Self::check_file`] as a yes or no, given this handle's inode (the fast paths).
    #[inline(always)]
    fn is_live_file(&self, inode: &Inode) -> bool {
        let state = inode.state.load(Acquire);
        state != INODE_FREE && !is_dir_state(state) && inode.gen.load(Acquire) == self.gen
    }

    /// The usual small read whole, or None: the bytes lie in one memory chunk, the one the
    /// handle's read hint names (`Block::read_hinted`); [`Self::read_at`] does that and
    /// everything else. Lock-free; it cannot fail, wait or panic, so a caller may run it
    /// outside its panic boundary. A None may have copied bytes into `buf`, which the
    /// caller's read then overwrites.
    #[inline(always)]
    pub fn try_read_at_fast(&self, buf: &mut [u8], offset: u64) -> Option<usize> {
        let inode = self.hot.inode();
        if !self.is_live_file(inode) {
            return None;
        }
        let read = OneChunkRead::of(self.hot.limits.chunk_size, inode, buf.len(), offset)?;
        let chunk = self.chunk_to_read(read.idx)?;
        // SAFETY: `chunk` is a memory chunk of this process's mapping; `read` was made for
        // `buf`.
        unsafe { read.finish(inode, chunk, buf) }
    }

    /// Memory chunk `idx` of the file to read, if this handle's read hint names it and its
    /// state still says it is that (a truncation may free it meanwhile: the read's sequence
    /// check discards such bytes). The general read (`Block::read_hinted`) sets the hint,
    /// after starting this process's populate thread.
    #[inline(always)]
    fn chunk_to_read(&self, idx: u64) -> Option<*const u8> {
        self.memory_chunk_if_hinted(self.read_hint.load(Relaxed), idx)
            .map(|c| self.hot.memory_chunk(c).cast_const())
    }

    /// The memory chunk one of this handle's hint words (`idx << 32 | chunk + 1`) names for
    /// `idx`, if the chunk's state word still says the file owns it there
    /// (`Block::chunk_if_hinted` through the handle's addresses).
    #[inline(always)]
    fn memory_chunk_if_hinted(&self, hint: u64, idx: u64) -> Option<u32> {
        if hint >> 32 != idx {
            return None;
        }
        let c = (hint as u32).checked_sub(1)?;
        (c < self.hot.mem_chunks
            && self.hot.chunk_state(c).load(Relaxed) == used(self.ino, idx as u32))
        .then_some(c)
    }

    /// The description `d` names if it is live (as `Store::description`, through this
    /// handle's addresses: the path of every read and write needs no store handle).
    #[inline(always)]
    pub fn description(&self, d: crate::OpenDescription) -> Option<crate::Description<'_>> {
        self.hot.description(d)
    }

    /// The inode's lock, taken by any path but the bias's (out of line).
    #[inline(never)]
    fn lock_as(&self, me: LockHolder) -> Result<crate::lock::LockGuard<'_>> {
        self.block.lock_inode_as(self.ino, me)
    }

    /// [`Self::write_once`] with the inode's lock held.
    #[inline(always)]
    fn write_under_lock(&self, inode: &Inode, buf: &[u8], position: Position<'_>) -> Result<usize> {
        if is_dir_state(self.state_if_live(inode)?) {
            return Err(is_a_directory());
        }
        let offset = match position {
            _ if self.append => inode.size.load(Acquire),
            Position::At(offset) => offset,
            Position::Shared(p) => p.load(Acquire),
        };
        let n = match self.write_hinted(inode, buf, offset) {
            Some(n) => n,
            None => self.block.write_locked(self.ino, buf, offset)?,
        };
        if let Position::Shared(p) = position {
            p.store(offset + n as u64, Release);
        }
        if self.block.spill.is_some() && self.block.spill_dirty.load(Relaxed) {
            self.wrote_spill.store(true, Relaxed);
        }
        Ok(n)
    }

    pub fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> Result<()> {
        while !buf.is_empty() {
            let n = self.write_at(buf, offset)?;
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    /// Appends atomically (against other appenders); returns the offset written at.
    pub fn append(&self, buf: &[u8]) -> Result<u64> {
        if !self.writable {
            return Err(Error::new(libc::EBADF, "file not open for writing"));
        }
        let _g = self.block.lock_inode(self.ino)?;
        self.check_file()?;
        let at = self.block.inode(self.ino).size.load(Acquire);
        let n = self.block.write_locked(self.ino, buf, at)?;
        if n < buf.len() {
            // Keep appends all-or-nothing: undo the partial tail.
            self.block.set_len_locked(self.ino, at)?;
            return Err(Error::new(libc::ENOSPC, "append did not fit"));
        }
        Ok(at)
    }

    pub fn set_len(&self, len: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::new(libc::EBADF, "file not open for writing"));
        }
        let _g = self.block.lock_inode(self.ino)?;
        self.check_file()?;
        self.block.set_len_locked(self.ino, len)
    }

    /// Makes spilled data of this store durable in the spill file (memory chunks need nothing:
    /// they live as long as the node does).
    pub fn sync(&self) -> Result<()> {
        self.block.sync_spill()
    }

    pub fn metadata(&self) -> Result<Metadata> {
        self.check_live()?;
        Ok(Store {
            block: self.block.clone(),
        }
        .metadata_of(self.ino))
    }

    pub fn len(&self) -> Result<u64> {
        self.check_live()?;
        Ok(self.block.inode(self.ino).size.load(Acquire))
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Where each chunk of the file lives (the paper's get_chunk_meta_list).
    pub fn chunk_list(&self) -> Result<Vec<ChunkInfo>> {
        self.check_file()?;
        self.block.chunk_infos(self.ino)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.wrote_spill.load(Relaxed) {
            let _ = self.block.sync_spill();
        }
        if self.counts_writer {
            self.block.remove_writer(self.ino, self.gen, false);
        }
    }
}

// Out of line: the checks on every write stay a load and a branch each.
#[cold]
fn removed_while_open() -> Error {
    Error::new(libc::ESTALE, "the file was removed while open")
}

#[cold]
fn is_a_directory() -> Error {
    Error::new(libc::EISDIR, "is a directory")
}

/// Where [`File::write_to`] writes.
#[derive(Clone, Copy)]
enum Position<'a> {
    At(u64),
    /// A description's shared offset, read and advanced under the file's lock.
    Shared(&'a AtomicU64),
}

/// A time given explicitly (utimensat, a remote file's), kept off [`TIMES_MARKED`].
pub(crate) fn explicit_time(t: TimeNs) -> TimeNs {
    t.max(TIMES_MARKED + 1)
}
