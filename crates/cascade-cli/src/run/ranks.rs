//! The ranks of a job on one node: every `cascade run` on a node store (one per rank, as srun
//! and mpirun start them) registers here, so that the end of the job runs once, when the last
//! live rank ends, and the rank that holds the embedded agent keeps it until then
//! (docs/agent.md, "Who runs the agent").
//!
//! The registry is a directory next to the store's lock files, `Store::lock_dir(store)/ranks/`:
//! - `<pid>`: one live rank, holding its process start time (so a reused pid is not taken for
//!   it); removed when the rank ends. An entry whose process is gone (kill -9) is removed by
//!   the next rank that looks, and counts as a failed rank.
//! - `failed`: one line per rank of this round that failed (its command exited non-zero, or
//!   it vanished); the end of the job commits nothing when it exists.
//! - `round`: the versions of the store's files when the round started, so that the end of
//!   the job knows what the job wrote (`FileVersions`); `round.agent`: the agent's pid and
//!   count of files fetched by read-through then, if one answered (fetched files are new
//!   versions too, but not the job's: after a fetch the end of the job does without).
//! - `joined`: one line per rank that joined this round (its pid), so that the last live rank
//!   knows whether every rank the launcher started on the node has run yet.
//! - `lock`: flock'ed while a rank joins, leaves or ends the job, so that exactly one rank
//!   finds itself the last. The kernel releases it when its holder dies.
//!
//! A round starts when a rank joins and finds no other live rank, and ends when the last one
//! has run the end of the job.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use cascade_store::Store;

use crate::failure::Failure;
use crate::lifecycle::FileVersions;

const FAILED: &str = "failed";
const JOINED: &str = "joined";
const ROUND: &str = "round";
const ROUND_AGENT: &str = "round.agent";
const LOCK: &str = "lock";

/// This process's entry in the registry of its store.
pub struct Ranks {
    dir: PathBuf,
    me: u32,
    registered: bool,
}

/// The registry's lock, held until dropped.
pub struct RanksLock {
    _file: std::fs::File,
}

impl Ranks {
    /// The registry of store `name` (nothing is written yet).
    pub fn of_store(name: &str) -> Ranks {
        Ranks {
            dir: Store::lock_dir(name).join("ranks"),
            me: std::process::id(),
            registered: false,
        }
    }

    /// Takes the registry's lock (blocking while another rank holds it).
    pub fn lock(&self) -> Result<RanksLock, Failure> {
        let failed = |e: &std::io::Error| Failure::io(&self.dir.display().to_string(), e);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| failed(&e))?;
        let path = self.dir.join(LOCK);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| failed(&e))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(RanksLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(failed(&err));
            }
        }
    }

    /// Registers this process as a rank. A rank that finds no other live one starts a new
    /// round: what an earlier round left (entries of ranks killed, its failures) is cleared.
    pub fn join(&mut self, lock: &RanksLock, store: &Store) -> Result<(), Failure> {
        if self.others_alive(lock).is_empty() {
            self.start_round(lock, store)?;
        }
        let start = process_start_time(self.me)
            .ok_or_else(|| Failure::new("cannot read this process's start time in /proc"))?;
        // Written aside and renamed, so that a rank polling without the lock never reads a
        // half-written entry.
        let path = self.dir.join(self.me.to_string());
        let aside = self.dir.join(format!(".{}", self.me));
        std::fs::write(&aside, format!("{start}\n"))
            .and_then(|()| std::fs::rename(&aside, &path))
            .map_err(|e| Failure::io(&path.display().to_string(), &e))?;
        self.registered = true;
        let joined = self.dir.join(JOINED);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&joined)
            .and_then(|mut file| writeln!(file, "{}", self.me))
            .map_err(|e| Failure::io(&joined.display().to_string(), &e))
    }

    /// How many ranks joined this round so far, the ended ones too (readable without the
    /// lock: each line is one append).
    pub fn joined(&self) -> usize {
        std::fs::read_to_string(self.dir.join(JOINED))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    }

    /// The other live ranks. Entries of ranks that are gone are removed and recorded as
    /// failures of the round.
    pub fn others_alive(&self, lock: &RanksLock) -> Vec<u32> {
        let (alive, gone) = self.scan();
        for pid in gone {
            let _ = std::fs::remove_file(self.dir.join(pid.to_string()));
            self.record_failure(lock, &format!("rank pid {pid} ended without a result"));
        }
        alive
    }

    /// Whether another rank is alive, without changing anything (for polling without the
    /// lock).
    pub fn any_other_alive(&self) -> bool {
        !self.scan().0.is_empty()
    }

    /// Records that a rank of this round failed (`what` says how).
    pub fn record_failure(&self, _lock: &RanksLock, what: &str) {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(FAILED))
        {
            let _ = writeln!(file, "{what}");
        }
    }

    /// Whether every rank of this round that has ended so far succeeded.
    pub fn all_succeeded(&self, _lock: &RanksLock) -> bool {
        !self.dir.join(FAILED).exists()
    }

    /// The versions of the store's files when the round started, if recorded and no file
    /// was fetched from a lower level since (as far as the store's agent can tell).
    pub fn round_start(&self, _lock: &RanksLock, store: &Store) -> Option<FileVersions> {
        let text = std::fs::read_to_string(self.dir.join(ROUND)).ok()?;
        let versions = FileVersions::from_text(&text)?;
        let now = cascade_agent::status(store.name())?;
        let at_start = std::fs::read_to_string(self.dir.join(ROUND_AGENT)).unwrap_or_default();
        let mut fields = at_start.split_whitespace().map(str::parse::<u64>);
        let fetched_before = match (fields.next(), fields.next()) {
            (Some(Ok(pid)), Some(Ok(fetched))) if pid == u64::from(now.pid) => fetched,
            // Another agent: it started during the round, its count is the round's.
            _ => 0,
        };
        (now.fetched_files == fetched_before).then_some(versions)
    }

    /// Starts a round (again, once the end of the job has run for the ranks so far): no
    /// failures, and the store's files as they are now are not the round's.
    pub fn start_round(&self, _lock: &RanksLock, store: &Store) -> Result<(), Failure> {
        let _ = std::fs::remove_file(self.dir.join(FAILED));
        let _ = std::fs::remove_file(self.dir.join(JOINED));
        // Entries a rank killed while joining left aside (nobody joins without the lock).
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let agent = cascade_agent::status(store.name())
            .map(|s| format!("{} {}\n", s.pid, s.fetched_files))
            .unwrap_or_default();
        let written = |name: &str, text: String| {
            let path = self.dir.join(name);
            std::fs::write(&path, text).map_err(|e| Failure::io(&path.display().to_string(), &e))
        };
        written(ROUND_AGENT, agent)?;
        written(ROUND, FileVersions::of(store).to_text())
    }

    /// Removes this rank's entry.
    pub fn leave(&mut self, _lock: &RanksLock) {
        self.remove_entry();
    }

    fn remove_entry(&mut self) {
        if std::mem::take(&mut self.registered) {
            let _ = std::fs::remove_file(self.dir.join(self.me.to_string()));
        }
    }

    /// The other ranks' pids: (alive, gone).
    fn scan(&self) -> (Vec<u32>, Vec<u32>) {
        let mut alive = Vec::new();
        let mut gone = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return (alive, gone);
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == self.me {
                continue;
            }
            // Removed meanwhile (its rank left): not a rank any more.
            let Ok(recorded) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let started = recorded.trim().parse::<u64>().ok();
            let live = started.is_some() && started == process_start_time(pid);
            if live {
                alive.push(pid);
            } else {
                gone.push(pid);
            }
        }
        (alive, gone)
    }
}

impl Drop for Ranks {
    /// A `cascade run` that fails before its child ends still leaves the registry.
    fn drop(&mut self) {
        self.remove_entry();
    }
}

/// Start time (clock ticks after boot) of a running, non-zombie process, or None.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split(' ');
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // starttime is field 22 of the whole line, i.e. the 20th after the state field.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_versions_read_back_what_they_wrote_and_refuse_anything_else() {
        let text = "1 2 3\n40 1 7\n";
        let versions = FileVersions::from_text(text).expect("parses");
        let mut lines: Vec<String> = versions.to_text().lines().map(str::to_string).collect();
        lines.sort();
        assert_eq!(lines, ["1 2 3", "40 1 7"]);
        assert!(FileVersions::from_text("").is_some());
        for bad in ["1 2\n", "1 2 3 4\n", "a b c\n", "1 99999999999 3\n"] {
            assert!(FileVersions::from_text(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_live_process_has_a_start_time_and_a_reaped_one_none() {
        assert!(process_start_time(std::process::id()).is_some());
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert_eq!(process_start_time(pid), None);
    }
}
