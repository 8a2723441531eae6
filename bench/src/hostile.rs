//! `cascade-bench hostile`: a staging server (L1) under hostile clients for a fixed time,
//! against the same well-behaved clients without them (issue 22). Writes hostile.md and
//! hostile.json. See bench/README.md, "The hostile-client soak".
//!
//! The server is `cascade_staging::Server` (the code of `cascade stage-server`, with its
//! defaults) in a process of its own: this executable's hidden `stage-server` subcommand,
//! started and stopped like the staging suite's servers (`procs::StageServer`), so that its
//! RSS and threads are its own. Its arenas and the directory it drains to are in
//! `--arena-dir` (local disk).
//!
//! Four phases of `--seconds` each: baseline (the well-behaved clients alone), attack (the
//! same clients with every attacker at once), attack again (does the server's memory grow
//! with attack traffic, or did the first attack only warm it?), baseline after (drift;
//! `--no-after` skips it).
//! - Well-behaved clients (`--clients`, from 127.0.0.1, a job credential of namespace
//!   `job-a`) loop: write a file of 4 KiB..4 MiB (log-uniform) under a fresh stamp, Sync,
//!   read it back and check bytes, size, stamp and BLAKE3. Each client cycles over 16 keys.
//!   At the end every key's last acknowledged version is read back (from the server, or from
//!   the durable tier once drained) and checked.
//! - Attackers, in threads of this process, each counting what it tried and how the server
//!   answered: slow clients (a byte every 100 ms), stalled readers (Reads of a 16 MiB file,
//!   replies never read), forged names (reserved names, path escapes, another namespace's
//!   credential), replayed handshakes (a real client's Hello and Auth bytes, recorded through
//!   a relay), fuzz (valid frames from the protocol encoders, mutated; before and after the
//!   handshake), and a connection flood up to the per-address cap from 127.0.0.60 and up.
//!   Every attacker's random choices come from one seed (printed, `--seed`).
//! - After the run, every key a forged or replayed write named is read with a cluster-secret
//!   client (all must be NOT_FOUND), and the durable tier must hold nothing outside the
//!   well-behaved clients' keys and the hostile tenant's own namespace.

use crate::format::num;
use crate::procs::{clean_cmd, tail, StageServer};
use crate::report::{self, machine_table, Header, Md, RunClock, Table};
use crate::util::{err, fill_pattern, prefix, size_str, Context, Res, KIB, MIB};
use cascade_durable::DurableStore;
use cascade_staging::{Server, ServerOptions};
use cascade_testkit::stage_server::{raw_auth_frame, raw_frame, raw_hello_frame};
use cascade_wire::auth::{Credential, JobKey};
use cascade_wire::client::OutSegment;
use cascade_wire::protocol::{
    self, code, encode_get_manifest, encode_pull, encode_push, encode_read, encode_scores,
    encode_segment_header, kind, BodyWriter, Header as FrameHeader, PullKind, PushFile, Reply,
    Seal, HEADER_LEN, MAX_BODY, MAX_DATA,
};
use cascade_wire::{ClientOptions, Connection, ServerStatus};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The well-behaved clients' namespace (the victim job).
const NS_GOOD: &str = "job-a";
/// A hostile tenant's namespace that must stay empty: only forgeries name it.
const NS_FORGER: &str = "job-b";
/// The hostile tenant's own namespace, where its valid writes may land.
const NS_HOSTILE: &str = "job-h";
/// Keys each well-behaved client cycles over.
const KEYS: u64 = 16;
/// The stalled readers' file, in the hostile namespace.
const BIG_KEY: &str = "big";
const BIG: usize = 16 << 20;
/// Reads each stalled reader sends without reading a reply.
const STALLED_READS: u32 = 32;
/// One byte per this, for the slow clients.
const DRIP: Duration = Duration::from_millis(100);

/// The attackers (`--attackers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attacker {
    /// Slow clients: a byte every 100 ms.
    Slow,
    /// Stalled readers: Reads whose replies are never read.
    Stalled,
    /// Forged names, path escapes, another namespace's credential.
    Forged,
    /// Replayed handshakes.
    Replay,
    /// Mutated frames, before and after the handshake.
    Fuzz,
    /// A connection flood up to the per-address cap.
    Flood,
}

/// The options (`cascade-bench hostile --help`).
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct HOpts {
    /// Directory for hostile.md and hostile.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: 10 s phases. Explicit flags override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Seconds of each phase (baseline, attack, attack again, baseline after).
    #[arg(long, default_value_t = 60, default_value_if("quick", "true", "10"))]
    pub seconds: u64,
    /// Seed of every random choice (sizes, attacks, mutations); a random one by default.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Well-behaved clients (threads, one connection each).
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Directory on local disk for the server's arenas and the durable tier it drains to.
    #[arg(long, default_value = "/var/tmp")]
    pub arena_dir: PathBuf,
    /// The server's frame timeout in seconds (`stage_server.frame_timeout`, 60 s by
    /// default; a Hello gets at most 10 s). Shorter here, so that every deadline passes
    /// several times within a phase.
    #[arg(long, default_value_t = 20)]
    pub frame_timeout_s: u64,
    /// The server's cap on connections from one address
    /// (`stage_server.max_connections_per_client`).
    #[arg(long, default_value_t = 64)]
    pub per_client_cap: usize,
    /// The server's memory for received files kept for the drain (`stage_server.drain_memory`,
    /// 2 GiB by default), MiB. Smaller here: up to this much stays resident as spare receive
    /// buffers once the good writers have filled it (by design, docs/security.md), and the
    /// memory check's ceiling counts it.
    #[arg(long, default_value_t = 128)]
    pub drain_memory_mib: u64,
    /// The attackers of the attack phases.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "slow,stalled,forged,replay,fuzz,flood"
    )]
    pub attackers: Vec<Attacker>,
    /// Slow clients dripping frames.
    #[arg(long, default_value_t = 8)]
    pub drippers: usize,
    /// Stalled readers held open at once.
    #[arg(long, default_value_t = 16)]
    pub stalled: usize,
    /// Addresses of the connection flood (127.0.0.60 and up), each up to the cap.
    #[arg(long, default_value_t = 4)]
    pub flood_addrs: usize,
    /// Fuzz connections per second at most.
    #[arg(long, default_value_t = 50)]
    pub fuzz_rate: u64,
    /// Check: well-behaved p99 under attack at most this many times the baseline's.
    #[arg(long, default_value_t = 5.0)]
    pub p99_factor: f64,
    /// Check: the second attack phase adds at most this many MiB to the server's RSS (once
    /// its attackers are gone), and its RSS never exceeds the receive buffers + the read
    /// cache + twice this.
    #[arg(long, default_value_t = 32)]
    pub rss_bound_mib: u64,
    /// Attack phases, one after the other (the memory check compares them).
    #[arg(long, default_value_t = 2)]
    pub attack_phases: usize,
    /// Skip the last phase (baseline after).
    #[arg(long)]
    pub no_after: bool,
    #[arg(skip)]
    pub seed_used: u64,
}

/// The hidden `stage-server` subcommand: `cascade_staging::Server` as `cascade stage-server`
/// runs it (its defaults), with the arguments `procs::StageServer` passes.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Accepted for `procs::StageServer`'s command line; the server stays quiet (a log line
    /// per refused connection would be much of its work under attack).
    #[arg(short = 'v')]
    verbose: bool,
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    listen: String,
    #[arg(long = "drain-to")]
    drain_to: String,
    #[arg(long, default_value_t = 60_000)]
    frame_timeout_ms: u64,
    #[arg(long, default_value_t = 64)]
    max_connections_per_client: usize,
    #[arg(long, default_value_t = 2048)]
    drain_memory_mib: u64,
}

/// Runs the server until killed (SIGTERM). The secret comes from CASCADE_STAGING_SECRET.
pub fn serve(a: ServeArgs) -> Res<()> {
    // As `cascade stage-server` does.
    cascade_staging::server::limit_malloc_arenas();
    let _ = a.verbose;
    let secret = std::env::var("CASCADE_STAGING_SECRET").unwrap_or_default();
    let mut o = ServerOptions::new(&a.listen, a.dir, &a.drain_to, &secret);
    o.frame_timeout = Duration::from_millis(a.frame_timeout_ms.max(100));
    o.hello_timeout = o.frame_timeout.min(Duration::from_secs(10));
    o.max_connections_per_client = a.max_connections_per_client.max(1);
    o.drain_memory = a.drain_memory_mib << 20;
    let server = Server::bind(o).ctx(|| "starting the staging server")?;
    eprintln!(
        "cascade stage-server: listening on {} (pid {})",
        server.local_addr(),
        std::process::id()
    );
    server.run().ctx(|| "staging server")
}

// ---------------------------------------------------------------------------------------------
// Raw connections of the attackers.

/// A stream from `ip` (a 127/8 address) to the server, its receive buffer cut to `rcvbuf`.
fn raw_from(ip: Ipv4Addr, to: SocketAddr, rcvbuf: Option<usize>) -> io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(ip, 0)).into())?;
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    let s: TcpStream = s.into();
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

fn send(s: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    protocol::NoSigPipe(s).write_all(bytes)
}

/// What the server did in answer, as far as a client can tell.
enum Answer {
    Frame(FrameHeader, Vec<u8>),
    /// A clean end of stream.
    Closed,
    /// Nothing within the wait.
    Silent,
    /// Reset, or a broken frame.
    Broken(String),
}

/// Reads one frame, waiting at most `wait` for it to begin.
fn answer(s: &TcpStream, wait: Duration) -> Answer {
    if s.set_read_timeout(Some(wait)).is_err() {
        return Answer::Broken("socket".into());
    }
    let mut body = Vec::new();
    match protocol::read_frame(&mut &*s, &mut body) {
        Ok(Some(h)) => {
            body.truncate(h.body_len as usize);
            Answer::Frame(h, body)
        }
        Ok(None) => Answer::Closed,
        Err(protocol::RecvError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Answer::Silent
        }
        Err(protocol::RecvError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
            Answer::Broken("reset".into())
        }
        Err(e) => Answer::Broken(format!("broken ({e})")),
    }
}

fn code_name(c: u16) -> String {
    let name = match c {
        code::BAD_FRAME => "BAD_FRAME",
        code::VERSION => "VERSION",
        code::AUTH => "AUTH",
        code::BAD_PATH => "BAD_PATH",
        code::NOT_FOUND => "NOT_FOUND",
        code::FULL => "FULL",
        code::IO => "IO",
        code::CORRUPT => "CORRUPT",
        code::INVALID => "INVALID",
        code::SHUTTING_DOWN => "SHUTTING_DOWN",
        code::BAD_CHUNK => "BAD_CHUNK",
        code::BASE_UNKNOWN => "BASE_UNKNOWN",
        code::BUSY => "BUSY",
        other => return format!("error {other}"),
    };
    name.to_string()
}

fn kind_name(k: u8) -> String {
    let name = match k & !kind::REPLY {
        kind::HELLO => "Challenge",
        kind::WRITE => "WriteOk",
        kind::SYNC => "SyncOk",
        kind::READ => "ReadOk",
        kind::PUSH => "PushOk",
        kind::PULL => "PullOk",
        kind::PING => "Pong",
        kind::GOODBYE => "GoodbyeOk",
        kind::STATUS => "StatusOk",
        kind::LACKS => "LacksOk",
        kind::PUT_CHUNKS => "PutChunksOk",
        kind::PUT_MANIFEST => "PutManifestOk",
        kind::GET_CHUNKS => "GetChunksOk",
        kind::GET_MANIFEST => "GetManifestOk",
        kind::AUTH => "AuthOk",
        _ => return format!("kind 0x{k:02x}"),
    };
    name.to_string()
}

/// "AUTH", "BAD_PATH", "SyncOk", "closed", "no answer", ...
fn answer_text(a: &Answer) -> String {
    match a {
        Answer::Frame(h, body) if h.kind == kind::ERROR => match Reply::decode(h.kind, body) {
            Ok(Reply::Error { code, .. }) => code_name(code),
            _ => "a garbled Error frame".into(),
        },
        Answer::Frame(h, _) => kind_name(h.kind),
        Answer::Closed => "closed".into(),
        Answer::Silent => "no answer".into(),
        Answer::Broken(why) => why.clone(),
    }
}

/// The Challenge's body, if `a` is one.
fn challenge(a: &Answer) -> Option<&[u8]> {
    match a {
        Answer::Frame(h, body)
            if h.kind == kind::HELLO | kind::REPLY
                && matches!(Reply::decode(h.kind, body), Ok(Reply::Challenge { .. })) =>
        {
            Some(body)
        }
        _ => None,
    }
}

/// A good handshake on a raw stream; Err(how the server answered instead).
fn handshake(s: &TcpStream, key: &JobKey, namespace: &str) -> Result<(), String> {
    send(s, &raw_hello_frame("hostile", namespace)).map_err(|e| format!("send: {}", e.kind()))?;
    let a = answer(s, Duration::from_secs(5));
    let Some(body) = challenge(&a) else {
        return Err(answer_text(&a));
    };
    send(s, &raw_auth_frame(body, key, namespace)).map_err(|e| format!("send: {}", e.kind()))?;
    match answer(s, Duration::from_secs(5)) {
        Answer::Frame(h, _) if h.kind == kind::AUTH | kind::REPLY => Ok(()),
        other => Err(answer_text(&other)),
    }
}

/// Whether a stream is still open: None if the server closed it (or sent something we did
/// not ask for), without blocking.
fn still_open(s: &TcpStream) -> Option<()> {
    s.set_nonblocking(true).ok()?;
    let r = s.peek(&mut [0u8; 1]);
    let _ = s.set_nonblocking(false);
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(()),
        _ => None,
    }
}

/// The body of a Write of one whole file, sealed with the tag of `tag_key` (the key of the
/// connection's namespace for a seal the server accepts).
fn write_body(tag_key: &JobKey, key: &str, stamp: u64, data: &[u8]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(1);
    let blake3 = *blake3::hash(data).as_bytes();
    let len = data.len() as u64;
    let seal = Seal {
        blake3,
        tag: tag_key.version_tag(key, stamp, len, &blake3),
    };
    encode_segment_header(&mut w, key, stamp, len, 0, len as u32, Some(&seal));
    w.bytes(data);
    w.buf
}

// ---------------------------------------------------------------------------------------------
// What the attackers tried and how the server answered.

/// One attacker's counts: per case, how often each answer came. `breaches` counts answers
/// that mean the server accepted what it must refuse.
#[derive(Default)]
struct Tally {
    tried: AtomicU64,
    answers: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    breaches: Mutex<Vec<String>>,
}

impl Tally {
    fn add(&self, case: &str, answer: &str) {
        self.tried.fetch_add(1, Ordering::Relaxed);
        let mut m = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(case.to_string())
            .or_default()
            .entry(answer.to_string())
            .or_default() += 1;
    }

    fn breach(&self, what: String) {
        let mut b = self.breaches.lock().unwrap_or_else(|p| p.into_inner());
        if b.len() < 20 {
            b.push(what);
        }
    }
}

/// What the attackers share.
struct Ctx {
    o: HOpts,
    addr: SocketAddr,
    secret: String,
    stop: AtomicBool,
    /// Keys (with their namespace) that a forged or replayed write named: none may be
    /// readable after the run.
    forged_keys: Mutex<BTreeSet<String>>,
    /// A real client's Hello and Auth frames, recorded through a relay.
    recorded: (Vec<u8>, Vec<u8>),
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `d` or until the attack ends.
    fn nap(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopped() {
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }

    fn key(&self, namespace: &str) -> JobKey {
        JobKey::derive(&self.secret, namespace)
    }

    fn forged(&self, key: String) {
        if protocol::check_key(&key).is_ok() {
            self.forged_keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key);
        }
    }
}

// (1) Slow clients: frames dripped one byte every 100 ms.

/// Sends `bytes` a byte at a time; Err(what happened) if the server cut it off or the attack
/// ended first.
fn drip(cx: &Ctx, s: &TcpStream, bytes: &[u8], started: Instant) -> Result<(), String> {
    for b in bytes {
        if cx.stopped() {
            return Err("still dripping when the attack ended".into());
        }
        if still_open(s).is_none() || send(s, &[*b]).is_err() {
            let a = answer(s, Duration::from_millis(100));
            let what = match a {
                Answer::Frame(..) => format!("answered {}", answer_text(&a)),
                _ => "closed".into(),
            };
            return Err(format!(
                "{what} by the server after ~{:.0} s",
                started.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(DRIP);
    }
    Ok(())
}

fn slow_client(cx: &Ctx, t: &Tally, mut rng: StdRng, ip: Ipv4Addr) {
    let key = cx.key(NS_HOSTILE);
    let mut n = 0u64;
    while !cx.stopped() {
        n += 1;
        let s = match raw_from(ip, cx.addr, None) {
            Ok(s) => s,
            Err(e) => {
                t.add("connect", &format!("failed: {}", e.kind()));
                cx.nap(Duration::from_millis(100));
                continue;
            }
        };
        let started = Instant::now();
        let (case, outcome) = match rng.gen_range(0..3) {
            0 => {
                let case = "Hello, then Auth, dripped";
                let out: Result<(), String> =
                    drip(cx, &s, &raw_hello_frame("slow", NS_HOSTILE), started).and_then(|()| {
                        let a = answer(&s, Duration::from_secs(2));
                        let body = challenge(&a).ok_or_else(|| answer_text(&a))?;
                        drip(cx, &s, &raw_auth_frame(body, &key, NS_HOSTILE), started)?;
                        Err(answer_text(&answer(&s, Duration::from_secs(2))))
                    });
                (case, out)
            }
            1 => {
                // 150 bytes of client name: longer than the 10 s a Hello may take.
                let case = "a long Hello, dripped";
                let name = "s".repeat(150);
                let out = drip(cx, &s, &raw_hello_frame(&name, NS_HOSTILE), started)
                    .and_then(|()| Err(answer_text(&answer(&s, Duration::from_secs(2)))));
                (case, out)
            }
            _ => {
                let case = "a Write dripped after the handshake";
                let out = handshake(&s, &key, NS_HOSTILE).and_then(|()| {
                    let body = write_body(&key, &format!("slow/{n}"), n, &[7u8; 1024]);
                    drip(cx, &s, &raw_frame(kind::WRITE, 3, &body), started)?;
                    Err("sent whole".into())
                });
                (case, out)
            }
        };
        t.add(case, &outcome.err().unwrap_or_default());
    }
}

// (2) Stalled readers: Reads of a large file, replies never read.

fn stalled_readers(cx: &Ctx, t: &Tally, ip: Ipv4Addr) {
    let key = cx.key(NS_HOSTILE);
    let mut reads = Vec::new();
    for i in 0..STALLED_READS {
        reads.extend(raw_frame(
            kind::READ,
            3 + i,
            &encode_read(BIG_KEY, 0, MAX_DATA as u32),
        ));
    }
    let ping = raw_frame(kind::PING, 1000, &[]);
    let mut held: Vec<TcpStream> = Vec::new();
    let case = "32 Reads of a 16 MiB file, replies never read";
    while !cx.stopped() {
        while held.len() < cx.o.stalled && !cx.stopped() {
            let s = match raw_from(ip, cx.addr, Some(4096)) {
                Ok(s) => s,
                Err(e) => {
                    t.add(case, &format!("connect failed: {}", e.kind()));
                    cx.nap(Duration::from_millis(200));
                    continue;
                }
            };
            if let Err(why) = handshake(&s, &key, NS_HOSTILE) {
                t.add(case, &format!("handshake: {why}"));
                cx.nap(Duration::from_millis(200));
                continue;
            }
            if let Err(e) = send(&s, &reads) {
                t.add(case, &format!("send failed: {}", e.kind()));
                continue;
            }
            // The first reply's header says what the server is stuck sending.
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut h = [0u8; HEADER_LEN];
            let first = match s.peek(&mut h) {
                Ok(HEADER_LEN) => FrameHeader::decode(&h).ok(),
                _ => None,
            };
            match first {
                Some(h) if h.kind == kind::READ | kind::REPLY => {
                    t.add(case, "held, stalled on a ReadOk");
                    held.push(s);
                }
                Some(_) => {
                    let a = answer(&s, Duration::from_secs(1));
                    let text = answer_text(&a);
                    if text == "NOT_FOUND" {
                        // Drained and reclaimed: write it again.
                        let _ = write_big(cx.addr, &cx.secret);
                    }
                    t.add(case, &text);
                }
                None => t.add(case, "no reply header within 2 s"),
            }
        }
        cx.nap(Duration::from_secs(1));
        // A connection the server cut off fails a write (one more request) soon after; its
        // replies are always pending, so a peek cannot tell.
        held.retain(|s| {
            let open = send(s, &ping).is_ok();
            if !open {
                t.add(case, "cut off by the server (replies not taken)");
            }
            open
        });
    }
}

/// Writes the stalled readers' file (hostile namespace), with a fresh stamp.
fn write_big(addr: SocketAddr, secret: &str) -> cascade_wire::Result<()> {
    static STAMP: AtomicU64 = AtomicU64::new(1);
    let mut opts = ClientOptions::with(Credential::Job(JobKey::derive(secret, NS_HOSTILE)));
    opts.namespace = NS_HOSTILE.into();
    let mut c = Connection::connect(&addr.to_string(), &opts)?;
    let mut data = vec![0u8; BIG];
    fill_pattern(&mut data, 0xb16);
    let stamp = STAMP.fetch_add(1, Ordering::SeqCst);
    let seal = c.seal(BIG_KEY, stamp, BIG as u64, *blake3::hash(&data).as_bytes());
    c.write(&[OutSegment {
        key: BIG_KEY,
        stamp,
        size: BIG as u64,
        offset: 0,
        seal: Some(seal),
        data: &[data.as_slice()],
    }])?;
    c.sync()?;
    c.goodbye();
    Ok(())
}

// (3) Forged names.

/// Reserved names of the durable layout, in the forger's own namespace.
const RESERVED: &[&str] = &[
    "ckpt/.cascade-complete",
    "x.blake3",
    "ckpt/.cascade-part.n",
    "ckpt/.x.cascade-version",
    "ckpt.cascade-complete",
];
/// Keys that try to leave the namespace, and the keys they would land on.
const ESCAPES: &[(&str, &[&str])] = &[
    ("../x", &["x"]),
    ("/etc/passwd", &["etc/passwd", "job-b/etc/passwd"]),
    ("a/../../job-a/escaped", &["job-a/escaped"]),
    ("./x", &["job-b/x"]),
    ("a//b", &["job-b/a/b"]),
    ("x/", &["job-b/x"]),
    ("a\0b", &["job-b/a"]),
    ("..", &["job-b"]),
];

fn forger(cx: &Ctx, t: &Tally, mut rng: StdRng, ip: Ipv4Addr) {
    let own = cx.key(NS_FORGER);
    let mut n = 0u64;
    while !cx.stopped() {
        n += 1;
        cx.nap(Duration::from_millis(50));
        let s = match raw_from(ip, cx.addr, None) {
            Ok(s) => s,
            Err(e) => {
                t.add("connect", &format!("failed: {}", e.kind()));
                continue;
            }
        };
        let sync = raw_frame(kind::SYNC, 4, &[]);
        let (case, namespace, frames): (&str, &str, Vec<u8>) = match rng.gen_range(0..7) {
            0 => {
                let name = RESERVED[rng.gen_range(0..RESERVED.len())];
                cx.forged(format!("{NS_FORGER}/{name}"));
                let w = raw_frame(kind::WRITE, 3, &write_body(&own, name, n, b"forged"));
                ("Write of a reserved name", NS_FORGER, [w, sync].concat())
            }
            1 => {
                let (name, lands) = ESCAPES[rng.gen_range(0..ESCAPES.len())];
                lands.iter().for_each(|k| cx.forged(k.to_string()));
                let w = raw_frame(kind::WRITE, 3, &write_body(&own, name, n, b"forged"));
                ("Write of a path escape", NS_FORGER, [w, sync].concat())
            }
            2 => {
                let bad = if rng.gen_bool(0.5) {
                    RESERVED[rng.gen_range(0..RESERVED.len())]
                } else {
                    ESCAPES[rng.gen_range(0..ESCAPES.len())].0
                };
                let file = PushFile {
                    path: bad.into(),
                    size: 6,
                    blake3: *blake3::hash(b"forged").as_bytes(),
                };
                let body = if rng.gen_bool(0.5) {
                    encode_push("ckpt", false, &[file])
                } else {
                    let file = PushFile {
                        path: "f".into(),
                        ..file
                    };
                    encode_push(bad, false, &[file])
                };
                (
                    "Push naming a reserved name or an escape",
                    NS_FORGER,
                    raw_frame(kind::PUSH, 3, &body),
                )
            }
            3 => {
                cx.forged(format!("{NS_GOOD}/forged/{n}"));
                let body = write_body(&own, &format!("forged/{n}"), n, b"x");
                let w = raw_frame(kind::WRITE, 3, &body);
                (
                    "job-b's credential for job-a, then a Write",
                    NS_GOOD,
                    [w, sync].concat(),
                )
            }
            4 => {
                cx.forged(format!("forged/{n}"));
                let body = write_body(&own, &format!("forged/{n}"), n, b"x");
                let w = raw_frame(kind::WRITE, 3, &body);
                (
                    "job-b's credential for the empty namespace, then a Write",
                    "",
                    [w, sync].concat(),
                )
            }
            5 => {
                // Its own namespace, but sealed with job-a's tag: not a version job-b wrote.
                cx.forged(format!("{NS_FORGER}/tagged/{n}"));
                let body = write_body(&cx.key(NS_GOOD), &format!("tagged/{n}"), n, b"x");
                let w = raw_frame(kind::WRITE, 3, &body);
                (
                    "Write sealed with another job's tag",
                    NS_FORGER,
                    [w, sync].concat(),
                )
            }
            _ => {
                let ns = ["job-b/../job-a", "/job-a", "job-a/", "job-b//x"][rng.gen_range(0..4)];
                ("Hello with an escaping namespace", ns, Vec::new())
            }
        };
        // The Hello and the proof of job-b's key for the claimed namespace.
        if let Err(e) = send(&s, &raw_hello_frame("forger", namespace)) {
            t.add(case, &format!("send failed: {}", e.kind()));
            continue;
        }
        let a = answer(&s, Duration::from_secs(5));
        let Some(body) = challenge(&a) else {
            t.add(case, &answer_text(&a));
            continue;
        };
        let _ = send(&s, &raw_auth_frame(body, &own, namespace));
        let a = answer(&s, Duration::from_secs(5));
        let authed = matches!(&a, Answer::Frame(h, _) if h.kind == kind::AUTH | kind::REPLY);
        if !authed {
            if namespace != NS_FORGER {
                t.add(case, &answer_text(&a));
            } else {
                t.add(case, &format!("handshake: {}", answer_text(&a)));
            }
            continue;
        }
        if namespace != NS_FORGER {
            t.breach(format!("{case}: the server accepted the proof"));
        }
        let _ = send(&s, &frames);
        let a = answer(&s, Duration::from_secs(5));
        let text = answer_text(&a);
        if matches!(text.as_str(), "SyncOk" | "PushOk") {
            t.breach(format!("{case}: answered {text}"));
        }
        t.add(case, &text);
    }
}

// (4) Replayed handshakes.

/// Relays one connection of a real client to the server and returns the first two frames
/// it sent (its Hello and Auth).
fn record_handshake(addr: SocketAddr, opts: &ClientOptions) -> Res<(Vec<u8>, Vec<u8>)> {
    let relay = TcpListener::bind("127.0.0.1:0").ctx(|| "binding the recording relay")?;
    let at = relay.local_addr().ctx(|| "relay address")?;
    let recorder = std::thread::spawn(move || -> io::Result<Vec<u8>> {
        let (client, _) = relay.accept()?;
        let server = TcpStream::connect(addr)?;
        let (mut from_server, mut to_client) = (server.try_clone()?, client.try_clone()?);
        let back = std::thread::spawn(move || io::copy(&mut from_server, &mut to_client));
        let (mut from_client, mut to_server) = (client, server);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = from_client.read(&mut buf)?;
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            to_server.write_all(&buf[..n])?;
        }
        let _ = to_server.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
        Ok(seen)
    });
    let mut c = Connection::connect(&at.to_string(), opts).ctx(|| "a client through the relay")?;
    c.ping().ctx(|| "ping through the relay")?;
    c.goodbye();
    let seen = recorder
        .join()
        .map_err(|_| crate::util::BenchError("the recording relay panicked".into()))?
        .ctx(|| "recording relay")?;
    let frame_at = |at: usize| -> Res<(Vec<u8>, usize)> {
        let h: [u8; HEADER_LEN] = seen
            .get(at..at + HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| crate::util::BenchError("the recording is short".into()))?;
        let h = FrameHeader::decode(&h).ctx(|| "recorded frame")?;
        let end = at + HEADER_LEN + h.body_len as usize;
        let bytes = seen
            .get(at..end)
            .ok_or_else(|| crate::util::BenchError("the recording is short".into()))?;
        Ok((bytes.to_vec(), end))
    };
    let (hello, end) = frame_at(0)?;
    let (auth, _) = frame_at(end)?;
    if hello[5] != kind::HELLO || auth[5] != kind::AUTH {
        return err("the recorded client did not start with Hello and Auth");
    }
    Ok((hello, auth))
}

fn replayer(cx: &Ctx, t: &Tally, mut rng: StdRng, ip: Ipv4Addr) {
    let (hello, auth) = (&cx.recorded.0, &cx.recorded.1);
    let mut n = 0u64;
    while !cx.stopped() {
        n += 1;
        cx.nap(Duration::from_millis(50));
        let s = match raw_from(ip, cx.addr, None) {
            Ok(s) => s,
            Err(e) => {
                t.add("connect", &format!("failed: {}", e.kind()));
                continue;
            }
        };
        let key = format!("replayed/{n}");
        cx.forged(format!("{NS_GOOD}/{key}"));
        let write = raw_frame(
            kind::WRITE,
            3,
            &write_body(&cx.key(NS_GOOD), &key, n, b"replayed"),
        );
        let sync = raw_frame(kind::SYNC, 4, &[]);
        let mut answers = Vec::new();
        let case = match rng.gen_range(0..3) {
            0 => {
                let _ = send(&s, hello);
                answers.push(answer(&s, Duration::from_secs(5)));
                let _ = send(&s, &[&auth[..], &write, &sync].concat());
                "the recorded Hello, the Challenge, the recorded Auth, a Write"
            }
            1 => {
                let _ = send(&s, &[&hello[..], auth, &write, &sync].concat());
                "the recorded Hello, Auth and a Write at once"
            }
            _ => {
                let _ = send(&s, &[&auth[..], &write, &sync].concat());
                "the recorded Auth first"
            }
        };
        loop {
            let a = answer(&s, Duration::from_secs(5));
            let end = !matches!(a, Answer::Frame(..));
            answers.push(a);
            if end || answers.len() > 4 {
                break;
            }
        }
        let texts: Vec<String> = answers.iter().map(answer_text).collect();
        if texts.iter().any(|x| x == "AuthOk" || x == "SyncOk") {
            t.breach(format!("{case}: {}", texts.join(", ")));
        }
        t.add(case, &texts.join(", "));
    }
}

// (5) Fuzz: valid frames from the encoders, mutated.

/// A valid frame of a random kind (request id `id`).
fn template(rng: &mut StdRng, key: &JobKey, n: u64, id: u32) -> (&'static str, Vec<u8>) {
    let mut proof = [0u8; 32];
    rng.fill(&mut proof[..]);
    let len = rng.gen_range(1..4096usize);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    let score = *blake3::hash(&data).as_bytes();
    let (name, k, body) = match rng.gen_range(0..12) {
        0 => return ("Hello", raw_hello_frame("fuzz", NS_HOSTILE)),
        1 => ("Auth", kind::AUTH, proof.to_vec()),
        2 | 3 => (
            "Write",
            kind::WRITE,
            write_body(key, &format!("fz/{n}"), n, &data),
        ),
        4 => ("Sync", kind::SYNC, Vec::new()),
        5 => ("Read", kind::READ, encode_read("fz/1", 0, 4096)),
        6 => {
            let f = PushFile {
                path: "a".into(),
                size: len as u64,
                blake3: score,
            };
            (
                "Push",
                kind::PUSH,
                encode_push(&format!("ck{n}"), false, &[f]),
            )
        }
        7 => (
            "Pull",
            kind::PULL,
            encode_pull(&[(PullKind::File, "fz/1"), (PullKind::Checkpoint, "ck1")]),
        ),
        8 => ("Ping", kind::PING, Vec::new()),
        9 => ("Status", kind::STATUS, Vec::new()),
        10 => ("Lacks", kind::LACKS, encode_scores(&[score, proof])),
        _ => (
            "GetManifest",
            kind::GET_MANIFEST,
            encode_get_manifest("ck1"),
        ),
    };
    (name, raw_frame(k, id, &body))
}

/// Mutates a frame: byte flips, a truncation, a wrong length, a random kind, or garbage.
fn mutate(rng: &mut StdRng, mut f: Vec<u8>) -> (&'static str, Vec<u8>) {
    match rng.gen_range(0..7) {
        0 => {
            for _ in 0..rng.gen_range(1..=4) {
                let i = rng.gen_range(0..f.len());
                f[i] ^= 1 << rng.gen_range(0..8);
            }
            ("bit flips anywhere", f)
        }
        1 if f.len() > HEADER_LEN => {
            for _ in 0..rng.gen_range(1..=4) {
                let i = rng.gen_range(HEADER_LEN..f.len());
                f[i] = rng.gen();
            }
            ("random body bytes", f)
        }
        2 => {
            let cut = rng.gen_range(1..f.len());
            f.truncate(cut);
            ("truncated", f)
        }
        3 => {
            let body = (f.len() - HEADER_LEN) as u32;
            let len: u32 = match rng.gen_range(0..4) {
                0 => rng.gen_range(0..=body.saturating_sub(1)),
                1 => body + rng.gen_range(1..100),
                2 => rng.gen_range((64 << 10) + 1..=MAX_BODY as u32),
                _ => rng.gen_range(MAX_BODY as u32 + 1..=u32::MAX),
            };
            f[8..12].copy_from_slice(&len.to_le_bytes());
            ("wrong body length", f)
        }
        4 => {
            f[5] = rng.gen();
            ("random kind", f)
        }
        5 => {
            f[4] = rng.gen_range(0..=255u8).max(3);
            ("another version", f)
        }
        _ => {
            let mut g = vec![0u8; rng.gen_range(1..200)];
            rng.fill(&mut g[..]);
            if rng.gen_bool(0.5) {
                let n = 4.min(g.len());
                g[..n].copy_from_slice(&protocol::MAGIC[..n]);
            }
            ("garbage", g)
        }
    }
}

fn fuzzer(cx: &Ctx, t: &Tally, mut rng: StdRng, ip: Ipv4Addr) {
    let key = cx.key(NS_HOSTILE);
    let pace = Duration::from_secs_f64(1.0 / cx.o.fuzz_rate.max(1) as f64);
    let mut n = 0u64;
    while !cx.stopped() {
        n += 1;
        let next = Instant::now() + pace;
        let before = rng.gen_bool(0.3);
        let id = if before { 1 } else { 3 };
        let (name, frame) = template(&mut rng, &key, n, id);
        let (mutation, bytes) = mutate(&mut rng, frame);
        let when = if before {
            "as the first frame"
        } else {
            "after the handshake"
        };
        let case = format!("{mutation}, {when}");
        match raw_from(ip, cx.addr, None) {
            Err(e) => t.add(&case, &format!("connect failed: {}", e.kind())),
            Ok(s) => {
                let ready = if before {
                    Ok(())
                } else {
                    handshake(&s, &key, NS_HOSTILE)
                };
                match ready {
                    Err(why) => t.add(&case, &format!("handshake: {why}")),
                    Ok(()) => {
                        let sent = send(&s, &bytes);
                        let a = answer(&s, Duration::from_millis(300));
                        let text = match (&sent, &a) {
                            (Err(_), Answer::Silent) => "send failed".to_string(),
                            _ => answer_text(&a),
                        };
                        t.add(&case, &text);
                        if before && text == "AuthOk" {
                            t.breach(format!("{name} {case}: AuthOk without a proof"));
                        }
                    }
                }
            }
        }
        let now = Instant::now();
        if next > now {
            cx.nap(next - now);
        }
    }
}

// (6) A connection flood up to the per-address cap.

fn flood(cx: &Ctx, t: &Tally, mut rng: StdRng, first_ip: u8) {
    let key = cx.key(NS_HOSTILE);
    let cap = cx.o.per_client_cap;
    // (address index, stream, authenticated)
    let mut held: Vec<(usize, TcpStream, bool)> = Vec::new();
    while !cx.stopped() {
        for a in 0..cx.o.flood_addrs {
            let ip = Ipv4Addr::new(127, 0, 0, first_ip.saturating_add(a as u8));
            let have = held.iter().filter(|h| h.0 == a).count();
            let mut fresh = Vec::new();
            for _ in have..cap + 4 {
                if cx.stopped() {
                    break;
                }
                match raw_from(ip, cx.addr, None) {
                    Ok(s) => fresh.push(s),
                    Err(e) => t.add("connect", &format!("failed: {}", e.kind())),
                }
            }
            // A refused one has its BUSY frame by now.
            cx.nap(Duration::from_millis(300));
            for s in fresh {
                if still_open(&s).is_none() {
                    t.add("open up to the cap + 4", &answer_text(&answer(&s, DRIP)));
                    continue;
                }
                let authed = rng.gen_bool(0.5);
                if authed {
                    match handshake(&s, &key, NS_HOSTILE) {
                        Ok(()) => t.add("open up to the cap + 4", "admitted, authenticated, idle"),
                        Err(why) => {
                            t.add("open up to the cap + 4", &format!("handshake: {why}"));
                            continue;
                        }
                    }
                } else {
                    t.add("open up to the cap + 4", "admitted, idle before Hello");
                }
                held.push((a, s, authed));
            }
        }
        cx.nap(Duration::from_secs(1));
        held.retain(|(_, s, authed)| {
            let open = still_open(s).is_some();
            if !open {
                let what = if *authed {
                    "authenticated idle"
                } else {
                    "idle before Hello"
                };
                t.add("held", &format!("{what}: closed by the server"));
            }
            open
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The well-behaved clients.

/// One well-behaved client across the phases: its keys' versions, its connection.
struct Good {
    c: usize,
    rng: StdRng,
    seed: u64,
    conn: Option<Connection>,
    stamp: u64,
    /// Per key: the sizes of the stamps sent (acknowledged or not).
    sent: HashMap<String, BTreeMap<u64, u64>>,
    /// Per key: the newest acknowledged stamp.
    acked: HashMap<String, u64>,
    buf: Vec<u8>,
    out: Vec<u8>,
}

/// What the well-behaved clients did in one phase.
#[derive(Debug, Default, Serialize)]
struct PhaseSamples {
    rounds: u64,
    bytes: u64,
    write_sync_s: Vec<f64>,
    read_s: Vec<f64>,
    failures: Vec<String>,
}

impl Good {
    fn data_seed(&self, stamp: u64) -> u64 {
        self.seed ^ ((self.c as u64 + 1) << 48) ^ stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn options(secret: &str) -> ClientOptions {
        let mut o = ClientOptions::with(Credential::Job(JobKey::derive(secret, NS_GOOD)));
        o.namespace = NS_GOOD.into();
        o.client = "well-behaved".into();
        o
    }

    /// One round: write, Sync, read back and check. Returns (write+sync s, read s, bytes).
    fn round(&mut self, addr: &str, secret: &str) -> Result<(f64, f64, u64), String> {
        if self.conn.is_none() {
            let c = Connection::connect(addr, &Self::options(secret))
                .map_err(|e| format!("connect: {e}"))?;
            self.conn = Some(c);
        }
        self.stamp += 1;
        let stamp = self.stamp;
        let key = format!("good-{}/f{:02}", self.c, stamp % KEYS);
        // 4 KiB .. 4 MiB, log-uniform.
        let size = (4.0 * KIB as f64 * 2f64.powf(self.rng.gen_range(0.0..=10.0))) as usize;
        self.buf.resize(size, 0);
        let seed = self.data_seed(stamp);
        fill_pattern(&mut self.buf, seed);
        let digest = *blake3::hash(&self.buf).as_bytes();
        self.sent
            .entry(key.clone())
            .or_default()
            .insert(stamp, size as u64);
        let Some(conn) = self.conn.as_mut() else {
            return Err("no connection".into());
        };
        let t0 = Instant::now();
        let seal = conn.seal(&key, stamp, size as u64, digest);
        let seg = OutSegment {
            key: &key,
            stamp,
            size: size as u64,
            offset: 0,
            seal: Some(seal),
            data: &[self.buf.as_slice()],
        };
        conn.write(&[seg])
            .and_then(|()| conn.sync())
            .map_err(|e| format!("write+sync of {key} ({size} B): {e}"))?;
        let ws = t0.elapsed().as_secs_f64();
        self.acked.insert(key.clone(), stamp);
        let t1 = Instant::now();
        let meta = conn
            .read(&key, 0, size as u32, &mut self.out)
            .map_err(|e| format!("read of {key}: {e}"))?
            .ok_or_else(|| format!("read of {key}: NOT_FOUND right after its Sync"))?;
        let rd = t1.elapsed().as_secs_f64();
        if meta.stamp != stamp
            || meta.size != size as u64
            || meta.blake3 != digest
            || self.out != self.buf
            || *blake3::hash(&self.out).as_bytes() != digest
        {
            return Err(format!(
                "read of {key}: stamp {} size {} (sent {stamp}, {size}): bytes or BLAKE3 differ",
                meta.stamp, meta.size
            ));
        }
        Ok((ws, rd, size as u64))
    }

    /// Runs rounds until `end`.
    fn run_until(&mut self, end: Instant, addr: &str, secret: &str, s: &mut PhaseSamples) {
        while Instant::now() < end {
            match self.round(addr, secret) {
                Ok((ws, rd, bytes)) => {
                    s.rounds += 1;
                    s.bytes += bytes;
                    s.write_sync_s.push(ws);
                    s.read_s.push(rd);
                }
                Err(e) => {
                    s.failures.push(format!("client {}: {e}", self.c));
                    self.conn = None;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// Runs the well-behaved clients for `secs`; `during` runs meanwhile on this thread.
fn run_phase(
    goods: &mut [Good],
    secs: u64,
    addr: &str,
    secret: &str,
    during: impl FnOnce(Instant),
) -> PhaseSamples {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut all = PhaseSamples::default();
    std::thread::scope(|sc| {
        let handles: Vec<_> = goods
            .iter_mut()
            .map(|g| {
                sc.spawn(move || {
                    let mut s = PhaseSamples::default();
                    g.run_until(end, addr, secret, &mut s);
                    s
                })
            })
            .collect();
        during(end);
        for h in handles {
            match h.join() {
                Ok(s) => {
                    all.rounds += s.rounds;
                    all.bytes += s.bytes;
                    all.write_sync_s.extend(s.write_sync_s);
                    all.read_s.extend(s.read_s);
                    all.failures.extend(s.failures);
                }
                Err(_) => all.failures.push("a client thread panicked".into()),
            }
        }
    });
    all
}

// ---------------------------------------------------------------------------------------------
// The server's process, status and the checks after the run.

/// RSS (MiB) and threads of a process, from /proc.
fn proc_mem(pid: u32) -> Option<(f64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")? as f64 / 1024.0, field("Threads:")?))
}

/// Samples the server's RSS and threads every 250 ms until dropped.
struct Sampler {
    samples: Arc<Mutex<Vec<(Instant, f64, u64)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st2.load(Ordering::SeqCst) {
                if let Some((rss, th)) = proc_mem(pid) {
                    s2.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), rss, th));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// Peak RSS and threads between `a` and `b`.
    fn peak(&self, a: Instant, b: Instant) -> (f64, u64) {
        let v = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let within = v.iter().filter(|s| s.0 >= a && s.0 <= b);
        within.fold((0.0, 0), |(r, t), s| (r.max(s.1), t.max(s.2)))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn status_of(addr: &str, secret: &str) -> Res<ServerStatus> {
    let mut c = Connection::connect(addr, &ClientOptions::new(secret))
        .ctx(|| format!("connecting to the server {addr} for its status"))?;
    let s = c.status().ctx(|| "status of the server")?;
    c.goodbye();
    Ok(s)
}

/// One phase as the report shows it.
#[derive(Debug, Serialize)]
struct PhaseRow {
    phase: String,
    seconds: f64,
    rounds: u64,
    rounds_per_s: f64,
    mib_per_s: f64,
    write_sync_ms: Pct,
    read_ms: Pct,
    failures: Vec<String>,
    server: ServerRow,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Pct {
    p50: f64,
    p99: f64,
    max: f64,
}

/// Percentiles of seconds, in milliseconds (nearest rank).
fn pct(v: &[f64]) -> Pct {
    let mut v: Vec<f64> = v.iter().map(|x| x * 1e3).collect();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    Pct {
        p50: at(0.50),
        p99: at(0.99),
        max: v.last().copied().unwrap_or(f64::NAN),
    }
}

/// The server around one phase: status counters (changes over the phase), RSS and threads.
#[derive(Debug, Clone, Serialize, Default)]
struct ServerRow {
    clients_end: u64,
    refused_clients: u64,
    timed_out_clients: u64,
    busy_refusals: u64,
    absorbed_files: u64,
    drained_files: u64,
    rss_start_mib: f64,
    rss_peak_mib: f64,
    rss_end_mib: f64,
    threads_start: u64,
    threads_peak: u64,
    threads_end: u64,
}

#[derive(Debug, Serialize)]
struct AttackRow {
    attack: String,
    from: String,
    tried: u64,
    /// Per case: answer -> count.
    answers: BTreeMap<String, BTreeMap<String, u64>>,
    breaches: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Check {
    name: String,
    passed: bool,
    detail: String,
}

#[derive(Serialize)]
struct Report<'a> {
    suite: &'static str,
    #[serde(flatten)]
    header: Header,
    seed: u64,
    options: &'a HOpts,
    phases: Vec<PhaseRow>,
    attacks: Vec<AttackRow>,
    checks: Vec<Check>,
    verified_keys: usize,
    forged_keys_checked: usize,
    durable_files: usize,
    server_log_tail: String,
}

/// Reads every key's newest acknowledged version back (the server, or the durable tier once
/// drained and reclaimed); returns the problems.
fn verify_acked(goods: &[Good], addr: &str, secret: &str, durable: &DurableStore) -> Vec<String> {
    let mut problems = Vec::new();
    let mut conn: Option<Connection> = None;
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for g in goods {
        let mut keys: Vec<_> = g.acked.iter().collect();
        keys.sort();
        for (key, &acked) in keys {
            let full = format!("{NS_GOOD}/{key}");
            let Some(c) = verifier(&mut conn, addr, secret, &full, &mut problems) else {
                continue;
            };
            let (stamp, size) = match c.read(&full, 0, MAX_DATA as u32, &mut out) {
                Ok(Some(meta)) => (meta.stamp, meta.size),
                Ok(None) => match (durable.recorded_version(&full), durable.get_bytes(&full)) {
                    (Ok(Some(v)), Ok(bytes)) => {
                        out.clear();
                        out.extend_from_slice(&bytes);
                        (v, bytes.len() as u64)
                    }
                    (v, b) => {
                        problems.push(format!(
                            "{full}: acknowledged stamp {acked}, not on the server and not in the \
                             durable tier ({:?}, {})",
                            v.as_ref().ok(),
                            b.err().map(|e| e.to_string()).unwrap_or_default()
                        ));
                        continue;
                    }
                },
                Err(e) => {
                    problems.push(format!("{full}: read failed: {e}"));
                    conn = None;
                    continue;
                }
            };
            let sent = g.sent.get(key).and_then(|m| m.get(&stamp));
            let ok =
                stamp >= acked && sent.is_some_and(|&s| s == size && out.len() as u64 == size) && {
                    buf.resize(size as usize, 0);
                    fill_pattern(&mut buf, g.data_seed(stamp));
                    out == buf
                };
            if !ok {
                problems.push(format!(
                    "{full}: acknowledged stamp {acked}, found stamp {stamp} ({size} B) whose \
                     bytes are not what was sent"
                ));
            }
        }
    }
    problems
}

/// The cluster-secret connection the checks read through, connected on first use (and
/// again after a failed read dropped it); None, with the problem noted, if it cannot be.
fn verifier<'a>(
    conn: &'a mut Option<Connection>,
    addr: &str,
    secret: &str,
    key: &str,
    problems: &mut Vec<String>,
) -> Option<&'a mut Connection> {
    if conn.is_none() {
        match Connection::connect(addr, &ClientOptions::new(secret)) {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                problems.push(format!("{key}: cannot connect to verify: {e}"));
                return None;
            }
        }
    }
    conn.as_mut()
}

/// Reads every forged key with a cluster-secret client: Err(problems) unless all are
/// NOT_FOUND (or refused as a bad key).
fn verify_forged(keys: &BTreeSet<String>, addr: &str, secret: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut conn: Option<Connection> = None;
    let mut out = Vec::new();
    for key in keys {
        let Some(c) = verifier(&mut conn, addr, secret, key, &mut problems) else {
            continue;
        };
        match c.read(key, 0, 64, &mut out) {
            Ok(None) => {}
            Ok(Some(m)) => problems.push(format!("{key} is readable (stamp {})", m.stamp)),
            Err(cascade_wire::Error::Refused { code, .. }) if code == code::BAD_PATH => {
                conn = None;
            }
            Err(e) => {
                problems.push(format!("{key}: {e}"));
                conn = None;
            }
        }
    }
    problems
}

/// Files in the durable tier outside the well-behaved keys and the hostile namespace.
fn stray_durable_files(dir: &Path) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut stray = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            count += 1;
            let rel = p.strip_prefix(dir).unwrap_or(&p).to_string_lossy();
            let ok = rel.starts_with(&format!("{NS_GOOD}/good-"))
                || rel.starts_with(&format!("{NS_HOSTILE}/"));
            if !ok {
                stray.push(rel.into_owned());
            }
        }
    }
    stray.sort();
    (count, stray)
}

// ---------------------------------------------------------------------------------------------

impl HOpts {
    fn resolve(&mut self) -> Res<()> {
        if self.seconds == 0 || self.clients == 0 || self.attack_phases == 0 {
            return err("--seconds, --clients and --attack-phases must be positive");
        }
        if self.flood_addrs > 100 {
            return err("--flood-addrs: at most 100 (127.0.0.60 and up)");
        }
        self.seed_used = self.seed.unwrap_or_else(|| {
            let mut b = [0u8; 8];
            if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                let _ = f.read_exact(&mut b);
            }
            u64::from_le_bytes(b)
        });
        Ok(())
    }
}

/// The attackers, each in its thread until `cx.stop`; returns their tallies.
fn attack(cx: &Ctx, end: Instant) -> Vec<AttackRow> {
    let seed = cx.o.seed_used;
    let rng = |i: u64| StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let ip = |d: u8| Ipv4Addr::new(127, 0, 0, d);
    let drippers: Vec<Tally> = (0..cx.o.drippers).map(|_| Tally::default()).collect();
    let tallies: Vec<Tally> = (0..5).map(|_| Tally::default()).collect();
    let on = |a: Attacker| cx.o.attackers.contains(&a);
    std::thread::scope(|sc| {
        for (i, t) in drippers.iter().enumerate().filter(|_| on(Attacker::Slow)) {
            let r = rng(100 + i as u64);
            sc.spawn(move || slow_client(cx, t, r, ip(10 + (i % 8) as u8)));
        }
        if on(Attacker::Stalled) {
            sc.spawn(|| stalled_readers(cx, &tallies[0], ip(20)));
        }
        let r = rng(2);
        if on(Attacker::Forged) {
            sc.spawn(|| forger(cx, &tallies[1], r, ip(30)));
        }
        let r = rng(3);
        if on(Attacker::Replay) {
            sc.spawn(|| replayer(cx, &tallies[2], r, ip(40)));
        }
        let r = rng(4);
        if on(Attacker::Fuzz) {
            sc.spawn(|| fuzzer(cx, &tallies[3], r, ip(50)));
        }
        let r = rng(5);
        if on(Attacker::Flood) {
            sc.spawn(|| flood(cx, &tallies[4], r, 60));
        }
        let now = Instant::now();
        if end > now {
            std::thread::sleep(end - now);
        }
        cx.stop.store(true, Ordering::SeqCst);
    });
    let mut slow = Tally::default();
    for t in drippers {
        slow.tried
            .fetch_add(t.tried.load(Ordering::Relaxed), Ordering::Relaxed);
        let m = t.answers.into_inner().unwrap_or_else(|p| p.into_inner());
        let all = slow.answers.get_mut().unwrap_or_else(|p| p.into_inner());
        for (case, answers) in m {
            for (a, n) in answers {
                *all.entry(case.clone()).or_default().entry(a).or_default() += n;
            }
        }
    }
    let last_flood = 60 + cx.o.flood_addrs.max(1) - 1;
    let names = [
        (
            "slow clients (a byte every 100 ms)",
            "127.0.0.10-17".to_string(),
        ),
        ("stalled readers", "127.0.0.20".into()),
        ("forged names", "127.0.0.30".into()),
        ("replayed handshakes", "127.0.0.40".into()),
        ("fuzz", "127.0.0.50".into()),
        ("connection flood", format!("127.0.0.60-{last_flood}")),
    ];
    std::iter::once(slow)
        .chain(tallies)
        .zip(names)
        .map(|(t, (name, from))| AttackRow {
            attack: name.into(),
            from,
            tried: t.tried.load(Ordering::Relaxed),
            answers: t.answers.into_inner().unwrap_or_else(|p| p.into_inner()),
            breaches: t.breaches.into_inner().unwrap_or_else(|p| p.into_inner()),
        })
        .collect()
}

fn server_row(
    before: &ServerStatus,
    after: &ServerStatus,
    sampler: &Sampler,
    (a, b): (Instant, Instant),
    start: (f64, u64),
    end: (f64, u64),
) -> ServerRow {
    let (rss_peak, th_peak) = sampler.peak(a, b);
    ServerRow {
        clients_end: after.clients,
        refused_clients: after.refused_clients.saturating_sub(before.refused_clients),
        timed_out_clients: after
            .timed_out_clients
            .saturating_sub(before.timed_out_clients),
        busy_refusals: after.busy_refusals.saturating_sub(before.busy_refusals),
        absorbed_files: after.absorbed_files.saturating_sub(before.absorbed_files),
        drained_files: after.drained_files.saturating_sub(before.drained_files),
        rss_start_mib: start.0,
        rss_peak_mib: rss_peak.max(start.0).max(end.0),
        rss_end_mib: end.0,
        threads_start: start.1,
        threads_peak: th_peak.max(start.1).max(end.1),
        threads_end: end.1,
    }
}

/// Waits (at most `max`) until the server's thread count is back to `threads` + 2 (its
/// connections' threads end once the attackers' sockets are closed); its RSS and threads then.
fn settle_server(pid: u32, threads: u64, max: Duration) -> (f64, u64) {
    let t0 = Instant::now();
    loop {
        let m = proc_mem(pid).unwrap_or((f64::NAN, 0));
        if m.1 <= threads + 2 || t0.elapsed() >= max {
            return m;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn run(mut o: HOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve()?;
    let seed = o.seed_used;
    let dirs = vec![PathBuf::from("/var/tmp"), o.arena_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs, &o.out)?;
    let clock = RunClock::start(&o.arena_dir, &o.arena_dir);
    let load = crate::util::loadavg();
    eprintln!(
        "cascade-bench hostile: seed {seed} (rerun with --seed {seed}); {} s phases, load {load}",
        o.seconds
    );
    let secret = crate::staging::random_secret();
    let drain = o.arena_dir.join(format!("{}-drain", prefix(pid)));
    std::fs::create_dir_all(&drain).ctx(|| format!("creating {}", drain.display()))?;
    let exe = std::env::current_exe().ctx(|| "finding the bench executable")?;
    let mut cmd = clean_cmd(&exe);
    cmd.env("CASCADE_STAGING_SECRET", &secret);
    let arenas = o.arena_dir.join(format!("{}-arenas", prefix(pid)));
    let (ft, cap, kept) = (
        (o.frame_timeout_s * 1000).to_string(),
        o.per_client_cap.to_string(),
        o.drain_memory_mib.to_string(),
    );
    let drain_s = drain.to_string_lossy().into_owned();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--drain-to",
        &drain_s,
        "--frame-timeout-ms",
        &ft,
        "--max-connections-per-client",
        &cap,
        "--drain-memory-mib",
        &kept,
    ];
    let mut server = StageServer::spawn(cmd, arenas.clone(), arenas.with_extension("log"), &args)?;
    server.wait_listening()?;
    let spid = server
        .pid()
        .ok_or_else(|| crate::util::BenchError("the server has no pid".into()))?;
    let addr_s = server.addr.clone();
    let addr: SocketAddr = addr_s
        .parse()
        .ctx(|| format!("the server's address {addr_s}"))?;
    eprintln!(
        "  server {addr_s} (pid {spid}), arenas {}",
        arenas.display()
    );
    let durable = DurableStore::open(&drain_s).ctx(|| "opening the drain directory")?;
    let sampler = Sampler::start(spid);

    let mut goods: Vec<Good> = (0..o.clients)
        .map(|c| Good {
            c,
            rng: StdRng::seed_from_u64(seed ^ (0x600d + c as u64)),
            seed,
            conn: None,
            stamp: 0,
            sent: HashMap::new(),
            acked: HashMap::new(),
            buf: Vec::new(),
            out: Vec::new(),
        })
        .collect();
    let mut phases = Vec::new();
    let mut attacks: Vec<AttackRow> = Vec::new();
    let mut forged_keys = BTreeSet::new();
    let mut names = vec!["baseline".to_string()];
    names.extend((1..=o.attack_phases).map(|i| match i {
        1 => "attack".to_string(),
        i => format!("attack {i}"),
    }));
    if !o.no_after {
        names.push("baseline after".into());
    }
    // The server's (RSS MiB, threads) before the first attack and once each attack's
    // connections are gone.
    let mut before_attack = (0.0, 0);
    let mut after_attacks: Vec<(f64, u64)> = Vec::new();
    let mut run_error: Option<String> = None;
    for name in names {
        let mut one = || -> Res<PhaseRow> {
            let st0 = status_of(&addr_s, &secret)?;
            let m0 = proc_mem(spid).unwrap_or((f64::NAN, 0));
            let t0 = Instant::now();
            eprintln!(
                "  phase {name}: {} s, server RSS {:.0} MiB, {} threads",
                o.seconds, m0.0, m0.1
            );
            let attacked = name.starts_with("attack");
            let samples = if attacked {
                if after_attacks.is_empty() {
                    before_attack = m0;
                }
                write_big(addr, &secret).ctx(|| "writing the stalled readers' file")?;
                let recorded = record_handshake(addr, &Good::options(&secret))?;
                let cx = Ctx {
                    o: o.clone(),
                    addr,
                    secret: secret.clone(),
                    stop: AtomicBool::new(false),
                    forged_keys: Mutex::new(BTreeSet::new()),
                    recorded,
                };
                let mut rows = Vec::new();
                let s = run_phase(&mut goods, o.seconds, &addr_s, &secret, |end| {
                    rows = attack(&cx, end);
                });
                merge_attacks(&mut attacks, rows);
                forged_keys.extend(
                    cx.forged_keys
                        .into_inner()
                        .unwrap_or_else(|p| p.into_inner()),
                );
                s
            } else {
                run_phase(&mut goods, o.seconds, &addr_s, &secret, |_| {})
            };
            let t1 = Instant::now();
            let m1 = if attacked {
                // The attackers' sockets are closed: the server's connection threads end.
                let m = settle_server(spid, before_attack.1, Duration::from_secs(15));
                after_attacks.push(m);
                m
            } else {
                proc_mem(spid).unwrap_or((f64::NAN, 0))
            };
            let st1 = status_of(&addr_s, &secret)?;
            let secs = t1.duration_since(t0).as_secs_f64();
            let row = PhaseRow {
                phase: name.clone(),
                seconds: secs,
                rounds: samples.rounds,
                rounds_per_s: samples.rounds as f64 / o.seconds as f64,
                mib_per_s: samples.bytes as f64 / MIB as f64 / o.seconds as f64,
                write_sync_ms: pct(&samples.write_sync_s),
                read_ms: pct(&samples.read_s),
                failures: samples.failures,
                server: server_row(&st0, &st1, &sampler, (t0, t1), m0, m1),
            };
            eprintln!(
                "    {} rounds ({:.1}/s), write+sync p99 {:.1} ms, read p99 {:.1} ms, {} failed",
                row.rounds,
                row.rounds_per_s,
                row.write_sync_ms.p99,
                row.read_ms.p99,
                row.failures.len()
            );
            Ok(row)
        };
        match one() {
            Ok(row) => phases.push(row),
            Err(e) => {
                run_error = Some(format!("phase {name}: {e}"));
                break;
            }
        }
        if let Err(e) = server.alive() {
            run_error = Some(e.to_string());
            break;
        }
    }
    drop(sampler);

    // The checks.
    for g in &mut goods {
        g.conn = None;
    }
    let lost = verify_acked(&goods, &addr_s, &secret, &durable);
    let verified_keys: usize = goods.iter().map(|g| g.acked.len()).sum();
    let forged = verify_forged(&forged_keys, &addr_s, &secret);
    let (durable_files, stray) = stray_durable_files(&drain);
    let alive = server.alive();
    let log = std::fs::read_to_string(&server.log).unwrap_or_default();
    let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
    let server_log_tail = tail(&server.log, 5);
    drop(server);

    let mut checks = Vec::new();
    let mut check = |name: &str, passed: bool, detail: String| {
        checks.push(Check {
            name: name.into(),
            passed,
            detail,
        });
    };
    check(
        "nothing acknowledged lost or altered",
        lost.is_empty(),
        if lost.is_empty() {
            format!("the last acknowledged version of each of {verified_keys} keys read back whole")
        } else {
            format!("{} key(s): {}", lost.len(), first_few(&lost))
        },
    );
    let breaches: Vec<String> = attacks
        .iter()
        .flat_map(|a| a.breaches.iter().map(move |b| format!("{}: {b}", a.attack)))
        .collect();
    let forged_ok = forged.is_empty() && stray.is_empty() && breaches.is_empty();
    check(
        "no forged or replayed write readable",
        forged_ok,
        if forged_ok {
            format!(
                "{} forged/replayed keys read with the cluster secret: all NOT_FOUND; the durable \
                 tier holds only the well-behaved keys and job-h ({durable_files} files); no \
                 forged proof or write accepted",
                forged_keys.len()
            )
        } else {
            format!(
                "readable: {}; stray durable files: {}; accepted: {}",
                first_few(&forged),
                first_few(&stray),
                first_few(&breaches)
            )
        },
    );
    let failed: Vec<String> = phases
        .iter()
        .flat_map(|p| p.failures.iter().map(move |f| format!("{}: {f}", p.phase)))
        .collect();
    check(
        "no well-behaved request failed",
        failed.is_empty(),
        if failed.is_empty() {
            format!(
                "{} rounds in all phases",
                phases.iter().map(|p| p.rounds).sum::<u64>()
            )
        } else {
            format!("{} failed: {}", failed.len(), first_few(&failed))
        },
    );
    let base = phases.first().map(|p| (p.write_sync_ms.p99, p.read_ms.p99));
    // The worse of the attack phases.
    let att = phases
        .iter()
        .filter(|p| p.phase.starts_with("attack"))
        .map(|p| (p.write_sync_ms.p99, p.read_ms.p99))
        .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)));
    if let (Some(b), Some(a)) = (base, att) {
        let (rw, rr) = (a.0 / b.0, a.1 / b.1);
        check(
            &format!(
                "well-behaved p99 under attack within {}x of baseline",
                o.p99_factor
            ),
            rw <= o.p99_factor && rr <= o.p99_factor,
            format!(
                "worst attack phase: write+sync p99 {:.1} ms vs {:.1} ms ({rw:.2}x), read p99 \
                 {:.1} ms vs {:.1} ms ({rr:.2}x)",
                a.0, b.0, a.1, b.1
            ),
        );
    }
    // Memory: the designed ceiling, and no growth from a second attack once the first has
    // warmed the allocator's and the pool's pages.
    let peak = phases
        .iter()
        .map(|p| p.server.rss_peak_mib)
        .fold(0.0, f64::max);
    // What the design bounds (docs/security.md, "Denial of service"): the receive buffers,
    // the read cache, the drain memory (kept frames, then spare buffers), and per connection
    // its 64 KiB header/small-body buffer and a 256 KiB piece of a reply being sent; plus
    // slack for the allocator and the threads' stacks.
    let connections = phases
        .iter()
        .map(|p| p.server.threads_peak)
        .max()
        .unwrap_or(0);
    let per_connection_mib = (64.0 + 256.0) / 1024.0;
    let connections_mib = connections as f64 * per_connection_mib;
    let kept_mib = o.drain_memory_mib as f64;
    let ceiling =
        pool_mib() + READ_CACHE_MIB + kept_mib + connections_mib + o.rss_bound_mib as f64 * 2.0;
    // The most any attack phase after the first added.
    let grow = after_attacks
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(f64::NEG_INFINITY, f64::max);
    let last = phases
        .last()
        .map(|p| p.server.rss_end_mib)
        .unwrap_or(f64::NAN);
    let threads_back = after_attacks.iter().all(|m| m.1 <= before_attack.1 + 2);
    check(
        &format!(
            "server memory bounded (each attack after the first adds at most {} MiB of RSS; RSS \
             never above {ceiling:.0} MiB; threads back after each attack)",
            o.rss_bound_mib
        ),
        grow <= o.rss_bound_mib as f64 && peak <= ceiling && threads_back,
        format!(
            "RSS {:.0} MiB before the first attack, after each: {} MiB (at most {grow:+.0} MiB \
             from one to the next), {last:.0} MiB at the end, peak {peak:.0} MiB (ceiling: \
             {:.0} MiB of receive buffers + {READ_CACHE_MIB:.0} MiB read cache + \
             {kept_mib:.0} MiB drain memory + {connections_mib:.0} MiB for {connections} connections at 320 KiB + {} MiB); \
             threads {} before, {} after",
            before_attack.0,
            after_attacks
                .iter()
                .map(|m| format!("{:.0}", m.0))
                .collect::<Vec<_>>()
                .join(", "),
            pool_mib(),
            o.rss_bound_mib * 2,
            before_attack.1,
            after_attacks
                .iter()
                .map(|m| m.1.to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    );
    check(
        "the server kept running, no panic",
        alive.is_ok() && panics.is_empty() && run_error.is_none(),
        match (&alive, panics.first()) {
            (Err(e), _) => e.to_string(),
            _ if run_error.is_some() => run_error.clone().unwrap_or_default(),
            (_, Some(p)) => format!("{} panic line(s) in its log: {p}", panics.len()),
            _ => "alive at the end, no panic in its log".into(),
        },
    );
    for c in &checks {
        eprintln!(
            "  {} {}: {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        );
    }

    let header = clock.finish(&["crates/cascade-staging", "crates/cascade-wire", "bench"]);
    let md = tables(&o, &phases, &attacks, &checks, &header, &load);
    let all_passed = checks.iter().all(|c| c.passed);
    let rep = Report {
        suite: "hostile",
        header,
        seed,
        options: &o,
        phases,
        attacks,
        checks,
        verified_keys,
        forged_keys_checked: forged_keys.len(),
        durable_files,
        server_log_tail,
    };
    let title = "Cascade staging server (L1) under hostile clients: soak";
    report::write(&o.out, "hostile", title, &rep, md)?;
    if !all_passed {
        return err("some checks failed (FAIL lines above)");
    }
    Ok(())
}

/// The server's receive buffers (`ServerOptions::buffers` of `MAX_BODY` bytes), MiB.
fn pool_mib() -> f64 {
    let buffers = ServerOptions::new("", PathBuf::new(), "", "").buffers;
    (buffers * MAX_BODY) as f64 / MIB as f64
}

/// The engine's read cache: 4 extents of at most 4 MiB (crates/cascade-staging engine).
const READ_CACHE_MIB: f64 = 16.0;

/// Adds one attack phase's tallies to the others'.
fn merge_attacks(all: &mut Vec<AttackRow>, rows: Vec<AttackRow>) {
    for r in rows {
        match all.iter_mut().find(|a| a.attack == r.attack) {
            None => all.push(r),
            Some(a) => {
                a.tried += r.tried;
                for (case, answers) in r.answers {
                    let m = a.answers.entry(case).or_default();
                    for (k, n) in answers {
                        *m.entry(k).or_default() += n;
                    }
                }
                a.breaches.extend(r.breaches);
            }
        }
    }
}

fn first_few(v: &[String]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let mut s = v.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if v.len() > 3 {
        s += &format!("; and {} more", v.len() - 3);
    }
    s
}

fn ms(p: &Pct) -> String {
    format!("{:.1} / {:.1} / {:.1}", p.p50, p.p99, p.max)
}

fn tables(
    o: &HOpts,
    phases: &[PhaseRow],
    attacks: &[AttackRow],
    checks: &[Check],
    header: &Header,
    load: &str,
) -> Md {
    let mut md = Md::default();
    for c in checks {
        let word = if c.passed { "PASS" } else { "FAIL" };
        md.verdict(format!("**{word}** {}: {}", c.name, c.detail));
    }
    if let Some(p) = phases.first() {
        if p.server.rss_start_mib < pool_mib() / 2.0 {
            md.verdict(format!(
                "note: the server's RSS at its start was {:.0} MiB although its receive buffers \
                 take {:.0} MiB: they are not faulted in at start (the server's BufferPool::new \
                 means to), so its RSS grows as the buffers are first used, in any phase",
                p.server.rss_start_mib,
                pool_mib()
            ));
        }
    }
    md.verdict(format!(
        "seed {} (`cascade-bench hostile --seed {}` replays every random choice; the threads' \
         interleaving is the machine's)",
        o.seed_used, o.seed_used
    ));
    let mut t = Table::new(
        format!(
            "Well-behaved clients ({} × write 4 KiB-4 MiB + Sync + read back), {} s per phase",
            o.clients, o.seconds
        ),
        "phase | rounds | rounds/s | MiB/s | write+Sync ms p50 / p99 / max | read ms p50 / p99 / max | failed",
    );
    for p in phases {
        t.row([
            p.phase.clone(),
            p.rounds.to_string(),
            format!("{:.1}", p.rounds_per_s),
            format!("{:.1}", p.mib_per_s),
            ms(&p.write_sync_ms),
            ms(&p.read_ms),
            p.failures.len().to_string(),
        ]);
    }
    if let Some(b) = phases.first() {
        for p in phases.iter().skip(1) {
            let r = |a: f64, b: f64| num(Some(a / b), 2) + "x";
            t.row([
                format!("{} / baseline", p.phase),
                String::new(),
                r(p.rounds_per_s, b.rounds_per_s),
                r(p.mib_per_s, b.mib_per_s),
                format!(
                    "{} / {} / {}",
                    r(p.write_sync_ms.p50, b.write_sync_ms.p50),
                    r(p.write_sync_ms.p99, b.write_sync_ms.p99),
                    r(p.write_sync_ms.max, b.write_sync_ms.max)
                ),
                format!(
                    "{} / {} / {}",
                    r(p.read_ms.p50, b.read_ms.p50),
                    r(p.read_ms.p99, b.read_ms.p99),
                    r(p.read_ms.max, b.read_ms.max)
                ),
                String::new(),
            ]);
        }
    }
    md.push(t);
    let mut t = Table::new(
        "The server per phase (counters: change over the phase; clients: connections past the \
         handshake at its end)",
        "phase | clients | refused_clients | timed_out_clients | busy_refusals | files absorbed / drained | RSS MiB start / peak / end | threads start / peak / end",
    );
    for p in phases {
        let s = &p.server;
        t.row([
            p.phase.clone(),
            s.clients_end.to_string(),
            s.refused_clients.to_string(),
            s.timed_out_clients.to_string(),
            s.busy_refusals.to_string(),
            format!("{} / {}", s.absorbed_files, s.drained_files),
            format!(
                "{:.0} / {:.0} / {:.0}",
                s.rss_start_mib, s.rss_peak_mib, s.rss_end_mib
            ),
            format!(
                "{} / {} / {}",
                s.threads_start, s.threads_peak, s.threads_end
            ),
        ]);
    }
    md.push(t);
    let mut t = Table::new(
        "What the attackers tried and how the server answered",
        "attack | from | case | tried | answers (count)",
    );
    for a in attacks {
        for (case, answers) in &a.answers {
            let mut v: Vec<(&String, &u64)> = answers.iter().collect();
            v.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
            let text = v
                .iter()
                .map(|(k, n)| format!("{k} ({n})"))
                .collect::<Vec<_>>()
                .join(", ");
            t.row([
                a.attack.clone(),
                a.from.clone(),
                case.clone(),
                answers.values().sum::<u64>().to_string(),
                text,
            ]);
        }
    }
    md.push(t);
    let extra = vec![
        ("load average at the start".to_string(), load.to_string()),
        (
            "server".into(),
            format!(
                "cascade_staging::Server with the defaults of `cascade stage-server` but a frame \
                 timeout of {} s and a drain memory of {} MiB ({} connections per address, {} \
                 receive buffers of {}); arenas and drain on {}",
                o.frame_timeout_s,
                o.drain_memory_mib,
                o.per_client_cap,
                ServerOptions::new("", PathBuf::new(), "", "").buffers,
                size_str(MAX_BODY as u64),
                o.arena_dir.display()
            ),
        ),
    ];
    md.push(machine_table(header, extra));
    md
}
