//! `cascade demo`: Cascade's main job, end to end, on a real simulation.
//!
//! The bundled `examples/heat/heat.c` (a 2-D heat-equation solver that checkpoints like an
//! HPC code) is compiled into a fresh work dir and run four times:
//!
//! - A, baseline: straight to a directory on local disk (the stand-in for a parallel file
//!   system), uninterrupted, each checkpoint made durable with fsync (as on a parallel file
//!   system); its final grid checksum is the reference; then the same without fsync (the
//!   page cache);
//! - B, under `cascade run` with a durable store, SIGKILLed halfway through a checkpoint;
//! - C, under `cascade run` again: it restarts from the node store's memory;
//! - D, after the node store is destroyed and re-created: it restarts from the durable store
//!   through read-through;
//! - E (with `--mpi`): `examples/heat_mpi/heat_mpi.c` under `mpirun` on two simulated nodes
//!   (a node store and a node name each, two ranks each), stopped halfway, then restarted on
//!   a third node with three ranks from the job's checkpoint, complete only with both nodes'
//!   parts.
//!
//! Every program is run with `std::process::Command` (the `cascade` commands with this
//! executable), its output captured and shown abridged. The summary compares the
//! per-checkpoint stalls heat reports itself and gives PASS or FAIL per phase; the demo exits
//! 0 only when every phase passed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cascade_config::{format_size, parse_size};
use clap::Args;

use crate::failure::{Failure, EXIT_USAGE};

/// The simulation, compiled at run time with the system's C compiler.
const HEAT_C: &str = include_str!("../../../examples/heat/heat.c");
/// Its MPI version (phase E), compiled with mpicc.
const HEAT_MPI_C: &str = include_str!("../../../examples/heat_mpi/heat_mpi.c");
/// The helpers both include (written beside them in the work dir).
const HEAT_COMMON_H: &str = include_str!("../../../examples/heat/heat_common.h");
/// Phase E's simulated nodes: two for the job, a third for its restart.
const MPI_NODES: [&str; 3] = ["a", "b", "c"];
/// Where heat's checkpoints go under `cascade run`.
const MOUNT: &str = "/cascade";
/// Output lines of a program shown before and after the "..." of an abridged listing.
const HEAD: usize = 6;
const TAIL: usize = 3;
/// How long phase B and D wait for a checkpoint to reach the durable store.
const WAIT_SECONDS: &str = "60";

pub const ABOUT: &str = "Runs Cascade's main job end to end on a real simulation and \
checks the result: examples/heat/heat.c (a 2-D heat-equation solver that checkpoints every \
K steps into ckpt.<step>/{grid.bin,meta.txt} and restarts from its newest checkpoint) is \
compiled with cc into a fresh work dir and run four times:

  A  baseline: straight to a directory on local disk, the stand-in for a parallel file
     system, uninterrupted, with --fsync (each checkpoint on stable storage before the run
     goes on, as on a parallel file system); its final grid checksum is the reference; then
     the same without fsync (into the page cache)
  B  under 'cascade run --durable', killed (SIGKILL) halfway through writing a checkpoint
     in the middle of the run; the previous checkpoint is complete in the durable store
  C  under 'cascade run' again: it restarts from the node store's memory and finishes
  D  the node store is destroyed and re-created (the node was lost): heat restarts from the
     durable store (read-through) and finishes

C and D must end with the reference checksum, bit for bit. The summary compares, per \
checkpoint, how long heat stalled writing straight to disk (with and without fsync) and under \
Cascade (heat's own stall_ms numbers), with the GB/s of each and the node store's own \
steady-state write rate (measured by the demo at the end), and gives PASS or FAIL per phase; \
exit 0 only when every phase passed.

The demo uses its own store (/cascade-demo-<uid>, or --store NAME), removing a leftover one \
first, with --capacity of memory and no spill, and a work dir under $TMPDIR (or /var/tmp) \
that holds heat, the baseline's checkpoints and, unless --durable, the durable store; both \
are removed at the end unless --keep-work. It needs a C compiler (cc) and libcascade.so, \
found as 'cascade run' finds it.";

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Grid side: the grid is N x N doubles, so a checkpoint is 8*N*N bytes (2048: 32 MiB)
    #[arg(
        long,
        default_value_t = 2048,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(3..=65536)
    )]
    pub n: u32,
    /// Time steps to simulate
    #[arg(
        long,
        default_value_t = 200,
        value_name = "S",
        value_parser = clap::value_parser!(u32).range(2..=999_999)
    )]
    pub steps: u32,
    /// Checkpoint every K steps (at least two checkpoints: K at most S/2)
    #[arg(
        long,
        default_value_t = 20,
        value_name = "K",
        value_parser = clap::value_parser!(u32).range(1..=999_999)
    )]
    pub every: u32,
    /// Memory of the demo's node store (at least four checkpoints)
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    pub capacity: String,
    /// Durable store: a directory, or s3://bucket/prefix?endpoint=URL
    /// [default: a directory in the work dir]
    #[arg(long, value_name = "URL")]
    pub durable: Option<String>,
    /// Keep the work dir and the store at the end (and say where they are)
    #[arg(long)]
    pub keep_work: bool,
    /// Print only the summary: the global -q/--quiet (set by main)
    #[arg(skip)]
    pub quiet: bool,
    /// Also run phase E: the MPI solver on two simulated nodes, restarted on a third with
    /// another number of ranks (needs Open MPI: mpicc, mpirun)
    #[arg(long)]
    pub mpi: bool,
}

/// `cascade [--store NAME] [--config FILE] demo ...`.
pub fn demo(
    args: &DemoArgs,
    store: Option<&str>,
    config: Option<&Path>,
) -> Result<ExitCode, Failure> {
    let (checkpoints, checkpoint_bytes) = checkpoint_sizes(args)?;
    let cascade = std::env::current_exe().map_err(|e| Failure::io("the cascade executable", &e))?;
    // Fails now, in one line, rather than in phase B.
    crate::run::find_preload_lib()?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let store = store.map_or_else(|| format!("/cascade-demo-{uid}"), str::to_string);
    let work = make_work_dir(uid)?;

    let mut env = store_env(args, &store, &work, config);
    let cleanup = Arc::new(Cleanup {
        cascade: cascade.clone(),
        env: env.clone(),
        work: work.clone(),
        keep: args.keep_work,
        done: Mutex::new(false),
    });
    forward_signals_to_cleanup(Arc::clone(&cleanup))?;

    let durable = match &args.durable {
        Some(url) => url.clone(),
        None => work.join("pfs/cascade").display().to_string(),
    };
    env.push(("CASCADE_DURABLE", durable.clone().into()));
    let mut demo = Demo {
        args,
        cascade,
        env,
        work: work.clone(),
        heat: work.join("heat"),
        store,
        durable,
        job: String::new(),
        checkpoints,
        checkpoint_bytes,
        checks: Vec::new(),
    };
    let result = demo.run();
    // A step that failed because an interrupt killed its program: the signal thread ends it.
    drop(step());
    if args.keep_work {
        eprintln!(
            "cascade: demo: kept the work dir {} and the store {} (remove them with \
             'cascade --store {} destroy --force; rm -rf {}')",
            work.display(),
            demo.store,
            demo.store,
            work.display()
        );
    }
    cleanup.run();
    result
}

/// The number of checkpoints and a checkpoint's size, once the arguments make at least
/// two checkpoints and the store's memory holds four.
fn checkpoint_sizes(args: &DemoArgs) -> Result<(u32, u64), Failure> {
    let checkpoints = args.steps / args.every;
    if checkpoints < 2 {
        return Err(Failure {
            message: format!(
                "demo: --steps {} with --every {} makes {checkpoints} checkpoint(s); the demo \
                 needs at least 2",
                args.steps, args.every
            ),
            code: EXIT_USAGE,
        });
    }
    let checkpoint_bytes = 8 * u64::from(args.n) * u64::from(args.n);
    let capacity = parse_size(&args.capacity).map_err(|e| Failure {
        message: format!("demo: --capacity {:?}: {e}", args.capacity),
        code: EXIT_USAGE,
    })?;
    if capacity < 4 * checkpoint_bytes {
        return Err(Failure {
            message: format!(
                "demo: --capacity {} is too small for checkpoints of {} (--n {}): give at \
                 least four checkpoints' worth, {}",
                args.capacity,
                format_size(checkpoint_bytes),
                args.n,
                format_size(4 * checkpoint_bytes)
            ),
            code: EXIT_USAGE,
        });
    }
    Ok((checkpoints, checkpoint_bytes))
}

/// The environment of the programs the demo runs: its store, its mount and its settings
/// (the caller adds the durable store).
fn store_env(
    args: &DemoArgs,
    store: &str,
    work: &Path,
    config: Option<&Path>,
) -> Vec<(&'static str, OsString)> {
    let mut env: Vec<(&'static str, OsString)> = vec![
        ("CASCADE_STORE", store.into()),
        ("CASCADE_MOUNT", MOUNT.into()),
        ("CASCADE_CAPACITY", args.capacity.clone().into()),
        ("CASCADE_SPILL_SIZE", "0".into()),
        ("CASCADE_SPILL_PATH", work.join("store.spill").into()),
        ("CASCADE_KEEP", "2".into()),
        ("CASCADE_FLUSH_EVERY", "1".into()),
    ];
    if let Some(config) = config {
        env.push(("CASCADE_CONFIG", config.into()));
    }
    env
}

/// A fresh directory `cascade-demo-<uid>-<pid>` under $TMPDIR, or /var/tmp (a disk, unlike
/// /tmp on many systems).
fn make_work_dir(uid: u32) -> Result<PathBuf, Failure> {
    let base = std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let base =
        std::path::absolute(&base).map_err(|e| Failure::io(&base.display().to_string(), &e))?;
    let work = base.join(format!("cascade-demo-{uid}-{}", std::process::id()));
    // A leftover of an earlier process with the same pid.
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("pfs"))
        .map_err(|e| Failure::io(&work.display().to_string(), &e))?;
    Ok(work)
}

/// Removes the demo's store and work dir, once: at the end, or when the demo is interrupted.
struct Cleanup {
    cascade: PathBuf,
    env: Vec<(&'static str, OsString)>,
    work: PathBuf,
    keep: bool,
    done: Mutex<bool>,
}

impl Cleanup {
    fn run(&self) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        if *done || self.keep {
            return;
        }
        *done = true;
        let _ = Command::new(&self.cascade)
            .args(["destroy", "--force"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for node in MPI_NODES {
            let _ = Command::new(&self.cascade)
                .args(["destroy", "--force", "--store", &mpi_store(&self.env, node)])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The store of phase E's simulated node `node`: the demo's store name with the node's.
fn mpi_store(env: &[(&'static str, OsString)], node: &str) -> String {
    let store = env
        .iter()
        .find(|(k, _)| *k == "CASCADE_STORE")
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{store}-node-{node}")
}

/// The process group of the program the demo is running (each runs in a group of its own),
/// 0 when none: what an interrupt kills.
static RUNNING: AtomicI32 = AtomicI32::new(0);
/// Set once a signal asked the demo to stop.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Held by the main thread during each step that can write into the work dir (a program
/// running, the durable store being opened), so that an interrupt's clean-up runs between
/// steps and nothing recreates what it removes.
static STEP: Mutex<()> = Mutex::new(());

/// Starts a step; after an interrupt, waits for the signal thread to end the process.
fn step() -> MutexGuard<'static, ()> {
    let guard = STEP.lock().unwrap_or_else(PoisonError::into_inner);
    if INTERRUPTED.load(Ordering::SeqCst) {
        drop(guard);
        loop {
            std::thread::park();
        }
    }
    guard
}

/// SIGINT, SIGTERM and SIGHUP kill the running program (and its children), remove the store
/// and the work dir and end the demo with 128 + the signal.
fn forward_signals_to_cleanup(cleanup: Arc<Cleanup>) -> Result<(), Failure> {
    // SAFETY: plain signal-set manipulation on a local set; blocked in this thread before
    // any other starts, so only the waiting thread takes these signals (children get an
    // empty mask from std's spawn).
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Failure::io(
                "blocking signals",
                &std::io::Error::from_raw_os_error(rc),
            ));
        }
        set
    };
    std::thread::Builder::new()
        .name("demo-signals".to_string())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: `set` is an initialised signal set and `signal` a valid out-pointer.
            while unsafe { libc::sigwait(&set, &mut signal) } != 0 {}
            INTERRUPTED.store(true, Ordering::SeqCst);
            let group = RUNNING.load(Ordering::SeqCst);
            if group > 0 {
                // SAFETY: signalling the process group of a child we started.
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
            // The current step ends once its program is dead; no other starts.
            let _step = STEP.lock().unwrap_or_else(PoisonError::into_inner);
            cleanup.run();
            eprintln!("cascade: demo interrupted");
            std::process::exit(128 + signal);
        })
        .map_err(|e| Failure::io("starting the signal thread", &e))?;
    Ok(())
}

/// What a program printed and how it ended.
struct Ran {
    status: ExitStatus,
    /// Standard output, each line with when it arrived.
    stdout: Vec<(Instant, String)>,
    stderr: String,
    ended: Instant,
}

impl Ran {
    fn lines(&self) -> impl Iterator<Item = &str> {
        self.stdout.iter().map(|(_, l)| l.as_str())
    }

    /// "exit 0", "exit 137", "killed by signal 9".
    fn how(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            _ => "ended".to_string(),
        }
    }

    /// heat's own complaints on stderr (a failed cascade_commit, say): "heat: ..." lines.
    fn heat_warnings(&self) -> Option<String> {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("heat: "))
            .collect();
        (!lines.is_empty()).then(|| lines.join(" / "))
    }

    /// The last line on stderr, or how it ended: for a one-line reason.
    fn reason(&self) -> String {
        match self.stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!("{} ({line})", self.how()),
            None => self.how(),
        }
    }
}

/// What heat printed: see the header of examples/heat/heat.c.
#[derive(Default)]
struct HeatOutput {
    /// `restarted from ckpt.X step=S`: ckpt.X.
    restarted_from: Option<String>,
    fresh: bool,
    /// step -> (stall ms, when the line arrived)
    stalls: BTreeMap<u32, (f64, Instant)>,
    fnv: Option<String>,
}

/// The value of `key=value` among a line's words.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn parse_heat(ran: &Ran) -> HeatOutput {
    let mut out = HeatOutput::default();
    for (at, line) in &ran.stdout {
        if let Some(rest) = line.strip_prefix("restarted from ") {
            out.restarted_from = rest.split_whitespace().next().map(str::to_string);
        } else if line == "starting fresh" {
            out.fresh = true;
        } else if line.starts_with("checkpoint ") {
            let step = field(line, "step").and_then(|s| s.parse().ok());
            let ms = field(line, "stall_ms").and_then(|s| s.parse().ok());
            if let (Some(step), Some(ms)) = (step, ms) {
                out.stalls.insert(step, (ms, *at));
            }
        } else if line.starts_with("final ") {
            out.fnv = field(line, "fnv1a64").map(str::to_string);
        }
    }
    out
}

struct Check {
    phase: &'static str,
    pass: bool,
    detail: String,
}

struct Demo<'a> {
    args: &'a DemoArgs,
    cascade: PathBuf,
    env: Vec<(&'static str, OsString)>,
    work: PathBuf,
    heat: PathBuf,
    store: String,
    durable: String,
    /// heat's checkpoint directory below the mount, without the leading '/': "heat".
    job: String,
    checkpoints: u32,
    checkpoint_bytes: u64,
    checks: Vec<Check>,
}

impl Demo<'_> {
    fn say(&self, text: impl AsRef<str>) {
        if !self.args.quiet {
            println!("{}", text.as_ref());
        }
    }

    fn heading(&self, text: impl AsRef<str>) {
        self.say(format!("\n== {}", text.as_ref()));
    }

    /// `text` with the work dir shown as $WORK.
    fn short(&self, text: &str) -> String {
        text.replace(&self.work.display().to_string(), "$WORK")
    }

    fn check(&mut self, phase: &'static str, pass: bool, detail: String) {
        self.say(format!(
            "{}  {phase}: {}",
            if pass { "PASS" } else { "FAIL" },
            self.short(&detail)
        ));
        self.checks.push(Check {
            phase,
            pass,
            detail,
        });
    }

    fn heat_args(&self, dir: &str) -> Vec<String> {
        self.heat_args_to(dir, self.args.steps)
    }

    /// heat's arguments for a run that ends at step `steps`.
    fn heat_args_to(&self, dir: &str, steps: u32) -> Vec<String> {
        let a = self.args;
        vec![
            "--dir".to_string(),
            dir.to_string(),
            "--n".to_string(),
            a.n.to_string(),
            "--steps".to_string(),
            steps.to_string(),
            "--every".to_string(),
            a.every.to_string(),
        ]
    }

    /// Runs a program in a process group of its own, in the demo's environment, showing
    /// the command and its output (abridged to `max` lines of each stream).
    fn execute(
        &self,
        program: &Path,
        shown_name: &str,
        args: &[String],
        max: usize,
    ) -> Result<Ran, Failure> {
        let _step = step();
        let shown = self.short(&format!("$ {shown_name} {}", args.join(" ")));
        self.say(&shown);
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = command.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound && shown_name == "cc" {
                Failure::new(
                    "demo: cc not found: install a C compiler (apt-get install build-essential)",
                )
            } else {
                Failure::io(&format!("demo: {shown_name}"), &e)
            }
        })?;
        RUNNING.store(i32::try_from(child.id()).unwrap_or(0), Ordering::SeqCst);
        let mut stderr_pipe = child.stderr.take();
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(pipe) = stderr_pipe.as_mut() {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
            text
        });
        let mut stdout = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            for line in BufReader::new(pipe).split(b'\n') {
                let Ok(line) = line else { break };
                stdout.push((Instant::now(), String::from_utf8_lossy(&line).into_owned()));
            }
        }
        let status = child
            .wait()
            .map_err(|e| Failure::io(&format!("demo: waiting for {shown_name}"), &e))?;
        let ended = Instant::now();
        RUNNING.store(0, Ordering::SeqCst);
        let stderr = stderr_reader.join().unwrap_or_default();
        let ran = Ran {
            status,
            stdout,
            stderr,
            ended,
        };
        let out: Vec<&str> = ran.lines().collect();
        self.show(&out, max, "");
        let err: Vec<&str> = ran.stderr.lines().collect();
        self.show(&err, max, "stderr: ");
        if !ran.status.success() {
            self.say(format!("    ({})", ran.how()));
        }
        Ok(ran)
    }

    /// Shows lines indented, at most `max` of them: the first and the last few.
    fn show(&self, lines: &[&str], max: usize, prefix: &str) {
        let max = max.max(HEAD + TAIL + 1);
        if lines.len() <= max {
            for line in lines {
                self.say(self.short(&format!("    {prefix}{line}")));
            }
            return;
        }
        for line in &lines[..HEAD] {
            self.say(self.short(&format!("    {prefix}{line}")));
        }
        self.say(format!(
            "    {prefix}... ({} more lines)",
            lines.len() - HEAD - TAIL
        ));
        for line in &lines[lines.len() - TAIL..] {
            self.say(self.short(&format!("    {prefix}{line}")));
        }
    }

    fn cascade(&self, args: &[&str]) -> Result<Ran, Failure> {
        self.cascade_showing(args, 12)
    }

    /// `cascade ARGS`, showing at most `max` lines of its output.
    fn cascade_showing(&self, args: &[&str], max: usize) -> Result<Ran, Failure> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.execute(&self.cascade, "cascade", &args, max)
    }

    /// `cascade run --durable URL -- heat --dir /cascade/<job> ... EXTRA`.
    fn heat_under_cascade(&self, extra: &[String]) -> Result<Ran, Failure> {
        let mut args = vec![
            "run".to_string(),
            "--durable".to_string(),
            self.durable.clone(),
            "--".to_string(),
            self.heat.display().to_string(),
        ];
        args.extend(self.heat_args(&format!("{MOUNT}/{}", self.job)));
        args.extend(["--keep".to_string(), "0".to_string()]);
        args.extend(extra.iter().cloned());
        self.execute(&self.cascade, "cascade", &args, 14)
    }

    /// `cascade init` of the demo's store (memory only); `doing` names it in the failure.
    fn init_store(&self, doing: &str) -> Result<(), Failure> {
        let created = self.cascade(&[
            "init",
            "--capacity",
            &self.args.capacity,
            "--spill-size",
            "0",
        ])?;
        if !created.status.success() {
            return Err(Failure::new(format!(
                "demo: {doing} the store {} failed: cascade init {}",
                self.store,
                created.reason()
            )));
        }
        Ok(())
    }

    /// `cascade wait CKPT --level durable`, for at most WAIT_SECONDS.
    fn wait_durable(&self, ckpt: &str) -> Result<Ran, Failure> {
        self.cascade(&[
            "wait",
            ckpt,
            "--level",
            "durable",
            "--timeout",
            WAIT_SECONDS,
        ])
    }

    fn ckpt(step: u32) -> String {
        format!("ckpt.{step:06}")
    }

    /// The step of heat's last checkpoint.
    fn last_step(&self) -> u32 {
        self.checkpoints * self.args.every
    }

    /// Phase B kills heat halfway through the checkpoint of this step, past the middle of
    /// the run.
    fn kill_step(&self) -> u32 {
        self.args.every * (self.checkpoints / 2 + 1)
    }

    /// The checkpoint before the kill: complete in the durable store, where C restarts.
    fn before_kill_step(&self) -> u32 {
        self.kill_step() - self.args.every
    }

    /// heat's checkpoint directory in the store: "/heat".
    fn job_dir(&self) -> String {
        format!("/{}", self.job)
    }

    fn run(&mut self) -> Result<ExitCode, Failure> {
        self.introduce();
        self.prepare_store()?;
        self.build_heat()?;
        let (baseline, reference) = self.phase_a()?;
        let phase_b = self.phase_b()?;
        let (phase_c, drained) = self.phase_c(&reference)?;
        self.phase_d(&reference)?;
        if self.args.mpi {
            self.phase_e(&reference)?;
        }
        let store_rate = self.store_write_rate();
        self.summary(&baseline, &phase_b, &phase_c, drained, store_rate);
        self.verdict()
    }

    /// What the demo runs, and where.
    fn introduce(&self) {
        let a = self.args;
        self.say(format!(
            "Cascade demo: heat (examples/heat/heat.c), a 2-D heat-equation simulation on a \
             {n} x {n} grid, {steps} steps,\na checkpoint of {size} every {every} steps \
             ({c} checkpoints), written straight to disk, then under Cascade.",
            n = a.n,
            steps = a.steps,
            size = format_size(self.checkpoint_bytes),
            every = a.every,
            c = self.checkpoints,
        ));
        self.say(format!("  WORK     {}", self.work.display()));
        self.say(format!(
            "  store    {} ({} of memory, no spill)",
            self.store, a.capacity
        ));
        self.say(format!(
            "  durable  {}",
            self.short(&cascade_secret::redact_url(&self.durable))
        ));
    }

    /// Removes a leftover store of an interrupted demo and picks the job's directory.
    fn prepare_store(&mut self) -> Result<(), Failure> {
        let _ = Command::new(&self.cascade)
            .args(["destroy", "--force"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.job = self.free_job_name()?;
        Ok(())
    }

    /// Compiles heat.c into the work dir.
    fn build_heat(&self) -> Result<(), Failure> {
        self.heading("build the simulation");
        for (name, text) in [("heat.c", HEAT_C), ("heat_common.h", HEAT_COMMON_H)] {
            let source = self.work.join(name);
            std::fs::write(&source, text)
                .map_err(|e| Failure::io(&source.display().to_string(), &e))?;
        }
        let cc: Vec<String> = ["-O2", "-o", "heat", "heat.c", "-lm", "-ldl"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let built = self.execute(Path::new("cc"), "cc", &cc, 12)?;
        if !built.status.success() {
            return Err(Failure::new(format!(
                "demo: compiling heat.c failed: {}",
                built.reason()
            )));
        }
        Ok(())
    }

    /// A: heat straight to local disk, each checkpoint made durable with fsync (what a
    /// checkpoint on a parallel file system has to wait for), then the same without fsync
    /// (into the page cache); returns both outputs and the reference checksum.
    fn phase_a(&mut self) -> Result<(Baselines, String), Failure> {
        self.heading(
            "A. baseline: heat writes its checkpoints straight to a directory on local disk \
             ($WORK/pfs stands in for the parallel file system), no Cascade: with --fsync \
             (each checkpoint on stable storage before the run goes on), then without",
        );
        let direct_dir = self.work.join("pfs/heat").display().to_string();
        let mut args = self.heat_args(&direct_dir);
        args.extend(["--keep".to_string(), "2".to_string(), "--fsync".to_string()]);
        let ran = self.execute(&self.heat, "./heat", &args, 14)?;
        let synced = parse_heat(&ran);
        let Some(reference) = synced.fnv.clone().filter(|_| ran.status.success()) else {
            return Err(Failure::new(format!(
                "demo: phase A (baseline) failed: heat {}",
                ran.reason()
            )));
        };
        let cached_dir = self.work.join("pfs/heat-cached").display().to_string();
        let mut args = self.heat_args(&cached_dir);
        args.extend(["--keep".to_string(), "2".to_string()]);
        let ran = self.execute(&self.heat, "./heat", &args, 4)?;
        let cached = parse_heat(&ran);
        let _ = std::fs::remove_dir_all(&cached_dir);
        if on_tmpfs(&self.work) {
            self.say(
                "note: $WORK is on tmpfs (memory): fsync costs nothing there, so both baselines \
                 are optimistic for a parallel file system",
            );
        }
        let complete = |h: &HeatOutput| h.stalls.len() == self.checkpoints as usize;
        let same = cached.fnv.as_deref() == Some(reference.as_str());
        self.check(
            "A baseline",
            complete(&synced) && complete(&cached) && same && ran.status.success(),
            format!(
                "{} of {} checkpoints written straight to disk with fsync, {} without \
                 (fnv1a64 {}); reference fnv1a64={reference}",
                synced.stalls.len(),
                self.checkpoints,
                cached.stalls.len(),
                if same { "the same" } else { "DIFFERENT" },
            ),
        );
        Ok((Baselines { synced, cached }, reference))
    }

    /// The node store's steady-state write rate, measured the way a checkpoint is written
    /// but from this process, with the chunks already mapped in: a file of one checkpoint's
    /// size written from one buffer (in heat's 8 MiB writes), closed and removed, three
    /// times; the fastest round, in bytes per second. None if the store cannot be used.
    fn store_write_rate(&self) -> Option<f64> {
        let store = cascade_store::Store::attach(&self.store).ok()?;
        let buf = vec![0x5au8; usize::try_from(self.checkpoint_bytes).ok()?];
        let path = "/.cascade-demo-rate";
        let mut best: Option<f64> = None;
        for _ in 0..3 {
            let started = Instant::now();
            let opts = cascade_store::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true);
            let file = store.open(path, &opts).ok()?;
            let mut offset = 0usize;
            for piece in buf.chunks(8 << 20) {
                file.write_at(piece, offset as u64).ok()?;
                offset += piece.len();
            }
            drop(file);
            let seconds = started.elapsed().as_secs_f64();
            let _ = store.unlink(path);
            let rate = self.checkpoint_bytes as f64 / seconds.max(1e-9);
            best = Some(best.map_or(rate, |b: f64| b.max(rate)));
        }
        best
    }

    /// B: heat under Cascade, SIGKILLed halfway through a checkpoint; the one before must
    /// reach the durable store complete.
    fn phase_b(&mut self) -> Result<HeatOutput, Failure> {
        let kill_at = self.kill_step();
        self.heading(format!(
            "B. under Cascade, killed (SIGKILL) halfway through writing the checkpoint of step \
             {kill_at}"
        ));
        self.init_store("creating")?;
        let killed =
            self.heat_under_cascade(&["--kill-at-step".to_string(), kill_at.to_string()])?;
        let phase_b = parse_heat(&killed);
        let job_dir = self.job_dir();
        let durable_ckpt = format!("{job_dir}/{}", Self::ckpt(self.before_kill_step()));
        if !self.args.quiet {
            self.cascade_showing(&["ls", "--levels", &job_dir], 24)?;
        }
        let waited = self.wait_durable(&durable_ckpt)?;
        let marker = self.durable_complete(&durable_ckpt);
        let (pass, detail) = self.killed_verdict(&killed, &waited, marker);
        self.check("B killed mid-checkpoint", pass, detail);
        Ok(phase_b)
    }

    /// Whether B ended as it should: heat killed, and the checkpoint before the kill in
    /// the durable store with its completion marker.
    fn killed_verdict(
        &self,
        killed: &Ran,
        waited: &Ran,
        marker: Result<bool, String>,
    ) -> (bool, String) {
        let kill_at = self.kill_step();
        let before_kill = self.before_kill_step();
        match (killed.status.code(), waited.status.success(), marker) {
            (Some(137), _, _) if killed.heat_warnings().is_some() => {
                (false, killed.heat_warnings().unwrap_or_default())
            }
            (Some(137), true, Ok(true)) => (
                true,
                format!(
                    "killed at step {kill_at} (exit 137); {} is complete in the durable store",
                    Self::ckpt(before_kill)
                ),
            ),
            (Some(137), true, Ok(false)) => (
                false,
                format!(
                    "{} is durable but has no completion marker (was it committed? \
                     libcascade.so needs cascade_commit)",
                    Self::ckpt(before_kill)
                ),
            ),
            (Some(137), true, Err(e)) => (false, format!("reading the durable store: {e}")),
            (Some(137), false, _) => (
                false,
                format!(
                    "{} did not become durable: cascade wait {}",
                    Self::ckpt(before_kill),
                    waited.reason()
                ),
            ),
            _ => (
                false,
                format!(
                    "cascade run should have ended with exit 137 (heat killed), got {}",
                    killed.reason()
                ),
            ),
        }
    }

    /// C: the same command without the kill restarts from the node store's memory; returns
    /// its output and how long the drain took after heat's last checkpoint.
    fn phase_c(&mut self, reference: &str) -> Result<(HeatOutput, Option<f64>), Failure> {
        self.heading("C. restart from memory: the same command, without the kill");
        let restarted = self.heat_under_cascade(&[])?;
        let phase_c = parse_heat(&restarted);
        let want = Self::ckpt(self.before_kill_step());
        let detail = if !restarted.status.success() {
            Err(format!("cascade run {}", restarted.reason()))
        } else if let Some(warnings) = restarted.heat_warnings() {
            Err(warnings)
        } else {
            self.restart_verdict(&phase_c, &want, reference)
        };
        self.check_result("C restart from memory", detail);
        // From heat's last checkpoint line to `cascade run` exiting, which it does once the
        // job's checkpoints are in the durable store.
        let drained = phase_c
            .stalls
            .get(&self.last_step())
            .filter(|_| restarted.status.success())
            .map(|(_, at)| restarted.ended.duration_since(*at).as_secs_f64());
        Ok((phase_c, drained))
    }

    /// D: the node store is destroyed and re-created; heat restarts from the durable store
    /// through read-through.
    fn phase_d(&mut self, reference: &str) -> Result<(), Failure> {
        self.heading(
            "D. the node is lost: destroy the node store, create an empty one, restart from \
             the durable store",
        );
        let last = self.last_step();
        let job_dir = self.job_dir();
        let final_ckpt = format!("{job_dir}/{}", Self::ckpt(last));
        let waited = self.wait_durable(&final_ckpt)?;
        self.cascade(&["destroy", "--force"])?;
        self.init_store("re-creating")?;
        let recovered = self.heat_under_cascade(&[])?;
        let phase_d = parse_heat(&recovered);
        if !self.args.quiet {
            self.cascade_showing(&["ls", "--levels", &job_dir], 24)?;
        }
        let detail = self.recovered_verdict(&waited, &recovered, &phase_d, reference);
        self.check_result("D restart from the durable store", detail);
        Ok(())
    }

    /// E: the MPI solver on nodes a and b (two ranks each, a store each) runs to the middle
    /// checkpoint; its checkpoints are complete only with both nodes' parts. Then the same
    /// job restarts on node c with three ranks and ends on the reference grid.
    fn phase_e(&mut self, reference: &str) -> Result<(), Failure> {
        self.heading(
            "E. an MPI job on two nodes (two ranks each), restarted on a third node with three \
             ranks",
        );
        self.build_heat_mpi()?;
        let half = self.before_kill_step();
        let first = self.heat_mpi(&[("a", 2), ("b", 2)], half)?;
        let restarted = self.heat_mpi(&[("c", 3)], self.args.steps)?;
        let detail = self.mpi_verdict(&first, &restarted, half, reference);
        self.check_result("E MPI job on two nodes, restart on a third", detail);
        Ok(())
    }

    /// Compiles heat_mpi.c into the work dir with mpicc.
    fn build_heat_mpi(&self) -> Result<(), Failure> {
        let source = self.work.join("heat_mpi.c");
        std::fs::write(&source, HEAT_MPI_C)
            .map_err(|e| Failure::io(&source.display().to_string(), &e))?;
        let args: Vec<String> = ["-O2", "-o", "heat_mpi", "heat_mpi.c", "-lm", "-ldl"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let built = self.execute(Path::new("mpicc"), "mpicc", &args, 12)?;
        if !built.status.success() {
            return Err(Failure::new(format!(
                "demo: compiling heat_mpi.c failed (--mpi needs Open MPI: apt-get install \
                 openmpi-bin libopenmpi-dev): {}",
                built.reason()
            )));
        }
        Ok(())
    }

    /// `mpirun` of heat_mpi under `cascade run` to step `steps`, `ranks` ranks on each
    /// simulated node of `nodes`, in the job "demo" of those nodes.
    fn heat_mpi(&self, nodes: &[(&str, u32)], steps: u32) -> Result<Ran, Failure> {
        let mut args: Vec<String> = vec!["-q".to_string(), "--oversubscribe".to_string()];
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            args.push("--allow-run-as-root".to_string());
        }
        let names: Vec<&str> = nodes.iter().map(|(n, _)| *n).collect();
        let job = [
            // Debian's Open MPI 4.1 can hang in its own finalize without it (openpmix#1233);
            // in every app context's environment, as mpirun's -x reaches only the first.
            "PMIX_MCA_gds=hash".to_string(),
            format!("CASCADE_JOB=demo-{}", std::process::id()),
            "CASCADE_JOB_NAME=demo".to_string(),
            format!("CASCADE_JOB_NODES={}", names.join(",")),
        ];
        for (i, (node, ranks)) in nodes.iter().enumerate() {
            if i > 0 {
                args.push(":".to_string());
            }
            args.extend(["-np".to_string(), ranks.to_string(), "env".to_string()]);
            args.extend(job.iter().cloned());
            args.push(format!("CASCADE_STORE={}", mpi_store(&self.env, node)));
            args.push(format!("CASCADE_NODE={node}"));
            // Every simulated node's ranks run on this one host: mpirun's local size counts
            // them all.
            args.push(format!("CASCADE_NODE_RANKS={ranks}"));
            args.extend([
                self.cascade.display().to_string(),
                "run".to_string(),
                "--".to_string(),
                self.work.join("heat_mpi").display().to_string(),
            ]);
            args.extend(self.heat_args_to(&format!("{MOUNT}/{}-mpi", self.job), steps));
            args.extend(["--commit-by".to_string(), "node".to_string()]);
        }
        self.execute(Path::new("mpirun"), "mpirun", &args, 14)
    }

    /// Whether E ended as it should: the first run's last checkpoint is complete with both
    /// nodes' parts, and the restart on node c began there and ended on the reference grid.
    fn mpi_verdict(
        &self,
        first: &Ran,
        restarted: &Ran,
        half: u32,
        reference: &str,
    ) -> Result<String, String> {
        if !first.status.success() {
            return Err(format!("mpirun on nodes a and b {}", first.reason()));
        }
        if !restarted.status.success() {
            return Err(format!("mpirun on node c {}", restarted.reason()));
        }
        let ckpt = format!("{}-mpi/{}", self.job, Self::ckpt(half));
        let nodes = self.job_marker_nodes(&ckpt)?;
        if nodes != ["a", "b"] {
            return Err(format!(
                "the marker of {ckpt} names the nodes {nodes:?}, not a and b"
            ));
        }
        let out = parse_heat(restarted);
        self.restart_verdict(&out, &Self::ckpt(half), reference)
            .map(|d| format!("{ckpt} complete with the parts of nodes a and b; on node c {d}"))
    }

    /// The nodes the marker of the MPI job's checkpoint `ckpt` names (below the job's
    /// namespace, <user>/demo).
    fn job_marker_nodes(&self, ckpt: &str) -> Result<Vec<String>, String> {
        let _step = step();
        let user = cascade_config::job::sanitized(&cascade_config::machine::user_name());
        let url = cascade_config::job::namespaced_url(&self.durable, &format!("{user}/demo"));
        let durable = crate::lifecycle::open_durable(&url).map_err(|f| f.message)?;
        match durable.read_marker(ckpt) {
            Ok(Some(marker)) => Ok(marker.nodes),
            Ok(None) => Err(format!(
                "{ckpt} is not complete in {}",
                cascade_secret::redact_url(&url)
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether D ended as it should: the last checkpoint was durable before the node store
    /// was lost, and heat restarted from it through read-through.
    fn recovered_verdict(
        &self,
        waited: &Ran,
        recovered: &Ran,
        phase_d: &HeatOutput,
        reference: &str,
    ) -> Result<String, String> {
        let last = self.last_step();
        if !waited.status.success() {
            Err(format!(
                "{} was not in the durable store before the node store was destroyed: {}",
                Self::ckpt(last),
                waited.reason()
            ))
        } else if !recovered.status.success() {
            Err(format!("cascade run {}", recovered.reason()))
        } else if let Some(warnings) = recovered.heat_warnings() {
            Err(warnings)
        } else if phase_d.fresh {
            Err(format!(
                "heat found no {MOUNT}/{}/latest and started fresh: read-through did not fetch \
                 it from the durable store (libcascade.so without read-through?)",
                self.job
            ))
        } else {
            self.restart_verdict(phase_d, &Self::ckpt(last), reference)
                .map(|d| format!("{d}; its files came from the durable store"))
        }
    }

    /// Success when every phase passed, else a failure naming the phases that did not.
    fn verdict(&self) -> Result<ExitCode, Failure> {
        let failed: Vec<String> = self
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| format!("{}: {}", c.phase, c.detail))
            .collect();
        if failed.is_empty() {
            Ok(ExitCode::SUCCESS)
        } else {
            Err(Failure::new(format!("demo failed: {}", failed.join("; "))))
        }
    }

    fn check_result(&mut self, phase: &'static str, result: Result<String, String>) {
        match result {
            Ok(detail) => self.check(phase, true, detail),
            Err(detail) => self.check(phase, false, detail),
        }
    }

    /// Whether a restarted run started where it should and ended on the reference grid.
    fn restart_verdict(
        &self,
        out: &HeatOutput,
        want: &str,
        reference: &str,
    ) -> Result<String, String> {
        let from = out.restarted_from.as_deref().unwrap_or("nothing (fresh)");
        if from != want {
            return Err(format!("heat restarted from {from}, expected {want}"));
        }
        match out.fnv.as_deref() {
            Some(fnv) if fnv == reference => Ok(format!(
                "restarted from {from}; final fnv1a64={fnv}, the same as the uninterrupted run"
            )),
            Some(fnv) => Err(format!(
                "restarted from {from} but ended with fnv1a64={fnv}, not the reference {reference}"
            )),
            None => Err("heat printed no final line".to_string()),
        }
    }

    /// A checkpoint directory name below the mount that the durable store has nothing under:
    /// "heat", else "heat.2", ... (a --durable URL may hold an earlier demo's checkpoints,
    /// which heat would restart from).
    fn free_job_name(&self) -> Result<String, Failure> {
        let _step = step();
        let durable = crate::lifecycle::open_durable(&self.durable).map_err(|f| {
            Failure::new(format!(
                "demo: durable store {}: {}",
                self.durable, f.message
            ))
        })?;
        for i in 1..100 {
            let name = if i == 1 {
                "heat".to_string()
            } else {
                format!("heat.{i}")
            };
            let used = durable.list(&format!("{name}/")).map_err(|e| {
                Failure::new(format!(
                    "demo: durable store {}: {e}",
                    cascade_secret::redact_url(&self.durable)
                ))
            })?;
            if used.is_empty() {
                return Ok(name);
            }
        }
        Err(Failure::new(format!(
            "demo: durable store {} already holds heat, heat.2 ... heat.99: give an empty one",
            self.durable
        )))
    }

    fn durable_complete(&self, ckpt: &str) -> Result<bool, String> {
        let _step = step();
        let durable = crate::lifecycle::open_durable(&self.durable).map_err(|f| f.message)?;
        durable
            .is_complete(&cascade_durable::DurableKey::from_store_path(ckpt))
            .map_err(|e| e.to_string())
    }

    fn summary(
        &self,
        baseline: &Baselines,
        phase_b: &HeatOutput,
        phase_c: &HeatOutput,
        drained: Option<f64>,
        store_rate: Option<f64>,
    ) {
        let a = self.args;
        if !a.quiet {
            println!();
        }
        println!(
            "== Summary: heat, {n} x {n} grid, {size} per checkpoint, {c} checkpoints",
            n = a.n,
            size = format_size(self.checkpoint_bytes),
            c = self.checkpoints
        );
        let means = Self::stall_table(baseline, phase_b, phase_c);
        let gbps = |ms: f64| self.checkpoint_bytes as f64 / (ms / 1e3) / 1e9;
        let compare = |direct: f64, cascade: f64| {
            if direct >= cascade {
                format!("{:.1}x shorter", direct / cascade)
            } else {
                format!("{:.1}x longer", cascade / direct)
            }
        };
        if let (Some(synced), Some(cached), Some(c)) = (means.synced, means.cached, means.cascade) {
            if c > 0.0 {
                println!(
                    "the mean stall under Cascade is {} than writing straight to disk with fsync \
                     (a checkpoint on stable storage, as a parallel file system must have it), \
                     {} than writing into the page cache without fsync",
                    compare(synced, c),
                    compare(cached, c)
                );
                println!(
                    "per checkpoint: {:.2} GB/s to disk with fsync, {:.2} GB/s into the page \
                     cache, {:.2} GB/s under Cascade (steady state, without each run's first \
                     checkpoint: {}){}",
                    gbps(synced),
                    gbps(cached),
                    gbps(c),
                    means
                        .cascade_steady
                        .map_or("-".to_string(), |m| format!("{:.2} GB/s", gbps(m))),
                    store_rate.map_or(String::new(), |r| format!(
                        "; the node store's own steady-state write rate {:.2} GB/s",
                        r / 1e9
                    ))
                );
            }
        }
        println!("(B) run B, before the kill; (C) run C, after the restart");
        if let Some(seconds) = drained {
            println!(
                "last checkpoint in the durable store at most {seconds:.3} s after heat wrote it \
                 (heat's last checkpoint line to 'cascade run' exiting, which waits for the drain)"
            );
        }
        for c in &self.checks {
            println!(
                "{}  phase {}: {}",
                if c.pass { "PASS" } else { "FAIL" },
                c.phase,
                self.short(&c.detail)
            );
        }
    }

    /// Prints heat's stall per checkpoint, straight to disk (with and without fsync) and
    /// under Cascade (B, then C for the steps B did not reach), with their means; returns the
    /// means.
    fn stall_table(baseline: &Baselines, phase_b: &HeatOutput, phase_c: &HeatOutput) -> Means {
        println!("stall per checkpoint (heat's stall_ms: creating the directory, writing grid.bin and meta.txt, commit, rename onto latest; with fsync: each file and directory synced)");
        println!(
            "{:>8}  {:>18}  {:>18}  {:>18}",
            "step", "disk + fsync ms", "page cache ms", "under Cascade ms"
        );
        let mut cascade_stalls: BTreeMap<u32, (f64, &str)> = BTreeMap::new();
        for (step, (ms, _)) in &phase_b.stalls {
            cascade_stalls.insert(*step, (*ms, "B"));
        }
        for (step, (ms, _)) in &phase_c.stalls {
            cascade_stalls.entry(*step).or_insert((*ms, "C"));
        }
        let steps: std::collections::BTreeSet<u32> = baseline
            .synced
            .stalls
            .keys()
            .chain(baseline.cached.stalls.keys())
            .chain(cascade_stalls.keys())
            .copied()
            .collect();
        let ms_of = |h: &HeatOutput, step: &u32| {
            h.stalls
                .get(step)
                .map_or_else(|| "-".to_string(), |(ms, _)| format!("{ms:.2}"))
        };
        for step in &steps {
            let cascade = cascade_stalls
                .get(step)
                .map_or_else(|| "-".to_string(), |(ms, p)| format!("{ms:.2} ({p})"));
            println!(
                "{step:>8}  {:>18}  {:>18}  {cascade:>18}",
                ms_of(&baseline.synced, step),
                ms_of(&baseline.cached, step)
            );
        }
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let means = Means {
            synced: mean(baseline.synced.stalls.values().map(|(ms, _)| *ms).collect()),
            cached: mean(baseline.cached.stalls.values().map(|(ms, _)| *ms).collect()),
            cascade: mean(cascade_stalls.values().map(|(ms, _)| *ms).collect()),
            // Each process's first checkpoint maps fresh chunks of the store into it; the
            // rest show the rate a long run sees.
            cascade_steady: mean(
                [phase_b, phase_c]
                    .iter()
                    .flat_map(|h| h.stalls.values().skip(1).map(|(ms, _)| *ms))
                    .collect(),
            ),
        };
        let show = |m: Option<f64>| m.map_or_else(|| "-".to_string(), |m| format!("{m:.2}"));
        println!(
            "{:>8}  {:>18}  {:>18}  {:>18}",
            "mean",
            show(means.synced),
            show(means.cached),
            show(means.cascade)
        );
        means
    }
}

/// Phase A's two runs straight to disk.
struct Baselines {
    /// With --fsync: every checkpoint on stable storage inside its stall.
    synced: HeatOutput,
    /// Without: the checkpoint ends in the page cache.
    cached: HeatOutput,
}

/// Mean stalls in ms.
struct Means {
    synced: Option<f64>,
    cached: Option<f64>,
    cascade: Option<f64>,
    /// Under Cascade without each run's first checkpoint.
    cascade_steady: Option<f64>,
}

/// Whether `path` is on a tmpfs (memory), which makes the baseline even more optimistic.
fn on_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills a zeroed struct from a NUL-terminated path.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
    }
}
