//! The quick checkpoint series of bench/datasets/make.sh, made by real programs (a PyTorch
//! training loop, a numpy simulation, LAMMPS).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build::repo_root;

/// Makes the quick `series` in `dir` (CI installs python3-torch, python3-numpy and lammps).
pub fn make_quick(dir: &Path, series: &[&str]) {
    let make = repo_root().join("bench/datasets/make.sh");
    let out = Command::new("bash")
        .arg(&make)
        .arg("--quick")
        .arg(dir)
        .args(series)
        .output()
        .expect("run bench/datasets/make.sh");
    assert!(
        out.status.success(),
        "make.sh --quick {series:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The snapshot directories (`snap-NN`) of series `name` in `dir`, in order.
pub fn snapshots(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(dir.join(name))
        .expect("series directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("snap-"))
        })
        .collect();
    snaps.sort();
    snaps
}
