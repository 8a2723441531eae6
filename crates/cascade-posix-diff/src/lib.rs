//! A differential POSIX test: one random sequence of file-system calls, made through raw
//! libc on two directory trees (side A, e.g. under Cascade's mount prefix, and side B on
//! tmpfs), comparing every return value, errno and byte read, and the whole trees every K
//! operations and at the end. The first difference stops the run with a report.
//!
//! What is compared: return values (byte counts, offsets; not fd numbers, which differ
//! between the sides), errno, bytes read, directory listings (sorted names with d_type, "."
//! and ".." included), and from stat the file type, permission bits, and for regular files
//! size and link count. Not compared: inode and device numbers, times, st_blocks, a
//! directory's size and link count, and the position of a directory fd (lseek on a directory
//! is only generated as `lseek(fd, 0, SEEK_SET)`), all of which are file-system specific.

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod exec;
pub mod libc_ops;
pub mod ops;
pub mod sys;
pub mod tree;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::Write;
use std::str::FromStr;

use exec::{FileKind, Outcome, Side, Value};
use ops::{FdRef, Generator, Op, SlotState, SLOTS};
use sys::errno_name;

/// Operations shown before the failing one in a report.
pub const HISTORY: usize = 20;

/// A deliberate fault on side A, to show that the harness catches differences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// After op N, flip one byte of a file on side A behind the harness's back (caught by a
    /// later read or tree comparison).
    FlipByte(u64),
    /// The first write, pwrite or writev from op N on that writes something on side A
    /// writes one byte less (caught at that op).
    ShortWrite(u64),
}

impl FromStr for Sabotage {
    type Err = String;

    fn from_str(s: &str) -> Result<Sabotage, String> {
        let (kind, at) = s
            .split_once('@')
            .ok_or_else(|| format!("expected KIND@OP, got {s:?}"))?;
        let at: u64 = at.parse().map_err(|_| format!("bad op number in {s:?}"))?;
        match kind {
            "flip-byte" => Ok(Sabotage::FlipByte(at)),
            "short-write" => Ok(Sabotage::ShortWrite(at)),
            _ => Err(format!(
                "unknown sabotage {kind:?} (flip-byte or short-write)"
            )),
        }
    }
}

/// Which calls a run makes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Level {
    /// Raw system-call wrappers (open, read, rename, ...): [`ops`].
    #[default]
    Posix,
    /// glibc functions that reach files through its internal aliases (mkstemp, glob, nftw,
    /// fts, posix_spawn, ...): [`libc_ops`].
    Libc,
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Level, String> {
        match s {
            "posix" => Ok(Level::Posix),
            "libc" => Ok(Level::Libc),
            _ => Err(format!("unknown level {s:?} (posix or libc)")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub level: Level,
    pub seed: u64,
    pub ops: u64,
    pub a: String,
    pub b: String,
    /// Compare the whole trees every this many ops (0: only at the start and the end).
    pub check_every: u64,
    /// Unusual path spellings (trailing slash, x/../y, ./, //, long names).
    pub quirks: bool,
    pub sabotage: Option<Sabotage>,
    /// Libc level: calls (by their names in the summary) left out, to look past a known
    /// difference.
    pub skip: Vec<String>,
}

/// What a successful run did.
#[derive(Debug, Default)]
pub struct Summary {
    pub seed: u64,
    pub ops: u64,
    pub tree_checks: u64,
    pub op_counts: BTreeMap<&'static str, u64>,
    pub errno_counts: BTreeMap<String, u64>,
    /// Documented differences between the sides that were accepted (libc level).
    pub intended: BTreeMap<&'static str, u64>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |m: Vec<String>| m.join(",");
        write!(
            f,
            "cascade-posix-diff: ok seed={} ops={} tree_checks={} calls={{{}}} errno={{{}}}",
            self.seed,
            self.ops,
            self.tree_checks,
            join(
                self.op_counts
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect()
            ),
            join(
                self.errno_counts
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect()
            ),
        )?;
        if !self.intended.is_empty() {
            let shown: Vec<String> = self
                .intended
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            write!(f, " intended={{{}}}", join(shown))?;
        }
        Ok(())
    }
}

/// The first difference found.
#[derive(Debug)]
pub struct Mismatch {
    pub seed: u64,
    /// 1-based number of the op after which it was found (0: before the first op).
    pub op_number: u64,
    /// The op, or "tree comparison".
    pub what: String,
    pub a: String,
    pub b: String,
    pub detail: Option<String>,
    pub a_root: String,
    pub b_root: String,
    /// Each open slot: its fd on A and B, and the op that made it.
    pub slots: Vec<String>,
    /// The ops before, oldest first, with their (agreed) results.
    pub history: Vec<String>,
    /// Arguments that replay this run.
    pub replay: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = if self.op_number == 0 {
            "before the first op".to_string()
        } else {
            format!("at op #{}", self.op_number)
        };
        writeln!(f, "cascade-posix-diff: MISMATCH seed={} {when}", self.seed)?;
        writeln!(f, "  op: {}", self.what)?;
        writeln!(f, "  A ({}): {}", self.a_root, self.a)?;
        writeln!(f, "  B ({}): {}", self.b_root, self.b)?;
        if let Some(d) = &self.detail {
            writeln!(f, "  {d}")?;
        }
        if self.slots.is_empty() {
            writeln!(f, "  open slots: none")?;
        } else {
            writeln!(f, "  open slots:")?;
            for s in &self.slots {
                writeln!(f, "    {s}")?;
            }
        }
        writeln!(
            f,
            "  last {} ops before it (results agreed on both sides):",
            self.history.len()
        )?;
        for h in &self.history {
            writeln!(f, "    {h}")?;
        }
        write!(f, "  replay: cascade-posix-diff {}", self.replay)
    }
}

#[derive(Debug)]
pub enum RunError {
    /// The sides differ.
    Mismatch(Box<Mismatch>),
    /// The run could not start (a root cannot be created, ...).
    Setup(String),
}

struct Runner<'a> {
    cfg: &'a Config,
    a: Side,
    b: Side,
    slots: [SlotState; SLOTS],
    /// The op that made each open slot ("#12 slot3 = open(...)").
    origins: [Option<String>; SLOTS],
    history: VecDeque<String>,
    summary: Summary,
    sabotage_pending: Option<Sabotage>,
}

fn make_root(root: &str) -> Result<(), RunError> {
    let path = sys::join(root.trim_end_matches('/'), "");
    match sys::mkdir(&path, 0o755) {
        Ok(_) | Err(libc::EEXIST) => {}
        Err(e) => {
            return Err(RunError::Setup(format!(
                "cannot create {root}: {}",
                errno_name(e)
            )))
        }
    }
    match sys::stat(&path) {
        Ok(st) if FileKind::from_mode(st.st_mode) == FileKind::Dir => Ok(()),
        Ok(_) => Err(RunError::Setup(format!("{root} is not a directory"))),
        Err(e) => Err(RunError::Setup(format!(
            "cannot stat {root}: {}",
            errno_name(e)
        ))),
    }
}

/// Runs the sequence. `trace`, if given, receives every op and its result as it happens.
pub fn run(cfg: &Config, mut trace: Option<&mut dyn Write>) -> Result<Summary, RunError> {
    if cfg.level == Level::Libc {
        return libc_ops::run(cfg, trace);
    }
    if !cfg.skip.is_empty() {
        return Err(RunError::Setup("--skip is for the libc level".into()));
    }
    make_root(&cfg.a)?;
    make_root(&cfg.b)?;
    let mut runner = Runner {
        cfg,
        a: Side::new(&cfg.a),
        b: Side::new(&cfg.b),
        slots: [SlotState::default(); SLOTS],
        origins: Default::default(),
        history: VecDeque::new(),
        summary: Summary {
            seed: cfg.seed,
            ..Summary::default()
        },
        sabotage_pending: cfg.sabotage,
    };
    let mut generator = Generator::new(cfg.seed, cfg.quirks);
    runner.compare_trees(0)?;
    for n in 1..=cfg.ops {
        let op = generator.next(&runner.slots);
        runner.step(n, &op, &mut trace)?;
        if cfg.check_every > 0 && n % cfg.check_every == 0 {
            runner.compare_trees(n)?;
        }
    }
    // Close what is still open, as ops of their own, compared like the others.
    let mut n = cfg.ops;
    for s in 0..SLOTS {
        if runner.slots[s].open {
            n += 1;
            let op = Op::Close { fd: FdRef::Slot(s) };
            runner.step(n, &op, &mut trace)?;
        }
    }
    runner.compare_trees(n)?;
    runner.summary.ops = n;
    Ok(runner.summary)
}

impl Runner<'_> {
    fn step(
        &mut self,
        n: u64,
        op: &Op,
        trace: &mut Option<&mut dyn Write>,
    ) -> Result<(), RunError> {
        let short_write = matches!(self.sabotage_pending, Some(Sabotage::ShortWrite(at)) if n >= at)
            && matches!(op, Op::Write { .. } | Op::Pwrite { .. } | Op::Writev { .. });
        let ra = self.a.exec(op, short_write);
        let rb = self.b.exec(op, false);
        if short_write && op.write_len() > 0 && matches!(ra, Outcome::Ok(Value::Count(_))) {
            self.sabotage_pending = None; // done: side A wrote one byte less than asked
        }
        *self.summary.op_counts.entry(op.name()).or_default() += 1;
        if let Some(e) = rb.errno() {
            *self.summary.errno_counts.entry(errno_name(e)).or_default() += 1;
        }
        if let Some(t) = trace {
            // Tracing is a debugging aid: a failed write to it does not stop the run.
            let _ = writeln!(t, "#{n} {op} -> {rb}");
        }
        if ra != rb {
            let detail = match (&ra, &rb) {
                (Outcome::Ok(Value::Bytes(x)), Outcome::Ok(Value::Bytes(y))) => Some(format!(
                    "bytes read differ: {}",
                    tree::first_difference(x, y)
                )),
                _ => None,
            };
            return Err(self.mismatch(n, op.to_string(), ra.to_string(), rb.to_string(), detail));
        }
        self.update_slots(n, op, &rb);
        self.history.push_back(format!("#{n} {op} -> {rb}"));
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        if let Some(Sabotage::FlipByte(at)) = self.sabotage_pending {
            if n >= at && flip_a_byte(&self.a.root) {
                self.sabotage_pending = None;
            }
        }
        Ok(())
    }

    /// Keeps the generator's view of the slots, and where each came from, in step with
    /// what op `n` did.
    fn update_slots(&mut self, n: u64, op: &Op, result: &Outcome) {
        if result.errno().is_some() {
            // A failed open/dup leaves the slot as it was; a failed close of a slot still
            // released the fd (Linux), so only close goes on.
            if let Op::Close { fd: FdRef::Slot(s) } = op {
                self.slots[*s] = SlotState::default();
                self.origins[*s] = None;
            }
            return;
        }
        match op {
            Op::Open { slot, flags, .. } | Op::OpenAt { slot, flags, .. } => {
                self.slots[*slot] = SlotState::opened(*flags, self.is_dir(*slot));
                self.origins[*slot] = Some(format!("#{n} {op}"));
            }
            Op::Dup {
                fd: FdRef::Slot(from),
                slot: to,
            }
            | Op::Dup2 {
                fd: FdRef::Slot(from),
                target: to,
            } if from != to => {
                self.slots[*to] = self.slots[*from];
                let source = self.origins[*from].as_deref().unwrap_or("?");
                self.origins[*to] = Some(format!("#{n} {op}, slot{from} from {source}"));
            }
            Op::Close { fd: FdRef::Slot(s) } => {
                self.slots[*s] = SlotState::default();
                self.origins[*s] = None;
            }
            _ => {}
        }
    }

    /// Whether a slot refers to a directory, from side B's fstat (outside the compared ops).
    fn is_dir(&self, slot: usize) -> bool {
        self.b
            .slot_fd(slot)
            .and_then(|fd| sys::fstat(fd).ok())
            .is_some_and(|st| FileKind::from_mode(st.st_mode) == FileKind::Dir)
    }

    fn compare_trees(&mut self, n: u64) -> Result<(), RunError> {
        self.summary.tree_checks += 1;
        match tree_difference(&self.a.root, &self.b.root) {
            None => Ok(()),
            Some((a, b, detail)) => Err(self.mismatch(n, TREE_COMPARISON.into(), a, b, detail)),
        }
    }

    fn slot_report(&self) -> Vec<String> {
        (0..SLOTS)
            .filter_map(|s| {
                let (fa, fb) = (self.a.slot_fd(s), self.b.slot_fd(s));
                if fa.is_none() && fb.is_none() {
                    return None;
                }
                let fd = |f: Option<libc::c_int>| f.map_or("closed".into(), |f| format!("fd {f}"));
                Some(format!(
                    "slot{s}: A {}, B {}, from {}",
                    fd(fa),
                    fd(fb),
                    self.origins[s].as_deref().unwrap_or("?")
                ))
            })
            .collect()
    }

    fn mismatch(
        &self,
        n: u64,
        what: String,
        a: String,
        b: String,
        detail: Option<String>,
    ) -> RunError {
        let history: Vec<String> = self.history.iter().cloned().collect();
        let mut m = mismatch_report(self.cfg, n, what, a, b, detail, history);
        m.slots = self.slot_report();
        RunError::Mismatch(Box::new(m))
    }
}

const TREE_COMPARISON: &str = "tree comparison (names, types, modes, sizes, contents)";

/// The first difference between the trees under two roots: (A, B, detail).
fn tree_difference(a_root: &str, b_root: &str) -> Option<(String, String, Option<String>)> {
    let ta = tree::snapshot(a_root);
    let tb = tree::snapshot(b_root);
    match (&ta, &tb) {
        (Ok(ta), Ok(tb)) => tree::compare(ta, tb).map(|d| {
            (
                format!("{}: {}", d.path_shown(), d.a),
                format!("{}: {}", d.path_shown(), d.b),
                d.detail,
            )
        }),
        _ => Some((
            ta.map_or_else(
                |e| format!("walk failed: {e}"),
                |t| format!("{} entries", t.len()),
            ),
            tb.map_or_else(
                |e| format!("walk failed: {e}"),
                |t| format!("{} entries", t.len()),
            ),
            None,
        )),
    }
}

/// Compares the whole trees of a run (libc level; the POSIX runner adds its slots).
fn compare_trees(
    cfg: &Config,
    summary: &mut Summary,
    n: u64,
    history: &VecDeque<String>,
) -> Result<(), RunError> {
    summary.tree_checks += 1;
    match tree_difference(&cfg.a, &cfg.b) {
        None => Ok(()),
        Some((a, b, detail)) => Err(mismatch(
            cfg,
            n,
            TREE_COMPARISON.into(),
            a,
            b,
            detail,
            history,
        )),
    }
}

/// A mismatch report with no open slots (libc level).
fn mismatch(
    cfg: &Config,
    n: u64,
    what: String,
    a: String,
    b: String,
    detail: Option<String>,
    history: &VecDeque<String>,
) -> RunError {
    let history = history.iter().cloned().collect();
    RunError::Mismatch(Box::new(mismatch_report(
        cfg, n, what, a, b, detail, history,
    )))
}

fn mismatch_report(
    cfg: &Config,
    n: u64,
    what: String,
    a: String,
    b: String,
    detail: Option<String>,
    history: Vec<String>,
) -> Mismatch {
    let mut replay = format!(
        "--seed {} --ops {} --a {} --b {} --check-every {}",
        cfg.seed, cfg.ops, cfg.a, cfg.b, cfg.check_every
    );
    if cfg.level == Level::Libc {
        replay.push_str(" --level libc");
    }
    if !cfg.skip.is_empty() {
        replay.push_str(&format!(" --skip {}", cfg.skip.join(",")));
    }
    if !cfg.quirks {
        replay.push_str(" --no-quirks");
    }
    if let Some(s) = cfg.sabotage {
        replay.push_str(&match s {
            Sabotage::FlipByte(at) => format!(" --sabotage flip-byte@{at}"),
            Sabotage::ShortWrite(at) => format!(" --sabotage short-write@{at}"),
        });
    }
    replay.push_str(" --trace   (on fresh, empty directories)");
    Mismatch {
        seed: cfg.seed,
        op_number: n,
        what,
        a,
        b,
        detail,
        a_root: cfg.a.trim_end_matches('/').to_string(),
        b_root: cfg.b.trim_end_matches('/').to_string(),
        slots: Vec::new(),
        history,
        replay,
    }
}

/// The deliberate fault: inverts the middle byte of the first non-empty file (in sorted
/// order) under `root`. False when there is no such file yet.
fn flip_a_byte(root: &str) -> bool {
    let Ok(snapshot) = tree::snapshot(root) else {
        return false;
    };
    let Some((rel, entry)) = snapshot
        .iter()
        .find(|(_, e)| e.content.as_ref().is_some_and(|c| !c.is_empty()))
    else {
        return false;
    };
    let content = entry.content.as_ref().expect("found a file with content");
    let at = content.len() / 2;
    let path = sys::join(root.trim_end_matches('/'), rel);
    let Ok(fd) = sys::open(&path, libc::O_WRONLY | libc::O_CLOEXEC, 0) else {
        return false;
    };
    let flipped = sys::pwrite(fd, &[!content[at]], at as i64) == Ok(1);
    let _ = sys::close(fd);
    flipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sabotage_parses() {
        assert_eq!("flip-byte@12".parse(), Ok(Sabotage::FlipByte(12)));
        assert_eq!("short-write@3".parse(), Ok(Sabotage::ShortWrite(3)));
        assert!("nothing@3".parse::<Sabotage>().is_err());
        assert!("flip-byte".parse::<Sabotage>().is_err());
    }
}
