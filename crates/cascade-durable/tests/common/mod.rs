//! Checks shared by the directory and the S3 tests. Both backends keep objects as plain
//! files on disk (the directory itself; versitygw's posix backend under root/bucket/prefix),
//! so the tests look at the files directly, as a user without Cascade would.
#![allow(dead_code)]

use std::path::Path;

use cascade_durable::{DurableStore, Error, UploadItem, MARKER_NAME};
use cascade_testkit::{b3, pattern};

/// The files of the test checkpoint: a small one, an empty one, one in a subdirectory and one
/// of more than two 8 MiB parts (multipart).
pub fn checkpoint_files() -> Vec<(String, Vec<u8>)> {
    vec![
        ("rank0.dat".to_string(), pattern(100_000, 1)),
        ("empty.dat".to_string(), Vec::new()),
        (
            "sub/rank1.dat".to_string(),
            pattern(3 * 1024 * 1024 + 17, 2),
        ),
        (
            "big.dat".to_string(),
            pattern(2 * 8 * 1024 * 1024 + 4321, 3),
        ),
    ]
}

/// Uploads a checkpoint step by step and checks the layout on disk under `disk_root`.
pub fn checkpoint_round_trip(store: &DurableStore, disk_root: &Path) {
    let ckpt = "ckpt.0001";
    let files = checkpoint_files();
    let items: Vec<UploadItem> = files
        .iter()
        .map(|(rel, d)| UploadItem::from_bytes(rel.clone(), d))
        .collect();

    // Data first: all objects present, no checksums, no marker, not complete.
    let entries = store.upload_checkpoint_data(ckpt, items).unwrap();
    assert!(!store.is_complete(ckpt).unwrap());
    for (rel, d) in &files {
        let on_disk = std::fs::read(disk_root.join(ckpt).join(rel)).unwrap();
        assert!(on_disk == *d, "{rel}: bytes on disk differ");
        assert!(!disk_root.join(ckpt).join(format!("{rel}.blake3")).exists());
    }
    // Then checksums: still not complete.
    store.write_checksums(ckpt, &entries).unwrap();
    assert!(!store.is_complete(ckpt).unwrap());
    assert!(!disk_root.join(ckpt).join(MARKER_NAME).exists());
    for (rel, d) in &files {
        let text =
            std::fs::read_to_string(disk_root.join(ckpt).join(format!("{rel}.blake3"))).unwrap();
        let base = rel.rsplit('/').next().unwrap();
        assert_eq!(text, format!("{}  {}\n", b3(d), base));
    }
    // Then the marker, last.
    let marker = store.write_marker(ckpt, entries).unwrap();
    assert!(store.is_complete(ckpt).unwrap());
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(disk_root.join(ckpt).join(MARKER_NAME)).unwrap())
            .unwrap();
    assert_eq!(on_disk["format"], "cascade-complete/1");
    assert_eq!(on_disk["checkpoint"], ckpt);
    let listed = on_disk["files"].as_array().unwrap();
    assert_eq!(listed.len(), files.len());
    for ((rel, d), f) in files.iter().zip(listed) {
        assert_eq!(f["path"], rel.as_str());
        assert_eq!(f["size"], d.len() as u64);
        assert_eq!(f["blake3"], b3(d).as_str());
    }
    assert_eq!(
        marker.total_bytes,
        files.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
    assert_eq!(store.read_marker(ckpt).unwrap().unwrap(), marker);
    store.verify_checkpoint(ckpt).unwrap();

    // Listing, ranges, sizes, downloads.
    let listing = store.list(ckpt).unwrap();
    let names: Vec<&str> = listing.iter().map(|o| o.path.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "ckpt.0001/.big.dat.cascade-version",
            "ckpt.0001/.cascade-complete",
            "ckpt.0001/.empty.dat.cascade-version",
            "ckpt.0001/.rank0.dat.cascade-version",
            "ckpt.0001/big.dat",
            "ckpt.0001/big.dat.blake3",
            "ckpt.0001/empty.dat",
            "ckpt.0001/empty.dat.blake3",
            "ckpt.0001/rank0.dat",
            "ckpt.0001/rank0.dat.blake3",
            "ckpt.0001/sub/.rank1.dat.cascade-version",
            "ckpt.0001/sub/rank1.dat",
            "ckpt.0001/sub/rank1.dat.blake3",
        ]
    );
    // Version objects: written before the data, newer stamps replace older ones.
    let stamp = store.recorded_version("ckpt.0001/big.dat").unwrap();
    assert!(stamp.is_some_and(|s| s > 0), "{stamp:?}");
    assert_eq!(store.recorded_version("ckpt.0001/none.dat").unwrap(), None);
    store.put_version("ckpt.0001/sub/x", 42).unwrap();
    assert_eq!(store.recorded_version("ckpt.0001/sub/x").unwrap(), Some(42));
    store.delete("ckpt.0001/sub/.x.cascade-version").unwrap();
    let big = &files[3].1;
    assert_eq!(store.size("ckpt.0001/big.dat").unwrap(), big.len() as u64);
    let r = store
        .get_range(
            "ckpt.0001/big.dat",
            8 * 1024 * 1024 - 10..8 * 1024 * 1024 + 10,
        )
        .unwrap();
    assert_eq!(&r[..], &big[8 * 1024 * 1024 - 10..8 * 1024 * 1024 + 10]);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("big.restored");
    let digest = store.download_file("/ckpt.0001/big.dat", &dest).unwrap();
    assert_eq!(digest.blake3, b3(big));
    assert!(std::fs::read(&dest).unwrap() == *big);
    let mut buf = Vec::new();
    store.download_to("ckpt.0001/empty.dat", &mut buf).unwrap();
    assert!(buf.is_empty());

    // Missing paths are ENOENT, for data and for checksums.
    let e = store.get_bytes("ckpt.0001/nope.dat").unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.errno(), libc_enoent());
    assert!(!store.is_complete("ckpt.9999").unwrap());

    // Corrupt one byte of the big object on disk: verify and download fail with EIO naming
    // the file, and the download leaves nothing at the destination.
    let victim = disk_root.join(ckpt).join("big.dat");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[12_345_678] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    let e = store.verify_file("ckpt.0001/big.dat").unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
    assert_eq!(e.errno(), 5); // EIO
    let msg = e.to_string();
    assert!(
        msg.contains("ckpt.0001/big.dat") && msg.contains("corrupt"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    let dest2 = tmp.path().join("big.corrupt");
    assert!(store.download_file("ckpt.0001/big.dat", &dest2).is_err());
    assert!(!dest2.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    assert!(store.verify_checkpoint(ckpt).is_err());
    // The other files still verify.
    store.verify_file("ckpt.0001/sub/rank1.dat").unwrap();

    // A missing checksum object is a clear EIO too.
    std::fs::remove_file(disk_root.join(ckpt).join("rank0.dat.blake3")).unwrap();
    let e = store.verify_file("ckpt.0001/rank0.dat").unwrap_err();
    assert!(e.to_string().contains("no checksum object"), "{e}");
}

/// A re-upload that fails midway leaves the checkpoint not complete (the old marker is
/// removed before any data is replaced) and a later full upload completes it.
pub fn failed_reupload_is_not_complete(store: &DurableStore) {
    let ckpt = "ckpt.0002";
    let a = pattern(50_000, 7);
    store
        .upload_checkpoint(ckpt, vec![UploadItem::from_bytes("a.dat", &a)])
        .unwrap();
    assert!(store.is_complete(ckpt).unwrap());

    let b = pattern(9 * 1024 * 1024, 8);
    // Announce more bytes than the source has: the multipart upload is aborted.
    let short = UploadItem {
        rel: "b.dat".to_string(),
        len: b.len() as u64 + 1000,
        reader: Box::new(&b[..]),
    };
    let e = store
        .upload_checkpoint(ckpt, vec![UploadItem::from_bytes("a.dat", &a), short])
        .unwrap_err();
    assert!(e.to_string().contains("source ended"), "{e}");
    assert!(!store.is_complete(ckpt).unwrap());
    assert!(store
        .get_bytes("ckpt.0002/b.dat")
        .unwrap_err()
        .is_not_found());

    let m = store
        .upload_checkpoint(
            ckpt,
            vec![
                UploadItem::from_bytes("a.dat", &a),
                UploadItem::from_bytes("b.dat", &b),
            ],
        )
        .unwrap();
    assert_eq!(m.files.len(), 2);
    store.verify_checkpoint(ckpt).unwrap();
}

/// Checksum objects read many at a time (more than are in flight at once) come back in the
/// order asked, each the one of its key: recorded, absent, or malformed.
pub fn checksums_read_together(store: &DurableStore) {
    let mut keys = Vec::new();
    let mut expected = Vec::new();
    for i in 0..(3 * cascade_durable::CHECKSUM_READS_IN_FLIGHT + 5) {
        let key = format!("many/f{i:03}.bin");
        match i % 3 {
            0 => {
                let digest = store.put_bytes(&key, &pattern(100 + i, i as u64)).unwrap();
                store.put_checksum(&key, &digest).unwrap();
                expected.push(Some(digest.blake3));
            }
            1 => {
                store.put_bytes(&key, b"no checksum object").unwrap();
                expected.push(None);
            }
            _ => {
                store.put_bytes(&key, b"data").unwrap();
                store
                    .put_bytes(&format!("{key}.blake3"), b"not a checksum")
                    .unwrap();
                expected.push(None);
            }
        }
        keys.push(key);
    }
    // Asked in reverse order: the answers follow the question, not the writes.
    keys.reverse();
    expected.reverse();
    let rels: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = store.recorded_checksums(&rels);
    assert_eq!(got.len(), keys.len());
    for ((key, want), got) in keys.iter().zip(&expected).zip(got) {
        match (want, got) {
            (Some(sum), Ok(read)) => assert_eq!(&read, sum, "{key}"),
            (None, Err(e @ Error::BadChecksum { .. })) => {
                assert!(e.to_string().contains(key.as_str()), "{key}: {e}")
            }
            (want, got) => panic!("{key}: expected {want:?}, read {got:?}"),
        }
    }
}

fn libc_enoent() -> i32 {
    2
}
