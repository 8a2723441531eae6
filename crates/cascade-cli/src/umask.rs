//! The process umask of the commands that write checkpoint data to disk (`agent`, `run`,
//! `drain`, `prune`, `stage-server`): files they create in a durable-store directory or a
//! staging server's directory get the `files.mode` setting (default 0600), their directories
//! the same plus x where r is set (0700). Checkpoints are private data (docs/security.md).
//!
//! A umask rather than a mode at every place a file is made: the durable store's directory
//! backend (object_store) creates its files itself. `cascade run` gives the program it runs
//! the umask it had itself.

use cascade_config::Config;

use crate::failure::Failure;

/// Sets the umask for `files.mode`; returns the one it replaced.
pub fn restrict(config: &Config) -> Result<libc::mode_t, Failure> {
    let text = config.text("files.mode");
    let mask = cascade_config::umask_for_file_mode(text)
        .ok_or_else(|| Failure::new(format!("files.mode={text}: not an octal mode")))?;
    // SAFETY: umask only swaps a process attribute; it cannot fail.
    Ok(unsafe { libc::umask(mask as libc::mode_t) })
}
