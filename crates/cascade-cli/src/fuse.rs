//! `cascade mount` / `cascade umount`: the FUSE front end (crates/cascade-fuse).

use std::path::Path;
use std::process::ExitCode;

use cascade_config::Config;
use cascade_fuse::MountOptions;

use crate::failure::Failure;
use crate::lifecycle::{block_stop_signals, wait_for_signal};

/// `cascade mount MOUNTPOINT`: mounts, prints one line, serves until unmounted. SIGINT and
/// SIGTERM unmount (refused while files are open: it keeps serving and says so).
pub fn mount(config: &Config, mountpoint: &Path, opts: &MountOptions) -> Result<ExitCode, Failure> {
    // Blocked before any thread exists: the request threads inherit the mask.
    let signals = block_stop_signals()?;
    let store = crate::run::attach_or_create(config)?;
    let name = store.name().to_string();
    let shown = mountpoint.display().to_string();
    let mounted = cascade_fuse::mount(store, mountpoint, opts).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            Failure::new(format!(
                "{shown}: mounting needs root (mount(2) of a FUSE file system)"
            ))
        } else {
            Failure::io(&shown, &e)
        }
    })?;
    eprintln!(
        "cascade mount: store {name} on {shown} ({} thread(s), {}; pid {})",
        opts.threads,
        if opts.kernel_cache {
            "kernel cache"
        } else {
            "direct I/O"
        },
        std::process::id()
    );
    let at = mountpoint.to_path_buf();
    std::thread::spawn(move || loop {
        wait_for_signal(&signals);
        match cascade_fuse::unmount(&at, false) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => eprintln!(
                "cascade mount: {}: not unmounted, files are open under it (close them, or \
                 run 'cascade umount --lazy')",
                at.display()
            ),
            Err(e) => {
                eprintln!("cascade mount: {}: cannot unmount: {e}", at.display());
                return;
            }
        }
    });
    mounted.serve().map_err(|e| Failure::io(&shown, &e))?;
    eprintln!("cascade mount: {shown} unmounted");
    Ok(ExitCode::SUCCESS)
}

/// `cascade umount MOUNTPOINT [--lazy]`.
pub fn umount(mountpoint: &Path, lazy: bool) -> Result<ExitCode, Failure> {
    let shown = mountpoint.display().to_string();
    cascade_fuse::unmount(mountpoint, lazy).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => Failure::new(format!(
            "{shown}: files are open under the mount; close them first, or use --lazy"
        )),
        Some(libc::EINVAL) => {
            Failure::new(format!("{shown}: no Cascade file system is mounted there"))
        }
        _ => Failure::io(&shown, &e),
    })?;
    Ok(ExitCode::SUCCESS)
}
