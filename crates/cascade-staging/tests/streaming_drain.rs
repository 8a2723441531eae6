//! The streaming drain (docs/staging.md, "Streaming drain"), with a real versitygw S3 server,
//! real staging servers and clients on 127.0.0.1:
//!
//! 1. a large file's upload starts with its first Write frames: before the client seals it,
//!    the server has handed the upload all but the last frame (Status `streamed_bytes`) and
//!    the store holds no object yet; once sealed it reaches S3 bit for bit with its
//!    `.blake3`, drained by the stream (no read of the arenas, no second upload); a resent
//!    frame gives the stream up and the file drains whole at its seal;
//! 2. a client that goes away before sealing leaves no data object and no checksum object;
//! 3. a version sealed with another hash than its bytes' is not marked drained and gets no
//!    checksum object;
//! 4. a server killed with SIGKILL while uploads stream drains every acknowledged file bit
//!    for bit after a restart, and the file that was still arriving is not in S3.

mod common;

use std::time::Duration;

use cascade_durable::DurableStore;
use cascade_staging::{Connection, ServerStatus};
use cascade_testkit::versitygw::SECRET as S3_SECRET;
use cascade_testkit::{random, Versitygw};
use common::{digest, disk_dir, poll_status, InProcessServer, ServerProcess};

const DEADLINE: Duration = Duration::from_secs(120);
const NS: &str = "job1";
const FRAME: usize = 4 << 20;

/// A versitygw server with bucket `cascade`, and the durable URL of `cascade/<prefix>`.
fn s3(prefix: &str) -> (Versitygw, String) {
    let gw = Versitygw::start();
    gw.create_bucket("cascade");
    let spec = gw.spec(&format!("cascade/{prefix}"), S3_SECRET);
    (gw, spec)
}

/// Sends frames `range` of `data` (FRAME bytes each) as version 1 of `key`; the frame that
/// ends the file seals it with `sealed` as its BLAKE3.
fn send_frames(
    c: &mut Connection,
    key: &str,
    data: &[u8],
    frames: std::ops::Range<usize>,
    sealed: [u8; 32],
) {
    common::write_pieces(c, key, data, FRAME, frames, sealed);
}

fn frames_of(data: &[u8]) -> usize {
    data.len().div_ceil(FRAME)
}

fn status_of(srv: &InProcessServer) -> ServerStatus {
    let mut q = srv.client(NS, DEADLINE);
    let s = q.status().expect("status");
    q.goodbye();
    s
}

/// The object paths under the store, for absence checks.
fn objects(store: &DurableStore) -> Vec<String> {
    store
        .list("")
        .expect("list the store")
        .into_iter()
        .map(|o| o.path)
        .collect()
}

/// `key` of `NS` is in the store bit for bit with its checksum object.
fn assert_in_s3(store: &DurableStore, key: &str, data: &[u8]) {
    let rel = format!("{NS}/{key}");
    let got = store.get_bytes(&rel).expect("the drained object");
    assert!(
        got == data,
        "{rel}: {} bytes in S3, {} sent",
        got.len(),
        data.len()
    );
    assert_eq!(
        store.recorded_checksum(&rel).expect("its checksum object"),
        blake3::hash(data).to_hex().to_string(),
        "{rel}"
    );
}

#[test]
fn a_large_file_uploads_while_it_arrives_and_drains_by_its_stream() {
    let (_gw, spec) = s3("stream");
    let store = DurableStore::open(&spec).expect("open the store");
    let srv = InProcessServer::bind(4, |o, _| o.drain_to = spec.clone());
    let mut c = srv.client(NS, DEADLINE);
    let key = "ckpt/big.dat";
    let data = random((40 << 20) + 12_345, 1);
    let n = frames_of(&data);
    send_frames(&mut c, key, &data, 0..n - 1, digest(&data));
    c.sync().expect("sync");
    // All frames but the last are in the upload before the client has sealed the file.
    let before_seal = ((n - 1) * FRAME) as u64;
    let s = poll_status(
        "the upload fed before the seal",
        DEADLINE,
        || status_of(&srv),
        |s| s.streamed_bytes >= before_seal,
    );
    assert_eq!(s.drained_files, 0, "{s:?}");
    let rel = format!("{NS}/{key}");
    let listed = objects(&store);
    assert!(
        !listed.contains(&rel),
        "an object before the seal: {listed:?}"
    );

    send_frames(&mut c, key, &data, n - 1..n, digest(&data));
    c.sync().expect("sync");
    let s = poll_status(
        "drained",
        DEADLINE,
        || status_of(&srv),
        |s| s.drained_files >= 1,
    );
    assert_in_s3(&store, key, &data);
    assert_eq!(s.drained_streaming, 1, "{s:?}");
    assert_eq!(s.streaming_fallbacks, 0, "{s:?}");
    assert_eq!(s.streamed_bytes, data.len() as u64, "{s:?}");
    assert_eq!(s.drained_from_memory, 0, "uploaded a second time: {s:?}");
    assert_eq!(s.drain_arena_bytes, 0, "read the arenas: {s:?}");

    // A resent frame: the stream is given up, the file drains whole at its seal.
    let key2 = "ckpt/resent.dat";
    let data2 = random(20 << 20, 2);
    let n2 = frames_of(&data2);
    send_frames(&mut c, key2, &data2, 0..2, digest(&data2));
    send_frames(&mut c, key2, &data2, 1..n2, digest(&data2));
    c.sync().expect("sync");
    let s = poll_status(
        "the resent file drained",
        DEADLINE,
        || status_of(&srv),
        |s| s.drained_files >= 2,
    );
    assert_in_s3(&store, key2, &data2);
    assert_eq!(s.drained_streaming, 1, "{s:?}");
    assert_eq!(s.streaming_fallbacks, 1, "{s:?}");
    c.goodbye();
    srv.stop();
}

#[test]
fn a_client_gone_before_its_seal_leaves_nothing_in_s3() {
    let (_gw, spec) = s3("gone");
    let store = DurableStore::open(&spec).expect("open the store");
    let srv = InProcessServer::bind(4, |o, _| o.drain_to = spec.clone());
    let mut c = srv.client(NS, DEADLINE);
    let key = "ckpt/gone.dat";
    let data = random(40 << 20, 3);
    send_frames(&mut c, key, &data, 0..5, digest(&data));
    c.sync().expect("sync");
    poll_status(
        "the upload streaming",
        DEADLINE,
        || status_of(&srv),
        |s| s.streamed_bytes >= (5 * FRAME) as u64,
    );
    // The connection drops without a Goodbye.
    drop(c);
    let s = poll_status(
        "the stream given up",
        DEADLINE,
        || status_of(&srv),
        |s| s.streaming_fallbacks >= 1,
    );
    assert_eq!(s.drained_files, 0, "{s:?}");
    let rel = format!("{NS}/{key}");
    // Not even its version object: it would retire an older sealed version of the key.
    assert_eq!(
        store
            .recorded_version(&rel)
            .expect("read the version object"),
        None
    );
    let listed = objects(&store);
    assert!(
        !listed
            .iter()
            .any(|p| *p == rel || *p == format!("{rel}.blake3")),
        "{listed:?}"
    );
    srv.stop();
    // Nor once the server has stopped (its upload requests are gone for good).
    let listed = objects(&store);
    assert!(!listed.iter().any(|p| p.starts_with(&rel)), "{listed:?}");
}

#[test]
fn a_file_sealed_with_another_hash_gets_no_checksum_object() {
    let (_gw, spec) = s3("mismatch");
    let store = DurableStore::open(&spec).expect("open the store");
    let srv = InProcessServer::bind(4, |o, _| {
        o.drain_to = spec.clone();
        o.verbose = true;
    });
    let mut c = srv.client(NS, DEADLINE);
    let key = "ckpt/liar.dat";
    let data = random(20 << 20, 4);
    let other = digest(b"not these bytes");
    send_frames(&mut c, key, &data, 0..frames_of(&data), other);
    c.sync().expect("sync");
    let s = poll_status(
        "the drain refused it",
        DEADLINE,
        || status_of(&srv),
        |s| s.drain_failures >= 1,
    );
    assert_eq!(s.drained_files, 0, "{s:?}");
    assert_eq!(s.drained_streaming, 0, "{s:?}");
    // The stream itself refused it at the seal (it was not given up before).
    assert_eq!(s.streaming_fallbacks, 0, "{s:?}");
    assert_eq!(s.streamed_bytes, data.len() as u64 - 1, "{s:?}");
    let sum = format!("{NS}/{key}.blake3");
    let listed = objects(&store);
    assert!(!listed.contains(&sum), "{listed:?}");
    c.goodbye();
    srv.stop();
    assert!(!objects(&store).contains(&sum));
}

/// The server processes of [`ServerProcess::start`] (common::serve_in_child), with 4 buffers.
#[test]
fn child_server_process() {
    common::serve_in_child(|o| o.buffers = 4, |_| {});
}

#[test]
fn a_server_killed_while_uploads_stream_drains_every_acknowledged_file_after_a_restart() {
    let (_gw, spec) = s3("killed");
    let store = DurableStore::open(&spec).expect("open the store");
    let arena_dir = disk_dir();
    let dir = arena_dir.path().join("arenas");
    let drain_to = std::path::PathBuf::from(&spec);
    let acked: Vec<(String, Vec<u8>)> = [(20 << 20) + 7, 16 << 20, 4097]
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("ckpt/acked{i}.dat"), random(len, 10 + i as u64)))
        .collect();
    let partial = random(40 << 20, 20);
    let partial_key = "ckpt/arriving.dat";

    let mut server = ServerProcess::start(&dir, &drain_to, DEADLINE);
    let mut c = server.connect(NS, DEADLINE);
    for (key, data) in &acked {
        send_frames(&mut c, key, data, 0..frames_of(data), digest(data));
    }
    c.sync().expect("sync: the acked files are acknowledged");
    // Half of another file, no seal: its upload is streaming when the server dies.
    send_frames(&mut c, partial_key, &partial, 0..5, digest(&partial));
    let streamable: u64 = acked
        .iter()
        .map(|(_, d)| d.len() as u64)
        .filter(|&n| n >= 8 << 20)
        .sum();
    poll_status(
        "the arriving file's upload streaming",
        DEADLINE,
        || server.status(NS, DEADLINE),
        |s| s.streamed_bytes >= streamable + (5 * FRAME) as u64,
    );
    let status = server.daemon.kill9();
    assert!(!status.success(), "{status}");
    drop(c);

    server = ServerProcess::start(&dir, &drain_to, DEADLINE);
    let start = std::time::Instant::now();
    for (key, data) in &acked {
        let sum = blake3::hash(data).to_hex().to_string();
        let rel = format!("{NS}/{key}");
        while store.recorded_checksum(&rel).ok() != Some(sum.clone()) {
            assert!(
                start.elapsed() < DEADLINE,
                "{rel} not drained after the restart: {:?}",
                server.status(NS, DEADLINE)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_in_s3(&store, key, data);
    }
    let rel = format!("{NS}/{partial_key}");
    let listed = objects(&store);
    assert!(
        !listed
            .iter()
            .any(|p| *p == rel || *p == format!("{rel}.blake3")),
        "{listed:?}"
    );
    server.daemon.kill9();
}
