//! Node stores for the measurements of the node-store, interposition and FUSE suites: created
//! and destroyed by the bench (creation timed), burnt in, the shared-memory baseline object,
//! and the paired runs against memcpy that the write and read targets use.

use crate::child::Job;
use crate::harness::{run_group, Rounds};
use crate::util::{
    fill_pattern, gbps, now_ns, prefix, size_str, store_name, Context, Res, Stats, MIB,
};
use cascade_store::{OpenOptions, Prefault, SpillConfig, Store, StoreConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where a suite's results keep the creation of its stores.
pub trait Creations {
    fn creations(&mut self) -> &mut Vec<Creation>;
}

impl Creations for Vec<Creation> {
    fn creations(&mut self) -> &mut Vec<Creation> {
        self
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Creation {
    pub store: String,
    pub capacity: u64,
    pub chunk_size: u64,
    pub spill_bytes: u64,
    /// Wall time of `Store::create` with `Prefault::Foreground`.
    pub seconds: f64,
    /// capacity / seconds.
    pub gbps: f64,
}

/// Cascade, memcpy-shm and store-chunks taking turns inside the same processes (see
/// `Job::Paired`).
#[derive(Debug, Clone, Serialize)]
pub struct TightPair {
    /// "write" or "read".
    pub kind: String,
    pub procs: usize,
    pub cascade_gbps: Stats,
    pub memcpy_shm_gbps: Stats,
    pub store_chunks_gbps: Stats,
    /// cascade / memcpy-shm within each round.
    pub ratio: Stats,
    /// cascade / store-chunks within each round (diagnostic: the store's own memory).
    pub ratio_chunks: Stats,
}

/// Cascade and memcpy-shm taking turns in `procs` processes, with `bytes` per process in `io` calls, `pairs` rounds.
/// Reads use the existing store files `/rb-p<i>.dat`.
pub(crate) fn tight_pair_with(
    store: &Store,
    base: &ShmBase,
    procs: usize,
    read: bool,
    bytes: u64,
    io: u64,
    pairs: usize,
) -> Res<TightPair> {
    let jobs: Vec<Job> = (0..procs)
        .map(|i| Job::Paired {
            store: store.name().to_string(),
            prefix: if read {
                format!("/rb-p{i}.dat")
            } else {
                format!("/pair-p{i}")
            },
            shm: base.name.clone(),
            offset: i as u64 * bytes,
            bytes,
            io,
            pairs,
            read,
        })
        .collect();
    let kind = if read { "read" } else { "write" };
    let out = run_group(&jobs).ctx(|| format!("paired {kind}s with {procs} processes"))?;
    let rounds = Rounds::of(&out, 3, pairs, bytes * procs as u64)?;
    let (cas, shm, chunks) = (
        rounds.gbps("cascade"),
        rounds.gbps("memcpy-shm"),
        rounds.gbps("store-chunks"),
    );
    let (r_shm, r_chunks) = (
        rounds.ratio("cascade", "memcpy-shm"),
        rounds.ratio("cascade", "store-chunks"),
    );
    eprintln!(
        "  [pairs] {kind}s procs={procs}: cascade {:.2}, memcpy-shm {:.2}, store-chunks {:.2} GB/s; cascade/memcpy-shm {:.2}x, cascade/store-chunks {:.2}x (medians of {} rounds)",
        cas.median, shm.median, chunks.median, r_shm.median, r_chunks.median, pairs
    );
    Ok(TightPair {
        kind: kind.to_string(),
        procs,
        cascade_gbps: cas,
        memcpy_shm_gbps: shm,
        store_chunks_gbps: chunks,
        ratio: r_shm,
        ratio_chunks: r_chunks,
    })
}

/// Creates a store with room for `max_files` files and directories (`Prefault::Foreground`,
/// timed), burns it in unless it has a spill file, runs `f` with it, then drops this
/// process's handle and destroys the store, also when `f` failed. (After a panic, the run's
/// cleanup guard destroys it.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn with_store_files<R: Creations, T>(
    results: &mut R,
    pid: u32,
    tag: &str,
    capacity: u64,
    chunk_size: u64,
    max_files: u32,
    spill: Option<SpillConfig>,
    f: impl FnOnce(&mut R, &Store) -> Res<T>,
) -> Res<T> {
    let has_spill = spill.is_some();
    let store = create_store(results, pid, tag, capacity, chunk_size, max_files, spill)?;
    let name = store.name().to_string();
    let r = if has_spill {
        f(results, &store)
    } else {
        burn_in(&store, capacity).and_then(|()| f(results, &store))
    };
    // Detach first: destroy refuses while a live process (this one) is attached.
    drop(store);
    let d = Store::destroy(&name).ctx(|| format!("destroying store {name}"));
    let v = r?;
    d?;
    Ok(v)
}

/// Creates a store with `Prefault::Foreground` and records how long that took.
fn create_store<R: Creations>(
    results: &mut R,
    pid: u32,
    tag: &str,
    capacity: u64,
    chunk_size: u64,
    max_files: u32,
    spill: Option<SpillConfig>,
) -> Res<Store> {
    let name = store_name(pid, tag);
    let spill_bytes = spill.as_ref().map_or(0, |s| s.size);
    let cfg = StoreConfig {
        name: name.clone(),
        capacity,
        chunk_size,
        max_files,
        spill,
        prefault: Prefault::Foreground,
    };
    let t = now_ns();
    let store = Store::create(&cfg).ctx(|| {
        format!(
            "creating store {name} ({} memory, {} chunks)",
            size_str(capacity),
            size_str(chunk_size)
        )
    })?;
    let ns = now_ns() - t;
    let c = Creation {
        store: name,
        capacity,
        chunk_size,
        spill_bytes,
        seconds: ns as f64 / 1e9,
        gbps: gbps(capacity, ns),
    };
    eprintln!(
        "  created {} ({} memory, {} chunks): {:.3} s prefault = {:.2} GB/s",
        c.store,
        size_str(capacity),
        size_str(chunk_size),
        c.seconds,
        c.gbps
    );
    results.creations().push(c);
    Ok(store)
}

/// Writes the whole memory of a new store once through the API (a file that fills it, then
/// unlinked), so that every measurement finds store memory that has held data before, like
/// the memcpy-shm baseline object after its own burn-in and like a store in service. On the
/// VM this was developed on, the first write into freshly pre-faulted pages was at times
/// several times slower than later ones, which would otherwise land on whichever repetition
/// happens to get never-used chunks.
pub(crate) fn burn_in(store: &Store, capacity: u64) -> Res<()> {
    let t = now_ns();
    let path = "/burn-in";
    let f = store
        .open(path, &OpenOptions::new().write(true).create_new(true))
        .ctx(|| format!("creating {path}"))?;
    let mut src = vec![0u8; MIB as usize];
    fill_pattern(&mut src, 5);
    let mut off = 0;
    while off < capacity {
        match f.write_at(&src, off) {
            Ok(0) => break,
            Ok(n) => off += n as u64,
            // Chunks parked in this process's batch may make the store "full" a bit early.
            Err(e) if e.errno() == libc::ENOSPC => break,
            Err(e) => return Err(e).ctx(|| format!("writing {path} at {off}")),
        }
    }
    drop(f);
    store.unlink(path).ctx(|| format!("unlinking {path}"))?;
    eprintln!(
        "  burn-in: wrote {} of store memory once in {:.3} s",
        size_str(off),
        (now_ns() - t) as f64 / 1e9
    );
    Ok(())
}

/// Memory for `files` files of `bytes` plus slack for chunks parked in per-process batches.
pub(crate) fn capacity_for(bytes_needed: u64, chunk: u64) -> u64 {
    let slack = (bytes_needed / 8).max(16 * chunk);
    (bytes_needed + slack).div_ceil(chunk) * chunk
}

/// The /dev/shm object of the memcpy-shm baselines; removed when dropped.
pub(crate) struct ShmBase {
    pub(crate) name: String,
    path: PathBuf,
}

impl ShmBase {
    pub(crate) fn create(pid: u32, bytes: u64) -> Res<ShmBase> {
        let name = format!("{}-shm-base", prefix(pid));
        let path = PathBuf::from("/dev/shm").join(&name);
        let t = now_ns();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(|| format!("creating {}", path.display()))?;
        let base = ShmBase {
            name,
            path: path.clone(),
        };
        f.set_len(bytes)
            .ctx(|| format!("sizing {}", path.display()))?;
        // SAFETY: the object was just created by this process (create_new) under a name unique
        // to this run; nothing else maps or resizes it while this short-lived mapping exists.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }
            .ctx(|| format!("mapping {}", path.display()))?;
        map.advise(memmap2::Advice::PopulateWrite)
            .ctx(|| format!("pre-faulting {}", path.display()))?;
        // Burn-in, as for the store: write it all once.
        map.fill(0x5a);
        eprintln!(
            "  created the memcpy-shm baseline object /dev/shm/{} ({}): {:.3} s pre-fault",
            base.name,
            size_str(bytes),
            (now_ns() - t) as f64 / 1e9
        );
        Ok(base)
    }
}

impl Drop for ShmBase {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            eprintln!("warning: removing {}: {e}", self.path.display());
        }
    }
}

/// The files the read-back runs read, written by the parent: `/rb-pI.dat` in the store and
/// `/dev/shm/<prefix>-rb-I.dat` on tmpfs for each process I, `bytes` of `io`-byte pieces of
/// the pattern of seed 2; removed when dropped.
pub(crate) struct ReadbackFiles<'a> {
    store: &'a Store,
    pub(crate) tmpfs: Vec<String>,
}

impl<'a> ReadbackFiles<'a> {
    pub(crate) fn write(
        store: &'a Store,
        pid: u32,
        procs: usize,
        bytes: u64,
        io: u64,
    ) -> Res<Self> {
        let mut src = vec![0u8; io as usize];
        fill_pattern(&mut src, 2);
        let mut files = ReadbackFiles {
            store,
            tmpfs: Vec::new(),
        };
        for i in 0..procs {
            let path = Self::store_path(i);
            let f = store
                .open(&path, &OpenOptions::new().write(true).create_new(true))
                .ctx(|| format!("creating {path} in the store"))?;
            for off in (0..bytes).step_by(io as usize) {
                f.write_all_at(&src, off)
                    .ctx(|| format!("writing {path} in the store"))?;
            }
            let tpath = format!("/dev/shm/{}-rb-{i}.dat", prefix(pid));
            let mut data = std::fs::File::create(&tpath).ctx(|| format!("creating {tpath}"))?;
            files.tmpfs.push(tpath.clone());
            for _ in 0..bytes / io {
                std::io::Write::write_all(&mut data, &src).ctx(|| format!("writing {tpath}"))?;
            }
        }
        Ok(files)
    }

    /// The store file of process `i`.
    pub(crate) fn store_path(i: usize) -> String {
        format!("/rb-p{i}.dat")
    }
}

impl Drop for ReadbackFiles<'_> {
    fn drop(&mut self) {
        for i in 0..self.tmpfs.len() {
            if let Err(e) = self.store.unlink(&Self::store_path(i)) {
                eprintln!(
                    "warning: unlinking {} in the store: {e}",
                    Self::store_path(i)
                );
            }
        }
        for t in &self.tmpfs {
            let _ = std::fs::remove_file(t);
        }
    }
}
