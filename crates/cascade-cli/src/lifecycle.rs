//! The checkpoint lifecycle commands: agent, commit, wait, ls --levels; and the agent that
//! `cascade run` embeds when none is running (docs/agent.md).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_agent::{Agent, AgentOptions, CheckpointRules, JobOptions};
use cascade_config::{format_size, Config};
use cascade_dedup::repo::{Repo, DEFAULT_PREFIX};
use cascade_dedup::Compression;
use cascade_durable::{DurableKey, DurableStore, Options as DurableOptions, Spec};
use cascade_store::{FileKind, LifeEntry, Store};

use crate::admin::attach;
use crate::failure::Failure;

/// Agent settings from the configuration.
pub fn agent_options(config: &Config, verbose: bool) -> Result<AgentOptions, Failure> {
    Ok(AgentOptions {
        uploads: config.number("agent.uploads").max(1) as usize,
        keep: config.number("checkpoint.keep").max(1) as usize,
        flush_every: config
            .number("checkpoint.flush_every")
            .clamp(1, u32::MAX as u64) as u32,
        full_wait: Duration::from_millis(config.number("agent.full_wait")),
        verbose,
        staging: crate::staging::staging_options(config)?,
        dedup: crate::checkpoint::dedup_options(config)?,
        job: job_options(config),
        rules: CheckpointRules::parse(config.text("checkpoint.rules"))
            .map_err(Failure::new)?
            .with_quiet(Duration::from_millis(config.number("checkpoint.quiet"))),
        ..AgentOptions::default()
    })
}

/// The job this node's agent works for, when the launcher (or CASCADE_JOB*) names one.
fn job_options(config: &Config) -> Option<JobOptions> {
    let job = config.job()?;
    Some(JobOptions {
        node: job.node.value,
        nodes: job.nodes.value,
        node_names: job.node_names.map(|n| n.value).unwrap_or_default(),
    })
}

/// Opens the configured durable store for the agent: few retries per request, since the
/// agent retries whole files itself with its own backoff.
pub fn open_durable(url: &str) -> Result<DurableStore, Failure> {
    let spec = Spec::parse(url).map_err(|e| Failure::new(e.to_string()))?;
    let opts = DurableOptions {
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
        ..DurableOptions::default()
    };
    DurableStore::open_with(spec, opts).map_err(|e| Failure::new(e.to_string()))
}

fn require_durable(config: &Config) -> Result<String, Failure> {
    config.durable_url().ok_or_else(|| {
        Failure::new(
            "no durable store configured: give --durable URL or set CASCADE_DURABLE (a \
             directory, or s3://bucket?endpoint=URL)",
        )
    })
}

/// `cascade agent`: runs in the foreground until SIGINT or SIGTERM.
pub fn agent(config: &Config, verbose: bool) -> Result<ExitCode, Failure> {
    // Blocked before any thread exists, so that every thread inherits the mask and only the
    // waiting thread takes them; the durable store is checked before a store is created.
    let signals = block_stop_signals()?;
    let url = require_durable(config)?;
    crate::umask::restrict(config)?;
    let durable = open_durable(&url)?;
    let store = crate::run::attach_or_create(config)?;
    let agent = Arc::new(start_agent(
        store,
        durable,
        agent_options(config, verbose)?,
    )?);
    let control = agent
        .serve_control()
        .map_err(|e| Failure::new(e.to_string()))?;
    let staging = agent.stats().staging;
    let dedup = match &agent.options().dedup {
        Some(d) => format!(
            " (dedup repository: {}, {}{})",
            d.chunking,
            d.compression,
            if d.delta && d.compression != Compression::None {
                ", deltas"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    eprintln!(
        "cascade agent: store {} -> {}{}{dedup} (pid {})",
        agent.store().name(),
        if staging.is_empty() {
            String::new()
        } else {
            format!("{staging} -> ")
        },
        agent.durable().name(),
        std::process::id()
    );
    let stopper = Arc::clone(&agent);
    std::thread::spawn(move || {
        wait_for_signal(&signals);
        stopper.stop();
        stopper.stop_control();
    });
    agent.run();
    let _ = control.join();
    let s = agent.stats();
    if s.dedup_checkpoints > 0 {
        eprintln!(
            "cascade agent: dedup: {} checkpoints, {} of file data, {} new, {} stored ({} chunks \
             as deltas)",
            s.dedup_checkpoints,
            format_size(s.dedup_bytes),
            format_size(s.dedup_new_bytes),
            format_size(s.dedup_stored_bytes),
            s.dedup_delta_chunks
        );
    }
    eprintln!(
        "cascade agent: stopped; uploaded {} files ({}), {} checkpoints complete, {} evicted, {} fetched, {} failures",
        s.uploaded_files,
        format_size(s.uploaded_bytes),
        s.markers,
        s.evicted_checkpoints,
        s.fetched_files,
        s.failures
    );
    Ok(ExitCode::SUCCESS)
}

fn start_agent(store: Store, durable: DurableStore, opts: AgentOptions) -> Result<Agent, Failure> {
    Agent::start(store, durable, opts).map_err(|e| Failure::new(e.to_string()))
}

pub(crate) fn block_stop_signals() -> Result<libc::sigset_t, Failure> {
    // SAFETY: plain signal-set manipulation on a local set, before the agent's threads exist,
    // so they inherit the mask and only the waiting thread takes these signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Failure::io(
                "blocking signals",
                &std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(set)
    }
}

pub(crate) fn wait_for_signal(set: &libc::sigset_t) {
    let mut signal = 0;
    // SAFETY: `set` is an initialised signal set and `signal` a valid out-pointer.
    while unsafe { libc::sigwait(set, &mut signal) } != 0 {}
}

/// `cascade commit PATH`.
pub fn commit(config: &Config, path: &str) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    // A file closed through a FUSE mount is released by the kernel a moment after close()
    // returned (docs/fuse.md): such a writer gets a short while before EBUSY is reported.
    let deadline = Instant::now() + Duration::from_secs(2);
    let seq = loop {
        match store.commit(path, false) {
            Err(e) if e.errno() == libc::EBUSY && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            done => break done.map_err(|e| Failure::store(path, &e))?,
        }
    };
    let root = store
        .life_tree(path)
        .ok()
        .and_then(|t| t.into_iter().next());
    let flushed = root.as_ref().is_some_and(|r| r.flush);
    let mut line = format!("committed {path} (checkpoint #{seq}");
    if !flushed {
        line.push_str(", kept in memory only: not an Nth checkpoint (checkpoint.flush_every)");
    }
    line.push(')');
    if flushed && store.agent_pid().is_none() {
        line.push_str(
            "; no agent is running: it drains when 'cascade agent' or 'cascade run' starts one",
        );
    }
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}

/// How far a path has got, from one snapshot.
struct Progress {
    files: usize,
    /// Files at the level waited for (durable, or staged-or-durable).
    durable_files: usize,
    reached: bool,
    /// Why it cannot get there without someone acting, if that is the case.
    stuck: Option<String>,
}

/// `staged`: waiting for "safe from the loss of this node" (a staging server or the durable
/// store holds it), else for the durable store.
fn progress_of(tree: &[LifeEntry], staged: bool) -> Progress {
    let root = &tree[0];
    let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
    let at_level = |f: &&&LifeEntry| if staged { f.safe() } else { f.durable() };
    let durable_files = files.iter().filter(at_level).count();
    let reached = if root.committed {
        root.complete() || (staged && root.checkpoint_safe())
    } else {
        durable_files == files.len()
    };
    let stuck = if let Some(f) = files.iter().find(|f| f.torn) {
        Some(format!(
            "{} was left incomplete by a process that died; rewrite or remove it",
            f.path
        ))
    } else if let Some(f) = files.iter().find(|f| f.writers > 0) {
        Some(format!("{} is still open for writing", f.path))
    } else if root.committed && !root.flush {
        Some(format!(
            "{} is a checkpoint kept in memory only (not an Nth one: checkpoint.flush_every)",
            root.path
        ))
    } else {
        None
    };
    Progress {
        files: files.len(),
        durable_files,
        reached,
        stuck,
    }
}

/// Whether the durable store holds `path` as a complete checkpoint.
fn durable_complete(config: &Config, path: &str) -> Result<bool, Failure> {
    let Some(url) = config.durable_url() else {
        return Ok(false);
    };
    let durable = Arc::new(open_durable(&url)?);
    complete_in(&durable, &DurableKey::from_store_path(path))
}

/// Whether checkpoint `ckpt` is complete in `durable`: its marker in the plain layout, or its
/// manifest in the dedup repository.
fn complete_in(durable: &Arc<DurableStore>, ckpt: &str) -> Result<bool, Failure> {
    let failed = |e: &dyn std::fmt::Display| Failure::new(format!("{}: {e}", durable.name()));
    if durable.is_complete(ckpt).map_err(|e| failed(&e))? {
        return Ok(true);
    }
    let Some(repo) =
        Repo::open_for_maintenance(Arc::clone(durable), DEFAULT_PREFIX).map_err(|e| failed(&e))?
    else {
        return Ok(false);
    };
    Ok(repo.read_manifest(ckpt).map_err(|e| failed(&e))?.is_some())
}

/// For a checkpoint of several nodes that is not complete, which nodes' parts are in the
/// durable store ("parts from 1 of 2 nodes (a); missing b"); None for any other.
fn job_parts(config: &Config, path: &str) -> Option<String> {
    let durable = open_durable(&config.durable_url()?).ok()?;
    let parts = durable
        .read_parts(&DurableKey::from_store_path(path))
        .ok()?;
    (!parts.is_empty()).then(|| cascade_durable::PartsIn::of(&parts).describe())
}

/// `cascade wait PATH --level LEVEL --timeout SECS`.
pub fn wait(config: &Config, path: &str, level: &str, timeout: f64) -> Result<ExitCode, Failure> {
    if !matches!(level, "memory" | "staged" | "durable") {
        return Err(Failure::new(format!(
            "wait: unknown level {level:?} (use memory, staged or durable)"
        )));
    }
    let staged = level == "staged";
    if !(timeout.is_finite() && timeout >= 0.0) {
        return Err(Failure::new(
            "wait: --timeout must be a number of seconds >= 0",
        ));
    }
    let store = attach(config)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(timeout);
    loop {
        // Read before looking, so a level reached meanwhile ends the sleep below at once.
        let progress = store.progress_counter();
        let tree = match store.life_tree(path) {
            Ok(t) => t,
            Err(e) if e.errno() == libc::ENOENT && level != "memory" => {
                // Evicted from memory once durable, or never here: ask the durable store.
                if durable_complete(config, path)? {
                    println!("{path}: durable (complete in the durable store)");
                    return Ok(ExitCode::SUCCESS);
                }
                return Err(Failure::store(path, &e));
            }
            Err(e) => return Err(Failure::store(path, &e)),
        };
        if level == "memory" {
            println!("{path}: in memory");
            return Ok(ExitCode::SUCCESS);
        }
        let p = progress_of(&tree, staged);
        if p.reached {
            let root = &tree[0];
            let how = if root.complete()
                || tree.iter().all(|e| e.kind != FileKind::File || e.durable())
            {
                "durable"
            } else {
                "staged"
            };
            println!(
                "{path}: {how} ({} files) after {:.3} s",
                p.files,
                started.elapsed().as_secs_f64()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(why) = &p.stuck {
            return Err(Failure::new(format!(
                "{path}: cannot become {level}: {why}"
            )));
        }
        if store.agent_pid().is_none() {
            return Err(Failure::new(format!(
                "{path}: not {level} yet ({} of {} files{}) and no agent is running for store \
                 {}; start one with 'cascade agent' (or run the job under 'cascade run' with a \
                 durable store configured)",
                p.durable_files,
                p.files,
                job_parts(config, path)
                    .map(|parts| format!("; the job's checkpoint has {parts}"))
                    .unwrap_or_default(),
                store.name()
            )));
        }
        if Instant::now() >= deadline {
            let last = cascade_agent::status(store.name()).and_then(|s| s.last_error);
            return Err(Failure::new(format!(
                "{path}: timed out after {timeout} s: {} of {} files {level}{}{}",
                p.durable_files,
                p.files,
                job_parts(config, path)
                    .map(|parts| format!("; the job's checkpoint has {parts}"))
                    .unwrap_or_default(),
                last.map(|e| format!("; the agent's last error: {e}"))
                    .unwrap_or_default()
            )));
        }
        // Woken when a level is reached; the timeout still notices a dead agent.
        let left = deadline.saturating_duration_since(Instant::now());
        store.wait_for_progress(progress, Duration::from_millis(100).min(left));
    }
}

/// Where a file's bytes are: memory, spill or both, or only below (a remote file).
fn residence(e: &LifeEntry) -> &'static str {
    if e.remote {
        return "durable";
    }
    match (e.chunks_mem > 0, e.chunks_spill > 0) {
        (true, true) => "memory+spill",
        (false, true) => "spill",
        _ => "memory",
    }
}

fn state_of(e: &LifeEntry, tree: &[LifeEntry]) -> String {
    if e.committed {
        let below: Vec<&LifeEntry> = tree
            .iter()
            .filter(|f| f.kind == FileKind::File && f.is_at_or_below(&e.path))
            .collect();
        let durable = below.iter().filter(|f| f.durable()).count();
        let what = if e.complete() {
            "complete".to_string()
        } else if e.checkpoint_safe() {
            format!("staged, draining ({durable}/{} files durable)", below.len())
        } else if !e.flush {
            "memory only (not flushed)".to_string()
        } else {
            format!("draining ({durable}/{} files durable)", below.len())
        };
        return format!("checkpoint #{} {what}", e.commit_seq);
    }
    match e.kind {
        FileKind::Dir => String::new(),
        FileKind::File if e.torn => "torn (writer died)".to_string(),
        FileKind::File if e.writers > 0 => "writing".to_string(),
        FileKind::File if e.remote => "durable (not in memory; fetched when opened)".to_string(),
        FileKind::File if e.durable() => "durable".to_string(),
        FileKind::File if e.staged() => "staged".to_string(),
        FileKind::File => "dirty".to_string(),
    }
}

/// `cascade ls --levels [PATH]`: every entry below PATH with where it lives and its state,
/// then the checkpoints only the durable store still has.
pub fn ls_levels(config: &Config, path: &str) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let tree = store
        .life_tree(path)
        .map_err(|e| Failure::store(path, &e))?;
    println!("{:<13} {:>10}  {:<40} PATH", "LEVEL", "SIZE", "STATE");
    for e in &tree {
        if e.path == "/" {
            continue;
        }
        let level = match e.kind {
            FileKind::Dir => "-",
            FileKind::File => residence(e),
        };
        let size = match e.kind {
            FileKind::Dir => String::new(),
            FileKind::File => format_size(e.size),
        };
        let suffix = if e.kind == FileKind::Dir { "/" } else { "" };
        println!(
            "{level:<13} {size:>10}  {:<40} {}{suffix}",
            state_of(e, &tree),
            e.path
        );
    }
    if let Some(url) = config.durable_url() {
        let durable = Arc::new(open_durable(&url)?);
        let objects = durable
            .list(&DurableKey::from_store_path(path))
            .map_err(|e| Failure::new(e.to_string()))?;
        for o in &objects {
            let Some(ckpt) = o
                .path
                .strip_suffix(cascade_durable::MARKER_NAME)
                .map(|c| c.trim_end_matches('/'))
            else {
                continue;
            };
            let store_path = format!("/{ckpt}");
            if !tree.iter().any(|e| e.path == store_path) {
                println!(
                    "{:<13} {:>10}  {:<40} {store_path}",
                    "durable", "", "checkpoint complete (not in memory)"
                );
            }
        }
        // Checkpoints of several nodes not complete yet: whose parts are in.
        let mut with_parts: Vec<&str> = objects
            .iter()
            .filter_map(|o| o.path.rsplit_once('/'))
            .filter(|(_, base)| base.starts_with(cascade_durable::PART_PREFIX))
            .map(|(ckpt, _)| ckpt)
            .collect();
        with_parts.dedup();
        for ckpt in with_parts {
            if complete_in(&durable, ckpt).unwrap_or(false) {
                continue;
            }
            if let Ok(parts) = durable.read_parts(ckpt) {
                println!(
                    "{:<13} {:>10}  {:<40} /{ckpt}",
                    "parts",
                    "",
                    cascade_durable::PartsIn::of(&parts).describe()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The agent `cascade run` embeds when a durable store is configured and no agent runs: the
/// one of the node's ranks that started it holds it until every rank has ended.
pub struct EmbeddedAgent {
    agent: Arc<Agent>,
    worker: std::thread::JoinHandle<()>,
    control: std::thread::JoinHandle<()>,
}

impl EmbeddedAgent {
    /// The configured durable store, opened (and so checked) before `cascade run` touches
    /// the node store.
    pub fn open_configured(config: &Config) -> Result<Option<DurableStore>, Failure> {
        config
            .durable_url()
            .as_deref()
            .map(open_durable)
            .transpose()
    }

    /// Starts one on `durable` if the store has no live agent. None also when another
    /// process (another rank, a node-level `cascade agent`) registered one first: the ranks
    /// of a node share it.
    pub fn start_if_needed(
        config: &Config,
        store: &Store,
        durable: Option<DurableStore>,
    ) -> Result<Option<EmbeddedAgent>, Failure> {
        let Some(durable) = durable else {
            return Ok(None);
        };
        if store.agent_pid().is_some() {
            return Ok(None);
        }
        let agent = match Agent::start(store.clone(), durable, agent_options(config, false)?) {
            Ok(agent) => Arc::new(agent),
            Err(e) if e.errno() == libc::EBUSY => return Ok(None),
            Err(e) => return Err(Failure::new(e.to_string())),
        };
        let control = agent
            .serve_control()
            .map_err(|e| Failure::new(e.to_string()))?;
        let worker_agent = Arc::clone(&agent);
        let worker = std::thread::Builder::new()
            .name("cascade-agent".to_string())
            .spawn(move || worker_agent.run())
            .map_err(|e| Failure::io("starting the agent thread", &e))?;
        Ok(Some(EmbeddedAgent {
            agent,
            worker,
            control,
        }))
    }

    /// Drains what the job left (at most `timeout`); the agent keeps running.
    pub fn drain(&self, timeout: Duration) -> Result<(), Failure> {
        let pending = self.agent.stats().pending_bytes;
        if pending > 0 {
            eprintln!(
                "cascade: draining {} to {} before exiting",
                format_size(pending),
                self.agent.durable().name()
            );
        }
        self.agent.drain(timeout).map(|_| ()).map_err(|e| {
            Failure::new(format!(
                "{e}; the checkpoints stay in the node store and drain when an agent runs"
            ))
        })
    }

    /// Stops the agent. Its registration in the store goes with the last reference to it:
    /// a control request still being answered holds one for a moment, and a rank that
    /// joins must not see this agent as running once this has returned.
    pub fn stop(self) {
        self.agent.stop();
        self.agent.stop_control();
        let _ = self.worker.join();
        let _ = self.control.join();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.agent) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The versions of the store's files at a moment (the start of a job on the node), to tell
/// later which files the job wrote.
pub struct FileVersions(std::collections::HashSet<(u64, u32, u64)>);

impl FileVersions {
    /// Every file's version now.
    pub fn of(store: &Store) -> FileVersions {
        let tree = store.life_tree("/").unwrap_or_default();
        FileVersions(
            tree.iter()
                .filter(|e| e.kind == FileKind::File)
                .map(|e| (e.ino, e.generation, e.mod_seq))
                .collect(),
        )
    }

    /// One line per file: inode, generation, version.
    pub fn to_text(&self) -> String {
        self.0
            .iter()
            .map(|(ino, generation, seq)| format!("{ino} {generation} {seq}\n"))
            .collect()
    }

    /// What [`FileVersions::to_text`] wrote; None if it is not that.
    pub fn from_text(text: &str) -> Option<FileVersions> {
        let mut versions = std::collections::HashSet::new();
        for line in text.lines() {
            let mut fields = line.split(' ').map(str::parse::<u64>);
            match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some(Ok(ino)), Some(Ok(generation)), Some(Ok(seq)), None) => {
                    versions.insert((ino, u32::try_from(generation).ok()?, seq));
                }
                _ => return None,
            }
        }
        Some(FileVersions(versions))
    }

    /// This version of the file was there already.
    fn holds(&self, e: &LifeEntry) -> bool {
        self.0.contains(&(e.ino, e.generation, e.mod_seq))
    }
}

/// The end of a job on a node, run by the last of its `cascade run`s to end: commit what the
/// job left uncommitted (if every rank succeeded), and make sure the newest checkpoint of
/// each directory is flushed. `before`: the files' versions when the job started on the node,
/// if known; a top-level entry is the job's to commit when a file below was written since
/// then, or is not durable yet (an agent may have uploaded the job's files long before its
/// end, the ranks of a node sharing one).
pub fn end_of_job(
    store: &Store,
    job_succeeded: bool,
    before: Option<&FileVersions>,
    rules: &CheckpointRules,
) {
    // Writers that died are torn now, not "still open".
    store.sweep_descriptions();
    if job_succeeded && !rules.is_empty() {
        // What the checkpoint rules name first (the newest directory of each series too), so
        // that the top-level directory above them is not committed as one checkpoint.
        if let Ok(tree) = store.life_tree("/") {
            let done = cascade_agent::commit_by_rules(store, rules, &tree, true);
            for failure in done.failures {
                eprintln!("cascade: {failure}");
            }
        }
    }
    let Ok(tree) = store.life_tree("/") else {
        return;
    };
    if job_succeeded {
        let top_level = tree
            .iter()
            .filter(|e| e.path != "/" && e.path.rfind('/') == Some(0));
        for top in top_level {
            let below: Vec<&LifeEntry> = tree
                .iter()
                .filter(|e| e.is_at_or_below(&top.path))
                .collect();
            let nested = below.iter().any(|e| e.committed);
            let written = below.iter().any(|e| {
                e.kind == FileKind::File
                    && (!e.durable() || before.is_some_and(|versions| !versions.holds(e)))
            });
            let busy = below.iter().any(|e| e.writers > 0 || e.torn);
            if !nested && written && !busy {
                let _ = store.commit_implicit(&top.path);
            }
        }
    }
    // The newest committed checkpoint of each directory goes to the durable store.
    let Ok(tree) = store.life_tree("/") else {
        return;
    };
    let mut newest: std::collections::BTreeMap<&str, &LifeEntry> = Default::default();
    for e in tree.iter().filter(|e| e.committed) {
        let slot = newest.entry(e.parent_dir()).or_insert(e);
        if e.commit_seq > slot.commit_seq {
            *slot = e;
        }
    }
    for e in newest.values() {
        if !e.flush {
            let _ = store.set_flush(&e.path);
        }
    }
}
