//! The node agent (docs/agent.md): one per node store. Each pass looks at the whole store,
//! decides what is ready to go down and in which order, and hands it to its levels (staging
//! servers, the durable store's dedup repository or plain layout: `level.rs`); then it lets
//! retention evict what is safe below memory. Read-through (`readthrough.rs`) walks the same
//! levels.
//!
//! The agent keeps no state of its own that matters: what is durable is recorded in the
//! block (`mark_durable`, `mark_complete`), so a restarted agent carries on where a killed one
//! stopped, and a marker is only ever written after the data and checksums it lists.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cascade_durable::DurableKey;
use cascade_durable::DurableStore;
use cascade_store::{AgentRegistration, FileKind, LifeEntry, Store};

use crate::level::{Level, Step, Unit};
use crate::levels::dedup::DedupRepository;
use crate::levels::job::JobParts;
use crate::levels::plain::PlainLayout;
use crate::levels::staged::StagingServers;
use crate::levels::staged_dedup::StagedDedup;
use crate::node::{files_of, reserved, Checkpoint, Node};
use crate::options::{AgentOptions, AgentStats};
use crate::repository::Repository;
use crate::servers::ServerPool;
use crate::{Error, Result};

/// The node agent. Create with [`Agent::start`], run with [`Agent::run`] (or call
/// [`Agent::pass`] / [`Agent::drain`] yourself), stop with [`Agent::stop`].
pub struct Agent {
    pub(crate) node: Node,
    /// Every level below the node store, nearest first.
    pub(crate) levels: Vec<Box<dyn Level>>,
    /// Store paths being fetched right now, so concurrent requests share one download.
    pub(crate) fetching: Mutex<HashSet<String>>,
    pub(crate) fetched: Condvar,
    /// Directories listed from the levels below, and when (readthrough.rs).
    pub(crate) listed: Mutex<HashMap<String, Instant>>,
    last_sweep: Mutex<Instant>,
    /// The last request for space (see [`cascade_store::Store::space_request`]) an eviction
    /// answered.
    served_space_request: Mutex<Option<i64>>,
    /// Held for a whole pass: [`Agent::drain`] (the end of a job) passes while the agent's
    /// own thread may be in one, and a pass from an older snapshot would act on what the
    /// other changed (complete a checkpoint the other evicted, then take its marker back).
    one_pass: Mutex<()>,
    /// Set by [`Agent::drain`] (the end of a job): files outside every checkpoint go down
    /// now even where the route stores only checkpoints (dedup), so none stays behind.
    ending: AtomicBool,
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
    /// Checkpoints of a job on several nodes whose part from this node is durable, waiting
    /// for the other nodes' parts.
    pub other_nodes: usize,
}

impl PassOutcome {
    /// Something failed and may be retried at `t`.
    pub(crate) fn retry_at(&mut self, t: Instant) {
        self.next_retry = Some(self.next_retry.map_or(t, |n| n.min(t)));
    }
}

/// The levels of a configuration, nearest first. Staging servers and the dedup repository
/// are always read (they may hold what an earlier configuration sent); which of them take
/// new checkpoints is up to each level (`Level::takes`): with dedup, the staged-dedup level
/// and the repository; without, the staging servers and the plain layout. The plain layout
/// takes files outside every checkpoint in either case. On a job of several nodes the job's
/// level goes first.
fn levels_for(
    opts: &AgentOptions,
    durable: &Arc<DurableStore>,
    store: &Store,
) -> Vec<Box<dyn Level>> {
    let job = opts.job.clone().filter(|j| j.nodes > 1);
    let repository = Arc::new(Repository::new(
        Arc::clone(durable),
        opts.dedup,
        job.as_ref().map(|j| j.node.clone()),
    ));
    let sends_plain = opts.dedup.is_none();
    let staging = opts.staging.clone().filter(|s| !s.servers.is_empty());
    let mut levels: Vec<Box<dyn Level>> = Vec::new();
    if let Some(job) = job {
        let joins_manifests = (!sends_plain).then(|| Arc::clone(&repository));
        levels.push(Box::new(JobParts::new(
            job,
            staging.is_some(),
            joins_manifests,
        )));
    }
    if let Some(staging) = staging {
        let pool = Arc::new(ServerPool::new(staging));
        // A server's event (a drain, a push, a marker) starts a pass at once.
        let wakes = store.clone();
        pool.start_watching(Box::new(move || wakes.wake_agent()));
        levels.push(Box::new(StagingServers::new(
            Arc::clone(&pool),
            sends_plain,
        )));
        levels.push(Box::new(StagedDedup::new(pool, Arc::clone(&repository))));
    }
    levels.push(Box::new(DedupRepository::new(repository)));
    levels.push(Box::new(PlainLayout::new(sends_plain)));
    levels
}

impl Agent {
    /// Registers as the store's agent (EBUSY if another one runs), sets the store's policy,
    /// and frees descriptions of writers that died before it started.
    pub fn start(store: Store, durable: DurableStore, opts: AgentOptions) -> Result<Agent> {
        let registration = store
            .register_agent()
            .map_err(|e| Error::store(store.name(), e))?;
        store.set_policy(opts.flush_every, opts.full_wait);
        store.set_path_limit(durable.max_key_len());
        store.sweep_descriptions();
        let durable = Arc::new(durable);
        let levels = levels_for(&opts, &durable, &store);
        let stats = AgentStats {
            pid: std::process::id(),
            durable: durable.name().to_string(),
            staging: levels
                .iter()
                .find(|l| !l.durable())
                .map(|l| l.name())
                .unwrap_or_default(),
            ..AgentStats::default()
        };
        Ok(Agent {
            node: Node::new(store, durable, opts, stats),
            levels,
            fetching: Mutex::new(HashSet::new()),
            fetched: Condvar::new(),
            last_sweep: Mutex::new(Instant::now()),
            listed: Mutex::new(HashMap::new()),
            served_space_request: Mutex::new(None),
            one_pass: Mutex::new(()),
            ending: AtomicBool::new(false),
            _registration: registration,
        })
    }

    pub fn store(&self) -> &Store {
        &self.node.store
    }

    pub fn durable(&self) -> &DurableStore {
        &self.node.durable
    }

    pub fn options(&self) -> &AgentOptions {
        &self.node.opts
    }

    pub fn stats(&self) -> AgentStats {
        self.node.stats()
    }

    /// Asks [`Agent::run`] to return (from any thread).
    pub fn stop(&self) {
        self.node.stop();
        self.node.store.wake_agent();
    }

    pub fn stopping(&self) -> bool {
        self.node.stopping()
    }

    /// The levels that take new checkpoints, in the order they are offered them, and what
    /// they take.
    fn route(&self) -> (Vec<&dyn Level>, Option<Unit>) {
        let route: Vec<&dyn Level> = self
            .levels
            .iter()
            .map(|l| l.as_ref())
            .filter(|l| l.takes().is_some())
            .collect();
        let unit = route.first().and_then(|l| l.takes());
        (route, unit)
    }

    /// Works until [`Agent::stop`]: a pass whenever the store calls (a file closed after
    /// writing, a commit, a writer waiting for space), after a retry delay, or every
    /// `rescan`.
    pub fn run(&self) {
        while !self.stopping() {
            let seen = self.node.store.work_counter();
            let outcome = self.pass();
            if outcome.progressed || self.stopping() {
                continue;
            }
            let mut wait = self.node.opts.rescan;
            if let Some(at) = outcome.next_retry {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            self.node.store.wait_for_work(seen, wait);
        }
    }

    /// Passes until nothing flushable is left to upload or mark (the end of a job), or
    /// `timeout`. Files still being written or torn are not waited for; they are reported.
    pub fn drain(&self, timeout: Duration) -> Result<PassOutcome> {
        let deadline = Instant::now() + timeout;
        self.ending.store(true, Ordering::Release);
        loop {
            let seen = self.node.store.work_counter();
            let outcome = self.pass();
            if outcome.pending == 0 {
                return Ok(outcome);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "draining to {}: {} item(s) still pending; last error: {}",
                        self.node.durable.name(),
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
                self.node
                    .store
                    .wait_for_work(seen, wait.min(Duration::from_millis(200)));
            }
        }
    }

    /// One look at the whole store: send down what is ready, complete the checkpoints that
    /// are due, evict what retention allows.
    pub fn pass(&self) -> PassOutcome {
        let _one = self.one_pass.lock().unwrap_or_else(|e| e.into_inner());
        let mut outcome = PassOutcome::default();
        let tree = match self.node.store.life_tree("/") {
            Ok(t) => t,
            Err(e) => {
                self.node
                    .record_failure(format!("cannot read the store: {e}"));
                return outcome;
            }
        };
        self.sweep_if_due(&tree);
        self.node.prune_caches(&tree);
        if self.commit_by_rules(&tree, &mut outcome) {
            // The snapshot no longer shows what was committed: the next pass, at once.
            return outcome;
        }
        let checkpoints = checkpoints_of(&tree);
        let (route, unit) = self.route();
        let Some(ready) = self.ready_files(&tree, &checkpoints, &route, unit, &mut outcome) else {
            return outcome;
        };
        self.send_files(&route, &ready, &mut outcome);
        for level in &self.levels {
            let poll = level.poll(&self.node, &tree);
            outcome.progressed |= poll.progressed;
            outcome.staged += poll.waiting;
            if let Some(at) = poll.ask_again {
                outcome.retry_at(at);
            }
        }
        self.complete_checkpoints(&checkpoints, &route, &mut outcome);
        if self.evict(&tree, &checkpoints) {
            outcome.progressed = true;
        }
        self.node.count(|s| {
            s.pending_files = ready.len() as u64;
            s.pending_bytes = ready.iter().map(|e| e.size).sum();
        });
        outcome
    }

    /// Commits what `checkpoint.rules` names (programs that never commit; at the end of a
    /// job also the newest directory of each series). True if it committed something: the
    /// pass then ends, counted pending and progressed, and the next one starts at once.
    fn commit_by_rules(&self, tree: &[LifeEntry], outcome: &mut PassOutcome) -> bool {
        let rules = &self.node.opts.rules;
        if rules.is_empty() {
            return false;
        }
        let at_end = self.ending.load(Ordering::Acquire);
        let done = crate::rules::commit_by_rules(&self.node.store, rules, tree, at_end);
        if let Some(at) = done.look_again {
            outcome.retry_at(at);
        }
        let committed = done.committed;
        for failure in done.failures {
            self.node.record_failure(failure);
        }
        for path in &committed {
            self.node
                .log(|| format!("committed {path} (checkpoint rule)"));
        }
        outcome.pending += committed.len();
        outcome.progressed |= !committed.is_empty();
        !committed.is_empty()
    }

    /// Step 1 of a pass: the closed files to send down now, committed checkpoints first
    /// (oldest commit first), then everything else by path. Files go down as soon as they are
    /// closed, before their checkpoint is committed, when the route takes files and every
    /// checkpoint is flushed. A checkpoint with a marker from an earlier version loses it
    /// first (None if that failed: the pass stops).
    fn ready_files<'t>(
        &self,
        tree: &'t [LifeEntry],
        checkpoints: &[Checkpoint<'t>],
        route: &[&dyn Level],
        unit: Option<Unit>,
        outcome: &mut PassOutcome,
    ) -> Option<Vec<&'t LifeEntry>> {
        let root_of = |e: &LifeEntry| -> Option<&Checkpoint> {
            checkpoints.iter().find(|c| e.is_at_or_below(&c.root.path))
        };
        let by_file = unit == Some(Unit::Files);
        // Where checkpoints are stored whole (dedup), a file outside every checkpoint may be
        // committed as one later: it goes down (to the plain layout) only at the end.
        let eager =
            self.node.opts.flush_every <= 1 && (by_file || self.ending.load(Ordering::Acquire));
        let now = Instant::now();
        let mut ready: Vec<&LifeEntry> = Vec::new();
        let mut stale_markers: Vec<&LifeEntry> = Vec::new();
        for e in files_of(tree) {
            // A remote file's content is below by definition.
            let below = e.remote || route.first().is_some_and(|l| l.holds(e));
            if below || reserved(&e.path) {
                continue;
            }
            let root = root_of(e);
            let wanted = match root {
                // Stored whole, a checkpoint waits for step 2.
                Some(c) => c.root.flush && by_file,
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
            match self.node.retry_not_before(e, now) {
                Some(t) => outcome.retry_at(t),
                None => ready.push(e),
            }
        }
        for root in stale_markers {
            // The durable copy is about to change: its old marker must go first.
            self.node.store.clear_complete(root.ino, root.generation);
            if let Err(e) = self
                .node
                .durable
                .delete_marker(&DurableKey::from_store_path(&root.path))
            {
                self.node.record_failure(format!(
                    "cannot remove the old marker of {}: {e}",
                    root.path
                ));
                return None;
            }
        }
        ready.sort_by_key(|e| {
            let seq = root_of(e).map_or(u64::MAX, |c| c.root.commit_seq);
            (seq, e.path.clone())
        });
        Some(ready)
    }

    /// Hands `ready` to the levels that take files, first to last: each passes on what it
    /// could not take.
    fn send_files(&self, route: &[&dyn Level], ready: &[&LifeEntry], outcome: &mut PassOutcome) {
        let mut left = ready.to_vec();
        for level in route {
            if left.is_empty() || self.stopping() {
                break;
            }
            let (arrived, rest) = level.send_files(&self.node, left);
            outcome.progressed |= arrived > 0;
            left = rest;
        }
    }

    /// Step 2 of a pass: each committed checkpoint to flush that is not complete yet goes to
    /// the levels of the route, first to last, until one takes a step with it.
    fn complete_checkpoints(
        &self,
        checkpoints: &[Checkpoint],
        route: &[&dyn Level],
        outcome: &mut PassOutcome,
    ) {
        let stored_whole = route.iter().any(|l| l.takes() == Some(Unit::Checkpoints));
        for c in checkpoints
            .iter()
            .filter(|c| c.root.flush && !c.root.complete())
        {
            if let Some(fetched) = stored_whole.then(|| self.fetch_remote_files(c)).flatten() {
                // The next pass sees them in memory (or retries what failed).
                outcome.pending += 1;
                outcome.progressed |= fetched;
                continue;
            }
            let previous = previous_in_series(checkpoints, c);
            let step = route
                .iter()
                .map(|level| level.send_checkpoint(&self.node, c, previous))
                .find(|step| *step != Step::Next)
                .unwrap_or(Step::Next);
            match step {
                Step::Complete | Step::Handed => {
                    self.node.forget_retry(c.root);
                    outcome.progressed = true;
                }
                // A node's part of a job's checkpoint is not done until it is durable: the
                // end of a job waits for it (the other nodes need it to complete).
                Step::Waiting(at) if self.job_wide(c) => {
                    outcome.pending += 1;
                    outcome.retry_at(at);
                }
                Step::Waiting(at) => {
                    outcome.staged += 1;
                    outcome.retry_at(at);
                }
                Step::OtherNodes(at) => {
                    outcome.other_nodes += 1;
                    outcome.retry_at(at);
                }
                // No level took a step with it.
                Step::NotReady | Step::Next => outcome.pending += 1,
                Step::Blocked => outcome.blocked += 1,
                Step::RetryAt(at) => {
                    outcome.pending += 1;
                    outcome.retry_at(at);
                }
                Step::Changed | Step::PartStored => {
                    outcome.pending += 1;
                    outcome.progressed = true;
                }
            }
        }
    }

    /// A checkpoint stored whole (dedup) is read from memory: its remote files (listed from
    /// below, e.g. older checkpoints in the directory a restarted job committed) are fetched
    /// first. None if it has none; else whether all were fetched now (false: a fetch failed
    /// and is retried later, or an earlier failure's retry time has not come).
    fn fetch_remote_files(&self, c: &Checkpoint) -> Option<bool> {
        let remote: Vec<&str> = c
            .files
            .iter()
            .filter(|f| f.remote)
            .map(|f| f.path.as_str())
            .collect();
        if remote.is_empty() {
            return None;
        }
        if self.node.retry_not_before(c.root, Instant::now()).is_some() {
            return Some(false);
        }
        for path in remote {
            if let Err(e) = self.fetch(path) {
                let what = format!("fetching {path} to store checkpoint {}", c.root.path);
                crate::level::retry_later(&self.node, c.root, &what, &e);
                return Some(false);
            }
        }
        Some(true)
    }

    /// Frees descriptions of dead writers now and then, so a file whose writer was killed is
    /// marked torn instead of looking open for ever.
    fn sweep_if_due(&self, tree: &[LifeEntry]) {
        let Ok(mut last) = self.last_sweep.lock() else {
            return;
        };
        if last.elapsed() < self.node.opts.rescan {
            return;
        }
        // A file being written, or a removed file still open (orphans are in no tree): its
        // writer may have died.
        if !tree.iter().any(|e| e.writers > 0) && self.node.store.orphans() == 0 {
            return;
        }
        *last = Instant::now();
        self.node.store.sweep_descriptions();
    }

    /// Retention: per directory, keep the newest `keep` committed checkpoints; evict older
    /// complete ones, and older never-flushed ones once a newer one is complete. While writers
    /// wait for space, evict one complete checkpoint per failed allocation (the checkpoints
    /// beyond `keep` went first, above), oldest first, else one durable file outside every
    /// checkpoint.
    fn evict(&self, tree: &[LifeEntry], checkpoints: &[Checkpoint]) -> bool {
        let mut series: BTreeMap<&str, Vec<&Checkpoint>> = BTreeMap::new();
        for c in checkpoints {
            series.entry(c.root.parent_dir()).or_default().push(c);
        }
        let mut evicted = false;
        for list in series.values_mut() {
            list.sort_by_key(|c| std::cmp::Reverse(c.root.commit_seq));
            let newest_safe = list.iter().position(|c| self.evictable(c));
            for (i, c) in list.iter().enumerate().skip(self.node.opts.keep) {
                let superseded = newest_safe.is_some_and(|n| n < i);
                if self.evictable(c) {
                    evicted |= self.evict_one(c, false);
                } else if !c.root.flush && superseded {
                    evicted |= self.evict_one(c, true);
                }
            }
        }
        let Some(request) = self.node.store.space_request() else {
            return evicted;
        };
        // A request is served once: passes that run before the waiting writer has retried
        // must not evict more (they would take the newest checkpoints too).
        let Ok(mut served) = self.served_space_request.lock() else {
            return evicted;
        };
        if evicted || *served == Some(request) {
            *served = Some(request);
            return evicted;
        }
        let mut complete: Vec<&Checkpoint> =
            checkpoints.iter().filter(|c| self.evictable(c)).collect();
        complete.sort_by_key(|c| c.root.commit_seq);
        if complete.into_iter().any(|c| self.evict_one(c, false))
            || self.evict_safe_file(tree, checkpoints)
        {
            *served = Some(request);
            evicted = true;
        }
        evicted
    }

    /// For writers waiting for space when no checkpoint can go: makes remote the oldest
    /// closed file outside every committed checkpoint whose content is durable (a restart
    /// file of a program that does not commit), by modification time, sparing the newest
    /// `keep` of each directory while another can go. Its name stays; opening it under
    /// `cascade run` fetches it back.
    fn evict_safe_file(&self, tree: &[LifeEntry], checkpoints: &[Checkpoint]) -> bool {
        let store = &self.node.store;
        let mut candidates: Vec<(&LifeEntry, i64)> = files_of(tree)
            .filter(|e| {
                e.durable()
                    && e.opens == 0
                    && !e.torn
                    && !e.remote
                    && e.chunks_mem + e.chunks_spill > 0
                    && !reserved(&e.path)
                    && !checkpoints.iter().any(|c| e.is_at_or_below(&c.root.path))
            })
            .filter_map(|e| Some((e, store.stat(&e.path).ok()?.mtime)))
            .collect();
        // Newest first within each directory: the first `keep` of each are tried last.
        candidates.sort_by_key(|(e, mtime)| (e.parent_dir(), std::cmp::Reverse(*mtime)));
        let mut order: Vec<(bool, i64, &LifeEntry)> = Vec::with_capacity(candidates.len());
        let mut dir = None;
        let mut rank = 0;
        for (e, mtime) in candidates {
            if dir != Some(e.parent_dir()) {
                dir = Some(e.parent_dir());
                rank = 0;
            }
            rank += 1;
            order.push((rank <= self.node.opts.keep, mtime, e));
        }
        order.sort_by_key(|(spared, mtime, _)| (*spared, *mtime));
        for (_, _, e) in order {
            match store.make_remote(&e.path, e.generation, e.mod_seq) {
                Ok(Some(bytes)) => {
                    self.node.count(|s| {
                        s.evicted_files += 1;
                        s.evicted_bytes += bytes;
                    });
                    self.node.log(|| {
                        format!(
                            "evicted {} ({bytes} bytes, durable, in no checkpoint) for writers waiting for space",
                            e.path
                        )
                    });
                    return true;
                }
                Ok(None) => {}
                Err(err) => self
                    .node
                    .record_failure(format!("cannot evict {}: {err}", e.path)),
            }
        }
        false
    }

    /// True if checkpoint `c` is safe below this node. On a job of several nodes a directory
    /// checkpoint must be complete: pushed to staging servers is not enough, since this node
    /// still has to record its part and join the parts once its server wrote them.
    fn evictable(&self, c: &Checkpoint) -> bool {
        c.root.checkpoint_safe() && (!self.job_wide(c) || c.root.complete())
    }

    /// True if `c` is a checkpoint the nodes of a job write together (a directory, on a job
    /// of several nodes): complete only with every node's part.
    fn job_wide(&self, c: &Checkpoint) -> bool {
        self.node.opts.job.as_ref().is_some_and(|j| j.nodes > 1) && c.root.kind == FileKind::Dir
    }

    fn evict_one(&self, c: &Checkpoint, allow_incomplete: bool) -> bool {
        match self
            .node
            .store
            .evict(&c.root.path, c.root.generation, allow_incomplete)
        {
            Ok(Some(bytes)) => {
                self.node.count(|s| {
                    s.evicted_checkpoints += 1;
                    s.evicted_bytes += bytes;
                });
                self.node.log(|| {
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
                self.node
                    .record_failure(format!("cannot evict {}: {e}", c.root.path));
                false
            }
        }
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
