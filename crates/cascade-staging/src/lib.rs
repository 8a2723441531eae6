//! Cascade L1: staging servers (docs/staging.md).
//!
//! A staging server absorbs checkpoint files from compute-node agents into log-structured
//! arenas on its SSD (`engine`), acknowledges them once they are durable there, and drains
//! them to the durable tier in the background (`server`). Agents talk to it with the binary
//! protocol of the `cascade-wire` crate. With dedup, agents send chunks instead of files:
//! each server keeps the chunks whose scores it owns (`cascade_wire::owner_of`) in `chunks`
//! and pushes them into the durable store's dedup repository.
//!
//! The protocol, the client and the client's error type are re-exported here
//! (`cascade_staging::{protocol, client, Connection, Error, ...}`) for callers that have not
//! moved to `cascade_wire` yet.

pub mod chunks;
pub mod engine;
pub mod server;

pub use cascade_wire::{
    auth, client, hex, host_name, owner_of, protocol, tls, unhex, ClientOptions, Connection, Error,
    Result, ServerStatus,
};
pub use server::{Server, ServerOptions, Stopper};

/// Failures running a staging server; each displays as one line. (The client's failures
/// are [`Error`], from `cascade_wire`.)
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Engine(#[from] engine::Error),
    #[error("{0}")]
    Durable(#[from] cascade_durable::Error),
    #[error("{0}")]
    Repo(#[from] cascade_dedup::repo::Error),
    /// A request the server cannot carry out (a recipe whose digests are not hex, no
    /// repository for a namespace, ...).
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// Staged bytes that do not hash to what their client sent.
    #[error("staging server {server}: {why}")]
    Mismatch { server: String, why: String },
    #[error("{0}")]
    Config(String),
}

impl ServerError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ServerError {
        ServerError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type ServerResult<T> = std::result::Result<T, ServerError>;

/// `namespace/key`, or `key` with no namespace.
pub fn namespaced(namespace: &str, key: &str) -> String {
    if namespace.is_empty() {
        key.to_string()
    } else {
        format!("{namespace}/{key}")
    }
}
