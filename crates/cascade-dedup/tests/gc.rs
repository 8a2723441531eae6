//! Garbage collection of the repository on a real durable store (a directory): pruning keeps
//! the newest checkpoints restorable and deletes exactly the packs only forgotten ones used;
//! its requests follow the garbage (no pack is read or listed); a writer session open during
//! a collection keeps what it dedups against until it ends; a collector killed with SIGKILL
//! after any of its changes leaves every manifest restorable, and a rerun finishes the job.
//!
//! The truth the tests compare with is read from the directory itself: every pack file's
//! trailer (which blobs it holds) and every manifest's trees (which blobs it uses).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cascade_dedup::repo::format::{decode_pack_trailer, Block};
use cascade_dedup::repo::{FileRecipe, GcOptions, Manifest, PruneSelection, Repo, DEFAULT_PREFIX};
use cascade_dedup::score::{from_hex, to_hex};
use cascade_dedup::{Chunking, Compression, Score};
use cascade_durable::DurableStore;
use cascade_testkit::{durable_at, files_below, random};

const KIB: usize = 1 << 10;

/// 16 KiB fixed chunks, no compression, 64 KiB packs: every pack holds a few chunks, so which
/// pack dies is decided by which chunks the checkpoints share.
fn open(durable: &Arc<DurableStore>) -> Repo {
    Repo::open(
        durable.clone(),
        DEFAULT_PREFIX,
        "fixed:16KiB".parse::<Chunking>().expect("chunking"),
        Compression::None,
    )
    .expect("open repo")
    .with_pack_size(64 * KIB)
}

type Files = Vec<(String, Vec<u8>)>;

fn write_checkpoint(repo: &Repo, name: &str, files: &Files) {
    let mut w = repo.writer();
    let recipes: Vec<FileRecipe> = files
        .iter()
        .map(|(p, d)| w.add_file(p, d.as_slice()).expect("add_file"))
        .collect();
    w.finish().expect("finish");
    repo.write_manifest(name, recipes).expect("manifest");
}

fn assert_restores(repo: &Repo, name: &str, files: &Files) {
    let m = repo
        .read_manifest(name)
        .expect("read manifest")
        .unwrap_or_else(|| panic!("no manifest for {name}"));
    assert_eq!(m.files.len(), files.len(), "{name}");
    for (r, (path, data)) in m.files.iter().zip(files) {
        assert_eq!(&r.path, path);
        let mut out = Vec::new();
        repo.restore_file(r, &mut out)
            .unwrap_or_else(|e| panic!("restore {name}/{path}: {e}"));
        assert!(out == *data, "{name}/{path} differs");
    }
}

/// The repository under `root`, opened for maintenance (pruning, collecting) as `cascade
/// prune` opens it: no index loaded.
fn maintenance(root: &Path) -> Repo {
    Repo::open_for_maintenance(durable_at(root), DEFAULT_PREFIX)
        .expect("open")
        .expect("repo")
}

fn repo_dir(root: &Path) -> PathBuf {
    root.join(DEFAULT_PREFIX)
}

fn base_names(dir: &Path) -> BTreeSet<String> {
    files_below(dir)
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect()
}

/// Every pack file: its size and the blobs its trailer lists.
struct Packs {
    size: HashMap<Score, u64>,
    blobs: HashMap<Score, Vec<Score>>,
    home: HashMap<Score, Score>,
}

fn packs_on_disk(root: &Path) -> Packs {
    let mut packs = Packs {
        size: HashMap::new(),
        blobs: HashMap::new(),
        home: HashMap::new(),
    };
    for path in files_below(&repo_dir(root).join("packs")) {
        if path.to_string_lossy().contains('#') {
            // A pack being written (the directory store renames it into place when done).
            continue;
        }
        let bytes = std::fs::read(&path).expect("read pack");
        let id = from_hex(&path.file_name().expect("name").to_string_lossy()).expect("hex id");
        let entries = decode_pack_trailer(&bytes).expect("pack trailer");
        for e in &entries {
            packs.home.insert(e.score, id);
        }
        packs.size.insert(id, bytes.len() as u64);
        packs
            .blobs
            .insert(id, entries.iter().map(|e| e.score).collect());
    }
    packs
}

/// Every blob a manifest uses (recipe blocks and chunks), read through its trees.
fn blobs_of(repo: &Repo, m: &Manifest) -> HashSet<Score> {
    let mut out = HashSet::new();
    let mut stack: Vec<Score> = m
        .files
        .iter()
        .map(|f| from_hex(&f.root).expect("root"))
        .collect();
    while let Some(node) = stack.pop() {
        if !out.insert(node) {
            continue;
        }
        let block = Block::decode(&repo.read_blob(&node).expect("block")).expect("decode");
        for (child, _) in block.children {
            if block.level == 0 {
                out.insert(child);
            } else {
                stack.push(child);
            }
        }
    }
    out
}

fn packs_of(blobs: &HashSet<Score>, packs: &Packs) -> HashSet<Score> {
    blobs
        .iter()
        .map(|b| *packs.home.get(b).expect("every used blob is in a pack"))
        .collect()
}

fn recorded_packs(m: &Manifest) -> HashSet<Score> {
    m.packs
        .as_ref()
        .expect("a new manifest records its packs")
        .iter()
        .flat_map(|g| g.packs.iter().map(|p| from_hex(p).expect("hex")))
        .collect()
}

/// A series sharing data the way checkpoints do: a constant file, a state that changes one
/// 64 KiB region per checkpoint, and scratch data of its own.
fn series(n: u64) -> Vec<(String, Files)> {
    let constant = random(256 * KIB, 1000);
    let mut state = random(512 * KIB, 2000);
    (0..n)
        .map(|i| {
            let at = (i as usize * 64 * KIB) % state.len();
            state[at..at + 64 * KIB].copy_from_slice(&random(64 * KIB, 3000 + i));
            let files = vec![
                ("constant.bin".to_string(), constant.clone()),
                ("state.bin".to_string(), state.clone()),
                ("scratch.bin".to_string(), random(128 * KIB, 4000 + i)),
            ];
            (format!("run/ck.{i}"), files)
        })
        .collect()
}

fn no_gc_records_or_sessions(root: &Path) {
    let left = files_below(&repo_dir(root).join("gc"));
    assert!(left.is_empty(), "gc records left: {left:?}");
    let left = files_below(&repo_dir(root).join("sessions"));
    assert!(left.is_empty(), "sessions left: {left:?}");
}

/// Every index object names only packs that exist, and a fresh repository lists every blob
/// of every pack it names.
fn index_names_only_existing_packs(root: &Path) {
    let packs = packs_on_disk(root);
    for path in files_below(&repo_dir(root).join("index")) {
        let bytes = std::fs::read(&path).expect("read index");
        for (id, _) in cascade_dedup::repo::format::decode_index(&bytes).expect("index") {
            assert!(
                packs.size.contains_key(&id),
                "{} names the deleted pack {}",
                path.display(),
                to_hex(&id)
            );
        }
    }
}

#[test]
fn prune_keeps_the_newest_and_frees_exactly_the_packs_only_forgotten_ones_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let durable = durable_at(&root);
    let repo = open(&durable);
    let checkpoints = series(6);
    for (name, files) in &checkpoints {
        write_checkpoint(&repo, name, files);
    }

    // The truth before: which packs each manifest uses, from the trees and the pack files.
    let packs = packs_on_disk(&root);
    let manifests = repo.manifests().expect("manifests");
    assert_eq!(manifests.len(), 6);
    let used: Vec<HashSet<Score>> = manifests.iter().map(|m| blobs_of(&repo, m)).collect();
    for (m, blobs) in manifests.iter().zip(&used) {
        assert_eq!(
            recorded_packs(m),
            packs_of(blobs, &packs),
            "{}: the manifest's pack set is the packs its trees use",
            m.checkpoint
        );
    }
    let (gone, kept) = used.split_at(3);
    let gone_blobs: HashSet<Score> = gone.iter().flatten().copied().collect();
    let kept_blobs: HashSet<Score> = kept.iter().flatten().copied().collect();
    let gone_packs = packs_of(&gone_blobs, &packs);
    let kept_packs = packs_of(&kept_blobs, &packs);
    let dead: HashSet<Score> = gone_packs.difference(&kept_packs).copied().collect();
    let shared: HashSet<Score> = gone_packs.intersection(&kept_packs).copied().collect();
    assert!(
        !dead.is_empty() && !shared.is_empty(),
        "the series must exercise both"
    );
    let bytes = |set: &HashSet<Score>| set.iter().map(|p| packs.size[p]).sum::<u64>();

    let report = repo
        .prune(&PruneSelection::KeepNewest(3), &GcOptions::default())
        .expect("prune");
    assert_eq!(report.forgotten, ["run/ck.0", "run/ck.1", "run/ck.2"]);
    assert_eq!(report.kept, ["run/ck.3", "run/ck.4", "run/ck.5"]);
    let gc = &report.gc;
    assert_eq!(gc.packs_deleted, dead.len() as u64, "{gc:?}");
    assert_eq!(gc.bytes_freed, bytes(&dead), "{gc:?}");
    assert_eq!(gc.packs_unreclaimed, shared.len() as u64, "{gc:?}");
    assert_eq!(gc.bytes_unreclaimed, bytes(&shared), "{gc:?}");
    assert_eq!((gc.packs_waiting, gc.sessions_waited_for), (0, 0), "{gc:?}");

    // Deleted: exactly the dead packs, and only blobs no kept checkpoint uses were in them;
    // the garbage left is inside the shared packs.
    let after = packs_on_disk(&root);
    let before_ids: HashSet<Score> = packs.size.keys().copied().collect();
    let after_ids: HashSet<Score> = after.size.keys().copied().collect();
    assert_eq!(
        before_ids
            .difference(&after_ids)
            .copied()
            .collect::<HashSet<_>>(),
        dead
    );
    let freed_blobs: HashSet<Score> = dead.iter().flat_map(|p| packs.blobs[p].clone()).collect();
    assert!(freed_blobs.is_disjoint(&kept_blobs));
    let garbage_left: HashSet<Score> = gone_blobs
        .difference(&kept_blobs)
        .filter(|b| !freed_blobs.contains(*b))
        .copied()
        .collect();
    assert!(garbage_left.iter().all(|b| shared.contains(&packs.home[b])));
    no_gc_records_or_sessions(&root);
    index_names_only_existing_packs(&root);

    // A fresh process: the kept checkpoints restore bit for bit, the forgotten ones are gone,
    // and the index lists exactly the blobs of the packs left.
    let fresh = open(&durable_at(&root));
    for (name, files) in &checkpoints[3..] {
        assert_restores(&fresh, name, files);
    }
    for (name, _) in &checkpoints[..3] {
        assert!(fresh.read_manifest(name).expect("read").is_none());
    }
    let left_blobs: HashSet<Score> = after.blobs.values().flatten().copied().collect();
    assert_eq!(fresh.blob_count(), left_blobs.len());
    // The process that collected forgot the deleted packs' blobs too.
    assert_eq!(repo.blob_count(), left_blobs.len());
    for (name, files) in &checkpoints[3..] {
        assert_restores(&repo, name, files);
    }

    // Nothing more to do: a second run changes nothing; forgetting a named checkpoint works.
    let again = repo.collect_garbage(&GcOptions::default()).expect("gc");
    assert_eq!((again.packs_deleted, again.changes), (0, 0), "{again:?}");
    let named = repo
        .prune(
            &PruneSelection::Checkpoints(vec!["run/ck.4".to_string()]),
            &GcOptions::default(),
        )
        .expect("prune ck.4");
    assert_eq!(named.forgotten, ["run/ck.4"]);
    assert_restores(&open(&durable_at(&root)), "run/ck.5", &checkpoints[5].1);
    let e = repo
        .prune(
            &PruneSelection::Checkpoints(vec!["run/nope".to_string()]),
            &GcOptions::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("no checkpoint run/nope"), "{e}");
}

#[test]
fn a_dry_run_reports_what_a_real_run_then_does_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let durable = durable_at(&root);
    let repo = open(&durable);
    for (name, files) in &series(4) {
        write_checkpoint(&repo, name, files);
    }
    // The writers' session objects go in the background; a collection waits for that too.
    repo.wait_session_ends();
    let before = files_below(&root);
    let dry = repo
        .prune(
            &PruneSelection::KeepNewest(2),
            &GcOptions {
                dry_run: true,
                ..GcOptions::default()
            },
        )
        .expect("dry run");
    assert_eq!(files_below(&root), before, "a dry run changed the store");
    assert!(dry.gc.dry_run && dry.gc.packs_deleted > 0, "{dry:?}");
    let real = repo
        .prune(&PruneSelection::KeepNewest(2), &GcOptions::default())
        .expect("prune");
    assert_eq!(real.forgotten, dry.forgotten);
    assert_eq!(
        (
            real.gc.packs_deleted,
            real.gc.bytes_freed,
            real.gc.bytes_unreclaimed
        ),
        (
            dry.gc.packs_deleted,
            dry.gc.bytes_freed,
            dry.gc.bytes_unreclaimed
        )
    );
}

/// The requests of a trace, without the fsyncs that a directory store records after its
/// writes and deletes (local system calls, not requests to the store).
fn requests(trace: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    trace
        .into_iter()
        .filter(|(op, _)| !op.starts_with("fsync"))
        .collect()
}

/// GC's requests follow the garbage: it never reads or lists a pack (it sizes and deletes the
/// candidates only) and reads only the index objects naming dead packs, however many packs
/// and index objects the store holds.
#[test]
fn collection_reads_no_pack_and_only_the_index_objects_it_rewrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let durable = durable_at(&root);
    let repo = open(&durable);
    let constant = random(64 * KIB, 1);
    let checkpoints = 30u64;
    for i in 0..checkpoints {
        let files = vec![
            ("constant.bin".to_string(), constant.clone()),
            ("data.bin".to_string(), random(256 * KIB, 100 + i)),
        ];
        write_checkpoint(&repo, &format!("ck.{i:02}"), &files);
    }
    let total_packs = files_below(&repo_dir(&root).join("packs")).len();
    let index_objects = files_below(&repo_dir(&root).join("index")).len();
    assert!(total_packs >= 150 && index_objects == 30);
    let forgotten = repo.read_manifest("ck.00").expect("read").expect("ck.00");
    let candidates: HashSet<Score> = recorded_packs(&forgotten);
    let origins = forgotten.packs.as_ref().map_or(0, Vec::len);

    // A collector process: the repository opened without its index.
    let gc_durable = durable_at(&root);
    let gc_repo = Repo::open_for_maintenance(gc_durable.clone(), DEFAULT_PREFIX)
        .expect("open")
        .expect("a repository");
    gc_durable.start_trace();
    let report = gc_repo
        .prune(&PruneSelection::KeepNewest(29), &GcOptions::default())
        .expect("prune");
    let trace = requests(gc_durable.take_trace());
    assert!(report.gc.packs_deleted > 0, "{report:?}");
    let on = |area: &str| -> Vec<&(&'static str, String)> {
        let prefix = format!("{DEFAULT_PREFIX}/{area}");
        trace
            .iter()
            .filter(|(_, p)| p.starts_with(&prefix))
            .collect()
    };
    let packs = on("packs");
    assert!(
        packs.iter().all(|(op, _)| *op == "head" || *op == "delete"),
        "GC read or listed packs: {packs:?}"
    );
    let heads = packs.iter().filter(|(op, _)| *op == "head").count();
    assert!(
        heads <= candidates.len() && candidates.len() * 10 < total_packs,
        "{heads} pack sizes asked for {} candidates of {total_packs} packs",
        candidates.len()
    );
    let index_gets = on("index")
        .iter()
        .filter(|(op, _)| op.starts_with("get"))
        .count();
    assert!(
        index_gets <= origins && index_gets < index_objects,
        "{index_gets} index objects read, {origins} name the forgotten packs"
    );
    // The manifests (their pack sets) are the one thing read per checkpoint kept.
    let manifest_gets = on("manifests")
        .iter()
        .filter(|(op, _)| *op == "get")
        .count();
    assert!(manifest_gets <= 2 * checkpoints as usize + 4, "{trace:?}");
    assert!(
        trace.len() < total_packs,
        "{} requests for a store of {total_packs} packs",
        trace.len()
    );

    // With nothing to collect, no pack or index object is touched at all.
    gc_durable.start_trace();
    gc_repo.collect_garbage(&GcOptions::default()).expect("gc");
    let trace = requests(gc_durable.take_trace());
    assert!(
        trace
            .iter()
            .all(|(_, p)| !p.contains("/packs/") && !p.contains("/index/")),
        "{trace:?}"
    );
}

/// A writer session that started before a collection may dedup against the packs it
/// condemns: they stay until the session ended, and then only those its manifest does not
/// name go. A session that starts after the condemnation stores such chunks again.
#[test]
fn a_writer_open_during_collection_keeps_what_it_dedups_against() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let first = open(&durable_at(&root));
    let x = random(512 * KIB, 1);
    let y1 = random(256 * KIB, 2);
    let y2 = random(256 * KIB, 3);
    let ck1: Files = vec![("x.bin".into(), x.clone()), ("y.bin".into(), y1)];
    let ck2: Files = vec![("y.bin".into(), y2)];
    write_checkpoint(&first, "ck1", &ck1);
    write_checkpoint(&first, "ck2", &ck2);
    let ck1_packs = recorded_packs(&first.read_manifest("ck1").expect("read").expect("ck1"));

    // Another process starts a writer and dedups the first half of x against ck1's packs.
    let writer_repo = open(&durable_at(&root));
    let mut w = writer_repo.writer();
    let half_a = w.add_file("a.bin", &x[..256 * KIB]).expect("add");

    // A collector forgets ck1: its packs are condemned, but wait for that writer.
    let collector = maintenance(&root);
    collector.forget("ck1").expect("forget");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!(r.packs_deleted, 0, "{r:?}");
    assert_eq!(r.packs_waiting, ck1_packs.len() as u64, "{r:?}");
    assert_eq!(r.sessions_waited_for, 1, "{r:?}");
    let on_disk: HashSet<Score> = packs_on_disk(&root).size.keys().copied().collect();
    assert!(ck1_packs.is_subset(&on_disk));

    // A writer starting now does not dedup against condemned packs: it stores x again.
    let late = open(&durable_at(&root));
    let ck3: Files = vec![("x.bin".into(), x.clone())];
    let mut lw = late.writer();
    let recipe = lw.add_file("x.bin", x.as_slice()).expect("add");
    let stats = lw.finish().expect("finish");
    assert_eq!(stats.new_bytes, x.len() as u64, "{stats:?}");
    late.write_manifest("ck3", vec![recipe]).expect("manifest");
    let ck3_packs = recorded_packs(&late.read_manifest("ck3").expect("read").expect("ck3"));
    assert!(ck3_packs.is_disjoint(&ck1_packs));

    // The early writer goes on deduplicating against the condemned packs, then records ck4.
    let half_b = w.add_file("b.bin", &x[256 * KIB..]).expect("add");
    let stats = w.finish().expect("finish");
    assert_eq!(stats.new_chunks, 0, "{stats:?}");
    writer_repo
        .write_manifest("ck4", vec![half_a, half_b])
        .expect("manifest ck4");
    let ck4: Files = vec![
        ("a.bin".into(), x[..256 * KIB].to_vec()),
        ("b.bin".into(), x[256 * KIB..].to_vec()),
    ];
    let ck4_packs = recorded_packs(&writer_repo.read_manifest("ck4").expect("r").expect("ck4"));
    assert!(
        !ck4_packs.is_disjoint(&ck1_packs),
        "ck4 deduped against ck1"
    );

    // Its session ended (the writer deletes the session object on a thread of its own):
    // the next run deletes the condemned packs ck4 does not name.
    writer_repo.wait_session_ends();
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    let expected: HashSet<Score> = ck1_packs.difference(&ck4_packs).copied().collect();
    assert!(!expected.is_empty());
    assert_eq!(r.packs_deleted, expected.len() as u64, "{r:?}");
    assert_eq!((r.packs_waiting, r.sessions_waited_for), (0, 0), "{r:?}");
    let on_disk: HashSet<Score> = packs_on_disk(&root).size.keys().copied().collect();
    assert!(on_disk.is_disjoint(&expected));
    assert!(ck4_packs.is_subset(&on_disk));
    no_gc_records_or_sessions(&root);
    index_names_only_existing_packs(&root);

    let fresh = open(&durable_at(&root));
    assert_restores(&fresh, "ck2", &ck2);
    assert_restores(&fresh, "ck3", &ck3);
    assert_restores(&fresh, "ck4", &ck4);
    // The long-lived writer process finds ck4 too (its index had blobs of deleted packs).
    assert_restores(&writer_repo, "ck4", &ck4);
    assert_restores(&writer_repo, "ck3", &ck3);
}

/// A writer of blobs only (a staging server: `add_stored`, `finish`, then a manifest
/// prepared elsewhere) keeps its session after `finish`: its manifest may use condemned packs
/// it deduplicated against while the collector waits for it. Without such a session, a
/// manifest needing a condemned pack is refused, never written over a pack being deleted.
#[test]
fn a_blob_writer_keeps_what_its_prepared_manifest_uses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let first = open(&durable_at(&root));
    let x = random(256 * KIB, 5);
    let ck1: Files = vec![("x.bin".into(), x.clone())];
    write_checkpoint(&first, "ck1", &ck1);
    let m1 = first.read_manifest("ck1").expect("read").expect("ck1");

    // The staging server's writer: every blob of x is known, so nothing is stored.
    let server = open(&durable_at(&root));
    let mut w = server.writer();
    let known = w
        .add_stored(
            from_hex(&m1.files[0].root).expect("root"),
            cascade_dedup::repo::format::BlobKind::Tree,
            0,
            cascade_dedup::repo::format::Stored::Raw,
            &[],
        )
        .expect("add_stored");
    assert!(!known, "the root is in the index");

    let collector = maintenance(&root);
    collector.forget("ck1").expect("forget");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!((r.packs_deleted, r.sessions_waited_for), (0, 1), "{r:?}");

    // Another process without a session the collector waits for is refused.
    let other = open(&durable_at(&root));
    let prepared = |name: &str| Manifest {
        checkpoint: name.to_string(),
        packs: None,
        ..m1.clone()
    };
    let e = other
        .write_prepared_manifest(prepared("ck-other"))
        .unwrap_err();
    assert!(e.to_string().contains("garbage collection"), "{e}");
    assert!(other.read_manifest("ck-other").expect("read").is_none());

    // The server's finished writer is waited for: its manifest goes in and keeps the packs.
    w.finish().expect("finish");
    server
        .write_prepared_manifest(prepared("ck2"))
        .expect("prepared manifest");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!(r.packs_deleted, 0, "{r:?}");
    drop(server);
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!((r.packs_deleted, r.packs_waiting), (0, 0), "{r:?}");
    no_gc_records_or_sessions(&root);
    assert_restores(&open(&durable_at(&root)), "ck2", &ck1);
}

/// A manifest a writer prepared and staged elsewhere, written much later by another process
/// after that writer's session ended (a staging server cut off from the durable store while
/// the agent died), is checked first: it goes in while every pack it names is there and no
/// record condemns one, and the check's hold keeps them through a collection meanwhile; it is
/// refused while a record condemns one, and once the collector deleted one.
#[test]
fn a_staged_manifest_is_refused_once_a_pack_it_names_is_condemned_or_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let staging_dir = dir.path().join("staging");
    let staging = durable_at(&staging_dir);
    let x = random(256 * KIB, 11);
    let y = random(128 * KIB, 12);
    let writer = open(&durable_at(&root));
    write_checkpoint(&writer, "ck1", &vec![("x.bin".into(), x.clone())]);

    // ck2 dedups against ck1's packs; its own objects are staged, the manifest prepared.
    let mut w = writer
        .writer()
        .with_sink(staging.clone() as Arc<dyn cascade_dedup::repo::ObjectSink>);
    let recipes = vec![
        w.add_file("x.bin", x.as_slice()).expect("add x"),
        w.add_file("y.bin", y.as_slice()).expect("add y"),
    ];
    w.finish().expect("finish");
    let (_, _, manifest) = writer
        .prepare_manifest("ck2", recipes, false)
        .expect("prepare");
    let ck1_packs = recorded_packs(&writer.read_manifest("ck1").expect("read").expect("ck1"));
    assert!(recorded_packs(&manifest).is_superset(&ck1_packs));
    // The server drains ck2's packs and index object; the writer's process dies.
    let mut present = HashSet::new();
    for o in staging.list(DEFAULT_PREFIX).expect("list staged") {
        let object = staging.get_bytes(&o.path).expect("get");
        durable_at(&root).put_bytes(&o.path, &object).expect("put");
        if o.path.contains("/packs/") {
            present.insert(o.path.rsplit('/').next().expect("name").to_string());
        }
    }
    drop(writer);

    let server = maintenance(&root);
    let collector = maintenance(&root);
    let hold = server
        .check_staged_manifest(&manifest, &present)
        .expect("every pack is there");
    collector.forget("ck1").expect("forget");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!((r.packs_deleted, r.sessions_waited_for), (0, 1), "{r:?}");
    let refused = server
        .check_staged_manifest(&manifest, &present)
        .map(|_| ())
        .unwrap_err();
    assert!(refused.to_string().contains("condemned pack"), "{refused}");
    hold.end(&server);
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert!(r.packs_deleted > 0, "{r:?}");
    no_gc_records_or_sessions(&root);
    let refused = server
        .check_staged_manifest(&manifest, &present)
        .map(|_| ())
        .unwrap_err();
    assert!(
        refused.to_string().contains("not in the durable store"),
        "{refused}"
    );
    assert_eq!(refused.errno(), libc::EAGAIN, "{refused}");
    no_gc_records_or_sessions(&root);
}

/// A writer that died (its session object left behind, never renewed) holds collection back
/// only until its lease ran out; then its session object is removed.
#[test]
fn a_dead_writers_session_blocks_collection_only_for_its_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let repo = open(&durable_at(&root));
    let files: Files = vec![("a.bin".into(), random(256 * KIB, 7))];
    write_checkpoint(&repo, "old", &files);
    write_checkpoint(&repo, "new", &vec![("b.bin".into(), random(64 * KIB, 8))]);
    let mut w = repo.writer();
    w.add_file("c.bin", random(128 * KIB, 9).as_slice())
        .expect("add");
    // As if killed: no finish, no drop, the session object stays.
    std::mem::forget(w);

    repo.forget("old").expect("forget");
    let r = repo.collect_garbage(&GcOptions::default()).expect("gc");
    assert_eq!((r.packs_deleted, r.sessions_waited_for), (0, 1), "{r:?}");
    let r = repo
        .collect_garbage(&GcOptions {
            session_lease: Some(Duration::ZERO),
            ..GcOptions::default()
        })
        .expect("gc");
    assert!(r.packs_deleted > 0 && r.sessions_expired == 1, "{r:?}");
    no_gc_records_or_sessions(&root);
    assert_restores(
        &open(&durable_at(&root)),
        "new",
        &vec![("b.bin".into(), random(64 * KIB, 8))],
    );
}

/// A repository created with a lease of its own records it in its config: reopened by any
/// process (a prune, a staging server, a writer configured otherwise) it keeps that lease,
/// and a collection with default options takes a session not renewed for that long for
/// dead, where the default 15 minutes would still wait for it.
#[test]
fn a_repository_keeps_the_session_lease_it_was_created_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let lease = Duration::from_secs(8);
    let repo = Repo::open_with_lease(
        durable_at(&root),
        DEFAULT_PREFIX,
        "fixed:16KiB".parse::<Chunking>().expect("chunking"),
        Compression::None,
        lease,
    )
    .expect("create")
    .with_pack_size(64 * KIB);
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_dir(&root).join("config.json")).expect("config"),
    )
    .expect("json");
    assert_eq!(config["session_lease_s"], 8, "{config}");
    for reopened in [maintenance(&root), open(&durable_at(&root))] {
        assert_eq!(reopened.session_lease(), lease);
        assert_eq!(reopened.staged_manifest_trusted(), Duration::from_secs(2));
    }

    write_checkpoint(&repo, "old", &vec![("a.bin".into(), random(256 * KIB, 17))]);
    let kept: Files = vec![("b.bin".into(), random(64 * KIB, 18))];
    write_checkpoint(&repo, "new", &kept);
    let mut w = repo.writer();
    w.add_file("c.bin", random(64 * KIB, 19).as_slice())
        .expect("add");
    // As if killed, and its last renewal 9 s ago: more than the recorded lease.
    std::mem::forget(w);
    let sessions = files_below(&repo_dir(&root).join("sessions"));
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sessions[0]).expect("session")).expect("json");
    let renewed = record["refreshed_unix_ns"].as_u64().expect("renewed") - 9_000_000_000;
    record["refreshed_unix_ns"] = renewed.into();
    std::fs::write(&sessions[0], record.to_string()).expect("age the session");

    let pruner = maintenance(&root);
    pruner.forget("old").expect("forget");
    let r = pruner
        .collect_garbage(&GcOptions {
            session_lease: Some(cascade_dedup::repo::DEFAULT_SESSION_LEASE),
            ..GcOptions::default()
        })
        .expect("gc");
    assert_eq!((r.packs_deleted, r.sessions_waited_for), (0, 1), "{r:?}");
    let r = pruner.collect_garbage(&GcOptions::default()).expect("gc");
    assert!(r.packs_deleted > 0 && r.sessions_expired == 1, "{r:?}");
    no_gc_records_or_sessions(&root);
    assert_restores(&open(&durable_at(&root)), "new", &kept);

    // A config recording a lease under the minimum is refused, not obeyed.
    let mut config = config;
    config["session_lease_s"] = 1.into();
    std::fs::write(repo_dir(&root).join("config.json"), config.to_string()).expect("config");
    let refused = Repo::open_for_maintenance(durable_at(&root), DEFAULT_PREFIX)
        .err()
        .expect("a 1 s lease is refused");
    assert!(
        refused.to_string().contains("session_lease_s 1"),
        "{refused}"
    );
}

/// Manifests written before pack sets were recorded still parse; the collector walks their
/// trees instead.
#[test]
fn manifests_without_pack_sets_are_walked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let repo = open(&durable_at(&root));
    let checkpoints = series(3);
    for (name, files) in &checkpoints {
        write_checkpoint(&repo, name, files);
    }
    for path in files_below(&repo_dir(&root).join("manifests")) {
        let text = std::fs::read(&path).expect("read");
        let mut json: serde_json::Value = serde_json::from_slice(&text).expect("json");
        json.as_object_mut().expect("object").remove("packs");
        std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("json")).expect("write");
    }
    let gc_repo = maintenance(&root);
    let r = gc_repo
        .prune(&PruneSelection::KeepNewest(1), &GcOptions::default())
        .expect("prune");
    assert!(r.gc.packs_deleted > 0, "{r:?}");
    assert_restores(&open(&durable_at(&root)), "run/ck.2", &checkpoints[2].1);
}

const CRASH_DIR: &str = "CASCADE_GC_TEST_CRASH_DIR";
const CRASH_AT: &str = "CASCADE_GC_TEST_CRASH_AT";

/// The child of the crash test (does nothing in a normal run): prunes the repository in
/// $CASCADE_GC_TEST_CRASH_DIR and, before change number $CASCADE_GC_TEST_CRASH_AT, says so
/// on stdout and blocks until the parent kills it.
#[test]
fn crash_child() {
    let (Ok(dir), Ok(at)) = (std::env::var(CRASH_DIR), std::env::var(CRASH_AT)) else {
        return;
    };
    let at: u64 = at.parse().expect("change number");
    let repo = maintenance(Path::new(&dir));
    let stop = |n: u64| {
        if n == at {
            println!("PAUSED {n}");
            let mut line = String::new();
            // The parent never writes: this blocks until SIGKILL.
            let _ = std::io::stdin().read_line(&mut line);
            std::process::abort();
        }
    };
    let r = repo
        .prune(
            &PruneSelection::KeepNewest(2),
            &GcOptions {
                before_change: Some(&stop),
                ..GcOptions::default()
            },
        )
        .expect("prune");
    println!("DONE {}", r.gc.changes);
}

fn copy_dir(from: &Path, to: &Path) {
    for path in files_below(from) {
        let dest = to.join(path.strip_prefix(from).expect("below"));
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&path, &dest).expect("copy");
    }
}

/// Kills the child before its change `at`; false if it finished first.
fn run_child_until(dir: &Path, at: u64) -> bool {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CRASH_DIR, dir)
        .env(CRASH_AT, at.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.with_extension("stderr")).expect("stderr file"))
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut paused = None;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.expect("child stdout");
        // The harness prints "test crash_child ... " before the child's own output.
        if line.contains("PAUSED ") {
            paused = Some(true);
            break;
        }
        if line.contains("DONE ") {
            paused = Some(false);
            break;
        }
    }
    let paused = paused.unwrap_or_else(|| {
        let _ = child.wait();
        panic!(
            "the child neither paused before change {at} nor finished: {}",
            std::fs::read_to_string(dir.with_extension("stderr")).unwrap_or_default()
        )
    });
    if paused {
        child.kill().expect("SIGKILL");
    } else {
        // The rest of its output (the harness's summary): a closed pipe would fail the child.
        lines.for_each(drop);
    }
    let status = child.wait().expect("reap");
    if !paused {
        assert!(status.success(), "child failed: {status:?}");
    }
    paused
}

#[test]
fn a_collector_killed_after_any_change_leaves_every_manifest_restorable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let template = dir.path().join("template");
    let checkpoints = series(5);
    {
        let repo = open(&durable_at(&template));
        for (name, files) in &checkpoints {
            write_checkpoint(&repo, name, files);
        }
    }
    let data: HashMap<String, Files> = checkpoints.iter().cloned().collect();

    // The reference: an uninterrupted run from the same state.
    let reference = dir.path().join("reference");
    copy_dir(&template, &reference);
    let r = maintenance(&reference)
        .prune(&PruneSelection::KeepNewest(2), &GcOptions::default())
        .expect("prune");
    let changes = r.gc.changes;
    assert!(
        r.gc.packs_deleted > 0 && r.gc.index_objects_rewritten > 0 && changes > 10,
        "{r:?}"
    );
    let final_packs = base_names(&repo_dir(&reference).join("packs"));
    let final_index = base_names(&repo_dir(&reference).join("index"));

    for at in 1..=changes {
        let run = dir.path().join(format!("run-{at}"));
        copy_dir(&template, &run);
        assert!(
            run_child_until(&run, at),
            "the child finished before change {at}"
        );

        // Whatever manifest is left restores bit for bit, from a fresh process.
        let repo = open(&durable_at(&run));
        let left = repo.manifests().expect("manifests");
        assert!(
            left.len() >= 2,
            "change {at}: {} manifests left",
            left.len()
        );
        for m in &left {
            assert_restores(&repo, &m.checkpoint, &data[&m.checkpoint]);
        }
        index_names_only_existing_packs(&run);

        // A rerun finishes the job: the same state as the uninterrupted run.
        maintenance(&run)
            .prune(&PruneSelection::KeepNewest(2), &GcOptions::default())
            .expect("rerun");
        assert_eq!(
            base_names(&repo_dir(&run).join("packs")),
            final_packs,
            "packs after a kill before change {at} and a rerun"
        );
        assert_eq!(
            base_names(&repo_dir(&run).join("index")),
            final_index,
            "index objects after a kill before change {at} and a rerun"
        );
        no_gc_records_or_sessions(&run);
        let repo = open(&durable_at(&run));
        for (name, files) in &checkpoints[3..] {
            assert_restores(&repo, name, files);
        }
        std::fs::remove_dir_all(&run).expect("clean up");
    }
    // One more than the changes made: the child finishes.
    let run = dir.path().join("run-last");
    copy_dir(&template, &run);
    assert!(!run_child_until(&run, changes + 1));
}

fn pack_ids(root: &Path) -> HashSet<Score> {
    packs_on_disk(root).size.keys().copied().collect()
}

/// Packs no index object names — a writer that failed before its index — are found by a
/// sweep (`orphans`), recorded with the sessions open then, and deleted by a later run once
/// those sessions ended; a writer still open at the sweep keeps its packs, which its index
/// names by then.
#[test]
fn packs_no_index_names_are_swept_once_their_writers_sessions_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let repo = open(&durable_at(&root));
    let kept: Files = vec![("k.bin".into(), random(256 * KIB, 1))];
    write_checkpoint(&repo, "kept", &kept);
    let before_failed = pack_ids(&root);

    // A writer that fails after writing packs: dropped without finish, no index names them.
    let mut failed = repo.writer();
    failed
        .add_file("f.bin", random(512 * KIB, 2).as_slice())
        .expect("add");
    drop(failed);
    let orphans: HashSet<Score> = pack_ids(&root)
        .difference(&before_failed)
        .copied()
        .collect();
    assert!(orphans.len() >= 4, "{} packs", orphans.len());

    // A writer still at work in another process, with packs written but no index yet.
    let writer_repo = open(&durable_at(&root));
    let mut open_writer = writer_repo.writer();
    let b = random(384 * KIB, 3);
    let recipe = open_writer.add_file("b.bin", b.as_slice()).expect("add");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pack_ids(&root).len() == before_failed.len() + orphans.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "no pack of the open writer"
        );
        std::thread::yield_now();
    }
    let open_packs: HashSet<Score> = pack_ids(&root)
        .difference(&before_failed)
        .filter(|p| !orphans.contains(*p))
        .copied()
        .collect();

    let collector = maintenance(&root);
    let sweep = GcOptions {
        orphans: true,
        ..GcOptions::default()
    };
    // A dry run finds them and writes nothing.
    let r = collector
        .collect_garbage(&GcOptions {
            dry_run: true,
            ..sweep
        })
        .expect("dry gc");
    assert!(r.orphans_found >= orphans.len() as u64, "{r:?}");
    assert!(files_below(&repo_dir(&root).join("gc")).is_empty());

    let r = collector.collect_garbage(&sweep).expect("gc");
    let found = r.orphans_found;
    assert!(
        found >= (orphans.len() + open_packs.len()) as u64,
        "{r:?}: {} failed, {} open",
        orphans.len(),
        open_packs.len()
    );
    assert_eq!(r.orphans_deleted, 0, "{r:?}");
    // The open writer's session holds the record back.
    let r = collector.collect_garbage(&sweep).expect("gc");
    assert_eq!((r.orphans_deleted, r.orphans_waiting), (0, found), "{r:?}");
    // Recorded packs are not found twice; only packs the open writer wrote since may be new.
    let since: HashSet<Score> = pack_ids(&root)
        .difference(&before_failed)
        .filter(|p| !orphans.contains(*p) && !open_packs.contains(*p))
        .copied()
        .collect();
    assert!(r.orphans_found <= since.len() as u64, "{r:?}");
    assert!(orphans.is_subset(&pack_ids(&root)));

    // The writer finishes: its index names its packs, its manifest its file.
    open_writer.finish().expect("finish");
    writer_repo
        .write_manifest("b", vec![recipe])
        .expect("manifest");
    writer_repo.wait_session_ends();
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!(r.orphans_deleted, orphans.len() as u64, "{r:?}");
    let on_disk = pack_ids(&root);
    assert!(on_disk.is_disjoint(&orphans));
    assert!(open_packs.is_subset(&on_disk));
    no_gc_records_or_sessions(&root);
    index_names_only_existing_packs(&root);
    let fresh = open(&durable_at(&root));
    assert_restores(&fresh, "kept", &kept);
    assert_restores(&fresh, "b", &vec![("b.bin".into(), b)]);
}

/// A checkpoint of several nodes is its manifest and its nodes' part manifests: prune keeps
/// or forgets them together, counts them as one checkpoint, and frees the parts' packs.
#[test]
fn prune_takes_a_jobs_part_manifests_with_its_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let durable = durable_at(&root);
    let repo = open(&durable);
    let nodes = ["a".to_string(), "b".to_string()];
    let mut written = Vec::new();
    for i in 0..3u64 {
        let ckpt = format!("job/ck.{i}");
        let mut all: Files = Vec::new();
        for (n, node) in nodes.iter().enumerate() {
            let files: Files = vec![(
                format!("rank.{n}.bin"),
                random(96 * KIB, 50 + 10 * i + n as u64),
            )];
            write_checkpoint(&repo, &cascade_dedup::repo::part_name(&ckpt, node), &files);
            all.extend(files);
        }
        let joined = repo.complete_job(&ckpt, &nodes).expect("join the parts");
        assert_eq!(joined.files.len(), 2);
        assert_restores(&repo, &ckpt, &all);
        written.push((ckpt, all));
    }
    let report = repo
        .prune(&PruneSelection::KeepNewest(1), &GcOptions::default())
        .expect("prune");
    assert_eq!(report.forgotten, ["job/ck.0", "job/ck.1"]);
    assert_eq!(report.kept, ["job/ck.2"]);
    assert!(report.gc.bytes_freed >= 4 * 96 * KIB as u64, "{report:?}");
    let left: BTreeSet<String> = repo
        .manifests()
        .expect("manifests")
        .into_iter()
        .map(|m| m.checkpoint)
        .collect();
    assert_eq!(
        left,
        BTreeSet::from(
            [
                "job/ck.2",
                "job/ck.2/.cascade-part.a",
                "job/ck.2/.cascade-part.b"
            ]
            .map(String::from)
        )
    );
    let (ckpt, files) = &written[2];
    assert_restores(&repo, ckpt, files);
    index_names_only_existing_packs(&root);
}
