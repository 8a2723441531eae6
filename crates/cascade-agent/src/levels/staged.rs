//! The agent's side of staging (docs/staging.md): closed files go to staging servers (L1)
//! instead of straight to the durable tier. Many files and pieces are packed into Write
//! frames of `frame_bytes`, sent with vectored writes straight from the block's mapped
//! chunks, and acknowledged by a Sync after the server's fdatasync; the file is then
//! recorded as staged. A committed checkpoint whose files are all staged is pushed to a
//! server (its file list), and that server writes the completion marker once the files have
//! drained. The agent asks the servers (Pull) which staged files and pushed checkpoints
//! reached the durable tier, and records that in the block.
//!
//! A server that fails mid-batch is marked down (retried after a backoff); whatever it had
//! not acknowledged goes to the next server, or straight to the durable tier when none is
//! left.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_durable::DurableKey;
use cascade_store::{LifeEntry, OpenOptions};
use cascade_wire::auth::proofs_match;
use cascade_wire::client::{Connection, OutSegment};
use cascade_wire::protocol::{Level as WireLevel, PullKind, PushFile, Seal, MAX_DATA};

use crate::level::{Found, Level, Poll, Step, Unit};
use crate::node::{files_of, Checkpoint, Node};
use crate::reader::StoreFileReader;
use crate::servers::{lock, Asked, ServerPool};
use crate::store_write::{create_for_writing, StoreWriter};
use crate::{Error, Result};

/// A file version: (inode, generation, modification sequence) in the node store.
type Version = (u64, u32, u64);

/// The version `e` is of.
fn version_of(e: &LifeEntry) -> Version {
    (e.ino, e.generation, e.mod_seq)
}

/// Most staged versions one ask settles against the durable store
/// (`StagingServers::settle_unaccounted`): a checksum read each, up to
/// `cascade_durable::CHECKSUM_READS_IN_FLIGHT` at a time.
const SETTLE_PER_ASK: usize = 1024;

/// Staging servers taking plain files.
pub(crate) struct StagingServers {
    pool: Arc<ServerPool>,
    /// False with dedup on: checkpoints go through the servers as chunks (the staged-dedup
    /// level), this level only serves files staged before.
    sends: bool,
    /// Server holding each staged version.
    placed: Mutex<HashMap<Version, usize>>,
    /// Server each checkpoint root was pushed to: (ino, generation) -> server index.
    pushed: Mutex<HashMap<(u64, u32), usize>>,
    /// Staged versions to send again from the node, with the server that held them and why
    /// (`StagingServers::settle_unaccounted`).
    given_up: Mutex<HashMap<Version, (usize, Abandoned)>>,
    /// When the servers were last asked what has drained.
    asked: Asked,
}

/// Why a staged version is sent again from the node (`StagingServers::abandoned`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Abandoned {
    /// Its server answered that it does not know it.
    Lost,
    /// Its server has not answered for this long.
    Silent(Duration),
}

/// A piece of file data on its way into a frame.
enum Piece<'a> {
    /// Mapped chunk memory of the block: sent without a copy.
    Shared(&'a [u8]),
    /// Read from the spill file.
    Owned(Vec<u8>),
}

impl Piece<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Shared(s) => s,
            Piece::Owned(v) => v,
        }
    }
}

struct PendingSegment {
    key: String,
    stamp: u64,
    size: u64,
    offset: u64,
    seal: Option<Seal>,
    pieces: std::ops::Range<usize>,
}

/// Packs segments of many files into Write frames of about `limit` data bytes.
struct FrameBuilder<'a> {
    limit: usize,
    bytes: usize,
    segments: Vec<PendingSegment>,
    pieces: Vec<Piece<'a>>,
}

/// Segments per frame, so the descriptors of tiny files stay a small part of it.
const MAX_SEGMENTS: usize = 4096;

impl<'a> FrameBuilder<'a> {
    fn new(limit: usize) -> FrameBuilder<'a> {
        FrameBuilder {
            limit: limit.clamp(64 << 10, MAX_DATA),
            bytes: 0,
            segments: Vec::new(),
            pieces: Vec::new(),
        }
    }

    /// Room left in the current frame.
    fn room(&self) -> usize {
        self.limit - self.bytes
    }

    fn add(
        &mut self,
        conn: &mut Connection,
        key: &str,
        (stamp, size): (u64, u64),
        offset: u64,
        piece: Piece<'a>,
        seal: Option<Seal>,
    ) -> cascade_wire::Result<()> {
        let len = piece.bytes().len();
        let start = self.pieces.len();
        self.pieces.push(piece);
        self.segments.push(PendingSegment {
            key: key.to_string(),
            stamp,
            size,
            offset,
            seal,
            pieces: start..start + 1,
        });
        self.bytes += len;
        if self.bytes >= self.limit || self.segments.len() >= MAX_SEGMENTS {
            self.flush(conn)?;
        }
        Ok(())
    }

    fn flush(&mut self, conn: &mut Connection) -> cascade_wire::Result<()> {
        if self.segments.is_empty() {
            return Ok(());
        }
        let slices: Vec<&[u8]> = self.pieces.iter().map(|p| p.bytes()).collect();
        let out: Vec<OutSegment> = self
            .segments
            .iter()
            .map(|s| OutSegment {
                key: &s.key,
                stamp: s.stamp,
                size: s.size,
                offset: s.offset,
                seal: s.seal,
                data: &slices[s.pieces.clone()],
            })
            .collect();
        let sent = conn.write(&out);
        self.segments.clear();
        self.pieces.clear();
        self.bytes = 0;
        sent
    }
}

impl StagingServers {
    pub(crate) fn new(pool: Arc<ServerPool>, sends: bool) -> StagingServers {
        StagingServers {
            pool,
            sends,
            placed: Mutex::new(HashMap::new()),
            pushed: Mutex::new(HashMap::new()),
            given_up: Mutex::new(HashMap::new()),
            asked: Asked::default(),
        }
    }

    /// Stages `files` (closed, not yet safe) on the servers; whatever no server takes is
    /// left for the next level. Returns how many were staged, and those left.
    fn stage_all<'t>(&self, node: &Node, files: Vec<&'t LifeEntry>) -> (usize, Vec<&'t LifeEntry>) {
        let n = self.pool.count();
        let mut todo: Vec<Vec<&'t LifeEntry>> = vec![Vec::new(); n];
        let mut direct: Vec<&'t LifeEntry> = Vec::new();
        for f in files {
            match self.pool.next_up(self.pool.home(), &[]) {
                Some(i) => todo[i].push(f),
                None => direct.push(f),
            }
        }
        let mut failed_servers: Vec<usize> = Vec::new();
        let mut done = 0;
        while todo.iter().any(|t| !t.is_empty()) && !node.stopping() {
            let results: Vec<(usize, usize, Vec<&'t LifeEntry>)> = std::thread::scope(|scope| {
                let handles: Vec<_> = todo
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.is_empty())
                    .map(|(i, t)| {
                        let t = t.clone();
                        scope.spawn(move || {
                            let (acked, left) = self.stage_batch(node, i, &t);
                            (i, acked, left)
                        })
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            for t in todo.iter_mut() {
                t.clear();
            }
            for (i, acked, left) in results {
                done += acked;
                if left.is_empty() {
                    continue;
                }
                failed_servers.push(i);
                match self.pool.next_up(i + 1, &failed_servers) {
                    Some(j) => {
                        node.log(|| {
                            format!(
                                "sending {} file(s) meant for {} to {}",
                                left.len(),
                                self.pool.addr(i),
                                self.pool.addr(j)
                            )
                        });
                        todo[j].extend(left);
                    }
                    None => direct.extend(left),
                }
            }
        }
        if !direct.is_empty() && !node.stopping() {
            node.log(|| {
                format!(
                    "no staging server takes {} file(s): uploading them to {}",
                    direct.len(),
                    node.durable.name()
                )
            });
        }
        (done, direct)
    }

    /// Sends `files` to server `i`, syncing every `sync_bytes`. Returns how many were
    /// acknowledged and the files it did not acknowledge (all of them after a failure
    /// before the first Sync).
    fn stage_batch<'f>(
        &self,
        node: &Node,
        i: usize,
        files: &[&'f LifeEntry],
    ) -> (usize, Vec<&'f LifeEntry>) {
        let mut acked = 0usize;
        let addr = &self.pool.addr(i);
        let result = self.pool.with_conn(i, |conn| {
            let mut frame = FrameBuilder::new(self.pool.opts.frame_bytes);
            let mut sealed: Vec<(&LifeEntry, [u8; 32])> = Vec::new();
            let mut unsynced = 0u64;
            for (k, f) in files.iter().enumerate() {
                if node.stopping() {
                    break;
                }
                if let Some(digest) = self.send_file(node, conn, &mut frame, f)? {
                    sealed.push((f, digest));
                }
                unsynced += f.size;
                if unsynced >= self.pool.opts.sync_bytes || k + 1 == files.len() {
                    frame.flush(conn)?;
                    conn.sync()?;
                    unsynced = 0;
                    for (f, digest) in sealed.drain(..) {
                        self.record_staged(node, i, f, &digest);
                    }
                    acked = k + 1;
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => (acked, files[acked..].to_vec()),
            Err(e) => {
                node.record_failure(format!(
                    "staging server {addr} failed after {acked} of {} file(s): {e}",
                    files.len()
                ));
                (acked, files[acked..].to_vec())
            }
        }
    }

    fn record_staged(&self, node: &Node, i: usize, f: &LifeEntry, digest: &[u8; 32]) {
        if !node.store.mark_staged(f.ino, f.generation, f.mod_seq) {
            return; // Changed while it was sent: the next pass sends the new version.
        }
        let key = version_of(f);
        lock(&self.given_up).remove(&key);
        lock(&self.placed).insert(key, i);
        node.remember_digest(f, cascade_wire::hex(digest));
        node.count(|s| {
            s.staged_files += 1;
            s.staged_bytes += f.size;
        });
        node.log(|| {
            format!(
                "staged {} ({} bytes) on {}",
                f.path,
                f.size,
                self.pool.addr(i)
            )
        });
    }

    /// Streams one file version into `frame` and seals it; None if it was removed or
    /// replaced since the snapshot.
    fn send_file<'s>(
        &self,
        node: &'s Node,
        conn: &mut Connection,
        frame: &mut FrameBuilder<'s>,
        f: &LifeEntry,
    ) -> cascade_wire::Result<Option<[u8; 32]>> {
        let io = |what: &str, e: cascade_store::Error| {
            cascade_wire::Error::io(
                format!("{what} {}", f.path),
                std::io::Error::from_raw_os_error(e.errno()),
            )
        };
        let file = match node.store.open(&f.path, &OpenOptions::new()) {
            Ok(file) => file,
            Err(e) if e.errno() == libc::ENOENT => return Ok(None),
            Err(e) => return Err(io("open", e)),
        };
        if file.ino() != f.ino || file.generation() != f.generation {
            return Ok(None);
        }
        let mut reader = StoreFileReader::new(&node.store, &file).map_err(|e| io("read", e))?;
        let size = reader.len();
        let key = DurableKey::from_store_path(&f.path);
        let version = (cascade_durable::now_unix_ns(), size);
        let region = node.store.data_region();
        let digest = match reader.memory_pieces() {
            Some(pieces) => {
                let slices: Vec<&'s [u8]> = pieces
                    .iter()
                    .map(|&(offset, len)| {
                        // SAFETY: `memory_pieces` checked that offset..offset+len lies in the
                        // data region, which stays mapped while the store (borrowed for 's)
                        // lives. The file is closed; if it is rewritten meanwhile its version
                        // changes and `mark_staged` refuses to record what was sent.
                        unsafe { std::slice::from_raw_parts(region.addr.add(offset), len) }
                    })
                    .collect();
                std::thread::scope(|scope| {
                    let hashing = scope.spawn(|| {
                        let mut h = blake3::Hasher::new();
                        for s in &slices {
                            h.update(s);
                        }
                        *h.finalize().as_bytes()
                    });
                    let mut offset = 0u64;
                    for s in &slices {
                        let mut rest: &'s [u8] = s;
                        while !rest.is_empty() {
                            let take = rest.len().min(frame.room());
                            let (now, later) = rest.split_at(take);
                            frame.add(conn, &key, version, offset, Piece::Shared(now), None)?;
                            offset += take as u64;
                            rest = later;
                        }
                    }
                    hashing.join().map_err(|_| {
                        cascade_wire::Error::io("hash", std::io::Error::other("hashing failed"))
                    })
                })?
            }
            None => {
                let mut h = blake3::Hasher::new();
                let mut offset = 0u64;
                while offset < size {
                    let take = (size - offset).min(frame.room() as u64) as usize;
                    let mut buf = vec![0u8; take];
                    reader
                        .read_exact(&mut buf)
                        .map_err(|e| cascade_wire::Error::io(format!("read {}", f.path), e))?;
                    h.update(&buf);
                    frame.add(conn, &key, version, offset, Piece::Owned(buf), None)?;
                    offset += take as u64;
                }
                *h.finalize().as_bytes()
            }
        };
        let tag = self
            .pool
            .job_key
            .version_tag(key.as_str(), version.0, size, &digest);
        frame.add(
            conn,
            &key,
            version,
            size,
            Piece::Owned(Vec::new()),
            Some(Seal {
                blake3: digest,
                tag,
            }),
        )?;
        Ok(Some(digest))
    }

    /// For file version `e`, recorded staged, once the node is to send it again: the server
    /// that held it and why ([`StagingServers::settle_unaccounted`]). The node sends it to a
    /// server that is up or straight to the durable store: a server that comes back drains
    /// the same bytes, or finds the durable store's version newer.
    fn abandoned(&self, e: &LifeEntry) -> Option<(usize, Abandoned)> {
        if !e.staged() {
            return None;
        }
        lock(&self.given_up).get(&version_of(e)).copied()
    }

    /// Whether no server accounts for staged version `key` any more, and why: every server
    /// that may hold it (`at`, or any server where it went is not known: after a restart of
    /// the agent) answered this ask that it does not know it (`unknown_to`), or has not
    /// answered for `staging.give_up_after`. The server it is given up on: the longest
    /// silent, else the one that held it.
    fn unaccounted(
        &self,
        key: &Version,
        at: Option<usize>,
        unknown_to: &HashMap<Version, Vec<usize>>,
    ) -> Option<(usize, Abandoned)> {
        let unknown = unknown_to.get(key).map_or(&[][..], Vec::as_slice);
        let holders = match at {
            Some(i) => i..i + 1,
            None => 0..self.pool.count(),
        };
        let mut longest: Option<(usize, Duration)> = None;
        for i in holders.clone().filter(|i| !unknown.contains(i)) {
            let silent = self.pool.silent_for(i);
            if silent < self.pool.give_up_after() {
                return None;
            }
            if longest.is_none_or(|(_, s)| silent > s) {
                longest = Some((i, silent));
            }
        }
        match longest {
            Some((i, silent)) => Some((i, Abandoned::Silent(silent))),
            None => (!holders.is_empty()).then_some((holders.start, Abandoned::Lost)),
        }
    }

    /// Hands a checkpoint whose files are all staged (or durable) to a server, which writes
    /// its marker once they have drained. True if a server took it.
    fn push_checkpoint(&self, node: &Node, root: &LifeEntry) -> Result<bool> {
        let Some(tree) = node.fresh_tree(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = files_of(&tree).collect();
        if files.iter().any(|f| !f.safe() || f.torn) {
            return Ok(false);
        }
        let (single_file, entries) = node.marker_entries(now_root, &files)?;
        let push: Vec<PushFile> = entries
            .iter()
            .map(|e| PushFile {
                path: e.path.clone(),
                size: e.size,
                blake3: cascade_wire::unhex(&e.blake3).unwrap_or([0; 32]),
            })
            .collect();
        // The server holding most of its files, else any that is up.
        let mut votes = vec![0usize; self.pool.count()];
        {
            let placed = lock(&self.placed);
            for f in &files {
                if let Some(&i) = placed.get(&version_of(f)) {
                    votes[i] += 1;
                }
            }
        }
        let first = (0..self.pool.count())
            .max_by_key(|&i| votes[i])
            .unwrap_or(0);
        let key = DurableKey::from_store_path(&now_root.path);
        let mut tried = Vec::new();
        while let Some(i) = self.pool.next_up(first, &tried) {
            tried.push(i);
            match self.pool.with_conn(i, |c| c.push(&key, single_file, &push)) {
                Ok(()) => {
                    if !node
                        .store
                        .mark_pushed(now_root.ino, now_root.generation, now_root.mod_seq)
                    {
                        return Ok(false);
                    }
                    lock(&self.pushed).insert((now_root.ino, now_root.generation), i);
                    node.log(|| {
                        format!(
                            "checkpoint {} staged ({} files); {} completes it",
                            now_root.path,
                            files.len(),
                            self.pool.addr(i)
                        )
                    });
                    return Ok(true);
                }
                Err(e) => node.record_failure(format!(
                    "cannot push checkpoint {} to {}: {e}",
                    now_root.path,
                    self.pool.addr(i)
                )),
            }
        }
        Ok(false)
    }

    /// Asks the servers which staged files and pushed checkpoints reached the durable tier
    /// and records it, then settles the staged versions no server accounts for any more
    /// ([`StagingServers::settle_unaccounted`]): when a server's event counter moved (its
    /// watcher woke the agent), else at most every `ServerPool::ask_every`. True if anything
    /// became durable or is to be sent again.
    fn pull_levels(&self, node: &Node, tree: &[LifeEntry]) -> bool {
        if !self.pool.ask_due(&self.asked, "") {
            return false;
        }
        // Each with the server it went to, if this agent knows (else every server is asked).
        let staged: Vec<(&LifeEntry, Option<usize>)> = {
            let placed = lock(&self.placed);
            files_of(tree)
                .filter(|e| e.staged())
                .map(|f| (f, placed.get(&version_of(f)).copied()))
                .collect()
        };
        let roots: Vec<(&LifeEntry, Option<usize>)> = {
            let pushed = lock(&self.pushed);
            tree.iter()
                .filter(|e| e.committed && e.pushed_flag && e.staged())
                .map(|r| (r, pushed.get(&(r.ino, r.generation)).copied()))
                .collect()
        };
        let mut changed = false;
        // Per staged version, the servers that answered they do not know it.
        let mut unknown_to: HashMap<Version, Vec<usize>> = HashMap::new();
        for i in (0..self.pool.count()).filter(|&i| self.pool.up(i)) {
            let files = placed_on(i, &staged);
            let roots = placed_on(i, &roots);
            if !files.is_empty() || !roots.is_empty() {
                let (progressed, unknown) = self.pull_from(node, i, tree, &files, &roots);
                changed |= progressed;
                for f in unknown {
                    unknown_to.entry(version_of(f)).or_default().push(i);
                }
            }
        }
        changed | self.settle_unaccounted(node, &staged, &unknown_to)
    }

    /// Staged versions no server accounts for ([`StagingServers::unaccounted`]): drained
    /// (and, by an answering server, their arena reclaimed) before the ask, or lost with the
    /// server's SSD, or on a server that went silent before draining them. The durable store
    /// tells them apart: its checksum object of the file equal to the version's BLAKE3
    /// records it durable, so a checkpoint a silent server completed is not sent again (nor
    /// its marker taken back); none, or another, gives it up, to be sent again
    /// ([`StagingServers::abandoned`]). A failed read is asked again at the next ask, or,
    /// for a silent server, gives it up (the node cannot tell, and sending again is safe).
    /// The checksums are read together, at most [`SETTLE_PER_ASK`] per ask. True if any
    /// became durable or was given up.
    fn settle_unaccounted(
        &self,
        node: &Node,
        staged: &[(&LifeEntry, Option<usize>)],
        unknown_to: &HashMap<Version, Vec<usize>>,
    ) -> bool {
        let given_up_before: HashSet<Version> = lock(&self.given_up).keys().copied().collect();
        // Each unaccounted version with its BLAKE3, at most SETTLE_PER_ASK of them: the rest
        // are settled at the next asks (a pass does not wait on thousands of reads).
        let unaccounted: Vec<(&LifeEntry, (usize, Abandoned), String)> = staged
            .iter()
            .filter(|(f, _)| !given_up_before.contains(&version_of(f)))
            .filter_map(|(f, at)| {
                let why = self.unaccounted(&version_of(f), *at, unknown_to)?;
                Some((*f, why, node.digest_of(f).ok()?))
            })
            .take(SETTLE_PER_ASK)
            .collect();
        let keys: Vec<DurableKey> = unaccounted
            .iter()
            .map(|(f, _, _)| DurableKey::from_store_path(&f.path))
            .collect();
        let rels: Vec<&str> = keys.iter().map(DurableKey::as_str).collect();
        let sums = node.durable.recorded_checksums(&rels);
        let mut changed = false;
        let mut newly_given_up = Vec::new();
        for ((f, (i, why), ours), sum) in unaccounted.into_iter().zip(sums) {
            let durable = match sum {
                Ok(sum) => sum == ours,
                // No checksum object: no version of it completed its upload.
                Err(e)
                    if e.is_not_found()
                        || matches!(e, cascade_durable::Error::BadChecksum { .. }) =>
                {
                    false
                }
                Err(_) if matches!(why, Abandoned::Silent(_)) => false,
                Err(_) => continue,
            };
            if durable {
                changed |= node.store.mark_durable(f.ino, f.generation, f.mod_seq);
            } else {
                newly_given_up.push((version_of(f), (i, why)));
            }
        }
        let still_staged: HashSet<Version> = staged.iter().map(|(f, _)| version_of(f)).collect();
        let mut given_up = lock(&self.given_up);
        given_up.retain(|key, _| still_staged.contains(key));
        changed |= !newly_given_up.is_empty();
        given_up.extend(newly_given_up);
        changed
    }

    /// Asks server `i` about `files` and checkpoint `roots` and records what it drained.
    /// True if something became durable; and the files it does not know.
    fn pull_from<'t>(
        &self,
        node: &Node,
        i: usize,
        tree: &[LifeEntry],
        files: &[&'t LifeEntry],
        roots: &[&LifeEntry],
    ) -> (bool, Vec<&'t LifeEntry>) {
        let keys: Vec<(PullKind, DurableKey)> = files
            .iter()
            .map(|f| (PullKind::File, DurableKey::from_store_path(&f.path)))
            .chain(
                roots
                    .iter()
                    .map(|r| (PullKind::Checkpoint, DurableKey::from_store_path(&r.path))),
            )
            .collect();
        let queries: Vec<(PullKind, &str)> = keys
            .iter()
            .map(|(kind, key)| (*kind, key.as_str()))
            .collect();
        let states = match self.pool.with_conn(i, |c| c.pull(&queries)) {
            Ok(s) => s,
            Err(e) => {
                node.record_failure(format!(
                    "cannot ask {} what has drained: {e}",
                    self.pool.addr(i)
                ));
                return (false, Vec::new());
            }
        };
        let (file_states, root_states) = states.split_at(files.len());
        let mut changed = false;
        let mut unknown = Vec::new();
        for (f, st) in files.iter().zip(file_states) {
            if st.level == WireLevel::Unknown {
                unknown.push(*f);
            }
            if st.level != WireLevel::Durable {
                continue;
            }
            let Ok(ours) = node.digest_of(f) else {
                continue;
            };
            if cascade_wire::hex(&st.blake3) == ours
                && node.store.mark_durable(f.ino, f.generation, f.mod_seq)
            {
                changed = true;
            }
        }
        for (r, st) in roots.iter().zip(root_states) {
            if st.level != WireLevel::Durable {
                continue;
            }
            // The server wrote the marker for the version pushed; the root's version still
            // equals it (it is `staged`), so nothing below changed since.
            for f in files_of(tree).filter(|e| e.is_at_or_below(&r.path)) {
                node.store.mark_durable(f.ino, f.generation, f.mod_seq);
            }
            if node.store.mark_complete(r.ino, r.generation, r.mod_seq) {
                changed = true;
                node.count(|s| s.markers += 1);
                node.log(|| format!("checkpoint {} complete (marker by its server)", r.path));
            }
        }
        (changed, unknown)
    }

    /// The server holding the newest version of `key` staged and not yet drained, and that
    /// version's stamp. Servers that do not answer are skipped.
    fn newest_staged(&self, key: &str) -> Option<(usize, u64)> {
        let mut best: Option<(usize, u64)> = None;
        for i in 0..self.pool.count() {
            if let Ok(states) = self.pool.with_conn(i, |c| c.pull(&[(PullKind::File, key)])) {
                // Only versions not yet drained: a drained one is in the durable store, which
                // may since hold a newer version uploaded directly.
                if let Some(st) = states.first().filter(|s| s.level == WireLevel::Staged) {
                    if best.is_none_or(|(_, stamp)| st.stamp > stamp) {
                        best = Some((i, st.stamp));
                    }
                }
            }
        }
        best
    }

    /// Reads file `key` from server `i` into the store file `tmp`, checked against its
    /// BLAKE3; its size. None if the server no longer has it or failed (the levels below
    /// decide then).
    fn download(&self, node: &Node, i: usize, key: &str, tmp: &str) -> Result<Option<u64>> {
        let store = &node.store;
        let file = create_for_writing(store, tmp)?;
        let mut out = StoreWriter::new(&file, tmp);
        let mut hasher = blake3::Hasher::new();
        let mut offset = 0u64;
        let mut buf = Vec::new();
        let fetched = self.pool.with_conn(i, |c| loop {
            let Some(meta) = c.read(key, offset, MAX_DATA as u32, &mut buf)? else {
                return Ok(None);
            };
            if !buf.is_empty() {
                hasher.update(&buf);
                std::io::Write::write_all(&mut out, &buf)
                    .map_err(|e| cascade_wire::Error::io(tmp, e))?;
                offset += buf.len() as u64;
            }
            if offset >= meta.size || buf.is_empty() {
                return Ok(Some(meta));
            }
        });
        let meta = match fetched {
            Ok(Some(m)) => m,
            // Gone (drained and reclaimed) or the server failed.
            Ok(None) | Err(_) => {
                let _ = store.unlink(tmp);
                return Ok(None);
            }
        };
        if offset != meta.size || *hasher.finalize().as_bytes() != meta.blake3 {
            let _ = store.unlink(tmp);
            return Err(Error::Mismatch {
                path: key.to_string(),
                reason: format!(
                    "the copy on staging server {} does not match its BLAKE3",
                    self.pool.addr(i)
                ),
            });
        }
        // A staged copy overrides the durable store's only if this job wrote it: its tag,
        // made with the job's key, must verify. Else it is passed over (the levels below
        // decide), whoever made it: another job, a server, the network.
        let tag = self
            .pool
            .job_key
            .version_tag(key, meta.stamp, meta.size, &meta.blake3);
        if !proofs_match(&meta.tag, &tag) {
            let _ = store.unlink(tmp);
            node.count(|s| s.untrusted_staged += 1);
            cascade_observe::warn!(
                "cascade agent: staging server {} holds a copy of {key} (stamp {}) that this \
                 job did not write (its tag does not verify with the job's key): not used",
                self.pool.addr(i),
                meta.stamp
            );
            return Ok(None);
        }
        Ok(Some(meta.size))
    }
}

/// Of `list` (entries with the server they were sent to, if known), those to ask server
/// `i` about.
fn placed_on<'a>(i: usize, list: &[(&'a LifeEntry, Option<usize>)]) -> Vec<&'a LifeEntry> {
    list.iter()
        .filter(|(_, at)| at.is_none_or(|p| p == i))
        .map(|(e, _)| *e)
        .collect()
}

impl Level for StagingServers {
    fn name(&self) -> String {
        self.pool.describe()
    }

    fn takes(&self) -> Option<Unit> {
        self.sends.then_some(Unit::Files)
    }

    fn durable(&self) -> bool {
        false
    }

    /// Not a staged version whose server no longer holds it or has not answered for
    /// `staging.give_up_after` ([`StagingServers::abandoned`]): that one is sent again.
    fn holds(&self, e: &LifeEntry) -> bool {
        e.safe() && self.abandoned(e).is_none()
    }

    fn send_files<'t>(
        &self,
        node: &Node,
        files: Vec<&'t LifeEntry>,
    ) -> (usize, Vec<&'t LifeEntry>) {
        let abandoned: Vec<(usize, Abandoned)> =
            files.iter().filter_map(|f| self.abandoned(f)).collect();
        let lost = abandoned
            .iter()
            .filter(|(_, why)| *why == Abandoned::Lost)
            .count();
        if let Some((i, _)) = abandoned.iter().find(|(_, why)| *why == Abandoned::Lost) {
            node.record_failure(format!(
                "staging server {} no longer holds {lost} staged file(s) (lost with its SSD?): \
                 sending them again, from this node",
                self.pool.addr(*i)
            ));
        }
        let silent = abandoned.iter().filter_map(|(i, why)| match why {
            Abandoned::Silent(silent) => Some((*i, *silent)),
            Abandoned::Lost => None,
        });
        if let Some((i, longest)) = silent.clone().max_by_key(|(_, silent)| *silent) {
            node.record_failure(format!(
                "staging server {} has not answered for {:.1} s: sending the {} staged \
                 file(s) it may hold again, from this node",
                self.pool.addr(i),
                longest.as_secs_f64(),
                silent.count()
            ));
        }
        node.count(|s| s.staged_given_up += abandoned.len() as u64);
        self.stage_all(node, files)
    }

    /// A checkpoint whose files are all staged is pushed to a server, which writes its
    /// marker; one whose files are all durable is left to the durable store's level.
    fn send_checkpoint(&self, node: &Node, c: &Checkpoint, _previous: Option<&Checkpoint>) -> Step {
        // From the pass's snapshot: a file durable then is durable still (or changed, which
        // the next level's fresh look sees); one that became durable since waits a pass.
        if c.files.iter().all(|f| f.durable()) {
            return Step::Next;
        }
        if c.root.checkpoint_safe() {
            // Its server writes the marker once the files have drained.
            return Step::Waiting(Instant::now() + self.pool.ask_every());
        }
        match self.push_checkpoint(node, c.root) {
            Ok(true) => Step::Handed,
            Ok(false) => Step::NotReady,
            Err(e) => {
                node.record_failure(format!("cannot push checkpoint {}: {e}", c.root.path));
                Step::NotReady
            }
        }
    }

    fn poll(&self, node: &Node, tree: &[LifeEntry]) -> Poll {
        let progressed = self.pull_levels(node, tree);
        let waiting = files_of(tree).filter(|e| e.staged()).count();
        Poll {
            progressed,
            waiting,
            ask_again: (waiting > 0).then(|| Instant::now() + self.pool.ask_every()),
        }
    }

    fn find<'a>(&'a self, node: &'a Node, key: &'a DurableKey) -> Result<Option<Found<'a>>> {
        Ok(self.newest_staged(key).map(|(i, stamp)| Found {
            stamp,
            fetch: Box::new(move |tmp| self.download(node, i, key, tmp)),
        }))
    }
}
