//! A node of the tests: a store of the test's own, a scratch directory, an empty config file,
//! and the real `cascade` binary (commands, agents) run against them with nothing inherited
//! from the test's environment.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cascade_store::{OpenOptions, Prefault, Store, StoreConfig};

use crate::build::cascade_bin;
use crate::process::{run_with_timeout, Daemon, Out};

/// How long one `cascade` command, or a daemon's start, may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Tests that kill processes at observed moments and measure waits take this lock: they run
/// one at a time, whatever --test-threads says, so they do not steal each other's cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The start of such a test: the serial lock and the `cascade` binary (built first, so a
/// test's time does not include the build).
pub fn begin() -> (MutexGuard<'static, ()>, Instant) {
    let guard = serial();
    cascade_bin();
    (guard, Instant::now())
}

/// `cascade` with a clean environment: no CASCADE_* / AWS_* variables or LD_PRELOAD
/// inherited from the test's.
pub fn cascade_command() -> Command {
    let mut cmd = Command::new(cascade_bin());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CASCADE_") || k.starts_with("AWS_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    if std::env::var_os("CASCADE_FAULTS_BLOCK_SIGPIPE").is_some() {
        // Diagnosis only: run `cascade` with SIGPIPE blocked, which works around the agent
        // dying of SIGPIPE when an S3 server goes away (see cascade-agent's faults.rs, test
        // 3), to see what the rest of a test finds.
        use std::os::unix::process::CommandExt;
        // SAFETY: runs in the forked child before exec; sigprocmask is async-signal-safe
        // and the set is a local.
        unsafe {
            cmd.pre_exec(|| {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGPIPE);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
    }
    cmd
}

/// A node store of the test's own (`/cascade-faults-<test>-<pid>`), a scratch directory and
/// an empty config file; the store is destroyed when the test ends, pass or fail.
pub struct Env {
    pub name: String,
    pub tmp: tempfile::TempDir,
    config: PathBuf,
    store: Option<Store>,
}

impl Env {
    /// A store of `capacity` bytes in 1 MiB chunks, no spill, no prefault.
    pub fn new(test: &str, capacity: u64) -> Env {
        let name = format!("/cascade-faults-{test}-{}", std::process::id());
        let _ = Store::destroy_forced(&name);
        let store = Store::create(&StoreConfig {
            name: name.clone(),
            capacity,
            chunk_size: 1 << 20,
            max_files: 1024,
            spill: None,
            prefault: Prefault::Off,
        })
        .unwrap_or_else(|e| panic!("create store {name}: {e}"));
        Env::with(name, Some(store))
    }

    /// A name of the test's own with no store behind it (destroyed at the end if one appears).
    pub fn without_store(test: &str) -> Env {
        let name = format!("/cascade-faults-{test}-{}", std::process::id());
        let _ = Store::destroy_forced(&name);
        Env::with(name, None)
    }

    /// An environment for the store `name` (destroyed on drop), `store` its open handle.
    pub fn with(name: String, store: Option<Store>) -> Env {
        let tmp = tempfile::tempdir().expect("tempdir");
        let config = tmp.path().join("config.toml");
        std::fs::write(&config, "").expect("config file");
        Env {
            name,
            tmp,
            config,
            store,
        }
    }

    pub fn store(&self) -> &Store {
        self.store.as_ref().expect("store")
    }

    /// The running agent's uploads in flight (its STATUS reply), empty if none answers.
    pub fn uploads_in_flight(&self) -> Vec<String> {
        cascade_agent::status(&self.name)
            .map(|s| s.uploading)
            .unwrap_or_default()
    }

    /// The agent is uploading `path` right now.
    pub fn uploading(&self, path: &str) -> bool {
        self.uploads_in_flight().iter().any(|p| p == path)
    }

    /// The agent is uploading something right now.
    pub fn uploading_any(&self) -> bool {
        !self.uploads_in_flight().is_empty()
    }

    /// [`cascade_command`] on this store and the empty config file, in the scratch
    /// directory.
    pub fn cli(&self) -> Command {
        let mut cmd = cascade_command();
        cmd.env("CASCADE_CONFIG", &self.config)
            .env("CASCADE_STORE", &self.name)
            .current_dir(self.tmp.path());
        cmd
    }

    /// Runs `cascade ARGS` with `envs` (at most 120 s).
    pub fn cascade(&self, args: &[&str], envs: &[(&str, &str)]) -> Out {
        let mut cmd = self.cli();
        cmd.args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        run_with_timeout(cmd, COMMAND_TIMEOUT)
    }

    /// Like [`Env::cascade`], asserting success.
    pub fn cascade_ok(&self, args: &[&str], envs: &[(&str, &str)]) -> Out {
        let out = self.cascade(args, envs);
        assert!(out.ok(), "cascade {args:?} failed: {out}");
        out
    }

    /// `cascade agent --durable URL -v` in the background, once it is ready: it has
    /// registered with the store and printed its "cascade agent: store ..." line.
    pub fn agent(&self, url: &str, envs: &[(&str, &str)]) -> Daemon {
        let mut cmd = self.cli();
        cmd.args(["agent", "--durable", url, "-v"]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut d = Daemon::spawn(cmd, "cascade agent");
        d.wait_line("its start line", START_TIMEOUT, |l| {
            l.starts_with("cascade agent: store ")
        });
        d
    }

    /// Like [`Env::cascade`], with the environment as owned pairs (as the job tests build it).
    pub fn cascade_env(&self, args: &[&str], vars: &[(String, String)]) -> Out {
        let envs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.cascade(args, &envs)
    }

    /// A durable directory of the test's own (`<tmp>/durable`) and the environment of a job
    /// draining to it: a store of `capacity`, no spill, writers wait 30 s on a full store.
    pub fn durable_job(&self, capacity: &str) -> (PathBuf, Vec<(String, String)>) {
        let durable = self.tmp.path().join("durable");
        std::fs::create_dir_all(&durable).expect("durable dir");
        let vars = vec![
            ("CASCADE_CAPACITY".to_string(), capacity.to_string()),
            ("CASCADE_SPILL_SIZE".to_string(), "0".to_string()),
            ("CASCADE_DURABLE".to_string(), durable.display().to_string()),
            ("CASCADE_FULL_WAIT".to_string(), "30".to_string()),
        ];
        (durable, vars)
    }

    /// A `PATH` on which a job's shell finds the `cascade` under test (for `cascade commit`
    /// or `cascade ls` inside a job).
    pub fn cascade_on_path(&self) -> (String, String) {
        let bin = self.tmp.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let link = bin.join("cascade");
        if !link.exists() {
            std::os::unix::fs::symlink(cascade_bin(), &link).expect("symlink");
        }
        let path = std::env::var("PATH").unwrap_or_default();
        ("PATH".into(), format!("{}:{path}", bin.display()))
    }

    /// Runs `prog args` straight under the interposition library on this store (no
    /// `cascade run`: no agent, and nothing sweeps when it ends), at most 60 s.
    pub fn preloaded(&self, prog: &str, args: &[&str]) -> Out {
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env("LD_PRELOAD", crate::build::preload_library())
            .env("CASCADE_STORE", &self.name);
        run_with_timeout(cmd, Duration::from_secs(60))
    }

    /// `cascade ls --levels` (store part only: no durable store configured).
    pub fn levels(&self) -> String {
        self.cascade_ok(&["ls", "--levels"], &[]).stdout
    }

    /// Names in a store directory, as `cascade ls DIR` prints them.
    pub fn ls(&self, dir: &str) -> Vec<String> {
        self.cascade_ok(&["ls", dir], &[])
            .stdout
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Writes `data` as the whole file `path` of the store.
    pub fn write(&self, path: &str, data: &[u8]) {
        let f = self
            .store()
            .open(
                path,
                &OpenOptions::new().write(true).create(true).truncate(true),
            )
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        f.write_all_at(data, 0)
            .unwrap_or_else(|e| panic!("write {path}: {e}"));
    }

    /// The whole file `path` of the store.
    pub fn read(&self, path: &str) -> Vec<u8> {
        read_store_file(self.store(), path)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
    }
}

/// The whole file `path` of `store`, read through the store's API.
pub fn read_store_file(store: &Store, path: &str) -> Vec<u8> {
    let f = store
        .open(path, &OpenOptions::new().read(true))
        .unwrap_or_else(|e| panic!("open {path} in the store: {e}"));
    let len = f.len().expect("len") as usize;
    let mut v = vec![0u8; len];
    let mut off = 0;
    while off < len {
        let n = f.read_at(&mut v[off..], off as u64).expect("read");
        assert!(n > 0, "{path}: short read at {off} of {len}");
        off += n;
    }
    v
}

/// Writes the whole file `path` of `store` (parent directories created, truncated first)
/// and closes it: the close hands it to the agent.
pub fn write_store_file(store: &Store, path: &str, data: &[u8]) {
    if let Some(cut) = path.rfind('/').filter(|&c| c > 0) {
        store
            .create_dir_all(&path[..cut], 0o755)
            .unwrap_or_else(|e| panic!("mkdir -p {} in the store: {e}", &path[..cut]));
    }
    let opts = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644);
    let file = store
        .open(path, &opts)
        .unwrap_or_else(|e| panic!("open {path} for writing in the store: {e}"));
    file.write_all_at(data, 0)
        .unwrap_or_else(|e| panic!("write {path} in the store: {e}"));
}

/// The line of `cascade ls --levels` output for `path` (a file, or a directory with its "/").
pub fn levels_line<'a>(levels: &'a str, path: &str) -> Option<&'a str> {
    levels
        .lines()
        .find(|l| l.split_whitespace().last() == Some(path))
}

/// Stops an agent with SIGTERM and reaps it. It must exit by itself or die of that SIGTERM:
/// the latter is a bug of its own, checked by `agent_stops_cleanly_on_sigterm` (cascade-agent's
/// faults.rs), and not what the other tests are about.
pub fn stop_agent(agent: &mut Daemon) {
    let status = agent.term(Duration::from_secs(30));
    let died_of_term =
        std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGTERM);
    assert!(
        status.success() || died_of_term,
        "agent: {status}\n{}",
        agent.log()
    );
}
