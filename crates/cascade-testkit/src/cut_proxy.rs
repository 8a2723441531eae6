//! A TCP proxy on 127.0.0.1 in front of an HTTP/1.1 server that, once armed, cuts every PUT
//! (or the next one) whose request line names a given key part-way through its body: it
//! forwards the head and the first bytes of the body, then closes both connections, as the
//! kernel does when the client is killed mid-upload. Tests of "a PUT cut short never replaces an object" use it
//! in front of a real S3 server ([`crate::Versitygw`]).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What an armed proxy cuts: PUTs whose request line contains `key`, after `after` bytes of
/// their body.
#[derive(Clone)]
struct Cut {
    key: String,
    after: usize,
    /// Disarmed after its first cut.
    once: bool,
}

/// The proxy; its accept thread ends with the process (tests are short-lived).
pub struct CuttingProxy {
    /// The port to connect to instead of the server's.
    pub port: u16,
    cut: Arc<Mutex<Option<Cut>>>,
    cuts: Arc<AtomicUsize>,
    put_heads: Arc<Mutex<Vec<String>>>,
}

impl CuttingProxy {
    /// A proxy forwarding to `127.0.0.1:upstream`, not cutting anything yet.
    pub fn start(upstream: u16) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(Mutex::new(None));
        let cuts = Arc::new(AtomicUsize::new(0));
        let put_heads = Arc::new(Mutex::new(Vec::new()));
        let (rule, count, heads) = (Arc::clone(&cut), Arc::clone(&cuts), Arc::clone(&put_heads));
        let server = SocketAddr::from(([127, 0, 0, 1], upstream));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(server) else {
                    continue;
                };
                let (rule, count, heads) =
                    (Arc::clone(&rule), Arc::clone(&count), Arc::clone(&heads));
                std::thread::spawn(move || forward(client, server, &rule, &count, &heads));
            }
        });
        CuttingProxy {
            port,
            cut,
            cuts,
            put_heads,
        }
    }

    /// From now on, cut PUTs of `key` after `after` bytes of body.
    pub fn cut_puts(&self, key: &str, after: usize) {
        self.arm(key, after, false);
    }

    /// Cuts the next PUT of `key` after `after` bytes of body, and no other.
    pub fn cut_next_put(&self, key: &str, after: usize) {
        self.arm(key, after, true);
    }

    fn arm(&self, key: &str, after: usize, once: bool) {
        *self.cut.lock().expect("proxy rule") = Some(Cut {
            key: key.to_string(),
            after,
            once,
        });
    }

    /// The heads (request line and headers) of the PUTs forwarded so far.
    pub fn put_heads(&self) -> Vec<String> {
        self.put_heads.lock().expect("proxy heads").clone()
    }

    /// How many requests it has cut so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// Copies `client` to `server` request by request (head, then Content-Length bytes of body),
/// and `server` to `client` on a thread of its own, until either side closes or a cut.
fn forward(
    mut client: TcpStream,
    mut server: TcpStream,
    rule: &Mutex<Option<Cut>>,
    cuts: &AtomicUsize,
    put_heads: &Mutex<Vec<String>>,
) {
    let (Ok(mut from_server), Ok(mut to_client)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Write);
    });
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // The head of the next request.
        let head_end = loop {
            if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !read_more(&mut client, &mut buf, &mut pending) {
                let _ = server.shutdown(Shutdown::Write);
                return;
            }
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).to_string();
        let body_len = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let request_line = head.lines().next().unwrap_or("");
        if request_line.starts_with("PUT ") {
            put_heads.lock().expect("proxy heads").push(head.clone());
        }
        let cut_after = {
            let mut rule = rule.lock().expect("proxy rule");
            let hit = rule
                .as_ref()
                .filter(|c| request_line.starts_with("PUT ") && request_line.contains(&c.key))
                .map(|c| (c.after.min(body_len), c.once));
            if hit.is_some_and(|(_, once)| once) {
                *rule = None;
            }
            hit.map(|(after, _)| after)
        };
        let mut to_send = head_end + cut_after.unwrap_or(body_len);
        // Forward the head and the body (or its part before the cut).
        while to_send > 0 {
            if pending.is_empty() && !read_more(&mut client, &mut buf, &mut pending) {
                let _ = server.shutdown(Shutdown::Write);
                return;
            }
            let n = to_send.min(pending.len());
            if server.write_all(&pending[..n]).is_err() {
                return;
            }
            pending.drain(..n);
            to_send -= n;
        }
        if cut_after.is_some() {
            cuts.fetch_add(1, Ordering::SeqCst);
            let _ = server.shutdown(Shutdown::Both);
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Appends what `client` sends next to `pending`; false once it closed or failed.
fn read_more(client: &mut TcpStream, buf: &mut [u8], pending: &mut Vec<u8>) -> bool {
    match client.read(buf) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            pending.extend_from_slice(&buf[..n]);
            true
        }
    }
}
