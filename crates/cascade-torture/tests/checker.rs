//! The checks themselves can fail: the content check catches bytes corrupted in place in the
//! shared-memory object, misplaced data, misnamed files and oversized files; the exclusive
//! writer's model holds through runs that keep hitting ENOSPC.

mod common;

use std::os::unix::fs::FileExt;

use cascade_store::OpenOptions;
use cascade_torture::{check_tree, file_name, pattern, RunParams, Torture};
use common::*;

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("data not found in the shared-memory object")
}

#[test]
fn the_content_check_catches_corruption() {
    let ts = TestStore::create(
        "checker",
        Params {
            capacity: 1 << 20,
            chunk_size: 4096,
            max_files: 64,
            spill: None,
        },
    );
    let seed = 0x00c0_ffee_u64;
    let path = format!("/{}", file_name(seed));
    let f = ts
        .store
        .open(&path, &OpenOptions::new().write(true).create(true))
        .unwrap();
    f.write_all_at(&pattern(seed, 0, 40_000), 0).unwrap();
    f.write_all_at(&pattern(seed, 60_000, 10_000), 60_000)
        .unwrap();
    let summary = check_tree(&ts.store, "/", 1 << 20).unwrap();
    assert_eq!((summary.files, summary.bytes), (1, 70_000));
    assert_eq!(summary.written_bytes, 50_000);

    let shm = std::path::PathBuf::from("/dev/shm").join(ts.name.trim_start_matches('/'));
    let obj = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shm)
        .unwrap();
    let image = std::fs::read(&shm).unwrap();
    let at = find(&image, &pattern(seed, 20_480, 64)) as u64;

    // One byte changed to neither its pattern byte nor zero.
    let good = image[at as usize + 5];
    obj.write_at(&[if good == 1 { 2 } else { 1 }], at + 5)
        .unwrap();
    let problems = check_tree(&ts.store, "/", 1 << 20).unwrap_err();
    assert!(
        problems[0].contains("offset 20485"),
        "wrong report: {problems:?}"
    );

    // Right bytes, wrong place: the file's own data from another offset.
    obj.write_at(&pattern(seed, 0, 64), at).unwrap();
    let problems = check_tree(&ts.store, "/", 1 << 20).unwrap_err();
    assert!(problems[0].contains("offset 20480"), "{problems:?}");

    // Another file's data.
    obj.write_at(&pattern(seed + 1, 20_480, 64), at).unwrap();
    assert!(check_tree(&ts.store, "/", 1 << 20).is_err());

    // Restored: clean again. Zeros (a hole, a cut-short write) are always acceptable.
    obj.write_at(&pattern(seed, 20_480, 64), at).unwrap();
    check_tree(&ts.store, "/", 1 << 20).unwrap();
    obj.write_at(&[0u8; 64], at).unwrap();
    check_tree(&ts.store, "/", 1 << 20).unwrap();

    // Names and sizes.
    assert!(check_tree(&ts.store, "/", 65_536).is_err(), "size limit");
    ts.store
        .mkdir(&format!("/{}", file_name(7)), 0o755)
        .unwrap();
    let problems = check_tree(&ts.store, "/", 1 << 20).unwrap_err();
    assert!(
        problems[0].contains("directory with a file's name"),
        "{problems:?}"
    );
    ts.store.rmdir(&format!("/{}", file_name(7))).unwrap();
    ts.store
        .open("/not-a-seed", &OpenOptions::new().write(true).create(true))
        .unwrap();
    let problems = check_tree(&ts.store, "/", 1 << 20).unwrap_err();
    assert!(problems[0].contains("not s<seed>"), "{problems:?}");
}

#[test]
fn the_exclusive_model_holds_through_enospc() {
    // 128 KiB of memory, 128 KiB of spill, 16 files of up to 96 KiB: ENOSPC all the time.
    let ts = TestStore::create(
        "model",
        Params {
            capacity: 128 << 10,
            chunk_size: 4096,
            max_files: 128,
            spill: Some(128 << 10),
        },
    );
    for (i, seed) in [11u64, 12, 13].into_iter().enumerate() {
        let params = RunParams {
            root: "/m".into(),
            seed,
            ops: 400,
            max_file_size: 96 << 10,
            max_write: 24 << 10,
            max_files: 16,
            verify_every: 25,
            ..RunParams::default()
        };
        // Each run adopts what the previous one left and checks it against its model.
        let mut t = Torture::new(&ts.store, params).unwrap();
        let stats = t.run().unwrap_or_else(|f| panic!("run {i}: {f}"));
        eprintln!("run {i}: {stats}");
        assert_eq!(stats.ops, 400);
        assert!(stats.enospc > 0, "run {i} never hit ENOSPC: {stats}");
        assert!(stats.verifies >= 16, "{stats}");
    }
    let report = ts.store.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_accounting(&ts.store, &report);
    assert!(ts.store.status().spill_used > 0);
}
