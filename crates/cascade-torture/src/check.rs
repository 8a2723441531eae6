//! The crash-independent content check: invariants that hold whenever the store is looked at,
//! no matter at which instant the torture writers were killed.
//!
//! For every file under the checked root:
//! - its name is `s<16 hex digits>` (the seed of its pattern) and no directory has such a name;
//! - its size is at most the writers' maximum file size;
//! - reading it returns exactly `size` bytes, and every byte is its pattern byte or zero;
//! - `stat` and `read_dir` agree on its kind and inode number.

use cascade_store::{Error, FileKind, OpenOptions, Store};

use crate::pattern::{check_pattern_or_zero, parse_file_name};

/// What the check saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSummary {
    pub files: u64,
    pub dirs: u64,
    /// Sum of file sizes.
    pub bytes: u64,
    /// Sum of `Metadata::allocated_bytes` (what the files' chunks occupy).
    pub allocated_bytes: u64,
    /// Non-zero (written) bytes seen.
    pub written_bytes: u64,
}

/// Joins a directory path and an entry name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

const MAX_REPORTED: usize = 20;

/// Reads the whole file at `path` (expected to be `size` bytes) and checks it against the
/// pattern of `seed`; returns the number of non-zero bytes.
pub fn check_file_content(store: &Store, path: &str, seed: u64, size: u64) -> Result<u64, String> {
    let file = store
        .open(path, &OpenOptions::new())
        .map_err(|e| format!("{path}: open: {e}"))?;
    let mut buf = vec![0u8; 64 << 10];
    let mut off = 0u64;
    let mut written = 0u64;
    loop {
        let n = file
            .read_at(&mut buf, off)
            .map_err(|e| format!("{path}: read at {off}: {e}"))?;
        if n == 0 {
            break;
        }
        let data = &buf[..n];
        check_pattern_or_zero(seed, off, data).map_err(|m| format!("{path}: {m}"))?;
        written += data.iter().filter(|&&b| b != 0).count() as u64;
        off += n as u64;
        if off > size {
            return Err(format!(
                "{path}: read {off} bytes from a file of size {size}"
            ));
        }
    }
    if off != size {
        return Err(format!(
            "{path}: read ended at {off} but the size is {size}"
        ));
    }
    Ok(written)
}

/// Walks `root` and checks every file. Returns what it saw, or the violations found.
pub fn check_tree(
    store: &Store,
    root: &str,
    max_file_size: u64,
) -> Result<TreeSummary, Vec<String>> {
    let mut summary = TreeSummary::default();
    let mut problems = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(dir) = stack.pop() {
        summary.dirs += 1;
        let entries = match store.read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                problems.push(format!("{dir}: read_dir: {e}"));
                continue;
            }
        };
        for entry in entries {
            if problems.len() >= MAX_REPORTED {
                return Err(problems);
            }
            let path = join(&dir, &entry.name);
            let meta = match store.stat(&path) {
                Ok(m) => m,
                Err(e) => {
                    problems.push(format!("{path}: listed but stat fails: {e}"));
                    continue;
                }
            };
            if meta.kind != entry.kind || meta.ino != entry.ino {
                problems.push(format!(
                    "{path}: read_dir says {:?} ino {}, stat says {:?} ino {}",
                    entry.kind, entry.ino, meta.kind, meta.ino
                ));
            }
            match meta.kind {
                FileKind::Dir => {
                    if parse_file_name(&entry.name).is_some() {
                        problems.push(format!("{path}: a directory with a file's name"));
                    }
                    stack.push(path);
                }
                FileKind::File => {
                    let Some(seed) = parse_file_name(&entry.name) else {
                        problems.push(format!("{path}: a file whose name is not s<seed>"));
                        continue;
                    };
                    if meta.size > max_file_size {
                        problems.push(format!(
                            "{path}: size {} exceeds the writers' maximum {max_file_size}",
                            meta.size
                        ));
                        continue;
                    }
                    summary.files += 1;
                    summary.bytes += meta.size;
                    summary.allocated_bytes += meta.allocated_bytes();
                    match check_file_content(store, &path, seed, meta.size) {
                        Ok(w) => summary.written_bytes += w,
                        Err(p) => problems.push(p),
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(summary)
    } else {
        Err(problems)
    }
}

/// Directories (root included) and files with their seeds, as listed by [`walk`].
pub type Listing = (Vec<String>, Vec<(String, u64)>);

/// Lists every directory and file under `root` (root included in the directories), skipping
/// entries that vanish while walking (other processes may be renaming and deleting).
pub fn walk(store: &Store, root: &str) -> Result<Listing, Error> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(dir) = stack.pop() {
        let entries = match store.read_dir(&dir) {
            Ok(e) => e,
            Err(e) if dir != root && matches!(e.errno(), libc::ENOENT | libc::ENOTDIR) => continue,
            Err(e) => return Err(e),
        };
        dirs.push(dir.clone());
        for entry in entries {
            let path = join(&dir, &entry.name);
            match entry.kind {
                FileKind::Dir => stack.push(path),
                FileKind::File => {
                    if let Some(seed) = parse_file_name(&entry.name) {
                        files.push((path, seed));
                    }
                }
            }
        }
    }
    Ok((dirs, files))
}
