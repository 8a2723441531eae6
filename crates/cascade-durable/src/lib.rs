//! Cascade L2, the durable tier: a local directory (the stand-in for a parallel file system)
//! or an S3-compatible object store, reached through the `object_store` crate.
//!
//! The layout is plain (docs/durable-layout.md): every file at its relative path, its hex
//! BLAKE3 in `<path>.blake3` beside it, and per checkpoint a completion marker
//! `<checkpoint>/.cascade-complete` written last. [`AsyncDurableStore`] is the async API (for
//! callers with their own tokio runtime); [`DurableStore`] wraps it with a small runtime of
//! its own and a blocking API.

mod error;
mod spec;

use std::io::{Read, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig, WriteMultipart};
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
pub use spec::{S3Spec, Spec};

/// Name of the completion marker inside a checkpoint directory.
pub const MARKER_NAME: &str = ".cascade-complete";
/// Suffix of the checksum object beside each file.
pub const CHECKSUM_SUFFIX: &str = ".blake3";
/// Suffix of the hidden version object `<dir>/.<base>.cascade-version` beside each file.
pub const VERSION_SUFFIX: &str = ".cascade-version";
/// Largest object uploaded in one request (S3 allows 5 GiB).
pub const SINGLE_PUT_MAX: u64 = 4 << 30;
/// Format tag written in every marker.
pub const MARKER_FORMAT: &str = "cascade-complete/1";

/// Tuning of transfers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size of one multipart part and of the read buffer; files larger than this are uploaded
    /// in parts. S3 needs at least 5 MiB.
    pub part_size: usize,
    /// Parts in flight per upload; memory per upload is at most `part_size * (this + 1)`.
    pub max_concurrency: usize,
    /// Worker threads of the runtime that [`DurableStore`] owns.
    pub io_threads: usize,
    /// Retries of a failed request (with exponential backoff), and the time after which a
    /// request is no longer retried.
    pub max_retries: usize,
    pub retry_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            part_size: 8 << 20,
            max_concurrency: 4,
            io_threads: 1,
            max_retries: 5,
            retry_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Size and BLAKE3 of a file, as recorded in the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    /// Lowercase hex BLAKE3 of the whole file (64 characters).
    pub blake3: String,
}

/// One object in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the store root ("ckpt.0001/rank0.dat").
    pub path: String,
    pub size: u64,
}

/// One file of a checkpoint in its marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

/// The completion marker `<checkpoint>/.cascade-complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub format: String,
    /// The checkpoint directory relative to the store root.
    pub checkpoint: String,
    /// When the marker was written, nanoseconds since the Unix epoch.
    pub completed_unix_ns: u64,
    pub total_bytes: u64,
    pub files: Vec<MarkerFile>,
    /// A checkpoint that is one file: the file is the object `checkpoint` itself (its one
    /// entry's `path` is the base name) and the marker is `<checkpoint>.cascade-complete`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_file: bool,
}

impl Marker {
    /// Key of a file of this checkpoint, relative to the store root.
    pub fn object_key(&self, file: &MarkerFile) -> String {
        if self.single_file {
            self.checkpoint.clone()
        } else {
            join(&self.checkpoint, &file.path)
        }
    }
}

/// Key of the completion marker of `checkpoint` (normalized): `<ckpt>/.cascade-complete` for a
/// directory, `<ckpt>.cascade-complete` beside a single-file checkpoint.
pub fn marker_key(checkpoint: &str, single_file: bool) -> String {
    if single_file {
        format!("{checkpoint}{MARKER_NAME}")
    } else {
        join(checkpoint, MARKER_NAME)
    }
}

/// A file to upload: its path relative to the checkpoint, its length and a reader for it.
pub struct UploadItem<'a> {
    pub rel: String,
    pub len: u64,
    pub reader: Box<dyn Read + Send + 'a>,
}

impl<'a> UploadItem<'a> {
    /// A file from memory.
    pub fn from_bytes(rel: impl Into<String>, data: &'a [u8]) -> UploadItem<'a> {
        UploadItem {
            rel: rel.into(),
            len: data.len() as u64,
            reader: Box::new(data),
        }
    }

    /// A local file.
    pub fn from_path(rel: impl Into<String>, path: &std::path::Path) -> Result<UploadItem<'a>> {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        Ok(UploadItem {
            rel: rel.into(),
            len,
            reader: Box::new(file),
        })
    }
}

/// Checks a relative path and normalises it to `a/b/c` (a leading '/' is dropped).
pub fn normalize_rel(path: &str) -> Result<String> {
    let bad = |reason: &str| Error::InvalidPath {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = path.trim_start_matches('/');
    let mut parts = Vec::new();
    for part in trimmed.split('/') {
        match part {
            "" => return Err(bad("empty path component")),
            "." | ".." => return Err(bad("'.' and '..' are not allowed")),
            p if p.chars().any(|c| c.is_control()) => {
                return Err(bad("control characters are not allowed"))
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// Wall-clock time in ns since the Unix epoch: marker times and version stamps.
pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// True for a base name the durable layout reserves inside a checkpoint: the marker, checksum
/// objects, single-file markers and version objects.
pub fn is_reserved_name(base: &str) -> bool {
    base == MARKER_NAME
        || base.ends_with(CHECKSUM_SUFFIX)
        || base.ends_with(MARKER_NAME)
        || (base.starts_with('.') && base.ends_with(VERSION_SUFFIX))
}

/// The version object of `rel` (already normalized): `<dir>/.<base>.cascade-version`.
fn version_key(rel: &str) -> String {
    match rel.rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/.{base}{VERSION_SUFFIX}"),
        None => format!(".{rel}{VERSION_SUFFIX}"),
    }
}

/// Parses the contents of a `.blake3` object: 64 hex digits, optionally followed by
/// whitespace and a file name (the `b3sum` format).
pub fn parse_checksum(text: &str) -> Option<String> {
    let hex = text.split_whitespace().next()?;
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| hex.to_lowercase())
}

/// The durable tier, async API. Cheap to clone.
#[derive(Clone)]
pub struct AsyncDurableStore {
    store: Arc<dyn ObjectStore>,
    spec: Spec,
    name: String,
    opts: Options,
    trace: Arc<Trace>,
}

/// The requests a store made while tracing was on: tests measure with it what an operation
/// reads and writes (garbage collection must not read every pack).
#[derive(Default)]
struct Trace {
    on: AtomicBool,
    requests: Mutex<Vec<(&'static str, String)>>,
}

impl Trace {
    fn note(&self, op: &'static str, path: &str) {
        if self.on.load(Ordering::Relaxed) {
            if let Ok(mut r) = self.requests.lock() {
                r.push((op, path.to_string()));
            }
        }
    }
}

impl std::fmt::Debug for AsyncDurableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDurableStore")
            .field("store", &self.name)
            .finish_non_exhaustive()
    }
}

impl AsyncDurableStore {
    /// Opens a store from a spec string (see [`Spec::parse`]) and checks that it works: a
    /// directory is created if missing and must be writable; an S3 bucket must exist and
    /// accept the credentials.
    pub async fn open(spec: &str) -> Result<Self> {
        Self::open_with(Spec::parse(spec)?, Options::default()).await
    }

    /// Opens a parsed spec with explicit options.
    pub async fn open_with(spec: Spec, opts: Options) -> Result<Self> {
        let name = spec.describe();
        if opts.part_size < (5 << 20) || opts.max_concurrency == 0 {
            return Err(Error::Config {
                spec: name,
                reason: "part_size must be at least 5 MiB and max_concurrency at least 1"
                    .to_string(),
            });
        }
        let store: Arc<dyn ObjectStore> = match &spec {
            Spec::Dir(dir) => {
                let not_writable = |e: std::io::Error| Error::NotWritable {
                    store: name.clone(),
                    detail: e.to_string(),
                };
                std::fs::create_dir_all(dir).map_err(not_writable)?;
                // Probe writability with a real file: permission bits say nothing for root,
                // a read-only mount says nothing in the bits at all.
                let probe = dir.join(format!(".cascade-probe-{}", std::process::id()));
                std::fs::write(&probe, b"probe").map_err(not_writable)?;
                let _ = std::fs::remove_file(&probe);
                let local =
                    LocalFileSystem::new_with_prefix(dir).map_err(|e| Error::NotWritable {
                        store: name.clone(),
                        detail: error::one_line(&error::chain_text(&e)),
                    })?;
                Arc::new(local)
            }
            Spec::S3(s3) => {
                let mut builder = AmazonS3Builder::new()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    .with_retry(RetryConfig {
                        max_retries: opts.max_retries,
                        retry_timeout: opts.retry_timeout,
                        ..RetryConfig::default()
                    })
                    .with_client_options(
                        ClientOptions::new().with_connect_timeout(opts.connect_timeout),
                    );
                if let Some(ep) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(ep)
                        .with_allow_http(ep.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                if let Some(k) = &s3.access_key_id {
                    builder = builder.with_access_key_id(k);
                }
                if let Some(k) = &s3.secret_access_key {
                    builder = builder.with_secret_access_key(k);
                }
                if let Some(t) = &s3.session_token {
                    builder = builder.with_token(t);
                }
                let s3store = builder.build().map_err(|e| Error::Config {
                    spec: name.clone(),
                    reason: error::one_line(&error::chain_text(&e)),
                })?;
                if s3.prefix.is_empty() {
                    Arc::new(s3store)
                } else {
                    Arc::new(PrefixStore::new(s3store, s3.prefix.as_str()))
                }
            }
        };
        let this = AsyncDurableStore {
            store,
            spec,
            name,
            opts,
            trace: Arc::default(),
        };
        // One request that needs the bucket and valid credentials.
        if let Spec::S3(_) = this.spec {
            let mut listing = this.store.list(None);
            if let Some(Err(e)) = listing.next().await {
                return Err(this.classify("list", "", e));
            }
        }
        Ok(this)
    }

    /// `file:///dir` or `s3://bucket/prefix`, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts recording every request (operation and path: `get`, `get_range`, `head`,
    /// `put`, `delete`, `list` of a prefix), for tests that measure what an operation costs.
    pub fn start_trace(&self) {
        if let Ok(mut r) = self.trace.requests.lock() {
            r.clear();
        }
        self.trace.on.store(true, Ordering::Relaxed);
    }

    /// Stops recording; the requests made since [`Self::start_trace`], in order.
    pub fn take_trace(&self) -> Vec<(&'static str, String)> {
        self.trace.on.store(false, Ordering::Relaxed);
        self.trace
            .requests
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    fn classify(&self, op: &'static str, path: &str, e: object_store::Error) -> Error {
        let text = error::chain_text(&e);
        let store = self.name.clone();
        let detail = error::one_line(&error::short_detail(&text));
        if text.contains("NoSuchBucket") {
            let bucket = match &self.spec {
                Spec::S3(s) => s.bucket.clone(),
                Spec::Dir(_) => String::new(),
            };
            return Error::NoBucket { store, bucket };
        }
        let auth_codes = [
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "XAdminUserNotFound",
            "403 Forbidden",
            "401 Unauthorized",
        ];
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                store,
                path: path.to_string(),
            },
            // A directory store asked for "a/b" where "a" is a file: there is no such object.
            _ if matches!(self.spec, Spec::Dir(_)) && text.contains("Not a directory") => {
                Error::NotFound {
                    store,
                    path: path.to_string(),
                }
            }
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. }
                if matches!(self.spec, Spec::S3(_)) =>
            {
                Error::Auth { store, detail }
            }
            _ if matches!(self.spec, Spec::S3(_))
                && auth_codes.iter().any(|c| text.contains(c)) =>
            {
                Error::Auth { store, detail }
            }
            _ if matches!(self.spec, Spec::Dir(_))
                && (text.contains("Permission denied")
                    || text.contains("Read-only file system")
                    || text.contains("No space left")) =>
            {
                Error::NotWritable { store, detail }
            }
            _ if text.contains("error sending request")
                || text.contains("Connection refused")
                || text.contains("connection refused")
                || text.contains("dns error") =>
            {
                Error::Unreachable { store, detail }
            }
            _ => Error::Store {
                store,
                op,
                path: path.to_string(),
                detail,
            },
        }
    }

    /// [`Self::location`], recording the request `op` while tracing is on.
    fn traced(&self, op: &'static str, rel: &str) -> Result<(String, StorePath)> {
        let (rel, loc) = self.location(rel)?;
        self.trace.note(op, &rel);
        Ok((rel, loc))
    }

    fn location(&self, rel: &str) -> Result<(String, StorePath)> {
        let rel = normalize_rel(rel)?;
        let loc = StorePath::parse(&rel).map_err(|e| Error::InvalidPath {
            path: rel.clone(),
            reason: error::one_line(&e.to_string()),
        })?;
        Ok((rel, loc))
    }

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
            out.push(ObjectInfo {
                path: meta.location.to_string(),
                size: meta.size,
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
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

/// The durable tier with a blocking API; owns a small tokio runtime
/// (`Options::io_threads` workers). Do not call it from inside another tokio runtime: use
/// [`AsyncDurableStore`] there.
pub struct DurableStore {
    rt: tokio::runtime::Runtime,
    inner: AsyncDurableStore,
}

impl std::fmt::Debug for DurableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl DurableStore {
    /// Opens and checks a store; see [`AsyncDurableStore::open`].
    pub fn open(spec: &str) -> Result<Self> {
        Self::open_with(Spec::parse(spec)?, Options::default())
    }

    pub fn open_with(spec: Spec, opts: Options) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.io_threads.max(1))
            .thread_name("cascade-durable")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the durable-store runtime", e))?;
        let inner = rt.block_on(AsyncDurableStore::open_with(spec, opts))?;
        Ok(DurableStore { rt, inner })
    }

    /// The async API over the same store.
    pub fn async_store(&self) -> &AsyncDurableStore {
        &self.inner
    }

    /// See [`AsyncDurableStore::start_trace`].
    pub fn start_trace(&self) {
        self.inner.start_trace()
    }

    /// See [`AsyncDurableStore::take_trace`].
    pub fn take_trace(&self) -> Vec<(&'static str, String)> {
        self.inner.take_trace()
    }

    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`AsyncDurableStore::put_reader`].
    pub fn put_file(
        &self,
        rel: &str,
        mut reader: impl Read + Send,
        len: u64,
    ) -> Result<FileDigest> {
        self.rt
            .block_on(self.inner.put_reader(rel, &mut reader, len))
    }

    /// Uploads a file from memory (data only).
    pub fn put_bytes(&self, rel: &str, data: &[u8]) -> Result<FileDigest> {
        self.put_file(rel, data, data.len() as u64)
    }

    pub fn put_buffers(&self, rel: &str, parts: Vec<Bytes>) -> Result<()> {
        self.rt.block_on(self.inner.put_buffers(rel, parts))
    }

    pub fn put_checksum(&self, rel: &str, digest: &FileDigest) -> Result<()> {
        self.rt.block_on(self.inner.put_checksum(rel, digest))
    }

    pub fn put_version(&self, rel: &str, stamp: u64) -> Result<()> {
        self.rt.block_on(self.inner.put_version(rel, stamp))
    }

    pub fn recorded_version(&self, rel: &str) -> Result<Option<u64>> {
        self.rt.block_on(self.inner.recorded_version(rel))
    }

    pub fn get_bytes(&self, rel: &str) -> Result<Bytes> {
        self.rt.block_on(self.inner.get_bytes(rel))
    }

    pub fn get_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        self.rt.block_on(self.inner.get_range(rel, range))
    }

    pub fn size(&self, rel: &str) -> Result<u64> {
        self.rt.block_on(self.inner.size(rel))
    }

    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.rt.block_on(self.inner.list(prefix))
    }

    pub fn delete(&self, rel: &str) -> Result<()> {
        self.rt.block_on(self.inner.delete(rel))
    }

    pub fn recorded_checksum(&self, rel: &str) -> Result<String> {
        self.rt.block_on(self.inner.recorded_checksum(rel))
    }

    pub fn verify_file(&self, rel: &str) -> Result<FileDigest> {
        self.rt.block_on(self.inner.verify_file(rel))
    }

    pub fn download_to(&self, rel: &str, mut out: impl Write + Send) -> Result<FileDigest> {
        self.rt.block_on(self.inner.download_to(rel, &mut out))
    }

    pub fn download_file(&self, rel: &str, dest: &std::path::Path) -> Result<FileDigest> {
        self.rt.block_on(self.inner.download_file(rel, dest))
    }

    pub fn read_marker(&self, checkpoint: &str) -> Result<Option<Marker>> {
        self.rt.block_on(self.inner.read_marker(checkpoint))
    }

    pub fn is_complete(&self, checkpoint: &str) -> Result<bool> {
        self.rt.block_on(self.inner.is_complete(checkpoint))
    }

    pub fn upload_checkpoint_data(
        &self,
        checkpoint: &str,
        files: Vec<UploadItem<'_>>,
    ) -> Result<Vec<MarkerFile>> {
        self.rt
            .block_on(self.inner.upload_checkpoint_data(checkpoint, files))
    }

    pub fn write_checksums(&self, checkpoint: &str, entries: &[MarkerFile]) -> Result<()> {
        self.rt
            .block_on(self.inner.write_checksums(checkpoint, entries))
    }

    pub fn write_marker(&self, checkpoint: &str, entries: Vec<MarkerFile>) -> Result<Marker> {
        self.rt
            .block_on(self.inner.write_marker(checkpoint, entries))
    }

    pub fn write_marker_of(
        &self,
        checkpoint: &str,
        single_file: bool,
        entries: Vec<MarkerFile>,
    ) -> Result<Marker> {
        self.rt
            .block_on(self.inner.write_marker_of(checkpoint, single_file, entries))
    }

    pub fn delete_marker(&self, checkpoint: &str) -> Result<()> {
        self.rt.block_on(self.inner.delete_marker(checkpoint))
    }

    pub fn upload_checkpoint(
        &self,
        checkpoint: &str,
        files: Vec<UploadItem<'_>>,
    ) -> Result<Marker> {
        self.rt
            .block_on(self.inner.upload_checkpoint(checkpoint, files))
    }

    pub fn verify_checkpoint(&self, checkpoint: &str) -> Result<Marker> {
        self.rt.block_on(self.inner.verify_checkpoint(checkpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_paths() {
        assert_eq!(normalize_rel("/a/b").unwrap(), "a/b");
        assert_eq!(normalize_rel("a").unwrap(), "a");
        assert!(normalize_rel("a//b").is_err());
        assert!(normalize_rel("a/../b").is_err());
        assert!(normalize_rel("").is_err());
    }

    #[test]
    fn parses_checksums() {
        let h = "ab".repeat(32);
        assert_eq!(parse_checksum(&format!("{h}  x.dat\n")), Some(h.clone()));
        assert_eq!(parse_checksum(&h.to_uppercase()), Some(h));
        assert_eq!(parse_checksum("abc"), None);
        assert_eq!(parse_checksum(""), None);
    }
}
