//! Small helpers shared by the parent and the children: errors with context, a clock that is
//! comparable across processes, a data pattern, statistics, machine facts and cleanup.

use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// An error message with its context chain, e.g. "writing /var/tmp/x: No space left on device".
#[derive(Debug)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

pub type Res<T> = Result<T, BenchError>;

/// Builds an error from a message.
pub fn err<T>(msg: impl Into<String>) -> Res<T> {
    Err(BenchError(msg.into()))
}

/// Checks `--mount`: an absolute path other than /.
pub fn check_mount(mount: &str) -> Res<()> {
    if !mount.starts_with('/') || mount.len() < 2 {
        return err("--mount must be an absolute path other than /");
    }
    Ok(())
}

/// The bench's S3 URL as an HTTPS durable store would be used: `sign_payload=no` (Cascade's
/// default over HTTPS) unless the URL says otherwise. The shaped plain-HTTP endpoint stands
/// for a store behind a link, which is HTTPS in use (bench/README.md).
pub fn as_over_https(url: String) -> String {
    if url.is_empty() || url.contains("sign_payload=") {
        url
    } else {
        format!("{url}&sign_payload=no")
    }
}

/// Checks that a suite measuring over the shaped link was given the S3 server's URL.
pub fn require_s3_url(url: &str, suite: &str) -> Res<()> {
    if url.is_empty() {
        return err(format!(
            "no durable store: run `bench/netns-s3.sh up` and `eval \"$(bench/netns-s3.sh env)\"` \
             (sets CASCADE_BENCH_S3_URL), or pass --url (bench/run.sh --suite {suite} does both)"
        ));
    }
    Ok(())
}

/// Adds context to any error that can be displayed (io::Error, cascade_store::Error, ...).
pub trait Context<T> {
    fn ctx<C: fmt::Display>(self, what: impl FnOnce() -> C) -> Res<T>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn ctx<C: fmt::Display>(self, what: impl FnOnce() -> C) -> Res<T> {
        self.map_err(|e| BenchError(format!("{}: {e}", what())))
    }
}

/// CLOCK_MONOTONIC in nanoseconds. Unlike `Instant`, its values can be compared between the
/// parent and its children (the clock is system-wide), which the common-start barrier needs.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, so
    // the call cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Bytes per second in GB/s (10^9 bytes per second).
pub fn gbps(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        return f64::INFINITY;
    }
    bytes as f64 / ns as f64
}

/// Fills `buf` with a non-zero pseudo-random pattern (xorshift64), so that neither the kernel
/// nor the CPU can take a zero-page or zero-store shortcut.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = (x | 0x0101_0101_0101_0101).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Human-readable size: "4 KiB", "1 MiB", "512 MiB", "1 GiB".
pub fn size_str(bytes: u64) -> String {
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// Median, minimum and maximum of a few repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Stats {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Stats {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            samples: samples.to_vec(),
        }
    }
}

/// Facts about the machine the numbers were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub ram_gib: f64,
    pub thp_anon: String,
    pub thp_shmem: String,
    pub shm_fs: String,
    pub disk_fs: String,
    pub spill_fs: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// "ext4 on /dev/vda (mounted at /)" for the file system holding `path`.
pub fn fs_of(path: &Path) -> String {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    // The deepest mount point above the path (the last one of equal depth).
    let fields = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    let above = fields.filter(|f| f.len() >= 3 && canon.starts_with(f[1]));
    let best = above.max_by_key(|f| f[1].len());
    best.map_or_else(
        || "unknown".to_string(),
        |f| format!("{} on {} (mounted at {})", f[2], f[0], f[1]),
    )
}

/// The value after the colon on the first line of file `path` that starts with `key`.
fn field_of(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_once(':').map(|(_, v)| v.trim().to_string())
}

/// The CPU's model name with its family and model numbers and whether it has AVX-512: a VM
/// may show only "AMD EPYC", and a ratio can differ between CPU generations.
fn cpu_description() -> String {
    let name = field_of("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".to_string());
    let family = field_of("/proc/cpuinfo", "cpu family");
    let model = field_of("/proc/cpuinfo", "model\t");
    let avx512 = field_of("/proc/cpuinfo", "flags")
        .is_some_and(|f| f.split_whitespace().any(|x| x == "avx512f"));
    match (family, model) {
        (Some(f), Some(m)) => format!(
            "{name} (family {f}, model {m}; {})",
            if avx512 { "AVX-512" } else { "no AVX-512" }
        ),
        _ => name,
    }
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn machine(disk_dir: &Path, spill_dir: &Path) -> Machine {
    let cpu_model = cpu_description();
    let ram_kib: f64 = field_of("/proc/meminfo", "MemTotal:")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpu_model,
        cores: cores(),
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        ram_gib: (ram_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
        thp_anon: read_trim("/sys/kernel/mm/transparent_hugepage/enabled"),
        thp_shmem: read_trim("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
        shm_fs: fs_of(Path::new("/dev/shm")),
        disk_fs: fs_of(disk_dir),
        spill_fs: fs_of(spill_dir),
    }
}

/// Prefix of every store name, shm object and file a run with parent `pid` creates.
pub fn prefix(pid: u32) -> String {
    format!("cascade-bench-{pid}")
}

/// Store names are "/cascade-bench-<pid>-store-<tag>"; the shm object is /dev/shm/<name>.
pub fn store_name(pid: u32, tag: &str) -> String {
    format!("/{}-store-{tag}", prefix(pid))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what a run left behind: stores (through `Store::destroy`, which also removes their
/// spill files), baseline shm objects and tmpfs files, and files under `dirs`. With `pid` =
/// None, cleans up after every run whose parent process is gone. Returns what it removed.
pub fn cleanup(pid: Option<u32>, dirs: &[PathBuf]) -> Vec<String> {
    let mut removed = Vec::new();
    let wanted = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix("cascade-bench-") else {
            return false;
        };
        let owner: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
        match (owner, pid) {
            (Some(o), Some(p)) => o == p,
            (Some(o), None) => !pid_alive(o),
            (None, _) => false,
        }
    };
    // FUSE mounts first (the fuse suite mounts stores under /var/tmp/<prefix>-mnt-*): a mount
    // left by a run that was killed is detached, so that nothing below walks into it and its
    // daemon exits once nobody uses it.
    for mp in cascade_fuse::cascade_mounts().unwrap_or_default() {
        let name = mp
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if wanted(&name) {
            match cascade_fuse::unmount(&mp, true) {
                Ok(()) => removed.push(format!("mount {}", mp.display())),
                Err(e) => eprintln!("cleanup: detaching the mount {}: {e}", mp.display()),
            }
        }
    }
    // Stores next: destroy removes the shm object and the spill file.
    let mut shm_names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| wanted(n))
                .collect()
        })
        .unwrap_or_default();
    shm_names.sort();
    for name in &shm_names {
        if name.contains("-store-") {
            let store = format!("/{name}");
            if cascade_store::Store::exists(&store) {
                match cascade_store::Store::destroy(&store) {
                    Ok(()) => removed.push(format!("store {store}")),
                    Err(e) => eprintln!("cleanup: destroying store {store}: {e}"),
                }
            }
        }
    }
    let mut places: Vec<PathBuf> = vec![PathBuf::from("/dev/shm")];
    places.extend(dirs.iter().cloned());
    for dir in places {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if !wanted(&name) {
                continue;
            }
            let p = e.path();
            let r = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            match r {
                Ok(()) => removed.push(p.display().to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => eprintln!("cleanup: removing {}: {e}", p.display()),
            }
        }
    }
    removed
}

/// CPU time counters, to tell how much other processes used the machine during a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSnap {
    /// All CPUs' busy time (user, nice, system, irq, softirq), in clock ticks.
    busy: u64,
    /// Time the hypervisor ran something else on our virtual CPUs.
    steal: u64,
    /// This process plus its waited-for children (utime, stime, cutime, cstime).
    own: u64,
    at_ns: u64,
}

/// What other processes and the hypervisor took from the run, as shares of all CPUs.
#[derive(Debug, Clone, Serialize)]
pub struct Interference {
    /// CPU used by processes other than the benchmark, % of all cores over the run.
    pub other_cpu_pct: f64,
    /// Steal time, % of all cores over the run.
    pub steal_pct: f64,
    pub loadavg_start: String,
    pub loadavg_end: String,
    /// Measurements preceded by a wait for an idle machine, and how many of those waits
    /// gave up (the machine stayed busy for `settle_max_s`).
    pub settles: u64,
    pub settle_timeouts: u64,
    pub settle_max_s: f64,
    pub settle_median_s: f64,
}

/// The first line of /proc/stat: all CPUs' user nice system idle iowait irq softirq steal ...
/// ticks.
fn cpu_ticks() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let first = stat.lines().next().unwrap_or("").split_whitespace().skip(1);
    first.map(|x| x.parse().unwrap_or(0)).collect()
}

pub fn cpu_snap() -> CpuSnap {
    let f = cpu_ticks();
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = get(0) + get(1) + get(2) + get(5) + get(6);
    let own_stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the ")" that closes the command name: state is field 3, utime field 14.
    let after = own_stat.rsplit_once(')').map_or("", |(_, r)| r);
    let o: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let own = (11..15).map(|i| o.get(i).copied().unwrap_or(0)).sum();
    CpuSnap {
        busy,
        steal: get(7),
        own,
        at_ns: now_ns(),
    }
}

pub fn loadavg() -> String {
    read_trim("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// CPU seconds all cores were busy between two snapshots, whatever process it was for
/// (USER_HZ = 100 ticks per second on Linux).
pub fn busy_core_s(a: &CpuSnap, b: &CpuSnap) -> f64 {
    b.busy.saturating_sub(a.busy) as f64 / 100.0
}

/// Compares two snapshots (clock ticks are USER_HZ = 100 per second on Linux).
pub fn interference(a: &CpuSnap, b: &CpuSnap, cores: usize, load_a: String) -> Interference {
    let wall_ticks = (b.at_ns.saturating_sub(a.at_ns)) as f64 / 1e7 * cores.max(1) as f64;
    let other = b.busy.saturating_sub(a.busy) as f64 - b.own.saturating_sub(a.own) as f64;
    let pct = |x: f64| {
        if wall_ticks > 0.0 {
            (x.max(0.0) / wall_ticks * 1000.0).round() / 10.0
        } else {
            0.0
        }
    };
    let waits = settle_log();
    Interference {
        other_cpu_pct: pct(other),
        steal_pct: pct(b.steal.saturating_sub(a.steal) as f64),
        loadavg_start: load_a,
        loadavg_end: loadavg(),
        settles: waits.len() as u64,
        settle_timeouts: waits.iter().filter(|w| w.1).count() as u64,
        settle_max_s: SETTLE_MAX.as_secs_f64(),
        settle_median_s: Stats::of(&waits.iter().map(|w| w.0).collect::<Vec<_>>()).median,
    }
}

/// How long `settle` waits at most.
pub const SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(3);
/// Busy share of all CPUs below which the machine counts as idle.
const SETTLE_BUSY: f64 = 0.10;
const SETTLE_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

static SETTLE_LOG: std::sync::Mutex<Vec<(f64, bool)>> = std::sync::Mutex::new(Vec::new());

fn settle_log() -> Vec<(f64, bool)> {
    SETTLE_LOG
        .lock()
        .map(|v| v.clone())
        .unwrap_or_else(|p| p.into_inner().clone())
}

fn busy_total() -> (u64, u64) {
    let f = cpu_ticks();
    let total: u64 = f.iter().take(8).sum();
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// Waits until the machine is idle (all CPUs together less than 10 % busy over 100 ms), at
/// most `SETTLE_MAX`. Called after every child is READY and before the start: on a 2-core
/// machine, the kernel's leftovers from the previous measurement (freeing a 1 GiB file,
/// returning freed memory to the hypervisor, writeback) would otherwise land on this one.
pub fn settle() {
    let t0 = std::time::Instant::now();
    let mut timed_out = true;
    while t0.elapsed() < SETTLE_MAX {
        let (b0, t_0) = busy_total();
        std::thread::sleep(SETTLE_WINDOW);
        let (b1, t_1) = busy_total();
        let total = t_1.saturating_sub(t_0);
        if total > 0 && (b1.saturating_sub(b0) as f64) < SETTLE_BUSY * total as f64 {
            timed_out = false;
            break;
        }
    }
    let waited = t0.elapsed().as_secs_f64();
    if let Ok(mut v) = SETTLE_LOG.lock() {
        v.push((waited, timed_out));
    }
}

/// The methods in the order of repetition `rep`: the one that goes first rotates.
pub fn rotated<T: Copy>(methods: &[T], rep: usize) -> Vec<T> {
    let n = methods.len().max(1);
    (0..methods.len()).map(|k| methods[(k + rep) % n]).collect()
}
