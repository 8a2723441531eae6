//! The directory backend on a temporary directory.

mod common;

use cascade_durable::{DurableStore, Error, UploadItem};

#[test]
fn directory_checkpoint_layout_and_verification() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("durable");
    // The directory is created when missing.
    let store = DurableStore::open(&format!("file://{}", root.display())).unwrap();
    assert_eq!(store.name(), format!("file://{}", root.display()));
    common::checkpoint_round_trip(&store, &root);
    common::failed_reupload_is_not_complete(&store);
    common::checksums_read_together(&store);
    // No staging or probe files are left behind.
    let mut stray = Vec::new();
    for o in store.list("").unwrap() {
        if o.path.contains('#') || o.path.contains(".cascade-probe") {
            stray.push(o.path);
        }
    }
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn put_file_from_a_local_file_and_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.bin");
    let d = cascade_testkit::pattern(20 * 1024 * 1024 + 3, 11);
    std::fs::write(&src, &d).unwrap();
    let store = DurableStore::open(tmp.path().join("d").to_str().unwrap()).unwrap();
    let item = UploadItem::from_path("x/src.bin", &src).unwrap();
    let digest = store.put_file(&item.rel, item.reader, item.len).unwrap();
    assert_eq!(digest.blake3, cascade_testkit::b3(&d));
    store.put_checksum("x/src.bin", &digest).unwrap();
    assert_eq!(store.verify_file("x/src.bin").unwrap(), digest);
    store.delete("x/src.bin").unwrap();
    store.delete("x/src.bin").unwrap(); // missing is fine
    assert!(store.size("x/src.bin").unwrap_err().is_not_found());
    // Below a file (ENOTDIR in a directory) is missing too: the markers of a single-file
    // checkpoint whose data object exists.
    store.put_bytes("one.bin", b"data").unwrap();
    store.delete("one.bin/.cascade-complete").unwrap();
    store.delete_marker("one.bin").unwrap();
    assert_eq!(store.get_bytes("one.bin").unwrap().as_ref(), b"data");
}

#[test]
fn unwritable_directory_is_one_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    // A directory below a regular file cannot be created, even by root.
    let spec = format!("file://{}/sub", file.display());
    let e = DurableStore::open(&spec).unwrap_err();
    assert!(matches!(e, Error::NotWritable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("not writable") && msg.contains("plain-file"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    // /proc is not writable either (a read-only mount or EACCES/ENOENT, never a panic).
    let e = DurableStore::open("file:///proc/cascade-durable-test").unwrap_err();
    assert!(matches!(e, Error::NotWritable { .. }), "{e:?}");
}

#[test]
fn bad_specs_and_paths_are_rejected() {
    assert!(DurableStore::open("relative/dir").is_err());
    let tmp = tempfile::tempdir().unwrap();
    let store = DurableStore::open(tmp.path().to_str().unwrap()).unwrap();
    for bad in ["a/../b", "a//b", ""] {
        let e = store.put_bytes(bad, b"x").unwrap_err();
        assert!(matches!(e, Error::InvalidPath { .. }), "{bad}: {e:?}");
    }
    for reserved in ["x.blake3", "a/.x.cascade-version", ".cascade-complete"] {
        let e = store
            .upload_checkpoint("c", vec![UploadItem::from_bytes(reserved, b"x")])
            .unwrap_err();
        assert!(e.to_string().contains("reserved"), "{reserved}: {e}");
    }
}

/// Every file below `dir`, recursively.
fn files_below(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_below(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Single puts of any size and any split into buffers come back byte for byte: those of at
/// least 64 KiB are written with O_DIRECT in whole pages (from the buffer itself where it is
/// page-aligned, else through an aligned copy), their last partial page through the page
/// cache (docs/durable-layout.md, "Durability"); a put over an existing object replaces it,
/// and no staging file stays behind. On the disk and, where there is one, on tmpfs (written
/// through the page cache).
#[test]
fn single_puts_of_any_size_and_split_round_trip() {
    let mut roots = vec![tempfile::tempdir().unwrap()];
    if std::path::Path::new("/dev/shm").is_dir() {
        roots.push(tempfile::tempdir_in("/dev/shm").unwrap());
    }
    let sizes = [
        0,
        1,
        4095,
        4096,
        65_535,
        65_536,
        65_537,
        (4 << 20) + 3000,
        (17 << 20) + 1,
    ];
    for tmp in &roots {
        let root = tmp.path().join("d");
        let store = DurableStore::open(root.to_str().unwrap()).unwrap();
        for (n, &size) in sizes.iter().enumerate() {
            let data = cascade_testkit::pattern(size, n as u64 + 1);
            // Buffers split at offsets that are not page multiples, and an empty one.
            let first = size.min(1000);
            let cuts = [0, first, first, size.saturating_sub(7).max(first), size];
            let parts: Vec<bytes::Bytes> = cuts
                .windows(2)
                .map(|w| bytes::Bytes::copy_from_slice(&data[w[0]..w[1]]))
                .collect();
            // The same bytes in one page-aligned buffer (as packs are), written without a copy.
            let mut padded = vec![0u8; size + 4096];
            let pad = padded.as_ptr().align_offset(4096);
            padded[pad..pad + size].copy_from_slice(&data);
            let aligned = bytes::Bytes::from(padded).slice(pad..pad + size);
            for (variant, parts) in [("split", parts), ("aligned", vec![aligned])] {
                let key = format!("packs/{n:02}/{variant}");
                // Something else first, which the put replaces.
                store.put_bytes(&key, b"older and different").unwrap();
                store.put_buffers(&key, parts).unwrap();
                let back = std::fs::read(root.join(&key)).unwrap();
                assert!(
                    back == data,
                    "{size} bytes, {variant}, in {}",
                    root.display()
                );
                assert_eq!(store.size(&key).unwrap(), size as u64);
            }
        }
        let stray: Vec<_> = files_below(&root)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains('#'))
            .collect();
        assert!(stray.is_empty(), "{stray:?}");
    }
}
