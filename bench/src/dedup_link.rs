//! `cascade-bench dedup-link`: how long each checkpoint of a real series takes to become
//! durable over a 1 Gbit/s link, with the agent's dedup repository against the plain layout,
//! directly and through staging servers, and against the time the raw bytes need on that
//! link. Writes dedup-link.md and dedup-link.json. See bench/README.md.
//!
//! The durable store is bench/netns-s3.sh's versitygw behind `tc tbf` (1 Gbit/s each way).
//! Per series (bench/datasets: torch, numpy, lammps) and mode (plain; dedup, with
//! `--dedup ... --compress ... --delta off`; delta, the same with `--delta on`, the default;
//! staged-dedup and staged-delta, the same as dedup and delta plus two `cascade stage-server`
//! on 127.0.0.1, `CASCADE_STAGING`, on which the agent stages its packs, index and manifest
//! and which drain them to the durable store), a fresh node store and `cascade agent --durable
//! URL/<fresh prefix>` (the servers drain to the same prefix); then, snapshot by snapshot:
//! `cascade put` of each file into `/ck.NN/`, `cascade commit /ck.NN`, `cascade wait /ck.NN
//! --level durable`. Measured: from the first put until `cascade wait` returned (time until
//! durable), and the bytes the host end of the link sent meanwhile (its tx_bytes counter; the
//! agent's loopback traffic to the servers is not on it). The raw-bytes minimum is the
//! snapshot's bytes at the tbf rate.

use crate::baselines::{clear_remote, settle};
use crate::datasets::{load_series, Series};
use crate::format::median_u64;
use crate::net::{tbf_of, tx_bytes, WireWatch};
use crate::procs::{clean_cmd, cpu_s, cpu_s_named, threads_cpu_s, Node, StageServer};
use crate::report::{self, machine_table, Header, Md, RunClock, Target};
use crate::util::{
    busy_core_s, cores, cpu_snap, now_ns, prefix, require_s3_url, size_str, Context, Res, Stats,
    MIB,
};
use cascade_durable::{DurableStore, Spec};
use cascade_staging::server::threads;
use cascade_wire::{ClientOptions, Connection};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct DedupLinkArgs {
    /// Directory for dedup-link.md and dedup-link.json.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Quick run: the first 3 snapshots of each series.
    #[arg(long)]
    quick: bool,
    /// Series to replay (directories of --datasets).
    #[arg(long, value_delimiter = ',', default_value = "torch,numpy,lammps")]
    series: Vec<String>,
    /// Where bench/datasets/make.sh put the series (`bench/run.sh --suite dedup` makes them).
    #[arg(long, default_value = "/var/tmp/cascade-datasets")]
    datasets: PathBuf,
    /// Snapshots per series [default: all; --quick: 3].
    #[arg(long)]
    snapshots: Option<usize>,
    /// Repetitions of each series and mode; tables show the median [default: 1].
    #[arg(long, default_value_t = 1)]
    reps: usize,
    /// The agent's dedup setting in dedup mode (the default of `--dedup on`).
    #[arg(long, default_value = "fixed:64KiB")]
    dedup: String,
    /// The agent's compression setting in dedup mode (its default: the adaptive level).
    #[arg(long, default_value = "auto")]
    compress: String,
    /// What the agent sends the staging servers in the staged modes (its
    /// `staging.dedup`): packs (its default) or chunks.
    #[arg(long, default_value = "packs", value_parser = ["packs", "chunks"])]
    staging_dedup: String,
    /// The throttled durable store (`bench/netns-s3.sh up` prints it; `env` exports it).
    #[arg(long, env = "CASCADE_BENCH_S3_URL", hide_env_values = true)]
    url: Option<String>,
    /// Host end of the shaped link, whose tbf rate is the nominal rate.
    #[arg(long, env = "CASCADE_BENCH_LINK_DEV", default_value = "cs3-host")]
    link_dev: String,
    /// The cascade CLI.
    #[arg(long, default_value = "target/release/cascade")]
    cascade: PathBuf,
    /// Name of the node store (created and destroyed by the run).
    #[arg(long, default_value = "/cascade-bench-dedup-link")]
    store: String,
    /// Seconds `cascade wait --level durable` may take.
    #[arg(long, default_value_t = 600)]
    wait_timeout: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Plain,
    /// Dedup and compression, no deltas.
    Dedup,
    /// Dedup and compression with deltas against the previous checkpoint (the default).
    Delta,
    /// Dedup's settings, the chunks sent through two staging servers.
    StagedDedup,
    /// Delta's settings, the chunks (and deltas) sent through two staging servers.
    StagedDelta,
}

const MODES: [Mode; 5] = [
    Mode::Plain,
    Mode::Dedup,
    Mode::Delta,
    Mode::StagedDedup,
    Mode::StagedDelta,
];

/// Staging servers per node in the staged modes.
const STAGE_SERVERS: usize = 2;
/// The S3 store's process name (bench/netns-s3.sh), whose CPU the runs report.
const S3_SERVER: &str = "versitygw";

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Dedup => "dedup",
            Mode::Delta => "delta",
            Mode::StagedDedup => "staged-dedup",
            Mode::StagedDelta => "staged-delta",
        }
    }

    /// The agent's `--delta` setting (None: the plain layout, no dedup).
    fn delta(self) -> Option<&'static str> {
        match self {
            Mode::Plain => None,
            Mode::Dedup | Mode::StagedDedup => Some("off"),
            Mode::Delta | Mode::StagedDelta => Some("on"),
        }
    }

    fn staged(self) -> bool {
        matches!(self, Mode::StagedDedup | Mode::StagedDelta)
    }
}

/// One snapshot in one mode: seconds until durable, and the bytes the link carried (median
/// over repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct ModeRow {
    pub seconds: Stats,
    /// Staged modes: from the first put until `cascade wait --level staged` returned (safe
    /// from the loss of the node).
    pub staged: Option<Stats>,
    pub wire: u64,
    /// CPU seconds the machine was busy meanwhile ([`SnapOut::busy_core_s`]).
    pub busy_core_s: f64,
    /// [`SnapOut::first_bytes_s`], [`SnapOut::on_link_s`], [`SnapOut::after_link_s`].
    pub first_bytes_s: f64,
    pub on_link_s: f64,
    pub after_link_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapRow {
    pub snapshot: String,
    pub bytes: u64,
    /// bytes / tbf rate.
    pub link_min_s: Option<f64>,
    pub plain: ModeRow,
    pub dedup: ModeRow,
    pub delta: ModeRow,
    pub staged_dedup: ModeRow,
    pub staged_delta: ModeRow,
    /// The compression the agent reported after this snapshot in delta mode (the default
    /// configuration; with `auto`, the adaptive level), first repetition.
    pub delta_compression: String,
}

/// A series in one mode: sums over its snapshots of the per-snapshot medians.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ModeTotal {
    pub seconds: f64,
    pub staged: Option<f64>,
    pub wire: u64,
    pub busy_core_s: f64,
    pub first_bytes_s: f64,
    pub on_link_s: f64,
    pub after_link_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeriesRow {
    pub series: String,
    pub snapshots: usize,
    pub bytes: u64,
    pub link_min_s: Option<f64>,
    pub plain: ModeTotal,
    pub dedup: ModeTotal,
    pub delta: ModeTotal,
    pub staged_dedup: ModeTotal,
    pub staged_delta: ModeTotal,
    /// The servers' delta bases in the staged modes (the repetition of median time).
    pub staged_dedup_bases: BaseReads,
    pub staged_delta_bases: BaseReads,
    /// The direct modes' agent CPU (their base counts are zero).
    pub dedup_parts: BaseReads,
    pub delta_parts: BaseReads,
    pub snaps: Vec<SnapRow>,
}

#[derive(Serialize)]
struct Report<'a> {
    suite: &'static str,
    #[serde(flatten)]
    header: Header,
    cascade_cli: String,
    durable: String,
    link: String,
    link_bytes_per_s: Option<f64>,
    dedup: String,
    compress: String,
    staging_dedup: String,
    reps: usize,
    targets: Vec<Target>,
    series: &'a [SeriesRow],
}

/// One snapshot of one run of a series in one mode.
struct SnapOut {
    /// Seconds until durable, and until staged in the staged modes.
    secs: f64,
    staged: Option<f64>,
    /// Bytes on the link.
    wire: u64,
    /// The compression the agent reported after it (`cascade status`: the adaptive level in
    /// use), "" without dedup.
    level: String,
    /// CPU seconds the whole machine was busy meanwhile (every process: the agent, the
    /// servers, the S3 store, the kernel's network path): on these cores the snapshot could
    /// not have taken less than this over the number of cores.
    busy_core_s: f64,
    /// The link's use ([`WireWatch`]): seconds until the first 64 KiB were on it, from then
    /// until 99 % of the snapshot's bytes had gone, and from then until durable (the three
    /// add up to `secs`).
    first_bytes_s: f64,
    on_link_s: f64,
    after_link_s: f64,
}

type RunOut = Vec<SnapOut>;

/// The node side of one run: a node store, its agent and, in the staged modes, two staging
/// servers on 127.0.0.1 draining to the run's durable prefix; all go when dropped.
fn start_node(
    bin: &Path,
    a: &DedupLinkArgs,
    url: &str,
    capacity: u64,
    mode: Mode,
) -> Res<(Node, String)> {
    let pid = std::process::id();
    let env = [
        ("CASCADE_STORE", a.store.as_str()),
        ("CASCADE_DURABLE", url),
        ("CASCADE_SPILL_SIZE", "0"),
    ];
    let mut node = Node::init(bin, &env, &["--capacity", &capacity.to_string()])?;
    // The staged modes: the servers first (the agent needs their addresses). Names under the
    // run's prefix, so that the cleanup finds what a killed run left.
    let secret = format!("{}-{}", prefix(pid), now_ns());
    let mut agent_env = Vec::new();
    if mode.staged() {
        for i in 0..STAGE_SERVERS {
            let base = Path::new("/var/tmp").join(format!("{}-stage-{i}", prefix(pid)));
            let mut cmd = clean_cmd(bin);
            cmd.env("CASCADE_STAGING_SECRET", &secret);
            let args = ["--listen", "127.0.0.1:0", "--drain-to", url];
            node.servers.push(StageServer::spawn(
                cmd,
                base.clone(),
                base.with_extension("log"),
                &args,
            )?);
        }
        for server in &mut node.servers {
            server.wait_listening()?;
        }
        let addrs: Vec<&str> = node.servers.iter().map(|s| s.addr.as_str()).collect();
        agent_env = vec![
            ("CASCADE_STAGING", addrs.join(",")),
            ("CASCADE_STAGING_SECRET", secret.clone()),
            ("CASCADE_STAGING_DEDUP", a.staging_dedup.clone()),
        ];
    }
    let mut args = vec!["--durable", url];
    if let Some(delta) = mode.delta() {
        args.extend([
            "--dedup",
            &a.dedup,
            "--compress",
            &a.compress,
            "--delta",
            delta,
        ]);
    }
    node.start_agent(&args, &agent_env)?;
    Ok((node, secret))
}

/// What the staging servers of a staged run did with the bases of delta chunks, summed over
/// the servers (their status; servers without a base cache report zeros).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BaseReads {
    pub from_cache: u64,
    pub from_durable: u64,
    pub bytes_from_durable: u64,
    pub read_s: f64,
    /// CPU seconds of the agent and of the staging servers from the first snapshot to the end
    /// of the run (the rig runs them, and the S3 store, on the same cores): their start-up,
    /// the servers' prefault of their drain memory among it, is left out.
    pub agent_cpu_s: f64,
    pub servers_cpu_s: f64,
    /// The part of `servers_cpu_s` spent taking chunks in: the threads that receive, check
    /// and store them (`threads::RECEIVING`), all before a chunk counts as staged; the rest
    /// is the push to the durable store.
    pub servers_receive_cpu_s: f64,
    /// CPU seconds of the S3 store (versitygw) over the same time, in every mode.
    pub s3_cpu_s: f64,
}

impl BaseReads {
    /// What happened since `start`.
    fn since(self, start: BaseReads) -> BaseReads {
        BaseReads {
            from_cache: self.from_cache.saturating_sub(start.from_cache),
            from_durable: self.from_durable.saturating_sub(start.from_durable),
            bytes_from_durable: self
                .bytes_from_durable
                .saturating_sub(start.bytes_from_durable),
            read_s: self.read_s - start.read_s,
            agent_cpu_s: self.agent_cpu_s - start.agent_cpu_s,
            servers_cpu_s: self.servers_cpu_s - start.servers_cpu_s,
            servers_receive_cpu_s: self.servers_receive_cpu_s - start.servers_receive_cpu_s,
            s3_cpu_s: self.s3_cpu_s - start.s3_cpu_s,
        }
    }
}

/// The pid a `cascade stage-server` log's start line names (`... (pid N) ...`).
fn server_pid(log: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(log).ok()?;
    let at = text.find("(pid ")? + 5;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn base_reads(node: &Node, secret: &str) -> BaseReads {
    let mut r = BaseReads {
        agent_cpu_s: node.agent_pid().and_then(cpu_s).unwrap_or(0.0),
        s3_cpu_s: cpu_s_named(S3_SERVER),
        ..BaseReads::default()
    };
    for server in &node.servers {
        if let Some(pid) = server_pid(&server.log) {
            r.servers_cpu_s += cpu_s(pid).unwrap_or(0.0);
            r.servers_receive_cpu_s += threads_cpu_s(pid, threads::RECEIVING);
        }
        let Ok(mut c) = Connection::connect(&server.addr, &ClientOptions::new(secret)) else {
            continue;
        };
        if let Ok(s) = c.status() {
            r.from_cache += s.dedup.delta_bases_from_cache;
            r.from_durable += s.dedup.delta_bases_from_durable;
            r.bytes_from_durable += s.dedup.delta_base_bytes_from_durable;
            r.read_s += s.dedup.delta_base_read_micros as f64 / 1e6;
        }
        c.goodbye();
    }
    r
}

/// The durable URL with `rel` appended to its path (`s3://bucket/rel?...`).
fn url_below(url: &str, rel: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = format!("{}/{rel}", base.trim_end_matches('/'));
    match query {
        Some(q) => format!("{base}?{q}"),
        None => base,
    }
}

/// The agent's compression after a checkpoint, as `cascade status --json` reports it
/// (`zstd:-2`, or with the adaptive level `zstd:1 (auto; last: ...)`), up to its first space;
/// "" when it reports none.
fn compression_in_use(node: &Node) -> String {
    let Ok(out) = node.run_ok(&["status", "--json"]) else {
        return String::new();
    };
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v["agent"]["dedup_compression"].as_str().map(str::to_string))
        .and_then(|c| c.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

fn run_once(
    bin: &Path,
    a: &DedupLinkArgs,
    s: &Series,
    snaps: usize,
    mode: Mode,
    rep: usize,
) -> Res<(RunOut, Option<BaseReads>)> {
    let pid = std::process::id();
    let url = a.url.clone().unwrap_or_default();
    let rel = format!("{}-{}-{}-{rep}", prefix(pid), s.info.name, mode.name());
    let sub = url_below(&url, &rel);
    let remote = DurableStore::open(&sub).ctx(|| "opening the durable store")?;
    clear_remote(&remote, "")?;
    let biggest = s.snaps.iter().map(|x| x.bytes()).max().unwrap_or(0);
    // Three checkpoints in memory (the agent keeps 2), and room to write the next.
    let capacity = (4 * biggest + 256 * MIB).div_ceil(MIB) * MIB;
    let (mut node, secret) = start_node(bin, a, &sub, capacity, mode)?;
    let started = base_reads(&node, &secret);
    let mut out = Vec::new();
    for (i, snap) in s.snaps.iter().take(snaps).enumerate() {
        let ckpt = format!("/ck.{i:02}");
        settle();
        let tx0 = tx_bytes(&a.link_dev);
        let cpu0 = cpu_snap();
        let watch = WireWatch::start(&a.link_dev);
        let t0 = now_ns();
        for f in &snap.files {
            let local = f.path.to_string_lossy().into_owned();
            node.run_ok(&["put", "-p", &local, &format!("{ckpt}/{}", f.rel)])?;
        }
        node.run_ok(&["commit", &ckpt])?;
        let staged = if mode.staged() {
            node.wait_level(&ckpt, "staged", a.wait_timeout)?;
            Some((now_ns() - t0) as f64 / 1e9)
        } else {
            None
        };
        node.wait_level(&ckpt, "durable", a.wait_timeout)?;
        let secs = (now_ns() - t0) as f64 / 1e9;
        let wire = tx_bytes(&a.link_dev).saturating_sub(tx0);
        let busy_core_s = busy_core_s(&cpu0, &cpu_snap());
        let (first_bytes_s, on_link_s, after_link_s) = match watch.and_then(|w| w.finish()) {
            Some((start, end)) => (
                start.saturating_sub(t0) as f64 / 1e9,
                end.saturating_sub(start) as f64 / 1e9,
                secs - end.saturating_sub(t0) as f64 / 1e9,
            ),
            None => (0.0, 0.0, 0.0),
        };
        let level = compression_in_use(&node);
        eprintln!(
            "  {} {} {}: {} in {secs:.2} s, {} on the link{}",
            s.info.name,
            mode.name(),
            snap.name,
            size_str(snap.bytes()),
            size_str(wire),
            if level.is_empty() {
                String::new()
            } else {
                format!("; compression {level}")
            }
        );
        out.push(SnapOut {
            secs,
            staged,
            wire,
            level,
            busy_core_s,
            first_bytes_s,
            on_link_s,
            after_link_s,
        });
    }
    keep_logs(&node, &rel);
    let reads = Some(base_reads(&node, &secret).since(started));
    drop(node);
    clear_remote(&remote, "")?;
    Ok((out, reads))
}

/// With `CASCADE_BENCH_KEEP_LOGS=DIR`: the run's agent and staging server logs copied into
/// DIR (named by the run) before the node goes, for timelines of where the seconds go.
fn keep_logs(node: &Node, run: &str) {
    let Some(dir) = std::env::var_os("CASCADE_BENCH_KEEP_LOGS").map(PathBuf::from) else {
        return;
    };
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::copy(&node.agent_log, dir.join(format!("{run}-agent.log")));
    for (i, server) in node.servers.iter().enumerate() {
        let _ = std::fs::copy(&server.log, dir.join(format!("{run}-stage-{i}.log")));
    }
}

pub fn run(mut a: DedupLinkArgs) -> Res<()> {
    let pid = std::process::id();
    // The agent writing the repository and the servers pushing to it alike.
    a.url = a.url.map(crate::util::as_over_https);
    require_s3_url(a.url.as_deref().unwrap_or_default(), "dedup-link")?;
    let durable = Spec::parse(a.url.as_deref().unwrap_or_default())
        .ctx(|| "--url")?
        .describe();
    let dirs = vec![PathBuf::from("/var/tmp")];
    let _guard = crate::CleanupGuard::start(pid, dirs, &a.out)?;
    // A private copy of the CLI: a rebuild during the run must not swap it.
    let bin = Path::new("/var/tmp").join(format!("{}-cascade", prefix(pid)));
    std::fs::copy(&a.cascade, &bin).ctx(|| format!("copying {}", a.cascade.display()))?;
    let clock = RunClock::start(Path::new("/var/tmp"), Path::new("/var/tmp"));
    let tbf = tbf_of(None, Some(&a.link_dev));
    let rate = tbf.as_ref().map(|t| t.0);
    eprintln!(
        "cascade-bench dedup-link: durable store {durable}; link {}",
        tbf.as_ref()
            .map_or("not shaped (no tbf found)".to_string(), |t| t.1.clone())
    );
    let snapshots = a.snapshots.or(a.quick.then_some(3));
    let mut rows = Vec::new();
    for name in &a.series {
        let s = load_series(&a.datasets, name).ctx(|| {
            "the series are made by bench/datasets/make.sh (bench/run.sh --suite dedup runs it)"
        })?;
        let n = snapshots.unwrap_or(s.snaps.len()).min(s.snaps.len());
        let mut runs: Vec<(Mode, RunOut)> = Vec::new();
        let mut reads: Vec<(Mode, BaseReads)> = Vec::new();
        for rep in 0..a.reps.max(1) {
            // The mode that goes first rotates with the repetition.
            for k in 0..MODES.len() {
                let mode = MODES[(k + rep) % MODES.len()];
                let (out, r) = run_once(&bin, &a, &s, n, mode, rep)?;
                runs.push((mode, out));
                reads.extend(r.map(|r| (mode, r)));
            }
        }
        // Per staged mode, the repetition with the median total time's base reads.
        let median_reads = |mode: Mode| -> BaseReads {
            let mut mine: Vec<(f64, BaseReads)> = runs
                .iter()
                .filter(|r| r.0 == mode)
                .map(|r| r.1.iter().map(|x| x.secs).sum::<f64>())
                .zip(reads.iter().filter(|r| r.0 == mode).map(|r| r.1))
                .collect();
            mine.sort_by(|x, y| x.0.total_cmp(&y.0));
            mine.get(mine.len() / 2).map(|x| x.1).unwrap_or_default()
        };
        let per = |mode: Mode, i: usize| -> ModeRow {
            let mine: Vec<&SnapOut> = runs
                .iter()
                .filter(|r| r.0 == mode)
                .map(|r| &r.1[i])
                .collect();
            let secs: Vec<f64> = mine.iter().map(|x| x.secs).collect();
            let staged: Vec<f64> = mine.iter().filter_map(|x| x.staged).collect();
            let wire: Vec<u64> = mine.iter().map(|x| x.wire).collect();
            let median = |f: fn(&SnapOut) -> f64| {
                Stats::of(&mine.iter().map(|x| f(x)).collect::<Vec<f64>>()).median
            };
            ModeRow {
                seconds: Stats::of(&secs),
                staged: (!staged.is_empty()).then(|| Stats::of(&staged)),
                wire: median_u64(&wire),
                busy_core_s: median(|x| x.busy_core_s),
                first_bytes_s: median(|x| x.first_bytes_s),
                on_link_s: median(|x| x.on_link_s),
                after_link_s: median(|x| x.after_link_s),
            }
        };
        let snaps: Vec<SnapRow> = (s.snaps.iter().take(n).enumerate())
            .map(|(i, snap)| SnapRow {
                snapshot: snap.name.clone(),
                bytes: snap.bytes(),
                link_min_s: rate.map(|r| snap.bytes() as f64 / r),
                plain: per(Mode::Plain, i),
                dedup: per(Mode::Dedup, i),
                delta: per(Mode::Delta, i),
                staged_dedup: per(Mode::StagedDedup, i),
                staged_delta: per(Mode::StagedDelta, i),
                delta_compression: runs
                    .iter()
                    .find(|r| r.0 == Mode::Delta)
                    .map(|r| r.1[i].level.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let total = |row: fn(&SnapRow) -> &ModeRow| ModeTotal {
            seconds: snaps.iter().map(|r| row(r).seconds.median).sum(),
            staged: snaps
                .iter()
                .map(|r| row(r).staged.as_ref().map(|x| x.median))
                .sum(),
            wire: snaps.iter().map(|r| row(r).wire).sum(),
            busy_core_s: snaps.iter().map(|r| row(r).busy_core_s).sum(),
            first_bytes_s: snaps.iter().map(|r| row(r).first_bytes_s).sum(),
            on_link_s: snaps.iter().map(|r| row(r).on_link_s).sum(),
            after_link_s: snaps.iter().map(|r| row(r).after_link_s).sum(),
        };
        let bytes = snaps.iter().map(|r| r.bytes).sum();
        rows.push(SeriesRow {
            series: name.clone(),
            snapshots: n,
            bytes,
            link_min_s: rate.map(|r| bytes as f64 / r),
            plain: total(|r| &r.plain),
            dedup: total(|r| &r.dedup),
            delta: total(|r| &r.delta),
            staged_dedup: total(|r| &r.staged_dedup),
            staged_delta: total(|r| &r.staged_delta),
            staged_dedup_bases: median_reads(Mode::StagedDedup),
            staged_delta_bases: median_reads(Mode::StagedDelta),
            dedup_parts: median_reads(Mode::Dedup),
            delta_parts: median_reads(Mode::Delta),
            snaps,
        });
    }
    let targets = rows
        .iter()
        .flat_map(|r| [target(r), staged_target(r), safe_target(r)])
        .collect();
    let rep = Report {
        suite: "dedup-link",
        header: clock.finish(&[
            "crates/cascade-dedup",
            "crates/cascade-agent",
            "crates/cascade-cli",
            "crates/cascade-staging",
            "bench",
        ]),
        cascade_cli: report::describe(&a.cascade),
        durable,
        link: tbf.map_or("not shaped".to_string(), |t| t.1),
        link_bytes_per_s: rate,
        dedup: a.dedup.clone(),
        compress: a.compress.clone(),
        staging_dedup: a.staging_dedup.clone(),
        reps: a.reps.max(1),
        targets,
        series: &rows,
    };
    let title = "Time until durable over a 1 Gbit/s link, with and without dedup";
    report::write(&a.out, "dedup-link", title, &rep, tables(&rep))
}

/// Dedup (with deltas, the default) against the raw bytes at the link's rate.
fn target(r: &SeriesRow) -> Target {
    let min = r
        .link_min_s
        .map_or("?".to_string(), |m| format!("{m:.2} s"));
    let measured = format!(
        "{:.2} s with dedup and deltas (the default), {:.2} s without deltas, {:.2} s plain, raw \
         bytes need {min}; through two staging servers {:.2} s with deltas, {:.2} s without",
        r.delta.seconds,
        r.dedup.seconds,
        r.plain.seconds,
        r.staged_delta.seconds,
        r.staged_dedup.seconds
    );
    let name = format!("{}: durable over the link with dedup", r.series);
    let goal = "below the time the raw bytes need on the link";
    Target::new(
        &name,
        goal,
        measured,
        r.link_min_s.map(|m| r.delta.seconds < m),
    )
}

/// Issue 24, item 2: through the staging servers, durable within 1.05x of the agent writing
/// the repository itself (same settings).
/// Also the bound this machine puts on it: the servers and the S3 store run on the agent's
/// cores, so the CPU work of the whole machine over the cores is a floor under the time.
fn staged_target(r: &SeriesRow) -> Target {
    let (sd, d) = (r.staged_delta.seconds, r.delta.seconds);
    let (sn, n) = (r.staged_dedup.seconds, r.dedup.seconds);
    let cores = cores();
    let floor = durable_no_sooner_than(&r.staged_delta, cores);
    // On this rig the time through the servers has behaved as the direct time plus this
    // over the cores (docs/dedup.md, "Where the extra CPU goes, by process").
    let extra = r.staged_delta.busy_core_s - r.delta.busy_core_s;
    let measured = format!(
        "with deltas {sd:.2} s through the servers against {d:.2} s direct ({:.2}x); without \
         {sn:.2} s against {n:.2} s ({:.2}x); bound on these {cores} cores: the machine was \
         busy {:.2} CPU s with deltas through the servers ({:.2} direct), so durable no \
         sooner than {floor:.2} s, {:.2}x direct; the extra work through the servers, {extra:.2} \
         CPU s (the servers {:.2}, the S3 store {:+.2}), is {:.2} s over the {cores} cores, the \
         measured gap {:.2} s",
        sd / d,
        sn / n,
        r.staged_delta.busy_core_s,
        r.delta.busy_core_s,
        floor / d,
        r.staged_delta_bases.servers_cpu_s,
        r.staged_delta_bases.s3_cpu_s - r.delta_parts.s3_cpu_s,
        extra / cores as f64,
        sd - d,
    );
    Target::new(
        &format!("{}: durable through two staging servers", r.series),
        "within 1.05x of the agent writing the repository itself",
        measured,
        Some(sd <= 1.05 * d && sn <= 1.05 * n),
    )
}

/// Issue 24, item 2: safe from the loss of the node (staged) at least 5x sooner than durable.
/// Also the bound this machine puts on it: before a chunk is staged the agent has cut,
/// hashed and compressed it and a server has checked and stored it, all on these cores.
fn safe_target(r: &SeriesRow) -> Target {
    let ratio = |m: &ModeTotal| m.staged.map(|st| m.seconds / st);
    let (a, b) = (ratio(&r.staged_delta), ratio(&r.staged_dedup));
    let show = |x: Option<f64>| x.map_or("?".to_string(), |v| format!("{v:.2}x"));
    let cores = cores();
    let staged_min = staged_no_sooner_than(&r.staged_delta_bases, cores);
    let measured = format!(
        "durable / staged: {} with deltas ({} s staged, {:.2} s durable), {} without; bound \
         on these {cores} cores: with deltas staged no sooner than {staged_min:.2} s ((agent \
         CPU {:.2} s + servers' CPU receiving {:.2} s) / {cores}), so at most {:.2}x at this \
         durable time",
        show(a),
        opt_s(r.staged_delta.staged),
        r.staged_delta.seconds,
        show(b),
        r.staged_delta_bases.agent_cpu_s,
        r.staged_delta_bases.servers_receive_cpu_s,
        r.staged_delta.seconds / staged_min,
    );
    Target::new(
        &format!("{}: staged before durable through the servers", r.series),
        "staged at least 5x sooner than durable",
        measured,
        a.zip(b).map(|(a, b)| a >= 5.0 && b >= 5.0),
    )
}

/// The earliest a series could be durable on `cores` cores at the CPU work the machine did
/// meanwhile (every process and the kernel), spread perfectly over all of them.
fn durable_no_sooner_than(m: &ModeTotal, cores: usize) -> f64 {
    m.busy_core_s / cores as f64
}

/// The earliest a series could be staged on `cores` cores: the agent's CPU and the servers'
/// receiving CPU spread perfectly over all of them.
fn staged_no_sooner_than(b: &BaseReads, cores: usize) -> f64 {
    (b.agent_cpu_s + b.servers_receive_cpu_s) / cores as f64
}

fn opt_s(x: Option<f64>) -> String {
    x.map_or("–".to_string(), |v| format!("{v:.2}"))
}

/// The tables of dedup-link.md.
fn tables(rep: &Report) -> Md {
    let mut s = Md::default();
    s.verdict(format!(
        "durable store {} behind {}; dedup `--dedup {} --compress {}`, through the servers as {} (`staging.dedup`); median of {} repetition(s) per snapshot, series totals are sums",
        rep.durable, rep.link, rep.dedup, rep.compress, rep.staging_dedup, rep.reps
    ));
    s.title("Series".into());
    s.head("| series | snapshots | bytes | raw minimum (s) | plain (s) | dedup (s) | delta (s) | staged dedup (s) | staged delta (s) | staged dedup: staged (s) | staged delta: staged (s) | delta / raw minimum | staged delta / delta | on the link plain | on the link dedup | on the link delta | on the link staged dedup | on the link staged delta |");
    for r in rep.series {
        s.row(format!("| {} | {} | {} | {} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} | {} | {} | {} | {:.2}x | {} | {} | {} | {} | {} |", r.series, r.snapshots, size_str(r.bytes), opt_s(r.link_min_s), r.plain.seconds, r.dedup.seconds, r.delta.seconds, r.staged_dedup.seconds, r.staged_delta.seconds, opt_s(r.staged_dedup.staged), opt_s(r.staged_delta.staged), r.link_min_s.map_or("–".to_string(), |m| format!(
                "{:.2}x",
                r.delta.seconds / m
            )), r.staged_delta.seconds / r.delta.seconds, size_str(r.plain.wire), size_str(r.dedup.wire), size_str(r.delta.wire), size_str(r.staged_dedup.wire), size_str(r.staged_delta.wire)));
    }
    s.title("Parts of the staged modes".into());
    s.head("| series | mode | until staged (s) | staged to durable (s) | direct, same settings (s) | durable / direct | delta bases from the servers' caches | delta bases read over the link | their raw bytes | seconds reading them | agent CPU (s) | servers' CPU (s) | of it receiving (s) | staged no sooner than (s) | agent CPU direct (s) | S3 store CPU (s) | direct (s) | machine busy (CPU s) | durable no sooner than (s) | machine busy direct (CPU s) | until the first bytes on the link (s) | direct (s) | on the link until 99 % (s) | direct (s) | its bytes at the link's rate (s) | after the link until durable (s) | direct (s) |");
    for r in rep.series {
        for (name, m, direct, b, d) in [
            (
                "staged-dedup",
                &r.staged_dedup,
                &r.dedup,
                &r.staged_dedup_bases,
                &r.dedup_parts,
            ),
            (
                "staged-delta",
                &r.staged_delta,
                &r.delta,
                &r.staged_delta_bases,
                &r.delta_parts,
            ),
        ] {
            let staged = m.staged.unwrap_or(0.0);
            s.row(format!(
                "| {} | {name} | {staged:.2} | {:.2} | {:.2} | {:.2}x | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
                r.series,
                m.seconds - staged,
                direct.seconds,
                m.seconds / direct.seconds,
                b.from_cache,
                b.from_durable,
                size_str(b.bytes_from_durable),
                b.read_s,
                b.agent_cpu_s,
                b.servers_cpu_s,
                b.servers_receive_cpu_s,
                staged_no_sooner_than(b, cores()),
                d.agent_cpu_s,
                b.s3_cpu_s,
                d.s3_cpu_s,
                m.busy_core_s,
                durable_no_sooner_than(m, cores()),
                direct.busy_core_s,
                m.first_bytes_s,
                direct.first_bytes_s,
                m.on_link_s,
                direct.on_link_s,
                rep.link_bytes_per_s
                    .map_or("–".to_string(), |rate| format!("{:.2}", m.wire as f64 / rate)),
                m.after_link_s,
                direct.after_link_s
            ));
        }
    }
    for r in rep.series {
        s.title(format!("Snapshots of {}", r.series));
        s.head("| snapshot | bytes | raw minimum (s) | plain (s) | dedup (s) | delta (s) | staged dedup (s) | staged delta (s) | staged delta: staged (s) | on the link plain | on the link dedup | on the link delta | on the link staged dedup | on the link staged delta | delta: compression after it |");
        for x in &r.snaps {
            s.row(format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                x.snapshot,
                size_str(x.bytes),
                opt_s(x.link_min_s),
                x.plain.seconds.median,
                x.dedup.seconds.median,
                x.delta.seconds.median,
                x.staged_dedup.seconds.median,
                x.staged_delta.seconds.median,
                opt_s(x.staged_delta.staged.as_ref().map(|v| v.median)),
                size_str(x.plain.wire),
                size_str(x.dedup.wire),
                size_str(x.delta.wire),
                size_str(x.staged_dedup.wire),
                size_str(x.staged_delta.wire),
                x.delta_compression
            ));
        }
    }
    s.push(machine_table(&rep.header, Vec::new()));
    s
}
