//! The table of settings. To add one: add a row (key, env var, optional flag, help, how to
//! parse, how to default), then read it where it is used with `Config::get`.

use std::path::{Path, PathBuf};

use cascade_secret::Secret;

use crate::job;
use crate::machine::{self, SHM_DIR};
use crate::size::{format_size, parse_size};
use crate::{Resolved, Value};

/// One configurable setting.
#[derive(Debug)]
pub struct SettingDef {
    /// Dotted key, also its place in the config file ("store.capacity" is `capacity` under
    /// `[store]`).
    pub key: &'static str,
    /// Environment variable.
    pub env: &'static str,
    /// Long command-line flag without the dashes, for settings that have one.
    pub flag: Option<&'static str>,
    /// Older names of the flag, still accepted (hidden from --help).
    pub aliases: &'static [&'static str],
    /// Placeholder for the value in --help ("SIZE", "PATH").
    pub value_name: &'static str,
    /// What it is, with its unit, in one sentence (for --help and docs).
    pub help: &'static str,
    /// How the default is chosen, in words (the value itself may depend on the machine).
    pub default_help: &'static str,
    /// Parses and checks text from a flag, the environment or the file; errors are a short
    /// phrase that goes after "<origin>=<text>: ".
    pub parse: fn(&str) -> Result<Value, String>,
    /// The default, and how it was derived (empty for constants). May read settings that
    /// come earlier in the table.
    pub default: fn(&Resolved) -> (Value, String),
}

/// Every setting, in resolution order (defaults may only use settings above them).
pub static SETTINGS: &[SettingDef] = &[
    SettingDef {
        key: "store.name",
        env: "CASCADE_STORE",
        flag: Some("store"),
        aliases: &[],
        value_name: "NAME",
        help: "Name of the node store's POSIX shared-memory object, e.g. /cascade-ckpt",
        default_help: "/cascade-<uid>, so two users never collide",
        parse: parse_store_name,
        default: |_| {
            (
                Value::Text(cascade_store::default_store_name()),
                String::new(),
            )
        },
    },
    SettingDef {
        key: "store.chunk_size",
        env: "CASCADE_CHUNK_SIZE",
        flag: Some("chunk-size"),
        aliases: &[],
        value_name: "SIZE",
        help: "Size of the chunks file data is stored in: a power of two from 4KiB to 64MiB",
        default_help: "1MiB",
        parse: parse_chunk_size,
        default: |_| (Value::Bytes(1 << 20), String::new()),
    },
    SettingDef {
        key: "store.capacity",
        env: "CASCADE_CAPACITY",
        flag: Some("capacity"),
        aliases: &[],
        value_name: "SIZE",
        help: "Bytes of memory for file data, rounded down to whole chunks",
        default_help: "25% of RAM, at most half the free space in /dev/shm",
        parse: parse_bytes,
        default: default_capacity,
    },
    SettingDef {
        key: "store.max_files",
        env: "CASCADE_MAX_FILES",
        flag: Some("max-files"),
        aliases: &[],
        value_name: "N",
        help: "Most files plus directories the store can hold (the root counts as one)",
        default_help: "65536",
        parse: parse_max_files,
        default: |_| (Value::Count(65536), String::new()),
    },
    SettingDef {
        key: "store.prefault",
        env: "CASCADE_PREFAULT",
        flag: Some("prefault"),
        aliases: &[],
        value_name: "MODE",
        help: "When memory is faulted in: foreground (before init returns), background \
               (while the store is already usable) or off (on first write)",
        default_help: "foreground",
        parse: parse_prefault,
        default: |_| (Value::Text("foreground".to_string()), String::new()),
    },
    SettingDef {
        key: "spill.path",
        env: "CASCADE_SPILL_PATH",
        flag: Some("spill-path"),
        aliases: &[],
        value_name: "PATH",
        help: "File on local SSD that takes chunks once memory is full",
        default_help: "/var/tmp/<store name>.spill, i.e. /var/tmp/cascade-<uid>.spill",
        parse: parse_path,
        default: default_spill_path,
    },
    SettingDef {
        key: "spill.size",
        env: "CASCADE_SPILL_SIZE",
        flag: Some("spill-size"),
        aliases: &[],
        value_name: "SIZE",
        help: "Bytes reserved in the spill file, rounded down to whole chunks; 0 disables spill",
        default_help:
            "the memory capacity, at most 25% of the free space where the spill file goes",
        parse: parse_bytes,
        default: default_spill_size,
    },
    SettingDef {
        key: "mount.prefix",
        env: "CASCADE_MOUNT",
        flag: Some("mount"),
        aliases: &[],
        value_name: "PATH",
        help: "Mount prefix: under 'cascade run', paths at or below it are files of the store, \
               every other path is the real file system",
        default_help: "/cascade",
        parse: parse_mount_prefix,
        default: |_| (Value::Text(DEFAULT_MOUNT.to_string()), String::new()),
    },
    SettingDef {
        key: "durable.url",
        env: "CASCADE_DURABLE",
        flag: Some("durable"),
        aliases: &[],
        value_name: "URL",
        help: "The durable store checkpoints drain to: a directory (/path or file:///path) or s3://bucket[/prefix]?endpoint=URL (credentials from CASCADE_S3_* / AWS_*); empty = none (checkpoints stay on the node)",
        default_help: "none",
        parse: parse_durable_url,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "files.mode",
        env: "CASCADE_FILE_MODE",
        flag: None,
        aliases: &[],
        value_name: "OCTAL",
        help: "Permission bits of the files holding checkpoint data that the agent, cascade run, cascade drain and staging servers create in a durable-store directory and a staging server's directory (arenas, indexes, chunk segments); their directories get the same bits plus x where r is set. Checkpoints are private data",
        default_help: "0600 (directories 0700)",
        parse: parse_file_mode,
        default: |_| (Value::Text("0600".to_string()), String::new()),
    },
    SettingDef {
        key: "agent.uploads",
        env: "CASCADE_AGENT_UPLOADS",
        flag: Some("uploads"),
        aliases: &[],
        value_name: "N",
        help: "Files the node agent uploads at once (each in parts of 8MiB, 4 in flight), i.e. the agent's threads competing with the application",
        default_help: "1",
        parse: |t| parse_count_in(t, 1, 64),
        default: |_| (Value::Count(1), String::new()),
    },
    SettingDef {
        key: "checkpoint.keep",
        env: "CASCADE_KEEP",
        flag: Some("keep-in-memory"),
        aliases: &["keep"],
        value_name: "K",
        help: "Newest committed checkpoints of each directory kept in memory; older ones are evicted once they are durable",
        default_help: "2",
        parse: |t| parse_count_in(t, 1, 1 << 20),
        default: |_| (Value::Count(2), String::new()),
    },
    SettingDef {
        key: "checkpoint.rules",
        env: "CASCADE_CHECKPOINT_RULES",
        flag: None,
        aliases: &[],
        value_name: "GLOB[/],...",
        help: "What a checkpoint is for a program that never calls cascade_commit: file names (restart.*, *.cpt) committed as single-file checkpoints when closed, directory names with a trailing / (ckpt_*/) committed once a newer sibling of the same pattern appears or at the end of the job; builtin = the rules of LAMMPS, GROMACS and the heat example (restart.*,*.restart,*.cpt,ckpt.*/)",
        default_help: "none",
        parse: parse_rules,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "checkpoint.quiet",
        env: "CASCADE_CHECKPOINT_QUIET",
        flag: None,
        aliases: &[],
        value_name: "SECONDS",
        help: "With a directory rule of checkpoint.rules: a matching directory without a newer sibling is committed once every file below it is closed and nothing below it was modified for this long; 0 = only when a newer one appears or at the end of the job",
        default_help: "30",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(30_000), String::new()),
    },
    SettingDef {
        key: "checkpoint.flush_every",
        env: "CASCADE_FLUSH_EVERY",
        flag: Some("flush-every"),
        aliases: &[],
        value_name: "N",
        help: "Every Nth committed checkpoint goes to the durable store (the last of a job always does)",
        default_help: "1 (every checkpoint)",
        parse: |t| parse_count_in(t, 1, 1 << 20),
        default: |_| (Value::Count(1), String::new()),
    },
    SettingDef {
        key: "agent.full_wait",
        env: "CASCADE_FULL_WAIT",
        flag: Some("full-wait"),
        aliases: &[],
        value_name: "SECONDS",
        help: "How long a writer on a full store waits for the agent to make room (by evicting durable checkpoints) before it gets ENOSPC; 0 = ENOSPC at once",
        default_help: "60",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(60_000), String::new()),
    },
    SettingDef {
        key: "agent.metrics",
        env: "CASCADE_AGENT_METRICS",
        flag: Some("metrics"),
        aliases: &[],
        value_name: "ADDR:PORT",
        help: "Address the node agent serves Prometheus metrics on (plain HTTP, GET /metrics), e.g. 127.0.0.1:9470; empty = none (docs/operations.md)",
        default_help: "none",
        parse: |t| Ok(Value::Text(t.trim().to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "staging.servers",
        env: "CASCADE_STAGING",
        flag: Some("staging"),
        aliases: &[],
        value_name: "HOST:PORT,...",
        help: "Staging servers (L1) the agent sends closed files to before the durable store, comma-separated",
        default_help: "none: files go straight to the durable store",
        parse: parse_server_list,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "staging.secret_file",
        env: "CASCADE_STAGING_SECRET_FILE",
        flag: Some("staging-secret-file"),
        aliases: &[],
        value_name: "PATH",
        help: "File holding staging.secret (its first line), readable by its owner only: keeps the secret out of ps and the environment",
        default_help: "none",
        parse: parse_optional_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "staging.secret",
        env: "CASCADE_STAGING_SECRET",
        flag: Some("staging-secret"),
        aliases: &[],
        value_name: "TEXT",
        help: "The cluster's staging secret: staging servers need it; a client holding it may use any namespace (give jobs a staging.credential instead); prefer staging.secret_file (a flag shows in ps, a variable is inherited)",
        default_help: "the first line of staging.secret_file, else none; required by stage-server, and by clients without a staging.credential",
        parse: |t| Ok(Value::Secret(Secret::new(t))),
        default: |_| (Value::Secret(Secret::default()), String::new()),
    },
    SettingDef {
        key: "staging.credential_file",
        env: "CASCADE_STAGING_CREDENTIAL_FILE",
        flag: Some("staging-credential-file"),
        aliases: &[],
        value_name: "PATH",
        help: "File holding staging.credential (its first line), readable by its owner only",
        default_help: "none",
        parse: parse_optional_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "staging.credential",
        env: "CASCADE_STAGING_CREDENTIAL",
        flag: Some("staging-credential"),
        aliases: &[],
        value_name: "HEX",
        help: "This job's staging credential (64 hex digits, from `cascade stage-server credential`): opens the job's namespace on the staging servers and nothing else; used instead of staging.secret when both are given; prefer staging.credential_file",
        default_help: "the first line of staging.credential_file, else none (then staging.secret)",
        parse: |t| Ok(Value::Secret(Secret::new(t.trim()))),
        default: |_| (Value::Secret(Secret::default()), String::new()),
    },
    SettingDef {
        key: "staging.placement",
        env: "CASCADE_STAGING_PLACEMENT",
        flag: Some("placement"),
        aliases: &[],
        value_name: "stripe|group",
        help: "How a node's files are spread: stripe = file by file over all servers; group = one server per node (chosen by host name), the others as fallbacks",
        default_help: "stripe",
        parse: |t| match t {
            "stripe" | "group" => Ok(Value::Text(t.to_string())),
            _ => Err("expected stripe or group".into()),
        },
        default: |_| (Value::Text("stripe".into()), String::new()),
    },
    SettingDef {
        key: "staging.dedup",
        env: "CASCADE_STAGING_DEDUP",
        flag: Some("staging-dedup"),
        aliases: &[],
        value_name: "packs|chunks",
        help: "With dedup on, what goes through the staging servers: packs = the node builds packs, index and manifest as when it writes the repository itself and the servers drain them as files (the fastest to durable); chunks = the chunks a server lacks, which the servers check, pack and push (nodes see each other's chunks before they are durable)",
        default_help: "packs",
        parse: |t| match t {
            "packs" | "chunks" => Ok(Value::Text(t.to_string())),
            _ => Err("expected packs or chunks".into()),
        },
        default: |_| (Value::Text("packs".into()), String::new()),
    },
    SettingDef {
        key: "staging.give_up_after",
        env: "CASCADE_STAGING_GIVE_UP_AFTER",
        flag: Some("give-up-after"),
        aliases: &[],
        value_name: "SECONDS",
        help: "Staged files and checkpoints whose server has not answered for them this long (down, unreachable, or back without them) are sent again from the node, if it still holds them and the durable store does not: to a server that is up, else straight to the durable store (with dedup: into its repository, never sooner than a quarter of the repository's session lease after the push)",
        default_help: "600",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(600_000), String::new()),
    },
    SettingDef {
        key: "staging.namespace",
        env: "CASCADE_STAGING_NAMESPACE",
        flag: Some("staging-namespace"),
        aliases: &[],
        value_name: "PREFIX",
        help: "Key prefix of this job on the staging servers; they drain its files to <drain-to>/<PREFIX>/",
        default_help: "none",
        parse: parse_namespace,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "staging.tls_ca",
        env: "CASCADE_STAGING_TLS_CA",
        flag: Some("staging-tls-ca"),
        aliases: &[],
        value_name: "PATH",
        help: "PEM file of the CA certificate(s) a client trusts to have signed the staging servers' certificates; when set, clients speak TLS to the servers and verify them",
        default_help: "none: plain TCP",
        parse: parse_optional_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "dedup.chunking",
        env: "CASCADE_DEDUP",
        flag: Some("dedup"),
        aliases: &[],
        value_name: "off|on|fixed:SIZE|cdc:avg=SIZE",
        help: "Store checkpoints in the durable store's dedup repository, cut into chunks this way (fixed:4KiB, cdc:avg=64KiB, cdc:min=..,avg=..,max=..; on: fixed:64KiB), each distinct chunk once",
        default_help: "off: the plain layout",
        parse: |t| {
            if t == "off" {
                return Ok(Value::Text(t.to_string()));
            }
            if t == "on" {
                return Ok(Value::Text(cascade_dedup::Chunking::DEFAULT.to_string()));
            }
            t.parse::<cascade_dedup::Chunking>()
                .map(|c| Value::Text(c.to_string()))
                .map_err(|e| e.to_string())
        },
        default: |_| (Value::Text("off".into()), String::new()),
    },
    SettingDef {
        key: "dedup.compress",
        env: "CASCADE_COMPRESS",
        flag: Some("compress"),
        aliases: &[],
        value_name: "auto|off|zstd[:LEVEL]",
        help: "Compression of each new chunk in the dedup repository (skipped for a chunk it does not shrink by 1/8); LEVEL 1..=19, or -1..=-7 for zstd's fast levels; auto: zstd from level -2 (the fastest that keeps the reduction goals), one level harder after a checkpoint whose upload took longer than its ingest, one lighter after one whose ingest took longer, up to level 6",
        default_help: "auto",
        parse: |t| {
            if t == "off" || t == "auto" {
                return Ok(Value::Text(t.to_string()));
            }
            t.parse::<cascade_dedup::Compression>()
                .map(|c| Value::Text(c.to_string()))
                .map_err(|e| e.to_string())
        },
        default: |_| (Value::Text("auto".into()), String::new()),
    },
    SettingDef {
        key: "dedup.delta",
        env: "CASCADE_DEDUP_DELTA",
        flag: Some("delta"),
        aliases: &[],
        value_name: "on|off",
        help: "With compression on, a new chunk of a checkpoint file may be stored as a compressed XOR with the same file of the previous checkpoint in its directory (still in the store), where that is smaller",
        default_help: "on",
        parse: parse_on_off,
        default: |_| (Value::Text("on".into()), String::new()),
    },
    SettingDef {
        key: "dedup.session_lease",
        env: "CASCADE_DEDUP_SESSION_LEASE",
        flag: Some("session-lease"),
        aliases: &[],
        value_name: "SECONDS",
        help: "How long a writer of the dedup repository stays alive for garbage collection without renewing its session (a prune waits that long for a writer that died); recorded in the repository when it is created, and every writer, staging server and prune of it uses the recorded one",
        default_help: "900",
        parse: |t| match parse_seconds_as_ms(t)? {
            Value::Millis(ms) if ms >= cascade_dedup::repo::MIN_SESSION_LEASE_S * 1000 => {
                Ok(Value::Millis(ms))
            }
            _ => Err(format!(
                "must be at least {} seconds (writers renew every eighth of it)",
                cascade_dedup::repo::MIN_SESSION_LEASE_S
            )),
        },
        default: |_| (Value::Millis(900_000), String::new()),
    },
    SettingDef {
        key: "stage_server.listen",
        env: "CASCADE_STAGE_LISTEN",
        flag: Some("listen"),
        aliases: &[],
        value_name: "ADDR:PORT",
        help: "Address the staging server binds, e.g. 10.0.0.5:7070 (port 0 = any free port)",
        default_help: "none: required",
        parse: |t| Ok(Value::Text(t.to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "stage_server.dir",
        env: "CASCADE_STAGE_DIR",
        flag: Some("dir"),
        aliases: &[],
        value_name: "PATH",
        help: "Directory on the staging server's SSD for its arenas and index",
        default_help: "none: required",
        parse: parse_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "stage_server.drain_to",
        env: "CASCADE_STAGE_DRAIN_TO",
        flag: Some("durable"),
        aliases: &["drain-to"],
        value_name: "URL",
        help: "Durable store the staging server drains to: a directory or s3://bucket?endpoint=URL",
        default_help: "durable.url",
        parse: parse_durable_url,
        default: |r| (Value::Text(r.text("durable.url").to_string()), "durable.url".into()),
    },
    SettingDef {
        key: "stage_server.capacity",
        env: "CASCADE_STAGE_CAPACITY",
        flag: Some("ssd-capacity"),
        aliases: &[],
        value_name: "SIZE",
        help: "Most bytes of arenas the staging server keeps on its SSD (0 = as much as the file system holds)",
        default_help: "0",
        parse: parse_bytes,
        default: |_| (Value::Bytes(0), "no limit but the file system's free space".into()),
    },
    SettingDef {
        key: "stage_server.arena_size",
        env: "CASCADE_STAGE_ARENA_SIZE",
        flag: Some("arena-size"),
        aliases: &[],
        value_name: "SIZE",
        help: "Size of one arena (append-only segment file) on the staging server",
        default_help: "256MiB",
        parse: parse_bytes,
        default: |_| (Value::Bytes(256 << 20), String::new()),
    },
    SettingDef {
        key: "stage_server.buffers",
        env: "CASCADE_STAGE_BUFFERS",
        flag: Some("buffers"),
        aliases: &[],
        value_name: "N",
        help: "Receive buffers of 17 MiB the staging server faults in at start",
        default_help: "8",
        parse: |t| parse_count_in(t, 1, 1024),
        default: |_| (Value::Count(8), String::new()),
    },
    SettingDef {
        key: "stage_server.io_threads",
        env: "CASCADE_STAGE_IO_THREADS",
        flag: Some("io-threads"),
        aliases: &[],
        value_name: "N",
        help: "Threads appending received data to the staging server's arenas",
        default_help: "2",
        parse: |t| parse_count_in(t, 1, 64),
        default: |_| (Value::Count(2), String::new()),
    },
    SettingDef {
        key: "stage_server.writes_in_flight",
        env: "CASCADE_STAGE_WRITES_IN_FLIGHT",
        flag: Some("writes-in-flight"),
        aliases: &[],
        value_name: "N",
        help: "Disk writer threads of the staging server: a connection hands a received frame's arena writes to them and receives the next frame meanwhile, so this many O_DIRECT writes can be in flight",
        default_help: "4",
        parse: |t| parse_count_in(t, 1, 64),
        default: |_| (Value::Count(4), String::new()),
    },
    SettingDef {
        key: "stage_server.drain_memory",
        env: "CASCADE_STAGE_DRAIN_MEMORY",
        flag: Some("drain-memory"),
        aliases: &[],
        value_name: "SIZE",
        help: "Bytes of received files the staging server keeps in memory after writing them, so that their drain uploads from memory at once instead of reading the SSD back (0 = none; a file that does not fit drains from the SSD)",
        default_help: "2GiB",
        parse: parse_bytes,
        default: |_| (Value::Bytes(2 << 30), String::new()),
    },
    SettingDef {
        key: "stage_server.prefault_drain_memory",
        env: "CASCADE_STAGE_PREFAULT_DRAIN_MEMORY",
        flag: Some("prefault-drain-memory"),
        aliases: &[],
        value_name: "on|off",
        help: "Fault the drain memory in on a background thread once the staging server runs, so that its first large checkpoint is received as fast as the next ones (off: it is faulted in as frames arrive)",
        default_help: "on",
        parse: parse_on_off,
        default: |_| (Value::Text("on".into()), String::new()),
    },
    SettingDef {
        key: "stage_server.chunk_capacity",
        env: "CASCADE_STAGE_CHUNK_CAPACITY",
        flag: Some("chunk-capacity"),
        aliases: &[],
        value_name: "SIZE",
        help: "Most bytes of dedup chunk segments the staging server keeps on its SSD (0 = as much as the file system holds); chunks past it are refused as full",
        default_help: "0",
        parse: parse_bytes,
        default: |_| (Value::Bytes(0), "no limit but the file system's free space".into()),
    },
    SettingDef {
        key: "stage_server.base_cache",
        env: "CASCADE_STAGE_BASE_CACHE",
        flag: Some("base-cache"),
        aliases: &[],
        value_name: "SIZE",
        help: "Most bytes of recent dedup chunks the staging server keeps on its SSD as delta bases, so that checking a delta does not read its base over the durable store's link (0 = none; emptied at start)",
        default_help: "1GiB",
        parse: parse_bytes,
        default: |_| (Value::Bytes(1 << 30), String::new()),
    },
    SettingDef {
        key: "stage_server.chunk_segment_size",
        env: "CASCADE_STAGE_CHUNK_SEGMENT_SIZE",
        flag: Some("chunk-segment-size"),
        aliases: &[],
        value_name: "SIZE",
        help: "Size of one dedup chunk segment file on the staging server (1MiB to 1GiB)",
        default_help: "64MiB",
        parse: parse_segment_size,
        default: |_| (Value::Bytes(64 << 20), String::new()),
    },
    SettingDef {
        key: "stage_server.chunk_index_limit",
        env: "CASCADE_STAGE_CHUNK_INDEX_LIMIT",
        flag: Some("chunk-index-limit"),
        aliases: &[],
        value_name: "N",
        help: "Most dedup chunks the staging server holds at once (its in-memory score index takes 51 to 103 bytes per chunk); chunks past it are refused as full",
        default_help: "8388608",
        parse: |t| parse_count_in(t, 1, 1 << 32),
        default: |_| (Value::Count(8 << 20), String::new()),
    },
    SettingDef {
        key: "stage_server.max_connections",
        env: "CASCADE_STAGE_MAX_CONNECTIONS",
        flag: Some("max-connections"),
        aliases: &[],
        value_name: "N",
        help: "Most connections the staging server serves at once (a thread each); one more is refused with Error BUSY",
        default_help: "1024",
        parse: |t| parse_count_in(t, 1, 1 << 20),
        default: |_| (Value::Count(1024), String::new()),
    },
    SettingDef {
        key: "stage_server.max_connections_per_client",
        env: "CASCADE_STAGE_MAX_CONNECTIONS_PER_CLIENT",
        flag: Some("max-connections-per-client"),
        aliases: &[],
        value_name: "N",
        help: "Most connections the staging server serves at once from one client IP address; one more is refused with Error BUSY",
        default_help: "64",
        parse: |t| parse_count_in(t, 1, 1 << 20),
        default: |_| (Value::Count(64), String::new()),
    },
    SettingDef {
        key: "stage_server.drain_attempts",
        env: "CASCADE_STAGE_DRAIN_ATTEMPTS",
        flag: Some("drain-attempts"),
        aliases: &[],
        value_name: "N",
        help: "Failed drains of one staged file in a row (backoff 1 s doubling to 30 s) before the staging server counts it in drain_failed and retries it only every 5 minutes; its bytes stay staged",
        default_help: "10",
        parse: |t| parse_count_in(t, 1, 1 << 20),
        default: |_| (Value::Count(10), String::new()),
    },
    SettingDef {
        key: "stage_server.frame_timeout",
        env: "CASCADE_STAGE_FRAME_TIMEOUT",
        flag: Some("frame-timeout"),
        aliases: &[],
        value_name: "SECONDS",
        help: "A frame's header must arrive within this of its first byte, its body within this once the server is ready for it, a Hello within this (at most 10 s) of connecting, and a reply must be taken by the client within this; else the staging server closes the connection",
        default_help: "60",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(60_000), String::new()),
    },
    SettingDef {
        key: "stage_server.recheck_every",
        env: "CASCADE_STAGE_RECHECK_EVERY",
        flag: Some("recheck-every"),
        aliases: &[],
        value_name: "SECONDS",
        help: "Pending checkpoints and dedup manifests whose files or blobs reach the durable store through other staging servers are looked at again at least this often when no agent asks (agents watching the servers ask at once); the fallback for a lost node",
        default_help: "5",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(5_000), String::new()),
    },
    SettingDef {
        key: "stage_server.tls_cert",
        env: "CASCADE_STAGE_TLS_CERT",
        flag: Some("tls-cert"),
        aliases: &[],
        value_name: "PATH",
        help: "PEM file of the staging server's TLS certificate chain (its own certificate first); with stage_server.tls_key, every client must speak TLS",
        default_help: "none: plain TCP",
        parse: parse_optional_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "stage_server.tls_key",
        env: "CASCADE_STAGE_TLS_KEY",
        flag: Some("tls-key"),
        aliases: &[],
        value_name: "PATH",
        help: "PEM file of the private key of stage_server.tls_cert, readable by its owner only",
        default_help: "none",
        parse: parse_optional_path,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "stage_server.metrics",
        env: "CASCADE_STAGE_METRICS",
        // --metrics like the agent's agent.metrics: they never share a command line.
        flag: Some("metrics"),
        aliases: &[],
        value_name: "ADDR:PORT",
        help: "Address the staging server serves Prometheus metrics on (plain HTTP, GET /metrics), e.g. 0.0.0.0:9471; empty = none (docs/operations.md)",
        default_help: "none",
        parse: |t| Ok(Value::Text(t.trim().to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "log.format",
        env: "CASCADE_LOG_FORMAT",
        flag: Some("log-format"),
        aliases: &[],
        value_name: "text|json",
        help: "How the agent and staging servers write their log lines on stderr: text (timestamp, level, message) or json (one object a line, with timestamp, level, target and message)",
        default_help: "text",
        parse: |t| match t.trim() {
            "text" | "json" => Ok(Value::Text(t.trim().to_string())),
            _ => Err("expected text or json".into()),
        },
        default: |_| (Value::Text("text".into()), String::new()),
    },
    SettingDef {
        key: "log.level",
        env: "CASCADE_LOG",
        flag: Some("log-level"),
        aliases: &[],
        value_name: "FILTER",
        help: "Which log lines the agent and staging servers write: a level (error, warn, info, debug, trace) for Cascade's own lines, other libraries' from warn up; or RUST_LOG-style directives, used as given (warn,cascade_agent=info,object_store=info); -q means warn",
        default_help: "info",
        parse: parse_log_filter,
        default: |_| (Value::Text("info".into()), String::new()),
    },
    SettingDef {
        key: "log.repeats",
        env: "CASCADE_LOG_REPEATS",
        flag: None,
        aliases: &[],
        value_name: "N",
        help: "Warnings and errors alike (same place, same text but for numbers) written per log.repeat_window; the rest are counted and reported as one line ending in (repeated K times); 0 = no limit",
        default_help: "5",
        parse: |t| parse_count_in(t, 0, 1 << 20),
        default: |_| (Value::Count(5), String::new()),
    },
    SettingDef {
        key: "log.repeat_window",
        env: "CASCADE_LOG_REPEAT_WINDOW",
        flag: None,
        aliases: &[],
        value_name: "SECONDS",
        help: "The window of log.repeats",
        default_help: "60",
        parse: parse_seconds_as_ms,
        default: |_| (Value::Millis(60_000), String::new()),
    },
    // The job rows: before their built-in default, a launcher's variable is tried
    // (job::detected), so their sources may be e.g. "env SLURM_JOB_ID". job.id comes first:
    // without one there is no job and the others stay empty.
    SettingDef {
        key: "job.id",
        env: "CASCADE_JOB",
        flag: None,
        aliases: &[],
        value_name: "ID",
        help: "Id of the job this node's processes belong to (several nodes, one checkpoint)",
        default_help: "SLURM_JOB_ID, else PMIX_NAMESPACE (Open MPI), else none: a single-node run",
        parse: |t| job::check_job_id(t).map(|()| Value::Text(t.trim().to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "job.name",
        env: "CASCADE_JOB_NAME",
        flag: None,
        aliases: &[],
        value_name: "NAME",
        help: "Name of the job, the same in every run of it (it names the job's namespace)",
        default_help: "SLURM_JOB_NAME, else the job id",
        parse: |t| job::check_job_name(t).map(|()| Value::Text(t.trim().to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "job.node",
        env: "CASCADE_NODE",
        flag: None,
        aliases: &[],
        value_name: "NAME",
        help: "This node's name in the job",
        default_help: "SLURMD_NODENAME, else PMIX_HOSTNAME, else the host name",
        parse: |t| job::check_node_name(t.trim()).map(|()| Value::Text(t.trim().to_string())),
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "job.nodes",
        env: "CASCADE_JOB_NODES",
        flag: None,
        aliases: &[],
        value_name: "N|NAME,...",
        help: "The job's nodes: their number, or their names separated by commas",
        default_help: "inside a job step SLURM_STEP_NODELIST (expanded) or SLURM_STEP_NUM_NODES, else SLURM_JOB_NODELIST (expanded), SLURM_JOB_NUM_NODES or SLURM_NNODES, else OMPI_MCA_orte_num_nodes, else OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE, else 1",
        parse: job::parse_nodes,
        default: |_| (Value::Text(String::new()), String::new()),
    },
    SettingDef {
        key: "job.node_ranks",
        env: "CASCADE_NODE_RANKS",
        flag: None,
        aliases: &[],
        value_name: "N",
        help: "Ranks of the job on this node: the end of the job on the node waits (up to 10 s) until that many 'cascade run's have started, so a rank that ends before its neighbour starts does not end the job; 0 = do not wait",
        default_help: "OMPI_COMM_WORLD_LOCAL_SIZE, else SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, else 0",
        parse: |t| parse_count_in(t, 0, 1 << 20),
        default: |_| (Value::Count(0), "the end of the job does not wait".into()),
    },
    SettingDef {
        key: "job.namespace",
        env: "CASCADE_NAMESPACE",
        flag: None,
        aliases: &[],
        value_name: "PREFIX",
        help: "Key prefix of the job's files in the staging servers and the durable store, so two jobs that both write ckpt.1 do not collide; empty = none",
        default_help: "<user>/<job name> in a job, else none",
        parse: parse_namespace,
        default: |_| (Value::Text(String::new()), String::new()),
    },
];

/// Where the store appears to programs run under `cascade run` unless configured otherwise.
pub const DEFAULT_MOUNT: &str = "/cascade";

pub(crate) fn find(key: &str) -> Option<&'static SettingDef> {
    SETTINGS.iter().find(|d| d.key == key)
}

fn parse_server_list(text: &str) -> Result<Value, String> {
    let servers: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for server in &servers {
        match server.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(format!("{server:?} is not HOST:PORT")),
        }
    }
    Ok(Value::Text(servers.join(",")))
}

/// A key prefix: a relative path without empty, `.` or `..` components; empty = none.
/// Comma-separated glob patterns of names (no '/' but a trailing one, which means a
/// directory).
fn parse_rules(t: &str) -> Result<Value, String> {
    for rule in t.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let name = rule.strip_suffix('/').unwrap_or(rule);
        if name.is_empty() || name.contains('/') {
            return Err(format!(
                "checkpoint rule {rule:?}: a pattern of names, without '/' (a trailing '/' means directories)"
            ));
        }
        glob::Pattern::new(name).map_err(|e| format!("checkpoint rule {rule:?}: {e}"))?;
    }
    Ok(Value::Text(t.trim().to_string()))
}

fn parse_namespace(t: &str) -> Result<Value, String> {
    if t.is_empty() || t.split('/').all(|p| !p.is_empty() && p != "." && p != "..") {
        Ok(Value::Text(t.to_string()))
    } else {
        Err("expected a relative path without empty, . or .. components".into())
    }
}

fn parse_bytes(text: &str) -> Result<Value, String> {
    parse_size(text).map(Value::Bytes)
}

fn parse_chunk_size(text: &str) -> Result<Value, String> {
    let bytes = parse_size(text)?;
    if !bytes.is_power_of_two() || !(4 << 10..=64 << 20).contains(&bytes) {
        return Err("chunk size must be a power of two from 4KiB to 64MiB".to_string());
    }
    Ok(Value::Bytes(bytes))
}

fn parse_segment_size(text: &str) -> Result<Value, String> {
    let bytes = parse_size(text)?;
    if !(1 << 20..=1 << 30).contains(&bytes) {
        return Err("segment size must be from 1MiB to 1GiB".to_string());
    }
    Ok(Value::Bytes(bytes))
}

fn parse_max_files(text: &str) -> Result<Value, String> {
    const LIMIT: u64 = 1 << 24;
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| "not a whole number".to_string())?;
    if !(2..=LIMIT).contains(&n) {
        return Err(format!("must be from 2 to {LIMIT}"));
    }
    Ok(Value::Count(n))
}

fn parse_count_in(text: &str, min: u64, max: u64) -> Result<Value, String> {
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| "not a whole number".to_string())?;
    if !(min..=max).contains(&n) {
        return Err(format!("must be from {min} to {max}"));
    }
    Ok(Value::Count(n))
}

/// A log filter: levels and `target=level` directives (checked here so that a typo is a
/// configuration error, not a silent default).
fn parse_log_filter(text: &str) -> Result<Value, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let t = text.trim();
    for d in t.split(',').filter(|d| !d.is_empty()) {
        let level = d.rsplit_once('=').map_or(d, |(_, l)| l);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{d:?}: expected a level (error, warn, info, debug, trace, off) or TARGET=LEVEL"
            ));
        }
    }
    Ok(Value::Text(t.to_string()))
}

/// Seconds (decimals allowed, at most a day), kept as milliseconds.
fn parse_seconds_as_ms(text: &str) -> Result<Value, String> {
    let secs: f64 = text
        .trim()
        .trim_end_matches('s')
        .trim_end()
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !(0.0..=86_400.0).contains(&secs) {
        return Err("must be from 0 to 86400 seconds".to_string());
    }
    Ok(Value::Millis((secs * 1000.0).round() as u64))
}

/// Permission bits in octal (`0600`, `640`): read/write bits only, the owner must be able to
/// read and write.
fn parse_file_mode(text: &str) -> Result<Value, String> {
    let mode = u32::from_str_radix(text.trim(), 8)
        .map_err(|_| "not an octal mode (expected e.g. 0600 or 0640)".to_string())?;
    if mode & !0o666 != 0 || mode & 0o600 != 0o600 {
        return Err(
            "must be read/write bits only (at most 0666) with the owner's read and write (0600)"
                .to_string(),
        );
    }
    Ok(Value::Text(format!("{mode:04o}")))
}

/// The umask that makes new files `mode` (from `files.mode`) and new directories `mode` plus
/// x where r is set: the process umask of commands that write checkpoint data to disk.
pub fn umask_for_file_mode(text: &str) -> Option<u32> {
    let mode = u32::from_str_radix(text.trim(), 8).ok()?;
    Some(0o777 & !(mode | ((mode & 0o444) >> 2)))
}

/// A durable store spec, checked for syntax only (reachability is checked when it is used).
fn parse_durable_url(text: &str) -> Result<Value, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Value::Text(String::new()));
    }
    // The error shows the URL with its credentials hidden (cascade_durable::Error::Config).
    cascade_durable::Spec::parse(text).map_err(|e| e.to_string())?;
    Ok(Value::Text(text.to_string()))
}

fn parse_on_off(text: &str) -> Result<Value, String> {
    match text {
        "on" | "off" => Ok(Value::Text(text.to_string())),
        _ => Err("expected on or off".into()),
    }
}

fn parse_prefault(text: &str) -> Result<Value, String> {
    let choice = text.trim().to_ascii_lowercase();
    match choice.as_str() {
        "foreground" | "background" | "off" => Ok(Value::Text(choice)),
        _ => Err("expected foreground, background or off".to_string()),
    }
}

/// POSIX shm names are "/" plus one path component; a missing leading "/" is added.
fn parse_store_name(text: &str) -> Result<Value, String> {
    let bare = text.trim().strip_prefix('/').unwrap_or(text.trim());
    if bare.is_empty() || bare.contains('/') || bare.len() > 254 || bare == "." || bare == ".." {
        return Err("a store name is one component without '/', e.g. /cascade-ckpt".to_string());
    }
    Ok(Value::Text(format!("/{bare}")))
}

/// The mount prefix is compared lexically with the absolute, normalised paths programs use,
/// so it must be absolute and is stored normalised ("/a//b/./c/" is "/a/b/c", ".." removes
/// the component before it). "/" would capture every path of the system, so it is refused.
fn parse_mount_prefix(text: &str) -> Result<Value, String> {
    if text.contains('\0') {
        return Err("a path cannot contain a NUL byte".to_string());
    }
    if !text.starts_with('/') {
        return Err("the mount prefix must be an absolute path, e.g. /cascade".to_string());
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    if parts.is_empty() {
        return Err("the mount prefix cannot be / (every path would be the store's)".to_string());
    }
    Ok(Value::Text(format!("/{}", parts.join("/"))))
}

/// A path, or nothing (empty text): for settings that are off unless given.
fn parse_optional_path(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Text(String::new()));
    }
    parse_path(text)
}

/// Paths are stored absolute: the store records the spill path for every process that
/// attaches, whatever its working directory.
fn parse_path(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Err("empty path".to_string());
    }
    let absolute = std::path::absolute(text).map_err(|e| crate::io_text(&e))?;
    Ok(Value::Text(absolute.display().to_string()))
}

/// 25% of RAM, at most half of what /dev/shm has free, in whole chunks.
fn default_capacity(resolved: &Resolved) -> (Value, String) {
    let chunk = resolved.bytes("store.chunk_size");
    let (bytes, how) = capacity_from(
        machine::mem_total(),
        machine::free_space(Path::new(SHM_DIR)),
    );
    (Value::Bytes(round_down(bytes, chunk)), how)
}

pub(crate) fn capacity_from(mem_total: Option<u64>, shm_free: Option<u64>) -> (u64, String) {
    let Some(mem_total) = mem_total else {
        return (0, "could not read MemTotal from /proc/meminfo".to_string());
    };
    let quarter_ram = mem_total / 4;
    match shm_free {
        Some(free) if free / 2 < quarter_ram => (
            free / 2,
            format!("50% of {} free in {SHM_DIR}", format_size(free)),
        ),
        Some(_) => (
            quarter_ram,
            format!("25% of {} RAM", format_size(mem_total)),
        ),
        None => (0, format!("could not measure free space in {SHM_DIR}")),
    }
}

/// The default store's spill file is /var/tmp/cascade-<uid>.spill; other stores get their
/// own file so two stores never share one.
fn default_spill_path(resolved: &Resolved) -> (Value, String) {
    let name = resolved.text("store.name").trim_start_matches('/');
    let path = PathBuf::from("/var/tmp").join(format!("{name}.spill"));
    (
        Value::Text(path.display().to_string()),
        "from store.name".to_string(),
    )
}

/// As much spill as memory, but never more than a quarter of the SSD's free space.
fn default_spill_size(resolved: &Resolved) -> (Value, String) {
    let chunk = resolved.bytes("store.chunk_size");
    let capacity = resolved.bytes("store.capacity");
    let path = PathBuf::from(resolved.text("spill.path"));
    let (bytes, how) = spill_size_from(capacity, machine::free_space(&path), &path);
    (Value::Bytes(round_down(bytes, chunk)), how)
}

pub(crate) fn spill_size_from(capacity: u64, free: Option<u64>, path: &Path) -> (u64, String) {
    let Some(free) = free else {
        return (
            0,
            format!("could not measure free space for {}", path.display()),
        );
    };
    if free / 4 < capacity {
        let fs = path.parent().unwrap_or(path);
        (
            free / 4,
            format!("25% of {} free in {}", format_size(free), fs.display()),
        )
    } else {
        (capacity, "equal to store.capacity".to_string())
    }
}

fn round_down(bytes: u64, chunk: u64) -> u64 {
    if chunk == 0 {
        bytes
    } else {
        bytes - bytes % chunk
    }
}
