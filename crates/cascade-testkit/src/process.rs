//! Child processes of a test: commands run to the end with a timeout ([`run_with_timeout`],
//! [`output_within`], [`wait_output`]) and background daemons ([`Daemon`]) whose stderr is
//! collected line by line, always killed and reaped when the test ends.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wait::{poll, POLL};

/// A finished command: its status, its output as text and how long it ran.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.status.success()
    }

    /// Non-empty stderr lines, log lines without their timestamp and level.
    pub fn err_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(log_message)
            .collect()
    }
}

/// Gives `cmd` the default action for the signals a shell makes a background job ignore
/// (SIGINT and SIGQUIT), and for SIGHUP, which `nohup` ignores. A test of what a signal does
/// to a program then asserts the same, whether the test runs from a terminal or from a
/// background job or batch script, whose children inherit "ignored" through exec.
pub fn with_default_signal_actions(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec and only calls signal(2), which is
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
                if libc::signal(signal, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    }
}

/// The number of seconds a log line gives right after `after` (`... in 2.4 s ...`),
/// failing the test when there is none.
#[track_caller]
pub fn seconds_after(line: &str, after: &str) -> f64 {
    line.split_once(after)
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("no seconds after {after:?} in {line:?}"))
}

/// A text log line of the agent or a staging server without its timestamp and level
/// (`2026-01-02T03:04:05.678901Z  WARN cascade agent: ...` -> `cascade agent: ...`), so that
/// tests read messages as they are worded; other lines as they are.
pub fn log_message(line: &str) -> &str {
    let Some((stamp, rest)) = line.split_once(' ') else {
        return line;
    };
    let is_stamp = stamp.len() > 20
        && stamp.ends_with('Z')
        && stamp.as_bytes()[4] == b'-'
        && stamp.as_bytes()[10] == b'T'
        && stamp[..4].bytes().all(|b| b.is_ascii_digit());
    if !is_stamp {
        return line;
    }
    let rest = rest.trim_start();
    for level in ["TRACE ", "DEBUG ", "INFO ", "WARN ", "ERROR "] {
        if let Some(message) = rest.strip_prefix(level) {
            return message;
        }
    }
    line
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {:.2} s\n--- stdout:\n{}--- stderr:\n{}",
            self.status, self.seconds, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to the end, killing it after `timeout` (a hang is a failure, not a stuck test).
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Out {
    let started = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let readers = [stdout.map(read_all_thread), stderr.map(read_all_thread)];
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output: Output = match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            signal(pid, libc::SIGKILL);
            let _ = rx.recv();
            panic!("{cmd:?} did not finish within {timeout:?}");
        }
    };
    // Bounded: a descendant that outlived the command (an orphaned job) may hold the pipes.
    let [o, e] = readers.map(|r| {
        r.and_then(|rx| rx.recv_timeout(Duration::from_secs(5)).ok())
            .unwrap_or_else(|| "(output still held open by a descendant)\n".to_string())
    });
    Out {
        status: output.status,
        stdout: o,
        stderr: e,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Runs `cmd` to the end (stdin closed, stdout and stderr collected), killing it and failing
/// the test after `timeout`.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    wait_output(child, timeout).unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs `cmd` (within `timeout`), which must succeed and print one number: that number.
/// `what` names it in the failure message.
pub fn number_printed_by(cmd: Command, timeout: Duration, what: &str) -> u64 {
    let out = output_within(cmd, timeout);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{what}: {stdout:?}"))
}

/// Waits for `child` to end and collects what it wrote to its piped stdout and stderr; after
/// `timeout` it is killed (SIGKILL) and the error says so.
pub fn wait_output(child: Child, timeout: Duration) -> Result<Output, String> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("waiting for pid {pid}: {e}")),
        Err(_) => {
            // Not reaped yet: the waiting thread has not returned, so the pid is still ours.
            signal(pid, libc::SIGKILL);
            Err(format!("pid {pid} did not finish within {timeout:?}"))
        }
    }
}

fn read_all_thread<R: Read + Send + 'static>(mut r: R) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        let _ = tx.send(String::from_utf8_lossy(&s).into_owned());
    });
    rx
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(pid as i32, sig) };
}

/// What a [`Daemon`] has printed on stderr: whole lines, and the unfinished last line (only
/// for the log: a line is not read before its newline, the way a half-written start line
/// once gave an address of "127.").
#[derive(Default)]
struct Stderr {
    /// Log lines as [`log_message`] gives them.
    lines: Vec<String>,
    /// The lines as printed.
    raw: Vec<String>,
    unfinished: String,
}

/// A background process (an agent, a server, a writer) whose stderr lines are collected as
/// they come; killed with SIGKILL and reaped on drop.
pub struct Daemon {
    child: Option<Child>,
    /// What it is, for messages ("cascade agent").
    pub what: String,
    stderr: Arc<Mutex<Stderr>>,
    reader: Option<JoinHandle<()>>,
}

impl Daemon {
    /// Spawns `cmd` with stdin and stdout closed and stderr collected.
    pub fn spawn(mut cmd: Command, what: &str) -> Daemon {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let stderr = Arc::new(Mutex::new(Stderr::default()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            let mut pipe = BufReader::new(pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                match pipe.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line);
                let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
                match text.strip_suffix('\n') {
                    Some(whole) => {
                        sink.lines.push(log_message(whole).to_string());
                        sink.raw.push(whole.to_string());
                    }
                    // End of the pipe in the middle of a line.
                    None => sink.unfinished = text.into_owned(),
                }
            }
        });
        Daemon {
            child: Some(child),
            what: what.to_string(),
            stderr,
            reader: Some(reader),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// The whole stderr lines printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines
            .clone()
    }

    /// The whole stderr lines printed so far as printed (log lines with their timestamp and
    /// level).
    pub fn raw_lines(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .raw
            .clone()
    }

    /// Everything printed on stderr so far, an unfinished last line included.
    pub fn log(&self) -> String {
        let stderr = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let mut log = stderr.lines.join("\n");
        if !stderr.unfinished.is_empty() {
            log.push('\n');
            log.push_str(&stderr.unfinished);
        }
        log
    }

    /// Waits for a whole stderr line that satisfies `pred` and returns it; fails the test
    /// if the process exits without printing it or `timeout` passes.
    pub fn wait_line(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                return l;
            }
            if let Some(status) = self.try_wait() {
                // It may have printed the line just before exiting.
                self.drain_stderr();
                if let Some(l) = self.lines().into_iter().find(|l| pred(l)) {
                    return l;
                }
                panic!(
                    "{} exited ({status}) before printing {what}; its stderr:\n{}",
                    self.what,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {} to print {what}; its stderr:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(POLL);
        }
    }

    /// After the exit: lets the reader collect what is left in the pipe. Bounded, because a
    /// child of the process (a job orphaned by `cascade run`) may hold the pipe open.
    fn drain_stderr(&mut self) {
        let reader = &self.reader;
        poll(Duration::from_secs(2), || {
            reader
                .as_ref()
                .is_none_or(|r| r.is_finished())
                .then_some(())
        });
        if self.reader.as_ref().is_some_and(|r| r.is_finished()) {
            if let Some(r) = self.reader.take() {
                let _ = r.join();
            }
        }
    }

    /// The exit status if it has exited (reaped).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn alive(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            signal(c.id(), sig);
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        self.wait(Duration::from_secs(30))
    }

    /// SIGTERM, then reap (SIGKILL after `timeout`, failing the test).
    pub fn term(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(timeout)
    }

    /// Waits for the exit (SIGKILL and a failure after `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                self.drain_stderr();
                return status;
            }
            if Instant::now() >= deadline {
                self.signal(libc::SIGKILL);
                let _ = self.child.as_mut().map(|c| c.wait());
                panic!(
                    "{} did not exit within {timeout:?}; its stderr:\n{}",
                    self.what,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}
