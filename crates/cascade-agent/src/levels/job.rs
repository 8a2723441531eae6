//! Checkpoints written by the ranks of a job on several nodes (docs/agent.md, "Jobs on many
//! nodes"; the layout in docs/durable-layout.md, "Checkpoints of many nodes").
//!
//! On a job of N nodes, a directory checkpoint is complete only when every node's files are
//! durable. This level goes first in the route: it passes files on to the levels that store
//! them, and takes over completing directory checkpoints: once this node's files are
//! durable it writes the node's part, then joins the parts into the marker when all N are
//! there (whichever node sees that first; the others find the marker). A single-file
//! checkpoint is one node's own and goes on to the next level.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cascade_durable::{DurableKey, JobProgress, Part, PART_FORMAT};
use cascade_store::{FileKind, LifeEntry};

use crate::level::{Found, Level, Step, Unit};
use crate::node::{files_of, reserved, Checkpoint, Node};
use crate::options::JobOptions;
use crate::Result;

/// How often a node whose part is in asks whether the others' are.
const ASK_EVERY: Duration = Duration::from_millis(500);

/// Where this node's part of a checkpoint stands.
enum PartState {
    /// Its files are not all durable yet.
    NotReady,
    /// Written by this pass.
    WrittenNow,
    /// Written by an earlier pass (this version).
    WrittenBefore,
}

pub(crate) struct JobParts {
    job: JobOptions,
    /// Files go to staging servers first: a file needs no sending once it is safe there.
    staged: bool,
    /// Checkpoint versions whose part this agent wrote: (ino, generation, mod_seq).
    written: Mutex<HashSet<(u64, u32, u64)>>,
    /// When each waiting checkpoint (by store path) last asked for the other parts.
    asked: Mutex<HashMap<String, Instant>>,
}

impl JobParts {
    pub(crate) fn new(job: JobOptions, staged: bool) -> JobParts {
        JobParts {
            job,
            staged,
            written: Mutex::new(HashSet::new()),
            asked: Mutex::new(HashMap::new()),
        }
    }

    /// Writes this node's part of checkpoint `root` (once per version), if all its files are
    /// durable.
    fn write_part(&self, node: &Node, root: &LifeEntry) -> Result<PartState> {
        let version = (root.ino, root.generation, root.mod_seq);
        if self.written.lock().is_ok_and(|w| w.contains(&version)) {
            return Ok(PartState::WrittenBefore);
        }
        let Some(tree) = node.fresh_tree(root)? else {
            return Ok(PartState::NotReady);
        };
        let now_root = &tree[0];
        let files: Vec<&LifeEntry> = files_of(&tree).collect();
        if files
            .iter()
            .any(|f| !f.durable() || f.torn || reserved(&f.path))
        {
            return Ok(PartState::NotReady);
        }
        let (_, entries) = node.marker_entries(now_root, &files)?;
        let part = Part {
            format: PART_FORMAT.to_string(),
            checkpoint: DurableKey::from_store_path(&now_root.path).into_string(),
            node: self.job.node.clone(),
            nodes: self.job.nodes,
            node_names: self.job.node_names.clone(),
            written_unix_ns: cascade_durable::now_unix_ns(),
            files: entries,
        };
        node.durable
            .write_part(&part)
            .map_err(crate::Error::Durable)?;
        node.log(|| {
            format!(
                "part of {} from node {} written ({} files)",
                now_root.path,
                self.job.node,
                files.len()
            )
        });
        if let Ok(mut w) = self.written.lock() {
            w.insert((now_root.ino, now_root.generation, now_root.mod_seq));
        }
        Ok(PartState::WrittenNow)
    }

    fn note_asked(&self, path: &str) {
        if let Ok(mut asked) = self.asked.lock() {
            asked.insert(path.to_string(), Instant::now());
        }
    }

    /// True if checkpoint `path` asked for the other parts less than [`ASK_EVERY`] ago.
    fn asked_lately(&self, path: &str) -> bool {
        let Ok(mut asked) = self.asked.lock() else {
            return false;
        };
        let now = Instant::now();
        match asked.get(path) {
            Some(at) if now.duration_since(*at) < ASK_EVERY => true,
            _ => {
                asked.insert(path.to_string(), now);
                false
            }
        }
    }

    /// Completes checkpoint `root` if every node's part is there.
    fn try_complete(&self, node: &Node, root: &LifeEntry) -> Result<Step> {
        let ckpt = DurableKey::from_store_path(&root.path);
        match node
            .durable
            .complete_job(&ckpt, self.job.nodes)
            .map_err(crate::Error::Durable)?
        {
            JobProgress::Complete(marker) => {
                if !node
                    .store
                    .mark_complete(root.ino, root.generation, root.mod_seq)
                {
                    return Ok(Step::Changed);
                }
                if let Ok(mut asked) = self.asked.lock() {
                    asked.remove(&root.path);
                }
                if let Ok(mut written) = self.written.lock() {
                    written.remove(&(root.ino, root.generation, root.mod_seq));
                }
                node.count(|s| s.markers += 1);
                node.log(|| {
                    format!(
                        "checkpoint {} complete ({} files from nodes {})",
                        root.path,
                        marker.files.len(),
                        marker.nodes.join(", ")
                    )
                });
                Ok(Step::Complete)
            }
            JobProgress::Waiting(parts) => {
                node.log(|| format!("checkpoint {}: {}", root.path, parts.describe()));
                Ok(Step::OtherNodes(Instant::now() + ASK_EVERY))
            }
        }
    }
}

impl Level for JobParts {
    fn name(&self) -> String {
        format!("the job's checkpoints ({} nodes)", self.job.nodes)
    }

    fn takes(&self) -> Option<Unit> {
        Some(Unit::Files)
    }

    fn holds(&self, e: &LifeEntry) -> bool {
        if self.staged {
            e.safe()
        } else {
            e.durable()
        }
    }

    fn send_checkpoint(&self, node: &Node, c: &Checkpoint, _previous: Option<&Checkpoint>) -> Step {
        if c.root.kind == FileKind::File {
            return Step::Next;
        }
        let part = match self.write_part(node, c.root) {
            Ok(part) => part,
            Err(e) => {
                node.record_failure(format!(
                    "cannot write this node's part of {}: {e}",
                    c.root.path
                ));
                return Step::NotReady;
            }
        };
        // Just written: ask at once. Every node lists the parts after writing its own, so
        // the node that lists last sees them all and writes the marker, even if every node
        // then stops (the end of a job).
        let ask_now = match part {
            PartState::NotReady => return Step::NotReady,
            PartState::WrittenNow => {
                self.note_asked(&c.root.path);
                true
            }
            PartState::WrittenBefore => !self.asked_lately(&c.root.path),
        };
        if !ask_now {
            return Step::OtherNodes(Instant::now() + ASK_EVERY);
        }
        self.try_complete(node, c.root).unwrap_or_else(|e| {
            node.record_failure(format!("cannot complete checkpoint {}: {e}", c.root.path));
            Step::NotReady
        })
    }

    fn find<'a>(&'a self, _node: &'a Node, _key: &'a DurableKey) -> Result<Option<Found<'a>>> {
        Ok(None)
    }
}
