//! Cascade L2, the durable tier: a local directory (the stand-in for a parallel file system)
//! or an S3-compatible object store, reached through the `object_store` crate.
//!
//! The layout is plain (docs/durable-layout.md): every file at its relative path, its hex
//! BLAKE3 in `<path>.blake3` beside it, and per checkpoint a completion marker
//! `<checkpoint>/.cascade-complete` written last. [`AsyncDurableStore`] is the async API (for
//! callers with their own tokio runtime); [`DurableStore`] wraps it with a small runtime of
//! its own and a blocking API.

mod backend;
mod blocking;
mod error;
mod key;
mod layout;
mod spec;

pub use backend::{AsyncDurableStore, JobProgress, Options, PartsIn, StreamingPut, UploadItem};
pub use blocking::{DurableStore, CHECKSUM_READS_IN_FLIGHT, RUNTIME_THREAD};
pub use error::{Error, Result};
pub use key::DurableKey;
pub use layout::{
    is_reserved_name, marker_key, normalize_rel, now_unix_ns, parse_checksum, part_key, Children,
    FileDigest, Marker, MarkerFile, ObjectInfo, Part, CHECKSUM_SUFFIX, MARKER_FORMAT, MARKER_NAME,
    PART_FORMAT, PART_PREFIX, SINGLE_PUT_MAX, VERSION_SUFFIX,
};
pub use spec::{Credentials, S3Spec, Spec, CREDENTIALS_FILE_ENV};
