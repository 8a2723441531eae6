//! The S3 backend against a real versitygw server (posix backend) started on 127.0.0.1.
//! scripts/test.sh installs versitygw; the test finds it through $VERSITYGW, $PATH, $GOBIN,
//! $(go env GOPATH)/bin or ~/go/bin.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cascade_durable::{DurableStore, Error, Options, Spec};

const ACCESS: &str = "cascadetestkey";
const SECRET: &str = "cascadetestsecret0123456789";

fn find_versitygw() -> PathBuf {
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

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A versitygw server on 127.0.0.1 serving `root` (one directory per bucket); killed on drop.
struct Server {
    child: Child,
    port: u16,
    root: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
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
    fn create_bucket(&self, name: &str) {
        std::fs::create_dir(self.root.join(name)).unwrap();
    }

    fn spec(&self, bucket_and_prefix: &str, secret: &str) -> String {
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

#[test]
fn s3_checkpoint_layout_errors_and_verification() {
    let server = Server::start();
    server.create_bucket("cascade");

    let store = DurableStore::open(&server.spec("cascade/jobs/job1", SECRET)).unwrap();
    assert_eq!(store.name(), "s3://cascade/jobs/job1");
    // The objects are plain files under root/bucket/prefix.
    let disk_root = server.root.join("cascade/jobs/job1");
    common::checkpoint_round_trip(&store, &disk_root);
    common::failed_reupload_is_not_complete(&store);
    // The prefix isolates stores in one bucket.
    let other = DurableStore::open(&server.spec("cascade/jobs/job2", SECRET)).unwrap();
    assert!(other.list("").unwrap().is_empty());
    assert!(!other.is_complete("ckpt.0001").unwrap());

    // Wrong secret: one clear line, EACCES.
    let e = DurableStore::open(&server.spec("cascade", "wrong-secret")).unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let msg = e.to_string();
    eprintln!("wrong secret: {msg}");
    assert!(
        msg.contains("access denied") && msg.contains("s3://cascade"),
        "{msg}"
    );
    assert!(
        !msg.contains('\n') && !msg.contains("wrong-secret"),
        "{msg}"
    );
    assert_eq!(e.errno(), 13);

    // Missing bucket.
    let e = DurableStore::open(&server.spec("no-such-bucket/x", SECRET)).unwrap_err();
    assert!(matches!(e, Error::NoBucket { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "durable store s3://no-such-bucket/x: bucket \"no-such-bucket\" does not exist"
    );
}

#[test]
fn s3_unreachable_endpoint_is_one_clear_error() {
    // A port nothing listens on (bound and released).
    let port = free_port();
    let spec = Spec::parse(&format!(
        "s3://b?endpoint=http://127.0.0.1:{port}&access_key=a&secret_key=b"
    ))
    .unwrap();
    let opts = Options {
        max_retries: 1,
        retry_timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let e = DurableStore::open_with(spec, opts).unwrap_err();
    eprintln!("unreachable: {e}");
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert!(!e.to_string().contains('\n'));
}
