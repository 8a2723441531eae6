//! Finding, clearing and unmounting Cascade mounts (from /proc/self/mountinfo).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The source a Cascade mount shows in /proc/self/mountinfo: `cascade:<store>`.
pub(crate) const SOURCE_PREFIX: &str = "cascade:";

/// Mount points of Cascade file systems, as the kernel lists them (alive or left by a dead
/// daemon).
pub fn cascade_mounts() -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            // "id parent major:minor root MOUNTPOINT options [optional...] - FSTYPE SOURCE ..."
            let (left, right) = line.split_once(" - ")?;
            let mountpoint = left.split(' ').nth(4)?;
            let mut fields = right.split(' ');
            let (fs_type, source) = (fields.next()?, fields.next()?);
            (fs_type.starts_with("fuse") && source.starts_with(SOURCE_PREFIX))
                .then(|| PathBuf::from(unescape(mountpoint)))
        })
        .collect())
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The absolute form of `path` without resolving it (a dead mount cannot be stat'ed).
fn absolute(path: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(path)?;
    // Resolve the parent (alive) so the comparison with mountinfo's canonical paths holds.
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name)),
        _ => Ok(abs),
    }
}

/// True if a Cascade file system is mounted on `path` (alive or left by a dead daemon).
pub fn is_cascade_mount(path: &Path) -> io::Result<bool> {
    let abs = absolute(path)?;
    Ok(cascade_mounts()?.contains(&abs))
}

fn umount2(path: &Path, flags: i32) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Detaches a Cascade mount whose daemon died (every access gives ENOTCONN). Returns false if
/// there was no Cascade mount at `path`.
pub fn clear_dead_mount(path: &Path) -> io::Result<bool> {
    let abs = absolute(path)?;
    if !cascade_mounts()?.contains(&abs) {
        return Ok(false);
    }
    umount2(&abs, libc::MNT_DETACH)?;
    Ok(true)
}

/// Unmounts the Cascade file system on `path`; the daemon serving it then exits. EBUSY while
/// files are open under it, unless `lazy` (detached now, gone once the last one is closed).
/// EINVAL if no Cascade file system is mounted there.
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let abs = absolute(path)?;
    if !cascade_mounts()?.contains(&abs) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    umount2(&abs, if lazy { libc::MNT_DETACH } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape("/tmp/x\\134y"), "/tmp/x\\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }
}
