//! `cascade-bench jobs`: the time to a complete checkpoint of a job on 1, 2 and 4 simulated
//! nodes with 1 and 2 ranks per node (issue 19), against the ranks writing straight to the
//! durable store, over the shaped link of the durable suite (bench/netns-s3.sh: versitygw in a
//! network namespace behind `tc tbf`, 1 Gbit/s each way). Writes jobs.md and jobs.json. See
//! bench/README.md, "The jobs benchmark".
//!
//! Per configuration and repetition, the methods in turn (which goes first rotates), each
//! after `sync` and a wait for an idle machine, all with the same bytes per rank (slices of a
//! non-zero xorshift pattern in one /dev/shm file):
//! - direct: one thread per rank, each with its own durable-store client, PUTs its file into
//!   the throttled S3 store; once all are in, a small marker object (what rank 0 of an MPI
//!   job would write after a barrier). Its stall is its time until durable.
//! - job: per simulated node a node store of its own (CASCADE_STORE), its `cascade agent`,
//!   CASCADE_JOB, CASCADE_JOB_NAME, CASCADE_NODE and CASCADE_JOB_NODES set; per rank one
//!   `cascade run -- ckptwriter relay` (bench/ckptwriter.c) writing `/cascade/ckptNNN/rank.R`
//!   with write(2).
//!   When all ranks of a node have closed their files, its lowest rank runs `cascade commit
//!   /ckptNNN` (the bench relays the node's barrier through the ranks' pipes). The stall is
//!   from the common start until the last node's commit returned; the checkpoint is complete
//!   when the job marker `<namespace>/ckptNNN/.cascade-complete` appears in the server's data
//!   directory (polled every millisecond: no request over the link).
//! - independent: the same nodes without CASCADE_JOB, each writing its own checkpoint
//!   `/ckptNNN-nodeK` (its own marker, nobody waits for the other nodes): until the last
//!   node's marker. job - independent is what the job-wide completion costs.

use crate::baselines::{clear_remote, data_file, settle, WRITER_C};
use crate::format::{num, ratio, st, x};
use crate::net::{s3_server, tbf_of};
use crate::procs::{compile, die_with_bench, private_cli, tail, terminate, Node};
use crate::report::{self, machine_table, Header, Md, RunClock, Target};
use crate::util::{
    self, check_mount, err, now_ns, prefix, require_s3_url, size_str, store_name, Context, Res,
    Stats, MIB,
};
use cascade_durable::{DurableStore, Spec};
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Target (issue 19): the job-wide completion costs less than this share of the time until
/// durable, over N independent single-node checkpoints.
const TARGET_PCT: f64 = 5.0;

/// The options (`cascade-bench jobs --help`); the fields without an `arg` are derived by
/// [`JOpts::resolve`]. Serialized into jobs.json without credentials.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct JOpts {
    /// Directory for jobs.md and jobs.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: 16 MiB per rank, 1 repetition. Explicit flags override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Bytes each rank writes, in MiB.
    #[arg(long, default_value_t = 64, default_value_if("quick", "true", "16"))]
    #[serde(skip)]
    size_mib: u64,
    /// Simulated node counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    nodes: Vec<usize>,
    /// Ranks per node.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    ranks: Vec<usize>,
    /// Repetitions of each measurement; tables show the median.
    #[arg(long, default_value_t = 5, default_value_if("quick", "true", "1"))]
    reps: usize,
    /// The throttled durable store (`bench/netns-s3.sh up` prints it; `env` exports it); its
    /// credentials are never written out.
    #[arg(
        long,
        env = "CASCADE_BENCH_S3_URL",
        hide_env_values = true,
        default_value = ""
    )]
    #[serde(skip)]
    url: String,
    /// Network namespace of the S3 server.
    #[arg(long, env = "CASCADE_BENCH_NETNS", default_value = "cascade-s3")]
    netns: String,
    /// Host end of the shaped link, whose tbf rate is the nominal rate.
    #[arg(long, env = "CASCADE_BENCH_LINK_DEV", default_value = "cs3-host")]
    link_dev: String,
    /// The S3 server's data directory (bench/netns-s3.sh), where the markers are watched for;
    /// without it they are polled over the link every 20 ms.
    #[arg(
        long,
        env = "CASCADE_S3_DATA",
        default_value = "/var/tmp/cascade-s3-data"
    )]
    #[serde(skip)]
    s3_data: PathBuf,
    /// The cascade CLI (its libcascade.so next to it).
    #[arg(long, default_value = "target/release/cascade")]
    cascade: PathBuf,
    /// The C compiler for the rank program.
    #[arg(long, default_value = "cc")]
    cc: String,
    /// Mount prefix of the stores under `cascade run`.
    #[arg(long, default_value = "/cascade")]
    mount: String,
    /// Bytes per write(2) call of the ranks, in MiB.
    #[arg(long, default_value_t = 8)]
    #[serde(skip)]
    piece_mib: u64,
    /// Seconds a measurement may take until its markers exist.
    #[arg(long = "timeout", default_value_t = 600)]
    timeout_s: u64,
    #[arg(skip)]
    #[serde(skip)]
    pid: u32,
    /// The durable store without credentials.
    #[arg(skip)]
    durable: String,
    #[arg(skip)]
    bytes_per_rank: u64,
    /// Where the markers are watched: the server's data directory of the bucket, or None
    /// (polled over the link).
    #[arg(skip)]
    marker_dir: Option<PathBuf>,
    /// Memory of each node store: twice its ranks' data plus 64 MiB; no spill file.
    #[arg(skip)]
    capacity_per_rank: u64,
    #[arg(skip)]
    piece: u64,
}

impl JOpts {
    /// Checks the options, that the shaped link is up, and derives the byte sizes and where
    /// the markers are watched.
    fn resolve(&mut self, pid: u32) -> Res<()> {
        self.bytes_per_rank = self.size_mib * MIB;
        if self.bytes_per_rank == 0 || self.piece_mib == 0 || self.reps == 0 {
            return err("--size-mib, --piece-mib and --reps must be positive");
        }
        let no_count = |v: &[usize]| v.is_empty() || v.contains(&0);
        if no_count(&self.nodes) || no_count(&self.ranks) {
            return err("--nodes and --ranks need positive counts");
        }
        check_mount(&self.mount)?;
        require_s3_url(&self.url, "jobs")?;
        if !Path::new("/run/netns").join(&self.netns).exists() {
            return err(format!(
                "network namespace {} is not up: the jobs suite needs the shaped link of \
                 bench/netns-s3.sh (root; bench/run.sh --suite jobs brings it up)",
                self.netns
            ));
        }
        let spec = Spec::parse(&self.url).ctx(|| "--url")?;
        self.marker_dir = match &spec {
            Spec::S3(s3) => {
                Some(self.s3_data.join(&s3.bucket).join(&s3.prefix)).filter(|dir| dir.is_dir())
            }
            _ => None,
        };
        self.durable = spec.describe();
        self.pid = pid;
        self.mount = self.mount.trim_end_matches('/').to_string();
        self.capacity_per_rank = 2 * self.bytes_per_rank;
        self.piece = self.piece_mib * MIB;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Direct,
    Job,
    Independent,
}

/// One measurement, seconds from the common start.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Until every rank closed its file (direct: until every PUT returned).
    written: f64,
    /// What the application waits for: until the last node's commit returned (direct: the
    /// marker object written).
    stall: f64,
    /// Until the last marker existed in the durable store.
    until_marker: f64,
}

/// Everything of one run the measurements share.
struct Bench<'a> {
    o: &'a JOpts,
    bin: PathBuf,
    writer: PathBuf,
    datafile: PathBuf,
    data: &'a [u8],
    durable: DurableStore,
}

/// The ranks of one measurement: `cascade run` processes, killed if still running when
/// dropped.
struct Ranks {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    logs: Vec<PathBuf>,
}

impl Ranks {
    fn say(&mut self, g: usize, what: &str) -> Res<()> {
        if let Some(s) = self.stdins[g].as_mut() {
            s.write_all(what.as_bytes())
                .and_then(|()| s.flush())
                .ctx(|| format!("telling rank {g} {}", what.trim()))?;
        }
        if what != "GO\n" {
            // The rank's last instruction: EOF after it.
            self.stdins[g] = None;
        }
        Ok(())
    }

    /// An error naming the first rank that has exited unsuccessfully, with its log.
    fn failed(&mut self) -> Res<()> {
        for (g, c) in self.children.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                if !status.success() {
                    return err(format!(
                        "rank {g} (cascade run -- ckptwriter relay) exited ({status}): {}",
                        tail(&self.logs[g], 5)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Waits for every rank to end (the end of `cascade run` on a node), `secs` at most.
    fn finish(&mut self, secs: u64) -> Res<()> {
        self.stdins.iter_mut().for_each(|s| *s = None);
        let deadline = Instant::now() + Duration::from_secs(secs);
        for g in 0..self.children.len() {
            loop {
                match self.children[g].try_wait().ctx(|| "waiting for a rank")? {
                    Some(status) if status.success() => break,
                    Some(status) => {
                        return err(format!(
                            "rank {g} exited ({status}): {}",
                            tail(&self.logs[g], 5)
                        ))
                    }
                    None if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    None => return err(format!("rank {g} did not end within {secs} s")),
                }
            }
        }
        Ok(())
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        self.stdins.clear();
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = terminate(c, "cascade run", 10);
            }
        }
        for log in &self.logs {
            let _ = std::fs::remove_file(log);
        }
    }
}

impl Bench<'_> {
    /// The ranks writing straight to the durable store: one client and one thread per rank,
    /// released together; then the marker object.
    fn direct(&self, nodes: usize, ranks: usize, n: usize) -> Res<Sample> {
        let o = self.o;
        let total = nodes * ranks;
        let base = format!("{}-direct{n:03}", prefix(o.pid));
        clear_remote(&self.durable, &base)?;
        let clients = (0..total)
            .map(|_| DurableStore::open(&o.url).ctx(|| "opening the durable store"))
            .collect::<Res<Vec<_>>>()?;
        let size = o.bytes_per_rank as usize;
        let bufs: Vec<bytes::Bytes> = (0..total)
            .map(|g| bytes::Bytes::copy_from_slice(&self.data[g * size..(g + 1) * size]))
            .collect();
        settle();
        let barrier = std::sync::Barrier::new(total + 1);
        let (t0, ends) = std::thread::scope(|s| {
            let handles: Vec<_> = clients
                .iter()
                .zip(bufs)
                .enumerate()
                .map(|(g, (c, buf))| {
                    let (barrier, key) = (&barrier, format!("{base}/rank.{g}"));
                    s.spawn(move || {
                        barrier.wait();
                        let r = c.put_buffers(&key, vec![buf]);
                        r.map(|()| now_ns()).ctx(|| format!("direct: PUT of {key}"))
                    })
                })
                .collect();
            barrier.wait();
            let t0 = now_ns();
            let ends: Vec<Res<u64>> = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| err("an upload thread panicked"))
                })
                .collect();
            (t0, ends)
        });
        let ends = ends.into_iter().collect::<Res<Vec<u64>>>()?;
        let written = ends.iter().copied().max().unwrap_or(t0);
        let list: Vec<String> = (0..total).map(|g| format!("rank.{g}")).collect();
        let marker = serde_json::json!({ "files": list }).to_string();
        self.durable
            .put_bytes(&format!("{base}/.complete"), marker.as_bytes())
            .ctx(|| "direct: writing the marker")?;
        let done = now_ns();
        clear_remote(&self.durable, &base)?;
        let s = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
        Ok(Sample {
            written: s(written),
            stall: s(done),
            until_marker: s(done),
        })
    }

    /// Whether the marker of checkpoint `key` (relative to the durable URL) exists.
    fn marker_exists(&self, key: &str) -> bool {
        match &self.o.marker_dir {
            Some(dir) => dir.join(key).join(".cascade-complete").exists(),
            None => self
                .durable
                .size(&format!("{key}/.cascade-complete"))
                .is_ok(),
        }
    }

    /// The simulated nodes: a store and an agent each, as a job or independent.
    fn start_nodes(&self, nodes: usize, ranks: usize, n: usize, job: bool) -> Res<Vec<Node>> {
        let o = self.o;
        let names: Vec<String> = (0..nodes).map(|k| format!("node{k}")).collect();
        let job_name = format!("{}-job{n:03}", prefix(o.pid));
        let capacity = (ranks as u64 * o.capacity_per_rank + 64 * MIB).to_string();
        let mut started = Vec::new();
        for (k, name) in names.iter().enumerate() {
            let mut env = vec![
                ("CASCADE_STORE", store_name(o.pid, &format!("node{k}"))),
                ("CASCADE_DURABLE", o.url.clone()),
                ("CASCADE_CAPACITY", capacity.clone()),
                ("CASCADE_SPILL_SIZE", "0".into()),
                ("CASCADE_MOUNT", o.mount.clone()),
            ];
            if job {
                env.push(("CASCADE_JOB", job_name.clone()));
                env.push(("CASCADE_JOB_NAME", job_name.clone()));
                env.push(("CASCADE_NODE", name.clone()));
                env.push(("CASCADE_JOB_NODES", names.join(",")));
            }
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut node = Node::init(&self.bin, &env, &[])?;
            node.agent_log =
                Path::new("/var/tmp").join(format!("{}-agent-{name}.log", prefix(o.pid)));
            node.start_agent(&[], &[])?;
            started.push(node);
        }
        Ok(started)
    }

    /// The job's namespace in the durable store as the node sees it (`cascade config`).
    fn namespace(node: &Node) -> Res<String> {
        let text = node.run_ok(&["config", "--json"])?;
        let v: serde_json::Value =
            serde_json::from_str(&text).ctx(|| "parsing `cascade config --json`")?;
        Ok(v["namespace"]["value"].as_str().unwrap_or("").to_string())
    }

    /// One checkpoint written through Cascade by `nodes` x `ranks` ranks, as one job or as
    /// independent single-node checkpoints.
    fn cascade(&self, nodes: usize, ranks: usize, n: usize, job: bool) -> Res<Sample> {
        let mut started = self.start_nodes(nodes, ranks, n, job)?;
        let r = self.cascade_on(&mut started, ranks, n, job);
        for node in &mut started {
            if let Err(e) = node.stop() {
                eprintln!("  warning: {e}");
            }
        }
        r
    }

    fn cascade_on(&self, started: &mut [Node], ranks: usize, n: usize, job: bool) -> Res<Sample> {
        let o = self.o;
        let nodes = started.len();
        let ns = Self::namespace(&started[0])?;
        let ckpt_of = |k: usize| {
            if job {
                format!("ckpt{n:03}")
            } else {
                format!("ckpt{n:03}-node{k}")
            }
        };
        let key_of = |k: usize| {
            if ns.is_empty() {
                ckpt_of(k)
            } else {
                format!("{ns}/{}", ckpt_of(k))
            }
        };
        // The checkpoints whose markers count: one for the job, one per node otherwise.
        let keys: Vec<String> = if job {
            vec![key_of(0)]
        } else {
            (0..nodes).map(key_of).collect()
        };
        for key in &keys {
            clear_remote(&self.durable, key)?;
        }
        let (tx, rx) = mpsc::channel::<(usize, String, u64)>();
        let mut rs = Ranks {
            children: Vec::new(),
            stdins: Vec::new(),
            logs: Vec::new(),
        };
        for (k, node) in started.iter().enumerate() {
            let ckpt = ckpt_of(k);
            for r in 0..ranks {
                let g = k * ranks + r;
                let log = Path::new("/var/tmp").join(format!("{}-rank{g}.log", prefix(o.pid)));
                let logf =
                    std::fs::File::create(&log).ctx(|| format!("creating {}", log.display()))?;
                let mut cmd = node.cmd();
                cmd.arg("run")
                    .arg("--")
                    .arg(&self.writer)
                    .arg("relay")
                    .arg(format!("{}/{ckpt}/rank.{g}", o.mount))
                    .arg(o.bytes_per_rank.to_string())
                    .arg(o.piece.to_string())
                    .arg(&self.datafile)
                    .arg((g as u64 * o.bytes_per_rank).to_string())
                    .arg(&node.bin)
                    .arg(format!("/{ckpt}"))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(logf);
                die_with_bench(&mut cmd);
                let mut child = cmd
                    .spawn()
                    .ctx(|| "starting cascade run -- ckptwriter relay")?;
                let stdout = child.stdout.take();
                rs.stdins.push(child.stdin.take());
                rs.children.push(child);
                rs.logs.push(log);
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let Some(out) = stdout else { return };
                    for line in BufReader::new(out).lines() {
                        let Ok(line) = line else { break };
                        if tx.send((g, line, now_ns())).is_err() {
                            break;
                        }
                    }
                });
            }
        }
        drop(tx);
        let total = nodes * ranks;
        // Every rank set up (data mapped, store attached).
        let mut ready = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while ready < total {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok((_, line, _)) if line == "READY" => ready += 1,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    rs.failed()?;
                    if Instant::now() > deadline {
                        return err(format!("only {ready} of {total} ranks ready within 60 s"));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    rs.failed()?;
                    return err("the ranks ended before they were ready");
                }
            }
        }
        settle();
        let t0 = now_ns();
        for g in 0..total {
            rs.say(g, "GO\n")?;
        }
        let mut written_at = vec![None::<u64>; total];
        let mut committed_at = vec![None::<u64>; nodes];
        let mut marker_at = vec![None::<u64>; keys.len()];
        let poll = if o.marker_dir.is_some() {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(20)
        };
        let deadline = Instant::now() + Duration::from_secs(o.timeout_s);
        loop {
            while let Ok((g, line, at)) = rx.try_recv() {
                let mut words = line.split_whitespace();
                match words.next() {
                    Some("WRITTEN") => {
                        let end = words.nth(1).and_then(|w| w.parse().ok()).unwrap_or(at);
                        written_at[g] = Some(end);
                        let k = g / ranks;
                        let node_ranks = k * ranks..(k + 1) * ranks;
                        if node_ranks.clone().all(|h| written_at[h].is_some()) {
                            // The node's barrier: its lowest rank commits, the others end.
                            for h in node_ranks {
                                rs.say(h, if h == k * ranks { "COMMIT\n" } else { "EXIT\n" })?;
                            }
                        }
                    }
                    Some("COMMITTED") => {
                        let end = words.next().and_then(|w| w.parse().ok()).unwrap_or(at);
                        committed_at[g / ranks] = Some(end);
                    }
                    _ => {}
                }
            }
            for (i, key) in keys.iter().enumerate() {
                if marker_at[i].is_none() && self.marker_exists(key) {
                    marker_at[i] = Some(now_ns());
                }
            }
            if committed_at.iter().all(Option::is_some) && marker_at.iter().all(Option::is_some) {
                break;
            }
            rs.failed()?;
            if Instant::now() > deadline {
                return err(format!(
                    "markers of {} not all there within {} s ({} of {} nodes committed)",
                    keys.join(", "),
                    o.timeout_s,
                    committed_at.iter().flatten().count(),
                    nodes
                ));
            }
            std::thread::sleep(poll);
        }
        rs.finish(120)?;
        // The markers list every rank's file of their checkpoint.
        for key in &keys {
            let m = self
                .durable
                .read_marker(key)
                .ctx(|| format!("reading the marker of {key}"))?;
            let want = if job { total } else { ranks };
            let have = m.map_or(0, |m| {
                m.files
                    .iter()
                    .filter(|f| f.path.starts_with("rank."))
                    .count()
            });
            if have != want {
                return err(format!(
                    "the marker of {key} lists {have} rank files, not {want}"
                ));
            }
        }
        for key in &keys {
            clear_remote(&self.durable, key)?;
        }
        let last = |v: &[Option<u64>]| v.iter().flatten().copied().max().unwrap_or(t0);
        let s = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
        Ok(Sample {
            written: s(last(&written_at)),
            stall: s(last(&committed_at)),
            until_marker: s(last(&marker_at)),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Results and report.

#[derive(Debug, Clone, Serialize)]
pub struct MethodRow {
    /// Until every rank's file was closed (direct: uploaded).
    pub written_s: Stats,
    /// What the application waits for.
    pub stall_s: Stats,
    /// Until the (last) marker existed.
    pub until_marker_s: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigRow {
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub total_bytes: u64,
    pub direct: MethodRow,
    pub job: MethodRow,
    pub independent: MethodRow,
    /// total bytes / tbf rate.
    pub link_min_s: Option<f64>,
    /// (job - independent) / independent time until the marker, per cent, of the medians.
    pub job_cost_pct: Option<f64>,
    /// The same per repetition (both measured in the same repetition).
    pub job_cost_pct_per_rep: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    pub s3_server: String,
    pub cascade_cli: String,
    pub library: String,
    pub link: String,
    pub nominal_bytes_per_s: Option<f64>,
    pub options: &'a JOpts,
    pub targets: Vec<Target>,
    pub results: &'a [ConfigRow],
}

#[derive(Default)]
struct Samples {
    direct: Vec<Sample>,
    job: Vec<Sample>,
    independent: Vec<Sample>,
}

fn method_row(xs: &[Sample]) -> MethodRow {
    let col = |f: fn(&Sample) -> f64| Stats::of(&xs.iter().map(f).collect::<Vec<_>>());
    MethodRow {
        written_s: col(|s| s.written),
        stall_s: col(|s| s.stall),
        until_marker_s: col(|s| s.until_marker),
    }
}

fn config_label(c: &ConfigRow) -> String {
    format!("{} × {}", c.nodes, c.ranks_per_node)
}

fn cost_met(pct: Option<f64>) -> &'static str {
    match pct {
        Some(p) if p < TARGET_PCT => "**yes**",
        Some(_) => "**NO**",
        None => "n/a",
    }
}

fn tables(rows: &[ConfigRow]) -> Md {
    let mut s = Md::default();
    let multi: Vec<&ConfigRow> = rows.iter().filter(|c| c.nodes > 1).collect();
    let worst = multi
        .iter()
        .filter_map(|c| c.job_cost_pct.map(|p| (p, *c)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match worst {
        Some((p, c)) => s.verdict(format!(
            "Job-wide completion over N independent single-node checkpoints: at most {p:+.1} % \
             of the time until durable ({} nodes × {} ranks); target < {TARGET_PCT} %: **{}**.",
            c.nodes,
            c.ranks_per_node,
            if p < TARGET_PCT { "met" } else { "missed" }
        )),
        None => s.verdict("No configuration with more than one node: the job-wide completion cost was not measured.".into()),
    }
    for c in rows.iter().filter(|c| c.nodes == 1) {
        s.verdict(format!(
            "1 node × {}: job against independent {} (the same work both ways: the noise of this comparison).",
            c.ranks_per_node,
            c.job_cost_pct.map_or_else(|| "n/a".into(), |p| format!("{p:+.1} %"))
        ));
    }
    if let Some(c) = rows.iter().max_by_key(|c| c.total_bytes) {
        s.verdict(format!(
            "Largest job ({} nodes × {} ranks, {}): the application stalls {} s with Cascade \
             against {} s writing straight to S3 ({}); the job's checkpoint is complete after \
             {} s against {} s ({} the direct write).",
            c.nodes,
            c.ranks_per_node,
            size_str(c.total_bytes),
            st(&c.job.stall_s),
            st(&c.direct.stall_s),
            x(ratio(c.direct.stall_s.median, c.job.stall_s.median)),
            st(&c.job.until_marker_s),
            st(&c.direct.until_marker_s),
            x(ratio(
                c.job.until_marker_s.median,
                c.direct.until_marker_s.median
            ))
        ));
    }

    s.title("Checkpoint of a job: application stall and time until the job marker exists".into());
    s.head("| nodes × ranks | data | direct stall = until marker, s | cascade job stall, s | stall ratio direct / cascade | cascade job until marker, s | until marker cascade / direct | link minimum, s | until marker cascade / link minimum |");
    for c in rows {
        s.row(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            config_label(c),
            size_str(c.total_bytes),
            st(&c.direct.stall_s),
            st(&c.job.stall_s),
            x(ratio(c.direct.stall_s.median, c.job.stall_s.median)),
            st(&c.job.until_marker_s),
            x(ratio(
                c.job.until_marker_s.median,
                c.direct.until_marker_s.median
            )),
            num(c.link_min_s, 2),
            x(c.link_min_s
                .and_then(|m| ratio(c.job.until_marker_s.median, m)))
        ));
    }

    s.title(
        "What the job-wide completion costs: one job against N independent single-node checkpoints"
            .into(),
    );
    s.head(&format!("| nodes × ranks | job until marker, s | independent until the last node's marker, s | job − independent, s | share of the time until durable (medians) | per repetition | target < {TARGET_PCT} % |"));
    for c in rows {
        let per_rep = if c.job_cost_pct_per_rep.is_empty() {
            "n/a".to_string()
        } else {
            c.job_cost_pct_per_rep
                .iter()
                .map(|p| format!("{p:+.1} %"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let met = if c.nodes > 1 {
            cost_met(c.job_cost_pct)
        } else {
            "(1 node)"
        };
        s.row(format!(
            "| {} | {} | {} | {:+.2} | {} | {per_rep} | {met} |",
            config_label(c),
            st(&c.job.until_marker_s),
            st(&c.independent.until_marker_s),
            c.job.until_marker_s.median - c.independent.until_marker_s.median,
            c.job_cost_pct
                .map_or_else(|| "n/a".into(), |p| format!("{p:+.1} %")),
        ));
    }

    s.title("Where the time goes".into());
    s.head("| nodes × ranks | direct: all PUTs returned, s | job: all files closed, s | job: all nodes committed, s | independent: all files closed, s | independent: all nodes committed, s | independent until marker, s |");
    for c in rows {
        s.row(format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            config_label(c),
            st(&c.direct.written_s),
            st(&c.job.written_s),
            st(&c.job.stall_s),
            st(&c.independent.written_s),
            st(&c.independent.stall_s),
            st(&c.independent.until_marker_s)
        ));
    }
    s
}

fn targets(rows: &[ConfigRow]) -> Vec<Target> {
    let multi: Vec<&ConfigRow> = rows.iter().filter(|c| c.nodes > 1).collect();
    let costs: Vec<(f64, &ConfigRow)> = multi
        .iter()
        .filter_map(|c| c.job_cost_pct.map(|p| (p, *c)))
        .collect();
    let measured = costs
        .iter()
        .map(|(p, c)| format!("{}: {p:+.1} %", config_label(c)))
        .collect::<Vec<_>>()
        .join("; ");
    let met = (!costs.is_empty()).then(|| costs.iter().all(|(p, _)| *p < TARGET_PCT));
    vec![Target::new(
        "job-wide completion cost",
        &format!("< {TARGET_PCT} % of the time until durable (job vs N independent nodes)"),
        if measured.is_empty() {
            "not measured".into()
        } else {
            measured
        },
        met,
    )]
}

pub fn run(mut o: JOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve(pid)?;
    let dirs = vec![PathBuf::from("/var/tmp")];
    let _guard = crate::CleanupGuard::start(pid, dirs, &o.out)?;
    let var_tmp = Path::new("/var/tmp");
    let clock = RunClock::start(var_tmp, var_tmp);
    let max_nodes = o.nodes.iter().copied().max().unwrap_or(1);
    let max_ranks = o.ranks.iter().copied().max().unwrap_or(1);
    eprintln!(
        "cascade-bench jobs: durable store {}; nodes {:?} × ranks {:?}, {} per rank; markers watched {}",
        o.durable,
        o.nodes,
        o.ranks,
        size_str(o.bytes_per_rank),
        o.marker_dir
            .as_ref()
            .map_or_else(|| "over the link".into(), |d| format!("in {}", d.display()))
    );
    let (nominal, link) = match tbf_of(None, Some(&o.link_dev)) {
        Some((rate, text)) => (Some(rate), text),
        None => (None, format!("no tbf on {}", o.link_dev)),
    };
    let datafile = PathBuf::from(format!("/dev/shm/{}-ckptdata", prefix(pid)));
    let map = data_file(
        &datafile,
        (max_nodes * max_ranks) as u64 * o.bytes_per_rank,
        0x10b5_d00d_cafe_f00d,
    )?;
    let writer = Path::new("/var/tmp").join(format!("{}-ckptwriter", prefix(pid)));
    compile(&o.cc, WRITER_C, &writer)?;
    let bench = Bench {
        o: &o,
        bin: private_cli(&o.cascade, pid)?,
        writer,
        datafile: datafile.clone(),
        data: &map,
        durable: DurableStore::open(&o.url).ctx(|| "opening the durable store")?,
    };
    let configs: Vec<(usize, usize)> = o
        .nodes
        .iter()
        .flat_map(|&n| o.ranks.iter().map(move |&r| (n, r)))
        .collect();
    let mut samples: Vec<Samples> = configs.iter().map(|_| Samples::default()).collect();
    let methods = [Method::Direct, Method::Job, Method::Independent];
    let mut n = 0;
    for rep in 0..o.reps {
        for (ci, &(nodes, ranks)) in configs.iter().enumerate() {
            for m in util::rotated(&methods, rep + ci) {
                n += 1;
                let (name, x) = match m {
                    Method::Direct => ("direct", bench.direct(nodes, ranks, n)?),
                    Method::Job => ("job", bench.cascade(nodes, ranks, n, true)?),
                    Method::Independent => ("independent", bench.cascade(nodes, ranks, n, false)?),
                };
                eprintln!(
                    "  rep {}/{} {nodes} nodes × {ranks} ranks: {name:<11} written {:.2} s, stall {:.2} s, marker {:.2} s",
                    rep + 1,
                    o.reps,
                    x.written,
                    x.stall,
                    x.until_marker
                );
                let s = &mut samples[ci];
                match m {
                    Method::Direct => s.direct.push(x),
                    Method::Job => s.job.push(x),
                    Method::Independent => s.independent.push(x),
                }
            }
        }
    }
    drop(bench);
    drop(map);
    let _ = std::fs::remove_file(&datafile);
    let rows: Vec<ConfigRow> = configs
        .iter()
        .zip(&samples)
        .map(|(&(nodes, ranks), s)| {
            let total_bytes = (nodes * ranks) as u64 * o.bytes_per_rank;
            let (job, independent) = (method_row(&s.job), method_row(&s.independent));
            let pct = |j: f64, i: f64| 100.0 * (j - i) / i;
            ConfigRow {
                nodes,
                ranks_per_node: ranks,
                total_bytes,
                direct: method_row(&s.direct),
                link_min_s: nominal.map(|r| total_bytes as f64 / r),
                job_cost_pct: Some(pct(
                    job.until_marker_s.median,
                    independent.until_marker_s.median,
                ))
                .filter(|p| p.is_finite()),
                job_cost_pct_per_rep: s
                    .job
                    .iter()
                    .zip(&s.independent)
                    .map(|(j, i)| pct(j.until_marker, i.until_marker))
                    .collect(),
                job,
                independent,
            }
        })
        .collect();
    let source = [
        "crates/cascade-agent",
        "crates/cascade-cli",
        "crates/cascade-durable",
        "crates/cascade-store",
        "bench",
    ];
    let header = clock.finish(&source);
    let mut md = tables(&rows);
    let store = format!(
        "one per node, {} memory per rank + 64 MiB, no spill file, mount {}",
        size_str(o.capacity_per_rank),
        o.mount
    );
    let rep = Report {
        suite: "jobs",
        s3_server: s3_server(),
        cascade_cli: report::describe(&o.cascade),
        library: report::describe(&o.cascade.with_file_name("libcascade.so")),
        link: link.clone(),
        nominal_bytes_per_s: nominal,
        options: &o,
        targets: targets(&rows),
        results: &rows,
        header,
    };
    md.push(machine_table(
        &rep.header,
        vec![
            (
                "durable store".into(),
                format!("{} ({})", o.durable, rep.s3_server),
            ),
            ("link (host → S3)".into(), link),
            (
                "markers watched".into(),
                o.marker_dir.as_ref().map_or_else(
                    || "over the link (HEAD every 20 ms)".into(),
                    |d| {
                        format!(
                            "in the server's data directory {} (every 1 ms)",
                            d.display()
                        )
                    },
                ),
            ),
            (
                "CPU of the S3 server (not counted below)".into(),
                format!("{} % of all cores", num(rep.header.s3_server_cpu_pct, 1)),
            ),
            ("cascade CLI".into(), rep.cascade_cli.clone()),
            ("node stores".into(), store),
        ],
    ));
    let title = "Cascade: time to a complete checkpoint of a job on many nodes";
    report::write(&o.out, "jobs", title, &rep, md)
}
