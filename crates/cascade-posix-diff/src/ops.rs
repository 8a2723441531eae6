//! The operations and their random generator.
//!
//! Paths come from a tiny name space (components `a`, `b`, `c`, one to three deep) so the
//! same names keep colliding: files where directories are expected and the reverse, parents
//! that are missing or are files, non-empty directories, renames onto existing entries.
//! With `quirks` on, a few paths are spelled unusually (trailing slash, `x/../y`, `./`,
//! doubled slashes, 255- and 256-byte names), which a lexical path normaliser gets wrong.

use std::fmt;

use libc::{c_int, mode_t};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Open-file slots per side. Both sides keep the same slots open (a difference in an open's
/// result ends the run), so ops name a slot and each side maps it to its own fd.
pub const SLOTS: usize = 8;

const NAMES: [&str; 3] = ["a", "b", "c"];

/// An fd argument: an open slot, or a number that is not an open fd (EBADF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdRef {
    Slot(usize),
    Bad(c_int),
}

impl fmt::Display for FdRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FdRef::Slot(s) => write!(f, "slot{s}"),
            FdRef::Bad(n) => write!(f, "badfd({n})"),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    Open {
        path: String,
        flags: c_int,
        mode: mode_t,
        slot: usize,
    },
    OpenAt {
        dir: FdRef,
        path: String,
        flags: c_int,
        mode: mode_t,
        slot: usize,
    },
    Close {
        fd: FdRef,
    },
    Read {
        fd: FdRef,
        len: usize,
    },
    Pread {
        fd: FdRef,
        len: usize,
        offset: i64,
    },
    Readv {
        fd: FdRef,
        lens: Vec<usize>,
    },
    Write {
        fd: FdRef,
        data: Vec<u8>,
    },
    Pwrite {
        fd: FdRef,
        data: Vec<u8>,
        offset: i64,
    },
    Writev {
        fd: FdRef,
        chunks: Vec<Vec<u8>>,
    },
    Lseek {
        fd: FdRef,
        offset: i64,
        whence: c_int,
    },
    Ftruncate {
        fd: FdRef,
        len: i64,
    },
    Truncate {
        path: String,
        len: i64,
    },
    Fstat {
        fd: FdRef,
    },
    Stat {
        path: String,
    },
    Lstat {
        path: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: mode_t,
    },
    Rmdir {
        path: String,
    },
    /// opendir(path), readdir to the end, closedir.
    ListDir {
        path: String,
    },
    /// fdopendir(dup(fd)), rewinddir, readdir to the end, closedir.
    ListFd {
        fd: FdRef,
    },
    Dup {
        fd: FdRef,
        slot: usize,
    },
    Dup2 {
        fd: FdRef,
        target: usize,
    },
    Fsync {
        fd: FdRef,
    },
    /// fcntl(F_GETFL), then F_SETFL with O_APPEND set (`on`) or cleared: the one status flag
    /// a description's writes depend on.
    SetAppend {
        fd: FdRef,
        on: bool,
    },
    Access {
        path: String,
        mode: c_int,
    },
}

impl Op {
    /// The call's name, for the summary counts.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Open { .. } => "open",
            Op::OpenAt { .. } => "openat",
            Op::Close { .. } => "close",
            Op::Read { .. } => "read",
            Op::Pread { .. } => "pread",
            Op::Readv { .. } => "readv",
            Op::Write { .. } => "write",
            Op::Pwrite { .. } => "pwrite",
            Op::Writev { .. } => "writev",
            Op::Lseek { .. } => "lseek",
            Op::Ftruncate { .. } => "ftruncate",
            Op::Truncate { .. } => "truncate",
            Op::Fstat { .. } => "fstat",
            Op::Stat { .. } => "stat",
            Op::Lstat { .. } => "lstat",
            Op::Rename { .. } => "rename",
            Op::Unlink { .. } => "unlink",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::ListDir { .. } => "opendir",
            Op::ListFd { .. } => "fdopendir",
            Op::Dup { .. } => "dup",
            Op::Dup2 { .. } => "dup2",
            Op::Fsync { .. } => "fsync",
            Op::SetAppend { .. } => "fcntl(F_SETFL)",
            Op::Access { .. } => "access",
        }
    }
}

impl Op {
    /// Bytes a write-type op asks to write (0 for other ops).
    pub fn write_len(&self) -> usize {
        match self {
            Op::Write { data, .. } | Op::Pwrite { data, .. } => data.len(),
            Op::Writev { chunks, .. } => chunks.iter().map(Vec::len).sum(),
            _ => 0,
        }
    }
}

/// `O_RDWR|O_CREAT|...` for open flags.
pub fn flags_text(flags: c_int) -> String {
    let mut parts = vec![match flags & libc::O_ACCMODE {
        libc::O_RDONLY => "O_RDONLY",
        libc::O_WRONLY => "O_WRONLY",
        _ => "O_RDWR",
    }
    .to_string()];
    for (bit, name) in [
        (libc::O_CREAT, "O_CREAT"),
        (libc::O_EXCL, "O_EXCL"),
        (libc::O_TRUNC, "O_TRUNC"),
        (libc::O_APPEND, "O_APPEND"),
        (libc::O_DIRECTORY, "O_DIRECTORY"),
        (libc::O_NOFOLLOW, "O_NOFOLLOW"),
        (libc::O_CLOEXEC, "O_CLOEXEC"),
    ] {
        if flags & bit != 0 {
            parts.push(name.to_string());
        }
    }
    parts.join("|")
}

fn whence_text(whence: c_int) -> String {
    match whence {
        libc::SEEK_SET => "SEEK_SET".into(),
        libc::SEEK_CUR => "SEEK_CUR".into(),
        libc::SEEK_END => "SEEK_END".into(),
        w => format!("{w} (invalid whence)"),
    }
}

fn access_text(mode: c_int) -> String {
    if mode == libc::F_OK {
        return "F_OK".into();
    }
    let mut parts = Vec::new();
    for (bit, name) in [
        (libc::R_OK, "R_OK"),
        (libc::W_OK, "W_OK"),
        (libc::X_OK, "X_OK"),
    ] {
        if mode & bit != 0 {
            parts.push(name);
        }
    }
    parts.join("|")
}

/// A path for display: long names shortened.
fn p(path: &str) -> String {
    let shown: Vec<String> = path
        .split('/')
        .map(|c| {
            if c.len() > 16 {
                format!(
                    "{}…({} bytes)",
                    c.chars().take(4).collect::<String>(),
                    c.len()
                )
            } else {
                c.to_string()
            }
        })
        .collect();
    format!("\"{}\"", shown.join("/"))
}

fn lens_text(lens: impl Iterator<Item = usize>) -> String {
    let v: Vec<String> = lens.map(|l| l.to_string()).collect();
    format!("[{}]", v.join(", "))
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Open {
                path,
                flags,
                mode,
                slot,
            } => write!(
                f,
                "slot{slot} = open({}, {}, {mode:#o})",
                p(path),
                flags_text(*flags)
            ),
            Op::OpenAt {
                dir,
                path,
                flags,
                mode,
                slot,
            } => write!(
                f,
                "slot{slot} = openat({dir}, {}, {}, {mode:#o})",
                p(path),
                flags_text(*flags)
            ),
            Op::Close { fd } => write!(f, "close({fd})"),
            Op::Read { fd, len } => write!(f, "read({fd}, {len})"),
            Op::Pread { fd, len, offset } => write!(f, "pread({fd}, {len}, @{offset})"),
            Op::Readv { fd, lens } => {
                write!(f, "readv({fd}, {})", lens_text(lens.iter().copied()))
            }
            Op::Write { fd, data } => write!(f, "write({fd}, {} bytes)", data.len()),
            Op::Pwrite { fd, data, offset } => {
                write!(f, "pwrite({fd}, {} bytes, @{offset})", data.len())
            }
            Op::Writev { fd, chunks } => write!(
                f,
                "writev({fd}, {} bytes)",
                lens_text(chunks.iter().map(Vec::len))
            ),
            Op::Lseek { fd, offset, whence } => {
                write!(f, "lseek({fd}, {offset}, {})", whence_text(*whence))
            }
            Op::Ftruncate { fd, len } => write!(f, "ftruncate({fd}, {len})"),
            Op::Truncate { path, len } => write!(f, "truncate({}, {len})", p(path)),
            Op::Fstat { fd } => write!(f, "fstat({fd})"),
            Op::Stat { path } => write!(f, "stat({})", p(path)),
            Op::Lstat { path } => write!(f, "lstat({})", p(path)),
            Op::Rename { from, to } => write!(f, "rename({}, {})", p(from), p(to)),
            Op::Unlink { path } => write!(f, "unlink({})", p(path)),
            Op::Mkdir { path, mode } => write!(f, "mkdir({}, {mode:#o})", p(path)),
            Op::Rmdir { path } => write!(f, "rmdir({})", p(path)),
            Op::ListDir { path } => write!(f, "opendir+readdir({})", p(path)),
            Op::ListFd { fd } => write!(f, "fdopendir(dup({fd}))+rewinddir+readdir"),
            Op::Dup { fd, slot } => write!(f, "slot{slot} = dup({fd})"),
            Op::Dup2 { fd, target } => write!(f, "dup2({fd}, slot{target})"),
            Op::Fsync { fd } => write!(f, "fsync({fd})"),
            Op::SetAppend { fd, on } => write!(
                f,
                "fcntl({fd}, F_SETFL, F_GETFL {} O_APPEND)",
                if *on { "|" } else { "& ~" }
            ),
            Op::Access { path, mode } => write!(f, "access({}, {})", p(path), access_text(*mode)),
        }
    }
}

/// What the generator knows of a slot (from the results, identical on both sides).
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotState {
    pub open: bool,
    /// Refers to a directory (lseek on a directory is file-system specific: only
    /// `lseek(fd, 0, SEEK_SET)` is generated for one).
    pub dir: bool,
    /// Opened for reading / for writing (O_ACCMODE).
    pub read: bool,
    pub write: bool,
}

impl SlotState {
    /// The state of a slot just opened with `flags` (dir: whether it is a directory).
    pub fn opened(flags: c_int, dir: bool) -> SlotState {
        let mode = flags & libc::O_ACCMODE;
        SlotState {
            open: true,
            dir,
            read: mode != libc::O_WRONLY,
            write: mode != libc::O_RDONLY,
        }
    }
}

/// Which slots an op prefers (it still gets any open slot now and then, for the errors).
#[derive(Clone, Copy)]
enum Want {
    Any,
    ReadableFile,
    WritableFile,
}

#[derive(Clone, Copy)]
enum Kind {
    Open,
    OpenAt,
    Close,
    Read,
    Pread,
    Readv,
    Write,
    Pwrite,
    Writev,
    Lseek,
    Ftruncate,
    Truncate,
    Fstat,
    Stat,
    Lstat,
    Rename,
    Unlink,
    Mkdir,
    Rmdir,
    ListDir,
    ListFd,
    Dup,
    Dup2,
    Fsync,
    SetAppend,
    Access,
}

const WEIGHTS: [(Kind, u32); 26] = [
    (Kind::Open, 12),
    (Kind::OpenAt, 3),
    (Kind::Close, 6),
    (Kind::Read, 6),
    (Kind::Pread, 5),
    (Kind::Readv, 2),
    (Kind::Write, 8),
    (Kind::Pwrite, 7),
    (Kind::Writev, 3),
    (Kind::Lseek, 5),
    (Kind::Ftruncate, 3),
    (Kind::Truncate, 3),
    (Kind::Fstat, 3),
    (Kind::Stat, 3),
    (Kind::Lstat, 1),
    (Kind::Rename, 5),
    (Kind::Unlink, 5),
    (Kind::Mkdir, 4),
    (Kind::Rmdir, 4),
    (Kind::ListDir, 3),
    (Kind::ListFd, 1),
    (Kind::Dup, 2),
    (Kind::Dup2, 2),
    (Kind::Fsync, 1),
    (Kind::SetAppend, 2),
    (Kind::Access, 2),
];

/// Deterministic: the same seed and the same slot states give the same operations.
pub struct Generator {
    rng: StdRng,
    quirks: bool,
}

const MAX_OFFSET: i64 = 1 << 20;
const MAX_IO: usize = 64 << 10;

impl Generator {
    pub fn new(seed: u64, quirks: bool) -> Generator {
        Generator {
            rng: StdRng::seed_from_u64(seed),
            quirks,
        }
    }

    /// A random number in 0..n (for the caller's own deterministic choices).
    pub fn below(&mut self, n: usize) -> usize {
        self.rng.gen_range(0..n)
    }

    pub fn next(&mut self, slots: &[SlotState; SLOTS]) -> Op {
        let open: Vec<usize> = (0..SLOTS).filter(|&s| slots[s].open).collect();
        let free: Vec<usize> = (0..SLOTS).filter(|&s| !slots[s].open).collect();
        let total: u32 = WEIGHTS.iter().map(|w| w.1).sum();
        let mut pick = self.rng.gen_range(0..total);
        let mut kind = Kind::Open;
        for (k, w) in WEIGHTS {
            if pick < w {
                kind = k;
                break;
            }
            pick -= w;
        }
        // Substitutions when the slots do not allow the op: no open slot → open; no free
        // slot → close (for open) or dup2 (for dup).
        let needs_open_slot = !matches!(
            kind,
            Kind::Open
                | Kind::Truncate
                | Kind::Stat
                | Kind::Lstat
                | Kind::Rename
                | Kind::Unlink
                | Kind::Mkdir
                | Kind::Rmdir
                | Kind::ListDir
                | Kind::Access
        );
        if needs_open_slot && open.is_empty() {
            kind = Kind::Open;
        }
        if matches!(kind, Kind::Open | Kind::OpenAt) && free.is_empty() {
            kind = Kind::Close;
        }
        if matches!(kind, Kind::Dup) && free.is_empty() {
            kind = Kind::Dup2;
        }

        match kind {
            Kind::Open => Op::Open {
                path: self.path(3),
                flags: self.open_flags(),
                mode: self.file_mode(),
                slot: free[self.below(free.len())],
            },
            Kind::OpenAt => {
                let dirs: Vec<usize> = open.iter().copied().filter(|&s| slots[s].dir).collect();
                let dir = if self.rng.gen_bool(0.04) {
                    self.bad_fd()
                } else if !dirs.is_empty() && self.rng.gen_bool(0.85) {
                    FdRef::Slot(dirs[self.below(dirs.len())])
                } else {
                    FdRef::Slot(open[self.below(open.len())])
                };
                Op::OpenAt {
                    dir,
                    path: self.path(2),
                    flags: self.open_flags(),
                    mode: self.file_mode(),
                    slot: free[self.below(free.len())],
                }
            }
            Kind::Close => Op::Close {
                fd: self.fd(slots, &open, Want::Any),
            },
            Kind::Read => Op::Read {
                fd: self.fd(slots, &open, Want::ReadableFile),
                len: self.io_len(),
            },
            Kind::Pread => Op::Pread {
                fd: self.fd(slots, &open, Want::ReadableFile),
                len: self.io_len(),
                offset: self.offset(),
            },
            Kind::Readv => {
                let n = self.rng.gen_range(1..=4);
                Op::Readv {
                    fd: self.fd(slots, &open, Want::ReadableFile),
                    lens: (0..n).map(|_| self.io_len() / 4).collect(),
                }
            }
            Kind::Write => Op::Write {
                fd: self.fd(slots, &open, Want::WritableFile),
                data: self.data(MAX_IO),
            },
            Kind::Pwrite => Op::Pwrite {
                fd: self.fd(slots, &open, Want::WritableFile),
                data: self.data(MAX_IO),
                offset: self.offset(),
            },
            Kind::Writev => {
                let n = self.rng.gen_range(1..=4);
                Op::Writev {
                    fd: self.fd(slots, &open, Want::WritableFile),
                    chunks: (0..n).map(|_| self.data(MAX_IO / 4)).collect(),
                }
            }
            Kind::Lseek => {
                let fd = self.fd(slots, &open, Want::Any);
                let on_dir = matches!(fd, FdRef::Slot(s) if slots[s].dir);
                let (offset, whence) = if on_dir {
                    (0, libc::SEEK_SET)
                } else {
                    self.seek()
                };
                Op::Lseek { fd, offset, whence }
            }
            Kind::Ftruncate => Op::Ftruncate {
                fd: self.fd(slots, &open, Want::WritableFile),
                len: self.offset(),
            },
            Kind::Truncate => Op::Truncate {
                path: self.path(3),
                len: self.offset(),
            },
            Kind::Fstat => Op::Fstat {
                fd: self.fd(slots, &open, Want::Any),
            },
            Kind::Stat => Op::Stat { path: self.path(3) },
            Kind::Lstat => Op::Lstat { path: self.path(3) },
            Kind::Rename => {
                let from = self.path(3);
                let to = if self.rng.gen_bool(0.05) {
                    from.clone()
                } else {
                    self.path(3)
                };
                Op::Rename { from, to }
            }
            Kind::Unlink => Op::Unlink { path: self.path(3) },
            Kind::Mkdir => Op::Mkdir {
                path: self.path(3),
                mode: [0o755, 0o700, 0o777, 0o750][self.below(4)],
            },
            Kind::Rmdir => Op::Rmdir { path: self.path(3) },
            Kind::ListDir => Op::ListDir {
                path: if self.rng.gen_bool(0.2) {
                    String::new() // the root itself
                } else {
                    self.path(3)
                },
            },
            Kind::ListFd => Op::ListFd {
                fd: self.fd(slots, &open, Want::Any),
            },
            Kind::Dup => Op::Dup {
                fd: self.fd(slots, &open, Want::Any),
                slot: free[self.below(free.len())],
            },
            Kind::Dup2 => Op::Dup2 {
                fd: self.fd(slots, &open, Want::Any),
                target: open[self.below(open.len())],
            },
            Kind::Fsync => Op::Fsync {
                fd: self.fd(slots, &open, Want::Any),
            },
            Kind::SetAppend => Op::SetAppend {
                fd: self.fd(slots, &open, Want::WritableFile),
                on: self.below(2) == 0,
            },
            Kind::Access => Op::Access {
                path: self.path(3),
                mode: [
                    libc::F_OK,
                    libc::R_OK,
                    libc::W_OK,
                    libc::X_OK,
                    libc::R_OK | libc::W_OK,
                    libc::R_OK | libc::X_OK,
                ][self.below(6)],
            },
        }
    }

    /// An open slot (mostly one that suits the op), or now and then a number that is no
    /// open fd.
    fn fd(&mut self, slots: &[SlotState; SLOTS], open: &[usize], want: Want) -> FdRef {
        if self.rng.gen_bool(0.03) {
            return self.bad_fd();
        }
        let suits = |s: &usize| {
            let st = slots[*s];
            match want {
                Want::Any => true,
                Want::ReadableFile => st.read && !st.dir,
                Want::WritableFile => st.write && !st.dir,
            }
        };
        let suitable: Vec<usize> = open.iter().copied().filter(suits).collect();
        if !suitable.is_empty() && self.rng.gen_bool(0.85) {
            FdRef::Slot(suitable[self.below(suitable.len())])
        } else {
            FdRef::Slot(open[self.below(open.len())])
        }
    }

    fn bad_fd(&mut self) -> FdRef {
        // Far above anything the harness opens; -1 and numbers past RLIMIT_NOFILE too.
        FdRef::Bad([-1, 4095, 65535, 1 << 20][self.below(4)])
    }

    /// A relative path 1..=max_depth components deep, sometimes spelled unusually.
    fn path(&mut self, max_depth: usize) -> String {
        let depth = match self.rng.gen_range(0..100) {
            0..=49 => 1,
            50..=84 => 2,
            _ => 3,
        }
        .min(max_depth);
        let mut parts: Vec<String> = (0..depth)
            .map(|_| NAMES[self.below(NAMES.len())].to_string())
            .collect();
        if !self.quirks || !self.rng.gen_bool(0.08) {
            return parts.join("/");
        }
        let last = parts.len() - 1;
        match self.rng.gen_range(0..6) {
            0 => format!("{}/", parts.join("/")),
            1 => {
                // "x/../name": resolves through x, which must be a directory.
                let x = NAMES[self.below(NAMES.len())];
                parts.insert(last, format!("{x}/.."));
                parts.join("/")
            }
            3 if last > 0 => {
                // A doubled slash between components (never leading: openat would take the
                // path as absolute and leave the tree).
                let at = self.rng.gen_range(1..=last);
                parts[at] = format!("/{}", parts[at]);
                parts.join("/")
            }
            2 | 3 => {
                let at = self.rng.gen_range(0..=last);
                parts.insert(at, ".".into());
                parts.join("/")
            }
            4 => {
                parts[last] = "n".repeat(255); // NAME_MAX: a valid name
                parts.join("/")
            }
            _ => {
                parts[last] = "n".repeat(256); // ENAMETOOLONG
                parts.join("/")
            }
        }
    }

    fn open_flags(&mut self) -> c_int {
        if self.rng.gen_bool(0.1) {
            return libc::O_RDONLY | libc::O_DIRECTORY;
        }
        let mut flags = match self.rng.gen_range(0..100) {
            0..=29 => libc::O_RDONLY,
            30..=54 => libc::O_WRONLY,
            _ => libc::O_RDWR,
        };
        let creat = self.rng.gen_bool(0.65);
        for (bit, chance) in [
            (libc::O_CREAT, if creat { 1.0 } else { 0.0 }),
            (libc::O_EXCL, 0.15),
            (libc::O_TRUNC, 0.2),
            (libc::O_APPEND, 0.2),
            // O_CREAT|O_DIRECTORY changed meaning across kernels (EINVAL since 6.4): never.
            (libc::O_DIRECTORY, if creat { 0.0 } else { 0.07 }),
            (libc::O_NOFOLLOW, 0.05),
            (libc::O_CLOEXEC, 0.5),
        ] {
            if self.rng.gen_bool(chance) {
                flags |= bit;
            }
        }
        flags
    }

    fn file_mode(&mut self) -> mode_t {
        [0o644, 0o600, 0o755, 0o640][self.below(4)]
    }

    /// A read length: often small, up to 64 KiB.
    fn io_len(&mut self) -> usize {
        match self.rng.gen_range(0..100) {
            0..=4 => 0,
            5..=34 => self.rng.gen_range(1..=64),
            35..=64 => self.rng.gen_range(65..=4096),
            _ => self.rng.gen_range(4097..=MAX_IO),
        }
    }

    fn data(&mut self, max: usize) -> Vec<u8> {
        let len = self.io_len().min(max);
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data[..]);
        data
    }

    /// An offset or length up to about 1 MiB: zero, small, page and 64 KiB boundaries ±1
    /// (Cascade's chunk edges), anywhere, and now and then negative (EINVAL).
    fn offset(&mut self) -> i64 {
        match self.rng.gen_range(0..100) {
            0..=14 => 0,
            15..=34 => self.rng.gen_range(0..=8192),
            35..=54 => self.rng.gen_range(1..=256) * 4096 + self.rng.gen_range(-1..=1),
            55..=64 => self.rng.gen_range(0..=16) * 65536 + self.rng.gen_range(-1..=1),
            65..=89 => self.rng.gen_range(0..=MAX_OFFSET),
            90..=94 => MAX_OFFSET,
            _ => [-1, -4096][self.below(2)],
        }
    }

    fn seek(&mut self) -> (i64, c_int) {
        match self.rng.gen_range(0..100) {
            0..=39 => (self.offset(), libc::SEEK_SET),
            40..=69 => {
                let delta = if self.rng.gen_bool(0.25) {
                    0
                } else {
                    self.rng.gen_range(-70_000..=70_000)
                };
                (delta, libc::SEEK_CUR)
            }
            70..=96 => {
                let delta = if self.rng.gen_bool(0.3) {
                    0
                } else {
                    self.rng.gen_range(-70_000..=70_000)
                };
                (delta, libc::SEEK_END)
            }
            // SEEK_DATA (3) and SEEK_HOLE (4) are valid on Linux; 5 is not.
            _ => (0, 5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_ops() {
        let slots = [SlotState::default(); SLOTS];
        let mut a = Generator::new(7, true);
        let mut b = Generator::new(7, true);
        let mut c = Generator::new(8, true);
        let ops_a: Vec<String> = (0..200).map(|_| a.next(&slots).to_string()).collect();
        let ops_b: Vec<String> = (0..200).map(|_| b.next(&slots).to_string()).collect();
        let ops_c: Vec<String> = (0..200).map(|_| c.next(&slots).to_string()).collect();
        assert_eq!(ops_a, ops_b);
        assert_ne!(ops_a, ops_c);
    }

    #[test]
    fn without_open_slots_only_path_ops_and_opens_are_generated() {
        let slots = [SlotState::default(); SLOTS];
        let mut g = Generator::new(1, false);
        for _ in 0..2000 {
            let op = g.next(&slots);
            let text = op.to_string();
            assert!(
                !text.contains("slot") || matches!(op, Op::Open { .. }),
                "an fd op with no open slot: {text}"
            );
        }
    }

    #[test]
    fn with_all_slots_open_no_open_or_dup_into_a_used_slot() {
        let slots = [SlotState::opened(libc::O_RDWR, false); SLOTS];
        let mut g = Generator::new(2, true);
        for _ in 0..2000 {
            let op = g.next(&slots);
            assert!(
                !matches!(op, Op::Open { .. } | Op::OpenAt { .. } | Op::Dup { .. }),
                "{op}"
            );
        }
    }

    #[test]
    fn quirky_paths_stay_inside_the_root() {
        let mut g = Generator::new(3, true);
        let mut seen_quirk = false;
        for _ in 0..5000 {
            let path = g.path(3);
            assert!(!path.starts_with("..") && !path.starts_with('/'), "{path}");
            let last = path.trim_end_matches('/').rsplit('/').next().unwrap();
            assert!(last != "." && last != "..", "{path}");
            seen_quirk |= path.contains("..") || path.ends_with('/');
        }
        assert!(seen_quirk);
    }

    #[test]
    fn flags_are_described() {
        assert_eq!(
            flags_text(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL),
            "O_WRONLY|O_CREAT|O_EXCL"
        );
    }
}
