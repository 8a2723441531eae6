//! Requests: what a client sends ([`Request`], its decoder, one function per kind, and the
//! encoders of the file messages; the dedup messages are in `dedup`).

use super::body::{empty, BodyReader};
use super::dedup::{decode_chunks, decode_manifest_part, decode_scores};
use super::{
    check_key, BodyWriter, FrameError, Header, ManifestPart, Score, WireChunk, BLAKE3_LEN,
    HEADER_LEN, MAX_DATA,
};
use crate::auth::{NONCE_LEN, PROOF_LEN, TAG_LEN};

/// Hello: the first frame of every connection. It carries no secret: the server answers
/// with a challenge and the client proves in [`Request::Auth`] that it holds its namespace's
/// key (crate::auth).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello<'a> {
    /// Who connects (host:pid), for logs.
    pub client: &'a str,
    /// The job's namespace: a key prefix every path of the connection lives under ("" = none).
    pub namespace: &'a str,
    /// Fresh random bytes of the client, covered by both proofs.
    pub nonce: [u8; NONCE_LEN],
}

/// One piece of one file version inside a Write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    pub key: &'a str,
    /// The client's version stamp; a higher stamp is a newer version of the key.
    pub stamp: u64,
    /// The version's final size.
    pub size: u64,
    pub offset: u64,
    /// Set on the version's last segment: the version is complete.
    pub seal: Option<Seal>,
    pub data: &'a [u8],
}

/// What seals a version: its BLAKE3, and its writer's tag over key, stamp, size and BLAKE3
/// (crate::auth::JobKey::version_tag), which a reader holding the job's key checks before it
/// trusts the staged copy (all zeros: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    pub blake3: [u8; BLAKE3_LEN],
    pub tag: [u8; TAG_LEN],
}

impl Seal {
    /// A seal without a writer's tag (readers do not let it override the durable store).
    pub fn untagged(blake3: [u8; BLAKE3_LEN]) -> Seal {
        Seal {
            blake3,
            tag: [0; TAG_LEN],
        }
    }
}

/// Bytes of one segment's descriptor in a Write body, besides its key.
pub const SEGMENT_FIXED: usize = 2 + 8 + 8 + 8 + 4 + 1 + BLAKE3_LEN + TAG_LEN;

/// Appends a segment descriptor; the data goes after all descriptors, in the same order.
pub fn encode_segment_header(
    w: &mut BodyWriter,
    key: &str,
    stamp: u64,
    size: u64,
    offset: u64,
    len: u32,
    seal: Option<&Seal>,
) {
    w.str(key).u64(stamp).u64(size).u64(offset).u32(len);
    match seal {
        Some(s) => w.u8(1).bytes(&s.blake3).bytes(&s.tag),
        None => w.u8(0).bytes(&[0u8; BLAKE3_LEN + TAG_LEN]),
    };
}

/// A checkpoint's file list, pushed once all its files are staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushFile {
    pub path: String,
    pub size: u64,
    pub blake3: [u8; BLAKE3_LEN],
}

/// What a Pull asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullKind {
    File = 0,
    Checkpoint = 1,
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
    /// The client's proof (crate::auth::JobKey::client_proof), the second frame.
    Auth {
        proof: [u8; PROOF_LEN],
    },
    Write(Vec<Segment<'a>>),
    Sync,
    Read {
        key: &'a str,
        offset: u64,
        len: u32,
    },
    Push {
        checkpoint: &'a str,
        single_file: bool,
        files: Vec<PushFile>,
    },
    Pull(Vec<(PullKind, &'a str)>),
    Ping,
    Goodbye,
    Status,
    Lacks(Vec<Score>),
    PutChunks(Vec<WireChunk<'a>>),
    PutManifest(ManifestPart<'a>),
    GetChunks(Vec<Score>),
    GetManifest {
        checkpoint: &'a str,
    },
    /// Answer once the server's event counter is above `after` (a file drained, a marker,
    /// a push round or a manifest written), or after `wait_ms` (clamped by the server).
    Watch {
        after: u64,
        wait_ms: u32,
    },
}

impl<'a> Request<'a> {
    /// Decodes the body of a request frame of `kind`.
    pub fn decode(kind: u8, body: &'a [u8]) -> Result<Request<'a>, FrameError> {
        use super::kind as k;
        match kind {
            k::HELLO => decode_hello(body).map(Request::Hello),
            k::AUTH => {
                let mut r = BodyReader::new(body, "Auth");
                let proof = r.digest()?;
                r.end()?;
                Ok(Request::Auth { proof })
            }
            k::WRITE => decode_write(body).map(Request::Write),
            k::SYNC => empty(body, "Sync", Request::Sync),
            k::READ => decode_read(body),
            k::PUSH => decode_push(body),
            k::PULL => decode_pull(body).map(Request::Pull),
            k::PING => empty(body, "Ping", Request::Ping),
            k::GOODBYE => empty(body, "Goodbye", Request::Goodbye),
            k::STATUS => empty(body, "Status", Request::Status),
            k::LACKS => decode_scores(body, "Lacks").map(Request::Lacks),
            k::GET_CHUNKS => decode_scores(body, "GetChunks").map(Request::GetChunks),
            k::PUT_CHUNKS => {
                let mut r = BodyReader::new(body, "PutChunks");
                let chunks = decode_chunks(&mut r)?;
                r.end()?;
                Ok(Request::PutChunks(chunks))
            }
            k::PUT_MANIFEST => decode_manifest_part(body).map(Request::PutManifest),
            k::GET_MANIFEST => {
                let mut r = BodyReader::new(body, "GetManifest");
                let checkpoint = r.key()?;
                r.end()?;
                Ok(Request::GetManifest { checkpoint })
            }
            k::WATCH => {
                let mut r = BodyReader::new(body, "Watch");
                let after = r.u64()?;
                let wait_ms = r.u32()?;
                r.end()?;
                Ok(Request::Watch { after, wait_ms })
            }
            other => Err(FrameError::Kind(other)),
        }
    }
}

fn decode_hello(body: &[u8]) -> Result<Hello<'_>, FrameError> {
    let mut r = BodyReader::new(body, "Hello");
    let client = r.str()?;
    let namespace = r.str()?;
    if !namespace.is_empty() {
        check_key(namespace)?;
    }
    let nonce = r.digest()?;
    r.end()?;
    Ok(Hello {
        client,
        namespace,
        nonce,
    })
}

/// A segment's descriptor: everything but its data.
struct SegmentHead<'a> {
    key: &'a str,
    stamp: u64,
    size: u64,
    offset: u64,
    len: usize,
    seal: Option<Seal>,
}

/// A Write: the segment descriptors, then their data back to back in the same order.
fn decode_write(body: &[u8]) -> Result<Vec<Segment<'_>>, FrameError> {
    let mut r = BodyReader::new(body, "Write");
    let n = r.count()?;
    // Each descriptor takes at least SEGMENT_FIXED bytes: refuse a count the body cannot
    // hold before reserving room for it.
    if n.saturating_mul(SEGMENT_FIXED) > body.len() {
        return r.malformed(format!("{n} segments cannot fit in the body"));
    }
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        heads.push(decode_segment_head(&mut r)?);
    }
    split_segment_data(heads, r.rest())
}

fn decode_segment_head<'a>(r: &mut BodyReader<'a>) -> Result<SegmentHead<'a>, FrameError> {
    let key = r.key()?;
    let stamp = r.u64()?;
    let size = r.u64()?;
    let offset = r.u64()?;
    let len = r.u32()? as usize;
    let sealed = r.u8()?;
    let blake3 = r.digest()?;
    let tag = r.digest()?;
    let seal = match sealed {
        0 => None,
        1 => Some(Seal { blake3, tag }),
        f => return r.malformed(format!("seal flag {f}")),
    };
    if offset.checked_add(len as u64).is_none_or(|end| end > size) {
        return r.malformed(format!(
            "segment {offset}+{len} of {key:?} runs past its size {size}"
        ));
    }
    Ok(SegmentHead {
        key,
        stamp,
        size,
        offset,
        len,
        seal,
    })
}

/// Hands each segment its slice of `data`, which must hold exactly their lengths.
fn split_segment_data<'a>(
    heads: Vec<SegmentHead<'a>>,
    mut data: &'a [u8],
) -> Result<Vec<Segment<'a>>, FrameError> {
    let malformed = |why: String| FrameError::Malformed { what: "Write", why };
    let mut segments = Vec::with_capacity(heads.len());
    for h in heads {
        if data.len() < h.len {
            return Err(malformed(
                "segment data is shorter than its descriptors say".into(),
            ));
        }
        let (this, rest) = data.split_at(h.len);
        data = rest;
        segments.push(Segment {
            key: h.key,
            stamp: h.stamp,
            size: h.size,
            offset: h.offset,
            seal: h.seal,
            data: this,
        });
    }
    if !data.is_empty() {
        return Err(malformed(format!(
            "{} bytes of data beyond the segments",
            data.len()
        )));
    }
    Ok(segments)
}

fn decode_read(body: &[u8]) -> Result<Request<'_>, FrameError> {
    let mut r = BodyReader::new(body, "Read");
    let key = r.key()?;
    let offset = r.u64()?;
    let len = r.u32()?;
    if len as usize > MAX_DATA {
        return r.malformed(format!("read of {len} bytes exceeds {MAX_DATA}"));
    }
    r.end()?;
    Ok(Request::Read { key, offset, len })
}

fn decode_push(body: &[u8]) -> Result<Request<'_>, FrameError> {
    let mut r = BodyReader::new(body, "Push");
    let checkpoint = r.key()?;
    let single_file = r.flag("single-file flag")?;
    let n = r.count()?;
    if n.saturating_mul(2 + 8 + BLAKE3_LEN) > body.len() {
        return r.malformed(format!("{n} files cannot fit in the body"));
    }
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        let path = r.key()?.to_string();
        let size = r.u64()?;
        let blake3 = r.digest()?;
        files.push(PushFile { path, size, blake3 });
    }
    r.end()?;
    Ok(Request::Push {
        checkpoint,
        single_file,
        files,
    })
}

fn decode_pull(body: &[u8]) -> Result<Vec<(PullKind, &str)>, FrameError> {
    let mut r = BodyReader::new(body, "Pull");
    let n = r.count()?;
    if n.saturating_mul(3) > body.len() {
        return r.malformed(format!("{n} queries cannot fit in the body"));
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        let what = match r.u8()? {
            0 => PullKind::File,
            1 => PullKind::Checkpoint,
            w => return r.malformed(format!("query kind {w}")),
        };
        queries.push((what, r.key()?));
    }
    r.end()?;
    Ok(queries)
}

/// Body of a Hello request.
pub fn encode_hello(client: &str, namespace: &str, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(client).str(namespace).bytes(nonce);
    w.buf
}

/// Body of an Auth request: the client's proof.
pub fn encode_auth(proof: &[u8; PROOF_LEN]) -> Vec<u8> {
    proof.to_vec()
}

pub fn encode_read(key: &str, offset: u64, len: u32) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(key).u64(offset).u32(len);
    w.buf
}

pub fn encode_push(checkpoint: &str, single_file: bool, files: &[PushFile]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(checkpoint)
        .u8(single_file as u8)
        .u32(files.len() as u32);
    for f in files {
        w.str(&f.path).u64(f.size).bytes(&f.blake3);
    }
    w.buf
}

pub fn encode_pull(queries: &[(PullKind, &str)]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(queries.len() as u32);
    for (what, key) in queries {
        w.u8(*what as u8).str(key);
    }
    w.buf
}

pub fn encode_watch(after: u64, wait_ms: u32) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u64(after).u32(wait_ms);
    w.buf
}

/// Decodes a whole frame (header and body) from one buffer: the fuzzing entry point, and
/// what a test uses to check a captured frame.
pub fn decode_request_frame(frame: &[u8]) -> Result<(Header, Request<'_>), FrameError> {
    if frame.len() < HEADER_LEN {
        return Err(FrameError::Malformed {
            what: "frame",
            why: format!("{} bytes is shorter than a header", frame.len()),
        });
    }
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&frame[..HEADER_LEN]);
    let header = Header::decode(&h)?;
    let body = &frame[HEADER_LEN..];
    if body.len() != header.body_len as usize {
        return Err(FrameError::Malformed {
            what: "frame",
            why: format!(
                "header says {} body bytes, {} present",
                header.body_len,
                body.len()
            ),
        });
    }
    Ok((header, Request::decode(header.kind, body)?))
}
