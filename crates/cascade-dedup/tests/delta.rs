//! Delta blobs on a real durable store (a directory): a series of versions of one float file,
//! each added with the previous version as its base, stores far less than without, restores
//! bit for bit from a reopened repository, never chains deeper than MAX_DELTA_DEPTH, keeps
//! its bases through garbage collection of the versions they came from, and turns a wrong
//! base into lost ratio and a corrupt base into an error, never into wrong data.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cascade_dedup::ingest::Packed;
use cascade_dedup::repo::format::{
    decode_pack_trailer, recipe_blocks, BlobEntry, BlobKind, DeltaBase, Stored,
};
use cascade_dedup::repo::{
    Error as RepoError, FileBase, FileRecipe, GcOptions, PruneSelection, Repo, WriteStats,
    DEFAULT_PREFIX, MAX_DELTA_DEPTH,
};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Chunking, Compression, Score};
use cascade_durable::DurableStore;
use cascade_testkit::durable_at;

const FLOATS: usize = 256 * 1024;

/// 16 KiB fixed chunks, zstd:1, 64 KiB packs: bases and the deltas on them land in many packs.
fn open(durable: &Arc<DurableStore>) -> Repo {
    Repo::open(
        durable.clone(),
        DEFAULT_PREFIX,
        "fixed:16KiB".parse::<Chunking>().expect("chunking"),
        Compression::Zstd { level: 1 },
    )
    .expect("open repo")
    .with_pack_size(64 << 10)
}

/// Version `v` of a 1 MiB "model": the first quarter never changes (a frozen layer); the
/// rest are weights that every version nudges a little (an optimizer step), so their sign,
/// exponent and high mantissa bits stay while the low bits change.
fn version(v: u32) -> Vec<u8> {
    let noise = cascade_testkit::random(FLOATS * 4, 7);
    (0..FLOATS)
        .flat_map(|i| {
            let n = u32::from_le_bytes(noise[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
            let weight = (n as f32 / u32::MAX as f32) - 0.5;
            let step = if i < FLOATS / 4 { 0.0 } else { v as f32 * 1e-5 };
            (weight * (1.0 + step)).to_le_bytes()
        })
        .collect()
}

/// Writes versions 0..n as checkpoints `v0`, `v1`, ..., each (but the first, and with
/// `with_base`) against the previous one; the recipes and each writer's stats.
fn write_series(repo: &Repo, n: u32, with_base: bool) -> (Vec<FileRecipe>, Vec<WriteStats>) {
    let mut recipes: Vec<FileRecipe> = Vec::new();
    let mut stats = Vec::new();
    for v in 0..n {
        let bytes = version(v);
        let previous = v.checked_sub(1).map(version);
        let base = match (&previous, recipes.last()) {
            (Some(bytes), Some(recipe)) if with_base => Some(FileBase { recipe, bytes }),
            _ => None,
        };
        let mut w = repo.writer();
        let recipe = w
            .add_file_with_base("model.pt", bytes.as_slice(), base)
            .expect("add_file_with_base");
        stats.push(w.finish().expect("finish"));
        repo.write_manifest(&format!("v{v}"), vec![recipe.clone()])
            .expect("manifest");
        recipes.push(recipe);
    }
    (recipes, stats)
}

fn restore(repo: &Repo, checkpoint: &str) -> Result<Vec<u8>, String> {
    let m = repo
        .read_manifest(checkpoint)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no manifest {checkpoint}"))?;
    let mut out = Vec::new();
    repo.restore_file(&m.files[0], &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

fn pack_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(DEFAULT_PREFIX).join("packs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if !path.to_string_lossy().contains('#') {
                out.push(path);
            }
        }
    }
    out
}

/// Every blob entry on disk, with the pack file holding it.
fn entries_on_disk(root: &Path) -> HashMap<Score, (PathBuf, BlobEntry)> {
    let mut out = HashMap::new();
    for path in pack_files(root) {
        let bytes = std::fs::read(&path).expect("read pack");
        for e in decode_pack_trailer(&bytes).expect("pack trailer") {
            out.insert(e.score, (path.clone(), e));
        }
    }
    out
}

fn delta_depth(entries: &HashMap<Score, (PathBuf, BlobEntry)>, s: &Score) -> usize {
    let mut depth = 0;
    let mut at = *s;
    while let Some(base) = entries.get(&at).and_then(|(_, e)| e.base) {
        depth += 1;
        assert!(depth <= 64, "a cycle of delta bases");
        at = base.score;
    }
    depth
}

#[test]
fn versions_stored_as_deltas_take_less_and_restore_bit_for_bit() {
    let plain_dir = tempfile::tempdir().expect("tempdir");
    let plain_repo = open(&durable_at(plain_dir.path()));
    let (_, plain) = write_series(&plain_repo, 8, false);

    let dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_at(dir.path());
    let (_, stats) = write_series(&open(&durable), 8, true);

    assert_eq!(plain.iter().map(|s| s.delta_chunks).sum::<u64>(), 0);
    for (v, s) in stats.iter().enumerate().skip(1) {
        assert!(s.new_chunks <= 48, "version {v}: {s:?}");
        if v == MAX_DELTA_DEPTH + 1 {
            // Its bases are deltas MAX_DELTA_DEPTH deep: it is stored whole.
            assert_eq!(s.delta_chunks, 0, "version {v}: {s:?}");
        } else {
            // 48 of the 64 chunks change; a few may compress better on their own.
            assert!(s.delta_chunks >= 40, "version {v}: {s:?}");
        }
    }
    let stored = |s: &[WriteStats]| s.iter().map(|s| s.stored_data_bytes).sum::<u64>();
    let (with, without) = (stored(&stats), stored(&plain));
    assert!(
        with * 3 < without * 2,
        "deltas stored {with} bytes, whole chunks {without}"
    );

    // A reopened repository (its index read from the index objects) restores every version.
    let reopened = Repo::open_existing(durable, DEFAULT_PREFIX)
        .expect("open")
        .expect("a repository");
    for v in 0..8 {
        assert!(
            restore(&reopened, &format!("v{v}")).expect("restore") == version(v),
            "version {v} differs"
        );
    }

    let entries = entries_on_disk(dir.path());
    let deltas: Vec<&Score> = entries
        .iter()
        .filter(|(_, (_, e))| e.stored == Stored::Delta)
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        deltas.len() as u64,
        stats.iter().map(|s| s.delta_chunks).sum::<u64>()
    );
    let deepest = deltas
        .iter()
        .map(|s| delta_depth(&entries, s))
        .max()
        .expect("deltas");
    assert_eq!(
        deepest, MAX_DELTA_DEPTH,
        "chains reach the limit and stop there"
    );
}

#[test]
fn a_base_whose_bytes_are_wrong_costs_ratio_not_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = open(&durable_at(dir.path()));
    let (recipes, _) = write_series(&repo, 1, true);
    let next = version(1);
    for wrong in [version(5), version(0)[..1000].to_vec(), Vec::new()] {
        let mut w = repo.writer();
        let base = FileBase {
            recipe: &recipes[0],
            bytes: &wrong,
        };
        let recipe = w
            .add_file_with_base("model.pt", next.as_slice(), Some(base))
            .expect("add_file_with_base");
        let stats = w.finish().expect("finish");
        assert_eq!(stats.delta_chunks, 0, "wrong base of {} bytes", wrong.len());
        repo.write_manifest("next", vec![recipe]).expect("manifest");
        assert!(restore(&repo, "next").expect("restore") == next);
    }
}

#[test]
fn collecting_the_versions_deltas_came_from_keeps_their_bases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_at(dir.path());
    let repo = open(&durable);
    // v5 is stored whole (its bases would be too deep), v6 as deltas on it: keeping only v6
    // frees v0..v4 but must keep v5's packs, which no kept manifest uses directly.
    let last = MAX_DELTA_DEPTH as u32 + 2;
    let (_, stats) = write_series(&repo, last + 1, true);
    assert!(stats[last as usize].delta_chunks > 0);
    let before = pack_files(dir.path()).len();
    let report = repo
        .prune(&PruneSelection::KeepNewest(1), &GcOptions::default())
        .expect("prune");
    assert_eq!(report.forgotten.len(), last as usize);
    let after = pack_files(dir.path()).len();
    assert!(after < before, "no pack was freed ({before} packs)");
    let reopened = Repo::open_existing(durable, DEFAULT_PREFIX)
        .expect("open")
        .expect("a repository");
    let name = format!("v{last}");
    assert!(restore(&reopened, &name).expect("restore") == version(last));
}

#[test]
fn a_corrupt_base_makes_its_deltas_fail_to_restore() {
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_at(dir.path());
    write_series(&open(&durable), 2, true);
    let entries = entries_on_disk(dir.path());
    let (_, delta) = entries
        .values()
        .find(|(_, e)| e.stored == Stored::Delta)
        .expect("a delta blob");
    let base = delta.base.expect("its base");
    let (pack, base_entry) = &entries[&base.score];
    let mut bytes = std::fs::read(pack).expect("read pack");
    let at = (base_entry.offset + base_entry.stored_len / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(pack, &bytes).expect("write pack");

    let reopened = Repo::open_existing(durable, DEFAULT_PREFIX)
        .expect("open")
        .expect("a repository");
    let err = restore(&reopened, "v1").expect_err("v1 needs the corrupt base");
    assert!(err.contains("corrupt"), "{err}");
    let err = restore(&reopened, "v0").expect_err("v0 holds the corrupt base");
    assert!(err.contains("corrupt"), "{err}");
}

/// A blob as a staging server receives it from an agent: in its stored form.
enum Sent {
    Whole(Score, BlobKind, Stored, Vec<u8>, u32),
    Delta(Score, DeltaBase, Vec<u8>, u32),
}

/// What an agent sends for `new`, the next version of the file `base_recipe` describes
/// (`old` its bytes): every chunk and recipe block, the data chunks the repository lacks as
/// deltas against `old` where that wins. Also the new file's recipe.
fn sent_by_an_agent(
    repo: &Repo,
    base_recipe: &FileRecipe,
    old: &[u8],
    new: &[u8],
) -> (Vec<Sent>, FileRecipe) {
    let chunking: Chunking = "fixed:16KiB".parse().expect("chunking");
    let zstd = Compression::Zstd { level: 1 };
    let base = repo
        .base_file(FileBase {
            recipe: base_recipe,
            bytes: &old,
        })
        .expect("the old version's chunks");
    let whole = |s, kind, raw: &[u8]| match zstd.compress(raw) {
        Some(z) => Sent::Whole(s, kind, Stored::Zstd, z, raw.len() as u32),
        None => Sent::Whole(s, kind, Stored::Raw, raw.to_vec(), raw.len() as u32),
    };
    let mut sent = Vec::new();
    let mut leaves = Vec::new();
    for r in chunking.split(new) {
        let raw = &new[r.clone()];
        let s = score(raw);
        leaves.push((s, raw.len() as u64));
        sent.push(match base.pack(zstd, r.start as u64, raw) {
            Some(Packed {
                bytes,
                base: Some(b),
            }) => Sent::Delta(s, b, bytes, raw.len() as u32),
            _ => whole(s, BlobKind::Data, raw),
        });
    }
    let (root, blocks) = recipe_blocks(&leaves);
    sent.extend(blocks.iter().map(|(s, b)| whole(*s, BlobKind::Tree, b)));
    let recipe = FileRecipe {
        path: "model.pt".to_string(),
        size: new.len() as u64,
        blake3: blake3::hash(new).to_hex().to_string(),
        root: to_hex(&root),
    };
    (sent, recipe)
}

/// Pushes `sent` as a staging server does (one writer of blobs only); the writer's stats.
fn push(repo: &Repo, sent: &[Sent]) -> WriteStats {
    let mut w = repo.writer();
    for blob in sent {
        match blob {
            Sent::Whole(s, kind, stored, bytes, raw_len) => w
                .add_stored(*s, *kind, *raw_len, *stored, bytes)
                .expect("add_stored"),
            Sent::Delta(s, base, frame, raw_len) => w
                .add_stored_delta(*s, *raw_len, *base, frame)
                .expect("add_stored_delta"),
        };
    }
    w.finish().expect("finish")
}

#[test]
fn deltas_made_elsewhere_are_kept_as_they_came_or_stored_whole_once_their_base_is_condemned() {
    let (old, new) = (version(0), version(1));

    // The base usable: the deltas are stored as they came.
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_at(dir.path());
    let repo = open(&durable);
    let (recipes, _) = write_series(&repo, 1, true);
    let (sent, recipe) = sent_by_an_agent(&repo, &recipes[0], &old, &new);
    // Unchanged chunks (the frozen quarter) are in the repository already: not stored.
    let deltas = sent
        .iter()
        .filter(|b| matches!(b, Sent::Delta(s, ..) if !repo.missing(&[*s]).is_empty()))
        .count() as u64;
    assert!(deltas > 0);
    let server = open(&durable);
    let stats = push(&server, &sent);
    assert_eq!(stats.delta_chunks, deltas, "{stats:?}");
    server
        .write_manifest("v1", vec![recipe.clone()])
        .expect("manifest");
    let fresh = open(&durable);
    assert!(restore(&fresh, "v1").expect("restore") == new);
    let on_disk = entries_on_disk(dir.path());
    assert!(on_disk.values().any(|(_, e)| e.stored == Stored::Delta));

    // A delta on a base the repository does not have is refused, and the writer goes on.
    let mut w = server.writer();
    let nowhere = DeltaBase {
        score: [7; 32],
        from: 0,
    };
    match w.add_stored_delta([8; 32], 100, nowhere, b"frame") {
        Err(RepoError::Missing(_)) => {}
        other => panic!("a delta on a missing base: {other:?}"),
    }
    w.finish().expect("finish");

    // The base condemned after the server checked it (its hold keeps the pack): the
    // chunks are rebuilt with the base and stored whole, and the base's pack can go.
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_at(dir.path());
    let repo = open(&durable);
    let (recipes, _) = write_series(&repo, 1, true);
    let (sent, recipe) = sent_by_an_agent(&repo, &recipes[0], &old, &new);
    let server = open(&durable);
    let hold = server.hold().expect("hold");
    let collector = Repo::open_for_maintenance(durable.clone(), DEFAULT_PREFIX)
        .expect("open")
        .expect("repo");
    collector.forget("v0").expect("forget");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert_eq!(r.packs_deleted, 0, "{r:?}");
    assert!(r.packs_waiting > 0 && r.sessions_waited_for == 1, "{r:?}");
    let stats = push(&server, &sent);
    assert_eq!(stats.delta_chunks, 0, "{stats:?}");
    server.write_manifest("v1", vec![recipe]).expect("manifest");
    hold.end(&server);
    server.wait_session_ends();
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert!(r.packs_deleted > 0, "{r:?}");
    let fresh = open(&durable);
    assert!(restore(&fresh, "v1").expect("restore") == new);
    assert!(entries_on_disk(dir.path())
        .values()
        .all(|(_, e)| e.stored != Stored::Delta));
}

/// A blob stored twice, once as a delta whose base is gone: a writer stored version 1 as
/// deltas on version 0 and died before its manifest (its packs and index object stay), then
/// version 0 was pruned; a later writer, seeing the broken chains, stored version 1's chunks
/// again. Every repository opened afterwards reads the copy it can rebuild, whatever order
/// it loads the index objects in (it used to take whichever came first: one restore in two
/// failed with "in no index").
#[test]
fn a_blob_whose_delta_copy_lost_its_base_is_read_from_its_other_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("durable");
    let repo = open(&durable_at(&root));
    let (v0, v1) = (version(0), version(1));
    let mut w = repo.writer();
    let r0 = w.add_file("model.pt", v0.as_slice()).expect("add v0");
    w.finish().expect("finish");
    repo.write_manifest("v0", vec![r0.clone()])
        .expect("manifest");
    let mut w = repo.writer();
    let base = FileBase {
        recipe: &r0,
        bytes: &v0,
    };
    w.add_file_with_base("model.pt", v1.as_slice(), Some(base))
        .expect("add v1");
    assert!(w.finish().expect("finish").delta_chunks > 0);
    // The writer's process dies before the manifest: its session ends with it.
    drop(repo);

    let collector = open(&durable_at(&root));
    collector.forget("v0").expect("forget");
    let r = collector
        .collect_garbage(&GcOptions::default())
        .expect("gc");
    assert!(r.packs_deleted > 0, "{r:?}");
    drop(collector);

    let repo = open(&durable_at(&root));
    let mut w = repo.writer();
    let r1 = w.add_file("model.pt", v1.as_slice()).expect("add v1 again");
    assert!(w.finish().expect("finish").new_chunks > 0);
    repo.write_manifest("v1", vec![r1.clone()])
        .expect("manifest");
    drop(repo);

    for i in 0..12 {
        let repo = open(&durable_at(&root));
        let mut out = Vec::new();
        repo.restore_file(&r1, &mut out)
            .unwrap_or_else(|e| panic!("restore {i} of v1: {e}"));
        assert!(out == v1, "restore {i} of v1 differs");
    }
}
