//! Dedup repository objects staged as files (docs/dedup.md, "Through staging servers",
//! packs): an agent that built a checkpoint's packs, index object and manifest itself
//! stages them here under their keys in the repository (`<ns>/.cascade-dedup/packs/..`,
//! `index/..`, `manifests/..`) and pushes the list. They drain as they are, one PUT each:
//! content-addressed objects have no versions and no checksum objects. Packs drain at once;
//! the index object and the manifest are held until every pack the push lists is in the
//! durable store, then written in that order, so the repository's crash-safe order (packs,
//! index, manifest) holds whatever this server's fate.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_dedup::repo::{
    Error as RepoError, Hold, Manifest as RepoManifest, Repo, DEFAULT_PREFIX,
};

use super::{lock, Shared};
use crate::engine::{Manifest, VersionInfo};
use crate::{hex, ServerError as Error, ServerResult as Result};

/// What this server knows of the pushes of repository objects beyond its arena. In memory
/// only: after a restart every pending push is checked before its manifest is written.
#[derive(Default)]
pub(super) struct RepositoryPushes {
    /// When each push (by id) arrived.
    received: HashMap<u64, Instant>,
    /// Checkpoints (namespaced manifest keys) whose manifest was refused, and why: Pull
    /// answers Unknown for them, so their agent stores them itself.
    refused: HashMap<String, String>,
    /// Per repository prefix, how long after its arrival a push's manifest is written
    /// unchecked ([`Repo::staged_manifest_trusted`], from the lease the repository recorded).
    trust_windows: HashMap<String, Duration>,
}

impl RepositoryPushes {
    pub(super) fn received(&mut self, push: u64, checkpoint: String) {
        self.received.insert(push, Instant::now());
        self.refused.remove(&checkpoint);
    }

    pub(super) fn refused(&self, checkpoint: &str) -> bool {
        self.refused.contains_key(checkpoint)
    }

    fn done(&mut self, push: u64, checkpoint: &str) {
        self.received.remove(&push);
        self.refused.remove(checkpoint);
    }
}

/// What a key below a repository's prefix holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RepositoryObject {
    /// `packs/<hh>/<id>`: drains at once.
    Pack,
    /// `index/<id>`: held until its push's packs are durable.
    Index,
    /// `manifests/<checkpoint>.json`: held, written last.
    Manifest,
}

impl RepositoryObject {
    /// Index objects and manifests wait for their push (complete_repository_push).
    pub(super) fn held(self) -> bool {
        self != RepositoryObject::Pack
    }
}

/// The repository object `key` names (`[<namespace>/]<prefix>/<packs|index|manifests>/...`),
/// and where the repository's prefix ends in it; None for any other key (a plain file).
pub(super) fn repository_object(key: &str) -> Option<(RepositoryObject, usize)> {
    let at = if key.starts_with(DEFAULT_PREFIX) {
        0
    } else {
        key.find(&format!("/{DEFAULT_PREFIX}/"))? + 1
    };
    let prefix_end = at + DEFAULT_PREFIX.len();
    let rest = key[prefix_end..].strip_prefix('/')?;
    let kind = if rest.starts_with("packs/") {
        RepositoryObject::Pack
    } else if rest.starts_with("index/") {
        RepositoryObject::Index
    } else if rest.starts_with("manifests/") && rest.ends_with(".json") {
        RepositoryObject::Manifest
    } else {
        return None;
    };
    Some((kind, prefix_end))
}

/// Packs and index objects are named by the BLAKE3 of their bytes: a staged one whose bytes
/// hash to another name is refused (it would overwrite an object others rely on).
pub(super) fn check_name(kind: RepositoryObject, key: &str, blake3: &str) -> Result<()> {
    let name = key.rsplit('/').next().unwrap_or(key);
    // A rewritten index object is `<origin>-<id>`; the id is the bytes' hash.
    let id = name.rsplit('-').next().unwrap_or(name);
    if kind == RepositoryObject::Manifest || id == blake3 {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{key}: a repository object whose bytes hash to {blake3}, not to its name; not drained"
    )))
}

/// The repository prefix of a push of repository objects: its checkpoint is the manifest's
/// key, and its files are named relative to that prefix.
pub(super) fn repository_push(m: &Manifest) -> Option<&str> {
    match repository_object(&m.checkpoint) {
        Some((RepositoryObject::Manifest, prefix_end)) => Some(&m.checkpoint[..prefix_end]),
        _ => None,
    }
}

impl Shared {
    /// Completes push `id` of repository objects (`prefix`: its repository) once every
    /// pack it lists is in the durable store (drained here, or there already): writes the
    /// held index object, then the manifest, and records the push done. False while packs
    /// are still draining.
    pub(super) fn complete_repository_push(
        &self,
        id: u64,
        m: &Manifest,
        prefix: &str,
    ) -> Result<bool> {
        let mut held: Vec<(VersionInfo, RepositoryObject)> = Vec::new();
        for f in &m.files {
            let key = format!("{prefix}/{}", f.path);
            let Some((kind, _)) = repository_object(&key) else {
                return Err(Error::Invalid(format!(
                    "push of {}: {key} is not a repository object",
                    m.checkpoint
                )));
            };
            let current = self.engine.lookup(&key);
            match current.filter(|v| v.blake3 == f.blake3) {
                Some(v) if kind.held() => held.push((v, kind)),
                Some(v) if v.drained => {}
                // A pack still draining here.
                Some(_) => return Ok(false),
                None if kind == RepositoryObject::Manifest => {
                    if self.engine.lookup(&key).is_none() {
                        return Err(Error::Invalid(format!(
                            "push of {}: its manifest is not staged here",
                            m.checkpoint
                        )));
                    }
                    // A newer version of the checkpoint was staged since: its own push
                    // writes the name.
                    self.engine.mark_manifest_done(id)?;
                    lock(&self.repository_pushes).done(id, &m.checkpoint);
                    self.log(|| format!("{}: superseded before it was written", m.checkpoint));
                    return Ok(false);
                }
                // Staged on another server (an earlier checkpoint's pack or index object
                // that this one's blobs are in): there once that server wrote it. Names are
                // content-addressed, so any object of the name holds these bytes.
                None => {
                    if self.durable.size(&key).is_err() {
                        return Ok(false);
                    }
                }
            }
        }
        // Written index objects first, then the manifest, whatever order the list had.
        let (manifest, index_objects): (Vec<_>, Vec<_>) = held
            .into_iter()
            .filter(|(v, _)| !v.drained)
            .partition(|(_, kind)| *kind == RepositoryObject::Manifest);
        let manifest = manifest.into_iter().next().map(|(v, _)| v);
        let index_objects: Vec<VersionInfo> = index_objects.into_iter().map(|(v, _)| v).collect();
        if lock(&self.repository_pushes).refused(&m.checkpoint) {
            let unwritten = index_objects.iter().chain(&manifest);
            return self.settle_refused(id, m, manifest.as_ref(), unwritten);
        }
        let mut hold = None;
        if let Some(v) = manifest.as_ref() {
            if !self.trusted(id, prefix)? {
                match self.check_staged_manifest(prefix, m, v)? {
                    Ok(checked) => hold = Some(checked),
                    Err(why) => {
                        // Nor its index objects: a delta blob of its packs may have its base
                        // in a deleted pack. Its packs are orphaned packs (prune --orphans).
                        self.fail(format!(
                            "{}: {why} (refused here: its agent stores the checkpoint itself)",
                            m.checkpoint
                        ));
                        lock(&self.repository_pushes)
                            .refused
                            .insert(m.checkpoint.clone(), why);
                        return Ok(true);
                    }
                }
            }
        }
        let written = index_objects
            .iter()
            .chain(&manifest)
            .try_for_each(|v| self.upload(v));
        if let Some((repo, hold)) = hold {
            hold.end(&repo);
        }
        written?;
        self.engine.mark_manifest_done(id)?;
        lock(&self.repository_pushes).done(id, &m.checkpoint);
        self.log(|| format!("repository manifest {} written", m.checkpoint));
        Ok(true)
    }

    /// Whether push `id`'s manifest may be written unchecked: it arrived here less than
    /// [`Repo::staged_manifest_trusted`] ago, so the session of the writer that prepared it
    /// still keeps its packs from garbage collection, even if that writer died since. The
    /// repository's lease is read once per prefix (one GET of its config).
    fn trusted(&self, id: u64, prefix: &str) -> Result<bool> {
        let pushes = lock(&self.repository_pushes);
        let Some(arrived) = pushes.received.get(&id).copied() else {
            return Ok(false);
        };
        if let Some(window) = pushes.trust_windows.get(prefix) {
            return Ok(arrived.elapsed() < *window);
        }
        drop(pushes);
        let Some(repo) = Repo::open_for_maintenance(Arc::clone(&self.durable), prefix)? else {
            return Ok(false);
        };
        let window = repo.staged_manifest_trusted();
        lock(&self.repository_pushes)
            .trust_windows
            .insert(prefix.to_string(), window);
        Ok(arrived.elapsed() < window)
    }

    fn upload(&self, v: &VersionInfo) -> Result<()> {
        let one_request = v.size <= cascade_durable::SINGLE_PUT_MAX;
        self.upload_whole(v, one_request, Instant::now())
    }

    /// Checks the staged manifest `v` of push `m` against garbage collection
    /// ([`Repo::check_staged_manifest`]): the hold to end after writing it, or why it must
    /// not be written. The packs the push lists are in the durable store already.
    fn check_staged_manifest(
        &self,
        prefix: &str,
        m: &Manifest,
        v: &VersionInfo,
    ) -> Result<std::result::Result<(Repo, Hold), String>> {
        let mapped = self.engine.map_version(v.id)?;
        mapped.verify()?;
        let manifest: RepoManifest = match serde_json::from_slice(&mapped.parts().concat()) {
            Ok(manifest) => manifest,
            Err(e) => return Ok(Err(format!("it is not a dedup manifest ({e})"))),
        };
        let Some(repo) = Repo::open_for_maintenance(Arc::clone(&self.durable), prefix)? else {
            return Ok(Err(format!(
                "the durable store has no dedup repository at {prefix}"
            )));
        };
        let present: HashSet<String> = m
            .files
            .iter()
            .filter(|f| f.path.starts_with("packs/"))
            .filter_map(|f| f.path.rsplit('/').next())
            .map(str::to_string)
            .collect();
        match repo.check_staged_manifest(&manifest, &present) {
            Ok(hold) => Ok(Ok((repo, hold))),
            Err(RepoError::Conflict(why)) => Ok(Err(why)),
            Err(e) => Err(e.into()),
        }
    }

    /// Push `id`, whose manifest was refused: done once a manifest of its checkpoint is in
    /// the durable store (its agent stored the checkpoint itself); its staged manifest and
    /// index objects (`unwritten`) then count as drained, to be reclaimed, unwritten.
    fn settle_refused<'v>(
        &self,
        id: u64,
        m: &Manifest,
        manifest: Option<&VersionInfo>,
        unwritten: impl Iterator<Item = &'v VersionInfo>,
    ) -> Result<bool> {
        if let Some(v) = manifest {
            match self.durable.size(&v.key) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
        for v in unwritten {
            self.engine.mark_drained(v.id)?;
            self.release_kept(v.id);
        }
        self.engine.mark_manifest_done(id)?;
        lock(&self.repository_pushes).done(id, &m.checkpoint);
        self.log(|| {
            format!(
                "{}: its manifest was written without this server (refused here)",
                m.checkpoint
            )
        });
        Ok(true)
    }

    /// The digest check of a drained repository object: its name, for packs and index
    /// objects.
    pub(super) fn check_repository_object(&self, v: &VersionInfo) -> Result<()> {
        match repository_object(&v.key) {
            Some((kind, _)) => check_name(kind, &v.key, &hex(&v.blake3)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_objects_are_told_by_their_place_below_the_prefix() {
        let cases = [
            (".cascade-dedup/packs/ab/abcd", Some(RepositoryObject::Pack)),
            (
                "job7/.cascade-dedup/index/ef01",
                Some(RepositoryObject::Index),
            ),
            (
                "job7/.cascade-dedup/manifests/run/ck.3.json",
                Some(RepositoryObject::Manifest),
            ),
            (".cascade-dedup/manifests/ck.3", None),
            (".cascade-dedup/sessions/1.json", None),
            ("ck.3/.cascade-dedup-x/packs/ab/cd", None),
            ("ck.3/model.pt", None),
            ("x.cascade-dedup/packs/ab/cd", None),
        ];
        for (key, want) in cases {
            assert_eq!(repository_object(key).map(|(k, _)| k), want, "{key}");
        }
        let (_, end) = repository_object("job7/.cascade-dedup/index/ef01").expect("index");
        assert_eq!(
            &"job7/.cascade-dedup/index/ef01"[..end],
            "job7/.cascade-dedup"
        );
    }

    #[test]
    fn a_pack_or_index_object_must_hash_to_its_name() {
        let pack = RepositoryObject::Pack;
        assert!(check_name(pack, "p/.cascade-dedup/packs/ab/abcd", "abcd").is_ok());
        assert!(check_name(pack, "p/.cascade-dedup/packs/ab/abcd", "abce").is_err());
        let index = RepositoryObject::Index;
        assert!(check_name(index, ".cascade-dedup/index/0f-abcd", "abcd").is_ok());
        assert!(check_name(index, ".cascade-dedup/index/abcd", "0000").is_err());
        let manifest = RepositoryObject::Manifest;
        assert!(check_name(manifest, ".cascade-dedup/manifests/c.json", "any").is_ok());
    }
}
