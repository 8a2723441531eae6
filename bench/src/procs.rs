//! Child processes of the suites: the CLI with a clean environment, tied to the bench's life,
//! their CPU time, stopping them, and the C programs the suites compile.

use crate::util::{err, Context, Res};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
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
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    Some((f.get(11)? + f.get(12)?) as f64 / 100.0)
}

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
