//! The blocking API: [`DurableStore`] runs [`AsyncDurableStore`] on a small tokio runtime of
//! its own.

use std::io::{Read, Write};
use std::ops::Range;

use bytes::Bytes;

use crate::{
    AsyncDurableStore, Error, FileDigest, JobProgress, Marker, MarkerFile, ObjectInfo, Options,
    Part, Result, Spec, StreamingPut, UploadItem,
};

/// The name of the threads of the runtime a [`DurableStore`] owns (its uploads and
/// downloads run there), for `top -H` and CPU accounting by thread.
pub const RUNTIME_THREAD: &str = "cascade-durable";

/// How many checksum objects [`DurableStore::recorded_checksums`] reads at a time.
pub const CHECKSUM_READS_IN_FLIGHT: usize = 16;

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
            .thread_name(RUNTIME_THREAD)
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

    /// See [`AsyncDurableStore::max_key_len`].
    pub fn max_key_len(&self) -> Option<usize> {
        self.inner.max_key_len()
    }

    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Where this store lives, as parsed.
    pub fn spec(&self) -> &crate::Spec {
        self.inner.spec()
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

    /// See [`AsyncDurableStore::can_stream`].
    pub fn can_stream(&self) -> bool {
        self.inner.can_stream()
    }

    /// Starts a streaming upload; see [`AsyncDurableStore::put_stream`]. Feed it with
    /// [`StreamingPut::send`] from any thread, end it with [`Self::finish_stream`].
    pub fn put_stream(&self, rel: &str, len: u64) -> Result<StreamingPut> {
        self.rt.block_on(self.inner.put_stream(rel, len))
    }

    /// Ends a streaming upload and waits for the store's answer.
    pub fn finish_stream(&self, put: StreamingPut) -> Result<()> {
        self.rt.block_on(put.finish())
    }

    pub fn put_buffers(&self, rel: &str, parts: Vec<Bytes>) -> Result<()> {
        self.rt.block_on(self.inner.put_buffers(rel, parts))
    }

    /// See [`AsyncDurableStore::put_buffers_streamed`].
    pub fn put_buffers_streamed(&self, rel: &str, parts: Vec<Bytes>) -> Result<()> {
        self.rt
            .block_on(self.inner.put_buffers_streamed(rel, parts))
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

    pub fn list_dir(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        self.rt.block_on(self.inner.list_dir(dir))
    }

    pub fn list_children(&self, dir: &str) -> Result<crate::Children> {
        self.rt.block_on(self.inner.list_children(dir))
    }

    pub fn delete(&self, rel: &str) -> Result<()> {
        self.rt.block_on(self.inner.delete(rel))
    }

    pub fn recorded_checksum(&self, rel: &str) -> Result<String> {
        self.rt.block_on(self.inner.recorded_checksum(rel))
    }

    /// [`Self::recorded_checksum`] of each of `rels`, in their order, with up to
    /// [`CHECKSUM_READS_IN_FLIGHT`] reads at a time: on S3 each is a round trip, and an
    /// agent may look up thousands at once (a staging server lost with its files).
    pub fn recorded_checksums(&self, rels: &[&str]) -> Vec<Result<String>> {
        use futures::stream::{self, StreamExt};
        self.rt.block_on(
            stream::iter(rels.iter().map(|rel| self.inner.recorded_checksum(rel)))
                .buffered(CHECKSUM_READS_IN_FLIGHT)
                .collect(),
        )
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

    pub fn write_part(&self, part: &Part) -> Result<()> {
        self.rt.block_on(self.inner.write_part(part))
    }

    pub fn read_parts(&self, checkpoint: &str) -> Result<Vec<Part>> {
        self.rt.block_on(self.inner.read_parts(checkpoint))
    }

    pub fn complete_job(&self, checkpoint: &str, nodes: u32) -> Result<JobProgress> {
        self.rt.block_on(self.inner.complete_job(checkpoint, nodes))
    }

    /// See [`AsyncDurableStore::put_if_absent`].
    pub fn put_if_absent(&self, rel: &str, data: Vec<u8>) -> Result<bool> {
        self.rt.block_on(self.inner.put_if_absent(rel, data))
    }
}
