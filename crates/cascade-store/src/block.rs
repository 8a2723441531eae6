//! The mapped block in this process: creation, attach, destroy, prefault, the spill file, and
//! typed access to the regions described in layout.rs.

use crate::error::{Error, Result};
use crate::layout::*;
use crate::ownership;
use crate::types::{Prefault, SpillConfig, StoreConfig};
use memmap2::{MmapOptions, MmapRaw};
use std::ffi::CString;
use std::fs::File as OsFile;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Bytes faulted in per step, so progress is visible and a background prefault can be joined.
const PREFAULT_STEP: u64 = 256 << 20;

pub(crate) struct Spill {
    pub file: OsFile,
    pub path: PathBuf,
}

/// This process's lease slot (a batch of free memory chunks only it allocates from).
pub(crate) struct LeaseLocal {
    pub slot: u32,
    /// The pid that claimed the slot: a forked child must claim its own.
    pub pid: u32,
}

pub(crate) struct Block {
    pub name: String,
    /// The shared-memory object itself (mmap of a file's chunks maps from it).
    pub shm: OsFile,
    map: MmapRaw,
    pub base: *mut u8,
    pub geo: Geometry,
    pub spill: Option<Spill>,
    /// Set when this process wrote spill data not yet fdatasync'ed.
    pub spill_dirty: AtomicBool,
    pub lease: Mutex<LeaseLocal>,
    pub prefault_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Tells this process's populate thread to stop: a short-lived process (a CLI command,
    /// a preloaded `ls`) must not wait at exit for the whole block to be mapped.
    pub stop_populate: Arc<AtomicBool>,
    /// Set once this process's populate thread was started (at its first access to file
    /// data), or is not wanted (the creator faults the block in itself).
    populate_started: AtomicBool,
    /// Which memory chunks are mapped into this process (page tables populated).
    populated: Arc<Populated>,
    /// When this process last looked for batches of dead processes (see alloc.rs).
    pub last_reclaim: Mutex<Option<std::time::Instant>>,
    /// Where this process's next search for a free description slot starts
    /// (descriptions.rs, `next_slot_to_try`).
    pub next_ofd_slot: AtomicU64,
    /// (device, inode) of the shared-memory object and of the spill file, as opened.
    ids: (FileId, Option<FileId>),
    /// The objects opened again by a process in which `shm`'s and the spill file's
    /// descriptor numbers name other files (see [`Block::map_fds`]), with its pid.
    reopened: Mutex<Option<(u32, OsFile, Option<OsFile>)>>,
}

/// A file's identity: (device, inode).
type FileId = (u64, u64);

fn file_id(fd: i32) -> Option<FileId> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a struct stat into `st`, read only when it succeeded.
    let ok = unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0;
    // SAFETY: initialised by the successful fstat above.
    ok.then(|| unsafe { st.assume_init() })
        .map(|st| (st.st_dev, st.st_ino))
}

// SAFETY: the block is a shared mapping whose mutable state is accessed only through atomics,
// the robust locks, or raw pointers under those locks; the mapping itself is never remapped.
unsafe impl Send for Block {}
// SAFETY: see above.
unsafe impl Sync for Block {}

fn shm_name(name: &str) -> Result<CString> {
    if !name.starts_with('/') || name.len() < 2 || name[1..].contains('/') || name.len() > 255 {
        return Err(Error::new(
            libc::EINVAL,
            format!(
                "store name {name:?} must look like /NAME (one leading slash, at most 255 bytes)"
            ),
        ));
    }
    CString::new(name)
        .map_err(|_| Error::new(libc::EINVAL, format!("store name {name:?} contains NUL")))
}

fn shm_open(name: &str, flags: i32) -> Result<OsFile> {
    let c = shm_name(name)?;
    // SAFETY: `c` is a valid NUL-terminated string; shm_open returns a new fd or -1.
    let fd = unsafe { libc::shm_open(c.as_ptr(), flags | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        let e = Error::last_os(format!("store {name}"));
        if e.errno() == libc::ELOOP {
            return Err(Error::new(
                libc::ELOOP,
                format!(
                    "store {name}: {} is a symlink; Cascade uses only objects private to you, and this one may have been planted: remove it (as its owner or root) or choose another name",
                    shm_path(name).display()
                ),
            ));
        }
        return Err(e);
    }
    // SAFETY: `fd` was just returned by shm_open and is owned by nobody else.
    Ok(unsafe { OsFile::from_raw_fd(fd) })
}

/// Where the kernel keeps the object `name` (for messages and checks).
fn shm_path(name: &str) -> PathBuf {
    Path::new("/dev/shm").join(name.trim_start_matches('/'))
}

/// Opens an existing block and refuses one that is not a regular file owned by this process's
/// effective uid with no access for group or others (docs/security.md).
fn shm_open_existing(name: &str) -> Result<OsFile> {
    let file = shm_open(name, libc::O_RDWR)?;
    let st = ownership::fstat(file.as_raw_fd(), &format!("store {name}"))?;
    ownership::check_stat(
        &format!("store {name}"),
        &shm_path(name),
        &st,
        ownership::Kind::File,
    )?;
    Ok(file)
}

/// Creates (0700) or checks the store's lock directory, which also holds the agent socket.
fn ensure_lock_dir(name: &str) -> Result<()> {
    ownership::ensure_private_dir(
        &format!("lock directory of store {name}"),
        &crate::Store::lock_dir(name),
    )
}

fn shm_unlink(name: &str) -> Result<()> {
    let c = shm_name(name)?;
    // SAFETY: valid C string.
    if unsafe { libc::shm_unlink(c.as_ptr()) } != 0 {
        return Err(Error::last_os(format!("store {name}")));
    }
    Ok(())
}

pub(crate) fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// The clock file times come from on the data path: the kernel's coarse clock (a tick's
/// resolution, as the kernel's own file times), a fifth of the precise clock's cost here.
pub(crate) fn coarse_now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// This process's pid, from the thread's cached lock holder value (a fork child's handler
/// clears that cache): getpid is a system call, and a create made four.
pub(crate) fn my_pid() -> u32 {
    (crate::lock::me() >> 32) as u32
}

/// Start time (clock ticks after boot) of a running, non-zombie process, or None.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // starttime is field 22 of the whole line, i.e. the 20th after the state field.
    fields.nth(18)?.parse().ok()
}

/// This process's start time, read once per process (a fork child reads its own).
pub(crate) fn my_start_time() -> u64 {
    static CACHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let pid = my_pid();
    let cached = CACHED.load(Ordering::Relaxed);
    if cached >> 40 == u64::from(pid) && cached != 0 {
        return cached & ((1 << 40) - 1);
    }
    let start = process_start_time(pid).unwrap_or(0);
    if start < 1 << 40 {
        CACHED.store(u64::from(pid) << 40 | start, Ordering::Relaxed);
    }
    start
}

pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    pid != 0 && process_start_time(pid) == Some(start_time)
}

fn fallocate(file: &OsFile, offset: u64, len: u64, what: &str) -> Result<()> {
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset as i64, len as i64) };
    if rc != 0 {
        let e = Error::last_os(what);
        if e.errno() == libc::ENOSPC {
            return Err(Error::new(
                libc::ENOSPC,
                format!("{what}: not enough space to reserve {}", human(len)),
            ));
        }
        return Err(e);
    }
    Ok(())
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn free_space(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer and `c` a valid C string.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

impl Block {
    fn new(name: &str, shm: OsFile, map: MmapRaw, geo: Geometry, spill: Option<Spill>) -> Block {
        let ids = (
            file_id(shm.as_raw_fd()).unwrap_or((0, 0)),
            spill.as_ref().and_then(|s| file_id(s.file.as_raw_fd())),
        );
        let base = map.as_mut_ptr();
        advise_huge_pages(base, &geo);
        let populated = Arc::new(Populated::new(base, &geo));
        Block {
            name: name.to_string(),
            shm,
            base,
            map,
            geo,
            spill,
            spill_dirty: AtomicBool::new(false),
            lease: Mutex::new(LeaseLocal { slot: 0, pid: 0 }),
            prefault_threads: Mutex::new(Vec::new()),
            stop_populate: Arc::new(AtomicBool::new(false)),
            populate_started: AtomicBool::new(false),
            populated,
            last_reclaim: Mutex::new(None),
            next_ofd_slot: AtomicU64::new(0),
            ids,
            reopened: Mutex::new(None),
        }
    }

    /// The descriptors to map this block's chunks through (shared memory, spill file),
    /// valid in the calling process. The block's own can name other files here: a block
    /// attached inside a vfork child (Python starts subprocesses with vfork, which shares
    /// the parent's memory but not its descriptor table) leaves the parent with the child's
    /// descriptor numbers. Checked by device and inode; opened again, with the same
    /// ownership checks, when they do not match.
    pub(crate) fn map_fds(&self) -> Result<(i32, Option<i32>)> {
        let spill_fd = self.spill.as_ref().map(|s| s.file.as_raw_fd());
        if file_id(self.shm.as_raw_fd()) == Some(self.ids.0)
            && spill_fd.map(file_id) == self.ids.1.map(Some)
        {
            return Ok((self.shm.as_raw_fd(), spill_fd));
        }
        let pid = std::process::id();
        let mut reopened = self
            .reopened
            .lock()
            .map_err(|_| Error::new(libc::EIO, "store: a lock was poisoned"))?;
        if let Some((owner, shm, spill)) = reopened.as_ref() {
            if *owner == pid {
                return Ok((shm.as_raw_fd(), spill.as_ref().map(|f| f.as_raw_fd())));
            }
        }
        let shm = shm_open_existing(&self.name)?;
        let spill = match &self.spill {
            Some(s) => Some(open_spill(&format!("store {}", self.name), s.path.clone())?.file),
            None => None,
        };
        let same = file_id(shm.as_raw_fd()) == Some(self.ids.0)
            && spill.as_ref().map(|f| file_id(f.as_raw_fd())) == self.ids.1.map(Some);
        if !same {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "store {}: its shared-memory object or spill file was replaced since this \
                     process attached it",
                    self.name
                ),
            ));
        }
        let fds = (shm.as_raw_fd(), spill.as_ref().map(|f| f.as_raw_fd()));
        *reopened = Some((pid, shm, spill));
        Ok(fds)
    }

    pub(crate) fn create(cfg: &StoreConfig) -> Result<Block> {
        shm_name(&cfg.name)?;
        let cs = cfg.chunk_size;
        let spill_chunks = match &cfg.spill {
            Some(s) => s.size.checked_div(cs).unwrap_or(0),
            None => 0,
        };
        let mem_chunks = cfg.capacity.checked_div(cs).unwrap_or(0);
        let geo = Geometry::compute(cs, mem_chunks, spill_chunks, cfg.max_files as u64)?;
        if let Some(s) = &cfg.spill {
            if s.path.as_os_str().len() > SPILL_PATH_MAX {
                return Err(Error::new(
                    libc::ENAMETOOLONG,
                    format!("spill path {}", s.path.display()),
                ));
            }
            if spill_chunks == 0 && s.size > 0 {
                return Err(Error::new(
                    libc::EINVAL,
                    format!(
                        "spill size {} is smaller than one chunk ({cs} bytes)",
                        s.size
                    ),
                ));
            }
        }
        if let Some(free) = free_space(Path::new("/dev/shm")) {
            if free < geo.block_size {
                return Err(Error::new(
                    libc::ENOSPC,
                    format!(
                        "store {}: needs {} of shared memory but /dev/shm has {} free",
                        cfg.name,
                        human(geo.block_size),
                        human(free)
                    ),
                ));
            }
        }
        let file =
            shm_open(&cfg.name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR).map_err(|e| {
                if e.errno() == libc::EEXIST {
                    Error::new(
                        libc::EEXIST,
                        format!(
                            "store {} already exists (attach to it, or destroy it first)",
                            cfg.name
                        ),
                    )
                } else {
                    e
                }
            })?;
        // From here on a failure must not leave a half-made block behind.
        let result = ensure_lock_dir(&cfg.name).and_then(|()| Self::init_new(cfg, geo, file));
        if result.is_err() {
            let _ = shm_unlink(&cfg.name);
        }
        result
    }

    fn init_new(cfg: &StoreConfig, geo: Geometry, file: OsFile) -> Result<Block> {
        let ctx = format!("store {}", cfg.name);
        file.set_len(geo.block_size)
            .map_err(|e| Error::from_io(&e, ctx.clone()))?;
        // Reserve the metadata pages now: tmpfs would otherwise SIGBUS later if /dev/shm filled up.
        fallocate(&file, 0, geo.off.data, &ctx)?;
        let map = MmapOptions::new()
            .len(geo.block_size as usize)
            .map_raw(&file)
            .map_err(|e| Error::from_io(&e, ctx.clone()))?;
        let spill = match &cfg.spill {
            Some(s) if geo.spill_chunks > 0 => {
                Some(create_spill(s, geo.spill_chunks as u64 * geo.chunk_size)?)
            }
            _ => None,
        };
        let block = Block::new(&cfg.name, file, map, geo, spill);
        // Its prefault below maps the pages into this process as it allocates them (without a
        // prefault, each chunk is mapped by its first access, see `Populated`).
        block.populate_started.store(true, Ordering::Relaxed);
        if !matches!(cfg.prefault, Prefault::Off) {
            block.populated.mark_all();
        }
        block.format(cfg)?;
        block.claim_lease()?;
        match cfg.prefault {
            Prefault::Foreground => prefault_raw(block.base, &block.geo)?,
            Prefault::Background => {
                let raw = SendPtr(block.base);
                let geo = block.geo.clone();
                let handle = std::thread::Builder::new()
                    .name("cascade-prefault".into())
                    .spawn(move || {
                        let raw = raw;
                        let _ = prefault_raw(raw.0, &geo);
                    })
                    .map_err(|e| Error::from_io(&e, "spawn prefault thread"))?;
                block.lock_prefault_threads().push(handle);
            }
            Prefault::Off => {}
        }
        Ok(block)
    }

    /// Writes the header and initial tables. The block is all zeros (fresh tmpfs pages), so
    /// only non-zero fields are written; the magic goes last.
    fn format(&self, cfg: &StoreConfig) -> Result<()> {
        let geo = &self.geo;
        // SAFETY: the header lives at offset 0 of a mapping at least HEADER_SIZE long, and no
        // other process can attach before the magic is published at the end of this function.
        let h = unsafe { &mut *(self.base as *mut Header) };
        h.version = FORMAT_VERSION;
        h.header_size = HEADER_SIZE as u32;
        h.block_size = geo.block_size;
        h.chunk_size = geo.chunk_size;
        h.mem_chunks = geo.mem_chunks;
        h.spill_chunks = geo.spill_chunks;
        h.max_inodes = geo.max_inodes;
        h.map_nodes = geo.map_nodes;
        h.lease_slots = geo.lease_slots;
        h.lease_batch = geo.lease_batch;
        h.hash_slots = geo.hash_slots;
        // SAFETY: geteuid cannot fail.
        h.owner_uid = unsafe { libc::geteuid() };
        h.created_ns = now_ns();
        h.off = geo.off;
        if let Some(s) = cfg.spill.as_ref().filter(|_| geo.spill_chunks > 0) {
            let bytes = s.path.as_os_str().as_encoded_bytes();
            h.spill_path[..bytes.len()].copy_from_slice(bytes);
            h.spill_path_len = bytes.len() as u32;
        }
        h.ns_lock.init()?;
        h.alloc_lock.init()?;
        for ino in 0..geo.max_inodes {
            self.inode(ino).lock.init()?;
        }
        let root = self.inode(ROOT_INO);
        let now = now_ns();
        root.mode.store(0o755, Ordering::Relaxed);
        root.uid.store(h.owner_uid, Ordering::Relaxed);
        // SAFETY: getegid cannot fail.
        root.gid
            .store(unsafe { libc::getegid() }, Ordering::Relaxed);
        root.gen.store(1, Ordering::Relaxed);
        for t in [&root.atime, &root.mtime, &root.ctime] {
            t.store(now, Ordering::Relaxed);
        }
        root.state.store(INODE_DIR, Ordering::Relaxed);
        self.rebuild_free_stacks();
        self.rebuild_namespace_index();
        self.header()
            .magic
            .store(u64::from_ne_bytes(MAGIC), Ordering::Release);
        Ok(())
    }

    pub(crate) fn attach(name: &str) -> Result<Block> {
        let file = shm_open_existing(name).map_err(|e| {
            if e.errno() == libc::ENOENT {
                Error::new(
                    libc::ENOENT,
                    format!("store {name} does not exist (create it with `cascade init`)"),
                )
            } else {
                e
            }
        })?;
        let ctx = format!("store {name}");
        let len = file
            .metadata()
            .map_err(|e| Error::from_io(&e, ctx.clone()))?
            .len();
        if len < HEADER_SIZE as u64 {
            return Err(Error::new(
                libc::EINVAL,
                format!("{ctx} is not a Cascade store (only {len} bytes)"),
            ));
        }
        let (geo, spill_path) = read_geometry(name, &file, len)?;
        ensure_lock_dir(name)?;
        let map = MmapOptions::new()
            .len(geo.block_size as usize)
            .map_raw(&file)
            .map_err(|e| Error::from_io(&e, ctx.clone()))?;
        let spill = match spill_path {
            Some(path) => Some(open_spill(&ctx, path)?),
            None => None,
        };
        let block = Block::new(name, file, map, geo, spill);
        block.claim_lease()?;
        Ok(block)
    }

    /// Called before this process touches file data: the first call starts mapping the pages
    /// the creator already faulted in into this process too, in the background, so checkpoint
    /// writes do not take minor faults. Processes that only look at the namespace (`cascade
    /// wait`, `commit`, `status`, a preloaded `ls`) never start it: it costs about 0.3 s of
    /// CPU per GiB, which a `cascade wait` beside the agent took from the agent.
    #[inline(always)]
    pub(crate) fn will_touch_data(&self) {
        if !self.populate_started.load(Ordering::Relaxed)
            && !self.populate_started.swap(true, Ordering::AcqRel)
        {
            self.populate_in_background();
        }
    }

    #[cold]
    fn populate_in_background(&self) {
        if !crate::memory_owner::is_this_process() {
            // A vfork child: its exec would kill the thread (memory_owner says what that
            // breaks). The parent starts it when it touches data itself.
            self.populate_started.store(false, Ordering::Release);
            return;
        }
        let done = self.header().prefaulted.load(Ordering::Acquire);
        if done == 0 {
            return;
        }
        let done_chunks = (done / self.geo.chunk_size).min(self.geo.mem_chunks as u64) as u32;
        let populated = Arc::clone(&self.populated);
        let stop = Arc::clone(&self.stop_populate);
        let base = SendPtr(self.base);
        let geo = self.geo.clone();
        let slot = self.lock_lease().slot;
        let spawned = std::thread::Builder::new()
            .name("cascade-populate".into())
            .spawn(move || {
                let base = base;
                let batch = lease_slot_at(base.0, &geo, slot);
                let (free, free_top) = free_mem_stack_at(base.0, &geo);
                let (mut next, mut below) = (0, u32::MAX);
                while !stop.load(Ordering::Relaxed) {
                    let n = batch.count.load(Ordering::Acquire).min(geo.lease_batch) as usize;
                    let top = free_top.load(Ordering::Relaxed);
                    let ahead = next_to_populate(&batch.ids[..n], free, top, &mut below, |c| {
                        c < geo.mem_chunks && !populated.is_set(c)
                    });
                    match ahead {
                        Some(c) => {
                            populated.populate(c);
                        }
                        // Then the block in order: chunks in use, for reading.
                        None if next < done_chunks => {
                            populated.populate(next);
                            next += 1;
                        }
                        None => break,
                    }
                }
            });
        if let Ok(h) = spawned {
            self.lock_prefault_threads().push(h);
        }
    }

    pub(crate) fn wait_prefault(&self) {
        let threads: Vec<_> = self.lock_prefault_threads().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    fn lock_prefault_threads(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.prefault_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_lease(&self) -> MutexGuard<'_, LeaseLocal> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn destroy(name: &str, force: bool) -> Result<()> {
        // A block that is not ours is not destroyed: its header (the spill path removed
        // below) is whatever its owner wrote.
        let file = shm_open_existing(name).map_err(|e| {
            if e.errno() == libc::ENOENT {
                Error::new(libc::ENOENT, format!("store {name} does not exist"))
            } else {
                e
            }
        })?;
        let len = file
            .metadata()
            .map_err(|e| Error::from_io(&e, name.to_string()))?
            .len();
        // A block whose header cannot be read (even one too short to hold a header, left by a
        // creator killed before sizing it) is destroyed anyway: that is how users get rid of it.
        let geometry = if len < HEADER_SIZE as u64 {
            None
        } else {
            read_geometry(name, &file, len).ok()
        };
        if let Some((geo, spill)) = geometry {
            if !force {
                let map = MmapOptions::new()
                    .len(geo.block_size as usize)
                    .map_raw(&file)
                    .map_err(|e| Error::from_io(&e, name.to_string()))?;
                let pids = live_lease_pids(map.as_mut_ptr(), &geo);
                if !pids.is_empty() {
                    return Err(Error::new(
                        libc::EBUSY,
                        format!("store {name} is in use by process(es) {pids:?}; stop them or force the destroy"),
                    ));
                }
            }
            if let Some(p) = spill {
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Error::from_io(&e, format!("spill file {}", p.display())))
                    }
                }
            }
        }
        shm_unlink(name)?;
        let _ = std::fs::remove_dir_all(crate::Store::lock_dir(name));
        Ok(())
    }

    // ---- typed access to regions -------------------------------------------------------

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: offset 0 holds the header for the whole life of the mapping.
        unsafe { &*(self.base as *const Header) }
    }

    // The accessors below assert their index: a value read from the block is validated where
    // it is loaded (check_ino and the like, EIO "store block is damaged"), so these asserts
    // only guard this process's own arithmetic.

    /// `ino`, read from the block as what `what()` names, if it is inside the inode table.
    pub(crate) fn check_ino(&self, ino: u32, what: impl FnOnce() -> String) -> Result<u32> {
        if ino < self.geo.max_inodes {
            return Ok(ino);
        }
        Err(Error::damaged(format!(
            "{} names inode {ino}, past the {} inodes",
            what(),
            self.geo.max_inodes
        )))
    }

    #[inline]
    pub(crate) fn inode(&self, ino: u32) -> &Inode {
        match self.inode_checked(ino) {
            Some(inode) => inode,
            None => panic!("inode {ino} out of range"),
        }
    }

    /// [`Self::inode`] without a panic: None out of range.
    #[inline(always)]
    pub(crate) fn inode_checked(&self, ino: u32) -> Option<&Inode> {
        if ino >= self.geo.max_inodes {
            return None;
        }
        // SAFETY: bounds checked above; the inode table is inside the mapping.
        Some(unsafe {
            &*(self.base.add(self.geo.off.inodes as usize) as *const Inode).add(ino as usize)
        })
    }

    /// Raw pointer to one of an inode's two name slots (written only under the namespace lock).
    pub(crate) fn name_ptr(&self, ino: u32, slot: usize) -> *mut u8 {
        let inode = self.inode(ino) as *const Inode as *mut Inode;
        // SAFETY: `inode` points at a live Inode in the mapping; addr_of_mut creates no reference.
        unsafe { std::ptr::addr_of_mut!((*inode).names[slot]) as *mut u8 }
    }

    fn atomics<T>(&self, off: u64, len: u32) -> &[T] {
        // SAFETY: every region was sized for `len` elements of T at creation (or the geometry
        // check at attach), is 64-byte aligned and stays mapped while `self` lives.
        unsafe { std::slice::from_raw_parts(self.base.add(off as usize) as *const T, len as usize) }
    }

    #[inline(always)]
    pub(crate) fn chunk_states(&self) -> &[AtomicU64] {
        self.atomics(self.geo.off.chunk_states, self.geo.total_chunks())
    }
    pub(crate) fn node_states(&self) -> &[AtomicU64] {
        self.atomics(self.geo.off.node_states, self.geo.map_nodes)
    }
    pub(crate) fn node(&self, n: u32) -> &MapNode {
        assert!(n < self.geo.map_nodes, "map node {n} out of range");
        // SAFETY: bounds checked above.
        unsafe { &*(self.base.add(self.geo.off.nodes as usize) as *const MapNode).add(n as usize) }
    }
    pub(crate) fn free_mem_stack(&self) -> &[AtomicU32] {
        self.atomics(self.geo.off.free_mem, self.geo.mem_chunks)
    }
    pub(crate) fn free_spill_stack(&self) -> &[AtomicU32] {
        self.atomics(self.geo.off.free_spill, self.geo.spill_chunks)
    }
    pub(crate) fn free_node_stack(&self) -> &[AtomicU32] {
        self.atomics(self.geo.off.free_nodes, self.geo.map_nodes)
    }
    pub(crate) fn free_inode_stack(&self) -> &[AtomicU32] {
        self.atomics(self.geo.off.free_inodes, self.geo.max_inodes)
    }
    pub(crate) fn hash_slots(&self) -> &[AtomicU32] {
        self.atomics(self.geo.off.hash, self.geo.hash_slots)
    }
    pub(crate) fn lease_slot(&self, slot: u32) -> &LeaseSlot {
        lease_slot_at(self.base, &self.geo, slot)
    }
    #[inline(always)]
    pub(crate) fn ofd(&self, slot: u32) -> &OfdSlot {
        assert!(slot < OFD_SLOTS, "description slot {slot} out of range");
        // SAFETY: bounds checked; the region holds OFD_SLOTS slots.
        unsafe {
            &*(self.base.add(self.geo.off.ofds as usize) as *const OfdSlot).add(slot as usize)
        }
    }
    #[inline(always)]
    pub(crate) fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the data region starts inside the mapping.
        unsafe { self.base.add(self.geo.off.data as usize) }
    }
    /// Address of a memory chunk in this process, to write: the chunk is mapped whole first.
    #[inline(always)]
    pub(crate) fn chunk_ptr(&self, c: u32) -> *mut u8 {
        let p = self.chunk_ptr_to_read(c);
        self.populated.populate(c);
        p
    }

    /// Address of a memory chunk in this process, to read: not populated (read faults map 16
    /// pages at a time, fault-around, like the populate; a freshly started restart read
    /// 1 GiB at 4.9 GB/s through `MADV_POPULATE_WRITE`, at 10 GB/s without).
    #[inline(always)]
    pub(crate) fn chunk_ptr_to_read(&self, c: u32) -> *mut u8 {
        assert!(c < self.geo.mem_chunks, "chunk {c} is not a memory chunk");
        self.will_touch_data();
        // SAFETY: bounds checked above; the data region holds mem_chunks chunks.
        unsafe {
            self.data_ptr()
                .add(c as usize * self.geo.chunk_size as usize)
        }
    }
    /// Address of memory chunk `c` if it is one and this process has mapped it already
    /// (its populate thread started, the chunk populated): what a write may use without a
    /// call, a wait or a panic (`File::write_hinted`). None otherwise: [`Self::chunk_ptr`]
    /// maps it.
    #[inline(always)]
    pub(crate) fn mapped_memory_chunk(&self, c: u32) -> Option<*mut u8> {
        self.memory_chunk_to_read(c)
            .filter(|_| self.populated.is_set(c))
    }
    /// Address of memory chunk `c`, to read, if it is one and this process's populate
    /// thread started (reads fault pages in as they go: [`Self::chunk_ptr_to_read`]); no
    /// call and no panic. None otherwise.
    #[inline(always)]
    pub(crate) fn memory_chunk_to_read(&self, c: u32) -> Option<*mut u8> {
        if c >= self.geo.mem_chunks || !self.populate_started.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: c is a memory chunk (checked above); the data region holds mem_chunks of
        // them.
        Some(unsafe {
            self.data_ptr()
                .add(c as usize * self.geo.chunk_size as usize)
        })
    }
    pub(crate) fn is_spill(&self, c: u32) -> bool {
        c >= self.geo.mem_chunks
    }
    pub(crate) fn spill_offset(&self, c: u32) -> u64 {
        (c - self.geo.mem_chunks) as u64 * self.geo.chunk_size
    }
    pub(crate) fn mapping_len(&self) -> usize {
        self.map.len()
    }
}

fn lease_slot_at(base: *mut u8, geo: &Geometry, slot: u32) -> &LeaseSlot {
    assert!(slot < geo.lease_slots, "lease slot {slot} out of range");
    // SAFETY: bounds checked; the lease region holds lease_slots slots.
    unsafe { &*(base.add(geo.off.leases as usize) as *const LeaseSlot).add(slot as usize) }
}

/// The chunk a process's populate thread maps next, ahead of its writers: first the chunks of
/// its lease batch, from the far end (a writer takes them from the near end and maps each one
/// itself on its first access); then the free chunks its next batches will take, from the
/// top of the free stack down (`top` entries; read without the allocation lock, so a guess,
/// and a wrong one costs only its mapping). None once every one of them is mapped.
/// `below`: the stack entries under it are not looked at yet (start with `u32::MAX`); it
/// moves down as they are, so the whole stack is walked once, not once per chunk. Entries
/// pushed above it later (chunks freed meanwhile) are not looked at.
/// Following the free stack rather than the block's order matters once files have come and
/// gone: the stack then holds freed chunks in no order, and a fresh process writing 1 GiB
/// mapped 370-430 of its 1024 chunks itself (0.62-0.68x the mapped-in rate) where it maps
/// 60-150 now (0.78-0.86x, bench/results/node-store.md, table 1b).
pub(crate) fn next_to_populate(
    batch: &[AtomicU32],
    free: &[AtomicU32],
    top: u32,
    below: &mut u32,
    unmapped: impl Fn(u32) -> bool,
) -> Option<u32> {
    let in_batch = batch
        .iter()
        .map(|id| id.load(Ordering::Relaxed))
        .find(|&c| unmapped(c));
    if in_batch.is_some() {
        return in_batch;
    }
    let start = top.min(*below).min(free.len() as u32);
    for i in (0..start).rev() {
        *below = i;
        let c = free[i as usize].load(Ordering::Relaxed);
        if unmapped(c) {
            return Some(c);
        }
    }
    *below = 0;
    None
}

/// The free memory chunk stack and its top (the number of entries in use).
fn free_mem_stack_at(base: *mut u8, geo: &Geometry) -> (&[AtomicU32], &AtomicU32) {
    // SAFETY: the free memory stack region holds `mem_chunks` entries at its offset, 64-byte
    // aligned, and the header is at offset 0; both stay mapped while the block lives, and the
    // populate thread that reads them is joined before the block unmaps.
    unsafe {
        (
            std::slice::from_raw_parts(
                base.add(geo.off.free_mem as usize) as *const AtomicU32,
                geo.mem_chunks as usize,
            ),
            &(*(base as *const Header)).free_mem_top,
        )
    }
}

fn live_lease_pids(base: *mut u8, geo: &Geometry) -> Vec<u32> {
    let mut pids = Vec::new();
    for s in 0..geo.lease_slots {
        let slot = lease_slot_at(base, geo, s);
        let pid = slot.pid.load(Ordering::Acquire);
        if pid != 0 && process_alive(pid, slot.start_time.load(Ordering::Acquire)) {
            pids.push(pid);
        }
    }
    pids
}

struct SendPtr(*mut u8);
// SAFETY: the pointer targets a shared mapping that outlives the threads using it (they are
// joined or the process exits), and those threads only populate page tables.
unsafe impl Send for SendPtr {}

/// Asks for huge pages for the data region where /dev/shm offers them on request (mounted
/// with `huge=advise`, or `shmem_enabled` set to `advise` or `force`): a 2 MiB page is mapped
/// with one page-table entry instead of 512, so a process's first writes run at memory speed
/// instead of paying the 4 KiB page tables (docs/store-layout.md, "Memory and faults").
/// Elsewhere the advice changes nothing.
fn advise_huge_pages(base: *mut u8, geo: &Geometry) {
    // SAFETY: the data region lies inside the mapping; the advice only sets how its pages
    // are allocated and mapped, never their contents. Its failure is harmless.
    unsafe {
        libc::madvise(
            base.add(geo.off.data as usize) as *mut libc::c_void,
            (geo.mem_chunks as u64 * geo.chunk_size) as usize,
            libc::MADV_HUGEPAGE,
        );
    }
}

/// Which memory chunks this process has mapped (its page tables populated), a bit each. A
/// chunk is mapped whole by its first access through [`Block::chunk_ptr`] or by the populate
/// thread, whichever comes first: one MADV_POPULATE_READ per chunk instead of a page fault
/// per page (docs/store-layout.md, "Memory and faults").
pub(crate) struct Populated {
    bits: Box<[AtomicU64]>,
    data: *mut u8,
    chunk_size: usize,
}

// SAFETY: `data` points into a shared mapping that outlives every user (the block joins its
// populate thread before unmapping); through it this type only populates page tables.
unsafe impl Send for Populated {}
// SAFETY: as above; the bits are atomics.
unsafe impl Sync for Populated {}

impl Populated {
    fn new(base: *mut u8, geo: &Geometry) -> Populated {
        Populated {
            bits: (0..(geo.mem_chunks as usize).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            // SAFETY: the data region starts inside the mapping.
            data: unsafe { base.add(geo.off.data as usize) },
            chunk_size: geo.chunk_size as usize,
        }
    }

    fn mark_all(&self) {
        for word in self.bits.iter() {
            word.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// False for a chunk beyond the bits (no panic: `Block::mapped_memory_chunk`).
    #[inline(always)]
    fn is_set(&self, c: u32) -> bool {
        self.bits
            .get(c as usize / 64)
            .is_some_and(|bits| bits.load(Ordering::Relaxed) & (1 << (c % 64)) != 0)
    }

    /// Maps memory chunk `c` into this process unless that was done (or is being done by
    /// another thread). The caller checked that `c` is a memory chunk.
    #[inline(always)]
    fn populate(&self, c: u32) {
        if !self.is_set(c) {
            self.populate_first(c);
        }
    }

    #[cold]
    fn populate_first(&self, c: u32) {
        let bit = 1u64 << (c % 64);
        if self.bits[c as usize / 64].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return;
        }
        // Populating to read maps the chunk writable all the same (a shared shmem mapping
        // tracks no dirtying, so its page-table entries carry write permission), and maps 16
        // pages per fault (fault-around) where populating to write maps one: 0.08 s per GiB
        // here against 0.20 s, and the writes that follow take no fault either way.
        // SAFETY: chunk `c` lies in the data region of this process's mapping; populating
        // leaves the contents unchanged. A failure (no memory for a page) leaves the page to
        // fault as it would have.
        unsafe {
            libc::madvise(
                self.data.add(c as usize * self.chunk_size) as *mut libc::c_void,
                self.chunk_size,
                libc::MADV_POPULATE_READ,
            );
        }
    }
}

/// Opens the spill file an attached block names: not through a symlink, and only a regular
/// file private to this process's effective uid.
fn open_spill(ctx: &str, path: PathBuf) -> Result<Spill> {
    let what = format!("{ctx}: spill file");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::new(
                    libc::ELOOP,
                    format!("{what} {} is a symlink; Cascade uses only objects private to you, and this one may have been planted: remove it (as its owner or root)", path.display()),
                )
            } else {
                Error::from_io(&e, format!("{what} {}", path.display()))
            }
        })?;
    let st = ownership::fstat(file.as_raw_fd(), &what)?;
    ownership::check_stat(&what, &path, &st, ownership::Kind::File)?;
    Ok(Spill { file, path })
}

/// Creates the spill file exclusively (O_EXCL, O_NOFOLLOW, mode 0600). A regular file of this
/// user's left at the path (a store lost in a reboot leaves its spill file) is replaced;
/// anything else there (a symlink, someone else's file) is refused.
fn create_spill_file(cfg: &SpillConfig) -> Result<OsFile> {
    let ctx = format!("spill file {}", cfg.path.display());
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&cfg.path)
    };
    match open() {
        Ok(f) => return Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::from_io(&e, ctx)),
    }
    if let Some(st) = ownership::lstat(&cfg.path)? {
        let me = ownership::euid();
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != me {
            return Err(
                ownership::check_stat("spill file", &cfg.path, &st, ownership::Kind::File)
                    .err()
                    .unwrap_or_else(|| Error::new(libc::EEXIST, ctx.clone())),
            );
        }
        std::fs::remove_file(&cfg.path).map_err(|e| Error::from_io(&e, ctx.clone()))?;
    }
    open().map_err(|e| Error::from_io(&e, ctx))
}

fn create_spill(cfg: &SpillConfig, bytes: u64) -> Result<Spill> {
    let ctx = format!("spill file {}", cfg.path.display());
    let file = create_spill_file(cfg)?;
    // SAFETY: plain syscall on an fd we own; posix_fallocate falls back to writing zeros on
    // file systems without fallocate.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as i64) };
    if rc != 0 {
        let _ = std::fs::remove_file(&cfg.path);
        return Err(Error::new(
            rc,
            format!("{ctx}: cannot reserve {}", human(bytes)),
        ));
    }
    Ok(Spill {
        file,
        path: cfg.path.clone(),
    })
}

/// Reads and validates the header of an existing block.
fn read_geometry(name: &str, file: &OsFile, len: u64) -> Result<(Geometry, Option<PathBuf>)> {
    let ctx = format!("store {name}");
    let map = MmapOptions::new()
        .len(HEADER_SIZE)
        .map_raw_read_only(file)
        .map_err(|e| Error::from_io(&e, ctx.clone()))?;
    // SAFETY: the mapping is HEADER_SIZE bytes and Header fits in it; fields other than the
    // magic are written once before the magic is published and never change afterwards.
    let h = unsafe { &*(map.as_ptr() as *const Header) };
    let mut magic = h.magic.load(Ordering::Acquire);
    // A creator may be formatting the block right now: give it a moment.
    for _ in 0..200 {
        if magic != 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        magic = h.magic.load(Ordering::Acquire);
    }
    if magic == 0 {
        return Err(Error::new(
            libc::EINVAL,
            format!("{ctx} was never fully initialised (its creator died?); destroy it and create it again"),
        ));
    }
    if magic != u64::from_ne_bytes(MAGIC) {
        return Err(Error::new(
            libc::EINVAL,
            format!("{ctx} is not a Cascade store (bad magic)"),
        ));
    }
    if h.version != FORMAT_VERSION {
        return Err(Error::new(
            libc::EINVAL,
            format!(
                "{ctx} has format version {}, this build of Cascade reads version {FORMAT_VERSION}; use a matching build or destroy the store (its data is lost)",
                h.version
            ),
        ));
    }
    let geo = Geometry::compute(
        h.chunk_size,
        h.mem_chunks as u64,
        h.spill_chunks as u64,
        h.max_inodes as u64,
    )
    .map_err(|e| {
        Error::new(
            libc::EINVAL,
            format!("{ctx} has a corrupt header: {}", e.context()),
        )
    })?;
    if h.header_size != HEADER_SIZE as u32
        || geo.off != h.off
        || geo.block_size != h.block_size
        || geo.map_nodes != h.map_nodes
        || geo.hash_slots != h.hash_slots
        || geo.lease_slots != h.lease_slots
        || geo.lease_batch != h.lease_batch
        || len != geo.block_size
    {
        return Err(Error::new(
            libc::EINVAL,
            format!("{ctx} has a layout this build does not understand (corrupt header or incompatible build)"),
        ));
    }
    let spill_len = (h.spill_path_len as usize).min(SPILL_PATH_MAX);
    let spill = if geo.spill_chunks > 0 {
        let bytes = h.spill_path[..spill_len].to_vec();
        // SAFETY: the bytes were written from an OsStr by the creator (Unix: any bytes).
        Some(PathBuf::from(unsafe {
            std::ffi::OsString::from_encoded_bytes_unchecked(bytes)
        }))
    } else {
        None
    };
    Ok((geo, spill))
}

/// Faults the data region's pages in (allocating them in /dev/shm and mapping them in this
/// process) with MADV_POPULATE_WRITE, step by step, publishing progress in the header. One
/// populate pass measured faster here than fallocate followed by a populate, and unlike a
/// plain touch it reports a full /dev/shm as an error instead of SIGBUS.
fn prefault_raw(base: *mut u8, geo: &Geometry) -> Result<()> {
    // SAFETY: offset 0 holds the header.
    let h = unsafe { &*(base as *const Header) };
    let total = geo.mem_chunks as u64 * geo.chunk_size;
    let mut at = 0;
    while at < total {
        let n = PREFAULT_STEP.min(total - at);
        // SAFETY: the range is inside the mapping; populating leaves contents unchanged.
        let rc = unsafe {
            libc::madvise(
                base.add((geo.off.data + at) as usize) as *mut libc::c_void,
                n as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(Error::last_os(format!(
                "prefault of the data region failed after {} (is /dev/shm full?)",
                human(at)
            )));
        }
        at += n;
        h.prefaulted.store(at, Ordering::Release);
    }
    Ok(())
}
