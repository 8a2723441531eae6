//! Connections to the staging servers (docs/staging.md), shared by the two staging levels:
//! one connection per server, a server that fails is marked down for a backoff, and where a
//! file or chunk goes first (placement, rendezvous hashing of scores).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cascade_dedup::Score;
use cascade_wire::auth::JobKey;
use cascade_wire::client::{ClientOptions, Connection};

use crate::options::{Placement, StagingOptions};
use crate::Error;

struct ServerSlot {
    addr: String,
    conn: Mutex<Option<Connection>>,
    /// Consecutive failures and when to try again.
    down: Mutex<Option<(u32, Instant)>>,
}

/// Connections to the staging servers, shared by the staging levels.
pub(crate) struct ServerPool {
    pub(crate) opts: StagingOptions,
    client: ClientOptions,
    /// The job's key: tags the versions this agent stages, checks the ones it reads.
    pub(crate) job_key: JobKey,
    servers: Vec<ServerSlot>,
    next: AtomicUsize,
}

/// How often the agent asks the servers what has drained.
pub(crate) const PULL_EVERY: Duration = Duration::from_millis(500);

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
                down: Mutex::new(None),
            })
            .collect();
        ServerPool {
            opts,
            job_key: client.job_key(),
            client,
            servers,
            next: AtomicUsize::new(0),
        }
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
        down.is_none_or(|(_, at)| Instant::now() >= at)
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
        let slot = &self.servers[i];
        let mut conn = lock(&slot.conn);
        let result = (|| {
            if conn.is_none() {
                *conn = Some(Connection::connect(&slot.addr, &self.client)?);
            }
            match conn.as_mut() {
                Some(c) => f(c),
                None => unreachable!("connected above"),
            }
        })();
        match &result {
            Ok(_) => *lock(&slot.down) = None,
            // The server is up: it refused delta chunks (closing the connection), which are
            // sent whole at once.
            Err(cascade_wire::Error::Refused { code, .. })
                if *code == cascade_wire::protocol::code::BASE_UNKNOWN =>
            {
                *conn = None;
            }
            Err(_) => {
                *conn = None;
                let mut down = lock(&slot.down);
                let failures = down.map_or(0, |(n, _)| n) + 1;
                let delay = (Duration::from_millis(500) * (1 << failures.min(6)))
                    .min(Duration::from_secs(30));
                *down = Some((failures, Instant::now() + delay));
            }
        }
        result
    }
}
