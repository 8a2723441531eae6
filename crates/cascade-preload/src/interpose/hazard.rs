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

use cascade_store::LockHolder;
use std::marker::PhantomData;
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
    /// The claiming thread's store lock holder value (`LockHolder`), 0 until its first
    /// write: the write path's lock then needs no thread-local of its own. Only that
    /// thread reads or writes it.
    holder: AtomicU64,
}

static RECORD_TABLE: [Record; RECORDS] = [const {
    Record {
        word: AtomicU64::new(0),
        claimed: AtomicBool::new(false),
        holder: AtomicU64::new(0),
    }
}; RECORDS];
/// Records claimed; a closer that finds only its own skips the membarrier.
static CLAIMED: AtomicUsize = AtomicUsize::new(0);
/// Set when this process could not register for expedited membarriers.
static READERS_FENCE: AtomicBool = AtomicBool::new(false);

super::thread_word::thread_word! {
    /// This thread's record and call sequence: `(sequence << 32) | tag`, the tag 0 before
    /// the thread's first call, `index + 1` while it holds record `index`, [`NONE_FREE`]
    /// when it has none. Read on every call: an initial-exec TLS word, two loads where a
    /// `thread_local!` in a shared library is a call to `__tls_get_addr`.
    struct Mine = "cascade_preload_hazard_mine";
}

/// The tag of a thread that found every record taken, or gave its record back at exit: it
/// uses the slot lock.
const NONE_FREE: u32 = RECORDS as u32 + 1;

/// This thread's record index (`RECORDS` or more for none) and call sequence.
#[inline]
fn mine() -> (usize, u32) {
    decode(Mine::get())
}

/// A [`Mine`] word's record index (`RECORDS` or more for none) and call sequence.
#[inline]
fn decode(word: u64) -> (usize, u32) {
    ((word as u32).wrapping_sub(1) as usize, (word >> 32) as u32)
}

thread_local! {
    /// Gives the record back when the thread ends.
    static RELEASE: ReleaseAtExit = const { ReleaseAtExit };
}

struct ReleaseAtExit;

impl Drop for ReleaseAtExit {
    fn drop(&mut self) {
        let (index, _) = mine();
        if index < RECORDS {
            let r = &RECORD_TABLE[index];
            r.word.store(0, Release);
            r.claimed.store(false, Release);
            CLAIMED.fetch_sub(1, SeqCst);
            // Calls from later TLS destructors of this thread use the slot lock.
            Mine::set(u64::from(NONE_FREE));
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
    let (mine, _) = mine();
    let mut count = 0;
    for (i, r) in RECORD_TABLE.iter().enumerate() {
        if i == mine {
            count += 1;
            // This thread's (pid, tid) are the child's now.
            r.holder.store(0, Relaxed);
        } else {
            r.word.store(0, Relaxed);
            r.claimed.store(false, Relaxed);
        }
    }
    CLAIMED.store(count, SeqCst);
    register_process();
}

/// This thread's record and the sequence number of this call, the record claimed on the
/// thread's first call; None if all are taken.
#[inline]
fn my_record() -> Option<(&'static Record, u32)> {
    let word = Mine::get();
    let (index, _) = decode(word);
    if index < RECORDS {
        let word = word.wrapping_add(1 << 32);
        Mine::set(word);
        return Some((&RECORD_TABLE[index], decode(word).1));
    }
    if word as u32 == 0 {
        return claim();
    }
    None
}

#[cold]
#[inline(never)]
fn claim() -> Option<(&'static Record, u32)> {
    // Registers the record's release at thread exit first: in a thread whose TLS
    // destructors already ran nothing would give a record back.
    if RELEASE.try_with(|_| ()).is_err() {
        Mine::set(u64::from(NONE_FREE));
        return None;
    }
    let found = RECORD_TABLE.iter().position(|r| {
        r.claimed
            .compare_exchange(false, true, AcqRel, Relaxed)
            .is_ok()
    });
    let Some(i) = found else {
        Mine::set(u64::from(NONE_FREE));
        return None;
    };
    RECORD_TABLE[i].holder.store(0, Relaxed);
    CLAIMED.fetch_add(1, SeqCst);
    // Pairs with the closer's fence: either it counts this thread, or this thread's first
    // load of an entry sees the closer's unpublish.
    fence(SeqCst);
    Mine::set(i as u64 + 1);
    Some((&RECORD_TABLE[i], 0))
}

/// A call in progress on `fd` in this thread's record; idle again when dropped (also when
/// the call unwinds, so a caught panic never leaves a closer waiting). Not `Send`: it
/// stands for the thread whose record it is.
pub(crate) struct Hazard(&'static Record, PhantomData<*const ()>);

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
        Some(Hazard(record, PhantomData))
    }

    /// The calling thread's store lock holder value, kept in its record.
    #[inline]
    pub(crate) fn holder(&self) -> LockHolder {
        let raw = self.0.holder.load(Relaxed);
        if raw == 0 {
            return self.holder_first();
        }
        // SAFETY: the record is this thread's (a hazard exists only in the thread that
        // entered it); the value was this thread's, set below since it claimed the record
        // and cleared in a fork child.
        unsafe { LockHolder::from_raw(raw) }
    }

    #[cold]
    fn holder_first(&self) -> LockHolder {
        let holder = LockHolder::this_thread();
        self.0.holder.store(holder.to_raw(), Relaxed);
        holder
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
    let (mine, _) = mine();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// `n` threads, all inside a call at once (on fds 0..n): each reports the record it got
    /// (None: the slot lock) and whether a call nested in its call got one too, and checks
    /// the lock holder value its record gives.
    fn all_inside_at_once(n: usize) -> Vec<(Option<usize>, bool)> {
        let inside = Arc::new(Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|fd| {
                let inside = inside.clone();
                std::thread::spawn(move || {
                    let hazard = Hazard::enter(fd as i32);
                    let index = hazard.as_ref().map(|h| {
                        (h.0 as *const Record as usize - RECORD_TABLE.as_ptr() as usize)
                            / std::mem::size_of::<Record>()
                    });
                    let nested = Hazard::enter(fd as i32).is_some();
                    if let Some(h) = &hazard {
                        // A reused record must not give the last thread's value.
                        assert_eq!(h.holder(), LockHolder::this_thread());
                    }
                    inside.wait();
                    (index, nested)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Records are claimed per thread on its first call, given back when it ends (its TLS
    /// destructor), and claimed again by later threads; a thread beyond them, and a nested
    /// call, get none. Each call stores a value of its own in the record (a closer waiting
    /// for one call must not take the next for it), and the record is idle between calls.
    /// One test: no other test of this crate may hold records meanwhile.
    #[test]
    fn records_go_to_threads_and_come_back_when_they_end() {
        std::thread::spawn(|| {
            let first = Hazard::enter(5).expect("a record");
            let record = first.0;
            let a = record.word.load(Relaxed);
            drop(first);
            assert_eq!(record.word.load(Relaxed), 0, "busy after the call");
            let second = Hazard::enter(5).expect("a record");
            let b = second.0.word.load(Relaxed);
            assert!(std::ptr::eq(record, second.0), "another record");
            assert_eq!((a & 0xffff_ffff, b & 0xffff_ffff), (6, 6));
            assert_ne!(a, b, "two calls stored the same value");
            let parent = second.holder();
            assert_eq!(parent, LockHolder::this_thread());
            drop(second);
            // SAFETY: fork in a test; the child compares and _exits.
            let child = unsafe { libc::fork() };
            assert!(child >= 0);
            if child == 0 {
                // The child's thread keeps the record, and must not keep the parent's
                // value in it.
                let ok = std::panic::catch_unwind(|| {
                    let h = Hazard::enter(5).expect("the record, kept over fork");
                    let r = h.0.holder.load(Relaxed);
                    r == 0 || r != parent.to_raw()
                });
                // SAFETY: leave without running the test harness's exit handlers.
                unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            assert_eq!(
                status, 0,
                "the fork child's record kept the parent's holder"
            );
        })
        .join()
        .unwrap();
        for round in 0..3 {
            assert_eq!(CLAIMED.load(SeqCst), 0, "round {round}: claims left");
            let got = all_inside_at_once(RECORDS + 8);
            let mut indices: Vec<usize> = got.iter().filter_map(|g| g.0).collect();
            assert_eq!(
                indices.len(),
                RECORDS,
                "round {round}: records held by the threads inside at once (fewer: ended threads kept theirs)"
            );
            indices.sort_unstable();
            indices.dedup();
            assert_eq!(
                indices.len(),
                RECORDS,
                "round {round}: one record held twice"
            );
            assert!(
                got.iter().all(|&(_, nested)| !nested),
                "round {round}: a nested call got a record"
            );
        }
        assert_eq!(CLAIMED.load(SeqCst), 0, "claims left at the end");
    }
}
