//! File data: each file's chunk map (a radix tree of 64-entry map nodes), the write, read and
//! truncate paths, and repair of a file whose lock holder died.
//!
//! Ordering that makes the data path crash-consistent (see docs/store-layout.md):
//! allocate: chunk state USED(inode, index) -> zero what must read as zeros -> copy data ->
//! publish the chunk in the map -> raise the size. Free: clear the map entry -> mark the chunk
//! free. So a size never covers unwritten data, and a crash leaves at worst a chunk marked
//! USED that no map references, which repair (or fsck --repair) returns to the free pool.

use crate::block::{coarse_now_ns, Block};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::lock::{LockGuard, LockHolder};
use crate::types::{ChunkInfo, ChunkLocation};
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

static ZEROS: [u8; 65536] = [0; 65536];
const READ_RETRIES: usize = 4;

/// Entries covered by one slot of a node at `level` (level 0 = leaves holding chunk ids).
/// A level read from a damaged map word never overflows: it covers everything.
fn span(level: u32) -> u64 {
    1u64.checked_shl(FANOUT_BITS * level).unwrap_or(u64::MAX)
}

fn slot_of(idx: u64, level: u32) -> usize {
    (idx.checked_shr(FANOUT_BITS * level).unwrap_or(0) & (FANOUT as u64 - 1)) as usize
}

/// Height needed so that a tree covers index `idx`.
fn height_for(idx: u64) -> u32 {
    let mut h = 1;
    while idx >= span(h) {
        h += 1;
    }
    h
}

impl Block {
    #[inline]
    pub(crate) fn lock_inode(&self, ino: u32) -> Result<LockGuard<'_>> {
        self.lock_inode_as(ino, LockHolder::this_thread())
    }

    /// [`Self::lock_inode`] for a caller that knows its holder value.
    #[inline(always)]
    pub(crate) fn lock_inode_as(&self, ino: u32, me: LockHolder) -> Result<LockGuard<'_>> {
        let g = self.inode(ino).lock.lock_biased_as(me)?;
        if g.recovered() {
            return self.repaired(ino, g);
        }
        Ok(g)
    }

    /// The lock's last holder died inside: the inode is repaired before anyone uses it.
    #[cold]
    fn repaired<'a>(&self, ino: u32, mut g: LockGuard<'a>) -> Result<LockGuard<'a>> {
        self.repair_inode(ino)?;
        g.mark_consistent();
        Ok(g)
    }

    /// The map word of `ino`, checked: empty, the one chunk of a tree of height 0, or a
    /// root node and height. The chunk or node is only checked to exist; its state word is
    /// checked where it is used (`check_chunk`, `owns_node`).
    #[inline]
    fn map_top_checked(&self, ino: u32) -> Result<MapTop> {
        let m = self.inode(ino).map.load(Acquire);
        let h = map_height(m);
        match map_root(m).checked_sub(1) {
            None if h == 0 => Ok(MapTop::Empty),
            Some(c) if h == 0 && c < self.geo.total_chunks() => Ok(MapTop::Chunk(c)),
            Some(root) if h > 0 && h <= MAX_MAP_HEIGHT => {
                Ok(MapTop::Tree(self.check_node(ino, root)?, h))
            }
            _ => Err(bad_map_word(ino, m)),
        }
    }

    /// A map node id read from `ino`'s map, checked to lie inside the node pool.
    #[inline]
    fn check_node(&self, ino: u32, n: u32) -> Result<u32> {
        if n < self.geo.map_nodes {
            return Ok(n);
        }
        Err(self.bad_node(ino, n))
    }

    #[cold]
    #[inline(never)]
    fn bad_node(&self, ino: u32, n: u32) -> Error {
        Error::damaged(format!(
            "the chunk map of inode {ino} names map node {n}, past the {} nodes",
            self.geo.map_nodes
        ))
    }

    /// A chunk id read from `ino`'s map at index `idx`, checked: inside the chunk table and
    /// marked USED(ino, idx), so a damaged map never reads (or writes, or frees) a free chunk
    /// or another file's. One load of the chunk's state word, no lock.
    ///
    /// A lock-free reader racing a truncation may see the chunk freed or reused; `read`
    /// retries then, and only a failure under the file's lock is reported as damage.
    #[inline]
    fn check_chunk(&self, ino: u32, idx: u64, c: u32) -> Result<u32> {
        // Relaxed suffices: the map entry was loaded with Acquire, and an allocation marks
        // the chunk before it publishes the entry (Release).
        match self.chunk_states().get(c as usize) {
            Some(s) if s.load(Relaxed) == used(ino, idx as u32) && idx <= u32::MAX as u64 => Ok(c),
            _ => Err(self.bad_chunk(ino, idx, c)),
        }
    }

    #[cold]
    #[inline(never)]
    fn bad_chunk(&self, ino: u32, idx: u64, c: u32) -> Error {
        match self.chunk_states().get(c as usize) {
            None => Error::damaged(format!(
                "the chunk map of inode {ino} names chunk {c} at index {idx}, past the {} chunks",
                self.geo.total_chunks()
            )),
            Some(s) => Error::damaged(format!(
                "the chunk map of inode {ino} names chunk {c} at index {idx}, which is marked {}",
                describe_state(s.load(Relaxed))
            )),
        }
    }

    /// Chunk id at logical index `idx`, if allocated. Lock-free: entries only change by
    /// single atomic stores and nodes stay mapped, so a racing reader sees old or new.
    /// EIO when the map is damaged (see `check_chunk`).
    pub(crate) fn map_lookup(&self, ino: u32, idx: u64) -> Result<Option<u32>> {
        let (mut node, h) = match self.map_top_checked(ino)? {
            MapTop::Empty => return Ok(None),
            MapTop::Chunk(c) if idx == 0 => return self.check_chunk(ino, 0, c).map(Some),
            MapTop::Chunk(_) => return Ok(None),
            MapTop::Tree(root, h) => (root, h),
        };
        if idx >= span(h) {
            return Ok(None);
        }
        for level in (0..h).rev() {
            let e = self.node(node).slots[slot_of(idx, level)].load(Acquire);
            let Some(child) = e.checked_sub(1) else {
                return Ok(None);
            };
            if level == 0 {
                return self.check_chunk(ino, idx, child).map(Some);
            }
            node = self.check_node(ino, child)?;
        }
        Ok(None)
    }

    /// Publishes chunk `c` at index `idx` of inode `ino` (inode lock held), growing the tree.
    /// The first chunk of a file at index 0 is the map itself (a tree of height 0): a file
    /// of one chunk takes no map node, so creating and removing one takes no shared lock.
    fn map_insert(&self, ino: u32, idx: u64, c: u32) -> Result<()> {
        let inode = self.inode(ino);
        let mut m = match self.map_top_checked(ino)? {
            MapTop::Empty | MapTop::Chunk(_) if idx == 0 => {
                inode.map.store(pack_map(c + 1, 0), Release);
                return Ok(());
            }
            MapTop::Empty => {
                let root = self.alloc_node(ino)?;
                let m = pack_map(root + 1, height_for(idx));
                inode.map.store(m, Release);
                m
            }
            MapTop::Chunk(c0) => pack_map(c0 + 1, 0),
            MapTop::Tree(root, h) => pack_map(root + 1, h),
        };
        // Growing keeps the old top as entry 0 of the new root: a chunk at height 0 becomes
        // the leaf entry for index 0, as a node does for its range.
        while idx >= span(map_height(m)) {
            let root = self.alloc_node(ino)?;
            self.node(root).slots[0].store(map_root(m), Release);
            m = pack_map(root + 1, map_height(m) + 1);
            inode.map.store(m, Release);
        }
        let mut node = map_root(m) - 1;
        for level in (1..map_height(m)).rev() {
            let slot = &self.node(node).slots[slot_of(idx, level)];
            node = match slot.load(Acquire) {
                0 => {
                    let n = self.alloc_node(ino)?;
                    slot.store(n + 1, Release);
                    n
                }
                e => self.check_node(ino, e - 1)?,
            };
        }
        self.node(node).slots[slot_of(idx, 0)].store(c + 1, Release);
        Ok(())
    }

    /// Calls `f(index, chunk)` for every allocated chunk with index in [lo, hi), each
    /// checked like `map_lookup`'s.
    pub(crate) fn for_each_chunk(
        &self,
        ino: u32,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u64, u32),
    ) -> Result<()> {
        if lo >= hi {
            return Ok(());
        }
        match self.map_top_checked(ino)? {
            MapTop::Empty => Ok(()),
            MapTop::Chunk(c) if lo == 0 => {
                f(0, self.check_chunk(ino, 0, c)?);
                Ok(())
            }
            MapTop::Chunk(_) => Ok(()),
            MapTop::Tree(root, h) => self.walk(ino, root, h - 1, 0, lo, hi, f),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        ino: u32,
        node: u32,
        level: u32,
        base: u64,
        lo: u64,
        hi: u64,
        f: &mut dyn FnMut(u64, u32),
    ) -> Result<()> {
        let s = span(level);
        for (i, slot) in self.node(node).slots.iter().enumerate() {
            let start = base + i as u64 * s;
            if start >= hi {
                break;
            }
            if start + s <= lo {
                continue;
            }
            let e = slot.load(Acquire);
            if e == 0 {
                continue;
            }
            if level == 0 {
                f(start, self.check_chunk(ino, start, e - 1)?);
            } else {
                let child = self.check_node(ino, e - 1)?;
                self.walk(ino, child, level - 1, start, lo, hi, f)?;
            }
        }
        Ok(())
    }

    /// Whether map node `n`, read from `ino`'s map, exists and is marked as `ino`'s.
    fn owns_node(&self, ino: u32, n: u32) -> bool {
        self.node_states()
            .get(n as usize)
            .is_some_and(|s| s.load(Acquire) == used(ino, 0))
    }

    /// Whether chunk `c`, read from `ino`'s map at index `idx`, exists and is marked
    /// USED(ino, idx).
    fn owns_chunk(&self, ino: u32, idx: u64, c: u32) -> bool {
        idx <= u32::MAX as u64
            && self
                .chunk_states()
                .get(c as usize)
                .is_some_and(|s| s.load(Acquire) == used(ino, idx as u32))
    }

    /// Unlinks every chunk with index >= `keep` from the map (inode lock held) and frees
    /// them, together with map nodes that no longer cover anything.
    ///
    /// A damaged map is cut all the same, but only what is marked as this file's is freed:
    /// freeing another file's chunk or node would damage that file too. What the damage hid
    /// stays marked as this file's, for fsck --repair (or the sweep of removed files).
    pub(crate) fn map_truncate(&self, ino: u32, keep: u64) -> Result<()> {
        let inode = self.inode(ino);
        let top = match self.map_top_checked(ino) {
            Ok(MapTop::Empty) => return Ok(()),
            Ok(MapTop::Chunk(_)) if keep > 0 => return Ok(()),
            Ok(top @ MapTop::Chunk(_)) => top,
            Ok(top @ MapTop::Tree(root, _)) if self.owns_node(ino, root) => top,
            Ok(MapTop::Tree(..)) if keep > 0 => {
                return Err(Error::damaged(format!(
                    "the chunk map of inode {ino} starts at a map node that is not the file's"
                )))
            }
            Err(e) if keep > 0 => return Err(e),
            // Freeing the whole file: drop the damaged map, free nothing it names.
            _ => {
                inode.map.store(0, Release);
                return Ok(());
            }
        };
        let mut chunks = Vec::new();
        let mut nodes = Vec::new();
        // Tell lock-free readers that chunks they may be copying are about to be freed.
        inode.trunc_seq.fetch_add(1, Relaxed);
        std::sync::atomic::fence(Release);
        match top {
            MapTop::Chunk(c) => {
                inode.map.store(0, Release);
                if self.owns_chunk(ino, 0, c) {
                    chunks.push(c);
                }
            }
            MapTop::Tree(root, height) if keep == 0 => {
                inode.map.store(0, Release);
                self.collect_subtree(ino, root, height - 1, 0, &mut chunks, &mut nodes);
            }
            MapTop::Tree(root, height) => {
                self.cut(ino, root, height - 1, 0, keep, &mut chunks, &mut nodes)
            }
            MapTop::Empty => {}
        }
        let (mut mem, mut spill) = (0, 0);
        for &c in &chunks {
            if self.is_spill(c) {
                spill += 1
            } else {
                mem += 1
            }
        }
        inode
            .chunks_mem
            .fetch_sub(mem.min(inode.chunks_mem.load(Relaxed)), Relaxed);
        inode
            .chunks_spill
            .fetch_sub(spill.min(inode.chunks_spill.load(Relaxed)), Relaxed);
        let freed = self
            .free_chunks(&chunks)
            .and_then(|_| self.free_nodes(&nodes));
        inode.trunc_seq.fetch_add(1, Release);
        freed
    }

    /// Unlinks the entries of `node` (owned by `ino`) at indexes >= `keep`, collecting what
    /// they reach that is `ino`'s.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        &self,
        ino: u32,
        node: u32,
        level: u32,
        base: u64,
        keep: u64,
        chunks: &mut Vec<u32>,
        nodes: &mut Vec<u32>,
    ) {
        let s = span(level);
        for (i, slot) in self.node(node).slots.iter().enumerate() {
            let start = base.saturating_add((i as u64).saturating_mul(s));
            let e = slot.load(Acquire);
            if e == 0 || start.saturating_add(s) <= keep {
                continue;
            }
            if start >= keep {
                slot.store(0, Release); // unlink first, free after
                if level == 0 {
                    if self.owns_chunk(ino, start, e - 1) {
                        chunks.push(e - 1);
                    }
                } else if self.owns_node(ino, e - 1) {
                    self.collect_subtree(ino, e - 1, level - 1, start, chunks, nodes);
                }
            } else if level > 0 && self.owns_node(ino, e - 1) {
                self.cut(ino, e - 1, level - 1, start, keep, chunks, nodes);
            }
        }
    }

    /// Collects `node` (owned by `ino`) and the nodes and chunks below it that are `ino`'s.
    fn collect_subtree(
        &self,
        ino: u32,
        node: u32,
        level: u32,
        base: u64,
        chunks: &mut Vec<u32>,
        nodes: &mut Vec<u32>,
    ) {
        nodes.push(node);
        let s = span(level);
        for (i, slot) in self.node(node).slots.iter().enumerate() {
            let e = slot.load(Acquire);
            if e == 0 {
                continue;
            }
            let start = base.saturating_add((i as u64).saturating_mul(s));
            if level == 0 {
                if self.owns_chunk(ino, start, e - 1) {
                    chunks.push(e - 1);
                }
            } else if self.owns_node(ino, e - 1) {
                self.collect_subtree(ino, e - 1, level - 1, start, chunks, nodes);
            }
        }
    }

    /// One mapping of (ino, gen) is gone (its pin description was closed): the last one trims
    /// the chunks a truncation kept past the end.
    pub(crate) fn unpin(&self, ino: u32, gen: u32) -> Result<()> {
        let _g = self.lock_inode(ino)?;
        let inode = self.inode(ino);
        let life = inode.life.load(Acquire);
        let maps = life & LIFE_MAPS_MASK;
        if inode.gen.load(Acquire) != gen || maps == 0 || maps == LIFE_MAPS_MASK {
            return Ok(());
        }
        inode.life.fetch_sub(1 << LIFE_MAPS_SHIFT, AcqRel);
        if maps == 1 << LIFE_MAPS_SHIFT && !is_dir_state(inode.state.load(Acquire)) {
            let keep = inode.size.load(Acquire).div_ceil(self.geo.chunk_size);
            self.map_truncate(ino, keep)?;
        }
        Ok(())
    }

    /// Frees all data of an inode (inode lock held).
    pub(crate) fn free_file_data(&self, ino: u32) -> Result<()> {
        self.map_truncate(ino, 0)?;
        self.inode(ino).size.store(0, Release);
        Ok(())
    }

    /// After a holder of inode `ino`'s lock died: free chunks and nodes marked as the inode's
    /// that its map does not reach (allocated but never published, or unlinked but not yet
    /// freed), and recount. Inode lock held. Cost: one pass over the state tables.
    pub(crate) fn repair_inode(&self, ino: u32) -> Result<()> {
        let inode = self.inode(ino);
        let live = inode.state.load(Acquire) != INODE_FREE;
        if !live {
            inode.map.store(0, Release);
            inode.size.store(0, Release);
        }
        let mut reachable = vec![false; self.geo.map_nodes as usize];
        // A damaged map word reaches nothing: what it would name stays for fsck to report.
        if let Ok(MapTop::Tree(root, h)) = self.map_top_checked(ino) {
            if self.owns_node(ino, root) {
                let mut chunks = Vec::new();
                let mut nodes = Vec::new();
                self.collect_subtree(ino, root, h - 1, 0, &mut chunks, &mut nodes);
                for n in nodes {
                    reachable[n as usize] = true;
                }
            }
        }
        let h = self.header();
        let _g = self.lock_alloc()?;
        let (mut mem, mut spill) = (0u32, 0u32);
        for (c, st) in self.chunk_states().iter().enumerate() {
            let s = st.load(Acquire);
            if state_tag(s) != TAG_USED || used_ino(s) != ino {
                continue;
            }
            if live && self.map_lookup(ino, used_idx(s) as u64) == Ok(Some(c as u32)) {
                if self.is_spill(c as u32) {
                    spill += 1
                } else {
                    mem += 1
                }
            } else {
                self.push_free_locked(c as u32);
            }
        }
        for (n, st) in self.node_states().iter().enumerate() {
            let s = st.load(Acquire);
            if state_tag(s) == TAG_USED && used_ino(s) == ino && !reachable[n] {
                self.free_node_locked(n as u32, h);
            }
        }
        inode.chunks_mem.store(mem, Relaxed);
        inode.chunks_spill.store(spill, Relaxed);
        // A truncation cut short by the crash leaves the sequence odd: close it.
        if inode.trunc_seq.load(Relaxed) & 1 == 1 {
            inode.trunc_seq.fetch_add(1, Release);
        }
        Ok(())
    }

    /// Frees chunks and nodes still owned by removed inodes (namespace lock held, so no
    /// inode can be created meanwhile; removed inodes are never written to).
    pub(crate) fn sweep_removed_inodes(&self) -> Result<()> {
        let h = self.header();
        let _g = self.lock_alloc()?;
        // An owner past the inode table is no file either: its chunk is freed the same way.
        let removed = |s: u64| {
            state_tag(s) == TAG_USED
                && (used_ino(s) >= self.geo.max_inodes
                    || self.inode(used_ino(s)).state.load(Acquire) == INODE_FREE)
        };
        for (c, st) in self.chunk_states().iter().enumerate() {
            if removed(st.load(Acquire)) {
                self.push_free_locked(c as u32);
            }
        }
        for (n, st) in self.node_states().iter().enumerate() {
            if removed(st.load(Acquire)) {
                self.free_node_locked(n as u32, h);
            }
        }
        Ok(())
    }

    // ---- raw chunk I/O --------------------------------------------------------------------

    fn spill_file(&self) -> Result<&crate::block::Spill> {
        self.spill
            .as_ref()
            .ok_or_else(|| Error::new(libc::EIO, "spill chunk without a spill file"))
    }

    fn chunk_write(&self, c: u32, within: u64, data: &[u8]) -> Result<()> {
        if self.is_spill(c) {
            let spill = self.spill_file()?;
            // write_all_at retries short writes and EINTR.
            spill
                .file
                .write_all_at(data, self.spill_offset(c) + within)
                .map_err(|e| Error::from_io(&e, format!("spill file {}", spill.path.display())))?;
            self.spill_dirty.store(true, Relaxed);
        } else {
            self.memory_chunk_write(c, within, data);
        }
        Ok(())
    }

    /// Copies `data` to `within` of memory chunk `c` (not spilled), which the caller's inode
    /// owns under its lock; `within + data.len()` must not pass the chunk's end.
    #[inline]
    fn memory_chunk_write(&self, c: u32, within: u64, data: &[u8]) {
        assert!(within + data.len() as u64 <= self.geo.chunk_size);
        // SAFETY: the destination lies inside memory chunk c (asserted above; chunk_ptr
        // checks c), which the caller's inode owns under its lock.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.chunk_ptr(c).add(within as usize),
                data.len(),
            )
        };
    }

    /// Copies from `within` of memory chunk `c` (not spilled) into `out`; `within +
    /// out.len()` must not pass the chunk's end. Lock-free readers check afterwards that the
    /// chunk was not freed meanwhile.
    #[inline]
    fn memory_chunk_read(&self, c: u32, within: u64, out: &mut [u8]) {
        assert!(within + out.len() as u64 <= self.geo.chunk_size);
        // SAFETY: the source lies inside memory chunk c (asserted above; chunk_ptr_to_read
        // checks c).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.chunk_ptr_to_read(c).add(within as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }

    fn chunk_zero(&self, c: u32, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        if self.is_spill(c) {
            let mut at = from;
            while at < to {
                let n = (to - at).min(ZEROS.len() as u64);
                self.chunk_write(c, at, &ZEROS[..n as usize])?;
                at += n;
            }
        } else {
            // SAFETY: [from, to) lies within chunk c (to <= chunk size), owned under our lock.
            unsafe {
                std::ptr::write_bytes(
                    self.chunk_ptr(c).add(from as usize),
                    0,
                    (to - from) as usize,
                )
            };
        }
        Ok(())
    }

    fn chunk_read(&self, c: u32, within: u64, out: &mut [u8]) -> Result<()> {
        if self.is_spill(c) {
            let spill = self.spill_file()?;
            spill
                .file
                .read_exact_at(out, self.spill_offset(c) + within)
                .map_err(|e| Error::from_io(&e, format!("spill file {}", spill.path.display())))
        } else {
            self.memory_chunk_read(c, within, out);
            Ok(())
        }
    }

    // ---- file operations ------------------------------------------------------------------

    /// Zeroes [from, to) of a file wherever chunks are allocated (inode lock held): bytes
    /// past the old end of file may hold stale data and must read as zeros once covered.
    fn zero_range(&self, ino: u32, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let cs = self.geo.chunk_size;
        let mut hits = Vec::new();
        self.for_each_chunk(ino, from / cs, to.div_ceil(cs), &mut |idx, c| {
            hits.push((idx, c))
        })?;
        for (idx, c) in hits {
            let start = idx * cs;
            self.chunk_zero(c, from.max(start) - start, to.min(start + cs) - start)?;
        }
        Ok(())
    }

    /// The chunk at `idx` of `ino` if the file's lock hint names it (inode lock held): the
    /// chunk last written, checked to be still marked USED(ino, idx). A chunk so marked is
    /// the one the map publishes at `idx` (an unpublished one is a dead holder's leftover,
    /// which taking the lock repaired), so this skips the walk down the map, whose nodes
    /// were a sixth of a 64-byte write. A truncation or a free leaves the hint stale; the
    /// check then fails.
    #[inline]
    fn hinted_chunk(&self, ino: u32, idx: u64) -> Option<u32> {
        self.chunk_if_hinted(ino, idx, self.inode(ino).lock.hint.load(Relaxed))
    }

    /// The chunk a hint word (`idx << 32 | chunk + 1`) names for `idx` of `ino`, if the
    /// chunk's state says it still is that.
    #[inline(always)]
    pub(crate) fn chunk_if_hinted(&self, ino: u32, idx: u64, hint: u64) -> Option<u32> {
        if hint >> 32 != idx || idx > u32::MAX as u64 {
            return None;
        }
        let c = (hint as u32).checked_sub(1)?;
        let state = self.chunk_states().get(c as usize)?.load(Relaxed);
        (state == used(ino, idx as u32)).then_some(c)
    }

    /// Remembers chunk `c` at `idx` of `ino` as the hint (inode lock held).
    #[inline]
    fn set_hint(&self, ino: u32, idx: u64, c: u32) {
        let hint = &self.inode(ino).lock.hint;
        if let Some(value) = hint_word(idx, c) {
            if hint.load(Relaxed) != value {
                hint.store(value, Relaxed);
            }
        }
    }

    /// Writes `buf` at `offset` (inode lock held). Returns bytes written: short only when the
    /// store filled up after some bytes went in (ENOSPC if none did).
    pub(crate) fn write_locked(&self, ino: u32, buf: &[u8], offset: u64) -> Result<usize> {
        let cs = self.geo.chunk_size;
        let inode = self.inode(ino);
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.geo.max_file_bytes())
            .ok_or_else(|| {
                Error::new(
                    libc::EFBIG,
                    format!(
                        "write beyond the {} byte file size limit",
                        self.geo.max_file_bytes()
                    ),
                )
            })?;
        if buf.is_empty() {
            return Ok(0);
        }
        self.check_local(ino)?;
        // No `mod_seq` bump: a write comes through a handle or description that counts a
        // writer, whose open already bumped it, and no version is recorded durable while
        // writers > 0 (lifecycle.rs). An atomic here was a tenth of a 64-byte write.
        let old_size = inode.size.load(Acquire);
        if offset > old_size {
            self.zero_range(ino, old_size, offset)?;
        }
        let mut done = 0usize;
        let mut err = None;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (idx, within) = self.geo.chunk_of(pos);
            let n = ((cs - within) as usize).min(buf.len() - done);
            let part = &buf[done..done + n];
            let found = match self.hinted_chunk(ino, idx) {
                Some(c) => Some(c),
                None => self.map_lookup(ino, idx)?,
            };
            match found {
                Some(c) => {
                    self.chunk_write(c, within, part)?;
                    self.set_hint(ino, idx, c);
                }
                None => {
                    let valid_end = old_size.max(end).min((idx + 1) * cs) - idx * cs;
                    if let Err(e) = self.write_fresh_chunk(ino, idx, within, part, valid_end) {
                        err = Some(e);
                        break;
                    }
                }
            }
            done += n;
        }
        if done > 0 {
            mark_written(inode, old_size, offset + done as u64);
        }
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Writes `part` at `within` of a new chunk for `idx` of `ino` and publishes it (inode
    /// lock held); the chunk's bytes below `valid_end` that `part` does not cover are zeroed
    /// (a fresh chunk holds stale bytes). Out of line: a small write's path stays short.
    #[inline(never)]
    fn write_fresh_chunk(
        &self,
        ino: u32,
        idx: u64,
        within: u64,
        part: &[u8],
        valid_end: u64,
    ) -> Result<()> {
        let c = self.alloc_chunk(ino, idx as u32)?;
        let filled = self
            .chunk_zero(c, 0, within)
            .and_then(|_| self.chunk_write(c, within, part))
            .and_then(|_| self.chunk_zero(c, within + part.len() as u64, valid_end))
            .and_then(|_| self.map_insert(ino, idx, c));
        if let Err(e) = filled {
            // Never published: give the chunk back (repair would find it too).
            let _ = self.free_chunks(&[c]);
            return Err(e);
        }
        let inode = self.inode(ino);
        if self.is_spill(c) {
            inode.chunks_spill.fetch_add(1, Relaxed);
        } else {
            inode.chunks_mem.fetch_add(1, Relaxed);
        }
        self.set_hint(ino, idx, c);
        Ok(())
    }

    /// EIO if the file's content is only in a level below (LIFE_REMOTE): it must never read
    /// as zeros.
    pub(crate) fn check_local(&self, ino: u32) -> Result<()> {
        if self.inode(ino).life.load(Acquire) & LIFE_REMOTE == 0 {
            return Ok(());
        }
        Err(Error::new(
            libc::EIO,
            "the file's content is only in a level below this node's store: open it again \
             under cascade run (read-through fetches it) or restore it",
        ))
    }

    /// Reads into `buf` from `offset`; holes read as zeros. Lock-free, like a seqlock: if a
    /// truncation or removal of this file freed chunks meanwhile, the copy may hold bytes of
    /// a reused chunk, so it is retried; after a few tries the read takes the file's lock.
    /// A damaged map is EIO, never zeros; an error seen while a truncation raced the read
    /// (a chunk freed under it) is retried like a torn copy.
    pub(crate) fn read(&self, ino: u32, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.check_local(ino)?;
        let seq = &self.inode(ino).trunc_seq;
        for _ in 0..READ_RETRIES {
            let before = seq.load(Acquire);
            if before & 1 == 0 {
                let n = self.read_unlocked(ino, buf, offset);
                std::sync::atomic::fence(Acquire);
                if seq.load(Relaxed) == before {
                    return n;
                }
            }
            std::thread::yield_now();
        }
        let _g = self.lock_inode(ino)?;
        self.read_unlocked(ino, buf, offset)
    }

    /// The usual small read without the general loop: `buf` is filled from one memory
    /// chunk inside the file, found through `hint` (the reading handle's last chunk) or one
    /// map lookup that then becomes the hint. Lock-free like [`Self::read`], in one try: None
    /// when any of that does not hold or a truncation moved the sequence meanwhile, and the
    /// caller takes [`Self::read`].
    #[inline]
    pub(crate) fn read_hinted(
        &self,
        ino: u32,
        buf: &mut [u8],
        offset: u64,
        hint: &AtomicU64,
    ) -> Option<usize> {
        // Starts this process's populate thread on its first read, as every other path
        // to data does; then `memory_chunk_to_read` finds it started.
        self.will_touch_data();
        self.read_in_one_chunk(self.inode(ino), buf, offset, |idx| {
            if let Some(c) = self.chunk_if_hinted(ino, idx, hint.load(Relaxed)) {
                return Some(c);
            }
            let c = self.map_lookup(ino, idx).ok()??;
            if let Some(value) = hint_word(idx, c) {
                hint.store(value, Relaxed);
            }
            Some(c)
        })
    }

    /// The read of [`Self::read_hinted`], with the chunk of index `idx` from `find`.
    #[inline(always)]
    fn read_in_one_chunk(
        &self,
        inode: &Inode,
        buf: &mut [u8],
        offset: u64,
        find: impl FnOnce(u64) -> Option<u32>,
    ) -> Option<usize> {
        let read = OneChunkRead::of(self.geo.chunk_size, inode, buf.len(), offset)?;
        let chunk = self.memory_chunk_to_read(find(read.idx)?)?;
        // SAFETY: `chunk` is a memory chunk of this process's mapping.
        unsafe { read.finish(inode, chunk, buf) }
    }

    /// Runs `f`, a lock-free look at `ino`'s map outside `read`, so that a truncation racing
    /// it (a chunk freed and reused under it) is not taken for damage: an error seen while
    /// the truncation sequence moved is retried, after a few tries under the file's lock.
    pub(crate) fn map_stable<T>(&self, ino: u32, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let seq = &self.inode(ino).trunc_seq;
        for _ in 0..READ_RETRIES {
            let before = seq.load(Acquire);
            if before & 1 == 0 {
                let r = f();
                std::sync::atomic::fence(Acquire);
                if r.is_ok() || seq.load(Relaxed) == before {
                    return r;
                }
            }
            std::thread::yield_now();
        }
        let _g = self.lock_inode(ino)?;
        f()
    }

    fn read_unlocked(&self, ino: u32, buf: &mut [u8], offset: u64) -> Result<usize> {
        let cs = self.geo.chunk_size;
        let size = self.inode(ino).size.load(Acquire);
        if offset >= size {
            return Ok(0);
        }
        let total = (buf.len() as u64).min(size - offset) as usize;
        let mut done = 0;
        while done < total {
            let pos = offset + done as u64;
            let (idx, within) = self.geo.chunk_of(pos);
            let n = ((cs - within) as usize).min(total - done);
            let out = &mut buf[done..done + n];
            match self.map_lookup(ino, idx)? {
                Some(c) => self.chunk_read(c, within, out)?,
                None => out.fill(0),
            }
            done += n;
        }
        Ok(total)
    }

    /// Sets the file size (inode lock held): shrinking frees whole chunks past the end at once;
    /// growing makes the new range read as zeros.
    pub(crate) fn set_len_locked(&self, ino: u32, len: u64) -> Result<()> {
        if len > self.geo.max_file_bytes() {
            return Err(Error::new(
                libc::EFBIG,
                format!("size {len} exceeds the file size limit"),
            ));
        }
        let inode = self.inode(ino);
        if len != 0 {
            self.check_local(ino)?;
        }
        inode.mod_seq.fetch_add(1, AcqRel);
        if len == 0 {
            // Rewritten from scratch: no longer the remains of a writer that died, nor a
            // file whose content is elsewhere.
            inode
                .life
                .fetch_and(!(crate::layout::LIFE_TORN | LIFE_REMOTE), AcqRel);
            inode
                .life
                .fetch_add(1 << crate::layout::LIFE_REWRITE_SHIFT, AcqRel);
        }
        let old = inode.size.load(Acquire);
        if len < old {
            inode.size.store(len, Release); // publish the new end first: never covers freed data
                                            // A mapping may still reach past the new end: its chunks stay this file's (they
                                            // read as the old bytes there, never as another file's) until the last unpin.
            if inode.life.load(Acquire) & LIFE_MAPS_MASK == 0 {
                self.map_truncate(ino, len.div_ceil(self.geo.chunk_size))?;
            }
        } else if len > old {
            self.zero_range(ino, old, len)?;
            inode.size.store(len, Release);
        }
        let now = coarse_now_ns();
        inode.mtime.store(now, Relaxed);
        inode.ctime.store(now, Relaxed);
        Ok(())
    }

    /// `ino`'s (mtime, ctime), setting both to now first if a write marked them for update
    /// ([`TIMES_MARKED`]). Racing resolvers agree: one sets mtime, all read it back.
    pub(crate) fn file_times(&self, ino: u32) -> (i64, i64) {
        let inode = self.inode(ino);
        let mut mtime = inode.mtime.load(Relaxed);
        if mtime == TIMES_MARKED {
            let now = coarse_now_ns();
            mtime = match inode
                .mtime
                .compare_exchange(TIMES_MARKED, now, Relaxed, Relaxed)
            {
                Ok(_) => now,
                Err(set) => set,
            };
            inode.ctime.fetch_max(mtime, Relaxed);
        }
        (mtime, inode.ctime.load(Relaxed))
    }

    pub(crate) fn chunk_infos(&self, ino: u32) -> Result<Vec<ChunkInfo>> {
        self.map_stable(ino, || self.chunk_infos_once(ino))
    }

    fn chunk_infos_once(&self, ino: u32) -> Result<Vec<ChunkInfo>> {
        let cs = self.geo.chunk_size;
        let size = self.inode(ino).size.load(Acquire);
        let mut out = Vec::new();
        self.for_each_chunk(ino, 0, size.div_ceil(cs), &mut |idx, c| {
            let location = if self.is_spill(c) {
                ChunkLocation::Spill {
                    offset: self.spill_offset(c),
                }
            } else {
                ChunkLocation::Memory {
                    offset: c as u64 * cs,
                }
            };
            out.push(ChunkInfo {
                index: idx,
                chunk_id: c,
                location,
                length: cs.min(size - idx * cs),
            });
        })?;
        Ok(out)
    }

    pub(crate) fn sync_spill(&self) -> Result<()> {
        if let Some(s) = &self.spill {
            if self.spill_dirty.swap(false, Relaxed) {
                s.file
                    .sync_data()
                    .map_err(|e| Error::from_io(&e, format!("spill file {}", s.path.display())))?;
            }
        }
        Ok(())
    }
}

/// The top of a file's chunk map (the inode's `map` word).
#[derive(Clone, Copy)]
enum MapTop {
    Empty,
    /// A tree of height 0: the file's only chunk, at index 0.
    Chunk(u32),
    /// Root node and height (at least 1).
    Tree(u32, u32),
}

/// A map word with a height but no root node, a chunk past the table, or taller than any map.
#[cold]
#[inline(never)]
fn bad_map_word(ino: u32, m: u64) -> Error {
    let h = map_height(m);
    if h == 0 {
        Error::damaged(format!(
            "the chunk map of inode {ino} names chunk {} at index 0, past the chunk table",
            map_root(m) - 1
        ))
    } else if h > MAX_MAP_HEIGHT {
        Error::damaged(format!(
            "the chunk map of inode {ino} is {h} levels tall, more than {MAX_MAP_HEIGHT}"
        ))
    } else {
        Error::damaged(format!(
            "the chunk map of inode {ino} has {h} levels but no root node"
        ))
    }
}

/// A chunk hint's word: `idx << 32 | chunk + 1`; None for an index past what it can hold.
#[inline]
pub(crate) fn hint_word(idx: u64, c: u32) -> Option<u64> {
    (idx <= u32::MAX as u64).then_some(idx << 32 | (c as u64 + 1))
}

/// A write into one chunk ([`OneChunkWrite::of`]): the chunk's index, where in it the
/// bytes go, and the file's size before and end after.
pub(crate) struct OneChunkWrite {
    pub idx: u64,
    within: u64,
    old_size: u64,
    end: u64,
}

impl OneChunkWrite {
    /// Where a write of `len` bytes at `offset` goes if it fits one chunk and starts at or
    /// before the end of the file, the file's content being here (inode lock held); None
    /// otherwise. The checks of `File::write_hinted`, before its chunk is known.
    #[inline(always)]
    pub(crate) fn of(
        limits: WriteLimits,
        inode: &Inode,
        len: usize,
        offset: u64,
    ) -> Option<OneChunkWrite> {
        let idx = offset >> limits.chunk_size.trailing_zeros();
        let within = offset & (limits.chunk_size - 1);
        let end = offset.checked_add(len as u64)?;
        if len == 0
            || within + len as u64 > limits.chunk_size
            || end > limits.max_file_bytes
            || inode.life.load(Acquire) & LIFE_REMOTE != 0
        {
            return None;
        }
        let old_size = inode.size.load(Acquire);
        (offset <= old_size).then_some(OneChunkWrite {
            idx,
            within,
            old_size,
            end,
        })
    }

    /// Copies `buf` into `chunk` and marks the file written; returns the bytes written.
    ///
    /// # Safety
    /// `chunk` is the first byte of the memory chunk, mapped in this process, that the file
    /// owns at `self.idx`, and the caller holds the inode's lock; `buf` is the buffer whose
    /// length `self` was made for.
    #[inline(always)]
    pub(crate) unsafe fn finish(self, inode: &Inode, chunk: *mut u8, buf: &[u8]) -> usize {
        // SAFETY: within + buf.len() <= chunk_size (`of`), so the bytes lie inside the
        // chunk, which the file owns under the lock the caller holds.
        unsafe { copy_small_inline(buf.as_ptr(), chunk.add(self.within as usize), buf.len()) };
        mark_written(inode, self.old_size, self.end);
        buf.len()
    }
}

/// Copies `len` bytes from `s` to `dst`: 16 to 64 bytes with two or four 16-byte moves in
/// line, which overlap for lengths between; other lengths through `memcpy`. The usual small
/// write's copy then needs no call, whose cost (and the registers saved around it) was a
/// tenth of the write's instructions.
///
/// # Safety
/// `s` is valid for reading and `dst` for writing `len` bytes; they do not overlap.
#[inline(always)]
unsafe fn copy_small_inline(s: *const u8, dst: *mut u8, len: usize) {
    if (16..=64).contains(&len) {
        // SAFETY: 16 <= len: the moves at 0, at 16 (when len > 32), at len - 32 (when len
        // > 32) and at len - 16 lie inside both buffers, which the caller provides.
        unsafe {
            let first = load16(s);
            let last = load16(s.add(len - 16));
            if len > 32 {
                let second = load16(s.add(16));
                let before_last = load16(s.add(len - 32));
                store16(dst.add(16), second);
                store16(dst.add(len - 32), before_last);
            }
            store16(dst, first);
            store16(dst.add(len - 16), last);
        }
    } else {
        // SAFETY: as the caller's.
        unsafe { std::ptr::copy_nonoverlapping(s, dst, len) }
    }
}

#[cfg(target_arch = "x86_64")]
type Bytes16 = std::arch::x86_64::__m128i;
#[cfg(not(target_arch = "x86_64"))]
type Bytes16 = u128;

/// 16 bytes at `p`, unaligned, in a vector register where there is one.
///
/// # Safety
/// `p` is valid for reading 16 bytes.
#[inline(always)]
unsafe fn load16(p: *const u8) -> Bytes16 {
    // SAFETY: as the caller's; SSE2 is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_loadu_si128(p.cast())
    }
    // SAFETY: as the caller's.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe {
        p.cast::<u128>().read_unaligned()
    }
}

/// Stores 16 bytes at `p`, unaligned.
///
/// # Safety
/// `p` is valid for writing 16 bytes.
#[inline(always)]
unsafe fn store16(p: *mut u8, v: Bytes16) {
    // SAFETY: as the caller's; SSE2 is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_storeu_si128(p.cast(), v)
    }
    // SAFETY: as the caller's.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe {
        p.cast::<u128>().write_unaligned(v)
    }
}

/// A read from one memory chunk ([`Block::read_hinted`]): the chunk's index, where in it
/// the bytes are, how many, and the file's truncation sequence before (a seqlock: bytes of
/// a chunk a truncation freed and reused meanwhile are discarded).
pub(crate) struct OneChunkRead {
    pub idx: u64,
    within: u64,
    len: usize,
    seq_before: u32,
}

impl OneChunkRead {
    /// Where a read of up to `want` bytes at `offset` is if the bytes there lie in one chunk
    /// of a file whose content is here and no truncation is under way; None otherwise
    /// (also at or past the end of the file).
    #[inline(always)]
    pub(crate) fn of(
        chunk_size: u64,
        inode: &Inode,
        want: usize,
        offset: u64,
    ) -> Option<OneChunkRead> {
        let seq_before = inode.trunc_seq.load(Acquire);
        if seq_before & 1 != 0 || inode.life.load(Acquire) & LIFE_REMOTE != 0 {
            return None;
        }
        let size = inode.size.load(Acquire);
        let idx = offset >> chunk_size.trailing_zeros();
        let within = offset & (chunk_size - 1);
        let len = (want as u64).min(size.checked_sub(offset)?);
        if len == 0 || within + len > chunk_size {
            return None;
        }
        Some(OneChunkRead {
            idx,
            within,
            len: len as usize,
            seq_before,
        })
    }

    /// Copies the bytes from `chunk` into `buf`; their count, or None when a truncation
    /// moved the sequence meanwhile (the bytes copied are then to be discarded).
    ///
    /// # Safety
    /// `chunk` is the first byte of a memory chunk in this process's mapping, and `buf` is
    /// the buffer `self` was made for (at least `len` bytes).
    #[inline(always)]
    pub(crate) unsafe fn finish(
        self,
        inode: &Inode,
        chunk: *const u8,
        buf: &mut [u8],
    ) -> Option<usize> {
        // SAFETY: within + len <= chunk_size (`of`) and len <= buf.len(): the bytes lie
        // inside the chunk and fit `buf`. Bytes of a chunk freed and reused meanwhile are
        // discarded below.
        unsafe { copy_small_inline(chunk.add(self.within as usize), buf.as_mut_ptr(), self.len) };
        std::sync::atomic::fence(Acquire);
        (inode.trunc_seq.load(Relaxed) == self.seq_before).then_some(self.len)
    }
}

/// What bounds a write in one chunk: the chunk size (a power of two) and the file size
/// limit, copied out of the geometry so a handle can keep them at hand.
#[derive(Clone, Copy)]
pub(crate) struct WriteLimits {
    pub chunk_size: u64,
    pub max_file_bytes: u64,
}

impl Geometry {
    #[inline(always)]
    pub(crate) fn write_limits(&self) -> WriteLimits {
        WriteLimits {
            chunk_size: self.chunk_size,
            max_file_bytes: self.max_file_bytes(),
        }
    }
}

/// After a write that ended at `end` (inode lock held): the size grows to `end` if it was
/// `old_size` and less, and the file's times are marked for the next update point.
#[inline(always)]
fn mark_written(inode: &Inode, old_size: u64, end: u64) {
    if end > old_size {
        inode.size.store(end, Release);
    }
    if inode.mtime.load(Relaxed) != TIMES_MARKED {
        inode.mtime.store(TIMES_MARKED, Relaxed);
    }
}
