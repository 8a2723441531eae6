//! Checkpoints in the durable store's dedup repository (docs/dedup.md, "In the agent").
//!
//! With dedup configured, the agent stores each committed checkpoint to flush whole: every
//! file is cut into chunks read straight from the store, each chunk the repository lacks is
//! stored once (compressed where it pays), then the index, then the manifest — the
//! checkpoint's completion record. Read-through rebuilds a missing file from its recipe,
//! verifying every chunk's score and the file's BLAKE3.

use std::sync::Arc;
use std::time::Instant;

use cascade_dedup::repo::{FileBase, FileRecipe, Manifest, Repo, DEFAULT_PREFIX};
use cascade_dedup::{Chunking, Compression};
use cascade_store::{FileKind, LifeEntry, Store};

use crate::daemon::{key_of, path_in_checkpoint, Agent, Checkpoint, PassOutcome};
use crate::reader::StoreFileReader;
use crate::restore::write_fetched;
use crate::{Error, Result};

/// How checkpoints are cut and stored in the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupOptions {
    pub chunking: Chunking,
    pub compression: Compression,
    /// Add each file with the same file of the previous checkpoint in its series as its base
    /// (docs/dedup.md, "Delta blobs"); only with compression.
    pub delta: bool,
}

/// The checkpoint before the one being stored, in its series: the base of its deltas.
pub(crate) struct PreviousVersion<'a> {
    pub(crate) checkpoint: String,
    root: &'a LifeEntry,
    files: Vec<&'a LifeEntry>,
    /// Its files as its manifest records them.
    recipes: Vec<FileRecipe>,
}

impl PreviousVersion<'_> {
    /// The previous version of the file at `path` (in a checkpoint of `files` files): the
    /// file at the same path, or the one file of a checkpoint that is one file; its recipe
    /// and its store entry, if the store still holds the version the recipe describes.
    pub(crate) fn base_of(&self, path: &str, files: usize) -> Option<(&FileRecipe, &LifeEntry)> {
        let recipe = matching_recipe(&self.recipes, path, files)?;
        let entry = self
            .files
            .iter()
            .find(|f| path_in_checkpoint(self.root, f) == recipe.path)
            .filter(|f| f.durable() && f.size == recipe.size)?;
        Some((recipe, entry))
    }
}

/// Of the previous checkpoint's `recipes`, the previous version of the file at `path` (in a
/// checkpoint of `files` files): the file at the same path, or the one file when both
/// checkpoints are one file each (single files named per epoch, say).
pub(crate) fn matching_recipe<'r>(
    recipes: &'r [FileRecipe],
    path: &str,
    files: usize,
) -> Option<&'r FileRecipe> {
    match recipes.iter().find(|r| r.path == path) {
        Some(r) => Some(r),
        None if files == 1 && recipes.len() == 1 => recipes.first(),
        None => None,
    }
}

/// Runs `f` with the delta base made of a recipe and the open store file it describes (read
/// by offset straight from the store), if there is one.
pub(crate) fn with_base<T>(
    store: &Store,
    base: Option<&(&FileRecipe, cascade_store::File)>,
    f: impl FnOnce(Option<FileBase<'_>>) -> T,
) -> T {
    let reader = base.and_then(|(_, file)| StoreFileReader::new(store, file).ok());
    f(base
        .zip(reader.as_ref())
        .map(|((recipe, _), bytes)| FileBase { recipe, bytes }))
}

/// A checkpoint file found in a manifest of the repository.
pub(crate) struct RepoFile {
    repo: Arc<Repo>,
    recipe: FileRecipe,
    /// When its manifest was written.
    pub(crate) written_unix_ns: u64,
}

/// The recipe of file `key` in manifest `m` of checkpoint `ckpt` (`key` itself, or a
/// directory above it), if it names the file.
pub(crate) fn recipe_in(ckpt: &str, m: Manifest, key: &str) -> Option<FileRecipe> {
    let rel = if m.single_file {
        (ckpt == key).then(|| ckpt.rsplit('/').next().unwrap_or(ckpt).to_string())
    } else {
        key.strip_prefix(ckpt)
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_string)
    }?;
    m.files.into_iter().find(|f| f.path == rel)
}

impl Agent {
    /// The dedup repository: opened (and created, when dedup is on) at first use. None when
    /// dedup is off and the durable store has no repository.
    pub(crate) fn repo(&self) -> Result<Option<Arc<Repo>>> {
        let mut cached = self
            .repo
            .lock()
            .map_err(|_| Error::io("dedup", std::io::Error::other("lock poisoned")))?;
        if let Some(repo) = cached.as_ref() {
            return Ok(Some(Arc::clone(repo)));
        }
        let durable = Arc::clone(self.durable_arc());
        let repo = match self.options().dedup {
            Some(d) => Some(Repo::open(
                durable,
                DEFAULT_PREFIX,
                d.chunking,
                d.compression,
            )?),
            None => Repo::open_existing(durable, DEFAULT_PREFIX)?,
        };
        *cached = repo.map(Arc::new);
        Ok(cached.clone())
    }

    /// Drops the cached repository, so the next use reloads every index object (blobs that
    /// other writers added since it was opened).
    fn reopen_repo(&self) {
        if let Ok(mut cached) = self.repo.lock() {
            *cached = None;
        }
    }

    /// Step 2 of a pass for checkpoint `c` with dedup on: store it once nothing writes it
    /// (against `previous`, the complete checkpoint before it in its series, with deltas).
    pub(crate) fn dedup_pass(
        &self,
        c: &Checkpoint,
        previous: Option<&Checkpoint>,
        outcome: &mut PassOutcome,
    ) {
        if c.files.iter().any(|f| f.writers > 0 || f.torn) {
            outcome.blocked += 1;
            return;
        }
        outcome.pending += 1;
        if let Some(t) = self.retry_not_before(c.root, Instant::now()) {
            outcome.retry_at(t);
            return;
        }
        let result = match (self.staging(), self.options().dedup) {
            (Some(staging), Some(_)) if c.root.pushed_flag => {
                match self.complete_staged_dedup(staging, c.root) {
                    Ok(false) => {
                        // Its server writes the manifest once the blobs are pushed.
                        outcome.pending -= 1;
                        outcome.staged += 1;
                        outcome.retry_at(Instant::now() + crate::staging::PULL_EVERY);
                        return;
                    }
                    other => other,
                }
            }
            (Some(staging), Some(d)) => {
                match self.stage_checkpoint_dedup(staging, d, c.root, previous) {
                    Err(e) => {
                        // Unacknowledged: the checkpoint goes straight to the durable store.
                        self.record_failure(format!(
                            "sending {} to the staging servers failed: {e}; storing it in the \
                         durable store's dedup repository instead",
                            c.root.path
                        ));
                        self.store_checkpoint_dedup(c.root, previous)
                    }
                    other => other,
                }
            }
            _ => self.store_checkpoint_dedup(c.root, previous),
        };
        match result {
            Ok(true) => {
                self.forget_retry(c.root);
                outcome.pending -= 1;
                outcome.progressed = true;
            }
            // Changed meanwhile: the next pass sees the new version.
            Ok(false) => outcome.progressed = true,
            Err(e) => {
                let (attempts, delay) = self.schedule_retry(c.root);
                outcome.retry_at(Instant::now() + delay);
                self.record_failure(format!(
                    "storing {} in the dedup repository failed (attempt {attempts}): {e}; \
                     retrying in {:.1} s",
                    c.root.path,
                    delay.as_secs_f64()
                ));
            }
        }
    }

    /// Stores checkpoint `root` in the repository and records it complete; false if it
    /// changed or went away meanwhile (nothing recorded; a manifest already written for a
    /// version that changed under the reads is taken back). With deltas on, each file is
    /// added with the same file of `previous` as its base.
    fn store_checkpoint_dedup(
        &self,
        root: &LifeEntry,
        previous: Option<&Checkpoint>,
    ) -> Result<bool> {
        let started = Instant::now();
        let Some(tree) = self.closed_checkpoint(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
        let Some(repo) = self.repo()? else {
            return Ok(false);
        };
        let ckpt = key_of(&now_root.path);
        // A plain marker of an earlier drain would be read instead of the new manifest.
        self.durable().delete_marker(ckpt).map_err(Error::Durable)?;
        let previous = match self.options().dedup {
            Some(d) if d.delta && d.compression != Compression::None => {
                previous.and_then(|p| self.previous_version(&repo, p))
            }
            _ => None,
        };
        let store = self.store();
        let mut writer = repo.writer();
        let mut recipes = Vec::with_capacity(files.len());
        for f in &files {
            let Some(file) = self.open_snapshot_file(f)? else {
                return Ok(false);
            };
            let reader =
                StoreFileReader::new(store, &file).map_err(|e| Error::store(&f.path, e))?;
            let path = path_in_checkpoint(now_root, f);
            // The base is read like the file itself, straight from the store; a base that
            // went away or changed costs deltas only (its bytes are checked).
            let base = previous
                .as_ref()
                .and_then(|p| p.base_of(&path, files.len()));
            let base = base
                .and_then(|(recipe, e)| Some((recipe, self.open_snapshot_file(e).ok().flatten()?)));
            recipes.push(with_base(store, base.as_ref(), |base| {
                writer.add_file_with_base(&path, reader, base)
            })?);
        }
        let stats = writer.finish()?;
        let manifest = if now_root.kind == FileKind::File && recipes.len() == 1 {
            repo.write_single_file_manifest(ckpt, recipes.remove(0))?
        } else {
            repo.write_manifest(ckpt, recipes)?
        };
        // Reads of a version that changed meanwhile may mix old and new bytes: such a
        // manifest must not stay (opening a file for writing bumps its version).
        let mut unchanged = true;
        for (f, recipe) in files.iter().zip(&manifest.files) {
            unchanged &= self.store().mark_durable(f.ino, f.generation, f.mod_seq);
            self.remember_digest(f, recipe.blake3.clone());
        }
        unchanged = unchanged
            && self
                .store()
                .mark_complete(now_root.ino, now_root.generation, now_root.mod_seq);
        if !unchanged {
            repo.forget(ckpt)?;
            return Ok(false);
        }
        self.remember_manifest(now_root, ckpt, manifest.files);
        if let Ok(mut s) = self.stats.lock() {
            s.uploaded_files += files.len() as u64;
            s.uploaded_bytes += stats.bytes;
            s.markers += 1;
            s.dedup_checkpoints += 1;
            s.dedup_bytes += stats.bytes;
            s.dedup_new_bytes += stats.new_bytes;
            s.dedup_stored_bytes += stats.stored_data_bytes + stats.stored_tree_bytes;
            s.dedup_delta_chunks += stats.delta_chunks;
        }
        self.log(|| {
            let against = previous.as_ref().map_or(String::new(), |p| {
                format!(
                    ", {} as deltas against {}",
                    stats.delta_chunks, p.checkpoint
                )
            });
            format!(
                "checkpoint {} complete in the dedup repository ({} files, {} bytes; {} of {} \
                 chunks new{against}, {} bytes stored) in {:.3} s",
                now_root.path,
                files.len(),
                stats.bytes,
                stats.new_chunks,
                stats.chunks,
                stats.stored_data_bytes + stats.stored_tree_bytes,
                started.elapsed().as_secs_f64()
            )
        });
        Ok(true)
    }

    /// Keeps checkpoint `ckpt`'s file recipes as the latest of its series (the next
    /// checkpoint's deltas need them; else they are read back from the repository).
    pub(crate) fn remember_manifest(&self, root: &LifeEntry, ckpt: &str, files: Vec<FileRecipe>) {
        if let Ok(mut latest) = self.latest_manifests.lock() {
            latest.insert(root.parent_dir().to_string(), (ckpt.to_string(), files));
        }
    }

    /// Checkpoint `p` as the previous version of the next one in its series: its manifest
    /// (remembered from storing it, else read back) and its files, still in the store. None
    /// if the repository does not hold it; a failure to read it only costs deltas.
    pub(crate) fn previous_version<'c>(
        &self,
        repo: &Repo,
        p: &Checkpoint<'c>,
    ) -> Option<PreviousVersion<'c>> {
        let ckpt = key_of(&p.root.path);
        let remembered = self
            .latest_manifests
            .lock()
            .ok()
            .and_then(|latest| latest.get(p.root.parent_dir()).cloned())
            .filter(|(key, _)| key == ckpt)
            .map(|(_, recipes)| recipes);
        let recipes = match remembered {
            Some(recipes) => recipes,
            None => repo.read_manifest(ckpt).ok()??.files,
        };
        Some(PreviousVersion {
            checkpoint: p.root.path.clone(),
            root: p.root,
            files: p.files.clone(),
            recipes,
        })
    }

    /// The manifests that could hold `key` (a durable name): its own (a single-file
    /// checkpoint, or a directory checkpoint) and each ancestor's, nearest first.
    fn manifests_around(&self, repo: &Repo, key: &str) -> Result<Vec<(String, Manifest)>> {
        let mut found = Vec::new();
        let mut candidate = key;
        loop {
            if let Some(m) = repo.read_manifest(candidate)? {
                found.push((candidate.to_string(), m));
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return Ok(found),
            }
        }
    }

    /// The recipe of file `key` in a checkpoint of the repository, if one holds it.
    pub(crate) fn find_in_repo(&self, key: &str) -> Result<Option<RepoFile>> {
        let Some(repo) = self.repo()? else {
            return Ok(None);
        };
        for (ckpt, m) in self.manifests_around(&repo, key)? {
            let written_unix_ns = m.created_unix_ns;
            if let Some(recipe) = recipe_in(&ckpt, m, key) {
                return Ok(Some(RepoFile {
                    repo,
                    recipe,
                    written_unix_ns,
                }));
            }
        }
        Ok(None)
    }

    /// True if `key` is a directory of some checkpoint in the repository (a directory
    /// checkpoint, a directory inside one, or a directory above checkpoints).
    pub(crate) fn is_dir_in_repo(&self, key: &str) -> Result<bool> {
        let Some(repo) = self.repo()? else {
            return Ok(false);
        };
        if repo.has_manifests_below(key)? {
            return Ok(true);
        }
        for (ckpt, m) in self.manifests_around(&repo, key)? {
            if m.single_file {
                continue;
            }
            if ckpt == key {
                return Ok(true);
            }
            let inside = format!("{}/", &key[ckpt.len() + 1..]);
            if m.files.iter().any(|f| f.path.starts_with(&inside)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rebuilds `file` into the store file `tmp`, verifying every chunk and the whole file;
    /// its size (on an error `tmp` is removed). A blob the loaded index does not name
    /// (written by another node since) makes it reload the index once.
    pub(crate) fn restore_from_repo(&self, file: &RepoFile, tmp: &str) -> Result<u64> {
        let attempt = |repo: &Repo| -> Result<u64> {
            write_fetched(self.store(), tmp, |out| {
                Ok(repo.restore_file(&file.recipe, out)?)
            })
        };
        match attempt(&file.repo) {
            Err(Error::Dedup(cascade_dedup::repo::Error::Missing(_))) => {
                self.reopen_repo();
                let repo = self.repo()?.ok_or_else(|| {
                    Error::io("dedup", std::io::Error::other("the repository went away"))
                })?;
                attempt(&repo)
            }
            other => other,
        }
    }
}
