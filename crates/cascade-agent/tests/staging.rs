//! Staging servers (L1) with real processes on 127.0.0.1: `cascade stage-server` servers, a
//! `cascade agent --staging ...` per node store, the CLI (`put`-like writes through the store
//! API, `commit`, `wait`, `ls --levels`, `stage-server status`) and a directory as the durable
//! store. No mocks, no sleeps as synchronisation: every wait polls a log line, a server's
//! status or `cascade wait` with a deadline.
//!
//! 1. two servers, stripe placement: a checkpoint of big, small, empty and many tiny files is
//!    staged over both, drained and completed; every object verifies; group placement sends
//!    every file of the node to one server;
//! 2. a server killed with SIGKILL while the agent streams to it: the agent reports it, sends
//!    the rest to the other server, and nothing the killed server acknowledged is lost (it is
//!    recovered at restart, drained, and the checkpoint completes) — once with the killed
//!    server's files already drained, once with its drain blocked;
//!    2b. an older version held by a server cut off from the durable store must not
//!    replace the newer one written meanwhile (through another server, or uploaded by the
//!    agent), neither by read-through nor when that server drains after a restart;
//! 3. the only server killed after acknowledging files and a checkpoint it had not drained
//!    (its drain target broken): restarted with a good one, it drains them and completes;
//! 4. a full server (tmpfs or --ssd-capacity): the agent fails over, or with no other server
//!    uploads straight to the durable store; the server takes files again once drained;
//! 5. a wrong shared secret: refused, nothing stored there, the data goes straight down;
//! 6. a new node (fresh store) reads a checkpoint back from a staging server (FETCH and a
//!    preloaded program), the durable store never having had it;
//! 7. `cascade stage-server` command-line errors.
//!
//! A server's drain is "blocked" by giving it a directory as --drain-to that is replaced by a
//! regular file once the server has started (it checks the directory at start only): every
//! drain then fails, acknowledged data stays pending on its SSD.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cascade_durable::DurableStore;
use cascade_testkit::stage_server::untag_seals;
use cascade_testkit::*;
use cascade_wire::client::OutSegment;
use cascade_wire::protocol::Level;
use cascade_wire::{ClientOptions, Connection, ServerStatus};

const SHARED_SECRET: &str = "staging-tests-shared-secret";
const WAIT: Duration = Duration::from_secs(90);

fn files(spec: &[(&str, usize)], seed: u64) -> Vec<Expected> {
    spec.iter()
        .enumerate()
        .map(|(i, (rel, len))| expected(rel, random(*len, seed * 1000 + i as u64)))
        .collect()
}

/// Writes `files` below `ckpt` (a store path) through the store API, each closed at once.
fn write_files(env: &Env, ckpt: &str, files: &[Expected]) {
    for f in files {
        let path = format!("{ckpt}/{}", f.rel);
        let parent = &path[..path.rfind('/').expect("absolute")];
        env.store()
            .create_dir_all(parent, 0o755)
            .unwrap_or_else(|e| panic!("mkdir {parent}: {e}"));
        env.write(&path, &f.data);
    }
}

fn refs(files: &[Expected]) -> Vec<&Expected> {
    files.iter().collect()
}

fn total(files: &[Expected]) -> u64 {
    files.iter().map(|f| f.data.len() as u64).sum()
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// `cascade agent --durable URL -v` sending to `servers` with the given secret and placement.
fn staging_agent(
    env: &Env,
    durable: &str,
    servers: &[&StageServer],
    secret: &str,
    placement: &str,
) -> Daemon {
    let list = servers
        .iter()
        .map(|s| s.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    env.agent(
        durable,
        &[
            ("CASCADE_STAGING", &list),
            ("CASCADE_STAGING_SECRET", secret),
            ("CASCADE_STAGING_PLACEMENT", placement),
        ],
    )
}

/// The agent's "staged PATH (N bytes) on ADDR" lines: (store path, server address).
fn staged_lines(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cascade agent: staged ")?;
            let (path, rest) = rest.split_once(" (")?;
            let (_, addr) = rest.split_once(" bytes) on ")?;
            Some((path.to_string(), addr.trim().to_string()))
        })
        .collect()
}

/// Every log of a test, for a failure message.
fn logs(agent_logs: &[&str], servers: &[&StageServer]) -> String {
    let mut out = String::new();
    for (i, l) in agent_logs.iter().enumerate() {
        out.push_str(&format!("--- agent log {i}:\n{l}\n"));
    }
    for s in servers {
        out.push_str(&format!("--- server {}:\n{}\n", s.addr, s.log()));
    }
    out
}

/// `cascade wait CKPT --level durable`, which must succeed; the logs otherwise.
fn wait_durable(env: &Env, ckpt: &str, agent: &Daemon, servers: &[&StageServer]) {
    let out = env.cascade(
        &[
            "wait",
            ckpt,
            "--level",
            "durable",
            "--timeout",
            &WAIT.as_secs().to_string(),
        ],
        &[],
    );
    assert!(
        out.ok(),
        "cascade wait {ckpt} --level durable: {out}\n{}",
        logs(&[&agent.log()], servers)
    );
}

/// [`assert_durable_checkpoint`] of the directory store at `url`.
fn assert_durable_checkpoint_at(url: &str, ckpt: &str, files: &[&Expected]) {
    let durable = DurableStore::open(url).expect("open the durable store");
    assert_durable_checkpoint(&durable, ckpt, files);
}

/// `cascade stage-server status ADDR --json`, parsed.
fn cli_status(env: &Env, server: &StageServer) -> ServerStatus {
    let out = env.cascade_ok(
        &["stage-server", "status", &server.addr, "--json"],
        &[("CASCADE_STAGING_SECRET", SHARED_SECRET)],
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stage-server status --json: {e}: {}", out.stdout))
}

/// An agent's settings for the one server at `addr`, giving up on what it staged there once
/// it has not answered for a second (`staging.give_up_after`).
fn giving_up_after_a_second(addr: &str) -> [(&'static str, &str); 3] {
    [
        ("CASCADE_STAGING", addr),
        ("CASCADE_STAGING_SECRET", SHARED_SECRET),
        ("CASCADE_STAGING_GIVE_UP_AFTER", "1"),
    ]
}

/// A staging directory, an arena directory per server, and the durable store of a test.
struct Dirs {
    durable: String,
    /// A drain target that [`break_drain_target`] breaks.
    broken: PathBuf,
    root: PathBuf,
}

impl Dirs {
    fn new(env: &Env) -> Dirs {
        let root = env.tmp.path().to_path_buf();
        let durable = root.join("durable");
        std::fs::create_dir_all(&durable).expect("durable dir");
        let broken = root.join("unreachable-durable");
        std::fs::create_dir_all(&broken).expect("drain dir");
        Dirs {
            durable: path_str(&durable),
            broken,
            root,
        }
    }

    fn ssd(&self, name: &str) -> PathBuf {
        let d = self.root.join(name);
        std::fs::create_dir_all(&d).expect("ssd dir");
        d
    }

    fn durable_has(&self, key: &str) -> bool {
        Path::new(&self.durable).join(key).exists()
    }

    /// A server on SSD directory `ssd` whose drains all fail ([`break_drain_target`]) until
    /// it is restarted with another target.
    fn server_that_cannot_drain(&self, env: &Env, ssd: &str) -> StageServer {
        let server = StageServer::start(
            env,
            &self.ssd(ssd),
            &path_str(&self.broken),
            SHARED_SECRET,
            &[],
        );
        break_drain_target(&self.broken);
        server
    }
}

/// 1. Two servers with stripe placement: big, small, empty and tiny files (many in one
///    frame) are staged over both, drained by both, the checkpoint completes and every
///    object verifies; then group placement sends every file of a node to one server.
#[test]
fn stripe_and_group_placement_over_two_servers() {
    let (_serial, started) = begin();
    let env = Env::new("stage-place", 256 << 20);
    let dirs = Dirs::new(&env);
    let a = StageServer::start(&env, &dirs.ssd("ssd-a"), &dirs.durable, SHARED_SECRET, &[]);
    let b = StageServer::start(&env, &dirs.ssd("ssd-b"), &dirs.durable, SHARED_SECRET, &[]);

    let mut spec: Vec<(String, usize)> = vec![
        ("big.bin".into(), 64 * MIB),
        ("mid.bin".into(), 24 * MIB + 3),
        ("small.bin".into(), 7 * MIB + 5),
        ("three.bin".into(), 3 * MIB),
        ("empty.bin".into(), 0),
    ];
    for i in 0..64 {
        spec.push((format!("tiny/t{i:02}.dat"), 1 + i * 97));
    }
    let spec: Vec<(&str, usize)> = spec.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    let ck1 = files(&spec, 1);
    write_files(&env, "/ck1", &ck1);
    env.cascade_ok(&["commit", "/ck1"], &[]);

    let mut agent = staging_agent(&env, &dirs.durable, &[&a, &b], SHARED_SECRET, "stripe");
    wait_durable(&env, "/ck1", &agent, &[&a, &b]);
    let log = agent.log();
    let all = || logs(&[&log], &[&a, &b]);

    // Every file was acknowledged by a server exactly once, and both servers got some.
    let staged = staged_lines(&log);
    let mut staged_paths: Vec<&str> = staged.iter().map(|(p, _)| p.as_str()).collect();
    staged_paths.sort();
    let mut want_paths: Vec<String> = ck1.iter().map(|f| format!("/ck1/{}", f.rel)).collect();
    want_paths.sort();
    assert_eq!(staged_paths, want_paths, "staged lines\n{}", all());
    let servers_used: BTreeSet<&str> = staged.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        servers_used,
        BTreeSet::from([a.addr.as_str(), b.addr.as_str()]),
        "stripe placement used {servers_used:?}\n{}",
        all()
    );
    assert!(
        !log.contains("failed") && !log.contains("uploading them to"),
        "a failure or a direct upload with two healthy servers:\n{}",
        all()
    );

    // The servers absorbed exactly the checkpoint's bytes between them, and drained it all.
    let (sa, sb) = (cli_status(&env, &a), cli_status(&env, &b));
    let text = env
        .cascade_ok(
            &["stage-server", "status", &a.addr],
            &[("CASCADE_STAGING_SECRET", SHARED_SECRET)],
        )
        .stdout;
    assert!(
        text.contains(&format!("absorbed   {} file(s)", sa.absorbed_files))
            && text.contains("drained ")
            && text.contains("pending "),
        "stage-server status:\n{text}"
    );
    assert!(
        sa.absorbed_bytes > 0 && sb.absorbed_bytes > 0,
        "{sa:?}\n{sb:?}"
    );
    assert_eq!(
        sa.absorbed_bytes + sb.absorbed_bytes,
        total(&ck1),
        "{sa:?}\n{sb:?}"
    );
    assert_eq!(
        (sa.absorbed_files + sb.absorbed_files) as usize,
        ck1.len(),
        "{sa:?}\n{sb:?}"
    );
    for (name, s) in [("a", &sa), ("b", &sb)] {
        let n = staged.iter().filter(|(_, addr)| *addr == s.listen).count();
        assert_eq!(s.absorbed_files as usize, n, "server {name}: {s:?}");
        assert_eq!(s.refused_clients, 0, "server {name}: {s:?}");
    }
    wait_for("both servers to have drained everything", WAIT, || {
        [&a, &b].iter().all(|s| {
            let st = s.status();
            st.pending_files == 0 && st.pending_checkpoints == 0
        })
    });
    let (sa, sb) = (a.status(), b.status());
    assert_eq!(sa.drained_bytes + sb.drained_bytes, total(&ck1));
    assert_eq!(sa.drain_failures + sb.drain_failures, 0, "{sa:?}\n{sb:?}");
    assert_durable_checkpoint_at(&dirs.durable, "ck1", &refs(&ck1));
    let levels = env.levels();
    for f in &ck1 {
        let p = format!("/ck1/{}", f.rel);
        let line = levels_line(&levels, &p).unwrap_or_default();
        assert!(line.contains("durable"), "{p}: {line:?}\n{levels}");
    }
    assert!(
        levels_line(&levels, "/ck1/").is_some_and(|l| l.contains("complete")),
        "{levels}"
    );
    stop_agent(&mut agent);

    // Group placement: another node (store) sends all its files to one server.
    let env2 = Env::new("stage-group", 64 << 20);
    let mut spec2: Vec<(String, usize)> = vec![
        ("g1.bin".into(), 9 * MIB + 1),
        ("g2.bin".into(), 2 * MIB),
        ("g3.bin".into(), 5 * MIB + 77),
    ];
    for i in 0..16 {
        spec2.push((format!("parts/p{i}.dat"), 512 + i * 1001));
    }
    let spec2: Vec<(&str, usize)> = spec2.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    let ck2 = files(&spec2, 2);
    write_files(&env2, "/ck2", &ck2);
    env2.cascade_ok(&["commit", "/ck2"], &[]);
    let before: BTreeMap<String, u64> = [&a, &b]
        .iter()
        .map(|s| (s.addr.clone(), s.status().absorbed_bytes))
        .collect();
    let mut agent2 = staging_agent(&env2, &dirs.durable, &[&a, &b], SHARED_SECRET, "group");
    wait_durable(&env2, "/ck2", &agent2, &[&a, &b]);
    let log2 = agent2.log();
    let staged2 = staged_lines(&log2);
    assert_eq!(staged2.len(), ck2.len(), "{}", logs(&[&log2], &[&a, &b]));
    let used: BTreeSet<&str> = staged2.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        used.len(),
        1,
        "group placement spread one node's files over {used:?}"
    );
    let home = *used.iter().next().expect("one server");
    for s in [&a, &b] {
        let delta = s.status().absorbed_bytes - before[&s.addr];
        let want = if s.addr == home { total(&ck2) } else { 0 };
        assert_eq!(
            delta, want,
            "server {} absorbed {delta} bytes of ck2",
            s.addr
        );
    }
    assert_durable_checkpoint_at(&dirs.durable, "ck2", &refs(&ck2));
    stop_agent(&mut agent2);
    eprintln!(
        "stripe_and_group_placement_over_two_servers: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Prints how long a test has run at one of its steps (stderr, shown with --nocapture).
fn phase(t0: Instant, what: &str) {
    eprintln!("  {:6.1} s  {what}", t0.elapsed().as_secs_f64());
}

/// 2. Server A is killed with SIGKILL while the agent streams a batch to it. The agent says
///    so, sends A's files to B, and what A had acknowledged is not lost. With
///    `block_a_drain`, A's acknowledged files exist nowhere else (its drain target is broken):
///    the checkpoint can only complete once A is back, and it does, from A's recovered
///    arenas. Otherwise they were drained before the kill and the checkpoint completes
///    without A; the restarted A comes back cleanly from the crash (what it had half
///    received is dropped, nothing fails to drain) and claims no other version of them.
fn kill_mid_transfer(test: &str, block_a_drain: bool) {
    let t0 = Instant::now();
    let env = Env::new(test, 512 << 20);
    let dirs = Dirs::new(&env);
    let a_drain = if block_a_drain {
        path_str(&dirs.broken)
    } else {
        dirs.durable.clone()
    };
    let mut a = StageServer::start(&env, &dirs.ssd("ssd-a"), &a_drain, SHARED_SECRET, &[]);
    if block_a_drain {
        break_drain_target(&dirs.broken);
    }
    let b = StageServer::start(&env, &dirs.ssd("ssd-b"), &dirs.durable, SHARED_SECRET, &[]);

    // Phase 1: small files staged over both servers (the agent sees them all at once).
    let p1 = files(
        &[
            ("p1/a0.bin", 6 * MIB + 1),
            ("p1/a1.bin", 5 * MIB),
            ("p1/a2.bin", 4 * MIB + 7),
            ("p1/a3.bin", 3 * MIB + 11),
        ],
        10,
    );
    write_files(&env, "/ck", &p1);
    let mut agent1 = staging_agent(&env, &dirs.durable, &[&a, &b], SHARED_SECRET, "stripe");
    wait_for("the phase-1 files to be staged", WAIT, || {
        staged_lines(&agent1.log()).len() == p1.len()
    });
    let on_a1: Vec<String> = staged_lines(&agent1.log())
        .into_iter()
        .filter(|(_, s)| *s == a.addr)
        .map(|(p, _)| p)
        .collect();
    assert!(
        !on_a1.is_empty() && on_a1.len() < p1.len(),
        "stripe placement put {on_a1:?} on A\n{}",
        logs(&[&agent1.log()], &[&a, &b])
    );
    if block_a_drain {
        wait_for("A's drain to fail", WAIT, || a.status().drain_failures > 0);
    } else {
        wait_for("A to drain its phase-1 files", WAIT, || {
            a.status().drained_files as usize >= on_a1.len()
        });
    }
    stop_agent(&mut agent1);
    phase(t0, "phase 1 staged");
    let log1 = agent1.log();

    // Phase 2: big files, committed, then a new agent streams them: two per server.
    let p2 = files(
        &[
            ("p2/big0.bin", 80 * MIB),
            ("p2/big1.bin", 80 * MIB + 1),
            ("p2/big2.bin", 80 * MIB + 2),
            ("p2/big3.bin", 80 * MIB + 3),
        ],
        11,
    );
    write_files(&env, "/ck", &p2);
    phase(t0, "phase 2 written");
    env.cascade_ok(&["commit", "/ck"], &[]);
    let all: Vec<&Expected> = p1.iter().chain(p2.iter()).collect();
    let a_before = a.status().absorbed_bytes;
    let mut agent2 = staging_agent(&env, &dirs.durable, &[&a, &b], SHARED_SECRET, "stripe");
    wait_for("A to absorb part of its phase-2 batch", WAIT, || {
        a.status().absorbed_bytes >= a_before + 4 * MIB as u64
    });
    let status = a.kill9();
    phase(t0, "A killed");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "A was not killed: {status}"
    );
    let a_addr = a.addr.clone();
    agent2.wait_line("a failure of A", WAIT, |l| {
        l.starts_with("cascade agent: staging server ")
            && l.contains(&a_addr)
            && l.contains("failed")
    });
    let failover = agent2.wait_line("a failover from A to B", WAIT, |l| {
        l.contains(&format!("meant for {a_addr} to {}", b.addr))
    });
    assert!(failover.contains("sending "), "{failover}");
    let on_a2: Vec<String> = staged_lines(&agent2.log())
        .into_iter()
        .filter(|(_, s)| *s == a_addr)
        .map(|(p, _)| p)
        .collect();
    // The batch of 160 MiB was cut before its Sync: A acknowledged none of it.
    assert!(
        on_a2.is_empty(),
        "A acknowledged {on_a2:?} before it was killed: the kill came too late"
    );
    let acked_by_a: Vec<&Expected> = all
        .iter()
        .copied()
        .filter(|f| on_a1.contains(&format!("/ck/{}", f.rel)))
        .collect();

    if block_a_drain {
        // B holds and drains everything else and has the checkpoint's file list; A's
        // acknowledged files exist only in A's arenas, so nothing completes without A.
        wait_for("B to drain its files and hold the checkpoint", WAIT, || {
            let s = b.status();
            s.pending_files == 0
                && s.pending_checkpoints == 1
                && s.absorbed_files as usize >= all.len() - acked_by_a.len()
        });
        for f in &acked_by_a {
            assert!(
                !dirs.durable_has(&format!("ck/{}", f.rel)),
                "ck/{} reached the durable store although only A had it",
                f.rel
            );
        }
        let durable = DurableStore::open(&dirs.durable).expect("durable");
        assert!(!durable.is_complete("ck").expect("is_complete"));
        phase(t0, "B holds the rest");
        // A comes back on the same port and SSD with a working drain target.
        a.restart(&env, &dirs.durable);
        let line = a.start_line();
        let recovered: usize = line
            .split("recovered: ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no recovered count in {line:?}"));
        assert!(
            recovered >= acked_by_a.len(),
            "A recovered {recovered} file(s), it had acknowledged {}: {line}",
            acked_by_a.len()
        );
        for f in &acked_by_a {
            let st = a.pull_file(&format!("ck/{}", f.rel));
            assert!(
                st.level != Level::Unknown
                    && st.size == f.data.len() as u64
                    && cascade_wire::hex(&st.blake3) == f.blake3,
                "restarted A does not hold ck/{} as acknowledged: {st:?}",
                f.rel
            );
        }
        wait_durable(&env, "/ck", &agent2, &[&a, &b]);
        phase(t0, "complete");
    } else {
        // Everything A acknowledged was drained before the kill: the checkpoint completes
        // with A dead.
        wait_durable(&env, "/ck", &agent2, &[&a, &b]);
        phase(t0, "complete");
        assert!(!a.daemon.alive(), "A is still dead");
        a.restart(&env, &dirs.durable);
        // Drained before the kill, they are usually reclaimed (Unknown); their durable
        // copies are checked below.
        for f in &acked_by_a {
            let st = a.pull_file(&format!("ck/{}", f.rel));
            assert!(
                st.level == Level::Unknown
                    || (st.level == Level::Durable
                        && st.size == f.data.len() as u64
                        && cascade_wire::hex(&st.blake3) == f.blake3),
                "restarted A holds ck/{} in a state it did not acknowledge: {st:?}",
                f.rel
            );
        }
    }
    assert_durable_checkpoint_at(&dirs.durable, "ck", &all);
    phase(t0, "verified");
    // Whatever A still had (sealed before the kill) drains cleanly too.
    wait_for("the restarted A to have nothing pending", WAIT, || {
        let s = a.status();
        s.pending_files == 0 && s.pending_checkpoints == 0
    });
    assert_eq!(a.status().drain_failures, 0, "{}", a.log());
    let levels = env.levels();
    assert!(
        levels_line(&levels, "/ck/").is_some_and(|l| l.contains("complete")),
        "{levels}\n{}",
        logs(&[&log1, &agent2.log()], &[&a, &b])
    );
    stop_agent(&mut agent2);
}

#[test]
fn server_killed_mid_transfer_fails_over() {
    let (_serial, started) = begin();
    kill_mid_transfer("stage-kill", false);
    eprintln!(
        "server_killed_mid_transfer_fails_over: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn server_killed_mid_transfer_keeps_what_it_acknowledged() {
    let (_serial, started) = begin();
    kill_mid_transfer("stage-killb", true);
    eprintln!(
        "server_killed_mid_transfer_keeps_what_it_acknowledged: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 2b. Server A acknowledges version 1 of `ck/x.bin` and the checkpoint's file list but cannot
///     drain (broken target). The file is rewritten; version 2 reaches the durable store
///     (through server B, or uploaded by the agent itself) and the checkpoint completes. A
///     new node reading the file through A gets version 2, not A's older one; A, killed and
///     restarted with a working target, retires version 1 and the file list instead of
///     draining them: the durable checkpoint stays version 2.
fn stale_version_comes_back(test: &str, newer_through_server: bool) {
    let env = Env::new(test, 64 << 20);
    let dirs = Dirs::new(&env);
    let mut a = dirs.server_that_cannot_drain(&env, "ssd-a");
    let v1 = files(&[("x.bin", 3 * MIB + 5)], 21);
    let v2 = files(&[("x.bin", 2 * MIB + 9)], 22);
    write_files(&env, "/ck", &v1);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent1 = staging_agent(&env, &dirs.durable, &[&a], SHARED_SECRET, "stripe");
    agent1.wait_line("version 1 pushed to A", WAIT, |l| {
        l.starts_with("cascade agent: checkpoint /ck staged")
    });
    stop_agent(&mut agent1);
    assert_eq!(a.status().pending_checkpoints, 1, "{}", a.log());

    write_files(&env, "/ck", &v2);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let b = newer_through_server
        .then(|| StageServer::start(&env, &dirs.ssd("ssd-b"), &dirs.durable, SHARED_SECRET, &[]));
    let mut agent2 = match &b {
        Some(b) => staging_agent(&env, &dirs.durable, &[b], SHARED_SECRET, "stripe"),
        None => env.agent(&dirs.durable, &[]),
    };
    let servers: Vec<&StageServer> = b.iter().chain([&a]).collect();
    wait_durable(&env, "/ck", &agent2, &servers);
    stop_agent(&mut agent2);
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&v2));
    let st = a.pull_file("ck/x.bin");
    assert!(
        st.level == Level::Staged && cascade_wire::hex(&st.blake3) == v1[0].blake3,
        "A should still hold version 1 undrained: {st:?}"
    );

    // Read-through on a new node asks A, which holds an older version than the durable store.
    let node2 = Env::new(&format!("{test}-n2"), 64 << 20);
    let mut reader = staging_agent(&node2, &dirs.durable, &[&a], SHARED_SECRET, "stripe");
    let reply = cascade_agent::request(&node2.name, "FETCH /ck/x.bin").expect("FETCH");
    assert_eq!(reply, "OK", "{}", logs(&[&reader.log()], &servers));
    assert!(
        node2.read("/ck/x.bin") == v2[0].data,
        "read-through returned A's older version\n{}",
        logs(&[&reader.log()], &servers)
    );
    stop_agent(&mut reader);

    // A comes back able to drain: version 1 and its file list are retired, not drained.
    a.kill9();
    a.restart(&env, &dirs.durable);
    // The counter is bumped just after the version is retired: wait for both.
    let retired = wait_until(WAIT, || {
        let s = a.status();
        s.pending_files == 0 && s.pending_checkpoints == 0 && s.superseded_files > 0
    });
    assert!(
        retired,
        "A did not retire version 1 and its file list: {:?}\n{}",
        a.status(),
        a.log()
    );
    let s = a.status();
    assert_eq!(
        (
            s.superseded_files,
            s.drained_files,
            s.markers,
            s.drain_failures
        ),
        (1, 0, 0, 0),
        "{}",
        a.log()
    );
    // The server bumps the counter before it prints the line: wait for the line too.
    let retired_lines =
        |log: &str| log.contains("not drained ck/x.bin") && log.contains("checkpoint ck dropped");
    wait_until(WAIT, || retired_lines(&a.log()));
    let log = a.log();
    assert!(retired_lines(&log), "{log}");
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&v2));
    let on_disk = std::fs::read(Path::new(&dirs.durable).join("ck/x.bin")).expect("read");
    assert!(
        on_disk == v2[0].data,
        "the durable ck/x.bin is not version 2"
    );
}

#[test]
fn stale_server_never_overwrites_a_newer_version_from_another_server() {
    let (_serial, started) = begin();
    stale_version_comes_back("stage-stale-b", true);
    eprintln!(
        "stale_server_never_overwrites_a_newer_version_from_another_server: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn stale_server_never_overwrites_a_newer_version_uploaded_directly() {
    let (_serial, started) = begin();
    stale_version_comes_back("stage-stale-d", false);
    eprintln!(
        "stale_server_never_overwrites_a_newer_version_uploaded_directly: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 3. The only server acknowledges a checkpoint's files and its file list but cannot drain
///    them (broken target); it is killed with SIGKILL, restarted with a good target: it
///    recovers the files and the list, drains them, writes the marker, and the agent
///    records the checkpoint complete — without sending anything again.
#[test]
fn only_server_killed_before_draining_then_restarted() {
    let (_serial, started) = begin();
    let env = Env::new("stage-restart", 64 << 20);
    let dirs = Dirs::new(&env);
    let mut s = dirs.server_that_cannot_drain(&env, "ssd");
    let mut spec: Vec<(String, usize)> =
        vec![("a.bin".into(), 9 * MIB + 1), ("b.bin".into(), 2 * MIB)];
    for i in 0..10 {
        spec.push((format!("sub/t{i}.dat"), 10 + i * 333));
    }
    let spec: Vec<(&str, usize)> = spec.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    let ck = files(&spec, 3);
    write_files(&env, "/ck", &ck);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = staging_agent(&env, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    agent.wait_line("the checkpoint pushed to the server", WAIT, |l| {
        l.starts_with("cascade agent: checkpoint /ck staged") && l.contains(&s.addr)
    });
    wait_for("the server's drain to fail", WAIT, || {
        s.status().drain_failures > 0
    });
    let st = s.status();
    assert_eq!(st.pending_files as usize, ck.len(), "{st:?}");
    assert_eq!(st.pending_bytes, total(&ck), "{st:?}");
    assert_eq!(st.pending_checkpoints, 1, "{st:?}");
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("drain of ck/")),
        "{st:?}"
    );
    // The node store says where the data is: on a staging server, not yet durable.
    let levels = env.levels();
    for f in &ck {
        let p = format!("/ck/{}", f.rel);
        let line = levels_line(&levels, &p).unwrap_or_default();
        assert!(line.contains("staged"), "{p}: {line:?}\n{levels}");
    }
    assert!(
        levels_line(&levels, "/ck/").is_some_and(|l| l.contains("staged")),
        "{levels}"
    );
    let out = env.cascade(
        &["wait", "/ck", "--level", "durable", "--timeout", "0.5"],
        &[],
    );
    assert!(!out.ok(), "durable while the drain is broken: {out}");
    assert!(!dirs.durable_has("ck/.cascade-complete"));

    s.kill9();
    s.restart(&env, &dirs.durable);
    let line = s.start_line();
    assert!(
        line.contains(&format!("recovered: {} file(s)", ck.len()))
            && line.contains("and 1 checkpoint(s) waiting to drain"),
        "start line after the restart: {line}"
    );
    wait_durable(&env, "/ck", &agent, &[&s]);
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    let st = s.status();
    assert_eq!(
        st.absorbed_files, 0,
        "the agent sent data again to the restarted server: {st:?}"
    );
    assert_eq!(st.drained_files as usize, ck.len(), "{st:?}");
    stop_agent(&mut agent);
    eprintln!(
        "only_server_killed_before_draining_then_restarted: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The only server, unable to drain, holds two pushed checkpoints: /ck.1 staged by an agent
/// since killed with SIGKILL (the agent now running does not know where its files went) and
/// /ck.2 staged by the agent now running. The server is killed with SIGKILL for good: once
/// it has not answered for `staging.give_up_after` (1 s here), the agent says so in one line
/// and sends the staged files again from the node (no server is up: straight to the durable
/// store), which completes both. The server, back later with a good target, settles its
/// copies of the same versions (drained again, or superseded by the node's upload): both
/// still verify.
#[test]
fn only_server_down_for_good_its_staged_files_go_from_the_node() {
    let (_serial, _) = begin();
    let env = Env::new("stage-down", 64 << 20);
    let dirs = Dirs::new(&env);
    let mut s = dirs.server_that_cannot_drain(&env, "ssd");
    let settings = giving_up_after_a_second(s.addr.as_str());
    let cks = [
        (
            "/ck.1",
            files(&[("a.bin", 3 * MIB + 7), ("sub/b.dat", 4321)], 11),
        ),
        (
            "/ck.2",
            files(&[("a.bin", 2 * MIB + 1), ("c.dat", 999)], 12),
        ),
    ];
    let mut agent = env.agent(&dirs.durable, &settings);
    for (i, (ck, files)) in cks.iter().enumerate() {
        write_files(&env, ck, files);
        env.cascade_ok(&["commit", ck], &[]);
        agent.wait_line("the checkpoint pushed to the server", WAIT, |l| {
            l.starts_with(&format!("cascade agent: checkpoint {ck} staged")) && l.contains(&s.addr)
        });
        if i == 0 {
            agent.kill9();
            agent = env.agent(&dirs.durable, &settings);
        }
    }
    s.kill9();

    let gave_up = agent.wait_line("the agent giving the server up", WAIT, |l| {
        l.starts_with(&format!(
            "cascade agent: staging server {} has not answered for ",
            s.addr
        ))
    });
    let silent = seconds_after(&gave_up, " has not answered for ");
    assert!(
        silent >= 1.0,
        "gave up before staging.give_up_after: {gave_up}"
    );
    for (ck, files) in &cks {
        wait_durable(&env, ck, &agent, &[&s]);
        assert_durable_checkpoint_at(&dirs.durable, &ck[1..], &refs(files));
    }
    let files_sent_again = cascade_agent::status(&env.name)
        .expect("status")
        .staged_given_up;
    assert_eq!(files_sent_again, 4, "{}", agent.log());

    s.restart(&env, &dirs.durable);
    wait_for("the restarted server to settle what it held", WAIT, || {
        let st = s.status();
        st.pending_files == 0 && st.pending_checkpoints == 0
    });
    let st = s.status();
    assert_eq!(
        (st.drained_files + st.superseded_files) as usize,
        cks.iter().map(|(_, f)| f.len()).sum::<usize>(),
        "{st:?}"
    );
    stop_agent(&mut agent);
    for (ck, files) in &cks {
        assert_durable_checkpoint_at(&dirs.durable, &ck[1..], &refs(files));
    }
}

/// The only server, unable to drain, holds a pushed checkpoint when the agent is killed with
/// SIGKILL; restarted with a good target it drains the files and writes the marker, then
/// goes down for good before any agent asked it. The next agent, which does not know where
/// the files went, finds the server silent for `staging.give_up_after` (1 s here) and asks
/// the durable store first: the files' checksum objects equal its versions, so it records
/// them durable and completes the checkpoint without sending them again (the objects in the
/// durable store stay the server's, and the marker is not taken back meanwhile).
#[test]
fn only_server_drained_then_down_for_good_nothing_is_sent_again() {
    use std::os::unix::fs::MetadataExt;
    let (_serial, _) = begin();
    let env = Env::new("stage-drained-down", 64 << 20);
    let dirs = Dirs::new(&env);
    let mut s = dirs.server_that_cannot_drain(&env, "ssd");
    let addr = s.addr.clone();
    let settings = giving_up_after_a_second(addr.as_str());
    let ck = files(&[("a.bin", 3 * MIB + 7), ("sub/b.dat", 4321)], 15);
    write_files(&env, "/ck", &ck);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = env.agent(&dirs.durable, &settings);
    agent.wait_line("the checkpoint pushed to the server", WAIT, |l| {
        l.starts_with("cascade agent: checkpoint /ck staged") && l.contains(&addr)
    });
    agent.kill9();
    s.kill9();
    s.restart(&env, &dirs.durable);
    wait_for(
        "the server to drain the files and write the marker",
        WAIT,
        || dirs.durable_has("ck/.cascade-complete"),
    );
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    let objects = || -> Vec<u64> {
        ck.iter()
            .map(|f| {
                std::fs::metadata(Path::new(&dirs.durable).join("ck").join(&f.rel))
                    .expect("a drained object")
                    .ino()
            })
            .collect()
    };
    let drained = objects();
    s.kill9();

    let mut agent = env.agent(&dirs.durable, &settings);
    wait_durable(&env, "/ck", &agent, &[&s]);
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    assert_eq!(
        objects(),
        drained,
        "the files were uploaded again:\n{}",
        agent.log()
    );
    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.staged_given_up, 0, "{status:?}\n{}", agent.log());
    assert!(
        !agent.log().contains("has not answered for"),
        "{}",
        agent.log()
    );
    stop_agent(&mut agent);
}

/// The only server, unable to drain, holds a pushed checkpoint; it is killed with SIGKILL
/// and comes back at once with its SSD wiped and a good target. It answers that it does
/// not know the staged files: the agent says so in one line and sends them again (to that
/// server, now empty), without waiting for `staging.give_up_after`; the checkpoint becomes
/// durable and verifies.
#[test]
fn only_server_back_wiped_its_staged_files_go_again_from_the_node() {
    let (_serial, _) = begin();
    let env = Env::new("stage-wiped", 64 << 20);
    let dirs = Dirs::new(&env);
    let mut s = dirs.server_that_cannot_drain(&env, "ssd");
    let ck = files(&[("a.bin", 3 * MIB + 7), ("sub/b.dat", 4321)], 13);
    write_files(&env, "/ck", &ck);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = staging_agent(&env, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    agent.wait_line("the checkpoint pushed to the server", WAIT, |l| {
        l.starts_with("cascade agent: checkpoint /ck staged") && l.contains(&s.addr)
    });

    s.kill9();
    let ssd = dirs.root.join("ssd");
    std::fs::remove_dir_all(&ssd).expect("wipe the server's SSD");
    std::fs::create_dir_all(&ssd).expect("ssd dir");
    s.restart(&env, &dirs.durable);
    let lost = agent.wait_line("the agent hearing the files are lost", WAIT, |l| {
        l.starts_with(&format!(
            "cascade agent: staging server {} no longer holds ",
            s.addr
        ))
    });
    assert!(
        lost.contains(&format!("holds {} staged file(s)", ck.len())),
        "{lost}"
    );
    wait_durable(&env, "/ck", &agent, &[&s]);
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.staged_given_up, ck.len() as u64, "{status:?}");
    stop_agent(&mut agent);
}

/// 4a. A server on a 64 MiB tmpfs (or, without root, limited by --ssd-capacity) gets more
///     than fits: it says it is full, the agent sends its files to the other server, the
///     checkpoint completes.
#[test]
fn full_server_fails_over_to_the_other() {
    let (_serial, started) = begin();
    let env = Env::new("stage-full", 256 << 20);
    let dirs = Dirs::new(&env);
    let small_dir = dirs.root.join("small-ssd");
    let tmpfs = Tmpfs::mount(&small_dir, "64m");
    let extra: Vec<&str> = match &tmpfs {
        Ok(_) => vec![],
        Err(why) => {
            eprintln!("no tmpfs ({why}): limiting the server with --ssd-capacity 64MiB");
            std::fs::create_dir_all(&small_dir).expect("dir");
            vec!["--ssd-capacity", "64MiB"]
        }
    };
    let small = StageServer::start(&env, &small_dir, &dirs.durable, SHARED_SECRET, &extra);
    let big = StageServer::start(
        &env,
        &dirs.ssd("ssd-big"),
        &dirs.durable,
        SHARED_SECRET,
        &[],
    );
    // Stripe: files 0, 2, 4 (72 MiB) go to the small server first.
    let spec: Vec<(String, usize)> = (0..6)
        .map(|i| (format!("f{i}.bin"), 24 * MIB + i))
        .collect();
    let spec: Vec<(&str, usize)> = spec.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    let ck = files(&spec, 4);
    write_files(&env, "/ck", &ck);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = staging_agent(
        &env,
        &dirs.durable,
        &[&small, &big],
        SHARED_SECRET,
        "stripe",
    );
    wait_durable(&env, "/ck", &agent, &[&small, &big]);
    let log = agent.log();
    let all = || logs(&[&log], &[&small, &big]);
    let failure = log
        .lines()
        .find(|l| l.contains(&format!("staging server {} failed", small.addr)))
        .unwrap_or_else(|| panic!("no failure of the full server\n{}", all()));
    assert!(failure.contains("full"), "{failure}");
    assert!(
        log.contains(&format!("meant for {} to {}", small.addr, big.addr)),
        "no failover\n{}",
        all()
    );
    // Every file was acknowledged by the big server. (The small one may have sealed, and
    // then drained, the files of its batch that fitted before it filled up: the agent did
    // not count on them, its Sync failed.)
    let staged = staged_lines(&log);
    assert_eq!(staged.len(), ck.len(), "{}", all());
    assert!(staged.iter().all(|(_, s)| *s == big.addr), "{}", all());
    assert_eq!(big.status().absorbed_files as usize, ck.len());
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    wait_for("the small server to have nothing pending", WAIT, || {
        small.status().pending_files == 0
    });
    assert!(small.status().absorbed_files < 3, "{:?}", small.status());
    stop_agent(&mut agent);
    drop((small, big));
    drop(tmpfs);
    eprintln!(
        "full_server_fails_over_to_the_other: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 4b. The only server is limited to 32 MiB: a file that cannot fit is refused ("full"),
///     and the agent uploads it (and what was sent in the same batch) straight to the
///     durable store; the checkpoint completes. Once its data has drained, the server takes
///     files again.
#[test]
fn full_only_server_sends_files_straight_to_durable() {
    let (_serial, started) = begin();
    let env = Env::new("stage-full1", 256 << 20);
    let dirs = Dirs::new(&env);
    let s = StageServer::start(
        &env,
        &dirs.ssd("ssd"),
        &dirs.durable,
        SHARED_SECRET,
        &["--ssd-capacity", "32MiB"],
    );
    let first = files(&[("a.bin", 6 * MIB)], 5);
    write_files(&env, "/ck", &first);
    let mut agent = staging_agent(&env, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    agent.wait_line("a.bin staged", WAIT, |l| {
        l.starts_with("cascade agent: staged /ck/a.bin ")
    });
    // A 40 MiB file can never fit; the others may, depending on the batches the agent
    // makes of them as they are closed.
    let rest = files(
        &[
            ("b.bin", 2 * MIB),
            ("c.bin", 40 * MIB + 1),
            ("d.bin", 3 * MIB + 2),
        ],
        6,
    );
    write_files(&env, "/ck", &rest);
    env.cascade_ok(&["commit", "/ck"], &[]);
    wait_durable(&env, "/ck", &agent, &[&s]);
    let log = agent.log();
    let all = || logs(&[&log], &[&s]);
    let failure = log
        .lines()
        .find(|l| l.contains(&format!("staging server {} failed", s.addr)))
        .unwrap_or_else(|| panic!("the server never refused\n{}", all()));
    assert!(failure.contains("full"), "not a clear reason: {failure}");
    assert!(
        log.contains("no staging server takes") && log.contains("cascade agent: uploaded /ck/"),
        "no direct upload\n{}",
        all()
    );
    let ck: Vec<Expected> = first.into_iter().chain(rest).collect();
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    // Files staged there and files uploaded directly make up the checkpoint, once each.
    let staged: Vec<String> = staged_lines(&log).into_iter().map(|(p, _)| p).collect();
    let uploaded: Vec<String> = log
        .lines()
        .filter_map(|l| l.strip_prefix("cascade agent: uploaded "))
        .filter_map(|r| r.split(' ').next())
        .map(str::to_string)
        .collect();
    let mut both: Vec<String> = staged.iter().chain(uploaded.iter()).cloned().collect();
    both.sort();
    let mut want: Vec<String> = ck.iter().map(|f| format!("/ck/{}", f.rel)).collect();
    want.sort();
    assert_eq!(both, want, "staged {staged:?}, uploaded {uploaded:?}");
    assert!(uploaded.iter().any(|p| p == "/ck/c.bin"), "{}", all());

    // Drained, the server has room again: a new file is staged there.
    wait_for("the server to drain", WAIT, || {
        let st = s.status();
        st.pending_files == 0 && st.pending_checkpoints == 0
    });
    let again = files(&[("x.bin", 8 * MIB)], 7);
    write_files(&env, "/ck2", &again);
    env.cascade_ok(&["commit", "/ck2"], &[]);
    let out = env.cascade(
        &["wait", "/ck2", "--level", "durable", "--timeout", "60"],
        &[],
    );
    assert!(out.ok(), "{out}\n{}", logs(&[&agent.log()], &[&s]));
    let st = s.status();
    assert!(
        agent
            .log()
            .contains(&format!("staged /ck2/x.bin (8388608 bytes) on {}", s.addr)),
        "a drained server with {} of {:?} bytes in use refused an 8 MiB file:\n{}\n{st:?}",
        st.usage.arena_bytes,
        st.usage.capacity,
        logs(&[&agent.log()], &[&s])
    );
    assert_durable_checkpoint_at(&dirs.durable, "ck2", &refs(&again));
    stop_agent(&mut agent);
    eprintln!(
        "full_only_server_sends_files_straight_to_durable: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 5. An agent with the wrong shared secret is refused (server log, refused_clients), says
///    so, and uploads straight to the durable store; the server stored nothing.
#[test]
fn wrong_secret_is_refused_and_data_goes_straight_down() {
    let (_serial, started) = begin();
    let env = Env::new("stage-secret", 64 << 20);
    let dirs = Dirs::new(&env);
    let mut s = StageServer::start(&env, &dirs.ssd("ssd"), &dirs.durable, SHARED_SECRET, &[]);
    let ck = files(&[("a.bin", 3 * MIB + 5), ("b.bin", 100), ("c.bin", MIB)], 8);
    write_files(&env, "/ck", &ck);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = staging_agent(&env, &dirs.durable, &[&s], "not-the-secret", "stripe");
    wait_durable(&env, "/ck", &agent, &[&s]);
    let log = agent.log();
    let all = || logs(&[&log], &[&s]);
    let failure = log
        .lines()
        .find(|l| l.contains(&format!("staging server {}", s.addr)) && l.contains("failed"))
        .unwrap_or_else(|| panic!("the agent did not report the refusal\n{}", all()));
    assert!(failure.contains("a wrong staging secret"), "{failure}");
    assert!(log.contains("no staging server takes"), "{}", all());
    assert!(staged_lines(&log).is_empty(), "{}", all());
    let server_line = s
        .daemon
        .lines()
        .into_iter()
        .find(|l| l.contains("refused") && l.contains("a wrong staging secret"))
        .unwrap_or_else(|| panic!("the server did not log the refusal:\n{}", s.log()));
    assert!(
        server_line.starts_with("cascade stage-server "),
        "{server_line}"
    );
    let st = cli_status(&env, &s);
    assert!(st.refused_clients > 0, "{st:?}");
    assert_eq!(st.absorbed_bytes, 0, "{st:?}");
    assert_eq!(st.absorbed_files, 0, "{st:?}");
    assert_eq!(st.usage.live_versions, 0, "{st:?}");
    assert_durable_checkpoint_at(&dirs.durable, "ck", &refs(&ck));
    // `stage-server status` with the wrong secret: one line, exit 1.
    let out = env.cascade(
        &["stage-server", "status", &s.addr],
        &[("CASCADE_STAGING_SECRET", "not-the-secret")],
    );
    assert_eq!(out.status.code(), Some(1), "{out}");
    let lines = out.err_lines();
    assert!(
        lines.len() == 1
            && lines[0].starts_with("cascade: ")
            && lines[0].contains("a wrong staging secret"),
        "{out}"
    );
    stop_agent(&mut agent);
    // SIGTERM stops a server cleanly.
    let status = s.daemon.term(Duration::from_secs(30));
    assert!(
        status.success(),
        "stage-server after SIGTERM: {status}\n{}",
        s.log()
    );
    assert!(
        s.daemon
            .lines()
            .iter()
            .any(|l| l == "cascade stage-server: stopped"),
        "{}",
        s.log()
    );
    eprintln!(
        "wrong_secret_is_refused_and_data_goes_straight_down: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 6. A node's checkpoint is staged but not drained (broken drain target); the node store is
///    destroyed. A fresh store with an agent of the same staging configuration reads the
///    files back from the staging server: by FETCH on the agent's socket, and by a program
///    under `cascade run` opening the path. The durable store never had them.
#[test]
fn new_node_reads_staged_files_back() {
    let (_serial, started) = begin();
    let old = Env::new("stage-node1", 64 << 20);
    let dirs = Dirs::new(&old);
    let s = dirs.server_that_cannot_drain(&old, "ssd");
    let ck = files(&[("a.bin", 5 * MIB + 3), ("b.bin", 3 * MIB + 1)], 9);
    write_files(&old, "/ck", &ck);
    old.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = staging_agent(&old, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    agent.wait_line("the checkpoint pushed", WAIT, |l| {
        l.starts_with("cascade agent: checkpoint /ck staged")
    });
    stop_agent(&mut agent);
    let out = old.cascade_ok(&["destroy", "--force"], &[]);
    assert!(out.stdout.contains("destroyed"), "{out}");
    assert!(
        !dirs.durable_has("ck/a.bin") && !dirs.durable_has("ck/b.bin"),
        "the durable store has the files: the test would prove nothing"
    );

    let new = Env::new("stage-node2", 64 << 20);
    let mut agent = staging_agent(&new, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    let reply = cascade_agent::request(&new.name, "FETCH /ck/a.bin").expect("FETCH");
    assert_eq!(
        reply,
        "OK",
        "FETCH /ck/a.bin\n{}",
        logs(&[&agent.log()], &[&s])
    );
    assert!(
        new.read("/ck/a.bin") == ck[0].data,
        "fetched bytes of /ck/a.bin differ"
    );
    agent.wait_line("the fetch from staging", WAIT, |l| {
        l.contains("fetched /ck/a.bin") && l.contains("from a staging server")
    });
    let levels = new.levels();
    assert!(
        levels_line(&levels, "/ck/a.bin").is_some_and(|l| l.contains("staged")),
        "{levels}"
    );

    // An unmodified program opening the path under `cascade run`.
    let mount = format!("/cascade-stage-node2-{}", std::process::id());
    let _mount = RemoveDir(mount.clone());
    let orig = new.tmp.path().join("b.orig");
    std::fs::write(&orig, &ck[1].data).expect("write b.orig");
    let out = new.cascade(
        &[
            "run",
            "--mount",
            &mount,
            "--",
            "cmp",
            &format!("{mount}/ck/b.bin"),
            &path_str(&orig),
        ],
        &[],
    );
    assert!(
        out.ok(),
        "cmp of the read-through file: {out}\n{}",
        logs(&[&agent.log()], &[&s])
    );
    assert!(new.read("/ck/b.bin") == ck[1].data);
    assert_eq!(agent.log().matches("from a staging server").count(), 2);
    assert!(!dirs.durable_has("ck/a.bin") && !dirs.durable_has("ck/b.bin"));
    stop_agent(&mut agent);
    eprintln!(
        "new_node_reads_staged_files_back: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 6b. A staged copy without this job's tag does not override the durable store's copy: a
///     newer version staged before version tags existed (its index record rewritten as an
///     older server wrote it) is passed over by read-through with one line, and the durable
///     version is fetched.
#[test]
fn a_staged_copy_without_the_jobs_tag_does_not_override_the_durable_one() {
    let (_serial, started) = begin();
    let env = Env::new("stage-untagged", 64 << 20);
    let dirs = Dirs::new(&env);
    // The durable store's version, uploaded by an agent without staging servers.
    let durable_version = random(MIB, 61);
    env.store().create_dir_all("/ck", 0o755).expect("mkdir /ck");
    env.write("/ck/a.bin", &durable_version);
    env.cascade_ok(&["commit", "/ck"], &[]);
    let mut agent = env.agent(&dirs.durable, &[]);
    wait_durable(&env, "/ck", &agent, &[]);
    stop_agent(&mut agent);

    // A newer version on a server that cannot drain it (its drain target has a regular
    // file where the directory ck would go), staged with its tag...
    let ssd = dirs.ssd("ssd");
    let blocked = dirs.ssd("blocked");
    std::fs::write(blocked.join("ck"), b"not a directory\n").expect("block ck/");
    let mut s = StageServer::start(&env, &ssd, &path_str(&blocked), SHARED_SECRET, &[]);
    let staged_version = random(MIB, 62);
    let mut opts = ClientOptions::new(SHARED_SECRET);
    opts.io_timeout = WAIT;
    let mut c = Connection::connect(&s.addr, &opts).expect("connect");
    let stamp = cascade_durable::now_unix_ns() + 3_600_000_000_000;
    let size = staged_version.len() as u64;
    let seal = c.seal(
        "ck/a.bin",
        stamp,
        size,
        *blake3::hash(&staged_version).as_bytes(),
    );
    c.write(&[OutSegment {
        key: "ck/a.bin",
        stamp,
        size,
        offset: 0,
        seal: Some(seal),
        data: &[&staged_version],
    }])
    .expect("write");
    c.sync().expect("sync");
    c.goodbye();
    // ...then recorded without it, as a server from before tags would have.
    s.kill9();
    assert_eq!(untag_seals(&ssd.join("index.log")), 1);
    s.restart(&env, &path_str(&blocked));
    assert_eq!(s.pull_file("ck/a.bin").stamp, stamp, "{}", s.log());

    // A fresh node reads /ck/a.bin through: the durable version, not the staged one.
    let new = Env::new("stage-untagged2", 64 << 20);
    let mut agent = staging_agent(&new, &dirs.durable, &[&s], SHARED_SECRET, "stripe");
    let reply = cascade_agent::request(&new.name, "FETCH /ck/a.bin").expect("FETCH");
    let all = || logs(&[&agent.log()], &[&s]);
    assert_eq!(reply, "OK", "FETCH /ck/a.bin\n{}", all());
    assert!(
        new.read("/ck/a.bin") == durable_version,
        "read-through took the untagged staged copy\n{}",
        all()
    );
    agent.wait_line("the refusal of the staged copy", WAIT, |l| {
        l.contains("ck/a.bin") && l.contains("this job did not write")
    });
    stop_agent(&mut agent);
    eprintln!(
        "a_staged_copy_without_the_jobs_tag_does_not_override_the_durable_one: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 7. `cascade stage-server` without an address, a directory, a drain target or a secret,
///    with an unusable directory or a taken port, and `stage-server status` of a dead
///    address: one line on stderr, exit code 1, nothing left running.
#[test]
fn stage_server_command_line_errors() {
    let (_serial, started) = begin();
    let env = Env::without_store("stage-cli");
    let dir = path_str(&env.tmp.path().join("ssd"));
    let durable = path_str(&env.tmp.path().join("durable"));
    let file = env.tmp.path().join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_addr = taken.local_addr().expect("addr").to_string();
    let dead_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let secret = [("CASCADE_STAGING_SECRET", SHARED_SECRET)];
    // (arguments, environment, what the error line must mention)
    type Case<'a> = (Vec<&'a str>, &'a [(&'a str, &'a str)], &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["stage-server", "--dir", &dir, "--drain-to", &durable],
            &secret,
            "--listen",
        ),
        (
            vec![
                "stage-server",
                "--listen",
                "127.0.0.1:0",
                "--drain-to",
                &durable,
            ],
            &secret,
            "--dir",
        ),
        (
            vec!["stage-server", "--listen", "127.0.0.1:0", "--dir", &dir],
            &secret,
            "--drain-to",
        ),
        (
            vec![
                "stage-server",
                "--listen",
                "127.0.0.1:0",
                "--dir",
                &dir,
                "--drain-to",
                &durable,
            ],
            &[],
            "CASCADE_STAGING_SECRET",
        ),
        (
            vec![
                "stage-server",
                "--listen",
                "127.0.0.1:0",
                "--dir",
                file.to_str().expect("utf-8"),
                "--drain-to",
                &durable,
            ],
            &secret,
            "a-file",
        ),
        (
            vec![
                "stage-server",
                "--listen",
                &taken_addr,
                "--dir",
                &dir,
                "--drain-to",
                &durable,
            ],
            &secret,
            &taken_addr,
        ),
        (
            vec!["stage-server", "status", &dead_addr],
            &secret,
            &dead_addr,
        ),
        (
            vec!["stage-server", "status", &dead_addr],
            &[],
            "CASCADE_STAGING_SECRET",
        ),
    ];
    for (args, envs, mention) in &cases {
        let out = env.cascade(args, envs);
        assert_eq!(out.status.code(), Some(1), "cascade {args:?}: {out}");
        let lines = out.err_lines();
        assert!(
            lines.len() == 1 && lines[0].starts_with("cascade: ") && lines[0].contains(mention),
            "cascade {args:?}: want one line mentioning {mention:?}: {out}"
        );
        assert!(
            out.seconds < 30.0,
            "cascade {args:?} took {:.1} s",
            out.seconds
        );
    }
    drop(taken);
    eprintln!(
        "stage_server_command_line_errors: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
