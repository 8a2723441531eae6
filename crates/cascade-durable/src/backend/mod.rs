//! The async backend: [`AsyncDurableStore`] over `object_store` (a local directory or an S3
//! bucket), its transfer [`Options`], how store errors are classified, and request tracing.

mod checkpoints;
mod objects;
mod parts;
mod signed_puts;
mod stream;
mod synced;

pub use parts::{JobProgress, PartsIn};
pub use stream::StreamingPut;

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::error;
use crate::{normalize_rel, Error, Result, Spec};

/// Tuning of transfers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size of one multipart part and of the read buffer; files larger than this are uploaded
    /// in parts. S3 needs at least 5 MiB.
    pub part_size: usize,
    /// Parts in flight per upload; memory per upload is at most `part_size * (this + 1)`.
    pub max_concurrency: usize,
    /// Worker threads of the runtime that [`crate::DurableStore`] owns.
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

/// Longest object key S3 takes, in bytes.
pub const S3_MAX_KEY: usize = 1024;

/// The durable tier, async API. Cheap to clone.
#[derive(Clone)]
pub struct AsyncDurableStore {
    store: Arc<dyn ObjectStore>,
    spec: Spec,
    name: String,
    opts: Options,
    trace: Arc<Trace>,
    /// The S3 client (for streaming uploads, signed with its credentials); None for a
    /// directory.
    s3: Option<stream::S3Client>,
    /// The HTTP client of streaming uploads, made on first use.
    http: Arc<OnceLock<reqwest::Client>>,
    /// Set once a streaming upload of [`Self::put_buffers_streamed`] failed: it sends single
    /// PUTs from then on, so a server that refuses streams late does not get every file twice.
    stream_failed: Arc<AtomicBool>,
}

/// The requests a store made while tracing was on: tests measure with it what an operation
/// reads and writes (garbage collection must not read every pack).
#[derive(Debug, Default)]
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
        let trace: Arc<Trace> = Arc::default();
        let mut s3_client = None;
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
                // Every write fsynced before it returns (docs/durable-layout.md,
                // "Durability").
                Arc::new(synced::SyncedDir::new(local, Arc::clone(&trace)))
            }
            Spec::S3(s3) => {
                // Without static credentials the client asks a provider (web identity, the
                // container's endpoint, instance metadata), configured by AWS_* variables.
                let base = match &s3.credentials {
                    crate::Credentials::Provider(_) => {
                        let mut b = AmazonS3Builder::from_env();
                        if let Ok(ep) = std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
                            b = b.with_config(AmazonS3ConfigKey::MetadataEndpoint, ep);
                        }
                        b
                    }
                    _ => AmazonS3Builder::new(),
                };
                let mut builder = base
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    .with_unsigned_payload(!s3.sign_payload)
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
                    builder = builder.with_secret_access_key(k.expose());
                }
                if let Some(t) = &s3.session_token {
                    builder = builder.with_token(t.expose());
                }
                let build = |builder: AmazonS3Builder| {
                    builder.build().map_err(|e| Error::Config {
                        spec: name.clone(),
                        reason: error::one_line(&error::chain_text(&e)),
                    })
                };
                let client = Arc::new(build(builder.clone())?);
                s3_client = Some(Arc::clone(&client));
                // Single PUTs signed whatever `sign_payload` says (signed_puts.rs).
                let s3store: Arc<dyn ObjectStore> = if s3.sign_payload {
                    client
                } else {
                    Arc::new(signed_puts::SignedSinglePuts {
                        signed: build(builder.with_unsigned_payload(false))?,
                        unsigned: client,
                    })
                };
                if s3.prefix.is_empty() {
                    s3store
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
            trace,
            s3: s3_client,
            http: Arc::default(),
            stream_failed: Arc::default(),
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

    /// The longest key (relative to this store, like every key here) the backend takes, or
    /// None without a limit worth checking: S3 keys are at most 1024 bytes, its key prefix
    /// included. A directory store is limited per name (255), as the node store is.
    pub fn max_key_len(&self) -> Option<usize> {
        match &self.spec {
            Spec::S3(s) if s.prefix.is_empty() => Some(S3_MAX_KEY),
            Spec::S3(s) => Some(S3_MAX_KEY.saturating_sub(s.prefix.len() + 1)),
            _ => None,
        }
    }

    /// Starts recording every request (operation and path: `get`, `get_range`, `head`,
    /// `put`, `delete`, `list` of a prefix), for tests that measure what an operation costs.
    /// A directory store also records each fsync once it is done: `fsync` of an object,
    /// `fsync_dir` of a directory (its key; "" for the root).
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
        // Where the credentials came from, for an error about them.
        let with_source = |detail: String| match &self.spec {
            Spec::S3(s) => format!("{detail} (credentials from {})", s.credentials),
            Spec::Dir(_) => detail,
        };
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
                let detail = with_source(detail);
                Error::Auth { store, detail }
            }
            _ if matches!(self.spec, Spec::S3(_))
                && (auth_codes.iter().any(|c| text.contains(c))
                    || text.contains("Error getting credentials")
                    || text.contains("credential")) =>
            {
                let detail = with_source(detail);
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
}
