//! `cascade-bench dedup`: the content-addressed repository of `cascade-dedup` (chunk + hash +
//! compress + store into a durable store) against restic and borg from Debian, a plain copy
//! (`cp -r`) and `zstd -1`, on the real checkpoint series of bench/datasets (torch, numpy,
//! lammps), all measured in the same run. Writes dedup.md and dedup.json (bench/plot.py draws
//! dedup.png from it). See bench/README.md.
//!
//! Every ingest of ours runs in a child process (this executable, hidden `dedup-job`
//! subcommand, the job as JSON on stdin, the result as one JSON line on stdout): a fresh
//! repository in a durable store that is a directory on local disk (`--disk-dir`) or on tmpfs
//! (`--tmpfs-dir`), snap-00.. ingested in order, one writer session and one manifest per
//! snapshot. Timed: add_file + finish + write_manifest over all snapshots; CPU from
//! getrusage(RUSAGE_SELF) of the child (all its threads). Then the repository is reopened,
//! the last snapshot restored into files and checked against the source's BLAKE3, and (in
//! the first repetition) every snapshot restored and checked. restic, borg, cp and zstd run as
//! processes (fresh repositories; CPU from getrusage(RUSAGE_CHILDREN)). Parts `breakdown` and
//! `profile` put the ingest time in proportion: each step of the ingest's work timed alone on
//! one thread (reference passes), and `perf record` of one ingest.

use crate::datasets::{load_series, Series, SeriesInfo, Snap, SrcFile};
use crate::format::{median_u64, ratio_fine as ratio, st_fine as st};
use crate::procs::tool_version;
use crate::report::{self, machine_table, Header, Md, RunClock, Table, Target};
use crate::util::{self, err, prefix, rotated, Context, Res, Stats};
use cascade_dedup::repo::{FileBase, FileRecipe, Repo, DEFAULT_PREFIX};
use cascade_dedup::{Chunking, Compression};
use cascade_durable::DurableStore;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufWriter, Read, Write as _};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

/// Parts of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Our repository, every configuration and store.
    Cascade,
    /// restic (fresh repository each repetition), with its start-up measured apart.
    Restic,
    /// borg (fresh repository each repetition), with its start-up measured apart.
    Borg,
    /// `cp -r` of the series into the store directories (a durable store without dedup).
    Cp,
    /// `zstd -1` of every file (compression only).
    Zstd,
    /// Reading and BLAKE3-hashing the series (the floor of any dedup).
    Hash,
    /// Each step of the ingest's work timed alone on one thread (reference passes).
    Breakdown,
    /// `perf record` of one ingest per series (default configuration, disk store).
    Profile,
}

/// Where a durable store (or a copy) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// A directory on local disk (--disk-dir).
    Disk,
    /// A directory on tmpfs (--tmpfs-dir): the same code without the disk's write cost.
    Tmpfs,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Disk => "disk",
            StoreKind::Tmpfs => "tmpfs",
        }
    }
}

/// The first two are the agent's default (`--dedup on`, `dedup.compress = auto` at its
/// starting level, deltas on: docs/dedup.md, "Choosing the default") without and with
/// deltas; the rest are the candidates it was chosen from.
const DEFAULT_CONFIGS: [&str; 8] = [
    "fixed:64KiB+zstd:-2",
    "fixed:64KiB+zstd:-2+delta",
    "fixed:64KiB+zstd:-1+delta",
    "fixed:64KiB+zstd:-3+delta",
    "cdc:avg=64KiB+zstd:-2+delta",
    "cdc:avg=64KiB+zstd:1+delta",
    "fixed:4KiB+zstd:1+delta",
    "cdc:avg=64KiB+none",
];

/// The options (`cascade-bench dedup --help`); the fields without an `arg` are derived by
/// [`DOpts::resolve`].
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct DOpts {
    /// Directory for dedup.md and dedup.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: the --quick series of make.sh (3 small snapshots each, in
    /// /var/tmp/cascade-datasets-quick), 1 repetition. Explicit flags override.
    #[arg(long)]
    pub quick: bool,
    /// Parts to run.
    #[arg(
        long = "only",
        value_enum,
        value_delimiter = ',',
        default_value = "cascade,restic,borg,cp,zstd,hash,breakdown,profile"
    )]
    pub parts: Vec<Part>,
    /// Repetitions of each measurement; tables show the median.
    #[arg(long, default_value_t = 5, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// Series (made by bench/datasets/make.sh).
    #[arg(long, value_delimiter = ',', default_value = "torch,numpy,lammps")]
    pub series: Vec<String>,
    /// A configuration of ours, CHUNKING+COMPRESSION[+delta] (e.g. cdc:avg=64KiB+zstd:1;
    /// +delta: each file is added with the previous snapshot's as its base, docs/dedup.md
    /// "Delta blobs"); repeat the flag for several. The first one is the one the goals are
    /// checked on, with its +delta form when that is run too [default: fixed:64KiB+zstd:-2,
    /// fixed:64KiB+zstd:-2+delta (the agent's default), fixed:64KiB+zstd:-1+delta,
    /// fixed:64KiB+zstd:-3+delta, cdc:avg=64KiB+zstd:-2+delta, cdc:avg=64KiB+zstd:1+delta,
    /// fixed:4KiB+zstd:1+delta, cdc:avg=64KiB+none].
    #[arg(long = "config")]
    #[serde(skip)]
    config_specs: Vec<String>,
    /// Durable stores for our repository and for cp.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "disk,tmpfs")]
    pub stores: Vec<StoreKind>,
    /// Where the series are (generated there by make.sh when missing).
    #[arg(
        long,
        default_value = "/var/tmp/cascade-datasets",
        default_value_if("quick", "true", "/var/tmp/cascade-datasets-quick")
    )]
    pub datasets: PathBuf,
    /// bench/datasets/make.sh (run with --quick under --quick; idempotent).
    #[arg(long, default_value = "bench/datasets/make.sh")]
    pub make: PathBuf,
    /// Local disk: the disk store, the restic and borg repositories, the zstd output.
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    /// tmpfs: the tmpfs store.
    #[arg(long, default_value = "/dev/shm")]
    pub tmpfs_dir: PathBuf,
    #[arg(long, default_value = "restic")]
    pub restic: String,
    #[arg(long, default_value = "borg")]
    pub borg: String,
    #[arg(long, default_value = "zstd")]
    pub zstd: String,
    #[arg(long, default_value = "perf")]
    pub perf: String,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    #[arg(skip)]
    pub configs: Vec<Config>,
}

/// One configuration of ours.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// "cdc:avg=64KiB+zstd:1".
    pub label: String,
    pub chunking: String,
    pub compression: String,
    /// Files are added with the previous snapshot's as their base (delta blobs).
    pub delta: bool,
}

impl DOpts {
    fn want(&self, p: Part) -> bool {
        self.parts.contains(&p)
    }
    fn dir_of(&self, s: StoreKind) -> &Path {
        match s {
            StoreKind::Disk => &self.disk_dir,
            StoreKind::Tmpfs => &self.tmpfs_dir,
        }
    }
}

fn parse_config(spec: &str) -> Res<Config> {
    let (spec, delta) = match spec.strip_suffix("+delta") {
        Some(rest) => (rest, true),
        None => (spec, false),
    };
    let Some((c, z)) = spec.split_once('+') else {
        return err(format!(
            "--config {spec}: expected CHUNKING+COMPRESSION[+delta], e.g. cdc:avg=64KiB+zstd:1"
        ));
    };
    let chunking: Chunking = c
        .parse()
        .map_err(|e: cascade_dedup::ParseChunkingError| util::BenchError(e.0))?;
    let compression: Compression = z
        .parse()
        .map_err(|e: cascade_dedup::ParseCompressionError| util::BenchError(e.0))?;
    Ok(Config {
        label: format!(
            "{chunking}+{compression}{}",
            if delta { "+delta" } else { "" }
        ),
        chunking: chunking.to_string(),
        compression: compression.to_string(),
        delta,
    })
}

impl DOpts {
    /// Checks the options and parses the configurations.
    fn resolve(&mut self, pid: u32) -> Res<()> {
        self.pid = pid;
        if self.config_specs.is_empty() {
            self.config_specs = DEFAULT_CONFIGS.iter().map(|s| s.to_string()).collect();
        }
        self.configs = self
            .config_specs
            .iter()
            .map(|s| parse_config(s))
            .collect::<Res<_>>()?;
        if self.series.is_empty() || self.stores.is_empty() || self.reps == 0 {
            return err("--series and --stores need at least one entry, --reps must be positive");
        }
        for s in &self.series {
            if !["torch", "numpy", "lammps"].contains(&s.as_str()) {
                return err(format!(
                    "--series: unknown series {s} (torch, numpy, lammps)"
                ));
            }
        }
        self.stores.dedup();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Repository sizes.

/// Files and bytes (apparent sizes) under `dir`; (0, 0) when it does not exist.
fn tree_bytes(dir: &Path) -> (u64, u64) {
    let files = cascade_testkit::files_below(dir);
    let sizes = files.iter().filter_map(|p| p.symlink_metadata().ok());
    (files.len() as u64, sizes.map(|m| m.len()).sum())
}

// ---------------------------------------------------------------------------------------------
// Jobs: what a child process runs.

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
enum Job {
    Ingest(IngestJob),
    Hash(HashJob),
    Breakdown(BreakdownJob),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct IngestJob {
    series: String,
    snaps: Vec<Snap>,
    /// The durable store's directory (fresh).
    durable: PathBuf,
    /// Where the last snapshot is restored to (same file system).
    restore_dir: PathBuf,
    chunking: String,
    compression: String,
    /// Each file added with the previous snapshot's file of the same name as its base.
    delta: bool,
    /// Restore and check every snapshot, not only the last.
    verify_all: bool,
    /// syncfs(2) the store's file system after the ingest, timed apart.
    sync: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HashJob {
    files: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct BreakdownJob {
    files: Vec<PathBuf>,
    chunking: String,
    compression: String,
    /// (store name, fresh durable directory) for the pack writes.
    stores: Vec<(String, PathBuf)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
enum JobOut {
    Ingest(Box<IngestOut>),
    Hash(HashOut),
    Breakdown(BreakdownOut),
}

/// `WriteStats` of cascade-dedup, as the bench records it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WStats {
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub new_chunks: u64,
    pub new_bytes: u64,
    pub stored_data_bytes: u64,
    pub stored_tree_bytes: u64,
    pub packs: u64,
    #[serde(default)]
    pub delta_chunks: u64,
}

impl WStats {
    fn add(&mut self, o: &WStats) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.chunks += o.chunks;
        self.new_chunks += o.new_chunks;
        self.new_bytes += o.new_bytes;
        self.stored_data_bytes += o.stored_data_bytes;
        self.stored_tree_bytes += o.stored_tree_bytes;
        self.packs += o.packs;
        self.delta_chunks += o.delta_chunks;
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SnapOut {
    pub name: String,
    pub bytes: u64,
    pub seconds: f64,
    pub stats: WStats,
}

/// Bytes of the repository's objects by kind (files under `<durable>/.cascade-dedup`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RepoBytes {
    pub packs: u64,
    pub pack_objects: u64,
    pub index: u64,
    pub manifests: u64,
    pub config: u64,
    pub other: u64,
    pub total: u64,
    /// Everything in the durable directory (the repository and anything else).
    pub durable_total: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IngestOut {
    /// DurableStore::open + Repo::open of the fresh repository.
    pub open_s: f64,
    /// add_file + finish + write_manifest over all snapshots.
    pub ingest_s: f64,
    /// Of it, the writers' own work (`WriteStats::ingest_nanos`: cutting, hashing,
    /// compressing, from the first file to the last pack written, less waits for uploads);
    /// the rest is per-checkpoint set-up and waiting for the durable store (the session,
    /// full upload queues, the last packs, the index object and the manifest).
    #[serde(default)]
    pub own_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub snaps: Vec<SnapOut>,
    pub stats: WStats,
    pub sync_s: Option<f64>,
    pub stored: RepoBytes,
    /// Opening the repository again (index objects loaded).
    pub reopen_s: f64,
    /// Restoring the last snapshot into files (read_manifest + restore_file, verified).
    pub restore_s: f64,
    pub restore_bytes: u64,
    pub restore_cpu_s: f64,
    /// Restoring every snapshot into a sink (verify_all).
    pub verify_s: Option<f64>,
    pub verify_bytes: u64,
    pub verified_snapshots: usize,
    pub verified_files: usize,
    /// Anything that did not match the source.
    pub problems: Vec<String>,
    pub max_rss_kib: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HashOut {
    pub bytes: u64,
    /// read() of every file with 1 MiB calls (page cache).
    pub read_s: f64,
    /// The same with BLAKE3 of every buffer (one thread).
    pub read_hash_s: f64,
    /// BLAKE3 of every file in memory, one thread.
    pub hash1_s: f64,
    /// BLAKE3 of every 64 KiB piece in memory, all cores (rayon).
    pub hash_par_s: f64,
    pub threads: usize,
}

/// One step of the ingest's work, timed alone on one thread over the whole series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stage {
    /// "read", "cut-points", "score-1t", "hash-1t", "compress-1t", "pack-hash-1t",
    /// "pack-write-1t".
    pub key: String,
    /// The store written to ("pack-write-1t"; None: a pass over the series in memory, or the
    /// read).
    pub store: Option<String>,
    pub seconds: f64,
    /// Bytes the step processed.
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BreakdownOut {
    pub input: u64,
    /// rayon's threads in the child (one per core).
    pub threads: usize,
    pub chunks: u64,
    /// The first occurrence of each score in the series: what the writer stores.
    pub fresh_chunks: u64,
    pub fresh_bytes: u64,
    /// New chunks zstd was tried on but that did not pay (stored raw).
    pub raw_chunks: u64,
    pub raw_bytes: u64,
    /// Bytes into packs (the new chunks in their stored form).
    pub stored_bytes: u64,
    /// Packs of DEFAULT_PACK_SIZE bytes (the last one smaller).
    pub packs: u64,
    pub stages: Vec<Stage>,
}

impl BreakdownOut {
    fn push(&mut self, key: &str, store: Option<&str>, seconds: f64, bytes: u64) {
        self.stages.push(Stage {
            key: key.to_string(),
            store: store.map(str::to_string),
            seconds,
            bytes,
        });
    }
    /// A pass in memory (or the read).
    fn stage(&self, key: &str) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.key == key && s.store.is_none())
    }
    fn secs(&self, key: &str) -> f64 {
        self.stage(key).map_or(0.0, |s| s.seconds)
    }
    /// The pack writes into `store`.
    fn pack_writes(&self, store: StoreKind) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.key == "pack-write-1t" && s.store.as_deref() == Some(store.name()))
    }
    fn write_secs(&self, store: StoreKind) -> f64 {
        self.pack_writes(store).map_or(0.0, |s| s.seconds)
    }
}

/// (user, system) CPU seconds and peak RSS (KiB) of `who` (RUSAGE_SELF or RUSAGE_CHILDREN).
fn rusage(who: libc::c_int) -> (f64, f64, i64) {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid and writable; `who` is RUSAGE_SELF or RUSAGE_CHILDREN.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime), ru.ru_maxrss)
}

/// syncfs(2) of the file system holding `dir`: seconds.
fn syncfs(dir: &Path) -> Res<f64> {
    let f = std::fs::File::open(dir).ctx(|| format!("opening {}", dir.display()))?;
    let t = Instant::now();
    // SAFETY: a valid open descriptor.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return err(format!(
            "syncfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The hidden `dedup-job` subcommand: a job as JSON on stdin, its result as one JSON line on
/// stdout.
pub fn run_job() -> Res<()> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .ctx(|| "reading the job from stdin")?;
    let job: Job = serde_json::from_str(&text).ctx(|| "decoding the job")?;
    let out = match job {
        Job::Ingest(j) => JobOut::Ingest(Box::new(ingest(&j)?)),
        Job::Hash(j) => JobOut::Hash(hash_job(&j)?),
        Job::Breakdown(j) => JobOut::Breakdown(breakdown(&j)?),
    };
    let line = serde_json::to_string(&out).ctx(|| "encoding the result")?;
    println!("{line}");
    Ok(())
}

fn parse_pair(chunking: &str, compression: &str) -> Res<(Chunking, Compression)> {
    let c: Chunking = chunking
        .parse()
        .map_err(|e: cascade_dedup::ParseChunkingError| util::BenchError(e.0))?;
    let z: Compression = compression
        .parse()
        .map_err(|e: cascade_dedup::ParseCompressionError| util::BenchError(e.0))?;
    Ok((c, z))
}

fn open_repo(dir: &Path, c: Chunking, z: Compression) -> Res<Repo> {
    let spec = dir
        .to_str()
        .ok_or_else(|| util::BenchError(format!("{} is not UTF-8", dir.display())))?;
    let durable =
        Arc::new(DurableStore::open(spec).ctx(|| format!("opening the durable store {spec}"))?);
    Repo::open(durable, DEFAULT_PREFIX, c, z).ctx(|| format!("opening the repository in {spec}"))
}

fn repo_bytes(durable: &Path) -> RepoBytes {
    let root = durable.join(DEFAULT_PREFIX);
    let (pack_objects, packs) = tree_bytes(&root.join("packs"));
    let index = tree_bytes(&root.join("index")).1;
    let manifests = tree_bytes(&root.join("manifests")).1;
    let config = std::fs::metadata(root.join("config.json")).map_or(0, |m| m.len());
    let total = tree_bytes(&root).1;
    RepoBytes {
        packs,
        pack_objects,
        index,
        manifests,
        config,
        other: total.saturating_sub(packs + index + manifests + config),
        total,
        durable_total: tree_bytes(durable).1,
    }
}

fn check_recipe(r: &FileRecipe, f: &SrcFile, what: &str, problems: &mut Vec<String>) -> bool {
    if r.size != f.size || r.blake3 != f.blake3 {
        problems.push(format!(
            "{what} {}: {} bytes with BLAKE3 {}, the source has {} bytes with {}",
            f.rel, r.size, r.blake3, f.size, f.blake3
        ));
        false
    } else {
        true
    }
}

/// A read-only map of a snapshot file (a delta's base: its pages are in the page cache, as a
/// previous checkpoint is in the agent's store).
fn map_file(path: &Path) -> Res<memmap2::Mmap> {
    let file = std::fs::File::open(path).ctx(|| format!("opening {}", path.display()))?;
    // SAFETY: the series' files are not changed while the bench runs; a file changed under
    // the map would only make its chunks fail the base check (scores), never corrupt data.
    unsafe { memmap2::Mmap::map(&file) }.ctx(|| format!("mapping {}", path.display()))
}

fn ingest(j: &IngestJob) -> Res<IngestOut> {
    let (chunking, compression) = parse_pair(&j.chunking, &j.compression)?;
    let mut out = IngestOut::default();
    let t = Instant::now();
    let repo = open_repo(&j.durable, chunking, compression)?;
    out.open_s = t.elapsed().as_secs_f64();
    let (u0, s0, _) = rusage(libc::RUSAGE_SELF);
    let t0 = Instant::now();
    let mut all_recipes: Vec<Vec<FileRecipe>> = Vec::new();
    for (k, snap) in j.snaps.iter().enumerate() {
        let ts = Instant::now();
        let mut w = repo.writer();
        let mut recipes = Vec::with_capacity(snap.files.len());
        // The previous snapshot's files by name, mapped as the agent has them in its store.
        let previous: HashMap<&str, (&SrcFile, &FileRecipe)> = match k.checked_sub(1) {
            Some(p) if j.delta => j.snaps[p]
                .files
                .iter()
                .zip(&all_recipes[p])
                .map(|(f, r)| (f.rel.as_str(), (f, r)))
                .collect(),
            _ => HashMap::new(),
        };
        for f in &snap.files {
            let file =
                std::fs::File::open(&f.path).ctx(|| format!("opening {}", f.path.display()))?;
            let base_map = match previous.get(f.rel.as_str()) {
                Some((pf, _)) => Some(map_file(&pf.path)?),
                None => None,
            };
            let base = previous
                .get(f.rel.as_str())
                .zip(base_map.as_ref())
                .map(|((_, recipe), bytes)| FileBase { recipe, bytes });
            recipes.push(
                w.add_file_with_base(&f.rel, file, base)
                    .ctx(|| format!("add_file {}", f.path.display()))?,
            );
        }
        let st = w.finish().ctx(|| format!("finishing {}", snap.name))?;
        out.own_s += st.ingest_nanos as f64 / 1e9;
        repo.write_manifest(&format!("{}/{}", j.series, snap.name), recipes.clone())
            .ctx(|| format!("writing the manifest of {}", snap.name))?;
        out.snaps.push(SnapOut {
            name: snap.name.clone(),
            bytes: snap.bytes(),
            seconds: ts.elapsed().as_secs_f64(),
            stats: WStats {
                files: st.files,
                bytes: st.bytes,
                chunks: st.chunks,
                new_chunks: st.new_chunks,
                new_bytes: st.new_bytes,
                stored_data_bytes: st.stored_data_bytes,
                stored_tree_bytes: st.stored_tree_bytes,
                packs: st.packs,
                delta_chunks: st.delta_chunks,
            },
        });
        all_recipes.push(recipes);
    }
    out.ingest_s = t0.elapsed().as_secs_f64();
    let (u1, s1, _) = rusage(libc::RUSAGE_SELF);
    out.user_s = u1 - u0;
    out.sys_s = s1 - s0;
    for s in &out.snaps {
        out.stats.add(&s.stats);
    }
    drop(repo);
    if j.sync {
        out.sync_s = Some(syncfs(&j.durable)?);
    }
    out.stored = repo_bytes(&j.durable);
    // The recipes add_file returned must describe the source.
    for (snap, recipes) in j.snaps.iter().zip(&all_recipes) {
        for (f, r) in snap.files.iter().zip(recipes) {
            check_recipe(
                r,
                f,
                &format!("add_file of {}", snap.name),
                &mut out.problems,
            );
        }
    }
    // Restore from the repository as a new process would find it.
    let t = Instant::now();
    let repo = open_repo(&j.durable, chunking, compression)?;
    out.reopen_s = t.elapsed().as_secs_f64();
    let Some(last) = j.snaps.last() else {
        return Ok(out);
    };
    std::fs::create_dir_all(&j.restore_dir)
        .ctx(|| format!("creating {}", j.restore_dir.display()))?;
    let (u0, s0, _) = rusage(libc::RUSAGE_SELF);
    let t = Instant::now();
    let restored = restore_snapshot(&repo, &j.series, last, Some(&j.restore_dir))?;
    out.restore_s = t.elapsed().as_secs_f64();
    let (u1, s1, _) = rusage(libc::RUSAGE_SELF);
    out.restore_cpu_s = (u1 - u0) + (s1 - s0);
    out.restore_bytes = restored.0;
    out.problems.extend(restored.1.iter().cloned());
    let _ = std::fs::remove_dir_all(&j.restore_dir);
    if j.verify_all {
        let t = Instant::now();
        let mut bytes = 0;
        for snap in &j.snaps {
            let (n, problems) = restore_snapshot(&repo, &j.series, snap, None)?;
            bytes += n;
            if problems.is_empty() {
                out.verified_snapshots += 1;
                out.verified_files += snap.files.len();
            }
            out.problems.extend(problems);
        }
        out.verify_s = Some(t.elapsed().as_secs_f64());
        out.verify_bytes = bytes;
    } else if restored.1.is_empty() {
        out.verified_snapshots = 1;
        out.verified_files = last.files.len();
    }
    out.max_rss_kib = rusage(libc::RUSAGE_SELF).2;
    Ok(out)
}

/// Restores every file of `snap` (into files under `dir`, or into a sink) and checks each
/// against the source. Returns the bytes restored and what did not match; repository errors
/// (a blob that does not verify) are problems too, not failures of the job.
fn restore_snapshot(
    repo: &Repo,
    series: &str,
    snap: &Snap,
    dir: Option<&Path>,
) -> Res<(u64, Vec<String>)> {
    let name = format!("{series}/{}", snap.name);
    let mut problems = Vec::new();
    let m = match repo.read_manifest(&name) {
        Ok(Some(m)) => m,
        Ok(None) => return Ok((0, vec![format!("{name}: no manifest")])),
        Err(e) => return Ok((0, vec![format!("{name}: reading the manifest: {e}")])),
    };
    if m.files.len() != snap.files.len() {
        problems.push(format!(
            "{name}: the manifest has {} files, the snapshot {}",
            m.files.len(),
            snap.files.len()
        ));
    }
    let mut bytes = 0;
    for (r, f) in m.files.iter().zip(&snap.files) {
        if r.path != f.rel {
            problems.push(format!(
                "{name}: manifest file {} is {} in the source",
                r.path, f.rel
            ));
            continue;
        }
        if !check_recipe(r, f, &format!("manifest {name}"), &mut problems) {
            continue;
        }
        let res = match dir {
            Some(d) => {
                let p = d.join(&r.path);
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)
                        .ctx(|| format!("creating {}", parent.display()))?;
                }
                let file = std::fs::File::create(&p).ctx(|| format!("creating {}", p.display()))?;
                let mut w = BufWriter::with_capacity(1 << 20, file);
                let r = repo.restore_file(r, &mut w);
                w.flush().ctx(|| format!("writing {}", p.display()))?;
                r
            }
            None => repo.restore_file(r, &mut std::io::sink()),
        };
        match res {
            Ok(n) => bytes += n,
            Err(e) => problems.push(format!("{name}: restoring {}: {e}", r.path)),
        }
    }
    Ok((bytes, problems))
}

fn read_all(files: &[PathBuf]) -> Res<Vec<Vec<u8>>> {
    files
        .iter()
        .map(|p| std::fs::read(p).ctx(|| format!("reading {}", p.display())))
        .collect()
}

fn hash_job(j: &HashJob) -> Res<HashOut> {
    let mut out = HashOut {
        threads: rayon::current_num_threads(),
        ..HashOut::default()
    };
    let mut buf = vec![0u8; 1 << 20];
    for with_hash in [false, true] {
        let t = Instant::now();
        let mut total = 0u64;
        for p in &j.files {
            let mut f = std::fs::File::open(p).ctx(|| format!("opening {}", p.display()))?;
            let mut h = blake3::Hasher::new();
            loop {
                let k = f
                    .read(&mut buf)
                    .ctx(|| format!("reading {}", p.display()))?;
                if k == 0 {
                    break;
                }
                if with_hash {
                    h.update(&buf[..k]);
                }
                total += k as u64;
            }
            std::hint::black_box(h.finalize());
        }
        let s = t.elapsed().as_secs_f64();
        if with_hash {
            out.read_hash_s = s;
        } else {
            out.read_s = s;
            out.bytes = total;
        }
    }
    let data = read_all(&j.files)?;
    let t = Instant::now();
    for d in &data {
        std::hint::black_box(blake3::hash(d));
    }
    out.hash1_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for d in &data {
        let v: Vec<blake3::Hash> = d.par_chunks(64 << 10).map(blake3::hash).collect();
        std::hint::black_box(v);
    }
    out.hash_par_s = t.elapsed().as_secs_f64();
    Ok(out)
}

/// read() calls of the reference read pass: 8 MiB into one reused buffer.
const READ_BYTES: usize = 8 << 20;
/// The repository's pack size (DEFAULT_PACK_SIZE).
const PACK_BYTES: usize = cascade_dedup::repo::DEFAULT_PACK_SIZE;

/// What the ingest's work costs, each step alone on one thread over the whole series: read()
/// of the files, then with the series in memory the cut points, the chunk scores, the
/// whole-file BLAKE3, zstd of the new chunks and the packs' ids, then (once per store) the
/// pack writes. The writer runs these steps overlapped in its pipeline (crates/cascade-dedup:
/// ingest.rs, repo/upload.rs); these passes time the work, not the pipeline.
fn breakdown(j: &BreakdownJob) -> Res<BreakdownOut> {
    let (chunking, compression) = parse_pair(&j.chunking, &j.compression)?;
    let mut out = BreakdownOut {
        threads: rayon::current_num_threads(),
        ..BreakdownOut::default()
    };
    // read() into one reused 8 MiB buffer (no fresh memory), from the page cache.
    let t = Instant::now();
    let mut buf = vec![0u8; READ_BYTES];
    let mut n = 0u64;
    for p in &j.files {
        let mut f = std::fs::File::open(p).ctx(|| format!("opening {}", p.display()))?;
        loop {
            let k = f
                .read(&mut buf)
                .ctx(|| format!("reading {}", p.display()))?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
    }
    out.push("read", None, t.elapsed().as_secs_f64(), n);
    drop(buf);
    // The series in memory from here on.
    let data = read_all(&j.files)?;
    let input: u64 = data.iter().map(|d| d.len() as u64).sum();
    out.input = input;
    let t = Instant::now();
    let ranges: Vec<Vec<std::ops::Range<usize>>> =
        data.iter().map(|d| chunking.split(d).collect()).collect();
    out.push("cut-points", None, t.elapsed().as_secs_f64(), input);
    let chunks: Vec<&[u8]> = data
        .iter()
        .zip(&ranges)
        .flat_map(|(d, rs)| rs.iter().map(move |r| &d[r.clone()]))
        .collect();
    let t = Instant::now();
    let scores: Vec<[u8; 32]> = chunks.iter().map(|c| *blake3::hash(c).as_bytes()).collect();
    out.push("score-1t", None, t.elapsed().as_secs_f64(), input);
    let t = Instant::now();
    for d in &data {
        std::hint::black_box(blake3::hash(d));
    }
    out.push("hash-1t", None, t.elapsed().as_secs_f64(), input);
    // The new chunks: the first occurrence of each score in the series (the writer stores a
    // chunk neither the repository nor itself has).
    let mut seen: HashSet<[u8; 32]> = HashSet::new();
    let fresh: Vec<&[u8]> = chunks
        .iter()
        .zip(&scores)
        .filter(|(_, s)| seen.insert(**s))
        .map(|(c, _)| *c)
        .collect();
    out.chunks = chunks.len() as u64;
    out.fresh_chunks = fresh.len() as u64;
    out.fresh_bytes = fresh.iter().map(|c| c.len() as u64).sum();
    // zstd of the new chunks as the writer does it: `compress` gives a frame only where it
    // saves an eighth of the chunk. Timed with each frame dropped at once, as the writer
    // drops it once copied into a pack: keeping every frame of the series (the packs below
    // need them) makes each on fresh memory, whose page faults took this step from 1.09 to
    // 0.80 GB/s on LAMMPS. The frames are made again, untimed, for the packs.
    let packed: Vec<Option<Vec<u8>>> = if compression == Compression::None {
        vec![None; fresh.len()]
    } else {
        let t = Instant::now();
        for c in &fresh {
            std::hint::black_box(compression.compress(c));
        }
        out.push(
            "compress-1t",
            None,
            t.elapsed().as_secs_f64(),
            out.fresh_bytes,
        );
        fresh.iter().map(|c| compression.compress(c)).collect()
    };
    // Packs: the stored form of each new chunk (its frame, or the chunk itself where
    // compression did not pay), appended until a pack holds DEFAULT_PACK_SIZE bytes.
    let mut packs: Vec<Vec<u8>> = Vec::new();
    let mut pack: Vec<u8> = Vec::new();
    for (c, z) in fresh.iter().zip(&packed) {
        let bytes: &[u8] = match z {
            Some(z) => z,
            None => {
                if compression != Compression::None {
                    out.raw_chunks += 1;
                    out.raw_bytes += c.len() as u64;
                }
                c
            }
        };
        pack.extend_from_slice(bytes);
        if pack.len() >= PACK_BYTES {
            packs.push(std::mem::take(&mut pack));
        }
    }
    if !pack.is_empty() {
        packs.push(pack);
    }
    drop(packed);
    drop(fresh);
    drop(chunks);
    drop(data);
    out.stored_bytes = packs.iter().map(|p| p.len() as u64).sum();
    out.packs = packs.len() as u64;
    // The packs' ids (the BLAKE3 of each pack, which names its object).
    let t = Instant::now();
    let ids: Vec<blake3::Hash> = packs.iter().map(|p| blake3::hash(p)).collect();
    out.push(
        "pack-hash-1t",
        None,
        t.elapsed().as_secs_f64(),
        out.stored_bytes,
    );
    let keys: Vec<String> = ids
        .iter()
        .map(|id| {
            let hex = id.to_hex();
            format!("{DEFAULT_PREFIX}/packs/{}/{hex}", &hex[..2])
        })
        .collect();
    let packs: Vec<bytes::Bytes> = packs.into_iter().map(bytes::Bytes::from).collect();
    // The pack writes: one `put_buffers` after the other into a fresh durable store, from a
    // clean start (a syncfs first, untimed: each measured ingest on the disk ends with one).
    for (name, dir) in &j.stores {
        let spec = dir.to_string_lossy().into_owned();
        let durable = DurableStore::open(&spec).ctx(|| format!("opening {spec}"))?;
        std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        syncfs(dir)?;
        let t = Instant::now();
        for (key, p) in keys.iter().zip(&packs) {
            durable
                .put_buffers(key, vec![p.clone()])
                .ctx(|| format!("writing a pack into {spec}"))?;
        }
        out.push(
            "pack-write-1t",
            Some(name),
            t.elapsed().as_secs_f64(),
            out.stored_bytes,
        );
        drop(durable);
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The parent: measurements.

/// One measurement of one method on one series.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub rep: usize,
    /// Timed seconds for the whole series (for restic and borg the sum of the snapshots'
    /// backups, each a process of its own).
    pub seconds: f64,
    /// CPU seconds (user + system) of that.
    pub cpu_s: f64,
    /// Bytes in the repository (or copy) at the end.
    pub stored: u64,
    pub per_snapshot_s: Vec<f64>,
    /// Bytes each snapshot added (ours: written into packs, trailers and index excluded;
    /// restic and borg: growth of the repository directory).
    pub per_snapshot_stored: Vec<u64>,
    /// restic and borg: one backup of an empty directory into a fresh repository.
    pub startup_s: Option<f64>,
    /// syncfs after the copy or ingest (disk), timed apart.
    pub sync_s: Option<f64>,
    pub ingest: Option<IngestOut>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Cascade(usize, StoreKind),
    Restic,
    Borg,
    Cp(StoreKind),
    Zstd,
    Hash,
}

const RESTIC: &str = "restic";
const BORG: &str = "borg";
const CP: &str = "cp -r";
const ZSTD: &str = "zstd -1";

impl Method {
    fn kind(self) -> &'static str {
        match self {
            Method::Cascade(..) => "cascade",
            Method::Restic => RESTIC,
            Method::Borg => BORG,
            Method::Cp(_) => CP,
            Method::Zstd => ZSTD,
            Method::Hash => "hash",
        }
    }
    fn store(self) -> StoreKind {
        match self {
            Method::Cascade(_, s) | Method::Cp(s) => s,
            _ => StoreKind::Disk,
        }
    }
    fn label(self, o: &DOpts) -> String {
        match self {
            Method::Cascade(i, _) => o.configs[i].label.clone(),
            m => m.kind().to_string(),
        }
    }
}

/// One method on one series: the medians over the repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub series: String,
    /// "cdc:avg=64KiB+zstd:1", "restic", "borg", "cp -r", "zstd -1".
    pub method: String,
    pub kind: String,
    pub store: StoreKind,
    pub input_bytes: u64,
    /// Median over the repetitions (ours, cp and zstd write the same bytes every time).
    pub stored_bytes: u64,
    pub reduction: f64,
    /// input / seconds.
    pub gbps: Stats,
    /// restic and borg: input / (seconds - snapshots x start-up of the same repetition).
    pub gbps_without_startup: Option<Stats>,
    pub startup_s: Option<Stats>,
    pub cpu_s_per_gb: Stats,
    pub sync_s: Option<Stats>,
    /// Ours: restoring the last snapshot into files.
    pub restore_gbps: Option<Stats>,
    /// Ours: restoring every snapshot (first repetition).
    pub verify_gbps: Option<Stats>,
    /// Ours: "8/8 snapshots, 8 files", or what failed.
    pub verified: Option<String>,
    pub open_s: Option<Stats>,
    pub stats: Option<WStats>,
    pub repo: Option<RepoBytes>,
    pub per_snapshot_stored: Vec<u64>,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HashRow {
    pub series: String,
    pub bytes: u64,
    pub threads: usize,
    pub read_gbps: Stats,
    pub read_hash_gbps: Stats,
    pub hash1_gbps: Stats,
    pub hash_par_gbps: Stats,
}

#[derive(Debug, Clone, Serialize)]
pub struct BreakdownRow {
    pub series: String,
    pub config: String,
    pub out: BreakdownOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfSym {
    pub pct: f64,
    pub dso: String,
    pub symbol: String,
    pub category: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProfileRow {
    pub series: String,
    pub config: String,
    pub store: StoreKind,
    /// The ingest under perf (perf adds some overhead).
    pub ingest_s: f64,
    pub input_bytes: u64,
    /// Share of the samples by category, largest first.
    pub categories: Vec<(String, f64)>,
    pub top: Vec<ProfSym>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DResults {
    pub series: Vec<SeriesInfo>,
    pub rows: Vec<Row>,
    pub hashing: Vec<HashRow>,
    pub breakdown: Vec<BreakdownRow>,
    pub profiles: Vec<ProfileRow>,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    pub tools: BTreeMap<String, String>,
    /// What make.sh printed.
    pub make_output: String,
    pub options: &'a DOpts,
    pub targets: Vec<Target>,
    pub results: &'a DResults,
}

struct Rig<'a> {
    o: &'a DOpts,
    exe: PathBuf,
}

/// A work directory, removed when dropped.
struct Work(PathBuf);

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn children_cpu() -> f64 {
    let (u, s, _) = rusage(libc::RUSAGE_CHILDREN);
    u + s
}

/// Runs `c` to its end: (wall seconds, CPU seconds of the process).
fn timed(c: &mut Command, what: &str) -> Res<(f64, f64)> {
    c.stdin(Stdio::null());
    let cpu0 = children_cpu();
    let t = Instant::now();
    let out = c.output().ctx(|| format!("starting {what}"))?;
    let s = t.elapsed().as_secs_f64();
    let cpu = children_cpu() - cpu0;
    if !out.status.success() {
        return err(format!(
            "{what} failed ({}): {}",
            out.status,
            crate::procs::one_line(&[out.stderr, out.stdout].concat())
        ));
    }
    Ok((s, cpu))
}

impl Rig<'_> {
    /// The ingest of series `s` with configuration `cfg` into `work`.
    fn ingest_job(&self, s: &Series, cfg: usize, work: &Work, verify_all: bool, sync: bool) -> Job {
        let c = &self.o.configs[cfg];
        Job::Ingest(IngestJob {
            series: s.info.name.clone(),
            snaps: s.snaps.clone(),
            durable: work.0.join("durable"),
            restore_dir: work.0.join("restore"),
            chunking: c.chunking.clone(),
            compression: c.compression.clone(),
            delta: c.delta,
            verify_all,
            sync,
        })
    }

    fn work(&self, store: StoreKind, tag: &str) -> Res<Work> {
        let p = self
            .o
            .dir_of(store)
            .join(format!("{}-dedup-{tag}", prefix(self.o.pid)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).ctx(|| format!("creating {}", p.display()))?;
        Ok(Work(p))
    }

    /// Runs a job in a child process (under `perf record` when `perf` names the data file).
    fn child(&self, job: &Job, perf: Option<&Path>) -> Res<JobOut> {
        let mut c = match perf {
            Some(data) => {
                let mut c = Command::new(&self.o.perf);
                c.args(["record", "-q", "-F", "999", "-o"])
                    .arg(data)
                    .arg("--")
                    .arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        c.arg("dedup-job")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let text = serde_json::to_string(job).ctx(|| "encoding a job")?;
        let mut child = c
            .spawn()
            .ctx(|| format!("starting {}", self.exe.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(text.as_bytes())
                .ctx(|| "writing the job to the child")?;
        }
        let out = child.wait_with_output().ctx(|| "waiting for the child")?;
        if !out.status.success() {
            return err(format!(
                "the child failed ({}): {}",
                out.status,
                crate::procs::one_line(&out.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| util::BenchError("the child printed no result".into()))?;
        serde_json::from_str(line).ctx(|| "decoding the child's result")
    }

    fn cascade(&self, s: &Series, cfg: usize, store: StoreKind, rep: usize) -> Res<Sample> {
        let work = self.work(store, &format!("c{cfg}-{}", store.name()))?;
        let job = self.ingest_job(s, cfg, &work, rep == 0, store == StoreKind::Disk);
        let JobOut::Ingest(out) = self.child(&job, None)? else {
            return err("the child answered another job");
        };
        Ok(Sample {
            rep,
            seconds: out.ingest_s,
            cpu_s: out.user_s + out.sys_s,
            stored: out.stored.total,
            per_snapshot_s: out.snaps.iter().map(|x| x.seconds).collect(),
            per_snapshot_stored: out
                .snaps
                .iter()
                .map(|x| x.stats.stored_data_bytes + x.stats.stored_tree_bytes)
                .collect(),
            startup_s: None,
            sync_s: out.sync_s,
            ingest: Some(*out),
        })
    }

    /// restic or borg with the settings of bench/datasets/restic_borg.sh, in a fresh
    /// repository on the disk; start-up (a backup of an empty directory into another fresh
    /// repository) measured in the same repetition.
    fn tool(&self, s: &Series, restic: bool, rep: usize) -> Res<Sample> {
        let name = if restic { RESTIC } else { BORG };
        let work = self.work(StoreKind::Disk, name)?;
        let w = &work.0;
        let bin = if restic { &self.o.restic } else { &self.o.borg };
        let cmd = |cwd: &Path| {
            let mut c = Command::new(bin);
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy().into_owned();
                if k.starts_with("RESTIC_") || k.starts_with("BORG_") {
                    c.env_remove(k);
                }
            }
            c.env("RESTIC_PASSWORD", "x")
                .env("RESTIC_CACHE_DIR", w.join("restic-cache"))
                .env("BORG_BASE_DIR", w.join("borg-base"))
                .env("BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK", "yes")
                .current_dir(cwd);
            c
        };
        let init = |repo: &Path| -> Res<()> {
            let mut c = cmd(w);
            if restic {
                c.arg("-r").arg(repo).arg("init");
            } else {
                c.args(["init", "-e", "none"]).arg(repo);
            }
            timed(&mut c, &format!("{name} init")).map(|_| ())
        };
        let backup = |repo: &Path, cwd: &Path, dir: &str| -> Res<(f64, f64)> {
            let mut c = cmd(cwd);
            if restic {
                c.arg("-r").arg(repo).args(["backup", "--quiet", dir]);
            } else {
                let mut target = repo.as_os_str().to_owned();
                target.push(format!("::{dir}"));
                c.arg("create").arg(target).arg(dir);
            }
            timed(&mut c, &format!("{name} backup {dir}"))
        };
        std::fs::create_dir_all(w.join("empty")).ctx(|| "creating an empty directory")?;
        let empty_repo = w.join("repo-empty");
        init(&empty_repo)?;
        let (startup, _) = backup(&empty_repo, w, "empty")?;
        let repo = w.join("repo");
        init(&repo)?;
        let mut prev = tree_bytes(&repo).1;
        let mut sample = Sample {
            rep,
            seconds: 0.0,
            cpu_s: 0.0,
            stored: 0,
            per_snapshot_s: Vec::new(),
            per_snapshot_stored: Vec::new(),
            startup_s: Some(startup),
            sync_s: None,
            ingest: None,
        };
        for snap in &s.snaps {
            let (t, cpu) = backup(&repo, &s.info.dir, &snap.name)?;
            sample.seconds += t;
            sample.cpu_s += cpu;
            sample.per_snapshot_s.push(t);
            let now = tree_bytes(&repo).1;
            sample.per_snapshot_stored.push(now.saturating_sub(prev));
            prev = now;
        }
        sample.stored = tree_bytes(&repo).1;
        Ok(sample)
    }

    /// `cp -r` or `zstd -1 -r` of all snapshots in one process, into a directory of `store`.
    fn copy(&self, s: &Series, zstd: bool, store: StoreKind, rep: usize) -> Res<Sample> {
        let tag = if zstd { "zstd" } else { "cp" };
        let work = self.work(store, &format!("{tag}-{}", store.name()))?;
        let mut c = if zstd {
            let mut c = Command::new(&self.o.zstd);
            c.args(["-1", "-q", "-r", "--output-dir-mirror"])
                .arg(&work.0);
            c
        } else {
            let mut c = Command::new("cp");
            c.arg("-r");
            c
        };
        c.args(s.snap_names()).current_dir(&s.info.dir);
        if !zstd {
            c.arg(&work.0);
        }
        let (t, cpu) = timed(&mut c, tag)?;
        let sync_s = if store == StoreKind::Disk {
            Some(syncfs(&work.0)?)
        } else {
            None
        };
        let per_snapshot_stored = s
            .snaps
            .iter()
            .map(|x| tree_bytes(&work.0.join(&x.name)).1)
            .collect();
        Ok(Sample {
            rep,
            seconds: t,
            cpu_s: cpu,
            stored: tree_bytes(&work.0).1,
            per_snapshot_s: Vec::new(),
            per_snapshot_stored,
            startup_s: None,
            sync_s,
            ingest: None,
        })
    }

    fn hash(&self, s: &Series) -> Res<HashOut> {
        let job = Job::Hash(HashJob {
            files: s.all_files(),
        });
        match self.child(&job, None)? {
            JobOut::Hash(h) => Ok(h),
            _ => err("the child answered another job"),
        }
    }

    fn breakdown(&self, s: &Series, cfg: usize) -> Res<BreakdownOut> {
        let c = &self.o.configs[cfg];
        let mut works = Vec::new();
        let mut stores = Vec::new();
        for &st in &self.o.stores {
            let w = self.work(st, &format!("bd-{}", st.name()))?;
            stores.push((st.name().to_string(), w.0.join("durable")));
            works.push(w);
        }
        let job = Job::Breakdown(BreakdownJob {
            files: s.all_files(),
            chunking: c.chunking.clone(),
            compression: c.compression.clone(),
            stores,
        });
        match self.child(&job, None)? {
            JobOut::Breakdown(b) => Ok(b),
            _ => err("the child answered another job"),
        }
    }

    /// One ingest (first configuration, first store) under `perf record`; the profile by
    /// symbol and by category.
    fn profile(&self, s: &Series) -> Res<ProfileRow> {
        let store = self.o.stores[0];
        let work = self.work(store, "prof")?;
        let data = self
            .o
            .disk_dir
            .join(format!("{}-dedup-perf.data", prefix(self.o.pid)));
        let c = &self.o.configs[0];
        let job = self.ingest_job(s, 0, &work, false, false);
        let res = self.child(&job, Some(&data));
        let report = Command::new(&self.o.perf)
            .args([
                "report",
                "-q",
                "--stdio",
                "--no-children",
                "--sort",
                "dso,sym",
            ])
            .args(["--percent-limit", "0", "-i"])
            .arg(&data)
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_file(&data);
        let JobOut::Ingest(out) = res? else {
            return err("the child answered another job");
        };
        let report = report.ctx(|| format!("running {} report", self.o.perf))?;
        let text = String::from_utf8_lossy(&report.stdout);
        let mut syms: Vec<ProfSym> = Vec::new();
        for line in text.lines() {
            let t = line.trim();
            let Some((pct, rest)) = t.split_once('%') else {
                continue;
            };
            let Ok(pct) = pct.trim().parse::<f64>() else {
                continue;
            };
            let rest = rest.trim();
            let (dso, sym) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let sym = sym.trim();
            let sym = sym
                .strip_prefix("[.]")
                .or_else(|| sym.strip_prefix("[k]"))
                .map(str::trim)
                .unwrap_or(sym);
            let kernel = rest.contains("[k]") || dso.contains("kernel");
            syms.push(ProfSym {
                pct,
                dso: dso.to_string(),
                symbol: sym.to_string(),
                category: category(sym, kernel).to_string(),
            });
        }
        if syms.is_empty() {
            return err(format!(
                "{} report gave no samples: {}",
                self.o.perf,
                crate::procs::one_line(&report.stderr)
            ));
        }
        let mut cats: BTreeMap<String, f64> = BTreeMap::new();
        for x in &syms {
            *cats.entry(x.category.clone()).or_default() += x.pct;
        }
        let mut categories: Vec<(String, f64)> = cats.into_iter().collect();
        categories.sort_by(|a, b| b.1.total_cmp(&a.1));
        syms.sort_by(|a, b| b.pct.total_cmp(&a.pct));
        syms.truncate(20);
        Ok(ProfileRow {
            series: s.info.name.clone(),
            config: c.label.clone(),
            store,
            ingest_s: out.ingest_s,
            input_bytes: s.input(),
            categories,
            top: syms,
        })
    }
}

/// The category a profiled symbol belongs to.
fn category(sym: &str, kernel: bool) -> &'static str {
    let l = sym.to_ascii_lowercase();
    if kernel {
        if l.contains("copy") || l.contains("rep_movs") || l.contains("memcpy") {
            "kernel: copying file data (read() and write() of files)"
        } else if l.contains("clear_page")
            || l.contains("fault")
            || l.contains("alloc_pages")
            || l.contains("free_p")
            || l.contains("zap")
            || l.contains("folio")
        {
            "kernel: page allocation and faults"
        } else {
            "kernel: other (syscalls, scheduling, file system)"
        }
    } else if l.contains("fastcdc") || l.contains("cut_gear") {
        "FastCDC cut points and buffer (fastcdc crate)"
    } else if l.contains("blake3") {
        "BLAKE3"
    } else if l.contains("zstd")
        || l.starts_with("huf_")
        || l.starts_with("fse_")
        || l.contains("hist_")
    {
        "zstd"
    } else if l.contains("memmove") || l.contains("memcpy") || l.contains("memset") {
        "memcpy / memmove / memset (user space)"
    } else if l.contains("malloc")
        || l.contains("free")
        || l.contains("_int_")
        || l.contains("realloc")
    {
        "allocator"
    } else if l.contains("hashbrown") || l.contains("hash_map") || l.contains("hashset") {
        "hash tables (dedup index)"
    } else if l.contains("rayon")
        || l.contains("crossbeam")
        || l.contains("sched_yield")
        || l.contains("futex")
    {
        "thread pool (rayon)"
    } else {
        "other user space"
    }
}

fn gbps(bytes: u64, s: f64) -> f64 {
    if s > 0.0 {
        bytes as f64 / s / 1e9
    } else {
        f64::NAN
    }
}

fn make_row(o: &DOpts, s: &Series, m: Method, samples: Vec<Sample>) -> Row {
    let input = s.input();
    let n = s.snaps.len() as f64;
    let stored = median_u64(&samples.iter().map(|x| x.stored).collect::<Vec<_>>());
    let g: Vec<f64> = samples.iter().map(|x| gbps(input, x.seconds)).collect();
    let startup: Vec<f64> = samples.iter().filter_map(|x| x.startup_s).collect();
    let no_startup: Vec<f64> = samples
        .iter()
        .filter_map(|x| x.startup_s.map(|st| gbps(input, x.seconds - n * st)))
        .collect();
    let cpu: Vec<f64> = samples
        .iter()
        .map(|x| x.cpu_s / (input as f64 / 1e9))
        .collect();
    let sync: Vec<f64> = samples.iter().filter_map(|x| x.sync_s).collect();
    let ing: Vec<&IngestOut> = samples.iter().filter_map(|x| x.ingest.as_ref()).collect();
    let opt = |v: Vec<f64>| (!v.is_empty()).then(|| Stats::of(&v));
    let restore = opt(ing
        .iter()
        .map(|x| gbps(x.restore_bytes, x.restore_s))
        .collect());
    let verify = opt(ing
        .iter()
        .filter_map(|x| x.verify_s.map(|v| gbps(x.verify_bytes, v)))
        .collect());
    let verified = (!ing.is_empty()).then(|| {
        let problems: Vec<&String> = ing.iter().flat_map(|x| x.problems.iter()).collect();
        let all = ing.iter().find(|x| x.verify_s.is_some());
        if !problems.is_empty() {
            format!("**FAILED**: {}", problems[0])
        } else if let Some(a) = all {
            format!(
                "{}/{} snapshots ({} files) in rep 1, the last one in {}/{} runs",
                a.verified_snapshots,
                s.snaps.len(),
                a.verified_files,
                ing.len(),
                ing.len()
            )
        } else {
            format!("last snapshot in {}/{} runs", ing.len(), ing.len())
        }
    });
    let per_snapshot_stored = samples
        .last()
        .map(|x| x.per_snapshot_stored.clone())
        .unwrap_or_default();
    let open_s = opt(ing.iter().map(|x| x.open_s).collect());
    let stats = ing.last().map(|x| x.stats.clone());
    let repo = ing.last().map(|x| x.stored.clone());
    // The per-snapshot writer statistics are kept for the last repetition only (the others
    // write the same bytes; their per-snapshot times are in `per_snapshot_s`).
    let mut samples = samples;
    let n_samples = samples.len();
    for x in samples.iter_mut().take(n_samples.saturating_sub(1)) {
        if let Some(i) = x.ingest.as_mut() {
            i.snaps.clear();
        }
    }
    Row {
        series: s.info.name.clone(),
        method: m.label(o),
        kind: m.kind().to_string(),
        store: m.store(),
        input_bytes: input,
        stored_bytes: stored,
        reduction: input as f64 / stored as f64,
        gbps: Stats::of(&g),
        gbps_without_startup: opt(no_startup),
        startup_s: opt(startup),
        cpu_s_per_gb: Stats::of(&cpu),
        sync_s: opt(sync),
        restore_gbps: restore,
        verify_gbps: verify,
        verified,
        open_s,
        stats,
        repo,
        per_snapshot_stored,
        samples,
    }
}

fn run_series(rig: &Rig, s: &Series, res: &mut DResults) {
    let o = rig.o;
    let mut methods = Vec::new();
    if o.want(Part::Cascade) {
        for i in 0..o.configs.len() {
            for &st in &o.stores {
                methods.push(Method::Cascade(i, st));
            }
        }
    }
    if o.want(Part::Restic) {
        methods.push(Method::Restic);
    }
    if o.want(Part::Borg) {
        methods.push(Method::Borg);
    }
    if o.want(Part::Cp) {
        for &st in &o.stores {
            methods.push(Method::Cp(st));
        }
    }
    if o.want(Part::Zstd) {
        if Command::new(&o.zstd)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|x| x.success())
        {
            methods.push(Method::Zstd);
        } else {
            res.notes.push(format!(
                "{}: no zstd CLI ({}); skipped",
                s.info.name, o.zstd
            ));
        }
    }
    if o.want(Part::Hash) {
        methods.push(Method::Hash);
    }
    let name = &s.info.name;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); methods.len()];
    let mut hashes: Vec<HashOut> = Vec::new();
    for rep in 0..o.reps {
        for m in rotated(&methods, rep) {
            let k = methods.iter().position(|x| *x == m).unwrap_or(0);
            // The previous method's writes and deletions reach the disk first (untimed):
            // ext4 with `discard` otherwise makes the next writer pay for them.
            let _ = syncfs(&o.disk_dir);
            util::settle();
            let label = format!("{} ({})", m.label(o), m.store().name());
            let r = match m {
                Method::Cascade(i, st) => rig.cascade(s, i, st, rep),
                Method::Restic => rig.tool(s, true, rep),
                Method::Borg => rig.tool(s, false, rep),
                Method::Cp(st) => rig.copy(s, false, st, rep),
                Method::Zstd => rig.copy(s, true, StoreKind::Disk, rep),
                Method::Hash => match rig.hash(s) {
                    Ok(h) => {
                        eprintln!(
                            "  [{name}] hash rep {}/{}: read {:.2} GB/s, read+BLAKE3 {:.2}, BLAKE3 1 thread {:.2}, {} threads {:.2}",
                            rep + 1,
                            o.reps,
                            gbps(h.bytes, h.read_s),
                            gbps(h.bytes, h.read_hash_s),
                            gbps(h.bytes, h.hash1_s),
                            h.threads,
                            gbps(h.bytes, h.hash_par_s)
                        );
                        hashes.push(h);
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            match r {
                Ok(x) => {
                    let mut line = format!(
                        "{:7.3} GB/s, stored {} ({:.2}x), {:.2} CPU s/GB",
                        gbps(s.input(), x.seconds),
                        x.stored,
                        s.input() as f64 / x.stored as f64,
                        x.cpu_s / (s.input() as f64 / 1e9)
                    );
                    if let Some(st) = x.startup_s {
                        let _ = write!(line, ", start-up {st:.2} s");
                    }
                    if let Some(i) = &x.ingest {
                        let _ = write!(
                            line,
                            ", restore {:.2} GB/s",
                            gbps(i.restore_bytes, i.restore_s)
                        );
                        if !i.problems.is_empty() {
                            let _ = write!(line, ", PROBLEMS: {}", i.problems[0]);
                        }
                    }
                    eprintln!("  [{name}] {label:<32} rep {}/{}: {line}", rep + 1, o.reps);
                    samples[k].push(x);
                }
                Err(e) => {
                    eprintln!("  [{name}] {label}: {e}");
                    res.notes
                        .push(format!("{name}, {label}, repetition {}: {e}", rep + 1));
                }
            }
        }
    }
    for (m, v) in methods.iter().zip(samples) {
        if *m != Method::Hash && !v.is_empty() {
            res.rows.push(make_row(o, s, *m, v));
        }
    }
    if !hashes.is_empty() {
        let st = |f: &dyn Fn(&HashOut) -> f64| {
            Stats::of(
                &hashes
                    .iter()
                    .map(|h| gbps(h.bytes, f(h)))
                    .collect::<Vec<_>>(),
            )
        };
        res.hashing.push(HashRow {
            series: name.clone(),
            bytes: hashes[0].bytes,
            threads: hashes[0].threads,
            read_gbps: st(&|h| h.read_s),
            read_hash_gbps: st(&|h| h.read_hash_s),
            hash1_gbps: st(&|h| h.hash1_s),
            hash_par_gbps: st(&|h| h.hash_par_s),
        });
    }
    if o.want(Part::Breakdown) {
        // The reference passes have no deltas: +delta rows would repeat their configuration
        // without them.
        for (i, c) in o.configs.iter().enumerate().filter(|(_, c)| !c.delta) {
            util::settle();
            match rig.breakdown(s, i) {
                Ok(b) => {
                    eprintln!(
                        "  [{name}] breakdown {}: {}",
                        c.label,
                        b.stages
                            .iter()
                            .map(|x| match &x.store {
                                Some(st) => format!("{st}:{} {:.2} s", x.key, x.seconds),
                                None => format!("{} {:.2} s", x.key, x.seconds),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    res.breakdown.push(BreakdownRow {
                        series: name.clone(),
                        config: c.label.clone(),
                        out: b,
                    });
                }
                Err(e) => {
                    eprintln!("  [{name}] breakdown {}: {e}", c.label);
                    res.notes
                        .push(format!("{name}, breakdown of {}: {e}", c.label));
                }
            }
        }
    }
    if o.want(Part::Profile) {
        util::settle();
        match rig.profile(s) {
            Ok(p) => {
                eprintln!(
                    "  [{name}] profile: {}",
                    p.categories
                        .iter()
                        .take(6)
                        .map(|(c, v)| format!("{c} {v:.1} %"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                res.profiles.push(p);
            }
            Err(e) => {
                eprintln!("  [{name}] profile: {e}");
                res.notes.push(format!("{name}, perf profile: {e}"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The subcommand.

/// Runs make.sh (idempotent) for the series; refuses a directory that holds the series of the
/// other mode (make.sh would replace them).
fn make_datasets(o: &DOpts) -> Res<String> {
    let mode = if o.quick { "quick" } else { "full" };
    for s in &o.series {
        let done = o.datasets.join(s).join(".done");
        if let Ok(text) = std::fs::read_to_string(&done) {
            let first = text.lines().next().unwrap_or("");
            if let Some(m) = first
                .split_whitespace()
                .find_map(|w| w.strip_prefix("mode="))
            {
                if m != mode {
                    return err(format!(
                        "{} holds the {m} {s} series, this run wants {mode} ones (make.sh would \
                         replace them); use another --datasets",
                        o.datasets.display()
                    ));
                }
            }
        }
    }
    if !o.make.is_file() {
        return err(format!("{} does not exist", o.make.display()));
    }
    eprintln!(
        "datasets: {} {}{} {} (generates what is missing; all three full series take a few minutes)",
        o.make.display(),
        if o.quick { "--quick " } else { "" },
        o.datasets.display(),
        o.series.join(" ")
    );
    let mut c = Command::new("bash");
    c.arg(&o.make);
    if o.quick {
        c.arg("--quick");
    }
    c.arg(&o.datasets).args(&o.series).stdin(Stdio::null());
    let out = c.output().ctx(|| format!("running {}", o.make.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprint!("{text}");
    if !out.status.success() {
        return err(format!(
            "{} failed ({}): {}",
            o.make.display(),
            out.status,
            crate::procs::one_line(&out.stderr)
        ));
    }
    Ok(text)
}

pub fn run(mut o: DOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve(pid)?;
    let dirs = vec![o.disk_dir.clone(), o.tmpfs_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs.clone(), &o.out)?;
    // A private copy of this executable for the children: a rebuild during the run must not
    // swap it.
    let exe = o.disk_dir.join(format!("{}-exe", prefix(pid)));
    let me = std::env::current_exe().ctx(|| "locating this executable")?;
    std::fs::copy(&me, &exe).ctx(|| format!("copying {} to {}", me.display(), exe.display()))?;
    let make_output = make_datasets(&o)?;
    let clock = RunClock::start(&o.disk_dir, &o.tmpfs_dir);
    let mut tools = BTreeMap::new();
    tools.insert(RESTIC.to_string(), tool_version(&o.restic, &["version"]));
    tools.insert(BORG.to_string(), tool_version(&o.borg, &["--version"]));
    tools.insert("zstd".to_string(), tool_version(&o.zstd, &["--version"]));
    tools.insert("cp".to_string(), tool_version("cp", &["--version"]));
    tools.insert("perf".to_string(), tool_version(&o.perf, &["--version"]));
    tools.insert(
        "rayon threads".to_string(),
        rayon::current_num_threads().to_string(),
    );
    let (series, datasets) = (o.series.join(","), o.datasets.display());
    eprintln!(
        "cascade-bench dedup: series {series} in {datasets}; {} repetitions",
        o.reps
    );
    let mut results = DResults::default();
    let rig = Rig { o: &o, exe };
    let outcome = (|| -> Res<()> {
        for name in &o.series {
            eprintln!("{name}: reading and hashing the series (the reference for restores)");
            let s = load_series(&o.datasets, name)?;
            eprintln!(
                "{name}: {} snapshots, {} files, {} bytes ({:.1} s)",
                s.info.snapshots, s.info.files, s.info.input_bytes, s.info.warm_s
            );
            results.series.push(s.info.clone());
            run_series(&rig, &s, &mut results);
        }
        Ok(())
    })();
    if let Err(e) = &outcome {
        results.notes.push(format!("the run stopped: {e}"));
    }
    let rep = Report {
        suite: "dedup",
        header: clock.finish(&["crates/cascade-dedup", "crates/cascade-durable", "bench"]),
        tools,
        make_output,
        options: &o,
        targets: targets(&o, &results),
        results: &results,
    };
    let title = "Cascade dedup repository vs restic, borg, cp and zstd on checkpoint series";
    report::write(&o.out, "dedup", title, &rep, tables(&rep))?;
    outcome
}

// ---------------------------------------------------------------------------------------------
// Report.

fn find<'a>(r: &'a DResults, series: &str, method: &str, store: StoreKind) -> Option<&'a Row> {
    r.rows
        .iter()
        .find(|x| x.series == series && x.method == method && x.store == store)
}

/// The row of `method` on `series` in the first store that has one.
fn find_any<'a>(o: &DOpts, r: &'a DResults, series: &str, method: &str) -> Option<&'a Row> {
    o.stores
        .iter()
        .chain([StoreKind::Disk, StoreKind::Tmpfs].iter())
        .find_map(|&st| find(r, series, method, st))
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// The goals: ingest >= 1 GB/s (against restic and borg), and the reduction of what the
/// agent stores by default (with deltas where that configuration was run).
fn targets(o: &DOpts, r: &DResults) -> Vec<Target> {
    // The agent stores with deltas: its +delta form where that configuration was run.
    let with_delta = format!("{}+delta", o.configs[0].label);
    let def = if o.configs.iter().any(|c| c.label == with_delta) {
        &with_delta
    } else {
        &o.configs[0].label
    };
    let store = if o.stores.contains(&StoreKind::Disk) {
        StoreKind::Disk
    } else {
        o.stores[0]
    };
    let (mut parts, mut met) = (Vec::new(), None);
    for s in &o.series {
        let Some(x) = find(r, s, def, store) else {
            continue;
        };
        let vs: Vec<String> = [RESTIC, BORG]
            .into_iter()
            .filter_map(|t| find(r, s, t, StoreKind::Disk).map(|b| (t, b)))
            .map(|(t, b)| {
                let bare = b
                    .gbps_without_startup
                    .as_ref()
                    .map(|n| ratio(x.gbps.median, n.median));
                let bare = bare.map_or(String::new(), |n| format!(", {n} without its start-up"));
                format!("{} {t}{bare}", ratio(x.gbps.median, b.gbps.median))
            })
            .collect();
        let vs = if vs.is_empty() {
            "no restic/borg".to_string()
        } else {
            vs.join(", ")
        };
        parts.push(format!("{s} **{:.2}** GB/s ({vs})", x.gbps.median));
        met = Some(met.unwrap_or(true) && x.gbps.median >= 1.0);
    }
    let measured = if parts.is_empty() {
        "not run".into()
    } else {
        parts.join("; ")
    };
    let name = format!(
        "Ingest (chunk + hash + compress + store), `{def}`, {} store",
        store.name()
    );
    let goal = ">= 1 GB/s on this 2-core machine, about 8x restic and borg";
    let mut out = vec![Target::new(&name, goal, measured, met)];
    for (series, goal, what) in [
        ("lammps", 1.7, "LAMMPS restarts"),
        ("torch", 3.0, "the ML series (torch)"),
    ] {
        let name = format!("Reduction (input / stored) on {what}, `{def}`");
        let goal_text = format!(">= {goal}x");
        let Some(x) = find_any(o, r, series, def) else {
            out.push(Target::new(&name, &goal_text, "not run".into(), None));
            continue;
        };
        let others: Vec<String> = [RESTIC, BORG, ZSTD]
            .into_iter()
            .filter_map(|m| find_any(o, r, series, m).map(|b| format!("{m} {:.2}x", b.reduction)))
            .collect();
        let (stored, input) = (mb(x.stored_bytes), mb(x.input_bytes));
        let measured = format!(
            "**{:.2}x** ({stored} of {input}); {}",
            x.reduction,
            others.join(", ")
        );
        out.push(Target::new(
            &name,
            &goal_text,
            measured,
            Some(x.reduction >= goal),
        ));
    }
    out
}

/// The tables of dedup.md.
fn tables(rep: &Report) -> Md {
    let (o, r) = (rep.options, rep.results);
    let mut s = Md::default();
    if o.quick {
        s.verdict("quick run: the small --quick series; speeds are dominated by per-process and per-file costs".into());
    }
    for n in &r.notes {
        s.verdict(format!("not measured / failed: {n}"));
    }
    summary(&mut s, o, r);
    for x in &r.series {
        series_table(&mut s, o, r, x);
    }
    per_snapshot(&mut s, o, r);
    reduction_section(&mut s, o, r);
    startup(&mut s, o, r);
    hashing(&mut s, r);
    work_section(&mut s, o, r);
    profile_section(&mut s, r);
    analysis(&mut s, o, r);
    s.title("Datasets".to_string());
    s.head(
        "| series | snapshots | files | input | bytes per snapshot | read + hash at start (s) |",
    );
    for x in &r.series {
        let per: Vec<u64> = x.bytes_per_snapshot.clone();
        let same = per.iter().all(|&b| b == per[0]);
        s.row(format!(
            "| {} | {} | {} | {} | {} | {:.2} |",
            x.name,
            x.snapshots,
            x.files,
            mb(x.input_bytes),
            if same && !per.is_empty() {
                format!("{} each", per[0])
            } else {
                per.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            x.warm_s
        ));
    }
    let mut extra: Vec<(String, String)> = vec![
        (
            "disk store".to_string(),
            format!("{} ({})", o.disk_dir.display(), rep.header.machine.disk_fs),
        ),
        (
            "tmpfs store".to_string(),
            format!(
                "{} ({})",
                o.tmpfs_dir.display(),
                rep.header.machine.spill_fs
            ),
        ),
        ("datasets".to_string(), o.datasets.display().to_string()),
    ];
    for (k, v) in &rep.tools {
        extra.push((k.clone(), v.clone()));
    }
    s.push(machine_table(&rep.header, extra));
    s.tables.retain(|t| !t.rows.is_empty());
    s
}

fn summary(s: &mut Md, o: &DOpts, r: &DResults) {
    if r.rows.is_empty() {
        return;
    }
    let def = &o.configs[0].label;
    s.title("Summary".to_string());
    s.head("| series | input | ours stored (reduction) | restic | borg | zstd -1 | ours GB/s disk | ours GB/s tmpfs | restic GB/s | borg GB/s | ours / restic GB/s | ours / borg GB/s |");
    for x in &r.series {
        let n = &x.name;
        let red = |m: &str| {
            find_any(o, r, n, m).map_or("—".into(), |y| {
                format!("{} ({:.2}x)", mb(y.stored_bytes), y.reduction)
            })
        };
        let g = |m: &str, st: StoreKind| find(r, n, m, st).map(|y| y.gbps.median);
        let tool = |m: &str| {
            find(r, n, m, StoreKind::Disk).map_or("—".into(), |y| {
                format!(
                    "{:.3} / {}",
                    y.gbps.median,
                    y.gbps_without_startup
                        .as_ref()
                        .map_or("—".into(), |z| format!("{:.3}", z.median))
                )
            })
        };
        let vs = |m: &str| match (g(def, StoreKind::Disk), find(r, n, m, StoreKind::Disk)) {
            (Some(a), Some(b)) => format!(
                "**{}** / {}",
                ratio(a, b.gbps.median),
                b.gbps_without_startup
                    .as_ref()
                    .map_or("—".into(), |z| ratio(a, z.median))
            ),
            _ => "—".into(),
        };
        s.row(format!(
            "| {n} | {} | **{}** | {} | {} | {} | **{}** | {} | {} | {} | {} | {} |",
            mb(x.input_bytes),
            red(def),
            red(RESTIC),
            red(BORG),
            red(ZSTD),
            g(def, StoreKind::Disk).map_or("—".into(), |v| format!("{v:.3}")),
            g(def, StoreKind::Tmpfs).map_or("—".into(), |v| format!("{v:.3}")),
            tool(RESTIC),
            tool(BORG),
            vs(RESTIC),
            vs(BORG)
        ));
    }
}

fn series_table(s: &mut Md, o: &DOpts, r: &DResults, x: &SeriesInfo) {
    let rows: Vec<&Row> = r.rows.iter().filter(|y| y.series == x.name).collect();
    if rows.is_empty() {
        return;
    }
    s.title(format!(
        "{}: {} snapshots, {} in {} files",
        x.name,
        x.snapshots,
        mb(x.input_bytes),
        x.files
    ));
    let restic = find(r, &x.name, RESTIC, StoreKind::Disk);
    let borg = find(r, &x.name, BORG, StoreKind::Disk);
    s.head("| method | store | stored | reduction | restic stores (x this) | borg stores (x this) | ingest GB/s | x restic (raw / w/o its start-up) | x borg (raw / w/o its start-up) | CPU s/GB | sync after (s) | restore GB/s | verified |");
    let order = |y: &Row| match y.kind.as_str() {
        "cascade" => o
            .configs
            .iter()
            .position(|c| c.label == y.method)
            .unwrap_or(0),
        RESTIC => 100,
        BORG => 101,
        CP => 102,
        _ => 103,
    };
    let mut rows = rows;
    rows.sort_by_key(|y| (order(y), y.store == StoreKind::Tmpfs));
    for y in rows {
        let vs_stored = |b: Option<&Row>| {
            b.filter(|b| b.method != y.method)
                .map_or(String::new(), |b| {
                    ratio(b.stored_bytes as f64, y.stored_bytes as f64)
                })
        };
        let vs_speed = |b: Option<&Row>| {
            b.filter(|b| b.method != y.method)
                .map_or(String::new(), |b| {
                    format!(
                        "{} / {}",
                        ratio(y.gbps.median, b.gbps.median),
                        b.gbps_without_startup
                            .as_ref()
                            .map_or("—".into(), |z| ratio(y.gbps.median, z.median))
                    )
                })
        };
        let speed = match &y.gbps_without_startup {
            Some(n) => format!("{} (w/o start-up {})", st(&y.gbps), st(n)),
            None => st(&y.gbps),
        };
        let name = if y.kind == "cascade" {
            format!("**ours `{}`**", y.method)
        } else {
            y.method.clone()
        };
        // restic draws a random chunker polynomial per repository: its bytes vary a little.
        let lo = y.samples.iter().map(|z| z.stored).min().unwrap_or(0);
        let hi = y.samples.iter().map(|z| z.stored).max().unwrap_or(0);
        let stored = if hi - lo >= 100_000 {
            format!(
                "{} [{:.1}–{:.1}]",
                mb(y.stored_bytes),
                lo as f64 / 1e6,
                hi as f64 / 1e6
            )
        } else {
            mb(y.stored_bytes)
        };
        s.row(format!(
            "| {name} | {} | {stored} | {:.2}x | {} | {} | {speed} | {} | {} | {} | {} | {} | {} |",
            y.store.name(),
            y.reduction,
            vs_stored(restic),
            vs_stored(borg),
            vs_speed(restic),
            vs_speed(borg),
            st(&y.cpu_s_per_gb),
            y.sync_s.as_ref().map_or(String::new(), st),
            y.restore_gbps.as_ref().map_or(String::new(), st),
            y.verified.clone().unwrap_or_default()
        ));
    }
    // Our repositories in detail.
    let ours: Vec<&Row> = r
        .rows
        .iter()
        .filter(|y| y.series == x.name && y.kind == "cascade" && y.store == o.stores[0])
        .collect();
    if ours.is_empty() {
        return;
    }
    s.title(format!("{}: our repositories in detail", x.name));
    s.head("| configuration | chunks | new chunks | new bytes | written into packs (data + recipe trees) | packs | pack objects | index | manifests | open (s) | reopen (s) | verify all GB/s | child peak RSS |");
    for y in ours {
        let (Some(w), Some(b)) = (&y.stats, &y.repo) else {
            continue;
        };
        let last = y.samples.last().and_then(|z| z.ingest.as_ref());
        s.row(format!(
            "| `{}` | {} | {} | {} | {} + {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            y.method,
            w.chunks,
            w.new_chunks,
            mb(w.new_bytes),
            mb(w.stored_data_bytes),
            mb(w.stored_tree_bytes),
            mb(b.packs),
            b.pack_objects,
            mb(b.index),
            mb(b.manifests),
            y.open_s.as_ref().map_or(String::new(), st),
            last.map_or(String::new(), |l| format!("{:.3}", l.reopen_s)),
            y.verify_gbps.as_ref().map_or(String::new(), st),
            last.map_or(String::new(), |l| format!("{} MiB", l.max_rss_kib / 1024))
        ));
    }
}

fn reduction_section(s: &mut Md, o: &DOpts, r: &DResults) {
    let ours: Vec<&Row> = r
        .rows
        .iter()
        .filter(|y| y.kind == "cascade" && y.store == o.stores[0] && y.stats.is_some())
        .collect();
    if ours.is_empty() {
        return;
    }
    s.title("Where the reduction comes from".to_string());
    s.head(
        "| series | method | dedup | compression | new bytes stored raw | overhead | reduction |",
    );
    for x in &r.series {
        for y in ours.iter().filter(|y| y.series == x.name) {
            let (Some(w), Some(b)) = (&y.stats, &y.repo) else {
                continue;
            };
            let raw = r
                .breakdown
                .iter()
                .find(|b| b.series == x.name && b.config == y.method)
                .filter(|b| b.out.fresh_bytes > 0 && !y.method.ends_with("+none"))
                .map_or("—".into(), |b| {
                    format!(
                        "{:.0} %",
                        100.0 * b.out.raw_bytes as f64 / b.out.fresh_bytes as f64
                    )
                });
            let overhead = b.total.saturating_sub(w.stored_data_bytes);
            s.row(format!(
                "| {} | `{}` | {:.2}x | {:.2}x | {raw} | {} ({:.1} %) | **{:.2}x** |",
                x.name,
                y.method,
                w.bytes as f64 / w.new_bytes.max(1) as f64,
                w.new_bytes as f64 / w.stored_data_bytes.max(1) as f64,
                mb(overhead),
                100.0 * overhead as f64 / b.total.max(1) as f64,
                y.reduction
            ));
        }
        for m in [RESTIC, BORG, ZSTD] {
            if let Some(y) = find_any(o, r, &x.name, m) {
                s.row(format!(
                    "| {} | {m} | | | | | {:.2}x |",
                    x.name, y.reduction
                ));
            }
        }
    }
}

fn startup(s: &mut Md, o: &DOpts, r: &DResults) {
    let rows: Vec<&Row> = r.rows.iter().filter(|y| y.startup_s.is_some()).collect();
    if rows.is_empty() {
        return;
    }
    s.title("Start-up of restic and borg".to_string());
    s.head(&format!("| series | tool | start-up (s) | backups of the series (s) | share of start-up | ours `{}` open (s) |", o.configs[0].label));
    for y in rows {
        let Some(su) = &y.startup_s else { continue };
        let secs = Stats::of(&y.samples.iter().map(|z| z.seconds).collect::<Vec<_>>());
        let n = y.samples.first().map_or(0, |z| z.per_snapshot_s.len()) as f64;
        let ours = find_any(o, r, &y.series, &o.configs[0].label)
            .and_then(|z| z.open_s.as_ref())
            .map_or(String::new(), st);
        s.row(format!(
            "| {} | {} | {} | {} | {:.0} % | {ours} |",
            y.series,
            y.method,
            st(su),
            st(&secs),
            100.0 * n * su.median / secs.median
        ));
    }
}

fn hashing(s: &mut Md, r: &DResults) {
    if r.hashing.is_empty() {
        return;
    }
    s.title("Reading and hashing: the floor of any dedup".to_string());
    s.head("| series | bytes | read GB/s | read + BLAKE3, 1 thread | BLAKE3 in memory, 1 thread | BLAKE3 of 64 KiB pieces, all cores |");
    for h in &r.hashing {
        s.row(format!(
            "| {} | {} | {} | {} | {} | {} ({} threads) |",
            h.series,
            mb(h.bytes),
            st(&h.read_gbps),
            st(&h.read_hash_gbps),
            st(&h.hash1_gbps),
            st(&h.hash_par_gbps),
            h.threads
        ));
    }
}

/// Median seconds of the ingest of `method` on `series` in `store`.
fn measured_s(r: &DResults, series: &str, method: &str, store: StoreKind) -> Option<f64> {
    find(r, series, method, store)
        .map(|y| Stats::of(&y.samples.iter().map(|z| z.seconds).collect::<Vec<_>>()).median)
}

/// What the writers waited for, medians over the repetitions (see [`IngestOut::own_s`]).
struct StoreWaits {
    /// Share of the measured time not the writers' own work.
    share: f64,
    per_checkpoint_s: f64,
    own_s: f64,
}

fn store_waits(r: &DResults, series: &str, method: &str, store: StoreKind) -> Option<StoreWaits> {
    let y = find(r, series, method, store)?;
    let checkpoints = r.series.iter().find(|s| s.name == series)?.snapshots.max(1) as f64;
    let timed: Vec<(f64, f64)> = y
        .samples
        .iter()
        .filter_map(|z| z.ingest.as_ref())
        .filter(|i| i.own_s > 0.0 && i.ingest_s > 0.0)
        .map(|i| (i.ingest_s, i.own_s))
        .collect();
    if timed.is_empty() {
        return None;
    }
    let median =
        |f: &dyn Fn(&(f64, f64)) -> f64| Stats::of(&timed.iter().map(f).collect::<Vec<_>>()).median;
    Some(StoreWaits {
        share: median(&|(all, own)| (all - own) / all),
        per_checkpoint_s: median(&|(all, own)| (all - own) / checkpoints),
        own_s: median(&|(_, own)| *own),
    })
}

/// Median CPU seconds (all threads) of the ingest of `method` on `series` in `store`.
fn measured_cpu_s(r: &DResults, series: &str, method: &str, store: StoreKind) -> Option<f64> {
    find(r, series, method, store)
        .map(|y| Stats::of(&y.samples.iter().map(|z| z.cpu_s).collect::<Vec<_>>()).median)
}

/// The reference passes in memory (and the read), in the writer's order (key, label).
const REFERENCES: [(&str, &str); 6] = [
    (
        "read",
        "read() of the files, 8 MiB calls into one reused buffer (page cache)",
    ),
    ("cut-points", "cut points (`Chunking::split`)"),
    ("score-1t", "chunk scores (BLAKE3 of each chunk)"),
    ("hash-1t", "whole-file BLAKE3"),
    (
        "compress-1t",
        "zstd of the new chunks (`Compression::compress`; GB/s of the new bytes)",
    ),
    (
        "pack-hash-1t",
        "pack ids (BLAKE3 of each pack; GB/s of the bytes into packs)",
    ),
];

/// Seconds if each necessary step ran once, spread over all cores: read + cut points + chunk
/// scores + compression of new chunks + pack writes into `store`.
fn ideal_s(b: &BreakdownOut, store: StoreKind) -> f64 {
    (b.secs("read")
        + b.secs("cut-points")
        + b.secs("score-1t")
        + b.secs("compress-1t")
        + b.write_secs(store))
        / b.threads.max(1) as f64
}

/// Seconds of every step the writer runs, once each on one thread: the reference passes
/// (with the whole-file BLAKE3 and the pack ids) and the pack writes into `store`.
fn steps_s(b: &BreakdownOut, store: StoreKind) -> f64 {
    REFERENCES.iter().map(|(k, _)| b.secs(k)).sum::<f64>() + b.write_secs(store)
}

fn per_snapshot(s: &mut Md, o: &DOpts, r: &DResults) {
    for x in &r.series {
        let rows = r.rows.iter().filter(|y| {
            y.series == x.name
                && (y.kind != "cascade" && y.kind != CP || y.store == o.stores[0])
                && !y.per_snapshot_stored.is_empty()
        });
        let mut head = vec!["method".to_string()];
        head.extend((0..x.snapshots).map(|i| format!("{i:02}")));
        let input = x.bytes_per_snapshot.first().map_or("?".into(), |&b| mb(b));
        let title = format!(
            "Bytes added per snapshot (MB): {} (input {input} per snapshot)",
            x.name
        );
        let mut t = Table::with_head(title, &head);
        for y in rows {
            let mut row = vec![y.method.clone()];
            row.extend(
                y.per_snapshot_stored
                    .iter()
                    .map(|&b| format!("{:.1}", b as f64 / 1e6)),
            );
            t.row(row);
        }
        s.push(t);
    }
}

/// The reference passes of one series, one column per configuration.
fn work_section(s: &mut Md, o: &DOpts, r: &DResults) {
    let Some(first) = r.breakdown.first() else {
        return;
    };
    let threads = first.out.threads.max(1);
    for x in &r.series {
        let rows: Vec<&BreakdownRow> = r.breakdown.iter().filter(|b| b.series == x.name).collect();
        if rows.is_empty() {
            continue;
        }
        let mut head = vec!["step (one thread): s (GB/s)".to_string()];
        head.extend(rows.iter().map(|b| format!("`{}`", b.config)));
        let mut t = Table::with_head(
            format!("What the work costs: {} ({})", x.name, mb(x.input_bytes)),
            &head,
        );
        let cell = |stg: Option<&Stage>, none: &str| match stg {
            Some(stg) => format!("{:.2} ({:.2})", stg.seconds, gbps(stg.bytes, stg.seconds)),
            None => none.to_string(),
        };
        for (k, label) in REFERENCES {
            let none = if k == "compress-1t" {
                "— (none)"
            } else {
                "—"
            };
            let mut row = vec![label.to_string()];
            row.extend(rows.iter().map(|b| cell(b.out.stage(k), none)));
            t.row(row);
        }
        for &st in &o.stores {
            let n = st.name();
            let mut row = vec![format!(
                "pack writes into the {n} store (GB/s of the bytes into packs)"
            )];
            row.extend(rows.iter().map(|b| cell(b.out.pack_writes(st), "—")));
            t.row(row);
            let mut all = vec![format!("every step above once, one thread ({n})")];
            let mut ideal = vec![format!(
                "**each necessary step once, spread over {threads} cores** ({n})"
            )];
            let mut meas = vec![format!(
                "**measured ingest, {n}** (median; CPU s of all threads)"
            )];
            for b in &rows {
                let (a, i) = (steps_s(&b.out, st), ideal_s(&b.out, st));
                all.push(format!("{a:.2} ({:.2})", gbps(b.out.input, a)));
                ideal.push(format!("**{i:.2}** ({:.2})", gbps(b.out.input, i)));
                meas.push(match measured_s(r, &x.name, &b.config, st) {
                    Some(m) => {
                        let cpu = measured_cpu_s(r, &x.name, &b.config, st)
                            .map_or(String::new(), |c| format!("; {c:.2} CPU s"));
                        format!("**{m:.2}** ({:.3}{cpu})", gbps(b.out.input, m))
                    }
                    None => "—".into(),
                });
            }
            t.row(all);
            t.row(ideal);
            t.row(meas);
        }
        let mut row = vec![
            "chunks; new chunks (new bytes); bytes into packs (new bytes stored raw); packs"
                .to_string(),
        ];
        for b in &rows {
            let raw = b
                .out
                .stage("compress-1t")
                .map_or("no zstd".to_string(), |_| mb(b.out.raw_bytes));
            let o = &b.out;
            row.push(format!(
                "{}; {} ({}); {} ({raw}); {}",
                o.chunks,
                o.fresh_chunks,
                mb(o.fresh_bytes),
                mb(o.stored_bytes),
                o.packs
            ));
        }
        t.row(row);
        s.push(t);
    }
}

fn profile_section(s: &mut Md, r: &DResults) {
    let mut cats: Vec<String> = Vec::new();
    for p in &r.profiles {
        for (c, _) in &p.categories {
            if !cats.contains(c) {
                cats.push(c.clone());
            }
        }
    }
    let mut head = vec!["category".to_string()];
    for p in &r.profiles {
        let rate = gbps(p.input_bytes, p.ingest_s);
        head.push(format!(
            "{} (`{}`, {} store, {:.2} s, {rate:.3} GB/s)",
            p.series,
            p.config,
            p.store.name(),
            p.ingest_s
        ));
    }
    let mut t = Table::with_head("Profile (perf): share of samples", &head);
    for c in &cats {
        let mut row = vec![c.clone()];
        for p in &r.profiles {
            let v = p
                .categories
                .iter()
                .find(|(k, _)| k == c)
                .map_or(0.0, |(_, v)| *v);
            row.push(format!("{v:.1} %"));
        }
        t.row(row);
    }
    s.push(t);
    for p in &r.profiles {
        let title = format!("Profile (perf): top symbols, {} `{}`", p.series, p.config);
        let mut t = Table::new(title, "self % | object | symbol | category");
        for x in p.top.iter().take(15) {
            let mut sym = x.symbol.replace('|', "\\|");
            if sym.chars().count() > 100 {
                sym = sym.chars().take(97).collect::<String>() + "...";
            }
            t.row([
                format!("{:.1}", x.pct),
                x.dso.clone(),
                format!("`{sym}`"),
                x.category.to_string(),
            ]);
        }
        s.push(t);
    }
}

/// What bounds the ingest of the default configuration: the work per GB against the cores,
/// the one-thread tasks and the store (see bench/README.md, "The dedup benchmarks").
fn analysis(s: &mut Md, o: &DOpts, r: &DResults) {
    let Some(first) = r.breakdown.first() else {
        return;
    };
    let threads = first.out.threads.max(1);
    let st = if o.stores.contains(&StoreKind::Disk) {
        StoreKind::Disk
    } else {
        o.stores[0]
    };
    let def = &o.configs[0].label;
    let head = "series | read() | cut points | chunk scores | zstd of new chunks | pack writes | sum (CPU s/GB) | GB/s spread over all cores | measured GB/s | into the store at 1 GB/s ingest | `cp -r` into the same store";
    let mut t = Table::new(
        format!(
            "What bounds the ingest: `{def}`, CPU s per GB ({} store, {threads} cores)",
            st.name()
        ),
        head,
    );
    for b in r.breakdown.iter().filter(|b| b.config == *def) {
        let x = &b.out;
        let gb = x.input as f64 / 1e9;
        let per = |v: f64| format!("{:.2}", v / gb);
        let sum = ideal_s(x, st) * threads as f64;
        let rate = find(r, &b.series, def, st)
            .map_or("—".into(), |y| format!("{:.2} GB/s", 1.0 / y.reduction));
        let cp = find(r, &b.series, CP, st)
            .map_or("—".into(), |y| format!("{:.2} GB/s", y.gbps.median));
        let measured = measured_s(r, &b.series, def, st)
            .map_or("—".into(), |m| format!("{:.3}", gbps(x.input, m)));
        let spread = format!("{:.2}", threads as f64 * gb / sum);
        let steps = [
            x.secs("read"),
            x.secs("cut-points"),
            x.secs("score-1t"),
            x.secs("compress-1t"),
            x.write_secs(st),
        ];
        let mut row: Vec<String> = vec![b.series.clone()];
        row.extend(steps.map(per));
        row.extend([format!("**{:.2}**", sum / gb), spread, measured, rate, cp]);
        t.row(row);
        // The tightest of the three limits.
        let read_cut = (x.secs("read") + x.secs("cut-points")) / gb;
        let one_thread = 1.0 / read_cut.max(x.secs("hash-1t") / gb);
        let cores = threads as f64 / (steps_s(x, st) / gb);
        let stored_per_input = x.stored_bytes as f64 / x.input.max(1) as f64;
        let store = x
            .pack_writes(st)
            .map(|p| gbps(p.bytes, p.seconds) / stored_per_input.max(1e-9));
        let mut bounds = vec![("the cores", cores), ("the one-thread tasks", one_thread)];
        bounds.extend(store.map(|v| ("the store", v)));
        if let Some((what, v)) = bounds.into_iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            // Of the configuration the goal is checked on: the +delta form where it ran.
            let with_deltas = format!("{def}+delta");
            let waits = [with_deltas.as_str(), def.as_str()]
                .into_iter()
                .find_map(|c| store_waits(r, &b.series, c, st).map(|w| (c, w)));
            let waits = waits.map_or(String::new(), |(c, w)| {
                format!(
                    "; `{c}`: {:.0} % of the measured time is per-checkpoint set-up and \
                     waiting for the durable store ({:.1} ms per checkpoint: session, last \
                     packs, index object, manifest), the writer's own work alone runs at \
                     {:.2} GB/s",
                    w.share * 100.0,
                    w.per_checkpoint_s * 1e3,
                    gbps(x.input, w.own_s)
                )
            });
            s.verdict(format!(
                "{}: ingest bounded by {what} at {v:.2} GB/s (cores {cores:.2}, one-thread tasks {one_thread:.2}, store {}){waits}",
                b.series,
                store.map_or("n/a".into(), |v| format!("{v:.2}"))
            ));
        }
    }
    s.push(t);
}
