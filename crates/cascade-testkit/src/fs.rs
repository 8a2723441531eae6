//! Directories of a test: what is in one, and ones that must not outlive it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every file below `dir` (not directories), sorted; an unreadable or missing directory has
/// none.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for p in entries.flatten().map(|e| e.path()) {
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Removes a directory when dropped (the mount prefix `cascade run` creates on the host).
pub struct RemoveDir(pub String);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `program` with `args`; its stderr if it fails.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A tmpfs mounted on a directory of the test (a small, really full SSD); unmounted on drop.
/// Needs root (the tests run as root in CI).
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` ("64m") on `dir` (created); the reason if that is not possible.
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        run(
            "mount",
            &[
                "-t".as_ref(),
                "tmpfs".as_ref(),
                "-o".as_ref(),
                format!("size={size}").as_ref(),
                "tmpfs".as_ref(),
                dir.as_os_str(),
            ],
        )?;
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there (a server being killed) does not keep
        // the mount around.
        let _ = run("umount", &["-l".as_ref(), self.dir.as_os_str()]);
    }
}

/// A small ext4 file system on a loop device, mounted on `<dir>/mnt` from an image file in
/// `dir` (a small, really full SSD that, unlike tmpfs, takes O_DIRECT writes); unmounted and
/// its image removed on drop. Needs root and e2fsprogs (the tests run as root in CI).
pub struct SmallExt4 {
    pub mnt: PathBuf,
    image: PathBuf,
}

impl SmallExt4 {
    /// Makes and mounts an ext4 of `mib` MiB in `dir` (created); the reason if that is not
    /// possible.
    pub fn mount(dir: &Path, mib: u64) -> Result<SmallExt4, String> {
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
        let image = dir.join("ext4.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| format!("create {}: {e}", image.display()))?;
        run(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
        )?;
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                mnt.as_os_str(),
            ],
        )?;
        Ok(SmallExt4 { mnt, image })
    }
}

impl Drop for SmallExt4 {
    fn drop(&mut self) {
        // The loop device mount detaches its device when it goes.
        let _ = run("umount", &[self.mnt.as_os_str()]);
        let _ = std::fs::remove_file(&self.image);
    }
}
