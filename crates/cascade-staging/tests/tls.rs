//! TLS on the staging data path (docs/staging-protocol.md, "Transport"): a real server on
//! 127.0.0.1 with real rustls on both ends and certificates made by rcgen. A TLS client
//! round-trips data; a client trusting another CA, a plain-TCP client at a TLS server and a
//! TLS client at a plain server each get one clear line within their timeouts while the
//! server keeps serving others; what crosses the wire is not the data in clear (checked
//! through a recording relay, and the same relay shows the data in clear without TLS).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cascade_staging::client::OutSegment;
use cascade_staging::{ClientOptions, Connection, ServerOptions};
use cascade_testkit::TestPki;
use cascade_wire::tls;
use common::{InProcessServer, SECRET};

mod common;

/// Long enough for a loaded CI machine, short enough that a hang fails the test.
const TIMEOUT: Duration = Duration::from_secs(30);

struct Running {
    server: InProcessServer,
    pki: TestPki,
}

impl std::ops::Deref for Running {
    type Target = InProcessServer;
    fn deref(&self) -> &InProcessServer {
        &self.server
    }
}

impl Running {
    /// A server with TLS (`tls`) or without, its Hello timeout `hello_timeout`.
    fn start(tls: bool, hello_timeout: Duration) -> Running {
        Running::start_tuned(tls, hello_timeout, |_| {})
    }

    fn start_tuned(
        tls: bool,
        hello_timeout: Duration,
        tune: impl FnOnce(&mut ServerOptions),
    ) -> Running {
        let mut pki = None;
        let server = InProcessServer::bind(3, |opts, dir| {
            let made = TestPki::generate(dir);
            opts.hello_timeout = hello_timeout;
            if tls {
                opts.tls = Some(tls::server_config(&made.cert, &made.key).expect("server config"));
            }
            tune(opts);
            pki = Some(made);
        });
        Running {
            server,
            pki: pki.expect("certificates made"),
        }
    }

    fn options(&self, trust: Option<&PathBuf>) -> ClientOptions {
        let mut o = ClientOptions::new(SECRET);
        o.io_timeout = TIMEOUT;
        o.tls = trust.map(|ca| tls::client_config(ca).expect("client config"));
        o
    }

    /// A client trusting the server's CA.
    fn tls_client(&self) -> Connection {
        Connection::connect(&self.addr.to_string(), &self.options(Some(&self.pki.ca)))
            .expect("TLS client connects")
    }

    /// A fresh client (TLS if `tls`) can still write, sync and read back.
    fn assert_serves(&self, tls: bool) {
        let trust = tls.then_some(&self.pki.ca);
        let mut c = Connection::connect(&self.addr.to_string(), &self.options(trust))
            .expect("a good client connects");
        round_trip(&mut c, "probe", b"still serving");
        c.goodbye();
    }

    fn stop(self) {
        self.server.stop();
    }
}

/// Writes `data` as version 1 of `key`, syncs, reads it back and checks it.
fn round_trip(c: &mut Connection, key: &str, data: &[u8]) {
    let seal = c.seal(key, 1, data.len() as u64, *blake3::hash(data).as_bytes());
    // Several Write frames, so a file spans TLS records and frames alike.
    let piece = 4 << 20;
    let mut offset = 0;
    loop {
        let end = (offset + piece).min(data.len());
        let last = end == data.len();
        c.write(&[OutSegment {
            key,
            stamp: 1,
            size: data.len() as u64,
            offset: offset as u64,
            seal: last.then_some(seal),
            data: &[&data[offset..end]],
        }])
        .expect("write");
        if last {
            break;
        }
        offset = end;
    }
    c.sync().expect("sync");
    let mut out = Vec::new();
    let meta = c
        .read(key, 0, data.len() as u32, &mut out)
        .expect("read")
        .expect("the server has the key");
    assert!(out == data, "{key}: read back other bytes");
    assert_eq!(meta.blake3, seal.blake3);
}

/// Bytes that cannot be in a TLS record by chance.
fn canary(len: usize) -> Vec<u8> {
    b"CASCADE-CANARY-IN-CLEAR "
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

#[test]
fn a_tls_client_writes_syncs_and_reads_back() {
    let server = Running::start(true, TIMEOUT);
    let mut c = server.tls_client();
    round_trip(&mut c, "small", b"hello over TLS");
    // A ReadOk larger than the server's read piece (256 KiB) is sent piece by piece.
    let big = cascade_testkit::pattern(9 << 20, 7);
    round_trip(&mut c, "big", &big);
    assert_eq!(c.ping().map(|_| ()).ok(), Some(()));
    let status = c.status().expect("status");
    assert_eq!(status.refused_clients, 0);
    // A session's binding is its own: another connection exports another.
    let first = c.transport().channel_binding().expect("a TLS binding");
    let other = server.tls_client();
    let second = other.transport().channel_binding().expect("a TLS binding");
    assert_ne!(first, second);
    other.goodbye();
    c.goodbye();
    server.stop();
}

#[test]
fn a_client_trusting_another_ca_is_refused_with_one_clear_line() {
    let server = Running::start(true, TIMEOUT);
    let started = Instant::now();
    let err = Connection::connect(
        &server.addr.to_string(),
        &server.options(Some(&server.pki.other_ca)),
    )
    .err()
    .expect("a certificate from an unknown CA is refused")
    .to_string();
    assert!(started.elapsed() < TIMEOUT, "took {:?}", started.elapsed());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "staging server {}: TLS handshake failed: ",
            server.addr
        )),
        "{err}"
    );
    assert!(
        err.contains("invalid peer certificate: UnknownIssuer") && err.contains("staging.tls_ca"),
        "{err}"
    );
    server.assert_serves(true);
    server.stop();
}

#[test]
fn a_plain_client_at_a_tls_server_gets_a_clear_error_and_others_are_served() {
    let server = Running::start(true, Duration::from_secs(2));
    let started = Instant::now();
    let err = Connection::connect(&server.addr.to_string(), &server.options(None))
        .err()
        .expect("a plain client is refused")
        .to_string();
    assert!(started.elapsed() < TIMEOUT, "took {:?}", started.elapsed());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("requires TLS") && err.contains("staging.tls_ca"),
        "{err}"
    );

    // A client that stalls the TLS handshake is cut off at the Hello timeout, and a good
    // client is served meanwhile.
    let mut stalled = TcpStream::connect(server.addr).expect("connect");
    stalled
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout");
    stalled
        .write_all(&[22, 3, 1])
        .expect("a record header's start");
    let stalled_at = Instant::now();
    server.assert_serves(true);
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    let waited = stalled_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < TIMEOUT,
        "cut off after {waited:?}"
    );
    let status = server.tls_client().status().expect("status");
    assert!(status.timed_out_clients >= 1, "{status:?}");
    assert!(status.refused_clients >= 1, "{status:?}");
    server.stop();
}

#[test]
fn a_tls_client_at_a_plain_server_gets_a_clear_error_and_others_are_served() {
    let server = Running::start(false, TIMEOUT);
    let started = Instant::now();
    let err = Connection::connect(
        &server.addr.to_string(),
        &server.options(Some(&server.pki.ca)),
    )
    .err()
    .expect("a TLS client at a plain server fails")
    .to_string();
    assert!(started.elapsed() < TIMEOUT, "took {:?}", started.elapsed());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains("does not speak TLS"), "{err}");
    server.assert_serves(false);
    server.stop();
}

#[test]
fn a_tls_server_at_its_connection_limit_closes_new_connections() {
    let server = Running::start_tuned(true, TIMEOUT, |o| o.max_connections_per_client = 1);
    let held = server.tls_client();
    let started = Instant::now();
    let err = Connection::connect(
        &server.addr.to_string(),
        &server.options(Some(&server.pki.ca)),
    )
    .err()
    .expect("one connection too many")
    .to_string();
    assert!(started.elapsed() < TIMEOUT, "took {:?}", started.elapsed());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("TLS handshake failed") && err.contains("connection limit"),
        "{err}"
    );
    held.goodbye();
    // The held connection's slot is freed once its thread ends.
    let options = server.options(Some(&server.pki.ca));
    let mut c = cascade_testkit::poll(TIMEOUT, || {
        Connection::connect(&server.addr.to_string(), &options).ok()
    })
    .expect("served again once the held connection closed");
    assert!(c.status().expect("status").busy_refusals >= 1);
    c.goodbye();
    server.stop();
}

/// A TCP relay for one connection that records what the client sends.
struct Relay {
    addr: SocketAddr,
    thread: JoinHandle<Vec<u8>>,
}

impl Relay {
    fn to(server: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let thread = std::thread::spawn(move || {
            let (client, _) = listener.accept().expect("accept");
            let upstream = TcpStream::connect(server).expect("connect upstream");
            for s in [&client, &upstream] {
                s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            }
            let (mut down_from, mut down_to) = (
                upstream.try_clone().expect("clone"),
                client.try_clone().expect("clone"),
            );
            let back = std::thread::spawn(move || {
                let _ = std::io::copy(&mut down_from, &mut down_to);
                let _ = down_to.shutdown(Shutdown::Write);
            });
            let mut recorded = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            let (mut from, mut to) = (&client, &upstream);
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        recorded.extend_from_slice(&buf[..n]);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = upstream.shutdown(Shutdown::Write);
            let _ = back.join();
            recorded
        });
        Relay { addr, thread }
    }

    fn recorded(self) -> Vec<u8> {
        self.thread.join().expect("relay thread")
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn bytes_on_the_wire_are_not_the_data_in_clear() {
    let payload = canary(256 << 10);
    let probe = &payload[..4096];
    for tls in [true, false] {
        let server = Running::start(tls, TIMEOUT);
        let relay = Relay::to(server.addr);
        let trust = tls.then_some(&server.pki.ca);
        // The relay's address is 127.0.0.1 too, which the certificate names.
        let mut c = Connection::connect(&relay.addr.to_string(), &server.options(trust))
            .expect("connect through the relay");
        round_trip(&mut c, "canary", &payload);
        c.goodbye();
        let wire = relay.recorded();
        assert!(wire.len() > payload.len(), "{} bytes relayed", wire.len());
        assert_eq!(
            contains(&wire, probe),
            !tls,
            "TLS {tls}: the payload in clear on the wire"
        );
        // The handshake never sends the secret, with or without TLS.
        assert!(!contains(&wire, SECRET.as_bytes()), "TLS {tls}: the secret");
        server.stop();
    }
}
