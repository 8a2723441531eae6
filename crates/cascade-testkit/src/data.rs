//! Deterministic test data: the same seed gives the same bytes in every test and every run.

/// One mebibyte, the unit most test sizes are written in.
pub const MIB: usize = 1 << 20;

/// Pseudo-random bytes from xorshift64 (eight bytes a step): cheap, incompressible, different
/// at every offset (a misplaced chunk shows) and without repeats inside, so only what a test
/// repeats dedups.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

/// Pseudo-random bytes from BLAKE3's extendable output of `seed`: like [`pattern`], from a
/// cryptographic source (for the dedup tests, whose chunk boundaries it decides).
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.finalize_xof().fill(&mut out);
    out
}

/// Little-endian doubles holding small integers (below 1000) in a seeded pseudo-random order:
/// compresses well, as molecular-dynamics restart files do, and differs between seeds.
pub fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i = seed;
    while out.len() < len {
        out.extend_from_slice(&((i % 1000) as f64).to_le_bytes());
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 7;
    }
    out.truncate(len);
    out
}

/// Little-endian doubles `(i * step) % modulus` for i = 0, 1, 2...: a regular sequence that
/// compresses very well and repeats with period `modulus` (when `step` and `modulus` are
/// coprime).
pub fn counting_doubles(len: usize, step: u64, modulus: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(&((i * step % modulus) as f64).to_le_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// The BLAKE3 of `data` as lowercase hex, as markers and `.blake3` objects record it.
pub fn b3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_lengths_are_exact() {
        for len in [0, 1, 7, 8, 9, 4097] {
            assert_eq!(pattern(len, 3).len(), len);
            assert_eq!(random(len, 3).len(), len);
            assert_eq!(compressible(len, 3).len(), len);
            assert_eq!(counting_doubles(len, 7, 1000).len(), len);
        }
        assert_eq!(pattern(100, 1), pattern(100, 1));
        assert_ne!(pattern(100, 1), pattern(100, 2));
        // A prefix of a longer pattern is the shorter pattern.
        assert_eq!(pattern(1000, 5)[..13], pattern(13, 5)[..]);
        assert_eq!(counting_doubles(16, 7, 1000)[8..], 7f64.to_le_bytes());
    }
}
