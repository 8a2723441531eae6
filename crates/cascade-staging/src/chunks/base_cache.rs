//! The staging server's cache of recent delta bases (docs/staging-arenas.md, "Base cache"):
//! the raw bytes of data chunks this server received, rebuilt or read lately, appended to
//! files on its SSD (`<dedup dir>/base-cache/cache-NNNNNNNN`, at most [`FILE_BYTES`] each)
//! and found through an in-memory index, so that a delta chunk is checked against its base
//! without reading the base from the durable store over its link.
//!
//! Bounded by bytes: the oldest file goes first, with its entries. Nothing in it is trusted:
//! every entry served is hashed and must be its score; one that is not (a torn write, a
//! damaged sector) is dropped and reported, and the caller reads the base from the durable
//! repository. The cache is emptied at start: it holds no acknowledged data, only copies.
//! Appending to a few files, not one file per chunk: creating a file costs about half a
//! millisecond on ext4, which on the PutChunks path cost more than the reads it saves.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cascade_dedup::{score, Score};

use super::lock;

/// Most bytes of one cache file (a quarter of the bound, at least 1 MiB); past it the next
/// file is started.
pub const FILE_BYTES: u64 = 64 << 20;

/// What one lookup found.
pub enum Cached {
    /// The chunk's raw bytes, checked against its score.
    Hit(Vec<u8>),
    /// Not in the cache.
    Miss,
    /// In the cache, but its bytes did not hash to its score (dropped now).
    Corrupt,
}

#[derive(Clone, Copy)]
struct Entry {
    file: u32,
    offset: u64,
    len: u32,
}

struct CacheFile {
    file: Arc<File>,
    /// Bytes appended or reserved.
    end: u64,
    /// The scores whose entries are in it (dropped with it).
    scores: Vec<Score>,
}

#[derive(Default)]
struct State {
    entries: HashMap<Score, Entry>,
    files: BTreeMap<u32, CacheFile>,
    next_file: u32,
    /// Bytes of the files.
    bytes: u64,
    /// Bytes of the live entries.
    entry_bytes: u64,
}

pub struct BaseCache {
    dir: PathBuf,
    max_bytes: u64,
    file_bytes: u64,
    state: Mutex<State>,
}

impl BaseCache {
    /// An empty cache of at most `max_bytes` in `dir` (created; what a previous run left
    /// there is deleted). `max_bytes == 0`: no cache.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<BaseCache> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if max_bytes > 0 {
            std::fs::create_dir_all(dir)?;
        }
        Ok(BaseCache {
            dir: dir.to_path_buf(),
            max_bytes,
            file_bytes: (max_bytes / 4).clamp(1 << 20, FILE_BYTES),
            state: Mutex::new(State::default()),
        })
    }

    fn path_of(&self, n: u32) -> PathBuf {
        self.dir.join(format!("cache-{n:08}"))
    }

    /// Where `len` bytes go: a file and an offset in it, reserved (a new file once the last
    /// one is full, the oldest deleted while the cache is over its bound).
    fn reserve(&self, len: u64) -> Option<(u32, Arc<File>, u64)> {
        let mut st = lock(&self.state);
        let current = st
            .files
            .iter()
            .next_back()
            .filter(|(_, f)| f.end + len <= self.file_bytes)
            .map(|(&n, _)| n);
        let n = match current {
            Some(n) => n,
            None => {
                let n = st.next_file;
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(self.path_of(n))
                    .ok()?;
                st.next_file += 1;
                st.files.insert(
                    n,
                    CacheFile {
                        file: Arc::new(file),
                        end: 0,
                        scores: Vec::new(),
                    },
                );
                n
            }
        };
        st.bytes += len;
        while st.bytes > self.max_bytes && st.files.len() > 1 {
            let Some((&old, _)) = st.files.iter().next() else {
                break;
            };
            self.drop_file(&mut st, old);
        }
        let f = st.files.get_mut(&n)?;
        let offset = f.end;
        f.end += len;
        Some((n, f.file.clone(), offset))
    }

    fn drop_file(&self, st: &mut State, n: u32) {
        let Some(f) = st.files.remove(&n) else {
            return;
        };
        st.bytes = st.bytes.saturating_sub(f.end);
        for s in f.scores {
            if let Some(e) = st.entries.get(&s).copied().filter(|e| e.file == n) {
                st.entries.remove(&s);
                st.entry_bytes -= u64::from(e.len);
            }
        }
        // Readers holding its descriptor finish their reads.
        let _ = std::fs::remove_file(self.path_of(n));
    }

    /// Keeps `raw` as the bytes of chunk `s` (the caller checked them against `s`). A
    /// failed write only loses the entry.
    pub fn insert(&self, s: &Score, raw: &[u8]) {
        let len = raw.len() as u64;
        if self.max_bytes == 0 || len > self.file_bytes || len == 0 {
            return;
        }
        if lock(&self.state).entries.contains_key(s) {
            return;
        }
        let Some((n, file, offset)) = self.reserve(len) else {
            return;
        };
        // Outside the lock; the entry is found only once its bytes are written.
        if file.write_all_at(raw, offset).is_err() {
            return;
        }
        let mut st = lock(&self.state);
        if st.entries.contains_key(s) {
            return;
        }
        let Some(f) = st.files.get_mut(&n) else {
            // Its file was dropped meanwhile.
            return;
        };
        f.scores.push(*s);
        st.entries.insert(
            *s,
            Entry {
                file: n,
                offset,
                len: raw.len() as u32,
            },
        );
        st.entry_bytes += len;
    }

    /// The raw bytes of chunk `s` if the cache has them and they hash to `s`.
    pub fn get(&self, s: &Score) -> Cached {
        let found = {
            let st = lock(&self.state);
            st.entries
                .get(s)
                .copied()
                .and_then(|e| st.files.get(&e.file).map(|f| (e, f.file.clone())))
        };
        let Some((e, file)) = found else {
            return Cached::Miss;
        };
        let mut raw = vec![0u8; e.len as usize];
        match file.read_exact_at(&mut raw, e.offset) {
            Ok(()) if score(&raw) == *s => Cached::Hit(raw),
            _ => {
                let mut st = lock(&self.state);
                if st.entries.get(s).is_some_and(|now| now.file == e.file) {
                    st.entries.remove(s);
                    st.entry_bytes -= u64::from(e.len);
                }
                Cached::Corrupt
            }
        }
    }

    /// Entries and their bytes now.
    pub fn usage(&self) -> (u64, u64) {
        let st = lock(&self.state);
        (st.entries.len() as u64, st.entry_bytes)
    }
}
