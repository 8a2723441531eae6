//! Writer sessions: the writers' half of the protocol that lets garbage collection delete packs
//! beside them (docs/dedup.md, "Garbage collection").
//!
//! A session registers `sessions/<id>.json` before its first dedup decision, then loads the
//! condemned packs (never deduped against) and the index objects that changed. It renews the
//! object while it writes and ends (deletes it) once the manifest naming its files is written:
//! the collector deletes a condemned pack only after every session that might have deduped
//! against it has ended or let its lease run out.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::format::Block;
use super::gc::{groups_of, CondemnedRecord, PackSet, CONDEMNED_PREFIX};
use super::{parse_score, poisoned, Error, Manifest, Repo, Result};
use crate::score::to_hex;
use crate::{score, Score};

/// How long a session lives without being renewed. Writers renew every eighth of it and fail
/// once half of it went by without a renewal; the collector takes a session not renewed for
/// a whole lease for dead. The margin covers clocks that disagree by up to a quarter lease.
pub const DEFAULT_SESSION_LEASE: Duration = Duration::from_secs(15 * 60);

pub(crate) const SESSION_FORMAT: &str = "cascade-dedup-session/1";

/// A name nothing else will choose: the time (so names sort by age) and 16 hex digits of a
/// hash of the time, the process, a counter and the thread.
pub(crate) fn unique_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = cascade_durable::now_unix_ns();
    let mut h = blake3::Hasher::new();
    h.update(&now.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    let hex = h.finalize().to_hex();
    format!("{now:020}-{}", &hex[..16])
}

/// `sessions/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub format: String,
    pub id: String,
    pub pid: u32,
    pub started_unix_ns: u64,
    pub refreshed_unix_ns: u64,
}

/// A registered session of this process.
pub(crate) struct Session {
    pub id: String,
    key: String,
    started_unix_ns: u64,
    /// When the last renewal that succeeded was started.
    renewed_at: Instant,
    lease: Duration,
}

impl Session {
    /// Registers a session, then learns what the collector condemned and which index objects
    /// changed — in that order, so that a collection either sees this session or has already
    /// rewritten the index objects this process reads (docs/dedup.md).
    pub fn start(repo: &Repo) -> Result<Session> {
        repo.ensure_index()?;
        let session = Session::register(repo)?;
        let synced = repo.sync_condemned().and_then(|()| repo.refresh_index());
        if let Err(e) = synced {
            session.end(repo);
            return Err(e);
        }
        Ok(session)
    }

    /// PUTs a new session object, and nothing else.
    fn register(repo: &Repo) -> Result<Session> {
        let id = unique_id();
        let now = cascade_durable::now_unix_ns();
        let mut session = Session {
            key: repo.key(&format!("sessions/{id}.json")),
            id,
            started_unix_ns: now,
            renewed_at: Instant::now(),
            lease: repo.session_lease,
        };
        session.put(repo, now)?;
        Ok(session)
    }

    fn put(&mut self, repo: &Repo, now_unix_ns: u64) -> Result<()> {
        let record = SessionRecord {
            format: SESSION_FORMAT.to_string(),
            id: self.id.clone(),
            pid: std::process::id(),
            started_unix_ns: self.started_unix_ns,
            refreshed_unix_ns: now_unix_ns,
        };
        let text = serde_json::to_vec_pretty(&record).map_err(|e| Error::Invalid(e.to_string()))?;
        let started = Instant::now();
        repo.durable.put_bytes(&self.key, &text)?;
        self.renewed_at = started;
        Ok(())
    }

    /// True once half a lease went by without a renewal: the collector may since have taken
    /// the session for dead, so what it deduped against may be gone.
    pub fn lapsed(&self) -> bool {
        self.renewed_at.elapsed() > self.lease / 2
    }

    /// Renews the session when an eighth of the lease went by; fails once it lapsed.
    pub fn keep_alive(&mut self, repo: &Repo) -> Result<()> {
        if self.lapsed() {
            return Err(Error::Conflict(format!(
                "writer session {} was not renewed for {:.0} s (lease {} s): garbage \
                 collection may have deleted what it deduplicated against; store the files \
                 again",
                self.id,
                self.renewed_at.elapsed().as_secs_f64(),
                self.lease.as_secs()
            )));
        }
        if self.renewed_at.elapsed() >= self.lease / 8 {
            self.put(repo, cascade_durable::now_unix_ns())?;
        }
        Ok(())
    }

    /// Deletes the session object. A failure only delays collection: the collector waits for
    /// a session it still sees until its lease runs out.
    pub fn end(self, repo: &Repo) {
        let _ = repo.durable.delete(&self.key);
    }

    /// [`Session::end`] on a thread of its own, off the writer's way to a durable checkpoint
    /// (a request's round trip); [`Repo::wait_session_ends`] waits for it.
    pub fn end_in_background(self, repo: &Repo) {
        let durable = Arc::clone(&repo.durable);
        let key = self.key.clone();
        let spawned = std::thread::Builder::new()
            .name("cascade-session-end".to_string())
            .spawn(move || {
                let _ = durable.delete(&key);
            });
        match (spawned, repo.ending_sessions.lock()) {
            (Ok(handle), Ok(mut ending)) => {
                // Reap the threads done since (a joinable thread keeps its stack until joined).
                let (done, running) = std::mem::take(&mut *ending)
                    .into_iter()
                    .partition::<Vec<_>, _>(|h| h.is_finished());
                *ending = running;
                ending.push(handle);
                for h in done {
                    let _ = h.join();
                }
            }
            (Ok(handle), Err(_)) => {
                let _ = handle.join();
            }
            (Err(_), _) => self.end(repo),
        }
    }
}

/// Keeps garbage collection from deleting any pack it condemns from now on, until ended or
/// until its lease lapses ([`Hold::renew`] renews it): a staging server holds one while it
/// keeps delta blobs whose bases it checked, so a base condemned meanwhile can still be read
/// to store its chunk whole (docs/dedup.md, "Through staging servers"). Taking one also
/// learns the condemned packs and new index objects, as a writer's session does.
pub struct Hold(Session);

impl Hold {
    /// Renews the hold when an eighth of its lease went by; fails once it lapsed (the
    /// collector may have taken it for dead: take a new one).
    pub fn renew(&mut self, repo: &Repo) -> Result<()> {
        self.0.keep_alive(repo)
    }

    /// Lets the collector go on (deletes the session object).
    pub fn end(self, repo: &Repo) {
        self.0.end(repo)
    }
}

/// A writer's session kept after `finish` until manifests name the files it added: the
/// collector must not delete what those files use before the manifest is visible to it. A
/// writer that added no files (blobs only: `add_stored`) stays until its lease lapses or
/// the repository is dropped, since any manifest may use its blobs.
pub(crate) struct Parked {
    pub session: Session,
    /// Root of each file added, and the packs (by index object) its blobs were found in.
    pub roots: HashMap<Score, PackSet>,
    pub blobs_only: bool,
}

/// Where a blob a writer uses is: in a pack of this writer (its position among the packs the
/// writer wrote) or in a pack the index names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlobAt {
    Own(u32),
    Indexed { pack: Score, origin: Score },
}

/// The packs one file's blobs are in, gathered while the file is added.
#[derive(Debug, Default)]
pub(crate) struct FilePacks {
    pub own: BTreeSet<u32>,
    pub indexed: HashSet<(Score, Score)>,
    last: Option<BlobAt>,
}

impl FilePacks {
    pub fn note(&mut self, at: BlobAt) {
        // Consecutive blobs are mostly in the same pack: skip the set for them.
        if self.last == Some(at) {
            return;
        }
        self.last = Some(at);
        match at {
            BlobAt::Own(slot) => {
                self.own.insert(slot);
            }
            BlobAt::Indexed { pack, origin } => {
                self.indexed.insert((pack, origin));
            }
        }
    }

    /// The pack set, given the ids of this writer's packs and of its index object.
    pub fn resolve(&self, own_packs: &[Score], own_origin: Option<Score>) -> PackSet {
        let mut set = PackSet::new();
        if let Some(origin) = own_origin {
            for slot in &self.own {
                if let Some(pack) = own_packs.get(*slot as usize) {
                    set.entry(origin).or_default().insert(*pack);
                }
            }
        }
        for (pack, origin) in &self.indexed {
            set.entry(*origin).or_default().insert(*pack);
        }
        set
    }
}

pub(crate) fn merge(into: &mut PackSet, from: &PackSet) {
    for (origin, packs) in from {
        into.entry(*origin)
            .or_default()
            .extend(packs.iter().copied());
    }
}

impl Repo {
    /// Reads every condemned record: the packs no session that starts now may dedup against.
    pub(crate) fn sync_condemned(&self) -> Result<()> {
        let mut condemned = HashSet::new();
        for record in self.condemned_records()? {
            for group in &record.packs {
                for pack in &group.packs {
                    condemned.insert(parse_score(pack)?);
                }
            }
        }
        self.index.write().map_err(|_| poisoned())?.condemned = condemned;
        Ok(())
    }

    /// The condemned records under `gc/` (one finished by a collector meanwhile is skipped:
    /// its packs are out of the index objects).
    fn condemned_records(&self) -> Result<Vec<CondemnedRecord>> {
        let mut records = Vec::new();
        for o in self.durable.list(&self.key("gc"))? {
            let name = o.path.rsplit('/').next().unwrap_or("");
            if !name.starts_with(CONDEMNED_PREFIX) {
                continue;
            }
            let bytes = match self.durable.get_bytes(&o.path) {
                Ok(b) => b,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            let record: CondemnedRecord =
                serde_json::from_slice(&bytes).map_err(|e| Error::Format {
                    object: o.path.clone(),
                    why: e.to_string(),
                })?;
            records.push(record);
        }
        Ok(records)
    }

    /// Whether a parked session of this process keeps `packs` (condemned, needed by a
    /// manifest about to be written) from being deleted until after the write: it must be
    /// in the wait set of every condemned record naming one of them (or the record has none
    /// yet: the collector will list the session). That session is renewed here.
    fn parked_session_guards(&self, packs: &HashSet<Score>) -> Result<bool> {
        let mut waits: Vec<Option<HashSet<String>>> = Vec::new();
        for record in self.condemned_records()? {
            let names_one = record
                .packs
                .iter()
                .flat_map(|g| g.packs.iter())
                .any(|p| parse_score(p).is_ok_and(|p| packs.contains(&p)));
            if names_one {
                waits.push(record.waiting_for.map(|w| w.into_iter().collect()));
            }
        }
        let mut parked = self.parked.lock().map_err(|_| poisoned())?;
        for p in parked.iter_mut() {
            let in_every = waits
                .iter()
                .all(|w| w.as_ref().is_none_or(|ids| ids.contains(&p.session.id)));
            if !p.session.lapsed() && in_every && p.session.keep_alive(self).is_ok() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Keeps a finished writer's session until manifests name its files (or, for a writer
    /// of blobs only, until it lapses).
    pub(crate) fn park(&self, session: Session, roots: HashMap<Score, PackSet>) {
        let blobs_only = roots.is_empty();
        match self.parked.lock() {
            Ok(mut parked) => parked.push(Parked {
                session,
                roots,
                blobs_only,
            }),
            Err(_) => session.end(self),
        }
    }

    /// Takes a [`Hold`].
    pub fn hold(&self) -> Result<Hold> {
        Session::start(self).map(Hold)
    }

    /// Checks a manifest another process prepared ([`Repo::prepare_manifest`]) before it is
    /// written, when the session that kept its packs from garbage collection may have lapsed
    /// meanwhile (a staging server cut off from the durable store for longer than
    /// [`Repo::staged_manifest_trusted`] after the push): registers a session first, then refuses
    /// (`Error::Conflict`) if a condemned record names a pack the manifest names, or one is
    /// not in the durable store (`present`: hex ids of packs known to be there, not asked
    /// again; one HEAD for each other). Otherwise the returned hold keeps them all until it
    /// ends: end it after the manifest's PUT. Loads no index.
    pub fn check_staged_manifest(
        &self,
        manifest: &Manifest,
        present: &HashSet<String>,
    ) -> Result<Hold> {
        let session = Session::register(self)?;
        match self.staged_manifest_refusal(manifest, present) {
            Ok(None) => Ok(Hold(session)),
            Ok(Some(why)) => {
                session.end(self);
                Err(Error::Conflict(format!(
                    "manifest of {} not written: {why}; store the files again",
                    manifest.checkpoint
                )))
            }
            Err(e) => {
                session.end(self);
                Err(e)
            }
        }
    }

    /// Why `manifest` must not be written now (see [`Repo::check_staged_manifest`]), if so.
    fn staged_manifest_refusal(
        &self,
        manifest: &Manifest,
        present: &HashSet<String>,
    ) -> Result<Option<String>> {
        let Some(groups) = &manifest.packs else {
            return Ok(Some("it names no packs to check".to_string()));
        };
        let packs = || groups.iter().flat_map(|g| g.packs.iter());
        let condemned: HashSet<String> = self
            .condemned_records()?
            .into_iter()
            .flat_map(|r| r.packs.into_iter().flat_map(|g| g.packs))
            .collect();
        if let Some(pack) = packs().find(|p| condemned.contains(*p)) {
            return Ok(Some(format!(
                "garbage collection condemned pack {pack}, which it names"
            )));
        }
        for pack in packs().filter(|p| !present.contains(*p)) {
            match self.durable.size(&self.pack_key(&parse_score(pack)?)) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {
                    return Ok(Some(format!(
                        "pack {pack}, which it names, is not in the durable store \
                         (garbage collection deleted it)"
                    )))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Waits until the sessions ended in the background are deleted (before a collection,
    /// which must not wait for this process's own finished sessions).
    pub fn wait_session_ends(&self) {
        let ending = match self.ending_sessions.lock() {
            Ok(mut e) => std::mem::take(&mut *e),
            Err(_) => return,
        };
        for handle in ending {
            let _ = handle.join();
        }
    }

    /// Renews the parked sessions that cover files no manifest names yet (each when an
    /// eighth of its lease went by): a writer whose manifest another process writes later
    /// (a staging server draining its packs first) keeps what it deduplicated against from
    /// garbage collection meanwhile. The first session that lapsed already is an error.
    pub fn renew_parked(&self) -> Result<()> {
        let mut parked = self.parked.lock().map_err(|_| poisoned())?;
        for p in parked.iter_mut().filter(|p| !p.roots.is_empty()) {
            p.session.keep_alive(self)?;
        }
        Ok(())
    }

    /// Ends every parked session (the repository is going away).
    pub(crate) fn end_parked(&self) {
        self.wait_session_ends();
        let parked = match self.parked.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return,
        };
        for p in parked {
            p.session.end(self);
        }
    }

    /// Writes `manifest` with the set of packs its blobs are in (`packs`), safely beside
    /// garbage collection. Files added by a writer of this process whose session is still
    /// parked take its pack sets (no reads). Any other root is walked under a session of its
    /// own, after the condemned packs and the index were refreshed, and refused if it needs a
    /// condemned pack (a collector may be deleting it) — unless a parked session of this
    /// process that the collector waits for keeps it. Parked sessions whose every file is now
    /// named end after the write.
    pub(crate) fn record_manifest(&self, manifest: &mut Manifest) -> Result<()> {
        let (roots, own_session) = self.settle_pack_set(manifest, true)?;
        let written = serde_json::to_vec_pretty(&*manifest)
            .map_err(|e| Error::Invalid(e.to_string()))
            .and_then(|text| {
                self.durable
                    .put_bytes(&self.manifest_key(&manifest.checkpoint)?, &text)
                    .map_err(Error::from)
            });
        if let Some(session) = own_session {
            session.end(self);
        }
        written?;
        self.release_roots(&roots)
    }

    /// Fills in `manifest.packs` (see [`Repo::record_manifest`]); its roots, and the session
    /// of its own a walk needed (ended by the caller after the write). Without `may_walk`, a
    /// root no parked session covers is refused instead of walked.
    pub(crate) fn settle_pack_set(
        &self,
        manifest: &mut Manifest,
        may_walk: bool,
    ) -> Result<(Vec<Score>, Option<Session>)> {
        self.ensure_index()?;
        let roots = manifest.roots()?;
        // Every root must be reachable: the crash-safe order, checked.
        {
            let index = self.index.read().map_err(|_| poisoned())?;
            if let Some(i) = roots.iter().position(|r| !index.blobs.contains_key(r)) {
                return Err(Error::Missing(manifest.files[i].root.clone()));
            }
        }
        let mut packs = PackSet::new();
        let mut uncovered = Vec::new();
        {
            let mut parked = self.parked.lock().map_err(|_| poisoned())?;
            // A lapsed session protects nothing any more; the collector treats it as dead.
            let (live, lapsed): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|p| !p.session.lapsed());
            *parked = live;
            for p in lapsed {
                p.session.end(self);
            }
            let mut used = HashSet::new();
            for root in &roots {
                match parked.iter().position(|p| p.roots.contains_key(root)) {
                    Some(i) => {
                        merge(&mut packs, &parked[i].roots[root]);
                        used.insert(i);
                    }
                    None => uncovered.push(*root),
                }
            }
            for i in used {
                parked[i].session.keep_alive(self)?;
            }
        }
        let own_session = if uncovered.is_empty() {
            None
        } else if !may_walk {
            return Err(Error::Invalid(format!(
                "checkpoint {}: {} of its files were not added by a writer of this process \
                 whose session is open",
                manifest.checkpoint,
                uncovered.len()
            )));
        } else {
            let session = Session::start(self)?;
            let walked = self.walk_pack_set(&uncovered).and_then(|walked| {
                let condemned: HashSet<Score> = {
                    let index = self.index.read().map_err(|_| poisoned())?;
                    walked
                        .values()
                        .flatten()
                        .filter(|p| index.condemned.contains(*p))
                        .copied()
                        .collect()
                };
                if condemned.is_empty() || self.parked_session_guards(&condemned)? {
                    return Ok(walked);
                }
                let first = condemned.iter().next().map(to_hex).unwrap_or_default();
                Err(Error::Conflict(format!(
                    "checkpoint {} uses pack {first} that garbage collection is deleting; \
                     store its files again",
                    manifest.checkpoint
                )))
            });
            match walked {
                Ok(walked) => merge(&mut packs, &walked),
                Err(e) => {
                    session.end(self);
                    return Err(e);
                }
            }
            Some(session)
        };
        manifest.packs = Some(groups_of(&packs));
        Ok((roots, own_session))
    }

    /// A manifest naming `roots` was written: parked sessions whose every file is now named
    /// end (in the background).
    pub(crate) fn release_roots(&self, roots: &[Score]) -> Result<()> {
        let finished: Vec<Parked> = {
            let mut parked = self.parked.lock().map_err(|_| poisoned())?;
            for p in parked.iter_mut() {
                for root in roots {
                    p.roots.remove(root);
                }
            }
            let (done, open): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|p| p.roots.is_empty() && !p.blobs_only);
            *parked = open;
            done
        };
        for p in finished {
            p.session.end_in_background(self);
        }
        Ok(())
    }

    /// The packs (by index object) the trees of `roots` are in, from the loaded index: every
    /// recipe block is read (about 40 bytes per chunk), data chunks are only looked up.
    pub(crate) fn walk_pack_set(&self, roots: &[Score]) -> Result<PackSet> {
        self.ensure_index()?;
        let mut set = PackSet::new();
        let mut seen_blocks = HashSet::new();
        let mut stack: Vec<Score> = roots.to_vec();
        // A blob and the blobs it depends on (a delta blob's bases).
        let note = |set: &mut PackSet, s: &Score| -> Result<()> {
            let index = self.index.read().map_err(|_| poisoned())?;
            let chain = index
                .chain(s, true)
                .ok_or_else(|| Error::Missing(to_hex(s)))?;
            for &n in chain.packs() {
                set.entry(index.origins[n as usize])
                    .or_default()
                    .insert(index.packs[n as usize]);
            }
            Ok(())
        };
        while let Some(node) = stack.pop() {
            if !seen_blocks.insert(node) {
                continue;
            }
            note(&mut set, &node)?;
            let block = Block::decode(&self.read_blob(&node)?).map_err(|e| Error::Corrupt {
                score: to_hex(&node),
                why: e.0,
            })?;
            for (child, _) in &block.children {
                if block.level == 0 {
                    note(&mut set, child)?;
                } else {
                    stack.push(*child);
                }
            }
        }
        Ok(set)
    }
}

/// Sixteen bytes that make every pack unique: two sessions storing the same blobs in the same
/// order must not write one pack id that two index objects name (the collector rewrites only
/// the index object a manifest names for a pack).
pub(crate) fn pack_nonce() -> [u8; 16] {
    let id = unique_id();
    let digest = score(id.as_bytes());
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&digest[..16]);
    nonce
}
