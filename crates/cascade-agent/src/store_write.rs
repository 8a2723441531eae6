//! Writing files into the node store: files fetched by read-through and checkpoints restored
//! into the store. A fetched file is written under a temporary name that no pass ever sends
//! down, verified, then renamed into place.

use std::io::{self, Write};

use cascade_store::{File, OpenOptions, Store};

use crate::{Error, Result};

/// Infix of the temporary name a file is fetched under (`.NAME.cascade-fetch-PID`) before it
/// is renamed into place: the agent's passes must never send such a file down.
const FETCH_TEMP: &str = ".cascade-fetch-";

/// True for the base name of a file being fetched.
pub(crate) fn is_fetch_temp(base: &str) -> bool {
    base.starts_with('.') && base.contains(FETCH_TEMP)
}

/// The temporary name store path `path` is fetched under.
pub(crate) fn fetch_temp_name(path: &str) -> String {
    let cut = path.rfind('/').unwrap_or(0);
    let (parent, name) = (&path[..cut], &path[cut + 1..]);
    format!("{parent}/.{name}{FETCH_TEMP}{}", std::process::id())
}

/// Creates (or empties) `path` in the store, after its parent directories, for a file
/// being fetched or restored into it.
pub(crate) fn create_for_writing(store: &Store, path: &str) -> Result<File> {
    if let Some(cut) = path.rfind('/').filter(|&c| c > 0) {
        let parent = &path[..cut];
        store
            .create_dir_all(parent, 0o755)
            .map_err(|e| Error::store(parent, e))?;
    }
    let options = OpenOptions::new()
        .read(false)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644);
    store
        .open(path, &options)
        .map_err(|e| Error::store(path, e))
}

/// Writes a file being fetched into the store file `tmp` (created or emptied first) with
/// `write`; on an error removes `tmp`, so that a failed fetch leaves nothing behind.
pub(crate) fn write_fetched<T>(
    store: &Store,
    tmp: &str,
    write: impl FnOnce(&mut StoreWriter<'_>) -> Result<T>,
) -> Result<T> {
    let written =
        create_for_writing(store, tmp).and_then(|file| write(&mut StoreWriter::new(&file, tmp)));
    if written.is_err() {
        let _ = store.unlink(tmp);
    }
    written
}

/// Sequential writes into a store file.
pub(crate) struct StoreWriter<'a> {
    file: &'a File,
    offset: u64,
    path: &'a str,
}

impl<'a> StoreWriter<'a> {
    pub(crate) fn new(file: &'a File, path: &'a str) -> StoreWriter<'a> {
        StoreWriter {
            file,
            offset: 0,
            path,
        }
    }
}

impl Write for StoreWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.offset).map_err(|e| {
            io::Error::new(
                io::Error::from_raw_os_error(e.errno()).kind(),
                format!("{}: {}", self.path, cascade_store::errno_text(e.errno())),
            )
        })?;
        self.offset += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
