//! (a) The harness against itself: both sides plain tmpfs directories. Every seed must pass
//! (no false alarms: the comparisons are right and the run is deterministic), the same seed
//! must replay the same calls and results, and the generated calls must actually reach the
//! error cases the test exists for.

mod common;

use std::collections::BTreeMap;
use std::process::Output;

use common::*;

const SEEDS: [u64; 6] = [1, 2, 3, 0xdead_beef, 424_242, u64::MAX];
const OPS: u64 = 3000;

/// Runs the seeds side by side (separate processes); returns each one's output.
fn run_seeds(seeds: &[u64], ops: u64, extra: &[&str]) -> Vec<(u64, Sides, Output)> {
    let runs: Vec<_> = seeds
        .iter()
        .map(|&seed| {
            let s = sides();
            let cmd = diff_command(seed, ops, &s.a, &s.b, extra);
            (
                seed,
                s,
                std::thread::spawn(move || output_within(cmd, RUN_TIMEOUT)),
            )
        })
        .collect();
    runs.into_iter()
        .map(|(seed, s, handle)| (seed, s, handle.join().expect("runner thread")))
        .collect()
}

fn assert_passed(seed: u64, out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "seed {seed}: tmpfs vs tmpfs must agree, got {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let summary = stdout.lines().last().expect("a summary line").to_string();
    assert!(
        summary.starts_with(&format!("cascade-posix-diff: ok seed={seed} ")),
        "{summary}"
    );
    summary
}

#[test]
fn tmpfs_against_tmpfs_agrees_and_reaches_the_error_cases() {
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    let mut errnos: BTreeMap<String, u64> = BTreeMap::new();
    for (seed, _sides, out) in run_seeds(&SEEDS, OPS, &[]) {
        let summary = assert_passed(seed, &out);
        let seed_calls = summary_counts(&summary, "calls");
        let total: u64 = seed_calls.values().sum();
        // The final closes of still-open slots are counted as ops too.
        assert!(
            (OPS..=OPS + 8).contains(&total),
            "seed {seed}: {total} calls: {summary}"
        );
        assert!(summary.contains(&format!(" ops={total} ")), "{summary}");
        let checks: u64 = summary
            .split(" tree_checks=")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("tree_checks in the summary");
        assert_eq!(checks, 1 + OPS / 100 + 1, "{summary}");
        for (k, v) in seed_calls {
            *calls.entry(k).or_default() += v;
        }
        for (k, v) in summary_counts(&summary, "errno") {
            *errnos.entry(k).or_default() += v;
        }
    }
    eprintln!("calls over all seeds: {calls:?}");
    eprintln!("errnos over all seeds: {errnos:?}");
    for call in [
        "open",
        "openat",
        "close",
        "read",
        "pread",
        "readv",
        "write",
        "pwrite",
        "writev",
        "lseek",
        "ftruncate",
        "truncate",
        "fstat",
        "stat",
        "lstat",
        "rename",
        "unlink",
        "mkdir",
        "rmdir",
        "opendir",
        "fdopendir",
        "dup",
        "dup2",
        "fsync",
        "access",
    ] {
        assert!(
            calls.get(call).copied().unwrap_or(0) > 0,
            "{call} never made: {calls:?}"
        );
    }
    // Each of these must come up repeatedly, or the name space is not colliding enough.
    for errno in [
        "ENOENT",
        "EEXIST",
        "ENOTEMPTY",
        "EISDIR",
        "ENOTDIR",
        "EBADF",
        "EINVAL",
        "ENAMETOOLONG",
    ] {
        let n = errnos.get(errno).copied().unwrap_or(0);
        assert!(n >= 5, "{errno} seen {n} times only: {errnos:?}");
    }
}

#[test]
fn plain_paths_agree_too_and_never_overflow_a_name() {
    for (seed, _sides, out) in run_seeds(&[7, 8], 2000, &["--no-quirks", "--check-every", "0"]) {
        let summary = assert_passed(seed, &out);
        let errnos = summary_counts(&summary, "errno");
        assert!(!errnos.contains_key("ENAMETOOLONG"), "{summary}");
        assert!(summary.contains(" tree_checks=2 "), "{summary}");
    }
}

#[test]
fn the_same_seed_replays_the_same_calls_and_results() {
    let traces: Vec<String> = run_seeds(&[99, 99, 100], 1500, &["--trace"])
        .into_iter()
        .map(|(seed, _sides, out)| {
            assert_passed(seed, &out);
            text(&out.stdout)
        })
        .collect();
    let ops = traces[0].lines().filter(|l| l.starts_with('#')).count();
    assert!(ops >= 1500, "the trace has {ops} ops");
    assert_eq!(traces[0], traces[1], "seed 99 ran differently twice");
    assert_ne!(traces[0], traces[2], "seeds 99 and 100 ran the same calls");
}

/// The libc level (`--level libc`) against itself: every seed agrees, every call is made,
/// and the error cases come up.
#[test]
fn libc_level_tmpfs_against_tmpfs_agrees_and_reaches_every_call() {
    const LIBC_OPS: u64 = 400;
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    let mut errnos: BTreeMap<String, u64> = BTreeMap::new();
    for (seed, _sides, out) in run_seeds(&SEEDS, LIBC_OPS, &["--level", "libc"]) {
        let summary = assert_passed(seed, &out);
        assert!(summary.contains(&format!(" ops={LIBC_OPS} ")), "{summary}");
        assert!(
            !summary.contains("intended="),
            "tmpfs against tmpfs needs no intended difference: {summary}"
        );
        for (k, v) in summary_counts(&summary, "calls") {
            *calls.entry(k).or_default() += v;
        }
        for (k, v) in summary_counts(&summary, "errno") {
            *errnos.entry(k).or_default() += v;
        }
    }
    eprintln!("libc calls over all seeds: {calls:?}");
    eprintln!("libc errnos over all seeds: {errnos:?}");
    for call in [
        "mkstemp",
        "mkostemp",
        "mkstemps",
        "mkdtemp",
        "glob",
        "nftw",
        "ftw",
        "scandir",
        "fts",
        "spawn_addopen_append",
        "spawn_addopen_stdin",
        "spawn_addchdir",
        "script_spawn",
        "script_system",
        "remove",
        "lockf",
        "mkfifo",
        "mknod_fifo",
        "mknod_reg",
        "fork_write_exit",
        "fork_write__exit",
    ] {
        assert!(
            calls.get(call).copied().unwrap_or(0) >= 3,
            "{call} made fewer than 3 times: {calls:?}"
        );
    }
    for errno in [
        "ENOENT",
        "ENOTDIR",
        "EEXIST",
        "EISDIR",
        "ENOTEMPTY",
        "EACCES",
    ] {
        let n = errnos.get(errno).copied().unwrap_or(0);
        assert!(n >= 2, "{errno} seen {n} times only: {errnos:?}");
    }
}

#[test]
fn libc_level_replays_the_same_calls_and_results() {
    let traces: Vec<String> = run_seeds(&[41, 41, 42], 300, &["--level", "libc", "--trace"])
        .into_iter()
        .map(|(seed, _sides, out)| {
            assert_passed(seed, &out);
            text(&out.stdout)
        })
        .collect();
    assert!(traces[0].lines().filter(|l| l.starts_with('#')).count() >= 300);
    assert_eq!(traces[0], traces[1], "seed 41 ran differently twice");
    assert_ne!(traces[0], traces[2], "seeds 41 and 42 ran the same calls");
}
