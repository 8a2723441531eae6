//! Per-chunk compression: `none` or zstd at a level, skipped for chunks where it does not pay.
//!
//! **The skip rule.** A chunk is stored compressed only if the compressed frame is at most
//! 7/8 of the chunk's size (it saves at least 12.5 %); otherwise [`Compression::compress`]
//! returns `None` and the chunk is stored as it is. Dense floating-point data (most model
//! weights, most simulation fields) rarely passes, so the reader pays no decompression for
//! it, and a chunk never grows. Each thread keeps one zstd compression context and one
//! decompression context (zstd's bulk API), so compressing many chunks allocates nothing per
//! chunk but the output.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::str::FromStr;

/// Default zstd level when the spec is just `zstd`.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;
/// Levels accepted in specs: zstd's fast levels -7 ..= -1 (its `--fast=N` is level -N:
/// faster, larger) and its regular levels 1 ..= 19.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

/// How chunks are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Stored as they are.
    #[default]
    None,
    /// A zstd frame per chunk, at `level` (-7 fastest ..= 19 smallest; never 0).
    Zstd { level: i32 },
}

/// Why a compression spec was refused: one line, naming the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCompressionError(pub String);

impl fmt::Display for ParseCompressionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseCompressionError {}

/// The largest compressed size that still pays for a chunk of `len` bytes: 7/8 of it.
pub fn max_compressed_len(len: usize) -> usize {
    len - len.div_ceil(8)
}

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Compression {
    /// The chunk compressed, or `None` when it does not pay (the compressed frame would be
    /// more than 7/8 of the chunk, the chunk is empty, or this is [`Compression::None`]).
    pub fn compress(&self, chunk: &[u8]) -> Option<Vec<u8>> {
        self.compress_within(chunk, usize::MAX)
    }

    /// Like [`Compression::compress`], and `None` as well when the frame would be longer than
    /// `limit` bytes (a delta blob competing with the chunk compressed alone).
    pub fn compress_within(&self, chunk: &[u8], limit: usize) -> Option<Vec<u8>> {
        let Compression::Zstd { level } = *self else {
            return None;
        };
        // zstd writes into the spare capacity: no zeroing of a buffer it overwrites.
        let mut out = Vec::with_capacity(limit.min(max_compressed_len(chunk.len())));
        compress_into(level, chunk, &mut out)?;
        Some(out)
    }

    /// The size [`Compression::compress`] would return, without keeping the output (for
    /// estimates such as `cascade analyze`): `None` when it does not pay.
    pub fn compressed_len(&self, chunk: &[u8]) -> Option<usize> {
        let Compression::Zstd { level } = *self else {
            return None;
        };
        SCRATCH.with(|scratch| {
            let mut out = scratch.borrow_mut();
            let limit = max_compressed_len(chunk.len());
            if out.len() < limit {
                out.resize(limit, 0);
            }
            compress_into(level, chunk, &mut out[..limit])
        })
    }

    /// Undoes [`Compression::compress`]: `data` is a zstd frame of a chunk of `original_len`
    /// bytes. Fails with `InvalidData` when the frame is corrupt or its content is not
    /// exactly `original_len` bytes long.
    pub fn decompress(data: &[u8], original_len: usize) -> io::Result<Vec<u8>> {
        DECOMPRESSOR.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(zstd::bulk::Decompressor::new()?);
            }
            let Some(decompressor) = cell.as_mut() else {
                return Err(io::Error::other("no zstd decompression context"));
            };
            let mut out = Vec::with_capacity(original_len);
            decompressor
                .decompress_to_buffer(data, &mut out)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if out.len() != original_len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "decompressed to {} bytes, expected {original_len}",
                        out.len()
                    ),
                ));
            }
            Ok(out)
        })
    }
}

/// Compresses `chunk` into `out` (as long as the paying limit) with this thread's context:
/// the frame's length, or `None` when it does not fit (zstd stops with "destination buffer
/// too small" as soon as it would not pay) or zstd fails.
fn compress_into<C: zstd::zstd_safe::WriteBuf + ?Sized>(
    level: i32,
    chunk: &[u8],
    out: &mut C,
) -> Option<usize> {
    if chunk.is_empty() || out.capacity() == 0 {
        return None;
    }
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        match cell.as_mut() {
            Some((current, compressor)) if *current != level => {
                // A frame that stopped at the paying limit leaves the session mid-frame,
                // where zstd refuses parameter changes: end it first.
                compressor
                    .context_mut()
                    .reset(zstd::zstd_safe::ResetDirective::SessionOnly)
                    .ok()?;
                compressor.set_compression_level(level).ok()?;
                *current = level;
            }
            Some(_) => {}
            None => *cell = Some((level, zstd::bulk::Compressor::new(level).ok()?)),
        }
        let (_, compressor) = cell.as_mut()?;
        compressor.compress_to_buffer(chunk, out).ok()
    })
}

impl fmt::Display for Compression {
    /// The canonical spec: `none` or `zstd:LEVEL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Compression {
    type Err = ParseCompressionError;

    /// `none`, `zstd` (level 3), `zstd:1` ..= `zstd:19` or `zstd:-7` ..= `zstd:-1`.
    fn from_str(spec: &str) -> Result<Compression, ParseCompressionError> {
        let err = |why: &str| ParseCompressionError(format!("invalid compression '{spec}': {why}"));
        let trimmed = spec.trim().to_ascii_lowercase();
        let (kind, level) = match trimmed.split_once(':') {
            Some((kind, level)) => (kind, Some(level.trim())),
            None => (trimmed.as_str(), None),
        };
        match (kind.trim(), level) {
            ("none", None) => Ok(Compression::None),
            ("zstd", None) => Ok(Compression::Zstd {
                level: ZSTD_DEFAULT_LEVEL,
            }),
            ("zstd", Some(level)) => match level.parse::<i32>() {
                Ok(level) if level != 0 && ZSTD_LEVELS.contains(&level) => {
                    Ok(Compression::Zstd { level })
                }
                _ => Err(err(
                    "the zstd level must be a whole number from 1 to 19, or -7 to -1 for the fast levels",
                )),
            },
            _ => Err(err("expected none, zstd or zstd:LEVEL (1..=19, or -7..=-1)")),
        }
    }
}
