//! Chunk store and pending-manifest tests on real files in temporary directories.

use super::manifests::ManifestStore;
use super::*;
use crate::protocol::{ManifestPart, RecipeEntry};

/// Deterministic pseudo-random bytes.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.finalize_xof().fill(&mut out);
    out
}

fn raw_chunk(bytes: &[u8]) -> WireChunk<'_> {
    WireChunk {
        score: cascade_dedup::score(bytes),
        kind: BlobKind::Data,
        stored: Stored::Raw,
        raw_len: bytes.len() as u32,
        data: bytes,
    }
}

fn small_segments() -> ChunkOptions {
    ChunkOptions {
        segment_size: 1 << 20,
        ..ChunkOptions::default()
    }
}

fn push_all(store: &ChunkStore) -> Vec<(String, Score)> {
    let (cursor, _) = store.push_window();
    let batch = store.read_for_push(cursor, u64::MAX, &mut |_| {}).unwrap();
    let mut out = Vec::new();
    for r in &batch.records {
        match r {
            Scanned::Chunk {
                namespace, score, ..
            } => out.push((namespace.clone(), *score)),
            Scanned::Corrupt { why, .. } => panic!("corrupt record: {why}"),
        }
    }
    if batch.next != cursor {
        store
            .mark_pushed(batch.next, batch.chunks, batch.bytes)
            .unwrap();
    }
    out
}

#[test]
fn chunks_are_stored_once_per_namespace_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(dir.path(), ChunkOptions::default()).unwrap();
    let a = data(1, 5000);
    let b = data(2, 70_000);
    let frame = [raw_chunk(&a), raw_chunk(&b), raw_chunk(&a)];
    let o = store.put("job1", &frame).unwrap();
    assert_eq!((o.stored, o.present), (2, 1));
    assert_eq!(o.stored_bytes, 75_000);
    let again = store.put("job1", &[raw_chunk(&b)]).unwrap();
    assert_eq!((again.stored, again.present), (0, 1));
    // Another namespace is another repository: stored again.
    assert_eq!(store.put("", &[raw_chunk(&b)]).unwrap().stored, 1);
    let scores = [raw_chunk(&a).score, raw_chunk(&b).score, [9; 32]];
    assert_eq!(store.held("job1", &scores), [true, true, false]);
    assert_eq!(store.held("", &scores), [false, true, false]);
    assert_eq!(store.held("nobody", &scores), [false, false, false]);
    let got = store.get("job1", &scores[1]).unwrap().unwrap();
    assert!(got.data == b && got.raw_len == 70_000 && got.kind == BlobKind::Data);
    assert_eq!(store.get("job1", &[9; 32]).unwrap(), None);
    let u = store.usage();
    assert_eq!((u.index_chunks, u.pending_chunks), (3, 3));
    assert!(u.index_memory_bytes > 0);
}

#[test]
fn a_reopened_store_has_everything_synced_and_cuts_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let chunks: Vec<Vec<u8>> = (0..40).map(|i| data(i, 40_000 + i as usize)).collect();
    {
        let store = ChunkStore::open(dir.path(), small_segments()).unwrap();
        for pair in chunks.chunks(2) {
            let frame: Vec<WireChunk> = pair.iter().map(|c| raw_chunk(c)).collect();
            store.put("ns", &frame).unwrap();
        }
        assert!(store.usage().segment_files >= 2, "{:?}", store.usage());
    }
    // A crash in the middle of the next append: half a record, then garbage.
    let newest = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .unwrap();
    let before = std::fs::metadata(&newest).unwrap().len();
    let mut torn = Vec::new();
    let extra = data(99, 3000);
    record::encode(
        &mut torn,
        "ns",
        &cascade_dedup::score(&extra),
        BlobKind::Data,
        Stored::Raw,
        3000,
        &extra,
    );
    torn.truncate(torn.len() / 2);
    let mut f = OpenOptions::new().append(true).open(&newest).unwrap();
    std::io::Write::write_all(&mut f, &torn).unwrap();
    drop(f);

    let store = ChunkStore::open(dir.path(), small_segments()).unwrap();
    let warnings = store.recovery_warnings();
    assert!(
        warnings.len() == 1 && warnings[0].contains("cut an incomplete tail"),
        "{warnings:?}"
    );
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), before);
    for c in &chunks {
        let got = store.get("ns", &cascade_dedup::score(c)).unwrap();
        assert!(got.is_some_and(|g| g.data == *c));
    }
    assert_eq!(store.held("ns", &[cascade_dedup::score(&extra)]), [false]);
    assert_eq!(store.usage().pending_chunks, 40);
    // New chunks go to a new segment after the recovered ones.
    let more = data(1000, 10);
    store.put("ns", &[raw_chunk(&more)]).unwrap();
    assert_eq!(push_all(&store).len(), 41);
}

#[test]
fn pushed_segments_are_reclaimed_and_never_pushed_again() {
    let dir = tempfile::tempdir().unwrap();
    let chunks: Vec<Vec<u8>> = (0..60).map(|i| data(i, 100_000)).collect();
    let store = ChunkStore::open(dir.path(), small_segments()).unwrap();
    for c in &chunks[..30] {
        store.put("a", &[raw_chunk(c)]).unwrap();
    }
    let files_before = store.usage().segment_files;
    assert!(files_before >= 3);
    let first = push_all(&store);
    assert_eq!(first.len(), 30);
    assert!(first
        .iter()
        .zip(&chunks)
        .all(|((ns, s), c)| ns == "a" && *s == cascade_dedup::score(c)));
    // Every rotated segment is gone, with its index entries; the active one stays
    // readable.
    let u = store.usage();
    assert_eq!(u.segment_files, 1, "{u:?}");
    assert_eq!(u.pending_chunks, 0);
    let held = store.held(
        "a",
        &chunks[..30]
            .iter()
            .map(|c| cascade_dedup::score(c))
            .collect::<Vec<_>>(),
    );
    assert!(held[29] && !held[0], "{held:?}");
    assert_eq!(u.index_chunks as usize, held.iter().filter(|h| **h).count());
    assert!(push_all(&store).is_empty());

    for c in &chunks[30..] {
        store.put("a", &[raw_chunk(c)]).unwrap();
    }
    drop(store);
    let store = ChunkStore::open(dir.path(), small_segments()).unwrap();
    assert_eq!(store.usage().pending_chunks, 30);
    let second = push_all(&store);
    assert_eq!(second.len(), 30, "pushed again after a restart");
    assert_eq!(second[0].1, cascade_dedup::score(&chunks[30]));
    drop(store);
    let store = ChunkStore::open(dir.path(), small_segments()).unwrap();
    assert!(push_all(&store).is_empty());
    assert_eq!(store.usage().pending_chunks, 0);
}

#[test]
fn limits_refuse_with_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(
        dir.path(),
        ChunkOptions {
            max_chunks: 3,
            ..ChunkOptions::default()
        },
    )
    .unwrap();
    let c: Vec<Vec<u8>> = (0..4).map(|i| data(i, 100)).collect();
    store
        .put("", &[raw_chunk(&c[0]), raw_chunk(&c[1]), raw_chunk(&c[2])])
        .unwrap();
    assert!(matches!(
        store.put("", &[raw_chunk(&c[3])]),
        Err(Error::Full { .. })
    ));
    // Already held: no room needed.
    assert_eq!(store.put("", &[raw_chunk(&c[0])]).unwrap().present, 1);

    let dir = tempfile::tempdir().unwrap();
    let store = ChunkStore::open(
        dir.path(),
        ChunkOptions {
            capacity: Some(10_000),
            ..ChunkOptions::default()
        },
    )
    .unwrap();
    let big = data(7, 20_000);
    assert!(matches!(
        store.put("", &[raw_chunk(&big)]),
        Err(Error::Full { .. })
    ));
    assert_eq!(store.held("", &[cascade_dedup::score(&big)]), [false]);
}

fn part<'a>(
    checkpoint: &'a str,
    n: u32,
    last: bool,
    files: Vec<RecipeEntry>,
    scores: Vec<Score>,
) -> ManifestPart<'a> {
    ManifestPart {
        checkpoint,
        single_file: false,
        chunking: "cdc:avg=64KiB",
        compression: "zstd:1",
        part: n,
        last,
        files,
        scores,
    }
}

fn entry(i: u8) -> RecipeEntry {
    RecipeEntry {
        path: format!("rank{i}.dat"),
        size: u64::from(i) * 1000,
        blake3: [i; 32],
        root: [i + 100; 32],
    }
}

#[test]
fn manifests_arrive_in_parts_survive_a_restart_and_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let scores: Vec<Score> = (0..20_000u32)
        .map(|i| cascade_dedup::score(&i.to_le_bytes()))
        .collect();
    {
        let (store, warnings) = ManifestStore::open(dir.path()).unwrap();
        assert!(warnings.is_empty());
        let p0 = part("ckpt.1", 0, false, vec![entry(1)], scores[..7000].to_vec());
        let mut up = store.begin("job", &p0).unwrap();
        store.add(&mut up, &p0).unwrap();
        // Out of order, or another checkpoint: refused.
        let wrong = part("ckpt.1", 2, false, vec![], vec![]);
        assert!(matches!(
            store.add(&mut up, &wrong),
            Err(Error::Invalid { .. })
        ));
        let other = part("ckpt.2", 1, false, vec![], vec![]);
        assert!(store.add(&mut up, &other).is_err());
        let p1 = part("ckpt.1", 1, false, vec![entry(2), entry(3)], vec![]);
        store.add(&mut up, &p1).unwrap();
        let p2 = part("ckpt.1", 2, true, vec![], scores[7000..].to_vec());
        store.add(&mut up, &p2).unwrap();
        let m = store.commit(up).unwrap();
        assert_eq!((m.files.len(), m.score_count), (3, 20_000));
        // An unfinished upload leaves nothing.
        let q0 = part("ckpt.9", 0, false, vec![entry(9)], vec![]);
        let up = store.begin("job", &q0).unwrap();
        drop(up);
    }
    let (store, warnings) = ManifestStore::open(dir.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pending = store.pending();
    assert_eq!(pending.len(), 1);
    let m = &pending[0];
    assert_eq!(
        (
            m.namespace.as_str(),
            m.checkpoint.as_str(),
            m.chunking.as_str()
        ),
        ("job", "ckpt.1", "cdc:avg=64KiB")
    );
    assert_eq!(m.files, vec![entry(1), entry(2), entry(3)]);
    assert_eq!(store.read_scores(m, 0, 100_000).unwrap(), scores);
    assert_eq!(
        store.read_scores(m, 6990, 20).unwrap(),
        scores[6990..7010].to_vec()
    );
    assert!(store.read_scores(m, 20_000, 10).unwrap().is_empty());
    assert!(store.find("job", "ckpt.1").is_some());
    assert!(store.find("", "ckpt.1").is_none());

    // The same checkpoint again replaces it.
    let p = part("ckpt.1", 0, true, vec![entry(4)], scores[..1].to_vec());
    let mut up = store.begin("job", &p).unwrap();
    store.add(&mut up, &p).unwrap();
    let newer = store.commit(up).unwrap();
    assert_eq!(store.pending().len(), 1);
    assert_eq!(store.find("job", "ckpt.1").unwrap().id, newer.id);
    store.done(newer.id).unwrap();
    assert!(store.pending().is_empty());
    drop(store);

    // A damaged manifest file is moved aside, not loaded.
    let (store, _) = ManifestStore::open(dir.path()).unwrap();
    let p = part("ckpt.5", 0, true, vec![entry(5)], vec![]);
    let mut up = store.begin("", &p).unwrap();
    store.add(&mut up, &p).unwrap();
    let m = store.commit(up).unwrap();
    drop(store);
    let path = dir.path().join(format!("m-{:016}.cdm", m.id));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let (store, warnings) = ManifestStore::open(dir.path()).unwrap();
    assert!(store.pending().is_empty());
    assert!(
        warnings.len() == 1 && warnings[0].contains("checksum"),
        "{warnings:?}"
    );
}
