//! Checkpoints written by several nodes (docs/dedup.md, "Checkpoints of many nodes").
//!
//! Each node stores its own files of a directory checkpoint as a **part manifest**: an
//! ordinary manifest named `<checkpoint>/.cascade-part.<node>` (so garbage collection keeps
//! its packs like any manifest's, and a staging server writes it like any other). Once
//! every node's part is there, whichever node sees that first joins them into the
//! checkpoint's manifest — its completion record. The join is a function of the parts alone
//! (files in path order, packs merged, the newest part's time), written only if absent where
//! the backend can tell; a manifest that no longer matches the parts (a node rewrote its
//! part since) is replaced by the join of the current ones.

use cascade_durable::PART_PREFIX;

use super::gc::{groups_of, set_of, PackSet};
use super::session::merge;
use super::{Error, Manifest, Repo, Result, MANIFEST_FORMAT};

/// How often a completer reads the parts again when the manifest it found disagrees with
/// them (another node rewrote its part meanwhile).
const JOIN_ATTEMPTS: usize = 3;

/// The name of node `node`'s part manifest of checkpoint `checkpoint`.
pub fn part_name(checkpoint: &str, node: &str) -> String {
    format!("{}/{PART_PREFIX}{node}", checkpoint.trim_end_matches('/'))
}

/// The checkpoint and node of a part manifest's name; None for a checkpoint's own name.
pub fn part_of(name: &str) -> Option<(&str, &str)> {
    let (checkpoint, base) = name.rsplit_once('/')?;
    let node = base.strip_prefix(PART_PREFIX)?;
    Some((checkpoint, node))
}

/// The checkpoint a manifest belongs to: its own name, or for a part the checkpoint's.
pub fn checkpoint_of(name: &str) -> &str {
    part_of(name).map_or(name, |(checkpoint, _)| checkpoint)
}

impl Repo {
    /// The part manifests of `checkpoint` written by `nodes` (each must be there).
    pub fn read_parts(&self, checkpoint: &str, nodes: &[String]) -> Result<Vec<Manifest>> {
        nodes
            .iter()
            .map(|node| {
                self.read_manifest(&part_name(checkpoint, node))?
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "node {node}'s part of {checkpoint} is not in the dedup repository \
                             (did that node run without dedup?)"
                        ))
                    })
            })
            .collect()
    }

    /// Joins the parts of `checkpoint` written by `nodes` (every node of the job, each part
    /// there) into its manifest and returns it: the manifest already written if it lists
    /// the same files, else the join, written only if absent (or over a manifest that no
    /// longer matches the parts).
    pub fn complete_job(&self, checkpoint: &str, nodes: &[String]) -> Result<Manifest> {
        let ckpt = cascade_durable::normalize_rel(checkpoint)?;
        let key = self.manifest_key(&ckpt)?;
        for _ in 0..JOIN_ATTEMPTS {
            let joined = join(&ckpt, &self.read_parts(&ckpt, nodes)?)?;
            match self.read_manifest(&ckpt)? {
                Some(old) if old.files == joined.files => return Ok(old),
                Some(_) => {
                    self.durable.put_bytes(&key, &encode(&joined)?)?;
                }
                None => {
                    if !self.durable.put_if_absent(&key, encode(&joined)?)? {
                        // Another node wrote it first: check it against the parts again.
                        continue;
                    }
                }
            };
            return Ok(joined);
        }
        Err(Error::Conflict(format!(
            "the parts of {ckpt} kept changing while they were joined; trying again later"
        )))
    }

    /// What the parts of `checkpoint` written by `nodes` list together (a partial restore of
    /// a checkpoint whose other parts never arrived).
    pub fn joined_parts(&self, checkpoint: &str, nodes: &[String]) -> Result<Manifest> {
        let ckpt = cascade_durable::normalize_rel(checkpoint)?;
        join(&ckpt, &self.read_parts(&ckpt, nodes)?)
    }
}

/// The manifest of checkpoint `ckpt` that joins `parts`: every file once, in path order, and
/// every pack any part names. Two nodes listing one path with different contents is an error
/// (ranks of different nodes must write different files).
fn join(ckpt: &str, parts: &[Manifest]) -> Result<Manifest> {
    let mut files: Vec<_> = parts.iter().flat_map(|p| p.files.iter().cloned()).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup();
    if let Some(pair) = files.windows(2).find(|w| w[0].path == w[1].path) {
        return Err(Error::Invalid(format!(
            "{ckpt}/{}: written by two nodes with different contents",
            pair[0].path
        )));
    }
    // A part written without its pack set (none is, today) leaves the join without one: the
    // collector then walks its trees.
    let mut packs = Some(PackSet::new());
    for part in parts {
        match (&mut packs, &part.packs) {
            (Some(set), Some(groups)) => merge(set, &set_of(groups)?),
            _ => packs = None,
        }
    }
    let first = parts.first();
    Ok(Manifest {
        format: MANIFEST_FORMAT.to_string(),
        checkpoint: ckpt.to_string(),
        created_unix_ns: parts.iter().map(|p| p.created_unix_ns).max().unwrap_or(0),
        chunking: first.map(|p| p.chunking.clone()).unwrap_or_default(),
        compression: first.map(|p| p.compression.clone()).unwrap_or_default(),
        files,
        packs: packs.map(|set| groups_of(&set)),
        single_file: false,
    })
}

fn encode(manifest: &Manifest) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(manifest).map_err(|e| Error::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_checkpoints_are_not_parts() {
        let name = part_name("job/ckpt.1/", "node-a");
        assert_eq!(name, "job/ckpt.1/.cascade-part.node-a");
        assert_eq!(part_of(&name), Some(("job/ckpt.1", "node-a")));
        assert_eq!(checkpoint_of(&name), "job/ckpt.1");
        assert_eq!(part_of("job/ckpt.1"), None);
        assert_eq!(checkpoint_of("job/ckpt.1"), "job/ckpt.1");
    }
}
