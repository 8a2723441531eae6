//! Whether the calling process's memory is its own.
//!
//! A child made by `vfork` (dash runs a command that has a redirection so) or by
//! `posix_spawn`'s clone shares its parent's memory until it execs. A thread such a child
//! starts dies at the exec wherever it is, and a lock it held (the dynamic loader's while it
//! registered its thread-local destructors, malloc's) stays held in the parent, whose next
//! `dlsym` or `malloc` then waits forever. So the store starts no thread in such a child.
//!
//! Only the interposition library runs the store's code in such a child (its `execve`
//! wrapper reads a stored script there). It records the owner at load and in every fork
//! child; a process that records nothing (the CLI, the agent, FUSE) owns its memory.

use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// The process whose memory this is, 0 if nobody recorded one.
static OWNER: AtomicI32 = AtomicI32::new(0);

fn pid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail (glibc no longer caches it, so a vfork
    // child gets its own).
    unsafe { libc::getpid() }
}

/// Records the calling process as the owner of its memory: at load, and in a fork child.
pub fn record() {
    OWNER.store(pid(), Relaxed);
}

/// False in a child that shares its parent's memory (vfork, posix_spawn's clone).
pub fn is_this_process() -> bool {
    let owner = OWNER.load(Relaxed);
    owner == 0 || owner == pid()
}
