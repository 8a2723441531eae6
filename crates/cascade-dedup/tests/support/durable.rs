//! A directory as the durable store, shared by the repository tests.

use std::path::Path;
use std::sync::Arc;

use cascade_durable::DurableStore;

/// The durable store in directory `root`.
pub fn durable_at(root: &Path) -> Arc<DurableStore> {
    Arc::new(DurableStore::open(root.to_str().expect("utf-8")).expect("open durable store"))
}
