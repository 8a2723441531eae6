//! The content-addressed repository in the durable store: chunks stored once, compressed,
//! in packs; files as Merkle trees of recipe blocks; checkpoints as manifests naming their
//! files' roots. Layout and formats: docs/dedup.md, "Repository layout".
//!
//! Objects under `<prefix>/` (`.cascade-dedup` below the durable store's root):
//! `config.json`, `packs/<hh>/<pack id>`, `index/<index id>`, `manifests/<checkpoint>.json`;
//! for garbage collection `gc/` and `sessions/` (gc.rs, session.rs).
//! Ids are the BLAKE3 of the object's bytes. Writes go in a crash-safe order — packs, then
//! the index object naming them, then manifests — so a manifest never names a blob that is
//! not reachable through an index, and a crash leaves at worst unreferenced packs.

mod delta;
pub mod format;
pub mod gc;
mod job;
mod session;
mod upload;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use cascade_durable::DurableStore;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::ingest::{Chunk, Ingest, Packed};
use crate::score::{from_hex, to_hex};
use crate::{score, Chunking, Compression, Score};
pub use delta::{pack_chunk, undo_delta, BaseBytes, BaseFile, MAX_DELTA_DEPTH};
use format::{BlobEntry, BlobKind, Block, DeltaBase, Stored};
use gc::IndexPacks;
pub use gc::{GcOptions, GcReport, PackGroup, PruneReport, PruneSelection};
pub use job::{checkpoint_of, part_name, part_of};
use session::{BlobAt, FilePacks, Session};
pub use session::{Hold, DEFAULT_SESSION_LEASE};
pub use upload::ObjectSink;

/// Where the repository lives below the durable store's root.
pub const DEFAULT_PREFIX: &str = ".cascade-dedup";
/// The shortest session lease a repository may record: writers renew every eighth of it,
/// and one PUT must take less than a quarter.
pub const MIN_SESSION_LEASE_S: u64 = 4;

/// Format tag of `config.json` and of manifests.
pub const REPO_FORMAT: &str = "cascade-dedup/1";
pub const MANIFEST_FORMAT: &str = "cascade-dedup-manifest/1";
/// A pack is written once it holds this many bytes of blobs (small enough that the first
/// upload overlaps the chunking of a checkpoint of a few tens of MB).
pub const DEFAULT_PACK_SIZE: usize = 4 << 20;
/// A writer's first packs that are smaller than the pack size (halving back from it).
const RAMP_PACKS: usize = 3;
/// How a chunk rebuilt from a delta blob whose base became unusable is stored
/// ([`RepoWriter::add_stored_delta`]): the agent's level is not known there.
const REBUILT_COMPRESSION: Compression = Compression::Zstd { level: 1 };

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Durable(#[from] cascade_durable::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{object}: {why}")]
    Format { object: String, why: String },
    #[error("blob {score} is corrupt: {why}")]
    Corrupt { score: String, why: String },
    #[error("blob {0} is in no index of the repository")]
    Missing(String),
    #[error("{0}")]
    Invalid(String),
    /// A writer raced with garbage collection (docs/dedup.md): store the files again.
    #[error("{0}")]
    Conflict(String),
}

impl Error {
    /// The errno a caller reports (EIO for anything about the repository's contents).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Durable(e) => e.errno(),
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Invalid(_) => libc::EINVAL,
            Error::Conflict(_) => libc::EAGAIN,
            _ => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Where a blob is.
#[derive(Debug, Clone, Copy)]
struct Loc {
    pack: u32,
    offset: u32,
    stored_len: u32,
    raw_len: u32,
    stored: Stored,
}

/// Every blob the repository's index objects name. About 64 bytes of memory per blob
/// (32-byte key, 20-byte location, hash-table overhead), plus 32 bytes per pack.
#[derive(Default)]
struct Index {
    packs: Vec<Score>,
    /// The origin id of the index object naming each pack (`index/<origin>[-<id>]`).
    origins: Vec<Score>,
    blobs: HashMap<Score, Loc>,
    /// The base of every delta blob of `blobs` (about 100 bytes each).
    deltas: HashMap<Score, DeltaBase>,
    /// Packs garbage collection condemned: writers never dedup against them.
    condemned: HashSet<Score>,
    /// Ids of the index objects already loaded (or written by this process), so that
    /// [`Repo::refresh_index`] reads only new ones.
    loaded: HashSet<String>,
    /// The other copies of blobs stored more than once (rare: a writer stores a blob again
    /// when the copy it found cannot be rebuilt, e.g. a delta whose base was deleted with a
    /// pruned checkpoint after the writer of the delta died before its manifest). Kept so
    /// that the copy in use is one that can be rebuilt ([`Index::settle_copies`]),
    /// whatever order the index objects were loaded in.
    copies: HashMap<Score, Vec<BlobCopy>>,
}

/// One copy of a blob: where it is, and its base if it is a delta.
type BlobCopy = (Loc, Option<DeltaBase>);

impl Index {
    fn add_pack(&mut self, id: Score, origin: Score, entries: &[BlobEntry]) {
        let pack = self.packs.len() as u32;
        self.packs.push(id);
        self.origins.push(origin);
        for e in entries {
            let loc = Loc {
                pack,
                offset: e.offset,
                stored_len: e.stored_len,
                raw_len: e.raw_len,
                stored: e.stored,
            };
            // A copy outside the condemned packs (stored again by a writer) wins.
            let copy = (loc, e.base);
            match self.blobs.get(&e.score).copied() {
                Some(old) if !self.condemned.contains(&self.packs[old.pack as usize]) => {
                    self.copies.entry(e.score).or_default().push(copy);
                }
                Some(old) => {
                    let old = (old, self.deltas.get(&e.score).copied());
                    self.copies.entry(e.score).or_default().push(old);
                    self.use_copy(e.score, copy);
                }
                None => self.use_copy(e.score, copy),
            }
        }
    }

    fn use_copy(&mut self, s: Score, (loc, base): BlobCopy) {
        self.blobs.insert(s, loc);
        match base {
            Some(base) => self.deltas.insert(s, base),
            None => self.deltas.remove(&s),
        };
    }

    /// Makes each blob stored more than once use a copy that can be rebuilt: its chain of
    /// bases complete and outside the condemned packs, else complete at least. Call it once
    /// a batch of index objects is added. A pass per level of delta chains, since a copy's
    /// base may itself be a blob whose copy changes.
    fn settle_copies(&mut self) {
        if self.copies.is_empty() {
            return;
        }
        for _ in 0..=MAX_DELTA_DEPTH {
            let mut changed = false;
            let scores: Vec<Score> = self.copies.keys().copied().collect();
            for s in scores {
                for condemned_too in [false, true] {
                    if self.chain(&s, condemned_too).is_some() {
                        break;
                    }
                    changed |= self.switch_copy(s, condemned_too);
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// Drops the copies in packs `gone` (positions in `packs`); a blob whose copy in use
    /// was there switches to another copy, or goes.
    fn forget_packs(&mut self, gone: &HashSet<u32>) {
        for copies in self.copies.values_mut() {
            copies.retain(|(loc, _)| !gone.contains(&loc.pack));
        }
        let lost: Vec<Score> = self
            .blobs
            .iter()
            .filter(|(_, loc)| gone.contains(&loc.pack))
            .map(|(s, _)| *s)
            .collect();
        for s in lost {
            match self.copies.get_mut(&s).and_then(Vec::pop) {
                Some(copy) => self.use_copy(s, copy),
                None => {
                    self.blobs.remove(&s);
                    self.deltas.remove(&s);
                }
            }
        }
        self.copies.retain(|_, c| !c.is_empty());
        self.settle_copies();
    }

    /// Switches blob `s` to another copy whose chain resolves (see [`Index::chain`]), if
    /// one does.
    fn switch_copy(&mut self, s: Score, condemned_too: bool) -> bool {
        let (Some(mut others), Some(&loc)) = (self.copies.remove(&s), self.blobs.get(&s)) else {
            return false;
        };
        let current = (loc, self.deltas.get(&s).copied());
        for i in 0..others.len() {
            self.use_copy(s, others[i]);
            if self.chain(&s, condemned_too).is_some() {
                others[i] = current;
                self.copies.insert(s, others);
                return true;
            }
        }
        self.use_copy(s, current);
        self.copies.insert(s, others);
        false
    }

    /// The packs of blob `s` and of the blobs it depends on (a delta blob's base, its base,
    /// ...). `None` when one is missing, the chain is longer than [`MAX_DELTA_DEPTH`] or,
    /// unless `condemned_too`, one is in a condemned pack (writers neither dedup against
    /// such a blob nor use it as a base).
    fn chain(&self, s: &Score, condemned_too: bool) -> Option<PackChain> {
        let mut chain = PackChain {
            packs: [0; MAX_DELTA_DEPTH + 1],
            len: 0,
        };
        let mut at = *s;
        for slot in &mut chain.packs {
            let pack = self.blobs.get(&at)?.pack;
            if !condemned_too && self.condemned.contains(&self.packs[pack as usize]) {
                return None;
            }
            *slot = pack;
            chain.len += 1;
            match self.deltas.get(&at) {
                Some(base) => at = base.score,
                None => return Some(chain),
            }
        }
        None
    }

    /// Whether a delta blob may be built on blob `s` (see [`Repo::usable_as_base`]).
    fn usable_as_base(&self, s: &Score) -> bool {
        self.chain(s, false)
            .is_some_and(|chain| chain.depth() < MAX_DELTA_DEPTH)
    }

    /// Where the pack numbered `n` is, for a writer's pack set.
    fn blob_at(&self, n: u32) -> BlobAt {
        BlobAt::Indexed {
            pack: self.packs[n as usize],
            origin: self.origins[n as usize],
        }
    }
}

/// The pack numbers of a blob and of its bases, the blob's own first: on the stack, since
/// writers look one up for every chunk.
#[derive(Debug, Clone, Copy)]
struct PackChain {
    packs: [u32; MAX_DELTA_DEPTH + 1],
    len: usize,
}

impl PackChain {
    fn packs(&self) -> &[u32] {
        &self.packs[..self.len]
    }

    /// 0 for a blob stored whole, else 1 + its base's.
    fn depth(&self) -> usize {
        self.len - 1
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepoConfigFile {
    pub format: String,
    pub created_unix_ns: u64,
    /// The lease of the repository's writer sessions in seconds, chosen when it was created
    /// (absent: [`DEFAULT_SESSION_LEASE`]). Every writer, collector and staging server of
    /// the repository uses this one, so they cannot disagree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_lease_s: Option<u64>,
}

/// A checkpoint as the repository records it: written last, after every blob it names.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: String,
    pub checkpoint: String,
    pub created_unix_ns: u64,
    pub chunking: String,
    pub compression: String,
    pub files: Vec<FileRecipe>,
    /// The packs the checkpoint's blobs (chunks and recipe blocks) are in, by index object:
    /// what garbage collection keeps for it. Absent in manifests written before it existed
    /// (the collector walks their trees instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packs: Option<Vec<PackGroup>>,
    /// The checkpoint is one file (its one recipe is named after it), not a directory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_file: bool,
}

impl Manifest {
    /// The roots of its files' trees.
    pub(crate) fn roots(&self) -> Result<Vec<Score>> {
        self.files.iter().map(|f| parse_score(&f.root)).collect()
    }
}

/// One file of a manifest: its size, whole-file BLAKE3 and the root of its Merkle tree.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRecipe {
    pub path: String,
    pub size: u64,
    pub blake3: String,
    pub root: String,
}

/// The previous version of a file being added ([`RepoWriter::add_file_with_base`]): its
/// recipe in this repository and its bytes (e.g. the previous checkpoint still in memory).
#[derive(Clone, Copy)]
pub struct FileBase<'a> {
    pub recipe: &'a FileRecipe,
    pub bytes: &'a dyn BaseBytes,
}

/// What adding files cost and saved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WriteStats {
    pub files: u64,
    /// Bytes of file data added, and the chunks they were cut into.
    pub bytes: u64,
    pub chunks: u64,
    /// Chunks (and their bytes) the repository did not have.
    pub new_chunks: u64,
    pub new_bytes: u64,
    /// Bytes written into packs for them (compressed where it paid), and for recipe blocks.
    pub stored_data_bytes: u64,
    pub stored_tree_bytes: u64,
    pub packs: u64,
    /// New chunks stored as deltas against the previous version's (docs/dedup.md).
    pub delta_chunks: u64,
    /// Nanoseconds from the first file added to `finish`, less those the writer waited for
    /// pack uploads (its own work: cutting, scoring, compressing), and nanoseconds at least
    /// one pack upload was in flight, with the pack bytes the durable store acknowledged
    /// (the adaptive level's inputs, crate::adaptive).
    pub ingest_nanos: u64,
    pub upload_nanos: u64,
    pub uploaded_bytes: u64,
}

impl WriteStats {
    /// The figures the adaptive level decides on.
    pub fn measured(&self) -> crate::adaptive::Measured {
        crate::adaptive::Measured {
            input_bytes: self.bytes,
            ingest_seconds: self.ingest_nanos as f64 / 1e9,
            uploaded_bytes: self.uploaded_bytes,
            upload_seconds: self.upload_nanos as f64 / 1e9,
            new_bytes: self.new_bytes,
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The repository: opened once, shared by writers and readers.
pub struct Repo {
    durable: Arc<DurableStore>,
    prefix: String,
    chunking: Chunking,
    compression: Compression,
    pack_size: usize,
    index: RwLock<Index>,
    /// False until the index objects are read ([`Repo::open_for_maintenance`] defers it).
    index_ready: AtomicBool,
    session_lease: Duration,
    /// Sessions of finished writers whose files no manifest names yet.
    parked: Mutex<Vec<session::Parked>>,
    /// Ingest pipelines (their window buffers) of finished writers, for the next ones.
    idle_ingests: Mutex<Vec<Ingest>>,
    /// Buffers of written packs, for the next pack of any writer: a writer per checkpoint
    /// would otherwise fault in fresh pack buffers for every checkpoint.
    spare_packs: upload::SparePacks,
    /// Threads deleting the session objects of writers whose files manifests now name.
    ending_sessions: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Index objects this process's writers staged elsewhere ([`RepoWriter::with_sink`]) and
    /// not yet seen in the durable store, by name: a refresh must not take them for deleted,
    /// and a reload keeps their packs.
    staged_indexes: Mutex<HashMap<String, IndexPacks>>,
}

impl Drop for Repo {
    fn drop(&mut self) {
        self.end_parked();
    }
}

impl Repo {
    /// Opens the repository below `prefix` in `durable`, creating it when absent, and loads
    /// every index object. New files are cut with `chunking` and stored with `compression`.
    pub fn open(
        durable: Arc<DurableStore>,
        prefix: &str,
        chunking: Chunking,
        compression: Compression,
    ) -> Result<Repo> {
        Self::open_with_lease(
            durable,
            prefix,
            chunking,
            compression,
            DEFAULT_SESSION_LEASE,
        )
    }

    /// Like [`Repo::open`]; a repository created here records `lease` as its writer
    /// sessions' lease ([`RepoConfigFile::session_lease_s`], whole seconds, at least one).
    /// An existing repository keeps the lease it recorded.
    pub fn open_with_lease(
        durable: Arc<DurableStore>,
        prefix: &str,
        chunking: Chunking,
        compression: Compression,
        lease: Duration,
    ) -> Result<Repo> {
        let repo = Self::open_or_create(durable, prefix, chunking, compression, Some(lease))?
            .ok_or_else(|| Error::Invalid("the repository was not created".to_string()))?;
        repo.load_index()?;
        Ok(repo)
    }

    /// Opens the repository below `prefix` if there is one (for reading: never creates it).
    pub fn open_existing(durable: Arc<DurableStore>, prefix: &str) -> Result<Option<Repo>> {
        let repo = Self::open_for_maintenance(durable, prefix)?;
        if let Some(repo) = &repo {
            repo.load_index()?;
        }
        Ok(repo)
    }

    /// Opens the repository below `prefix` if there is one, without reading its index
    /// objects: forgetting checkpoints and collecting garbage need none (reading or writing
    /// blobs loads them at first use).
    pub fn open_for_maintenance(durable: Arc<DurableStore>, prefix: &str) -> Result<Option<Repo>> {
        Self::open_or_create(
            durable,
            prefix,
            Chunking::DEFAULT_CDC,
            Compression::None,
            None,
        )
    }

    /// Opens the repository, or with `create` (the lease to record) creates it.
    fn open_or_create(
        durable: Arc<DurableStore>,
        prefix: &str,
        chunking: Chunking,
        compression: Compression,
        create: Option<Duration>,
    ) -> Result<Option<Repo>> {
        chunking
            .validate()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let prefix = prefix.trim_matches('/').to_string();
        let config_key = format!("{prefix}/config.json");
        let lease_s = match durable.get_bytes(&config_key) {
            Ok(bytes) => {
                let cfg: RepoConfigFile =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Format {
                        object: config_key.clone(),
                        why: e.to_string(),
                    })?;
                if cfg.format != REPO_FORMAT {
                    return Err(Error::Format {
                        object: config_key,
                        why: format!("format {:?}, this build reads {REPO_FORMAT}", cfg.format),
                    });
                }
                if let Some(s) = cfg.session_lease_s.filter(|&s| s < MIN_SESSION_LEASE_S) {
                    return Err(Error::Format {
                        object: config_key,
                        why: format!(
                            "session_lease_s {s}: a lease under {MIN_SESSION_LEASE_S} s would let \
                             a prune take live writers for dead"
                        ),
                    });
                }
                cfg.session_lease_s
            }
            Err(e) if e.is_not_found() => {
                let Some(lease) = create else {
                    return Ok(None);
                };
                let lease_s = (lease != DEFAULT_SESSION_LEASE)
                    .then(|| lease.as_secs().max(MIN_SESSION_LEASE_S));
                let cfg = RepoConfigFile {
                    format: REPO_FORMAT.to_string(),
                    created_unix_ns: cascade_durable::now_unix_ns(),
                    session_lease_s: lease_s,
                };
                let text =
                    serde_json::to_vec_pretty(&cfg).map_err(|e| Error::Invalid(e.to_string()))?;
                durable.put_bytes(&config_key, &text)?;
                lease_s
            }
            Err(e) => return Err(e.into()),
        };
        let repo = Repo {
            durable,
            prefix,
            chunking,
            compression,
            pack_size: DEFAULT_PACK_SIZE,
            index: RwLock::new(Index::default()),
            index_ready: AtomicBool::new(false),
            session_lease: lease_s.map_or(DEFAULT_SESSION_LEASE, Duration::from_secs),
            parked: Mutex::new(Vec::new()),
            idle_ingests: Mutex::new(Vec::new()),
            spare_packs: upload::SparePacks::default(),
            ending_sessions: Mutex::new(Vec::new()),
            staged_indexes: Mutex::new(HashMap::new()),
        };
        Ok(Some(repo))
    }

    /// The lease of this repository's writer sessions (tests: short ones), instead of the one
    /// it recorded. A collector must use at least the same lease
    /// ([`GcOptions::session_lease`]).
    pub fn with_session_lease(mut self, lease: Duration) -> Repo {
        self.session_lease = lease;
        self
    }

    /// The lease of this repository's writer sessions: the one it recorded when it was
    /// created ([`RepoConfigFile::session_lease_s`]).
    pub fn session_lease(&self) -> Duration {
        self.session_lease
    }

    /// How long after a push of a prepared manifest the process writing it may do so
    /// without [`Repo::check_staged_manifest`]: a quarter of the session lease. The pushing
    /// writer renews its session just before the push (so it is at most an eighth of the
    /// lease old), and the collector takes it for dead only a whole lease after its renewal
    /// by a clock up to a quarter lease off: not before 5/8 of a lease after the push. A
    /// quarter leaves 3/8 for the push's way and the write itself.
    pub fn staged_manifest_trusted(&self) -> Duration {
        self.session_lease / 4
    }

    /// A smaller pack size (tests: many packs from little data).
    pub fn with_pack_size(mut self, bytes: usize) -> Repo {
        self.pack_size = bytes.max(1);
        self
    }

    /// The durable store the repository lives in.
    pub fn durable(&self) -> &Arc<DurableStore> {
        &self.durable
    }

    pub fn chunking(&self) -> Chunking {
        self.chunking
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    fn pack_key(&self, id: &Score) -> String {
        pack_key(&self.prefix, id)
    }

    /// Reads every index object (checking that its bytes hash to its name).
    fn load_index(&self) -> Result<()> {
        let objects = self.durable.list(&self.key("index"))?;
        let named: Vec<(String, String)> = objects
            .into_iter()
            .map(|o| {
                let name = o.path.rsplit('/').next().unwrap_or("").to_string();
                (o.path, name)
            })
            .collect();
        let decoded = self.read_index_objects(&named)?;
        // Known condemned packs lose to other copies of their blobs (Index::add_pack).
        let condemned = self.index.read().map_err(|_| poisoned())?.condemned.clone();
        let mut index = Index {
            condemned,
            ..Index::default()
        };
        for (origin, packs) in decoded {
            for (id, entries) in packs {
                index.add_pack(id, origin, &entries);
            }
        }
        index.loaded.extend(named.into_iter().map(|(_, name)| name));
        for (name, packs) in self.staged_indexes.lock().map_err(|_| poisoned())?.iter() {
            if let (true, Ok(origin)) = (index.loaded.insert(name.clone()), parse_score(name)) {
                for (id, entries) in packs {
                    index.add_pack(*id, origin, entries);
                }
            }
        }
        index.settle_copies();
        let mut current = self.index.write().map_err(|_| poisoned())?;
        index.condemned = std::mem::take(&mut current.condemned);
        *current = index;
        self.index_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Reads the index objects `named` ((path, base name)): the packs of each origin. Versions
    /// of one origin left by an interrupted rewrite give the packs every version names.
    fn read_index_objects(&self, named: &[(String, String)]) -> Result<Vec<(Score, IndexPacks)>> {
        let mut by_origin: HashMap<Score, Vec<IndexPacks>> = HashMap::new();
        for (path, name) in named {
            let (origin, packs) = self.read_index_object(path, name)?;
            by_origin.entry(origin).or_default().push(packs);
        }
        Ok(by_origin
            .into_iter()
            .map(|(origin, versions)| (origin, gc::common_packs(versions)))
            .collect())
    }

    /// Reads the index objects unless that was done.
    pub(crate) fn ensure_index(&self) -> Result<()> {
        if !self.index_ready.load(Ordering::Acquire) {
            self.load_index()?;
        }
        Ok(())
    }

    /// Loads the index objects that appeared since the repository was opened or last
    /// refreshed (other writers' sessions, e.g. another staging server's pushes); objects
    /// already loaded are not read again. Returns how many were loaded.
    /// Index objects that garbage collection rewrote or deleted since (a loaded one is gone,
    /// or a new version of a loaded one appeared) make it read every index object again, so
    /// blobs of deleted packs are forgotten.
    pub fn refresh_index(&self) -> Result<usize> {
        if !self.index_ready.load(Ordering::Acquire) {
            self.load_index()?;
            return Ok(self.index.read().map_err(|_| poisoned())?.loaded.len());
        }
        let objects = self.durable.list(&self.key("index"))?;
        let listed: HashSet<String> = objects
            .iter()
            .map(|o| o.path.rsplit('/').next().unwrap_or("").to_string())
            .collect();
        let staged: HashSet<String> = {
            let mut staged = self.staged_indexes.lock().map_err(|_| poisoned())?;
            staged.retain(|name, _| !listed.contains(name));
            staged.keys().cloned().collect()
        };
        let (fresh, rewritten): (Vec<(String, String)>, bool) = {
            let index = self.index.read().map_err(|_| poisoned())?;
            let origins: HashSet<Score> = index
                .loaded
                .iter()
                .filter_map(|n| gc::parse_index_name(n).map(|(origin, _)| origin))
                .collect();
            let fresh: Vec<(String, String)> = objects
                .into_iter()
                .filter_map(|o| {
                    let name = o.path.rsplit('/').next().unwrap_or("").to_string();
                    (!index.loaded.contains(&name)).then_some((o.path, name))
                })
                .collect();
            let rewritten = index
                .loaded
                .iter()
                .any(|n| !listed.contains(n) && !staged.contains(n))
                || fresh.iter().any(|(_, n)| {
                    gc::parse_index_name(n).is_some_and(|(origin, _)| origins.contains(&origin))
                });
            (fresh, rewritten)
        };
        if rewritten {
            self.load_index()?;
            return Ok(fresh.len());
        }
        let decoded = self.read_index_objects(&fresh)?;
        let mut index = self.index.write().map_err(|_| poisoned())?;
        // Another refresh may have loaded them meanwhile.
        if fresh.iter().any(|(_, n)| index.loaded.contains(n)) {
            return Ok(0);
        }
        for (origin, packs) in decoded {
            for (id, entries) in packs {
                index.add_pack(id, origin, &entries);
            }
        }
        index.settle_copies();
        let loaded = fresh.len();
        index.loaded.extend(fresh.into_iter().map(|(_, name)| name));
        Ok(loaded)
    }

    /// Whether a writer would store blob `s`: the index does not have it outside the packs
    /// garbage collection condemned (a writer also checks its own blobs).
    fn lacks(&self, s: &Score) -> bool {
        let Ok(index) = self.index.read() else {
            return true;
        };
        index.chain(s, false).is_none()
    }

    /// Whether a delta blob may have blob `s` as its base: `s` is in the index outside
    /// condemned packs, and less than [`MAX_DELTA_DEPTH`] deep.
    pub fn usable_as_base(&self, s: &Score) -> bool {
        self.index.read().is_ok_and(|index| index.usable_as_base(s))
    }

    /// The previous version of a file as a source of delta bases: its chunks, read from its
    /// recipe, and its bytes. None when the recipe cannot be read (its checkpoint was pruned
    /// meanwhile, say): a base only ever saves bytes.
    pub fn base_file<'b>(&self, base: FileBase<'b>) -> Option<BaseFile<'b>> {
        let root = parse_score(&base.recipe.root).ok()?;
        let leaves = self.file_chunks(&root).ok()?;
        let index = self.index.read().ok()?;
        Some(BaseFile::new(base.bytes, &leaves, |s| {
            index.usable_as_base(s)
        }))
    }

    /// The chunks of the file whose tree is `root` ((score, length) in file order), from its
    /// recipe blocks.
    pub fn file_chunks(&self, root: &Score) -> Result<Vec<(Score, u64)>> {
        let mut leaves = Vec::new();
        let mut stack = vec![*root];
        while let Some(node) = stack.pop() {
            let block = Block::decode(&self.read_blob(&node)?).map_err(|e| Error::Corrupt {
                score: to_hex(&node),
                why: e.0,
            })?;
            if block.level == 0 {
                leaves.extend_from_slice(&block.children);
            } else {
                stack.extend(block.children.iter().rev().map(|(child, _)| *child));
            }
        }
        Ok(leaves)
    }

    /// An ingest pipeline of a finished writer, or a new one.
    fn idle_ingest(&self) -> Ingest {
        let idle = self.idle_ingests.lock().ok().and_then(|mut i| i.pop());
        idle.unwrap_or_else(|| Ingest::new(self.chunking))
    }

    /// Blobs the index knows (data chunks and recipe blocks).
    pub fn blob_count(&self) -> usize {
        self.index.read().map(|i| i.blobs.len()).unwrap_or(0)
    }

    /// Which of `scores` the repository lacks (the question an agent asks before sending).
    pub fn missing(&self, scores: &[Score]) -> Vec<Score> {
        match self.index.read() {
            Ok(i) => scores
                .iter()
                .filter(|s| !i.blobs.contains_key(*s))
                .copied()
                .collect(),
            Err(_) => scores.to_vec(),
        }
    }

    /// Records a manifest another process described (a staging server writing an agent's
    /// checkpoint: its `chunking` and `compression` are kept as the agent gave them). The
    /// same check as [`Repo::write_manifest`]: every root must be in the index.
    pub fn write_prepared_manifest(&self, mut manifest: Manifest) -> Result<Manifest> {
        manifest.format = MANIFEST_FORMAT.to_string();
        manifest.checkpoint = cascade_durable::normalize_rel(&manifest.checkpoint)?;
        self.record_manifest(&mut manifest)?;
        Ok(manifest)
    }

    /// A writer: add files, then [`RepoWriter::finish`], then [`Repo::write_manifest`].
    pub fn writer(&self) -> RepoWriter<'_> {
        RepoWriter {
            repo: self,
            pack: Vec::new(),
            pack_pad: 0,
            entries: Vec::new(),
            written: HashMap::new(),
            own_bases: HashMap::new(),
            packs: Vec::new(),
            pack_size: self.pack_size,
            stats: WriteStats::default(),
            registration: None,
            file_packs: FilePacks::default(),
            files: Vec::new(),
            uploads: upload::PackUploader::new(
                Arc::clone(&self.durable) as Arc<dyn ObjectSink>,
                self.prefix.clone(),
                Arc::clone(&self.spare_packs),
            ),
            ingest: None,
            compression: self.compression,
            started: None,
            staged: false,
        }
    }

    /// The key of checkpoint `checkpoint`'s manifest below the durable store's root.
    pub fn manifest_key(&self, checkpoint: &str) -> Result<String> {
        let rel = cascade_durable::normalize_rel(checkpoint)?;
        Ok(self.key(&format!("manifests/{rel}.json")))
    }

    /// Records a checkpoint: call only after the writer that added its files finished.
    pub fn write_manifest(&self, checkpoint: &str, files: Vec<FileRecipe>) -> Result<Manifest> {
        self.put_manifest(checkpoint, files, false)
    }

    /// Records a checkpoint that is a single file (`recipe`), like [`Repo::write_manifest`].
    pub fn write_single_file_manifest(
        &self,
        checkpoint: &str,
        recipe: FileRecipe,
    ) -> Result<Manifest> {
        self.put_manifest(checkpoint, vec![recipe], true)
    }

    fn put_manifest(
        &self,
        checkpoint: &str,
        files: Vec<FileRecipe>,
        single_file: bool,
    ) -> Result<Manifest> {
        let mut manifest = self.new_manifest(checkpoint, files, single_file)?;
        self.record_manifest(&mut manifest)?;
        Ok(manifest)
    }

    fn new_manifest(
        &self,
        checkpoint: &str,
        files: Vec<FileRecipe>,
        single_file: bool,
    ) -> Result<Manifest> {
        Ok(Manifest {
            single_file,
            format: MANIFEST_FORMAT.to_string(),
            checkpoint: cascade_durable::normalize_rel(checkpoint)?,
            created_unix_ns: cascade_durable::now_unix_ns(),
            chunking: self.chunking.to_string(),
            compression: self.compression.to_string(),
            files,
            packs: None,
        })
    }

    /// The manifest [`Repo::write_manifest`] would write, not written: its key and bytes, for
    /// the writer to stage on a server together with its packs and index object (the server
    /// writes it once they are in the durable store). Every file must come from a finished
    /// writer of this process (`with_sink`); its session stays open until
    /// [`Repo::manifest_written`], so garbage collection keeps the packs it names meanwhile.
    pub fn prepare_manifest(
        &self,
        checkpoint: &str,
        files: Vec<FileRecipe>,
        single_file: bool,
    ) -> Result<(String, Vec<u8>, Manifest)> {
        let mut manifest = self.new_manifest(checkpoint, files, single_file)?;
        let (_, walked) = self.settle_pack_set(&mut manifest, false)?;
        debug_assert!(walked.is_none(), "no walk, no session of its own");
        let key = self.manifest_key(&manifest.checkpoint)?;
        let bytes =
            serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Invalid(e.to_string()))?;
        Ok((key, bytes, manifest))
    }

    /// A manifest from [`Repo::prepare_manifest`] is in the durable store (or will never be):
    /// the sessions that kept its packs end once nothing else waits for them.
    pub fn manifest_written(&self, manifest: &Manifest) -> Result<()> {
        self.release_roots(&manifest.roots()?)
    }

    /// Takes back the manifest of `checkpoint` (absent already is fine): a writer whose
    /// checkpoint changed while it was being stored, or retention. Its packs are recorded
    /// for garbage collection first (`gc/forgotten-<id>.json`), then the manifest goes.
    pub fn forget(&self, checkpoint: &str) -> Result<()> {
        self.forget_with(checkpoint, &mut gc::Changes::new(None))
            .map(|_| ())
    }

    /// True if some manifest's checkpoint lies below the directory `dir` (read-through of a
    /// directory whose checkpoints are only in the repository).
    pub fn has_manifests_below(&self, dir: &str) -> Result<bool> {
        let rel = cascade_durable::normalize_rel(dir)?;
        Ok(!self
            .durable
            .list(&self.key(&format!("manifests/{rel}/")))?
            .is_empty())
    }

    /// One level of the manifests' tree at directory `dir` ("" for the root): the
    /// checkpoints directly in it (their names; part manifests left out) and the
    /// subdirectories with checkpoints below them, each sorted. For listings on a node whose
    /// store lacks them.
    pub fn manifests_in(&self, dir: &str) -> Result<(Vec<String>, Vec<String>)> {
        let at = if dir.trim_matches('/').is_empty() {
            self.key("manifests")
        } else {
            let rel = cascade_durable::normalize_rel(dir)?;
            self.key(&format!("manifests/{rel}"))
        };
        let children = self.durable.list_children(&at)?;
        let checkpoints = children
            .files
            .iter()
            .filter_map(|o| o.path.rsplit('/').next()?.strip_suffix(".json"))
            .filter(|name| !name.starts_with(cascade_durable::PART_PREFIX))
            .map(str::to_string)
            .collect();
        Ok((checkpoints, children.dirs))
    }

    /// The manifest of `checkpoint`, or None.
    pub fn read_manifest(&self, checkpoint: &str) -> Result<Option<Manifest>> {
        let key = self.manifest_key(checkpoint)?;
        let bytes = match self.durable.get_bytes(&key) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::Format {
            object: key.clone(),
            why: e.to_string(),
        })?;
        if m.format != MANIFEST_FORMAT {
            return Err(Error::Format {
                object: key,
                why: format!("format {:?}, this build reads {MANIFEST_FORMAT}", m.format),
            });
        }
        Ok(Some(m))
    }

    /// One blob, decompressed and checked against its score. A blob the loaded index lacks,
    /// or whose pack is gone (garbage collection deleted a copy), makes it refresh the index
    /// once.
    pub fn read_blob(&self, score_wanted: &Score) -> Result<Vec<u8>> {
        self.ensure_index()?;
        match self.read_blob_once(score_wanted) {
            Err(Error::Missing(_)) => {}
            Err(Error::Durable(e)) if e.is_not_found() => {}
            done => return done,
        }
        self.refresh_index()?;
        self.read_blob_once(score_wanted)
    }

    fn read_blob_once(&self, score_wanted: &Score) -> Result<Vec<u8>> {
        let raw = self
            .read_blobs_once(std::slice::from_ref(score_wanted), 0)?
            .pop()
            .unwrap_or_default();
        if score(&raw) != *score_wanted {
            return Err(Error::Corrupt {
                score: to_hex(score_wanted),
                why: "its bytes do not hash to its score".to_string(),
            });
        }
        Ok(raw)
    }

    /// Blobs decompressed, in the order named, each checked against its score; blobs close
    /// together in a pack are read with one ranged read (a staging server rebuilding the
    /// delta chunks of a frame on their bases). A blob the loaded index lacks makes it
    /// refresh the index once.
    pub fn read_blobs(&self, scores: &[Score]) -> Result<Vec<Vec<u8>>> {
        let blobs = self.read_blobs_unchecked(scores)?;
        for (s, raw) in scores.iter().zip(&blobs) {
            if score(raw) != *s {
                return Err(Error::Corrupt {
                    score: to_hex(s),
                    why: "its bytes do not hash to its score".to_string(),
                });
            }
        }
        Ok(blobs)
    }

    /// Writes the file `recipe` describes into `out`, checking every blob's score and the
    /// whole file's BLAKE3 and size; on an error the caller must discard what was written.
    pub fn restore_file(&self, recipe: &FileRecipe, out: &mut dyn Write) -> Result<u64> {
        rebuild_file(recipe, out, &mut |scores| self.read_blobs_unchecked(scores))
    }

    /// Blobs decompressed, in the order named, NOT checked against their scores (the caller
    /// does: [`rebuild_file`]). Blobs next to each other in a pack (at most
    /// [`COALESCE_GAP`] apart) are read with one ranged read, and decompressed in parallel.
    /// A blob the loaded index lacks makes it refresh the index once.
    fn read_blobs_unchecked(&self, scores: &[Score]) -> Result<Vec<Vec<u8>>> {
        self.ensure_index()?;
        match self.read_blobs_once(scores, 0) {
            Err(Error::Missing(_)) => {}
            Err(Error::Durable(e)) if e.is_not_found() => {}
            done => return done,
        }
        self.refresh_index()?;
        self.read_blobs_once(scores, 0)
    }

    /// Blobs as [`Repo::read_blobs_unchecked`] gives them; `depth` is how many delta blobs
    /// asked for these as their bases, one inside the other.
    fn read_blobs_once(&self, scores: &[Score], depth: usize) -> Result<Vec<Vec<u8>>> {
        let mut wanted: Vec<(Score, Loc)> = Vec::with_capacity(scores.len());
        let mut packs: Vec<Score> = Vec::new();
        let mut bases: Vec<(usize, DeltaBase)> = Vec::new();
        {
            let i = self.index.read().map_err(|_| poisoned())?;
            for s in scores {
                let loc = *i.blobs.get(s).ok_or_else(|| Error::Missing(to_hex(s)))?;
                if let Some(base) = i.deltas.get(s) {
                    bases.push((wanted.len(), *base));
                }
                wanted.push((*s, loc));
            }
            packs.extend(wanted.iter().map(|(_, loc)| i.packs[loc.pack as usize]));
        }
        if !bases.is_empty() && depth >= MAX_DELTA_DEPTH {
            return Err(Error::Corrupt {
                score: to_hex(&wanted[bases[0].0].0),
                why: format!("its chain of delta bases is longer than {MAX_DELTA_DEPTH}"),
            });
        }
        // Reading order: by pack, then offset; runs of close blobs become one read.
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by_key(|&k| (wanted[k].1.pack, wanted[k].1.offset));
        let mut stored: Vec<Option<Bytes>> = vec![None; wanted.len()];
        let mut run_start = 0;
        while run_start < order.len() {
            let first = wanted[order[run_start]].1;
            let mut end = u64::from(first.offset) + u64::from(first.stored_len);
            let mut run_end = run_start + 1;
            while let Some(&k) = order.get(run_end) {
                let loc = wanted[k].1;
                if loc.pack != first.pack || u64::from(loc.offset) > end + COALESCE_GAP {
                    break;
                }
                end = end.max(u64::from(loc.offset) + u64::from(loc.stored_len));
                run_end += 1;
            }
            let start = u64::from(first.offset);
            let pack = packs[order[run_start]];
            let bytes = self.durable.get_range(&self.pack_key(&pack), start..end)?;
            for &k in &order[run_start..run_end] {
                let loc = wanted[k].1;
                let from = (u64::from(loc.offset) - start) as usize;
                let to = from + loc.stored_len as usize;
                if to > bytes.len() {
                    return Err(Error::Corrupt {
                        score: to_hex(&wanted[k].0),
                        why: format!("pack {} ends before the blob", to_hex(&pack)),
                    });
                }
                stored[k] = Some(bytes.slice(from..to));
            }
            run_start = run_end;
        }
        let mut raw: Vec<Vec<u8>> = wanted
            .par_iter()
            .zip(stored.par_iter())
            .map(|((s, loc), bytes)| {
                let bytes = bytes.as_deref().unwrap_or_default();
                match loc.stored {
                    Stored::Raw => Ok(bytes.to_vec()),
                    Stored::Zstd | Stored::Delta => {
                        Compression::decompress(bytes, loc.raw_len as usize).map_err(|e| {
                            Error::Corrupt {
                                score: to_hex(s),
                                why: format!("does not decompress: {e}"),
                            }
                        })
                    }
                }
            })
            .collect::<Result<_>>()?;
        if !bases.is_empty() {
            // The bases are not checked here either: a wrong base makes a wrong chunk, which
            // the caller's check of the chunk catches.
            let base_scores: Vec<Score> = bases.iter().map(|(_, b)| b.score).collect();
            let base_bytes = self.read_blobs_once(&base_scores, depth + 1)?;
            for ((k, base), base_raw) in bases.iter().zip(&base_bytes) {
                delta::xor_with_base(&mut raw[*k], base_raw, base.from).map_err(|why| {
                    Error::Corrupt {
                        score: to_hex(&wanted[*k].0),
                        why,
                    }
                })?;
            }
        }
        Ok(raw)
    }
}

/// Blobs of a pack at most this far apart are read with one ranged read (the bytes between
/// them are read and dropped: cheaper than another request).
pub const COALESCE_GAP: u64 = 256 << 10;

/// Bytes of chunks asked of a blob source at once while a file is rebuilt.
const REBUILD_BATCH_BYTES: u64 = 8 << 20;

/// Gives the raw bytes of the blobs named, in order (any source: the repository's packs, the
/// staging servers' chunk stores); [`rebuild_file`] checks them.
pub type BlobSource<'a> = dyn FnMut(&[Score]) -> Result<Vec<Vec<u8>>> + 'a;

/// Writes the file `recipe` describes into `out` from the blobs `fetch` gives, checking every
/// blob against its score (and each chunk's length against its recipe entry) and the whole
/// file's size and BLAKE3 against the recipe; on an error the caller must discard what was
/// written. Chunks are asked for in batches of about 8 MiB.
pub fn rebuild_file(
    recipe: &FileRecipe,
    out: &mut dyn Write,
    fetch: &mut BlobSource,
) -> Result<u64> {
    let root = parse_score(&recipe.root)?;
    let mut hasher = blake3::Hasher::new();
    let mut written = 0u64;
    rebuild_tree(&root, fetch, &mut |data: &[u8]| {
        hasher.update(data);
        written += data.len() as u64;
        out.write_all(data).map_err(Error::from)
    })?;
    let got = hasher.finalize().to_hex().to_string();
    if written != recipe.size || got != recipe.blake3 {
        return Err(Error::Corrupt {
            score: recipe.root.clone(),
            why: format!(
                "{}: rebuilt {written} bytes with BLAKE3 {got}, the manifest says {} bytes \
                 with {}",
                recipe.path, recipe.size, recipe.blake3
            ),
        });
    }
    Ok(written)
}

/// `fetch`'s blobs for `scores`, each checked against its score and, given, its length.
fn fetch_checked(
    fetch: &mut BlobSource,
    scores: &[Score],
    lens: Option<&[u64]>,
) -> Result<Vec<Vec<u8>>> {
    let blobs = fetch(scores)?;
    if blobs.len() != scores.len() {
        return Err(Error::Invalid(format!(
            "asked for {} blobs, got {}",
            scores.len(),
            blobs.len()
        )));
    }
    for (i, (s, raw)) in scores.iter().zip(&blobs).enumerate() {
        let corrupt = |why: String| Error::Corrupt {
            score: to_hex(s),
            why,
        };
        if score(raw) != *s {
            return Err(corrupt("its bytes do not hash to its score".to_string()));
        }
        if let Some(len) = lens.map(|l| l[i]).filter(|len| *len != raw.len() as u64) {
            return Err(corrupt(format!(
                "{} bytes, its recipe says {len}",
                raw.len()
            )));
        }
    }
    Ok(blobs)
}

fn rebuild_tree(
    node: &Score,
    fetch: &mut BlobSource,
    emit: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let raw = fetch_checked(fetch, std::slice::from_ref(node), None)?;
    let block = Block::decode(&raw[0]).map_err(|e| Error::Corrupt {
        score: to_hex(node),
        why: e.0,
    })?;
    if block.level > 0 {
        for (child, _) in &block.children {
            rebuild_tree(child, fetch, emit)?;
        }
        return Ok(());
    }
    let mut rest = block.children.as_slice();
    while !rest.is_empty() {
        let mut take = 0;
        let mut bytes = 0u64;
        while take < rest.len() && (take == 0 || bytes + rest[take].1 <= REBUILD_BATCH_BYTES) {
            bytes += rest[take].1;
            take += 1;
        }
        let (batch, tail) = rest.split_at(take);
        let scores: Vec<Score> = batch.iter().map(|(s, _)| *s).collect();
        let lens: Vec<u64> = batch.iter().map(|(_, l)| *l).collect();
        for data in fetch_checked(fetch, &scores, Some(&lens))? {
            emit(&data)?;
        }
        rest = tail;
    }
    Ok(())
}

/// Where pack `id` is: `<prefix>/packs/<first two hex digits>/<hex>`.
fn pack_key(prefix: &str, id: &Score) -> String {
    let hex = to_hex(id);
    format!("{prefix}/packs/{}/{hex}", &hex[..2])
}

fn poisoned() -> Error {
    Error::Invalid("the repository index lock was poisoned by a panic".to_string())
}

fn parse_score(hex: &str) -> Result<Score> {
    from_hex(hex).map_err(|e| Error::Invalid(e.to_string()))
}

/// Adds files to the repository: chunks are cut, scored and compressed by the ingest pipeline
/// (crate::ingest), stored once, and collected into packs that a thread writes meanwhile;
/// [`RepoWriter::finish`] writes the last pack and the index object.
/// Dropped without `finish`, the packs already written stay unreferenced (garbage).
pub struct RepoWriter<'r> {
    repo: &'r Repo,
    /// The pack being filled: after `pack_pad` bytes that are not part of it, so that the
    /// pack starts at an address a directory store can write with O_DIRECT without copying
    /// it first (upload::PACK_ALIGN).
    pack: Vec<u8>,
    pack_pad: usize,
    entries: Vec<BlobEntry>,
    /// Blobs of this writer's packs (the repository's index learns them only once the index
    /// object naming them is written, so a writer that fails never leaves blobs others would
    /// dedup against but a reopened repository could not find), with the position of the
    /// pack each is in among this writer's packs.
    written: HashMap<Score, u32>,
    /// The bases of this writer's delta blobs.
    own_bases: HashMap<Score, DeltaBase>,
    /// The entries of each pack sent to the uploader (whose ids it returns at `finish`).
    packs: Vec<Vec<BlobEntry>>,
    pack_size: usize,
    stats: WriteStats,
    /// The session registered before the first blob (docs/dedup.md, "Garbage collection").
    registration: Option<Session>,
    /// The packs the blobs of the file being added are in, and of each file added (by root).
    file_packs: FilePacks,
    files: Vec<(Score, FilePacks)>,
    /// Writes full packs beside the chunking.
    uploads: upload::PackUploader,
    /// Taken from the repository at the first file, given back when the writer goes.
    ingest: Option<Ingest>,
    /// How new chunks and recipe blocks are compressed (the repository's, unless
    /// [`RepoWriter::with_compression`]).
    compression: Compression,
    /// When the first file was added.
    started: Option<std::time::Instant>,
    /// Packs and the index object go to a sink other than the durable store.
    staged: bool,
}

impl Drop for RepoWriter<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.registration.take() {
            session.end(self.repo);
        }
        if let (Some(ingest), Ok(mut idle)) = (self.ingest.take(), self.repo.idle_ingests.lock()) {
            idle.push(ingest);
        }
    }
}

impl RepoWriter<'_> {
    /// This writer's pack size (tests: many packs from little data).
    pub fn with_pack_size(mut self, bytes: usize) -> Self {
        self.pack_size = bytes.max(1);
        self
    }

    /// This writer's compression instead of the repository's (the agent's adaptive level):
    /// blobs say how they are stored, so readers need not know.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Packs and the index object go to `sink` instead of the durable store (the agent
    /// staging them on a server, which drains them; then the manifest from
    /// [`Repo::prepare_manifest`] goes the same way). Call before the first file.
    pub fn with_sink(mut self, sink: Arc<dyn ObjectSink>) -> Self {
        self.uploads.sink = sink;
        self.staged = true;
        self
    }

    /// Chunks, scores and stores what `reader` yields; returns the file's recipe (`path` is
    /// only recorded).
    pub fn add_file(&mut self, path: &str, reader: impl Read + Send) -> Result<FileRecipe> {
        self.add_file_with_base(path, reader, None)
    }

    /// [`RepoWriter::add_file`], given the previous version of the file (`base`): a new chunk
    /// may then be stored as a delta against the previous version's chunk at its offset
    /// (docs/dedup.md, "Delta blobs"). Only chunks of `base.bytes` that hash to the recipe's
    /// scores are used, so wrong bytes cost ratio, never data; so does a recipe that cannot
    /// be read.
    pub fn add_file_with_base(
        &mut self,
        path: &str,
        reader: impl Read + Send,
        base: Option<FileBase<'_>>,
    ) -> Result<FileRecipe> {
        self.register()?;
        self.file_packs = FilePacks::default();
        // A base whose recipe cannot be read (e.g. its checkpoint was pruned meanwhile) is
        // no base: it would only have saved bytes.
        let base = base
            .filter(|_| self.compression != Compression::None)
            .and_then(|b| self.repo.base_file(b));
        let mut ingest = match self.ingest.take() {
            Some(ingest) => ingest,
            None => self.repo.idle_ingest(),
        };
        let repo = self.repo;
        let compression = self.compression;
        let pack = |s: &Score, offset: u64, data: &[u8]| -> Option<Packed> {
            if !repo.lacks(s) {
                return None;
            }
            delta::pack_chunk(compression, base.as_ref(), offset, data)
        };
        let mut leaves: Vec<(Score, u64)> = Vec::new();
        let digest = ingest.run(reader, &pack, &mut |window, chunks| {
            self.add_chunks(window, chunks, &mut leaves)
        });
        self.ingest = Some(ingest);
        let digest = digest?;
        let root = self.add_tree(&leaves)?;
        self.files
            .push((root, std::mem::take(&mut self.file_packs)));
        self.stats.files += 1;
        Ok(FileRecipe {
            path: path.to_string(),
            size: digest.size,
            blake3: to_hex(&digest.blake3),
            root: to_hex(&root),
        })
    }

    /// Registers this writer's session before its first dedup decision.
    fn register(&mut self) -> Result<()> {
        if self.registration.is_none() {
            self.registration = Some(Session::start(self.repo)?);
        }
        self.started.get_or_insert_with(std::time::Instant::now);
        Ok(())
    }

    /// Renews the session now and then; fails once it lapsed.
    fn keep_alive(&mut self) -> Result<()> {
        match self.registration.as_mut() {
            Some(session) => session.keep_alive(self.repo),
            None => Ok(()),
        }
    }

    /// Whether this writer or the index has blob `s` (and the blobs it depends on: a delta
    /// blob's bases) outside the condemned packs; if so, the file being added uses its packs.
    fn use_known(&mut self, s: &Score) -> bool {
        let repo = self.repo;
        let Ok(index) = repo.index.read() else {
            return false;
        };
        let (own, chain) = match self.written.get(s) {
            // A base this writer took stays usable: its session keeps it.
            Some(&slot) => match self.own_bases.get(s) {
                Some(base) => match index.chain(&base.score, true) {
                    Some(chain) => (Some(slot), Some(chain)),
                    None => return false,
                },
                None => (Some(slot), None),
            },
            None => match index.chain(s, false) {
                Some(chain) => (None, Some(chain)),
                None => return false,
            },
        };
        if let Some(slot) = own {
            self.file_packs.note(BlobAt::Own(slot));
        }
        for &n in chain.iter().flat_map(PackChain::packs) {
            self.file_packs.note(index.blob_at(n));
        }
        true
    }

    /// Starts a pack with 16 unique bytes (session::pack_nonce).
    fn open_pack(&mut self) {
        if self.pack.is_empty() {
            if self.pack.capacity() == 0 {
                // Room for a full pack, the chunk that overflows it, its trailer and the pad.
                self.pack = self.uploads.buffer(
                    self.pack_size + (self.pack_size >> 1) + (4 << 20) + upload::PACK_ALIGN,
                );
            }
            self.pack_pad = self
                .pack
                .as_ptr()
                .align_offset(upload::PACK_ALIGN)
                .min(upload::PACK_ALIGN);
            self.pack.resize(self.pack_pad, 0);
            self.pack.extend_from_slice(&session::pack_nonce());
        }
    }

    /// Stores a window's chunks the repository and this writer do not have yet, in order.
    fn add_chunks(
        &mut self,
        window: &[u8],
        chunks: Vec<Chunk>,
        leaves: &mut Vec<(Score, u64)>,
    ) -> Result<()> {
        self.keep_alive()?;
        for chunk in chunks {
            let data = &window[chunk.range];
            self.stats.bytes += data.len() as u64;
            self.stats.chunks += 1;
            leaves.push((chunk.score, data.len() as u64));
            // A chunk repeated within the file is stored by its first occurrence.
            if !self.use_known(&chunk.score) {
                self.stats.new_chunks += 1;
                self.stats.new_bytes += data.len() as u64;
                let stored = self.add_blob(chunk.score, BlobKind::Data, data, chunk.packed)?;
                self.stats.stored_data_bytes += stored;
            }
        }
        Ok(())
    }

    /// Stores the recipe blocks above `leaves` (format::recipe_blocks) that neither the
    /// repository nor this writer has; returns the root's score.
    fn add_tree(&mut self, leaves: &[(Score, u64)]) -> Result<Score> {
        let (root, blocks) = format::recipe_blocks(leaves);
        for (s, bytes) in blocks {
            if !self.use_known(&s) {
                let packed = self
                    .compression
                    .compress(&bytes)
                    .map(|bytes| Packed { bytes, base: None });
                let stored = self.add_blob(s, BlobKind::Tree, &bytes, packed)?;
                self.stats.stored_tree_bytes += stored;
            }
        }
        Ok(root)
    }

    /// Stores a blob in its packed form (a delta only while its base is still usable: else
    /// raw); the bytes it takes in the pack.
    fn add_blob(
        &mut self,
        s: Score,
        kind: BlobKind,
        raw: &[u8],
        packed: Option<Packed>,
    ) -> Result<u64> {
        let base_packs = match packed.as_ref().and_then(|p| p.base) {
            Some(base) => self.base_packs(&base.score)?,
            None => None,
        };
        let (bytes, stored, base): (&[u8], Stored, Option<DeltaBase>) = match &packed {
            Some(Packed { bytes, base: None }) => (bytes, Stored::Zstd, None),
            Some(Packed {
                bytes,
                base: Some(base),
            }) if base_packs.is_some() => (bytes, Stored::Delta, Some(*base)),
            _ => (raw, Stored::Raw, None),
        };
        let slot = self.append(s, kind, raw.len() as u32, stored, base, bytes)?;
        self.file_packs.note(BlobAt::Own(slot));
        for at in base_packs.into_iter().flatten() {
            self.file_packs.note(at);
        }
        if let Some(base) = base {
            self.own_bases.insert(s, base);
            self.stats.delta_chunks += 1;
        }
        Ok(bytes.len() as u64)
    }

    /// Appends a blob in its stored form to the pack being filled, and writes the pack once
    /// full; the position among this writer's packs of the pack it went into.
    fn append(
        &mut self,
        s: Score,
        kind: BlobKind,
        raw_len: u32,
        stored: Stored,
        base: Option<DeltaBase>,
        bytes: &[u8],
    ) -> Result<u32> {
        self.open_pack();
        self.entries.push(BlobEntry {
            score: s,
            offset: (self.pack.len() - self.pack_pad) as u32,
            stored_len: bytes.len() as u32,
            raw_len,
            kind,
            stored,
            base,
        });
        self.pack.extend_from_slice(bytes);
        let slot = self.packs.len() as u32;
        self.written.insert(s, slot);
        if self.pack.len() - self.pack_pad >= self.pack_target() {
            self.flush_pack()?;
        }
        Ok(slot)
    }

    /// The size at which the pack being filled is written: a writer's first packs are an
    /// eighth, a quarter and half of the pack size, so its first upload starts after a few
    /// hundred KiB instead of 4 MiB (over a 1 Gbit/s link that was 30 ms of idle link per
    /// checkpoint).
    fn pack_target(&self) -> usize {
        let halvings = RAMP_PACKS.saturating_sub(self.packs.len());
        (self.pack_size >> halvings).max(1)
    }

    /// Adds a blob already scored and in its stored form (`bytes`: raw, or a zstd frame of
    /// `raw_len` bytes), as a staging server pushes the chunks agents sent it: the same packs
    /// and entries [`RepoWriter::add_file`] writes. Skipped (false) when the repository or
    /// this writer already has `s`. The caller has checked that `bytes` is `s`.
    pub fn add_stored(
        &mut self,
        s: Score,
        kind: BlobKind,
        raw_len: u32,
        stored: Stored,
        bytes: &[u8],
    ) -> Result<bool> {
        if stored == Stored::Delta {
            return Err(Error::Invalid(format!(
                "blob {}: delta blobs are written by add_file_with_base or add_stored_delta",
                to_hex(&s)
            )));
        }
        self.register()?;
        self.keep_alive()?;
        if self.has(&s) {
            return Ok(false);
        }
        match kind {
            BlobKind::Data => {
                self.stats.new_chunks += 1;
                self.stats.new_bytes += u64::from(raw_len);
                self.stats.stored_data_bytes += bytes.len() as u64;
            }
            BlobKind::Tree => self.stats.stored_tree_bytes += bytes.len() as u64,
        }
        self.append(s, kind, raw_len, stored, None, bytes)?;
        Ok(true)
    }

    /// Adds a delta blob another process made (`frame`: a zstd frame of the chunk, `raw_len`
    /// bytes, XORed with `base`), as a staging server pushes one an agent sent; the caller
    /// cannot check it against `s` without the base. While the base is usable
    /// ([`Repo::usable_as_base`]) the blob is stored as it came. Otherwise (its pack was
    /// condemned since, say) the chunk is rebuilt with the base read from the repository,
    /// checked against `s` and stored whole. Skipped (false) when the repository or this
    /// writer already has `s`. An error `Missing` or `Corrupt` concerns this blob only: its
    /// base cannot be read, or the delta does not rebuild `s`.
    pub fn add_stored_delta(
        &mut self,
        s: Score,
        raw_len: u32,
        base: DeltaBase,
        frame: &[u8],
    ) -> Result<bool> {
        self.register()?;
        self.keep_alive()?;
        if self.has(&s) {
            return Ok(false);
        }
        let Some(base_packs) = self.base_packs(&base.score)? else {
            let base_raw = self.repo.read_blob(&base.score)?;
            let corrupt = |why: String| Error::Corrupt {
                score: to_hex(&s),
                why,
            };
            let raw = delta::undo_delta(frame, raw_len, &base_raw, base.from).map_err(corrupt)?;
            if score(&raw) != s {
                return Err(corrupt(format!(
                    "its delta on {} does not rebuild it",
                    to_hex(&base.score)
                )));
            }
            return match REBUILT_COMPRESSION.compress(&raw) {
                Some(z) => self.add_stored(s, BlobKind::Data, raw_len, Stored::Zstd, &z),
                None => self.add_stored(s, BlobKind::Data, raw_len, Stored::Raw, &raw),
            };
        };
        self.stats.new_chunks += 1;
        self.stats.new_bytes += u64::from(raw_len);
        self.stats.stored_data_bytes += frame.len() as u64;
        self.stats.delta_chunks += 1;
        let slot = self.append(s, BlobKind::Data, raw_len, Stored::Delta, Some(base), frame)?;
        self.file_packs.note(BlobAt::Own(slot));
        for at in base_packs {
            self.file_packs.note(at);
        }
        self.own_bases.insert(s, base);
        Ok(true)
    }

    /// The packs of blob `base` and of the blobs it depends on, while it is usable as a base
    /// ([`Repo::usable_as_base`]); None once it is not (condemned since, say).
    fn base_packs(&self, base: &Score) -> Result<Option<Vec<BlobAt>>> {
        let index = self.repo.index.read().map_err(|_| poisoned())?;
        Ok(index
            .chain(base, false)
            .filter(|chain| chain.depth() < MAX_DELTA_DEPTH)
            .map(|chain| chain.packs().iter().map(|&n| index.blob_at(n)).collect()))
    }

    /// Whether this writer or the index (outside condemned packs) has blob `s`.
    fn has(&self, s: &Score) -> bool {
        self.written.contains_key(s)
            || self
                .repo
                .index
                .read()
                .is_ok_and(|index| index.chain(s, false).is_some())
    }

    /// Writes the pack being filled (its id is the BLAKE3 of its bytes).
    fn flush_pack(&mut self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let mut pack = std::mem::take(&mut self.pack);
        format::encode_pack_trailer(&self.entries, &mut pack);
        self.uploads.send(pack, self.pack_pad)?;
        self.packs.push(std::mem::take(&mut self.entries));
        self.stats.packs += 1;
        self.keep_alive()
    }

    /// Waits until the packs sent so far are written (the pack being filled stays open): a
    /// caller that then adds what arrived meanwhile (a staging server's push round) keeps
    /// one session and one index object for all of it. The first failed upload is returned.
    pub fn wait_uploads(&mut self) -> Result<()> {
        self.uploads.wait().map(|_| ())
    }

    /// Writes the last pack and one index object naming every pack of this writer, then
    /// lets the repository's index know them. After this, manifests may name the files added.
    /// The writer's session stays open (parked in the repository) until manifests name every
    /// file it added, so garbage collection keeps what they use meanwhile.
    pub fn finish(mut self) -> Result<WriteStats> {
        self.flush_pack()?;
        // The index names only packs that are written.
        let own_packs: Vec<Score> = self.uploads.wait()?.to_vec();
        let timing = self.uploads.timing();
        let wall = self
            .started
            .map_or(std::time::Duration::ZERO, |s| s.elapsed());
        self.stats.ingest_nanos = nanos(wall.saturating_sub(timing.blocked));
        self.stats.upload_nanos = nanos(timing.busy);
        self.stats.uploaded_bytes = timing.bytes;
        let session: Vec<(Score, Vec<BlobEntry>)> = own_packs
            .iter()
            .copied()
            .zip(std::mem::take(&mut self.packs))
            .collect();
        let mut origin = None;
        if !session.is_empty() {
            let bytes = format::encode_index(&session);
            let id = score(&bytes);
            origin = Some(id);
            let name = to_hex(&id);
            self.uploads.sink.put(
                &self.repo.key(&format!("index/{name}")),
                vec![Bytes::from(bytes)],
            )?;
            if self.staged {
                self.repo
                    .staged_indexes
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert(name.clone(), session.clone());
            }
            let mut index = self.repo.index.write().map_err(|_| poisoned())?;
            if index.loaded.insert(name) {
                for (pack, entries) in &session {
                    index.add_pack(*pack, id, entries);
                }
                index.settle_copies();
            }
        }
        if let Some(session) = self.registration.take() {
            let mut roots: HashMap<Score, gc::PackSet> = HashMap::new();
            for (root, packs) in &self.files {
                session::merge(
                    roots.entry(*root).or_default(),
                    &packs.resolve(&own_packs, origin),
                );
            }
            self.repo.park(session, roots);
        }
        Ok(std::mem::take(&mut self.stats))
    }
}
