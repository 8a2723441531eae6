//! The agent's data path on real parts: a node store in /dev/shm (with a spill file) and the
//! durable tier's directory backend in a temporary directory.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cascade_agent::{drain_checkpoint, restore_checkpoint, restore_into_store, StoreFileReader};
use cascade_durable::DurableStore;
use cascade_store::{ChunkLocation, OpenOptions, Prefault, SpillConfig, Store, StoreConfig};
use cascade_testkit::fsync::{assert_marker_after_its_files, assert_writes_fsynced};
use cascade_testkit::{pattern, read_store_file as read_all};

const CHUNK: u64 = 64 << 10;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A store (4 memory chunks, 64 spill chunks) destroyed when the test ends.
struct TestStore {
    store: Option<Store>,
    name: String,
    _dir: tempfile::TempDir,
}

impl TestStore {
    fn new() -> TestStore {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("/cascade-agent-test-{}-{n}", std::process::id());
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = StoreConfig {
            name: name.clone(),
            capacity: 4 * CHUNK,
            chunk_size: CHUNK,
            max_files: 64,
            spill: Some(SpillConfig {
                path: dir.path().join("spill"),
                size: 64 * CHUNK,
            }),
            prefault: Prefault::Off,
        };
        let store = Store::create(&cfg).expect("create store");
        TestStore {
            store: Some(store),
            name,
            _dir: dir,
        }
    }
}

impl std::ops::Deref for TestStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        self.store.as_ref().expect("store")
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy(&self.name);
    }
}

fn write(store: &Store, path: &str, data: &[u8], offset: u64) {
    let opts = OpenOptions::new().write(true).create(true).mode(0o644);
    let file = store.open(path, &opts).expect("open for write");
    file.write_all_at(data, offset).expect("write");
}

/// The checkpoint: files in memory, spilled, sparse, empty, in a subdirectory.
/// Returns (relative path, contents).
fn make_checkpoint(store: &Store, dir: &str) -> Vec<(String, Vec<u8>)> {
    store.create_dir_all(&format!("{dir}/sub"), 0o755).unwrap();
    let rank0 = pattern(100_000, 1); // 2 chunks, in memory
    let rank1 = pattern(300_001, 2); // 5 chunks: memory runs out, the rest spills
    write(store, &format!("{dir}/rank0.dat"), &rank0, 0);
    write(store, &format!("{dir}/sub/rank1.dat"), &rank1, 0);
    // A hole of three chunks and a bit, then 10 bytes.
    let tail = pattern(10, 3);
    let hole_end = 3 * CHUNK + 4321;
    write(store, &format!("{dir}/sparse.dat"), &tail, hole_end);
    let mut sparse = vec![0u8; hole_end as usize];
    sparse.extend_from_slice(&tail);
    write(store, &format!("{dir}/empty.dat"), &[], 0);
    let mut files = vec![
        ("empty.dat".to_string(), Vec::new()),
        ("rank0.dat".to_string(), rank0),
        ("sparse.dat".to_string(), sparse),
        ("sub/rank1.dat".to_string(), rank1),
    ];
    files.sort();
    for (rel, data) in &files {
        assert_eq!(&read_all(store, &format!("{dir}/{rel}")), data, "{rel}");
    }
    files
}

fn local_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    if root.exists() {
        walk(root, root, &mut out);
    }
    out.sort();
    out
}

#[test]
fn reader_reads_memory_spilled_and_holes_exactly() {
    let store = TestStore::new();
    let files = make_checkpoint(&store, "/ckpt.0001");
    let mut memory = 0;
    let mut spilled = 0;
    for (rel, data) in &files {
        let path = format!("/ckpt.0001/{rel}");
        for chunk in store.chunk_list(&path).unwrap() {
            match chunk.location {
                ChunkLocation::Memory { .. } => memory += 1,
                ChunkLocation::Spill { .. } => spilled += 1,
            }
        }
        // Odd buffer sizes, so reads start and end inside chunks and span several.
        for size in [1usize, 4093, 65_536, 200_000] {
            let file = store.open(&path, &OpenOptions::new().read(true)).unwrap();
            let mut reader = StoreFileReader::new(&store, &file).unwrap();
            assert_eq!(reader.len(), data.len() as u64);
            let mut got = Vec::new();
            let mut buf = vec![0u8; size];
            loop {
                let n = reader.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == *data, "{rel} with {size}-byte reads");
        }
    }
    assert!(memory > 0, "some chunks must be in memory");
    assert!(spilled > 0, "some chunks must be spilled");
}

#[test]
fn drain_writes_the_plain_layout_and_restore_returns_the_same_bytes() {
    let store = TestStore::new();
    let files = make_checkpoint(&store, "/ckpt.0001");
    let durable_dir = tempfile::tempdir().unwrap();
    let durable = DurableStore::open(durable_dir.path().to_str().unwrap()).unwrap();

    let last = AtomicU64::new(0);
    let progress = |n: u64| {
        assert!(n >= last.load(Ordering::Relaxed), "progress goes forward");
        last.store(n, Ordering::Relaxed);
    };
    let report = drain_checkpoint(&store, "/ckpt.0001", &durable, &progress).unwrap();
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(report.checkpoint, "ckpt.0001");
    assert_eq!(report.bytes, total);
    assert_eq!(last.load(Ordering::Relaxed), total);
    assert_eq!(report.files.len(), files.len());

    // The plain layout, byte for byte.
    let root = durable_dir.path().join("ckpt.0001");
    let mut expected_names = vec![".cascade-complete".to_string()];
    for (rel, data) in &files {
        let on_disk = std::fs::read(root.join(rel)).unwrap();
        assert!(on_disk == *data, "durable copy of {rel}");
        let hex = blake3::hash(data).to_hex().to_string();
        let base = rel.rsplit('/').next().unwrap();
        let sum = std::fs::read_to_string(root.join(format!("{rel}.blake3"))).unwrap();
        assert_eq!(sum, format!("{hex}  {base}\n"), "checksum of {rel}");
        expected_names.push(rel.clone());
        expected_names.push(format!("{rel}.blake3"));
        // The hidden version object written before the data (docs/durable-layout.md).
        let version = match rel.rsplit_once('/') {
            Some((dir, base)) => format!("{dir}/.{base}.cascade-version"),
            None => format!(".{rel}.cascade-version"),
        };
        let stamp = std::fs::read_to_string(root.join(&version)).unwrap();
        assert!(stamp.trim().parse::<u64>().is_ok(), "{version}: {stamp:?}");
        expected_names.push(version);
    }
    expected_names.sort();
    assert_eq!(local_files(&root), expected_names);
    let marker = durable.read_marker("ckpt.0001").unwrap().expect("marker");
    assert_eq!(marker.total_bytes, total);
    assert_eq!(marker.files, report.files);
    durable.verify_checkpoint("ckpt.0001").unwrap();

    // Restore into a fresh local directory.
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("restored");
    let restored = restore_checkpoint(&durable, None, "ckpt.0001", &out, &|_| {}).unwrap();
    assert_eq!(restored.bytes, total);
    let names: Vec<String> = files.iter().map(|(r, _)| r.clone()).collect();
    assert_eq!(local_files(&out), names);
    for (rel, data) in &files {
        assert!(
            std::fs::read(out.join(rel)).unwrap() == *data,
            "restored {rel}"
        );
    }

    // Restore into the store under another name.
    let restored =
        restore_into_store(&durable, None, "/ckpt.0001/", &store, "/again", &|_| {}).unwrap();
    assert_eq!(restored.bytes, total);
    for (rel, data) in &files {
        assert!(
            read_all(&store, &format!("/again/{rel}")) == *data,
            "restored into the store: {rel}"
        );
    }
    assert_eq!(
        store
            .read_dir("/again")
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect::<Vec<_>>(),
        vec!["empty.dat", "rank0.dat", "sparse.dat", "sub"]
    );
}

/// A drain to a directory store is durable before it returns: every object it writes is
/// fsynced with its directories before the next request, every marker only after each file
/// it lists (data, checksum and version object), and a re-drain's deletion of the old marker
/// before any data is replaced (docs/durable-layout.md, "Durability").
#[test]
fn a_drain_fsyncs_every_object_before_the_next_and_the_marker_last() {
    let store = TestStore::new();
    let files = make_checkpoint(&store, "/ckpt.0004");
    write(&store, "/solo.dat", &pattern(150_000, 9), 0);
    let durable_dir = tempfile::tempdir().unwrap();
    let durable = DurableStore::open(durable_dir.path().to_str().unwrap()).unwrap();
    let keys: Vec<String> = files
        .iter()
        .map(|(rel, _)| format!("ckpt.0004/{rel}"))
        .collect();
    for round in 0..2 {
        durable.start_trace();
        drain_checkpoint(&store, "/ckpt.0004", &durable, &|_| {}).unwrap();
        drain_checkpoint(&store, "/solo.dat", &durable, &|_| {}).unwrap();
        let trace = durable.take_trace();
        let synced = assert_writes_fsynced(&trace);
        let marker = "ckpt.0004/.cascade-complete";
        assert_marker_after_its_files(&trace, &synced, marker, &keys);
        let solo = ["solo.dat".to_string()];
        assert_marker_after_its_files(&trace, &synced, "solo.dat.cascade-complete", &solo);
        if round == 1 {
            let deleted = trace
                .iter()
                .position(|(op, k)| *op == "delete" && k == marker)
                .expect("the old marker deleted");
            assert_eq!(trace[deleted + 1], ("fsync_dir", "ckpt.0004".to_string()));
            let first_put = trace.iter().position(|(op, _)| *op == "put");
            assert!(first_put > Some(deleted + 1), "{trace:#?}");
        }
    }
}

#[test]
fn a_single_file_is_a_checkpoint_of_one_file() {
    let store = TestStore::new();
    let data = pattern(150_000, 9);
    write(&store, "/solo.dat", &data, 0);
    let durable_dir = tempfile::tempdir().unwrap();
    let durable = DurableStore::open(durable_dir.path().to_str().unwrap()).unwrap();
    let report = drain_checkpoint(&store, "/solo.dat", &durable, &|_| {}).unwrap();
    assert_eq!(report.checkpoint, "solo.dat");
    // The object is the file itself, with its checksum and marker beside it.
    assert!(std::fs::read(durable_dir.path().join("solo.dat")).unwrap() == data);
    assert!(durable_dir.path().join("solo.dat.blake3").is_file());
    assert!(durable_dir
        .path()
        .join("solo.dat.cascade-complete")
        .is_file());
    let dest = tempfile::tempdir().unwrap();
    restore_checkpoint(&durable, None, "solo.dat", dest.path(), &|_| {}).unwrap();
    assert!(std::fs::read(dest.path().join("solo.dat")).unwrap() == data);
}

#[test]
fn an_incomplete_checkpoint_is_refused() {
    let store = TestStore::new();
    make_checkpoint(&store, "/ckpt.0002");
    let durable_dir = tempfile::tempdir().unwrap();
    let durable = DurableStore::open(durable_dir.path().to_str().unwrap()).unwrap();
    drain_checkpoint(&store, "/ckpt.0002", &durable, &|_| {}).unwrap();
    std::fs::remove_file(durable_dir.path().join("ckpt.0002/.cascade-complete")).unwrap();

    let dest = tempfile::tempdir().unwrap();
    let err = restore_checkpoint(&durable, None, "ckpt.0002", dest.path(), &|_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("not complete"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert_eq!(err.errno(), libc_enoent());
    assert!(local_files(dest.path()).is_empty());
    let err =
        restore_into_store(&durable, None, "ckpt.0002", &store, "/back", &|_| {}).unwrap_err();
    assert!(err.to_string().contains("not complete"), "{err}");
    assert!(store.stat("/back").is_err());
}

fn libc_enoent() -> i32 {
    std::io::Error::from(std::io::ErrorKind::NotFound)
        .raw_os_error()
        .unwrap_or(2)
}

#[test]
fn a_corrupt_file_fails_restore_and_leaves_nothing_partial() {
    let store = TestStore::new();
    make_checkpoint(&store, "/ckpt.0003");
    let durable_dir = tempfile::tempdir().unwrap();
    let durable = DurableStore::open(durable_dir.path().to_str().unwrap()).unwrap();
    drain_checkpoint(&store, "/ckpt.0003", &durable, &|_| {}).unwrap();
    // Flip one byte of the last file restored (files before it must not be left behind).
    let victim = durable_dir.path().join("ckpt.0003/sub/rank1.dat");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[12_345] ^= 0xff;
    std::fs::write(&victim, &bytes).unwrap();

    let dest = tempfile::tempdir().unwrap();
    let err = restore_checkpoint(&durable, None, "ckpt.0003", dest.path(), &|_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("corrupt") && msg.contains("sub/rank1.dat"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    assert_eq!(local_files(dest.path()), Vec::<String>::new());

    let err =
        restore_into_store(&durable, None, "ckpt.0003", &store, "/back", &|_| {}).unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
    let mut left = Vec::new();
    let mut dirs = vec!["/back".to_string()];
    while let Some(dir) = dirs.pop() {
        for entry in store.read_dir(&dir).unwrap_or_default() {
            let path = format!("{dir}/{}", entry.name);
            if entry.kind == cascade_store::FileKind::Dir {
                dirs.push(path);
            } else {
                left.push(path);
            }
        }
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}
