//! Dedup through the staging servers (docs/dedup.md, "Through staging servers"): the agent
//! cuts a committed checkpoint into chunks and scores them here on the compute node, asks the
//! server that owns each score (rendezvous hashing over `staging.servers`) which ones it
//! lacks, and sends only those, compressed; then the recipe blocks the same way, then the
//! manifest with every score it names to the server owning the checkpoint's name. The servers
//! push packs and index objects to the durable repository and write the manifest once all
//! its blobs are there.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use cascade_dedup::ingest::Ingest;
use cascade_dedup::repo::format::{recipe_blocks, BlobKind, Stored};
use cascade_dedup::repo::{rebuild_file, FileRecipe};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Score};
use cascade_staging::protocol::{ManifestState, WireChunk};
use cascade_store::{FileKind, LifeEntry};
use rayon::prelude::*;

use crate::daemon::{key_of, path_in_checkpoint, Agent};
use crate::dedup::{recipe_in, DedupOptions};
use crate::reader::StoreFileReader;
use crate::restore::write_fetched;
use crate::staging::Staging;
use crate::{Error, Result};

/// Chunks scored, asked about and sent together.
const BATCH_BYTES: usize = 8 << 20;

/// A blob waiting to be sent: its score, kind and raw bytes.
type Blob = (Score, BlobKind, Vec<u8>);

/// Blobs on their way to their owners, grouped by server.
struct Sender<'a> {
    staging: &'a Staging,
    names: Vec<&'a str>,
    dedup: DedupOptions,
    /// Every blob score of the checkpoint (the manifest lists them all).
    all: Vec<Score>,
    seen: HashSet<Score>,
    batch: Vec<Blob>,
    batch_bytes: usize,
    sent_bytes: u64,
    sent_chunks: u64,
}

impl Sender<'_> {
    fn add(&mut self, s: Score, kind: BlobKind, data: Vec<u8>) -> Result<()> {
        if !self.seen.insert(s) {
            return Ok(());
        }
        self.all.push(s);
        self.batch_bytes += data.len();
        self.batch.push((s, kind, data));
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Per owner: which of the batch it lacks, then those, compressed where it pays.
    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let mut by_owner: Vec<Vec<&(Score, BlobKind, Vec<u8>)>> =
            vec![Vec::new(); self.names.len()];
        for b in &batch {
            by_owner[cascade_staging::owner_of(&b.0, &self.names)].push(b);
        }
        for (server, blobs) in by_owner.into_iter().enumerate() {
            if blobs.is_empty() {
                continue;
            }
            let scores: Vec<Score> = blobs.iter().map(|b| b.0).collect();
            let lacking = self
                .staging
                .with_conn(server, |c| c.lacks(&scores))
                .map_err(|e| staging_error(self.staging, server, e))?;
            let lacked: Vec<&Blob> = blobs
                .into_iter()
                .zip(lacking)
                .filter_map(|(b, lacks)| lacks.then_some(b))
                .collect();
            let compression = self.dedup.compression;
            let packed: Vec<(Option<Vec<u8>>, &Blob)> = lacked
                .into_par_iter()
                .map(|b| (compression.compress(&b.2), b))
                .collect();
            let wire: Vec<WireChunk> = packed
                .iter()
                .map(|(z, b)| WireChunk {
                    score: b.0,
                    kind: b.1,
                    stored: if z.is_some() {
                        Stored::Zstd
                    } else {
                        Stored::Raw
                    },
                    raw_len: b.2.len() as u32,
                    data: z.as_deref().unwrap_or(&b.2),
                })
                .collect();
            if wire.is_empty() {
                continue;
            }
            self.sent_chunks += wire.len() as u64;
            self.sent_bytes += wire.iter().map(|w| w.data.len() as u64).sum::<u64>();
            self.staging
                .with_conn(server, |c| c.put_chunks(&wire))
                .map_err(|e| staging_error(self.staging, server, e))?;
        }
        Ok(())
    }
}

/// Why cutting a file for the servers stopped.
enum Failed {
    Reading(std::io::Error),
    Sending(Error),
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Failed {
        Failed::Reading(e)
    }
}

fn staging_error(staging: &Staging, server: usize, e: cascade_staging::Error) -> Error {
    Error::io(
        format!("staging server {}", staging.opts.servers[server]),
        std::io::Error::other(e.to_string()),
    )
}

impl Agent {
    /// Sends checkpoint `root` through the staging servers as chunks and its manifest; records
    /// its files staged and the checkpoint pushed. False if it changed meanwhile.
    pub(crate) fn stage_checkpoint_dedup(
        &self,
        staging: &Staging,
        dedup: DedupOptions,
        root: &LifeEntry,
    ) -> Result<bool> {
        let started = Instant::now();
        let Some(tree) = self.closed_checkpoint(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
        let mut sender = Sender {
            staging,
            names: staging.opts.servers.iter().map(String::as_str).collect(),
            dedup,
            all: Vec::new(),
            seen: HashSet::new(),
            batch: Vec::new(),
            batch_bytes: 0,
            sent_bytes: 0,
            sent_chunks: 0,
        };
        let store = self.store();
        // Cut and scored here; compressed only once a server says it lacks the chunk.
        let mut ingest = Ingest::new(dedup.chunking);
        let mut recipes = Vec::with_capacity(files.len());
        let mut total = 0u64;
        for f in &files {
            let Some(file) = self.open_snapshot_file(f)? else {
                return Ok(false);
            };
            let reader =
                StoreFileReader::new(store, &file).map_err(|e| Error::store(&f.path, e))?;
            let mut leaves = Vec::new();
            let digest = ingest
                .run(reader, &|_, _, _| None, &mut |window, chunks| {
                    for c in chunks {
                        leaves.push((c.score, c.range.len() as u64));
                        sender
                            .add(c.score, BlobKind::Data, window[c.range].to_vec())
                            .map_err(Failed::Sending)?;
                    }
                    Ok(())
                })
                .map_err(|e| match e {
                    Failed::Reading(e) => Error::io(&f.path, e),
                    Failed::Sending(e) => e,
                })?;
            let size = digest.size;
            let (tree_root, blocks) = recipe_blocks(&leaves);
            for (s, bytes) in blocks {
                sender.add(s, BlobKind::Tree, bytes)?;
            }
            total += size;
            recipes.push(FileRecipe {
                path: path_in_checkpoint(now_root, f),
                size,
                blake3: to_hex(&digest.blake3),
                root: to_hex(&tree_root),
            });
        }
        sender.flush()?;
        let ckpt = key_of(&now_root.path);
        let owner = self.manifest_owner(staging, ckpt);
        let single_file = now_root.kind == FileKind::File;
        staging
            .with_conn(owner, |c| {
                c.put_manifest(
                    ckpt,
                    single_file,
                    &dedup.chunking.to_string(),
                    &dedup.compression.to_string(),
                    &recipes,
                    &sender.all,
                )
            })
            .map_err(|e| staging_error(staging, owner, e))?;
        let mut unchanged = true;
        for (f, r) in files.iter().zip(&recipes) {
            unchanged &= store.mark_staged(f.ino, f.generation, f.mod_seq);
            self.remember_digest(f, r.blake3.clone());
        }
        if !(unchanged && store.mark_pushed(now_root.ino, now_root.generation, now_root.mod_seq)) {
            return Ok(false);
        }
        if let Ok(mut s) = self.stats.lock() {
            s.staged_files += files.len() as u64;
            s.staged_bytes += total;
            s.dedup_bytes += total;
            s.dedup_new_bytes += sender.sent_bytes;
        }
        self.log(|| {
            format!(
                "checkpoint {} pushed to the staging servers as chunks ({} files, {total} bytes; \
                 {} of {} blobs sent, {} bytes) in {:.3} s",
                now_root.path,
                files.len(),
                sender.sent_chunks,
                sender.all.len(),
                sender.sent_bytes,
                started.elapsed().as_secs_f64()
            )
        });
        Ok(true)
    }

    /// Rebuilds file `key` into the store file `tmp` from a checkpoint whose manifest a
    /// staging server holds but has not written to the durable repository yet (its server
    /// could not push everything: the blobs are on the servers' SSDs, or already in the
    /// repository). Every blob comes from its owner's chunk store, else from the repository,
    /// and is checked against its score. The file's size, or None when no server holds such
    /// a manifest naming the file (or the plain layout holds a newer version).
    pub(crate) fn fetch_from_staging_dedup(
        &self,
        staging: &Staging,
        key: &str,
        tmp: &str,
    ) -> Result<Option<u64>> {
        let Some((created_unix_ns, recipe)) = self.pending_recipe(staging, key) else {
            return Ok(None);
        };
        // An unreachable durable store (why the servers could not push) hides no newer one.
        let plain_is_newer = self
            .durable()
            .recorded_version(key)
            .ok()
            .flatten()
            .is_some_and(|stamp| stamp > created_unix_ns);
        if plain_is_newer {
            return Ok(None);
        }
        // The repository holds the blobs the servers pushed already (None: unreachable, or
        // nothing pushed yet).
        let repo = self.repo().ok().flatten();
        let names: Vec<&str> = staging.opts.servers.iter().map(String::as_str).collect();
        let mut fetch = |scores: &[Score]| -> cascade_dedup::repo::Result<Vec<Vec<u8>>> {
            let mut by_owner: Vec<Vec<Score>> = vec![Vec::new(); names.len()];
            for s in scores {
                by_owner[cascade_staging::owner_of(s, &names)].push(*s);
            }
            let mut found: HashMap<Score, Vec<u8>> = HashMap::new();
            for (server, wanted) in by_owner.iter().enumerate() {
                if wanted.is_empty() {
                    continue;
                }
                // A server down or a chunk it lost: the repository may have it.
                if let Ok(chunks) = staging.with_conn(server, |c| c.get_chunks(wanted)) {
                    for c in chunks {
                        if let Ok(raw) = c.verified_raw() {
                            found.insert(c.score, raw);
                        }
                    }
                }
            }
            scores
                .iter()
                .map(|s| match (found.get(s), &repo) {
                    (Some(raw), _) => Ok(raw.clone()),
                    (None, Some(repo)) => repo.read_blob(s),
                    (None, None) => Err(cascade_dedup::repo::Error::Missing(to_hex(s))),
                })
                .collect()
        };
        let size = write_fetched(self.store(), tmp, |out| {
            Ok(rebuild_file(&recipe, out, &mut fetch)?)
        })?;
        Ok(Some(size))
    }

    /// The newest manifest a staging server holds, not yet written to the repository, of a
    /// checkpoint naming file `key` (the checkpoint `key` itself, or a directory above it):
    /// when it was made and the file's recipe. Servers that do not answer are skipped.
    fn pending_recipe(&self, staging: &Staging, key: &str) -> Option<(u64, FileRecipe)> {
        let mut candidate = key;
        loop {
            let owner = self.manifest_owner(staging, candidate);
            if let Ok(Some((ManifestState::Pending, m))) =
                staging.with_conn(owner, |c| c.get_manifest(candidate))
            {
                let created = m.created_unix_ns;
                if let Some(recipe) = recipe_in(candidate, m, key) {
                    return Some((created, recipe));
                }
            }
            candidate = &candidate[..candidate.rfind('/')?];
        }
    }

    /// The server that writes the manifest of `ckpt`: the owner of its name's score.
    fn manifest_owner(&self, staging: &Staging, ckpt: &str) -> usize {
        let names: Vec<&str> = staging.opts.servers.iter().map(String::as_str).collect();
        cascade_staging::owner_of(&score(ckpt.as_bytes()), &names)
    }

    /// For a checkpoint pushed as chunks: once its manifest is in the durable repository,
    /// records its files durable and it complete. True if it did.
    pub(crate) fn complete_staged_dedup(
        &self,
        staging: &Staging,
        root: &LifeEntry,
    ) -> Result<bool> {
        let ckpt = key_of(&root.path);
        let owner = self.manifest_owner(staging, ckpt);
        let state = staging
            .with_conn(owner, |c| c.get_manifest(ckpt))
            .map_err(|e| staging_error(staging, owner, e))?;
        if !matches!(state, Some((ManifestState::Written, _))) {
            return Ok(false);
        }
        let Some(tree) = self.fresh_tree(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        for f in tree.iter().filter(|e| e.kind == FileKind::File) {
            self.store().mark_durable(f.ino, f.generation, f.mod_seq);
        }
        if !self
            .store()
            .mark_complete(now_root.ino, now_root.generation, now_root.mod_seq)
        {
            return Ok(false);
        }
        if let Ok(mut s) = self.stats.lock() {
            s.markers += 1;
            s.dedup_checkpoints += 1;
        }
        self.log(|| {
            format!(
                "checkpoint {} complete in the dedup repository (written by a staging server)",
                root.path
            )
        });
        Ok(true)
    }
}
