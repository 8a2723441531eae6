//! The node agent (docs/agent.md) and the agent's one-shot data paths: drain a checkpoint
//! from the node store to the durable store, and restore one from the durable store into a
//! local directory or the node store.
//!
//! How the agent is built (docs/agent.md, "Levels in the agent"): `agent` runs passes over
//! the store and decides what is ready; `level` is the interface of a level below the store,
//! and `levels/` holds one file per level (the job's checkpoints of many nodes, staging
//! servers plain or as chunks, the dedup repository, the plain durable layout). `node` is
//! what they all share; `servers` and `repository` are shared by two levels each; `deltas`
//! finds the previous checkpoint a delta is stored against; `rules` commits the checkpoints
//! of programs that never call `cascade_commit` (`checkpoint.rules`); `readthrough` and
//! `control` serve the application's requests, and `store_write` writes what they fetch
//! (and restores) into the node store.

mod agent;
mod control;
mod deltas;
mod drain;
mod error;
mod level;
mod levels;
pub mod metrics;
mod node;
mod options;
mod reader;
mod readthrough;
mod report;
mod repository;
mod restore;
mod rules;
mod servers;
mod store_write;

pub use agent::{Agent, PassOutcome};
pub use control::{read_through, request, status, ReadThrough, ReadThroughRequest};
pub use drain::{
    checkpoint_name, drain_checkpoint, drain_checkpoint_dedup, previous_drained, DedupDrain,
};
pub use error::{Error, Result};
pub use options::{
    AgentOptions, AgentStats, CheckpointRules, DedupOptions, DedupStaging, JobOptions, Placement,
    StagingOptions,
};
pub use reader::StoreFileReader;
pub use report::{Progress, Report};
pub use restore::{restore_checkpoint, restore_into_store, restore_partial_checkpoint};
pub use rules::{commit_by_rules, RulesOutcome};
