//! Notifications instead of timers (docs/staging.md, "Watch"): real servers on 127.0.0.1 in
//! this process, a directory as the durable store, fallback timers (`recheck_every`) of an
//! hour, so only events can make these tests progress; every wait is a Watch that must be
//! answered by an event (a Watch that runs out fails the test).
//!
//! 1. a Watch is answered when the server drains a file (12 MiB: in one request from the
//!    mapped arenas, bit for bit), and at once when the counter is already past the client's;
//! 2. a checkpoint pushed to server A whose other file server B drains is completed when a
//!    client asks A about it (Pull) after B's drain event, with no timer involved.

mod common;

use std::time::Duration;

use cascade_staging::protocol::{Level, PullKind, PushFile};
use cascade_staging::{Connection, ServerOptions, ServerStatus};
use cascade_testkit::random;
use common::{digest, write_file, InProcessServer};

/// Longer than any test needs: a hang guard only.
const DEADLINE: Duration = Duration::from_secs(60);

fn hour(o: &mut ServerOptions) {
    o.recheck_every = Duration::from_secs(3600);
}

/// Waits for `done` on `srv` by Watch (see the module comment).
fn watch_until(
    srv: &InProcessServer,
    what: &str,
    done: impl Fn(&ServerStatus) -> bool,
) -> ServerStatus {
    let mut status = srv.client("", DEADLINE);
    let mut watcher = srv.client("", DEADLINE * 3);
    loop {
        let s = status.status().expect("status");
        if done(&s) {
            return s;
        }
        let events = watcher.watch(s.events, DEADLINE).expect("watch");
        assert!(
            events > s.events,
            "{what}: no event within the wait: {s:#?}"
        );
    }
}

fn sync_one(c: &mut Connection, key: &str, data: &[u8]) {
    write_file(c, key, 1, data);
    c.sync().expect("sync");
}

#[test]
fn a_watch_is_answered_by_a_drain_and_at_once_when_already_past() {
    let srv = InProcessServer::bind(2, |o, _| hour(o));
    let mut c = srv.client("", DEADLINE);
    let mut watcher = srv.client("", DEADLINE * 3);
    let before = c.status().expect("status").events;
    // Large enough to drain in one request from the mapped arenas.
    let data = random(12 << 20, 1);
    sync_one(&mut c, "ckpt/one.dat", &data);
    let events = watcher.watch(before, DEADLINE).expect("watch");
    assert!(events > before, "the drain was not an event");
    let s = watch_until(&srv, "the file drained", |s| s.drained_files == 1);
    assert!(s.watch_wakeups >= 1, "{s:#?}");
    let drained = std::fs::read(srv.durable.join("ckpt/one.dat")).expect("drained file");
    assert!(drained == data, "the drained file differs");
    let sum = std::fs::read_to_string(srv.durable.join("ckpt/one.dat.blake3")).expect("checksum");
    assert!(sum.starts_with(&blake3::hash(&data).to_hex().to_string()));
    // Past already: answered at once, with the counter.
    assert_eq!(watcher.watch(0, DEADLINE).expect("watch"), s.events);
    c.goodbye();
    watcher.goodbye();
    srv.stop();
}

#[test]
fn a_checkpoint_completed_by_another_servers_drain_is_marked_when_asked() {
    let a = InProcessServer::bind(2, |o, _| hour(o));
    let shared = a.durable.to_str().expect("utf-8").to_string();
    let b = InProcessServer::bind(2, |o, _| {
        hour(o);
        o.drain_to = shared.clone();
    });
    let ns = "job3";
    let (one, two) = (random(2 << 20, 2), random(1 << 20, 3));
    let mut ca = a.client(ns, DEADLINE);
    let mut cb = b.client(ns, DEADLINE);

    // A has one file and the checkpoint's list, which names B's file too.
    sync_one(&mut ca, "run/ckpt.4/one.dat", &one);
    let files = [("one.dat", &one), ("two.dat", &two)].map(|(path, data)| PushFile {
        path: path.to_string(),
        size: data.len() as u64,
        blake3: digest(data),
    });
    ca.push("run/ckpt.4", false, &files).expect("push");
    watch_until(&a, "A drained its file", |s| s.drained_files == 1);

    // B drains the other: an event for B's watchers; A is not told by B.
    sync_one(&mut cb, "run/ckpt.4/two.dat", &two);
    let sb = watch_until(&b, "B drained its file", |s| s.drained_files == 1);

    // A client that heard of it asks A: A looks at its pending checkpoint at once.
    let mut watcher = a.client("", DEADLINE * 3);
    loop {
        let before = ca.status().expect("status").events;
        let state = ca
            .pull(&[(PullKind::Checkpoint, "run/ckpt.4")])
            .expect("pull");
        if state[0].level == Level::Durable {
            break;
        }
        assert_eq!(state[0].level, Level::Staged);
        let events = watcher.watch(before, DEADLINE).expect("watch");
        assert!(events > before, "no event after the Pull");
    }
    let sa = ca.status().expect("status");
    assert_eq!(sa.markers, 1);
    assert!(
        a.durable
            .join(ns)
            .join("run/ckpt.4/.cascade-complete")
            .is_file(),
        "no marker in the durable store"
    );
    assert_eq!(
        (sa.timed_rechecks, sb.timed_rechecks),
        (0, 0),
        "a fallback timer looked"
    );
    for c in [ca, cb, watcher] {
        c.goodbye();
    }
    a.stop();
    b.stop();
}
