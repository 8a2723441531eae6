//! Dedup through the staging servers as packs (`staging.dedup = packs`, the default;
//! docs/dedup.md, "Through staging servers"): the agent builds a checkpoint's packs, index
//! object and manifest exactly as when it writes the repository itself (levels/dedup.rs),
//! but stages them as files on one server under their keys in the repository, then pushes
//! their list. The server drains the packs as they are, then writes the index object and
//! the manifest (cascade-staging, server/repository.rs). The checkpoint is safe from the
//! loss of the node once the server synced them, and durable once it wrote the manifest;
//! until then this process's session keeps the packs its manifest names from garbage
//! collection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use cascade_dedup::adaptive::Measured;
use cascade_dedup::repo::{Manifest, ObjectSink, Repo, WriteStats, DEFAULT_PREFIX};
use cascade_dedup::score;
use cascade_durable::DurableKey;
use cascade_store::LifeEntry;
use cascade_wire::client::OutSegment;
use cascade_wire::protocol::{Level as WireLevel, PullKind, PushFile, MAX_DATA};

use super::{give_up, Pushed, StagedDedup};
use crate::deltas::{deltas_note, PreviousVersion};
use crate::level::Step;
use crate::levels::dedup::{add_checkpoint_files, single_file};
use crate::node::{files_of, Checkpoint, Node, Reached};
use crate::servers::{lock, ServerPool};
use crate::{Error, Result};

/// An object staged on a server (its key below the durable store's root).
#[derive(Clone)]
pub(super) struct StagedObject {
    key: String,
    size: u64,
    blake3: [u8; 32],
}

impl StagedObject {
    /// Packs and index objects: what a later checkpoint's blobs may be in.
    fn holds_blobs(&self) -> bool {
        !self.key.contains(&format!("{DEFAULT_PREFIX}/manifests/"))
    }
}

/// A checkpoint staged as packs whose manifest the server has not written yet.
pub(super) struct PendingPush {
    server: usize,
    /// The manifest's key: the push's name on the server.
    key: String,
    manifest: Manifest,
    /// The repository whose parked session keeps the manifest's packs.
    repo: Arc<Repo>,
    objects: Vec<StagedObject>,
}

/// Pending pushes by manifest name.
pub(super) type PendingPushes = Mutex<HashMap<String, PendingPush>>;

/// Writes a writer's repository objects to one staging server, as files of their keys.
struct ServerSink {
    pool: Arc<ServerPool>,
    server: usize,
    stamp: u64,
    staged: Mutex<Vec<StagedObject>>,
}

impl ServerSink {
    /// Waits until the server holds every object on its SSD (a Sync), then checks that it
    /// holds each of them (a Pull: a connection made again in between would have lost
    /// writes); the objects.
    fn finish(&self) -> Result<Vec<StagedObject>> {
        let staged = std::mem::take(&mut *lock(&self.staged));
        let queries: Vec<(PullKind, &str)> = staged
            .iter()
            .map(|o| (PullKind::File, o.key.as_str()))
            .collect();
        let states = self
            .pool
            .with_bulk_conn(self.server, |c| {
                c.sync()?;
                c.pull(&queries)
            })
            .map_err(|e| self.pool.error(self.server, e))?;
        if let Some(o) = staged.iter().zip(&states).find_map(|(o, st)| {
            (st.level == WireLevel::Unknown || st.blake3 != o.blake3).then_some(o)
        }) {
            return Err(Error::io(
                format!("staging server {}", self.pool.addr(self.server)),
                std::io::Error::other(format!("{} was sent but is not staged there", o.key)),
            ));
        }
        Ok(staged)
    }
}

impl ObjectSink for ServerSink {
    fn put(&self, key: &str, parts: Vec<Bytes>) -> cascade_dedup::repo::Result<()> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let blake3 = named_digest(key).unwrap_or_else(|| {
            let mut hasher = blake3::Hasher::new();
            for p in &parts {
                hasher.update(p);
            }
            *hasher.finalize().as_bytes()
        });
        let mut pieces: Vec<&[u8]> = parts.iter().flat_map(|p| p.chunks(MAX_DATA)).collect();
        if pieces.is_empty() {
            pieces.push(&[]);
        }
        self.pool
            .with_bulk_conn(self.server, |c| {
                let seal = c.seal(key, self.stamp, size, blake3);
                let mut offset = 0u64;
                let last = pieces.len() - 1;
                for (i, piece) in pieces.iter().enumerate() {
                    c.write(&[OutSegment {
                        key,
                        stamp: self.stamp,
                        size,
                        offset,
                        seal: (i == last).then_some(seal),
                        data: &[piece],
                    }])?;
                    offset += piece.len() as u64;
                }
                Ok(())
            })
            .map_err(|e| {
                cascade_dedup::repo::Error::Io(std::io::Error::other(format!(
                    "staging server {}: {e}",
                    self.pool.addr(self.server)
                )))
            })?;
        lock(&self.staged).push(StagedObject {
            key: key.to_string(),
            size,
            blake3,
        });
        Ok(())
    }
}

/// Packs and index objects are named by the BLAKE3 of their bytes (the writer hashed them
/// already); the server checks it.
fn named_digest(key: &str) -> Option<[u8; 32]> {
    let name = key.rsplit('/').next()?;
    let id = name.rsplit('-').next()?;
    let holds_blobs = key.contains(&format!("{DEFAULT_PREFIX}/packs/"))
        || key.contains(&format!("{DEFAULT_PREFIX}/index/"));
    holds_blobs.then(|| cascade_wire::unhex(id)).flatten()
}

impl StagedDedup {
    /// The server this node stages its packs on: one per node, so that a checkpoint's
    /// packs and the earlier ones its blobs are in drain from one place; the next one up
    /// if it is down.
    fn packs_server(&self) -> Option<usize> {
        let home = self.pool.owner_of(&score(self.pool.opts.node.as_bytes()));
        self.pool.next_up(home, &[])
    }

    /// Stages checkpoint `root` as packs, index object and manifest on a server and pushes
    /// them; records its files staged and the checkpoint pushed. False if it changed
    /// meanwhile.
    pub(super) fn stage_packs(
        &self,
        node: &Node,
        root: &LifeEntry,
        previous: Option<&Checkpoint>,
    ) -> Result<bool> {
        let started = Instant::now();
        let Some(tree) = node.closed_checkpoint(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = files_of(&tree).collect();
        let Some(repo) = self.repository.get()? else {
            return Ok(false);
        };
        let Some(server) = self.packs_server() else {
            return Err(Error::io(
                "staging",
                std::io::Error::other("no staging server is up"),
            ));
        };
        let ckpt = DurableKey::from_store_path(&now_root.path);
        let (name, _) = self.repository.stored_name(now_root, &ckpt);
        // A plain marker of an earlier drain would be read instead of the new manifest.
        node.durable.delete_marker(&ckpt).map_err(Error::Durable)?;
        let previous = previous
            .filter(|_| self.repository.deltas())
            .and_then(|p| self.repository.previous_version(&repo, p));
        let compression = self.repository.compression();
        let sink = Arc::new(ServerSink {
            pool: Arc::clone(&self.pool),
            server,
            stamp: cascade_durable::now_unix_ns(),
            staged: Mutex::new(Vec::new()),
        });
        let writer = repo
            .writer()
            .with_compression(compression)
            .with_sink(Arc::clone(&sink) as Arc<dyn ObjectSink>);
        let Some((stats, recipes)) =
            add_checkpoint_files(node, writer, now_root, &files, previous.as_ref())?
        else {
            return Ok(false);
        };
        // From here this process's index knows packs that are only staged: if they do not
        // get pushed, the next checkpoints must not use them, so on failure the caller
        // reloads the repository from the durable store (send_checkpoint); pushes pending
        // keep theirs (and its sessions) until done.
        let single = single_file(now_root, &recipes);
        let push = self.push_packs(&repo, &sink, &name, single, recipes)?;
        let digests = push.manifest.files.iter().map(|r| r.blake3.as_str());
        if !node.record_whole(now_root, &files, digests, Reached::Staged) {
            return Ok(false);
        }
        report_staged_packs(
            node,
            now_root,
            &stats,
            previous.as_ref(),
            started,
            self.pool.addr(push.server),
        );
        self.measure(
            name.clone(),
            Pushed {
                compression,
                measured: Measured {
                    upload_seconds: 0.0,
                    ..stats.measured()
                },
                upload_from: started,
            },
        );
        self.repository
            .remember_manifest(now_root, &ckpt, push.manifest.files.clone());
        lock(&self.unanswered_since).insert(name.clone(), Instant::now());
        lock(&self.pending_pushes).insert(name, push);
        Ok(true)
    }

    /// Stages the manifest of `recipes` after the objects `sink` staged, and pushes the
    /// list — with the packs and index objects of earlier pushes still pending, which this
    /// checkpoint's blobs may be in: the server writes the manifest only once they are all
    /// in the durable store.
    fn push_packs(
        &self,
        repo: &Arc<Repo>,
        sink: &ServerSink,
        name: &str,
        single_file: bool,
        recipes: Vec<cascade_dedup::repo::FileRecipe>,
    ) -> Result<PendingPush> {
        let (key, bytes, manifest) = repo.prepare_manifest(name, recipes, single_file)?;
        sink.put(&key, vec![Bytes::from(bytes)])?;
        let objects = sink.finish()?;
        let earlier: Vec<StagedObject> = lock(&self.pending_pushes)
            .values()
            .filter(|p| Arc::ptr_eq(&p.repo, repo))
            .flat_map(|p| p.objects.iter().filter(|o| o.holds_blobs()).cloned())
            .collect();
        let prefix = format!("{DEFAULT_PREFIX}/");
        let listed: Vec<PushFile> = objects
            .iter()
            .chain(&earlier)
            .map(|o| PushFile {
                path: o.key.strip_prefix(&prefix).unwrap_or(&o.key).to_string(),
                size: o.size,
                blake3: o.blake3,
            })
            .collect();
        // The server writes the manifest unchecked for a while after the push, counting on
        // this session being fresh (Repo::staged_manifest_trusted).
        repo.renew_parked().map_err(Error::Dedup)?;
        let server = sink.server;
        self.pool
            .with_conn(server, |c| c.push(&key, false, &listed))
            .map_err(|e| self.pool.error(server, e))?;
        Ok(PendingPush {
            server,
            key,
            manifest,
            repo: Arc::clone(repo),
            objects,
        })
    }

    /// For a checkpoint staged as packs: once its server wrote the manifest, records it
    /// complete (or this node's part stored). `Step::Waiting` until then. After a restart
    /// of the agent (nothing pending here) every server that is up is asked. If none
    /// knows the push any more, or none that may hold it has said so for
    /// [`StagedDedup::give_up_delay`], `Step::Next`: the durable repository level stores it.
    pub(super) fn complete_packs(&self, node: &Node, root: &LifeEntry) -> Result<Step> {
        let waiting = Step::Waiting(Instant::now() + self.pool.ask_every());
        let ckpt = DurableKey::from_store_path(&root.path);
        let (name, part) = self.repository.stored_name(root, &ckpt);
        if !self.pool.ask_due(&self.asked, &name) {
            return Ok(waiting);
        }
        let pending = lock(&self.pending_pushes)
            .get(&name)
            .map(|p| (p.server, p.key.clone(), Arc::clone(&p.repo)));
        let was_pending = pending.is_some();
        let (servers, key, repo) = match pending {
            Some((server, key, repo)) => (vec![server], key, repo),
            None => {
                let Some(repo) = self.repository.get()? else {
                    return Ok(Step::Changed);
                };
                let servers = (0..self.pool.count())
                    .filter(|&i| self.pool.up(i))
                    .collect();
                (
                    servers,
                    repo.manifest_key(&name).map_err(Error::Dedup)?,
                    repo,
                )
            }
        };
        // Every server that could hold the push answers for it.
        let mut all_asked = was_pending || servers.len() == self.pool.count();
        let (mut written, mut known, mut failed) = (false, false, None);
        for i in servers {
            let state = match self
                .pool
                .with_conn(i, |c| c.pull(&[(PullKind::Checkpoint, key.as_str())]))
            {
                Ok(state) => state,
                Err(e) => {
                    failed = Some((e.to_string(), self.pool.error(i, e)));
                    all_asked = false;
                    continue;
                }
            };
            let level = state.first().map_or(WireLevel::Unknown, |s| s.level);
            written |= level == WireLevel::Durable;
            known |= level != WireLevel::Unknown;
        }
        let silent = self.unanswered_for(&name, known);
        if !known && !all_asked {
            if silent >= self.give_up_delay(&repo) {
                // Safe: the server that took it, should it come back, now checks the
                // manifest against garbage collection before writing it (give_up_delay).
                self.forget_push(&name);
                let why = failed.map_or("its servers are down".to_string(), |(why, _)| why);
                give_up(node, root, silent, &why);
                return Ok(Step::Next);
            }
            if let Some((_, e)) = failed {
                return Err(e);
            }
        }
        if !known && all_asked {
            // The server that took it lost it (its SSD replaced, say): stored again from the
            // node.
            self.forget_push(&name);
            node.record_failure(format!(
                "no staging server knows checkpoint {} any more (lost with what its server \
                 had staged); storing it in the durable store's dedup repository instead",
                root.path
            ));
            return Ok(Step::Next);
        }
        if !written {
            // The session keeping the manifest's packs lives until the server wrote it.
            let renewed = match lock(&self.pending_pushes).get(&name) {
                Some(p) => p.repo.renew_parked(),
                None => Ok(()),
            };
            if let Err(e) = renewed {
                node.record_failure(format!("checkpoint {} staged as packs: {e}", root.path));
            }
            return Ok(waiting);
        }
        lock(&self.unanswered_since).remove(&name);
        if let Some(p) = lock(&self.pending_pushes).remove(&name) {
            p.repo.manifest_written(&p.manifest)?;
        }
        self.record_written(node, root, &name, part)
    }

    /// Checkpoint `name`, staged as packs, is to be stored from the node instead: its push
    /// is forgotten, and the repository reloaded from the durable store, since this
    /// process's index names packs that may never arrive there.
    fn forget_push(&self, name: &str) {
        lock(&self.pending_pushes).remove(name);
        lock(&self.unanswered_since).remove(name);
        self.repository.reopen();
    }
}

/// Counts and logs a checkpoint staged as packs.
fn report_staged_packs(
    node: &Node,
    root: &LifeEntry,
    stats: &WriteStats,
    previous: Option<&PreviousVersion>,
    started: Instant,
    server: &str,
) {
    let stored = stats.stored_data_bytes + stats.stored_tree_bytes;
    node.count(|s| {
        s.staged_files += stats.files;
        s.staged_bytes += stats.bytes;
        s.dedup_bytes += stats.bytes;
        s.dedup_new_bytes += stats.new_bytes;
        s.dedup_stored_bytes += stored;
        s.dedup_delta_chunks += stats.delta_chunks;
    });
    node.log(|| {
        let against = deltas_note(stats.delta_chunks, previous);
        format!(
            "checkpoint {} staged as packs on {} ({} files, {} bytes; {} of {} chunks \
             new{against}, {stored} bytes stored in {} packs) in {:.3} s",
            root.path,
            server,
            stats.files,
            stats.bytes,
            stats.new_chunks,
            stats.chunks,
            stats.packs,
            started.elapsed().as_secs_f64()
        )
    });
}
