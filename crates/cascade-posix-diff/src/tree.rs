//! Whole-tree snapshots (names, types, modes, sizes, contents) and their comparison, all
//! through libc (opendir/readdir, lstat, open/read).

use std::collections::BTreeMap;
use std::fmt;

use crate::exec::{FileKind, StatInfo};
use crate::sys::{self, errno_name};

/// One entry of a tree: its stat, and for a regular file its contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub stat: StatInfo,
    pub content: Option<Vec<u8>>,
}

/// Relative path ("" for the root) → entry.
pub type Tree = BTreeMap<String, Entry>;

/// Reads the tree under `root`. An error names the call and path that failed.
pub fn snapshot(root: &str) -> Result<Tree, String> {
    let mut tree = Tree::new();
    walk(root.trim_end_matches('/'), "", &mut tree)?;
    Ok(tree)
}

fn walk(root: &str, rel: &str, tree: &mut Tree) -> Result<(), String> {
    let path = sys::join(root, rel);
    let fail = |call: &str, e| format!("{call}({:?}): {}", path, errno_name(e));
    let stat = StatInfo::from_stat(&sys::lstat(&path).map_err(|e| fail("lstat", e))?);
    let content = if stat.kind == FileKind::File {
        Some(sys::read_file(&path).map_err(|e| fail("open/read", e))?)
    } else {
        None
    };
    let kind = stat.kind;
    tree.insert(rel.to_string(), Entry { stat, content });
    if kind == FileKind::Dir {
        for (name, _) in sys::list_dir(&path).map_err(|e| fail("opendir/readdir", e))? {
            if name == "." || name == ".." {
                continue;
            }
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            walk(root, &child, tree)?;
        }
    }
    Ok(())
}

/// The first difference between two trees.
#[derive(Debug)]
pub struct TreeDiff {
    pub path: String,
    pub a: String,
    pub b: String,
    pub detail: Option<String>,
}

impl TreeDiff {
    /// The path, or "(root)".
    pub fn path_shown(&self) -> &str {
        if self.path.is_empty() {
            "(root)"
        } else {
            &self.path
        }
    }
}

impl fmt::Display for TreeDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "path {}: A: {}; B: {}",
            self.path_shown(),
            self.a,
            self.b
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

fn describe(entry: Option<&Entry>) -> String {
    match entry {
        None => "missing".into(),
        Some(e) => e.stat.to_string(),
    }
}

/// Where two byte strings first differ, with a few bytes of each from there.
pub fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let hex = |s: &[u8]| {
        let end = (at + 8).min(s.len());
        let bytes: Vec<String> = s[at.min(s.len())..end]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect();
        if bytes.is_empty() {
            "(end)".to_string()
        } else {
            bytes.join(" ")
        }
    };
    format!(
        "lengths {} and {}, first difference at byte {at}: A {} / B {}",
        a.len(),
        b.len(),
        hex(a),
        hex(b)
    )
}

/// The first path (in sorted order) where the trees differ, if any.
pub fn compare(a: &Tree, b: &Tree) -> Option<TreeDiff> {
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        let (ea, eb) = (a.get(path), b.get(path));
        if ea == eb {
            continue;
        }
        let detail = match (ea, eb) {
            (Some(x), Some(y)) => match (&x.content, &y.content) {
                (Some(ca), Some(cb)) if ca != cb => {
                    Some(format!("contents differ: {}", first_difference(ca, cb)))
                }
                _ => None,
            },
            _ => None,
        };
        return Some(TreeDiff {
            path: path.clone(),
            a: describe(ea),
            b: describe(eb),
            detail,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> Entry {
        Entry {
            stat: StatInfo {
                kind: FileKind::File,
                perm: 0o644,
                size: Some(content.len() as i64),
                nlink: Some(1),
            },
            content: Some(content.to_vec()),
        }
    }

    #[test]
    fn equal_trees_have_no_difference() {
        let t: Tree = [("x".to_string(), file(b"abc"))].into_iter().collect();
        assert!(compare(&t, &t.clone()).is_none());
    }

    #[test]
    fn a_changed_byte_is_found_and_located() {
        let a: Tree = [("x".to_string(), file(b"abcdef"))].into_iter().collect();
        let b: Tree = [("x".to_string(), file(b"abcXef"))].into_iter().collect();
        let d = compare(&a, &b).expect("a difference");
        assert_eq!(d.path, "x");
        assert!(d.detail.unwrap().contains("at byte 3"));
    }

    #[test]
    fn a_missing_entry_is_found() {
        let a: Tree = [("x".to_string(), file(b""))].into_iter().collect();
        let d = compare(&a, &Tree::new()).expect("a difference");
        assert_eq!((d.path.as_str(), d.b.as_str()), ("x", "missing"));
    }
}
