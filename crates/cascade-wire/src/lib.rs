//! Cascade L1 on the wire: the staging protocol (docs/staging-protocol.md) and the client an
//! agent talks to staging servers with. The servers themselves (arenas, chunk store, drain)
//! live in `cascade-staging`, which builds on this crate; an agent links only this one.
//!
//! - [`auth`]: job credentials and the proofs of the handshake.
//! - [`protocol`]: frames, their bodies, encoders and decoders (both sides use them).
//! - [`client`]: a [`Connection`] to one server, and [`owner_of`], which server owns a chunk.
//! - [`status`]: the JSON a server answers a Status request with ([`ServerStatus`]).
//! - [`tls`]: TLS configs from PEM files, server names, the channel binding.

pub mod auth;
pub mod client;
pub mod protocol;
pub mod status;
pub mod tls;

pub use client::{owner_of, ClientOptions, Connection};
pub use status::ServerStatus;

/// Failures talking to a staging server; each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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

/// Lowercase hex of a BLAKE3 digest (the durable layout's checksum text; digests travel as
/// 32 bytes, the layout and the repository's recipes spell them in hex).
pub fn hex(digest: &[u8; 32]) -> String {
    blake3::Hash::from_bytes(*digest).to_hex().to_string()
}

/// Parses 64 hex characters into a digest.
pub fn unhex(text: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(text).ok().map(|h| *h.as_bytes())
}
