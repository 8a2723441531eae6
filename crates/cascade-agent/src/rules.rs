//! Checkpoints of programs that never call `cascade_commit` (docs/agent.md, "Checkpoint
//! rules"): the agent commits what `checkpoint.rules` names.
//!
//! - A file whose name matches a file rule (`restart.*`, `*.cpt`) is committed as a
//!   single-file checkpoint once it is closed, before its upload, so that retention and
//!   eviction treat it as a checkpoint: a long run writing more restart files than the store
//!   holds keeps the newest `checkpoint.keep` in memory and the rest only below.
//! - A directory whose name matches a directory rule (`ckpt_*/`) is committed once a newer
//!   sibling matching the same rule exists (newer: the later modification time of what lies
//!   in it) and everything below it is closed; the newest is committed at the end of the job.
//!
//! Nothing inside an already committed checkpoint is committed again, and a file inside a
//! directory that a directory rule matches belongs to that directory's checkpoint.

use cascade_store::{FileKind, LifeEntry, Store};

use crate::node::{files_of, reserved};
use crate::options::CheckpointRules;

/// A series of checkpoint directories: their parent directory and the rule they match.
type SeriesKey<'t> = (&'t str, usize);

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Commits what `rules` name in the snapshot `tree` (the whole store, root first); with
/// `at_end` (the end of the job) the newest directory of each series too. Returns the
/// checkpoints committed and the one-line failures (a file still open is not one: it is
/// committed on a later call).
pub fn commit_by_rules(
    store: &Store,
    rules: &CheckpointRules,
    tree: &[LifeEntry],
    at_end: bool,
) -> (Vec<String>, Vec<String>) {
    let mut committed = Vec::new();
    let mut failures = Vec::new();
    if rules.is_empty() {
        return (committed, failures);
    }
    // An implicit checkpoint (the end of an earlier job) does not hold back what the rules
    // name inside it: their commit supersedes it.
    let roots: Vec<&str> = tree
        .iter()
        .filter(|e| e.committed && !e.implicit)
        .map(|e| e.path.as_str())
        .collect();
    let inside_committed = |e: &LifeEntry| roots.iter().any(|r| e.is_at_or_below(r));
    let dir_rule = |name: &str| rules.dirs.iter().position(|p| p.matches(name));
    let mut commit = |path: &str| match store.commit(path, false) {
        Ok(_) => committed.push(path.to_string()),
        // Open for writing again, or torn: a later pass (or the application) decides.
        Err(e) if e.errno() == libc::EBUSY => {}
        Err(e) => failures.push(format!("checkpoint rule: cannot commit {path}: {e}")),
    };

    // Directories first: the files below a matching directory are its checkpoint's.
    let mut series: Vec<(SeriesKey, Vec<(&LifeEntry, i64)>)> = Vec::new();
    for d in tree
        .iter()
        .filter(|e| e.kind == FileKind::Dir && !inside_committed(e))
    {
        let Some(rule) = dir_rule(base(&d.path)) else {
            continue;
        };
        let below: Vec<&LifeEntry> = files_of(tree)
            .filter(|f| f.is_at_or_below(&d.path))
            .collect();
        let newest = below
            .iter()
            .filter_map(|f| store.stat(&f.path).ok().map(|m| m.mtime))
            .max()
            .unwrap_or(0);
        let key = (d.parent_dir(), rule);
        match series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push((d, newest)),
            None => series.push((key, vec![(d, newest)])),
        }
    }
    for (_, mut list) in series {
        list.sort_by_key(|(_, newest)| *newest);
        let keep_open = if at_end { 0 } else { 1 };
        let ready = list.len().saturating_sub(keep_open);
        for (d, _) in list.into_iter().take(ready) {
            let busy =
                files_of(tree).any(|f| f.is_at_or_below(&d.path) && (f.writers > 0 || f.torn));
            if !busy {
                commit(&d.path);
            }
        }
    }

    let in_rule_dir = |e: &LifeEntry| {
        let mut p = e.parent_dir();
        while p != "/" && !p.is_empty() {
            if dir_rule(base(p)).is_some() {
                return true;
            }
            p = p.rsplit_once('/').map_or(
                "/",
                |(parent, _)| if parent.is_empty() { "/" } else { parent },
            );
        }
        false
    };
    for f in files_of(tree) {
        let matches = rules.files.iter().any(|p| p.matches(base(&f.path)));
        if matches
            && f.writers == 0
            && !f.torn
            && !f.committed
            && !reserved(&f.path)
            && !inside_committed(f)
            && !in_rule_dir(f)
        {
            commit(&f.path);
        }
    }
    (committed, failures)
}
