//! The pipelined receive path and the drain from memory (docs/staging.md, "Absorb" and
//! "Drain"), with real servers on 127.0.0.1, real clients and a real directory as the
//! durable store; the arenas on the disk under /var/tmp, where they are written with
//! O_DIRECT by several disk writers at once.
//!
//! 1. a sealed version drains from the bytes the server kept of its Write frames: the Status
//!    says so, and that the drain read nothing from the arenas; they drain bit for bit and
//!    the memory is let go;
//! 2. without the memory (`drain_memory` 0), or past its budget, versions drain from the
//!    arenas as before, bit for bit;
//! 3. a server process killed with SIGKILL in the middle of a stream (Write frames of a file
//!    still arriving and being written) recovers every file a Sync acknowledged and,
//!    restarted, drains each bit for bit; the file being sent is not there;
//! 4. the server's threads carry the names `top -H` and the bench's CPU split rely on;
//! 5. a sealed version's drain waits while clients write (absorbing has the CPU), but no
//!    longer than the paced drain would take over it, and not when the arenas run short
//!    of room;
//! 6. with `prefault`, the drain memory is faulted in as spare buffers after the start, up
//!    to its budget; without, nothing is until frames arrive.

mod common;

use std::time::{Duration, Instant};

use cascade_staging::client::OutSegment;
use cascade_staging::{Connection, ServerStatus};
use cascade_testkit::{poll, random};
use common::{assert_drained, digest, disk_dir, poll_status, InProcessServer, ServerProcess};

const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "job1";

/// Files of awkward sizes: (key, bytes).
fn files(seed: u64) -> Vec<(String, Vec<u8>)> {
    [1usize, 4097, (3 << 20) + 123, (13 << 20) + 5]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("ckpt/f{i}.dat"), random(n, seed + i as u64)))
        .collect()
}

/// Sends `data` as `key` in Write frames of `piece` bytes (the last one sealing it).
fn send_file(c: &mut Connection, key: &str, data: &[u8], piece: usize) {
    let pieces = data.len().div_ceil(piece);
    common::write_pieces(c, key, data, piece, 0..pieces, digest(data));
}

/// Sends `files` in frames of 1 MiB + 4321 bytes (unaligned offsets), then Sync.
fn send(c: &mut Connection, files: &[(String, Vec<u8>)]) {
    for (k, d) in files {
        send_file(c, k, d, (1 << 20) + 4321);
    }
    c.sync().expect("sync");
}

fn status_of(srv: &InProcessServer) -> ServerStatus {
    let mut q = srv.client(NS, DEADLINE);
    let s = q.status().expect("status");
    q.goodbye();
    s
}

/// Sends `files` to a server tuned by `tune`, waits until they drained, checks them bit for
/// bit and returns the server's status then (and after the memory was let go).
fn send_and_drain(
    files: &[(String, Vec<u8>)],
    tune: impl FnOnce(&mut cascade_staging::ServerOptions),
) -> ServerStatus {
    let arena_dir = disk_dir();
    let dir = arena_dir.path().join("arenas");
    let srv = InProcessServer::bind(2, move |o, _| {
        o.dir = dir;
        tune(o);
    });
    let mut c = srv.client(NS, DEADLINE);
    send(&mut c, files);
    let n = files.len() as u64;
    poll_status(
        "drained and let go",
        DEADLINE,
        || status_of(&srv),
        |s| s.drained_files >= n && s.drain_memory == 0,
    );
    assert_drained(NS, &srv.durable, files);
    let s = status_of(&srv);
    c.goodbye();
    srv.stop();
    s
}

#[test]
fn a_sealed_version_drains_from_memory_without_reading_the_arenas() {
    let files = files(300);
    let s = send_and_drain(&files, |_| {});
    let n = files.len() as u64;
    assert_eq!(s.drained_from_memory, n, "{s:?}");
    assert_eq!(s.drain_arena_bytes, 0, "the drain read the arenas: {s:?}");
    assert_eq!(s.drain_memory_spills, 0, "{s:?}");
    assert_eq!(s.drain_memory_budget, 2 << 30, "{s:?}");
}

#[test]
fn without_drain_memory_versions_drain_from_the_arenas() {
    let files = files(400);
    let s = send_and_drain(&files, |o| o.drain_memory = 0);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(s.drained_from_memory, 0, "{s:?}");
    assert_eq!(s.drain_arena_bytes, total, "{s:?}");
}

#[test]
fn a_version_over_the_budget_drains_from_the_arenas() {
    // Room for two of the 1 MiB frames: the 13 MiB file does not fit, the others do.
    let files = files(500);
    let s = send_and_drain(&files, |o| o.drain_memory = 3 << 20);
    let big = files.iter().map(|(_, d)| d.len() as u64).max().unwrap_or(0);
    assert!(s.drain_memory_spills >= 1, "{s:?}");
    assert!(s.drain_arena_bytes >= big, "{s:?}");
    assert_eq!(
        s.drained_from_memory + s.drain_memory_spills,
        files.len() as u64,
        "{s:?}"
    );
}

/// Sends one 2 MiB file (two Write frames and a Sync) to a server tuned by `tune` and waits
/// until it drained, within `within`: how long after the first byte was sent, and the
/// server's status then.
fn drained_after(
    within: Duration,
    tune: impl FnOnce(&mut cascade_staging::ServerOptions),
) -> (Duration, ServerStatus) {
    let arena_dir = disk_dir();
    let dir = arena_dir.path().join("arenas");
    let srv = InProcessServer::bind(2, move |o, _| {
        o.dir = dir;
        tune(o);
    });
    let file = vec![("ckpt/a.dat".to_string(), random(2 << 20, 800))];
    let mut c = srv.client(NS, DEADLINE);
    let sent = Instant::now();
    send(&mut c, &file);
    let s = poll_status(
        "drained",
        within,
        || status_of(&srv),
        |s| s.drained_files >= 1,
    );
    let waited = sent.elapsed();
    assert_drained(NS, &srv.durable, &file);
    c.goodbye();
    srv.stop();
    (waited, s)
}

/// `drained_after` with `busy_window` and `busy_pause` set: asserts that the file drained
/// no sooner than `at_least` after its write (within 30 s), having yielded to the clients.
fn yields_for_at_least(at_least: Duration, busy_window: Duration, busy_pause: Duration) {
    let (waited, s) = drained_after(Duration::from_secs(30), |o| {
        o.busy_window = busy_window;
        o.busy_pause = busy_pause;
    });
    assert!(
        waited >= at_least,
        "drained {waited:?} after the write: {s:?}"
    );
    assert!(s.drain_yields >= 1, "{s:?}");
}

#[test]
fn a_sealed_version_waits_until_the_clients_stop_writing() {
    // The Write keeps the server busy for 1 s; the paced drain would take 2 minutes.
    let second = Duration::from_secs(1);
    yields_for_at_least(second, second, Duration::from_secs(60));
}

#[test]
fn a_sealed_version_waits_no_longer_than_the_paced_drain_would_take() {
    // The Write keeps the server busy for a minute; 2 MiB at 1 MiB per second take 2 s.
    yields_for_at_least(
        Duration::from_secs(2),
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
}

#[test]
fn a_sealed_version_does_not_wait_when_the_arenas_are_short_of_room() {
    // The 2 MiB version fills over half of the 3 MiB capacity: it drains while the server
    // is busy for another minute.
    let (_, s) = drained_after(Duration::from_secs(30), |o| {
        o.busy_window = Duration::from_secs(60);
        o.busy_pause = Duration::from_secs(60);
        o.engine.capacity = Some(3 << 20);
    });
    assert_eq!(s.drain_yields, 0, "{s:?}");
}

#[test]
fn prefault_fills_the_drain_memory_with_spare_buffers_after_the_start() {
    let budget = 64 << 20;
    for prefault in [true, false] {
        let srv = InProcessServer::bind(2, |o, _| {
            o.drain_memory = budget;
            o.prefault = prefault;
        });
        if prefault {
            // Receive buffers are a little over 16 MiB: three fit.
            let s = poll_status(
                "spares faulted in",
                DEADLINE,
                || status_of(&srv),
                |s| s.drain_memory_spare >= budget / 2,
            );
            assert!(s.drain_memory_spare <= budget, "{s:?}");
        } else {
            let mut c = srv.client(NS, DEADLINE);
            c.sync().expect("sync");
            c.goodbye();
            assert_eq!(status_of(&srv).drain_memory_spare, 0);
        }
        // Spares serve the frames of a file, and it drains bit for bit.
        let file = vec![("ckpt/p.dat".to_string(), random(20 << 20, 900))];
        let mut c = srv.client(NS, DEADLINE);
        send(&mut c, &file);
        poll_status(
            "drained",
            DEADLINE,
            || status_of(&srv),
            |s| s.drained_files >= 1,
        );
        assert_drained(NS, &srv.durable, &file);
        c.goodbye();
        srv.stop();
    }
}

/// The server processes of [`ServerProcess::start`] (common::serve_in_child).
#[test]
fn child_server_process() {
    common::serve_in_child(|_| {}, |_| {});
}

#[test]
fn a_server_killed_mid_stream_drains_every_acknowledged_file_after_a_restart() {
    let arena_dir = disk_dir();
    let dir = arena_dir.path().join("arenas");
    let durable_dir = tempfile::tempdir().expect("temporary directory");
    let durable = durable_dir.path().to_path_buf();
    // The drain cannot create <durable>/<namespace>/...: a file is in the way, so what was
    // acknowledged is still only on the server's disk when it is killed.
    std::fs::write(durable.join(NS), b"in the way\n").expect("block the durable store");
    let acked = files(600);
    let streaming = random(40 << 20, 700);
    let mut server = ServerProcess::start(&dir, &durable, DEADLINE);
    let mut c = server.connect(NS, DEADLINE);
    send(&mut c, &acked);
    // Half of a larger file in 4 MiB frames, no Sync: frames are arriving and being written
    // by the disk writers when the server dies.
    let key = "ckpt/streaming.dat";
    let piece = 4 << 20;
    for (i, chunk) in streaming[..20 << 20].chunks(piece).enumerate() {
        c.write(&[OutSegment {
            key,
            stamp: 1,
            size: streaming.len() as u64,
            offset: (i * piece) as u64,
            seal: None,
            data: &[chunk],
        }])
        .expect("write a piece of the streaming file");
    }
    let status = server.daemon.kill9();
    assert!(!status.success(), "{status}");
    drop(c);

    std::fs::remove_file(durable.join(NS)).expect("unblock the durable store");
    server = ServerProcess::start(&dir, &durable, DEADLINE);
    let n = acked.len() as u64;
    let s = poll_status(
        "drained after the restart",
        DEADLINE,
        || server.status(NS, DEADLINE),
        |s| s.drained_files >= n,
    );
    assert_drained(NS, &durable, &acked);
    assert!(!durable.join(NS).join(key).exists());
    // Nothing was kept in memory across the restart: the arenas served the drain.
    assert_eq!(s.drained_from_memory, 0, "{s:?}");
    server.daemon.kill9();
}

/// Every worker thread of a server process is named, and each connection gets a
/// `cascade-conn` thread (docs/staging.md, "The server"; bench/src/dedup_link.rs sums the
/// receiving threads by these names).
#[test]
fn the_server_threads_are_named() {
    let dir = disk_dir();
    let durable = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), durable.path(), DEADLINE);
    let names = || -> Vec<String> {
        let tasks = format!("/proc/{}/task", server.daemon.pid());
        let mut names: Vec<String> = std::fs::read_dir(tasks)
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect();
        names.sort();
        names
    };
    let mut c = server.connect(NS, DEADLINE);
    c.sync().expect("sync");
    // A new thread names itself once it first runs: until then it shows its parent's name.
    let wanted = [
        "cascade-io-0",
        "cascade-disk",
        "cascade-drain",
        "cascade-push",
        "cascade-conn",
    ];
    let named = poll(DEADLINE, || {
        let now = names();
        wanted
            .iter()
            .all(|w| now.iter().any(|n| n == w))
            .then_some(())
    });
    assert!(named.is_some(), "{wanted:?} not all in {:?}", names());
    c.goodbye();
}
