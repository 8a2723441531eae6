//! Directory walks: glob, scandir, ftw/nftw and fts. glibc implements them over its internal
//! opendir/readdir/stat, which no preload sees, so under the mount they are done here over
//! the wrappers (which serve store paths and pass host paths on):
//!
//! - glob runs glibc's own matcher with `GLOB_ALTDIRFUNC`, given the wrappers as its
//!   directory and stat functions, so its semantics are glibc's exactly;
//! - scandir, ftw/nftw (and fts, in fts.rs) are walks of their own with glibc's semantics,
//!   entered when the starting path is under the mount. nftw's `FTW_CHDIR` is ignored: the
//!   callback gets the whole path and the working directory does not change.
//!
//! Entries come in the store's directory order, as readdir gives them.

use super::dirops::{closedir, opendir, readdir64};
use super::stat::{lstat64, stat64};
use super::*;
use libc::{c_int, c_void, dirent64, size_t};
use std::ffi::{c_char, CString};

// ---- helpers ------------------------------------------------------------------------------

/// The entries of directory `path` as readdir gives them, "." and ".." included: (name,
/// d_type); or the errno of opendir.
fn read_entries(path: &CStr) -> Result<Vec<(CString, u8)>, c_int> {
    // SAFETY: a NUL-terminated path.
    let dir = unsafe { opendir(path.as_ptr()) };
    if dir.is_null() {
        return Err(errno());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: a stream opendir gave us.
        let ent = unsafe { readdir64(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: readdir returns a valid dirent with a NUL-terminated name.
        let (name, t) = unsafe {
            (
                CStr::from_ptr((*ent).d_name.as_ptr()).to_owned(),
                (*ent).d_type,
            )
        };
        out.push((name, t));
    }
    // SAFETY: the stream is ours to close.
    unsafe { closedir(dir) };
    Ok(out)
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `dir/name` as a C path.
fn child(dir: &CStr, name: &CStr) -> CString {
    let mut p = dir.to_bytes().to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name.to_bytes());
    // No interior NUL: both parts came from C strings.
    CString::new(p).unwrap_or_default()
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// stat or lstat of a C path.
fn stat_of(path: &CStr, follow: bool) -> Result<libc::stat64, c_int> {
    // SAFETY: a zeroed stat64 is a valid value to be overwritten.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    let r = unsafe {
        if follow {
            stat64(path.as_ptr(), &mut st)
        } else {
            lstat64(path.as_ptr(), &mut st)
        }
    };
    if r == 0 {
        Ok(st)
    } else {
        Err(errno())
    }
}

fn is_dir_mode(st: &libc::stat64) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

// ---- glob ---------------------------------------------------------------------------------

/// glibc's glob_t (the libc crate keeps the directory-function fields private).
#[repr(C)]
struct GlobT {
    gl_pathc: size_t,
    gl_pathv: *mut *mut c_char,
    gl_offs: size_t,
    gl_flags: c_int,
    gl_closedir: Option<unsafe extern "C" fn(*mut c_void)>,
    gl_readdir: Option<unsafe extern "C" fn(*mut c_void) -> *mut dirent64>,
    gl_opendir: Option<unsafe extern "C" fn(*const c_char) -> *mut c_void>,
    gl_lstat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
    gl_stat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
}

const GLOB_ALTDIRFUNC: c_int = 1 << 9;

#[boundary]
unsafe extern "C" fn glob_closedir(d: *mut c_void) {
    // SAFETY: glob passes back what glob_opendir returned.
    unsafe { closedir(d as *mut libc::DIR) };
}
#[boundary]
unsafe extern "C" fn glob_readdir(d: *mut c_void) -> *mut dirent64 {
    // SAFETY: glob passes back what glob_opendir returned.
    unsafe { readdir64(d as *mut libc::DIR) }
}
#[boundary]
unsafe extern "C" fn glob_opendir(p: *const c_char) -> *mut c_void {
    // SAFETY: glob passes a NUL-terminated path.
    unsafe { opendir(p) as *mut c_void }
}

/// True if glob should walk `pattern` through the wrappers: it names the mount, or is
/// relative while the working directory is in the store.
///
/// # Safety
/// `pattern` is null or NUL-terminated.
unsafe fn glob_is_ours(pattern: *const c_char) -> bool {
    if pattern.is_null() {
        return false;
    }
    // SAFETY: NUL-terminated per the contract.
    let p = unsafe { CStr::from_ptr(pattern) }.to_bytes();
    if p.starts_with(b"/") {
        return p.starts_with(mount().as_bytes());
    }
    !p.starts_with(b"~") && virtual_cwd().is_some()
}

macro_rules! glob_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI: `pattern` is NUL-terminated, `pglob` a glob_t.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::GLOB_ABORTED)]
        pub unsafe extern "C" fn $name(
            pattern: *const c_char,
            flags: c_int,
            errfunc: Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>,
            pglob: *mut c_void,
        ) -> c_int {
            let mut flags = flags;
            // SAFETY: per the C contract.
            if flags & GLOB_ALTDIRFUNC == 0 && !pglob.is_null() && unsafe { glob_is_ours(pattern) } {
                // SAFETY: pglob points to a glob_t, whose layout GlobT spells out.
                let g = unsafe { &mut *(pglob as *mut GlobT) };
                g.gl_closedir = Some(glob_closedir);
                g.gl_readdir = Some(glob_readdir);
                g.gl_opendir = Some(glob_opendir);
                g.gl_lstat = Some(lstat64);
                g.gl_stat = Some(stat64);
                flags |= GLOB_ALTDIRFUNC;
            }
            call_real!($name: fn(*const c_char, c_int, Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>, *mut c_void) -> c_int, libc::GLOB_NOSPACE; pattern, flags, errfunc, pglob)
        }
    };
}
glob_wrapper!(glob);
glob_wrapper!(glob64);

// ---- scandir ------------------------------------------------------------------------------

type Filter = Option<unsafe extern "C" fn(*const dirent64) -> c_int>;
type Compar = Option<unsafe extern "C" fn(*const *const dirent64, *const *const dirent64) -> c_int>;

/// scandir over the wrappers: every entry the filter keeps, copied to malloc'ed memory,
/// sorted by `compar`; the count, or -1 with errno.
fn scan(dir: &CStr, namelist: *mut *mut *mut dirent64, filter: Filter, compar: Compar) -> c_int {
    // SAFETY: a NUL-terminated path.
    let stream = unsafe { opendir(dir.as_ptr()) };
    if stream.is_null() {
        return -1;
    }
    let mut kept: Vec<*mut dirent64> = Vec::new();
    let free_all = |kept: &[*mut dirent64]| {
        for p in kept {
            // SAFETY: each was malloc'ed below.
            unsafe { libc::free(*p as *mut c_void) };
        }
    };
    loop {
        // SAFETY: our stream.
        let ent = unsafe { readdir64(stream) };
        if ent.is_null() {
            break;
        }
        if let Some(f) = filter {
            // SAFETY: the filter is the caller's, given a valid entry.
            if unsafe { f(ent) } == 0 {
                continue;
            }
        }
        let size = std::mem::size_of::<dirent64>();
        // SAFETY: plain allocation; checked for null.
        let copy = unsafe { libc::malloc(size) } as *mut dirent64;
        if copy.is_null() {
            free_all(&kept);
            // SAFETY: our stream.
            unsafe { closedir(stream) };
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: both point to a whole dirent64.
        unsafe { std::ptr::copy_nonoverlapping(ent, copy, 1) };
        kept.push(copy);
    }
    // SAFETY: our stream.
    unsafe { closedir(stream) };
    if let Some(c) = compar {
        // SAFETY: qsort over the array of entry pointers with the caller's comparison, which
        // takes pointers to elements as qsort passes them.
        unsafe {
            libc::qsort(
                kept.as_mut_ptr() as *mut c_void,
                kept.len(),
                std::mem::size_of::<*mut dirent64>(),
                Some(std::mem::transmute::<
                    unsafe extern "C" fn(*const *const dirent64, *const *const dirent64) -> c_int,
                    unsafe extern "C" fn(*const c_void, *const c_void) -> c_int,
                >(c)),
            )
        };
    }
    let bytes = kept.len().max(1) * std::mem::size_of::<*mut dirent64>();
    // SAFETY: plain allocation; checked for null.
    let list = unsafe { libc::malloc(bytes) } as *mut *mut dirent64;
    if list.is_null() {
        free_all(&kept);
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: `list` has room for every pointer; `namelist` is the caller's out pointer.
    unsafe {
        std::ptr::copy_nonoverlapping(kept.as_ptr(), list, kept.len());
        *namelist = list;
    }
    kept.len() as c_int
}

macro_rules! scandir_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(
            dir: *const c_char,
            namelist: *mut *mut *mut dirent64,
            filter: Filter,
            compar: Compar,
        ) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify(dir) } {
                // SAFETY: non-null (classified) and NUL-terminated.
                Some(_) => scan(unsafe { CStr::from_ptr(dir) }, namelist, filter, compar),
                None => call_real!($name: fn(*const c_char, *mut *mut *mut dirent64, Filter, Compar) -> c_int, -1; dir, namelist, filter, compar),
            }
        }
    };
}
scandir_wrapper!(scandir);
scandir_wrapper!(scandir64);

macro_rules! scandirat_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            dir: *const c_char,
            namelist: *mut *mut *mut dirent64,
            filter: Filter,
            compar: Compar,
        ) -> c_int {
            // SAFETY: per the C contract.
            match unsafe { classify_at(dirfd, dir) } {
                Some(p) => match CString::new(format!("{}{p}", mount())) {
                    Ok(abs) => scan(&abs, namelist, filter, compar),
                    Err(_) => fail(&Error::new(libc::EINVAL, "")),
                },
                None => call_real!($name: fn(c_int, *const c_char, *mut *mut *mut dirent64, Filter, Compar) -> c_int, -1; dirfd, dir, namelist, filter, compar),
            }
        }
    };
}
scandirat_wrapper!(scandirat);
scandirat_wrapper!(scandirat64);

// ---- ftw and nftw -------------------------------------------------------------------------

/// glibc's struct FTW.
#[repr(C)]
pub struct Ftw {
    base: c_int,
    level: c_int,
}

const FTW_F: c_int = 0;
const FTW_D: c_int = 1;
const FTW_DNR: c_int = 2;
const FTW_NS: c_int = 3;
const FTW_DP: c_int = 5;
const FTW_PHYS: c_int = 1;
const FTW_MOUNT: c_int = 2;
const FTW_CHDIR: c_int = 4;
const FTW_DEPTH: c_int = 8;
const FTW_ACTIONRETVAL: c_int = 16;
const FTW_CONTINUE: c_int = 0;
const FTW_SKIP_SUBTREE: c_int = 2;
const FTW_SKIP_SIBLINGS: c_int = 3;

type NftwFn = unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int, *mut Ftw) -> c_int;
type FtwFn = unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int) -> c_int;

/// The callback of one walk: nftw's or ftw's.
#[derive(Clone, Copy)]
enum Visit {
    Nftw(NftwFn),
    Ftw(FtwFn),
}

struct Walk {
    visit: Visit,
    flags: c_int,
    root_dev: u64,
}

/// What a callback's answer means for the walk.
enum Next {
    Go,
    SkipSubtree,
    SkipSiblings,
    Stop(c_int),
}

impl Walk {
    fn call(&self, path: &CStr, st: &libc::stat64, typeflag: c_int, level: c_int) -> Next {
        let base = path
            .to_bytes()
            .iter()
            .rposition(|b| *b == b'/')
            .map_or(0, |i| i + 1) as c_int;
        let mut ftw = Ftw { base, level };
        // SAFETY: the caller's callback, given a valid path, stat and FTW.
        let r = unsafe {
            match self.visit {
                Visit::Nftw(f) => f(path.as_ptr(), st, typeflag, &mut ftw),
                Visit::Ftw(f) => f(path.as_ptr(), st, typeflag),
            }
        };
        if self.flags & FTW_ACTIONRETVAL != 0 {
            match r {
                FTW_CONTINUE => Next::Go,
                FTW_SKIP_SUBTREE => Next::SkipSubtree,
                FTW_SKIP_SIBLINGS => Next::SkipSiblings,
                other => Next::Stop(other),
            }
        } else if r != 0 {
            Next::Stop(r)
        } else {
            Next::Go
        }
    }

    /// Visits `path` (already stat'ed as `st`) and, for a directory, what lies below.
    fn visit(&self, path: &CStr, st: &libc::stat64, level: c_int) -> Next {
        if !is_dir_mode(st) {
            return self.call(path, st, FTW_F, level);
        }
        let depth_first = self.flags & FTW_DEPTH != 0;
        let entries = read_entries(path);
        let first_flag = if entries.is_err() { FTW_DNR } else { FTW_D };
        if !depth_first || entries.is_err() {
            match self.call(path, st, first_flag, level) {
                Next::Go => {}
                Next::SkipSubtree => return Next::Go,
                other => return other,
            }
        }
        if let Ok(entries) = entries {
            for (name, _) in entries.iter().filter(|(n, _)| !is_dot(n)) {
                let p = child(path, name);
                let next = match stat_of(&p, self.flags & FTW_PHYS == 0) {
                    Ok(cst) if self.flags & FTW_MOUNT != 0 && cst.st_dev != self.root_dev => {
                        Next::Go
                    }
                    Ok(cst) => self.visit(&p, &cst, level + 1),
                    Err(_) => {
                        // SAFETY: a zeroed stat for FTW_NS, as glibc passes.
                        let zero: libc::stat64 = unsafe { std::mem::zeroed() };
                        self.call(&p, &zero, FTW_NS, level + 1)
                    }
                };
                match next {
                    Next::Go | Next::SkipSubtree => {}
                    Next::SkipSiblings => break,
                    stop @ Next::Stop(_) => return stop,
                }
            }
            if depth_first {
                return match self.call(path, st, FTW_DP, level) {
                    Next::SkipSubtree | Next::SkipSiblings => Next::Go,
                    other => other,
                };
            }
        }
        Next::Go
    }
}

/// A walk from `path`; None when the path is not under the mount (glibc walks it).
///
/// # Safety
/// `path` is NUL-terminated.
unsafe fn walk(path: *const c_char, visit: Visit, flags: c_int) -> Option<c_int> {
    // SAFETY: per the contract.
    unsafe { classify(path) }?;
    // SAFETY: classified, so non-null and NUL-terminated.
    let root = unsafe { CStr::from_ptr(path) };
    let st = match stat_of(root, flags & FTW_PHYS == 0) {
        Ok(st) => st,
        Err(e) => {
            set_errno(e);
            return Some(-1);
        }
    };
    let w = Walk {
        visit,
        flags,
        root_dev: st.st_dev,
    };
    Some(match w.visit(root, &st, 0) {
        Next::Stop(r) => r,
        _ => 0,
    })
}

macro_rules! nftw_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, f: Option<NftwFn>, nopenfd: c_int, flags: c_int) -> c_int {
            let Some(cb) = f else {
                return call_real!($name: fn(*const c_char, Option<NftwFn>, c_int, c_int) -> c_int, -1; path, f, nopenfd, flags);
            };
            // SAFETY: per the C contract.
            match unsafe { walk(path, Visit::Nftw(cb), flags & !FTW_CHDIR) } {
                Some(r) => r,
                None => call_real!($name: fn(*const c_char, Option<NftwFn>, c_int, c_int) -> c_int, -1; path, f, nopenfd, flags),
            }
        }
    };
}
nftw_wrapper!(nftw);
nftw_wrapper!(nftw64);

macro_rules! ftw_wrapper {
    ($name:ident) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name(path: *const c_char, f: Option<FtwFn>, nopenfd: c_int) -> c_int {
            let Some(cb) = f else {
                return call_real!($name: fn(*const c_char, Option<FtwFn>, c_int) -> c_int, -1; path, f, nopenfd);
            };
            // SAFETY: per the C contract.
            match unsafe { walk(path, Visit::Ftw(cb), 0) } {
                Some(r) => r,
                None => call_real!($name: fn(*const c_char, Option<FtwFn>, c_int) -> c_int, -1; path, f, nopenfd),
            }
        }
    };
}
ftw_wrapper!(ftw);
ftw_wrapper!(ftw64);
