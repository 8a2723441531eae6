//! Several `cascade run` on one node store, one per rank as srun and mpirun start them
//! (docs/agent.md, "Who runs the agent"): they share one store and one agent, nobody fails
//! with EBUSY, and the end of the job (the commit of what it left, the drain) runs once, after
//! the last rank has ended; a rank killed with SIGKILL blocks nobody.
//!
//! Each rank's command writes its file `/job/ckpt.1/rank.N` of the shared checkpoint through
//! the preload library and waits for the test's go-file, so the test decides the order in
//! which ranks end; every wait is on observable state with a deadline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cascade_durable::DurableStore;
use cascade_store::Store;
use cascade_testkit::{
    assert_durable_checkpoint, begin, expected, pattern, wait_for, wait_until, Daemon, Env,
    Expected, RemoveDir, MIB,
};

const RANKS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(60);

/// A rank's command: `$1` rank, `$2` the host file it copies into the store, `$3` the flag
/// directory, `$4` `first` (write, then wait for go) or `after` (wait, then write), `$5` its
/// exit code.
const RANK_SCRIPT: &str = r#"
set -e
write() { mkdir -p "$CASCADE_MOUNT/job/ckpt.1"; cat "$2" > "$CASCADE_MOUNT/job/ckpt.1/rank.$1"; }
if [ "$4" = first ]; then write "$@"; fi
: > "$3/started.$1"
while [ ! -e "$3/go.$1" ]; do sleep 0.01; done
if [ "$4" = after ]; then write "$@"; fi
: > "$3/done.$1"
exit "$5"
"#;

/// When a rank writes its file: before it waits for its go-file, or after.
#[derive(Clone, Copy, PartialEq)]
enum Write {
    First,
    After,
}

/// One node's job: a store `cascade run` creates, a durable directory, and its ranks.
struct Job {
    env: Env,
    mount: String,
    _mount: RemoveDir,
    durable: PathBuf,
    flags: PathBuf,
    files: Vec<Expected>,
    ranks: Vec<Daemon>,
}

impl Job {
    /// A fresh store name and durable directory; rank N will write `sizes[N]` bytes.
    fn new(tag: &str, sizes: &[usize]) -> Job {
        let env = Env::without_store(tag);
        let mount = format!("/cascade-ranks-{tag}-{}", std::process::id());
        let durable = env.tmp.path().join("durable");
        let flags = env.tmp.path().join("flags");
        std::fs::create_dir_all(&flags).expect("flag directory");
        let files = sizes
            .iter()
            .enumerate()
            .map(|(n, &size)| {
                let data = pattern(size, 1000 + n as u64);
                std::fs::write(env.tmp.path().join(format!("rank.{n}")), &data)
                    .expect("source file");
                expected(&format!("ckpt.1/rank.{n}"), data)
            })
            .collect();
        Job {
            _mount: RemoveDir(mount.clone()),
            env,
            mount,
            durable,
            flags,
            files,
            ranks: Vec::new(),
        }
    }

    /// Starts every rank at once (`codes[N]`: rank N's exit code) and waits until each one's
    /// command runs (and, with `Write::First`, has written its file).
    fn start(&mut self, write: Write, codes: &[i32]) {
        for (n, &code) in codes.iter().enumerate() {
            self.spawn_rank(n, write, code, &[]);
        }
        for n in 0..codes.len() {
            self.wait_started(n);
        }
    }

    /// Starts rank `n` (the next in `ranks`) with more environment `env`.
    fn spawn_rank(&mut self, n: usize, write: Write, code: i32, env: &[(&str, &str)]) {
        assert_eq!(n, self.ranks.len(), "ranks start in order");
        let durable = self.durable.to_str().expect("utf-8").to_string();
        let mut cmd = self.env.cli();
        cmd.args(["run", "--mount", &self.mount, "--durable", &durable, "--"])
            .args(["/bin/sh", "-c", RANK_SCRIPT, "rank"])
            .arg(n.to_string())
            .arg(self.env.tmp.path().join(format!("rank.{n}")))
            .arg(&self.flags)
            .arg(match write {
                Write::First => "first",
                Write::After => "after",
            })
            .arg(code.to_string())
            .env("CASCADE_CAPACITY", "64MiB")
            .env("CASCADE_SPILL_SIZE", "0")
            .env("CASCADE_PREFAULT", "off")
            .envs(env.iter().copied());
        self.ranks
            .push(Daemon::spawn(cmd, &format!("cascade run (rank {n})")));
    }

    /// Waits until rank `n`'s command runs.
    fn wait_started(&mut self, n: usize) {
        let started = self.flag(&format!("started.{n}"));
        let rank = &mut self.ranks[n];
        let ran = wait_until(DEADLINE, || started.exists() || !rank.alive());
        assert!(
            ran && started.exists(),
            "rank {n}'s command did not start ({}); its stderr:\n{}",
            if ran {
                "cascade run exited"
            } else {
                "timed out"
            },
            rank.log()
        );
    }

    fn flag(&self, name: &str) -> PathBuf {
        self.flags.join(name)
    }

    /// Lets rank `n`'s command go on and waits until it has ended.
    fn release(&self, n: usize) {
        std::fs::write(self.flag(&format!("go.{n}")), b"").expect("go-file");
        let done = self.flag(&format!("done.{n}"));
        wait_for(&format!("rank {n}'s command to end"), DEADLINE, || {
            done.exists()
        });
    }

    fn store(&self) -> Store {
        Store::attach(&self.env.name).unwrap_or_else(|e| panic!("attach {}: {e}", self.env.name))
    }

    /// The rank whose `cascade run` holds the store's agent.
    fn agent_holder(&self, store: &Store) -> usize {
        let pid = store.agent_pid().expect("an agent runs for the store");
        self.ranks
            .iter()
            .position(|r| r.pid() == pid)
            .unwrap_or_else(|| panic!("the agent (pid {pid}) is none of the ranks"))
    }

    /// Waits for rank `n`'s `cascade run` to exit and checks its exit code and that it did
    /// not fail to share the agent.
    fn ended(&mut self, n: usize, code: i32) {
        let rank = &mut self.ranks[n];
        let status = rank.wait(DEADLINE);
        let log = rank.log();
        assert_eq!(status.code(), Some(code), "rank {n}: {status}\n{log}");
        for refused in ["EBUSY", "already running", "resource busy"] {
            assert!(!log.contains(refused), "rank {n}: {log}");
        }
    }

    /// After the job: no agent is left registered and no rank in the store's registry.
    fn assert_nothing_left(&self, store: &Store) {
        assert_eq!(store.agent_pid(), None, "an agent outlived the job");
        let registry = Store::lock_dir(&self.env.name).join("ranks");
        let left: Vec<String> = std::fs::read_dir(&registry)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| !["lock", "round", "round.agent"].contains(&name.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "left in {}: {left:?}", registry.display());
    }

    fn durable_store(&self) -> DurableStore {
        DurableStore::open(self.durable.to_str().expect("utf-8")).expect("open durable")
    }

    /// The job's checkpoint `/job` is complete in the durable store with every rank's file.
    fn assert_job_complete(&self) {
        let files: Vec<&Expected> = self.files.iter().collect();
        assert_durable_checkpoint(&self.durable_store(), "job", &files);
    }
}

/// Several `cascade run` starting at once on a store none of them has yet, ending at different
/// times, many times over: one agent for all of them, held by one of the ranks until the last
/// has ended; no rank fails; the end of the job commits `/job` and it is complete in the
/// durable store with every rank's file.
#[test]
fn ranks_starting_at_once_share_one_agent_and_end_the_job_once() {
    let (_serial, started) = begin();
    for iteration in 0..8 {
        let mut job = Job::new(
            &format!("once{iteration}"),
            &[MIB, 2 * MIB, MIB / 2, 3 * MIB],
        );
        job.start(Write::First, &[0; RANKS]);
        let store = job.store();
        let holder = job.agent_holder(&store);
        let agent = store.agent_pid();
        // The holder's command ends in the middle, so it waits for the ranks after it.
        let order = [
            (holder + 1) % RANKS,
            holder,
            (holder + 2) % RANKS,
            (holder + 3) % RANKS,
        ];
        for (i, &n) in order.iter().enumerate() {
            job.release(n);
            if n != holder {
                job.ended(n, 0);
            }
            if i + 1 < RANKS {
                assert_eq!(
                    store.agent_pid(),
                    agent,
                    "iteration {iteration}: the agent changed while ranks still ran"
                );
            }
        }
        job.ended(holder, 0);
        job.assert_job_complete();
        job.assert_nothing_left(&store);
    }
    eprintln!(
        "ranks_starting_at_once_share_one_agent_and_end_the_job_once: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A rank whose command ends before its neighbour on the node has started (a program that
/// never calls Cascade, ranks started unevenly) is not the last: with two ranks expected on
/// the node (`CASCADE_NODE_RANKS`, as mpirun's local size or Slurm's tasks per node say), it
/// waits for the second, which ends the job with both files; a second rank that never comes
/// is waited for 10 s, then the job ends with a line that says so.
#[test]
fn a_rank_ending_before_its_neighbour_starts_waits_for_it() {
    let (_serial, started) = begin();
    let two = [("CASCADE_NODE_RANKS", "2")];
    let mut job = Job::new("late", &[MIB, 2 * MIB]);
    job.spawn_rank(0, Write::First, 0, &two);
    job.wait_started(0);
    job.release(0);
    job.spawn_rank(1, Write::First, 0, &two);
    job.wait_started(1);
    assert!(
        job.ranks[0].alive(),
        "the first rank ended the job before its neighbour started: {}",
        job.ranks[0].log()
    );
    job.release(1);
    job.ended(1, 0);
    job.ended(0, 0);
    assert!(
        !job.ranks[0].log().contains("ranks on this node"),
        "{}",
        job.ranks[0].log()
    );
    job.assert_job_complete();
    job.assert_nothing_left(&job.store());

    let mut alone = Job::new("alone", &[MIB]);
    alone.spawn_rank(0, Write::First, 0, &two);
    alone.wait_started(0);
    alone.release(0);
    alone.ended(0, 0);
    let log = alone.ranks[0].log();
    assert!(
        log.contains("1 of 2 ranks on this node (env CASCADE_NODE_RANKS) ran under 'cascade run' within 10 s"),
        "{log}"
    );
    alone.assert_job_complete();
    eprintln!(
        "a_rank_ending_before_its_neighbour_starts_waits_for_it: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The rank holding the agent has its command end first, while the other ranks have not
/// written yet: it keeps the agent running for them, and their files, written afterwards,
/// are drained and committed with the job.
#[test]
fn the_agent_outlives_its_rank_until_the_others_end() {
    let (_serial, started) = begin();
    let mut job = Job::new("holderfirst", &[4 * MIB, 4 * MIB, 8 * MIB, 2 * MIB]);
    job.start(Write::After, &[0; RANKS]);
    let store = job.store();
    let holder = job.agent_holder(&store);
    let agent = store.agent_pid();
    job.release(holder);
    let others: Vec<usize> = (0..RANKS).filter(|&n| n != holder).collect();
    for &n in &others {
        assert!(
            job.ranks[holder].alive(),
            "the rank holding the agent exited while others ran: {}",
            job.ranks[holder].log()
        );
        assert_eq!(store.agent_pid(), agent, "the agent changed");
        job.release(n);
        job.ended(n, 0);
    }
    job.ended(holder, 0);
    job.assert_job_complete();
    job.assert_nothing_left(&store);
    eprintln!(
        "the_agent_outlives_its_rank_until_the_others_end: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A rank's `cascade run` killed with SIGKILL (once a plain rank, once the one holding the
/// agent) blocks nobody: the other ranks end, the last one drains every file (starting an
/// agent for that when the holder is gone), and since a rank vanished without a result the
/// end of the job commits nothing.
#[test]
fn a_rank_killed_with_sigkill_does_not_block_the_others() {
    let (_serial, started) = begin();
    for kill_holder in [false, true] {
        let tag = if kill_holder {
            "killholder"
        } else {
            "killrank"
        };
        let mut job = Job::new(tag, &[MIB, 2 * MIB, MIB, MIB]);
        job.start(Write::First, &[0; RANKS]);
        let store = job.store();
        let holder = job.agent_holder(&store);
        let victim = if kill_holder {
            holder
        } else {
            (holder + 1) % RANKS
        };
        let status = job.ranks[victim].kill9();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        // Its command, orphaned, ends too once let go.
        job.release(victim);
        for n in (0..RANKS).filter(|&n| n != victim) {
            job.release(n);
            if n != holder {
                job.ended(n, 0);
            }
        }
        if !kill_holder {
            job.ended(holder, 0);
        }
        // Every file was complete and closed: the last rank drained them all.
        for file in &job.files {
            let path = job.durable.join("job").join(&file.rel);
            let got = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{tag}: {} is not in the durable store: {e}", path.display())
            });
            assert!(got == file.data, "{tag}: {} differs", path.display());
        }
        assert!(
            !job_marker(&job.durable).exists(),
            "{tag}: a job with a failed rank was committed"
        );
        job.assert_nothing_left(&store);
    }
    eprintln!(
        "a_rank_killed_with_sigkill_does_not_block_the_others: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Each `cascade run` exits with its own command's exit code; a rank that failed keeps the
/// end of the job from committing what the job left, whichever rank ends last, but its files
/// are still drained.
#[test]
fn each_rank_exits_with_its_own_code_and_a_failed_rank_commits_nothing() {
    let (_serial, started) = begin();
    for failing_ends_first in [true, false] {
        let tag = if failing_ends_first {
            "failfirst"
        } else {
            "faillast"
        };
        let mut job = Job::new(tag, &[MIB, MIB, MIB]);
        let codes = [0, 5, 0];
        job.start(Write::First, &codes);
        let store = job.store();
        let holder = job.agent_holder(&store);
        let mut order: Vec<usize> = (0..codes.len()).filter(|&n| n != 1).collect();
        if failing_ends_first {
            order.insert(0, 1);
        } else {
            order.push(1);
        }
        for &n in &order {
            job.release(n);
            if n != holder {
                job.ended(n, codes[n]);
            }
        }
        job.ended(holder, codes[holder]);
        for file in &job.files {
            assert!(
                job.durable.join("job").join(&file.rel).is_file(),
                "{tag}: {} was not drained",
                file.rel
            );
        }
        assert!(
            !job_marker(&job.durable).exists(),
            "{tag}: a job with a failed rank was committed"
        );
        job.assert_nothing_left(&store);
    }
    eprintln!(
        "each_rank_exits_with_its_own_code_and_a_failed_rank_commits_nothing: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// With a node-level agent (`cascade agent`, as a Slurm prolog or a systemd unit starts it)
/// the ranks only attach: none starts an agent, each `cascade run` exits as soon as its
/// command has ended, and the last one's end of the job commits `/job`, which the node's
/// agent makes durable.
#[test]
fn with_a_node_level_agent_the_ranks_only_attach() {
    let (_serial, started) = begin();
    let mut job = Job::new("nodeagent", &[MIB, 2 * MIB, MIB, MIB / 2]);
    let url = job.durable.to_str().expect("utf-8").to_string();
    let mut agent = job.env.agent(
        &url,
        &[
            ("CASCADE_CAPACITY", "64MiB"),
            ("CASCADE_SPILL_SIZE", "0"),
            ("CASCADE_PREFAULT", "off"),
        ],
    );
    job.start(Write::First, &[0; RANKS]);
    let store = job.store();
    assert_eq!(
        store.agent_pid(),
        Some(agent.pid()),
        "a rank took the agent over"
    );
    for n in 0..RANKS {
        job.release(n);
        job.ended(n, 0);
        assert_eq!(
            store.agent_pid(),
            Some(agent.pid()),
            "the node's agent changed"
        );
    }
    let out = job.env.cascade(
        &["wait", "/job", "--level", "durable", "--timeout", "60"],
        &[],
    );
    assert!(out.ok(), "cascade wait /job: {out}");
    job.assert_job_complete();
    cascade_testkit::stop_agent(&mut agent);
    job.assert_nothing_left(&store);
    eprintln!(
        "with_a_node_level_agent_the_ranks_only_attach: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A job that only reads a checkpoint back (read-through into a new store) leaves it as it
/// is: the files it fetched are new in the store but not the job's, so the end of the job
/// does not commit `/job` again with only the files read (which would replace its complete
/// marker with one that lists less).
#[test]
fn a_job_reading_a_checkpoint_back_does_not_commit_it_again() {
    let (_serial, started) = begin();
    let mut job = Job::new("readback", &[MIB, 2 * MIB, MIB]);
    job.start(Write::First, &[0; 3]);
    let store = job.store();
    let holder = job.agent_holder(&store);
    for n in (0..3).filter(|&n| n != holder) {
        job.release(n);
        job.ended(n, 0);
    }
    job.release(holder);
    job.ended(holder, 0);
    job.assert_job_complete();
    drop(store);
    job.env.cascade_ok(&["destroy", "--force"], &[]);

    // A new store on the same durable directory: two ranks each read one file back.
    let durable = job.durable.to_str().expect("utf-8").to_string();
    let readers: Vec<Daemon> = (0..2)
        .map(|n| {
            let mut cmd = job.env.cli();
            cmd.args(["run", "--mount", &job.mount, "--durable", &durable, "--"])
                .args(["cmp", "--"])
                .arg(format!("{}/job/ckpt.1/rank.{n}", job.mount))
                .arg(job.env.tmp.path().join(format!("rank.{n}")))
                .env("CASCADE_CAPACITY", "64MiB")
                .env("CASCADE_SPILL_SIZE", "0")
                .env("CASCADE_PREFAULT", "off");
            Daemon::spawn(cmd, &format!("cascade run (reader {n})"))
        })
        .collect();
    for (n, mut reader) in readers.into_iter().enumerate() {
        let status = reader.wait(DEADLINE);
        assert!(status.success(), "reader {n}: {status}\n{}", reader.log());
    }
    job.assert_job_complete();
    eprintln!(
        "a_job_reading_a_checkpoint_back_does_not_commit_it_again: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn job_marker(durable: &Path) -> PathBuf {
    durable.join("job").join(cascade_durable::MARKER_NAME)
}
