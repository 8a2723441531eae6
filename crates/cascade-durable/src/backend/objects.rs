//! Object-level requests: uploads (whole, in parts, from buffers), checksum and version
//! objects, reads, listings and deletes.

use std::io::Read;
use std::ops::Range;

use bytes::Bytes;
use futures::StreamExt;
use object_store::{PutPayload, WriteMultipart};

use super::AsyncDurableStore;
use crate::layout::version_key;
use crate::{
    normalize_rel, parse_checksum, Children, Error, FileDigest, ObjectInfo, Result,
    CHECKSUM_SUFFIX, SINGLE_PUT_MAX,
};

impl AsyncDurableStore {
    /// Uploads `len` bytes from `reader` to `rel` (data only, no checksum object) and returns
    /// their size and BLAKE3. Files up to `part_size` go in one request, larger ones as a
    /// multipart upload with at most `max_concurrency` parts in flight. The object appears
    /// whole or not at all (S3 multipart completion; rename on a directory).
    pub async fn put_reader(
        &self,
        rel: &str,
        reader: &mut (dyn Read + Send),
        len: u64,
    ) -> Result<FileDigest> {
        let (rel, loc) = self.traced("put", rel)?;
        let part = self.opts.part_size;
        let mut hasher = blake3::Hasher::new();
        let read_part = |reader: &mut (dyn Read + Send),
                         want: usize,
                         hasher: &mut blake3::Hasher|
         -> Result<Vec<u8>> {
            let mut buf = vec![0u8; want];
            let mut got = 0;
            while got < want {
                match reader.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io(format!("read source of {rel}"), e)),
                }
            }
            buf.truncate(got);
            hasher.update(&buf);
            Ok(buf)
        };
        let short = |got: u64| Error::ShortSource {
            store: self.name.clone(),
            path: rel.clone(),
            got,
            expected: len,
        };
        if len <= part as u64 {
            let buf = read_part(reader, len as usize, &mut hasher)?;
            if (buf.len() as u64) < len {
                return Err(short(buf.len() as u64));
            }
            self.store
                .put(&loc, PutPayload::from(buf))
                .await
                .map_err(|e| self.classify("put", &rel, e))?;
        } else {
            let upload = self
                .store
                .put_multipart(&loc)
                .await
                .map_err(|e| self.classify("put", &rel, e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, part);
            let mut done = 0u64;
            let result: Result<()> = async {
                while done < len {
                    writer
                        .wait_for_capacity(self.opts.max_concurrency)
                        .await
                        .map_err(|e| self.classify("put", &rel, e))?;
                    let want = (len - done).min(part as u64) as usize;
                    let buf = read_part(reader, want, &mut hasher)?;
                    done += buf.len() as u64;
                    if buf.len() < want {
                        return Err(short(done));
                    }
                    writer.put(Bytes::from(buf));
                }
                Ok(())
            }
            .await;
            match result {
                Ok(()) => {
                    writer
                        .finish()
                        .await
                        .map_err(|e| self.classify("put", &rel, e))?;
                }
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            }
        }
        Ok(FileDigest {
            size: len,
            blake3: hasher.finalize().to_hex().to_string(),
        })
    }

    /// Writes a small object in one request.
    pub async fn put_bytes(&self, rel: &str, data: Vec<u8>) -> Result<()> {
        let (rel, loc) = self.traced("put", rel)?;
        self.store
            .put(&loc, PutPayload::from(data))
            .await
            .map_err(|e| self.classify("put", &rel, e))?;
        Ok(())
    }

    /// Uploads an object given as buffers in order, in one request (no multipart: the server
    /// need not reassemble parts). The buffers are sent as they are, never copied, so they
    /// may reference memory owned elsewhere (`Bytes::from_owner`). At most
    /// [`SINGLE_PUT_MAX`] bytes.
    pub async fn put_buffers(&self, rel: &str, parts: Vec<Bytes>) -> Result<()> {
        let (rel, loc) = self.traced("put", rel)?;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total > SINGLE_PUT_MAX {
            return Err(Error::InvalidPath {
                path: rel,
                reason: format!("{total} bytes is more than one request may carry"),
            });
        }
        self.store
            .put(&loc, parts.into_iter().collect::<PutPayload>())
            .await
            .map_err(|e| self.classify("put", &rel, e))?;
        Ok(())
    }

    /// Writes `<rel>.blake3` in the `b3sum` format (`<hex>  <file name>\n`).
    pub async fn put_checksum(&self, rel: &str, digest: &FileDigest) -> Result<()> {
        let rel = normalize_rel(rel)?;
        let base = rel.rsplit('/').next().unwrap_or(&rel);
        let text = format!("{}  {}\n", digest.blake3, base);
        self.put_bytes(&format!("{rel}{CHECKSUM_SUFFIX}"), text.into_bytes())
            .await
    }

    /// Records that the version of `rel` stamped `stamp` (the writer's clock in ns when the
    /// version was taken) is being written. Written before the data, so that a writer holding
    /// an older version (a staging server restarted late) sees it and does not overwrite.
    pub async fn put_version(&self, rel: &str, stamp: u64) -> Result<()> {
        let rel = normalize_rel(rel)?;
        self.put_bytes(&version_key(&rel), format!("{stamp}\n").into_bytes())
            .await
    }

    /// The stamp last recorded by [`Self::put_version`] for `rel`; None if there is none or
    /// it is unreadable (a version object is advisory: it only ever stops older writes).
    pub async fn recorded_version(&self, rel: &str) -> Result<Option<u64>> {
        let rel = normalize_rel(rel)?;
        match self.get_bytes(&version_key(&rel)).await {
            Ok(text) => Ok(String::from_utf8_lossy(&text).trim().parse().ok()),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a whole (small) object.
    pub async fn get_bytes(&self, rel: &str) -> Result<Bytes> {
        let (rel, loc) = self.traced("get", rel)?;
        let got = self
            .store
            .get(&loc)
            .await
            .map_err(|e| self.classify("get", &rel, e))?;
        got.bytes().await.map_err(|e| self.classify("get", &rel, e))
    }

    /// Reads `range` of an object.
    pub async fn get_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        let (rel, loc) = self.traced("get_range", rel)?;
        if range.start >= range.end {
            return Ok(Bytes::new());
        }
        self.store
            .get_range(&loc, range)
            .await
            .map_err(|e| self.classify("get", &rel, e))
    }

    /// Size of an object.
    pub async fn size(&self, rel: &str) -> Result<u64> {
        let (rel, loc) = self.traced("head", rel)?;
        let meta = self
            .store
            .head(&loc)
            .await
            .map_err(|e| self.classify("head", &rel, e))?;
        Ok(meta.size)
    }

    /// All objects under `prefix` (whole path components; "" for everything), sorted by path.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let prefix = prefix.trim_matches('/');
        let loc = if prefix.is_empty() {
            self.trace.note("list", "");
            None
        } else {
            Some(self.traced("list", prefix)?.1)
        };
        let mut stream = self.store.list(loc.as_ref());
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(|e| self.classify("list", prefix, e))?;
            out.push(object_info(&meta));
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The objects directly in directory `dir` (not below its subdirectories), sorted: one
    /// listing of one level, however much lies deeper.
    pub async fn list_dir(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        let dir = dir.trim_matches('/');
        let (dir, loc) = self.traced("list", dir)?;
        let listed = self
            .store
            .list_with_delimiter(Some(&loc))
            .await
            .map_err(|e| self.classify("list", &dir, e))?;
        let mut out: Vec<ObjectInfo> = listed.objects.iter().map(object_info).collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The objects directly in directory `dir` ("" for the root) and its subdirectories: a
    /// directory listing for read-through, without reading anything below.
    pub async fn list_children(&self, dir: &str) -> Result<Children> {
        let dir = dir.trim_matches('/');
        let loc = if dir.is_empty() {
            self.trace.note("list", "");
            None
        } else {
            Some(self.traced("list", dir)?.1)
        };
        let listed = self
            .store
            .list_with_delimiter(loc.as_ref())
            .await
            .map_err(|e| self.classify("list", dir, e))?;
        let mut files: Vec<ObjectInfo> = listed.objects.iter().map(object_info).collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut dirs: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        dirs.sort();
        Ok(Children { files, dirs })
    }

    /// Deletes an object; a missing one is not an error.
    pub async fn delete(&self, rel: &str) -> Result<()> {
        let (rel, loc) = self.traced("delete", rel)?;
        match self.store.delete(&loc).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => match self.classify("delete", &rel, e) {
                // E.g. `a/b` where `a` is a file in a directory store (ENOTDIR): absent too.
                e if e.is_not_found() => Ok(()),
                e => Err(e),
            },
        }
    }

    /// The recorded BLAKE3 of `rel`, from `<rel>.blake3`.
    pub async fn recorded_checksum(&self, rel: &str) -> Result<String> {
        let rel = normalize_rel(rel)?;
        let sum_path = format!("{rel}{CHECKSUM_SUFFIX}");
        let bad = |reason: String| Error::BadChecksum {
            store: self.name.clone(),
            path: rel.clone(),
            reason,
        };
        let text = match self.get_bytes(&sum_path).await {
            Ok(t) => t,
            Err(e) if e.is_not_found() => {
                return Err(bad(format!("no checksum object {sum_path}")));
            }
            Err(e) => return Err(e),
        };
        let text = String::from_utf8_lossy(&text);
        parse_checksum(&text).ok_or_else(|| bad(format!("malformed checksum object {sum_path}")))
    }
}

fn object_info(meta: &object_store::ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        path: meta.location.to_string(),
        size: meta.size,
        modified_ns: meta.last_modified.timestamp_nanos_opt().unwrap_or(0),
    }
}
