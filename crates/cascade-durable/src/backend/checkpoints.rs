//! Whole files and checkpoints: verified downloads, completion markers, and the three
//! steps of an upload (data, checksums, marker last).

use std::io::Write;

use futures::StreamExt;

use super::{AsyncDurableStore, UploadItem};
use crate::layout::join;
use crate::{
    is_reserved_name, marker_key, normalize_rel, now_unix_ns, Error, FileDigest, Marker,
    MarkerFile, Result, MARKER_FORMAT, MARKER_NAME,
};

impl AsyncDurableStore {
    /// Streams `rel` into `out` and checks it against `<rel>.blake3`; on a mismatch returns
    /// [`Error::Corrupt`] (EIO) and the caller must discard what was written.
    pub async fn download_to(&self, rel: &str, out: &mut (dyn Write + Send)) -> Result<FileDigest> {
        let expected = self.recorded_checksum(rel).await?;
        let (rel, loc) = self.traced("get", rel)?;
        let got = self
            .store
            .get(&loc)
            .await
            .map_err(|e| self.classify("get", &rel, e))?;
        let mut stream = got.into_stream();
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.classify("get", &rel, e))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            out.write_all(&chunk)
                .map_err(|e| Error::io(format!("write download of {rel}"), e))?;
        }
        let actual = hasher.finalize().to_hex().to_string();
        if actual != expected {
            return Err(Error::Corrupt {
                store: self.name.clone(),
                path: rel,
                expected,
                actual,
            });
        }
        Ok(FileDigest {
            size,
            blake3: actual,
        })
    }

    /// Recomputes the BLAKE3 of `rel` and compares it with `<rel>.blake3`.
    pub async fn verify_file(&self, rel: &str) -> Result<FileDigest> {
        self.download_to(rel, &mut std::io::sink()).await
    }

    /// Downloads `rel` to the local file `dest`, verified: the data goes to a temporary file
    /// beside `dest`, which is renamed into place only when the checksum matches.
    pub async fn download_file(&self, rel: &str, dest: &std::path::Path) -> Result<FileDigest> {
        let tmp = {
            let mut name = dest.as_os_str().to_owned();
            name.push(format!(".cascade-part-{}", std::process::id()));
            std::path::PathBuf::from(name)
        };
        let mut file = std::fs::File::create(&tmp)
            .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
        let result = async {
            let digest = self.download_to(rel, &mut file).await?;
            file.sync_all()
                .map_err(|e| Error::io(format!("sync {}", tmp.display()), e))?;
            std::fs::rename(&tmp, dest)
                .map_err(|e| Error::io(format!("rename to {}", dest.display()), e))?;
            Ok(digest)
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// The marker of `checkpoint` (a directory's, else a single file's), or None if the
    /// checkpoint is not complete.
    pub async fn read_marker(&self, checkpoint: &str) -> Result<Option<Marker>> {
        let ckpt = normalize_rel(checkpoint)?;
        let mut found = None;
        for single_file in [false, true] {
            let path = marker_key(&ckpt, single_file);
            match self.get_bytes(&path).await {
                Ok(b) => {
                    found = Some((path, b));
                    break;
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let Some((path, bytes)) = found else {
            return Ok(None);
        };
        let marker: Marker = serde_json::from_slice(&bytes).map_err(|e| Error::BadChecksum {
            store: self.name.clone(),
            path: path.clone(),
            reason: format!("unreadable completion marker: {e}"),
        })?;
        if marker.format != MARKER_FORMAT {
            return Err(Error::BadChecksum {
                store: self.name.clone(),
                path,
                reason: format!("unknown marker format {:?}", marker.format),
            });
        }
        Ok(Some(marker))
    }

    /// True once the checkpoint's completion marker exists (it is written last).
    pub async fn is_complete(&self, checkpoint: &str) -> Result<bool> {
        Ok(self.read_marker(checkpoint).await?.is_some())
    }

    /// Uploads the data of a checkpoint's files (step 1 of [`Self::upload_checkpoint`]),
    /// first removing any old marker so that a re-upload is never seen as complete early.
    pub async fn upload_checkpoint_data(
        &self,
        checkpoint: &str,
        files: Vec<UploadItem<'_>>,
    ) -> Result<Vec<MarkerFile>> {
        let ckpt = normalize_rel(checkpoint)?;
        self.delete_marker(&ckpt).await?;
        let mut entries = Vec::with_capacity(files.len());
        for mut item in files {
            let rel = normalize_rel(&item.rel)?;
            if is_reserved_name(rel.rsplit('/').next().unwrap_or(&rel)) {
                return Err(Error::InvalidPath {
                    path: rel,
                    reason: "name reserved by the durable layout".to_string(),
                });
            }
            let key = join(&ckpt, &rel);
            self.put_version(&key, now_unix_ns()).await?;
            let digest = self
                .put_reader(&key, item.reader.as_mut(), item.len)
                .await?;
            entries.push(MarkerFile {
                path: rel,
                size: digest.size,
                blake3: digest.blake3,
            });
        }
        Ok(entries)
    }

    /// Writes the checksum objects of uploaded files (step 2).
    pub async fn write_checksums(&self, checkpoint: &str, entries: &[MarkerFile]) -> Result<()> {
        let ckpt = normalize_rel(checkpoint)?;
        for e in entries {
            let digest = FileDigest {
                size: e.size,
                blake3: e.blake3.clone(),
            };
            self.put_checksum(&join(&ckpt, &e.path), &digest).await?;
        }
        Ok(())
    }

    /// Deletes the marker of `checkpoint` (either kind): the first step of replacing it.
    pub async fn delete_marker(&self, checkpoint: &str) -> Result<()> {
        let ckpt = normalize_rel(checkpoint)?;
        self.delete(&marker_key(&ckpt, false)).await?;
        self.delete(&marker_key(&ckpt, true)).await
    }

    /// Writes the completion marker of a directory checkpoint (step 3, last).
    pub async fn write_marker(&self, checkpoint: &str, entries: Vec<MarkerFile>) -> Result<Marker> {
        self.write_marker_of(checkpoint, false, entries).await
    }

    /// Writes the completion marker of a directory or (`single_file`) one-file checkpoint.
    pub async fn write_marker_of(
        &self,
        checkpoint: &str,
        single_file: bool,
        entries: Vec<MarkerFile>,
    ) -> Result<Marker> {
        let ckpt = normalize_rel(checkpoint)?;
        let marker = Marker {
            format: MARKER_FORMAT.to_string(),
            checkpoint: ckpt.clone(),
            completed_unix_ns: now_unix_ns(),
            total_bytes: entries.iter().map(|e| e.size).sum(),
            files: entries,
            single_file,
            nodes: Vec::new(),
        };
        let mut json = serde_json::to_vec_pretty(&marker).map_err(|e| Error::Store {
            store: self.name.clone(),
            op: "encode marker",
            path: ckpt.clone(),
            detail: e.to_string(),
        })?;
        json.push(b'\n');
        self.put_bytes(&marker_key(&ckpt, single_file), json)
            .await?;
        Ok(marker)
    }

    /// Uploads a checkpoint: all data, then all checksums, then the marker.
    pub async fn upload_checkpoint(
        &self,
        checkpoint: &str,
        files: Vec<UploadItem<'_>>,
    ) -> Result<Marker> {
        let entries = self.upload_checkpoint_data(checkpoint, files).await?;
        self.write_checksums(checkpoint, &entries).await?;
        self.write_marker(checkpoint, entries).await
    }

    /// Verifies every file listed in a checkpoint's marker against the marker and against its
    /// checksum object.
    pub async fn verify_checkpoint(&self, checkpoint: &str) -> Result<Marker> {
        let ckpt = normalize_rel(checkpoint)?;
        let Some(marker) = self.read_marker(&ckpt).await? else {
            return Err(Error::NotFound {
                store: self.name.clone(),
                path: join(&ckpt, MARKER_NAME),
            });
        };
        for f in &marker.files {
            let path = marker.object_key(f);
            let digest = self.verify_file(&path).await?;
            if digest.blake3 != f.blake3 || digest.size != f.size {
                return Err(Error::Corrupt {
                    store: self.name.clone(),
                    path,
                    expected: f.blake3.clone(),
                    actual: digest.blake3,
                });
            }
        }
        Ok(marker)
    }
}
