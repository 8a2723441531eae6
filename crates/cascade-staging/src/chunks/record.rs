//! The byte format of a chunk record in a segment file (docs/staging-arenas.md, "Chunk
//! segments"). Every record describes itself, so the score index is rebuilt from the
//! segments alone, and a torn tail fails its checksum.

use cascade_dedup::repo::format::{BlobKind, Stored};
use cascade_dedup::Score;

pub(crate) const MAGIC: &[u8; 4] = b"CCK1";
/// Magic, CRC, kind, storage, namespace length, raw length, stored length, score.
pub(crate) const HEADER_LEN: usize = 4 + 4 + 1 + 1 + 2 + 4 + 4 + 32;
/// Longest namespace (a key of the protocol).
pub(crate) const MAX_NAMESPACE: usize = crate::protocol::MAX_KEY;
/// Largest stored chunk (a frame's data payload).
pub(crate) const MAX_STORED: usize = crate::protocol::MAX_DATA;

/// A parsed record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub crc: u32,
    pub kind: BlobKind,
    pub stored: Stored,
    pub ns_len: usize,
    pub raw_len: u32,
    pub stored_len: usize,
    pub score: Score,
}

impl Header {
    /// Bytes of the whole record.
    pub fn record_len(&self) -> usize {
        HEADER_LEN + self.ns_len + self.stored_len
    }
}

/// Appends one record to `out`.
pub(crate) fn encode(
    out: &mut Vec<u8>,
    namespace: &str,
    score: &Score,
    kind: BlobKind,
    stored: Stored,
    raw_len: u32,
    data: &[u8],
) {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]); // CRC, filled in below
    out.push(kind as u8);
    out.push(stored as u8);
    // Callers pass protocol keys (at most MAX_KEY bytes) and payloads (at most MAX_DATA).
    out.extend_from_slice(&(namespace.len() as u16).to_le_bytes());
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(score);
    out.extend_from_slice(namespace.as_bytes());
    out.extend_from_slice(data);
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses a record header; Err says why it is not one (a torn or garbled tail).
pub(crate) fn decode_header(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
    if &b[..4] != MAGIC {
        return Err(format!("no record magic (found {:02x?})", &b[..4]));
    }
    let kind = match b[8] {
        0 => BlobKind::Data,
        1 => BlobKind::Tree,
        k => return Err(format!("unknown chunk kind {k}")),
    };
    let stored = match b[9] {
        0 => Stored::Raw,
        1 => Stored::Zstd,
        2 => Stored::Delta,
        s => return Err(format!("unknown chunk storage {s}")),
    };
    let ns_len = u16::from_le_bytes([b[10], b[11]]) as usize;
    let raw_len = u32_at(b, 12);
    let stored_len = u32_at(b, 16) as usize;
    if ns_len > MAX_NAMESPACE || stored_len > MAX_STORED || raw_len as usize > MAX_STORED {
        return Err(format!(
            "lengths out of range (namespace {ns_len}, stored {stored_len}, raw {raw_len})"
        ));
    }
    if stored == Stored::Raw && stored_len != raw_len as usize {
        return Err(format!(
            "raw chunk of {raw_len} bytes stored in {stored_len}"
        ));
    }
    if stored == Stored::Delta && stored_len <= crate::protocol::DELTA_PREFIX {
        return Err(format!("delta chunk of {stored_len} bytes"));
    }
    let mut score = [0u8; 32];
    score.copy_from_slice(&b[20..52]);
    Ok(Header {
        crc: u32_at(b, 4),
        kind,
        stored,
        ns_len,
        raw_len,
        stored_len,
        score,
    })
}

/// Checks a whole record (`rec` holds exactly `h.record_len()` bytes) against its CRC and
/// returns its namespace and stored bytes.
pub(crate) fn check_body<'a>(h: &Header, rec: &'a [u8]) -> Result<(&'a str, &'a [u8]), String> {
    if rec.len() != h.record_len() {
        return Err(format!(
            "record of {} bytes, its header says {}",
            rec.len(),
            h.record_len()
        ));
    }
    let got = crc32c::crc32c(&rec[8..]);
    if got != h.crc {
        return Err(format!(
            "checksum mismatch (header {:#010x}, bytes {got:#010x})",
            h.crc
        ));
    }
    let ns = std::str::from_utf8(&rec[HEADER_LEN..HEADER_LEN + h.ns_len])
        .map_err(|_| "namespace is not UTF-8".to_string())?;
    Ok((ns, &rec[HEADER_LEN + h.ns_len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let mut out = Vec::new();
        encode(
            &mut out,
            "job1",
            &[7; 32],
            BlobKind::Tree,
            Stored::Zstd,
            100,
            b"frame",
        );
        assert_eq!(out.len(), HEADER_LEN + 4 + 5);
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&out[..HEADER_LEN]);
        let h = decode_header(&head).unwrap();
        assert_eq!(
            (h.kind, h.stored, h.raw_len, h.score),
            (BlobKind::Tree, Stored::Zstd, 100, [7; 32])
        );
        assert_eq!(check_body(&h, &out).unwrap(), ("job1", &b"frame"[..]));
        for i in [4, 8, 20, 52, out.len() - 1] {
            let mut bad = out.clone();
            bad[i] ^= 1;
            let mut head = [0u8; HEADER_LEN];
            head.copy_from_slice(&bad[..HEADER_LEN]);
            let damaged = decode_header(&head).and_then(|h| check_body(&h, &bad).map(|_| ()));
            assert!(damaged.is_err(), "a flip at byte {i} went unnoticed");
        }
        assert!(check_body(&h, &out[..out.len() - 1]).is_err());
    }
}
