//! Network shaping and the link under test: the tbf qdiscs bench/netns-s3.sh and
//! netns-staging.sh set up, TCP goodput through the shaped link, the host end's byte counter,
//! and the S3 server behind it.

use crate::util::{self, err, now_ns, size_str, Context, Res, Stats, MIB};
use cascade_durable::Spec;
use serde::Deserialize;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Deserialize)]
struct TcQdisc {
    kind: String,
    #[serde(default)]
    dev: Option<String>,
    #[serde(default)]
    options: serde_json::Value,
}

/// (rate bytes/s, "tbf 1000 Mbit/s, burst 250000 B, latency 50 ms") of the tbf qdisc on a
/// device (in a namespace when given).
pub(crate) fn tbf_of(netns: Option<&str>, dev: Option<&str>) -> Option<(f64, String)> {
    let mut c = Command::new("tc");
    if let Some(ns) = netns {
        c.args(["-n", ns]);
    }
    c.args(["-j", "qdisc", "show"]);
    if let Some(dev) = dev {
        c.args(["dev", dev]);
    }
    let out = c.stderr(Stdio::null()).output().ok()?;
    let qdiscs: Vec<TcQdisc> = serde_json::from_slice(&out.stdout).ok()?;
    let q = qdiscs.into_iter().find(|q| q.kind == "tbf")?;
    let o = &q.options;
    let rate = o.get("rate")?.as_f64()?;
    let burst = o.get("burst").and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let lat_us = o.get("lat").and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let on = q.dev.map(|d| format!(" on {d}")).unwrap_or_default();
    Some((
        rate,
        format!(
            "tbf{on}: rate {:.0} Mbit/s, burst {burst:.0} B, latency {:.0} ms",
            rate * 8.0 / 1e6,
            lat_us / 1e3
        ),
    ))
}

pub(crate) fn offloads_of(dev: &str) -> String {
    let Ok(out) = Command::new("ethtool").args(["-k", dev]).output() else {
        return "unknown (no ethtool)".into();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = Vec::new();
    for (key, short) in [
        ("tcp-segmentation-offload:", "tso"),
        ("generic-segmentation-offload:", "gso"),
        ("generic-receive-offload:", "gro"),
    ] {
        if let Some(line) = text.lines().find(|l| l.starts_with(key)) {
            let v = line[key.len()..].split_whitespace().next().unwrap_or("?");
            parts.push(format!("{short} {v}"));
        }
    }
    if parts.is_empty() {
        "unknown".into()
    } else {
        parts.join(", ")
    }
}

/// The S3 endpoint's address (the link test's receiver binds it inside the namespace).
pub(crate) fn endpoint_ip(url: &str) -> Res<IpAddr> {
    let Ok(Spec::S3(s3)) = Spec::parse(url) else {
        return err("the durable URL is not an s3:// URL");
    };
    let ep = s3.endpoint.unwrap_or_default();
    let hostport = ep
        .split("://")
        .nth(1)
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("");
    let with_port = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    with_port
        .to_socket_addrs()
        .ctx(|| format!("resolving the endpoint {ep}"))?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| util::BenchError(format!("endpoint {ep} has no address")))
}

/// One TCP transfer of `bytes` from this process (root namespace) to a receiver thread that
/// moved itself into `netns` (setns affects only the calling thread), bound to `ip`. The
/// clock runs from the connect until the receiver has acknowledged the byte count. Returns
/// the seconds.
pub(crate) fn linktest(netns: &str, ip: IpAddr, src: &[u8], bytes: u64) -> Res<f64> {
    let ns_path = format!("/run/netns/{netns}");
    let ns = std::fs::File::open(&ns_path).ctx(|| format!("opening {ns_path}"))?;
    let (tx, rx) = std::sync::mpsc::channel::<Res<u16>>();
    let receiver = std::thread::spawn(move || -> Res<u64> {
        // SAFETY: `ns` is an open network-namespace file owned by this closure; setns only
        // changes this thread's network namespace.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = tx.send(err(format!("setns into {ns_path}: {e}")));
            return Ok(0);
        }
        let listener = match TcpListener::bind((ip, 0)) {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(err(format!("binding {ip} in {ns_path}: {e}")));
                return Ok(0);
            }
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        listener.set_nonblocking(true).ctx(|| "listener")?;
        let _ = tx.send(Ok(port));
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut conn = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return err("link test: no connection within 15 s");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return err(format!("link test: accept: {e}")),
            }
        };
        conn.set_nonblocking(false).ctx(|| "link test socket")?;
        let mut buf = vec![0u8; MIB as usize];
        let mut n = 0u64;
        loop {
            match conn.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => n += k as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return err(format!("link test: receive: {e}")),
            }
        }
        conn.write_all(&n.to_le_bytes()).ctx(|| "link test: ack")?;
        Ok(n)
    });
    let port = rx
        .recv()
        .map_err(|_| util::BenchError("link test receiver died".into()))??;
    let addr = SocketAddr::new(ip, port);
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .ctx(|| format!("link test: connecting to {addr}"))?;
    let piece = (8 * MIB).min(src.len() as u64) as usize;
    let t0 = now_ns();
    let mut sent = 0u64;
    let mut off = 0usize;
    while sent < bytes {
        let k = ((bytes - sent) as usize).min(piece);
        if off + k > src.len() {
            off = 0;
        }
        s.write_all(&src[off..off + k]).ctx(|| "link test: send")?;
        off += k;
        sent += k as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .ctx(|| "link test: shutdown")?;
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack)
        .ctx(|| "link test: reading the ack")?;
    let t1 = now_ns();
    let got = receiver
        .join()
        .map_err(|_| util::BenchError("link test receiver panicked".into()))??;
    if got != bytes || u64::from_le_bytes(ack) != bytes {
        return err(format!(
            "link test: receiver counted {got} of {bytes} bytes"
        ));
    }
    Ok((t1 - t0) as f64 / 1e9)
}

/// TCP goodput through a shaped link, `reps` times ([`linktest`]), logged as it goes
/// (`label` names the link, "" for the only one): the statistics, and the error that cut the
/// series short, if any.
pub(crate) fn link_goodput(
    label: &str,
    netns: &str,
    ip: IpAddr,
    src: &[u8],
    bytes: u64,
    reps: usize,
) -> (Option<Stats>, Option<String>) {
    let label = if label.is_empty() {
        String::new()
    } else {
        format!(" {label}")
    };
    let mut samples = Vec::new();
    let mut error = None;
    for rep in 0..reps {
        crate::baselines::settle();
        match linktest(netns, ip, src, bytes) {
            Ok(s) => {
                let g = bytes as f64 / s;
                eprintln!(
                    "  link test{label} {}/{reps}: {} in {s:.3} s = {:.1} MB/s",
                    rep + 1,
                    size_str(bytes),
                    g / 1e6
                );
                samples.push(g);
            }
            Err(e) => {
                eprintln!("  link test{label} failed: {e}");
                error = Some(e.0);
                break;
            }
        }
    }
    ((!samples.is_empty()).then(|| Stats::of(&samples)), error)
}

/// Samples the bytes the host end of the link has sent (its tx_bytes counter, i.e. what tbf
/// let through) every 2 ms on a thread of its own, to tell when an upload's data was on the
/// wire and how long the rest took.
pub(crate) struct WireWatch {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(u64, u64)>>,
}

impl WireWatch {
    /// None when the device has no such counter (another URL than netns-s3.sh's).
    pub(crate) fn start(dev: &str) -> Option<WireWatch> {
        let path = format!("/sys/class/net/{dev}/statistics/tx_bytes");
        let read =
            move || -> Option<u64> { std::fs::read_to_string(&path).ok()?.trim().parse().ok() };
        read()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut v = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Some(b) = read() {
                    v.push((now_ns(), b));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if let Some(b) = read() {
                v.push((now_ns(), b));
            }
            v
        });
        Some(WireWatch { stop, handle })
    }

    /// (when the counter first rose by more than 64 KiB, when it reached 99 % of its whole
    /// rise), CLOCK_MONOTONIC ns; None if it hardly moved.
    pub(crate) fn finish(self) -> Option<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let v = self.handle.join().ok()?;
        let (first, last) = (v.first()?.1, v.last()?.1);
        let rise = last.saturating_sub(first);
        if rise < MIB {
            return None;
        }
        let start = v.iter().find(|x| x.1 - first > 64 * 1024)?.0;
        let end = v
            .iter()
            .find(|x| (x.1 - first) as f64 >= 0.99 * rise as f64)?
            .0;
        Some((start, end))
    }
}

/// CPU time (utime + stime, clock ticks) of the S3 server, from /run/cascade-s3.pid.
pub(crate) fn server_ticks() -> Option<u64> {
    let pid = std::fs::read_to_string("/run/cascade-s3.pid").ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    Some(f.get(11)? + f.get(12)?)
}

/// "versitygw, posix backend on ext4 on /dev/vda (...)" from the server's command line.
pub(crate) fn s3_server() -> String {
    let pid = std::fs::read_to_string("/run/cascade-s3.pid").unwrap_or_default();
    let pid = pid.trim();
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return "server not found (no /run/cascade-s3.pid)".into();
    };
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let exe = args.first().cloned().unwrap_or_default();
    let name = Path::new(&exe)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match args.iter().position(|a| a == "posix") {
        Some(i) if i + 1 < args.len() => {
            let dir = &args[i + 1];
            format!(
                "{name} pid {pid}, posix backend in {dir}: {}",
                util::fs_of(Path::new(dir))
            )
        }
        _ => format!("{name} pid {pid}"),
    }
}

pub(crate) fn tx_bytes(dev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A shaped link of a run: its tbf settings and its TCP goodput.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkInfo {
    pub name: String,
    pub nominal_bytes_per_s: Option<f64>,
    /// tc tbf of the host end and of the namespace end.
    pub out: String,
    pub back: String,
    pub offloads: String,
    pub linktest_bytes: u64,
    pub goodput: Option<Stats>,
    pub error: Option<String>,
}

/// The shaping and the TCP goodput (`bytes` per test, `reps` tests; none for 0 bytes) of the
/// link named `name` from this namespace to `netns` (at `ip`), whose host end is `dev`.
pub(crate) fn measure_link(
    name: &str,
    netns: &str,
    dev: &str,
    ip: Result<IpAddr, String>,
    src: &[u8],
    bytes: u64,
    reps: usize,
) -> LinkInfo {
    let out = tbf_of(None, Some(dev));
    let back = tbf_of(Some(netns), None);
    let mut link = LinkInfo {
        name: name.to_string(),
        nominal_bytes_per_s: out.as_ref().map(|u| u.0),
        out: out.map_or_else(|| format!("no tbf on {dev}"), |u| u.1),
        back: back.map_or_else(|| format!("no tbf in namespace {netns}"), |d| d.1),
        offloads: offloads_of(dev),
        linktest_bytes: bytes,
        goodput: None,
        error: None,
    };
    match ip {
        _ if bytes == 0 => {}
        Ok(ip) => (link.goodput, link.error) = link_goodput(name, netns, ip, src, bytes, reps),
        Err(e) => link.error = Some(e),
    }
    link
}

/// The table of the links of a run: shaping, offloads and TCP goodput (one connection, from
/// connect until the receiver acknowledged the last byte).
pub(crate) fn links_table(links: &[LinkInfo]) -> crate::report::Table {
    let bytes = links.first().map_or(0, |l| l.linktest_bytes);
    let head = format!("link | nominal | host end | namespace end | offloads (host end) | TCP goodput, one connection ({} per test)", size_str(bytes));
    let mut t = crate::report::Table::new("Links", &head);
    for l in links {
        let good = match (&l.goodput, &l.error) {
            (Some(g), _) => {
                let pct = l.nominal_bytes_per_s.map_or_else(String::new, |n| {
                    format!(" ({:.1} % of nominal)", 100.0 * g.median / n)
                });
                let (med, min, max) = (g.median / 1e6, g.min / 1e6, g.max / 1e6);
                format!("{med:.1} [{min:.1}–{max:.1}] MB/s{pct}")
            }
            (None, Some(e)) => format!("failed: {e}"),
            (None, None) => "not measured".into(),
        };
        let nominal = l.nominal_bytes_per_s.map_or_else(
            || "unknown".into(),
            |n| format!("{:.0} Mbit/s", n * 8.0 / 1e6),
        );
        t.row([&l.name, &nominal, &l.out, &l.back, &l.offloads, &good]);
    }
    t
}
