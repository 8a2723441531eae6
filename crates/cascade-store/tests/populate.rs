//! An attaching process maps the block's pages into its page tables only once it touches file
//! data: a process that only looks at the namespace (`cascade wait` beside the agent) must not
//! spend CPU mapping the whole block in. Its own test binary, so that no other test's stores
//! change this process's resident shared memory meanwhile.

use cascade_store::{OpenOptions, Prefault, Store, StoreConfig};

const MIB: u64 = 1 << 20;

/// Shared memory mapped into this process's page tables, in bytes (both mappings of a page
/// count: the creator's and the attacher's).
fn rss_shmem() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("RssShmem:"))
        .expect("RssShmem line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("RssShmem in kB");
    kib * 1024
}

#[test]
fn an_attacher_maps_the_block_in_only_once_it_touches_file_data() {
    let name = format!("/cascade-populate-{}", std::process::id());
    let _ = Store::destroy(&name);
    let cfg = StoreConfig {
        name: name.clone(),
        capacity: 128 * MIB,
        chunk_size: MIB,
        max_files: 64,
        spill: None,
        prefault: Prefault::Foreground,
    };
    let creator = Store::create(&cfg).expect("create");
    let opts = OpenOptions::new().read(true).write(true).create(true);
    let f = creator.open("/f", &opts).expect("open");
    f.write_all_at(b"checkpoint", 0).expect("write");
    drop(f);

    let attached = Store::attach(&name).expect("attach");
    let before = rss_shmem();
    // Looking at the namespace, as `cascade wait` does.
    let tree = attached.life_tree("/").expect("life_tree");
    assert_eq!(tree.len(), 2);
    let _ = attached.status();
    attached.wait_prefault();
    let looked = rss_shmem();
    assert!(
        looked < before + 16 * MIB,
        "looking mapped {} MiB in",
        (looked - before) / MIB
    );

    // Reading file data starts the populate thread; joined, the whole block is mapped.
    let f = attached
        .open("/f", &OpenOptions::new().read(true))
        .expect("open for reading");
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, 0).expect("read"), 10);
    assert_eq!(&buf, b"checkpoint");
    attached.wait_prefault();
    let read = rss_shmem();
    assert!(
        read >= looked + 112 * MIB,
        "reading mapped only {} MiB in",
        (read - looked) / MIB
    );
    drop(f);
    drop(attached);
    drop(creator);
    Store::destroy(&name).expect("destroy");
}
