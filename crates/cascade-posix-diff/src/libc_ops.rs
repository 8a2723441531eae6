//! The libc level (`--level libc`): random sequences of the glibc functions that reach files
//! through glibc's internal aliases (which an LD_PRELOAD library never sees unless it wraps
//! the function itself): the mkstemp family and mkdtemp, glob, nftw/ftw, scandir, fts,
//! posix_spawn with file actions, exec of programs stored in the tree (posix_spawn and
//! system), remove, lockf, mkfifo/mknod, and a forked child that exits without closing.
//!
//! Each op's result is a line of text that must be the same on both sides. Random names
//! (mkstemp, mkdtemp) differ between the sides, so their *shape* is compared (the template's
//! prefix and suffix kept, six characters replaced, the entry's type, mode and size after a
//! write, the fd's flags), and the entry is then renamed to a name of the op's own (`t<N>`)
//! on both sides before the trees are compared.
//!
//! One intended difference is allowed, and counted in the summary (`intended={...}`): where
//! side B creates a FIFO (mkfifo, mknod S_IFIFO), side A may answer EPERM: the store holds
//! no special files, as it holds no links (docs/interposition.md). The FIFO is then removed
//! from side B so that the trees stay comparable. Every other result must be equal.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::fmt;
use std::io::Write;

use libc::{c_char, c_int, c_long, c_void, mode_t};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::exec::{digest, FileKind, StatInfo};
use crate::sys::{self, errno, errno_name, Errno};
use crate::{Config, RunError, Sabotage, Summary};

/// Directory names; files are mostly named f and g (and now and then a directory's name, for
/// the EISDIR/ENOTDIR cases), so that directories survive to hold things to find.
const NAMES: [&str; 3] = ["a", "b", "c"];
const FILE_NAMES: [&str; 5] = ["f", "g", "f", "g", "a"];
/// The first ops of every run: a few directories.
const PROLOGUE: [&str; 4] = ["a", "b", "a/b", "b/c"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TempKind {
    Mkstemp,
    /// mkostemp with these extra open flags.
    Mkostemp(c_int),
    /// mkstemps with this suffix.
    Mkstemps(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Spawn,
    System,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialKind {
    Mkfifo,
    MknodFifo,
    /// mknod(S_IFREG): an ordinary empty file on Linux, in the store too.
    MknodReg,
}

#[derive(Clone, Debug)]
pub enum LibcOp {
    /// open(O_CREAT|O_TRUNC) + write + close: gives the other ops something to find.
    WriteFile {
        path: String,
        data: Vec<u8>,
    },
    Mkdir {
        path: String,
    },
    /// A temporary file in `dir` (absolute template, or relative with the cwd in `dir`),
    /// `data` written to it, then renamed to `dir/name`.
    TempFile {
        kind: TempKind,
        dir: String,
        relative: bool,
        data: Vec<u8>,
        name: String,
    },
    TempDir {
        dir: String,
        relative: bool,
        name: String,
    },
    /// glob of `pattern` (relative to the root; with `relative`, the cwd is the root).
    Glob {
        pattern: String,
        flags: c_int,
        relative: bool,
    },
    Nftw {
        dir: String,
        flags: c_int,
    },
    Ftw {
        dir: String,
    },
    Scandir {
        dir: String,
    },
    /// fts_open(FTS_PHYSICAL|FTS_NOCHDIR), with a comparison function or without.
    Fts {
        dir: String,
        sorted: bool,
    },
    /// posix_spawn of sh with `file` opened O_WRONLY|O_CREAT|O_APPEND onto fd 1; it prints
    /// `text`.
    SpawnAppend {
        file: String,
        text: String,
    },
    /// posix_spawn of `cat` with `src` opened onto fd 0; its stdout is a host pipe (None) or
    /// a tree file opened O_WRONLY|O_CREAT|O_TRUNC.
    SpawnStdin {
        src: String,
        dst: Option<String>,
    },
    /// posix_spawn of sh with addchdir_np into `dir`; it writes `text` to the relative `name`.
    SpawnChdir {
        dir: String,
        name: String,
        text: String,
    },
    /// A `#!/bin/sh` script written to `path` with `mode`, run via posix_spawn or system();
    /// it appends a line to `out` beside it and exits with `status`.
    Script {
        path: String,
        mode: mode_t,
        via: Via,
        status: u8,
    },
    Remove {
        path: String,
    },
    /// open (O_RDWR, or O_RDONLY), lockf(cmd, len), close.
    Lockf {
        path: String,
        writable: bool,
        cmd: c_int,
        len: i64,
    },
    Special {
        path: String,
        kind: SpecialKind,
    },
    /// A forked child opens `path`, writes `data` (write(), or fwrite to a FILE), and exits
    /// (exit() or _exit()) without closing; the parent then reads the file.
    ForkWrite {
        path: String,
        data: Vec<u8>,
        stdio: bool,
        quick_exit: bool,
    },
}

impl LibcOp {
    pub fn name(&self) -> &'static str {
        match self {
            LibcOp::WriteFile { .. } => "write_file",
            LibcOp::Mkdir { .. } => "mkdir",
            LibcOp::TempFile { kind, .. } => match kind {
                TempKind::Mkstemp => "mkstemp",
                TempKind::Mkostemp(_) => "mkostemp",
                TempKind::Mkstemps(_) => "mkstemps",
            },
            LibcOp::TempDir { .. } => "mkdtemp",
            LibcOp::Glob { .. } => "glob",
            LibcOp::Nftw { .. } => "nftw",
            LibcOp::Ftw { .. } => "ftw",
            LibcOp::Scandir { .. } => "scandir",
            LibcOp::Fts { .. } => "fts",
            LibcOp::SpawnAppend { .. } => "spawn_addopen_append",
            LibcOp::SpawnStdin { .. } => "spawn_addopen_stdin",
            LibcOp::SpawnChdir { .. } => "spawn_addchdir",
            LibcOp::Script {
                via: Via::Spawn, ..
            } => "script_spawn",
            LibcOp::Script {
                via: Via::System, ..
            } => "script_system",
            LibcOp::Remove { .. } => "remove",
            LibcOp::Lockf { .. } => "lockf",
            LibcOp::Special { kind, .. } => match kind {
                SpecialKind::Mkfifo => "mkfifo",
                SpecialKind::MknodFifo => "mknod_fifo",
                SpecialKind::MknodReg => "mknod_reg",
            },
            LibcOp::ForkWrite {
                quick_exit: false, ..
            } => "fork_write_exit",
            LibcOp::ForkWrite {
                quick_exit: true, ..
            } => "fork_write__exit",
        }
    }
}

fn q(path: &str) -> String {
    format!("\"{path}\"")
}

impl fmt::Display for LibcOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rel = |r: bool| if r { " (cwd there)" } else { "" };
        match self {
            LibcOp::WriteFile { path, data } => {
                write!(f, "write_file({}, {} bytes)", q(path), data.len())
            }
            LibcOp::Mkdir { path } => write!(f, "mkdir({}, 0755)", q(path)),
            LibcOp::TempFile {
                kind,
                dir,
                relative,
                data,
                name,
            } => {
                let call = match kind {
                    TempKind::Mkstemp => "mkstemp(tmpXXXXXX)".to_string(),
                    TempKind::Mkostemp(fl) => {
                        format!("mkostemp(tmpXXXXXX, {})", crate::ops::flags_text(*fl))
                    }
                    TempKind::Mkstemps(s) => format!("mkstemps(tmpXXXXXX{s}, {})", s.len()),
                };
                write!(
                    f,
                    "{call} in {}{} + write {} bytes + rename to {name}",
                    q(dir),
                    rel(*relative),
                    data.len()
                )
            }
            LibcOp::TempDir {
                dir,
                relative,
                name,
            } => write!(
                f,
                "mkdtemp(dXXXXXX) in {}{} + rename to {name}",
                q(dir),
                rel(*relative)
            ),
            LibcOp::Glob {
                pattern,
                flags,
                relative,
            } => write!(
                f,
                "glob({}, {}){}",
                q(pattern),
                glob_flags_text(*flags),
                if *relative { " (cwd the root)" } else { "" }
            ),
            LibcOp::Nftw { dir, flags } => {
                write!(f, "nftw({}, {})", q(dir), nftw_flags_text(*flags))
            }
            LibcOp::Ftw { dir } => write!(f, "ftw({})", q(dir)),
            LibcOp::Scandir { dir } => write!(f, "scandir({}, alphasort)", q(dir)),
            LibcOp::Fts { dir, sorted } => write!(
                f,
                "fts_open({}, FTS_PHYSICAL|FTS_NOCHDIR, {})+fts_read*+fts_close",
                q(dir),
                if *sorted { "by name" } else { "NULL" }
            ),
            LibcOp::SpawnAppend { file, text } => write!(
                f,
                "posix_spawn(sh -c printf {text}, addopen(1, {}, O_WRONLY|O_CREAT|O_APPEND))",
                q(file)
            ),
            LibcOp::SpawnStdin { src, dst } => match dst {
                None => write!(
                    f,
                    "posix_spawn(cat, addopen(0, {}, O_RDONLY), stdout a pipe)",
                    q(src)
                ),
                Some(d) => write!(
                    f,
                    "posix_spawn(cat, addopen(0, {}, O_RDONLY), addopen(1, {}, O_WRONLY|O_CREAT|O_TRUNC))",
                    q(src),
                    q(d)
                ),
            },
            LibcOp::SpawnChdir { dir, name, text } => write!(
                f,
                "posix_spawn(sh -c 'printf {text} > {name}', addchdir_np({}))",
                q(dir)
            ),
            LibcOp::Script {
                path,
                mode,
                via,
                status,
            } => write!(
                f,
                "script {} mode {mode:04o} (exit {status}) run via {}",
                q(path),
                match via {
                    Via::Spawn => "posix_spawn",
                    Via::System => "system()",
                }
            ),
            LibcOp::Remove { path } => write!(f, "remove({})", q(path)),
            LibcOp::Lockf {
                path,
                writable,
                cmd,
                len,
            } => write!(
                f,
                "open({}, {}) + lockf({}, {len}) + close",
                q(path),
                if *writable { "O_RDWR" } else { "O_RDONLY" },
                lockf_text(*cmd)
            ),
            LibcOp::Special { path, kind } => match kind {
                SpecialKind::Mkfifo => write!(f, "mkfifo({}, 0644)", q(path)),
                SpecialKind::MknodFifo => write!(f, "mknod({}, S_IFIFO|0644)", q(path)),
                SpecialKind::MknodReg => write!(f, "mknod({}, S_IFREG|0644)", q(path)),
            },
            LibcOp::ForkWrite {
                path,
                data,
                stdio,
                quick_exit,
            } => write!(
                f,
                "fork: child {} {} bytes to {} and {} without closing; parent reads it",
                if *stdio { "open+fdopen+fwrite" } else { "open+write" },
                data.len(),
                q(path),
                if *quick_exit { "_exit(0)" } else { "exit(0)" }
            ),
        }
    }
}

fn glob_flags_text(flags: c_int) -> String {
    let mut parts = Vec::new();
    for (bit, name) in [
        (libc::GLOB_MARK, "GLOB_MARK"),
        (libc::GLOB_ONLYDIR, "GLOB_ONLYDIR"),
        (libc::GLOB_NOCHECK, "GLOB_NOCHECK"),
        (libc::GLOB_NOSORT, "GLOB_NOSORT"),
    ] {
        if flags & bit != 0 {
            parts.push(name);
        }
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join("|")
    }
}

fn nftw_flags_text(flags: c_int) -> String {
    let mut parts = Vec::new();
    for (bit, name) in [
        (FTW_PHYS, "FTW_PHYS"),
        (FTW_MOUNT, "FTW_MOUNT"),
        (FTW_DEPTH, "FTW_DEPTH"),
    ] {
        if flags & bit != 0 {
            parts.push(name);
        }
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join("|")
    }
}

fn lockf_text(cmd: c_int) -> &'static str {
    match cmd {
        libc::F_LOCK => "F_LOCK",
        libc::F_TLOCK => "F_TLOCK",
        libc::F_ULOCK => "F_ULOCK",
        _ => "F_TEST",
    }
}

// ---- glibc declarations the libc crate lacks (glibc, x86_64 and aarch64 layouts) ----------

const FTW_PHYS: c_int = 1;
const FTW_MOUNT: c_int = 2;
const FTW_DEPTH: c_int = 8;
const FTS_NOCHDIR: c_int = 0x0004;
const FTS_PHYSICAL: c_int = 0x0010;
const FTS_DNR: u16 = 4;
const FTS_ERR: u16 = 7;
const FTS_NS: u16 = 10;

#[repr(C)]
struct FtwInfo {
    base: c_int,
    level: c_int,
}

/// glibc's FTSENT (fts.h); only the fields up to fts_statp are read.
#[repr(C)]
struct FtsEnt {
    fts_cycle: *mut FtsEnt,
    fts_parent: *mut FtsEnt,
    fts_link: *mut FtsEnt,
    fts_number: c_long,
    fts_pointer: *mut c_void,
    fts_accpath: *mut c_char,
    fts_path: *mut c_char,
    fts_errno: c_int,
    fts_symfd: c_int,
    fts_pathlen: u16,
    fts_namelen: u16,
    fts_ino: libc::ino_t,
    fts_dev: libc::dev_t,
    fts_nlink: libc::nlink_t,
    fts_level: i16,
    fts_info: u16,
    fts_flags: u16,
    fts_instr: u16,
    fts_statp: *mut libc::stat,
    /// The name, NUL-terminated, continues past the struct.
    fts_name: [c_char; 1],
}

type NftwFn = extern "C" fn(*const c_char, *const libc::stat, c_int, *mut FtwInfo) -> c_int;
type FtwFn = extern "C" fn(*const c_char, *const libc::stat, c_int) -> c_int;
type DirentCmp = unsafe extern "C" fn(*mut *const libc::dirent, *mut *const libc::dirent) -> c_int;
type FtsCmp = extern "C" fn(*mut *const FtsEnt, *mut *const FtsEnt) -> c_int;

extern "C" {
    fn nftw(dir: *const c_char, f: NftwFn, nopenfd: c_int, flags: c_int) -> c_int;
    fn ftw(dir: *const c_char, f: FtwFn, nopenfd: c_int) -> c_int;
    fn scandir(
        dir: *const c_char,
        namelist: *mut *mut *mut libc::dirent,
        filter: Option<extern "C" fn(*const libc::dirent) -> c_int>,
        compar: Option<DirentCmp>,
    ) -> c_int;
    fn alphasort(a: *mut *const libc::dirent, b: *mut *const libc::dirent) -> c_int;
    fn fts_open(argv: *const *mut c_char, options: c_int, compar: Option<FtsCmp>) -> *mut c_void;
    fn fts_read(fts: *mut c_void) -> *mut FtsEnt;
    fn fts_close(fts: *mut c_void) -> c_int;
    static environ: *const *mut c_char;
}

thread_local! {
    /// What the current nftw/ftw walk reported: (path, typeflag, level).
    static WALK: RefCell<Vec<(String, c_int, c_int)>> = const { RefCell::new(Vec::new()) };
}

fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return "(null)".into();
    }
    // SAFETY: the callers pass NUL-terminated strings from glibc (paths of the walk).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

extern "C" fn nftw_cb(
    path: *const c_char,
    _st: *const libc::stat,
    typeflag: c_int,
    info: *mut FtwInfo,
) -> c_int {
    // SAFETY: nftw passes a valid struct FTW for the duration of the call.
    let level = unsafe { (*info).level };
    WALK.with(|w| w.borrow_mut().push((c_text(path), typeflag, level)));
    0
}

extern "C" fn ftw_cb(path: *const c_char, _st: *const libc::stat, typeflag: c_int) -> c_int {
    WALK.with(|w| w.borrow_mut().push((c_text(path), typeflag, -1)));
    0
}

extern "C" fn fts_by_name(a: *mut *const FtsEnt, b: *mut *const FtsEnt) -> c_int {
    // By fts_name: while a directory's entries are sorted, glibc's fts_path of each is the
    // shared path buffer (the parent's path), not the entry's own.
    // SAFETY: fts passes pointers to two valid FTSENT pointers of the same directory, whose
    // fts_name are NUL-terminated.
    let (x, y) = unsafe {
        (
            c_text((**a).fts_name.as_ptr()),
            c_text((**b).fts_name.as_ptr()),
        )
    };
    x.cmp(&y) as c_int
}

fn ftw_type(t: c_int) -> String {
    match t {
        0 => "F".into(),
        1 => "D".into(),
        2 => "DNR".into(),
        3 => "NS".into(),
        4 => "SL".into(),
        5 => "DP".into(),
        6 => "SLN".into(),
        x => format!("type{x}"),
    }
}

fn fts_info_text(i: u16) -> String {
    match i {
        1 => "D".into(),
        2 => "DC".into(),
        3 => "DEFAULT".into(),
        4 => "DNR".into(),
        5 => "DOT".into(),
        6 => "DP".into(),
        7 => "ERR".into(),
        8 => "F".into(),
        10 => "NS".into(),
        11 => "NSOK".into(),
        12 => "SL".into(),
        13 => "SLNONE".into(),
        x => format!("info{x}"),
    }
}

fn err(e: Errno) -> String {
    format!("-1 {}", errno_name(e))
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("paths never contain NUL")
}

/// One directory tree: its root, and the harness's own working directory (to return to).
pub struct LibcSide {
    pub root: String,
    home: CString,
}

impl LibcSide {
    pub fn new(root: &str) -> LibcSide {
        LibcSide {
            root: root.trim_end_matches('/').to_string(),
            home: sys::getcwd().unwrap_or_else(|_| cstr("/")),
        }
    }

    fn path(&self, rel: &str) -> CString {
        sys::join(&self.root, rel)
    }

    /// A path reported by a call, relative to the root ("." for the root itself); a path
    /// outside the tree is shown whole.
    fn rel(&self, full: &str) -> String {
        if full == self.root {
            ".".into()
        } else if let Some(r) = full.strip_prefix(&format!("{}/", self.root)) {
            r.to_string()
        } else {
            format!("OUTSIDE:{full}")
        }
    }

    fn go_home(&self) {
        // Back to where the harness started; failing here would make every later relative op
        // wrong, so it is fatal.
        if let Err(e) = sys::chdir(&self.home) {
            panic!("chdir back to {:?}: {}", self.home, errno_name(e));
        }
    }

    pub fn exec(&self, op: &LibcOp) -> String {
        match op {
            LibcOp::WriteFile { path, data } => match write_whole(&self.path(path), data, 0o644) {
                Ok(()) => "0".into(),
                Err(e) => err(e),
            },
            LibcOp::Mkdir { path } => match sys::mkdir(&self.path(path), 0o755) {
                Ok(_) => "0".into(),
                Err(e) => err(e),
            },
            LibcOp::TempFile {
                kind,
                dir,
                relative,
                data,
                name,
            } => self.temp_file(*kind, dir, *relative, data, name),
            LibcOp::TempDir {
                dir,
                relative,
                name,
            } => self.temp_dir(dir, *relative, name),
            LibcOp::Glob {
                pattern,
                flags,
                relative,
            } => self.glob(pattern, *flags, *relative),
            LibcOp::Nftw { dir, flags } => self.walk(dir, Some(*flags)),
            LibcOp::Ftw { dir } => self.walk(dir, None),
            LibcOp::Scandir { dir } => self.scandir(dir),
            LibcOp::Fts { dir, sorted } => self.fts(dir, *sorted),
            LibcOp::SpawnAppend { file, text } => {
                let script = format!("printf '%s' {text}");
                let r = spawn(
                    "/bin/sh",
                    &["sh", "-c", &script],
                    &[Action::Open(
                        1,
                        self.path(file),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
                    )],
                    None,
                );
                format!("{r}; {}", self.file_state(file))
            }
            LibcOp::SpawnStdin { src, dst } => {
                let mut actions = vec![Action::Open(0, self.path(src), libc::O_RDONLY)];
                match dst {
                    None => spawn_to_pipe("/bin/cat", &["cat"], &actions),
                    Some(d) => {
                        actions.push(Action::Open(
                            1,
                            self.path(d),
                            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                        ));
                        let r = spawn("/bin/cat", &["cat"], &actions, None);
                        format!("{r}; {}", self.file_state(d))
                    }
                }
            }
            LibcOp::SpawnChdir { dir, name, text } => {
                let script = format!("printf '%s' {text} > {name}");
                let r = spawn(
                    "/bin/sh",
                    &["sh", "-c", &script],
                    &[Action::Chdir(self.path(dir))],
                    None,
                );
                format!("{r}; {}", self.file_state(&join_rel(dir, name)))
            }
            LibcOp::Script {
                path,
                mode,
                via,
                status,
            } => self.script(path, *mode, *via, *status),
            LibcOp::Remove { path } => {
                let p = self.path(path);
                // SAFETY: p is a valid NUL-terminated string.
                match unsafe { libc::remove(p.as_ptr()) } {
                    0 => "0".into(),
                    _ => err(errno()),
                }
            }
            LibcOp::Lockf {
                path,
                writable,
                cmd,
                len,
            } => {
                let flags = if *writable {
                    libc::O_RDWR
                } else {
                    libc::O_RDONLY
                };
                let flags = flags | libc::O_NONBLOCK | libc::O_CLOEXEC;
                let fd = match sys::open(&self.path(path), flags, 0) {
                    Ok(fd) => fd,
                    Err(e) => return format!("open {}", err(e)),
                };
                // SAFETY: fd is open; lockf takes no pointers.
                let r = unsafe { libc::lockf(fd, *cmd, *len) };
                let r = if r == 0 { "0".into() } else { err(errno()) };
                let closed = sys::close(fd).map_or_else(err, |_| "0".into());
                format!("lockf {r}; close {closed}")
            }
            LibcOp::Special { path, kind } => {
                let p = self.path(path);
                // SAFETY: p is a valid NUL-terminated string.
                let r = unsafe {
                    match kind {
                        SpecialKind::Mkfifo => libc::mkfifo(p.as_ptr(), 0o644),
                        SpecialKind::MknodFifo => libc::mknod(p.as_ptr(), libc::S_IFIFO | 0o644, 0),
                        SpecialKind::MknodReg => libc::mknod(p.as_ptr(), libc::S_IFREG | 0o644, 0),
                    }
                };
                if r == 0 {
                    format!("0; {}", self.entry_state(path))
                } else {
                    err(errno())
                }
            }
            LibcOp::ForkWrite {
                path,
                data,
                stdio,
                quick_exit,
            } => self.fork_write(path, data, *stdio, *quick_exit),
        }
    }

    /// stat of a tree entry, as compared (type, mode, size of a file).
    fn entry_state(&self, rel: &str) -> String {
        match sys::lstat(&self.path(rel)) {
            Ok(st) => StatInfo::from_stat(&st).to_string(),
            Err(e) => format!("lstat {}", err(e)),
        }
    }

    /// A file's size and contents' digest, or why it cannot be read.
    fn file_state(&self, rel: &str) -> String {
        match read_nonblocking(&self.path(rel)) {
            Ok(b) => format!("{rel}: {} bytes (fnv {:016x})", b.len(), digest(&b)),
            Err(e) => format!("{rel}: {}", err(e)),
        }
    }

    /// chdir into `dir` of the tree for a relative op; Err(result) if that fails.
    fn enter(&self, dir: &str) -> Result<(), String> {
        sys::chdir(&self.path(dir))
            .map(drop)
            .map_err(|e| format!("chdir {}", err(e)))
    }

    fn temp_file(
        &self,
        kind: TempKind,
        dir: &str,
        relative: bool,
        data: &[u8],
        name: &str,
    ) -> String {
        let suffix = match kind {
            TempKind::Mkstemps(s) => s,
            _ => "",
        };
        let base = format!("tmpXXXXXX{suffix}");
        let template = if relative {
            if let Err(r) = self.enter(dir) {
                return r;
            }
            base.clone()
        } else {
            format!("{}/{base}", self.path(dir).to_string_lossy())
        };
        let mut buf = cstr(&template).into_bytes_with_nul();
        let tp = buf.as_mut_ptr().cast::<c_char>();
        // SAFETY: buf is a writable NUL-terminated template ending in XXXXXX (+ suffix).
        let fd = unsafe {
            match kind {
                TempKind::Mkstemp => libc::mkstemp(tp),
                TempKind::Mkostemp(fl) => libc::mkostemp(tp, fl),
                TempKind::Mkstemps(s) => libc::mkstemps(tp, s.len() as c_int),
            }
        };
        let result = if fd < 0 {
            err(errno())
        } else {
            let created = String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned();
            let shape = name_shape(&template, &created, 6 + suffix.len());
            let wrote = sys::write(fd, data).map_or_else(err, |n| n.to_string());
            let st = sys::fstat(fd).map_or_else(err, |st| StatInfo::from_stat(&st).to_string());
            // SAFETY: fd is open; F_GETFL/F_GETFD take no pointer.
            let (fl, fdfl) = unsafe {
                (
                    libc::fcntl(fd, libc::F_GETFL),
                    libc::fcntl(fd, libc::F_GETFD),
                )
            };
            let flags = format!(
                "{}{}",
                crate::ops::flags_text(fl & (libc::O_ACCMODE | libc::O_APPEND)),
                if fdfl & libc::FD_CLOEXEC != 0 {
                    " cloexec"
                } else {
                    ""
                }
            );
            let closed = sys::close(fd).map_or_else(err, |_| "0".into());
            let target = if relative {
                name.to_string()
            } else {
                format!("{}/{name}", self.path(dir).to_string_lossy())
            };
            let renamed =
                sys::rename(&cstr(&created), &cstr(&target)).map_or_else(err, |_| "0".into());
            format!(
                "fd, name {shape}, write {wrote}, {st}, {flags}, close {closed}, rename {renamed}"
            )
        };
        if relative {
            self.go_home();
        }
        result
    }

    fn temp_dir(&self, dir: &str, relative: bool, name: &str) -> String {
        let template = if relative {
            if let Err(r) = self.enter(dir) {
                return r;
            }
            "dXXXXXX".to_string()
        } else {
            format!("{}/dXXXXXX", self.path(dir).to_string_lossy())
        };
        let mut buf = cstr(&template).into_bytes_with_nul();
        // SAFETY: buf is a writable NUL-terminated template ending in XXXXXX.
        let r = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast::<c_char>()) };
        let result = if r.is_null() {
            err(errno())
        } else {
            let created = String::from_utf8_lossy(&buf[..buf.len() - 1]).into_owned();
            let shape = name_shape(&template, &created, 6);
            let st = sys::stat(&cstr(&created))
                .map_or_else(err, |st| StatInfo::from_stat(&st).to_string());
            let target = if relative {
                name.to_string()
            } else {
                format!("{}/{name}", self.path(dir).to_string_lossy())
            };
            let renamed =
                sys::rename(&cstr(&created), &cstr(&target)).map_or_else(err, |_| "0".into());
            format!("name {shape}, {st}, rename {renamed}")
        };
        if relative {
            self.go_home();
        }
        result
    }

    fn glob(&self, pattern: &str, flags: c_int, relative: bool) -> String {
        let full = if relative {
            if let Err(r) = self.enter("") {
                return r;
            }
            pattern.to_string()
        } else {
            format!("{}/{pattern}", self.root)
        };
        let p = cstr(&full);
        // SAFETY: glob_t is plain old data; all-zero is its documented initial state.
        let mut g: libc::glob_t = unsafe { std::mem::zeroed() };
        // SAFETY: p is NUL-terminated and g a valid glob_t; no error callback.
        let r = unsafe { libc::glob(p.as_ptr(), flags, None, &mut g) };
        let mut found: Vec<String> = (0..g.gl_pathc)
            // SAFETY: gl_pathv holds gl_pathc valid NUL-terminated strings.
            .map(|i| c_text(unsafe { *g.gl_pathv.add(i) }))
            .map(|s| if relative { s } else { self.rel(&s) })
            .collect();
        // SAFETY: g was filled by glob (or is still zeroed, which globfree accepts).
        unsafe { libc::globfree(&mut g) };
        if relative {
            self.go_home();
        }
        found.sort();
        let code = match r {
            0 => "0".to_string(),
            libc::GLOB_NOMATCH => "GLOB_NOMATCH".into(),
            libc::GLOB_ABORTED => "GLOB_ABORTED".into(),
            x => format!("glob error {x}"),
        };
        format!("{code} [{}]", found.join(" "))
    }

    /// nftw (flags given) or ftw: the entries sorted (directory order is file-system
    /// specific), and whether every entry came after (FTW_DEPTH) or before its directory.
    fn walk(&self, dir: &str, flags: Option<c_int>) -> String {
        let p = self.path(dir);
        WALK.with(|w| w.borrow_mut().clear());
        // SAFETY: p is NUL-terminated; the callbacks only record into WALK.
        let r = unsafe {
            match flags {
                Some(fl) => nftw(p.as_ptr(), nftw_cb, 8, fl),
                None => ftw(p.as_ptr(), ftw_cb, 8),
            }
        };
        let e = if r == -1 { errno() } else { 0 };
        let seen: Vec<(String, c_int, c_int)> = WALK.with(|w| std::mem::take(&mut *w.borrow_mut()));
        let depth_first = flags.is_some_and(|f| f & FTW_DEPTH != 0);
        let order = if order_ok(&seen, depth_first) {
            "order ok"
        } else {
            "ORDER WRONG"
        };
        let mut entries: Vec<String> = seen
            .iter()
            .map(|(path, t, level)| {
                let lv = if *level >= 0 {
                    format!(" L{level}")
                } else {
                    String::new()
                };
                format!("{}:{}{lv}", self.rel(path), ftw_type(*t))
            })
            .collect();
        entries.sort();
        let ret = if r == -1 { err(e) } else { r.to_string() };
        format!("{ret} {order} [{}]", entries.join(" "))
    }

    fn scandir(&self, dir: &str) -> String {
        let p = self.path(dir);
        let mut list: *mut *mut libc::dirent = std::ptr::null_mut();
        // SAFETY: p is NUL-terminated; list receives a malloc'd array of n malloc'd entries.
        let n = unsafe { scandir(p.as_ptr(), &mut list, None, Some(alphasort)) };
        if n < 0 {
            return err(errno());
        }
        let mut names = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // SAFETY: list has n valid entries, each freed once here, then the array.
            unsafe {
                let ent = *list.add(i);
                names.push(format!(
                    "{}:{}",
                    c_text((*ent).d_name.as_ptr()),
                    FileKind::from_d_type((*ent).d_type)
                ));
                libc::free(ent.cast());
            }
        }
        // SAFETY: the array itself, allocated by scandir.
        unsafe { libc::free(list.cast()) };
        format!("{n} [{}]", names.join(" "))
    }

    fn fts(&self, dir: &str, sorted: bool) -> String {
        let p = self.path(dir);
        let argv = [p.as_ptr().cast_mut(), std::ptr::null_mut()];
        let compar: Option<FtsCmp> = if sorted { Some(fts_by_name) } else { None };
        // SAFETY: argv is a NULL-terminated array of NUL-terminated paths that outlive the
        // stream.
        let fts = unsafe { fts_open(argv.as_ptr(), FTS_PHYSICAL | FTS_NOCHDIR, compar) };
        if fts.is_null() {
            return format!("fts_open {}", err(errno()));
        }
        let mut entries = Vec::new();
        let end = loop {
            sys::clear_errno();
            // SAFETY: fts is a valid stream; a returned entry is valid until the next read.
            let ent = unsafe { fts_read(fts) };
            if ent.is_null() {
                break errno();
            }
            // SAFETY: ent is a valid FTSENT (above).
            let (info, path, level, eno) = unsafe {
                (
                    (*ent).fts_info,
                    c_text((*ent).fts_path),
                    (*ent).fts_level,
                    (*ent).fts_errno,
                )
            };
            let e = if matches!(info, FTS_DNR | FTS_ERR | FTS_NS) {
                format!(" {}", errno_name(eno))
            } else {
                String::new()
            };
            entries.push(format!(
                "{}:{} L{level}{e}",
                self.rel(&path),
                fts_info_text(info)
            ));
        };
        // SAFETY: fts is valid and not used afterwards.
        let closed = unsafe { fts_close(fts) };
        if !sorted {
            entries.sort();
        }
        let end = if end == 0 { "end" } else { &err(end) };
        format!("{end}, close {closed} [{}]", entries.join(" "))
    }

    fn script(&self, rel: &str, mode: mode_t, via: Via, status: u8) -> String {
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
        let out = join_rel(dir, "out");
        let text = format!(
            "#!/bin/sh\nprintf '%s\\n' \"ran $#\" >> \"$(dirname \"$0\")/out\"\nexit {status}\n"
        );
        let p = self.path(rel);
        if let Err(e) = write_whole(&p, text.as_bytes(), mode) {
            return format!("write {}", err(e));
        }
        // The mode of an existing file is not changed by open(O_CREAT): set it.
        if let Err(e) = sys::chmod(&p, mode) {
            return format!("chmod {}", err(e));
        }
        let shown = p.to_string_lossy().into_owned();
        let r = match via {
            Via::Spawn => spawn(&shown, &[&shown, "x"], &[], None),
            Via::System => {
                // The shell's "Permission denied" goes nowhere; the status tells.
                let cmd = cstr(&format!("'{shown}' x y 2>/dev/null"));
                // SAFETY: cmd is NUL-terminated.
                let st = unsafe { libc::system(cmd.as_ptr()) };
                if st == -1 {
                    format!("system {}", err(errno()))
                } else {
                    format!("system {}", wait_text(st))
                }
            }
        };
        format!("{r}; {}", self.file_state(&out))
    }

    fn fork_write(&self, rel: &str, data: &[u8], stdio: bool, quick_exit: bool) -> String {
        let p = self.path(rel);
        let _ = std::io::stdout().flush();
        // SAFETY: the harness is single-threaded; the child makes only libc calls and ends
        // with exit/_exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return format!("fork {}", err(errno()));
        }
        if pid == 0 {
            // SAFETY: in the child: plain libc calls on valid buffers, then exit.
            unsafe {
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NONBLOCK;
                let fd = libc::open(p.as_ptr(), flags, 0o644);
                let ok = if fd < 0 {
                    false
                } else if stdio {
                    // All but the last bytes flushed, those left in the buffer: exit() writes
                    // them, _exit() loses them. (How much an unflushed stream holds depends on
                    // its buffer size, which is not specified: not compared.)
                    let f = libc::fdopen(fd, c"w".as_ptr());
                    let (head, tail) = data.split_at(data.len() - data.len().min(100));
                    !f.is_null()
                        && libc::fwrite(head.as_ptr().cast(), 1, head.len(), f) == head.len()
                        && libc::fflush(f) == 0
                        && libc::fwrite(tail.as_ptr().cast(), 1, tail.len(), f) == tail.len()
                } else {
                    libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize
                };
                let code = if ok { 0 } else { 3 };
                if quick_exit {
                    libc::_exit(code)
                } else {
                    libc::exit(code)
                }
            }
        }
        let mut st = 0;
        // SAFETY: waits for our own child; st is a valid int.
        let w = unsafe { libc::waitpid(pid, &mut st, 0) };
        let status = if w == pid {
            wait_text(st)
        } else {
            format!("waitpid {}", err(errno()))
        };
        format!("child {status}; {}", self.file_state(rel))
    }
}

fn join_rel(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether `created` is `template` with its `tail` last bytes' first six (the XXXXXX)
/// replaced by non-slash characters and the rest kept.
fn name_shape(template: &str, created: &str, tail: usize) -> String {
    let keep = template.len() - tail;
    let (t, c) = (template.as_bytes(), created.as_bytes());
    let ok = c.len() == t.len()
        && c[..keep] == t[..keep]
        && c[keep + 6..] == t[keep + 6..]
        && c[keep..keep + 6].iter().all(|&b| b.is_ascii_alphanumeric());
    if ok {
        "ok".into()
    } else {
        format!("WRONG ({created:?} from {template:?})")
    }
}

/// In the walk's order, each entry's directory came before it (pre-order), or after it
/// (FTW_DEPTH, post-order).
fn order_ok(seen: &[(String, c_int, c_int)], depth_first: bool) -> bool {
    seen.iter().enumerate().all(|(i, (path, _, _))| {
        let Some((parent, _)) = path.rsplit_once('/') else {
            return true;
        };
        match seen.iter().position(|(p, _, _)| p == parent) {
            None => true, // the walk's start
            Some(j) => (j > i) == depth_first,
        }
    })
}

/// "exit(N)" or "signal(N)" from a wait status.
fn wait_text(st: c_int) -> String {
    if libc::WIFEXITED(st) {
        format!("exit({})", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!("signal({})", libc::WTERMSIG(st))
    } else {
        format!("status {st:#x}")
    }
}

/// A whole file, opened with O_NONBLOCK: the tree holds FIFOs, whose plain open would wait
/// for a writer forever.
fn read_nonblocking(path: &CStr) -> Result<Vec<u8>, Errno> {
    let fd = sys::open(path, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC, 0)?;
    let mut out = Vec::new();
    let result = loop {
        match sys::read(fd, 1 << 20) {
            Ok(chunk) if chunk.is_empty() => break Ok(()),
            Ok(chunk) => out.extend_from_slice(&chunk),
            Err(e) => break Err(e),
        }
    };
    sys::close(fd)?;
    result.map(|()| out)
}

/// open(O_WRONLY|O_CREAT|O_TRUNC|O_NONBLOCK, mode) + write + close (O_NONBLOCK: a FIFO
/// without a reader is ENXIO, not a hang).
fn write_whole(path: &CStr, data: &[u8], mode: mode_t) -> Result<(), Errno> {
    let fd = sys::open(
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NONBLOCK | libc::O_CLOEXEC,
        mode,
    )?;
    let wrote = sys::write(fd, data);
    sys::close(fd)?;
    match wrote? {
        n if n == data.len() => Ok(()),
        _ => Err(libc::EIO),
    }
}

enum Action {
    /// addopen(fd, path, flags, 0644)
    Open(c_int, CString, c_int),
    /// adddup2(from, to)
    Dup2(c_int, c_int),
    /// addchdir_np(path)
    Chdir(CString),
}

/// posix_spawn(path, argv, actions) with the harness's environment, then waitpid:
/// "spawn 0 exit(N)" or "spawn -1 ERRNO". `close_after_spawn` is closed in the parent
/// right after the spawn (a pipe's write end).
fn spawn(
    path: &str,
    argv: &[&str],
    actions: &[Action],
    close_after_spawn: Option<c_int>,
) -> String {
    let path_c = cstr(path);
    let args: Vec<CString> = argv.iter().map(|a| cstr(a)).collect();
    let mut argp: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argp.push(std::ptr::null_mut());
    // SAFETY: posix_spawn_file_actions_t is plain old data, initialised by _init below.
    let mut fa: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
    // SAFETY: fa is valid; the paths are NUL-terminated and outlive the spawn (the actions
    // copy them anyway).
    unsafe {
        libc::posix_spawn_file_actions_init(&mut fa);
        // The children's complaints (sh: cannot create a: Is a directory) are not results.
        libc::posix_spawn_file_actions_addopen(
            &mut fa,
            2,
            c"/dev/null".as_ptr(),
            libc::O_WRONLY,
            0,
        );
        for a in actions {
            match a {
                Action::Open(fd, p, flags) => {
                    // O_NONBLOCK: a FIFO in the tree fails or reads empty instead of hanging.
                    let flags = *flags | libc::O_NONBLOCK;
                    libc::posix_spawn_file_actions_addopen(&mut fa, *fd, p.as_ptr(), flags, 0o644);
                }
                Action::Dup2(from, to) => {
                    libc::posix_spawn_file_actions_adddup2(&mut fa, *from, *to);
                }
                Action::Chdir(p) => {
                    libc::posix_spawn_file_actions_addchdir_np(&mut fa, p.as_ptr());
                }
            }
        }
    }
    let mut pid: libc::pid_t = 0;
    // SAFETY: argp is NULL-terminated; environ is the process's environment.
    let r = unsafe {
        libc::posix_spawn(
            &mut pid,
            path_c.as_ptr(),
            &fa,
            std::ptr::null(),
            argp.as_ptr(),
            environ,
        )
    };
    // SAFETY: fa was initialised above.
    unsafe { libc::posix_spawn_file_actions_destroy(&mut fa) };
    if let Some(fd) = close_after_spawn {
        let _ = sys::close(fd);
    }
    if r != 0 {
        return format!("spawn {}", err(r));
    }
    let mut st = 0;
    // SAFETY: waits for our own child.
    let w = unsafe { libc::waitpid(pid, &mut st, 0) };
    if w != pid {
        return format!("spawn 0 waitpid {}", err(errno()));
    }
    format!("spawn 0 {}", wait_text(st))
}

/// [`spawn`] with the child's stdout a pipe read to the end before the wait.
fn spawn_to_pipe(path: &str, argv: &[&str], actions: &[Action]) -> String {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return format!("pipe {}", err(errno()));
    }
    let (r, w) = (fds[0], fds[1]);
    // The child's end: dup2 onto fd 1 (clearing close-on-exec there).
    let mut all: Vec<Action> = actions
        .iter()
        .map(|a| match a {
            Action::Open(fd, p, fl) => Action::Open(*fd, p.clone(), *fl),
            Action::Dup2(a, b) => Action::Dup2(*a, *b),
            Action::Chdir(p) => Action::Chdir(p.clone()),
        })
        .collect();
    all.push(Action::Dup2(w, 1));
    // The reader runs beside the child: a child writing more than a pipe holds would block.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        loop {
            match sys::read(r, 1 << 16) {
                Ok(c) if c.is_empty() => break,
                Ok(c) => out.extend_from_slice(&c),
                Err(libc::EINTR) => continue,
                Err(_) => break,
            }
        }
        let _ = sys::close(r);
        out
    });
    let status = spawn(path, argv, &all, Some(w));
    let got = reader.join().unwrap_or_default();
    format!(
        "{status}; pipe {} bytes (fnv {:016x})",
        got.len(),
        digest(&got)
    )
}

// ---- the generator ------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Kind {
    WriteFile,
    Mkdir,
    TempFile,
    TempDir,
    Glob,
    Nftw,
    Ftw,
    Scandir,
    Fts,
    SpawnAppend,
    SpawnStdin,
    SpawnChdir,
    Script,
    Remove,
    Lockf,
    Special,
    ForkWrite,
}

const WEIGHTS: [(Kind, u32); 17] = [
    (Kind::WriteFile, 10),
    (Kind::Mkdir, 7),
    (Kind::TempFile, 8),
    (Kind::TempDir, 4),
    (Kind::Glob, 8),
    (Kind::Nftw, 4),
    (Kind::Ftw, 2),
    (Kind::Scandir, 3),
    (Kind::Fts, 4),
    (Kind::SpawnAppend, 3),
    (Kind::SpawnStdin, 3),
    (Kind::SpawnChdir, 3),
    (Kind::Script, 4),
    (Kind::Remove, 6),
    (Kind::Lockf, 3),
    (Kind::Special, 3),
    (Kind::ForkWrite, 3),
];

/// Deterministic: the same seed gives the same ops.
pub struct LibcGenerator {
    rng: StdRng,
    n: u64,
}

impl LibcGenerator {
    pub fn new(seed: u64) -> LibcGenerator {
        LibcGenerator {
            rng: StdRng::seed_from_u64(seed),
            n: 0,
        }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.gen_range(0..n)
    }

    /// A path 1..=depth components of a, b, c.
    fn path(&mut self, depth: usize) -> String {
        let d = self.rng.gen_range(1..=depth);
        (0..d)
            .map(|_| NAMES[self.below(3)])
            .collect::<Vec<_>>()
            .join("/")
    }

    /// A file path: up to 2 directories, then a file name.
    fn file(&mut self) -> String {
        let name = FILE_NAMES[self.below(FILE_NAMES.len())];
        match self.below(3) {
            0 => name.to_string(),
            _ => format!("{}/{name}", self.path(2)),
        }
    }

    /// A path for an op that takes files or directories.
    fn any_path(&mut self) -> String {
        if self.rng.gen_bool(0.5) {
            self.file()
        } else {
            self.path(2)
        }
    }

    /// A directory: the root ("") or a path of up to 2 components.
    fn dir(&mut self) -> String {
        if self.rng.gen_bool(0.3) {
            String::new()
        } else {
            self.path(2)
        }
    }

    fn text(&mut self) -> String {
        let n = self.rng.gen_range(1..=12);
        (0..n)
            .map(|_| char::from(b'a' + self.rng.gen_range(0..26u8)))
            .collect()
    }

    fn data(&mut self) -> Vec<u8> {
        let len = match self.rng.gen_range(0..10) {
            0 => 0,
            1..=6 => self.rng.gen_range(1..=200),
            _ => self.rng.gen_range(201..=70_000),
        };
        let mut d = vec![0u8; len];
        self.rng.fill(&mut d[..]);
        d
    }

    fn glob_pattern(&mut self) -> String {
        let prefix = ["", "", "a/", "b/", "a/*/", "*/", "*/*/"][self.below(7)];
        let last = [
            "*", "?", "[ab]", "a*", "[!a]*", "b", "zz*", "t*", "*/c", "out", "[fg]", "*/f",
        ][self.below(12)];
        format!("{prefix}{last}")
    }

    pub fn next_op(&mut self) -> LibcOp {
        self.n += 1;
        if let Some(dir) = PROLOGUE.get(self.n as usize - 1) {
            return LibcOp::Mkdir {
                path: dir.to_string(),
            };
        }
        let total: u32 = WEIGHTS.iter().map(|w| w.1).sum();
        let mut pick = self.rng.gen_range(0..total);
        let mut kind = Kind::WriteFile;
        for (k, w) in WEIGHTS {
            if pick < w {
                kind = k;
                break;
            }
            pick -= w;
        }
        match kind {
            Kind::WriteFile => LibcOp::WriteFile {
                path: self.file(),
                data: self.data(),
            },
            Kind::Mkdir => LibcOp::Mkdir { path: self.path(2) },
            Kind::TempFile => {
                let kind = match self.below(4) {
                    0 | 1 => TempKind::Mkstemp,
                    2 => TempKind::Mkostemp(
                        [
                            libc::O_APPEND,
                            libc::O_CLOEXEC,
                            libc::O_APPEND | libc::O_CLOEXEC,
                        ][self.below(3)],
                    ),
                    _ => TempKind::Mkstemps([".dat", ".h5", "x"][self.below(3)]),
                };
                LibcOp::TempFile {
                    kind,
                    dir: self.dir(),
                    relative: self.rng.gen_bool(0.4),
                    data: self.data(),
                    name: format!("t{}", self.n),
                }
            }
            Kind::TempDir => LibcOp::TempDir {
                dir: self.dir(),
                relative: self.rng.gen_bool(0.4),
                name: format!("t{}", self.n),
            },
            Kind::Glob => {
                let mut flags = 0;
                for bit in [
                    libc::GLOB_MARK,
                    libc::GLOB_ONLYDIR,
                    libc::GLOB_NOCHECK,
                    libc::GLOB_NOSORT,
                ] {
                    if self.rng.gen_bool(0.25) {
                        flags |= bit;
                    }
                }
                LibcOp::Glob {
                    pattern: self.glob_pattern(),
                    flags,
                    relative: self.rng.gen_bool(0.3),
                }
            }
            Kind::Nftw => {
                let mut flags = 0;
                for bit in [FTW_PHYS, FTW_DEPTH, FTW_MOUNT] {
                    if self.rng.gen_bool(0.5) {
                        flags |= bit;
                    }
                }
                LibcOp::Nftw {
                    dir: self.dir(),
                    flags,
                }
            }
            Kind::Ftw => LibcOp::Ftw { dir: self.dir() },
            Kind::Scandir => LibcOp::Scandir { dir: self.dir() },
            Kind::Fts => LibcOp::Fts {
                dir: self.dir(),
                sorted: self.rng.gen_bool(0.5),
            },
            Kind::SpawnAppend => LibcOp::SpawnAppend {
                file: self.file(),
                text: self.text(),
            },
            Kind::SpawnStdin => LibcOp::SpawnStdin {
                src: self.file(),
                dst: self.rng.gen_bool(0.5).then(|| self.file()),
            },
            Kind::SpawnChdir => LibcOp::SpawnChdir {
                dir: self.dir(),
                // Never a name of a, b, c: those may be FIFOs, and the shell's `>` would wait
                // for a reader forever.
                name: ["x", "y"][self.below(2)].to_string(),
                text: self.text(),
            },
            Kind::Script => {
                let dir = self.dir();
                LibcOp::Script {
                    path: join_rel(&dir, &format!("s{}.sh", self.below(3))),
                    mode: [0o755, 0o755, 0o700, 0o644][self.below(4)],
                    via: if self.rng.gen_bool(0.5) {
                        Via::Spawn
                    } else {
                        Via::System
                    },
                    status: [0, 0, 1, 7][self.below(4)],
                }
            }
            Kind::Remove => LibcOp::Remove {
                path: self.any_path(),
            },
            Kind::Lockf => LibcOp::Lockf {
                path: self.file(),
                writable: self.rng.gen_bool(0.75),
                cmd: [libc::F_LOCK, libc::F_TLOCK, libc::F_ULOCK, libc::F_TEST][self.below(4)],
                len: [0, 100][self.below(2)],
            },
            Kind::Special => LibcOp::Special {
                path: self.any_path(),
                kind: [
                    SpecialKind::Mkfifo,
                    SpecialKind::MknodFifo,
                    SpecialKind::MknodReg,
                ][self.below(3)],
            },
            Kind::ForkWrite => LibcOp::ForkWrite {
                path: self.file(),
                data: self.data(),
                stdio: self.rng.gen_bool(0.5),
                quick_exit: self.rng.gen_bool(0.5),
            },
        }
    }
}

// ---- the run ------------------------------------------------------------------------------

/// Whether (A, B) is the one intended difference: a FIFO that side A (the store) refuses
/// with EPERM.
fn intended_difference(op: &LibcOp, a: &str, b: &str) -> bool {
    matches!(
        op,
        LibcOp::Special {
            kind: SpecialKind::Mkfifo | SpecialKind::MknodFifo,
            ..
        }
    ) && a == "-1 EPERM"
        && b.starts_with("0;")
}

/// Runs the libc-level sequence (see the module docs).
pub fn run(cfg: &Config, mut trace: Option<&mut dyn Write>) -> Result<Summary, RunError> {
    if let Some(Sabotage::ShortWrite(_)) = cfg.sabotage {
        return Err(RunError::Setup(
            "--sabotage short-write is for the POSIX level; the libc level takes flip-byte".into(),
        ));
    }
    crate::make_root(&cfg.a)?;
    crate::make_root(&cfg.b)?;
    let a = LibcSide::new(&cfg.a);
    let b = LibcSide::new(&cfg.b);
    let mut summary = Summary {
        seed: cfg.seed,
        ..Summary::default()
    };
    let mut history = std::collections::VecDeque::new();
    let mut flip = cfg.sabotage;
    let mut generator = LibcGenerator::new(cfg.seed);
    crate::compare_trees(cfg, &mut summary, 0, &history)?;
    for n in 1..=cfg.ops {
        // Skipped calls are drawn and dropped, so the rest of the sequence stays put.
        let op = loop {
            let op = generator.next_op();
            if !cfg.skip.iter().any(|s| s == op.name()) {
                break op;
            }
        };
        let ra = a.exec(&op);
        let rb = b.exec(&op);
        *summary.op_counts.entry(op.name()).or_default() += 1;
        if let Some(e) = rb.strip_prefix("-1 ").or_else(|| rb.split(" -1 ").nth(1)) {
            let name = e.split([' ', ';', ',']).next().unwrap_or(e);
            *summary.errno_counts.entry(name.to_string()).or_default() += 1;
        }
        if let Some(t) = trace.as_mut() {
            let _ = writeln!(t, "#{n} {op} -> {rb}");
        }
        if ra != rb {
            if intended_difference(&op, &ra, &rb) {
                *summary.intended.entry("fifo-EPERM").or_default() += 1;
                if let LibcOp::Special { path, .. } = &op {
                    // Keep the trees comparable: side B loses the FIFO side A refused.
                    let _ = sys::unlink(&b.path(path));
                }
            } else {
                return Err(crate::mismatch(
                    cfg,
                    n,
                    op.to_string(),
                    ra,
                    rb,
                    None,
                    &history,
                ));
            }
        }
        history.push_back(format!("#{n} {op} -> {rb}"));
        if history.len() > crate::HISTORY {
            history.pop_front();
        }
        if let Some(Sabotage::FlipByte(at)) = flip {
            if n >= at && crate::flip_a_byte(&a.root) {
                flip = None;
            }
        }
        if cfg.check_every > 0 && n % cfg.check_every == 0 {
            crate::compare_trees(cfg, &mut summary, n, &history)?;
        }
    }
    crate::compare_trees(cfg, &mut summary, cfg.ops, &history)?;
    summary.ops = cfg.ops;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_ops() {
        let ops = |seed| {
            let mut g = LibcGenerator::new(seed);
            (0..300)
                .map(|_| g.next_op().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(5), ops(5));
        assert_ne!(ops(5), ops(6));
    }

    #[test]
    fn name_shapes() {
        assert_eq!(name_shape("/r/tmpXXXXXX.dat", "/r/tmpa1B2c3.dat", 10), "ok");
        assert!(name_shape("/r/tmpXXXXXX", "/r/tmpa1B2c", 6).starts_with("WRONG"));
        assert!(name_shape("/r/tmpXXXXXX", "/q/tmpa1B2c3", 6).starts_with("WRONG"));
    }

    #[test]
    fn walk_order() {
        let e = |p: &str| (p.to_string(), 0, 0);
        assert!(order_ok(&[e("/r"), e("/r/a"), e("/r/a/b")], false));
        assert!(!order_ok(&[e("/r"), e("/r/a"), e("/r/a/b")], true));
        assert!(order_ok(&[e("/r/a/b"), e("/r/a"), e("/r")], true));
    }
}
