//! Checkpoints of programs that never call `cascade_commit` (docs/agent.md, "Checkpoint
//! rules"): the agent commits what `checkpoint.rules` names.
//!
//! - A file whose name matches a file rule (`restart.*`, `*.cpt`) is committed as a
//!   single-file checkpoint once it is closed, before its upload, so that retention and
//!   eviction treat it as a checkpoint: a long run writing more restart files than the store
//!   holds keeps the newest `checkpoint.keep` in memory and the rest only below. A file
//!   already safe below (fetched by read-through, or remote) was not written by this job and
//!   is left alone.
//! - A directory whose name matches a directory rule (`ckpt_*/`) is committed once a newer
//!   sibling matching the same rule exists (newer: the later modification time of what lies
//!   in it) and everything below it is closed; the newest is committed at the end of the job,
//!   or once nothing below it was modified for the quiet time (`checkpoint.quiet`), whichever
//!   comes first.
//!
//! Nothing inside an already committed checkpoint is committed again, and a file inside a
//! directory that a directory rule matches belongs to that directory's checkpoint.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cascade_store::{FileKind, LifeEntry, Store};

use crate::node::{files_of, reserved};
use crate::options::CheckpointRules;

/// A series of checkpoint directories: their parent directory and the rule they match.
type SeriesKey<'t> = (&'t str, usize);
/// The series of checkpoint directories, each with its directories (None: an empty one) and
/// their latest changes.
type Series<'t> = Vec<(SeriesKey<'t>, Vec<(Option<&'t LifeEntry>, i64)>)>;

fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What [`commit_by_rules`] did.
#[derive(Debug, Default)]
pub struct RulesOutcome {
    /// The checkpoints committed.
    pub committed: Vec<String>,
    /// One-line failures (a file still open is not one: it is committed on a later call).
    pub failures: Vec<String>,
    /// When the quiet time of the newest directory of a series runs out (nothing else may
    /// wake the agent then): look again at that time.
    pub look_again: Option<Instant>,
}

/// Nanoseconds since the epoch, the store's clock for modification times.
fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Commits what `rules` name in the snapshot `tree` (the whole store, root first); with
/// `at_end` (the end of the job) the newest directory of each series too, else that one once
/// its quiet time (`rules.quiet`) has passed.
pub fn commit_by_rules(
    store: &Store,
    rules: &CheckpointRules,
    tree: &[LifeEntry],
    at_end: bool,
) -> RulesOutcome {
    let mut committed = Vec::new();
    let mut failures = Vec::new();
    let mut look_again: Option<Instant> = None;
    if rules.is_empty() {
        return RulesOutcome::default();
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
    // Each with its latest change: the newest modification time of it and what lies below.
    let mut series: Series = Vec::new();
    for d in tree
        .iter()
        .filter(|e| e.kind == FileKind::Dir && !inside_committed(e))
    {
        let Some(rule) = dir_rule(base(&d.path)) else {
            continue;
        };
        let below: Vec<&LifeEntry> = tree.iter().filter(|e| e.is_at_or_below(&d.path)).collect();
        if !below.iter().any(|e| e.kind == FileKind::File) {
            // Empty (just created): not a checkpoint yet, but newer than its siblings.
            let key = (d.parent_dir(), rule);
            let mtime = store.stat(&d.path).map_or(0, |m| m.mtime);
            series_push(&mut series, key, None, mtime);
            continue;
        }
        let newest = below
            .iter()
            .filter_map(|e| store.stat(&e.path).ok().map(|m| m.mtime))
            .max()
            .unwrap_or(0);
        series_push(&mut series, (d.parent_dir(), rule), Some(d), newest);
    }
    let now = now_ns();
    for (_, mut list) in series {
        list.sort_by_key(|(_, newest)| *newest);
        let Some((last, last_change)) = list.pop() else {
            continue;
        };
        let mut due: Vec<&LifeEntry> = list.into_iter().filter_map(|(d, _)| d).collect();
        if let Some(last) = last {
            let quiet_for = Duration::from_nanos(now.saturating_sub(last_change).max(0) as u64);
            match rules.quiet {
                _ if at_end => due.push(last),
                Some(quiet) if quiet_for >= quiet => due.push(last),
                Some(quiet) => {
                    let at = Instant::now() + (quiet - quiet_for);
                    look_again = Some(look_again.map_or(at, |t| t.min(at)));
                }
                None => {}
            }
        }
        for d in due {
            let files: Vec<&LifeEntry> = files_of(tree)
                .filter(|f| f.is_at_or_below(&d.path))
                .collect();
            let busy = files.iter().any(|f| f.writers > 0 || f.torn);
            // Only listed from below (a restarted job's view of older checkpoints): it is
            // there already and is not this job's to commit.
            let only_below = files.iter().all(|f| f.remote);
            if !busy && !only_below {
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
            && !f.safe()
            && !f.committed
            && !reserved(&f.path)
            && !inside_committed(f)
            && !in_rule_dir(f)
        {
            commit(&f.path);
        }
    }
    RulesOutcome {
        committed,
        failures,
        look_again,
    }
}

/// Adds a directory (None: an empty one, which only counts as newer) to its series.
fn series_push<'t>(
    series: &mut Series<'t>,
    key: SeriesKey<'t>,
    dir: Option<&'t LifeEntry>,
    newest: i64,
) {
    match series.iter_mut().find(|(k, _)| *k == key) {
        Some((_, list)) => list.push((dir, newest)),
        None => series.push((key, vec![(dir, newest)])),
    }
}
