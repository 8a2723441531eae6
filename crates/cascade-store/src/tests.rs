//! Unit tests of the allocator, the chunk maps and the namespace, on real blocks in /dev/shm.

use crate::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, Ordering::Relaxed};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A store that is destroyed when the test ends, pass or fail.
struct TestStore {
    store: Option<Store>,
    name: String,
    _dir: Option<std::path::PathBuf>,
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
        if let Some(d) = &self._dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn cfg(capacity: u64, chunk: u64, spill: u64) -> (StoreConfig, Option<std::path::PathBuf>) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!("/cascade-unit-{}-{n}", std::process::id());
    let dir = (spill > 0).then(|| {
        let d = std::env::temp_dir().join(format!("cascade-unit-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).expect("tempdir");
        d
    });
    let cfg = StoreConfig {
        name,
        capacity,
        chunk_size: chunk,
        max_files: 64,
        spill: dir.as_ref().map(|d| SpillConfig {
            path: d.join("spill"),
            size: spill,
        }),
        prefault: Prefault::Off,
    };
    (cfg, dir)
}

fn store(capacity: u64, chunk: u64, spill: u64) -> TestStore {
    let (cfg, dir) = cfg(capacity, chunk, spill);
    TestStore {
        store: Some(Store::create(&cfg).expect("create")),
        name: cfg.name,
        _dir: dir,
    }
}

fn rw() -> OpenOptions {
    OpenOptions::new().read(true).write(true).create(true)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn read_all(f: &File) -> Vec<u8> {
    let mut v = vec![0; f.len().expect("len") as usize];
    assert_eq!(f.read_at(&mut v, 0).expect("read"), v.len());
    v
}

fn assert_clean(s: &Store) {
    let r = s.fsck(false).expect("fsck");
    assert!(r.errors.is_empty() && r.warnings.is_empty(), "fsck: {r:?}");
}

#[test]
fn write_read_across_chunks_and_overwrite() {
    let s = store(1 << 20, 4096, 0);
    let f = s.open("/a", &rw()).unwrap();
    let data = pattern(7, 3 * 4096 + 100);
    f.write_all_at(&data, 0).unwrap();
    assert_eq!(read_all(&f), data);
    f.write_all_at(&[0xAA; 5000], 4000).unwrap();
    let mut want = data.clone();
    want[4000..9000].fill(0xAA);
    assert_eq!(read_all(&f), want);
    assert_eq!(s.stat("/a").unwrap().chunks_in_memory, 4);
    assert_clean(&s);
}

#[test]
fn sparse_holes_and_extension_read_zeros() {
    let s = store(1 << 20, 4096, 0);
    let f = s.open("/sparse", &rw()).unwrap();
    f.write_all_at(b"end", 10 * 4096 + 5).unwrap();
    let v = read_all(&f);
    assert_eq!(v.len(), 10 * 4096 + 8);
    assert!(v[..10 * 4096 + 5].iter().all(|&b| b == 0));
    assert_eq!(&v[10 * 4096 + 5..], b"end");
    assert_eq!(s.stat("/sparse").unwrap().chunks_in_memory, 1);
    // Stale bytes in a reused chunk must never show through.
    let g = s.open("/dirty", &rw()).unwrap();
    g.write_all_at(&[0xFF; 4096 * 4], 0).unwrap();
    drop(g);
    s.unlink("/dirty").unwrap();
    let h = s.open("/fresh", &rw()).unwrap();
    h.write_all_at(b"x", 100).unwrap();
    h.write_all_at(b"y", 3 * 4096 + 7).unwrap();
    let v = read_all(&h);
    assert!(v
        .iter()
        .enumerate()
        .all(|(i, &b)| b == 0 || i == 100 || i == 3 * 4096 + 7));
    // Shrink then extend: the cut-off tail reads as zeros.
    h.set_len(50).unwrap();
    h.set_len(8192).unwrap();
    assert!(read_all(&h).iter().all(|&b| b == 0));
    assert_clean(&s);
}

#[test]
fn truncate_frees_chunks_at_once() {
    let s = store(64 * 4096, 4096, 0);
    let f = s.open("/t", &rw()).unwrap();
    f.write_all_at(&pattern(1, 40 * 4096), 0).unwrap();
    let used = s.status().memory_used;
    f.set_len(4096 + 1).unwrap();
    assert_eq!(s.stat("/t").unwrap().chunks_in_memory, 2);
    assert_eq!(s.status().memory_used, used - 38 * 4096);
    assert_eq!(read_all(&f), pattern(1, 4097));
    f.set_len(0).unwrap();
    assert_eq!(s.status().memory_used, 0);
    assert_clean(&s);
}

#[test]
fn full_store_gives_enospc_and_keeps_data() {
    let s = store(16 * 4096, 4096, 0);
    let keep = s.open("/keep", &rw()).unwrap();
    keep.write_all_at(&pattern(3, 4 * 4096), 0).unwrap();
    let f = s.open("/big", &rw()).unwrap();
    let data = pattern(9, 20 * 4096);
    let n = f.write_at(&data, 0).unwrap();
    assert_eq!(n, 12 * 4096, "short write up to the last free chunk");
    let e = f.write_at(&data[n..], n as u64).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    assert_eq!(read_all(&f), data[..n]);
    assert_eq!(read_all(&keep), pattern(3, 4 * 4096));
    let why = s.status().last_enospc.expect("enospc recorded");
    assert!(why.reason.contains("no spill"), "{why:?}");
    s.unlink("/big").unwrap();
    f.write_at(b"x", 0)
        .expect_err("handle to removed file is stale");
    s.open("/again", &rw())
        .unwrap()
        .write_all_at(&data[..12 * 4096], 0)
        .unwrap();
    assert_clean(&s);
}

#[test]
fn spill_used_only_when_memory_runs_out() {
    let s = store(8 * 4096, 4096, 16 * 4096);
    let f = s.open("/s", &rw()).unwrap();
    let data = pattern(5, 20 * 4096 + 17);
    f.write_all_at(&data, 0).unwrap();
    f.sync().unwrap();
    let st = s.stat("/s").unwrap();
    assert_eq!(st.chunks_in_memory, 8);
    assert_eq!(st.chunks_spilled, 13);
    assert_eq!(read_all(&f), data);
    let spilled: Vec<_> = f
        .chunk_list()
        .unwrap()
        .into_iter()
        .filter(|c| matches!(c.location, ChunkLocation::Spill { .. }))
        .collect();
    assert_eq!(spilled.len(), 13);
    assert_eq!(spilled.last().unwrap().length, 17);
    assert_eq!(s.status().spill_used, 13 * 4096);
    assert_eq!(
        f.write_at(&pattern(1, 4 * 4096), 21 * 4096).unwrap(),
        3 * 4096
    );
    let e = f.write_at(&pattern(1, 4096), 24 * 4096).unwrap_err();
    assert!(e.to_string().contains("spill"), "{e}");
    assert_clean(&s);
}

#[test]
fn namespace_directories_rename_and_errors() {
    let s = store(1 << 20, 4096, 0);
    s.create_dir_all("/ckpt.1/rank", 0o755).unwrap();
    s.open("/ckpt.1/rank/0", &rw())
        .unwrap()
        .write_all_at(b"zero", 0)
        .unwrap();
    s.open("/ckpt.1/meta", &rw()).unwrap();
    let names: Vec<_> = s
        .read_dir("/ckpt.1")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["meta", "rank"]);
    assert_eq!(s.mkdir("/ckpt.1", 0o755).unwrap_err().errno(), libc::EEXIST);
    assert_eq!(s.rmdir("/ckpt.1").unwrap_err().errno(), libc::ENOTEMPTY);
    assert_eq!(s.unlink("/ckpt.1").unwrap_err().errno(), libc::EISDIR);
    assert_eq!(s.rmdir("/ckpt.1/meta").unwrap_err().errno(), libc::ENOTDIR);
    assert_eq!(s.stat("/ckpt.1/meta/x").unwrap_err().errno(), libc::ENOTDIR);
    assert_eq!(s.stat("/nope").unwrap_err().errno(), libc::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(
        s.mkdir(&long, 0o755).unwrap_err().errno(),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        s.rename("/ckpt.1", "/ckpt.1/rank/inside")
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    // Directory rename moves the whole subtree at once.
    s.rename("/ckpt.1", "/ckpt.2").unwrap();
    let f = s.open("/ckpt.2/rank/0", &OpenOptions::new()).unwrap();
    assert_eq!(read_all(&f), b"zero");
    // Rename over an existing file replaces it and frees its data.
    s.open("/tmp", &rw())
        .unwrap()
        .write_all_at(&[1; 9000], 0)
        .unwrap();
    s.rename("/tmp", "/ckpt.2/rank/0").unwrap();
    assert_eq!(
        read_all(&s.open("/ckpt.2/rank/0", &OpenOptions::new()).unwrap()),
        vec![1; 9000]
    );
    assert_eq!(f.read_at(&mut [0; 4], 0).unwrap_err().errno(), libc::ESTALE);
    assert_eq!(
        s.rename("/ckpt.2/meta", "/ckpt.2/rank")
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
    assert_eq!(
        s.open("/ckpt.2/meta", &rw().create_new(true))
            .err()
            .map(|e| e.errno()),
        Some(libc::EEXIST)
    );
    s.unlink("/ckpt.2/rank/0").unwrap();
    s.rmdir("/ckpt.2/rank").unwrap();
    assert_eq!(s.status().memory_used, 0);
    assert_clean(&s);
}

#[test]
fn file_table_limit_is_an_error_not_corruption() {
    let s = store(1 << 20, 4096, 0);
    let mut made = 0;
    let err = loop {
        match s.open(&format!("/f{made}"), &rw()) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(made, 63, "64 inodes including the root");
    assert_eq!(err.errno(), libc::ENOSPC);
    s.unlink("/f0").unwrap();
    s.open("/again", &rw()).unwrap();
    assert_clean(&s);
}

#[test]
fn attributes_are_stored() {
    let s = store(1 << 20, 4096, 0);
    s.open("/a", &rw().mode(0o600)).unwrap();
    assert_eq!(s.stat("/a").unwrap().mode, 0o600);
    s.set_mode("/a", 0o640).unwrap();
    s.set_times("/a", Some(1_000), Some(2_000)).unwrap();
    s.set_owner("/a", Some(1234), None).unwrap();
    let m = s.stat("/a").unwrap();
    assert_eq!(
        (m.mode, m.atime, m.mtime, m.uid),
        (0o640, 1_000, 2_000, 1234)
    );
}

#[test]
fn many_chunks_need_a_deeper_map() {
    let s = store(5000 * 4096, 4096, 0);
    let f = s.open("/deep", &rw()).unwrap();
    let data = pattern(11, 4500 * 4096);
    f.write_all_at(&data, 0).unwrap();
    assert_eq!(read_all(&f), data);
    f.set_len(70 * 4096).unwrap();
    assert_eq!(read_all(&f), data[..70 * 4096]);
    assert_clean(&s);
}

#[test]
fn bad_parameters_are_refused() {
    let (mut c, _) = cfg(1 << 20, 3000, 0);
    assert_eq!(
        Store::create(&c).err().map(|e| e.errno()),
        Some(libc::EINVAL)
    );
    c.chunk_size = 4096;
    c.capacity = 100;
    assert_eq!(
        Store::create(&c).err().map(|e| e.errno()),
        Some(libc::EINVAL)
    );
    c.capacity = 1 << 20;
    c.max_files = 1;
    assert_eq!(
        Store::create(&c).err().map(|e| e.errno()),
        Some(libc::EINVAL)
    );
    c.name = "no-slash".into();
    assert_eq!(
        Store::create(&c).err().map(|e| e.errno()),
        Some(libc::EINVAL)
    );
    assert_eq!(
        Store::attach("/cascade-unit-missing")
            .err()
            .map(|e| e.errno()),
        Some(libc::ENOENT)
    );
}

#[test]
fn attach_sees_the_same_data_and_mismatched_params_are_refused() {
    let s = store(1 << 20, 4096, 0);
    s.open("/x", &rw())
        .unwrap()
        .write_all_at(b"hello", 0)
        .unwrap();
    let other = Store::attach(s.name()).unwrap();
    assert_eq!(
        read_all(&other.open("/x", &OpenOptions::new()).unwrap()),
        b"hello"
    );
    let mut c = s.config();
    assert!(Store::attach_or_create(&c).is_ok());
    c.chunk_size = 8192;
    assert_eq!(
        Store::attach_or_create(&c).err().map(|e| e.errno()),
        Some(libc::EINVAL)
    );
}

/// docs/store-layout.md gives these offsets byte by byte; this keeps the two in step.
#[test]
fn header_and_record_offsets_match_the_docs() {
    use crate::layout::{Header, Inode, LeaseSlot};
    use std::mem::{offset_of, size_of};
    let header = [
        offset_of!(Header, magic),
        offset_of!(Header, version),
        offset_of!(Header, header_size),
        offset_of!(Header, block_size),
        offset_of!(Header, chunk_size),
        offset_of!(Header, mem_chunks),
        offset_of!(Header, spill_chunks),
        offset_of!(Header, max_inodes),
        offset_of!(Header, map_nodes),
        offset_of!(Header, lease_slots),
        offset_of!(Header, lease_batch),
        offset_of!(Header, hash_slots),
        offset_of!(Header, owner_uid),
        offset_of!(Header, created_ns),
        offset_of!(Header, off),
        offset_of!(Header, spill_path_len),
        offset_of!(Header, spill_path),
        offset_of!(Header, ns_lock),
        offset_of!(Header, alloc_lock),
        offset_of!(Header, free_mem_top),
        offset_of!(Header, free_spill_top),
        offset_of!(Header, free_node_top),
        offset_of!(Header, free_inode_top),
        offset_of!(Header, prefaulted),
        offset_of!(Header, rj_valid),
        offset_of!(Header, rj_src),
        offset_of!(Header, rj_victim),
        offset_of!(Header, lock_files),
        offset_of!(Header, rj_link),
        offset_of!(Header, enospc_time),
        offset_of!(Header, enospc_pid),
        offset_of!(Header, enospc_reason),
        offset_of!(Header, agent_wake),
        offset_of!(Header, space_wake),
        offset_of!(Header, agent_pid),
        offset_of!(Header, space_waiters),
        offset_of!(Header, agent_start_time),
        offset_of!(Header, commit_counter),
        offset_of!(Header, flush_every),
        offset_of!(Header, full_wait_ms),
        offset_of!(Header, progress_wake),
        offset_of!(Header, max_path),
        offset_of!(Header, ns_seq),
        offset_of!(Header, ns_stripes),
    ];
    assert_eq!(
        header,
        [
            0, 8, 12, 16, 24, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 168, 176, 1216, 1280, 1344,
            1348, 1352, 1356, 1360, 1368, 1372, 1376, 1380, 1384, 1392, 1400, 1404, 1408, 1412,
            1416, 1420, 1424, 1432, 1440, 1444, 1448, 1452, 1472, 1536
        ]
    );
    let inode = [
        offset_of!(Inode, lock),
        offset_of!(Inode, state),
        offset_of!(Inode, gen),
        offset_of!(Inode, link),
        offset_of!(Inode, size),
        offset_of!(Inode, map),
        offset_of!(Inode, mode),
        offset_of!(Inode, uid),
        offset_of!(Inode, gid),
        offset_of!(Inode, chunks_mem),
        offset_of!(Inode, chunks_spill),
        offset_of!(Inode, opens),
        offset_of!(Inode, atime),
        offset_of!(Inode, mtime),
        offset_of!(Inode, ctime),
        offset_of!(Inode, first_child),
        offset_of!(Inode, next_sibling),
        offset_of!(Inode, prev_sibling),
        offset_of!(Inode, trunc_seq),
        offset_of!(Inode, writers),
        offset_of!(Inode, life),
        offset_of!(Inode, mod_seq),
        offset_of!(Inode, durable_seq),
        offset_of!(Inode, commit_seq),
        offset_of!(Inode, names),
    ];
    assert_eq!(
        inode,
        [
            0, 64, 68, 72, 80, 88, 96, 100, 104, 108, 112, 116, 120, 128, 136, 144, 148, 152, 156,
            160, 164, 168, 176, 184, 192
        ]
    );
    assert_eq!(size_of::<Inode>(), 704);
    assert_eq!(
        [
            offset_of!(LeaseSlot, pid),
            offset_of!(LeaseSlot, count),
            offset_of!(LeaseSlot, start_time),
            offset_of!(LeaseSlot, ids),
            offset_of!(LeaseSlot, inode_count),
            offset_of!(LeaseSlot, inodes)
        ],
        [0, 4, 8, 16, 144, 148]
    );
    assert_eq!(size_of::<LeaseSlot>(), 192);
    assert_eq!(size_of::<Header>(), 2048);
}

/// An open racing unlink + re-create must never hand out a handle to the new occupant of
/// the inode (a directory here).
#[test]
fn open_never_binds_to_a_reused_inode() {
    let s = store(1 << 20, 4096, 0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in 0..20_000 {
                s.open("/a", &rw().create_new(true)).unwrap();
                s.unlink("/a").unwrap();
                s.mkdir("/d", 0o755).unwrap();
                s.rmdir("/d").unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        while !stop.load(Ordering::Relaxed) {
            if let Ok(f) = s.open("/a", &OpenOptions::new().read(true).write(true)) {
                if let Err(e) = f.write_at(b"x", 0) {
                    assert_eq!(e.errno(), libc::ESTALE, "{e}");
                }
            }
        }
    });
    assert_clean(&s);
}

/// Reads all of `/victim` over and over for a second, while another thread fills it with
/// `len` 1s and, once a read has met them, truncates it, then fills `/other` with 2s
/// (taking the chunks just freed) and truncates that: each round a read races the free and
/// reuse of its file's chunks, and must never return a 2.
fn race_reads_with_truncations(chunk: u64, len: usize) {
    // Room for one file's data, so the other file takes the chunks the victim frees.
    let s = store(len as u64, chunk, 0);
    let victim = s.open("/victim", &rw()).unwrap();
    let other = s.open("/other", &rw()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let reads_with_data = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let (ones, twos) = (vec![1; len], vec![2; len]);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while std::time::Instant::now() < deadline {
                victim.write_all_at(&ones, 0).unwrap();
                // Truncate only once a read has met the data, so each round races a reader
                // whose hint names a chunk about to be freed and taken by the other file.
                let seen = reads_with_data.load(Ordering::Relaxed);
                while reads_with_data.load(Ordering::Relaxed) == seen
                    && std::time::Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
                victim.set_len(0).unwrap();
                // A piece far ahead of the start first. A reader copies front to back and
                // would stay ahead of one write going the same way; this piece (after the
                // zeroing of the hole before it, which runs faster than a copy) lands while
                // a reader that began at the truncation is still on its way there.
                other
                    .write_all_at(&twos[..4096], (len / 4 * 3) as u64)
                    .unwrap();
                other.write_all_at(&twos, 0).unwrap();
                other.set_len(0).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        let mut buf = vec![0u8; len];
        let mut fast = false;
        while !stop.load(Ordering::Relaxed) {
            // Every other read tries the fast path first (`try_read_at_fast`).
            fast = !fast;
            let tried = fast.then(|| victim.try_read_at_fast(&mut buf, 0)).flatten();
            let n = match tried {
                Some(n) => n,
                None => victim.read_at(&mut buf, 0).unwrap(),
            };
            assert!(!buf[..n].contains(&2), "read another file's bytes");
            if n > 0 {
                reads_with_data.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    assert!(
        reads_with_data.into_inner() > 0,
        "no read found the file's data"
    );
    assert_clean(&s);
}

/// A lock-free read racing truncation of the same file never returns bytes of another file.
/// Reads across many chunks take the general path.
#[test]
fn read_racing_truncate_never_sees_foreign_bytes() {
    race_reads_with_truncations(4096, 64 * 4096);
}

/// The same race for reads within one chunk, which take the short path through the
/// handle's chunk hint (`read_hinted`): the hint names a chunk the truncation freed and the
/// other file took, and the read must notice. A whole 4 MiB chunk makes the copy long enough
/// for the truncation and the other file's write to land inside it.
#[test]
fn single_chunk_reads_racing_truncate_never_see_foreign_bytes() {
    race_reads_with_truncations(4 << 20, 4 << 20);
}

/// A file unlinked while an open description refers to it keeps its data until the last
/// description closes (POSIX); then its chunks and inode are freed.
#[test]
fn unlinked_open_file_lives_until_its_last_description_closes() {
    let s = store(64 * 4096, 4096, 0);
    let f = s.open("/victim", &rw()).unwrap();
    f.write_all_at(&pattern(4, 3 * 4096), 0).unwrap();
    let d = s.describe_open(&f, libc::O_RDWR).unwrap();
    s.unlink("/victim").unwrap();
    assert_eq!(s.stat("/victim").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(f.metadata().unwrap().links, 0);
    assert_eq!(read_all(&f), pattern(4, 3 * 4096));
    f.write_all_at(b"more", 3 * 4096).unwrap();
    assert!(s.fsck(false).unwrap().is_clean());
    assert_eq!(s.status().memory_used, 4 * 4096);
    // The same name can be reused meanwhile.
    s.open("/victim", &rw())
        .unwrap()
        .write_all_at(b"new", 0)
        .unwrap();
    s.release_description(d);
    assert_eq!(f.read_at(&mut [0; 4], 0).unwrap_err().errno(), libc::ESTALE);
    // The fast paths decline (the general path's ESTALE stands), changing nothing.
    assert_eq!(f.try_read_at_fast(&mut [0; 4], 0), None);
    let me = crate::LockHolder::this_thread();
    assert_eq!(f.try_write_at_fast(me, b"x", 0), None);
    assert_eq!(
        s.status().memory_used,
        4096,
        "only the new file's chunk is left"
    );
    assert_clean(&s);
}

#[test]
fn rename_fetched_records_the_level_of_the_renamed_version() {
    let s = store(1 << 20, 4096, 0);
    let level = |p: &str| {
        let e = s.life_tree(p).unwrap().remove(0);
        (e.durable(), e.staged())
    };
    for (staged_only, want) in [(false, (true, false)), (true, (false, true))] {
        let f = s.open("/.x.tmp", &rw()).unwrap();
        f.write_all_at(b"fetched", 0).unwrap();
        drop(f);
        assert_eq!(level("/.x.tmp"), (false, false));
        assert!(s.rename_fetched("/.x.tmp", "/x", staged_only).unwrap());
        assert_eq!(level("/x"), want, "staged_only {staged_only}");
    }
    // Open for writing: renamed, but no level is claimed for bytes still changing.
    let f = s.open("/.y.tmp", &rw()).unwrap();
    assert!(!s.rename_fetched("/.y.tmp", "/y", false).unwrap());
    drop(f);
    assert_eq!(level("/y"), (false, false));
    assert_eq!(
        s.rename_fetched("/.missing", "/z", false)
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
    assert_clean(&s);
}

#[test]
fn reaching_a_level_wakes_whoever_waits_for_progress() {
    use std::time::{Duration, Instant};
    let s = store(1 << 20, 4096, 0);
    let f = s.open("/f", &rw()).unwrap();
    f.write_all_at(b"data", 0).unwrap();
    drop(f);
    let e = s.life_tree("/f").unwrap().remove(0);
    let seen = s.progress_counter();
    let watcher: Store = (*s).clone();
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        watcher.wait_for_progress(seen, Duration::from_secs(60));
        started.elapsed()
    });
    assert!(s.mark_durable(e.ino, e.generation, e.mod_seq));
    assert_ne!(s.progress_counter(), seen);
    // Woken by the mark (or never asleep: the counter had moved), not by its timeout.
    let slept = waiter.join().unwrap();
    assert!(slept < Duration::from_secs(30), "slept {slept:?}");
    // A mark that records nothing (a stale version) wakes nobody.
    let now = s.progress_counter();
    assert!(!s.mark_complete(e.ino, e.generation, e.mod_seq + 1));
    assert_eq!(s.progress_counter(), now);
}

/// A waker makes the FUTEX_WAKE call only if a sleeper marked the word: two threads hand
/// the agent's wake word back and forth 3000 times, each sleeping until the other's bump.
/// A lost wake-up would leave one asleep until its 60 s timeout; and with nobody asleep a
/// bump leaves the mark clear.
#[test]
fn wake_words_lose_no_wake_up_and_mark_their_sleepers() {
    use std::time::{Duration, Instant};
    const ROUNDS: u32 = 3000;
    let s = store(1 << 20, 4096, 0);
    let word = &s.block().header().agent_wake;
    let start = s.work_counter();
    s.wake_agent();
    assert_eq!(
        word.load(Ordering::Relaxed),
        start + 1,
        "a bump, and no sleeper mark"
    );
    let started = Instant::now();
    let other: Store = (*s).clone();
    // Counts start + 1 + 2k are the first thread's bumps, start + 2 + 2k the second's.
    let second = std::thread::spawn(move || {
        for k in 0..ROUNDS {
            let mine = start + 2 + 2 * k;
            while other.work_counter() != mine - 1 {
                other.wait_for_work(mine - 2, Duration::from_secs(60));
            }
            other.wake_agent();
        }
    });
    for k in 0..ROUNDS {
        let mine = start + 1 + 2 * k;
        while s.work_counter() == mine {
            s.wait_for_work(mine, Duration::from_secs(60));
        }
        if k + 1 < ROUNDS {
            s.wake_agent();
        }
    }
    second.join().unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "a wake-up was lost: {took:?}"
    );
    assert_eq!(s.work_counter(), start + 2 * ROUNDS);
}

#[test]
fn a_commit_inside_an_implicit_checkpoint_supersedes_it_and_an_explicit_one_refuses() {
    let s = store(1 << 20, 4096, 0);
    s.mkdir("/run1", 0o755).unwrap();
    s.mkdir("/run1/ckpt.41", 0o755).unwrap();
    s.open("/run1/ckpt.41/d", &rw())
        .unwrap()
        .write_all_at(b"41", 0)
        .unwrap();
    s.commit_implicit("/run1").unwrap();
    let root = |p: &str| s.life_tree(p).unwrap().remove(0);
    assert!(root("/run1").committed && root("/run1").implicit && root("/run1").flush);
    s.commit("/run1/ckpt.41", false).unwrap();
    assert!(!root("/run1").committed && !root("/run1").implicit && !root("/run1").flush);
    assert!(root("/run1/ckpt.41").committed && !root("/run1/ckpt.41").implicit);
    // An explicit checkpoint still refuses one inside it.
    s.mkdir("/run2", 0o755).unwrap();
    s.mkdir("/run2/x", 0o755).unwrap();
    s.commit("/run2", false).unwrap();
    let err = s.commit("/run2/x", false).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(err
        .to_string()
        .contains("inside the committed checkpoint /run2"));
    // Recommitting an implicit checkpoint explicitly makes it explicit.
    s.commit_implicit("/run2/x").unwrap_err();
    s.mkdir("/run3", 0o755).unwrap();
    s.commit_implicit("/run3").unwrap();
    s.commit("/run3", false).unwrap();
    assert!(root("/run3").committed && !root("/run3").implicit);
    assert_clean(&s);
}

#[test]
fn a_remote_file_keeps_its_name_and_size_but_never_reads_as_zeros() {
    let s = store(1 << 20, 4096, 0);
    let data = pattern(7, 10_000);
    s.open("/f", &rw()).unwrap().write_all_at(&data, 0).unwrap();
    let e = s.life_tree("/f").unwrap().remove(0);
    // Not durable yet: stays.
    assert_eq!(s.make_remote("/f", e.generation, e.mod_seq).unwrap(), None);
    assert!(s.mark_durable(e.ino, e.generation, e.mod_seq));
    let before = s.status().memory_used;
    assert_eq!(
        s.make_remote("/f", e.generation, e.mod_seq).unwrap(),
        Some(3 * 4096)
    );
    assert_eq!(before - s.status().memory_used, 3 * 4096);
    let m = s.stat("/f").unwrap();
    assert!(m.remote && m.size == 10_000);
    let f = s.open("/f", &OpenOptions::new().read(true)).unwrap();
    assert!(f.is_remote());
    let err = f.read_at(&mut [0u8; 16], 0).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains("only in a level below"), "{err}");
    assert!(f.map_sources(0, 4096, false).is_err());
    drop(f);
    // Truncated to zero it is an ordinary (empty) file again.
    let w = s
        .open("/f", &OpenOptions::new().write(true).truncate(true))
        .unwrap();
    assert!(!w.is_remote());
    w.write_all_at(b"new", 0).unwrap();
    drop(w);
    assert_eq!(s.stat("/f").unwrap().size, 3);
    // A listed name: created remote, recorded durable, exists only once.
    assert!(s.create_remote("/g", 123, 42).unwrap());
    assert!(!s.create_remote("/g", 5, 42).unwrap());
    let g = s.life_tree("/g").unwrap().remove(0);
    assert!(g.remote && g.durable() && g.size == 123);
    assert_eq!(s.stat("/g").unwrap().mtime, 42);
    // Inside a committed checkpoint a file is never made remote on its own.
    s.mkdir("/c", 0o755).unwrap();
    s.open("/c/x", &rw())
        .unwrap()
        .write_all_at(b"x", 0)
        .unwrap();
    s.commit("/c", false).unwrap();
    let x = s.life_tree("/c/x").unwrap().remove(0);
    assert!(s.mark_durable(x.ino, x.generation, x.mod_seq));
    assert_eq!(
        s.make_remote("/c/x", x.generation, x.mod_seq).unwrap(),
        None
    );
    assert_clean(&s);
}

#[test]
fn a_pinned_file_keeps_its_chunks_through_truncation_until_the_last_unpin() {
    let s = store(1 << 20, 4096, 0);
    let data = pattern(3, 5 * 4096);
    s.open("/f", &rw()).unwrap().write_all_at(&data, 0).unwrap();
    let f = s.open("/f", &OpenOptions::new().read(true)).unwrap();
    let first = s.pin_mapping(&f).unwrap();
    let second = s.pin_mapping(&f).unwrap();
    let used = |s: &Store| s.status().memory_used;
    let before = used(&s);
    s.truncate("/f", 4096).unwrap();
    assert_eq!(s.stat("/f").unwrap().size, 4096);
    assert_eq!(
        used(&s),
        before,
        "truncation freed chunks a mapping reaches"
    );
    s.release_description(first);
    assert_eq!(used(&s), before, "one mapping is left");
    s.release_description(second);
    assert_eq!(
        before - used(&s),
        4 * 4096,
        "the last unpin trims past the end"
    );
    let mut buf = vec![0u8; 4096];
    f.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, data[..4096]);
    assert_clean(&s);
}

#[test]
fn damaged_links_and_maps_are_errors_not_panics() {
    use crate::layout::{link_len, link_slot, pack_link, pack_map};
    let s = store(1 << 20, 4096, 0);
    s.mkdir("/d", 0o755).unwrap();
    s.open("/d/f", &rw())
        .unwrap()
        .write_all_at(b"x", 0)
        .unwrap();
    let b = s.block();
    let f = s.open("/d/f", &OpenOptions::new().write(true)).unwrap();
    // A directory whose parent link points outside the inode table: a write-open below it
    // walks up the parents to invalidate them, and stops at the bad link.
    let d = b.inode(s.stat("/d").unwrap().ino as u32);
    let link = d.link.load(Ordering::Acquire);
    d.link.store(
        pack_link(0x7fff_fff0, link_len(link), link_slot(link) as u32),
        Ordering::Release,
    );
    b.invalidate_ancestors(f.ino() as u32);
    d.link.store(link, Ordering::Release);
    // A file whose map word names no root node: a write is EIO, not a panic.
    let ino = f.ino() as u32;
    let map = b.inode(ino).map.load(Ordering::Acquire);
    b.inode(ino).map.store(pack_map(0, 3), Ordering::Release);
    let err = f.write_at(&[1u8; 8192], 100_000).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(
        err.to_string()
            .contains("store block is damaged: the chunk map of inode"),
        "{err}"
    );
    b.inode(ino).map.store(map, Ordering::Release);
}

#[test]
fn paths_longer_than_the_durable_store_takes_are_refused_when_made() {
    let s = store(1 << 20, 4096, 0);
    s.mkdir("/d", 0o755).unwrap();
    // S3: keys of at most 1024 bytes; a prefix of 100 leaves 923 for keys, 892 for paths.
    s.set_path_limit(Some(923));
    let name = |n: usize| "x".repeat(n);
    // In the root: "/" and a name of up to 255 bytes is always within 892.
    s.open(&format!("/{}", name(255)), &rw()).unwrap();
    // "/d/" + 200 + "/" + ... built of 200-byte names up to the limit.
    let mut dir = "/d".to_string();
    for _ in 0..4 {
        dir = format!("{dir}/{}", name(200));
        s.mkdir(&dir, 0o755).unwrap();
    }
    let room = 892 - dir.len() - 1;
    s.open(&format!("{dir}/{}", name(room)), &rw()).unwrap();
    let Err(err) = s.open(&format!("{dir}/{}", name(room + 1)), &rw()) else {
        panic!("a path past the limit was created");
    };
    assert_eq!(err.errno(), libc::ENAMETOOLONG, "{err}");
    assert!(
        err.to_string().contains("takes paths of at most 892"),
        "{err}"
    );
    let err = s
        .rename(
            &format!("{dir}/{}", name(room)),
            &format!("{dir}/{}", name(room + 1)),
        )
        .unwrap_err();
    assert_eq!(err.errno(), libc::ENAMETOOLONG, "{err}");
    // No limit: anything the store takes.
    s.set_path_limit(None);
    s.open(&format!("{dir}/{}", name(room + 1)), &rw()).unwrap();
    assert_clean(&s);
}

/// How many pages of `addr..addr + len` this process's page tables map (/proc/self/pagemap:
/// 8 bytes per virtual page, bit 63 = present).
fn present_pages(addr: *const u8, len: usize) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let page = 4096;
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
    pagemap
        .seek(SeekFrom::Start((addr as u64 / page as u64) * 8))
        .expect("seek pagemap");
    let mut entries = vec![0u8; len / page * 8];
    pagemap.read_exact(&mut entries).expect("read pagemap");
    entries
        .chunks_exact(8)
        .filter(|e| u64::from_ne_bytes((*e).try_into().expect("8 bytes")) >> 63 == 1)
        .count()
}

/// Minor page faults this thread has taken so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: an all-zero rusage is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the struct given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0);
    usage.ru_minflt
}

#[test]
fn the_first_access_to_a_chunk_maps_all_of_it_into_the_process() {
    // Without a prefault nothing is mapped before its first access, and no populate thread
    // runs: what is mapped afterwards is the first access's doing.
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/a", &rw()).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    let sources = f.map_sources(0, 1 << 20, false).unwrap();
    let Some(MapSource::Shm { offset, .. }) = sources.first() else {
        panic!("the file's chunk is not in memory: {sources:?}");
    };
    let chunk = s.block().base.wrapping_add(*offset as usize);
    // One populate for the chunk, not a page fault for the one page written.
    assert_eq!(present_pages(chunk, 1 << 20), 256);
    // Mapped for writing too, though populated as for a read: filling the chunk takes no
    // page fault.
    let data = vec![7u8; 1 << 20];
    let before = thread_minor_faults();
    f.write_all_at(&data, 0).unwrap();
    assert_eq!(
        thread_minor_faults() - before,
        0,
        "writing the populated chunk faulted"
    );
}

#[test]
fn an_anchored_description_lives_as_long_as_its_process() {
    use std::mem::offset_of;
    // docs/store-layout.md, "Open file description".
    assert_eq!(offset_of!(crate::layout::OfdSlot, anchor_start), 48);
    let t = store(1 << 20, 64 << 10, 0);
    let s = t.store.as_ref().expect("store");
    let f = s.open("/held", &rw()).expect("open");
    let d = s.describe_open(&f, libc::O_RDWR).expect("describe");
    assert!(
        s.anchor_description(d),
        "this process's start time is readable"
    );
    // Old enough that only the holder's liveness can spare it, and named by no memfd.
    let slot = s.block().ofd(d.slot);
    slot.claimed_ns.store(0, Ordering::Relaxed);
    assert_eq!(
        s.sweep_descriptions(),
        0,
        "a live process's anchored description was swept"
    );
    assert!(s.description(d).is_some());
    // The same pid with another start time is a process that died (its pid reused).
    let start = slot.anchor_start.load(Ordering::Relaxed);
    slot.anchor_start.store(start + 1, Ordering::Relaxed);
    assert_eq!(
        s.sweep_descriptions(),
        1,
        "a dead process's anchored description was kept"
    );
    assert!(s.description(d).is_none());
}

/// A store with `files` inodes: a dense name index (twice as many slots), so that removals
/// move entries of other directories back (backward-shift deletion).
fn store_with_files(files: u32) -> TestStore {
    let (mut cfg, dir) = cfg(4 << 20, 4096, 0);
    cfg.max_files = files;
    TestStore {
        store: Some(Store::create(&cfg).expect("create")),
        name: cfg.name,
        _dir: dir,
    }
}

/// Lock-free stats (no namespace lock, no retry for creates; a retry only when a removal
/// changed a stripe of the index they probed) racing two threads that create and remove
/// files in directories of their own: every stable name is always found as the same
/// inode, a name never created is never found, and each creator sees its own files.
#[test]
fn stats_racing_creates_and_removes_in_other_directories_stay_right() {
    let s = store_with_files(256);
    s.mkdir("/stable", 0o755).unwrap();
    let stable: Vec<(String, u64)> = (0..60)
        .map(|i| {
            let p = format!("/stable/f{i}");
            s.open(&p, &rw().create_new(true)).unwrap();
            let ino = s.stat(&p).unwrap().ino;
            (p, ino)
        })
        .collect();
    for d in ["/d0", "/d1"] {
        s.mkdir(d, 0o755).unwrap();
    }
    let done = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for d in ["/d0", "/d1"] {
            let (s, done) = (&s, &done);
            scope.spawn(move || {
                for round in 0..150 {
                    let names: Vec<String> = (0..90).map(|i| format!("{d}/r{round}-{i}")).collect();
                    for p in &names {
                        s.open(p, &rw().create_new(true)).unwrap();
                        assert_eq!(s.stat(p).unwrap().kind, FileKind::File, "{p}");
                    }
                    for p in names.iter().rev() {
                        s.unlink(p).unwrap();
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        let mut passes = 0u64;
        while done.load(Ordering::Relaxed) < 2 || passes == 0 {
            for (p, ino) in &stable {
                let m = s
                    .stat(p)
                    .unwrap_or_else(|e| panic!("stat {p} while others churn: {e}"));
                assert_eq!(m.ino, *ino, "{p} resolved to another inode");
            }
            for p in ["/stable/never", "/d0/never", "/d1/never"] {
                let e = s.stat(p).expect_err("a name never created was found");
                assert_eq!(e.errno(), libc::ENOENT, "{p}: {e}");
            }
            passes += 1;
        }
    });
    let h = s.block().header();
    assert_eq!(
        h.ns_seq.seq.load(Ordering::Relaxed) & 1,
        0,
        "namespace sequence left odd"
    );
    for (i, st) in h.ns_stripes.iter().enumerate() {
        assert_eq!(st.load(Ordering::Relaxed) & 1, 0, "stripe {i} left odd");
    }
    assert_clean(&s);
}

/// A process killed -9 in the middle of removing a file (namespace lock held, the stripes
/// of the index it changes odd, the file's state already FREE, its index entry not yet
/// removed) is repaired by the next locker: stats stop failing over to the lock forever,
/// the removed name is gone, the others are found, and the stripes are even again.
#[test]
fn a_remover_killed_mid_removal_is_repaired() {
    let s = store_with_files(64);
    s.mkdir("/d", 0o755).unwrap();
    for i in 0..20 {
        s.open(&format!("/d/f{i}"), &rw().create_new(true)).unwrap();
    }
    let victim = s.stat("/d/f7").unwrap().ino as u32;
    let b = s.block();
    let stripes = b.removal_stripes(victim);
    assert_ne!(stripes, 0);
    killed_after(|| {
        let g = b.lock_ns_entries().expect("lock");
        let w = crate::namespace::StripesWritten::begin(b, stripes);
        b.inode(victim)
            .state
            .store(crate::layout::INODE_FREE, Ordering::Release);
        std::mem::forget(w);
        std::mem::forget(g);
    });
    let h = b.header();
    assert!(
        h.ns_stripes
            .iter()
            .any(|st| st.load(Ordering::Relaxed) & 1 != 0),
        "the dead remover left no stripe odd: the test tests nothing"
    );
    // Falls back to the lock, finds its holder dead and recovers the namespace.
    assert_eq!(s.stat("/d/f7").unwrap_err().errno(), libc::ENOENT);
    for i in (0..20).filter(|&i| i != 7) {
        s.stat(&format!("/d/f{i}")).unwrap();
    }
    for (i, st) in h.ns_stripes.iter().enumerate() {
        assert_eq!(st.load(Ordering::Relaxed) & 1, 0, "stripe {i} still odd");
    }
    assert_eq!(h.ns_seq.seq.load(Ordering::Relaxed) & 1, 0);
    let names: Vec<String> = s
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 19, "{names:?}");
    s.open("/d/f7", &rw().create_new(true)).unwrap();
    assert_clean(&s);
}

/// What lock-free lookups rely on, slot by slot: a create only fills one empty slot of the
/// name index (no sequence moves for it), and a removal of a file changes only slots of the
/// stripes it marks odd (`removal_stripes`, computed before it starts).
#[test]
fn creates_fill_one_empty_slot_and_removals_stay_in_the_stripes_they_mark() {
    let s = store_with_files(512);
    let b = s.block();
    let snapshot = || -> Vec<u32> {
        b.hash_slots()
            .iter()
            .map(|v| v.load(Ordering::Relaxed))
            .collect()
    };
    for d in ["/a", "/b", "/c"] {
        s.mkdir(d, 0o755).unwrap();
    }
    let mut live = Vec::new();
    // Dense (about 0.45 of the slots), so that removals shift entries of other directories.
    for i in 0..230 {
        let p = format!("/{}/f{i}", ["a", "b", "c"][i % 3]);
        let before = snapshot();
        s.open(&p, &rw().create_new(true)).unwrap();
        let after = snapshot();
        let changed: Vec<usize> = (0..before.len())
            .filter(|&k| before[k] != after[k])
            .collect();
        assert_eq!(changed.len(), 1, "a create changed slots {changed:?}");
        assert_eq!(before[changed[0]], 0, "a create overwrote a used slot");
        live.push(p);
    }
    let mut shifted = 0;
    // Every other file, in an order unrelated to creation, then the rest.
    let order: Vec<usize> = (0..live.len())
        .step_by(2)
        .chain((1..live.len()).step_by(2))
        .collect();
    for k in order {
        let p = &live[k];
        let ino = s.stat(p).unwrap().ino as u32;
        let marked = b.removal_stripes(ino);
        let seqs = || -> Vec<u64> {
            b.header()
                .ns_stripes
                .iter()
                .map(|v| v.load(Ordering::Relaxed))
                .collect()
        };
        let (before, seqs_before) = (snapshot(), seqs());
        s.unlink(p).unwrap();
        let (after, seqs_after) = (snapshot(), seqs());
        for (st, (x, y)) in seqs_before.iter().zip(&seqs_after).enumerate() {
            let expected = if marked & (1 << st) != 0 { x + 2 } else { *x };
            assert_eq!(*y, expected, "stripe {st}'s sequence after removing {p}");
        }
        let changed: Vec<usize> = (0..before.len())
            .filter(|&k| before[k] != after[k])
            .collect();
        shifted += changed.len().saturating_sub(1);
        for slot in changed {
            assert!(
                marked & (1 << b.stripe_of(slot)) != 0,
                "removing {p} changed slot {slot} of stripe {}, not in the stripes it marked \
                 ({marked:#x})",
                b.stripe_of(slot)
            );
        }
    }
    assert!(
        shifted > 0,
        "no removal moved an entry back: the test tests nothing"
    );
    assert_clean(&s);
}

/// An odd stripe sequence with no removal at work (damage) is a warning fsck repairs.
#[test]
fn fsck_reports_and_repairs_an_odd_stripe_sequence() {
    let s = store_with_files(64);
    s.open("/f", &rw().create_new(true)).unwrap();
    let stripe = &s.block().header().ns_stripes[3];
    stripe.store(7, Ordering::Relaxed);
    let r = s.fsck(false).unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("stripe")),
        "not reported: {r:?}"
    );
    // Lookups still answer (through the lock where they meet that stripe).
    s.stat("/f").unwrap();
    let r = s.fsck(true).unwrap();
    assert!(!r.repaired.is_empty(), "{r:?}");
    assert_eq!(stripe.load(Ordering::Relaxed), 8);
    assert_clean(&s);
}

/// Runs `hold` in a forked child, then kills the child with SIGKILL and reaps it: a process
/// that dies at exactly the point `hold` leaves it (a lock held, a change half made).
pub(crate) fn killed_after(hold: impl FnOnce()) {
    let mut pipe = [0; 2];
    // SAFETY: a pipe for the child to say it got there.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: fork in a test; the child runs `hold`, writes one byte and pauses.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        hold();
        // SAFETY: one byte to the parent, then sleep until SIGKILL.
        unsafe {
            libc::write(pipe[1], b"x".as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    let mut byte = 0u8;
    // SAFETY: reading the child's byte into a local.
    let got = unsafe { libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1) };
    assert_eq!(got, 1);
    // SAFETY: killing and reaping our own child (a zombie counts as dead too; reaping first
    // is the common case); closing our pipe ends.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
}

#[test]
fn a_file_lock_is_biased_to_its_writer() {
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/biased", &rw()).unwrap();
    for i in 0..3u64 {
        f.write_at(b"0123456789abcdef", i * 16).unwrap();
    }
    let ino = f.ino() as u32;
    assert!(
        s.block().inode(ino).lock.biased_to_this_thread(),
        "the writer's file lock is not biased to it"
    );
    drop(f);
    s.unlink("/biased").unwrap();
    assert!(
        s.block().inode(ino).lock.is_fresh(),
        "a freed inode's lock kept its bias"
    );
}

#[test]
fn a_reused_inode_is_biased_to_its_new_writer() {
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/first", &rw()).unwrap();
    f.write_at(b"x", 0).unwrap();
    let ino = f.ino() as u32;
    drop(f);
    // Another thread writes the file, revoking the bias, and removes it.
    std::thread::scope(|t| {
        t.spawn(|| {
            let f = s.open("/first", &rw()).unwrap();
            f.write_at(b"y", 1).unwrap();
            drop(f);
            s.unlink("/first").unwrap();
        });
    });
    let f = s.open("/second", &rw()).unwrap();
    assert_eq!(
        f.ino() as u32,
        ino,
        "the freed inode was not handed out again"
    );
    f.write_at(b"z", 0).unwrap();
    assert!(
        s.block().inode(ino).lock.biased_to_this_thread(),
        "a revocation in the inode's earlier life stayed"
    );
}

/// The next run of a job rewrites the files of the last one, whose processes have exited
/// holding the biases of their files' locks: the new writer gets the fast path back.
#[test]
fn a_file_rewritten_after_its_writer_exited_is_biased_to_the_new_writer() {
    let s = store(8 << 20, 1 << 20, 0);
    let ino = s.open("/restart", &rw()).unwrap().ino() as u32;
    // SAFETY: fork in a test; the child writes the file and _exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let wrote = s
            .open("/restart", &rw())
            .and_then(|f| f.write_at(b"last run", 0));
        // SAFETY: leave without running the test harness's exit handlers.
        unsafe { libc::_exit(i32::from(wrote.is_err())) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert_eq!(status, 0, "the child's write failed");
    assert!(
        !s.block().inode(ino).lock.biased_to_this_thread() && !s.block().inode(ino).lock.is_fresh(),
        "the child took no bias: the test tests nothing"
    );
    let f = s.open("/restart", &rw()).unwrap();
    f.write_at(b"next run", 0).unwrap();
    f.write_at(b"!", 8).unwrap();
    assert!(
        s.block().inode(ino).lock.biased_to_this_thread(),
        "a dead writer's bias kept the new writer on the locked path"
    );
    assert_eq!(read_all(&f), b"next run!");
}

/// The file lock's hint (the chunk last written) goes stale when a truncation frees that
/// chunk and another file takes it: a write must then find its own chunk, never the other
/// file's.
#[test]
fn a_stale_chunk_hint_never_writes_into_another_file() {
    let s = store(4 << 20, 1 << 20, 0);
    let a = s.open("/a", &rw()).unwrap();
    a.write_at(&pattern(1, 4096), 1 << 20).unwrap(); // chunk index 1: the hint
    a.set_len(0).unwrap(); // frees it
    let b = s.open("/b", &rw()).unwrap();
    let theirs = pattern(2, 3 << 20);
    b.write_at(&theirs, 0).unwrap(); // takes every free chunk but one
    a.write_at(&pattern(3, 4096), 1 << 20).unwrap();
    assert_eq!(
        read_all(&b),
        theirs,
        "a write through a stale hint hit another file"
    );
    let mut back = vec![0u8; 4096];
    a.read_at(&mut back, 1 << 20).unwrap();
    assert_eq!(back, pattern(3, 4096));
    assert_clean(&s);
}

/// Spins until the coarse clock has passed `t` (a kernel tick): a later resolution of
/// marked times would then give a larger time.
fn until_the_clock_passes(t: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while crate::block::coarse_now_ns() <= t {
        assert!(
            std::time::Instant::now() < deadline,
            "the coarse clock stands still"
        );
        std::hint::spin_loop();
    }
}

#[test]
fn a_write_marks_the_times_and_the_first_stat_sets_them() {
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/t", &rw()).unwrap();
    let before = crate::block::coarse_now_ns();
    f.write_at(b"data", 0).unwrap();
    let ino = f.ino() as u32;
    assert_eq!(
        s.block().inode(ino).mtime.load(Ordering::Relaxed),
        crate::layout::TIMES_MARKED
    );
    let first = s.stat("/t").unwrap();
    assert!(first.mtime >= before, "{} < {before}", first.mtime);
    assert!(first.ctime >= first.mtime);
    until_the_clock_passes(first.mtime);
    let second = s.stat("/t").unwrap();
    assert_eq!(
        (second.mtime, second.ctime),
        (first.mtime, first.ctime),
        "a stat without a write in between moved the times"
    );
    // The next write marks them again: the next stat sees a later time.
    f.write_at(b"more", 4).unwrap();
    assert!(s.stat("/t").unwrap().mtime > first.mtime);
}

#[test]
fn closing_a_writer_sets_the_times_its_writes_marked() {
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/c", &rw()).unwrap();
    f.write_at(b"data", 0).unwrap();
    drop(f);
    let closed = crate::block::coarse_now_ns();
    until_the_clock_passes(closed);
    let m = s.stat("/c").unwrap();
    assert!(
        m.mtime <= closed,
        "mtime {} is later than the close at {closed}",
        m.mtime
    );
}

#[test]
fn an_explicit_time_replaces_the_mark() {
    let s = store(8 << 20, 1 << 20, 0);
    let f = s.open("/e", &rw()).unwrap();
    f.write_at(b"data", 0).unwrap();
    f.set_times(None, Some(42)).unwrap();
    assert_eq!(s.stat("/e").unwrap().mtime, 42);
    // The marker's own value is not a time anyone can set.
    s.set_times("/e", None, Some(i64::MIN)).unwrap();
    assert_eq!(s.stat("/e").unwrap().mtime, i64::MIN + 1);
}

/// Small writes take a short path when they fall inside the chunk the file's hint names
/// (`File::write_hinted`), the general loop otherwise: holes, chunk boundaries, stale hints after
/// truncations, another file reusing the freed chunks. Both must leave what a model of the
/// file says, byte for byte, after every step. Half the writes and reads try the whole
/// fast path first (`try_write_at_fast`, `try_write_advancing_fast`, `try_read_at_fast`:
/// the interposition library's calls before its panic boundary), which either does all
/// (and moves the offset) or changes nothing.
#[test]
fn small_writes_through_the_hint_and_the_general_path_agree_with_a_model() {
    use rand::{Rng, SeedableRng};
    const CHUNK: u64 = 4096;
    let s = store(16 * CHUNK, CHUNK, 0);
    let a = s.open("/a", &rw()).unwrap();
    let b = s.open("/b", &rw()).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut theirs: Vec<u8> = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    let me = LockHolder::this_thread();
    let (mut fast_writes, mut fast_reads) = (0, 0);
    for step in 0..4000u32 {
        match rng.gen_range(0..100) {
            // Mostly small writes near the end of the file, sometimes past it (a hole) or
            // across a chunk boundary.
            0..=79 => {
                let len = rng.gen_range(1..=200usize);
                let end = model.len() as u64;
                let boundary = rng.gen_range(1..=6) * CHUNK;
                let offset = match rng.gen_range(0..10) {
                    0 => end + rng.gen_range(1..CHUNK),
                    1 => boundary - rng.gen_range(1..len as u64 + 1),
                    2 => boundary - len as u64 + rng.gen_range(0..3),
                    _ => end.saturating_sub(rng.gen_range(0..300)),
                }
                .min(6 * CHUNK);
                let data = pattern(step as u8, len);
                let fast = match rng.gen_range(0..4) {
                    0 => a.try_write_at_fast(me, &data, offset),
                    1 => {
                        let position = AtomicU64::new(offset);
                        let n = a.try_write_advancing_fast(me, &data, &position);
                        let moved_to = position.load(Relaxed);
                        assert_eq!(moved_to, offset + n.unwrap_or(0) as u64, "step {step}");
                        n
                    }
                    _ => None,
                };
                match fast {
                    Some(n) => {
                        assert_eq!(n, len, "a fast write is whole, step {step}");
                        fast_writes += 1;
                    }
                    None => a.write_all_at(&data, offset).unwrap(),
                }
                let to = offset as usize + len;
                if model.len() < to {
                    model.resize(to, 0);
                }
                model[offset as usize..to].copy_from_slice(&data);
            }
            // A truncation leaves the hint naming a freed chunk...
            80..=89 => {
                let len = rng.gen_range(0..=model.len() as u64 + CHUNK);
                a.set_len(len).unwrap();
                model.resize(len as usize, 0);
            }
            // ...which another file may take meanwhile (`a` holds at most 7 chunks).
            _ => {
                b.set_len(0).unwrap();
                theirs = pattern(0xee, 8 * CHUNK as usize);
                b.write_all_at(&theirs, 0).unwrap();
            }
        }
        assert_eq!(read_all(&a), model, "after step {step}");
        // A small read, through the handle's read hint when it names the chunk, half the
        // time tried on the fast path first.
        let at = rng.gen_range(0..model.len() as u64 + 10);
        let mut small = [0u8; 100];
        let fast = rng
            .gen_bool(0.5)
            .then(|| a.try_read_at_fast(&mut small, at))
            .flatten();
        if fast.is_some() {
            fast_reads += 1;
        }
        let n = match fast {
            Some(n) => n,
            None => a.read_at(&mut small, at).unwrap(),
        };
        let want = model.get(at as usize..).unwrap_or(&[]);
        let want = &want[..want.len().min(100)];
        assert_eq!(&small[..n], want, "read at {at} after step {step}");
        assert!(
            read_all(&b) == theirs,
            "a write hit another file at step {step}"
        );
    }
    // About 1600 writes tried it; those past the end, across a boundary or after a
    // truncation did not take it.
    assert!(
        (400..1600).contains(&fast_writes),
        "{fast_writes} writes took the fast path"
    );
    assert!(
        (300..2000).contains(&fast_reads),
        "{fast_reads} reads took the fast path"
    );
    assert_clean(&s);
}

/// The fast path declines, changing nothing, wherever the general path has more to do:
/// a hole, a chunk not written yet, a read-only or O_APPEND handle, a file whose bias
/// another thread's write revoked.
#[test]
fn the_fast_write_path_declines_what_it_does_not_handle() {
    const CHUNK: u64 = 4096;
    let s = store(16 * CHUNK, CHUNK, 0);
    let me = LockHolder::this_thread();
    let f = s.open("/f", &rw()).unwrap();
    f.write_all_at(&[1; 100], 0).unwrap();
    assert_eq!(f.try_write_at_fast(me, &[2; 10], 10), Some(10));
    let position = AtomicU64::new(90);
    assert_eq!(
        f.try_write_advancing_fast(me, &[3; 20], &position),
        Some(20)
    );
    assert_eq!(position.load(Relaxed), 110);
    let mut want = vec![1u8; 110];
    want[10..20].fill(2);
    want[90..110].fill(3);
    assert_eq!(read_all(&f), want);
    let declined = |n: Option<usize>, want: &[u8], what: &str| {
        assert_eq!(n, None, "{what}");
        assert_eq!(read_all(&f), want, "{what} changed the file");
    };
    declined(
        f.try_write_at_fast(me, &[4; 10], 200),
        &want,
        "a write past the end",
    );
    declined(
        f.try_write_at_fast(me, &[4; 10], CHUNK),
        &want,
        "a write into a new chunk",
    );
    let reader = s.open("/f", &OpenOptions::default()).unwrap();
    declined(
        reader.try_write_at_fast(me, &[4; 10], 0),
        &want,
        "a read-only handle",
    );
    let appender = s.open("/f", &rw().append(true)).unwrap();
    let position = AtomicU64::new(0);
    let n = appender.try_write_advancing_fast(me, &[4; 10], &position);
    declined(n, &want, "an O_APPEND handle");
    assert_eq!(position.load(Relaxed), 0);
    // Another thread's write revokes this thread's bias.
    std::thread::scope(|scope| {
        scope.spawn(|| f.write_all_at(&[5; 10], 20).unwrap());
    });
    want[20..30].fill(5);
    declined(
        f.try_write_at_fast(me, &[4; 10], 30),
        &want,
        "a revoked bias",
    );
    // The general path still writes.
    f.write_all_at(&[6; 10], 30).unwrap();
    want[30..40].fill(6);
    assert_eq!(read_all(&f), want);
    drop((reader, appender, f));
    assert_clean(&s);
}

/// The fast paths remember, per handle, the chunk they last wrote and read. A truncation
/// frees that chunk and another file takes it for the same index: the handle's next small
/// write and read must see the chunk's state name the other file and not touch it.
#[test]
fn a_handles_remembered_chunk_taken_by_another_file_is_not_used() {
    const CHUNK: u64 = 4096;
    let s = store(16 * CHUNK, CHUNK, 0);
    let me = LockHolder::this_thread();
    let a = s.open("/a", &rw()).unwrap();
    a.write_all_at(&[1; 64], 0).unwrap();
    // The general read sets the read hint; the fast paths now know the chunk.
    assert_eq!(a.read_at(&mut [0; 64], 0).unwrap(), 64);
    assert_eq!(a.try_write_at_fast(me, &[2; 64], 64), Some(64));
    assert_eq!(a.try_read_at_fast(&mut [0; 64], 64), Some(64));
    let chunk_of_a = a.chunk_list().unwrap()[0].chunk_id;
    a.set_len(0).unwrap();
    let b = s.open("/b", &rw()).unwrap();
    b.write_all_at(&[9; 128], 0).unwrap();
    assert_eq!(
        b.chunk_list().unwrap()[0].chunk_id,
        chunk_of_a,
        "the test needs /b to take the chunk /a gave back"
    );
    assert_eq!(a.try_write_at_fast(me, &[3; 64], 0), None);
    assert_eq!(a.try_read_at_fast(&mut [0; 64], 0), None);
    assert_eq!(read_all(&b), vec![9u8; 128], "/b's chunk is untouched");
    // The general path gives /a a chunk of its own; the fast paths follow it there (the
    // read hint still names /b's chunk: a fast read declines or reads /a's bytes).
    a.write_all_at(&[3; 64], 0).unwrap();
    let mut got = [0u8; 64];
    if let Some(n) = a.try_read_at_fast(&mut got, 0) {
        assert_eq!(
            got[..n],
            [3u8; 64][..n],
            "a fast read of /a returned /b's bytes"
        );
    }
    assert_eq!(a.try_write_at_fast(me, &[4; 64], 64), Some(64));
    let mut want = vec![3u8; 64];
    want.extend([4u8; 64]);
    assert_eq!(read_all(&a), want);
    assert_eq!(read_all(&b), vec![9u8; 128]);
    assert_clean(&s);
}

/// Removals look for lock files only once one was made (`lock_files` in the header): a
/// fresh store says none were, and the mark, once set, is seen by every attacher.
#[test]
fn the_lock_file_mark_starts_clear_and_is_shared() {
    let s = store(1 << 20, 4096, 0);
    assert!(!s.may_have_lock_files());
    let other = Store::attach(s.name()).unwrap();
    other.note_lock_file();
    assert!(s.may_have_lock_files());
}

/// The populate thread's order: its lease batch from the far end, then the free stack from
/// the top down, each chunk once; the stack is walked once, not from its top for every
/// chunk; chunks freed onto it later are not looked at, chunks taken from it are skipped.
#[test]
fn the_populate_thread_maps_the_batch_then_the_free_stack_from_its_top() {
    use crate::block::next_to_populate;
    use std::cell::RefCell;
    use std::collections::HashSet;
    let ids = |v: &[u32]| v.iter().map(|&c| AtomicU32::new(c)).collect::<Vec<_>>();
    let batch = ids(&[5, 9, 2]);
    // Four entries in use (7, 3, 8, 1: top 4), then two pushed later.
    let free = ids(&[7, 3, 8, 1, 4, 6]);
    let stack_values = [7u32, 3, 8, 1, 4, 6];
    let mapped = RefCell::new(HashSet::from([5u32, 8]));
    let stack_looks = RefCell::new(Vec::new());
    let mut below = u32::MAX;
    let mut next = |batch: &[AtomicU32], top: u32| {
        let c = next_to_populate(batch, &free, top, &mut below, |c| {
            if stack_values.contains(&c) {
                stack_looks.borrow_mut().push(c);
            }
            !mapped.borrow().contains(&c)
        })?;
        mapped.borrow_mut().insert(c);
        Some(c)
    };
    // The batch, then the stack from its top (8 is mapped already).
    let order: Vec<u32> = std::iter::from_fn(|| next(&batch, 4)).collect();
    assert_eq!(order, [9, 2, 1, 3, 7]);
    assert_eq!(stack_looks.take(), [1, 8, 3, 7], "each stack entry once");
    // A refill took 7 into a new batch, and 4 and 6 were freed onto the stack (top 6): the
    // batch is mapped, the stack below is done, the freed chunks are not looked at.
    mapped.borrow_mut().remove(&7);
    let batch = ids(&[7]);
    assert_eq!(next(&batch, 6), Some(7));
    assert_eq!(next(&batch, 6), None);
    assert!(stack_looks.take().iter().all(|c| *c == 7));
}

/// A process takes description slots next to the one it took last (in cache lines it
/// touched already), not at a random place in the table each time.
#[test]
fn a_process_takes_description_slots_side_by_side() {
    let s = store(1 << 20, 4096, 0);
    let f = s.open("/f", &rw()).unwrap();
    let first = s.describe_open(&f, libc::O_RDONLY).unwrap();
    let second = s.describe_open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(second.slot, (first.slot + 1) % crate::layout::OFD_SLOTS);
    // Slots given back behind the last one taken are left for later: the search goes on
    // from there.
    let third = s.describe_open(&f, libc::O_RDONLY).unwrap();
    s.release_description(second);
    s.release_description(third);
    let fourth = s.describe_open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(fourth.slot, (third.slot + 1) % crate::layout::OFD_SLOTS);
    s.release_description(first);
    s.release_description(fourth);
    assert_clean(&s);
}

#[test]
fn a_one_chunk_file_is_its_own_map_until_it_grows() {
    let s = store(64 * 4096, 4096, 0);
    let f = s.open("/one", &rw()).unwrap();
    f.write_all_at(&pattern(1, 4096), 0).unwrap();
    assert_eq!(
        s.status().map_nodes_used,
        0,
        "one chunk at index 0 takes no node"
    );
    assert_clean(&s);
    // Growing makes the chunk entry 0 of a root node; the data stays where it was.
    f.write_all_at(&pattern(2, 4096), 5 * 4096).unwrap();
    assert_eq!(s.status().map_nodes_used, 1);
    let mut want = pattern(1, 4096);
    want.resize(5 * 4096, 0);
    want.extend(pattern(2, 4096));
    assert_eq!(read_all(&f), want);
    assert_clean(&s);
    // Cutting back to one chunk keeps the tree; cutting to nothing frees chunk and node.
    f.set_len(4096).unwrap();
    assert_eq!(read_all(&f), pattern(1, 4096));
    f.set_len(0).unwrap();
    assert_eq!((s.status().map_nodes_used, s.status().memory_used), (0, 0));
    // A file whose first chunk is not at index 0 needs a node from the start.
    f.write_all_at(b"far", 3 * 4096).unwrap();
    assert_eq!(s.status().map_nodes_used, 1);
    f.set_len(0).unwrap();
    // One chunk again, truncated to nothing and removed: everything comes back.
    f.write_all_at(b"x", 0).unwrap();
    f.set_len(1).unwrap();
    assert_eq!(s.status().memory_used, 4096);
    f.set_len(0).unwrap();
    f.write_all_at(b"y", 0).unwrap();
    drop(f);
    s.unlink("/one").unwrap();
    assert_eq!((s.status().map_nodes_used, s.status().memory_used), (0, 0));
    assert_clean(&s);
}

#[test]
fn a_one_chunk_map_naming_no_chunk_is_an_error_not_a_panic() {
    use crate::layout::pack_map;
    let s = store(64 * 4096, 4096, 0);
    let f = s.open("/f", &rw()).unwrap();
    f.write_all_at(b"data", 0).unwrap();
    let b = s.block();
    let inode = b.inode(f.ino() as u32);
    let map = inode.map.load(Ordering::Acquire);
    inode.map.store(pack_map(u32::MAX, 0), Ordering::Release);
    let err = f.read_at(&mut [0; 4], 0).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(err.to_string().contains("past the chunk table"), "{err}");
    let r = s.fsck(false).unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("does not exist")),
        "{r:?}"
    );
    inode.map.store(map, Ordering::Release);
    assert_eq!(read_all(&f), b"data");
    assert_clean(&s);
}

/// The last close of an unlinked file and its unlink race: whichever comes second frees it,
/// and a close of a file still named takes no namespace lock (closed_description). Two
/// threads spin on a round counter so that the two calls start within nanoseconds.
#[test]
fn an_unlink_racing_the_last_close_never_leaks_the_file() {
    let s = store(64 * 4096, 4096, 0);
    const ROUNDS: u64 = 20_000;
    let round = AtomicU64::new(0);
    let handed = std::sync::Mutex::new(None);
    let closed = AtomicU64::new(0);
    let mut leaked = Vec::new();
    std::thread::scope(|t| {
        t.spawn(|| {
            for r in 1..=ROUNDS {
                while round.load(Ordering::Acquire) != r {
                    std::hint::spin_loop();
                }
                let d = handed.lock().unwrap().take().expect("a description");
                s.release_description(d);
                closed.store(r, Ordering::Release);
            }
        });
        for r in 1..=ROUNDS {
            let f = s.open("/raced", &rw()).unwrap();
            f.write_all_at(b"data", 0).unwrap();
            *handed.lock().unwrap() = Some(s.describe_open(&f, libc::O_RDWR).unwrap());
            drop(f);
            round.store(r, Ordering::Release);
            s.unlink("/raced").unwrap();
            while closed.load(Ordering::Acquire) != r {
                std::hint::spin_loop();
            }
            let st = s.status();
            if (st.files, st.memory_used) != (0, 0) {
                leaked.push(r);
                s.fsck(true).unwrap();
            }
        }
    });
    assert!(
        leaked.is_empty(),
        "the file outlived its name and its last close in rounds {leaked:?}"
    );
    assert_clean(&s);
}

/// Creates and removals bump the versions of the directories above them (the agent's
/// checkpoint roots), but not the root's: nothing reads it, and it would be one cache line
/// every create in the store writes.
#[test]
fn creates_and_removals_leave_the_root_version_alone() {
    let s = store(64 * 4096, 4096, 0);
    s.create_dir_all("/ckpt/step1", 0o755).unwrap();
    let b = s.block();
    let version = |p: &str| {
        let ino = if p == "/" {
            crate::layout::ROOT_INO
        } else {
            s.stat(p).unwrap().ino as u32
        };
        b.inode(ino).mod_seq.load(Ordering::Acquire)
    };
    let (root, ckpt) = (version("/"), version("/ckpt"));
    s.open("/ckpt/step1/rank0", &rw())
        .unwrap()
        .write_all_at(b"state", 0)
        .unwrap();
    s.unlink("/ckpt/step1/rank0").unwrap();
    assert!(version("/ckpt") > ckpt, "the checkpoint's version moves");
    assert_eq!(version("/"), root, "the root's does not");
}

/// Two attachments (two lease slots, as two processes have) take free inodes a batch at a
/// time; when the shared stack runs dry the other's batch comes back to it, so every inode
/// of the table can still be created, and detaching returns a batch.
#[test]
fn inode_batches_never_hide_free_inodes() {
    let s = store(1 << 20, 4096, 0);
    let other = Store::attach(&s.name).unwrap();
    other.open("/theirs", &rw()).unwrap();
    let free_top = || s.block().header().free_inode_top.load(Ordering::Acquire);
    let before = free_top();
    s.open("/mine", &rw()).unwrap();
    assert_eq!(
        before - free_top(),
        crate::layout::INODE_BATCH as u32,
        "the first create takes a batch"
    );
    s.open("/mine2", &rw()).unwrap();
    assert_eq!(before - free_top(), crate::layout::INODE_BATCH as u32);
    assert_clean(&s);
    // 64 inodes with the root: all of them, though `other` holds a batch it never used.
    let mut made = 3;
    let err = loop {
        match s.open(&format!("/f{made}"), &rw()) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
    };
    assert_eq!((made, err.errno()), (63, libc::ENOSPC));
    assert_clean(&s);
    // Removals fill this attachment's batch, then the stack; detaching returns the batch.
    for i in 3..20 {
        s.unlink(&format!("/f{i}")).unwrap();
    }
    assert_clean(&s);
    other.unlink("/theirs").unwrap();
    let top = free_top();
    drop(other);
    assert_eq!(
        free_top(),
        top + 1,
        "the inode /theirs freed into its batch is back"
    );
    assert_clean(&s);
    let st = s.status();
    assert_eq!(st.files, 63 - 18);
}

#[test]
fn a_path_splits_into_its_components_on_the_stack_and_past_it() {
    use crate::namespace::{parse_path, ANCHOR};
    fn comps(p: &str) -> Result<Vec<&str>> {
        parse_path(p).map(|c| c.to_vec())
    }
    assert_eq!(comps("/").unwrap(), Vec::<&str>::new());
    assert_eq!(comps("//a/./b/../c/").unwrap(), ["a", "b", "..", "c"]);
    // More components than fit inline.
    let deep = "/d".repeat(40);
    assert_eq!(comps(&deep).unwrap(), vec!["d"; 40]);
    // An anchor may start the path, and only there; a NUL anywhere else is EINVAL.
    let anchored = format!("/{ANCHOR}12:3/x");
    assert_eq!(comps(&anchored).unwrap(), [&anchored[1..6], "x"]);
    for bad in [
        format!("/x/{ANCHOR}12:3"),
        "/a\0b".to_string(),
        format!("/{ANCHOR}1:1/a\0"),
    ] {
        assert_eq!(comps(&bad).unwrap_err().errno(), libc::EINVAL, "{bad:?}");
    }
    let long = "/".to_string() + &"x".repeat(4095);
    assert_eq!(comps(&long).unwrap_err().errno(), libc::ENAMETOOLONG);
}
