//! Cascade L0: the node store.
//!
//! One POSIX shared-memory block per node holds a small file system (directories, files, chunk
//! maps, free lists) and the file data itself, in fixed-size chunks. Every process on the node
//! attaches the same block; data survives all of them dying and is gone only when the store is
//! destroyed or the node reboots. When memory chunks run out, chunks spill to a file reserved
//! up front on local SSD. The layout, invariants and crash-consistency argument are in
//! `docs/store-layout.md`.

mod alloc;
mod block;
mod descriptions;
mod error;
mod file;
mod fsck;
mod layout;
mod lifecycle;
mod lock;
pub mod memory_owner;
mod namespace;
pub mod ownership;
mod store;
mod types;

pub use descriptions::{Description, OpenDescription};
pub use error::{errno_text, Error, Result};
pub use lifecycle::{AgentRegistration, LifeEntry, PATH_SUFFIX_ROOM};
pub use lock::LockHolder;
pub use store::{File, Store, FETCH_TIMEOUT_ENV};
pub use types::*;

/// Default shared-memory object name for the calling user ("/cascade-UID").
pub fn default_store_name() -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("/cascade-{uid}")
}

/// Options for [`Store::open`], in the spirit of `std::fs::OpenOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub create_new: bool,
    pub truncate: bool,
    pub append: bool,
    /// The path must name a directory (O_DIRECTORY): ENOTDIR otherwise, checked before
    /// anything is created or truncated.
    pub directory: bool,
    /// Permission bits for a newly created file.
    pub mode: u32,
    /// The caller registers a writable open as an open file description
    /// ([`Store::describe_open`]), which then counts it as a writer; otherwise the returned
    /// handle counts itself until it is dropped.
    pub described: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read: true,
            write: false,
            create: false,
            create_new: false,
            truncate: false,
            append: false,
            directory: false,
            mode: 0o644,
            described: false,
        }
    }
}

impl OpenOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn read(mut self, v: bool) -> Self {
        self.read = v;
        self
    }
    pub fn write(mut self, v: bool) -> Self {
        self.write = v;
        self
    }
    pub fn create(mut self, v: bool) -> Self {
        self.create = v;
        self
    }
    pub fn create_new(mut self, v: bool) -> Self {
        self.create_new = v;
        self
    }
    pub fn truncate(mut self, v: bool) -> Self {
        self.truncate = v;
        self
    }
    pub fn append(mut self, v: bool) -> Self {
        self.append = v;
        self
    }
    pub fn directory(mut self, v: bool) -> Self {
        self.directory = v;
        self
    }
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }
    pub fn described(mut self, v: bool) -> Self {
        self.described = v;
        self
    }
}

#[cfg(test)]
mod tests;
