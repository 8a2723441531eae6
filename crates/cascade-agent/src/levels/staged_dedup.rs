//! Dedup through the staging servers (docs/dedup.md, "Through staging servers"), in two
//! forms (`staging.dedup`): as packs the agent builds (packs.rs, the default), or as chunks,
//! here: the agent cuts a committed checkpoint into chunks and scores them here on the
//! compute node, asks the server that owns each score (rendezvous hashing over
//! `staging.servers`) which ones it lacks, and sends only those, compressed; then the recipe
//! blocks the same way, then the manifest with every score it names to the server owning the
//! checkpoint's name. The servers push packs and index objects to the durable repository and
//! write the manifest once all its blobs are there.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_dedup::adaptive::Measured;
use cascade_dedup::ingest::Ingest;
use cascade_dedup::repo::format::{recipe_blocks, BlobKind, Stored};
use cascade_dedup::repo::{
    pack_chunk, rebuild_file, undo_delta, BaseFile, FileBase, FileRecipe, Repo,
};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Compression, Score};
use cascade_durable::DurableKey;
use cascade_store::{FileKind, LifeEntry};
use cascade_wire::protocol::{delta_data, ManifestState, WireChunk};
use rayon::prelude::*;

use crate::deltas::{deltas_note, recipe_in, PreviousVersion};
use crate::level::{not_yet_whole, retry_later, Found, Level, Step, Unit};
use crate::levels::dedup::report_level;
use crate::node::{files_of, path_in_checkpoint, Checkpoint, Node, Reached};
use crate::options::{DedupOptions, DedupStaging};
use crate::reader::StoreFileReader;
use crate::repository::Repository;
use crate::servers::{lock, Asked, ServerPool};
use crate::store_write::write_fetched;
use crate::{Error, Result};

mod packs;

/// Chunks scored, asked about and sent together.
const BATCH_BYTES: usize = 8 << 20;

/// A blob waiting to be sent.
struct Blob {
    score: Score,
    kind: BlobKind,
    raw: Vec<u8>,
    /// For a data chunk: its file (an index into `Packer::bases`) and its offset there.
    at: Option<(usize, u64)>,
}

/// A blob in the form it is sent in.
struct Outgoing {
    blob: Blob,
    stored: Stored,
    data: Option<Vec<u8>>,
    /// A delta's base.
    base: Option<Score>,
}

/// Where the data chunks of the last checkpoint sent went (a server's index): a delta chunk
/// goes to the server that has its base, whose base cache then holds it, so the server
/// checks the delta without reading the base from the durable store over its link. The
/// chunks of a region that changes every checkpoint stay on one server that way.
pub(crate) type Placement = HashMap<Score, usize>;

impl Outgoing {
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

/// How a checkpoint's blobs are packed and where they go: shared by the thread that cuts,
/// asks and packs ([`Sender`]) and the one that uploads ([`put_batches`]).
struct Packer<'a> {
    pool: &'a ServerPool,
    dedup: DedupOptions,
    /// Per file of the checkpoint, the previous version as a source of delta bases.
    bases: &'a [Option<BaseFile<'a>>],
    /// Where the previous checkpoint's data chunks went.
    placed_before: &'a Placement,
}

impl Packer<'_> {
    /// A blob's stored form: a delta against the previous version of its file where that
    /// wins (and `deltas`), else compressed where that pays, else raw.
    fn pack(&self, blob: Blob, deltas: bool) -> Outgoing {
        let (base, offset) = match blob.at.filter(|_| deltas) {
            Some((file, offset)) => (self.bases.get(file).and_then(Option::as_ref), offset),
            None => (None, 0),
        };
        let (stored, data, base) = match pack_chunk(self.dedup.compression, base, offset, &blob.raw)
        {
            Some(p) => match p.base {
                Some(base) => (
                    Stored::Delta,
                    Some(delta_data(&base, &p.bytes)),
                    Some(base.score),
                ),
                None => (Stored::Zstd, Some(p.bytes), None),
            },
            None => (Stored::Raw, None, None),
        };
        Outgoing {
            blob,
            stored,
            data,
            base,
        }
    }

    /// The server asked whether it lacks a blob: where the previous checkpoint put it (an
    /// unchanged chunk), else its score's owner.
    fn home_of(&self, b: &Blob) -> usize {
        self.placed_before
            .get(&b.score)
            .copied()
            .filter(|&i| i < self.pool.count())
            .unwrap_or_else(|| self.pool.owner_of(&b.score))
    }

    /// PutChunks of `packed` to `server`; if it refuses a base (pruned meanwhile, or pushed
    /// where it has not looked yet), the same chunks again, the deltas among them whole. What
    /// was sent.
    fn put_or_whole(&self, server: usize, packed: Vec<Outgoing>) -> Result<Vec<Outgoing>> {
        match self.put(server, &packed) {
            Err(cascade_wire::Error::Refused { code, .. })
                if code == cascade_wire::protocol::code::BASE_UNKNOWN =>
            {
                let whole: Vec<Outgoing> = packed
                    .into_par_iter()
                    .map(|p| match p.stored {
                        Stored::Delta => self.pack(p.blob, false),
                        _ => p,
                    })
                    .collect();
                self.put(server, &whole)
                    .map_err(|e| self.pool.error(server, e))?;
                Ok(whole)
            }
            other => {
                other.map_err(|e| self.pool.error(server, e))?;
                Ok(packed)
            }
        }
    }

    fn put(&self, server: usize, packed: &[Outgoing]) -> cascade_wire::Result<()> {
        let wire: Vec<WireChunk> = packed.iter().map(Outgoing::wire).collect();
        self.pool
            .with_bulk_conn(server, |c| c.put_chunks(&wire))
            .map(|_| ())
    }
}

/// One batch's chunks to send, per server.
type PackedBatch = Vec<(usize, Vec<Outgoing>)>;

/// What [`put_batches`] sent.
#[derive(Default)]
struct SentChunks {
    /// The servers the data chunks went to.
    placed: Placement,
    chunks: u64,
    deltas: u64,
    bytes: u64,
    /// Raw bytes of the data chunks sent (what compression worked on).
    new_bytes: u64,
}

/// Uploads each packed batch, every server's part at the same time (a server checks and
/// syncs its frames while the other does), while the sender cuts, asks about and packs the
/// next batch. Ends with the first failure, which stops the sender (its next batch finds
/// nobody receiving).
fn put_batches(packer: &Packer, batches: Receiver<PackedBatch>) -> Result<SentChunks> {
    let mut sent = SentChunks::default();
    for targets in batches {
        let done: Vec<Result<(usize, Vec<Outgoing>)>> = if targets.len() == 1 {
            targets
                .into_iter()
                .map(|(server, packed)| Ok((server, packer.put_or_whole(server, packed)?)))
                .collect()
        } else {
            std::thread::scope(|scope| {
                let threads: Vec<_> = targets
                    .into_iter()
                    .map(|(server, packed)| {
                        scope.spawn(move || Ok((server, packer.put_or_whole(server, packed)?)))
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| {
                        t.join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    })
                    .collect()
            })
        };
        for result in done {
            let (server, packed) = result?;
            for p in &packed {
                if p.blob.kind == BlobKind::Data {
                    sent.placed.insert(p.blob.score, server);
                }
            }
            sent.chunks += packed.len() as u64;
            sent.deltas += packed.iter().filter(|p| p.stored == Stored::Delta).count() as u64;
            sent.bytes += packed
                .iter()
                .map(|p| p.wire().data.len() as u64)
                .sum::<u64>();
            sent.new_bytes += packed
                .iter()
                .filter(|p| p.blob.kind == BlobKind::Data)
                .map(|p| p.blob.raw.len() as u64)
                .sum::<u64>();
        }
    }
    Ok(sent)
}

/// Blobs on their way to their owners: batched, asked about, packed, and handed to the
/// uploading thread ([`put_batches`]).
struct Sender<'a> {
    packer: &'a Packer<'a>,
    to_put: SyncSender<PackedBatch>,
    /// The data chunks a server already held, and which.
    placed: Placement,
    /// Every blob score of the checkpoint (the manifest lists them all).
    all: Vec<Score>,
    seen: HashSet<Score>,
    batch: Vec<Blob>,
    batch_bytes: usize,
    /// When the first batch went to the uploader, and how long handing batches over waited
    /// for it (the servers): the adaptive level's upload start and the sender's idle time.
    first_handed: Option<Instant>,
    blocked: Duration,
}

impl<'a> Sender<'a> {
    fn new(packer: &'a Packer<'a>, to_put: SyncSender<PackedBatch>) -> Sender<'a> {
        Sender {
            packer,
            to_put,
            placed: Placement::new(),
            all: Vec::new(),
            seen: HashSet::new(),
            batch: Vec::new(),
            batch_bytes: 0,
            first_handed: None,
            blocked: Duration::ZERO,
        }
    }

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

    /// Per server: which of the batch it lacks; then those, compressed where it pays, for
    /// the server asked, except a delta chunk whose base went to another server in the
    /// previous checkpoint: for that one, whose base cache has the base. The upload is left
    /// to [`put_batches`].
    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let pool = self.packer.pool;
        let mut by_home: Vec<Vec<Blob>> = (0..pool.count()).map(|_| Vec::new()).collect();
        for b in batch {
            by_home[self.packer.home_of(&b)].push(b);
        }
        let mut lacked: Vec<(Blob, usize)> = Vec::new();
        for (server, blobs) in by_home.into_iter().enumerate() {
            if blobs.is_empty() {
                continue;
            }
            let scores: Vec<Score> = blobs.iter().map(|b| b.score).collect();
            let lacking = pool
                .with_conn(server, |c| c.lacks(&scores))
                .map_err(|e| pool.error(server, e))?;
            for (b, lacks) in blobs.into_iter().zip(lacking) {
                if lacks {
                    lacked.push((b, server));
                } else if b.kind == BlobKind::Data {
                    self.placed.insert(b.score, server);
                }
            }
        }
        if lacked.is_empty() {
            return Ok(());
        }
        let packer = self.packer;
        let packed: Vec<(Outgoing, usize)> = lacked
            .into_par_iter()
            .map(|(b, home)| (packer.pack(b, true), home))
            .collect();
        let mut by_target: Vec<Vec<Outgoing>> = (0..pool.count()).map(|_| Vec::new()).collect();
        for (p, home) in packed {
            let target = p
                .base
                .and_then(|base| packer.placed_before.get(&base).copied())
                .filter(|&i| i < pool.count())
                .unwrap_or(home);
            by_target[target].push(p);
        }
        let targets: PackedBatch = by_target
            .into_iter()
            .enumerate()
            .filter(|(_, packed)| !packed.is_empty())
            .collect();
        let handing = Instant::now();
        self.first_handed.get_or_insert(handing);
        let handed = self.to_put.send(targets);
        self.blocked += handing.elapsed();
        handed.map_err(|_| Error::io("staging servers", std::io::Error::other(UPLOAD_STOPPED)))
    }
}

/// The sender's error when the uploading thread ended first; that thread's error is the one
/// reported.
const UPLOAD_STOPPED: &str = "the upload of chunks stopped";

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

/// Checkpoints through the staging servers as chunks.
pub(crate) struct StagedDedup {
    pool: Arc<ServerPool>,
    repository: Arc<Repository>,
    /// When each waiting manifest's server was last asked about it.
    asked: Asked,
    /// Where the data chunks of the last checkpoint sent went.
    placement: Mutex<Placement>,
    /// Checkpoints pushed whose manifests are not written yet (the newest
    /// [`MEASURING_MAX`]), by manifest name: the adaptive level learns from each once it is.
    measuring: Mutex<Vec<(String, Pushed)>>,
    /// Checkpoints staged as packs whose manifests are not written yet.
    pending_pushes: packs::PendingPushes,
    /// Checkpoints staged (as packs or chunks) whose manifests are not written yet, by
    /// manifest name: since when no server has said it holds the push (from the push, or
    /// the first ask after a restart of the agent).
    unanswered_since: Mutex<HashMap<String, Instant>>,
}

/// Checkpoints awaiting their manifests that the adaptive level keeps figures for (others
/// changed or failed; the oldest is dropped).
const MEASURING_MAX: usize = 16;

/// A checkpoint pushed as chunks, for the adaptive level: the level it was sent at, the
/// agent's own work (`upload_seconds` is filled in once the manifest is written), and when
/// the servers got its first chunks.
struct Pushed {
    compression: Compression,
    measured: Measured,
    upload_from: Instant,
}

/// What sending a checkpoint's files cost.
struct Sent {
    recipes: Vec<FileRecipe>,
    bytes: u64,
}

impl StagedDedup {
    pub(crate) fn new(pool: Arc<ServerPool>, repository: Arc<Repository>) -> StagedDedup {
        StagedDedup {
            pool,
            repository,
            asked: Asked::default(),
            placement: Mutex::new(Placement::new()),
            measuring: Mutex::new(Vec::new()),
            pending_pushes: Mutex::default(),
            unanswered_since: Mutex::default(),
        }
    }

    /// Sends checkpoint `root` through the staging servers as chunks and its manifest;
    /// records its files staged and the checkpoint pushed. False if it changed meanwhile.
    fn stage_checkpoint(
        &self,
        node: &Node,
        dedup: DedupOptions,
        root: &LifeEntry,
        previous: Option<&Checkpoint>,
    ) -> Result<bool> {
        let started = Instant::now();
        let Some(tree) = node.closed_checkpoint(root)? else {
            return Ok(false);
        };
        // Blobs are packed at the adaptive level's current level (they say how they are
        // stored); the manifest names the configured compression, as the agent's own do.
        let packing = DedupOptions {
            compression: self.repository.compression(),
            ..dedup
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = files_of(&tree).collect();
        let (repo, previous) = self.previous_in_repo(previous);
        // Each file's previous version, read straight from the store.
        let base_files = open_bases(node, now_root, &files, previous.as_ref());
        let base_readers: Vec<Option<(&FileRecipe, StoreFileReader)>> = base_files
            .iter()
            .map(|b| {
                let (recipe, file) = b.as_ref()?;
                Some((*recipe, StoreFileReader::new(&node.store, file).ok()?))
            })
            .collect();
        let bases: Vec<Option<BaseFile>> = base_readers
            .iter()
            .map(|b| {
                let (recipe, bytes) = b.as_ref()?;
                repo.as_ref()?.base_file(FileBase { recipe, bytes })
            })
            .collect();
        let placed_before = std::mem::take(&mut *lock(&self.placement));
        let packer = Packer {
            pool: &self.pool,
            dedup: packing,
            bases: &bases,
            placed_before: &placed_before,
        };
        // Cutting, asking and packing here; uploading on a thread of its own, a batch behind.
        let (sent, present, all, uploaded, handed) = std::thread::scope(|scope| {
            let (to_put, batches) = sync_channel(1);
            let uploader = scope.spawn(|| put_batches(&packer, batches));
            let mut sender = Sender::new(&packer, to_put);
            let sent = send_files(node, dedup, now_root, &files, &mut sender);
            // Closes the channel: the uploader ends after the last batch.
            let Sender {
                placed,
                all,
                to_put,
                first_handed,
                blocked,
                ..
            } = sender;
            drop(to_put);
            let uploaded = uploader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (sent, placed, all, uploaded, (first_handed, blocked))
        });
        let (sent, uploaded) = match (sent, uploaded) {
            (_, Err(e)) => (Err(e), SentChunks::default()),
            (sent, Ok(uploaded)) => (sent, uploaded),
        };
        // Kept for the next checkpoint even if this one failed: its chunks are where they
        // were sent.
        let mut placed = present;
        placed.extend(uploaded.placed.iter().map(|(s, server)| (*s, *server)));
        if !matches!(sent, Ok(Some(_))) {
            for (s, server) in &placed_before {
                placed.entry(*s).or_insert(*server);
            }
        }
        *lock(&self.placement) = placed;
        let Some(sent) = sent? else {
            return Ok(false);
        };
        let ckpt = DurableKey::from_store_path(&now_root.path);
        let (name, _) = self.repository.stored_name(now_root, &ckpt);
        self.send_manifest(
            &name,
            now_root.kind == FileKind::File,
            dedup,
            &sent.recipes,
            &all,
        )?;
        let digests = sent.recipes.iter().map(|r| r.blake3.as_str());
        if !node.record_whole(now_root, &files, digests, Reached::Staged) {
            return Ok(false);
        }
        report_pushed(
            node,
            now_root,
            &sent,
            &uploaded,
            all.len(),
            previous.as_ref(),
            started,
        );
        let (first_handed, blocked) = handed;
        lock(&self.unanswered_since).insert(name.clone(), Instant::now());
        self.measure(
            name,
            Pushed {
                compression: packing.compression,
                measured: Measured {
                    input_bytes: sent.bytes,
                    ingest_seconds: started.elapsed().saturating_sub(blocked).as_secs_f64(),
                    uploaded_bytes: uploaded.bytes,
                    upload_seconds: 0.0,
                    new_bytes: uploaded.new_bytes,
                },
                upload_from: first_handed.unwrap_or(started),
            },
        );
        self.repository
            .remember_manifest(now_root, &ckpt, sent.recipes);
        Ok(true)
    }

    /// Keeps a pushed checkpoint's figures until its manifest is written.
    fn measure(&self, name: String, pushed: Pushed) {
        let mut measuring = lock(&self.measuring);
        measuring.retain(|(n, _)| *n != name);
        if measuring.len() >= MEASURING_MAX {
            measuring.remove(0);
        }
        measuring.push((name, pushed));
    }

    /// Manifest `name` was written: the adaptive level learns from its checkpoint, whose
    /// upload is the time from its first chunks reaching the servers until now (the
    /// servers' push to the durable store, the link the level is to spare).
    fn adapt_level(&self, node: &Node, name: &str) {
        let pushed = {
            let mut measuring = lock(&self.measuring);
            let Some(i) = measuring.iter().position(|(n, _)| n == name) else {
                return;
            };
            measuring.remove(i).1
        };
        let measured = Measured {
            upload_seconds: pushed.upload_from.elapsed().as_secs_f64(),
            ..pushed.measured
        };
        let moved = self.repository.adapt_measured(measured);
        report_level(node, pushed.compression, moved.as_ref());
    }

    /// The repository and the previous checkpoint's version in it, for deltas: only when
    /// deltas are on and the previous checkpoint is complete, so the servers pushed its blobs
    /// into the repository, whose index is read again to know them. No repository (the
    /// durable store unreachable from here): no deltas.
    fn previous_in_repo<'c>(
        &self,
        previous: Option<&Checkpoint<'c>>,
    ) -> (Option<Arc<Repo>>, Option<PreviousVersion<'c>>) {
        let repo = previous
            .filter(|_| self.repository.deltas())
            .and_then(|_| self.repository.get().ok().flatten())
            .filter(|repo| repo.refresh_index().is_ok());
        let previous = repo
            .as_ref()
            .zip(previous)
            .and_then(|(repo, p)| self.repository.previous_version(repo, p));
        (repo, previous)
    }

    /// Sends the manifest of checkpoint `ckpt` with every score it names to the server that
    /// owns the checkpoint's name.
    fn send_manifest(
        &self,
        ckpt: &str,
        single_file: bool,
        dedup: DedupOptions,
        recipes: &[FileRecipe],
        scores: &[Score],
    ) -> Result<()> {
        let owner = self.manifest_owner(ckpt);
        self.pool
            .with_conn(owner, |c| {
                c.put_manifest(
                    ckpt,
                    single_file,
                    &dedup.chunking.to_string(),
                    &dedup.compression.to_string(),
                    recipes,
                    scores,
                )
            })
            .map_err(|e| self.pool.error(owner, e))?;
        Ok(())
    }

    /// Rebuilds file `recipe` (of a manifest made at `created_unix_ns` that a server holds
    /// but has not written to the durable repository yet: its server could not push
    /// everything) into the store file `tmp`. Every blob comes from its owner's chunk store,
    /// else from the repository, and is checked against its score.
    fn rebuild(&self, node: &Node, recipe: &FileRecipe, tmp: &str) -> Result<u64> {
        // The repository holds the blobs the servers pushed already (None: unreachable, or
        // nothing pushed yet).
        let repo = self.repository.get().ok().flatten();
        let mut fetch = |scores: &[Score]| -> cascade_dedup::repo::Result<Vec<Vec<u8>>> {
            let found = self.chunks_from_servers(scores, repo.as_deref());
            scores
                .iter()
                .map(|s| match (found.get(s), &repo) {
                    (Some(raw), _) => Ok(raw.clone()),
                    (None, Some(repo)) => repo.read_blob(s),
                    (None, None) => Err(cascade_dedup::repo::Error::Missing(to_hex(s))),
                })
                .collect()
        };
        write_fetched(&node.store, tmp, |out| {
            Ok(rebuild_file(recipe, out, &mut fetch)?)
        })
    }

    /// The blobs of `scores` the servers still hold, checked against their scores (a delta
    /// chunk rebuilt against its base from `repo`): asked of their owners first, then what
    /// is still missing of the other servers (a delta chunk goes to the server holding its
    /// base, `Placement`). A server down or a chunk it lost is skipped: the repository may
    /// have it.
    fn chunks_from_servers(
        &self,
        scores: &[Score],
        repo: Option<&Repo>,
    ) -> HashMap<Score, Vec<u8>> {
        let mut by_owner: Vec<Vec<Score>> = vec![Vec::new(); self.pool.count()];
        for s in scores {
            by_owner[self.pool.owner_of(s)].push(*s);
        }
        let mut found = HashMap::new();
        self.chunks_from(&by_owner, repo, &mut found);
        if found.len() < scores.len() && self.pool.count() > 1 {
            let mut elsewhere: Vec<Vec<Score>> = vec![Vec::new(); self.pool.count()];
            for (owner, wanted) in by_owner.iter().enumerate() {
                for s in wanted.iter().filter(|s| !found.contains_key(*s)) {
                    for (server, list) in elsewhere.iter_mut().enumerate() {
                        if server != owner {
                            list.push(*s);
                        }
                    }
                }
            }
            self.chunks_from(&elsewhere, repo, &mut found);
        }
        found
    }

    /// Asks server `i` for the blobs `wanted[i]` not found yet, into `found`.
    fn chunks_from(
        &self,
        wanted: &[Vec<Score>],
        repo: Option<&Repo>,
        found: &mut HashMap<Score, Vec<u8>>,
    ) {
        for (server, wanted) in wanted.iter().enumerate() {
            let wanted: Vec<Score> = wanted
                .iter()
                .filter(|s| !found.contains_key(*s))
                .copied()
                .collect();
            if wanted.is_empty() {
                continue;
            }
            let Ok(chunks) = self.pool.with_conn(server, |c| c.get_chunks(&wanted)) else {
                continue;
            };
            for c in chunks {
                // A delta chunk's base is in the repository (a server takes no other).
                let raw = match c.delta() {
                    Some((base, frame)) => repo
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

    /// The newest manifest a staging server holds, not yet written to the repository, of a
    /// checkpoint naming file `key` (the checkpoint `key` itself, or a directory above it):
    /// when it was made and the file's recipe. Servers that do not answer are skipped.
    fn pending_recipe(&self, key: &str) -> Option<(u64, FileRecipe)> {
        let mut candidate = key;
        loop {
            let owner = self.manifest_owner(candidate);
            if let Ok(Some((ManifestState::Pending, m))) =
                self.pool.with_conn(owner, |c| c.get_manifest(candidate))
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
    fn manifest_owner(&self, ckpt: &str) -> usize {
        self.pool.owner_of(&score(ckpt.as_bytes()))
    }

    /// For a checkpoint pushed as chunks: once its manifest is in the durable repository,
    /// records its files durable and it complete (`Step::Complete`) — or, for this node's part
    /// of a job's checkpoint, only its files (`Step::PartStored`: the job level completes
    /// it). `Step::Waiting` until the server wrote it.
    fn complete_staged(&self, node: &Node, root: &LifeEntry) -> Result<Step> {
        let waiting = Step::Waiting(Instant::now() + self.pool.ask_every());
        let ckpt = DurableKey::from_store_path(&root.path);
        let (name, part) = self.repository.stored_name(root, &ckpt);
        // Asked when a server's event counter moved: a push elsewhere may have completed
        // the manifest's blobs, and asking makes its server look at once (GetManifest).
        if !self.pool.ask_due(&self.asked, &name) {
            return Ok(waiting);
        }
        let owner = self.manifest_owner(&name);
        let (state, failed) = match self.pool.with_conn(owner, |c| c.get_manifest(&name)) {
            Ok(state) => (state, None),
            Err(e) => (None, Some((e.to_string(), self.pool.error(owner, e)))),
        };
        // The owner of its name holds the manifest: one that does not know it (it came back
        // wiped) or does not answer is waited for until give_up_delay.
        let silent = self.unanswered_for(&name, state.is_some());
        if state.is_none() {
            let Some(repo) = self.repository.get()? else {
                return Ok(Step::Changed);
            };
            if silent >= self.give_up_delay(&repo) {
                lock(&self.unanswered_since).remove(&name);
                let why = failed.as_ref().map_or_else(
                    || format!("{} does not know it", self.pool.addr(owner)),
                    |(why, _)| why.clone(),
                );
                give_up(node, root, silent, &why);
                return Ok(Step::Next);
            }
        }
        if let Some((_, e)) = failed {
            return Err(e);
        }
        if !matches!(state, Some((ManifestState::Written, _))) {
            return Ok(waiting);
        }
        lock(&self.unanswered_since).remove(&name);
        self.record_written(node, root, &name, part)
    }

    /// How long no server has said it holds checkpoint `name`'s push (its manifest not
    /// written yet): zero when one just did (`heard`), else counted from the push, or from
    /// the first ask after a restart of the agent.
    fn unanswered_for(&self, name: &str, heard: bool) -> Duration {
        let mut unanswered = lock(&self.unanswered_since);
        let now = Instant::now();
        let since = if heard {
            unanswered.insert(name.to_string(), now);
            now
        } else {
            *unanswered.entry(name.to_string()).or_insert(now)
        };
        since.elapsed()
    }

    /// How long a staged checkpoint may go without a server saying it holds it before the
    /// node stores it itself: `staging.give_up_after`, and never less than the time a
    /// server may write a staged manifest unchecked after its push
    /// ([`Repo::staged_manifest_trusted`]). The silence starts after the push arrived, so
    /// a server that comes back later checks the manifest against garbage collection before
    /// writing it (as packs: the session keeping its packs ends with the give-up; as chunks
    /// the server always checks).
    fn give_up_delay(&self, repo: &Repo) -> Duration {
        self.pool
            .give_up_after()
            .max(repo.staged_manifest_trusted())
    }

    /// The server wrote checkpoint `root`'s manifest `name`: the adaptive level learns from
    /// it, and its files are recorded durable and it complete (`Step::Complete`) — or, for
    /// this node's part of a job's checkpoint (`part`), only its files (`Step::PartStored`).
    fn record_written(
        &self,
        node: &Node,
        root: &LifeEntry,
        name: &str,
        part: bool,
    ) -> Result<Step> {
        self.pool.asked_done(&self.asked, name);
        self.adapt_level(node, name);
        let Some(tree) = node.fresh_tree(root)? else {
            return Ok(Step::Changed);
        };
        if part {
            // The files pushed are the versions below this root version (a change below
            // bumps it).
            if tree[0].mod_seq != root.mod_seq {
                return Ok(Step::Changed);
            }
            return Ok(if node.record_durable(&tree) {
                Step::PartStored
            } else {
                Step::Changed
            });
        }
        if !node.record_complete(&tree) {
            return Ok(Step::Changed);
        }
        node.count(|s| {
            s.markers += 1;
            s.dedup_checkpoints += 1;
        });
        node.log(|| {
            format!(
                "checkpoint {} complete in the dedup repository (written by a staging server)",
                root.path
            )
        });
        Ok(Step::Complete)
    }
}

/// Says that staged checkpoint `root`, unanswered for `silent` (`why`), is stored from the
/// node: the durable repository level takes it next.
fn give_up(node: &Node, root: &LifeEntry, silent: Duration, why: &str) {
    node.count(|s| s.staged_given_up += 1);
    node.record_failure(format!(
        "no staging server has answered for checkpoint {} in {:.1} s ({why}); storing it in \
         the durable store's dedup repository from this node instead",
        root.path,
        silent.as_secs_f64(),
    ));
}

/// Per file of a checkpoint, its previous version (its recipe and the open store file), if
/// the store still holds it.
fn open_bases<'p>(
    node: &Node,
    root: &LifeEntry,
    files: &[&LifeEntry],
    previous: Option<&'p PreviousVersion>,
) -> Vec<Option<(&'p FileRecipe, cascade_store::File)>> {
    files
        .iter()
        .map(|f| {
            let path = path_in_checkpoint(root, f);
            let (recipe, entry) = previous?.base_of(&path, files.len())?;
            Some((recipe, node.open_snapshot_file(entry).ok().flatten()?))
        })
        .collect()
}

/// Counts and logs a checkpoint pushed as chunks.
fn report_pushed(
    node: &Node,
    root: &LifeEntry,
    sent: &Sent,
    uploaded: &SentChunks,
    blobs: usize,
    previous: Option<&PreviousVersion>,
    started: Instant,
) {
    let total = sent.bytes;
    let files = sent.recipes.len();
    node.count(|s| {
        s.staged_files += files as u64;
        s.staged_bytes += total;
        s.dedup_bytes += total;
        s.dedup_new_bytes += uploaded.bytes;
        s.dedup_delta_chunks += uploaded.deltas;
    });
    node.log(|| {
        let against = deltas_note(uploaded.deltas, previous);
        format!(
            "checkpoint {} pushed to the staging servers as chunks ({files} files, {total} bytes; \
             {} of {} blobs sent{against}, {} bytes) in {:.3} s",
            root.path,
            uploaded.chunks,
            blobs,
            uploaded.bytes,
            started.elapsed().as_secs_f64()
        )
    });
}

/// Cuts and scores every file of a checkpoint here, handing its chunks and recipe blocks to
/// `sender` (compressed only once a server says it lacks one); the files' recipes, or None
/// if a file went away meanwhile.
fn send_files(
    node: &Node,
    dedup: DedupOptions,
    root: &LifeEntry,
    files: &[&LifeEntry],
    sender: &mut Sender,
) -> Result<Option<Sent>> {
    let mut ingest = Ingest::new(dedup.chunking);
    let mut recipes = Vec::with_capacity(files.len());
    let mut bytes = 0u64;
    for (i, f) in files.iter().enumerate() {
        let Some(file) = node.open_snapshot_file(f)? else {
            return Ok(None);
        };
        let reader =
            StoreFileReader::new(&node.store, &file).map_err(|e| Error::store(&f.path, e))?;
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
        let (tree_root, blocks) = recipe_blocks(&leaves);
        for (score, raw) in blocks {
            sender.add(Blob {
                score,
                kind: BlobKind::Tree,
                raw,
                at: None,
            })?;
        }
        bytes += digest.size;
        recipes.push(FileRecipe {
            path: path_in_checkpoint(root, f),
            size: digest.size,
            blake3: to_hex(&digest.blake3),
            root: to_hex(&tree_root),
        });
    }
    sender.flush()?;
    Ok(Some(Sent { recipes, bytes }))
}

impl Level for StagedDedup {
    fn name(&self) -> String {
        self.pool.describe()
    }

    fn takes(&self) -> Option<Unit> {
        self.repository.options().map(|_| Unit::Checkpoints)
    }

    fn durable(&self) -> bool {
        false
    }

    fn holds(&self, e: &LifeEntry) -> bool {
        e.safe()
    }

    /// A checkpoint is sent as chunks and its manifest, then waits for its server to write
    /// the manifest; if the servers fail to take it, the repository level stores it.
    fn send_checkpoint(&self, node: &Node, c: &Checkpoint, previous: Option<&Checkpoint>) -> Step {
        let Some(dedup) = self.repository.options() else {
            return Step::Next;
        };
        if let Some(step) = not_yet_whole(node, c) {
            return step;
        }
        // Pushed at this version (a change below since makes it send again).
        let as_packs = self.pool.opts.dedup == DedupStaging::Packs;
        if c.root.pushed_flag && c.root.safe() {
            // Its server writes the manifest once the blobs are pushed.
            let completed = if as_packs {
                self.complete_packs(node, c.root)
            } else {
                self.complete_staged(node, c.root)
            };
            return match completed {
                Ok(step) => step,
                Err(e) => retry_later(
                    node,
                    c.root,
                    &format!("storing {} in the dedup repository", c.root.path),
                    &e,
                ),
            };
        }
        let staged = if as_packs {
            self.stage_packs(node, c.root, previous)
        } else {
            self.stage_checkpoint(node, dedup, c.root, previous)
        };
        match staged {
            Ok(true) => Step::Handed,
            Ok(false) => Step::Changed,
            Err(e) => {
                // Unacknowledged: the checkpoint goes straight to the durable store. As packs,
                // with the repository reloaded from the durable store: this process's index
                // names packs only staged, perhaps on the server that just failed, which a
                // manifest written directly must not name.
                if as_packs {
                    self.repository.reopen();
                }
                node.record_failure(format!(
                    "sending {} to the staging servers failed: {e}; storing it in the durable \
                     store's dedup repository instead",
                    c.root.path
                ));
                Step::Next
            }
        }
    }

    fn find<'a>(&'a self, node: &'a Node, key: &'a DurableKey) -> Result<Option<Found<'a>>> {
        Ok(self.pending_recipe(key).map(|(stamp, recipe)| Found {
            stamp,
            fetch: Box::new(move |tmp| self.rebuild(node, &recipe, tmp).map(Some)),
        }))
    }
}
