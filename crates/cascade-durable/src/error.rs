//! Errors of the durable tier: each one displays as a single line that names the store or the
//! file, and maps to an errno for callers that speak POSIX (the interposition library, FUSE).

/// Result of every durable-tier operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, with enough context to print as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store spec or an option is malformed.
    #[error("durable store: invalid spec {spec:?}: {reason}")]
    Config { spec: String, reason: String },
    /// A relative path is not usable in the durable layout.
    #[error("durable store: invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    /// The server rejected the credentials (wrong access key or secret) or denied access.
    #[error("durable store {store}: access denied (wrong access key or secret, or no permission): {detail}")]
    Auth { store: String, detail: String },
    /// The bucket named in the spec does not exist.
    #[error("durable store {store}: bucket {bucket:?} does not exist")]
    NoBucket { store: String, bucket: String },
    /// The endpoint could not be reached at all.
    #[error("durable store {store}: cannot reach the endpoint: {detail}")]
    Unreachable { store: String, detail: String },
    /// The local directory cannot be created or written.
    #[error("durable store {store}: directory is not writable: {detail}")]
    NotWritable { store: String, detail: String },
    /// The object does not exist.
    #[error("durable store {store}: {path}: no such file")]
    NotFound { store: String, path: String },
    /// The data does not match its recorded BLAKE3 checksum.
    #[error("durable store {store}: {path}: corrupt: BLAKE3 {actual} does not match the recorded {expected}")]
    Corrupt {
        store: String,
        path: String,
        expected: String,
        actual: String,
    },
    /// The checksum object beside a file is missing or unreadable.
    #[error("durable store {store}: {path}: {reason}")]
    BadChecksum {
        store: String,
        path: String,
        reason: String,
    },
    /// A source gave fewer bytes than announced.
    #[error("durable store {store}: {path}: source ended after {got} of {expected} bytes")]
    ShortSource {
        store: String,
        path: String,
        got: u64,
        expected: u64,
    },
    /// A local file could not be read or written.
    #[error("durable store: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Any other failure of the store, with the operation and path.
    #[error("durable store {store}: {op} {path}: {detail}")]
    Store {
        store: String,
        op: &'static str,
        path: String,
        detail: String,
    },
}

impl Error {
    /// The errno a POSIX caller should see for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Config { .. } | Error::InvalidPath { .. } => libc::EINVAL,
            Error::Auth { .. } | Error::NotWritable { .. } => libc::EACCES,
            Error::NoBucket { .. } | Error::NotFound { .. } => libc::ENOENT,
            Error::Unreachable { .. } => libc::EHOSTUNREACH,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. }
            | Error::BadChecksum { .. }
            | Error::ShortSource { .. }
            | Error::Store { .. } => libc::EIO,
        }
    }

    /// True for a missing object (ENOENT), as opposed to a store that does not work.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Makes an error text from a library fit on one short line.
pub(crate) fn one_line(text: &str) -> String {
    const MAX: usize = 300;
    let mut out = String::with_capacity(text.len().min(MAX + 3));
    let mut last_space = false;
    for c in text.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' && last_space {
            continue;
        }
        last_space = c == ' ';
        if out.len() >= MAX {
            out.push_str("...");
            break;
        }
        out.push(c);
    }
    out.trim().to_string()
}

/// The text of an error and all its sources, for classification and messages.
pub(crate) fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The useful part of an object_store error text: the S3 error code and message when the
/// server sent an XML error body, else the text after the request description.
pub(crate) fn short_detail(text: &str) -> String {
    let tag = |name: &str| -> Option<&str> {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&close)? + start;
        Some(&text[start..end])
    };
    if let Some(code) = tag("Code") {
        return match tag("Message") {
            Some(message) => format!("{code}: {message}"),
            None => code.to_string(),
        };
    }
    match text.rfind(" - ") {
        Some(i) => text[i + 3..].to_string(),
        None => text.to_string(),
    }
}
