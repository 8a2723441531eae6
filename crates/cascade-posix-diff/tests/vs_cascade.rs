//! (c) The real test: Cascade vs tmpfs. The harness runs under `cascade run` (LD_PRELOAD of
//! libcascade.so), side A under the mount prefix, side B in a tmpfs directory, and must
//! finish with no mismatch.
//!
//! It builds the `cascade` binary and `libcascade.so` of its own profile first (with the
//! cargo that runs it), so `cargo test -p cascade-posix-diff` is enough.
//!
//! `CASCADE_DIFF_SEEDS=1,2,3` and `CASCADE_DIFF_OPS=20000` change the seeds and the length
//! of each run; a failure prints the harness's report, whose seed replays it.

mod common;

use common::cascade::{artifacts, cascade_vs_tmpfs, number_from_env, seeds_from_env, TestStore};

const DEFAULT_SEEDS: [u64; 6] = [1, 2, 3, 0xdead_beef, 424_242, u64::MAX];
const DEFAULT_OPS: u64 = 3000;

fn run(tag: &str, extra: &[&str]) {
    let (cascade, _) = artifacts();
    let store = TestStore::new(&cascade, tag);
    let seeds = seeds_from_env("CASCADE_DIFF_SEEDS", &DEFAULT_SEEDS);
    let ops = number_from_env("CASCADE_DIFF_OPS", DEFAULT_OPS);
    cascade_vs_tmpfs(&store, tag, &seeds, ops, extra);
}

#[test]
fn cascade_agrees_with_tmpfs_on_plain_paths() {
    run("plain", &["--no-quirks"]);
}

#[test]
fn cascade_agrees_with_tmpfs_on_unusual_path_spellings() {
    // Trailing slashes, x/../y through files and missing directories, ./, //, 255- and
    // 256-byte names: where a lexical path normaliser and the kernel part ways.
    run("quirks", &[]);
}
