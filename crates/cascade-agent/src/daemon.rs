//! The node agent (docs/agent.md): one per node store. It uploads every file closed after
//! writing, writes the completion marker of each committed checkpoint once all its files are
//! durable, evicts old checkpoints (only durable ones) and serves read-through fetches.
//!
//! The agent keeps no state of its own that matters: what is durable is recorded in the
//! block (`mark_durable`, `mark_complete`), so a restarted agent carries on where a killed one
//! stopped, and a marker is only ever written after the data and checksums it lists.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cascade_durable::{DurableStore, FileDigest, MarkerFile, SINGLE_PUT_MAX};
use cascade_store::{AgentRegistration, FileKind, LifeEntry, OpenOptions, Store};
use serde::{Deserialize, Serialize};

use crate::dedup::DedupOptions;
use crate::reader::StoreFileReader;
use crate::staging::{Staging, StagingOptions};
use crate::{Error, Result};

/// What the agent does and how hard it may work.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Files uploaded at once (each by its own thread).
    pub uploads: usize,
    /// Newest committed checkpoints of each directory kept in memory.
    pub keep: usize,
    /// Every Nth commit is flushed to the durable tier.
    pub flush_every: u32,
    /// How long writers on a full store wait for the agent.
    pub full_wait: Duration,
    /// Safety rescan (and sweep of dead writers) when nothing wakes the agent.
    pub rescan: Duration,
    /// Backoff after a failed upload: first and longest delay.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Print one line per event (uploads, markers, evictions, failures) on stderr.
    pub verbose: bool,
    /// Staging servers (L1) to send files to instead of the durable tier.
    pub staging: Option<StagingOptions>,
    /// Store committed checkpoints in the durable store's dedup repository (chunks stored
    /// once, compressed) instead of as plain files.
    pub dedup: Option<DedupOptions>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            uploads: 1,
            keep: 2,
            flush_every: 1,
            full_wait: Duration::from_secs(60),
            rescan: Duration::from_secs(2),
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            verbose: false,
            staging: None,
            dedup: None,
        }
    }
}

/// Counters since the agent started (the `STATUS` reply and `cascade status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentStats {
    pub pid: u32,
    pub durable: String,
    /// The staging servers, if any ("" = none).
    #[serde(default)]
    pub staging: String,
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    /// Files acknowledged by a staging server.
    #[serde(default)]
    pub staged_files: u64,
    #[serde(default)]
    pub staged_bytes: u64,
    pub markers: u64,
    pub evicted_checkpoints: u64,
    pub evicted_bytes: u64,
    pub fetched_files: u64,
    pub fetched_bytes: u64,
    pub failures: u64,
    /// Files waiting for upload at the end of the last pass (not counting files in writing).
    pub pending_files: u64,
    pub pending_bytes: u64,
    pub last_error: Option<String>,
    /// Store paths being uploaded right now.
    pub uploading: Vec<String>,
    /// Checkpoints stored in the dedup repository, their file bytes, the bytes of chunks the
    /// repository lacked, and what those took in packs (compressed where it paid).
    #[serde(default)]
    pub dedup_checkpoints: u64,
    #[serde(default)]
    pub dedup_bytes: u64,
    #[serde(default)]
    pub dedup_new_bytes: u64,
    #[serde(default)]
    pub dedup_stored_bytes: u64,
    /// Of the chunks stored, those stored as deltas against the previous checkpoint.
    #[serde(default)]
    pub dedup_delta_chunks: u64,
}

/// A piece of the store's data region handed to the HTTP client as a request body; the
/// store clone keeps the mapping alive for as long as the client holds the buffer.
struct ShmPiece {
    _store: Store,
    addr: usize,
    len: usize,
}

impl AsRef<[u8]> for ShmPiece {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `addr..addr + len` lies inside the data region (checked by
        // `StoreFileReader::memory_pieces`), which stays mapped while `_store` lives. The
        // chunk belongs to a closed file; if it is rewritten meanwhile the upload is not
        // recorded as durable (its version changed), so torn bytes are never acknowledged.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// Retry bookkeeping of one file incarnation.
struct Retry {
    attempts: u32,
    not_before: Instant,
}

/// A checkpoint root with its files, from one snapshot.
pub(crate) struct Checkpoint<'a> {
    pub(crate) root: &'a LifeEntry,
    pub(crate) files: Vec<&'a LifeEntry>,
}

/// The node agent. Create with [`Agent::start`], run with [`Agent::run`] (or call
/// [`Agent::pass`] / [`Agent::drain`] yourself), stop with [`Agent::stop`].
pub struct Agent {
    store: Store,
    durable: Arc<DurableStore>,
    opts: AgentOptions,
    pub(crate) stats: Mutex<AgentStats>,
    /// BLAKE3 of uploaded versions: (ino, generation, mod_seq) -> hex.
    digests: Mutex<HashMap<(u64, u32, u64), String>>,
    retries: Mutex<HashMap<(u64, u32), Retry>>,
    /// Store paths being fetched right now, so concurrent requests share one download.
    pub(crate) fetching: Mutex<HashSet<String>>,
    pub(crate) fetched: Condvar,
    stop: AtomicBool,
    last_sweep: Mutex<Instant>,
    staging: Option<Staging>,
    /// The dedup repository, opened at first use.
    pub(crate) repo: Mutex<Option<Arc<cascade_dedup::repo::Repo>>>,
    /// Per series (directory), the checkpoint last stored in the repository and its files'
    /// recipes (from its manifest): the base of the next one's deltas, without a read.
    pub(crate) latest_manifests:
        Mutex<HashMap<String, (String, Vec<cascade_dedup::repo::FileRecipe>)>>,
    _registration: AgentRegistration,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassOutcome {
    /// Something changed (an upload, a marker, an eviction): look again at once.
    pub progressed: bool,
    /// Files or markers still to do that could be done now or after a retry delay.
    pub pending: usize,
    /// Files being written, or torn, below a checkpoint to flush (waiting on the application).
    pub blocked: usize,
    /// When the earliest failed upload may be retried (or staging servers asked again).
    pub next_retry: Option<Instant>,
    /// Files and checkpoints safe on staging servers, not yet in the durable tier.
    pub staged: usize,
}

impl PassOutcome {
    /// Something failed and may be retried at `t`.
    pub(crate) fn retry_at(&mut self, t: Instant) {
        self.next_retry = Some(self.next_retry.map_or(t, |n| n.min(t)));
    }
}

pub(crate) fn key_of(store_path: &str) -> &str {
    store_path.trim_start_matches('/')
}

/// Names of the durable layout, and files being fetched: never uploaded or staged.
fn reserved(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    cascade_durable::is_reserved_name(base) || crate::control::is_fetch_temp(base)
}

impl Agent {
    /// Registers as the store's agent (EBUSY if another one runs), sets the store's policy,
    /// and frees descriptions of writers that died before it started.
    pub fn start(store: Store, durable: DurableStore, opts: AgentOptions) -> Result<Agent> {
        let registration = store
            .register_agent()
            .map_err(|e| Error::store(store.name(), e))?;
        store.set_policy(opts.flush_every, opts.full_wait);
        store.sweep_descriptions();
        let staging = opts
            .staging
            .clone()
            .filter(|s| !s.servers.is_empty())
            .map(Staging::new);
        let stats = AgentStats {
            pid: std::process::id(),
            durable: durable.name().to_string(),
            staging: staging.as_ref().map(|s| s.describe()).unwrap_or_default(),
            ..AgentStats::default()
        };
        Ok(Agent {
            store,
            durable: Arc::new(durable),
            opts,
            stats: Mutex::new(stats),
            digests: Mutex::new(HashMap::new()),
            retries: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashSet::new()),
            fetched: Condvar::new(),
            stop: AtomicBool::new(false),
            last_sweep: Mutex::new(Instant::now()),
            staging,
            repo: Mutex::new(None),
            latest_manifests: Mutex::new(HashMap::new()),
            _registration: registration,
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn durable(&self) -> &DurableStore {
        &self.durable
    }

    pub(crate) fn durable_arc(&self) -> &Arc<DurableStore> {
        &self.durable
    }

    pub fn options(&self) -> &AgentOptions {
        &self.opts
    }

    pub fn stats(&self) -> AgentStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(crate) fn log(&self, line: impl FnOnce() -> String) {
        if self.opts.verbose {
            eprintln!("cascade agent: {}", line());
        }
    }

    pub(crate) fn staging(&self) -> Option<&Staging> {
        self.staging.as_ref()
    }

    pub(crate) fn record_failure(&self, what: String) {
        eprintln!("cascade agent: {what}");
        if let Ok(mut s) = self.stats.lock() {
            s.failures += 1;
            s.last_error = Some(what);
        }
    }

    /// Asks [`Agent::run`] to return (from any thread).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.store.wake_agent();
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Works until [`Agent::stop`]: a pass whenever the store calls (a file closed after
    /// writing, a commit, a writer waiting for space), after a retry delay, or every
    /// `rescan`.
    pub fn run(&self) {
        while !self.stopping() {
            let seen = self.store.work_counter();
            let outcome = self.pass();
            if outcome.progressed || self.stopping() {
                continue;
            }
            let mut wait = self.opts.rescan;
            if let Some(at) = outcome.next_retry {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            self.store.wait_for_work(seen, wait);
        }
    }

    /// Passes until nothing flushable is left to upload or mark (the end of a job), or
    /// `timeout`. Files still being written or torn are not waited for; they are reported.
    pub fn drain(&self, timeout: Duration) -> Result<PassOutcome> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.store.work_counter();
            let outcome = self.pass();
            if outcome.pending == 0 {
                return Ok(outcome);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "draining to {}: {} item(s) still pending; last error: {}",
                        self.durable.name(),
                        outcome.pending,
                        self.stats()
                            .last_error
                            .unwrap_or_else(|| "none".to_string())
                    ),
                });
            }
            if !outcome.progressed {
                let mut wait = deadline - now;
                if let Some(at) = outcome.next_retry {
                    wait = wait.min(at.saturating_duration_since(now));
                }
                self.store
                    .wait_for_work(seen, wait.min(Duration::from_millis(200)));
            }
        }
    }

    /// One look at the whole store: upload what is ready, write the markers that are due,
    /// evict what retention allows.
    pub fn pass(&self) -> PassOutcome {
        let mut outcome = PassOutcome::default();
        let tree = match self.store.life_tree("/") {
            Ok(t) => t,
            Err(e) => {
                self.record_failure(format!("cannot read the store: {e}"));
                return outcome;
            }
        };
        self.sweep_if_due(&tree);
        let checkpoints = checkpoints_of(&tree);
        let root_of = |e: &LifeEntry| -> Option<&Checkpoint> {
            checkpoints.iter().find(|c| e.is_at_or_below(&c.root.path))
        };
        // Files go down as soon as they are closed, before their checkpoint is committed —
        // except with dedup, where a checkpoint is stored whole once committed.
        let eager = self.opts.flush_every <= 1 && self.opts.dedup.is_none();

        // 1. Uploads: closed files that are not durable and are meant for the durable tier.
        let now = Instant::now();
        let mut ready: Vec<&LifeEntry> = Vec::new();
        let mut stale_markers: Vec<&LifeEntry> = Vec::new();
        for e in tree.iter().filter(|e| e.kind == FileKind::File) {
            let below = e.durable() || (self.staging.is_some() && e.safe());
            if below || reserved(&e.path) {
                continue;
            }
            let root = root_of(e);
            let wanted = match root {
                // With dedup, a checkpoint goes into the repository whole (step 2).
                Some(c) => c.root.flush && self.opts.dedup.is_none(),
                None => eager,
            };
            if !wanted {
                continue;
            }
            if e.writers > 0 || e.torn {
                outcome.blocked += 1;
                continue;
            }
            outcome.pending += 1;
            if let Some(c) = root {
                let marked = c.root.complete_flag || c.root.pushed_flag;
                if marked && !stale_markers.iter().any(|r| r.ino == c.root.ino) {
                    stale_markers.push(c.root);
                }
            }
            match self.retry_not_before(e, now) {
                Some(t) => outcome.retry_at(t),
                None => ready.push(e),
            }
        }
        for root in stale_markers {
            // The durable copy is about to change: its old marker must go first.
            self.store.clear_complete(root.ino, root.generation);
            if let Err(e) = self.durable.delete_marker(key_of(&root.path)) {
                self.record_failure(format!(
                    "cannot remove the old marker of {}: {e}",
                    root.path
                ));
                return outcome;
            }
        }
        // Committed checkpoints first, oldest commit first; then everything else by path.
        ready.sort_by_key(|e| {
            let seq = root_of(e).map_or(u64::MAX, |c| c.root.commit_seq);
            (seq, e.path.clone())
        });
        let uploaded = match &self.staging {
            Some(staging) => self.stage_all(staging, &ready),
            None => self.upload_all(&ready),
        };
        if uploaded > 0 {
            outcome.progressed = true;
        }
        if let Some(staging) = &self.staging {
            if self.pull_levels(staging, &tree, false) {
                outcome.progressed = true;
            }
        }

        // 2. Markers of committed, flushed checkpoints whose files are all durable; with
        // staging, checkpoints whose files are all staged are pushed to a server instead.
        for c in checkpoints
            .iter()
            .filter(|c| c.root.flush && !c.root.complete())
        {
            if self.opts.dedup.is_some() {
                self.dedup_pass(c, previous_in_series(&checkpoints, c), &mut outcome);
                continue;
            }
            // With no upload in this pass the snapshot is current: skip the fresh look.
            if uploaded > 0 || c.files.iter().all(|f| f.durable()) {
                match self.complete_checkpoint(c.root) {
                    Ok(true) => {
                        outcome.progressed = true;
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        outcome.pending += 1;
                        self.record_failure(format!(
                            "cannot write the completion marker of {}: {e}",
                            c.root.path
                        ));
                        continue;
                    }
                }
            }
            if let Some(staging) = &self.staging {
                if c.root.checkpoint_safe() {
                    // Its server writes the marker once the files have drained.
                    outcome.staged += 1;
                    continue;
                }
                match self.push_checkpoint(staging, c.root) {
                    Ok(true) => {
                        outcome.progressed = true;
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.record_failure(format!("cannot push checkpoint {}: {e}", c.root.path))
                    }
                }
            }
            outcome.pending += 1;
        }
        if self.staging.is_some() {
            outcome.staged += tree
                .iter()
                .filter(|e| e.kind == FileKind::File && e.staged())
                .count();
            if outcome.staged > 0 {
                // Ask the servers again soon what has drained.
                let at = Instant::now() + crate::staging::PULL_EVERY;
                outcome.retry_at(at);
            }
        }

        // 3. Retention.
        if self.evict(&checkpoints) {
            outcome.progressed = true;
        }
        if let Ok(mut s) = self.stats.lock() {
            s.pending_files = ready.len() as u64;
            s.pending_bytes = ready.iter().map(|e| e.size).sum();
        }
        outcome
    }

    /// Frees descriptions of dead writers now and then, so a file whose writer was killed is
    /// marked torn instead of looking open for ever.
    fn sweep_if_due(&self, tree: &[LifeEntry]) {
        if !tree.iter().any(|e| e.writers > 0) {
            return;
        }
        let Ok(mut last) = self.last_sweep.lock() else {
            return;
        };
        if last.elapsed() >= self.opts.rescan {
            *last = Instant::now();
            self.store.sweep_descriptions();
        }
    }

    /// Uploads `files` with up to `uploads` threads; returns how many became durable.
    pub(crate) fn upload_all(&self, files: &[&LifeEntry]) -> usize {
        if files.is_empty() {
            return 0;
        }
        let next = Mutex::new(0usize);
        let done = Mutex::new(0usize);
        let threads = self.opts.uploads.clamp(1, files.len());
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    if self.stopping() {
                        return;
                    }
                    let i = {
                        let Ok(mut n) = next.lock() else { return };
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(e) = files.get(i) else { return };
                    if self.upload_one(e) {
                        if let Ok(mut d) = done.lock() {
                            *d += 1;
                        }
                    }
                });
            }
        });
        done.into_inner().unwrap_or(0)
    }

    /// Uploads one file version: data straight from the block, then its checksum, then
    /// records it as durable if it did not change meanwhile.
    fn upload_one(&self, e: &LifeEntry) -> bool {
        let key = key_of(&e.path);
        let started = Instant::now();
        if let Ok(mut s) = self.stats.lock() {
            s.uploading.push(e.path.clone());
        }
        let result = (|| -> Result<Option<FileDigest>> {
            // Removed or replaced since the snapshot: nothing to do.
            let Some(file) = self.open_snapshot_file(e)? else {
                return Ok(None);
            };
            let reader = StoreFileReader::new(&self.store, &file)
                .map_err(|err| Error::store(&e.path, err))?;
            let len = reader.len();
            // Announced before the data, so a staging server holding an older version of
            // this name never drains it over this one (docs/durable-layout.md).
            self.durable
                .put_version(key, cascade_durable::now_unix_ns())
                .map_err(Error::Durable)?;
            let digest = match reader.memory_pieces() {
                Some(pieces) if len > 0 && len <= SINGLE_PUT_MAX => {
                    self.put_from_memory(key, &pieces)?
                }
                _ => self
                    .durable
                    .put_file(key, reader, len)
                    .map_err(Error::Durable)?,
            };
            self.durable
                .put_checksum(key, &digest)
                .map_err(Error::Durable)?;
            Ok(Some(digest))
        })();
        if let Ok(mut s) = self.stats.lock() {
            s.uploading.retain(|p| p != &e.path);
        }
        match result {
            Ok(Some(digest)) => {
                self.forget_retry(e);
                if !self.store.mark_durable(e.ino, e.generation, e.mod_seq) {
                    // Changed while uploading: the next pass uploads the new version.
                    return false;
                }
                self.remember_digest(e, digest.blake3.clone());
                if let Ok(mut s) = self.stats.lock() {
                    s.uploaded_files += 1;
                    s.uploaded_bytes += digest.size;
                }
                self.log(|| {
                    format!(
                        "uploaded {} ({} bytes) in {:.3} s",
                        e.path,
                        digest.size,
                        started.elapsed().as_secs_f64()
                    )
                });
                true
            }
            Ok(None) => false,
            Err(err) => {
                let (attempts, delay) = self.schedule_retry(e);
                self.record_failure(format!(
                    "upload of {} failed (attempt {attempts}): {err}; retrying in {:.1} s",
                    e.path,
                    delay.as_secs_f64()
                ));
                false
            }
        }
    }

    /// Uploads a file that is wholly in memory chunks in one request whose body is the
    /// chunks themselves (no copy, no multipart reassembly on the server), hashing it on a
    /// second thread meanwhile.
    fn put_from_memory(&self, key: &str, pieces: &[(usize, usize)]) -> Result<FileDigest> {
        let region = self.store.data_region().addr as usize;
        let parts: Vec<Bytes> = pieces
            .iter()
            .map(|&(offset, len)| {
                Bytes::from_owner(ShmPiece {
                    _store: self.store.clone(),
                    addr: region + offset,
                    len,
                })
            })
            .collect();
        let (put, blake3) = std::thread::scope(|scope| {
            let hashing = scope.spawn(|| {
                let mut hasher = blake3::Hasher::new();
                for p in &parts {
                    hasher.update(p);
                }
                hasher.finalize().to_hex().to_string()
            });
            let put = self.durable.put_buffers(key, parts.clone());
            (put, hashing.join())
        });
        put.map_err(Error::Durable)?;
        let blake3 =
            blake3.map_err(|_| Error::io("hash", std::io::Error::other("hashing failed")))?;
        Ok(FileDigest {
            size: pieces.iter().map(|p| p.1 as u64).sum(),
            blake3,
        })
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

    /// Writes the marker of `root` if every file below it is durable; true if it did.
    fn complete_checkpoint(&self, root: &LifeEntry) -> Result<bool> {
        let Some(tree) = self.fresh_tree(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
        if files
            .iter()
            .any(|f| !f.durable() || f.torn || reserved(&f.path))
        {
            return Ok(false);
        }
        let (single_file, entries) = self.marker_entries(now_root, &files)?;
        let ckpt = key_of(&now_root.path);
        self.durable
            .write_marker_of(ckpt, single_file, entries)
            .map_err(Error::Durable)?;
        if !self
            .store
            .mark_complete(now_root.ino, now_root.generation, now_root.mod_seq)
        {
            // Changed after the check: the marker is stale, take it back.
            self.durable.delete_marker(ckpt).map_err(Error::Durable)?;
            return Ok(false);
        }
        if let Ok(mut s) = self.stats.lock() {
            s.markers += 1;
        }
        self.log(|| {
            format!(
                "checkpoint {} complete ({} files)",
                now_root.path,
                files.len()
            )
        });
        Ok(true)
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

    /// A fresh snapshot of checkpoint `root` (root first) if every file below it is closed,
    /// whole and not a reserved name: what a checkpoint stored whole is read from. None if
    /// it went away, was replaced, or is being written.
    pub(crate) fn closed_checkpoint(&self, root: &LifeEntry) -> Result<Option<Vec<LifeEntry>>> {
        let Some(tree) = self.fresh_tree(root)? else {
            return Ok(None);
        };
        let busy = tree
            .iter()
            .filter(|e| e.kind == FileKind::File)
            .any(|f| f.writers > 0 || f.torn || reserved(&f.path));
        Ok((!busy).then_some(tree))
    }

    /// A fresh look at checkpoint `root` (the pass's snapshot may be older than its uploads):
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
            .recorded_checksum(key_of(&f.path))
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

    /// Retention: per directory, keep the newest `keep` committed checkpoints; evict older
    /// complete ones, and older never-flushed ones once a newer one is complete. While writers
    /// wait for space, evict complete checkpoints oldest first regardless of `keep`.
    fn evict(&self, checkpoints: &[Checkpoint]) -> bool {
        let mut series: BTreeMap<&str, Vec<&Checkpoint>> = BTreeMap::new();
        for c in checkpoints {
            series.entry(c.root.parent_dir()).or_default().push(c);
        }
        let mut evicted = false;
        for list in series.values_mut() {
            list.sort_by_key(|c| std::cmp::Reverse(c.root.commit_seq));
            let newest_safe = list.iter().position(|c| c.root.checkpoint_safe());
            for (i, c) in list.iter().enumerate().skip(self.opts.keep) {
                let superseded = newest_safe.is_some_and(|n| n < i);
                if c.root.checkpoint_safe() {
                    evicted |= self.evict_one(c, false);
                } else if !c.root.flush && superseded {
                    evicted |= self.evict_one(c, true);
                }
            }
        }
        if self.store.space_waiters() > 0 {
            // One checkpoint per call for waiting writers: they retry and call again if that
            // was not enough (and that wake-up, not this pass, starts the next pass).
            let mut complete: Vec<&Checkpoint> = checkpoints
                .iter()
                .filter(|c| c.root.checkpoint_safe())
                .collect();
            complete.sort_by_key(|c| c.root.commit_seq);
            for c in complete {
                if self.evict_one(c, false) {
                    break;
                }
            }
        }
        evicted
    }

    fn evict_one(&self, c: &Checkpoint, allow_incomplete: bool) -> bool {
        match self
            .store
            .evict(&c.root.path, c.root.generation, allow_incomplete)
        {
            Ok(Some(bytes)) => {
                if let Ok(mut s) = self.stats.lock() {
                    s.evicted_checkpoints += 1;
                    s.evicted_bytes += bytes;
                }
                self.log(|| {
                    format!(
                        "evicted {} ({} files, {bytes} bytes) from memory",
                        c.root.path,
                        c.files.len()
                    )
                });
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.record_failure(format!("cannot evict {}: {e}", c.root.path));
                false
            }
        }
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

/// The newest complete checkpoint of `c`'s series (its directory) committed before it, of the
/// same kind (a directory, or a single file): what `c` may be stored as deltas against.
fn previous_in_series<'s, 'a>(
    checkpoints: &'s [Checkpoint<'a>],
    c: &Checkpoint,
) -> Option<&'s Checkpoint<'a>> {
    checkpoints
        .iter()
        .filter(|p| {
            p.root.parent_dir() == c.root.parent_dir()
                && p.root.kind == c.root.kind
                && p.root.commit_seq < c.root.commit_seq
                && p.root.complete()
        })
        .max_by_key(|p| p.root.commit_seq)
}

/// Committed checkpoint roots of a snapshot, each with the files below it.
fn checkpoints_of(tree: &[LifeEntry]) -> Vec<Checkpoint<'_>> {
    tree.iter()
        .filter(|e| e.committed)
        .map(|root| Checkpoint {
            root,
            files: tree
                .iter()
                .filter(|e| e.kind == FileKind::File && e.is_at_or_below(&root.path))
                .collect(),
        })
        .collect()
}
