//! Cascade L1: staging servers and their client (docs/staging.md).
//!
//! A staging server absorbs checkpoint files from compute-node agents into log-structured
//! arenas on its SSD (`engine`), acknowledges them once they are durable there, and drains
//! them to the durable tier in the background (`server`). Agents talk to it with the binary
//! protocol in `protocol` through `client`. With dedup, agents send chunks instead of files:
//! each server keeps the chunks whose scores it owns (`client::owner_of`) in `chunks` and
//! pushes them into the durable store's dedup repository.

pub mod chunks;
pub mod client;
pub mod engine;
pub mod protocol;
pub mod server;

pub use client::{owner_of, ClientOptions, Connection};
pub use server::{Server, ServerOptions, ServerStatus, Stopper};

/// Failures talking to or running a staging server; each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Engine(#[from] engine::Error),
    #[error("{0}")]
    Durable(#[from] cascade_durable::Error),
    #[error("{0}")]
    Repo(#[from] cascade_dedup::repo::Error),
    /// An argument the client library cannot send (a recipe whose digests are not hex, ...).
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The server answered with an Error frame.
    #[error("staging server {server} refused: {message}")]
    Refused {
        server: String,
        code: u16,
        message: String,
    },
    /// The peer broke the protocol.
    #[error("staging server {server}: {why}")]
    Protocol { server: String, why: String },
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// The server said it has no room: try another one.
    pub fn is_full(&self) -> bool {
        matches!(self, Error::Refused { code, .. } if *code == protocol::code::FULL)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// This machine's host name ("localhost" if it cannot be read): server names, client names
/// in server logs, staging groups.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// `namespace/key`, or `key` with no namespace.
pub fn namespaced(namespace: &str, key: &str) -> String {
    if namespace.is_empty() {
        key.to_string()
    } else {
        format!("{namespace}/{key}")
    }
}

/// Lowercase hex of a BLAKE3 digest (the durable layout's checksum text).
pub fn hex(digest: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*digest).to_hex().to_string()
}

/// Parses 64 hex characters into a digest.
pub fn unhex(text: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(text).ok().map(|h| *h.as_bytes())
}
