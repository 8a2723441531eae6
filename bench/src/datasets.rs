//! The checkpoint series of bench/datasets (made by make.sh), as the dedup and dedup-link
//! suites read them: snapshots in order, each file with its size and BLAKE3.

use crate::util::{err, Context, Res};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One file of a snapshot, with the BLAKE3 of its bytes (computed by the parent, the
/// reference every restore is checked against).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SrcFile {
    /// Path inside the snapshot directory.
    pub rel: String,
    pub path: PathBuf,
    pub size: u64,
    pub blake3: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snap {
    /// "snap-00".
    pub name: String,
    pub files: Vec<SrcFile>,
}

impl Snap {
    pub(crate) fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A series as the report describes it.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesInfo {
    pub name: String,
    pub dir: PathBuf,
    pub snapshots: usize,
    pub files: usize,
    pub input_bytes: u64,
    pub bytes_per_snapshot: Vec<u64>,
    /// Reading and hashing the whole series once at the start (it also brings the series
    /// into the page cache): seconds.
    pub warm_s: f64,
}

pub(crate) struct Series {
    pub(crate) info: SeriesInfo,
    pub(crate) snaps: Vec<Snap>,
}

impl Series {
    pub(crate) fn input(&self) -> u64 {
        self.info.input_bytes
    }
    pub(crate) fn all_files(&self) -> Vec<PathBuf> {
        self.snaps
            .iter()
            .flat_map(|s| s.files.iter().map(|f| f.path.clone()))
            .collect()
    }
    pub(crate) fn snap_names(&self) -> Vec<String> {
        self.snaps.iter().map(|s| s.name.clone()).collect()
    }
}

/// Regular files under `dir`, recursively, as (path relative to `dir`, path), sorted.
fn walk_files(dir: &Path) -> Res<Vec<(String, PathBuf)>> {
    if !dir.is_dir() {
        return err(format!("{} is not a directory", dir.display()));
    }
    let files = cascade_testkit::files_below(dir)
        .into_iter()
        .filter(|p| p.is_file());
    let rel = |p: &Path| {
        p.strip_prefix(dir)
            .map(|r| r.to_string_lossy().into_owned())
    };
    Ok(files.map(|p| (rel(&p).unwrap_or_default(), p)).collect())
}

fn blake3_file(p: &Path) -> Res<(u64, String)> {
    let mut f = std::fs::File::open(p).ctx(|| format!("opening {}", p.display()))?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .ctx(|| format!("reading {}", p.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.finalize().to_hex().to_string()))
}

/// Scans `datasets/<name>/snap-*` and hashes every file.
pub(crate) fn load_series(datasets: &Path, name: &str) -> Res<Series> {
    let dir = datasets.join(name);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .ctx(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap-"))
        .collect();
    names.sort();
    if names.is_empty() {
        return err(format!("no snap-NN directories in {}", dir.display()));
    }
    let t = Instant::now();
    let mut snaps = Vec::new();
    for n in &names {
        let mut files = Vec::new();
        for (rel, path) in walk_files(&dir.join(n))? {
            let (size, b3) = blake3_file(&path)?;
            files.push(SrcFile {
                rel,
                path,
                size,
                blake3: b3,
            });
        }
        snaps.push(Snap {
            name: n.clone(),
            files,
        });
    }
    let warm_s = t.elapsed().as_secs_f64();
    let info = SeriesInfo {
        name: name.to_string(),
        dir,
        snapshots: snaps.len(),
        files: snaps.iter().map(|s| s.files.len()).sum(),
        input_bytes: snaps.iter().map(Snap::bytes).sum(),
        bytes_per_snapshot: snaps.iter().map(Snap::bytes).collect(),
        warm_s,
    };
    Ok(Series { info, snaps })
}
