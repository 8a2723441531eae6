//! The data pattern: every byte a writer ever puts at offset `o` of a file with seed `s` is
//! `pattern_byte(s, o)`, and that byte is never zero. So, whenever it is looked at, every byte
//! in `[0, size)` of a file is either exactly its pattern byte (written) or zero (a hole, a
//! range truncated away and extended again, or a write that a crash cut short); any other
//! value means corruption. The pattern differs from file to file (seed) and from offset to
//! offset, so data landing in the wrong file, at the wrong offset, or stale data from a
//! reused chunk is caught (a wrong byte matches by chance with probability 1/255).

/// splitmix64's finaliser: a bijective 64-bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The pattern's 8 bytes for the 8-byte-aligned word `word_index` of file `seed`.
fn word(seed: u64, word_index: u64) -> u64 {
    mix(seed ^ mix(word_index.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Maps a raw byte to a non-zero one, so zero always means "never written".
fn nonzero(b: u8) -> u8 {
    if b == 0 {
        0xa5
    } else {
        b
    }
}

/// The pattern byte at `offset` of the file with `seed` (never zero).
pub fn pattern_byte(seed: u64, offset: u64) -> u8 {
    nonzero(word(seed, offset / 8).to_le_bytes()[(offset % 8) as usize])
}

/// Fills `buf` with the pattern of file `seed` from file offset `offset`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut off = offset;
    let mut i = 0;
    while i < buf.len() {
        let w = word(seed, off / 8).to_le_bytes();
        let start = (off % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        for k in 0..n {
            buf[i + k] = nonzero(w[start + k]);
        }
        i += n;
        off += n as u64;
    }
}

/// The pattern of file `seed` for `[offset, offset + len)`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seed, offset, &mut v);
    v
}

/// A byte that is neither the pattern nor zero (or, for exact checks, not what was expected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: u64,
    pub got: u8,
    pub want: u8,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "byte at offset {} is {:#04x}, expected {:#04x}",
            self.offset, self.got, self.want
        )
    }
}

/// Checks that every byte of `buf` (file bytes from `offset`) is its pattern byte or zero.
pub fn check_pattern_or_zero(seed: u64, offset: u64, buf: &[u8]) -> Result<(), Mismatch> {
    let mut want = vec![0u8; buf.len()];
    fill(seed, offset, &mut want);
    match buf
        .iter()
        .zip(&want)
        .position(|(&got, &w)| got != 0 && got != w)
    {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            offset: offset + i as u64,
            got: buf[i],
            want: want[i],
        }),
    }
}

/// Checks that `buf` is exactly `want` (both starting at file offset `offset`).
pub fn check_exact(offset: u64, buf: &[u8], want: &[u8]) -> Result<(), Mismatch> {
    if buf.len() != want.len() {
        let i = buf.len().min(want.len());
        return Err(Mismatch {
            offset: offset + i as u64,
            got: buf.get(i).copied().unwrap_or(0),
            want: want.get(i).copied().unwrap_or(0),
        });
    }
    match buf.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            offset: offset + i as u64,
            got: buf[i],
            want: want[i],
        }),
    }
}

/// The name of a file with pattern seed `seed`: "s" and 16 hex digits.
pub fn file_name(seed: u64) -> String {
    format!("s{seed:016x}")
}

/// The seed encoded in a file name made by [`file_name`].
pub fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix('s')?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_agrees_with_pattern_byte_at_any_alignment() {
        for start in 0..20u64 {
            let v = pattern(42, start, 37);
            for (i, &b) in v.iter().enumerate() {
                assert_eq!(b, pattern_byte(42, start + i as u64));
                assert_ne!(b, 0);
            }
        }
    }

    #[test]
    fn pattern_differs_between_seeds_and_offsets() {
        let a = pattern(1, 0, 4096);
        let b = pattern(2, 0, 4096);
        let c = pattern(1, 4096, 4096);
        let same = |x: &[u8], y: &[u8]| x.iter().zip(y).filter(|(p, q)| p == q).count();
        // Chance agreement is about 1/255 per byte.
        assert!(same(&a, &b) < 64, "{}", same(&a, &b));
        assert!(same(&a, &c) < 64, "{}", same(&a, &c));
    }

    #[test]
    fn pattern_or_zero_accepts_holes_and_rejects_foreign_bytes() {
        let mut buf = pattern(7, 100, 300);
        buf[10..50].fill(0);
        assert!(check_pattern_or_zero(7, 100, &buf).is_ok());
        // The same bytes at a different offset are wrong.
        let err = check_pattern_or_zero(7, 101, &buf).unwrap_err();
        assert_eq!(err.offset, 101);
        // Another file's data is wrong.
        assert!(check_pattern_or_zero(8, 100, &buf).is_err());
        buf[200] = buf[200].wrapping_add(1).max(1);
        let err = check_pattern_or_zero(7, 100, &buf).unwrap_err();
        assert_eq!(err.offset, 300);
    }

    #[test]
    fn names_round_trip() {
        for seed in [0, 1, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(parse_file_name(&file_name(seed)), Some(seed));
        }
        assert_eq!(parse_file_name("s123"), None);
        assert_eq!(parse_file_name("d0000000000000000"), None);
        assert_eq!(parse_file_name("s000000000000000g"), None);
    }
}
