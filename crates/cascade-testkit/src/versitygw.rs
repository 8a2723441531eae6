//! A real versitygw S3 server (posix backend) on 127.0.0.1. scripts/test.sh installs
//! versitygw; it is found through $VERSITYGW, $PATH, $GOBIN, $(go env GOPATH)/bin or
//! ~/go/bin.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait::poll;

/// The access key every server here accepts.
pub const ACCESS: &str = "cascadetestkey";
/// The secret key every server here accepts.
pub const SECRET: &str = "cascadetestsecret0123456789";

/// How long a server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The versitygw executable; fails the test when there is none.
pub fn find_versitygw() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("VERSITYGW") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("versitygw")));
    }
    if let Some(gobin) = std::env::var_os("GOBIN") {
        candidates.push(PathBuf::from(gobin).join("versitygw"));
    }
    if let Ok(out) = Command::new("go").args(["env", "GOPATH"]).output() {
        let gopath = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !gopath.is_empty() {
            candidates.push(Path::new(&gopath).join("bin/versitygw"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join("go/bin/versitygw"));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .expect("versitygw not found: run scripts/test.sh, which installs it with go install")
}

/// The durable-store URL of `bucket` on an S3 endpoint at `127.0.0.1:port`.
fn url_at(port: u16, bucket: &str, access: &str, secret: &str) -> String {
    format!(
        "s3://{bucket}?endpoint=http://127.0.0.1:{port}&access_key={access}&secret_key={secret}"
    )
}

/// A TCP port of 127.0.0.1 that was free a moment ago (bound and released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address").port()
}

/// A versitygw server on 127.0.0.1 serving [`Versitygw::root`] (one directory per bucket,
/// objects as plain files). It can be stopped and restarted on the same port and data
/// directory; killed on drop.
pub struct Versitygw {
    child: Option<Child>,
    pub port: u16,
    /// The directory it serves: one subdirectory per bucket, objects as plain files.
    pub root: PathBuf,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Versitygw {
    /// Starts a server on a free port; returns once it listens.
    pub fn start() -> Versitygw {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let mut gw = Versitygw {
            child: None,
            port: free_port(),
            root,
            log: tmp.path().join("versitygw.log"),
            _tmp: tmp,
        };
        gw.restart();
        gw
    }

    /// Starts the server (again) on its port and data directory; returns once it listens
    /// (a TCP connect succeeds), failing early if it exits.
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
        let child = self.child.insert(child);
        let port = self.port;
        let ready = poll(START_TIMEOUT, || {
            if let Some(status) = child.try_wait().ok().flatten() {
                return Some(Err(status));
            }
            TcpStream::connect(("127.0.0.1", port)).ok().map(|_| Ok(()))
        });
        let failure = match ready {
            Some(Ok(())) => return,
            Some(Err(status)) => format!("versitygw exited with {status}"),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                format!("versitygw did not listen on {port} within {START_TIMEOUT:?}")
            }
        };
        self.child = None;
        panic!(
            "{failure}: {}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Kills the server (SIGKILL: connections in flight are cut) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Creates a bucket. With the posix backend a bucket is a top-level directory of the
    /// root, so making the directory is how an administrator creates one.
    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir(self.root.join(name)).expect("create bucket");
    }

    /// The durable-store URL of `bucket_and_prefix` ("bucket" or "bucket/some/prefix") with
    /// the test access key and `secret`.
    pub fn spec(&self, bucket_and_prefix: &str, secret: &str) -> String {
        self.url_with(bucket_and_prefix, ACCESS, secret)
    }

    /// The durable-store URL of `bucket` with the test keys.
    pub fn url(&self, bucket: &str) -> String {
        self.url_with(bucket, ACCESS, SECRET)
    }

    /// The durable-store URL of `bucket` with the keys given.
    pub fn url_with(&self, bucket: &str, access: &str, secret: &str) -> String {
        url_at(self.port, bucket, access, secret)
    }

    /// [`Versitygw::spec`] reached through another port of 127.0.0.1 (a proxy in front of
    /// the server, [`crate::CuttingProxy`]).
    pub fn spec_via(&self, port: u16, bucket_and_prefix: &str, secret: &str) -> String {
        url_at(port, bucket_and_prefix, ACCESS, secret)
    }

    /// The directory `bucket`'s objects are files in (the posix backend's data directory).
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.root.join(bucket)
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

impl Drop for Versitygw {
    fn drop(&mut self) {
        self.stop();
    }
}
