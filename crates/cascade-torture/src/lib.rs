//! Test support for the Cascade node store: a torture writer that performs long random
//! sequences of operations, a content check whose invariants hold at any instant (so it can
//! judge a store whose writers were killed at random moments), and a line-protocol server for
//! scripted multi-process tests. The `cascade-torture` binary exposes all three.

pub mod check;
pub mod extents;
pub mod pattern;
pub mod serve;
pub mod torture;

pub use check::{check_file_content, check_tree, walk, TreeSummary};
pub use pattern::{file_name, parse_file_name, pattern, pattern_byte};
pub use torture::{Failure, RunParams, RunStats, Torture};
