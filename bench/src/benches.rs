//! The five node-store benchmarks. Each runs every configuration `reps` times, interleaving
//! the methods within a repetition so that slow drift of the machine hits them all alike.

use crate::child::Job;
use crate::first_write::{self, FirstWrite, HugeFirstWrite};
use crate::format::{ratio, st, x};
use crate::harness::{median_setup, run_group, Names, Outcome};
use crate::report::{Table, Target};
use crate::stores::{
    capacity_for, tight_pair_with, with_store_files, Creation, Creations, ReadbackFiles, ShmBase,
    TightPair,
};
use crate::util::{err, gbps, prefix, size_str, Context, Res, Stats, KIB, MIB};
use cascade_store::{SpillConfig, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Which benchmarks to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bench {
    Writes,
    FirstWrite,
    Steady,
    Readback,
    Sweep,
    Spill,
}

/// The options (`cascade-bench run --help`); the fields without an `arg` are derived by
/// [`Opts::resolve`].
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct Opts {
    /// Directory for node-store.md and node-store.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    pub out: PathBuf,
    /// Quick run (about a minute): 256 MiB per process, 1 repetition (slow ones too, spill-over
    /// 3), 4 rounds, chunk sizes in powers of 4, 128 MiB spill-over per process with 1
    /// process. Explicit flags override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Bytes per process in MiB (writes, steady state, sweep, read-back).
    #[arg(long, default_value_t = 1024, default_value_if("quick", "true", "256"))]
    #[serde(skip)]
    size_mib: u64,
    /// Bytes per process in MiB for the spill-over benchmark.
    #[arg(long, default_value_t = 512, default_value_if("quick", "true", "128"))]
    #[serde(skip)]
    spill_size_mib: u64,
    /// Repetitions of each memory-speed measurement (writes, read-back).
    #[arg(long, default_value_t = 5, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// Repetitions of the slow measurements: disk writes, steady state, chunk sweep.
    #[arg(long, default_value_t = 3, default_value_if("quick", "true", "1"))]
    pub slow_reps: usize,
    /// Repetitions of each spill-over point (short runs, so more of them).
    #[arg(long, default_value_t = 11, default_value_if("quick", "true", "3"))]
    pub spill_reps: usize,
    /// Rounds of the steady-state benchmark.
    #[arg(long, default_value_t = 8, default_value_if("quick", "true", "4"))]
    pub rounds: usize,
    /// Checkpoints kept in the steady-state benchmark.
    #[arg(long, default_value_t = 2)]
    pub keep: usize,
    /// Process counts for writes, sweep and read-back.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub procs: Vec<usize>,
    /// Process counts for spill-over.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2",
        default_value_if("quick", "true", "1")
    )]
    pub spill_procs: Vec<usize>,
    /// Chunk sizes of the sweep: every power of 2 or of 4 from 4 KiB to 64 MiB.
    #[arg(long, default_value_t = 2, default_value_if("quick", "true", "4"))]
    #[serde(skip)]
    sweep_base: u64,
    /// Chunk size of the stores outside the sweep, in KiB.
    #[arg(long, default_value_t = 1024)]
    #[serde(skip)]
    chunk_kib: u64,
    /// Benchmarks to run.
    #[arg(
        long = "only",
        value_enum,
        value_delimiter = ',',
        default_value = "writes,first-write,steady,readback,sweep,spill"
    )]
    pub benches: Vec<Bench>,
    /// Directory on local disk for the disk-write baseline.
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    /// Directory on local disk (SSD) for the spill files [default: --disk-dir].
    #[arg(long = "spill-dir")]
    #[serde(skip)]
    spill_dir_arg: Option<PathBuf>,
    #[arg(skip)]
    pub spill_dir: PathBuf,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    /// Bytes per process (writes, steady-state checkpoints, sweep, read-back).
    #[arg(skip)]
    pub size: u64,
    /// Bytes per process in the spill-over benchmark.
    #[arg(skip)]
    pub spill_size: u64,
    /// Bytes per write/read call.
    #[arg(skip = MIB)]
    pub io: u64,
    /// Chunk size of the stores outside the sweep.
    #[arg(skip)]
    pub chunk_size: u64,
    #[arg(skip)]
    pub sweep: Vec<u64>,
    /// Spilled shares, in percent.
    #[arg(skip = vec![0.0, 3.125, 6.25, 12.5, 25.0, 50.0, 100.0])]
    pub shares: Vec<f64>,
}

impl Opts {
    /// Checks the options and derives the byte sizes and the sweep's chunk sizes.
    pub fn resolve(&mut self, pid: u32) -> Res<()> {
        if self.sweep_base != 2 && self.sweep_base != 4 {
            return err("--sweep-base must be 2 or 4");
        }
        self.sweep = std::iter::successors(Some(4 * KIB), |cs| Some(cs * self.sweep_base))
            .take_while(|&cs| cs <= 64 * MIB)
            .collect();
        self.chunk_size = self.chunk_kib * KIB;
        if !self.chunk_size.is_power_of_two() || !(4 * KIB..=64 * MIB).contains(&self.chunk_size) {
            return err("--chunk-kib must be a power of two from 4 to 65536");
        }
        (self.pid, self.size, self.spill_size) =
            (pid, self.size_mib * MIB, self.spill_size_mib * MIB);
        let (size, spill, io) = (self.size, self.spill_size, self.io);
        if size == 0 || size % io != 0 || spill == 0 || spill % self.chunk_size.max(io) != 0 {
            return err("sizes must be non-zero multiples of 1 MiB and of the chunk size");
        }
        if self.procs.is_empty() || self.procs.contains(&0) || self.spill_procs.contains(&0) {
            return err("--procs and --spill-procs need positive process counts");
        }
        if self.rounds <= self.keep {
            return err("--rounds must be larger than --keep");
        }
        if self.reps == 0 || self.slow_reps == 0 || self.spill_reps == 0 {
            return err("repetitions must be positive");
        }
        self.spill_dir = self.spill_dir_arg.clone().unwrap_or(self.disk_dir.clone());
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub method: String,
    pub procs: usize,
    pub gbps: Stats,
    /// Median set-up time of a child (attach, pre-faulting) before the barrier.
    pub setup_s: f64,
}

/// Runs a paired job in `procs` processes and turns its phases into aggregate GB/s.
fn tight_pair(
    opts: &Opts,
    store: &Store,
    base: &ShmBase,
    procs: usize,
    read: bool,
) -> Res<TightPair> {
    tight_pair_with(
        store,
        base,
        procs,
        read,
        opts.size,
        opts.io,
        opts.reps.max(3),
    )
}

#[derive(Debug, Clone, Serialize)]
pub struct SteadySide {
    /// GB/s of each round (median/min/max over the repetitions).
    pub per_round: Vec<Stats>,
    /// GB/s over the rounds after the first `keep` (every one of them deletes a checkpoint).
    pub steady: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct Steady {
    pub bytes: u64,
    pub rounds: usize,
    pub keep: usize,
    pub cascade: SteadySide,
    pub tmpfs: SteadySide,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub chunk_size: u64,
    pub io: u64,
    pub procs: usize,
    pub gbps: Stats,
    pub creation_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpillRow {
    pub procs: usize,
    /// Requested spilled share, percent.
    pub share_pct: f64,
    /// Bytes that really went to the spill file (median over repetitions, all processes).
    pub spilled_bytes: u64,
    pub total_bytes: u64,
    pub gbps: Stats,
    pub seconds: Stats,
    /// From the common start to the last process's last write (before File::sync).
    pub write_s: Stats,
    /// From then to the last process's return from File::sync and close.
    pub sync_s: Stats,
    /// size / (mem/T_mem + ssd/T_ssd), filled in once the 0 % and 100 % runs are known.
    pub predicted_gbps: f64,
    pub deviation_pct: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpillModel {
    pub procs: usize,
    pub t_mem_gbps: f64,
    pub t_ssd_gbps: f64,
    /// The very first run, at 100 % spilled, into a spill file never written before.
    pub first_run_gbps: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Results {
    pub creation: Vec<Creation>,
    pub writes: Vec<Row>,
    pub tight_pairs: Vec<TightPair>,
    pub steady: Option<Steady>,
    /// On the host's /dev/shm.
    pub first_write: Option<FirstWrite>,
    /// On a tmpfs with huge=advise in a private mount namespace.
    pub first_write_huge: Option<HugeFirstWrite>,
    pub readback: Vec<Row>,
    pub sweep: Vec<SweepRow>,
    pub spill: Vec<SpillRow>,
    pub spill_model: Vec<SpillModel>,
}

/// Creates a store (`Prefault::Foreground`, timed), runs `f` with it, then drops this
/// process's handle and destroys the store, also when `f` failed. (After a panic, the run's
/// cleanup guard destroys it.)
fn with_store<T>(
    results: &mut Results,
    pid: u32,
    tag: &str,
    capacity: u64,
    chunk_size: u64,
    spill: Option<SpillConfig>,
    f: impl FnOnce(&mut Results, &Store) -> Res<T>,
) -> Res<T> {
    with_store_files(results, pid, tag, capacity, chunk_size, 4096, spill, f)
}

pub(crate) fn report(section: &str, what: &str, procs: usize, rep: usize, reps: usize, gbps: f64) {
    eprintln!(
        "  [{section}] {what:<18} procs={procs} rep {}/{reps}: {gbps:6.2} GB/s",
        rep + 1
    );
}

pub fn run_all(opts: &Opts) -> Res<Results> {
    let mut results = Results::default();
    let mut names = Names {
        pid: opts.pid,
        counter: 0,
    };
    let want = |b: Bench| opts.benches.contains(&b);
    let max_procs = opts.procs.iter().copied().max().unwrap_or(1);
    if want(Bench::Writes)
        || want(Bench::FirstWrite)
        || want(Bench::Steady)
        || want(Bench::Readback)
    {
        let needed = (max_procs as u64 * opts.size).max((opts.keep as u64 + 1) * opts.size);
        let capacity = capacity_for(needed, opts.chunk_size);
        eprintln!("main store:");
        with_store(
            &mut results,
            opts.pid,
            "main",
            capacity,
            opts.chunk_size,
            None,
            |results, main| {
                // The memcpy-shm baseline memory has the store's life cycle: allocated and
                // pre-faulted once, right after the store, and reused by every repetition.
                let base = ShmBase::create(opts.pid, max_procs as u64 * opts.size)?;
                if want(Bench::Writes) {
                    writes(opts, results, &mut names, main, &base)?;
                }
                if want(Bench::FirstWrite) {
                    first_write(opts, results, main, capacity)?;
                }
                if want(Bench::Steady) {
                    steady(opts, results, main)?;
                }
                if want(Bench::Readback) {
                    readback(opts, results, main, &base)?;
                }
                Ok(())
            },
        )?;
    }
    if want(Bench::Sweep) {
        sweep(opts, &mut results)?;
    }
    if want(Bench::Spill) {
        spill(opts, &mut results)?;
    }
    Ok(results)
}

fn writes(
    opts: &Opts,
    results: &mut Results,
    names: &mut Names,
    store: &Store,
    base: &ShmBase,
) -> Res<()> {
    eprintln!(
        "1. {} writes, {} per process:",
        size_str(opts.io),
        size_str(opts.size)
    );
    let (bytes, io) = (opts.size, opts.io);
    // memcpy-shm and Cascade run back to back (their order alternating between repetitions)
    // so that their per-repetition ratio sees the same machine state. Disk last: deleting its
    // file leaves the kernel some work (discard, freeing page cache).
    let order = |rep: usize| {
        let (a, b) = if rep % 2 == 0 {
            ("memcpy-shm", "cascade")
        } else {
            ("cascade", "memcpy-shm")
        };
        [
            "memcpy-anon",
            "memcpy-shm-fresh",
            "tmpfs-write",
            a,
            b,
            "disk-write",
        ]
    };
    for &p in &opts.procs {
        let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut outs: BTreeMap<&str, Vec<Outcome>> = BTreeMap::new();
        for rep in 0..opts.reps {
            for m in order(rep) {
                if m == "disk-write" && rep >= opts.slow_reps {
                    continue;
                }
                let jobs: Vec<Job> = (0..p)
                    .map(|i| match m {
                        "memcpy-anon" => Job::MemcpyAnon { bytes, io },
                        "memcpy-shm" => Job::MemcpyShm {
                            bytes,
                            io,
                            shm: base.name.clone(),
                            offset: i as u64 * bytes,
                        },
                        "memcpy-shm-fresh" => Job::MemcpyShmFresh {
                            bytes,
                            io,
                            shm: names.next("shm", i),
                        },
                        "tmpfs-write" => Job::FileWrite {
                            bytes,
                            io,
                            path: format!("/dev/shm/{}.dat", names.next("tmpfs", i)),
                            fsync: false,
                        },
                        "disk-write" => Job::FileWrite {
                            bytes,
                            io,
                            path: opts
                                .disk_dir
                                .join(format!("{}.dat", names.next("disk", i)))
                                .display()
                                .to_string(),
                            fsync: true,
                        },
                        _ => Job::StoreWrite {
                            store: store.name().to_string(),
                            path: format!("/w-p{i}-r{rep}.dat"),
                            bytes,
                            io,
                            sync: false,
                            fresh: false,
                            pages: false,
                        },
                    })
                    .collect();
                let out = run_group(&jobs).ctx(|| format!("writes: {m} with {p} processes"))?;
                if m == "disk-write" {
                    let nosync = out.gbps_at("write_end");
                    report("writes", "disk-write", p, rep, opts.reps, nosync);
                    report("writes", "disk-write+fsync", p, rep, opts.reps, out.gbps());
                    samples.entry("disk-write").or_default().push(nosync);
                    samples
                        .entry("disk-write+fsync")
                        .or_default()
                        .push(out.gbps());
                } else {
                    report("writes", m, p, rep, opts.reps, out.gbps());
                    samples.entry(m).or_default().push(out.gbps());
                }
                outs.entry(m).or_default().push(out);
            }
        }
        for m in [
            "memcpy-anon",
            "memcpy-shm",
            "memcpy-shm-fresh",
            "tmpfs-write",
            "disk-write",
            "disk-write+fsync",
            "cascade",
        ] {
            let setup = outs
                .get(m.trim_end_matches("+fsync"))
                .map_or(0.0, |o| median_setup(o));
            results.writes.push(Row {
                method: m.to_string(),
                procs: p,
                gbps: Stats::of(samples.get(m).map_or(&[][..], |v| &v[..])),
                setup_s: setup,
            });
        }
        let tp = tight_pair(opts, store, base, p, false)?;
        results.tight_pairs.push(tp);
    }
    Ok(())
}

fn steady_side(out: &[Outcome], bytes: u64, rounds: usize, keep: usize) -> SteadySide {
    let mut per_round = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let v: Vec<f64> = out
            .iter()
            .filter_map(|o| o.children.first())
            .filter_map(|c| c.rounds.get(r))
            .map(|&(s, e)| gbps(bytes, e - s))
            .collect();
        per_round.push(Stats::of(&v));
    }
    let steady: Vec<f64> = out
        .iter()
        .filter_map(|o| o.children.first())
        .filter_map(|c| {
            let first = c.rounds.get(keep)?;
            let last = c.rounds.last()?;
            Some(gbps(bytes * (rounds - keep) as u64, last.1 - first.0))
        })
        .collect();
    SteadySide {
        per_round,
        steady: Stats::of(&steady),
    }
}

/// 1b: on the host's /dev/shm, then on a huge-page tmpfs in a mount namespace of its own
/// (bench/src/first_write.rs).
fn first_write(opts: &Opts, results: &mut Results, store: &Store, memory: u64) -> Res<()> {
    eprintln!(
        "1b. a fresh process's first {} (written at once after attaching):",
        size_str(opts.size)
    );
    let s = first_write::runs(store, memory, opts.size, opts.io, opts.reps)?;
    results.first_write = Some(s.into());
    results.first_write_huge = Some(first_write::on_huge_pages(
        opts.size,
        opts.io,
        opts.reps,
        opts.chunk_size,
        opts.pid,
        &mut results.creation,
    ));
    Ok(())
}

fn steady(opts: &Opts, results: &mut Results, store: &Store) -> Res<()> {
    eprintln!(
        "2. steady-state checkpointing: {} rounds of {}, keep {}:",
        opts.rounds,
        size_str(opts.size),
        opts.keep
    );
    let mut cas = Vec::new();
    let mut tmp = Vec::new();
    let reps = opts.slow_reps;
    for rep in 0..reps {
        let job = Job::Steady {
            store: Some(store.name().to_string()),
            dir: format!("/ss-{rep}"),
            bytes: opts.size,
            io: opts.io,
            rounds: opts.rounds,
            keep: opts.keep,
        };
        let out = run_group(&[job]).ctx(|| "steady-state: cascade")?;
        report("steady", "cascade", 1, rep, reps, out.gbps());
        cas.push(out);
        let dir = format!("/dev/shm/{}-steady-{rep}", prefix(opts.pid));
        let job = Job::Steady {
            store: None,
            dir: dir.clone(),
            bytes: opts.size,
            io: opts.io,
            rounds: opts.rounds,
            keep: opts.keep,
        };
        let out = run_group(&[job]).ctx(|| "steady-state: tmpfs")?;
        std::fs::remove_dir(&dir).ctx(|| format!("removing {dir}"))?;
        report("steady", "tmpfs", 1, rep, reps, out.gbps());
        tmp.push(out);
    }
    results.steady = Some(Steady {
        bytes: opts.size,
        rounds: opts.rounds,
        keep: opts.keep,
        cascade: steady_side(&cas, opts.size, opts.rounds, opts.keep),
        tmpfs: steady_side(&tmp, opts.size, opts.rounds, opts.keep),
    });
    Ok(())
}

fn readback(opts: &Opts, results: &mut Results, store: &Store, base: &ShmBase) -> Res<()> {
    let max_procs = opts.procs.iter().copied().max().unwrap_or(1);
    let (bytes, io) = (opts.size, opts.io);
    eprintln!(
        "5. read-back, {} reads, {} per process (files written by the parent first):",
        size_str(io),
        size_str(bytes)
    );
    let files = ReadbackFiles::write(store, opts.pid, max_procs, bytes, io)?;
    let methods = ["tmpfs-read", "memcpy-shm-read", "cascade-read"];
    let order = |rep: usize| {
        if rep % 2 == 0 {
            methods
        } else {
            ["tmpfs-read", "cascade-read", "memcpy-shm-read"]
        }
    };
    for &p in &opts.procs {
        let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut outs: BTreeMap<&str, Vec<Outcome>> = BTreeMap::new();
        for rep in 0..opts.reps {
            for m in order(rep) {
                let jobs: Vec<Job> = (0..p)
                    .map(|i| match m {
                        "memcpy-shm-read" => Job::MemcpyShmRead {
                            bytes,
                            io,
                            shm: base.name.clone(),
                            offset: i as u64 * bytes,
                        },
                        "tmpfs-read" => Job::FileRead {
                            path: files.tmpfs[i].clone(),
                            bytes,
                            io,
                        },
                        _ => Job::StoreRead {
                            store: store.name().to_string(),
                            path: ReadbackFiles::store_path(i),
                            bytes,
                            io,
                        },
                    })
                    .collect();
                let out = run_group(&jobs).ctx(|| format!("read-back: {m} with {p} processes"))?;
                report("readback", m, p, rep, opts.reps, out.gbps());
                samples.entry(m).or_default().push(out.gbps());
                outs.entry(m).or_default().push(out);
            }
        }
        for m in methods {
            results.readback.push(Row {
                method: m.to_string(),
                procs: p,
                gbps: Stats::of(samples.get(m).map_or(&[][..], |v| &v[..])),
                setup_s: outs.get(m).map_or(0.0, |o| median_setup(o)),
            });
        }
        let tp = tight_pair(opts, store, base, p, true)?;
        results.tight_pairs.push(tp);
    }
    Ok(())
}

fn sweep(opts: &Opts, results: &mut Results) -> Res<()> {
    let max_procs = opts.procs.iter().copied().max().unwrap_or(1);
    eprintln!(
        "3. chunk-size sweep, {} per process, {} writes (or chunk-sized when larger):",
        size_str(opts.size),
        size_str(opts.io)
    );
    for &cs in &opts.sweep {
        let io = opts.io.max(cs);
        let bytes = opts.size.div_ceil(io) * io;
        let tag = format!("cs{cs}");
        let capacity = capacity_for(max_procs as u64 * bytes, cs);
        with_store(
            results,
            opts.pid,
            &tag,
            capacity,
            cs,
            None,
            |results, st| sweep_one(opts, results, st, cs, io, bytes),
        )?;
    }
    Ok(())
}

fn sweep_one(
    opts: &Opts,
    results: &mut Results,
    st: &Store,
    cs: u64,
    io: u64,
    bytes: u64,
) -> Res<()> {
    let creation_s = results.creation.last().map_or(0.0, |c| c.seconds);
    let reps = opts.slow_reps;
    for &p in &opts.procs {
        let mut v = Vec::new();
        for rep in 0..reps {
            let jobs: Vec<Job> = (0..p)
                .map(|i| Job::StoreWrite {
                    store: st.name().to_string(),
                    path: format!("/sw-p{i}-r{rep}.dat"),
                    bytes,
                    io,
                    sync: false,
                    fresh: false,
                    pages: false,
                })
                .collect();
            let out = run_group(&jobs)
                .ctx(|| format!("sweep: chunk {} with {p} processes", size_str(cs)))?;
            report("sweep", &size_str(cs), p, rep, reps, out.gbps());
            v.push(out.gbps());
        }
        results.sweep.push(SweepRow {
            chunk_size: cs,
            io,
            procs: p,
            gbps: Stats::of(&v),
            creation_s,
        });
    }
    Ok(())
}

fn spill(opts: &Opts, results: &mut Results) -> Res<()> {
    let cs = opts.chunk_size;
    eprintln!(
        "4. spill-over, {} per process, spill file in {}, timing includes File::sync:",
        size_str(opts.spill_size),
        opts.spill_dir.display()
    );
    for &p in &opts.spill_procs {
        let per = opts.spill_size.div_ceil(cs) * cs;
        let total = per * p as u64;
        let spill_cfg = SpillConfig {
            path: opts
                .spill_dir
                .join(format!("{}-spill-p{p}.dat", prefix(opts.pid))),
            size: total + 16 * cs,
        };
        let tag = format!("spill-p{p}");
        let first_row = results.spill.len();
        let first_run = with_store(
            results,
            opts.pid,
            &tag,
            total,
            cs,
            Some(spill_cfg),
            |results, st| spill_runs(opts, results, st, p, per),
        )?;
        fit_formula(results, first_row, p, first_run);
    }
    Ok(())
}

/// All shares on one store whose memory holds all the data: for share s, a filler file
/// (written by a helper process) first occupies s of the memory, so exactly that much of the
/// measured writes must spill. Every share thus uses the same memory pool and the same spill
/// file. The repetitions visit the shares in turn, starting one further each time, so that
/// drift of the machine spreads over all of them. Returns the GB/s of the very first run.
fn spill_runs(opts: &Opts, results: &mut Results, st: &Store, p: usize, per: u64) -> Res<f64> {
    let cs = opts.chunk_size;
    let total = per * p as u64;
    let n = opts.shares.len();
    let fill_of =
        |share: f64| -> u64 { ((total as f64 * share / 100.0 / cs as f64).round() as u64) * cs };
    let mut filler_no = 0u32;
    let mut current: Option<(u64, String)> = None;
    let mut set_filler = |bytes: u64| -> Res<()> {
        if current.as_ref().map(|c| c.0) == Some(bytes) {
            return Ok(());
        }
        filler_no += 1;
        let path = format!("/filler-{filler_no}");
        let job = Job::Filler {
            store: st.name().to_string(),
            old: current.as_ref().map(|c| c.1.clone()),
            path: path.clone(),
            bytes,
        };
        run_group(&[job]).ctx(|| format!("writing a {} filler", size_str(bytes)))?;
        current = Some((bytes, path));
        Ok(())
    };
    let jobs = |tag: &str| -> Vec<Job> {
        (0..p)
            .map(|i| Job::StoreWrite {
                store: st.name().to_string(),
                path: format!("/sp-p{i}-{tag}.dat"),
                bytes: per,
                io: opts.io,
                sync: true,
                fresh: false,
                pages: false,
            })
            .collect()
    };
    // First run: everything spills into a spill file never written before. On a VM that is
    // several times slower than any later run (fresh page cache and disk blocks must be
    // backed by the host); reported apart. It also writes the whole spill area once, and the
    // filler the whole memory, so that later runs all find both warm.
    set_filler(fill_of(100.0))?;
    let first = run_group(&jobs("first")).ctx(|| format!("spill: first run, {p} processes"))?;
    report("spill", "100% first run", p, 0, 1, first.gbps());
    let mut g = vec![Vec::new(); n];
    let mut secs = vec![Vec::new(); n];
    let mut spilled = vec![Vec::new(); n];
    let mut wsecs = vec![Vec::new(); n];
    let mut ssecs = vec![Vec::new(); n];
    for rep in 0..opts.spill_reps {
        for j in 0..n {
            let k = (j + rep) % n;
            let share = opts.shares[k];
            set_filler(fill_of(share))?;
            let out = run_group(&jobs(&format!("r{rep}")))
                .ctx(|| format!("spill: {share} % with {p} processes"))?;
            let s: u64 = out.children.iter().map(|c| c.spilled_bytes).sum();
            report(
                "spill",
                &format!("{share}% ({:.1}% real)", s as f64 * 100.0 / total as f64),
                p,
                rep,
                opts.spill_reps,
                out.gbps(),
            );
            g[k].push(out.gbps());
            secs[k].push(out.seconds());
            spilled[k].push(s as f64);
            let w = out.seconds_at("write_end");
            wsecs[k].push(w);
            ssecs[k].push(out.seconds() - w);
        }
    }
    for (k, &share) in opts.shares.iter().enumerate() {
        results.spill.push(SpillRow {
            procs: p,
            share_pct: share,
            spilled_bytes: Stats::of(&spilled[k]).median as u64,
            total_bytes: total,
            gbps: Stats::of(&g[k]),
            seconds: Stats::of(&secs[k]),
            write_s: Stats::of(&wsecs[k]),
            sync_s: Stats::of(&ssecs[k]),
            predicted_gbps: f64::NAN,
            deviation_pct: f64::NAN,
        });
    }
    Ok(first.gbps())
}

/// T_mem and T_ssd from the runs with the least and the most spilled (0 % and 100 %):
/// solve t = mem/T_mem + ssd/T_ssd for both, then predict every other point.
fn fit_formula(results: &mut Results, first_row: usize, procs: usize, first_run_gbps: f64) {
    let rows = &mut results.spill[first_row..];
    let lo = rows
        .iter()
        .min_by(|a, b| a.spilled_bytes.cmp(&b.spilled_bytes))
        .cloned();
    let hi = rows
        .iter()
        .max_by(|a, b| a.spilled_bytes.cmp(&b.spilled_bytes))
        .cloned();
    let (Some(lo), Some(hi)) = (lo, hi) else {
        return;
    };
    // Unknowns a = 1/T_mem, b = 1/T_ssd (seconds per byte):
    //   lo.t = m1 a + s1 b,  hi.t = m2 a + s2 b.
    let (m1, s1) = (
        (lo.total_bytes - lo.spilled_bytes) as f64,
        lo.spilled_bytes as f64,
    );
    let (m2, s2) = (
        (hi.total_bytes - hi.spilled_bytes) as f64,
        hi.spilled_bytes as f64,
    );
    // Times from the median bandwidths, so that the fit goes exactly through the two points
    // shown in the table.
    let t_of = |r: &SpillRow| r.total_bytes as f64 / (r.gbps.median * 1e9);
    let (t1, t2) = (t_of(&lo), t_of(&hi));
    let det = m1 * s2 - m2 * s1;
    if det.abs() < 1.0 {
        return;
    }
    let a = (t1 * s2 - t2 * s1) / det;
    let b = (m1 * t2 - m2 * t1) / det;
    results.spill_model.push(SpillModel {
        procs,
        t_mem_gbps: 1.0 / a / 1e9,
        t_ssd_gbps: 1.0 / b / 1e9,
        first_run_gbps,
    });
    for r in rows.iter_mut() {
        let mem = (r.total_bytes - r.spilled_bytes) as f64;
        let t = mem * a + r.spilled_bytes as f64 * b;
        r.predicted_gbps = r.total_bytes as f64 / t / 1e9;
        r.deviation_pct = (r.gbps.median - r.predicted_gbps) / r.predicted_gbps * 100.0;
    }
}

// ---------------------------------------------------------------------------------------------
// Targets and tables of node-store.md.

fn find<'a>(rows: &'a [Row], method: &str, procs: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.method == method && r.procs == procs)
}

/// The median GB/s of `a` over that of `b`.
fn row_ratio(a: Option<&Row>, b: Option<&Row>) -> Option<f64> {
    ratio(a?.gbps.median, b?.gbps.median)
}

/// The targets of issue 2, judged on the paired runs (Cascade and memcpy-shm alternating inside
/// the same processes; see bench/README.md).
pub fn targets(opts: &Opts, r: &Results) -> Vec<Target> {
    let per_proc = |rows: &[Row], kind: &str, ours: &str, base: &str| {
        let (mut parts, mut met) = (Vec::new(), None);
        for &p in &opts.procs {
            let Some(tp) = r
                .tight_pairs
                .iter()
                .find(|t| t.kind == kind && t.procs == p)
            else {
                continue;
            };
            let (q, sep) = (
                tp.ratio.median,
                row_ratio(find(rows, ours, p), find(rows, base, p)),
            );
            parts.push(format!(
                "{p} proc: **{q:.2}x** [{:.2}–{:.2}] ({:.2} vs {:.2} GB/s; separate runs {})",
                tp.ratio.min,
                tp.ratio.max,
                tp.cascade_gbps.median,
                tp.memcpy_shm_gbps.median,
                x(sep)
            ));
            met = Some(met.unwrap_or(true) && q >= 0.9);
        }
        (
            if parts.is_empty() {
                "not run".into()
            } else {
                parts.join("; ")
            },
            met,
        )
    };
    let mut out = Vec::new();
    let (m, met) = per_proc(&r.writes, "write", "cascade", "memcpy-shm");
    out.push(Target::new(
        "1 MiB writes",
        ">= 0.9x memcpy into pre-faulted MAP_SHARED /dev/shm",
        m,
        met,
    ));
    let (m, met) = first_write::target(r.first_write.as_ref(), r.first_write_huge.as_ref());
    out.push(Target::new(
        "a job's first checkpoint (issue 24)",
        ">= 0.8x a process with the store mapped in (table 1b)",
        m,
        met,
    ));
    let (m, met) = r.steady.as_ref().map_or(("not run".into(), None), |s| {
        let (c, t) = (s.cascade.steady.median, s.tmpfs.steady.median);
        (
            format!("{:.2}x ({c:.2} vs {t:.2} GB/s)", c / t),
            Some(c / t >= 3.0),
        )
    });
    out.push(Target::new(
        "steady-state checkpointing",
        ">= 3x tmpfs (write new, delete oldest)",
        m,
        met,
    ));
    let worst = r
        .spill
        .iter()
        .filter(|s| s.deviation_pct.is_finite())
        .max_by(|a, b| a.deviation_pct.abs().total_cmp(&b.deviation_pct.abs()));
    let (m, met) = worst.map_or(("not run".into(), None), |s| {
        let d = s.deviation_pct;
        (
            format!(
                "worst {d:+.1} % (at {} % spilled, {} proc)",
                s.share_pct, s.procs
            ),
            Some(d.abs() <= 15.0),
        )
    });
    out.push(Target::new(
        "spill-over",
        "within 15 % of size/(mem/T_mem + ssd/T_ssd)",
        m,
        met,
    ));
    let (m, met) = per_proc(&r.readback, "read", "cascade-read", "memcpy-shm-read");
    out.push(Target::new(
        "read-back",
        ">= 0.9x memcpy from pre-faulted /dev/shm",
        m,
        met,
    ));
    out
}

/// The tables of node-store.md.
pub fn tables(o: &Opts, r: &Results) -> Vec<Table> {
    let mut out = Vec::new();
    let mut t = Table::new(
        "Diagnostic: Cascade / memcpy into the same chunks (chunk-list API), paired runs",
        "kind | procs | ratio | Cascade GB/s | chunks memcpy GB/s",
    );
    for p in &r.tight_pairs {
        let (c, k) = (p.cascade_gbps.median, p.store_chunks_gbps.median);
        t.row([
            p.kind.clone(),
            p.procs.to_string(),
            st(&p.ratio_chunks),
            format!("{c:.2}"),
            format!("{k:.2}"),
        ]);
    }
    out.push(t);
    let mut t = Table::new(
        "Store creation (`Prefault::Foreground`)",
        "store | memory | chunk | spill file | create time (s) | prefault GB/s",
    );
    for c in &r.creation {
        let spill = if c.spill_bytes > 0 {
            size_str(c.spill_bytes)
        } else {
            "-".into()
        };
        let (cap, cs) = (size_str(c.capacity), size_str(c.chunk_size));
        t.row([
            c.store.clone(),
            cap,
            cs,
            spill,
            format!("{:.3}", c.seconds),
            format!("{:.2}", c.gbps),
        ]);
    }
    out.push(t);
    let (io, size) = (size_str(o.io), size_str(o.size));
    let mut t = Table::new(
        format!("1. {io} writes, {size} per process"),
        "method | procs | GB/s | vs memcpy anon | vs memcpy shm | vs tmpfs write | set-up (s)",
    );
    for row in &r.writes {
        let vs = |b: &str| x(row_ratio(Some(row), find(&r.writes, b, row.procs)));
        let (a, s, f) = (vs("memcpy-anon"), vs("memcpy-shm"), vs("tmpfs-write"));
        t.row([
            row.method.clone(),
            row.procs.to_string(),
            st(&row.gbps),
            a,
            s,
            f,
            format!("{:.2}", row.setup_s),
        ]);
    }
    out.push(t);
    if let Some(fw) = &r.first_write {
        let mut t = Table::new(
            format!(
                "1b. A job's first checkpoint: {} written by a process at once after attaching",
                size_str(fw.bytes)
            ),
            "/dev/shm | process | Cascade GB/s | / mapped in",
        );
        first_write::rows(&mut t, "host's /dev/shm", fw);
        let huge = "tmpfs `huge=advise` on /dev/shm, private mount namespace";
        match &r.first_write_huge {
            Some(HugeFirstWrite::Ran(h)) => first_write::rows(&mut t, huge, h),
            Some(HugeFirstWrite::NotRun(why)) => t.row([
                huge.to_string(),
                format!("not run: {why}"),
                "-".into(),
                "-".into(),
            ]),
            None => {}
        }
        out.push(t);
    }
    if let Some(sd) = &r.steady {
        let mut t = Table::new(
            format!(
                "2. Steady-state checkpointing, {} files, {} kept",
                size_str(sd.bytes),
                sd.keep
            ),
            "round | Cascade GB/s | tmpfs GB/s | Cascade / tmpfs",
        );
        for (i, (c, f)) in sd
            .cascade
            .per_round
            .iter()
            .zip(&sd.tmpfs.per_round)
            .enumerate()
        {
            t.row([
                (i + 1).to_string(),
                st(c),
                st(f),
                format!("{:.2}x", c.median / f.median),
            ]);
        }
        let (c, f) = (&sd.cascade.steady, &sd.tmpfs.steady);
        t.row([
            "**steady state**".into(),
            st(c),
            st(f),
            format!("{:.2}x", c.median / f.median),
        ]);
        out.push(t);
    }
    let mut head = vec![
        "chunk".to_string(),
        "write size".into(),
        "create (s)".into(),
    ];
    for p in &o.procs {
        head.extend([format!("{p} proc GB/s"), "vs memcpy shm".into()]);
    }
    let mut t = Table::with_head(format!("3. Chunk-size sweep, {size} per process"), &head);
    let mut sizes: Vec<u64> = r.sweep.iter().map(|x| x.chunk_size).collect();
    sizes.dedup();
    for cs in sizes {
        let rows: Vec<_> = r.sweep.iter().filter(|x| x.chunk_size == cs).collect();
        let Some(first) = rows.first() else { continue };
        let mut cells = vec![
            size_str(cs),
            size_str(first.io),
            format!("{:.3}", first.creation_s),
        ];
        for &p in &o.procs {
            // memcpy-shm to compare with: the paired runs' median, else the table's.
            let base = r
                .tight_pairs
                .iter()
                .find(|t| t.kind == "write" && t.procs == p);
            let base = base.map(|t| t.memcpy_shm_gbps.median);
            let base = base.or_else(|| find(&r.writes, "memcpy-shm", p).map(|b| b.gbps.median));
            match rows.iter().find(|x| x.procs == p) {
                Some(row) => cells.extend([st(&row.gbps), x(ratio(row.gbps.median, base))]),
                None => cells.extend(["-".into(), "-".into()]),
            }
        }
        t.row(cells);
    }
    out.push(t);
    let mut t = Table::new(
        format!(
            "4. Spill-over, {} per process: model",
            size_str(o.spill_size)
        ),
        "procs | T_mem GB/s | T_ssd GB/s | first run (100 %, new spill file) GB/s",
    );
    for m in &r.spill_model {
        let f = |v: f64| format!("{v:.2}");
        t.row([
            m.procs.to_string(),
            f(m.t_mem_gbps),
            f(m.t_ssd_gbps),
            f(m.first_run_gbps),
        ]);
    }
    out.push(t);
    let mut t = Table::new(format!("4. Spill-over, {} per process", size_str(o.spill_size)), "procs | spilled (target) | spilled (real) | measured GB/s | formula GB/s | deviation | writes (ms) | sync (ms)");
    for s in &r.spill {
        let real = s.spilled_bytes as f64 * 100.0 / s.total_bytes as f64;
        t.row([
            s.procs.to_string(),
            format!("{} %", s.share_pct),
            format!("{real:.2} %"),
            st(&s.gbps),
            format!("{:.2}", s.predicted_gbps),
            format!("{:+.1} %", s.deviation_pct),
            format!("{:.0}", s.write_s.median * 1e3),
            format!("{:.0}", s.sync_s.median * 1e3),
        ]);
    }
    out.push(t);
    let mut t = Table::new(
        format!("5. Read-back, {io} reads, {size} per process"),
        "method | procs | GB/s | vs memcpy shm | vs tmpfs read | set-up (s)",
    );
    for row in &r.readback {
        let vs = |b: &str| x(row_ratio(Some(row), find(&r.readback, b, row.procs)));
        let (s, f) = (vs("memcpy-shm-read"), vs("tmpfs-read"));
        t.row([
            row.method.clone(),
            row.procs.to_string(),
            st(&row.gbps),
            s,
            f,
            format!("{:.2}", row.setup_s),
        ]);
    }
    out.push(t);
    out.retain(|t| !t.rows.is_empty());
    out
}

impl Creations for Results {
    fn creations(&mut self) -> &mut Vec<Creation> {
        &mut self.creation
    }
}
