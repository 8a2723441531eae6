//! The libc level against Cascade: mkstemp/mkdtemp, glob, nftw/ftw, scandir, fts,
//! posix_spawn with file actions, stored scripts run via posix_spawn and system(), remove,
//! lockf, mkfifo/mknod and a forked child exiting without closing, on side A under
//! `cascade run` and side B on tmpfs (`--level libc`, see src/libc_ops.rs). Afterwards no
//! file of side A's trees may be torn in `cascade ls --levels`: a process that ends without
//! closing its files is not a writer that died.
//!
//! `CASCADE_DIFF_LIBC_SEEDS=1,2` and `CASCADE_DIFF_LIBC_OPS=2000` change the seeds and the
//! length of each run.

mod common;

use common::cascade::{artifacts, cascade_vs_tmpfs, number_from_env, seeds_from_env, TestStore};

const DEFAULT_SEEDS: [u64; 4] = [1, 2, 0xdead_beef, u64::MAX];
const DEFAULT_OPS: u64 = 400;

#[test]
fn cascade_agrees_with_tmpfs_at_the_libc_level_and_leaves_nothing_torn() {
    let (cascade, _) = artifacts();
    let store = TestStore::new(&cascade, "libc");
    let seeds = seeds_from_env("CASCADE_DIFF_LIBC_SEEDS", &DEFAULT_SEEDS);
    let ops = number_from_env("CASCADE_DIFF_LIBC_OPS", DEFAULT_OPS);
    let trees = cascade_vs_tmpfs(&store, "libc", &seeds, ops, &["--level", "libc"]);
    for tree in trees {
        let levels = store.cascade_ok(&["ls", "--levels", &tree]);
        let torn: Vec<&str> = levels.lines().filter(|l| l.contains("torn")).collect();
        assert!(
            torn.is_empty(),
            "files of {tree} are torn after the run (a child that exited without closing \
             counts as a writer that died):\n{}",
            torn.join("\n")
        );
    }
}
