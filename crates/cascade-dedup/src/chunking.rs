//! How data is cut into chunks: fixed-size blocks or content-defined chunks (FastCDC v2020).
//!
//! Specs (as in `dedup = "cdc:avg=64KiB"`):
//!
//! | spec | meaning |
//! |---|---|
//! | `fixed:4KiB`, `fixed:512` | fixed-size chunks of 512 B ..= 1 MiB; the last chunk of a file may be shorter |
//! | `cdc:avg=64KiB` | FastCDC with that average; min = avg/4, max = avg*4 |
//! | `cdc:min=16KiB,avg=64KiB,max=256KiB` | FastCDC with all three sizes (any order; omitted ones default as above) |
//!
//! Sizes are a whole number of bytes with an optional binary unit: `B`, `K`/`KiB`,
//! `M`/`MiB` (case-insensitive). FastCDC's limits apply: min 64 B ..= 1 MiB, avg 256 B ..=
//! 4 MiB, max 1 KiB ..= 16 MiB, and min <= avg <= max.

use std::fmt;
use std::io::{self, Read};
use std::ops::Range;
use std::str::FromStr;

use fastcdc::v2020::{FastCDC, StreamCDC};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// Smallest fixed chunk size.
pub const FIXED_MIN: u32 = 512;
/// Largest fixed chunk size.
pub const FIXED_MAX: u32 = 1 << 20;
/// FastCDC v2020's limits on the minimum chunk size.
pub const CDC_MIN_RANGE: (u32, u32) = (fastcdc::v2020::MINIMUM_MIN, fastcdc::v2020::MINIMUM_MAX);
/// FastCDC v2020's limits on the average chunk size.
pub const CDC_AVG_RANGE: (u32, u32) = (fastcdc::v2020::AVERAGE_MIN, fastcdc::v2020::AVERAGE_MAX);
/// FastCDC v2020's limits on the maximum chunk size.
pub const CDC_MAX_RANGE: (u32, u32) = (fastcdc::v2020::MAXIMUM_MIN, fastcdc::v2020::MAXIMUM_MAX);

/// How to cut data into chunks.
///
/// The fields are public for matching; build values with [`FromStr`] (or check them with
/// [`Chunking::validate`]). [`Chunking::split`] and [`Chunking::stream`] clamp values outside
/// the limits into them rather than panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Chunking {
    /// Blocks of `size` bytes at offsets 0, size, 2*size, ...; the last may be shorter.
    Fixed { size: u32 },
    /// FastCDC v2020 (normalization level 1): cut points depend on the content, so an
    /// insertion moves only the chunks around it.
    Cdc { min: u32, avg: u32, max: u32 },
}

/// Why a chunking spec was refused: one line, naming the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseChunkingError(pub String);

impl fmt::Display for ParseChunkingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseChunkingError {}

impl Chunking {
    /// What `--dedup on` means: `fixed:64KiB`, the chunking of the agent's default
    /// configuration (with `zstd:-2` and deltas: the fastest measured that keeps 3x on the
    /// torch series and 1.7x on LAMMPS, docs/dedup.md "Choosing the default"). Fixed chunks
    /// cost no rolling hash, and checkpoints that rewrite their arrays in place keep them at
    /// the same offsets, where deltas find their base.
    pub const DEFAULT: Chunking = Chunking::Fixed { size: 64 << 10 };

    /// The default content-defined chunking: `cdc:avg=64KiB` (16 KiB / 64 KiB / 256 KiB).
    pub const DEFAULT_CDC: Chunking = Chunking::Cdc {
        min: 16 << 10,
        avg: 64 << 10,
        max: 256 << 10,
    };

    /// FastCDC with min = avg/4 and max = avg*4 (the ratios of the FastCDC paper and restic).
    pub fn cdc_with_avg(avg: u32) -> Chunking {
        Chunking::Cdc {
            min: avg / 4,
            avg,
            max: avg.saturating_mul(4),
        }
    }

    /// Whether the values are within the limits; the error is the same one parsing gives.
    pub fn validate(&self) -> Result<(), ParseChunkingError> {
        let err = |msg: String| Err(ParseChunkingError(msg));
        match *self {
            Chunking::Fixed { size } => {
                if !(FIXED_MIN..=FIXED_MAX).contains(&size) {
                    return err(format!(
                        "fixed chunk size {} is out of range ({}..={})",
                        format_size(size.into()),
                        format_size(FIXED_MIN.into()),
                        format_size(FIXED_MAX.into())
                    ));
                }
            }
            Chunking::Cdc { min, avg, max } => {
                // avg first: min and max default from it.
                for (name, value, (lo, hi)) in [
                    ("avg", avg, CDC_AVG_RANGE),
                    ("min", min, CDC_MIN_RANGE),
                    ("max", max, CDC_MAX_RANGE),
                ] {
                    if !(lo..=hi).contains(&value) {
                        return err(format!(
                            "cdc {name}={} is out of range ({}..={})",
                            format_size(value.into()),
                            format_size(lo.into()),
                            format_size(hi.into())
                        ));
                    }
                }
                if !(min <= avg && avg <= max) {
                    return err(format!(
                        "cdc sizes must satisfy min <= avg <= max (min={}, avg={}, max={})",
                        format_size(min.into()),
                        format_size(avg.into()),
                        format_size(max.into())
                    ));
                }
            }
        }
        Ok(())
    }

    /// The same chunking with every value moved into its limits (what split and stream use).
    pub fn clamped(&self) -> Chunking {
        match *self {
            Chunking::Fixed { size } => Chunking::Fixed {
                size: size.clamp(FIXED_MIN, FIXED_MAX),
            },
            Chunking::Cdc { min, avg, max } => {
                let avg = avg.clamp(CDC_AVG_RANGE.0, CDC_AVG_RANGE.1);
                let min = min.clamp(CDC_MIN_RANGE.0, CDC_MIN_RANGE.1).min(avg);
                let max = max.clamp(CDC_MAX_RANGE.0, CDC_MAX_RANGE.1).max(avg);
                Chunking::Cdc { min, avg, max }
            }
        }
    }

    /// Whether this is content-defined chunking.
    pub fn is_cdc(&self) -> bool {
        matches!(self, Chunking::Cdc { .. })
    }

    /// The largest chunk this chunking produces.
    pub fn max_chunk(&self) -> usize {
        match self.clamped() {
            Chunking::Fixed { size } => size as usize,
            Chunking::Cdc { max, .. } => max as usize,
        }
    }

    /// Cuts `data` into chunks: byte ranges that cover it exactly, in order, none empty
    /// (no chunk at all for empty data).
    pub fn split<'a>(&self, data: &'a [u8]) -> Chunks<'a> {
        Chunks(match self.clamped() {
            Chunking::Fixed { size } => ChunksInner::Fixed {
                len: data.len(),
                size: size as usize,
                pos: 0,
            },
            Chunking::Cdc { min, avg, max } => ChunksInner::Cdc(FastCDC::new(data, min, avg, max)),
        })
    }

    /// Cuts what `reader` yields into chunks without holding more than one maximum chunk
    /// in memory (plus FastCDC's buffer): `(offset, bytes)` in order. The cut points are the
    /// same as [`Chunking::split`] gives for the whole data. Interrupted reads are retried;
    /// any other read error ends the iteration after it is returned.
    pub fn stream<R: Read>(&self, reader: R) -> StreamChunks<R> {
        StreamChunks(match self.clamped() {
            Chunking::Fixed { size } => StreamInner::Fixed {
                reader,
                size: size as usize,
                offset: 0,
                done: false,
            },
            Chunking::Cdc { min, avg, max } => StreamInner::Cdc {
                inner: Box::new(StreamCDC::new(RetryInterrupted(reader), min, avg, max)),
                done: false,
            },
        })
    }
}

/// Iterator over the chunks of a slice: see [`Chunking::split`].
pub struct Chunks<'a>(ChunksInner<'a>);

enum ChunksInner<'a> {
    Fixed { len: usize, size: usize, pos: usize },
    Cdc(FastCDC<'a>),
}

impl Iterator for Chunks<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        match &mut self.0 {
            ChunksInner::Fixed { len, size, pos } => {
                if *pos >= *len {
                    return None;
                }
                let start = *pos;
                let end = start.saturating_add(*size).min(*len);
                *pos = end;
                Some(start..end)
            }
            ChunksInner::Cdc(cdc) => cdc.next().map(|c| c.offset..c.offset + c.length),
        }
    }
}

/// Iterator over the chunks of a reader: see [`Chunking::stream`].
pub struct StreamChunks<R: Read>(StreamInner<R>);

enum StreamInner<R: Read> {
    Fixed {
        reader: R,
        size: usize,
        offset: u64,
        done: bool,
    },
    Cdc {
        inner: Box<StreamCDC<RetryInterrupted<R>>>,
        done: bool,
    },
}

/// A reader that retries reads interrupted by a signal (FastCDC's stream would return them
/// as errors).
struct RetryInterrupted<R>(R);

impl<R: Read> Read for RetryInterrupted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

impl<R: Read> Iterator for StreamChunks<R> {
    type Item = io::Result<(u64, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            StreamInner::Fixed {
                reader,
                size,
                offset,
                done,
            } => {
                if *done {
                    return None;
                }
                let mut buf = vec![0u8; *size];
                let mut filled = 0;
                while filled < buf.len() {
                    match reader.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            *done = true;
                            return Some(Err(e));
                        }
                    }
                }
                if filled < buf.len() {
                    *done = true;
                }
                if filled == 0 {
                    return None;
                }
                buf.truncate(filled);
                let at = *offset;
                *offset += filled as u64;
                Some(Ok((at, buf)))
            }
            StreamInner::Cdc { inner, done } => {
                if *done {
                    return None;
                }
                match inner.next()? {
                    Ok(chunk) => Some(Ok((chunk.offset, chunk.data))),
                    Err(err) => {
                        *done = true;
                        match err {
                            fastcdc::v2020::Error::Empty => None,
                            fastcdc::v2020::Error::IoError(e) => Some(Err(e)),
                            fastcdc::v2020::Error::Other(text) => Some(Err(io::Error::other(text))),
                        }
                    }
                }
            }
        }
    }
}

impl fmt::Display for Chunking {
    /// The canonical spec: `fixed:4KiB`, `fixed:512B`, `cdc:avg=64KiB` when min and max are
    /// the defaults for that average, else `cdc:min=..,avg=..,max=..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Chunking::Fixed { size } => write!(f, "fixed:{}", format_size(size.into())),
            Chunking::Cdc { min, avg, max } => {
                if Chunking::cdc_with_avg(avg) == *self {
                    write!(f, "cdc:avg={}", format_size(avg.into()))
                } else {
                    write!(
                        f,
                        "cdc:min={},avg={},max={}",
                        format_size(min.into()),
                        format_size(avg.into()),
                        format_size(max.into())
                    )
                }
            }
        }
    }
}

impl FromStr for Chunking {
    type Err = ParseChunkingError;

    fn from_str(spec: &str) -> Result<Chunking, ParseChunkingError> {
        let err = |why: String| ParseChunkingError(format!("invalid chunking '{spec}': {why}"));
        let (kind, args) = spec.trim().split_once(':').unwrap_or((spec.trim(), ""));
        let chunking = match kind.to_ascii_lowercase().as_str() {
            "fixed" => {
                if args.is_empty() {
                    return Err(err("expected fixed:SIZE, e.g. fixed:4KiB".into()));
                }
                let size = parse_size(args).map_err(err)?;
                let size = u32::try_from(size)
                    .map_err(|_| err(format!("size {args} is larger than 1MiB")))?;
                Chunking::Fixed { size }
            }
            "cdc" => {
                let (mut min, mut avg, mut max) = (None, None, None);
                for part in args.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let (name, value) = part
                        .split_once('=')
                        .ok_or_else(|| err(format!("expected NAME=SIZE, got '{part}'")))?;
                    let value = parse_size(value).map_err(err)?;
                    let value = u32::try_from(value)
                        .map_err(|_| err(format!("{name}={value} is larger than 16MiB")))?;
                    let slot = match name.trim().to_ascii_lowercase().as_str() {
                        "min" => &mut min,
                        "avg" => &mut avg,
                        "max" => &mut max,
                        other => {
                            return Err(err(format!(
                                "unknown parameter '{other}' (expected min, avg, max)"
                            )))
                        }
                    };
                    if slot.replace(value).is_some() {
                        return Err(err(format!("{} given twice", name.trim())));
                    }
                }
                let avg = avg.ok_or_else(|| {
                    err("expected cdc:avg=SIZE[,min=SIZE,max=SIZE], e.g. cdc:avg=64KiB".into())
                })?;
                Chunking::Cdc {
                    min: min.unwrap_or(avg / 4),
                    avg,
                    max: max.unwrap_or(avg.saturating_mul(4)),
                }
            }
            _ => {
                return Err(err(
                    "expected fixed:SIZE or cdc:avg=SIZE[,min=SIZE,max=SIZE]".into(),
                ))
            }
        };
        chunking
            .validate()
            .map_err(|e| ParseChunkingError(format!("invalid chunking '{spec}': {}", e.0)))?;
        Ok(chunking)
    }
}

/// Parses `512`, `512B`, `4K`, `4KiB`, `1M`, `1MiB` (units binary, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!("'{text}' is not a size (e.g. 512, 4KiB, 1MiB)"));
    }
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "kb" | "mb" => {
            return Err(format!(
                "'{text}': use binary units (KiB, MiB) for chunk sizes"
            ))
        }
        _ => return Err(format!("'{text}' has an unknown unit (use B, KiB or MiB)")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// `512B`, `4KiB`, `1MiB`, `1536B`: the largest binary unit that divides the size exactly.
pub fn format_size(bytes: u64) -> String {
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{}MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{}KiB", bytes / KIB)
    } else {
        format!("{bytes}B")
    }
}
