//! The dedup side of a staging server (docs/staging.md, "Dedup through the servers"): the
//! Lacks, PutChunks, PutManifest, GetChunks and GetManifest requests, and the push thread
//! that writes the chunk store's records into the durable repository (one per namespace, at
//! `<drain-to>/<namespace>/.cascade-dedup`) as packs and index objects, then the manifests
//! whose blobs are all indexed there.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cascade_dedup::repo::format::{BlobKind, DeltaBase};
use cascade_dedup::repo::{
    undo_delta, Error as RepoError, FileRecipe, Hold, Manifest, Repo, RepoWriter, DEFAULT_PREFIX,
    MANIFEST_FORMAT,
};
use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Chunking, Compression, Score};

use super::{engine_code, lock, ConnState, Outbox, Shared};
use crate::chunks::base_cache::{BaseCache, Cached};
use crate::chunks::manifests::{ManifestStore, PendingManifest};
use crate::chunks::{ChunkOptions, ChunkStore, Position, PushBatch, Scanned};
use crate::protocol::{
    self, code, kind, ManifestPart, ManifestState, Stored, WireChunk, CHUNK_FIXED, MAX_BODY,
};
pub use cascade_wire::status::DedupStatus;

use crate::{hex, ServerError as Error, ServerResult as Result};

/// Stored bytes a push round reads at a time (a batch).
const PUSH_BATCH: u64 = 32 << 20;
/// Stored bytes one push round goes on reading while more is acknowledged (then it ends,
/// moving the cursor: a crash pushes at most this again).
const ROUND_MAX: u64 = 64 << 20;
/// How often other writers' index objects are looked for with nothing waiting; while a
/// manifest waits, when a client asks for it (GetManifest: a watching agent asks as soon as
/// another server pushed) and else every `recheck_every`.
const REFRESH_IDLE: Duration = Duration::from_secs(5);
/// A namespace whose repository did not exist is looked for again after this.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// Scores of a pending manifest checked against the index per read of its file.
const CHECK_BATCH: usize = 8192;
/// A hold on a repository ends once every chunk is pushed and no delta was checked for
/// this long.
const HOLD_AFTER_LAST_DELTA: Duration = Duration::from_secs(10);
/// A GetChunksOk holds chunks up to this many bytes (at least one chunk, up to `MAX_BODY`).
const GET_CHUNKS_REPLY: usize = 4 << 20;
/// Delta chunks of a PutChunks whose bases are read from the repository at once.
const REBUILD_BATCH: usize = 64;
/// Raw bytes of a PutChunks (decompressed or rebuilt) kept in memory until after the reply
/// to go into the base cache; past it they go in at once (a frame may hold 256 MiB raw).
const CACHE_AFTER_REPLY: usize = 16 << 20;
/// Most namespace repositories (or "none there" looks) kept at once: each holds its index in
/// memory, and namespaces are named by clients. Past it the least recently used one that no
/// request is using is closed (reopened on demand).
pub(super) const MAX_OPEN_REPOS: usize = 64;

/// What a push round read and pushed so far.
#[derive(Default)]
struct PushedRound {
    /// Where its records end: the cursor once the round is done.
    next: Position,
    /// Records and their stored bytes read.
    chunks: u64,
    read_bytes: u64,
    /// Chunks written into packs, their bytes, and chunks the repository had.
    pushed: u64,
    pushed_bytes: u64,
    already: u64,
}

/// The namespaces of a batch's chunk records.
fn namespaces_in(records: &[Scanned]) -> impl Iterator<Item = &str> {
    records.iter().filter_map(|r| match r {
        Scanned::Chunk { namespace, .. } => Some(namespace.as_str()),
        Scanned::Corrupt { .. } => None,
    })
}

#[derive(Default)]
struct Counters {
    chunks_absorbed: u64,
    chunk_bytes_raw: u64,
    chunk_bytes_stored: u64,
    delta_chunks_absorbed: u64,
    chunks_deduplicated: u64,
    chunks_pushed: u64,
    pushed_bytes: u64,
    chunks_already_durable: u64,
    manifests_written: u64,
    refused_chunks: u64,
    lost_chunks: u64,
    push_failures: u64,
    delta_bases_from_cache: u64,
    delta_bases_from_durable: u64,
    delta_base_bytes_from_durable: u64,
    delta_base_read_micros: u64,
    base_cache_corrupt: u64,
}

/// A namespace's repository: None while the durable store has none (looked again later).
struct RepoSlot {
    repo: Option<Arc<Repo>>,
    looked: Instant,
    /// Last handed out: idle ones are closed (`retire_repos`).
    used: Instant,
}

pub(super) struct Dedup {
    chunks: ChunkStore,
    /// Raw bytes of data chunks received, rebuilt or read lately: the bases of the next
    /// checkpoint's delta chunks, checked without reading them over the durable link.
    bases: BaseCache,
    manifests: ManifestStore,
    repos: Mutex<HashMap<String, RepoSlot>>,
    /// Per namespace, while delta chunks whose bases were checked may wait to be pushed:
    /// the hold and when a delta was last checked under it.
    holds: Mutex<HashMap<String, (Hold, Instant)>>,
    counters: Mutex<Counters>,
    wake: (Mutex<u64>, Condvar),
    /// A client asked for a pending manifest: other writers' index objects are loaded and
    /// the pending manifests checked at once.
    recheck: AtomicBool,
}

impl Dedup {
    /// Opens the chunk store and the pending manifests in `dir` (recovering both); the
    /// recovery warnings, one line each.
    pub(super) fn open(dir: &Path, opts: ChunkOptions) -> Result<(Dedup, Vec<String>)> {
        let bases =
            BaseCache::open(&dir.join("base-cache"), opts.base_cache_bytes).map_err(|e| {
                Error::Io {
                    what: format!("base cache in {}", dir.display()),
                    source: e,
                }
            })?;
        let chunks = ChunkStore::open(dir, opts)?;
        let (manifests, mut warnings) = ManifestStore::open(&dir.join("manifests"))?;
        warnings.extend(chunks.recovery_warnings());
        Ok((
            Dedup {
                chunks,
                bases,
                manifests,
                repos: Mutex::new(HashMap::new()),
                holds: Mutex::new(HashMap::new()),
                counters: Mutex::new(Counters::default()),
                wake: (Mutex::new(0), Condvar::new()),
                recheck: AtomicBool::new(false),
            },
            warnings,
        ))
    }
}

/// Checks that a chunk's stored bytes are its score: decompressed to exactly `raw_len`
/// bytes when zstd, then hashed; a delta chunk only that it has a frame (its score is checked
/// once rebuilt on its base). The decompressed bytes of a zstd chunk (for the base cache).
fn verify(c: &WireChunk) -> std::result::Result<Option<Vec<u8>>, String> {
    let (got, raw) = match c.stored {
        Stored::Raw => (score(c.data), None),
        Stored::Zstd => {
            let raw = Compression::decompress(c.data, c.raw_len as usize).map_err(|e| {
                format!(
                    "chunk {}: its zstd frame does not decompress to {} bytes: {e}",
                    hex(&c.score),
                    c.raw_len
                )
            })?;
            (score(&raw), Some(raw))
        }
        // Its score is checked where it is rebuilt on its base (`rebuild_deltas`), which
        // decompresses its frame: here only that it has one (decompressing it here too
        // cost the servers a second zstd pass over every delta chunk).
        Stored::Delta => {
            return match protocol::split_delta(c.data) {
                Some(_) => Ok(None),
                None => Err(format!("delta chunk {}: no frame", hex(&c.score))),
            };
        }
    };
    if got != c.score {
        return Err(format!(
            "chunk {}: its bytes hash to {}; nothing of this frame was stored",
            hex(&c.score),
            hex(&got)
        ));
    }
    Ok(raw)
}

/// Delta chunks rebuilt on their bases: their scores and raw bytes.
type Rebuilt = Vec<(Score, Vec<u8>)>;

/// The repository's manifest for a pending one.
fn manifest_of(m: &PendingManifest, created_unix_ns: u64) -> Manifest {
    Manifest {
        format: MANIFEST_FORMAT.to_string(),
        checkpoint: m.checkpoint.clone(),
        created_unix_ns,
        chunking: m.chunking.clone(),
        compression: m.compression.clone(),
        files: m
            .files
            .iter()
            .map(|f| FileRecipe {
                path: f.path.clone(),
                size: f.size,
                blake3: hex(&f.blake3),
                root: to_hex(&f.root),
            })
            .collect(),
        // Filled in by the repository when it records the manifest.
        packs: None,
        single_file: m.single_file,
    }
}

impl Shared {
    pub(super) fn wake_push(&self) {
        let (m, cv) = &self.dedup.wake;
        *lock(m) += 1;
        cv.notify_all();
    }

    pub(super) fn dedup_status(&self) -> DedupStatus {
        let u = self.dedup.chunks.usage();
        let (base_cache_chunks, base_cache_bytes) = self.dedup.bases.usage();
        let c = lock(&self.dedup.counters);
        DedupStatus {
            chunks_absorbed: c.chunks_absorbed,
            chunk_bytes_raw: c.chunk_bytes_raw,
            chunk_bytes_stored: c.chunk_bytes_stored,
            delta_chunks_absorbed: c.delta_chunks_absorbed,
            chunks_deduplicated: c.chunks_deduplicated,
            chunks_pushed: c.chunks_pushed,
            pushed_bytes: c.pushed_bytes,
            chunks_already_durable: c.chunks_already_durable,
            pending_chunks: u.pending_chunks,
            pending_bytes: u.pending_bytes,
            pending_manifests: self.dedup.manifests.pending().len() as u64,
            manifests_written: c.manifests_written,
            refused_chunks: c.refused_chunks,
            lost_chunks: c.lost_chunks,
            push_failures: c.push_failures,
            segment_files: u.segment_files,
            segment_bytes: u.segment_bytes,
            index_chunks: u.index_chunks,
            index_memory_bytes: u.index_memory_bytes,
            open_repositories: lock(&self.dedup.repos).len() as u64,
            delta_bases_from_cache: c.delta_bases_from_cache,
            delta_bases_from_durable: c.delta_bases_from_durable,
            delta_base_bytes_from_durable: c.delta_base_bytes_from_durable,
            delta_base_read_micros: c.delta_base_read_micros,
            base_cache_corrupt: c.base_cache_corrupt,
            base_cache_chunks,
            base_cache_bytes,
        }
    }

    /// The durable repository of `namespace` (`<drain-to>/<namespace>/.cascade-dedup`):
    /// created with `create`, else None while there is none (looked for again after a
    /// second). The first use of a namespace reads its index objects.
    fn repo_for(&self, namespace: &str, create: bool) -> Result<Option<Arc<Repo>>> {
        {
            let mut repos = lock(&self.dedup.repos);
            if let Some(slot) = repos.get_mut(namespace) {
                if slot.repo.is_some() || (!create && slot.looked.elapsed() < LOOK_AGAIN) {
                    slot.used = Instant::now();
                    return Ok(slot.repo.clone());
                }
            }
        }
        // Outside the lock: this reads the durable store.
        let prefix = crate::namespaced(namespace, DEFAULT_PREFIX);
        let opened = if create {
            Repo::open(
                self.durable.clone(),
                &prefix,
                Chunking::DEFAULT_CDC,
                Compression::None,
            )
            .map(Some)
        } else {
            Repo::open_existing(self.durable.clone(), &prefix)
        };
        let mut repos = lock(&self.dedup.repos);
        if !repos.contains_key(namespace) {
            evict_lru(&mut repos, MAX_OPEN_REPOS - 1);
        }
        let slot = repos.entry(namespace.to_string()).or_insert(RepoSlot {
            repo: None,
            looked: Instant::now(),
            used: Instant::now(),
        });
        slot.used = Instant::now();
        // A failure too waits a second before the next look: requests must not each wait
        // for a durable store that is down.
        slot.looked = Instant::now();
        let opened = opened?;
        // Someone else may have opened it meanwhile: keep theirs (its index knows their
        // pushes).
        if slot.repo.is_none() {
            slot.repo = opened.map(Arc::new);
        }
        Ok(slot.repo.clone())
    }

    /// The repository of `namespace` if it can be had now; failures are logged (answers then
    /// rest on the chunk store alone).
    fn repo_if_any(&self, namespace: &str) -> Option<Arc<Repo>> {
        match self.repo_for(namespace, false) {
            Ok(r) => r,
            Err(e) => {
                self.log(|| format!("dedup repository of namespace {namespace:?}: {e}"));
                None
            }
        }
    }

    // ---- requests ----

    pub(super) fn lacks(&self, out: &Outbox, id: u32, ns: &str, scores: &[Score]) -> bool {
        let held = self.dedup.chunks.held(ns, scores);
        let candidates: Vec<Score> = scores
            .iter()
            .zip(&held)
            .filter(|(_, h)| !**h)
            .map(|(s, _)| *s)
            .collect();
        let missing: HashSet<Score> = match self.repo_if_any(ns) {
            Some(repo) => repo.missing(&candidates).into_iter().collect(),
            None => candidates.into_iter().collect(),
        };
        let lacks: Vec<bool> = scores
            .iter()
            .zip(&held)
            .map(|(s, h)| !h && missing.contains(s))
            .collect();
        self.reply(out, id, kind::LACKS, &[&protocol::encode_lacks_ok(&lacks)]);
        true
    }

    pub(super) fn put_chunks(&self, out: &Outbox, id: u32, ns: &str, chunks: &[WireChunk]) -> bool {
        self.last_write_ms
            .store(self.now_ms().max(1), Ordering::Relaxed);
        // Every chunk is checked before any is stored: a bad frame leaves nothing behind.
        // The raw bytes of the data chunks go to the base cache once stored.
        let mut whole: Vec<(&WireChunk, Option<Vec<u8>>)> = Vec::with_capacity(chunks.len());
        let mut held = 0usize;
        for c in chunks {
            match verify(c) {
                Ok(raw) if c.kind == BlobKind::Data && c.stored != Stored::Delta => match raw {
                    Some(raw) if held + raw.len() > CACHE_AFTER_REPLY => {
                        self.dedup.bases.insert(&c.score, &raw)
                    }
                    Some(raw) => {
                        held += raw.len();
                        whole.push((c, Some(raw)));
                    }
                    None => whole.push((c, None)),
                },
                Ok(_) => {}
                Err(why) => {
                    lock(&self.dedup.counters).refused_chunks += 1;
                    self.log(|| format!("refused a PutChunks: {why}"));
                    self.reply_error(out, id, code::BAD_CHUNK, &why);
                    return false;
                }
            }
        }
        if let Err(why) = self.check_delta_bases(ns, chunks) {
            self.log(|| format!("refused a PutChunks: {why}"));
            self.reply_error(out, id, code::BASE_UNKNOWN, &why);
            return false;
        }
        let rebuilt = match self.rebuild_deltas(ns, chunks, &mut held) {
            Ok(rebuilt) => rebuilt,
            Err((c, why)) => {
                if c == code::BAD_CHUNK {
                    lock(&self.dedup.counters).refused_chunks += 1;
                }
                self.log(|| format!("refused a PutChunks: {why}"));
                self.reply_error(out, id, c, &why);
                return false;
            }
        };
        let in_repo: HashSet<Score> = match self.repo_if_any(ns) {
            Some(repo) => {
                let scores: Vec<Score> = chunks.iter().map(|c| c.score).collect();
                let missing: HashSet<Score> = repo.missing(&scores).into_iter().collect();
                scores
                    .into_iter()
                    .filter(|s| !missing.contains(s))
                    .collect()
            }
            None => HashSet::new(),
        };
        let to_store: Vec<WireChunk> = chunks
            .iter()
            .filter(|c| !in_repo.contains(&c.score))
            .copied()
            .collect();
        let durable_already = (chunks.len() - to_store.len()) as u32;
        match self.dedup.chunks.put(ns, &to_store) {
            Ok(o) => {
                {
                    let mut c = lock(&self.dedup.counters);
                    c.chunks_absorbed += u64::from(o.stored);
                    c.delta_chunks_absorbed += o.deltas;
                    c.chunk_bytes_raw += o.raw_bytes;
                    c.chunk_bytes_stored += o.stored_bytes;
                    c.chunks_deduplicated += u64::from(o.present + durable_already);
                }
                if o.stored > 0 {
                    self.wake_push();
                }
                let body = protocol::encode_put_chunks_ok(o.stored, o.present + durable_already);
                self.reply(out, id, kind::PUT_CHUNKS, &[&body]);
                // After the reply: the next checkpoint's deltas on these find their bases
                // here.
                for (c, raw) in &whole {
                    self.dedup
                        .bases
                        .insert(&c.score, raw.as_deref().unwrap_or(c.data));
                }
                for (s, raw) in &rebuilt {
                    self.dedup.bases.insert(s, raw);
                }
                true
            }
            Err(e) => {
                let (c, why) = engine_code(&e);
                if c != code::FULL {
                    self.fail(format!("cannot store chunks: {why}"));
                }
                self.reply_error(out, id, c, &why);
                false
            }
        }
    }

    /// Checks that every delta chunk of a PutChunks has a base the durable repository holds
    /// as a usable base (loading other writers' index objects once if one is not known yet),
    /// under a hold taken first: a base condemned after this check stays readable until the
    /// push, which then stores the chunk whole (docs/staging.md, "Delta chunks").
    fn check_delta_bases(&self, ns: &str, chunks: &[WireChunk]) -> std::result::Result<(), String> {
        let bases: Vec<(Score, Score)> = chunks
            .iter()
            .filter(|c| c.stored == Stored::Delta)
            .filter_map(|c| protocol::split_delta(c.data).map(|(b, _)| (c.score, b.score)))
            .collect();
        if bases.is_empty() {
            return Ok(());
        }
        let no_base = |(chunk, base): &(Score, Score), why: &str| {
            format!(
                "delta chunk {}: its base {} {why}; nothing of this frame was stored",
                hex(chunk),
                hex(base)
            )
        };
        let Some(repo) = self.repo_if_any(ns) else {
            return Err(no_base(&bases[0], "has no durable repository to be in"));
        };
        self.hold_bases(ns, &repo)
            .map_err(|e| no_base(&bases[0], &format!("cannot be held: {e}")))?;
        let unusable = || bases.iter().find(|(_, b)| !repo.usable_as_base(b));
        if unusable().is_some() {
            // Pushed by another server since this one last looked.
            repo.refresh_index()
                .map_err(|e| no_base(&bases[0], &e.to_string()))?;
        }
        match unusable() {
            Some(b) => Err(no_base(b, "is not a usable base in the durable repository")),
            None => Ok(()),
        }
    }

    /// Rebuilds every delta chunk of a PutChunks on its base, from the base cache (checked
    /// against its score) or else read from the durable repository (checked likewise, under
    /// the hold `check_delta_bases` took), and checks the result against the chunk's score: a
    /// delta that does not rebuild its score never enters the chunk store, so no repository
    /// entry, manifest or later delta rests on it. `BAD_CHUNK` for one that does not
    /// rebuild, `BASE_UNKNOWN` for a base that cannot be read (send those chunks whole). The
    /// rebuilt chunks' raw bytes, for the base cache once stored, while `held` (the bytes
    /// kept so far) stays within [`CACHE_AFTER_REPLY`]; the others go into it at once.
    fn rebuild_deltas(
        &self,
        ns: &str,
        chunks: &[WireChunk],
        held: &mut usize,
    ) -> std::result::Result<Rebuilt, (u16, String)> {
        let deltas: Vec<(&WireChunk, DeltaBase, &[u8])> = chunks
            .iter()
            .filter(|c| c.stored == Stored::Delta)
            .filter_map(|c| protocol::split_delta(c.data).map(|(b, frame)| (c, b, frame)))
            .collect();
        let mut rebuilt = Vec::with_capacity(deltas.len());
        if deltas.is_empty() {
            return Ok(rebuilt);
        }
        let Some(repo) = self.repo_if_any(ns) else {
            let why = format!(
                "delta chunk {}: no durable repository to read its base from; nothing of this frame was stored",
                hex(&deltas[0].0.score)
            );
            return Err((code::BASE_UNKNOWN, why));
        };
        // Bases are read a batch at a time: what one frame makes the server hold is bounded.
        for batch in deltas.chunks(REBUILD_BATCH) {
            let mut wanted: Vec<Score> = batch.iter().map(|(_, b, _)| b.score).collect();
            wanted.sort_unstable();
            wanted.dedup();
            let mut bases: HashMap<Score, Vec<u8>> = HashMap::with_capacity(wanted.len());
            let mut unread = Vec::new();
            let (mut hits, mut corrupt) = (0u64, 0u64);
            for s in wanted {
                match self.dedup.bases.get(&s) {
                    Cached::Hit(raw) => {
                        hits += 1;
                        bases.insert(s, raw);
                    }
                    Cached::Corrupt => {
                        corrupt += 1;
                        unread.push(s);
                    }
                    Cached::Miss => unread.push(s),
                }
            }
            {
                let mut c = lock(&self.dedup.counters);
                c.delta_bases_from_cache += hits;
                c.base_cache_corrupt += corrupt;
            }
            if corrupt > 0 {
                self.log(|| {
                    format!("{corrupt} delta base(s) in the base cache did not hash to their scores; reading them from the durable repository")
                });
            }
            let started = Instant::now();
            let raws = if unread.is_empty() {
                Vec::new()
            } else {
                repo.read_blobs(&unread).map_err(|e| {
                    let why = format!(
                        "delta chunk {}: a base of its frame cannot be read from the durable repository: {e}; nothing of this frame was stored",
                        hex(&batch[0].0.score)
                    );
                    (code::BASE_UNKNOWN, why)
                })?
            };
            {
                let mut c = lock(&self.dedup.counters);
                c.delta_bases_from_durable += unread.len() as u64;
                c.delta_base_bytes_from_durable += raws.iter().map(|r| r.len() as u64).sum::<u64>();
                if !unread.is_empty() {
                    c.delta_base_read_micros += started.elapsed().as_micros() as u64;
                }
            }
            for (s, raw) in unread.into_iter().zip(raws) {
                // Read once over the link: the next delta on it finds it here.
                self.dedup.bases.insert(&s, &raw);
                bases.insert(s, raw);
            }
            for (c, base, frame) in batch {
                let bad = |why: String| {
                    let why = format!(
                        "delta chunk {} on base {}: {why}; nothing of this frame was stored",
                        hex(&c.score),
                        hex(&base.score)
                    );
                    (code::BAD_CHUNK, why)
                };
                let Some(base_raw) = bases.get(&base.score) else {
                    return Err(bad("its base was not read".to_string()));
                };
                let raw = undo_delta(frame, c.raw_len, base_raw, base.from).map_err(bad)?;
                let got = score(&raw);
                if got != c.score {
                    return Err(bad(format!(
                        "rebuilt on its base it hashes to {}, not to its score",
                        hex(&got)
                    )));
                }
                if *held + raw.len() > CACHE_AFTER_REPLY {
                    self.dedup.bases.insert(&c.score, &raw);
                } else {
                    *held += raw.len();
                    rebuilt.push((c.score, raw));
                }
            }
        }
        Ok(rebuilt)
    }

    /// Takes a hold on `ns`'s repository unless one is held (ended once nothing waits to be
    /// pushed).
    fn hold_bases(&self, ns: &str, repo: &Repo) -> cascade_dedup::repo::Result<()> {
        let mut holds = lock(&self.dedup.holds);
        match holds.get_mut(ns) {
            Some((_, used)) => *used = Instant::now(),
            None => {
                holds.insert(ns.to_string(), (repo.hold()?, Instant::now()));
            }
        }
        Ok(())
    }

    /// Renews the holds while chunks wait to be pushed, ends them once none does.
    fn tend_holds(&self) {
        let mut holds = lock(&self.dedup.holds);
        if holds.is_empty() {
            return;
        }
        let pushed_all = self.dedup.chunks.usage().pending_chunks == 0;
        for (ns, (mut hold, used)) in std::mem::take(&mut *holds) {
            let Some(repo) = self.repo_if_any(&ns) else {
                continue;
            };
            // A delta checked just now may not be in the chunk store yet.
            if pushed_all && used.elapsed() >= HOLD_AFTER_LAST_DELTA {
                hold.end(&repo);
                continue;
            }
            match hold.renew(&repo) {
                Ok(()) => {
                    holds.insert(ns, (hold, used));
                }
                Err(e) => {
                    self.log(|| format!("hold on the dedup repository of {ns:?}: {e}"));
                    if let Ok(hold) = repo.hold() {
                        holds.insert(ns, (hold, used));
                    }
                }
            }
        }
    }

    pub(super) fn put_manifest(
        &self,
        out: &Outbox,
        id: u32,
        ns: &str,
        part: &ManifestPart,
        conn: &ConnState,
    ) -> bool {
        let mut upload = lock(&conn.upload);
        let received = (|| -> Result<()> {
            if part.part == 0 {
                part.chunking
                    .parse::<Chunking>()
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                part.compression
                    .parse::<Compression>()
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                // A new manifest drops one this connection left unfinished.
                *upload = None;
                let mut up = self.dedup.manifests.begin(ns, part)?;
                self.dedup.manifests.add(&mut up, part)?;
                *upload = Some(up);
            } else {
                let Some(up) = upload.as_mut() else {
                    return Err(Error::Invalid(format!(
                        "manifest part {} of {} without part 0 on this connection",
                        part.part, part.checkpoint
                    )));
                };
                self.dedup.manifests.add(up, part)?;
            }
            if part.last {
                if let Some(up) = upload.take() {
                    let m = self.dedup.manifests.commit(up)?;
                    self.log(|| {
                        format!(
                            "dedup manifest of {} ({} files, {} blobs) is pending",
                            crate::namespaced(ns, &m.checkpoint),
                            m.files.len(),
                            m.score_count
                        )
                    });
                    self.wake_push();
                }
            }
            Ok(())
        })();
        match received {
            Ok(()) => {
                self.reply(out, id, kind::PUT_MANIFEST, &[]);
                true
            }
            Err(e) => {
                *upload = None;
                let (c, why) = match &e {
                    Error::Engine(e) => engine_code(e),
                    Error::Invalid(why) => (code::INVALID, why.clone()),
                    other => (code::IO, other.to_string()),
                };
                if c == code::IO {
                    self.fail(format!("cannot record a dedup manifest: {why}"));
                }
                self.reply_error(out, id, c, &why);
                false
            }
        }
    }

    pub(super) fn get_chunks(&self, out: &Outbox, id: u32, ns: &str, scores: &[Score]) -> bool {
        let mut found = Vec::new();
        let mut body_len = 8usize;
        let mut considered = 0u32;
        for s in scores {
            match self.dedup.chunks.get(ns, s) {
                Ok(Some(c)) => {
                    let len = CHUNK_FIXED + c.data.len();
                    // Short answers keep what a client that does not read them holds of
                    // the server's memory small: it asks again for the rest.
                    let limit = if found.is_empty() {
                        MAX_BODY
                    } else {
                        GET_CHUNKS_REPLY
                    };
                    if body_len + len > limit {
                        break;
                    }
                    body_len += len;
                    found.push((*s, c));
                }
                Ok(None) => {}
                Err(crate::engine::Error::Corrupt { what }) => {
                    // Not served: the client reads it from the durable store, or resends it.
                    self.fail(format!("GetChunks: {what}"));
                    self.dedup.chunks.forget(ns, s);
                }
                Err(e) => {
                    let (c, why) = engine_code(&e);
                    self.fail(format!("GetChunks: {why}"));
                    self.reply_error(out, id, c, &why);
                    return true;
                }
            }
            considered += 1;
        }
        let wire: Vec<WireChunk> = found
            .iter()
            .map(|(s, c)| WireChunk {
                score: *s,
                kind: c.kind,
                stored: c.stored,
                raw_len: c.raw_len,
                data: &c.data,
            })
            .collect();
        let head = protocol::encode_get_chunks_ok_head(considered, &wire);
        drop(wire);
        // The chunks' bytes are moved into the reply, not copied.
        let mut body: Vec<Vec<u8>> = Vec::with_capacity(found.len() + 1);
        body.push(head);
        body.extend(found.into_iter().map(|(_, c)| c.data));
        self.reply_owned(out, id, kind::GET_CHUNKS, body);
        true
    }

    pub(super) fn get_manifest(&self, out: &Outbox, id: u32, ns: &str, checkpoint: &str) -> bool {
        let found = match self.dedup.manifests.find(ns, checkpoint) {
            Some(m) => Ok(Some((
                ManifestState::Pending,
                manifest_of(&m, m.received_unix_ns),
            ))),
            None => match self.repo_for(ns, false) {
                Ok(Some(repo)) => repo
                    .read_manifest(checkpoint)
                    .map(|m| m.map(|m| (ManifestState::Written, m)))
                    .map_err(Error::from),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            },
        };
        if matches!(found, Ok(Some((ManifestState::Pending, _)))) {
            self.dedup.recheck.store(true, Ordering::SeqCst);
            lock(&self.counters).asked_rechecks += 1;
            self.wake_push();
        }
        let (state, json) = match found {
            Ok(Some((state, m))) => match serde_json::to_string(&m) {
                Ok(json) => (state, json),
                Err(e) => {
                    self.reply_error(out, id, code::IO, &e.to_string());
                    return true;
                }
            },
            Ok(None) => (ManifestState::Unknown, String::new()),
            Err(e) => {
                // Like a Read's: the connection stays.
                self.reply_error(out, id, code::IO, &e.to_string());
                return true;
            }
        };
        if json.len() + 1 > MAX_BODY {
            let why = format!("the manifest of {checkpoint} is too large for one reply");
            self.reply_error(out, id, code::INVALID, &why);
            return true;
        }
        let body = protocol::encode_get_manifest_ok(state, &json);
        self.reply(out, id, kind::GET_MANIFEST, &[&body]);
        true
    }

    // ---- the push ----

    /// Pushes acknowledged chunks into the durable repository (yielding to clients that
    /// send), looks for other writers' index objects, and writes pending manifests whose
    /// blobs are all indexed; failures are retried with backoff (0.5 s doubling to 30 s).
    pub(super) fn dedup_push_loop(self: Arc<Self>) {
        let mut failures = 0u32;
        let mut retry_at = Instant::now();
        let mut last_refresh = Instant::now();
        let mut manifest_retry: HashMap<u64, (u32, Instant)> = HashMap::new();
        let mut checked_at_wake = u64::MAX;
        while !self.stop.load(Ordering::SeqCst) {
            let seen = *lock(&self.dedup.wake.0);
            let mut progressed = false;
            if Instant::now() >= retry_at {
                match self.push_round() {
                    Ok(pushed) => {
                        progressed = pushed;
                        failures = 0;
                        if pushed {
                            self.event();
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        let delay = Duration::from_millis(500)
                            .saturating_mul(1 << failures.min(6))
                            .min(Duration::from_secs(30));
                        retry_at = Instant::now() + delay;
                        lock(&self.dedup.counters).push_failures += 1;
                        self.fail(format!(
                            "push of dedup chunks failed (attempt {failures}): {e}; retrying in {:.1} s",
                            delay.as_secs_f64()
                        ));
                    }
                }
            }
            let waiting = !self.dedup.manifests.pending().is_empty();
            let every = if waiting {
                self.opts.recheck_every
            } else {
                REFRESH_IDLE.max(self.opts.recheck_every)
            };
            self.tend_holds();
            self.retire_repos();
            let mut refreshed = false;
            let asked = self.dedup.recheck.swap(false, Ordering::SeqCst);
            if asked || last_refresh.elapsed() >= every {
                if waiting && !asked {
                    lock(&self.counters).timed_rechecks += 1;
                }
                last_refresh = Instant::now();
                self.refresh_repos();
                refreshed = true;
            }
            // Checked when something may have changed: a push, other writers' index
            // objects, or a request that woke this thread (a new manifest, new chunks).
            if waiting && (progressed || refreshed || seen != checked_at_wake) {
                checked_at_wake = seen;
                if self.complete_dedup_manifests(&mut manifest_retry) {
                    progressed = true;
                    self.event();
                }
            }
            if !progressed {
                // New chunks, a manifest or a GetManifest wake it (`wake_push`); the timeout
                // is for the holds and the idle refresh.
                let (m, cv) = &self.dedup.wake;
                let g = lock(m);
                if *g == seen {
                    let _ = cv.wait_timeout(g, Duration::from_millis(250));
                }
            }
        }
        // Stopping: the collector need not wait for these holds' leases to run out. A
        // restarted server pushes what waits before garbage collection can delete a base
        // unless it stays down longer than a lease.
        for (ns, (hold, _)) in std::mem::take(&mut *lock(&self.dedup.holds)) {
            if let Some(repo) = self.repo_if_any(&ns) {
                hold.end(&repo);
            }
        }
    }

    /// One push round: records after the cursor, one repository session per namespace
    /// (packs, then the index object), then the cursor is moved (durably) and wholly pushed
    /// segments are deleted. True if it moved the cursor.
    ///
    /// A round starts as soon as acknowledged chunks wait, also while agents still send:
    /// the durable store's link is the bottleneck, so the push must overlap the sending.
    /// Holding rounds back for 8 MiB or a 50 ms pause in the sending made the last server of
    /// a checkpoint start its upload only after the agent had finished. A round reads up to
    /// [`PUSH_BATCH`] at a time and goes on with what was acknowledged while its packs
    /// uploaded (up to [`ROUND_MAX`], and only for namespaces it has open): one session, one
    /// index object and one cursor move for all of it. Each round costs the durable store
    /// several requests besides its packs (the session, the condemned packs and other
    /// writers' index objects looked up, the index object); ending a round at every batch
    /// made 2-3 rounds of a few hundred KiB each at the end of every checkpoint.
    fn push_round(&self) -> Result<bool> {
        let (cursor, end) = self.dedup.chunks.push_window();
        if cursor >= end {
            return Ok(false);
        }
        // Not paced like the drain (`Pacer`): the records were just written, so they come
        // from the page cache, and the batch is read whole before its upload starts; paced
        // at 1 MiB per 10 ms while agents send, a 32 MiB round read for 0.3 s with the link
        // idle.
        let mut batch = self
            .dedup
            .chunks
            .read_for_push(cursor, PUSH_BATCH, &mut |_| {})?;
        let mut repos: BTreeMap<String, Arc<Repo>> = BTreeMap::new();
        for namespace in namespaces_in(&batch.records) {
            let repo = self
                .repo_for(namespace, true)?
                .ok_or_else(|| Error::Invalid(format!("no dedup repository for {namespace:?}")))?;
            repos.insert(namespace.to_string(), repo);
        }
        let mut writers: BTreeMap<&str, RepoWriter> = repos
            .iter()
            .map(|(namespace, repo)| (namespace.as_str(), repo.writer()))
            .collect();
        let mut round = PushedRound {
            next: cursor,
            ..PushedRound::default()
        };
        loop {
            self.push_batch(&batch, &mut writers, &mut round)?;
            if round.read_bytes >= ROUND_MAX || self.stop.load(Ordering::SeqCst) {
                break;
            }
            for writer in writers.values_mut() {
                writer.wait_uploads()?;
            }
            if round.next >= self.dedup.chunks.push_window().1 {
                break;
            }
            let more = self
                .dedup
                .chunks
                .read_for_push(round.next, PUSH_BATCH, &mut |_| {})?;
            // Another namespace's chunks: the next round, with its own session.
            if namespaces_in(&more.records).any(|n| !writers.contains_key(n)) {
                break;
            }
            batch = more;
        }
        // Packs first, then the index object naming them: only then may the cursor move.
        for writer in writers.into_values() {
            writer.finish()?;
        }
        {
            let mut c = lock(&self.dedup.counters);
            c.chunks_pushed += round.pushed;
            c.pushed_bytes += round.pushed_bytes;
            c.chunks_already_durable += round.already;
        }
        if round.next == cursor {
            return Ok(false);
        }
        self.dedup
            .chunks
            .mark_pushed(round.next, round.chunks, round.read_bytes)?;
        let PushedRound {
            pushed,
            pushed_bytes,
            already,
            next,
            ..
        } = round;
        self.log(|| {
            format!(
                "pushed {pushed} dedup chunks ({pushed_bytes} bytes; {already} already in the repository) up to segment {} offset {}",
                next.segment, next.offset
            )
        });
        Ok(true)
    }

    /// Adds one batch's records to the writers of their namespaces (every one open) and
    /// counts them in `round`; a corrupt record is counted lost and reported.
    fn push_batch(
        &self,
        batch: &PushBatch,
        writers: &mut BTreeMap<&str, RepoWriter>,
        round: &mut PushedRound,
    ) -> Result<()> {
        for r in &batch.records {
            let (namespace, score, kind, stored, raw_len, data) = match r {
                Scanned::Chunk {
                    namespace,
                    score,
                    kind,
                    stored,
                    raw_len,
                    data,
                    ..
                } => (namespace, score, kind, stored, raw_len, data),
                Scanned::Corrupt { at, why } => {
                    lock(&self.dedup.counters).lost_chunks += 1;
                    self.fail(format!(
                        "dedup segment {} at {}: {why}; the rest of that segment is lost",
                        at.segment, at.offset
                    ));
                    continue;
                }
            };
            let writer = writers
                .get_mut(namespace.as_str())
                .ok_or_else(|| Error::Invalid(format!("no dedup session for {namespace:?}")))?;
            let added = match stored {
                Stored::Delta => match self.push_delta(writer, score, *raw_len, data)? {
                    Some(added) => added,
                    None => continue,
                },
                _ => writer.add_stored(*score, *kind, *raw_len, *stored, data)?,
            };
            if added {
                round.pushed += 1;
                round.pushed_bytes += data.len() as u64;
            } else {
                round.already += 1;
            }
        }
        round.next = batch.next;
        round.chunks += batch.chunks;
        round.read_bytes += batch.bytes;
        Ok(())
    }

    /// Pushes a delta chunk (`data`: base, `from`, frame); None when it is lost (its base
    /// cannot be read, or it does not rebuild its score): this chunk only, the round goes on.
    fn push_delta(
        &self,
        writer: &mut RepoWriter,
        score: &Score,
        raw_len: u32,
        data: &[u8],
    ) -> Result<Option<bool>> {
        let pushed = match protocol::split_delta(data) {
            Some((base, frame)) => writer.add_stored_delta(*score, raw_len, base, frame),
            None => Err(RepoError::Corrupt {
                score: hex(score),
                why: "a delta record without a frame".to_string(),
            }),
        };
        match pushed {
            Ok(added) => Ok(Some(added)),
            Err(e @ (RepoError::Missing(_) | RepoError::Corrupt { .. })) => {
                lock(&self.dedup.counters).lost_chunks += 1;
                self.fail(format!(
                    "delta chunk {} cannot be pushed: {e}; it is lost unless sent again",
                    hex(score)
                ));
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Closes the repositories unused for `dedup_repo_idle` of namespaces with nothing
    /// waiting here (no hold, no pending manifest) and no request using them now.
    fn retire_repos(&self) {
        let idle = self.opts.dedup_repo_idle;
        let mut busy: HashSet<String> = lock(&self.dedup.holds).keys().cloned().collect();
        busy.extend(
            self.dedup
                .manifests
                .pending()
                .iter()
                .map(|m| m.namespace.clone()),
        );
        lock(&self.dedup.repos).retain(|ns, slot| {
            busy.contains(ns)
                || slot.used.elapsed() < idle
                || slot.repo.as_ref().is_some_and(|r| Arc::strong_count(r) > 1)
        });
    }

    /// Loads other writers' new index objects into every open repository.
    fn refresh_repos(&self) {
        let repos: Vec<(String, Arc<Repo>)> = lock(&self.dedup.repos)
            .iter()
            .filter_map(|(ns, slot)| slot.repo.clone().map(|r| (ns.clone(), r)))
            .collect();
        for (ns, repo) in repos {
            if let Err(e) = repo.refresh_index() {
                self.log(|| format!("cannot refresh the dedup index of {ns:?}: {e}"));
            }
        }
    }

    /// Writes every pending manifest whose blobs are all in its repository's index; true if
    /// one was written. A manifest whose write failed is tried again after a backoff (0.5 s
    /// doubling to 30 s, in `retry`).
    fn complete_dedup_manifests(&self, retry: &mut HashMap<u64, (u32, Instant)>) -> bool {
        let mut wrote = false;
        let pending = self.dedup.manifests.pending();
        retry.retain(|id, _| pending.iter().any(|m| m.id == *id));
        for m in pending {
            if retry.get(&m.id).is_some_and(|(_, at)| *at > Instant::now()) {
                continue;
            }
            let Some(repo) = self.repo_if_any(&m.namespace) else {
                continue;
            };
            match self.write_if_complete(&repo, &m) {
                Ok(true) => {
                    retry.remove(&m.id);
                    lock(&self.dedup.counters).manifests_written += 1;
                    self.log(|| {
                        format!(
                            "dedup manifest of {} written",
                            crate::namespaced(&m.namespace, &m.checkpoint)
                        )
                    });
                    wrote = true;
                }
                Ok(false) => {}
                Err(e) => {
                    let entry = retry.entry(m.id).or_insert((0, Instant::now()));
                    entry.0 += 1;
                    let delay = Duration::from_millis(500)
                        .saturating_mul(1 << entry.0.min(6))
                        .min(Duration::from_secs(30));
                    entry.1 = Instant::now() + delay;
                    self.fail(format!(
                        "cannot write the dedup manifest of {} (attempt {}): {e}; retrying in {:.1} s",
                        crate::namespaced(&m.namespace, &m.checkpoint),
                        entry.0,
                        delay.as_secs_f64()
                    ));
                }
            }
        }
        wrote
    }

    fn write_if_complete(&self, repo: &Repo, m: &PendingManifest) -> Result<bool> {
        let mut checked = m.checked();
        while checked < m.score_count {
            let scores = self.dedup.manifests.read_scores(m, checked, CHECK_BATCH)?;
            if scores.is_empty() {
                break;
            }
            let missing: HashSet<Score> = repo.missing(&scores).into_iter().collect();
            let present = scores.iter().take_while(|s| !missing.contains(*s)).count();
            checked += present as u64;
            m.checked.store(checked, Ordering::Relaxed);
            if present < scores.len() {
                return Ok(false);
            }
        }
        let roots: Vec<Score> = m.files.iter().map(|f| f.root).collect();
        if !repo.missing(&roots).is_empty() {
            return Ok(false);
        }
        repo.write_prepared_manifest(manifest_of(m, cascade_durable::now_unix_ns()))?;
        self.dedup.manifests.done(m.id)?;
        Ok(true)
    }
}

/// Closes least recently used repositories no request is using until at most `keep` remain
/// (a namespace's chunks still waiting reopen it when pushed).
fn evict_lru(repos: &mut HashMap<String, RepoSlot>, keep: usize) {
    while repos.len() > keep {
        let victim = repos
            .iter()
            .filter(|(_, s)| s.repo.as_ref().is_none_or(|r| Arc::strong_count(r) == 1))
            .min_by_key(|(_, s)| s.used)
            .map(|(ns, _)| ns.clone());
        match victim {
            Some(ns) => {
                repos.remove(&ns);
            }
            // All in use right now: over the bound until they are returned.
            None => break,
        }
    }
}
