//! `cascade-bench durable`: the checkpoint time an application perceives with Cascade against
//! writing straight to the durable store, with the durable store behind a throttled link
//! (bench/netns-s3.sh: versitygw in a network namespace, veth shaped with `tc tbf` to
//! 1 Gbit/s each way). Writes durable.md and durable.json. See bench/README.md.
//!
//! Per checkpoint size and repetition, with the same bytes (a non-zero xorshift pattern in a
//! /dev/shm file that every method reads), the methods in turn (which one goes first rotates
//! with the repetition), each after `sync` and a wait for an idle machine:
//! - direct-s3: `DurableStore::upload_checkpoint` of the checkpoint (data, checksum object,
//!   marker) into the throttled S3 store: the stall of an application that writes to S3.
//! - direct-dir: write(2) in 8 MiB pieces into a new file on local disk, fsync, close.
//! - cascade: a small C program (`WRITER_C`, compiled with cc at the start) under `cascade
//!   run` writes the file into the node store with write(2) in 8 MiB pieces, closes it and
//!   commits it, with `cascade commit` (a new process) or with `cascade_commit()` of the
//!   preloaded library (`--commit`); its own elapsed time is the stall. The node agent
//!   (`cascade agent --durable URL`, started by the bench for the whole run, so `cascade run`
//!   embeds none) drains it to the same S3 store; `cascade wait --level durable` returns once
//!   the completion marker is written: time until durable (from the writer's start). Each
//!   checkpoint is removed from the store and from S3 afterwards.
//! - link minimum: bytes / nominal rate (tc tbf) and bytes / TCP goodput measured over the same
//!   link in this run (a sender here, a receiver thread moved into the namespace with setns).
//! - where the time goes: the host end's tx_bytes counter, sampled every 2 ms during the
//!   uploads, tells when the data was on the wire and how long the server took after it.

use crate::report::{machine_table, utc_string};
use crate::util::{
    self, err, fill_pattern, gbps, now_ns, prefix, size_str, Context, Interference, Machine, Res,
    Stats, MIB,
};
use cascade_durable::{DurableStore, Spec, UploadItem};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Target: time until durable within this factor of the link's physical minimum.
const TARGET_RATIO: f64 = 1.2;

#[derive(clap::Args)]
pub struct DurableArgs {
    /// Directory for durable.md and durable.json.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Quick run: one 64 MiB checkpoint, 1 repetition, 64 MiB link test. Explicit flags
    /// override.
    #[arg(long)]
    quick: bool,
    /// Checkpoint sizes in MiB [default: 256,1024; --quick: 64].
    #[arg(long, value_delimiter = ',')]
    sizes_mib: Option<Vec<u64>>,
    /// Repetitions of each measurement; tables show the median [default: 3; --quick: 1].
    #[arg(long)]
    reps: Option<usize>,
    /// The throttled durable store (`bench/netns-s3.sh up` prints it; `env` exports it).
    #[arg(long, env = "CASCADE_BENCH_S3_URL", hide_env_values = true)]
    url: Option<String>,
    /// Network namespace of the S3 server (for the link test).
    #[arg(long, env = "CASCADE_BENCH_NETNS", default_value = "cascade-s3")]
    netns: String,
    /// Host end of the shaped link, whose tbf rate is the nominal rate.
    #[arg(long, env = "CASCADE_BENCH_LINK_DEV", default_value = "cs3-host")]
    link_dev: String,
    /// MiB per TCP goodput test over the link; 0 skips it [default: 256; --quick: 64].
    #[arg(long)]
    linktest_mib: Option<u64>,
    /// Directory on local disk for the direct-dir baseline.
    #[arg(long, default_value = "/var/tmp")]
    disk_dir: PathBuf,
    /// The cascade CLI (its libcascade.so next to it).
    #[arg(long, default_value = "target/release/cascade")]
    cascade: PathBuf,
    /// The C compiler for the checkpoint writer.
    #[arg(long, default_value = "cc")]
    cc: String,
    /// Name of the node store the cascade runs use (created and destroyed by the run).
    #[arg(long, default_value = "/cascade-bench-durable")]
    store: String,
    /// Mount prefix of the store under `cascade run`.
    #[arg(long, default_value = "/cascade")]
    mount: String,
    /// Seconds `cascade wait --level durable` may take.
    #[arg(long, default_value_t = 900)]
    wait_timeout: u64,
    /// Bytes per write(2) call of the writers, in MiB.
    #[arg(long, default_value_t = 8)]
    piece_mib: u64,
    /// How the cascade writer commits: `cascade commit` (cli) and/or cascade_commit() of the
    /// preloaded library (lib); each is a cascade run of its own.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cli,lib")]
    commit: Vec<Commit>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DOpts {
    #[serde(skip)]
    pub pid: u32,
    /// The durable URL with its credentials: never written out.
    #[serde(skip)]
    pub url: String,
    /// The durable store without credentials.
    pub durable: String,
    pub sizes: Vec<u64>,
    pub reps: usize,
    pub netns: String,
    pub link_dev: String,
    pub linktest_bytes: u64,
    pub disk_dir: PathBuf,
    pub cascade: PathBuf,
    pub cc: String,
    pub store: String,
    pub mount: String,
    /// Memory of the node store: the largest checkpoint plus 256 MiB (each checkpoint is
    /// removed once durable); no spill file.
    pub capacity: u64,
    pub wait_timeout_s: u64,
    pub piece: u64,
    pub commit: Vec<Commit>,
}

fn build_opts(a: &DurableArgs, pid: u32) -> Res<DOpts> {
    let q = a.quick;
    let sizes: Vec<u64> = a
        .sizes_mib
        .clone()
        .unwrap_or_else(|| if q { vec![64] } else { vec![256, 1024] })
        .into_iter()
        .map(|m| m * MIB)
        .collect();
    if sizes.is_empty() || sizes.contains(&0) {
        return err("--sizes-mib needs positive sizes");
    }
    if a.piece_mib == 0 {
        return err("--piece-mib must be positive");
    }
    if !a.mount.starts_with('/') || a.mount.len() < 2 {
        return err("--mount must be an absolute path other than /");
    }
    let Some(url) = a.url.clone().filter(|u| !u.is_empty()) else {
        return err(
            "no durable store: run `bench/netns-s3.sh up` and `eval \"$(bench/netns-s3.sh env)\"` \
             (sets CASCADE_BENCH_S3_URL), or pass --url (bench/run.sh --suite durable does both)",
        );
    };
    let spec = Spec::parse(&url).ctx(|| "--url")?;
    let max = sizes.iter().copied().max().unwrap_or(0);
    Ok(DOpts {
        pid,
        durable: spec.describe(),
        url,
        sizes,
        reps: a.reps.unwrap_or(if q { 1 } else { 3 }).max(1),
        netns: a.netns.clone(),
        link_dev: a.link_dev.clone(),
        linktest_bytes: a.linktest_mib.unwrap_or(if q { 64 } else { 256 }) * MIB,
        disk_dir: a.disk_dir.clone(),
        cascade: a.cascade.clone(),
        cc: a.cc.clone(),
        store: a.store.clone(),
        mount: a.mount.trim_end_matches('/').to_string(),
        capacity: max + 256 * MIB,
        wait_timeout_s: a.wait_timeout,
        piece: a.piece_mib * MIB,
        commit: a.commit.clone(),
    })
}

/// How the writer commits its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Commit {
    /// Runs `cascade commit /ckptNNN` (a new process that attaches the store).
    Cli,
    /// Calls `cascade_commit()` of the preloaded library in the writer's process.
    Lib,
}

impl Commit {
    fn arg(self) -> &'static str {
        match self {
            Commit::Cli => "cli",
            Commit::Lib => "lib",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The link: its configuration (tc, ethtool) and a TCP goodput test through it.

#[derive(Debug, Clone, Serialize)]
pub struct Link {
    /// tbf rate on the host end (bytes/s), None when the device has no tbf qdisc.
    pub nominal_bytes_per_s: Option<f64>,
    /// The qdisc on the host end (host -> S3, the upload direction).
    pub upload: String,
    /// The qdisc inside the namespace (S3 -> host).
    pub download: String,
    /// Segmentation offloads of the host end.
    pub offloads: String,
    pub linktest_bytes: u64,
    /// TCP goodput host -> namespace, bytes/s, one sample per repetition.
    pub goodput: Option<Stats>,
    pub linktest_error: Option<String>,
}

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

fn measure_link(o: &DOpts, src: &[u8]) -> Link {
    let up = tbf_of(None, Some(&o.link_dev));
    let down = tbf_of(Some(&o.netns), None);
    let mut link = Link {
        nominal_bytes_per_s: up.as_ref().map(|u| u.0),
        upload: up.map_or_else(|| format!("no tbf on {}", o.link_dev), |u| u.1),
        download: down.map_or_else(|| format!("no tbf in namespace {}", o.netns), |d| d.1),
        offloads: offloads_of(&o.link_dev),
        linktest_bytes: o.linktest_bytes,
        goodput: None,
        linktest_error: None,
    };
    if o.linktest_bytes == 0 {
        return link;
    }
    let ip = match endpoint_ip(&o.url) {
        Ok(ip) => ip,
        Err(e) => {
            link.linktest_error = Some(e.0);
            return link;
        }
    };
    (link.goodput, link.linktest_error) =
        link_goodput("", &o.netns, ip, src, o.linktest_bytes, o.reps);
    link
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
        settle();
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

// ---------------------------------------------------------------------------------------------
// The measurements.

/// Before every measurement: flush dirty pages (the S3 server and the disk baseline leave up
/// to a GiB of them) and wait for an idle machine.
pub(crate) fn settle() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
    util::settle();
}

/// Removes every object under `ckpt/` in the durable store.
pub(crate) fn clear_remote(store: &DurableStore, ckpt: &str) -> Res<()> {
    for obj in store.list(ckpt).ctx(|| format!("listing {ckpt}/"))? {
        store
            .delete(&obj.path)
            .ctx(|| format!("deleting {}", obj.path))?;
    }
    Ok(())
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

/// One direct-s3 upload, in seconds: the whole call, and when 99 % of the bytes the link
/// carried during it had gone through (None without a counter).
pub(crate) fn direct_s3(
    store: &DurableStore,
    data: &[u8],
    ckpt: &str,
    dev: &str,
) -> Res<(f64, Option<f64>)> {
    clear_remote(store, ckpt)?;
    settle();
    let watch = WireWatch::start(dev);
    let t0 = now_ns();
    let r = store
        .upload_checkpoint(ckpt, vec![UploadItem::from_bytes("data.bin", data)])
        .ctx(|| format!("direct-s3: uploading {ckpt}"));
    let t1 = now_ns();
    let wire = watch.and_then(|w| w.finish());
    r?;
    clear_remote(store, ckpt)?;
    Ok((
        (t1 - t0) as f64 / 1e9,
        wire.map(|(_, end)| end.saturating_sub(t0) as f64 / 1e9),
    ))
}

/// (write seconds, write + fsync + close seconds).
pub(crate) fn direct_dir(dir: &Path, data: &[u8], piece: usize) -> Res<(f64, f64)> {
    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
    let path = dir.join("data.bin");
    let _ = std::fs::remove_file(&path);
    settle();
    let t0 = now_ns();
    let mut f = std::fs::File::create(&path).ctx(|| format!("creating {}", path.display()))?;
    for p in data.chunks(piece) {
        f.write_all(p)
            .ctx(|| format!("writing {}", path.display()))?;
    }
    let t1 = now_ns();
    f.sync_all()
        .ctx(|| format!("fsync of {}", path.display()))?;
    drop(f);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("fsync of {}", dir.display()))?;
    let t2 = now_ns();
    std::fs::remove_file(&path).ctx(|| format!("removing {}", path.display()))?;
    Ok(((t1 - t0) as f64 / 1e9, (t2 - t0) as f64 / 1e9))
}

/// The checkpoint writer run under `cascade run` (compiled with cc at the start of the run).
pub(crate) const WRITER_C: &str = r#"
/* ckptwriter PATH SIZE PIECE DATAFILE cli|lib CASCADE CKPT
 * Writes SIZE bytes of DATAFILE (mapped and pre-faulted before the clock starts) to PATH
 * (creating its directory) with write(2) in PIECE-byte calls and closes it. Then commits the
 * checkpoint: "cli" runs `CASCADE commit CKPT` (fork + exec, waits for it); "lib" calls
 * cascade_commit(dirname(PATH)) of the preloaded libcascade.so (include/cascade.h) in this
 * process. Prints one JSON line with CLOCK_MONOTONIC times: start (before mkdir/open),
 * written (after close), committed, and the CLOCK_REALTIME start. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *arg) {
    fprintf(stderr, "ckptwriter: %s %s: %s\n", what, arg, strerror(errno));
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 8 || (strcmp(argv[5], "cli") != 0 && strcmp(argv[5], "lib") != 0)) {
        fprintf(stderr, "usage: ckptwriter PATH SIZE PIECE DATAFILE cli|lib CASCADE CKPT\n");
        return 2;
    }
    const char *path = argv[1], *datafile = argv[4], *cascade = argv[6], *ckpt = argv[7];
    int lib = strcmp(argv[5], "lib") == 0;
    size_t size = strtoull(argv[2], NULL, 10), piece = strtoull(argv[3], NULL, 10);
    int (*commit)(const char *) = NULL;
    const char *(*why)(void) = NULL;
    if (lib) {
        commit = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cascade_commit");
        why = (const char *(*)(void))dlsym(RTLD_DEFAULT, "cascade_strerror_last");
        if (!commit) {
            fprintf(stderr, "ckptwriter: no cascade_commit (libcascade.so not preloaded?)\n");
            return 1;
        }
    }
    int dfd = open(datafile, O_RDONLY);
    if (dfd < 0) die("open", datafile);
    const unsigned char *data = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, dfd, 0);
    if (data == MAP_FAILED) die("mmap", datafile);
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < size; i += 4096) sink ^= data[i];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;

    uint64_t start = ns(CLOCK_MONOTONIC), start_unix = ns(CLOCK_REALTIME);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open", path);
    size_t done = 0;
    while (done < size) {
        size_t want = size - done < piece ? size - done : piece;
        ssize_t k = write(fd, data + done, want);
        if (k < 0) {
            if (errno == EINTR) continue;
            die("write", path);
        }
        done += (size_t)k;
    }
    if (close(fd) != 0) die("close", path);
    uint64_t written = ns(CLOCK_MONOTONIC);
    if (lib) {
        if (commit(dir) != 0) {
            fprintf(stderr, "ckptwriter: cascade_commit(%s): %s\n", dir,
                    why ? why() : strerror(errno));
            return 1;
        }
    } else {
        pid_t pid = fork();
        if (pid < 0) die("fork", "");
        if (pid == 0) {
            execl(cascade, cascade, "commit", ckpt, (char *)NULL);
            fprintf(stderr, "ckptwriter: exec %s: %s\n", cascade, strerror(errno));
            _exit(127);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR) die("waitpid", "");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "ckptwriter: %s commit %s failed (status %d)\n", cascade, ckpt, st);
            return 1;
        }
    }
    uint64_t committed = ns(CLOCK_MONOTONIC);
    printf("{\"start_ns\":%llu,\"written_ns\":%llu,\"committed_ns\":%llu,\"start_unix_ns\":%llu}\n",
           (unsigned long long)start, (unsigned long long)written,
           (unsigned long long)committed, (unsigned long long)start_unix);
    return sink == 256;
}
"#;

#[derive(Deserialize)]
pub(crate) struct WriterOut {
    pub(crate) start_ns: u64,
    pub(crate) written_ns: u64,
    pub(crate) committed_ns: u64,
    pub(crate) start_unix_ns: u64,
}

/// One cascade measurement, in seconds.
#[derive(Debug, Clone, Copy)]
struct CascadeSample {
    stall: f64,
    write: f64,
    commit: f64,
    until_durable: f64,
    until_marker: Option<f64>,
    /// When the upload's data started and finished going over the link (WireWatch), from
    /// the start of the write.
    wire_start: Option<f64>,
    wire_end: Option<f64>,
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

pub(crate) fn one_line(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(3)..].join(" | ")
}

/// The Cascade side: node store, node agent, writer program. Stops the agent and destroys the
/// store when dropped.
struct Cascade {
    bin: PathBuf,
    store: String,
    capacity: u64,
    mount: String,
    url: String,
    writer: PathBuf,
    datafile: PathBuf,
    piece: u64,
    wait_timeout_s: u64,
    agent: Option<Child>,
    agent_log: PathBuf,
    link_dev: String,
    initialized: bool,
}

impl Cascade {
    /// Why the cascade runs cannot happen with this CLI, or None.
    fn unavailable(bin: &Path) -> Option<String> {
        if !bin.is_file() {
            return Some(format!(
                "{} does not exist (cargo build --release -p cascade-cli)",
                bin.display()
            ));
        }
        let missing: Vec<&str> = ["agent", "commit", "wait"]
            .into_iter()
            .filter(|sub| {
                !Command::new(bin)
                    .args([sub, "--help"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "{} has no `{}` yet (`cascade {} --help` fails)",
                bin.display(),
                missing.join("`, `"),
                missing[0]
            )
        })
    }

    /// A cascade command with this run's settings and no others: CASCADE_* variables of the
    /// caller (a CASCADE_FLUSH_EVERY, another CASCADE_DURABLE) would change what is measured.
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CASCADE_") {
                c.env_remove(key);
            }
        }
        c.env("CASCADE_STORE", &self.store)
            .env("CASCADE_DURABLE", &self.url)
            .env("CASCADE_CAPACITY", self.capacity.to_string())
            .env("CASCADE_SPILL_SIZE", "0")
            .env("CASCADE_MOUNT", &self.mount)
            .env_remove("LD_PRELOAD");
        c
    }

    fn run_ok(&self, args: &[&str]) -> Res<String> {
        let out = self
            .cmd()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ctx(|| format!("running {} {}", self.bin.display(), args.join(" ")))?;
        if !out.status.success() {
            return err(format!(
                "cascade {} failed ({}): {}",
                args.join(" "),
                out.status,
                one_line(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn start(o: &DOpts, datafile: &Path) -> Res<Cascade> {
        let base = Path::new("/var/tmp").join(format!("{}-ckptwriter", prefix(o.pid)));
        let src = base.with_extension("c");
        std::fs::write(&src, WRITER_C).ctx(|| format!("writing {}", src.display()))?;
        let out = Command::new(&o.cc)
            .args(["-O2", "-Wall", "-o"])
            .arg(&base)
            .arg(&src)
            .arg("-ldl")
            .output()
            .ctx(|| format!("running {}", o.cc))?;
        let _ = std::fs::remove_file(&src);
        if !out.status.success() {
            return err(format!(
                "{} -O2 ckptwriter.c failed: {}",
                o.cc,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Private copies of the CLI and the library beside it (where `cascade run` looks for
        // it): a rebuild of the workspace during the run must not swap them.
        let bin_dir = Path::new("/var/tmp").join(format!("{}-bin", prefix(o.pid)));
        std::fs::create_dir_all(&bin_dir).ctx(|| format!("creating {}", bin_dir.display()))?;
        let bin = bin_dir.join("cascade");
        std::fs::copy(&o.cascade, &bin)
            .ctx(|| format!("copying {} to {}", o.cascade.display(), bin.display()))?;
        let lib = o.cascade.with_file_name("libcascade.so");
        if lib.is_file() {
            std::fs::copy(&lib, bin_dir.join("libcascade.so"))
                .ctx(|| format!("copying {}", lib.display()))?;
        }
        let mut c = Cascade {
            bin,
            store: o.store.clone(),
            capacity: o.capacity,
            mount: o.mount.clone(),
            url: o.url.clone(),
            writer: base,
            datafile: datafile.to_path_buf(),
            piece: o.piece,
            wait_timeout_s: o.wait_timeout_s,
            agent: None,
            agent_log: Path::new("/var/tmp").join(format!("{}-agent.log", prefix(o.pid))),
            link_dev: o.link_dev.clone(),
            initialized: false,
        };
        // A store of that name left by an interrupted run goes first.
        let _ = c.run_ok(&["destroy", "--force"]);
        c.run_ok(&["init"])?;
        c.initialized = true;
        let log = std::fs::File::create(&c.agent_log)
            .ctx(|| format!("creating {}", c.agent_log.display()))?;
        let log2 = log.try_clone().ctx(|| "agent log")?;
        let mut cmd = c.cmd();
        cmd.args(["agent", "--verbose", "--durable", &c.url])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: prctl is async-signal-safe; the agent gets SIGTERM if the bench dies, so an
        // interrupted run does not leave it running.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        c.agent = Some(cmd.spawn().ctx(|| "starting cascade agent")?);
        std::thread::sleep(Duration::from_millis(500));
        c.check_agent()?;
        Ok(c)
    }

    fn check_agent(&mut self) -> Res<()> {
        if let Some(a) = self.agent.as_mut() {
            if let Ok(Some(status)) = a.try_wait() {
                self.agent = None;
                return err(format!(
                    "cascade agent exited ({status}): {}",
                    tail(&self.agent_log, 5)
                ));
            }
        }
        Ok(())
    }

    /// One checkpoint: write + commit under `cascade run`, then `cascade wait` until durable.
    fn measure(
        &mut self,
        durable: &DurableStore,
        size: u64,
        n: usize,
        via: Commit,
    ) -> Res<CascadeSample> {
        self.check_agent()?;
        let name = format!("ckpt{n:03}");
        let store_path = format!("/{name}");
        clear_remote(durable, &name)?;
        settle();
        let file = format!("{}/{name}/data.bin", self.mount);
        let watch = WireWatch::start(&self.link_dev);
        let out = self
            .cmd()
            .arg("run")
            .arg("--")
            .arg(&self.writer)
            .arg(&file)
            .arg(size.to_string())
            .arg(self.piece.to_string())
            .arg(&self.datafile)
            .arg(via.arg())
            .arg(&self.bin)
            .arg(&store_path)
            .stdin(Stdio::null())
            .output()
            .ctx(|| "running cascade run -- ckptwriter")?;
        if !out.status.success() {
            return err(format!(
                "cascade run -- ckptwriter {file} failed ({}): {}",
                out.status,
                one_line(&out.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let w: WriterOut = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| {
                util::BenchError(format!("ckptwriter printed no timing line: {stdout:?}"))
            })?;
        let durable_at = self.wait_durable(&store_path);
        let wire = watch.and_then(|w| w.finish());
        let durable_at = durable_at?;
        let until_marker = durable
            .read_marker(&name)
            .ok()
            .flatten()
            .map(|m| (m.completed_unix_ns as f64 - w.start_unix_ns as f64) / 1e9);
        if until_marker.is_none() {
            eprintln!("  note: no completion marker at {name}/ after cascade wait returned");
        }
        if let Err(e) = self.run_ok(&["rm", "-r", &store_path]) {
            eprintln!("  warning: {e}");
        }
        clear_remote(durable, &name)?;
        Ok(CascadeSample {
            stall: (w.committed_ns - w.start_ns) as f64 / 1e9,
            write: (w.written_ns - w.start_ns) as f64 / 1e9,
            commit: (w.committed_ns - w.written_ns) as f64 / 1e9,
            until_durable: (durable_at - w.start_ns) as f64 / 1e9,
            until_marker,
            wire_start: wire.map(|(a, _)| (a as f64 - w.start_ns as f64) / 1e9),
            wire_end: wire.map(|(_, b)| (b as f64 - w.start_ns as f64) / 1e9),
        })
    }

    /// Runs `cascade wait PATH --level durable` and returns when it returned (CLOCK_MONOTONIC),
    /// failing early if the agent exits meanwhile.
    fn wait_durable(&mut self, store_path: &str) -> Res<u64> {
        let timeout = self.wait_timeout_s.to_string();
        let args = [
            "wait",
            store_path,
            "--level",
            "durable",
            "--timeout",
            &timeout,
        ];
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ctx(|| format!("running cascade {}", args.join(" ")))?;
        loop {
            if let Some(status) = child.try_wait().ctx(|| "waiting for cascade wait")? {
                let at = now_ns();
                if !status.success() {
                    let mut text = Vec::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_end(&mut text);
                    }
                    return err(format!(
                        "cascade {} failed ({status}): {}; agent log: {}",
                        args.join(" "),
                        one_line(&text),
                        tail(&self.agent_log, 3)
                    ));
                }
                return Ok(at);
            }
            if let Err(e) = self.check_agent() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
            // Polling `cascade wait` itself every millisecond costs nothing measurable and
            // adds at most a millisecond to the time until durable.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stop(&mut self) -> Res<()> {
        let mut result = Ok(());
        if let Some(mut a) = self.agent.take() {
            // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
            unsafe { libc::kill(a.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match a.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = a.kill();
                        let _ = a.wait();
                        result = err("cascade agent did not exit within 30 s of SIGTERM");
                        break;
                    }
                }
            }
        }
        if self.initialized {
            self.initialized = false;
            self.run_ok(&["destroy", "--force"])?;
        }
        result
    }
}

impl Drop for Cascade {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("cascade cleanup: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results and report.

#[derive(Debug, Clone, Serialize)]
pub struct CascadeRow {
    pub commit_via: Commit,
    /// write + close + commit, as the writer timed it.
    pub stall_s: Stats,
    pub write_s: Stats,
    pub commit_s: Stats,
    /// From the start of the write until `cascade wait --level durable` returned.
    pub until_durable_s: Stats,
    /// From the start of the write until the marker's own timestamp (completed_unix_ns).
    pub until_marker_s: Option<Stats>,
    /// From the start of the write until the upload's data started (first 64 KiB) and
    /// finished (99 % of the bytes) going over the link.
    pub wire_start_s: Option<Stats>,
    pub wire_end_s: Option<Stats>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeRow {
    pub bytes: u64,
    pub direct_s3_s: Stats,
    /// When 99 % of the bytes of the direct-s3 upload had gone over the link.
    pub direct_s3_wire_s: Option<Stats>,
    /// write(2) + fsync + close.
    pub direct_dir_s: Stats,
    /// write(2) only.
    pub direct_dir_write_s: Stats,
    /// One row per commit variant measured.
    pub cascade: Vec<CascadeRow>,
    pub link_min_nominal_s: Option<f64>,
    pub link_min_measured_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CascadeStatus {
    /// "measured", "not available" or "failed".
    pub state: String,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct DResults {
    pub link: Link,
    pub cascade: CascadeStatus,
    pub sizes: Vec<SizeRow>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    pub generated_utc: String,
    pub duration_s: f64,
    pub command: String,
    pub source: String,
    pub s3_server: String,
    /// The cascade CLI and the preload library measured (copied at the start of the run).
    pub cascade_cli: String,
    pub library: String,
    /// CPU the S3 server used during the run, % of all cores (not counted as interference).
    pub s3_server_cpu_pct: f64,
    pub machine: &'a Machine,
    pub interference: Interference,
    pub options: &'a DOpts,
    pub results: &'a DResults,
}

#[derive(Default)]
struct Samples {
    s3: Vec<f64>,
    s3_wire: Vec<f64>,
    dir: Vec<f64>,
    dir_write: Vec<f64>,
    cascade: Vec<(Commit, CascadeSample)>,
}

#[derive(Clone, Copy)]
enum Method {
    S3,
    Dir,
    Cascade(Commit),
}

fn run_all(o: &DOpts, data: &[u8], datafile: &Path) -> Res<DResults> {
    eprintln!("link: measuring TCP goodput host -> {}", o.netns);
    let link = measure_link(o, data);
    let durable = DurableStore::open(&o.url).ctx(|| "opening the durable store")?;
    let mut status = CascadeStatus {
        state: "measured".into(),
        detail: String::new(),
    };
    let mut cascade = match Cascade::unavailable(&o.cascade) {
        Some(why) => {
            eprintln!("cascade: not available: {why}; measuring the baselines only");
            status = CascadeStatus {
                state: "not available".into(),
                detail: why,
            };
            None
        }
        None => match Cascade::start(o, datafile) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("cascade: failed to start: {e}");
                status = CascadeStatus {
                    state: "failed".into(),
                    detail: e.0,
                };
                None
            }
        },
    };
    let dir = o.disk_dir.join(format!("{}-direct", prefix(o.pid)));
    let mut samples: Vec<Samples> = o.sizes.iter().map(|_| Samples::default()).collect();
    let mut n = 0usize;
    let mut methods = vec![Method::S3, Method::Dir];
    methods.extend(o.commit.iter().map(|&c| Method::Cascade(c)));
    for rep in 0..o.reps {
        for (si, &size) in o.sizes.iter().enumerate() {
            let bytes = &data[..size as usize];
            for k in 0..methods.len() {
                match methods[(rep + k) % methods.len()] {
                    Method::S3 => {
                        let name = format!("{}-direct-{}", prefix(o.pid), size / MIB);
                        let (s, wire) = direct_s3(&durable, bytes, &name, &o.link_dev)?;
                        samples[si].s3_wire.extend(wire);
                        eprintln!(
                            "  rep {}/{} {}: direct-s3 {s:.2} s ({:.3} GB/s)",
                            rep + 1,
                            o.reps,
                            size_str(size),
                            gbps(size, (s * 1e9) as u64)
                        );
                        samples[si].s3.push(s);
                    }
                    Method::Dir => {
                        let (w, s) = direct_dir(&dir, bytes, o.piece as usize)?;
                        eprintln!(
                            "  rep {}/{} {}: direct-dir {s:.2} s (write {w:.2} s)",
                            rep + 1,
                            o.reps,
                            size_str(size)
                        );
                        samples[si].dir.push(s);
                        samples[si].dir_write.push(w);
                    }
                    Method::Cascade(via) => {
                        let Some(c) = cascade.as_mut() else { continue };
                        n += 1;
                        match c.measure(&durable, size, n, via) {
                            Ok(x) => {
                                eprintln!(
                                    "  rep {}/{} {}: cascade ({}) stall {:.2} s (write {:.2} s, commit {:.2} s), durable after {:.2} s",
                                    rep + 1,
                                    o.reps,
                                    size_str(size),
                                    commit_label(via),
                                    x.stall,
                                    x.write,
                                    x.commit,
                                    x.until_durable
                                );
                                samples[si].cascade.push((via, x));
                            }
                            Err(e) => {
                                eprintln!("cascade: {e}; measuring the baselines only from here");
                                status = CascadeStatus {
                                    state: "failed".into(),
                                    detail: e.0,
                                };
                                cascade = None;
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(mut c) = cascade.take() {
        if let Err(e) = c.stop() {
            eprintln!("cascade: {e}");
            if status.state == "measured" {
                status = CascadeStatus {
                    state: "failed".into(),
                    detail: e.0,
                };
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let goodput = link.goodput.as_ref().map(|g| g.median);
    let sizes = o
        .sizes
        .iter()
        .zip(samples)
        .map(|(&bytes, s)| {
            let cascade = o
                .commit
                .iter()
                .filter_map(|&via| {
                    let xs: Vec<&CascadeSample> = s
                        .cascade
                        .iter()
                        .filter(|(v, _)| *v == via)
                        .map(|(_, x)| x)
                        .collect();
                    if xs.is_empty() {
                        return None;
                    }
                    let col = |f: fn(&CascadeSample) -> f64| {
                        Stats::of(&xs.iter().map(|x| f(x)).collect::<Vec<_>>())
                    };
                    let opt = |f: fn(&CascadeSample) -> Option<f64>| {
                        let v: Vec<f64> = xs.iter().filter_map(|x| f(x)).collect();
                        (!v.is_empty()).then(|| Stats::of(&v))
                    };
                    Some(CascadeRow {
                        commit_via: via,
                        stall_s: col(|x| x.stall),
                        write_s: col(|x| x.write),
                        commit_s: col(|x| x.commit),
                        until_durable_s: col(|x| x.until_durable),
                        until_marker_s: opt(|x| x.until_marker),
                        wire_start_s: opt(|x| x.wire_start),
                        wire_end_s: opt(|x| x.wire_end),
                    })
                })
                .collect();
            SizeRow {
                bytes,
                direct_s3_s: Stats::of(&s.s3),
                direct_s3_wire_s: (!s.s3_wire.is_empty()).then(|| Stats::of(&s.s3_wire)),
                direct_dir_s: Stats::of(&s.dir),
                direct_dir_write_s: Stats::of(&s.dir_write),
                cascade,
                link_min_nominal_s: link.nominal_bytes_per_s.map(|r| bytes as f64 / r),
                link_min_measured_s: goodput.map(|g| bytes as f64 / g),
            }
        })
        .collect();
    if status.state == "measured" && o.sizes.is_empty() {
        status.state = "not run".into();
    }
    Ok(DResults {
        link,
        cascade: status,
        sizes,
    })
}

fn commit_label(via: Commit) -> &'static str {
    match via {
        Commit::Cli => "`cascade commit`",
        Commit::Lib => "cascade_commit()",
    }
}

fn secs(s: &Stats) -> String {
    if s.samples.len() <= 1 {
        format!("{:.2}", s.median)
    } else {
        format!("{:.2} [{:.2}–{:.2}]", s.median, s.min, s.max)
    }
}

fn secs_gbps(s: &Stats, bytes: u64) -> String {
    format!("{} ({:.3} GB/s)", secs(s), bytes as f64 / s.median / 1e9)
}

fn opt_s(x: Option<f64>) -> String {
    x.map_or_else(|| "n/a".into(), |x| format!("{x:.2}"))
}

fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    let r = a / b?;
    r.is_finite().then_some(r)
}

/// With 3 decimals: the ratios judged against the target.
fn ratio3(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.3}x"))
}

fn ratio_s(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.2}x"))
}

fn markdown(rep: &Report) -> String {
    let o = rep.options;
    let r = rep.results;
    let l = &r.link;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Cascade: application-perceived checkpoint time with a throttled durable store\n"
    );
    let _ = writeln!(
        s,
        "Generated by `bench/run.sh --suite durable` ({}) on {} UTC from commit {}; the run \
         took {:.0} s.\n",
        rep.command, rep.generated_utc, rep.source, rep.duration_s
    );
    let _ = writeln!(
        s,
        "The durable store is an S3 server (versitygw) in a network namespace, reached over a \
         veth link shaped with `tc tbf` in both directions (bench/netns-s3.sh). The \
         application writes one checkpoint file of the given size, the same bytes for every \
         method. **Stall** is the time the application is blocked: direct-s3 = \
         `DurableStore::upload_checkpoint` of the file (data, BLAKE3 checksum object, \
         completion marker; 8 MiB multipart parts, 4 in flight); direct-dir = write(2) in {} \
         pieces into a new file on local disk + fsync + close; cascade = the same writes into \
         the node store under `cascade run`, close, and the commit (`cascade commit` or \
         `cascade_commit()`, see below). **Time until \
         durable** (cascade) runs from the start of the write until `cascade wait --level \
         durable` returned, i.e. the node agent had uploaded the file and written the \
         checkpoint's completion marker. **Link minimum** = bytes / nominal rate, and bytes / \
         TCP goodput measured over the same link in this run. {}; GB/s = 10^9 bytes/s. See \
         bench/README.md.\n",
        size_str(o.piece),
        if o.reps > 1 {
            format!(
                "Each figure is the median of {} runs, [min–max] in brackets",
                o.reps
            )
        } else {
            "One run per figure".to_string()
        }
    );
    if rep.interference.other_cpu_pct > 10.0 {
        let _ = writeln!(
            s,
            "**Warning:** other processes and kernel threads used {:.0} % of the CPUs during \
             this run; the figures are disturbed by them.\n",
            rep.interference.other_cpu_pct
        );
    }
    match r.cascade.state.as_str() {
        "measured" => {}
        "not available" => {
            let _ = writeln!(
                s,
                "**Cascade rows: not available** — {}. The baselines and the link were \
                 measured.\n",
                r.cascade.detail
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "**Cascade rows: {}** — {}\n",
                r.cascade.state, r.cascade.detail
            );
        }
    }

    let _ = writeln!(s, "## Results\n");
    let _ = writeln!(
        s,
        "Cascade rows: the writer commits with `cascade commit /ckptNNN` (a new process that \
         attaches the store: how a script or a program calling the CLI commits) or with \
         `cascade_commit()` of the preloaded library, in its own process (include/cascade.h); \
         each is a run of its own.\n"
    );
    let _ = writeln!(
        s,
        "| checkpoint | direct-s3 stall, s (GB/s) | direct-dir stall, s (GB/s) | cascade, \
         committed with | cascade stall, s (GB/s) | stall ratio direct-s3 / cascade | cascade \
         time until durable, s | link minimum, s (nominal / measured goodput) | until durable \
         / link minimum (nominal / measured) | target ≤ {TARGET_RATIO} |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    let na = if r.cascade.state == "measured" {
        "n/a"
    } else {
        "not available"
    };
    for row in &r.sizes {
        let b = row.bytes;
        let head = format!(
            "| {} | {} | {} |",
            size_str(b),
            secs_gbps(&row.direct_s3_s, b),
            secs_gbps(&row.direct_dir_s, b)
        );
        let link = format!(
            "{} / {}",
            opt_s(row.link_min_nominal_s),
            opt_s(row.link_min_measured_s)
        );
        if row.cascade.is_empty() {
            let _ = writeln!(
                s,
                "{head} {na} | {na} | {na} | {na} | {link} | {na} | {na} |"
            );
        }
        for c in &row.cascade {
            let tud = c.until_durable_s.median;
            let rn = row.link_min_nominal_s.and_then(|m| ratio(tud, Some(m)));
            let rm = row.link_min_measured_s.and_then(|m| ratio(tud, Some(m)));
            let met = match rn {
                Some(x) if x <= TARGET_RATIO => "**yes**",
                Some(_) => "**NO**",
                None => "n/a",
            };
            let _ = writeln!(
                s,
                "{head} {} | {} | {} | {} | {link} | {} / {} | {met} |",
                commit_label(c.commit_via),
                secs_gbps(&c.stall_s, b),
                ratio_s(ratio(row.direct_s3_s.median, Some(c.stall_s.median))),
                secs(&c.until_durable_s),
                ratio3(rn),
                ratio3(rm),
            );
        }
    }
    let _ = writeln!(
        s,
        "\nThe target compares the time until durable with the nominal (physical) minimum. \
         TCP over a 1500-byte MTU cannot exceed 1448/1514 = 95.6 % of the rate tbf enforces \
         (tbf counts whole Ethernet frames), and HTTP/S3 adds requests on top.\n"
    );
    let _ = writeln!(s, "### Where the time goes\n");
    let _ = writeln!(
        s,
        "\"On the wire until\": when 99 % of the bytes the link carried had gone through (the \
         host end's tx_bytes counter, sampled every 2 ms); what follows is the S3 server \
         finishing the upload (versitygw's posix backend reassembles the multipart parts into \
         one file at CompleteMultipartUpload), the checksum object and the marker.\n"
    );
    let _ = writeln!(
        s,
        "| checkpoint | direct-s3 GB/s (share of nominal) | direct-s3 on the wire until, s | \
         direct-s3 after that, s | direct-dir write only, s |\n|---|---|---|---|---|"
    );
    for row in &r.sizes {
        let s3_rate = row.bytes as f64 / row.direct_s3_s.median;
        let vs = l
            .nominal_bytes_per_s
            .map_or_else(|| "n/a".into(), |n| format!("{:.1} %", 100.0 * s3_rate / n));
        let (wire, after) = match &row.direct_s3_wire_s {
            Some(w) => (secs(w), format!("{:.2}", row.direct_s3_s.median - w.median)),
            None => ("n/a".into(), "n/a".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {:.3} ({vs}) | {wire} | {after} | {} |",
            size_str(row.bytes),
            s3_rate / 1e9,
            secs(&row.direct_dir_write_s)
        );
    }
    let any_cascade = r.sizes.iter().any(|x| !x.cascade.is_empty());
    if any_cascade {
        let _ = writeln!(
            s,
            "\nCascade, every time from the start of the write: the stall's parts, when the \
             agent's upload started and finished going over the link, when the marker was \
             written (its own `completed_unix_ns`, so without `cascade wait`'s polling) and \
             when `cascade wait` returned; the last column compares that with the direct-s3 \
             stall, the same upload done by the application.\n"
        );
        let _ = writeln!(
            s,
            "| checkpoint | committed with | write + close, s | commit, s | upload on the wire \
             from, s | on the wire until, s | marker written, s | `cascade wait` returned, s \
             | until durable / direct-s3 stall |\n|---|---|---|---|---|---|---|---|---|"
        );
        let o_s = |x: &Option<Stats>| x.as_ref().map_or_else(|| "n/a".into(), secs);
        for row in &r.sizes {
            for c in &row.cascade {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    size_str(row.bytes),
                    commit_label(c.commit_via),
                    secs(&c.write_s),
                    secs(&c.commit_s),
                    o_s(&c.wire_start_s),
                    o_s(&c.wire_end_s),
                    o_s(&c.until_marker_s),
                    secs(&c.until_durable_s),
                    ratio_s(ratio(
                        c.until_durable_s.median,
                        Some(row.direct_s3_s.median)
                    )),
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\n`cascade commit` attaches the store in a new process, which maps the store's whole \
         memory ({}): its time grows with the store's capacity. `cascade_commit()` runs in \
         the writer, whose library attached the store when it started.\n",
        size_str(o.capacity)
    );

    let _ = writeln!(s, "## Link\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| nominal rate | {} |",
        l.nominal_bytes_per_s.map_or_else(
            || "unknown (no tbf found)".into(),
            |n| format!("{:.0} Mbit/s = {:.1} MB/s", n * 8.0 / 1e6, n / 1e6)
        )
    );
    let _ = writeln!(s, "| host → S3 (upload) | {} |", l.upload);
    let _ = writeln!(s, "| S3 → host (download) | {} |", l.download);
    let _ = writeln!(s, "| offloads on {} | {} |", o.link_dev, l.offloads);
    let good = match (&l.goodput, &l.linktest_error) {
        (Some(g), _) => {
            let pct = l.nominal_bytes_per_s.map_or_else(String::new, |n| {
                format!(", {:.1} % of nominal", 100.0 * g.median / n)
            });
            let range = if g.samples.len() > 1 {
                format!(" [{:.1}–{:.1}]", g.min / 1e6, g.max / 1e6)
            } else {
                String::new()
            };
            format!(
                "{:.1}{range} MB/s ({:.0} Mbit/s{pct}); {} per test, {} test{}",
                g.median / 1e6,
                g.median * 8.0 / 1e6,
                size_str(l.linktest_bytes),
                g.samples.len(),
                if g.samples.len() == 1 { "" } else { "s" }
            )
        }
        (None, Some(e)) => format!("failed: {e}"),
        (None, None) => "not measured".into(),
    };
    let _ = writeln!(
        s,
        "| TCP goodput host → S3 namespace (one connection, from connect until the receiver \
         acknowledged the last byte) | {good} |"
    );

    let m = rep.machine;
    machine_table(
        &mut s,
        m,
        &[
            (
                format!("direct-dir baseline ({})", o.disk_dir.display()),
                m.disk_fs.clone(),
            ),
            (
                "durable store".into(),
                format!("{} ({})", o.durable, rep.s3_server),
            ),
            (
                "CPU used by the S3 server during the run (not counted below)".into(),
                format!("{:.1} % of all cores", rep.s3_server_cpu_pct),
            ),
            ("cascade CLI".into(), rep.cascade_cli.clone()),
            ("preload library".into(), rep.library.clone()),
            (
                "node store".into(),
                format!(
                    "{}, {} memory, no spill file, mount {}",
                    o.store,
                    size_str(o.capacity),
                    o.mount
                ),
            ),
        ],
        &rep.interference,
    );
    s
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

/// "path (modified ...)", or "path (missing)".
pub(crate) fn describe(p: &Path) -> String {
    if p.is_file() {
        crate::describe_file(&std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
    } else {
        format!("{} (missing)", p.display())
    }
}

/// The arguments of this run, with the value of --url (it holds the S3 secret) left out.
pub(crate) fn command_line() -> String {
    let mut out: Vec<String> = Vec::new();
    let mut hide_next = false;
    for arg in std::env::args().skip(2) {
        if hide_next {
            out.push("<hidden>".into());
            hide_next = false;
        } else if arg == "--url" {
            out.push(arg);
            hide_next = true;
        } else if arg.starts_with("--url=") {
            out.push("--url=<hidden>".into());
        } else {
            out.push(arg);
        }
    }
    out.join(" ")
}

pub fn run(a: DurableArgs) -> Res<()> {
    let pid = std::process::id();
    let o = build_opts(&a, pid)?;
    let dirs = vec![PathBuf::from("/var/tmp"), o.disk_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs.clone(), &a.out)?;
    let machine = util::machine(&o.disk_dir, &o.disk_dir);
    eprintln!(
        "cascade-bench durable: {} ({} cores), kernel {}, {} GiB RAM; durable store {}; sizes {}",
        machine.cpu_model,
        machine.cores,
        machine.kernel,
        machine.ram_gib,
        o.durable,
        o.sizes
            .iter()
            .map(|&b| size_str(b))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The checkpoint data, once: a /dev/shm file (the C writer maps it too), filled with a
    // non-zero xorshift pattern (not compressible).
    let max = o.sizes.iter().copied().max().unwrap_or(0);
    let datafile = PathBuf::from(format!("/dev/shm/{}-ckptdata", prefix(pid)));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&datafile)
        .ctx(|| format!("creating {}", datafile.display()))?;
    f.set_len(max)
        .ctx(|| format!("sizing {}", datafile.display()))?;
    // SAFETY: the file was just created by this process, which alone writes it; it is not
    // truncated while mapped.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }
        .ctx(|| format!("mapping {}", datafile.display()))?;
    fill_pattern(&mut map, 0x5eed_d00d_cafe_f00d);
    let load0 = util::loadavg();
    let cpu0 = util::cpu_snap();
    let server0 = server_ticks();
    let t0 = now_ns();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let results = run_all(&o, &map, &datafile)?;
    drop(map);
    let duration_s = (now_ns() - t0) as f64 / 1e9;
    let mut interference = util::interference(&cpu0, &util::cpu_snap(), machine.cores, load0);
    // The S3 server is part of what is measured, not interference: its CPU share is reported
    // on its own.
    let server_cpu_pct = match (server0, server_ticks()) {
        (Some(a), Some(b)) => {
            let wall_ticks = duration_s * 100.0 * machine.cores.max(1) as f64;
            (b.saturating_sub(a) as f64 / wall_ticks * 1000.0).round() / 10.0
        }
        _ => f64::NAN,
    };
    if server_cpu_pct.is_finite() {
        interference.other_cpu_pct =
            ((interference.other_cpu_pct - server_cpu_pct).max(0.0) * 10.0).round() / 10.0;
    }
    if interference.other_cpu_pct > 10.0 {
        eprintln!(
            "warning: other processes used {:.0} % of the CPUs during the run; numbers are disturbed",
            interference.other_cpu_pct
        );
    }
    let rep = Report {
        suite: "durable",
        generated_utc: utc_string(started),
        duration_s,
        command: command_line(),
        source: crate::source_version_of(&[
            "crates/cascade-durable",
            "crates/cascade-agent",
            "crates/cascade-cli",
            "crates/cascade-store",
            "crates/cascade-preload",
            "bench",
        ]),
        s3_server: s3_server(),
        cascade_cli: describe(&o.cascade),
        library: describe(&o.cascade.with_file_name("libcascade.so")),
        s3_server_cpu_pct: server_cpu_pct,
        machine: &machine,
        interference,
        options: &o,
        results: &results,
    };
    let md = markdown(&rep);
    crate::report::write_results(&a.out, "durable", &md, &rep, &[], duration_s)?;
    if results.cascade.state == "failed" {
        return err(format!(
            "the cascade runs failed: {}",
            results.cascade.detail
        ));
    }
    Ok(())
}
