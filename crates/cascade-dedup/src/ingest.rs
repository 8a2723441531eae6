//! The ingest pipeline: a file read in windows, each window cut into chunks, its chunks scored
//! (and the new ones compressed) on every core while the next window is read and cut and the
//! previous one is handed to the caller (docs/dedup.md, "Ingest pipeline").
//!
//! Three window buffers turn in a ring — one being filled, one being scored, one being
//! consumed — and are reused from file to file, so the steady state allocates nothing per
//! window (page faults on fresh memory cost this VM about as much as copying the bytes).
//! The cut points are those of [`Chunking::split`] over the whole file: each window starts at
//! a chunk boundary, and the last chunk of a window that is not the end of the file is not
//! final (it may have been cut short by the window's end), so it moves to the next window.

use std::io::{self, Read};
use std::ops::Range;

use rayon::prelude::*;

use crate::repo::format::DeltaBase;
use crate::{score, Chunking, Score};

/// Bytes per window, at least (and at least twice the largest chunk, so that every window
/// holds one final chunk besides the one carried over).
pub const WINDOW_BYTES: usize = 4 << 20;

/// One chunk of a window: where it is in the window's bytes, its score, and its stored form
/// when the caller's packer gave one.
#[derive(Debug)]
pub struct Chunk {
    pub range: Range<usize>,
    pub score: Score,
    pub packed: Option<Packed>,
}

/// A chunk's stored form other than its raw bytes: a zstd frame of the chunk, or with a
/// `base`, of the chunk XORed with that base (repo::format::Stored::Delta).
#[derive(Debug, PartialEq, Eq)]
pub struct Packed {
    pub bytes: Vec<u8>,
    pub base: Option<DeltaBase>,
}

/// Gives the stored form of a chunk (its score, its offset in the file, its bytes), or `None`
/// to keep it raw or because it is not new. Runs on every core at once.
pub type Packer<'p> = dyn Fn(&Score, u64, &[u8]) -> Option<Packed> + Sync + 'p;

/// Takes each window's bytes and chunks, in order.
pub type Sink<'s, E> = dyn FnMut(&[u8], Vec<Chunk>) -> Result<(), E> + Send + 's;

/// What [`Ingest::run`] learnt about the whole file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    pub blake3: Score,
}

#[derive(Default)]
struct Slot {
    buf: Vec<u8>,
    /// Bytes read into `buf`.
    len: usize,
    /// Chunks cut in `buf[..final_len]`; `buf[final_len..len]` moves to the next window.
    cuts: Vec<Range<usize>>,
    final_len: usize,
    eof: bool,
    chunks: Vec<Chunk>,
}

/// Cuts, scores and compresses files; holds the window buffers between files.
pub struct Ingest {
    chunking: Chunking,
    window: usize,
    slots: [Slot; 3],
}

impl Ingest {
    pub fn new(chunking: Chunking) -> Ingest {
        Ingest::with_window(chunking, WINDOW_BYTES)
    }

    /// A pipeline with windows of `window` bytes (raised to twice the largest chunk): tests
    /// use small windows to put many window ends inside small files.
    pub fn with_window(chunking: Chunking, window: usize) -> Ingest {
        let chunking = chunking.clamped();
        Ingest {
            chunking,
            window: window.max(2 * chunking.max_chunk()),
            slots: Default::default(),
        }
    }

    /// Reads `reader` to its end and hands every chunk, in order, to `sink` a window at a
    /// time (the window's bytes and its chunks). Each chunk's stored form comes from `pack`
    /// (it may be asked twice for one score, and may answer from a state `sink` has since
    /// changed: `sink` decides what is stored). `sink` for one window runs while the next is
    /// scored. The first error, from reading or from `sink`, ends it.
    pub fn run<E>(
        &mut self,
        mut reader: impl Read + Send,
        pack: &Packer<'_>,
        sink: &mut Sink<'_, E>,
    ) -> Result<FileDigest, E>
    where
        E: From<io::Error> + Send,
    {
        let chunking = self.chunking;
        let window = self.window;
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        fill(&mut self.slots[0], &[], &mut reader, chunking, window)?;
        let mut turn = 0usize;
        loop {
            let (prev, cur, next) = ring(&mut self.slots, turn);
            let window_offset = size;
            size += cur.final_len as u64;
            let cur_data = &cur.buf[..cur.final_len];
            let carry = &cur.buf[cur.final_len..cur.len];
            let cur_eof = cur.eof;
            let (cuts, chunks) = (&cur.cuts, &mut cur.chunks);
            let ((), handed) = rayon::join(
                || {
                    rayon::join(
                        || {
                            hasher.update(cur_data);
                        },
                        || {
                            cuts.par_iter()
                                .map(|r| {
                                    let data = &cur_data[r.clone()];
                                    let s = score(data);
                                    let packed = pack(&s, window_offset + r.start as u64, data);
                                    Chunk {
                                        range: r.clone(),
                                        score: s,
                                        packed,
                                    }
                                })
                                .collect_into_vec(chunks);
                        },
                    );
                },
                || {
                    rayon::join(
                        || match turn {
                            0 => Ok(()),
                            _ => sink(
                                &prev.buf[..prev.final_len],
                                std::mem::take(&mut prev.chunks),
                            ),
                        },
                        || match cur_eof {
                            true => Ok(()),
                            false => fill(next, carry, &mut reader, chunking, window),
                        },
                    )
                },
            );
            let (sunk, filled) = handed;
            sunk?;
            filled?;
            if cur_eof {
                sink(cur_data, std::mem::take(&mut cur.chunks))?;
                return Ok(FileDigest {
                    size,
                    blake3: *hasher.finalize().as_bytes(),
                });
            }
            turn += 1;
        }
    }
}

/// The slots consumed, scored and filled at `turn`.
fn ring(slots: &mut [Slot; 3], turn: usize) -> (&mut Slot, &mut Slot, &mut Slot) {
    let [a, b, c] = slots;
    match turn % 3 {
        0 => (c, a, b),
        1 => (a, b, c),
        _ => (b, c, a),
    }
}

/// Starts `slot` with `carry`, reads until it holds `window` bytes or the reader ends, and
/// cuts it; the last chunk is kept for the next window unless the reader ended.
fn fill(
    slot: &mut Slot,
    carry: &[u8],
    reader: &mut impl Read,
    chunking: Chunking,
    window: usize,
) -> io::Result<()> {
    if slot.buf.len() < window {
        slot.buf.resize(window, 0);
    }
    slot.buf[..carry.len()].copy_from_slice(carry);
    let mut len = carry.len();
    slot.eof = false;
    while len < window {
        match reader.read(&mut slot.buf[len..window]) {
            Ok(0) => {
                slot.eof = true;
                break;
            }
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    slot.len = len;
    slot.cuts.clear();
    slot.cuts.extend(chunking.split(&slot.buf[..len]));
    if !slot.eof {
        slot.cuts.pop();
    }
    slot.final_len = slot.cuts.last().map_or(0, |r| r.end);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Compression;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Runs of repeated bytes so that zstd has something to do.
                if (i / 3000) % 3 == 0 {
                    0
                } else {
                    x as u8
                }
            })
            .collect()
    }

    /// Reads at most `step` bytes per call, to put read boundaries everywhere.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(self.1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn windows_cut_where_the_whole_file_is_cut_and_hash_it_whole() {
        let data = bytes(700_000, 3);
        let data_ref = &data;
        for chunking in [
            "cdc:min=2KiB,avg=8KiB,max=32KiB",
            "cdc:avg=16KiB",
            "fixed:4KiB",
            "fixed:3000",
        ] {
            let chunking: Chunking = chunking.parse().unwrap();
            let expected: Vec<Range<usize>> = chunking.split(&data).collect();
            for (window, step) in [(1, 1 << 20), (100_000, 7_777), (1 << 20, 65_536)] {
                let mut ingest = Ingest::with_window(chunking, window);
                let zstd = Compression::Zstd { level: 1 };
                for _file in 0..2 {
                    let mut got: Vec<Range<usize>> = Vec::new();
                    let mut offset = 0usize;
                    let digest = ingest
                        .run::<io::Error>(
                            Trickle(&data, step),
                            &|s, offset, data| {
                                let at = offset as usize;
                                assert_eq!(data, &data_ref[at..at + data.len()], "offset");
                                let bytes = zstd.compress(data).filter(|_| s[0] % 2 == 0)?;
                                Some(Packed { bytes, base: None })
                            },
                            &mut |w, chunks| {
                                for c in chunks {
                                    let part = &w[c.range.clone()];
                                    assert_eq!(c.score, score(part));
                                    if let Some(z) = &c.packed {
                                        assert_eq!(c.score[0] % 2, 0, "compressed a chunk not new");
                                        let raw =
                                            Compression::decompress(&z.bytes, part.len()).unwrap();
                                        assert_eq!(raw, part);
                                    }
                                    got.push(offset + c.range.start..offset + c.range.end);
                                }
                                offset += w.len();
                                Ok(())
                            },
                        )
                        .unwrap();
                    assert_eq!(got, expected, "{chunking} window {window} step {step}");
                    assert_eq!(digest.size, data.len() as u64);
                    assert_eq!(digest.blake3, score(&data));
                }
            }
        }
    }

    #[test]
    fn empty_input_has_no_chunks_and_errors_stop_it() {
        let mut ingest = Ingest::new(Chunking::DEFAULT_CDC);
        let mut windows = 0;
        let digest = ingest
            .run::<io::Error>(&[][..], &|_, _, _| None, &mut |_, chunks| {
                assert!(chunks.is_empty());
                windows += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!((digest.size, digest.blake3), (0, score(b"")));
        assert_eq!(windows, 1);

        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let err = ingest
            .run::<io::Error>(Failing, &|_, _, _| None, &mut |_, _| Ok(()))
            .unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");

        let data = bytes(3 * WINDOW_BYTES, 5);
        let mut calls = 0;
        let err = ingest
            .run::<io::Error>(&data[..], &|_, _, _| None, &mut |_, _| {
                calls += 1;
                Err(io::Error::other("store is full"))
            })
            .unwrap_err();
        assert_eq!((err.to_string(), calls), ("store is full".to_string(), 1));
    }
}
