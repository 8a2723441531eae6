//! The FUSE front end (`cascade mount`): the node store served as a kernel file system, for
//! every program the preload library cannot reach — static binaries, Go programs, anything
//! that makes system calls without libc. It serves the same store as the preload library, so
//! a file written through one is visible through the other at once, and the agent drains it
//! like any other. Design and limits: docs/fuse.md.

mod fs;
mod mountpoint;

use std::io;
use std::path::Path;

use cascade_store::Store;

pub use fs::CascadeFs;
pub use mountpoint::{cascade_mounts, clear_dead_mount, is_cascade_mount, unmount};

/// Largest write (and read) one FUSE request carries.
pub const MAX_IO: u32 = 1 << 20;

/// How a mount is served.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Threads taking requests from the kernel (each with its own cloned /dev/fuse fd).
    pub threads: usize,
    /// Let the kernel cache file data between opens (faster rereads, but a write through the
    /// preload library is seen only after the next open). Off: every read and write goes to
    /// the store (FOPEN_DIRECT_IO), mmap still works through the page cache.
    pub kernel_cache: bool,
    /// Let users other than the one who mounted use the mount.
    pub allow_other: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: 2,
            kernel_cache: false,
            allow_other: false,
        }
    }
}

/// A mounted store, not yet serving: [`Mounted::serve`] answers requests until unmounted.
pub struct Mounted {
    session: fuser::Session<CascadeFs>,
}

impl Mounted {
    /// Serves requests until the file system is unmounted (`cascade umount`, `umount`).
    pub fn serve(self) -> io::Result<()> {
        match self.session.run() {
            // A request thread that takes a request while the kernel tears the connection
            // down (the last close after a lazy unmount) reads ECONNABORTED instead of
            // ENODEV: the session ended all the same.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(()),
            other => other,
        }
    }
}

/// Mounts `store` on `mountpoint` (which must be an existing directory). A dead Cascade mount
/// left there by a killed daemon is cleared first. Returns once the mount exists.
pub fn mount(store: Store, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mounted> {
    let meta = std::fs::metadata(mountpoint).or_else(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) && clear_dead_mount(mountpoint)? {
            std::fs::metadata(mountpoint)
        } else {
            Err(e)
        }
    })?;
    if !meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    if is_cascade_mount(mountpoint)? {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "a Cascade file system is already mounted there",
        ));
    }
    // Descriptions left by a killed daemon (or program) are freed: their writers' files are
    // marked torn, as after any crash.
    store.sweep_descriptions();
    let name = store.name().trim_start_matches('/').to_string();
    let options = vec![
        fuser::MountOption::FSName(format!("{}{name}", mountpoint::SOURCE_PREFIX)),
        fuser::MountOption::Subtype("cascade".to_string()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    let acl = if opts.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    let mut config = fuser::Config::default();
    config.mount_options = options;
    config.acl = acl;
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let session = fuser::Session::new(CascadeFs::new(store, opts), mountpoint, &config)?;
    Ok(Mounted { session })
}
