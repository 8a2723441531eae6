//! The checkpoint lifecycle commands: agent, commit, wait, ls --levels; and the agent that
//! `cascade run` embeds when none is running (docs/agent.md).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_agent::{Agent, AgentOptions, CheckpointRules, JobOptions};
use cascade_config::{format_size, Config};
use cascade_dedup::Compression;
use cascade_durable::DurableStore;
use cascade_lifecycle::Level;
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

/// Opens the configured durable store for the agent (few retries per request).
pub fn open_durable(url: &str) -> Result<DurableStore, Failure> {
    Ok(cascade_lifecycle::open_durable(url)?)
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
    serve_agent_metrics(config, &agent)?;
    let staging = agent.stats().staging;
    let dedup = match &agent.options().dedup {
        Some(d) => format!(
            " (dedup repository: {}, {}{}{})",
            d.chunking,
            d.compression,
            if d.adaptive {
                format!(
                    " (auto: up to zstd:{})",
                    cascade_dedup::adaptive::AUTO_MAX_LEVEL
                )
            } else {
                String::new()
            },
            if d.delta && d.compression != Compression::None {
                ", deltas"
            } else {
                ""
            }
        ),
        None => String::new(),
    };
    cascade_observe::info!(
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
        cascade_observe::info!(
            "cascade agent: dedup: {} checkpoints, {} of file data, {} new, {} stored ({} chunks \
             as deltas)",
            s.dedup_checkpoints,
            format_size(s.dedup_bytes),
            format_size(s.dedup_new_bytes),
            format_size(s.dedup_stored_bytes),
            s.dedup_delta_chunks
        );
    }
    cascade_observe::info!(
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

/// The agent's metrics endpoint (agent.metrics), if configured. It holds the agent weakly:
/// the endpoint outlives nothing.
fn serve_agent_metrics(config: &Config, agent: &Arc<Agent>) -> Result<(), Failure> {
    let agent = Arc::downgrade(agent);
    crate::observe::serve_metrics(config, "agent.metrics", "cascade agent", move || {
        agent
            .upgrade()
            .map(|a| cascade_agent::metrics::render(&a.stats()))
            .unwrap_or_default()
    })
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
    let done = cascade_lifecycle::commit(&store, path)?;
    let mut line = format!("committed {path} (checkpoint #{}", done.seq);
    if !done.flushed {
        line.push_str(", kept in memory only: not an Nth checkpoint (checkpoint.flush_every)");
    }
    line.push(')');
    if done.flushed && !done.agent_running {
        line.push_str(
            "; no agent is running: it drains when 'cascade agent' or 'cascade run' starts one",
        );
    }
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}

/// `cascade wait PATH --level LEVEL --timeout SECS`.
/// `cascade wait`'s exit code when the time ran out but the path may still get there.
pub const EXIT_TIMED_OUT: u8 = 3;

pub fn wait(
    config: &Config,
    path: &str,
    level: crate::cli::WaitLevel,
    timeout: f64,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    let level = Level::from(level);
    if !(timeout.is_finite() && timeout >= 0.0) {
        return Err(Failure::new(
            "wait: --timeout must be a number of seconds >= 0",
        ));
    }
    let store = attach(config)?;
    let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX);
    let waited = cascade_lifecycle::wait(config, &store, path, level, timeout);
    // Timed out (it may still get there) and cannot get there are different exits.
    let failed = |e: cascade_lifecycle::Error| {
        let timed_out = e.errno == Some(libc::ETIMEDOUT);
        let code = if timed_out {
            EXIT_TIMED_OUT
        } else {
            crate::failure::EXIT_FAILURE
        };
        if as_json {
            let outcome = if timed_out { "timed_out" } else { "never" };
            println!(
                "{}",
                serde_json::json!({
                    "path": path, "wanted": level.name(), "reached": false,
                    "outcome": outcome, "error": e.message,
                })
            );
        }
        Failure {
            message: e.message,
            code,
        }
    };
    let done = waited.map_err(failed)?;
    if as_json {
        println!(
            "{}",
            serde_json::json!({
                "path": path, "wanted": level.name(), "reached": true, "outcome": "reached",
                "level": done.level, "files": done.files, "seconds": done.seconds,
                "only_durable": done.only_durable,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    if done.only_durable {
        println!("{path}: durable (complete in the durable store)");
    } else if level == Level::Memory {
        println!("{path}: in memory");
    } else {
        println!(
            "{path}: {} ({} files) after {:.3} s",
            done.level, done.files, done.seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `cascade ls --levels [PATH]`: every entry below PATH with where it lives and its state,
/// then the checkpoints only the durable store still has.
pub fn ls_levels(config: &Config, path: &str, as_json: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let entries = cascade_lifecycle::levels(config, &store, path)?;
    if as_json {
        let entries: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "path": e.path,
                    "is_dir": e.is_dir,
                    "level": e.level,
                    "size": e.size,
                    "state": e.state,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "path": path, "entries": entries })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<13} {:>10}  {:<40} PATH", "LEVEL", "SIZE", "STATE");
    for e in &entries {
        let size = e.size.map(format_size).unwrap_or_default();
        // Checkpoints only the durable store has are listed without the trailing slash.
        let suffix = if e.is_dir && e.level == "-" { "/" } else { "" };
        println!(
            "{:<13} {size:>10}  {:<40} {}{suffix}",
            e.level, e.state, e.path
        );
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
        serve_agent_metrics(config, &agent)?;
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
