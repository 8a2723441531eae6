//! (a) The kill -9 loop: torture writers on one store are killed at random moments, over and
//! over; after each round the store must pass fsck (no errors), repair to a spotless state,
//! keep its accounting, and every file must pass the crash-independent content check.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct LoopParams {
    iterations: u32,
    max_delay_ms: u64,
    max_file_size: u64,
    max_write: u64,
    max_files: usize,
}

#[derive(Default, Debug)]
struct LoopStats {
    rounds_with_leftovers: u32,
    max_files: u64,
    max_written: u64,
    max_spill_used: u64,
}

/// Rounds to run: the default, or CASCADE_KILL_ROUNDS for a longer soak.
fn rounds(default: u32) -> u32 {
    std::env::var("CASCADE_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seed: random, or CASCADE_KILL_SEED to replay a failure (the seed is printed).
fn loop_seed() -> u64 {
    std::env::var("CASCADE_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random)
}

fn kill_loop(ts: &TestStore, p: &LoopParams, seed: u64) -> LoopStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats = LoopStats::default();
    for round in 0..p.iterations {
        let writers = rng.gen_range(1..=3);
        let shared = rng.gen_bool(0.4);
        let mut kids = Children::default();
        for w in 0..writers {
            let root = if shared {
                "/shared".to_string()
            } else {
                format!("/w{w}")
            };
            let mut args = vec![
                "run".to_string(),
                "--root".into(),
                root,
                "--seed".into(),
                rng.gen::<u64>().to_string(),
                "--ops".into(),
                "0".into(),
                "--max-file-size".into(),
                p.max_file_size.to_string(),
                "--max-write".into(),
                p.max_write.to_string(),
                "--max-files".into(),
                p.max_files.to_string(),
                "--verify-every".into(),
                "40".into(),
            ];
            if shared {
                args.push("--shared".into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let child = torture(&ts.name, &args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            kids.0.push(child);
        }
        // The kill moment is the thing under test: sometimes during start-up and attach,
        // mostly in the middle of the operation stream.
        let delay = if rng.gen_ratio(1, 5) {
            rng.gen_range(0..5)
        } else {
            rng.gen_range(5..p.max_delay_ms)
        };
        std::thread::sleep(Duration::from_millis(delay));
        let mut stopped = None;
        for child in &mut kids.0 {
            match child.try_wait().unwrap() {
                Some(status) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    stopped = Some(format!("{status}\n{err}"));
                }
                None => child.kill().unwrap(),
            }
        }
        if let Some(why) = stopped {
            drop(kids);
            // Is the damage still there once nobody writes?
            let now = cascade_torture::check_tree(&ts.store, "/", p.max_file_size);
            panic!(
                "round {round}: a torture writer stopped by itself: {why}\n\
                 content check with all writers gone: {now:?}"
            );
        }
        for child in std::mem::take(&mut kids.0) {
            let out = wait_output(child, CHILD_TIMEOUT).unwrap();
            assert!(
                killed_by_sigkill(&out.status),
                "round {round}: {}",
                describe(&out)
            );
        }
        let spill_used = ts.store.status().spill_used;
        let (first, summary) = check_after_crash(&ts.store, p.max_file_size);
        if !first.warnings.is_empty() {
            stats.rounds_with_leftovers += 1;
        }
        stats.max_files = stats.max_files.max(summary.files);
        stats.max_written = stats.max_written.max(summary.written_bytes);
        stats.max_spill_used = stats.max_spill_used.max(spill_used);
    }
    stats
}

#[test]
fn kill_minus_nine_loop_keeps_the_store_consistent() {
    let ts = TestStore::create(
        "kill",
        Params {
            capacity: 16 << 20,
            chunk_size: 4096,
            max_files: 512,
            spill: None,
        },
    );
    let started = Instant::now();
    let seed = loop_seed();
    eprintln!("kill loop seed {seed}");
    let stats = kill_loop(
        &ts,
        &LoopParams {
            iterations: rounds(50),
            max_delay_ms: 250,
            max_file_size: 128 << 10,
            max_write: 24 << 10,
            max_files: 24,
        },
        seed,
    );
    eprintln!("{stats:?} in {:?}", started.elapsed());
    assert!(stats.max_files > 0 && stats.max_written > 0, "{stats:?}");
}

#[test]
fn kill_minus_nine_loop_with_a_full_store_and_spill() {
    // 512 KiB of memory and 1 MiB of spill: writers keep running into ENOSPC and spilling.
    let ts = TestStore::create(
        "killspill",
        Params {
            capacity: 512 << 10,
            chunk_size: 4096,
            max_files: 256,
            spill: Some(1 << 20),
        },
    );
    let started = Instant::now();
    let seed = loop_seed();
    eprintln!("kill loop (full store) seed {seed}");
    let stats = kill_loop(
        &ts,
        &LoopParams {
            iterations: rounds(40),
            max_delay_ms: 250,
            max_file_size: 96 << 10,
            max_write: 16 << 10,
            max_files: 24,
        },
        seed,
    );
    eprintln!("{stats:?} in {:?}", started.elapsed());
    assert!(stats.max_spill_used > 0, "nothing ever spilled: {stats:?}");
    let enospc = ts.store.status().last_enospc;
    assert!(
        enospc.as_ref().is_some_and(|r| !r.reason.is_empty()),
        "writers never ran out of space: {enospc:?}"
    );
}
