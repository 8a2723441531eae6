//! Replies: what a server answers ([`Reply`], its decoder, one function per kind, and the
//! encoders of the file messages' replies; the dedup replies are in `dedup`).

use super::body::{empty, BodyReader};
use super::dedup::decode_chunks;
use super::{BodyWriter, FrameError, ManifestState, WireChunk, BLAKE3_LEN};
use crate::auth::{NONCE_LEN, PROOF_LEN, TAG_LEN};

/// A Pull answer. For a file: `Unknown`, `Staged` (on the server's SSD) or `Durable`
/// (drained). For a checkpoint: `Unknown`, `Staged` (manifest recorded) or `Durable`
/// (marker written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Unknown = 0,
    Staged = 1,
    Durable = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullState {
    pub level: Level,
    pub stamp: u64,
    pub size: u64,
    pub blake3: [u8; BLAKE3_LEN],
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The answer to Hello: who the server is, and its nonce for the proofs.
    Challenge {
        server: &'a str,
        /// A random number chosen when the server started: a change means it restarted.
        instance: u64,
        nonce: [u8; NONCE_LEN],
    },
    /// The client's proof was right; this is the server's proof back.
    AuthOk {
        proof: [u8; PROOF_LEN],
    },
    WriteOk,
    SyncOk,
    ReadOk {
        stamp: u64,
        size: u64,
        blake3: [u8; BLAKE3_LEN],
        /// The writer's tag (crate::auth::JobKey::version_tag; zeros: none).
        tag: [u8; TAG_LEN],
        data: &'a [u8],
    },
    PushOk,
    PullOk(Vec<PullState>),
    Pong,
    GoodbyeOk,
    StatusOk(&'a str),
    /// One flag per score asked, in order: true = the server lacks it.
    LacksOk(Vec<bool>),
    PutChunksOk {
        /// Chunks stored now.
        stored: u32,
        /// Chunks the server or the durable repository already had (not stored again).
        present: u32,
    },
    PutManifestOk,
    GetChunksOk {
        /// How many of the scores asked this reply covers (a prefix of the request): ask
        /// again for the rest.
        considered: u32,
        /// The chunks of that prefix the server holds, in request order.
        chunks: Vec<WireChunk<'a>>,
    },
    GetManifestOk {
        state: ManifestState,
        /// The manifest as docs/dedup.md describes it (JSON); empty when Unknown.
        json: &'a str,
    },
    /// The server's event counter when the Watch was answered (equal to the request's
    /// `after` when the wait ran out first).
    WatchOk {
        events: u64,
    },
    Error {
        code: u16,
        message: &'a str,
    },
}

impl<'a> Reply<'a> {
    /// Decodes the body of a reply frame of `kind` (a request's kind | [`super::kind::REPLY`], or
    /// [`super::kind::ERROR`]).
    pub fn decode(kind: u8, body: &'a [u8]) -> Result<Reply<'a>, FrameError> {
        use super::kind as k;
        if kind == k::ERROR {
            return decode_error(body);
        }
        if kind & k::REPLY == 0 {
            return Err(FrameError::Kind(kind));
        }
        match kind & !k::REPLY {
            k::HELLO => decode_challenge(body),
            k::AUTH => {
                let mut r = BodyReader::new(body, "AuthOk");
                let proof = r.digest()?;
                r.end()?;
                Ok(Reply::AuthOk { proof })
            }
            k::WRITE => empty(body, "WriteOk", Reply::WriteOk),
            k::SYNC => empty(body, "SyncOk", Reply::SyncOk),
            k::READ => decode_read_ok(body),
            k::PUSH => empty(body, "PushOk", Reply::PushOk),
            k::PULL => decode_pull_ok(body).map(Reply::PullOk),
            k::PING => empty(body, "Pong", Reply::Pong),
            k::GOODBYE => empty(body, "GoodbyeOk", Reply::GoodbyeOk),
            k::STATUS => {
                let mut r = BodyReader::new(body, "StatusOk");
                match std::str::from_utf8(r.rest()) {
                    Ok(s) => Ok(Reply::StatusOk(s)),
                    Err(_) => r.malformed("status is not UTF-8"),
                }
            }
            k::LACKS => decode_lacks_ok(body).map(Reply::LacksOk),
            k::PUT_CHUNKS => {
                let mut r = BodyReader::new(body, "PutChunksOk");
                let stored = r.u32()?;
                let present = r.u32()?;
                r.end()?;
                Ok(Reply::PutChunksOk { stored, present })
            }
            k::PUT_MANIFEST => empty(body, "PutManifestOk", Reply::PutManifestOk),
            k::GET_CHUNKS => decode_get_chunks_ok(body),
            k::GET_MANIFEST => decode_get_manifest_ok(body),
            k::WATCH => {
                let mut r = BodyReader::new(body, "WatchOk");
                let events = r.u64()?;
                r.end()?;
                Ok(Reply::WatchOk { events })
            }
            _ => Err(FrameError::Kind(kind)),
        }
    }
}

fn decode_challenge(body: &[u8]) -> Result<Reply<'_>, FrameError> {
    let mut r = BodyReader::new(body, "Challenge");
    let server = r.str()?;
    let instance = r.u64()?;
    let nonce = r.digest()?;
    r.end()?;
    Ok(Reply::Challenge {
        server,
        instance,
        nonce,
    })
}

fn decode_read_ok(body: &[u8]) -> Result<Reply<'_>, FrameError> {
    let mut r = BodyReader::new(body, "ReadOk");
    let stamp = r.u64()?;
    let size = r.u64()?;
    let blake3 = r.digest()?;
    let tag = r.digest()?;
    Ok(Reply::ReadOk {
        stamp,
        size,
        blake3,
        tag,
        data: r.rest(),
    })
}

fn decode_pull_ok(body: &[u8]) -> Result<Vec<PullState>, FrameError> {
    let mut r = BodyReader::new(body, "PullOk");
    let n = r.count()?;
    if n.saturating_mul(1 + 16 + BLAKE3_LEN) > body.len() {
        return r.malformed(format!("{n} answers cannot fit in the body"));
    }
    let mut states = Vec::with_capacity(n);
    for _ in 0..n {
        let level = match r.u8()? {
            0 => Level::Unknown,
            1 => Level::Staged,
            2 => Level::Durable,
            l => return r.malformed(format!("level {l}")),
        };
        states.push(PullState {
            level,
            stamp: r.u64()?,
            size: r.u64()?,
            blake3: r.digest()?,
        });
    }
    r.end()?;
    Ok(states)
}

/// The count, then a bitmap of that many bits (see [`super::encode_lacks_ok`]).
fn decode_lacks_ok(body: &[u8]) -> Result<Vec<bool>, FrameError> {
    let mut r = BodyReader::new(body, "LacksOk");
    let n = r.count()?;
    let bitmap = r.take(n.div_ceil(8))?;
    r.end()?;
    // Bits past the count are zero: one encoding per answer.
    if n % 8 != 0 && bitmap[n / 8] >> (n % 8) != 0 {
        return r.malformed("bits set past the count");
    }
    Ok((0..n)
        .map(|i| bitmap[i / 8] & (1 << (i % 8)) != 0)
        .collect())
}

fn decode_get_chunks_ok(body: &[u8]) -> Result<Reply<'_>, FrameError> {
    let mut r = BodyReader::new(body, "GetChunksOk");
    let considered = r.count()?;
    let chunks = decode_chunks(&mut r)?;
    r.end()?;
    if chunks.len() > considered {
        return r.malformed(format!("{} chunks for {considered} scores", chunks.len()));
    }
    Ok(Reply::GetChunksOk {
        considered: considered as u32,
        chunks,
    })
}

fn decode_get_manifest_ok(body: &[u8]) -> Result<Reply<'_>, FrameError> {
    let mut r = BodyReader::new(body, "GetManifestOk");
    let state = match r.u8()? {
        0 => ManifestState::Unknown,
        1 => ManifestState::Pending,
        2 => ManifestState::Written,
        s => return r.malformed(format!("manifest state {s}")),
    };
    let json = match std::str::from_utf8(r.rest()) {
        Ok(s) => s,
        Err(_) => return r.malformed("manifest is not UTF-8"),
    };
    if (state == ManifestState::Unknown) != json.is_empty() {
        return r.malformed("a manifest must come with a known state, and only then");
    }
    Ok(Reply::GetManifestOk { state, json })
}

fn decode_error(body: &[u8]) -> Result<Reply<'_>, FrameError> {
    let mut r = BodyReader::new(body, "Error");
    let code = r.u16()?;
    let message = r.str()?;
    r.end()?;
    Ok(Reply::Error { code, message })
}

pub fn encode_challenge(server: &str, instance: u64, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(server).u64(instance).bytes(nonce);
    w.buf
}

pub fn encode_auth_ok(proof: &[u8; PROOF_LEN]) -> Vec<u8> {
    proof.to_vec()
}

pub fn encode_read_ok_head(
    stamp: u64,
    size: u64,
    blake3: &[u8; BLAKE3_LEN],
    tag: &[u8; TAG_LEN],
) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u64(stamp).u64(size).bytes(blake3).bytes(tag);
    w.buf
}

pub fn encode_pull_ok(states: &[PullState]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(states.len() as u32);
    for s in states {
        w.u8(s.level as u8)
            .u64(s.stamp)
            .u64(s.size)
            .bytes(&s.blake3);
    }
    w.buf
}

pub fn encode_watch_ok(events: u64) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u64(events);
    w.buf
}

pub fn encode_error(code: u16, message: &str) -> Vec<u8> {
    let mut w = BodyWriter::default();
    // Messages are one line; cut long ones at a character boundary.
    let mut end = message.len().min(1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    w.u16(code).str(&message[..end]);
    w.buf
}
