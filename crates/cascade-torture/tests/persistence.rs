//! (d) Persistence: data written by a process survives that process exiting or being killed
//! -9, with nobody attached in between; a later process attaches and reads it intact,
//! memory and spilled chunks alike.

mod common;

use cascade_store::Store;
use cascade_torture::pattern;
use common::*;

fn spill_params() -> Params {
    // 256 KiB of memory, 4 MiB of spill: the 1 MB file below lands mostly in the spill file.
    Params {
        capacity: 256 << 10,
        chunk_size: 4096,
        max_files: 64,
        spill: Some(4 << 20),
    }
}

fn assert_intact(store: &Store, path: &str, seed: u64, len: usize) {
    let data = read_all(store, path);
    assert_eq!(data.len(), len, "{path}: size");
    assert!(data == pattern(seed, 0, len), "{path}: content differs");
}

#[test]
fn data_survives_its_writer_exiting_with_nobody_attached() {
    let guard = create_detached("persist", spill_params());
    let mut w = Server::spawn(&guard.0);
    w.ok("mkdirs /ckpt.0001");
    assert_eq!(w.call("write /ckpt.0001/rank0 11 0 1000000"), "ok 1000000");
    w.ok("sync /ckpt.0001/rank0");
    w.ok("close /ckpt.0001/rank0");
    assert_eq!(w.call("write /ckpt.0001/rank1 12 0 70000"), "ok 70000");
    w.exit();

    // Nobody is attached now; attach afresh.
    let store = Store::attach(&guard.0).unwrap();
    assert!(store
        .status()
        .attached_pids
        .iter()
        .all(|&p| p == std::process::id()));
    assert_intact(&store, "/ckpt.0001/rank0", 11, 1_000_000);
    assert_intact(&store, "/ckpt.0001/rank1", 12, 70_000);
    let meta = store.stat("/ckpt.0001/rank0").unwrap();
    assert!(
        meta.chunks_spilled > 0 && meta.chunks_in_memory > 0,
        "{meta:?}"
    );
    // A clean exit leaves nothing to repair.
    let report = store.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
}

#[test]
fn data_survives_its_writer_being_killed_with_the_file_open() {
    let guard = create_detached("persistkill", spill_params());
    let mut w = Server::spawn(&guard.0);
    assert_eq!(w.call("write /open 21 0 600000"), "ok 600000");
    // Overwrite a middle part and extend, then die without closing anything.
    assert_eq!(w.call("write /open 21 100000 50000"), "ok 50000");
    assert_eq!(w.call("write /open 21 600000 400000"), "ok 400000");
    let dead = w.pid;
    w.kill9();

    let store = Store::attach(&guard.0).unwrap();
    assert!(
        !store.status().attached_pids.contains(&dead),
        "a killed process is still listed as attached"
    );
    assert_intact(&store, "/open", 21, 1_000_000);
    let meta = store.stat("/open").unwrap();
    assert!(meta.chunks_spilled > 0, "{meta:?}");
    let (_, files) = check_after_crash_any_names(&store);
    assert_eq!(files, 1);
    assert_intact(&store, "/open", 21, 1_000_000);

    // And the next generation of processes sees the same.
    drop(store);
    let mut r = Server::spawn(&guard.0);
    assert_eq!(r.call("check /open 21 0 1000000"), "ok");
    assert_eq!(r.call("size /open"), "ok 1000000");
    r.exit();
}

/// fsck with no errors, repair, no warnings afterwards, accounting adds up; returns the
/// report and the number of files.
fn check_after_crash_any_names(store: &Store) -> (cascade_store::FsckReport, u64) {
    let first = store.fsck(false).unwrap();
    assert!(first.is_clean(), "{:?}", first.errors);
    store.fsck(true).unwrap();
    let second = store.fsck(false).unwrap();
    assert!(
        second.is_clean() && second.warnings.is_empty(),
        "{second:?}"
    );
    assert_accounting(store, &second);
    (first, second.files)
}
