//! Read-through: a path under the mount that the store does not have is asked of the node
//! agent, which may fetch it from the durable store (docs/interposition.md, "Read-through").
//!
//! Protocol, one request per connection on the Unix stream socket
//! `Store::agent_socket_path(store name)`: the client writes `FETCH <store path>\n` (absolute,
//! normalised, no newline) or `LIST <store directory>\n` and reads one line: `OK\n` (the
//! path now exists, or the directory now shows what the levels below hold: retry) or
//! `ERR <errno> <message>\n`. End of file before a line is EIO.
//!
//! Everything here uses raw system calls (`libc::syscall`), never the libc functions this
//! library wraps (`read`, `write`, `close`...), so it cannot re-enter a wrapper, and it builds
//! unchanged in the `ld --wrap` archive.

use super::*;
use libc::c_int;
use std::cell::Cell;
use std::io::Write as _;

thread_local! {
    /// Set while this thread talks to the agent: nothing inside may start another fetch.
    static IN_FETCH: Cell<bool> = const { Cell::new(false) };
}

/// What asking the agent gave.
enum Fetch {
    /// The path now exists in the store: retry the operation.
    Fetched,
    /// No agent (or a path it cannot be asked about): the original ENOENT stands.
    NoAgent,
    /// The agent's answer: this error for the application.
    Failed(Error),
    /// The agent did not answer in time (`CASCADE_FETCH_TIMEOUT`): EIO, and no further
    /// request for this call.
    Hung(Error),
}

/// Runs `op` on store path `path`; if it fails with ENOENT and a node agent fetches the path
/// from the durable store, runs it once more. Callers use it only where read-through applies
/// (opens without O_CREAT, the stat/access family, opendir, chdir).
pub(crate) fn with_fetch<T>(path: &str, op: impl Fn() -> Result<T, Error>) -> Result<T, Error> {
    match op() {
        // The protocol is line-based: a path with a newline is never asked about.
        Err(e) if e.errno() == libc::ENOENT && !path.contains('\n') => {
            // Listing the parent brings the name without its data (a stat needs no more; an
            // open fetches a remote file next); else the agent fetches the path itself.
            if let Some((parent, _)) = path.rsplit_once('/') {
                let parent = if parent.is_empty() { "/" } else { parent };
                match ask(Verb::List, parent) {
                    Fetch::Fetched => {
                        if let found @ Ok(_) = op() {
                            return found;
                        }
                    }
                    Fetch::Hung(err) => return Err(err),
                    _ => {}
                }
            }
            match ask(Verb::Fetch, path) {
                Fetch::Fetched => op(),
                Fetch::NoAgent => Err(e),
                Fetch::Failed(err) | Fetch::Hung(err) => Err(err),
            }
        }
        other => other,
    }
}

/// Fetches a remote file (listed from a level below, or evicted from memory): its name is in
/// the store, its content only below. EIO when no agent can fetch it.
pub(crate) fn fetch_remote(path: &str) -> Result<(), Error> {
    match ask(Verb::Fetch, path) {
        Fetch::Fetched => Ok(()),
        Fetch::NoAgent => {
            let why = "the content is only in a level below this node's store and no node \
                       agent runs to fetch it (run under cascade run, or cascade restore it)";
            let shown = match path.strip_prefix('/') {
                Some(_) => format!("{}{path}", mount()),
                None => path.to_string(),
            };
            report(&shown, why);
            Err(Error::new(libc::EIO, format!("{path}: {why}")))
        }
        Fetch::Failed(e) | Fetch::Hung(e) => Err(e),
    }
}

/// Before a directory is listed: asks the agent to show in it what the levels below hold
/// (names and sizes, no data). Without an agent the listing is what the store has.
pub(crate) fn list_below(path: &str) {
    let _ = ask(Verb::List, path);
}

/// Clears the recursion flag when the fetch ends, however it ends.
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_FETCH.try_with(|f| f.set(false));
    }
}

/// The requests the agent answers.
#[derive(Clone, Copy)]
enum Verb {
    Fetch,
    List,
}

fn ask(verb: Verb, path: &str) -> Fetch {
    // A thread being torn down (no TLS) or already fetching does not ask again.
    match IN_FETCH.try_with(|f| f.replace(true)) {
        Ok(false) => {}
        _ => return Fetch::NoAgent,
    }
    let _guard = Guard;
    let Ok(store) = store() else {
        return Fetch::NoAgent;
    };
    let Some(abs) = absolute_store_path(store, path) else {
        return Fetch::NoAgent;
    };
    if abs.contains('\n') {
        return Fetch::NoAgent;
    }
    let socket = Store::agent_socket_path(store.name());
    let app_path = if abs == "/" {
        mount().to_string()
    } else {
        format!("{}{abs}", mount())
    };
    let conn = match Conn::connect(socket.as_os_str().as_encoded_bytes()) {
        Ok(conn) => conn,
        Err(NotConnected::NoAgent) => return Fetch::NoAgent,
        // An agent that stopped accepting (its backlog full) is as hung as one that stopped
        // answering.
        Err(NotConnected::TimedOut) => {
            let why = timed_out();
            report(&app_path, &why);
            return Fetch::Hung(Error::new(libc::EIO, why));
        }
    };
    match conn.request(verb, &abs) {
        Ok(Answer::Ok) => Fetch::Fetched,
        Ok(Answer::Err(errno, message)) => {
            if errno == libc::EIO {
                report(&app_path, &message);
            }
            Fetch::Failed(Error::new(errno, message))
        }
        Err(Broken::Other(why)) => {
            report(&app_path, &why);
            Fetch::Failed(Error::new(libc::EIO, why))
        }
        Err(Broken::TimedOut(why)) => {
            report(&app_path, &why);
            Fetch::Hung(Error::new(libc::EIO, why))
        }
    }
}

/// One line on stderr for an EIO the application gets from a fetch.
fn report(app_path: &str, message: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "cascade: {app_path}: {}",
        if message.is_empty() {
            "read-through from the durable store failed"
        } else {
            message
        }
    );
}

/// The absolute, normalised store path the agent is asked for. An anchored path (an `*at`
/// call relative to a Cascade directory descriptor) is resolved through its directory's
/// current path; None when that directory is gone.
fn absolute_store_path(store: &Store, path: &str) -> Option<String> {
    if path.starts_with('/') {
        return Some(normalise(path));
    }
    let anchored = path.strip_prefix('\0')?;
    let (anchor, rel) = anchored.split_once('/').unwrap_or((anchored, ""));
    let (ino, generation) = anchor.split_once(':')?;
    let dir = store
        .reopen(ino.parse().ok()?, generation.parse().ok()?, libc::O_RDONLY)
        .ok()?
        .current_path()
        .ok()?;
    Some(normalise(&join_store(&dir, rel)))
}

/// How long a request may wait for the agent without a byte moving (read once):
/// [`Store::fetch_timeout`].
fn fetch_timeout() -> Option<std::time::Duration> {
    static TIMEOUT: OnceLock<Option<std::time::Duration>> = OnceLock::new();
    *TIMEOUT.get_or_init(Store::fetch_timeout)
}

/// The text of a request that ran out of time.
fn timed_out() -> String {
    Store::fetch_timed_out(fetch_timeout())
}

/// Why a request got no answer (EIO for the application).
enum Broken {
    /// Nothing came within the timeout.
    TimedOut(String),
    Other(String),
}

enum Answer {
    Ok,
    Err(i32, String),
}

/// The last errno, after a failed raw system call.
fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Why there is no connection to the agent.
enum NotConnected {
    /// No socket, nobody listening, or any other failure: the original ENOENT stands.
    NoAgent,
    /// The agent's backlog stayed full for the whole timeout.
    TimedOut,
}

/// A connected socket, closed on drop (with the raw close: the wrapper is not needed).
struct Conn(c_int);

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: closing the socket this connection owns.
        unsafe { libc::syscall(libc::SYS_close, self.0) };
    }
}

impl Conn {
    /// Connects to the agent's socket; NoAgent when there is none to talk to (no socket file,
    /// nobody listening, a path too long for sockaddr_un, any other connect failure, or a
    /// socket served by a process of another uid).
    fn connect(path: &[u8]) -> Result<Conn, NotConnected> {
        // SAFETY: all-zero is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if path.is_empty() || path.len() >= addr.sun_path.len() || path.contains(&0) {
            return Err(NotConnected::NoAgent);
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (dst, src) in addr.sun_path.iter_mut().zip(path) {
            *dst = *src as libc::c_char;
        }
        let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + path.len() + 1;
        // SAFETY: plain socket(2); the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_socket,
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(NotConnected::NoAgent);
        }
        let conn = Conn(fd as c_int);
        if let Some(t) = fetch_timeout() {
            let tv = libc::timeval {
                tv_sec: t.as_secs() as libc::time_t,
                tv_usec: t.subsec_micros() as libc::suseconds_t,
            };
            for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
                // SAFETY: setsockopt(2) with a live timeval of the size given.
                unsafe {
                    libc::syscall(
                        libc::SYS_setsockopt,
                        conn.0,
                        libc::SOL_SOCKET,
                        opt,
                        &tv as *const libc::timeval,
                        std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                    )
                };
            }
        }
        loop {
            // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_connect,
                    conn.0,
                    &addr as *const libc::sockaddr_un,
                    len as libc::socklen_t,
                )
            };
            // EISCONN: an interrupted connect that completed meanwhile.
            if rc == 0 || errno() == libc::EISCONN {
                // Only an agent of this user: a socket served by another uid is not ours
                // (docs/security.md).
                let peer = cascade_store::ownership::peer_uid(conn.0)
                    .map_err(|_| NotConnected::NoAgent)?;
                return if peer == cascade_store::ownership::euid() {
                    Ok(conn)
                } else {
                    Err(NotConnected::NoAgent)
                };
            }
            match errno() {
                libc::EINTR => continue,
                // SO_SNDTIMEO ran out while the agent's backlog was full.
                libc::EAGAIN => return Err(NotConnected::TimedOut),
                _ => return Err(NotConnected::NoAgent),
            }
        }
    }

    /// Sends the request and reads the one-line answer. Err: the text of an EIO.
    fn request(&self, verb: Verb, store_path: &str) -> Result<Answer, Broken> {
        let line = match verb {
            Verb::Fetch => format!("FETCH {store_path}\n"),
            Verb::List => format!("LIST {store_path}\n"),
        };
        let mut sent = 0;
        while sent < line.len() {
            let rest = &line.as_bytes()[sent..];
            // SAFETY: sending from a live buffer of rest.len() bytes; MSG_NOSIGNAL: a peer
            // that went away gives EPIPE, not a SIGPIPE that would kill the application.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_sendto,
                    self.0,
                    rest.as_ptr(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                    std::ptr::null::<libc::sockaddr>(),
                    0,
                )
            };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Err(Broken::TimedOut(timed_out())),
                    e => {
                        return Err(Broken::Other(format!(
                            "read-through: cannot send the request to the node agent: {}",
                            cascade_store::errno_text(e)
                        )))
                    }
                }
            }
            sent += n as usize;
        }
        let mut answer = Vec::with_capacity(64);
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reading into a live buffer of buf.len() bytes.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_recvfrom,
                    self.0,
                    buf.as_mut_ptr(),
                    buf.len(),
                    0,
                    std::ptr::null_mut::<libc::sockaddr>(),
                    std::ptr::null_mut::<libc::socklen_t>(),
                )
            };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Err(Broken::TimedOut(timed_out())),
                    e => {
                        return Err(Broken::Other(format!(
                            "read-through: cannot read the node agent's answer: {}",
                            cascade_store::errno_text(e)
                        )))
                    }
                }
            }
            if n == 0 {
                return Err(Broken::Other(
                    "read-through: the node agent closed the connection without an answer"
                        .to_string(),
                ));
            }
            answer.extend_from_slice(&buf[..n as usize]);
            if let Some(end) = answer.iter().position(|&b| b == b'\n') {
                answer.truncate(end);
                return parse_answer(&String::from_utf8_lossy(&answer)).map_err(Broken::Other);
            }
            if answer.len() > 64 << 10 {
                return Err(Broken::Other(
                    "read-through: the node agent's answer is too long".to_string(),
                ));
            }
        }
    }
}

/// `OK` or `ERR <errno> <message>`; anything else is an EIO.
fn parse_answer(line: &str) -> Result<Answer, String> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line == "OK" {
        return Ok(Answer::Ok);
    }
    if let Some(rest) = line.strip_prefix("ERR ") {
        let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Ok(errno) = code.parse::<i32>() {
            if errno > 0 {
                return Ok(Answer::Err(errno, message.trim().to_string()));
            }
        }
    }
    Err(format!(
        "read-through: unexpected answer from the node agent: {line:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        assert!(matches!(parse_answer("OK"), Ok(Answer::Ok)));
        assert!(matches!(parse_answer("OK\r"), Ok(Answer::Ok)));
        match parse_answer("ERR 5 checksum mismatch in chunk 3") {
            Ok(Answer::Err(5, m)) => assert_eq!(m, "checksum mismatch in chunk 3"),
            _ => panic!("ERR 5 did not parse"),
        }
        match parse_answer("ERR 2") {
            Ok(Answer::Err(2, m)) => assert_eq!(m, ""),
            _ => panic!("ERR 2 did not parse"),
        }
        assert!(parse_answer("ERR x y").is_err());
        assert!(parse_answer("ERR 0 zero").is_err());
        assert!(parse_answer("ERR -3 neg").is_err());
        assert!(parse_answer("YES").is_err());
        assert!(parse_answer("").is_err());
    }
}
