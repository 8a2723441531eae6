//! Checkpoint lifecycle state kept in the block, shared by the application (through the
//! interposition library), the CLI and the node agent (docs/store-layout.md, "Lifecycle").
//!
//! Per inode: `writers` (open write descriptions and writable handles), `mod_seq` (the version
//! of the contents: bumped by every write-open, truncate and rename, and for a
//! directory by every change below it), `durable_seq` (the version the durable tier holds)
//! and `life` flags (torn, committed, flush, complete). A file is durable when
//! `durable_seq == mod_seq` and nobody writes it; a checkpoint root is complete when, in
//! addition, its completion marker was written for that version (LIFE_COMPLETE).
//!
//! Wake-ups use futexes on two header words, so an idle agent and a writer waiting for space
//! sleep in the kernel rather than poll.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use crate::block::{my_pid, process_alive, process_start_time, Block};
use crate::error::{Error, Result};
use crate::layout::{
    is_dir_state, link_parent, INODE_DIR, LIFE_COMMITTED, LIFE_COMPLETE, LIFE_FLUSH, LIFE_IMPLICIT,
    LIFE_PUSHED, LIFE_REMOTE, LIFE_STAGED, LIFE_TORN, NIL, ROOT_INO,
};
use crate::store::Store;
use crate::types::FileKind;

/// The top bit of a wake word (`agent_wake`, `space_wake`, `progress_wake`): someone may be
/// asleep on it. A sleeper sets it before it sleeps; a waker clears it as it bumps the
/// count, and makes the FUTEX_WAKE system call only if it was set. So the close of a written
/// file, which wakes the agent, costs no system call while the agent is busy or absent
/// (a third of a microsecond here, a tenth of a create, 4 KiB write and close).
const SLEEPERS: u32 = 1 << 31;

/// The count of a wake word, without [`SLEEPERS`].
fn wake_count(word: &AtomicU32) -> u32 {
    word.load(Acquire) & !SLEEPERS
}

/// Sleeps until the count of `word` is no longer `seen` (or `timeout` passes, or a spurious
/// wake). A waker's bump and this sleeper's mark are read-modify-writes of the one word, so
/// either the mark sees the bump (no sleep) or the bump sees the mark (a wake), and the
/// kernel compares the word again before sleeping.
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let marked = word.fetch_or(SLEEPERS, AcqRel) | SLEEPERS;
    if marked & !SLEEPERS != seen & !SLEEPERS {
        return;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 in a MAP_SHARED mapping (a shared futex); the
    // kernel only reads it and the timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            marked,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Bumps the count of `word` and wakes every process sleeping on it, if any may be.
fn futex_wake_all(word: &AtomicU32) {
    let bump = |v: u32| Some(v.wrapping_add(1) & !SLEEPERS);
    let before = match word.fetch_update(AcqRel, Relaxed, bump) {
        Ok(v) | Err(v) => v,
    };
    if before & SLEEPERS == 0 {
        return;
    }
    // SAFETY: as in futex_wait; FUTEX_WAKE touches no memory besides the futex word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Lifecycle state of one inode, as the agent and `cascade ls --levels` see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifeEntry {
    pub ino: u64,
    pub generation: u32,
    /// Absolute store path.
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub writers: u32,
    pub torn: bool,
    pub committed: bool,
    pub flush: bool,
    pub complete_flag: bool,
    /// `durable_seq` is only on a staging server (LIFE_STAGED).
    pub staged_flag: bool,
    /// A staging server accepted this checkpoint's file list (LIFE_PUSHED).
    pub pushed_flag: bool,
    pub mod_seq: u64,
    pub durable_seq: u64,
    pub commit_seq: u64,
    pub chunks_mem: u64,
    pub chunks_spill: u64,
    /// Open descriptions (readers and writers).
    pub opens: u32,
    /// The content is only in a level below (LIFE_REMOTE): listed from there, or evicted.
    pub remote: bool,
    /// A checkpoint the end of a job committed (LIFE_IMPLICIT): a commit inside supersedes it.
    pub implicit: bool,
}

impl LifeEntry {
    /// The durable tier holds this version of the file (or, for a directory, its completion
    /// was recorded for this version).
    pub fn durable(&self) -> bool {
        self.safe() && !self.staged_flag
    }
    /// A level below this node holds this version: a staging server or the durable tier.
    pub fn safe(&self) -> bool {
        self.writers == 0 && self.mod_seq == self.durable_seq
    }
    /// Only a staging server holds this version (not yet the durable tier).
    pub fn staged(&self) -> bool {
        self.safe() && self.staged_flag
    }
    /// A committed checkpoint that survives the loss of this node: complete, or its file
    /// list accepted by a staging server that will complete it.
    pub fn checkpoint_safe(&self) -> bool {
        self.committed && self.safe() && (self.complete_flag || self.pushed_flag)
    }
    /// A committed checkpoint whose marker matches its current contents.
    pub fn complete(&self) -> bool {
        self.committed && self.complete_flag && self.durable()
    }

    /// The entry is `root` (an absolute store path) or lies below it.
    pub fn is_at_or_below(&self, root: &str) -> bool {
        self.path == root
            || self
                .path
                .strip_prefix(root)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The directory holding the entry ("/" for a top-level entry): its checkpoint series.
    pub fn parent_dir(&self) -> &str {
        match self.path.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &self.path[..i],
        }
    }
}

/// The agent's registration; unregisters on drop.
pub struct AgentRegistration {
    store: Store,
}

impl Drop for AgentRegistration {
    fn drop(&mut self) {
        let h = self.store.block().header();
        if h.agent_pid.load(Acquire) == my_pid() {
            h.agent_pid.store(0, Release);
        }
    }
}

impl Block {
    /// The file is opened for writing: new contents version, and every checkpoint containing
    /// it is no longer complete (namespace lock held, so parent links are stable).
    pub(crate) fn begin_modify(&self, ino: u32) {
        self.inode(ino).mod_seq.fetch_add(1, AcqRel);
        self.invalidate_ancestors(ino);
    }

    /// Bumps the version of directory `dir` and of every directory above it.
    pub(crate) fn invalidate_dir(&self, dir: u32) {
        if dir < self.geo.max_inodes && dir != ROOT_INO {
            self.inode(dir).mod_seq.fetch_add(1, AcqRel);
            self.invalidate_ancestors(dir);
        }
    }

    /// Bumps the version of every directory above `ino` but the root. The root is never a
    /// checkpoint (commit refuses it), so nothing reads its version; bumping it would make
    /// every create and removal anywhere in the store write one shared cache line.
    pub(crate) fn invalidate_ancestors(&self, ino: u32) {
        let mut cur = ino;
        for _ in 0..crate::layout::PATH_MAX {
            if cur == ROOT_INO || cur >= self.geo.max_inodes {
                return;
            }
            cur = link_parent(self.inode(cur).link.load(Acquire));
            // A damaged link stops the walk; fsck --repair rebuilds the namespace.
            if cur == ROOT_INO || cur >= self.geo.max_inodes {
                return;
            }
            self.inode(cur).mod_seq.fetch_add(1, AcqRel);
        }
    }

    /// Bumps the version of `ino` and everything below it (a rename: the durable copy is at
    /// the old path), and of the directories above it (namespace lock held).
    pub(crate) fn invalidate_subtree(&self, ino: u32) {
        let mut stack = vec![ino];
        // A damaged (looping) entry list must not make this run forever: no tree holds more
        // inodes than the table.
        let mut budget = self.geo.max_inodes;
        while let Some(i) = stack.pop() {
            budget = match budget.checked_sub(1) {
                Some(b) => b,
                None => break,
            };
            let inode = self.inode(i);
            inode.mod_seq.fetch_add(1, AcqRel);
            if inode.state.load(Acquire) == INODE_DIR {
                let mut c = inode.first_child.load(Relaxed);
                while c != NIL && c < self.geo.max_inodes {
                    stack.push(c);
                    c = self.inode(c).next_sibling.load(Relaxed);
                }
            }
        }
        self.invalidate_ancestors(ino);
    }

    /// One more writer of (ino, gen).
    pub(crate) fn add_writer(&self, ino: u32) {
        self.inode(ino).writers.fetch_add(1, AcqRel);
    }

    /// A writer of (ino, gen) is gone; `torn` when its process died with it open. The agent
    /// is woken when the last writer closes.
    pub(crate) fn remove_writer(&self, ino: u32, gen: u32, torn: bool) {
        if ino >= self.geo.max_inodes {
            return;
        }
        let inode = self.inode(ino);
        if inode.gen.load(Acquire) != gen {
            return;
        }
        if torn {
            inode.life.fetch_or(LIFE_TORN, AcqRel);
        }
        // A writer's close is an update point for the times its writes marked.
        self.file_times(ino);
        let before = inode
            .writers
            .fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(1)))
            .unwrap_or(0);
        if before <= 1 {
            self.wake_agent();
        }
    }

    pub(crate) fn wake_agent(&self) {
        futex_wake_all(&self.header().agent_wake);
    }

    /// A writer found the store full: if a live agent may free space and the policy allows,
    /// waits for it (until `deadline`, set on the first call) and returns true to retry.
    pub(crate) fn wait_for_space(&self, deadline: &mut Option<Instant>, seen: u32) -> bool {
        let h = self.header();
        let wait_ms = h.full_wait_ms.load(Relaxed);
        if wait_ms == 0 || self.agent_pid().is_none() {
            return false;
        }
        let now = Instant::now();
        let end = *deadline.get_or_insert_with(|| {
            eprintln!(
                "cascade: store {} is full: {}; waiting up to {:.1} s for the agent to free space",
                self.name,
                self.what_fills(),
                wait_ms as f64 / 1000.0
            );
            now + Duration::from_millis(wait_ms as u64)
        });
        if now >= end {
            return false;
        }
        h.space_waiters.fetch_add(1, AcqRel);
        self.wake_agent();
        futex_wait(
            &h.space_wake,
            seen,
            (end - now).min(Duration::from_millis(250)),
        );
        h.space_waiters.fetch_sub(1, AcqRel);
        true
    }

    /// What holds the store's memory, for the message of a writer that found it full: the
    /// files being written, those closed but not yet in a lower level, those safe below but
    /// in no committed checkpoint (never evicted: a program that does not commit needs
    /// `checkpoint.rules`), and those in checkpoints (evicted once retention allows).
    fn what_fills(&self) -> String {
        let Ok(_g) = self.lock_ns() else {
            return "(cannot read the namespace)".to_string();
        };
        let mut tree = Vec::new();
        if let Err(e) = self.subtree(ROOT_INO, "/", &mut tree) {
            return format!("(cannot read the namespace: {e})");
        }
        let roots: Vec<String> = tree
            .iter()
            .filter(|e| e.committed)
            .map(|e| e.path.clone())
            .collect();
        let cs = self.geo.chunk_size;
        // (files, bytes) per kind.
        let mut kinds = [(0u64, 0u64); 4];
        for e in tree.iter().filter(|e| e.kind == FileKind::File) {
            let kind = if e.writers > 0 {
                0
            } else if !e.safe() {
                1
            } else if roots.iter().any(|r| e.is_at_or_below(r)) {
                3
            } else {
                2
            };
            kinds[kind].0 += 1;
            kinds[kind].1 += e.chunks_mem * cs;
        }
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let names = [
            "being written",
            "closed, not yet in a lower level",
            "safe below but in no checkpoint (commit it, or set checkpoint.rules)",
            "in checkpoints (evicted once durable and past checkpoint.keep)",
        ];
        let parts: Vec<String> = kinds
            .iter()
            .zip(names)
            .filter(|((files, _), _)| *files > 0)
            .map(|((files, bytes), name)| format!("{:.1} MiB {name} ({files} files)", mib(*bytes)))
            .collect();
        if parts.is_empty() {
            "no file holds memory".to_string()
        } else {
            parts.join(", ")
        }
    }

    /// The committed checkpoint `ino` lies inside, if any (namespace lock held).
    fn committed_ancestor(&self, ino: u32) -> Result<Option<u32>> {
        self.find_ancestor(ino, |dir| {
            (dir != ROOT_INO && self.inode(dir).life.load(Acquire) & LIFE_COMMITTED != 0)
                .then_some(dir)
        })
    }

    /// The registered agent's pid, if it is alive.
    pub(crate) fn agent_pid(&self) -> Option<u32> {
        let h = self.header();
        let pid = h.agent_pid.load(Acquire);
        (pid != 0 && process_alive(pid, h.agent_start_time.load(Acquire))).then_some(pid)
    }

    fn life_entry(&self, ino: u32, path: String) -> LifeEntry {
        let i = self.inode(ino);
        let life = i.life.load(Acquire);
        let state = i.state.load(Acquire);
        LifeEntry {
            ino: ino as u64,
            generation: i.gen.load(Acquire),
            path,
            kind: if is_dir_state(state) {
                FileKind::Dir
            } else {
                FileKind::File
            },
            size: i.size.load(Acquire),
            writers: i.writers.load(Acquire),
            torn: life & LIFE_TORN != 0,
            committed: life & LIFE_COMMITTED != 0,
            flush: life & LIFE_FLUSH != 0,
            complete_flag: life & LIFE_COMPLETE != 0,
            staged_flag: life & LIFE_STAGED != 0,
            pushed_flag: life & LIFE_PUSHED != 0,
            mod_seq: i.mod_seq.load(Acquire),
            durable_seq: i.durable_seq.load(Acquire),
            commit_seq: i.commit_seq.load(Acquire),
            chunks_mem: i.chunks_mem.load(Acquire) as u64,
            chunks_spill: i.chunks_spill.load(Acquire) as u64,
            opens: i.opens.load(Acquire),
            remote: life & LIFE_REMOTE != 0,
            implicit: life & LIFE_IMPLICIT != 0,
        }
    }

    /// `ino` and everything below it, depth first, parents before children (namespace lock
    /// held). Paths are built from `path`.
    fn subtree(&self, ino: u32, path: &str, out: &mut Vec<LifeEntry>) -> Result<()> {
        out.push(self.life_entry(ino, path.to_string()));
        if self.inode(ino).state.load(Acquire) != INODE_DIR {
            return Ok(());
        }
        for entry in self.list_dir_checked(ino)? {
            let child_path = if path == "/" {
                format!("/{}", entry.name)
            } else {
                format!("{path}/{}", entry.name)
            };
            if let Some(child) = self.lookup(ino, &entry.name)? {
                self.subtree(child, &child_path, out)?;
            }
        }
        Ok(())
    }
}

/// Bytes a path limit keeps for the names Cascade derives from a path.
pub const PATH_SUFFIX_ROOM: usize = 32;

impl Store {
    /// Lifecycle state of `path` and everything below it (parents first, children in name
    /// order). One snapshot under the namespace lock.
    pub fn life_tree(&self, path: &str) -> Result<Vec<LifeEntry>> {
        let b = self.block();
        let _g = b.lock_ns()?;
        let ino = b.resolve(path)?;
        let canonical = if ino == ROOT_INO {
            "/".to_string()
        } else {
            b.path_of(ino)?.unwrap_or_else(|| path.to_string())
        };
        let mut out = Vec::new();
        b.subtree(ino, &canonical, &mut out)?;
        Ok(out)
    }

    /// Commits the checkpoint at `path` (a directory or a file): it gets the next commit
    /// number, is marked for the durable tier if it is an Nth commit (or `force_flush`), and
    /// the agent is woken. EBUSY if a file below is still open for writing, EIO if one was
    /// torn by a writer that died, EINVAL for the root or a checkpoint nested in another.
    pub fn commit(&self, path: &str, force_flush: bool) -> Result<u64> {
        self.commit_as(path, force_flush, false)
    }

    /// Commits `path` for the end of a job that committed nothing there (flushed, like the
    /// last checkpoint of a job): an implicit checkpoint, which a later commit of a path
    /// inside it supersedes (that commit is not refused as nested).
    pub fn commit_implicit(&self, path: &str) -> Result<u64> {
        self.commit_as(path, true, true)
    }

    fn commit_as(&self, path: &str, force_flush: bool, implicit: bool) -> Result<u64> {
        match self.commit_once(path, force_flush, implicit) {
            // A writer that died still counts until its description is swept.
            Err(e) if e.errno() == libc::EBUSY && self.sweep_descriptions() > 0 => {
                self.commit_once(path, force_flush, implicit)
            }
            other => other,
        }
    }

    fn commit_once(&self, path: &str, force_flush: bool, implicit: bool) -> Result<u64> {
        let b = self.block();
        let h = b.header();
        let seq = {
            let _g = b.lock_ns()?;
            let ino = b.resolve(path)?;
            if ino == ROOT_INO {
                return Err(Error::new(
                    libc::EINVAL,
                    "the store root cannot be a checkpoint; commit a directory or a file in it",
                ));
            }
            let outer = b.committed_ancestor(ino)?;
            if let Some(outer) = outer {
                if b.inode(outer).life.load(Acquire) & LIFE_IMPLICIT == 0 {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!(
                            "{path} is inside the committed checkpoint {}; commit that one instead",
                            b.path_of(outer)?.unwrap_or_default()
                        ),
                    ));
                }
            }
            let canonical = b.path_of(ino)?.unwrap_or_else(|| path.to_string());
            let mut tree = Vec::new();
            b.subtree(ino, &canonical, &mut tree)?;
            for e in &tree {
                if e.ino != ino as u64 && e.committed {
                    return Err(Error::new(
                        libc::EINVAL,
                        format!(
                            "{path} contains the committed checkpoint {}; a checkpoint cannot hold another",
                            e.path
                        ),
                    ));
                }
                if e.writers > 0 {
                    return Err(Error::new(
                        libc::EBUSY,
                        format!("{} is still open for writing", e.path),
                    ));
                }
                if e.torn {
                    return Err(Error::new(
                        libc::EIO,
                        format!(
                            "{} is incomplete: the process writing it died; rewrite or remove it",
                            e.path
                        ),
                    ));
                }
            }
            if let Some(outer) = outer {
                // Superseded: no longer a checkpoint in the store (its marker below stays, a
                // snapshot of what the job had written by its end); the version bump stops
                // the agent recording it complete meanwhile.
                let o = b.inode(outer);
                o.life.fetch_and(
                    !(LIFE_COMMITTED | LIFE_IMPLICIT | LIFE_FLUSH | LIFE_COMPLETE | LIFE_PUSHED),
                    AcqRel,
                );
                o.mod_seq.fetch_add(1, AcqRel);
            }
            let seq = h.commit_counter.fetch_add(1, AcqRel) + 1;
            let every = h.flush_every.load(Relaxed).max(1) as u64;
            let inode = b.inode(ino);
            let mut set = LIFE_COMMITTED;
            if force_flush || seq.is_multiple_of(every) {
                set |= LIFE_FLUSH;
            }
            if implicit {
                set |= LIFE_IMPLICIT;
            }
            inode
                .life
                .fetch_and(!(LIFE_COMPLETE | LIFE_PUSHED | LIFE_IMPLICIT), AcqRel);
            inode.life.fetch_or(set, AcqRel);
            inode.commit_seq.store(seq, Release);
            let version = inode.mod_seq.fetch_add(1, AcqRel) + 1;
            if inode.life.load(Acquire) & LIFE_REMOTE != 0 {
                // A remote file's content is below, at this path: still durable.
                inode.durable_seq.store(version, Release);
            }
            seq
        };
        b.wake_agent();
        Ok(seq)
    }

    /// Marks the committed checkpoint at `path` for the durable tier (the last checkpoint of
    /// a job is always flushed). False if it is not a committed checkpoint.
    pub fn set_flush(&self, path: &str) -> Result<bool> {
        let b = self.block();
        let ino = {
            let _g = b.lock_ns()?;
            b.resolve(path)?
        };
        let inode = b.inode(ino);
        if inode.life.load(Acquire) & LIFE_COMMITTED == 0 {
            return Ok(false);
        }
        let before = inode.life.fetch_or(LIFE_FLUSH, AcqRel);
        if before & LIFE_FLUSH == 0 {
            b.wake_agent();
        }
        Ok(true)
    }

    /// Renames a closed file fetched from a lower level (written under a temporary name)
    /// to `to` and records that level for the renamed version: durable, or staged only.
    /// One namespace-lock hold, so the agent's passes never see the file at `to` without
    /// its level and send it back down. False if the file is open for writing (renamed,
    /// nothing recorded).
    pub fn rename_fetched(&self, from: &str, to: &str, staged_only: bool) -> Result<bool> {
        let b = self.block();
        let _g = b.lock_ns()?;
        b.rename_locked(from, to)?;
        let inode = b.inode(b.resolve(to)?);
        if inode.state.load(Acquire) == INODE_DIR || inode.writers.load(Acquire) != 0 {
            return Ok(false);
        }
        // Flag before version, as in mark_staged: a reader never sees the version without it.
        if staged_only {
            inode.life.fetch_or(LIFE_STAGED, AcqRel);
        } else {
            inode.life.fetch_and(!LIFE_STAGED, AcqRel);
        }
        inode
            .durable_seq
            .store(inode.mod_seq.load(Acquire), Release);
        Ok(true)
    }

    /// Records that the durable tier holds version `seq` of (ino, gen); false (nothing
    /// recorded) if the inode changed meanwhile.
    pub fn mark_durable(&self, ino: u64, generation: u32, seq: u64) -> bool {
        let Some(inode) = self.closed_version(ino, generation, seq) else {
            return false;
        };
        inode.durable_seq.store(seq, Release);
        inode.life.fetch_and(!LIFE_STAGED, AcqRel);
        self.progressed();
        true
    }

    /// Records that a staging server holds version `seq` of (ino, gen) (safe from the loss
    /// of this node). Never downgrades a version already durable.
    pub fn mark_staged(&self, ino: u64, generation: u32, seq: u64) -> bool {
        let Some(inode) = self.closed_version(ino, generation, seq) else {
            return false;
        };
        if inode.durable_seq.load(Acquire) == seq && inode.life.load(Acquire) & LIFE_STAGED == 0 {
            return true;
        }
        // Flag first: a reader never sees `durable_seq == seq` without it.
        inode.life.fetch_or(LIFE_STAGED, AcqRel);
        inode.durable_seq.store(seq, Release);
        self.progressed();
        inode.mod_seq.load(Acquire) == seq
    }

    /// Records that a staging server accepted the file list of checkpoint (ino, gen) at
    /// version `seq` and will write its marker.
    pub fn mark_pushed(&self, ino: u64, generation: u32, seq: u64) -> bool {
        let b = self.block();
        if ino >= b.geo.max_inodes as u64 {
            return false;
        }
        let inode = b.inode(ino as u32);
        if inode.gen.load(Acquire) != generation || inode.mod_seq.load(Acquire) != seq {
            return false;
        }
        let life = inode.life.load(Acquire);
        if inode.durable_seq.load(Acquire) == seq && life & LIFE_STAGED == 0 {
            // Already durable (complete, or a single file that went straight down).
            inode.life.fetch_or(LIFE_PUSHED, AcqRel);
            return true;
        }
        inode.life.fetch_or(LIFE_STAGED | LIFE_PUSHED, AcqRel);
        inode.durable_seq.store(seq, Release);
        self.progressed();
        inode.mod_seq.load(Acquire) == seq
    }

    /// The inode of (ino, gen) if it is at version `seq` and nobody writes it.
    fn closed_version(&self, ino: u64, generation: u32, seq: u64) -> Option<&crate::layout::Inode> {
        let b = self.block();
        if ino >= b.geo.max_inodes as u64 {
            return None;
        }
        let inode = b.inode(ino as u32);
        (inode.gen.load(Acquire) == generation
            && inode.mod_seq.load(Acquire) == seq
            && inode.writers.load(Acquire) == 0)
            .then_some(inode)
    }

    /// Records that the completion marker of checkpoint (ino, gen) was written for version
    /// `seq` (its `mod_seq` when all its files were found durable).
    pub fn mark_complete(&self, ino: u64, generation: u32, seq: u64) -> bool {
        let b = self.block();
        if ino >= b.geo.max_inodes as u64 {
            return false;
        }
        let inode = b.inode(ino as u32);
        if inode.gen.load(Acquire) != generation || inode.mod_seq.load(Acquire) != seq {
            return false;
        }
        inode.life.fetch_or(LIFE_COMPLETE, AcqRel);
        inode.durable_seq.store(seq, Release);
        inode.life.fetch_and(!LIFE_STAGED, AcqRel);
        self.progressed();
        inode.mod_seq.load(Acquire) == seq
    }

    /// Clears the completion (and pushed) flags of checkpoint (ino, gen) before its marker
    /// is rewritten.
    pub fn clear_complete(&self, ino: u64, generation: u32) {
        let b = self.block();
        if ino < b.geo.max_inodes as u64 {
            let inode = b.inode(ino as u32);
            if inode.gen.load(Acquire) == generation {
                inode.life.fetch_and(!(LIFE_COMPLETE | LIFE_PUSHED), AcqRel);
            }
        }
    }

    /// Removes the checkpoint at `path` from the store if it is still safe below this node
    /// (complete, or pushed to a staging server with every file staged), or if
    /// `allow_incomplete` (a checkpoint never meant for the durable tier), and nothing in it
    /// is open. Returns the bytes freed, or None if it was not evictable. One namespace-lock
    /// hold, so nobody sees it half removed.
    pub fn evict(
        &self,
        path: &str,
        generation: u32,
        allow_incomplete: bool,
    ) -> Result<Option<u64>> {
        let b = self.block();
        let freed = {
            let _g = b.lock_ns()?;
            let ino = match b.resolve(path) {
                Ok(i) => i,
                Err(e) if e.errno() == libc::ENOENT => return Ok(None),
                Err(e) => return Err(e),
            };
            if ino == ROOT_INO {
                return Ok(None);
            }
            let mut tree = Vec::new();
            b.subtree(ino, path, &mut tree)?;
            let root = &tree[0];
            if root.generation != generation || !root.committed {
                return Ok(None);
            }
            if !allow_incomplete && !root.checkpoint_safe() {
                return Ok(None);
            }
            let busy = tree.iter().any(|e| {
                e.opens > 0
                    || e.writers > 0
                    || (!allow_incomplete && e.kind == FileKind::File && !e.safe())
            });
            if busy {
                return Ok(None);
            }
            let cs = b.geo.chunk_size;
            let freed: u64 = tree
                .iter()
                .map(|e| (e.chunks_mem + e.chunks_spill) * cs)
                .sum();
            // Children before parents.
            for e in tree.iter().rev() {
                let ino = e.ino as u32;
                let parent = b.parent_of(ino)?;
                b.remove_inode(parent, ino)?;
            }
            freed
        };
        futex_wake_all(&b.header().space_wake);
        Ok(Some(freed))
    }

    /// Makes the file at `path` remote (LIFE_REMOTE): frees its data but keeps its name, size
    /// and times, if it is still version `seq` of generation `generation`, durable (not only
    /// staged), closed, not torn, and neither a committed checkpoint nor inside one: a file
    /// of a program that does not commit, whose content is safe below, evicted for writers
    /// waiting for space. Listings and stat still show it; opening it under `cascade run`
    /// fetches it again. Returns the bytes freed, or None if it was not evictable.
    pub fn make_remote(&self, path: &str, generation: u32, seq: u64) -> Result<Option<u64>> {
        let b = self.block();
        let freed = {
            let _g = b.lock_ns()?;
            let ino = match b.resolve(path) {
                Ok(i) => i,
                Err(e) if e.errno() == libc::ENOENT => return Ok(None),
                Err(e) => return Err(e),
            };
            let e = b.life_entry(ino, path.to_string());
            let evictable = ino != ROOT_INO
                && e.kind == FileKind::File
                && e.generation == generation
                && e.mod_seq == seq
                && e.durable()
                && !e.torn
                && !e.committed
                && !e.remote
                && e.opens == 0;
            if !evictable || b.committed_ancestor(ino)?.is_some() {
                return Ok(None);
            }
            // Opening takes the namespace lock too, so nobody can start reading meanwhile.
            let _file = b.lock_inode(ino)?;
            let inode = b.inode(ino);
            inode.life.fetch_or(LIFE_REMOTE, AcqRel);
            b.map_truncate(ino, 0)?;
            (e.chunks_mem + e.chunks_spill) * b.geo.chunk_size
        };
        futex_wake_all(&b.header().space_wake);
        Ok(Some(freed))
    }

    /// Creates a remote file (LIFE_REMOTE) at `path`, of `size` bytes modified at `mtime_ns`,
    /// recorded durable: a file a level below holds, listed for a directory listing before
    /// anything fetched it. False if `path` exists already; its parent must exist.
    pub fn create_remote(&self, path: &str, size: u64, mtime_ns: i64) -> Result<bool> {
        let b = self.block();
        let _g = b.lock_ns()?;
        let (parent, name) = b.resolve_parent(path)?;
        let Some(name) = name else {
            return Ok(false);
        };
        if b.lookup(parent, name)?.is_some() {
            return Ok(false);
        }
        if size > b.geo.max_file_bytes() {
            return Err(Error::new(
                libc::EFBIG,
                format!("{path}: {size} bytes exceed the store's file size limit"),
            ));
        }
        let ino = b.create_inode(parent, name, crate::layout::INODE_FILE, 0o644)?;
        let inode = b.inode(ino);
        inode.life.fetch_or(LIFE_REMOTE, AcqRel);
        inode.size.store(size, Release);
        inode
            .mtime
            .store(crate::store::explicit_time(mtime_ns), Relaxed);
        inode.ctime.store(mtime_ns, Relaxed);
        inode
            .durable_seq
            .store(inode.mod_seq.load(Acquire), Release);
        Ok(true)
    }

    /// The longest store path the durable tier takes (`max_key_len`: its longest key, None =
    /// no limit): creates and renames to longer paths fail with ENAMETOOLONG at once. Keeps
    /// [`PATH_SUFFIX_ROOM`] bytes for the names Cascade derives from a path (`.blake3`,
    /// `.<name>.cascade-version`, a fetch's temporary name).
    pub fn set_path_limit(&self, max_key_len: Option<usize>) {
        let limit = max_key_len.map_or(0, |k| {
            // A store path is its key with a leading '/'.
            (k + 1)
                .saturating_sub(PATH_SUFFIX_ROOM)
                .clamp(1, u32::MAX as usize) as u32
        });
        self.block().header().max_path.store(limit, Relaxed);
    }

    /// Sets the flush frequency and how long writers wait on a full store (0 = ENOSPC at once).
    pub fn set_policy(&self, flush_every: u32, full_wait: Duration) {
        let h = self.block().header();
        h.flush_every.store(flush_every.max(1), Release);
        h.full_wait_ms
            .store(full_wait.as_millis().min(u32::MAX as u128) as u32, Release);
    }

    /// Registers the calling process as the store's agent; EBUSY if a live one exists.
    pub fn register_agent(&self) -> Result<AgentRegistration> {
        let b = self.block();
        let h = b.header();
        let me = my_pid();
        let start = process_start_time(me).unwrap_or(0);
        loop {
            let cur = h.agent_pid.load(Acquire);
            if cur != 0 && process_alive(cur, h.agent_start_time.load(Acquire)) {
                return Err(Error::new(
                    libc::EBUSY,
                    format!(
                        "an agent (pid {cur}) is already running for store {}",
                        b.name
                    ),
                ));
            }
            if h.agent_pid
                .compare_exchange(cur, me, AcqRel, Acquire)
                .is_ok()
            {
                h.agent_start_time.store(start, Release);
                return Ok(AgentRegistration {
                    store: self.clone(),
                });
            }
        }
    }

    /// The pid of the store's live agent, if any.
    pub fn agent_pid(&self) -> Option<u32> {
        self.block().agent_pid()
    }

    /// The agent's wake-up counter: read it, look for work, then `wait_for_work(seen)`.
    pub fn work_counter(&self) -> u32 {
        wake_count(&self.block().header().agent_wake)
    }

    /// Sleeps until someone calls for the agent after `seen` was read, or `timeout` passes.
    pub fn wait_for_work(&self, seen: u32, timeout: Duration) {
        futex_wait(&self.block().header().agent_wake, seen, timeout);
    }

    /// The progress counter: read it, look at the tree, then `wait_for_progress(seen)`.
    pub fn progress_counter(&self) -> u32 {
        wake_count(&self.block().header().progress_wake)
    }

    /// Sleeps until a file or checkpoint reached a level after `seen` was read, or `timeout`
    /// passes (an agent of an older build never wakes it: poll as well).
    pub fn wait_for_progress(&self, seen: u32, timeout: Duration) {
        futex_wait(&self.block().header().progress_wake, seen, timeout);
    }

    /// Wakes whoever waits for a level (`cascade wait`).
    fn progressed(&self) {
        futex_wake_all(&self.block().header().progress_wake);
    }

    /// Wakes the agent (new work, or a request to look again).
    pub fn wake_agent(&self) {
        self.block().wake_agent();
    }

    /// While writers wait for space, the time of the newest allocation that failed: it names
    /// the request, since a writer that retried after an eviction and failed again stamps a
    /// new one. None while no writer waits.
    pub fn space_request(&self) -> Option<i64> {
        let h = self.block().header();
        (h.space_waiters.load(Acquire) > 0).then(|| h.enospc_time.load(Acquire))
    }

    /// Free bytes in memory and spill (shared pool, not counting per-process batches).
    pub fn free_bytes(&self) -> u64 {
        let b = self.block();
        let h = b.header();
        (h.free_mem_top.load(Acquire) as u64 + h.free_spill_top.load(Acquire) as u64)
            * b.geo.chunk_size
    }
}
