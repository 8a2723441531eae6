//! What the integration tests of this crate share (`mod common;` in each): a staging server
//! run in-process on 127.0.0.1, in a temporary directory of its own.

// Each test file uses what it needs of this.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cascade_staging::client::OutSegment;
use cascade_staging::{
    ClientOptions, Connection, Server, ServerOptions, ServerResult, ServerStatus, Stopper,
};
use cascade_testkit::Daemon;

/// The cluster secret of the servers the tests start.
pub const SECRET: &str = "secret";

pub struct InProcessServer {
    pub addr: SocketAddr,
    /// The directory it drains to (`<dir>/durable`).
    pub durable: PathBuf,
    /// Its temporary directory: arenas in `arenas`, the durable store in `durable`.
    pub dir: tempfile::TempDir,
    stopper: Stopper,
    thread: Option<JoinHandle<ServerResult<()>>>,
}

impl InProcessServer {
    /// Binds a server with `buffers` receive buffers (17 MiB each, faulted in at bind: few
    /// keep tests light) and whatever else `tune` sets (it also gets the temporary
    /// directory), and runs it on a thread of its own.
    pub fn bind(buffers: usize, tune: impl FnOnce(&mut ServerOptions, &Path)) -> InProcessServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let durable = dir.path().join("durable");
        std::fs::create_dir_all(&durable).expect("durable directory");
        let mut opts = ServerOptions::new(
            "127.0.0.1:0",
            dir.path().join("arenas"),
            durable.to_str().expect("utf-8 path"),
            SECRET,
        );
        opts.buffers = buffers;
        tune(&mut opts, dir.path());
        let server = Server::bind(opts).expect("bind the server");
        let addr = server.local_addr();
        let stopper = server.stopper();
        let thread = std::thread::spawn(move || server.run());
        InProcessServer {
            addr,
            durable,
            dir,
            stopper,
            thread: Some(thread),
        }
    }

    /// Options of a client of `namespace` holding the cluster secret.
    pub fn options(&self, namespace: &str, io_timeout: Duration) -> ClientOptions {
        let mut o = ClientOptions::new(SECRET);
        o.namespace = namespace.to_string();
        o.io_timeout = io_timeout;
        o
    }

    /// A connected client of `namespace` holding the cluster secret.
    pub fn client(&self, namespace: &str, io_timeout: Duration) -> Connection {
        Connection::connect(&self.addr.to_string(), &self.options(namespace, io_timeout))
            .expect("connect a client")
    }

    /// Stops the server; its run must have ended without an error.
    pub fn stop(mut self) {
        self.stopper.stop();
        let thread = self.thread.take().expect("running");
        thread
            .join()
            .expect("the server thread panicked")
            .expect("the server failed");
    }
}

/// Polls `status` until `cond` holds; fails the test after `within`.
pub fn poll_status(
    what: &str,
    within: Duration,
    status: impl Fn() -> ServerStatus,
    cond: impl Fn(&ServerStatus) -> bool,
) -> ServerStatus {
    let start = Instant::now();
    loop {
        let s = status();
        if cond(&s) {
            return s;
        }
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A directory on the disk under /var/tmp (the arenas' usual kind of file system).
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").expect("a temporary directory in /var/tmp")
}

/// Every file of `files` drained into the durable directory `durable`, under `namespace`,
/// bit for bit.
pub fn assert_drained(namespace: &str, durable: &Path, files: &[(String, Vec<u8>)]) {
    for (k, d) in files {
        let p = durable.join(namespace).join(k);
        let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            got == *d,
            "{k}: {} bytes drained, {} sent, or other bytes",
            got.len(),
            d.len()
        );
    }
}

pub fn digest(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// One whole version of `key` in one Write frame, sealed with the connection's tag.
pub fn write_file(c: &mut Connection, key: &str, stamp: u64, data: &[u8]) {
    let seal = c.seal(key, stamp, data.len() as u64, digest(data));
    c.write(&[OutSegment {
        key,
        stamp,
        size: data.len() as u64,
        offset: 0,
        seal: Some(seal),
        data: &[data],
    }])
    .expect("write");
}

/// Sends pieces `pieces` of `data` (`piece` bytes each, one Write frame per piece) as
/// version 1 of `key`; the piece that ends the file seals it with `sealed` as its BLAKE3.
pub fn write_pieces(
    c: &mut Connection,
    key: &str,
    data: &[u8],
    piece: usize,
    pieces: std::ops::Range<usize>,
    sealed: [u8; 32],
) {
    for i in pieces {
        let chunk = &data[i * piece..((i + 1) * piece).min(data.len())];
        let last = (i + 1) * piece >= data.len();
        let seal = last.then(|| c.seal(key, 1, data.len() as u64, sealed));
        c.write(&[OutSegment {
            key,
            stamp: 1,
            size: data.len() as u64,
            offset: (i * piece) as u64,
            seal,
            data: &[chunk],
        }])
        .expect("write a piece");
    }
}

/// The environment a [`ServerProcess`] is started with: its arena directory and drain target.
const CHILD_DIR: &str = "CASCADE_STAGING_TEST_SERVER_DIR";
const CHILD_DRAIN: &str = "CASCADE_STAGING_TEST_SERVER_DRAIN";
/// The line before the server's address on its stderr.
const LISTENING: &str = "LISTENING ";

/// A staging server in its own process, so that it can be killed with SIGKILL: this test
/// binary run again as its test `child_server_process`, whose body is [`serve_in_child`].
/// Ready once it has printed its address.
pub struct ServerProcess {
    pub daemon: Daemon,
    pub addr: String,
}

impl ServerProcess {
    pub fn start(dir: &Path, drain_to: &Path, deadline: Duration) -> ServerProcess {
        let mut cmd = std::process::Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([
            "child_server_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env(CHILD_DRAIN, drain_to);
        let mut daemon = Daemon::spawn(cmd, "the server process");
        let line = daemon.wait_line("its address", deadline, |l| l.starts_with(LISTENING));
        let addr = line.trim_start_matches(LISTENING).trim().to_string();
        ServerProcess { daemon, addr }
    }

    pub fn connect(&self, namespace: &str, io_timeout: Duration) -> Connection {
        let mut o = ClientOptions::new(SECRET);
        o.namespace = namespace.to_string();
        o.io_timeout = io_timeout;
        Connection::connect(&self.addr, &o).expect("connect")
    }

    pub fn status(&self, namespace: &str, io_timeout: Duration) -> ServerStatus {
        let mut c = self.connect(namespace, io_timeout);
        let s = c.status().expect("status");
        c.goodbye();
        s
    }
}

/// The body of a test binary's `child_server_process` (not a test of its own): a server on
/// the directories [`ServerProcess::start`] passed, with 2 buffers, verbose, then `tune`d;
/// `announce` may print lines before its address. Run without those variables, as in every
/// `cargo test`, it returns at once.
pub fn serve_in_child(tune: impl FnOnce(&mut ServerOptions), announce: impl FnOnce(&Server)) {
    let (Some(dir), Some(drain)) = (std::env::var_os(CHILD_DIR), std::env::var_os(CHILD_DRAIN))
    else {
        return;
    };
    let mut opts = ServerOptions::new(
        "127.0.0.1:0",
        PathBuf::from(dir),
        drain.to_str().expect("utf-8 path"),
        SECRET,
    );
    opts.buffers = 2;
    opts.verbose = true;
    tune(&mut opts);
    let server = Server::bind(opts).expect("bind");
    announce(&server);
    // On stderr, after the recovery's lines: the parent reads them all from one pipe.
    eprintln!("{LISTENING}{}", server.local_addr());
    server.run().expect("run");
}
