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

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cascade_staging::client::{ClientOptions, Connection, OutSegment};
use cascade_staging::protocol::{Level, PullKind, PushFile, MAX_DATA};
use cascade_store::{FileKind, LifeEntry, OpenOptions};

use crate::daemon::{key_of, Agent};
use crate::reader::StoreFileReader;
use crate::restore::{create_for_writing, StoreWriter};
use crate::{Error, Result};

/// How a node's files are spread over the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// File by file, round robin over every server: a node's stream uses them all.
    Stripe,
    /// Every file of this node goes to one server chosen by the node's name (a staging
    /// group: each server serves the nodes that hash to it); the others are fallbacks.
    Group,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Placement, String> {
        match s {
            "stripe" => Ok(Placement::Stripe),
            "group" => Ok(Placement::Group),
            other => Err(format!("{other:?} is not a placement (stripe or group)")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StagingOptions {
    /// `host:port` of every staging server.
    pub servers: Vec<String>,
    pub secret: String,
    /// Key prefix of this job on the servers ("" = none); the servers drain to
    /// `<drain-to>/<namespace>/...`.
    pub namespace: String,
    pub placement: Placement,
    /// Data bytes per Write frame.
    pub frame_bytes: usize,
    /// Data bytes sent between Syncs (each Sync acknowledges the files sealed before it).
    pub sync_bytes: u64,
    /// This node's name (staging groups).
    pub node: String,
}

impl StagingOptions {
    pub fn new(servers: Vec<String>, secret: &str) -> StagingOptions {
        let node = cascade_staging::host_name();
        StagingOptions {
            servers,
            secret: secret.to_string(),
            namespace: String::new(),
            placement: Placement::Stripe,
            frame_bytes: 8 << 20,
            sync_bytes: 256 << 20,
            node,
        }
    }
}

struct ServerSlot {
    addr: String,
    conn: Mutex<Option<Connection>>,
    /// Consecutive failures and when to try again.
    down: Mutex<Option<(u32, Instant)>>,
}

/// Connections to the staging servers and what the agent placed where.
pub(crate) struct Staging {
    pub(crate) opts: StagingOptions,
    client: ClientOptions,
    servers: Vec<ServerSlot>,
    next: AtomicUsize,
    /// Server holding each staged version: (ino, generation, mod_seq) -> server index.
    placed: Mutex<HashMap<(u64, u32, u64), usize>>,
    /// Server each checkpoint root was pushed to: (ino, generation) -> server index.
    pushed: Mutex<HashMap<(u64, u32), usize>>,
    last_pull: Mutex<Option<Instant>>,
}

/// How often the agent asks the servers what has drained.
pub(crate) const PULL_EVERY: Duration = Duration::from_millis(500);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Staging {
    pub(crate) fn new(opts: StagingOptions) -> Staging {
        let mut client = ClientOptions::new(&opts.secret);
        client.namespace = opts.namespace.clone();
        let servers = opts
            .servers
            .iter()
            .map(|a| ServerSlot {
                addr: a.clone(),
                conn: Mutex::new(None),
                down: Mutex::new(None),
            })
            .collect();
        Staging {
            opts,
            client,
            servers,
            next: AtomicUsize::new(0),
            placed: Mutex::new(HashMap::new()),
            pushed: Mutex::new(HashMap::new()),
            last_pull: Mutex::new(None),
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!("staging servers {}", self.opts.servers.join(","))
    }

    fn count(&self) -> usize {
        self.servers.len()
    }

    /// The server a file would go to first.
    fn home(&self) -> usize {
        match self.opts.placement {
            Placement::Stripe => self.next.fetch_add(1, Ordering::Relaxed) % self.count(),
            Placement::Group => {
                let h = blake3::hash(self.opts.node.as_bytes());
                let b = h.as_bytes();
                u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize
                    % self.count()
            }
        }
    }

    fn up(&self, i: usize) -> bool {
        let down = *lock(&self.servers[i].down);
        down.is_none_or(|(_, at)| Instant::now() >= at)
    }

    /// The first server at or after `start` that is up and not in `exclude`.
    fn next_up(&self, start: usize, exclude: &[usize]) -> Option<usize> {
        (0..self.count())
            .map(|k| (start + k) % self.count())
            .find(|i| !exclude.contains(i) && self.up(*i))
    }

    /// Runs `f` on server `i`'s connection (connecting first if needed). On failure the
    /// connection is dropped and the server marked down for a backoff.
    pub(crate) fn with_conn<T>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Connection) -> cascade_staging::Result<T>,
    ) -> cascade_staging::Result<T> {
        let slot = &self.servers[i];
        let mut conn = lock(&slot.conn);
        let result = (|| {
            if conn.is_none() {
                *conn = Some(Connection::connect(&slot.addr, &self.client)?);
            }
            match conn.as_mut() {
                Some(c) => f(c),
                None => unreachable!("connected above"),
            }
        })();
        match &result {
            Ok(_) => *lock(&slot.down) = None,
            // The server is up: it refused delta chunks (closing the connection), which are
            // sent whole at once.
            Err(cascade_staging::Error::Refused { code, .. })
                if *code == cascade_staging::protocol::code::BASE_UNKNOWN =>
            {
                *conn = None;
            }
            Err(_) => {
                *conn = None;
                let mut down = lock(&slot.down);
                let failures = down.map_or(0, |(n, _)| n) + 1;
                let delay = (Duration::from_millis(500) * (1 << failures.min(6)))
                    .min(Duration::from_secs(30));
                *down = Some((failures, Instant::now() + delay));
            }
        }
        result
    }
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
    seal: Option<[u8; 32]>,
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
        seal: Option<[u8; 32]>,
    ) -> cascade_staging::Result<()> {
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

    fn flush(&mut self, conn: &mut Connection) -> cascade_staging::Result<()> {
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

impl Agent {
    /// Stages `files` (closed, not yet safe) on the servers; whatever no server takes is
    /// uploaded straight to the durable tier. Returns how many reached a level below memory.
    pub(crate) fn stage_all(&self, staging: &Staging, files: &[&LifeEntry]) -> usize {
        let n = staging.count();
        let mut todo: Vec<Vec<&LifeEntry>> = vec![Vec::new(); n];
        let mut direct: Vec<&LifeEntry> = Vec::new();
        for f in files {
            match staging.next_up(staging.home(), &[]) {
                Some(i) => todo[i].push(f),
                None => direct.push(f),
            }
        }
        let mut failed_servers: Vec<usize> = Vec::new();
        let mut done = 0;
        while todo.iter().any(|t| !t.is_empty()) && !self.stopping() {
            let results: Vec<(usize, usize, Vec<&LifeEntry>)> = std::thread::scope(|scope| {
                let handles: Vec<_> = todo
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.is_empty())
                    .map(|(i, t)| {
                        let t = t.clone();
                        scope.spawn(move || {
                            let (acked, left) = self.stage_batch(staging, i, &t);
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
                match staging.next_up(i + 1, &failed_servers) {
                    Some(j) => {
                        self.log(|| {
                            format!(
                                "sending {} file(s) meant for {} to {}",
                                left.len(),
                                staging.servers[i].addr,
                                staging.servers[j].addr
                            )
                        });
                        todo[j].extend(left);
                    }
                    None => direct.extend(left),
                }
            }
        }
        if !direct.is_empty() && !self.stopping() {
            self.log(|| {
                format!(
                    "no staging server takes {} file(s): uploading them to {}",
                    direct.len(),
                    self.durable().name()
                )
            });
            done += self.upload_all(&direct);
        }
        done
    }

    /// Sends `files` to server `i`, syncing every `sync_bytes`. Returns how many were
    /// acknowledged and the files it did not acknowledge (all of them after a failure
    /// before the first Sync).
    fn stage_batch<'f>(
        &self,
        staging: &Staging,
        i: usize,
        files: &[&'f LifeEntry],
    ) -> (usize, Vec<&'f LifeEntry>) {
        let mut acked = 0usize;
        let addr = &staging.servers[i].addr;
        let result = staging.with_conn(i, |conn| {
            let mut frame = FrameBuilder::new(staging.opts.frame_bytes);
            let mut sealed: Vec<(&LifeEntry, [u8; 32])> = Vec::new();
            let mut unsynced = 0u64;
            for (k, f) in files.iter().enumerate() {
                if self.stopping() {
                    break;
                }
                if let Some(digest) = self.send_file(conn, &mut frame, f)? {
                    sealed.push((f, digest));
                }
                unsynced += f.size;
                if unsynced >= staging.opts.sync_bytes || k + 1 == files.len() {
                    frame.flush(conn)?;
                    conn.sync()?;
                    unsynced = 0;
                    for (f, digest) in sealed.drain(..) {
                        self.record_staged(staging, i, f, &digest);
                    }
                    acked = k + 1;
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => (acked, files[acked..].to_vec()),
            Err(e) => {
                self.record_failure(format!(
                    "staging server {addr} failed after {acked} of {} file(s): {e}",
                    files.len()
                ));
                (acked, files[acked..].to_vec())
            }
        }
    }

    fn record_staged(&self, staging: &Staging, i: usize, f: &LifeEntry, digest: &[u8; 32]) {
        if !self.store().mark_staged(f.ino, f.generation, f.mod_seq) {
            return; // Changed while it was sent: the next pass sends the new version.
        }
        lock(&staging.placed).insert((f.ino, f.generation, f.mod_seq), i);
        self.remember_digest(f, cascade_staging::hex(digest));
        if let Ok(mut s) = self.stats.lock() {
            s.staged_files += 1;
            s.staged_bytes += f.size;
        }
        self.log(|| {
            format!(
                "staged {} ({} bytes) on {}",
                f.path, f.size, staging.servers[i].addr
            )
        });
    }

    /// Streams one file version into `frame` and seals it; None if it was removed or
    /// replaced since the snapshot.
    fn send_file<'s>(
        &'s self,
        conn: &mut Connection,
        frame: &mut FrameBuilder<'s>,
        f: &LifeEntry,
    ) -> cascade_staging::Result<Option<[u8; 32]>> {
        let io = |what: &str, e: cascade_store::Error| {
            cascade_staging::Error::io(
                format!("{what} {}", f.path),
                std::io::Error::from_raw_os_error(e.errno()),
            )
        };
        let file = match self.store().open(&f.path, &OpenOptions::new()) {
            Ok(file) => file,
            Err(e) if e.errno() == libc::ENOENT => return Ok(None),
            Err(e) => return Err(io("open", e)),
        };
        if file.ino() != f.ino || file.generation() != f.generation {
            return Ok(None);
        }
        let mut reader = StoreFileReader::new(self.store(), &file).map_err(|e| io("read", e))?;
        let size = reader.len();
        let key = key_of(&f.path);
        let version = (cascade_durable::now_unix_ns(), size);
        let region = self.store().data_region();
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
                            frame.add(conn, key, version, offset, Piece::Shared(now), None)?;
                            offset += take as u64;
                            rest = later;
                        }
                    }
                    hashing.join().map_err(|_| {
                        cascade_staging::Error::io("hash", std::io::Error::other("hashing failed"))
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
                        .map_err(|e| cascade_staging::Error::io(format!("read {}", f.path), e))?;
                    h.update(&buf);
                    frame.add(conn, key, version, offset, Piece::Owned(buf), None)?;
                    offset += take as u64;
                }
                *h.finalize().as_bytes()
            }
        };
        frame.add(
            conn,
            key,
            version,
            size,
            Piece::Owned(Vec::new()),
            Some(digest),
        )?;
        Ok(Some(digest))
    }

    /// Hands a checkpoint whose files are all staged (or durable) to a server, which writes
    /// its marker once they have drained. True if a server took it.
    pub(crate) fn push_checkpoint(&self, staging: &Staging, root: &LifeEntry) -> Result<bool> {
        let Some(tree) = self.fresh_tree(root)? else {
            return Ok(false);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = tree.iter().filter(|e| e.kind == FileKind::File).collect();
        if files.iter().any(|f| !f.safe() || f.torn) {
            return Ok(false);
        }
        let (single_file, entries) = self.marker_entries(now_root, &files)?;
        let push: Vec<PushFile> = entries
            .iter()
            .map(|e| PushFile {
                path: e.path.clone(),
                size: e.size,
                blake3: cascade_staging::unhex(&e.blake3).unwrap_or([0; 32]),
            })
            .collect();
        // The server holding most of its files, else any that is up.
        let mut votes = vec![0usize; staging.count()];
        {
            let placed = lock(&staging.placed);
            for f in &files {
                if let Some(&i) = placed.get(&(f.ino, f.generation, f.mod_seq)) {
                    votes[i] += 1;
                }
            }
        }
        let first = (0..staging.count()).max_by_key(|&i| votes[i]).unwrap_or(0);
        let key = key_of(&now_root.path);
        let mut tried = Vec::new();
        while let Some(i) = staging.next_up(first, &tried) {
            tried.push(i);
            match staging.with_conn(i, |c| c.push(key, single_file, &push)) {
                Ok(()) => {
                    if !self.store().mark_pushed(
                        now_root.ino,
                        now_root.generation,
                        now_root.mod_seq,
                    ) {
                        return Ok(false);
                    }
                    lock(&staging.pushed).insert((now_root.ino, now_root.generation), i);
                    self.log(|| {
                        format!(
                            "checkpoint {} staged ({} files); {} completes it",
                            now_root.path,
                            files.len(),
                            staging.servers[i].addr
                        )
                    });
                    return Ok(true);
                }
                Err(e) => self.record_failure(format!(
                    "cannot push checkpoint {} to {}: {e}",
                    now_root.path, staging.servers[i].addr
                )),
            }
        }
        Ok(false)
    }

    /// Asks the servers which staged files and pushed checkpoints reached the durable tier
    /// and records it. At most every [`PULL_EVERY`] unless `force`. True if anything
    /// became durable.
    pub(crate) fn pull_levels<'a>(
        &self,
        staging: &Staging,
        tree: &'a [LifeEntry],
        force: bool,
    ) -> bool {
        {
            let mut last = lock(&staging.last_pull);
            if !force && last.is_some_and(|t| t.elapsed() < PULL_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        // Each with the server it went to, if this agent knows (else every server is asked).
        let staged: Vec<(&LifeEntry, Option<usize>)> = {
            let placed = lock(&staging.placed);
            tree.iter()
                .filter(|e| e.kind == FileKind::File && e.staged())
                .map(|f| (f, placed.get(&(f.ino, f.generation, f.mod_seq)).copied()))
                .collect()
        };
        let roots: Vec<(&LifeEntry, Option<usize>)> = {
            let pushed = lock(&staging.pushed);
            tree.iter()
                .filter(|e| e.committed && e.pushed_flag && e.staged())
                .map(|r| (r, pushed.get(&(r.ino, r.generation)).copied()))
                .collect()
        };
        if staged.is_empty() && roots.is_empty() {
            return false;
        }
        let on = |i: usize, list: &[(&'a LifeEntry, Option<usize>)]| -> Vec<&'a LifeEntry> {
            list.iter()
                .filter(|(_, at)| at.is_none_or(|p| p == i))
                .map(|(e, _)| *e)
                .collect()
        };
        let mut changed = false;
        for i in 0..staging.count() {
            if !staging.up(i) {
                continue;
            }
            let mine_f = on(i, &staged);
            let mine_r = on(i, &roots);
            if mine_f.is_empty() && mine_r.is_empty() {
                continue;
            }
            let mut queries: Vec<(PullKind, &str)> = mine_f
                .iter()
                .map(|f| (PullKind::File, key_of(&f.path)))
                .collect();
            queries.extend(
                mine_r
                    .iter()
                    .map(|r| (PullKind::Checkpoint, key_of(&r.path))),
            );
            let states = match staging.with_conn(i, |c| c.pull(&queries)) {
                Ok(s) => s,
                Err(e) => {
                    self.record_failure(format!(
                        "cannot ask {} what has drained: {e}",
                        staging.servers[i].addr
                    ));
                    continue;
                }
            };
            let (file_states, root_states) = states.split_at(mine_f.len());
            for (f, st) in mine_f.iter().zip(file_states) {
                if st.level != Level::Durable {
                    continue;
                }
                let Ok(ours) = self.digest_of(f) else {
                    continue;
                };
                if cascade_staging::hex(&st.blake3) == ours
                    && self.store().mark_durable(f.ino, f.generation, f.mod_seq)
                {
                    changed = true;
                }
            }
            for (r, st) in mine_r.iter().zip(root_states) {
                if st.level != Level::Durable {
                    continue;
                }
                // The server wrote the marker for the version pushed; the root's version
                // still equals it (it is `staged`), so nothing below changed since.
                for f in tree
                    .iter()
                    .filter(|e| e.kind == FileKind::File && e.is_at_or_below(&r.path))
                {
                    self.store().mark_durable(f.ino, f.generation, f.mod_seq);
                }
                if self.store().mark_complete(r.ino, r.generation, r.mod_seq) {
                    changed = true;
                    if let Ok(mut s) = self.stats.lock() {
                        s.markers += 1;
                    }
                    self.log(|| format!("checkpoint {} complete (marker by its server)", r.path));
                }
            }
        }
        changed
    }

    /// Read-through from the staging servers: the newest version of `key` staged and not yet
    /// drained, written into `tmp` in the store and checked against its BLAKE3; its size.
    /// None if no server has one (the durable store decides then).
    pub(crate) fn fetch_from_staging(
        &self,
        staging: &Staging,
        key: &str,
        tmp: &str,
    ) -> Result<Option<u64>> {
        let mut best: Option<(usize, u64)> = None;
        for i in 0..staging.count() {
            if let Ok(states) = staging.with_conn(i, |c| c.pull(&[(PullKind::File, key)])) {
                // Only versions not yet drained: a drained one is in the durable store, which
                // may since hold a newer version uploaded directly.
                if let Some(st) = states.first().filter(|s| s.level == Level::Staged) {
                    if best.is_none_or(|(_, stamp)| st.stamp > stamp) {
                        best = Some((i, st.stamp));
                    }
                }
            }
        }
        let Some((i, stamp)) = best else {
            return Ok(None);
        };
        // A server that was down while the file was rewritten may still hold an older
        // version than the durable store's (it is retired when that server drains).
        if self
            .durable()
            .recorded_version(key)
            .ok()
            .flatten()
            .is_some_and(|newer| newer > stamp)
        {
            return Ok(None);
        }
        let store = self.store();
        let file = create_for_writing(store, tmp)?;
        let mut out = StoreWriter::new(&file, tmp);
        let mut hasher = blake3::Hasher::new();
        let mut offset = 0u64;
        let mut buf = Vec::new();
        let fetched = staging.with_conn(i, |c| loop {
            let Some(meta) = c.read(key, offset, MAX_DATA as u32, &mut buf)? else {
                return Ok(None);
            };
            if !buf.is_empty() {
                hasher.update(&buf);
                std::io::Write::write_all(&mut out, &buf)
                    .map_err(|e| cascade_staging::Error::io(tmp, e))?;
                offset += buf.len() as u64;
            }
            if offset >= meta.size || buf.is_empty() {
                return Ok(Some(meta));
            }
        });
        let meta = match fetched {
            Ok(Some(m)) => m,
            // Gone (drained and reclaimed) or the server failed: the durable tier decides.
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
                    staging.servers[i].addr
                ),
            });
        }
        Ok(Some(meta.size))
    }
}
