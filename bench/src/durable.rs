//! `cascade-bench durable`: the checkpoint time an application perceives with Cascade against
//! writing straight to the durable store, with the durable store behind a throttled link
//! (bench/netns-s3.sh: versitygw in a network namespace, veth shaped with `tc tbf` to
//! 1 Gbit/s each way). Writes durable.md and durable.json. See bench/README.md.
//!
//! Per checkpoint size and repetition, with the same bytes (a non-zero xorshift pattern in a
//! /dev/shm file that every method reads), the methods in turn (which one goes first rotates
//! with the repetition), each after `sync` and a wait for an idle machine:
//! - direct-s3: `DurableStore::upload_checkpoint` of the checkpoint (data, checksum object,
//!   marker) into the throttled S3 store: the stall of an application that writes to S3.
//! - direct-dir: write(2) in 8 MiB pieces into a new file on local disk, fsync, close.
//! - cascade: a small C program (bench/ckptwriter.c, compiled with cc at the start) under `cascade
//!   run` writes the file into the node store with write(2) in 8 MiB pieces, closes it and
//!   commits it, with `cascade commit` (a new process) or with `cascade_commit()` of the
//!   preloaded library (`--commit`); its own elapsed time is the stall. The node agent
//!   (`cascade agent --durable URL`, started by the bench for the whole run, so `cascade run`
//!   embeds none) drains it to the same S3 store; `cascade wait --level durable` returns once
//!   the completion marker is written: time until durable (from the writer's start). Each
//!   checkpoint is removed from the store and from S3 afterwards.
//! - link minimum: bytes / nominal rate (tc tbf) and bytes / TCP goodput measured over the same
//!   link in this run (a sender here, a receiver thread moved into the namespace with setns).
//! - where the time goes: the host end's tx_bytes counter, sampled every 2 ms during the
//!   uploads, tells when the data was on the wire and how long the server took after it.

use crate::baselines::{
    clear_remote, data_file, direct_dir, direct_s3, run_ckptwriter, settle, WRITER_C,
};
use crate::format::{num, ratio, secs_gbps, st as secs, x, x_prec};
use crate::net::{endpoint_ip, links_table, measure_link, s3_server, LinkInfo, WireWatch};
use crate::procs::{compile, private_cli, Node};
use crate::report::{self, machine_table, Header, Md, RunClock};
use crate::util::{
    check_mount, err, gbps, prefix, require_s3_url, size_str, Context, Res, Stats, MIB,
};
use cascade_durable::{DurableStore, Spec};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Target: time until durable within this factor of the link's physical minimum.
const TARGET_RATIO: f64 = 1.2;

/// The options (`cascade-bench durable --help`); the fields without an `arg` are derived by
/// [`DOpts::resolve`]. Serialized into durable.json without credentials.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct DOpts {
    /// Directory for durable.md and durable.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: one 64 MiB checkpoint, 1 repetition, 64 MiB link test. Explicit flags
    /// override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Checkpoint sizes in MiB.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,1024",
        default_value_if("quick", "true", "64")
    )]
    #[serde(skip)]
    sizes_mib: Vec<u64>,
    /// Repetitions of each measurement; tables show the median.
    #[arg(long, default_value_t = 3, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// The throttled durable store (`bench/netns-s3.sh up` prints it; `env` exports it); its
    /// credentials are never written out.
    #[arg(
        long,
        env = "CASCADE_BENCH_S3_URL",
        hide_env_values = true,
        default_value = ""
    )]
    #[serde(skip)]
    pub url: String,
    /// Network namespace of the S3 server (for the link test).
    #[arg(long, env = "CASCADE_BENCH_NETNS", default_value = "cascade-s3")]
    pub netns: String,
    /// Host end of the shaped link, whose tbf rate is the nominal rate.
    #[arg(long, env = "CASCADE_BENCH_LINK_DEV", default_value = "cs3-host")]
    pub link_dev: String,
    /// MiB per TCP goodput test over the link; 0 skips it.
    #[arg(long, default_value_t = 256, default_value_if("quick", "true", "64"))]
    #[serde(skip)]
    linktest_mib: u64,
    /// Directory on local disk for the direct-dir baseline.
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    /// The cascade CLI (its libcascade.so next to it).
    #[arg(long, default_value = "target/release/cascade")]
    pub cascade: PathBuf,
    /// The C compiler for the checkpoint writer.
    #[arg(long, default_value = "cc")]
    pub cc: String,
    /// Name of the node store the cascade runs use (created and destroyed by the run).
    #[arg(long, default_value = "/cascade-bench-durable")]
    pub store: String,
    /// Mount prefix of the store under `cascade run`.
    #[arg(long, default_value = "/cascade")]
    pub mount: String,
    /// Seconds `cascade wait --level durable` may take.
    #[arg(long = "wait-timeout", default_value_t = 900)]
    pub wait_timeout_s: u64,
    /// Bytes per write(2) call of the writers, in MiB.
    #[arg(long, default_value_t = 8)]
    #[serde(skip)]
    piece_mib: u64,
    /// How the cascade writer commits: `cascade commit` (cli) and/or cascade_commit() of the
    /// preloaded library (lib); each is a cascade run of its own.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cli,lib")]
    pub commit: Vec<Commit>,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    /// The durable store without credentials.
    #[arg(skip)]
    pub durable: String,
    #[arg(skip)]
    pub sizes: Vec<u64>,
    #[arg(skip)]
    pub linktest_bytes: u64,
    /// Memory of the node store: the largest checkpoint plus 256 MiB (each checkpoint is
    /// removed once durable); no spill file.
    #[arg(skip)]
    pub capacity: u64,
    #[arg(skip)]
    pub piece: u64,
}

impl DOpts {
    /// Checks the options and derives the byte sizes and the durable store's description.
    fn resolve(&mut self, pid: u32) -> Res<()> {
        self.sizes = self.sizes_mib.iter().map(|m| m * MIB).collect();
        if self.sizes.is_empty() || self.sizes.contains(&0) {
            return err("--sizes-mib needs positive sizes");
        }
        if self.piece_mib == 0 || self.reps == 0 {
            return err("--piece-mib and --reps must be positive");
        }
        check_mount(&self.mount)?;
        require_s3_url(&self.url, "durable")?;
        self.durable = Spec::parse(&self.url).ctx(|| "--url")?.describe();
        self.pid = pid;
        self.mount = self.mount.trim_end_matches('/').to_string();
        self.linktest_bytes = self.linktest_mib * MIB;
        self.capacity = self.sizes.iter().copied().max().unwrap_or(0) + 256 * MIB;
        self.piece = self.piece_mib * MIB;
        Ok(())
    }
}

/// How the writer commits its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Commit {
    /// Runs `cascade commit /ckptNNN` (a new process that attaches the store).
    Cli,
    /// Calls `cascade_commit()` of the preloaded library in the writer's process.
    Lib,
}

impl Commit {
    fn arg(self) -> &'static str {
        match self {
            Commit::Cli => "cli",
            Commit::Lib => "lib",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The link: its configuration (tc, ethtool) and a TCP goodput test through it.

// ---------------------------------------------------------------------------------------------
// The measurements.

/// One cascade measurement, in seconds.
#[derive(Debug, Clone, Copy)]
struct CascadeSample {
    stall: f64,
    write: f64,
    commit: f64,
    until_durable: f64,
    until_marker: Option<f64>,
    /// When the upload's data started and finished going over the link (WireWatch), from
    /// the start of the write.
    wire_start: Option<f64>,
    wire_end: Option<f64>,
}

/// The Cascade side: node store, node agent, writer program. Stops the agent and destroys the
/// store when dropped.
struct Cascade {
    node: Node,
    mount: String,
    writer: PathBuf,
    datafile: PathBuf,
    piece: u64,
    wait_timeout_s: u64,
    link_dev: String,
}

impl Cascade {
    /// Why the cascade runs cannot happen with this CLI, or None.
    fn unavailable(bin: &Path) -> Option<String> {
        if !bin.is_file() {
            return Some(format!(
                "{} does not exist (cargo build --release -p cascade-cli)",
                bin.display()
            ));
        }
        let missing: Vec<&str> = ["agent", "commit", "wait"]
            .into_iter()
            .filter(|sub| {
                !Command::new(bin)
                    .args([sub, "--help"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "{} has no `{}` yet (`cascade {} --help` fails)",
                bin.display(),
                missing.join("`, `"),
                missing[0]
            )
        })
    }

    /// Compiles the writer, copies the CLI, creates the store and starts its agent.
    fn start(o: &DOpts, datafile: &Path) -> Res<Cascade> {
        let writer = Path::new("/var/tmp").join(format!("{}-ckptwriter", prefix(o.pid)));
        compile(&o.cc, WRITER_C, &writer)?;
        let bin = private_cli(&o.cascade, o.pid)?;
        let capacity = o.capacity.to_string();
        let env = [
            ("CASCADE_STORE", o.store.as_str()),
            ("CASCADE_DURABLE", &o.url),
            ("CASCADE_CAPACITY", &capacity),
            ("CASCADE_SPILL_SIZE", "0"),
            ("CASCADE_MOUNT", &o.mount),
        ];
        let mut node = Node::init(&bin, &env, &[])?;
        node.start_agent(&["--durable", &o.url], &[])?;
        let (mount, datafile, link_dev) =
            (o.mount.clone(), datafile.to_path_buf(), o.link_dev.clone());
        Ok(Cascade {
            node,
            mount,
            writer,
            datafile,
            piece: o.piece,
            wait_timeout_s: o.wait_timeout_s,
            link_dev,
        })
    }

    /// One checkpoint: write + commit under `cascade run`, then `cascade wait` until durable.
    fn measure(
        &mut self,
        durable: &DurableStore,
        size: u64,
        n: usize,
        via: Commit,
    ) -> Res<CascadeSample> {
        self.node.alive()?;
        let name = format!("ckpt{n:03}");
        let store_path = format!("/{name}");
        clear_remote(durable, &name)?;
        settle();
        let watch = WireWatch::start(&self.link_dev);
        let (writer, data) = (&self.writer, &self.datafile);
        let w = run_ckptwriter(
            &self.node,
            writer,
            &self.mount,
            &name,
            size,
            self.piece,
            data,
            via.arg(),
        )?;
        let durable_at = self
            .node
            .wait_level(&store_path, "durable", self.wait_timeout_s);
        let wire = watch.and_then(|w| w.finish());
        let durable_at = durable_at?;
        let until_marker = durable
            .read_marker(&name)
            .ok()
            .flatten()
            .map(|m| (m.completed_unix_ns as f64 - w.start_unix_ns as f64) / 1e9);
        if until_marker.is_none() {
            eprintln!("  note: no completion marker at {name}/ after cascade wait returned");
        }
        if let Err(e) = self.node.run_ok(&["rm", "-r", &store_path]) {
            eprintln!("  warning: {e}");
        }
        clear_remote(durable, &name)?;
        Ok(CascadeSample {
            stall: (w.committed_ns - w.start_ns) as f64 / 1e9,
            write: (w.written_ns - w.start_ns) as f64 / 1e9,
            commit: (w.committed_ns - w.written_ns) as f64 / 1e9,
            until_durable: (durable_at - w.start_ns) as f64 / 1e9,
            until_marker,
            wire_start: wire.map(|(a, _)| (a as f64 - w.start_ns as f64) / 1e9),
            wire_end: wire.map(|(_, b)| (b as f64 - w.start_ns as f64) / 1e9),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Results and report.

#[derive(Debug, Clone, Serialize)]
pub struct CascadeRow {
    pub commit_via: Commit,
    /// write + close + commit, as the writer timed it.
    pub stall_s: Stats,
    pub write_s: Stats,
    pub commit_s: Stats,
    /// From the start of the write until `cascade wait --level durable` returned.
    pub until_durable_s: Stats,
    /// From the start of the write until the marker's own timestamp (completed_unix_ns).
    pub until_marker_s: Option<Stats>,
    /// From the start of the write until the upload's data started (first 64 KiB) and
    /// finished (99 % of the bytes) going over the link.
    pub wire_start_s: Option<Stats>,
    pub wire_end_s: Option<Stats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeRow {
    pub bytes: u64,
    pub direct_s3_s: Stats,
    /// When 99 % of the bytes of the direct-s3 upload had gone over the link.
    pub direct_s3_wire_s: Option<Stats>,
    /// write(2) + fsync + close.
    pub direct_dir_s: Stats,
    /// write(2) only.
    pub direct_dir_write_s: Stats,
    /// One row per commit variant measured.
    pub cascade: Vec<CascadeRow>,
    pub link_min_nominal_s: Option<f64>,
    pub link_min_measured_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CascadeStatus {
    /// "measured", "not available" or "failed".
    pub state: String,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct DResults {
    pub link: LinkInfo,
    pub cascade: CascadeStatus,
    pub sizes: Vec<SizeRow>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    pub s3_server: String,
    /// The cascade CLI and the preload library measured (copied at the start of the run).
    pub cascade_cli: String,
    pub library: String,
    pub options: &'a DOpts,
    pub results: &'a DResults,
}

#[derive(Default)]
struct Samples {
    s3: Vec<f64>,
    s3_wire: Vec<f64>,
    dir: Vec<f64>,
    dir_write: Vec<f64>,
    cascade: Vec<(Commit, CascadeSample)>,
}

#[derive(Clone, Copy)]
enum Method {
    S3,
    Dir,
    Cascade(Commit),
}

fn run_all(o: &DOpts, data: &[u8], datafile: &Path) -> Res<DResults> {
    eprintln!("link: measuring TCP goodput host -> {}", o.netns);
    let ip = endpoint_ip(&o.url).map_err(|e| e.0);
    let (bytes, reps) = (o.linktest_bytes, o.reps);
    let link = measure_link("host → S3", &o.netns, &o.link_dev, ip, data, bytes, reps);
    let durable = DurableStore::open(&o.url).ctx(|| "opening the durable store")?;
    let mut status = CascadeStatus {
        state: "measured".into(),
        detail: String::new(),
    };
    let mut cascade = match Cascade::unavailable(&o.cascade) {
        Some(why) => {
            eprintln!("cascade: not available: {why}; measuring the baselines only");
            status = CascadeStatus {
                state: "not available".into(),
                detail: why,
            };
            None
        }
        None => match Cascade::start(o, datafile) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("cascade: failed to start: {e}");
                status = CascadeStatus {
                    state: "failed".into(),
                    detail: e.0,
                };
                None
            }
        },
    };
    let dir = o.disk_dir.join(format!("{}-direct", prefix(o.pid)));
    let mut samples: Vec<Samples> = o.sizes.iter().map(|_| Samples::default()).collect();
    let mut n = 0usize;
    let mut methods = vec![Method::S3, Method::Dir];
    methods.extend(o.commit.iter().map(|&c| Method::Cascade(c)));
    for rep in 0..o.reps {
        for (si, &size) in o.sizes.iter().enumerate() {
            let bytes = &data[..size as usize];
            for k in 0..methods.len() {
                match methods[(rep + k) % methods.len()] {
                    Method::S3 => {
                        let name = format!("{}-direct-{}", prefix(o.pid), size / MIB);
                        let (s, wire) = direct_s3(&durable, bytes, &name, &o.link_dev)?;
                        samples[si].s3_wire.extend(wire);
                        eprintln!(
                            "  rep {}/{} {}: direct-s3 {s:.2} s ({:.3} GB/s)",
                            rep + 1,
                            o.reps,
                            size_str(size),
                            gbps(size, (s * 1e9) as u64)
                        );
                        samples[si].s3.push(s);
                    }
                    Method::Dir => {
                        let (w, s) = direct_dir(&dir, bytes, o.piece as usize)?;
                        eprintln!(
                            "  rep {}/{} {}: direct-dir {s:.2} s (write {w:.2} s)",
                            rep + 1,
                            o.reps,
                            size_str(size)
                        );
                        samples[si].dir.push(s);
                        samples[si].dir_write.push(w);
                    }
                    Method::Cascade(via) => {
                        let Some(c) = cascade.as_mut() else { continue };
                        n += 1;
                        match c.measure(&durable, size, n, via) {
                            Ok(x) => {
                                eprintln!(
                                    "  rep {}/{} {}: cascade ({}) stall {:.2} s (write {:.2} s, commit {:.2} s), durable after {:.2} s",
                                    rep + 1,
                                    o.reps,
                                    size_str(size),
                                    commit_label(via),
                                    x.stall,
                                    x.write,
                                    x.commit,
                                    x.until_durable
                                );
                                samples[si].cascade.push((via, x));
                            }
                            Err(e) => {
                                eprintln!("cascade: {e}; measuring the baselines only from here");
                                status = CascadeStatus {
                                    state: "failed".into(),
                                    detail: e.0,
                                };
                                cascade = None;
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(mut c) = cascade.take() {
        if let Err(e) = c.node.stop() {
            eprintln!("cascade: {e}");
            if status.state == "measured" {
                status = CascadeStatus {
                    state: "failed".into(),
                    detail: e.0,
                };
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let goodput = link.goodput.as_ref().map(|g| g.median);
    let sizes = o
        .sizes
        .iter()
        .zip(samples)
        .map(|(&bytes, s)| {
            let cascade = o
                .commit
                .iter()
                .filter_map(|&via| {
                    let xs: Vec<&CascadeSample> = s
                        .cascade
                        .iter()
                        .filter(|(v, _)| *v == via)
                        .map(|(_, x)| x)
                        .collect();
                    if xs.is_empty() {
                        return None;
                    }
                    let col = |f: fn(&CascadeSample) -> f64| {
                        Stats::of(&xs.iter().map(|x| f(x)).collect::<Vec<_>>())
                    };
                    let opt = |f: fn(&CascadeSample) -> Option<f64>| {
                        let v: Vec<f64> = xs.iter().filter_map(|x| f(x)).collect();
                        (!v.is_empty()).then(|| Stats::of(&v))
                    };
                    Some(CascadeRow {
                        commit_via: via,
                        stall_s: col(|x| x.stall),
                        write_s: col(|x| x.write),
                        commit_s: col(|x| x.commit),
                        until_durable_s: col(|x| x.until_durable),
                        until_marker_s: opt(|x| x.until_marker),
                        wire_start_s: opt(|x| x.wire_start),
                        wire_end_s: opt(|x| x.wire_end),
                    })
                })
                .collect();
            SizeRow {
                bytes,
                direct_s3_s: Stats::of(&s.s3),
                direct_s3_wire_s: (!s.s3_wire.is_empty()).then(|| Stats::of(&s.s3_wire)),
                direct_dir_s: Stats::of(&s.dir),
                direct_dir_write_s: Stats::of(&s.dir_write),
                cascade,
                link_min_nominal_s: link.nominal_bytes_per_s.map(|r| bytes as f64 / r),
                link_min_measured_s: goodput.map(|g| bytes as f64 / g),
            }
        })
        .collect();
    if status.state == "measured" && o.sizes.is_empty() {
        status.state = "not run".into();
    }
    Ok(DResults {
        link,
        cascade: status,
        sizes,
    })
}

fn commit_label(via: Commit) -> &'static str {
    match via {
        Commit::Cli => "`cascade commit`",
        Commit::Lib => "cascade_commit()",
    }
}

fn opt_s(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".into(), |x| format!("{x:.2}"))
}

fn tables(rep: &Report) -> Md {
    let o = rep.options;
    let r = rep.results;
    let l = &r.link;
    let mut s = Md::default();
    match r.cascade.state.as_str() {
        "measured" => {}
        "not available" => {
            s.verdict(format!(
                "**Cascade rows: not available** — {}. The baselines and the link were measured.",
                r.cascade.detail
            ));
        }
        _ => {
            s.verdict(format!(
                "**Cascade rows: {}** — {}",
                r.cascade.state, r.cascade.detail
            ));
        }
    }

    s.title("Checkpoint time".into());
    s.head(&format!("| checkpoint | direct-s3 stall, s (GB/s) | direct-dir stall, s (GB/s) | cascade, committed with | cascade stall, s (GB/s) | stall ratio direct-s3 / cascade | cascade time until durable, s | link minimum, s (nominal / measured goodput) | until durable / link minimum (nominal / measured) | target ≤ {TARGET_RATIO} |"));
    let na = if r.cascade.state == "measured" {
        "n/a"
    } else {
        "not available"
    };
    for row in &r.sizes {
        let b = row.bytes;
        let head = format!(
            "| {} | {} | {} |",
            size_str(b),
            secs_gbps(&row.direct_s3_s, b),
            secs_gbps(&row.direct_dir_s, b)
        );
        let link = format!(
            "{} / {}",
            opt_s(row.link_min_nominal_s),
            opt_s(row.link_min_measured_s)
        );
        if row.cascade.is_empty() {
            s.row(format!(
                "{head} {na} | {na} | {na} | {na} | {link} | {na} | {na} |"
            ));
        }
        for c in &row.cascade {
            let tud = c.until_durable_s.median;
            let rn = row.link_min_nominal_s.and_then(|m| ratio(tud, Some(m)));
            let rm = row.link_min_measured_s.and_then(|m| ratio(tud, Some(m)));
            let met = match rn {
                Some(x) if x <= TARGET_RATIO => "**yes**",
                Some(_) => "**NO**",
                None => "n/a",
            };
            s.row(format!(
                "{head} {} | {} | {} | {} | {link} | {} / {} | {met} |",
                commit_label(c.commit_via),
                secs_gbps(&c.stall_s, b),
                x(ratio(row.direct_s3_s.median, Some(c.stall_s.median))),
                secs(&c.until_durable_s),
                x_prec(rn, 3),
                x_prec(rm, 3)
            ));
        }
    }
    s.title("Where the time goes".into());
    s.head("| checkpoint | direct-s3 GB/s (share of nominal) | direct-s3 on the wire until, s | direct-s3 after that, s | direct-dir write only, s |");
    for row in &r.sizes {
        let s3_rate = row.bytes as f64 / row.direct_s3_s.median;
        let vs = l
            .nominal_bytes_per_s
            .map_or_else(|| "n/a".into(), |n| format!("{:.1} %", 100.0 * s3_rate / n));
        let (wire, after) = match &row.direct_s3_wire_s {
            Some(w) => (secs(w), format!("{:.2}", row.direct_s3_s.median - w.median)),
            None => ("n/a".into(), "n/a".into()),
        };
        s.row(format!(
            "| {} | {:.3} ({vs}) | {wire} | {after} | {} |",
            size_str(row.bytes),
            s3_rate / 1e9,
            secs(&row.direct_dir_write_s)
        ));
    }
    let any_cascade = r.sizes.iter().any(|x| !x.cascade.is_empty());
    if any_cascade {
        s.title("Where the time goes: cascade".into());
        s.head("| checkpoint | committed with | write + close, s | commit, s | upload on the wire from, s | on the wire until, s | marker written, s | `cascade wait` returned, s | until durable / direct-s3 stall |");
        let o_s = |x: &Option<Stats>| x.as_ref().map_or_else(|| "n/a".into(), secs);
        for row in &r.sizes {
            for c in &row.cascade {
                s.row(format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    size_str(row.bytes),
                    commit_label(c.commit_via),
                    secs(&c.write_s),
                    secs(&c.commit_s),
                    o_s(&c.wire_start_s),
                    o_s(&c.wire_end_s),
                    o_s(&c.until_marker_s),
                    secs(&c.until_durable_s),
                    x(ratio(
                        c.until_durable_s.median,
                        Some(row.direct_s3_s.median)
                    ))
                ));
            }
        }
    }

    s.push(links_table(std::slice::from_ref(l)));

    let m = &rep.header.machine;
    let store = format!(
        "{}, {} memory, no spill file, mount {}",
        o.store,
        size_str(o.capacity),
        o.mount
    );
    s.push(machine_table(
        &rep.header,
        vec![
            (
                format!("direct-dir baseline ({})", o.disk_dir.display()),
                m.disk_fs.clone(),
            ),
            (
                "durable store".into(),
                format!("{} ({})", o.durable, rep.s3_server),
            ),
            (
                "CPU of the S3 server (not counted below)".into(),
                format!("{} % of all cores", num(rep.header.s3_server_cpu_pct, 1)),
            ),
            ("cascade CLI".into(), rep.cascade_cli.clone()),
            ("preload library".into(), rep.library.clone()),
            ("node store".into(), store),
        ],
    ));
    s
}

pub fn run(mut o: DOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve(pid)?;
    let dirs = vec![PathBuf::from("/var/tmp"), o.disk_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs.clone(), &o.out)?;
    let clock = RunClock::start(&o.disk_dir, &o.disk_dir);
    eprintln!(
        "cascade-bench durable: durable store {}; sizes {}",
        o.durable,
        o.sizes
            .iter()
            .map(|&b| size_str(b))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The checkpoint data, once: a /dev/shm file (the C writer maps it too), filled with a
    // non-zero xorshift pattern (not compressible).
    let max = o.sizes.iter().copied().max().unwrap_or(0);
    let datafile = PathBuf::from(format!("/dev/shm/{}-ckptdata", prefix(pid)));
    let map = data_file(&datafile, max, 0x5eed_d00d_cafe_f00d)?;
    let results = run_all(&o, &map, &datafile)?;
    drop(map);
    let dirs = [
        "crates/cascade-durable",
        "crates/cascade-agent",
        "crates/cascade-cli",
        "crates/cascade-store",
        "crates/cascade-preload",
        "bench",
    ];
    let rep = Report {
        suite: "durable",
        header: clock.finish(&dirs),
        s3_server: s3_server(),
        cascade_cli: report::describe(&o.cascade),
        library: report::describe(&o.cascade.with_file_name("libcascade.so")),
        options: &o,
        results: &results,
    };
    let md = tables(&rep);
    let title = "Cascade: application-perceived checkpoint time with a throttled durable store";
    report::write(&o.out, "durable", title, &rep, md)?;
    if results.cascade.state == "failed" {
        return err(format!(
            "the cascade runs failed: {}",
            results.cascade.detail
        ));
    }
    Ok(())
}
