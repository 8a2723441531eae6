//! Checkpoints written by the ranks of a job on several nodes (docs/agent.md, "Jobs on many
//! nodes"; the layout in docs/durable-layout.md, "Checkpoints of many nodes").
//!
//! On a job of N nodes, a directory checkpoint is complete only when every node's files are
//! durable. This level goes first in the route: it passes files on to the levels that store
//! them, and takes over completing directory checkpoints: once this node's files are
//! durable it writes the node's part, then joins the parts into the completion record when
//! all N are there (whichever node sees that first; the others find it). The record is the
//! plain layout's marker, or with dedup the repository's manifest, joined from the nodes'
//! part manifests (the dedup levels store each node's files as its part). A single-file
//! checkpoint is one node's own and goes on to the next level.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_durable::{DurableKey, JobProgress, Part, PartsIn, PART_FORMAT};
use cascade_store::{FileKind, LifeEntry};

use crate::level::{Found, Level, Step, Unit};
use crate::node::{files_of, reserved, Checkpoint, Node};
use crate::options::JobOptions;
use crate::repository::Repository;
use crate::{Error, Result};

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

/// Where the parts of a checkpoint, all in, were joined.
enum Joined {
    /// Into its completion record, listing `files` files of `nodes`.
    Complete { files: usize, nodes: Vec<String> },
    /// Not yet: parts are missing.
    Waiting(PartsIn),
}

pub(crate) struct JobParts {
    job: JobOptions,
    /// Files go to staging servers first: a file needs no sending once it is safe there.
    staged: bool,
    /// With dedup: the repository whose manifest completes a checkpoint, joined from the
    /// nodes' part manifests. None: the plain layout's marker, joined from the parts.
    repository: Option<Arc<Repository>>,
    /// Checkpoint versions whose part this agent wrote: (ino, generation, mod_seq).
    written: Mutex<HashSet<(u64, u32, u64)>>,
    /// When each waiting checkpoint (by store path) last asked for the other parts.
    asked: Mutex<HashMap<String, Instant>>,
}

impl JobParts {
    pub(crate) fn new(
        job: JobOptions,
        staged: bool,
        repository: Option<Arc<Repository>>,
    ) -> JobParts {
        JobParts {
            job,
            staged,
            repository,
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
        node.durable.write_part(&part).map_err(Error::Durable)?;
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

    /// Joins the parts of checkpoint `ckpt` into its completion record if every node's is
    /// there (or finds the record written).
    fn join(&self, node: &Node, ckpt: &DurableKey) -> Result<Joined> {
        match &self.repository {
            None => self.join_marker(node, ckpt),
            Some(repository) => self.join_manifest(node, repository, ckpt),
        }
    }

    /// The plain layout: the parts joined into the marker.
    fn join_marker(&self, node: &Node, ckpt: &DurableKey) -> Result<Joined> {
        let progress = node
            .durable
            .complete_job(ckpt, self.job.nodes)
            .map_err(Error::Durable)?;
        Ok(match progress {
            JobProgress::Complete(marker) => Joined::Complete {
                files: marker.files.len(),
                nodes: marker.nodes,
            },
            JobProgress::Waiting(parts) => Joined::Waiting(parts),
        })
    }

    /// With dedup: once every node's part is written, their part manifests joined into the
    /// checkpoint's manifest.
    fn join_manifest(
        &self,
        node: &Node,
        repository: &Repository,
        ckpt: &DurableKey,
    ) -> Result<Joined> {
        let parts = node.durable.read_parts(ckpt).map_err(Error::Durable)?;
        let progress = PartsIn::against(&parts, self.job.nodes);
        if !progress.all_in() {
            return Ok(Joined::Waiting(progress));
        }
        let Some(repo) = repository.get()? else {
            return Err(Error::io(
                "dedup",
                std::io::Error::other("the durable store has no dedup repository"),
            ));
        };
        let manifest = repo.complete_job(ckpt, &progress.present)?;
        Ok(Joined::Complete {
            files: manifest.files.len(),
            nodes: progress.present,
        })
    }

    /// Completes checkpoint `root` if every node's part is there.
    fn try_complete(&self, node: &Node, root: &LifeEntry) -> Result<Step> {
        let ckpt = DurableKey::from_store_path(&root.path);
        match self.join(node, &ckpt)? {
            Joined::Complete { files, nodes } => {
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
                        "checkpoint {} complete ({files} files from nodes {})",
                        root.path,
                        nodes.join(", ")
                    )
                });
                Ok(Step::Complete)
            }
            Joined::Waiting(parts) => {
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

    /// With dedup, checkpoints are stored whole (each node's part by the dedup levels).
    fn takes(&self) -> Option<Unit> {
        Some(match self.repository {
            Some(_) => Unit::Checkpoints,
            None => Unit::Files,
        })
    }

    fn holds(&self, e: &LifeEntry) -> bool {
        if self.staged && self.repository.is_none() {
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
            // With dedup, the dedup levels store this node's part first.
            PartState::NotReady if self.repository.is_some() => return Step::Next,
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
