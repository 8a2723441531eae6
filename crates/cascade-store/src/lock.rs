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
//!
//! **Biased file locks.** A file's lock ([`ShmMutex::lock_biased_as`]) is nearly always taken
//! by one thread only: the rank writing its checkpoint. Its first holder keeps the lock word
//! for good and from then on enters with plain loads and stores of `bias` and `busy`, no
//! atomic read-modify-write (two of them were a third of a 64-byte write). Another thread
//! that wants the lock *revokes* the bias: it marks `bias` as being revoked, runs
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` — a full memory barrier on every CPU
//! running a thread of a process that registered for it, which every bias holder did before
//! taking a bias — then waits for `busy` to be 0 and takes the word over. The barrier stands
//! in for the store-load fence the owner leaves out between "busy = 1" and re-reading
//! `bias` (an asymmetric Dekker handshake), so either the owner sees the revocation and
//! backs off, or the revoker sees it busy and waits. A lock revoked from a live owner stays
//! unbiased until its inode is reused (two live writers would otherwise revoke each other
//! at every turn); one revoked from a dead owner is fresh again, so the next run of a job
//! that rewrites its files gets the fast path back. Where membarrier is not available
//! nobody takes a bias.

use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{
    compiler_fence, fence, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::time::Duration;

/// One lock word, padded to a cache line.
#[repr(C, align(64))]
pub(crate) struct ShmMutex {
    /// 0 free; else the holder, `pid << 32 | tid`, with [`WAITERS`] set when someone may
    /// sleep on it; [`NOT_RECOVERABLE`] after a holder died and its repair did not finish.
    /// A biased lock's owner holds it for as long as the bias lasts.
    word: AtomicU64,
    /// [`UNBIASED`] (never biased, or the last owner's bias ended with its death), the bias
    /// owner's holder value, a revoker's holder value with [`REVOKING`] set, or [`REVOKED`].
    /// Always [`UNBIASED`] in the namespace and allocator locks.
    bias: AtomicU64,
    /// 1 while the bias owner is inside the lock (only the owner writes it while the bias
    /// lasts); revokers sleep on it.
    busy: AtomicU32,
    /// A word for holders of the lock to keep a hint in (file locks: the chunk last
    /// written, see `Block::write_locked`). Read and written only under the lock; whoever
    /// uses it checks it first, so a stale hint costs nothing but the check.
    pub hint: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<ShmMutex>() == 64);
const _: () = assert!(std::mem::offset_of!(ShmMutex, bias) == 8);
const _: () = assert!(std::mem::offset_of!(ShmMutex, busy) == 16);
const _: () = assert!(std::mem::offset_of!(ShmMutex, hint) == 24);

/// Set in the word while a waiter may sleep on it: the unlocker must wake one.
const WAITERS: u64 = 1 << 31;
const NOT_RECOVERABLE: u64 = u64::MAX;
/// `bias`: nobody holds a bias on this lock, and none was revoked from a live owner.
const UNBIASED: u64 = 0;
/// `bias`: a live owner's bias was revoked; the lock is an ordinary one until its inode is
/// reused.
const REVOKED: u64 = u64::MAX;
/// Set in `bias` (with the revoker's holder value) while a revocation is under way.
const REVOKING: u64 = WAITERS;
/// Spins before sleeping: store locks are held for a copy of at most a chunk.
const SPINS: u32 = 200;
/// How long a waiter sleeps before it checks that the holder is still alive.
pub(crate) const DEAD_CHECK_EVERY: Duration = Duration::from_millis(50);

thread_local! {
    /// This thread's lock word (pid << 32 | tid), 0 until cached. A fork child's only
    /// thread is the one that forked, and the fork handler clears its copy there: the
    /// child's (pid, tid) differ from the parent's.
    static HOLDER: Cell<u64> = const { Cell::new(0) };
}

extern "C" fn after_fork_in_child() {
    let _ = HOLDER.try_with(|h| h.set(0));
    // A fork child's memory map is new and not registered for membarrier.
    MEMBARRIER.store(MEMBARRIER_UNKNOWN, Relaxed);
}

/// This thread's holder value, cached (gettid is a system call).
#[inline]
pub(crate) fn me() -> u64 {
    let value = HOLDER.try_with(Cell::get).unwrap_or(0);
    if value != 0 {
        return value;
    }
    me_uncached()
}

#[cold]
fn me_uncached() -> u64 {
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
    // Cached only once the handler that clears a fork child's cache is in place.
    if REGISTERED.load(Acquire) == 2 {
        let _ = HOLDER.try_with(|h| h.set(value));
    }
    value
}

/// The value that names a thread in a lock word (`pid << 32 | tid`). The interposition
/// library keeps it with the thread's hazard record and passes it to
/// [`crate::File::write_advancing_as`], so that a write reads one per-thread word, not two
/// (a `thread_local!` in a shared library is a call to `__tls_get_addr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockHolder(u64);

impl LockHolder {
    /// The calling thread's.
    #[inline]
    pub fn this_thread() -> LockHolder {
        LockHolder(me())
    }

    /// The value, never 0.
    #[inline]
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// # Safety
    /// `raw` is what [`Self::to_raw`] returned for [`Self::this_thread`] in the calling
    /// thread of the calling process (a fork child's value differs from its parent's):
    /// another thread's value would let two threads hold one lock.
    #[inline]
    pub unsafe fn from_raw(raw: u64) -> LockHolder {
        debug_assert_eq!(raw, me(), "another thread's lock holder value");
        LockHolder(raw)
    }
}

// membarrier(2) commands (linux/membarrier.h; not in the libc crate).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_long = 2;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 4;

/// Whether this process may hold biases: registered for `MEMBARRIER_CMD_GLOBAL_EXPEDITED`.
static MEMBARRIER: AtomicU32 = AtomicU32::new(MEMBARRIER_UNKNOWN);
const MEMBARRIER_UNKNOWN: u32 = 0;
const MEMBARRIER_REGISTERED: u32 = 1;
const MEMBARRIER_UNAVAILABLE: u32 = 2;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier(2) with a command and flags 0 reads and writes no user memory.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Registers this process for expedited global barriers once (a bias holder must be
/// reached by a revoker's barrier); false where the kernel or a seccomp filter refuses.
#[inline]
fn may_hold_bias() -> bool {
    match MEMBARRIER.load(Relaxed) {
        MEMBARRIER_REGISTERED => true,
        MEMBARRIER_UNAVAILABLE => false,
        _ => register_for_membarrier(),
    }
}

#[cold]
fn register_for_membarrier() -> bool {
    let wanted =
        1 << MEMBARRIER_CMD_GLOBAL_EXPEDITED | 1 << MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    let supported = membarrier(MEMBARRIER_CMD_QUERY);
    let ok = supported >= 0
        && supported & wanted == wanted
        && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
    let state = if ok {
        MEMBARRIER_REGISTERED
    } else {
        MEMBARRIER_UNAVAILABLE
    };
    MEMBARRIER.store(state, Relaxed);
    ok
}

/// A full barrier on every CPU running a thread of a registered process, so that a bias
/// owner's "busy = 1" is visible to us and our revocation mark to it.
fn barrier_on_every_bias_holder() -> Result<()> {
    if membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 || membarrier(MEMBARRIER_CMD_GLOBAL) == 0 {
        return Ok(());
    }
    Err(Error::new(
        libc::ENOLCK,
        "a store file lock is biased to another thread and membarrier(2) is refused here, so it cannot be taken over; run Cascade's processes of one store under the same seccomp policy",
    ))
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

/// A holder value with [`WAITERS`] cleared.
fn holder_of(word: u64) -> u64 {
    word & !WAITERS
}

impl ShmMutex {
    /// Initialises the mutex in place, unbiased. Only the creator of a block (or of an
    /// inode, under the namespace lock) calls this, before any other thread can lock it.
    pub(crate) fn init(&self) -> Result<()> {
        self.hint.store(0, Release);
        self.busy.store(0, Release);
        self.bias.store(UNBIASED, Release);
        self.word.store(0, Release);
        Ok(())
    }

    /// Takes the lock; never biases it (the namespace and allocator locks, which every
    /// process takes).
    #[inline]
    pub(crate) fn lock(&self) -> Result<LockGuard<'_>> {
        let me = me();
        if self.word.compare_exchange(0, me, Acquire, Relaxed).is_ok() {
            return Ok(self.guard(me, Held::Word, false));
        }
        self.lock_contended(me)
    }

    /// [`Self::lock_biased_as`] by the calling thread (the store's callers go through
    /// `Block::lock_inode`).
    #[cfg(test)]
    pub(crate) fn lock_biased(&self) -> Result<LockGuard<'_>> {
        self.lock_biased_as(LockHolder::this_thread())
    }

    /// Takes a file's lock as the thread `me` names: with plain loads and stores while that
    /// thread holds the lock's bias, which the first locker of a fresh lock takes (module
    /// docs).
    #[inline(always)]
    pub(crate) fn lock_biased_as(&self, me: LockHolder) -> Result<LockGuard<'_>> {
        if let Some(guard) = self.enter_bias(me) {
            return Ok(guard);
        }
        let me = me.0;
        if self.word.compare_exchange(0, me, Acquire, Relaxed).is_ok() {
            if self.bias.load(Relaxed) == UNBIASED && may_hold_bias() {
                // Busy before the bias is published: a revoker that sees the bias waits.
                self.busy.store(1, Relaxed);
                self.bias.store(me, Release);
                return Ok(self.guard(me, Held::Bias, false));
            }
            return Ok(self.guard(me, Held::Word, false));
        }
        self.lock_contended(me)
    }

    /// The lock, if the thread `me` names holds its bias and no revoker is marking it: the
    /// usual case of a file's writer, without an atomic read-modify-write. None having
    /// changed nothing: [`Self::lock_biased_as`] then takes the lock as usual.
    #[inline(always)]
    pub(crate) fn enter_bias(&self, me: LockHolder) -> Option<LockGuard<'_>> {
        self.try_enter_bias(me)
            .then(|| self.guard(me.0, Held::Bias, false))
    }

    /// [`Self::enter_bias`] without a guard: true when the thread `me` names holds the
    /// lock, which it leaves with [`Self::leave_entered_bias`]. For a caller whose work
    /// under the lock cannot panic (the guard, kept in memory across it, moved through the
    /// stack on the path of every small write).
    #[inline(always)]
    pub(crate) fn try_enter_bias(&self, me: LockHolder) -> bool {
        let me = me.0;
        // `busy` is 1 on entry only if an earlier incarnation of this (pid, tid) died inside.
        if self.bias.load(Relaxed) == me
            && self.busy.load(Relaxed) == 0
            && MEMBARRIER.load(Relaxed) == MEMBARRIER_REGISTERED
        {
            self.busy.store(1, Relaxed);
            // The store-load fence this handshake needs is the revoker's membarrier.
            compiler_fence(SeqCst);
            if self.bias.load(Acquire) == me {
                return true;
            }
            self.leave_bias(me);
        }
        false
    }

    /// Leaves the lock [`Self::try_enter_bias`] entered (what dropping the guard of
    /// [`Self::enter_bias`] does).
    #[inline(always)]
    pub(crate) fn leave_entered_bias(&self, me: LockHolder) {
        self.leave_bias(me.0);
    }

    /// True if this thread holds the lock's bias (it enters without atomic read-modify-writes).
    #[cfg(test)]
    pub(crate) fn biased_to_this_thread(&self) -> bool {
        self.bias.load(Relaxed) == me()
    }

    /// True if the lock is as [`Self::init`] left it.
    #[cfg(test)]
    pub(crate) fn is_fresh(&self) -> bool {
        self.word.load(Relaxed) == 0
            && self.bias.load(Relaxed) == UNBIASED
            && self.busy.load(Relaxed) == 0
    }

    fn guard(&self, me: u64, held: Held, recovered: bool) -> LockGuard<'_> {
        let flags = match held {
            Held::Word => 0,
            Held::Bias => BY_BIAS,
        } | if recovered { RECOVERED } else { 0 };
        LockGuard {
            mutex: self,
            me,
            flags,
        }
    }

    /// The bias owner leaves the lock (or backs off a revocation): a revoker may sleep on
    /// `busy`.
    #[inline(always)]
    fn leave_bias(&self, me: u64) {
        self.busy.store(0, Release);
        // Seeing the revoker's mark here is what its membarrier guarantees; a missed wake
        // costs it one DEAD_CHECK_EVERY, never the lock.
        if self.bias.load(Relaxed) != me {
            wake_revoker(&self.busy);
        }
    }

    #[cold]
    fn lock_contended(&self, me: u64) -> Result<LockGuard<'_>> {
        let mut spins = 0;
        // After sleeping, this thread takes the lock with WAITERS set, as others may still
        // sleep on it.
        let mut slept = false;
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
                let value = if slept { me | WAITERS } else { me };
                if self
                    .word
                    .compare_exchange(0, value, Acquire, Relaxed)
                    .is_ok()
                {
                    return Ok(self.guard(me, Held::Word, false));
                }
                continue;
            }
            let bias = self.bias.load(Acquire);
            let bias_holds_word = match bias {
                UNBIASED | REVOKED => false,
                // A revocation under way: the word is still the owner's until the revoker
                // takes it.
                b if b & REVOKING != 0 => holder_of(b) != holder_of(seen),
                owner => owner == holder_of(seen),
            };
            if bias_holds_word {
                if let Some(guard) = self.try_revoke(me, seen, bias, slept_unwoken)? {
                    return Ok(guard);
                }
            } else if holder_of(seen) == me || (slept_unwoken && !holder_alive(seen)) {
                // The holder is dead. A word naming this very thread is a dead incarnation's
                // (pid and tid reused): no thread takes a lock it holds.
                if self
                    .word
                    .compare_exchange(seen, me | WAITERS, Acquire, Relaxed)
                    .is_ok()
                {
                    if bias != UNBIASED && bias != REVOKED {
                        // A revoker that died between taking the word and finishing.
                        self.bias.store(REVOKED, Release);
                    }
                    return Ok(self.guard(me, Held::Word, true));
                }
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
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
            slept = true;
            slept_unwoken = futex_wait(self.word.as_ptr().cast(), (seen | WAITERS) as u32);
        }
    }

    /// With the word held by a bias (`seen`, `bias` as loaded): becomes the revoker if none
    /// is at work (or the one at work is dead) and takes the lock; None to wait.
    fn try_revoke(
        &self,
        me: u64,
        seen: u64,
        bias: u64,
        slept_unwoken: bool,
    ) -> Result<Option<LockGuard<'_>>> {
        if bias & REVOKING != 0 {
            let revoker = holder_of(bias);
            let revoker_gone = revoker == me || (slept_unwoken && !holder_alive(revoker));
            if !revoker_gone {
                return Ok(None);
            }
        }
        if self
            .bias
            .compare_exchange(bias, me | REVOKING, Acquire, Relaxed)
            .is_err()
        {
            return Ok(None);
        }
        self.revoke(me, holder_of(seen)).map(Some)
    }

    /// Ends `owner`'s bias (this thread marked it as revoking): waits until the owner is
    /// out of the lock, or dead inside it (then the guard says recovered), and takes the
    /// word over.
    fn revoke(&self, me: u64, owner: u64) -> Result<LockGuard<'_>> {
        // An owner that is this very thread is a dead incarnation, or this thread in a new
        // image after exec: in neither case inside the lock now, and no barrier is needed.
        if owner != me {
            if let Err(e) = barrier_on_every_bias_holder() {
                self.bias.store(owner, Release);
                return Err(e);
            }
        }
        let mut recovered = false;
        let mut spins = 0;
        while self.busy.load(Acquire) != 0 {
            if owner == me {
                recovered = true;
                break;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if futex_wait(self.busy.as_ptr(), 1) && !holder_alive(owner) {
                recovered = true;
                break;
            }
        }
        // Nobody else changes the word meanwhile but to set WAITERS, which stays set.
        self.word.swap(me | WAITERS, Acquire);
        self.busy.store(0, Relaxed);
        // A live owner would revoke in turn when it writes again, each time with a barrier
        // on every CPU, so its lock stays an ordinary one. A dead owner never comes back
        // (the usual case: the last run of a job, whose next run rewrites the file), so the
        // lock is left as fresh and the next locker takes the bias.
        let owner_gone = owner == me || recovered || !holder_alive(owner);
        self.bias
            .store(if owner_gone { UNBIASED } else { REVOKED }, Release);
        Ok(self.guard(me, Held::Word, recovered))
    }
}

/// Sleeps while `*word == expected`, at most [`DEAD_CHECK_EVERY`]; true if the sleep timed
/// out.
fn futex_wait(word: *mut u32, expected: u32) -> bool {
    let ts = libc::timespec {
        tv_sec: DEAD_CHECK_EVERY.as_secs() as libc::time_t,
        tv_nsec: DEAD_CHECK_EVERY.subsec_nanos() as libc::c_long,
    };
    // SAFETY: futex(2) on a live, aligned u32 of a lock slot in a MAP_SHARED mapping,
    // shared between processes (no FUTEX_PRIVATE_FLAG); the kernel only reads it and the
    // timespec.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes a revoker sleeping on `busy` (rare: out of line, off the path of every write).
#[cold]
#[inline(never)]
fn wake_revoker(busy: &AtomicU32) {
    futex_wake(busy.as_ptr(), i32::MAX);
}

fn futex_wake(word: *mut u32, waiters: i32) {
    // SAFETY: futex(2) wake on a u32 of a lock slot (see `futex_wait`).
    unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, waiters) };
}

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the futex is the lock word's low half"
);

/// How a guard holds its lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// By the word: unlocking clears it.
    Word,
    /// By the bias: unlocking clears `busy`; the word stays the owner's.
    Bias,
}

// A guard's flags, in one u64 rather than bools: a guard built byte by byte and then
// copied as a whole (as a `Result` is) stalls on store forwarding, a few ns per write.
/// Held by the bias ([`Held::Bias`]).
const BY_BIAS: u64 = 1;
/// The previous holder died inside ([`LockGuard::recovered`]).
const RECOVERED: u64 = 2;
/// Unlock into a fresh lock ([`LockGuard::make_fresh_on_unlock`]).
const FRESH: u64 = 4;

/// Holds a [`ShmMutex`]; unlocks on drop.
pub(crate) struct LockGuard<'a> {
    mutex: &'a ShmMutex,
    me: u64,
    /// [`BY_BIAS`], [`RECOVERED`], [`FRESH`].
    flags: u64,
}

impl LockGuard<'_> {
    /// True when the previous holder died holding the lock: the protected state may be
    /// half-updated and must be repaired before [`Self::mark_consistent`].
    pub(crate) fn recovered(&self) -> bool {
        self.flags & RECOVERED != 0
    }

    pub(crate) fn mark_consistent(&mut self) {
        self.flags &= !RECOVERED;
    }

    /// Unlocks into a lock as fresh as a new one: no bias, none revoked. For an inode freed
    /// or handed out under this guard, so that the next file there is biased to its writer
    /// and not to the last one's, and a revocation in an earlier life does not stay.
    pub(crate) fn make_fresh_on_unlock(&mut self) {
        self.flags |= FRESH;
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.unlock();
    }
}

impl LockGuard<'_> {
    /// Unlocks now. The same as dropping the guard, but inlined where the drop glue of a
    /// large caller is not: a call to it kept the guard in memory, moved through the stack
    /// three times (the path of every small write releases its guard so).
    #[inline(always)]
    pub(crate) fn release(self) {
        let mut guard = std::mem::ManuallyDrop::new(self);
        guard.unlock();
    }

    /// The common case inline (a biased holder leaving: a store, a load, a compare), the
    /// rest out of line.
    #[inline(always)]
    fn unlock(&mut self) {
        if self.flags == BY_BIAS {
            self.mutex.leave_bias(self.me);
        } else {
            self.unlock_slow();
        }
    }

    /// [`Drop`] for every guard but a plain biased one: a fresh unlock, a word-held lock, a
    /// repair that did not finish.
    #[inline(never)]
    fn unlock_slow(&mut self) {
        let mutex = self.mutex;
        let fresh = self.flags & FRESH != 0;
        if self.flags & BY_BIAS != 0 {
            // A revoker that marked the bias meanwhile gets the lock as usual instead.
            if fresh
                && mutex
                    .bias
                    .compare_exchange(self.me, UNBIASED, Relaxed, Relaxed)
                    .is_ok()
            {
                mutex.busy.store(0, Relaxed);
                if mutex.word.swap(0, Release) & WAITERS != 0 {
                    futex_wake(mutex.word.as_ptr().cast(), 1);
                }
            } else {
                mutex.leave_bias(self.me);
            }
        } else if self.recovered() {
            // A repair that did not finish leaves the lock unusable, which later lockers
            // report.
            mutex.word.store(NOT_RECOVERABLE, Release);
            futex_wake(mutex.word.as_ptr().cast(), i32::MAX);
        } else {
            if fresh {
                // Nobody else writes `bias` of an unbiased or revoked lock.
                mutex.bias.store(UNBIASED, Relaxed);
            }
            if mutex.word.swap(0, Release) & WAITERS != 0 {
                futex_wake(mutex.word.as_ptr().cast(), 1);
            }
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
        /// The same, with a pause between the load and the store that a second holder
        /// would fall into.
        fn bump_slowly(&self) {
            // SAFETY: as above.
            unsafe {
                let v = self.1.read_volatile();
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
                self.1.write_volatile(v + 1)
            }
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

    /// The holder value is cached per thread; a fork child (whose one thread is a copy of
    /// the one that forked, cache included) must name itself, or it would take the
    /// parent's locks for its own.
    #[test]
    fn a_fork_child_names_itself_not_the_thread_that_forked() {
        // SAFETY: getpid and gettid take no arguments.
        let actual = || unsafe { (libc::getpid() as u64) << 32 | libc::gettid() as u64 };
        assert_eq!(me(), actual());
        let parent = me();
        // SAFETY: fork in a test; the child compares and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // Twice: the first call fills the child's cache, the second reads it.
            let named = me() == actual() && me() == actual() && me() != parent;
            let code = if named { 0 } else { 1 };
            // SAFETY: leave without running the test harness's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert_eq!(
            status, 0,
            "the fork child used the parent thread's holder value"
        );
        assert_eq!(me(), parent, "the parent's holder value changed");
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

    /// These tests need biased locks: membarrier(2) with expedited global barriers (Linux
    /// 4.16, not refused by seccomp), as the store tests of file locks do.
    fn require_biased_locks() {
        assert!(
            may_hold_bias(),
            "membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) refused: file locks are never biased here"
        );
    }

    /// Asserts the fast path's precondition: `s`'s bias is this thread's and idle.
    fn assert_biased_to_me(s: &Shared) {
        let m = s.mutex();
        assert_eq!(m.bias.load(Relaxed), me(), "no bias taken");
        assert_eq!(
            holder_of(m.word.load(Relaxed)),
            me(),
            "the owner lost the word"
        );
        assert_eq!(m.busy.load(Relaxed), 0, "busy outside the lock");
    }

    #[test]
    fn a_biased_lock_excludes_a_revoker_in_every_round() {
        require_biased_locks();
        const ROUNDS: u64 = 2_000;
        const OWNER_EACH: u64 = 40;
        const REVOKER_EACH: u64 = 4;
        let s = Arc::new(Shared::new());
        let start = Arc::new(std::sync::Barrier::new(2));
        let revoker = {
            let (s, start) = (s.clone(), start.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    for _ in 0..REVOKER_EACH {
                        let _g = s.mutex().lock_biased().unwrap();
                        s.bump_slowly();
                    }
                    start.wait();
                }
            })
        };
        for round in 0..ROUNDS {
            s.mutex().init().unwrap();
            drop(s.mutex().lock_biased().unwrap());
            assert_biased_to_me(&s);
            let before = s.count();
            start.wait();
            // The owner keeps entering by the fast path while the other thread revokes.
            for _ in 0..OWNER_EACH {
                let _g = s.mutex().lock_biased().unwrap();
                s.bump_slowly();
            }
            start.wait();
            assert_eq!(
                s.count() - before,
                OWNER_EACH + REVOKER_EACH,
                "round {round}: a lost update, two holders at once"
            );
            assert_eq!(s.mutex().bias.load(Relaxed), REVOKED, "round {round}");
            assert_eq!(
                s.mutex().word.load(Relaxed) & !WAITERS,
                0,
                "round {round}: left held"
            );
        }
        revoker.join().unwrap();
    }

    #[test]
    fn another_process_revokes_a_bias_and_waits_for_its_owner_to_leave() {
        require_biased_locks();
        let s = Shared::new();
        s.mutex().init().unwrap();
        drop(s.mutex().lock_biased().unwrap());
        assert_biased_to_me(&s);
        let inside = s.mutex().lock_biased().unwrap();
        // SAFETY: fork in a test; the child locks, bumps and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let g = s.mutex().lock_biased().unwrap();
            // The owner bumped before it left; the child must see that bump.
            let code = if s.count() == 1 && !g.recovered() {
                0
            } else {
                1
            };
            s.bump();
            drop(g);
            // SAFETY: leave without running the test harness's exit handlers.
            unsafe { libc::_exit(code) };
        }
        // The child cannot get in while the owner is inside: it must end up asleep in
        // futex(2) (on `busy`), not finish.
        let mut status = 0;
        let mut finished = false;
        loop {
            // SAFETY: polling our own child.
            if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
                finished = true;
                break;
            }
            let syscall = std::fs::read_to_string(format!("/proc/{child}/syscall"));
            if syscall.is_ok_and(|s| s.starts_with(&format!("{} ", libc::SYS_futex))) {
                break;
            }
            std::thread::yield_now();
        }
        assert!(!finished, "the revoker got in while the owner was inside");
        assert_ne!(s.mutex().bias.load(Relaxed) & REVOKING, 0);
        s.bump();
        drop(inside);
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert_eq!(status, 0, "the revoker did not see the owner's change");
        assert_eq!(s.count(), 2);
        assert_eq!(s.mutex().bias.load(Relaxed), REVOKED);
        // An ordinary lock from now on.
        let g = s.mutex().lock_biased().unwrap();
        assert_eq!(holder_of(s.mutex().word.load(Relaxed)), me());
        drop(g);
        assert_eq!(s.mutex().word.load(Relaxed), 0);
    }

    #[test]
    fn a_bias_owner_killed_inside_is_recovered_and_outside_is_not() {
        require_biased_locks();
        let s = Shared::new();
        // Killed outside: the bias ends at once, nothing to repair.
        s.mutex().init().unwrap();
        crate::tests::killed_after(|| drop(s.mutex().lock_biased().unwrap()));
        assert_ne!(
            s.mutex().bias.load(Relaxed),
            UNBIASED,
            "the child took no bias"
        );
        let g = s.mutex().lock_biased().unwrap();
        assert!(
            !g.recovered(),
            "an idle dead owner's lock reported recovered"
        );
        drop(g);
        // A dead owner never comes back: the lock is fresh again, biased to its next user.
        assert_eq!(s.mutex().bias.load(Relaxed), UNBIASED);
        drop(s.mutex().lock_biased().unwrap());
        assert_biased_to_me(&s);
        // Killed inside (by the fast path: its second entry): recovered.
        s.mutex().init().unwrap();
        crate::tests::killed_after(|| {
            drop(s.mutex().lock_biased().unwrap());
            std::mem::forget(s.mutex().lock_biased().unwrap());
        });
        assert_eq!(s.mutex().busy.load(Relaxed), 1);
        let mut g = s.mutex().lock_biased().unwrap();
        assert!(
            g.recovered(),
            "a dead owner's half-done change not reported"
        );
        g.mark_consistent();
        drop(g);
        assert_eq!(s.mutex().word.load(Relaxed), 0);
        drop(s.mutex().lock_biased().unwrap());
        assert_biased_to_me(&s);
    }

    #[test]
    fn a_bias_whose_owner_ended_goes_to_the_next_writer_and_a_live_ones_does_not() {
        require_biased_locks();
        let s = Shared::new();
        // The owner's thread ended (as a process that wrote the file and exited).
        s.mutex().init().unwrap();
        std::thread::scope(|t| {
            // Joined, not only finished: the thread is gone from /proc.
            t.spawn(|| drop(s.mutex().lock_biased().unwrap()))
                .join()
                .unwrap();
        });
        let ended_owner = s.mutex().bias.load(Relaxed);
        assert!(
            ended_owner != UNBIASED && ended_owner != me(),
            "the thread took no bias"
        );
        drop(s.mutex().lock_biased().unwrap());
        drop(s.mutex().lock_biased().unwrap());
        assert_biased_to_me(&s);
        // The owner still runs: revoked for good, so that two writers do not revoke each
        // other at every turn.
        s.mutex().init().unwrap();
        let shared = &s;
        std::thread::scope(|t| {
            // Both ends in here: a failed assertion drops `done_tx`, which ends the owner.
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let (taken_tx, taken_rx) = std::sync::mpsc::channel();
            t.spawn(move || {
                drop(shared.mutex().lock_biased().unwrap());
                taken_tx.send(()).unwrap();
                let _ = done_rx.recv();
            });
            taken_rx.recv().unwrap();
            drop(s.mutex().lock_biased().unwrap());
            assert_eq!(s.mutex().bias.load(Relaxed), REVOKED);
            drop(s.mutex().lock_biased().unwrap());
            assert_eq!(s.mutex().bias.load(Relaxed), REVOKED);
            done_tx.send(()).unwrap();
        });
    }
}
