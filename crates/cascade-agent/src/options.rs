//! What the agent is told to do: its options (flags, environment and config file map onto
//! them in the CLI), and the counters it reports.

use std::sync::Arc;
use std::time::Duration;

use cascade_dedup::{Chunking, Compression};
use cascade_secret::Secret;
use cascade_wire::auth::Credential;
use cascade_wire::tls::rustls;
use serde::{Deserialize, Serialize};

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
    /// The job this node's checkpoints belong to, when it runs on several nodes: a
    /// checkpoint is complete once every node's part is durable.
    pub job: Option<JobOptions>,
    /// What a checkpoint is for programs that never commit (`checkpoint.rules`).
    pub rules: CheckpointRules,
}

/// What a checkpoint is for programs that never call `cascade_commit`
/// (`checkpoint.rules`): patterns of file names, committed as single-file checkpoints once
/// closed, and of directory names, committed once a newer sibling of the same pattern
/// appears (or at the end of the job, or after the quiet time).
#[derive(Debug, Clone, Default)]
pub struct CheckpointRules {
    pub files: Vec<glob::Pattern>,
    pub dirs: Vec<glob::Pattern>,
    /// `checkpoint.quiet`: the newest directory of a series is committed once nothing below
    /// it was modified for this long (and every file below it is closed); None = never before
    /// a newer sibling appears or the job ends.
    pub quiet: Option<Duration>,
}

/// What the rule `builtin` stands for: the restart files of common codes. LAMMPS
/// (`restart N restart.*`, or `*.restart` as in its examples), GROMACS (`mdrun -cpo`,
/// `state.cpt` by default) and the bundled heat solver (`ckpt.<step>/`).
pub const BUILTIN_RULES: &str = "restart.*,*.restart,*.cpt,ckpt.*/";

impl CheckpointRules {
    /// Comma-separated globs of names; a trailing '/' makes a directory rule; `builtin`
    /// stands for [`BUILTIN_RULES`].
    pub fn parse(text: &str) -> Result<CheckpointRules, String> {
        let mut rules = CheckpointRules::default();
        let listed = text.split(',').map(str::trim).flat_map(|r| match r {
            "builtin" => BUILTIN_RULES.split(',').collect::<Vec<_>>(),
            _ => vec![r],
        });
        for rule in listed.filter(|r| !r.is_empty()) {
            let (name, dir) = match rule.strip_suffix('/') {
                Some(name) => (name, true),
                None => (rule, false),
            };
            if name.is_empty() || name.contains('/') {
                return Err(format!(
                    "checkpoint rule {rule:?}: a pattern of names, without '/'"
                ));
            }
            let pattern =
                glob::Pattern::new(name).map_err(|e| format!("checkpoint rule {rule:?}: {e}"))?;
            if dir {
                rules.dirs.push(pattern);
            } else {
                rules.files.push(pattern);
            }
        }
        Ok(rules)
    }

    /// The same rules with the quiet time of directory rules (`checkpoint.quiet`; zero = off).
    pub fn with_quiet(mut self, quiet: Duration) -> CheckpointRules {
        self.quiet = (!quiet.is_zero()).then_some(quiet);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty()
    }
}

/// The job a node's agent works for (from the launcher: Slurm, Open MPI, or CASCADE_JOB_*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOptions {
    /// This node's name (one path component: it names the node's part of a checkpoint).
    pub node: String,
    /// How many nodes write each checkpoint.
    pub nodes: u32,
    /// Their names, when the launcher gives them (empty otherwise).
    pub node_names: Vec<String>,
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
            job: None,
            rules: CheckpointRules::default(),
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
    /// Durable files outside every checkpoint made remote for writers waiting for space.
    #[serde(default)]
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    pub fetched_files: u64,
    pub fetched_bytes: u64,
    /// Staged copies read-through passed over because the job did not write them (their
    /// tag did not verify).
    #[serde(default)]
    pub untrusted_staged: u64,
    /// Staged files (sent again) and checkpoints (stored by the node, with dedup) whose
    /// staging server had not answered for `staging.give_up_after`.
    #[serde(default)]
    pub staged_given_up: u64,
    pub failures: u64,
    /// Files waiting for upload at the end of the last pass (not counting files in writing).
    pub pending_files: u64,
    pub pending_bytes: u64,
    pub last_error: Option<String>,
    /// When `last_error` happened: seconds since the Unix epoch.
    #[serde(default)]
    pub last_error_time: Option<f64>,
    /// Store paths being uploaded right now.
    pub uploading: Vec<String>,
    /// Entries of the agent's caches after its last pass: file digests remembered, and
    /// files or checkpoints waiting to be retried. Neither grows past the number of entries in the store.
    #[serde(default)]
    pub cached_digests: u64,
    #[serde(default)]
    pub retrying: u64,
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
    /// The compression the next checkpoint is stored with (`zstd:-1`, ...; "" before the
    /// first), `auto` when the agent adapts it, and why it last moved.
    #[serde(default)]
    pub dedup_compression: String,
}

/// How checkpoints are cut and stored in the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupOptions {
    pub chunking: Chunking,
    pub compression: Compression,
    /// Add each file with the same file of the previous checkpoint in its series as its base
    /// (docs/dedup.md, "Delta blobs"); only with compression.
    pub delta: bool,
    /// `dedup.compress = auto`: `compression` is the level to start at, and the agent moves
    /// the level between `cascade_dedup::adaptive::AUTO_MIN_LEVEL` and `AUTO_MAX_LEVEL` from
    /// each checkpoint's measured ingest and upload (docs/dedup.md, "Adaptive level"); through
    /// staging servers, the upload is the time until they made the checkpoint durable.
    pub adaptive: bool,
    /// The writer sessions' lease recorded in a repository the agent creates
    /// (`dedup.session_lease`; an existing repository keeps its own).
    pub session_lease: Duration,
}

/// How a node's files are spread over the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// File by file, round robin over every server: a node's stream uses them all.
    Stripe,
    /// Every file of this node goes to one server chosen by the node's name (a staging
    /// group: each server serves the nodes that hash to it); the others are fallbacks.
    Group,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Placement, String> {
        match s {
            "stripe" => Ok(Placement::Stripe),
            "group" => Ok(Placement::Group),
            other => Err(format!("{other:?} is not a placement (stripe or group)")),
        }
    }
}

/// How a checkpoint goes through the servers with dedup on (docs/dedup.md, "Through
/// staging servers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupStaging {
    /// The agent builds packs, index object and manifest as when it writes the repository
    /// itself, and stages them as files; the servers drain them, the manifest last.
    Packs,
    /// The agent sends the chunks a server lacks; the servers check them, pack them and
    /// write the repository (a second node's `Lacks` see chunks not yet durable).
    Chunks,
}

impl std::str::FromStr for DedupStaging {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<DedupStaging, String> {
        match s {
            "packs" => Ok(DedupStaging::Packs),
            "chunks" => Ok(DedupStaging::Chunks),
            other => Err(format!(
                "{other:?} is not a dedup staging form (packs or chunks)"
            )),
        }
    }
}

#[derive(Clone)]
pub struct StagingOptions {
    /// `host:port` of every staging server.
    pub servers: Vec<String>,
    /// The cluster secret or this job's credential (Debug shows neither).
    pub credential: Credential,
    /// Key prefix of this job on the servers ("" = none); the servers drain to
    /// `<drain-to>/<namespace>/...`.
    pub namespace: String,
    pub placement: Placement,
    /// With dedup on: packs or chunks through the servers.
    pub dedup: DedupStaging,
    /// Data bytes per Write frame.
    pub frame_bytes: usize,
    /// Data bytes sent between Syncs (each Sync acknowledges the files sealed before it).
    pub sync_bytes: u64,
    /// This node's name (staging groups).
    pub node: String,
    /// Speak TLS to the servers, trusting this config's CAs (`staging.tls_ca`); None: plain
    /// TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// While every server is watched (Watch, docs/staging.md), how often the agent asks
    /// them what has drained without having heard of an event: a fallback only.
    pub ask_every: Duration,
    /// A staged file whose server has not answered this long is sent again from the node;
    /// with dedup, a staged checkpoint no server has said it holds for this long is stored
    /// from the node (`staging.give_up_after`; never sooner than
    /// `Repo::staged_manifest_trusted` after its push).
    pub give_up_after: Duration,
}

/// Shows whether TLS is on, not the config's insides.
impl std::fmt::Debug for StagingOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingOptions")
            .field("servers", &self.servers)
            .field("credential", &self.credential)
            .field("namespace", &self.namespace)
            .field("placement", &self.placement)
            .field("dedup", &self.dedup)
            .field("frame_bytes", &self.frame_bytes)
            .field("sync_bytes", &self.sync_bytes)
            .field("node", &self.node)
            .field("tls", &self.tls.is_some())
            .field("ask_every", &self.ask_every)
            .field("give_up_after", &self.give_up_after)
            .finish()
    }
}

impl StagingOptions {
    /// Options of an agent holding the cluster secret.
    pub fn new(servers: Vec<String>, secret: &str) -> StagingOptions {
        StagingOptions::with(servers, Credential::ClusterSecret(Secret::new(secret)))
    }

    pub fn with(servers: Vec<String>, credential: Credential) -> StagingOptions {
        let node = cascade_wire::host_name();
        StagingOptions {
            servers,
            credential,
            namespace: String::new(),
            placement: Placement::Stripe,
            dedup: DedupStaging::Packs,
            frame_bytes: 8 << 20,
            sync_bytes: 256 << 20,
            node,
            tls: None,
            ask_every: Duration::from_secs(5),
            give_up_after: Duration::from_secs(600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CheckpointRules;

    #[test]
    fn builtin_stands_for_the_rules_of_common_codes_and_combines_with_others() {
        let rules = CheckpointRules::parse("builtin, my_*.chk").expect("rules");
        let files: Vec<&str> = rules.files.iter().map(|p| p.as_str()).collect();
        let dirs: Vec<&str> = rules.dirs.iter().map(|p| p.as_str()).collect();
        assert_eq!(files, ["restart.*", "*.restart", "*.cpt", "my_*.chk"]);
        assert_eq!(dirs, ["ckpt.*"]);
    }

    #[test]
    fn options_never_show_the_shared_secret() {
        let staging = super::StagingOptions::new(vec!["h:1".into()], "TOPSECRET");
        let client = cascade_wire::ClientOptions::new("TOPSECRET");
        let key = cascade_wire::auth::JobKey::derive("TOPSECRET", "ns");
        let job = super::StagingOptions::with(
            vec!["h:1".into()],
            cascade_wire::auth::Credential::Job(key.clone()),
        );
        for shown in [
            format!("{staging:?}"),
            format!("{client:?}"),
            format!("{job:?}"),
        ] {
            assert!(!shown.contains("TOPSECRET"), "{shown}");
            assert!(!shown.contains(&key.credential()[..16]), "{shown}");
        }
        assert_eq!(staging.credential.key_for("ns"), key);
    }
}
