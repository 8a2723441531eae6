//! The child side: one process runs one job. It does all its set-up (attach the store, map
//! and pre-fault buffers, open files), says READY on stdout, blocks until the parent writes GO
//! on its stdin (the start barrier), runs the timed part, prints one JSON result line, and
//! waits for EOF on stdin (the end barrier) before it cleans up and exits.

use crate::util::{fill_pattern, now_ns, Context, Res, MIB};
use cascade_store::{ChunkLocation, OpenOptions, Store};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::hint::black_box;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What a child process measures. Sizes are in bytes; `io` is the size of each call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    /// memcpy `bytes` into a pre-faulted private anonymous mapping.
    MemcpyAnon { bytes: u64, io: u64 },
    /// memcpy `bytes` into a MAP_SHARED mapping of the existing /dev/shm object `shm` at
    /// `offset` (created and pre-faulted by the parent together with the store, like it).
    MemcpyShm {
        bytes: u64,
        io: u64,
        shm: String,
        offset: u64,
    },
    /// memcpy `bytes` into a pre-faulted MAP_SHARED mapping of a /dev/shm object this child
    /// creates during its set-up.
    MemcpyShmFresh { bytes: u64, io: u64, shm: String },
    /// write() `bytes` into a new file at `path` (tmpfs or disk); optionally fsync at the end
    /// (the mark "write_end" is taken before the fsync).
    FileWrite {
        bytes: u64,
        io: u64,
        path: String,
        fsync: bool,
    },
    /// Create `path` in the store and File::write_at `bytes`; optionally File::sync at the end.
    /// `fresh`: write at once after attaching, while the store's pages are still being mapped
    /// into the process (a job's first checkpoint); else only once they are. `pages`: after
    /// the timed part, report how much of the store the process maps in 2 MiB pages (its
    /// /proc/self/smaps, read only where no other process is being timed).
    StoreWrite {
        store: String,
        path: String,
        bytes: u64,
        io: u64,
        sync: bool,
        #[serde(default)]
        fresh: bool,
        #[serde(default)]
        pages: bool,
    },
    /// `rounds` checkpoints of `bytes` each into `dir`, deleting the oldest so `keep` remain.
    /// `store` = None: a tmpfs directory; Some: a directory inside that store.
    Steady {
        store: Option<String>,
        dir: String,
        bytes: u64,
        io: u64,
        rounds: usize,
        keep: usize,
    },
    /// Helper for the spill-over benchmark: unlink `old` (if any), then write `bytes` into a
    /// new store file `path` and keep it, occupying that much store memory. Run as a child so
    /// that the chunks it leases are given back when it exits (the parent allocates nothing).
    Filler {
        store: String,
        old: Option<String>,
        path: String,
        bytes: u64,
    },
    /// Cascade, memcpy-shm and store-chunks in turn in one process, `pairs` rounds, each phase
    /// timed: neighbouring phases see the same machine state, which separate runs seconds
    /// apart do not on a shared VM. Writes: a new store file `<prefix>-<k>` per round
    /// (unlinked at the end of the round), memcpy into the slice of the baseline object, and a
    /// raw memcpy into the chunks of the round's file (chunk-list API). Reads (`read`):
    /// `read_at` of the existing store file `<prefix>`, memcpy out of the slice (filled during
    /// set-up), and a raw memcpy out of the file's chunks.
    Paired {
        store: String,
        prefix: String,
        shm: String,
        offset: u64,
        bytes: u64,
        io: u64,
        pairs: usize,
        read: bool,
    },
    /// memcpy `bytes` out of the existing /dev/shm object `shm` at `offset` (filled during
    /// set-up) into an `io`-sized buffer.
    MemcpyShmRead {
        bytes: u64,
        io: u64,
        shm: String,
        offset: u64,
    },
    /// read() an existing file (written by the parent) with `io`-sized calls.
    FileRead { path: String, bytes: u64, io: u64 },
    /// File::read_at an existing store file (written by the parent) with `io`-sized calls.
    StoreRead {
        store: String,
        path: String,
        bytes: u64,
        io: u64,
    },
    /// Interposition benchmarks, the store-API side of `pio sweep`: per (size, calls), a new
    /// store file `<path>-<size>` written with `calls` File::write_at calls of `size` bytes
    /// (one phase each; the file is checked and unlinked after its phase).
    StoreSweep {
        store: String,
        path: String,
        sizes: Vec<(u64, u64)>,
    },
    /// The store-API side of `pio replay`: File::write_at calls of the sizes in the file
    /// `sizes` (little-endian u32 each), back to back, into one new store file.
    StoreReplay {
        store: String,
        path: String,
        sizes: String,
    },
    /// The store-API side of `pio meta`: in the new store directory `dir`, `files` times
    /// create + write_at 4 KiB + drop; then `passes` times Store::stat of each; then unlink
    /// each (phases "create", "stat", "unlink").
    StoreMeta {
        store: String,
        dir: String,
        files: u64,
        passes: u64,
    },
}

/// What a child reports. Times are CLOCK_MONOTONIC nanoseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChildResult {
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: u64,
    /// Extra time points, e.g. "write_end" (before fsync).
    #[serde(default)]
    pub marks: BTreeMap<String, u64>,
    /// (start, end) of each round of a steady-state job.
    #[serde(default)]
    pub rounds: Vec<(u64, u64)>,
    /// Set-up time before the barrier (attach, pre-faulting), in seconds.
    #[serde(default)]
    pub setup_s: f64,
    /// Bytes of the written file that went to the spill file (store jobs).
    #[serde(default)]
    pub spilled_bytes: u64,
    /// (method, start, end) of each phase of a paired job.
    #[serde(default)]
    pub phases: Vec<(String, u64, u64)>,
    /// I/O calls made in the timed part (jobs that count them).
    #[serde(default)]
    pub calls: u64,
    /// Bytes of the store this process maps in 2 MiB pages (`Store::huge_page_bytes`), when
    /// the job asked and smaps could be read.
    #[serde(default)]
    pub huge_page_bytes: Option<u64>,
    /// pio's core probe before each sweep phase, ns per round: how much of its core the
    /// process had (bench/README.md, "Core sharing").
    #[serde(default)]
    pub probe_ns: Vec<f64>,
}

/// Signals READY and blocks until the parent releases everyone (one "GO" line written to
/// every child's stdin right after the last READY); returns the start time.
fn barrier() -> Res<u64> {
    let parent = std::os::unix::process::parent_id();
    {
        let mut out = std::io::stdout().lock();
        out.write_all(b"READY\n").ctx(|| "writing READY")?;
        out.flush().ctx(|| "flushing READY")?;
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .ctx(|| "waiting at the start barrier")?;
    let start = now_ns();
    // EOF instead of GO: the parent died or gave up; do not run a benchmark for nobody.
    if line.trim() != "GO" || std::os::unix::process::parent_id() != parent {
        return crate::util::err("the parent did not release the start barrier");
    }
    Ok(start)
}

/// Reports the result, then waits until the parent has every child's result (it closes our
/// stdin) before the caller cleans up: unlinking files, freeing memory or exiting while
/// another child is still being timed would steal CPU from it, or hand it freed chunks.
fn finish(res: &ChildResult) -> Res<()> {
    let line = serde_json::to_string(res).ctx(|| "encoding the result")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").ctx(|| "writing the result")?;
        out.flush().ctx(|| "flushing the result")?;
    }
    let mut rest = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut rest)
        .ctx(|| "waiting at the end barrier")?;
    Ok(())
}

fn source(io: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; io as usize];
    fill_pattern(&mut v, seed);
    v
}

fn check_sizes(bytes: u64, io: u64) -> Res<()> {
    if io == 0 || bytes % io != 0 {
        return crate::util::err(format!(
            "size {bytes} is not a multiple of the I/O size {io}"
        ));
    }
    Ok(())
}

/// Pre-faults a mapping the way the store pre-faults its data region: MADV_POPULATE_WRITE
/// allocates every page (zeroed by the kernel) and maps it writable, without writing data.
/// (Filling with a non-zero pattern instead measured up to 30 % faster memcpy afterwards on
/// the VM this was developed on, so the baseline must pre-fault the same way as the store.)
fn prefault(map: &memmap2::MmapMut) -> std::io::Result<()> {
    map.advise(memmap2::Advice::PopulateWrite)
}

/// Creates a /dev/shm object of `bytes`, maps it MAP_SHARED and pre-faults it.
fn shm_map(shm: &str, bytes: u64) -> Res<memmap2::MmapMut> {
    let path = Path::new("/dev/shm").join(shm.trim_start_matches('/'));
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .ctx(|| format!("creating {}", path.display()))?;
    // The name is only needed to create it: unlink at once so nothing is left behind.
    fs::remove_file(&path).ctx(|| format!("unlinking {}", path.display()))?;
    f.set_len(bytes)
        .ctx(|| format!("sizing {} to {bytes} bytes", path.display()))?;
    // SAFETY: the object was just created by this process with O_EXCL and unlinked, so no
    // other process can resize or modify it while the mapping lives.
    let map =
        unsafe { memmap2::MmapMut::map_mut(&f) }.ctx(|| format!("mapping {}", path.display()))?;
    prefault(&map).ctx(|| format!("pre-faulting {}", path.display()))?;
    Ok(map)
}

/// Maps `bytes` at `offset` of the existing /dev/shm object `shm` (made by the parent) and
/// maps its pages into this process, as `Store::attach` + `map_in` do for the store.
fn shm_map_existing(shm: &str, offset: u64, bytes: u64) -> Res<memmap2::MmapMut> {
    let path = Path::new("/dev/shm").join(shm.trim_start_matches('/'));
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .ctx(|| format!("opening {}", path.display()))?;
    // SAFETY: the object belongs to this benchmark run; each child maps its own disjoint
    // slice, and the parent neither resizes it nor writes to it while children run.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(bytes as usize)
            .map_mut(&f)
    }
    .ctx(|| format!("mapping {}", path.display()))?;
    prefault(&map).ctx(|| format!("populating {}", path.display()))?;
    Ok(map)
}

/// Attaches a store and waits until its pages are mapped into this process (attach populates
/// the page tables in a background thread; racing it would time minor faults and a competing
/// thread instead of the write path). Part of the set-up, reported as such.
fn attach(name: &str) -> Res<Store> {
    let st = Store::attach(name).ctx(|| format!("attaching store {name}"))?;
    st.map_in();
    Ok(st)
}

/// The memory chunks of `f`, in file order, as (address in this process, length); fails if a
/// chunk is in the spill file or the chunks do not cover `bytes` contiguously.
fn memory_spans(
    st: &Store,
    f: &cascade_store::File,
    path: &str,
    bytes: u64,
) -> Res<Vec<(*mut u8, usize)>> {
    let region = st.data_region();
    let cs = st.chunk_size();
    let mut chunks = f.chunk_list().ctx(|| format!("chunk list of {path}"))?;
    chunks.sort_by_key(|c| c.index);
    let mut spans = Vec::with_capacity(chunks.len());
    let mut covered = 0u64;
    for c in &chunks {
        let ChunkLocation::Memory { offset } = c.location else {
            return crate::util::err(format!("{path}: chunk {} is spilled", c.index));
        };
        if c.index * cs != covered || offset + c.length > region.len as u64 {
            return crate::util::err(format!("{path}: unexpected chunk layout at {}", c.index));
        }
        // SAFETY: offset + length <= region.len (checked above), so the pointer stays inside
        // the data region mapped in this process.
        spans.push((
            unsafe { region.addr.add(offset as usize) },
            c.length as usize,
        ));
        covered += c.length;
    }
    if covered < bytes {
        return crate::util::err(format!("{path}: chunks cover {covered} of {bytes} bytes"));
    }
    Ok(spans)
}

/// Runs one job; called by the hidden `child` subcommand.
pub fn run(job_json: &str) -> Res<()> {
    let job: Job = serde_json::from_str(job_json).ctx(|| "parsing the job")?;
    let t_setup = now_ns();
    match job {
        Job::MemcpyAnon { bytes, io } => {
            check_sizes(bytes, io)?;
            let src = source(io, 1);
            let mut map = memmap2::MmapMut::map_anon(bytes as usize)
                .ctx(|| format!("mapping {bytes} bytes of anonymous memory"))?;
            prefault(&map).ctx(|| "pre-faulting anonymous memory")?;
            timed_copy_into(&mut map, &src, bytes, secs_since(t_setup))?;
        }
        Job::MemcpyShm {
            bytes,
            io,
            shm,
            offset,
        } => {
            check_sizes(bytes, io)?;
            let src = source(io, 1);
            let mut map = shm_map_existing(&shm, offset, bytes)?;
            timed_copy_into(&mut map, &src, bytes, secs_since(t_setup))?;
        }
        Job::MemcpyShmFresh { bytes, io, shm } => {
            check_sizes(bytes, io)?;
            let src = source(io, 1);
            let mut map = shm_map(&shm, bytes)?;
            timed_copy_into(&mut map, &src, bytes, secs_since(t_setup))?;
        }
        Job::FileWrite {
            bytes,
            io,
            path,
            fsync,
        } => {
            check_sizes(bytes, io)?;
            let src = source(io, 1);
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .ctx(|| format!("creating {path}"))?;
            for _ in 0..bytes / io {
                f.write_all(&src).ctx(|| format!("writing {path}"))?;
            }
            let write_end = now_ns();
            if fsync {
                f.sync_all().ctx(|| format!("fsync {path}"))?;
            }
            drop(f);
            let end = now_ns();
            let mut r = result(start, end, bytes, setup_s);
            r.marks.insert("write_end".into(), write_end);
            finish(&r)?;
            fs::remove_file(&path).ctx(|| format!("removing {path}"))?;
        }
        Job::StoreWrite {
            store,
            path,
            bytes,
            io,
            sync,
            fresh,
            pages,
        } => {
            check_sizes(bytes, io)?;
            let src = source(io, 1);
            let st = if fresh {
                Store::attach(&store).ctx(|| format!("attaching store {store}"))?
            } else {
                attach(&store)?
            };
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            let f = st
                .open(&path, &OpenOptions::new().write(true).create_new(true))
                .ctx(|| format!("creating {path} in {store}"))?;
            let mut off = 0;
            while off < bytes {
                f.write_all_at(&src, off)
                    .ctx(|| format!("writing {path} in {store} at {off}"))?;
                off += io;
            }
            let write_end = now_ns();
            if sync {
                f.sync().ctx(|| format!("syncing {path} in {store}"))?;
            }
            drop(f);
            let end = now_ns();
            let md = st.stat(&path).ctx(|| format!("stat {path} in {store}"))?;
            if md.size != bytes {
                return crate::util::err(format!(
                    "{path} in {store}: size {} after writing {bytes} bytes",
                    md.size
                ));
            }
            let mut r = result(start, end, bytes, setup_s);
            r.marks.insert("write_end".into(), write_end);
            r.spilled_bytes = md.chunks_spilled * md.chunk_size;
            if pages {
                r.huge_page_bytes = st.huge_page_bytes();
            }
            finish(&r)?;
            st.unlink(&path)
                .ctx(|| format!("unlinking {path} in {store}"))?;
        }
        Job::Steady {
            store,
            dir,
            bytes,
            io,
            rounds,
            keep,
        } => steady(store, &dir, bytes, io, rounds, keep, t_setup)?,
        Job::Filler {
            store,
            old,
            path,
            bytes,
        } => {
            let st = attach(&store)?;
            if let Some(old) = &old {
                match st.unlink(old) {
                    Ok(()) => {}
                    Err(e) if e.errno() == libc::ENOENT => {}
                    Err(e) => return Err(e).ctx(|| format!("unlinking {old} in {store}")),
                }
            }
            let src = source(MIB, 4);
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            if bytes > 0 {
                let f = st
                    .open(&path, &OpenOptions::new().write(true).create_new(true))
                    .ctx(|| format!("creating {path} in {store}"))?;
                let mut off = 0;
                while off < bytes {
                    let n = (bytes - off).min(MIB) as usize;
                    f.write_all_at(&src[..n], off)
                        .ctx(|| format!("writing {path} in {store} at {off}"))?;
                    off += n as u64;
                }
            }
            finish(&result(start, now_ns(), bytes, setup_s))?;
        }
        Job::Paired {
            store,
            prefix,
            shm,
            offset,
            bytes,
            io,
            pairs,
            read,
        } => paired(
            &store, &prefix, &shm, offset, bytes, io, pairs, read, t_setup,
        )?,
        Job::MemcpyShmRead {
            bytes,
            io,
            shm,
            offset,
        } => {
            check_sizes(bytes, io)?;
            let src = source(io, 2);
            let mut map = shm_map_existing(&shm, offset, bytes)?;
            for dst in map.chunks_exact_mut(io as usize) {
                dst.copy_from_slice(&src);
            }
            let mut buf = vec![0u8; io as usize];
            buf.fill(1);
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            for s in map.chunks_exact(io as usize) {
                buf.copy_from_slice(s);
                black_box(&mut buf);
            }
            let end = now_ns();
            if buf != src {
                return crate::util::err("shm read-back: data differs from what was written");
            }
            finish(&result(start, end, bytes, setup_s))?;
        }
        Job::FileRead { path, bytes, io } => {
            check_sizes(bytes, io)?;
            let mut buf = vec![0u8; io as usize];
            buf.fill(1);
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            let mut f = fs::File::open(&path).ctx(|| format!("opening {path}"))?;
            for _ in 0..bytes / io {
                f.read_exact(&mut buf).ctx(|| format!("reading {path}"))?;
                black_box(&mut buf);
            }
            drop(f);
            let end = now_ns();
            if buf != source(io, 2) {
                return crate::util::err(format!("{path}: read-back data differs"));
            }
            finish(&result(start, end, bytes, setup_s))?;
        }
        Job::StoreRead {
            store,
            path,
            bytes,
            io,
        } => {
            check_sizes(bytes, io)?;
            let st = attach(&store)?;
            let mut buf = vec![0u8; io as usize];
            buf.fill(1);
            let setup_s = secs_since(t_setup);
            let start = barrier()?;
            let f = st
                .open(&path, &OpenOptions::new())
                .ctx(|| format!("opening {path} in {store}"))?;
            let mut off = 0;
            while off < bytes {
                let mut got = 0;
                while got < buf.len() {
                    let n = f
                        .read_at(&mut buf[got..], off + got as u64)
                        .ctx(|| format!("reading {path} in {store} at {off}"))?;
                    if n == 0 {
                        return crate::util::err(format!(
                            "{path} in {store}: unexpected end of file at {}",
                            off + got as u64
                        ));
                    }
                    got += n;
                }
                black_box(&mut buf);
                off += io;
            }
            drop(f);
            let end = now_ns();
            if buf != source(io, 2) {
                return crate::util::err(format!("{path} in {store}: read-back data differs"));
            }
            finish(&result(start, end, bytes, setup_s))?;
        }
        Job::StoreSweep { store, path, sizes } => store_sweep(&store, &path, &sizes, t_setup)?,
        Job::StoreReplay { store, path, sizes } => store_replay(&store, &path, &sizes, t_setup)?,
        Job::StoreMeta {
            store,
            dir,
            files,
            passes,
        } => store_meta(&store, &dir, files, passes, t_setup)?,
    }
    Ok(())
}

/// A page-aligned source buffer with the pattern of [`source`]. The interposition
/// benchmarks' C program writes from page-aligned buffers in the sweep and the replay, and
/// memcpy's speed depends on the source's alignment relative to the destination (see
/// bench/preload/pio.c), so the store-API side of those uses page-aligned ones too.
struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(len: u64, seed: u64) -> Aligned {
        let len = len as usize;
        let mut v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        fill_pattern(&mut v[off..off + len], seed);
        Aligned { v, off, len }
    }

    fn get(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

/// Creates `path` in the store and writes `calls` times `src[..size]` with File::write_at.
fn store_write_calls(st: &Store, path: &str, src: &[u8], calls: u64) -> Res<()> {
    let f = st
        .open(path, &OpenOptions::new().write(true).create_new(true))
        .ctx(|| format!("creating {path} in the store"))?;
    let size = src.len() as u64;
    let mut off = 0;
    for _ in 0..calls {
        f.write_all_at(src, off)
            .ctx(|| format!("writing {path} in the store at {off}"))?;
        off += size;
    }
    Ok(())
}

/// Checks that store file `path` has `size` bytes, then unlinks it.
fn check_and_unlink(st: &Store, path: &str, size: u64) -> Res<()> {
    let md = st.stat(path).ctx(|| format!("stat {path} in the store"))?;
    if md.size != size {
        return crate::util::err(format!(
            "{path} in the store: size {} after writing {size} bytes",
            md.size
        ));
    }
    st.unlink(path)
        .ctx(|| format!("unlinking {path} in the store"))
}

fn store_sweep(store: &str, path: &str, sizes: &[(u64, u64)], t_setup: u64) -> Res<()> {
    let max = sizes.iter().map(|s| s.0).max().unwrap_or(1);
    let src = Aligned::new(max, 1);
    let src = src.get();
    let st = attach(store)?;
    let setup_s = secs_since(t_setup);
    let start = barrier()?;
    let mut phases = Vec::with_capacity(sizes.len());
    let (mut bytes, mut calls) = (0, 0);
    for &(size, n) in sizes {
        let name = format!("{path}-{size}");
        let t0 = now_ns();
        store_write_calls(&st, &name, &src[..size as usize], n)?;
        phases.push((size.to_string(), t0, now_ns()));
        check_and_unlink(&st, &name, size * n)?;
        bytes += size * n;
        calls += n;
    }
    let mut r = result(start, now_ns(), bytes, setup_s);
    r.phases = phases;
    r.calls = calls;
    finish(&r)
}

fn store_replay(store: &str, path: &str, sizes_file: &str, t_setup: u64) -> Res<()> {
    let raw = fs::read(sizes_file).ctx(|| format!("reading {sizes_file}"))?;
    let sizes: Vec<usize> = raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    let total: u64 = sizes.iter().map(|&s| s as u64).sum();
    let src = Aligned::new(sizes.iter().copied().max().unwrap_or(1) as u64, 1);
    let src = src.get();
    let st = attach(store)?;
    let setup_s = secs_since(t_setup);
    let start = barrier()?;
    let f = st
        .open(path, &OpenOptions::new().write(true).create_new(true))
        .ctx(|| format!("creating {path} in {store}"))?;
    let mut off = 0;
    for &s in &sizes {
        f.write_all_at(&src[..s], off)
            .ctx(|| format!("writing {path} in {store} at {off}"))?;
        off += s as u64;
    }
    drop(f);
    let end = now_ns();
    let mut r = result(start, end, total, setup_s);
    r.calls = sizes.len() as u64;
    finish(&r)?;
    check_and_unlink(&st, path, total)
}

fn store_meta(store: &str, dir: &str, files: u64, passes: u64, t_setup: u64) -> Res<()> {
    let names: Vec<String> = (0..files).map(|i| format!("{dir}/f{i:07}")).collect();
    let src = Aligned::new(4096, 1);
    let src = src.get();
    let st = attach(store)?;
    st.mkdir(dir, 0o755)
        .ctx(|| format!("creating {dir} in {store}"))?;
    let setup_s = secs_since(t_setup);
    let start = barrier()?;
    let t0 = now_ns();
    for p in &names {
        let f = st
            .open(p, &OpenOptions::new().write(true).create_new(true))
            .ctx(|| format!("creating {p} in {store}"))?;
        f.write_all_at(src, 0)
            .ctx(|| format!("writing {p} in {store}"))?;
    }
    let t1 = now_ns();
    for _ in 0..passes {
        for p in &names {
            let md = st.stat(p).ctx(|| format!("stat {p} in {store}"))?;
            if md.size != 4096 {
                return crate::util::err(format!("{p} in {store} has {} bytes", md.size));
            }
        }
    }
    let t2 = now_ns();
    for p in &names {
        st.unlink(p).ctx(|| format!("unlinking {p} in {store}"))?;
    }
    let t3 = now_ns();
    let mut r = result(start, t3, files * 4096, setup_s);
    r.phases = vec![
        ("create".into(), t0, t1),
        ("stat".into(), t1, t2),
        ("unlink".into(), t2, t3),
    ];
    r.calls = files * (3 + passes);
    finish(&r)?;
    st.rmdir(dir).ctx(|| format!("removing {dir} in {store}"))
}

/// The timed part of the memcpy baselines: after the barrier, copy `src` over all of `dst`
/// in `src.len()` pieces, then report.
fn timed_copy_into(dst: &mut [u8], src: &[u8], bytes: u64, setup_s: f64) -> Res<()> {
    let start = barrier()?;
    for piece in dst.chunks_exact_mut(src.len()) {
        piece.copy_from_slice(src);
    }
    black_box(dst.as_mut_ptr());
    let end = now_ns();
    finish(&result(start, end, bytes, setup_s))
}

fn secs_since(t: u64) -> f64 {
    (now_ns() - t) as f64 / 1e9
}

fn result(start: u64, end: u64, bytes: u64, setup_s: f64) -> ChildResult {
    ChildResult {
        start_ns: start,
        end_ns: end,
        bytes,
        setup_s,
        ..Default::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn paired(
    store: &str,
    prefix: &str,
    shm: &str,
    offset: u64,
    bytes: u64,
    io: u64,
    pairs: usize,
    read: bool,
    t_setup: u64,
) -> Res<()> {
    check_sizes(bytes, io)?;
    let seed = if read { 2 } else { 1 };
    let src = source(io, seed);
    let st = attach(store)?;
    let mut map = shm_map_existing(shm, offset, bytes)?;
    let mut buf = vec![1u8; io as usize];
    let file = if read {
        for dst in map.chunks_exact_mut(io as usize) {
            dst.copy_from_slice(&src);
        }
        let f = st
            .open(prefix, &OpenOptions::new())
            .ctx(|| format!("opening {prefix} in {store}"))?;
        let spans = memory_spans(&st, &f, prefix, bytes)?;
        Some((f, spans))
    } else {
        None
    };
    let setup_s = secs_since(t_setup);
    let start = barrier()?;
    let mut phases = Vec::with_capacity(3 * pairs);
    for k in 0..pairs {
        // The store-chunks phase of a write pair overwrites the file the Cascade phase wrote,
        // so it always comes right after it; memcpy-shm goes first or last.
        let order = if k % 2 == 0 {
            ["memcpy-shm", "cascade", "store-chunks"]
        } else {
            ["cascade", "store-chunks", "memcpy-shm"]
        };
        let path = format!("{prefix}-{k}");
        let mut written: Option<(cascade_store::File, Vec<(*mut u8, usize)>)> = None;
        for m in order {
            let t0 = now_ns();
            match (m, &file) {
                ("memcpy-shm", None) => {
                    for dst in map.chunks_exact_mut(io as usize) {
                        dst.copy_from_slice(&src);
                    }
                    black_box(map.as_mut_ptr());
                }
                ("memcpy-shm", Some(_)) => {
                    for s in map.chunks_exact(io as usize) {
                        buf.copy_from_slice(s);
                        black_box(&mut buf);
                    }
                }
                ("cascade", None) => {
                    let f = st
                        .open(&path, &OpenOptions::new().write(true).create_new(true))
                        .ctx(|| format!("creating {path} in {store}"))?;
                    let mut off = 0;
                    while off < bytes {
                        f.write_all_at(&src, off)
                            .ctx(|| format!("writing {path} in {store} at {off}"))?;
                        off += io;
                    }
                    let t1 = now_ns();
                    // The chunk list for the next phase is not part of either timing.
                    let spans = memory_spans(&st, &f, &path, bytes)?;
                    written = Some((f, spans));
                    phases.push((m.to_string(), t0, t1));
                    continue;
                }
                ("cascade", Some((f, _))) => {
                    let mut off = 0;
                    while off < bytes {
                        read_full(f, &mut buf, off, prefix)?;
                        black_box(&mut buf);
                        off += io;
                    }
                }
                (_, None) => {
                    let Some((_, spans)) = &written else {
                        return crate::util::err("paired: store-chunks phase before cascade");
                    };
                    copy_into_spans(spans, &src, bytes / io);
                }
                (_, Some((_, spans))) => {
                    copy_out_of_spans(spans, &mut buf, bytes / io);
                }
            }
            phases.push((m.to_string(), t0, now_ns()));
        }
        if let Some((f, _)) = written.take() {
            drop(f);
            st.unlink(&path)
                .ctx(|| format!("unlinking {path} in {store}"))?;
        }
    }
    let end = now_ns();
    if read && buf != src {
        return crate::util::err(format!("{prefix} in {store}: read-back data differs"));
    }
    let mut r = result(start, end, bytes * 3 * pairs as u64, setup_s);
    r.phases = phases;
    finish(&r)
}

/// Copies `src` `times` times, back to back, into the memory spans (file order).
fn copy_into_spans(spans: &[(*mut u8, usize)], src: &[u8], times: u64) {
    let mut span = 0;
    let mut within = 0usize;
    for _ in 0..times {
        let mut done = 0usize;
        while done < src.len() {
            let (addr, len) = spans[span];
            let n = (len - within).min(src.len() - done);
            // SAFETY: `addr..addr+len` is a memory chunk of a store file that this process
            // created under a name unique to this run, so nobody else touches it; `within + n
            // <= len` keeps the copy inside the chunk and the live mapping of the data region.
            // Source (heap) and destination (shared memory) do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(done), addr.add(within), n);
            }
            done += n;
            within += n;
            if within == len {
                span += 1;
                within = 0;
            }
        }
    }
    black_box(spans.as_ptr());
}

/// Copies `times` buffers' worth, back to back, out of the memory spans into `buf`.
fn copy_out_of_spans(spans: &[(*mut u8, usize)], buf: &mut [u8], times: u64) {
    let mut span = 0;
    let mut within = 0usize;
    for _ in 0..times {
        let mut done = 0usize;
        while done < buf.len() {
            let (addr, len) = spans[span];
            let n = (len - within).min(buf.len() - done);
            // SAFETY: `addr..addr+len` is a memory chunk of an open store file that nobody
            // modifies while children run; `within + n <= len` keeps the read inside the chunk
            // and the live mapping; `done + n <= buf.len()` keeps the write inside our buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr.add(within) as *const u8,
                    buf.as_mut_ptr().add(done),
                    n,
                );
            }
            done += n;
            within += n;
            if within == len {
                span += 1;
                within = 0;
            }
        }
        black_box(&mut *buf);
    }
}

/// Fills `buf` from `f` at `off` (read_at may return less than asked).
fn read_full(f: &cascade_store::File, buf: &mut [u8], off: u64, path: &str) -> Res<()> {
    let mut got = 0;
    while got < buf.len() {
        let n = f
            .read_at(&mut buf[got..], off + got as u64)
            .ctx(|| format!("reading {path} at {}", off + got as u64))?;
        if n == 0 {
            return crate::util::err(format!(
                "{path}: unexpected end of file at {}",
                off + got as u64
            ));
        }
        got += n;
    }
    Ok(())
}

/// Steady-state checkpointing: each round creates a new checkpoint file, writes it, closes it,
/// then deletes the oldest one so that `keep` remain. Each round's time includes all of that.
fn steady(
    store: Option<String>,
    dir: &str,
    bytes: u64,
    io: u64,
    rounds: usize,
    keep: usize,
    t_setup: u64,
) -> Res<()> {
    check_sizes(bytes, io)?;
    let src = source(io, 3);
    let st = match &store {
        Some(name) => {
            let st = attach(name)?;
            st.create_dir_all(dir, 0o755)
                .ctx(|| format!("creating {dir} in {name}"))?;
            Some(st)
        }
        None => {
            fs::create_dir_all(dir).ctx(|| format!("creating {dir}"))?;
            None
        }
    };
    let name = |r: usize| format!("{dir}/ckpt.{r:04}");
    let setup_s = secs_since(t_setup);
    let start = barrier()?;
    let mut times = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let t0 = now_ns();
        let path = name(r);
        match &st {
            Some(st) => {
                let f = st
                    .open(&path, &OpenOptions::new().write(true).create_new(true))
                    .ctx(|| format!("creating {path} in the store"))?;
                let mut off = 0;
                while off < bytes {
                    f.write_all_at(&src, off)
                        .ctx(|| format!("writing {path} in the store at {off}"))?;
                    off += io;
                }
                drop(f);
                if r >= keep {
                    let old = name(r - keep);
                    st.unlink(&old)
                        .ctx(|| format!("unlinking {old} in the store"))?;
                }
            }
            None => {
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .ctx(|| format!("creating {path}"))?;
                for _ in 0..bytes / io {
                    f.write_all(&src).ctx(|| format!("writing {path}"))?;
                }
                drop(f);
                if r >= keep {
                    let old = name(r - keep);
                    fs::remove_file(&old).ctx(|| format!("removing {old}"))?;
                }
            }
        }
        times.push((t0, now_ns()));
    }
    let end = now_ns();
    let mut res = result(start, end, bytes * rounds as u64, setup_s);
    res.rounds = times;
    finish(&res)?;
    for r in rounds.saturating_sub(keep)..rounds {
        let path = name(r);
        match &st {
            Some(st) => st
                .unlink(&path)
                .ctx(|| format!("unlinking {path} in the store"))?,
            None => fs::remove_file(&path).ctx(|| format!("removing {path}"))?,
        }
    }
    Ok(())
}
