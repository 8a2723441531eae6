//! `cascade-bench fuse`: the FUSE front end (`cascade mount`, crates/cascade-fuse) against the
//! LD_PRELOAD library into the same store, tmpfs, local disk and memcpy, all measured in the
//! same run with one C program (bench/preload/pio.c) doing the I/O for every target. Writes
//! fuse.md and fuse.json (bench/plot.py draws fuse.png from it). See bench/README.md.
//!
//! Targets: `fuse` (a fresh store mounted with `cascade mount`, direct I/O), `fuse-kcache`
//! (another fresh store, `cascade mount --kernel-cache`), `preload` (LD_PRELOAD=libcascade.so
//! into the store of `fuse`), `tmpfs` (a new file in /dev/shm; for reads an existing one),
//! `tmpfs-rewrite` (overwriting a /dev/shm file whose pages exist), `disk` (a new file in
//! /var/tmp: clock stopped after the last write, and `disk+fsync` with the final fsync; for
//! reads from the page cache, and `disk-cold` after posix_fadvise(DONTNEED)) and `memcpy`
//! (into / out of a pre-faulted MAP_SHARED /dev/shm object, the ceiling).
//! Parts: 1 MiB and 4 KiB writes into a new file, 1 MiB and 4 KiB reads of an existing file,
//! `cp` of a file from /dev/shm (an unmodified program) and multi-writer scaling.

use crate::format::{ratio_fine as ratio, st};
use crate::harness::{run_commands, Outcome};
use crate::procs::{clean_cmd, compile, cpu_s, private_cli, terminate, tool_version};
use crate::report::{self, machine_table, Header, Md, RunClock, Table, Target};
use crate::stores::burn_in;
use crate::util::rotated;
use crate::util::{
    self, check_mount, err, fill_pattern, now_ns, prefix, size_str, store_name, Context, Res,
    Stats, KIB, MIB,
};
use cascade_store::{OpenOptions, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Parts of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// 1 MiB writes into a new file.
    Writes,
    /// Small (4 KiB) writes into a new file.
    SmallWrites,
    /// 1 MiB reads of an existing file.
    Reads,
    /// Small (4 KiB) reads of an existing file.
    SmallReads,
    /// `cp` of a file from /dev/shm into the target.
    Cp,
    /// 1, 2, 4 writer processes, 1 MiB writes.
    Scaling,
}

impl Part {
    fn title(self, small: u64) -> String {
        match self {
            Part::Writes => "1 MiB writes, new file".into(),
            Part::SmallWrites => format!("{} writes, new file", size_str(small)),
            Part::Reads => "1 MiB reads".into(),
            Part::SmallReads => format!("{} reads", size_str(small)),
            Part::Cp => "cp from /dev/shm".into(),
            Part::Scaling => "1 MiB writes by N processes".into(),
        }
    }
    fn is_write(self) -> bool {
        matches!(self, Part::Writes | Part::SmallWrites | Part::Scaling)
    }
}

/// The options (`cascade-bench fuse --help`); the fields without an `arg` are derived by
/// [`FOpts::resolve`].
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct FOpts {
    /// Directory for fuse.md and fuse.json.
    #[arg(long, default_value = "bench/results")]
    #[serde(skip)]
    out: PathBuf,
    /// Quick run: 256 MiB files, 1 repetition, scaling with 1 and 2 writers. Explicit flags
    /// override.
    #[arg(long)]
    #[serde(skip)]
    quick: bool,
    /// Parts to run.
    #[arg(
        long = "only",
        value_enum,
        value_delimiter = ',',
        default_value = "writes,small-writes,reads,small-reads,cp,scaling"
    )]
    pub parts: Vec<Part>,
    /// Repetitions of each measurement; tables show the median.
    #[arg(long, default_value_t = 5, default_value_if("quick", "true", "1"))]
    pub reps: usize,
    /// File size in MiB (every part; the scaling part splits it over the writers).
    #[arg(long, default_value_t = 1024, default_value_if("quick", "true", "256"))]
    #[serde(skip)]
    size_mib: u64,
    /// Bytes per call of the small writes and reads, in KiB (a divisor of 1024).
    #[arg(long, default_value_t = 4)]
    #[serde(skip)]
    small_kib: u64,
    /// Writer processes of the scaling part.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4",
        default_value_if("quick", "true", "1,2")
    )]
    pub procs: Vec<usize>,
    /// Request threads of each `cascade mount` (its --threads).
    #[arg(long, default_value_t = 2)]
    pub threads: u16,
    /// The cascade CLI (its libcascade.so next to it).
    #[arg(long, default_value = "target/release/cascade")]
    pub cascade: PathBuf,
    /// The C compiler for the I/O program.
    #[arg(long, default_value = "cc")]
    pub cc: String,
    /// The cp of the cp part.
    #[arg(long, default_value = "cp")]
    pub cp: String,
    /// Mount prefix (CASCADE_MOUNT) of the preloaded runs.
    #[arg(long, default_value = "/cascade")]
    pub mount: String,
    /// Directory on local disk for the disk baselines.
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    #[arg(skip)]
    #[serde(skip)]
    pub pid: u32,
    /// Bytes of every file (per process in the single-process parts; in all in scaling).
    #[arg(skip)]
    pub size: u64,
    #[arg(skip)]
    pub small: u64,
    /// Memory of each FUSE store: 2 x the file size.
    #[arg(skip)]
    pub capacity: u64,
}

impl FOpts {
    /// Checks the options and derives the byte sizes.
    fn resolve(&mut self, pid: u32) -> Res<()> {
        (self.pid, self.size, self.small) = (pid, self.size_mib * MIB, self.small_kib * KIB);
        self.capacity = 2 * self.size;
        if self.small == 0 || MIB % self.small != 0 {
            return err("--small-kib must divide 1024");
        }
        if self.procs.is_empty() || self.procs.contains(&0) {
            return err("--procs needs positive process counts");
        }
        if self.size == 0
            || self
                .procs
                .iter()
                .any(|&p| self.size % (p as u64 * MIB) != 0)
        {
            return err("--size-mib must be a positive multiple of every process count");
        }
        check_mount(&self.mount)?;
        if self.threads == 0 || self.reps == 0 {
            return err("--threads and --reps must be positive");
        }
        self.mount = self.mount.trim_end_matches('/').to_string();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Results.

/// One target in one part: GB/s over the repetitions, its ratio to tmpfs within each
/// repetition, and the CPU the mount process used.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub part: Part,
    pub method: String,
    pub procs: usize,
    /// Bytes per call.
    pub io: u64,
    /// Bytes per process.
    pub bytes: u64,
    pub gbps: Stats,
    /// This target / tmpfs within each repetition.
    pub vs_tmpfs: Stats,
    /// This target / tmpfs-rewrite within each repetition (writes).
    pub vs_tmpfs_rewrite: Option<Stats>,
    /// CPU seconds of the `cascade mount` process per GB moved (FUSE targets).
    pub daemon_cpu_s_per_gb: Option<Stats>,
    /// Median set-up time of a process before the start barrier.
    pub setup_s: f64,
}

/// One `cascade mount` of the run.
#[derive(Debug, Clone, Serialize)]
pub struct MountRow {
    pub target: String,
    pub store: String,
    pub mountpoint: String,
    pub capacity: u64,
    pub chunk_size: u64,
    pub threads: u16,
    pub kernel_cache: bool,
    /// The line `cascade mount` printed.
    pub line: String,
    /// From starting `cascade mount` until it was mounted (store creation with its
    /// foreground pre-fault included).
    pub mount_s: f64,
    /// Writing the whole store once through the store API (burn-in).
    pub burn_in_s: f64,
    /// How it ended: "unmounted", or what went wrong.
    pub ended: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FResults {
    pub mounts: Vec<MountRow>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    #[serde(flatten)]
    pub header: Header,
    pub cascade_cli: String,
    pub library: String,
    pub cc: String,
    pub cp: String,
    /// Whether freed guest memory goes back to the host (see `free_page_reporting`).
    pub free_page_reporting: String,
    pub options: &'a FOpts,
    pub targets: Vec<Target>,
    pub results: &'a FResults,
}

// ---------------------------------------------------------------------------------------------
// Mounts.

/// A store created and mounted by `cascade mount`; unmounted and destroyed by `close`, or
/// when dropped (also after errors).
struct Mount {
    target: &'static str,
    bin: PathBuf,
    store: String,
    capacity: u64,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pid: u32,
    handle: Option<Store>,
    row: MountRow,
    closed: bool,
}

impl Mount {
    fn start(o: &FOpts, bin: &Path, target: &'static str, kernel_cache: bool) -> Res<Mount> {
        let tag = if kernel_cache { "kcache" } else { "direct" };
        let dir = PathBuf::from(format!("/var/tmp/{}-mnt-{tag}", prefix(o.pid)));
        std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        let store = store_name(o.pid, tag);
        let log = PathBuf::from(format!("/var/tmp/{}-mount-{tag}.log", prefix(o.pid)));
        let mut m = Mount {
            target,
            bin: bin.to_path_buf(),
            store: store.clone(),
            capacity: o.capacity,
            dir: dir.clone(),
            log: log.clone(),
            child: None,
            pid: 0,
            handle: None,
            row: MountRow {
                target: target.into(),
                store,
                mountpoint: dir.display().to_string(),
                capacity: o.capacity,
                chunk_size: 0,
                threads: o.threads,
                kernel_cache,
                line: String::new(),
                mount_s: f64::NAN,
                burn_in_s: f64::NAN,
                ended: "not unmounted".into(),
            },
            closed: false,
        };
        let logf = std::fs::File::create(&log).ctx(|| format!("creating {}", log.display()))?;
        let mut cmd = m.cmd();
        cmd.arg("mount")
            .arg(&dir)
            .args(["--threads", &o.threads.to_string()]);
        if kernel_cache {
            cmd.arg("--kernel-cache");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf);
        // SAFETY: prctl is async-signal-safe; the daemon gets SIGTERM (and unmounts) if the
        // bench dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .ctx(|| format!("starting {} mount", m.bin.display()))?;
        m.pid = child.id();
        m.child = Some(child);
        loop {
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    m.child = None;
                    return err(format!(
                        "cascade mount {} exited ({status}): {}",
                        dir.display(),
                        crate::procs::tail(&log, 5)
                    ));
                }
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.starts_with("cascade mount: store")) {
                if cascade_fuse::is_cascade_mount(&dir).unwrap_or(false) {
                    m.row.line = line.to_string();
                    break;
                }
            }
            if t0.elapsed() > Duration::from_secs(300) {
                return err(format!(
                    "cascade mount {} did not mount within 300 s: {}",
                    dir.display(),
                    crate::procs::tail(&log, 5)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        m.row.mount_s = t0.elapsed().as_secs_f64();
        let st = Store::attach(&m.store).ctx(|| format!("attaching {}", m.store))?;
        st.map_in();
        m.row.chunk_size = st.chunk_size();
        let t = Instant::now();
        burn_in(&st, m.capacity)?;
        m.row.burn_in_s = t.elapsed().as_secs_f64();
        m.handle = Some(st);
        eprintln!(
            "  {target}: {} (mounted after {:.2} s; burn-in {:.2} s)",
            m.row.line, m.row.mount_s, m.row.burn_in_s
        );
        Ok(m)
    }

    /// A cascade command with this store's settings and no others.
    fn cmd(&self) -> Command {
        let mut c = clean_cmd(&self.bin);
        c.env("CASCADE_STORE", &self.store)
            .env("CASCADE_CAPACITY", self.capacity.to_string())
            .env("CASCADE_SPILL_SIZE", "0")
            .env("CASCADE_PREFAULT", "foreground");
        c
    }

    fn store(&self) -> Res<&Store> {
        self.handle
            .as_ref()
            .ok_or_else(|| util::BenchError(format!("{} is not attached", self.store)))
    }

    /// Fails if the daemon exited.
    fn check(&mut self) -> Res<()> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return err(format!(
                    "cascade mount {} exited ({status}): {}",
                    self.dir.display(),
                    crate::procs::tail(&self.log, 5)
                ));
            }
        }
        Ok(())
    }

    /// CPU seconds the daemon's threads have used so far (/proc/PID/task/*/schedstat: run
    /// time in ns, finer than the 10 ms ticks of /proc/PID/stat).
    fn cpu(&self) -> f64 {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return cpu_s(self.pid).unwrap_or(f64::NAN);
        };
        let mut ns = 0u64;
        for e in rd.filter_map(|e| e.ok()) {
            let text = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
            ns += text
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
        ns as f64 / 1e9
    }

    /// Unmounts (`cascade umount`, retried while files are still open), waits for the daemon
    /// to exit, destroys the store (`cascade destroy --force`) and removes the mount point.
    fn close(&mut self) -> Res<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.handle = None;
        let mut problems = Vec::new();
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut last = String::new();
            let mut unmounted = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                match self
                    .cmd()
                    .arg("umount")
                    .arg(&self.dir)
                    .stdin(Stdio::null())
                    .output()
                {
                    Ok(out) if out.status.success() => {
                        unmounted = true;
                        break;
                    }
                    Ok(out) => last = crate::procs::one_line(&out.stderr),
                    Err(e) => last = e.to_string(),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !unmounted {
                problems.push(format!("cascade umount {}: {last}", self.dir.display()));
            }
            // The daemon exits once the kernel ends the session.
            let deadline = Instant::now() + Duration::from_secs(10);
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => break None,
                }
            };
            match status {
                Some(s) if s.success() && unmounted => self.row.ended = "unmounted".into(),
                Some(s) => {
                    self.row.ended = format!("daemon exited ({s})");
                    if !s.success() {
                        problems.push(format!(
                            "cascade mount {} exited ({s}): {}",
                            self.dir.display(),
                            crate::procs::tail(&self.log, 3)
                        ));
                    }
                }
                None => {
                    self.row.ended = "daemon did not exit; terminated".into();
                    if let Err(e) = terminate(&mut child, "cascade mount", 5) {
                        problems.push(e.0);
                    }
                }
            }
        }
        if cascade_fuse::is_cascade_mount(&self.dir).unwrap_or(true) {
            if let Err(e) = cascade_fuse::unmount(&self.dir, true) {
                problems.push(format!("detaching {}: {e}", self.dir.display()));
            }
        }
        match self
            .cmd()
            .args(["destroy", "--force"])
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => problems.push(format!(
                "cascade destroy --force {}: {}",
                self.store,
                crate::procs::one_line(&out.stderr)
            )),
            Err(e) => problems.push(format!("cascade destroy: {e}")),
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.log);
        if problems.is_empty() {
            Ok(())
        } else {
            err(problems.join("; "))
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            eprintln!("warning: {}: {e}", self.target);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Targets and runs.

const MEMCPY: &str = "memcpy";
const TMPFS: &str = "tmpfs";
const REWRITE: &str = "tmpfs-rewrite";
const FUSE: &str = "fuse";
const KCACHE: &str = "fuse-kcache";
const PRELOAD: &str = "preload";
const DISK: &str = "disk";
const DISK_SYNC: &str = "disk+fsync";
const DISK_COLD: &str = "disk-cold";

/// Rows in this order in every table.
const ORDER: [&str; 9] = [
    MEMCPY, TMPFS, REWRITE, FUSE, KCACHE, PRELOAD, DISK, DISK_SYNC, DISK_COLD,
];

struct Rig<'a> {
    o: &'a FOpts,
    exe: PathBuf,
    lib: PathBuf,
    direct: Mount,
    kcache: Mount,
}

/// Per-method samples of one part.
#[derive(Default)]
struct Samples {
    gbps: BTreeMap<String, Vec<f64>>,
    cpu: BTreeMap<String, Vec<f64>>,
    setup: BTreeMap<String, Vec<f64>>,
}

impl Samples {
    fn add(&mut self, m: &str, gbps: f64, cpu_per_gb: Option<f64>, setup: &[f64]) {
        self.gbps.entry(m.into()).or_default().push(gbps);
        if let Some(c) = cpu_per_gb {
            self.cpu.entry(m.into()).or_default().push(c);
        }
        self.setup
            .entry(m.into())
            .or_default()
            .extend_from_slice(setup);
    }

    fn rows(&self, part: Part, procs: usize, io: u64, bytes: u64) -> Vec<Row> {
        let base = self.gbps.get(TMPFS);
        let rewrite = self.gbps.get(REWRITE);
        ORDER
            .iter()
            .filter_map(|&m| {
                let g = self.gbps.get(m)?;
                let vs: Vec<f64> = match base {
                    Some(b) => g.iter().zip(b).map(|(x, y)| x / y).collect(),
                    None => Vec::new(),
                };
                let vs_rw = rewrite
                    .filter(|_| m != REWRITE)
                    .map(|b| Stats::of(&g.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>()));
                Some(Row {
                    part,
                    method: m.into(),
                    procs,
                    io,
                    bytes,
                    gbps: Stats::of(g),
                    vs_tmpfs: Stats::of(&vs),
                    vs_tmpfs_rewrite: vs_rw,
                    daemon_cpu_s_per_gb: self.cpu.get(m).map(|v| Stats::of(v)),
                    setup_s: Stats::of(self.setup.get(m).map_or(&[][..], |v| &v[..])).median,
                })
            })
            .collect()
    }
}

impl Rig<'_> {
    fn shm(&self, what: &str) -> String {
        format!("/dev/shm/{}-{what}", prefix(self.o.pid))
    }

    fn disk(&self, what: &str) -> String {
        self.o
            .disk_dir
            .join(format!("{}-{what}", prefix(self.o.pid)))
            .display()
            .to_string()
    }

    fn mount_of(&self, m: &str) -> Option<&Mount> {
        match m {
            FUSE => Some(&self.direct),
            KCACHE => Some(&self.kcache),
            _ => None,
        }
    }

    /// `pio MODE args...`: with the library preloaded (into the store of `fuse`) or with
    /// no Cascade variables at all.
    fn io(&self, preload: bool, mode: &str, args: &[(&str, String)]) -> Command {
        let mut c = clean_cmd(&self.exe);
        c.arg(mode);
        for (k, v) in args {
            c.arg(format!("{k}={v}"));
        }
        if preload {
            c.env("LD_PRELOAD", &self.lib)
                .env("CASCADE_STORE", &self.direct.store)
                .env("CASCADE_MOUNT", &self.o.mount);
        }
        c
    }

    /// The path a method's file `name` has (for the preload target: under the mount prefix).
    fn path_in(&self, m: &str, name: &str) -> String {
        match m {
            FUSE => format!("{}/{name}", self.direct.dir.display()),
            KCACHE => format!("{}/{name}", self.kcache.dir.display()),
            PRELOAD => format!("{}/{name}", self.o.mount),
            DISK | DISK_COLD => self.disk(name),
            _ => self.shm(name),
        }
    }

    fn write_cmd(&self, m: &str, i: usize, rep: usize, bytes: u64, io: u64) -> Command {
        let mut a = vec![("bytes", bytes.to_string()), ("io", io.to_string())];
        a.push(("aligned", "1".into()));
        match m {
            MEMCPY => {
                a.push(("shm", self.shm(&format!("mc-p{i}"))));
                a.push(("read", "0".into()));
                return self.io(false, "memcpy", &a);
            }
            REWRITE => {
                a.push(("path", self.shm(&format!("rw-p{i}.dat"))));
                a.push(("rewrite", "1".into()));
            }
            DISK => {
                a.push(("path", self.disk(&format!("w-p{i}.dat"))));
                a.push(("fsync", "1".into()));
            }
            TMPFS => a.push(("path", self.shm(&format!("w-p{i}.dat")))),
            _ => a.push(("path", self.path_in(m, &format!("w-p{i}-r{rep}.dat")))),
        }
        if m == PRELOAD {
            a.push(("warm", self.o.mount.clone()));
        }
        self.io(m == PRELOAD, "write", &a)
    }

    fn read_cmd(&self, m: &str, bytes: u64, io: u64) -> Command {
        let mut a = vec![("bytes", bytes.to_string()), ("io", io.to_string())];
        if m == MEMCPY {
            a.push(("shm", self.shm("mc-p0")));
            a.push(("read", "1".into()));
            return self.io(false, "memcpy", &a);
        }
        a.push(("path", self.path_in(m, "rd.dat")));
        a.push(("aligned", "1".into()));
        a.push(("period", (1u64 << 20).to_string()));
        if m == DISK_COLD {
            a.push(("dontneed", "1".into()));
        }
        if m == PRELOAD {
            a.push(("warm", self.o.mount.clone()));
        }
        self.io(m == PRELOAD, "read", &a)
    }

    fn check_mounts(&mut self) -> Res<()> {
        self.direct.check()?;
        self.kcache.check()
    }

    /// Runs one group for method `m`; returns the outcome and the mount daemon's CPU seconds.
    fn run_group(&mut self, m: &str, cmds: Vec<Command>, what: &str) -> Res<(Outcome, f64)> {
        let cpu0 = self.mount_of(m).map(Mount::cpu);
        let out = run_commands(cmds).map_err(|e| util::BenchError(format!("{what}: {e}")));
        let cpu1 = self.mount_of(m).map(Mount::cpu);
        self.check_mounts()?;
        let cpu = match (cpu0, cpu1) {
            (Some(a), Some(b)) => b - a,
            _ => f64::NAN,
        };
        Ok((out?, cpu))
    }

    /// A part of writes or reads: every method once per repetition, in rotating order.
    fn part(
        &mut self,
        res: &mut FResults,
        part: Part,
        methods: &[&str],
        procs: usize,
        io: u64,
    ) -> Res<()> {
        let bytes = if part == Part::Scaling {
            self.o.size / procs as u64
        } else {
            self.o.size
        };
        let mut s = Samples::default();
        for rep in 0..self.o.reps {
            for m in rotated(methods, rep) {
                let cmds: Vec<Command> = (0..procs)
                    .map(|i| {
                        if part.is_write() {
                            self.write_cmd(m, i, rep, bytes, io)
                        } else {
                            self.read_cmd(m, bytes, io)
                        }
                    })
                    .collect();
                let what = format!("{}: {m} with {procs} process(es)", part.title(io));
                let (out, cpu) = self.run_group(m, cmds, &what)?;
                let total = out.total_bytes() as f64;
                let per_gb = cpu.is_finite().then(|| cpu / (total / 1e9));
                let setup: Vec<f64> = out.children.iter().map(|c| c.setup_s).collect();
                let g = out.gbps();
                let mut line = format!("{g:7.2} GB/s");
                if m == DISK && part.is_write() {
                    let w = out.gbps_at("write_end");
                    s.add(DISK, w, None, &setup);
                    s.add(DISK_SYNC, g, None, &setup);
                    line = format!("{w:7.2} GB/s, with fsync {g:.2} GB/s");
                } else {
                    s.add(m, g, per_gb, &setup);
                }
                if let Some(c) = per_gb {
                    let _ = write!(line, " (mount daemon {c:.2} CPU s/GB)");
                }
                eprintln!(
                    "  [{}] {m:<13} procs={procs} rep {}/{}: {line}",
                    part_key(part),
                    rep + 1,
                    self.o.reps
                );
            }
        }
        res.rows.extend(s.rows(part, procs, io, bytes));
        Ok(())
    }

    /// cp of a /dev/shm file into each target: a freshly started, unmodified program.
    fn cp(&mut self, res: &mut FResults, src: &str) -> Res<()> {
        let methods = [TMPFS, FUSE, KCACHE, PRELOAD, DISK];
        let bytes = self.o.size;
        let mut s = Samples::default();
        for rep in 0..self.o.reps {
            for m in rotated(&methods, rep) {
                let name = format!("cp-r{rep}.dat");
                let dst = self.path_in(m, &name);
                let mut c = clean_cmd(Path::new(&self.o.cp));
                c.arg(src).arg(&dst);
                if m == PRELOAD {
                    c.env("LD_PRELOAD", &self.lib)
                        .env("CASCADE_STORE", &self.direct.store)
                        .env("CASCADE_MOUNT", &self.o.mount);
                }
                c.stdin(Stdio::null());
                util::settle();
                let cpu0 = self.mount_of(m).map(Mount::cpu);
                let t0 = now_ns();
                let out = c.output().ctx(|| format!("running {}", self.o.cp))?;
                let t1 = now_ns();
                let cpu1 = self.mount_of(m).map(Mount::cpu);
                self.check_mounts()?;
                if !out.status.success() {
                    return err(format!(
                        "cp {src} {dst} ({m}) failed ({}): {}",
                        out.status,
                        crate::procs::one_line(&out.stderr)
                    ));
                }
                // The copy must be where it belongs: in the store for preload (the host path
                // must not exist), else on the host (FUSE mounts included).
                let size = if m == PRELOAD {
                    if Path::new(&dst).exists() {
                        return err(format!("cp under LD_PRELOAD wrote {dst} on the host"));
                    }
                    let st = self.direct.store()?;
                    let n = st.stat(&format!("/{name}")).map(|m| m.size);
                    let _ = st.unlink(&format!("/{name}"));
                    n.ctx(|| format!("/{name} in the store after cp"))?
                } else {
                    let n = std::fs::metadata(&dst)
                        .map(|m| m.len())
                        .ctx(|| format!("stat {dst}"))?;
                    std::fs::remove_file(&dst).ctx(|| format!("removing {dst}"))?;
                    n
                };
                if size != bytes {
                    return err(format!("cp to {dst} ({m}): {size} bytes, expected {bytes}"));
                }
                let g = util::gbps(bytes, t1 - t0);
                let per_gb = match (cpu0, cpu1) {
                    (Some(a), Some(b)) => Some((b - a) / (bytes as f64 / 1e9)),
                    _ => None,
                };
                s.add(m, g, per_gb, &[]);
                eprintln!(
                    "  [cp] {m:<13} rep {}/{}: {g:7.2} GB/s{}",
                    rep + 1,
                    self.o.reps,
                    per_gb.map_or(String::new(), |c| format!(
                        " (mount daemon {c:.2} CPU s/GB)"
                    ))
                );
            }
        }
        res.rows.extend(s.rows(Part::Cp, 1, 0, bytes));
        Ok(())
    }

    /// Checks that the library serves the mount prefix from the store of `fuse`, and that
    /// each mount serves its store: a file created through each must be in the store.
    fn probe(&self) -> Res<()> {
        for (m, mount) in [
            (PRELOAD, &self.direct),
            (FUSE, &self.direct),
            (KCACHE, &self.kcache),
        ] {
            let name = format!("probe-{}", std::process::id());
            let path = self.path_in(m, &name);
            let out = self
                .io(m == PRELOAD, "probe", &[("path", path.clone())])
                .stdin(Stdio::null())
                .output()
                .ctx(|| "running pio probe")?;
            if !out.status.success() {
                return err(format!(
                    "{m}: could not create {path}: {}",
                    crate::procs::one_line(&out.stderr)
                ));
            }
            let st = mount.store()?;
            let n = st.stat(&format!("/{name}")).map(|x| x.size);
            let _ = st.unlink(&format!("/{name}"));
            if m == PRELOAD && Path::new(&path).exists() {
                let _ = std::fs::remove_file(&path);
                return err(format!(
                    "the library did not interpose: {path} went to the host file system"
                ));
            }
            match n {
                Ok(4096) => {}
                Ok(n) => return err(format!("{m}: {path} has {n} bytes in the store")),
                Err(e) => return err(format!("{m}: {path} is not in {} ({e})", mount.store)),
            }
        }
        Ok(())
    }
}

fn part_key(p: Part) -> &'static str {
    match p {
        Part::Writes => "writes",
        Part::SmallWrites => "small-writes",
        Part::Reads => "reads",
        Part::SmallReads => "small-reads",
        Part::Cp => "cp",
        Part::Scaling => "scaling",
    }
}

/// Writes `bytes` of the read pattern (1 MiB, seed 2, repeated) into a host file.
fn write_host_file(path: &str, bytes: u64, sync: bool) -> Res<()> {
    let mut block = vec![0u8; MIB as usize];
    fill_pattern(&mut block, 2);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(|| format!("creating {path}"))?;
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(MIB) as usize;
        f.write_all(&block[..n]).ctx(|| format!("writing {path}"))?;
        off += n as u64;
    }
    if sync {
        f.sync_all().ctx(|| format!("fsync {path}"))?;
    }
    Ok(())
}

fn write_store_file(st: &Store, path: &str, bytes: u64) -> Res<()> {
    let mut block = vec![0u8; MIB as usize];
    fill_pattern(&mut block, 2);
    let f = st
        .open(path, &OpenOptions::new().write(true).create_new(true))
        .ctx(|| format!("creating {path} in {}", st.name()))?;
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(MIB) as usize;
        f.write_all_at(&block[..n], off)
            .ctx(|| format!("writing {path} in {}", st.name()))?;
        off += n as u64;
    }
    Ok(())
}

/// Host files created for some parts, removed when dropped.
struct Files(Vec<String>);

impl Drop for Files {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn run_all(o: &FOpts, exe: &Path, bin: &Path, lib: &Path, res: &mut FResults) -> Res<()> {
    eprintln!(
        "stores ({} each, 2 x the file size), mounted with --threads {}:",
        size_str(o.capacity),
        o.threads
    );
    // Each FUSE target gets its own fresh store and mount; `Mount` unmounts and destroys it
    // when dropped, also after errors.
    let direct = Mount::start(o, bin, FUSE, false)?;
    let kcache = Mount::start(o, bin, KCACHE, true)?;
    let mut rig = Rig {
        o,
        exe: exe.to_path_buf(),
        lib: lib.to_path_buf(),
        direct,
        kcache,
    };
    let outcome = (|| -> Res<()> {
        rig.probe()?;
        let want = |p: Part| o.parts.contains(&p);
        let writers = [MEMCPY, TMPFS, REWRITE, FUSE, KCACHE, PRELOAD, DISK];
        let readers = [MEMCPY, TMPFS, FUSE, KCACHE, PRELOAD, DISK, DISK_COLD];
        if want(Part::Writes) || want(Part::SmallWrites) {
            // The rewrite target's file, its pages present.
            let rw = rig.shm("rw-p0.dat");
            write_host_file(&rw, o.size, false)?;
            let _files = Files(vec![rw]);
            for (p, io) in [(Part::Writes, MIB), (Part::SmallWrites, o.small)] {
                if want(p) {
                    eprintln!("{}, {} per file:", p.title(io), size_str(o.size));
                    rig.part(res, p, &writers, 1, io)?;
                }
            }
        }
        if want(Part::Reads) || want(Part::SmallReads) {
            // The files to read: tmpfs, disk (written with fsync, so in the page cache and
            // clean), and one in each store through the store API.
            let files = Files(vec![rig.shm("rd.dat"), rig.disk("rd.dat")]);
            write_host_file(&files.0[0], o.size, false)?;
            write_host_file(&files.0[1], o.size, true)?;
            write_store_file(rig.direct.store()?, "/rd.dat", o.size)?;
            write_store_file(rig.kcache.store()?, "/rd.dat", o.size)?;
            let r = (|| -> Res<()> {
                for (p, io) in [(Part::Reads, MIB), (Part::SmallReads, o.small)] {
                    if want(p) {
                        eprintln!("{}, {} file:", p.title(io), size_str(o.size));
                        rig.part(res, p, &readers, 1, io)?;
                    }
                }
                Ok(())
            })();
            for m in [&rig.direct, &rig.kcache] {
                if let Ok(st) = m.store() {
                    let _ = st.unlink("/rd.dat");
                }
            }
            drop(files);
            r?;
        }
        if want(Part::Cp) {
            let src = rig.shm("cp-src.dat");
            write_host_file(&src, o.size, false)?;
            let _files = Files(vec![src.clone()]);
            eprintln!(
                "cp of a {} file from /dev/shm ({}):",
                size_str(o.size),
                o.cp
            );
            rig.cp(res, &src)?;
        }
        if want(Part::Scaling) {
            eprintln!(
                "scaling: 1 MiB writes, {} in all split over the processes:",
                size_str(o.size)
            );
            for &p in &o.procs {
                rig.part(res, Part::Scaling, &[TMPFS, FUSE, KCACHE, PRELOAD], p, MIB)?;
            }
        }
        Ok(())
    })();
    let Rig {
        mut direct,
        mut kcache,
        ..
    } = rig;
    let c1 = direct.close();
    let c2 = kcache.close();
    res.mounts.push(direct.row.clone());
    res.mounts.push(kcache.row.clone());
    outcome?;
    c1?;
    c2
}

// ---------------------------------------------------------------------------------------------
// The subcommand.

/// Whether the VM reports freed guest memory to the host (virtio-balloon free page
/// reporting): then memory the guest frees goes back to the host, and the next first touch
/// of it faults on the host too, which makes fresh tmpfs pages expensive.
fn free_page_reporting() -> String {
    let Ok(rd) = std::fs::read_dir("/sys/bus/virtio/devices") else {
        return "no virtio devices".into();
    };
    for e in rd.filter_map(|e| e.ok()) {
        let dev = std::fs::read_to_string(e.path().join("device")).unwrap_or_default();
        if dev.trim() != "0x0005" {
            continue;
        }
        let f = std::fs::read_to_string(e.path().join("features")).unwrap_or_default();
        // One character per feature bit; VIRTIO_BALLOON_F_REPORTING is bit 5.
        return match f.as_bytes().get(5) {
            Some(b'1') => "on (virtio-balloon free page reporting: memory the guest frees is \
                           returned to the host)"
                .into(),
            Some(_) => "off (virtio-balloon without free page reporting)".into(),
            None => "unknown".into(),
        };
    }
    "no virtio balloon".into()
}

pub fn run(mut o: FOpts) -> Res<()> {
    let pid = std::process::id();
    o.resolve(pid)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return err("the fuse suite needs root (cascade mount uses mount(2))");
    }
    let dirs = vec![PathBuf::from("/var/tmp"), o.disk_dir.clone()];
    let _guard = crate::CleanupGuard::start(pid, dirs.clone(), &o.out)?;
    // Private copies of the CLI and the library: a rebuild of the workspace during the run
    // must not swap them.
    let base = Path::new("/var/tmp").join(prefix(pid));
    let exe = PathBuf::from(format!("{}-fuseio", base.display()));
    compile(&o.cc, include_str!("../preload/pio.c"), &exe)?;
    if !o.cascade.is_file() {
        return err(format!(
            "{} does not exist (cargo build --release -p cascade-cli -p cascade-preload)",
            o.cascade.display()
        ));
    }
    let bin = private_cli(&o.cascade, pid)?;
    let lib_src = o.cascade.with_file_name("libcascade.so");
    let lib = bin.with_file_name("libcascade.so");
    if !lib.is_file() {
        return err(format!(
            "{} does not exist (cargo build --release -p cascade-preload)",
            lib_src.display()
        ));
    }
    let has_mount = Command::new(&bin)
        .args(["mount", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_mount {
        return err(format!(
            "{} has no `mount` (rebuild it: cargo build --release -p cascade-cli -p cascade-preload)",
            o.cascade.display()
        ));
    }
    let clock = RunClock::start(&o.disk_dir, &o.disk_dir);
    eprintln!(
        "cascade-bench fuse: {} files, {} repetitions",
        size_str(o.size),
        o.reps
    );
    let mut results = FResults::default();
    let outcome = run_all(&o, &exe, &bin, &lib, &mut results);
    if let Err(e) = &outcome {
        results.notes.push(format!("the run stopped: {e}"));
    }
    let rep = Report {
        suite: "fuse",
        header: clock.finish(&[
            "crates/cascade-fuse",
            "crates/cascade-cli",
            "crates/cascade-store",
            "crates/cascade-preload",
            "bench",
        ]),
        cascade_cli: report::describe(&o.cascade),
        library: report::describe(&lib_src),
        cc: tool_version(&o.cc, &["--version"]),
        cp: tool_version(&o.cp, &["--version"]),
        free_page_reporting: free_page_reporting(),
        options: &o,
        targets: targets(&o, &results),
        results: &results,
    };
    let title = "Cascade FUSE front end (`cascade mount`) vs LD_PRELOAD, tmpfs and disk";
    report::write(&o.out, "fuse", title, &rep, tables(&rep))?;
    outcome
}

// ---------------------------------------------------------------------------------------------
// Report.

fn find<'a>(r: &'a FResults, part: Part, m: &str, procs: usize) -> Option<&'a Row> {
    r.rows
        .iter()
        .find(|x| x.part == part && x.method == m && x.procs == procs)
}

/// A per-repetition ratio: "0.42x [0.19–0.81]".
fn ratio_st(x: &Stats) -> String {
    let p = if x.median < 0.1 { 3 } else { 2 };
    if x.samples.len() <= 1 {
        format!("{:.p$}x", x.median)
    } else {
        format!("{:.p$}x [{:.p$}–{:.p$}]", x.median, x.min, x.max)
    }
}

fn targets(o: &FOpts, r: &FResults) -> Vec<Target> {
    let (measured, met) = match (
        find(r, Part::Writes, FUSE, 1),
        find(r, Part::Writes, TMPFS, 1),
    ) {
        (Some(f), Some(t)) => {
            let v = &f.vs_tmpfs;
            let k = find(r, Part::Writes, KCACHE, 1).map_or(String::new(), |k| {
                format!(
                    "; with --kernel-cache {:.2} GB/s, {}",
                    k.gbps.median,
                    ratio_st(&k.vs_tmpfs)
                )
            });
            let rw = match (&f.vs_tmpfs_rewrite, find(r, Part::Writes, REWRITE, 1)) {
                (Some(v), Some(w)) => format!(
                    ". Against overwriting an existing tmpfs file (no page allocation, {:.2} \
                     GB/s): {} per repetition",
                    w.gbps.median,
                    ratio_st(v)
                ),
                _ => String::new(),
            };
            (
                format!(
                    "**{:.2}x** [{:.2}–{:.2}] per repetition ({:.2} vs {:.2} GB/s, {} writes of {} \
                     into a new file{k}){rw}",
                    v.median,
                    v.min,
                    v.max,
                    f.gbps.median,
                    t.gbps.median,
                    size_str(f.io),
                    size_str(o.size)
                ),
                Some(v.median >= 0.5),
            )
        }
        _ => ("not run".to_string(), None),
    };
    vec![Target::new(
        "FUSE 1 MiB writes",
        ">= 0.5x write() into a new tmpfs file",
        measured,
        met,
    )]
}

/// The tables of fuse.md.
fn tables(rep: &Report) -> Md {
    let (o, r) = (rep.options, rep.results);
    let mut s = Md::default();
    for n in &r.notes {
        s.verdict(format!("not measured / failed: {n}"));
    }
    summary(&mut s, o, r);
    let mut t = Table::new("Stores and mounts", "target | store | memory | chunk | mounted after (s) | memory / that (GB/s) | burn-in (s) | `cascade mount` said | end");
    for m in &r.mounts {
        t.row([
            m.target.to_string(),
            m.store.clone(),
            size_str(m.capacity),
            size_str(m.chunk_size),
            format!("{:.2}", m.mount_s),
            format!("{:.2}", m.capacity as f64 / m.mount_s / 1e9),
            format!("{:.2}", m.burn_in_s),
            m.line.clone(),
            m.ended.clone(),
        ]);
    }
    s.push(t);
    for p in [
        Part::Writes,
        Part::SmallWrites,
        Part::Reads,
        Part::SmallReads,
        Part::Cp,
    ] {
        s.push(detail(o, r, p));
    }
    s.push(scaling(o, r));
    let threads = format!(
        "{} per mount (`cascade mount --threads {}`)",
        o.threads, o.threads
    );
    let extra = vec![
        (
            "local disk".to_string(),
            format!("{} ({})", o.disk_dir.display(), rep.header.machine.disk_fs),
        ),
        ("cascade CLI".into(), rep.cascade_cli.clone()),
        ("preloaded library".into(), rep.library.clone()),
        ("FUSE mount threads".into(), threads),
        ("C compiler".into(), rep.cc.clone()),
        ("cp".into(), rep.cp.clone()),
        (
            "freed memory back to the host".into(),
            rep.free_page_reporting.clone(),
        ),
    ];
    s.push(machine_table(&rep.header, extra));
    s.tables.retain(|t| !t.rows.is_empty());
    s
}

/// The matrix: every target by every part, GB/s and the ratio to tmpfs; and FUSE against the
/// preload library (the other way into the same store) as verdicts.
fn summary(s: &mut Md, o: &FOpts, r: &FResults) {
    let parts: Vec<Part> = [
        Part::Writes,
        Part::SmallWrites,
        Part::Reads,
        Part::SmallReads,
        Part::Cp,
    ]
    .into_iter()
    .filter(|&p| r.rows.iter().any(|x| x.part == p))
    .collect();
    let mut head = vec!["target".to_string()];
    head.extend(parts.iter().map(|p| p.title(o.small)));
    let mut t = Table::with_head("Summary: GB/s (vs tmpfs)", &head);
    for m in ORDER {
        if !r
            .rows
            .iter()
            .any(|x| x.method == m && parts.contains(&x.part))
        {
            continue;
        }
        let mut row = vec![m.to_string()];
        for &p in &parts {
            row.push(match (find(r, p, m, 1), find(r, p, TMPFS, 1)) {
                (Some(x), Some(t)) => format!(
                    "{:.2} ({})",
                    x.gbps.median,
                    ratio(x.gbps.median, t.gbps.median)
                ),
                (Some(x), None) => format!("{:.2}", x.gbps.median),
                _ => "—".into(),
            });
        }
        t.row(row);
    }
    s.push(t);
    for &p in &parts {
        for m in [FUSE, KCACHE] {
            if let (Some(f), Some(pl)) = (find(r, p, m, 1), find(r, p, PRELOAD, 1)) {
                let q = ratio(f.gbps.median, pl.gbps.median);
                s.verdict(format!("{} {m} vs preload: {q}", p.title(o.small)));
            }
        }
    }
}

fn cpu_cell(x: &Row) -> String {
    x.daemon_cpu_s_per_gb
        .as_ref()
        .map_or("".into(), |c| format!("{:.2}", c.median))
}

fn vs_cell(x: &Row) -> String {
    if x.method == TMPFS || x.vs_tmpfs.samples.is_empty() {
        return String::new();
    }
    ratio_st(&x.vs_tmpfs)
}

/// One part: every target against tmpfs and memcpy.
fn detail(o: &FOpts, r: &FResults, p: Part) -> Table {
    let w = p.is_write();
    let mut head = vec![
        "target",
        "GB/s",
        "vs tmpfs (medians)",
        "vs tmpfs (per repetition)",
    ];
    if w {
        head.push("vs tmpfs-rewrite (per repetition)");
    }
    head.extend(["vs memcpy", "mount daemon CPU s per GB", "set-up (s)"]);
    let mut t = Table::with_head(p.title(o.small), &head);
    let vs = |x: &Row, base: &str| {
        find(r, p, base, 1).map_or("n/a".into(), |b| ratio(x.gbps.median, b.gbps.median))
    };
    for x in r.rows.iter().filter(|x| x.part == p) {
        let mut row = vec![x.method.clone(), st(&x.gbps), vs(x, TMPFS), vs_cell(x)];
        if w {
            row.push(x.vs_tmpfs_rewrite.as_ref().map_or(String::new(), ratio_st));
        }
        row.extend([vs(x, MEMCPY), cpu_cell(x), format!("{:.3}", x.setup_s)]);
        t.row(row);
    }
    t
}

/// Writer processes: aggregate GB/s of 1 MiB writes by process count.
fn scaling(o: &FOpts, r: &FResults) -> Table {
    let methods = [TMPFS, FUSE, KCACHE, PRELOAD];
    let mut head = vec!["processes".to_string()];
    head.extend(methods.iter().map(|m| format!("{m} GB/s")));
    head.extend(methods[1..].iter().map(|m| format!("{m} vs tmpfs")));
    head.push("fuse daemon CPU s/GB".into());
    let mut t = Table::with_head("Writer processes: 1 MiB writes", &head);
    if !r.rows.iter().any(|x| x.part == Part::Scaling) {
        return t;
    }
    for &p in &o.procs {
        let mut row = vec![p.to_string()];
        let g = |m: &str| find(r, Part::Scaling, m, p);
        row.extend(methods.map(|m| g(m).map_or("n/a".into(), |x| st(&x.gbps))));
        let base = g(TMPFS).map(|x| x.gbps.median);
        for m in &methods[1..] {
            row.push(match (g(m), base) {
                (Some(x), Some(b)) => ratio(x.gbps.median, b),
                _ => "n/a".into(),
            });
        }
        row.push(g(FUSE).map_or(String::new(), cpu_cell));
        t.row(row);
    }
    t
}
