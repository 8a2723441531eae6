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
mod first_write;
mod format;
mod fuse;
mod harness;
mod hostile;
mod jobs;
mod net;
mod preload;
mod procs;
mod report;
mod staging;
mod stores;
mod util;

use benches::Opts;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use util::{cleanup, Context, Res};

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
    Run(Box<Opts>),
    /// Run the interposition (LD_PRELOAD) benchmarks; write interposition.md and
    /// interposition.json into --out.
    Interposition(Box<preload::POpts>),
    /// Run the durable-store benchmark (needs bench/netns-s3.sh up); write durable.md and
    /// durable.json into --out.
    Durable(Box<durable::DOpts>),
    /// Run the staging-server (L1) benchmark (needs root; the checkpoint part needs
    /// bench/netns-s3.sh and bench/netns-staging.sh up); write staging.md and staging.json
    /// into --out.
    Staging(Box<staging::SOpts>),
    /// Run the FUSE front-end benchmark (needs root): `cascade mount` against LD_PRELOAD,
    /// tmpfs, local disk and memcpy; write fuse.md and fuse.json into --out.
    Fuse(Box<fuse::FOpts>),
    /// Run the dedup-repository benchmark: `cascade-dedup` against restic, borg, cp and
    /// zstd on real checkpoint series (bench/datasets); write dedup.md and dedup.json into
    /// --out.
    Dedup(Box<dedup::DOpts>),
    /// Run the end-to-end dedup benchmark (needs bench/netns-s3.sh up and the dedup suite's
    /// datasets): time until durable over the shaped link per snapshot of each series, with
    /// the agent's dedup repository and with the plain layout; write dedup-link.md and
    /// dedup-link.json into --out.
    DedupLink(Box<dedup_link::DedupLinkArgs>),
    /// Run the jobs benchmark (needs bench/netns-s3.sh up): time to a complete checkpoint of
    /// a job on 1, 2, 4 simulated nodes against the ranks writing straight to S3, and what the
    /// job-wide completion costs; write jobs.md and jobs.json into --out.
    Jobs(Box<jobs::JOpts>),
    /// Run the hostile-client soak: a staging server under slow clients, stalled readers,
    /// forged names, replayed handshakes, fuzz and a connection flood, against the same
    /// well-behaved clients without them; write hostile.md and hostile.json into --out.
    Hostile(Box<hostile::HOpts>),
    /// Internal: a staging server (`cascade_staging::Server`) for the hostile suite.
    #[command(hide = true, name = "stage-server")]
    StageServer(hostile::ServeArgs),
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
    /// Internal: the huge-page part of node-store's table 1b, run by `run` inside a private
    /// mount namespace with a tmpfs (huge=advise) on /dev/shm; answers with one JSON line.
    #[command(hide = true, name = "first-write-huge")]
    FirstWriteHuge(first_write::HugeArgs),
    /// Internal: run one job of the dedup suite (JSON on stdin, result on stdout).
    #[command(hide = true)]
    DedupJob,
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

fn run(mut opts: Opts) -> Res<()> {
    opts.resolve(std::process::id())?;
    let dirs = vec![opts.disk_dir.clone(), opts.spill_dir.clone()];
    let _guard = CleanupGuard::start(opts.pid, dirs, &opts.out)?;
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
        &opts.out,
        "node-store",
        "Cascade node store (L0): benchmarks",
        &rep,
        md,
    )
}

fn run_interposition(mut opts: preload::POpts) -> Res<()> {
    opts.resolve(std::process::id())?;
    let _guard = CleanupGuard::start(opts.pid, vec![PathBuf::from("/var/tmp")], &opts.out)?;
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
    report::write(&opts.out, "interposition", title, &rep, md)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let who = if matches!(
        cli.cmd,
        Cmd::Child { .. } | Cmd::DedupJob | Cmd::StageServer(_) | Cmd::FirstWriteHuge(_)
    ) {
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
        Cmd::Hostile(a) => hostile::run(*a),
        Cmd::StageServer(a) => hostile::serve(a),
        Cmd::DedupJob => dedup::run_job(),
        Cmd::FirstWriteHuge(a) => first_write::run_in_namespace(a),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cmd {
        let argv = [&["cascade-bench"], args].concat();
        Cli::try_parse_from(argv).map(|c| c.cmd).expect("parses")
    }

    /// --quick changes the defaults it names; explicit flags override it.
    #[test]
    fn quick_defaults_and_overrides() {
        let Cmd::Staging(full) = parse(&["staging"]) else {
            panic!()
        };
        assert_eq!((full.reps, &full.procs[..]), (3, &[1, 2, 4, 8][..]));
        let Cmd::Staging(q) = parse(&["staging", "--quick"]) else {
            panic!()
        };
        assert_eq!(
            (q.reps, &q.procs[..], &q.servers[..]),
            (1, &[1, 4][..], &[1, 2][..])
        );
        let Cmd::Staging(o) = parse(&["staging", "--quick", "--procs", "2,3"]) else {
            panic!()
        };
        assert_eq!(&o.procs[..], &[2, 3]);
        let Cmd::Run(mut n) = parse(&["run", "--quick"]) else {
            panic!()
        };
        n.resolve(1).expect("valid");
        assert_eq!((n.size, n.rounds), (256 << 20, 4));
        assert_eq!((n.sweep.len(), &n.spill_procs[..]), (8, &[1][..]));
        assert_eq!(n.spill_dir, n.disk_dir);
        let Cmd::Interposition(mut i) = parse(&["interposition", "--quick"]) else {
            panic!()
        };
        i.resolve(1).expect("valid");
        assert_eq!(
            (i.replay_writes, i.pass_calls64, i.parts.len()),
            (10_000, 50_000, 7)
        );
        let Cmd::Hostile(h) = parse(&["hostile", "--quick"]) else {
            panic!()
        };
        assert_eq!((h.seconds, h.attackers.len()), (10, 6));
        let Cmd::Hostile(h) = parse(&["hostile", "--quick", "--seconds", "30"]) else {
            panic!()
        };
        assert_eq!(h.seconds, 30);
        let Cmd::Dedup(d) = parse(&["dedup", "--quick"]) else {
            panic!()
        };
        assert_eq!(d.datasets, Path::new("/var/tmp/cascade-datasets-quick"));
    }
}
