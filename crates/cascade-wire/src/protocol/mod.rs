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

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CSTG";
/// The protocol version this build speaks (header byte 4).
pub const VERSION: u8 = 1;
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

/// `write_all` over `parts` with vectored writes. (`IoSlice::advance_slices` would do, but
/// it is newer than the workspace's MSRV, 1.80.)
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

/// Builds a body field by field (little-endian).
#[derive(Default)]
pub struct BodyWriter {
    pub buf: Vec<u8>,
}

impl BodyWriter {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// A string as u16 length + UTF-8 (callers keep strings under [`MAX_KEY`]).
    pub fn str(&mut self, s: &str) -> &mut Self {
        let s = &s.as_bytes()[..s.len().min(MAX_KEY)];
        self.u16(s.len() as u16);
        self.bytes(s)
    }
}

/// Reads a body field by field, failing (never panicking) on short input.
struct BodyReader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> BodyReader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        BodyReader { buf, what }
    }
    fn malformed<T>(&self, why: impl Into<String>) -> Result<T, FrameError> {
        Err(FrameError::Malformed {
            what: self.what,
            why: why.into(),
        })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return self.malformed(format!("needs {n} more bytes, {} left", self.buf.len()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn digest(&mut self) -> Result<[u8; BLAKE3_LEN], FrameError> {
        let mut a = [0u8; BLAKE3_LEN];
        a.copy_from_slice(self.take(BLAKE3_LEN)?);
        Ok(a)
    }
    fn str(&mut self) -> Result<&'a str, FrameError> {
        let n = self.u16()? as usize;
        if n > MAX_KEY {
            return self.malformed(format!("string of {n} bytes exceeds {MAX_KEY}"));
        }
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s),
            Err(_) => self.malformed("string is not UTF-8"),
        }
    }
    fn key(&mut self) -> Result<&'a str, FrameError> {
        let k = self.str()?;
        check_key(k)?;
        Ok(k)
    }
    fn count(&mut self) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > MAX_ITEMS {
            return self.malformed(format!("{n} items exceed the limit of {MAX_ITEMS}"));
        }
        Ok(n)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            self.malformed(format!("{} trailing bytes", self.buf.len()))
        }
    }
}

/// Hello: the first frame of every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello<'a> {
    pub secret: &'a str,
    /// Who connects (host:pid), for logs.
    pub client: &'a str,
    /// The job's namespace: a key prefix every path of the connection lives under ("" = none).
    pub namespace: &'a str,
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
    /// Set on the version's last segment: its BLAKE3; the version is complete.
    pub seal: Option<[u8; BLAKE3_LEN]>,
    pub data: &'a [u8],
}

/// Bytes of one segment's descriptor in a Write body, besides its key.
pub const SEGMENT_FIXED: usize = 2 + 8 + 8 + 8 + 4 + 1 + BLAKE3_LEN;

/// Appends a segment descriptor; the data goes after all descriptors, in the same order.
pub fn encode_segment_header(
    w: &mut BodyWriter,
    key: &str,
    stamp: u64,
    size: u64,
    offset: u64,
    len: u32,
    seal: Option<&[u8; BLAKE3_LEN]>,
) {
    w.str(key).u64(stamp).u64(size).u64(offset).u32(len);
    match seal {
        Some(d) => w.u8(1).bytes(d),
        None => w.u8(0).bytes(&[0u8; BLAKE3_LEN]),
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

/// Bytes of one chunk descriptor in PutChunks and GetChunksOk: score, kind, storage,
/// raw length, stored length.
pub const CHUNK_FIXED: usize = BLAKE3_LEN + 1 + 1 + 4 + 4;
/// Most raw bytes (after decompression) the chunks of one PutChunks or GetChunksOk may hold:
/// bounds what verifying one frame decompresses.
pub const MAX_FRAME_RAW: u64 = 256 << 20;
/// Fewest bytes of one file entry of a PutManifest (a one-byte path).
const RECIPE_FIXED: usize = 2 + 1 + 8 + BLAKE3_LEN + BLAKE3_LEN;

/// A chunk (a blob of the dedup repository: file data, or a recipe block) as it travels:
/// in its stored form, `data` being the raw bytes or a zstd frame of `raw_len` bytes whose
/// BLAKE3 is `score`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireChunk<'a> {
    pub score: Score,
    pub kind: BlobKind,
    pub stored: Stored,
    pub raw_len: u32,
    pub data: &'a [u8],
}

/// Bytes before the zstd frame in the data of a delta chunk ([`Stored::Delta`]): its base's
/// score (32) and the base byte its XOR starts at (`from`, u32).
pub const DELTA_PREFIX: usize = BLAKE3_LEN + 4;

/// The data of a delta chunk as it travels and as a server keeps it: base score · `from` ·
/// the zstd frame of the chunk XORed with that base.
pub fn delta_data(base: &DeltaBase, frame: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(DELTA_PREFIX + frame.len());
    data.extend_from_slice(&base.score);
    data.extend_from_slice(&base.from.to_le_bytes());
    data.extend_from_slice(frame);
    data
}

/// The base and the zstd frame of a delta chunk's data; None when it is too short to hold
/// both.
pub fn split_delta(data: &[u8]) -> Option<(DeltaBase, &[u8])> {
    if data.len() <= DELTA_PREFIX {
        return None;
    }
    let (head, frame) = data.split_at(DELTA_PREFIX);
    let mut score = [0u8; BLAKE3_LEN];
    score.copy_from_slice(&head[..BLAKE3_LEN]);
    let from = u32::from_le_bytes([head[32], head[33], head[34], head[35]]);
    Some((DeltaBase { score, from }, frame))
}

/// One file of a checkpoint's dedup manifest: the repository's `FileRecipe` in binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeEntry {
    /// Relative to the checkpoint (a key; with single_file the file's base name).
    pub path: String,
    pub size: u64,
    /// The whole file's BLAKE3.
    pub blake3: [u8; BLAKE3_LEN],
    /// The root of its recipe tree.
    pub root: Score,
}

/// One PutManifest frame: a checkpoint's manifest is sent in parts 0, 1, ... on one
/// connection, the last one flagged; files and scores of all parts add up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestPart<'a> {
    pub checkpoint: &'a str,
    pub single_file: bool,
    /// Recorded in the manifest as given (e.g. `cdc:avg=64KiB`, `zstd:1`).
    pub chunking: &'a str,
    pub compression: &'a str,
    pub part: u32,
    pub last: bool,
    pub files: Vec<RecipeEntry>,
    /// Every blob the checkpoint references (data chunks and recipe blocks).
    pub scores: Vec<Score>,
}

/// What a server knows of a dedup manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestState {
    Unknown = 0,
    /// Durable on the server, waiting for its blobs to reach the durable repository.
    Pending = 1,
    /// In the durable repository.
    Written = 2,
}

/// `count: u32` then exactly `count` scores.
fn decode_scores(body: &[u8], what: &'static str) -> Result<Vec<Score>, FrameError> {
    let mut r = BodyReader::new(body, what);
    let n = r.count()?;
    if n.saturating_mul(BLAKE3_LEN) != r.buf.len() {
        return r.malformed(format!(
            "{n} scores need {} bytes, {} present",
            n.saturating_mul(BLAKE3_LEN),
            r.buf.len()
        ));
    }
    let mut scores = Vec::with_capacity(n);
    for _ in 0..n {
        scores.push(r.digest()?);
    }
    Ok(scores)
}

/// `count: u32`, the descriptors, then the chunks' stored bytes back to back.
fn decode_chunks<'a>(r: &mut BodyReader<'a>) -> Result<Vec<WireChunk<'a>>, FrameError> {
    let n = r.count()?;
    if n.saturating_mul(CHUNK_FIXED) > r.buf.len() {
        return r.malformed(format!("{n} chunks cannot fit in the body"));
    }
    let mut heads = Vec::with_capacity(n);
    let mut raw_total = 0u64;
    for _ in 0..n {
        let score = r.digest()?;
        let kind = match r.u8()? {
            0 => BlobKind::Data,
            1 => BlobKind::Tree,
            k => return r.malformed(format!("chunk kind {k}")),
        };
        let stored = match r.u8()? {
            0 => Stored::Raw,
            1 => Stored::Zstd,
            2 => Stored::Delta,
            s => return r.malformed(format!("chunk storage {s}")),
        };
        let raw_len = r.u32()?;
        let stored_len = r.u32()? as usize;
        if raw_len as usize > MAX_DATA || stored_len > MAX_DATA {
            return r.malformed(format!("a chunk over {MAX_DATA} bytes"));
        }
        match stored {
            Stored::Raw if stored_len != raw_len as usize => {
                return r.malformed(format!(
                    "a raw chunk of {raw_len} bytes stored in {stored_len}"
                ))
            }
            Stored::Zstd if stored_len == 0 => return r.malformed("an empty zstd frame"),
            Stored::Delta if stored_len <= DELTA_PREFIX => {
                return r.malformed(format!("a delta chunk of {stored_len} bytes"))
            }
            _ => {}
        }
        raw_total += u64::from(raw_len);
        if raw_total > MAX_FRAME_RAW {
            return r.malformed(format!(
                "the chunks hold more than {MAX_FRAME_RAW} raw bytes"
            ));
        }
        heads.push((score, kind, stored, raw_len, stored_len));
    }
    let mut chunks = Vec::with_capacity(n);
    for (score, kind, stored, raw_len, stored_len) in heads {
        let data = match r.take(stored_len) {
            Ok(d) => d,
            Err(_) => return r.malformed("chunk data is shorter than its descriptors say"),
        };
        chunks.push(WireChunk {
            score,
            kind,
            stored,
            raw_len,
            data,
        });
    }
    Ok(chunks)
}

fn decode_manifest_part(body: &[u8]) -> Result<ManifestPart<'_>, FrameError> {
    let mut r = BodyReader::new(body, "PutManifest");
    let checkpoint = r.key()?;
    let single_file = match r.u8()? {
        0 => false,
        1 => true,
        f => return r.malformed(format!("single-file flag {f}")),
    };
    let chunking = r.str()?;
    let compression = r.str()?;
    let part = r.u32()?;
    let last = match r.u8()? {
        0 => false,
        1 => true,
        f => return r.malformed(format!("last-part flag {f}")),
    };
    let n = r.count()?;
    if n.saturating_mul(RECIPE_FIXED) > r.buf.len() {
        return r.malformed(format!("{n} files cannot fit in the body"));
    }
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        files.push(RecipeEntry {
            path: r.key()?.to_string(),
            size: r.u64()?,
            blake3: r.digest()?,
            root: r.digest()?,
        });
    }
    let rest = r.rest();
    let scores = decode_scores(rest, "PutManifest")?;
    Ok(ManifestPart {
        checkpoint,
        single_file,
        chunking,
        compression,
        part,
        last,
        files,
        scores,
    })
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

/// Body of a Lacks or GetChunks request.
pub fn encode_scores(scores: &[Score]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(scores.len() as u32);
    for s in scores {
        w.bytes(s);
    }
    w.buf
}

/// Count and descriptors of chunks (PutChunks, and GetChunksOk after its `considered`);
/// their data follows, back to back, in the same order.
pub fn encode_chunk_descriptors(w: &mut BodyWriter, chunks: &[WireChunk]) {
    w.u32(chunks.len() as u32);
    for c in chunks {
        w.bytes(&c.score)
            .u8(c.kind as u8)
            .u8(c.stored as u8)
            .u32(c.raw_len)
            .u32(c.data.len() as u32);
    }
}

/// The head of a GetChunksOk body (the chunks' data follows).
pub fn encode_get_chunks_ok_head(considered: u32, chunks: &[WireChunk]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(considered);
    encode_chunk_descriptors(&mut w, chunks);
    w.buf
}

pub fn encode_manifest_part(m: &ManifestPart) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(m.checkpoint)
        .u8(m.single_file as u8)
        .str(m.chunking)
        .str(m.compression)
        .u32(m.part)
        .u8(m.last as u8)
        .u32(m.files.len() as u32);
    for f in &m.files {
        w.str(&f.path).u64(f.size).bytes(&f.blake3).bytes(&f.root);
    }
    w.u32(m.scores.len() as u32);
    for s in &m.scores {
        w.bytes(s);
    }
    w.buf
}

pub fn encode_get_manifest(checkpoint: &str) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(checkpoint);
    w.buf
}

/// LacksOk: the count, then a bitmap (bit i of byte i/8, least significant first).
pub fn encode_lacks_ok(lacks: &[bool]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(lacks.len() as u32);
    let mut bitmap = vec![0u8; lacks.len().div_ceil(8)];
    for (i, _) in lacks.iter().enumerate().filter(|(_, l)| **l) {
        bitmap[i / 8] |= 1 << (i % 8);
    }
    w.bytes(&bitmap);
    w.buf
}

pub fn encode_put_chunks_ok(stored: u32, present: u32) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u32(stored).u32(present);
    w.buf
}

pub fn encode_get_manifest_ok(state: ManifestState, json: &str) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u8(state as u8).bytes(json.as_bytes());
    w.buf
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
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
}

impl<'a> Request<'a> {
    /// Decodes the body of a request frame of `kind`.
    pub fn decode(kind: u8, body: &'a [u8]) -> Result<Request<'a>, FrameError> {
        use self::kind as k;
        let request = match kind {
            k::HELLO => {
                let mut r = BodyReader::new(body, "Hello");
                let secret = r.str()?;
                let client = r.str()?;
                let namespace = r.str()?;
                if !namespace.is_empty() {
                    check_key(namespace)?;
                }
                r.end()?;
                Request::Hello(Hello {
                    secret,
                    client,
                    namespace,
                })
            }
            k::WRITE => {
                let mut r = BodyReader::new(body, "Write");
                let n = r.count()?;
                // Each descriptor takes at least SEGMENT_FIXED bytes: refuse a count the
                // body cannot hold before reserving room for it.
                if n.saturating_mul(SEGMENT_FIXED) > body.len() {
                    return r.malformed(format!("{n} segments cannot fit in the body"));
                }
                let mut heads = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = r.key()?;
                    let stamp = r.u64()?;
                    let size = r.u64()?;
                    let offset = r.u64()?;
                    let len = r.u32()? as usize;
                    let sealed = r.u8()?;
                    let digest = r.digest()?;
                    let seal = match sealed {
                        0 => None,
                        1 => Some(digest),
                        f => return r.malformed(format!("seal flag {f}")),
                    };
                    if offset.checked_add(len as u64).is_none_or(|end| end > size) {
                        return r.malformed(format!(
                            "segment {offset}+{len} of {key:?} runs past its size {size}"
                        ));
                    }
                    heads.push((key, stamp, size, offset, len, seal));
                }
                let mut data = r.rest();
                let mut segments = Vec::with_capacity(n);
                for (key, stamp, size, offset, len, seal) in heads {
                    if data.len() < len {
                        return Err(FrameError::Malformed {
                            what: "Write",
                            why: "segment data is shorter than its descriptors say".into(),
                        });
                    }
                    let (this, rest) = data.split_at(len);
                    data = rest;
                    segments.push(Segment {
                        key,
                        stamp,
                        size,
                        offset,
                        seal,
                        data: this,
                    });
                }
                if !data.is_empty() {
                    return Err(FrameError::Malformed {
                        what: "Write",
                        why: format!("{} bytes of data beyond the segments", data.len()),
                    });
                }
                Request::Write(segments)
            }
            k::SYNC => {
                BodyReader::new(body, "Sync").end()?;
                Request::Sync
            }
            k::READ => {
                let mut r = BodyReader::new(body, "Read");
                let key = r.key()?;
                let offset = r.u64()?;
                let len = r.u32()?;
                if len as usize > MAX_DATA {
                    return r.malformed(format!("read of {len} bytes exceeds {MAX_DATA}"));
                }
                r.end()?;
                Request::Read { key, offset, len }
            }
            k::PUSH => {
                let mut r = BodyReader::new(body, "Push");
                let checkpoint = r.key()?;
                let single_file = match r.u8()? {
                    0 => false,
                    1 => true,
                    f => return r.malformed(format!("single-file flag {f}")),
                };
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
                Request::Push {
                    checkpoint,
                    single_file,
                    files,
                }
            }
            k::PULL => {
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
                Request::Pull(queries)
            }
            k::PING => {
                BodyReader::new(body, "Ping").end()?;
                Request::Ping
            }
            k::GOODBYE => {
                BodyReader::new(body, "Goodbye").end()?;
                Request::Goodbye
            }
            k::STATUS => {
                BodyReader::new(body, "Status").end()?;
                Request::Status
            }
            k::LACKS => Request::Lacks(decode_scores(body, "Lacks")?),
            k::GET_CHUNKS => Request::GetChunks(decode_scores(body, "GetChunks")?),
            k::PUT_CHUNKS => {
                let mut r = BodyReader::new(body, "PutChunks");
                let chunks = decode_chunks(&mut r)?;
                r.end()?;
                Request::PutChunks(chunks)
            }
            k::PUT_MANIFEST => Request::PutManifest(decode_manifest_part(body)?),
            k::GET_MANIFEST => {
                let mut r = BodyReader::new(body, "GetManifest");
                let checkpoint = r.key()?;
                r.end()?;
                Request::GetManifest { checkpoint }
            }
            other => return Err(FrameError::Kind(other)),
        };
        Ok(request)
    }
}

/// Body of a Hello request.
pub fn encode_hello(secret: &str, client: &str, namespace: &str) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(secret).str(client).str(namespace);
    w.buf
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

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    HelloOk {
        server: &'a str,
        /// A random number chosen when the server started: a change means it restarted.
        instance: u64,
    },
    WriteOk,
    SyncOk,
    ReadOk {
        stamp: u64,
        size: u64,
        blake3: [u8; BLAKE3_LEN],
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
    Error {
        code: u16,
        message: &'a str,
    },
}

impl<'a> Reply<'a> {
    pub fn decode(kind: u8, body: &'a [u8]) -> Result<Reply<'a>, FrameError> {
        use self::kind as k;
        let empty = |what, r: Reply<'a>| BodyReader::new(body, what).end().map(|_| r);
        match kind {
            x if x == k::HELLO | k::REPLY => {
                let mut r = BodyReader::new(body, "HelloOk");
                let server = r.str()?;
                let instance = r.u64()?;
                r.end()?;
                Ok(Reply::HelloOk { server, instance })
            }
            x if x == k::WRITE | k::REPLY => empty("WriteOk", Reply::WriteOk),
            x if x == k::SYNC | k::REPLY => empty("SyncOk", Reply::SyncOk),
            x if x == k::READ | k::REPLY => {
                let mut r = BodyReader::new(body, "ReadOk");
                let stamp = r.u64()?;
                let size = r.u64()?;
                let blake3 = r.digest()?;
                Ok(Reply::ReadOk {
                    stamp,
                    size,
                    blake3,
                    data: r.rest(),
                })
            }
            x if x == k::PUSH | k::REPLY => empty("PushOk", Reply::PushOk),
            x if x == k::PULL | k::REPLY => {
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
                Ok(Reply::PullOk(states))
            }
            x if x == k::PING | k::REPLY => empty("Pong", Reply::Pong),
            x if x == k::GOODBYE | k::REPLY => empty("GoodbyeOk", Reply::GoodbyeOk),
            x if x == k::STATUS | k::REPLY => {
                let mut r = BodyReader::new(body, "StatusOk");
                match std::str::from_utf8(r.rest()) {
                    Ok(s) => Ok(Reply::StatusOk(s)),
                    Err(_) => r.malformed("status is not UTF-8"),
                }
            }
            x if x == k::LACKS | k::REPLY => {
                let mut r = BodyReader::new(body, "LacksOk");
                let n = r.count()?;
                let bitmap = r.take(n.div_ceil(8))?;
                r.end()?;
                // Bits past the count are zero: one encoding per answer.
                if n % 8 != 0 && bitmap[n / 8] >> (n % 8) != 0 {
                    return r.malformed("bits set past the count");
                }
                Ok(Reply::LacksOk(
                    (0..n)
                        .map(|i| bitmap[i / 8] & (1 << (i % 8)) != 0)
                        .collect(),
                ))
            }
            x if x == k::PUT_CHUNKS | k::REPLY => {
                let mut r = BodyReader::new(body, "PutChunksOk");
                let stored = r.u32()?;
                let present = r.u32()?;
                r.end()?;
                Ok(Reply::PutChunksOk { stored, present })
            }
            x if x == k::PUT_MANIFEST | k::REPLY => empty("PutManifestOk", Reply::PutManifestOk),
            x if x == k::GET_CHUNKS | k::REPLY => {
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
            x if x == k::GET_MANIFEST | k::REPLY => {
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
            k::ERROR => {
                let mut r = BodyReader::new(body, "Error");
                let code = r.u16()?;
                let message = r.str()?;
                r.end()?;
                Ok(Reply::Error { code, message })
            }
            other => Err(FrameError::Kind(other)),
        }
    }
}

pub fn encode_hello_ok(server: &str, instance: u64) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.str(server).u64(instance);
    w.buf
}

pub fn encode_read_ok_head(stamp: u64, size: u64, blake3: &[u8; BLAKE3_LEN]) -> Vec<u8> {
    let mut w = BodyWriter::default();
    w.u64(stamp).u64(size).bytes(blake3);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let header = Header {
            kind,
            body_len: body.len() as u32,
            request: 7,
        };
        write_frame(&mut out, header, &[body]).unwrap();
        out
    }

    /// A writer taking at most `cap` bytes per call, over at most 3 slices.
    struct Dribble {
        out: Vec<u8>,
        cap: usize,
    }

    impl Write for Dribble {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.cap);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let mut n = 0;
            for b in bufs.iter().take(3) {
                let take = b.len().min(self.cap - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.cap {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_vectored_writes_send_every_byte_once() {
        let parts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; i as usize % 7]).collect();
        let body: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let len = body.iter().map(|b| b.len()).sum::<usize>() as u32;
        let header = Header {
            kind: kind::WRITE,
            body_len: len,
            request: 3,
        };
        let mut whole = header.encode().to_vec();
        body.iter().for_each(|b| whole.extend_from_slice(b));
        for cap in [1, 2, 5, 16, 17, 1000] {
            let mut w = Dribble {
                out: Vec::new(),
                cap,
            };
            write_frame(&mut w, header, &body).unwrap();
            assert_eq!(w.out, whole, "cap {cap}");
        }
    }

    #[test]
    fn write_round_trip_with_several_segments() {
        let mut w = BodyWriter::default();
        w.u32(2);
        encode_segment_header(&mut w, "ckpt.1/a", 5, 6, 0, 4, None);
        let d = [9u8; 32];
        encode_segment_header(&mut w, "ckpt.1/b", 5, 2, 0, 2, Some(&d));
        w.bytes(b"abcd").bytes(b"xy");
        let f = frame(kind::WRITE, &w.buf);
        let (h, req) = decode_request_frame(&f).unwrap();
        assert_eq!(h.request, 7);
        let Request::Write(segs) = req else {
            panic!("not a write: {req:?}")
        };
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].data, b"abcd");
        assert_eq!(segs[0].seal, None);
        assert_eq!(segs[1].key, "ckpt.1/b");
        assert_eq!(segs[1].data, b"xy");
        assert_eq!(segs[1].seal, Some(d));
    }

    #[test]
    fn hostile_frames_are_refused_without_allocating() {
        // A header claiming a 4 GiB body.
        let mut h = Header {
            kind: kind::WRITE,
            body_len: 0,
            request: 1,
        }
        .encode();
        h[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Header::decode(&h), Err(FrameError::TooLarge(u32::MAX)));
        // A Write claiming 65536 segments in 10 bytes.
        let mut w = BodyWriter::default();
        w.u32(65_536).bytes(&[0; 6]);
        assert!(matches!(
            Request::decode(kind::WRITE, &w.buf),
            Err(FrameError::Malformed { .. })
        ));
        // A segment running past its file's size.
        let mut w = BodyWriter::default();
        w.u32(1);
        encode_segment_header(&mut w, "a", 1, 2, 1, 4, None);
        w.bytes(b"abcd");
        assert!(Request::decode(kind::WRITE, &w.buf).is_err());
        // Wrong magic and version.
        let mut f = frame(kind::PING, &[]);
        f[4] = 9;
        assert_eq!(
            decode_request_frame(&f).unwrap_err(),
            FrameError::Version(9)
        );
        f[0] = b'X';
        assert!(matches!(
            decode_request_frame(&f),
            Err(FrameError::Magic(_))
        ));
    }

    #[test]
    fn paths_cannot_escape_the_namespace() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../../b",
            "..",
            "a//b",
            "./a",
            "a/.",
            "a\0b",
            "a\nb",
            "a\x7f",
        ] {
            assert!(check_key(bad).is_err(), "{bad:?} accepted");
            let body = encode_read(bad, 0, 1);
            assert!(Request::decode(kind::READ, &body).is_err(), "{bad:?} read");
        }
        for good in ["a", "ckpt.0001/rank-3.dat", "x/..y/z..", "..."] {
            assert!(check_key(good).is_ok(), "{good:?} refused");
        }
    }

    fn chunk(score: u8, stored: Stored, raw_len: u32, data: &[u8]) -> WireChunk<'_> {
        WireChunk {
            score: [score; 32],
            kind: if score % 2 == 0 {
                BlobKind::Data
            } else {
                BlobKind::Tree
            },
            stored,
            raw_len,
            data,
        }
    }

    fn put_chunks_body(chunks: &[WireChunk]) -> Vec<u8> {
        let mut w = BodyWriter::default();
        encode_chunk_descriptors(&mut w, chunks);
        for c in chunks {
            w.bytes(c.data);
        }
        w.buf
    }

    #[test]
    fn dedup_messages_round_trip() {
        let scores: Vec<Score> = (0..9u8).map(|i| [i; 32]).collect();
        let body = encode_scores(&scores);
        assert_eq!(body.len(), 4 + 9 * 32);
        assert_eq!(
            Request::decode(kind::LACKS, &body).unwrap(),
            Request::Lacks(scores.clone())
        );
        assert_eq!(
            Request::decode(kind::GET_CHUNKS, &body).unwrap(),
            Request::GetChunks(scores.clone())
        );
        let chunks = [
            chunk(2, Stored::Raw, 3, b"abc"),
            chunk(3, Stored::Zstd, 1000, b"frame"),
            chunk(4, Stored::Raw, 0, b""),
        ];
        let body = put_chunks_body(&chunks);
        assert_eq!(body.len(), 4 + 3 * CHUNK_FIXED + 8);
        assert_eq!(
            Request::decode(kind::PUT_CHUNKS, &body).unwrap(),
            Request::PutChunks(chunks.to_vec())
        );
        let part = ManifestPart {
            checkpoint: "run1/ckpt.0042",
            single_file: false,
            chunking: "cdc:avg=64KiB",
            compression: "zstd:1",
            part: 3,
            last: true,
            files: vec![RecipeEntry {
                path: "rank0.dat".into(),
                size: 77,
                blake3: [1; 32],
                root: [2; 32],
            }],
            scores: scores[..2].to_vec(),
        };
        let body = encode_manifest_part(&part);
        assert_eq!(
            Request::decode(kind::PUT_MANIFEST, &body).unwrap(),
            Request::PutManifest(part)
        );
        assert_eq!(
            Request::decode(kind::GET_MANIFEST, &encode_get_manifest("a/b")).unwrap(),
            Request::GetManifest { checkpoint: "a/b" }
        );

        let flags = [true, false, false, true, true, false, true, false, true];
        let body = encode_lacks_ok(&flags);
        assert_eq!(body, [9, 0, 0, 0, 0b0101_1001, 1]);
        assert_eq!(
            Reply::decode(kind::LACKS | kind::REPLY, &body).unwrap(),
            Reply::LacksOk(flags.to_vec())
        );
        assert_eq!(
            Reply::decode(kind::PUT_CHUNKS | kind::REPLY, &encode_put_chunks_ok(5, 7)).unwrap(),
            Reply::PutChunksOk {
                stored: 5,
                present: 7
            }
        );
        let mut body = encode_get_chunks_ok_head(4, &chunks[..2]);
        body.extend_from_slice(b"abcframe");
        assert_eq!(
            Reply::decode(kind::GET_CHUNKS | kind::REPLY, &body).unwrap(),
            Reply::GetChunksOk {
                considered: 4,
                chunks: chunks[..2].to_vec()
            }
        );
        for (state, json) in [
            (ManifestState::Unknown, ""),
            (ManifestState::Pending, "{}"),
            (ManifestState::Written, "{\"a\":1}"),
        ] {
            let body = encode_get_manifest_ok(state, json);
            assert_eq!(
                Reply::decode(kind::GET_MANIFEST | kind::REPLY, &body).unwrap(),
                Reply::GetManifestOk { state, json }
            );
        }
    }

    #[test]
    fn hostile_dedup_frames_are_refused() {
        let bad = |k: u8, body: &[u8]| {
            assert!(
                matches!(Request::decode(k, body), Err(FrameError::Malformed { .. })),
                "kind {k:#x} accepted {body:02x?}"
            )
        };
        // Counts the body cannot hold, or over the limit; a partial score.
        bad(kind::LACKS, &BodyWriter::default().u32(65_536).buf);
        bad(kind::LACKS, &BodyWriter::default().u32(65_537).buf);
        bad(
            kind::GET_CHUNKS,
            &BodyWriter::default().u32(1).bytes(&[0; 31]).buf,
        );
        bad(
            kind::LACKS,
            &BodyWriter::default().u32(1).bytes(&[0; 33]).buf,
        );
        bad(
            kind::PUT_CHUNKS,
            &BodyWriter::default().u32(1000).bytes(&[0; 100]).buf,
        );
        // A raw chunk whose stored length is not its raw length; an empty zstd frame; a
        // chunk over 16 MiB; an unknown kind or storage; data shorter or longer.
        bad(
            kind::PUT_CHUNKS,
            &put_chunks_body(&[chunk(1, Stored::Raw, 4, b"abc")]),
        );
        bad(
            kind::PUT_CHUNKS,
            &put_chunks_body(&[chunk(1, Stored::Zstd, 4, b"")]),
        );
        let mut w = BodyWriter::default();
        w.u32(1)
            .bytes(&[0; 32])
            .u8(0)
            .u8(1)
            .u32(MAX_DATA as u32 + 1)
            .u32(1)
            .u8(0);
        bad(kind::PUT_CHUNKS, &w.buf);
        let mut b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
        b[4 + 32] = 2;
        bad(kind::PUT_CHUNKS, &b);
        let mut b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
        b[4 + 33] = 2;
        bad(kind::PUT_CHUNKS, &b);
        let b = put_chunks_body(&[chunk(2, Stored::Raw, 3, b"abc")]);
        bad(kind::PUT_CHUNKS, &b[..b.len() - 1]);
        let mut long = b.clone();
        long.push(0);
        bad(kind::PUT_CHUNKS, &long);
        // More raw bytes than one frame may decompress to.
        let zstd: Vec<WireChunk> = (0..17)
            .map(|i| chunk(i, Stored::Zstd, MAX_DATA as u32, b"z"))
            .collect();
        bad(kind::PUT_CHUNKS, &put_chunks_body(&zstd));
        // A manifest: bad flags, trailing bytes, a file count the body cannot hold.
        let part = ManifestPart {
            checkpoint: "c",
            single_file: true,
            chunking: "fixed:4KiB",
            compression: "none",
            part: 0,
            last: true,
            files: vec![],
            scores: vec![[5; 32]],
        };
        let good = encode_manifest_part(&part);
        assert!(Request::decode(kind::PUT_MANIFEST, &good).is_ok());
        let mut b = good.clone();
        b[3] = 2;
        bad(kind::PUT_MANIFEST, &b);
        let mut b = good.clone();
        b.push(0);
        bad(kind::PUT_MANIFEST, &b);
        let mut w = BodyWriter::default();
        w.str("c")
            .u8(0)
            .str("")
            .str("")
            .u32(0)
            .u8(1)
            .u32(60_000)
            .u32(0);
        bad(kind::PUT_MANIFEST, &w.buf);
        assert!(matches!(
            Request::decode(kind::GET_MANIFEST, &encode_get_manifest("../x")),
            Err(FrameError::BadPath { .. })
        ));
        // Replies: bits past the count, more chunks than scores considered, a manifest
        // with an unknown state or without its JSON.
        let badr = |k: u8, body: &[u8]| assert!(Reply::decode(k, body).is_err(), "{body:02x?}");
        badr(kind::LACKS | kind::REPLY, &[3, 0, 0, 0, 0b1000]);
        badr(kind::LACKS | kind::REPLY, &[9, 0, 0, 0, 0]);
        let mut b = encode_get_chunks_ok_head(0, &[chunk(2, Stored::Raw, 1, b"a")]);
        b.push(b'a');
        badr(kind::GET_CHUNKS | kind::REPLY, &b);
        badr(kind::GET_MANIFEST | kind::REPLY, &[3, b'{', b'}']);
        badr(kind::GET_MANIFEST | kind::REPLY, &[1]);
        badr(kind::GET_MANIFEST | kind::REPLY, &[0, b'{', b'}']);
    }

    #[test]
    fn replies_round_trip() {
        let states = vec![PullState {
            level: Level::Staged,
            stamp: 3,
            size: 10,
            blake3: [1; 32],
        }];
        let body = encode_pull_ok(&states);
        assert_eq!(
            Reply::decode(kind::PULL | kind::REPLY, &body).unwrap(),
            Reply::PullOk(states)
        );
        let body = encode_error(code::FULL, "server full");
        assert_eq!(
            Reply::decode(kind::ERROR, &body).unwrap(),
            Reply::Error {
                code: code::FULL,
                message: "server full"
            }
        );
    }
}
