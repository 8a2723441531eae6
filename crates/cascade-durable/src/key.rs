//! [`DurableKey`]: where a file of the node store lives in the durable store.

use std::fmt;
use std::ops::Deref;

use crate::{Error, Result};

/// A key of the durable store: a store path without its leading '/', relative to the store
/// root (`ckpt.0001/rank0.dat` for the node-store path `/ckpt.0001/rank0.dat`).
///
/// The store's key-taking functions take `&str`, which a `&DurableKey` turns into (it
/// derefs to `str`); [`DurableKey::parse`] checks a key the way the store does before using
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DurableKey(String);

impl DurableKey {
    /// The key of a node-store path: its leading '/' dropped, and a trailing one, which a
    /// directory may be named with (`/a/b` and `/a/b/` -> `a/b`, `/` -> the empty key of the
    /// store root). Nothing else is checked here: the store checks a key when it is used.
    pub fn from_store_path(path: &str) -> DurableKey {
        DurableKey(path.trim_matches('/').to_string())
    }

    /// Checks a relative path and normalises it to `a/b/c` (a leading '/' is dropped): no
    /// empty, `.` or `..` component, no control character.
    pub fn parse(path: &str) -> Result<DurableKey> {
        let bad = |reason: &str| Error::InvalidPath {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = path.trim_start_matches('/');
        let mut parts = Vec::new();
        for part in trimmed.split('/') {
            match part {
                "" => return Err(bad("empty path component")),
                "." | ".." => return Err(bad("'.' and '..' are not allowed")),
                p if p.chars().any(|c| c.is_control()) => {
                    return Err(bad("control characters are not allowed"))
                }
                p => parts.push(p),
            }
        }
        Ok(DurableKey(parts.join("/")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// The node-store path of this key (`a/b` -> `/a/b`).
    pub fn store_path(&self) -> String {
        format!("/{}", self.0)
    }
}

impl fmt::Display for DurableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DurableKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Deref for DurableKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<DurableKey> for String {
    fn from(key: DurableKey) -> String {
        key.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_paths_lose_their_leading_slash() {
        assert_eq!(
            DurableKey::from_store_path("/ckpt.1/a").as_str(),
            "ckpt.1/a"
        );
        assert_eq!(DurableKey::from_store_path("ckpt.1").as_str(), "ckpt.1");
        assert_eq!(DurableKey::from_store_path("//x").to_string(), "x");
        assert_eq!(DurableKey::from_store_path("/ckpt.1/").as_str(), "ckpt.1");
        assert_eq!(DurableKey::from_store_path("/").as_str(), "");
        assert_eq!(DurableKey::from_store_path("/a/b").store_path(), "/a/b");
    }

    #[test]
    fn parse_checks_like_the_store() {
        assert_eq!(DurableKey::parse("/a/b").unwrap().as_str(), "a/b");
        assert!(DurableKey::parse("a//b").is_err());
        assert!(DurableKey::parse("a/../b").is_err());
        assert!(DurableKey::parse("").is_err());
        assert!(DurableKey::parse("a\nb").is_err());
    }
}
