//! Dedup manifests a staging server keeps until every blob they name is in the durable
//! repository (docs/staging-arenas.md, "Pending manifests"). One file per manifest, written
//! under a temporary name part by part as PutManifest frames arrive, then fdatasynced and
//! renamed: a manifest is durable, whole, or absent. The score lists stay on disk (32 bytes
//! per blob: a large checkpoint names millions); only the file list is held in memory.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cascade_dedup::Score;

use super::io_err;
use crate::engine::{fsync_dir, Error};
use crate::protocol::{ManifestPart, RecipeEntry};

type Result<T> = std::result::Result<T, Error>;

const MAGIC: &[u8; 4] = b"CDM1";
const FORMAT_VERSION: u32 = 1;
const TAG_FILES: u8 = 1;
const TAG_SCORES: u8 = 2;
const TAG_END: u8 = 0xFF;
/// Most files one manifest may list (their entries are held in memory).
pub const MAX_FILES: usize = 1 << 20;

/// A manifest waiting for its blobs.
#[derive(Debug)]
pub struct PendingManifest {
    pub id: u64,
    pub namespace: String,
    pub checkpoint: String,
    pub single_file: bool,
    pub chunking: String,
    pub compression: String,
    pub files: Vec<RecipeEntry>,
    pub received_unix_ns: u64,
    pub score_count: u64,
    /// How many scores, from the start of the list, are known to be in the repository:
    /// the next check resumes there (blobs are never taken out of an index).
    pub checked: AtomicU64,
    /// (file offset of a run of scores, their number), in list order.
    sections: Vec<(u64, u32)>,
    file: File,
    path: PathBuf,
}

/// A manifest being received, part by part, on one connection.
pub struct Upload {
    pub checkpoint: String,
    single_file: bool,
    chunking: String,
    compression: String,
    next_part: u32,
    file: File,
    tmp: PathBuf,
    len: u64,
    crc: u32,
    files: Vec<RecipeEntry>,
    sections: Vec<(u64, u32)>,
    score_count: u64,
    namespace: String,
    committed: bool,
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Upload {
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, self.len)?;
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }
}

struct State {
    pending: BTreeMap<u64, Arc<PendingManifest>>,
    next_id: u64,
    next_upload: u64,
}

pub struct ManifestStore {
    dir: PathBuf,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn invalid(what: impl Into<String>) -> Error {
    Error::Invalid { what: what.into() }
}

fn manifest_name(id: u64) -> String {
    format!("m-{id:016}.cdm")
}

fn parse_manifest_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("m-")?.strip_suffix(".cdm")?;
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Protocol strings are at most MAX_KEY bytes.
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl ManifestStore {
    /// Opens (creating) the directory, deletes uploads a crash cut short and loads every
    /// manifest; one that does not check is renamed `*.corrupt` with a warning.
    pub fn open(dir: &Path) -> Result<(ManifestStore, Vec<String>)> {
        let mut warnings = Vec::new();
        let ids = super::scan_dir(dir, parse_manifest_name)?;
        let store = ManifestStore {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                pending: BTreeMap::new(),
                next_id: ids.last().map_or(0, |i| i + 1),
                next_upload: 0,
            }),
        };
        for id in ids {
            let path = dir.join(manifest_name(id));
            match load(id, &path) {
                // In id order: a newer manifest of the same checkpoint replaces an older one.
                Ok(m) => {
                    store.register(m);
                }
                Err(why) => {
                    let aside = path.with_extension("cdm.corrupt");
                    let _ = std::fs::rename(&path, &aside);
                    warnings.push(format!(
                        "{}: {why}; moved aside to {}",
                        path.display(),
                        aside.display()
                    ));
                }
            }
        }
        fsync_dir(dir).map_err(|e| io_err(format!("fsync {}", dir.display()), e))?;
        Ok((store, warnings))
    }

    /// Starts receiving a manifest with its part 0.
    pub fn begin(&self, namespace: &str, part: &ManifestPart) -> Result<Upload> {
        if part.part != 0 {
            return Err(invalid(format!(
                "manifest of {}: part {} without part 0 on this connection",
                part.checkpoint, part.part
            )));
        }
        let n = {
            let mut g = lock(&self.state);
            g.next_upload += 1;
            g.next_upload
        };
        let tmp = self.dir.join(format!("upload-{n}.tmp"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| io_err(format!("create {}", tmp.display()), e))?;
        let mut up = Upload {
            checkpoint: part.checkpoint.to_string(),
            single_file: part.single_file,
            chunking: part.chunking.to_string(),
            compression: part.compression.to_string(),
            next_part: 0,
            file,
            tmp,
            len: 0,
            crc: 0,
            files: Vec::new(),
            sections: Vec::new(),
            score_count: 0,
            namespace: namespace.to_string(),
            committed: false,
        };
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        put_str(&mut head, namespace);
        put_str(&mut head, part.checkpoint);
        head.push(part.single_file as u8);
        put_str(&mut head, part.chunking);
        put_str(&mut head, part.compression);
        up.write(&head)
            .map_err(|e| io_err(format!("write {}", up.tmp.display()), e))?;
        Ok(up)
    }

    /// Adds a part (the next one, of the same checkpoint) to an upload.
    pub fn add(&self, up: &mut Upload, part: &ManifestPart) -> Result<()> {
        if part.part != up.next_part
            || part.checkpoint != up.checkpoint
            || part.single_file != up.single_file
            || part.chunking != up.chunking
            || part.compression != up.compression
        {
            return Err(invalid(format!(
                "manifest part {} of {} does not follow part {} of {} on this connection",
                part.part,
                part.checkpoint,
                up.next_part.wrapping_sub(1),
                up.checkpoint
            )));
        }
        if up.files.len() + part.files.len() > MAX_FILES {
            return Err(invalid(format!(
                "manifest of {}: more than {MAX_FILES} files",
                up.checkpoint
            )));
        }
        let t = up.tmp.display().to_string();
        let what = |e| io_err(format!("write {t}"), e);
        if !part.files.is_empty() {
            let mut b = vec![TAG_FILES];
            b.extend_from_slice(&(part.files.len() as u32).to_le_bytes());
            for f in &part.files {
                put_str(&mut b, &f.path);
                b.extend_from_slice(&f.size.to_le_bytes());
                b.extend_from_slice(&f.blake3);
                b.extend_from_slice(&f.root);
            }
            up.write(&b).map_err(what)?;
            up.files.extend(part.files.iter().cloned());
        }
        if !part.scores.is_empty() {
            let mut b = Vec::with_capacity(5 + part.scores.len() * 32);
            b.push(TAG_SCORES);
            b.extend_from_slice(&(part.scores.len() as u32).to_le_bytes());
            let at = up.len + 5;
            for s in &part.scores {
                b.extend_from_slice(s);
            }
            up.write(&b).map_err(what)?;
            up.sections.push((at, part.scores.len() as u32));
            up.score_count += part.scores.len() as u64;
        }
        up.next_part += 1;
        Ok(())
    }

    /// Makes an upload durable (end record, fdatasync, rename, directory fsync) and pending;
    /// it replaces an older pending manifest of the same checkpoint.
    pub fn commit(&self, mut up: Upload) -> Result<Arc<PendingManifest>> {
        let received = cascade_durable::now_unix_ns();
        let mut end = vec![TAG_END];
        end.extend_from_slice(&received.to_le_bytes());
        let t = up.tmp.display().to_string();
        up.write(&end)
            .map_err(|e| io_err(format!("write {t}"), e))?;
        let crc = up.crc;
        up.write(&crc.to_le_bytes())
            .map_err(|e| io_err(format!("write {t}"), e))?;
        up.file
            .sync_data()
            .map_err(|e| io_err(format!("fdatasync {t}"), e))?;
        let id = {
            let mut g = lock(&self.state);
            g.next_id += 1;
            g.next_id - 1
        };
        let path = self.dir.join(manifest_name(id));
        std::fs::rename(&up.tmp, &path)
            .map_err(|e| io_err(format!("rename {t} to {}", path.display()), e))?;
        up.committed = true;
        fsync_dir(&self.dir).map_err(|e| io_err(format!("fsync {}", self.dir.display()), e))?;
        let file = File::open(&path).map_err(|e| io_err(format!("open {}", path.display()), e))?;
        let m = PendingManifest {
            id,
            namespace: std::mem::take(&mut up.namespace),
            checkpoint: std::mem::take(&mut up.checkpoint),
            single_file: up.single_file,
            chunking: std::mem::take(&mut up.chunking),
            compression: std::mem::take(&mut up.compression),
            files: std::mem::take(&mut up.files),
            received_unix_ns: received,
            score_count: up.score_count,
            checked: AtomicU64::new(0),
            sections: std::mem::take(&mut up.sections),
            file,
            path,
        };
        Ok(self.register(m))
    }

    fn register(&self, m: PendingManifest) -> Arc<PendingManifest> {
        let m = Arc::new(m);
        let replaced: Vec<Arc<PendingManifest>> = {
            let mut g = lock(&self.state);
            let older: Vec<u64> = g
                .pending
                .values()
                .filter(|o| o.namespace == m.namespace && o.checkpoint == m.checkpoint)
                .map(|o| o.id)
                .collect();
            g.pending.insert(m.id, m.clone());
            older.iter().filter_map(|id| g.pending.remove(id)).collect()
        };
        for old in replaced {
            // Left behind by a crash, it is replaced again at the next open.
            let _ = std::fs::remove_file(&old.path);
        }
        m
    }

    /// Pending manifests, oldest first.
    pub fn pending(&self) -> Vec<Arc<PendingManifest>> {
        lock(&self.state).pending.values().cloned().collect()
    }

    pub fn find(&self, namespace: &str, checkpoint: &str) -> Option<Arc<PendingManifest>> {
        lock(&self.state)
            .pending
            .values()
            .find(|m| m.namespace == namespace && m.checkpoint == checkpoint)
            .cloned()
    }

    /// Up to `max` scores of `m`'s list from index `from`.
    pub fn read_scores(&self, m: &PendingManifest, from: u64, max: usize) -> Result<Vec<Score>> {
        let mut out = Vec::new();
        let mut skip = from;
        for &(at, count) in &m.sections {
            if out.len() >= max {
                break;
            }
            let count = u64::from(count);
            if skip >= count {
                skip -= count;
                continue;
            }
            let take = (count - skip).min((max - out.len()) as u64) as usize;
            let mut buf = vec![0u8; take * 32];
            m.file
                .read_exact_at(&mut buf, at + skip * 32)
                .map_err(|e| io_err(format!("read {}", m.path.display()), e))?;
            for s in buf.chunks_exact(32) {
                let mut score = [0u8; 32];
                score.copy_from_slice(s);
                out.push(score);
            }
            skip = 0;
        }
        Ok(out)
    }

    /// The manifest is in the repository: forget it (file deleted, directory synced).
    pub fn done(&self, id: u64) -> Result<()> {
        let removed = lock(&self.state).pending.remove(&id);
        if let Some(m) = removed {
            std::fs::remove_file(&m.path)
                .map_err(|e| io_err(format!("remove {}", m.path.display()), e))?;
            fsync_dir(&self.dir).map_err(|e| io_err(format!("fsync {}", self.dir.display()), e))?;
        }
        Ok(())
    }
}

impl PendingManifest {
    pub fn checked(&self) -> u64 {
        self.checked.load(Ordering::Relaxed)
    }
}

/// Reads a manifest file whole and checks it (format, structure, CRC).
fn load(id: u64, path: &Path) -> std::result::Result<PendingManifest, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.len() < 8 + 4 {
        return Err("too short".into());
    }
    let body_len = bytes.len() - 4;
    let crc = u32::from_le_bytes([
        bytes[body_len],
        bytes[body_len + 1],
        bytes[body_len + 2],
        bytes[body_len + 3],
    ]);
    if crc32c::crc32c(&bytes[..body_len]) != crc {
        return Err("checksum mismatch".into());
    }
    let mut r = Cursor {
        b: &bytes[..body_len],
        at: 0,
    };
    if r.take(4)? != MAGIC {
        return Err("not a pending dedup manifest (magic)".into());
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    let namespace = r.str()?;
    let checkpoint = r.str()?;
    let single_file = r.u8()? == 1;
    let chunking = r.str()?;
    let compression = r.str()?;
    let mut files = Vec::new();
    let mut sections = Vec::new();
    let mut score_count = 0u64;
    let received_unix_ns = loop {
        match r.u8()? {
            TAG_FILES => {
                let n = r.u32()? as usize;
                for _ in 0..n {
                    files.push(RecipeEntry {
                        path: r.str()?,
                        size: r.u64()?,
                        blake3: r.score()?,
                        root: r.score()?,
                    });
                }
            }
            TAG_SCORES => {
                let n = r.u32()?;
                sections.push((r.at as u64, n));
                r.take(n as usize * 32)?;
                score_count += u64::from(n);
            }
            TAG_END => break r.u64()?,
            t => return Err(format!("unknown section {t}")),
        }
    };
    if r.at != body_len {
        return Err("bytes after the end record".into());
    }
    let file = File::open(path).map_err(|e| e.to_string())?;
    Ok(PendingManifest {
        id,
        namespace,
        checkpoint,
        single_file,
        chunking,
        compression,
        files,
        received_unix_ns,
        score_count,
        checked: AtomicU64::new(0),
        sections,
        file,
        path: path.to_path_buf(),
    })
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn score(&mut self) -> std::result::Result<Score, String> {
        let mut a = [0u8; 32];
        a.copy_from_slice(self.take(32)?);
        Ok(a)
    }
    fn str(&mut self) -> std::result::Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }
}
