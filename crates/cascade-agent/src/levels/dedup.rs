//! The durable store's dedup repository as a level (docs/dedup.md, "In the agent").
//!
//! With dedup configured, the agent stores each committed checkpoint to flush whole: every
//! file is cut into chunks read straight from the store, each chunk the repository lacks is
//! stored once (compressed where it pays), then the index, then the manifest — the
//! checkpoint's completion record. Read-through rebuilds a missing file from its recipe,
//! verifying every chunk's score and the file's BLAKE3.

use std::sync::Arc;
use std::time::Instant;

use cascade_dedup::repo::{FileRecipe, Manifest, Repo, RepoWriter, WriteStats};
use cascade_dedup::Compression;
use cascade_durable::DurableKey;
use cascade_store::{FileKind, LifeEntry};

use crate::deltas::{deltas_note, with_base, PreviousVersion};
use crate::level::{not_yet_whole, retry_later, Found, Level, Listed, Step, Unit};
use crate::node::{files_of, path_in_checkpoint, Checkpoint, Node, Reached};
use crate::reader::StoreFileReader;
use crate::repository::{LevelMove, Repository};
use crate::{Error, Result};

pub(crate) struct DedupRepository {
    repository: Arc<Repository>,
}

impl DedupRepository {
    pub(crate) fn new(repository: Arc<Repository>) -> DedupRepository {
        DedupRepository { repository }
    }

    /// Stores checkpoint `root` in the repository and records it complete — or, on a job of
    /// several nodes, this node's part of it and its files durable (the job level completes
    /// it). `Step::Changed` if it changed or went away meanwhile (nothing recorded; a
    /// manifest already written for a version that changed under the reads is taken back).
    /// With deltas on, each file is added with the same file of `previous` as its base.
    fn store_checkpoint(
        &self,
        node: &Node,
        root: &LifeEntry,
        previous: Option<&Checkpoint>,
    ) -> Result<Step> {
        let started = Instant::now();
        let Some(tree) = node.closed_checkpoint(root)? else {
            return Ok(Step::Changed);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = files_of(&tree).collect();
        let Some(repo) = self.repository.get()? else {
            return Ok(Step::Changed);
        };
        let ckpt = DurableKey::from_store_path(&now_root.path);
        let (name, part) = self.repository.stored_name(now_root, &ckpt);
        // A plain marker of an earlier drain would be read instead of the new manifest.
        node.durable.delete_marker(&ckpt).map_err(Error::Durable)?;
        let previous = previous
            .filter(|_| self.repository.deltas())
            .and_then(|p| self.repository.previous_version(&repo, p));
        let compression = self.repository.compression();
        let Some((stats, manifest)) = write_checkpoint(
            node,
            &repo,
            compression,
            now_root,
            &files,
            previous.as_ref(),
            &name,
        )?
        else {
            return Ok(Step::Changed);
        };
        let moved = self.repository.adapt(&stats);
        // Reads of a version that changed meanwhile may mix old and new bytes: such a
        // manifest must not stay (opening a file for writing bumps its version).
        let digests = manifest.files.iter().map(|r| r.blake3.as_str());
        let recorded = if part {
            node.record_files(&files, digests, Reached::Durable)
        } else {
            node.record_whole(now_root, &files, digests, Reached::Durable)
        };
        if !recorded {
            repo.forget(&name)?;
            return Ok(Step::Changed);
        }
        let what = if part {
            format!("part of {} from this node stored", now_root.path)
        } else {
            format!("checkpoint {} complete", now_root.path)
        };
        report_stored(node, &what, &stats, previous.as_ref(), started, !part);
        report_level(node, compression, moved.as_ref());
        self.repository
            .remember_manifest(now_root, &ckpt, manifest.files);
        Ok(if part {
            Step::PartStored
        } else {
            Step::Complete
        })
    }
}

/// Adds every file of checkpoint `root` to the repository (with the same file of `previous`
/// as its base, if any) with `compression`, then its manifest named `name`; None if a file
/// went away meanwhile.
fn write_checkpoint(
    node: &Node,
    repo: &Repo,
    compression: Compression,
    root: &LifeEntry,
    files: &[&LifeEntry],
    previous: Option<&PreviousVersion>,
    name: &str,
) -> Result<Option<(WriteStats, Manifest)>> {
    let writer = repo.writer().with_compression(compression);
    let Some((stats, mut recipes)) = add_checkpoint_files(node, writer, root, files, previous)?
    else {
        return Ok(None);
    };
    let manifest = if single_file(root, &recipes) {
        repo.write_single_file_manifest(name, recipes.remove(0))?
    } else {
        repo.write_manifest(name, recipes)?
    };
    Ok(Some((stats, manifest)))
}

/// Whether checkpoint `root` with these recipes is recorded as a single file.
pub(crate) fn single_file(root: &LifeEntry, recipes: &[FileRecipe]) -> bool {
    root.kind == FileKind::File && recipes.len() == 1
}

/// Adds every file of checkpoint `root` with `writer` (each with the same file of
/// `previous` as its base, if any) and finishes it: its figures and the files' recipes, in
/// order; None if a file went away meanwhile.
pub(crate) fn add_checkpoint_files(
    node: &Node,
    mut writer: RepoWriter,
    root: &LifeEntry,
    files: &[&LifeEntry],
    previous: Option<&PreviousVersion>,
) -> Result<Option<(WriteStats, Vec<FileRecipe>)>> {
    let store = &node.store;
    let mut recipes = Vec::with_capacity(files.len());
    for f in files {
        let Some(file) = node.open_snapshot_file(f)? else {
            return Ok(None);
        };
        let reader = StoreFileReader::new(store, &file).map_err(|e| Error::store(&f.path, e))?;
        let path = path_in_checkpoint(root, f);
        // The base is read like the file itself, straight from the store; a base that went
        // away or changed costs deltas only (its bytes are checked).
        let base = previous.and_then(|p| p.base_of(&path, files.len()));
        let base =
            base.and_then(|(recipe, e)| Some((recipe, node.open_snapshot_file(e).ok().flatten()?)));
        recipes.push(with_base(store, base.as_ref(), |base| {
            writer.add_file_with_base(&path, reader, base)
        })?);
    }
    Ok(Some((writer.finish()?, recipes)))
}

/// Counts and logs a checkpoint (or this node's part of one: not `whole`) stored in the
/// repository; `what` says which.
pub(crate) fn report_stored(
    node: &Node,
    what: &str,
    stats: &WriteStats,
    previous: Option<&PreviousVersion>,
    started: Instant,
    whole: bool,
) {
    let files = stats.files;
    node.count(|s| {
        s.uploaded_files += files;
        s.uploaded_bytes += stats.bytes;
        s.markers += u64::from(whole);
        s.dedup_checkpoints += 1;
        s.dedup_bytes += stats.bytes;
        s.dedup_new_bytes += stats.new_bytes;
        s.dedup_stored_bytes += stats.stored_data_bytes + stats.stored_tree_bytes;
        s.dedup_delta_chunks += stats.delta_chunks;
    });
    node.log(|| {
        let against = deltas_note(stats.delta_chunks, previous);
        format!(
            "{what} in the dedup repository ({} files, {} bytes; {} of {} chunks \
             new{against}, {} bytes stored) in {:.3} s",
            files,
            stats.bytes,
            stats.new_chunks,
            stats.chunks,
            stats.stored_data_bytes + stats.stored_tree_bytes,
            started.elapsed().as_secs_f64()
        )
    });
}

/// Shows the compression in `cascade status` and logs the adaptive level's moves.
pub(crate) fn report_level(node: &Node, used: Compression, moved: Option<&LevelMove>) {
    let shown = match moved {
        Some(m) => format!("zstd:{} (auto; last: {})", m.to, m.describe()),
        None => used.to_string(),
    };
    node.count(|s| s.dedup_compression = shown);
    if let Some(m) = moved.filter(|m| m.from != m.to) {
        node.log(|| format!("dedup compression {}", m.describe()));
    }
}

impl Level for DedupRepository {
    fn name(&self) -> String {
        "the dedup repository".to_string()
    }

    fn takes(&self) -> Option<Unit> {
        self.repository.options().map(|_| Unit::Checkpoints)
    }

    fn holds(&self, e: &LifeEntry) -> bool {
        e.durable()
    }

    fn send_checkpoint(&self, node: &Node, c: &Checkpoint, previous: Option<&Checkpoint>) -> Step {
        if let Some(step) = not_yet_whole(node, c) {
            return step;
        }
        match self.store_checkpoint(node, c.root, previous) {
            Ok(step) => step,
            Err(e) => retry_later(
                node,
                c.root,
                &format!("storing {} in the dedup repository", c.root.path),
                &e,
            ),
        }
    }

    fn find<'a>(&'a self, node: &'a Node, key: &'a DurableKey) -> Result<Option<Found<'a>>> {
        let Some(file) = self.repository.find_file(key)? else {
            return Ok(None);
        };
        Ok(Some(Found {
            stamp: file.written_unix_ns,
            fetch: Box::new(move |tmp| self.repository.restore(&node.store, &file, tmp).map(Some)),
        }))
    }

    fn is_dir(&self, _node: &Node, key: &DurableKey) -> Result<bool> {
        self.repository.is_dir(key)
    }

    fn list(&self, _node: &Node, key: &DurableKey) -> Result<Vec<Listed>> {
        self.repository.list(key)
    }
}
