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
use cascade_dedup::repo::{pack_chunk, rebuild_file, undo_delta, BaseFile, FileBase, FileRecipe};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Compression, Score};
use cascade_staging::protocol::{delta_data, ManifestState, WireChunk};
use cascade_store::{FileKind, LifeEntry};
use rayon::prelude::*;

use crate::daemon::{key_of, path_in_checkpoint, Agent, Checkpoint};
use crate::dedup::{recipe_in, DedupOptions};
use crate::reader::StoreFileReader;
use crate::restore::write_fetched;
use crate::staging::Staging;
use crate::{Error, Result};

/// Chunks scored, asked about and sent together.
const BATCH_BYTES: usize = 8 << 20;

/// A blob waiting to be sent.
struct Blob {
    score: Score,
    kind: BlobKind,
    raw: Vec<u8>,
    /// For a data chunk: its file (an index into `Sender::bases`) and its offset there.
    at: Option<(usize, u64)>,
}

/// A blob in the form it is sent in.
struct Outgoing<'b> {
    blob: &'b Blob,
    stored: Stored,
    data: Option<Vec<u8>>,
}

impl Outgoing<'_> {
    fn wire(&self) -> WireChunk<'_> {
        WireChunk {
            score: self.blob.score,
            kind: self.blob.kind,
            stored: self.stored,
            raw_len: self.blob.raw.len() as u32,
            data: self.data.as_deref().unwrap_or(&self.blob.raw),
        }
    }
}

/// Blobs on their way to their owners, grouped by server.
struct Sender<'a> {
    staging: &'a Staging,
    names: Vec<&'a str>,
    dedup: DedupOptions,
    /// Per file of the checkpoint, the previous version as a source of delta bases.
    bases: &'a [Option<BaseFile<'a>>],
    /// Every blob score of the checkpoint (the manifest lists them all).
    all: Vec<Score>,
    seen: HashSet<Score>,
    batch: Vec<Blob>,
    batch_bytes: usize,
    sent_bytes: u64,
    sent_chunks: u64,
    sent_deltas: u64,
}

impl Sender<'_> {
    fn add(&mut self, blob: Blob) -> Result<()> {
        if !self.seen.insert(blob.score) {
            return Ok(());
        }
        self.all.push(blob.score);
        self.batch_bytes += blob.raw.len();
        self.batch.push(blob);
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// A blob's stored form: a delta against the previous version of its file where that
    /// wins (and `deltas`), else compressed where that pays, else raw.
    fn pack<'b>(&self, blob: &'b Blob, deltas: bool) -> Outgoing<'b> {
        let (base, offset) = match blob.at.filter(|_| deltas) {
            Some((file, offset)) => (self.bases.get(file).and_then(Option::as_ref), offset),
            None => (None, 0),
        };
        match pack_chunk(self.dedup.compression, base, offset, &blob.raw) {
            Some(p) => match p.base {
                Some(base) => Outgoing {
                    blob,
                    stored: Stored::Delta,
                    data: Some(delta_data(&base, &p.bytes)),
                },
                None => Outgoing {
                    blob,
                    stored: Stored::Zstd,
                    data: Some(p.bytes),
                },
            },
            None => Outgoing {
                blob,
                stored: Stored::Raw,
                data: None,
            },
        }
    }

    /// Per owner: which of the batch it lacks, then those, compressed where it pays.
    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let mut by_owner: Vec<Vec<&Blob>> = vec![Vec::new(); self.names.len()];
        for b in &batch {
            by_owner[cascade_staging::owner_of(&b.score, &self.names)].push(b);
        }
        for (server, blobs) in by_owner.into_iter().enumerate() {
            if blobs.is_empty() {
                continue;
            }
            let scores: Vec<Score> = blobs.iter().map(|b| b.score).collect();
            let lacking = self
                .staging
                .with_conn(server, |c| c.lacks(&scores))
                .map_err(|e| staging_error(self.staging, server, e))?;
            let lacked: Vec<&Blob> = blobs
                .into_iter()
                .zip(lacking)
                .filter_map(|(b, lacks)| lacks.then_some(b))
                .collect();
            if lacked.is_empty() {
                continue;
            }
            let packed: Vec<Outgoing> = lacked.par_iter().map(|b| self.pack(b, true)).collect();
            let packed = match self.put(server, &packed) {
                // A base the server does not hold as one (pruned meanwhile, or pushed where
                // it has not looked yet): the same chunks again, the deltas among them whole.
                Err(cascade_staging::Error::Refused { code, .. })
                    if code == cascade_staging::protocol::code::BASE_UNKNOWN =>
                {
                    let whole: Vec<Outgoing> = packed
                        .into_par_iter()
                        .map(|p| match p.stored {
                            Stored::Delta => self.pack(p.blob, false),
                            _ => p,
                        })
                        .collect();
                    self.put(server, &whole)
                        .map_err(|e| staging_error(self.staging, server, e))?;
                    whole
                }
                other => {
                    other.map_err(|e| staging_error(self.staging, server, e))?;
                    packed
                }
            };
            self.sent_chunks += packed.len() as u64;
            self.sent_deltas += packed.iter().filter(|p| p.stored == Stored::Delta).count() as u64;
            self.sent_bytes += packed
                .iter()
                .map(|p| p.wire().data.len() as u64)
                .sum::<u64>();
        }
        Ok(())
    }

    fn put(&self, server: usize, packed: &[Outgoing]) -> cascade_staging::Result<()> {
        let wire: Vec<WireChunk> = packed.iter().map(Outgoing::wire).collect();
        self.staging
            .with_conn(server, |c| c.put_chunks(&wire))
            .map(|_| ())
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
        previous: Option<&Checkpoint>,
    ) -> Result<bool> {
        let started = Instant::now();
        let Some(tree) = self.closed_checkpoint(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
        let store = self.store();
        // Deltas against the previous checkpoint of the series: complete, so the servers
        // pushed its blobs into the repository, whose index is read again to know them. No
        // repository (the durable store unreachable from here): no deltas.
        let repo = previous
            .filter(|_| dedup.delta && dedup.compression != Compression::None)
            .and_then(|_| self.repo().ok().flatten())
            .filter(|repo| repo.refresh_index().is_ok());
        let previous = repo
            .as_ref()
            .zip(previous)
            .and_then(|(repo, p)| self.previous_version(repo, p));
        let base_files: Vec<Option<(&FileRecipe, cascade_store::File)>> = files
            .iter()
            .map(|f| {
                let path = path_in_checkpoint(now_root, f);
                let (recipe, entry) = previous.as_ref()?.base_of(&path, files.len())?;
                Some((recipe, self.open_snapshot_file(entry).ok().flatten()?))
            })
            .collect();
        let base_readers: Vec<Option<(&FileRecipe, StoreFileReader)>> = base_files
            .iter()
            .map(|b| {
                let (recipe, file) = b.as_ref()?;
                Some((*recipe, StoreFileReader::new(store, file).ok()?))
            })
            .collect();
        let bases: Vec<Option<BaseFile>> = base_readers
            .iter()
            .map(|b| {
                let (recipe, bytes) = b.as_ref()?;
                repo.as_ref()?.base_file(FileBase { recipe, bytes })
            })
            .collect();
        let mut sender = Sender {
            staging,
            names: staging.opts.servers.iter().map(String::as_str).collect(),
            dedup,
            bases: &bases,
            all: Vec::new(),
            seen: HashSet::new(),
            batch: Vec::new(),
            batch_bytes: 0,
            sent_bytes: 0,
            sent_chunks: 0,
            sent_deltas: 0,
        };
        // Cut and scored here; compressed only once a server says it lacks the chunk.
        let mut ingest = Ingest::new(dedup.chunking);
        let mut recipes = Vec::with_capacity(files.len());
        let mut total = 0u64;
        for (i, f) in files.iter().enumerate() {
            let Some(file) = self.open_snapshot_file(f)? else {
                return Ok(false);
            };
            let reader =
                StoreFileReader::new(store, &file).map_err(|e| Error::store(&f.path, e))?;
            let mut leaves = Vec::new();
            let mut offset = 0u64;
            let digest = ingest
                .run(reader, &|_, _, _| None, &mut |window, chunks| {
                    for c in chunks {
                        let len = c.range.len() as u64;
                        leaves.push((c.score, len));
                        sender
                            .add(Blob {
                                score: c.score,
                                kind: BlobKind::Data,
                                raw: window[c.range].to_vec(),
                                at: Some((i, offset)),
                            })
                            .map_err(Failed::Sending)?;
                        offset += len;
                    }
                    Ok(())
                })
                .map_err(|e| match e {
                    Failed::Reading(e) => Error::io(&f.path, e),
                    Failed::Sending(e) => e,
                })?;
            let size = digest.size;
            let (tree_root, blocks) = recipe_blocks(&leaves);
            for (score, raw) in blocks {
                sender.add(Blob {
                    score,
                    kind: BlobKind::Tree,
                    raw,
                    at: None,
                })?;
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
        self.remember_manifest(now_root, ckpt, recipes);
        if let Ok(mut s) = self.stats.lock() {
            s.staged_files += files.len() as u64;
            s.staged_bytes += total;
            s.dedup_bytes += total;
            s.dedup_new_bytes += sender.sent_bytes;
            s.dedup_delta_chunks += sender.sent_deltas;
        }
        self.log(|| {
            let against = previous.as_ref().map_or(String::new(), |p| {
                format!(
                    ", {} as deltas against {}",
                    sender.sent_deltas, p.checkpoint
                )
            });
            format!(
                "checkpoint {} pushed to the staging servers as chunks ({} files, {total} bytes; \
                 {} of {} blobs sent{against}, {} bytes) in {:.3} s",
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
                        // A delta chunk's base is in the repository (a server takes no other).
                        let raw = match c.delta() {
                            Some((base, frame)) => repo
                                .as_ref()
                                .and_then(|repo| repo.read_blob(&base.score).ok())
                                .and_then(|b| undo_delta(frame, c.raw_len, &b, base.from).ok())
                                .filter(|raw| score(raw) == c.score),
                            None => c.verified_raw().ok(),
                        };
                        if let Some(raw) = raw {
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
