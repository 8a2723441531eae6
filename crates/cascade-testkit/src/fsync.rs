//! Checks of a directory store's trace ([`cascade_durable::DurableStore::start_trace`]): it
//! records each fsync (`fsync` of an object, `fsync_dir` of a directory) once done, and each
//! directory it creates for a write (`mkdir`), in order with the requests, so a test can tell whether every write was durable before it returned
//! and every completion marker only after what it lists (docs/durable-layout.md,
//! "Durability").

use std::collections::{HashMap, HashSet};

use cascade_durable::{CHECKSUM_SUFFIX, VERSION_SUFFIX};

/// A trace: (operation, key) in order.
pub type Trace = Vec<(&'static str, String)>;

/// The directories whose entries lead to `key` in a directory store, from its parent up to
/// the root ("").
pub fn key_dirs(key: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut rest = key;
    while let Some((dir, _)) = rest.rsplit_once('/') {
        dirs.push(dir.to_string());
        rest = dir;
    }
    dirs.push(String::new());
    dirs
}

/// The key of the version object of `key` (docs/durable-layout.md).
pub fn version_key_of(key: &str) -> String {
    match key.rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/.{base}{VERSION_SUFFIX}"),
        None => format!(".{key}{VERSION_SUFFIX}"),
    }
}

/// Checks that every write in `trace` is followed, before the next request, by the fsync of
/// the object and of its parent directory, and of every directory above it whose child on
/// the way the write created (`mkdir` in the trace) since that directory was last synced;
/// that the fsyncs after a delete are of its directory only, and that nothing else is
/// followed by fsyncs. Returns, for each key written, the position in `trace` at which its
/// last write was durable.
pub fn assert_writes_fsynced(trace: &Trace) -> HashMap<String, usize> {
    let mut durable = HashMap::new();
    // Directory -> position of its last mkdir.
    let mut made: HashMap<&str, usize> = HashMap::new();
    // Directory -> position of its last fsync.
    let mut synced_dir: HashMap<&str, usize> = HashMap::new();
    let mut i = 0;
    while i < trace.len() {
        let (op, key) = &trace[i];
        assert!(
            !op.starts_with("fsync") && *op != "mkdir",
            "{op} before any request: {trace:#?}"
        );
        let mut j = i + 1;
        while j < trace.len() && (trace[j].0.starts_with("fsync") || trace[j].0 == "mkdir") {
            match trace[j].0 {
                "mkdir" => made.insert(trace[j].1.as_str(), j),
                "fsync_dir" => synced_dir.insert(trace[j].1.as_str(), j),
                _ => None,
            };
            j += 1;
        }
        let synced: HashSet<(&str, &str)> = trace[i + 1..j]
            .iter()
            .filter(|(o, _)| *o != "mkdir")
            .map(|(o, k)| (*o, k.as_str()))
            .collect();
        match *op {
            "put" => {
                let mut missing = Vec::new();
                if !synced.contains(&("fsync", key.as_str())) {
                    missing.push(format!("fsync {key}"));
                }
                let dirs = key_dirs(key);
                if !synced.contains(&("fsync_dir", dirs[0].as_str())) {
                    missing.push(format!("fsync_dir {:?}", dirs[0]));
                }
                // Above the parent: the directory holding each directory made since.
                for pair in dirs.windows(2) {
                    let (child, dir) = (pair[0].as_str(), pair[1].as_str());
                    if let Some(&at) = made.get(child) {
                        if synced_dir.get(dir).is_none_or(|&s| s < at) {
                            missing.push(format!("fsync_dir {dir:?} (after mkdir {child:?})"));
                        }
                    }
                }
                assert!(
                    missing.is_empty(),
                    "put {key} returned before {missing:?}:\n{trace:#?}"
                );
                durable.insert(key.clone(), j - 1);
            }
            "delete" => {
                let parent = key_dirs(key).remove(0);
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
pub fn last_put(trace: &Trace, key: &str) -> usize {
    trace
        .iter()
        .rposition(|(op, k)| *op == "put" && k == key)
        .unwrap_or_else(|| panic!("no put of {key}: {trace:#?}"))
}

/// The marker `marker` was written after every object of every file it lists (data,
/// checksum, version) was durable.
pub fn assert_marker_after_its_files(
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
            version_key_of(data),
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
