//! The parent side of a multi-process run: spawn one child per job (this same executable,
//! hidden `child` subcommand), wait until every child is READY, then release them all at once
//! with one "GO" line on each stdin pipe (the barrier), collect their results, and only then
//! close the pipes so that they clean up and exit.

use crate::child::{ChildResult, Job};
use crate::util::{err, gbps, now_ns, BenchError, Context, Res};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The outcome of one group run.
pub struct Outcome {
    /// The common start: when the parent released the barrier.
    pub t0: u64,
    pub children: Vec<ChildResult>,
}

impl Outcome {
    pub fn total_bytes(&self) -> u64 {
        self.children.iter().map(|c| c.bytes).sum()
    }
    /// Aggregate bandwidth: total bytes / (last finish - common start), GB/s.
    pub fn gbps(&self) -> f64 {
        let last = self
            .children
            .iter()
            .map(|c| c.end_ns)
            .max()
            .unwrap_or(self.t0);
        gbps(self.total_bytes(), last.saturating_sub(self.t0))
    }
    /// Same, with the finish taken at a mark (e.g. "write_end" = before fsync).
    pub fn gbps_at(&self, mark: &str) -> f64 {
        let last = self
            .children
            .iter()
            .map(|c| c.marks.get(mark).copied().unwrap_or(c.end_ns))
            .max()
            .unwrap_or(self.t0);
        gbps(self.total_bytes(), last.saturating_sub(self.t0))
    }
    /// Seconds from the common start to the last process's `mark` (its finish if it has none).
    pub fn seconds_at(&self, mark: &str) -> f64 {
        let last = self
            .children
            .iter()
            .map(|c| c.marks.get(mark).copied().unwrap_or(c.end_ns))
            .max()
            .unwrap_or(self.t0);
        last.saturating_sub(self.t0) as f64 / 1e9
    }
    /// Seconds from the common start to the last finish.
    pub fn seconds(&self) -> f64 {
        let last = self
            .children
            .iter()
            .map(|c| c.end_ns)
            .max()
            .unwrap_or(self.t0);
        last.saturating_sub(self.t0) as f64 / 1e9
    }
}

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    done: bool,
}

/// Kills (by their own pid) and reaps children that did not finish, e.g. after an error.
struct Group(Vec<Running>);

impl Drop for Group {
    fn drop(&mut self) {
        for r in &mut self.0 {
            if !r.done {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }
}

fn child_failed(r: &mut Running, i: usize, what: &str) -> BenchError {
    let status = match r.child.wait() {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    };
    r.done = true;
    BenchError(format!(
        "child {i} {what} ({status}); its error is printed above"
    ))
}

/// Runs `jobs` as concurrent child processes with a common start.
pub fn run_group(jobs: &[Job]) -> Res<Outcome> {
    let cmds = jobs.iter().map(job_command).collect::<Res<Vec<_>>>()?;
    run_commands(cmds)
}

/// The command that runs `job` in a child process (this executable, `child` subcommand).
pub fn job_command(job: &Job) -> Res<Command> {
    let exe = std::env::current_exe().ctx(|| "finding the bench executable")?;
    let json = serde_json::to_string(job).ctx(|| "encoding a job")?;
    let mut cmd = Command::new(&exe);
    cmd.arg("child").arg("--job").arg(&json);
    Ok(cmd)
}

/// Runs `cmds` as concurrent child processes with a common start. Each must speak the
/// children's protocol (READY, wait for GO, one JSON result line, wait for EOF on stdin):
/// the bench's own `child` subcommand, or the C program of the interposition benchmarks.
pub fn run_commands(cmds: Vec<Command>) -> Res<Outcome> {
    let mut group = Group(Vec::with_capacity(cmds.len()));
    for mut cmd in cmds {
        let prog = cmd.get_program().to_string_lossy().into_owned();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .ctx(|| format!("spawning {prog}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let Some(stdout) = stdout else {
            return err("spawned child has no stdout pipe");
        };
        group.0.push(Running {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            done: false,
        });
    }
    // Wait for everyone to finish set-up.
    for i in 0..group.0.len() {
        let r = &mut group.0[i];
        let mut line = String::new();
        let n = r
            .stdout
            .read_line(&mut line)
            .ctx(|| format!("reading READY from child {i}"))?;
        if n == 0 || line.trim() != "READY" {
            return Err(child_failed(r, i, "failed during set-up"));
        }
    }
    // Let the machine calm down first (the children are blocked and idle now).
    crate::util::settle();
    // Release: one short write per pipe, back to back (microseconds for all children).
    let t0 = now_ns();
    for i in 0..group.0.len() {
        let r = &mut group.0[i];
        if let Some(stdin) = r.stdin.as_mut() {
            stdin
                .write_all(b"GO\n")
                .and_then(|()| stdin.flush())
                .ctx(|| format!("releasing child {i}"))?;
        }
    }
    let mut children = Vec::with_capacity(group.0.len());
    for i in 0..group.0.len() {
        let r = &mut group.0[i];
        let mut line = String::new();
        let n = r
            .stdout
            .read_line(&mut line)
            .ctx(|| format!("reading the result of child {i}"))?;
        if n == 0 {
            return Err(child_failed(r, i, "failed while running"));
        }
        let res: ChildResult = serde_json::from_str(line.trim())
            .ctx(|| format!("parsing the result of child {i}: {line:?}"))?;
        if res.start_ns < t0 {
            return err(format!("child {i} started before the barrier was released"));
        }
        children.push(res);
    }
    // Everyone is done: let them clean up (EOF on stdin) and exit.
    for r in &mut group.0 {
        drop(r.stdin.take());
    }
    for i in 0..group.0.len() {
        let r = &mut group.0[i];
        let status = r.child.wait().ctx(|| format!("waiting for child {i}"))?;
        r.done = true;
        if !status.success() {
            return err(format!("child {i} exited with {status} after its run"));
        }
    }
    Ok(Outcome { t0, children })
}

/// The median per-process set-up time of some runs.
pub fn median_setup(out: &[Outcome]) -> f64 {
    let v: Vec<f64> = out
        .iter()
        .flat_map(|o| o.children.iter().map(|c| c.setup_s))
        .collect();
    crate::util::Stats::of(&v).median
}

/// Unique names of the run's objects: `<prefix>-<what>-<i>-<counter>`.
pub struct Names {
    pub pid: u32,
    pub counter: u64,
}

impl Names {
    pub fn next(&mut self, what: &str, i: usize) -> String {
        self.counter += 1;
        format!(
            "{}-{what}-{i}-{}",
            crate::util::prefix(self.pid),
            self.counter
        )
    }
}

/// Phase `j` over all processes: (name, from the first start to the last end in ns, mean
/// per-process duration in ns).
pub fn phase_span(out: &Outcome, j: usize) -> Res<(String, u64, f64)> {
    let mut first = u64::MAX;
    let mut last = 0;
    let mut sum = 0.0;
    let mut name = String::new();
    for c in &out.children {
        let Some((m, s, e)) = c.phases.get(j) else {
            return err(format!("a child reported no phase {j}"));
        };
        first = first.min(*s);
        last = last.max(*e);
        sum += e.saturating_sub(*s) as f64;
        name.clone_from(m);
    }
    Ok((
        name,
        last.saturating_sub(first),
        sum / out.children.len().max(1) as f64,
    ))
}

/// The phases of paired runs by round: GB/s of each method in each round, `per_round`
/// phases a round, `bytes` moved by all processes in one phase.
pub struct Rounds(Vec<std::collections::BTreeMap<String, f64>>);

impl Rounds {
    pub fn of(out: &Outcome, per_round: usize, rounds: usize, bytes: u64) -> Res<Rounds> {
        let mut by_round = vec![std::collections::BTreeMap::new(); rounds];
        for j in 0..per_round * rounds {
            let (name, span, _) = phase_span(out, j)?;
            by_round[j / per_round].insert(name, gbps(bytes, span));
        }
        Ok(Rounds(by_round))
    }

    /// GB/s of method `m` over the rounds.
    pub fn gbps(&self, m: &str) -> crate::util::Stats {
        let v: Vec<f64> = self.0.iter().filter_map(|r| r.get(m).copied()).collect();
        crate::util::Stats::of(&v)
    }

    /// a / b within each round.
    pub fn ratio(&self, a: &str, b: &str) -> crate::util::Stats {
        let v: Vec<f64> = self
            .0
            .iter()
            .filter_map(|r| Some(r.get(a)? / r.get(b)?))
            .collect();
        crate::util::Stats::of(&v)
    }
}
