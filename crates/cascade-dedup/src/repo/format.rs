//! Byte formats of the repository's objects: pack trailers, index objects and recipe blocks
//! (docs/dedup.md, "Repository layout"). All integers little-endian.

use crate::Score;

/// What a blob in a pack holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// File data (a chunk).
    Data = 0,
    /// A recipe block (a node of a file's Merkle tree).
    Tree = 1,
}

/// How a blob is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stored {
    Raw = 0,
    Zstd = 1,
    /// A zstd frame of the blob XORed with another blob, its base ([`DeltaBase`]).
    Delta = 2,
}

/// The blob a [`Stored::Delta`] blob was XORed with: byte `i` of the blob was XORed with
/// byte `from + i` of the base, for every `i` the base has (`from + i < base length`); the
/// blob's bytes past the base's end are as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeltaBase {
    pub score: Score,
    pub from: u32,
}

/// One blob of a pack: 48 bytes on disk, 88 for a [`Stored::Delta`] blob (its base follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobEntry {
    pub score: Score,
    /// Offset of the stored bytes in the pack.
    pub offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    pub kind: BlobKind,
    pub stored: Stored,
    /// Set exactly when `stored` is [`Stored::Delta`].
    pub base: Option<DeltaBase>,
}

/// Bytes of an entry, and of the base that follows a delta blob's entry.
pub const ENTRY_LEN: usize = 48;
pub const DELTA_BASE_LEN: usize = 40;
/// The index format version written; version 1 (no delta blobs) is read too.
pub const INDEX_VERSION: u32 = 2;
pub const PACK_MAGIC: &[u8; 4] = b"CPK1";
pub const INDEX_MAGIC: &[u8; 4] = b"CIX1";
pub const BLOCK_MAGIC: &[u8; 4] = b"CRB1";
/// Children per recipe block: a block of 1024 entries is 40 KiB + 12 bytes.
pub const BLOCK_FANOUT: usize = 1024;
const BLOCK_ENTRY_LEN: usize = 40;
const BLOCK_HEADER_LEN: usize = 12;

/// Why bytes could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(what: impl Into<String>) -> FormatError {
    FormatError(what.into())
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, FormatError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, FormatError> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn score_at(b: &[u8], at: usize) -> Result<Score, FormatError> {
    b.get(at..at + 32)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

impl BlobEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.score);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.push(self.kind as u8);
        out.push(self.stored as u8);
        out.extend_from_slice(&[0, 0]);
        if let Some(base) = self.base {
            out.extend_from_slice(&base.score);
            out.extend_from_slice(&base.from.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
        }
    }

    /// Bytes [`BlobEntry::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        ENTRY_LEN + self.base.map_or(0, |_| DELTA_BASE_LEN)
    }

    /// The entry at the start of `b`.
    pub fn decode(b: &[u8]) -> Result<BlobEntry, FormatError> {
        if b.len() < ENTRY_LEN {
            return Err(bad("truncated blob entry"));
        }
        let kind = match b[44] {
            0 => BlobKind::Data,
            1 => BlobKind::Tree,
            k => return Err(bad(format!("unknown blob kind {k}"))),
        };
        let stored = match b[45] {
            0 => Stored::Raw,
            1 => Stored::Zstd,
            2 => Stored::Delta,
            s => return Err(bad(format!("unknown blob storage {s}"))),
        };
        let base = match stored {
            Stored::Delta => Some(DeltaBase {
                score: score_at(b, ENTRY_LEN)?,
                from: u32_at(b, ENTRY_LEN + 32)?,
            }),
            _ => None,
        };
        Ok(BlobEntry {
            score: score_at(b, 0)?,
            offset: u32_at(b, 32)?,
            stored_len: u32_at(b, 36)?,
            raw_len: u32_at(b, 40)?,
            kind,
            stored,
            base,
        })
    }
}

/// Entries back to back in `b`, exactly `count` of them filling it.
fn decode_entries(b: &[u8], count: usize) -> Result<Vec<BlobEntry>, FormatError> {
    let mut entries = Vec::with_capacity(count.min(b.len() / ENTRY_LEN));
    let mut at = 0;
    for _ in 0..count {
        let e = BlobEntry::decode(&b[at.min(b.len())..])?;
        at += e.encoded_len();
        entries.push(e);
    }
    if at != b.len() {
        return Err(bad("blob entries do not fill their space"));
    }
    Ok(entries)
}

/// The trailer closing a pack: entries, their count, the trailer's length, the magic.
pub fn encode_pack_trailer(entries: &[BlobEntry], out: &mut Vec<u8>) {
    let start = out.len();
    for e in entries {
        e.encode(out);
    }
    let len = out.len() - start;
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(PACK_MAGIC);
}

/// Reads a whole pack's trailer (checking every entry lies inside the blob area).
pub fn decode_pack_trailer(pack: &[u8]) -> Result<Vec<BlobEntry>, FormatError> {
    let n = pack.len();
    if n < 12 || &pack[n - 4..] != PACK_MAGIC {
        return Err(bad("not a pack (no CPK1 magic at the end)"));
    }
    let count = u32_at(pack, n - 12)? as usize;
    let len = u32_at(pack, n - 8)? as usize;
    if len + 12 > n {
        return Err(bad("pack trailer longer than the pack"));
    }
    let start = n - 12 - len;
    let entries = decode_entries(&pack[start..n - 12], count)
        .map_err(|e| bad(format!("pack trailer: {e}")))?;
    if entries
        .iter()
        .any(|e| e.offset as usize + e.stored_len as usize > start)
    {
        return Err(bad("a pack entry points past the blob area"));
    }
    Ok(entries)
}

/// An index object: for each pack written in one session, its id and blob entries.
pub fn encode_index(packs: &[(Score, Vec<BlobEntry>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    out.extend_from_slice(&(packs.len() as u32).to_le_bytes());
    for (id, entries) in packs {
        out.extend_from_slice(id);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in entries {
            e.encode(&mut out);
        }
    }
    out
}

pub fn decode_index(b: &[u8]) -> Result<Vec<(Score, Vec<BlobEntry>)>, FormatError> {
    if b.get(..4) != Some(INDEX_MAGIC.as_slice()) {
        return Err(bad("not an index object (no CIX1 magic)"));
    }
    let version = u32_at(b, 4)?;
    if !(1..=INDEX_VERSION).contains(&version) {
        return Err(bad(format!(
            "index format version {version} (this build reads 1 to {INDEX_VERSION})"
        )));
    }
    let packs = u32_at(b, 8)? as usize;
    let mut at = 12;
    let mut out = Vec::with_capacity(packs.min(1 << 16));
    for _ in 0..packs {
        let id = score_at(b, at)?;
        let count = u32_at(b, at + 32)? as usize;
        at += 36;
        let mut entries = Vec::with_capacity(count.min(b.len() / ENTRY_LEN));
        for _ in 0..count {
            let e = BlobEntry::decode(&b[at.min(b.len())..])?;
            if version == 1 && e.base.is_some() {
                return Err(bad("a delta blob in an index of version 1"));
            }
            at += e.encoded_len();
            entries.push(e);
        }
        out.push((id, entries));
    }
    if at != b.len() {
        return Err(bad("trailing bytes after the index"));
    }
    Ok(out)
}

/// A recipe block: the children of one node of a file's Merkle tree, each (score, bytes of
/// the file it covers). Level 0 children are data chunks; level k children are level k-1
/// blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub level: u8,
    pub children: Vec<(Score, u64)>,
}

impl Block {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BLOCK_HEADER_LEN + self.children.len() * 40);
        out.extend_from_slice(BLOCK_MAGIC);
        out.push(self.level);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&(self.children.len() as u32).to_le_bytes());
        for (score, len) in &self.children {
            out.extend_from_slice(score);
            out.extend_from_slice(&len.to_le_bytes());
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Block, FormatError> {
        if b.get(..4) != Some(BLOCK_MAGIC.as_slice()) {
            return Err(bad("not a recipe block (no CRB1 magic)"));
        }
        let level = b[4];
        let count = u32_at(b, 8)? as usize;
        if count > BLOCK_FANOUT || b.len() != BLOCK_HEADER_LEN + count * BLOCK_ENTRY_LEN {
            return Err(bad("recipe block length does not match its entry count"));
        }
        let children = (0..count)
            .map(|i| {
                let at = BLOCK_HEADER_LEN + i * BLOCK_ENTRY_LEN;
                Ok((score_at(b, at)?, u64_at(b, at + 32)?))
            })
            .collect::<Result<_, FormatError>>()?;
        Ok(Block { level, children })
    }

    /// Bytes of the file this block covers.
    pub fn len(&self) -> u64 {
        self.children.iter().map(|(_, l)| l).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

/// The recipe blocks of a file whose chunks are `leaves` ((score, length) in file order),
/// built as `RepoWriter::add_file` builds them: [`BLOCK_FANOUT`] children per block, level by
/// level, until one block remains (an empty file is one empty level-0 block). Returns the
/// root's score and every block as (score, encoded bytes), children before parents; a block
/// repeated within the file is listed each time. For writers outside the repository (an
/// agent sending chunks to staging servers) that must produce the same trees.
pub fn recipe_blocks(leaves: &[(Score, u64)]) -> (Score, Vec<(Score, Vec<u8>)>) {
    let mut blocks = Vec::new();
    let mut children = leaves.to_vec();
    let mut level = 0u8;
    loop {
        let groups: Vec<&[(Score, u64)]> = if children.is_empty() {
            vec![&[]]
        } else {
            children.chunks(BLOCK_FANOUT).collect()
        };
        let mut parents = Vec::with_capacity(groups.len());
        for group in groups {
            let block = Block {
                level,
                children: group.to_vec(),
            };
            let bytes = block.encode();
            let s = crate::score(&bytes);
            parents.push((s, block.len()));
            blocks.push((s, bytes));
        }
        if parents.len() == 1 {
            return (parents[0].0, blocks);
        }
        children = parents;
        // 1024^255 chunks cannot exist: the level never wraps.
        level = level.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u8) -> BlobEntry {
        BlobEntry {
            score: [i; 32],
            offset: i as u32 * 100,
            stored_len: 100,
            raw_len: 150,
            kind: if i % 2 == 0 {
                BlobKind::Data
            } else {
                BlobKind::Tree
            },
            stored: match i % 3 {
                0 => Stored::Raw,
                1 => Stored::Zstd,
                _ => Stored::Delta,
            },
            base: (i % 3 == 2).then_some(DeltaBase {
                score: [i + 1; 32],
                from: i as u32 * 7,
            }),
        }
    }

    #[test]
    fn pack_trailer_round_trips_and_rejects_damage() {
        let entries: Vec<BlobEntry> = (0..5).map(entry).collect();
        let mut pack = vec![7u8; 500];
        encode_pack_trailer(&entries, &mut pack);
        assert_eq!(decode_pack_trailer(&pack).unwrap(), entries);
        let mut short = pack.clone();
        short.truncate(pack.len() - 1);
        assert!(decode_pack_trailer(&short).is_err());
        // An entry past the blob area.
        let mut past = vec![7u8; 400];
        encode_pack_trailer(&entries, &mut past);
        assert!(decode_pack_trailer(&past).is_err());
    }

    #[test]
    fn index_round_trips_and_rejects_damage() {
        let packs = vec![
            ([1u8; 32], (0..3).map(entry).collect::<Vec<_>>()),
            ([2u8; 32], vec![]),
        ];
        let b = encode_index(&packs);
        assert_eq!(decode_index(&b).unwrap(), packs);
        for cut in [0, 3, 11, 40, b.len() - 1] {
            assert!(decode_index(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_index(&extra).is_err());
    }

    #[test]
    fn blocks_round_trip() {
        let block = Block {
            level: 2,
            children: vec![([3; 32], 10), ([4; 32], 1 << 40)],
        };
        let b = block.encode();
        assert_eq!(Block::decode(&b).unwrap(), block);
        assert_eq!(block.len(), 10 + (1 << 40));
        assert!(Block::decode(&b[..b.len() - 1]).is_err());
        let empty = Block {
            level: 0,
            children: vec![],
        };
        assert_eq!(Block::decode(&empty.encode()).unwrap(), empty);
    }
}
