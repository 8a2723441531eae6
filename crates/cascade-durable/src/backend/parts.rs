//! Checkpoints written by several nodes (docs/durable-layout.md, "Checkpoints of many
//! nodes"): each node writes its part `<checkpoint>/.cascade-part.<node>` once its files are
//! durable; whichever node finds every expected part there joins them into the completion
//! marker. The marker is a function of the parts alone (files in path order, nodes in name
//! order, the time of the newest part), so two nodes completing at once write the same bytes;
//! where the backend has a conditional put the marker is also written only if absent.

use object_store::{PutMode, PutOptions, PutPayload};

use super::AsyncDurableStore;
use crate::layout::join;
use crate::{
    marker_key, normalize_rel, part_key, Error, Marker, MarkerFile, Part, Result, MARKER_FORMAT,
    PART_FORMAT, PART_PREFIX,
};

/// Where a checkpoint of several nodes stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobProgress {
    /// Its marker is written: every node's part is in it.
    Complete(Marker),
    /// Some parts are missing.
    Waiting(PartsIn),
}

/// The parts of a checkpoint found so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartsIn {
    /// Nodes whose part is there, in name order.
    pub present: Vec<String>,
    /// How many nodes write the checkpoint.
    pub expected: u32,
    /// The missing nodes by name, when the parts name every node.
    pub missing: Vec<String>,
}

impl PartsIn {
    /// The parts found of a checkpoint, against the node count they declare (the largest).
    pub fn of(parts: &[Part]) -> PartsIn {
        parts_in(parts, parts.iter().map(|p| p.nodes).max().unwrap_or(0))
    }

    /// The parts found of a checkpoint that `nodes` nodes write.
    pub fn against(parts: &[Part], nodes: u32) -> PartsIn {
        parts_in(parts, nodes)
    }

    /// True when every expected node's part is there.
    pub fn all_in(&self) -> bool {
        self.present.len() >= self.expected as usize
    }

    /// "parts from 1 of 2 nodes (a); missing b", for errors and `cascade wait`.
    pub fn describe(&self) -> String {
        let missing = if self.missing.is_empty() {
            format!(
                "{} node(s) missing",
                (self.expected as usize).saturating_sub(self.present.len())
            )
        } else {
            format!("missing {}", self.missing.join(", "))
        };
        let present = if self.present.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.present.join(", "))
        };
        format!(
            "parts from {} of {} nodes{present}; {missing}",
            self.present.len(),
            self.expected
        )
    }
}

impl AsyncDurableStore {
    /// Writes a node's part (replacing an earlier one of the same node).
    pub async fn write_part(&self, part: &Part) -> Result<()> {
        let ckpt = normalize_rel(&part.checkpoint)?;
        let key = part_key(&ckpt, &node_component(&part.node)?);
        let mut json = serde_json::to_vec_pretty(part).map_err(|e| self.encode_error(&key, e))?;
        json.push(b'\n');
        self.put_bytes(&key, json).await
    }

    /// Every part of `checkpoint` written so far, in node order.
    pub async fn read_parts(&self, checkpoint: &str) -> Result<Vec<Part>> {
        let ckpt = normalize_rel(checkpoint)?;
        let prefix = join(&ckpt, PART_PREFIX);
        let mut parts = Vec::new();
        for object in self.list_dir(&ckpt).await? {
            if !object.path.starts_with(&prefix) || object.path[prefix.len()..].contains('/') {
                continue;
            }
            let bytes = self.get_bytes(&object.path).await?;
            let part: Part = serde_json::from_slice(&bytes).map_err(|e| Error::BadChecksum {
                store: self.name.clone(),
                path: object.path.clone(),
                reason: format!("unreadable part of a checkpoint: {e}"),
            })?;
            if part.format != PART_FORMAT {
                return Err(Error::BadChecksum {
                    store: self.name.clone(),
                    path: object.path,
                    reason: format!("unknown part format {:?}", part.format),
                });
            }
            parts.push(part);
        }
        parts.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(parts)
    }

    /// The checkpoint's marker if it is complete; else, if the parts of all `nodes` nodes are
    /// there, joins them into the marker (written only if absent, where the backend can
    /// tell) and returns it; else which parts are missing.
    pub async fn complete_job(&self, checkpoint: &str, nodes: u32) -> Result<JobProgress> {
        let ckpt = normalize_rel(checkpoint)?;
        let parts = self.read_parts(&ckpt).await?;
        let existing = self.read_marker(&ckpt).await?;
        let progress = parts_in(&parts, nodes);
        if !progress.all_in() {
            return Ok(match existing {
                Some(marker) => JobProgress::Complete(marker),
                None => JobProgress::Waiting(progress),
            });
        }
        let marker = self.joined_marker(&ckpt, &parts)?;
        let key = marker_key(&ckpt, false);
        let mut json =
            serde_json::to_vec_pretty(&marker).map_err(|e| self.encode_error(&key, e))?;
        json.push(b'\n');
        match existing {
            // Written by a node that saw the same parts.
            Some(old) if old.files == marker.files && old.nodes == marker.nodes => {
                return Ok(JobProgress::Complete(old))
            }
            // Joins parts a node has rewritten since (its files changed after it was written):
            // replaced by what the parts say now.
            Some(_) => self.put_bytes(&key, json).await?,
            None => {
                self.put_if_absent(&key, json).await?;
            }
        }
        Ok(JobProgress::Complete(marker))
    }

    /// The marker that joins `parts`: every file once, in path order. Two nodes listing the
    /// same path with different contents is an error (ranks of different nodes must write
    /// different files).
    fn joined_marker(&self, ckpt: &str, parts: &[Part]) -> Result<Marker> {
        let mut files: Vec<MarkerFile> = Vec::new();
        for part in parts {
            files.extend(part.files.iter().cloned());
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup();
        if let Some(pair) = files.windows(2).find(|w| w[0].path == w[1].path) {
            return Err(Error::InvalidPath {
                path: join(ckpt, &pair[0].path),
                reason: "written by two nodes with different contents".to_string(),
            });
        }
        Ok(Marker {
            format: MARKER_FORMAT.to_string(),
            checkpoint: ckpt.to_string(),
            completed_unix_ns: parts.iter().map(|p| p.written_unix_ns).max().unwrap_or(0),
            total_bytes: files.iter().map(|f| f.size).sum(),
            files,
            single_file: false,
            nodes: parts.iter().map(|p| p.node.clone()).collect(),
        })
    }

    /// Writes `rel` unless it exists; false if it did. A backend without a conditional put
    /// (an S3 server that does not take `If-None-Match`) overwrites: callers only write
    /// contents that any concurrent writer would write too.
    pub async fn put_if_absent(&self, rel: &str, data: Vec<u8>) -> Result<bool> {
        let (rel, loc) = self.traced("put", rel)?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&loc, PutPayload::from(data.clone()), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(object_store::Error::NotImplemented) => {
                self.put_bytes(&rel, data).await?;
                Ok(true)
            }
            Err(e) => Err(self.classify("put", &rel, e)),
        }
    }

    fn encode_error(&self, key: &str, e: serde_json::Error) -> Error {
        Error::Store {
            store: self.name.clone(),
            op: "encode",
            path: key.to_string(),
            detail: e.to_string(),
        }
    }
}

/// Which of `nodes` nodes' parts are in `parts`.
fn parts_in(parts: &[Part], nodes: u32) -> PartsIn {
    let present: Vec<String> = parts.iter().map(|p| p.node.clone()).collect();
    let names = parts
        .iter()
        .map(|p| &p.node_names)
        .find(|names| !names.is_empty());
    let missing = names.map_or_else(Vec::new, |names| {
        names
            .iter()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect()
    });
    PartsIn {
        present,
        expected: nodes,
        missing,
    }
}

/// A node name as one path component: it names the node's part object.
fn node_component(node: &str) -> Result<String> {
    let ok = !node.is_empty()
        && node != "."
        && node != ".."
        && !node.contains('/')
        && !node.chars().any(|c| c.is_control());
    if ok {
        Ok(node.to_string())
    } else {
        Err(Error::InvalidPath {
            path: node.to_string(),
            reason: "a node name must be one path component".to_string(),
        })
    }
}
