//! The file-system requests, answered from the node store.
//!
//! Inodes: FUSE inode `n` is store inode `n - 1` (FUSE's root is 1, the store's 0); an inode
//! is addressed in the store by an anchored path (`Store::inode_path`), so no path walk and
//! no table of names is kept here, and renames by other processes need no bookkeeping.
//! Entries and attributes are never cached by the kernel (TTL 0): a change made through the
//! preload library is seen by the next call through the mount.
//!
//! Open files: each open is a store file plus a shared open-file description with a memfd
//! named after it, exactly like an open by the preload library, so the store counts the
//! writer, and a killed daemon's opens are swept like those of a killed program.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cascade_store::{File, FileKind, Metadata, OpenDescription, OpenOptions, Store, TimeNs};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::{MountOptions, MAX_IO};

/// Nothing is cached by the kernel: the store is shared with preloaded programs.
const TTL: Duration = Duration::ZERO;

/// One open file.
struct Handle {
    file: File,
    desc: OpenDescription,
    /// Keeps the description referenced for the store's sweeper (see the module comment).
    _memfd: OwnedFd,
    append: bool,
}

pub struct CascadeFs {
    store: Store,
    kernel_cache: bool,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
}

type Result<T> = std::result::Result<T, Errno>;

fn errno(e: cascade_store::Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// Answers a request whose reply carries nothing but success or an errno.
fn answer(reply: ReplyEmpty, result: Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn name_str(name: &OsStr) -> Result<&str> {
    let name = name.to_str().ok_or(Errno::EINVAL)?;
    if name.is_empty() || name.contains('/') || name.contains('\0') {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

fn system_time(ns: TimeNs) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: TimeOrNow) -> TimeNs {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as TimeNs,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as TimeNs),
    }
}

fn attr(m: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(m.ino + 1),
        size: m.size,
        blocks: m.allocated_bytes().div_ceil(512),
        atime: system_time(m.atime),
        mtime: system_time(m.mtime),
        ctime: system_time(m.ctime),
        crtime: system_time(m.ctime),
        kind: match m.kind {
            FileKind::File => FileType::RegularFile,
            FileKind::Dir => FileType::Directory,
        },
        perm: (m.mode & 0o7777) as u16,
        nlink: m.links,
        uid: m.uid,
        gid: m.gid,
        rdev: 0,
        // stdio and cp size their buffers by this: one full FUSE request.
        blksize: MAX_IO,
        flags: 0,
    }
}

impl CascadeFs {
    pub fn new(store: Store, opts: &MountOptions) -> CascadeFs {
        CascadeFs {
            store,
            kernel_cache: opts.kernel_cache,
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
    }

    /// The store path naming FUSE inode `ino` ("/" for the root), and its generation.
    fn inode(&self, ino: INodeNo) -> Result<(String, Metadata, u32)> {
        let store_ino = ino.0.checked_sub(1).ok_or(Errno::ENOENT)?;
        let (meta, gen) = self.store.stat_inode(store_ino).map_err(errno)?;
        let path = if store_ino == 0 {
            "/".to_string()
        } else {
            Store::inode_path(store_ino, gen, "")
        };
        Ok((path, meta, gen))
    }

    /// The store path of `name` in directory `parent`.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String> {
        let name = name_str(name)?;
        let store_ino = parent.0.checked_sub(1).ok_or(Errno::ENOENT)?;
        if store_ino == 0 {
            return Ok(format!("/{name}"));
        }
        let (_, gen) = self.store.stat_inode(store_ino).map_err(errno)?;
        Ok(Store::inode_path(store_ino, gen, name))
    }

    /// Attributes and generation of the file at `path`.
    fn entry_of(&self, path: &str) -> Result<(FileAttr, Generation)> {
        let meta = self.store.stat(path).map_err(errno)?;
        let (meta, gen) = self.store.stat_inode(meta.ino).map_err(errno)?;
        Ok((attr(&meta), Generation(gen as u64)))
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>> {
        let handles = self.handles.lock().map_err(|_| Errno::EIO)?;
        handles.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Opens `path` as the preload library would, and registers the handle.
    fn open_path(&self, path: &str, flags: i32, mode: u32) -> Result<(FileHandle, Metadata)> {
        let acc = flags & libc::O_ACCMODE;
        let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let opts = OpenOptions {
            read: acc != libc::O_WRONLY,
            write: writes,
            create: flags & libc::O_CREAT != 0,
            create_new: flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0 && writes,
            append: flags & libc::O_APPEND != 0 && writes,
            directory: false,
            mode: mode & 0o7777,
            described: true,
        };
        let file = self.store.open(path, &opts).map_err(errno)?;
        if file.is_dir() {
            return Err(Errno::EISDIR);
        }
        let desc = self
            .store
            .describe_open(&file, flags & (libc::O_ACCMODE | libc::O_APPEND))
            .map_err(errno)?;
        let name = desc.memfd_name();
        // SAFETY: `name` is a valid C string; the returned fd is checked before use.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            self.store.release_description(desc);
            return Err(Errno::from(e));
        }
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let meta = file.metadata().map_err(errno)?;
        let handle = Arc::new(Handle {
            file,
            desc,
            _memfd: memfd,
            append: opts.append,
        });
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .map_err(|_| Errno::EIO)?
            .insert(fh, handle);
        Ok((FileHandle(fh), meta))
    }

    fn open_flags(&self) -> FopenFlags {
        if self.kernel_cache {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn set_attributes(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr> {
        let (path, _, _) = self.inode(ino)?;
        if let Some(size) = size {
            match fh.map(|fh| self.handle(fh)).transpose()? {
                Some(h) => h.file.set_len(size),
                None => self.store.truncate(&path, size),
            }
            .map_err(errno)?;
        }
        if let Some(mode) = mode {
            self.store.set_mode(&path, mode & 0o7777).map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            self.store.set_owner(&path, uid, gid).map_err(errno)?;
        }
        if atime.is_some() || mtime.is_some() {
            self.store
                .set_times(&path, atime.map(time_ns), mtime.map(time_ns))
                .map_err(errno)?;
        }
        let (_, meta, _) = self.inode(ino)?;
        Ok(attr(&meta))
    }
}

impl Filesystem for CascadeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Best effort: an older kernel simply keeps its smaller limits.
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let mut wanted = InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_READ;
        if !self.kernel_cache {
            // Shared mmap of direct-I/O files goes through the page cache (Linux 6.6+).
            wanted |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.entry_of(&p)) {
            Ok((attr, gen)) => reply.entry(&TTL, &attr, gen),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // Through an open handle, a file removed while open still answers.
        let meta = match fh.map(|fh| self.handle(fh)) {
            Some(Ok(h)) => h.file.metadata().map_err(errno),
            _ => self.inode(ino).map(|(_, m, _)| m),
        };
        match meta {
            Ok(m) => reply.attr(&TTL, &attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.set_attributes(ino, mode, uid, gid, size, atime, mtime, fh) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.child(parent, name).and_then(|path| {
            self.store
                .mkdir(&path, mode & !umask & 0o7777)
                .map_err(errno)?;
            self.entry_of(&path)
        });
        match made {
            Ok((attr, gen)) => reply.entry(&TTL, &attr, gen),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.child(parent, name);
        answer(
            reply,
            removed.and_then(|p| self.store.unlink(&p).map_err(errno)),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.child(parent, name);
        answer(
            reply,
            removed.and_then(|p| self.store.rmdir(&p).map_err(errno)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let renamed = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            if flags.contains(RenameFlags::RENAME_EXCHANGE)
                || flags.contains(RenameFlags::RENAME_WHITEOUT)
            {
                return Err(Errno::EINVAL);
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) && self.store.stat(&to).is_ok() {
                return Err(Errno::EEXIST);
            }
            self.store.rename(&from, &to).map_err(errno)
        })();
        answer(reply, renamed);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self
            .inode(ino)
            .and_then(|(path, _, _)| self.open_path(&path, flags.0, 0));
        match opened {
            Ok((fh, _)) => reply.opened(fh, self.open_flags()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let created = self
            .child(parent, name)
            .and_then(|path| self.open_path(&path, flags | libc::O_CREAT, mode & !umask));
        match created {
            Ok((fh, meta)) => match self.store.stat_inode(meta.ino) {
                Ok((_, gen)) => reply.created(
                    &TTL,
                    &attr(&meta),
                    Generation(gen as u64),
                    fh,
                    self.open_flags(),
                ),
                Err(e) => reply.error(errno(e)),
            },
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let handle = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        BUF.with_borrow_mut(|buf| {
            let want = (size.min(MAX_IO)) as usize;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let mut done = 0;
            // A short read only at the end of the file.
            while done < want {
                match handle
                    .file
                    .read_at(&mut buf[done..want], offset + done as u64)
                {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) => return reply.error(errno(e)),
                }
            }
            reply.data(&buf[..done]);
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.handle(fh).and_then(|h| {
            // Straight from the request buffer into the store's chunks.
            if h.append {
                h.file.append(data).map(|_| ())
            } else {
                h.file.write_all_at(data, offset)
            }
            .map_err(errno)
        });
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = match self.handles.lock() {
            Ok(mut handles) => handles.remove(&fh.0),
            Err(_) => return reply.error(Errno::EIO),
        };
        if let Some(h) = handle {
            // The close the agent waits for: the file may now be uploaded.
            self.store.release_description(h.desc);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Memory chunks live as long as the node; spilled ones are synced to the SSD.
        answer(
            reply,
            self.handle(fh).and_then(|h| h.file.sync().map_err(errno)),
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self
            .inode(ino)
            .and_then(|(path, _, _)| self.store.read_dir(&path).map_err(errno));
        let mut entries = match listed {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        // The offset of an entry is its store inode + 3 (1 and 2 are the dots), in inode
        // order: a listing resumed after entries were removed or added (a program unlinking
        // what it reads, batch by batch) skips nothing and repeats nothing. An index would
        // shift under such changes and skip as many entries as were removed.
        entries.sort_unstable_by_key(|e| e.ino);
        let dots = [
            (ino, 1, FileType::Directory, "."),
            (ino, 2, FileType::Directory, ".."),
        ];
        let all = dots.into_iter().chain(entries.iter().map(|e| {
            let kind = match e.kind {
                FileKind::File => FileType::RegularFile,
                FileKind::Dir => FileType::Directory,
            };
            (INodeNo(e.ino + 1), e.ino + 3, kind, e.name.as_str())
        }));
        for (ino, next, kind, name) in all.filter(|&(_, next, _, _)| next > offset) {
            if reply.add(ino, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const BLOCK: u64 = 4096;
        let s = self.store.status();
        let total = s.memory_capacity + s.spill_capacity;
        let used = (s.memory_used + s.spill_used).min(total);
        let files = s.files + s.dirs;
        reply.statfs(
            total / BLOCK,
            (total - used) / BLOCK,
            (total - used) / BLOCK,
            s.max_files,
            s.max_files.saturating_sub(files),
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions); only existence here.
        match self.inode(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
