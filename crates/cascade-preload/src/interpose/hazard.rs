//! Lock-free use of a descriptor's entry on the read and write paths.
//!
//! A read or write must not see its entry freed by a close (or dup2 over it) in another
//! thread. Taking the descriptor's slot lock costs two atomic operations per call, a
//! quarter of a 64-byte write. Instead each thread owns a *hazard record*: it stores the
//! descriptor it is about to use there with a plain store, then loads the entry. A closer
//! unpublishes the entry, runs `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (which orders
//! every running thread's earlier stores before the closer's later loads, the fence the
//! readers leave out), and waits until no record names the descriptor before it drops the
//! entry. Closing is the rare side: a process with one thread pays nothing, others one
//! membarrier per close of a Cascade descriptor.
//!
//! Where membarrier is refused (old kernels, seccomp), readers fence themselves
//! ([`READERS_FENCE`]). A thread without a record (more than [`RECORDS`] threads have
//! used the library at once) or a nested call (a signal handler's write inside a write)
//! takes the slot lock as before.

use std::cell::Cell;
use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};

/// Threads that can hold a record at once; beyond that a thread uses the slot lock.
pub(crate) const RECORDS: usize = 256;

/// One thread's record, alone in its cache line (each call stores to it twice).
#[repr(align(64))]
struct Record {
    /// 0 when idle, else `(call sequence << 32) | (fd + 1)`: every call stores a new value,
    /// so a closer waiting for one call never mistakes the thread's next call for it.
    word: AtomicU64,
    claimed: AtomicBool,
}

static RECORD_TABLE: [Record; RECORDS] = [const {
    Record {
        word: AtomicU64::new(0),
        claimed: AtomicBool::new(false),
    }
}; RECORDS];
/// Records claimed; a closer that finds only its own skips the membarrier.
static CLAIMED: AtomicUsize = AtomicUsize::new(0);
/// Set when this process could not register for expedited membarriers.
static READERS_FENCE: AtomicBool = AtomicBool::new(false);

const NO_RECORD: u32 = u32::MAX;
/// `RECORDS` when all were taken: this thread uses the slot lock.
const NONE_FREE: u32 = RECORDS as u32;

thread_local! {
    /// This thread's record index (NO_RECORD until its first call) and call sequence.
    static MINE: Cell<(u32, u32)> = const { Cell::new((NO_RECORD, 0)) };
    /// Gives the record back when the thread ends.
    static RELEASE: ReleaseAtExit = const { ReleaseAtExit };
}

struct ReleaseAtExit;

impl Drop for ReleaseAtExit {
    fn drop(&mut self) {
        if let Ok((index, _)) = MINE.try_with(Cell::get) {
            if (index as usize) < RECORDS {
                let r = &RECORD_TABLE[index as usize];
                r.word.store(0, Release);
                r.claimed.store(false, Release);
                CLAIMED.fetch_sub(1, SeqCst);
                let _ = MINE.try_with(|m| m.set((NONE_FREE, 0)));
            }
        }
    }
}

/// Registers the process for expedited membarriers (at load, and in a fork child, whose
/// new address space starts unregistered); readers fence themselves if that fails.
pub(crate) fn register_process() {
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    // SAFETY: membarrier(2) with a command and zero flags touches no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
        )
    };
    READERS_FENCE.store(rc != 0, SeqCst);
}

/// In a fork child: the parent's other threads are gone, and so is any call they were in.
pub(crate) fn after_fork_in_child() {
    let mine = MINE.with(Cell::get).0 as usize;
    let mut count = 0;
    for (i, r) in RECORD_TABLE.iter().enumerate() {
        if i == mine {
            count += 1;
        } else {
            r.word.store(0, Relaxed);
            r.claimed.store(false, Relaxed);
        }
    }
    CLAIMED.store(count, SeqCst);
    register_process();
}

/// This thread's record, claimed on its first call; None if all are taken.
#[inline]
fn my_record() -> Option<(&'static Record, u32)> {
    // One thread-local access: in a shared library each is a call to __tls_get_addr.
    let (index, seq) = MINE.with(|m| {
        let (index, seq) = m.get();
        let seq = seq.wrapping_add(1);
        if (index as usize) < RECORDS {
            m.set((index, seq));
        }
        (index, seq)
    });
    if (index as usize) < RECORDS {
        return Some((&RECORD_TABLE[index as usize], seq));
    }
    if index == NO_RECORD {
        claim();
        return my_record();
    }
    None
}

#[cold]
fn claim() {
    let found = RECORD_TABLE.iter().position(|r| {
        r.claimed
            .compare_exchange(false, true, AcqRel, Relaxed)
            .is_ok()
    });
    match found {
        Some(i) => {
            CLAIMED.fetch_add(1, SeqCst);
            // Pairs with the closer's fence: either it counts this thread, or this thread's
            // first load of an entry sees the closer's unpublish.
            fence(SeqCst);
            MINE.with(|m| m.set((i as u32, 0)));
            RELEASE.with(|_| ());
        }
        None => MINE.with(|m| m.set((NONE_FREE, 0))),
    }
}

/// A call in progress on `fd` in this thread's record; idle again when dropped (also when
/// the call unwinds, so a caught panic never leaves a closer waiting).
pub(crate) struct Hazard(&'static Record);

impl Hazard {
    /// Announces a call on `fd`; None means: use the slot lock (no record, or nested).
    #[inline]
    pub(crate) fn enter(fd: i32) -> Option<Hazard> {
        let (record, seq) = my_record()?;
        if record.word.load(Relaxed) != 0 {
            return None;
        }
        record
            .word
            .store((u64::from(seq) << 32) | u64::from(fd as u32 + 1), Relaxed);
        if READERS_FENCE.load(Relaxed) {
            fence(SeqCst);
        } else {
            // The closer's membarrier stands in for a fence here; only the compiler must
            // not move the entry's load above the store.
            compiler_fence(SeqCst);
        }
        Some(Hazard(record))
    }
}

impl Drop for Hazard {
    #[inline]
    fn drop(&mut self) {
        self.0.word.store(0, Release);
    }
}

/// After `fd`'s entry was unpublished: returns once no other thread can still be using it.
pub(crate) fn wait_for_readers(fd: i32) {
    for_each_reader(fd, |r, seen| {
        while r.word.load(Acquire) == seen {
            std::thread::yield_now();
        }
    });
}

/// After `fd`'s entry was unpublished: true if another thread may still be using it.
pub(crate) fn has_readers(fd: i32) -> bool {
    let mut found = false;
    for_each_reader(fd, |_, _| found = true);
    found
}

/// Calls `f` with each other thread's record that names `fd`, and the value seen there.
fn for_each_reader(fd: i32, mut f: impl FnMut(&Record, u64)) {
    fence(SeqCst);
    let mine = MINE.try_with(Cell::get).map_or(NO_RECORD, |m| m.0) as usize;
    let others = CLAIMED.load(SeqCst) - usize::from(mine < RECORDS);
    if others == 0 {
        return;
    }
    if !READERS_FENCE.load(Relaxed) {
        const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        // SAFETY: membarrier(2) with a command and zero flags touches no memory of ours.
        let rc =
            unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
        // It fails only for a process that is not registered, and then READERS_FENCE is set.
        debug_assert_eq!(rc, 0, "membarrier refused after registration");
    }
    let fd_tag = u64::from(fd as u32 + 1);
    for (i, r) in RECORD_TABLE.iter().enumerate() {
        if i == mine || !r.claimed.load(Acquire) {
            continue;
        }
        let seen = r.word.load(Acquire);
        if seen & 0xffff_ffff == fd_tag {
            f(r, seen);
        }
    }
}
