//! The agent's control socket (docs/agent.md).
//!
//! A Unix stream socket at `Store::agent_socket_path(name)`, mode 0600 in the store's private
//! lock directory (0700), one request per connection, one line each way. The agent answers
//! only processes of its own effective uid (SO_PEERCRED), and clients talk only to a socket
//! owned by their uid and served by a process of their uid (docs/security.md):
//!
//! ```text
//! FETCH <store path>\n   ->  OK\n  |  ERR <errno> <message>\n
//! STATUS\n               ->  OK <json of AgentStats>\n
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cascade_store::ownership::{self, Kind};
use cascade_store::Store;

use crate::agent::Agent;
use crate::{Error, Result};

/// Longest request line accepted.
const MAX_REQUEST: u64 = 8192;
/// How long `status` waits for the agent's counters.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

impl Agent {
    /// Serves the control socket on a thread of its own until the agent stops. The socket
    /// file is replaced if a dead agent left one: bound under a name of its own, made 0600,
    /// then renamed into place, so no client ever sees it with other modes.
    pub fn serve_control(self: &Arc<Self>) -> Result<std::thread::JoinHandle<()>> {
        let path = socket_path(self.store());
        let dir = Store::lock_dir(self.store().name());
        ownership::ensure_private_dir(
            &format!("lock directory of store {}", self.store().name()),
            &dir,
        )
        .map_err(|source| Error::Store {
            path: dir.display().to_string(),
            message: source.to_string(),
            source,
        })?;
        let aside = dir.join(format!(".agent.sock.{}", std::process::id()));
        let _ = std::fs::remove_file(&aside);
        let listener = UnixListener::bind(&aside)
            .map_err(|e| Error::io(format!("bind {}", aside.display()), e))?;
        let placed = std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", aside.display()), e))
            .and_then(|()| {
                std::fs::rename(&aside, &path)
                    .map_err(|e| Error::io(format!("rename to {}", path.display()), e))
            });
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&aside);
            return Err(e);
        }
        let agent = Arc::clone(self);
        Ok(std::thread::spawn(move || {
            for conn in listener.incoming() {
                if agent.stopping() {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let agent = Arc::clone(&agent);
                std::thread::spawn(move || agent.serve_one(conn));
            }
            let _ = std::fs::remove_file(&path);
        }))
    }

    /// Wakes the control thread so it sees the stop flag.
    pub fn stop_control(&self) {
        let _ = UnixStream::connect(socket_path(self.store()));
    }

    fn serve_one(&self, conn: UnixStream) {
        // Only processes of the agent's own uid: the socket's modes say the same, this holds
        // even if someone loosened them.
        match ownership::peer_uid(conn.as_raw_fd()) {
            Ok(uid) if uid == ownership::euid() => {}
            Ok(uid) => {
                cascade_observe::warn!(
                    "cascade agent: refused a control connection from uid {uid} (only uid {} is served)",
                    ownership::euid()
                );
                let _ = (&conn).write_all(b"ERR 13 this agent serves only its own user\n");
                return;
            }
            Err(_) => return,
        }
        let mut line = String::new();
        let mut reader = BufReader::new((&conn).take_limited());
        if reader.read_line(&mut line).is_err() || !line.ends_with('\n') {
            let _ = (&conn).write_all(b"ERR 22 request too long or not a line\n");
            return;
        }
        let line = line.trim_end_matches('\n');
        let reply = match line.split_once(' ') {
            Some(("FETCH", path)) if path.starts_with('/') => match self.fetch(path) {
                Ok(()) => "OK\n".to_string(),
                Err(e) => {
                    // A missing file is routine; a partial checkpoint deserves a word.
                    if e.errno() != libc::ENOENT || matches!(e, Error::IncompleteJob { .. }) {
                        cascade_observe::warn!("cascade agent: read-through of {path}: {e}");
                    }
                    format!("ERR {} {}\n", e.errno(), one_line(&e.to_string()))
                }
            },
            Some(("LIST", path)) if path.starts_with('/') => match self.list(path) {
                Ok(()) => "OK\n".to_string(),
                Err(e) => {
                    if e.errno() != libc::ENOENT {
                        cascade_observe::warn!(
                            "cascade agent: listing {path} from the levels below: {e}"
                        );
                    }
                    format!("ERR {} {}\n", e.errno(), one_line(&e.to_string()))
                }
            },
            None if line == "STATUS" => match serde_json::to_string(&self.stats()) {
                Ok(json) => format!("OK {json}\n"),
                Err(e) => format!("ERR 5 {e}\n"),
            },
            _ => "ERR 22 unknown request\n".to_string(),
        };
        let _ = (&conn).write_all(reply.as_bytes());
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn socket_path(store: &Store) -> PathBuf {
    Store::agent_socket_path(store.name())
}

/// Reads at most MAX_REQUEST bytes from a stream.
trait TakeLimited {
    fn take_limited(self) -> std::io::Take<Self>
    where
        Self: Sized;
}

impl<R: std::io::Read> TakeLimited for R {
    fn take_limited(self) -> std::io::Take<Self> {
        self.take(MAX_REQUEST)
    }
}

/// Sends one request line to the agent of `store_name` and returns its reply line (without
/// the newline). Used by the CLI (`cascade status`) and tests. Refuses a lock directory or
/// socket not private to this user, and a socket served by a process of another uid.
pub fn request(store_name: &str, line: &str) -> std::io::Result<String> {
    request_within(store_name, line, None)
}

/// [`request`], waiting at most `timeout` for the reply (None: no limit).
pub fn request_within(
    store_name: &str,
    line: &str,
    timeout: Option<Duration>,
) -> std::io::Result<String> {
    let path = Store::agent_socket_path(store_name);
    let dir = Store::lock_dir(store_name);
    if !ownership::check_private_dir(&format!("lock directory of store {store_name}"), &dir)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: no agent socket", path.display()),
        ));
    }
    if let Some(st) = ownership::lstat(&path)? {
        ownership::check_stat("agent socket", &path, &st, Kind::Socket)?;
    }
    let mut conn = UnixStream::connect(&path)?;
    ownership::check_agent_peer(conn.as_raw_fd(), &path)?;
    conn.set_read_timeout(timeout)?;
    conn.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply)?;
    Ok(reply.trim_end_matches('\n').to_string())
}

/// The counters of the agent of `store_name`, if one answers on its control socket.
pub fn status(store_name: &str) -> Option<crate::AgentStats> {
    let reply = request_within(store_name, "STATUS", Some(STATUS_TIMEOUT)).ok()?;
    serde_json::from_str(reply.strip_prefix("OK ")?).ok()
}

/// The read-through requests a client may make (docs/agent.md, "Read-through").
#[derive(Debug, Clone, Copy)]
pub enum ReadThroughRequest {
    /// Bring a file (or a directory's name) into the store from the levels below.
    Fetch,
    /// Show in a store directory the names the levels below hold (no data).
    List,
}

/// The agent's answer to a read-through request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadThrough {
    /// Done: the path now exists in the store, or the directory shows what is below; retry.
    Done,
    /// No agent serves this store: the caller's own error stands.
    NoAgent,
    /// The agent's error (ENOENT: no level has it), or EIO when it could not be asked.
    Failed { errno: i32, message: String },
}

/// Asks the agent of `store_name` to read `path` (an absolute store path) through from the
/// levels below: what the preload library does for a program, for clients in Rust (the
/// Python package). The wait is bounded by [`Store::fetch_timeout`].
pub fn read_through(store_name: &str, what: ReadThroughRequest, path: &str) -> ReadThrough {
    if !path.starts_with('/') || path.contains('\n') {
        return ReadThrough::NoAgent;
    }
    let verb = match what {
        ReadThroughRequest::Fetch => "FETCH",
        ReadThroughRequest::List => "LIST",
    };
    let timeout = Store::fetch_timeout();
    match request_within(store_name, &format!("{verb} {path}"), timeout) {
        Ok(reply) if reply == "OK" => ReadThrough::Done,
        Ok(reply) => {
            let (errno, message) = reply
                .strip_prefix("ERR ")
                .and_then(|rest| rest.split_once(' '))
                .and_then(|(n, m)| Some((n.parse().ok()?, m.to_string())))
                .unwrap_or((
                    libc::EIO,
                    format!("unreadable answer from the node agent: {reply:?}"),
                ));
            ReadThrough::Failed { errno, message }
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            ReadThrough::NoAgent
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            ReadThrough::Failed {
                errno: libc::EIO,
                message: Store::fetch_timed_out(timeout),
            }
        }
        Err(e) => ReadThrough::Failed {
            errno: libc::EIO,
            message: format!("read-through: cannot ask the node agent: {e}"),
        },
    }
}
