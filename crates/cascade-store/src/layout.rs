//! The byte layout of the shared-memory block. Everything is `#[repr(C)]`, reached by byte
//! offsets from the block's start (never pointers), and documented in docs/store-layout.md.
//!
//! Regions, in order (each starts on a 64-byte boundary, the data region on a 2 MiB one):
//! header | inodes | chunk states | node states | map nodes | free-memory-chunk stack |
//! free-spill-chunk stack | free-node stack | free-inode stack | name hash index | lease slots |
//! open file descriptions | data chunks

use crate::error::{Error, Result};
use crate::lock::{SeqLine, ShmMutex};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};

pub(crate) const MAGIC: [u8; 8] = *b"CASCADE\0";
pub(crate) const FORMAT_VERSION: u32 = 8;
pub(crate) const HEADER_SIZE: usize = 4096;

/// An inode's `mtime` while a write has marked its mtime and ctime for update (POSIX allows
/// the update to wait until "an update point"): the next stat or writer's close sets both to
/// the time then, and an explicit time replaces the mark. A write thus leaves the clock
/// alone, and its store is skipped when the mark is already there.
pub(crate) const TIMES_MARKED: i64 = i64::MIN;

pub(crate) const MIN_CHUNK: u64 = 4096;
pub(crate) const MAX_CHUNK: u64 = 64 << 20;
pub(crate) const MAX_INODES: u32 = 1 << 24;
/// Chunk ids are u32 and tree entries store id+1, so the total stays below 2^31.
pub(crate) const MAX_TOTAL_CHUNKS: u64 = (1 << 31) - 1;
pub(crate) const NAME_MAX: usize = 255;
pub(crate) const PATH_MAX: usize = 4095;
pub(crate) const SPILL_PATH_MAX: usize = 1023;
/// Files are limited to 2^48 bytes and to 2^32 chunks (the chunk index in a chunk state).
pub(crate) const MAX_FILE_BYTES: u64 = 1 << 48;

/// Entries per map node: a file's chunk map is a radix tree of these.
pub(crate) const FANOUT: usize = 64;
pub(crate) const FANOUT_BITS: u32 = 6;
/// The tallest chunk map: 6 levels of 64 entries cover the 2^32 chunks a file may have.
pub(crate) const MAX_MAP_HEIGHT: u32 = 32u32.div_ceil(FANOUT_BITS);
/// Chunks a process takes from the shared pool at a time (fewer for tiny stores).
pub(crate) const LEASE_MAX: usize = 32;
pub(crate) const LEASE_BYTES: u64 = 32 << 20;
/// Open file descriptions (shared offsets of interposed opens; see descriptions.rs).
pub(crate) const OFD_SLOTS: u32 = 65536;
/// Processes that can be attached at once.
pub(crate) const LEASE_SLOTS: u32 = 1024;
pub(crate) const DATA_ALIGN: u64 = 2 << 20;

/// Sentinel for "no inode" in derived lists.
pub(crate) const NIL: u32 = u32::MAX;
pub(crate) const ROOT_INO: u32 = 0;

// Inode states.
pub(crate) const INODE_FREE: u32 = 0;
pub(crate) const INODE_FILE: u32 = 1;
pub(crate) const INODE_DIR: u32 = 2;
/// Unlinked while open: out of the namespace, data kept until the last description closes.
pub(crate) const INODE_ORPHAN: u32 = 3;
/// A directory removed while open: empty, out of the namespace, freed at the last close.
pub(crate) const INODE_ORPHAN_DIR: u32 = 4;

/// Removed while open: freed by the last close (`Block::reap_orphan`).
pub(crate) fn is_orphan_state(state: u32) -> bool {
    state == INODE_ORPHAN || state == INODE_ORPHAN_DIR
}

/// A directory, named or removed while open.
pub(crate) fn is_dir_state(state: u32) -> bool {
    state == INODE_DIR || state == INODE_ORPHAN_DIR
}

// Inode `life` flags.
/// A process died while writing the file (its write description was swept): never drained
/// as complete until it is rewritten.
pub(crate) const LIFE_TORN: u32 = 1;
/// A committed checkpoint root (directory or file); `commit_seq` orders it.
pub(crate) const LIFE_COMMITTED: u32 = 2;
/// The checkpoint goes to the durable tier (every Nth commit, and the last one of a job).
pub(crate) const LIFE_FLUSH: u32 = 4;
/// The checkpoint's completion marker is in the durable tier and nothing changed since.
pub(crate) const LIFE_COMPLETE: u32 = 8;
/// `durable_seq` names a version that only a staging server (L1) holds so far, not the
/// durable tier: safe from the loss of this node, not yet from the loss of the job.
pub(crate) const LIFE_STAGED: u32 = 16;
/// A checkpoint whose file list a staging server accepted for version `durable_seq`: that
/// server writes its completion marker once every file has drained.
pub(crate) const LIFE_PUSHED: u32 = 32;
/// The file's content is only in a level below (the file was listed from there, or evicted
/// from memory once durable): its size and times are real, its data is not here. Reads,
/// writes and mappings fail until read-through fetches it (a new inode) or it is truncated
/// to zero.
pub(crate) const LIFE_REMOTE: u32 = 64;
/// A checkpoint the end of a job committed because nothing else did (its top-level
/// directory): a later commit of a path inside it supersedes it instead of being refused.
pub(crate) const LIFE_IMPLICIT: u32 = 128;
/// Bits 8..16 of `life` count the mappings of the file that pin its data (saturating: at
/// 255 the count sticks until the inode is freed). While it is not zero, truncation keeps
/// the chunks past the new end, so that no mapping ever shows another file's bytes; the
/// last unpin trims them.
pub(crate) const LIFE_MAPS_SHIFT: u32 = 8;
pub(crate) const LIFE_MAPS_MASK: u32 = 0xff << LIFE_MAPS_SHIFT;
/// The top 16 bits of `life` count truncations to zero (rewrites), modulo 2^16.
pub(crate) const LIFE_REWRITE_SHIFT: u32 = 16;

// Chunk and node state words: top two bits are the tag.
pub(crate) const TAG_SHIFT: u32 = 62;
pub(crate) const TAG_FREE: u64 = 0;
pub(crate) const TAG_LEASED: u64 = 1;
pub(crate) const TAG_USED: u64 = 2;

pub(crate) fn state_tag(s: u64) -> u64 {
    s >> TAG_SHIFT
}
pub(crate) fn leased(slot: u32) -> u64 {
    (TAG_LEASED << TAG_SHIFT) | slot as u64
}
pub(crate) fn lease_of(s: u64) -> u32 {
    s as u32
}
/// A chunk owned by inode `ino` at logical index `idx` (a node: idx unused, 0).
pub(crate) fn used(ino: u32, idx: u32) -> u64 {
    (TAG_USED << TAG_SHIFT) | ((ino as u64) << 32) | idx as u64
}
pub(crate) fn used_ino(s: u64) -> u32 {
    ((s >> 32) as u32) & ((1 << 30) - 1)
}
pub(crate) fn used_idx(s: u64) -> u32 {
    s as u32
}

/// A chunk or node state word in words, for messages.
pub(crate) fn describe_state(s: u64) -> String {
    match state_tag(s) {
        TAG_FREE => "free".into(),
        TAG_LEASED => format!("leased to slot {}", lease_of(s)),
        TAG_USED => format!("used by inode {} at index {}", used_ino(s), used_idx(s)),
        _ => format!("invalid ({s:#x})"),
    }
}

/// Inode `link` word: parent inode, name length and which of the two name slots is current.
/// Rename writes the new name into the other slot and then swaps this one word, so a crash
/// leaves either the old or the new name, never a mix.
pub(crate) fn pack_link(parent: u32, name_len: usize, slot: u32) -> u64 {
    parent as u64 | ((name_len as u64) << 32) | ((slot as u64) << 48)
}
pub(crate) fn link_parent(l: u64) -> u32 {
    l as u32
}
pub(crate) fn link_len(l: u64) -> usize {
    ((l >> 32) & 0x1ff) as usize
}
pub(crate) fn link_slot(l: u64) -> usize {
    ((l >> 48) & 1) as usize
}

/// Inode `map` word: root node id + 1 (0 = empty map) and tree height.
pub(crate) fn pack_map(root_plus1: u32, height: u32) -> u64 {
    root_plus1 as u64 | ((height as u64) << 32)
}
pub(crate) fn map_root(m: u64) -> u32 {
    m as u32
}
pub(crate) fn map_height(m: u64) -> u32 {
    (m >> 32) as u32
}

/// Block header at offset 0 (4096 bytes reserved).
#[repr(C)]
pub(crate) struct Header {
    /// Written last by the creator (release), so a complete magic means a complete block.
    pub magic: AtomicU64,
    pub version: u32,
    pub header_size: u32,
    pub block_size: u64,
    pub chunk_size: u64,
    pub mem_chunks: u32,
    pub spill_chunks: u32,
    pub max_inodes: u32,
    pub map_nodes: u32,
    pub lease_slots: u32,
    pub lease_batch: u32,
    pub hash_slots: u32,
    pub owner_uid: u32,
    pub created_ns: i64,
    pub off: Offsets,
    pub spill_path_len: u32,
    pub _pad0: u32,
    pub spill_path: [u8; SPILL_PATH_MAX + 1],
    /// Serialises namespace changes (create, rename, unlink...) and path lookups.
    pub ns_lock: ShmMutex,
    /// Serialises the shared free stacks and lease refills.
    pub alloc_lock: ShmMutex,
    pub free_mem_top: AtomicU32,
    pub free_spill_top: AtomicU32,
    pub free_node_top: AtomicU32,
    pub free_inode_top: AtomicU32,
    /// Bytes of the data region the creator has faulted in (== capacity when done).
    pub prefaulted: AtomicU64,
    /// Rename-over-existing journal (see namespace.rs): valid, source, victim, new link.
    pub rj_valid: AtomicU32,
    pub rj_src: AtomicU32,
    pub rj_victim: AtomicU32,
    /// 1 once the interposition library made a lock file for a file of this store (flock
    /// and fcntl locks, `Store::lock_dir`); until then a removal has no lock file to clean.
    pub lock_files: AtomicU32,
    pub rj_link: AtomicU64,
    /// Last ENOSPC: when, who, why (code) and how much was asked for.
    pub enospc_time: AtomicI64,
    pub enospc_pid: AtomicU32,
    pub enospc_reason: AtomicU32,
    // Checkpoint lifecycle (lifecycle.rs).
    /// Bumped, then futex-woken, whenever the agent has work: a file closed after writing,
    /// a commit, a writer waiting for space.
    pub agent_wake: AtomicU32,
    /// Bumped, then futex-woken, whenever the agent freed space (writers waiting on a full
    /// store wait on it).
    pub space_wake: AtomicU32,
    /// The registered agent: pid and start time (0 = none).
    pub agent_pid: AtomicU32,
    /// Writers waiting for space right now (the agent evicts harder while this is non-zero).
    pub space_waiters: AtomicU32,
    pub agent_start_time: AtomicU64,
    /// Source of commit sequence numbers (orders checkpoints).
    pub commit_counter: AtomicU64,
    /// Flush every Nth commit to the durable tier (set by the agent; 0 or 1 = every one).
    pub flush_every: AtomicU32,
    /// How long a writer on a full store waits for the agent to free space, in ms (0 = fail
    /// with ENOSPC at once).
    pub full_wait_ms: AtomicU32,
    /// Bumped, then futex-woken, whenever a file or checkpoint reached a level (staged,
    /// durable, complete): `cascade wait` sleeps on it.
    pub progress_wake: AtomicU32,
    /// Longest store path the durable tier takes, in bytes (set by the agent; 0 = no limit):
    /// creates and renames to a longer path fail with ENAMETOOLONG at once, not at drain.
    pub max_path: AtomicU32,
    /// The namespace's sequence for lock-free lookups (`Block::read_namespace`): odd while a
    /// holder of `ns_lock` changes the namespace in a way other than creating an entry or
    /// removing a file (rename, rmdir, repair...).
    pub ns_seq: SeqLine,
    /// Sequences of the name index's stripes (`NS_STRIPES` runs of consecutive slots): odd
    /// while the removal of a file moves or clears slots of that stripe.
    pub ns_stripes: [AtomicU64; NS_STRIPES],
}

/// Stripes of the name index with a sequence each (`Header::ns_stripes`).
pub(crate) const NS_STRIPES: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Offsets {
    pub inodes: u64,
    pub chunk_states: u64,
    pub node_states: u64,
    pub nodes: u64,
    pub free_mem: u64,
    pub free_spill: u64,
    pub free_nodes: u64,
    pub free_inodes: u64,
    pub hash: u64,
    pub leases: u64,
    pub ofds: u64,
    pub data: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);

/// One file or directory (704 bytes).
#[repr(C, align(64))]
pub(crate) struct Inode {
    /// Held for data changes of this file (write, truncate, free).
    pub lock: ShmMutex,
    pub state: AtomicU32,
    /// Incarnation number: bumped on every create, so stale handles are detected.
    pub gen: AtomicU32,
    pub link: AtomicU64,
    pub size: AtomicU64,
    pub map: AtomicU64,
    pub mode: AtomicU32,
    pub uid: AtomicU32,
    pub gid: AtomicU32,
    pub chunks_mem: AtomicU32,
    pub chunks_spill: AtomicU32,
    /// Open file descriptions (interposition) referring to this incarnation.
    pub opens: AtomicU32,
    pub atime: AtomicI64,
    /// [`TIMES_MARKED`] while a write has marked mtime and ctime for update.
    pub mtime: AtomicI64,
    pub ctime: AtomicI64,
    // Derived under the namespace lock (rebuilt from the fields above after a crash).
    pub first_child: AtomicU32,
    pub next_sibling: AtomicU32,
    pub prev_sibling: AtomicU32,
    /// Odd while chunks of this file are being freed; lock-free readers retry if it moved.
    pub trunc_seq: AtomicU32,
    // Checkpoint lifecycle (lifecycle.rs).
    /// Open write descriptions and writable handles: the file is being written while > 0.
    pub writers: AtomicU32,
    /// LIFE_* flags.
    pub life: AtomicU32,
    /// Bumped on every write-open, write, truncate and rename: the version of the contents.
    pub mod_seq: AtomicU64,
    /// The `mod_seq` whose contents are in the durable tier (files); for a checkpoint root
    /// that is a directory, unused (its completion is the LIFE_COMPLETE flag).
    pub durable_seq: AtomicU64,
    /// Commit sequence number of a checkpoint root (0 = not committed).
    pub commit_seq: AtomicU64,
    pub names: [[u8; 256]; 2],
}

const _: () = assert!(std::mem::size_of::<Inode>() == 704);

/// Per-process batch of free memory chunks and of free inodes (192 bytes).
#[repr(C, align(64))]
pub(crate) struct LeaseSlot {
    /// Owning pid, 0 = slot free.
    pub pid: AtomicU32,
    pub count: AtomicU32,
    /// The owner's start time (clock ticks after boot) to tell a reused pid apart.
    pub start_time: AtomicU64,
    pub ids: [AtomicU32; LEASE_MAX],
    /// Free inodes this slot's process took from the free-inode stack for its next creates
    /// (`inodes[..inode_count]`); changed only under the namespace lock.
    pub inode_count: AtomicU32,
    pub inodes: [AtomicU32; INODE_BATCH],
}

/// Free inodes a process takes from the shared stack at once (`LeaseSlot::inodes`).
pub(crate) const INODE_BATCH: usize = 8;

const _: () = assert!(std::mem::size_of::<LeaseSlot>() == 192);

/// An open file description (64 bytes): what POSIX shares between dup'ed and inherited
/// descriptors, so it lives in the block rather than in one process.
#[repr(C, align(64))]
pub(crate) struct OfdSlot {
    /// 0 = free; otherwise a random tag, also carried by the descriptor's memfd name, so a
    /// descriptor of a freed and reused slot is recognised as stale.
    pub nonce: AtomicU64,
    pub offset: AtomicU64,
    pub ino: AtomicU32,
    pub gen: AtomicU32,
    /// open(2) flags (access mode, O_APPEND).
    pub flags: AtomicU32,
    /// Descriptors referring to it, in all processes (best effort: kill -9 leaks, sweeps fix).
    pub refs: AtomicU32,
    /// When the slot was claimed (CLOCK_REALTIME ns): sweeps spare young slots, whose
    /// descriptor may not exist yet.
    pub claimed_ns: AtomicI64,
    /// The file's rewrite count (`life >> LIFE_REWRITE_SHIFT`) when the slot was claimed: a
    /// dead writer leaves the file torn only if nobody rewrote it since.
    pub rewrite_at_open: AtomicU32,
    /// The process that claimed the slot: a young slot is swept only once it is dead.
    pub claimer_pid: AtomicU32,
    /// The claimer's start time (clock ticks after boot) when it holds the description
    /// through its *anchor* descriptor rather than a memfd named after the slot
    /// (docs/interposition.md): the slot lives while that process does. 0 = not anchored.
    pub anchor_start: AtomicU64,
    pub _pad: u64,
}

const _: () = assert!(std::mem::size_of::<OfdSlot>() == 64);

/// A map node: FANOUT entries of (child id + 1), 0 = empty.
#[repr(C)]
pub(crate) struct MapNode {
    pub slots: [AtomicU32; FANOUT],
}

/// Sizes and offsets derived from the creation parameters. Attach recomputes them and
/// compares with the header, so a block with an inconsistent header is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub chunk_size: u64,
    pub mem_chunks: u32,
    pub spill_chunks: u32,
    pub max_inodes: u32,
    pub map_nodes: u32,
    pub lease_slots: u32,
    pub lease_batch: u32,
    pub hash_slots: u32,
    pub off: Offsets,
    pub block_size: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Geometry {
    /// The chunk index of byte `pos` of a file and the offset in that chunk. The chunk size
    /// is a power of two (checked at creation and attach): a shift and a mask, where `/` and
    /// `%` by a runtime value are a 64-bit division (tens of cycles, on every small write).
    #[inline]
    pub fn chunk_of(&self, pos: u64) -> (u64, u64) {
        debug_assert!(self.chunk_size.is_power_of_two());
        (
            pos >> self.chunk_size.trailing_zeros(),
            pos & (self.chunk_size - 1),
        )
    }

    pub(crate) fn compute(
        chunk_size: u64,
        mem_chunks: u64,
        spill_chunks: u64,
        max_inodes: u64,
    ) -> Result<Geometry> {
        Self::check_params(chunk_size, mem_chunks, spill_chunks, max_inodes)?;
        let total = mem_chunks + spill_chunks;
        // Every file with data has a root node; leaves cover FANOUT chunks each; files with
        // more than FANOUT chunks need at most a few interior nodes (bounded by total/16).
        let map_nodes = max_inodes + total / (FANOUT as u64 - 1) + total / 16 + 64;
        let hash_slots = (max_inodes * 2).next_power_of_two();
        // A batch is at most 1/64 of memory and about LEASE_BYTES, so batches parked in
        // other processes never make a store look full early.
        let lease_batch = (mem_chunks / 64)
            .min(LEASE_BYTES / chunk_size)
            .clamp(1, LEASE_MAX as u64);

        let mut at = HEADER_SIZE as u64;
        let mut region = |bytes: u64| {
            let start = align_up(at, 64);
            at = start + bytes;
            start
        };
        let off_inodes = region(max_inodes * std::mem::size_of::<Inode>() as u64);
        let off_chunk_states = region(total * 8);
        let off_node_states = region(map_nodes * 8);
        let off_nodes = region(map_nodes * std::mem::size_of::<MapNode>() as u64);
        let off_free_mem = region(mem_chunks * 4);
        let off_free_spill = region(spill_chunks * 4);
        let off_free_nodes = region(map_nodes * 4);
        let off_free_inodes = region(max_inodes * 4);
        let off_hash = region(hash_slots * 4);
        let off_leases = region(LEASE_SLOTS as u64 * std::mem::size_of::<LeaseSlot>() as u64);
        let off_ofds = region(OFD_SLOTS as u64 * std::mem::size_of::<OfdSlot>() as u64);
        let data = align_up(at, DATA_ALIGN);
        let block_size = data + mem_chunks * chunk_size;
        Ok(Geometry {
            chunk_size,
            mem_chunks: mem_chunks as u32,
            spill_chunks: spill_chunks as u32,
            max_inodes: max_inodes as u32,
            map_nodes: map_nodes as u32,
            lease_slots: LEASE_SLOTS,
            lease_batch: lease_batch as u32,
            hash_slots: hash_slots as u32,
            off: Offsets {
                inodes: off_inodes,
                chunk_states: off_chunk_states,
                node_states: off_node_states,
                nodes: off_nodes,
                free_mem: off_free_mem,
                free_spill: off_free_spill,
                free_nodes: off_free_nodes,
                free_inodes: off_free_inodes,
                hash: off_hash,
                leases: off_leases,
                ofds: off_ofds,
                data,
            },
            block_size,
        })
    }

    /// The creation parameters a geometry can be computed from (EINVAL otherwise).
    fn check_params(
        chunk_size: u64,
        mem_chunks: u64,
        spill_chunks: u64,
        max_inodes: u64,
    ) -> Result<()> {
        if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
            return Err(Error::new(
                libc::EINVAL,
                format!("chunk size {chunk_size} must be a power of two from 4 KiB to 64 MiB"),
            ));
        }
        if mem_chunks == 0 {
            return Err(Error::new(
                libc::EINVAL,
                format!("capacity must hold at least one chunk of {chunk_size} bytes"),
            ));
        }
        if mem_chunks + spill_chunks > MAX_TOTAL_CHUNKS {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "too many chunks ({}); use a larger chunk size",
                    mem_chunks + spill_chunks
                ),
            ));
        }
        if !(2..=MAX_INODES as u64).contains(&max_inodes) {
            return Err(Error::new(
                libc::EINVAL,
                format!("max files {max_inodes} must be between 2 and {MAX_INODES}"),
            ));
        }
        Ok(())
    }

    pub(crate) fn total_chunks(&self) -> u32 {
        self.mem_chunks + self.spill_chunks
    }

    /// The largest file size this geometry allows.
    #[inline]
    pub(crate) fn max_file_bytes(&self) -> u64 {
        MAX_FILE_BYTES.min(self.chunk_size << 32)
    }
}
