//! A staging server, `cascade stage-server -v`, as a real process on 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;
use std::time::Duration;

use cascade_wire::auth::{JobKey, Transcript};
use cascade_wire::protocol::{self, kind, Header, PullKind, PullState, Reply};
use cascade_wire::{ClientOptions, Connection, ServerStatus};

use crate::node::Env;
use crate::process::Daemon;
use crate::tls::TestPki;

/// The start of the line a server prints once it listens, followed by its address.
const START_LINE: &str = "cascade stage-server: listening on ";
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Makes every drain of a server started with `--drain-to dir` fail from now on: the
/// directory becomes a regular file (the server checked it when it started).
pub fn break_drain_target(dir: &Path) {
    std::fs::remove_dir_all(dir).expect("remove the drain directory");
    std::fs::write(dir, b"not a directory\n").expect("put a file in its place");
}

/// Runs `start` (a server's start or restart) with a drain target, `unreachable` in the
/// test's temporary directory, that is a directory while it starts and then a file
/// ([`break_drain_target`]): nothing the server holds reaches the durable store until it
/// is restarted with another target.
pub fn with_unreachable_target<T>(env: &Env, start: impl FnOnce(&str) -> T) -> T {
    let target = env.tmp.path().join("unreachable");
    std::fs::create_dir_all(&target).expect("drain directory");
    let started = start(target.to_str().expect("utf-8 path"));
    break_drain_target(&target);
    started
}

/// A staging server started on any free port (the one it reports is kept), killed and
/// restarted on the same port and arena directory, its status read with the shared secret
/// over one kept connection. Ready when it has printed its start line, from which the
/// address is read.
pub struct StageServer {
    pub daemon: Daemon,
    /// 127.0.0.1:PORT
    pub addr: String,
    pub dir: PathBuf,
    pub drain_to: String,
    secret: String,
    extra: Vec<String>,
    /// The CA its status connection trusts, when it speaks TLS.
    tls_ca: Option<PathBuf>,
    /// Stderr lines of earlier incarnations (before a kill or restart).
    earlier: Vec<String>,
    conn: Mutex<Option<Connection>>,
}

impl StageServer {
    /// Starts a server (run by `env`'s `cascade`) with arenas in `dir` draining to
    /// `drain_to`, requiring `secret`; `extra` are more arguments (`--ssd-capacity 32MiB`).
    /// Returns once it listens.
    pub fn start(
        env: &Env,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        extra: &[&str],
    ) -> StageServer {
        Self::start_with(env, dir, drain_to, secret, extra, None)
    }

    /// [`StageServer::start`] with TLS: the server gets `pki`'s certificate and key
    /// (`--tls-cert`, `--tls-key`), and its status connection trusts `pki`'s CA.
    pub fn start_tls(
        env: &Env,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        pki: &TestPki,
        extra: &[&str],
    ) -> StageServer {
        Self::start_with(env, dir, drain_to, secret, extra, Some(pki))
    }

    fn start_with(
        env: &Env,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        extra: &[&str],
        tls: Option<&TestPki>,
    ) -> StageServer {
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if let Some(pki) = tls {
            for (flag, path) in [("--tls-cert", &pki.cert), ("--tls-key", &pki.key)] {
                extra.push(flag.to_string());
                extra.push(path.display().to_string());
            }
        }
        let (daemon, addr) = Self::spawn(env, "127.0.0.1:0", dir, drain_to, secret, &extra);
        StageServer {
            daemon,
            addr,
            dir: dir.to_path_buf(),
            drain_to: drain_to.to_string(),
            secret: secret.to_string(),
            extra,
            tls_ca: tls.map(|pki| pki.ca.clone()),
            earlier: Vec::new(),
            conn: Mutex::new(None),
        }
    }

    /// Spawns a server and waits for its start line; returns it and the address it listens
    /// on.
    fn spawn(
        env: &Env,
        listen: &str,
        dir: &Path,
        drain_to: &str,
        secret: &str,
        extra: &[String],
    ) -> (Daemon, String) {
        let mut cmd = env.cli();
        cmd.args([
            "stage-server",
            "-v",
            "--listen",
            listen,
            "--drain-to",
            drain_to,
        ])
        .arg("--dir")
        .arg(dir)
        // Tests start many servers at once: each faulting 2 GiB in would only load CI.
        .args(["--prefault-drain-memory", "off"])
        .args(extra)
        .env("CASCADE_STAGING_SECRET", secret);
        let mut d = Daemon::spawn(
            cmd,
            &format!("cascade stage-server (dir {})", dir.display()),
        );
        let line = d.wait_line("its start line", START_TIMEOUT, |l| {
            l.starts_with(START_LINE)
        });
        let addr = line
            .strip_prefix(START_LINE)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in the start line {line:?}"))
            .to_string();
        (d, addr)
    }

    /// The start line of the running incarnation ("... recovered: N file(s) ...").
    pub fn start_line(&self) -> String {
        self.daemon
            .lines()
            .into_iter()
            .find(|l| l.starts_with(START_LINE))
            .unwrap_or_default()
    }

    /// SIGKILL (the arenas and index stay as the crash left them), then reap.
    pub fn kill9(&mut self) -> ExitStatus {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.daemon.kill9()
    }

    /// Starts the server again on the same port and directory, draining to `drain_to`
    /// (after [`StageServer::kill9`], or killing the running one first).
    pub fn restart(&mut self, env: &Env, drain_to: &str) {
        if self.daemon.alive() {
            self.kill9();
        }
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let (d, _) = Self::spawn(
            env,
            &self.addr,
            &self.dir,
            drain_to,
            &self.secret,
            &self.extra,
        );
        let old = std::mem::replace(&mut self.daemon, d);
        self.earlier.extend(old.lines());
        self.earlier.push("--- restarted ---".to_string());
        self.drain_to = drain_to.to_string();
    }

    /// Every stderr line of every incarnation.
    pub fn log(&self) -> String {
        let mut all = self.earlier.clone();
        all.push(self.daemon.log());
        all.join("\n")
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> cascade_wire::Result<T>,
    ) -> cascade_wire::Result<T> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if conn.is_none() {
            let mut opts = ClientOptions::new(&self.secret);
            opts.connect_timeout = Duration::from_secs(2);
            opts.io_timeout = Duration::from_secs(30);
            if let Some(ca) = &self.tls_ca {
                let config =
                    cascade_wire::tls::client_config(ca).map_err(cascade_wire::Error::Invalid)?;
                opts.tls = Some(config);
            }
            *conn = Some(Connection::connect(&self.addr, &opts)?);
        }
        let result = f(conn.as_mut().expect("connected"));
        if result.is_err() {
            *conn = None;
        }
        result
    }

    /// The server's status (its Status reply), or the error reaching it.
    pub fn try_status(&self) -> cascade_wire::Result<ServerStatus> {
        self.with_conn(|c| c.status())
    }

    /// The server's status; fails the test if it does not answer.
    pub fn status(&self) -> ServerStatus {
        self.try_status()
            .unwrap_or_else(|e| panic!("status of {}: {e}\nits stderr:\n{}", self.addr, self.log()))
    }

    /// What the server holds of `key` (a file's durable name): level, stamp, size, BLAKE3.
    pub fn pull_file(&self, key: &str) -> PullState {
        self.with_conn(|c| c.pull(&[(PullKind::File, key)]))
            .unwrap_or_else(|e| panic!("pull {key} from {}: {e}", self.addr))
            .remove(0)
    }
}

/// The client nonce of hand-made handshakes (a fixed one: the server's nonce is what makes
/// each handshake unique).
pub const RAW_CLIENT_NONCE: [u8; 32] = [7; 32];

/// The Hello frame (request 1) of a hand-made client on a raw stream (docs/staging-protocol.md,
/// "Hello and Auth").
pub fn raw_hello_frame(client: &str, namespace: &str) -> Vec<u8> {
    raw_frame(
        kind::HELLO,
        1,
        &protocol::encode_hello(client, namespace, &RAW_CLIENT_NONCE),
    )
}

/// The Auth frame (request 2) that answers `challenge` (the body of the reply to Hello) with
/// the proof of `key` for `namespace`. Panics if `challenge` is not a Challenge.
pub fn raw_auth_frame(challenge: &[u8], key: &JobKey, namespace: &str) -> Vec<u8> {
    let Ok(Reply::Challenge { nonce, .. }) = Reply::decode(kind::HELLO | kind::REPLY, challenge)
    else {
        panic!("not a Challenge: {challenge:02x?}");
    };
    let transcript = Transcript {
        namespace,
        client_nonce: RAW_CLIENT_NONCE,
        server_nonce: nonce,
        binding: None,
    };
    raw_frame(
        kind::AUTH,
        2,
        &protocol::encode_auth(&key.client_proof(&transcript)),
    )
}

/// One frame's bytes.
pub fn raw_frame(k: u8, request: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let header = Header {
        kind: k,
        body_len: body.len() as u32,
        request,
    };
    // Writing to a Vec cannot fail.
    let _ = protocol::write_frame(&mut out, header, &[body]);
    out
}

/// Rewrites a stopped server's `index.log` (docs/staging-arenas.md) as a server from before
/// version tags would have written it: every TaggedSeal record (type 10) becomes a plain
/// Seal (type 4) without the tag, its frame's length and CRC-32C recomputed. How many were
/// rewritten.
pub fn untag_seals(index: &Path) -> usize {
    const HEADER: usize = 16;
    const TAGGED_SEAL: u8 = 10;
    const SEAL: u8 = 4;
    const SEAL_BODY: usize = 1 + 8 + 32;
    let old = std::fs::read(index).unwrap_or_else(|e| panic!("read {}: {e}", index.display()));
    assert!(old.len() >= HEADER, "{} has no header", index.display());
    let mut new = old[..HEADER].to_vec();
    let mut at = HEADER;
    let mut rewritten = 0;
    while at + 8 <= old.len() {
        let len = u32::from_le_bytes(old[at..at + 4].try_into().expect("4 bytes")) as usize;
        let body = &old[at + 8..at + 8 + len];
        if body[0] == TAGGED_SEAL {
            let mut seal = body[..SEAL_BODY].to_vec();
            seal[0] = SEAL;
            new.extend_from_slice(&(seal.len() as u32).to_le_bytes());
            new.extend_from_slice(&crc32c::crc32c(&seal).to_le_bytes());
            new.extend_from_slice(&seal);
            rewritten += 1;
        } else {
            new.extend_from_slice(&old[at..at + 8 + len]);
        }
        at += 8 + len;
    }
    assert_eq!(at, old.len(), "{} ends with a torn record", index.display());
    std::fs::write(index, new).unwrap_or_else(|e| panic!("write {}: {e}", index.display()));
    rewritten
}
