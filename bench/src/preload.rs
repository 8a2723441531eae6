//! The interposition benchmarks (issue 3): `pio` (bench/preload/pio.c), a small C program
//! doing plain POSIX I/O, runs with LD_PRELOAD=libcascade.so against files under the Cascade
//! mount, and without the library against tmpfs (/dev/shm). The store API (`File::write_at`,
//! the Rust children of the node-store benchmarks) and memcpy into pre-faulted shared memory
//! are measured in the same run. See bench/README.md.

use crate::child::Job;
use crate::format::{count, count_st, pct_change, ratio, st, st_prec, x};
use crate::harness::{job_command, median_setup, phase_span, run_commands, Names, Outcome, Rounds};
use crate::report::{Header, Table, Target};
use crate::stores::{
    capacity_for, tight_pair_with, with_store_files, Creation, ReadbackFiles, ShmBase, TightPair,
};
use crate::util::{check_mount, err, gbps, prefix, size_str, Context, Res, Stats, KIB, MIB};
use cascade_store::Store;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The parts of the interposition suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    Writes,
    Small,
    Replay,
    Meta,
    Readback,
    Passthrough,
    /// Instructions per call through the library, counted by callgrind (needs valgrind).
    PathLength,
}

/// The options (`cascade-bench interposition --help`); the fields without an `arg` are
/// derived by [`POpts::resolve`].
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct POpts {
    /// Directory for interposition.md and interposition.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    pub out: PathBuf,
    /// Quick run (about a minute): 256 MiB per process, 1 repetition, a quarter of the calls
    /// (10000 replayed writes, 5000 metadata files, 2 pass-through pairs). Explicit flags
    /// override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Benchmarks to run.
    #[arg(
        long = "only",
        value_enum,
        value_delimiter = ',',
        default_value = "writes,small,replay,meta,readback,passthrough,path-length"
    )]
    pub parts: Vec<Part>,
    /// Bytes per process in MiB of the 1 MiB writes and the restart reads.
    #[arg(long, default_value_t = 1024, default_value_if("quick", "true", "256"))]
    #[serde(skip)]
    size_mib: u64,
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 5, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub procs: Vec<usize>,
    /// The preloaded library.
    #[arg(long, default_value = "target/release/libcascade.so")]
    pub lib: PathBuf,
    /// The C compiler for bench/preload/pio.c.
    #[arg(long, default_value = "cc")]
    pub cc: String,
    /// The Cascade mount prefix (CASCADE_MOUNT) the C program's paths go under.
    #[arg(long, default_value = "/cascade")]
    pub mount: String,
    /// Writes in the replayed checkpoint write mix (40000: about 950 MB).
    #[arg(
        long,
        default_value_t = 40_000,
        default_value_if("quick", "true", "10000")
    )]
    pub replay_writes: usize,
    /// Files per process in the metadata benchmark.
    #[arg(
        long,
        default_value_t = 20_000,
        default_value_if("quick", "true", "5000")
    )]
    pub meta_files: u64,
    /// stat() passes over those files.
    #[arg(long, default_value_t = 3)]
    pub meta_passes: u64,
    /// Files per process in the mdtest-style run (create empty, stat, remove).
    #[arg(
        long,
        default_value_t = 10_000,
        default_value_if("quick", "true", "2500")
    )]
    pub mdtest_files: u64,
    /// Pairs (with and without the library) in the pass-through benchmark.
    #[arg(long, default_value_t = 9, default_value_if("quick", "true", "2"))]
    pub pass_reps: usize,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    /// Bytes per process of the 1 MiB writes and the read-back.
    #[arg(skip)]
    pub size: u64,
    #[arg(skip = MIB)]
    pub io: u64,
    /// (write size, calls) of the write-size sweep (benchmark 2).
    #[arg(skip)]
    pub sweep: Vec<(u64, u64)>,
    #[arg(skip)]
    pub pass_calls64: u64,
    #[arg(skip)]
    pub pass_calls4k: u64,
    #[arg(skip = 256 * KIB)]
    pub pass_region: u64,
}

impl POpts {
    /// Checks the options and derives the byte sizes and the call counts (a quarter of them
    /// with --quick).
    pub fn resolve(&mut self, pid: u32) -> Res<()> {
        (self.pid, self.size) = (pid, self.size_mib * MIB);
        if self.size == 0 || self.size % self.io != 0 {
            return err("--size-mib must be positive");
        }
        if self.procs.is_empty() || self.procs.contains(&0) {
            return err("--procs needs positive process counts");
        }
        check_mount(&self.mount)?;
        self.mount = self.mount.trim_end_matches('/').to_string();
        let div = if self.quick { 4 } else { 1 };
        // Calls per write size: 512 Ki, but at most 256 MiB per file.
        let sizes = [64, 256, KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB];
        self.sweep = sizes
            .map(|s| (s, (512 * KIB).min(256 * MIB / s) / div))
            .to_vec();
        (self.pass_calls64, self.pass_calls4k) = (200_000 / div, 150_000 / div);
        (self.reps, self.pass_reps) = (self.reps.max(1), self.pass_reps.max(1));
        self.meta_passes = self.meta_passes.max(1);
        Ok(())
    }
}

/// One measured configuration: aggregate GB/s and calls/s over the processes, and the mean
/// time per call inside one process (median [min-max] over the repetitions).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub method: String,
    pub procs: usize,
    /// Bytes per call where it is one size (sweep, 1 MiB writes and reads), else 0.
    pub io: u64,
    pub gbps: Stats,
    pub calls_per_s: Stats,
    pub ns_per_call: Stats,
    /// Median set-up time per process before the start barrier.
    pub setup_s: f64,
}

/// A ratio of two methods taken within each repetition.
#[derive(Debug, Clone, Serialize)]
pub struct RepRatio {
    pub what: String,
    pub procs: usize,
    pub ratio: Stats,
}

/// The C program's paired runs: the preload phase and memcpy-shm alternating in the same
/// processes.
#[derive(Debug, Clone, Serialize)]
pub struct CPair {
    pub kind: String,
    pub procs: usize,
    pub preload_gbps: Stats,
    pub memcpy_shm_gbps: Stats,
    /// preload / memcpy-shm within each round.
    pub ratio: Stats,
}

/// preload / store API, both normalised by memcpy-shm in their own paired runs.
#[derive(Debug, Clone, Serialize)]
pub struct Normalised {
    pub kind: String,
    pub procs: usize,
    /// (preload / memcpy-shm) / (store API / memcpy-shm), medians.
    pub ratio: f64,
    /// The same from the extremes of both ranges (worst and best case).
    pub low: f64,
    pub high: f64,
}

/// One size class of the replayed write mix: the paper's shares and the generated ones.
#[derive(Debug, Clone, Serialize)]
pub struct MixRow {
    pub class: String,
    pub paper_writes_pct: f64,
    pub paper_data_pct: f64,
    pub writes: u64,
    pub bytes: u64,
    pub writes_pct: f64,
    pub data_pct: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetaRow {
    pub method: String,
    pub procs: usize,
    pub files: u64,
    pub create_per_s: Stats,
    pub stat_per_s: Stats,
    pub unlink_per_s: Stats,
    /// Per process: microseconds per create+write+close.
    pub create_us: Stats,
    /// Per process: nanoseconds per stat.
    pub stat_ns: Stats,
}

/// One mdtest-style run: aggregate operations per second over the processes.
#[derive(Debug, Clone, Serialize)]
pub struct MdtestRow {
    pub method: String,
    pub procs: usize,
    /// "own" (a directory per process) or "shared" (one directory for all).
    pub layout: String,
    pub files: u64,
    pub create_per_s: Stats,
    pub stat_per_s: Stats,
    pub remove_per_s: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct PassRow {
    pub op: String,
    pub calls: u64,
    pub plain_ns: Stats,
    pub preload_ns: Stats,
    /// preload / plain within each pair.
    pub ratio: Stats,
}

/// Instructions one call executes in user space, counted by callgrind: the length of the
/// library's path, the same on every CPU of the architecture (but for libc's `memcpy`,
/// whose variant glibc picks by CPU, on the calls that use it).
#[derive(Debug, Clone, Serialize)]
pub struct PathRow {
    pub call: String,
    pub io: u64,
    pub calls: u64,
    pub instructions_per_call: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PResults {
    pub creation: Vec<Creation>,
    pub writes: Vec<Row>,
    pub c_pairs: Vec<CPair>,
    pub store_pairs: Vec<TightPair>,
    pub normalised: Vec<Normalised>,
    pub rep_ratios: Vec<RepRatio>,
    pub sweep: Vec<Row>,
    pub mix: Vec<MixRow>,
    pub replay: Vec<Row>,
    pub meta: Vec<MetaRow>,
    pub mdtest: Vec<MdtestRow>,
    pub read_sweep: Vec<Row>,
    pub readback: Vec<Row>,
    pub passthrough: Vec<PassRow>,
    pub path_length: Vec<PathRow>,
    pub core_probe: Vec<ProbeRow>,
}

/// One method's sweep phases of one size with the core probe taken before each: how much of
/// its core the slowest process had (bench/README.md, "Core sharing").
#[derive(Debug, Clone, Serialize)]
pub struct ProbeRow {
    pub method: String,
    pub procs: usize,
    pub io: u64,
    pub read: bool,
    /// (ns per call, the slowest process's probe in ns per round), one per repetition.
    pub reps: Vec<(f64, f64)>,
}

/// A probe within this factor of the run's fastest counts as the core to itself.
const PROBE_FULL_CORE: f64 = 1.15;

impl PResults {
    /// Every core probe of the run, ns per round.
    fn probes(&self) -> impl Iterator<Item = f64> + '_ {
        self.core_probe
            .iter()
            .flat_map(|r| r.reps.iter().map(|&(_, probe)| probe))
    }

    /// The fastest core probe of the run: the machine with a physical core to itself.
    fn fastest_probe(&self) -> Option<f64> {
        self.probes().min_by(f64::total_cmp)
    }

    /// Median ns per call of `method`'s `io`-byte writes over the repetitions whose probe
    /// found the core to itself, and how many of all they were.
    fn ns_on_a_full_core(
        &self,
        method: &str,
        procs: usize,
        io: u64,
    ) -> Option<(f64, usize, usize)> {
        let fastest = self.fastest_probe()?;
        let row = self
            .core_probe
            .iter()
            .find(|r| !r.read && r.method == method && r.procs == procs && r.io == io)?;
        let full: Vec<f64> = row
            .reps
            .iter()
            .filter(|&&(_, probe)| probe <= fastest * PROBE_FULL_CORE)
            .map(|&(ns, _)| ns)
            .collect();
        (!full.is_empty()).then(|| (Stats::of(&full).median, full.len(), row.reps.len()))
    }
}

/// The compiled C program and how to run it.
pub struct Pio {
    exe: PathBuf,
    /// The private copy that is preloaded, and where it came from.
    lib: PathBuf,
    lib_src: PathBuf,
    mount: String,
    pub cc_version: String,
}

impl Pio {
    /// Compiles bench/preload/pio.c (embedded) with `cc -O2` into /var/tmp, named after the
    /// run so that the cleanup removes it.
    pub fn build(opts: &POpts) -> Res<Pio> {
        let base = Path::new("/var/tmp").join(format!("{}-pio", prefix(opts.pid)));
        crate::procs::compile(&opts.cc, include_str!("../preload/pio.c"), &base)?;
        let cc_version = Command::new(&opts.cc)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(str::to_string))
            .unwrap_or_else(|| "unknown".into());
        if !opts.lib.is_file() {
            let _ = std::fs::remove_file(&base);
            return err(format!(
                "{} does not exist: build it with `cargo build --release -p cascade-preload` or pass --lib",
                opts.lib.display()
            ));
        }
        // Preload a private copy: a rebuild of the workspace during the run must not swap the
        // library (and perhaps the store layout) under the later measurements.
        let lib = Path::new("/var/tmp").join(format!("{}-libcascade.so", prefix(opts.pid)));
        if let Err(e) = std::fs::copy(&opts.lib, &lib) {
            let _ = std::fs::remove_file(&base);
            return err(format!(
                "copying {} to {}: {e}",
                opts.lib.display(),
                lib.display()
            ));
        }
        Ok(Pio {
            exe: base,
            lib,
            lib_src: opts.lib.clone(),
            mount: opts.mount.clone(),
            cc_version,
        })
    }

    /// `pio MODE key=value...`, with the library preloaded and pointed at `store` when given,
    /// and with no Cascade variables at all otherwise.
    fn cmd(&self, store: Option<&str>, mode: &str, args: &[(&str, String)]) -> Command {
        self.cmd_under(&[], store, mode, args)
    }

    /// [`Self::cmd`] run by the program and arguments `wrapper` (a tool such as valgrind).
    fn cmd_under(
        &self,
        wrapper: &[String],
        store: Option<&str>,
        mode: &str,
        args: &[(&str, String)],
    ) -> Command {
        let mut c = match wrapper.split_first() {
            Some((tool, tool_args)) => {
                let mut c = Command::new(tool);
                c.args(tool_args).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        c.arg(mode);
        for (k, v) in args {
            c.arg(format!("{k}={v}"));
        }
        for var in [
            "LD_PRELOAD",
            "CASCADE_STORE",
            "CASCADE_MOUNT",
            "CASCADE_CWD",
        ] {
            c.env_remove(var);
        }
        if let Some(store) = store {
            c.env("LD_PRELOAD", &self.lib)
                .env("CASCADE_STORE", store)
                .env("CASCADE_MOUNT", &self.mount);
        }
        c
    }

    /// Checks that the library really serves the mount from `st`: pio creates a file under
    /// the mount, which must then be in the store (and the host path must not exist). Without
    /// this, a library that fails to interpose would send the "preload" runs to a host
    /// directory of that name, if there is one.
    fn check_interception(&self, st: &Store) -> Res<()> {
        let name = format!("/probe-{}", std::process::id());
        let host = format!("{}{name}", self.mount);
        let out = self
            .cmd(Some(st.name()), "probe", &[("path", host.clone())])
            .output()
            .ctx(|| "running pio probe")?;
        if !out.status.success() {
            return err(format!(
                "pio could not create {host} with the library preloaded: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let in_store = st.stat(&name).map(|m| m.size);
        let _ = st.unlink(&name);
        if Path::new(&host).exists() {
            let _ = std::fs::remove_file(&host);
            return err(format!(
                "{} did not interpose: pio's {host} went to the host file system",
                self.lib_src.display()
            ));
        }
        match in_store {
            Ok(4096) => Ok(()),
            Ok(n) => err(format!("{name} has {n} bytes in the store, expected 4096")),
            Err(e) => err(format!(
                "{host} is not in the store {} ({e}): the library does not serve the mount",
                st.name()
            )),
        }
    }

    fn warm(&self) -> (&'static str, String) {
        ("warm", self.mount.clone())
    }

    fn path(&self, rest: &str) -> String {
        format!("{}/{rest}", self.mount)
    }
}

impl Drop for Pio {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.exe);
        let _ = std::fs::remove_file(&self.lib);
    }
}

fn run(cmds: Vec<Command>, what: impl FnOnce() -> String) -> Res<Outcome> {
    run_commands(cmds).ctx(what)
}

fn last_end(out: &Outcome) -> u64 {
    out.children
        .iter()
        .map(|c| c.end_ns)
        .max()
        .unwrap_or(out.t0)
}

fn calls_per_s(out: &Outcome) -> f64 {
    let calls: u64 = out.children.iter().map(|c| c.calls).sum();
    calls as f64 * 1e9 / last_end(out).saturating_sub(out.t0).max(1) as f64
}

/// Mean over the processes of (time in the timed part) / (calls made).
fn ns_per_call(out: &Outcome) -> f64 {
    let v: Vec<f64> = out
        .children
        .iter()
        .map(|c| c.end_ns.saturating_sub(c.start_ns) as f64 / c.calls.max(1) as f64)
        .collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Collects per-method samples of whole-run measurements.
#[derive(Default)]
struct Samples {
    gbps: BTreeMap<String, Vec<f64>>,
    cps: BTreeMap<String, Vec<f64>>,
    ns: BTreeMap<String, Vec<f64>>,
    outs: BTreeMap<String, Vec<Outcome>>,
}

impl Samples {
    fn add(&mut self, m: &str, out: Outcome) {
        self.gbps.entry(m.into()).or_default().push(out.gbps());
        self.cps
            .entry(m.into())
            .or_default()
            .push(calls_per_s(&out));
        self.ns.entry(m.into()).or_default().push(ns_per_call(&out));
        self.outs.entry(m.into()).or_default().push(out);
    }

    fn row(&self, m: &str, procs: usize, io: u64) -> Row {
        let get = |t: &BTreeMap<String, Vec<f64>>| Stats::of(t.get(m).map_or(&[][..], |v| &v[..]));
        Row {
            method: m.to_string(),
            procs,
            io,
            gbps: get(&self.gbps),
            calls_per_s: get(&self.cps),
            ns_per_call: get(&self.ns),
            setup_s: self.outs.get(m).map_or(0.0, |o| median_setup(o)),
        }
    }

    /// a / b within each repetition (GB/s).
    fn ratio(&self, a: &str, b: &str) -> Stats {
        let (Some(x), Some(y)) = (self.gbps.get(a), self.gbps.get(b)) else {
            return Stats::of(&[]);
        };
        Stats::of(&x.iter().zip(y).map(|(x, y)| x / y).collect::<Vec<_>>())
    }
}

fn say(section: &str, what: &str, procs: usize, rep: usize, reps: usize, out: &Outcome) {
    let calls = if out.children.iter().all(|c| c.calls > 0) {
        format!(
            ", {:>10.0} calls/s, {:9.1} ns/call",
            calls_per_s(out),
            ns_per_call(out)
        )
    } else {
        String::new()
    };
    eprintln!(
        "  [{section}] {what:<14} procs={procs} rep {}/{reps}: {:7.2} GB/s{calls}",
        rep + 1,
        out.gbps(),
    );
}

pub fn run_all(opts: &POpts, pio: &Pio) -> Res<PResults> {
    let mut res = PResults::default();
    let mut names = Names {
        pid: opts.pid,
        counter: 0,
    };
    let want = |p: Part| opts.parts.contains(&p);
    let max_procs = opts.procs.iter().copied().max().unwrap_or(1);
    let mut scratch: Vec<Creation> = Vec::new();
    let main_parts = [
        Part::Writes,
        Part::Small,
        Part::Replay,
        Part::Readback,
        Part::Passthrough,
        Part::PathLength,
    ];
    if main_parts.iter().any(|&p| want(p)) {
        // Big enough for every process's largest file: 1 GiB writes and read-back files, the
        // replayed checkpoint (under 1 GiB), the sweep's 256 MiB files.
        let replay_max = replay_bytes(opts.replay_writes);
        let needed = max_procs as u64 * opts.size.max(replay_max);
        eprintln!("main store:");
        with_store_files(
            &mut scratch,
            opts.pid,
            "ipmain",
            capacity_for(needed, MIB),
            MIB,
            4096,
            None,
            |_, st| {
                pio.check_interception(st)?;
                let base = ShmBase::create(opts.pid, max_procs as u64 * opts.size)?;
                if want(Part::Writes) {
                    writes(opts, pio, &mut res, &mut names, st, &base)?;
                }
                if want(Part::Small) {
                    small(opts, pio, &mut res, st, false)?;
                    small(opts, pio, &mut res, st, true)?;
                }
                if want(Part::Replay) {
                    replay(opts, pio, &mut res, &mut names, st)?;
                }
                if want(Part::Readback) {
                    readback(opts, pio, &mut res, st, &base)?;
                }
                if want(Part::Passthrough) {
                    passthrough(opts, pio, &mut res, &mut names, st)?;
                }
                if want(Part::PathLength) {
                    path_length(pio, &mut res, &mut names, st)?;
                }
                Ok(())
            },
        )?;
    }
    if want(Part::Meta) {
        // 4 KiB chunks, so that a 4 KiB file takes 4 KiB of memory as in tmpfs; creating a
        // file costs the same whatever the chunk size.
        let files = max_procs as u64 * opts.meta_files;
        eprintln!("metadata store:");
        with_store_files(
            &mut scratch,
            opts.pid,
            "ipmeta",
            capacity_for(files * 4 * KIB, 4 * KIB),
            4 * KIB,
            (files + 64).max(4096) as u32,
            None,
            |_, st| {
                pio.check_interception(st)?;
                meta(opts, pio, &mut res, &mut names, st)?;
                mdtest(opts, pio, &mut res, st)
            },
        )?;
    }
    res.creation = scratch;
    Ok(res)
}

/// The methods in the order repetition `rep` runs them: as listed on even repetitions,
/// reversed on odd ones, so that no method always runs first (or after the same one).
fn in_turn<'a>(methods: &[&'a str], rep: usize) -> Vec<&'a str> {
    let mut order = methods.to_vec();
    if rep % 2 == 1 {
        order.reverse();
    }
    order
}

// ---- 1. 1 MiB writes ----------------------------------------------------------------------

fn writes(
    opts: &POpts,
    pio: &Pio,
    res: &mut PResults,
    names: &mut Names,
    st: &Store,
    base: &ShmBase,
) -> Res<()> {
    let (bytes, io) = (opts.size, opts.io);
    eprintln!(
        "1. {} writes, {} per process:",
        size_str(io),
        size_str(bytes)
    );
    // preload and the store API back to back (which one first alternates), so that their
    // per-repetition ratio sees the same machine state.
    let order = |rep: usize| {
        if rep % 2 == 0 {
            [
                "tmpfs",
                "preload-cold",
                "memcpy-shm",
                "preload",
                "store-api",
            ]
        } else {
            [
                "tmpfs",
                "preload-cold",
                "memcpy-shm",
                "store-api",
                "preload",
            ]
        }
    };
    let methods = [
        "preload",
        "store-api",
        "memcpy-shm",
        "tmpfs",
        "preload-cold",
    ];
    for &p in &opts.procs {
        let mut s = Samples::default();
        for rep in 0..opts.reps {
            for m in order(rep) {
                let mut cmds = Vec::with_capacity(p);
                for i in 0..p {
                    let a = |path: String| {
                        vec![
                            ("path", path),
                            ("bytes", bytes.to_string()),
                            ("io", io.to_string()),
                        ]
                    };
                    cmds.push(match m {
                        "preload" => {
                            let mut v = a(pio.path(&format!("w-p{i}-r{rep}.dat")));
                            v.push(pio.warm());
                            pio.cmd(Some(st.name()), "write", &v)
                        }
                        "preload-cold" => pio.cmd(
                            Some(st.name()),
                            "write",
                            &a(pio.path(&format!("wc-p{i}-r{rep}.dat"))),
                        ),
                        "tmpfs" => pio.cmd(
                            None,
                            "write",
                            &a(format!("/dev/shm/{}", names.next("tmpfs", i))),
                        ),
                        "memcpy-shm" => job_command(&Job::MemcpyShm {
                            bytes,
                            io,
                            shm: base.name.clone(),
                            offset: i as u64 * bytes,
                        })?,
                        _ => job_command(&Job::StoreWrite {
                            store: st.name().to_string(),
                            path: format!("/sw-p{i}-r{rep}.dat"),
                            bytes,
                            io,
                            sync: false,
                            fresh: false,
                            pages: false,
                        })?,
                    });
                }
                let out = run(cmds, || format!("writes: {m} with {p} processes"))?;
                say("writes", m, p, rep, opts.reps, &out);
                s.add(m, out);
            }
        }
        for m in methods {
            res.writes.push(s.row(m, p, io));
        }
        res.rep_ratios.push(RepRatio {
            what: "write preload/store-api".into(),
            procs: p,
            ratio: s.ratio("preload", "store-api"),
        });
        let pairs = opts.reps.max(3);
        let cp = c_pair(pio, st, base, p, false, bytes, io, pairs)?;
        let tp = tight_pair_with(st, base, p, false, bytes, io, pairs)?;
        res.normalised.push(normalise(&cp, &tp));
        res.c_pairs.push(cp);
        res.store_pairs.push(tp);
    }
    Ok(())
}

/// The C program's paired run: the preload phase and memcpy-shm taking turns, `pairs`
/// rounds, in `procs` processes.
#[allow(clippy::too_many_arguments)]
fn c_pair(
    pio: &Pio,
    st: &Store,
    base: &ShmBase,
    procs: usize,
    read: bool,
    bytes: u64,
    io: u64,
    pairs: usize,
) -> Res<CPair> {
    let cmds = (0..procs)
        .map(|i| {
            let path = if read {
                pio.path(&format!("rb-p{i}.dat"))
            } else {
                pio.path(&format!("pair-p{i}"))
            };
            pio.cmd(
                Some(st.name()),
                "paired",
                &[
                    ("path", path),
                    ("shm", base.name.clone()),
                    ("offset", (i as u64 * bytes).to_string()),
                    ("bytes", bytes.to_string()),
                    ("io", io.to_string()),
                    ("pairs", pairs.to_string()),
                    ("read", u8::from(read).to_string()),
                    pio.warm(),
                ],
            )
        })
        .collect();
    let kind = if read { "read" } else { "write" };
    let out = run(cmds, || format!("C paired {kind}s with {procs} processes"))?;
    let rounds = Rounds::of(&out, 2, pairs, bytes * procs as u64)?;
    let cp = CPair {
        kind: kind.into(),
        procs,
        preload_gbps: rounds.gbps("preload"),
        memcpy_shm_gbps: rounds.gbps("memcpy-shm"),
        ratio: rounds.ratio("preload", "memcpy-shm"),
    };
    eprintln!(
        "  [pairs] C {kind}s procs={procs}: preload {:.2}, memcpy-shm {:.2} GB/s; preload/memcpy-shm {:.2}x (medians of {pairs} rounds)",
        cp.preload_gbps.median, cp.memcpy_shm_gbps.median, cp.ratio.median
    );
    Ok(cp)
}

fn normalise(cp: &CPair, tp: &TightPair) -> Normalised {
    Normalised {
        kind: cp.kind.clone(),
        procs: cp.procs,
        ratio: cp.ratio.median / tp.ratio.median,
        low: cp.ratio.min / tp.ratio.max,
        high: cp.ratio.max / tp.ratio.min,
    }
}

// ---- 2. small writes: the write-size sweep ------------------------------------------------

/// The sizes of the small-read sweep (issue 24: 64 B and 4 KiB reads).
const READ_SIZES: [u64; 2] = [64, 4 * KIB];

/// Benchmark 2: per write size, a new file written with that size's calls; with `read`,
/// the 64 B and 4 KiB files are written untimed and read back (library and tmpfs only: the
/// store API's reads are the restart benchmark's).
fn small(opts: &POpts, pio: &Pio, res: &mut PResults, st: &Store, read: bool) -> Res<()> {
    let sweep: Vec<(u64, u64)> = if read {
        opts.sweep
            .iter()
            .copied()
            .filter(|(s, _)| READ_SIZES.contains(s))
            .collect()
    } else {
        opts.sweep.clone()
    };
    eprintln!(
        "2. {} sweep ({} to {}), one new file per size:",
        if read { "read-size" } else { "write-size" },
        size_str(sweep.first().map_or(0, |s| s.0)),
        size_str(sweep.last().map_or(0, |s| s.0))
    );
    let spec: String = sweep
        .iter()
        .map(|(s, c)| format!("{s}:{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let read_arg = ("read", if read { "1" } else { "0" }.to_string());
    // preload-rewrite: the same writes into files an exited process wrote (the next run of a
    // job rewriting the last one's files), whose locks that process's biases left behind.
    let methods: &[&'static str] = if read {
        &["preload", "tmpfs"]
    } else {
        &["preload", "preload-rewrite", "store-api", "tmpfs"]
    };
    for &p in &opts.procs {
        // Per size and method: GB/s, calls/s (aggregate) and ns/call (per process).
        type Acc = BTreeMap<(u64, &'static str), (Vec<f64>, Vec<f64>, Vec<f64>, Vec<(f64, f64)>)>;
        let mut acc: Acc = BTreeMap::new();
        let mut setups: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for rep in 0..opts.reps {
            let order = in_turn(methods, rep);
            for m in order {
                let mut cmds = Vec::with_capacity(p);
                for i in 0..p {
                    cmds.push(match m {
                        "preload" | "preload-rewrite" => pio.cmd(
                            Some(st.name()),
                            "sweep",
                            &[
                                ("path", pio.path(&format!("sweep-p{i}"))),
                                ("sizes", spec.clone()),
                                read_arg.clone(),
                                ("rewrite", u8::from(m == "preload-rewrite").to_string()),
                                pio.warm(),
                            ],
                        ),
                        "tmpfs" => pio.cmd(
                            None,
                            "sweep",
                            &[
                                ("path", format!("/dev/shm/{}-sweep-{i}", prefix(opts.pid))),
                                ("sizes", spec.clone()),
                                read_arg.clone(),
                            ],
                        ),
                        _ => job_command(&Job::StoreSweep {
                            store: st.name().to_string(),
                            path: format!("/ssweep-p{i}"),
                            sizes: opts.sweep.clone(),
                        })?,
                    });
                }
                let out = run(cmds, || format!("sweep: {m} with {p} processes"))?;
                let mut line = Vec::new();
                for (j, &(size, calls)) in sweep.iter().enumerate() {
                    let (_, span, per_proc) = phase_span(&out, j)?;
                    let e = acc.entry((size, m)).or_default();
                    e.0.push(gbps(size * calls * p as u64, span));
                    e.1.push((calls * p as u64) as f64 * 1e9 / span.max(1) as f64);
                    let ns_per_call = per_proc / calls.max(1) as f64;
                    e.2.push(ns_per_call);
                    let probe = out
                        .children
                        .iter()
                        .filter_map(|c| c.probe_ns.get(j).copied())
                        .max_by(f64::total_cmp);
                    if let Some(probe) = probe {
                        e.3.push((ns_per_call, probe));
                    }
                    line.push(format!("{}: {ns_per_call:.0} ns", size_str(size)));
                }
                setups
                    .entry(m)
                    .or_default()
                    .extend(out.children.iter().map(|c| c.setup_s));
                eprintln!(
                    "  [sweep] {m:<9} procs={p} rep {}/{}: {}",
                    rep + 1,
                    opts.reps,
                    line.join(", ")
                );
            }
        }
        for &(size, calls) in &sweep {
            for &m in methods {
                let Some((g, c, n, probed)) = acc.get(&(size, m)) else {
                    continue;
                };
                if !probed.is_empty() {
                    res.core_probe.push(ProbeRow {
                        method: m.to_string(),
                        procs: p,
                        io: size,
                        read,
                        reps: probed.clone(),
                    });
                }
                let rows = if read {
                    &mut res.read_sweep
                } else {
                    &mut res.sweep
                };
                rows.push(Row {
                    method: m.to_string(),
                    procs: p,
                    io: size,
                    gbps: Stats::of(g),
                    calls_per_s: Stats::of(c),
                    ns_per_call: Stats::of(n),
                    setup_s: Stats::of(setups.get(m).map_or(&[][..], |v| &v[..])).median,
                });
            }
            if size == 64 {
                let (Some(a), Some(b)) = (acc.get(&(size, "preload")), acc.get(&(size, "tmpfs")))
                else {
                    continue;
                };
                let r: Vec<f64> = a.1.iter().zip(&b.1).map(|(x, y)| x / y).collect();
                res.rep_ratios.push(RepRatio {
                    what: if read {
                        format!("{calls} x 64 B reads preload/tmpfs calls/s")
                    } else {
                        format!("{calls} x 64 B preload/tmpfs calls/s")
                    },
                    procs: p,
                    ratio: Stats::of(&r),
                });
            }
        }
    }
    Ok(())
}

// ---- 3. replay of a checkpoint's write-size mix ---------------------------------------------

/// Paper 001, Table 2 (BLCR checkpoint of NPB LU.C.64): size class (lowest and highest
/// size in bytes), % of writes, % of data. 975 writes and 184 MB per 8-process node, i.e.
/// 23 MB per process.
const TABLE2: [(&str, u64, u64, f64, f64); 10] = [
    ("0-64", 1, 64, 50.86, 0.04),
    ("64-256", 65, 256, 0.61, 0.00),
    ("256-1K", 257, 1024, 0.25, 0.01),
    ("1K-4K", 1025, 4096, 9.46, 1.53),
    ("4K-16K", 4097, 16384, 36.49, 11.36),
    ("16K-64K", 16385, 65536, 0.74, 0.77),
    ("64K-256K", 65537, 262_144, 0.49, 3.79),
    ("256K-512K", 262_145, 524_288, 0.25, 3.58),
    ("512K-1M", 524_289, 1_048_576, 0.61, 17.72),
    ("> 1M", 1_048_577, 16 * 1_048_576, 0.25, 61.21),
];
/// Bytes per write of the profiled checkpoint: 184 MB / 8 processes / 975 writes.
const TABLE2_BYTES_PER_WRITE: f64 = 184.0e6 / 8.0 / 975.0;

fn replay_bytes(writes: usize) -> u64 {
    (writes as f64 * TABLE2_BYTES_PER_WRITE * 1.01) as u64
}

/// A deterministic sequence of write sizes with Table 2's distribution: per class, round(%
/// of writes x n) writes whose sizes spread evenly (in antithetic pairs) around the class's
/// mean size (% of data x total / writes), clamped to the class; the last write of a class
/// takes the rounding remainder. Then shuffled (fixed seed), as a checkpoint interleaves
/// small headers with large data blocks.
pub fn replay_sizes(n: usize) -> (Vec<u32>, Vec<MixRow>) {
    let total = n as f64 * TABLE2_BYTES_PER_WRITE;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let counts: Vec<usize> = TABLE2
        .iter()
        .map(|c| (c.3 / 100.0 * n as f64).round() as usize)
        .collect();
    let mut sizes = Vec::with_capacity(n);
    let mut mix = Vec::new();
    for (k, &(class, lo, hi, pw, pd)) in TABLE2.iter().enumerate() {
        let cnt = counts[k].max(1);
        let (lo, hi) = (lo as f64, hi as f64);
        // A class with 0.00 % of the data: its geometric middle.
        let mean = if pd > 0.0 {
            (pd / 100.0 * total / cnt as f64).clamp(lo, hi)
        } else {
            (lo * hi).sqrt()
        };
        let w = ((mean - lo) / mean).min((hi - mean) / mean).min(0.5);
        let target = (mean * cnt as f64).round() as i64;
        let mut sum = 0i64;
        let mut class_sizes = Vec::with_capacity(cnt);
        for j in 0..cnt {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            let f = if j % 2 == 0 { u } else { 1.0 - u };
            let s = (mean * (1.0 + w * (2.0 * f - 1.0))).round().clamp(lo, hi) as i64;
            class_sizes.push(s);
            sum += s;
        }
        if let Some(last) = class_sizes.last_mut() {
            *last = (*last + target - sum).clamp(lo as i64, hi as i64);
        }
        let bytes: i64 = class_sizes.iter().sum();
        mix.push(MixRow {
            class: class.to_string(),
            paper_writes_pct: pw,
            paper_data_pct: pd,
            writes: cnt as u64,
            bytes: bytes as u64,
            writes_pct: 0.0,
            data_pct: 0.0,
        });
        sizes.extend(class_sizes.into_iter().map(|s| s as u32));
    }
    let (nw, nb) = (
        sizes.len() as f64,
        mix.iter().map(|m| m.bytes).sum::<u64>() as f64,
    );
    for m in &mut mix {
        m.writes_pct = m.writes as f64 * 100.0 / nw;
        m.data_pct = m.bytes as f64 * 100.0 / nb;
    }
    for i in (1..sizes.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        sizes.swap(i, j);
    }
    (sizes, mix)
}

fn replay(opts: &POpts, pio: &Pio, res: &mut PResults, names: &mut Names, st: &Store) -> Res<()> {
    let (sizes, mix) = replay_sizes(opts.replay_writes);
    let total: u64 = sizes.iter().map(|&s| s as u64).sum();
    eprintln!(
        "3. replay of paper 001 Table 2's write mix: {} writes, {} per process:",
        sizes.len(),
        size_str(total)
    );
    let file = format!("/dev/shm/{}-replay.sizes", prefix(opts.pid));
    let raw: Vec<u8> = sizes.iter().flat_map(|s| s.to_le_bytes()).collect();
    std::fs::write(&file, raw).ctx(|| format!("writing {file}"))?;
    res.mix = mix;
    let methods = ["preload", "store-api", "tmpfs"];
    let r = (|| -> Res<()> {
        for &p in &opts.procs {
            let mut s = Samples::default();
            for rep in 0..opts.reps {
                let order = in_turn(&methods, rep);
                for m in order {
                    let mut cmds = Vec::with_capacity(p);
                    for i in 0..p {
                        cmds.push(match m {
                            "preload" => pio.cmd(
                                Some(st.name()),
                                "replay",
                                &[
                                    ("path", pio.path(&format!("replay-p{i}-r{rep}"))),
                                    ("sizes", file.clone()),
                                    pio.warm(),
                                ],
                            ),
                            "tmpfs" => pio.cmd(
                                None,
                                "replay",
                                &[
                                    ("path", format!("/dev/shm/{}", names.next("replay", i))),
                                    ("sizes", file.clone()),
                                ],
                            ),
                            _ => job_command(&Job::StoreReplay {
                                store: st.name().to_string(),
                                path: format!("/sreplay-p{i}-r{rep}"),
                                sizes: file.clone(),
                            })?,
                        });
                    }
                    let out = run(cmds, || format!("replay: {m} with {p} processes"))?;
                    say("replay", m, p, rep, opts.reps, &out);
                    s.add(m, out);
                }
            }
            for m in methods {
                res.replay.push(s.row(m, p, 0));
            }
            res.rep_ratios.push(RepRatio {
                what: "replay preload/tmpfs".into(),
                procs: p,
                ratio: s.ratio("preload", "tmpfs"),
            });
            res.rep_ratios.push(RepRatio {
                what: "replay preload/store-api".into(),
                procs: p,
                ratio: s.ratio("preload", "store-api"),
            });
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&file);
    r
}

// ---- 4. metadata ----------------------------------------------------------------------------

fn meta(opts: &POpts, pio: &Pio, res: &mut PResults, names: &mut Names, st: &Store) -> Res<()> {
    let (files, passes) = (opts.meta_files, opts.meta_passes);
    eprintln!(
        "4. metadata: {files} x (create + write 4 KiB + close) per process, {passes} stat passes, unlink:"
    );
    let methods = ["preload", "store-api", "tmpfs"];
    for &p in &opts.procs {
        type Acc = BTreeMap<&'static str, [Vec<f64>; 5]>;
        let mut acc: Acc = BTreeMap::new();
        for rep in 0..opts.reps {
            let order = in_turn(&methods, rep);
            for m in order {
                let mut cmds = Vec::with_capacity(p);
                for i in 0..p {
                    let common = [("files", files.to_string()), ("passes", passes.to_string())];
                    cmds.push(match m {
                        "preload" => {
                            let mut a = vec![("dir", pio.path(&format!("meta-p{i}-r{rep}")))];
                            a.extend(common.iter().cloned());
                            a.push(pio.warm());
                            pio.cmd(Some(st.name()), "meta", &a)
                        }
                        "tmpfs" => {
                            let mut a =
                                vec![("dir", format!("/dev/shm/{}", names.next("meta", i)))];
                            a.extend(common.iter().cloned());
                            pio.cmd(None, "meta", &a)
                        }
                        _ => job_command(&Job::StoreMeta {
                            store: st.name().to_string(),
                            dir: format!("/smeta-p{i}-r{rep}"),
                            files,
                            passes,
                        })?,
                    });
                }
                let out = run(cmds, || format!("metadata: {m} with {p} processes"))?;
                let (_, create, create_pp) = phase_span(&out, 0)?;
                let (_, stat, stat_pp) = phase_span(&out, 1)?;
                let (_, unlink, _) = phase_span(&out, 2)?;
                let n = (files * p as u64) as f64;
                let e = acc.entry(m).or_default();
                e[0].push(n * 1e9 / create.max(1) as f64);
                e[1].push(n * passes as f64 * 1e9 / stat.max(1) as f64);
                e[2].push(n * 1e9 / unlink.max(1) as f64);
                e[3].push(create_pp / files as f64 / 1e3);
                e[4].push(stat_pp / (files * passes).max(1) as f64);
                eprintln!(
                    "  [meta] {m:<9} procs={p} rep {}/{}: {:9.0} creates/s ({:.2} us each), {:10.0} stats/s ({:.0} ns each), {:9.0} unlinks/s",
                    rep + 1,
                    opts.reps,
                    n * 1e9 / create.max(1) as f64,
                    create_pp / files as f64 / 1e3,
                    n * passes as f64 * 1e9 / stat.max(1) as f64,
                    stat_pp / (files * passes).max(1) as f64,
                    n * 1e9 / unlink.max(1) as f64
                );
            }
        }
        for m in methods {
            let Some(e) = acc.get(m) else { continue };
            res.meta.push(MetaRow {
                method: m.to_string(),
                procs: p,
                files,
                create_per_s: Stats::of(&e[0]),
                stat_per_s: Stats::of(&e[1]),
                unlink_per_s: Stats::of(&e[2]),
                create_us: Stats::of(&e[3]),
                stat_ns: Stats::of(&e[4]),
            });
        }
        for (k, what) in [(0, "create"), (1, "stat")] {
            let (Some(a), Some(b)) = (acc.get("preload"), acc.get("tmpfs")) else {
                continue;
            };
            let r: Vec<f64> = a[k].iter().zip(&b[k]).map(|(x, y)| x / y).collect();
            res.rep_ratios.push(RepRatio {
                what: format!("{what} preload/tmpfs"),
                procs: p,
                ratio: Stats::of(&r),
            });
        }
    }
    Ok(())
}

/// mdtest-style (issue 24): `mdtest_files` empty files per process created, stat'ed once and
/// removed, in a directory per process and in one shared directory.
fn mdtest(opts: &POpts, pio: &Pio, res: &mut PResults, st: &Store) -> Res<()> {
    let files = opts.mdtest_files;
    eprintln!("4b. mdtest-style: {files} files per process, create (empty), stat, remove:");
    let methods = ["preload", "tmpfs"];
    for layout in ["own", "shared"] {
        for &p in &opts.procs {
            type Acc = BTreeMap<&'static str, [Vec<f64>; 3]>;
            let mut acc: Acc = BTreeMap::new();
            for rep in 0..opts.reps {
                let order = in_turn(&methods, rep);
                for m in order {
                    let dir = match m {
                        "preload" => pio.path(&format!("md-{layout}-p{p}-r{rep}")),
                        _ => format!("/dev/shm/{}-md-{layout}-p{p}-r{rep}", prefix(opts.pid)),
                    };
                    let cmds = (0..p)
                        .map(|i| {
                            let mut a = vec![
                                ("dir", dir.clone()),
                                ("files", files.to_string()),
                                ("rank", i.to_string()),
                                ("shared", u8::from(layout == "shared").to_string()),
                            ];
                            if m == "preload" {
                                a.push(pio.warm());
                                pio.cmd(Some(st.name()), "mdtest", &a)
                            } else {
                                pio.cmd(None, "mdtest", &a)
                            }
                        })
                        .collect();
                    let out = run(cmds, || {
                        format!("mdtest: {m}, {layout} directories, {p} processes")
                    });
                    if m == "tmpfs" {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    let out = out?;
                    let n = (files * p as u64) as f64;
                    let e = acc.entry(m).or_default();
                    for (k, v) in e.iter_mut().enumerate() {
                        let (_, span, _) = phase_span(&out, k)?;
                        v.push(n * 1e9 / span.max(1) as f64);
                    }
                    eprintln!(
                        "  [mdtest] {m:<7} {layout:<6} procs={p} rep {}/{}: {:9.0} creates/s, {:9.0} stats/s, {:9.0} removes/s",
                        rep + 1,
                        opts.reps,
                        e[0].last().copied().unwrap_or(0.0),
                        e[1].last().copied().unwrap_or(0.0),
                        e[2].last().copied().unwrap_or(0.0)
                    );
                }
            }
            for m in methods {
                let Some(e) = acc.get(m) else { continue };
                res.mdtest.push(MdtestRow {
                    method: m.to_string(),
                    procs: p,
                    layout: layout.to_string(),
                    files,
                    create_per_s: Stats::of(&e[0]),
                    stat_per_s: Stats::of(&e[1]),
                    remove_per_s: Stats::of(&e[2]),
                });
            }
        }
    }
    Ok(())
}

// ---- 5. restart read bandwidth --------------------------------------------------------------

fn readback(opts: &POpts, pio: &Pio, res: &mut PResults, st: &Store, base: &ShmBase) -> Res<()> {
    let max_procs = opts.procs.iter().copied().max().unwrap_or(1);
    let (bytes, io) = (opts.size, opts.io);
    eprintln!(
        "5. restart reads, {} reads, {} per process (files written by the parent first):",
        size_str(io),
        size_str(bytes)
    );
    let files = ReadbackFiles::write(st, opts.pid, max_procs, bytes, io)?;
    let methods = [
        "preload",
        "store-api",
        "memcpy-shm",
        "tmpfs",
        "preload-cold",
    ];
    let order = |rep: usize| {
        if rep % 2 == 0 {
            [
                "tmpfs",
                "preload-cold",
                "memcpy-shm",
                "preload",
                "store-api",
            ]
        } else {
            [
                "tmpfs",
                "preload-cold",
                "memcpy-shm",
                "store-api",
                "preload",
            ]
        }
    };
    let r = (|| -> Res<()> {
        for &p in &opts.procs {
            let mut s = Samples::default();
            for rep in 0..opts.reps {
                for m in order(rep) {
                    let mut cmds = Vec::with_capacity(p);
                    for (i, tfile) in files.tmpfs.iter().enumerate().take(p) {
                        let a = |path: String| {
                            vec![
                                ("path", path),
                                ("bytes", bytes.to_string()),
                                ("io", io.to_string()),
                            ]
                        };
                        cmds.push(match m {
                            "preload" => {
                                let mut v = a(pio.path(&format!("rb-p{i}.dat")));
                                v.push(pio.warm());
                                pio.cmd(Some(st.name()), "read", &v)
                            }
                            "preload-cold" => pio.cmd(
                                Some(st.name()),
                                "read",
                                &a(pio.path(&format!("rb-p{i}.dat"))),
                            ),
                            "tmpfs" => pio.cmd(None, "read", &a(tfile.clone())),
                            "memcpy-shm" => job_command(&Job::MemcpyShmRead {
                                bytes,
                                io,
                                shm: base.name.clone(),
                                offset: i as u64 * bytes,
                            })?,
                            _ => job_command(&Job::StoreRead {
                                store: st.name().to_string(),
                                path: ReadbackFiles::store_path(i),
                                bytes,
                                io,
                            })?,
                        });
                    }
                    let out = run(cmds, || format!("restart reads: {m} with {p} processes"))?;
                    say("read", m, p, rep, opts.reps, &out);
                    s.add(m, out);
                }
            }
            for m in methods {
                res.readback.push(s.row(m, p, io));
            }
            res.rep_ratios.push(RepRatio {
                what: "read preload/store-api".into(),
                procs: p,
                ratio: s.ratio("preload", "store-api"),
            });
            let pairs = opts.reps.max(3);
            let cp = c_pair(pio, st, base, p, true, bytes, io, pairs)?;
            let tp = tight_pair_with(st, base, p, true, bytes, io, pairs)?;
            res.normalised.push(normalise(&cp, &tp));
            res.c_pairs.push(cp);
            res.store_pairs.push(tp);
        }
        Ok(())
    })();
    r
}

// ---- 6. pass-through overhead on non-Cascade files ------------------------------------------

/// Rounds of the four pass-through phases in each process; the fastest round counts.
pub const PASS_ROUNDS: usize = 3;

fn passthrough(
    opts: &POpts,
    pio: &Pio,
    res: &mut PResults,
    names: &mut Names,
    st: &Store,
) -> Res<()> {
    eprintln!(
        "6. pass-through: write()/read() of 64 B and 4 KiB on a tmpfs file (first {} of it), without and with LD_PRELOAD:",
        size_str(opts.pass_region)
    );
    let ops = ["write-64", "write-4096", "read-64", "read-4096"];
    let mut plain: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
    let mut pre: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
    let calls = |op: &str| {
        if op.ends_with("-64") {
            opts.pass_calls64
        } else {
            opts.pass_calls4k
        }
    };
    for rep in 0..opts.pass_reps {
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_lib in order {
            let args = [
                ("path", format!("/dev/shm/{}", names.next("pass", 0))),
                ("region", opts.pass_region.to_string()),
                ("calls64", opts.pass_calls64.to_string()),
                ("calls4k", opts.pass_calls4k.to_string()),
                ("rounds", PASS_ROUNDS.to_string()),
            ];
            let store = with_lib.then(|| st.name());
            let out = run(vec![pio.cmd(store, "passthru", &args)], || {
                "pass-through".to_string()
            })?;
            let mut line = Vec::new();
            for (k, op) in ops.iter().enumerate() {
                // The least disturbed of the rounds: the wrappers' cost is deterministic, and
                // a burst of other work on the machine should not decide the ratio.
                let mut ns = f64::INFINITY;
                for round in 0..PASS_ROUNDS {
                    let j = round * ops.len() + k;
                    let (name, _, per) = phase_span(&out, j)?;
                    if name != *op {
                        return err(format!("pass-through: phase {j} is {name}, expected {op}"));
                    }
                    ns = ns.min(per / calls(op) as f64);
                }
                if with_lib {
                    pre[k].push(ns);
                } else {
                    plain[k].push(ns);
                }
                line.push(format!("{op} {ns:.0} ns"));
            }
            eprintln!(
                "  [pass] {:<10} rep {}/{}: {}",
                if with_lib { "preload" } else { "plain" },
                rep + 1,
                opts.pass_reps,
                line.join(", ")
            );
        }
    }
    for (k, op) in ops.iter().enumerate() {
        let r: Vec<f64> = pre[k].iter().zip(&plain[k]).map(|(a, b)| a / b).collect();
        res.passthrough.push(PassRow {
            op: op.to_string(),
            calls: calls(op),
            plain_ns: Stats::of(&plain[k]),
            preload_ns: Stats::of(&pre[k]),
            ratio: Stats::of(&r),
        });
    }
    Ok(())
}

/// Calls per path-length measurement: enough that set-up and the core probe's loop vanish
/// from the count (the probe calls neither write nor read).
const PATH_CALLS: u64 = 100_000;

/// Counts the instructions of write() and read() of 64 B and 4 KiB through the library:
/// `pio sweep` under callgrind, collecting only inside the function of the call's name
/// (`--toggle-collect`), divided by the calls. Skipped, with a line, without valgrind.
fn path_length(pio: &Pio, res: &mut PResults, names: &mut Names, st: &Store) -> Res<()> {
    let have_valgrind = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_valgrind {
        eprintln!("7. path length: skipped (valgrind is not installed)");
        return Ok(());
    }
    eprintln!("7. path length: instructions per call through the library (callgrind, {PATH_CALLS} calls each):");
    let counts = std::env::temp_dir().join(format!("{}-callgrind", prefix(names.pid)));
    for (call, io) in [("write", 64), ("write", 4096), ("read", 64), ("read", 4096)] {
        let wrapper = [
            "valgrind".to_string(),
            "--quiet".into(),
            "--tool=callgrind".into(),
            "--cache-sim=no".into(),
            format!("--toggle-collect={call}"),
            format!("--callgrind-out-file={}", counts.display()),
        ];
        let mut args = vec![
            ("path", pio.path(&names.next("path", 0))),
            ("sizes", format!("{io}:{PATH_CALLS}")),
            pio.warm(),
        ];
        if call == "read" {
            args.push(("read", "1".into()));
        }
        let outcome = run(
            vec![pio.cmd_under(&wrapper, Some(st.name()), "sweep", &args)],
            || format!("pio sweep of {call}() under callgrind"),
        );
        let total = outcome.and_then(|_| callgrind_total(&counts));
        let _ = std::fs::remove_file(&counts);
        let per_call = total? as f64 / PATH_CALLS as f64;
        eprintln!(
            "  {call}() of {}: {per_call:.0} instructions per call",
            size_str(io)
        );
        res.path_length.push(PathRow {
            call: call.to_string(),
            io,
            calls: PATH_CALLS,
            instructions_per_call: per_call,
        });
    }
    Ok(())
}

/// The event total of a callgrind output file (its `totals:` line, instructions here).
fn callgrind_total(path: &Path) -> Res<u64> {
    let text = std::fs::read_to_string(path).ctx(|| format!("reading {}", path.display()))?;
    match text
        .lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.trim().parse().ok())
    {
        Some(total) => Ok(total),
        None => err(format!("{}: no totals line", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_mix_follows_table_2() {
        let (sizes, mix) = replay_sizes(40_000);
        assert_eq!(
            sizes.len() as u64,
            mix.iter().map(|m| m.writes).sum::<u64>()
        );
        for (m, c) in mix.iter().zip(TABLE2.iter()) {
            assert!(
                (m.writes_pct - c.3).abs() < 0.05,
                "{}: {}",
                m.class,
                m.writes_pct
            );
            assert!(
                (m.data_pct - c.4).abs() < 0.15,
                "{}: {}",
                m.class,
                m.data_pct
            );
        }
        let (again, _) = replay_sizes(40_000);
        assert_eq!(sizes, again);
        let small = sizes.iter().filter(|&&s| s <= 64).count();
        assert!(small * 2 >= sizes.len() - 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Report: interposition.json and the tables of interposition.md.

#[derive(Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    /// The preloaded library: path and modification time.
    pub library: String,
    pub cc: String,
    pub options: &'a POpts,
    pub targets: Vec<Target>,
    pub results: &'a PResults,
}

fn find<'a>(rows: &'a [Row], method: &str, procs: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.method == method && r.procs == procs)
}

fn find_io<'a>(rows: &'a [Row], method: &str, procs: usize, io: u64) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.method == method && r.procs == procs && r.io == io)
}

fn rep_ratio<'a>(r: &'a PResults, what: &str, procs: usize) -> Option<&'a Stats> {
    r.rep_ratios
        .iter()
        .find(|x| x.procs == procs && x.what.contains(what))
        .map(|x| &x.ratio)
}

/// "not run" for no parts, else the parts joined.
fn joined(parts: Vec<String>) -> String {
    if parts.is_empty() {
        "not run".into()
    } else {
        parts.join("; ")
    }
}

/// The targets of issue 3 (see bench/README.md for how each ratio is paired).
pub fn targets(opts: &POpts, r: &PResults) -> Vec<Target> {
    let (mut parts, mut met) = (Vec::new(), None);
    for &p in &opts.procs {
        let Some(n) = r
            .normalised
            .iter()
            .find(|n| n.kind == "write" && n.procs == p)
        else {
            continue;
        };
        let sep = match (
            find(&r.writes, "preload", p),
            find(&r.writes, "store-api", p),
        ) {
            (Some(a), Some(b)) => format!(
                "; separate runs {:.2} vs {:.2} GB/s, per repetition {}",
                a.gbps.median,
                b.gbps.median,
                rep_ratio(r, "write preload/store-api", p).map_or("n/a".into(), |x| {
                    format!("{:.2}x [{:.2}–{:.2}]", x.median, x.min, x.max)
                })
            ),
            _ => String::new(),
        };
        parts.push(format!(
            "{p} proc: **{:.2}x** [{:.2}–{:.2}]{sep}",
            n.ratio, n.low, n.high
        ));
        met = Some(met.unwrap_or(true) && n.ratio >= 0.9);
    }
    let mut out = vec![Target::new(
        "1 MiB writes through the library",
        ">= 0.9x the store API (`File::write_at`)",
        joined(parts),
        met,
    )];
    let (mut parts, mut met) = (Vec::new(), None);
    for &p in &opts.procs {
        let (Some(a), Some(b), Some(rr)) = (
            find_io(&r.sweep, "preload", p, 64),
            find_io(&r.sweep, "tmpfs", p, 64),
            rep_ratio(r, "64 B preload/tmpfs", p),
        ) else {
            continue;
        };
        parts.push(format!(
            "{p} proc: **{:.1}x** [{:.1}–{:.1}] ({} vs {} calls/s; {:.0} vs {:.0} ns per call)",
            rr.median,
            rr.min,
            rr.max,
            count(a.calls_per_s.median),
            count(b.calls_per_s.median),
            a.ns_per_call.median,
            b.ns_per_call.median
        ));
        met = Some(met.unwrap_or(true) && rr.median >= 10.0);
    }
    out.push(Target::new(
        "64-byte writes",
        ">= 10x the write() calls per second into tmpfs",
        joined(parts),
        met,
    ));
    // Issue 24, item 1: the library's own time per call, whatever the kernel's costs.
    let (mut parts, mut met) = (Vec::new(), None);
    for &p in &opts.procs {
        let ns =
            |rows: &[Row], m: &str, io: u64| find_io(rows, m, p, io).map(|x| x.ns_per_call.median);
        let Some(w64) = ns(&r.sweep, "preload", 64) else {
            continue;
        };
        let show = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0}"));
        let full_core = r
            .ns_on_a_full_core("preload", p, 64)
            .map_or(String::new(), |(ns, k, n)| {
                format!(", {ns:.1} ns with the core to itself ({k} of {n} repetitions)")
            });
        parts.push(format!(
            "{p} proc: **{w64:.1} ns**{full_core} (into a file an exited process wrote {} ns; 4 KiB writes {} ns; reads: 64 B {} ns, 4 KiB {} ns; tmpfs: {} / {} / {} / {} ns)",
            show(ns(&r.sweep, "preload-rewrite", 64)),
            show(ns(&r.sweep, "preload", 4 * KIB)),
            show(ns(&r.read_sweep, "preload", 64)),
            show(ns(&r.read_sweep, "preload", 4 * KIB)),
            show(ns(&r.sweep, "tmpfs", 64)),
            show(ns(&r.sweep, "tmpfs", 4 * KIB)),
            show(ns(&r.read_sweep, "tmpfs", 64)),
            show(ns(&r.read_sweep, "tmpfs", 4 * KIB)),
        ));
        met = Some(met.unwrap_or(true) && w64 <= 30.0);
    }
    // The path's length in instructions: what the time follows where the host does not
    // (section 7).
    let instructions = |call: &str| {
        r.path_length
            .iter()
            .find(|x| x.call == call && x.io == 64)
            .map(|x| x.instructions_per_call)
    };
    if let (Some(w), Some(rd)) = (instructions("write"), instructions("read")) {
        parts.push(format!(
            "path: {w:.0} instructions per 64 B write, {rd:.0} per read (callgrind)"
        ));
    }
    out.push(Target::new(
        "time per 64-byte write (issue 24)",
        "<= 30 ns per call",
        joined(parts),
        met,
    ));
    // Issue 24, item 4: metadata with one and two processes.
    let (mut parts, mut met) = (Vec::new(), None);
    for &p in &opts.procs {
        let m = |method: &str| r.meta.iter().find(|m| m.method == method && m.procs == p);
        let Some((a, b)) = m("preload").zip(m("tmpfs")) else {
            continue;
        };
        let (c, st) = (
            a.create_per_s.median / b.create_per_s.median,
            a.stat_per_s.median / b.stat_per_s.median,
        );
        let md: Vec<String> = ["own", "shared"]
            .iter()
            .filter_map(|layout| {
                let f = |method: &str| {
                    r.mdtest
                        .iter()
                        .find(|x| x.method == method && x.procs == p && x.layout == *layout)
                };
                let (a, b) = f("preload").zip(f("tmpfs"))?;
                Some(format!(
                    "mdtest {layout} dirs: create {:.2}x, stat {:.2}x, remove {:.2}x",
                    a.create_per_s.median / b.create_per_s.median,
                    a.stat_per_s.median / b.stat_per_s.median,
                    a.remove_per_s.median / b.remove_per_s.median
                ))
            })
            .collect();
        parts.push(format!(
            "{p} proc: create+4 KiB+close **{c:.2}x**, stat **{st:.2}x** ({})",
            md.join("; ")
        ));
        met = Some(met.unwrap_or(true) && c >= 1.5 && st >= 1.5);
    }
    out.push(Target::new(
        "metadata (issue 24)",
        ">= 1.5x tmpfs for create and stat with 1 and 2 processes",
        joined(parts),
        met,
    ));
    let worst = r
        .passthrough
        .iter()
        .map(|x| x.ratio.median)
        .reduce(f64::max);
    let parts = r
        .passthrough
        .iter()
        .map(|x| format!("{}: **{}**", x.op, pct_change(&x.ratio)))
        .collect();
    let goal = "< 5 % (tmpfs file, with vs without LD_PRELOAD)";
    out.push(Target::new(
        "overhead on non-Cascade files",
        goal,
        joined(parts),
        worst.map(|w| w < 1.05),
    ));
    out
}

/// 1 MiB writes or reads, each method against the others.
fn bandwidth_table(title: String, rows: &[Row]) -> Table {
    let head = "method | procs | GB/s | vs store API | vs memcpy shm | vs tmpfs | set-up (s)";
    let mut t = Table::new(title, head);
    for row in rows {
        let vs = |m: &str| {
            x(ratio(
                row.gbps.median,
                find(rows, m, row.procs).map(|x| x.gbps.median),
            ))
        };
        let (api, shm, tmpfs) = (vs("store-api"), vs("memcpy-shm"), vs("tmpfs"));
        t.row([
            row.method.clone(),
            row.procs.to_string(),
            st(&row.gbps),
            api,
            shm,
            tmpfs,
            format!("{:.2}", row.setup_s),
        ]);
    }
    t
}

/// The paired runs of 1 MiB writes or reads: ratio per round, median [min–max].
fn pairs_table(r: &PResults, kind: &str) -> Table {
    let head = "procs | preload / memcpy-shm (C) | store API / memcpy-shm (Rust) | preload / store API (normalised)";
    let mut t = Table::new(
        format!("Paired runs, {kind}s (ratio per round; GB/s medians)"),
        head,
    );
    for cp in r.c_pairs.iter().filter(|c| c.kind == kind) {
        let tp = r
            .store_pairs
            .iter()
            .find(|t| t.kind == kind && t.procs == cp.procs);
        let n = r
            .normalised
            .iter()
            .find(|n| n.kind == kind && n.procs == cp.procs);
        let (Some(tp), Some(n)) = (tp, n) else {
            continue;
        };
        t.row([
            cp.procs.to_string(),
            format!(
                "{} ({:.2} vs {:.2})",
                st(&cp.ratio),
                cp.preload_gbps.median,
                cp.memcpy_shm_gbps.median
            ),
            format!(
                "{} ({:.2} vs {:.2})",
                st(&tp.ratio),
                tp.cascade_gbps.median,
                tp.memcpy_shm_gbps.median
            ),
            format!("**{:.2}x** [{:.2}–{:.2}]", n.ratio, n.low, n.high),
        ]);
    }
    t
}

/// The figures the issue asks for without a target (medians).
pub fn verdicts(o: &POpts, r: &PResults) -> Vec<String> {
    let mut lines = Vec::new();
    for &p in &o.procs {
        if let (Some(a), Some(b)) = (find(&r.replay, "preload", p), find(&r.replay, "tmpfs", p)) {
            let (a, b) = (a.gbps.median, b.gbps.median);
            lines.push(format!(
                "write mix, {p} proc: {a:.2} vs {b:.2} GB/s = **{:.2}x tmpfs**",
                a / b
            ));
        }
        let m = |method: &str| r.meta.iter().find(|m| m.method == method && m.procs == p);
        if let (Some(a), Some(b)) = (m("preload"), m("tmpfs")) {
            let (c, s) = (&a.create_per_s, &a.stat_per_s);
            lines.push(format!(
                "metadata, {p} proc: creates **{:.2}x tmpfs**, stats **{:.2}x tmpfs**",
                c.median / b.create_per_s.median,
                s.median / b.stat_per_s.median
            ));
        }
        let g = |method: &str| find(&r.readback, method, p).map(|x| x.gbps.median);
        if let (Some(a), Some(b), Some(cold)) = (g("preload"), g("tmpfs"), g("preload-cold")) {
            lines.push(format!(
                "restart reads, {p} proc: {a:.2} GB/s = **{:.2}x tmpfs**; a freshly started process: {cold:.2} GB/s",
                a / b
            ));
        }
    }
    if let Some(fastest) = r.fastest_probe() {
        let slowest = r.probes().fold(fastest, f64::max);
        let full = r
            .probes()
            .filter(|&x| x <= fastest * PROBE_FULL_CORE)
            .count();
        lines.push(format!(
            "core sharing: the sweeps' core probe took {fastest:.2}–{slowest:.2} ns per round (slowest **{:.2}x** the fastest); {full} of {} sweep phases had the core to themselves (within {PROBE_FULL_CORE}x)",
            slowest / fastest,
            r.probes().count()
        ));
    }
    lines
}

/// The tables of interposition.md.
pub fn tables(o: &POpts, r: &PResults) -> Vec<Table> {
    let (io, size) = (size_str(o.io), size_str(o.size));
    let mut out = Vec::new();
    let head = "store | memory | chunk | create time (s) | prefault GB/s";
    let mut t = Table::new("Stores (`Prefault::Foreground`)", head);
    for c in &r.creation {
        let (cap, cs) = (size_str(c.capacity), size_str(c.chunk_size));
        t.row([
            c.store.clone(),
            cap,
            cs,
            format!("{:.3}", c.seconds),
            format!("{:.2}", c.gbps),
        ]);
    }
    out.push(t);
    out.push(bandwidth_table(
        format!("1. {io} writes, {size} per process"),
        &r.writes,
    ));
    out.push(pairs_table(r, "write"));
    let head = "procs | write size | calls per process | preload ns/call | into a file an exited process wrote, ns/call | store API ns/call | tmpfs ns/call | preload calls/s | tmpfs calls/s | preload vs tmpfs | preload vs store API | preload GB/s | tmpfs GB/s";
    let mut t = Table::new("2. Small writes: calls per second by write size", head);
    for &p in &o.procs {
        for &(size, calls) in &o.sweep {
            let f = |m: &str| find_io(&r.sweep, m, p, size);
            let (Some(a), Some(b), Some(c)) = (f("preload"), f("store-api"), f("tmpfs")) else {
                continue;
            };
            let (ac, cc) = (a.calls_per_s.median, c.calls_per_s.median);
            t.row([
                p.to_string(),
                size_str(size),
                count(calls as f64),
                st_prec(&a.ns_per_call, 0),
                f("preload-rewrite").map_or("n/a".into(), |r| st_prec(&r.ns_per_call, 0)),
                st_prec(&b.ns_per_call, 0),
                st_prec(&c.ns_per_call, 0),
                count_st(&a.calls_per_s),
                count_st(&c.calls_per_s),
                x(ratio(ac, cc)),
                x(ratio(ac, b.calls_per_s.median)),
                st(&a.gbps),
                st(&c.gbps),
            ]);
        }
    }
    out.push(t);
    let head = "procs | read size | calls per process | preload ns/call | tmpfs ns/call | preload calls/s | tmpfs calls/s | preload vs tmpfs";
    let mut t = Table::new("2b. Small reads: calls per second by read size", head);
    for &p in &o.procs {
        for &(size, calls) in o.sweep.iter().filter(|(s, _)| READ_SIZES.contains(s)) {
            let f = |m: &str| find_io(&r.read_sweep, m, p, size);
            let (Some(a), Some(c)) = (f("preload"), f("tmpfs")) else {
                continue;
            };
            t.row([
                p.to_string(),
                size_str(size),
                count(calls as f64),
                st_prec(&a.ns_per_call, 0),
                st_prec(&c.ns_per_call, 0),
                count_st(&a.calls_per_s),
                count_st(&c.calls_per_s),
                x(ratio(a.calls_per_s.median, c.calls_per_s.median)),
            ]);
        }
    }
    out.push(t);
    if let Some(fastest) = r.fastest_probe() {
        let head = "call | method | procs | ns per call in each repetition (the core probe against the run's fastest)";
        let mut t = Table::new(
            "2c. Core sharing: 64 B and 4 KiB calls beside the core probe taken before them",
            head,
        );
        for row in r
            .core_probe
            .iter()
            .filter(|row| READ_SIZES.contains(&row.io))
        {
            let reps: Vec<String> = row
                .reps
                .iter()
                .map(|&(ns, probe)| format!("{ns:.0} ({:.2}x)", probe / fastest))
                .collect();
            t.row([
                format!(
                    "{} {}",
                    if row.read { "read" } else { "write" },
                    size_str(row.io)
                ),
                row.method.clone(),
                row.procs.to_string(),
                reps.join(", "),
            ]);
        }
        out.push(t);
    }
    let head = "size class | paper: % of writes | paper: % of data | generated writes | % of writes | % of data";
    let mut t = Table::new("3. Replayed write mix (paper 001, Table 2)", head);
    for m in &r.mix {
        let f = |v: f64| format!("{v:.2}");
        t.row([
            m.class.clone(),
            f(m.paper_writes_pct),
            f(m.paper_data_pct),
            m.writes.to_string(),
            f(m.writes_pct),
            f(m.data_pct),
        ]);
    }
    out.push(t);
    let head = "method | procs | GB/s | calls/s | ns per call (mean) | vs tmpfs | vs store API";
    let mut t = Table::new("3. Replay of the write mix", head);
    for row in &r.replay {
        let vs = |m: &str| {
            x(ratio(
                row.gbps.median,
                find(&r.replay, m, row.procs).map(|x| x.gbps.median),
            ))
        };
        let (cs, ns) = (count_st(&row.calls_per_s), st_prec(&row.ns_per_call, 0));
        t.row([
            row.method.clone(),
            row.procs.to_string(),
            st(&row.gbps),
            cs,
            ns,
            vs("tmpfs"),
            vs("store-api"),
        ]);
    }
    out.push(t);
    let head = "method | procs | creates/s | µs per create | stats/s | ns per stat | unlinks/s | create vs tmpfs | stat vs tmpfs";
    let title = format!(
        "4. Metadata: {} files per process, {} stat passes",
        o.meta_files, o.meta_passes
    );
    let mut t = Table::new(title, head);
    for m in &r.meta {
        let b = r
            .meta
            .iter()
            .find(|x| x.method == "tmpfs" && x.procs == m.procs);
        t.row([
            m.method.clone(),
            m.procs.to_string(),
            count_st(&m.create_per_s),
            st_prec(&m.create_us, 2),
            count_st(&m.stat_per_s),
            st_prec(&m.stat_ns, 0),
            count_st(&m.unlink_per_s),
            x(ratio(
                m.create_per_s.median,
                b.map(|b| b.create_per_s.median),
            )),
            x(ratio(m.stat_per_s.median, b.map(|b| b.stat_per_s.median))),
        ]);
    }
    out.push(t);
    let head = "directories | method | procs | creates/s | stats/s | removes/s | create vs tmpfs | stat vs tmpfs | remove vs tmpfs";
    let title = format!(
        "4b. mdtest-style: {} empty files per process created, stat'ed once, removed",
        o.mdtest_files
    );
    let mut t = Table::new(title, head);
    for m in &r.mdtest {
        let b = r
            .mdtest
            .iter()
            .find(|x| x.method == "tmpfs" && x.procs == m.procs && x.layout == m.layout);
        let vs = |f: fn(&MdtestRow) -> f64| x(ratio(f(m), b.map(f)));
        t.row([
            if m.layout == "own" {
                "one per process".to_string()
            } else {
                "one shared".to_string()
            },
            m.method.clone(),
            m.procs.to_string(),
            count_st(&m.create_per_s),
            count_st(&m.stat_per_s),
            count_st(&m.remove_per_s),
            vs(|r| r.create_per_s.median),
            vs(|r| r.stat_per_s.median),
            vs(|r| r.remove_per_s.median),
        ]);
    }
    out.push(t);
    out.push(bandwidth_table(
        format!("5. Restart: read back {size} files with {io} reads"),
        &r.readback,
    ));
    out.push(pairs_table(r, "read"));
    let head = "call | calls | without library (ns/call) | with library (ns/call) | overhead";
    let mut t = Table::new("6. Overhead on non-Cascade files", head);
    for p in &r.passthrough {
        let (pl, pr) = (st_prec(&p.plain_ns, 0), st_prec(&p.preload_ns, 0));
        t.row([
            p.op.clone(),
            count(p.calls as f64),
            pl,
            pr,
            pct_change(&p.ratio),
        ]);
    }
    out.push(t);
    let head = "call | calls | instructions per call";
    let mut t = Table::new(
        "7. Path length: instructions per call through the library (callgrind, user space)",
        head,
    );
    for p in &r.path_length {
        t.row([
            format!("{}() of {}", p.call, size_str(p.io)),
            count(p.calls as f64),
            format!("{:.0}", p.instructions_per_call),
        ]);
    }
    out.push(t);
    out.retain(|t| !t.rows.is_empty());
    out
}
