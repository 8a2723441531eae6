//! Robust, process-shared mutexes living inside the shared-memory block.
//!
//! A process killed -9 while holding one does not wedge the others: a waiter that finds the
//! holder gone takes the lock over and gets `recovered() == true`; the caller must repair
//! the state the lock protects and call [`LockGuard::mark_consistent`] before unlocking, or
//! the mutex becomes unusable (ENOTRECOVERABLE).
//!
//! Our own lock rather than a robust `pthread_mutex_t`: glibc's robust mutex keeps each held
//! mutex on the thread's robust list, which is a third of a 64-byte write through the
//! interposition library (docs/store-layout.md, "Locks"). Here locking is one
//! compare-and-swap and unlocking one swap. The word names the holder as (pid, tid); the
//! kernel does not release it at the holder's death, so a waiter that has slept
//! [`DEAD_CHECK_EVERY`] without being woken looks the holder up in /proc.

use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{
    fence, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::time::Duration;

/// One lock word, padded to a cache line.
#[repr(C, align(64))]
pub(crate) struct ShmMutex {
    /// 0 free; else the holder, `pid << 32 | tid`, with [`WAITERS`] set when someone may
    /// sleep on it; [`NOT_RECOVERABLE`] after a holder died and its repair did not finish.
    word: AtomicU64,
    /// Unused since format 6 (the namespace's sequences moved to their own cache lines in
    /// the header: [`SeqLine`]); zero.
    spare: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<ShmMutex>() == 64);

/// Set in the word while a waiter may sleep on it: the unlocker must wake one.
const WAITERS: u64 = 1 << 31;
const NOT_RECOVERABLE: u64 = u64::MAX;
/// Spins before sleeping: store locks are held for a copy of at most a chunk.
const SPINS: u32 = 200;
/// How long a waiter sleeps before it checks that the holder is still alive.
pub(crate) const DEAD_CHECK_EVERY: Duration = Duration::from_millis(50);

/// Bumped in every fork child, whose threads' cached (pid, tid) are stale.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's lock word (pid << 32 | tid) and the fork generation it was read in.
    static HOLDER: Cell<(u64, u32)> = const { Cell::new((0, u32::MAX)) };
}

extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Relaxed);
}

/// This thread's holder value, cached (gettid is a system call).
#[inline]
fn me() -> u64 {
    let generation = FORK_GENERATION.load(Relaxed);
    let (value, seen) = HOLDER.with(Cell::get);
    if seen == generation {
        return value;
    }
    me_uncached(generation)
}

#[cold]
fn me_uncached(generation: u32) -> u64 {
    // 0: the fork handler is not registered, 1: being registered, 2: registered. No
    // `Once`: a fork while another thread runs one would leave the child waiting on it.
    static REGISTERED: AtomicU32 = AtomicU32::new(0);
    if REGISTERED.compare_exchange(0, 1, Relaxed, Relaxed).is_ok() {
        // SAFETY: registering a plain function as a fork child handler.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        REGISTERED.store(2, Release);
    }
    // SAFETY: getpid and gettid take no arguments.
    let (pid, tid) = unsafe { (libc::getpid() as u64, libc::gettid() as u64) };
    debug_assert!(tid < WAITERS, "thread id {tid} does not fit the lock word");
    let value = pid << 32 | tid;
    // Cached only once the handler that makes a fork child drop the cache is in place.
    if REGISTERED.load(Acquire) == 2 {
        HOLDER.with(|h| h.set((value, generation)));
    }
    value
}

/// True unless /proc says thread `tid` of process `pid` is gone (or a zombie). Without a
/// readable /proc nobody is declared dead: a lost holder then wedges its lock, as before
/// robust mutexes.
fn holder_alive(word: u64) -> bool {
    let (pid, tid) = (word >> 32, word & (WAITERS - 1));
    match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|at| stat[at + 1..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => std::fs::metadata("/proc/self/stat").is_err(),
    }
}

impl ShmMutex {
    /// Initialises the mutex in place. Only the creator of a block calls this, before any other
    /// process can see the block.
    pub(crate) fn init(&self) -> Result<()> {
        self.spare.store(0, Release);
        self.word.store(0, Release);
        Ok(())
    }

    #[inline]
    pub(crate) fn lock(&self) -> Result<LockGuard<'_>> {
        let me = me();
        if self.word.compare_exchange(0, me, Acquire, Relaxed).is_ok() {
            return Ok(LockGuard {
                mutex: self,
                recovered: false,
            });
        }
        self.lock_contended(me)
    }

    #[cold]
    fn lock_contended(&self, me: u64) -> Result<LockGuard<'_>> {
        let held = |recovered| {
            Ok(LockGuard {
                mutex: self,
                recovered,
            })
        };
        for _ in 0..SPINS {
            std::hint::spin_loop();
            if self.word.load(Relaxed) == 0
                && self.word.compare_exchange(0, me, Acquire, Relaxed).is_ok()
            {
                return held(false);
            }
        }
        // From here on this thread may have slept: it takes the lock with WAITERS set, as
        // others may still sleep on it.
        let mut slept_unwoken = false;
        loop {
            let seen = self.word.load(Relaxed);
            if seen == NOT_RECOVERABLE {
                return Err(Error::new(
                    libc::ENOTRECOVERABLE,
                    "a store lock was left unrecoverable by a failed repair; run `cascade fsck --repair`",
                ));
            }
            if seen == 0 {
                if self
                    .word
                    .compare_exchange(0, me | WAITERS, Acquire, Relaxed)
                    .is_ok()
                {
                    return held(false);
                }
                continue;
            }
            if slept_unwoken && !holder_alive(seen) {
                if self
                    .word
                    .compare_exchange(seen, me | WAITERS, Acquire, Relaxed)
                    .is_ok()
                {
                    return held(true);
                }
                continue;
            }
            if seen & WAITERS == 0
                && self
                    .word
                    .compare_exchange(seen, seen | WAITERS, Relaxed, Relaxed)
                    .is_err()
            {
                continue;
            }
            slept_unwoken = self.sleep_while((seen | WAITERS) as u32);
        }
    }

    /// Sleeps while the word's low half is `expected`; true if the sleep timed out.
    fn sleep_while(&self, expected: u32) -> bool {
        let ts = libc::timespec {
            tv_sec: DEAD_CHECK_EVERY.as_secs() as libc::time_t,
            tv_nsec: DEAD_CHECK_EVERY.subsec_nanos() as libc::c_long,
        };
        // SAFETY: futex(2) on the word's low half (little-endian: its first four bytes), a
        // live, aligned u32 in a MAP_SHARED mapping, shared between processes (no
        // FUTEX_PRIVATE_FLAG); the kernel only reads it and the timespec.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr().cast::<u32>(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
            )
        };
        rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
    }

    fn wake(&self, waiters: i32) {
        // SAFETY: futex(2) wake on the word's low half (see `sleep_while`).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr().cast::<u32>(),
                libc::FUTEX_WAKE,
                waiters,
            )
        };
    }
}

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the futex is the lock word's low half"
);

/// Holds a [`ShmMutex`]; unlocks on drop.
pub(crate) struct LockGuard<'a> {
    mutex: &'a ShmMutex,
    recovered: bool,
}

impl LockGuard<'_> {
    /// True when the previous holder died holding the lock: the protected state may be
    /// half-updated and must be repaired before [`Self::mark_consistent`].
    pub(crate) fn recovered(&self) -> bool {
        self.recovered
    }

    pub(crate) fn mark_consistent(&mut self) {
        self.recovered = false;
    }
}

impl Drop for LockGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // A repair that did not finish leaves the lock unusable, which later lockers report.
        if self.recovered {
            self.mutex.word.store(NOT_RECOVERABLE, Release);
            self.mutex.wake(i32::MAX);
        } else if self.mutex.word.swap(0, Release) & WAITERS != 0 {
            self.mutex.wake(1);
        }
    }
}

/// A seqlock sequence on a cache line of its own (readers load it on every lock-free read;
/// sharing the line of a lock word that others compare-and-swap would make each of those
/// loads a miss). Only holders of the lock that guards what it covers write it: odd while
/// a holder may change that, even otherwise. A holder that died leaves it odd; the next
/// one steps past it ([`Self::begin_write`]).
#[repr(C, align(64))]
pub(crate) struct SeqLine {
    pub seq: AtomicU64,
    _spare: [u64; 7],
}

const _: () = assert!(std::mem::size_of::<SeqLine>() == 64);

/// Makes `seq` odd before a change lock-free readers must not trust (lock held).
#[inline]
pub(crate) fn begin_write(seq: &AtomicU64) {
    // Odd already when a holder died meanwhile: step past it to the next odd value, so a
    // reader that started before still sees a change.
    let s = seq.load(Relaxed);
    seq.store((s | 1) + 2 * (s & 1), Relaxed);
    fence(Release);
}

/// Makes `seq` even again after the change (lock held).
#[inline]
pub(crate) fn end_write(seq: &AtomicU64) {
    let s = seq.load(Relaxed);
    seq.store((s | 1) + 1, Release);
}

/// The sequence before a lock-free read, None while a holder is changing what it covers.
#[inline]
pub(crate) fn read_begin(seq: &AtomicU64) -> Option<u64> {
    let s = seq.load(Acquire);
    (s & 1 == 0).then_some(s)
}

/// True if no holder changed what `seq` covers since [`read_begin`] returned `before`
/// (call after [`fence`]`(Acquire)`, which orders the reads before it).
#[inline]
pub(crate) fn unchanged_since(seq: &AtomicU64, before: u64) -> bool {
    seq.load(Relaxed) == before
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A mutex in a MAP_SHARED anonymous mapping, as in a block: shared with fork children.
    struct Shared(*mut ShmMutex, *mut u64);

    impl Shared {
        fn new() -> Shared {
            // SAFETY: a fresh anonymous shared mapping of one page, zeroed by the kernel.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: the page holds the 64-byte mutex, then a counter at byte 64.
            unsafe { Shared(p.cast(), p.cast::<u8>().add(64).cast()) }
        }
        fn mutex(&self) -> &ShmMutex {
            // SAFETY: the mapping lives for the test (never unmapped).
            unsafe { &*self.0 }
        }
        /// A counter only ever changed under the mutex (plain loads and stores).
        fn bump(&self) {
            // SAFETY: callers hold the mutex; volatile so that the compiler keeps both.
            unsafe { self.1.write_volatile(self.1.read_volatile() + 1) }
        }
        fn count(&self) -> u64 {
            // SAFETY: as above.
            unsafe { self.1.read_volatile() }
        }
    }
    // SAFETY: the pointers name shared memory that outlives the threads using it.
    unsafe impl Send for Shared {}
    // SAFETY: as above; the counter is only touched under the mutex.
    unsafe impl Sync for Shared {}

    #[test]
    fn threads_and_processes_exclude_each_other() {
        let s = Arc::new(Shared::new());
        s.mutex().init().unwrap();
        const EACH: u64 = 20_000;
        // SAFETY: fork in a test; the child only locks, bumps and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            for _ in 0..EACH {
                let _g = s.mutex().lock().unwrap();
                s.bump();
            }
            // SAFETY: leave without running the test harness's exit handlers.
            unsafe { libc::_exit(0) };
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        let _g = s.mutex().lock().unwrap();
                        s.bump();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert_eq!(status, 0);
        assert_eq!(s.count(), 4 * EACH, "a lost update: two holders at once");
        assert_eq!(s.mutex().word.load(Relaxed), 0, "left held");
    }

    #[test]
    fn a_holder_killed_is_recovered_and_an_unfinished_repair_is_reported() {
        let s = Shared::new();
        s.mutex().init().unwrap();
        crate::tests::killed_after(|| std::mem::forget(s.mutex().lock().unwrap()));
        let g = s.mutex().lock().unwrap();
        assert!(
            g.recovered(),
            "the dead holder's lock was not reported recovered"
        );
        drop(g); // repair "failed": not marked consistent
        let e = s
            .mutex()
            .lock()
            .err()
            .expect("an unrecoverable lock was handed out");
        assert_eq!(e.errno(), libc::ENOTRECOVERABLE);
        s.mutex().init().unwrap();
        let mut g = s.mutex().lock().unwrap();
        assert!(!g.recovered());
        g.mark_consistent();
    }

    #[test]
    fn a_live_holder_is_not_taken_over() {
        let s = Arc::new(Shared::new());
        s.mutex().init().unwrap();
        let g = s.mutex().lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                let g = s.mutex().lock().unwrap();
                tx.send(g.recovered()).unwrap();
            })
        };
        // The waiter checks the holder after each DEAD_CHECK_EVERY it sleeps unwoken; three
        // of them pass without it taking the lock from this live thread.
        assert!(
            rx.recv_timeout(DEAD_CHECK_EVERY * 3).is_err(),
            "a live holder's lock was taken"
        );
        drop(g);
        assert!(
            !rx.recv().unwrap(),
            "a normal hand-over reported as a recovery"
        );
        waiter.join().unwrap();
    }
}
