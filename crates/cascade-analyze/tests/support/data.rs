//! Test data shared by the cascade-analyze tests.

/// Pseudo-random bytes from a seed (BLAKE3's extendable output): incompressible, and with
/// no repeats inside, so only what a test repeats dedups.
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.finalize_xof().fill(&mut out);
    out
}
