//! Ownership checks of the node's local objects (docs/security.md, "Local store and agent
//! socket").
//!
//! Every name Cascade uses on a node is predictable (`/dev/shm/cascade-<uid>`, its `.locks`
//! directory, `/var/tmp/cascade-<uid>.spill`), so another user can create them first. Cascade
//! therefore uses an existing object only if it is owned by the caller's effective uid and
//! nobody else has any access to it, opens it without following a symlink, and creates what
//! it creates exclusively. Root is held to the same rule: a root process refuses objects
//! owned by another uid too (run as that user to use their store).

use crate::error::{Error, Result};
use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::Path;

/// The kind of object a check expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Socket,
}

impl Kind {
    fn bits(self) -> libc::mode_t {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Socket => libc::S_IFSOCK,
        }
    }
    fn word(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Dir => "a directory",
            Kind::Socket => "a socket",
        }
    }
}

/// This process's effective uid, the only owner Cascade trusts.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The owner a new file or directory is given: the creating thread's effective uid and gid.
/// Asking the kernel costs two system calls per create (a tenth of a create through the
/// preload library where system calls are cheap, docs/interposition.md, "What a create
/// costs"), so a process that sees every change of its ids, the preload library through its
/// set*id wrappers, may keep them: [`creator_ids::keep`] turns the cache on,
/// [`creator_ids::changed`] empties it after a process-wide change, and
/// [`creator_ids::per_thread`] turns it off for good once a thread changed its own ids (a raw
/// system call does that to the calling thread only).
pub mod creator_ids {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

    /// Bit 0: the cache is on; bits 1..: the generation, advanced by every change.
    static STATE: AtomicU32 = AtomicU32::new(0);
    const ON: u32 = 1;
    const ONE_GENERATION: u32 = 2;
    /// `state << 32 | id`: an id tagged with the `STATE` its filler read before asking the
    /// kernel. Used only while the tag is the current state, so a fill that raced with a
    /// change is never used, and without a lock (a fork child or a signal handler may
    /// create files while another thread was filling).
    static UID: AtomicU64 = AtomicU64::new(0);
    static GID: AtomicU64 = AtomicU64::new(0);

    /// The effective uid and gid new inodes get.
    #[inline]
    pub fn get() -> (u32, u32) {
        let state = STATE.load(Acquire);
        if state & ON == 0 {
            return from_the_kernel();
        }
        let (uid, gid) = (UID.load(Acquire), GID.load(Acquire));
        if (uid >> 32) as u32 == state && (gid >> 32) as u32 == state {
            return (uid as u32, gid as u32);
        }
        let ids = from_the_kernel();
        UID.store(u64::from(state) << 32 | u64::from(ids.0), Release);
        GID.store(u64::from(state) << 32 | u64::from(ids.1), Release);
        ids
    }

    fn from_the_kernel() -> (u32, u32) {
        // SAFETY: geteuid and getegid cannot fail.
        unsafe { (libc::geteuid(), libc::getegid()) }
    }

    /// Keeps the ids from now on (until a change).
    pub fn keep() {
        STATE.fetch_or(ON, AcqRel);
    }

    /// After a change of the process's ids: the next create asks the kernel again.
    pub fn changed() {
        STATE.fetch_add(ONE_GENERATION, AcqRel);
    }

    /// After a thread changed its own ids only: threads may differ from now on, so every
    /// create asks the kernel.
    pub fn per_thread() {
        STATE.fetch_and(!ON, AcqRel);
    }
}

fn type_word(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symlink",
        libc::S_IFSOCK => "a socket",
        libc::S_IFIFO => "a fifo",
        _ => "a device",
    }
}

/// Checks what `fstat`/`lstat` said about `path` (`what` names it in the error: "store
/// /cascade-0", "spill file"): the right kind, owned by this process's effective uid, no
/// access for group or others. The error is one line naming the object, its owner and mode,
/// and what to do.
pub fn check_stat(what: &str, path: &Path, st: &libc::stat, kind: Kind) -> Result<()> {
    let me = euid();
    let perm = st.st_mode & 0o7777;
    let problem = if st.st_mode & libc::S_IFMT != kind.bits() {
        format!(
            "is {}, not {} (uid {}, mode {perm:04o})",
            type_word(st.st_mode),
            kind.word(),
            st.st_uid
        )
    } else if st.st_uid != me {
        format!(
            "is owned by uid {} (mode {perm:04o}), not by you (uid {me})",
            st.st_uid
        )
    } else if perm & 0o077 != 0 {
        format!("has mode {perm:04o} (uid {me}): group or others have access")
    } else {
        return Ok(());
    };
    Err(Error::new(
        libc::EACCES,
        format!(
            "{what}: {} {problem}; Cascade uses only objects private to you, and this one may have been planted: remove it (as its owner or root) or choose another name",
            path.display()
        ),
    ))
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::new(libc::EINVAL, format!("{} contains NUL", path.display())))
}

/// `lstat(path)`: Ok(None) if it does not exist.
pub fn lstat(path: &Path) -> Result<Option<libc::stat>> {
    let c = c_path(path)?;
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        let e = Error::last_os(path.display().to_string());
        if e.errno() == libc::ENOENT {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(st))
}

/// `fstat(fd)`.
pub fn fstat(fd: RawFd, what: &str) -> Result<libc::stat> {
    // SAFETY: stat is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; a bad fd only makes fstat fail.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os(what.to_string()));
    }
    Ok(st)
}

/// Creates `path` as a directory of mode 0700, or checks the one that is there (not a
/// symlink, owned by this process's effective uid, private). The parent must exist.
pub fn ensure_private_dir(what: &str, path: &Path) -> Result<()> {
    let c = c_path(path)?;
    // SAFETY: `c` is a valid C string.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
        return Ok(());
    }
    let e = Error::last_os(format!("{what}: {}", path.display()));
    if e.errno() != libc::EEXIST {
        return Err(e);
    }
    match lstat(path)? {
        Some(st) => check_stat(what, path, &st, Kind::Dir),
        // Removed in between (a concurrent destroy): try once more.
        None => {
            // SAFETY: as above.
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
                Ok(())
            } else {
                Err(Error::last_os(format!("{what}: {}", path.display())))
            }
        }
    }
}

/// Checks an existing directory the same way; Ok(false) if it does not exist.
pub fn check_private_dir(what: &str, path: &Path) -> Result<bool> {
    match lstat(path)? {
        Some(st) => check_stat(what, path, &st, Kind::Dir).map(|()| true),
        None => Ok(false),
    }
}

/// The effective uid of the process at the other end of a connected Unix socket (as of its
/// connect or listen), from SO_PEERCRED.
pub fn peer_uid(fd: RawFd) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Checks that the peer of a connection to the agent socket at `path` runs as this process's
/// effective uid: a socket answered by anyone else is not our agent.
pub fn check_agent_peer(fd: RawFd, path: &Path) -> std::io::Result<()> {
    let uid = peer_uid(fd)?;
    let me = euid();
    if uid != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "agent socket {} is served by uid {uid}, not by you (uid {me}); not talking to it: remove it (as its owner or root)",
                path.display()
            ),
        ));
    }
    Ok(())
}
