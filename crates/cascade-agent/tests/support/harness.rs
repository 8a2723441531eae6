//! Harness of tests/faults.rs: the `cascade` binary, a node store of its own per test, child
//! processes that are always killed (and reaped) when a test ends, a versitygw server that can
//! be stopped and restarted on the same port and data directory, and polling with deadlines.
//!
//! The `cascade` binary: a test of cascade-agent cannot use `CARGO_BIN_EXE_cascade` (that is
//! another package's binary), so [`cascade_bin`] runs `cargo build -p cascade-cli -p
//! cascade-preload` once per test binary, with the cargo that runs the tests ($CARGO), into the
//! target directory and profile this test executable was built in (it lives in
//! `<target>/<profile>/deps/`), and uses `<target>/<profile>/cascade`, which finds
//! libcascade.so next to itself.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cascade_store::{OpenOptions, Prefault, Store, StoreConfig};

use crate::versitygw::{find_versitygw, free_port, ACCESS, SECRET};

/// The tests kill processes at observed moments and measure waits: they run one at a time,
/// whatever --test-threads says, so they do not steal each other's two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The start of a test: the serial lock and the `cascade` binary (built first, so a test's
/// time does not include the build).
pub fn begin() -> (MutexGuard<'static, ()>, Instant) {
    let guard = serial();
    cascade_bin();
    (guard, Instant::now())
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the CLI and the preload library (once) and returns the `cascade` executable.
pub fn cascade_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        // <target>/<profile>/deps/faults-<hash>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test executable outside <target>/<profile>/deps")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debug")
            .to_string();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-p", "cascade-cli", "-p", "cascade-preload"])
            .env("CARGO_TARGET_DIR", &target_dir)
            .current_dir(repo_root());
        // Cargo's per-package variables of this test would leak into build scripts (ring's
        // reruns when CARGO_MANIFEST_DIR changes) and make every later build start over.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("CARGO_MANIFEST")
                || k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_CRATE")
                || k == "CARGO_PRIMARY_PACKAGE"
            {
                build.env_remove(&*k);
            }
        }
        match profile.as_str() {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        let out = build.output().expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p cascade-cli -p cascade-preload failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = profile_dir.join("cascade");
        assert!(bin.is_file(), "{} was not built", bin.display());
        assert!(
            profile_dir.join("libcascade.so").is_file(),
            "libcascade.so was not built in {}",
            profile_dir.display()
        );
        bin
    })
}

/// Polls `cond` until it holds, failing the test after `timeout` with `what`.
pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// Polls `cond` until it holds (true) or `timeout` passes (false), for callers that add
/// their own diagnostics to the failure.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

pub fn b3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// A finished command: status and its output as text.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
    /// Non-empty stderr lines.
    pub fn err_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {:.2} s\n--- stdout:\n{}--- stderr:\n{}",
            self.status, self.seconds, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to the end, killing it after `timeout` (a hang is a failure, not a stuck test).
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Out {
    let started = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let readers = [stdout.map(read_all_thread), stderr.map(read_all_thread)];
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output: Output = match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = rx.recv();
            panic!("{cmd:?} did not finish within {timeout:?}");
        }
    };
    // Bounded: a descendant that outlived the command (an orphaned job) may hold the pipes.
    let [o, e] = readers.map(|r| {
        r.and_then(|rx| rx.recv_timeout(Duration::from_secs(5)).ok())
            .unwrap_or_else(|| "(output still held open by a descendant)\n".to_string())
    });
    Out {
        status: output.status,
        stdout: o,
        stderr: e,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn read_all_thread<R: std::io::Read + Send + 'static>(
    mut r: R,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        let _ = tx.send(String::from_utf8_lossy(&s).into_owned());
    });
    rx
}

/// A background process (an agent, a writer) whose stderr lines are collected as they come;
/// killed with SIGKILL and reaped on drop.
pub struct Daemon {
    child: Option<Child>,
    pub what: String,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    pub fn spawn(mut cmd: Command, what: &str) -> Daemon {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Daemon {
            child: Some(child),
            what: what.to_string(),
            lines,
            reader: Some(reader),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn log(&self) -> String {
        self.lines().join("\n")
    }

    /// Waits for a stderr line that satisfies `pred` and returns it.
    pub fn wait_line(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                return l;
            }
            if let Some(status) = self.try_wait() {
                // It may have printed the line just before exiting.
                self.drain_stderr();
                if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                    return l;
                }
                panic!(
                    "{} exited ({status}) before printing {what}; its stderr:\n{}",
                    self.what,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {} to print {what}; its stderr:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// After the exit: lets the reader collect what is left in the pipe. Bounded, because a
    /// child of the process (a job orphaned by `cascade run`) may hold the pipe open.
    fn drain_stderr(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.reader.as_ref().is_some_and(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.reader.as_ref().is_some_and(|r| r.is_finished()) {
            if let Some(r) = self.reader.take() {
                let _ = r.join();
            }
        }
    }

    /// The exit status if it has exited (reaped).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn alive(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        self.wait(Duration::from_secs(30))
    }

    /// SIGTERM, then reap (SIGKILL after `timeout`, failing the test).
    pub fn term(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }

    /// Waits for the exit (SIGKILL and a failure after `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                self.drain_stderr();
                return status;
            }
            if Instant::now() >= deadline {
                self.signal(libc::SIGKILL);
                let _ = self.child.as_mut().map(|c| c.wait());
                panic!(
                    "{} did not exit within {timeout:?}; its stderr:\n{}",
                    self.what,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
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

    /// `cascade` with a clean environment: this store, an empty config file, and no
    /// CASCADE_* / AWS_* variables or LD_PRELOAD inherited from the test's environment.
    pub fn cli(&self) -> Command {
        let mut cmd = Command::new(cascade_bin());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CASCADE_") || k.starts_with("AWS_") || k == "LD_PRELOAD" {
                cmd.env_remove(k);
            }
        }
        cmd.env("CASCADE_CONFIG", &self.config)
            .env("CASCADE_STORE", &self.name)
            .current_dir(self.tmp.path());
        if std::env::var_os("CASCADE_FAULTS_BLOCK_SIGPIPE").is_some() {
            // Diagnosis only: run `cascade` with SIGPIPE blocked, which works around the agent
            // dying of SIGPIPE when an S3 server goes away (see faults.rs, test 3), to see
            // what the rest of a test finds.
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

    /// Runs `cascade ARGS` with `envs` (at most 120 s).
    pub fn cascade(&self, args: &[&str], envs: &[(&str, &str)]) -> Out {
        let mut cmd = self.cli();
        cmd.args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        run_with_timeout(cmd, Duration::from_secs(120))
    }

    /// Like [`Env::cascade`], asserting success.
    pub fn cascade_ok(&self, args: &[&str], envs: &[(&str, &str)]) -> Out {
        let out = self.cascade(args, envs);
        assert!(out.ok(), "cascade {args:?} failed: {out}");
        out
    }

    /// `cascade agent --durable URL -v` in the background, once it has registered (its
    /// "cascade agent: store ..." line).
    pub fn agent(&self, url: &str, envs: &[(&str, &str)]) -> Daemon {
        let mut cmd = self.cli();
        cmd.args(["agent", "--durable", url, "-v"]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut d = Daemon::spawn(cmd, "cascade agent");
        d.wait_line("its start line", Duration::from_secs(30), |l| {
            l.starts_with("cascade agent: store ")
        });
        d
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

    pub fn read(&self, path: &str) -> Vec<u8> {
        let f = self
            .store()
            .open(path, &OpenOptions::new().read(true))
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
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
}

impl Drop for Env {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
    }
}

/// The line of `cascade ls --levels` output for `path` (a file, or a directory with its "/").
pub fn levels_line<'a>(levels: &'a str, path: &str) -> Option<&'a str> {
    levels
        .lines()
        .find(|l| l.split_whitespace().last() == Some(path))
}

/// A versitygw S3 server (posix backend) on 127.0.0.1 that can be stopped and restarted on
/// the same port and data directory; killed on drop.
pub struct Gw {
    child: Option<Child>,
    pub port: u16,
    /// One directory per bucket, objects as plain files.
    pub root: PathBuf,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Gw {
    pub fn start() -> Gw {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let mut gw = Gw {
            child: None,
            port: free_port(),
            root,
            log: tmp.path().join("versitygw.log"),
            _tmp: tmp,
        };
        gw.restart();
        gw
    }

    /// Starts the server (again) on its port and data directory; returns once it listens.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "versitygw is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new(find_versitygw())
            .args(["--port", &format!("127.0.0.1:{}", self.port)])
            .args(["--access", ACCESS, "--secret", SECRET, "--quiet"])
            .arg("posix")
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn versitygw");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "versitygw exited with {status}: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "versitygw did not listen on {} within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the server (SIGKILL: connections in flight are cut) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir(self.root.join(name)).expect("create bucket");
    }

    pub fn url(&self, bucket: &str) -> String {
        self.url_with(bucket, ACCESS, SECRET)
    }

    pub fn url_with(&self, bucket: &str, access: &str, secret: &str) -> String {
        format!(
            "s3://{bucket}?endpoint=http://127.0.0.1:{}&access_key={access}&secret_key={secret}",
            self.port
        )
    }

    /// Whether object `key` of `bucket` exists (looked up in the data directory).
    pub fn has(&self, bucket: &str, key: &str) -> bool {
        self.root.join(bucket).join(key).is_file()
    }

    /// Parts of unfinished multipart uploads in `bucket` (versitygw's posix backend keeps
    /// them as files below `<bucket>/.sgwtmp/multipart/` until the upload completes).
    pub fn multipart_parts(&self, bucket: &str) -> usize {
        fn count(dir: &Path) -> usize {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => count(&e.path()),
                    Ok(t) if t.is_file() => 1,
                    _ => 0,
                })
                .sum()
        }
        count(&self.root.join(bucket).join(".sgwtmp/multipart"))
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A staging server, `cascade stage-server -v`, on 127.0.0.1 (tests/staging.rs): started on
/// any free port (the one it reports is kept), killed and restarted on the same port and
/// arena directory, its status read with the shared secret over one kept connection.
pub struct StageServer {
    pub daemon: Daemon,
    /// 127.0.0.1:PORT
    pub addr: String,
    pub dir: PathBuf,
    pub drain_to: String,
    secret: String,
    extra: Vec<String>,
    /// Stderr lines of earlier incarnations (before a kill or restart).
    earlier: Vec<String>,
    conn: Mutex<Option<cascade_staging::Connection>>,
}

impl StageServer {
    /// Starts a server with arenas in `dir` draining to `drain_to`, requiring `secret`;
    /// `extra` are more arguments (`--ssd-capacity 32MiB`). Returns once it listens.
    pub fn start(
        env: &Env,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        extra: &[&str],
    ) -> StageServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let daemon = Self::spawn(env, "127.0.0.1:0", dir, drain_to, secret, &extra);
        let line = daemon
            .lines()
            .into_iter()
            .find(|l| l.contains("listening on"))
            .unwrap_or_default();
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in the start line {line:?}"))
            .to_string();
        StageServer {
            daemon,
            addr,
            dir: dir.to_path_buf(),
            drain_to: drain_to.to_string(),
            secret: secret.to_string(),
            extra,
            earlier: Vec::new(),
            conn: Mutex::new(None),
        }
    }

    fn spawn(
        env: &Env,
        listen: &str,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        extra: &[String],
    ) -> Daemon {
        let mut cmd = env.cli();
        cmd.args([
            "stage-server",
            "-v",
            "--listen",
            listen,
            "--drain-to",
            drain_to,
        ])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .env("CASCADE_STAGING_SECRET", secret);
        let mut d = Daemon::spawn(
            cmd,
            &format!("cascade stage-server (dir {})", dir.display()),
        );
        d.wait_line("its start line", Duration::from_secs(30), |l| {
            l.starts_with("cascade stage-server: listening on ")
        });
        d
    }

    /// The start line of the running incarnation ("... recovered: N file(s) ...").
    pub fn start_line(&self) -> String {
        self.daemon
            .lines()
            .into_iter()
            .find(|l| l.starts_with("cascade stage-server: listening on "))
            .unwrap_or_default()
    }

    /// SIGKILL (the arenas and index stay as the crash left them), then reap.
    pub fn kill9(&mut self) -> ExitStatus {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.daemon.kill9()
    }

    /// Starts the server again on the same port and directory, draining to `drain_to`
    /// (after [`StageServer::kill9`], or killing the running one first).
    pub fn restart(&mut self, env: &Env, drain_to: &str) {
        if self.daemon.alive() {
            self.kill9();
        }
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let d = Self::spawn(
            env,
            &self.addr,
            &self.dir,
            drain_to,
            &self.secret,
            &self.extra,
        );
        let old = std::mem::replace(&mut self.daemon, d);
        self.earlier.extend(old.lines());
        self.earlier.push("--- restarted ---".to_string());
        self.drain_to = drain_to.to_string();
    }

    /// Every stderr line of every incarnation.
    pub fn log(&self) -> String {
        let mut all = self.earlier.clone();
        all.extend(self.daemon.lines());
        all.join("\n")
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut cascade_staging::Connection) -> cascade_staging::Result<T>,
    ) -> cascade_staging::Result<T> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if conn.is_none() {
            let mut opts = cascade_staging::ClientOptions::new(&self.secret);
            opts.connect_timeout = Duration::from_secs(2);
            opts.io_timeout = Duration::from_secs(30);
            *conn = Some(cascade_staging::Connection::connect(&self.addr, &opts)?);
        }
        let result = f(conn.as_mut().expect("connected"));
        if result.is_err() {
            *conn = None;
        }
        result
    }

    /// The server's status (its Status reply), or the error reaching it.
    pub fn try_status(&self) -> cascade_staging::Result<cascade_staging::ServerStatus> {
        self.with_conn(|c| c.status())
    }

    pub fn status(&self) -> cascade_staging::ServerStatus {
        self.try_status()
            .unwrap_or_else(|e| panic!("status of {}: {e}\nits stderr:\n{}", self.addr, self.log()))
    }

    /// What the server holds of `key` (a file's durable name): level, stamp, size, BLAKE3.
    pub fn pull_file(&self, key: &str) -> cascade_staging::protocol::PullState {
        self.with_conn(|c| c.pull(&[(cascade_staging::protocol::PullKind::File, key)]))
            .unwrap_or_else(|e| panic!("pull {key} from {}: {e}", self.addr))
            .remove(0)
    }
}

/// A tmpfs mounted on a directory of the test (a small, really full SSD); unmounted on drop.
/// Needs root (the tests run as root in CI).
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` ("64m") on `dir` (created); the reason if that is not possible.
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there (a server being killed) does not keep
        // the mount around.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

pub const MIB: usize = 1 << 20;

/// The bytes and BLAKE3 of one file of a checkpoint (`rel` relative to it).
pub struct Expected {
    pub rel: String,
    pub data: Vec<u8>,
    pub blake3: String,
}

pub fn expected(rel: &str, data: Vec<u8>) -> Expected {
    Expected {
        rel: rel.to_string(),
        blake3: b3(&data),
        data,
    }
}

/// Stops an agent with SIGTERM and reaps it. It must exit by itself or die of that SIGTERM:
/// the latter is a bug of its own, checked by `agent_stops_cleanly_on_sigterm` (faults.rs),
/// and not what the other tests are about.
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

/// The checkpoint `ckpt` in `durable` is complete, its marker lists exactly `files` with
/// their sizes and BLAKE3, every object downloads to the expected bytes and every `.blake3`
/// object matches.
pub fn assert_durable_checkpoint(
    durable: &cascade_durable::DurableStore,
    ckpt: &str,
    files: &[&Expected],
) {
    let marker = durable
        .read_marker(ckpt)
        .unwrap_or_else(|e| panic!("read the marker of {ckpt}: {e}"))
        .unwrap_or_else(|| panic!("{ckpt} has no completion marker in {}", durable.name()));
    let mut listed: Vec<(String, u64, String)> = marker
        .files
        .iter()
        .map(|f| (f.path.clone(), f.size, f.blake3.clone()))
        .collect();
    listed.sort();
    let mut want: Vec<(String, u64, String)> = files
        .iter()
        .map(|f| (f.rel.clone(), f.data.len() as u64, f.blake3.clone()))
        .collect();
    want.sort();
    assert_eq!(listed, want, "the marker of {ckpt} lists the wrong files");
    let bytes: u64 = files.iter().map(|f| f.data.len() as u64).sum();
    assert_eq!(marker.total_bytes, bytes, "{ckpt}: marker total");
    for f in files {
        let key = format!("{ckpt}/{}", f.rel);
        let got = durable
            .get_bytes(&key)
            .unwrap_or_else(|e| panic!("download {key}: {e}"));
        assert!(
            got.len() == f.data.len() && got[..] == f.data[..],
            "{key}: the durable bytes differ from the original ({} bytes, BLAKE3 {}, want {} bytes, {})",
            got.len(),
            b3(&got),
            f.data.len(),
            f.blake3
        );
        assert_eq!(
            durable
                .recorded_checksum(&key)
                .unwrap_or_else(|e| panic!("{key}.blake3: {e}")),
            f.blake3,
            "{key}.blake3"
        );
    }
    durable
        .verify_checkpoint(ckpt)
        .unwrap_or_else(|e| panic!("verify_checkpoint {ckpt}: {e}"));
}

/// Removes a directory when dropped (the mount prefix `cascade run` creates on the host).
pub struct RemoveDir(pub String);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}
