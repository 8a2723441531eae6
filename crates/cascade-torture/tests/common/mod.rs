//! Shared helpers of the torture integration tests: stores that are destroyed even when a
//! test fails, child processes that are killed when a test fails, bounded waits, a client for
//! `cascade-torture serve`, and the post-crash store check.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

use cascade_store::{FsckReport, Prefault, SpillConfig, Store, StoreConfig};
use cascade_torture::{check_tree, TreeSummary};

#[allow(unused_imports)] // each test binary uses a different subset
pub use cascade_testkit::{read_store_file as read_all, wait_output};

pub const TORTURE: &str = env!("CARGO_BIN_EXE_cascade-torture");

/// How long any single child process or reply may take before the test fails.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// A unique store name: /cascade-test-<pid>-<n>-<tag>.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "/cascade-test-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A store destroyed (with its spill directory) when dropped, even if the test panics.
/// Fields drop in order: the handle first (destroy refuses a store a live process is
/// attached to, this one included), then the guard destroys the store.
pub struct TestStore {
    pub name: String,
    pub store: Store,
    _guard: DestroyOnDrop,
}

pub struct Params {
    pub capacity: u64,
    pub chunk_size: u64,
    pub max_files: u32,
    /// Bytes of spill file (None: no spill file).
    pub spill: Option<u64>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            capacity: 16 << 20,
            chunk_size: 4096,
            max_files: 1024,
            spill: None,
        }
    }
}

pub fn spill_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name.trim_start_matches('/'))
}

pub fn config(name: &str, p: &Params) -> StoreConfig {
    StoreConfig {
        name: name.to_string(),
        capacity: p.capacity,
        chunk_size: p.chunk_size,
        max_files: p.max_files,
        spill: p.spill.map(|size| SpillConfig {
            path: spill_dir(name).join("spill"),
            size,
        }),
        prefault: Prefault::Off,
    }
}

impl TestStore {
    pub fn create(tag: &str, p: Params) -> TestStore {
        let name = unique_name(tag);
        std::fs::create_dir_all(spill_dir(&name)).unwrap();
        let guard = DestroyOnDrop(name.clone());
        let store = Store::create(&config(&name, &p)).unwrap();
        TestStore {
            name,
            store,
            _guard: guard,
        }
    }
}

/// Child processes killed (SIGKILL) and reaped when dropped, so a failing test leaves none.
#[derive(Default)]
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `cascade-torture --store NAME ARGS...`
pub fn torture(store: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(TORTURE);
    cmd.arg("--store").arg(store).args(args);
    cmd
}

pub fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn killed_by_sigkill(status: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGKILL)
}

/// A `cascade-torture serve` child driven line by line through pipes.
pub struct Server {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub pid: u32,
}

impl Server {
    pub fn spawn(store: &str) -> Server {
        let mut child = torture(store, &["serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let pid = child.id();
        Server {
            child: Some(child),
            stdin,
            lines,
            pid,
        }
    }

    /// Sends a command without waiting for its reply.
    pub fn send(&mut self, cmd: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next reply line (fails the test after CHILD_TIMEOUT or if the server died).
    pub fn reply(&mut self) -> String {
        match self.lines.recv_timeout(CHILD_TIMEOUT) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => panic!("server {} did not answer in time", self.pid),
            Err(RecvTimeoutError::Disconnected) => panic!("server {} died", self.pid),
        }
    }

    /// Sends a command and returns its reply.
    pub fn call(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.reply()
    }

    /// Sends a command and asserts the reply starts with "ok".
    pub fn ok(&mut self, cmd: &str) -> String {
        let r = self.call(cmd);
        assert!(r.starts_with("ok"), "server {}: `{cmd}` -> `{r}`", self.pid);
        r
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            let status = c.wait().unwrap();
            assert!(killed_by_sigkill(&status), "{status}");
        }
    }

    /// Asks the server to exit and waits for it.
    pub fn exit(&mut self) {
        self.ok("exit");
        self.stdin = None;
        if let Some(c) = self.child.take() {
            let out = wait_output(c, CHILD_TIMEOUT).unwrap();
            assert!(out.status.success(), "{}", describe(&out));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The accounting identities between fsck's walk and the store's status:
/// used + free + leased = capacity, and the used and leased bytes agree.
pub fn assert_accounting(store: &Store, report: &FsckReport) {
    let st = store.status();
    let cs = st.chunk_size;
    let total = (st.memory_capacity + st.spill_capacity) / cs;
    assert_eq!(
        report.chunks_used + report.chunks_free + report.chunks_leased,
        total,
        "used + free + leased != capacity: {report:?} vs {st:?}"
    );
    assert_eq!(
        report.chunks_used * cs,
        st.memory_used + st.spill_used,
        "{report:?} vs {st:?}"
    );
    assert_eq!(
        report.chunks_leased * cs,
        st.leased_bytes,
        "{report:?} vs {st:?}"
    );
    assert_eq!(
        (report.files, report.dirs),
        (st.files, st.dirs),
        "{report:?} vs {st:?}"
    );
}

/// After writers were killed: fsck must find no errors (warnings about leftovers are
/// expected); repair; a second fsck must be spotless; the accounting must add up; every file
/// must pass the content check and the files' chunks must be exactly the used chunks.
pub fn check_after_crash(store: &Store, max_file_size: u64) -> (FsckReport, TreeSummary) {
    let first = store.fsck(false).unwrap();
    assert!(
        first.is_clean(),
        "fsck found corruption: {:?}",
        first.errors
    );
    let repaired = store.fsck(true).unwrap();
    assert!(repaired.is_clean(), "fsck --repair: {:?}", repaired.errors);
    let second = store.fsck(false).unwrap();
    assert!(
        second.is_clean() && second.warnings.is_empty(),
        "after repair: {second:?} (repair said {:?})",
        repaired.repaired
    );
    assert_accounting(store, &second);
    let summary = match check_tree(store, "/", max_file_size) {
        Ok(s) => s,
        Err(problems) => panic!("content check failed:\n{}", problems.join("\n")),
    };
    let st = store.status();
    assert_eq!(
        (summary.files, summary.dirs),
        (st.files, st.dirs),
        "{summary:?} vs {st:?}"
    );
    assert_eq!(
        summary.allocated_bytes,
        st.memory_used + st.spill_used,
        "the files' chunks are not the used chunks: {summary:?} vs {st:?}"
    );
    (first, summary)
}

/// Destroys a store (and removes its spill directory) when dropped. Declare it before any
/// handle to the store (locals drop in reverse order): destroy refuses an attached store.
pub struct DestroyOnDrop(pub String);

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        if let Err(e) = Store::destroy(&self.0) {
            if e.errno() != libc::ENOENT {
                eprintln!("warning: could not destroy test store {}: {e}", self.0);
            }
        }
        let _ = std::fs::remove_dir_all(spill_dir(&self.0));
    }
}

/// Creates a store, drops the creating handle, and returns the guard: nothing is attached.
pub fn create_detached(tag: &str, p: Params) -> DestroyOnDrop {
    let name = unique_name(tag);
    std::fs::create_dir_all(spill_dir(&name)).unwrap();
    let guard = DestroyOnDrop(name.clone());
    drop(Store::create(&config(&name, &p)).unwrap());
    guard
}
