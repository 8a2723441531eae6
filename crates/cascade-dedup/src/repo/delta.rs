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

/// A delta is kept without trying the chunk on its own, even on a probe, when its frame is at
/// most this fraction of the chunk (1/4): compressing the chunk as well could not gain much.
const CLEAR_WIN_DIVISOR: usize = 4;

/// New chunks at the start of a file that are probes: each tries a delta, and one that pays
/// but is over a quarter of the chunk is compared with the chunk compressed alone.
const TRIALS: u64 = 16;
/// After the first [`TRIALS`], one new chunk in this many is a probe: where deltas lose (a
/// rewritten file; molecular-dynamics restarts, where every value moves and the XOR is only a
/// few per cent smaller than the chunk alone) it notices when they win again, and where
/// they win it checks that the chunk alone is not clearly smaller (data that moved).
const PROBE_EVERY: u64 = 32;

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
    /// New chunks of this file asked for (the probes are counted in them).
    seen: AtomicU64,
    /// Deltas whose outcome is known in this file, and those that won: at most a quarter of
    /// the chunk, or smaller than the chunk compressed alone less an eighth of it.
    tried: AtomicU64,
    won: AtomicU64,
    /// Chunks compressed twice (alone beside their delta, on probes).
    compared: AtomicU64,
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
            seen: AtomicU64::new(0),
            tried: AtomicU64::new(0),
            won: AtomicU64::new(0),
            compared: AtomicU64::new(0),
        }
    }

    /// The usable base chunk covering file offset `offset`.
    fn base_at(&self, offset: u64) -> Option<&BaseChunk> {
        let i = self.chunks.partition_point(|c| c.offset + c.len <= offset);
        self.chunks.get(i).filter(|c| c.usable)
    }

    /// The stored form of a new chunk at file offset `offset`: a delta against the base chunk
    /// covering that offset, or the chunk compressed alone (`None`: neither saves an eighth,
    /// store it raw). Each chunk is compressed once, but on *probes* (the first [`TRIALS`]
    /// new chunks of the file, then one in [`PROBE_EVERY`]): there a delta over a quarter of
    /// the chunk is compared with the chunk alone and the smaller kept. The probes, and the
    /// deltas whose outcome is plain without comparing, make the file's record: while deltas
    /// win in at least a quarter of it, every chunk is stored as a delta when that pays,
    /// without a second compression; otherwise as the chunk alone, only probes trying a delta.
    pub fn pack(&self, compression: Compression, offset: u64, data: &[u8]) -> Option<Packed> {
        let alone = || {
            compression
                .compress(data)
                .map(|bytes| Packed { bytes, base: None })
        };
        let seen = self.seen.fetch_add(1, Ordering::Relaxed);
        let probe = seen < TRIALS || seen % PROBE_EVERY == 0;
        if !probe && !self.deltas_win() {
            return alone();
        }
        let Some(delta) = self.delta(compression, offset, data) else {
            // No usable base here: nothing learnt about deltas.
            return alone();
        };
        let Some(delta) = delta else {
            self.record(false);
            return alone();
        };
        if delta.bytes.len() <= data.len() / CLEAR_WIN_DIVISOR {
            self.record(true);
            return Some(delta);
        }
        if !probe {
            return Some(delta);
        }
        // The chunk alone as well, and the smaller kept. zstd stops once the chunk alone is
        // an eighth larger than the delta: past that the delta wins, whatever its size.
        self.compared.fetch_add(1, Ordering::Relaxed);
        let limit = delta.bytes.len() + delta.bytes.len() / 7;
        match compression.compress_within(data, limit) {
            Some(bytes) => {
                self.record(delta.bytes.len() <= max_compressed_len(bytes.len()));
                if bytes.len() < delta.bytes.len() {
                    Some(Packed { bytes, base: None })
                } else {
                    Some(delta)
                }
            }
            None => {
                self.record(true);
                Some(delta)
            }
        }
    }

    fn record(&self, won: bool) {
        self.tried.fetch_add(1, Ordering::Relaxed);
        if won {
            self.won.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Deltas won in at least a quarter of this file's record (or nothing is recorded yet).
    fn deltas_win(&self) -> bool {
        self.won.load(Ordering::Relaxed) * 4 >= self.tried.load(Ordering::Relaxed)
    }

    /// `data` as a delta against the base chunk covering `offset`: `None` when there is no
    /// such chunk or its bytes are not what its score says (the source's bytes are checked,
    /// never trusted), `Some(None)` when the delta's frame does not pay.
    fn delta(&self, compression: Compression, offset: u64, data: &[u8]) -> Option<Option<Packed>> {
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
            let bytes = compression.compress_within(xored, max_compressed_len(data.len()));
            Some(bytes.map(|bytes| Packed {
                bytes,
                base: Some(DeltaBase {
                    score: base.score,
                    from,
                }),
            }))
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
    use cascade_testkit::random;

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

    /// Compressible bytes: words from a small vocabulary picked by a xorshift stream.
    fn text(n: usize, seed: u64) -> Vec<u8> {
        let words: [&[u8]; 8] = [
            b"atom ", b"x=1.5 ", b"type 2 ", b"v 0.0 ", b"id ", b"mol ", b"q ", b"\n",
        ];
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(words[(x % 8) as usize]);
        }
        out.truncate(n);
        out
    }

    /// A base file of `n` chunks of `len` bytes over `old`, every chunk usable.
    #[allow(clippy::ptr_arg)] // BaseBytes is for sized sources: a Vec, not a slice.
    fn base_of(old: &Vec<u8>, len: usize) -> BaseFile<'_> {
        let leaves: Vec<(Score, u64)> = old
            .chunks(len)
            .map(|c| (score(c), c.len() as u64))
            .collect();
        BaseFile::new(old, &leaves, |_| true)
    }

    /// Packs every chunk of `new` in file order; checks each comes back whole.
    fn pack_all(base: &BaseFile, old: &[u8], new: &[u8], len: usize) -> Vec<Option<Packed>> {
        let zstd = Compression::Zstd { level: -2 };
        new.chunks(len)
            .enumerate()
            .map(|(i, chunk)| {
                let at = i * len;
                let packed = base.pack(zstd, at as u64, chunk);
                if let Some(p) = &packed {
                    let back = match &p.base {
                        Some(b) => {
                            undo_delta(&p.bytes, chunk.len() as u32, &old[at..at + len], b.from)
                        }
                        None => Compression::decompress(&p.bytes, chunk.len())
                            .map_err(|e| e.to_string()),
                    };
                    assert_eq!(back.as_deref(), Ok(chunk), "chunk {i}");
                }
                packed
            })
            .collect()
    }

    const LEN: usize = 8192;
    const CHUNKS: usize = 64;

    /// Every chunk of `new` packed against `old`, the first one's stored length, and the
    /// length of that chunk compressed alone.
    fn pack_half_rewritten(
        base: &BaseFile,
        old: &[u8],
        new: &[u8],
    ) -> (Vec<Option<Packed>>, usize, usize) {
        let alone = Compression::Zstd { level: -2 }
            .compress(&new[..LEN])
            .expect("pays");
        let packed = pack_all(base, old, new, LEN);
        let delta_len = packed[0].as_ref().expect("packed").bytes.len();
        (packed, delta_len, alone.len())
    }

    /// An old and a new version of [`CHUNKS`] chunks: in each, the first half noise that
    /// changed, the second half `kept(i)` in both.
    fn half_rewritten(kept: impl Fn(u64) -> Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        let (mut old, mut new) = (Vec::new(), Vec::new());
        for i in 0..CHUNKS as u64 {
            let kept = kept(i);
            old.extend_from_slice(&random(LEN / 2, 2 * i + 1));
            old.extend_from_slice(&kept);
            new.extend_from_slice(&random(LEN / 2, 2 * i + 2));
            new.extend_from_slice(&kept);
        }
        (old, new)
    }

    #[test]
    fn a_delta_that_wins_is_kept_without_compressing_the_chunk_alone_but_on_probes() {
        // Every chunk: half of it rewritten with noise, half text left as it was. The delta is
        // the noise alone, over a quarter of the chunk; the chunk alone is the noise and the
        // text compressed: the delta wins by more than an eighth.
        let (old, new) = half_rewritten(|i| text(LEN / 2, 1000 + i));
        let base = base_of(&old, LEN);
        let (packed, delta_len, alone_len) = pack_half_rewritten(&base, &old, &new);
        assert!(delta_len > LEN / 4 && delta_len <= max_compressed_len(alone_len));
        let deltas = packed.iter().flatten().filter(|p| p.base.is_some()).count();
        assert_eq!(deltas, CHUNKS, "every chunk a delta");
        // The chunk alone was compressed beside its delta only on the probes.
        let compared = base.compared.load(Ordering::Relaxed);
        assert_eq!(compared, TRIALS + (CHUNKS as u64 - TRIALS) / PROBE_EVERY);
    }

    #[test]
    fn where_a_delta_saves_less_than_an_eighth_over_the_chunk_alone_only_probes_try_one() {
        // As above, but the text half compresses so well that the delta, though smaller than
        // the chunk alone, is not an eighth smaller (as in molecular-dynamics restarts, where
        // every value moves): not worth reading and checking the base for every chunk.
        let (old, new) = half_rewritten(|i| text(LEN / 32, 1000 + i).repeat(16));
        let base = base_of(&old, LEN);
        let (packed, delta_len, alone_len) = pack_half_rewritten(&base, &old, &new);
        assert!(delta_len < alone_len && delta_len > max_compressed_len(alone_len));
        for (i, p) in packed.iter().enumerate().skip(TRIALS as usize) {
            let probe = i as u64 % PROBE_EVERY == 0;
            assert_eq!(
                p.as_ref().map(|p| p.base.is_some()),
                Some(probe),
                "chunk {i}"
            );
        }
    }

    #[test]
    fn where_the_chunk_alone_beats_its_delta_it_is_stored_alone() {
        // The new version is the old one moved by 3 bytes: the XOR of two shifted texts still
        // pays, but the text compressed alone is far smaller.
        let old = text(LEN * CHUNKS + 3, 7);
        let new = old[3..].to_vec();
        let base = base_of(&old, LEN);
        let packed = pack_all(&base, &old, &new, LEN);
        let zstd = Compression::Zstd { level: -2 };
        let alone: usize = new
            .chunks(LEN)
            .map(|c| zstd.compress(c).expect("pays").len())
            .sum();
        let stored: usize = packed.iter().flatten().map(|p| p.bytes.len()).sum();
        assert!(stored * 20 <= alone * 21, "stored {stored}, alone {alone}");
        assert!(packed.iter().flatten().all(|p| p.base.is_none()));
    }

    #[test]
    fn deltas_are_probed_again_after_they_stopped_paying() {
        // The first half of the file was rewritten with noise (no delta pays), the second
        // half nudged (every delta pays): the probes find the second half.
        let old = floats(LEN / 4 * CHUNKS, 0.0);
        let mut new = random(LEN * CHUNKS / 2, 9);
        new.extend_from_slice(&floats(LEN / 4 * CHUNKS, 1e-6)[LEN * CHUNKS / 2..]);
        let base = base_of(&old, LEN);
        let packed = pack_all(&base, &old, &new, LEN);
        assert!(
            packed[..CHUNKS / 2].iter().all(Option::is_none),
            "noise stays raw"
        );
        let late = packed[CHUNKS / 2..]
            .iter()
            .flatten()
            .filter(|p| p.base.is_some())
            .count();
        assert!(late >= 1, "{late} deltas in the nudged half");
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
