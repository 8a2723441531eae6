//! The analysis of checkpoint series behind `cascade analyze` (docs/dedup.md, "cascade
//! analyze"): how much of each snapshot repeats what came before under several chunkings,
//! how well the new data compresses, and where in each file the changes are.
//!
//! - [`analyze`](mod@analyze): dedup and compression figures over an ordered series of snapshots (files or
//!   directories), built on cascade-dedup's chunkings, scores and compression.
//! - [`heatmap`]: change heatmaps laid out on a Hilbert curve, written as PNGs.

pub mod analyze;
pub mod heatmap;

pub use analyze::{analyze, scan, Error, Options, Report, Series};
