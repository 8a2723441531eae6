//! A store of the test's own, an empty config file and a HOME in a temporary directory, and
//! the real `cascade` binary run against them with nothing inherited from the environment.

use std::path::Path;
use std::process::{Command, Output};

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub store: String,
}

impl Sandbox {
    /// One store per sandbox (`/cascade-TAG-test-PID-N`): the tests of a binary run in
    /// parallel.
    pub fn new(tag: &str) -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("empty.toml"), "").expect("config file");
        Sandbox {
            store: format!(
                "/cascade-{tag}-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            dir,
        }
    }

    /// `cascade ARGS` in the sandbox, not started yet.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(CASCADE);
        c.args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("CASCADE_STORE", &self.store)
            .env("CASCADE_CONFIG", self.dir.path().join("empty.toml"))
            .env("CASCADE_SPILL_PATH", self.dir.path().join("store.spill"));
        c
    }

    /// `cascade init` of a small store in memory only (64 KiB chunks, 64 files, no spill,
    /// no prefault) of `capacity`.
    #[allow(dead_code)] // each test binary compiles this module; not all of them use this
    pub fn init_small(&self, capacity: &str) {
        self.ok(&[
            "init",
            "--capacity",
            capacity,
            "--chunk-size",
            "64KiB",
            "--max-files",
            "64",
            "--spill-size",
            "0",
            "--prefault",
            "off",
        ]);
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run cascade")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "cascade {args:?} failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Must fail with `code` and exactly one line on stderr; returns it.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "cascade {args:?}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "one line from {args:?}: {stderr}"
        );
        stderr
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.run(&["destroy", "--force"]);
    }
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}
