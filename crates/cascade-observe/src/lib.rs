//! What the long-running Cascade processes (`cascade agent`, `cascade stage-server`) tell
//! operators: log events through `tracing` ([`log`]) and Prometheus metrics over HTTP
//! ([`metrics`]). See docs/operations.md.

pub mod log;
pub mod metrics;

pub use tracing;
