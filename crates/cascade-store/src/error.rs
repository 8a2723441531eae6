//! Errors carry an errno so the interposition library can hand callers exactly what the
//! kernel would, plus a short context (usually the path) for one-line CLI messages.

use std::fmt;

/// A store error: an errno value and what it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    context: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(errno: i32, context: impl Into<String>) -> Self {
        Error {
            errno,
            context: context.into(),
        }
    }

    /// The errno a POSIX call would have failed with.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    pub fn context(&self) -> &str {
        &self.context
    }

    /// Wraps the current `errno` (after a failed libc call).
    pub fn last_os(context: impl Into<String>) -> Self {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        Error::new(errno, context)
    }

    pub fn from_io(err: &std::io::Error, context: impl Into<String>) -> Self {
        Error::new(err.raw_os_error().unwrap_or(libc::EIO), context)
    }

    /// A value read from the shared block breaks an invariant (docs/store-layout.md,
    /// "Validation"): EIO, naming what was wrong. `cascade fsck` reports the same damage.
    pub(crate) fn damaged(what: impl fmt::Display) -> Self {
        Error::new(libc::EIO, format!("store block is damaged: {what}"))
    }
}

/// The text the C library gives for an errno, e.g. "No such file or directory".
pub fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno)
        .to_string()
        .split(" (os error")
        .next()
        .unwrap_or("unknown error")
        .to_string()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}", errno_text(self.errno))
        } else {
            write!(f, "{}: {}", self.context, errno_text(self.errno))
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(
            std::io::Error::from_raw_os_error(e.errno).kind(),
            e.to_string(),
        )
    }
}
