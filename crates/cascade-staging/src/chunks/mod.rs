//! The staging server's chunk store (docs/staging-arenas.md, "Chunk segments"): the
//! deduplicated chunks agents send, appended to log-structured segment files on the server's
//! SSD, made durable by group commit, found through an in-memory score index that is rebuilt
//! from the self-describing records at open, pushed to the durable repository in log order,
//! and reclaimed a segment at a time once everything in it is pushed.
//!
//! Concurrency: appends are serialised by one lock (a record is never written into a hole
//! another writer may leave, so a crash can only tear the log's tail); the state lock is
//! never held across a pwrite, pread or fsync; `sync_to` elects one caller per round to
//! fdatasync, the others wait for the round that covers them.

pub mod base_cache;
pub mod manifests;
mod record;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cascade_dedup::repo::format::{BlobKind, Stored};
use cascade_dedup::Score;

use crate::engine::{fsync_dir, Error};
use crate::protocol::WireChunk;

type Result<T> = std::result::Result<T, Error>;

/// The push cursor's file: everything before the position it holds is in the durable
/// repository.
const CURSOR: &str = "pushed";
const CURSOR_MAGIC: &[u8; 4] = b"CPSH";
const CURSOR_LEN: usize = 24;

#[derive(Debug, Clone)]
pub struct ChunkOptions {
    /// A segment is retired when an append would take it past this (default 64 MiB; kept
    /// within 1 MiB ..= 1 GiB so record offsets fit in 32 bits).
    pub segment_size: u64,
    /// Most bytes of segment files (None: only the file system limits). A PutChunks past it
    /// is refused with FULL.
    pub capacity: Option<u64>,
    /// Most chunks the in-memory score index holds (default 8 Mi, 512 GiB of 64 KiB chunks:
    /// at most 755 MiB of tables, docs/staging-arenas.md); a PutChunks past it is refused
    /// with FULL.
    pub max_chunks: usize,
    /// Most bytes of the cache of recent delta bases on the SSD (`base_cache`; default
    /// 1 GiB; 0: none): raw chunks this server received or read lately, so that checking a
    /// delta against its base does not read the base over the durable store's link.
    pub base_cache_bytes: u64,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            segment_size: 64 << 20,
            capacity: None,
            max_chunks: 8 << 20,
            base_cache_bytes: 1 << 30,
        }
    }
}

/// A place in the log: byte `offset` of segment `segment`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u32,
    pub offset: u64,
}

/// Where a chunk's record is: 12 bytes per entry of the score index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    segment: u32,
    offset: u32,
    len: u32,
}

/// Bytes of one entry of the score index's hash table (key and value).
pub const INDEX_ENTRY_BYTES: usize = std::mem::size_of::<(Score, Loc)>();

/// A chunk read back from the store (GetChunks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredChunk {
    pub kind: BlobKind,
    pub stored: Stored,
    pub raw_len: u32,
    pub data: Vec<u8>,
}

/// One record met by the push, in log order.
#[derive(Debug)]
pub enum Scanned {
    Chunk {
        namespace: String,
        score: Score,
        kind: BlobKind,
        stored: Stored,
        raw_len: u32,
        data: Vec<u8>,
    },
    /// A record that failed its checksum (the media, not a torn tail: the push reads only
    /// synced records). Its chunk is dropped from the index: it is lost unless resent.
    Corrupt { at: Position, why: String },
}

/// What a push round read: the records, where the next round starts, and how many chunks
/// and stored bytes the records held.
pub struct PushBatch {
    pub records: Vec<Scanned>,
    pub next: Position,
    pub chunks: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutOutcome {
    /// Chunks written now.
    pub stored: u32,
    /// Chunks this namespace already had (or that a concurrent write is making durable).
    pub present: u32,
    /// Of the `stored` ones, the delta chunks.
    pub deltas: u64,
    /// Their raw and stored bytes (of the `stored` ones).
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkUsage {
    pub segment_files: u64,
    pub segment_bytes: u64,
    /// Acknowledged chunks not yet pushed, and their stored bytes.
    pub pending_chunks: u64,
    pub pending_bytes: u64,
    /// Chunks in the score index, and the memory its tables take.
    pub index_chunks: u64,
    pub index_memory_bytes: u64,
}

struct Segment {
    file: Arc<File>,
    /// Bytes written (the next record goes here).
    size: u64,
}

struct Space {
    chunks: HashMap<Score, Loc>,
}

/// A record written and not yet synced: moved into the index by the round that syncs it.
struct Unsynced {
    ns: u32,
    score: Score,
    loc: Loc,
    seq: u64,
    stored_len: u64,
}

struct State {
    segments: BTreeMap<u32, Segment>,
    active: Option<u32>,
    next_segment: u32,
    names: Vec<String>,
    ns_ids: HashMap<String, u32>,
    spaces: Vec<Space>,
    indexed: usize,
    /// Written and not yet synced, by (namespace, score): the write's sequence number.
    unsynced: HashMap<(u32, Score), u64>,
    unsynced_records: Vec<Unsynced>,
    /// Sequence number of the last write.
    seq: u64,
    dirty: HashMap<u32, Arc<File>>,
    dir_dirty: bool,
    /// Everything before this is synced (what the push may read).
    synced_end: Position,
    cursor: Position,
    bytes: u64,
    pending_chunks: u64,
    pending_bytes: u64,
    warnings: Vec<String>,
}

impl State {
    fn ns_id(&mut self, namespace: &str) -> u32 {
        if let Some(&id) = self.ns_ids.get(namespace) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(namespace.to_string());
        self.ns_ids.insert(namespace.to_string(), id);
        self.spaces.push(Space {
            chunks: HashMap::new(),
        });
        id
    }

    fn index(&mut self, ns: u32, score: Score, loc: Loc) -> bool {
        let Some(space) = self.spaces.get_mut(ns as usize) else {
            return false;
        };
        let fresh = match space.chunks.entry(score) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(loc);
                true
            }
        };
        if fresh {
            self.indexed += 1;
        }
        fresh
    }

    /// The end of the log: the newest segment's end.
    fn log_end(&self) -> Position {
        match self.segments.iter().next_back() {
            Some((&segment, s)) => Position {
                segment,
                offset: s.size,
            },
            None => self.synced_end.max(self.cursor),
        }
    }
}

struct SyncCtl {
    running: bool,
    synced: u64,
    /// After a failed fdatasync nothing can be promised any more (the page cache no longer
    /// tells what reached the disk): every later write fails until the server restarts.
    failed: Option<String>,
}

pub struct ChunkStore {
    dir: PathBuf,
    opts: ChunkOptions,
    state: Mutex<State>,
    append: Mutex<()>,
    ctl: Mutex<SyncCtl>,
    ctl_cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Creates `dir` if needed, deletes the `*.tmp` files a crash left there, and returns the
/// numbers `parse` finds in the other names, sorted.
fn scan_dir<T: Ord>(dir: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
    let d = dir.display().to_string();
    std::fs::create_dir_all(dir).map_err(|e| io_err(format!("create {d}"), e))?;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_err(format!("list {d}"), e))? {
        let entry = entry.map_err(|e| io_err(format!("list {d}"), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".tmp") {
            std::fs::remove_file(entry.path())
                .map_err(|e| io_err(format!("remove {}", entry.path().display()), e))?;
        } else if let Some(n) = parse(name) {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

fn io_err(what: impl Into<String>, source: io::Error) -> Error {
    Error::Io {
        what: what.into(),
        source,
    }
}

fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

fn segment_name(n: u32) -> String {
    crate::engine::numbered_log_name("seg", n)
}

fn parse_segment_name(name: &str) -> Option<u32> {
    crate::engine::parse_numbered_log_name("seg", name)
}

/// Memory of a hash table holding `capacity` entries of `entry` bytes: hashbrown keeps a
/// power of two of buckets at most 7/8 full, one control byte per bucket plus 16.
fn table_bytes(capacity: usize, entry: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).max(capacity + 1).next_power_of_two();
    (buckets * (entry + 1) + 16) as u64
}

/// A record read at `pos` of `file`: its header and its whole bytes.
fn read_record(
    file: &File,
    pos: u64,
    limit: u64,
) -> std::result::Result<(record::Header, Vec<u8>), String> {
    if pos + record::HEADER_LEN as u64 > limit {
        return Err(format!("{} bytes left, less than a header", limit - pos));
    }
    let mut head = [0u8; record::HEADER_LEN];
    file.read_exact_at(&mut head, pos)
        .map_err(|e| format!("read: {e}"))?;
    let h = record::decode_header(&head)?;
    let len = h.record_len() as u64;
    if pos + len > limit {
        return Err(format!(
            "a {len}-byte record runs past the end ({} bytes left)",
            limit - pos
        ));
    }
    let mut rec = vec![0u8; len as usize];
    file.read_exact_at(&mut rec, pos)
        .map_err(|e| format!("read: {e}"))?;
    record::check_body(&h, &rec)?;
    Ok((h, rec))
}

impl ChunkStore {
    /// Opens (creating) the store in `dir`: reads the push cursor, deletes segments wholly
    /// pushed, scans every other segment to rebuild the score index (cutting a torn tail at
    /// the first record that does not check) and fdatasyncs them, so everything recovered is
    /// durable before it is reported as held.
    pub fn open(dir: &Path, mut opts: ChunkOptions) -> Result<ChunkStore> {
        opts.segment_size = opts.segment_size.clamp(1 << 20, 1 << 30);
        let d = dir.display().to_string();
        let mut warnings = Vec::new();
        let on_disk = scan_dir(dir, parse_segment_name)?;
        let cursor = match read_cursor(&dir.join(CURSOR)) {
            Ok(c) => c,
            Err(why) => {
                // Pushing again is harmless (the repository skips what it has); trusting a
                // garbled cursor could skip chunks never pushed.
                warnings.push(format!("{d}/{CURSOR}: {why}; pushing every segment again"));
                Position::default()
            }
        };
        let mut st = State {
            segments: BTreeMap::new(),
            active: None,
            next_segment: 0,
            names: Vec::new(),
            ns_ids: HashMap::new(),
            spaces: Vec::new(),
            indexed: 0,
            unsynced: HashMap::new(),
            unsynced_records: Vec::new(),
            seq: 0,
            dirty: HashMap::new(),
            dir_dirty: false,
            synced_end: cursor,
            cursor,
            bytes: 0,
            pending_chunks: 0,
            pending_bytes: 0,
            warnings: Vec::new(),
        };
        for n in on_disk {
            let path = dir.join(segment_name(n));
            let p = path.display().to_string();
            if n < cursor.segment {
                std::fs::remove_file(&path).map_err(|e| io_err(format!("remove {p}"), e))?;
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_err(format!("open {p}"), e))?;
            let len = file
                .metadata()
                .map_err(|e| io_err(format!("stat {p}"), e))?
                .len();
            let mut pos = 0u64;
            while pos < len {
                let (h, rec) = match read_record(&file, pos, len) {
                    Ok(r) => r,
                    Err(why) => {
                        // A write whose round never returned: nothing in it was acknowledged.
                        warnings.push(format!(
                            "{p}: cut an incomplete tail of {} bytes at offset {pos} ({why})",
                            len - pos
                        ));
                        file.set_len(pos)
                            .map_err(|e| io_err(format!("truncate {p}"), e))?;
                        break;
                    }
                };
                let ns_name =
                    std::str::from_utf8(&rec[record::HEADER_LEN..record::HEADER_LEN + h.ns_len])
                        .unwrap_or("");
                let ns = st.ns_id(ns_name);
                let loc = Loc {
                    segment: n,
                    offset: pos as u32,
                    len: rec.len() as u32,
                };
                st.index(ns, h.score, loc);
                if (Position {
                    segment: n,
                    offset: pos,
                }) >= cursor
                {
                    st.pending_chunks += 1;
                    st.pending_bytes += h.stored_len as u64;
                }
                pos += rec.len() as u64;
            }
            if pos == 0 {
                std::fs::remove_file(&path).map_err(|e| io_err(format!("remove {p}"), e))?;
                continue;
            }
            // Recovered bytes may still be only in the page cache (the process died, the
            // machine did not): make them durable before answering that they are held.
            file.sync_data()
                .map_err(|e| io_err(format!("fdatasync {p}"), e))?;
            st.bytes += pos;
            st.segments.insert(
                n,
                Segment {
                    file: Arc::new(file),
                    size: pos,
                },
            );
        }
        fsync_dir(dir).map_err(|e| io_err(format!("fsync {d}"), e))?;
        // A new segment must come after every record the cursor covers.
        let after_cursor = if cursor.offset > 0 {
            cursor.segment.saturating_add(1)
        } else {
            cursor.segment
        };
        st.next_segment = st
            .segments
            .keys()
            .next_back()
            .map_or(0, |n| n.saturating_add(1))
            .max(after_cursor);
        st.synced_end = st.log_end().max(cursor);
        st.warnings = warnings;
        Ok(ChunkStore {
            dir: dir.to_path_buf(),
            opts,
            state: Mutex::new(st),
            append: Mutex::new(()),
            ctl: Mutex::new(SyncCtl {
                running: false,
                synced: 0,
                failed: None,
            }),
            ctl_cv: Condvar::new(),
        })
    }

    /// What open() recovered from (torn tails cut, a garbled cursor), one line each.
    pub fn recovery_warnings(&self) -> Vec<String> {
        lock(&self.state).warnings.clone()
    }

    /// For each score: whether this namespace holds it durably here.
    pub fn held(&self, namespace: &str, scores: &[Score]) -> Vec<bool> {
        let g = lock(&self.state);
        match g.ns_ids.get(namespace) {
            Some(&ns) => {
                let chunks = &g.spaces[ns as usize].chunks;
                scores.iter().map(|s| chunks.contains_key(s)).collect()
            }
            None => vec![false; scores.len()],
        }
    }

    /// Stores the chunks (checked against their scores by the caller) this namespace does
    /// not hold yet, and returns once they, and any equal chunk another connection is
    /// writing, are durable. Full when the capacity or the index limit would be passed.
    pub fn put(&self, namespace: &str, chunks: &[WireChunk]) -> Result<PutOutcome> {
        let mut outcome = PutOutcome::default();
        let append = lock(&self.append);
        self.check_failed()?;
        let mut target = 0u64;
        let mut fresh: Vec<&WireChunk> = Vec::new();
        let ns = {
            let mut g = lock(&self.state);
            let ns = g.ns_id(namespace);
            let mut seen = HashSet::new();
            for c in chunks {
                if !seen.insert(c.score) || g.spaces[ns as usize].chunks.contains_key(&c.score) {
                    outcome.present += 1;
                } else if let Some(&seq) = g.unsynced.get(&(ns, c.score)) {
                    outcome.present += 1;
                    target = target.max(seq);
                } else {
                    fresh.push(c);
                }
            }
            if g.indexed + g.unsynced.len() + fresh.len() > self.opts.max_chunks {
                return Err(Error::Full {
                    what: format!(
                        "staging chunk index is full: {} chunks held, at most {}",
                        g.indexed + g.unsynced.len(),
                        self.opts.max_chunks
                    ),
                });
            }
            ns
        };
        if !fresh.is_empty() {
            let mut buf = Vec::with_capacity(
                fresh
                    .iter()
                    .map(|c| record::HEADER_LEN + namespace.len() + c.data.len())
                    .sum(),
            );
            let mut records = Vec::with_capacity(fresh.len());
            for c in &fresh {
                let start = buf.len();
                record::encode(
                    &mut buf, namespace, &c.score, c.kind, c.stored, c.raw_len, c.data,
                );
                records.push((start, buf.len() - start));
                outcome.raw_bytes += u64::from(c.raw_len);
                outcome.deltas += u64::from(c.stored == Stored::Delta);
                outcome.stored_bytes += c.data.len() as u64;
            }
            let mut next = 0;
            while next < records.len() {
                let lens: Vec<usize> = records[next..].iter().map(|r| r.1).collect();
                let (segment, file, pos, count) = self.place(&lens)?;
                let (from, to) = (
                    records[next].0,
                    records[next + count - 1].0 + records[next + count - 1].1,
                );
                // Under the append lock only: nobody else places a record meanwhile, so the
                // log has no hole a crash could leave before an acknowledged record.
                let written = file.write_all_at(&buf[from..to], pos);
                let mut g = lock(&self.state);
                if let Err(e) = written {
                    // The segment's end stays at `pos`: the next append overwrites what this
                    // one may have left.
                    let what = format!(
                        "write {} bytes to {} at {pos}",
                        to - from,
                        segment_name(segment)
                    );
                    return Err(if is_no_space(&e) {
                        Error::Full {
                            what: format!(
                                "staging directory {} is full: {what}: {e}",
                                self.dir.display()
                            ),
                        }
                    } else {
                        io_err(what, e)
                    });
                }
                if let Some(s) = g.segments.get_mut(&segment) {
                    s.size = pos + (to - from) as u64;
                }
                g.bytes += (to - from) as u64;
                g.seq += 1;
                let seq = g.seq;
                g.dirty.insert(segment, file);
                for (c, (start, len)) in fresh[next..next + count]
                    .iter()
                    .zip(&records[next..next + count])
                {
                    g.unsynced.insert((ns, c.score), seq);
                    g.unsynced_records.push(Unsynced {
                        ns,
                        score: c.score,
                        loc: Loc {
                            segment,
                            offset: (pos + (start - from) as u64) as u32,
                            len: *len as u32,
                        },
                        seq,
                        stored_len: c.data.len() as u64,
                    });
                }
                target = seq;
                outcome.stored += count as u32;
                next += count;
            }
        }
        drop(append);
        self.sync_to(target)?;
        Ok(outcome)
    }

    fn check_failed(&self) -> Result<()> {
        match &lock(&self.ctl).failed {
            None => Ok(()),
            Some(why) => Err(io_err(
                "staging chunk store stopped after a failed fdatasync; restart the server to recover",
                io::Error::other(why.clone()),
            )),
        }
    }

    /// Where the next records go (their lengths `lens`): the end of the active segment, as
    /// many as fit there; else a new segment (a record larger than a segment goes alone into
    /// an empty one). Returns (segment, file, position, how many records). Called under the
    /// append lock.
    fn place(&self, lens: &[usize]) -> Result<(u32, Arc<File>, u64, usize)> {
        let mut g = lock(&self.state);
        let fitting = |size: u64| {
            let mut end = size;
            let mut n = 0;
            for &len in lens {
                if end + len as u64 > self.opts.segment_size && !(n == 0 && size == 0) {
                    break;
                }
                end += len as u64;
                n += 1;
            }
            (n, end - size)
        };
        let current = g.active.and_then(|n| g.segments.get(&n).map(|s| (n, s)));
        if let Some((n, seg)) = current {
            let (count, bytes) = fitting(seg.size);
            if count > 0 {
                let placed = (n, seg.file.clone(), seg.size, count);
                self.check_capacity(&g, bytes)?;
                return Ok(placed);
            }
        }
        let (count, bytes) = fitting(0);
        self.check_capacity(&g, bytes)?;
        let n = g.next_segment;
        let path = self.dir.join(segment_name(n));
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => Arc::new(f),
            Err(e) if is_no_space(&e) => {
                return Err(Error::Full {
                    what: format!(
                        "staging directory {} is full: cannot create {}: {e}",
                        self.dir.display(),
                        segment_name(n)
                    ),
                })
            }
            Err(e) => return Err(io_err(format!("create {}", path.display()), e)),
        };
        g.next_segment = n.saturating_add(1);
        g.dir_dirty = true;
        g.active = Some(n);
        g.segments.insert(
            n,
            Segment {
                file: file.clone(),
                size: 0,
            },
        );
        Ok((n, file, 0, count))
    }

    fn check_capacity(&self, g: &State, more: u64) -> Result<()> {
        match self.opts.capacity {
            Some(cap) if g.bytes + more > cap => Err(Error::Full {
                what: format!(
                    "staging chunk store {} is full: {} of {cap} bytes used, {more} more requested",
                    self.dir.display(),
                    g.bytes
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Returns once a sync round that covers write `target` completed.
    fn sync_to(&self, target: u64) -> Result<()> {
        if target == 0 {
            return Ok(());
        }
        loop {
            let mut ctl = lock(&self.ctl);
            loop {
                if ctl.synced >= target {
                    return Ok(());
                }
                if ctl.failed.is_some() {
                    drop(ctl);
                    return self.check_failed();
                }
                if !ctl.running {
                    break;
                }
                ctl = self.ctl_cv.wait(ctl).unwrap_or_else(|e| e.into_inner());
            }
            ctl.running = true;
            drop(ctl);
            let round = self.sync_round();
            let mut ctl = lock(&self.ctl);
            ctl.running = false;
            match round {
                Ok(seq) => ctl.synced = ctl.synced.max(seq),
                Err(e) => {
                    if ctl.failed.is_none() {
                        ctl.failed = Some(e.to_string());
                    }
                }
            }
            self.ctl_cv.notify_all();
        }
    }

    /// One group commit: fdatasync every segment written since the last round (and the
    /// directory if a segment was created), then make those records visible.
    fn sync_round(&self) -> Result<u64> {
        let (seq, files, dir_dirty, end) = {
            let mut g = lock(&self.state);
            (
                g.seq,
                std::mem::take(&mut g.dirty),
                std::mem::take(&mut g.dir_dirty),
                g.log_end(),
            )
        };
        for (n, f) in &files {
            f.sync_data()
                .map_err(|e| io_err(format!("fdatasync {}", segment_name(*n)), e))?;
        }
        if dir_dirty {
            fsync_dir(&self.dir).map_err(|e| io_err(format!("fsync {}", self.dir.display()), e))?;
        }
        let mut g = lock(&self.state);
        let records = std::mem::take(&mut g.unsynced_records);
        for r in records {
            if r.seq > seq {
                g.unsynced_records.push(r);
                continue;
            }
            g.unsynced.remove(&(r.ns, r.score));
            g.index(r.ns, r.score, r.loc);
            g.pending_chunks += 1;
            g.pending_bytes += r.stored_len;
        }
        g.synced_end = g.synced_end.max(end);
        if g.unsynced.is_empty() && g.unsynced.capacity() > 1024 {
            // A large frame's worth of entries: give the memory back once it is indexed.
            g.unsynced.shrink_to_fit();
            g.unsynced_records.shrink_to_fit();
        }
        Ok(seq)
    }

    /// A chunk this namespace holds, read back and checked against its record's CRC.
    pub fn get(&self, namespace: &str, score: &Score) -> Result<Option<StoredChunk>> {
        let (file, loc) = {
            let g = lock(&self.state);
            let Some(&ns) = g.ns_ids.get(namespace) else {
                return Ok(None);
            };
            let Some(&loc) = g.spaces[ns as usize].chunks.get(score) else {
                return Ok(None);
            };
            match g.segments.get(&loc.segment) {
                Some(s) => (s.file.clone(), loc),
                // Reclaimed just now (pushed): the durable repository has it.
                None => return Ok(None),
            }
        };
        let pos = u64::from(loc.offset);
        let (h, rec) =
            read_record(&file, pos, pos + u64::from(loc.len)).map_err(|why| Error::Corrupt {
                what: format!(
                    "chunk {} in {} at {pos}: {why}",
                    crate::hex(score),
                    segment_name(loc.segment)
                ),
            })?;
        if h.score != *score {
            return Err(Error::Corrupt {
                what: format!(
                    "{} at {pos} holds chunk {}, the index says {}",
                    segment_name(loc.segment),
                    crate::hex(&h.score),
                    crate::hex(score)
                ),
            });
        }
        let data = rec[record::HEADER_LEN + h.ns_len..].to_vec();
        Ok(Some(StoredChunk {
            kind: h.kind,
            stored: h.stored,
            raw_len: h.raw_len,
            data,
        }))
    }

    /// Forgets a chunk whose record turned out corrupt, so that Lacks asks for it again.
    pub fn forget(&self, namespace: &str, score: &Score) {
        let mut g = lock(&self.state);
        if let Some(&ns) = g.ns_ids.get(namespace) {
            if g.spaces[ns as usize].chunks.remove(score).is_some() {
                g.indexed -= 1;
            }
        }
    }

    /// (push cursor, end of the synced log): the records in between are to push.
    pub fn push_window(&self) -> (Position, Position) {
        let g = lock(&self.state);
        (g.cursor, g.synced_end)
    }

    /// Reads synced records in log order from `from`, until about `max_bytes` of stored
    /// data or the synced end; `pace(bytes)` is called after each record (the server uses it
    /// to yield to clients).
    pub fn read_for_push(
        &self,
        from: Position,
        max_bytes: u64,
        pace: &mut dyn FnMut(u64),
    ) -> Result<PushBatch> {
        let mut batch = PushBatch {
            records: Vec::new(),
            next: from,
            chunks: 0,
            bytes: 0,
        };
        let mut pos = from;
        while batch.bytes < max_bytes {
            let (file, limit, end, following) = {
                let g = lock(&self.state);
                let end = g.synced_end;
                if pos >= end {
                    break;
                }
                let Some((&n, seg)) = g.segments.range(pos.segment..).next() else {
                    break;
                };
                if n != pos.segment {
                    pos = Position {
                        segment: n,
                        offset: 0,
                    };
                }
                let limit = if n == end.segment {
                    end.offset
                } else {
                    seg.size
                };
                let following = g
                    .segments
                    .range(n.saturating_add(1)..)
                    .next()
                    .map(|(&m, _)| m);
                (seg.file.clone(), limit, end, following)
            };
            if pos.offset >= limit {
                if pos.segment >= end.segment {
                    break;
                }
                // A finished segment: on to the next one.
                pos = Position {
                    segment: following.unwrap_or(pos.segment.saturating_add(1)),
                    offset: 0,
                };
                batch.next = pos;
                continue;
            }
            match read_record(&file, pos.offset, limit) {
                Ok((h, mut rec)) => {
                    let namespace = std::str::from_utf8(
                        &rec[record::HEADER_LEN..record::HEADER_LEN + h.ns_len],
                    )
                    .unwrap_or("")
                    .to_string();
                    let data = rec.split_off(record::HEADER_LEN + h.ns_len);
                    pos.offset += h.record_len() as u64;
                    batch.chunks += 1;
                    batch.bytes += h.stored_len as u64;
                    pace(h.record_len() as u64);
                    batch.records.push(Scanned::Chunk {
                        namespace,
                        score: h.score,
                        kind: h.kind,
                        stored: h.stored,
                        raw_len: h.raw_len,
                        data,
                    });
                }
                Err(why) => {
                    // Synced bytes that do not check: the media. Without a trustworthy
                    // length the rest of this segment cannot be walked.
                    batch.records.push(Scanned::Corrupt { at: pos, why });
                    pos.offset = limit;
                }
            }
            batch.next = pos;
        }
        Ok(batch)
    }

    /// Records (durably) that every record before `upto` is in the durable repository
    /// (`chunks` and `bytes`: what they held), then deletes the segments wholly before it.
    pub fn mark_pushed(&self, upto: Position, chunks: u64, bytes: u64) -> Result<()> {
        write_cursor(&self.dir, upto)?;
        let reclaimed: Vec<(u32, Segment)> = {
            let mut g = lock(&self.state);
            g.cursor = g.cursor.max(upto);
            g.pending_chunks = g.pending_chunks.saturating_sub(chunks);
            g.pending_bytes = g.pending_bytes.saturating_sub(bytes);
            let done: Vec<u32> = g
                .segments
                .range(..g.cursor.segment)
                .map(|(&n, _)| n)
                .filter(|&n| Some(n) != g.active)
                .collect();
            let mut out = Vec::with_capacity(done.len());
            for n in done {
                if let Some(s) = g.segments.remove(&n) {
                    g.bytes = g.bytes.saturating_sub(s.size);
                    g.dirty.remove(&n);
                    out.push((n, s));
                }
            }
            out
        };
        for (n, seg) in reclaimed {
            self.unindex_segment(n, &seg);
            let path = self.dir.join(segment_name(n));
            // A file left behind is deleted by the next open (it is before the cursor).
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }

    /// Drops the index entries pointing into segment `n` (about to be deleted), walking its
    /// record headers; if they cannot be walked, every entry is checked instead.
    fn unindex_segment(&self, n: u32, seg: &Segment) {
        let mut keys: Vec<(String, Score)> = Vec::new();
        let mut pos = 0u64;
        let mut walked = true;
        while pos < seg.size {
            let mut head = [0u8; record::HEADER_LEN];
            let parsed = seg
                .file
                .read_exact_at(&mut head, pos)
                .map_err(|e| e.to_string())
                .and_then(|()| record::decode_header(&head));
            let Ok(h) = parsed else {
                walked = false;
                break;
            };
            let mut ns = vec![0u8; h.ns_len];
            if seg
                .file
                .read_exact_at(&mut ns, pos + record::HEADER_LEN as u64)
                .is_err()
            {
                walked = false;
                break;
            }
            keys.push((String::from_utf8_lossy(&ns).into_owned(), h.score));
            pos += h.record_len() as u64;
        }
        let mut g = lock(&self.state);
        let mut removed = 0usize;
        if walked {
            for (ns, score) in keys {
                let Some(&id) = g.ns_ids.get(&ns) else {
                    continue;
                };
                let chunks = &mut g.spaces[id as usize].chunks;
                if chunks.get(&score).is_some_and(|l| l.segment == n) {
                    chunks.remove(&score);
                    removed += 1;
                }
            }
        } else {
            for space in &mut g.spaces {
                let before = space.chunks.len();
                space.chunks.retain(|_, l| l.segment != n);
                removed += before - space.chunks.len();
            }
        }
        g.indexed = g.indexed.saturating_sub(removed);
        for space in &mut g.spaces {
            // Give memory back once a table is mostly empty.
            if space.chunks.capacity() > 1024 && space.chunks.len() < space.chunks.capacity() / 4 {
                space.chunks.shrink_to_fit();
            }
        }
    }

    pub fn usage(&self) -> ChunkUsage {
        let g = lock(&self.state);
        let index_memory_bytes = g
            .spaces
            .iter()
            .map(|s| table_bytes(s.chunks.capacity(), INDEX_ENTRY_BYTES))
            .sum::<u64>()
            + table_bytes(
                g.unsynced.capacity(),
                std::mem::size_of::<((u32, Score), u64)>(),
            );
        ChunkUsage {
            segment_files: g.segments.len() as u64,
            segment_bytes: g.bytes,
            pending_chunks: g.pending_chunks,
            pending_bytes: g.pending_bytes,
            index_chunks: g.indexed as u64,
            index_memory_bytes,
        }
    }

    /// Namespaces that have chunks here (the push opens their repositories).
    pub fn namespaces(&self) -> Vec<String> {
        lock(&self.state).names.clone()
    }
}

/// Reads the push cursor; a missing file is the start of the log.
fn read_cursor(path: &Path) -> std::result::Result<Position, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Position::default()),
        Err(e) => return Err(e.to_string()),
    };
    if bytes.len() != CURSOR_LEN || &bytes[..4] != CURSOR_MAGIC {
        return Err("not a push cursor".into());
    }
    let crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc32c::crc32c(&bytes[..16]) != crc {
        return Err("checksum mismatch".into());
    }
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&bytes[8..16]);
    Ok(Position {
        segment: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        offset: u64::from_le_bytes(offset),
    })
}

/// Replaces the push cursor (temporary file, fdatasync, rename, directory fsync).
fn write_cursor(dir: &Path, p: Position) -> Result<()> {
    let mut bytes = [0u8; CURSOR_LEN];
    bytes[..4].copy_from_slice(CURSOR_MAGIC);
    bytes[4..8].copy_from_slice(&p.segment.to_le_bytes());
    bytes[8..16].copy_from_slice(&p.offset.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..16]);
    bytes[16..20].copy_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(format!("{CURSOR}.tmp"));
    let written = (|| {
        let f = File::create(&tmp)?;
        f.write_all_at(&bytes, 0)?;
        f.sync_data()?;
        std::fs::rename(&tmp, dir.join(CURSOR))?;
        fsync_dir(dir)
    })();
    written.map_err(|e| io_err(format!("record the push cursor in {}", dir.display()), e))
}

#[cfg(test)]
mod tests;
