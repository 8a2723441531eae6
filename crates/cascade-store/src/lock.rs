//! Robust, process-shared mutexes living inside the shared-memory block.
//!
//! A process killed -9 while holding one does not wedge the others: the kernel marks the
//! mutex owner-dead and the next locker gets `EOWNERDEAD`. The guard then reports
//! `recovered() == true`; the caller must repair the state the lock protects and call
//! [`LockGuard::mark_consistent`] before unlocking, or the mutex becomes unusable.

use crate::error::{Error, Result};
use std::cell::UnsafeCell;

/// A `pthread_mutex_t` (PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST), padded to a cache line.
#[repr(C, align(64))]
pub(crate) struct ShmMutex {
    raw: UnsafeCell<libc::pthread_mutex_t>,
}

const _: () = assert!(std::mem::size_of::<ShmMutex>() == 64);

impl ShmMutex {
    /// Initialises the mutex in place. Only the creator of a block calls this, before any other
    /// process can see the block.
    pub(crate) fn init(&self) -> Result<()> {
        // SAFETY: `attr` is a local initialised by pthread_mutexattr_init before use, and
        // `self.raw` points into the mapped block, which outlives this call; nobody else can
        // touch it yet (the block's magic is not published).
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            check(
                libc::pthread_mutexattr_init(&mut attr),
                "pthread_mutexattr_init",
            )?;
            check(
                libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED),
                "pthread_mutexattr_setpshared",
            )?;
            check(
                libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST),
                "pthread_mutexattr_setrobust",
            )?;
            let rc = libc::pthread_mutex_init(self.raw.get(), &attr);
            libc::pthread_mutexattr_destroy(&mut attr);
            check(rc, "pthread_mutex_init")
        }
    }

    pub(crate) fn lock(&self) -> Result<LockGuard<'_>> {
        // SAFETY: the mutex was initialised by the block's creator and lives in the mapping
        // for as long as `self` is borrowed.
        let rc = unsafe { libc::pthread_mutex_lock(self.raw.get()) };
        match rc {
            0 => Ok(LockGuard {
                mutex: self,
                recovered: false,
            }),
            libc::EOWNERDEAD => Ok(LockGuard {
                mutex: self,
                recovered: true,
            }),
            libc::ENOTRECOVERABLE => Err(Error::new(
                libc::ENOTRECOVERABLE,
                "a store lock was left unrecoverable by a failed repair; run `cascade fsck --repair`",
            )),
            rc => Err(Error::new(rc, "pthread_mutex_lock")),
        }
    }
}

fn check(rc: i32, what: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::new(rc, what))
    }
}

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
        if self.recovered {
            // SAFETY: we hold the mutex (it was returned to us with EOWNERDEAD).
            unsafe {
                libc::pthread_mutex_consistent(self.mutex.raw.get());
            }
            self.recovered = false;
        }
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: this guard owns the lock. If repair did not finish (`recovered` still set)
        // the unlock leaves the mutex not-recoverable, which later lockers report clearly.
        unsafe {
            libc::pthread_mutex_unlock(self.mutex.raw.get());
        }
    }
}
