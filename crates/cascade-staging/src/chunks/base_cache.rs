//! The staging server's cache of recent delta bases (docs/staging-arenas.md, "Base cache"):
//! the raw bytes of data chunks this server received, rebuilt or read lately, one file per
//! chunk on its SSD (`<dedup dir>/base-cache/<score>`), so that a delta chunk is checked
//! against its base without reading the base from the durable store over its link.
//!
//! Bounded by bytes: the oldest entries go first. Nothing in it is trusted: every entry
//! served is hashed and must be its score; one that is not (a torn or damaged file) is
//! dropped and reported, and the caller reads the base from the durable repository. The
//! cache is emptied at start: it holds no acknowledged data, only copies.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cascade_dedup::score::to_hex;
use cascade_dedup::{score, Score};

use super::lock;

/// What one lookup found.
pub enum Cached {
    /// The chunk's raw bytes, checked against its score.
    Hit(Vec<u8>),
    /// Not in the cache.
    Miss,
    /// In the cache, but its bytes did not hash to its score (dropped now).
    Corrupt,
}

#[derive(Default)]
struct Entries {
    /// Score to the entry's length.
    lens: HashMap<Score, u32>,
    /// Insertion order, oldest first (scores no longer in `lens` are skipped).
    order: VecDeque<Score>,
    bytes: u64,
}

pub struct BaseCache {
    dir: PathBuf,
    max_bytes: u64,
    entries: Mutex<Entries>,
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
            entries: Mutex::new(Entries::default()),
        })
    }

    fn path_of(&self, s: &Score) -> PathBuf {
        self.dir.join(to_hex(s))
    }

    /// Keeps `raw` as the bytes of chunk `s` (the caller checked them against `s`). A
    /// failed write only loses the entry.
    pub fn insert(&self, s: &Score, raw: &[u8]) {
        let len = raw.len() as u64;
        if self.max_bytes == 0 || len > self.max_bytes {
            return;
        }
        if lock(&self.entries).lens.contains_key(s) {
            return;
        }
        // Outside the lock: a concurrent insert of the same score writes the same bytes.
        if std::fs::write(self.path_of(s), raw).is_err() {
            let _ = std::fs::remove_file(self.path_of(s));
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut e = lock(&self.entries);
            if e.lens.insert(*s, raw.len() as u32).is_none() {
                e.order.push_back(*s);
                e.bytes += len;
            }
            while e.bytes > self.max_bytes {
                let Some(old) = e.order.pop_front() else {
                    break;
                };
                if let Some(l) = e.lens.remove(&old) {
                    e.bytes -= u64::from(l);
                    evicted.push(old);
                }
            }
        }
        for old in evicted {
            let _ = std::fs::remove_file(self.path_of(&old));
        }
    }

    /// The raw bytes of chunk `s` if the cache has them and they hash to `s`.
    pub fn get(&self, s: &Score) -> Cached {
        let Some(len) = lock(&self.entries).lens.get(s).copied() else {
            return Cached::Miss;
        };
        match std::fs::read(self.path_of(s)) {
            Ok(raw) if raw.len() == len as usize && score(&raw) == *s => Cached::Hit(raw),
            // Evicted between the lookup and the read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cached::Miss,
            _ => {
                self.drop_entry(s);
                Cached::Corrupt
            }
        }
    }

    fn drop_entry(&self, s: &Score) {
        {
            let mut e = lock(&self.entries);
            match e.lens.remove(s) {
                Some(l) => e.bytes -= u64::from(l),
                None => return,
            }
        }
        let _ = std::fs::remove_file(self.path_of(s));
    }

    /// Entries and their bytes now.
    pub fn usage(&self) -> (u64, u64) {
        let e = lock(&self.entries);
        (e.lens.len() as u64, e.bytes)
    }
}
