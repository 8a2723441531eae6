//! A directory store fsyncs what it writes before the write returns, and a completion marker
//! is written only once everything it lists is durable (docs/durable-layout.md,
//! "Durability"). A crash test cannot see a missing fsync (the page cache survives a killed
//! process), so these tests read the store's trace, in which a directory store records each
//! fsync once it is done, in order with the requests.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use bytes::Bytes;
use cascade_durable::{
    marker_key, now_unix_ns, part_key, DurableStore, JobProgress, MarkerFile, Part, UploadItem,
    CHECKSUM_SUFFIX, PART_FORMAT, VERSION_SUFFIX,
};

type Trace = Vec<(&'static str, String)>;

/// The directories whose entries lead to `key`, from its parent up to the root ("").
fn dirs_of(key: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut rest = key;
    while let Some((dir, _)) = rest.rsplit_once('/') {
        dirs.push(dir.to_string());
        rest = dir;
    }
    dirs.push(String::new());
    dirs
}

fn version_of(key: &str) -> String {
    match key.rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/.{base}{VERSION_SUFFIX}"),
        None => format!(".{key}{VERSION_SUFFIX}"),
    }
}

/// Checks that every write in `trace` is followed, before the next request, by the fsync of
/// the object and of every directory from its parent up to the root, that the fsyncs after a
/// delete are of its directory only, and that nothing else is followed by fsyncs. Returns,
/// for each key written, the position in `trace` at which its last write was durable.
fn durable_positions(trace: &Trace) -> HashMap<String, usize> {
    let mut durable = HashMap::new();
    let mut i = 0;
    while i < trace.len() {
        let (op, key) = &trace[i];
        assert!(
            !op.starts_with("fsync"),
            "fsync before any request: {trace:#?}"
        );
        let mut j = i + 1;
        while j < trace.len() && trace[j].0.starts_with("fsync") {
            j += 1;
        }
        let synced: HashSet<(&str, &str)> = trace[i + 1..j]
            .iter()
            .map(|(o, k)| (*o, k.as_str()))
            .collect();
        match *op {
            "put" => {
                let mut missing = Vec::new();
                if !synced.contains(&("fsync", key.as_str())) {
                    missing.push(format!("fsync {key}"));
                }
                for d in dirs_of(key) {
                    if !synced.contains(&("fsync_dir", d.as_str())) {
                        missing.push(format!("fsync_dir {d:?}"));
                    }
                }
                assert!(
                    missing.is_empty(),
                    "put {key} returned before {missing:?}:\n{trace:#?}"
                );
                durable.insert(key.clone(), j - 1);
            }
            "delete" => {
                let parent = dirs_of(key).remove(0);
                assert!(
                    synced.iter().all(|s| *s == ("fsync_dir", parent.as_str())),
                    "delete {key} followed by {synced:?}"
                );
            }
            _ => assert!(synced.is_empty(), "{op} {key} followed by {synced:?}"),
        }
        i = j;
    }
    durable
}

/// Position of the last `put` of `key` in `trace`.
fn last_put(trace: &Trace, key: &str) -> usize {
    trace
        .iter()
        .rposition(|(op, k)| *op == "put" && k == key)
        .unwrap_or_else(|| panic!("no put of {key}: {trace:#?}"))
}

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

/// The marker `marker` was written after every object of every file it lists (data,
/// checksum, version) was durable.
fn marker_after_its_files(
    trace: &Trace,
    durable: &HashMap<String, usize>,
    marker: &str,
    keys: &[String],
) {
    let at = last_put(trace, marker);
    for data in keys {
        for key in [
            data.clone(),
            format!("{data}{CHECKSUM_SUFFIX}"),
            version_of(data),
        ] {
            let synced = durable
                .get(&key)
                .unwrap_or_else(|| panic!("{key} never written: {trace:#?}"));
            assert!(
                *synced < at,
                "{marker} written (#{at}) before {key} was durable (#{synced})"
            );
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
        let durable = durable_positions(&trace);
        let marker = marker_key(ckpt, false);
        marker_after_its_files(&trace, &durable, &marker, &keys);
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
    let durable = durable_positions(&trace);
    marker_after_its_files(
        &trace,
        &durable,
        &marker_key(model, true),
        &[model.to_string()],
    );
    let marker = marker_key(ckpt, false);
    marker_after_its_files(&trace, &durable, &marker, &[file]);
    assert!(durable[&part_key(ckpt, "n0")] < last_put(&trace, &marker));
    for key in [marker, pack.to_string()] {
        assert!(durable.contains_key(&key), "{key}: {trace:#?}");
    }
}
