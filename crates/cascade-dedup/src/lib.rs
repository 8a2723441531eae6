//! Dedup and compression for Cascade (docs/dedup.md): the building blocks, and the dedup
//! repository they fill in the durable tier.
//!
//! - [`Chunking`]: fixed-size chunks (512 B to 1 MiB) or content-defined chunks (FastCDC
//!   v2020 with min/avg/max), parsed from specs such as `fixed:4KiB` and `cdc:avg=64KiB`;
//!   over a slice ([`Chunking::split`]) or a reader ([`Chunking::stream`]).
//! - [`Score`]: the BLAKE3 hash of a chunk, its identity in a dedup index.
//! - [`Compression`]: `none` or `zstd:LEVEL`, applied per chunk and skipped when it does not
//!   save at least an eighth of the chunk.
//! - [`ingest`]: a file read in windows, chunked, scored and compressed on every core.
//! - [`repo`]: the dedup repository (packs, indexes, manifests, recipes, deltas, garbage
//!   collection); [`Repo`] opens one, [`Error`] is its failure.
//!
//! The analysis of checkpoint series (`cascade analyze`, heatmaps) is the cascade-analyze
//! crate, built on these.

pub mod adaptive;
pub mod chunking;
pub mod compress;
pub mod ingest;
pub mod repo;
pub mod score;

pub use chunking::{Chunking, ParseChunkingError};
pub use compress::{Compression, ParseCompressionError};
pub use repo::{Error, FileRecipe, Manifest, Repo, RepoWriter, Result};
pub use score::{score, Score};
