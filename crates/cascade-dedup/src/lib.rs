//! Dedup and compression building blocks for Cascade, and the analysis of checkpoint series
//! behind `cascade analyze` (docs/dedup.md).
//!
//! - [`Chunking`]: fixed-size chunks (512 B to 1 MiB) or content-defined chunks (FastCDC
//!   v2020 with min/avg/max), parsed from specs such as `fixed:4KiB` and `cdc:avg=64KiB`;
//!   over a slice ([`Chunking::split`]) or a reader ([`Chunking::stream`]).
//! - [`Score`]: the BLAKE3 hash of a chunk, its identity in a dedup index.
//! - [`Compression`]: `none` or `zstd:LEVEL`, applied per chunk and skipped when it does not
//!   save at least an eighth of the chunk.
//! - [`analyze`]: dedup and compression figures over an ordered series of snapshots (files or
//!   directories), and change heatmaps laid out on a Hilbert curve ([`heatmap`]).

pub mod analyze;
pub mod chunking;
pub mod compress;
pub mod heatmap;
pub mod ingest;
pub mod repo;
pub mod score;

pub use analyze::{analyze, scan, Error, Options, Report, Series};
pub use chunking::{Chunking, ParseChunkingError};
pub use compress::{Compression, ParseCompressionError};
pub use score::{score, Score};
