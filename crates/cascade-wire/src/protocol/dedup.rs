//! The dedup messages (docs/staging-protocol.md, "Dedup messages"): chunks in their stored
//! form, delta chunks, manifest parts, and the bodies of Lacks, PutChunks, PutManifest,
//! GetChunks and GetManifest and of their replies.

use super::body::BodyReader;
use super::{BlobKind, BodyWriter, DeltaBase, FrameError, Score, Stored, BLAKE3_LEN, MAX_DATA};

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
pub(super) fn decode_scores(body: &[u8], what: &'static str) -> Result<Vec<Score>, FrameError> {
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
pub(super) fn decode_chunks<'a>(r: &mut BodyReader<'a>) -> Result<Vec<WireChunk<'a>>, FrameError> {
    let n = r.count()?;
    if n.saturating_mul(CHUNK_FIXED) > r.buf.len() {
        return r.malformed(format!("{n} chunks cannot fit in the body"));
    }
    let mut heads = Vec::with_capacity(n);
    let mut raw_total = 0u64;
    for _ in 0..n {
        let head = decode_chunk_head(r)?;
        raw_total += u64::from(head.raw_len);
        if raw_total > MAX_FRAME_RAW {
            return r.malformed(format!(
                "the chunks hold more than {MAX_FRAME_RAW} raw bytes"
            ));
        }
        heads.push(head);
    }
    let mut chunks = Vec::with_capacity(n);
    for h in heads {
        let data = match r.take(h.stored_len) {
            Ok(d) => d,
            Err(_) => return r.malformed("chunk data is shorter than its descriptors say"),
        };
        chunks.push(WireChunk {
            score: h.score,
            kind: h.kind,
            stored: h.stored,
            raw_len: h.raw_len,
            data,
        });
    }
    Ok(chunks)
}

/// A chunk's descriptor: everything but its data.
struct ChunkHead {
    score: Score,
    kind: BlobKind,
    stored: Stored,
    raw_len: u32,
    stored_len: usize,
}

/// One descriptor, its lengths checked against the limits and its storage.
fn decode_chunk_head(r: &mut BodyReader) -> Result<ChunkHead, FrameError> {
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
    Ok(ChunkHead {
        score,
        kind,
        stored,
        raw_len,
        stored_len,
    })
}

pub(super) fn decode_manifest_part(body: &[u8]) -> Result<ManifestPart<'_>, FrameError> {
    let mut r = BodyReader::new(body, "PutManifest");
    let checkpoint = r.key()?;
    let single_file = r.flag("single-file flag")?;
    let chunking = r.str()?;
    let compression = r.str()?;
    let part = r.u32()?;
    let last = r.flag("last-part flag")?;
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
