//! Open file descriptions for the interposition library.
//!
//! POSIX shares a file offset between descriptors made by dup, inherited over fork, and kept
//! over exec. So that every process sharing a Cascade descriptor sees the same offset without
//! a system call per read or write, the description (file, flags, offset) lives in a table in
//! the block. A slot is claimed lock-free (compare-and-swap on its nonce), reference-counted
//! by the library, and swept when the table fills up (after kill -9 left counts behind).

use crate::block::Block;
use crate::error::{Error, Result};
use crate::layout::{is_orphan_state, OfdSlot, OFD_SLOTS};
use crate::store::{File, Store};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};

/// Names one open file description: its slot and the nonce it was claimed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpenDescription {
    pub slot: u32,
    pub nonce: u64,
}

/// Prefix of the memfd name that carries a description into every descriptor for it.
const MEMFD_PREFIX: &str = "cascade-ofd:";

impl OpenDescription {
    /// The memfd name a descriptor of this description carries ("cascade-ofd:<slot>:<nonce>").
    pub fn memfd_name(&self) -> std::ffi::CString {
        // The format has no NUL bytes.
        std::ffi::CString::new(format!("{MEMFD_PREFIX}{}:{}", self.slot, self.nonce))
            .unwrap_or_default()
    }

    /// Parses a descriptor's /proc link, "/memfd:cascade-ofd:<slot>:<nonce> (deleted)".
    pub fn from_fd_link(link: &str) -> Option<OpenDescription> {
        let rest = link.strip_prefix("/memfd:")?.strip_prefix(MEMFD_PREFIX)?;
        let rest = rest.split(' ').next()?;
        let (slot, nonce) = rest.split_once(':')?;
        Some(OpenDescription {
            slot: slot.parse().ok()?,
            nonce: nonce.parse().ok()?,
        })
    }
}

/// Descriptions some process still has a descriptor for, or maps (a mapping's pin: its
/// memfd's page), by a scan of /proc/*/fd and /proc/*/maps.
fn referenced_descriptions() -> std::collections::HashSet<OpenDescription> {
    let mut live = std::collections::HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return live;
    };
    for p in procs.flatten() {
        if let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) {
            live.extend(
                maps.lines()
                    .filter_map(|l| l.find("/memfd:").map(|at| &l[at..]))
                    .filter_map(OpenDescription::from_fd_link),
            );
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for f in fds.flatten() {
            if let Some(d) = std::fs::read_link(f.path())
                .ok()
                .and_then(|t| OpenDescription::from_fd_link(&t.to_string_lossy()))
            {
                live.insert(d);
            }
        }
    }
    live
}

/// Slots younger than this are swept only once the process that claimed them is dead: their
/// descriptor may not exist yet.
const SWEEP_MIN_AGE_NS: i64 = 2_000_000_000;

/// A live description in the block.
pub struct Description<'a> {
    slot: &'a OfdSlot,
}

impl Block {
    /// [`Store::description`]: one slot check and the nonce, no panic.
    #[inline(always)]
    pub(crate) fn description(&self, d: OpenDescription) -> Option<Description<'_>> {
        if d.slot >= OFD_SLOTS {
            return None;
        }
        Description::if_live(self.ofd(d.slot), d.nonce)
    }
}

impl<'a> Description<'a> {
    /// The description in `slot` if the slot still holds the one claimed with `nonce`.
    #[inline(always)]
    pub(crate) fn if_live(slot: &'a OfdSlot, nonce: u64) -> Option<Description<'a>> {
        (slot.nonce.load(Acquire) == nonce).then_some(Description { slot })
    }
}

impl Description<'_> {
    /// The shared file offset.
    #[inline]
    pub fn offset(&self) -> &AtomicU64 {
        &self.slot.offset
    }
    #[inline]
    pub fn flags(&self) -> i32 {
        self.slot.flags.load(Acquire) as i32
    }
    pub fn set_flags(&self, flags: i32) {
        self.slot.flags.store(flags as u32, Release);
    }
    pub fn ino(&self) -> u64 {
        self.slot.ino.load(Acquire) as u64
    }
    pub fn generation(&self) -> u32 {
        self.slot.gen.load(Acquire)
    }
    /// One more descriptor refers to it (dup, fork).
    pub fn add_ref(&self) {
        self.slot.refs.fetch_add(1, AcqRel);
    }
    /// Drops one reference if it is not the last (a descriptor the kernel is about to close
    /// at exec while others still refer to it); true if it did. The last one is dropped by
    /// [`Store::release_description`], which frees the slot.
    pub fn drop_shared_ref(&self) -> bool {
        self.slot
            .refs
            .fetch_update(AcqRel, Acquire, |n| (n > 1).then(|| n - 1))
            .is_ok()
    }
}

/// Flag of a description that pins a mapping's data (never an open(2) flag): see
/// [`Store::pin_mapping`].
pub const PIN_FLAG: i32 = 1 << 30;

/// A description opened for writing (counted in the inode's `writers`).
fn writes(flags: i32) -> bool {
    matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
}

/// A nonce for a description slot: unique among live slots is all that is needed, and a
/// create takes one, so not a getrandom system call each. A process-wide seed (getrandom
/// once, else the time), a process-wide counter and this thread's pid and tid, mixed with
/// splitmix64: a fork child (its own pid) and a vfork child (the parent's counter, in shared
/// memory) never repeat the parent's sequence.
/// Where this process's next search for a free description slot starts: just past the
/// slot it took last (`Block::next_ofd_slot`), tagged with its pid (a fork child, or a
/// process that took none yet, starts at a random slot). Its slots are then neighbours, in
/// cache lines and pages it touched already, and the slots of different processes lie
/// apart; a random start per open touched a new line of the 4 MiB table, and missed the
/// cache, every time (a tenth of a create).
fn next_slot_to_try(b: &Block, nonce: u64) -> u32 {
    let next = b.next_ofd_slot.load(Relaxed);
    if next >> 32 == u64::from(crate::block::my_pid()) {
        next as u32 % OFD_SLOTS
    } else {
        (nonce % OFD_SLOTS as u64) as u32
    }
}

fn remember_slot_taken(b: &Block, slot_no: u32) {
    let pid = u64::from(crate::block::my_pid());
    b.next_ofd_slot
        .store(pid << 32 | u64::from(slot_no + 1), Relaxed);
}

fn fresh_nonce() -> u64 {
    static SEED: AtomicU64 = AtomicU64::new(0);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut seed = SEED.load(Relaxed);
    if seed == 0 {
        let mut n = 0u64;
        // SAFETY: getrandom writes at most 8 bytes into `n`.
        let got = unsafe {
            libc::getrandom(
                &mut n as *mut u64 as *mut libc::c_void,
                8,
                libc::GRND_NONBLOCK,
            )
        };
        if got != 8 || n == 0 {
            n = crate::block::now_ns() as u64 | 1;
        }
        seed = match SEED.compare_exchange(0, n, Relaxed, Relaxed) {
            Ok(_) => n,
            Err(theirs) => theirs,
        };
    }
    let count = COUNTER.fetch_add(1, Relaxed);
    let mut z =
        seed ^ crate::lock::me().rotate_left(17) ^ count.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

impl Store {
    /// Claims a description for `file`, opened with `flags`, at offset 0, with one reference.
    /// ENFILE when all slots are taken even after a sweep freed the unreferenced ones.
    pub fn describe_open(&self, file: &File, flags: i32) -> Result<OpenDescription> {
        for attempt in 0..2 {
            if attempt == 1 && self.sweep_descriptions() == 0 {
                break;
            }
            let nonce = fresh_nonce();
            let start = next_slot_to_try(self.block(), nonce);
            for i in 0..OFD_SLOTS {
                let slot_no = (start + i) % OFD_SLOTS;
                let slot = self.block().ofd(slot_no);
                if slot.nonce.load(Relaxed) != 0 {
                    continue;
                }
                if slot
                    .nonce
                    .compare_exchange(0, nonce, AcqRel, Relaxed)
                    .is_ok()
                {
                    remember_slot_taken(self.block(), slot_no);
                    slot.offset.store(0, Relaxed);
                    slot.ino.store(file.ino() as u32, Relaxed);
                    slot.gen.store(file.generation(), Relaxed);
                    slot.flags.store(flags as u32, Relaxed);
                    slot.claimed_ns.store(crate::block::now_ns(), Relaxed);
                    slot.claimer_pid.store(crate::block::my_pid(), Relaxed);
                    slot.anchor_start.store(0, Relaxed);
                    slot.rewrite_at_open.store(
                        self.block().inode(file.ino() as u32).life.load(Acquire)
                            >> crate::layout::LIFE_REWRITE_SHIFT,
                        Relaxed,
                    );
                    slot.refs.store(1, Release);
                    let ino = file.ino() as u32;
                    let inode = self.block().inode(ino);
                    inode.opens.fetch_add(1, AcqRel);
                    // Counted only on the incarnation the handle names: one removed since
                    // (its inode freed or reused) is not this file.
                    if inode.gen.load(Acquire) != file.generation()
                        || inode.state.load(Acquire) == crate::layout::INODE_FREE
                    {
                        let before = inode
                            .opens
                            .fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(1)))
                            .unwrap_or(0);
                        slot.nonce.store(0, Release);
                        if before == 1 {
                            // The other occupant's last close came meanwhile and left this
                            // count to free it.
                            let _ = self.block().reap_orphan(ino, inode.gen.load(Acquire));
                        }
                        return Err(Error::new(
                            libc::ESTALE,
                            "the file was removed while opened",
                        ));
                    }
                    if writes(flags) {
                        // A writer first, then a new version: an agent that read the file
                        // between the open and now (writers == 0) cannot record it durable,
                        // and writes do not bump the version (file.rs, write_locked).
                        self.block().add_writer(ino);
                        inode.mod_seq.fetch_add(1, AcqRel);
                    }
                    return Ok(OpenDescription {
                        slot: slot_no,
                        nonce,
                    });
                }
            }
        }
        Err(Error::new(
            libc::ENFILE,
            format!(
                "store {}: all {OFD_SLOTS} open-file slots are in use",
                self.name()
            ),
        ))
    }

    /// Pins the data of `file` for a mapping of it: a read-only description with
    /// [`PIN_FLAG`], which keeps the file alive like an open descriptor (an unlinked file
    /// keeps its chunks, an evicted checkpoint is not evicted), and a count in the inode that
    /// makes truncation keep the chunks past the new end. Released like any description
    /// ([`Store::release_description`], or a sweep once no process maps its memfd); the last
    /// release trims what truncation kept.
    pub fn pin_mapping(&self, file: &File) -> Result<OpenDescription> {
        let b = self.block();
        let ino = file.ino() as u32;
        {
            let _g = b.lock_inode(ino)?;
            let inode = b.inode(ino);
            if inode.gen.load(Acquire) != file.generation() {
                return Err(Error::new(libc::ESTALE, "the file was removed"));
            }
            if inode.life.load(Acquire) & crate::layout::LIFE_MAPS_MASK
                != crate::layout::LIFE_MAPS_MASK
            {
                inode
                    .life
                    .fetch_add(1 << crate::layout::LIFE_MAPS_SHIFT, AcqRel);
            }
        }
        self.describe_open(file, libc::O_RDONLY | PIN_FLAG)
            .inspect_err(|_| {
                let _ = b.unpin(ino, file.generation());
            })
    }

    /// The description `d` names, if it is still live (its nonce matches).
    #[inline]
    pub fn description(&self, d: OpenDescription) -> Option<Description<'_>> {
        self.block().description(d)
    }

    /// Drops one reference; frees the slot when it was the last (and the file, if it was
    /// unlinked meanwhile and this was its last open description).
    pub fn release_description(&self, d: OpenDescription) {
        if let Some(desc) = self.description(d) {
            if desc.slot.refs.fetch_sub(1, AcqRel) <= 1 {
                let (ino, gen, flags) = (desc.ino() as u32, desc.generation(), desc.flags());
                if desc
                    .slot
                    .nonce
                    .compare_exchange(d.nonce, 0, AcqRel, Relaxed)
                    .is_ok()
                {
                    self.closed_description(ino, gen, flags, None);
                }
            }
        }
    }

    /// One open description of (ino, gen) is gone. `swept_rewrite` is set when no process
    /// closed it (its holders died) and holds the file's rewrite count at its open: a writer
    /// may have stopped half way, so the file is torn unless it was rewritten since.
    fn closed_description(&self, ino: u32, gen: u32, flags: i32, swept_rewrite: Option<u32>) {
        let b = self.block();
        if ino >= b.geo.max_inodes {
            return;
        }
        if writes(flags) {
            let torn = swept_rewrite.is_some_and(|at_open| {
                b.inode(ino).life.load(Acquire) >> crate::layout::LIFE_REWRITE_SHIFT == at_open
            });
            b.remove_writer(ino, gen, torn);
        }
        let inode = b.inode(ino);
        if inode.gen.load(Acquire) != gen {
            return;
        }
        if flags & PIN_FLAG != 0 {
            let _ = b.unpin(ino, gen);
        }
        // SeqCst, with the state load below, pairs with remove_inode's store of the orphan
        // state and its second look at `opens`: at least one of the two sees the other, so
        // an orphan is always freed, and the last close of a file still named takes no lock.
        let left = inode
            .opens
            .fetch_update(SeqCst, SeqCst, |n| Some(n.saturating_sub(1)))
            .map_or(0, |n| n.saturating_sub(1));
        if left == 0 && is_orphan_state(inode.state.load(SeqCst)) {
            let _ = b.reap_orphan(ino, gen);
        }
    }

    /// Frees the descriptions no process has a descriptor for any more (their holders died:
    /// a writer among them leaves its file torn). Scans /proc; returns how many were freed.
    pub fn sweep_descriptions(&self) -> usize {
        let live = referenced_descriptions();
        let now = crate::block::now_ns();
        let mut freed = 0;
        let mut anchors_alive = std::collections::HashMap::new();
        for slot_no in 0..OFD_SLOTS {
            let slot = self.block().ofd(slot_no);
            let nonce = slot.nonce.load(Acquire);
            if nonce == 0 {
                continue;
            }
            let claimer = slot.claimer_pid.load(Acquire);
            // SAFETY: kill with signal 0 only checks that the process exists.
            let claimer_alive = claimer != 0 && unsafe { libc::kill(claimer as i32, 0) } == 0;
            if claimer_alive && now - slot.claimed_ns.load(Acquire) < SWEEP_MIN_AGE_NS {
                continue;
            }
            let rewrite = slot.rewrite_at_open.load(Acquire);
            let (ino, gen) = (slot.ino.load(Acquire), slot.gen.load(Acquire));
            let flags = slot.flags.load(Acquire) as i32;
            let anchor = slot.anchor_start.load(Acquire);
            if anchor != 0
                && *anchors_alive
                    .entry((claimer, anchor))
                    .or_insert_with(|| crate::block::process_alive(claimer, anchor))
            {
                continue;
            }
            if !live.contains(&OpenDescription {
                slot: slot_no,
                nonce,
            }) && slot
                .nonce
                .compare_exchange(nonce, 0, AcqRel, Relaxed)
                .is_ok()
            {
                self.closed_description(ino, gen, flags, Some(rewrite));
                freed += 1;
            }
        }
        freed
    }

    /// Records that this process, which claimed `d`, holds it through its anchor descriptor
    /// (no memfd named after the slot): sweeps keep it while this process lives. False if
    /// that cannot be recorded (this process's start time is unknown): name a memfd then.
    pub fn anchor_description(&self, d: OpenDescription) -> bool {
        let start = crate::block::my_start_time();
        match self.description(d) {
            Some(desc)
                if start != 0 && desc.slot.claimer_pid.load(Acquire) == crate::block::my_pid() =>
            {
                desc.slot.anchor_start.store(start, Release);
                true
            }
            _ => false,
        }
    }

    /// Opens the file a description refers to, by inode and generation (ESTALE if it was
    /// removed since). Used when a descriptor is inherited over exec. `flags` give the
    /// access mode; the handle does not append on its own even with O_APPEND, which belongs
    /// to the description (fcntl(F_SETFL) changes it): its user appends with
    /// [`File::append`] while the description's flags say so.
    pub fn reopen(&self, ino: u64, generation: u32, flags: i32) -> Result<File> {
        File::reopen(self, ino, generation, flags)
    }
}

/// How many live descriptions, and how many of them open for writing, refer to each inode
/// incarnation (fsck's recount).
pub(crate) fn count_descriptions(
    b: &crate::block::Block,
) -> std::collections::HashMap<(u32, u32), (u32, u32)> {
    let mut counts = std::collections::HashMap::new();
    for slot_no in 0..OFD_SLOTS {
        let slot = b.ofd(slot_no);
        if slot.nonce.load(Acquire) != 0 {
            let c = counts
                .entry((slot.ino.load(Acquire), slot.gen.load(Acquire)))
                .or_insert((0, 0));
            c.0 += 1;
            if writes(slot.flags.load(Acquire) as i32) {
                c.1 += 1;
            }
        }
    }
    counts
}
