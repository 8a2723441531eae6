//! What one-shot drains and restores report back.

use cascade_durable::MarkerFile;

/// A progress callback: called with the bytes transferred so far (monotonic), from the
/// calling thread.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// What a drain or restore moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The checkpoint's name in the durable store (a relative path such as "ckpt.0001").
    pub checkpoint: String,
    /// Files moved, with their paths relative to the checkpoint, sizes and BLAKE3.
    pub files: Vec<MarkerFile>,
    /// Total data bytes.
    pub bytes: u64,
    /// Wall time of the whole operation.
    pub seconds: f64,
}

/// A dedup manifest's file entry as a marker entry (path, size, BLAKE3).
pub(crate) fn marker_file(recipe: &cascade_dedup::repo::FileRecipe) -> MarkerFile {
    MarkerFile {
        path: recipe.path.clone(),
        size: recipe.size,
        blake3: recipe.blake3.clone(),
    }
}
