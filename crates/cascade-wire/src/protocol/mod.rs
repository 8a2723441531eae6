//! The staging wire protocol (docs/staging-protocol.md): length-prefixed, versioned binary
//! frames on TCP. Every frame is a 16-byte header and a body of at most [`MAX_BODY`] bytes.
//!
//! Decoding never trusts a length: the header's body length is checked against
//! [`MAX_BODY`] before anything is allocated, and every field inside a body is checked
//! against the bytes actually present. Bodies borrow from the caller's buffer, so a Write's
//! data is never copied by the decoder.

use std::io::{self, IoSlice, Read, Write};

pub use cascade_dedup::repo::format::{BlobKind, DeltaBase, Stored};
pub use cascade_dedup::Score;

mod body;
mod dedup;
mod reply;
mod request;
#[cfg(test)]
mod tests;

pub use body::BodyWriter;
pub use dedup::*;
pub use reply::*;
pub use request::*;

pub use crate::auth::TAG_LEN;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CSTG";
/// The protocol version this build speaks (header byte 4).
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 16;
/// Largest data payload of one Write or Read reply.
pub const MAX_DATA: usize = 16 << 20;
/// Largest body: a full data payload plus room for segment headers.
pub const MAX_BODY: usize = MAX_DATA + (1 << 20);
/// Longest key (a relative path) and longest other string.
pub const MAX_KEY: usize = 4096;
/// Most segments in one Write, queries in one Pull, files in one Push.
pub const MAX_ITEMS: usize = 65_536;
pub const BLAKE3_LEN: usize = 32;

/// Message kinds (header byte 5). Replies are the request's kind | 0x80.
pub mod kind {
    pub const HELLO: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const SYNC: u8 = 3;
    pub const READ: u8 = 4;
    pub const PUSH: u8 = 5;
    pub const PULL: u8 = 6;
    pub const PING: u8 = 7;
    pub const GOODBYE: u8 = 8;
    pub const STATUS: u8 = 9;
    /// Dedup (docs/staging-protocol.md, "Dedup messages"): which scores the server lacks.
    pub const LACKS: u8 = 0x0A;
    pub const PUT_CHUNKS: u8 = 0x0B;
    pub const PUT_MANIFEST: u8 = 0x0C;
    pub const GET_CHUNKS: u8 = 0x0D;
    pub const GET_MANIFEST: u8 = 0x0E;
    /// The client's proof after the server's challenge (the reply to Hello).
    pub const AUTH: u8 = 0x0F;
    /// A long poll: answered once the server's event counter passes the client's, or after
    /// the wait asked for (docs/staging-protocol.md, "Watch").
    pub const WATCH: u8 = 0x10;
    pub const REPLY: u8 = 0x80;
    pub const ERROR: u8 = 0xFF;
}

/// Error codes carried by an Error frame.
pub mod code {
    pub const BAD_FRAME: u16 = 1;
    pub const VERSION: u16 = 2;
    pub const AUTH: u16 = 3;
    pub const BAD_PATH: u16 = 4;
    pub const NOT_FOUND: u16 = 5;
    pub const FULL: u16 = 6;
    pub const IO: u16 = 7;
    pub const CORRUPT: u16 = 8;
    pub const INVALID: u16 = 9;
    pub const SHUTTING_DOWN: u16 = 10;
    /// A PutChunks chunk whose bytes are not its score (or do not decompress to its raw
    /// length): nothing of that frame was stored.
    pub const BAD_CHUNK: u16 = 11;
    /// A PutChunks delta blob whose base the durable repository does not hold as a usable
    /// base (absent, being deleted, or too deep a chain): nothing of that frame was stored;
    /// send those chunks whole.
    pub const BASE_UNKNOWN: u16 = 12;
    /// The server serves as many connections as it may, in total or from this client's
    /// address: sent (request id 0) instead of reading anything, then the connection is
    /// closed. Try again later, or another server.
    pub const BUSY: u16 = 13;
}

/// Why a frame could not be decoded. Every variant means: reply Error(BAD_FRAME or
/// VERSION) and close the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not a Cascade staging frame (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("protocol version {0} is not supported (this build speaks {VERSION})")]
    Version(u8),
    #[error("frame body of {0} bytes exceeds the limit of {MAX_BODY}")]
    TooLarge(u32),
    #[error("unknown message kind {0:#04x}")]
    Kind(u8),
    #[error("malformed {what}: {why}")]
    Malformed { what: &'static str, why: String },
    #[error("bad path {path:?}: {why}")]
    BadPath { path: String, why: &'static str },
}

impl FrameError {
    pub fn code(&self) -> u16 {
        match self {
            FrameError::Version(_) => code::VERSION,
            FrameError::BadPath { .. } => code::BAD_PATH,
            _ => code::BAD_FRAME,
        }
    }
}

/// The fixed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub body_len: u32,
    /// Chosen by the requester, echoed in the reply.
    pub request: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = self.kind;
        // 6..8: flags, zero in version 1.
        h[8..12].copy_from_slice(&self.body_len.to_le_bytes());
        h[12..16].copy_from_slice(&self.request.to_le_bytes());
        h
    }

    /// Checks magic, version and length; the body is not read.
    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let magic = [h[0], h[1], h[2], h[3]];
        if magic != MAGIC {
            return Err(FrameError::Magic(magic));
        }
        if h[4] != VERSION {
            return Err(FrameError::Version(h[4]));
        }
        let body_len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if body_len as usize > MAX_BODY {
            return Err(FrameError::TooLarge(body_len));
        }
        Ok(Header {
            kind: h[5],
            body_len,
            request: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        })
    }
}

/// A read failure: the connection broke, or the peer sent something that is not a frame.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Reads one frame; its body lands in `body[..header.body_len]`. `body` is reused between
/// calls and only ever grows (to at most [`MAX_BODY`]), so a pre-faulted buffer is not
/// cleared or touched beyond the bytes received. Ok(None) on a clean end of stream before a
/// header.
pub fn read_frame(r: &mut impl Read, body: &mut Vec<u8>) -> Result<Option<Header>, RecvError> {
    let Some(header) = read_header(r)? else {
        return Ok(None);
    };
    let n = header.body_len as usize;
    if body.len() < n {
        body.resize(n, 0);
    }
    r.read_exact(&mut body[..n])?;
    Ok(Some(header))
}

/// Reads and checks one frame header (the body is left in the stream). Ok(None) on a clean
/// end of stream.
pub fn read_header(r: &mut impl Read) -> Result<Option<Header>, RecvError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Header::decode(&h)?))
}

/// A TCP stream written with `MSG_NOSIGNAL`, so a peer that went away is an EPIPE error
/// rather than a SIGPIPE that kills the process (std's `writev` path does not set it).
pub struct NoSigPipe<'a>(pub &'a std::net::TcpStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_with_flags(buf, libc::MSG_NOSIGNAL)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes a header and body slices with vectored writes (no copy of the slices).
pub fn write_frame(w: &mut impl Write, header: Header, body: &[&[u8]]) -> io::Result<()> {
    let h = header.encode();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(body.len() + 1);
    parts.push(&h);
    parts.extend(body.iter().copied().filter(|b| !b.is_empty()));
    write_all_vectored(w, &parts)
}

/// At most this many slices per `writev` (Linux's IOV_MAX; std caps it there anyway).
const MAX_IOV: usize = 1024;

/// `write_all` over `parts` with vectored writes (what the unstable
/// `Write::write_all_vectored` does), at most [`MAX_IOV`] slices per call.
fn write_all_vectored(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    // parts[first][skip..] is the first byte not yet written.
    let (mut first, mut skip) = (0, 0);
    let mut slices: Vec<IoSlice> = Vec::with_capacity(parts.len().min(MAX_IOV));
    while first < parts.len() {
        slices.clear();
        slices.push(IoSlice::new(&parts[first][skip..]));
        slices.extend(
            parts[first + 1..]
                .iter()
                .take(MAX_IOV - 1)
                .map(|p| IoSlice::new(p)),
        );
        match w.write_vectored(&slices) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(mut n) => {
                while first < parts.len() && n >= parts[first].len() - skip {
                    n -= parts[first].len() - skip;
                    first += 1;
                    skip = 0;
                }
                skip += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Checks that `key` stays inside the job's namespace: relative, no empty, `.` or `..`
/// components, no NUL or other control character (the durable tier refuses them, so such
/// a file could never drain), at most [`MAX_KEY`] bytes.
pub fn check_key(key: &str) -> Result<(), FrameError> {
    let bad = |why| {
        Err(FrameError::BadPath {
            path: key.chars().take(200).collect(),
            why,
        })
    };
    if key.is_empty() {
        return bad("empty");
    }
    if key.len() > MAX_KEY {
        return bad("too long");
    }
    if key.starts_with('/') {
        return bad("absolute paths are not allowed");
    }
    if key.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    for part in key.split('/') {
        match part {
            "" => return bad("empty path component"),
            "." | ".." => return bad("`.` and `..` are not allowed"),
            _ => {}
        }
    }
    Ok(())
}

/// Kinds whose bodies may exceed the 64 KiB the server allows other frames (it receives
/// them into its pool of `MAX_BODY` buffers).
pub fn is_large_kind(k: u8) -> bool {
    matches!(
        k,
        kind::WRITE
            | kind::PUSH
            | kind::LACKS
            | kind::PUT_CHUNKS
            | kind::PUT_MANIFEST
            | kind::GET_CHUNKS
    )
}
