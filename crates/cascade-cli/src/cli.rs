//! Command-line syntax. Store parameters (`--capacity`, `--chunk-size`, ...) are not listed
//! here: [`StoreParams`] adds one flag per row of `cascade_config::SETTINGS`, so a new
//! setting gets its flag, help text and env variable from the table.

use std::ffi::OsString;
use std::marker::PhantomData;
use std::path::PathBuf;

use cascade_config::{SettingDef, SETTINGS};
use clap::{Arg, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

const SIZES: &str = "Sizes are bytes, or a number with a unit: 64k, 1M, 4G (binary, \
same as 64KiB, 1MiB, 4GiB); 1kB, 1MB, 1GB are decimal; fractions such as 1.5GiB work.";

const PRECEDENCE: &str = "Every setting comes from, in this order: a flag, its CASCADE_* \
environment variable, the config file, a default. 'cascade config' shows which.";

#[derive(Debug, Parser)]
#[command(
    name = "cascade",
    version,
    about = "Cascade node store: checkpoint files at memory speed in a shared-memory block",
    long_about = "Cascade keeps checkpoint files in a node-local POSIX shared-memory block \
(spilling to a file on local SSD when memory is full). Files survive the processes that \
wrote them and are gone only when the store is destroyed or the node reboots.",
    after_help = PRECEDENCE,
    propagate_version = true
)]
pub struct Cli {
    /// Store to use: its POSIX shared-memory name, e.g. /cascade-ckpt
    /// [env: CASCADE_STORE] [default: /cascade-<uid>]
    #[arg(long, global = true, value_name = "NAME")]
    pub store: Option<String>,

    /// TOML config file to read [env: CASCADE_CONFIG]
    /// [default: ~/.config/cascade/config.toml, else /etc/cascade/config.toml, if present]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// More detail: a line per upload and event (agent, stage-server), per file (drain,
    /// restore), per checkpoint (prune)
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// Less: warnings and errors only (agent, stage-server: log.level warn); no summary line
    /// on success (put, get, drain, restore, prune); only the summary (demo)
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the store: a shared-memory block, plus a spill file if spill is on
    #[command(after_help = format!("{SIZES}\n\n{PRECEDENCE}"))]
    Init {
        #[command(flatten)]
        params: StoreParams,
    },

    /// Show capacity, usage, spill, files, attached processes and the last ENOSPC
    #[command(after_help = "Sizes are shown in binary units (1 GiB = 2^30 bytes).")]
    Status {
        /// Print machine-readable JSON (all sizes in bytes, times in ns since the epoch)
        #[arg(long)]
        json: bool,
    },

    /// List a directory of the store (or show one file)
    Ls {
        /// Where each entry lives and its lifecycle state: memory/spill, dirty, writing,
        /// torn, durable, checkpoint #N draining/complete; plus checkpoints only the durable
        /// store still has
        #[arg(long)]
        levels: bool,
        /// Long listing: type and permissions, owner, size in bytes, modification time (UTC)
        #[arg(short = 'l')]
        long: bool,
        /// With --levels: print one JSON document (field names: docs/cli-json.md)
        #[arg(long, requires = "levels")]
        json: bool,
        /// Store path to list
        #[arg(default_value = "/", value_name = "PATH")]
        path: String,
    },

    /// Show a file's or directory's metadata and where its chunks are
    Stat {
        /// Store path, e.g. /ckpt.0001/rank0.dat (or /cascade/ckpt.0001/rank0.dat)
        #[arg(value_name = "PATH")]
        path: String,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
    },

    /// Copy a local file into the store (1 MiB writes; prints bytes and GB/s)
    #[command(
        after_help = "GB/s is decimal (10^9 bytes per second). A progress bar is shown \
on a terminal for files of 64 MiB and more. If the store fills up, the command fails with \
'No space left on device', the part written so far is kept, and 'cascade status' shows why."
    )]
    Put {
        /// Create missing parent directories of STORE_PATH
        #[arg(short = 'p', long)]
        parents: bool,
        /// Local file to read, or - for standard input
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
        /// Destination in the store; an existing directory gets LOCAL's file name
        #[arg(value_name = "STORE_PATH")]
        store_path: String,
    },

    /// Copy a file from the store to a local file (1 MiB reads; prints bytes and GB/s)
    #[command(
        after_help = "GB/s is decimal (10^9 bytes per second). Holes read back as \
zeros. With LOCAL = -, data goes to standard output; whenever LOCAL is - or a pipe or \
device, the summary goes to standard error."
    )]
    Get {
        /// File in the store
        #[arg(value_name = "STORE_PATH")]
        store_path: String,
        /// Local file to write (replaced if it exists), a directory, or - for standard output
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
    },

    /// Remove files (and with -r, directories and everything in them); frees space at once
    Rm {
        /// Remove directories and their contents
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Store paths to remove
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<String>,
    },

    /// Create directories in the store (mode 0755)
    Mkdir {
        /// Create missing parents too; no error if the directory exists
        #[arg(short = 'p', long)]
        parents: bool,
        /// Directories to create
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<String>,
    },

    /// Check the store's invariants; exit 0 when clean, 1 when errors are found
    #[command(
        after_help = "Warnings (crash leftovers such as leaked chunks or leases of dead \
processes) do not make the check fail; --repair reclaims them. Errors are violated invariants."
    )]
    Fsck {
        /// Repair what can be repaired (reclaim leaked chunks and dead processes' leases)
        #[arg(long)]
        repair: bool,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
    },

    /// Delete the store: its shared-memory block and its spill file, with every file in it
    #[command(
        after_help = "Refuses while other processes are attached, unless --force. \
Processes still attached then keep their mapping until they exit; the memory is freed when \
the last one detaches."
    )]
    Destroy {
        /// Destroy even if processes are still attached
        #[arg(long)]
        force: bool,
    },

    /// Print every setting's effective value and where it came from
    #[command(after_help = format!("{PRECEDENCE}\n\n{SIZES}"))]
    Config {
        /// Print machine-readable JSON (sizes in bytes)
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        params: StoreParams,
        #[command(flatten)]
        mount: MountParams,
    },

    /// Run a program with libcascade.so preloaded: its files under the mount prefix are
    /// files of the store
    #[command(long_about = RUN_ABOUT, after_help = RUN_DETAILS)]
    Run {
        #[command(flatten)]
        mount: MountParams,
        #[command(flatten)]
        agent: AgentParams,
        #[command(flatten)]
        dedup: DedupParams,
        /// The program to run and its arguments (put -- before them if they start with -)
        #[arg(
            value_name = "CMD",
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_parser = clap::value_parser!(OsString)
        )]
        command: Vec<OsString>,
    },

    /// Run the node agent in the foreground: drain closed files and committed checkpoints to
    /// the durable store, evict old durable checkpoints, serve read-through
    #[command(long_about = AGENT_ABOUT)]
    Agent {
        #[command(flatten)]
        agent: AgentParams,
        #[command(flatten)]
        dedup: DedupParams,
        #[command(flatten)]
        log: LogParams,
    },

    /// Commit a checkpoint (a store directory or file): the agent drains it and writes its
    /// completion marker; retention counts it
    #[command(after_help = COMMIT_DETAILS)]
    Commit {
        /// Checkpoint in the store, e.g. /ckpt.0042
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Wait until a checkpoint (or any store path) has reached a level
    #[command(after_help = WAIT_DETAILS)]
    Wait {
        /// Store path, e.g. /ckpt.0042
        #[arg(value_name = "PATH")]
        path: String,
        /// staged: safe from the loss of this node (on a staging server or in the durable
        /// store)
        #[arg(long, value_enum, default_value_t = WaitLevel::Durable, value_name = "LEVEL")]
        level: WaitLevel,
        /// Give up after this many seconds (exit 3; a path that can never get there exits 1 at
        /// once)
        #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
        timeout: f64,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
    },

    /// Copy a checkpoint (a store directory or file) to the durable store, then mark it complete
    #[command(after_help = DRAIN_DETAILS)]
    Drain {
        /// Checkpoint in the store, e.g. /ckpt.0042 (a directory) or /ckpt.0042.dat (a file)
        #[arg(value_name = "PATH")]
        path: String,
        /// Durable store: file:///dir, /dir, or 's3://bucket/prefix?endpoint=URL'
        /// [default: the configured durable.url] (also --to)
        #[arg(long, alias = "to", value_name = "URL")]
        durable: Option<String>,
        #[command(flatten)]
        dedup: DedupParams,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
    },

    /// Copy a complete checkpoint from the durable store to a local directory or the store
    #[command(after_help = RESTORE_DETAILS)]
    Restore {
        /// Checkpoint name in the durable store, e.g. ckpt.0042
        #[arg(value_name = "CKPT")]
        ckpt: String,
        /// Where to put its files: a local directory (default ./<last component of CKPT>),
        /// or with --into-store a store directory (default /CKPT)
        #[arg(value_name = "DEST")]
        dest: Option<String>,
        /// Durable store: file:///dir, /dir, or 's3://bucket/prefix?endpoint=URL'
        /// [default: the configured durable.url] (also --from)
        #[arg(long, alias = "from", value_name = "URL")]
        durable: Option<String>,
        /// DEST is a directory of the node store, not a local directory
        #[arg(long)]
        into_store: bool,
        /// For a checkpoint of several nodes that is not complete: restore the files of the
        /// nodes whose parts are in, and say which nodes are missing (exit 1)
        #[arg(long, conflicts_with = "into_store")]
        partial: bool,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
    },

    /// Forget old checkpoints of the durable store's dedup repository and delete the packs
    /// only they used
    #[command(
        after_help = crate::prune::DETAILS,
        group = clap::ArgGroup::new("which").args(["checkpoints", "keep_last"])
    )]
    Prune {
        /// Checkpoints to forget, e.g. run1/ckpt.0042 (instead of --keep-last)
        #[arg(value_name = "CKPT", required_unless_present_any = ["keep_last", "orphans"])]
        checkpoints: Vec<String>,
        /// Keep the N newest checkpoints of the repository (by when their manifests were
        /// written), forget the others; N is at least 1 (also --keep)
        #[arg(long, alias = "keep", value_name = "N", value_parser = crate::prune::parse_keep)]
        keep_last: Option<u64>,
        /// Print what would be forgotten and deleted; change nothing
        #[arg(long)]
        dry_run: bool,
        /// Also look for packs no index names (left by writers that died before writing their
        /// index); a later prune deletes them. Lists every pack of the repository
        #[arg(long)]
        orphans: bool,
        /// Print one JSON document (field names: docs/cli-json.md)
        #[arg(long)]
        json: bool,
        /// Durable store: file:///dir, /dir, or 's3://bucket/prefix?endpoint=URL'
        /// [default: the configured durable.url]
        #[arg(long, value_name = "URL")]
        durable: Option<String>,
    },

    /// Print the linker flags that link a static program against Cascade's wrappers
    #[command(after_help = LINK_FLAGS_DETAILS)]
    LinkFlags,

    /// Check that Cascade can intercept a program's file I/O; exit 0 when it can
    #[command(after_help = CHECK_BINARY_DETAILS)]
    CheckBinary {
        /// The program: a path, or a name looked up in PATH as a shell would
        #[arg(value_name = "PROG", value_parser = clap::value_parser!(OsString))]
        program: OsString,
    },

    /// Run a staging server (L1): absorb checkpoint files from node agents onto this
    /// machine's SSD, drain them to the durable store; `stage-server status` shows one
    #[command(long_about = STAGE_SERVER_ABOUT, args_conflicts_with_subcommands = true)]
    StageServer {
        #[command(subcommand)]
        action: Option<StageServerAction>,
        #[command(flatten)]
        params: StageServerParams,
        #[command(flatten)]
        log: LogParams,
    },

    /// Mount the node store as a FUSE file system, for programs the preload library cannot
    /// reach (static binaries, Go); serves in the foreground until unmounted
    #[command(long_about = MOUNT_ABOUT)]
    Mount {
        /// An existing directory to mount on
        mountpoint: std::path::PathBuf,
        /// Threads answering the kernel's requests
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
        threads: u16,
        /// Let the kernel cache file data between opens: faster rereads, but a change made
        /// through the preload library is seen only at the next open
        #[arg(long)]
        kernel_cache: bool,
        /// Let users other than the one mounting use the mount
        #[arg(long)]
        allow_other: bool,
    },

    /// Unmount a Cascade FUSE mount; its `cascade mount` process then exits
    Umount {
        /// Where it is mounted
        mountpoint: std::path::PathBuf,
        /// Detach at once even with files open under it (it goes when they are closed)
        #[arg(long)]
        lazy: bool,
    },

    /// Analyse a series of checkpoints: dedup ratios (fixed and CDC chunks), compression,
    /// new and duplicate chunks per snapshot, CDC chunk sizes, change heatmaps (--plot)
    #[command(long_about = crate::analyze::ABOUT)]
    Analyze(crate::analyze::AnalyzeArgs),

    /// Run the demo: a real simulation checkpoints straight to disk, then under Cascade,
    /// killed and restarted from memory and from the durable store; compares the stalls
    #[command(long_about = crate::demo::ABOUT)]
    Demo(crate::demo::DemoArgs),

    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(long_about = crate::generate::COMPLETIONS_ABOUT)]
    Completions(crate::generate::CompletionsArgs),

    /// Write the man pages of cascade and every subcommand into a directory
    #[command(long_about = crate::generate::MAN_ABOUT)]
    Man(crate::generate::ManArgs),
}

/// The levels `cascade wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WaitLevel {
    /// In the node store (at once, once written)
    Memory,
    /// Safe from the loss of this node: on a staging server's SSD or in the durable store
    Staged,
    /// In the durable store (the checkpoint's completion marker written)
    Durable,
}

impl From<WaitLevel> for cascade_lifecycle::Level {
    fn from(level: WaitLevel) -> Self {
        match level {
            WaitLevel::Memory => cascade_lifecycle::Level::Memory,
            WaitLevel::Staged => cascade_lifecycle::Level::Staged,
            WaitLevel::Durable => cascade_lifecycle::Level::Durable,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum StageServerAction {
    /// Show a running staging server: absorbed, drained and pending bytes, arena usage
    Status {
        /// The server, HOST:PORT [default: stage_server.listen, else the first of
        /// staging.servers]
        #[arg(value_name = "HOST:PORT")]
        server: Option<String>,
        /// Print the server's JSON status
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        params: StageServerParams,
    },
    /// Print the staging credential of a job's namespace (64 hex digits): it opens that
    /// namespace on the staging servers and nothing else. Needs the cluster secret; run it
    /// where the secret is (e.g. a Slurm prolog) and give the job the credential
    /// (CASCADE_STAGING_CREDENTIAL_FILE)
    Credential {
        /// The namespace [default: the job's staging namespace, staging.namespace/job.namespace]
        #[arg(long, value_name = "PREFIX")]
        namespace: Option<String>,
        #[command(flatten)]
        params: StageServerParams,
    },
}

const STAGE_SERVER_ABOUT: &str = "Runs a staging server until SIGINT or SIGTERM. Node agents given the server (--staging, CASCADE_STAGING) send each closed file to it; the server appends the data to log-structured arenas in --dir, acknowledges once it is on the SSD (a batched fdatasync), and drains every file to --drain-to in the durable store's plain layout in the background, pausing while clients write. A checkpoint whose files are all staged is complete (its marker written by the server) once they have drained. Clients prove they hold the key of their namespace without sending it: the cluster secret (staging.secret_file, which the server needs too) or a job's credential from 'cascade stage-server credential' (staging.credential_file). With --tls-cert and --tls-key every connection is TLS. A restarted server recovers everything it acknowledged. See docs/staging.md and docs/staging-protocol.md.";

const MOUNT_ABOUT: &str = "Mounts the node store (attached, or created from the configuration) \
on MOUNTPOINT as a FUSE file system and serves it until 'cascade umount', umount, SIGINT or \
SIGTERM. It is the same store the preload library serves: a file written through either is \
seen through the other at once, and the agent drains it like any other. Meant for programs \
LD_PRELOAD cannot reach (static binaries, Go); preloaded programs are faster. Needs root (it \
mounts with mount(2)). A mount left by a killed 'cascade mount' is cleared by the next one; \
files it had open for writing are marked torn, as after any crash. See docs/fuse.md.";

const AGENT_ABOUT: &str = "Runs the node agent until SIGINT or SIGTERM. One agent per node \
store (a second one is refused); 'cascade run' embeds one when none is running and a durable \
store is configured.

The agent uploads every file closed after writing (read straight from the store's memory, \
with its BLAKE3 beside it), writes the completion marker of each committed checkpoint once \
all its files are durable, keeps the newest --keep-in-memory checkpoints of each directory in memory \
and evicts older ones once they are durable, makes room for writers waiting on a full store \
by evicting durable checkpoints, and fetches files the store does not have from the durable \
store when a program opens them (read-through, verified). A failed upload is retried with \
backoff (0.5 s doubling to 30 s) and reported on standard error; nothing that is not durable \
is ever evicted. See docs/agent.md.";

const COMMIT_DETAILS: &str = "Every file below PATH must be closed: EBUSY otherwise, and a \
file whose writer died (torn) must be rewritten or removed first. A checkpoint cannot hold \
another. Programs call cascade_commit(path) from include/cascade.h instead; when a job under \
'cascade run' ends successfully, what it left uncommitted is committed for it.";

const WAIT_DETAILS: &str = "--level durable returns once PATH's completion marker is in the \
durable store (a committed checkpoint) or every file below it is durable (any other path), \
also if the checkpoint has since been evicted from memory. --level staged returns as soon as \
every file is on a staging server's SSD (or durable) and a server has accepted the \
checkpoint's file list: from then on losing this node loses nothing. Fails at once, with the reason, \
when PATH cannot get there without someone acting: no agent running, a file still open for \
writing or torn, a checkpoint not selected for flushing. PATH may carry the mount prefix \
(/cascade/ckpt.0042, as the application names it). Exit codes: 0 reached, 1 cannot get \
there (or another error), 2 usage, 3 timed out (it may still get there: wait again).";

const DRAIN_DETAILS: &str = "The checkpoint's name in the durable store is PATH without its \
leading '/': /ckpt.0042 becomes <root>/ckpt.0042/, each file at its relative path with its \
BLAKE3 beside it (<file>.blake3) and the marker <root>/ckpt.0042/.cascade-complete written \
last, after all data and checksums (docs/durable-layout.md). A single file /x.dat becomes \
<root>/x.dat with its marker <root>/x.dat.cascade-complete. Files are read straight from the store's memory. S3 credentials come \
from the URL or CASCADE_S3_* / AWS_* variables. GB/s is decimal (10^9 bytes per second); a \
progress bar is shown on a terminal.";

const RESTORE_DETAILS: &str = "Only a complete checkpoint (one with its \
.cascade-complete marker) is restored. Every file is verified against its BLAKE3 checksum \
and the marker; files are written under temporary names and renamed into place only when \
all of them verified, so a failure leaves no restored file behind. Existing files of the \
same names are replaced. A progress bar is shown on a terminal.";

const RUN_ABOUT: &str = "Runs CMD with libcascade.so preloaded, so that its files under \
the mount prefix (--mount, default /cascade) are files of the node store and every other \
path is the real file system.

First the store is attached, or created with the configured parameters if it does not \
exist (store.capacity, spill.size and the rest, from CASCADE_* variables or the config \
file: see 'cascade config'). An existing store is used as it is, whatever its parameters. \
The store stays attached while CMD runs and is left in place afterwards; remove it with \
'cascade destroy'.

CMD then runs with, in its environment:
  LD_PRELOAD=<libcascade.so>   before any libraries already in LD_PRELOAD
  CASCADE_STORE=<store name>
  CASCADE_MOUNT=<mount prefix>
libcascade.so is $CASCADE_PRELOAD_LIB if set, else the one next to the cascade executable, \
else ../lib/libcascade.so from the executable's directory.

SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to 'cascade run' are passed on to CMD (a ^C at the \
terminal reaches CMD directly and is not sent twice). 'cascade run' exits with CMD's exit \
code, or 128 + the signal number if CMD was killed by a signal (143 for SIGTERM), as a shell \
reports it; 127 if CMD is not found, 126 if it cannot be executed.

Statically linked programs and Go programs make their system calls without libc, out of \
LD_PRELOAD's reach: 'cascade check-binary PROG' tells.";

const RUN_DETAILS: &str = "Example: cascade run -- sh -c 'cp ckpt.dat /cascade/ckpt.0001/ \
&& ls -l /cascade/ckpt.0001'";

const LINK_FLAGS_DETAILS: &str = "Prints one -Wl,--wrap=NAME per function Cascade wraps, one \
per line, then the path of the static wrapper library libcascade_wrap.a (next to the cascade \
executable, or in ../lib from it). Until that library is built, a comment on standard error \
says so. Functions that Cascade covers through glibc (stdio on a Cascade stream) need no \
flag. Use it as: cc -static app.o $(cascade link-flags) -o app";

const CHECK_BINARY_DETAILS: &str = "Reads the ELF headers of PROG and of the shared \
libraries it loads (PROG is not run). The libraries are found as the dynamic linker finds \
them: DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH ($ORIGIN expanded), /etc/ld.so.cache, then the \
default directories; glibc's own libraries (libc, libm, libpthread, ld.so, ...) are not \
walked into. Each file-I/O function that PROG or one of its libraries imports (open, read, \
stat, directories, temporary files, stdio, mmap, xattr, AIO, io_uring, exec, dlopen, ...) \
and Cascade does not intercept is listed once, with a note and the objects that import it; \
a needed library that is not found gets a '=> not found' line. Exit 1 if there is any such \
line, 0 (\"all N file-I/O imports of PROG and its K libraries are intercepted\") if not. \
Libraries the program loads with dlopen at run time are not seen.

A statically linked program or a Go program gets exit 1 and a plain statement: LD_PRELOAD \
cannot reach it (the FUSE front end, 'cascade mount', will in a later release). A file that \
cannot be read or is not an ELF file gets a one-line error and exit 2.";

/// Flag values for the settings of one group, by setting key ("store.capacity"). The
/// group decides which rows of `cascade_config::SETTINGS` get a flag under a subcommand.
#[derive(Clone)]
pub struct SettingFlags<G> {
    pub values: Vec<(&'static str, String)>,
    group: PhantomData<G>,
}

/// Shows the values with any secret hidden (`--staging-secret`, a URL's secret key).
impl<G> std::fmt::Debug for SettingFlags<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<(&str, String)> = self
            .values
            .iter()
            .map(|(key, value)| {
                let value = if *key == "staging.secret" || *key == "staging.credential" {
                    cascade_secret::REDACTED.to_string()
                } else {
                    cascade_config::redacted(value)
                };
                (*key, value)
            })
            .collect();
        f.debug_struct("SettingFlags")
            .field("values", &shown)
            .finish()
    }
}

impl<G> Default for SettingFlags<G> {
    fn default() -> Self {
        SettingFlags {
            values: Vec::new(),
            group: PhantomData,
        }
    }
}

/// A group of settings that share a help heading.
pub trait SettingGroup {
    /// Help heading, or None for the subcommand's plain options.
    const HEADING: Option<&'static str>;
    /// Whether the setting belongs to the group.
    fn includes(def: &SettingDef) -> bool;
}

/// The parameters a store is created with (`init`, `config`).
#[derive(Debug, Clone)]
pub struct StoreGroup;

impl SettingGroup for StoreGroup {
    const HEADING: Option<&'static str> = Some("Store parameters");
    fn includes(def: &SettingDef) -> bool {
        def.key.starts_with("store.") || def.key.starts_with("spill.")
    }
}

/// How programs see the store (`run`, `config`).
#[derive(Debug, Clone)]
pub struct MountGroup;

impl SettingGroup for MountGroup {
    const HEADING: Option<&'static str> = None;
    fn includes(def: &SettingDef) -> bool {
        def.key.starts_with("mount.")
    }
}

/// The node agent and the durable store (`agent`, `run`, `config`).
#[derive(Debug, Clone)]
pub struct AgentGroup;

impl SettingGroup for AgentGroup {
    const HEADING: Option<&'static str> = Some("Agent and durable store");
    fn includes(def: &SettingDef) -> bool {
        ["durable.", "agent.", "checkpoint.", "staging."]
            .iter()
            .any(|p| def.key.starts_with(p))
    }
}

/// A staging server (`stage-server`): its own settings, the shared secret, and the CA a
/// client trusts (`stage-server status`).
#[derive(Debug, Clone)]
pub struct StageServerGroup;

impl SettingGroup for StageServerGroup {
    const HEADING: Option<&'static str> = Some("Staging server");
    fn includes(def: &SettingDef) -> bool {
        def.key.starts_with("stage_server.") || SHARED_STAGING_SETTINGS.contains(&def.key)
    }
}

/// The log lines of the agent and staging servers (`agent`, `stage-server`).
#[derive(Debug, Clone)]
pub struct LogGroup;

impl SettingGroup for LogGroup {
    const HEADING: Option<&'static str> = Some("Logs");
    fn includes(def: &SettingDef) -> bool {
        def.key.starts_with("log.")
    }
}

/// Settings of agents and staging servers alike (both groups give them a flag).
const SHARED_STAGING_SETTINGS: [&str; 3] =
    ["staging.secret", "staging.secret_file", "staging.tls_ca"];

/// Dedup and compression in the durable store (`drain`).
#[derive(Debug, Clone)]
pub struct DedupGroup;

impl SettingGroup for DedupGroup {
    const HEADING: Option<&'static str> = Some("Dedup");
    fn includes(def: &SettingDef) -> bool {
        def.key.starts_with("dedup.")
    }
}

pub type DedupParams = SettingFlags<DedupGroup>;
pub type AgentParams = SettingFlags<AgentGroup>;
pub type StageServerParams = SettingFlags<StageServerGroup>;
pub type StoreParams = SettingFlags<StoreGroup>;
pub type MountParams = SettingFlags<MountGroup>;
pub type LogParams = SettingFlags<LogGroup>;

/// Settings of the group with a flag of their own; `--store` is global instead.
fn group_settings<G: SettingGroup>() -> impl Iterator<Item = (&'static str, &'static SettingDef)> {
    SETTINGS
        .iter()
        .filter(|def| G::includes(def))
        .filter_map(|def| def.flag.map(|flag| (flag, def)))
        .filter(|(flag, _)| *flag != "store")
}

impl<G: SettingGroup> Args for SettingFlags<G> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        group_settings::<G>().fold(cmd, |cmd, (flag, def)| {
            let help = format!(
                "{} [env: {}] [default: {}]",
                def.help, def.env, def.default_help
            );
            let arg = Arg::new(flag)
                .long(flag)
                .aliases(def.aliases)
                .value_name(def.value_name)
                .help(help)
                .num_args(1);
            cmd.arg(match G::HEADING {
                Some(heading) => arg.help_heading(heading),
                None => arg,
            })
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl<G: SettingGroup> FromArgMatches for SettingFlags<G> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let values = group_settings::<G>()
            .filter_map(|(flag, def)| {
                let value = matches.get_one::<String>(flag)?;
                Some((def.key, value.clone()))
            })
            .collect();
        Ok(SettingFlags {
            values,
            group: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn table_flags_reach_the_settings() {
        let cli = Cli::try_parse_from([
            "cascade",
            "--store",
            "/s",
            "init",
            "--capacity",
            "64MiB",
            "--spill-size",
            "0",
        ])
        .expect("parses");
        assert_eq!(cli.store.as_deref(), Some("/s"));
        let Command::Init { params } = cli.command else {
            panic!("not init: {:?}", cli.command);
        };
        assert_eq!(
            params.values,
            vec![
                ("store.capacity", "64MiB".to_string()),
                ("spill.size", "0".to_string())
            ]
        );
    }

    #[test]
    fn every_setting_with_a_flag_is_in_exactly_one_group() {
        for def in SETTINGS
            .iter()
            .filter(|d| d.flag.is_some_and(|f| f != "store"))
        {
            let groups = [
                StoreGroup::includes(def),
                MountGroup::includes(def),
                AgentGroup::includes(def),
                StageServerGroup::includes(def),
                DedupGroup::includes(def),
                LogGroup::includes(def),
            ];
            // The shared secret and the CA are given to agents and servers alike.
            let expected = if SHARED_STAGING_SETTINGS.contains(&def.key) {
                2
            } else {
                1
            };
            assert_eq!(
                groups.iter().filter(|&&g| g).count(),
                expected,
                "{} is in {groups:?}",
                def.key
            );
        }
    }

    #[test]
    fn run_takes_the_command_and_its_flags_verbatim() {
        let cli = Cli::try_parse_from([
            "cascade", "run", "--mount", "/ckpt", "--", "ls", "-l", "--mount", "x",
        ])
        .expect("parses");
        let Command::Run { mount, command, .. } = cli.command else {
            panic!("not run: {:?}", cli.command);
        };
        assert_eq!(mount.values, vec![("mount.prefix", "/ckpt".to_string())]);
        assert_eq!(command, ["ls", "-l", "--mount", "x"]);

        // Without --, everything from the first word that is not a flag of run is CMD's.
        let cli = Cli::try_parse_from(["cascade", "run", "sh", "-c", "exit 3"]).expect("parses");
        let Command::Run { mount, command, .. } = cli.command else {
            panic!("not run: {:?}", cli.command);
        };
        assert!(mount.values.is_empty());
        assert_eq!(command, ["sh", "-c", "exit 3"]);

        let cli = Cli::try_parse_from(["cascade", "run"]).expect("parses");
        let Command::Run { command, .. } = cli.command else {
            panic!("not run: {:?}", cli.command);
        };
        assert!(command.is_empty());
    }
}
