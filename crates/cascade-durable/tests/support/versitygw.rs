//! A real versitygw S3 server on 127.0.0.1 for the S3 tests of cascade-durable and
//! cascade-agent (included by both with `#[path]`). scripts/test.sh installs versitygw; it
//! is found through $VERSITYGW, $PATH, $GOBIN, $(go env GOPATH)/bin or ~/go/bin.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS: &str = "cascadetestkey";
pub const SECRET: &str = "cascadetestsecret0123456789";

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

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A versitygw server on 127.0.0.1 serving `root` (one directory per bucket); killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    /// The directory it serves: one subdirectory per bucket, objects as plain files.
    pub root: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    pub fn start() -> Server {
        let bin = find_versitygw();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let log = std::fs::File::create(tmp.path().join("versitygw.log")).unwrap();
        let port = free_port();
        let child = Command::new(&bin)
            .args(["--port", &format!("127.0.0.1:{port}")])
            .args(["--access", ACCESS, "--secret", SECRET, "--quiet"])
            .arg("posix")
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = Server {
            child,
            port,
            root,
            _tmp: tmp,
        };
        // Wait until it listens (poll the port, bounded), failing early if it exited.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                let log =
                    std::fs::read_to_string(server._tmp.path().join("versitygw.log")).unwrap();
                panic!("versitygw exited with {status}: {log}");
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "versitygw did not listen on {port} within 30 s"
            );
            std::thread::yield_now();
            std::thread::park_timeout(Duration::from_millis(20));
        }
        server
    }

    /// Creates a bucket. With the posix backend a bucket is a top-level directory of the
    /// root, so making the directory is how an administrator creates one.
    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir(self.root.join(name)).unwrap();
    }

    pub fn spec(&self, bucket_and_prefix: &str, secret: &str) -> String {
        format!(
            "s3://{bucket_and_prefix}?endpoint=http://127.0.0.1:{}&access_key={ACCESS}&secret_key={secret}",
            self.port
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
