//! fts over the wrappers, for walks that start under the mount (glibc's fts uses internal
//! calls no preload sees). The structures are glibc's (fts.h) so that programs read them as
//! usual; the walk follows glibc's order and `fts_info` values, always as with
//! `FTS_NOCHDIR` (`fts_accpath` is the whole path; the working directory never changes).
//! Every entry of a walk stays allocated until `fts_close` (glibc frees a directory's
//! entries when it leaves it), so memory grows with the number of entries visited.

use super::*;
use libc::{c_int, c_long, c_void};
use std::collections::HashSet;
use std::ffi::c_char;

/// glibc's FTS.
#[repr(C)]
pub struct Fts {
    fts_cur: *mut FtsEnt,
    fts_child: *mut FtsEnt,
    fts_array: *mut *mut FtsEnt,
    fts_dev: u64,
    fts_path: *mut c_char,
    fts_rfd: c_int,
    fts_pathlen: c_int,
    fts_nitems: c_int,
    fts_compar: Option<Compar>,
    fts_options: c_int,
}

/// glibc's FTSENT (the name is allocated past the end of the struct).
#[repr(C)]
pub struct FtsEnt {
    fts_cycle: *mut FtsEnt,
    fts_parent: *mut FtsEnt,
    fts_link: *mut FtsEnt,
    fts_number: c_long,
    fts_pointer: *mut c_void,
    fts_accpath: *mut c_char,
    fts_path: *mut c_char,
    fts_errno: c_int,
    fts_symfd: c_int,
    fts_pathlen: u16,
    fts_namelen: u16,
    fts_ino: u64,
    fts_dev: u64,
    fts_nlink: u64,
    fts_level: i16,
    fts_info: u16,
    fts_flags: u16,
    fts_instr: u16,
    fts_statp: *mut libc::stat64,
    fts_name: [c_char; 1],
}

type Compar = unsafe extern "C" fn(*const *const FtsEnt, *const *const FtsEnt) -> c_int;

const FTS_COMFOLLOW: c_int = 0x1;
const FTS_LOGICAL: c_int = 0x2;
const FTS_NOSTAT: c_int = 0x8;
const FTS_SEEDOT: c_int = 0x20;
const FTS_XDEV: c_int = 0x40;
const FTS_NAMEONLY: c_int = 0x100;

const FTS_D: u16 = 1;
const FTS_DNR: u16 = 4;
const FTS_DOT: u16 = 5;
const FTS_DP: u16 = 6;
const FTS_F: u16 = 8;
const FTS_NS: u16 = 10;
const FTS_NSOK: u16 = 11;

const FTS_AGAIN: u16 = 1;
const FTS_SKIP: u16 = 4;

/// A directory being walked: its entry and its children, the next one to return.
struct Frame {
    dir: *mut FtsEnt,
    children: Vec<*mut FtsEnt>,
    next: usize,
}

/// One walk. `fts` comes first, so a pointer to the walk is a pointer to its FTS.
#[repr(C)]
struct Walk {
    fts: Fts,
    options: c_int,
    compar: Option<Compar>,
    root_parent: *mut FtsEnt,
    frames: Vec<Frame>,
    /// Children read ahead by fts_children for the current directory.
    read_ahead: Option<Vec<*mut FtsEnt>>,
    /// Every allocation of the walk, freed by fts_close.
    allocations: Vec<*mut c_void>,
    started: bool,
}

static WALKS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn walks() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    WALKS.lock().unwrap_or_else(|e| e.into_inner())
}

fn ours(ftsp: *mut Fts) -> Option<&'static mut Walk> {
    let known = walks()
        .as_ref()
        .is_some_and(|w| w.contains(&(ftsp as usize)));
    // SAFETY: the address is a walk we leaked in fts_open and have not freed.
    known.then(|| unsafe { &mut *(ftsp as *mut Walk) })
}

impl Walk {
    fn alloc(&mut self, size: usize) -> *mut c_void {
        // SAFETY: zeroed allocation, recorded for fts_close.
        let p = unsafe { libc::calloc(1, size.max(1)) };
        if !p.is_null() {
            self.allocations.push(p);
        }
        p
    }

    /// A new entry `name` below `parent` (null for a root: `name` is the whole path).
    fn entry(&mut self, parent: *mut FtsEnt, name: &[u8], level: i16) -> *mut FtsEnt {
        let ent = self.alloc(std::mem::size_of::<FtsEnt>() + name.len()) as *mut FtsEnt;
        if ent.is_null() {
            return ent;
        }
        let mut path = Vec::new();
        if level > 0 {
            // SAFETY: a parent's path is a C string we made.
            path.extend_from_slice(unsafe { CStr::from_ptr((*parent).fts_path) }.to_bytes());
            if !path.ends_with(b"/") {
                path.push(b'/');
            }
        }
        path.extend_from_slice(name);
        // A root's name is its last component (the whole path is its fts_path), as glibc's.
        let name = if level == 0 {
            let trimmed = match name.iter().rposition(|b| *b != b'/') {
                Some(end) => &name[..=end],
                None => name,
            };
            match trimmed.iter().rposition(|b| *b == b'/') {
                Some(slash) if slash + 1 < trimmed.len() => &trimmed[slash + 1..],
                _ => trimmed,
            }
        } else {
            name
        };
        let cpath = self.alloc(path.len() + 1) as *mut u8;
        let statp = self.alloc(std::mem::size_of::<libc::stat64>()) as *mut libc::stat64;
        if cpath.is_null() || statp.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: the allocations are big enough for what is copied (zeroed: NUL-terminated).
        unsafe {
            std::ptr::copy_nonoverlapping(path.as_ptr(), cpath, path.len());
            let name_dst = std::ptr::addr_of_mut!((*ent).fts_name) as *mut u8;
            std::ptr::copy_nonoverlapping(name.as_ptr(), name_dst, name.len());
            (*ent).fts_parent = parent;
            (*ent).fts_path = cpath as *mut c_char;
            (*ent).fts_accpath = cpath as *mut c_char;
            (*ent).fts_pathlen = path.len().min(u16::MAX as usize) as u16;
            (*ent).fts_namelen = name.len().min(u16::MAX as usize) as u16;
            (*ent).fts_level = level;
            (*ent).fts_statp = statp;
        }
        ent
    }

    /// Stats `ent` and sets its info: `d_type` stands in for stat with FTS_NOSTAT.
    fn fill(&mut self, ent: *mut FtsEnt, root: bool, d_type: Option<u8>) {
        // SAFETY: `ent` is one of ours, fully allocated.
        let e = unsafe { &mut *ent };
        // SAFETY: the name is a C string we wrote.
        let name = unsafe { CStr::from_ptr(e.fts_name.as_ptr()) }.to_bytes();
        if !root && matches!(name, b"." | b"..") {
            e.fts_info = FTS_DOT;
            return;
        }
        if self.options & FTS_NOSTAT != 0 && d_type.is_some_and(|t| t != libc::DT_DIR) {
            e.fts_info = FTS_NSOK;
            return;
        }
        let follow = self.options & FTS_LOGICAL != 0 || (root && self.options & FTS_COMFOLLOW != 0);
        // SAFETY: the path is a C string we made; statp a stat64 we allocated.
        let r = unsafe {
            if follow {
                stat::stat64(e.fts_path, e.fts_statp)
            } else {
                stat::lstat64(e.fts_path, e.fts_statp)
            }
        };
        if r != 0 {
            e.fts_info = FTS_NS;
            e.fts_errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            return;
        }
        // SAFETY: stat filled it.
        let st = unsafe { &*e.fts_statp };
        e.fts_ino = st.st_ino;
        e.fts_dev = st.st_dev;
        e.fts_nlink = st.st_nlink;
        e.fts_info = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            FTS_D
        } else {
            FTS_F
        };
    }

    fn sort(&self, list: &mut [*mut FtsEnt]) {
        if let Some(c) = self.compar {
            // SAFETY: the caller's comparison over pointers to our entries.
            list.sort_by(|a, b| unsafe { c(a as *const _ as _, b as *const _ as _) }.cmp(&0));
        }
    }

    /// The children of directory `dir`, sorted, linked; Err(errno) if it cannot be read.
    fn children(&mut self, dir: *mut FtsEnt, names_only: bool) -> Result<Vec<*mut FtsEnt>, c_int> {
        // SAFETY: `dir` is one of ours.
        let path = unsafe { CStr::from_ptr((*dir).fts_path) }.to_owned();
        // SAFETY: as above.
        let level = unsafe { (*dir).fts_level } + 1;
        let entries = read_dir_names(&path)?;
        let mut out = Vec::new();
        for (name, d_type) in entries {
            let dot = matches!(name.as_slice(), b"." | b"..");
            if dot && self.options & FTS_SEEDOT == 0 {
                continue;
            }
            let ent = self.entry(dir, &name, level);
            if ent.is_null() {
                return Err(libc::ENOMEM);
            }
            if !names_only {
                self.fill(ent, false, Some(d_type));
            }
            out.push(ent);
        }
        self.sort(&mut out);
        for pair in out.windows(2) {
            // SAFETY: both are ours.
            unsafe { (*pair[0]).fts_link = pair[1] };
        }
        Ok(out)
    }

    /// The next entry of the walk, or null at its end.
    fn read(&mut self) -> *mut FtsEnt {
        let cur = self.fts.fts_cur;
        if !self.started {
            self.started = true;
        } else if !cur.is_null() {
            // SAFETY: `cur` is one of ours.
            let c = unsafe { &mut *cur };
            let instr = std::mem::replace(&mut c.fts_instr, 0);
            if instr == FTS_AGAIN {
                let root = c.fts_level == 0;
                self.fill(cur, root, None);
                return cur;
            }
            if c.fts_info == FTS_D && instr != FTS_SKIP && self.may_descend(c) {
                let children = match self.read_ahead.take() {
                    Some(list) => Ok(list),
                    None => self.children(cur, false),
                };
                match children {
                    Ok(children) => self.frames.push(Frame {
                        dir: cur,
                        children,
                        next: 0,
                    }),
                    Err(errno) => {
                        c.fts_info = FTS_DNR;
                        c.fts_errno = errno;
                        return cur;
                    }
                }
            }
        }
        self.read_ahead = None;
        loop {
            let Some(frame) = self.frames.last_mut() else {
                return std::ptr::null_mut();
            };
            if let Some(&next) = frame.children.get(frame.next) {
                frame.next += 1;
                self.fts.fts_cur = next;
                return next;
            }
            let done = self.frames.pop().map_or(std::ptr::null_mut(), |f| f.dir);
            if done != self.root_parent && !done.is_null() {
                // SAFETY: one of ours.
                unsafe { (*done).fts_info = FTS_DP };
                self.fts.fts_cur = done;
                return done;
            }
        }
    }

    fn may_descend(&self, c: &FtsEnt) -> bool {
        self.options & FTS_XDEV == 0 || c.fts_dev == self.fts.fts_dev
    }
}

/// The names and d_types of directory `path`, as readdir gives them.
fn read_dir_names(path: &CStr) -> Result<Vec<(Vec<u8>, u8)>, c_int> {
    // SAFETY: a NUL-terminated path.
    let dir = unsafe { dirops::opendir(path.as_ptr()) };
    if dir.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: our stream.
        let ent = unsafe { dirops::readdir64(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: a valid dirent with a NUL-terminated name.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        // SAFETY: as above.
        out.push((name, unsafe { (*ent).d_type }));
    }
    // SAFETY: our stream.
    unsafe { dirops::closedir(dir) };
    Ok(out)
}

/// fts_open over the wrappers when a root is under the mount; None otherwise.
///
/// # Safety
/// `argv` is a NULL-terminated array of C strings.
unsafe fn open_walk(
    argv: *const *const c_char,
    options: c_int,
    compar: Option<Compar>,
) -> Option<*mut Fts> {
    // SAFETY: NULL-terminated per the contract.
    let roots = unsafe { c_array(argv) };
    // SAFETY: each root is a C string.
    if !roots.iter().any(|p| unsafe { classify(*p) }.is_some()) {
        return None;
    }
    let mut walk = Box::new(Walk {
        fts: Fts {
            fts_cur: std::ptr::null_mut(),
            fts_child: std::ptr::null_mut(),
            fts_array: std::ptr::null_mut(),
            fts_dev: 0,
            fts_path: std::ptr::null_mut(),
            fts_rfd: -1,
            fts_pathlen: 0,
            fts_nitems: 0,
            fts_compar: compar,
            fts_options: options,
        },
        options,
        compar,
        root_parent: std::ptr::null_mut(),
        frames: Vec::new(),
        read_ahead: None,
        allocations: Vec::new(),
        started: false,
    });
    let root_parent = walk.entry(std::ptr::null_mut(), b"", -1);
    walk.root_parent = root_parent;
    let mut list = Vec::new();
    for p in roots {
        // SAFETY: a C string.
        let name = unsafe { CStr::from_ptr(p) }.to_bytes();
        let ent = walk.entry(root_parent, name, 0);
        if ent.is_null() {
            set_errno(libc::ENOMEM);
            return Some(std::ptr::null_mut());
        }
        walk.fill(ent, true, None);
        list.push(ent);
    }
    walk.sort(&mut list);
    for pair in list.windows(2) {
        // SAFETY: both are ours.
        unsafe { (*pair[0]).fts_link = pair[1] };
    }
    if let Some(&first) = list.first() {
        // SAFETY: one of ours, stat'ed.
        walk.fts.fts_dev = unsafe { (*first).fts_dev };
    }
    walk.frames.push(Frame {
        dir: root_parent,
        children: list,
        next: 0,
    });
    let ptr = Box::into_raw(walk);
    walks()
        .get_or_insert_with(HashSet::new)
        .insert(ptr as usize);
    Some(ptr as *mut Fts)
}

macro_rules! fts_family {
    ($open:ident, $read:ident, $children:ident, $set:ident, $close:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($open)))]
        #[boundary]
        pub unsafe extern "C" fn $open(argv: *const *const c_char, options: c_int, compar: Option<Compar>) -> *mut Fts {
            // SAFETY: per the C contract.
            match (!argv.is_null()).then(|| unsafe { open_walk(argv, options, compar) }).flatten() {
                Some(ftsp) => ftsp,
                None => call_real!($open: fn(*const *const c_char, c_int, Option<Compar>) -> *mut Fts, std::ptr::null_mut(); argv, options, compar),
            }
        }

        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($read)))]
        #[boundary]
        pub unsafe extern "C" fn $read(ftsp: *mut Fts) -> *mut FtsEnt {
            match ours(ftsp) {
                Some(w) => {
                    set_errno(0);
                    w.read()
                }
                None => call_real!($read: fn(*mut Fts) -> *mut FtsEnt, std::ptr::null_mut(); ftsp),
            }
        }

        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($children)))]
        #[boundary]
        pub unsafe extern "C" fn $children(ftsp: *mut Fts, options: c_int) -> *mut FtsEnt {
            let Some(w) = ours(ftsp) else {
                return call_real!($children: fn(*mut Fts, c_int) -> *mut FtsEnt, std::ptr::null_mut(); ftsp, options);
            };
            set_errno(0);
            let cur = w.fts.fts_cur;
            if !w.started || cur.is_null() {
                // Before the first fts_read: the roots.
                return w.frames.first().and_then(|f| f.children.first().copied()).unwrap_or(std::ptr::null_mut());
            }
            // SAFETY: one of ours.
            if unsafe { (*cur).fts_info } != FTS_D {
                return std::ptr::null_mut();
            }
            match w.children(cur, options & FTS_NAMEONLY != 0) {
                Ok(list) => {
                    let first = list.first().copied().unwrap_or(std::ptr::null_mut());
                    // Names only are not what fts_read returns: it reads again.
                    w.read_ahead = (options & FTS_NAMEONLY == 0).then_some(list);
                    first
                }
                Err(e) => {
                    set_errno(e);
                    std::ptr::null_mut()
                }
            }
        }

        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($set)))]
        #[boundary]
        pub unsafe extern "C" fn $set(ftsp: *mut Fts, f: *mut FtsEnt, instr: c_int) -> c_int {
            if ours(ftsp).is_none() {
                return call_real!($set: fn(*mut Fts, *mut FtsEnt, c_int) -> c_int, -1; ftsp, f, instr);
            }
            if f.is_null() || !(0..=4).contains(&instr) {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: an entry of this walk, given back by the caller.
            unsafe { (*f).fts_instr = instr as u16 };
            0
        }

        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($close)))]
        #[boundary]
        pub unsafe extern "C" fn $close(ftsp: *mut Fts) -> c_int {
            if ours(ftsp).is_none() {
                return call_real!($close: fn(*mut Fts) -> c_int, -1; ftsp);
            }
            if let Some(w) = walks().as_mut() {
                w.remove(&(ftsp as usize));
            }
            // SAFETY: made by Box::into_raw in open_walk, no longer registered.
            let walk = unsafe { Box::from_raw(ftsp as *mut Walk) };
            for p in &walk.allocations {
                // SAFETY: each was calloc'ed by the walk.
                unsafe { libc::free(*p) };
            }
            0
        }
    };
}
fts_family!(fts_open, fts_read, fts_children, fts_set, fts_close);
fts_family!(
    fts64_open,
    fts64_read,
    fts64_children,
    fts64_set,
    fts64_close
);
