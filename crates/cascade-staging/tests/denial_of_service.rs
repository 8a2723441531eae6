//! A real staging server against clients that try to tie it up (issue 22, finding 6; docs/
//! security.md, "Staging servers"): clients that send a frame a byte at a time, that connect
//! and send nothing, that do not read their replies, and many connections from one address.
//! Hostile clients connect from 127.0.0.2 and up (all of 127/8 is loopback on Linux), the
//! well-behaved `Connection` from 127.0.0.1, so the per-address cap is the hostile ones'.
//! Synchronisation is by replies and by polling the server's status with deadlines; the
//! only pauses are a dripping client's pace between its bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cascade_staging::auth::JobKey;
use cascade_staging::client::OutSegment;
use cascade_staging::protocol::{
    code, encode_read, encode_segment_header, kind, read_frame, write_frame, BodyWriter, Header,
    Reply, Seal, HEADER_LEN,
};
use cascade_staging::{Connection, ServerOptions, ServerStatus};
use cascade_testkit::stage_server::{raw_auth_frame, raw_hello_frame};
use common::{poll_status, InProcessServer, SECRET};

mod common;

/// How long a condition may take on a loaded machine before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// The tests of this file run one at a time: one measures this process's memory, and each
/// is timed against crowds of its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn my_turn() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server of these tests: two receive buffers, few enough to exhaust.
type Running = InProcessServer;

impl InProcessServer {
    fn start(tune: impl FnOnce(&mut ServerOptions)) -> Running {
        Running::bind(2, |o, _| tune(o))
    }

    /// The well-behaved client (namespace `good`, from 127.0.0.1).
    fn good_client(&self) -> Connection {
        self.client("good", DEADLINE)
    }

    fn status(&self) -> ServerStatus {
        self.good_client().status().unwrap()
    }

    /// The status asked from `ip` over a raw connection: polling it does not take the good
    /// client's address's connections.
    fn status_from(&self, ip: &str) -> ServerStatus {
        let mut s = self.hello_from(ip, None);
        s.write_all(&frame(kind::STATUS, 2, &[])).unwrap();
        let (h, body) = recv(&mut s).expect("no StatusOk");
        match Reply::decode(h.kind, &body) {
            Ok(Reply::StatusOk(json)) => serde_json::from_str(json).unwrap(),
            other => panic!("{other:?} instead of StatusOk"),
        }
    }

    /// Polls the status until `cond` holds; fails the test after [`DEADLINE`].
    fn wait_for(&self, what: &str, cond: impl Fn(&ServerStatus) -> bool) -> ServerStatus {
        poll_status(what, DEADLINE, || self.status(), cond)
    }

    /// A raw stream from `ip` (a 127/8 address), its receive buffer cut to `rcvbuf` if given.
    fn raw_from(&self, ip: &str, rcvbuf: Option<usize>) -> TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        s.bind(&local.into()).unwrap();
        if let Some(n) = rcvbuf {
            s.set_recv_buffer_size(n).unwrap();
        }
        s.connect_timeout(&self.addr.into(), DEADLINE).unwrap();
        let s: TcpStream = s.into();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.set_write_timeout(Some(DEADLINE)).unwrap();
        s
    }

    /// A raw stream from `ip` past a good Hello (no namespace: it may read the good
    /// client's files). Refused BUSY, it tries again: the address's last connection may
    /// still be closing on the server's side.
    fn hello_from(&self, ip: &str, rcvbuf: Option<usize>) -> TcpStream {
        let start = Instant::now();
        loop {
            let mut s = self.raw_from(ip, rcvbuf);
            s.write_all(&raw_hello_frame("raw", "")).unwrap();
            let (h, body) = recv(&mut s).expect("no Challenge");
            if h.kind == kind::ERROR {
                let refused = Reply::decode(h.kind, &body);
                assert!(
                    matches!(
                        refused,
                        Ok(Reply::Error {
                            code: code::BUSY,
                            ..
                        })
                    ) && start.elapsed() < DEADLINE,
                    "{refused:?}"
                );
                std::thread::yield_now();
                continue;
            }
            assert_eq!((h.kind, h.request), (kind::HELLO | kind::REPLY, 1));
            s.write_all(&raw_auth_frame(&body, &JobKey::derive(SECRET, ""), ""))
                .unwrap();
            let (h, _) = recv(&mut s).expect("no AuthOk");
            assert_eq!((h.kind, h.request), (kind::AUTH | kind::REPLY, 2));
            return s;
        }
    }
}

fn digest(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
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

/// A Write of one sealed version (stamp 1), tagged with the key of the empty namespace (the
/// one raw connections here authenticate for).
fn write_body(key: &str, data: &[u8]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(1);
    let blake3 = digest(data);
    let tag = JobKey::derive(SECRET, "").version_tag(key, 1, data.len() as u64, &blake3);
    let seal = Seal { blake3, tag };
    encode_segment_header(
        &mut w,
        key,
        1,
        data.len() as u64,
        0,
        data.len() as u32,
        Some(&seal),
    );
    w.bytes(data);
    w.buf
}

/// Writes, syncs and reads back `data` as `key`; how long that took.
fn round_trip(c: &mut Connection, key: &str, data: &[u8]) -> Duration {
    let start = Instant::now();
    let seal = c.seal(key, 1, data.len() as u64, digest(data));
    c.write(&[OutSegment {
        key,
        stamp: 1,
        size: data.len() as u64,
        offset: 0,
        seal: Some(seal),
        data: &[data],
    }])
    .unwrap();
    c.sync().unwrap();
    let mut out = Vec::new();
    c.read(key, 0, data.len() as u32, &mut out)
        .unwrap()
        .expect("staged");
    assert!(out == data, "{key} read back differently");
    start.elapsed()
}

/// Whether the server closed `s` (end of stream or reset), reading within `wait`; what it
/// sent before is skipped.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Sends `bytes` one at a time, one every `pace` (waiting for the server to close meanwhile);
/// how long until the server closed the connection, or None if it never did while the
/// bytes lasted.
fn drip(s: &mut TcpStream, bytes: &[u8], pace: Duration) -> Option<Duration> {
    let start = Instant::now();
    for b in bytes {
        if s.write_all(std::slice::from_ref(b)).is_err() || closed_within(s, pace) {
            return Some(start.elapsed());
        }
    }
    None
}

#[test]
fn a_frame_sent_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let _turn = my_turn();
    let timeout = Duration::from_secs(1);
    let srv = Running::start(|o| {
        o.frame_timeout = timeout;
        o.hello_timeout = timeout;
    });
    let pace = Duration::from_millis(100);
    // Each frame takes 100 ms a byte: far longer than the 1 s deadline, while no single read
    // waits more than 100 ms.
    let hello = raw_hello_frame("drip", "evil");
    let write = frame(kind::WRITE, 2, &write_body("f", &[7u8; 200]));
    let cases: [(&str, bool, &[u8]); 3] = [
        ("a Hello", false, &hello),
        ("a frame header", true, &write[..HEADER_LEN]),
        ("a Write body", true, &write),
    ];
    for (what, after_hello, bytes) in cases {
        let mut s = if after_hello {
            srv.hello_from("127.0.0.2", None)
        } else {
            srv.raw_from("127.0.0.2", None)
        };
        if what == "a Write body" {
            s.write_all(&bytes[..HEADER_LEN]).unwrap();
        }
        let bytes = if what == "a Write body" {
            &bytes[HEADER_LEN..]
        } else {
            bytes
        };
        let closed = drip(&mut s, bytes, pace);
        let Some(after) = closed else {
            panic!("{what} dripped a byte per {pace:?} kept its connection for good");
        };
        assert!(
            after < timeout + Duration::from_secs(5),
            "{what}: {after:?}"
        );
    }
    // `clients` counts the status connection itself.
    let s = srv.wait_for("three connections timed out", |s| {
        s.timed_out_clients >= 3 && s.clients == 1
    });
    assert_eq!(s.absorbed_files, 0, "{s:?}");
    // Between frames a connection may idle: an agent's keeps its connection open.
    let mut c = srv.good_client();
    std::thread::sleep(timeout * 2); // the idle time itself is what is tested
    round_trip(&mut c, "after-idle", b"still here");
    srv.stop();
}

#[test]
fn connections_over_the_caps_are_refused_busy() {
    let _turn = my_turn();
    let srv = Running::start(|o| {
        o.max_connections = 8;
        o.max_connections_per_client = 3;
    });
    let busy = |s: &mut TcpStream| {
        // Whatever it sends, the server answers BUSY before reading anything.
        let _ = s.write_all(&raw_hello_frame("x", "evil"));
        let (h, body) = recv(s).expect("closed without an Error frame");
        match Reply::decode(h.kind, &body) {
            Ok(Reply::Error { code: c, message }) => {
                assert_eq!((c, h.request), (code::BUSY, 0), "{message}");
                message.to_string()
            }
            other => panic!("{other:?} instead of Error BUSY"),
        }
    };
    // Per client address: the fourth from 127.0.0.2 is refused, others are not.
    let mut held: Vec<TcpStream> = (0..3).map(|_| srv.hello_from("127.0.0.2", None)).collect();
    let msg = busy(&mut srv.raw_from("127.0.0.2", None));
    assert!(msg.contains("127.0.0.2"), "{msg}");
    let mut good = srv.good_client();
    round_trip(&mut good, "per-client", b"served");
    // One of them goes: its slot is free again (once its thread has ended).
    drop(held.pop());
    let start = Instant::now();
    loop {
        let mut s = srv.raw_from("127.0.0.2", None);
        s.write_all(&raw_hello_frame("x", "evil")).unwrap();
        let (h, _) = recv(&mut s).expect("closed without a reply");
        if h.kind == kind::HELLO | kind::REPLY {
            held.push(s);
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the slot never came back");
        std::thread::yield_now();
    }
    // In total: 3 + 3 + the good client + a status connection = 8; a ninth is refused.
    held.extend((0..3).map(|_| srv.hello_from("127.0.0.3", None)));
    let mut status_conn = srv.good_client();
    let msg = busy(&mut srv.raw_from("127.0.0.4", None));
    assert!(msg.contains("limit"), "{msg}");
    let s = status_conn.status().unwrap();
    assert!(s.busy_refusals >= 2, "{s:?}");
    drop(held);
    drop(status_conn);
    // And the good client's connection was never disturbed.
    round_trip(&mut good, "total", b"served");
    // The good client and the status connection.
    srv.wait_for("the slots are free", |s| s.clients == 2);
    drop(good);
    srv.stop();
}

/// Staged by the good client: what the stalled readers ask for (more than the socket
/// buffers between them and the server hold).
const BIG: usize = 16 << 20;

/// `n` clients from 127.0.0.2.. with tiny receive buffers that Read `key` whole, take the
/// reply's first bytes (so the server is sending it) and then read no more.
fn stalled_readers(srv: &Running, n: usize, key: &str) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let ip = format!("127.0.0.{}", 2 + i);
            let mut s = srv.hello_from(&ip, Some(4096));
            s.write_all(&frame(kind::READ, 2, &encode_read(key, 0, BIG as u32)))
                .unwrap();
            let mut head = [0u8; HEADER_LEN];
            s.read_exact(&mut head).unwrap();
            assert_eq!(head[5], kind::READ | kind::REPLY, "{head:?}");
            s
        })
        .collect()
}

fn big_file() -> Vec<u8> {
    (0..BIG).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn clients_that_do_not_read_their_replies_hold_no_receive_buffer() {
    let _turn = my_turn();
    // A deadline far beyond the test's bound: it is not what lets the good client through.
    let srv = Running::start(|o| o.frame_timeout = Duration::from_secs(120));
    let mut good = srv.good_client();
    round_trip(&mut good, "big", &big_file());
    // More stalled readers than receive buffers.
    let stalled = stalled_readers(&srv, 3, "good/big");
    let took = round_trip(&mut good, "meanwhile", &[5u8; 1 << 20]);
    assert!(
        took < Duration::from_secs(5),
        "a write waited {took:?} behind clients that do not read"
    );
    // A new client too.
    round_trip(&mut srv.good_client(), "new", &[6u8; 1 << 20]);
    drop(stalled);
    srv.stop();
}

/// This process's resident memory, from /proc/self/status.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib << 10
}

#[test]
fn a_reply_not_taken_holds_a_piece_of_it_not_all_of_it() {
    let _turn = my_turn();
    let srv = Running::start(|o| o.frame_timeout = Duration::from_secs(120));
    let mut good = srv.good_client();
    round_trip(&mut good, "big", &big_file());
    let before = resident_bytes();
    // Sixteen replies of 16 MiB not taken: 256 MiB if each were held whole.
    let stalled = stalled_readers(&srv, 16, "good/big");
    round_trip(&mut good, "meanwhile", b"served");
    let grew = resident_bytes().saturating_sub(before);
    eprintln!("{} KiB more resident", grew >> 10);
    assert!(
        grew < 64 << 20,
        "{} MiB more resident with 16 replies not taken",
        grew >> 20
    );
    drop(stalled);
    srv.stop();
}

#[test]
fn a_reply_not_taken_within_the_deadline_closes_the_connection() {
    let _turn = my_turn();
    let srv = Running::start(|o| o.frame_timeout = Duration::from_secs(1));
    let mut good = srv.good_client();
    round_trip(&mut good, "big", &big_file());
    let stalled = stalled_readers(&srv, 2, "good/big");
    srv.wait_for("the stalled readers were cut off", |s| {
        s.timed_out_clients >= 2 && s.clients == 2
    });
    drop(stalled);
    round_trip(&mut good, "after", b"served");
    srv.stop();
}

#[test]
fn a_well_behaved_client_is_served_through_a_hostile_crowd() {
    let _turn = my_turn();
    // Two seconds: a loaded machine's fsync stays well under it.
    let timeout = Duration::from_secs(2);
    let srv = Arc::new(Running::start(|o| {
        o.frame_timeout = timeout;
        o.hello_timeout = timeout;
        o.max_connections = 64;
        o.max_connections_per_client = 4;
    }));
    let mut good = srv.good_client();
    round_trip(&mut good, "big", &big_file());
    let stop = Arc::new(AtomicBool::new(false));
    let attacks = Arc::new(AtomicU64::new(0));
    let mut crowd = Vec::new();
    let spawn =
        |crowd: &mut Vec<JoinHandle<()>>, what: &'static str, f: Box<dyn Fn(&Running) + Send>| {
            let (srv, stop, attacks) = (srv.clone(), stop.clone(), attacks.clone());
            crowd.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let t = Instant::now();
                    f(&srv);
                    eprintln!("{what}: {:?}", t.elapsed());
                    attacks.fetch_add(1, Ordering::SeqCst);
                }
            }));
        };
    let pace = Duration::from_millis(50);
    for i in 0..4 {
        // Write frames dripped a byte at a time, from four addresses (a receive buffer
        // each while the body drips).
        let ip = format!("127.0.0.{}", 10 + i);
        spawn(
            &mut crowd,
            "drip",
            Box::new(move |srv| {
                let mut s = srv.hello_from(&ip, None);
                let write = frame(kind::WRITE, 2, &write_body("drip", &[1u8; 4096]));
                s.write_all(&write[..HEADER_LEN + 8]).unwrap();
                drip(&mut s, &write[HEADER_LEN + 8..], pace);
            }),
        );
        // Connections that never send anything.
        spawn(
            &mut crowd,
            "silent",
            Box::new(|srv| {
                let mut s = srv.raw_from("127.0.0.20", None);
                closed_within(&mut s, DEADLINE);
            }),
        );
        // Readers that stop reading their replies.
        let ip = format!("127.0.0.{}", 30 + i);
        spawn(
            &mut crowd,
            "stalled reader",
            Box::new(move |srv| {
                // Held, unread, until the server has cut off a client meanwhile (reading
                // what it sent before would take long through a 4 KiB window).
                let before = srv.status_from(&ip).timed_out_clients;
                let _s = stalled_readers_from(srv, &ip, "good/big");
                let start = Instant::now();
                while srv.status_from(&ip).timed_out_clients <= before {
                    assert!(start.elapsed() < DEADLINE, "nobody is cut off");
                }
            }),
        );
    }
    // Many connections from one address, most refused.
    spawn(
        &mut crowd,
        "many",
        Box::new(|srv| {
            let mut held: Vec<TcpStream> =
                (0..16).map(|_| srv.raw_from("127.0.0.40", None)).collect();
            for s in &mut held {
                let _ = s.write_all(&raw_hello_frame("x", "evil"));
            }
            for s in &mut held {
                closed_within(s, Duration::from_millis(200));
            }
        }),
    );
    // Rounds go on until every kind of attack has been met a few times.
    let mut worst = Duration::ZERO;
    let start = Instant::now();
    let mut round = 0u32;
    loop {
        let data = vec![round as u8; 256 << 10];
        worst = worst.max(round_trip(&mut good, &format!("round{round}"), &data));
        // A new client is admitted and served too. A name of its own each time: a Write of
        // a name and stamp the server already holds is a resend of that version, which may
        // have drained and be reclaimed by the time it is read back.
        if round % 5 == 0 {
            let fresh = format!("fresh{round}");
            worst = worst.max(round_trip(&mut srv.good_client(), &fresh, b"fresh"));
            let s = srv.status();
            if round >= 20 && s.timed_out_clients >= 16 && s.busy_refusals >= 8 {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE * 3,
                "the attacks never got going: {s:?}"
            );
        }
        round += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let s = srv.status();
    let joining = Instant::now();
    for t in crowd {
        t.join().unwrap();
    }
    eprintln!(
        "worst round {worst:?} of {round}; joined in {:?}",
        joining.elapsed()
    );
    assert!(attacks.load(Ordering::SeqCst) > 0);
    // The bound: nothing the crowd does makes the good client wait for a receive buffer,
    // a thread or a connection slot. A round takes well under 0.1 s unloaded, the frame
    // timeout leaves room for a loaded machine; a round that waited for a buffer a dripping
    // client held would take about one.
    assert!(worst < timeout, "a round took {worst:?}; {s:?}");
    drop(good);
    Arc::try_unwrap(srv).ok().expect("threads joined").stop();
}

/// One stalled reader from `ip`.
fn stalled_readers_from(srv: &Running, ip: &str, key: &str) -> TcpStream {
    let mut s = srv.hello_from(ip, Some(4096));
    s.write_all(&frame(kind::READ, 2, &encode_read(key, 0, BIG as u32)))
        .unwrap();
    let mut head = [0u8; HEADER_LEN];
    let _ = s.read_exact(&mut head);
    s
}

/// The settings reach the server: `cascade stage-server --max-connections-per-client 2
/// --frame-timeout 1`, a real process.
#[test]
fn the_command_line_sets_the_caps_and_the_deadline() {
    let _turn = my_turn();
    let env = cascade_testkit::node::Env::without_store("stage-dos-cli");
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let srv = cascade_testkit::stage_server::StageServer::start(
        &env,
        &env.tmp.path().join("ssd"),
        durable.to_str().unwrap(),
        SECRET,
        &["--max-connections-per-client", "2", "--frame-timeout", "1"],
    );
    let addr: SocketAddr = srv.addr.parse().unwrap();
    let raw = |ip: &str| {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let local: SocketAddr = format!("{ip}:0").parse().unwrap();
        s.bind(&local.into()).unwrap();
        s.connect_timeout(&addr.into(), DEADLINE).unwrap();
        let mut s: TcpStream = s.into();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        s.write_all(&raw_hello_frame("cli", "")).unwrap();
        let (h, body) = recv(&mut s).expect("closed without a reply");
        (s, h, body)
    };
    let (mut first, h1, _) = raw("127.0.0.2");
    let (_second, h2, _) = raw("127.0.0.2");
    assert_eq!(
        (h1.kind, h2.kind),
        (kind::HELLO | kind::REPLY, kind::HELLO | kind::REPLY)
    );
    let (_, h3, body) = raw("127.0.0.2");
    match Reply::decode(h3.kind, &body) {
        Ok(Reply::Error { code: c, .. }) => assert_eq!(c, code::BUSY),
        other => panic!("{other:?} instead of Error BUSY"),
    }
    // A frame header dripped a byte per 100 ms is cut off after about a second.
    let header = frame(kind::PING, 2, &[]);
    match drip(
        &mut first,
        &header[..HEADER_LEN],
        Duration::from_millis(100),
    ) {
        Some(after) => assert!(after < Duration::from_secs(6), "{after:?}"),
        None => panic!("a dripped header kept its connection"),
    }
    let s = srv.status();
    assert!(s.busy_refusals >= 1 && s.timed_out_clients >= 1, "{s:?}");
}

/// The worst a client with the secret can do to the receive buffers: send the start of a
/// large body at once, then nothing, and again once cut off. With as many such clients as
/// buffers, a writer waits at most about one frame timeout per Write: the server cuts them
/// off at the deadline and hands buffers out first come first served.
#[test]
fn clients_that_stall_a_large_body_delay_a_writer_by_at_most_the_frame_timeout() {
    let _turn = my_turn();
    let timeout = Duration::from_secs(1);
    let srv = Arc::new(Running::start(|o| o.frame_timeout = timeout));
    let stop = Arc::new(AtomicBool::new(false));
    let stallers: Vec<JoinHandle<()>> = (0..2)
        .map(|i| {
            let (srv, stop) = (srv.clone(), stop.clone());
            std::thread::spawn(move || {
                let write = frame(kind::WRITE, 2, &write_body("stall", &vec![2u8; 1 << 20]));
                while !stop.load(Ordering::SeqCst) {
                    let mut s = srv.hello_from(&format!("127.0.0.{}", 50 + i), None);
                    s.write_all(&write[..HEADER_LEN + (128 << 10)]).unwrap();
                    closed_within(&mut s, DEADLINE);
                }
            })
        })
        .collect();
    srv.wait_for("the stallers were cut off", |s| s.timed_out_clients >= 2);
    let mut good = srv.good_client();
    let mut worst = Duration::ZERO;
    for round in 0..8 {
        worst = worst.max(round_trip(
            &mut good,
            &format!("r{round}"),
            &[round as u8; 1 << 16],
        ));
    }
    stop.store(true, Ordering::SeqCst);
    for t in stallers {
        t.join().unwrap();
    }
    eprintln!("worst round {worst:?}");
    assert!(worst < timeout * 3, "a round took {worst:?}");
    drop(good);
    Arc::try_unwrap(srv).ok().expect("threads joined").stop();
}
