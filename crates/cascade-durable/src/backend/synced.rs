//! A directory store whose writes are durable when they return.
//!
//! object_store's `LocalFileSystem` writes an object to a staging file `<name>#<n>` and
//! renames (or, for a conditional put, hard-links) it into place, and never calls fsync: a
//! crash of the machine could lose an object that Cascade had already called durable (the
//! agent evicts, staging servers reclaim their arenas). [`SyncedDir`] delegates every
//! request to it and, before a write returns, fsyncs the object and every directory from
//! its parent up to the store root (an entry created in a new directory is durable only
//! once that directory's own entry is), and after a delete that removed something, the
//! directory it was in. Writes the caller awaits in order therefore reach the disk in that
//! order: a completion marker written after its files is never durable without them.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

use super::Trace;

/// `LocalFileSystem` with fsync of what it writes (see the module documentation).
pub(super) struct SyncedDir {
    inner: LocalFileSystem,
    trace: Arc<Trace>,
}

impl SyncedDir {
    pub(super) fn new(inner: LocalFileSystem, trace: Arc<Trace>) -> Self {
        SyncedDir { inner, trace }
    }

    /// What to fsync for a write (`file`) or a delete (not `file`) of `location`.
    fn sync_job(&self, location: &Path, file: bool) -> Result<SyncJob> {
        Ok(SyncJob {
            path: self.inner.path_to_filesystem(location)?,
            rel: location.to_string(),
            file,
            trace: Arc::clone(&self.trace),
        })
    }
}

/// The fsyncs that make one write or delete durable, run on a blocking thread.
#[derive(Debug)]
struct SyncJob {
    /// The object's path in the file system.
    path: std::path::PathBuf,
    /// Its key, for the trace.
    rel: String,
    /// True after a write: fsync the file and every directory up to the root. False after a
    /// delete: fsync the directory that held it.
    file: bool,
    trace: Arc<Trace>,
}

impl SyncJob {
    async fn run(self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.run_blocking())
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })?
    }

    fn run_blocking(&self) -> Result<()> {
        if self.file {
            self.fsync("fsync", &self.path, &self.rel)?;
        }
        // The directories from the object's parent up: as many as the key has components
        // (`a/b/c` is in `root/a/b`, whose entry is in `root/a`, whose entry is in the root).
        let depth = if self.file {
            self.rel.split('/').count()
        } else {
            1
        };
        let mut dir = self.path.as_path();
        let mut dir_rel = self.rel.as_str();
        for _ in 0..depth {
            let Some(parent) = dir.parent() else { break };
            dir = parent;
            dir_rel = dir_rel.rsplit_once('/').map_or("", |(d, _)| d);
            self.fsync("fsync_dir", dir, dir_rel)?;
        }
        Ok(())
    }

    /// fsync(2) of a file or directory (a directory opened read-only can be synced), then
    /// recorded in the trace as `op` of `rel`.
    fn fsync(&self, op: &'static str, path: &std::path::Path, rel: &str) -> Result<()> {
        let sync = || std::fs::File::open(path)?.sync_all();
        sync().map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::new(
                e.kind(),
                format!("fsync {}: {e}", path.display()),
            )),
        })?;
        self.trace.note(op, rel);
        Ok(())
    }
}

impl fmt::Display for SyncedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Synced({})", self.inner)
    }
}

impl fmt::Debug for SyncedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncedDir")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ObjectStore for SyncedDir {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let job = self.sync_job(location, true)?;
        let done = self.inner.put_opts(location, payload, opts).await?;
        job.run().await?;
        Ok(done)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let job = self.sync_job(location, true)?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(SyncedUpload {
            inner,
            job: Some(job),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_range(
        &self,
        location: &Path,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes> {
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let job = self.sync_job(location, false)?;
        self.inner.delete(location).await?;
        job.run().await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        self.inner.copy(from, to).await?;
        job.run().await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        let gone = self.sync_job(from, false)?;
        self.inner.rename(from, to).await?;
        job.run().await?;
        gone.run().await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let job = self.sync_job(to, true)?;
        self.inner.copy_if_not_exists(from, to).await?;
        job.run().await
    }
}

/// A multipart upload that fsyncs the object once it is complete.
#[derive(Debug)]
struct SyncedUpload {
    inner: Box<dyn MultipartUpload>,
    job: Option<SyncJob>,
}

#[async_trait]
impl MultipartUpload for SyncedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let done = self.inner.complete().await?;
        if let Some(job) = self.job.take() {
            job.run().await?;
        }
        Ok(done)
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}
