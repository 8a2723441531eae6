//! Prometheus metrics: the text exposition format ([`Exposition`]) and a minimal HTTP
//! endpoint serving it at `GET /metrics` ([`serve`]). The format is a few lines per metric,
//! so no client library: `# HELP`, `# TYPE`, then `name{label="value"} number`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A scrape's text, built one metric family at a time.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// A counter without labels (its name ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, "counter", help, &[(&[], value as f64)]);
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, "gauge", help, &[(&[], value)]);
    }

    /// A family of samples: each with its labels.
    pub fn family(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: &[(&[(&str, &str)], f64)],
    ) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            self.out.push_str(name);
            if !labels.is_empty() {
                self.out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
                }
                self.out.push('}');
            }
            let _ = writeln!(self.out, " {}", number(*value));
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Seconds since the Unix epoch of `t` (a timestamp gauge's value).
pub fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A scrape request must arrive within this, and its reply be taken within it: one slow
/// client holds the endpoint this long at most.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The request head read at most (a GET is a few hundred bytes).
const MAX_REQUEST: usize = 8 << 10;

/// Binds `addr` and serves `GET /metrics` with what `render` returns, one connection at a
/// time, on a thread of its own for the rest of the process. Returns the bound address.
pub fn serve(
    addr: &str,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let render = Arc::new(render);
    std::thread::Builder::new()
        .name("cascade-metrics".into())
        .spawn(move || {
            // A failed accept (a client that went away, no descriptors left) is that
            // client's problem; the endpoint goes on.
            for conn in listener.incoming().flatten() {
                let _ = answer(conn, &*render);
            }
        })?;
    Ok(bound)
}

fn answer(mut conn: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return reply(&mut conn, "431 Request Header Fields Too Large", "", false);
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let with_body = method != "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => reply(&mut conn, "200 OK", &render(), with_body),
        ("GET" | "HEAD", "/") => reply(
            &mut conn,
            "200 OK",
            "Cascade metrics: GET /metrics (Prometheus text format)\n",
            with_body,
        ),
        ("GET" | "HEAD", _) => reply(&mut conn, "404 Not Found", "not found\n", with_body),
        _ => reply(
            &mut conn,
            "405 Method Not Allowed",
            "only GET /metrics\n",
            true,
        ),
    }
}

fn reply(conn: &mut TcpStream, status: &str, body: &str, with_body: bool) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if with_body {
        out.push_str(body);
    }
    conn.write_all(out.as_bytes())?;
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_written_in_the_text_format() {
        let mut e = Exposition::new();
        e.counter("x_bytes_total", "Bytes.\nAll of them", 42);
        e.family(
            "x_info",
            "gauge",
            "Info.",
            &[(&[("a", "q\"b\\c"), ("b", "2")], 1.0)],
        );
        e.gauge("x_seconds", "Time.", 1.5);
        assert_eq!(
            e.finish(),
            "# HELP x_bytes_total Bytes.\\nAll of them\n# TYPE x_bytes_total counter\n\
             x_bytes_total 42\n# HELP x_info Info.\n# TYPE x_info gauge\n\
             x_info{a=\"q\\\"b\\\\c\",b=\"2\"} 1\n# HELP x_seconds Time.\n\
             # TYPE x_seconds gauge\nx_seconds 1.5\n"
        );
    }

    #[test]
    fn the_endpoint_answers_get_metrics_and_nothing_else() {
        let addr = serve("127.0.0.1:0", || "m 1\n".to_string()).expect("serve");
        let get = |request: &str| {
            let mut c = TcpStream::connect(addr).expect("connect");
            c.write_all(request.as_bytes()).expect("send");
            let mut out = String::new();
            c.read_to_string(&mut out).expect("reply");
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nm 1\n"), "{ok}");
        assert!(get("GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }
}
