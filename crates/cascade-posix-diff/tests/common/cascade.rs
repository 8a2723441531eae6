//! Running the harness under `cascade run` (side A under the mount prefix, side B on tmpfs),
//! shared by the POSIX-level and libc-level tests against Cascade.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{output_within, shm_tempdir, text, DIFF, RUN_TIMEOUT};

/// The default mount prefix of `cascade run`.
pub const MOUNT: &str = "/cascade";

/// The `cascade` binary and libcascade.so of this test's profile (built once, by the
/// cargo that runs the test, so `cargo test -p cascade-posix-diff` is enough).
pub fn artifacts() -> (PathBuf, PathBuf) {
    (
        cascade_testkit::cascade_bin().to_path_buf(),
        cascade_testkit::preload_library().to_path_buf(),
    )
}

/// `name` from the environment as a comma-separated list of u64s, or `default`.
pub fn seeds_from_env(name: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(name) {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: comma-separated u64s, got {list:?}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// `name` from the environment as a number, or `default`.
pub fn number_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: a number, got {v:?}"))
        })
        .unwrap_or(default)
}

/// A store of the test's own, destroyed (with everything the runs left in it) on drop.
pub struct TestStore {
    cascade: PathBuf,
    pub name: String,
}

impl TestStore {
    pub fn new(cascade: &Path, tag: &str) -> TestStore {
        TestStore {
            cascade: cascade.to_path_buf(),
            name: format!("/cascade-posix-diff-{}-{tag}", std::process::id()),
        }
    }

    /// `cascade ARGS...` on this store.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.cascade);
        cmd.env("CASCADE_STORE", &self.name)
            .env("CASCADE_CAPACITY", "512MiB")
            .env_remove("CASCADE_MOUNT")
            .env_remove("CASCADE_DURABLE")
            .env_remove("LD_PRELOAD");
        cmd
    }

    /// `cascade ARGS` on this store, asserting success; its stdout.
    pub fn cascade_ok(&self, args: &[&str]) -> String {
        let mut cmd = self.command();
        cmd.args(args);
        let out = output_within(cmd, RUN_TIMEOUT);
        assert!(
            out.status.success(),
            "`cascade {}` on {} failed: {}",
            args.join(" "),
            self.name,
            text(&out.stderr)
        );
        text(&out.stdout)
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["destroy", "--force"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs the harness under `cascade run` on `store` for every seed (side A
/// `/cascade/diff-<pid>-<tag>-<seed>`); panics with the report on the first mismatch.
/// Returns side A's trees as store paths.
pub fn cascade_vs_tmpfs(
    store: &TestStore,
    tag: &str,
    seeds: &[u64],
    ops: u64,
    extra: &[&str],
) -> Vec<String> {
    let (_, lib) = artifacts();
    let mut trees = Vec::new();
    for &seed in seeds {
        let a = format!("{MOUNT}/diff-{}-{tag}-{seed}", std::process::id());
        let tmp = shm_tempdir();
        let b = tmp.path().join("b");
        let mut cmd = store.command();
        // The kernel's cwd is a scratch directory: a relative mkstemp that escapes the
        // store's virtual cwd lands there, not in the source tree.
        cmd.current_dir(tmp.path())
            .args(["run", "--", DIFF])
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
        let store_path = a
            .strip_prefix(MOUNT)
            .expect("a is under the mount prefix")
            .to_string();
        store.cascade_ok(&["ls", &store_path]);
        trees.push(store_path);
    }
    trees
}
