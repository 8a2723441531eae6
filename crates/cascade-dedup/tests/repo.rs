//! The content-addressed repository on a real durable store (a directory): a series of
//! checkpoints is written and restored byte for byte; unchanged data is stored once;
//! compressible data is compressed; a reopened repository dedups against what earlier
//! sessions wrote; a writer dropped before `finish` (a crash), or killed with SIGKILL while
//! its packs are being written, leaves earlier checkpoints intact, no manifest and no torn
//! pack under a pack's name; every corruption of a pack or an index is reported, never
//! returned as data.

use std::sync::Arc;

use cascade_dedup::repo::{FileRecipe, Repo, DEFAULT_PREFIX};
use cascade_dedup::{Chunking, Compression};
use cascade_durable::DurableStore;
use cascade_testkit::{compressible, random};

const MIB: usize = 1 << 20;

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    durable: Arc<DurableStore>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let durable = Arc::new(DurableStore::open(root.to_str().expect("utf-8")).expect("open"));
    Fixture {
        _dir: dir,
        root,
        durable,
    }
}

fn open(f: &Fixture, chunking: &str, compression: &str) -> Repo {
    Repo::open(
        f.durable.clone(),
        DEFAULT_PREFIX,
        chunking.parse::<Chunking>().expect("chunking"),
        compression.parse::<Compression>().expect("compression"),
    )
    .expect("open repo")
}

fn restore(repo: &Repo, r: &FileRecipe) -> Vec<u8> {
    let mut out = Vec::new();
    repo.restore_file(r, &mut out)
        .unwrap_or_else(|e| panic!("restore {}: {e}", r.path));
    out
}

fn write_checkpoint(
    repo: &Repo,
    name: &str,
    files: &[(&str, &[u8])],
) -> cascade_dedup::repo::WriteStats {
    let mut w = repo.writer();
    let recipes: Vec<FileRecipe> = files
        .iter()
        .map(|(p, d)| w.add_file(p, *d).expect("add_file"))
        .collect();
    let stats = w.finish().expect("finish");
    repo.write_manifest(name, recipes).expect("manifest");
    stats
}

fn assert_restores(repo: &Repo, name: &str, files: &[(&str, &[u8])]) {
    let m = repo
        .read_manifest(name)
        .expect("read manifest")
        .unwrap_or_else(|| panic!("no manifest for {name}"));
    assert_eq!(m.files.len(), files.len());
    for (r, (path, data)) in m.files.iter().zip(files) {
        assert_eq!(r.path, *path);
        assert!(restore(repo, r) == *data, "{name}/{path} differs");
    }
}

#[test]
fn a_series_restores_and_repeats_are_stored_once() {
    let f = fixture();
    let repo = open(&f, "cdc:avg=16KiB", "zstd:1").with_pack_size(MIB);
    let base = random(3 * MIB + 17, 1);
    let empty: Vec<u8> = Vec::new();
    let small = b"tiny".to_vec();
    // Snapshot 2: the same file with 64 KiB changed in the middle, and a copy of itself.
    let mut changed = base.clone();
    changed[MIB..MIB + 65536].copy_from_slice(&random(65536, 2));

    let s1 = write_checkpoint(
        &repo,
        "ck/1",
        &[("a.bin", &base), ("empty", &empty), ("small", &small)],
    );
    assert_eq!(s1.bytes, (base.len() + small.len()) as u64);
    assert_eq!(s1.new_bytes, s1.bytes, "first snapshot: all new");
    assert!(s1.packs >= 3, "1 MiB packs: {s1:?}");

    let s2 = write_checkpoint(&repo, "ck/2", &[("a.bin", &changed), ("copy", &changed)]);
    assert_eq!(s2.bytes, 2 * changed.len() as u64);
    // CDC: only the chunks around the changed 64 KiB are new (a few average chunks each
    // side), and the copy costs nothing.
    assert!(
        s2.new_bytes < 256 * 1024,
        "a 64 KiB change stored {} new bytes",
        s2.new_bytes
    );

    // Identical again: no new data at all, only nothing.
    let s3 = write_checkpoint(&repo, "ck/3", &[("a.bin", &changed)]);
    assert_eq!(
        (s3.new_chunks, s3.stored_tree_bytes, s3.packs),
        (0, 0, 0),
        "{s3:?}"
    );

    assert_restores(
        &repo,
        "ck/1",
        &[("a.bin", &base), ("empty", &empty), ("small", &small)],
    );
    assert_restores(&repo, "ck/2", &[("a.bin", &changed), ("copy", &changed)]);
    assert_restores(&repo, "ck/3", &[("a.bin", &changed)]);
    assert!(repo.read_manifest("ck/none").expect("read").is_none());

    // A reopened repository knows every blob and dedups against them.
    let again = open(&f, "cdc:avg=16KiB", "zstd:1");
    assert_eq!(again.blob_count(), repo.blob_count());
    assert_restores(&again, "ck/2", &[("a.bin", &changed), ("copy", &changed)]);
    let s4 = write_checkpoint(&again, "ck/4", &[("b.bin", &base)]);
    assert_eq!(s4.new_chunks, 0, "{s4:?}");
}

#[test]
fn compression_pays_where_it_can_and_is_skipped_where_it_cannot() {
    let f = fixture();
    let repo = open(&f, "fixed:64KiB", "zstd:1");
    let doubles = compressible(4 * MIB, 7);
    let noise = random(4 * MIB, 8);
    let s = write_checkpoint(&repo, "mixed", &[("doubles", &doubles)]);
    assert!(
        s.stored_data_bytes * 2 < s.new_bytes,
        "small integers as doubles should compress 2x or better: {s:?}"
    );
    let s = write_checkpoint(&repo, "noise", &[("noise", &noise)]);
    assert_eq!(
        s.stored_data_bytes, s.new_bytes,
        "noise is stored raw: {s:?}"
    );
    assert_restores(&repo, "mixed", &[("doubles", &doubles)]);
    assert_restores(&repo, "noise", &[("noise", &noise)]);
}

#[test]
fn a_file_of_many_chunks_gets_a_deep_tree() {
    let f = fixture();
    // 512-byte chunks: 3 MiB is 6144 leaves, more than one 1024-entry block: two levels.
    let repo = open(&f, "fixed:512", "none");
    let data = random(3 * MIB + 100, 9);
    write_checkpoint(&repo, "deep", &[("d", &data)]);
    assert_restores(&repo, "deep", &[("d", &data)]);
}

#[test]
fn a_crash_before_finish_leaves_no_manifest_and_earlier_checkpoints_intact() {
    let f = fixture();
    let repo = open(&f, "cdc:avg=16KiB", "zstd:1").with_pack_size(256 * 1024);
    let one = random(2 * MIB, 10);
    write_checkpoint(&repo, "ck/1", &[("a", &one)]);
    {
        let mut w = repo.writer();
        w.add_file("b", random(2 * MIB, 11).as_slice())
            .expect("add");
        // Dropped: packs were written, the index object was not.
    }
    let reopened = open(&f, "cdc:avg=16KiB", "zstd:1");
    assert_restores(&reopened, "ck/1", &[("a", &one)]);
    assert!(reopened.read_manifest("ck/2").expect("read").is_none());
    // A manifest naming blobs no index object has is refused (the crash-safe order,
    // enforced), also in the process whose writer failed after writing packs.
    let mut w = reopened.writer().with_pack_size(64 * 1024);
    let r = w.add_file("c", random(MIB, 12).as_slice()).expect("add");
    drop(w);
    let e = reopened
        .write_manifest("ck/3", vec![r.clone()])
        .unwrap_err();
    assert!(e.to_string().contains("in no index"), "{e}");
    // ... and a later writer in that process stores those chunks again rather than
    // pointing at packs no index names.
    let mut w = reopened.writer();
    let again = w.add_file("c", random(MIB, 12).as_slice()).expect("add");
    let stats = w.finish().expect("finish");
    assert_eq!(stats.new_bytes, MIB as u64, "{stats:?}");
    reopened
        .write_manifest("ck/3", vec![again])
        .expect("manifest");
    let fresh = open(&f, "cdc:avg=16KiB", "zstd:1");
    assert_restores(&fresh, "ck/3", &[("c", &random(MIB, 12))]);
}

#[test]
fn corruption_is_reported_never_returned() {
    let f = fixture();
    let repo = open(&f, "fixed:64KiB", "zstd:1");
    let data = compressible(MIB, 13);
    write_checkpoint(&repo, "ck", &[("x", &data)]);
    let m = repo.read_manifest("ck").expect("read").expect("manifest");

    // Flip one byte in the middle of every pack.
    let packs_dir = f.root.join(DEFAULT_PREFIX).join("packs");
    let mut flipped = 0;
    for sub in std::fs::read_dir(&packs_dir).expect("packs") {
        for pack in std::fs::read_dir(sub.expect("entry").path()).expect("pack dir") {
            let path = pack.expect("pack").path();
            let mut bytes = std::fs::read(&path).expect("read pack");
            let at = bytes.len() / 3;
            bytes[at] ^= 0x40;
            std::fs::write(&path, bytes).expect("write pack");
            flipped += 1;
        }
    }
    assert!(flipped > 0);
    let mut out = Vec::new();
    let e = repo.restore_file(&m.files[0], &mut out).unwrap_err();
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert_eq!(e.errno(), 5);

    // A damaged index object is refused when the repository is opened.
    let index_dir = f.root.join(DEFAULT_PREFIX).join("index");
    for entry in std::fs::read_dir(&index_dir).expect("index dir") {
        let path = entry.expect("entry").path();
        let mut bytes = std::fs::read(&path).expect("read index");
        bytes.push(0);
        std::fs::write(&path, bytes).expect("write index");
    }
    let e = Repo::open(
        f.durable.clone(),
        DEFAULT_PREFIX,
        Chunking::cdc_with_avg(64 << 10),
        Compression::None,
    )
    .err()
    .expect("a damaged index must be refused");
    assert!(e.to_string().contains("do not hash to its name"), "{e}");
}

/// The sizes of the pack objects in the repository, smallest first.
fn pack_sizes(f: &Fixture) -> Vec<u64> {
    let mut sizes = Vec::new();
    let packs = f.root.join(DEFAULT_PREFIX).join("packs");
    for dir in std::fs::read_dir(&packs).expect("packs/") {
        for pack in std::fs::read_dir(dir.expect("entry").path()).expect("packs/<hh>/") {
            sizes.push(pack.expect("entry").metadata().expect("stat").len());
        }
    }
    sizes.sort_unstable();
    sizes
}

#[test]
fn a_writer_starts_with_small_packs_and_many_packs_restore_in_order() {
    let f = fixture();
    let repo = open(&f, "fixed:16KiB", "none").with_pack_size(MIB);
    // Incompressible and without repeats: every chunk goes into a pack as it is.
    let data = random(12 * MIB, 7);
    let stats = write_checkpoint(&repo, "ck", &[("big", &data)]);
    let sizes = pack_sizes(&f);
    assert_eq!(sizes.len() as u64, stats.packs);
    // The first three packs fill to an eighth, a quarter and half of the pack size (plus the
    // chunk that crossed the mark, and the trailer), the others to the pack size, but the
    // last (what was left).
    let full = MIB as u64;
    let near = |size: u64, target: u64| size >= target && size < target + 64 * 1024;
    for target in [full / 8, full / 4, full / 2] {
        assert!(
            sizes.iter().any(|s| near(*s, target)),
            "no ~{target} in {sizes:?}"
        );
    }
    let full_packs = sizes.iter().filter(|s| near(**s, full)).count();
    assert!(full_packs >= sizes.len() - 4, "{sizes:?}");
    // Written by two upload threads at once: the index still names each pack's own blobs.
    assert_restores(&repo, "ck", &[("big", &data)]);
    let reopened = open(&f, "fixed:16KiB", "none");
    assert_restores(&reopened, "ck", &[("big", &data)]);
}

const KILL_DIR: &str = "CASCADE_REPO_TEST_KILL_DIR";

/// The child of the SIGKILL test (does nothing in a normal run): in the directory store
/// $CASCADE_REPO_TEST_KILL_DIR, writes checkpoint `ck/1` to the end (its manifest), says so,
/// then adds a file of `ck/2` in small packs, says so while its uploader threads may still be
/// writing packs, and blocks until the parent kills it.
#[test]
fn killed_writer_child() {
    let Ok(dir) = std::env::var(KILL_DIR) else {
        return;
    };
    let durable = Arc::new(DurableStore::open(&dir).expect("open"));
    let repo = Repo::open(
        durable,
        DEFAULT_PREFIX,
        "fixed:64KiB".parse::<Chunking>().expect("chunking"),
        "zstd:1".parse::<Compression>().expect("compression"),
    )
    .expect("open repo")
    .with_pack_size(256 * 1024);
    write_checkpoint(&repo, "ck/1", &[("a", &compressible(4 * MIB, 20))]);
    println!("DONE ck/1");
    let mut w = repo.writer();
    w.add_file("b", random(8 * MIB, 21).as_slice())
        .expect("add");
    println!("PACKS ck/2");
    let mut line = String::new();
    // The parent never writes: this blocks until SIGKILL.
    let _ = std::io::stdin().read_line(&mut line);
    std::process::abort();
}

/// A writer killed with SIGKILL between its pack writes and its index and manifest: the
/// repository opens, the checkpoint it reported done restores byte for byte, the one it was
/// writing has no manifest, every pack under its name is whole (its BLAKE3 is its name: a
/// torn write is only ever a staging file `<id>#<n>`, which listings skip), and the
/// checkpoint can be written again.
#[test]
fn a_writer_killed_between_pack_writes_and_its_index_loses_nothing_reported_done() {
    use std::io::BufRead;
    let f = fixture();
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "killed_writer_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(KILL_DIR, &f.root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut said = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("child stdout");
        if line.contains("DONE ck/1") {
            said.push("done");
        }
        // The harness prints "test killed_writer_child ... " before the child's own output.
        if line.contains("PACKS ck/2") {
            said.push("packs");
            break;
        }
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(said, ["done", "packs"], "child: {status:?}");

    let repo = open(&f, "fixed:64KiB", "zstd:1");
    assert_restores(&repo, "ck/1", &[("a", &compressible(4 * MIB, 20))]);
    assert!(repo.read_manifest("ck/2").expect("read").is_none());
    let packs_dir = f.root.join(DEFAULT_PREFIX).join("packs");
    let mut whole = 0;
    for sub in std::fs::read_dir(&packs_dir).expect("packs") {
        for pack in std::fs::read_dir(sub.expect("entry").path()).expect("pack dir") {
            let path = pack.expect("pack").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string();
            if name.contains('#') {
                continue; // a staging file: never read
            }
            let bytes = std::fs::read(&path).expect("read pack");
            assert_eq!(blake3::hash(&bytes).to_hex().as_str(), name, "torn pack");
            whole += 1;
        }
    }
    assert!(whole > 1, "{whole} packs");
    let b = random(8 * MIB, 21);
    write_checkpoint(&repo, "ck/2", &[("b", &b)]);
    let fresh = open(&f, "fixed:64KiB", "zstd:1");
    assert_restores(&fresh, "ck/2", &[("b", &b)]);
    assert_restores(&fresh, "ck/1", &[("a", &compressible(4 * MIB, 20))]);
}

/// A writer whose packs and index object go elsewhere (`with_sink`: here a second directory
/// store standing for a staging server) leaves the durable store untouched; its session is
/// renewed while its manifest waits (`renew_parked`) and ends once it is written; the next
/// writer of the process still dedups against its blobs although a refresh of the index
/// does not find its index object in the durable store; the prepared manifest, once its
/// objects are copied over in the crash-safe order, restores bit for bit from a repository
/// opened afresh.
#[test]
fn a_writer_staging_its_objects_elsewhere_is_deduplicated_against_and_restores_once_moved() {
    let f = fixture();
    let staging_dir = tempfile::tempdir().expect("tempdir");
    let staging = Arc::new(
        DurableStore::open(staging_dir.path().to_str().expect("utf-8")).expect("staging store"),
    );
    let lease = std::time::Duration::from_secs(4);
    let repo = open(&f, "fixed:64KiB", "zstd:1").with_session_lease(lease);
    let a = random(MIB, 71);
    let b = random(MIB / 2, 72);

    let mut w = repo
        .writer()
        .with_sink(staging.clone() as Arc<dyn cascade_dedup::repo::ObjectSink>);
    let recipe_a = w.add_file("a.bin", &a[..]).expect("add a");
    assert!(w.finish().expect("finish").packs >= 1);
    let (key, bytes, manifest) = repo
        .prepare_manifest("ck.1", vec![recipe_a.clone()], false)
        .expect("prepare");
    staging.put_bytes(&key, &bytes).expect("stage the manifest");
    assert!(
        !f.root.join(DEFAULT_PREFIX).join("packs").exists()
            && f.durable
                .list(&format!("{DEFAULT_PREFIX}/index"))
                .expect("list")
                .is_empty()
            && !f.root.join(&key).exists(),
        "the durable store got objects of a staged writer"
    );

    // While the server drains, the writer's session (in the durable store) is renewed.
    let refreshed = || -> Vec<(String, u64)> {
        let sessions = f
            .durable
            .list(&format!("{DEFAULT_PREFIX}/sessions"))
            .expect("list");
        sessions
            .into_iter()
            .map(|o| {
                let text = f.durable.get_bytes(&o.path).expect("session");
                let v: serde_json::Value = serde_json::from_slice(&text).expect("json");
                let at = v["refreshed_unix_ns"].as_u64().expect("refreshed_unix_ns");
                (o.path, at)
            })
            .collect()
    };
    let before = refreshed();
    assert_eq!(before.len(), 1, "the staged writer's session is open");
    // An eighth of the lease must go by before a renewal writes.
    std::thread::sleep(lease / 8 + std::time::Duration::from_millis(20));
    repo.renew_parked().expect("renew");
    let after = refreshed();
    assert!(
        after.len() == 1 && after[0].0 == before[0].0 && after[0].1 > before[0].1,
        "{before:?} -> {after:?}"
    );

    // A new session lists `index/` in the durable store and finds nothing of ck.1.
    assert_eq!(repo.refresh_index().expect("refresh"), 0);
    let mut w = repo.writer();
    w.add_file("a.bin", &a[..]).expect("add a again");
    w.add_file("b.bin", &b[..]).expect("add b");
    let stats = w.finish().expect("finish");
    assert_eq!(
        stats.new_bytes,
        b.len() as u64,
        "a.bin was stored again: {stats:?}"
    );

    // The server's drain: packs, then the index object, then the manifest.
    let staged = staging.list(DEFAULT_PREFIX).expect("list staged");
    let rank = |path: &str| {
        ["/packs/", "/index/", "/manifests/"]
            .iter()
            .position(|k| path.contains(k))
    };
    let mut staged: Vec<String> = staged.into_iter().map(|o| o.path).collect();
    staged.sort_by_key(|p| rank(p));
    assert!(staged.iter().all(|p| rank(p).is_some()), "{staged:?}");
    for path in &staged {
        let object = staging.get_bytes(path).expect("get");
        f.durable.put_bytes(path, &object).expect("put");
    }
    repo.manifest_written(&manifest).expect("written");
    repo.wait_session_ends();
    let left: Vec<String> = refreshed().into_iter().map(|(path, _)| path).collect();
    assert!(
        !left.contains(&before[0].0),
        "the staged writer's session ended: {left:?}"
    );
    // Seen in the durable store now: a refresh keeps it, nothing is reloaded.
    assert_eq!(repo.refresh_index().expect("refresh"), 0);

    let fresh = open(&f, "fixed:64KiB", "zstd:1");
    let read = fresh
        .read_manifest("ck.1")
        .expect("read")
        .expect("manifest");
    assert_eq!(read.files, manifest.files);
    assert!(restore(&fresh, &read.files[0]) == a);
}
