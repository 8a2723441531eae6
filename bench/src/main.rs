//! cascade-bench: node-store (L0) benchmarks with baselines measured in the same run.
//!
//! `cascade-bench run` is the parent: it creates the stores, spawns this same executable as
//! children (hidden `child` subcommand) for every measurement, releases them together through
//! a pipe barrier, and writes the results. `cascade-bench interposition` runs the
//! benchmarks of the LD_PRELOAD library the same way (a C program instead of the Rust
//! children for the I/O through the library). `durable`, `staging`, `fuse` and `dedup` run the
//! other suites (bench/src/durable.rs, staging.rs, fuse.rs, dedup.rs). See bench/README.md.

mod baselines;
mod benches;
mod child;
mod datasets;
mod dedup;
mod dedup_link;
mod durable;
mod format;
mod fuse;
mod harness;
mod jobs;
mod net;
mod preload;
mod procs;
mod report;
mod staging;
mod stores;
mod util;

use benches::{Bench, Opts};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use util::{cleanup, Context, Res, KIB, MIB};

#[derive(Parser)]
#[command(
    name = "cascade-bench",
    about = "Benchmarks of the Cascade node store (L0) against memcpy, tmpfs and disk baselines"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node-store benchmarks; write node-store.md and node-store.json into --out.
    Run(Box<RunArgs>),
    /// Run the interposition (LD_PRELOAD) benchmarks; write interposition.md and
    /// interposition.json into --out.
    Interposition(Box<InterpArgs>),
    /// Run the durable-store benchmark (needs bench/netns-s3.sh up); write durable.md and
    /// durable.json into --out.
    Durable(Box<durable::DurableArgs>),
    /// Run the staging-server (L1) benchmark (needs root; the checkpoint part needs
    /// bench/netns-s3.sh and bench/netns-staging.sh up); write staging.md and staging.json
    /// into --out.
    Staging(Box<staging::StagingArgs>),
    /// Run the FUSE front-end benchmark (needs root): `cascade mount` against LD_PRELOAD,
    /// tmpfs, local disk and memcpy; write fuse.md and fuse.json into --out.
    Fuse(Box<fuse::FuseArgs>),
    /// Run the dedup-repository benchmark: `cascade-dedup` against restic, borg, cp and
    /// zstd on real checkpoint series (bench/datasets); write dedup.md and dedup.json into
    /// --out.
    Dedup(Box<dedup::DedupArgs>),
    /// Run the end-to-end dedup benchmark (needs bench/netns-s3.sh up and the dedup suite's
    /// datasets): time until durable over the shaped link per snapshot of each series, with
    /// the agent's dedup repository and with the plain layout; write dedup-link.md and
    /// dedup-link.json into --out.
    DedupLink(Box<dedup_link::DedupLinkArgs>),
    /// Run the jobs benchmark (needs bench/netns-s3.sh up): time to a complete checkpoint of
    /// a job on 1, 2, 4 simulated nodes against the ranks writing straight to S3, and what the
    /// job-wide completion costs; write jobs.md and jobs.json into --out.
    Jobs(Box<jobs::JobsArgs>),
    /// Remove stores and files left by runs whose process is gone (or by --pid).
    Cleanup {
        /// Clean up after this run (parent pid) even if it is still alive.
        #[arg(long)]
        pid: Option<u32>,
        /// Directories that held disk-baseline and spill files.
        #[arg(long, default_value = "/var/tmp")]
        dir: Vec<PathBuf>,
    },
    /// Internal: run one measurement job (JSON) as a child process.
    #[command(hide = true)]
    Child {
        #[arg(long)]
        job: String,
    },
    /// Internal: run one job of the dedup suite (JSON on stdin, result on stdout).
    #[command(hide = true)]
    DedupJob,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Directory for node-store.md and node-store.json.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Quick run (about a minute): 256 MiB per process, 1 repetition, 4 rounds, chunk sizes in
    /// powers of 4, 128 MiB spill-over per process with 1 process. Explicit flags override.
    #[arg(long)]
    quick: bool,
    /// Bytes per process in MiB (writes, steady state, sweep, read-back) [default: 1024].
    #[arg(long)]
    size_mib: Option<u64>,
    /// Bytes per process in MiB for the spill-over benchmark [default: 512].
    #[arg(long)]
    spill_size_mib: Option<u64>,
    /// Repetitions of each memory-speed measurement (writes, read-back) [default: 5].
    #[arg(long)]
    reps: Option<usize>,
    /// Repetitions of the slow measurements: disk writes, steady state, chunk sweep
    /// [default: 3].
    #[arg(long)]
    slow_reps: Option<usize>,
    /// Repetitions of each spill-over point [default: 11].
    #[arg(long)]
    spill_reps: Option<usize>,
    /// Rounds of the steady-state benchmark [default: 8].
    #[arg(long)]
    rounds: Option<usize>,
    /// Checkpoints kept in the steady-state benchmark.
    #[arg(long, default_value_t = 2)]
    keep: usize,
    /// Process counts for writes, sweep and read-back.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    procs: Vec<usize>,
    /// Process counts for spill-over [default: 1,2].
    #[arg(long, value_delimiter = ',')]
    spill_procs: Option<Vec<usize>>,
    /// Chunk sizes of the sweep: every power of 2 or of 4 from 4 KiB to 64 MiB [default: 2].
    #[arg(long)]
    sweep_base: Option<u32>,
    /// Chunk size of the stores outside the sweep, in KiB.
    #[arg(long, default_value_t = 1024)]
    chunk_kib: u64,
    /// Benchmarks to run (all when not given).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Bench>,
    /// Directory on local disk for the disk-write baseline.
    #[arg(long, default_value = "/var/tmp")]
    disk_dir: PathBuf,
    /// Directory on local disk (SSD) for the spill files [default: --disk-dir].
    #[arg(long)]
    spill_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct InterpArgs {
    /// Directory for interposition.md and interposition.json.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Quick run (about a minute): 256 MiB per process, 1 repetition, a quarter of the calls.
    /// Explicit flags override.
    #[arg(long)]
    quick: bool,
    /// Benchmarks to run (all when not given).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<preload::Part>,
    /// Bytes per process in MiB of the 1 MiB writes and the restart reads [default: 1024].
    #[arg(long)]
    size_mib: Option<u64>,
    /// Repetitions of each measurement [default: 5].
    #[arg(long)]
    reps: Option<usize>,
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    procs: Vec<usize>,
    /// The preloaded library.
    #[arg(long, default_value = "target/release/libcascade.so")]
    lib: PathBuf,
    /// The C compiler for bench/preload/pio.c.
    #[arg(long, default_value = "cc")]
    cc: String,
    /// The Cascade mount prefix (CASCADE_MOUNT) the C program's paths go under.
    #[arg(long, default_value = "/cascade")]
    mount: String,
    /// Writes in the replayed checkpoint write mix [default: 40000, about 950 MB].
    #[arg(long)]
    replay_writes: Option<usize>,
    /// Files per process in the metadata benchmark [default: 20000].
    #[arg(long)]
    meta_files: Option<u64>,
    /// stat() passes over those files.
    #[arg(long, default_value_t = 3)]
    meta_passes: u64,
    /// Pairs (with and without the library) in the pass-through benchmark [default: 9].
    #[arg(long)]
    pass_reps: Option<usize>,
}

fn build_interp_opts(a: &InterpArgs, pid: u32) -> Res<preload::POpts> {
    let q = a.quick;
    let size = a.size_mib.unwrap_or(if q { 256 } else { 1024 }) * MIB;
    let io = MIB;
    if size == 0 || size % io != 0 {
        return util::err("--size-mib must be positive");
    }
    if a.procs.is_empty() || a.procs.contains(&0) {
        return util::err("--procs needs positive process counts");
    }
    if !a.mount.starts_with('/') || a.mount.len() < 2 {
        return util::err("--mount must be an absolute path other than /");
    }
    let div = if q { 4 } else { 1 };
    // Calls per write size: 512 Ki, but at most 256 MiB per file.
    let sweep = [64, 256, KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB]
        .into_iter()
        .map(|s| (s, (512 * KIB).min(256 * MIB / s) / div))
        .collect();
    let parts = if a.only.is_empty() {
        vec![
            preload::Part::Writes,
            preload::Part::Small,
            preload::Part::Replay,
            preload::Part::Meta,
            preload::Part::Readback,
            preload::Part::Passthrough,
        ]
    } else {
        a.only.clone()
    };
    Ok(preload::POpts {
        pid,
        size,
        io,
        reps: a.reps.unwrap_or(if q { 1 } else { 5 }).max(1),
        procs: a.procs.clone(),
        sweep,
        replay_writes: a.replay_writes.unwrap_or(if q { 10_000 } else { 40_000 }),
        meta_files: a.meta_files.unwrap_or(if q { 5000 } else { 20_000 }),
        meta_passes: a.meta_passes.max(1),
        pass_reps: a.pass_reps.unwrap_or(if q { 2 } else { 9 }).max(1),
        pass_calls64: 200_000 / div,
        pass_calls4k: 150_000 / div,
        pass_region: 256 * KIB,
        mount: a.mount.trim_end_matches('/').to_string(),
        lib: a.lib.clone(),
        cc: a.cc.clone(),
        parts,
    })
}

fn build_opts(a: &RunArgs, pid: u32) -> Res<Opts> {
    let q = a.quick;
    let size = a.size_mib.unwrap_or(if q { 256 } else { 1024 }) * MIB;
    let spill_size = a.spill_size_mib.unwrap_or(if q { 128 } else { 512 }) * MIB;
    let base = a.sweep_base.unwrap_or(if q { 4 } else { 2 });
    if base != 2 && base != 4 {
        return util::err("--sweep-base must be 2 or 4");
    }
    let mut sweep = Vec::new();
    let mut cs = 4 * KIB;
    while cs <= 64 * MIB {
        sweep.push(cs);
        cs *= u64::from(base);
    }
    let chunk_size = a.chunk_kib * KIB;
    if !chunk_size.is_power_of_two() || !(4 * KIB..=64 * MIB).contains(&chunk_size) {
        return util::err("--chunk-kib must be a power of two from 4 to 65536");
    }
    let io = MIB;
    if size == 0 || size % io != 0 || spill_size == 0 || spill_size % chunk_size.max(io) != 0 {
        return util::err("sizes must be non-zero multiples of 1 MiB and of the chunk size");
    }
    if a.procs.is_empty() || a.procs.contains(&0) {
        return util::err("--procs needs positive process counts");
    }
    let spill_procs = a
        .spill_procs
        .clone()
        .unwrap_or_else(|| if q { vec![1] } else { vec![1, 2] });
    let rounds = a.rounds.unwrap_or(if q { 4 } else { 8 });
    if rounds <= a.keep {
        return util::err("--rounds must be larger than --keep");
    }
    let benches = if a.only.is_empty() {
        vec![
            Bench::Writes,
            Bench::Steady,
            Bench::Readback,
            Bench::Sweep,
            Bench::Spill,
        ]
    } else {
        a.only.clone()
    };
    Ok(Opts {
        pid,
        size,
        spill_size,
        io,
        chunk_size,
        reps: a.reps.unwrap_or(if q { 1 } else { 5 }).max(1),
        slow_reps: a.slow_reps.unwrap_or(if q { 1 } else { 3 }).max(1),
        spill_reps: a.spill_reps.unwrap_or(if q { 3 } else { 11 }).max(1),
        rounds,
        keep: a.keep,
        procs: a.procs.clone(),
        spill_procs,
        sweep,
        shares: vec![0.0, 3.125, 6.25, 12.5, 25.0, 50.0, 100.0],
        disk_dir: a.disk_dir.clone(),
        spill_dir: a.spill_dir.clone().unwrap_or_else(|| a.disk_dir.clone()),
        benches,
    })
}

/// Cleans up after this run when dropped: on success, on errors and on panics.
struct CleanupGuard {
    pid: u32,
    dirs: Vec<PathBuf>,
}

impl CleanupGuard {
    /// The start of a suite run: removes what an earlier run left in `dirs` (saying so),
    /// creates the output directory `out`, and returns the guard that removes what this run
    /// leaves when it is dropped.
    fn start(pid: u32, dirs: Vec<PathBuf>, out: &Path) -> Res<CleanupGuard> {
        for what in cleanup(None, &dirs) {
            eprintln!("cleanup: removed {what} (left by an earlier run)");
        }
        let guard = CleanupGuard { pid, dirs };
        std::fs::create_dir_all(out).ctx(|| format!("creating {}", out.display()))?;
        Ok(guard)
    }
}

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        for what in cleanup(Some(self.pid), &self.dirs) {
            eprintln!("cleanup: removed leftover {what}");
        }
    }
}

/// The node-store report: header, options, targets and results (node-store.json).
#[derive(serde::Serialize)]
struct NodeStoreReport<'a> {
    #[serde(flatten)]
    header: report::Header,
    options: &'a Opts,
    targets: Vec<report::Target>,
    results: &'a benches::Results,
}

fn run(a: RunArgs) -> Res<()> {
    let opts = build_opts(&a, std::process::id())?;
    let dirs = vec![opts.disk_dir.clone(), opts.spill_dir.clone()];
    let _guard = CleanupGuard::start(opts.pid, dirs, &a.out)?;
    let clock = report::RunClock::start(&opts.disk_dir, &opts.spill_dir);
    let results = benches::run_all(&opts)?;
    let header = clock.finish(&["crates/cascade-store", "bench"]);
    let m = &header.machine;
    let extra = vec![
        (
            format!("disk baseline ({})", opts.disk_dir.display()),
            m.disk_fs.clone(),
        ),
        (
            format!("spill file ({})", opts.spill_dir.display()),
            m.spill_fs.clone(),
        ),
    ];
    let mut md = report::Md {
        tables: benches::tables(&opts, &results),
        ..Default::default()
    };
    md.push(report::machine_table(&header, extra));
    let targets = benches::targets(&opts, &results);
    let rep = NodeStoreReport {
        header,
        options: &opts,
        targets,
        results: &results,
    };
    report::write(
        &a.out,
        "node-store",
        "Cascade node store (L0): benchmarks",
        &rep,
        md,
    )
}

fn run_interposition(a: InterpArgs) -> Res<()> {
    let opts = build_interp_opts(&a, std::process::id())?;
    let _guard = CleanupGuard::start(opts.pid, vec![PathBuf::from("/var/tmp")], &a.out)?;
    let pio = preload::Pio::build(&opts)?;
    let var_tmp = Path::new("/var/tmp");
    let clock = report::RunClock::start(var_tmp, var_tmp);
    eprintln!("library: {}", report::describe(&opts.lib));
    let results = preload::run_all(&opts, &pio)?;
    let dirs = ["crates/cascade-store", "crates/cascade-preload", "bench"];
    let header = clock.finish(&dirs);
    let rep = preload::Report {
        suite: "interposition",
        library: report::describe(&opts.lib),
        cc: pio.cc_version.clone(),
        targets: preload::targets(&opts, &results),
        header,
        options: &opts,
        results: &results,
    };
    let extra = vec![
        ("library".into(), rep.library.clone()),
        ("C compiler".into(), rep.cc.clone()),
    ];
    let mut md = report::Md {
        verdicts: preload::verdicts(&opts, &results),
        ..Default::default()
    };
    md.tables = preload::tables(&opts, &results);
    md.push(report::machine_table(&rep.header, extra));
    let title = "Cascade interposition (LD_PRELOAD): benchmarks";
    report::write(&a.out, "interposition", title, &rep, md)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let who = if matches!(cli.cmd, Cmd::Child { .. } | Cmd::DedupJob) {
        "cascade-bench child"
    } else {
        "cascade-bench"
    };
    let r = match cli.cmd {
        Cmd::Run(a) => run(*a),
        Cmd::Interposition(a) => run_interposition(*a),
        Cmd::Durable(a) => durable::run(*a),
        Cmd::Staging(a) => staging::run(*a),
        Cmd::Fuse(a) => fuse::run(*a),
        Cmd::Dedup(a) => dedup::run(*a),
        Cmd::DedupLink(a) => dedup_link::run(*a),
        Cmd::Jobs(a) => jobs::run(*a),
        Cmd::DedupJob => dedup::run_job(),
        Cmd::Child { job } => child::run(&job),
        Cmd::Cleanup { pid, dir } => {
            for what in cleanup(pid, &dir) {
                println!("removed {what}");
            }
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}
