//! The agent's control socket (docs/agent.md).
//!
//! A Unix stream socket at `Store::agent_socket_path(name)`, mode 0600, one request per
//! connection, one line each way:
//!
//! ```text
//! FETCH <store path>\n   ->  OK\n  |  ERR <errno> <message>\n
//! STATUS\n               ->  OK <json of AgentStats>\n
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;

use cascade_store::Store;

use crate::agent::Agent;
use crate::{Error, Result};

/// Longest request line accepted.
const MAX_REQUEST: u64 = 8192;

impl Agent {
    /// Serves the control socket on a thread of its own until the agent stops. The socket
    /// file is replaced if a dead agent left one.
    pub fn serve_control(self: &Arc<Self>) -> Result<std::thread::JoinHandle<()>> {
        let path = socket_path(self.store());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
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
                        eprintln!("cascade agent: read-through of {path}: {e}");
                    }
                    format!("ERR {} {}\n", e.errno(), one_line(&e.to_string()))
                }
            },
            Some(("LIST", path)) if path.starts_with('/') => match self.list(path) {
                Ok(()) => "OK\n".to_string(),
                Err(e) => {
                    if e.errno() != libc::ENOENT {
                        eprintln!("cascade agent: listing {path} from the levels below: {e}");
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
/// the newline). Used by the CLI (`cascade status`) and tests.
pub fn request(store_name: &str, line: &str) -> std::io::Result<String> {
    let mut conn = UnixStream::connect(Store::agent_socket_path(store_name))?;
    conn.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply)?;
    Ok(reply.trim_end_matches('\n').to_string())
}

/// The counters of the agent of `store_name`, if one answers on its control socket.
pub fn status(store_name: &str) -> Option<crate::AgentStats> {
    let reply = request(store_name, "STATUS").ok()?;
    serde_json::from_str(reply.strip_prefix("OK ")?).ok()
}
