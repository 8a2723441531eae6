//! Delta blobs (docs/dedup.md, "Delta blobs"): a new chunk of a file whose previous version
//! the repository holds may be stored as a zstd frame of its XOR with the previous version's
//! chunk at the same offset, its *base*. Where a training step nudged every float a little,
//! sign, exponent and high mantissa bits stay put, and the XOR is mostly zero bytes.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::compress::max_compressed_len;
use crate::ingest::Packed;
use crate::repo::format::DeltaBase;
use crate::{score, Compression, Score};

/// The most blobs a delta blob depends on (its base, the base's base, ...): reading one reads
/// at most this many more. A chunk whose base is this deep is stored on its own.
pub const MAX_DELTA_DEPTH: usize = 4;

/// A delta is kept without trying the chunk on its own when its frame is at most this
/// fraction of the chunk (1/4): compressing the chunk as well could not gain much.
const CLEAR_WIN_DIVISOR: usize = 4;

/// Deltas tried in a file before their record decides whether to go on trying them.
const TRIALS: u64 = 16;
/// Once deltas lose (in a file whose data does not drift, e.g. molecular-dynamics restarts
/// where every value moves), one chunk in this many still tries one, to notice a change.
const PROBE_EVERY: u64 = 16;

/// The bytes of a file's previous version, read by offset: a slice or a mapped file
/// (`AsRef<[u8]>`), or e.g. a file in the node store whose pieces are not contiguous.
/// Whatever they yield is checked against the previous version's scores before use, so a
/// source that changes under the reads costs ratio, never data.
pub trait BaseBytes: Sync {
    /// Fills `buf` with the bytes at `offset`; false if the source does not have them all.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> bool;
}

impl<T: AsRef<[u8]> + Sync + ?Sized> BaseBytes for T {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> bool {
        let bytes = self.as_ref();
        let found = usize::try_from(offset)
            .ok()
            .and_then(|start| bytes.get(start..start.checked_add(buf.len())?));
        match found {
            Some(found) => {
                buf.copy_from_slice(found);
                true
            }
            None => false,
        }
    }
}

/// One chunk of the previous version, and whether a delta may use it as its base (it is in
/// the index outside condemned packs, less than [`MAX_DELTA_DEPTH`] deep).
#[derive(Debug, Clone)]
pub(crate) struct BaseChunk {
    pub offset: u64,
    pub len: u64,
    pub score: Score,
    pub usable: bool,
}

/// The previous version of a file being added: its bytes and its chunks, in file order
/// ([`crate::repo::Repo::base_file`]).
pub struct BaseFile<'a> {
    bytes: &'a dyn BaseBytes,
    chunks: Vec<BaseChunk>,
    /// Deltas tried in this file, and those that won: smaller than the chunk compressed
    /// alone by at least an eighth (trying costs a second compression).
    tried: AtomicU64,
    won: AtomicU64,
}

thread_local! {
    /// The chunk being XORed, and the base chunk it is XORed with (copied out of the base's
    /// source, then checked against its score).
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl<'a> BaseFile<'a> {
    /// `leaves` are the previous version's chunks ((score, length), as its recipe lists them);
    /// `usable` says which may be a base.
    pub(crate) fn new(
        bytes: &'a dyn BaseBytes,
        leaves: &[(Score, u64)],
        usable: impl Fn(&Score) -> bool,
    ) -> Self {
        let mut offset = 0u64;
        let chunks = leaves
            .iter()
            .map(|&(score, len)| {
                let chunk = BaseChunk {
                    offset,
                    len,
                    score,
                    usable: usable(&score),
                };
                offset += len;
                chunk
            })
            .collect();
        BaseFile {
            bytes,
            chunks,
            tried: AtomicU64::new(0),
            won: AtomicU64::new(0),
        }
    }

    /// Whether the next chunk tries a delta: always for the first [`TRIALS`], then while at
    /// least a quarter won, else one in [`PROBE_EVERY`].
    fn worth_trying(&self) -> bool {
        let tried = self.tried.load(Ordering::Relaxed);
        tried < TRIALS || self.won.load(Ordering::Relaxed) * 4 >= tried || tried % PROBE_EVERY == 0
    }

    /// The usable base chunk covering file offset `offset`.
    fn base_at(&self, offset: u64) -> Option<&BaseChunk> {
        let i = self.chunks.partition_point(|c| c.offset + c.len <= offset);
        self.chunks.get(i).filter(|c| c.usable)
    }

    /// The stored form of a new chunk at file offset `offset`: a delta against the base chunk
    /// covering that offset when its frame is smaller than the chunk compressed alone, else
    /// the chunk compressed alone (`None`: neither saves an eighth, store it raw). A delta
    /// frame of at most a quarter of the chunk is kept without compressing the chunk alone;
    /// in a file where deltas mostly lose, most chunks do not try one (`worth_trying`).
    pub fn pack(&self, compression: Compression, offset: u64, data: &[u8]) -> Option<Packed> {
        let alone = |limit| {
            compression
                .compress_within(data, limit)
                .map(|bytes| Packed { bytes, base: None })
        };
        if !self.worth_trying() {
            return alone(max_compressed_len(data.len()));
        }
        let Some(delta) = self.delta(compression, offset, data) else {
            return alone(max_compressed_len(data.len()));
        };
        self.tried.fetch_add(1, Ordering::Relaxed);
        if delta.bytes.len() <= data.len() / CLEAR_WIN_DIVISOR {
            self.won.fetch_add(1, Ordering::Relaxed);
            return Some(delta);
        }
        match alone(max_compressed_len(data.len())) {
            Some(packed) if packed.bytes.len() < delta.bytes.len() => Some(packed),
            packed => {
                if packed.is_none_or(|p| delta.bytes.len() <= max_compressed_len(p.bytes.len())) {
                    self.won.fetch_add(1, Ordering::Relaxed);
                }
                Some(delta)
            }
        }
    }

    /// `data` as a delta against the base chunk covering `offset`, if there is one and its
    /// bytes are what its score says (the source's bytes are checked, never trusted).
    fn delta(&self, compression: Compression, offset: u64, data: &[u8]) -> Option<Packed> {
        let base = self.base_at(offset)?;
        let from = u32::try_from(offset - base.offset).ok()?;
        SCRATCH.with(|scratch| {
            let (xored, base_bytes) = &mut *scratch.borrow_mut();
            base_bytes.resize(usize::try_from(base.len).ok()?, 0);
            if !self.bytes.read_exact_at(base.offset, base_bytes) || score(base_bytes) != base.score
            {
                return None;
            }
            xored.clear();
            xored.extend_from_slice(data);
            xor_with_base(xored, base_bytes, from).ok()?;
            let bytes = compression.compress_within(xored, max_compressed_len(data.len()))?;
            Some(Packed {
                bytes,
                base: Some(DeltaBase {
                    score: base.score,
                    from,
                }),
            })
        })
    }
}

/// A new chunk's stored form: with a `base`, a delta where that wins ([`BaseFile::pack`]),
/// else the chunk compressed alone where that pays; `None`: store it raw.
pub fn pack_chunk(
    compression: Compression,
    base: Option<&BaseFile>,
    offset: u64,
    data: &[u8],
) -> Option<Packed> {
    match base {
        Some(base) => base.pack(compression, offset, data),
        None => compression
            .compress(data)
            .map(|bytes| Packed { bytes, base: None }),
    }
}

/// The chunk a delta blob stands for: its zstd frame decompressed to `raw_len` bytes and
/// XORed with its base's raw bytes from byte `from` on. Not checked: the caller checks the
/// chunk against its score.
pub fn undo_delta(frame: &[u8], raw_len: u32, base: &[u8], from: u32) -> Result<Vec<u8>, String> {
    let mut raw = Compression::decompress(frame, raw_len as usize)
        .map_err(|e| format!("its delta frame does not decompress to {raw_len} bytes: {e}"))?;
    xor_with_base(&mut raw, base, from)?;
    Ok(raw)
}

/// XORs `data[i]` with `base[from + i]` wherever the base has that byte: makes a delta of a
/// chunk, and the chunk of a delta again. Fails when `from` is past the base's end (a corrupt
/// entry).
pub(crate) fn xor_with_base(data: &mut [u8], base: &[u8], from: u32) -> Result<(), String> {
    let tail = base.get(from as usize..).ok_or_else(|| {
        format!(
            "its delta starts at byte {from} of a base of {} bytes",
            base.len()
        )
    })?;
    for (d, b) in data.iter_mut().zip(tail) {
        *d ^= b;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(n: usize, nudge: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (((i as f32) * 0.37).sin() * (1.0 + nudge)).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_nudged_chunk_is_a_small_delta_that_comes_back_whole() {
        let old = floats(16384, 0.0);
        let new = floats(16384, 1e-4);
        let zstd = Compression::Zstd { level: 1 };
        let half = old.len() as u64 / 2;
        let base = BaseFile::new(
            &old,
            &[
                (score(&old[..half as usize]), half),
                (score(&old[half as usize..]), half),
            ],
            |_| true,
        );
        // A chunk starting 100 bytes into the second base chunk, running past its end.
        let at = half + 100;
        let chunk = &new[at as usize..];
        let packed = base.pack(zstd, at, chunk).expect("packed");
        let delta = packed.base.expect("a delta");
        assert_eq!(
            (delta.score, delta.from),
            (score(&old[half as usize..]), 100)
        );
        let alone = zstd.compress(chunk).map_or(chunk.len(), |z| z.len());
        assert!(
            packed.bytes.len() * 4 < alone * 3,
            "{} vs {alone}",
            packed.bytes.len()
        );
        let mut back = Compression::decompress(&packed.bytes, chunk.len()).unwrap();
        xor_with_base(&mut back, &old[half as usize..], delta.from).unwrap();
        assert_eq!(back, chunk);
    }

    #[test]
    fn bases_that_are_not_what_their_scores_say_or_unusable_are_not_used() {
        let old = floats(4096, 0.0);
        let new = floats(4096, 1e-4);
        let zstd = Compression::Zstd { level: 1 };
        let len = old.len() as u64;
        let lying = BaseFile::new(&new, &[(score(&old), len)], |_| true);
        assert_eq!(lying.pack(zstd, 0, &new).and_then(|p| p.base), None);
        let unusable = BaseFile::new(&old, &[(score(&old), len)], |_| false);
        assert_eq!(unusable.pack(zstd, 0, &new).and_then(|p| p.base), None);
        let none = BaseFile::new(&old, &[(score(&old), len)], |_| true);
        assert_eq!(none.pack(Compression::None, 0, &new), None);
        assert!(xor_with_base(&mut [0u8; 4], &[1, 2], 3).is_err());
    }
}
