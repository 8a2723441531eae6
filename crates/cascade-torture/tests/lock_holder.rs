//! (b) A process killed -9 while holding a store lock does not wedge the others: after
//! killing writers mid-flight, a fresh process must finish its create / write / unlink work
//! within a bounded time.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Generous for a debug build on a loaded 2-core machine; a wedged lock never finishes.
const BOUND: Duration = Duration::from_secs(30);

#[test]
fn killed_lock_holders_do_not_wedge_a_fresh_process() {
    let ts = TestStore::create(
        "lock",
        Params {
            capacity: 16 << 20,
            chunk_size: 4096,
            max_files: 512,
            spill: None,
        },
    );
    let seed = rand::random();
    eprintln!("lock holder seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..25 {
        // Three writers hammering the same small tree: each one holds the namespace lock or
        // a file's lock much of the time, so a random kill often lands inside one.
        let mut kids = Children::default();
        for _ in 0..3 {
            let child = torture(
                &ts.name,
                &[
                    "run",
                    "--root",
                    "/hot",
                    "--shared",
                    "--ops",
                    "0",
                    "--seed",
                    &rng.gen::<u64>().to_string(),
                    "--max-files",
                    "16",
                    "--max-dirs",
                    "4",
                    "--max-file-size",
                    "65536",
                    "--max-write",
                    "16384",
                ],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
            kids.0.push(child);
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        for child in &mut kids.0 {
            child.kill().unwrap();
        }
        for child in std::mem::take(&mut kids.0) {
            let out = wait_output(child, CHILD_TIMEOUT).unwrap();
            assert!(
                killed_by_sigkill(&out.status),
                "round {round}: {}",
                describe(&out)
            );
        }

        // No fsck, no repair in between: the fresh process must cope with whatever locks
        // and leases the dead left behind.
        let started = Instant::now();
        let fresh = torture(
            &ts.name,
            &[
                "run",
                "--root",
                "/hot",
                "--shared",
                "--ops",
                "150",
                "--seed",
                &rng.gen::<u64>().to_string(),
                "--max-files",
                "16",
                "--max-dirs",
                "4",
                "--max-file-size",
                "65536",
                "--max-write",
                "16384",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let out = wait_output(fresh, BOUND)
            .unwrap_or_else(|e| panic!("round {round}: the store is wedged: {e}"));
        assert!(out.status.success(), "round {round}: {}", describe(&out));
        let stats = String::from_utf8_lossy(&out.stdout);
        assert!(stats.contains("ops=150"), "{stats}");

        // And the plain create / write / read / unlink sequence, through pipes, each reply
        // bounded by CHILD_TIMEOUT.
        let mut s = Server::spawn(&ts.name);
        let path = format!("/hot/fresh-{round}");
        assert_eq!(s.call(&format!("write {path} 77 0 100000")), "ok 100000");
        assert_eq!(s.call(&format!("check {path} 77 0 100000")), "ok");
        s.ok(&format!("close {path}"));
        s.ok(&format!("unlink {path}"));
        assert!(s
            .call(&format!("size {path}"))
            .starts_with(&format!("err {}", libc::ENOENT)));
        s.exit();
        eprintln!("round {round}: fresh work done in {:?}", started.elapsed());
    }
    let (_, summary) = check_after_crash(&ts.store, 65536);
    assert!(summary.files > 0, "{summary:?}");
}
