//! The durable store's plain layout as a level (docs/durable-layout.md): each file is
//! uploaded as soon as it is closed (data straight from the block, then its `.blake3`), and a
//! committed checkpoint's completion marker is written once all its files are durable.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cascade_durable::DurableKey;
use cascade_durable::{FileDigest, SINGLE_PUT_MAX};
use cascade_store::{LifeEntry, Store};

use crate::level::{Found, Level, Listed, Step, Unit};
use crate::node::{files_of, reserved, Checkpoint, Node};
use crate::reader::StoreFileReader;
use crate::store_write::write_fetched;
use crate::{Error, Result};

pub(crate) struct PlainLayout {
    /// False with dedup on: checkpoints go to the repository, this layout takes only the
    /// files outside every checkpoint (a restart's `latest` pointer, say).
    sends_checkpoints: bool,
    /// Per directory read through lately: when it was looked at, and, if it is a checkpoint
    /// of several nodes that is not complete, which parts are in.
    partial: Mutex<HashMap<String, (Instant, Option<String>)>>,
}

/// How long what a directory's listing said about its parts is trusted.
const PARTS_SEEN_FOR: Duration = Duration::from_secs(2);

impl PlainLayout {
    pub(crate) fn new(sends_checkpoints: bool) -> PlainLayout {
        PlainLayout {
            sends_checkpoints,
            partial: Mutex::new(HashMap::new()),
        }
    }

    /// If the directory of `key` is a checkpoint of several nodes that is not complete: which
    /// parts are in ("parts from 1 of 2 nodes (a); missing b"). Its files are not read
    /// through: a restart must not start from part of a checkpoint. One listing per directory
    /// every [`PARTS_SEEN_FOR`].
    fn partial_parent(&self, node: &Node, key: &str) -> Result<Option<String>> {
        let Some((dir, _)) = key.rsplit_once('/') else {
            return Ok(None);
        };
        if let Some((at, parts)) = self.partial.lock().ok().and_then(|m| m.get(dir).cloned()) {
            if at.elapsed() < PARTS_SEEN_FOR {
                return Ok(parts);
            }
        }
        let prefix = format!("{dir}/{}", cascade_durable::PART_PREFIX);
        let has_parts = node
            .durable
            .list_dir(dir)
            .map_err(Error::Durable)?
            .iter()
            .any(|o| o.path.starts_with(&prefix));
        let parts = if has_parts && !node.durable.is_complete(dir).map_err(Error::Durable)? {
            let parts = node.durable.read_parts(dir).map_err(Error::Durable)?;
            Some(cascade_durable::PartsIn::of(&parts).describe())
        } else {
            None
        };
        if let Ok(mut m) = self.partial.lock() {
            m.insert(dir.to_string(), (Instant::now(), parts.clone()));
        }
        Ok(parts)
    }
}

/// A piece of the store's data region handed to the HTTP client as a request body; the
/// store clone keeps the mapping alive for as long as the client holds the buffer.
struct ShmPiece {
    _store: Store,
    addr: usize,
    len: usize,
}

impl AsRef<[u8]> for ShmPiece {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `addr..addr + len` lies inside the data region (checked by
        // `StoreFileReader::memory_pieces`), which stays mapped while `_store` lives. The
        // chunk belongs to a closed file; if it is rewritten meanwhile the upload is not
        // recorded as durable (its version changed), so torn bytes are never acknowledged.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// Uploads `files` with up to `uploads` threads; returns how many became durable.
pub(crate) fn upload_all(node: &Node, files: &[&LifeEntry]) -> usize {
    if files.is_empty() {
        return 0;
    }
    let next = Mutex::new(0usize);
    let done = Mutex::new(0usize);
    let threads = node.opts.uploads.clamp(1, files.len());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if node.stopping() {
                    return;
                }
                let i = {
                    let Ok(mut n) = next.lock() else { return };
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(e) = files.get(i) else { return };
                if upload_one(node, e) {
                    if let Ok(mut d) = done.lock() {
                        *d += 1;
                    }
                }
            });
        }
    });
    done.into_inner().unwrap_or(0)
}

/// Uploads one file version: data straight from the block, then its checksum, then
/// records it as durable if it did not change meanwhile.
fn upload_one(node: &Node, e: &LifeEntry) -> bool {
    let started = Instant::now();
    node.count(|s| s.uploading.push(e.path.clone()));
    let result = upload_version(node, e);
    node.count(|s| s.uploading.retain(|p| p != &e.path));
    match result {
        Ok(Some(digest)) => {
            node.forget_retry(e);
            if !node.store.mark_durable(e.ino, e.generation, e.mod_seq) {
                // Changed while uploading: the next pass uploads the new version.
                return false;
            }
            node.remember_digest(e, digest.blake3.clone());
            node.count(|s| {
                s.uploaded_files += 1;
                s.uploaded_bytes += digest.size;
            });
            node.log(|| {
                format!(
                    "uploaded {} ({} bytes) in {:.3} s",
                    e.path,
                    digest.size,
                    started.elapsed().as_secs_f64()
                )
            });
            true
        }
        Ok(None) => false,
        Err(err) => {
            let (attempts, delay) = node.schedule_retry(e);
            node.record_failure(format!(
                "upload of {} failed (attempt {attempts}): {err}; retrying in {:.1} s",
                e.path,
                delay.as_secs_f64()
            ));
            false
        }
    }
}

/// The data and checksum of file version `e`; None if it was removed or replaced since the
/// snapshot.
fn upload_version(node: &Node, e: &LifeEntry) -> Result<Option<FileDigest>> {
    let key = DurableKey::from_store_path(&e.path);
    let Some(file) = node.open_snapshot_file(e)? else {
        return Ok(None);
    };
    let reader =
        StoreFileReader::new(&node.store, &file).map_err(|err| Error::store(&e.path, err))?;
    let len = reader.len();
    // Announced before the data, so a staging server holding an older version of this name
    // never drains it over this one (docs/durable-layout.md).
    node.durable
        .put_version(&key, cascade_durable::now_unix_ns())
        .map_err(Error::Durable)?;
    let digest = match reader.memory_pieces() {
        Some(pieces) if len > 0 && len <= SINGLE_PUT_MAX => put_from_memory(node, &key, &pieces)?,
        _ => node
            .durable
            .put_file(&key, reader, len)
            .map_err(Error::Durable)?,
    };
    node.durable
        .put_checksum(&key, &digest)
        .map_err(Error::Durable)?;
    Ok(Some(digest))
}

/// Uploads a file that is wholly in memory chunks in one request whose body is the chunks
/// themselves (no copy, no multipart reassembly on the server), hashing it on a second
/// thread meanwhile. Streamed to S3, so that its first byte leaves at once.
fn put_from_memory(node: &Node, key: &str, pieces: &[(usize, usize)]) -> Result<FileDigest> {
    let region = node.store.data_region().addr as usize;
    let parts: Vec<Bytes> = pieces
        .iter()
        .map(|&(offset, len)| {
            Bytes::from_owner(ShmPiece {
                _store: node.store.clone(),
                addr: region + offset,
                len,
            })
        })
        .collect();
    let (put, blake3) = std::thread::scope(|scope| {
        let hashing = scope.spawn(|| {
            let mut hasher = blake3::Hasher::new();
            for p in &parts {
                hasher.update(p);
            }
            hasher.finalize().to_hex().to_string()
        });
        let put = node.durable.put_buffers_streamed(key, parts.clone());
        (put, hashing.join())
    });
    put.map_err(Error::Durable)?;
    let blake3 = blake3.map_err(|_| Error::io("hash", std::io::Error::other("hashing failed")))?;
    Ok(FileDigest {
        size: pieces.iter().map(|p| p.1 as u64).sum(),
        blake3,
    })
}

/// Writes the marker of `root` if every file below it is durable; true if it did.
fn complete_checkpoint(node: &Node, root: &LifeEntry) -> Result<bool> {
    let Some(tree) = node.fresh_tree(root)? else {
        return Ok(false);
    };
    let now_root = &tree[0];
    let files: Vec<&LifeEntry> = files_of(&tree).collect();
    if files
        .iter()
        .any(|f| !f.durable() || f.torn || reserved(&f.path))
    {
        return Ok(false);
    }
    let (single_file, entries) = node.marker_entries(now_root, &files)?;
    let ckpt = DurableKey::from_store_path(&now_root.path);
    node.durable
        .write_marker_of(&ckpt, single_file, entries)
        .map_err(Error::Durable)?;
    if !node
        .store
        .mark_complete(now_root.ino, now_root.generation, now_root.mod_seq)
    {
        // Changed after the check: the marker is stale, take it back.
        node.durable.delete_marker(&ckpt).map_err(Error::Durable)?;
        return Ok(false);
    }
    node.count(|s| s.markers += 1);
    node.log(|| {
        format!(
            "checkpoint {} complete ({} files)",
            now_root.path,
            files.len()
        )
    });
    Ok(true)
}

impl Level for PlainLayout {
    fn name(&self) -> String {
        "the durable store".to_string()
    }

    fn takes(&self) -> Option<Unit> {
        Some(Unit::Files)
    }

    fn holds(&self, e: &LifeEntry) -> bool {
        e.durable()
    }

    fn send_files<'t>(
        &self,
        node: &Node,
        files: Vec<&'t LifeEntry>,
    ) -> (usize, Vec<&'t LifeEntry>) {
        // A failed upload is retried by a later pass, after its delay: nothing is passed on.
        (upload_all(node, &files), Vec::new())
    }

    fn send_checkpoint(&self, node: &Node, c: &Checkpoint, _previous: Option<&Checkpoint>) -> Step {
        if !self.sends_checkpoints {
            return Step::Next;
        }
        match complete_checkpoint(node, c.root) {
            Ok(true) => Step::Complete,
            Ok(false) => Step::NotReady,
            Err(e) => {
                node.record_failure(format!(
                    "cannot write the completion marker of {}: {e}",
                    c.root.path
                ));
                Step::NotReady
            }
        }
    }

    fn find<'a>(&'a self, node: &'a Node, key: &'a DurableKey) -> Result<Option<Found<'a>>> {
        let durable = &node.durable;
        match durable.size(key) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(Error::Durable(e)),
        }
        if let Some(parts) = self.partial_parent(node, key)? {
            return Err(Error::IncompleteJob {
                store: durable.name().to_string(),
                checkpoint: key.rsplit_once('/').map_or("", |(dir, _)| dir).to_string(),
                parts,
            });
        }
        // Written before the data: a version without a stamp is older than any other.
        let stamp = durable
            .recorded_version(key)
            .map_err(Error::Durable)?
            .unwrap_or(0);
        Ok(Some(Found {
            stamp,
            fetch: Box::new(move |tmp| {
                let digest = write_fetched(&node.store, tmp, |out| {
                    durable.download_to(key, out).map_err(Error::Durable)
                })?;
                Ok(Some(digest.size))
            }),
        }))
    }

    fn is_dir(&self, node: &Node, key: &DurableKey) -> Result<bool> {
        let below = node
            .durable
            .list(&format!("{key}/"))
            .map_err(Error::Durable)?;
        Ok(!below.is_empty())
    }

    fn list(&self, node: &Node, key: &DurableKey) -> Result<Vec<Listed>> {
        let children = node.durable.list_children(key).map_err(Error::Durable)?;
        let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
        let dirs = children
            .dirs
            .into_iter()
            .filter(|name| !name.starts_with(".cascade"))
            .map(|name| Listed {
                name,
                dir: true,
                size: 0,
                modified_ns: 0,
            });
        let files = children
            .files
            .into_iter()
            .filter(|f| !reserved(&f.path))
            .map(|f| Listed {
                name: base(&f.path),
                dir: false,
                size: f.size,
                modified_ns: f.modified_ns,
            });
        Ok(dirs.chain(files).collect())
    }
}
