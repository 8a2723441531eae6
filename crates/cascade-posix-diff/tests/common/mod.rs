//! Shared helpers of the harness's tests: fresh directories on tmpfs, running the binary
//! with a time limit, and reading its summary line.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cascade;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use cascade_testkit::output_within;

pub const DIFF: &str = env!("CARGO_BIN_EXE_cascade-posix-diff");

/// Any single run of the harness must finish within this (a debug build on a loaded machine
/// does a few thousand ops in well under a second per seed).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A fresh temporary directory on tmpfs (/dev/shm), removed when dropped.
pub fn shm_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("posix-diff-test-")
        .tempdir_in("/dev/shm")
        .expect("a temporary directory in /dev/shm")
}

/// Side A and side B: two not-yet-existing directories inside a fresh tmpfs directory (the
/// harness creates them, with the same mode).
pub struct Sides {
    pub tmp: tempfile::TempDir,
    pub a: PathBuf,
    pub b: PathBuf,
}

pub fn sides() -> Sides {
    let tmp = shm_tempdir();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    Sides { tmp, a, b }
}

/// `cascade-posix-diff --seed S --ops N --a A --b B EXTRA...`
pub fn diff_command(seed: u64, ops: u64, a: &Path, b: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(DIFF);
    cmd.args(["--seed", &seed.to_string(), "--ops", &ops.to_string()])
        .arg("--a")
        .arg(a)
        .arg("--b")
        .arg(b)
        .args(extra);
    cmd
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The counts of a summary field such as `errno={EBADF=3,ENOENT=40}`.
pub fn summary_counts(summary: &str, field: &str) -> BTreeMap<String, u64> {
    let start = summary
        .find(&format!("{field}={{"))
        .unwrap_or_else(|| panic!("no {field}= in the summary: {summary}"))
        + field.len()
        + 2;
    let end = start + summary[start..].find('}').expect("closing brace");
    summary[start..end]
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_string(), v.parse().expect("a count"))
        })
        .collect()
}

/// The op number of a mismatch report ("at op #N"), or 0 for "before the first op".
pub fn mismatch_op(report: &str) -> u64 {
    if report.contains("before the first op") {
        return 0;
    }
    let at = report.find("at op #").expect("an op number in the report") + "at op #".len();
    report[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("an op number in the report")
}
