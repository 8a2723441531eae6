//! Directories and names.
//!
//! Authority: each inode's `state`, `gen` and `link` words and its current name slot. A
//! namespace change publishes itself with one atomic store (state for create/remove, link for
//! rename), so a crash leaves it either done or not done. The name-hash index, the sibling
//! lists used for listing, and the free-inode stack are derived: they change only under the
//! namespace lock and are rebuilt when a holder of that lock died. The one change that needs
//! two stores, rename over an existing name, is covered by a one-entry redo journal.

use crate::alloc::EnospcReason;
use crate::block::{now_ns, Block};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::lock::{begin_write, end_write, read_begin, unchanged_since, LockGuard};
use crate::types::{DirEntry, FileKind};
use std::sync::atomic::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// Marks a path that starts at an inode rather than the root (see `File::anchored`): no C
/// path can contain a NUL byte, so it cannot collide with a name.
pub(crate) const ANCHOR: char = '\0';

/// A path's components: up to [`INLINE_COMPONENTS`] on the stack, so that a lookup does
/// not allocate (callgrind: the Vec it replaced, its allocation and free, were about 140 of
/// the 2 100 instructions of a `stat` under the library).
pub(crate) type Components<'p> = smallvec::SmallVec<[&'p str; INLINE_COMPONENTS]>;
const INLINE_COMPONENTS: usize = 8;

/// The length of the name a `link` word gives, at most a name slot's (a damaged word never
/// reads past its slot).
fn name_len(link: u64) -> usize {
    link_len(link).min(NAME_MAX)
}

/// Splits a store path into components, dropping "." and empty ones. ".." stays: it is
/// walked like the kernel does (its directory must exist), not resolved lexically.
pub(crate) fn parse_path(path: &str) -> Result<Components<'_>> {
    if path.len() > PATH_MAX {
        return Err(Error::new(
            libc::ENAMETOOLONG,
            format!("path of {} bytes", path.len()),
        ));
    }
    let mut comps = Components::new();
    for c in path.split('/') {
        if !matches!(c, "" | ".") {
            comps.push(c);
        }
    }
    // A NUL byte may only start an anchor, and only as the first component.
    let named = match comps.first() {
        Some(first) if first.starts_with(ANCHOR) => &comps[1..],
        _ => &comps[..],
    };
    if named.iter().any(|name| name.as_bytes().contains(&0)) {
        return Err(Error::new(
            libc::EINVAL,
            format!("{path:?} contains a NUL byte"),
        ));
    }
    Ok(comps)
}

/// FNV-1a over (parent, name): fixed and documented, since every build must agree.
fn name_hash(parent: u32, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parent.to_le_bytes().iter().chain(name) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn kind_of(state: u32) -> FileKind {
    if is_dir_state(state) {
        FileKind::Dir
    } else {
        FileKind::File
    }
}

/// Lock-free tries of [`Block::read_namespace`] before it takes the lock.
const OPTIMISTIC_TRIES: u32 = 64;

/// Holds the namespace lock; for [`Block::lock_ns`] also keeps the namespace's sequence
/// odd, so that lock-free lookups retry, until it drops.
pub(crate) struct NsGuard<'a> {
    lock: LockGuard<'a>,
    seq: Option<&'a AtomicU64>,
}

impl Drop for NsGuard<'_> {
    fn drop(&mut self) {
        // Before the lock (the field drops after this).
        if let Some(seq) = self.seq {
            end_write(seq);
        }
    }
}

/// Where a lookup probes the name index: nothing to note under the lock
/// ([`UnderLock`]); the stripes and their sequences for a lock-free one ([`StripesSeen`]).
pub(crate) trait Probes {
    /// Called before slot `slot` is read.
    fn probe(&mut self, b: &Block, slot: usize);
}

/// A lookup under the namespace lock: nothing changes meanwhile.
pub(crate) struct UnderLock;

impl Probes for UnderLock {
    #[inline]
    fn probe(&mut self, _: &Block, _: usize) {}
}

/// The stripes of the name index a lock-free lookup read, with their sequences then.
pub(crate) struct StripesSeen {
    mask: u64,
    seqs: [u64; NS_STRIPES],
    /// A stripe was odd (a removal at work in it): the lookup counts for nothing.
    busy: bool,
}

impl StripesSeen {
    fn new() -> StripesSeen {
        StripesSeen {
            mask: 0,
            seqs: [0; NS_STRIPES],
            busy: false,
        }
    }

    /// True if no stripe read moved since (after an acquire fence).
    fn unchanged(&self, b: &Block) -> bool {
        let stripes = &b.header().ns_stripes;
        let mut mask = self.mask;
        while mask != 0 {
            let s = mask.trailing_zeros() as usize;
            if !unchanged_since(&stripes[s], self.seqs[s]) {
                return false;
            }
            mask &= mask - 1;
        }
        !self.busy
    }
}

impl Probes for StripesSeen {
    #[inline]
    fn probe(&mut self, b: &Block, slot: usize) {
        let s = b.stripe_of(slot);
        if self.mask & (1 << s) == 0 {
            self.mask |= 1 << s;
            match read_begin(&b.header().ns_stripes[s]) {
                Some(seq) => self.seqs[s] = seq,
                None => self.busy = true,
            }
        }
    }
}

/// A parent directory resolved without the lock (see [`Block::resolve_parent_early`]).
pub(crate) struct Resolved<'p> {
    before: u64,
    seen: StripesSeen,
    parent: u32,
    name: Option<&'p str>,
}

/// Keeps the stripes of `mask` odd until it drops (a removal of a file, lock held).
pub(crate) struct StripesWritten<'a> {
    b: &'a Block,
    mask: u64,
}

impl<'a> StripesWritten<'a> {
    pub(crate) fn begin(b: &'a Block, mask: u64) -> StripesWritten<'a> {
        for_each_stripe(mask, |s| begin_write(&b.header().ns_stripes[s]));
        StripesWritten { b, mask }
    }
}

impl Drop for StripesWritten<'_> {
    fn drop(&mut self) {
        for_each_stripe(self.mask, |s| end_write(&self.b.header().ns_stripes[s]));
    }
}

/// Cache lines at the start of an inode that a create or a removal writes: the lock, the
/// fields up to the sibling links and versions, and the start of name slot 0.
const INODE_LINES_WRITTEN: usize = 4;

/// Asks the CPU to fetch `lines` cache lines from `p` for writing (a hint: no effect on
/// what any load or store sees).
#[inline]
fn prefetch_for_write(p: *const u8, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in 0..lines {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        // SAFETY: a prefetch never faults and changes no memory, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_ET0>(p.wrapping_add(line * 64) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, lines);
}

fn for_each_stripe(mut mask: u64, mut f: impl FnMut(usize)) {
    while mask != 0 {
        f(mask.trailing_zeros() as usize);
        mask &= mask - 1;
    }
}

impl Block {
    /// Takes the namespace lock for any change: lock-free lookups retry until it drops.
    pub(crate) fn lock_ns(&self) -> Result<NsGuard<'_>> {
        let h = self.header();
        let lock = h.ns_lock.lock()?;
        begin_write(&h.ns_seq.seq);
        let mut g = NsGuard {
            lock,
            seq: Some(&h.ns_seq.seq),
        };
        if g.lock.recovered() {
            self.recover_namespace()?;
            g.lock.mark_consistent();
        }
        Ok(g)
    }

    /// Takes the namespace lock for a holder that only reads, creates entries
    /// ([`Self::create_inode`]) or removes files ([`Self::remove_inode`] of a file, which
    /// marks the stripes of the name index it changes): lock-free lookups need not retry
    /// for those, so a create does not disturb a stat elsewhere. Anything else — a rename,
    /// removing a directory, a repair — takes [`Self::lock_ns`].
    pub(crate) fn lock_ns_entries(&self) -> Result<NsGuard<'_>> {
        let h = self.header();
        let lock = h.ns_lock.lock()?;
        if !lock.recovered() {
            return Ok(NsGuard { lock, seq: None });
        }
        begin_write(&h.ns_seq.seq);
        let mut g = NsGuard {
            lock,
            seq: Some(&h.ns_seq.seq),
        };
        self.recover_namespace()?;
        g.lock.mark_consistent();
        Ok(g)
    }

    /// The stripe of name-index slot `slot`: `NS_STRIPES` runs of consecutive slots.
    #[inline]
    pub(crate) fn stripe_of(&self, slot: usize) -> usize {
        let shift = self
            .geo
            .hash_slots
            .trailing_zeros()
            .saturating_sub(NS_STRIPES.trailing_zeros());
        (slot >> shift) & (NS_STRIPES - 1)
    }

    /// Runs `read`, a look at the namespace that changes nothing, without the namespace lock
    /// when it can: like a seqlock, its result counts only if no holder of [`Self::lock_ns`]
    /// ran meanwhile and no removal changed a stripe of the name index it probed (a lookup
    /// racing a rename may see a torn name, or damage that is not there; one racing a
    /// removal may miss an entry moved back); after a few tries it runs under the lock.
    /// Creates need no retry: they fill an empty slot only after the inode is complete
    /// (release). stat(2) of two processes then scales instead of taking turns.
    pub(crate) fn read_namespace<T>(
        &self,
        mut read: impl FnMut(&mut StripesSeen) -> Result<T>,
    ) -> Result<T> {
        let seq = &self.header().ns_seq.seq;
        for _ in 0..OPTIMISTIC_TRIES {
            let Some(before) = read_begin(seq) else {
                std::hint::spin_loop();
                continue;
            };
            let mut seen = StripesSeen::new();
            let r = read(&mut seen);
            fence(Acquire);
            if unchanged_since(seq, before) && seen.unchanged(self) {
                return r;
            }
        }
        let _g = self.lock_ns_entries()?;
        read(&mut StripesSeen::new())
    }

    /// The current name of a live inode (namespace lock held, or inside
    /// [`Block::read_namespace`], which discards a name torn by a holder of the lock).
    pub(crate) fn name_of(&self, ino: u32) -> Vec<u8> {
        self.with_name(ino, |_, name| name.to_vec())
    }

    /// Calls `f` with the parent and a copy of the current name of a live inode (on the
    /// stack: lookups under the lock allocate nothing); same conditions as [`Self::name_of`].
    #[inline]
    fn with_name<T>(&self, ino: u32, f: impl FnOnce(u32, &[u8]) -> T) -> T {
        let link = self.inode(ino).link.load(Acquire);
        let len = name_len(link);
        // Not zeroed first: only the `len` bytes copied in are read (zeroing the 255 bytes
        // cost about 17 instructions per name compared, callgrind).
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); NAME_MAX];
        // SAFETY: the name slot holds 256 bytes and `len` is at most NAME_MAX = the buffer's
        // length; names change only under the namespace lock, which the caller holds, or a
        // lock-free reader validates the copy afterwards (the bytes are plain data, any
        // value is safe). The first `len` bytes of `buf` are initialised by the copy, and
        // only they are read.
        let name = unsafe {
            std::ptr::copy_nonoverlapping(
                self.name_ptr(ino, link_slot(link)),
                buf.as_mut_ptr().cast::<u8>(),
                len,
            );
            std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len)
        };
        f(link_parent(link), name)
    }

    /// The name index's home slot of inode `ino`'s name.
    fn home(&self, ino: u32) -> usize {
        self.with_name(ino, |parent, name| self.home_slot(parent, name))
    }

    /// The name index's home slot of `name` in directory `parent`: where its probe starts.
    fn home_slot(&self, parent: u32, name: &[u8]) -> usize {
        (name_hash(parent, name) as usize) & (self.geo.hash_slots as usize - 1)
    }

    /// Looks up `name` in directory `dir` (namespace lock held). EIO when the probe meets
    /// an index entry naming no inode, or finds no empty slot (the table has twice as many
    /// slots as inodes, so only a damaged one is full).
    pub(crate) fn lookup(&self, dir: u32, name: &str) -> Result<Option<u32>> {
        self.lookup_probed(dir, name, &mut UnderLock)
    }

    /// [`Self::lookup`], telling `probes` each slot before it reads it.
    fn lookup_probed(&self, dir: u32, name: &str, probes: &mut impl Probes) -> Result<Option<u32>> {
        let slots = self.hash_slots();
        let mask = slots.len() - 1;
        let mut i = self.home_slot(dir, name.as_bytes());
        for _ in 0..slots.len() {
            probes.probe(self, i);
            // Acquire: an entry a create just stored names a complete inode.
            let v = slots[i].load(Acquire);
            if v == 0 {
                return Ok(None);
            }
            let ino = self.check_ino(v - 1, || {
                let dir_path = match self.path_of(dir) {
                    Ok(Some(p)) => p,
                    _ => format!("directory inode {dir}"),
                };
                let dir_path = dir_path.trim_end_matches('/');
                format!("name-index entry {i} (on the probe for {dir_path}/{name})")
            })?;
            let inode = self.inode(ino);
            if inode.state.load(Acquire) != INODE_FREE
                && self.with_name(ino, |parent, n| parent == dir && n == name.as_bytes())
            {
                return Ok(Some(ino));
            }
            i = (i + 1) & mask;
        }
        Err(index_full())
    }

    fn hash_insert(&self, ino: u32) -> Result<()> {
        let slots = self.hash_slots();
        let mask = slots.len() - 1;
        let mut i = self.home(ino);
        for _ in 0..slots.len() {
            if slots[i].load(Relaxed) == 0 {
                // Release: a lock-free lookup that finds the entry finds the inode complete.
                slots[i].store(ino + 1, Release);
                return Ok(());
            }
            i = (i + 1) & mask;
        }
        Err(index_full())
    }

    /// The stripes of the slots removing `ino` from the index may change: from its home to
    /// the end of its run of occupied slots (backward-shift deletion moves entries of that
    /// run back). All of them when the index is damaged (no empty slot).
    pub(crate) fn removal_stripes(&self, ino: u32) -> u64 {
        let slots = self.hash_slots();
        let mask = slots.len() - 1;
        let mut i = self.home(ino);
        let mut stripes = 0u64;
        for _ in 0..slots.len() {
            stripes |= 1 << self.stripe_of(i);
            if slots[i].load(Relaxed) == 0 {
                return stripes;
            }
            i = (i + 1) & mask;
        }
        u64::MAX
    }

    /// Removes `ino` from the index with backward-shift deletion (no tombstones, so lookups
    /// never slow down as files come and go).
    fn hash_remove(&self, ino: u32) -> Result<()> {
        let slots = self.hash_slots();
        let mask = slots.len() - 1;
        let mut i = self.home(ino);
        let mut probed = 0;
        loop {
            match slots[i].load(Relaxed) {
                0 => return Ok(()),
                v if v == ino + 1 => break,
                _ if probed == slots.len() => return Err(index_full()),
                _ => i = (i + 1) & mask,
            }
            probed += 1;
        }
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let v = slots[j].load(Relaxed);
            if v == 0 {
                break;
            }
            if j == i {
                return Err(index_full());
            }
            let k = self.home(self.check_ino(v - 1, || format!("name-index entry {j}"))?);
            // Move the entry at j back to the hole at i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                slots[i].store(v, Relaxed);
                i = j;
            }
        }
        slots[i].store(0, Relaxed);
        Ok(())
    }

    /// Checks, before a change starts, the list links that taking `ino` out of its directory
    /// and putting it (back) into `into` will follow, so that a damaged list fails the
    /// change before anything is half done.
    fn check_entry_links(&self, ino: u32, into: u32) -> Result<()> {
        let n = self.inode(ino);
        for (link, what) in [
            (n.prev_sibling.load(Relaxed), "the entry before"),
            (n.next_sibling.load(Relaxed), "the entry after"),
        ] {
            if link != NIL {
                self.check_ino(link, || format!("{what} inode {ino} in its directory"))?;
            }
        }
        let first = self.inode(into).first_child.load(Relaxed);
        if first != NIL {
            self.check_ino(first, || {
                format!("the first entry of directory inode {into}")
            })?;
        }
        Ok(())
    }

    fn sibling_insert(&self, dir: u32, ino: u32) -> Result<()> {
        let d = self.inode(dir);
        let first = d.first_child.load(Relaxed);
        if first != NIL {
            self.check_ino(first, || {
                format!("the first entry of directory inode {dir}")
            })?;
        }
        let n = self.inode(ino);
        n.prev_sibling.store(NIL, Relaxed);
        n.next_sibling.store(first, Relaxed);
        if first != NIL {
            self.inode(first).prev_sibling.store(ino, Relaxed);
        }
        d.first_child.store(ino, Relaxed);
        Ok(())
    }

    fn sibling_remove(&self, dir: u32, ino: u32) -> Result<()> {
        let n = self.inode(ino);
        let prev = n.prev_sibling.load(Relaxed);
        let next = n.next_sibling.load(Relaxed);
        // Both checked before either store: a damaged list is left as it was.
        if prev != NIL {
            self.check_ino(prev, || {
                format!("the entry before inode {ino} in its directory")
            })?;
        }
        if next != NIL {
            self.check_ino(next, || {
                format!("the entry after inode {ino} in its directory")
            })?;
        }
        if prev == NIL {
            self.inode(dir).first_child.store(next, Relaxed);
        } else {
            self.inode(prev).next_sibling.store(next, Relaxed);
        }
        if next != NIL {
            self.inode(next).prev_sibling.store(prev, Relaxed);
        }
        Ok(())
    }

    /// Rebuilds the hash index, sibling lists and free-inode stack from the inode table.
    pub(crate) fn rebuild_namespace_index(&self) {
        for s in self.hash_slots() {
            s.store(0, Relaxed);
        }
        for ino in 0..self.geo.max_inodes {
            self.inode(ino).first_child.store(NIL, Relaxed);
        }
        // Every free inode goes back to the stack, those in processes' batches too.
        for s in 0..self.geo.lease_slots {
            self.lease_slot(s).inode_count.store(0, Relaxed);
        }
        let mut free_top = 0;
        for ino in (0..self.geo.max_inodes).rev() {
            let state = self.inode(ino).state.load(Acquire);
            if ino == ROOT_INO {
                continue;
            }
            if state == INODE_FREE {
                self.free_inode_stack()[free_top].store(ino, Relaxed);
                free_top += 1;
            } else if !matches!(state, INODE_ORPHAN | INODE_ORPHAN_DIR) {
                // Neither can fail here: the index was just cleared (it has twice as many
                // slots as inodes) and every list head was reset to NIL or to a checked inode.
                let _ = self.hash_insert(ino);
                let parent = link_parent(self.inode(ino).link.load(Acquire));
                if parent < self.geo.max_inodes {
                    let _ = self.sibling_insert(parent, ino);
                }
            }
        }
        self.header().free_inode_top.store(free_top as u32, Release);
    }

    /// Repairs the namespace after a holder of its lock died: finish a journaled rename,
    /// rebuild the derived structures, and free chunks still owned by removed inodes.
    fn recover_namespace(&self) -> Result<()> {
        let h = self.header();
        if h.rj_valid.load(Acquire) != 0 {
            let src = h.rj_src.load(Relaxed);
            let victim = h.rj_victim.load(Relaxed);
            if src < self.geo.max_inodes
                && victim < self.geo.max_inodes
                && self.inode(src).link.load(Acquire) == h.rj_link.load(Relaxed)
            {
                // The rename was published: complete it by removing the replaced inode.
                self.inode(victim).state.store(INODE_FREE, Release);
            }
            h.rj_valid.store(0, Release);
        }
        self.rebuild_namespace_index();
        // A removal that died left its stripes odd (the namespace's sequence, odd
        // meanwhile, covers the rebuild).
        for s in &h.ns_stripes {
            if s.load(Relaxed) & 1 != 0 {
                end_write(s);
            }
        }
        self.sweep_removed_inodes()
    }

    /// Resolves a path to an inode (namespace lock held).
    pub(crate) fn resolve(&self, path: &str) -> Result<u32> {
        self.resolve_probed(path, &mut UnderLock)
    }

    /// [`Self::resolve`], telling `probes` every slot of the name index it reads.
    pub(crate) fn resolve_probed(&self, path: &str, probes: &mut impl Probes) -> Result<u32> {
        let comps = parse_path(path)?;
        let ino = self.resolve_comps(&comps, path, probes)?;
        // "file/" names a directory that is not there.
        if path.ends_with('/') && self.inode(ino).state.load(Acquire) != INODE_DIR {
            return Err(Error::new(libc::ENOTDIR, path.to_string()));
        }
        Ok(ino)
    }

    fn resolve_comps(&self, comps: &[&str], path: &str, probes: &mut impl Probes) -> Result<u32> {
        let mut cur = ROOT_INO;
        let mut comps = comps;
        if let Some(first) = comps.first().filter(|c| c.starts_with(ANCHOR)) {
            cur = self
                .anchor(first)
                .ok_or_else(|| Error::new(libc::ENOENT, "the directory was removed"))?;
            comps = &comps[1..];
        }
        for c in comps {
            match self.inode(cur).state.load(Acquire) {
                INODE_DIR => {}
                INODE_ORPHAN_DIR => return Err(Error::new(libc::ENOENT, path.to_string())),
                _ => return Err(Error::new(libc::ENOTDIR, path.to_string())),
            }
            if c.len() > NAME_MAX {
                return Err(Error::new(libc::ENAMETOOLONG, path.to_string()));
            }
            cur = if *c == ".." {
                if cur == ROOT_INO {
                    ROOT_INO
                } else {
                    self.parent_dir(cur)?
                }
            } else {
                self.lookup_probed(cur, c, probes)?
                    .ok_or_else(|| Error::new(libc::ENOENT, path.to_string()))?
            };
        }
        Ok(cur)
    }

    /// Resolves all but the last component; returns (parent dir, last name). A path without
    /// a last name — the root, or one ending in ".." — returns the directory it names and
    /// `None`.
    pub(crate) fn resolve_parent<'p>(&self, path: &'p str) -> Result<(u32, Option<&'p str>)> {
        let (parent, name) = self.resolve_parent_unchecked(path)?;
        if name.is_some_and(|n| n.len() > NAME_MAX) {
            return Err(Error::new(libc::ENAMETOOLONG, path.to_string()));
        }
        Ok((parent, name))
    }

    /// [`Self::resolve_parent`] without the lock, before taking it: the walk to the parent
    /// (most of the lookups of a create or an unlink) leaves the critical section, and
    /// [`Self::still_holds`] confirms it under the lock. None when it failed (the caller
    /// resolves under the lock, which reports the error).
    pub(crate) fn resolve_parent_early<'p>(&self, path: &'p str) -> Option<Resolved<'p>> {
        let before = read_begin(&self.header().ns_seq.seq)?;
        let mut seen = StripesSeen::new();
        let (parent, name) = self.resolve_parent_probed(path, &mut seen).ok()?;
        if name.is_some_and(|n| n.len() > NAME_MAX) {
            return None;
        }
        Some(Resolved {
            before,
            seen,
            parent,
            name,
        })
    }

    /// Prefetches, before the namespace lock is taken, the cache lines its holder will write
    /// for `early`'s name: the name index's home slot for it, the inode that slot names (an
    /// unlink, or an open of an existing file), and for a create the inode this process's
    /// batch hands out next (no other process takes it meanwhile). Their misses then
    /// overlap here, instead of running one after another inside the critical section that
    /// other processes wait for. A hint only: what it reads may be stale by the time the
    /// lock is held, and nothing depends on it.
    pub(crate) fn prefetch_for(&self, early: &Resolved, create: bool) {
        let Some(name) = early.name else {
            return;
        };
        let slots = self.hash_slots();
        let Some(slot) = slots.get(self.home_slot(early.parent, name.as_bytes())) else {
            return;
        };
        prefetch_for_write(slot.as_ptr() as *const u8, 1);
        if let Some(inode) = slot
            .load(Relaxed)
            .checked_sub(1)
            .and_then(|ino| self.inode_checked(ino))
        {
            prefetch_for_write(inode as *const Inode as *const u8, INODE_LINES_WRITTEN);
        }
        if let Some(inode) = create
            .then(|| self.next_inode_hint())
            .flatten()
            .and_then(|ino| self.inode_checked(ino))
        {
            prefetch_for_write(inode as *const Inode as *const u8, INODE_LINES_WRITTEN);
        }
    }

    /// True (namespace lock held) if what [`Self::resolve_parent_early`] found is still
    /// so: no holder of [`Self::lock_ns`] and no removal in a stripe it probed ran since.
    /// Creates need no check: they only add entries, and the parent (a directory) was found.
    pub(crate) fn still_holds(&self, early: &Resolved) -> bool {
        fence(Acquire);
        unchanged_since(&self.header().ns_seq.seq, early.before) && early.seen.unchanged(self)
    }

    /// [`Self::resolve_parent`] under the lock, or what [`Self::resolve_parent_early`]
    /// found if it still holds.
    pub(crate) fn resolve_parent_with<'p>(
        &self,
        path: &'p str,
        early: Option<Resolved<'p>>,
    ) -> Result<(u32, Option<&'p str>)> {
        match early {
            Some(e) if self.still_holds(&e) => Ok((e.parent, e.name)),
            _ => self.resolve_parent(path),
        }
    }

    /// [`Self::resolve_parent`] without the length check of the last name (rename checks
    /// both names only after resolving both parents, as the kernel does).
    fn resolve_parent_unchecked<'p>(&self, path: &'p str) -> Result<(u32, Option<&'p str>)> {
        self.resolve_parent_probed(path, &mut UnderLock)
    }

    fn resolve_parent_probed<'p>(
        &self,
        path: &'p str,
        probes: &mut impl Probes,
    ) -> Result<(u32, Option<&'p str>)> {
        let comps = parse_path(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Ok((ROOT_INO, None));
        };
        if *last == ".." || last.starts_with(ANCHOR) {
            return Ok((self.resolve_comps(&comps, path, probes)?, None));
        }
        let parent = self.resolve_comps(dirs, path, probes)?;
        match self.inode(parent).state.load(Acquire) {
            INODE_DIR => Ok((parent, Some(last))),
            INODE_ORPHAN_DIR => Err(Error::new(libc::ENOENT, path.to_string())),
            _ => Err(Error::new(libc::ENOTDIR, path.to_string())),
        }
    }

    /// ENAMETOOLONG if `name` in directory `dir` makes a store path longer than the durable
    /// tier takes (`max_path`; namespace lock held).
    pub(crate) fn check_path_limit(&self, dir: u32, name: &str) -> Result<()> {
        let limit = self.header().max_path.load(Relaxed) as usize;
        if limit == 0 {
            return Ok(());
        }
        // Summed from the parent links, without building the path: this runs inside the
        // namespace lock on every create once the durable store is S3.
        let len = self.path_len(dir)? + 1 + name.len();
        if len <= limit {
            return Ok(());
        }
        let dir_path = self.path_of(dir)?.unwrap_or_default();
        let dir_path = dir_path.trim_end_matches('/');
        Err(Error::new(
            libc::ENAMETOOLONG,
            format!(
                "{dir_path}/{name}: a path of {len} bytes, and the durable store takes paths of at \
                 most {limit} (S3 keys are at most 1024 bytes with the store's prefix and \
                 Cascade's suffixes); use shorter names"
            ),
        ))
    }

    /// Creates a file or directory `name` in `parent` (namespace lock held, name absent).
    pub(crate) fn create_inode(
        &self,
        parent: u32,
        name: &str,
        state: u32,
        mode: u32,
    ) -> Result<u32> {
        self.check_path_limit(parent, name)?;
        // The entry list is followed only after the inode is published: check it first.
        let first = self.inode(parent).first_child.load(Relaxed);
        if first != NIL {
            self.check_ino(first, || {
                format!("the first entry of directory inode {parent}")
            })?;
        }
        let ino = self.take_free_inode()?;
        let inode = self.inode(ino);
        // Taking the inode's lock repairs leftovers of a previous incarnation if needed.
        let mut g = self.lock_inode(ino)?;
        g.make_fresh_on_unlock();
        let now = now_ns();
        inode.gen.fetch_add(1, Relaxed);
        inode.size.store(0, Relaxed);
        inode.map.store(0, Relaxed);
        inode.mode.store(mode & 0o7777, Relaxed);
        let (uid, gid) = crate::ownership::creator_ids::get();
        inode.uid.store(uid, Relaxed);
        inode.gid.store(gid, Relaxed);
        inode.chunks_mem.store(0, Relaxed);
        inode.chunks_spill.store(0, Relaxed);
        inode.opens.store(0, Relaxed);
        inode.writers.store(0, Relaxed);
        inode.life.store(0, Relaxed);
        inode.mod_seq.store(1, Relaxed);
        inode.durable_seq.store(0, Relaxed);
        inode.commit_seq.store(0, Relaxed);
        for t in [&inode.atime, &inode.mtime, &inode.ctime] {
            t.store(now, Relaxed);
        }
        inode.first_child.store(NIL, Relaxed);
        // SAFETY: the slot holds 256 bytes and name.len() <= NAME_MAX (checked by parse_path);
        // the inode is FREE, so nobody reads this slot.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), self.name_ptr(ino, 0), name.len()) };
        inode.link.store(pack_link(parent, name.len(), 0), Release);
        inode.state.store(state, Release); // publish
        self.hash_insert(ino)?;
        self.sibling_insert(parent, ino)?;
        self.touch_dir(parent, now);
        self.invalidate_dir(parent);
        Ok(ino)
    }

    fn touch_dir(&self, dir: u32, now: i64) {
        let d = self.inode(dir);
        d.mtime.store(now, Relaxed);
        d.ctime.store(now, Relaxed);
    }

    /// Removes a file or empty directory (namespace lock held, [`Self::lock_ns`] for a
    /// directory), freeing its data. The stripes of the name index the removal changes are
    /// odd meanwhile, so that a lock-free lookup there retries.
    pub(crate) fn remove_inode(&self, parent: u32, ino: u32) -> Result<()> {
        self.check_entry_links(ino, parent)?;
        let _stripes = StripesWritten::begin(self, self.removal_stripes(ino));
        let orphan = {
            let mut g = self.lock_inode(ino)?;
            let inode = self.inode(ino);
            // A file still open somewhere keeps its data (POSIX): it leaves the namespace now
            // and is freed when its last open description closes (see reap_orphan).
            let state = inode.state.load(Acquire);
            let orphan = inode.opens.load(SeqCst) > 0 && {
                let kept = if state == INODE_DIR {
                    INODE_ORPHAN_DIR
                } else {
                    INODE_ORPHAN
                };
                // Publish. A last close that read the state before this store left the
                // freeing to us (closed_description): look at the count again after it.
                inode.state.store(kept, SeqCst);
                inode.opens.load(SeqCst) > 0
            };
            if !orphan {
                inode.state.store(INODE_FREE, Release); // publish
                self.free_file_data(ino)?;
                g.make_fresh_on_unlock();
            }
            orphan
        };
        self.hash_remove(ino)?;
        self.sibling_remove(parent, ino)?;
        if !orphan {
            self.push_free_inode(ino)?;
        }
        self.touch_dir(parent, now_ns());
        self.invalidate_dir(parent);
        Ok(())
    }

    /// Frees an orphan once nothing has it open (namespace lock taken here).
    pub(crate) fn reap_orphan(&self, ino: u32, gen: u32) -> Result<()> {
        let _ns = self.lock_ns()?;
        {
            let mut g = self.lock_inode(ino)?;
            let inode = self.inode(ino);
            if !is_orphan_state(inode.state.load(Acquire))
                || inode.gen.load(Acquire) != gen
                || inode.opens.load(Acquire) > 0
            {
                return Ok(());
            }
            inode.state.store(INODE_FREE, Release); // publish
            self.free_file_data(ino)?;
            g.make_fresh_on_unlock();
        }
        self.push_free_inode(ino)
    }

    /// The lease slot of this process (namespace lock held): the one it claimed at attach,
    /// or a new one for a forked child or after detach, as for chunks.
    fn own_lease_slot(&self) -> Result<u32> {
        self.own_slot(&mut self.lock_lease())
    }

    /// A free inode for a create (namespace lock held). It comes from this process's batch
    /// (`LeaseSlot::inodes`), refilled from the shared stack `INODE_BATCH` at a time: the
    /// slot's line stays in this process's cache and the stack's top is written once per
    /// batch, so creates of several processes do not pass those lines back and forth inside
    /// the critical section, and `Store::open` can prefetch the inode it will get. When the
    /// stack is empty, every process's batch goes back to it first: no create fails while a
    /// free inode is left anywhere.
    fn take_free_inode(&self) -> Result<u32> {
        let s = self.own_lease_slot()?;
        if let Some(ino) = self.pop_inode_batch(s)? {
            return Ok(ino);
        }
        if self.header().free_inode_top.load(Relaxed) == 0 {
            for other in 0..self.geo.lease_slots {
                self.return_inode_batch(other)?;
            }
        }
        let slot = self.lease_slot(s);
        for n in 0..INODE_BATCH {
            let Some(ino) = self.pop_free_inode_stack()? else {
                break;
            };
            slot.inodes[n].store(ino, Relaxed);
            slot.inode_count.store(n as u32 + 1, Relaxed);
        }
        self.pop_inode_batch(s)?
            .ok_or_else(|| self.record_enospc(EnospcReason::FileTableFull))
    }

    /// The inode on top of lease slot `s`'s batch, if any, checked to be FREE.
    fn pop_inode_batch(&self, s: u32) -> Result<Option<u32>> {
        let slot = self.lease_slot(s);
        let n = slot.inode_count.load(Relaxed) as usize;
        let Some(n) = n.checked_sub(1) else {
            return Ok(None);
        };
        let entry = slot.inodes.get(n).ok_or_else(|| {
            Error::damaged(format!(
                "lease slot {s} counts {} free inodes, more than a batch of {INODE_BATCH}",
                n + 1
            ))
        })?;
        let ino = self.checked_free_inode(
            entry.load(Relaxed),
            || format!("entry {n} of lease slot {s}'s free inodes"),
            || format!("lease slot {s}'s free inodes name"),
        )?;
        slot.inode_count.store(n as u32, Relaxed);
        Ok(Some(ino))
    }

    /// Pops the shared free-inode stack (namespace lock held): None when it is empty.
    fn pop_free_inode_stack(&self) -> Result<Option<u32>> {
        let h = self.header();
        let top = h.free_inode_top.load(Relaxed);
        let Some(t) = top.checked_sub(1) else {
            return Ok(None);
        };
        let stack = self.free_inode_stack();
        let entry = stack.get(t as usize).ok_or_else(|| {
            Error::damaged(format!(
                "the free-inode stack top is {top}, past its {} entries",
                stack.len()
            ))
        })?;
        let ino = self.checked_free_inode(
            entry.load(Relaxed),
            || format!("free-inode stack entry {t}"),
            || "the free-inode stack names".to_string(),
        )?;
        h.free_inode_top.store(t, Release);
        Ok(Some(ino))
    }

    /// Inode `ino`, read from `entry` of a free list (`holder` names the list in the error),
    /// checked to lie in the table and to be FREE: handing out a live inode would
    /// overwrite a file.
    fn checked_free_inode(
        &self,
        ino: u32,
        entry: impl FnOnce() -> String,
        holder: impl FnOnce() -> String,
    ) -> Result<u32> {
        let ino = self.check_ino(ino, entry)?;
        if self.inode(ino).state.load(Acquire) != INODE_FREE {
            return Err(Error::damaged(format!(
                "{} inode {ino}, which is in use",
                holder()
            )));
        }
        Ok(ino)
    }

    /// Moves lease slot `s`'s batch of free inodes back to the shared stack (namespace lock
    /// held). An entry that names no free inode is dropped: a free inode is only ever in
    /// one place, so that one is in a file (fsck counts what the stack and the batches hold
    /// against the free inodes, and a repair rebuilds both).
    pub(crate) fn return_inode_batch(&self, s: u32) -> Result<()> {
        let slot = self.lease_slot(s);
        let n = (slot.inode_count.load(Relaxed) as usize).min(INODE_BATCH);
        for entry in &slot.inodes[..n] {
            let ino = entry.load(Relaxed);
            if ino < self.geo.max_inodes && self.inode(ino).state.load(Acquire) == INODE_FREE {
                self.push_free_inode_stack(ino)?;
            }
        }
        slot.inode_count.store(0, Relaxed);
        Ok(())
    }

    /// The lease slot this process claimed, if it has one (a forked child has not yet).
    fn claimed_lease_slot(&self) -> Option<u32> {
        let local = self.lock_lease();
        (local.pid == crate::block::my_pid()).then_some(local.slot)
    }

    /// Gives this process's batch of free inodes back to the shared stack (at detach).
    pub(crate) fn return_own_inode_batch(&self) {
        let Some(slot) = self.claimed_lease_slot() else {
            return;
        };
        if let Ok(_g) = self.lock_ns_entries() {
            let _ = self.return_inode_batch(slot);
        }
    }

    /// The inode a create of this process will get next, if it has a batch (a hint for
    /// [`Self::prefetch_for`]; read without the namespace lock).
    fn next_inode_hint(&self) -> Option<u32> {
        let slot = self.lease_slot(self.claimed_lease_slot()?);
        let n = (slot.inode_count.load(Relaxed) as usize).checked_sub(1)?;
        slot.inodes.get(n).map(|e| e.load(Relaxed))
    }

    /// Frees inode `ino` (namespace lock held): into this process's batch while it has
    /// room, else onto the shared stack.
    fn push_free_inode(&self, ino: u32) -> Result<()> {
        let slot = self.lease_slot(self.own_lease_slot()?);
        let n = slot.inode_count.load(Relaxed) as usize;
        if n < INODE_BATCH {
            slot.inodes[n].store(ino, Relaxed);
            slot.inode_count.store(n as u32 + 1, Relaxed);
            return Ok(());
        }
        self.push_free_inode_stack(ino)
    }

    fn push_free_inode_stack(&self, ino: u32) -> Result<()> {
        let h = self.header();
        let top = h.free_inode_top.load(Relaxed);
        let stack = self.free_inode_stack();
        let Some(slot) = stack.get(top as usize) else {
            return Err(Error::damaged(format!(
                "the free-inode stack top is {top}, past its {} entries",
                stack.len()
            )));
        };
        slot.store(ino, Relaxed);
        h.free_inode_top.store(top + 1, Release);
        Ok(())
    }

    /// The entries of directory `dir`, sorted by name. EIO when the entry list read from the
    /// block is damaged: a link out of the inode table, an entry whose parent is another
    /// directory, or a list longer than the table (a loop).
    pub(crate) fn list_dir_checked(&self, dir: u32) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        let mut cur = self.inode(dir).first_child.load(Relaxed);
        while cur != NIL {
            let ino = self.check_ino(cur, || format!("the entry list of directory inode {dir}"))?;
            if out.len() >= self.geo.max_inodes as usize {
                return Err(Error::damaged(format!(
                    "the entry list of directory inode {dir} loops"
                )));
            }
            let inode = self.inode(ino);
            let parent = link_parent(inode.link.load(Acquire));
            if parent != dir {
                return Err(Error::damaged(format!(
                    "the entry list of directory inode {dir} holds inode {ino}, whose parent \
                     is inode {parent}"
                )));
            }
            out.push(DirEntry {
                name: String::from_utf8_lossy(&self.name_of(ino)).into_owned(),
                ino: ino as u64,
                kind: kind_of(inode.state.load(Acquire)),
            });
            cur = inode.next_sibling.load(Relaxed);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The inode an anchor component ("\0<ino>:<gen>") names, if that incarnation lives.
    fn anchor(&self, comp: &str) -> Option<u32> {
        let (ino, gen) = comp.trim_start_matches(ANCHOR).split_once(':')?;
        let (ino, gen): (u32, u32) = (ino.parse().ok()?, gen.parse().ok()?);
        let inode = (ino < self.geo.max_inodes).then(|| self.inode(ino))?;
        (inode.state.load(Acquire) != INODE_FREE && inode.gen.load(Acquire) == gen).then_some(ino)
    }

    /// The parent of directory `dir` (not the root) for "..": a directory, or EIO.
    fn parent_dir(&self, dir: u32) -> Result<u32> {
        let parent = self.parent_of(dir)?;
        if self.inode(parent).state.load(Acquire) != INODE_DIR {
            return Err(Error::damaged(format!(
                "the parent of directory inode {dir} is inode {parent}, which is not a directory"
            )));
        }
        Ok(parent)
    }

    /// The parent link of `ino`, checked to lie inside the inode table.
    pub(crate) fn parent_of(&self, ino: u32) -> Result<u32> {
        let parent = link_parent(self.inode(ino).link.load(Acquire));
        self.check_ino(parent, || {
            format!(
                "the parent link of inode {ino} ({:?})",
                String::from_utf8_lossy(&self.name_of(ino))
            )
        })
    }

    /// Calls `f` on each directory above `ino`, from its parent up to the root, until it
    /// returns Some. EIO when a parent link leaves the inode table or the links loop: Brent's
    /// cycle detection finds a loop within a few of its lengths, with no step limit to tune.
    pub(crate) fn find_ancestor<T>(
        &self,
        ino: u32,
        mut f: impl FnMut(u32) -> Option<T>,
    ) -> Result<Option<T>> {
        let (mut cur, mut tortoise, mut power, mut steps) = (ino, ino, 1u32, 0u32);
        while cur != ROOT_INO {
            cur = self.parent_of(cur)?;
            if cur == tortoise {
                return Err(Error::damaged(format!(
                    "the parent links above inode {ino} loop through inode {cur}"
                )));
            }
            if let Some(found) = f(cur) {
                return Ok(Some(found));
            }
            steps += 1;
            if steps == power {
                tortoise = cur;
                power = power.saturating_mul(2);
                steps = 0;
            }
        }
        Ok(None)
    }

    /// The current store path of a live inode (namespace lock held); None once removed.
    pub(crate) fn path_of(&self, ino: u32) -> Result<Option<String>> {
        if ino == ROOT_INO {
            return Ok(Some("/".to_string()));
        }
        if !matches!(self.inode(ino).state.load(Acquire), INODE_FILE | INODE_DIR) {
            return Ok(None);
        }
        let mut parts = Vec::new();
        self.walk_up(ino, |i| parts.push(self.name_of(i)))?;
        let mut p = String::new();
        for part in parts.iter().rev() {
            p.push('/');
            p.push_str(&String::from_utf8_lossy(part));
        }
        Ok(Some(p))
    }

    /// The length of [`Self::path_of`] directory `dir` without its trailing '/' (0 for the
    /// root and for an inode no longer live), allocating nothing.
    fn path_len(&self, dir: u32) -> Result<usize> {
        if dir == ROOT_INO || !matches!(self.inode(dir).state.load(Acquire), INODE_FILE | INODE_DIR)
        {
            return Ok(0);
        }
        let mut len = 0;
        self.walk_up(dir, |i| {
            len += 1 + name_len(self.inode(i).link.load(Acquire));
        })?;
        Ok(len)
    }

    /// Calls `f` on `ino` and then on each directory above it, up to but not including the
    /// root. EIO when a parent link is damaged (see [`Self::find_ancestor`]) or names an
    /// inode that is not a directory.
    fn walk_up(&self, ino: u32, mut f: impl FnMut(u32)) -> Result<()> {
        f(ino);
        let mut child = ino;
        let bad = self.find_ancestor(ino, |dir| {
            if dir == ROOT_INO {
                return None;
            }
            if self.inode(dir).state.load(Acquire) != INODE_DIR {
                return Some(Error::damaged(format!(
                    "the parent of inode {child} is inode {dir}, which is not a directory"
                )));
            }
            f(dir);
            child = dir;
            None
        })?;
        bad.map_or(Ok(()), Err)
    }

    /// True if `ino` is `ancestor` or lies below it.
    fn is_within(&self, ino: u32, ancestor: u32) -> Result<bool> {
        if ino == ancestor {
            return Ok(true);
        }
        Ok(self
            .find_ancestor(ino, |dir| (dir == ancestor).then_some(()))?
            .is_some())
    }

    /// Atomic rename (namespace lock held).
    pub(crate) fn rename_locked(&self, from: &str, to: &str) -> Result<()> {
        match self.check_rename(from, to)? {
            Some(rename) => self.move_entry(rename),
            // Already that name.
            None => Ok(()),
        }
    }

    /// What a rename moves, after the checks it makes in the kernel's order of errors; None
    /// when `to` already names `from`'s inode.
    fn check_rename<'n>(&self, from: &str, to: &'n str) -> Result<Option<Rename<'n>>> {
        // Both parents first, then the names: the kernel's order of errors.
        let (src_dir, src_name) = self.resolve_parent_unchecked(from)?;
        let (dst_dir, dst_name) = self.resolve_parent_unchecked(to)?;
        let too_long = |n: Option<&str>, p: &str| match n {
            Some(n) if n.len() > NAME_MAX => Err(Error::new(libc::ENAMETOOLONG, p.to_string())),
            _ => Ok(()),
        };
        too_long(src_name, from)?;
        let src_name =
            src_name.ok_or_else(|| Error::new(libc::EBUSY, "cannot rename the root directory"))?;
        let dst_name =
            dst_name.ok_or_else(|| Error::new(libc::EBUSY, "cannot replace the root directory"))?;
        let src = self
            .lookup(src_dir, src_name)?
            .ok_or_else(|| Error::new(libc::ENOENT, from.to_string()))?;
        too_long(Some(dst_name), to)?;
        let src_is_dir = self.inode(src).state.load(Acquire) == INODE_DIR;
        if !src_is_dir && (from.ends_with('/') || to.ends_with('/')) {
            return Err(Error::new(libc::ENOTDIR, from.to_string()));
        }
        if src_is_dir && self.is_within(dst_dir, src)? {
            return Err(Error::new(
                libc::EINVAL,
                format!("cannot move {from} into itself ({to})"),
            ));
        }
        let victim = self.lookup(dst_dir, dst_name)?;
        if victim == Some(src) {
            return Ok(None);
        }
        self.check_path_limit(dst_dir, dst_name)?;
        if let Some(v) = victim {
            if self.is_within(src, v)? {
                return Err(Error::new(libc::ENOTEMPTY, to.to_string()));
            }
        }
        if let Some(v) = victim {
            let v_is_dir = self.inode(v).state.load(Acquire) == INODE_DIR;
            match (src_is_dir, v_is_dir) {
                (true, false) => return Err(Error::new(libc::ENOTDIR, to.to_string())),
                (false, true) => return Err(Error::new(libc::EISDIR, to.to_string())),
                (true, true) if self.inode(v).first_child.load(Relaxed) != NIL => {
                    return Err(Error::new(libc::ENOTEMPTY, to.to_string()))
                }
                _ => {}
            }
        }
        Ok(Some(Rename {
            src_dir,
            src,
            dst_dir,
            dst_name,
            victim,
        }))
    }

    /// Moves the entry (replacing the victim through the rename journal), then updates
    /// what is keyed by its name and the times.
    fn move_entry(&self, rename: Rename) -> Result<()> {
        let Rename {
            src_dir,
            src,
            dst_dir,
            dst_name,
            victim,
        } = rename;
        self.check_entry_links(src, dst_dir)?;
        if let Some(v) = victim {
            self.check_entry_links(v, dst_dir)?;
        }
        let inode = self.inode(src);
        let old_link = inode.link.load(Acquire);
        let slot = 1 - link_slot(old_link);
        // SAFETY: the inactive slot holds 256 bytes, dst_name.len() <= NAME_MAX, and only
        // namespace-lock holders read names.
        unsafe {
            std::ptr::copy_nonoverlapping(
                dst_name.as_ptr(),
                self.name_ptr(src, slot),
                dst_name.len(),
            )
        };
        let new_link = pack_link(dst_dir, dst_name.len(), slot as u32);
        let h = self.header();
        if let Some(v) = victim {
            h.rj_src.store(src, Relaxed);
            h.rj_victim.store(v, Relaxed);
            h.rj_link.store(new_link, Relaxed);
            h.rj_valid.store(1, Release);
        }
        // Derived structures are keyed by the current name: take the entry out first.
        self.hash_remove(src)?;
        self.sibling_remove(src_dir, src)?;
        inode.link.store(new_link, Release); // publish
        if let Some(v) = victim {
            self.remove_inode(dst_dir, v)?;
            h.rj_valid.store(0, Release);
        }
        self.hash_insert(src)?;
        self.sibling_insert(dst_dir, src)?;
        // The durable copy of everything moved is at the old path: all of it is new again.
        self.invalidate_dir(src_dir);
        self.invalidate_subtree(src);
        let now = now_ns();
        inode.ctime.store(now, Relaxed);
        self.touch_dir(src_dir, now);
        self.touch_dir(dst_dir, now);
        Ok(())
    }
}

/// A checked rename: `src` (in `src_dir`) becomes `dst_name` in `dst_dir`, replacing
/// `victim`.
struct Rename<'n> {
    src_dir: u32,
    src: u32,
    dst_dir: u32,
    dst_name: &'n str,
    victim: Option<u32>,
}

/// The name index has no empty slot: with twice as many slots as inodes, only damage fills it.
fn index_full() -> Error {
    Error::damaged("the name index has no empty slot (it has twice as many as there are inodes)")
}
