//! The agent drains to and restores from S3 against a real versitygw server (posix backend) started on 127.0.0.1.
//! scripts/test.sh installs versitygw; the test finds it through $VERSITYGW, $PATH, $GOBIN,
//! $(go env GOPATH)/bin or ~/go/bin.

use cascade_agent::{drain_checkpoint, restore_checkpoint, restore_into_store};
use cascade_durable::DurableStore;
use cascade_store::{OpenOptions, Prefault, SpillConfig, Store, StoreConfig};

use cascade_testkit::versitygw::SECRET;
use cascade_testkit::{pattern, Versitygw};

#[test]
fn drain_to_s3_and_restore_from_it() {
    let server = Versitygw::start();
    server.create_bucket("cascade");
    let durable = DurableStore::open(&server.spec("cascade/job1", SECRET)).unwrap();

    // 1 MiB of memory, 32 MiB of spill: the 9 MiB file is mostly spilled and multipart.
    const CHUNK: u64 = 64 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("/cascade-agent-s3-{}", std::process::id());
    let store = Store::create(&StoreConfig {
        name: name.clone(),
        capacity: 16 * CHUNK,
        chunk_size: CHUNK,
        max_files: 64,
        spill: Some(SpillConfig {
            path: tmp.path().join("spill"),
            size: 512 * CHUNK,
        }),
        prefault: Prefault::Off,
    })
    .unwrap();
    struct Destroy(String);
    impl Drop for Destroy {
        fn drop(&mut self) {
            let _ = Store::destroy_forced(&self.0);
        }
    }
    let _destroy = Destroy(name);

    let files = vec![
        ("a.dat".to_string(), pattern(200_000, 1)),
        ("sub/big.dat".to_string(), pattern(9 * 1024 * 1024 + 77, 2)),
    ];
    store.create_dir_all("/ckpt.0007/sub", 0o755).unwrap();
    for (rel, data) in &files {
        let f = store
            .open(
                &format!("/ckpt.0007/{rel}"),
                &OpenOptions::new().write(true).create(true),
            )
            .unwrap();
        f.write_all_at(data, 0).unwrap();
    }
    let report = drain_checkpoint(&store, "/ckpt.0007", &durable, &|_| {}).unwrap();
    assert_eq!(report.files.len(), 2);
    let disk_root = server.root.join("cascade/job1/ckpt.0007");
    for (rel, data) in &files {
        assert!(
            std::fs::read(disk_root.join(rel)).unwrap() == *data,
            "{rel}"
        );
    }
    assert!(disk_root.join(".cascade-complete").exists());
    durable.verify_checkpoint("ckpt.0007").unwrap();

    let dest = tmp.path().join("restored");
    restore_checkpoint(&durable, None, "ckpt.0007", &dest, &|_| {}).unwrap();
    for (rel, data) in &files {
        assert!(std::fs::read(dest.join(rel)).unwrap() == *data, "{rel}");
    }
    store.unlink("/ckpt.0007/sub/big.dat").unwrap();
    restore_into_store(&durable, None, "ckpt.0007", &store, "/back", &|_| {}).unwrap();
    let f = store
        .open("/back/sub/big.dat", &OpenOptions::new().read(true))
        .unwrap();
    let mut got = vec![0u8; files[1].1.len()];
    let mut off = 0;
    while off < got.len() {
        off += f.read_at(&mut got[off..], off as u64).unwrap();
    }
    assert!(got == files[1].1);

    // Incomplete on S3 too.
    durable.delete("ckpt.0007/.cascade-complete").unwrap();
    let e = restore_checkpoint(&durable, None, "ckpt.0007", &tmp.path().join("x"), &|_| {})
        .unwrap_err();
    assert!(e.to_string().contains("not complete"), "{e}");
}

/// An agent draining to S3 (keys of at most 1024 bytes, its prefix included) makes the store
/// refuse longer paths when they are created, with one line, not when they are drained.
#[test]
fn paths_longer_than_s3_keys_are_refused_when_created() {
    let server = Versitygw::start();
    server.create_bucket("cascade");
    let prefix = "job-with-a-prefix";
    let durable = DurableStore::open(&server.spec(&format!("cascade/{prefix}"), SECRET)).unwrap();
    assert_eq!(durable.max_key_len(), Some(1024 - prefix.len() - 1));
    let name = format!("/cascade-agent-s3-keys-{}", std::process::id());
    let store = Store::create(&StoreConfig {
        name: name.clone(),
        capacity: 16 << 16,
        chunk_size: 1 << 16,
        max_files: 64,
        spill: None,
        prefault: Prefault::Off,
    })
    .unwrap();
    struct Destroy(String);
    impl Drop for Destroy {
        fn drop(&mut self) {
            let _ = Store::destroy_forced(&self.0);
        }
    }
    let _destroy = Destroy(name);
    let _agent = cascade_agent::Agent::start(
        store.clone(),
        durable,
        cascade_agent::AgentOptions::default(),
    )
    .unwrap();
    let limit = 1024 - prefix.len() - 1 + 1 - cascade_store::PATH_SUFFIX_ROOM;
    let mut dir = String::new();
    while dir.len() + 201 < limit {
        dir = format!("{dir}/{}", "d".repeat(200));
        store.create_dir_all(&dir, 0o755).unwrap();
    }
    let fits = format!("{dir}/{}", "f".repeat(limit - dir.len() - 1));
    let create = OpenOptions::new().write(true).create(true);
    store.open(&fits, &create).unwrap();
    let Err(err) = store.open(&format!("{fits}x"), &create) else {
        panic!("a path S3 cannot take was created");
    };
    assert_eq!(err.errno(), libc::ENAMETOOLONG, "{err}");
    assert!(
        err.to_string().contains("S3 keys are at most 1024 bytes"),
        "{err}"
    );
}
