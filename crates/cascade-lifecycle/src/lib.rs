//! The checkpoint lifecycle as a library: commit a path, wait until it reaches a level, and
//! list where every entry below a path lives. `cascade commit`, `cascade wait` and
//! `cascade ls --levels` print what these return; the Python package (crates/cascade-python)
//! returns it as Python objects, so both behave the same by construction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_config::Config;
use cascade_dedup::repo::{Repo, DEFAULT_PREFIX};
use cascade_durable::{DurableKey, DurableStore, Options as DurableOptions, Spec};
use cascade_store::{errno_text, FileKind, LifeEntry, Status, Store};
use serde_json::json;

/// A failure as one line, with the errno when there is one (a store error), so that callers
/// can tell "no such checkpoint" from "timed out".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub errno: Option<i32>,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(message: impl Into<String>) -> Error {
        Error {
            errno: None,
            message: message.into(),
        }
    }

    pub fn with_errno(errno: i32, message: impl Into<String>) -> Error {
        Error {
            errno: Some(errno),
            message: message.into(),
        }
    }

    /// A store error about `what` (a store path, or "store NAME"): "/ckpt/a: No such file
    /// or directory". Whatever more the store says goes in parentheses after it.
    pub fn store(what: &str, err: &cascade_store::Error) -> Error {
        let text = errno_text(err.errno());
        let context = err.context();
        let message = if context.is_empty()
            || context.trim_start_matches('/') == what.trim_start_matches('/')
        {
            format!("{what}: {text}")
        } else {
            format!("{what}: {text} ({context})")
        };
        Error::with_errno(err.errno(), message)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Opens a durable store for the agent or for a lookup: few retries per request, since the
/// agent retries whole files itself with its own backoff.
pub fn open_durable(url: &str) -> Result<DurableStore> {
    let spec = Spec::parse(url).map_err(|e| Error::new(e.to_string()))?;
    let opts = DurableOptions {
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
        ..DurableOptions::default()
    };
    DurableStore::open_with(spec, opts).map_err(|e| Error::new(e.to_string()))
}

/// What [`commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The checkpoint's sequence number in the store.
    pub seq: u64,
    /// It goes to the durable store (every Nth checkpoint does: checkpoint.flush_every).
    pub flushed: bool,
    /// An agent is registered in the store (else it drains when one starts).
    pub agent_running: bool,
}

/// Marks `path` (a file or directory) as a complete checkpoint.
pub fn commit(store: &Store, path: &str) -> Result<Committed> {
    // A file closed through a FUSE mount is released by the kernel a moment after close()
    // returned (docs/fuse.md): such a writer gets a short while before EBUSY is reported.
    let deadline = Instant::now() + Duration::from_secs(2);
    let seq = loop {
        match store.commit(path, false) {
            Err(e) if e.errno() == libc::EBUSY && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            done => break done.map_err(|e| Error::store(path, &e))?,
        }
    };
    let root = store
        .life_tree(path)
        .ok()
        .and_then(|t| t.into_iter().next());
    Ok(Committed {
        seq,
        flushed: root.as_ref().is_some_and(|r| r.flush),
        agent_running: store.agent_pid().is_some(),
    })
}

/// A level [`wait`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// In the node store (it is, once written).
    Memory,
    /// Safe from the loss of this node: a staging server or the durable store holds it.
    Staged,
    Durable,
}

impl std::str::FromStr for Level {
    type Err = Error;
    fn from_str(s: &str) -> Result<Level> {
        match s {
            "memory" => Ok(Level::Memory),
            "staged" => Ok(Level::Staged),
            "durable" => Ok(Level::Durable),
            _ => Err(Error::with_errno(
                libc::EINVAL,
                format!("wait: unknown level {s:?} (use memory, staged or durable)"),
            )),
        }
    }
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Memory => "memory",
            Level::Staged => "staged",
            Level::Durable => "durable",
        }
    }
}

/// What [`wait`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    /// The level it is at: "memory", "staged" or "durable" (at least the level waited for).
    pub level: &'static str,
    /// Files of the checkpoint (0 when only the durable store still has it).
    pub files: usize,
    pub seconds: f64,
    /// Gone from the node store; complete in the durable store.
    pub only_durable: bool,
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
fn durable_complete(config: &Config, path: &str) -> Result<bool> {
    let Some(url) = config.durable_url() else {
        return Ok(false);
    };
    let durable = Arc::new(open_durable(&url)?);
    complete_in(&durable, &DurableKey::from_store_path(path))
}

/// Whether checkpoint `ckpt` is complete in `durable`: its marker in the plain layout, or its
/// manifest in the dedup repository.
pub fn complete_in(durable: &Arc<DurableStore>, ckpt: &str) -> Result<bool> {
    let failed = |e: &dyn std::fmt::Display| Error::new(format!("{}: {e}", durable.name()));
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

/// Waits until `path` is at `level` (at most `timeout`); fails at once when it cannot get
/// there (a torn file, a writer, no agent running) and says why. A path gone from the node
/// store counts as durable when the durable store has it complete.
pub fn wait(
    config: &Config,
    store: &Store,
    path: &str,
    level: Level,
    timeout: Duration,
) -> Result<Waited> {
    let staged = level == Level::Staged;
    let name = level.name();
    let started = Instant::now();
    let deadline = started.checked_add(timeout);
    loop {
        // Read before looking, so a level reached meanwhile ends the sleep below at once.
        let progress = store.progress_counter();
        let tree = match store.life_tree(path) {
            Ok(t) => t,
            Err(e) if e.errno() == libc::ENOENT && level != Level::Memory => {
                // Evicted from memory once durable, or never here: ask the durable store.
                if durable_complete(config, path)? {
                    return Ok(Waited {
                        level: "durable",
                        files: 0,
                        seconds: started.elapsed().as_secs_f64(),
                        only_durable: true,
                    });
                }
                return Err(Error::store(path, &e));
            }
            Err(e) => return Err(Error::store(path, &e)),
        };
        let p = progress_of(&tree, staged);
        if level == Level::Memory {
            return Ok(Waited {
                level: "memory",
                files: p.files,
                seconds: started.elapsed().as_secs_f64(),
                only_durable: false,
            });
        }
        if p.reached {
            let root = &tree[0];
            let how = if root.complete()
                || tree.iter().all(|e| e.kind != FileKind::File || e.durable())
            {
                "durable"
            } else {
                "staged"
            };
            return Ok(Waited {
                level: how,
                files: p.files,
                seconds: started.elapsed().as_secs_f64(),
                only_durable: false,
            });
        }
        if let Some(why) = &p.stuck {
            return Err(Error::new(format!("{path}: cannot become {name}: {why}")));
        }
        let parts = || {
            job_parts(config, path)
                .map(|parts| format!("; the job's checkpoint has {parts}"))
                .unwrap_or_default()
        };
        if store.agent_pid().is_none() {
            return Err(Error::new(format!(
                "{path}: not {name} yet ({} of {} files{}) and no agent is running for store \
                 {}; start one with 'cascade agent' (or run the job under 'cascade run' with a \
                 durable store configured)",
                p.durable_files,
                p.files,
                parts(),
                store.name()
            )));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let last = cascade_agent::status(store.name()).and_then(|s| s.last_error);
            return Err(Error::with_errno(
                libc::ETIMEDOUT,
                format!(
                    "{path}: timed out after {} s: {} of {} files {name}{}{}",
                    timeout.as_secs_f64(),
                    p.durable_files,
                    p.files,
                    parts(),
                    last.map(|e| format!("; the agent's last error: {e}"))
                        .unwrap_or_default()
                ),
            ));
        }
        // Woken when a level is reached; the timeout still notices a dead agent.
        let left = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(now));
        store.wait_for_progress(progress, Duration::from_millis(100).min(left));
    }
}

/// One line of `cascade ls --levels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelEntry {
    pub path: String,
    pub is_dir: bool,
    /// Where a file's bytes are ("memory", "spill", "memory+spill", "durable"); "-" for a
    /// directory. "durable" or "parts" for a checkpoint only the durable store has.
    pub level: &'static str,
    /// Bytes of a file; None for a directory and a checkpoint not in the store.
    pub size: Option<u64>,
    /// "checkpoint #3 complete", "dirty", "durable", "writing", ... ("" for a plain directory).
    pub state: String,
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

/// Every entry below `path` (the root "/" left out) with where it lives and its state, then
/// the checkpoints only the durable store still has, and those of several nodes not complete
/// yet with whose parts are in.
pub fn levels(config: &Config, store: &Store, path: &str) -> Result<Vec<LevelEntry>> {
    let tree = store.life_tree(path).map_err(|e| Error::store(path, &e))?;
    let mut out = Vec::new();
    for e in &tree {
        if e.path == "/" {
            continue;
        }
        let is_dir = e.kind == FileKind::Dir;
        out.push(LevelEntry {
            path: e.path.clone(),
            is_dir,
            level: if is_dir { "-" } else { residence(e) },
            size: (!is_dir).then_some(e.size),
            state: state_of(e, &tree),
        });
    }
    let Some(url) = config.durable_url() else {
        return Ok(out);
    };
    let durable = Arc::new(open_durable(&url)?);
    let objects = durable
        .list(&DurableKey::from_store_path(path))
        .map_err(|e| Error::new(e.to_string()))?;
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
            out.push(LevelEntry {
                path: store_path,
                is_dir: true,
                level: "durable",
                size: None,
                state: "checkpoint complete (not in memory)".to_string(),
            });
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
            out.push(LevelEntry {
                path: format!("/{ckpt}"),
                is_dir: true,
                level: "parts",
                size: None,
                state: cascade_durable::PartsIn::of(&parts).describe(),
            });
        }
    }
    Ok(out)
}

/// What `cascade status` reports.
pub struct StatusReport {
    pub status: Status,
    /// The processes attached to the store other than the caller.
    pub others: Vec<u32>,
    /// The agent's counters, if one answers on its control socket.
    pub agent: Option<cascade_agent::AgentStats>,
}

/// Gathers what `cascade status` reports about `store`.
pub fn status_report(store: &Store) -> StatusReport {
    let status = store.status();
    let me = std::process::id();
    let others = status
        .attached_pids
        .iter()
        .copied()
        .filter(|&pid| pid != me)
        .collect();
    let agent = cascade_agent::status(&status.name);
    StatusReport {
        status,
        others,
        agent,
    }
}

/// `cascade status --json`: the store's status, the attached processes `others` than the
/// caller, and the agent's counters if one answers.
pub fn status_json(
    s: &Status,
    others: &[u32],
    agent: Option<&cascade_agent::AgentStats>,
) -> serde_json::Value {
    json!({
        "name": s.name,
        "created_ns": s.created,
        "block_bytes": s.block_bytes,
        "chunk_size": s.chunk_size,
        "memory_capacity": s.memory_capacity,
        "memory_used": s.memory_used,
        "spill_path": s.spill_path.as_ref().map(|p| p.display().to_string()),
        "spill_capacity": s.spill_capacity,
        "spill_used": s.spill_used,
        "leased_bytes": s.leased_bytes,
        "files": s.files,
        "dirs": s.dirs,
        "max_files": s.max_files,
        "map_nodes_used": s.map_nodes_used,
        "map_nodes_total": s.map_nodes_total,
        "attached_pids": others,
        "prefaulted_bytes": s.prefaulted_bytes,
        "last_enospc": s.last_enospc.as_ref().map(|e| json!({
            "time_ns": e.time,
            "pid": e.pid,
            "reason": e.reason,
        })),
        "agent": agent,
    })
}
