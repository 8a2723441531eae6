//! The engine's replayable state: versions, their extents, arenas with their live-byte
//! counters, manifests. Every change goes through `Model::apply(record)`, at run time and
//! at replay alike, so a recovered engine has exactly the state the records describe.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::sync::Arc;

use super::record::{FileRec, Record};
use super::{Manifest, ManifestFile, VersionId, VersionInfo};

/// How many done manifests (names only) the state keeps, so that a Pull Checkpoint for a
/// recently completed checkpoint still answers Durable: bounded, so that a server that
/// completes checkpoints for months neither grows its memory nor its index snapshot.
pub(crate) const DONE_KEPT: usize = 1024;

/// One append: `len` bytes of the version at `offset`, stored at `position` in `arena`.
pub(crate) struct Extent {
    pub offset: u64,
    pub len: u32,
    pub arena: u32,
    pub position: u64,
    pub crc: u32,
    /// Supplies at least one byte of the version. An extent whose whole range was already
    /// covered by earlier extents (a resend) is dead from the start: never read, not live.
    pub useful: bool,
}

/// A piece of a version's byte range served by one extent (earlier extents win overlaps).
pub(crate) struct View {
    pub len: u64,
    /// Index into `Version::extents`.
    pub ext: usize,
    /// Offset of the piece inside the extent.
    pub skip: u64,
}

pub(crate) struct Version {
    pub key: String,
    pub stamp: u64,
    pub size: u64,
    pub extents: Vec<Extent>,
    /// Version offset -> view; non-overlapping.
    pub views: BTreeMap<u64, View>,
    /// (BLAKE3, seal order).
    pub seal: Option<([u8; 32], u64)>,
    /// The writer's tag over the sealed version, if it sent one.
    pub tag: Option<[u8; 32]>,
    pub drained: bool,
    pub superseded: bool,
    /// Its extents no longer count as live (drained or superseded, and that is durable).
    pub released: bool,
}

#[derive(Default)]
pub(crate) struct Arena {
    /// Open handle (None during replay, before open() opens the file).
    pub file: Option<Arc<File>>,
    /// The same file opened with O_DIRECT, for appends (an active arena of an engine in
    /// direct mode only; reads, maps and fdatasync use `file`).
    pub direct: Option<Arc<File>>,
    /// Bytes in the file (at run time: reserved up to here).
    pub size: u64,
    /// Direct mode: the file's length as preallocated so far (`fallocate`), at least `size`
    /// once the preallocation asked for by `reserve` is done.
    pub allocated: u64,
    /// Bytes of useful extents of versions not released.
    pub live: u64,
    /// Appends reserved here whose pwrite has not finished.
    pub inflight: u32,
    /// A writer slot appends to it.
    pub active: bool,
    /// Version -> number of useful extents here: the versions to forget when it is deleted.
    pub refs: HashMap<u64, u32>,
}

#[derive(Default)]
struct KeyState {
    /// Versions of the key still in memory.
    ids: Vec<u64>,
    /// (stamp, id) of the newest sealed version, kept while the key has versions in
    /// memory even if that version itself was forgotten.
    current: Option<(u64, u64)>,
}

#[derive(Default)]
pub(crate) struct Model {
    pub versions: HashMap<u64, Version>,
    keys: HashMap<String, KeyState>,
    pub arenas: BTreeMap<u32, Arena>,
    /// id -> (manifest, done). A done manifest keeps only its name (its file list is
    /// dropped), and only the newest [`DONE_KEPT`] done ones are kept at all.
    pub manifests: BTreeMap<u64, (Manifest, bool)>,
    manifest_names: HashMap<String, u64>,
    /// Ids of the done manifests still in `manifests`, oldest first.
    done: BTreeSet<u64>,
    /// Seal order -> version: sealed, not drained, not superseded.
    drainable: BTreeMap<u64, u64>,
    pub pending_bytes: u64,
    pub next_version: u64,
    pub next_manifest: u64,
    pub next_arena: u32,
    seal_order: u64,
}

impl Model {
    /// Applies one record. Returns the versions that become garbage once this record is
    /// durable (superseded or drained): the caller releases them then (at replay, at once).
    pub fn apply(&mut self, rec: &Record) -> Vec<u64> {
        let mut garbage = Vec::new();
        match rec {
            Record::NewArena { arena } => {
                self.arenas.entry(*arena).or_default();
                self.next_arena = self.next_arena.max(arena.saturating_add(1));
            }
            Record::Version {
                id,
                stamp,
                size,
                key,
            } => {
                if self.versions.contains_key(id) {
                    return garbage;
                }
                self.versions.insert(
                    *id,
                    Version {
                        key: key.clone(),
                        stamp: *stamp,
                        size: *size,
                        extents: Vec::new(),
                        views: BTreeMap::new(),
                        seal: None,
                        tag: None,
                        drained: false,
                        superseded: false,
                        released: false,
                    },
                );
                self.keys.entry(key.clone()).or_default().ids.push(*id);
                self.next_version = self.next_version.max(id.saturating_add(1));
            }
            Record::Extent {
                id,
                offset,
                len,
                arena,
                position,
                crc,
            } => self.add_extent(*id, *offset, *len, *arena, *position, *crc),
            Record::Seal { id, blake3, tag } => {
                let Some(v) = self.versions.get_mut(id) else {
                    return garbage;
                };
                if v.seal.is_some() {
                    return garbage;
                }
                v.seal = Some((*blake3, self.seal_order));
                v.tag = *tag;
                let order = self.seal_order;
                self.seal_order += 1;
                let (stamp, size, drained) = (v.stamp, v.size, v.drained);
                let ks = self.keys.entry(v.key.clone()).or_default();
                let newer = match ks.current {
                    None => true,
                    Some(cur) => (stamp, *id) > cur,
                };
                if newer {
                    let old = ks.current.replace((stamp, *id));
                    if let Some((_, old_id)) = old {
                        if let Some(o) = self.versions.get_mut(&old_id) {
                            o.superseded = true;
                            self.undrainable(old_id);
                            garbage.push(old_id);
                        }
                    }
                    if !drained {
                        self.drainable.insert(order, *id);
                        self.pending_bytes += size;
                    }
                } else if let Some(v) = self.versions.get_mut(id) {
                    // Sealed after a newer stamp of the same key: garbage at once.
                    v.superseded = true;
                    garbage.push(*id);
                }
            }
            Record::Drained { id } => {
                let Some(v) = self.versions.get_mut(id) else {
                    return garbage;
                };
                if v.seal.is_none() || v.drained {
                    return garbage;
                }
                v.drained = true;
                self.undrainable(*id);
                garbage.push(*id);
            }
            Record::Manifest {
                id,
                single_file,
                checkpoint,
                files,
            } => {
                if let Some(old) = self.manifest_names.insert(checkpoint.clone(), *id) {
                    if old != *id {
                        self.manifests.remove(&old);
                        self.done.remove(&old);
                    }
                }
                let m = Manifest {
                    checkpoint: checkpoint.clone(),
                    single_file: *single_file,
                    files: files
                        .iter()
                        .map(|f| ManifestFile {
                            path: f.path.clone(),
                            size: f.size,
                            blake3: f.blake3,
                        })
                        .collect(),
                };
                self.manifests.insert(*id, (m, false));
                self.next_manifest = self.next_manifest.max(id.saturating_add(1));
            }
            Record::ManifestDone { id } => {
                if let Some(e) = self.manifests.get_mut(id) {
                    e.1 = true;
                    // Its files are in the durable store now: only the name is still
                    // answered (Pull Checkpoint -> Durable), and only for the newest done.
                    e.0.files = Vec::new();
                    self.done.insert(*id);
                }
                while self.done.len() > DONE_KEPT {
                    let Some(old) = self.done.pop_first() else {
                        break;
                    };
                    if let Some((m, _)) = self.manifests.remove(&old) {
                        if self.manifest_names.get(&m.checkpoint) == Some(&old) {
                            self.manifest_names.remove(&m.checkpoint);
                        }
                    }
                }
            }
            Record::ArenaDeleted { arena } => {
                self.delete_arena(*arena);
                self.next_arena = self.next_arena.max(arena.saturating_add(1));
            }
            Record::IdReserve {
                versions_below,
                manifests_below,
                arenas_below,
            } => {
                self.next_version = self.next_version.max(*versions_below);
                self.next_manifest = self.next_manifest.max(*manifests_below);
                self.next_arena = self.next_arena.max(*arenas_below);
            }
        }
        garbage
    }

    fn add_extent(&mut self, id: u64, offset: u64, len: u32, arena: u32, position: u64, crc: u32) {
        let Some(v) = self.versions.get_mut(&id) else {
            return;
        };
        let end = offset.saturating_add(u64::from(len));
        if v.seal.is_some() || v.released || end > v.size || len == 0 {
            return;
        }
        // The parts of offset..end no earlier extent covers. Views do not overlap, so only
        // the last view starting before `offset` can reach into the range.
        let mut gaps = Vec::new();
        let mut pos = offset;
        if let Some((&s, view)) = v.views.range(..offset).next_back() {
            pos = pos.max(s + view.len);
        }
        for (&s, view) in v.views.range(offset..end) {
            if s > pos {
                gaps.push((pos, s));
            }
            pos = pos.max(s + view.len);
        }
        if pos < end {
            gaps.push((pos, end));
        }
        let ext = v.extents.len();
        let useful = !gaps.is_empty();
        for (a, b) in gaps {
            v.views.insert(
                a,
                View {
                    len: b - a,
                    ext,
                    skip: a - offset,
                },
            );
        }
        v.extents.push(Extent {
            offset,
            len,
            arena,
            position,
            crc,
            useful,
        });
        let a = self.arenas.entry(arena).or_default();
        if useful {
            a.live += u64::from(len);
            *a.refs.entry(id).or_insert(0) += 1;
        }
        self.next_arena = self.next_arena.max(arena.saturating_add(1));
    }

    fn undrainable(&mut self, id: u64) {
        if let Some(v) = self.versions.get(&id) {
            if let Some((_, order)) = v.seal {
                if self.drainable.remove(&order).is_some() {
                    self.pending_bytes -= v.size;
                }
            }
        }
    }

    /// The version's extents stop counting as live; it stays readable until an arena it
    /// uses is deleted (or at once, if it has no data). Returns the arenas touched.
    pub fn release(&mut self, id: u64) -> Vec<u32> {
        let (touched, any) = self.release_extents(id);
        if !any {
            self.remove_version(id);
        }
        touched
    }

    /// (arenas touched, whether the version had any useful extent).
    fn release_extents(&mut self, id: u64) -> (Vec<u32>, bool) {
        self.undrainable(id);
        let Some(v) = self.versions.get_mut(&id) else {
            return (Vec::new(), true);
        };
        let any = v.extents.iter().any(|e| e.useful);
        if v.released {
            return (Vec::new(), any);
        }
        v.released = true;
        let mut touched = Vec::new();
        for e in v.extents.iter().filter(|e| e.useful) {
            if let Some(a) = self.arenas.get_mut(&e.arena) {
                a.live = a.live.saturating_sub(u64::from(e.len));
            }
            touched.push(e.arena);
        }
        touched.sort_unstable();
        touched.dedup();
        (touched, any)
    }

    /// Forgets a version (releasing it first). Returns the arenas touched.
    pub fn remove_version(&mut self, id: u64) -> Vec<u32> {
        let (touched, _) = self.release_extents(id);
        let Some(v) = self.versions.remove(&id) else {
            return touched;
        };
        for e in v.extents.iter().filter(|e| e.useful) {
            if let Some(a) = self.arenas.get_mut(&e.arena) {
                if let Some(n) = a.refs.get_mut(&id) {
                    *n -= 1;
                    if *n == 0 {
                        a.refs.remove(&id);
                    }
                }
            }
        }
        if let Some(ks) = self.keys.get_mut(&v.key) {
            ks.ids.retain(|&i| i != id);
            if ks.ids.is_empty() {
                self.keys.remove(&v.key);
            }
        }
        touched
    }

    /// Removes the arena and forgets every version with useful data in it.
    /// Returns the arena and the other arenas whose counters changed.
    pub fn delete_arena(&mut self, n: u32) -> Option<(Arena, Vec<u32>)> {
        let a = self.arenas.remove(&n)?;
        let mut touched = Vec::new();
        for &id in a.refs.keys() {
            touched.extend(self.remove_version(id));
        }
        touched.retain(|&t| t != n);
        Some((a, touched))
    }

    pub fn manifest_state(&self, checkpoint: &str) -> Option<bool> {
        let id = self.manifest_names.get(checkpoint)?;
        self.manifests.get(id).map(|(_, done)| *done)
    }

    /// The version of `key` with this stamp still in memory, if any.
    pub fn find(&self, key: &str, stamp: u64) -> Option<u64> {
        let ks = self.keys.get(key)?;
        ks.ids
            .iter()
            .copied()
            .find(|id| self.versions.get(id).is_some_and(|v| v.stamp == stamp))
    }

    /// The newest sealed version of `key`, if still in memory.
    pub fn current(&self, key: &str) -> Option<u64> {
        let (_, id) = self.keys.get(key)?.current?;
        self.versions.contains_key(&id).then_some(id)
    }

    pub fn info(&self, id: u64) -> Option<VersionInfo> {
        let v = self.versions.get(&id)?;
        let (blake3, _) = v.seal?;
        Some(VersionInfo {
            id: VersionId(id),
            key: v.key.clone(),
            stamp: v.stamp,
            size: v.size,
            blake3,
            tag: v.tag,
            drained: v.drained,
        })
    }

    pub fn drainable(&self) -> Vec<VersionInfo> {
        self.drainable
            .values()
            .filter_map(|&id| self.info(id))
            .collect()
    }

    pub fn live_versions(&self) -> u64 {
        self.drainable.len() as u64
    }

    /// First byte of 0..size no extent covers.
    pub fn missing_byte(&self, id: u64) -> Option<u64> {
        let v = self.versions.get(&id)?;
        let mut expect = 0;
        for (&s, view) in &v.views {
            if s > expect {
                return Some(expect);
            }
            expect = expect.max(s + view.len);
        }
        (expect < v.size).then_some(expect)
    }

    /// Calls `f` with every record of a snapshot of this state (without the IdReserve):
    /// replaying them gives the same versions (released ones are garbage and left out),
    /// views, seal order, drainable set and manifests.
    pub fn snapshot_records(&self, mut f: impl FnMut(&Record)) {
        let mut ids: Vec<u64> = self
            .versions
            .iter()
            .filter(|(_, v)| !v.released)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        let mut seals = Vec::new();
        for &id in &ids {
            let v = &self.versions[&id];
            f(&Record::Version {
                id,
                stamp: v.stamp,
                size: v.size,
                key: v.key.clone(),
            });
            // Dead extents are left out: they never changed the covered range, so the
            // remaining ones produce the same views.
            for e in v.extents.iter().filter(|e| e.useful) {
                f(&Record::Extent {
                    id,
                    offset: e.offset,
                    len: e.len,
                    arena: e.arena,
                    position: e.position,
                    crc: e.crc,
                });
            }
            if let Some((blake3, order)) = v.seal {
                seals.push((order, id, blake3, v.tag, v.drained));
            }
        }
        seals.sort_unstable_by_key(|s| s.0);
        for &(_, id, blake3, tag, _) in &seals {
            f(&Record::Seal { id, blake3, tag });
        }
        for &(_, id, _, _, drained) in &seals {
            if drained {
                f(&Record::Drained { id });
            }
        }
        for (&id, (m, done)) in &self.manifests {
            f(&manifest_record(id, m));
            if *done {
                f(&Record::ManifestDone { id });
            }
        }
    }
}

pub(crate) fn manifest_record(id: u64, m: &Manifest) -> Record {
    Record::Manifest {
        id,
        single_file: m.single_file,
        checkpoint: m.checkpoint.clone(),
        files: m
            .files
            .iter()
            .map(|f| FileRec {
                path: f.path.clone(),
                size: f.size,
                blake3: f.blake3,
            })
            .collect(),
    }
}
