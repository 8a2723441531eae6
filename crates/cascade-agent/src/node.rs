//! What every level works with: the node store, the durable store, the options, the
//! counters, and the agent's memory of file versions (their BLAKE3, their failed sends).
//!
//! The block is the only state that matters (`mark_durable`, `mark_complete`, ...); what is
//! kept here is a cache a restarted agent rebuilds (digests from `.blake3` objects or the
//! store) or may lose (retry delays).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_durable::{DurableKey, DurableStore, MarkerFile};
use cascade_store::{FileKind, LifeEntry, OpenOptions, Store};

use crate::options::{AgentOptions, AgentStats};
use crate::reader::StoreFileReader;
use crate::{Error, Result};

/// A committed checkpoint root with its files, from one snapshot.
pub(crate) struct Checkpoint<'a> {
    pub(crate) root: &'a LifeEntry,
    pub(crate) files: Vec<&'a LifeEntry>,
}

impl Checkpoint<'_> {
    /// A file below it is open for writing or torn: it cannot be stored whole yet.
    pub(crate) fn busy(&self) -> bool {
        self.files.iter().any(|f| f.writers > 0 || f.torn)
    }
}

/// The path of file `f` relative to its checkpoint `root` (its base name for a checkpoint
/// that is a single file), as markers and manifests record it.
pub(crate) fn path_in_checkpoint(root: &LifeEntry, f: &LifeEntry) -> String {
    if root.kind == FileKind::File {
        f.path.rsplit('/').next().unwrap_or(&f.path).to_string()
    } else {
        f.path[root.path.len()..]
            .trim_start_matches('/')
            .to_string()
    }
}

/// Names of the durable layout, and files being fetched: never sent down.
pub(crate) fn reserved(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    cascade_durable::is_reserved_name(base) || crate::store_write::is_fetch_temp(base)
}

/// The level a checkpoint stored whole reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reached {
    /// The durable store (the dedup repository): the checkpoint is complete.
    Durable,
    /// Staging servers: the checkpoint is pushed, a server completes it.
    Staged,
}

/// Retry bookkeeping of one file or checkpoint incarnation.
struct Retry {
    attempts: u32,
    not_before: Instant,
}

/// The node's stores, options and counters, shared by the agent and its levels.
pub(crate) struct Node {
    pub(crate) store: Store,
    pub(crate) durable: Arc<DurableStore>,
    pub(crate) opts: AgentOptions,
    stats: Mutex<AgentStats>,
    /// BLAKE3 of versions sent down: (ino, generation, mod_seq) -> hex.
    digests: Mutex<HashMap<(u64, u32, u64), String>>,
    retries: Mutex<HashMap<(u64, u32), Retry>>,
    stop: AtomicBool,
}

impl Node {
    pub(crate) fn new(
        store: Store,
        durable: Arc<DurableStore>,
        opts: AgentOptions,
        stats: AgentStats,
    ) -> Node {
        Node {
            store,
            durable,
            opts,
            stats: Mutex::new(stats),
            digests: Mutex::new(HashMap::new()),
            retries: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        }
    }

    pub(crate) fn stats(&self) -> AgentStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Updates the counters (a poisoned lock only loses counts).
    pub(crate) fn count(&self, update: impl FnOnce(&mut AgentStats)) {
        if let Ok(mut s) = self.stats.lock() {
            update(&mut s);
        }
    }

    pub(crate) fn log(&self, line: impl FnOnce() -> String) {
        if self.opts.verbose {
            cascade_observe::info!("cascade agent: {}", line());
        }
    }

    pub(crate) fn record_failure(&self, what: String) {
        cascade_observe::warn!("cascade agent: {what}");
        let now = cascade_observe::metrics::unix_seconds(std::time::SystemTime::now());
        self.count(|s| {
            s.failures += 1;
            s.last_error = Some(what);
            s.last_error_time = Some(now);
        });
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Once a cache holds more entries than the store has (`tree`: the whole store), drops
    /// what it holds of versions the store no longer has: digests of files removed or
    /// changed since, retries of removed incarnations. Without this a long job writing new
    /// files would grow them for ever.
    pub(crate) fn prune_caches(&self, tree: &[LifeEntry]) {
        let sizes = |d: &HashMap<_, _>, r: &HashMap<_, _>| (d.len(), r.len());
        let (digests, retrying) = match (self.digests.lock(), self.retries.lock()) {
            (Ok(d), Ok(r)) => sizes(&d, &r),
            _ => return,
        };
        // Both hold at most an entry per file of the store unless something went stale: only
        // then is the store's tree worth indexing (not on every pass).
        if digests <= tree.len() && retrying <= tree.len() {
            self.count(|s| {
                s.cached_digests = digests as u64;
                s.retrying = retrying as u64;
            });
            return;
        }
        let versions: std::collections::HashSet<(u64, u32, u64)> = tree
            .iter()
            .map(|e| (e.ino, e.generation, e.mod_seq))
            .collect();
        let incarnations: std::collections::HashSet<(u64, u32)> =
            tree.iter().map(|e| (e.ino, e.generation)).collect();
        let digests = self.digests.lock().map_or(0, |mut d| {
            d.retain(|key, _| versions.contains(key));
            d.len()
        });
        let retrying = self.retries.lock().map_or(0, |mut r| {
            r.retain(|key, _| incarnations.contains(key));
            r.len()
        });
        self.count(|s| {
            s.cached_digests = digests as u64;
            s.retrying = retrying as u64;
        });
    }

    /// When a failed `e` may be tried again, if that is after `now`.
    pub(crate) fn retry_not_before(&self, e: &LifeEntry, now: Instant) -> Option<Instant> {
        self.retries
            .lock()
            .ok()
            .and_then(|r| r.get(&(e.ino, e.generation)).map(|r| r.not_before))
            .filter(|&t| t > now)
    }

    pub(crate) fn forget_retry(&self, e: &LifeEntry) {
        if let Ok(mut r) = self.retries.lock() {
            r.remove(&(e.ino, e.generation));
        }
    }

    /// Records one more failure of `e`: its attempt count and the delay before the next
    /// (exponential from `retry_min` to `retry_max`).
    pub(crate) fn schedule_retry(&self, e: &LifeEntry) -> (u32, Duration) {
        let Ok(mut retries) = self.retries.lock() else {
            return (1, self.opts.retry_min);
        };
        let r = retries.entry((e.ino, e.generation)).or_insert(Retry {
            attempts: 0,
            not_before: Instant::now(),
        });
        r.attempts += 1;
        let factor = 1u32 << (r.attempts - 1).min(16);
        let delay = (self.opts.retry_min * factor).min(self.opts.retry_max);
        r.not_before = Instant::now() + delay;
        (r.attempts, delay)
    }

    /// Opens the file `e` of a snapshot for reading; None if it was removed or replaced since.
    pub(crate) fn open_snapshot_file(&self, e: &LifeEntry) -> Result<Option<cascade_store::File>> {
        let file = match self.store.open(&e.path, &OpenOptions::new()) {
            Ok(f) => f,
            Err(err) if err.errno() == libc::ENOENT => return Ok(None),
            Err(err) => return Err(Error::store(&e.path, err)),
        };
        Ok((file.ino() == e.ino && file.generation() == e.generation).then_some(file))
    }

    /// A fresh look at checkpoint `root` (the pass's snapshot may be older than its sends):
    /// its tree, root first, or None if it is gone or was replaced.
    pub(crate) fn fresh_tree(&self, root: &LifeEntry) -> Result<Option<Vec<LifeEntry>>> {
        let tree = match self.store.life_tree(&root.path) {
            Ok(t) => t,
            Err(e) if e.errno() == libc::ENOENT => return Ok(None),
            Err(e) => return Err(Error::store(&root.path, e)),
        };
        let same = tree[0].ino == root.ino && tree[0].generation == root.generation;
        Ok(same.then_some(tree))
    }

    /// A fresh snapshot of checkpoint `root` (root first) if every file below it is closed,
    /// whole and not a reserved name: what a checkpoint stored whole is read from. None if
    /// it went away, was replaced, or is being written.
    pub(crate) fn closed_checkpoint(&self, root: &LifeEntry) -> Result<Option<Vec<LifeEntry>>> {
        let Some(tree) = self.fresh_tree(root)? else {
            return Ok(None);
        };
        let busy = files_of(&tree).any(|f| f.writers > 0 || f.torn || reserved(&f.path));
        Ok((!busy).then_some(tree))
    }

    /// The marker entries of checkpoint `root` (whose files are `files`): whether it is a
    /// single file, and each file's path relative to it, size and BLAKE3.
    pub(crate) fn marker_entries(
        &self,
        root: &LifeEntry,
        files: &[&LifeEntry],
    ) -> Result<(bool, Vec<MarkerFile>)> {
        let single_file = root.kind == FileKind::File;
        let mut entries = Vec::with_capacity(files.len());
        for f in files {
            entries.push(MarkerFile {
                path: path_in_checkpoint(root, f),
                size: f.size,
                blake3: self.digest_of(f)?,
            });
        }
        Ok((single_file, entries))
    }

    pub(crate) fn remember_digest(&self, f: &LifeEntry, blake3: String) {
        if let Ok(mut d) = self.digests.lock() {
            d.insert((f.ino, f.generation, f.mod_seq), blake3);
        }
    }

    /// The BLAKE3 of a file version below memory: remembered from its upload or staging,
    /// else its checksum object (uploaded by an earlier agent), else computed from the
    /// store (a version an earlier agent staged).
    pub(crate) fn digest_of(&self, f: &LifeEntry) -> Result<String> {
        if let Some(d) = self
            .digests
            .lock()
            .ok()
            .and_then(|d| d.get(&(f.ino, f.generation, f.mod_seq)).cloned())
        {
            return Ok(d);
        }
        if f.staged() {
            let digest = self.hash_from_store(f)?;
            self.remember_digest(f, digest.clone());
            return Ok(digest);
        }
        self.durable
            .recorded_checksum(&DurableKey::from_store_path(&f.path))
            .map_err(Error::Durable)
    }

    fn hash_from_store(&self, f: &LifeEntry) -> Result<String> {
        let file = self
            .store
            .open(&f.path, &OpenOptions::new())
            .map_err(|e| Error::store(&f.path, e))?;
        let mut reader =
            StoreFileReader::new(&self.store, &file).map_err(|e| Error::store(&f.path, e))?;
        let mut hasher = blake3::Hasher::new();
        std::io::copy(&mut reader, &mut hasher).map_err(|e| Error::io(&f.path, e))?;
        Ok(hasher.finalize().to_hex().to_string())
    }

    /// Records the files of a checkpoint stored whole (`root`, its `files` and their BLAKE3
    /// in order) as having reached `level`, then the root (durable: complete; staged:
    /// pushed); false if any of it changed meanwhile.
    pub(crate) fn record_whole<'d>(
        &self,
        root: &LifeEntry,
        files: &[&LifeEntry],
        digests: impl IntoIterator<Item = &'d str>,
        level: Reached,
    ) -> bool {
        let store = &self.store;
        self.record_files(files, digests, level)
            && match level {
                Reached::Durable => store.mark_complete(root.ino, root.generation, root.mod_seq),
                Reached::Staged => store.mark_pushed(root.ino, root.generation, root.mod_seq),
            }
    }

    /// Records `files` (with their BLAKE3, in order) as having reached `level`, but not their
    /// checkpoint: a node's part of a job's checkpoint, which the job level completes.
    /// False if any of them changed meanwhile.
    pub(crate) fn record_files<'d>(
        &self,
        files: &[&LifeEntry],
        digests: impl IntoIterator<Item = &'d str>,
        level: Reached,
    ) -> bool {
        let store = &self.store;
        let mut unchanged = true;
        for (f, blake3) in files.iter().zip(digests) {
            unchanged &= match level {
                Reached::Durable => store.mark_durable(f.ino, f.generation, f.mod_seq),
                Reached::Staged => store.mark_staged(f.ino, f.generation, f.mod_seq),
            };
            self.remember_digest(f, blake3.to_string());
        }
        unchanged
    }

    /// Records every file of `tree` (a checkpoint, root first) durable, then the root
    /// complete; false if the root changed since `tree` was taken. For checkpoints a lower
    /// level completed on its own (a staging server wrote the marker or manifest).
    pub(crate) fn record_complete(&self, tree: &[LifeEntry]) -> bool {
        self.record_durable(tree);
        let root = &tree[0];
        self.store
            .mark_complete(root.ino, root.generation, root.mod_seq)
    }

    /// Records every file of `tree` (a checkpoint, root first) durable, at the versions it
    /// lists; false if one changed since.
    pub(crate) fn record_durable(&self, tree: &[LifeEntry]) -> bool {
        let mut unchanged = true;
        for f in files_of(tree) {
            unchanged &= self.store.mark_durable(f.ino, f.generation, f.mod_seq);
        }
        unchanged
    }
}

/// The files of a snapshot.
pub(crate) fn files_of(tree: &[LifeEntry]) -> impl Iterator<Item = &LifeEntry> {
    tree.iter().filter(|e| e.kind == FileKind::File)
}
