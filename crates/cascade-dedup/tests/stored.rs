//! The repository API writers outside `RepoWriter::add_file` use (staging servers pushing the
//! chunks agents sent): recipe trees built apart give the writer's roots, blobs added in
//! their stored form restore byte for byte, a manifest described by another writer keeps its
//! specs, and `refresh_index` learns another writer's blobs without reloading the rest.

use std::sync::Arc;

use cascade_dedup::repo::format::{recipe_blocks, BlobKind, Stored};
use cascade_dedup::repo::{FileRecipe, Manifest, Repo, MANIFEST_FORMAT};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Chunking, Compression};
use cascade_durable::DurableStore;
use cascade_testkit::{counting_doubles, random};

fn store(dir: &tempfile::TempDir) -> Arc<DurableStore> {
    Arc::new(DurableStore::open(dir.path().join("durable").to_str().unwrap()).unwrap())
}

fn repo(durable: &Arc<DurableStore>, prefix: &str, chunking: &str) -> Repo {
    Repo::open(
        durable.clone(),
        prefix,
        chunking.parse().unwrap(),
        Compression::None,
    )
    .unwrap()
}

#[test]
fn recipe_blocks_build_the_trees_the_writer_builds() {
    let dir = tempfile::tempdir().unwrap();
    let durable = store(&dir);
    let repo = repo(&durable, "r", "fixed:512B");
    let chunking: Chunking = "fixed:512B".parse().unwrap();
    // 2 400 chunks: three level-0 blocks under a level-1 root.
    for data in [random(1_228_800, 1), Vec::new(), b"tiny".to_vec()] {
        let mut w = repo.writer();
        let recipe = w.add_file("f", data.as_slice()).unwrap();
        w.finish().unwrap();
        let leaves: Vec<_> = chunking
            .split(&data)
            .map(|r| (score(&data[r.clone()]), r.len() as u64))
            .collect();
        let (root, blocks) = recipe_blocks(&leaves);
        assert_eq!(recipe.root, to_hex(&root), "{} bytes", data.len());
        assert_eq!(blocks.last().map(|b| b.0), Some(root));
        for (s, bytes) in &blocks {
            assert_eq!(score(bytes), *s);
            assert!(repo.read_blob(s).unwrap() == *bytes);
        }
    }
}

#[test]
fn stored_blobs_restore_and_a_described_manifest_keeps_its_specs() {
    let dir = tempfile::tempdir().unwrap();
    let durable = store(&dir);
    let repo = repo(&durable, "srv", "cdc:avg=64KiB");
    let chunking: Chunking = "cdc:avg=16KiB".parse().unwrap();
    let zstd: Compression = "zstd:1".parse().unwrap();
    let mut data = random(300_000, 2);
    data.extend(counting_doubles(200_000, 1, 97));
    let mut w = repo.writer();
    let mut leaves = Vec::new();
    let mut compressed = 0;
    for r in chunking.split(&data) {
        let raw = &data[r];
        let s = score(raw);
        leaves.push((s, raw.len() as u64));
        let added = match zstd.compress(raw) {
            Some(frame) => {
                compressed += 1;
                w.add_stored(s, BlobKind::Data, raw.len() as u32, Stored::Zstd, &frame)
            }
            None => w.add_stored(s, BlobKind::Data, raw.len() as u32, Stored::Raw, raw),
        };
        assert!(added.unwrap());
    }
    assert!(compressed > 0);
    let (root, blocks) = recipe_blocks(&leaves);
    for (s, bytes) in &blocks {
        assert!(w
            .add_stored(*s, BlobKind::Tree, bytes.len() as u32, Stored::Raw, bytes)
            .unwrap());
    }
    // Known to this writer already: skipped.
    let first = &data[chunking.split(&data).next().unwrap()];
    assert!(!w
        .add_stored(
            score(first),
            BlobKind::Data,
            first.len() as u32,
            Stored::Raw,
            first
        )
        .unwrap());
    w.finish().unwrap();

    let recipe = FileRecipe {
        path: "rank0.dat".into(),
        size: data.len() as u64,
        blake3: blake3::hash(&data).to_hex().to_string(),
        root: to_hex(&root),
    };
    let written = repo
        .write_prepared_manifest(Manifest {
            format: String::new(),
            checkpoint: "run/ckpt.1".into(),
            created_unix_ns: 1,
            chunking: chunking.to_string(),
            compression: zstd.to_string(),
            files: vec![recipe.clone()],
            packs: None,
            single_file: false,
        })
        .unwrap();
    assert_eq!(written.format, MANIFEST_FORMAT);
    let m = repo.read_manifest("run/ckpt.1").unwrap().unwrap();
    assert_eq!(
        (m.chunking.as_str(), m.compression.as_str()),
        ("cdc:avg=16KiB", "zstd:1")
    );
    let mut out = Vec::new();
    repo.restore_file(&m.files[0], &mut out).unwrap();
    assert!(out == data);

    // A root the index lacks is refused, as for write_manifest.
    let missing = Manifest {
        files: vec![FileRecipe {
            root: to_hex(&[7; 32]),
            ..recipe
        }],
        ..m
    };
    assert!(repo.write_prepared_manifest(missing).is_err());
}

#[test]
fn refresh_index_learns_what_another_writer_added() {
    let dir = tempfile::tempdir().unwrap();
    let durable = store(&dir);
    let reader = repo(&durable, "shared", "fixed:4KiB");
    let writer = repo(&durable, "shared", "fixed:4KiB");
    assert_eq!(reader.refresh_index().unwrap(), 0);
    let data = random(40_000, 3);
    let mut w = writer.writer();
    let recipe = w.add_file("f", data.as_slice()).unwrap();
    w.finish().unwrap();
    let root = cascade_dedup::score::from_hex(&recipe.root).unwrap();
    assert_eq!(reader.missing(&[root]), vec![root]);
    assert_eq!(reader.refresh_index().unwrap(), 1);
    assert!(reader.missing(&[root]).is_empty());
    assert_eq!(reader.refresh_index().unwrap(), 0);
    // The writer's own session is not loaded again.
    assert_eq!(writer.refresh_index().unwrap(), 0);
    let mut out = Vec::new();
    reader.restore_file(&recipe, &mut out).unwrap();
    assert!(out == data);
}
