//! Engine tests on real files in temporary directories.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Buffered arenas: these tests count arena bytes and files for extents packed back to
/// back; the direct mode's padded layout has tests of its own (`direct_*`).
fn opts(arena_size: u64) -> EngineOptions {
    EngineOptions {
        arena_size,
        direct: false,
        ..EngineOptions::default()
    }
}

/// Deterministic pseudo-random bytes.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn hash(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// Stages `bytes` as `key@stamp` in `chunk`-byte appends and seals it (no sync).
fn put(e: &Engine, slot: usize, key: &str, stamp: u64, bytes: &[u8], chunk: usize) -> VersionId {
    let v = e.begin_version(key, stamp, bytes.len() as u64).unwrap();
    for (i, c) in bytes.chunks(chunk).enumerate() {
        e.append(slot, v, (i * chunk) as u64, c).unwrap();
    }
    e.seal(v, hash(bytes), None).unwrap();
    v
}

/// Opens the engine in `dir` again after a clean stop or a crash: nothing to warn about.
fn reopen_without_warnings(dir: &Path, o: EngineOptions) -> Engine {
    let e = Engine::open(dir, o).unwrap();
    assert!(
        e.recovery_warnings().is_empty(),
        "{:?}",
        e.recovery_warnings()
    );
    e
}

/// The whole version through odd-sized reads.
fn read_all(e: &Engine, v: VersionId) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 777];
    loop {
        let n = e.read_at(v, out.len() as u64, &mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The newest version of `key` exists and holds exactly `bytes`.
fn check(e: &Engine, key: &str, stamp: u64, bytes: &[u8]) {
    let info = e.lookup(key).unwrap_or_else(|| panic!("{key} is missing"));
    assert_eq!(info.stamp, stamp, "{key}");
    assert_eq!(info.size, bytes.len() as u64, "{key}");
    assert_eq!(info.blake3, hash(bytes), "{key}");
    assert!(read_all(e, info.id) == bytes, "{key}: data differs");
}

fn arena_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| parse_arena_name(e.as_ref().unwrap().file_name().to_str().unwrap()).is_some())
        .count()
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "LOCK" {
            std::fs::copy(entry.path(), to.join(name)).unwrap();
        }
    }
}

#[test]
fn engine_is_send_and_sync() {
    fn assert<T: Send + Sync>() {}
    assert::<Engine>();
}

#[test]
fn versions_round_trip_across_arena_rotation_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [0usize, 1, 5000, 10_000, 3000, 4096, 70_000];
    let files: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("dir/f{i}"), data(i as u64, n)))
        .collect();
    {
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        for (i, (key, bytes)) in files.iter().enumerate() {
            put(&e, i, key, 7, bytes, 1000);
        }
        e.sync().unwrap();
        for (key, bytes) in &files {
            check(&e, key, 7, bytes);
        }
        // A read in the middle of extents, across several of them.
        let v = e.lookup("dir/f6").unwrap().id;
        let mut buf = vec![0u8; 2500];
        assert_eq!(e.read_at(v, 1500, &mut buf).unwrap(), 2500);
        assert!(buf == files[6].1[1500..4000]);
        // Short only at the end.
        assert_eq!(e.read_at(v, 69_000, &mut buf).unwrap(), 1000);
        assert_eq!(e.read_at(v, 70_000, &mut buf).unwrap(), 0);
        let u = e.usage();
        assert!(u.arena_files >= 3, "{u:?}");
        assert_eq!(u.live_versions, files.len() as u64);
        assert_eq!(u.pending_bytes, sizes.iter().sum::<usize>() as u64);
        assert!(u.arena_bytes >= u.pending_bytes);
        assert_eq!(e.drainable().len(), files.len());
    }
    let e = reopen_without_warnings(dir.path(), opts(4096));
    for (key, bytes) in &files {
        check(&e, key, 7, bytes);
    }
    let order: Vec<String> = e.drainable().into_iter().map(|i| i.key).collect();
    let want: Vec<String> = files.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(order, want, "drainable is oldest seal first");
}

#[test]
fn large_appends_are_split_into_bounded_extents() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data(99, 2 * MAX_EXTENT + 12_345);
    {
        let e = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        let v = put(&e, 0, "big", 1, &bytes, bytes.len());
        e.sync().unwrap();
        let g = lock(&e.state);
        assert_eq!(g.m.versions[&v.0].extents.len(), 3);
    }
    let e = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    check(&e, "big", 1, &bytes);
    let v = e.lookup("big").unwrap().id;
    let mut buf = vec![0u8; 100];
    let at = MAX_EXTENT as u64 - 50;
    assert_eq!(e.read_at(v, at, &mut buf).unwrap(), 100);
    assert!(buf == bytes[at as usize..at as usize + 100]);
}

#[test]
fn concurrent_appends_and_syncs_from_several_threads() {
    let dir = tempfile::tempdir().unwrap();
    let e = Arc::new(Engine::open(dir.path(), opts(64 << 10)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            loop {
                e.sync().unwrap();
                rounds += 1;
                if stop.load(Ordering::Relaxed) {
                    return rounds;
                }
            }
        })
    };
    // One version written by both threads at once, alternate chunks each.
    let shared = data(4242, 50_000);
    let sv = e.begin_version("shared", 1, shared.len() as u64).unwrap();
    let writers: Vec<_> = (0..2usize)
        .map(|t| {
            let (e, shared) = (e.clone(), shared.clone());
            std::thread::spawn(move || {
                for (i, c) in shared.chunks(1000).enumerate() {
                    if i % 2 == t {
                        e.append(t, sv, (i * 1000) as u64, c).unwrap();
                    }
                }
                for i in 0..40u64 {
                    let key = format!("t{t}/f{i}");
                    let bytes = data(t as u64 * 1000 + i, 1 + (i as usize * 997) % 20_000);
                    put(&e, t, &key, i, &bytes, 1500);
                    if i % 5 == 0 {
                        e.sync().unwrap();
                        check(&e, &key, i, &bytes);
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    e.seal(sv, hash(&shared), None).unwrap();
    stop.store(true, Ordering::Relaxed);
    assert!(syncer.join().unwrap() > 0);
    e.sync().unwrap();
    let verify = |e: &Engine| {
        check(e, "shared", 1, &shared);
        for t in 0..2u64 {
            for i in 0..40u64 {
                let bytes = data(t * 1000 + i, 1 + (i as usize * 997) % 20_000);
                check(e, &format!("t{t}/f{i}"), i, &bytes);
            }
        }
    };
    verify(&e);
    drop(e);
    let e = Engine::open(dir.path(), opts(64 << 10)).unwrap();
    verify(&e);
    assert_eq!(e.usage().live_versions, 81);
}

#[test]
fn recovery_keeps_synced_versions_and_drops_unsynced_ones() {
    let dir = tempfile::tempdir().unwrap();
    let a1 = data(1, 9000);
    let a2 = data(2, 3000);
    let b = data(3, 5000);
    let max_id;
    {
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        put(&e, 0, "a", 1, &a1, 1000);
        e.sync().unwrap();
        // Not synced: a newer version of a, a new file, a half-written file.
        put(&e, 0, "a", 2, &a2, 1000);
        put(&e, 1, "b", 1, &b, 700);
        let c = e.begin_version("c", 1, 10_000).unwrap();
        e.append(0, c, 0, &data(4, 5000)).unwrap();
        max_id = c.0;
        assert_eq!(e.lookup("a").unwrap().stamp, 2);
    }
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    check(&e, "a", 1, &a1);
    assert!(e.lookup("b").is_none());
    assert!(e.lookup("c").is_none());
    let d: Vec<String> = e.drainable().into_iter().map(|i| i.key).collect();
    assert_eq!(d, vec!["a".to_string()]);
    // Ids handed out before the crash are never handed out again.
    let c = e.begin_version("c", 1, 10).unwrap();
    assert!(c.0 > max_id, "{c:?} reused an id <= {max_id}");
    // Only the arena holding a@1 survives: the others held nothing synced.
    assert_eq!(arena_files(dir.path()), 3);
    assert_eq!(e.usage().live_versions, 1);
}

/// Keys of the second batch in the torn-tail test.
const LATE: [&str; 3] = ["late0", "late1", "late2"];

#[test]
fn torn_index_tail_at_every_offset_opens_and_never_shows_partial_data() {
    let src = tempfile::tempdir().unwrap();
    let early: Vec<Vec<u8>> = (0..3)
        .map(|i| data(10 + i, 2000 + 1500 * i as usize))
        .collect();
    let late: Vec<Vec<u8>> = (0..3)
        .map(|i| data(20 + i, 1000 + 2500 * i as usize))
        .collect();
    let newer0 = data(30, 1234);
    let base_len;
    let arenas_before_sync = tempfile::tempdir().unwrap();
    {
        let e = Engine::open(src.path(), opts(4096)).unwrap();
        for (i, bytes) in early.iter().enumerate() {
            put(&e, i, &format!("early{i}"), 1, bytes, 800);
        }
        e.sync().unwrap();
        base_len = std::fs::metadata(src.path().join(INDEX)).unwrap().len();
        for (i, bytes) in late.iter().enumerate() {
            put(&e, i, LATE[i], 1, bytes, 2000);
        }
        put(&e, 0, "early0", 2, &newer0, 1234);
        e.record_manifest(Manifest {
            checkpoint: "ckpt".into(),
            single_file: false,
            files: vec![ManifestFile {
                path: "late0".into(),
                size: late[0].len() as u64,
                blake3: hash(&late[0]),
            }],
        })
        .unwrap();
        // The crash happens while this round writes the index: the arena files are as
        // they are now (the round deletes superseded data only after its records are durable).
        copy_dir(src.path(), arenas_before_sync.path());
        e.sync().unwrap();
    }
    let index = std::fs::read(src.path().join(INDEX)).unwrap();
    assert!(index.len() as u64 > base_len + 200);
    let cuts: Vec<u64> = (base_len..=index.len() as u64).collect();
    // Each cut costs a few fsyncs: spread them over threads.
    std::thread::scope(|s| {
        for part in cuts.chunks(cuts.len().div_ceil(4)) {
            let (index, early, late, newer0) = (&index, &early, &late, &newer0);
            let arenas = arenas_before_sync.path();
            s.spawn(move || {
                for &cut in part {
                    torn_case(
                        arenas,
                        &index[..cut as usize],
                        cut == index.len() as u64,
                        early,
                        late,
                        newer0,
                    );
                }
            });
        }
    });
}

/// Opens a copy of the arenas with the index cut to `index` and checks what it shows.
fn torn_case(
    arenas: &Path,
    index: &[u8],
    whole: bool,
    early: &[Vec<u8>],
    late: &[Vec<u8>],
    newer0: &[u8],
) {
    let cut = index.len();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(arenas, dir.path());
    std::fs::write(dir.path().join(INDEX), index).unwrap();
    let e =
        Engine::open(dir.path(), opts(4096)).unwrap_or_else(|err| panic!("cut at {cut}: {err}"));
    // Synced before the crash: always there, byte-identical (either version of early0).
    match e.lookup("early0").unwrap().stamp {
        1 => check(&e, "early0", 1, &early[0]),
        _ => check(&e, "early0", 2, newer0),
    }
    for (i, bytes) in early.iter().enumerate().skip(1) {
        check(&e, &format!("early{i}"), 1, bytes);
    }
    // In the torn round: whole or absent.
    for (i, bytes) in late.iter().enumerate() {
        if e.lookup(LATE[i]).is_some() || whole {
            check(&e, LATE[i], 1, bytes);
        }
    }
    if whole {
        assert!(e.recovery_warnings().is_empty());
        assert_eq!(e.manifest_state("ckpt"), Some(false));
    }
    // The tail was cut off: what is synced now survives the next reopen.
    put(&e, 0, "after", 1, b"after the crash", 4);
    e.sync().unwrap();
    drop(e);
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    check(&e, "after", 1, b"after the crash");
}

#[test]
fn garbage_after_the_last_record_is_cut_off() {
    let mut bad_crc_frame = Vec::new();
    bad_crc_frame.extend_from_slice(&9u32.to_le_bytes());
    bad_crc_frame.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    bad_crc_frame.extend_from_slice(&[5, 1, 0, 0, 0, 0, 0, 0, 0]);
    let tails: Vec<Vec<u8>> = vec![
        vec![0u8; 100],
        vec![0xFF; 100],
        data(77, 1000),
        bad_crc_frame,
        u32::MAX.to_le_bytes().to_vec(),
        vec![1, 2, 3],
    ];
    for tail in tails {
        let dir = tempfile::tempdir().unwrap();
        let a = data(5, 3000);
        {
            let e = Engine::open(dir.path(), opts(4096)).unwrap();
            put(&e, 0, "a", 1, &a, 1000);
            e.sync().unwrap();
        }
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(INDEX))
            .unwrap();
        std::io::Write::write_all(&mut f, &tail).unwrap();
        drop(f);
        {
            let e = Engine::open(dir.path(), opts(4096)).unwrap();
            assert_eq!(
                e.recovery_warnings().len(),
                1,
                "{:?}",
                e.recovery_warnings()
            );
            check(&e, "a", 1, &a);
            put(&e, 1, "b", 1, b"bbb", 2);
            e.sync().unwrap();
        }
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        assert!(e.recovery_warnings().is_empty());
        check(&e, "a", 1, &a);
        check(&e, "b", 1, b"bbb");
    }
}

#[test]
fn a_bad_index_header_is_reported_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    drop(Engine::open(dir.path(), opts(4096)).unwrap());
    let path = dir.path().join(INDEX);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] = b'X';
    std::fs::write(&path, &bytes).unwrap();
    match Engine::open(dir.path(), opts(4096)) {
        Err(Error::Corrupt { what }) => assert!(what.contains("bad magic"), "{what}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened an index with a bad magic"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_flipped_bit_in_an_arena_is_detected_by_read_at() {
    let dir = tempfile::tempdir().unwrap();
    let a = data(6, 10_000);
    let b = data(7, 3000);
    let e = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let va = put(&e, 0, "a", 1, &a, 4000);
    let vb = put(&e, 1, "b", 1, &b, 4000);
    e.sync().unwrap();
    // a is alone at the start of the first arena: bytes 4000..8000 are its second extent.
    let first = e.lock_arena_of(va);
    let path = dir.path().join(arena_name(first));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, 5000).unwrap();
    byte[0] ^= 0x10;
    f.write_all_at(&byte, 5000).unwrap();
    drop(f);
    let mut buf = vec![0u8; 10_000];
    match e.read_at(va, 0, &mut buf) {
        Err(Error::Corrupt { what }) => {
            assert!(what.contains("checksum mismatch"), "{what}");
            assert!(what.contains(&arena_name(first)), "{what}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A read inside the bad extent checks all of it; reads of other extents are fine.
    assert!(matches!(
        e.read_at(va, 4500, &mut buf[..10]),
        Err(Error::Corrupt { .. })
    ));
    assert_eq!(e.read_at(va, 0, &mut buf[..4000]).unwrap(), 4000);
    assert!(buf[..4000] == a[..4000]);
    assert_eq!(e.read_at(va, 8000, &mut buf).unwrap(), 2000);
    assert!(read_all(&e, vb) == b);
}

impl Engine {
    /// The arena holding the version's first extent (tests only).
    fn lock_arena_of(&self, v: VersionId) -> u32 {
        lock(&self.state).m.versions[&v.0].extents[0].arena
    }
}

#[test]
fn capacity_limit_gives_full_and_the_engine_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(
        dir.path(),
        EngineOptions {
            arena_size: 4096,
            capacity: Some(10_000),
            writers: 1,
            direct: false,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let a = data(8, 4000);
    let b = data(9, 4000);
    let va = put(&e, 0, "a", 1, &a, 1000);
    put(&e, 0, "b", 1, &b, 1000);
    e.sync().unwrap();
    let c = e.begin_version("c", 1, 4000).unwrap();
    e.append(0, c, 0, &[1u8; 1000]).unwrap();
    e.append(0, c, 1000, &[1u8; 1000]).unwrap();
    let err = e.append(0, c, 2000, &[1u8; 1000]).unwrap_err();
    match &err {
        Error::Full { what } => assert!(
            what.contains("is full") && what.contains(&dir.path().display().to_string()),
            "{what}"
        ),
        other => panic!("expected Full, got {other}"),
    }
    assert!(err.to_string().contains("9.8 KiB of 9.8 KiB"), "{err}");
    // Reads and syncs still work; the partial version cannot be sealed.
    check(&e, "a", 1, &a);
    check(&e, "b", 1, &b);
    e.sync().unwrap();
    match e.seal(c, [0; 32], None) {
        Err(Error::Invalid { what }) => assert!(what.contains("byte 2000"), "{what}"),
        other => panic!("{other:?}"),
    }
    e.abandon(c);
    // Draining a frees its arena; writing works again.
    e.mark_drained(va).unwrap();
    assert!(e.usage().arena_bytes <= 6000, "{:?}", e.usage());
    let d = data(10, 3000);
    put(&e, 0, "d", 1, &d, 1000);
    e.sync().unwrap();
    check(&e, "d", 1, &d);
    check(&e, "b", 1, &b);
    assert!(e.usage().arena_bytes <= 10_000);
}

#[test]
fn draining_reclaims_arenas_whose_data_is_all_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    let files: Vec<Vec<u8>> = (0..6).map(|i| data(40 + i, 3000)).collect();
    let ids: Vec<VersionId> = files
        .iter()
        .enumerate()
        .map(|(i, bytes)| put(&e, 0, &format!("f{i}"), 1, bytes, 3000))
        .collect();
    // Two small versions sharing an arena on the other slot.
    let s1 = put(&e, 1, "s1", 1, b"small one", 3);
    let s2 = put(&e, 1, "s2", 1, b"small two", 3);
    e.sync().unwrap();
    assert_eq!(arena_files(dir.path()), 7);
    for &v in &ids[..4] {
        e.mark_drained(v).unwrap();
    }
    assert_eq!(arena_files(dir.path()), 3);
    assert!(e.lookup("f0").is_none());
    assert!(matches!(
        e.read_at(ids[0], 0, &mut [0u8; 10]),
        Err(Error::Invalid { .. })
    ));
    check(&e, "f4", 1, &files[4]);
    // The active arena of a slot is kept even when all garbage; a drained version whose
    // arena remains is still readable and reported drained.
    e.mark_drained(ids[5]).unwrap();
    assert_eq!(arena_files(dir.path()), 3);
    let info = e.lookup("f5").unwrap();
    assert!(info.drained);
    assert!(read_all(&e, ids[5]) == files[5]);
    e.mark_drained(s1).unwrap();
    assert_eq!(e.usage().live_versions, 2);
    assert_eq!(e.usage().pending_bytes, 3000 + 9);
    let d: Vec<VersionId> = e.drainable().into_iter().map(|i| i.id).collect();
    assert_eq!(d, vec![ids[4], s2]);
    drop(e);
    // At open, arenas nothing live references go, whoever was writing them.
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(arena_files(dir.path()), 2);
    check(&e, "f4", 1, &files[4]);
    check(&e, "s2", 1, b"small two");
    // s1 is drained but shares its arena with s2: still present.
    assert!(e.lookup("s1").unwrap().drained);
    assert_eq!(e.usage().arena_files, 2);
}

/// With `defer_unlinks` (the server's drain), a drain's sync reclaims the arenas in the
/// index and in the usage at once, but deletes their files only at `unlink_reclaimed`: the
/// drain writes the markers first. A file left behind goes at the next open.
#[test]
fn deferred_unlinks_delete_reclaimed_arenas_only_when_asked() {
    for crash in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        e.defer_unlinks();
        let ids: Vec<VersionId> = (0..4)
            .map(|i| put(&e, 0, &format!("f{i}"), 1, &data(60 + i, 3000), 3000))
            .collect();
        e.sync().unwrap();
        assert_eq!(arena_files(dir.path()), 4);
        for &v in &ids[..3] {
            e.mark_drained(v).unwrap();
        }
        assert_eq!(e.usage().arena_files, 1);
        assert_eq!(
            arena_files(dir.path()),
            4,
            "deleted before unlink_reclaimed"
        );
        if crash {
            // Reclaimed and never deleted: gone at the next open.
            drop(e);
            let e = Engine::open(dir.path(), opts(4096)).unwrap();
            assert_eq!(arena_files(dir.path()) as u64, e.usage().arena_files);
        } else {
            e.unlink_reclaimed();
            assert_eq!(arena_files(dir.path()), 1);
        }
    }
}

#[test]
fn abandoned_versions_are_reclaimed_without_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(
        dir.path(),
        EngineOptions {
            writers: 1,
            ..opts(4096)
        },
    )
    .unwrap();
    let v = e.begin_version("gone", 1, 4000).unwrap();
    e.append(0, v, 0, &data(1, 4000)).unwrap();
    put(&e, 0, "next", 1, &data(2, 4000), 4000); // rotates: the first arena is now inactive
    assert_eq!(arena_files(dir.path()), 2);
    e.abandon(v);
    assert_eq!(arena_files(dir.path()), 1);
    assert!(matches!(
        e.seal(v, [0; 32], None),
        Err(Error::Invalid { .. })
    ));
    // Beginning it again after abandon starts a fresh version.
    let v2 = e.begin_version("gone", 1, 4000).unwrap();
    assert_ne!(v, v2);
}

#[test]
fn a_newer_seal_supersedes_and_resends_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let d1 = data(50, 3000);
    let d2 = data(51, 3500);
    let d0 = data(52, 2000);
    {
        let e = Engine::open(
            dir.path(),
            EngineOptions {
                writers: 1,
                ..opts(4096)
            },
        )
        .unwrap();
        let v1 = put(&e, 0, "k", 1, &d1, 1000);
        e.sync().unwrap();
        // Resend of a sealed version: same id, appends and seal are no-ops.
        assert_eq!(e.begin_version("k", 1, 3000).unwrap(), v1);
        e.append(0, v1, 0, &[0u8; 1000]).unwrap();
        e.seal(v1, hash(&d1), None).unwrap();
        // Another file under the same name and stamp is refused, and changes nothing.
        assert!(matches!(
            e.seal(v1, hash(&d2[..3000]), None),
            Err(Error::Invalid { .. })
        ));
        check(&e, "k", 1, &d1);

        let v2 = e.begin_version("k", 2, d2.len() as u64).unwrap();
        e.append(0, v2, 0, &d2[..2000]).unwrap();
        // Resend after a reconnect: same id, overlapping ranges.
        assert_eq!(e.begin_version("k", 2, d2.len() as u64).unwrap(), v2);
        e.append(0, v2, 1000, &d2[1000..3000]).unwrap();
        e.append(0, v2, 500, &d2[500..3500]).unwrap();
        e.seal(v2, hash(&d2), None).unwrap();
        assert_eq!(e.lookup("k").unwrap().id, v2);
        let d: Vec<VersionId> = e.drainable().into_iter().map(|i| i.id).collect();
        assert_eq!(d, vec![v2]);
        // v1 fills the first arena, v2's extents went to the next two.
        assert_eq!(arena_files(dir.path()), 3);
        e.sync().unwrap();
        // v1's arena is rotated and all garbage now that v2's seal is durable.
        assert_eq!(arena_files(dir.path()), 2);
        assert!(matches!(
            e.read_at(v1, 0, &mut [0u8; 4]),
            Err(Error::Invalid { .. })
        ));
        // An older stamp sealed late is superseded at once.
        let v0 = put(&e, 0, "k", 0, &d0, 1000);
        assert_eq!(e.lookup("k").unwrap().id, v2);
        assert_eq!(e.drainable().len(), 1);
        assert_eq!(e.begin_version("k", 0, 2000).unwrap(), v0);
        e.sync().unwrap();
        check(&e, "k", 2, &d2);
    }
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    check(&e, "k", 2, &d2);
    assert_eq!(e.drainable().len(), 1);
    assert_eq!(e.usage().pending_bytes, d2.len() as u64);
}

#[test]
fn invalid_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    let v = e.begin_version("x", 1, 3000).unwrap();
    assert!(matches!(
        e.append(0, v, 2500, &[0u8; 501]),
        Err(Error::Invalid { .. })
    ));
    e.append(0, v, 0, &[1u8; 1000]).unwrap();
    e.append(0, v, 2000, &[1u8; 1000]).unwrap();
    match e.seal(v, [0; 32], None) {
        Err(Error::Invalid { what }) => assert!(what.contains("byte 1000"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        e.read_at(v, 0, &mut [0u8; 4]),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        e.begin_version("x", 1, 4000),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        e.begin_version("", 1, 4),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        e.append(0, VersionId(999_999_999), 0, b"x"),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(e.mark_drained(v), Err(Error::Invalid { .. })));
    assert!(matches!(
        e.mark_manifest_done(12345),
        Err(Error::Invalid { .. })
    ));
}

fn manifest(name: &str, n: usize) -> Manifest {
    Manifest {
        checkpoint: name.into(),
        single_file: n == 1,
        files: (0..n)
            .map(|i| ManifestFile {
                path: format!("rank{i}.dat"),
                size: i as u64 * 100,
                blake3: [i as u8; 32],
            })
            .collect(),
    }
}

#[test]
fn manifests_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (m1, m2b);
    {
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        m1 = e.record_manifest(manifest("ckpt.1", 1)).unwrap();
        let m2 = e.record_manifest(manifest("ckpt.2", 3)).unwrap();
        e.sync().unwrap();
        e.mark_manifest_done(m1).unwrap();
        // Recording the same checkpoint again replaces the older manifest.
        m2b = e.record_manifest(manifest("ckpt.2", 5)).unwrap();
        assert!(m2b > m2);
        e.sync().unwrap();
        e.record_manifest(manifest("ckpt.3", 2)).unwrap(); // never synced
        assert_eq!(e.pending_manifests().len(), 2);
    }
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    assert_eq!(e.pending_manifests(), vec![(m2b, manifest("ckpt.2", 5))]);
    assert_eq!(e.manifest_state("ckpt.1"), Some(true));
    assert_eq!(e.manifest_state("ckpt.2"), Some(false));
    assert_eq!(e.manifest_state("ckpt.3"), None);
    e.mark_manifest_done(m2b).unwrap();
    assert!(e.pending_manifests().is_empty());
    let m3 = e.record_manifest(manifest("ckpt.3", 2)).unwrap();
    assert!(m3 > m2b);
}

#[test]
fn compaction_keeps_the_index_small_and_the_state_intact() {
    let dir = tempfile::tempdir().unwrap();
    let o = || EngineOptions {
        index_compact_bytes: 4096,
        ..opts(8192)
    };
    let mut last_id = 0;
    let mut expected: Vec<(String, u64, Vec<u8>)> = Vec::new();
    {
        let e = Engine::open(dir.path(), o()).unwrap();
        for round in 0..30u64 {
            for k in 0..8u64 {
                let key = format!("k{k}");
                let bytes = data(round * 100 + k, 100 + (k as usize) * 50);
                let v = put(&e, k as usize, &key, round, &bytes, 64);
                last_id = v.0;
                // Half the keys get drained each round: their versions become garbage.
                if k % 2 == 0 {
                    e.mark_drained(v).unwrap();
                }
            }
            let m = e
                .record_manifest(manifest(&format!("ckpt.{round}"), 2))
                .unwrap();
            if round % 3 != 0 {
                e.mark_manifest_done(m).unwrap();
            }
            e.sync().unwrap();
            assert!(
                e.usage().index_bytes < 4 * 4096,
                "round {round}: index is {} bytes",
                e.usage().index_bytes
            );
        }
        for k in (1..8u64).step_by(2) {
            expected.push((format!("k{k}"), 29, data(2900 + k, 100 + (k as usize) * 50)));
        }
        for (key, stamp, bytes) in &expected {
            check(&e, key, *stamp, bytes);
        }
        assert_eq!(e.usage().live_versions, 4);
    }
    assert!(!dir.path().join(INDEX_TMP).exists());
    let e = reopen_without_warnings(dir.path(), o());
    for (key, stamp, bytes) in &expected {
        check(&e, key, *stamp, bytes);
    }
    assert_eq!(e.usage().live_versions, 4);
    assert!(e.lookup("k0").is_none_or(|i| i.drained));
    let pending: Vec<String> = e
        .pending_manifests()
        .into_iter()
        .map(|(_, m)| m.checkpoint)
        .collect();
    let want: Vec<String> = (0..30).step_by(3).map(|r| format!("ckpt.{r}")).collect();
    assert_eq!(pending, want);
    assert_eq!(e.manifest_state("ckpt.1"), Some(true));
    assert!(e.begin_version("new", 1, 1).unwrap().0 > last_id);
}

#[test]
fn a_leftover_compaction_temp_file_is_ignored_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let a = data(60, 2000);
    {
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        put(&e, 0, "a", 1, &a, 500);
        e.sync().unwrap();
    }
    std::fs::write(dir.path().join(INDEX_TMP), b"CASCIDX1 half a snapshot").unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    assert!(!dir.path().join(INDEX_TMP).exists());
    check(&e, "a", 1, &a);
}

#[test]
fn a_second_open_of_the_same_directory_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    match Engine::open(dir.path(), opts(4096)) {
        Err(err @ Error::Locked { .. }) => assert!(err.to_string().contains("in use"), "{err}"),
        Err(err) => panic!("expected Locked, got {err}"),
        Ok(_) => panic!("opened twice"),
    }
    drop(e);
    Engine::open(dir.path(), opts(4096)).unwrap();
}

/// A process forked by another thread while an engine is open shares its LOCK descriptor
/// until it execs (a test binary spawning an S3 server, a server spawning a helper): the
/// engine's drop must still free the directory for the next open.
#[test]
fn a_child_forked_while_the_engine_was_open_does_not_keep_it_locked() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    let mut pipe = [0i32; 2];
    // SAFETY: pipe() fills the two-element array it is given.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child only calls the async-signal-safe read() and _exit().
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local; the child then exits without unwinding.
        unsafe {
            libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(e);
    let reopened = Engine::open(dir.path(), opts(4096));
    // SAFETY: writes one byte from a local to the pipe, closes both ends and reaps the child.
    unsafe {
        libc::write(pipe[1], b"x".as_ptr().cast(), 1);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    if let Err(err) = reopened {
        panic!("reopen while a forked child lives: {err}");
    }
}

#[test]
fn a_missing_arena_drops_its_versions_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (va, b) = {
        let e = Engine::open(dir.path(), opts(4096)).unwrap();
        let va = put(&e, 0, "a", 1, &data(70, 3000), 1000);
        let b = data(71, 3000);
        put(&e, 1, "b", 1, &b, 1000);
        e.sync().unwrap();
        (e.lock_arena_of(va), b)
    };
    std::fs::remove_file(dir.path().join(arena_name(va))).unwrap();
    let e = Engine::open(dir.path(), opts(4096)).unwrap();
    let w = e.recovery_warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains(&arena_name(va)), "{w:?}");
    assert!(e.lookup("a").is_none());
    check(&e, "b", 1, &b);
}

/// Issue 22: a done manifest used to stay in memory and in every index snapshot forever.
#[test]
fn completed_manifests_leave_memory_and_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let o = || EngineOptions {
        index_compact_bytes: 64 << 10,
        ..opts(8192)
    };
    let kept = super::model::DONE_KEPT as u64;
    let rounds = 3 * kept;
    // The largest index seen in the second and in the third thousand rounds.
    let mut index_max = [0u64; 3];
    {
        let e = Engine::open(dir.path(), o()).unwrap();
        for round in 0..rounds {
            let m = e
                .record_manifest(manifest(&format!("ckpt.{round}"), 4))
                .unwrap();
            e.mark_manifest_done(m).unwrap();
            let u = e.usage();
            assert!(
                u.manifests_held <= kept,
                "round {round}: {} manifests held",
                u.manifests_held
            );
            let third = (round / kept) as usize;
            index_max[third] = index_max[third].max(u.index_bytes);
        }
        // A pending one stays, whatever completes after it.
        e.record_manifest(manifest("pending", 2)).unwrap();
        e.sync().unwrap();
    }
    assert!(
        index_max[2] <= index_max[1] + index_max[1] / 4,
        "the index grows: {index_max:?}"
    );
    let e = Engine::open(dir.path(), o()).unwrap();
    assert!(e.usage().manifests_held <= kept + 1);
    assert_eq!(
        e.manifest_state(&format!("ckpt.{}", rounds - 1)),
        Some(true)
    );
    assert_eq!(e.manifest_state("ckpt.0"), None);
    assert_eq!(e.manifest_state("pending"), Some(false));
    let pending = e.pending_manifests();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].1, manifest("pending", 2));
}

/// Whether `dir` is on tmpfs (the engine then falls back to buffered arenas).
fn on_tmpfs(dir: &Path) -> bool {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` a valid, writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0);
    st.f_type == libc::TMPFS_MAGIC
}

/// Lengths of the arena files in `dir`, by arena number.
fn arena_lengths(dir: &Path) -> Vec<u64> {
    let mut v: Vec<(u32, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let n = parse_arena_name(e.file_name().to_str()?)?;
            Some((n, e.metadata().unwrap().len()))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, l)| l).collect()
}

#[test]
fn direct_mode_on_a_disk_pads_extents_with_zeros_and_reads_back_bit_for_bit() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    if on_tmpfs(dir.path()) {
        // Nothing to test on this machine: /var/tmp is no disk.
        return;
    }
    let o = || EngineOptions {
        writers: 1,
        direct: true,
        ..EngineOptions::default()
    };
    // Sources not aligned in memory (a slice at +1), sizes off the block size, one larger
    // than MAX_EXTENT, appends of odd sizes.
    let backing = data(60, (MAX_EXTENT + 3 * BLOCK) * 2 + 10);
    let a = &backing[1..4097 + 1];
    let b = &backing[BLOCK..BLOCK + MAX_EXTENT + 5];
    let c = &backing[3..3 + 1000];
    let (va, vb, vc);
    {
        let e = Engine::open(dir.path(), o()).unwrap();
        assert_eq!(*e.io_mode(), IoMode::Direct);
        va = put(&e, 0, "a", 1, a, 4097);
        vb = put(&e, 0, "b", 1, b, MAX_EXTENT + 5);
        vc = put(&e, 0, "c", 1, c, 333);
        e.sync().unwrap();
        // a: 2 blocks; b: a 4 MiB extent and a 5-byte one (1 block); c: 4 extents of 1 block;
        // the arena was preallocated ahead of the first extent's end.
        let used = 2 * BLOCK as u64 + MAX_EXTENT as u64 + BLOCK as u64 + 4 * BLOCK as u64;
        let preallocated = 2 * BLOCK as u64 + PREALLOCATE_AHEAD;
        assert!(used < preallocated);
        assert_eq!(arena_lengths(dir.path()), vec![preallocated]);
        let arena = std::fs::read(dir.path().join(arena_name(0))).unwrap();
        assert_eq!(&arena[..a.len()], a);
        assert!(
            arena[a.len()..2 * BLOCK].iter().all(|&x| x == 0),
            "padding is not zeros"
        );
        let at = 2 * BLOCK;
        assert_eq!(&arena[at..at + MAX_EXTENT], &b[..MAX_EXTENT]);
        let at = at + MAX_EXTENT;
        assert_eq!(&arena[at..at + 5], &b[MAX_EXTENT..]);
        assert!(arena[at + 5..at + BLOCK].iter().all(|&x| x == 0));
        for (v, bytes) in [(va, a), (vb, b), (vc, c)] {
            let m = e.map_version(v).unwrap();
            assert_eq!(m.verify().unwrap(), hash(bytes));
            assert_eq!(m.parts().concat(), bytes);
        }
    }
    // Recovery reads the padded arena as any other.
    let e = reopen_without_warnings(dir.path(), o());
    check(&e, "a", 1, a);
    check(&e, "b", 1, b);
    check(&e, "c", 1, c);
    let _ = (va, vb, vc);
}

/// Direct mode preallocates an active arena a quarter of `arena_size` (at most
/// PREALLOCATE_AHEAD) past its reserved end, so that O_DIRECT writes do not extend the file
/// (ext4 runs extending ones one at a time), and cuts the unused tail off when it rotates.
#[test]
fn direct_arenas_are_preallocated_ahead_and_trimmed_when_they_rotate() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    if on_tmpfs(dir.path()) {
        return; // /var/tmp is no disk: buffered arenas, nothing preallocated
    }
    const MIB: u64 = 1 << 20;
    let o = || EngineOptions {
        writers: 1,
        direct: true,
        arena_size: 16 * MIB,
        ..EngineOptions::default()
    };
    let bytes: Vec<Vec<u8>> = [MIB, 9 * MIB / 2, 8 * MIB, 4 * MIB]
        .iter()
        .enumerate()
        .map(|(i, &n)| data(90 + i as u64, n as usize))
        .collect();
    let key = |i: usize| format!("k{i}");
    {
        let e = Engine::open(dir.path(), o()).unwrap();
        assert_eq!(*e.io_mode(), IoMode::Direct);
        let mut lengths = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            put(&e, 0, &key(i), 1, b, b.len());
            lengths.push(arena_lengths(dir.path()));
        }
        // Reserved ends 1, 5.5 and 13.5 MiB (4 MiB extents): each write past the
        // preallocated end moves it 4 MiB past its own end, at most to 16 MiB. The fourth
        // does not fit: the arena is cut to 13.5 MiB and the next one starts, 4 + 4 MiB.
        let want: Vec<Vec<u64>> = vec![
            vec![5 * MIB],
            vec![19 * MIB / 2],
            vec![16 * MIB],
            vec![27 * MIB / 2, 8 * MIB],
        ];
        assert_eq!(lengths, want);
        e.sync().unwrap();
    }
    // The preallocated tail of the active arena reads as nothing after a restart.
    let e = reopen_without_warnings(dir.path(), o());
    for (i, b) in bytes.iter().enumerate() {
        check(&e, &key(i), 1, b);
    }
}

/// A direct engine on a really full disk (a 40 MiB ext4 on a loop device): the append that
/// does not fit gets `Error::Full`, every version synced before reads back bit for bit, the
/// engine goes on serving, and it reopens without warnings. Preallocating ahead must change
/// none of this when the preallocation itself runs out of space.
#[test]
fn a_full_disk_in_direct_mode_gives_full_and_loses_nothing_synced() {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let disk = cascade_testkit::fs::SmallExt4::mount(root.path(), 40)
        .unwrap_or_else(|why| panic!("a small ext4 for this test: {why}"));
    let dir = disk.mnt.join("staging");
    let o = || EngineOptions {
        writers: 2,
        direct: true,
        arena_size: 16 << 20,
        ..EngineOptions::default()
    };
    let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
    {
        let e = Engine::open(&dir, o()).unwrap();
        assert_eq!(*e.io_mode(), IoMode::Direct);
        let full = (0..40u64).find_map(|i| {
            let bytes = data(500 + i, 3 << 20);
            let key = format!("f{i}");
            let v = e.begin_version(&key, 1, bytes.len() as u64).unwrap();
            for (j, piece) in bytes.chunks(1 << 20).enumerate() {
                if let Err(err) = e.append(i as usize % 2, v, (j << 20) as u64, piece) {
                    return Some(err);
                }
            }
            e.seal(v, hash(&bytes), None).unwrap();
            e.sync().unwrap();
            kept.push((key, bytes));
            None
        });
        match full {
            Some(Error::Full { what }) => assert!(what.contains("is full"), "{what}"),
            other => panic!("expected Error::Full on a 40 MiB disk, got {other:?}"),
        }
        assert!(kept.len() >= 8, "only {} versions fit", kept.len());
        for (key, bytes) in &kept {
            check(&e, key, 1, bytes);
        }
        e.sync().unwrap();
    }
    let e = reopen_without_warnings(&dir, o());
    for (key, bytes) in &kept {
        check(&e, key, 1, bytes);
    }
}

#[test]
fn tmpfs_falls_back_to_buffered_arenas_packed_back_to_back() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return; // no /dev/shm on this machine
    };
    if !on_tmpfs(dir.path()) {
        return;
    }
    let e = Engine::open(
        dir.path(),
        EngineOptions {
            writers: 1,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    match e.io_mode() {
        IoMode::Buffered(why) => assert!(why.contains("O_DIRECT"), "{why}"),
        IoMode::Direct => panic!("tmpfs reports no O_DIRECT alignment: buffered expected"),
    }
    assert!(e.io_mode().to_string().starts_with("buffered"));
    let a = data(61, 4097);
    let b = data(62, 1000);
    put(&e, 0, "a", 1, &a, 4097);
    put(&e, 0, "b", 1, &b, 1000);
    e.sync().unwrap();
    assert_eq!(arena_lengths(dir.path()), vec![5097]);
    check(&e, "a", 1, &a);
    check(&e, "b", 1, &b);
}
