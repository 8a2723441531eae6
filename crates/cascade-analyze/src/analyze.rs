//! Analysis of a checkpoint series: how much of each snapshot repeats what came before
//! (dedup ratios under several chunkings), how well the unique data compresses, how CDC
//! chunk sizes fall, and where in each file the changes are (heatmaps). This is the engine of
//! `cascade analyze`; docs/dedup.md explains every figure.
//!
//! A series is an ordered list of snapshots; a snapshot is one file or a directory (walked
//! recursively, regular files only, symbolic links skipped, in sorted path order). The files
//! of a directory snapshot are matched with the previous snapshot's by relative path; single
//! file snapshots are matched with each other whatever their names.
//!
//! **How it runs.** Each file is read in 64 MiB windows (the next window is read while the
//! current one is analysed, so the file never has to fit in memory), cut by every chunking,
//! hashed with BLAKE3 on all cores (rayon), and its chunks are looked up in one in-memory
//! index per chunking. Fixed chunkings whose size is a power of two identify a chunk by a
//! BLAKE3 over the BLAKE3s of its 512-byte pieces, which is equal exactly when the bytes are
//! equal and costs a fraction of hashing the bytes again; CDC chunks and other fixed sizes
//! are hashed directly. The index keeps the first 16 bytes of each score (about 40 bytes of
//! memory per unique chunk, so ~80 MB per GB of unique data for the 512-byte chunking).
//! Only chunks new to the series are compressed (zstd at each level asked for).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fastcdc::v2020::FastCDC;
use rayon::prelude::*;
use serde::Serialize;

use crate::heatmap::Heatmap;
use cascade_dedup::chunking::{format_size, Chunking};
use cascade_dedup::compress::Compression;
use cascade_dedup::score::{score, short_key};

/// Bytes read and analysed at a time per file.
pub const WINDOW: usize = 64 << 20;
/// Size of the blocks compared at the same offset between snapshots (and heatmap cells).
pub const BLOCK: u64 = 4096;
const MIB: usize = 1 << 20;
/// Pieces every power-of-two fixed chunking is built from.
const PIECE: usize = 512;
/// Format tag of the JSON report.
pub const REPORT_FORMAT: &str = "cascade-analyze/1";

/// The chunkings always analysed: fixed 512 B, 4 KiB, 8 KiB (as in the cento paper) and
/// `cdc:avg=64KiB`.
pub const DEFAULT_CHUNKINGS: [Chunking; 4] = [
    Chunking::Fixed { size: 512 },
    Chunking::Fixed { size: 4096 },
    Chunking::Fixed { size: 8192 },
    Chunking::DEFAULT_CDC,
];

/// The zstd levels the unique CDC chunks are compressed at by default.
pub const DEFAULT_LEVELS: [i32; 2] = [1, 3];

/// A failure of the analysis: the path it concerns and why, shown as `PATH: reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub path: PathBuf,
    pub message: String,
}

impl Error {
    fn new(path: &Path, message: impl Into<String>) -> Error {
        Error {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: &Path, err: &io::Error) -> Error {
        Error::new(path, io_reason(err))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.as_os_str().is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path.display(), self.message)
        }
    }
}

impl std::error::Error for Error {}

/// "No such file or directory", without Rust's " (os error 2)".
fn io_reason(err: &io::Error) -> String {
    let text = err.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

/// What to analyse.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Chunkings to report, in order; the first CDC one is the one whose unique chunks are
    /// compressed and whose chunk sizes are shown first.
    pub chunkings: Vec<Chunking>,
    /// zstd levels to compress the unique CDC chunks at.
    pub compression_levels: Vec<i32>,
    /// Whether to build the change heatmaps (memory: 4 bytes per heatmap cell).
    pub heatmaps: bool,
    /// Bytes of a file read and analysed at a time ([`WINDOW`] by default). Rounded up to a
    /// multiple of 1 MiB, so that every power-of-two fixed chunk lies within one window; the
    /// results do not depend on it.
    pub window: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            chunkings: DEFAULT_CHUNKINGS.to_vec(),
            compression_levels: DEFAULT_LEVELS.to_vec(),
            heatmaps: false,
            window: WINDOW,
        }
    }
}

impl Options {
    /// Adds a chunking after the others unless it is already there.
    pub fn add_chunking(&mut self, chunking: Chunking) {
        if !self.chunkings.contains(&chunking) {
            self.chunkings.push(chunking);
        }
    }
}

/// An ordered list of snapshots, as found by [`scan`].
#[derive(Debug, Clone)]
pub struct Series {
    pub snapshots: Vec<Snapshot>,
}

/// One snapshot: a file, or a directory and the regular files below it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The path as given.
    pub path: PathBuf,
    /// Whether the path is a directory.
    pub is_dir: bool,
    /// Its files in sorted path order.
    pub files: Vec<SnapshotFile>,
}

/// One file of a snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    /// Where to read it.
    pub path: PathBuf,
    /// Path relative to the snapshot's directory; empty for a snapshot that is a file.
    pub rel: PathBuf,
    /// Size when scanned.
    pub len: u64,
}

impl Series {
    /// Bytes in all files of all snapshots (as scanned).
    pub fn total_bytes(&self) -> u64 {
        self.snapshots
            .iter()
            .flat_map(|s| &s.files)
            .map(|f| f.len)
            .sum()
    }

    /// Number of files over all snapshots.
    pub fn file_count(&self) -> usize {
        self.snapshots.iter().map(|s| s.files.len()).sum()
    }
}

/// Lists the snapshots: each path must be a regular file or a directory (symbolic links
/// given on the command line are followed; below a directory they are skipped, as are
/// sockets, FIFOs and devices). Fails on a missing or unreadable path, and when the whole
/// series holds no file.
pub fn scan<P: AsRef<Path>>(paths: &[P]) -> Result<Series, Error> {
    let Some(first) = paths.first() else {
        return Err(Error::new(Path::new(""), "no snapshots to analyse"));
    };
    let mut snapshots = Vec::with_capacity(paths.len());
    for path in paths {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?;
        let snapshot = if meta.is_file() {
            Snapshot {
                path: path.to_path_buf(),
                is_dir: false,
                files: vec![SnapshotFile {
                    path: path.to_path_buf(),
                    rel: PathBuf::new(),
                    len: meta.len(),
                }],
            }
        } else if meta.is_dir() {
            let mut files = Vec::new();
            walk(path, Path::new(""), &mut files)?;
            files.sort_by(|a, b| a.rel.cmp(&b.rel));
            Snapshot {
                path: path.to_path_buf(),
                is_dir: true,
                files,
            }
        } else {
            return Err(Error::new(path, "not a regular file or directory"));
        };
        snapshots.push(snapshot);
    }
    let series = Series { snapshots };
    if series.file_count() == 0 {
        let what = if paths.len() == 1 {
            "no files to analyse (empty directory)"
        } else {
            "no files to analyse in the series (all directories are empty)"
        };
        return Err(Error::new(first.as_ref(), what));
    }
    Ok(series)
}

fn walk(dir: &Path, rel: &Path, files: &mut Vec<SnapshotFile>) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, &e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| Error::io(&path, &e))?;
        let entry_rel = rel.join(entry.file_name());
        if kind.is_dir() {
            walk(&path, &entry_rel, files)?;
        } else if kind.is_file() {
            let len = entry.metadata().map_err(|e| Error::io(&path, &e))?.len();
            files.push(SnapshotFile {
                path,
                rel: entry_rel,
                len,
            });
        }
    }
    Ok(())
}

/// The result of [`analyze`]; serialized as the `--json` document (field names are part of
/// the interface, see docs/dedup.md).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always [`REPORT_FORMAT`].
    pub format: &'static str,
    /// Per snapshot: size, files, same-offset 4 KiB blocks.
    pub snapshots: Vec<SnapshotReport>,
    /// Files over all snapshots.
    pub files: u64,
    /// Bytes over all snapshots.
    pub total_bytes: u64,
    /// Per chunking: dedup over the series and per snapshot.
    pub chunkings: Vec<ChunkingReport>,
    /// Compression of the unique chunks of the first CDC chunking (none without one).
    pub compression: Option<CompressionReport>,
    /// Wall-clock time of the analysis (reading, chunking, hashing, compressing).
    pub elapsed_seconds: f64,
    /// total_bytes / elapsed_seconds, in MB/s (10^6 bytes per second).
    pub throughput_mb_per_s: f64,
    /// Threads used (rayon's pool: one per core unless RAYON_NUM_THREADS says otherwise).
    pub threads: usize,
    /// PNG files written (filled in by the caller that writes them).
    pub plots: Vec<String>,
    /// Change heatmaps, one per file path, when asked for (not serialized).
    #[serde(skip)]
    pub heatmaps: Vec<Heatmap>,
}

/// One snapshot's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// 1-based position in the series.
    pub index: usize,
    pub path: String,
    pub files: u64,
    pub bytes: u64,
    /// 4 KiB blocks (the last block of a file may be shorter).
    pub blocks_4k: u64,
    /// Blocks identical to the block at the same offset of the same file in the previous
    /// snapshot (null for the first snapshot).
    pub same_offset_blocks_4k: Option<u64>,
    /// same_offset_blocks_4k / blocks_4k (null for the first snapshot or no blocks).
    pub same_offset_fraction_4k: Option<f64>,
}

/// Dedup figures for one chunking.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkingReport {
    /// Canonical spec, e.g. `fixed:4KiB`, `cdc:avg=64KiB`.
    pub spec: String,
    pub chunks: u64,
    pub unique_chunks: u64,
    pub total_bytes: u64,
    pub unique_bytes: u64,
    /// total_bytes - unique_bytes.
    pub duplicate_bytes: u64,
    /// total_bytes / unique_bytes (1.0 when there are no bytes).
    pub dedup_ratio: f64,
    /// Per snapshot, in series order.
    pub snapshots: Vec<ChunkingSnapshot>,
    /// Chunk sizes in power-of-two buckets (CDC only; null for fixed chunkings).
    pub size_histogram: Option<Vec<SizeBucket>>,
}

/// One snapshot under one chunking. "New" chunks were not seen before in the series (nor
/// earlier in this snapshot); "duplicate" chunks were.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkingSnapshot {
    pub index: usize,
    pub chunks: u64,
    pub bytes: u64,
    pub new_chunks: u64,
    pub new_bytes: u64,
    pub duplicate_chunks: u64,
    pub duplicate_bytes: u64,
    /// Sums over the snapshots up to and including this one.
    pub cumulative_chunks: u64,
    pub cumulative_bytes: u64,
    pub cumulative_unique_chunks: u64,
    pub cumulative_unique_bytes: u64,
    pub cumulative_duplicate_chunks: u64,
    pub cumulative_duplicate_bytes: u64,
    /// cumulative_bytes / cumulative_unique_bytes.
    pub cumulative_dedup_ratio: f64,
}

/// Chunks whose size is in `min_bytes..=max_bytes` (a power of two up to just below the next).
#[derive(Debug, Clone, Serialize)]
pub struct SizeBucket {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub chunks: u64,
    pub bytes: u64,
}

/// Compression of the unique chunks of one chunking.
#[derive(Debug, Clone, Serialize)]
pub struct CompressionReport {
    /// The chunking whose unique chunks were compressed.
    pub chunking: String,
    pub unique_chunks: u64,
    pub unique_bytes: u64,
    /// One entry per zstd level.
    pub codecs: Vec<CodecReport>,
}

/// One codec's result. A chunk is stored compressed only if that saves at least 1/8 of it
/// (see [`cascade_dedup::compress`]); stored_bytes counts the others at their full size.
#[derive(Debug, Clone, Serialize)]
pub struct CodecReport {
    /// e.g. `zstd:1`.
    pub codec: String,
    pub stored_bytes: u64,
    /// Unique chunks that were worth compressing.
    pub compressed_chunks: u64,
    /// unique_bytes / stored_bytes.
    pub compression_ratio: f64,
    /// The series' total bytes / stored_bytes: dedup and compression together.
    pub dedup_compression_ratio: f64,
}

/// Counters of one chunking in one snapshot.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    chunks: u64,
    bytes: u64,
    new_chunks: u64,
    new_bytes: u64,
}

/// Hashes u128 keys (already uniformly random) by taking their low bits.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }
}

type KeySet = HashSet<u128, BuildHasherDefault<KeyHasher>>;

/// How a chunking's keys are computed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Method {
    /// From the digests of its 512-byte pieces (power-of-two fixed sizes).
    Pieces { per_chunk: usize },
    /// By hashing each chunk, with its own position in the file (CDC, other fixed sizes).
    Direct,
}

struct ChunkState {
    chunking: Chunking,
    method: Method,
    reported: bool,
    seen: KeySet,
    counts: Vec<Counts>,
    /// Bucket b: chunks of 2^b ..= 2^(b+1)-1 bytes (chunks, bytes).
    histogram: [(u64, u64); 64],
}

/// One chunking's chunks in a window: lengths and keys in order.
struct WindowChunks {
    lens: Vec<u32>,
    keys: Vec<u128>,
    /// Buffer-relative ranges (Direct chunkings only).
    ranges: Vec<Range<usize>>,
}

/// Chunks as byte ranges of the window's buffer.
type Cuts = Vec<Range<usize>>;

/// Accumulates per-level compression results.
#[derive(Debug, Clone, Copy, Default)]
struct Stored {
    bytes: u64,
    compressed_chunks: u64,
}

/// Per-path heatmap accumulation.
struct HeatAcc {
    name: String,
    blocks_per_region: u64,
    regions: u64,
    changes: Vec<u32>,
}

struct Engine<'a> {
    options: &'a Options,
    states: Vec<ChunkState>,
    block_state: usize,
    primary_cdc: Option<usize>,
    stored: Vec<Stored>,
    snapshots: usize,
    /// The two read buffers, kept from file to file.
    buffers: [Vec<u8>; 2],
    /// Options::window, rounded up to a multiple of 1 MiB.
    window: usize,
}

/// Analyses the series; `progress` is called with the number of bytes done after each window
/// (from the calling thread). Fails with the path of a file that cannot be read.
pub fn analyze(
    series: &Series,
    options: &Options,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Report, Error> {
    let started = Instant::now();
    let mut engine = Engine::new(options, series.snapshots.len());
    let mut heat = if options.heatmaps {
        heat_accumulators(series)
    } else {
        HashMap::new()
    };
    let mut previous: Option<HashMap<PathBuf, Vec<u128>>> = None;
    let mut snapshot_reports = Vec::with_capacity(series.snapshots.len());
    for (index, snapshot) in series.snapshots.iter().enumerate() {
        let mut current = HashMap::with_capacity(snapshot.files.len());
        let mut bytes = 0;
        for file in &snapshot.files {
            let (len, blocks) = engine.file(file, index, progress)?;
            bytes += len;
            current.insert(file.rel.clone(), blocks);
        }
        let blocks_4k: u64 = current.values().map(|b| b.len() as u64).sum();
        let same = previous.as_ref().map(|prev| {
            current
                .iter()
                .map(|(rel, blocks)| match prev.get(rel) {
                    Some(old) => blocks.iter().zip(old).filter(|(a, b)| a == b).count() as u64,
                    None => 0,
                })
                .sum::<u64>()
        });
        if let Some(prev) = &previous {
            for (rel, acc) in heat.iter_mut() {
                let empty = Vec::new();
                let old = prev.get(rel).unwrap_or(&empty);
                let new = current.get(rel).unwrap_or(&empty);
                acc.transition(old, new);
            }
        }
        snapshot_reports.push(SnapshotReport {
            index: index + 1,
            path: snapshot.path.display().to_string(),
            files: snapshot.files.len() as u64,
            bytes,
            blocks_4k,
            same_offset_blocks_4k: same,
            same_offset_fraction_4k: same
                .filter(|_| blocks_4k > 0)
                .map(|s| s as f64 / blocks_4k as f64),
        });
        previous = Some(current);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total_bytes: u64 = snapshot_reports.iter().map(|s| s.bytes).sum();
    let transitions = u32::try_from(series.snapshots.len().saturating_sub(1)).unwrap_or(u32::MAX);
    let mut heatmaps: Vec<Heatmap> = heat
        .into_values()
        .map(|acc| Heatmap {
            name: acc.name,
            region_size: acc.blocks_per_region * BLOCK,
            regions: acc.regions,
            transitions,
            changes: acc.changes,
        })
        .collect();
    heatmaps.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Report {
        format: REPORT_FORMAT,
        files: series.file_count() as u64,
        total_bytes,
        chunkings: engine.chunking_reports(),
        compression: engine.compression_report(total_bytes),
        snapshots: snapshot_reports,
        elapsed_seconds: elapsed,
        throughput_mb_per_s: if elapsed > 0.0 {
            total_bytes as f64 / elapsed / 1e6
        } else {
            0.0
        },
        threads: rayon::current_num_threads(),
        plots: Vec::new(),
        heatmaps,
    })
}

/// One accumulator per relative path, sized for the largest version of the file: cells of
/// 4 KiB, or of 4 KiB times a power of two so that there are at most 1024 x 1024 of them.
fn heat_accumulators(series: &Series) -> HashMap<PathBuf, HeatAcc> {
    let mut max_len: HashMap<&Path, (u64, String)> = HashMap::new();
    for snapshot in &series.snapshots {
        for file in &snapshot.files {
            let name = if file.rel.as_os_str().is_empty() {
                file.path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "file".to_string())
            } else {
                file.rel.display().to_string()
            };
            let entry = max_len.entry(&file.rel).or_insert((0, name));
            entry.0 = entry.0.max(file.len);
        }
    }
    max_len
        .into_iter()
        .map(|(rel, (len, name))| {
            let blocks = len.div_ceil(BLOCK);
            let mut per_region = 1u64;
            while blocks.div_ceil(per_region) > crate::heatmap::MAX_CELLS {
                per_region *= 2;
            }
            let regions = blocks.div_ceil(per_region);
            let acc = HeatAcc {
                name,
                blocks_per_region: per_region,
                regions,
                changes: vec![0; regions as usize],
            };
            (rel.to_path_buf(), acc)
        })
        .collect()
}

impl HeatAcc {
    /// Counts a change in every region where a block differs between the two versions (a
    /// block present in only one of them differs). Files that grew beyond the size scanned
    /// are counted up to that size.
    fn transition(&mut self, old: &[u128], new: &[u128]) {
        let per = self.blocks_per_region as usize;
        let longest = old.len().max(new.len());
        for (region, count) in self.changes.iter_mut().enumerate() {
            let start = region * per;
            if start >= longest {
                break;
            }
            let end = (start + per).min(longest);
            if (start..end).any(|i| old.get(i) != new.get(i)) {
                *count += 1;
            }
        }
    }
}

impl<'a> Engine<'a> {
    fn new(options: &'a Options, snapshots: usize) -> Engine<'a> {
        let mut chunkings: Vec<(Chunking, bool)> = Vec::new();
        for c in &options.chunkings {
            let c = c.clamped();
            if !chunkings.iter().any(|(have, _)| *have == c) {
                chunkings.push((c, true));
            }
        }
        let block = Chunking::Fixed { size: BLOCK as u32 };
        if !chunkings.iter().any(|(c, _)| *c == block) {
            chunkings.push((block, false));
        }
        let states: Vec<ChunkState> = chunkings
            .into_iter()
            .map(|(chunking, reported)| {
                let method = match chunking {
                    Chunking::Fixed { size }
                        if size.is_power_of_two() && size as usize >= PIECE =>
                    {
                        Method::Pieces {
                            per_chunk: size as usize / PIECE,
                        }
                    }
                    _ => Method::Direct,
                };
                ChunkState {
                    chunking,
                    method,
                    reported,
                    seen: KeySet::default(),
                    counts: vec![Counts::default(); snapshots],
                    histogram: [(0, 0); 64],
                }
            })
            .collect();
        let block_state = states
            .iter()
            .position(|s| s.chunking == block)
            .unwrap_or_default();
        let primary_cdc = states.iter().position(|s| s.chunking.is_cdc());
        Engine {
            options,
            states,
            block_state,
            primary_cdc,
            stored: vec![Stored::default(); options.compression_levels.len()],
            snapshots,
            buffers: [Vec::new(), Vec::new()],
            window: options.window.max(1).div_ceil(MIB) * MIB,
        }
    }

    /// Analyses one file of snapshot `snap`: its length and the keys of its 4 KiB blocks.
    fn file(
        &mut self,
        file: &SnapshotFile,
        snap: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(u64, Vec<u128>), Error> {
        let path = &file.path;
        let mut reader = File::open(path).map_err(|e| Error::io(path, &e))?;
        if reader.metadata().map_err(|e| Error::io(path, &e))?.is_dir() {
            return Err(Error::new(path, "Is a directory"));
        }
        let mut blocks = Vec::with_capacity(usize::try_from(file.len / BLOCK + 1).unwrap_or(0));
        // Two buffers, each [reserve][window]: one is analysed while the next window is read
        // into the other. The bytes a Direct chunking carries over (at most one maximal chunk)
        // are copied into the reserve just before the next window's bytes, so nothing else
        // is ever copied. Kept across files, so their pages are faulted in only once.
        let reserve = self
            .states
            .iter()
            .filter(|s| s.method == Method::Direct)
            .map(|s| s.chunking.max_chunk())
            .max()
            .unwrap_or(0);
        let mut current = std::mem::take(&mut self.buffers[0]);
        let mut next = std::mem::take(&mut self.buffers[1]);
        let result = self.file_windows(
            &mut reader,
            &mut current,
            &mut next,
            reserve,
            snap,
            &mut blocks,
            progress,
        );
        self.buffers = [current, next];
        let len = result.map_err(|e| Error::io(path, &e))?;
        Ok((len, blocks))
    }

    /// The window loop of [`Engine::file`]: the file's length.
    #[allow(clippy::too_many_arguments)]
    fn file_windows(
        &mut self,
        reader: &mut File,
        current: &mut Vec<u8>,
        next: &mut Vec<u8>,
        reserve: usize,
        snap: usize,
        blocks: &mut Vec<u128>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> io::Result<u64> {
        let window = self.window;
        for buffer in [&mut *current, &mut *next] {
            if buffer.capacity() < reserve + window {
                buffer.reserve(reserve + window - buffer.len());
            }
        }
        read_window(reader, current, reserve, window)?;
        // current[start..] holds the file's bytes from `base`.
        let mut start = reserve;
        let mut base: u64 = 0;
        // Where each Direct chunking has cut up to (its carried-over bytes start there).
        let mut cut_to: Vec<u64> = vec![0; self.states.len()];
        loop {
            let new_len = current.len() - reserve;
            let last = new_len < window;
            let new_start = base + (reserve - start) as u64;
            let (read, ()) = rayon::join(
                || {
                    if last {
                        Ok(())
                    } else {
                        read_window(reader, next, reserve, window)
                    }
                },
                || {
                    self.window(
                        &current[start..],
                        base,
                        new_start,
                        last,
                        &mut cut_to,
                        snap,
                        blocks,
                    )
                },
            );
            progress(new_len as u64);
            read?;
            let end = base + (current.len() - start) as u64;
            if last {
                return Ok(end);
            }
            let keep_from = self
                .states
                .iter()
                .zip(&cut_to)
                .filter(|(s, _)| s.method == Method::Direct)
                .map(|(_, &at)| at)
                .min()
                .unwrap_or(end)
                .min(end);
            // A carry is one chunk at most, and `reserve` is the largest chunk.
            let carry = &current[start + (keep_from - base) as usize..];
            debug_assert!(carry.len() <= reserve);
            let carry_len = carry.len().min(reserve);
            next[reserve - carry_len..reserve].copy_from_slice(&carry[carry.len() - carry_len..]);
            std::mem::swap(current, next);
            start = reserve - carry_len;
            base = end - carry_len as u64;
        }
    }

    /// Analyses the bytes of `buffer` (file offsets from `base`) that are new from
    /// `new_start`, plus what Direct chunkings carried over; `last` at the end of the file.
    #[allow(clippy::too_many_arguments)]
    fn window(
        &mut self,
        buffer: &[u8],
        base: u64,
        new_start: u64,
        last: bool,
        cut_to: &mut [u64],
        snap: usize,
        blocks: &mut Vec<u128>,
    ) {
        let end = base + buffer.len() as u64;
        let new = &buffer[(new_start - base) as usize..];
        // 1. The 512-byte piece digests of the new bytes, while the Direct chunkings find
        //    their cut points.
        let methods: Vec<(Chunking, Method, u64)> = self
            .states
            .iter()
            .zip(cut_to.iter())
            .map(|(s, &at)| (s.chunking, s.method, at))
            .collect();
        let (digests, cuts): (Vec<[u8; 32]>, Vec<Option<Cuts>>) = rayon::join(
            || new.par_chunks(PIECE).with_min_len(256).map(score).collect(),
            || {
                methods
                    .par_iter()
                    .map(|&(chunking, method, at)| {
                        (method == Method::Direct).then(|| {
                            let from = (at - base) as usize;
                            direct_cuts(chunking, &buffer[from..], last)
                                .into_iter()
                                .map(|r| r.start + from..r.end + from)
                                .collect()
                        })
                    })
                    .collect()
            },
        );
        // 2. Keys of every chunk.
        let flat = digests.as_flattened();
        let new_len = new.len();
        let chunks: Vec<WindowChunks> = self
            .states
            .par_iter()
            .zip(cuts)
            .map(|(state, cuts)| match (state.method, cuts) {
                (Method::Pieces { per_chunk }, _) => {
                    let size = per_chunk * PIECE;
                    let keys: Vec<u128> = if per_chunk == 1 {
                        digests.par_iter().map(short_key).collect()
                    } else {
                        flat.par_chunks(per_chunk * 32)
                            .with_min_len(64)
                            .map(|d| short_key(&score(d)))
                            .collect()
                    };
                    let lens = (0..keys.len())
                        .map(|i| (new_len - i * size).min(size) as u32)
                        .collect();
                    WindowChunks {
                        lens,
                        keys,
                        ranges: Vec::new(),
                    }
                }
                (Method::Direct, cuts) => {
                    let ranges = cuts.unwrap_or_default();
                    let keys = ranges
                        .par_iter()
                        .with_min_len(4)
                        .map(|r| short_key(&score(&buffer[r.clone()])))
                        .collect();
                    let lens = ranges.iter().map(|r| r.len() as u32).collect();
                    WindowChunks { lens, keys, ranges }
                }
            })
            .collect();
        for ((state, at), window) in self.states.iter().zip(cut_to.iter_mut()).zip(&chunks) {
            if state.method == Method::Direct {
                *at = window.ranges.last().map_or(*at, |r| base + r.end as u64);
            } else {
                *at = end;
            }
        }
        blocks.extend_from_slice(&chunks[self.block_state].keys);
        // 3. Look every chunk up in its chunking's index; remember the primary CDC chunking's
        //    new chunks.
        let primary = self.primary_cdc;
        let new_primary: Vec<Vec<Range<usize>>> = self
            .states
            .par_iter_mut()
            .zip(&chunks)
            .enumerate()
            .map(|(i, (state, window))| {
                let want_new = Some(i) == primary;
                let mut fresh = Vec::new();
                let counts = &mut state.counts[snap];
                let cdc = state.chunking.is_cdc();
                for (j, (&len, &key)) in window.lens.iter().zip(&window.keys).enumerate() {
                    let len = u64::from(len);
                    counts.chunks += 1;
                    counts.bytes += len;
                    if cdc {
                        let bucket = &mut state.histogram[len.max(1).ilog2() as usize];
                        bucket.0 += 1;
                        bucket.1 += len;
                    }
                    if state.seen.insert(key) {
                        counts.new_chunks += 1;
                        counts.new_bytes += len;
                        if want_new {
                            fresh.push(window.ranges[j].clone());
                        }
                    }
                }
                fresh
            })
            .collect();
        // 4. Compress the new chunks of the primary CDC chunking at every level.
        if let Some(p) = primary {
            let levels = &self.options.compression_levels;
            let zero = || vec![Stored::default(); levels.len()];
            let sums = new_primary[p]
                .par_iter()
                .map(|r| {
                    let chunk = &buffer[r.clone()];
                    levels
                        .iter()
                        .map(|&level| {
                            let codec = Compression::Zstd { level };
                            match codec.compressed_len(chunk) {
                                Some(n) => Stored {
                                    bytes: n as u64,
                                    compressed_chunks: 1,
                                },
                                None => Stored {
                                    bytes: chunk.len() as u64,
                                    compressed_chunks: 0,
                                },
                            }
                        })
                        .collect::<Vec<_>>()
                })
                .reduce(zero, |a, b| {
                    a.iter()
                        .zip(&b)
                        .map(|(x, y)| Stored {
                            bytes: x.bytes + y.bytes,
                            compressed_chunks: x.compressed_chunks + y.compressed_chunks,
                        })
                        .collect()
                });
            for (total, add) in self.stored.iter_mut().zip(sums) {
                total.bytes += add.bytes;
                total.compressed_chunks += add.compressed_chunks;
            }
        }
    }

    fn chunking_reports(&self) -> Vec<ChunkingReport> {
        self.states
            .iter()
            .filter(|s| s.reported)
            .map(|state| {
                let mut cumulative = Counts::default();
                let snapshots = (0..self.snapshots)
                    .map(|i| {
                        let c = state.counts[i];
                        cumulative.chunks += c.chunks;
                        cumulative.bytes += c.bytes;
                        cumulative.new_chunks += c.new_chunks;
                        cumulative.new_bytes += c.new_bytes;
                        ChunkingSnapshot {
                            index: i + 1,
                            chunks: c.chunks,
                            bytes: c.bytes,
                            new_chunks: c.new_chunks,
                            new_bytes: c.new_bytes,
                            duplicate_chunks: c.chunks - c.new_chunks,
                            duplicate_bytes: c.bytes - c.new_bytes,
                            cumulative_chunks: cumulative.chunks,
                            cumulative_bytes: cumulative.bytes,
                            cumulative_unique_chunks: cumulative.new_chunks,
                            cumulative_unique_bytes: cumulative.new_bytes,
                            cumulative_duplicate_chunks: cumulative.chunks - cumulative.new_chunks,
                            cumulative_duplicate_bytes: cumulative.bytes - cumulative.new_bytes,
                            cumulative_dedup_ratio: ratio(cumulative.bytes, cumulative.new_bytes),
                        }
                    })
                    .collect();
                let size_histogram = state.chunking.is_cdc().then(|| {
                    let used: Vec<usize> = (0..64).filter(|&b| state.histogram[b].0 > 0).collect();
                    match (used.first(), used.last()) {
                        (Some(&lo), Some(&hi)) => (lo..=hi)
                            .map(|b| SizeBucket {
                                min_bytes: 1 << b,
                                max_bytes: (1u64 << b).saturating_mul(2) - 1,
                                chunks: state.histogram[b].0,
                                bytes: state.histogram[b].1,
                            })
                            .collect(),
                        _ => Vec::new(),
                    }
                });
                ChunkingReport {
                    spec: state.chunking.to_string(),
                    chunks: cumulative.chunks,
                    unique_chunks: cumulative.new_chunks,
                    total_bytes: cumulative.bytes,
                    unique_bytes: cumulative.new_bytes,
                    duplicate_bytes: cumulative.bytes - cumulative.new_bytes,
                    dedup_ratio: ratio(cumulative.bytes, cumulative.new_bytes),
                    snapshots,
                    size_histogram,
                }
            })
            .collect()
    }

    fn compression_report(&self, total_bytes: u64) -> Option<CompressionReport> {
        let state = &self.states[self.primary_cdc?];
        let unique_chunks = state.counts.iter().map(|c| c.new_chunks).sum();
        let unique_bytes = state.counts.iter().map(|c| c.new_bytes).sum();
        let codecs = self
            .options
            .compression_levels
            .iter()
            .zip(&self.stored)
            .map(|(&level, stored)| CodecReport {
                codec: Compression::Zstd { level }.to_string(),
                stored_bytes: stored.bytes,
                compressed_chunks: stored.compressed_chunks,
                compression_ratio: ratio(unique_bytes, stored.bytes),
                dedup_compression_ratio: ratio(total_bytes, stored.bytes),
            })
            .collect();
        Some(CompressionReport {
            chunking: state.chunking.to_string(),
            unique_chunks,
            unique_bytes,
            codecs,
        })
    }
}

/// Cut points of a Direct chunking over `data` (which starts at one of its cut points):
/// all chunks that are final. Before the end of the file, a chunk that reaches the end of
/// `data` may be cut short by the window rather than by the content: it is left for the
/// next window, with more data after it.
fn direct_cuts(chunking: Chunking, data: &[u8], last: bool) -> Vec<Range<usize>> {
    match chunking {
        Chunking::Fixed { size } => {
            let size = size as usize;
            let whole = if last {
                data.len().div_ceil(size)
            } else {
                data.len() / size
            };
            (0..whole)
                .map(|i| i * size..((i + 1) * size).min(data.len()))
                .collect()
        }
        Chunking::Cdc { min, avg, max } => {
            let mut cuts: Vec<Range<usize>> = FastCDC::new(data, min, avg, max)
                .map(|c| c.offset..c.offset + c.length)
                .collect();
            if !last && cuts.last().is_some_and(|r| r.end == data.len()) {
                cuts.pop();
            }
            cuts
        }
    }
}

/// Reads the next window (up to `window` bytes, fewer only at the end of the file) into
/// `buf` after its first `reserve` bytes.
fn read_window(
    reader: &mut File,
    buf: &mut Vec<u8>,
    reserve: usize,
    window: usize,
) -> io::Result<()> {
    if buf.len() < reserve {
        buf.resize(reserve, 0);
    }
    buf.truncate(reserve);
    reader
        .by_ref()
        .take(window as u64)
        .read_to_end(buf)
        .map(|_| ())
}

/// `whole / part`, 1.0 when there is nothing.
fn ratio(whole: u64, part: u64) -> f64 {
    if part == 0 {
        1.0
    } else {
        whole as f64 / part as f64
    }
}

// ---------------------------------------------------------------------------------------
// Text report

/// Decimal size with two decimals: `512 B`, `12.35 kB`, `245.12 MB`, `1.26 GB`.
pub fn format_decimal(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (unit, scale) in UNITS {
        if bytes as f64 >= scale {
            return format!("{:.2} {unit}", bytes as f64 / scale);
        }
    }
    format!("{bytes} B")
}

/// A table: the first `left` columns left-aligned, the rest right-aligned.
struct Table {
    left: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(left: usize, header: &[&str]) -> Table {
        Table {
            left,
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, out: &mut String) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::from(" ");
            for (c, cell) in row.iter().enumerate() {
                line.push(' ');
                let pad = widths[c].saturating_sub(cell.chars().count());
                if c < self.left {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
                line.push(' ');
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn percent(fraction: Option<f64>) -> String {
    fraction.map_or_else(|| "-".to_string(), |f| format!("{:.2} %", f * 100.0))
}

impl Report {
    /// The human-readable report `cascade analyze` prints.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "{} snapshot{}, {} file{}, {} in all. Sizes are decimal (1 MB = 10^6 bytes); \
ratio = bytes before / bytes after.\n",
            self.snapshots.len(),
            if self.snapshots.len() == 1 { "" } else { "s" },
            self.files,
            if self.files == 1 { "" } else { "s" },
            format_decimal(self.total_bytes)
        ));

        out.push_str("\nSnapshots (same offset: 4 KiB blocks identical to the previous snapshot's block at the same offset of the same file)\n");
        let mut table = Table::new(
            2,
            &["#", "path", "files", "size", "4KiB blocks", "same offset"],
        );
        for s in &self.snapshots {
            table.row(vec![
                s.index.to_string(),
                s.path.clone(),
                s.files.to_string(),
                format_decimal(s.bytes),
                s.blocks_4k.to_string(),
                percent(s.same_offset_fraction_4k),
            ]);
        }
        table.render(&mut out);

        out.push_str(
            "\nDedup over the series (unique: chunks stored once; ratio = total / unique)\n",
        );
        let mut table = Table::new(
            1,
            &[
                "chunking",
                "chunks",
                "unique chunks",
                "total",
                "unique",
                "ratio",
            ],
        );
        for c in &self.chunkings {
            table.row(vec![
                c.spec.clone(),
                c.chunks.to_string(),
                c.unique_chunks.to_string(),
                format_decimal(c.total_bytes),
                format_decimal(c.unique_bytes),
                format!("{:.2}", c.dedup_ratio),
            ]);
        }
        table.render(&mut out);

        if let Some(comp) = &self.compression {
            out.push_str(&format!(
                "\nCompression of the {} unique chunks of {} ({}); a chunk is kept compressed \
only if that saves at least 1/8 of it\n",
                comp.unique_chunks,
                comp.chunking,
                format_decimal(comp.unique_bytes)
            ));
            let mut table = Table::new(
                1,
                &[
                    "codec",
                    "stored",
                    "chunks compressed",
                    "ratio",
                    "dedup+compression ratio",
                ],
            );
            for codec in &comp.codecs {
                table.row(vec![
                    codec.codec.clone(),
                    format_decimal(codec.stored_bytes),
                    codec.compressed_chunks.to_string(),
                    format!("{:.2}", codec.compression_ratio),
                    format!("{:.2}", codec.dedup_compression_ratio),
                ]);
            }
            table.render(&mut out);
        }

        out.push_str(
            "\nPer snapshot: new chunks (first seen there) and duplicates (seen before in the \
series or earlier in the snapshot), cumulative\n",
        );
        for c in &self.chunkings {
            out.push_str(&format!("  {}\n", c.spec));
            let mut table = Table::new(
                0,
                &[
                    "#",
                    "chunks",
                    "new",
                    "duplicate",
                    "new bytes",
                    "duplicate bytes",
                    "cum. unique",
                    "cum. duplicate",
                    "cum. total",
                    "cum. ratio",
                ],
            );
            for s in &c.snapshots {
                table.row(vec![
                    s.index.to_string(),
                    s.chunks.to_string(),
                    s.new_chunks.to_string(),
                    s.duplicate_chunks.to_string(),
                    format_decimal(s.new_bytes),
                    format_decimal(s.duplicate_bytes),
                    format_decimal(s.cumulative_unique_bytes),
                    format_decimal(s.cumulative_duplicate_bytes),
                    format_decimal(s.cumulative_bytes),
                    format!("{:.2}", s.cumulative_dedup_ratio),
                ]);
            }
            let mut text = String::new();
            table.render(&mut text);
            for line in text.lines() {
                out.push_str("  ");
                out.push_str(line);
                out.push('\n');
            }
        }

        for c in &self.chunkings {
            let Some(histogram) = &c.size_histogram else {
                continue;
            };
            out.push_str(&format!(
                "\nCDC chunk sizes, {} (all {} chunks, power-of-two buckets)\n",
                c.spec, c.chunks
            ));
            let mut table = Table::new(
                1,
                &["size (from, below)", "chunks", "% of chunks", "% of bytes"],
            );
            for b in histogram.iter().filter(|b| b.chunks > 0) {
                table.row(vec![
                    format!(
                        "{} - {}",
                        format_size(b.min_bytes),
                        format_size(b.max_bytes + 1)
                    ),
                    b.chunks.to_string(),
                    format!("{:.1}", pct(b.chunks, c.chunks)),
                    format!("{:.1}", pct(b.bytes, c.total_bytes)),
                ]);
            }
            table.render(&mut out);
        }

        out.push_str(&format!(
            "\nAnalysed {} in {:.2} s: {:.0} MB/s on {} thread{}.\n",
            format_decimal(self.total_bytes),
            self.elapsed_seconds,
            self.throughput_mb_per_s,
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        ));
        out
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}
