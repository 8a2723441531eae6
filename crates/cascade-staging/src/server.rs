//! The staging server (docs/staging.md): one thread per connection receives frames into a
//! pre-faulted buffer pool, IO threads append Write data to the engine's arenas, a Sync is
//! answered after a group fdatasync, and a drain thread rebuilds each sealed file in the
//! durable tier's plain layout (pausing while clients write), then writes the completion
//! markers of pushed checkpoints once all their files are there. Dedup chunks and manifests
//! (`dedup`) go to a chunk store beside the arenas and are pushed into the durable
//! repository by their own thread.

mod dedup;
pub mod metrics;
mod repository;
mod streaming;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cascade_durable::{DurableStore, FileDigest, MarkerFile};
use cascade_observe::tracing::Level as LogLevel;

use crate::chunks::ChunkOptions;
use crate::engine::{Engine, EngineOptions, Manifest, ManifestFile, VersionId, VersionInfo};
use crate::protocol::{
    self, code, encode_error, kind, read_header, write_frame, Header, Level, NoSigPipe, PullKind,
    PullState, RecvError, Request,
};
use crate::{hex, namespaced, ServerError as Error, ServerResult as Result};
use cascade_wire::auth::{proofs_match, JobKey, Transcript};
use cascade_wire::tls;

pub use cascade_wire::status::{DedupStatus, ServerStatus};

/// How a server is run (`cascade stage-server`, the `[stage_server]` config section).
#[derive(Clone)]
pub struct ServerOptions {
    /// Address to bind, e.g. `127.0.0.1:7070` (port 0 = any free port).
    pub listen: String,
    /// Directory on the server's SSD for arenas and the index.
    pub dir: PathBuf,
    /// The durable tier to drain to (a directory or `s3://` URL, as `durable.url`).
    pub drain_to: String,
    /// The shared secret every client must present in Hello.
    pub secret: cascade_secret::Secret,
    pub engine: EngineOptions,
    /// Receive buffers of [`protocol::MAX_BODY`] bytes, faulted in at start.
    pub buffers: usize,
    /// Threads appending to the arenas (each connection is served by one of them, in order).
    pub io_threads: usize,
    /// Arena writes (of up to 4 MiB each) in flight at once, server-wide: the IO threads hand
    /// a frame's extents to this many disk writer threads and go on with the next frame, so
    /// O_DIRECT writes overlap each other and the receiving of the next frames.
    pub writes_in_flight: usize,
    /// Bytes of received Write frames kept in memory after they are written, so that the
    /// drain uploads a sealed version from them instead of reading the arenas back (a
    /// version that does not fit drains from the arenas, as after a restart). 0: none.
    pub drain_memory: u64,
    /// Fault `drain_memory` in as spare receive buffers on a thread of its own once the
    /// server runs, so that its first large checkpoint does not pay the page faults (on a
    /// host with fragmented memory, 2.2 s of CPU per GiB for huge pages). Off by default;
    /// `cascade stage-server` turns it on (`stage_server.prefault_drain_memory`).
    pub prefault: bool,
    /// The drain pauses while a Write arrived less than this long ago.
    pub busy_window: Duration,
    /// While clients write, the drain reads at most one MiB per this pause.
    pub busy_pause: Duration,
    /// The dedup chunk store (segments in `dir/dedup`).
    pub chunks: ChunkOptions,
    /// A frame's header must arrive within this of its first byte, and its body within this
    /// once the server is ready to receive it (it has a buffer for it); a reply must be taken
    /// by the client within this. Else the connection is closed.
    pub frame_timeout: Duration,
    /// A Hello must arrive whole within this of connecting.
    pub hello_timeout: Duration,
    /// Most connections served at once; one more is refused with Error BUSY.
    pub max_connections: usize,
    /// Most connections served at once from one client IP address.
    pub max_connections_per_client: usize,
    /// Every connection speaks TLS with this config, its handshake first (within
    /// `hello_timeout`); None: plain TCP. There is no plain-text fallback.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Failed drains of one version in a row before it is retried only every
    /// [`DRAIN_RETRY_FAILED`] and counted in `drain_failed` (docs/staging.md, "Bounded state").
    pub drain_attempts: u32,
    /// A namespace's dedup repository is closed once unused this long with nothing of it
    /// waiting to be pushed (reopened on demand).
    pub dedup_repo_idle: Duration,
    /// Pending checkpoints and dedup manifests whose files or blobs reach the durable store
    /// by other servers are looked at again at least this often when nobody asks (an agent
    /// that watches asks at once: Pull, GetManifest); the fallback for a lost node.
    pub recheck_every: Duration,
    pub verbose: bool,
}

/// The drain URL may carry an S3 secret key: Debug shows it redacted.
impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("listen", &self.listen)
            .field("dir", &self.dir)
            .field("drain_to", &cascade_secret::redact_url(&self.drain_to))
            .field("secret", &self.secret)
            .field("engine", &self.engine)
            .field("buffers", &self.buffers)
            .field("io_threads", &self.io_threads)
            .field("writes_in_flight", &self.writes_in_flight)
            .field("drain_memory", &self.drain_memory)
            .field("prefault", &self.prefault)
            .field("busy_window", &self.busy_window)
            .field("busy_pause", &self.busy_pause)
            .field("chunks", &self.chunks)
            .field("frame_timeout", &self.frame_timeout)
            .field("hello_timeout", &self.hello_timeout)
            .field("max_connections", &self.max_connections)
            .field(
                "max_connections_per_client",
                &self.max_connections_per_client,
            )
            .field("tls", &self.tls.is_some())
            .field("drain_attempts", &self.drain_attempts)
            .field("dedup_repo_idle", &self.dedup_repo_idle)
            .field("recheck_every", &self.recheck_every)
            .field("verbose", &self.verbose)
            .finish()
    }
}

impl ServerOptions {
    pub fn new(listen: &str, dir: PathBuf, drain_to: &str, secret: &str) -> ServerOptions {
        ServerOptions {
            listen: listen.to_string(),
            dir,
            drain_to: drain_to.to_string(),
            secret: cascade_secret::Secret::new(secret),
            engine: EngineOptions::default(),
            buffers: 8,
            io_threads: 2,
            writes_in_flight: 4,
            drain_memory: 2 << 30,
            prefault: false,
            busy_window: Duration::from_millis(50),
            busy_pause: Duration::from_millis(10),
            chunks: ChunkOptions::default(),
            frame_timeout: Duration::from_secs(60),
            hello_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_connections_per_client: 64,
            tls: None,
            drain_attempts: 10,
            dedup_repo_idle: Duration::from_secs(300),
            recheck_every: Duration::from_secs(5),
            verbose: false,
        }
    }
}

/// Limits glibc's malloc arenas of this process to two. A staging server serves each
/// connection on a thread of its own, and glibc gives threads arenas of their own (up to
/// eight per core), each keeping what its threads freed: under a crowd of short-lived
/// connections the process's memory settled at the arenas' high-water marks, about 235 MiB
/// in the hostile-client soak (bench/results/hostile.md) against about 110 MiB with two.
/// For the server's process (`cascade stage-server`); call it first, before any thread.
pub fn limit_malloc_arenas() {
    // SAFETY: mallopt only tunes glibc's allocator; called before the process has threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Receive buffers. The base ones are faulted in once, so receiving never page-faults or
/// allocates. Connections get them in the order they asked: a stream of clients that each
/// hold one for long cannot starve a waiting one. A buffer whose bytes are kept for the drain
/// (`drain_memory`) is pinned until its versions drained; the pool puts a replacement in
/// service for each pinned one, so receiving always has the base count, and takes
/// replacements out of service again when pinned buffers come back.
struct BufferPool {
    free: Mutex<PoolState>,
    returned: Condvar,
    /// Most bytes of frames pinned for the drain at once (`drain_memory`).
    keep_budget: u64,
    /// Most spare buffers kept out of service (`keep_budget` in whole buffers).
    max_spares: usize,
}

struct PoolState {
    buffers: Vec<PoolBuf>,
    /// The next ticket handed out, and the one whose turn it is.
    next: u64,
    turn: u64,
    /// Buffers in service (free in `buffers` or in use): the base count plus replacements.
    in_service: usize,
    base: usize,
    /// Buffers pinned for the drain now, and the bytes of their frames.
    pinned: usize,
    pinned_bytes: u64,
    /// Buffers out of service, for the next replacements (at most `max_spares`): their
    /// pages stay in memory, so a checkpoint after the first one pays no page faults for
    /// them (not MADV_FREE: pages the kernel is free to drop would be faulted in again).
    spares: Vec<PoolBuf>,
}

/// Bytes a receive buffer holds: a body and room to shift a Write's data to an aligned
/// address.
const RECEIVE_BUFFER: usize = protocol::MAX_BODY + crate::engine::BLOCK;

/// A receive buffer (anonymous memory of its own, not the allocator's: a replacement's pages
/// are faulted in only as far as frames reach, and nothing zeroes it first) and what the
/// drain memory counts of it (0 while not pinned).
struct PoolBuf {
    buf: memmap2::MmapMut,
    pinned: Arc<AtomicU64>,
}

impl PoolBuf {
    fn map() -> io::Result<PoolBuf> {
        Ok(PoolBuf {
            buf: memmap2::MmapMut::map_anon(RECEIVE_BUFFER)?,
            pinned: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A replacement: in huge pages where the kernel allows, so that faulting it in as
    /// frames arrive costs one fault per 2 MiB instead of per 4 KiB.
    fn replacement() -> io::Result<PoolBuf> {
        let b = PoolBuf::map()?;
        // SAFETY: the range is exactly the new mapping; MADV_HUGEPAGE only advises the
        // kernel how to back it and changes no content.
        unsafe {
            libc::madvise(
                b.buf.as_ptr() as *mut libc::c_void,
                b.buf.len(),
                libc::MADV_HUGEPAGE,
            );
        }
        Ok(b)
    }
}

impl BufferPool {
    fn new(count: usize, keep_budget: u64) -> io::Result<BufferPool> {
        let base = count.max(1);
        let mut free = Vec::with_capacity(base);
        for _ in 0..base {
            let mut b = PoolBuf::map()?;
            // Every page written now, so receiving never faults.
            b.buf.fill(0xa5);
            free.push(b);
        }
        Ok(BufferPool {
            free: Mutex::new(PoolState {
                buffers: free,
                next: 0,
                turn: 0,
                in_service: base,
                base,
                pinned: 0,
                pinned_bytes: 0,
                spares: Vec::new(),
            }),
            returned: Condvar::new(),
            keep_budget,
            max_spares: usize::try_from(keep_budget / RECEIVE_BUFFER as u64).unwrap_or(0),
        })
    }

    /// Waits for a free buffer, first come first served: a full pool slows clients down
    /// instead of growing memory (it grows only by replacements of pinned buffers).
    fn take(&self) -> PoolBuf {
        let mut free = lock(&self.free);
        let ticket = free.next;
        free.next += 1;
        loop {
            if free.turn == ticket {
                if let Some(b) = free.buffers.pop() {
                    free.turn += 1;
                    // The next in line may find a buffer too.
                    self.returned.notify_all();
                    return b;
                }
                if free.in_service < free.base + free.pinned {
                    let b = free.spares.pop().or_else(|| PoolBuf::replacement().ok());
                    // (Out of memory for a replacement: wait for a buffer instead.)
                    if let Some(b) = b {
                        free.in_service += 1;
                        free.turn += 1;
                        self.returned.notify_all();
                        return b;
                    }
                }
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn give(&self, b: PoolBuf) {
        let mut free = lock(&self.free);
        let pinned = b.pinned.swap(0, Ordering::Relaxed);
        if pinned > 0 {
            free.pinned -= 1;
            free.pinned_bytes -= pinned;
        }
        if free.in_service > free.base + free.pinned {
            // A replacement no longer needed.
            free.in_service -= 1;
            if free.spares.len() < self.max_spares {
                free.spares.push(b);
            } else {
                drop(free);
                drop(b);
            }
            return;
        }
        free.buffers.push(b);
        self.returned.notify_all();
    }

    /// Pins a buffer holding `bytes` of frame for the drain, if the budget allows (true if
    /// it is pinned already).
    fn pin(&self, pinned: &AtomicU64, bytes: u64) -> bool {
        let mut free = lock(&self.free);
        if pinned.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let bytes = bytes.max(1);
        if free.pinned_bytes + bytes > self.keep_budget {
            return false;
        }
        pinned.store(bytes, Ordering::Relaxed);
        free.pinned += 1;
        free.pinned_bytes += bytes;
        // A receiver waiting for a buffer may now get a replacement.
        self.returned.notify_all();
        true
    }

    /// Bytes of frames pinned for the drain.
    fn pinned_bytes(&self) -> u64 {
        lock(&self.free).pinned_bytes
    }

    /// Bytes of spare buffers out of service, faulted in for the next replacements.
    fn spare_bytes(&self) -> u64 {
        (lock(&self.free).spares.len() * RECEIVE_BUFFER) as u64
    }

    /// Faults in spare buffers until spares and replacements in service reach the budget
    /// (or `stop`): one buffer at a time outside the lock, so receiving never waits for it.
    /// A failed mapping ends it (the replacements then fault in as frames arrive).
    fn prefault(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::SeqCst) {
            {
                let free = lock(&self.free);
                let replacements = free.in_service.saturating_sub(free.base);
                if free.spares.len() + replacements >= self.max_spares {
                    return;
                }
            }
            let Ok(mut b) = PoolBuf::replacement() else {
                return;
            };
            b.buf.fill(0xa5);
            let mut free = lock(&self.free);
            if free.spares.len() < self.max_spares {
                free.spares.push(b);
            }
        }
    }
}

/// A receive buffer shared as `Bytes` by a frame being absorbed and by the kept parts of its
/// versions; back to the pool when the last of them lets go.
struct Received {
    buf: Option<PoolBuf>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Received {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| &b.buf[..])
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

/// A sealed (or still arriving) version's bytes kept from its Write frames for the drain.
#[derive(Default)]
struct KeptVersion {
    /// (offset in the version, bytes), in the order written.
    parts: Vec<(u64, bytes::Bytes)>,
    /// Over the budget: drained from the arenas; nothing more is kept of it.
    spilled: bool,
}

/// Per-connection progress of its Write frames through the IO threads.
struct ConnState {
    namespace: String,
    /// (frames completed, first failure as (code, message)).
    done: Mutex<(u64, Option<(u16, String)>)>,
    completed: Condvar,
    /// Versions begun on this connection and not sealed: abandoned if it goes away.
    open: Mutex<HashMap<(String, u64), VersionId>>,
    /// A dedup manifest being received part by part (its temporary file goes with it).
    upload: Mutex<Option<crate::chunks::manifests::Upload>>,
    /// Arena writes of this connection's frames handed to the disk writers and not finished.
    writes: Mutex<u64>,
    written: Condvar,
}

impl ConnState {
    fn wait_for(&self, submitted: u64) -> Option<(u16, String)> {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while d.0 < submitted {
            d = self.completed.wait(d).unwrap_or_else(|p| p.into_inner());
        }
        d.1.clone()
    }

    fn failed(&self) -> bool {
        lock(&self.done).1.is_some()
    }

    /// Waits until every arena write handed to the disk writers for this connection is done.
    fn wait_writes(&self) {
        let mut w = lock(&self.writes);
        while *w > 0 {
            w = self.written.wait(w).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A Write frame being absorbed. The IO thread holds it while it walks the segments, each
/// disk write of its data while it runs; the last holder to let go gives the receive buffer
/// back to the pool and counts the frame done (after any failure was recorded).
struct InFlight {
    conn: Arc<ConnState>,
    /// The receive buffer; the body is `buf[at..at + len]`.
    buf: bytes::Bytes,
    at: usize,
    len: usize,
    /// What the drain memory counts of the buffer ([`BufferPool::pin`]).
    pinned: Arc<AtomicU64>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut d = lock(&self.conn.done);
        d.0 += 1;
        self.conn.completed.notify_all();
    }
}

/// One extent (at most `MAX_EXTENT` bytes) of a Write frame's data, for a disk writer.
struct DiskJob {
    frame: Arc<InFlight>,
    slot: usize,
    version: VersionId,
    /// Where the bytes go in the version.
    offset: u64,
    /// Where they are in `frame.buf`.
    data: std::ops::Range<usize>,
}

struct DiskQueue {
    jobs: Mutex<VecDeque<DiskJob>>,
    ready: Condvar,
    /// Set once the IO threads have exited: the writers leave when the queue is empty.
    closing: AtomicBool,
}

struct WriteJob {
    conn: Arc<ConnState>,
    buf: PoolBuf,
    /// The body is `buf[at..at + len]` (shifted so that its data starts block-aligned).
    at: usize,
    len: usize,
}

/// Where in `buf` a Write body whose first bytes are `prefix` should start so that its data
/// (after the descriptors, docs/staging-protocol.md "Write") begins at a BLOCK-aligned
/// address: then the engine writes its first segment with O_DIRECT straight from the
/// receive buffer (and the following ones too while the lengths before them are multiples
/// of BLOCK). 0 when the descriptors do not all lie in `prefix` or do not parse (the decoder
/// then says what is wrong).
fn aligned_body_at(prefix: &[u8], buf: &[u8]) -> usize {
    let data_at = || -> Option<usize> {
        let count = u32::from_le_bytes(prefix.get(0..4)?.try_into().ok()?);
        let mut at = 4usize;
        for _ in 0..count {
            let k = u16::from_le_bytes(prefix.get(at..at + 2)?.try_into().ok()?) as usize;
            // key, stamp, size, offset, len, sealed, blake3, tag
            at = at.checked_add(2 + k + 8 + 8 + 8 + 4 + 1 + 32 + 32)?;
            if at > prefix.len() {
                return None;
            }
        }
        Some(at)
    };
    let Some(d) = data_at() else { return 0 };
    let block = crate::engine::BLOCK;
    (block - (buf.as_ptr() as usize + d) % block) % block
}

struct IoQueue {
    jobs: Mutex<VecDeque<WriteJob>>,
    ready: Condvar,
}

#[derive(Default)]
struct Counters {
    clients: u64,
    refused_clients: u64,
    busy_refusals: u64,
    timed_out_clients: u64,
    absorbed_files: u64,
    absorbed_bytes: u64,
    drained_files: u64,
    drained_bytes: u64,
    superseded_files: u64,
    markers: u64,
    drain_failures: u64,
    /// Versions given up on hot retry (now retried every [`DRAIN_RETRY_FAILED`]).
    drain_failed: u64,
    watches: u64,
    watch_wakeups: u64,
    asked_rechecks: u64,
    timed_rechecks: u64,
    /// Versions drained from the bytes kept in memory, bytes the drain read from the
    /// arenas, versions that did not fit in `drain_memory`.
    drained_from_memory: u64,
    drain_arena_bytes: u64,
    drain_memory_spills: u64,
    /// Turns of the drain that left a sealed version for later while clients wrote.
    drain_yields: u64,
    /// Versions drained by a streaming upload, and streaming uploads given up
    /// (docs/staging.md, "Streaming drain").
    drained_streaming: u64,
    streaming_fallbacks: u64,
    last_error: Option<String>,
}

/// A version whose drain failed `drain_attempts` times in a row is retried this often: it
/// was acknowledged, so its bytes are kept (its arena too) until it drains or is superseded.
const DRAIN_RETRY_FAILED: Duration = Duration::from_secs(300);

/// Versions from this size up (to `SINGLE_PUT_MAX`) drain in one request from their mapped
/// arenas (`put_mapped`); smaller ones are read in (one request too).
const MAPPED_DRAIN_MIN: u64 = 8 << 20;

/// The longest a Watch is held before it is answered with the counter unchanged.
const MAX_WATCH: Duration = Duration::from_secs(30);

/// Log lines from one place in the code: at most [`LOG_BURST`] per [`LOG_WINDOW`], then one
/// line saying how many more were suppressed, so a failing drain or a stream of refused
/// clients cannot fill the server's stderr.
const LOG_BURST: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(60);

type LogSite = &'static std::panic::Location<'static>;

struct LogLimit {
    since: Instant,
    /// Per call site in this window: lines seen, and the first one (for the summary).
    sites: HashMap<LogSite, (u32, String)>,
    suppressed: u64,
}

impl LogLimit {
    /// Ends the window if it is over: the summary lines of what it suppressed.
    fn roll(&mut self) -> Vec<String> {
        if self.since.elapsed() < LOG_WINDOW {
            return Vec::new();
        }
        self.since = Instant::now();
        std::mem::take(&mut self.sites)
            .into_values()
            .filter(|(n, _)| *n > LOG_BURST)
            .map(|(n, first)| {
                format!(
                    "... {} more like \"{first}\" suppressed in the last {} s",
                    n - LOG_BURST,
                    LOG_WINDOW.as_secs()
                )
            })
            .collect()
    }
}

struct Shared {
    engine: Engine,
    durable: Arc<DurableStore>,
    dedup: dedup::Dedup,
    opts: ServerOptions,
    listen: SocketAddr,
    name: String,
    instance: u64,
    started: Instant,
    pool: Arc<BufferPool>,
    queues: Vec<IoQueue>,
    disk: DiskQueue,
    /// Versions' bytes kept in memory for the drain (`drain_memory`).
    kept: Mutex<HashMap<VersionId, KeptVersion>>,
    /// Uploads streaming while their versions arrive (`streaming`).
    feeds: Mutex<streaming::Feeds>,
    stream_stats: Arc<streaming::StreamStats>,
    counters: Mutex<Counters>,
    /// Milliseconds since `started` of the last Write frame.
    last_write_ms: AtomicU64,
    next_conn: AtomicU64,
    /// Connections being served: in total and per client address.
    conns: Mutex<(usize, HashMap<IpAddr, usize>)>,
    stop: AtomicBool,
    drain_wake: (Mutex<u64>, Condvar),
    /// The event counter Watch waits on: bumped when something reached the durable store
    /// (a file drained, a marker, a dedup push round, a dedup manifest).
    events: (Mutex<u64>, Condvar),
    log_limit: Mutex<LogLimit>,
    /// Pushes of repository objects: when received, and which manifests were refused.
    repository_pushes: Mutex<repository::RepositoryPushes>,
}

/// A bound staging server. [`Server::run`] serves until [`Stopper::stop`].
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
}

/// Stops a running server from another thread (or a signal handler thread).
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
}

impl Stopper {
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake_drain();
        self.shared.wake_push();
        self.shared.events.1.notify_all();
        for q in &self.shared.queues {
            q.ready.notify_all();
        }
        // Unblock accept().
        let _ = TcpStream::connect_timeout(&self.shared.listen, Duration::from_secs(1));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Server {
    /// Opens the arena directory (recovering what an earlier run acknowledged), checks the
    /// durable tier, binds the address and faults in the buffer pool.
    pub fn bind(opts: ServerOptions) -> Result<Server> {
        if opts.secret.is_empty() {
            return Err(Error::Config(
                "no shared secret: set staging.secret (CASCADE_STAGING_SECRET) or --secret".into(),
            ));
        }
        let durable = Arc::new(DurableStore::open(&opts.drain_to)?);
        let engine = Engine::open(&opts.dir, opts.engine.clone())?;
        // Arenas freed by a drain are deleted after the markers that drain completes.
        engine.defer_unlinks();
        let (dedup, warnings) = dedup::Dedup::open(&opts.dir.join("dedup"), opts.chunks.clone())?;
        for w in warnings {
            cascade_observe::warn!("cascade stage-server: recovered: {w}");
        }
        let listener = TcpListener::bind(&opts.listen)
            .map_err(|e| Error::io(format!("cannot listen on {}", opts.listen), e))?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("local address", e))?;
        let host = crate::host_name();
        let pool = BufferPool::new(opts.buffers, opts.drain_memory)
            .map_err(|e| Error::io("map the receive buffers", e))?;
        let queues = (0..opts.io_threads.max(1))
            .map(|_| IoQueue {
                jobs: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
            })
            .collect();
        let shared = Shared {
            engine,
            durable,
            dedup,
            listen,
            name: format!("{host}:{}", listen.port()),
            instance: random_u64(),
            started: Instant::now(),
            pool: Arc::new(pool),
            kept: Mutex::new(HashMap::new()),
            feeds: Mutex::new(HashMap::new()),
            stream_stats: Arc::default(),
            queues,
            disk: DiskQueue {
                jobs: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                closing: AtomicBool::new(false),
            },
            counters: Mutex::new(Counters::default()),
            repository_pushes: Mutex::default(),
            last_write_ms: AtomicU64::new(0),
            next_conn: AtomicU64::new(0),
            conns: Mutex::new((0, HashMap::new())),
            stop: AtomicBool::new(false),
            drain_wake: (Mutex::new(0), Condvar::new()),
            events: (Mutex::new(0), Condvar::new()),
            log_limit: Mutex::new(LogLimit {
                since: Instant::now(),
                sites: HashMap::new(),
                suppressed: 0,
            }),
            opts,
        };
        Ok(Server {
            shared: Arc::new(shared),
            listener,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    /// How the arenas are written: "O_DIRECT (...)" or "buffered (why)", for the start line.
    pub fn arena_io(&self) -> String {
        self.shared.engine.io_mode().to_string()
    }

    pub fn stopper(&self) -> Stopper {
        Stopper {
            shared: self.shared.clone(),
        }
    }

    pub fn status(&self) -> ServerStatus {
        self.shared.status()
    }

    /// Serves until stopped: IO threads, the drain thread, and a thread per connection,
    /// named as [`threads`] says.
    pub fn run(self) -> Result<()> {
        let shared = self.shared;
        let mut io_workers = Vec::new();
        for i in 0..shared.queues.len() {
            let s = shared.clone();
            io_workers.push(spawn_named(format!("{}{i}", threads::IO), move || {
                s.io_thread(i)
            })?);
        }
        let mut disk_writers = Vec::new();
        for _ in 0..shared.opts.writes_in_flight.max(1) {
            let s = shared.clone();
            disk_writers.push(spawn_named(threads::DISK.into(), move || s.disk_writer())?);
        }
        let mut workers = Vec::new();
        {
            let s = shared.clone();
            workers.push(spawn_named(threads::DRAIN.into(), move || s.drain_loop())?);
        }
        if shared.opts.prefault {
            let s = shared.clone();
            workers.push(spawn_named(threads::PREFAULT.into(), move || {
                s.pool.prefault(&s.stop)
            })?);
        }
        {
            let s = shared.clone();
            workers.push(spawn_named(threads::PUSH.into(), move || {
                s.dedup_push_loop()
            })?);
        }
        for stream in self.listener.incoming() {
            if shared.stop.load(Ordering::SeqCst) {
                break;
            }
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    shared.log(|| format!("accept failed: {e}"));
                    continue;
                }
            };
            let Some(slot) = shared.admit(&stream) else {
                continue;
            };
            let s = shared.clone();
            let serve = move || {
                let _slot = slot;
                s.serve(stream)
            };
            // Out of threads: this connection is dropped (its client retries), not the server.
            if let Err(e) = spawn_named(threads::CONN.into(), serve) {
                shared.log(|| format!("{e}"));
            }
        }
        for w in io_workers {
            let _ = w.join();
        }
        // The IO threads hand no more writes: let the writers finish the queued ones.
        shared.disk.closing.store(true, Ordering::SeqCst);
        shared.disk.ready.notify_all();
        for w in disk_writers.into_iter().chain(workers) {
            let _ = w.join();
        }
        // Uploads of versions never sealed are aborted (nothing half-written remains).
        shared.prune_streams(true);
        // What clients were told is durable already is; make the rest so too on a clean stop.
        shared.engine.sync()?;
        shared.engine.unlink_reclaimed();
        Ok(())
    }
}

/// The names of a server's threads, for `top -H` and `ps -L`, and for the bench, which
/// splits the servers' CPU by them (docs/staging.md, "The server").
pub mod threads {
    /// IO threads: `cascade-io-0`, `cascade-io-1`, ...
    pub const IO: &str = "cascade-io-";
    /// Disk writers (a frame's arena writes).
    pub const DISK: &str = "cascade-disk";
    /// One per connection.
    pub const CONN: &str = "cascade-conn";
    /// The drain of sealed versions.
    pub const DRAIN: &str = "cascade-drain";
    /// One per streaming drain upload.
    pub const STREAM: &str = "cascade-stream";
    /// One per pack staged as a file being uploaded (at most `PACK_DRAINS`).
    pub const PACK_DRAIN: &str = "cascade-pack-drain";
    /// The dedup push.
    pub const PUSH: &str = "cascade-push";
    /// Faults the drain memory in after the start (`ServerOptions::prefault`).
    pub const PREFAULT: &str = "cascade-prefault";
    /// The threads that take data in, all before it counts as staged (name prefixes).
    pub const RECEIVING: &[&str] = &[CONN, IO, DISK];
    /// The threads that drain staged files to the durable store (name prefixes).
    pub const DRAINING: &[&str] = &[DRAIN, STREAM, cascade_durable::RUNTIME_THREAD];
}

/// Starts a thread named `name`; failing to is an error, not a panic.
fn spawn_named<T: Send + 'static>(
    name: String,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(work)
        .map_err(|e| Error::io(format!("starting thread {name}"), e))
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b) ^ std::process::id() as u64
}

/// Bodies of frames other than Write and Push are small; refuse big ones before reading.
const SMALL_BODY: usize = 64 << 10;
/// A connection counted in [`Shared::conns`] until its thread ends.
struct ConnSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut g = lock(&self.shared.conns);
        g.0 = g.0.saturating_sub(1);
        if let Some(n) = g.1.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.1.remove(&self.ip);
            }
        }
    }
}

/// A stream read and written under deadlines: a peer that sends or takes bytes one at a
/// time cannot stretch a frame past its deadline, as per-call timeouts would let it. With
/// `idle_first`, the wait for the first byte has no deadline (connections may idle between
/// frames) and the deadline starts when it arrives.
struct Timed<'a> {
    stream: &'a TcpStream,
    until: Option<Instant>,
    idle_first: Option<Duration>,
}

impl<'a> Timed<'a> {
    fn until(stream: &'a TcpStream, deadline: Instant) -> Timed<'a> {
        Timed {
            stream,
            until: Some(deadline),
            idle_first: None,
        }
    }

    /// Deadline `within` from the first byte read.
    fn from_first_byte(stream: &'a TcpStream, within: Duration) -> Timed<'a> {
        Timed {
            stream,
            until: None,
            idle_first: Some(within),
        }
    }

    /// What is left before the deadline (None: no deadline yet), or TimedOut.
    fn left(&self) -> io::Result<Option<Duration>> {
        match self.until {
            None => Ok(None),
            Some(until) => match until.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Ok(Some(left)),
                _ => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the frame deadline passed",
                )),
            },
        }
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(left)?;
        let n = match (&*self.stream).read(buf) {
            // A timeout is reported as WouldBlock on Linux.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the frame deadline passed",
                ))
            }
            other => other?,
        };
        if n > 0 {
            if let Some(within) = self.idle_first.take() {
                self.until = Some(Instant::now() + within);
            }
        }
        Ok(n)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(left)?;
        NoSigPipe(self.stream).write(buf).map_err(timed_out)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(left)?;
        NoSigPipe(self.stream)
            .write_vectored(bufs)
            .map_err(timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One connection's byte stream: plain TCP, or a TLS session over it. Only the
/// connection's thread reads and writes it, always through [`Link::by`] and its kin, so
/// every byte, TLS records included, moves under a deadline.
struct Link {
    stream: TcpStream,
    tls: Option<rustls::ServerConnection>,
}

impl Link {
    /// Starts a connection: with a TLS config, the whole handshake, done by `deadline`.
    /// A TLS failure is an `InvalidData` error holding the rustls error.
    fn open(
        stream: TcpStream,
        config: Option<&Arc<rustls::ServerConfig>>,
        deadline: Instant,
    ) -> io::Result<Link> {
        let Some(config) = config else {
            return Ok(Link { stream, tls: None });
        };
        let mut conn = rustls::ServerConnection::new(config.clone()).map_err(io::Error::other)?;
        {
            let mut timed = Timed::until(&stream, deadline);
            while conn.is_handshaking() {
                conn.complete_io(&mut timed)?;
            }
        }
        Ok(Link {
            stream,
            tls: Some(conn),
        })
    }

    /// Reads and writes within `within` from now.
    fn by(&mut self, within: Duration) -> LinkIo<'_> {
        self.until(Instant::now() + within)
    }

    fn until(&mut self, deadline: Instant) -> LinkIo<'_> {
        LinkIo {
            timed: Timed::until(&self.stream, deadline),
            tls: self.tls.as_mut(),
        }
    }

    /// Reads with no deadline for the first byte and `within` from it (see [`Timed`]).
    fn idle_then_within(&mut self, within: Duration) -> LinkIo<'_> {
        LinkIo {
            timed: Timed::from_first_byte(&self.stream, within),
            tls: self.tls.as_mut(),
        }
    }

    /// The TLS session's exported keying material ([`tls::channel_binding`]); None on plain
    /// TCP. For the Hello's authentication proofs to bind to this session.
    fn channel_binding(&self) -> Option<[u8; 32]> {
        self.tls.as_ref().and_then(|c| tls::channel_binding(c))
    }
}

/// Reads and writes of a [`Link`] under one deadline. TLS buffers records: flush after
/// writing.
struct LinkIo<'a> {
    timed: Timed<'a>,
    tls: Option<&'a mut rustls::ServerConnection>,
}

impl Read for LinkIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.timed.read(buf),
            Some(conn) => rustls::Stream::new(conn, &mut self.timed).read(buf),
        }
    }
}

impl Write for LinkIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.timed.write(buf),
            Some(conn) => rustls::Stream::new(conn, &mut self.timed).write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            None => self.timed.write_vectored(bufs),
            Some(conn) => rustls::Stream::new(conn, &mut self.timed).write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self.tls.as_deref_mut() {
            None => Ok(()),
            Some(conn) => rustls::Stream::new(conn, &mut self.timed).flush(),
        }
    }
}

/// A send timeout (WouldBlock on Linux) as TimedOut.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "the reply deadline passed")
    } else {
        e
    }
}

/// The replies to one request, sent once the request's receive buffer went back to the
/// pool: a client that does not take its replies never holds a pool buffer.
#[derive(Default)]
struct Outbox {
    frames: RefCell<Vec<OutFrame>>,
}

/// A reply frame: a header, body parts in memory, and for a large ReadOk the rest of its
/// data, read from the arenas a piece at a time while it is sent.
struct OutFrame {
    header: Header,
    body: Vec<Vec<u8>>,
    tail: Option<ReadTail>,
}

/// `len` bytes of version `id` from `offset` on, the end of a ReadOk's body.
struct ReadTail {
    id: VersionId,
    key: String,
    offset: u64,
    len: usize,
}

/// A ReadOk's data is read and sent in pieces of this size: a client that does not take its
/// reply holds this much of the server's memory, not 16 MiB.
const READ_PIECE: usize = 256 << 10;

impl Outbox {
    fn push(&self, header: Header, body: Vec<Vec<u8>>) {
        self.frames.borrow_mut().push(OutFrame {
            header,
            body,
            tail: None,
        });
    }
}

impl Shared {
    /// A line for the verbose log (`-v`), rate-limited per call site.
    #[track_caller]
    fn log(&self, line: impl FnOnce() -> String) {
        if self.opts.verbose {
            self.say(std::panic::Location::caller(), LogLevel::INFO, line());
        }
    }

    /// A failure: always logged (rate-limited per call site) and kept as `last_error`.
    #[track_caller]
    fn fail(&self, line: String) {
        self.say(std::panic::Location::caller(), LogLevel::WARN, line.clone());
        metrics::note_error();
        let mut c = lock(&self.counters);
        c.last_error = Some(line);
    }

    /// A line always logged (rate-limited per call site), not a failure.
    #[track_caller]
    fn notice(&self, line: String) {
        self.say(std::panic::Location::caller(), LogLevel::INFO, line);
    }

    /// Every server log line goes through here: lines from one call site are alike, the
    /// first [`LOG_BURST`] of them per [`LOG_WINDOW`] are printed, the rest counted.
    fn say(&self, site: LogSite, level: LogLevel, line: String) {
        let (summary, print) = {
            let mut g = lock(&self.log_limit);
            let summary = g.roll();
            let entry = g.sites.entry(site).or_insert_with(|| (0, String::new()));
            entry.0 = entry.0.saturating_add(1);
            if entry.0 == 1 {
                entry.1 = line.chars().take(120).collect();
            }
            let print = entry.0 <= LOG_BURST;
            if !print {
                g.suppressed += 1;
            }
            (summary, print)
        };
        for s in summary {
            cascade_observe::info!("cascade stage-server {}: {s}", self.name);
        }
        if print && level == LogLevel::WARN {
            cascade_observe::warn!("cascade stage-server {}: {line}", self.name);
        } else if print {
            cascade_observe::info!("cascade stage-server {}: {line}", self.name);
        }
    }

    /// Prints the summary of a window that ended with no line after it (from the drain
    /// loop, so that "N more suppressed" is not held back until the next failure).
    fn tend_log(&self) {
        let summary = lock(&self.log_limit).roll();
        for s in summary {
            cascade_observe::info!("cascade stage-server {}: {s}", self.name);
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn ingest_active(&self) -> bool {
        !self.ingest_left().is_zero()
    }

    /// How long clients count as writing from now on: what is left of `busy_window` since
    /// the last Write arrived (zero if none arrived within it).
    fn ingest_left(&self) -> Duration {
        let last = self.last_write_ms.load(Ordering::Relaxed);
        if last == 0 {
            return Duration::ZERO;
        }
        let since = Duration::from_millis(self.now_ms().saturating_sub(last));
        self.opts.busy_window.saturating_sub(since)
    }

    /// Something reached the durable store: wakes the watchers.
    fn event(&self) {
        let (m, cv) = &self.events;
        *lock(m) += 1;
        cv.notify_all();
    }

    /// Answers a Watch once the event counter is above `after`, the wait ran out (at most
    /// [`MAX_WATCH`]), or the server stops.
    fn watch(&self, after: u64, wait_ms: u32) -> u64 {
        let wait = Duration::from_millis(u64::from(wait_ms)).min(MAX_WATCH);
        let deadline = Instant::now() + wait;
        let (m, cv) = &self.events;
        let mut g = lock(m);
        while *g <= after && !self.stop.load(Ordering::SeqCst) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = cv
                .wait_timeout(g, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let now = *g;
        drop(g);
        let mut c = lock(&self.counters);
        c.watches += 1;
        if now > after {
            c.watch_wakeups += 1;
        }
        now
    }

    fn wake_drain(&self) {
        let (m, cv) = &self.drain_wake;
        *lock(m) += 1;
        cv.notify_all();
    }

    fn status(&self) -> ServerStatus {
        let c = lock(&self.counters);
        let drainable = self.engine.drainable();
        ServerStatus {
            server: self.name.clone(),
            pid: std::process::id(),
            instance: self.instance,
            listen: self.listen.to_string(),
            dir: self.opts.dir.display().to_string(),
            drain_to: self.durable.name().to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            clients: c.clients,
            refused_clients: c.refused_clients,
            busy_refusals: c.busy_refusals,
            timed_out_clients: c.timed_out_clients,
            absorbed_files: c.absorbed_files,
            absorbed_bytes: c.absorbed_bytes,
            drained_files: c.drained_files,
            drained_bytes: c.drained_bytes,
            superseded_files: c.superseded_files,
            markers: c.markers,
            pending_files: drainable.len() as u64,
            pending_bytes: drainable.iter().map(|v| v.size).sum(),
            pending_checkpoints: self.engine.pending_manifests().len() as u64,
            drain_failures: c.drain_failures,
            drain_failed: c.drain_failed,
            log_suppressed: lock(&self.log_limit).suppressed,
            last_error: c.last_error.clone(),
            usage: self.engine.usage(),
            dedup: self.dedup_status(),
            events: *lock(&self.events.0),
            watches: c.watches,
            watch_wakeups: c.watch_wakeups,
            asked_rechecks: c.asked_rechecks,
            timed_rechecks: c.timed_rechecks,
            drain_memory: self.pool.pinned_bytes(),
            drain_memory_budget: self.opts.drain_memory,
            drain_memory_spare: self.pool.spare_bytes(),
            drained_from_memory: c.drained_from_memory,
            drain_arena_bytes: c.drain_arena_bytes,
            drain_memory_spills: c.drain_memory_spills,
            drained_streaming: c.drained_streaming,
            streaming_fallbacks: c.streaming_fallbacks,
            streamed_bytes: self.stream_stats.streamed_bytes(),
            drain_yields: c.drain_yields,
        }
    }

    // ---- connections ----

    /// Counts a new connection in, or refuses it with Error BUSY (without reading from it
    /// and without a thread) when the server serves `max_connections` already, or
    /// `max_connections_per_client` from its address. With TLS on, the refusal is a plain
    /// close: the Error frame would have to wait for a TLS handshake, i.e. a thread.
    fn admit(self: &Arc<Self>, stream: &TcpStream) -> Option<ConnSlot> {
        let ip = match stream.peer_addr() {
            Ok(a) => a.ip(),
            Err(_) => return None,
        };
        let why = {
            let mut g = lock(&self.conns);
            let from_ip = g.1.get(&ip).copied().unwrap_or(0);
            if g.0 >= self.opts.max_connections {
                Some(format!(
                    "the server serves {} connections, its limit: try again later",
                    g.0
                ))
            } else if from_ip >= self.opts.max_connections_per_client {
                Some(format!(
                    "the server serves {from_ip} connections from {ip}, its limit per client: \
                     try again later"
                ))
            } else {
                g.0 += 1;
                *g.1.entry(ip).or_insert(0) += 1;
                None
            }
        };
        let Some(why) = why else {
            return Some(ConnSlot {
                shared: self.clone(),
                ip,
            });
        };
        lock(&self.counters).busy_refusals += 1;
        self.notice(format!("refused {ip}: {why}"));
        // The accepting thread must not wait on this peer: a small frame into an empty send
        // buffer, without blocking.
        if self.opts.tls.is_none() {
            let _ = stream.set_nonblocking(true);
            let body = encode_error(code::BUSY, &why);
            let header = Header {
                kind: kind::ERROR,
                body_len: body.len() as u32,
                request: 0,
            };
            let _ = write_frame(&mut NoSigPipe(stream), header, &[&body]);
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        None
    }

    /// Sends what `out` holds, all of it within the frame timeout; false if that failed (the
    /// connection is then closed).
    fn flush(&self, link: &mut Link, out: &Outbox, peer: &str) -> bool {
        let frames = std::mem::take(&mut *out.frames.borrow_mut());
        if frames.is_empty() {
            return true;
        }
        let mut w = link.by(self.opts.frame_timeout);
        for f in frames {
            let parts: Vec<&[u8]> = f.body.iter().map(|b| b.as_slice()).collect();
            if let Err(e) = write_frame(&mut w, f.header, &parts) {
                self.lost(peer, &e);
                return false;
            }
            let Some(tail) = f.tail else { continue };
            let mut piece = vec![0u8; tail.len.min(READ_PIECE)];
            let mut done = 0;
            while done < tail.len {
                let want = (tail.len - done).min(READ_PIECE);
                let at = tail.offset + done as u64;
                match self.engine.read_at(tail.id, at, &mut piece[..want]) {
                    Ok(n) if n == want => {}
                    // The header promised these bytes: all the client can be told now is
                    // that the connection broke (it then reads elsewhere).
                    Ok(n) => {
                        self.fail(format!(
                            "read of {} stopped at byte {} ({n} of {want} bytes), midway through its reply; connection closed",
                            tail.key,
                            at + n as u64
                        ));
                        return false;
                    }
                    Err(e) => {
                        self.fail(format!(
                            "read of {} failed midway through its reply: {e}; connection closed",
                            tail.key
                        ));
                        return false;
                    }
                }
                if let Err(e) = w.write_all(&piece[..want]) {
                    self.lost(peer, &e);
                    return false;
                }
                done += want;
            }
        }
        if let Err(e) = w.flush() {
            self.lost(peer, &e);
            return false;
        }
        true
    }

    /// Logs a connection that failed, counting the ones that ran out of time.
    fn lost(&self, peer: &str, e: &io::Error) {
        if e.kind() == io::ErrorKind::TimedOut {
            lock(&self.counters).timed_out_clients += 1;
        }
        self.log(|| format!("{peer}: connection lost: {e}"));
    }

    fn serve(self: Arc<Self>, stream: TcpStream) {
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let _ = stream.set_nodelay(true);
        // The TLS handshake and the Hello share one deadline.
        let hello_by = Instant::now() + self.opts.hello_timeout;
        let mut link = match Link::open(stream, self.opts.tls.as_ref(), hello_by) {
            Ok(link) => link,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                lock(&self.counters).refused_clients += 1;
                let plain_client = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|r| matches!(r, rustls::Error::InvalidMessage(_)));
                let hint = if plain_client {
                    " (a client without TLS? give it staging.tls_ca)"
                } else {
                    ""
                };
                self.notice(format!("refused {peer}: TLS handshake failed: {e}{hint}"));
                return;
            }
            Err(e) => {
                self.lost(&peer, &e);
                return;
            }
        };
        let conn_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let mut small = Vec::with_capacity(SMALL_BODY);
        let out = Outbox::default();
        let Some((namespace, job_key)) =
            self.handshake(&mut link, hello_by, &mut small, &peer, &out)
        else {
            return;
        };
        lock(&self.counters).clients += 1;
        let conn = Arc::new(ConnState {
            namespace,
            done: Mutex::new((0, None)),
            completed: Condvar::new(),
            open: Mutex::new(HashMap::new()),
            upload: Mutex::new(None),
            writes: Mutex::new(0),
            written: Condvar::new(),
        });
        let mut submitted = 0u64;
        let queue = &self.queues[(conn_id % self.queues.len() as u64) as usize];
        let within = self.opts.frame_timeout;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                self.reply_error(&out, 0, code::SHUTTING_DOWN, "server is stopping");
                self.flush(&mut link, &out, &peer);
                break;
            }
            let header = match read_header(&mut link.idle_then_within(within)) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(RecvError::Frame(e)) => {
                    self.log(|| format!("{peer}: {e}"));
                    self.reply_error(&out, 0, e.code(), &e.to_string());
                    self.flush(&mut link, &out, &peer);
                    break;
                }
                Err(RecvError::Io(e)) => {
                    self.lost(&peer, &e);
                    break;
                }
            };
            let len = header.body_len as usize;
            if protocol::is_large_kind(header.kind) || len > SMALL_BODY {
                if !protocol::is_large_kind(header.kind) {
                    let msg = format!("a {len}-byte body is too large for this message");
                    self.reply_error(&out, header.request, code::BAD_FRAME, &msg);
                    self.flush(&mut link, &out, &peer);
                    break;
                }
                // The first 64 KiB (or all of a smaller body) must arrive before the body gets
                // a receive buffer: a client dripping a body holds none.
                let first = len.min(SMALL_BODY);
                small.resize(first, 0);
                if let Err(e) = link.by(within).read_exact(&mut small[..first]) {
                    self.lost(&peer, &e);
                    break;
                }
                let mut buf = self.pool.take();
                let at = if header.kind == kind::WRITE {
                    aligned_body_at(&small[..first], &buf.buf)
                } else {
                    0
                };
                buf.buf[at..at + first].copy_from_slice(&small[..first]);
                // The rest's deadline starts now that the server is ready for it.
                if let Err(e) = link
                    .by(within)
                    .read_exact(&mut buf.buf[at + first..at + len])
                {
                    self.pool.give(buf);
                    self.lost(&peer, &e);
                    break;
                }
                if header.kind == kind::WRITE {
                    let refusal = match Request::decode(kind::WRITE, &buf.buf[at..at + len]) {
                        Err(e) => Some((e.code(), e.to_string())),
                        Ok(request) => reserved_name_in(&request)
                            .or_else(|| untagged_seal_in(&request, &job_key)),
                    };
                    if let Some((code, why)) = refusal {
                        self.pool.give(buf);
                        self.log(|| format!("{peer}: {why}"));
                        self.reply_error(&out, header.request, code, &why);
                        self.flush(&mut link, &out, &peer);
                        break;
                    }
                    self.last_write_ms
                        .store(self.now_ms().max(1), Ordering::Relaxed);
                    submitted += 1;
                    lock(&queue.jobs).push_back(WriteJob {
                        conn: conn.clone(),
                        buf,
                        at,
                        len,
                    });
                    queue.ready.notify_one();
                    continue;
                }
                let keep = self.handle(&out, header, &buf.buf[at..at + len], &conn, submitted);
                // Back to the pool before the reply is sent: a client that does not read
                // its replies must not hold a receive buffer.
                self.pool.give(buf);
                if !self.flush(&mut link, &out, &peer) || !keep {
                    break;
                }
                continue;
            }
            small.resize(len, 0);
            if let Err(e) = link.by(within).read_exact(&mut small[..len]) {
                self.lost(&peer, &e);
                break;
            }
            let keep = self.handle(&out, header, &small[..len], &conn, submitted);
            if !self.flush(&mut link, &out, &peer) || !keep {
                break;
            }
        }
        // Let queued frames finish, then drop what this client never sealed (and a manifest
        // it never finished sending).
        conn.wait_for(submitted);
        lock(&conn.upload).take();
        let open: Vec<VersionId> = lock(&conn.open).drain().map(|(_, v)| v).collect();
        for v in open {
            self.stop_stream(v, "its client went away before sealing it");
            self.engine.abandon(v);
        }
        let mut c = lock(&self.counters);
        c.clients = c.clients.saturating_sub(1);
    }

    /// Hello, Challenge, Auth, AuthOk (docs/staging-protocol.md, "Hello and Auth"), all of
    /// it by `deadline` (the Hello timeout after connecting, the TLS handshake included): the
    /// client proves it holds the key of the namespace it claims, the server proves it back.
    /// The namespace and its key on success; the replies (or the refusal) are sent.
    fn handshake(
        &self,
        link: &mut Link,
        deadline: Instant,
        buf: &mut Vec<u8>,
        peer: &str,
        out: &Outbox,
    ) -> Option<(String, JobKey)> {
        let header = match self.handshake_frame(link, buf, peer, deadline, kind::HELLO) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(refusal) => return self.refuse_handshake(link, out, peer, refusal),
        };
        let Ok(Request::Hello(hello)) = Request::decode(kind::HELLO, buf) else {
            return None;
        };
        let namespace = hello.namespace.to_string();
        let client = hello.client.to_string();
        let client_nonce = hello.nonce;
        let server_nonce = match cascade_wire::auth::nonce() {
            Ok(n) => n,
            Err(e) => {
                self.fail(format!("no random nonce for {peer}: {e}"));
                let why = "the server has no random numbers".to_string();
                return self.refuse_handshake(link, out, peer, (header.request, code::IO, why));
            }
        };
        let body = protocol::encode_challenge(&self.name, self.instance, &server_nonce);
        self.reply(out, header.request, kind::HELLO, &[&body]);
        if !self.flush(link, out, peer) {
            return None;
        }
        let header = match self.handshake_frame(link, buf, peer, deadline, kind::AUTH) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(refusal) => return self.refuse_handshake(link, out, peer, refusal),
        };
        let Ok(Request::Auth { proof }) = Request::decode(kind::AUTH, buf) else {
            return None;
        };
        let key = JobKey::derive(self.opts.secret.expose(), &namespace);
        // Over TLS the proofs cover the session's keying material too.
        let transcript = Transcript {
            namespace: &namespace,
            client_nonce,
            server_nonce,
            binding: link.channel_binding(),
        };
        if !proofs_match(&proof, &key.client_proof(&transcript)) {
            let shown = if namespace.is_empty() {
                "the whole server (no namespace)".to_string()
            } else {
                format!("namespace {namespace:?}")
            };
            let why = format!(
                "the client's credential does not open {shown}: a wrong staging secret, or a \
                 job credential made for another namespace or cluster"
            );
            return self.refuse_handshake(link, out, peer, (header.request, code::AUTH, why));
        }
        self.log(|| format!("{peer} ({client}) authenticated for namespace {namespace:?}"));
        let body = protocol::encode_auth_ok(&key.server_proof(&transcript));
        self.reply(out, header.request, kind::AUTH, &[&body]);
        if !self.flush(link, out, peer) {
            return None;
        }
        Some((namespace, key))
    }

    /// Answers a failed handshake with Error (request, code, reason), counted and logged.
    fn refuse_handshake<T>(
        &self,
        link: &mut Link,
        out: &Outbox,
        peer: &str,
        (request, code, why): (u32, u16, String),
    ) -> Option<T> {
        lock(&self.counters).refused_clients += 1;
        self.notice(format!("refused {peer}: {why}"));
        self.reply_error(out, request, code, &why);
        self.flush(link, out, peer);
        None
    }

    /// Reads one handshake frame of kind `want` (small, whole by `deadline`) into `buf`.
    /// Ok(None): the peer went away (logged); Err: refuse with (request, code, reason).
    /// The body is checked to decode, so the caller's decode cannot fail.
    fn handshake_frame(
        &self,
        link: &mut Link,
        buf: &mut Vec<u8>,
        peer: &str,
        deadline: Instant,
        want: u8,
    ) -> std::result::Result<Option<Header>, (u32, u16, String)> {
        let mut reader = link.until(deadline);
        let header = match read_header(&mut reader) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(None),
            Err(RecvError::Io(e)) => {
                self.lost(peer, &e);
                return Ok(None);
            }
            Err(RecvError::Frame(e)) => return Err((0, e.code(), e.to_string())),
        };
        if header.kind != want {
            let why = if want == kind::HELLO {
                "the first message must be Hello"
            } else {
                "Hello must be followed by Auth"
            };
            return Err((header.request, code::AUTH, why.into()));
        }
        if header.body_len as usize > SMALL_BODY {
            return Err((
                header.request,
                code::BAD_FRAME,
                "handshake frame is too large".into(),
            ));
        }
        buf.resize(header.body_len as usize, 0);
        if let Err(e) = reader.read_exact(buf) {
            self.lost(peer, &e);
            return Ok(None);
        }
        if let Err(e) = Request::decode(want, buf) {
            return Err((header.request, e.code(), e.to_string()));
        }
        Ok(Some(header))
    }

    /// Queues a reply frame (a copy of `body`) in `out`.
    fn reply(&self, out: &Outbox, request: u32, req_kind: u8, body: &[&[u8]]) {
        self.reply_owned(
            out,
            request,
            req_kind,
            body.iter().map(|b| b.to_vec()).collect(),
        );
    }

    /// Queues a reply frame whose body is `body`'s parts, moved in.
    fn reply_owned(&self, out: &Outbox, request: u32, req_kind: u8, body: Vec<Vec<u8>>) {
        let len: usize = body.iter().map(|b| b.len()).sum();
        let header = Header {
            kind: req_kind | kind::REPLY,
            body_len: len as u32,
            request,
        };
        out.push(header, body);
    }

    fn reply_error(&self, out: &Outbox, request: u32, code: u16, message: &str) {
        let body = encode_error(code, message);
        let header = Header {
            kind: kind::ERROR,
            body_len: body.len() as u32,
            request,
        };
        out.push(header, vec![body]);
    }

    /// Answers one request other than Write; false closes the connection.
    fn handle(
        &self,
        out: &Outbox,
        header: Header,
        body: &[u8],
        conn: &ConnState,
        submitted: u64,
    ) -> bool {
        let request = match Request::decode(header.kind, body) {
            Ok(r) => r,
            Err(e) => {
                self.reply_error(out, header.request, e.code(), &e.to_string());
                return false;
            }
        };
        if let Some((code, why)) = reserved_name_in(&request) {
            self.reply_error(out, header.request, code, &why);
            return false;
        }
        let ns = conn.namespace.as_str();
        let id = header.request;
        match request {
            Request::Hello(_) | Request::Auth { .. } => {
                self.reply_error(out, id, code::BAD_FRAME, "the handshake is over");
                return false;
            }
            Request::Write(_) => return false,
            Request::Sync => {
                if let Some((c, why)) = conn.wait_for(submitted) {
                    self.reply_error(out, id, c, &why);
                    return false;
                }
                match self.engine.sync() {
                    Ok(()) => {
                        self.wake_drain();
                        self.reply(out, id, kind::SYNC, &[])
                    }
                    Err(e) => {
                        let (c, why) = engine_code(&e);
                        self.fail(format!("sync failed: {why}"));
                        self.reply_error(out, id, c, &why);
                        return false;
                    }
                }
            }
            Request::Read { key, offset, len } => {
                return self.read(out, id, &namespaced(ns, key), offset, len as usize);
            }
            Request::Push {
                checkpoint,
                single_file,
                files,
            } => {
                let manifest = Manifest {
                    checkpoint: namespaced(ns, checkpoint),
                    single_file,
                    files: files
                        .into_iter()
                        .map(|f| ManifestFile {
                            path: f.path,
                            size: f.size,
                            blake3: f.blake3,
                        })
                        .collect(),
                };
                let checkpoint = manifest.checkpoint.clone();
                let repository = repository::repository_push(&manifest).is_some();
                let recorded = self
                    .engine
                    .record_manifest(manifest)
                    .and_then(|push| self.engine.sync().map(|()| push));
                match recorded {
                    Ok(push) => {
                        if repository {
                            lock(&self.repository_pushes).received(push, checkpoint);
                        }
                        self.wake_drain();
                        self.reply(out, id, kind::PUSH, &[])
                    }
                    Err(e) => {
                        let (c, why) = engine_code(&e);
                        self.reply_error(out, id, c, &why);
                        return false;
                    }
                }
            }
            Request::Pull(queries) => {
                let states: Vec<PullState> = queries
                    .iter()
                    .map(|(what, key)| self.pull_one(*what, &namespaced(ns, key)))
                    .collect();
                // A client asking about a checkpoint still waiting here has heard of a drain
                // elsewhere (Watch): the drain thread looks at the pending ones now.
                let waits = queries.iter().zip(&states).any(|((what, _), st)| {
                    *what == PullKind::Checkpoint && st.level == Level::Staged
                });
                if waits {
                    lock(&self.counters).asked_rechecks += 1;
                    self.wake_drain();
                }
                self.reply(out, id, kind::PULL, &[&protocol::encode_pull_ok(&states)])
            }
            Request::Ping => self.reply(out, id, kind::PING, &[]),
            Request::Status => {
                let json = serde_json::to_string(&self.status()).unwrap_or_default();
                self.reply(out, id, kind::STATUS, &[json.as_bytes()])
            }
            Request::Goodbye => {
                self.reply(out, id, kind::GOODBYE, &[]);
                return false;
            }
            Request::Lacks(scores) => return self.lacks(out, id, ns, &scores),
            Request::PutChunks(chunks) => return self.put_chunks(out, id, ns, &chunks),
            Request::PutManifest(part) => return self.put_manifest(out, id, ns, &part, conn),
            Request::GetChunks(scores) => return self.get_chunks(out, id, ns, &scores),
            Request::GetManifest { checkpoint } => {
                return self.get_manifest(out, id, ns, checkpoint)
            }
            Request::Watch { after, wait_ms } => {
                let events = self.watch(after, wait_ms);
                self.reply(out, id, kind::WATCH, &[&protocol::encode_watch_ok(events)])
            }
        };
        true
    }

    fn pull_one(&self, what: PullKind, key: &str) -> PullState {
        let unknown = PullState {
            level: Level::Unknown,
            stamp: 0,
            size: 0,
            blake3: [0; 32],
        };
        match what {
            PullKind::File => match self.engine.lookup(key) {
                Some(v) => PullState {
                    level: if v.drained {
                        Level::Durable
                    } else {
                        Level::Staged
                    },
                    stamp: v.stamp,
                    size: v.size,
                    blake3: v.blake3,
                },
                None => unknown,
            },
            // A refused manifest: the agent stores the checkpoint itself.
            PullKind::Checkpoint if lock(&self.repository_pushes).refused(key) => unknown,
            PullKind::Checkpoint => match self.engine.manifest_state(key) {
                Some(done) => PullState {
                    level: if done { Level::Durable } else { Level::Staged },
                    ..unknown
                },
                None => unknown,
            },
        }
    }

    fn read(&self, out: &Outbox, id: u32, key: &str, offset: u64, len: usize) -> bool {
        let Some(v) = self.engine.lookup(key) else {
            self.reply_error(out, id, code::NOT_FOUND, &format!("{key}: not staged here"));
            return true;
        };
        let want = len.min(v.size.saturating_sub(offset) as usize);
        // Not a pool buffer: the reply is sent after this returns, and a client that does
        // not read it must hold no receive buffer meanwhile. The first piece is read now, so
        // that a version already reclaimed, or a failed check, is answered by an Error; the
        // rest is read while the reply is sent.
        let first = want.min(READ_PIECE);
        let mut buf = vec![0u8; first];
        match self.engine.read_at(v.id, offset, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                let head = protocol::encode_read_ok_head(
                    v.stamp,
                    v.size,
                    &v.blake3,
                    &v.tag.unwrap_or([0; 32]),
                );
                let tail = (n == first && want > first).then(|| ReadTail {
                    id: v.id,
                    key: key.to_string(),
                    offset: offset + first as u64,
                    len: want - first,
                });
                let len = head.len() + n + tail.as_ref().map_or(0, |t| t.len);
                out.frames.borrow_mut().push(OutFrame {
                    header: Header {
                        kind: kind::READ | kind::REPLY,
                        body_len: len as u32,
                        request: id,
                    },
                    body: vec![head, buf],
                    tail,
                });
            }
            Err(crate::engine::Error::Invalid { .. }) => {
                // Reclaimed after draining: the durable tier has it.
                let why = format!("{key}: drained and reclaimed; read it from the durable store");
                self.reply_error(out, id, code::NOT_FOUND, &why);
            }
            Err(e) => {
                let (c, why) = engine_code(&e);
                self.fail(format!("read of {key} failed: {why}"));
                self.reply_error(out, id, c, &why);
            }
        }
        true
    }

    // ---- IO threads ----

    fn io_thread(self: Arc<Self>, slot: usize) {
        let queue = &self.queues[slot];
        loop {
            let job = {
                let mut jobs = lock(&queue.jobs);
                loop {
                    if let Some(j) = jobs.pop_front() {
                        break Some(j);
                    }
                    if self.stop.load(Ordering::SeqCst) {
                        break None;
                    }
                    jobs = queue
                        .ready
                        .wait_timeout(jobs, Duration::from_millis(500))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            };
            let Some(WriteJob { conn, buf, at, len }) = job else {
                return;
            };
            let pinned = buf.pinned.clone();
            let frame = Arc::new(InFlight {
                conn,
                buf: bytes::Bytes::from_owner(Received {
                    buf: Some(buf),
                    pool: self.pool.clone(),
                }),
                at,
                len,
                pinned,
            });
            // After a failure the connection is closing: skip the rest of its frames.
            if !frame.conn.failed() {
                if let Err(e) = self.absorb(slot, &frame) {
                    self.absorb_failed(&frame.conn, &e);
                }
            }
            // The frame is done (its buffer back in the pool) once its disk writes are.
            drop(frame);
        }
    }

    /// Records the first failure of a connection's frames (its next Sync gets it).
    fn absorb_failed(&self, conn: &ConnState, e: &crate::engine::Error) {
        let mut d = lock(&conn.done);
        if d.1.is_none() {
            let (c, why) = engine_code(e);
            if c != code::FULL {
                self.fail(format!("cannot absorb a write: {why}"));
            }
            d.1 = Some((c, why));
        }
    }

    /// Walks a Write frame's segments in order: begins versions, hands the data to the disk
    /// writers in extents (not waiting for them), and seals a version once this
    /// connection's writes so far are done (a seal checks that the extents cover the file).
    fn absorb(
        &self,
        slot: usize,
        frame: &Arc<InFlight>,
    ) -> std::result::Result<(), crate::engine::Error> {
        let Ok(Request::Write(segments)) =
            Request::decode(kind::WRITE, &frame.buf[frame.at..frame.at + frame.len])
        else {
            // Checked by the connection thread before queueing.
            return Ok(());
        };
        let conn = &frame.conn;
        let base = frame.buf.as_ptr() as usize;
        let mut files = 0;
        for s in segments {
            let key = namespaced(&conn.namespace, s.key);
            let (id, begun) = {
                let mut open = lock(&conn.open);
                match open.get(&(key.clone(), s.stamp)) {
                    Some(id) => (*id, false),
                    None => {
                        let id = self.engine.begin_version(&key, s.stamp, s.size)?;
                        open.insert((key.clone(), s.stamp), id);
                        (id, true)
                    }
                }
            };
            if begun && s.seal.is_none() && repository::repository_object(&key).is_none() {
                // More frames to come: upload while they arrive.
                self.start_stream(id, &key, s.stamp, s.size);
            }
            // Where the segment's data lies in the frame's buffer (it is a slice of it).
            let first = s.data.as_ptr() as usize - base;
            let mut done = 0;
            while done < s.data.len() {
                let n = (s.data.len() - done).min(crate::engine::MAX_EXTENT);
                *lock(&conn.writes) += 1;
                lock(&self.disk.jobs).push_back(DiskJob {
                    frame: frame.clone(),
                    slot,
                    version: id,
                    offset: s.offset + done as u64,
                    data: first + done..first + done + n,
                });
                self.disk.ready.notify_one();
                done += n;
            }
            if let Some(seal) = s.seal {
                conn.wait_writes();
                if conn.failed() {
                    return Ok(());
                }
                let tag = (seal.tag != [0; 32]).then_some(seal.tag);
                self.engine.seal(id, seal.blake3, tag)?;
                self.seal_stream(id, seal.blake3);
                lock(&conn.open).remove(&(key, s.stamp));
                files += 1;
            }
        }
        if files > 0 {
            lock(&self.counters).absorbed_files += files;
            // A sealed version may drain before the client's Sync: the drain reads it from
            // the arenas (the page cache, or the SSD with O_DIRECT arenas), and
            // `mark_drained` syncs its seal first. Waiting for the Sync's
            // fdatasync would only start the durable store's link later.
            self.wake_drain();
        }
        Ok(())
    }

    /// A disk writer: appends extents handed over by the IO threads to the arenas. Several
    /// run at once (`writes_in_flight`), so O_DIRECT writes, which mostly wait for the
    /// device, overlap each other and the receiving of the next frames.
    fn disk_writer(self: Arc<Self>) {
        loop {
            let job = {
                let mut jobs = lock(&self.disk.jobs);
                loop {
                    if let Some(j) = jobs.pop_front() {
                        break Some(j);
                    }
                    if self.disk.closing.load(Ordering::SeqCst) {
                        break None;
                    }
                    jobs = self
                        .disk
                        .ready
                        .wait_timeout(jobs, Duration::from_millis(500))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            };
            let Some(job) = job else { return };
            let conn = &job.frame.conn;
            if !conn.failed() {
                let data = &job.frame.buf[job.data.clone()];
                match self.engine.append(job.slot, job.version, job.offset, data) {
                    Ok(()) => {
                        lock(&self.counters).absorbed_bytes += data.len() as u64;
                        self.keep(&job);
                    }
                    Err(e) => self.absorb_failed(conn, &e),
                }
            }
            {
                let mut w = lock(&conn.writes);
                *w -= 1;
                if *w == 0 {
                    conn.written.notify_all();
                }
            }
            // The frame's last holder gives its buffer back.
            drop(job);
        }
    }

    /// Keeps an extent just written for the drain of its version, pinning its frame's
    /// buffer, while the budget allows; else the version drains from the arenas.
    fn keep(&self, job: &DiskJob) {
        if self.opts.drain_memory == 0 {
            return;
        }
        let mut kept = lock(&self.kept);
        let entry = kept.entry(job.version).or_default();
        if entry.spilled {
            return;
        }
        let frame_bytes = (job.frame.at + job.frame.len) as u64;
        if self.pool.pin(&job.frame.pinned, frame_bytes) {
            let part = job.frame.buf.slice(job.data.clone());
            entry.parts.push((job.offset, part.clone()));
            drop(kept);
            self.feed_stream(job.version, job.offset, &part);
            return;
        }
        entry.spilled = true;
        let parts = std::mem::take(&mut entry.parts);
        drop(kept);
        self.stop_stream(job.version, "it no longer fits in the drain memory");
        lock(&self.counters).drain_memory_spills += 1;
        // Their buffers go back to the pool outside the lock.
        drop(parts);
    }

    /// The kept bytes of `v` in order, if they are exactly its bytes 0..size.
    fn kept_parts(&self, v: &VersionInfo) -> Option<Vec<bytes::Bytes>> {
        let mut parts = {
            let kept = lock(&self.kept);
            let entry = kept.get(&v.id)?;
            if entry.spilled {
                return None;
            }
            entry.parts.clone()
        };
        parts.sort_by_key(|(offset, _)| *offset);
        let mut at = 0u64;
        for (offset, b) in &parts {
            // A resend kept twice, or a gap: the arenas know which bytes won.
            if *offset != at {
                return None;
            }
            at += b.len() as u64;
        }
        (at == v.size).then(|| parts.into_iter().map(|(_, b)| b).collect())
    }

    /// Lets go of what is kept of `v` (drained, superseded, or to be read from the arenas).
    fn release_kept(&self, v: VersionId) {
        let entry = lock(&self.kept).remove(&v);
        drop(entry);
    }

    /// Lets go of what is kept of versions that are no longer being received or waiting to
    /// drain (abandoned by their client, superseded by a newer seal).
    fn prune_kept(&self) {
        let stale: Vec<KeptVersion> = {
            let mut kept = lock(&self.kept);
            let ids: Vec<VersionId> = kept
                .keys()
                .copied()
                .filter(|id| !self.engine.is_live(*id))
                .collect();
            ids.iter().filter_map(|id| kept.remove(id)).collect()
        };
        drop(stale);
        self.prune_streams(false);
    }

    // ---- drain ----

    /// Drains every drainable version, then writes the markers of checkpoints that became
    /// complete. A version whose drain fails is retried with backoff (1 s doubling to 30 s);
    /// after `drain_attempts` failures in a row it is counted in `drain_failed` and retried
    /// only every [`DRAIN_RETRY_FAILED`]: kept, since it was acknowledged, and never in the
    /// way of the other versions.
    fn drain_loop(self: Arc<Self>) {
        let mut retry_at: HashMap<VersionId, (u32, Instant)> = HashMap::new();
        // Versions whose drain waits for the clients to stop writing, since when.
        let mut yielding: HashMap<VersionId, Instant> = HashMap::new();
        let mut manifests_checked = Instant::now() - Duration::from_secs(10);
        // Pending checkpoints are checked at once after a drain here or a Push/Sync/Pull (the
        // wake-up: a watching agent asks as soon as another server drained), and else polled
        // for files that reach the durable store by other ways (other servers, agents), every
        // tenth of `recheck_every` doubling to it while nothing completes.
        let poll_min = self.opts.recheck_every / 10;
        let mut manifest_poll = poll_min;
        let mut checked_at_wake = u64::MAX;
        let attempts = self.opts.drain_attempts.max(1);
        // Packs staged as files upload on threads of their own, up to PACK_DRAINS at once:
        // a checkpoint staged as packs waits for them, and two requests at once keep the
        // link busy during each one's round trip (as the agent's own pack uploads do).
        let (packs_sender, packs_done) = std::sync::mpsc::channel();
        let mut packs_in_flight: HashSet<VersionId> = HashSet::new();
        let is_pack = |v: &VersionInfo| {
            repository::repository_object(&v.key)
                .is_some_and(|(k, _)| k == repository::RepositoryObject::Pack)
        };
        while !self.stop.load(Ordering::SeqCst) {
            let seen = *lock(&self.drain_wake.0);
            let mut progressed = false;
            // When to look again if nothing drains: at the latest when a yielding version
            // may go; a seal or a client's request wakes the drain sooner.
            let mut look_again = Duration::from_millis(250);
            let now = Instant::now();
            let drainable = self.engine.drainable();
            // Once a turn, not per version: thousands may be waiting.
            let held = self.held_for_ingest();
            self.prune_kept();
            // Versions drained or superseded meanwhile (e.g. by a newer write) leave the map.
            let live: HashSet<VersionId> = drainable.iter().map(|v| v.id).collect();
            yielding.retain(|id, _| live.contains(id));
            retry_at.retain(|id, (n, _)| {
                let keep = live.contains(id);
                if !keep && *n >= attempts {
                    let mut c = lock(&self.counters);
                    c.drain_failed = c.drain_failed.saturating_sub(1);
                }
                keep
            });
            let finished: Vec<(VersionInfo, Result<Drain>)> = packs_done.try_iter().collect();
            for (v, _) in &finished {
                packs_in_flight.remove(&v.id);
            }
            let ready: Vec<(VersionInfo, Instant)> = drainable
                .into_iter()
                .filter(|v| retry_at.get(&v.id).is_none_or(|(_, at)| *at <= now))
                .filter(|v| !packs_in_flight.contains(&v.id))
                // Index objects and manifests staged as files go when their push completes.
                .filter(|v| !repository::repository_object(&v.key).is_some_and(|(k, _)| k.held()))
                .map(|v| {
                    let since = yielding.get(&v.id).copied().unwrap_or(now);
                    (v, since)
                })
                .collect();
            let mut handle = |v: &VersionInfo, drained: Result<Drain>| {
                match drained {
                    Ok(Drain::Yielded(wait)) => {
                        yielding.entry(v.id).or_insert(now);
                        look_again = look_again.min(wait);
                    }
                    Ok(Drain::Done) => {
                        yielding.remove(&v.id);
                        self.event();
                        if let Some((n, _)) = retry_at.remove(&v.id) {
                            if n >= attempts {
                                let mut c = lock(&self.counters);
                                c.drain_failed = c.drain_failed.saturating_sub(1);
                                drop(c);
                                self.notice(format!("{} drained after {n} failed attempts", v.key));
                            }
                        }
                        progressed = true;
                    }
                    Err(e) => {
                        // Retries read the arenas: kept bytes must not wait on a failing store.
                        self.release_kept(v.id);
                        let entry = retry_at.entry(v.id).or_insert((0, now));
                        entry.0 = entry.0.saturating_add(1);
                        let n = entry.0;
                        let delay = if n >= attempts {
                            DRAIN_RETRY_FAILED
                        } else {
                            Duration::from_millis(500)
                                .saturating_mul(1 << n.min(6))
                                .min(Duration::from_secs(30))
                        };
                        entry.1 = Instant::now() + delay;
                        // The line first: a status that counts the failure shows it.
                        if n == attempts {
                            self.fail(format!(
                                "drain of {} failed {n} times, last: {e}; giving up retrying \
                                 it hot: its bytes stay staged (it was acknowledged) and it \
                                 is tried again every {} s",
                                v.key,
                                DRAIN_RETRY_FAILED.as_secs()
                            ));
                        } else if n < attempts {
                            self.fail(format!(
                                "drain of {} failed (attempt {n} of {attempts}): {e}; retrying \
                                 in {:.1} s",
                                v.key,
                                delay.as_secs_f64()
                            ));
                        } else {
                            self.fail(format!("drain of {} failed again: {e}", v.key));
                        }
                        let mut c = lock(&self.counters);
                        c.drain_failures += 1;
                        if n == attempts {
                            c.drain_failed += 1;
                        }
                    }
                }
            };
            for (v, drained) in finished {
                handle(&v, drained);
            }
            for (v, since) in ready {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                if is_pack(&v) && packs_in_flight.len() >= PACK_DRAINS {
                    continue;
                }
                if is_pack(&v) {
                    match self.drain_pack_apart(v.clone(), since, held, packs_sender.clone()) {
                        Ok(()) => {
                            packs_in_flight.insert(v.id);
                        }
                        // No thread: drained here.
                        Err(_) => handle(&v, self.drain_one(&v, since, held)),
                    }
                    continue;
                }
                handle(&v, self.drain_one(&v, since, held));
            }
            let woken = seen != checked_at_wake;
            if progressed || woken || manifests_checked.elapsed() >= manifest_poll {
                if !progressed && !woken && !self.engine.pending_manifests().is_empty() {
                    lock(&self.counters).timed_rechecks += 1;
                }
                manifests_checked = Instant::now();
                checked_at_wake = seen;
                if self.complete_manifests() {
                    progressed = true;
                    self.event();
                }
                manifest_poll = if progressed || woken {
                    poll_min
                } else {
                    (manifest_poll * 2).min(self.opts.recheck_every)
                };
            }
            // After the markers: deleting freed arenas takes a while (Engine::defer_unlinks).
            self.engine.unlink_reclaimed();
            self.tend_log();
            if !progressed {
                let (m, cv) = &self.drain_wake;
                let g = lock(m);
                if *g == seen {
                    let _ = cv.wait_timeout(g, look_again);
                }
            }
        }
    }

    /// Uploads `parts` as object `key` in one request: streamed (signed a chunk at a time)
    /// for a file, but signed whole for a repository object, as the agent writing the
    /// repository itself sends it (a few MiB: the S3 store checks a streamed body's chunk
    /// signatures at a cost the whole-body hash does not have).
    fn put_parts(&self, key: &str, parts: Vec<bytes::Bytes>) -> cascade_durable::Result<()> {
        if repository::repository_object(key).is_some() {
            self.durable.put_buffers(key, parts)
        } else {
            self.durable.put_buffers_streamed(key, parts)
        }
    }

    /// Uploads version `v` in one request from its mapped arenas (no multipart upload the
    /// store must reassemble, no copy), checking its extents and hashing it on a second
    /// thread meanwhile. The digest of what was read.
    fn put_mapped(&self, v: &VersionInfo) -> Result<FileDigest> {
        let mapped = self.engine.map_version(v.id)?;
        let (put, checked) = std::thread::scope(|scope| {
            let check = scope.spawn(|| mapped.verify());
            let put = self.put_parts(&v.key, mapped.parts());
            (put, check.join())
        });
        let blake3 = match checked {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Invalid(format!(
                    "{}: the check of its staged bytes panicked",
                    v.key
                )))
            }
        };
        put?;
        Ok(FileDigest {
            size: v.size,
            blake3: hex(&blake3),
        })
    }

    /// Uploads version `v` in one request from the bytes kept of its Write frames (no read
    /// of the arenas, no copy), hashing them on a second thread meanwhile. The digest of
    /// what was sent.
    fn put_kept(&self, v: &VersionInfo, parts: Vec<bytes::Bytes>) -> Result<FileDigest> {
        let (put, hashed) = std::thread::scope(|scope| {
            let hash = scope.spawn(|| {
                let mut hasher = blake3::Hasher::new();
                for p in &parts {
                    hasher.update(p);
                }
                *hasher.finalize().as_bytes()
            });
            let put = self.put_parts(&v.key, parts.clone());
            (put, hash.join())
        });
        let Ok(blake3) = hashed else {
            return Err(Error::Invalid(format!(
                "{}: the hash of its kept bytes panicked",
                v.key
            )));
        };
        put?;
        Ok(FileDigest {
            size: v.size,
            blake3: hex(&blake3),
        })
    }

    /// How long the drain holds back uploads in one request for the clients now (from the
    /// kept frames or the mapped arenas: their hash and their copy cost the CPU the
    /// receiving threads need), or None: not at all. It holds back while clients write
    /// (what is left of `busy_window`), and not while room runs short: kept frames past
    /// three quarters of `drain_memory` (the next versions would have to drain from the
    /// arenas), or arenas past half the `capacity`, when one is set.
    fn held_for_ingest(&self) -> Option<Duration> {
        let writing = self.ingest_left();
        if writing.is_zero() {
            return None;
        }
        let usage = self.engine.usage();
        let room = self.pool.pinned_bytes() < self.opts.drain_memory / 4 * 3
            && usage.capacity.is_none_or(|c| usage.arena_bytes < c / 2);
        room.then_some(writing)
    }

    /// How much longer version `v`, held back since `since`, waits while the drain holds
    /// back for `held` (`held_for_ingest`); None: it goes now. No longer than the paced
    /// reader would take over it (1 MiB per `busy_pause`), so under a steady stream of
    /// writes the drain keeps that rate.
    fn yields_to_ingest(
        &self,
        v: &VersionInfo,
        since: Instant,
        held: Option<Duration>,
    ) -> Option<Duration> {
        let paced = self
            .opts
            .busy_pause
            .saturating_mul(u32::try_from(v.size.div_ceil(1 << 20)).unwrap_or(u32::MAX));
        let wait = held?.min(paced.saturating_sub(since.elapsed()));
        (!wait.is_zero()).then_some(wait)
    }

    /// Rebuilds one staged file in the durable tier (version, data, then `.blake3`), checking
    /// that what the arenas hold hashes to what the client sent, or leaves it for now to
    /// absorbing clients (`yields_to_ingest`: held back since `since`, for `held`). A version
    /// older than the one the durable store records is not drained (docs/staging.md,
    /// "Version order").
    fn drain_one(&self, v: &VersionInfo, since: Instant, held: Option<Duration>) -> Result<Drain> {
        let started = Instant::now();
        // An upload that streamed while the version arrived: only its last byte is left.
        let streamed = match self.finish_stream(v) {
            Some(Ok(streaming::Streamed::Uploaded(digest))) => {
                lock(&self.counters).drained_streaming += 1;
                Some(digest)
            }
            // Nothing was written; `commit` refuses it, as any other mismatch.
            Some(Ok(streaming::Streamed::Mismatch(digest))) => Some(digest),
            Some(Err(e)) => {
                lock(&self.counters).streaming_fallbacks += 1;
                self.log(|| {
                    format!(
                        "{}: streaming upload failed ({e}); uploading it whole",
                        v.key
                    )
                });
                None
            }
            None => None,
        };
        if let Some(digest) = streamed {
            return self.commit(v, digest, started).map(|()| Drain::Done);
        }
        let one_request = v.size <= cascade_durable::SINGLE_PUT_MAX;
        // A pack staged as a file: compressed and deduplicated already, and its checkpoint
        // waits for it; it does not yield to the clients' writes.
        if repository::repository_object(&v.key).is_some() {
            return self
                .upload_whole(v, one_request, started)
                .map(|()| Drain::Done);
        }
        if let Some(wait) = one_request
            .then(|| self.yields_to_ingest(v, since, held))
            .flatten()
        {
            lock(&self.counters).drain_yields += 1;
            return Ok(Drain::Yielded(wait));
        }
        self.upload_whole(v, one_request, started)
            .map(|()| Drain::Done)
    }

    /// Drains pack `v` on a thread of its own, which sends the result to `done` and wakes
    /// the drain loop.
    fn drain_pack_apart(
        self: &Arc<Self>,
        v: VersionInfo,
        since: Instant,
        held: Option<Duration>,
        done: std::sync::mpsc::Sender<(VersionInfo, Result<Drain>)>,
    ) -> Result<()> {
        let shared = Arc::clone(self);
        spawn_named(threads::PACK_DRAIN.into(), move || {
            let drained = shared.drain_one(&v, since, held);
            let _ = done.send((v, drained));
            shared.wake_drain();
        })
        .map(|_| ())
    }

    /// Uploads version `v` whole (from the kept frames, the mapped arenas or a paced reader
    /// of the arenas; `one_request`: it fits one request) and commits it, or supersedes it
    /// when the durable store already records a newer one.
    fn upload_whole(&self, v: &VersionInfo, one_request: bool, started: Instant) -> Result<()> {
        // A repository object has no versions: its name says what it holds.
        let versioned = repository::repository_object(&v.key).is_none();
        if versioned {
            if let Some(newer) = self.newer_in_durable(v)? {
                return self.supersede(v, newer);
            }
            self.durable.put_version(&v.key, v.stamp)?;
        } else {
            self.check_repository_object(v)?;
        }
        let kept = one_request.then(|| self.kept_parts(v)).flatten();
        let digest = if let Some(parts) = kept {
            let digest = self.put_kept(v, parts)?;
            lock(&self.counters).drained_from_memory += 1;
            digest
        } else if (MAPPED_DRAIN_MIN..=cascade_durable::SINGLE_PUT_MAX).contains(&v.size) {
            lock(&self.counters).drain_arena_bytes += v.size;
            self.put_mapped(v)?
        } else {
            lock(&self.counters).drain_arena_bytes += v.size;
            let reader = DrainReader {
                shared: self,
                id: v.id,
                offset: 0,
                pacer: Pacer::new(),
            };
            self.durable.put_file(&v.key, reader, v.size)?
        };
        self.commit(v, digest, started)
    }

    /// Commits version `v` whose data object was uploaded with `digest`: its checksum
    /// object once the digest is the client's and no newer version took the name, then the
    /// Drained record.
    fn commit(&self, v: &VersionInfo, digest: FileDigest, started: Instant) -> Result<()> {
        let expected = hex(&v.blake3);
        if digest.blake3 != expected {
            return Err(Error::Mismatch {
                server: self.name.clone(),
                why: format!(
                    "{}: staged bytes hash to {} but the client sent {expected}; not marked drained",
                    v.key, digest.blake3
                ),
            });
        }
        let data_done = started.elapsed();
        let versioned = repository::repository_object(&v.key).is_none();
        // A newer writer that started meanwhile owns the name: its checksum must stay.
        if versioned {
            if let Some(newer) = self.newer_in_durable(v)? {
                return self.supersede(v, newer);
            }
        }
        let checked = started.elapsed();
        if versioned {
            self.durable.put_checksum(&v.key, &digest)?;
        }
        let summed = started.elapsed();
        self.engine.mark_drained(v.id)?;
        let recorded = started.elapsed();
        self.release_kept(v.id);
        {
            let mut c = lock(&self.counters);
            c.drained_files += 1;
            c.drained_bytes += v.size;
        }
        self.log(|| {
            let s = |d: Duration| d.as_secs_f64();
            format!(
                "drained {} ({} bytes) in {:.3} s (data {:.3}, version check {:.3}, \
                 checksum {:.3}, drained record {:.3}, memory let go {:.3})",
                v.key,
                v.size,
                s(started.elapsed()),
                s(data_done),
                s(checked - data_done),
                s(summed - checked),
                s(recorded - summed),
                s(started.elapsed() - recorded),
            )
        });
        Ok(())
    }

    /// The stamp the durable store records for `v.key` if it is newer than `v`.
    fn newer_in_durable(&self, v: &VersionInfo) -> Result<Option<u64>> {
        Ok(self
            .durable
            .recorded_version(&v.key)?
            .filter(|&stamp| stamp > v.stamp))
    }

    /// Retires a version the durable store already has a newer one of (e.g. this server was
    /// down while the file was rewritten and sent elsewhere): its space is reclaimed, and
    /// every pending checkpoint listing it is dropped, since it can never complete as listed.
    fn supersede(&self, v: &VersionInfo, newer: u64) -> Result<()> {
        let durable_sum = self.durable.recorded_checksum(&v.key).ok();
        for (id, m) in self.engine.pending_manifests() {
            let lists_it = m
                .files
                .iter()
                .any(|f| manifest_key(&m, f) == v.key && f.blake3 == v.blake3);
            if lists_it && durable_sum.as_deref() != Some(hex(&v.blake3).as_str()) {
                self.engine.mark_manifest_done(id)?;
                self.log(|| {
                    format!(
                        "checkpoint {} dropped: it lists a version of {} older than the \
                         durable store's",
                        m.checkpoint, v.key
                    )
                });
            }
        }
        self.engine.mark_drained(v.id)?;
        self.release_kept(v.id);
        lock(&self.counters).superseded_files += 1;
        self.log(|| {
            format!(
                "not drained {} (stamp {}): the durable store has a newer version (stamp {newer})",
                v.key, v.stamp
            )
        });
        Ok(())
    }

    /// Writes the marker of every pushed checkpoint whose files are all in the durable tier
    /// with the listed checksums (drained here, by another server, or uploaded by an agent).
    fn complete_manifests(&self) -> bool {
        let mut wrote = false;
        for (id, m) in self.engine.pending_manifests() {
            if let Some(prefix) = repository::repository_push(&m) {
                match self.complete_repository_push(id, &m, prefix) {
                    Ok(true) => wrote = true,
                    Ok(false) => {}
                    Err(e) => self.fail(format!("cannot write {}: {e}", m.checkpoint)),
                }
                continue;
            }
            let all_there = m.files.iter().all(|f| {
                let key = manifest_key(&m, f);
                match self.engine.lookup(&key) {
                    Some(v) if v.blake3 == f.blake3 && v.drained => true,
                    // Still to drain here.
                    Some(v) if v.blake3 == f.blake3 => false,
                    _ => self
                        .durable
                        .recorded_checksum(&key)
                        .is_ok_and(|sum| sum == hex(&f.blake3)),
                }
            });
            if !all_there {
                continue;
            }
            let entries = m
                .files
                .iter()
                .map(|f| MarkerFile {
                    path: f.path.clone(),
                    size: f.size,
                    blake3: hex(&f.blake3),
                })
                .collect();
            let written = self
                .durable
                .write_marker_of(&m.checkpoint, m.single_file, entries)
                .map_err(Error::from);
            if written.is_ok() {
                // Counted before the checkpoint reads durable, so a status taken once it does
                // counts its marker.
                lock(&self.counters).markers += 1;
            }
            let done =
                written.and_then(|_| self.engine.mark_manifest_done(id).map_err(Error::from));
            match done {
                Ok(()) => {
                    self.log(|| format!("checkpoint {} complete", m.checkpoint));
                    wrote = true;
                }
                Err(e) => self.fail(format!("cannot write the marker of {}: {e}", m.checkpoint)),
            }
        }
        wrote
    }
}

/// A file name in a Write or Push that only the server may write in the durable layout
/// (markers, checksums, parts and version objects): a client writing `ckpt/.cascade-complete`
/// or `x.blake3` would forge a checkpoint's completion or a file's checksum once drained.
/// The refusal (BAD_PATH, one line), or None.
fn reserved_name_in(request: &Request) -> Option<(u16, String)> {
    let mut names: Vec<&str> = Vec::new();
    // Objects of a dedup repository staged as files are not files of the durable layout.
    let plain = |key: &&str| repository::repository_object(key).is_none();
    match request {
        Request::Write(segments) => names.extend(segments.iter().map(|s| s.key).filter(plain)),
        Request::Push {
            checkpoint, files, ..
        } if plain(checkpoint) => {
            names.push(checkpoint);
            names.extend(files.iter().map(|f| f.path.as_str()));
        }
        // Dedup manifests are records in the repository, not files of the durable layout
        // (a node's part of a checkpoint is a manifest named `<ckpt>/.cascade-part.<node>`),
        // and so is a push of repository objects.
        _ => {}
    }
    let bad = names.into_iter().find(|name| {
        let base = name.rsplit('/').next().unwrap_or(name);
        cascade_durable::is_reserved_name(base)
    })?;
    Some((
        code::BAD_PATH,
        format!(
            "bad path {bad:?}: the name is reserved by the durable layout (markers, checksums, \
             parts and version objects are written by the server)"
        ),
    ))
}

/// A sealed version in a Write whose tag does not verify with the namespace's key: its
/// writer does not hold the job's key (or the bytes were changed on the way), so it must
/// never override what the durable store holds. The refusal (INVALID, one line), or None.
fn untagged_seal_in(request: &Request, key: &JobKey) -> Option<(u16, String)> {
    let Request::Write(segments) = request else {
        return None;
    };
    let bad = segments.iter().find(|s| {
        s.seal.is_some_and(|seal| {
            let tag = key.version_tag(s.key, s.stamp, s.size, &seal.blake3);
            !proofs_match(&seal.tag, &tag)
        })
    })?;
    Some((
        code::INVALID,
        format!(
            "{}@{}: its seal's tag does not verify with the namespace's key (written without \
             the job's key, or changed on the way); not stored",
            bad.key, bad.stamp
        ),
    ))
}

/// The key of a file listed in a pushed checkpoint.
fn manifest_key(m: &Manifest, f: &ManifestFile) -> String {
    if m.single_file {
        m.checkpoint.clone()
    } else {
        format!("{}/{}", m.checkpoint, f.path)
    }
}

/// Packs staged as files uploading at once (drain_loop).
const PACK_DRAINS: usize = 2;

/// What one turn of the drain did with a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Drained, superseded or committed from its stream.
    Done,
    /// Left for a later turn, at most this long: clients are writing
    /// (`Shared::yields_to_ingest`).
    Yielded(Duration),
}

/// Keeps a reader of the arenas (drain, dedup push) to at most 1 MiB per `busy_pause` while
/// clients write: a rate, not a pause per MiB, so a reader that its consumer (the durable
/// store's link) holds back anyway loses nothing to the pacing.
pub(crate) struct Pacer {
    last: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new() -> Pacer {
        Pacer { last: None }
    }

    /// Before a read of at most 1 MiB: waits out what is left of `busy_pause` since the
    /// previous one while ingest is active. The most to read now.
    fn pace(&mut self, shared: &Shared) -> usize {
        if !shared.ingest_active() {
            self.last = None;
            return usize::MAX;
        }
        if let Some(last) = self.last {
            let left = shared.opts.busy_pause.saturating_sub(last.elapsed());
            if !left.is_zero() {
                std::thread::sleep(left);
            }
        }
        self.last = Some(Instant::now());
        1 << 20
    }
}

/// Streams a staged version out of the arenas for the durable upload, yielding to
/// absorbing clients (`Pacer`).
struct DrainReader<'a> {
    shared: &'a Shared,
    id: VersionId,
    offset: u64,
    pacer: Pacer,
}

impl Read for DrainReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(self.pacer.pace(self.shared));
        let n = self
            .shared
            .engine
            .read_at(self.id, self.offset, &mut buf[..want])
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// The Error code and one-line reason for an engine failure.
fn engine_code(e: &crate::engine::Error) -> (u16, String) {
    use crate::engine::Error as E;
    let c = match e {
        E::Full { .. } => code::FULL,
        E::Corrupt { .. } => code::CORRUPT,
        E::Invalid { .. } => code::INVALID,
        _ => code::IO,
    };
    (c, e.to_string())
}

#[cfg(test)]
mod debug_tests {
    use super::ServerOptions;

    #[test]
    fn debug_never_shows_the_drain_urls_secret_key() {
        let opts = ServerOptions::new(
            "127.0.0.1:0",
            "/tmp/x".into(),
            "s3://b/p?endpoint=http://h:1&access_key=AK&secret_key=TOPSECRET",
            "shared-secret",
        );
        let shown = format!("{opts:?}");
        assert!(
            !shown.contains("TOPSECRET") && !shown.contains("shared-secret"),
            "{shown}"
        );
        assert!(shown.contains("endpoint=http://h:1"), "{shown}");
    }
}

#[cfg(test)]
mod tls_tests {
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use cascade_testkit::TestPki;
    use cascade_wire::client::Transport;
    use cascade_wire::tls;

    use super::Link;

    #[test]
    fn both_ends_export_the_same_channel_binding_and_plain_tcp_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = TestPki::generate(dir.path());
        let server_config = tls::server_config(&pki.cert, &pki.key).expect("server config");
        let client_config = tls::client_config(&pki.ca).expect("client config");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let accept = |tls: bool| {
            let (stream, _) = listener.accept().expect("accept");
            let config = tls.then_some(&server_config);
            let deadline = Instant::now() + Duration::from_secs(30);
            Link::open(stream, config, deadline)
                .expect("server handshake")
                .channel_binding()
        };
        let connect = || {
            let tcp = TcpStream::connect(&addr).expect("connect");
            tcp.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            tcp
        };
        let bindings: Vec<_> = (0..2)
            .map(|_| {
                std::thread::scope(|s| {
                    let server = s.spawn(|| accept(true));
                    let client =
                        Transport::tls(&addr, &client_config, connect()).expect("client handshake");
                    let server = server.join().expect("server thread");
                    (client.channel_binding(), server)
                })
            })
            .collect();
        for (client, server) in &bindings {
            assert!(client.is_some());
            assert_eq!(client, server);
        }
        assert_ne!(bindings[0].0, bindings[1].0, "one binding per session");
        let plain = std::thread::scope(|s| {
            let server = s.spawn(|| accept(false));
            let _client = connect();
            server.join().expect("server thread")
        });
        assert_eq!(plain, None);
    }
}
