//! A directory store fsyncs what it writes before the write returns, and a completion marker
//! is written only once everything it lists is durable (docs/durable-layout.md,
//! "Durability"). A crash test cannot see a missing fsync (the page cache survives a killed
//! process), so these tests read the store's trace, in which a directory store records each
//! fsync once it is done, in order with the requests.

mod common;

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use cascade_durable::{
    marker_key, now_unix_ns, part_key, DurableStore, JobProgress, MarkerFile, Part, UploadItem,
    CHECKSUM_SUFFIX, PART_FORMAT,
};
use cascade_testkit::fsync::{
    assert_marker_after_its_files, assert_writes_fsynced, key_dirs, last_put, version_key_of, Trace,
};

/// Every fsync recorded in `trace` names a file or directory that exists below `root`.
fn fsyncs_exist(trace: &Trace, root: &Path) {
    for (op, key) in trace {
        match *op {
            "fsync" => assert!(root.join(key).is_file(), "{key}"),
            "fsync_dir" => assert!(root.join(key).is_dir(), "{key:?}"),
            _ => {}
        }
    }
}

#[test]
fn a_checkpoint_is_fsynced_before_its_marker_and_every_write_before_it_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    let store = DurableStore::open(root.to_str().unwrap()).unwrap();
    // New directories two levels deep, a subdirectory, an empty file and a multipart upload.
    let ckpt = "job7/ckpt.0001";
    let files = common::checkpoint_files();
    let keys: Vec<String> = files
        .iter()
        .map(|(rel, _)| format!("{ckpt}/{rel}"))
        .collect();
    for round in 0..2 {
        let items: Vec<UploadItem> = files
            .iter()
            .map(|(rel, d)| UploadItem::from_bytes(rel.clone(), d))
            .collect();
        store.start_trace();
        store.upload_checkpoint(ckpt, items).unwrap();
        let trace = store.take_trace();
        fsyncs_exist(&trace, &root);
        let durable = assert_writes_fsynced(&trace);
        let marker = marker_key(ckpt, false);
        assert_marker_after_its_files(&trace, &durable, &marker, &keys);
        // The marker itself is durable when the upload returns.
        assert!(durable.contains_key(&marker));
        if round == 1 {
            // A re-upload removes the old marker durably before it replaces any data.
            let deleted = trace
                .iter()
                .position(|(op, k)| *op == "delete" && *k == marker)
                .unwrap();
            assert_eq!(trace[deleted + 1], ("fsync_dir", ckpt.to_string()));
            let first_put = trace.iter().position(|(op, _)| *op == "put").unwrap();
            assert!(deleted + 1 < first_put, "{trace:#?}");
        }
    }
}

#[test]
fn single_files_parts_job_markers_and_buffers_are_fsynced() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    let store = DurableStore::open(&format!("file://{}", root.display())).unwrap();
    store.start_trace();

    // A single-file checkpoint, written step by step as the agent does.
    let model = "models/model.0042.pt";
    let data = cascade_testkit::pattern(300_000, 5);
    store.put_version(model, now_unix_ns()).unwrap();
    let digest = store.put_bytes(model, &data).unwrap();
    store.put_checksum(model, &digest).unwrap();
    let entry = MarkerFile {
        path: "model.0042.pt".to_string(),
        size: digest.size,
        blake3: digest.blake3.clone(),
    };
    store
        .write_marker_of(model, true, vec![entry.clone()])
        .unwrap();

    // A checkpoint of one node of a job: its part, then the marker (a conditional put).
    let ckpt = "job9/ckpt.1";
    let file = format!("{ckpt}/rank.0.bin");
    store.put_version(&file, now_unix_ns()).unwrap();
    let digest = store.put_bytes(&file, &data).unwrap();
    store.put_checksum(&file, &digest).unwrap();
    let part = Part {
        format: PART_FORMAT.to_string(),
        checkpoint: ckpt.to_string(),
        node: "n0".to_string(),
        nodes: 1,
        node_names: Vec::new(),
        written_unix_ns: now_unix_ns(),
        files: vec![MarkerFile {
            path: "rank.0.bin".to_string(),
            ..entry
        }],
    };
    store.write_part(&part).unwrap();
    assert!(matches!(
        store.complete_job(ckpt, 1).unwrap(),
        JobProgress::Complete(_)
    ));

    // A pack as the dedup repository writes it: buffers in one request.
    let pack = "cascade-dedup/packs/ab/abcdef.pack";
    store
        .put_buffers(
            pack,
            vec![Bytes::from_static(b"chunk one"), Bytes::from(data.clone())],
        )
        .unwrap();

    let trace = store.take_trace();
    fsyncs_exist(&trace, &root);
    let durable = assert_writes_fsynced(&trace);
    assert_marker_after_its_files(
        &trace,
        &durable,
        &marker_key(model, true),
        &[model.to_string()],
    );
    let marker = marker_key(ckpt, false);
    assert_marker_after_its_files(&trace, &durable, &marker, &[file]);
    assert!(durable[&part_key(ckpt, "n0")] < last_put(&trace, &marker));
    for key in [marker, pack.to_string()] {
        assert!(durable.contains_key(&key), "{key}: {trace:#?}");
    }
}

/// The store's own trace records an fsync right after making it; this checks the system
/// calls themselves. [`uploads_of_the_syscall_test`] runs under `strace` (needed for this
/// test), and every object that a rename or hard link put into place must be fsynced (its
/// staging file before the rename, or the object after it), with its parent directory and
/// each directory above holding a directory made since that one was last synced, before the
/// next object is put into place; every marker only
/// after all the objects it lists. A single put (every object but the multipart one) syncs
/// its data before the rename, so that a crash never leaves a partial object under the name,
/// and writes one of at least 64 KiB with O_DIRECT where the file system takes it.
#[test]
fn the_system_calls_sync_each_object_and_its_directories_before_the_next_and_the_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    let out = tmp.path().join("strace.out");
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new("strace")
        .args(["-f", "-y", "-qq", "-e", "signal=none", "-e"])
        .arg("trace=fsync,fdatasync,rename,renameat,renameat2,link,linkat,fcntl,mkdir,mkdirat")
        .arg("-o")
        .arg(&out)
        .arg(&exe)
        .args(["--exact", "uploads_of_the_syscall_test", "--test-threads=1"])
        .env(CHILD_DIR, &root)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run strace (this test needs it installed)");
    assert!(status.success(), "the traced uploads failed: {status}");
    let root = std::fs::canonicalize(&root).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let events = syscall_events(&text, &root);

    // Each object put into place is synced, with its directories, before the next one.
    let placed: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].0 == "place")
        .collect();
    assert!(placed.len() > 10, "{events:#?}");
    let mut synced_at: HashMap<String, usize> = HashMap::new();
    for (n, &i) in placed.iter().enumerate() {
        let key = &events[i].1;
        let end = placed.get(n + 1).copied().unwrap_or(events.len());
        let window = &events[i + 1..end];
        // Since the previous object was put into place: this one's staging file.
        let before = &events[n.checked_sub(1).map_or(0, |p| placed[p] + 1)..i];
        let staged_synced = before
            .iter()
            .any(|(op, k)| *op == "fsync_staged" && k == key);
        let mut missing = Vec::new();
        if !staged_synced && !window.iter().any(|(op, k)| *op == "fsync" && k == key) {
            missing.push(key.clone());
        }
        let multipart = key == &format!("{SYSCALL_CKPT}/big.dat");
        assert!(
            staged_synced || multipart,
            "{key} put into place before its data was synced: {events:#?}"
        );
        // Its parent, and each directory above holding a directory made since it was synced.
        let dirs = key_dirs(key);
        if !window.iter().any(|(op, k)| *op == "fsync" && *k == dirs[0]) {
            missing.push(format!("{}/", dirs[0]));
        }
        for pair in dirs.windows(2) {
            let Some(made) = events[..end]
                .iter()
                .rposition(|(op, k)| *op == "mkdir" && *k == pair[0])
            else {
                continue;
            };
            if !events[made..end]
                .iter()
                .any(|(op, k)| *op == "fsync" && *k == pair[1])
            {
                missing.push(format!("{}/ (after mkdir {})", pair[1], pair[0]));
            }
        }
        assert!(
            missing.is_empty(),
            "{key} put into place, then the next object before fsync of {missing:?}: {events:#?}"
        );
        synced_at.insert(key.clone(), end);
    }
    // The single puts of at least 64 KiB, written with O_DIRECT unless the file system
    // refused it (then asked once, and refused) or keeps its files in memory (not asked).
    let fs_type = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&root)
        .output()
        .expect("stat -f");
    let fs_type = String::from_utf8_lossy(&fs_type.stdout).trim().to_string();
    let in_memory = fs_type == "tmpfs" || fs_type == "ramfs";
    let refused = in_memory || events.iter().any(|(op, _)| *op == "direct_refused");
    for rel in ["rank0.dat", "sub/rank1.dat"] {
        let key = format!("{SYSCALL_CKPT}/{rel}");
        assert!(
            refused || events.contains(&("direct", key.clone())),
            "{key} not written with O_DIRECT: {events:#?}"
        );
    }
    // Markers after what they list.
    let markers = [
        (marker_key(SYSCALL_CKPT, false), SYSCALL_CKPT),
        (marker_key(SYSCALL_JOB, false), SYSCALL_JOB),
    ];
    for (marker, ckpt) in markers {
        let at = placed
            .iter()
            .copied()
            .rfind(|&i| events[i].1 == marker)
            .unwrap_or_else(|| panic!("{marker} never put into place: {events:#?}"));
        let listed = std::fs::read(root.join(&marker)).unwrap();
        let listed: cascade_durable::Marker = serde_json::from_slice(&listed).unwrap();
        for f in &listed.files {
            let data = format!("{ckpt}/{}", f.path);
            for key in [
                data.clone(),
                format!("{data}{CHECKSUM_SUFFIX}"),
                version_key_of(&data),
            ] {
                let synced = synced_at[&key];
                assert!(
                    synced <= at,
                    "{marker} put into place before {key} was synced"
                );
            }
        }
    }
}

const CHILD_DIR: &str = "CASCADE_DURABILITY_TEST_DIR";
const SYSCALL_CKPT: &str = "job7/ckpt.0002";
const SYSCALL_JOB: &str = "job8/ckpt.1";

/// The uploads whose system calls the test above reads: a checkpoint (with a multipart
/// upload) and a one-node job's part and marker (a conditional put: a hard link). Into the
/// directory `CASCADE_DURABILITY_TEST_DIR` names, else a temporary one.
#[test]
fn uploads_of_the_syscall_test() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::env::var_os(CHILD_DIR).map_or_else(|| tmp.path().join("d"), Into::into);
    let store = DurableStore::open(root.to_str().unwrap()).unwrap();
    let files = common::checkpoint_files();
    let items: Vec<UploadItem> = files
        .iter()
        .map(|(rel, d)| UploadItem::from_bytes(rel.clone(), d))
        .collect();
    store.upload_checkpoint(SYSCALL_CKPT, items).unwrap();
    let data = cascade_testkit::pattern(1000, 9);
    let file = format!("{SYSCALL_JOB}/rank.0.bin");
    store.put_version(&file, now_unix_ns()).unwrap();
    let digest = store.put_bytes(&file, &data).unwrap();
    store.put_checksum(&file, &digest).unwrap();
    store
        .write_part(&Part {
            format: PART_FORMAT.to_string(),
            checkpoint: SYSCALL_JOB.to_string(),
            node: "n0".to_string(),
            nodes: 1,
            node_names: Vec::new(),
            written_unix_ns: now_unix_ns(),
            files: vec![MarkerFile {
                path: "rank.0.bin".to_string(),
                size: digest.size,
                blake3: digest.blake3,
            }],
        })
        .unwrap();
    assert!(matches!(
        store.complete_job(SYSCALL_JOB, 1).unwrap(),
        JobProgress::Complete(_)
    ));
    store.verify_checkpoint(SYSCALL_CKPT).unwrap();
    store.verify_checkpoint(SYSCALL_JOB).unwrap();
}

/// The events below `root` in an `strace -f -y` log, in the order they completed:
/// `("place", key)` for a successful rename or hard link onto `key`, `("fsync", key)` for a
/// successful fsync of the file or directory `key` ("" for the root), `("mkdir", key)` for a
/// directory made, `("fsync_staged", key)`
/// for one of a staging file `key#<n>`, `("direct", key)` when O_DIRECT was turned on for it,
/// `("direct_refused", key)` when the file system refused that.
fn syscall_events(log: &str, root: &Path) -> Vec<(&'static str, String)> {
    let root = root.to_str().unwrap();
    let key_of = |path: &str| -> Option<String> {
        let rest = path.strip_prefix(root)?;
        if rest.is_empty() {
            return Some(String::new());
        }
        Some(rest.strip_prefix('/')?.to_string())
    };
    // Calls split by another thread's: pid -> the call's name and arguments.
    let mut pending: HashMap<&str, String> = HashMap::new();
    let mut events = Vec::new();
    for line in log.lines() {
        let Some((pid, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let rest = rest.trim_start();
        let call = if let Some(started) = rest.strip_suffix("<unfinished ...>") {
            pending.insert(pid, started.to_string());
            continue;
        } else if rest.starts_with("<...") {
            let Some(started) = pending.remove(pid) else {
                continue;
            };
            let tail = rest.split_once("resumed>").map_or("", |(_, t)| t);
            format!("{started}{tail}")
        } else {
            rest.to_string()
        };
        let name = call.split('(').next().unwrap_or("");
        // fsync(7</path/to/file>) = 0, fcntl(7</path/to/file#1>, F_SETFL, O_RDWR|O_DIRECT) = 0
        let fd_key = || {
            call.split_once('<')
                .and_then(|(_, p)| p.split_once('>'))
                .and_then(|(p, _)| key_of(p))
        };
        // `key#<n>` -> `key`
        let staged = |key: &str| {
            let (name, n) = key.rsplit_once('#')?;
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            digits.then(|| name.to_string())
        };
        if name == "fcntl" && call.contains("F_SETFL") && call.contains("O_DIRECT") {
            if let Some(key) = fd_key().as_deref().and_then(staged) {
                if call.trim_end().ends_with("= 0") {
                    events.push(("direct", key));
                } else if call.contains("EINVAL") {
                    events.push(("direct_refused", key));
                }
            }
            continue;
        }
        if !call.trim_end().ends_with("= 0") {
            continue;
        }
        match name {
            "fsync" | "fdatasync" => {
                if let Some(key) = fd_key() {
                    match staged(&key) {
                        Some(object) => events.push(("fsync_staged", object)),
                        None => events.push(("fsync", key)),
                    }
                }
            }
            "mkdir" | "mkdirat" => {
                // mkdir("/path/to/dir", 0777) = 0; mkdirat(AT_FDCWD</cwd>, "/path/to/dir", 0777)
                if let Some(key) = call.split('"').nth(1).and_then(key_of) {
                    events.push(("mkdir", key));
                }
            }
            "rename" | "renameat" | "renameat2" | "link" | "linkat" => {
                // The destination is the second quoted (absolute) path.
                let dest = call.split('"').nth(3);
                if let Some(key) = dest.and_then(key_of) {
                    events.push(("place", key));
                }
            }
            _ => {}
        }
    }
    events
}

/// A write syncs the chain of directories above its object only up to the first one a write
/// of this store already made durable: the second object in a directory costs one directory
/// fsync, not one per level (each flushes the disk's cache), and a new directory beside
/// durable ones only the levels that changed. Directories made for a multipart upload are
/// synced too.
#[test]
fn the_directories_above_an_object_are_synced_once_per_store() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    let store = DurableStore::open(root.to_str().unwrap()).unwrap();
    let fsync_dirs = |trace: &Trace| -> Vec<String> {
        trace
            .iter()
            .filter(|(op, _)| *op == "fsync_dir")
            .map(|(_, k)| k.clone())
            .collect()
    };
    let data = cascade_testkit::pattern(100_000, 3);

    store.start_trace();
    store.put_bytes("a/b/c/one", &data).unwrap();
    let trace = store.take_trace();
    assert_writes_fsynced(&trace);
    assert_eq!(fsync_dirs(&trace), ["a/b/c", "a/b", "a", ""]);

    store.start_trace();
    store.put_bytes("a/b/c/two", &data).unwrap();
    store.put_bytes("a/b/new/three", &data).unwrap();
    let trace = store.take_trace();
    assert_writes_fsynced(&trace);
    assert_eq!(fsync_dirs(&trace), ["a/b/c", "a/b/new", "a/b"]);
    assert!(
        trace.contains(&("mkdir", "a/b/new".to_string())),
        "{trace:#?}"
    );

    // A multipart upload (larger than one part) into new directories.
    let big = cascade_testkit::pattern(9 << 20, 4);
    store.start_trace();
    let digest = store.put_bytes("a/x/y/big", &big).unwrap();
    let trace = store.take_trace();
    assert_writes_fsynced(&trace);
    assert_eq!(fsync_dirs(&trace), ["a/x/y", "a/x", "a"]);
    assert_eq!(digest.blake3, cascade_testkit::b3(&big));

    // Another store (another process) knows none of them: the whole chain once.
    let again = DurableStore::open(root.to_str().unwrap()).unwrap();
    again.start_trace();
    again.put_bytes("a/b/c/four", &data).unwrap();
    assert_eq!(fsync_dirs(&again.take_trace()), ["a/b/c", "a/b", "a", ""]);
}
