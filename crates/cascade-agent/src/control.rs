//! Read-through and the agent's control socket (docs/agent.md).
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
use std::time::Instant;

use cascade_store::Store;

use crate::daemon::Agent;
use crate::restore::write_fetched;
use crate::{Error, Result};

/// Infix of the temporary name a file is fetched under (`.NAME.cascade-fetch-PID`) before it
/// is renamed into place: the agent's passes must never send such a file down.
const FETCH_TEMP: &str = ".cascade-fetch-";

/// True for the base name of a file being fetched.
pub(crate) fn is_fetch_temp(base: &str) -> bool {
    base.starts_with('.') && base.contains(FETCH_TEMP)
}

/// Longest request line accepted.
const MAX_REQUEST: u64 = 8192;

impl Agent {
    /// Makes `path` (a store path) exist in the store from the durable tier: a file is
    /// downloaded, verified against its `.blake3` object, and renamed into place; a
    /// directory (a prefix with objects below it) is created. ENOENT if the durable tier has
    /// neither, EIO if the data does not match its checksum.
    pub fn fetch(&self, path: &str) -> Result<()> {
        let path = format!("/{}", path.trim_matches('/'));
        if self.store().stat(&path).is_ok() {
            return Ok(());
        }
        // One download per path: later requests wait for the first.
        {
            let mut busy = self
                .fetching
                .lock()
                .map_err(|_| Error::io("fetch", std::io::Error::other("lock poisoned")))?;
            while busy.contains(&path) {
                busy = self
                    .fetched
                    .wait(busy)
                    .map_err(|_| Error::io("fetch", std::io::Error::other("lock poisoned")))?;
            }
            if self.store().stat(&path).is_ok() {
                return Ok(());
            }
            busy.insert(path.clone());
        }
        let result = self.fetch_uncached(&path);
        if let Ok(mut busy) = self.fetching.lock() {
            busy.remove(&path);
        }
        self.fetched.notify_all();
        result
    }

    fn fetch_uncached(&self, path: &str) -> Result<()> {
        let key = path.trim_start_matches('/');
        let store = self.store();
        let durable = self.durable();
        let started = Instant::now();
        let cut = path.rfind('/').unwrap_or(0);
        let (parent, name) = (&path[..cut], &path[cut + 1..]);
        let tmp = format!("{parent}/.{name}{FETCH_TEMP}{}", std::process::id());
        if let Some(staging) = self.staging() {
            // A staging server may hold a newer version than the durable tier, or the only
            // one (drain not finished when this job's previous node was lost).
            if let Some(size) = self.fetch_from_staging(staging, key, &tmp)? {
                return self.install_fetched(&tmp, path, size, true, started);
            }
            // Or the chunks of a checkpoint stored with dedup whose manifest is not durable.
            if let Some(size) = self.fetch_from_staging_dedup(staging, key, &tmp)? {
                return self.install_fetched(&tmp, path, size, true, started);
            }
        }
        let is_file = match durable.size(key) {
            Ok(_) => true,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(Error::Durable(e)),
        };
        if let Some(file) = self.find_in_repo(key)? {
            // Both layouts hold the name (the checkpoint was drained plain, then with dedup,
            // or the reverse): the newer one wins.
            let plain_is_newer = is_file
                && durable
                    .recorded_version(key)
                    .map_err(Error::Durable)?
                    .is_some_and(|stamp| stamp > file.written_unix_ns);
            if !plain_is_newer {
                let size = self.restore_from_repo(&file, &tmp)?;
                return self.install_fetched(&tmp, path, size, false, started);
            }
        }
        if !is_file {
            let below = durable.list(&format!("{key}/")).map_err(Error::Durable)?;
            if below.is_empty() && self.is_dir_in_repo(key)? {
                return store
                    .create_dir_all(path, 0o755)
                    .map_err(|e| Error::store(path, e));
            }
            if below.is_empty() {
                return Err(Error::Durable(cascade_durable::Error::NotFound {
                    store: durable.name().to_string(),
                    path: key.to_string(),
                }));
            }
            return store
                .create_dir_all(path, 0o755)
                .map_err(|e| Error::store(path, e));
        }
        let digest = write_fetched(store, &tmp, |out| {
            durable.download_to(key, out).map_err(Error::Durable)
        })?;
        self.install_fetched(&tmp, path, digest.size, false, started)
    }

    /// Renames a verified fetched file into place and records the level it came from
    /// (staged only, or durable), so it is not sent back down.
    fn install_fetched(
        &self,
        tmp: &str,
        path: &str,
        size: u64,
        staged_only: bool,
        started: Instant,
    ) -> Result<()> {
        let store = self.store();
        store
            .rename_fetched(tmp, path, staged_only)
            .map_err(|e| Error::store(path, e))?;
        if let Ok(mut s) = self.stats.lock() {
            s.fetched_files += 1;
            s.fetched_bytes += size;
        }
        let from = if staged_only {
            " from a staging server"
        } else {
            ""
        };
        self.log(|| {
            format!(
                "fetched {path} ({size} bytes, verified){from} in {:.3} s",
                started.elapsed().as_secs_f64()
            )
        });
        Ok(())
    }

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
                    if e.errno() != libc::ENOENT {
                        eprintln!("cascade agent: read-through of {path}: {e}");
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
