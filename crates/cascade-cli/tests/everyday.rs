//! Everyday use (issue 25): mount-prefixed paths wherever a store path is taken, one JSON
//! document from every reporting command (field names in docs/cli-json.md), distinct exit
//! codes for `wait`, the older flag names still accepted, and a restore from a durable
//! directory that does not exist named as such. Real `cascade` binary, real versitygw.

mod support;

use std::time::{Duration, Instant};

use cascade_testkit::Versitygw;
use serde_json::Value;
use support::{s, Sandbox};

fn json_of(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn mount_prefixed_paths_and_json_reports() {
    let sb = Sandbox::new("everyday");
    sb.init_small("16MiB");
    let local = sb.dir.path().join("rank0.dat");
    std::fs::write(&local, vec![7u8; 100_000]).expect("local file");
    // The path as the application sees it under `cascade run` (mount prefix /cascade).
    sb.ok(&["mkdir", "-p", "/cascade/run1/ckpt.1"]);
    sb.ok(&["put", s(&local), "/cascade/run1/ckpt.1/rank0.dat"]);
    assert!(sb.ok(&["ls", "/run1/ckpt.1"]).contains("rank0.dat"));

    let st = json_of(&sb.ok(&["stat", "--json", "/cascade/run1/ckpt.1/rank0.dat"]));
    assert_eq!(st["type"], "file");
    assert_eq!(st["size"], 100_000);
    assert_eq!(st["path"], "/run1/ckpt.1/rank0.dat");

    let levels = json_of(&sb.ok(&["ls", "--levels", "--json", "/cascade/run1"]));
    let entries = levels["entries"].as_array().expect("entries");
    assert!(
        entries
            .iter()
            .any(|e| e["path"] == "/run1/ckpt.1/rank0.dat" && e["level"] == "memory"),
        "{levels}"
    );

    let waited = json_of(&sb.ok(&[
        "wait",
        "--json",
        "--level",
        "memory",
        "/cascade/run1/ckpt.1",
    ]));
    assert_eq!(waited["reached"], true);
    assert_eq!(waited["files"], 1);

    // No agent: durable can never happen, at once, exit 1 with the reason.
    let out = sb.run(&["wait", "--json", "--timeout", "60", "/cascade/run1/ckpt.1"]);
    assert_eq!(out.status.code(), Some(1));
    let never = json_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        (never["reached"].clone(), never["outcome"].clone()),
        (Value::Bool(false), "never".into())
    );
    assert!(
        never["error"].as_str().unwrap_or("").contains("no agent"),
        "{never}"
    );
    // A level that is not one is a usage error naming the choices.
    let err = sb.fails(&["wait", "--level", "disk", "/run1/ckpt.1"], 2);
    assert!(err.contains("memory") && err.contains("durable"), "{err}");

    // Drain, restore and prune report JSON; --to, --from, --keep and --chunking still work.
    let durable = sb.dir.path().join("durable");
    std::fs::create_dir(&durable).expect("durable dir");
    let drained = json_of(&sb.ok(&[
        "drain",
        "--json",
        "/cascade/run1/ckpt.1",
        "--durable",
        s(&durable),
    ]));
    assert_eq!(drained["bytes"], 100_000);
    assert_eq!(drained["files"][0]["path"], "rank0.dat");
    let dest = sb.dir.path().join("back");
    let restored = json_of(&sb.ok(&[
        "restore",
        "--json",
        "run1/ckpt.1",
        s(&dest),
        "--from",
        s(&durable),
    ]));
    assert_eq!(restored["bytes"], 100_000);
    assert_eq!(
        std::fs::read(dest.join("rank0.dat")).expect("restored"),
        vec![7u8; 100_000]
    );
    let repo = sb.dir.path().join("repo");
    std::fs::create_dir(&repo).expect("repo dir");
    for n in ["2", "3"] {
        let ckpt = format!("/run1/ckpt.{n}");
        sb.ok(&["mkdir", &ckpt]);
        sb.ok(&["put", s(&local), &format!("{ckpt}/rank0.dat")]);
        let drained = json_of(&sb.ok(&[
            "drain",
            "--json",
            &ckpt,
            "--to",
            s(&repo),
            "--dedup",
            "fixed:64KiB",
        ]));
        assert_eq!(drained["dedup"]["chunking"], "fixed:64KiB", "{drained}");
    }
    let pruned = json_of(&sb.ok(&[
        "prune",
        "--json",
        "--dry-run",
        "--keep",
        "1",
        "--durable",
        s(&repo),
    ]));
    assert_eq!(pruned["dry_run"], true);
    assert_eq!(pruned["forgotten"], serde_json::json!(["run1/ckpt.2"]));
    assert_eq!(pruned["kept"], serde_json::json!(["run1/ckpt.3"]));

    // -v and -q are global: a line per file, or no summary at all.
    let verbose = sb.ok(&["drain", "-v", "/run1/ckpt.1", "--durable", s(&durable)]);
    assert!(
        verbose.contains("drain /run1/ckpt.1 -> ")
            && verbose.contains("  rank0.dat 100000 bytes blake3 "),
        "{verbose}"
    );
    assert_eq!(sb.ok(&["-q", "put", s(&local), "/run1/quiet.dat"]), "");
    assert_eq!(sb.ok(&["rm", "/run1/quiet.dat"]), "");
    let err = sb.fails(&["drain", "-v", "-q", "/run1/ckpt.1"], 2);
    assert!(err.contains("cannot be used with"), "{err}");

    let fsck = json_of(&sb.ok(&["fsck", "--json"]));
    assert_eq!(fsck["clean"], true);
    assert_eq!(fsck["files"], 3);

    // A durable directory that is not there is named, and not created by the attempt.
    let missing = sb.dir.path().join("no/such/dir");
    let err = sb.fails(
        &["restore", "ckpt.9", s(&dest), "--durable", s(&missing)],
        1,
    );
    assert!(err.contains("no such directory"), "{err}");
    assert!(!missing.exists());
    // A checkpoint of which nothing is there is not called incomplete.
    let err = sb.fails(
        &["restore", "ckpt.9", s(&dest), "--durable", s(&durable)],
        1,
    );
    assert!(err.contains("no checkpoint ckpt.9"), "{err}");
    assert!(!err.contains("not complete"), "{err}");
    sb.ok(&["destroy", "--force"]);
}

/// `wait` exits 3 when the time runs out on a path that may still get there: an agent is
/// running, but its durable store (a real versitygw) went away after it started.
#[test]
fn wait_times_out_with_its_own_exit_code() {
    let mut gw = Versitygw::start();
    gw.create_bucket("away");
    let sb = Sandbox::new("everyday-wait");
    sb.init_small("16MiB");
    let url = gw.url("away");
    let mut agent = sb
        .command(&["agent", "--durable", &url])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = json_of(&sb.ok(&["status", "--json"]));
        if !status["agent"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "no agent after 30 s: {status}");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    gw.stop();
    let local = sb.dir.path().join("a");
    std::fs::write(&local, b"data").expect("local file");
    sb.ok(&["mkdir", "/ckpt.1"]);
    sb.ok(&["put", s(&local), "/ckpt.1/a"]);
    sb.ok(&["commit", "/cascade/ckpt.1"]);
    let out = sb.run(&["wait", "--json", "--timeout", "1", "/cascade/ckpt.1"]);
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timed_out = json_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(timed_out["outcome"], "timed_out");
    sb.ok(&["destroy", "--force"]);
}
