//! `cascade demo`, run for real at a small size: it compiles examples/heat/heat.c with cc,
//! runs it straight to disk and under `cascade run` (killed, restarted from memory, restarted
//! from the durable store after the node store is destroyed) and must pass every phase.
//!
//! libcascade.so is built with `cargo build -p cascade-preload`, as interposition.rs and
//! heat_sim.rs do; the demo runs with a clean environment (an empty config file, TMPDIR in a
//! temp dir) and a store name of its own, so it touches neither the default store nor a demo
//! someone else is running.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cascade_testkit::preload_library;

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
/// The whole demo, four runs of heat and a dozen cascade commands, at most.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the command, killing it and failing the test after TIMEOUT.
fn output_within_timeout(mut command: Command) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cascade demo");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(out) => out.expect("wait for cascade demo"),
        Err(_) => {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: signalling our own child, which has not been reaped. SIGTERM lets
                // the demo remove its store and work dir.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            panic!("cascade demo still running after {TIMEOUT:?}");
        }
    }
}

#[test]
fn the_demo_passes_every_phase_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let config = tmp.path().join("empty.toml");
    std::fs::write(&config, "").expect("write empty config");
    let work_parent = tmp.path().join("tmp");
    std::fs::create_dir(&work_parent).expect("mkdir tmp");
    let store = format!("/cascade-test-{}-demo", std::process::id());

    let mut command = Command::new(CASCADE);
    command
        .args(["--store", &store, "demo"])
        .args(["--n", "256", "--steps", "60", "--every", "10"])
        .args(["--capacity", "64MiB", "--quiet", "--mpi"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", tmp.path())
        .env("TMPDIR", &work_parent)
        .env("CASCADE_CONFIG", &config)
        .env("CASCADE_PRELOAD_LIB", preload_library());
    let out = output_within_timeout(command);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Whatever happened, the store must not outlive the test.
    let _ = Command::new(CASCADE)
        .args(["--store", &store, "destroy", "--force"])
        .env("CASCADE_CONFIG", &config)
        .output();

    assert_eq!(
        out.status.code(),
        Some(0),
        "cascade demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for phase in ["A", "B", "C", "D", "E"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("PASS  phase {phase} "))),
            "no PASS for phase {phase}:\n{stdout}"
        );
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // --quiet: the summary only, no command transcripts.
    assert!(stdout.trim_start().starts_with("== Summary"), "{stdout}");
    assert!(!stdout.contains("$ cascade"), "{stdout}");
    // Every checkpoint step has a stall three ways (disk with fsync, page cache, Cascade),
    // then the means.
    for step in [10, 20, 30, 40, 50, 60] {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&step.to_string()))
            .unwrap_or_else(|| panic!("no row for step {step}:\n{stdout}"));
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert!(fields.len() >= 4, "{row}");
        for field in &fields[1..4] {
            assert!(field.parse::<f64>().is_ok(), "{row}");
        }
    }
    // Both baselines and Cascade in GB/s, beside the store's own rate.
    let rates = stdout
        .lines()
        .find(|l| l.starts_with("per checkpoint: "))
        .unwrap_or_else(|| panic!("no rates:\n{stdout}"));
    for what in [
        "GB/s to disk with fsync",
        "GB/s into the page cache",
        "GB/s under Cascade",
        "the node store's own steady-state write rate",
    ] {
        assert!(rates.contains(what), "{what:?} missing: {rates}");
    }
    assert!(
        stdout.lines().any(|l| l.trim_start().starts_with("mean ")),
        "{stdout}"
    );
    // The work dir is gone, and so is the store.
    let left: Vec<_> = std::fs::read_dir(&work_parent)
        .expect("list tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "the demo left {left:?} in its TMPDIR");
    assert!(!Path::new(&format!("/dev/shm{store}")).exists());
}
