//! `cascade-bench staging`: the staging servers (L1) against baselines measured in the same
//! run. Writes staging.md and staging.json (bench/plot.py draws staging-throughput.png from
//! it). See bench/README.md.
//!
//! Three parts, each a real `cascade stage-server` (one process per server, its own arena
//! directory on local disk) fed by a real node agent (`cascade agent --staging ...`) from a
//! node store written by C programs under `cascade run` (LD_PRELOAD):
//! - ssd: raw write bandwidth of the disk under the arenas (fio: fsync at the end, fdatasync
//!   every 256 MiB as the server's Syncs, O_DIRECT; write(2) + fsync), memcpy and tmpfs
//!   write(2), against one big stream (1 writer, 1 file, 1 server) from its first write until
//!   the file is staged; in turns within each repetition.
//! - throughput (paper 004, Figures 3-4): N writer processes (1, 2, 4, 8) each write one file
//!   of total/N bytes into the node store at a common start; 1, 2 or 3 servers on loopback;
//!   aggregate GB/s from the first write until every file is staged (on a server's SSD). The
//!   servers drain to a directory in /dev/shm, and each point waits until they have drained,
//!   so the next one starts with idle servers.
//! - checkpoint (paper 004's 8.3x): the application's stall writing a checkpoint straight to
//!   the throttled S3 store of bench/netns-s3.sh (1 Gbit/s) against Cascade with one staging
//!   server in the network namespace of bench/netns-staging.sh (10 Gbit/s link) draining to
//!   that S3 store, and against Cascade without staging (the agent uploads to S3): stall
//!   (write + close + cascade_commit()), time until safe from the loss of the node (staged)
//!   and until durable.
//!
//! "Staged" is read from the node store itself: a thread of the bench attaches the store and
//! looks at the files' life cycle state (`Store::life_tree`) every 2 ms; a file is staged once
//! `LifeEntry::safe()` (the agent recorded the server's acknowledgement after its fdatasync, or
//! the file is durable), a checkpoint once `checkpoint_safe()` (its file list accepted by a
//! server) — the predicates `cascade wait --level staged` uses. The checkpoint part also runs
//! `cascade wait --level staged` and `--level durable` and reports when they returned.

use crate::baselines::{self, data_file, memcpy_s, run_ckptwriter, tmpfs_s, WRITER_C};
use crate::format::{num, secs_gbps, st};
use crate::net;
use crate::net::{measure_link, s3_server, WireWatch};
use crate::procs::{
    self, clean_cmd, compile, cpu_s, threads_cpu_s, tool_version, Node, StageServer,
};
use crate::report::{self, machine_table, Header, Md, RunClock, Table};
use crate::util::{
    self, check_mount, err, now_ns, prefix, size_str, store_name, Context, Res, Stats, MIB,
};
use cascade_durable::{DurableStore, Spec};
use cascade_staging::server::threads;
use cascade_store::{FileKind, Store};
use cascade_wire::{ClientOptions, Connection, ServerStatus};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parts of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// Disk, memcpy and tmpfs baselines against one big stream into one server.
    Ssd,
    /// Aggregate staging throughput by writer processes and servers.
    Throughput,
    /// Checkpoint stall and time until staged / durable against direct S3 (needs the netns).
    Checkpoint,
}

/// The options (`cascade-bench staging --help`); the fields without an `arg` are derived by
/// [`SOpts::resolve`]. Serialized into staging.json without credentials.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct SOpts {
    /// Directory for staging.md and staging.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: 256 MiB per throughput point, processes 1,4, servers 1,2, one 64 MiB
    /// checkpoint, 1 repetition, 64 MiB link tests. Explicit flags override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Parts to run.
    #[arg(
        long = "only",
        value_enum,
        value_delimiter = ',',
        default_value = "ssd,throughput,checkpoint"
    )]
    pub parts: Vec<Part>,
    /// Repetitions of each measurement; tables show the median.
    #[arg(long, default_value_t = 3, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// Writer processes of the throughput part.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8",
        default_value_if("quick", "true", "1,4")
    )]
    pub procs: Vec<usize>,
    /// Staging servers of the throughput part.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3",
        default_value_if("quick", "true", "1,2")
    )]
    pub servers: Vec<usize>,
    /// MiB written per throughput point, split evenly over the writers; also the size of the
    /// single stream and of the disk baselines.
    #[arg(long, default_value_t = 1024, default_value_if("quick", "true", "256"))]
    #[serde(skip)]
    total_mib: u64,
    /// Checkpoint sizes of the checkpoint part in MiB.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,1024",
        default_value_if("quick", "true", "64")
    )]
    #[serde(skip)]
    sizes_mib: Vec<u64>,
    /// Directory on local disk for the servers' arenas and the disk baselines.
    #[arg(long, default_value = "/var/tmp")]
    pub arena_dir: PathBuf,
    /// Seconds to wait for a point to be staged or drained.
    #[arg(long = "wait-timeout", default_value_t = 900)]
    pub wait_timeout_s: u64,
    /// Bytes per write(2) call of the writers, in MiB.
    #[arg(long, default_value_t = 8)]
    #[serde(skip)]
    piece_mib: u64,
    /// First TCP port of the loopback servers (the throughput part uses PORT+10*k+i).
    #[arg(long, default_value_t = 7180)]
    pub port_base: u16,
    /// The cascade CLI (its libcascade.so next to it).
    #[arg(long, default_value = "target/release/cascade")]
    pub cascade: PathBuf,
    /// The C compiler for the writer programs.
    #[arg(long, default_value = "cc")]
    pub cc: String,
    /// fio, for the disk baselines (installed with apt-get by bench/run.sh when missing).
    #[arg(long, default_value = "fio")]
    pub fio: String,
    /// Mount prefix of the node stores under `cascade run`.
    #[arg(long, default_value = "/cascade")]
    pub mount: String,
    /// MiB per TCP goodput test over each shaped link; 0 skips them.
    #[arg(long, default_value_t = 512, default_value_if("quick", "true", "64"))]
    #[serde(skip)]
    linktest_mib: u64,
    /// The throttled durable store (`bench/netns-s3.sh up` prints it; `env` exports it); its
    /// credentials are never written out.
    #[arg(long, env = "CASCADE_BENCH_S3_URL", hide_env_values = true)]
    #[serde(skip)]
    pub url: Option<String>,
    /// Host end of the S3 link, whose tbf rate is its nominal rate.
    #[arg(long, env = "CASCADE_BENCH_LINK_DEV", default_value = "cs3-host")]
    pub link_dev: String,
    /// Network namespace of the S3 server (for its link test).
    #[arg(long, env = "CASCADE_BENCH_NETNS", default_value = "cascade-s3")]
    pub netns: String,
    /// Network namespace the checkpoint part's staging server runs in (bench/netns-staging.sh).
    #[arg(
        long,
        env = "CASCADE_BENCH_STAGE_NETNS",
        default_value = "cascade-stage"
    )]
    pub stage_netns: String,
    /// Address of the staging server in that namespace.
    #[arg(long, env = "CASCADE_BENCH_STAGE_IP", default_value = "10.78.0.2")]
    pub stage_ip: String,
    /// Host end of the staging link, whose tbf rate is its nominal rate.
    #[arg(long, env = "CASCADE_BENCH_STAGE_LINK_DEV", default_value = "cst-host")]
    pub stage_link_dev: String,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    /// The S3 store without credentials.
    #[arg(skip)]
    pub durable: Option<String>,
    /// The staging secret of this run (random): never written out.
    #[arg(skip)]
    #[serde(skip)]
    pub secret: String,
    #[arg(skip)]
    pub total: u64,
    #[arg(skip)]
    pub sizes: Vec<u64>,
    /// Where the throughput part's servers drain to (tmpfs).
    #[arg(skip)]
    pub drain_dir: PathBuf,
    #[arg(skip)]
    pub piece: u64,
    #[arg(skip)]
    pub linktest_bytes: u64,
    /// fio's fdatasync interval, like the agent's Sync every 256 MiB.
    #[arg(skip = 256u64)]
    pub fio_sync_mib: u64,
}

pub(crate) fn random_secret() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    let mut s = format!("bench-{}-", std::process::id());
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

impl SOpts {
    /// Checks the options and derives the byte sizes, the durable store's description, the
    /// secret and the drain directory.
    fn resolve(&mut self, pid: u32) -> Res<()> {
        let (procs, servers) = (&self.procs, &self.servers);
        if procs.is_empty() || procs.contains(&0) || servers.is_empty() || servers.contains(&0) {
            return err("--procs and --servers need positive counts");
        }
        if servers.iter().any(|&k| k > 9) {
            return err("--servers: at most 9 servers");
        }
        self.total = self.total_mib * MIB;
        if self.total == 0 || procs.iter().any(|&n| self.total % (n as u64 * MIB) != 0) {
            return err("--total-mib must be a positive multiple of every process count");
        }
        self.sizes = self.sizes_mib.iter().map(|m| m * MIB).collect();
        if self.sizes.is_empty() || self.sizes.contains(&0) {
            return err("--sizes-mib needs positive sizes");
        }
        if self.piece_mib == 0 || self.reps == 0 {
            return err("--piece-mib and --reps must be positive");
        }
        check_mount(&self.mount)?;
        self.mount = self.mount.trim_end_matches('/').to_string();
        // Every method here (direct, through the agent, through a server) alike.
        self.url = self
            .url
            .take()
            .filter(|u| !u.is_empty())
            .map(crate::util::as_over_https);
        if let Some(u) = &self.url {
            self.durable = Some(Spec::parse(u).ctx(|| "--url")?.describe());
        }
        self.pid = pid;
        self.secret = random_secret();
        self.drain_dir = PathBuf::from(format!("/dev/shm/{}-drain", prefix(pid)));
        self.piece = self.piece_mib * MIB;
        self.linktest_bytes = self.linktest_mib * MIB;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Programs: the writers (C, compiled at the start) and private copies of the CLI and library.

#[derive(Deserialize)]
struct RankOut {
    #[serde(default)]
    rank: Option<usize>,
    start_ns: u64,
    #[serde(default)]
    closed_ns: Option<u64>,
}

/// The compiled writer (bench/ckptwriter.c: one checkpoint, or `ranks`) and private copies
/// of the CLI and the library (a rebuild of the workspace during the run must not swap them).
struct Programs {
    bin: PathBuf,
    ckpt_writer: PathBuf,
}

impl Programs {
    fn prepare(o: &SOpts) -> Res<Programs> {
        let base = Path::new("/var/tmp").join(prefix(o.pid));
        let ckpt_writer = PathBuf::from(format!("{}-ckptwriter", base.display()));
        compile(&o.cc, WRITER_C, &ckpt_writer)?;
        if !o.cascade.is_file() {
            return err(format!(
                "{} does not exist (cargo build --release -p cascade-cli -p cascade-preload)",
                o.cascade.display()
            ));
        }
        let bin_dir = PathBuf::from(format!("{}-bin", base.display()));
        std::fs::create_dir_all(&bin_dir).ctx(|| format!("creating {}", bin_dir.display()))?;
        let bin = bin_dir.join("cascade");
        std::fs::copy(&o.cascade, &bin)
            .ctx(|| format!("copying {} to {}", o.cascade.display(), bin.display()))?;
        let lib = o.cascade.with_file_name("libcascade.so");
        std::fs::copy(&lib, bin_dir.join("libcascade.so"))
            .ctx(|| format!("copying {}", lib.display()))?;
        let missing: Vec<&str> = ["stage-server", "agent", "wait", "run", "rm"]
            .into_iter()
            .filter(|sub| {
                !Command::new(&bin)
                    .args([sub, "--help"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect();
        if !missing.is_empty() {
            return err(format!(
                "{} has no `{}` (`cascade {} --help` fails)",
                o.cascade.display(),
                missing.join("`, `"),
                missing[0]
            ));
        }
        Ok(Programs { bin, ckpt_writer })
    }

    /// Whether `cascade wait` knows `--level staged`.
    fn wait_knows_staged(&self) -> bool {
        Command::new(&self.bin)
            .args(["wait", "--help"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("staged"))
    }
}

// ---------------------------------------------------------------------------------------------
// Staging servers and the node side (store + agent).

/// Starts `cascade stage-server` on `addr` (in network namespace `netns` when given) with
/// the arena directory `dir`, draining to `drain_to`.
fn start_server(
    bin: &Path,
    addr: &str,
    dir: &Path,
    drain_to: &str,
    secret: &str,
    netns: Option<&str>,
) -> Res<StageServer> {
    let ns_file = match netns {
        Some(ns) => {
            let p = format!("/run/netns/{ns}");
            Some(
                std::fs::File::open(&p)
                    .ctx(|| format!("opening {p} (bench/netns-staging.sh up creates it)"))?,
            )
        }
        None => None,
    };
    let ns_fd = ns_file.as_ref().map(|f| f.as_raw_fd());
    let mut cmd = clean_cmd(bin);
    cmd.env("CASCADE_STAGING_SECRET", secret);
    // SAFETY: setns is async-signal-safe; it moves only the child (before exec) into the
    // namespace, whose file `ns_file` stays open until the spawn has returned.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = ns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let args = ["--listen", addr, "--drain-to", drain_to];
    let mut server = StageServer::spawn(cmd, dir.to_path_buf(), dir.with_extension("log"), &args)?;
    drop(ns_file);
    server.wait_listening()?;
    Ok(server)
}

/// A node store with its agent and staging servers, and the bench's own handle on the store.
/// Stops them and destroys the store when dropped.
struct Rig {
    node: Node,
    store: String,
    mount: String,
    durable: String,
    client: ClientOptions,
    handle: Option<Store>,
}

impl Rig {
    /// `servers`: (address, arena directory) of each server to start; `netns`: where.
    #[allow(clippy::too_many_arguments)]
    fn start(
        o: &SOpts,
        p: &Programs,
        tag: &str,
        capacity: u64,
        durable: &str,
        servers: &[(String, PathBuf)],
        netns: Option<&str>,
    ) -> Res<Rig> {
        let mut started = Vec::new();
        for (addr, dir) in servers {
            started.push(start_server(&p.bin, addr, dir, durable, &o.secret, netns)?);
        }
        let store = store_name(o.pid, tag);
        let staging = servers
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let capacity = capacity.to_string();
        let mut env = vec![
            ("CASCADE_STORE", store.as_str()),
            ("CASCADE_DURABLE", durable),
            ("CASCADE_CAPACITY", &capacity),
            ("CASCADE_SPILL_SIZE", "0"),
            ("CASCADE_MOUNT", &o.mount),
        ];
        if !staging.is_empty() {
            env.extend([
                ("CASCADE_STAGING", staging.as_str()),
                ("CASCADE_STAGING_SECRET", &o.secret),
            ]);
        }
        let mut node = Node::init(&p.bin, &env, &[])?;
        node.agent_log = Path::new("/var/tmp").join(format!("{}-agent-{tag}.log", prefix(o.pid)));
        node.servers = started;
        node.start_agent(&[], &[])?;
        let handle = Store::attach(&store).ctx(|| format!("attaching {store}"))?;
        handle.map_in();
        let (mount, durable, client) = (
            o.mount.clone(),
            durable.to_string(),
            ClientOptions::new(&o.secret),
        );
        Ok(Rig {
            node,
            store,
            mount,
            durable,
            client,
            handle: Some(handle),
        })
    }

    /// Fails if the agent or a server exited.
    fn check(&mut self) -> Res<()> {
        self.node.alive()
    }

    fn store(&self) -> Res<Store> {
        self.handle
            .clone()
            .ok_or_else(|| util::BenchError("the rig's store is not attached".into()))
    }

    /// CPU seconds used so far by the agent, by all servers together, and by the servers'
    /// draining threads (`threads::DRAINING`).
    fn cpu(&self) -> (f64, f64, f64) {
        let cpu = |pid: Option<u32>| pid.and_then(cpu_s).unwrap_or(f64::NAN);
        let draining =
            |pid: Option<u32>| pid.map_or(f64::NAN, |pid| threads_cpu_s(pid, threads::DRAINING));
        (
            cpu(self.node.agent_pid()),
            self.node.servers.iter().map(|s| cpu(s.pid())).sum(),
            self.node.servers.iter().map(|s| draining(s.pid())).sum(),
        )
    }

    /// A connection to each server.
    fn connect(&self) -> Res<Vec<Connection>> {
        let connect = |s: &StageServer| {
            Connection::connect(&s.addr, &self.client)
                .ctx(|| format!("connecting to the staging server {}", s.addr))
        };
        self.node.servers.iter().map(connect).collect()
    }

    /// Status of every server.
    fn statuses(&self) -> Res<Vec<ServerStatus>> {
        let status = |mut c: Connection| {
            let s = c.status().ctx(|| "status of a staging server");
            c.goodbye();
            s
        };
        self.connect()?.into_iter().map(status).collect()
    }

    /// Waits until no server has anything left to drain.
    fn wait_drained(&mut self, timeout: Duration) -> Res<f64> {
        let t0 = Instant::now();
        loop {
            let st = self.statuses()?;
            if st
                .iter()
                .all(|s| s.pending_files == 0 && s.pending_checkpoints == 0)
            {
                return Ok(t0.elapsed().as_secs_f64());
            }
            self.check()?;
            if t0.elapsed() > timeout {
                let last: Vec<String> = st.iter().filter_map(|s| s.last_error.clone()).collect();
                let last = if last.is_empty() {
                    "none".into()
                } else {
                    last.join("; ")
                };
                let pending = st.iter().map(|s| s.pending_files).sum::<u64>();
                let secs = timeout.as_secs_f64();
                return err(format!(
                    "the staging servers still have {pending} file(s) to drain after {secs:.0} s; last errors: {last}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) -> Res<()> {
        self.handle = None;
        let stopped = self.node.stop();
        let _ = std::fs::remove_file(&self.node.agent_log);
        stopped
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("staging cleanup: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watching the node store and the servers during a measurement.

/// What the store watcher saw, CLOCK_MONOTONIC ns.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// When each file (by path) was first seen safe (staged or durable).
    file_safe_ns: Vec<(String, u64)>,
    /// When all `files` files were safe (and, for a checkpoint, its file list accepted).
    staged_ns: Option<u64>,
    /// When all files were durable (and, for a checkpoint, it was complete).
    durable_ns: Option<u64>,
}

/// Looks at the life cycle state of `root` in the node store every 2 ms on a thread of its
/// own, until it is durable, stopped or `timeout`.
struct StoreWatch {
    stop: Arc<AtomicBool>,
    /// Set once everything is staged.
    staged: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Seen>,
}

impl StoreWatch {
    /// `checkpoint`: `root` is committed by the writer; staged then also needs its file list
    /// pushed to a server (`checkpoint_safe`), durable its marker (`complete`).
    fn start(
        store: Store,
        root: &str,
        files: usize,
        checkpoint: bool,
        timeout: Duration,
    ) -> StoreWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let staged = Arc::new(AtomicBool::new(false));
        let staged_flag = staged.clone();
        let root = root.to_string();
        let handle = std::thread::spawn(move || {
            let mut seen = Seen::default();
            let deadline = Instant::now() + timeout;
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                let t = now_ns();
                if let Ok(tree) = store.life_tree(&root) {
                    let fs: Vec<_> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
                    for f in &fs {
                        if f.safe() && !seen.file_safe_ns.iter().any(|(p, _)| *p == f.path) {
                            seen.file_safe_ns.push((f.path.clone(), t));
                        }
                    }
                    let all = fs.len() == files;
                    let r = &tree[0];
                    if seen.staged_ns.is_none()
                        && all
                        && fs.iter().all(|f| f.safe())
                        && (!checkpoint || r.checkpoint_safe() || r.complete())
                    {
                        seen.staged_ns = Some(t);
                        staged_flag.store(true, Ordering::Release);
                    }
                    if seen.durable_ns.is_none()
                        && all
                        && fs.iter().all(|f| f.durable())
                        && (!checkpoint || r.complete())
                    {
                        seen.durable_ns = Some(t);
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        });
        StoreWatch {
            stop,
            staged,
            handle,
        }
    }

    fn is_staged(&self) -> bool {
        self.staged.load(Ordering::Acquire)
    }

    fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }

    /// Waits until the watcher ends by itself (durable or timeout).
    fn join(self) -> Seen {
        self.handle.join().unwrap_or_default()
    }

    fn finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// Samples the servers' absorbed bytes every 20 ms on a thread of its own: (time, absorbed
/// bytes of each server).
struct AbsorbWatch {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(u64, Vec<u64>)>>,
}

impl AbsorbWatch {
    fn start(rig: &Rig) -> Res<AbsorbWatch> {
        let mut conns = rig.connect()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut v = Vec::new();
            loop {
                let t = now_ns();
                let mut row = Vec::with_capacity(conns.len());
                for c in conns.iter_mut() {
                    row.push(c.status().map(|s| s.absorbed_bytes).unwrap_or(u64::MAX));
                }
                v.push((t, row));
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            for c in conns {
                c.goodbye();
            }
            v
        });
        Ok(AbsorbWatch { stop, handle })
    }

    /// (first sample after the servers' absorbed bytes rose, first sample at which they had
    /// risen by `total`), CLOCK_MONOTONIC ns.
    fn finish(self, total: u64) -> Option<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let v = self.handle.join().ok()?;
        let sum = |row: &Vec<u64>| -> Option<u64> {
            row.iter()
                .try_fold(0u64, |a, &b| (b != u64::MAX).then(|| a + b))
        };
        let base = sum(&v.first()?.1)?;
        let rise = v.iter().find(|(_, r)| sum(r).is_some_and(|s| s > base))?.0;
        let full = v
            .iter()
            .find(|(_, r)| sum(r).is_some_and(|s| s >= base + total))?
            .0;
        Some((rise, full))
    }
}

// ---------------------------------------------------------------------------------------------
// The measurements.

/// One throughput point: N writers, one file each, until every file is staged.
#[derive(Debug, Clone)]
struct TpSample {
    /// From the common start until every file was staged.
    staged_s: f64,
    /// From the common start until the last writer closed its file.
    written_s: f64,
    /// When the first and the last file were seen staged, from the common start.
    first_file_s: f64,
    last_file_s: f64,
    /// The servers' absorb window: first rise of their absorbed bytes until all bytes were
    /// absorbed (appended, before the final fdatasync).
    absorb_s: Option<(f64, f64)>,
    /// Bytes each server absorbed.
    absorbed: Vec<u64>,
    agent_cpu_s: f64,
    server_cpu_s: f64,
    /// The part of `server_cpu_s` spent draining files sealed before the last one was staged.
    server_drain_cpu_s: f64,
    /// Until the servers had drained everything (to tmpfs), after staged.
    drained_after_s: f64,
}

fn parse_json_lines<T: serde::de::DeserializeOwned>(out: &[u8]) -> Vec<T> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn throughput_point(
    o: &SOpts,
    p: &Programs,
    rig: &mut Rig,
    datafile: &Path,
    n: usize,
    total: u64,
    tag: &str,
) -> Res<TpSample> {
    rig.check()?;
    let size = total / n as u64;
    let root = format!("/{tag}");
    let timeout = Duration::from_secs(o.wait_timeout_s);
    let before: Vec<u64> = rig.statuses()?.iter().map(|s| s.absorbed_bytes).collect();
    baselines::settle();
    let absorb = AbsorbWatch::start(rig)?;
    let cpu0 = rig.cpu();
    let watch = StoreWatch::start(rig.store()?, &root, n, false, timeout);
    let out = rig
        .node
        .cmd()
        .arg("run")
        .arg("--")
        .arg(&p.ckpt_writer)
        .arg("ranks")
        .arg(format!("{}{root}", rig.mount))
        .arg(n.to_string())
        .arg(size.to_string())
        .arg(o.piece.to_string())
        .arg(datafile)
        .stdin(Stdio::null())
        .output()
        .ctx(|| "running cascade run -- ckptwriter ranks");
    let out = match out {
        Ok(x) if x.status.success() => x,
        Ok(x) => {
            let _ = watch.stop();
            let _ = absorb.finish(total);
            return err(format!(
                "cascade run -- ckptwriter ranks {n} x {} failed ({}): {}",
                size_str(size),
                x.status,
                procs::one_line(&x.stderr)
            ));
        }
        Err(e) => {
            let _ = watch.stop();
            let _ = absorb.finish(total);
            return Err(e);
        }
    };
    let lines: Vec<RankOut> = parse_json_lines(&out.stdout);
    let Some(start) = lines.iter().find(|l| l.rank.is_none()).map(|l| l.start_ns) else {
        let _ = watch.stop();
        let _ = absorb.finish(total);
        return err(format!(
            "ckptwriter ranks printed no start line: {:?}",
            String::from_utf8_lossy(&out.stdout)
        ));
    };
    let closed = lines
        .iter()
        .filter(|l| l.rank.is_some())
        .filter_map(|l| l.closed_ns)
        .max()
        .unwrap_or(start);
    let earliest = lines
        .iter()
        .filter(|l| l.rank.is_some())
        .map(|l| l.start_ns)
        .min()
        .unwrap_or(start);
    // Staged: wait for the watcher to see it; the CPU and absorb figures end there (the drain
    // follows). The watcher goes on until durable.
    let staged_deadline = Instant::now() + timeout;
    while !watch.is_staged() && !watch.finished() && Instant::now() < staged_deadline {
        if let Err(e) = rig.check() {
            let _ = watch.stop();
            let _ = absorb.finish(total);
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let cpu1 = rig.cpu();
    let window = absorb.finish(total);
    let mut seen = loop {
        if watch.finished() {
            break watch.join();
        }
        if rig.check().is_err() || Instant::now() > staged_deadline {
            break watch.stop();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let Some(staged) = seen.staged_ns else {
        return err(format!(
            "{root}: {} of {n} files staged after {} s; agent log: {}",
            seen.file_safe_ns.len(),
            o.wait_timeout_s,
            procs::tail(&rig.node.agent_log, 3)
        ));
    };
    let t_drained = rig.wait_drained(timeout)?;
    let after: Vec<u64> = rig.statuses()?.iter().map(|s| s.absorbed_bytes).collect();
    let absorbed: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    // The writers started within microseconds of the release; count from the earliest.
    let t0 = earliest.min(start);
    let rel = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
    seen.file_safe_ns.sort_by_key(|x| x.1);
    let first_file = seen.file_safe_ns.first().map_or(f64::NAN, |x| rel(x.1));
    let last_file = seen.file_safe_ns.last().map_or(f64::NAN, |x| rel(x.1));
    let durable_wait = seen.durable_ns.map_or(t_drained, |d| rel(d) - rel(staged));
    // Clean up: the files in the store and what the servers drained to tmpfs.
    if let Err(e) = rig.node.run_ok(&["rm", "-r", &root]) {
        eprintln!("  warning: {e}");
    }
    let drained = Path::new(&rig.durable).join(tag);
    if drained.exists() {
        if let Err(e) = std::fs::remove_dir_all(&drained) {
            // Not a failed measurement: the servers reported everything drained, but
            // something still wrote below (named here, to find out what).
            // The agent's log says whether it uploaded anything itself (a server it took
            // for down sends the rest straight to the durable store).
            let left: Vec<String> = walkdir_names(&drained);
            eprintln!(
                "  warning: removing {}: {e}; left: {left:?}; agent log: {}",
                drained.display(),
                procs::tail(&rig.node.agent_log, 5)
            );
        }
    }
    Ok(TpSample {
        staged_s: rel(staged),
        written_s: rel(closed),
        first_file_s: first_file,
        last_file_s: last_file,
        absorb_s: window.map(|(a, b)| (rel(a), rel(b))),
        absorbed,
        agent_cpu_s: cpu1.0 - cpu0.0,
        server_cpu_s: cpu1.1 - cpu0.1,
        server_drain_cpu_s: cpu1.2 - cpu0.2,
        drained_after_s: durable_wait.max(0.0),
    })
}

/// A fio variant of the disk baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fio {
    /// Buffered sequential writes, fsync at the end (--end_fsync=1).
    EndFsync,
    /// Buffered, fdatasync every 256 MiB and fsync at the end, like the server's group
    /// fdatasync on each Sync the agent sends every 256 MiB.
    Sync,
    /// O_DIRECT writes (no page cache).
    Direct,
}

/// Runs fio once: sequential 1 MiB writes of `bytes` into a new file in `dir`; GB/s as fio
/// reports it (bytes / its job run time, which includes the final fsync).
fn fio_gbps(o: &SOpts, kind: Fio, bytes: u64) -> Res<f64> {
    let file = o.arena_dir.join(format!("{}-fio", prefix(o.pid)));
    let _ = std::fs::remove_file(&file);
    let mut c = Command::new(&o.fio);
    c.arg("--name=cascade-bench")
        .arg(format!("--filename={}", file.display()))
        .args(["--rw=write", "--bs=1M", "--ioengine=psync"])
        .arg(format!("--size={}M", bytes / MIB))
        .arg("--output-format=json");
    match kind {
        Fio::EndFsync => {
            c.arg("--end_fsync=1");
        }
        Fio::Sync => {
            c.arg(format!("--fdatasync={}", o.fio_sync_mib))
                .arg("--end_fsync=1");
        }
        Fio::Direct => {
            c.arg("--direct=1");
        }
    }
    baselines::settle();
    let out = c.output().ctx(|| format!("running {}", o.fio));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    if !out.status.success() {
        return err(format!(
            "fio failed ({}): {}",
            out.status,
            procs::one_line(&out.stderr)
        ));
    }
    // fio may print warnings before the JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value = serde_json::from_str(json).ctx(|| "reading fio's JSON output")?;
    let bw = v["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .ok_or_else(|| util::BenchError("fio's JSON has no jobs[0].write.bw_bytes".into()))?;
    Ok(bw / 1e9)
}

/// One checkpoint under Cascade, seconds from the start of the write.
#[derive(Debug, Clone, Copy)]
struct CkSample {
    stall: f64,
    write: f64,
    commit: f64,
    staged: f64,
    durable: f64,
    wait_staged: Option<f64>,
    wait_durable: Option<f64>,
    /// The completion marker's own timestamp (`completed_unix_ns`).
    marker: Option<f64>,
    /// When the bytes of the upload or drain started and finished going over the S3 link.
    wire_start: Option<f64>,
    wire_end: Option<f64>,
}

/// One checkpoint written by ckptwriter under `cascade run` (write + close +
/// cascade_commit()), then watched until staged and durable.
#[allow(clippy::too_many_arguments)]
fn checkpoint_cascade(
    o: &SOpts,
    p: &Programs,
    rig: &mut Rig,
    durable: &DurableStore,
    datafile: &Path,
    size: u64,
    name: &str,
    wait_staged: bool,
) -> Res<CkSample> {
    rig.check()?;
    let store_path = format!("/{name}");
    baselines::clear_remote(durable, name)?;
    baselines::settle();
    let timeout = Duration::from_secs(o.wait_timeout_s);
    let watch = StoreWatch::start(rig.store()?, &store_path, 1, true, timeout);
    let wire = WireWatch::start(&o.link_dev);
    let (writer, mount) = (&p.ckpt_writer, &rig.mount);
    let w = run_ckptwriter(
        &rig.node, writer, mount, name, size, o.piece, datafile, "lib",
    );
    let w = match w {
        Ok(w) => w,
        Err(e) => {
            let _ = watch.stop();
            let _ = wire.and_then(|w| w.finish());
            return Err(e);
        }
    };
    let mut levels = Vec::new();
    if wait_staged {
        levels.push("staged");
    }
    levels.push("durable");
    let waits = rig.node.wait_levels(&store_path, &levels, o.wait_timeout_s);
    let seen = watch.join();
    let wire = wire.and_then(|x| x.finish());
    let waits = waits?;
    let rel = |t: u64| (t as f64 - w.start_ns as f64) / 1e9;
    let (Some(staged), Some(dur)) = (seen.staged_ns, seen.durable_ns) else {
        return err(format!(
            "{store_path}: `cascade wait` returned but the store watcher saw staged {:?}, \
             durable {:?}",
            seen.staged_ns.map(rel),
            seen.durable_ns.map(rel)
        ));
    };
    let marker = durable
        .read_marker(name)
        .ok()
        .flatten()
        .map(|m| (m.completed_unix_ns as f64 - w.start_unix_ns as f64) / 1e9);
    if let Err(e) = rig.node.run_ok(&["rm", "-r", &store_path]) {
        eprintln!("  warning: {e}");
    }
    rig.wait_drained(timeout)?;
    baselines::clear_remote(durable, name)?;
    Ok(CkSample {
        stall: (w.committed_ns - w.start_ns) as f64 / 1e9,
        write: (w.written_ns - w.start_ns) as f64 / 1e9,
        commit: (w.committed_ns - w.written_ns) as f64 / 1e9,
        staged: rel(staged),
        durable: rel(dur),
        wait_staged: wait_staged.then(|| rel(waits[0])),
        wait_durable: waits.last().map(|&t| rel(t)),
        marker,
        wire_start: wire.map(|(a, _)| rel(a)),
        wire_end: wire.map(|(_, b)| rel(b)),
    })
}

// ---------------------------------------------------------------------------------------------
// Results.

#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    pub name: String,
    pub what: String,
    pub gbps: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct TpRow {
    pub servers: usize,
    pub procs: usize,
    pub file_bytes: u64,
    pub total_bytes: u64,
    /// total / (first write until every file staged).
    pub gbps: Stats,
    pub staged_s: Stats,
    /// total / (first write until the last close): the node store.
    pub write_gbps: Stats,
    /// From the last close until every file was staged.
    pub after_close_s: Stats,
    /// total / the servers' absorb window (absorbed bytes sampled every 20 ms).
    pub absorb_gbps: Option<Stats>,
    /// From the first write until the servers' absorbed bytes first rose.
    pub absorb_start_s: Option<Stats>,
    pub first_file_s: Stats,
    pub last_file_s: Stats,
    /// Servers that received data, per repetition.
    pub servers_used: Vec<usize>,
    /// Absorbed bytes summed over the servers / total, per repetition (1 = each byte once).
    pub absorbed_ratio: Vec<f64>,
    pub agent_cpu_s: Stats,
    pub server_cpu_s: Stats,
    /// Of `server_cpu_s`, the draining threads' part (files sealed earlier drain meanwhile).
    pub server_drain_cpu_s: Stats,
    pub drained_after_s: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct CkMethod {
    pub stall_s: Stats,
    pub write_s: Stats,
    pub commit_s: Stats,
    pub staged_s: Stats,
    pub durable_s: Stats,
    pub wait_staged_s: Option<Stats>,
    pub wait_durable_s: Option<Stats>,
    /// From the start of the write until the marker's own timestamp.
    pub marker_s: Option<Stats>,
    pub wire_start_s: Option<Stats>,
    pub wire_end_s: Option<Stats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CkRow {
    pub bytes: u64,
    pub direct_s3_s: Option<Stats>,
    pub direct_s3_wire_s: Option<Stats>,
    /// Cascade with one staging server draining to S3.
    pub staging: Option<CkMethod>,
    /// Cascade whose agent uploads to S3 itself.
    pub agent_s3: Option<CkMethod>,
    pub link_min_nominal_s: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct SResults {
    pub baselines: Vec<Baseline>,
    /// CPU seconds of the server per raw client run (`raw client → server`).
    pub raw_server_cpu_s: Vec<f64>,
    /// One writer, one file of `total` bytes, one server, in turns with the baselines.
    pub stream: Option<TpRow>,
    pub throughput: Vec<TpRow>,
    pub links: Vec<net::LinkInfo>,
    pub checkpoint: Vec<CkRow>,
    /// Whether `cascade wait --level staged` exists in the CLI measured.
    pub wait_staged_cli: bool,
    /// What did not run or failed, one line each.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    pub cascade_cli: String,
    pub library: String,
    pub fio: String,
    pub s3_server: String,
    pub options: &'a SOpts,
    pub results: &'a SResults,
}

fn stats_opt(v: &[f64]) -> Option<Stats> {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| Stats::of(&v))
}

fn tp_row(servers: usize, procs: usize, total: u64, xs: &[TpSample]) -> TpRow {
    let col = |f: &dyn Fn(&TpSample) -> f64| Stats::of(&xs.iter().map(f).collect::<Vec<_>>());
    let b = total as f64;
    TpRow {
        servers,
        procs,
        file_bytes: total / procs as u64,
        total_bytes: total,
        gbps: col(&|x| b / x.staged_s / 1e9),
        staged_s: col(&|x| x.staged_s),
        write_gbps: col(&|x| b / x.written_s / 1e9),
        after_close_s: col(&|x| x.staged_s - x.written_s),
        absorb_gbps: stats_opt(
            &xs.iter()
                .filter_map(|x| x.absorb_s.map(|(a, e)| b / (e - a) / 1e9))
                .collect::<Vec<_>>(),
        ),
        absorb_start_s: stats_opt(
            &xs.iter()
                .filter_map(|x| x.absorb_s.map(|(a, _)| a))
                .collect::<Vec<_>>(),
        ),
        first_file_s: col(&|x| x.first_file_s),
        last_file_s: col(&|x| x.last_file_s),
        servers_used: xs
            .iter()
            .map(|x| x.absorbed.iter().filter(|&&a| a > 0).count())
            .collect(),
        absorbed_ratio: xs
            .iter()
            .map(|x| x.absorbed.iter().sum::<u64>() as f64 / b)
            .collect(),
        agent_cpu_s: col(&|x| x.agent_cpu_s),
        server_cpu_s: col(&|x| x.server_cpu_s),
        server_drain_cpu_s: col(&|x| x.server_drain_cpu_s),
        drained_after_s: col(&|x| x.drained_after_s),
    }
}

fn ck_method(xs: &[CkSample]) -> Option<CkMethod> {
    if xs.is_empty() {
        return None;
    }
    let col = |f: &dyn Fn(&CkSample) -> f64| Stats::of(&xs.iter().map(f).collect::<Vec<_>>());
    let opt = |f: &dyn Fn(&CkSample) -> Option<f64>| {
        stats_opt(&xs.iter().filter_map(f).collect::<Vec<_>>())
    };
    Some(CkMethod {
        stall_s: col(&|x| x.stall),
        write_s: col(&|x| x.write),
        commit_s: col(&|x| x.commit),
        staged_s: col(&|x| x.staged),
        durable_s: col(&|x| x.durable),
        wait_staged_s: opt(&|x| x.wait_staged),
        wait_durable_s: opt(&|x| x.wait_durable),
        marker_s: opt(&|x| x.marker),
        wire_start_s: opt(&|x| x.wire_start),
        wire_end_s: opt(&|x| x.wire_end),
    })
}

// ---------------------------------------------------------------------------------------------
// Running the parts.

#[derive(Clone, Copy, Debug)]
enum SsdMethod {
    Memcpy,
    Tmpfs,
    Disk,
    Fio(Fio),
    /// Loopback TCP alone: one connection, the receiver discards.
    Tcp,
    /// Loopback TCP into write(2) to a file in the arena directory, fdatasync every
    /// `fio_sync_mib`: the server's data path without its framing, checks and index.
    TcpDisk,
    /// A client of the bench's own (no agent) sending the bytes from memory as one file in
    /// 8 MiB Write frames to the stream's server, then Sync.
    RawClient,
    Stream,
}

/// One connection over 127.0.0.1 carrying `bytes` in `piece`-sized writes; the receiver
/// reads into a 16 MiB buffer and discards it, or (`sink`) writes it into that file with an
/// fdatasync every `sync_every` bytes and one at the end. Seconds from the first byte sent
/// until the receiver is done.
fn loopback_s(bytes: &[u8], piece: usize, sink: Option<(&Path, u64)>) -> Res<f64> {
    use std::io::Write as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ctx(|| "loopback listener")?;
    let addr = listener.local_addr().ctx(|| "loopback address")?;
    let total = bytes.len();
    std::thread::scope(|scope| -> Res<f64> {
        let receiver = scope.spawn(move || -> Res<()> {
            let (mut sock, _) = listener.accept().ctx(|| "loopback accept")?;
            let mut file = match sink {
                Some((path, _)) => Some(
                    std::fs::File::create(path).ctx(|| format!("creating {}", path.display()))?,
                ),
                None => None,
            };
            let sync_every = sink.map_or(u64::MAX, |(_, n)| n.max(1));
            let mut buf = vec![1u8; 16 << 20];
            let (mut got, mut unsynced) = (0usize, 0u64);
            while got < total {
                let n = sock.read(&mut buf).ctx(|| "loopback read")?;
                if n == 0 {
                    return err("loopback: the sender closed early");
                }
                got += n;
                if let Some(f) = file.as_mut() {
                    f.write_all(&buf[..n]).ctx(|| "loopback sink write")?;
                    unsynced += n as u64;
                    if unsynced >= sync_every {
                        f.sync_data().ctx(|| "loopback sink fdatasync")?;
                        unsynced = 0;
                    }
                }
            }
            if let Some(f) = file.as_mut() {
                f.sync_all().ctx(|| "loopback sink fsync")?;
            }
            Ok(())
        });
        let mut sock = std::net::TcpStream::connect(addr).ctx(|| "loopback connect")?;
        let t0 = Instant::now();
        for part in bytes.chunks(piece.max(1)) {
            sock.write_all(part).ctx(|| "loopback write")?;
        }
        let received = receiver.join();
        let s = t0.elapsed().as_secs_f64();
        match received {
            Ok(r) => r?,
            Err(_) => return err("loopback receiver panicked"),
        }
        Ok(s)
    })
}

/// What one raw client run measured: seconds from the first Write until the SyncOk, and
/// the CPU seconds the server used meanwhile.
struct RawRun {
    s: f64,
    server_cpu_s: f64,
}

/// Sends `bytes` as one file (`key`, sealed with the job's tag) in 8 MiB Write frames to the first
/// server of `rig` from this process, then Sync.
fn raw_client_run(rig: &Rig, bytes: &[u8], key: &str) -> Res<RawRun> {
    use cascade_wire::client::OutSegment;
    let mut conns = rig.connect()?;
    let Some(conn) = conns.first_mut() else {
        return err("the raw client's rig has no server");
    };
    let size = bytes.len() as u64;
    let seal = conn.seal(key, 1, size, *blake3::hash(bytes).as_bytes());
    let frame = 8usize << 20;
    let (_, cpu0, _) = rig.cpu();
    let t0 = Instant::now();
    let mut offset = 0usize;
    while offset < bytes.len() || offset == 0 {
        let end = (offset + frame).min(bytes.len());
        let last = end == bytes.len();
        conn.write(&[OutSegment {
            key,
            stamp: 1,
            size,
            offset: offset as u64,
            seal: last.then_some(seal),
            data: &[&bytes[offset..end]],
        }])
        .ctx(|| "raw client Write")?;
        offset = end;
        if last {
            break;
        }
    }
    conn.sync().ctx(|| "raw client Sync")?;
    let s = t0.elapsed().as_secs_f64();
    let (_, cpu1, _) = rig.cpu();
    for c in conns {
        c.goodbye();
    }
    Ok(RawRun {
        s,
        server_cpu_s: cpu1 - cpu0,
    })
}

/// The disk and memory baselines and the single stream, in turns within each repetition.
fn ssd_part(
    o: &SOpts,
    p: &Programs,
    mut rig: Option<&mut Rig>,
    data: &[u8],
    datafile: &Path,
    r: &mut SResults,
) -> Res<()> {
    let total = o.total;
    let bytes = &data[..total as usize];
    // Pre-faulted and written once: memory that has held data before.
    let mut buf = vec![1u8; total as usize];
    let tmpfs = PathBuf::from(format!("/dev/shm/{}-tmpfs", prefix(o.pid)));
    let disk_dir = o.arena_dir.join(format!("{}-disk", prefix(o.pid)));
    let methods = [
        SsdMethod::Memcpy,
        SsdMethod::Tmpfs,
        SsdMethod::Disk,
        SsdMethod::Fio(Fio::EndFsync),
        SsdMethod::Fio(Fio::Sync),
        SsdMethod::Fio(Fio::Direct),
        SsdMethod::Tcp,
        SsdMethod::TcpDisk,
        SsdMethod::RawClient,
        SsdMethod::Stream,
    ];
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    let mut stream: Vec<TpSample> = Vec::new();
    let mut fio_ok = true;
    for rep in 0..o.reps {
        for k in 0..methods.len() {
            let i = (rep + k) % methods.len();
            let gb = total as f64 / 1e9;
            let label = format!("  ssd rep {}/{}", rep + 1, o.reps);
            match methods[i] {
                SsdMethod::Memcpy => {
                    let s = memcpy_s(bytes, &mut buf);
                    eprintln!("{label}: memcpy {:.2} GB/s", gb / s);
                    got[i].push(gb / s);
                }
                SsdMethod::Tmpfs => {
                    let s = tmpfs_s(&tmpfs, bytes, o.piece as usize)?;
                    eprintln!("{label}: tmpfs write {:.2} GB/s", gb / s);
                    got[i].push(gb / s);
                }
                SsdMethod::Disk => {
                    let (_, s) = baselines::direct_dir(&disk_dir, bytes, o.piece as usize)?;
                    eprintln!("{label}: disk write+fsync {:.2} GB/s", gb / s);
                    got[i].push(gb / s);
                }
                SsdMethod::Fio(kind) => {
                    if !fio_ok {
                        continue;
                    }
                    match fio_gbps(o, kind, total) {
                        Ok(g) => {
                            eprintln!("{label}: fio {kind:?} {g:.2} GB/s");
                            got[i].push(g);
                        }
                        Err(e) => {
                            r.notes.push(format!("fio baselines not measured: {e}"));
                            eprintln!("fio: {e}; skipping the fio baselines");
                            fio_ok = false;
                        }
                    }
                }
                SsdMethod::Tcp => {
                    let s = loopback_s(bytes, o.piece as usize, None)?;
                    eprintln!("{label}: loopback TCP {:.2} GB/s", gb / s);
                    got[i].push(gb / s);
                }
                SsdMethod::TcpDisk => {
                    std::fs::create_dir_all(&disk_dir)
                        .ctx(|| format!("creating {}", disk_dir.display()))?;
                    let file = disk_dir.join("loopback.dat");
                    let s =
                        loopback_s(bytes, o.piece as usize, Some((&file, o.fio_sync_mib << 20)))?;
                    let _ = std::fs::remove_file(&file);
                    eprintln!("{label}: loopback TCP into the disk {:.2} GB/s", gb / s);
                    got[i].push(gb / s);
                }
                SsdMethod::RawClient => {
                    let Some(rig) = rig.as_deref_mut() else {
                        continue;
                    };
                    let run = raw_client_run(rig, bytes, &format!("bench-raw/r{rep}.dat"))?;
                    eprintln!(
                        "{label}: raw client to the server {:.2} GB/s (server CPU {:.2} s)",
                        gb / run.s,
                        run.server_cpu_s
                    );
                    got[i].push(gb / run.s);
                    r.raw_server_cpu_s.push(run.server_cpu_s);
                    // Its drain must not overlap the next measurement.
                    rig.wait_drained(Duration::from_secs(600))?;
                }
                SsdMethod::Stream => {
                    let Some(rig) = rig.as_deref_mut() else {
                        continue;
                    };
                    let tag = format!("stream-r{rep}");
                    let x = throughput_point(o, p, rig, datafile, 1, total, &tag)?;
                    eprintln!(
                        "{label}: one stream {:.2} GB/s to staged ({:.2} s; written after {:.2} s)",
                        gb / x.staged_s,
                        x.staged_s,
                        x.written_s
                    );
                    stream.push(x);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&disk_dir);
    let names: [(&str, String); 10] = [
        (
            "memcpy",
            "memcpy into a pre-faulted private buffer (one thread)".into(),
        ),
        (
            "tmpfs",
            format!(
                "write(2) in {} pieces into a new file in /dev/shm, close",
                size_str(o.piece)
            ),
        ),
        (
            "disk write+fsync",
            format!(
                "write(2) in {} pieces into a new file in the arena directory, fsync, close",
                size_str(o.piece)
            ),
        ),
        (
            "fio end_fsync",
            "fio, buffered sequential 1 MiB writes, fsync at the end (--end_fsync=1)".into(),
        ),
        (
            "fio fdatasync/256MiB",
            format!(
                "fio, buffered sequential 1 MiB writes, fdatasync every {} MiB and fsync at the \
                 end (--fdatasync={} --end_fsync=1): the server's Sync rhythm",
                o.fio_sync_mib, o.fio_sync_mib
            ),
        ),
        (
            "fio O_DIRECT",
            "fio, sequential 1 MiB O_DIRECT writes (--direct=1)".into(),
        ),
        (
            "loopback TCP",
            format!(
                "one TCP connection on 127.0.0.1, {} writes, the receiver reads into a 16 MiB \
                 buffer and discards",
                size_str(o.piece)
            ),
        ),
        (
            "loopback TCP → disk",
            format!(
                "the same, the receiver writes into a file in the arena directory, fdatasync \
                 every {} MiB and at the end: the server's data path without framing, checks \
                 and index",
                o.fio_sync_mib
            ),
        ),
        (
            "raw client → server",
            "a client in the bench process (no agent, no node store) sends the bytes from \
             memory as one file in 8 MiB Write frames to the stream's server, then Sync: first \
             Write until SyncOk"
                .into(),
        ),
        ("", String::new()),
    ];
    for (i, (name, what)) in names.iter().enumerate() {
        if !name.is_empty() && !got[i].is_empty() {
            r.baselines.push(Baseline {
                name: name.to_string(),
                what: what.clone(),
                gbps: Stats::of(&got[i]),
            });
        }
    }
    if !stream.is_empty() {
        r.stream = Some(tp_row(1, 1, total, &stream));
    }
    Ok(())
}

/// Bytes of the untimed warm-up each rig gets first (connections, arenas, the agent's page
/// tables, the first drain).
const WARMUP: u64 = 64 * MIB;

/// A throughput rig: `k` servers on loopback, draining to a directory in /dev/shm, after one
/// untimed warm-up point.
fn tp_rig(o: &SOpts, p: &Programs, k: usize, datafile: &Path) -> Res<Rig> {
    let drain = o.drain_dir.join(format!("k{k}"));
    std::fs::create_dir_all(&drain).ctx(|| format!("creating {}", drain.display()))?;
    let servers: Vec<(String, PathBuf)> = (0..k)
        .map(|i| {
            (
                format!("127.0.0.1:{}", o.port_base as usize + 10 * k + i),
                o.arena_dir
                    .join(format!("{}-stage-k{k}-{i}", prefix(o.pid))),
            )
        })
        .collect();
    let mut rig = Rig::start(
        o,
        p,
        &format!("tp{k}"),
        o.total + 256 * MIB,
        &drain.display().to_string(),
        &servers,
        None,
    )?;
    throughput_point(o, p, &mut rig, datafile, 1, WARMUP.min(o.total), "warmup")
        .ctx(|| "warm-up")?;
    Ok(rig)
}

fn throughput_part(
    o: &SOpts,
    p: &Programs,
    rig: &mut Rig,
    k: usize,
    datafile: &Path,
    r: &mut SResults,
) -> Res<()> {
    let mut got: Vec<Vec<TpSample>> = vec![Vec::new(); o.procs.len()];
    for rep in 0..o.reps {
        for j in 0..o.procs.len() {
            let i = (rep + j) % o.procs.len();
            let n = o.procs[i];
            let tag = format!("tp-s{k}-p{n}-r{rep}");
            let x = throughput_point(o, p, rig, datafile, n, o.total, &tag)?;
            eprintln!(
                "  throughput rep {}/{} {k} server(s), {n} writer(s): {:.2} GB/s to staged ({:.2} s; written {:.2} s, files staged {:.2}..{:.2} s; absorbed {})",
                rep + 1,
                o.reps,
                o.total as f64 / 1e9 / x.staged_s,
                x.staged_s,
                x.written_s,
                x.first_file_s,
                x.last_file_s,
                x.absorbed
                    .iter()
                    .map(|&b| size_str(b))
                    .collect::<Vec<_>>()
                    .join(" + ")
            );
            got[i].push(x);
        }
    }
    for (i, xs) in got.iter().enumerate() {
        if !xs.is_empty() {
            r.throughput.push(tp_row(k, o.procs[i], o.total, xs));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CkMethodKind {
    S3,
    Staging,
    AgentS3,
}

fn checkpoint_part(
    o: &SOpts,
    p: &Programs,
    data: &[u8],
    datafile: &Path,
    r: &mut SResults,
) -> Res<()> {
    let Some(url) = o.url.clone() else {
        r.notes.push(
            "checkpoint part not run: no S3 store (bench/netns-s3.sh up; eval \"$(bench/netns-s3.sh \
             env)\"; or bench/run.sh --suite staging)"
                .into(),
        );
        return Ok(());
    };
    if !Path::new(&format!("/run/netns/{}", o.stage_netns)).exists() {
        r.notes.push(format!(
            "checkpoint part not run: no network namespace {} (bench/netns-staging.sh up)",
            o.stage_netns
        ));
        return Ok(());
    }
    eprintln!("links: TCP goodput to the staging namespace and to the S3 namespace");
    let stage_ip = o
        .stage_ip
        .parse()
        .map_err(|_| "no address to test".to_string());
    let (bytes, reps) = (o.linktest_bytes, o.reps);
    let (netns, dev) = (&o.stage_netns, &o.stage_link_dev);
    let name = "node → staging server";
    r.links
        .push(measure_link(name, netns, dev, stage_ip, data, bytes, reps));
    let s3_ip = net::endpoint_ip(&url).map_err(|e| e.0);
    let name = "node or staging server → S3";
    r.links.push(measure_link(
        name,
        &o.netns,
        &o.link_dev,
        s3_ip,
        data,
        bytes,
        reps,
    ));
    let nominal = r.links[1].nominal_bytes_per_s;
    let durable = DurableStore::open(&url).ctx(|| "opening the S3 store")?;
    let max = o.sizes.iter().copied().max().unwrap_or(0);
    let capacity = max + 256 * MIB;
    let server = (
        format!("{}:{}", o.stage_ip, o.port_base as usize + 100),
        o.arena_dir.join(format!("{}-stage-ck", prefix(o.pid))),
    );
    let mut stg = match Rig::start(
        o,
        p,
        "ckstg",
        capacity,
        &url,
        &[server],
        Some(&o.stage_netns),
    ) {
        Ok(x) => Some(x),
        Err(e) => {
            r.notes
                .push(format!("cascade with staging not measured: {e}"));
            None
        }
    };
    let mut s3 = match Rig::start(o, p, "cks3", capacity, &url, &[], None) {
        Ok(x) => Some(x),
        Err(e) => {
            r.notes
                .push(format!("cascade without staging not measured: {e}"));
            None
        }
    };
    // An untimed warm-up checkpoint through each rig.
    for (slot, what) in [(&mut stg, "staging"), (&mut s3, "agent → S3")] {
        let Some(rig) = slot.as_mut() else { continue };
        let name = format!(
            "{}-warmup-{}",
            prefix(o.pid),
            rig.store.rsplit('-').next().unwrap_or("x")
        );
        let size = WARMUP.min(max);
        if let Err(e) = checkpoint_cascade(
            o,
            p,
            rig,
            &durable,
            datafile,
            size,
            &name,
            r.wait_staged_cli,
        ) {
            r.notes.push(format!(
                "cascade ({what}) not measured: warm-up failed: {e}"
            ));
            *slot = None;
        }
    }
    let methods = [
        CkMethodKind::S3,
        CkMethodKind::Staging,
        CkMethodKind::AgentS3,
    ];
    let mut s3_s: Vec<Vec<f64>> = vec![Vec::new(); o.sizes.len()];
    let mut s3_wire: Vec<Vec<f64>> = vec![Vec::new(); o.sizes.len()];
    let mut with: Vec<Vec<CkSample>> = vec![Vec::new(); o.sizes.len()];
    let mut without: Vec<Vec<CkSample>> = vec![Vec::new(); o.sizes.len()];
    let mut n = 0usize;
    for rep in 0..o.reps {
        for (si, &size) in o.sizes.iter().enumerate() {
            for k in 0..methods.len() {
                let label = format!("  checkpoint rep {}/{} {}", rep + 1, o.reps, size_str(size));
                match methods[(rep + k) % methods.len()] {
                    CkMethodKind::S3 => {
                        let name = format!("{}-direct-{}", prefix(o.pid), size / MIB);
                        let (s, wire) = baselines::direct_s3(
                            &durable,
                            &data[..size as usize],
                            &name,
                            &o.link_dev,
                        )?;
                        eprintln!("{label}: direct-s3 stall {s:.2} s");
                        s3_s[si].push(s);
                        s3_wire[si].extend(wire);
                    }
                    kind => {
                        let (slot, out, what) = if kind == CkMethodKind::Staging {
                            (&mut stg, &mut with[si], "staging")
                        } else {
                            (&mut s3, &mut without[si], "agent → S3")
                        };
                        let Some(rig) = slot.as_mut() else { continue };
                        n += 1;
                        let name = format!("{}-ck{n:03}", prefix(o.pid));
                        match checkpoint_cascade(
                            o,
                            p,
                            rig,
                            &durable,
                            datafile,
                            size,
                            &name,
                            r.wait_staged_cli,
                        ) {
                            Ok(x) => {
                                eprintln!(
                                    "{label}: cascade ({what}) stall {:.2} s, staged after {:.2} s, durable after {:.2} s",
                                    x.stall, x.staged, x.durable
                                );
                                out.push(x);
                            }
                            Err(e) => {
                                eprintln!("cascade ({what}): {e}; not measured from here");
                                r.notes.push(format!(
                                    "cascade ({what}) failed at {label}: {e}",
                                    label = label.trim()
                                ));
                                *slot = None;
                            }
                        }
                    }
                }
            }
        }
    }
    for rig in [stg.take(), s3.take()].into_iter().flatten() {
        let mut rig = rig;
        if let Err(e) = rig.stop() {
            r.notes.push(format!("stopping a rig: {e}"));
        }
    }
    for (si, &bytes) in o.sizes.iter().enumerate() {
        r.checkpoint.push(CkRow {
            bytes,
            direct_s3_s: stats_opt(&s3_s[si]),
            direct_s3_wire_s: stats_opt(&s3_wire[si]),
            staging: ck_method(&with[si]),
            agent_s3: ck_method(&without[si]),
            link_min_nominal_s: nominal.map(|b| bytes as f64 / b),
        });
    }
    Ok(())
}

fn run_all(o: &SOpts, data: &[u8], datafile: &Path, r: &mut SResults) -> Res<()> {
    let p = Programs::prepare(o)?;
    r.wait_staged_cli = p.wait_knows_staged();
    let ssd = o.parts.contains(&Part::Ssd);
    let tp = o.parts.contains(&Part::Throughput);
    let mut ks: Vec<usize> = if tp { o.servers.clone() } else { Vec::new() };
    if ssd && !ks.contains(&1) {
        ks.push(1);
    }
    ks.sort_unstable();
    ks.dedup();
    if ssd && ks.is_empty() {
        ks.push(1);
    }
    for k in ks {
        eprintln!("rig: {k} staging server(s) on loopback");
        let mut rig = match tp_rig(o, &p, k, datafile) {
            Ok(x) => Some(x),
            Err(e) => {
                eprintln!("rig with {k} server(s): {e}");
                r.notes
                    .push(format!("rig with {k} staging server(s) did not start: {e}"));
                None
            }
        };
        if ssd && k == 1 {
            if let Err(e) = ssd_part(o, &p, rig.as_mut(), data, datafile, r) {
                eprintln!("ssd part: {e}");
                r.notes.push(format!("ssd part failed: {e}"));
            }
        }
        if tp && o.servers.contains(&k) {
            if let Some(rig) = rig.as_mut() {
                if let Err(e) = throughput_part(o, &p, rig, k, datafile, r) {
                    eprintln!("throughput with {k} server(s): {e}");
                    r.notes
                        .push(format!("throughput with {k} server(s) failed: {e}"));
                }
            }
        }
        if let Some(mut rig) = rig {
            if let Err(e) = rig.stop() {
                r.notes
                    .push(format!("stopping the rig with {k} server(s): {e}"));
            }
        }
    }
    if o.parts.contains(&Part::Checkpoint) {
        if let Err(e) = checkpoint_part(o, &p, data, datafile, r) {
            eprintln!("checkpoint part: {e}");
            r.notes.push(format!("checkpoint part failed: {e}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Report.

/// "1.23x" or "n/a".
fn ratio(a: f64, b: f64) -> String {
    crate::format::x(crate::format::ratio(a, b))
}

fn used(v: &[usize]) -> String {
    let mut u = v.to_vec();
    u.sort_unstable();
    u.dedup();
    u.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// Where one stream's time goes: each step adds a part of the path from the disk alone up to
/// the agent's stream, in seconds per GB (medians; the parts overlap in time on 2 cores, so a
/// difference is what the step costs the whole, not its own duration).
fn ingest_breakdown(r: &SResults, s: &mut Md) {
    let stream_absorb = r
        .stream
        .as_ref()
        .and_then(|t| t.absorb_gbps.as_ref().map(|x| x.median));
    let steps: [(&str, Option<f64>, &str); 5] = [
        (
            "fio fdatasync/256MiB",
            baseline(r, "fio fdatasync/256MiB").map(|b| b.gbps.median),
            "the disk, buffered, in the server's Sync rhythm",
        ),
        (
            "loopback TCP",
            baseline(r, "loopback TCP").map(|b| b.gbps.median),
            "TCP on 127.0.0.1 alone: two copies (into and out of the socket) and the stack",
        ),
        (
            "loopback TCP → disk",
            baseline(r, "loopback TCP → disk").map(|b| b.gbps.median),
            "TCP and the disk together: the copy into the page cache, writeback and fdatasync \
             share the 2 cores with the TCP copies",
        ),
        (
            "raw client → server",
            baseline(r, "raw client → server").map(|b| b.gbps.median),
            "the server: framing, the receive-buffer pool, the hand-off to the IO thread and \
             its disk writers, the O_DIRECT writes into the arena (up to 4 in flight, \
             overlapping the receive; buffered where the file system refuses O_DIRECT), \
             CRC32C per extent, the frames kept for the drain, the index record and the \
             group commit",
        ),
        (
            "one stream, server absorb",
            stream_absorb,
            "the agent: reading the node store, BLAKE3 on a second thread and sendmsg from the \
             mapped blocks, on the same 2 cores",
        ),
    ];
    if steps.iter().filter(|(_, v, _)| v.is_some()).count() < 2 {
        return;
    }
    s.title("Server ingest: where one stream's time goes".into());
    s.head("| step | GB/s | s per GB | added s per GB | what the step adds |");
    let mut prev: Option<f64> = None;
    for (i, (name, v, what)) in steps.iter().enumerate() {
        let Some(g) = v else {
            s.row(format!("| {name} | n/a | n/a | n/a | {what} |"));
            continue;
        };
        let per = 1.0 / g;
        // TCP alone is a part of its own, not a step on the disk.
        let added = match (i, prev) {
            (1, _) | (_, None) => "".to_string(),
            (_, Some(p)) => format!("{:+.3}", per - p),
        };
        s.row(format!("| {name} | {g:.2} | {per:.3} | {added} | {what} |"));
        if i != 1 {
            prev = Some(per);
        }
    }
    if !r.raw_server_cpu_s.is_empty() {
        let cpu = Stats::of(&r.raw_server_cpu_s);
        s.verdict(format!(
            "Server CPU per raw client run: {} s (user + system; the run's bytes are the \
             stream's).",
            st(&cpu)
        ));
    }
    let best_fio = ["fio fdatasync/256MiB", "fio O_DIRECT", "fio end_fsync"]
        .iter()
        .filter_map(|n| baseline(r, n).map(|b| b.gbps.median))
        .fold(f64::NAN, f64::max);
    if let Some(a) = stream_absorb.filter(|_| best_fio.is_finite()) {
        s.verdict(format!(
            "Target (issue 24, item 3): server absorb at least 0.8x the better fio figure \
             ({best_fio:.2} GB/s): one stream absorbs {a:.2} GB/s = {:.2}x{}.",
            a / best_fio,
            baseline(r, "raw client → server")
                .map(|b| format!(
                    "; from a raw client (no agent) {:.2} GB/s = {:.2}x",
                    b.gbps.median,
                    b.gbps.median / best_fio
                ))
                .unwrap_or_default()
        ));
        // Many streams, into one server and into several: the servers of this bench share
        // the 2 cores, so one that has drained its files competes with another still
        // receiving (separate machines would not).
        for (label, several) in [("one server", false), ("2 or more servers", true)] {
            let many: Vec<&TpRow> = r
                .throughput
                .iter()
                .filter(|t| t.procs > 1 && (t.servers > 1) == several)
                .collect();
            let absorbs = span(
                many.iter()
                    .filter_map(|t| t.absorb_gbps.as_ref().map(|x| x.median)),
            );
            let drain_shares = span(
                many.iter()
                    .map(|t| t.server_drain_cpu_s.median / t.server_cpu_s.median),
            );
            if let (Some((lo, hi)), Some((dl, dh))) = (absorbs, drain_shares) {
                s.verdict(format!(
                    "Many streams (2 or more writers), {label}: absorb {lo:.2}-{hi:.2} GB/s = \
                     {:.2}-{:.2}x; draining took {:.0}-{:.0} % of the servers' CPU meanwhile.",
                    lo / best_fio,
                    hi / best_fio,
                    dl * 100.0,
                    dh * 100.0
                ));
            }
        }
    }
}

fn baseline<'a>(r: &'a SResults, name: &str) -> Option<&'a Baseline> {
    r.baselines.iter().find(|b| b.name == name)
}

fn tables(rep: &Report) -> Md {
    let o = rep.options;
    let r = rep.results;
    let mut s = Md::default();
    for n in &r.notes {
        s.verdict(format!("not measured / failed: {n}"));
    }
    let fio_end = baseline(r, "fio end_fsync").map(|b| b.gbps.median);
    let disk = baseline(r, "disk write+fsync").map(|b| b.gbps.median);

    // Throughput.
    if !r.throughput.is_empty() {
        s.title("Staging throughput by writer processes and servers".to_string());
        let mut ks: Vec<usize> = r.throughput.iter().map(|t| t.servers).collect();
        ks.sort_unstable();
        ks.dedup();
        let mut head = vec!["writers × file".to_string()];
        head.extend(
            ks.iter()
                .map(|k| format!("{k} server{}, GB/s", if *k == 1 { "" } else { "s" })),
        );
        let mut t = Table::with_head("Staging throughput, GB/s to staged", &head);
        for &n in &o.procs {
            let mut cells = vec![format!("{n} × {}", size_str(o.total / n as u64))];
            for &k in &ks {
                let row = r.throughput.iter().find(|t| t.servers == k && t.procs == n);
                cells.push(row.map_or_else(|| "n/a".into(), |t| st(&t.gbps)));
            }
            t.row(cells);
        }
        s.push(t);
        let base11 = r
            .throughput
            .iter()
            .find(|t| t.servers == 1 && t.procs == 1)
            .map(|t| t.gbps.median);
        s.head("| servers | writers × file | GB/s to staged | s to staged | written, GB/s | after the last close, s | files staged first / last, s | absorb GB/s | absorb from, s | servers used | agent / servers CPU, s | of it draining, s | vs fio end_fsync | vs disk write+fsync | vs 1 writer, 1 server |");
        for t in &r.throughput {
            s.row(format!("| {} | {} × {} | {} | {} | {} | {} | {:.2} / {:.2} | {} | {} | {} | {:.2} / {:.2} | {:.2} | {} | {} | {} |", t.servers, t.procs, size_str(t.file_bytes), st(&t.gbps), st(&t.staged_s), st(&t.write_gbps), st(&t.after_close_s), t.first_file_s.median, t.last_file_s.median, st_opt_ref(&t.absorb_gbps), t.absorb_start_s
                    .as_ref()
                    .map_or_else(|| "n/a".into(), |x| format!("{:.2}", x.median)), used(&t.servers_used), t.agent_cpu_s.median, t.server_cpu_s.median, t.server_drain_cpu_s.median, fio_end.map_or_else(|| "n/a".into(), |b| ratio(t.gbps.median, b)), disk.map_or_else(|| "n/a".into(), |b| ratio(t.gbps.median, b)), base11.map_or_else(|| "n/a".into(), |b| ratio(t.gbps.median, b))));
        }
        let resent: Vec<String> = r
            .throughput
            .iter()
            .filter(|t| t.absorbed_ratio.iter().any(|&x| (x - 1.0).abs() > 0.001))
            .map(|t| {
                format!(
                    "{} server(s), {} writer(s): absorbed {} of the bytes",
                    t.servers,
                    t.procs,
                    t.absorbed_ratio
                        .iter()
                        .map(|x| format!("{x:.3}x"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
            .collect();
        if !resent.is_empty() {
            s.verdict(format!(
                "absorbed more than written (resent): {}",
                resent.join("; ")
            ));
        }
    }

    // SSD.
    if !r.baselines.is_empty() || r.stream.is_some() {
        s.title("Server SSD ingest vs the disk under the arenas".to_string());
        s.head("| method | GB/s | what |");
        for b in &r.baselines {
            s.row(format!("| {} | {} | {} |", b.name, st(&b.gbps), b.what));
        }
        if let Some(t) = &r.stream {
            s.row(format!("| **one stream, to staged** | {} | 1 writer, 1 server: first write until the file is staged (written at {:.2} GB/s; staged {:.2} s after its close) |", st(&t.gbps), t.write_gbps.median, t.after_close_s.median));
            s.row(format!("| **one stream, server absorb** | {} | the server's absorb window (from {:.2} s after the first write) |", st_opt_ref(&t.absorb_gbps), t.absorb_start_s.as_ref().map_or(f64::NAN, |x| x.median)));
            s.title("Server SSD ingest: one stream against the baselines".into());
            s.head("| one stream / | memcpy | tmpfs | disk write+fsync | fio end_fsync | fio fdatasync/256MiB | fio O_DIRECT |");
            for (label, v) in [
                ("to staged", Some(t.gbps.median)),
                ("server absorb", t.absorb_gbps.as_ref().map(|x| x.median)),
            ] {
                let Some(v) = v else { continue };
                let names = [
                    "memcpy",
                    "tmpfs",
                    "disk write+fsync",
                    "fio end_fsync",
                    "fio fdatasync/256MiB",
                    "fio O_DIRECT",
                ];
                let cells = names.map(|name| {
                    baseline(r, name).map_or_else(|| "n/a".into(), |b| ratio(v, b.gbps.median))
                });
                s.row(format!("| {label} | {} |", cells.join(" | ")));
            }
        }
        ingest_breakdown(r, &mut s);
    }

    // Checkpoint.
    if !r.checkpoint.is_empty() {
        s.title("Checkpoint time: staging vs a durable store behind 1 Gbit/s".to_string());
        let _stage_link = r.links.first();
        s.head("| checkpoint | direct-s3 stall, s (GB/s) | cascade + staging stall, s (GB/s) | stall ratio direct-s3 / cascade | staged (safe from node loss), s | safe: direct-s3 / staging | durable with staging, s | cascade agent → S3: stall, s | agent → S3: durable (= safe), s | safe: agent → S3 / staging | durable: staging / agent → S3 | link minimum, s |");
        for row in &r.checkpoint {
            let b = row.bytes;
            let s3 = row.direct_s3_s.as_ref();
            let stg = row.staging.as_ref();
            let a3 = row.agent_s3.as_ref();
            let na = || "n/a".to_string();
            s.row(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                size_str(b),
                s3.map_or_else(na, |x| secs_gbps(x, b)),
                stg.map_or_else(na, |x| secs_gbps(&x.stall_s, b)),
                match (s3, stg) {
                    (Some(a), Some(c)) => format!("**{}**", ratio(a.median, c.stall_s.median)),
                    _ => na(),
                },
                stg.map_or_else(na, |x| st(&x.staged_s)),
                match (s3, stg) {
                    (Some(a), Some(c)) => ratio(a.median, c.staged_s.median),
                    _ => na(),
                },
                stg.map_or_else(na, |x| st(&x.durable_s)),
                a3.map_or_else(na, |x| st(&x.stall_s)),
                a3.map_or_else(na, |x| st(&x.durable_s)),
                match (a3, stg) {
                    (Some(a), Some(c)) => ratio(a.durable_s.median, c.staged_s.median),
                    _ => na(),
                },
                match (a3, stg) {
                    (Some(a), Some(c)) => ratio(c.durable_s.median, a.durable_s.median),
                    _ => na(),
                },
                row.link_min_nominal_s
                    .map_or_else(na, |x| format!("{x:.2}"))
            ));
        }
        s.title("Checkpoint time: the parts, per method".into());
        s.head("| checkpoint | method | write + close, s | commit, s | staged (store), s | `cascade wait --level staged` returned, s | on the wire from, s | on the wire until, s | marker written, s | marker − on the wire until, s | durable (store), s | `cascade wait --level durable` returned, s |");
        for row in &r.checkpoint {
            if let Some(x) = &row.direct_s3_s {
                s.row(format!("| {} | direct-s3 | n/a | n/a | n/a | n/a | n/a | {} | n/a | {} | {} (the stall) | n/a |", size_str(row.bytes), st_opt_ref(&row.direct_s3_wire_s), row.direct_s3_wire_s.as_ref().map_or_else(
                        || "n/a".into(),
                        |w| format!("{:.2} (stall − wire)", x.median - w.median)
                    ), st(x)));
            }
            for (label, m) in [("staging", &row.staging), ("agent → S3", &row.agent_s3)] {
                let Some(m) = m else { continue };
                s.row(format!(
                    "| {} | {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    size_str(row.bytes),
                    st(&m.write_s),
                    st(&m.commit_s),
                    st(&m.staged_s),
                    st_opt_ref(&m.wait_staged_s),
                    st_opt_ref(&m.wire_start_s),
                    st_opt_ref(&m.wire_end_s),
                    st_opt_ref(&m.marker_s),
                    match (&m.marker_s, &m.wire_end_s) {
                        (Some(a), Some(b)) => format!("{:.2}", a.median - b.median),
                        _ => "n/a".into(),
                    },
                    st(&m.durable_s),
                    st_opt_ref(&m.wait_durable_s)
                ));
            }
        }
    }

    if !r.links.is_empty() {
        s.push(net::links_table(&r.links));
    }

    let disk_fs = util::fs_of(&o.arena_dir);
    let durable = o.durable.clone().unwrap_or_else(|| "none".into());
    s.push(machine_table(
        &rep.header,
        vec![
            (
                format!("arena directory ({})", o.arena_dir.display()),
                disk_fs,
            ),
            ("fio".into(), rep.fio.clone()),
            ("cascade CLI".into(), rep.cascade_cli.clone()),
            ("preload library".into(), rep.library.clone()),
            (
                "durable store (checkpoint part)".into(),
                format!("{durable} ({})", rep.s3_server),
            ),
            (
                "CPU of the S3 server (not counted below)".into(),
                format!("{} % of all cores", num(rep.header.s3_server_cpu_pct, 1)),
            ),
        ],
    ));
    s
}

pub fn run(mut o: SOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve(pid)?;
    let dirs = vec![PathBuf::from("/var/tmp"), o.arena_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs.clone(), &o.out)?;
    let clock = RunClock::start(&o.arena_dir, &o.arena_dir);
    eprintln!("cascade-bench staging: parts {:?}", o.parts);
    // The data, once: a /dev/shm file the C writers map, non-zero xorshift (not compressible).
    let max = o
        .sizes
        .iter()
        .copied()
        .chain([o.total])
        .max()
        .unwrap_or(o.total);
    let datafile = PathBuf::from(format!("/dev/shm/{}-data", prefix(pid)));
    let map = data_file(&datafile, max, 0x57a9_1e5e_bead_f00d)?;
    let mut results = SResults::default();
    let outcome = run_all(&o, &map, &datafile, &mut results);
    drop(map);
    if let Err(e) = &outcome {
        results.notes.push(format!("the run stopped: {e}"));
    }
    let rep = Report {
        suite: "staging",
        header: clock.finish(&[
            "crates/cascade-staging",
            "crates/cascade-agent",
            "crates/cascade-cli",
            "crates/cascade-store",
            "crates/cascade-preload",
            "crates/cascade-durable",
            "bench",
        ]),
        cascade_cli: report::describe(&o.cascade),
        library: report::describe(&o.cascade.with_file_name("libcascade.so")),
        fio: tool_version(&o.fio, &["--version"]),
        s3_server: if o.url.is_some() {
            s3_server()
        } else {
            "not used".into()
        },
        options: &o,
        results: &results,
    };
    let title = "Cascade staging servers (L1): benchmarks";
    report::write(&o.out, "staging", title, &rep, tables(&rep))?;
    outcome?;
    if !results.notes.is_empty() {
        return err(format!(
            "some measurements failed or did not run: {}",
            results.notes.join("; ")
        ));
    }
    Ok(())
}

fn st_opt_ref(s: &Option<Stats>) -> String {
    crate::format::st_opt(s.as_ref())
}

/// The smallest and largest finite value, if any.
fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|x| x.is_finite())
        .fold(None, |acc, x| match acc {
            None => Some((x, x)),
            Some((lo, hi)) => Some((f64::min(lo, x), f64::max(hi, x))),
        })
}

/// Paths below `dir` (for a warning).
fn walkdir_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path.clone());
            }
            out.push(path.display().to_string());
        }
    }
    out
}
