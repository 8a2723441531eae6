//! Things that must not grow forever on a long-running staging server (issue 22, finding
//! 10; docs/staging.md, "Bounded state"): completed checkpoints, namespace repositories,
//! versions that cannot be drained, and log lines. A real server is driven with thousands
//! of small checkpoints and many namespaces; synchronisation is by replies and by polling
//! the server's status with deadlines.

use std::time::Duration;

use cascade_staging::protocol::PushFile;
use cascade_staging::{ServerOptions, ServerStatus};
use common::{digest, poll_status, write_file, InProcessServer};

mod common;
/// How long a condition may take on a loaded machine before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);
/// The server keeps the names of at most this many completed checkpoints (engine/model.rs).
const DONE_KEPT: u64 = 1024;
/// The server keeps at most this many namespace repositories open (server/dedup.rs).
const MAX_OPEN_REPOS: u64 = 64;

/// The server of these tests: two receive buffers.
type Running = InProcessServer;

impl InProcessServer {
    fn start(tune: impl FnOnce(&mut ServerOptions)) -> Running {
        Running::bind(2, |o, _| tune(o))
    }

    fn status(&self) -> ServerStatus {
        self.client("status", DEADLINE).status().unwrap()
    }

    fn wait_for(&self, what: &str, cond: impl Fn(&ServerStatus) -> bool) -> ServerStatus {
        poll_status(what, DEADLINE, || self.status(), cond)
    }
}

/// Thousands of checkpoints written, drained and completed, and many namespaces asked
/// about: what the server holds in memory stays bounded, and so does what it prints.
#[test]
fn a_long_run_keeps_the_servers_state_bounded() {
    let srv = Running::start(|o| {
        o.verbose = true;
        o.dedup_repo_idle = Duration::from_millis(200);
    });
    let total = DONE_KEPT + 300;
    let mut c = srv.client("job", DEADLINE);
    let batch = 100;
    let mut done = 0;
    while done < total {
        let upto = (done + batch).min(total);
        for i in done..upto {
            let data = format!("checkpoint {i}");
            write_file(&mut c, &format!("ckpt.{i}/rank0"), 1, data.as_bytes());
        }
        c.sync().unwrap();
        for i in done..upto {
            let data = format!("checkpoint {i}");
            let file = PushFile {
                path: "rank0".into(),
                size: data.len() as u64,
                blake3: digest(data.as_bytes()),
            };
            c.push(&format!("ckpt.{i}"), false, &[file]).unwrap();
        }
        let s = srv.wait_for("the batch's markers", |s| s.markers >= upto);
        assert!(
            s.usage.manifests_held <= DONE_KEPT + batch,
            "{} checkpoint manifests held after {upto}",
            s.usage.manifests_held
        );
        done = upto;
    }
    let s = srv.wait_for("every checkpoint complete", |s| {
        s.pending_checkpoints == 0 && s.pending_files == 0
    });
    assert_eq!(s.markers, total);
    assert!(
        s.usage.manifests_held <= DONE_KEPT,
        "{} manifests held",
        s.usage.manifests_held
    );
    assert!(srv
        .durable
        .join(format!("job/ckpt.{}/.cascade-complete", total - 1))
        .is_file());
    // Every drained file and completed checkpoint was a verbose line: all but a few a
    // minute were suppressed.
    assert!(
        s.log_suppressed >= total,
        "{} log lines suppressed of about {} logged",
        s.log_suppressed,
        2 * total
    );

    // Many namespaces asked about: a bounded number of repositories open at once, and none
    // once they are idle.
    for n in 0..3 * MAX_OPEN_REPOS {
        let mut c = srv.client(&format!("ns{n}"), DEADLINE);
        assert_eq!(c.lacks(&[[n as u8; 32]]).unwrap(), vec![true]);
        let s = c.status().unwrap();
        assert!(
            s.dedup.open_repositories <= MAX_OPEN_REPOS,
            "{} repositories open after {n} namespaces",
            s.dedup.open_repositories
        );
    }
    srv.wait_for("idle repositories closed", |s| {
        s.dedup.open_repositories == 0
    });
    srv.stop();
}

/// A version the durable store refuses for good (a name component longer than a file
/// name may be) is retried a few times, then counted in drain_failed and kept: it was
/// acknowledged. Other versions drain meanwhile and afterwards.
#[test]
fn an_undrainable_version_is_given_up_but_kept_and_others_drain() {
    let srv = Running::start(|o| o.drain_attempts = 2);
    let mut c = srv.client("job", DEADLINE);
    let bad = format!("ckpt.0/{}", "x".repeat(300));
    write_file(&mut c, &bad, 1, b"kept");
    write_file(&mut c, "ckpt.0/good", 1, b"drains");
    c.sync().unwrap();
    let s = srv.wait_for("the bad version given up", |s| s.drain_failed == 1);
    assert_eq!(s.drain_failures, 2, "{s:?}");
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("giving up")),
        "{s:?}"
    );
    srv.wait_for("the good version drained", |s| s.drained_files == 1);
    // Written after the give-up: drains too.
    write_file(&mut c, "ckpt.1/good", 1, b"drains too");
    c.sync().unwrap();
    let s = srv.wait_for("the later version drained", |s| s.drained_files == 2);
    // Not retried hot, and still staged and readable.
    assert_eq!(
        (s.drain_failures, s.drain_failed, s.pending_files),
        (2, 1, 1)
    );
    let mut out = Vec::new();
    let meta = c.read(&bad, 0, 1 << 20, &mut out).unwrap().unwrap();
    assert_eq!(
        (out.as_slice(), meta.blake3),
        (&b"kept"[..], digest(b"kept"))
    );
    srv.stop();
}
