//! The levels the agent sends checkpoints down to, one file each (the `Level` trait is in
//! `level.rs`; the agent builds its list in `agent.rs`, `levels_for`).

pub(crate) mod dedup;
pub(crate) mod job;
pub(crate) mod plain;
pub(crate) mod staged;
pub(crate) mod staged_dedup;
