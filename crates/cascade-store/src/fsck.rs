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
    let mut r = FsckReport::default();
    let g = &b.geo;
    let ns = b.lock_ns()?;

    // ---- namespace ----
    let mut live_children = 0u64;
    let mut free_inodes = 0u64;
    let mut index_stale = false;
    if b.inode(ROOT_INO).state.load(Acquire) != INODE_DIR {
        r.errors
            .push("inode 0 (the root) is not a directory".into());
    }
    for ino in 0..g.max_inodes {
        let inode = b.inode(ino);
        let state = inode.state.load(Acquire);
        match state {
            INODE_FREE => {
                free_inodes += 1;
                continue;
            }
            INODE_FILE => r.files += 1,
            INODE_DIR => r.dirs += 1,
            // Unlinked while open: outside the namespace; checked with the open counts below.
            INODE_ORPHAN => {
                r.files += 1;
                continue;
            }
            INODE_ORPHAN_DIR => {
                r.dirs += 1;
                continue;
            }
            s => {
                r.errors.push(format!("inode {ino}: invalid state {s}"));
                continue;
            }
        }
        if ino == ROOT_INO {
            continue;
        }
        live_children += 1;
        let link = inode.link.load(Acquire);
        let parent = link_parent(link);
        let name = b.name_of(ino);
        if parent >= g.max_inodes || b.inode(parent).state.load(Acquire) != INODE_DIR {
            r.errors.push(format!(
                "inode {ino}: parent {parent} is not a live directory"
            ));
            continue;
        }
        if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0) {
            r.errors.push(format!(
                "inode {ino}: invalid name {:?}",
                String::from_utf8_lossy(&name)
            ));
            continue;
        }
        match b.lookup(parent, &String::from_utf8_lossy(&name)) {
            Some(found) if found == ino => {}
            Some(other) => r.errors.push(format!(
                "inode {ino} and inode {other} both have the name {:?} in directory {parent}",
                String::from_utf8_lossy(&name)
            )),
            None => index_stale = true,
        }
        let mut cur = ino;
        let mut steps = 0;
        while cur != ROOT_INO && steps <= g.max_inodes {
            cur = link_parent(b.inode(cur).link.load(Acquire));
            steps += 1;
            if cur >= g.max_inodes {
                break;
            }
        }
        if cur != ROOT_INO {
            r.errors.push(format!(
                "inode {ino}: not connected to the root (directory cycle)"
            ));
        }
        if state == INODE_DIR && inode.map.load(Acquire) != 0 {
            r.errors
                .push(format!("directory inode {ino} has a chunk map"));
        }
    }
    let mut listed = 0u64;
    for dir in 0..g.max_inodes {
        if b.inode(dir).state.load(Acquire) != INODE_DIR {
            continue;
        }
        for e in b.list_dir(dir) {
            listed += 1;
            if link_parent(b.inode(e.ino as u32).link.load(Acquire)) != dir {
                index_stale = true;
            }
        }
    }
    let hashed = b
        .hash_slots()
        .iter()
        .filter(|s| s.load(Relaxed) != 0)
        .count() as u64;
    let free_top = b.header().free_inode_top.load(Acquire) as u64;
    if listed != live_children || hashed != live_children || free_top != free_inodes {
        index_stale = true;
    }
    if index_stale {
        r.warnings.push(
            "namespace index (name hash, directory lists, free inodes) is out of date".into(),
        );
        if repair {
            b.rebuild_namespace_index();
            r.repaired.push("rebuilt the namespace index".into());
        }
    }

    // ---- each file's chunk map (under its lock) ----
    let total = g.total_chunks() as usize;
    let mut referenced = vec![false; total];
    let mut node_referenced = vec![false; g.map_nodes as usize];
    let mut recount = BTreeSet::new();
    for ino in 0..g.max_inodes {
        if !matches!(b.inode(ino).state.load(Acquire), INODE_FILE | INODE_ORPHAN) {
            continue;
        }
        let _fl = b.lock_inode(ino)?;
        let inode = b.inode(ino);
        let m = inode.map.load(Acquire);
        if map_height(m) > 0 {
            let (mut chunks, mut nodes) = (Vec::new(), Vec::new());
            check_tree(
                b,
                ino,
                map_root(m) - 1,
                map_height(m) - 1,
                0,
                &mut chunks,
                &mut nodes,
                &mut r,
            );
            for n in nodes {
                node_referenced[n as usize] = true;
            }
            let (mut mem, mut spill) = (0u32, 0u32);
            for (idx, c) in chunks {
                referenced[c as usize] = true;
                let s = b.chunk_states()[c as usize].load(Acquire);
                if s != used(ino, idx as u32) {
                    r.errors.push(format!(
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
                recount.insert(ino);
            }
        }
    }

    // ---- allocator ----
    let mut leaked_live = BTreeSet::new();
    let mut leaked_removed = 0u64;
    {
        let _al = b.lock_alloc()?;
        let h = b.header();
        let mut in_stack = vec![false; total];
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
                r.errors.push(format!(
                    "free stack top {top} exceeds its size {}",
                    stack.len()
                ));
                continue;
            }
            for e in &stack[..top as usize] {
                let c = e.load(Relaxed);
                if !range.contains(&c) {
                    r.errors
                        .push(format!("free stack holds chunk {c} outside its range"));
                    continue;
                }
                if in_stack[c as usize] {
                    r.errors.push(format!("chunk {c} is on a free stack twice"));
                }
                in_stack[c as usize] = true;
                let s = b.chunk_states()[c as usize].load(Acquire);
                if s != 0 {
                    r.errors.push(format!(
                        "chunk {c} is both on a free stack and marked {}",
                        describe_state(s)
                    ));
                }
            }
        }
        let mut stack_incomplete = false;
        let mut dead_leases = BTreeSet::new();
        for (c, st) in b.chunk_states().iter().enumerate() {
            let s = st.load(Acquire);
            match state_tag(s) {
                TAG_FREE => {
                    r.chunks_free += 1;
                    if !in_stack[c] {
                        stack_incomplete = true;
                    }
                }
                TAG_LEASED => {
                    r.chunks_leased += 1;
                    let slot = lease_of(s);
                    if slot >= g.lease_slots {
                        r.errors.push(format!(
                            "chunk {c} leased to slot {slot}, which does not exist"
                        ));
                        continue;
                    }
                    let ls = b.lease_slot(slot);
                    if !process_alive(ls.pid.load(Acquire), ls.start_time.load(Acquire)) {
                        dead_leases.insert(slot);
                    }
                }
                TAG_USED => {
                    r.chunks_used += 1;
                    let owner = used_ino(s);
                    if owner >= g.max_inodes {
                        r.errors.push(format!(
                            "chunk {c} owned by inode {owner}, which does not exist"
                        ));
                    } else if !referenced[c] {
                        if matches!(
                            b.inode(owner).state.load(Acquire),
                            INODE_FILE | INODE_ORPHAN
                        ) {
                            leaked_live.insert(owner);
                        } else {
                            leaked_removed += 1;
                        }
                    }
                }
                _ => r.errors.push(format!("chunk {c}: invalid state {s:#x}")),
            }
        }
        for (n, st) in b.node_states().iter().enumerate() {
            let s = st.load(Acquire);
            if s == 0 || node_referenced[n] {
                continue;
            }
            let owner = used_ino(s);
            if state_tag(s) != TAG_USED || owner >= g.max_inodes {
                r.errors.push(format!("map node {n}: invalid state {s:#x}"));
            } else if matches!(
                b.inode(owner).state.load(Acquire),
                INODE_FILE | INODE_ORPHAN
            ) {
                leaked_live.insert(owner);
            } else {
                leaked_removed += 1;
            }
        }
        if stack_incomplete {
            r.warnings
                .push("free chunks missing from the free stacks".into());
        }
        if !dead_leases.is_empty() {
            r.warnings.push(format!(
                "{} batch(es) of free chunks held by dead processes",
                dead_leases.len()
            ));
        }
        if repair && (stack_incomplete || !dead_leases.is_empty()) {
            let n = b.reclaim_dead_leases();
            b.rebuild_free_stacks();
            r.repaired.push(format!(
                "rebuilt the free stacks and reclaimed {n} dead batch(es)"
            ));
        }
    }
    if leaked_removed > 0 {
        r.warnings.push(format!(
            "{leaked_removed} chunk(s)/node(s) still owned by removed files"
        ));
        if repair {
            b.sweep_removed_inodes()?;
            r.repaired.push(format!(
                "freed {leaked_removed} chunk(s)/node(s) of removed files"
            ));
        }
    }
    // A chunk marked USED but unpublished may be a live writer's allocation in flight; it is
    // only a leak if it is still unpublished once we hold that file's lock (repair rechecks).
    for &ino in leaked_live.iter().chain(recount.iter()) {
        r.warnings.push(format!(
            "inode {ino}: chunk accounting needs repair (unpublished chunks or counters)"
        ));
    }
    if repair {
        for ino in leaked_live.union(&recount) {
            let _fl = b.lock_inode(*ino)?;
            b.repair_inode(*ino)?;
            r.repaired.push(format!(
                "inode {ino}: freed unpublished chunks and recounted"
            ));
        }
    }

    // ---- open counts (interposition) and files unlinked while open ----
    let counts = crate::descriptions::count_descriptions(b);
    // Writable handles of the CLI/API are counted as writers without a description; only on
    // a store nobody else is attached to can a surplus be told from a live writer.
    let quiet = (0..g.lease_slots).all(|s| {
        let slot = b.lease_slot(s);
        let pid = slot.pid.load(Acquire);
        pid == 0
            || pid == crate::block::my_pid()
            || !process_alive(pid, slot.start_time.load(Acquire))
    });
    let mut reap = Vec::new();
    for ino in 0..g.max_inodes {
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
        let writers = inode.writers.load(Acquire);
        // A surplus is checked only by a repairing fsck (the CLI's, a process of its own that
        // holds no handles), on a store nobody else is attached to.
        if writers < live_writes || (repair && quiet && writers > live_writes) {
            r.warnings.push(format!(
                "inode {ino}: writer count {writers} but {live_writes} write descriptions"
            ));
            if repair {
                inode.writers.store(live_writes, Release);
                r.repaired
                    .push(format!("inode {ino}: writer count set to {live_writes}"));
            }
        }
        let recorded = inode.opens.load(Acquire);
        if recorded != live {
            r.warnings.push(format!(
                "inode {ino}: open count {recorded} but {live} open descriptions"
            ));
            if repair {
                inode.opens.store(live, Release);
                r.repaired
                    .push(format!("inode {ino}: open count set to {live}"));
            }
        }
        if matches!(state, INODE_ORPHAN | INODE_ORPHAN_DIR) && live == 0 {
            r.warnings.push(format!(
                "inode {ino}: unlinked while open, and no longer open"
            ));
            reap.push((ino, gen));
        }
    }
    drop(ns);
    if repair {
        for (ino, gen) in reap {
            b.reap_orphan(ino, gen)?;
            r.repaired
                .push(format!("inode {ino}: freed (unlinked, no longer open)"));
        }
    }
    Ok(r)
}

fn describe_state(s: u64) -> String {
    match state_tag(s) {
        TAG_FREE => "free".into(),
        TAG_LEASED => format!("leased to slot {}", lease_of(s)),
        TAG_USED => format!("used by inode {} at index {}", used_ino(s), used_idx(s)),
        _ => format!("invalid ({s:#x})"),
    }
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
