//! Connections to the staging servers (docs/staging.md), shared by the two staging levels:
//! a connection per server for requests and one for bulk chunk uploads, a server that fails
//! is marked down for a backoff, and where a file or chunk goes first (placement, rendezvous
//! hashing of scores).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cascade_dedup::Score;
use cascade_wire::auth::JobKey;
use cascade_wire::client::{ClientOptions, Connection};

use crate::options::{Placement, StagingOptions};
use crate::Error;

/// A connection, and the server's failure count when it was made.
struct Connected {
    connection: Connection,
    failures_seen: u64,
}

struct ServerSlot {
    addr: String,
    conn: Mutex<Option<Connected>>,
    /// PutChunks go on a connection of their own: asking about the next batch (Lacks) need
    /// not wait until the server has checked and synced this batch's chunks.
    bulk: Mutex<Option<Connected>>,
    /// Bumped when a request to the server fails: the server may have died or restarted,
    /// so its other connection, made before, is dropped at its next use too (as is one the
    /// server closed meanwhile: `Connection::peer_closed`).
    failures_seen: AtomicU64,
    /// While requests to it fail: how many in a row, when to try again, and since when.
    down: Mutex<Option<Down>>,
}

#[derive(Clone, Copy)]
struct Down {
    failures: u32,
    retry_at: Instant,
    since: Instant,
}

/// Connections to the staging servers, shared by the staging levels.
pub(crate) struct ServerPool {
    pub(crate) opts: StagingOptions,
    client: ClientOptions,
    /// The job's key: tags the versions this agent stages, checks the ones it reads.
    pub(crate) job_key: JobKey,
    servers: Vec<ServerSlot>,
    next: AtomicUsize,
    /// What the watcher threads learnt (`start_watching`); they hold it weakly and end once
    /// the pool is gone.
    watch: Arc<WatchState>,
}

/// How often the agent asks the servers what has drained when a server cannot be watched
/// (one older than Watch, or while its watch connection is down).
pub(crate) const PULL_EVERY: Duration = Duration::from_millis(500);
/// How long one Watch waits before it is asked again (also how soon a watcher thread ends
/// after its pool).
const WATCH_FOR: Duration = Duration::from_secs(5);

/// Per server: its event counter as last answered, and whether its watch works now.
struct WatchState {
    events: Vec<AtomicU64>,
    watched: Vec<AtomicBool>,
    /// Wakes the agent's pass (the node store's wake-up).
    wake: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

/// When a level last asked the servers about something it waits for, and the servers'
/// event counters then: it asks again once a counter moved (a watcher saw an event), or
/// after the fallback period.
#[derive(Default)]
pub(crate) struct Asked {
    last: Mutex<HashMap<String, (Instant, Vec<u64>)>>,
}

/// More waiting things than this and the record starts afresh (each is asked once more).
const ASKED_MAX: usize = 4096;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ServerPool {
    pub(crate) fn new(opts: StagingOptions) -> ServerPool {
        let mut client = ClientOptions::with(opts.credential.clone());
        client.namespace = opts.namespace.clone();
        client.tls = opts.tls.clone();
        let servers = opts
            .servers
            .iter()
            .map(|a| ServerSlot {
                addr: a.clone(),
                conn: Mutex::new(None),
                bulk: Mutex::new(None),
                failures_seen: AtomicU64::new(0),
                down: Mutex::new(None),
            })
            .collect();
        let n = opts.servers.len();
        ServerPool {
            opts,
            job_key: client.job_key(),
            client,
            servers,
            next: AtomicUsize::new(0),
            watch: Arc::new(WatchState {
                events: (0..n).map(|_| AtomicU64::new(0)).collect(),
                watched: (0..n).map(|_| AtomicBool::new(false)).collect(),
                wake: Mutex::new(None),
            }),
        }
    }

    /// Starts a thread per server holding a Watch (on a connection of its own) and calling
    /// `wake` whenever the server's event counter moves: something it held reached the
    /// durable store, so the levels ask it (and the server holding a checkpoint's marker or
    /// manifest) at once instead of on a timer.
    pub(crate) fn start_watching(&self, wake: Box<dyn Fn() + Send + Sync>) {
        *lock(&self.watch.wake) = Some(wake);
        for (i, slot) in self.servers.iter().enumerate() {
            let state = Arc::downgrade(&self.watch);
            let addr = slot.addr.clone();
            let client = self.client.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("cascade-watch-{i}"))
                .spawn(move || watch_server(state, i, &addr, &client));
            if let Err(e) = spawned {
                cascade_observe::error!(
                    "cascade agent: cannot start the watcher of staging server {i}: {e}"
                );
            }
        }
    }

    /// The servers' event counters as last seen.
    fn events(&self) -> Vec<u64> {
        self.watch
            .events
            .iter()
            .map(|e| e.load(Ordering::Acquire))
            .collect()
    }

    /// How long a staged file or checkpoint may go unanswered for before the node sends it
    /// again itself (`StagingOptions::give_up_after`).
    pub(crate) fn give_up_after(&self) -> Duration {
        self.opts.give_up_after
    }

    /// How long a level waits before it asks again when no event came: `ask_every` while
    /// every server is watched, else [`PULL_EVERY`].
    pub(crate) fn ask_every(&self) -> Duration {
        if self.watch.watched.iter().all(|w| w.load(Ordering::Acquire)) {
            self.opts.ask_every
        } else {
            PULL_EVERY
        }
    }

    /// Whether to ask the servers about `what` now (and if so, recorded as asked): never
    /// asked, an event since the last time, or the fallback period over.
    pub(crate) fn ask_due(&self, asked: &Asked, what: &str) -> bool {
        let events = self.events();
        let every = self.ask_every();
        let mut g = lock(&asked.last);
        let due = match g.get(what) {
            None => true,
            Some((at, seen)) => *seen != events || at.elapsed() >= every,
        };
        if due {
            if g.len() >= ASKED_MAX {
                g.clear();
            }
            g.insert(what.to_string(), (Instant::now(), events));
        }
        due
    }

    /// Forgets `what` (it no longer waits).
    pub(crate) fn asked_done(&self, asked: &Asked, what: &str) {
        lock(&asked.last).remove(what);
    }

    /// The address of server `i`.
    pub(crate) fn addr(&self, i: usize) -> &str {
        &self.servers[i].addr
    }

    /// The server that owns `score` (rendezvous hashing over the server addresses).
    pub(crate) fn owner_of(&self, score: &Score) -> usize {
        let names: Vec<&str> = self.opts.servers.iter().map(String::as_str).collect();
        cascade_wire::owner_of(score, &names)
    }

    /// One line for a failure of server `i`.
    pub(crate) fn error(&self, i: usize, e: cascade_wire::Error) -> Error {
        Error::io(
            format!("staging server {}", self.addr(i)),
            std::io::Error::other(e.to_string()),
        )
    }

    pub(crate) fn describe(&self) -> String {
        format!("staging servers {}", self.opts.servers.join(","))
    }

    pub(crate) fn count(&self) -> usize {
        self.servers.len()
    }

    /// The server a file would go to first.
    pub(crate) fn home(&self) -> usize {
        match self.opts.placement {
            Placement::Stripe => self.next.fetch_add(1, Ordering::Relaxed) % self.count(),
            Placement::Group => {
                let h = blake3::hash(self.opts.node.as_bytes());
                let b = h.as_bytes();
                u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize
                    % self.count()
            }
        }
    }

    pub(crate) fn up(&self, i: usize) -> bool {
        let down = *lock(&self.servers[i].down);
        down.is_none_or(|d| Instant::now() >= d.retry_at)
    }

    /// How long every request to server `i` has failed (zero once one succeeds).
    pub(crate) fn silent_for(&self, i: usize) -> Duration {
        lock(&self.servers[i].down).map_or(Duration::ZERO, |d| d.since.elapsed())
    }

    /// The first server at or after `start` that is up and not in `exclude`.
    pub(crate) fn next_up(&self, start: usize, exclude: &[usize]) -> Option<usize> {
        (0..self.count())
            .map(|k| (start + k) % self.count())
            .find(|i| !exclude.contains(i) && self.up(*i))
    }

    /// Runs `f` on server `i`'s connection (connecting first if needed). On failure the
    /// connection is dropped and the server marked down for a backoff.
    pub(crate) fn with_conn<T>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Connection) -> cascade_wire::Result<T>,
    ) -> cascade_wire::Result<T> {
        self.run_on(i, &self.servers[i].conn, f)
    }

    /// Like [`ServerPool::with_conn`], on server `i`'s bulk connection (chunk uploads).
    pub(crate) fn with_bulk_conn<T>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Connection) -> cascade_wire::Result<T>,
    ) -> cascade_wire::Result<T> {
        self.run_on(i, &self.servers[i].bulk, f)
    }

    fn run_on<T>(
        &self,
        i: usize,
        conn: &Mutex<Option<Connected>>,
        f: impl FnOnce(&mut Connection) -> cascade_wire::Result<T>,
    ) -> cascade_wire::Result<T> {
        let slot = &self.servers[i];
        let mut conn = lock(conn);
        let failures_seen = slot.failures_seen.load(Ordering::Acquire);
        if conn
            .as_ref()
            .is_some_and(|c| c.failures_seen != failures_seen || c.connection.peer_closed())
        {
            *conn = None;
        }
        let result = (|| {
            if conn.is_none() {
                *conn = Some(Connected {
                    connection: Connection::connect(&slot.addr, &self.client)?,
                    failures_seen,
                });
            }
            match conn.as_mut() {
                Some(c) => f(&mut c.connection),
                None => unreachable!("connected above"),
            }
        })();
        match &result {
            Ok(_) => *lock(&slot.down) = None,
            // The server is up: it refused delta chunks (closing the connection), which are
            // sent whole at once; or it is full for what was asked, which a smaller file or
            // the next batch, after a drain, may fit (its drains take well under a backoff).
            Err(cascade_wire::Error::Refused { code, .. })
                if *code == cascade_wire::protocol::code::BASE_UNKNOWN
                    || *code == cascade_wire::protocol::code::FULL =>
            {
                *conn = None;
            }
            Err(_) => {
                *conn = None;
                slot.failures_seen.fetch_add(1, Ordering::AcqRel);
                let mut down = lock(&slot.down);
                let now = Instant::now();
                let failures = down.map_or(0, |d| d.failures) + 1;
                let delay = (Duration::from_millis(500) * (1 << failures.min(6)))
                    .min(Duration::from_secs(30));
                *down = Some(Down {
                    failures,
                    retry_at: now + delay,
                    since: down.map_or(now, |d| d.since),
                });
            }
        }
        result
    }
}

/// A watcher thread: holds a Watch on server `i` until the pool is dropped. A server that
/// refuses Watch (older) is left to the levels' polling; a failure reconnects after a
/// backoff (0.5 s doubling to 30 s) and is polled meanwhile.
fn watch_server(state: Weak<WatchState>, i: usize, addr: &str, client: &ClientOptions) {
    let mut conn: Option<Connection> = None;
    let mut failures = 0u32;
    // On a new connection the first Watch asks from 0: a restarted server counts afresh.
    let mut fresh = false;
    loop {
        let Some(seen) = state.upgrade().map(|s| s.events[i].load(Ordering::Acquire)) else {
            return;
        };
        let after = if fresh { 0 } else { seen };
        fresh = false;
        let result = match conn.as_mut() {
            Some(c) => c.watch(after, WATCH_FOR),
            None => match Connection::connect(addr, client) {
                Ok(c) => {
                    conn = Some(c);
                    fresh = true;
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        let Some(st) = state.upgrade() else { return };
        match result {
            Ok(events) => {
                failures = 0;
                st.watched[i].store(true, Ordering::Release);
                if events != seen {
                    // A restarted server counts from 0 again: any change is news.
                    st.events[i].store(events, Ordering::Release);
                    if let Some(wake) = lock(&st.wake).as_ref() {
                        wake();
                    }
                }
            }
            Err(cascade_wire::Error::Refused { code, .. })
                if code == cascade_wire::protocol::code::BAD_FRAME =>
            {
                // A server older than Watch: the levels poll it.
                st.watched[i].store(false, Ordering::Release);
                return;
            }
            Err(_) => {
                conn = None;
                st.watched[i].store(false, Ordering::Release);
                drop(st);
                failures += 1;
                let delay = (Duration::from_millis(500) * (1 << failures.min(6)))
                    .min(Duration::from_secs(30));
                std::thread::sleep(delay);
            }
        }
    }
}
