//! Bases for deltas: the previous checkpoint of a series, whose files the next one is stored
//! against (docs/dedup.md, "Delta blobs"), read by offset straight from the node store.

use cascade_dedup::repo::{FileBase, FileRecipe, Manifest};
use cascade_store::{LifeEntry, Store};

use crate::node::path_in_checkpoint;
use crate::reader::StoreFileReader;

/// The checkpoint before the one being stored, in its series: the base of its deltas.
pub(crate) struct PreviousVersion<'a> {
    /// Its store path.
    pub(crate) checkpoint: String,
    pub(crate) root: &'a LifeEntry,
    pub(crate) files: Vec<&'a LifeEntry>,
    /// Its files as its manifest records them.
    pub(crate) recipes: Vec<FileRecipe>,
}

impl PreviousVersion<'_> {
    /// The previous version of the file at `path` (in a checkpoint of `files` files): the
    /// file at the same path, or the one file of a checkpoint that is one file; its recipe
    /// and its store entry, if the store still holds the version the recipe describes.
    pub(crate) fn base_of(&self, path: &str, files: usize) -> Option<(&FileRecipe, &LifeEntry)> {
        let recipe = matching_recipe(&self.recipes, path, files)?;
        let entry = self
            .files
            .iter()
            .find(|f| path_in_checkpoint(self.root, f) == recipe.path)
            .filter(|f| f.durable() && f.size == recipe.size)?;
        Some((recipe, entry))
    }
}

/// Of the previous checkpoint's `recipes`, the previous version of the file at `path` (in a
/// checkpoint of `files` files): the file at the same path, or the one file when both
/// checkpoints are one file each (single files named per epoch, say).
pub(crate) fn matching_recipe<'r>(
    recipes: &'r [FileRecipe],
    path: &str,
    files: usize,
) -> Option<&'r FileRecipe> {
    match recipes.iter().find(|r| r.path == path) {
        Some(r) => Some(r),
        None if files == 1 && recipes.len() == 1 => recipes.first(),
        None => None,
    }
}

/// Runs `f` with the delta base made of a recipe and the open store file it describes (read
/// by offset straight from the store), if there is one.
pub(crate) fn with_base<T>(
    store: &Store,
    base: Option<&(&FileRecipe, cascade_store::File)>,
    f: impl FnOnce(Option<FileBase<'_>>) -> T,
) -> T {
    let reader = base.and_then(|(_, file)| StoreFileReader::new(store, file).ok());
    f(base
        .zip(reader.as_ref())
        .map(|((recipe, _), bytes)| FileBase { recipe, bytes }))
}

/// The recipe of file `key` in manifest `m` of checkpoint `ckpt` (`key` itself, or a
/// directory above it), if it names the file.
pub(crate) fn recipe_in(ckpt: &str, m: Manifest, key: &str) -> Option<FileRecipe> {
    let rel = if m.single_file {
        (ckpt == key).then(|| ckpt.rsplit('/').next().unwrap_or(ckpt).to_string())
    } else {
        key.strip_prefix(ckpt)
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_string)
    }?;
    m.files.into_iter().find(|f| f.path == rel)
}

/// ", N as deltas against CKPT" for a log line, or "" without a base.
pub(crate) fn deltas_note(deltas: u64, previous: Option<&PreviousVersion>) -> String {
    previous.map_or(String::new(), |p| {
        format!(", {deltas} as deltas against {}", p.checkpoint)
    })
}
