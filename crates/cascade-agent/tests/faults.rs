//! Fault injection against real processes and real servers: the `cascade` CLI (agent, run,
//! commit, wait, ls --levels, put), Python programs under `cascade run`, and a versitygw S3
//! server on 127.0.0.1 (found like the other S3 tests: $VERSITYGW, $PATH, ~/go/bin, ...).
//!
//! - the agent killed with SIGKILL at three moments of a drain, then restarted;
//! - an application killed half way through writing a file;
//! - the S3 server killed in the middle of a drain, then restarted;
//! - bad durable stores (wrong key, missing bucket, unwritable directory);
//! - retention and a full store: nothing that is not durable is ever evicted.
//!
//! The `cascade` binary is built once by the test kit (`cargo build -p cascade-cli -p
//! cascade-preload` into this test's target directory and profile; see
//! crates/cascade-testkit/src/build.rs). Every test has a store of its own,
//! `/cascade-faults-<test>-<pid>`, destroyed when it ends (pass or fail), and the tests run
//! one at a time. Nothing waits by sleeping: every wait polls a condition with a deadline
//! (an object or a line appearing, a process exiting, `cascade wait` returning).

use std::time::{Duration, Instant};

use cascade_durable::DurableStore;
use cascade_store::{OpenOptions, Store};
use cascade_testkit::*;

/// After a crash: no marker for `ckpt`, and every object of it that exists is whole and equal
/// to the store's bytes; those with a checksum object beside it verify against it.
/// Returns the data objects present (relative to the checkpoint).
fn assert_partial_upload_consistent(
    durable: &DurableStore,
    ckpt: &str,
    files: &[Expected],
) -> Vec<String> {
    assert!(
        !durable.is_complete(ckpt).expect("is_complete"),
        "{ckpt} has a completion marker although the agent was killed before finishing it"
    );
    let objects = durable.list(ckpt).expect("list");
    let names: Vec<String> = objects
        .iter()
        .map(|o| {
            o.path
                .strip_prefix(&format!("{ckpt}/"))
                .unwrap_or_else(|| panic!("object {} outside {ckpt}/", o.path))
                .to_string()
        })
        .collect();
    let mut data_objects = Vec::new();
    for name in &names {
        assert_ne!(name, ".cascade-complete", "{ckpt}: a marker exists");
        // Version objects (`.NAME.cascade-version`) precede the data and may exist alone.
        if name.rsplit('/').next().is_some_and(|b| b.starts_with('.'))
            && name.ends_with(".cascade-version")
        {
            continue;
        }
        if let Some(data) = name.strip_suffix(".blake3") {
            assert!(
                names.iter().any(|n| n == data),
                "{ckpt}/{name} exists without its data object"
            );
            continue;
        }
        let want = files
            .iter()
            .find(|f| f.rel == *name)
            .unwrap_or_else(|| panic!("unexpected object {ckpt}/{name}"));
        let key = format!("{ckpt}/{name}");
        let got = durable.get_bytes(&key).expect("download");
        assert_eq!(
            b3(&got),
            want.blake3,
            "{key} exists but is not the store's bytes (an object must appear whole or not at all)"
        );
        if names.iter().any(|n| *n == format!("{name}.blake3")) {
            let digest = durable
                .verify_file(&key)
                .unwrap_or_else(|e| panic!("verify {key}: {e}"));
            assert_eq!(digest.blake3, want.blake3, "{key}");
            assert_eq!(
                durable.recorded_checksum(&key).expect("checksum"),
                want.blake3,
                "{key}.blake3"
            );
        }
        data_objects.push(name.clone());
    }
    data_objects.sort();
    data_objects
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Moment {
    /// The first file's upload is in progress: no data object exists yet.
    FirstFileUploading,
    /// The first file and its checksum are up; the second one's upload is running.
    SecondFileUploading,
    /// Every closed file and its checksum are up; the marker waits for the last file, which
    /// the test holds open for writing.
    AllChecksumsNoMarker,
}

/// 1. The agent is killed with SIGKILL in the middle of a drain (three different moments),
///    then started again: the checkpoint completes, with the right bytes and marker, and
///    nothing the killed agent left behind is ever taken for complete.
#[test]
fn agent_killed_mid_upload_then_restarted() {
    let (_serial, started) = begin();
    let gw = Versitygw::start();
    let files = [
        expected("a.dat", pattern(96 * MIB, 1)),
        expected("b.dat", pattern(96 * MIB, 2)),
        expected("c.dat", pattern(8 * MIB + 123, 3)),
        expected("d.dat", pattern(1000, 4)),
    ];
    let moments = [
        Moment::FirstFileUploading,
        Moment::SecondFileUploading,
        Moment::AllChecksumsNoMarker,
    ];
    for (round, moment) in moments.into_iter().enumerate() {
        let round_started = Instant::now();
        let env = Env::new(&format!("kill{round}"), 256 << 20);
        let bucket = format!("round{round}");
        gw.create_bucket(&bucket);
        let url = gw.url(&bucket);
        let held_open = moment == Moment::AllChecksumsNoMarker;

        env.store().mkdir("/ckpt.1", 0o755).expect("mkdir");
        for f in &files {
            let data: &[u8] = if held_open && f.rel == "d.dat" {
                &[]
            } else {
                &f.data
            };
            env.write(&format!("/ckpt.1/{}", f.rel), data);
        }
        env.cascade_ok(&["commit", "/ckpt.1"], &[]);
        // The application is still writing d.dat: the marker cannot be written.
        let held = held_open.then(|| {
            env.store()
                .open("/ckpt.1/d.dat", &OpenOptions::new().write(true))
                .expect("open d.dat for writing")
        });

        let mut agent = env.agent(&url, &[]);
        let has = |key: &str| gw.has(&bucket, &format!("ckpt.1/{key}"));
        let timeout = Duration::from_secs(60);
        match moment {
            Moment::FirstFileUploading => {
                wait_for("a.dat's upload to be under way", timeout, || {
                    env.uploading("/ckpt.1/a.dat")
                })
            }
            Moment::SecondFileUploading => wait_for(
                "a.dat uploaded and b.dat's upload under way",
                timeout,
                || has("a.dat.blake3") && env.uploading("/ckpt.1/b.dat"),
            ),
            Moment::AllChecksumsNoMarker => wait_for(
                "a.dat, b.dat and c.dat uploaded with their checksums",
                timeout,
                || has("a.dat.blake3") && has("b.dat.blake3") && has("c.dat.blake3"),
            ),
        }
        let status = agent.kill9();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "the agent was not killed: {status}; its stderr:\n{}",
            agent.log()
        );
        let killed_log = agent.log();
        drop(agent);
        // With the agent dead, `cascade wait` fails at once with the reason (no agent, or
        // the file still being written) instead of waiting for nothing.
        let out = env.cascade(&["wait", "/ckpt.1", "--timeout", "60"], &[]);
        let reason = if held_open {
            "/ckpt.1/d.dat is still open for writing"
        } else {
            "no agent is running"
        };
        assert!(
            !out.ok() && out.seconds < 10.0 && out.stderr.contains(reason),
            "cascade wait with the agent dead: {out}"
        );

        let durable = DurableStore::open(&url).expect("open durable");
        assert!(
            !has(".cascade-complete"),
            "round {round}: marker after kill"
        );
        let present = assert_partial_upload_consistent(&durable, "ckpt.1", &files);
        // The moment was the one intended (the kill did not come too late).
        let want_present: &[&str] = match moment {
            Moment::FirstFileUploading => &[],
            Moment::SecondFileUploading => &["a.dat"],
            Moment::AllChecksumsNoMarker => &["a.dat", "b.dat", "c.dat"],
        };
        assert_eq!(
            present, want_present,
            "round {round} ({moment:?}): data objects after the kill; agent log:\n{killed_log}"
        );
        // Nothing changed in the store.
        let tree = env.store().life_tree("/ckpt.1").expect("life_tree");
        assert!(tree[0].committed && !tree[0].complete(), "{:?}", tree[0]);

        if let Some(h) = held {
            h.write_all_at(&files[3].data, 0).expect("write d.dat");
            drop(h);
        }
        let mut agent = env.agent(&url, &[]);
        let out = env.cascade(
            &["wait", "/ckpt.1", "--level", "durable", "--timeout", "120"],
            &[("CASCADE_DURABLE", &url)],
        );
        assert!(
            out.ok(),
            "round {round}: cascade wait failed: {out}\nagent:\n{}",
            agent.log()
        );
        for f in &files {
            let in_store = env.read(&format!("/ckpt.1/{}", f.rel));
            assert!(
                in_store == f.data,
                "round {round}: store bytes of {}",
                f.rel
            );
        }
        assert_durable_checkpoint(&durable, "ckpt.1", &files.iter().collect::<Vec<_>>());
        stop_agent(&mut agent);
        eprintln!(
            "round {round} ({moment:?}): {:.1} s",
            round_started.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "agent_killed_mid_upload_then_restarted: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The program of test 2: writes and commits ckpt.1 (through cascade_commit of the preloaded
/// library), then writes half of ckpt.2/b.dat and kills itself with SIGKILL.
const KILLED_WRITER: &str = r#"
import ctypes, os, sys
m = os.environ["CASCADE_MOUNT"]
a = bytes(range(256)) * (12 * 1024)          # 3 MiB
os.makedirs(m + "/ckpt.1")
with open(m + "/ckpt.1/a.dat", "wb") as f:
    f.write(a)
lib = ctypes.CDLL(None, use_errno=True)
lib.cascade_commit.argtypes = [ctypes.c_char_p]
lib.cascade_strerror_last.restype = ctypes.c_char_p
if lib.cascade_commit((m + "/ckpt.1").encode()) != 0:
    print("commit failed:", lib.cascade_strerror_last(), file=sys.stderr)
    sys.exit(3)
os.makedirs(m + "/ckpt.2")
fd = os.open(m + "/ckpt.2/b.dat", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
half = bytes(reversed(range(256))) * (4 * 1024)  # 1 MiB of 2
os.write(fd, half)
print("half written", flush=True)
os.kill(os.getpid(), 9)
"#;

/// 2. The application is killed while writing: the checkpoint it committed before is durable
///    and complete; the half-written file is torn, is never uploaded nor gets a marker, cannot
///    be committed (EIO naming it), and `cascade wait` fails with the reason at once.
#[test]
fn application_killed_mid_write() {
    let (_serial, started) = begin();
    let env = Env::new("appkill", 64 << 20);
    let mount = format!("/cascade-faults-appkill-{}", std::process::id());
    let _mount = RemoveDir(mount.clone());
    let dur = env.tmp.path().join("durable");
    let dur_url = dur.to_str().expect("utf-8").to_string();
    let a_data: Vec<u8> = (0..=255u8).cycle().take(3 * MIB).collect();
    let a = expected("a.dat", a_data);
    let mut problems: Vec<String> = Vec::new();

    let out = env.cascade(
        &[
            "run",
            "--mount",
            &mount,
            "--durable",
            &dur_url,
            "--",
            "/usr/bin/python3",
            "-c",
            KILLED_WRITER,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(137), "cascade run: {out}");
    assert!(out.stdout.contains("half written"), "{out}");

    // The committed checkpoint reached the durable store before `cascade run` returned.
    let durable = DurableStore::open(&dur_url).expect("open durable");
    assert_durable_checkpoint(&durable, "ckpt.1", &[&a]);
    assert!(!dur.join("ckpt.2/.cascade-complete").exists());
    assert!(
        !dur.join("ckpt.2/b.dat").exists(),
        "a half-written file was uploaded"
    );

    // `cascade run` swept the dead writer's description at the end of the job ("Writers that
    // died are torn now, not 'still open'"), so without any agent the file is torn at once.
    let levels = env.levels();
    let line = levels_line(&levels, "/ckpt.2/b.dat").unwrap_or_default();
    if !line.contains("torn (writer died)") {
        problems.push(format!(
            "right after `cascade run` returned, `cascade ls --levels` shows b.dat as {line:?}, \
             not torn (the end-of-job sweep skipped the dead writer's description)"
        ));
        let out = env.cascade(&["commit", "/ckpt.2"], &[]);
        problems.push(format!(
            "  meanwhile `cascade commit /ckpt.2` says: {}",
            out.stderr.trim()
        ));
        let out = env.cascade(&["wait", "/ckpt.2", "--timeout", "30"], &[]);
        problems.push(format!(
            "  and `cascade wait /ckpt.2` says (exit {}): {}",
            out.status,
            out.stderr.trim()
        ));
    }

    // An agent sweeps dead writers (at start, then every 2 s while files are open).
    let mut agent = env.agent(&dur_url, &[]);
    wait_for("b.dat to be reported torn", Duration::from_secs(20), || {
        levels_line(&env.levels(), "/ckpt.2/b.dat")
            .is_some_and(|l| l.contains("torn (writer died)"))
    });
    let out = env.cascade(&["commit", "/ckpt.2"], &[]);
    assert!(!out.ok(), "committing a torn checkpoint succeeded: {out}");
    let lines = out.err_lines();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].contains("Input/output error") && lines[0].contains("/ckpt.2/b.dat"),
        "commit of a torn checkpoint: {out}"
    );
    let out = env.cascade(
        &["wait", "/ckpt.2", "--level", "durable", "--timeout", "60"],
        &[("CASCADE_DURABLE", &dur_url)],
    );
    assert!(!out.ok(), "{out}");
    assert!(
        out.seconds < 10.0,
        "cascade wait hung on a torn file: {out}"
    );
    assert!(
        out.stderr.contains("/ckpt.2/b.dat") && out.stderr.contains("died"),
        "cascade wait should name the torn file: {out}"
    );
    env.cascade_ok(
        &["wait", "/ckpt.1", "--level", "durable", "--timeout", "60"],
        &[("CASCADE_DURABLE", &dur_url)],
    );
    // A pass of the agent after the sweep: a new file is uploaded; b.dat still is not.
    let probe = env.tmp.path().join("probe.dat");
    std::fs::write(&probe, b"probe").expect("probe");
    env.cascade_ok(&["put", probe.to_str().expect("utf-8"), "/probe.dat"], &[]);
    wait_for(
        "the agent to upload /probe.dat",
        Duration::from_secs(30),
        || dur.join("probe.dat.blake3").exists(),
    );
    assert!(
        !dur.join("ckpt.2/b.dat").exists(),
        "the torn file was uploaded"
    );
    assert!(!dur.join("ckpt.2/.cascade-complete").exists());
    assert_eq!(env.read("/ckpt.2/b.dat").len(), MIB, "b.dat in the store");
    stop_agent(&mut agent);
    eprintln!(
        "application_killed_mid_write: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// One "upload of PATH failed (attempt N): ...; retrying in D s" line: (N, D).
fn failure_line(line: &str, path: &str) -> Option<(u32, f64)> {
    let rest = line.strip_prefix(&format!("cascade agent: upload of {path} failed (attempt "))?;
    let (n, rest) = rest.split_once("): ")?;
    let delay = rest.rsplit_once("; retrying in ")?.1.strip_suffix(" s")?;
    Some((n.parse().ok()?, delay.parse().ok()?))
}

/// 3. The S3 server is killed while a large checkpoint is uploading: the agent keeps running,
///    reports each failed attempt with a growing backoff, evicts nothing and writes no marker;
///    once the server is back on the same port and data, the drain completes and verifies.
#[test]
fn s3_server_killed_mid_drain_then_restarted() {
    let (_serial, started) = begin();
    let env = Env::new("s3down", 256 << 20);
    let mut gw = Versitygw::start();
    gw.create_bucket("bkt");
    let url = gw.url("bkt");
    let big = expected("big.dat", pattern(160 * MIB, 11));
    let small = expected("small.dat", pattern(3 * MIB + 5, 12));
    for (ckpt, f) in [("/ckpt.1", &big), ("/ckpt.2", &small)] {
        env.store().mkdir(ckpt, 0o755).expect("mkdir");
        env.write(&format!("{ckpt}/{}", f.rel), &f.data);
        env.cascade_ok(&["commit", ckpt], &[]);
    }
    // keep = 1: ckpt.1 is beyond retention, so only its not being durable keeps it.
    let mut agent = env.agent(&url, &[("CASCADE_KEEP", "1")]);
    wait_for(
        "big.dat's upload to be under way",
        Duration::from_secs(60),
        || env.uploading_any(),
    );
    gw.stop();

    agent.wait_line(
        "a third failed attempt for big.dat",
        Duration::from_secs(60),
        |l| failure_line(l, "/ckpt.1/big.dat").is_some_and(|(n, _)| n >= 3),
    );
    assert!(agent.alive(), "the agent exited: {}", agent.log());
    let attempts: Vec<(u32, f64)> = agent
        .lines()
        .iter()
        .filter_map(|l| failure_line(l, "/ckpt.1/big.dat"))
        .collect();
    let numbers: Vec<u32> = attempts.iter().map(|a| a.0).collect();
    assert_eq!(
        numbers,
        (1..=numbers.len() as u32).collect::<Vec<_>>(),
        "attempts are counted up one by one: {}",
        agent.log()
    );
    assert!(
        attempts
            .windows(2)
            .all(|w| w[1].1 > w[0].1 || w[1].1 >= 30.0),
        "the backoff grows: {attempts:?}"
    );
    for l in agent.lines().iter().filter(|l| l.contains("failed")) {
        assert!(
            l.starts_with("cascade agent: upload of /ckpt.") && l.contains("; retrying in "),
            "unexpected failure line: {l}"
        );
    }
    for l in agent.lines().iter().filter(|l| l.contains("failed")) {
        eprintln!("  {l}");
    }
    // `cascade wait` times out with the agent's last error.
    let out = env.cascade(&["wait", "/ckpt.1", "--timeout", "1"], &[]);
    assert!(!out.ok(), "{out}");
    assert!(
        out.stderr.contains("timed out")
            && out.stderr.contains("the agent's last error: upload of"),
        "{out}"
    );
    let status = cascade_agent::request(&env.name, "STATUS").expect("STATUS");
    let json: serde_json::Value =
        serde_json::from_str(status.strip_prefix("OK ").expect("OK")).expect("json");
    assert!(json["failures"].as_u64().unwrap_or(0) >= 3, "{status}");
    assert!(json["last_error"].is_string(), "{status}");

    // Nothing was evicted, nothing is durable, no marker.
    let levels = env.levels();
    for (path, state) in [
        ("/ckpt.1/", "draining (0/1 files durable)"),
        ("/ckpt.2/", "draining (0/1 files durable)"),
        ("/ckpt.1/big.dat", "dirty"),
        ("/ckpt.2/small.dat", "dirty"),
    ] {
        let line = levels_line(&levels, path).unwrap_or_else(|| panic!("{path} gone:\n{levels}"));
        assert!(line.contains(state), "{path}: {line}\n{levels}");
    }
    assert!(env.read("/ckpt.1/big.dat") == big.data);
    assert!(env.read("/ckpt.2/small.dat") == small.data);
    for ckpt in ["ckpt.1", "ckpt.2"] {
        assert!(!gw.has("bkt", &format!("{ckpt}/.cascade-complete")));
    }

    gw.restart();
    for ckpt in ["/ckpt.1", "/ckpt.2"] {
        let out = env.cascade(
            &["wait", ckpt, "--level", "durable", "--timeout", "60"],
            &[("CASCADE_DURABLE", &url)],
        );
        assert!(out.ok(), "{ckpt}: {out}\nagent:\n{}", agent.log());
    }
    assert!(agent.alive());
    let durable = DurableStore::open(&url).expect("open durable");
    assert_durable_checkpoint(&durable, "ckpt.1", &[&big]);
    assert_durable_checkpoint(&durable, "ckpt.2", &[&small]);
    stop_agent(&mut agent);
    eprintln!(
        "s3_server_killed_mid_drain_then_restarted: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 4. A durable store the agent cannot use: `cascade agent` and `cascade run` refuse at
///    once, with one line naming the problem, and run nothing.
#[test]
fn bad_durable_store_is_refused_with_one_line() {
    let (_serial, started) = begin();
    let gw = Versitygw::start();
    gw.create_bucket("bkt");
    let env = Env::new("baddur", 16 << 20);
    let plain = env.tmp.path().join("plain-file");
    std::fs::write(&plain, b"not a directory").expect("file");
    let bad_dir = plain.join("durable");
    let bad_dir = bad_dir.to_str().expect("utf-8").to_string();
    let mount = format!("/cascade-faults-baddur-{}", std::process::id());
    let _mount = RemoveDir(mount.clone());
    let secret_wrong = "wrong-secret-0123456789";
    let cases: Vec<(&str, String, Vec<Vec<&str>>)> = vec![
        (
            "wrong secret",
            gw.url_with("bkt", versitygw::ACCESS, secret_wrong),
            vec![vec!["access denied"]],
        ),
        (
            "unknown access key",
            gw.url_with("bkt", "nosuchaccesskey", versitygw::SECRET),
            vec![vec!["access denied"], vec!["access key"]],
        ),
        (
            "missing bucket",
            gw.url("nosuchbucket"),
            vec![vec!["nosuchbucket", "does not exist"]],
        ),
        (
            "directory under a regular file",
            bad_dir.clone(),
            vec![vec![bad_dir.as_str(), "not writable"]],
        ),
    ];
    let mut problems = Vec::new();
    for (i, (what, url, any_of)) in cases.iter().enumerate() {
        let check = |cmd: &str, out: &Out| {
            assert!(!out.ok(), "{what}: {cmd} succeeded: {out}");
            assert!(
                out.seconds < 10.0,
                "{what}: {cmd} took {:.1} s",
                out.seconds
            );
            let lines = out.err_lines();
            assert_eq!(lines.len(), 1, "{what}: {cmd}: one line on stderr: {out}");
            let line = lines[0].to_lowercase();
            assert!(
                any_of
                    .iter()
                    .any(|words| words.iter().all(|w| line.contains(&w.to_lowercase()))),
                "{what}: {cmd}: the line does not name the problem ({any_of:?}): {out}"
            );
            assert!(!line.contains(secret_wrong) && !line.contains(versitygw::SECRET));
            assert!(out.stdout.is_empty(), "{what}: {cmd}: {out}");
        };
        // The URL comes from the environment: as a flag, a secret key in it would add a
        // warning line (the command line is public).
        let durable = [("CASCADE_DURABLE", url.as_str())];
        let out = env.cascade(&["agent"], &durable);
        check("cascade agent", &out);
        assert_eq!(
            env.store().agent_pid(),
            None,
            "{what}: an agent stayed registered"
        );
        let ran = env.tmp.path().join(format!("ran-{i}"));
        let out = env.cascade(
            &[
                "run",
                "--mount",
                &mount,
                "--",
                "touch",
                ran.to_str().expect("utf-8"),
            ],
            &durable,
        );
        check("cascade run", &out);
        assert!(!ran.exists(), "{what}: cascade run ran the command");
        eprintln!("{what}: {}", out.err_lines()[0]);
    }

    // A refused agent or job leaves nothing behind: no store is created for it.
    let fresh = Env::without_store("baddur-new");
    let small = [
        ("CASCADE_CAPACITY", "8MiB"),
        ("CASCADE_SPILL_SIZE", "0"),
        ("CASCADE_PREFAULT", "off"),
    ];
    for args in [
        vec!["agent", "--durable", bad_dir.as_str()],
        vec![
            "run",
            "--mount",
            mount.as_str(),
            "--durable",
            bad_dir.as_str(),
            "--",
            "true",
        ],
    ] {
        let out = fresh.cascade(&args, &small);
        assert!(!out.ok(), "{args:?}: {out}");
        if Store::exists(&fresh.name) {
            problems.push(format!(
                "`cascade {}` refused to start ({}) but created the store {} first",
                args.join(" "),
                out.stderr.trim(),
                fresh.name
            ));
            let _ = Store::destroy_forced(&fresh.name);
        }
    }
    eprintln!(
        "bad_durable_store_is_refused_with_one_line: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// 5. Retention with keep = 1 on a store that holds three checkpoints but not four: older
///    checkpoints are evicted once durable; ones that are not durable are never evicted, so a
///    writer that needs their space gets ENOSPC (at once without an agent, after
///    CASCADE_FULL_WAIT with one); and a blocked writer proceeds once the agent has made the
///    older checkpoints durable and evicted them.
#[test]
fn retention_never_evicts_data_that_is_not_durable() {
    let (_serial, started) = begin();
    let env = Env::new("retain", 64 << 20);
    let dur = env.tmp.path().join("durable");
    let url = dur.to_str().expect("utf-8").to_string();
    let with_durable = [("CASCADE_DURABLE", url.as_str())];
    let ckpt_data: Vec<Expected> = (1..=5)
        .map(|n| expected("data.bin", pattern(20 * MIB, 100 + n)))
        .collect();
    let local = |name: &str, data: &[u8]| -> String {
        let p = env.tmp.path().join(name);
        std::fs::write(&p, data).expect("local file");
        p.to_str().expect("utf-8").to_string()
    };
    let put_ckpt = |n: usize| {
        let src = local(&format!("ckpt{n}.bin"), &ckpt_data[n - 1].data);
        env.cascade_ok(&["put", "-p", &src, &format!("/ckpt.{n}/data.bin")], &[]);
        env.cascade_ok(&["commit", &format!("/ckpt.{n}")], &[])
    };
    let in_store = |n: usize| env.ls("/").contains(&format!("ckpt.{n}"));
    let durable = DurableStore::open(&url).expect("open durable");

    // Three checkpoints, each waited for: the older ones go once durable.
    let mut agent = env.agent(&url, &[("CASCADE_KEEP", "1"), ("CASCADE_FULL_WAIT", "5")]);
    for n in 1..=3 {
        put_ckpt(n);
        env.cascade_ok(
            &["wait", &format!("/ckpt.{n}"), "--timeout", "60"],
            &with_durable,
        );
        if n > 1 {
            wait_for(
                &format!("ckpt.{} to be evicted", n - 1),
                Duration::from_secs(30),
                || !in_store(n - 1),
            );
        }
    }
    assert_eq!(env.ls("/"), ["ckpt.3"]);
    for n in 1..=3 {
        assert_durable_checkpoint(&durable, &format!("ckpt.{n}"), &[&ckpt_data[n - 1]]);
    }
    stop_agent(&mut agent);

    // Two more, with no agent: not durable.
    for n in 4..=5 {
        let out = put_ckpt(n);
        assert!(out.stdout.contains("no agent is running"), "{out}");
    }
    assert_eq!(env.ls("/"), ["ckpt.3", "ckpt.4", "ckpt.5"]);

    // No agent: a writer that needs space gets ENOSPC at once.
    let src20 = local("w20.bin", &pattern(20 * MIB, 7));
    let out = env.cascade(&["put", "-p", &src20, "/ckpt.6/x.bin"], &[]);
    assert!(!out.ok(), "{out}");
    assert!(out.stderr.contains("No space left on device"), "{out}");
    assert!(!out.stderr.contains("waiting up to"), "{out}");
    assert!(
        out.seconds < 3.0,
        "ENOSPC without an agent must be immediate: {out}"
    );
    env.cascade_ok(&["rm", "-r", "/ckpt.6"], &[]);

    // An agent that cannot make ckpt.4 and ckpt.5 durable (a regular file stands where their
    // directories go): it evicts ckpt.3 (durable, beyond keep) and nothing else; a writer
    // waits CASCADE_FULL_WAIT for it, with one line, then gets ENOSPC.
    std::fs::write(dur.join("ckpt.4"), b"blocks ckpt.4/").expect("block");
    std::fs::write(dur.join("ckpt.5"), b"blocks ckpt.5/").expect("block");
    let mut agent = env.agent(&url, &[("CASCADE_KEEP", "1"), ("CASCADE_FULL_WAIT", "1")]);
    agent.wait_line("a failed upload of ckpt.4", Duration::from_secs(30), |l| {
        l.contains("upload of /ckpt.4/data.bin failed (attempt")
    });
    wait_for("ckpt.3 to be evicted", Duration::from_secs(30), || {
        !in_store(3)
    });
    let src30 = local("w30.bin", &pattern(30 * MIB, 8));
    let out = env.cascade(&["put", "-p", &src30, "/ckpt.6/x.bin"], &[]);
    assert!(!out.ok(), "{out}");
    assert!(out.stderr.contains("No space left on device"), "{out}");
    assert_eq!(
        out.stderr
            .matches("waiting up to 1.0 s for the agent")
            .count(),
        1,
        "{out}"
    );
    assert!(
        (1.0..10.0).contains(&out.seconds),
        "ENOSPC after CASCADE_FULL_WAIT=1: {out}"
    );
    assert!(agent.alive(), "{}", agent.log());
    assert_eq!(env.ls("/"), ["ckpt.4", "ckpt.5", "ckpt.6"]);
    for n in 4..=5 {
        assert!(env.read(&format!("/ckpt.{n}/data.bin")) == ckpt_data[n - 1].data);
        let levels = env.levels();
        let line = levels_line(&levels, &format!("/ckpt.{n}/")).unwrap_or_default();
        assert!(line.contains("draining"), "{line}\n{levels}");
    }
    env.cascade_ok(&["rm", "-r", "/ckpt.6"], &[]);
    stop_agent(&mut agent);

    // A writer blocked on the full store proceeds once the agent can drain again.
    let mut agent = env.agent(&url, &[("CASCADE_KEEP", "1"), ("CASCADE_FULL_WAIT", "30")]);
    let mut put = env.cli();
    put.args(["put", "-p", &src30, "/ckpt.6/x.bin"]);
    let mut writer = Daemon::spawn(put, "cascade put");
    writer.wait_line("the full-store message", Duration::from_secs(30), |l| {
        l.contains("waiting up to 30.0 s for the agent")
    });
    assert!(writer.alive(), "the writer gave up: {}", writer.log());
    std::fs::remove_file(dur.join("ckpt.4")).expect("unblock");
    std::fs::remove_file(dur.join("ckpt.5")).expect("unblock");
    let unblocked = Instant::now();
    let status = writer.wait(Duration::from_secs(45));
    eprintln!(
        "  the blocked writer finished {:.1} s after the durable store was repaired",
        unblocked.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "the writer failed: {status}\n{}",
        writer.log()
    );
    assert_eq!(
        writer
            .lines()
            .iter()
            .filter(|l| l.contains("waiting up to"))
            .count(),
        1,
        "{}",
        writer.log()
    );
    assert!(!in_store(4), "ckpt.4 was not evicted: {:?}", env.ls("/"));
    assert!(env.read("/ckpt.6/x.bin") == pattern(30 * MIB, 8));
    env.cascade_ok(&["wait", "/ckpt.5", "--timeout", "60"], &with_durable);
    assert_durable_checkpoint(&durable, "ckpt.4", &[&ckpt_data[3]]);
    assert_durable_checkpoint(&durable, "ckpt.5", &[&ckpt_data[4]]);
    stop_agent(&mut agent);
    eprintln!(
        "retention_never_evicts_data_that_is_not_durable: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// 6. SIGTERM (and SIGINT) stop `cascade agent` cleanly: it finishes, prints its summary and
///    exits 0, rather than dying of the signal. Several rounds, since which thread the kernel
///    hands a process-directed signal to varies.
#[test]
fn agent_stops_cleanly_on_sigterm() {
    let (_serial, started) = begin();
    let env = Env::new("sigterm", 16 << 20);
    let gw = Versitygw::start();
    gw.create_bucket("bkt");
    let dir = env.tmp.path().join("durable");
    let urls = [dir.to_str().expect("utf-8").to_string(), gw.url("bkt")];
    let mut problems = Vec::new();
    for round in 0..6 {
        let url = &urls[round % 2];
        let signal = if round < 4 {
            libc::SIGTERM
        } else {
            libc::SIGINT
        };
        let mut agent = env.agent(url, &[]);
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(agent.pid() as i32, signal) };
        let status = agent.wait(Duration::from_secs(30));
        let stopped = agent
            .lines()
            .iter()
            .any(|l| l.starts_with("cascade agent: stopped;"));
        if !status.success() || !stopped {
            problems.push(format!(
                "round {round} ({url}, signal {signal}): {status}, summary printed: {stopped}"
            ));
        }
        assert_eq!(env.store().agent_pid(), None, "round {round}");
    }
    eprintln!(
        "agent_stops_cleanly_on_sigterm: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "`cascade agent` did not stop cleanly:\n{}",
        problems.join("\n")
    );
}

/// Creates a file when dropped: the "go on" signal of a program under `cascade run`, so it
/// ends even if the test fails before giving it.
struct Touch(std::path::PathBuf);

impl Drop for Touch {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"go");
    }
}

/// The program of test 7: writes a 160 MiB file, closes it, and waits until the file named
/// by its argument exists (the test says when), or until `cascade run` is gone.
const WRITE_THEN_WAIT: &str = r#"
import os, sys, time
parent = os.getppid()
m = os.environ["CASCADE_MOUNT"]
os.makedirs(m + "/ckpt.1")
with open(m + "/ckpt.1/big.dat", "wb") as f:
    f.write(bytes(range(256)) * (160 * 4096))
while not os.path.exists(sys.argv[1]):
    if os.getppid() != parent:
        sys.exit("orphaned: cascade run is gone")
    time.sleep(0.02)
"#;

/// 7. Test 3 for the agent that `cascade run` embeds: the S3 server is killed while the job's
///    file is uploading; `cascade run` keeps running (the job is not orphaned), retries, and
///    once the server is back the job ends normally with its checkpoint durable.
#[test]
fn run_embedded_agent_survives_s3_server_restart() {
    let (_serial, started) = begin();
    let env = Env::new("runs3", 256 << 20);
    let mut gw = Versitygw::start();
    gw.create_bucket("bkt");
    let url = gw.url("bkt");
    let mount = format!("/cascade-faults-runs3-{}", std::process::id());
    let _mount = RemoveDir(mount.clone());
    let go = env.tmp.path().join("go");
    let _go = Touch(go.clone());
    let mut cmd = env.cli();
    cmd.args(["run", "--mount", &mount, "--durable", &url, "--"])
        .args(["/usr/bin/python3", "-c", WRITE_THEN_WAIT])
        .arg(&go);
    let mut run = Daemon::spawn(cmd, "cascade run");
    wait_for(
        "big.dat's upload to be under way",
        Duration::from_secs(60),
        || env.uploading_any(),
    );
    gw.stop();
    run.wait_line(
        "a second failed attempt for big.dat",
        Duration::from_secs(60),
        |l| failure_line(l, "/ckpt.1/big.dat").is_some_and(|(n, _)| n >= 2),
    );
    assert!(run.alive(), "cascade run exited: {}", run.log());
    gw.restart();
    std::fs::write(&go, b"go").expect("go");
    let status = run.wait(Duration::from_secs(120));
    assert!(status.success(), "cascade run: {status}\n{}", run.log());
    let big: Vec<u8> = (0..=255u8).cycle().take(160 * MIB).collect();
    let durable = DurableStore::open(&url).expect("open durable");
    assert_durable_checkpoint(&durable, "ckpt.1", &[&expected("big.dat", big)]);
    eprintln!(
        "run_embedded_agent_survives_s3_server_restart: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
