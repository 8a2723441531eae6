//! Scores: the BLAKE3 hash of a chunk's bytes, which names the chunk in a dedup index.

use std::fmt;

/// The BLAKE3 hash (32 bytes) of a chunk.
pub type Score = [u8; 32];

/// The score of `data`.
pub fn score(data: &[u8]) -> Score {
    *blake3::hash(data).as_bytes()
}

/// The score as 64 lowercase hex digits.
pub fn to_hex(score: &Score) -> String {
    blake3::Hash::from_bytes(*score).to_hex().to_string()
}

/// Parses 64 hex digits (either case) back into a score.
pub fn from_hex(text: &str) -> Result<Score, ParseScoreError> {
    blake3::Hash::from_hex(text.trim())
        .map(|hash| *hash.as_bytes())
        .map_err(|_| ParseScoreError(text.to_string()))
}

/// A string that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseScoreError(pub String);

impl fmt::Display for ParseScoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}' is not a score (64 hex digits)", self.0)
    }
}

impl std::error::Error for ParseScoreError {}

/// The first 16 bytes of a score as a number: the key the analysis indexes chunks by
/// (a collision among 2^40 chunks has probability about 2^-49).
pub fn short_key(score: &Score) -> u128 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&score[..16]);
    u128::from_le_bytes(bytes)
}
