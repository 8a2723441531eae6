//! The verifier behind `cascade fsck`: checks every invariant of docs/store-layout.md.
//!
//! Errors are violated invariants (corruption). Warnings are what crashes legitimately leave
//! behind (chunks allocated but never published, batches of dead processes); `repair` returns
//! those to the free pool. Namespace and per-file checks are exact (they run under the
//! namespace lock and each file's lock); the allocator pass runs under the allocator lock.

use crate::block::{process_alive, Block};
use crate::error::Result;
use crate::layout::*;
use crate::types::FsckReport;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

pub(crate) fn run(b: &Block, repair: bool) -> Result<FsckReport> {
    let mut fsck = Fsck {
        b,
        g: &b.geo,
        repair,
        r: FsckReport::default(),
    };
    let ns = b.lock_ns()?;
    fsck.check_namespace();
    let refs = fsck.check_chunk_maps()?;
    let leaks = fsck.check_allocator(&refs)?;
    fsck.report_leaks(&leaks, &refs.recount)?;
    let unlinked = fsck.check_open_counts();
    drop(ns);
    fsck.reap_unlinked(unlinked)?;
    Ok(fsck.r)
}

/// One fsck pass: the block it checks and the report it fills.
struct Fsck<'a> {
    b: &'a Block,
    g: &'a Geometry,
    repair: bool,
    r: FsckReport,
}

/// The inodes by state, as the namespace check found them.
#[derive(Default)]
struct InodeCensus {
    /// Live inodes other than the root (each has a name in a directory).
    linked: u64,
    free: u64,
    /// Some linked inode is missing from the name hash.
    unindexed: bool,
}

/// What the files' chunk maps reference, and the files whose chunk counters disagree.
struct MapRefs {
    chunks: Vec<bool>,
    nodes: Vec<bool>,
    recount: BTreeSet<u32>,
}

/// Chunks and map nodes marked used by a file whose map does not reference them.
#[derive(Default)]
struct Leaks {
    /// Owners that are still files.
    live: BTreeSet<u32>,
    /// How many belong to removed files.
    removed: u64,
}

impl Leaks {
    fn add(&mut self, b: &Block, owner: u32) {
        if matches!(
            b.inode(owner).state.load(Acquire),
            INODE_FILE | INODE_ORPHAN
        ) {
            self.live.insert(owner);
        } else {
            self.removed += 1;
        }
    }
}

/// What the chunk states say about the free pool.
#[derive(Default)]
struct FreePool {
    /// Some free chunk is on no free stack.
    stack_incomplete: bool,
    /// Lease slots of dead processes that still hold chunks.
    dead_leases: BTreeSet<u32>,
}

impl Fsck<'_> {
    // ---- namespace ----

    /// Every inode's state, parent and name, then the index over them (name hash,
    /// directory lists, free inodes).
    fn check_namespace(&mut self) {
        if self.b.inode(ROOT_INO).state.load(Acquire) != INODE_DIR {
            self.r
                .errors
                .push("inode 0 (the root) is not a directory".into());
        }
        let census = self.check_inodes();
        // Always checked: it also reports index entries that name no inode.
        let disagrees = self.index_disagrees(&census);
        if census.unindexed || disagrees {
            self.r.warnings.push(
                "namespace index (name hash, directory lists, free inodes) is out of date".into(),
            );
            if self.repair {
                self.b.rebuild_namespace_index();
                self.r.repaired.push("rebuilt the namespace index".into());
            }
        }
        // Under the namespace lock no removal is at work: an odd stripe sequence is left
        // over (by damage; a dead remover's is made even by the recovery that locking ran)
        // and sends every lock-free lookup in that stripe to the lock.
        let odd: Vec<usize> = (self.b.header().ns_stripes.iter().enumerate())
            .filter(|(_, s)| s.load(Relaxed) & 1 != 0)
            .map(|(i, _)| i)
            .collect();
        if !odd.is_empty() {
            self.r.warnings.push(format!(
                "name-index stripe sequences {odd:?} are odd with no removal at work (lock-free \
                 lookups there take the lock)"
            ));
            if self.repair {
                for &i in &odd {
                    crate::lock::end_write(&self.b.header().ns_stripes[i]);
                }
                self.r
                    .repaired
                    .push("made the name-index stripe sequences even".into());
            }
        }
    }

    /// Counts the inodes by state and checks each linked one.
    fn check_inodes(&mut self) -> InodeCensus {
        let mut census = InodeCensus::default();
        for ino in 0..self.g.max_inodes {
            let state = self.b.inode(ino).state.load(Acquire);
            match state {
                INODE_FREE => {
                    census.free += 1;
                    continue;
                }
                INODE_FILE => self.r.files += 1,
                INODE_DIR => self.r.dirs += 1,
                // Unlinked while open: outside the namespace; checked with the open counts.
                INODE_ORPHAN => {
                    self.r.files += 1;
                    continue;
                }
                INODE_ORPHAN_DIR => {
                    self.r.dirs += 1;
                    continue;
                }
                s => {
                    self.r
                        .errors
                        .push(format!("inode {ino}: invalid state {s}"));
                    continue;
                }
            }
            if ino == ROOT_INO {
                continue;
            }
            census.linked += 1;
            if !self.check_linked_inode(ino, state) {
                census.unindexed = true;
            }
        }
        census
    }

    /// Checks a linked inode's parent, name and path to the root; false when the name
    /// index does not find it under its name.
    fn check_linked_inode(&mut self, ino: u32, state: u32) -> bool {
        let (b, g) = (self.b, self.g);
        let inode = b.inode(ino);
        let parent = link_parent(inode.link.load(Acquire));
        let name = b.name_of(ino);
        if parent >= g.max_inodes || b.inode(parent).state.load(Acquire) != INODE_DIR {
            self.r.errors.push(format!(
                "inode {ino}: parent {parent} is not a live directory"
            ));
            return true;
        }
        if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0) {
            self.r.errors.push(format!(
                "inode {ino}: invalid name {:?}",
                String::from_utf8_lossy(&name)
            ));
            return true;
        }
        let mut indexed = true;
        match b.lookup(parent, &String::from_utf8_lossy(&name)) {
            Ok(Some(found)) if found == ino => {}
            Ok(Some(other)) => self.r.errors.push(format!(
                "inode {ino} and inode {other} both have the name {:?} in directory {parent}",
                String::from_utf8_lossy(&name)
            )),
            Ok(None) => indexed = false,
            // A name-index entry past the inode table: the index is stale (rebuilt by repair).
            Err(_) => indexed = false,
        }
        if !self.reaches_root(ino) {
            self.r.errors.push(format!(
                "inode {ino}: not connected to the root (directory cycle)"
            ));
        }
        if state == INODE_DIR && inode.map.load(Acquire) != 0 {
            self.r
                .errors
                .push(format!("directory inode {ino} has a chunk map"));
        }
        indexed
    }

    /// Follows the parent links up from `ino`; false on a cycle or a link out of range.
    fn reaches_root(&self, ino: u32) -> bool {
        let (b, g) = (self.b, self.g);
        let mut cur = ino;
        let mut steps = 0;
        while cur != ROOT_INO && steps <= g.max_inodes {
            cur = link_parent(b.inode(cur).link.load(Acquire));
            steps += 1;
            if cur >= g.max_inodes {
                break;
            }
        }
        cur == ROOT_INO
    }

    /// Whether the directory lists, the name hash or the free inode stack disagree with
    /// the inodes' own parent links and counts.
    /// Entries naming no inode (past the table) are errors, as the store reports them.
    fn index_disagrees(&mut self, census: &InodeCensus) -> bool {
        let (b, g) = (self.b, self.g);
        let mut stale = false;
        let mut listed = 0u64;
        for dir in 0..g.max_inodes {
            if b.inode(dir).state.load(Acquire) != INODE_DIR {
                continue;
            }
            match b.list_dir_checked(dir) {
                Ok(entries) => listed += entries.len() as u64,
                Err(e) => {
                    self.r.errors.push(e.context().to_string());
                    stale = true;
                }
            }
        }
        for ino in 0..g.max_inodes {
            let inode = b.inode(ino);
            for (link, what) in [
                (inode.prev_sibling.load(Relaxed), "previous"),
                (inode.next_sibling.load(Relaxed), "next"),
            ] {
                if link != NIL && link >= g.max_inodes && is_linked(inode.state.load(Acquire)) {
                    self.r.errors.push(format!(
                        "inode {ino}: its {what} directory entry is inode {link}, past the {} \
                         inodes",
                        g.max_inodes
                    ));
                    stale = true;
                }
            }
        }
        let mut hashed = 0u64;
        for (i, s) in b.hash_slots().iter().enumerate() {
            let v = s.load(Relaxed);
            if v == 0 {
                continue;
            }
            hashed += 1;
            if v > g.max_inodes {
                self.r.errors.push(format!(
                    "name-index entry {i} names inode {}, past the {} inodes",
                    v - 1,
                    g.max_inodes
                ));
            }
        }
        // Free inodes are on the shared stack or in a process's batch.
        let free_top = b.header().free_inode_top.load(Acquire) as u64;
        let batched: u64 = (0..g.lease_slots)
            .map(|s| (b.lease_slot(s).inode_count.load(Acquire) as u64).min(INODE_BATCH as u64))
            .sum();
        stale
            || listed != census.linked
            || hashed != census.linked
            || free_top + batched != census.free
    }

    // ---- each file's chunk map (under its lock) ----

    /// Each file's map, under the file's lock.
    fn check_chunk_maps(&mut self) -> Result<MapRefs> {
        let (b, g) = (self.b, self.g);
        let mut refs = MapRefs {
            chunks: vec![false; g.total_chunks() as usize],
            nodes: vec![false; g.map_nodes as usize],
            recount: BTreeSet::new(),
        };
        for ino in 0..g.max_inodes {
            if !matches!(b.inode(ino).state.load(Acquire), INODE_FILE | INODE_ORPHAN) {
                continue;
            }
            let _fl = b.lock_inode(ino)?;
            self.check_file_map(ino, &mut refs);
        }
        Ok(refs)
    }

    /// Walks one file's map: its chunks must be marked used by it at their index, and its
    /// chunk counters must match what the map holds.
    fn check_file_map(&mut self, ino: u32, refs: &mut MapRefs) {
        let b = self.b;
        let inode = b.inode(ino);
        let m = inode.map.load(Acquire);
        if m == 0 {
            return;
        }
        let (mut chunks, mut nodes) = (Vec::new(), Vec::new());
        if map_height(m) == 0 {
            // A tree of height 0: the file's one chunk, at index 0.
            let c = map_root(m) - 1;
            if c >= b.geo.total_chunks() {
                self.r.errors.push(format!(
                    "inode {ino}: index 0 points at chunk {c}, which does not exist"
                ));
                return;
            }
            chunks.push((0, c));
        } else if map_height(m) > MAX_MAP_HEIGHT || map_root(m) == 0 {
            self.r.errors.push(format!(
                "inode {ino}: chunk map word {m:#x} is damaged (height {}, root {})",
                map_height(m),
                map_root(m) as i64 - 1
            ));
            return;
        } else {
            check_tree(
                b,
                ino,
                map_root(m) - 1,
                map_height(m) - 1,
                0,
                &mut chunks,
                &mut nodes,
                &mut self.r,
            );
        }
        for n in nodes {
            refs.nodes[n as usize] = true;
        }
        let (mut mem, mut spill) = (0u32, 0u32);
        for (idx, c) in chunks {
            refs.chunks[c as usize] = true;
            let s = b.chunk_states()[c as usize].load(Acquire);
            if s != used(ino, idx as u32) {
                self.r.errors.push(format!(
                    "inode {ino}: chunk {c} at index {idx} is in its map but marked {}",
                    describe_state(s)
                ));
            }
            if b.is_spill(c) {
                spill += 1
            } else {
                mem += 1
            }
        }
        if mem != inode.chunks_mem.load(Relaxed) || spill != inode.chunks_spill.load(Relaxed) {
            refs.recount.insert(ino);
        }
    }

    // ---- allocator ----

    /// Under the allocator lock: the free stacks, the chunk and node states against them
    /// and against the maps, then the free pool's leftovers (repaired with `repair`).
    fn check_allocator(&mut self, refs: &MapRefs) -> Result<Leaks> {
        let _al = self.b.lock_alloc()?;
        let in_stack = self.check_free_stacks();
        let mut leaks = Leaks::default();
        let pool = self.check_chunk_states(&in_stack, &refs.chunks, &mut leaks);
        self.check_node_states(&refs.nodes, &mut leaks);
        self.check_lease_counts();
        self.report_free_pool(&pool);
        Ok(leaks)
    }

    /// No lease slot counts more chunks than a batch (the allocator refuses such a slot).
    fn check_lease_counts(&mut self) {
        let g = self.g;
        for s in 0..g.lease_slots {
            let count = self.b.lease_slot(s).count.load(Acquire);
            if count > g.lease_batch {
                self.r.errors.push(format!(
                    "lease slot {s} counts {count} chunks, more than a batch of {}",
                    g.lease_batch
                ));
            }
        }
    }

    /// Each free stack holds distinct free chunks of its own range; returns which chunks
    /// are on a stack.
    fn check_free_stacks(&mut self) -> Vec<bool> {
        let (b, g) = (self.b, self.g);
        let h = b.header();
        let mut in_stack = vec![false; g.total_chunks() as usize];
        let stacks = [
            (
                b.free_mem_stack(),
                h.free_mem_top.load(Acquire),
                0..g.mem_chunks,
            ),
            (
                b.free_spill_stack(),
                h.free_spill_top.load(Acquire),
                g.mem_chunks..g.total_chunks(),
            ),
        ];
        for (stack, top, range) in stacks {
            if top as usize > stack.len() {
                self.r.errors.push(format!(
                    "free stack top {top} exceeds its size {}",
                    stack.len()
                ));
                continue;
            }
            for e in &stack[..top as usize] {
                let c = e.load(Relaxed);
                if !range.contains(&c) {
                    self.r
                        .errors
                        .push(format!("free stack holds chunk {c} outside its range"));
                    continue;
                }
                if in_stack[c as usize] {
                    self.r
                        .errors
                        .push(format!("chunk {c} is on a free stack twice"));
                }
                in_stack[c as usize] = true;
                let s = b.chunk_states()[c as usize].load(Acquire);
                if s != 0 {
                    self.r.errors.push(format!(
                        "chunk {c} is both on a free stack and marked {}",
                        describe_state(s)
                    ));
                }
            }
        }
        in_stack
    }

    /// Counts the chunks by state; a used chunk no map references is a leak.
    fn check_chunk_states(
        &mut self,
        in_stack: &[bool],
        referenced: &[bool],
        leaks: &mut Leaks,
    ) -> FreePool {
        let (b, g) = (self.b, self.g);
        let mut pool = FreePool::default();
        for (c, st) in b.chunk_states().iter().enumerate() {
            let s = st.load(Acquire);
            match state_tag(s) {
                TAG_FREE => {
                    self.r.chunks_free += 1;
                    if !in_stack[c] {
                        pool.stack_incomplete = true;
                    }
                }
                TAG_LEASED => {
                    self.r.chunks_leased += 1;
                    let slot = lease_of(s);
                    if slot >= g.lease_slots {
                        self.r.errors.push(format!(
                            "chunk {c} leased to slot {slot}, which does not exist"
                        ));
                        continue;
                    }
                    let ls = b.lease_slot(slot);
                    if !process_alive(ls.pid.load(Acquire), ls.start_time.load(Acquire)) {
                        pool.dead_leases.insert(slot);
                    }
                }
                TAG_USED => {
                    self.r.chunks_used += 1;
                    let owner = used_ino(s);
                    if owner >= g.max_inodes {
                        self.r.errors.push(format!(
                            "chunk {c} owned by inode {owner}, which does not exist"
                        ));
                    } else if !referenced[c] {
                        leaks.add(b, owner);
                    }
                }
                _ => self
                    .r
                    .errors
                    .push(format!("chunk {c}: invalid state {s:#x}")),
            }
        }
        pool
    }

    /// A used map node no map references is a leak.
    fn check_node_states(&mut self, referenced: &[bool], leaks: &mut Leaks) {
        let (b, g) = (self.b, self.g);
        for (n, st) in b.node_states().iter().enumerate() {
            let s = st.load(Acquire);
            if s == 0 || referenced[n] {
                continue;
            }
            let owner = used_ino(s);
            if state_tag(s) != TAG_USED || owner >= g.max_inodes {
                self.r
                    .errors
                    .push(format!("map node {n}: invalid state {s:#x}"));
            } else {
                leaks.add(b, owner);
            }
        }
    }

    fn report_free_pool(&mut self, pool: &FreePool) {
        if pool.stack_incomplete {
            self.r
                .warnings
                .push("free chunks missing from the free stacks".into());
        }
        if !pool.dead_leases.is_empty() {
            self.r.warnings.push(format!(
                "{} batch(es) of free chunks held by dead processes",
                pool.dead_leases.len()
            ));
        }
        if self.repair && (pool.stack_incomplete || !pool.dead_leases.is_empty()) {
            let n = self.b.reclaim_dead_leases();
            self.b.rebuild_free_stacks();
            self.r.repaired.push(format!(
                "rebuilt the free stacks and reclaimed {n} dead batch(es)"
            ));
        }
    }

    /// Warns about (and with `repair` frees) the leaked chunks and nodes, and recounts the
    /// files whose counters disagree.
    fn report_leaks(&mut self, leaks: &Leaks, recount: &BTreeSet<u32>) -> Result<()> {
        let b = self.b;
        let removed = leaks.removed;
        if removed > 0 {
            self.r.warnings.push(format!(
                "{removed} chunk(s)/node(s) still owned by removed files"
            ));
            if self.repair {
                b.sweep_removed_inodes()?;
                self.r
                    .repaired
                    .push(format!("freed {removed} chunk(s)/node(s) of removed files"));
            }
        }
        // A chunk marked USED but unpublished may be a live writer's allocation in flight; it
        // is only a leak if it is still unpublished once we hold that file's lock (repair
        // rechecks).
        for &ino in leaks.live.iter().chain(recount.iter()) {
            self.r.warnings.push(format!(
                "inode {ino}: chunk accounting needs repair (unpublished chunks or counters)"
            ));
        }
        if self.repair {
            for ino in leaks.live.union(recount) {
                let _fl = b.lock_inode(*ino)?;
                b.repair_inode(*ino)?;
                self.r.repaired.push(format!(
                    "inode {ino}: freed unpublished chunks and recounted"
                ));
            }
        }
        Ok(())
    }

    // ---- open counts (interposition) and files unlinked while open ----

    /// Each inode's open and writer counts against the open descriptions; returns the
    /// files unlinked while open that nobody has open any more, as (inode, generation).
    fn check_open_counts(&mut self) -> Vec<(u32, u32)> {
        let b = self.b;
        let counts = crate::descriptions::count_descriptions(b);
        let quiet = self.nobody_else_attached();
        let mut unlinked = Vec::new();
        for ino in 0..self.g.max_inodes {
            let inode = b.inode(ino);
            let state = inode.state.load(Acquire);
            if !matches!(
                state,
                INODE_FILE | INODE_ORPHAN | INODE_DIR | INODE_ORPHAN_DIR
            ) {
                continue;
            }
            let gen = inode.gen.load(Acquire);
            let (live, live_writes) = counts.get(&(ino, gen)).copied().unwrap_or((0, 0));
            self.check_writer_count(ino, live_writes, quiet);
            self.check_open_count(ino, live);
            if matches!(state, INODE_ORPHAN | INODE_ORPHAN_DIR) && live == 0 {
                self.r.warnings.push(format!(
                    "inode {ino}: unlinked while open, and no longer open"
                ));
                unlinked.push((ino, gen));
            }
        }
        unlinked
    }

    /// Writable handles of the CLI/API are counted as writers without a description; only
    /// on a store nobody else is attached to can a surplus be told from a live writer.
    fn nobody_else_attached(&self) -> bool {
        (0..self.g.lease_slots).all(|s| {
            let slot = self.b.lease_slot(s);
            let pid = slot.pid.load(Acquire);
            pid == 0
                || pid == crate::block::my_pid()
                || !process_alive(pid, slot.start_time.load(Acquire))
        })
    }

    fn check_writer_count(&mut self, ino: u32, live_writes: u32, quiet: bool) {
        let inode = self.b.inode(ino);
        let writers = inode.writers.load(Acquire);
        // A surplus is checked only by a repairing fsck (the CLI's, a process of its own that
        // holds no handles), on a store nobody else is attached to.
        if writers < live_writes || (self.repair && quiet && writers > live_writes) {
            self.r.warnings.push(format!(
                "inode {ino}: writer count {writers} but {live_writes} write descriptions"
            ));
            if self.repair {
                inode.writers.store(live_writes, Release);
                self.r
                    .repaired
                    .push(format!("inode {ino}: writer count set to {live_writes}"));
            }
        }
    }

    fn check_open_count(&mut self, ino: u32, live: u32) {
        let inode = self.b.inode(ino);
        let recorded = inode.opens.load(Acquire);
        if recorded != live {
            self.r.warnings.push(format!(
                "inode {ino}: open count {recorded} but {live} open descriptions"
            ));
            if self.repair {
                inode.opens.store(live, Release);
                self.r
                    .repaired
                    .push(format!("inode {ino}: open count set to {live}"));
            }
        }
    }

    /// With `repair`, frees the files unlinked while open that nobody has open any more
    /// (after the namespace lock is released).
    fn reap_unlinked(&mut self, unlinked: Vec<(u32, u32)>) -> Result<()> {
        if self.repair {
            for (ino, gen) in unlinked {
                self.b.reap_orphan(ino, gen)?;
                self.r
                    .repaired
                    .push(format!("inode {ino}: freed (unlinked, no longer open)"));
            }
        }
        Ok(())
    }
}

/// A file or directory with a name (in the namespace, so on its directory's entry list).
fn is_linked(state: u32) -> bool {
    matches!(state, INODE_FILE | INODE_DIR)
}

/// Walks a file's map, checking node ownership and bounds; collects (index, chunk) pairs.
#[allow(clippy::too_many_arguments)]
fn check_tree(
    b: &Block,
    ino: u32,
    node: u32,
    level: u32,
    base: u64,
    chunks: &mut Vec<(u64, u32)>,
    nodes: &mut Vec<u32>,
    r: &mut FsckReport,
) {
    if node >= b.geo.map_nodes {
        r.errors.push(format!(
            "inode {ino}: map references node {node}, which does not exist"
        ));
        return;
    }
    let s = b.node_states()[node as usize].load(Acquire);
    if s != used(ino, 0) {
        r.errors.push(format!(
            "inode {ino}: map node {node} is marked {}",
            describe_state(s)
        ));
    }
    nodes.push(node);
    let span = 1u64 << (FANOUT_BITS * level);
    for (i, slot) in b.node(node).slots.iter().enumerate() {
        let e = slot.load(Acquire);
        if e == 0 {
            continue;
        }
        let start = base + i as u64 * span;
        if level == 0 {
            if e > b.geo.total_chunks() {
                r.errors.push(format!(
                    "inode {ino}: index {start} points at chunk {}, which does not exist",
                    e - 1
                ));
            } else {
                chunks.push((start, e - 1));
            }
        } else {
            check_tree(b, ino, e - 1, level - 1, start, chunks, nodes, r);
        }
    }
}
