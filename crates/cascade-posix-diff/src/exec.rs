//! Performing an operation on one side, and what comes back.

use std::fmt;

use libc::c_int;

use crate::ops::{FdRef, Op, SLOTS};
use crate::sys::{self, errno_name, DirEntry, Errno};

/// The type of a file, from st_mode or d_type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FileKind {
    File,
    Dir,
    /// Any other type: the raw S_IFMT bits or d_type value.
    Other(u32),
}

impl FileKind {
    pub fn from_mode(mode: libc::mode_t) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            other => FileKind::Other(other),
        }
    }

    pub fn from_d_type(d_type: u8) -> FileKind {
        match d_type {
            libc::DT_REG => FileKind::File,
            libc::DT_DIR => FileKind::Dir,
            other => FileKind::Other(u32::from(other)),
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileKind::File => write!(f, "file"),
            FileKind::Dir => write!(f, "dir"),
            FileKind::Other(x) => write!(f, "type({x:#o})"),
        }
    }
}

/// The parts of a struct stat that must agree: type and permission bits always; size and
/// link count for regular files (a directory's size and link count are file-system specific).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatInfo {
    pub kind: FileKind,
    pub perm: u32,
    pub size: Option<i64>,
    pub nlink: Option<u64>,
}

impl StatInfo {
    pub fn from_stat(st: &libc::stat) -> StatInfo {
        let kind = FileKind::from_mode(st.st_mode);
        let file = kind == FileKind::File;
        StatInfo {
            kind,
            perm: st.st_mode & 0o7777,
            size: file.then_some(st.st_size),
            nlink: file.then_some(st.st_nlink),
        }
    }
}

impl fmt::Display for StatInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mode={:04o}", self.kind, self.perm)?;
        if let Some(size) = self.size {
            write!(f, " size={size}")?;
        }
        if let Some(nlink) = self.nlink {
            write!(f, " nlink={nlink}")?;
        }
        Ok(())
    }
}

/// A successful result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// The integer a call returned (0 for most calls).
    Int(i64),
    /// A new fd (the number itself differs between the sides and is not compared).
    NewFd,
    /// A byte count (write).
    Count(usize),
    /// A file offset (lseek).
    Offset(i64),
    /// The bytes read; their number is the return value.
    Bytes(Vec<u8>),
    Stat(StatInfo),
    /// A directory listing, sorted, with d_type.
    Listing(Vec<(String, FileKind)>),
}

/// FNV-1a, to name a block of bytes in a report.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::NewFd => write!(f, "fd"),
            Value::Count(n) => write!(f, "{n}"),
            Value::Offset(n) => write!(f, "{n}"),
            Value::Bytes(b) => write!(f, "{} bytes (fnv {:016x})", b.len(), digest(b)),
            Value::Stat(s) => write!(f, "{s}"),
            Value::Listing(entries) => {
                let names: Vec<String> = entries
                    .iter()
                    .map(|(n, k)| {
                        let n = if n.len() > 16 {
                            format!(
                                "{}…({} bytes)",
                                n.chars().take(4).collect::<String>(),
                                n.len()
                            )
                        } else {
                            n.clone()
                        };
                        format!("{n}:{k}")
                    })
                    .collect();
                write!(f, "[{}]", names.join(" "))
            }
        }
    }
}

/// A call's result: a value, or -1 with an errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Value),
    Err(Errno),
}

impl Outcome {
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Outcome::Err(e) => Some(*e),
            Outcome::Ok(_) => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok(v) => write!(f, "{v}"),
            Outcome::Err(e) => write!(
                f,
                "-1 {} ({})",
                errno_name(*e),
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

fn outcome<T>(result: Result<T, Errno>, value: impl FnOnce(T) -> Value) -> Outcome {
    match result {
        Ok(v) => Outcome::Ok(value(v)),
        Err(e) => Outcome::Err(e),
    }
}

fn listing(result: Result<Vec<DirEntry>, Errno>) -> Outcome {
    outcome(result, |entries| {
        Value::Listing(
            entries
                .into_iter()
                .map(|(n, t)| (n, FileKind::from_d_type(t)))
                .collect(),
        )
    })
}

/// One directory tree and the fds the harness holds in it.
pub struct Side {
    pub root: String,
    fds: [Option<c_int>; SLOTS],
}

impl Side {
    pub fn new(root: &str) -> Side {
        Side {
            root: root.trim_end_matches('/').to_string(),
            fds: [None; SLOTS],
        }
    }

    pub fn slot_fd(&self, slot: usize) -> Option<c_int> {
        self.fds[slot]
    }

    fn fd(&self, r: FdRef) -> c_int {
        match r {
            FdRef::Slot(s) => self.fds[s].expect("the generator picks open slots only"),
            FdRef::Bad(n) => n,
        }
    }

    /// Performs `op`. With `short_write`, a write-type op writes one byte less than asked
    /// (a deliberate fault for the harness's own negative test).
    pub fn exec(&mut self, op: &Op, short_write: bool) -> Outcome {
        let path = |rel: &str| sys::join(&self.root, rel);
        let trim = |data: &[u8]| -> usize {
            if short_write {
                data.len().saturating_sub(1)
            } else {
                data.len()
            }
        };
        match op {
            Op::Open {
                path: rel,
                flags,
                mode,
                slot,
            } => {
                let result = sys::open(&path(rel), *flags, *mode);
                self.took_fd(*slot, result)
            }
            Op::OpenAt {
                dir,
                path: rel,
                flags,
                mode,
                slot,
            } => {
                // An absolute path would make openat ignore the directory fd and leave the
                // tree (the generator never makes one).
                assert!(!rel.starts_with('/'), "openat path {rel:?} is absolute");
                let rel = std::ffi::CString::new(rel.as_str()).expect("no NUL in paths");
                let result = sys::openat(self.fd(*dir), &rel, *flags, *mode);
                self.took_fd(*slot, result)
            }
            Op::Close { fd } => {
                let result = sys::close(self.fd(*fd));
                if let FdRef::Slot(s) = fd {
                    // Linux releases the fd even when close reports an error.
                    self.fds[*s] = None;
                }
                outcome(result, |r| Value::Int(r.into()))
            }
            Op::Read { fd, len } => outcome(sys::read(self.fd(*fd), *len), Value::Bytes),
            Op::Pread { fd, len, offset } => {
                outcome(sys::pread(self.fd(*fd), *len, *offset), Value::Bytes)
            }
            Op::Readv { fd, lens } => outcome(sys::readv(self.fd(*fd), lens), Value::Bytes),
            Op::Write { fd, data } => {
                outcome(sys::write(self.fd(*fd), &data[..trim(data)]), Value::Count)
            }
            Op::Pwrite { fd, data, offset } => outcome(
                sys::pwrite(self.fd(*fd), &data[..trim(data)], *offset),
                Value::Count,
            ),
            Op::Writev { fd, chunks } => {
                let mut parts: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                if short_write {
                    if let Some(last) = parts.iter_mut().rev().find(|c| !c.is_empty()) {
                        *last = &last[..last.len() - 1];
                    }
                }
                outcome(sys::writev(self.fd(*fd), &parts), Value::Count)
            }
            Op::Lseek { fd, offset, whence } => {
                outcome(sys::lseek(self.fd(*fd), *offset, *whence), Value::Offset)
            }
            Op::Ftruncate { fd, len } => {
                outcome(sys::ftruncate(self.fd(*fd), *len), |r| Value::Int(r.into()))
            }
            Op::Truncate { path: rel, len } => {
                outcome(sys::truncate(&path(rel), *len), |r| Value::Int(r.into()))
            }
            Op::Fstat { fd } => outcome(sys::fstat(self.fd(*fd)), |st| {
                Value::Stat(StatInfo::from_stat(&st))
            }),
            Op::Stat { path: rel } => outcome(sys::stat(&path(rel)), |st| {
                Value::Stat(StatInfo::from_stat(&st))
            }),
            Op::Lstat { path: rel } => outcome(sys::lstat(&path(rel)), |st| {
                Value::Stat(StatInfo::from_stat(&st))
            }),
            Op::Rename { from, to } => outcome(sys::rename(&path(from), &path(to)), |r| {
                Value::Int(r.into())
            }),
            Op::Unlink { path: rel } => outcome(sys::unlink(&path(rel)), |r| Value::Int(r.into())),
            Op::Mkdir { path: rel, mode } => {
                outcome(sys::mkdir(&path(rel), *mode), |r| Value::Int(r.into()))
            }
            Op::Rmdir { path: rel } => outcome(sys::rmdir(&path(rel)), |r| Value::Int(r.into())),
            Op::ListDir { path: rel } => listing(sys::list_dir(&path(rel))),
            Op::ListFd { fd } => listing(sys::list_fd(self.fd(*fd))),
            Op::Dup { fd, slot } => {
                let result = sys::dup(self.fd(*fd));
                self.took_fd(*slot, result)
            }
            Op::Dup2 { fd, target } => {
                let target_fd = self.fd(FdRef::Slot(*target));
                match sys::dup2(self.fd(*fd), target_fd) {
                    Ok(r) if r == target_fd => Outcome::Ok(Value::NewFd),
                    // dup2 must return its second argument; anything else is shown as is.
                    Ok(r) => Outcome::Ok(Value::Int(r.into())),
                    Err(e) => Outcome::Err(e),
                }
            }
            Op::Fsync { fd } => outcome(sys::fsync(self.fd(*fd)), |r| Value::Int(r.into())),
            Op::SetAppend { fd, on } => {
                outcome(sys::set_append(self.fd(*fd), *on), |r| Value::Int(r.into()))
            }
            Op::Access { path: rel, mode } => {
                outcome(sys::access(&path(rel), *mode), |r| Value::Int(r.into()))
            }
        }
    }

    fn took_fd(&mut self, slot: usize, result: Result<c_int, Errno>) -> Outcome {
        match result {
            Ok(fd) => {
                self.fds[slot] = Some(fd);
                Outcome::Ok(Value::NewFd)
            }
            Err(e) => Outcome::Err(e),
        }
    }
}
