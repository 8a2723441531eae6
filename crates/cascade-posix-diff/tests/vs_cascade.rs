//! (c) The real test: Cascade vs tmpfs. The harness runs under `cascade run` (LD_PRELOAD of
//! libcascade.so), side A under the mount prefix, side B in a tmpfs directory, and must
//! finish with no mismatch.
//!
//! It builds the `cascade` binary and `libcascade.so` of its own profile first (with the
//! cargo that runs it), so `cargo test -p cascade-posix-diff` is enough.
//!
//! `CASCADE_DIFF_SEEDS=1,2,3` and `CASCADE_DIFF_OPS=20000` change the seeds and the length
//! of each run; a failure prints the harness's report, whose seed replays it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The default mount prefix of `cascade run`.
const MOUNT: &str = "/cascade";

const DEFAULT_SEEDS: [u64; 6] = [1, 2, 3, 0xdead_beef, 424_242, u64::MAX];
const DEFAULT_OPS: u64 = 3000;

/// target/<profile>: this test binary is target/<profile>/deps/vs_cascade-<hash>.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-p", "cascade-cli", "-p", "cascade-preload"])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
        if profile_dir().ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p cascade-cli -p cascade-preload failed"
        );
    });
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build -p cascade-cli -p cascade-preload` \
         (same profile as this test)",
        path.display()
    );
    path
}

fn seeds() -> Vec<u64> {
    match std::env::var("CASCADE_DIFF_SEEDS") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("CASCADE_DIFF_SEEDS: comma-separated u64s")
            })
            .collect(),
        Err(_) => DEFAULT_SEEDS.to_vec(),
    }
}

fn ops() -> u64 {
    std::env::var("CASCADE_DIFF_OPS")
        .ok()
        .map(|v| v.parse().expect("CASCADE_DIFF_OPS: a number"))
        .unwrap_or(DEFAULT_OPS)
}

/// A store of this test's own, destroyed (with everything the runs left in it) on drop.
struct TestStore {
    cascade: PathBuf,
    name: String,
}

impl TestStore {
    fn new(cascade: &Path, tag: &str) -> TestStore {
        TestStore {
            cascade: cascade.to_path_buf(),
            name: format!("/cascade-posix-diff-{}-{tag}", std::process::id()),
        }
    }

    /// `cascade ARGS...` on this store.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.cascade);
        cmd.env("CASCADE_STORE", &self.name)
            .env("CASCADE_CAPACITY", "512MiB")
            .env_remove("CASCADE_MOUNT")
            .env_remove("LD_PRELOAD");
        cmd
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["destroy", "--force"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Runs the harness under `cascade run` for every seed; panics with the report on the
/// first mismatch.
fn cascade_vs_tmpfs(tag: &str, extra: &[&str]) {
    let cascade = built("cascade");
    let lib = built("libcascade.so");
    let store = TestStore::new(&cascade, tag);
    let ops = ops();
    for seed in seeds() {
        let a = format!("{MOUNT}/diff-{}-{tag}-{seed}", std::process::id());
        let tmp = shm_tempdir();
        let b = tmp.path().join("b");
        let mut cmd = store.command();
        cmd.args(["run", "--", DIFF])
            .args(["--seed", &seed.to_string(), "--ops", &ops.to_string()])
            .args(["--a", &a])
            .arg("--b")
            .arg(&b)
            .args(extra);
        let shown = format!("{cmd:?}");
        let out = output_within(cmd, RUN_TIMEOUT);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success()
                && stdout.contains(&format!("cascade-posix-diff: ok seed={seed} ")),
            "Cascade and tmpfs differ (or the run failed), seed {seed}, {:?}\n\
             command: {shown}\n(preload library: {})\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            lib.display(),
            text(&out.stderr)
        );
        eprintln!("{}", stdout.trim_end());

        // It really went through Cascade: nothing under the prefix on the real file system,
        // and the tree is in the store (mount prefix /cascade = store root).
        assert!(
            !Path::new(&a).exists(),
            "{a} exists on the real file system: the harness did not run under the preload \
             library"
        );
        let store_path = a.strip_prefix(MOUNT).expect("a is under the mount prefix");
        let ls = output_within(
            {
                let mut c = store.command();
                c.args(["ls", store_path]);
                c
            },
            RUN_TIMEOUT,
        );
        assert!(
            ls.status.success(),
            "`cascade ls {store_path}` failed: the run's tree is not in the store {}: {}",
            store.name,
            text(&ls.stderr)
        );
    }
}

#[test]
fn cascade_agrees_with_tmpfs_on_plain_paths() {
    cascade_vs_tmpfs("plain", &["--no-quirks"]);
}

#[test]
fn cascade_agrees_with_tmpfs_on_unusual_path_spellings() {
    // Trailing slashes, x/../y through files and missing directories, ./, //, 255- and
    // 256-byte names: where a lexical path normaliser and the kernel part ways.
    cascade_vs_tmpfs("quirks", &[]);
}
