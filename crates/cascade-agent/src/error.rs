use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the agent; every one displays as one line.
#[derive(Debug, Error)]
pub enum Error {
    /// A node-store operation failed on `path`.
    #[error("{message}")]
    Store {
        path: String,
        message: String,
        source: cascade_store::Error,
    },
    /// A durable-store operation failed (the message names the store and the file).
    #[error("{0}")]
    Durable(cascade_durable::Error),
    /// Nothing of the checkpoint is in the durable store (or the store itself is missing).
    #[error("{store}: no checkpoint {checkpoint}: {why}")]
    NoCheckpoint {
        store: String,
        checkpoint: String,
        why: String,
    },
    /// The checkpoint has no completion marker: it never finished draining.
    #[error("{store}: checkpoint {checkpoint} is not complete (no {marker} marker); refusing to restore it")]
    Incomplete {
        store: String,
        checkpoint: String,
        marker: &'static str,
    },
    /// A checkpoint of several nodes whose parts are not all durable.
    #[error("{store}: checkpoint {checkpoint} is not complete ({parts}); refusing to restore it")]
    IncompleteJob {
        store: String,
        checkpoint: String,
        parts: String,
    },
    #[error("{path}: not a checkpoint: {reason}")]
    InvalidCheckpoint { path: String, reason: String },
    /// A local file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A file changed size while it was being read, or the marker disagrees with the data.
    #[error("{path}: {reason}")]
    Mismatch { path: String, reason: String },
    /// Gave up waiting.
    #[error("timed out {what}")]
    Timeout { what: String },
    /// The dedup repository failed (the message names the object or blob).
    #[error("dedup repository: {0}")]
    Dedup(#[from] cascade_dedup::repo::Error),
}

impl Error {
    pub(crate) fn store(path: &str, source: cascade_store::Error) -> Error {
        let text = cascade_store::errno_text(source.errno());
        let context = source.context();
        let message = if context.is_empty()
            || context.trim_start_matches('/') == path.trim_start_matches('/')
        {
            format!("{path}: {text}")
        } else {
            format!("{path}: {text} ({context})")
        };
        Error::Store {
            path: path.to_string(),
            message,
            source,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// The errno that best describes the error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Store { source, .. } => source.errno(),
            Error::Durable(e) => e.errno(),
            Error::Incomplete { .. } | Error::IncompleteJob { .. } | Error::NoCheckpoint { .. } => {
                libc::ENOENT
            }
            Error::InvalidCheckpoint { .. } => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Mismatch { .. } => libc::EIO,
            Error::Timeout { .. } => libc::ETIMEDOUT,
            Error::Dedup(e) => e.errno(),
        }
    }
}
