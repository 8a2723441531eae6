//! Child processes of the suites: the CLI with a clean environment, tied to the bench's life,
//! their CPU time, stopping them, and the C programs the suites compile.

use crate::util::{err, Context, Res};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A command of the CLI with only the given CASCADE_* settings: those of the caller (another
/// CASCADE_DURABLE, a CASCADE_FLUSH_EVERY) would change what is measured.
pub(crate) fn clean_cmd(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CASCADE_") {
            c.env_remove(key);
        }
    }
    c.env_remove("LD_PRELOAD");
    c
}

/// utime + stime of a process, in seconds.
pub(crate) fn cpu_s(pid: u32) -> Option<f64> {
    cpu_s_of(Path::new(&format!("/proc/{pid}/stat")))
}

/// utime + stime, in seconds, of every live process whose name (`comm`) is `name`: a server
/// the rig did not start itself, such as the S3 store in its network namespace.
pub(crate) fn cpu_s_named(name: &str) -> f64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    procs
        .flatten()
        .map(|p| p.path())
        .filter(|p| std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim_end() == name))
        .filter_map(|p| cpu_s_of(&p.join("stat")))
        .sum()
}

/// utime + stime from a `stat` file of /proc (a process's or a thread's).
fn cpu_s_of(path: &Path) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    Some((f.get(11)? + f.get(12)?) as f64 / 100.0)
}

/// The /proc/PID/task directories of the live threads of process `pid` whose names start
/// with one of `prefixes` (as far as the kernel keeps a name: 15 bytes).
fn threads_named(pid: u32, prefixes: &[&str]) -> Vec<PathBuf> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|t| t.path())
        .filter(|t| {
            std::fs::read_to_string(t.join("comm")).is_ok_and(|comm| {
                prefixes
                    .iter()
                    .any(|p| comm.starts_with(&p[..p.len().min(15)]))
            })
        })
        .collect()
}

/// utime + stime, in seconds, of the live threads of a process whose names start with one of
/// `prefixes` (threads that have exited are counted only in the process's total).
pub(crate) fn threads_cpu_s(pid: u32, prefixes: &[&str]) -> f64 {
    threads_named(pid, prefixes)
        .iter()
        .filter_map(|t| cpu_s_of(&t.join("stat")))
        .sum()
}

/// How long [`StageServer::wait_listening`] waits for a server's start-up prefault.
const PREFAULT_WAIT: Duration = Duration::from_secs(60);

/// Sends SIGTERM to a child and waits up to `secs` for it, then kills it.
pub(crate) fn terminate(child: &mut Child, what: &str, secs: u64) -> Res<()> {
    // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return err(format!("{what} did not exit within {secs} s of SIGTERM"));
            }
        }
    }
}

pub(crate) fn compile(cc: &str, src_text: &str, out: &Path) -> Res<()> {
    let src = out.with_extension("c");
    std::fs::write(&src, src_text).ctx(|| format!("writing {}", src.display()))?;
    let res = Command::new(cc)
        .args(["-O2", "-Wall", "-o"])
        .arg(out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .ctx(|| format!("running {cc}"));
    let _ = std::fs::remove_file(&src);
    let res = res?;
    if !res.status.success() {
        return err(format!(
            "{cc} -O2 {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    Ok(())
}

/// Makes the process `cmd` starts get SIGTERM when the bench dies.
pub(crate) fn die_with_bench(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; the child gets SIGTERM if the bench dies.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
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

/// Private copies of the CLI and of the library beside it (where `cascade run` looks for it)
/// in `/var/tmp/<prefix>-bin`: a rebuild of the workspace during the run must not swap them.
/// Returns the copied CLI.
pub(crate) fn private_cli(cascade: &Path, pid: u32) -> Res<PathBuf> {
    let dir = Path::new("/var/tmp").join(format!("{}-bin", crate::util::prefix(pid)));
    std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    let bin = dir.join("cascade");
    std::fs::copy(cascade, &bin)
        .ctx(|| format!("copying {} to {}", cascade.display(), bin.display()))?;
    let lib = cascade.with_file_name("libcascade.so");
    if lib.is_file() {
        std::fs::copy(&lib, dir.join("libcascade.so"))
            .ctx(|| format!("copying {}", lib.display()))?;
    }
    Ok(bin)
}

/// Starts `cmd` with stdin closed and stdout and stderr into a new file `log`, tied to the
/// bench's life.
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path, what: &str) -> Res<Child> {
    let out = std::fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
    let out2 = out.try_clone().ctx(|| format!("{what} log"))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(out2);
    die_with_bench(cmd);
    cmd.spawn().ctx(|| format!("starting {what}"))
}

/// Polls `ready` for 30 s at most, failing early when `alive` fails.
pub(crate) fn wait_ready<T>(
    what: &str,
    mut ready: impl FnMut() -> Option<T>,
    mut alive: impl FnMut() -> Res<()>,
) -> Res<T> {
    let found = cascade_testkit::poll(Duration::from_secs(30), || {
        ready().map(Ok).or_else(|| alive().err().map(Err))
    });
    found.unwrap_or_else(|| err(format!("{what} printed no start line within 30 s")))
}

/// The error of a child that has exited, with the end of its log.
fn exited(child: &mut Option<Child>, what: &str, log: &Path) -> Res<()> {
    if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
        *child = None;
        return err(format!("{what} exited ({status}): {}", tail(log, 5)));
    }
    Ok(())
}

/// `cascade stage-server` with its own arena directory and log; stopped and both removed
/// when dropped.
pub(crate) struct StageServer {
    child: Option<Child>,
    /// ADDR:PORT, from its start line.
    pub(crate) addr: String,
    dir: PathBuf,
    pub(crate) log: PathBuf,
}

impl StageServer {
    /// Starts `cascade stage-server -v --dir DIR ARGS...` (a fresh `dir`, its output in
    /// `log`); [`StageServer::wait_listening`] waits for its address.
    pub(crate) fn spawn(mut cmd: Command, dir: PathBuf, log: PathBuf, args: &[&str]) -> Res<Self> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        cmd.args(["stage-server", "-v", "--dir"])
            .arg(&dir)
            .args(args);
        let child = Some(spawn_logged(&mut cmd, &log, "cascade stage-server")?);
        Ok(StageServer {
            child,
            addr: String::new(),
            dir,
            log,
        })
    }

    /// Waits for the start line, `cascade stage-server: listening on ADDR ...` after the log
    /// line's timestamp and level (whole lines only: the start line may be read half written),
    /// then for the server's start-up prefault of its drain memory to end (its thread gone,
    /// at most [`PREFAULT_WAIT`]): with the 2 GiB default it keeps a core busy for 1-4 s, and
    /// a measurement that starts meanwhile shares the cores with it (`settle` waits 3 s at
    /// most).
    pub(crate) fn wait_listening(&mut self) -> Res<()> {
        const START: &str = "cascade stage-server: listening on ";
        let log = self.log.clone();
        let addr = wait_ready(
            "cascade stage-server",
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let whole = text.rfind('\n').map_or("", |end| &text[..end]);
                let line = whole
                    .lines()
                    .find_map(|l| l.find(START).map(|at| &l[at + START.len()..]))?;
                line.split_whitespace().next().map(str::to_string)
            },
            || exited(&mut self.child, "cascade stage-server", &self.log),
        )?;
        self.addr = addr;
        if let Some(pid) = self.pid() {
            use cascade_staging::server::threads::{PREFAULT, PUSH};
            // The start line comes before the server starts its threads; the push thread
            // starts after the prefault's.
            let since = Instant::now();
            while threads_named(pid, &[PUSH]).is_empty()
                || !threads_named(pid, &[PREFAULT]).is_empty()
            {
                if since.elapsed() >= PREFAULT_WAIT {
                    eprintln!(
                        "note: cascade stage-server {} still faults its drain memory in after {} s; measuring anyway",
                        self.addr,
                        PREFAULT_WAIT.as_secs()
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// An error with the end of its log if the server has exited.
    pub(crate) fn alive(&mut self) -> Res<()> {
        exited(
            &mut self.child,
            &format!("cascade stage-server {}", self.addr),
            &self.log,
        )
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then SIGKILL after 30 s.
    pub(crate) fn stop(&mut self) -> Res<()> {
        match self.child.take() {
            Some(mut c) => terminate(&mut c, "cascade stage-server", 30),
            None => Ok(()),
        }
    }
}

impl Drop for StageServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("cascade-bench: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A node store driven through the CLI with fixed CASCADE_* settings: `cascade init` (a store
/// of that name left by an interrupted run goes first), its agent, `cascade wait`. The agent
/// and the staging servers are stopped and the store destroyed when dropped.
pub(crate) struct Node {
    pub(crate) bin: PathBuf,
    env: Vec<(String, String)>,
    agent: Option<Child>,
    pub(crate) agent_log: PathBuf,
    pub(crate) servers: Vec<StageServer>,
    initialized: bool,
}

impl Node {
    /// `cascade init INIT_ARGS` with the settings `env` (CASCADE_STORE, CASCADE_DURABLE...).
    pub(crate) fn init(bin: &Path, env: &[(&str, &str)], init_args: &[&str]) -> Res<Node> {
        let pid = std::process::id();
        let mut node = Node {
            bin: bin.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            agent: None,
            agent_log: Path::new("/var/tmp")
                .join(format!("{}-agent.log", crate::util::prefix(pid))),
            servers: Vec::new(),
            initialized: false,
        };
        let _ = node.run_ok(&["destroy", "--force"]);
        node.run_ok(&[&["init"], init_args].concat())?;
        node.initialized = true;
        Ok(node)
    }

    /// A command of the CLI with this node's settings and no other CASCADE_* variables.
    pub(crate) fn cmd(&self) -> Command {
        let mut c = clean_cmd(&self.bin);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    pub(crate) fn run_ok(&self, args: &[&str]) -> Res<String> {
        let out = self
            .cmd()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ctx(|| format!("running cascade {}", args.join(" ")))?;
        if !out.status.success() {
            let (args, e) = (args.join(" "), one_line(&out.stderr));
            return err(format!(
                "cascade {args} failed ({}): {e}; {}",
                out.status,
                self.logs()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `cascade agent --verbose ARGS` with `env` on top of the node's settings and
    /// waits for its start line.
    pub(crate) fn start_agent(&mut self, args: &[&str], env: &[(&str, String)]) -> Res<()> {
        let mut cmd = self.cmd();
        cmd.args(["agent", "--verbose"])
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)));
        self.agent = Some(spawn_logged(&mut cmd, &self.agent_log, "cascade agent")?);
        let log = self.agent_log.clone();
        let started = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("cascade agent: store ").then_some(())
        };
        wait_ready("cascade agent", started, || self.alive())
    }

    pub(crate) fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// The end of the agent's log, and of the staging servers' logs.
    pub(crate) fn logs(&self) -> String {
        let mut s = format!("agent log: {}", tail(&self.agent_log, 3));
        for server in &self.servers {
            s += &format!(
                "; stage-server {} log: {}",
                server.addr,
                tail(&server.log, 3)
            );
        }
        s
    }

    /// An error if the agent or a staging server has exited.
    pub(crate) fn alive(&mut self) -> Res<()> {
        exited(&mut self.agent, "cascade agent", &self.agent_log)?;
        self.servers.iter_mut().try_for_each(StageServer::alive)
    }

    /// Runs `cascade wait PATH --level L` for each level at once and returns when each
    /// returned (CLOCK_MONOTONIC ns), failing early if one fails or the agent or a server
    /// exits meanwhile. Polling every millisecond adds at most a millisecond to what is
    /// measured.
    pub(crate) fn wait_levels(
        &mut self,
        path: &str,
        levels: &[&str],
        timeout_s: u64,
    ) -> Res<Vec<u64>> {
        let timeout = timeout_s.to_string();
        let mut waits = Vec::new();
        for level in levels {
            let args = ["wait", path, "--level", level, "--timeout", &timeout];
            let child = self
                .cmd()
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .ctx(|| format!("running cascade {}", args.join(" ")))?;
            waits.push((level, Some(child), 0u64));
        }
        let kill_all = |waits: &mut Vec<(&&str, Option<Child>, u64)>| {
            for c in waits.iter_mut().filter_map(|w| w.1.as_mut()) {
                let _ = c.kill();
                let _ = c.wait();
            }
        };
        loop {
            let mut failed = None;
            for (level, slot, at) in waits.iter_mut() {
                let Some(child) = slot.as_mut() else { continue };
                let Some(status) = child.try_wait().ctx(|| "waiting for cascade wait")? else {
                    continue;
                };
                *at = crate::util::now_ns();
                if !status.success() {
                    let mut text = Vec::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_end(&mut e, &mut text);
                    }
                    let e = one_line(&text);
                    failed = Some(format!(
                        "cascade wait {path} --level {level} failed ({status}): {e}"
                    ));
                    break;
                }
                *slot = None;
            }
            if waits.iter().all(|w| w.1.is_none()) {
                return Ok(waits.into_iter().map(|w| w.2).collect());
            }
            let failed = match failed {
                Some(e) => err(format!("{e}; {}", self.logs())),
                None => self.alive(),
            };
            if let Err(e) = failed {
                kill_all(&mut waits);
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// [`Node::wait_levels`] of one level.
    pub(crate) fn wait_level(&mut self, path: &str, level: &str, timeout_s: u64) -> Res<u64> {
        Ok(self.wait_levels(path, &[level], timeout_s)?[0])
    }

    /// Stops the agent (SIGTERM, SIGKILL after 30 s) and the servers, destroys the store.
    pub(crate) fn stop(&mut self) -> Res<()> {
        let stopped = match self.agent.take() {
            Some(mut a) => terminate(&mut a, "cascade agent", 30),
            None => Ok(()),
        };
        self.servers.clear();
        if std::mem::take(&mut self.initialized) {
            self.run_ok(&["destroy", "--force"])?;
        }
        stopped
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("cascade-bench: {e}");
        }
    }
}

/// The first line `PROG ARGS` prints (on stdout or stderr), or "not found".
pub(crate) fn tool_version(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog).args(args).stdin(Stdio::null()).output();
    let out = out.ok().filter(|o| o.status.success());
    let text = out.map(|o| String::from_utf8_lossy(&[o.stdout, o.stderr].concat()).into_owned());
    let line = text
        .as_deref()
        .and_then(|s| s.lines().map(str::trim).find(|l| !l.is_empty()));
    line.map_or_else(|| "not found".into(), str::to_string)
}
