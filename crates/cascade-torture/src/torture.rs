//! The torture writer: a long random sequence of namespace and data operations.
//!
//! Everything it writes keeps the invariants of [`crate::check`]: files are named after the
//! seed of their pattern, data is always the pattern, and only whole-file operations that keep
//! names (rename to another directory under the same name, possibly over an existing file with
//! the same seed) move data around. So a crash at any instant leaves a store that passes the
//! check, whatever the writer was doing.
//!
//! In exclusive mode (the default: the writer owns its root directory) it also keeps an exact
//! model of the tree and of which bytes of each file it wrote. It adopts whatever the root
//! already holds when it starts (checking it on the way), predicts the outcome of every
//! operation (including the errors: EEXIST, ENOTEMPTY, EINVAL for a directory moved into
//! itself), reads back each write, and every `verify_every` operations compares the whole tree
//! and every byte with the model. In shared mode (`shared`: other writers work in the same
//! tree) it works from a periodically refreshed listing and tolerates the errors that races
//! with the others cause.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cascade_store::{Error, FileKind, OpenOptions, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::check::{join, walk};
use crate::extents::Extents;
use crate::pattern::{check_exact, check_pattern_or_zero, file_name, parse_file_name, pattern};

/// Parameters of a torture run.
#[derive(Debug, Clone)]
pub struct RunParams {
    /// Directory the writer works in (created if missing).
    pub root: String,
    /// Seed of the operation sequence (and of the file seeds it makes up).
    pub seed: u64,
    /// Number of operations; 0 runs until the process is killed.
    pub ops: u64,
    /// No file grows beyond this many bytes.
    pub max_file_size: u64,
    /// Largest single write.
    pub max_write: u64,
    /// Files this writer keeps at most (it deletes when it has more).
    pub max_files: usize,
    /// Directories this writer keeps at most, root included.
    pub max_dirs: usize,
    /// Directories are made at most this deep below the root.
    pub max_depth: usize,
    /// Other writers share the root: no exact model.
    pub shared: bool,
    /// Exclusive mode: compare the whole tree with the model every this many operations
    /// (0: only at the end).
    pub verify_every: u64,
}

impl Default for RunParams {
    fn default() -> Self {
        RunParams {
            root: "/".to_string(),
            seed: 1,
            ops: 1000,
            max_file_size: 256 << 10,
            max_write: 48 << 10,
            max_files: 48,
            max_dirs: 12,
            max_depth: 3,
            shared: false,
            verify_every: 100,
        }
    }
}

/// Counts of what a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    pub ops: u64,
    pub creates: u64,
    pub writes: u64,
    pub appends: u64,
    pub bytes_written: u64,
    pub truncates: u64,
    pub renames: u64,
    pub dir_renames: u64,
    pub unlinks: u64,
    pub mkdirs: u64,
    pub rmdirs: u64,
    pub reads: u64,
    pub verifies: u64,
    /// Operations that failed with ENOSPC (store or file table full).
    pub enospc: u64,
    /// Other failures tolerated because another writer raced this one (shared mode).
    pub raced: u64,
    /// Shared mode: reads that saw foreign bytes which a second read no longer shows (the
    /// documented race of a lock-free read with a truncate or unlink of the same file).
    pub racy_reads: u64,
}

impl fmt::Display for RunStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ops={} creates={} writes={} appends={} bytes_written={} truncates={} renames={} \
             dir_renames={} unlinks={} mkdirs={} rmdirs={} reads={} verifies={} enospc={} raced={} \
             racy_reads={}",
            self.ops,
            self.creates,
            self.writes,
            self.appends,
            self.bytes_written,
            self.truncates,
            self.renames,
            self.dir_renames,
            self.unlinks,
            self.mkdirs,
            self.rmdirs,
            self.reads,
            self.verifies,
            self.enospc,
            self.raced,
            self.racy_reads
        )
    }
}

/// Why a run stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The store's content or behaviour broke an invariant (a store bug, or corruption).
    Violation(String),
    /// An operation failed in a way the writer does not expect.
    Unexpected(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Violation(m) => write!(f, "VIOLATION: {m}"),
            Failure::Unexpected(m) => write!(f, "UNEXPECTED: {m}"),
        }
    }
}

type Outcome = Result<(), Failure>;

/// Errors another writer in the same tree can cause at any time.
const RACES: &[i32] = &[libc::ENOENT, libc::EEXIST, libc::ENOTEMPTY, libc::ESTALE];

#[derive(Debug, Clone)]
struct FileModel {
    seed: u64,
    size: u64,
    extents: Extents,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    Clone,
    Write,
    Append,
    Truncate,
    RenameFile,
    RenameDir,
    Unlink,
    Mkdir,
    Rmdir,
    Read,
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn is_within(path: &str, dir: &str) -> bool {
    path == dir || dir == "/" || path.starts_with(&format!("{dir}/"))
}

fn describe(e: &Error) -> String {
    format!("{e} (errno {})", e.errno())
}

/// A torture writer attached to one store.
pub struct Torture<'a> {
    store: &'a Store,
    p: RunParams,
    rng: StdRng,
    dirs: BTreeSet<String>,
    files: BTreeMap<String, FileModel>,
    /// Operations left during which deleting is preferred (after ENOSPC).
    pressure: u32,
    pub stats: RunStats,
}

impl<'a> Torture<'a> {
    /// Prepares a run: creates the root, and in exclusive mode adopts (and checks) what the
    /// root already holds.
    pub fn new(store: &'a Store, params: RunParams) -> Result<Self, Failure> {
        let mut root = params.root.trim_end_matches('/').to_string();
        if !root.starts_with('/') {
            root.insert(0, '/');
        }
        let p = RunParams { root, ..params };
        let mut t = Torture {
            store,
            rng: StdRng::seed_from_u64(p.seed),
            p,
            dirs: BTreeSet::new(),
            files: BTreeMap::new(),
            pressure: 0,
            stats: RunStats::default(),
        };
        match store.create_dir_all(&t.p.root, 0o755) {
            Ok(()) => {}
            Err(e) if e.errno() == libc::EEXIST => {}
            Err(e) if e.errno() == libc::ENOSPC => t.stats.enospc += 1,
            Err(e) => {
                return Err(Failure::Unexpected(format!(
                    "create root {}: {}",
                    t.p.root,
                    describe(&e)
                )))
            }
        }
        if t.p.shared {
            t.refresh()?;
        } else {
            t.adopt()?;
        }
        Ok(t)
    }

    /// Runs the configured number of operations (forever if 0), then a final verification.
    pub fn run(&mut self) -> Result<RunStats, Failure> {
        while self.p.ops == 0 || self.stats.ops < self.p.ops {
            self.step()?;
        }
        if !self.p.shared {
            self.verify_all()?;
        }
        Ok(self.stats.clone())
    }

    /// One random operation (plus the periodic verification or refresh).
    pub fn step(&mut self) -> Outcome {
        let op = self.pick_op();
        match op {
            Op::Create => self.op_create()?,
            Op::Clone => self.op_clone()?,
            Op::Write => self.op_write()?,
            Op::Append => self.op_append()?,
            Op::Truncate => self.op_truncate()?,
            Op::RenameFile => self.op_rename_file()?,
            Op::RenameDir => self.op_rename_dir()?,
            Op::Unlink => self.op_unlink()?,
            Op::Mkdir => self.op_mkdir()?,
            Op::Rmdir => self.op_rmdir()?,
            Op::Read => self.op_read()?,
        }
        self.stats.ops += 1;
        self.pressure = self.pressure.saturating_sub(1);
        if self.p.shared {
            if self.stats.ops % 16 == 0 {
                self.refresh()?;
            }
        } else if self.p.verify_every > 0 && self.stats.ops % self.p.verify_every == 0 {
            self.verify_all()?;
        }
        Ok(())
    }

    fn pick_op(&mut self) -> Op {
        use Op::*;
        if self.files.is_empty() {
            return if self.rng.gen_ratio(1, 8) {
                Mkdir
            } else {
                Create
            };
        }
        let too_many_files = self.files.len() >= self.p.max_files;
        let too_many_dirs = self.dirs.len() >= self.p.max_dirs;
        let table: &[(Op, u32)] = if self.pressure > 0 {
            &[
                (Unlink, 30),
                (Truncate, 10),
                (Read, 5),
                (Write, 5),
                (Rmdir, 5),
            ]
        } else {
            &[
                (Create, 10),
                (Clone, 4),
                (Write, 30),
                (Append, 8),
                (Truncate, 8),
                (RenameFile, 7),
                (RenameDir, 3),
                (Unlink, 7),
                (Mkdir, 4),
                (Rmdir, 3),
                (Read, 6),
            ]
        };
        let total: u32 = table.iter().map(|(_, w)| w).sum();
        let mut x = self.rng.gen_range(0..total);
        let mut op = Write;
        for &(o, w) in table {
            if x < w {
                op = o;
                break;
            }
            x -= w;
        }
        match op {
            Create | Clone if too_many_files => Unlink,
            Mkdir if too_many_dirs => Rmdir,
            o => o,
        }
    }

    // ----- choosing -------------------------------------------------------------------

    fn random_dir(&mut self) -> String {
        let i = self.rng.gen_range(0..self.dirs.len().max(1));
        self.dirs
            .iter()
            .nth(i)
            .cloned()
            .unwrap_or_else(|| self.p.root.clone())
    }

    fn random_file(&mut self) -> Option<(String, u64)> {
        if self.files.is_empty() {
            return None;
        }
        let i = self.rng.gen_range(0..self.files.len());
        self.files.iter().nth(i).map(|(p, m)| (p.clone(), m.seed))
    }

    fn depth(&self, dir: &str) -> usize {
        let rel = dir.strip_prefix(self.p.root.as_str()).unwrap_or(dir);
        rel.split('/').filter(|c| !c.is_empty()).count()
    }

    fn fresh_dir_name(&mut self) -> String {
        format!("d{:08x}", self.rng.gen::<u32>())
    }

    // ----- error policy ---------------------------------------------------------------

    /// Accepts `err` if its errno is in `expected` (or, in shared mode, is a race); counts it.
    fn tolerate(&mut self, what: &str, err: &Error, expected: &[i32]) -> Outcome {
        let errno = err.errno();
        if expected.contains(&errno) {
            if errno == libc::ENOSPC {
                self.stats.enospc += 1;
                self.pressure = 24;
            }
            Ok(())
        } else if self.p.shared && RACES.contains(&errno) {
            self.stats.raced += 1;
            Ok(())
        } else {
            Err(Failure::Unexpected(format!("{what}: {}", describe(err))))
        }
    }

    fn open_rw(&self, path: &str) -> Result<cascade_store::File, Error> {
        self.store
            .open(path, &OpenOptions::new().read(true).write(true))
    }

    // ----- operations -----------------------------------------------------------------

    fn op_create(&mut self) -> Outcome {
        let dir = self.random_dir();
        let seed = self.rng.gen::<u64>();
        let path = join(&dir, &file_name(seed));
        self.stats.creates += 1;
        let opts = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644);
        match self.store.open(&path, &opts) {
            Ok(_) => {
                self.files.insert(
                    path.clone(),
                    FileModel {
                        seed,
                        size: 0,
                        extents: Extents::new(),
                    },
                );
                if self.rng.gen_bool(0.6) {
                    let len = self.rng.gen_range(1..=self.p.max_write);
                    self.write_range(&path, seed, 0, len)?;
                }
                Ok(())
            }
            Err(e) => self.tolerate(&format!("create {path}"), &e, &[libc::ENOSPC]),
        }
    }

    /// Creates a file with the seed (so the name) of an existing one in another directory,
    /// so that renames can replace files.
    fn op_clone(&mut self) -> Outcome {
        let Some((src, seed)) = self.random_file() else {
            return Ok(());
        };
        let dir = self.random_dir();
        let path = join(&dir, base(&src));
        if path == src {
            return Ok(());
        }
        let exists = self.files.contains_key(&path);
        self.stats.creates += 1;
        let opts = OpenOptions::new().write(true).create_new(true).mode(0o600);
        match self.store.open(&path, &opts) {
            Ok(_) if exists && !self.p.shared => Err(Failure::Violation(format!(
                "create_new {path} succeeded but the file exists"
            ))),
            Ok(_) => {
                self.files.insert(
                    path,
                    FileModel {
                        seed,
                        size: 0,
                        extents: Extents::new(),
                    },
                );
                Ok(())
            }
            Err(e) if exists && e.errno() == libc::EEXIST => Ok(()),
            Err(e) => self.tolerate(&format!("create {path}"), &e, &[libc::ENOSPC]),
        }
    }

    fn op_write(&mut self) -> Outcome {
        let Some((path, seed)) = self.random_file() else {
            return Ok(());
        };
        let size = match self.files.get(&path) {
            Some(m) if !self.p.shared => m.size,
            _ => self.store.stat(&path).map(|m| m.size).unwrap_or(0),
        };
        let max = self.p.max_file_size;
        let len = self.rng.gen_range(1..=self.p.max_write);
        let off = match self.rng.gen_range(0..10) {
            // Around the end: appends, overlaps, small holes.
            0..=4 => {
                let back = self.rng.gen_range(0..=len.min(size));
                let gap = if self.rng.gen_bool(0.2) {
                    self.rng.gen_range(0..=self.p.max_write)
                } else {
                    0
                };
                size - back + gap
            }
            // Anywhere: sparse files.
            5..=7 => self.rng.gen_range(0..max),
            _ => 0,
        };
        self.write_range(&path, seed, off, len)
    }

    /// Writes the pattern to `[off, off + len)` (clipped to the maximum file size) with
    /// `write_at`, updates the model, and reads the range back.
    fn write_range(&mut self, path: &str, seed: u64, off: u64, len: u64) -> Outcome {
        let max = self.p.max_file_size;
        let off = off.min(max.saturating_sub(1));
        let len = len.min(max - off);
        if len == 0 {
            return Ok(());
        }
        self.stats.writes += 1;
        let file = match self.open_rw(path) {
            Ok(f) => f,
            Err(e) => return self.tolerate(&format!("open {path}"), &e, &[]),
        };
        let data = pattern(seed, off, len as usize);
        let mut done = 0usize;
        let mut failed = None;
        // Alternate between write_at (whose short count the model follows) and write_all_at.
        if self.p.shared && self.rng.gen_bool(0.3) {
            match file.write_all_at(&data, off) {
                Ok(()) => done = data.len(),
                Err(e) => failed = Some(e),
            }
        } else {
            while done < data.len() {
                match file.write_at(&data[done..], off + done as u64) {
                    Ok(0) => {
                        return Err(Failure::Violation(format!(
                            "{path}: write_at of {} bytes at {} returned 0",
                            data.len() - done,
                            off + done as u64
                        )))
                    }
                    Ok(n) => done += n,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        self.stats.bytes_written += done as u64;
        if let Some(m) = self.files.get_mut(path) {
            m.extents.add(off, off + done as u64);
            if done > 0 {
                m.size = m.size.max(off + done as u64);
            }
        }
        if let Some(e) = &failed {
            self.tolerate(&format!("write {path} at {off}+{len}"), e, &[libc::ENOSPC])?;
            if !self.p.shared {
                // Intact up to the last successful write, nothing more: the whole file must
                // still match the model exactly.
                return self.verify_file(path);
            }
        }
        // Read back what was written (visible at once, to this process too).
        let mut back = vec![0u8; done];
        match file.read_at(&mut back, off) {
            Ok(n) if !self.p.shared && n != done => Err(Failure::Violation(format!(
                "{path}: read back {n} of {done} bytes just written at {off}"
            ))),
            Ok(n) if self.p.shared => self.check_shared_read(&file, path, seed, off, &back[..n]),
            Ok(n) => check_exact(off, &back[..n], &data[..n])
                .map_err(|m| Failure::Violation(format!("{path}: read back after write: {m}"))),
            Err(e) => self.tolerate(&format!("read back {path}"), &e, &[]),
        }
    }

    fn op_append(&mut self) -> Outcome {
        let Some((path, seed)) = self.random_file() else {
            return Ok(());
        };
        let len = self.rng.gen_range(1..=self.p.max_write);
        if self.p.shared {
            // Where the end is depends on the others: write at the current size instead.
            let size = self.store.stat(&path).map(|m| m.size).unwrap_or(0);
            self.stats.appends += 1;
            return self.write_range(&path, seed, size, len);
        }
        let size = self.files.get(&path).map(|m| m.size).unwrap_or(0);
        let len = len.min(self.p.max_file_size.saturating_sub(size));
        if len == 0 {
            return Ok(());
        }
        self.stats.appends += 1;
        let file = match self.open_rw(&path) {
            Ok(f) => f,
            Err(e) => return self.tolerate(&format!("open {path}"), &e, &[]),
        };
        let data = pattern(seed, size, len as usize);
        match file.append(&data) {
            Ok(at) if at != size => Err(Failure::Violation(format!(
                "{path}: append landed at {at}, the file was {size} bytes"
            ))),
            Ok(_) => {
                self.stats.bytes_written += len;
                if let Some(m) = self.files.get_mut(&path) {
                    m.extents.add(size, size + len);
                    m.size = size + len;
                }
                Ok(())
            }
            Err(e) => {
                self.tolerate(&format!("append {path}"), &e, &[libc::ENOSPC])?;
                // A failed append may have stored a prefix; whatever it stored must be the
                // pattern, and nothing before the old end may change.
                let now = self
                    .store
                    .stat(&path)
                    .map_err(|e| Failure::Unexpected(format!("stat {path}: {}", describe(&e))))?
                    .size;
                if now < size || now > size + len {
                    return Err(Failure::Violation(format!(
                        "{path}: failed append of {len} bytes at {size} left size {now}"
                    )));
                }
                if let Some(m) = self.files.get_mut(&path) {
                    m.extents.add(size, now);
                    m.size = now;
                }
                self.verify_file(&path)
            }
        }
    }

    fn op_truncate(&mut self) -> Outcome {
        let Some((path, _)) = self.random_file() else {
            return Ok(());
        };
        let size = match self.files.get(&path) {
            Some(m) if !self.p.shared => m.size,
            _ => self.store.stat(&path).map(|m| m.size).unwrap_or(0),
        };
        let new_len = if size > 0 && (self.pressure > 0 || self.rng.gen_bool(0.5)) {
            self.rng.gen_range(0..size)
        } else {
            let room = self.p.max_file_size.saturating_sub(size);
            if room == 0 {
                return Ok(());
            }
            size + self.rng.gen_range(1..=room.min(2 * self.p.max_write))
        };
        self.stats.truncates += 1;
        let result = if self.rng.gen_bool(0.5) {
            self.store.truncate(&path, new_len)
        } else {
            self.open_rw(&path).and_then(|f| f.set_len(new_len))
        };
        match result {
            Ok(()) => {
                if let Some(m) = self.files.get_mut(&path) {
                    m.extents.truncate(new_len);
                    m.size = new_len;
                }
                if self.p.shared {
                    Ok(())
                } else {
                    self.verify_file(&path)
                }
            }
            Err(e) => {
                self.tolerate(
                    &format!("truncate {path} to {new_len}"),
                    &e,
                    &[libc::ENOSPC],
                )?;
                if self.p.shared {
                    return Ok(());
                }
                // Either done or not done.
                let now = self.store.stat(&path).map(|m| m.size).unwrap_or(u64::MAX);
                if now == new_len {
                    if let Some(m) = self.files.get_mut(&path) {
                        m.extents.truncate(new_len);
                        m.size = new_len;
                    }
                } else if now != size {
                    return Err(Failure::Violation(format!(
                        "{path}: failed truncate from {size} to {new_len} left size {now}"
                    )));
                }
                self.verify_file(&path)
            }
        }
    }

    /// Moves a file to another directory under the same name (so the same seed), replacing
    /// a file of that name there if there is one.
    fn op_rename_file(&mut self) -> Outcome {
        let Some((from, _)) = self.random_file() else {
            return Ok(());
        };
        let dir = self.random_dir();
        if dir == parent(&from) {
            return Ok(());
        }
        let to = join(&dir, base(&from));
        self.stats.renames += 1;
        match self.store.rename(&from, &to) {
            Ok(()) => {
                if let Some(m) = self.files.remove(&from) {
                    self.files.insert(to, m);
                }
                Ok(())
            }
            Err(e) => self.tolerate(&format!("rename {from} -> {to}"), &e, &[]),
        }
    }

    fn op_rename_dir(&mut self) -> Outcome {
        let candidates: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| **d != self.p.root)
            .cloned()
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let from = candidates[self.rng.gen_range(0..candidates.len())].clone();
        self.stats.dir_renames += 1;

        // Now and then, try to move a directory into itself: that must fail with EINVAL.
        if self.rng.gen_ratio(1, 10) {
            let inside: Vec<String> = self
                .dirs
                .iter()
                .filter(|d| is_within(d, &from))
                .cloned()
                .collect();
            let target_parent = inside[self.rng.gen_range(0..inside.len())].clone();
            let to = join(&target_parent, &self.fresh_dir_name());
            return match self.store.rename(&from, &to) {
                Ok(()) if !self.p.shared => Err(Failure::Violation(format!(
                    "rename {from} -> {to} (into itself) succeeded"
                ))),
                Ok(()) => Ok(()),
                Err(e) if e.errno() == libc::EINVAL => Ok(()),
                Err(e) => self.tolerate(&format!("rename {from} -> {to} (into itself)"), &e, &[]),
            };
        }

        let parents: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| !is_within(d, &from))
            .cloned()
            .collect();
        if parents.is_empty() {
            return Ok(());
        }
        let target_parent = parents[self.rng.gen_range(0..parents.len())].clone();
        // Sometimes replace an existing empty directory.
        let empty_targets: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| parent(d) == target_parent && **d != target_parent && **d != from)
            .filter(|d| !is_within(&target_parent, d))
            .filter(|d| {
                let prefix = format!("{d}/");
                !self.dirs.iter().any(|x| x.starts_with(&prefix))
                    && !self.files.keys().any(|x| x.starts_with(&prefix))
            })
            .cloned()
            .collect();
        let to = if !empty_targets.is_empty() && self.rng.gen_bool(0.3) {
            empty_targets[self.rng.gen_range(0..empty_targets.len())].clone()
        } else {
            join(&target_parent, &self.fresh_dir_name())
        };
        if to == from {
            return Ok(());
        }
        match self.store.rename(&from, &to) {
            Ok(()) => {
                self.move_tree(&from, &to);
                Ok(())
            }
            Err(e) => {
                // With others moving directories too, ours may have become an ancestor of
                // the target since the last listing.
                let expected: &[i32] = if self.p.shared { &[libc::EINVAL] } else { &[] };
                self.tolerate(&format!("rename {from} -> {to}"), &e, expected)
            }
        }
    }

    fn move_tree(&mut self, from: &str, to: &str) {
        let moved = |p: &str| format!("{to}{}", &p[from.len()..]);
        self.dirs.remove(to);
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| is_within(d, from))
            .cloned()
            .collect();
        for d in dirs {
            self.dirs.remove(&d);
            self.dirs.insert(moved(&d));
        }
        let files: Vec<String> = self
            .files
            .keys()
            .filter(|f| is_within(f, from))
            .cloned()
            .collect();
        for f in files {
            if let Some(m) = self.files.remove(&f) {
                self.files.insert(moved(&f), m);
            }
        }
    }

    fn op_unlink(&mut self) -> Outcome {
        let Some((path, _)) = self.random_file() else {
            return Ok(());
        };
        self.stats.unlinks += 1;
        match self.store.unlink(&path) {
            Ok(()) => {
                self.files.remove(&path);
                Ok(())
            }
            Err(e) => {
                self.files.remove(&path);
                self.tolerate(&format!("unlink {path}"), &e, &[])
            }
        }
    }

    fn op_mkdir(&mut self) -> Outcome {
        let parents: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| self.depth(d) < self.p.max_depth)
            .cloned()
            .collect();
        if parents.is_empty() {
            return Ok(());
        }
        let p = parents[self.rng.gen_range(0..parents.len())].clone();
        let path = join(&p, &self.fresh_dir_name());
        self.stats.mkdirs += 1;
        match self.store.mkdir(&path, 0o755) {
            Ok(()) => {
                self.dirs.insert(path);
                Ok(())
            }
            Err(e) => self.tolerate(&format!("mkdir {path}"), &e, &[libc::ENOSPC]),
        }
    }

    fn op_rmdir(&mut self) -> Outcome {
        let candidates: Vec<String> = self
            .dirs
            .iter()
            .filter(|d| **d != self.p.root)
            .cloned()
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let path = candidates[self.rng.gen_range(0..candidates.len())].clone();
        let prefix = format!("{path}/");
        let empty = !self.dirs.iter().any(|d| d.starts_with(&prefix))
            && !self.files.keys().any(|f| f.starts_with(&prefix));
        self.stats.rmdirs += 1;
        match self.store.rmdir(&path) {
            Ok(()) if !empty && !self.p.shared => Err(Failure::Violation(format!(
                "rmdir {path} succeeded on a non-empty directory"
            ))),
            Ok(()) => {
                self.dirs.remove(&path);
                Ok(())
            }
            Err(e) if !empty && e.errno() == libc::ENOTEMPTY => Ok(()),
            Err(e) => self.tolerate(&format!("rmdir {path}"), &e, &[]),
        }
    }

    fn op_read(&mut self) -> Outcome {
        let Some((path, seed)) = self.random_file() else {
            return Ok(());
        };
        self.stats.reads += 1;
        if !self.p.shared {
            return self.verify_file(&path);
        }
        // Others may be changing the file: only the pattern-or-zero rule holds.
        let file = match self.store.open(&path, &OpenOptions::new()) {
            Ok(f) => f,
            Err(e) => return self.tolerate(&format!("open {path}"), &e, &[]),
        };
        let mut buf = vec![0u8; 64 << 10];
        let mut off = 0u64;
        loop {
            match file.read_at(&mut buf, off) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    self.check_shared_read(&file, &path, seed, off, &buf[..n])?;
                    off += n as u64;
                    if off > self.p.max_file_size {
                        return Err(Failure::Violation(format!(
                            "{path}: read past the maximum file size"
                        )));
                    }
                }
                Err(e) => return self.tolerate(&format!("read {path}"), &e, &[]),
            }
        }
    }

    /// Shared mode: checks bytes just read at `off` against the pattern-or-zero rule.
    ///
    /// Reads take no lock, and docs/store-layout.md ("Concurrency within one file") allows a
    /// read racing another process's truncate or unlink of the same file to return bytes of
    /// a chunk that was freed and reused meanwhile. So a mismatch is read again: if the
    /// second read is consistent it is counted as such a race (and reported on stderr);
    /// if the wrong bytes are still there, it is a violation.
    fn check_shared_read(
        &mut self,
        file: &cascade_store::File,
        path: &str,
        seed: u64,
        off: u64,
        data: &[u8],
    ) -> Outcome {
        let Err(first) = check_pattern_or_zero(seed, off, data) else {
            return Ok(());
        };
        let mut again = vec![0u8; data.len()];
        match file.read_at(&mut again, off) {
            Ok(n) => match check_pattern_or_zero(seed, off, &again[..n]) {
                Ok(()) => {
                    self.stats.racy_reads += 1;
                    eprintln!("cascade-torture: racy read of {path} (gone on re-read): {first}");
                    Ok(())
                }
                Err(m) => Err(Failure::Violation(format!("{path}: {m} (read twice)"))),
            },
            Err(e) => {
                self.stats.racy_reads += 1;
                self.tolerate(&format!("re-read {path}"), &e, &[])
            }
        }
    }

    // ----- model ----------------------------------------------------------------------

    fn read_whole(&self, path: &str, size: u64) -> Result<Vec<u8>, Failure> {
        if size > self.p.max_file_size {
            return Err(Failure::Violation(format!(
                "{path}: size {size} exceeds the maximum file size {}",
                self.p.max_file_size
            )));
        }
        let file = self
            .store
            .open(path, &OpenOptions::new())
            .map_err(|e| Failure::Unexpected(format!("open {path}: {}", describe(&e))))?;
        let mut data = vec![0u8; size as usize + 1];
        let mut off = 0usize;
        while off < data.len() {
            let n = file
                .read_at(&mut data[off..], off as u64)
                .map_err(|e| Failure::Unexpected(format!("read {path}: {}", describe(&e))))?;
            if n == 0 {
                break;
            }
            off += n;
        }
        if off as u64 != size {
            return Err(Failure::Violation(format!(
                "{path}: size is {size} but reading returned {off} bytes"
            )));
        }
        data.truncate(off);
        Ok(data)
    }

    /// Compares one file's size and every byte with the model.
    fn verify_file(&mut self, path: &str) -> Outcome {
        let Some(m) = self.files.get(path).cloned() else {
            return Ok(());
        };
        let meta = self
            .store
            .stat(path)
            .map_err(|e| Failure::Violation(format!("stat {path}: {}", describe(&e))))?;
        if meta.kind != FileKind::File || meta.size != m.size {
            return Err(Failure::Violation(format!(
                "{path}: store says {:?} of {} bytes, model says a file of {} bytes",
                meta.kind, meta.size, m.size
            )));
        }
        let data = self.read_whole(path, m.size)?;
        let want = m.extents.expected(m.seed, 0, m.size as usize);
        check_exact(0, &data, &want).map_err(|e| Failure::Violation(format!("{path}: {e}")))
    }

    /// Compares the whole tree and every byte with the model.
    pub fn verify_all(&mut self) -> Outcome {
        if self.p.shared {
            return Ok(());
        }
        self.stats.verifies += 1;
        let (dirs, files) = walk(self.store, &self.p.root)
            .map_err(|e| Failure::Violation(format!("walk {}: {}", self.p.root, describe(&e))))?;
        let dirs: BTreeSet<String> = dirs.into_iter().collect();
        if dirs != self.dirs {
            let extra: Vec<_> = dirs.difference(&self.dirs).collect();
            let missing: Vec<_> = self.dirs.difference(&dirs).collect();
            return Err(Failure::Violation(format!(
                "directories differ from the model: unexpected {extra:?}, missing {missing:?}"
            )));
        }
        let paths: BTreeSet<String> = files.into_iter().map(|(p, _)| p).collect();
        let model: BTreeSet<String> = self.files.keys().cloned().collect();
        if paths != model {
            let extra: Vec<_> = paths.difference(&model).collect();
            let missing: Vec<_> = model.difference(&paths).collect();
            return Err(Failure::Violation(format!(
                "files differ from the model: unexpected {extra:?}, missing {missing:?}"
            )));
        }
        for path in model {
            self.verify_file(&path)?;
        }
        Ok(())
    }

    /// Exclusive mode: builds the model from what the root holds (left by an earlier, maybe
    /// killed, writer), checking on the way that it is consistent.
    fn adopt(&mut self) -> Outcome {
        let (dirs, _) = walk(self.store, &self.p.root)
            .map_err(|e| Failure::Unexpected(format!("walk {}: {}", self.p.root, describe(&e))))?;
        self.dirs = dirs.into_iter().collect();
        self.files.clear();
        for dir in self.dirs.clone() {
            let entries = self
                .store
                .read_dir(&dir)
                .map_err(|e| Failure::Unexpected(format!("read_dir {dir}: {}", describe(&e))))?;
            for entry in entries.into_iter().filter(|e| e.kind == FileKind::File) {
                let path = join(&dir, &entry.name);
                let seed = parse_file_name(&entry.name).ok_or_else(|| {
                    Failure::Violation(format!("{path}: a file whose name is not s<seed>"))
                })?;
                let size = self
                    .store
                    .stat(&path)
                    .map_err(|e| Failure::Violation(format!("stat {path}: {}", describe(&e))))?
                    .size;
                let data = self.read_whole(&path, size)?;
                check_pattern_or_zero(seed, 0, &data)
                    .map_err(|m| Failure::Violation(format!("{path}: {m}")))?;
                let mut extents = Extents::new();
                let mut i = 0;
                while i < data.len() {
                    if data[i] == 0 {
                        i += 1;
                        continue;
                    }
                    let start = i;
                    while i < data.len() && data[i] != 0 {
                        i += 1;
                    }
                    extents.add(start as u64, i as u64);
                }
                self.files.insert(
                    path,
                    FileModel {
                        seed,
                        size,
                        extents,
                    },
                );
            }
        }
        Ok(())
    }

    /// Shared mode: reloads the listing of the tree.
    fn refresh(&mut self) -> Outcome {
        let (dirs, files) = walk(self.store, &self.p.root)
            .map_err(|e| Failure::Unexpected(format!("walk {}: {}", self.p.root, describe(&e))))?;
        self.dirs = dirs.into_iter().collect();
        self.files = files
            .into_iter()
            .map(|(path, seed)| {
                (
                    path,
                    FileModel {
                        seed,
                        size: 0,
                        extents: Extents::new(),
                    },
                )
            })
            .collect();
        Ok(())
    }
}
