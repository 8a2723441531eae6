//! Durable stores in tests: one in a directory, and what a checkpoint in one must hold.

use std::path::Path;
use std::sync::Arc;

use cascade_durable::DurableStore;

use crate::data::b3;

/// The durable store in directory `root`.
pub fn durable_at(root: &Path) -> Arc<DurableStore> {
    Arc::new(DurableStore::open(root.to_str().expect("utf-8")).expect("open durable store"))
}

/// The bytes and BLAKE3 of one file of a checkpoint (`rel` relative to it).
pub struct Expected {
    pub rel: String,
    pub data: Vec<u8>,
    pub blake3: String,
}

/// The [`Expected`] file `rel` holding `data`.
pub fn expected(rel: &str, data: Vec<u8>) -> Expected {
    Expected {
        rel: rel.to_string(),
        blake3: b3(&data),
        data,
    }
}

/// The checkpoint `ckpt` in `durable` is complete, its marker lists exactly `files` with
/// their sizes and BLAKE3, every object downloads to the expected bytes and every `.blake3`
/// object matches.
pub fn assert_durable_checkpoint(durable: &DurableStore, ckpt: &str, files: &[&Expected]) {
    let marker = durable
        .read_marker(ckpt)
        .unwrap_or_else(|e| panic!("read the marker of {ckpt}: {e}"))
        .unwrap_or_else(|| panic!("{ckpt} has no completion marker in {}", durable.name()));
    let mut listed: Vec<(String, u64, String)> = marker
        .files
        .iter()
        .map(|f| (f.path.clone(), f.size, f.blake3.clone()))
        .collect();
    listed.sort();
    let mut want: Vec<(String, u64, String)> = files
        .iter()
        .map(|f| (f.rel.clone(), f.data.len() as u64, f.blake3.clone()))
        .collect();
    want.sort();
    assert_eq!(listed, want, "the marker of {ckpt} lists the wrong files");
    let bytes: u64 = files.iter().map(|f| f.data.len() as u64).sum();
    assert_eq!(marker.total_bytes, bytes, "{ckpt}: marker total");
    for f in files {
        let key = format!("{ckpt}/{}", f.rel);
        let got = durable
            .get_bytes(&key)
            .unwrap_or_else(|e| panic!("download {key}: {e}"));
        assert!(
            got.len() == f.data.len() && got[..] == f.data[..],
            "{key}: the durable bytes differ from the original ({} bytes, BLAKE3 {}, want {} bytes, {})",
            got.len(),
            b3(&got),
            f.data.len(),
            f.blake3
        );
        assert_eq!(
            durable
                .recorded_checksum(&key)
                .unwrap_or_else(|e| panic!("{key}.blake3: {e}")),
            f.blake3,
            "{key}.blake3"
        );
    }
    durable
        .verify_checkpoint(ckpt)
        .unwrap_or_else(|e| panic!("verify_checkpoint {ckpt}: {e}"));
}
