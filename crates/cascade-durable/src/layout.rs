//! The durable layout (docs/durable-layout.md): names of the marker, checksum and version
//! objects, the marker itself, and how a relative path becomes a key.

use serde::{Deserialize, Serialize};

use crate::{DurableKey, Result};

/// Name of the completion marker inside a checkpoint directory.
pub const MARKER_NAME: &str = ".cascade-complete";
/// Suffix of the checksum object beside each file.
pub const CHECKSUM_SUFFIX: &str = ".blake3";
/// Suffix of the hidden version object `<dir>/.<base>.cascade-version` beside each file.
pub const VERSION_SUFFIX: &str = ".cascade-version";
/// Largest object uploaded in one request (S3 allows 5 GiB).
pub const SINGLE_PUT_MAX: u64 = 4 << 30;
/// Format tag written in every marker.
pub const MARKER_FORMAT: &str = "cascade-complete/1";
/// Prefix of a node's part of a checkpoint written by several nodes:
/// `<checkpoint>/.cascade-part.<node>`.
pub const PART_PREFIX: &str = ".cascade-part.";
/// Format tag written in every part.
pub const PART_FORMAT: &str = "cascade-part/1";

/// Size and BLAKE3 of a file, as recorded in the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    /// Lowercase hex BLAKE3 of the whole file (64 characters).
    pub blake3: String,
}

/// One object in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the store root ("ckpt.0001/rank0.dat").
    pub path: String,
    pub size: u64,
    /// When the object was last written (unix ns): the file's time in a directory store,
    /// the upload time in an object store.
    pub modified_ns: i64,
}

/// One level of a listing: the objects directly in a directory and its subdirectories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Children {
    pub files: Vec<ObjectInfo>,
    /// Subdirectory names (last path component), sorted.
    pub dirs: Vec<String>,
}

/// One file of a checkpoint in its marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

/// The completion marker `<checkpoint>/.cascade-complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub format: String,
    /// The checkpoint directory relative to the store root.
    pub checkpoint: String,
    /// When the marker was written, nanoseconds since the Unix epoch.
    pub completed_unix_ns: u64,
    pub total_bytes: u64,
    pub files: Vec<MarkerFile>,
    /// A checkpoint that is one file: the file is the object `checkpoint` itself (its one
    /// entry's `path` is the base name) and the marker is `<checkpoint>.cascade-complete`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_file: bool,
    /// For a checkpoint written by several nodes: the nodes whose parts it joins, in name
    /// order (empty for one node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// One node's part of a directory checkpoint written by several nodes (a job's ranks on
/// many nodes): the files this node wrote, written once they are all durable. The marker
/// joins the parts once every expected node's is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub format: String,
    /// The checkpoint directory relative to the store root.
    pub checkpoint: String,
    /// The node that wrote it.
    pub node: String,
    /// How many nodes write the checkpoint.
    pub nodes: u32,
    /// Their names, when the launcher gives them (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<String>,
    /// When the part was written, nanoseconds since the Unix epoch.
    pub written_unix_ns: u64,
    pub files: Vec<MarkerFile>,
}

/// Key of node `node`'s part of `checkpoint` (normalized).
pub fn part_key(checkpoint: &str, node: &str) -> String {
    join(checkpoint, &format!("{PART_PREFIX}{node}"))
}

impl Marker {
    /// Key of a file of this checkpoint, relative to the store root.
    pub fn object_key(&self, file: &MarkerFile) -> String {
        if self.single_file {
            self.checkpoint.clone()
        } else {
            join(&self.checkpoint, &file.path)
        }
    }
}

/// Key of the completion marker of `checkpoint` (normalized): `<ckpt>/.cascade-complete` for a
/// directory, `<ckpt>.cascade-complete` beside a single-file checkpoint.
pub fn marker_key(checkpoint: &str, single_file: bool) -> String {
    if single_file {
        format!("{checkpoint}{MARKER_NAME}")
    } else {
        join(checkpoint, MARKER_NAME)
    }
}

/// Checks a relative path and normalises it to `a/b/c` (a leading '/' is dropped); see
/// [`DurableKey::parse`].
pub fn normalize_rel(path: &str) -> Result<String> {
    DurableKey::parse(path).map(DurableKey::into_string)
}

pub(crate) fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// Wall-clock time in ns since the Unix epoch: marker times and version stamps.
pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// True for a base name the durable layout reserves inside a checkpoint: the marker, the
/// nodes' parts, checksum objects, single-file markers and version objects.
pub fn is_reserved_name(base: &str) -> bool {
    base == MARKER_NAME
        || base.starts_with(PART_PREFIX)
        || base.ends_with(CHECKSUM_SUFFIX)
        || base.ends_with(MARKER_NAME)
        || (base.starts_with('.') && base.ends_with(VERSION_SUFFIX))
}

/// The version object of `rel` (already normalized): `<dir>/.<base>.cascade-version`.
pub(crate) fn version_key(rel: &str) -> String {
    match rel.rsplit_once('/') {
        Some((dir, base)) => format!("{dir}/.{base}{VERSION_SUFFIX}"),
        None => format!(".{rel}{VERSION_SUFFIX}"),
    }
}

/// Parses the contents of a `.blake3` object: 64 hex digits, optionally followed by
/// whitespace and a file name (the `b3sum` format).
pub fn parse_checksum(text: &str) -> Option<String> {
    let hex = text.split_whitespace().next()?;
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| hex.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_paths() {
        assert_eq!(normalize_rel("/a/b").unwrap(), "a/b");
        assert_eq!(normalize_rel("a").unwrap(), "a");
        assert!(normalize_rel("a//b").is_err());
        assert!(normalize_rel("a/../b").is_err());
        assert!(normalize_rel("").is_err());
    }

    #[test]
    fn parses_checksums() {
        let h = "ab".repeat(32);
        assert_eq!(parse_checksum(&format!("{h}  x.dat\n")), Some(h.clone()));
        assert_eq!(parse_checksum(&h.to_uppercase()), Some(h));
        assert_eq!(parse_checksum("abc"), None);
        assert_eq!(parse_checksum(""), None);
    }
}
