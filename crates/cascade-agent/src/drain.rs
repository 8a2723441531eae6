//! One-shot drains (`cascade drain`): a checkpoint in the store sent to the durable store
//! at once, outside the agent's passes, in the plain layout or the dedup repository.
//!
//! Files are read straight out of the store's shared-memory data region through the
//! chunk-list API ([`StoreFileReader`]); spilled chunks and holes go through
//! `File::read_at`. A drain writes the data of every file, then every checksum, then the
//! completion marker (docs/durable-layout.md), so a partial drain is never complete.

use std::time::Instant;

use cascade_durable::{DurableStore, MarkerFile, MARKER_NAME};
use cascade_store::{FileKind, OpenOptions, Store};

use crate::deltas::{matching_recipe, with_base};
use crate::reader::StoreFileReader;
use crate::report::{marker_file, Progress, Report};
use crate::{Error, Result};

/// The durable name of a store path: the path without its leading '/'
/// ("/ckpt.0001" -> "ckpt.0001").
pub fn checkpoint_name(store_path: &str) -> Result<String> {
    let rel =
        cascade_durable::normalize_rel(store_path.trim_end_matches('/')).map_err(Error::Durable)?;
    if rel.is_empty() {
        return Err(Error::InvalidCheckpoint {
            path: store_path.to_string(),
            reason: "the store root is not a checkpoint; name a directory or a file".into(),
        });
    }
    Ok(rel)
}

/// A checkpoint in the store, as a one-shot drain sends it.
struct StoreCheckpoint {
    /// Its durable name ([`checkpoint_name`]).
    name: String,
    single_file: bool,
    /// (path relative to the checkpoint, store path) of each file ([`checkpoint_files`]).
    files: Vec<(String, String)>,
}

/// The checkpoint at store path `path`.
fn checkpoint_at(store: &Store, path: &str) -> Result<StoreCheckpoint> {
    let name = checkpoint_name(path)?;
    let single_file = !store
        .stat(path)
        .map_err(|e| Error::store(path, e))?
        .is_dir();
    Ok(StoreCheckpoint {
        name,
        single_file,
        files: checkpoint_files(store, path)?,
    })
}

/// Files of a checkpoint in the store: (path relative to the checkpoint, store path), in
/// name order, depth first. A single file is a checkpoint of one file under its base name.
fn checkpoint_files(store: &Store, path: &str) -> Result<Vec<(String, String)>> {
    let meta = store.stat(path).map_err(|e| Error::store(path, e))?;
    let mut out = Vec::new();
    if meta.is_dir() {
        walk(store, path.trim_end_matches('/'), "", &mut out)?;
    } else {
        let base = path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(path);
        out.push((base.to_string(), path.to_string()));
    }
    Ok(out)
}

fn walk(store: &Store, dir: &str, rel: &str, out: &mut Vec<(String, String)>) -> Result<()> {
    let entries = store.read_dir(dir).map_err(|e| Error::store(dir, e))?;
    for entry in entries {
        let child = format!("{dir}/{}", entry.name);
        let child_rel = if rel.is_empty() {
            entry.name.clone()
        } else {
            format!("{rel}/{}", entry.name)
        };
        match entry.kind {
            FileKind::Dir => walk(store, &child, &child_rel, out)?,
            FileKind::File => {
                if cascade_durable::is_reserved_name(&entry.name) {
                    return Err(Error::InvalidCheckpoint {
                        path: child,
                        reason: format!(
                            "the names {MARKER_NAME}, *{}, *{MARKER_NAME} and .*{} are \
                             reserved in a checkpoint",
                            cascade_durable::CHECKSUM_SUFFIX,
                            cascade_durable::VERSION_SUFFIX
                        ),
                    });
                }
                out.push((child_rel, child));
            }
        }
    }
    Ok(())
}

/// Runs `f` on a reader of the store file `store_path` (straight from the store's memory),
/// reporting `done` plus what it has read to `progress`.
fn read_store_file<T>(
    store: &Store,
    store_path: &str,
    done: u64,
    progress: Progress<'_>,
    f: impl FnOnce(StoreFileReader<'_>) -> Result<T>,
) -> Result<T> {
    let file = store
        .open(store_path, &OpenOptions::new().read(true))
        .map_err(|e| Error::store(store_path, e))?;
    let reader = StoreFileReader::new(store, &file)
        .map_err(|e| Error::store(store_path, e))?
        .with_progress(done, progress);
    f(reader)
}

/// What [`drain_checkpoint_dedup`] moved, what it cost, and the checkpoint its deltas are
/// against (durable name), if any.
pub type DedupDrain = (Report, cascade_dedup::repo::WriteStats, Option<String>);

/// Stores the checkpoint at `path` in the dedup repository `repo` under
/// [`checkpoint_name`]`(path)` (docs/dedup.md): every file is cut into chunks read straight
/// from the store, each chunk the repository lacks is stored once (compressed where it pays),
/// then the index and, last, the manifest. With `delta`, each file is added with the same
/// file of the previous drained checkpoint of its directory as its base ([`previous_drained`]).
/// Returns what was moved and what it cost.
pub fn drain_checkpoint_dedup(
    store: &Store,
    path: &str,
    repo: &cascade_dedup::repo::Repo,
    delta: bool,
    progress: Progress<'_>,
) -> Result<DedupDrain> {
    let started = Instant::now();
    let StoreCheckpoint {
        name: ckpt,
        single_file,
        files,
    } = checkpoint_at(store, path)?;
    let previous = if delta && repo.compression() != cascade_dedup::Compression::None {
        previous_drained(store, repo, path)
    } else {
        None
    };
    // A plain marker of an earlier drain would be read instead of the new manifest.
    repo.durable()
        .delete_marker(&ckpt)
        .map_err(Error::Durable)?;
    let mut writer = repo.writer();
    let mut recipes = Vec::with_capacity(files.len());
    let mut done = 0u64;
    for (rel, store_path) in &files {
        // The previous version, read straight from the store; bytes that are not what its
        // recipe says cost deltas, never data.
        let base = previous.as_ref().and_then(|(prev_path, manifest)| {
            let recipe = matching_recipe(&manifest.files, rel, files.len())?;
            let base_path = if manifest.single_file {
                prev_path.clone()
            } else {
                format!("{prev_path}/{}", recipe.path)
            };
            let file = store
                .open(&base_path, &OpenOptions::new().read(true))
                .ok()?;
            Some((recipe, file))
        });
        let recipe = read_store_file(store, store_path, done, progress, |reader| {
            with_base(store, base.as_ref(), |base| {
                Ok(writer.add_file_with_base(rel, reader, base)?)
            })
        })?;
        done += recipe.size;
        progress(done);
        recipes.push(recipe);
    }
    let stats = writer.finish()?;
    let manifest = if single_file && recipes.len() == 1 {
        repo.write_single_file_manifest(&ckpt, recipes.remove(0))?
    } else {
        repo.write_manifest(&ckpt, recipes)?
    };
    let files = manifest.files.iter().map(marker_file).collect();
    let report = Report {
        checkpoint: ckpt,
        files,
        bytes: done,
        seconds: started.elapsed().as_secs_f64(),
    };
    let against = previous.and_then(|(p, _)| checkpoint_name(&p).ok());
    Ok((report, stats, against))
}

/// The previous checkpoint of `path`'s series for a drain: of the committed checkpoints of
/// the same kind (a directory, or a file) in the same store directory, committed before it
/// (or any, if it is not committed), the newest of the three newest that has a manifest in
/// `repo`; its store path and manifest.
pub fn previous_drained(
    store: &Store,
    repo: &cascade_dedup::repo::Repo,
    path: &str,
) -> Option<(String, cascade_dedup::repo::Manifest)> {
    let root = store.life_tree(path).ok()?.into_iter().next()?;
    let parent = root.parent_dir().to_string();
    let mut siblings: Vec<_> = store
        .life_tree(&parent)
        .ok()?
        .into_iter()
        .filter(|e| {
            e.parent_dir() == parent
                && e.path != root.path
                && e.kind == root.kind
                && e.committed
                && (!root.committed || e.commit_seq < root.commit_seq)
        })
        .collect();
    siblings.sort_by_key(|e| std::cmp::Reverse(e.commit_seq));
    siblings.into_iter().take(3).find_map(|e| {
        let manifest = repo.read_manifest(&checkpoint_name(&e.path).ok()?).ok()??;
        Some((e.path, manifest))
    })
}

/// Uploads the checkpoint at `path` in the store (a directory, or a single file) to
/// `durable` under [`checkpoint_name`]`(path)`: first removes an old marker, then uploads
/// every file's data (read straight from the store) and its checksum, then the marker.
/// `progress` gets the data bytes uploaded so far.
pub fn drain_checkpoint(
    store: &Store,
    path: &str,
    durable: &DurableStore,
    progress: Progress<'_>,
) -> Result<Report> {
    let started = Instant::now();
    let StoreCheckpoint {
        name: ckpt,
        single_file,
        files,
    } = checkpoint_at(store, path)?;
    // A re-drain must never look complete while its data is being replaced.
    durable.delete_marker(&ckpt).map_err(Error::Durable)?;
    let mut entries = Vec::with_capacity(files.len());
    let mut done = 0u64;
    for (rel, store_path) in &files {
        let key = if single_file {
            ckpt.clone()
        } else {
            format!("{ckpt}/{rel}")
        };
        let digest = read_store_file(store, store_path, done, progress, |reader| {
            let len = reader.len();
            durable
                .put_version(&key, cascade_durable::now_unix_ns())
                .map_err(Error::Durable)?;
            durable.put_file(&key, reader, len).map_err(Error::Durable)
        })?;
        durable
            .put_checksum(&key, &digest)
            .map_err(Error::Durable)?;
        done += digest.size;
        progress(done);
        entries.push(MarkerFile {
            path: rel.clone(),
            size: digest.size,
            blake3: digest.blake3,
        });
    }
    durable
        .write_marker_of(&ckpt, single_file, entries.clone())
        .map_err(Error::Durable)?;
    Ok(Report {
        checkpoint: ckpt,
        files: entries,
        bytes: done,
        seconds: started.elapsed().as_secs_f64(),
    })
}
