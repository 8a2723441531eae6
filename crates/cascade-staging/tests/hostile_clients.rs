//! A real staging server against hostile and broken clients (docs/staging-protocol.md): raw
//! TCP streams send what a well-behaved client never would, and a well-behaved
//! `Connection` then checks that the server still serves and stored nothing it should not
//! have. Synchronisation is by replies only; the one background activity (the drain to the
//! durable tier) is polled with a deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cascade_staging::auth::{Credential, JobKey};
use cascade_staging::client::OutSegment;
use cascade_staging::protocol::{
    self, code, encode_hello, encode_pull, encode_push, encode_read, encode_segment_header, kind,
    read_frame, write_frame, BodyWriter, Header, Level, PullKind, PushFile, Reply, Seal,
    HEADER_LEN, MAX_BODY, MAX_KEY,
};
use cascade_staging::{ClientOptions, Connection, Error};
use cascade_testkit::files_below;
use common::{digest, write_file, InProcessServer, SECRET};

mod common;
use cascade_testkit::stage_server::{raw_auth_frame, raw_hello_frame};

/// Long enough for a loaded CI machine, short enough that a hang fails the test.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The server's limit on bodies of frames other than Write and Push (server.rs).
const SMALL_BODY: usize = 64 << 10;

/// The server of these tests: three receive buffers.
type Running = InProcessServer;

impl InProcessServer {
    fn start() -> Running {
        Running::bind(3, |_, _| {})
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        s
    }

    /// A raw stream past a good handshake (Hello, Challenge, Auth, AuthOk).
    fn raw_hello(&self, namespace: &str) -> TcpStream {
        let mut s = self.raw();
        let (hello, auth) = handshake(&mut s, &JobKey::derive(SECRET, namespace), namespace);
        let (h, body) = recv(&mut s).expect("no AuthOk");
        assert_eq!((h.kind, h.request), (kind::AUTH | kind::REPLY, 2));
        assert!(matches!(
            Reply::decode(h.kind, &body),
            Ok(Reply::AuthOk { .. })
        ));
        let _ = (hello, auth);
        s
    }

    /// A fresh well-behaved client can still write, sync and read back.
    fn assert_serves(&self) {
        let mut c = self.client("health", TIMEOUT);
        let data = b"still serving";
        write_file(&mut c, "probe", 1, data);
        c.sync().unwrap();
        let mut out = Vec::new();
        let meta = c.read("probe", 0, 1 << 20, &mut out).unwrap().unwrap();
        assert_eq!(out, data);
        assert_eq!(meta.blake3, digest(data));
        c.goodbye();
    }
}

/// Sends Hello (request 1), reads the Challenge and sends the Auth (request 2) that `key`
/// proves; the AuthOk or Error is left unread. The two frames as sent, for replaying.
fn handshake(s: &mut TcpStream, key: &JobKey, namespace: &str) -> (Vec<u8>, Vec<u8>) {
    let hello = raw_hello_frame("raw", namespace);
    s.write_all(&hello).unwrap();
    let (h, challenge) = recv(s).expect("no Challenge");
    assert_eq!((h.kind, h.request), (kind::HELLO | kind::REPLY, 1));
    let auth = raw_auth_frame(&challenge, key, namespace);
    s.write_all(&auth).unwrap();
    (hello, auth)
}

fn frame(k: u8, request: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = Header {
        kind: k,
        body_len: body.len() as u32,
        request,
    };
    write_frame(&mut out, header, &[body]).unwrap();
    out
}

/// Sends a frame; a failure is ignored (the server may already have closed).
fn send(s: &mut TcpStream, k: u8, request: u32, body: &[u8]) {
    let _ = s.write_all(&frame(k, request, body));
}

fn recv(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut body = Vec::new();
    match read_frame(s, &mut body) {
        Ok(Some(h)) => {
            body.truncate(h.body_len as usize);
            Some((h, body))
        }
        Ok(None) => None,
        Err(e) => panic!("reading a reply: {e}"),
    }
}

/// Reads an Error frame with `want` and returns its request id and message.
fn expect_error(s: &mut TcpStream, want: u16) -> (u32, String) {
    let (h, body) = recv(s).expect("the server closed without an Error frame");
    match Reply::decode(h.kind, &body) {
        Ok(Reply::Error { code, message }) => {
            assert_eq!(code, want, "error {code} ({message}) instead of {want}");
            (h.request, message.to_string())
        }
        other => panic!("{other:?} instead of an Error {want}"),
    }
}

/// The server closed the connection (end of stream or reset), sending nothing more.
fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Ok(n) => panic!("{n} more bytes after the Error: {:02x?}", &buf[..n]),
        Err(e) => panic!("the connection is still open: {e}"),
    }
}

fn write_body(key: &str, stamp: u64, data: &[u8]) -> Vec<u8> {
    write_body_in("", key, stamp, data)
}

/// The seal of a version written on a raw connection authenticated for `namespace`.
fn tagged(namespace: &str, key: &str, stamp: u64, size: u64, blake3: [u8; 32]) -> Seal {
    let tag = JobKey::derive(SECRET, namespace).version_tag(key, stamp, size, &blake3);
    Seal { blake3, tag }
}

/// A Write of one sealed version, tagged with the key of `namespace` (the one the raw
/// connection authenticated for).
fn write_body_in(namespace: &str, key: &str, stamp: u64, data: &[u8]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(1);
    let seal = tagged(namespace, key, stamp, data.len() as u64, digest(data));
    encode_segment_header(
        &mut w,
        key,
        stamp,
        data.len() as u64,
        0,
        data.len() as u32,
        Some(&seal),
    );
    w.bytes(data);
    w.buf
}

fn hello_chunk() -> protocol::WireChunk<'static> {
    protocol::WireChunk {
        score: digest(b"hello"),
        kind: protocol::BlobKind::Data,
        stored: protocol::Stored::Raw,
        raw_len: 5,
        data: b"hello",
    }
}

fn chunks_body(chunks: &[protocol::WireChunk]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    protocol::encode_chunk_descriptors(&mut w, chunks);
    for c in chunks {
        w.bytes(c.data);
    }
    w.buf
}

fn manifest_body(part: u32, chunking: &'static str, checkpoint: &'static str) -> Vec<u8> {
    protocol::encode_manifest_part(&protocol::ManifestPart {
        checkpoint,
        single_file: false,
        chunking,
        compression: "none",
        part,
        last: true,
        files: vec![],
        scores: vec![digest(b"hello")],
    })
}

fn raw_header(magic: &[u8; 4], version: u8, k: u8, body_len: u32, request: u32) -> [u8; 16] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(magic);
    h[4] = version;
    h[5] = k;
    h[8..12].copy_from_slice(&body_len.to_le_bytes());
    h[12..16].copy_from_slice(&request.to_le_bytes());
    h
}

fn level_of(c: &mut Connection, what: PullKind, key: &str) -> protocol::PullState {
    c.pull(&[(what, key)]).unwrap().remove(0)
}

#[test]
fn wrong_secret_is_refused_and_nothing_it_sends_is_stored() {
    let srv = Running::start();
    for wrong in ["", "secre", "secretX", "SECRET", &"s".repeat(MAX_KEY)] {
        let mut s = srv.raw();
        // The handshake with a key from the wrong secret, then a sealed Write, a Push and a
        // Sync in the same burst, before the server's verdict.
        let _ = handshake(&mut s, &JobKey::derive(wrong, ""), "");
        let mut burst = frame(kind::WRITE, 3, &write_body("evil", 1, b"payload"));
        let file = PushFile {
            path: "evil".into(),
            size: 7,
            blake3: digest(b"payload"),
        };
        burst.extend(frame(kind::PUSH, 4, &encode_push("ckpt", false, &[file])));
        burst.extend(frame(kind::SYNC, 5, &[]));
        let _ = s.write_all(&burst);
        let (id, message) = expect_error(&mut s, code::AUTH);
        assert_eq!(id, 2, "the Error must echo the Auth's request id");
        assert!(message.contains("credential"), "{message}");
        assert_closed(&mut s);
        // Writing on: the server has gone.
        send(&mut s, kind::WRITE, 6, &write_body("evil2", 1, b"more"));
    }
    // The client library reports the same refusal.
    let mut o = srv.options("", TIMEOUT);
    o.credential = Credential::ClusterSecret("not it".into());
    match Connection::connect(&srv.addr.to_string(), &o) {
        Err(Error::Refused { code, .. }) => assert_eq!(code, code::AUTH),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a wrong secret was accepted"),
    }

    let mut c = srv.client("", TIMEOUT);
    for key in ["evil", "evil2", "health/evil"] {
        assert_eq!(c.read(key, 0, 100, &mut Vec::new()).unwrap(), None, "{key}");
        assert_eq!(level_of(&mut c, PullKind::File, key).level, Level::Unknown);
    }
    assert_eq!(
        level_of(&mut c, PullKind::Checkpoint, "ckpt").level,
        Level::Unknown
    );
    let status = c.status().unwrap();
    assert_eq!(status.refused_clients, 6);
    assert_eq!(status.absorbed_files, 0);
    assert_eq!(status.absorbed_bytes, 0);
    assert_eq!(status.usage.live_versions, 0);
    assert_eq!(status.usage.arena_bytes, 0);
    srv.assert_serves();
    srv.stop();
}

/// A job's credential (the key of its namespace) opens that namespace only: not another
/// job's, not the whole server. A client holding the cluster secret opens any.
#[test]
fn a_job_credential_opens_only_its_own_namespace() {
    let srv = Running::start();
    let job = |namespace: &str, credential_of: &str| {
        let mut o = srv.options(namespace, TIMEOUT);
        let credential = JobKey::derive(SECRET, credential_of).credential();
        o.credential = Credential::Job(JobKey::from_credential(&credential).unwrap());
        Connection::connect(&srv.addr.to_string(), &o)
    };
    let mut a = job("teamA/job1", "teamA/job1").unwrap();
    write_file(&mut a, "ckpt/rank0", 1, b"job one's data");
    a.sync().unwrap();
    let mut b = job("teamA/job2", "teamA/job2").unwrap();
    write_file(&mut b, "ckpt/rank0", 1, b"job two's data");
    b.sync().unwrap();
    for (namespace, credential_of) in [
        ("teamA/job2", "teamA/job1"),
        ("teamA", "teamA/job1"),
        ("", "teamA/job1"),
        ("teamA/job1/x", "teamA/job1"),
    ] {
        match job(namespace, credential_of) {
            Err(Error::Refused { code, message, .. }) => {
                assert_eq!(code, code::AUTH, "{message}");
                assert!(message.contains("does not open"), "{message}");
            }
            Err(e) => panic!("{namespace:?}: {e}"),
            Ok(_) => panic!("the credential of {credential_of} opened {namespace:?}"),
        }
    }
    // Each job reads its own data under its own names; the secret's holder sees both.
    let mut out = Vec::new();
    a.read("ckpt/rank0", 0, 100, &mut out).unwrap().unwrap();
    assert_eq!(out, b"job one's data");
    let mut root = srv.client("", TIMEOUT);
    root.read("teamA/job2/ckpt/rank0", 0, 100, &mut out)
        .unwrap()
        .unwrap();
    assert_eq!(out, b"job two's data");
    srv.assert_serves();
    srv.stop();
}

/// What crosses the wire in a handshake is worth nothing on another connection: the
/// server's nonce is new each time, so a recorded Hello and Auth are refused.
#[test]
fn a_recorded_handshake_cannot_be_replayed() {
    let srv = Running::start();
    let mut s = srv.raw();
    let (hello, auth) = handshake(&mut s, &JobKey::derive(SECRET, "job1"), "job1");
    let (h, _) = recv(&mut s).expect("no AuthOk");
    assert_eq!(h.kind, kind::AUTH | kind::REPLY);
    drop(s);
    for _ in 0..3 {
        let mut replay = srv.raw();
        let mut burst = hello.clone();
        burst.extend(&auth);
        burst.extend(frame(kind::WRITE, 3, &write_body("forged", 9, b"forged")));
        burst.extend(frame(kind::SYNC, 4, &[]));
        let _ = replay.write_all(&burst);
        let (h, _) = recv(&mut replay).expect("no Challenge");
        assert_eq!(h.kind, kind::HELLO | kind::REPLY);
        let (id, message) = expect_error(&mut replay, code::AUTH);
        assert_eq!(id, 2, "{message}");
        assert_closed(&mut replay);
    }
    let mut c = srv.client("job1", TIMEOUT);
    assert_eq!(c.read("forged", 0, 10, &mut Vec::new()).unwrap(), None);
    srv.assert_serves();
    srv.stop();
}

/// The server proves it holds the cluster secret too: a listener that answers the
/// handshake without it (here: one that accepts any proof) gets no checkpoint data.
#[test]
fn a_server_that_cannot_prove_the_secret_is_not_trusted() {
    let impostor = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = impostor.local_addr().unwrap();
    let serving = std::thread::spawn(move || {
        let (mut s, _) = impostor.accept().unwrap();
        let (h, _) = recv(&mut s).expect("no Hello");
        assert_eq!(h.kind, kind::HELLO);
        let challenge = protocol::encode_challenge("impostor", 1, &[3; 32]);
        s.write_all(&frame(kind::HELLO | kind::REPLY, h.request, &challenge))
            .unwrap();
        let (h, _) = recv(&mut s).expect("no Auth");
        assert_eq!(h.kind, kind::AUTH);
        let ok = protocol::encode_auth_ok(&[0x5a; 32]);
        s.write_all(&frame(kind::AUTH | kind::REPLY, h.request, &ok))
            .unwrap();
        // Whatever the client sends next would be checkpoint data.
        recv(&mut s).map(|(h, _)| h.kind)
    });
    let mut o = ClientOptions::new(SECRET);
    o.io_timeout = TIMEOUT;
    match Connection::connect(&addr.to_string(), &o) {
        Err(Error::Protocol { why, .. }) => {
            assert!(
                why.contains("not a staging server of this cluster"),
                "{why}"
            )
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a server without the secret was trusted"),
    }
    assert_eq!(serving.join().unwrap(), None, "the client sent more");
}

/// A sealed version must carry its writer's tag, made with the namespace's key over key,
/// stamp, size and BLAKE3: a version without it, with another job's, or whose bytes and
/// BLAKE3 were changed after tagging (on the way) is refused and never stored, so it can
/// never override the durable store's copy; a tagged one is served with its tag.
#[test]
fn a_seal_without_the_jobs_tag_is_refused() {
    let srv = Running::start();
    let data = b"the job's own bytes";
    let forged = b"someone else's bytes";
    let cases = [
        ("untagged", Seal::untagged(digest(forged))),
        (
            "another job's tag",
            tagged("job2", "x", 9, forged.len() as u64, digest(forged)),
        ),
        (
            "the job's tag over other bytes",
            Seal {
                tag: tagged("job1", "x", 9, forged.len() as u64, digest(data)).tag,
                blake3: digest(forged),
            },
        ),
    ];
    for (what, seal) in cases {
        let mut s = srv.raw_hello("job1");
        let mut w = BodyWriter::default();
        w.u32(1);
        encode_segment_header(
            &mut w,
            "x",
            9,
            forged.len() as u64,
            0,
            forged.len() as u32,
            Some(&seal),
        );
        w.bytes(forged);
        send(&mut s, kind::WRITE, 61, &w.buf);
        send(&mut s, kind::SYNC, 62, &[]);
        let (id, message) = expect_error(&mut s, code::INVALID);
        assert_eq!(id, 61, "{what}: {message}");
        assert!(message.contains("tag does not verify"), "{what}: {message}");
        assert_closed(&mut s);
    }
    let mut c = srv.client("job1", TIMEOUT);
    assert_eq!(c.read("x", 0, 100, &mut Vec::new()).unwrap(), None);
    write_file(&mut c, "x", 3, data);
    c.sync().unwrap();
    let mut out = Vec::new();
    let meta = c.read("x", 0, 100, &mut out).unwrap().unwrap();
    assert_eq!(out, data);
    let expected =
        JobKey::derive(SECRET, "job1").version_tag("x", 3, data.len() as u64, &digest(data));
    assert_eq!(meta.tag, expected, "the tag is served with the version");
    assert_eq!(c.status().unwrap().absorbed_files, 1);
    srv.assert_serves();
    srv.stop();
}

/// A sealed version's name and stamp belong to its bytes: a resend of the same file is
/// accepted and changes nothing, another file under them is refused and not stored.
#[test]
fn another_file_under_a_sealed_name_and_stamp_is_refused() {
    let srv = Running::start();
    let data = b"the first file's bytes".to_vec();
    let other: Vec<u8> = data.iter().rev().copied().collect();
    let mut c = srv.client("job1", TIMEOUT);
    write_file(&mut c, "x", 5, &data);
    c.sync().unwrap();
    let mut s = srv.raw_hello("job1");
    send(
        &mut s,
        kind::WRITE,
        61,
        &write_body_in("job1", "x", 5, &data),
    );
    send(
        &mut s,
        kind::WRITE,
        62,
        &write_body_in("job1", "x", 5, &other),
    );
    send(&mut s, kind::SYNC, 63, &[]);
    // Writes are not answered one by one: the Sync gets the refusal.
    let (id, message) = expect_error(&mut s, code::INVALID);
    assert_eq!(id, 63, "{message}");
    assert!(
        message.contains("already sealed with another BLAKE3"),
        "{message}"
    );
    assert_closed(&mut s);
    let mut out = Vec::new();
    let meta = c.read("x", 0, 100, &mut out).unwrap().unwrap();
    assert_eq!(out, data);
    assert_eq!(meta.blake3, digest(&data));
    c.goodbye();
    srv.assert_serves();
    srv.stop();
}

/// Names the durable layout reserves (markers, checksums, parts, version objects) are
/// written by the server only: a client that Writes or Pushes one is refused, and nothing
/// of it reaches the durable store. (Dedup manifests are repository records, where a node's
/// part is legitimately named `<ckpt>/.cascade-part.<node>`.)
#[test]
fn reserved_names_are_refused_from_clients() {
    let srv = Running::start();
    let reserved = [
        "ckpt/.cascade-complete",
        "x.cascade-complete",
        "ckpt/x.blake3",
        "ckpt/.cascade-part.node1",
        "ckpt/.x.cascade-version",
    ];
    for key in reserved {
        let file = |path: &str| PushFile {
            path: path.into(),
            size: 1,
            blake3: [0; 32],
        };
        for (k, body) in [
            (kind::WRITE, write_body(key, 1, b"forged")),
            (kind::PUSH, encode_push(key, false, &[file("f")])),
            (kind::PUSH, encode_push("ckpt", false, &[file(key)])),
        ] {
            let mut s = srv.raw_hello("job1");
            send(&mut s, k, 21, &body);
            send(&mut s, kind::SYNC, 22, &[]);
            let (id, message) = expect_error(&mut s, code::BAD_PATH);
            assert_eq!(id, 21, "{key:?} kind {k}: {message}");
            assert!(message.contains("reserved"), "{message}");
            assert_closed(&mut s);
        }
    }
    let mut c = srv.client("", TIMEOUT);
    assert_eq!(c.status().unwrap().absorbed_files, 0);
    for key in reserved {
        assert_eq!(
            c.read(&format!("job1/{key}"), 0, 9, &mut Vec::new())
                .unwrap(),
            None
        );
    }
    srv.assert_serves();
    srv.stop();
}

#[test]
fn only_hello_is_accepted_first() {
    let srv = Running::start();
    for (k, body) in [
        (kind::PING, Vec::new()),
        (kind::STATUS, Vec::new()),
        (kind::SYNC, Vec::new()),
        (kind::READ, encode_read("a", 0, 1)),
        (kind::WRITE, write_body("first", 1, b"x")),
        (kind::PULL, encode_pull(&[(PullKind::File, "a")])),
        (kind::GOODBYE, Vec::new()),
        (kind::LACKS, protocol::encode_scores(&[[1; 32]])),
        (kind::PUT_CHUNKS, chunks_body(&[hello_chunk()])),
        (kind::GET_CHUNKS, protocol::encode_scores(&[[1; 32]])),
        (kind::GET_MANIFEST, protocol::encode_get_manifest("c")),
        (kind::HELLO | kind::REPLY, Vec::new()),
        (kind::ERROR, Vec::new()),
        (0x42, Vec::new()),
    ] {
        let mut s = srv.raw();
        send(&mut s, k, 77, &body);
        let (id, message) = expect_error(&mut s, code::AUTH);
        assert_eq!(id, 77);
        assert!(message.contains("Hello"), "{message}");
        assert_closed(&mut s);
    }
    let mut c = srv.client("", TIMEOUT);
    assert_eq!(c.read("first", 0, 1, &mut Vec::new()).unwrap(), None);
    srv.assert_serves();
    srv.stop();
}

#[test]
fn oversized_bodies_are_refused_before_they_are_read() {
    let srv = Running::start();
    let too_big = [MAX_BODY as u32 + 1, u32::MAX];
    // Before Hello and after it, for a Write (the kind allowed the largest body): the
    // header alone is answered (the body is never sent).
    for len in too_big {
        let mut s = srv.raw();
        let _ = s.write_all(&raw_header(
            &protocol::MAGIC,
            protocol::VERSION,
            kind::HELLO,
            len,
            3,
        ));
        let (id, message) = expect_error(&mut s, code::BAD_FRAME);
        assert_eq!(id, 0, "a frame error is answered with request id 0");
        assert!(message.contains("exceeds"), "{message}");
        assert_closed(&mut s);

        let mut s = srv.raw_hello("");
        let _ = s.write_all(&raw_header(
            &protocol::MAGIC,
            protocol::VERSION,
            kind::WRITE,
            len,
            3,
        ));
        expect_error(&mut s, code::BAD_FRAME);
        assert_closed(&mut s);
    }
    // Frames other than Write and Push are limited to 64 KiB.
    let mut s = srv.raw();
    let h = raw_header(
        &protocol::MAGIC,
        protocol::VERSION,
        kind::HELLO,
        SMALL_BODY as u32 + 1,
        4,
    );
    let _ = s.write_all(&h);
    assert_eq!(expect_error(&mut s, code::BAD_FRAME).0, 4);
    assert_closed(&mut s);
    for k in [kind::PING, kind::READ, kind::PULL, kind::STATUS, 0x42] {
        let mut s = srv.raw_hello("");
        let _ = s.write_all(&raw_header(
            &protocol::MAGIC,
            protocol::VERSION,
            k,
            MAX_BODY as u32,
            5,
        ));
        let (id, message) = expect_error(&mut s, code::BAD_FRAME);
        assert_eq!(id, 5);
        assert!(message.contains("too large"), "{message}");
        assert_closed(&mut s);
    }
    // ... but exactly 64 KiB is read and decoded (and refused here as a malformed Pull).
    let mut s = srv.raw_hello("");
    send(&mut s, kind::PULL, 6, &vec![0u8; SMALL_BODY]);
    assert_eq!(expect_error(&mut s, code::BAD_FRAME).0, 6);
    assert_closed(&mut s);
    srv.assert_serves();
    srv.stop();
}

#[test]
fn bad_magic_and_garbage_are_refused() {
    let srv = Running::start();
    let mut garbage = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        garbage.push(x as u8);
    }
    let inputs: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: stage1\r\n\r\n",
        &garbage,
        &raw_header(b"CSTH", 1, kind::HELLO, 0, 1),
        &raw_header(b"\0\0\0\0", 0, 0, 0, 0),
    ];
    for authenticated in [false, true] {
        for input in inputs {
            let mut s = if authenticated {
                srv.raw_hello("")
            } else {
                srv.raw()
            };
            let _ = s.write_all(input);
            let (id, message) = expect_error(&mut s, code::BAD_FRAME);
            assert_eq!(id, 0);
            assert!(message.contains("magic"), "{message}");
            assert_closed(&mut s);
        }
    }
    // Less than a header, then end of stream: no reply, the server just closes.
    let mut s = srv.raw();
    s.write_all(b"CSTG\x01").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(recv(&mut s).is_none(), "a reply to half a header");
    srv.assert_serves();
    srv.stop();
}

#[test]
fn other_versions_are_refused() {
    let srv = Running::start();
    for version in [0u8, 1, 3, 0xff] {
        for authenticated in [false, true] {
            let mut s = if authenticated {
                srv.raw_hello("")
            } else {
                srv.raw()
            };
            let _ = s.write_all(&raw_header(&protocol::MAGIC, version, kind::HELLO, 0, 8));
            // Read the reply's header by hand: it is in this server's version, 2.
            let mut h = [0u8; HEADER_LEN];
            s.read_exact(&mut h).unwrap();
            assert_eq!(&h[0..6], b"CSTG\x02\xff", "{h:02x?}");
            let body_len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
            let mut body = vec![0; body_len];
            s.read_exact(&mut body).unwrap();
            match Reply::decode(kind::ERROR, &body).unwrap() {
                Reply::Error { code, message } => {
                    assert_eq!(code, code::VERSION);
                    assert!(message.contains(&format!("version {version}")), "{message}");
                }
                other => panic!("{other:?}"),
            }
            assert_closed(&mut s);
        }
    }
    srv.assert_serves();
    srv.stop();
}

#[test]
fn paths_escaping_the_namespace_are_refused() {
    let srv = Running::start();
    let bad_keys = [
        "../x",
        "/etc/passwd",
        "a//b",
        "a/../../x",
        "./x",
        "x/.",
        "..",
        "",
        "x\0y",
        "x\ny",
    ];
    for key in bad_keys {
        // Through the client library: the refusal surfaces at the next Sync.
        let mut c = srv.client("job1", TIMEOUT);
        let data = b"escape";
        c.write(&[OutSegment {
            key,
            stamp: 1,
            size: data.len() as u64,
            offset: 0,
            seal: Some(Seal::untagged(digest(data))),
            data: &[data],
        }])
        .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        match c.sync() {
            Err(Error::Refused { code, message, .. }) => {
                assert_eq!(code, code::BAD_PATH, "{key:?}: {message}")
            }
            other => panic!("{key:?}: {other:?}"),
        }

        // Raw: Write, Read, Push (checkpoint and file) and Pull all refuse it and close.
        let file = |path: &str| PushFile {
            path: path.into(),
            size: 1,
            blake3: [0; 32],
        };
        for (k, body) in [
            (kind::WRITE, write_body(key, 1, b"escape")),
            (kind::READ, encode_read(key, 0, 10)),
            (kind::PUSH, encode_push(key, false, &[file("f")])),
            (kind::PUSH, encode_push("ckpt", false, &[file(key)])),
            (kind::PULL, encode_pull(&[(PullKind::File, key)])),
            (kind::PULL, encode_pull(&[(PullKind::Checkpoint, key)])),
        ] {
            let mut s = srv.raw_hello("job1");
            send(&mut s, k, 21, &body);
            let (id, message) = expect_error(&mut s, code::BAD_PATH);
            assert_eq!(id, 21, "{key:?} kind {k}");
            assert!(message.contains("bad path"), "{message}");
            assert_closed(&mut s);
        }
        // A Hello whose namespace escapes.
        if !key.is_empty() {
            let mut s = srv.raw();
            send(&mut s, kind::HELLO, 1, &encode_hello("raw", key, &[1; 32]));
            expect_error(&mut s, code::BAD_PATH);
            assert_closed(&mut s);
        }
    }
    // Nothing was staged, inside the namespace or out of it, and nothing reached the disk
    // outside the server's directories.
    let mut c = srv.client("", TIMEOUT);
    for key in [
        "x",
        "job1/x",
        "etc/passwd",
        "job1/etc/passwd",
        "a/b",
        "job1/a/b",
    ] {
        assert_eq!(c.read(key, 0, 10, &mut Vec::new()).unwrap(), None, "{key}");
    }
    assert_eq!(c.status().unwrap().absorbed_files, 0);
    let stray: Vec<_> = files_below(srv.dir.path())
        .into_iter()
        .filter(|p| !p.starts_with(srv.dir.path().join("arenas")))
        .filter(|p| !p.starts_with(&srv.durable))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    assert!(files_below(&srv.durable).iter().all(|p| p
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with('.')));
    srv.assert_serves();
    srv.stop();
}

#[test]
fn truncated_frames_do_not_disturb_other_clients() {
    let srv = Running::start();
    // A Write announcing 1 MiB that stops after 1000 bytes: the server holds a receive
    // buffer for it while it waits.
    let mut stalled = srv.raw_hello("stall");
    let mut w = BodyWriter::default();
    w.u32(1);
    encode_segment_header(
        &mut w,
        "big",
        1,
        1 << 20,
        0,
        1 << 20,
        Some(&Seal::untagged([0; 32])),
    );
    let announced = w.buf.len() + (1 << 20);
    stalled
        .write_all(&raw_header(
            &protocol::MAGIC,
            protocol::VERSION,
            kind::WRITE,
            announced as u32,
            9,
        ))
        .unwrap();
    stalled.write_all(&w.buf).unwrap();
    stalled.write_all(&[7u8; 1000]).unwrap();
    // A Hello that stops halfway, and half a header.
    let mut half_hello = srv.raw();
    let hello = frame(kind::HELLO, 1, &encode_hello("half", "", &[1; 32]));
    half_hello.write_all(&hello[..hello.len() - 3]).unwrap();
    let mut half_header = srv.raw_hello("");
    half_header.write_all(&hello[..7]).unwrap();

    // Meanwhile others are served.
    srv.assert_serves();
    let mut c = srv.client("other", TIMEOUT);
    write_file(&mut c, "f", 1, b"while others stall");
    c.sync().unwrap();

    // The stalled clients go away mid-frame.
    drop(stalled);
    drop(half_hello);
    drop(half_header);
    srv.assert_serves();
    let mut out = Vec::new();
    assert!(c.read("f", 0, 100, &mut out).unwrap().is_some());
    assert_eq!(out, b"while others stall");
    let mut root = srv.client("", TIMEOUT);
    assert_eq!(root.read("stall/big", 0, 10, &mut out).unwrap(), None);

    // Of a connection that goes away mid-frame, what it sealed in complete frames stays
    // readable; a version it never sealed never is.
    let mut s = srv.raw_hello("partial");
    let mut w = BodyWriter::default();
    w.u32(2);
    encode_segment_header(&mut w, "open", 1, 8, 0, 4, None);
    encode_segment_header(
        &mut w,
        "done",
        1,
        4,
        0,
        4,
        Some(&tagged("partial", "done", 1, 4, digest(b"done"))),
    );
    w.bytes(b"half").bytes(b"done");
    send(&mut s, kind::WRITE, 2, &w.buf);
    send(&mut s, kind::SYNC, 3, &[]);
    let (h, _) = recv(&mut s).unwrap();
    assert_eq!((h.kind, h.request), (kind::SYNC | kind::REPLY, 3));
    // Half of a second Write, then the connection goes.
    let mut w2 = BodyWriter::default();
    w2.u32(1);
    encode_segment_header(&mut w2, "open", 1, 8, 4, 4, Some(&Seal::untagged([1; 32])));
    let mut second = frame(kind::WRITE, 4, &w2.buf);
    second.extend_from_slice(b"ha");
    let fixed = second.len() + 2;
    second[8..12].copy_from_slice(&((fixed - HEADER_LEN) as u32).to_le_bytes());
    s.write_all(&second).unwrap();
    drop(s);
    assert_eq!(
        root.read("partial/open", 0, 10, &mut out).unwrap(),
        None,
        "an unsealed version became readable"
    );
    assert!(root
        .read("partial/done", 0, 10, &mut out)
        .unwrap()
        .is_some());
    assert_eq!(out, b"done");
    srv.stop();
}

#[test]
fn second_hello_and_unknown_kinds_close_the_connection() {
    let srv = Running::start();
    for (k, body) in [
        (kind::HELLO, encode_hello("again", "", &[1; 32])),
        (kind::AUTH, vec![0; 32]),
        (kind::PING | kind::REPLY, Vec::new()),
        (kind::ERROR, Vec::new()),
        (0x00, Vec::new()),
        (0x42, Vec::new()),
    ] {
        let mut s = srv.raw_hello("");
        send(&mut s, k, 31, &body);
        assert_eq!(expect_error(&mut s, code::BAD_FRAME).0, 31);
        assert_closed(&mut s);
    }
    // Malformed bodies: trailing bytes, a segment past its size, data shorter or longer
    // than the descriptors, a bad seal flag, a count the body cannot hold.
    let mut past_size = BodyWriter::default();
    past_size.u32(1);
    encode_segment_header(&mut past_size, "a", 1, 2, 1, 4, None);
    past_size.bytes(b"abcd");
    let mut short = write_body("a", 1, b"abcd");
    short.pop();
    let mut long = write_body("a", 1, b"abcd");
    long.push(0);
    let mut bad_seal = write_body("a", 1, b"abcd");
    bad_seal[4 + 2 + 1 + 28] = 2;
    for (k, body) in [
        (kind::PING, vec![0u8]),
        (kind::SYNC, vec![1, 2, 3]),
        (kind::READ, {
            let mut b = encode_read("a", 0, 1);
            b.push(0);
            b
        }),
        (kind::READ, encode_read("a", 0, u32::MAX)),
        (kind::WRITE, past_size.buf),
        (kind::WRITE, short),
        (kind::WRITE, long),
        (kind::WRITE, bad_seal),
        (kind::WRITE, BodyWriter::default().u32(65_536).buf.clone()),
        (
            kind::PULL,
            BodyWriter::default().u32(1).u8(9).str("a").buf.clone(),
        ),
    ] {
        let mut s = srv.raw_hello("");
        send(&mut s, k, 32, &body);
        assert_eq!(expect_error(&mut s, code::BAD_FRAME).0, 32, "kind {k}");
        assert_closed(&mut s);
    }
    srv.assert_serves();
    srv.stop();
}

#[test]
fn write_failures_are_reported_by_the_next_sync() {
    let srv = Running::start();
    // A seal before all the bytes arrived, and a resend with another size: the Writes are
    // well formed, so they are queued unanswered; the engine's refusal is the Sync's answer.
    let mut s = srv.raw_hello("");
    let mut w = BodyWriter::default();
    w.u32(1);
    let seal = tagged("", "holey", 1, 10, [0; 32]);
    encode_segment_header(&mut w, "holey", 1, 10, 0, 5, Some(&seal));
    w.bytes(b"hello");
    send(&mut s, kind::WRITE, 41, &w.buf);
    send(&mut s, kind::WRITE, 42, &write_body("later", 1, b"skipped"));
    send(&mut s, kind::SYNC, 43, &[]);
    let (id, message) = expect_error(&mut s, code::INVALID);
    assert_eq!(id, 43, "the Sync's request id");
    assert!(message.contains("never received"), "{message}");
    assert_closed(&mut s);

    let mut c = srv.client("", TIMEOUT);
    write_file(&mut c, "sized", 1, b"12345");
    c.sync().unwrap();
    write_file(&mut c, "sized", 1, b"123456");
    match c.sync() {
        Err(Error::Refused { code, .. }) => assert_eq!(code, code::INVALID),
        other => panic!("{other:?}"),
    }
    let mut c = srv.client("", TIMEOUT);
    let mut out = Vec::new();
    assert_eq!(c.read("holey", 0, 10, &mut out).unwrap(), None);
    assert_eq!(c.read("later", 0, 10, &mut out).unwrap(), None);
    assert!(c.read("sized", 0, 10, &mut out).unwrap().is_some());
    assert_eq!(out, b"12345");
    srv.stop();
}

#[test]
fn unknown_keys_are_not_found_and_the_connection_stays() {
    let srv = Running::start();
    let mut c = srv.client("job3", TIMEOUT);
    assert_eq!(c.read("nope", 0, 10, &mut Vec::new()).unwrap(), None);
    c.ping().unwrap();
    assert_eq!(c.read("nope/deeper", 5, 0, &mut Vec::new()).unwrap(), None);
    c.ping().unwrap();

    let mut s = srv.raw_hello("job3");
    send(&mut s, kind::READ, 0xdead_beef, &encode_read("nope", 0, 10));
    let (id, message) = expect_error(&mut s, code::NOT_FOUND);
    assert_eq!(id, 0xdead_beef);
    assert!(message.contains("job3/nope"), "{message}");
    send(&mut s, kind::PING, 0xfeed, &[]);
    let (h, body) = recv(&mut s).unwrap();
    assert_eq!(
        (h.kind, h.request, body.len()),
        (kind::PING | kind::REPLY, 0xfeed, 0)
    );
    send(&mut s, kind::GOODBYE, 3, &[]);
    let (h, _) = recv(&mut s).unwrap();
    assert_eq!(h.kind, kind::GOODBYE | kind::REPLY);
    assert_closed(&mut s);
    srv.stop();
}

#[test]
fn a_good_client_writes_syncs_reads_and_pulls() {
    let srv = Running::start();
    let mut c = srv.client("job7", TIMEOUT);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 255) as u8).collect();
    let sum = digest(&data);
    let (a, b) = data.split_at(100_000);
    let (b1, b2) = b.split_at(50_000);
    // Two frames: the first two pieces (one segment from two slices), then the sealed rest.
    let seal = c.seal("ckpt.1/rank0.dat", 5, data.len() as u64, sum);
    c.write(&[OutSegment {
        key: "ckpt.1/rank0.dat",
        stamp: 5,
        size: data.len() as u64,
        offset: 0,
        seal: None,
        data: &[a, b1],
    }])
    .unwrap();
    c.write(&[OutSegment {
        key: "ckpt.1/rank0.dat",
        stamp: 5,
        size: data.len() as u64,
        offset: 150_000,
        seal: Some(seal),
        data: &[b2],
    }])
    .unwrap();
    write_file(&mut c, "ckpt.1/meta.json", 5, b"{}");
    c.sync().unwrap();

    let mut out = Vec::new();
    let meta = c.read("ckpt.1/rank0.dat", 0, 1 << 20, &mut out).unwrap();
    let meta = meta.unwrap();
    assert_eq!((meta.stamp, meta.size, meta.blake3), (5, 300_000, sum));
    assert!(out == data, "read back different bytes");
    c.read("ckpt.1/rank0.dat", 299_990, 100, &mut out).unwrap();
    assert_eq!(out, &data[299_990..]);
    c.read("ckpt.1/rank0.dat", 400_000, 100, &mut out).unwrap();
    assert!(out.is_empty());

    // The namespace is a prefix: visible under job7/ without one, not under another.
    let mut root = srv.client("", TIMEOUT);
    root.read("job7/ckpt.1/meta.json", 0, 10, &mut out).unwrap();
    assert_eq!(out, b"{}");
    assert_eq!(
        srv.client("job8", TIMEOUT)
            .read("ckpt.1/meta.json", 0, 10, &mut out)
            .unwrap(),
        None
    );

    // Acknowledged means at least staged (the drain may already have copied it).
    let st = level_of(&mut c, PullKind::File, "ckpt.1/rank0.dat");
    assert!(matches!(st.level, Level::Staged | Level::Durable), "{st:?}");
    assert_eq!((st.stamp, st.size, st.blake3), (5, 300_000, sum));
    let states = c
        .pull(&[
            (PullKind::File, "ckpt.1/nothing"),
            (PullKind::Checkpoint, "ckpt.1"),
        ])
        .unwrap();
    assert!(states.iter().all(|s| s.level == Level::Unknown));

    // A checkpoint listing a file that is nowhere stays Staged.
    let ghost = PushFile {
        path: "ghost.dat".into(),
        size: 1,
        blake3: [9; 32],
    };
    c.push("ckpt.0", false, &[ghost]).unwrap();
    assert_eq!(
        level_of(&mut c, PullKind::Checkpoint, "ckpt.0").level,
        Level::Staged
    );
    // One whose files are staged becomes Durable, marker written, once they drained.
    let files = [
        PushFile {
            path: "rank0.dat".into(),
            size: data.len() as u64,
            blake3: sum,
        },
        PushFile {
            path: "meta.json".into(),
            size: 2,
            blake3: digest(b"{}"),
        },
    ];
    c.push("ckpt.1", false, &files).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let st = level_of(&mut c, PullKind::Checkpoint, "ckpt.1");
        if st.level == Level::Durable {
            break;
        }
        assert_eq!(st.level, Level::Staged);
        assert!(Instant::now() < deadline, "ckpt.1 never became durable");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        level_of(&mut c, PullKind::File, "ckpt.1/rank0.dat").level,
        Level::Durable
    );
    let ckpt = srv.durable.join("job7/ckpt.1");
    assert!(std::fs::read(ckpt.join("rank0.dat")).unwrap() == data);
    assert!(ckpt.join(".cascade-complete").is_file());
    assert_eq!(
        level_of(&mut c, PullKind::Checkpoint, "ckpt.0").level,
        Level::Staged
    );

    // Status parses and counts what happened.
    let status = c.status().unwrap();
    assert_eq!(status.listen, srv.addr.to_string());
    assert_eq!(status.instance, c.instance());
    assert_eq!(status.absorbed_files, 2);
    assert_eq!(status.absorbed_bytes, 300_002);
    assert_eq!(status.markers, 1);
    assert!(status.clients >= 2, "{status:?}");
    assert_eq!(status.refused_clients, 0);
    assert_eq!(status.pid, std::process::id());
    c.goodbye();
    srv.stop();
}

#[test]
fn pipelined_requests_are_answered_in_order_with_their_ids() {
    let srv = Running::start();
    // The handshake cannot be pipelined (the proof needs the server's nonce): after it,
    // everything can.
    let mut s = srv.raw_hello("p");
    let mut burst = Vec::new();
    for i in 0..20u32 {
        burst.extend(frame(
            kind::WRITE,
            101 + i,
            &write_body_in("p", &format!("f{i}"), 1, format!("data {i}").as_bytes()),
        ));
    }
    burst.extend(frame(kind::SYNC, 200, &[]));
    burst.extend(frame(kind::READ, 201, &encode_read("f19", 0, 100)));
    burst.extend(frame(kind::STATUS, 202, &[]));
    burst.extend(frame(kind::PING, 203, &[]));
    s.write_all(&burst).unwrap();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let (h, body) = recv(&mut s).unwrap();
        let reply = Reply::decode(h.kind, &body).unwrap();
        match &reply {
            Reply::ReadOk { data, .. } => assert_eq!(*data, b"data 19"),
            Reply::StatusOk(json) => {
                let st: cascade_staging::ServerStatus = serde_json::from_str(json).unwrap();
                assert_eq!(st.absorbed_files, 20);
            }
            Reply::SyncOk | Reply::Pong => {}
            other => panic!("{other:?}"),
        }
        answers.push((h.kind, h.request));
    }
    let r = kind::REPLY;
    assert_eq!(
        answers,
        [
            (kind::SYNC | r, 200),
            (kind::READ | r, 201),
            (kind::STATUS | r, 202),
            (kind::PING | r, 203)
        ]
    );
    srv.stop();
}

#[test]
fn a_stopping_server_says_so() {
    let srv = Running::start();
    let mut s = srv.raw_hello("");
    srv.stop();
    // The connection thread checks before reading each request: it may have seen the stop
    // already, else it answers this Ping first.
    send(&mut s, kind::PING, 9, &[]);
    let (mut h, mut body) = recv(&mut s).unwrap();
    if h.kind == kind::PING | kind::REPLY {
        assert_eq!(h.request, 9);
        (h, body) = recv(&mut s).unwrap();
    }
    assert_eq!((h.kind, h.request), (kind::ERROR, 0));
    assert!(matches!(
        Reply::decode(h.kind, &body),
        Ok(Reply::Error { code, .. }) if code == code::SHUTTING_DOWN
    ));
    assert_closed(&mut s);
}

#[test]
fn malformed_dedup_frames_are_refused_and_close_the_connection() {
    let srv = Running::start();
    let mut lying_count = protocol::encode_scores(&[[1; 32], [2; 32]]);
    lying_count[0] = 3;
    let mut short_chunk = chunks_body(&[hello_chunk()]);
    short_chunk.pop();
    let mut raw_len_lie = chunks_body(&[hello_chunk()]);
    raw_len_lie[4 + 34] = 6;
    let mut bad_bits = protocol::encode_lacks_ok(&[true]);
    bad_bits[4] = 0xff;
    let cases: Vec<(u8, Vec<u8>, u16, &str)> = vec![
        (
            kind::LACKS,
            lying_count.clone(),
            code::BAD_FRAME,
            "scores need",
        ),
        (
            kind::GET_CHUNKS,
            lying_count,
            code::BAD_FRAME,
            "scores need",
        ),
        (kind::LACKS, bad_bits, code::BAD_FRAME, ""),
        (kind::PUT_CHUNKS, short_chunk, code::BAD_FRAME, "shorter"),
        (kind::PUT_CHUNKS, raw_len_lie, code::BAD_FRAME, "raw chunk"),
        (
            kind::PUT_MANIFEST,
            manifest_body(0, "cdc:avg=64KiB", "../x"),
            code::BAD_PATH,
            "bad path",
        ),
        (
            kind::GET_MANIFEST,
            protocol::encode_get_manifest("/etc"),
            code::BAD_PATH,
            "bad path",
        ),
        // Well formed, but refused by the server.
        (
            kind::PUT_MANIFEST,
            manifest_body(1, "cdc:avg=64KiB", "c"),
            code::INVALID,
            "without part 0",
        ),
        (
            kind::PUT_MANIFEST,
            manifest_body(0, "cdc:avg=3", "c"),
            code::INVALID,
            "chunking",
        ),
        (
            kind::PUT_CHUNKS,
            chunks_body(&[protocol::WireChunk {
                data: b"jello",
                ..hello_chunk()
            }]),
            code::BAD_CHUNK,
            "hash to",
        ),
    ];
    for (k, body, want, says) in cases {
        let mut s = srv.raw_hello("dd");
        send(&mut s, k, 51, &body);
        let (id, message) = expect_error(&mut s, want);
        assert_eq!(id, 51, "kind {k:#x}");
        assert!(message.contains(says), "kind {k:#x}: {message}");
        assert_closed(&mut s);
    }
    // GetManifest is a small frame: more than 64 KiB is refused from its header; the large
    // dedup kinds are bounded by MAX_BODY like Write.
    let mut s = srv.raw_hello("");
    let _ = s.write_all(&raw_header(
        &protocol::MAGIC,
        protocol::VERSION,
        kind::GET_MANIFEST,
        SMALL_BODY as u32 + 1,
        52,
    ));
    assert!(expect_error(&mut s, code::BAD_FRAME)
        .1
        .contains("too large"));
    assert_closed(&mut s);
    let mut s = srv.raw_hello("");
    let _ = s.write_all(&raw_header(
        &protocol::MAGIC,
        protocol::VERSION,
        kind::PUT_CHUNKS,
        MAX_BODY as u32 + 1,
        53,
    ));
    expect_error(&mut s, code::BAD_FRAME);
    assert_closed(&mut s);
    // A Lacks of 65 536 scores (2 MiB, past the small-frame limit) is answered.
    let mut s = srv.raw_hello("dd");
    let many: Vec<[u8; 32]> = (0..65_536u32).map(|i| digest(&i.to_le_bytes())).collect();
    send(&mut s, kind::LACKS, 54, &protocol::encode_scores(&many));
    let (h, body) = recv(&mut s).unwrap();
    assert_eq!((h.kind, h.request), (kind::LACKS | kind::REPLY, 54));
    match Reply::decode(h.kind, &body).unwrap() {
        Reply::LacksOk(flags) => assert!(flags.len() == 65_536 && flags.iter().all(|f| *f)),
        other => panic!("{other:?}"),
    }
    // Nothing of it was stored, and the server still serves.
    let mut c = srv.client("dd", TIMEOUT);
    assert_eq!(c.lacks(&[digest(b"hello")]).unwrap(), [true]);
    let st = c.status().unwrap();
    assert_eq!((st.dedup.chunks_absorbed, st.dedup.refused_chunks), (0, 1));
    assert_eq!(st.dedup.pending_manifests, 0);
    srv.assert_serves();
    srv.stop();
}
