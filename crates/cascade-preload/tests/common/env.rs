//! The environment of the real-program tests: a store, its own mount prefix and scratch
//! directory, and programs run under `cascade run`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use cascade_store::{OpenOptions, Prefault, Store, StoreConfig};

use super::cascade_bin;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A store, a mount prefix and a scratch directory of its own; all removed on drop.
pub struct Env {
    store: Option<Store>,
    pub name: String,
    pub mount: String,
    pub tmp: PathBuf,
}

impl Env {
    /// The store's memory is not faulted in at creation.
    pub fn new() -> Env {
        Env::with_prefault(Prefault::Off)
    }

    pub fn with_prefault(prefault: Prefault) -> Env {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("/cascade-prog-{pid}-{n}");
        let store = Store::create(&StoreConfig {
            name: name.clone(),
            capacity: 256 << 20,
            chunk_size: 64 << 10,
            max_files: 4096,
            spill: None,
            prefault,
        })
        .expect("create store");
        let tmp = std::env::temp_dir().join(format!("cascade-prog-{pid}-{n}"));
        std::fs::create_dir_all(&tmp).expect("scratch dir");
        Env {
            store: Some(store),
            name,
            mount: format!("/cascade-prog-{pid}-{n}"),
            tmp,
        }
    }

    pub fn store(&self) -> &Store {
        self.store.as_ref().expect("store")
    }

    /// Runs `prog args` under `cascade run` on this store and mount, in the scratch dir; $M
    /// is the mount, $T the scratch dir.
    pub fn command(&self, prog: &str, args: &[&str]) -> Output {
        self.cascade_run(prog, args)
            .output()
            .unwrap_or_else(|e| panic!("spawn {prog}: {e}"))
    }

    /// The `cascade run` command of [`Env::command`], to spawn or adjust before running.
    pub fn cascade_run(&self, prog: &str, args: &[&str]) -> Command {
        let empty_config = self.tmp.join("config.toml");
        std::fs::write(&empty_config, "").expect("config file");
        let mut command = Command::new(cascade_bin());
        command
            .args([
                "run",
                "--store",
                &self.name,
                "--mount",
                &self.mount,
                "--",
                prog,
            ])
            .args(args)
            .env("CASCADE_CONFIG", &empty_config)
            .env_remove("LD_PRELOAD")
            .env("M", &self.mount)
            .env("T", &self.tmp)
            .current_dir(&self.tmp);
        command
    }

    /// Like `command`, asserting success; returns stdout.
    pub fn run(&self, prog: &str, args: &[&str]) -> String {
        let out = self.command(prog, args);
        assert!(
            out.status.success(),
            "{prog} {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `script` with /bin/sh; $M is the mount, $T the scratch dir.
    pub fn sh(&self, script: &str) -> Output {
        self.command("/bin/sh", &["-c", script])
    }

    /// Runs `script` with /bin/sh under the library, asserting success; returns stdout.
    pub fn ok(&self, script: &str) -> String {
        self.run("/bin/sh", &["-c", script])
    }

    /// `cascade ARGS` on this store (not under `cascade run`), asserting success; stdout.
    pub fn cascade(&self, args: &[&str]) -> String {
        let config = self.tmp.join("config.toml");
        std::fs::write(&config, "").expect("config file");
        let out = Command::new(cascade_bin())
            .args(args)
            .env("CASCADE_STORE", &self.name)
            .env("CASCADE_CONFIG", &config)
            .env_remove("CASCADE_DURABLE")
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap_or_else(|e| panic!("run cascade {args:?}: {e}"));
        assert!(
            out.status.success(),
            "cascade {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn read_store(&self, path: &str) -> Vec<u8> {
        let f = self
            .store()
            .open(path, &OpenOptions::new())
            .unwrap_or_else(|e| panic!("open {path} in the store: {e}"));
        let mut v = vec![0; f.len().expect("len") as usize];
        assert_eq!(f.read_at(&mut v, 0).expect("read"), v.len());
        v
    }

    /// Overwrites bytes of a store file through the store's API (not through the library).
    pub fn corrupt_store(&self, path: &str, offset: u64, bytes: &[u8]) {
        let f = self
            .store()
            .open(path, &OpenOptions::new().write(true))
            .unwrap_or_else(|e| panic!("open {path} in the store: {e}"));
        assert_eq!(f.write_at(bytes, offset).expect("write"), bytes.len());
    }

    pub fn mkdir_store(&self, path: &str) {
        self.store().mkdir(path, 0o755).expect("mkdir in the store");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
        let _ = std::fs::remove_dir_all(&self.tmp);
        // `cascade run` creates the mount prefix as an empty host directory.
        let _ = std::fs::remove_dir(&self.mount);
    }
}
