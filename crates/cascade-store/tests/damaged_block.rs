//! A damaged block is an error (EIO, "store block is damaged: ..."), never a panic, zeros or
//! another file's bytes. Each test builds a real store, damages chosen bytes of the block
//! through a second mapping of /dev/shm (offsets from docs/store-layout.md), and checks what
//! the store API returns and what fsck reports. No catch_unwind: a panic fails the test.

use cascade_store::{Error, OpenOptions, Prefault, Store, StoreConfig};
use memmap2::MmapMut;
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);
const CHUNK: u64 = 4096;
const MAX_FILES: u32 = 64;
/// An inode number far past the 64-inode table.
const FAR_INODE: u32 = 912_345;

// Header fields (docs/store-layout.md, "Header").
const H_OFF_INODES: usize = 72;
const H_OFF_CHUNK_STATES: usize = 80;
const H_OFF_NODES: usize = 96;
const H_OFF_FREE_INODES: usize = 128;
const H_OFF_LEASES: usize = 144;
/// Lease slot field (docs/store-layout.md, "Lease slot"): the count of its free inodes,
/// followed by the inodes.
const L_INODE_COUNT: usize = 144;
const H_OFF_HASH: usize = 136;
const H_FREE_INODE_TOP: usize = 1356;
// Inode record (704 bytes).
const INODE_SIZE: usize = 704;
const I_LINK: usize = 72;
const I_MAP: usize = 88;
const I_PREV_SIBLING: usize = 152;
/// A map node: 64 u32 entries of (id + 1).
const NODE_SIZE: usize = 256;

/// A store destroyed when the test ends, and a second, raw mapping of its block.
struct Damaged {
    store: Option<Store>,
    name: String,
    raw: MmapMut,
}

impl Drop for Damaged {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
    }
}

impl Damaged {
    fn new() -> Damaged {
        let name = format!(
            "/cascade-damaged-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cfg = StoreConfig {
            name: name.clone(),
            capacity: 1 << 20,
            chunk_size: CHUNK,
            max_files: MAX_FILES,
            spill: None,
            prefault: Prefault::Off,
        };
        let store = Store::create(&cfg).expect("create");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/dev/shm{name}"))
            .expect("open the block in /dev/shm");
        // SAFETY: a shared mapping of the test's own block; the store reads it through atomics
        // and this test writes single words while no other thread uses the store.
        let raw = unsafe { MmapMut::map_mut(&file) }.expect("map the block");
        Damaged {
            store: Some(store),
            name,
            raw,
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store")
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.raw[at..at + 4].try_into().expect("4 bytes"))
    }
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.raw[at..at + 8].try_into().expect("8 bytes"))
    }
    fn set_u32(&mut self, at: usize, v: u32) {
        self.raw[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn set_u64(&mut self, at: usize, v: u64) {
        self.raw[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// Where region `field` of the header's offset table starts.
    fn region(&self, field: usize) -> usize {
        self.u64_at(field) as usize
    }
    fn inode_at(&self, ino: u64) -> usize {
        self.region(H_OFF_INODES) + ino as usize * INODE_SIZE
    }
    fn ino(&self, path: &str) -> u64 {
        self.store().stat(path).expect("stat").ino
    }
    /// Points the parent link of `path` at inode `parent` (name length and slot kept).
    fn set_parent(&mut self, path: &str, parent: u32) {
        let at = self.inode_at(self.ino(path)) + I_LINK;
        self.set_u32(at, parent);
    }
    /// Offset of entry `slot` of the (single, leaf) map node of the file at `path`.
    fn leaf_entry(&self, path: &str, slot: usize) -> usize {
        let map = self.u64_at(self.inode_at(self.ino(path)) + I_MAP);
        assert_eq!(map >> 32, 1, "{path}: a one-level map");
        let root = (map as u32 - 1) as usize;
        self.region(H_OFF_NODES) + root * NODE_SIZE + slot * 4
    }
    fn chunk_state(&self, chunk: u32) -> usize {
        self.region(H_OFF_CHUNK_STATES) + chunk as usize * 8
    }
    fn fsck_errors(&self) -> Vec<String> {
        self.store().fsck(false).expect("fsck").errors
    }

    /// `cascade fsck` (without repairing) reports an error containing `what`.
    fn assert_fsck_reports(&self, what: &str) {
        let errors = self.fsck_errors();
        assert!(
            errors.iter().any(|e| e.contains(what)),
            "{what}: {errors:?}"
        );
    }
}

fn rw() -> OpenOptions {
    OpenOptions::new().read(true).write(true).create(true)
}

/// `r` failed with EIO, saying the block is damaged and naming `what`.
fn assert_damaged<T>(r: Result<T, Error>, what: &str) {
    let Err(err) = r else {
        panic!("an error, not a result (wanted {what:?})");
    };
    assert_eq!(err.errno(), libc::EIO, "{err}");
    assert!(
        err.context().starts_with("store block is damaged: "),
        "{err}"
    );
    assert!(err.context().contains(what), "{err} (wanted {what:?})");
}

fn write_file(d: &Damaged, path: &str, byte: u8, len: usize) {
    d.store()
        .open(path, &rw())
        .expect("create")
        .write_all_at(&vec![byte; len], 0)
        .expect("write");
}

/// The name index (the store's dentries) names an inode past the table.
#[test]
fn a_name_index_entry_past_the_inode_table_is_eio() {
    let mut d = Damaged::new();
    d.store().mkdir("/a", 0o755).expect("mkdir");
    write_file(&d, "/a/b", 1, 10);
    let ino = d.ino("/a/b") as u32;
    let hash = d.region(H_OFF_HASH);
    let slot = (0..128)
        .map(|i| hash + i * 4)
        .find(|&at| d.u32_at(at) == ino + 1)
        .expect("the index entry of /a/b");
    d.set_u32(slot, FAR_INODE + 1);
    let what = format!("(on the probe for /a/b) names inode {FAR_INODE}, past the 64 inodes");
    assert_damaged(d.store().stat("/a/b"), &what);
    assert_damaged(d.store().open("/a/b", &OpenOptions::new()), &what);
    assert_damaged(d.store().rename("/a/b", "/a/c"), "names inode 912345");
    d.assert_fsck_reports("names inode 912345");
}

/// A directory's entry list (sibling links) points past the inode table.
#[test]
fn a_directory_entry_list_past_the_inode_table_is_eio_on_rename_and_unlink() {
    let mut d = Damaged::new();
    d.store().mkdir("/d", 0o755).expect("mkdir");
    write_file(&d, "/d/x", 1, 10);
    write_file(&d, "/d/y", 2, 10);
    // /d lists y, then x: x's previous entry is y.
    let at = d.inode_at(d.ino("/d/x")) + I_PREV_SIBLING;
    d.set_u32(at, FAR_INODE);
    let what = "the entry before inode";
    assert_damaged(d.store().rename("/d/x", "/d/z"), what);
    assert_damaged(d.store().unlink("/d/x"), what);
    d.assert_fsck_reports(&format!("previous directory entry is inode {FAR_INODE}"));
    // Nothing was half done: the file keeps its name and data.
    let f = d.store().open("/d/x", &OpenOptions::new()).expect("open");
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, 0).expect("read"), 10);
    assert_eq!(buf, [1u8; 10]);
}

/// A map entry names a chunk that is another file's: reading it must not return that file's
/// bytes.
#[test]
fn a_map_entry_naming_another_files_chunk_reads_as_eio() {
    let mut d = Damaged::new();
    write_file(&d, "/f", 0xf, 2 * CHUNK as usize);
    write_file(&d, "/g", 0x9, 2 * CHUNK as usize);
    let g_chunk = d.u32_at(d.leaf_entry("/g", 1)) - 1;
    let f_entry = d.leaf_entry("/f", 1);
    d.set_u32(f_entry, g_chunk + 1);
    let f = d.store().open("/f", &OpenOptions::new()).expect("open");
    let mut buf = vec![0u8; CHUNK as usize];
    let g = d.ino("/g");
    assert_damaged(
        f.read_at(&mut buf, CHUNK),
        &format!("names chunk {g_chunk} at index 1, which is marked used by inode {g} at index 1"),
    );
    // The first chunk is still the file's own.
    assert_eq!(f.read_at(&mut buf, 0).expect("read"), CHUNK as usize);
    assert!(buf.iter().all(|&b| b == 0xf));
    assert_damaged(f.chunk_list(), "which is marked used by inode");
    d.assert_fsck_reports(&format!("chunk {g_chunk} at index 1"));
}

/// Removing a file whose map names another file's chunk frees only its own chunks: the
/// other file keeps its bytes even after new files take the freed space.
#[test]
fn removing_a_file_with_a_damaged_map_never_frees_another_files_chunk() {
    let mut d = Damaged::new();
    write_file(&d, "/f", 0xf, 2 * CHUNK as usize);
    write_file(&d, "/g", 0x9, 2 * CHUNK as usize);
    let g_chunk = d.u32_at(d.leaf_entry("/g", 1)) - 1;
    let f_entry = d.leaf_entry("/f", 1);
    d.set_u32(f_entry, g_chunk + 1);
    d.store().unlink("/f").expect("unlink");
    for i in 0..8 {
        write_file(&d, &format!("/h{i}"), 0x5, 2 * CHUNK as usize);
    }
    let g = d.store().open("/g", &OpenOptions::new()).expect("open");
    let mut buf = vec![0u8; 2 * CHUNK as usize];
    assert_eq!(g.read_at(&mut buf, 0).expect("read"), buf.len());
    assert!(buf.iter().all(|&b| b == 0x9), "/g lost its bytes");
    assert_eq!(d.fsck_errors(), Vec::<String>::new());
}

/// A map entry names a chunk past the chunk table: not a hole of zeros.
#[test]
fn a_map_entry_past_the_chunk_table_reads_as_eio() {
    let mut d = Damaged::new();
    write_file(&d, "/f", 0xf, 2 * CHUNK as usize);
    let entry = d.leaf_entry("/f", 1);
    d.set_u32(entry, 0x7fff_0000 + 1);
    let f = d.store().open("/f", &OpenOptions::new()).expect("open");
    let mut buf = vec![0u8; CHUNK as usize];
    assert_damaged(
        f.read_at(&mut buf, CHUNK),
        "names chunk 2147418112 at index 1, past the 256 chunks",
    );
    // A write there must not go anywhere either. (First a write to chunk 0: the file's
    // lock hints at the chunk last written, index 1 here, which a write uses without the
    // map while that chunk is still marked as the file's index 1.)
    let w = d
        .store()
        .open("/f", &OpenOptions::new().write(true))
        .expect("open");
    w.write_at(b"y", 0)
        .expect("a write to the undamaged chunk 0");
    assert_damaged(w.write_at(b"x", CHUNK + 1), "past the 256 chunks");
    d.assert_fsck_reports("which does not exist");
}

/// A chunk's state word says it is free (or some other file's): its owner is damaged.
#[test]
fn a_chunk_whose_owner_is_not_the_file_reads_as_eio() {
    let mut d = Damaged::new();
    write_file(&d, "/f", 0xf, 2 * CHUNK as usize);
    let chunk = d.u32_at(d.leaf_entry("/f", 1)) - 1;
    let state = d.chunk_state(chunk);
    let f = d.store().open("/f", &OpenOptions::new()).expect("open");
    let mut buf = vec![0u8; CHUNK as usize];
    d.set_u64(state, 0);
    assert_damaged(
        f.read_at(&mut buf, CHUNK),
        &format!("names chunk {chunk} at index 1, which is marked free"),
    );
    // USED(inode 7, index 1): another inode's.
    d.set_u64(state, (2 << 62) | (7 << 32) | 1);
    assert_damaged(
        f.read_at(&mut buf, CHUNK),
        "which is marked used by inode 7 at index 1",
    );
    d.assert_fsck_reports("is in its map but marked used by inode 7");
}

/// Parent links that loop (a's parent is b, b's is a): "..", the path of a file and the
/// rename check walk up them.
#[test]
fn parent_links_that_loop_are_eio_for_paths_and_renames() {
    let mut d = Damaged::new();
    let s = d.store();
    s.create_dir_all("/a/b", 0o755).expect("mkdir");
    s.mkdir("/x", 0o755).expect("mkdir");
    let f = s.open("/a/b/f", &rw()).expect("create");
    let dir_b = s
        .open("/a/b", &OpenOptions::new().directory(true))
        .expect("open /a/b");
    let b = d.ino("/a/b") as u32;
    d.set_parent("/a", b);
    let s = d.store();
    assert_damaged(f.current_path(), "loop through inode");
    // Moving /x under b would hang the tree off the loop.
    assert_damaged(s.rename("/x", &dir_b.anchored("y")), "loop through inode");
    d.assert_fsck_reports("directory cycle");
}

/// A parent link past the inode table: ".." and the path of a file below it.
#[test]
fn a_parent_link_past_the_inode_table_is_eio_for_dotdot_and_paths() {
    let mut d = Damaged::new();
    let s = d.store();
    s.create_dir_all("/a/b", 0o755).expect("mkdir");
    let f = s.open("/a/b/f", &rw()).expect("create");
    let dir_b = s
        .open("/a/b", &OpenOptions::new().directory(true))
        .expect("open /a/b");
    let a = d.ino("/a");
    d.set_parent("/a", FAR_INODE);
    let what =
        format!("the parent link of inode {a} (\"a\") names inode {FAR_INODE}, past the 64 inodes");
    let s = d.store();
    assert_damaged(s.stat(&dir_b.anchored("../..")), &what);
    assert_damaged(s.read_dir(&dir_b.anchored("../..")), &what);
    assert_damaged(f.current_path(), &what);
    d.assert_fsck_reports(&format!("parent {FAR_INODE} is not a live directory"));
}

/// The free-inode stack, or the batch of free inodes a process took from it, hands out an
/// inode that is in use: a create must not overwrite it.
#[test]
fn a_free_inode_stack_naming_a_live_inode_is_eio_on_create() {
    let mut d = Damaged::new();
    write_file(&d, "/keep", 7, 10);
    let live = d.ino("/keep") as u32;
    // The first create took a batch into the store's lease slot (slot 0): its next inode.
    let batch = d.region(H_OFF_LEASES) + L_INODE_COUNT;
    let count = d.u32_at(batch) as usize;
    assert!(count > 0, "the first create left inodes in the batch");
    d.set_u32(batch + 4 * count, live);
    assert_damaged(
        d.store().open("/new", &rw()),
        &format!("lease slot 0's free inodes name inode {live}, which is in use"),
    );
    // An empty batch is refilled from the stack, whose top names the live inode too.
    d.set_u32(batch, 0);
    let top = d.u32_at(H_FREE_INODE_TOP) as usize;
    let at = d.region(H_OFF_FREE_INODES) + (top - 1) * 4;
    d.set_u32(at, live);
    assert_damaged(
        d.store().open("/new", &rw()),
        &format!("the free-inode stack names inode {live}, which is in use"),
    );
    let f = d.store().open("/keep", &OpenOptions::new()).expect("open");
    let mut buf = [0u8; 10];
    assert_eq!(f.read_at(&mut buf, 0).expect("read"), 10);
    assert_eq!(buf, [7u8; 10]);
}
