//! (f) Bad parameters and foreign blocks: clear errors, and nothing touched.

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use cascade_store::{Error, Store, StoreConfig};
use common::*;

fn create_err(cfg: &StoreConfig) -> Error {
    let _guard = DestroyOnDrop(cfg.name.clone());
    let err = Store::create(cfg).err().expect("create must fail");
    assert!(
        !Store::exists(&cfg.name),
        "a failed create left the object {} behind",
        cfg.name
    );
    err
}

fn assert_einval_mentions(err: &Error, words: &[&str]) {
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    let text = err.to_string().to_lowercase();
    assert!(
        words.iter().any(|w| text.contains(w)),
        "the message `{err}` names none of {words:?}"
    );
}

#[test]
fn invalid_creation_parameters_are_einval_with_a_clear_message() {
    let base = |p: Params| config(&unique_name("bad"), &p);
    for chunk_size in [0, 1000, 3000, 2048, 4097, 12288, 128 << 20] {
        let err = create_err(&base(Params {
            chunk_size,
            ..Params::default()
        }));
        assert_einval_mentions(&err, &["chunk"]);
    }
    for capacity in [0, 4095] {
        let err = create_err(&base(Params {
            capacity,
            ..Params::default()
        }));
        assert_einval_mentions(&err, &["capacity"]);
    }
    for max_files in [0, 1, (1 << 24) + 1] {
        let err = create_err(&base(Params {
            max_files,
            ..Params::default()
        }));
        assert_einval_mentions(&err, &["max_files", "max files", "files"]);
    }
}

#[test]
fn existing_and_missing_stores() {
    let ts = TestStore::create("exists", Params::default());
    let err = Store::create(&config(&ts.name, &Params::default()))
        .err()
        .unwrap();
    assert_eq!(err.errno(), libc::EEXIST, "{err}");

    let missing = unique_name("missing");
    let err = Store::attach(&missing).err().unwrap();
    assert_eq!(err.errno(), libc::ENOENT, "{err}");
    assert!(err.to_string().contains(&missing), "{err}");
    assert_eq!(Store::destroy(&missing).unwrap_err().errno(), libc::ENOENT);

    // attach_or_create with other parameters than the store has: EINVAL, store unchanged.
    let f = ts
        .store
        .open(
            "/keep",
            &cascade_store::OpenOptions::new().write(true).create(true),
        )
        .unwrap();
    f.write_all_at(b"keep me", 0).unwrap();
    let other = config(
        &ts.name,
        &Params {
            chunk_size: 65536,
            ..Params::default()
        },
    );
    let err = Store::attach_or_create(&other).err().unwrap();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert_eq!(read_all(&ts.store, "/keep"), b"keep me");
    let same = Store::attach_or_create(&config(&ts.name, &Params::default())).unwrap();
    assert_eq!(read_all(&same, "/keep"), b"keep me");
}

fn shm_file(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name.trim_start_matches('/'))
}

/// Attaching from another process must fail with exit code 1 and a message naming `word`.
fn child_attach_fails(name: &str, word: &str) {
    let out = torture(name, &["check"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains(word), "{}", describe(&out));
}

#[test]
fn a_different_format_version_is_refused_and_left_untouched() {
    let guard = create_detached("version", Params::default());
    {
        let s = Store::attach(&guard.0).unwrap();
        s.mkdir("/data", 0o755).unwrap();
    }
    let path = shm_file(&guard.0);
    let original = std::fs::read(&path).unwrap();
    // docs/store-layout.md: the header's version is the u32 at offset 8.
    let version = u32::from_ne_bytes(original[8..12].try_into().unwrap());
    assert_eq!(version, 8);
    let mut changed = original.clone();
    changed[8..12].copy_from_slice(&(version + 1).to_ne_bytes());
    std::fs::write(&path, &changed).unwrap();

    let err = Store::attach(&guard.0).err().expect("attach must refuse");
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(err.to_string().contains("version"), "{err}");
    let err = Store::attach_or_create(&config(&guard.0, &Params::default()))
        .err()
        .expect("attach_or_create must refuse");
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    child_attach_fails(&guard.0, "version");
    assert!(
        std::fs::read(&path).unwrap() == changed,
        "a refused attach modified the block"
    );

    // Put the version back: the store and its data are fine.
    std::fs::write(&path, &original).unwrap();
    let s = Store::attach(&guard.0).unwrap();
    assert!(s.stat("/data").unwrap().is_dir());
    let report = s.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
}

#[test]
fn foreign_and_truncated_objects_are_refused_without_crashing() {
    let guard = create_detached("foreign", Params::default());
    let path = shm_file(&guard.0);
    let original = std::fs::read(&path).unwrap();

    // Not a Cascade block at all.
    let mut garbage = original.clone();
    garbage[..8].copy_from_slice(b"NOTCASC\0");
    std::fs::write(&path, &garbage).unwrap();
    let err = Store::attach(&guard.0).err().unwrap();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(std::fs::read(&path).unwrap() == garbage);

    // A block cut short (only the header left): refused, in a child so that a SIGBUS would
    // show up as a failure of this test rather than kill it.
    std::fs::write(&path, &original[..4096]).unwrap();
    child_attach_fails(&guard.0, "store");
    let err = Store::attach(&guard.0).err().unwrap();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");

    // An empty object (a creator that died before sizing it).
    std::fs::write(&path, b"").unwrap();
    child_attach_fails(&guard.0, "store");
    let err = Store::attach(&guard.0).err().unwrap();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");

    // Put the block back so the guard can destroy it in this process.
    std::fs::write(&path, &original).unwrap();
    Store::attach(&guard.0).unwrap();
}

/// `destroy` is how users get rid of a damaged store, so it must work on any object:
/// one cut short, or an empty one left by a creator that died before sizing it. Run in a
/// child process, where a crash shows up as a failed exit.
#[test]
fn destroy_removes_damaged_objects() {
    for keep in [4096usize, 100, 0] {
        let guard = create_detached("destroy", Params::default());
        let path = shm_file(&guard.0);
        let original = std::fs::read(&path).unwrap();
        std::fs::write(&path, &original[..keep]).unwrap();
        let out = torture(&guard.0, &["destroy"]).output().unwrap();
        if !out.status.success() {
            // Leave nothing behind for the guard to trip over.
            let _ = std::fs::remove_file(&path);
        }
        assert!(
            out.status.success(),
            "destroying a store cut to {keep} bytes failed: {}",
            describe(&out)
        );
        assert!(!path.exists(), "{} is still there", path.display());
    }
}
