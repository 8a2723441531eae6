//! The S3 client of a store with `sign_payload=no`: multipart parts and every other request
//! go unsigned (UNSIGNED-PAYLOAD), but a single PUT is always signed with its body's SHA-256.
//!
//! A single PUT replaces the object of its name when the server takes its body, and a
//! server that does not hold a body to its Content-Length takes one cut short for a whole
//! one: versitygw stored the first MiB of a 6 MiB PUT whose connection closed mid-body, over
//! the older object (test: `s3_single_puts_cut_short_leave_the_older_object`). With the
//! SHA-256 in the signature it refuses the body instead. A multipart part needs no such
//! guard: no server completes an upload without the client's last request, which names
//! every part's ETag. The hash costs about 0.5 s of CPU per GB, paid only on files up to one
//! part and on dedup packs (docs/durable-layout.md).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Single PUTs through `signed`, everything else through `unsigned`: two clients of one
/// bucket with the same credentials and options but for `with_unsigned_payload`.
pub(super) struct SignedSinglePuts {
    pub signed: AmazonS3,
    pub unsigned: Arc<AmazonS3>,
}

impl fmt::Display for SignedSinglePuts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SignedSinglePuts({})", self.unsigned)
    }
}

impl fmt::Debug for SignedSinglePuts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedSinglePuts")
            .field("unsigned", &self.unsigned)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ObjectStore for SignedSinglePuts {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.signed.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.unsigned.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.unsigned.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        self.unsigned.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.unsigned.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.unsigned.delete(location).await
    }

    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        self.unsigned.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.unsigned.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.unsigned.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.unsigned.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.unsigned.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.unsigned.copy_if_not_exists(from, to).await
    }
}
