//! Reading a store file straight out of the shared-memory block.

use std::io::{self, Read};

use cascade_dedup::repo::BaseBytes;
use cascade_store::{ChunkInfo, ChunkLocation, File, Store};

use crate::report::Progress;

/// A [`Read`] over a store file that copies memory chunks directly from the store's data
/// region (located with `File::chunk_list`), and reads spilled chunks and holes through
/// `File::read_at`. There is no intermediate copy of the file.
///
/// The chunk list and length are taken when the reader is made: the file must not be
/// written while it is read (the agent reads only closed files). If the file shrinks or is
/// unlinked meanwhile, reads fail instead of returning stale bytes past the new end.
pub struct StoreFileReader<'a> {
    file: &'a File,
    /// Address and length of the data region, as mapped in this process. Kept as an integer
    /// so the reader is `Send`; the mapping lives as long as the `Store` borrowed by `'a`.
    region_addr: usize,
    region_len: usize,
    /// Chunks sorted by logical index.
    chunks: Vec<ChunkInfo>,
    chunk_size: u64,
    len: u64,
    pos: u64,
    progress: Option<(u64, Progress<'a>)>,
}

impl<'a> StoreFileReader<'a> {
    /// A reader from the start of `file`, which must belong to `store`.
    pub fn new(store: &'a Store, file: &'a File) -> cascade_store::Result<StoreFileReader<'a>> {
        let len = file.len()?;
        let mut chunks = file.chunk_list()?;
        chunks.sort_by_key(|c| c.index);
        let region = store.data_region();
        Ok(StoreFileReader {
            file,
            region_addr: region.addr as usize,
            region_len: region.len,
            chunks,
            chunk_size: store.chunk_size(),
            len,
            pos: 0,
            progress: None,
        })
    }

    /// Calls `progress(base + bytes read so far)` after every read.
    pub fn with_progress(mut self, base: u64, progress: Progress<'a>) -> StoreFileReader<'a> {
        self.progress = Some((base, progress));
        self
    }

    /// The file's length when the reader was made.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many of the file's chunks are read straight from memory (the rest are spilled).
    pub fn memory_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| matches!(c.location, ChunkLocation::Memory { .. }))
            .count()
    }

    /// The whole file as `(offset in the data region, length)` pieces in order, if every
    /// byte of it is in memory chunks (no hole, nothing spilled); None otherwise.
    pub fn memory_pieces(&self) -> Option<Vec<(usize, usize)>> {
        let mut pieces = Vec::with_capacity(self.chunks.len());
        let mut pos = 0u64;
        for c in &self.chunks {
            if pos >= self.len {
                break;
            }
            let ChunkLocation::Memory { offset } = c.location else {
                return None;
            };
            if c.index * self.chunk_size != pos {
                return None;
            }
            let n = c.length.min(self.len - pos);
            if n == 0 || offset.checked_add(n)? > self.region_len as u64 {
                return None;
            }
            pieces.push((offset as usize, n as usize));
            pos += n;
        }
        (pos == self.len).then_some(pieces)
    }

    /// Reads at `pos`, at most up to the end of the store chunk holding it.
    fn read_some_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        if pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let index = pos / self.chunk_size;
        let within = pos % self.chunk_size;
        // Never cross a chunk boundary or the end of file in one step.
        let to_boundary = self.chunk_size - within;
        let want = (buf.len() as u64).min(to_boundary).min(self.len - pos) as usize;
        let chunk = self
            .chunks
            .get(self.chunks.partition_point(|c| c.index < index))
            .filter(|c| c.index == index)
            .copied();
        let n = match chunk {
            Some(ChunkInfo {
                location: ChunkLocation::Memory { offset },
                length,
                ..
            }) if within < length => {
                let n = want.min((length - within) as usize);
                let start = offset
                    .checked_add(within)
                    .filter(|s| s.saturating_add(n as u64) <= self.region_len as u64)
                    .ok_or_else(|| {
                        io::Error::other(format!(
                            "chunk at region offset {offset} (+{within}, {n} bytes) lies outside \
                             the {}-byte data region",
                            self.region_len
                        ))
                    })? as usize;
                // SAFETY: the data region is mapped for at least `region_len` bytes at
                // `region_addr` for as long as the `Store` this reader borrows is alive, and
                // `start + n <= region_len` was checked above. The bytes belong to a chunk of
                // this file (from its chunk list); the agent reads only files that are no
                // longer being written, so no one writes them while we copy (a delta base,
                // which its owner may remove meanwhile, is checked against its scores).
                let src = unsafe {
                    std::slice::from_raw_parts((self.region_addr as *const u8).add(start), n)
                };
                buf[..n].copy_from_slice(src);
                n
            }
            // Spilled chunks, holes, and anything the list does not cover: the store's own
            // read path (holes read as zeros).
            _ => {
                let n = self
                    .file
                    .read_at(&mut buf[..want], pos)
                    .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "file shrank while being read (at {pos} of {} bytes)",
                            self.len
                        ),
                    ));
                }
                n
            }
        };
        Ok(n)
    }

    /// Reads at `pos` as much of `buf` as the file has (a read may span several chunks).
    pub fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let n = self.read_some_at(pos + filled as u64, &mut buf[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        Ok(filled)
    }
}

impl Read for StoreFileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_at(self.pos, buf)?;
        self.pos += n as u64;
        if let Some((base, progress)) = self.progress {
            progress(base + self.pos);
        }
        Ok(n)
    }
}

/// A stored checkpoint file as the base of its next version's deltas (docs/dedup.md,
/// "Delta blobs"): read by offset straight out of the store.
impl BaseBytes for StoreFileReader<'_> {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> bool {
        matches!(self.read_at(offset, buf), Ok(n) if n == buf.len())
    }
}
