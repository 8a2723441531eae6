//! Retention: forgetting checkpoints and collecting the packs no remaining manifest needs
//! (docs/dedup.md, "Garbage collection").
//!
//! `forget` moves a manifest's pack set into `gc/forgotten-<id>.json` and deletes the
//! manifest. `collect_garbage` turns forgotten records into a condemned record
//! (`gc/condemned-<id>.json`: candidate packs, then the sessions open when it was written),
//! and deletes a condemned record's packs once none of those sessions is open and no
//! manifest names them: index objects first (rewritten without the packs), then the packs,
//! then the record. Its cost follows the garbage: it reads the records, the session objects,
//! the manifests (their pack sets) and the index objects naming dead packs — never a pack.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::format::{self, BlobEntry};
use super::job::checkpoint_of;
use super::session::{unique_id, SessionRecord};
use super::{parse_score, poisoned, Error, Manifest, Repo, Result, MANIFEST_FORMAT};
use crate::score::{from_hex, to_hex};
use crate::{score, Score};

/// Packs by the index object (its origin id) that names them.
pub(crate) type PackSet = BTreeMap<Score, BTreeSet<Score>>;

/// The packs of an index object, each with its blob entries.
pub(crate) type IndexPacks = Vec<(Score, Vec<BlobEntry>)>;

pub(crate) const FORGOTTEN_PREFIX: &str = "forgotten-";
pub(crate) const CONDEMNED_PREFIX: &str = "condemned-";
const ORPHANED_PREFIX: &str = "orphaned-";
const FORGOTTEN_FORMAT: &str = "cascade-dedup-forgotten/1";
const CONDEMNED_FORMAT: &str = "cascade-dedup-condemned/1";
const ORPHANED_FORMAT: &str = "cascade-dedup-orphaned/1";

/// Packs named by one index object, as manifests and the collector's records list them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PackGroup {
    /// Origin id of the index object: the name it was first written under (`index/<id>`);
    /// a rewrite by the collector is `index/<id>-<new id>`.
    pub index: String,
    pub packs: Vec<String>,
}

pub(crate) fn groups_of(set: &PackSet) -> Vec<PackGroup> {
    set.iter()
        .filter(|(_, packs)| !packs.is_empty())
        .map(|(origin, packs)| PackGroup {
            index: to_hex(origin),
            packs: packs.iter().map(to_hex).collect(),
        })
        .collect()
}

pub(crate) fn set_of(groups: &[PackGroup]) -> Result<PackSet> {
    let mut set = PackSet::new();
    for g in groups {
        let packs = set.entry(parse_score(&g.index)?).or_default();
        for p in &g.packs {
            packs.insert(parse_score(p)?);
        }
    }
    Ok(set)
}

/// `gc/forgotten-<id>.json`: a forgotten checkpoint's packs, until a collection takes them up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ForgottenRecord {
    pub format: String,
    pub checkpoint: String,
    /// The forgotten manifest's `created_unix_ns` (a newer manifest of the same name is not
    /// the one forgotten).
    pub manifest_created_unix_ns: u64,
    pub forgotten_unix_ns: u64,
    pub packs: Vec<PackGroup>,
}

/// `gc/condemned-<id>.json`: packs to delete once no session that may use them is open.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CondemnedRecord {
    pub format: String,
    pub created_unix_ns: u64,
    /// The forgotten records it took up (their names under `gc/`).
    pub forgotten: Vec<String>,
    pub packs: Vec<PackGroup>,
    /// Sessions open after the record was written (null until the collector listed them).
    pub waiting_for: Option<Vec<String>>,
}

/// `gc/orphaned-<id>.json`: packs no index object named when a sweep listed them (left by a
/// writer that died before its index), and the writer sessions open right after: one of them
/// may still be about to write the index naming them.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrphanedRecord {
    format: String,
    created_unix_ns: u64,
    packs: Vec<String>,
    waiting_for: Vec<String>,
}

/// The records under `gc/`, each with its name there.
#[derive(Default)]
struct GcRecords {
    forgotten: Vec<(String, ForgottenRecord)>,
    condemned: Vec<(String, CondemnedRecord)>,
    orphaned: Vec<(String, OrphanedRecord)>,
}

/// `index/<origin>` (as written by its session) or `index/<origin>-<id>` (rewritten by the
/// collector): (origin, id), where id must be the BLAKE3 of the object's bytes.
pub(crate) fn parse_index_name(name: &str) -> Option<(Score, Score)> {
    match name.split_once('-') {
        None => from_hex(name).ok().map(|id| (id, id)),
        Some((origin, id)) => Some((from_hex(origin).ok()?, from_hex(id).ok()?)),
    }
}

/// The packs every version of one index object names (a rewrite interrupted before the old
/// version was deleted leaves two: the newer names a subset), in the first version's order.
pub(crate) fn common_packs(mut versions: Vec<IndexPacks>) -> IndexPacks {
    let Some(first) = versions.pop() else {
        return Vec::new();
    };
    let others: Vec<HashSet<Score>> = versions
        .iter()
        .map(|v| v.iter().map(|(id, _)| *id).collect())
        .collect();
    first
        .into_iter()
        .filter(|(id, _)| others.iter().all(|o| o.contains(id)))
        .collect()
}

/// How a collection runs.
#[derive(Default)]
pub struct GcOptions<'a> {
    /// A session not renewed for this long is dead. None: the repository's lease
    /// ([`Repo::session_lease`]: the one it recorded, unless [`Repo::with_session_lease`]
    /// changed it); a lease given here must be at least the writers'.
    pub session_lease: Option<Duration>,
    /// Work out and report what would be deleted; change nothing.
    pub dry_run: bool,
    /// Also sweep for packs no index object names (left by writers that died before writing
    /// their index). Lists every pack, so its cost follows the repository's size, not the
    /// garbage; what it finds is deleted by a later run, once the writer sessions open at
    /// this one have ended.
    pub orphans: bool,
    /// Called before each change to the store with its ordinal (1, 2, ...), forgets
    /// included: the crash tests stop the process there.
    pub before_change: Option<&'a (dyn Fn(u64) + Sync)>,
}

/// What a collection did (or, dry, would do now).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// Forgotten checkpoints whose packs this run condemned.
    pub forgotten_taken: u64,
    pub packs_deleted: u64,
    pub bytes_freed: u64,
    /// Packs forgotten checkpoints used that stay because a remaining manifest names them too
    /// (only whole packs are deleted): at most this many bytes of garbage stay in them.
    pub packs_unreclaimed: u64,
    pub bytes_unreclaimed: u64,
    /// Condemned packs left for a later run: a writer session that may use them is open.
    pub packs_waiting: u64,
    pub sessions_waited_for: u64,
    pub index_objects_rewritten: u64,
    /// Session objects not renewed within the lease, deleted.
    pub sessions_expired: u64,
    /// Packs no index names, found by this run's sweep (`orphans`), recorded for a later run.
    pub orphans_found: u64,
    /// Packs an earlier sweep found, deleted now (their writers' sessions ended without an
    /// index naming them), and their bytes.
    pub orphans_deleted: u64,
    pub orphan_bytes_freed: u64,
    /// Packs an earlier sweep found whose writers' sessions are still open.
    pub orphans_waiting: u64,
    /// Objects written or deleted (forgets included when run through [`Repo::prune`]).
    pub changes: u64,
}

/// Which checkpoints [`Repo::prune`] forgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PruneSelection {
    /// All but the N newest (by the manifests' `created_unix_ns`).
    KeepNewest(usize),
    /// These (each must have a manifest).
    Checkpoints(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Checkpoints forgotten (dry: that would be), oldest first.
    pub forgotten: Vec<String>,
    pub kept: Vec<String>,
    pub gc: GcReport,
}

/// Counts the changes a run makes and calls the test hook before each.
pub(crate) struct Changes<'a> {
    made: u64,
    hook: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl<'a> Changes<'a> {
    pub fn new(hook: Option<&'a (dyn Fn(u64) + Sync)>) -> Changes<'a> {
        Changes { made: 0, hook }
    }

    fn next(&mut self) {
        self.made += 1;
        if let Some(hook) = self.hook {
            hook(self.made);
        }
    }
}

fn format_error(object: &str, why: impl ToString) -> Error {
    Error::Format {
        object: object.to_string(),
        why: why.to_string(),
    }
}

impl Repo {
    /// Reads index object `path` (base name `name`), checking its bytes against its name;
    /// its origin and packs.
    pub(crate) fn read_index_object(&self, path: &str, name: &str) -> Result<(Score, IndexPacks)> {
        let (origin, id) =
            parse_index_name(name).ok_or_else(|| format_error(path, "not an index object name"))?;
        let bytes = self.durable.get_bytes(path)?;
        if score(&bytes) != id {
            return Err(format_error(path, "its bytes do not hash to its name"));
        }
        let packs = format::decode_index(&bytes).map_err(|e| format_error(path, e.0))?;
        Ok((origin, packs))
    }

    /// Every manifest of the repository, oldest first (by `created_unix_ns`, then name).
    pub fn manifests(&self) -> Result<Vec<Manifest>> {
        let mut out = Vec::new();
        for o in self.durable.list(&self.key("manifests"))? {
            if let Some((m, _)) = self.read_manifest_object(&o.path)? {
                out.push(m);
            }
        }
        out.sort_by(|a, b| {
            (a.created_unix_ns, &a.checkpoint).cmp(&(b.created_unix_ns, &b.checkpoint))
        });
        Ok(out)
    }

    /// A manifest object and its bytes; None if it is gone (or not a `.json`).
    fn read_manifest_object(&self, path: &str) -> Result<Option<(Manifest, Bytes)>> {
        if !path.ends_with(".json") {
            return Ok(None);
        }
        let bytes = match self.durable.get_bytes(path) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| format_error(path, e))?;
        if m.format != MANIFEST_FORMAT {
            return Err(format_error(
                path,
                format!("format {:?}, this build reads {MANIFEST_FORMAT}", m.format),
            ));
        }
        Ok(Some((m, bytes)))
    }

    /// The packs a manifest's blobs are in: its `packs`, or for a manifest written before
    /// they were recorded, a walk of its trees through the loaded index.
    fn pack_set_of(&self, m: &Manifest) -> Result<PackSet> {
        match &m.packs {
            Some(groups) => set_of(groups),
            None => self.walk_pack_set(&m.roots()?),
        }
    }

    /// Forgets `checkpoint`: records its packs for the collector, then deletes its manifest
    /// (unless a newer one replaced it meanwhile). False if it has no manifest.
    pub(crate) fn forget_with(&self, checkpoint: &str, changes: &mut Changes) -> Result<bool> {
        let key = self.manifest_key(checkpoint)?;
        let Some((manifest, bytes)) = self.read_manifest_object(&key)? else {
            return Ok(false);
        };
        let record = ForgottenRecord {
            format: FORGOTTEN_FORMAT.to_string(),
            checkpoint: manifest.checkpoint.clone(),
            manifest_created_unix_ns: manifest.created_unix_ns,
            forgotten_unix_ns: cascade_durable::now_unix_ns(),
            packs: groups_of(&self.pack_set_of(&manifest)?),
        };
        let name = format!("{FORGOTTEN_PREFIX}{}.json", unique_id());
        self.put_record(&name, &record, changes)?;
        let still_it = match self.durable.get_bytes(&key) {
            Ok(now) => now == bytes,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e.into()),
        };
        if still_it {
            changes.next();
            self.durable.delete(&key)?;
        }
        Ok(true)
    }

    /// Forgets the checkpoints `selection` picks, then collects garbage (dry: reports what
    /// would go, changing nothing).
    pub fn prune(&self, selection: &PruneSelection, opts: &GcOptions) -> Result<PruneReport> {
        let manifests = self.manifests()?;
        // A checkpoint of several nodes is its manifest and its nodes' part manifests: they
        // are kept or forgotten together, as one checkpoint.
        let mut checkpoints: Vec<(u64, &str)> = Vec::new();
        for m in &manifests {
            let name = checkpoint_of(&m.checkpoint);
            match checkpoints.iter_mut().find(|(_, n)| *n == name) {
                Some(c) => c.0 = c.0.max(m.created_unix_ns),
                None => checkpoints.push((m.created_unix_ns, name)),
            }
        }
        checkpoints.sort();
        let forget: HashSet<String> = match selection {
            PruneSelection::KeepNewest(n) => {
                let cut = checkpoints.len().saturating_sub(*n);
                checkpoints[..cut].iter().map(|c| c.1.to_string()).collect()
            }
            PruneSelection::Checkpoints(names) => {
                let mut wanted = HashSet::new();
                for name in names {
                    let rel = cascade_durable::normalize_rel(name.trim_end_matches('/'))?;
                    if !checkpoints.iter().any(|c| c.1 == rel) {
                        return Err(Error::Invalid(format!(
                            "no checkpoint {rel} in the dedup repository"
                        )));
                    }
                    wanted.insert(rel);
                }
                wanted
            }
        };
        let (forgotten, kept): (Vec<&str>, Vec<&str>) = checkpoints
            .iter()
            .map(|c| c.1)
            .partition(|name| forget.contains(*name));
        let forgotten: Vec<String> = forgotten.into_iter().map(str::to_string).collect();
        let kept: Vec<String> = kept.into_iter().map(str::to_string).collect();
        let gone: Vec<Manifest> = manifests
            .iter()
            .filter(|m| forget.contains(checkpoint_of(&m.checkpoint)))
            .cloned()
            .collect();
        let mut changes = Changes::new(opts.before_change);
        if !opts.dry_run {
            for m in &gone {
                self.forget_with(&m.checkpoint, &mut changes)?;
            }
        }
        let pretend: &[Manifest] = if opts.dry_run { &gone } else { &[] };
        let gc = self.collect(opts, pretend, &mut changes)?;
        Ok(PruneReport {
            forgotten,
            kept,
            gc,
        })
    }

    /// Collects garbage: condemns the packs of forgotten checkpoints that no manifest names,
    /// and deletes condemned packs no open writer session may use (docs/dedup.md). Packs
    /// still waiting for a session are left for a later run.
    pub fn collect_garbage(&self, opts: &GcOptions) -> Result<GcReport> {
        self.collect(opts, &[], &mut Changes::new(opts.before_change))
    }

    /// The collection; `pretend` are manifests a dry run treats as forgotten.
    fn collect(
        &self,
        opts: &GcOptions,
        pretend: &[Manifest],
        changes: &mut Changes,
    ) -> Result<GcReport> {
        // This process's finished writers are not sessions to wait for.
        self.wait_session_ends();
        let mut run = Collection {
            repo: self,
            dry: opts.dry_run,
            changes,
            report: GcReport {
                dry_run: opts.dry_run,
                ..GcReport::default()
            },
        };
        let GcRecords {
            forgotten,
            mut condemned,
            orphaned,
        } = self.read_gc_records()?;
        run.condemn_forgotten(&forgotten, pretend, &mut condemned)?;
        let forgetting = run.finish_forgets(&forgotten, pretend)?;
        // 3. Open sessions, listed after every condemned record was written.
        let session_lease = opts.session_lease.unwrap_or(self.session_lease());
        let (open, expired) = self.open_sessions(session_lease)?;
        run.set_wait_sets(&mut condemned, &open)?;
        // 5. What the manifests name, read after the wait sets were checked: a session
        //    writes its manifest before it ends.
        let live = self.live_packs(&forgetting)?;
        let deleted = run.settle_condemned(condemned, &live, &open)?;
        run.delete_expired_sessions(&expired)?;
        self.forget_packs_in_memory(&deleted);
        let recorded = run.settle_orphans(orphaned, &open)?;
        if opts.orphans {
            run.sweep_orphans(session_lease, &recorded)?;
        }
        run.report.changes = run.changes.made;
        Ok(run.report)
    }

    /// Every pack an index object names now (reloading the index objects that changed); a
    /// pack the collector dropped from the index meanwhile may still be in it (a superset).
    fn indexed_packs(&self) -> Result<HashSet<Score>> {
        self.refresh_index()?;
        let index = self.index.read().map_err(|_| poisoned())?;
        Ok(index.packs.iter().copied().collect())
    }

    /// Writes a record as `gc/<name>` (JSON).
    fn put_record(&self, name: &str, record: &impl Serialize, changes: &mut Changes) -> Result<()> {
        let text = serde_json::to_vec_pretty(record).map_err(|e| Error::Invalid(e.to_string()))?;
        changes.next();
        self.durable
            .put_bytes(&self.key(&format!("gc/{name}")), &text)?;
        Ok(())
    }

    /// The records under `gc/` (a record deleted meanwhile by another collector is skipped).
    fn read_gc_records(&self) -> Result<GcRecords> {
        let mut records = GcRecords::default();
        for o in self.durable.list(&self.key("gc"))? {
            let name = o.path.rsplit('/').next().unwrap_or("").to_string();
            let kind = [FORGOTTEN_PREFIX, CONDEMNED_PREFIX, ORPHANED_PREFIX]
                .iter()
                .position(|prefix| name.starts_with(prefix));
            let Some(kind) = kind else {
                continue;
            };
            let bytes = match self.durable.get_bytes(&o.path) {
                Ok(b) => b,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            let bad = |e: serde_json::Error| format_error(&o.path, e);
            match kind {
                0 => records
                    .forgotten
                    .push((name, serde_json::from_slice(&bytes).map_err(bad)?)),
                1 => records
                    .condemned
                    .push((name, serde_json::from_slice(&bytes).map_err(bad)?)),
                _ => records
                    .orphaned
                    .push((name, serde_json::from_slice(&bytes).map_err(bad)?)),
            }
        }
        Ok(records)
    }

    /// Sessions renewed within `lease` (ids), and the keys of those that were not.
    fn open_sessions(&self, lease: Duration) -> Result<(HashSet<String>, Vec<String>)> {
        let now = cascade_durable::now_unix_ns();
        let lease_ns = u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX);
        let mut open = HashSet::new();
        let mut expired = Vec::new();
        for o in self.durable.list(&self.key("sessions"))? {
            let bytes = match self.durable.get_bytes(&o.path) {
                Ok(b) => b,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            let s: SessionRecord =
                serde_json::from_slice(&bytes).map_err(|e| format_error(&o.path, e))?;
            if now.saturating_sub(s.refreshed_unix_ns) > lease_ns {
                expired.push(o.path);
            } else {
                open.insert(s.id);
            }
        }
        Ok((open, expired))
    }

    /// Every pack a manifest names, but those being forgotten ((checkpoint, created)).
    fn live_packs(&self, forgetting: &HashSet<(String, u64)>) -> Result<HashSet<Score>> {
        let mut live = HashSet::new();
        for o in self.durable.list(&self.key("manifests"))? {
            let Some((m, _)) = self.read_manifest_object(&o.path)? else {
                continue;
            };
            if forgetting.contains(&(m.checkpoint.clone(), m.created_unix_ns)) {
                continue;
            }
            live.extend(self.pack_set_of(&m)?.into_values().flatten());
        }
        Ok(live)
    }

    /// The names of the index objects by origin.
    fn index_versions(&self) -> Result<HashMap<Score, Vec<String>>> {
        let mut versions: HashMap<Score, Vec<String>> = HashMap::new();
        for o in self.durable.list(&self.key("index"))? {
            let name = o.path.rsplit('/').next().unwrap_or("").to_string();
            let (origin, _) = parse_index_name(&name)
                .ok_or_else(|| format_error(&o.path, "not an index object name"))?;
            versions.entry(origin).or_default().push(name);
        }
        Ok(versions)
    }

    /// Rewrites index object `origin` without `dead`: the new version is written, then the
    /// old ones deleted (a reader seeing both takes the packs every version names). True if
    /// anything changed.
    fn drop_packs_from_index(
        &self,
        origin: &Score,
        dead: &BTreeSet<Score>,
        versions: &mut HashMap<Score, Vec<String>>,
        changes: &mut Changes,
    ) -> Result<bool> {
        let Some(names) = versions.get(origin).cloned() else {
            return Ok(false);
        };
        let mut contents = Vec::with_capacity(names.len());
        for name in &names {
            let (_, packs) = self.read_index_object(&self.key(&format!("index/{name}")), name)?;
            contents.push(packs);
        }
        let ids = |packs: &[(Score, Vec<BlobEntry>)]| -> Vec<Score> {
            packs.iter().map(|(id, _)| *id).collect()
        };
        let version_ids: Vec<Vec<Score>> = contents.iter().map(|c| ids(c)).collect();
        let wanted: IndexPacks = common_packs(contents)
            .into_iter()
            .filter(|(id, _)| !dead.contains(id))
            .collect();
        let wanted_ids = ids(&wanted);
        let target = if wanted.is_empty() {
            None
        } else if let Some(i) = version_ids.iter().position(|v| *v == wanted_ids) {
            Some(names[i].clone())
        } else {
            let bytes = format::encode_index(&wanted);
            let name = format!("{}-{}", to_hex(origin), to_hex(&score(&bytes)));
            changes.next();
            self.durable.put_buffers(
                &self.key(&format!("index/{name}")),
                vec![Bytes::from(bytes)],
            )?;
            Some(name)
        };
        let mut changed = target.as_ref().is_some_and(|t| !names.contains(t));
        for name in &names {
            if Some(name) != target.as_ref() {
                changes.next();
                self.durable.delete(&self.key(&format!("index/{name}")))?;
                changed = true;
            }
        }
        versions.insert(*origin, target.into_iter().collect());
        Ok(changed)
    }

    /// Size of pack `id`; None if it is gone.
    fn pack_bytes(&self, id: &Score) -> Result<Option<u64>> {
        match self.durable.size(&self.pack_key(id)) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Drops the blobs of deleted packs from the loaded index; a blob whose copy in use went
    /// switches to another copy this index knows (any other is found again at the next
    /// refresh).
    fn forget_packs_in_memory(&self, deleted: &HashSet<Score>) {
        if deleted.is_empty() {
            return;
        }
        let Ok(mut index) = self.index.write().map_err(|_| poisoned()) else {
            return;
        };
        let gone: HashSet<u32> = index
            .packs
            .iter()
            .enumerate()
            .filter(|(_, p)| deleted.contains(*p))
            .map(|(i, _)| i as u32)
            .collect();
        index.forget_packs(&gone);
    }
}

/// One collection's steps over the condemned records (docs/dedup.md): what they change
/// and what they report.
struct Collection<'a, 'h> {
    repo: &'a Repo,
    /// Change nothing: work out and report.
    dry: bool,
    changes: &'a mut Changes<'h>,
    report: GcReport,
}

/// What step 6 gathers across the condemned records.
#[derive(Default)]
struct Settled {
    /// The index objects' names by origin, listed once the first record deletes packs.
    versions: Option<HashMap<Score, Vec<String>>>,
    /// Packs a manifest names again, counted once.
    counted_kept: HashSet<Score>,
    /// Dead packs of records that wait for open sessions.
    waiting_packs: HashSet<Score>,
    waited_for: HashSet<String>,
    /// Packs deleted (dry: that would be).
    deleted: HashSet<Score>,
}

impl Collection<'_, '_> {
    /// 1. Forgotten records no condemned record took up yet become one (candidates).
    fn condemn_forgotten(
        &mut self,
        forgotten: &[(String, ForgottenRecord)],
        pretend: &[Manifest],
        condemned: &mut Vec<(String, CondemnedRecord)>,
    ) -> Result<()> {
        let taken: HashSet<&str> = condemned
            .iter()
            .flat_map(|(_, c)| c.forgotten.iter().map(String::as_str))
            .collect();
        let mut candidates = PackSet::new();
        let mut fresh = Vec::new();
        for (name, f) in forgotten {
            if !taken.contains(name.as_str()) {
                super::session::merge(&mut candidates, &set_of(&f.packs)?);
                fresh.push(name.clone());
            }
        }
        for m in pretend {
            super::session::merge(&mut candidates, &self.repo.pack_set_of(m)?);
        }
        self.report.forgotten_taken = (fresh.len() + pretend.len()) as u64;
        if !candidates.is_empty() || !fresh.is_empty() {
            let record = CondemnedRecord {
                format: CONDEMNED_FORMAT.to_string(),
                created_unix_ns: cascade_durable::now_unix_ns(),
                forgotten: fresh,
                packs: groups_of(&candidates),
                waiting_for: None,
            };
            let name = format!("{CONDEMNED_PREFIX}{}.json", unique_id());
            if !self.dry {
                self.repo.put_record(&name, &record, self.changes)?;
            }
            condemned.push((name, record));
        }
        Ok(())
    }

    /// 2. Finish the forgets (a forget killed between its two steps left its manifest),
    ///    then drop the forgotten records: a condemned record holds their packs now.
    ///    Returns the manifests being forgotten, as (checkpoint, created).
    fn finish_forgets(
        &mut self,
        forgotten: &[(String, ForgottenRecord)],
        pretend: &[Manifest],
    ) -> Result<HashSet<(String, u64)>> {
        let repo = self.repo;
        let mut forgetting: HashSet<(String, u64)> = pretend
            .iter()
            .map(|m| (m.checkpoint.clone(), m.created_unix_ns))
            .collect();
        for (name, f) in forgotten {
            forgetting.insert((f.checkpoint.clone(), f.manifest_created_unix_ns));
            if self.dry {
                continue;
            }
            let key = repo.manifest_key(&f.checkpoint)?;
            if let Some((m, _)) = repo.read_manifest_object(&key)? {
                if m.created_unix_ns == f.manifest_created_unix_ns {
                    self.changes.next();
                    repo.durable.delete(&key)?;
                }
            }
            self.changes.next();
            repo.durable.delete(&repo.key(&format!("gc/{name}")))?;
        }
        Ok(forgetting)
    }

    /// 4. A record's wait set: the sessions open after it was written. A session that
    ///    started later loaded it and never dedups against its packs.
    fn set_wait_sets(
        &mut self,
        condemned: &mut [(String, CondemnedRecord)],
        open: &HashSet<String>,
    ) -> Result<()> {
        for (name, c) in condemned.iter_mut() {
            if c.waiting_for.is_none() {
                let mut ids: Vec<String> = open.iter().cloned().collect();
                ids.sort();
                c.waiting_for = Some(ids);
                if !self.dry {
                    self.repo.put_record(name, c, self.changes)?;
                }
            }
        }
        Ok(())
    }

    /// 6. Each record, oldest first; returns the packs deleted (dry: that would be).
    fn settle_condemned(
        &mut self,
        mut condemned: Vec<(String, CondemnedRecord)>,
        live: &HashSet<Score>,
        open: &HashSet<String>,
    ) -> Result<HashSet<Score>> {
        condemned.sort_by(|a, b| a.0.cmp(&b.0));
        let mut settled = Settled::default();
        for (name, c) in condemned {
            self.settle_record(&name, c, live, open, &mut settled)?;
        }
        self.report.packs_waiting =
            settled.waiting_packs.difference(&settled.deleted).count() as u64;
        self.report.sessions_waited_for = settled.waited_for.len() as u64;
        Ok(settled.deleted)
    }

    /// One condemned record: its packs no manifest names are deleted, unless a session of
    /// its wait set is still open.
    fn settle_record(
        &mut self,
        name: &str,
        mut c: CondemnedRecord,
        live: &HashSet<Score>,
        open: &HashSet<String>,
        settled: &mut Settled,
    ) -> Result<()> {
        let set = set_of(&c.packs)?;
        let dead = self.dead_packs(&set, live, settled)?;
        let waiting: Vec<&String> = c
            .waiting_for
            .iter()
            .flatten()
            .filter(|s| open.contains(*s))
            .collect();
        if !waiting.is_empty() {
            settled.waited_for.extend(waiting.into_iter().cloned());
            settled
                .waiting_packs
                .extend(dead.values().flatten().copied());
            if !self.dry && dead != set {
                // Packs a manifest names again are no longer condemned.
                c.packs = groups_of(&dead);
                self.repo.put_record(name, &c, self.changes)?;
            }
            return Ok(());
        }
        if self.dry {
            for p in dead.values().flatten() {
                if settled.deleted.insert(*p) {
                    self.report.packs_deleted += 1;
                    self.report.bytes_freed += self.repo.pack_bytes(p)?.unwrap_or(0);
                }
            }
            return Ok(());
        }
        self.delete_condemned(name, &dead, settled)
    }

    /// The packs of `set` no manifest names; counts those a manifest names again as
    /// unreclaimed (once each).
    fn dead_packs(
        &mut self,
        set: &PackSet,
        live: &HashSet<Score>,
        settled: &mut Settled,
    ) -> Result<PackSet> {
        let mut dead = PackSet::new();
        for (origin, packs) in set {
            for p in packs {
                if live.contains(p) {
                    if settled.counted_kept.insert(*p) {
                        self.report.packs_unreclaimed += 1;
                        self.report.bytes_unreclaimed += self.repo.pack_bytes(p)?.unwrap_or(0);
                    }
                } else {
                    dead.entry(*origin).or_default().insert(*p);
                }
            }
        }
        Ok(dead)
    }

    /// Deletes a record's dead packs: index objects first (a reopened repository never
    /// lists a deleted pack), then the packs, then the record.
    fn delete_condemned(
        &mut self,
        name: &str,
        dead: &PackSet,
        settled: &mut Settled,
    ) -> Result<()> {
        let repo = self.repo;
        if !dead.is_empty() && settled.versions.is_none() {
            settled.versions = Some(repo.index_versions()?);
        }
        if let Some(versions) = settled.versions.as_mut() {
            for (origin, packs) in dead {
                if repo.drop_packs_from_index(origin, packs, versions, self.changes)? {
                    self.report.index_objects_rewritten += 1;
                }
            }
        }
        for p in dead.values().flatten() {
            if let Some(bytes) = repo.pack_bytes(p)? {
                self.changes.next();
                repo.durable.delete(&repo.pack_key(p))?;
                self.report.packs_deleted += 1;
                self.report.bytes_freed += bytes;
            }
            settled.deleted.insert(*p);
        }
        self.changes.next();
        repo.durable.delete(&repo.key(&format!("gc/{name}")))?;
        Ok(())
    }

    /// 7. Session objects of writers that died (their lease ran out).
    fn delete_expired_sessions(&mut self, expired: &[String]) -> Result<()> {
        if !self.dry {
            for key in expired {
                self.changes.next();
                self.repo.durable.delete(key)?;
            }
            self.report.sessions_expired = expired.len() as u64;
        }
        Ok(())
    }

    /// 8. Deletes the packs of orphan records whose sessions all ended and that no index
    ///    names now; returns the packs the records still hold (dry: all of them), which a
    ///    sweep does not record again.
    fn settle_orphans(
        &mut self,
        records: Vec<(String, OrphanedRecord)>,
        open: &HashSet<String>,
    ) -> Result<HashSet<Score>> {
        let repo = self.repo;
        let mut recorded = HashSet::new();
        let held = |r: &OrphanedRecord| r.waiting_for.iter().any(|s| open.contains(s));
        // Records whose sessions all ended: whatever no index names now never will be.
        let indexed = if records.iter().any(|(_, r)| !held(r)) {
            repo.indexed_packs()?
        } else {
            HashSet::new()
        };
        for (name, record) in records {
            let packs: Vec<Score> = record
                .packs
                .iter()
                .map(|p| parse_score(p))
                .collect::<Result<_>>()?;
            if held(&record) {
                self.report.orphans_waiting += packs.len() as u64;
                recorded.extend(packs);
                continue;
            }
            for p in packs.iter().filter(|p| !indexed.contains(*p)) {
                if let Some(bytes) = repo.pack_bytes(p)? {
                    if !self.dry {
                        self.changes.next();
                        repo.durable.delete(&repo.pack_key(p))?;
                    }
                    self.report.orphans_deleted += 1;
                    self.report.orphan_bytes_freed += bytes;
                }
            }
            if self.dry {
                recorded.extend(packs);
            } else {
                self.changes.next();
                repo.durable.delete(&repo.key(&format!("gc/{name}")))?;
            }
        }
        Ok(recorded)
    }

    /// 9. (`orphans`) Records the packs no index names and no record holds, with the
    ///    sessions open now, for a later run.
    fn sweep_orphans(&mut self, session_lease: Duration, recorded: &HashSet<Score>) -> Result<()> {
        let repo = self.repo;
        // Packs first, then sessions, then the index: a pack listed here whose writer is not
        // open any more was indexed before its session ended, or never will be.
        let mut listed = Vec::new();
        for o in repo.durable.list(&repo.key("packs"))? {
            // Anything else there is not this repository's to delete.
            if let Ok(id) = parse_score(o.path.rsplit('/').next().unwrap_or("")) {
                listed.push(id);
            }
        }
        let (open_now, _) = repo.open_sessions(session_lease)?;
        let indexed = repo.indexed_packs()?;
        let mut orphans: Vec<String> = listed
            .iter()
            .filter(|p| !indexed.contains(*p) && !recorded.contains(*p))
            .map(to_hex)
            .collect();
        orphans.sort();
        self.report.orphans_found = orphans.len() as u64;
        if orphans.is_empty() || self.dry {
            return Ok(());
        }
        let mut waiting_for: Vec<String> = open_now.into_iter().collect();
        waiting_for.sort();
        let record = OrphanedRecord {
            format: ORPHANED_FORMAT.to_string(),
            created_unix_ns: cascade_durable::now_unix_ns(),
            packs: orphans,
            waiting_for,
        };
        let name = format!("{ORPHANED_PREFIX}{}.json", unique_id());
        repo.put_record(&name, &record, self.changes)
    }
}
