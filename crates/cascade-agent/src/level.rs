//! A level below the node store that the agent sends checkpoints down to and fetches them
//! back from (docs/agent.md, "Levels in the agent").
//!
//! The agent holds its levels as one list, nearest first (on a job of several nodes the
//! job's completion, then staging servers, then the durable store's dedup repository and
//! plain layout). A pass decides what is ready and in which
//! order, and hands it to the levels that send (`takes()`), first to last: a level passes on
//! what it cannot take. Read-through asks every level for the key and takes the newest
//! version found. A new level is one more implementation of [`Level`] in `levels/` and one
//! line where the agent builds its list.

use std::time::Instant;

use cascade_durable::DurableKey;
use cascade_store::LifeEntry;

use crate::node::{Checkpoint, Node};
use crate::Result;

/// What a level takes when the agent sends checkpoints down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Every file as soon as it is closed; a committed checkpoint completes once all its
    /// files are there.
    Files,
    /// A committed checkpoint whole, once nothing writes it.
    Checkpoints,
}

/// Where one step of a committed checkpoint left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Complete at the bottom (marker or manifest written) and recorded so in the block.
    Complete,
    /// Handed to this level, which completes it later (pushed to a staging server).
    Handed,
    /// This level holds it and completes it on its own; look again at the instant.
    Waiting(Instant),
    /// This node's part of a checkpoint of several nodes is durable; the other nodes' parts
    /// are not all there yet. Look again at the instant.
    OtherNodes(Instant),
    /// Not ready yet (its files are not all there, or a send failed); the pass counts it
    /// pending.
    NotReady,
    /// A file below it is open for writing or torn: waits for the application.
    Blocked,
    /// Failed; tried again not before the instant.
    RetryAt(Instant),
    /// It changed or went away while being sent: the next pass sees the new version.
    Changed,
    /// This node's part of a checkpoint of several nodes is stored and its files recorded
    /// durable: the next pass writes the part's record and joins the parts (levels/job.rs).
    PartStored,
    /// Not for this level (or this level failed and said so): the next level takes it.
    Next,
}

/// What a level learnt when asked what went further down.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Poll {
    /// Something was recorded in the block (became durable or complete).
    pub(crate) progressed: bool,
    /// Files this level holds that are not durable yet.
    pub(crate) waiting: usize,
    /// When to ask again, if something is waiting.
    pub(crate) ask_again: Option<Instant>,
}

/// A file fetches this into a store file (the temporary name given) and returns its size,
/// or None if the level no longer has it.
pub(crate) type Fetch<'a> = Box<dyn FnOnce(&str) -> Result<Option<u64>> + 'a>;

/// A file version a level holds: when it was written (unix ns; 0 when unknown), and how to
/// fetch it.
pub(crate) struct Found<'a> {
    pub(crate) stamp: u64,
    pub(crate) fetch: Fetch<'a>,
}

/// One entry of a directory that a level holds, for listings on a node whose store lacks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) name: String,
    pub(crate) dir: bool,
    pub(crate) size: u64,
    /// When it was written (unix ns; 0 when unknown).
    pub(crate) modified_ns: i64,
}

/// For levels that store a checkpoint whole: the step to report instead of storing it now,
/// if it is being written or its last attempt failed not long ago.
pub(crate) fn not_yet_whole(node: &Node, c: &Checkpoint) -> Option<Step> {
    if c.busy() {
        return Some(Step::Blocked);
    }
    node.retry_not_before(c.root, Instant::now())
        .map(Step::RetryAt)
}

/// Reports a failed attempt at checkpoint `root` (`what` failed with `error`) and when it is
/// tried again.
pub(crate) fn retry_later(
    node: &Node,
    root: &LifeEntry,
    what: &str,
    error: &dyn std::fmt::Display,
) -> Step {
    let (attempts, delay) = node.schedule_retry(root);
    node.record_failure(format!(
        "{what} failed (attempt {attempts}): {error}; retrying in {:.1} s",
        delay.as_secs_f64()
    ));
    Step::RetryAt(Instant::now() + delay)
}

/// A level the agent sends checkpoints down to and fetches them back from.
pub(crate) trait Level: Send + Sync {
    /// Names the level in logs and `cascade status`.
    fn name(&self) -> String;

    /// What this level takes when sending, or None if it only serves reads of what was sent
    /// to it before (under another configuration).
    fn takes(&self) -> Option<Unit>;

    /// False for levels that do not survive the loss of the durable store's site (staging
    /// servers): a file fetched from them is recorded as staged, not durable.
    fn durable(&self) -> bool {
        true
    }

    /// True if file version `e` need not be sent here: it is at this level or below.
    fn holds(&self, e: &LifeEntry) -> bool;

    /// Sends closed files (unit [`Unit::Files`]); returns how many arrived and those it
    /// could not take, for the next level.
    fn send_files<'t>(
        &self,
        _node: &Node,
        files: Vec<&'t LifeEntry>,
    ) -> (usize, Vec<&'t LifeEntry>) {
        (0, files)
    }

    /// One step of committed checkpoint `c` towards complete; `previous` is the complete
    /// checkpoint before it in its series (a base for deltas).
    fn send_checkpoint(
        &self,
        _node: &Node,
        _c: &Checkpoint,
        _previous: Option<&Checkpoint>,
    ) -> Step {
        Step::Next
    }

    /// Asks the level what went further down since it was sent (at most as often as the
    /// level finds useful) and records it in the block.
    fn poll(&self, _node: &Node, _tree: &[LifeEntry]) -> Poll {
        Poll::default()
    }

    /// Read-through: the version of file `key` (a durable key) this level holds, if any.
    fn find<'a>(&'a self, node: &'a Node, key: &'a DurableKey) -> Result<Option<Found<'a>>>;

    /// Read-through, when no level holds a file `key`: true if it is a directory here.
    fn is_dir(&self, _node: &Node, _key: &DurableKey) -> Result<bool> {
        Ok(false)
    }

    /// Read-through of names: what lies directly in directory `key` (the empty key for the
    /// root) at this level, without reading any file.
    fn list(&self, _node: &Node, _key: &DurableKey) -> Result<Vec<Listed>> {
        Ok(Vec::new())
    }
}
