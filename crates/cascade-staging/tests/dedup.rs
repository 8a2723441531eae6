//! Dedup through staging servers (docs/staging.md, "Dedup through the servers"), with real
//! servers on 127.0.0.1 — in this process, or as separate processes killed with SIGKILL —
//! and a real directory as the durable store. The tests play the agent: they cut files into
//! chunks and recipe blocks with cascade-dedup, route each score to the server that owns it
//! (`owner_of`), ask it what it lacks, send only that, and record the manifest. No mocks;
//! every wait polls a server's status (or the durable store) with a deadline.
//!
//! 1. two servers: each blob is sent once, to its owner, even when two checkpoints share it;
//!    both servers push packs and index objects; the manifest stays pending until the last
//!    blob it names is indexed, and every file restores bit for bit from the repository;
//! 2. a chunk whose bytes do not match its score is refused and nothing of its frame stored;
//! 3. a server killed with SIGKILL after acknowledging chunks and a manifest it could not
//!    push (a broken durable store), with a torn record appended to its log: restarted, it
//!    serves every acknowledged chunk and the manifest; restarted with a good store, it
//!    pushes them all and writes the manifest;
//! 4. GetChunks and GetManifest answer before the push and after it;
//! 5. `owner_of` moves about a quarter of the scores when a fourth server joins three;
//! 6. delta chunks: one on a base the repository lacks, or whose frame has the wrong length,
//!    is refused with nothing of its frame stored; good ones are stored, served back and
//!    pushed as deltas, and the checkpoint restores bit for bit.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cascade_dedup::ingest::Packed;
use cascade_dedup::repo::format::{decode_index, decode_pack_trailer, recipe_blocks};
use cascade_dedup::repo::{undo_delta, FileBase, FileRecipe, Repo, DEFAULT_PREFIX};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Chunking, Compression, Score};
use cascade_durable::DurableStore;
use cascade_staging::chunks::ChunkOptions;
use cascade_staging::protocol::{code, delta_data, BlobKind, ManifestState, Stored, WireChunk};
use cascade_staging::{
    owner_of, ClientOptions, Connection, Error, Server, ServerOptions, ServerStatus, Stopper,
};
use cascade_testkit::{compressible, random};
use common::{ServerProcess, SECRET};

const DEADLINE: Duration = Duration::from_secs(60);

// ---- the agent's side, played by the test ----

/// A blob as the agent sends it.
struct Blob {
    score: Score,
    kind: BlobKind,
    raw: Vec<u8>,
    stored: Stored,
    data: Vec<u8>,
}

impl Blob {
    fn new(kind: BlobKind, raw: Vec<u8>, compression: Compression) -> Blob {
        let (stored, data) = match compression.compress(&raw) {
            Some(frame) => (Stored::Zstd, frame),
            None => (Stored::Raw, raw.clone()),
        };
        Blob {
            score: score(&raw),
            kind,
            raw,
            stored,
            data,
        }
    }

    fn wire(&self) -> WireChunk<'_> {
        WireChunk {
            score: self.score,
            kind: self.kind,
            stored: self.stored,
            raw_len: self.raw.len() as u32,
            data: &self.data,
        }
    }
}

/// A checkpoint cut into blobs: its files, their recipes, and every distinct blob.
struct Cut {
    name: String,
    files: Vec<(String, Vec<u8>)>,
    recipes: Vec<FileRecipe>,
    blobs: Vec<Blob>,
}

const CHUNKING: &str = "cdc:avg=16KiB";
const COMPRESSION: &str = "zstd:1";

fn cut(name: &str, files: Vec<(String, Vec<u8>)>) -> Cut {
    let chunking: Chunking = CHUNKING.parse().unwrap();
    let compression: Compression = COMPRESSION.parse().unwrap();
    let mut seen = HashSet::new();
    let mut blobs = Vec::new();
    let mut recipes = Vec::new();
    let mut add = |kind, raw: Vec<u8>| {
        if seen.insert(score(&raw)) {
            blobs.push(Blob::new(kind, raw, compression));
        }
    };
    for (path, data) in &files {
        let mut leaves = Vec::new();
        for range in chunking.split(data) {
            let chunk = data[range].to_vec();
            leaves.push((score(&chunk), chunk.len() as u64));
            add(BlobKind::Data, chunk);
        }
        let (root, blocks) = recipe_blocks(&leaves);
        for (_, bytes) in blocks {
            add(BlobKind::Tree, bytes);
        }
        recipes.push(FileRecipe {
            path: path.clone(),
            size: data.len() as u64,
            blake3: blake3::hash(data).to_hex().to_string(),
            root: to_hex(&root),
        });
    }
    Cut {
        name: name.to_string(),
        files,
        recipes,
        blobs,
    }
}

impl Cut {
    fn scores(&self) -> Vec<Score> {
        self.blobs.iter().map(|b| b.score).collect()
    }
}

/// Asks each server (of `names`, reached through `conns`) about the blobs it owns, among
/// those for which `include(owner)` holds, and sends it the ones it lacks. Returns the blobs
/// sent per server.
fn send_blobs(
    conns: &mut [Connection],
    names: &[&str],
    blobs: &[Blob],
    include: impl Fn(usize) -> bool,
) -> Vec<Vec<Score>> {
    let mut by_owner: Vec<Vec<&Blob>> = vec![Vec::new(); names.len()];
    for b in blobs {
        by_owner[owner_of(&b.score, names)].push(b);
    }
    let mut sent = vec![Vec::new(); names.len()];
    for (i, owned) in by_owner.iter().enumerate() {
        if !include(i) || owned.is_empty() {
            continue;
        }
        let scores: Vec<Score> = owned.iter().map(|b| b.score).collect();
        let lacks = conns[i].lacks(&scores).unwrap();
        let wire: Vec<WireChunk> = owned
            .iter()
            .zip(&lacks)
            .filter(|(_, l)| **l)
            .map(|(b, _)| b.wire())
            .collect();
        let report = conns[i].put_chunks(&wire).unwrap();
        assert_eq!(
            (report.stored, report.present),
            (wire.len() as u64, 0),
            "server {i} stored something else than what it lacked"
        );
        sent[i] = wire.iter().map(|w| w.score).collect();
    }
    sent
}

fn put_manifest(conn: &mut Connection, c: &Cut) {
    conn.put_manifest(
        &c.name,
        false,
        CHUNKING,
        COMPRESSION,
        &c.recipes,
        &c.scores(),
    )
    .unwrap();
}

/// Sends checkpoint `c` to the one server at `addr` (through `conn`): the blobs it lacks,
/// then the manifest.
fn send_checkpoint(conn: &mut Connection, addr: &str, c: &Cut) {
    send_blobs(std::slice::from_mut(conn), &[addr], &c.blobs, |_| true);
    put_manifest(conn, c);
}

/// Every file of `c` restores bit for bit from the repository at `durable_root`.
fn assert_restores(durable_root: &Path, c: &Cut) {
    let durable = Arc::new(DurableStore::open(durable_root.to_str().unwrap()).unwrap());
    let repo = Repo::open_existing(durable, DEFAULT_PREFIX)
        .unwrap()
        .expect("a repository");
    let manifest = repo.read_manifest(&c.name).unwrap().expect("its manifest");
    assert_eq!(manifest.files, c.recipes);
    assert_eq!(
        (manifest.chunking.as_str(), manifest.compression.as_str()),
        (CHUNKING, COMPRESSION)
    );
    for (recipe, (path, data)) in manifest.files.iter().zip(&c.files) {
        let mut out = Vec::new();
        repo.restore_file(recipe, &mut out)
            .unwrap_or_else(|e| panic!("restore {path}: {e}"));
        assert!(out == *data, "{path} restored different bytes");
    }
}

/// The blob entries of every index object of the repository at `repo_dir`, and checks that
/// every pack ends with a trailer listing exactly those entries.
fn repository_entries(repo_dir: &Path) -> Vec<Score> {
    let mut scores = Vec::new();
    let index_dir = repo_dir.join("index");
    for entry in std::fs::read_dir(&index_dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for (pack, entries) in decode_index(&bytes).unwrap() {
            let hex = to_hex(&pack);
            let pack_bytes = std::fs::read(repo_dir.join("packs").join(&hex[..2]).join(&hex))
                .unwrap_or_else(|e| panic!("pack {hex}: {e}"));
            assert_eq!(
                score(&pack_bytes),
                pack,
                "pack {hex} is not named by its hash"
            );
            assert_eq!(decode_pack_trailer(&pack_bytes).unwrap(), entries);
            scores.extend(entries.iter().map(|e| e.score));
        }
    }
    scores
}

// ---- servers ----

fn options(namespace: &str) -> ClientOptions {
    let mut o = ClientOptions::new(SECRET);
    o.namespace = namespace.to_string();
    o.io_timeout = DEADLINE;
    o
}

fn connect(addr: &str, namespace: &str) -> Connection {
    Connection::connect(addr, &options(namespace)).unwrap()
}

fn status(addr: &str) -> ServerStatus {
    let mut c = connect(addr, "");
    let s = c.status().unwrap();
    c.goodbye();
    s
}

/// Polls the server's status until `done` holds.
fn wait_for(addr: &str, what: &str, done: impl Fn(&ServerStatus) -> bool) -> ServerStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = status(addr);
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{addr}: {what} did not happen: {:#?}",
            s.dedup
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct InProcess {
    addr: String,
    stopper: Stopper,
    thread: Option<JoinHandle<cascade_staging::ServerResult<()>>>,
}

impl InProcess {
    fn start(dir: &Path, drain_to: &Path, segment_size: u64) -> InProcess {
        Self::start_tuned(dir, drain_to, segment_size, |_| {})
    }

    fn start_tuned(
        dir: &Path,
        drain_to: &Path,
        segment_size: u64,
        tune: impl FnOnce(&mut ServerOptions),
    ) -> InProcess {
        let mut opts = ServerOptions::new(
            "127.0.0.1:0",
            dir.to_path_buf(),
            drain_to.to_str().unwrap(),
            SECRET,
        );
        opts.buffers = 2;
        opts.chunks = ChunkOptions {
            segment_size,
            ..ChunkOptions::default()
        };
        tune(&mut opts);
        let server = Server::bind(opts).unwrap();
        let addr = server.local_addr().to_string();
        let stopper = server.stopper();
        let thread = Some(std::thread::spawn(move || server.run()));
        InProcess {
            addr,
            stopper,
            thread,
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(t) = self.thread.take() {
            let run = t.join().expect("server thread");
            if !std::thread::panicking() {
                run.expect("server run");
            }
        }
    }
}

impl ServerProcess {
    fn kill9(mut self) {
        let status = self.daemon.kill9();
        assert!(!status.success(), "{status}");
    }

    fn log(&self) -> String {
        self.daemon.log()
    }
}

/// The server processes of [`ServerProcess::start`] (common::serve_in_child), with 1 MiB
/// segments.
/// More than two push batches (32 MiB each) of chunks, while the repository turns
/// unwritable after it was opened: the rounds fail, and once it is back every chunk is
/// pushed exactly once (no record read twice, none skipped) and the manifest written. A
/// round goes on with the records waiting after its first batch, up to 64 MiB: 75 MiB take
/// two rounds, so two index objects, not one per batch.
#[test]
fn push_rounds_push_each_chunk_once_also_after_they_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let repo_dir = durable.join(DEFAULT_PREFIX);
    let srv = InProcess::start(&tmp.path().join("srv"), &durable, 16 << 20);
    let mut c = connect(&srv.addr, "");
    let warm = cut("warm", vec![("w.dat".into(), random(1 << 20, 30))]);
    send_checkpoint(&mut c, &srv.addr, &warm);
    wait_for(&srv.addr, "the first manifest was written", |s| {
        s.dedup.manifests_written == 1
    });

    // The open repository's directory gives way to a file: every pack upload fails.
    let away = tmp.path().join("repository-away");
    std::fs::rename(&repo_dir, &away).unwrap();
    block_repository(&repo_dir);
    let big = cut(
        "big",
        (0..3)
            .map(|i| (format!("part{i}.dat"), random(25 << 20, 31 + i)))
            .collect(),
    );
    send_checkpoint(&mut c, &srv.addr, &big);
    let s = wait_for(&srv.addr, "a push round failed", |s| {
        s.dedup.push_failures >= 1
    });
    assert_eq!(s.dedup.manifests_written, 1);
    assert_eq!(s.dedup.pending_manifests, 1);

    std::fs::remove_file(&repo_dir).unwrap();
    std::fs::rename(&away, &repo_dir).unwrap();
    let s = wait_for(&srv.addr, "the big manifest was written", |s| {
        s.dedup.manifests_written == 2
    });
    let n = (warm.blobs.len() + big.blobs.len()) as u64;
    assert_eq!((s.dedup.chunks_pushed, s.dedup.pending_chunks), (n, 0));
    let mut entries = repository_entries(&repo_dir);
    let listed = entries.len();
    entries.sort_unstable();
    entries.dedup();
    assert_eq!((listed as u64, entries.len() as u64), (n, n));
    let index_objects = std::fs::read_dir(repo_dir.join("index")).unwrap().count();
    assert_eq!(
        index_objects,
        1 + 2,
        "the warm checkpoint's, then two rounds"
    );
    assert_restores(&durable, &big);
    assert_restores(&durable, &warm);
    c.goodbye();
}

#[test]
fn child_server_process() {
    common::serve_in_child(|o| o.chunks.segment_size = 1 << 20, |_| {});
}

/// Makes every push to the repository at `repo_dir` fail (and every look at it): a file
/// takes its place. The durable store itself stays valid, so a server still starts on it.
fn block_repository(repo_dir: &Path) {
    if let Some(parent) = repo_dir.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(repo_dir, b"not a repository\n").unwrap();
}

fn unblock_repository(repo_dir: &Path) {
    std::fs::remove_file(repo_dir).unwrap();
}

// ---- the tests ----

#[test]
fn two_servers_store_each_blob_once_and_write_the_manifest_after_both_pushed() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let a = InProcess::start(&tmp.path().join("a"), &durable, 64 << 20);
    let b = InProcess::start(&tmp.path().join("b"), &durable, 64 << 20);
    let names = [a.addr.as_str(), b.addr.as_str()];
    let ns = "job7";
    let mut conns = vec![connect(&a.addr, ns), connect(&b.addr, ns)];

    let rank0 = random(3 << 20, 1);
    let rank1 = compressible(2 << 20, 2);
    let first = cut(
        "run/ckpt.1",
        vec![
            ("rank0.dat".into(), rank0.clone()),
            ("rank1.dat".into(), rank1.clone()),
            ("meta.json".into(), b"{\"step\": 1}".to_vec()),
            ("empty".into(), Vec::new()),
        ],
    );
    let owned: Vec<usize> = first
        .blobs
        .iter()
        .map(|b| owner_of(&b.score, &names))
        .collect();
    assert!(
        owned.contains(&0) && owned.contains(&1),
        "both servers own blobs"
    );
    assert!(first.blobs.iter().any(|b| b.stored == Stored::Zstd));
    assert!(first.blobs.iter().any(|b| b.stored == Stored::Raw));

    // Server A gets its blobs and the manifest; B has nothing yet.
    let sent_a = send_blobs(&mut conns, &names, &first.blobs, |i| i == 0);
    put_manifest(&mut conns[0], &first);
    let a_share = owned.iter().filter(|o| **o == 0).count() as u64;
    assert_eq!(sent_a[0].len() as u64, a_share);
    wait_for(&a.addr, "A pushed its blobs", |s| {
        s.dedup.chunks_pushed == a_share && s.dedup.pending_chunks == 0
    });
    // A pushed all it had, but the manifest names B's blobs too: it waits.
    let (state, pending) = conns[0].get_manifest(&first.name).unwrap().unwrap();
    assert_eq!(state, ManifestState::Pending);
    assert_eq!(pending.files, first.recipes);
    let manifest_object = durable
        .join(ns)
        .join(DEFAULT_PREFIX)
        .join("manifests/run/ckpt.1.json");
    assert!(!manifest_object.exists(), "written before B pushed");
    let sa = status(&a.addr);
    assert_eq!(
        (sa.dedup.pending_manifests, sa.dedup.manifests_written),
        (1, 0)
    );

    let sent_b = send_blobs(&mut conns, &names, &first.blobs, |i| i == 1);
    assert_eq!(sent_b[1].len() as u64, first.blobs.len() as u64 - a_share);
    let sa = wait_for(&a.addr, "A wrote the manifest", |s| {
        s.dedup.manifests_written == 1 && s.dedup.pending_manifests == 0
    });
    assert!(manifest_object.is_file());
    let sb = status(&b.addr);
    assert_eq!(sb.dedup.chunks_pushed, first.blobs.len() as u64 - a_share);
    assert_eq!(
        sa.dedup.chunks_absorbed + sb.dedup.chunks_absorbed,
        first.blobs.len() as u64
    );
    let (state, written) = conns[0].get_manifest(&first.name).unwrap().unwrap();
    assert_eq!(state, ManifestState::Written);
    assert_eq!(written.files, first.recipes);
    assert_restores(&durable.join(ns), &first);

    // The next checkpoint shares most of its data: only new blobs are lacking, and they are
    // sent once, to their owners.
    let mut rank0b = rank0.clone();
    rank0b[1 << 20..(1 << 20) + 100_000].copy_from_slice(&random(100_000, 3));
    let second = cut(
        "run/ckpt.2",
        vec![
            ("rank0.dat".into(), rank0b),
            ("rank1.dat".into(), rank1),
            ("meta.json".into(), b"{\"step\": 2}".to_vec()),
            ("copy.dat".into(), rank0[..1 << 20].to_vec()),
        ],
    );
    let old: HashSet<Score> = first.scores().into_iter().collect();
    let new: HashSet<Score> = second
        .scores()
        .into_iter()
        .filter(|s| !old.contains(s))
        .collect();
    assert!(
        !new.is_empty() && new.len() * 4 < second.blobs.len(),
        "{} new of {}",
        new.len(),
        second.blobs.len()
    );
    let sent = send_blobs(&mut conns, &names, &second.blobs, |_| true);
    let sent_all: HashSet<Score> = sent.iter().flatten().copied().collect();
    assert_eq!(sent_all, new, "Lacks asked for exactly the new blobs");
    assert_eq!(sent.iter().map(Vec::len).sum::<usize>(), new.len());
    put_manifest(&mut conns[1], &second);
    wait_for(&b.addr, "B wrote the second manifest", |s| {
        s.dedup.manifests_written == 1
    });
    assert_restores(&durable.join(ns), &second);
    assert_restores(&durable.join(ns), &first);

    // Every blob of both checkpoints is in the repository exactly once, in packs with
    // trailers, named by index objects, as docs/dedup.md lays them out.
    let entries = repository_entries(&durable.join(ns).join(DEFAULT_PREFIX));
    let distinct: HashSet<Score> = entries.iter().copied().collect();
    assert_eq!(entries.len(), distinct.len(), "a blob was pushed twice");
    let expected: HashSet<Score> = old.union(&new).copied().collect();
    assert_eq!(distinct, expected);
    let (sa, sb) = (status(&a.addr), status(&b.addr));
    assert_eq!(
        sa.dedup.chunks_pushed + sb.dedup.chunks_pushed,
        expected.len() as u64
    );
    assert_eq!(
        sa.dedup.chunks_deduplicated + sb.dedup.chunks_deduplicated,
        0
    );
    assert!(
        sa.dedup.chunk_bytes_stored < sa.dedup.chunk_bytes_raw,
        "{:?}",
        sa.dedup
    );
    assert!(sa.dedup.index_memory_bytes > 0);
    // Sending a blob again anyway is acknowledged without storing it.
    let again = conns[0].put_chunks(&[second.blobs[0].wire()]).unwrap();
    assert_eq!((again.stored, again.present), (0, 1));
    for c in conns {
        c.goodbye();
    }
}

/// Waits for `done` on the server at `addr` by Watch, not by polling: each look at its status
/// is followed by a Watch from the event counter it showed, which must move (a wait that runs
/// out is a failure: nothing happened that could make `done` hold).
fn watch_until(addr: &str, what: &str, done: impl Fn(&ServerStatus) -> bool) -> ServerStatus {
    let mut watcher = connect(addr, "");
    loop {
        let s = status(addr);
        if done(&s) {
            watcher.goodbye();
            return s;
        }
        let events = watcher.watch(s.events, DEADLINE).unwrap();
        assert!(
            events > s.events,
            "{addr}: {what}: no event within the wait: {s:#?}"
        );
    }
}

/// The servers' fallback timers are an hour: only notifications can complete the manifest.
/// B's push is an event its watcher hears; asking A for the pending manifest (GetManifest)
/// makes A load B's index objects and write it at once, another event.
#[test]
fn a_manifest_waiting_for_another_servers_blobs_is_written_when_asked_after_its_push() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let hour = |o: &mut ServerOptions| o.recheck_every = Duration::from_secs(3600);
    let a = InProcess::start_tuned(&tmp.path().join("a"), &durable, 64 << 20, hour);
    let b = InProcess::start_tuned(&tmp.path().join("b"), &durable, 64 << 20, hour);
    let names = [a.addr.as_str(), b.addr.as_str()];
    let ns = "job9";
    let mut conns = vec![connect(&a.addr, ns), connect(&b.addr, ns)];
    let ckpt = cut(
        "run/ckpt.1",
        vec![
            ("rank0.dat".into(), random(2 << 20, 11)),
            ("rank1.dat".into(), compressible(1 << 20, 12)),
        ],
    );
    let owned: Vec<usize> = ckpt
        .blobs
        .iter()
        .map(|b| owner_of(&b.score, &names))
        .collect();
    let a_share = owned.iter().filter(|o| **o == 0).count() as u64;
    let b_share = ckpt.blobs.len() as u64 - a_share;
    assert!(a_share > 0 && b_share > 0, "both servers own blobs");

    send_blobs(&mut conns, &names, &ckpt.blobs, |i| i == 0);
    put_manifest(&mut conns[0], &ckpt);
    watch_until(&a.addr, "A pushed its blobs", |s| {
        s.dedup.chunks_pushed == a_share
    });
    send_blobs(&mut conns, &names, &ckpt.blobs, |i| i == 1);
    let sb = watch_until(&b.addr, "B pushed its blobs", |s| {
        s.dedup.chunks_pushed == b_share
    });
    assert!(sb.watch_wakeups > 0, "{sb:#?}");

    // Asked for it, A looks again at once (whatever it answers now).
    let mut watcher = connect(&a.addr, "");
    let before = status(&a.addr);
    let state = conns[0].get_manifest(&ckpt.name).unwrap().map(|(s, _)| s);
    if state != Some(ManifestState::Written) {
        assert_eq!(state, Some(ManifestState::Pending));
        let events = watcher.watch(before.events, DEADLINE).unwrap();
        assert!(events > before.events, "no event after GetManifest");
    }
    let sa = watch_until(&a.addr, "A wrote the manifest", |s| {
        s.dedup.manifests_written == 1
    });
    let (state, _) = conns[0].get_manifest(&ckpt.name).unwrap().unwrap();
    assert_eq!(state, ManifestState::Written);
    assert!(sa.asked_rechecks >= 1, "{sa:#?}");
    assert_eq!(
        (sa.timed_rechecks, sb.timed_rechecks),
        (0, 0),
        "a fallback timer looked"
    );
    assert_restores(&durable.join(ns), &ckpt);
    watcher.goodbye();
    for c in conns {
        c.goodbye();
    }
}

#[test]
fn a_chunk_that_does_not_match_its_score_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let srv = InProcess::start(&tmp.path().join("srv"), &durable, 1 << 20);
    let good = Blob::new(BlobKind::Data, random(5000, 1), Compression::None);
    let other = random(5000, 2);
    let squeezable = Blob::new(
        BlobKind::Data,
        compressible(20_000, 3),
        "zstd:1".parse().unwrap(),
    );
    assert_eq!(squeezable.stored, Stored::Zstd);
    let frame_of_other = "zstd:1"
        .parse::<Compression>()
        .unwrap()
        .compress(&compressible(20_000, 4))
        .unwrap();
    let wrong_score = WireChunk {
        data: &other,
        ..good.wire()
    };
    let zstd_of_other = WireChunk {
        data: &frame_of_other,
        ..squeezable.wire()
    };
    let zstd_garbage = WireChunk {
        data: &other[..100],
        ..squeezable.wire()
    };
    let zstd_short = WireChunk {
        raw_len: 19_999,
        ..squeezable.wire()
    };
    for bad in [wrong_score, zstd_of_other, zstd_garbage, zstd_short] {
        let mut c = connect(&srv.addr, "");
        // The good chunk first in the same frame: nothing of it may be stored either.
        match c.put_chunks(&[good.wire(), bad]) {
            Err(Error::Refused { code, message, .. }) => {
                assert_eq!(code, code::BAD_CHUNK, "{message}");
                assert!(message.contains(&to_hex(&bad.score)), "{message}");
            }
            other => panic!("a bad chunk was accepted: {other:?}"),
        }
        // The server closed the connection.
        assert!(c.ping().is_err());
    }
    let mut c = connect(&srv.addr, "");
    assert_eq!(
        c.lacks(&[good.score, squeezable.score]).unwrap(),
        [true, true]
    );
    let s = c.status().unwrap();
    assert_eq!(
        (
            s.dedup.refused_chunks,
            s.dedup.chunks_absorbed,
            s.dedup.segment_bytes
        ),
        (4, 0, 0)
    );
    // The same chunks with their own bytes are taken.
    let ok = c.put_chunks(&[good.wire(), squeezable.wire()]).unwrap();
    assert_eq!(ok.stored, 2);
    assert_eq!(
        c.lacks(&[good.score, squeezable.score]).unwrap(),
        [false, false]
    );
    c.goodbye();
}

#[test]
fn a_killed_server_pushes_every_acknowledged_chunk_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("srv");
    let broken = tmp.path().join("broken-durable");
    let good = tmp.path().join("durable");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::create_dir_all(&good).unwrap();
    let ckpt = cut(
        "ckpt.9",
        vec![
            ("a.dat".into(), random(3 << 20, 9)),
            ("b.dat".into(), compressible(1 << 20, 10)),
        ],
    );
    let n = ckpt.blobs.len() as u64;

    // The server cannot push: everything it acknowledges stays on its SSD.
    block_repository(&broken.join(DEFAULT_PREFIX));
    let srv = ServerProcess::start(&dir, &broken, DEADLINE);
    let mut c = connect(&srv.addr, "");
    send_checkpoint(&mut c, &srv.addr, &ckpt);
    let s = wait_for(&srv.addr, "a push attempt failed", |s| {
        s.dedup.push_failures >= 1
    });
    assert_eq!(
        (
            s.dedup.chunks_absorbed,
            s.dedup.pending_chunks,
            s.dedup.chunks_pushed
        ),
        (n, n, 0)
    );
    assert_eq!(s.dedup.pending_manifests, 1);
    assert!(s.dedup.segment_files >= 3, "{:?}", s.dedup);
    srv.kill9();

    // A write the kill cut short: half a record at the end of the newest segment.
    let newest = std::fs::read_dir(dir.join("dedup"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".log"))
        .max()
        .unwrap();
    let acknowledged_len = std::fs::metadata(&newest).unwrap().len();
    let mut torn = b"CCK1".to_vec();
    torn.extend_from_slice(&random(3000, 11));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&newest)
        .unwrap();
    std::io::Write::write_all(&mut f, &torn).unwrap();
    drop(f);

    // Restarted (still unable to push): every acknowledged chunk and the manifest are back.
    let srv = ServerProcess::start(&dir, &broken, DEADLINE);
    assert!(
        srv.log().contains("cut an incomplete tail"),
        "{}",
        srv.log()
    );
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), acknowledged_len);
    let mut c = connect(&srv.addr, "");
    let s = c.status().unwrap();
    assert_eq!((s.dedup.pending_chunks, s.dedup.index_chunks), (n, n));
    assert_eq!(s.dedup.pending_manifests, 1);
    assert!(c.lacks(&ckpt.scores()).unwrap().iter().all(|l| !l));
    let fetched = c.get_chunks(&ckpt.scores()).unwrap();
    assert_eq!(fetched.len() as u64, n);
    for (f, b) in fetched.iter().zip(&ckpt.blobs) {
        assert_eq!((f.score, f.kind, f.stored), (b.score, b.kind, b.stored));
        assert!(f.verified_raw().unwrap() == b.raw);
    }
    let (state, m) = c.get_manifest(&ckpt.name).unwrap().unwrap();
    assert_eq!(
        (state, m.files),
        (ManifestState::Pending, ckpt.recipes.clone())
    );
    srv.kill9();

    // Restarted with a durable store it can reach: it pushes everything and writes the
    // manifest.
    let srv = ServerProcess::start(&dir, &good, DEADLINE);
    let s = wait_for(&srv.addr, "the manifest was written", |s| {
        s.dedup.manifests_written == 1
    });
    assert_eq!((s.dedup.chunks_pushed, s.dedup.pending_chunks), (n, 0));
    assert!(s.dedup.segment_files <= 1, "{:?}", s.dedup);
    assert_restores(&good, &ckpt);
    let entries = repository_entries(&good.join(DEFAULT_PREFIX));
    assert_eq!(entries.len() as u64, n);
    srv.kill9();
}

#[test]
fn get_chunks_and_get_manifest_answer_before_and_after_the_push() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let repo_dir = durable.join("ns").join(DEFAULT_PREFIX);
    block_repository(&repo_dir);
    let srv = InProcess::start(&tmp.path().join("srv"), &durable, 1 << 20);
    let ckpt = cut(
        "dir/ckpt.3",
        vec![
            ("x.dat".into(), random(4 << 20, 20)),
            ("y.dat".into(), compressible(300_000, 21)),
        ],
    );
    let mut c = connect(&srv.addr, "ns");
    send_checkpoint(&mut c, &srv.addr, &ckpt);
    wait_for(&srv.addr, "a push attempt failed", |s| {
        s.dedup.push_failures >= 1
    });

    // Before the push: every acknowledged chunk, in request order; unknown scores left out.
    let mut asked = ckpt.scores();
    asked.insert(3, [0xee; 32]);
    let fetched = c.get_chunks(&asked).unwrap();
    assert_eq!(fetched.len(), ckpt.blobs.len());
    for (f, b) in fetched.iter().zip(&ckpt.blobs) {
        assert_eq!(
            (f.score, f.kind, f.stored, f.raw_len),
            (b.score, b.kind, b.stored, b.raw.len() as u32)
        );
        assert!(f.data == b.data && f.verified_raw().unwrap() == b.raw);
    }
    let (state, m) = c.get_manifest(&ckpt.name).unwrap().unwrap();
    assert_eq!(state, ManifestState::Pending);
    assert_eq!(m.files, ckpt.recipes);
    assert_eq!(
        (m.chunking.as_str(), m.compression.as_str()),
        (CHUNKING, COMPRESSION)
    );
    assert!(c.get_manifest("dir/ckpt.0").unwrap().is_none());
    // Another namespace sees nothing of it.
    let mut other = connect(&srv.addr, "other");
    assert!(other.get_chunks(&ckpt.scores()).unwrap().is_empty());
    assert!(other.get_manifest(&ckpt.name).unwrap().is_none());

    // After the push: the manifest from the repository; the chunks of segments not yet
    // reclaimed (the active one) still from the server, the others from the repository.
    unblock_repository(&repo_dir);
    wait_for(&srv.addr, "the manifest was written", |s| {
        s.dedup.manifests_written == 1
    });
    let (state, m) = c.get_manifest(&ckpt.name).unwrap().unwrap();
    assert_eq!(state, ManifestState::Written);
    assert_eq!(m.files, ckpt.recipes);
    let fetched: HashMap<Score, _> = c
        .get_chunks(&ckpt.scores())
        .unwrap()
        .into_iter()
        .map(|f| (f.score, f))
        .collect();
    assert!(
        !fetched.is_empty() && fetched.len() < ckpt.blobs.len(),
        "{} of {} still held",
        fetched.len(),
        ckpt.blobs.len()
    );
    let repo = Repo::open_existing(
        Arc::new(DurableStore::open(durable.join("ns").to_str().unwrap()).unwrap()),
        DEFAULT_PREFIX,
    )
    .unwrap()
    .unwrap();
    for b in &ckpt.blobs {
        match fetched.get(&b.score) {
            Some(f) => assert!(f.verified_raw().unwrap() == b.raw),
            None => assert!(repo.read_blob(&b.score).unwrap() == b.raw),
        }
    }
    assert_restores(&durable.join("ns"), &ckpt);
    c.goodbye();
}

#[test]
fn owner_of_moves_about_a_quarter_of_the_scores_when_a_fourth_server_joins() {
    let three = ["10.0.0.5:7070", "10.0.0.6:7070", "10.0.0.7:7070"];
    let four = [
        "10.0.0.5:7070",
        "10.0.0.6:7070",
        "10.0.0.7:7070",
        "10.0.0.8:7070",
    ];
    let scores: Vec<Score> = (0..10_000u64).map(|i| score(&i.to_le_bytes())).collect();
    let mut moved = 0;
    let mut load = BTreeMap::new();
    for s in &scores {
        let before = owner_of(s, &three);
        let after = owner_of(s, &four);
        *load.entry(after).or_insert(0) += 1;
        if before != after {
            moved += 1;
            // Rendezvous hashing: a score only ever moves to the new server.
            assert_eq!(after, 3, "a score moved between old servers");
        }
        // The owner depends on the names, not on their order.
        let reversed: Vec<&str> = four.iter().rev().copied().collect();
        assert_eq!(four[after], reversed[owner_of(s, &reversed)]);
    }
    // Expected 2 500 (1/4), standard deviation 43: a band of about 5 sigma.
    assert!((2_280..=2_720).contains(&moved), "{moved} of 10000 moved");
    assert!(
        load.values().all(|n| (2_280..=2_720).contains(n)),
        "{load:?}"
    );
    assert_eq!(owner_of(&scores[0], &["only"]), 0);
    assert_eq!(owner_of(&scores[0], &[]), 0);
}

/// 2 MiB of float32 "weights", each scaled by `1 + nudge`: a training step moves every value
/// a little, so the XOR with the previous version is mostly zero bytes.
fn weights(nudge: f32) -> Vec<u8> {
    (0..(2 << 20) / 4)
        .flat_map(|i| (((i as f32) * 0.37).sin() * (1.0 + nudge)).to_le_bytes())
        .collect()
}

#[test]
fn delta_chunks_are_checked_against_their_bases_and_pushed_as_deltas() {
    let tmp = tempfile::tempdir().unwrap();
    let durable = tmp.path().join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let srv = InProcess::start(&tmp.path().join("srv"), &durable, 64 << 20);
    let (old, new) = (weights(0.0), weights(1e-4));
    let first = cut("w/v1", vec![("w.bin".into(), old.clone())]);
    let mut c = connect(&srv.addr, "");
    send_checkpoint(&mut c, &srv.addr, &first);
    wait_for(&srv.addr, "v1 was written", |s| {
        s.dedup.manifests_written == 1
    });

    // The agent's side: v2's chunks as deltas against v1, whose bytes it still has.
    let repo = Repo::open_existing(
        Arc::new(DurableStore::open(durable.to_str().unwrap()).unwrap()),
        DEFAULT_PREFIX,
    )
    .unwrap()
    .expect("a repository");
    let base = repo
        .base_file(FileBase {
            recipe: &first.recipes[0],
            bytes: &old,
        })
        .expect("v1's chunks");
    let zstd: Compression = COMPRESSION.parse().unwrap();
    let chunking: Chunking = CHUNKING.parse().unwrap();
    let second = cut("w/v2", vec![("w.bin".into(), new.clone())]);
    let mut deltas: Vec<(Score, u32, Vec<u8>, Vec<u8>)> = Vec::new();
    for r in chunking.split(&new) {
        let raw = &new[r.clone()];
        if let Some(Packed {
            bytes,
            base: Some(b),
        }) = base.pack(zstd, r.start as u64, raw)
        {
            deltas.push((
                score(raw),
                raw.len() as u32,
                delta_data(&b, &bytes),
                raw.to_vec(),
            ));
        }
    }
    assert!(deltas.len() > 10, "{} deltas", deltas.len());
    let wire: Vec<WireChunk> = deltas
        .iter()
        .map(|(s, raw_len, data, _)| WireChunk {
            score: *s,
            kind: BlobKind::Data,
            stored: Stored::Delta,
            raw_len: *raw_len,
            data,
        })
        .collect();

    // A base the repository does not have, and a frame of the wrong length: nothing of
    // either frame is stored.
    let (s0, raw_len0, data0, _) = &deltas[0];
    let mut unknown = data0.clone();
    unknown[..32].copy_from_slice(&[9; 32]);
    let bad_base = WireChunk {
        data: &unknown,
        ..wire[0]
    };
    let bad_len = WireChunk {
        raw_len: raw_len0 + 1,
        ..wire[0]
    };
    for (bad, want) in [(bad_base, code::BASE_UNKNOWN), (bad_len, code::BAD_CHUNK)] {
        let mut c = connect(&srv.addr, "");
        match c.put_chunks(&[wire[1], bad]) {
            Err(Error::Refused { code, message, .. }) => {
                assert_eq!(code, want, "{message}");
                assert!(message.contains(&to_hex(s0)), "{message}");
            }
            other => panic!("a bad delta chunk was accepted: {other:?}"),
        }
        assert!(c.ping().is_err(), "the server closed the connection");
    }
    let mut c = connect(&srv.addr, "");
    assert_eq!(c.lacks(&[wire[1].score]).unwrap(), [true]);

    // The good ones are taken as deltas and served back as such.
    let report = c.put_chunks(&wire).unwrap();
    assert_eq!(report.stored, deltas.len() as u64);
    let s = c.status().unwrap();
    assert_eq!(
        s.dedup.delta_chunks_absorbed,
        deltas.len() as u64,
        "{:?}",
        s.dedup
    );
    let fetched = c.get_chunks(&[deltas[0].0]).unwrap();
    let (b, frame) = fetched[0].delta().expect("a delta chunk");
    let rebuilt = undo_delta(
        frame,
        fetched[0].raw_len,
        &repo.read_blob(&b.score).unwrap(),
        b.from,
    );
    assert!(rebuilt.unwrap() == deltas[0].3);

    // The rest of v2 and its manifest: v2 is written, its deltas kept as such, and it
    // restores bit for bit.
    send_checkpoint(&mut c, &srv.addr, &second);
    let s = wait_for(&srv.addr, "v2 was written", |s| {
        s.dedup.manifests_written == 2
    });
    assert_eq!(s.dedup.lost_chunks, 0, "{:?}", s.dedup);
    assert_restores(&durable, &second);
    assert_restores(&durable, &first);
    let index_dir = durable.join(DEFAULT_PREFIX).join("index");
    let delta_entries = std::fs::read_dir(&index_dir)
        .unwrap()
        .flat_map(|e| decode_index(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .flat_map(|(_, entries)| entries)
        .filter(|e| e.stored == Stored::Delta)
        .count();
    assert_eq!(delta_entries, deltas.len());
}

/// v1 written through `srv`, and v2's chunks as deltas against v1 (score, raw length, wire
/// data, raw bytes), as an agent that still has v1's bytes makes them.
type Delta = (Score, u32, Vec<u8>, Vec<u8>);

fn v1_written_and_v2_as_deltas(srv: &InProcess, durable: &Path) -> (Cut, Cut, Vec<Delta>) {
    let (old, new) = (weights(0.0), weights(1e-4));
    let first = cut("w/v1", vec![("w.bin".into(), old.clone())]);
    let mut c = connect(&srv.addr, "");
    send_checkpoint(&mut c, &srv.addr, &first);
    wait_for(&srv.addr, "v1 was written", |s| {
        s.dedup.manifests_written == 1
    });
    let repo = Repo::open_existing(
        Arc::new(DurableStore::open(durable.to_str().unwrap()).unwrap()),
        DEFAULT_PREFIX,
    )
    .unwrap()
    .expect("a repository");
    let base = repo
        .base_file(FileBase {
            recipe: &first.recipes[0],
            bytes: &old,
        })
        .expect("v1's chunks");
    let zstd: Compression = COMPRESSION.parse().unwrap();
    let chunking: Chunking = CHUNKING.parse().unwrap();
    let mut deltas = Vec::new();
    for r in chunking.split(&new) {
        let raw = &new[r.clone()];
        if let Some(Packed {
            bytes,
            base: Some(b),
        }) = base.pack(zstd, r.start as u64, raw)
        {
            deltas.push((
                score(raw),
                raw.len() as u32,
                delta_data(&b, &bytes),
                raw.to_vec(),
            ));
        }
    }
    assert!(deltas.len() > 10, "{} deltas", deltas.len());
    let second = cut("w/v2", vec![("w.bin".into(), new)]);
    (first, second, deltas)
}

/// A server (in `tmp`/srv) draining to the directory `tmp`/durable, with v1 written and v2
/// cut into deltas against it ([`v1_written_and_v2_as_deltas`]).
fn server_with_deltas(tmp: &Path) -> (PathBuf, InProcess, Cut, Cut, Vec<Delta>) {
    let durable = tmp.join("durable");
    std::fs::create_dir_all(&durable).unwrap();
    let srv = InProcess::start(&tmp.join("srv"), &durable, 64 << 20);
    let (first, second, deltas) = v1_written_and_v2_as_deltas(&srv, &durable);
    (durable, srv, first, second, deltas)
}

fn delta_wire(d: &Delta) -> WireChunk<'_> {
    WireChunk {
        score: d.0,
        kind: BlobKind::Data,
        stored: Stored::Delta,
        raw_len: d.1,
        data: &d.2,
    }
}

#[test]
fn a_delta_that_does_not_rebuild_its_score_is_refused_and_nothing_is_built_on_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (durable, srv, first, second, deltas) = server_with_deltas(tmp.path());

    // A well-formed delta on a real base (its frame decompresses to its raw length) that
    // claims the score of other bytes: what a buggy or malicious agent could send.
    let mut other = deltas[0].3.clone();
    other[0] ^= 0xff;
    let claimed = score(&other);
    let poisoned = WireChunk {
        score: claimed,
        ..delta_wire(&deltas[0])
    };
    let good = delta_wire(&deltas[1]);
    let mut c = connect(&srv.addr, "");
    match c.put_chunks(&[good, poisoned]) {
        Err(Error::Refused { code, message, .. }) => {
            assert_eq!(code, code::BAD_CHUNK, "{message}");
            assert!(message.contains(&to_hex(&claimed)), "{message}");
            assert!(message.contains("rebuil"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a delta that does not rebuild its score was accepted: {other:?}"),
    }
    assert!(c.ping().is_err(), "the server closed the connection");
    // Nothing of its frame was stored: both are still lacking.
    let mut c = connect(&srv.addr, "");
    assert_eq!(c.lacks(&[claimed, good.score]).unwrap(), [true, true]);
    assert_eq!(c.status().unwrap().dedup.refused_chunks, 1);

    // Nothing can be built on it: a delta whose base is the refused score has no base, and
    // a manifest naming it is never written.
    let mut on_poison = deltas[2].2.clone();
    on_poison[..32].copy_from_slice(&claimed);
    let built_on = WireChunk {
        data: &on_poison,
        ..delta_wire(&deltas[2])
    };
    match connect(&srv.addr, "").put_chunks(&[built_on]) {
        Err(Error::Refused { code, message, .. }) => {
            assert_eq!(code, code::BASE_UNKNOWN, "{message}")
        }
        other => panic!("a delta on the refused chunk was accepted: {other:?}"),
    }
    c.put_manifest("w/poisoned", false, CHUNKING, COMPRESSION, &[], &[claimed])
        .unwrap();

    // The honest deltas and v2 go through; v2 is written, the poisoned manifest is not.
    let wire: Vec<WireChunk> = deltas.iter().map(delta_wire).collect();
    assert_eq!(c.put_chunks(&wire).unwrap().stored, deltas.len() as u64);
    send_checkpoint(&mut c, &srv.addr, &second);
    let s = wait_for(&srv.addr, "v2 was written", |s| {
        s.dedup.manifests_written == 2 && s.dedup.pending_chunks == 0
    });
    assert_eq!((s.dedup.pending_manifests, s.dedup.lost_chunks), (1, 0));
    assert_restores(&durable, &second);
    assert_restores(&durable, &first);
    let entries = repository_entries(&durable.join(DEFAULT_PREFIX));
    assert!(
        !entries.contains(&claimed),
        "the refused chunk reached the repository"
    );
    assert_eq!(
        c.get_manifest("w/poisoned")
            .unwrap()
            .map(|(state, _)| state),
        Some(ManifestState::Pending)
    );
}

#[test]
fn a_delta_whose_frame_does_not_decompress_is_refused_with_nothing_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let (_durable, srv, _, _, deltas) = server_with_deltas(tmp.path());

    // A real base, the right score and length, and a frame cut short: checked only where
    // the server rebuilds it on its base.
    let mut cut_short = deltas[0].2.clone();
    cut_short.truncate(cut_short.len() - 4);
    let broken = WireChunk {
        data: &cut_short,
        ..delta_wire(&deltas[0])
    };
    let good = delta_wire(&deltas[1]);
    let mut c = connect(&srv.addr, "");
    match c.put_chunks(&[good, broken]) {
        Err(Error::Refused { code, message, .. }) => {
            assert_eq!(code, code::BAD_CHUNK, "{message}");
            assert!(message.contains(&to_hex(&deltas[0].0)), "{message}");
            assert!(message.contains("decompress"), "{message}");
        }
        other => panic!("a delta whose frame does not decompress was accepted: {other:?}"),
    }
    let mut c = connect(&srv.addr, "");
    assert_eq!(c.lacks(&[deltas[0].0, good.score]).unwrap(), [true, true]);
    assert_eq!(c.status().unwrap().dedup.refused_chunks, 1);
}

/// The delta chunks' distinct bases, in the order of their first use.
fn bases_of(deltas: &[Delta]) -> Vec<Score> {
    let mut seen = HashSet::new();
    deltas
        .iter()
        .filter_map(|d| cascade_staging::protocol::split_delta(&d.2).map(|(b, _)| b.score))
        .filter(|s| seen.insert(*s))
        .collect()
}

#[test]
fn delta_bases_come_from_the_base_cache_and_a_damaged_entry_is_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    let srv_dir = tmp.path().join("srv");
    let (durable, srv, first, second, deltas) = server_with_deltas(tmp.path());
    let bases = bases_of(&deltas);
    assert!(bases.len() > 2, "{} bases", bases.len());
    // v1's data chunks went to the cache as they were stored (after the reply).
    wait_for(&srv.addr, "v1's chunks are in the base cache", |s| {
        s.dedup.base_cache_chunks >= bases.len() as u64
    });

    // One entry damaged on the server's SSD: its bytes found in the cache's files.
    let damaged = bases[0];
    let damaged_raw = &first
        .blobs
        .iter()
        .find(|b| b.score == damaged)
        .expect("the base is a chunk of v1")
        .raw;
    let cache_dir = srv_dir.join("dedup").join("base-cache");
    let (file, at) = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find_map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            let at = bytes
                .windows(damaged_raw.len())
                .position(|w| w == damaged_raw.as_slice())?;
            Some((path, at))
        })
        .expect("the base's entry in a cache file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at + 100] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();

    // With the durable store's packs out of reach, the deltas on the other bases are
    // checked all the same: their bases come from the cache, not from the durable store.
    let on_damaged = |d: &Delta| {
        cascade_staging::protocol::split_delta(&d.2).map(|(b, _)| b.score) == Some(damaged)
    };
    let (later, now): (Vec<&Delta>, Vec<&Delta>) = deltas.iter().partition(|d| on_damaged(d));
    assert!(!later.is_empty() && !now.is_empty());
    let packs = durable.join(DEFAULT_PREFIX).join("packs");
    let hidden = durable.join(DEFAULT_PREFIX).join("packs.away");
    std::fs::rename(&packs, &hidden).unwrap();
    let mut c = connect(&srv.addr, "");
    let wire: Vec<WireChunk> = now.iter().map(|d| delta_wire(d)).collect();
    assert_eq!(c.put_chunks(&wire).unwrap().stored, now.len() as u64);
    let s = c.status().unwrap().dedup;
    assert!(
        s.delta_bases_from_cache >= bases.len() as u64 - 1 && s.delta_bases_from_durable == 0,
        "{s:?}"
    );

    // The damaged entry is found out by its hash, and that base is read from the durable
    // store instead (unreachable: the frame is refused, nothing of it stored) ...
    let wire: Vec<WireChunk> = later.iter().map(|d| delta_wire(d)).collect();
    match c.put_chunks(&wire) {
        Err(Error::Refused { code, message, .. }) => {
            assert_eq!(code, code::BASE_UNKNOWN, "{message}")
        }
        other => panic!("a delta whose base could not be read was accepted: {other:?}"),
    }
    let s = status(&srv.addr).dedup;
    assert_eq!((s.base_cache_corrupt, s.refused_chunks), (1, 0), "{s:?}");
    // ... (reachable again: taken, its base read once from the durable store and cached).
    // The push wrote new packs meanwhile: the old ones go back beside them.
    for sub in std::fs::read_dir(&hidden).unwrap() {
        let sub = sub.unwrap().path();
        let into = packs.join(sub.file_name().unwrap());
        std::fs::create_dir_all(&into).unwrap();
        for pack in std::fs::read_dir(&sub).unwrap() {
            let pack = pack.unwrap().path();
            std::fs::rename(&pack, into.join(pack.file_name().unwrap())).unwrap();
        }
    }
    let mut c = connect(&srv.addr, "");
    assert_eq!(c.put_chunks(&wire).unwrap().stored, later.len() as u64);
    let s = c.status().unwrap().dedup;
    assert_eq!(
        (s.delta_bases_from_durable, s.base_cache_corrupt),
        (1, 1),
        "{s:?}"
    );
    // Cached again, whole: a delta on it now finds it in the cache.
    let before = s.delta_bases_from_cache;
    let again = deltas
        .iter()
        .find(|d| on_damaged(d))
        .expect("a delta on it");
    let mut c = connect(&srv.addr, "");
    let present = c.put_chunks(&[delta_wire(again)]).unwrap().present;
    assert_eq!(present, 1);
    let s = c.status().unwrap().dedup;
    assert_eq!(
        (s.delta_bases_from_cache, s.delta_bases_from_durable),
        (before + 1, 1),
        "{s:?}"
    );

    // v2 is written and restores bit for bit.
    send_checkpoint(&mut c, &srv.addr, &second);
    let s = wait_for(&srv.addr, "v2 was written", |s| {
        s.dedup.manifests_written == 2
    });
    assert_eq!(s.dedup.lost_chunks, 0, "{:?}", s.dedup);
    assert_restores(&durable, &second);
}
