//! Chunk and map-node allocation.
//!
//! Authority: each chunk's state word (FREE / LEASED(slot) / USED(inode, index)) and each map
//! node's state word (FREE / USED(inode)). The free stacks are derived: they are changed only
//! under the allocator lock, together with the FREE transitions, and rebuilt from the state
//! words whenever a holder of that lock died.
//!
//! Contention: each attached process owns a lease slot holding a small batch of free memory
//! chunks. Taking a chunk from the own batch (LEASED -> USED) and returning a freed one to it
//! (USED -> LEASED) need no shared lock; only refills and overflow touch the allocator lock.

use crate::block::{my_pid, now_ns, process_alive, process_start_time, Block, LeaseLocal};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::lock::LockGuard;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

const RECLAIM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Why a write got ENOSPC; kept in the header for `cascade status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum EnospcReason {
    MemoryFullNoSpill = 1,
    MemoryAndSpillFull = 2,
    FileTableFull = 3,
    MapNodesFull = 4,
}

impl EnospcReason {
    pub(crate) fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::MemoryFullNoSpill,
            2 => Self::MemoryAndSpillFull,
            3 => Self::FileTableFull,
            4 => Self::MapNodesFull,
            _ => return None,
        })
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::MemoryFullNoSpill => {
                "all memory chunks are in use and no spill file is configured"
            }
            Self::MemoryAndSpillFull => "all memory chunks and all spill chunks are in use",
            Self::FileTableFull => "the file table is full (raise max_files)",
            Self::MapNodesFull => "the chunk-map node pool is full (too many very sparse files)",
        }
    }
}

impl Block {
    pub(crate) fn lock_alloc(&self) -> Result<LockGuard<'_>> {
        let mut g = self.header().alloc_lock.lock()?;
        if g.recovered() {
            self.reclaim_dead_leases();
            self.rebuild_free_stacks();
            g.mark_consistent();
        }
        Ok(g)
    }

    pub(crate) fn record_enospc(&self, reason: EnospcReason) -> Error {
        let h = self.header();
        h.enospc_time.store(now_ns(), Relaxed);
        h.enospc_pid.store(my_pid(), Relaxed);
        h.enospc_reason.store(reason as u32, Release);
        Error::new(
            libc::ENOSPC,
            format!("store {}: {}", self.name, reason.describe()),
        )
    }

    /// Rebuilds the free stacks from the state words. Allocator lock held (or block unpublished).
    pub(crate) fn rebuild_free_stacks(&self) {
        let states = self.chunk_states();
        let mem = self.geo.mem_chunks;
        let mut top = 0;
        // Push in descending order so pops hand out low chunk ids first (nicer locality).
        for c in (0..mem).rev() {
            if states[c as usize].load(Acquire) == 0 {
                self.free_mem_stack()[top].store(c, Relaxed);
                top += 1;
            }
        }
        self.header().free_mem_top.store(top as u32, Release);
        top = 0;
        for c in (mem..self.geo.total_chunks()).rev() {
            if states[c as usize].load(Acquire) == 0 {
                self.free_spill_stack()[top].store(c, Relaxed);
                top += 1;
            }
        }
        self.header().free_spill_top.store(top as u32, Release);
        top = 0;
        for (n, s) in self.node_states().iter().enumerate().rev() {
            if s.load(Acquire) == 0 {
                self.free_node_stack()[top].store(n as u32, Relaxed);
                top += 1;
            }
        }
        self.header().free_node_top.store(top as u32, Release);
    }

    /// Claims a lease slot for this process at attach.
    pub(crate) fn claim_lease(&self) -> Result<()> {
        let mut local = self.lock_lease();
        local.slot = self.claim_lease_slot()?;
        local.pid = my_pid();
        Ok(())
    }

    /// This process's lease slot (`local`: its lease mutex, held), claimed first if it has
    /// none: a forked child takes a slot of its own rather than share its parent's, and so
    /// does a thread still working after detach.
    pub(crate) fn own_slot(&self, local: &mut LeaseLocal) -> Result<u32> {
        if local.pid != my_pid() {
            local.slot = self.claim_lease_slot()?;
            local.pid = my_pid();
        }
        Ok(local.slot)
    }

    /// Takes a free lease slot (freeing slots of dead processes on the way). Lock order is
    /// always: this process's lease mutex, then the allocator lock.
    fn claim_lease_slot(&self) -> Result<u32> {
        let pid = my_pid();
        let start = process_start_time(pid).unwrap_or(0);
        let _g = self.lock_alloc()?;
        for s in 0..self.geo.lease_slots {
            let slot = self.lease_slot(s);
            let owner = slot.pid.load(Acquire);
            if owner != 0 && process_alive(owner, slot.start_time.load(Acquire)) {
                continue;
            }
            if owner != 0 {
                self.reclaim_slot(s);
            }
            slot.start_time.store(start, Relaxed);
            slot.count.store(0, Relaxed);
            slot.pid.store(pid, Release);
            return Ok(s);
        }
        Err(Error::new(
            libc::EMFILE,
            format!(
                "store {}: {} processes are attached already (the limit)",
                self.name, self.geo.lease_slots
            ),
        ))
    }

    /// Gives back this process's batches (chunks and inodes) and its slot (on detach).
    pub(crate) fn release_lease(&self) {
        // Namespace lock before the lease mutex (the order of a create).
        self.return_own_inode_batch();
        let mut local = self.lock_lease();
        if local.pid != my_pid() {
            return; // a forked child never claimed a slot of its own
        }
        if let Ok(_g) = self.lock_alloc() {
            self.reclaim_slot(local.slot);
            self.lease_slot(local.slot).pid.store(0, Release);
            // A thread still writing after this claims a fresh slot (as a forked child does).
            local.pid = 0;
        }
    }

    /// Frees every chunk leased to `slot`. Allocator lock held; the owner is dead or is us.
    fn reclaim_slot(&self, s: u32) {
        let tag = leased(s);
        for (c, st) in self.chunk_states().iter().enumerate() {
            if st.load(Acquire) == tag {
                self.push_free_locked(c as u32);
            }
        }
        self.lease_slot(s).count.store(0, Release);
    }

    pub(crate) fn reclaim_dead_leases(&self) -> usize {
        let mut n = 0;
        for s in 0..self.geo.lease_slots {
            let slot = self.lease_slot(s);
            let owner = slot.pid.load(Acquire);
            if owner != 0 && !process_alive(owner, slot.start_time.load(Acquire)) {
                self.reclaim_slot(s);
                slot.pid.store(0, Release);
                n += 1;
            }
        }
        n
    }

    /// Marks chunk `c` (a checked id) FREE and pushes it on its stack. Allocator lock held.
    /// A stack top past the stack (damage) is mended by rebuilding the stacks from the state
    /// words, which is what they are derived from; fsck reports such a top.
    pub(crate) fn push_free_locked(&self, c: u32) {
        let h = self.header();
        self.chunk_states()[c as usize].store(0, Release);
        let (stack, top) = if self.is_spill(c) {
            (self.free_spill_stack(), &h.free_spill_top)
        } else {
            (self.free_mem_stack(), &h.free_mem_top)
        };
        let t = top.load(Relaxed) as usize;
        match stack.get(t) {
            Some(slot) => {
                slot.store(c, Relaxed);
                top.store(t as u32 + 1, Release);
            }
            None => self.rebuild_free_stacks(),
        }
    }

    /// Pops a free chunk or node id off `stack` (allocator lock held). The id must lie in
    /// `ids` and its word in `states` must be FREE: handing out anything else would give one
    /// file's chunk to another.
    fn pop_stack(
        stack: &[std::sync::atomic::AtomicU32],
        top: &std::sync::atomic::AtomicU32,
        ids: std::ops::Range<u32>,
        states: &[std::sync::atomic::AtomicU64],
        what: &str,
    ) -> Result<Option<u32>> {
        let t = top.load(Relaxed);
        if t == 0 {
            return Ok(None);
        }
        let Some(entry) = stack.get(t as usize - 1) else {
            return Err(Error::damaged(format!(
                "the {what} stack top is {t}, past its {} entries",
                stack.len()
            )));
        };
        let c = entry.load(Relaxed);
        let state = ids
            .contains(&c)
            .then(|| states.get(c as usize).map(|s| s.load(Acquire)))
            .flatten();
        match state {
            Some(TAG_FREE) => {}
            Some(s) => {
                return Err(Error::damaged(format!(
                    "the {what} stack holds {c}, which is marked {}",
                    describe_state(s)
                )))
            }
            None => {
                return Err(Error::damaged(format!(
                    "the {what} stack holds {c}, outside {}..{}",
                    ids.start, ids.end
                )))
            }
        }
        top.store(t - 1, Release);
        Ok(Some(c))
    }

    /// The chunks in lease slot `s`'s batch: its count, checked against the batch size.
    fn lease_count(&self, s: u32) -> Result<usize> {
        let n = self.lease_slot(s).count.load(Relaxed);
        if n > self.geo.lease_batch {
            return Err(Error::damaged(format!(
                "lease slot {s} counts {n} chunks, more than a batch of {}",
                self.geo.lease_batch
            )));
        }
        Ok(n as usize)
    }

    /// Finds a chunk for logical index `idx` of inode `ino` and marks it USED(ino, idx).
    /// Memory first (own batch, then a refill), the spill file only when memory is exhausted.
    /// The caller holds the inode's lock.
    pub(crate) fn alloc_chunk(&self, ino: u32, idx: u32) -> Result<u32> {
        let want = used(ino, idx);
        {
            let mut local = self.lock_lease();
            self.own_slot(&mut local)?;
            let slot = self.lease_slot(local.slot);
            if self.lease_count(local.slot)? == 0 {
                self.refill(local.slot)?;
            }
            let n = self.lease_count(local.slot)?;
            if n > 0 {
                let c = slot.ids[n - 1].load(Relaxed);
                // Only a chunk leased to this slot is ours to hand out.
                let state = self.chunk_states().get(c as usize).map(|s| s.load(Acquire));
                if state != Some(leased(local.slot)) {
                    return Err(Error::damaged(format!(
                        "lease slot {} holds chunk {c}, which is {}",
                        local.slot,
                        state.map_or_else(
                            || format!("past the {} chunks", self.geo.total_chunks()),
                            |s| format!("marked {}", describe_state(s))
                        )
                    )));
                }
                self.chunk_states()[c as usize].store(want, Release);
                slot.count.store(n as u32 - 1, Release);
                return Ok(c);
            }
        }
        let h = self.header();
        let g = self.lock_alloc()?;
        let popped = Self::pop_stack(
            self.free_spill_stack(),
            &h.free_spill_top,
            self.geo.mem_chunks..self.geo.total_chunks(),
            self.chunk_states(),
            "free spill chunk",
        )?;
        let c = match popped {
            Some(c) => c,
            None if self.reclaim_dead_leases() > 0 => {
                drop(g);
                return self.alloc_chunk(ino, idx);
            }
            None => {
                let reason = if self.geo.spill_chunks == 0 {
                    EnospcReason::MemoryFullNoSpill
                } else {
                    EnospcReason::MemoryAndSpillFull
                };
                return Err(self.record_enospc(reason));
            }
        };
        self.chunk_states()[c as usize].store(want, Release);
        Ok(c)
    }

    /// Moves up to one batch of free memory chunks into lease slot `s`.
    fn refill(&self, s: u32) -> Result<()> {
        let h = self.header();
        let _g = self.lock_alloc()?;
        if h.free_mem_top.load(Relaxed) == 0 {
            // Memory is exhausted: batches of dead processes are the only memory left. Looking
            // for them reads /proc, so do it at most every RECLAIM_INTERVAL while spilling.
            let mut last = self.last_reclaim.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < RECLAIM_INTERVAL) {
                return Ok(());
            }
            *last = Some(std::time::Instant::now());
            if self.reclaim_dead_leases() == 0 {
                return Ok(());
            }
        }
        let slot = self.lease_slot(s);
        let tag = leased(s);
        for _ in 0..self.geo.lease_batch {
            let n = self.lease_count(s)?;
            if n >= self.geo.lease_batch as usize {
                break;
            }
            let Some(c) = Self::pop_stack(
                self.free_mem_stack(),
                &h.free_mem_top,
                0..self.geo.mem_chunks,
                self.chunk_states(),
                "free memory chunk",
            )?
            else {
                break;
            };
            self.chunk_states()[c as usize].store(tag, Release);
            slot.ids[n].store(c, Relaxed);
            slot.count.store(n as u32 + 1, Release);
        }
        Ok(())
    }

    /// Frees chunks the caller's inode owned (already unlinked from its map). Memory chunks go
    /// back to this process's batch while it has room, the rest to the shared stacks.
    pub(crate) fn free_chunks(&self, ids: &[u32]) -> Result<()> {
        let mut rest = Vec::new();
        {
            let local = self.lock_lease();
            let own = local.pid == my_pid();
            let slot = self.lease_slot(local.slot);
            let tag = leased(local.slot);
            for &c in ids {
                let n = slot.count.load(Relaxed) as usize;
                if own && !self.is_spill(c) && n < self.geo.lease_batch as usize {
                    self.chunk_states()[c as usize].store(tag, Release);
                    slot.ids[n].store(c, Relaxed);
                    slot.count.store(n as u32 + 1, Release);
                } else {
                    rest.push(c);
                }
            }
        }
        if !rest.is_empty() {
            let _g = self.lock_alloc()?;
            for c in rest {
                self.push_free_locked(c);
            }
        }
        Ok(())
    }

    /// Allocates a zeroed map node owned by `ino`. The caller holds the inode's lock.
    pub(crate) fn alloc_node(&self, ino: u32) -> Result<u32> {
        let h = self.header();
        let _g = self.lock_alloc()?;
        let Some(n) = Self::pop_stack(
            self.free_node_stack(),
            &h.free_node_top,
            0..self.geo.map_nodes,
            self.node_states(),
            "free map node",
        )?
        else {
            return Err(self.record_enospc(EnospcReason::MapNodesFull));
        };
        for e in &self.node(n).slots {
            e.store(0, Relaxed);
        }
        self.node_states()[n as usize].store(used(ino, 0), Release);
        Ok(n)
    }

    pub(crate) fn free_nodes(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let h = self.header();
        let _g = self.lock_alloc()?;
        for &n in ids {
            self.free_node_locked(n, h);
        }
        Ok(())
    }

    /// Marks node `n` (a checked id) FREE and pushes it; a damaged stack top is mended as
    /// in `push_free_locked`.
    pub(crate) fn free_node_locked(&self, n: u32, h: &Header) {
        self.node_states()[n as usize].store(0, Release);
        let t = h.free_node_top.load(Relaxed);
        match self.free_node_stack().get(t as usize) {
            Some(slot) => {
                slot.store(n, Relaxed);
                h.free_node_top.store(t + 1, Release);
            }
            None => self.rebuild_free_stacks(),
        }
    }
}
