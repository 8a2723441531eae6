//! Interposition: wrappers that serve paths under the mount prefix from the node store and
//! pass everything else to the next definition (normally glibc's). Design and semantics:
//! docs/interposition.md.
//!
//! Families: `sysio` (open, read, write, seek, truncate, sync), `fds` (dup, fcntl, flock),
//! `stat` (the stat family, statfs, access), `names` (unlink, rename, mkdir, chmod...),
//! `dirops` (opendir/readdir, getdents64, chdir/getcwd), `stdio` (fopen via fopencookie),
//! `mapping` (mmap, sendfile/copy_file_range/splice, extended attributes), `process`
//! (exec carries the virtual cwd and hands on references; links are refused), `exec`
//! (stored programs and libraries), `spawn` (posix_spawn and its file actions, system,
//! popen), `temp` (mkstemp family), `walk` and `fts` (glob, scandir, ftw/nftw, fts), `more`
//! (calls glibc builds on others: remove, lockf, mknod...), `readthrough` (a path the store
//! lacks is asked of the node agent). glibc's own functions reach files through internal
//! calls that no preload sees; those that matter are wrapped here (docs/interposition.md,
//! "Paths inside glibc").

pub(crate) mod credentials;
pub(crate) mod dirops;
pub(crate) mod exec;
pub(crate) mod fds;
pub(crate) mod fts;
pub(crate) mod hazard;
pub(crate) mod mapping;
pub(crate) mod more;
pub(crate) mod names;
pub(crate) mod process;
pub(crate) mod raw;
pub(crate) mod readthrough;
pub(crate) mod spawn;
pub(crate) mod stat;
pub(crate) mod stdio;
pub(crate) mod sysio;
pub(crate) mod temp;
mod thread_word;
pub(crate) mod walk;

use cascade_store::{Error, File, OpenDescription, Store};
use std::borrow::Cow;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{
    AtomicBool, AtomicPtr,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub(crate) use cascade_boundary::boundary;

// ---- panics stop at the C boundary ------------------------------------------------------

/// What an `extern "C"` function returns when a panic inside the library is caught at its
/// boundary ([`catch_panic`], put there by `#[boundary]`): its error value.
pub(crate) trait OnPanic {
    fn on_panic() -> Self;
}

macro_rules! on_panic_is {
    ($value:expr; $($t:ty),*) => {
        $(impl OnPanic for $t {
            fn on_panic() -> Self {
                $value
            }
        })*
    };
}
on_panic_is!(-1; i32, i64, isize);
on_panic_is!(0; u32, usize);
on_panic_is!(();());

impl<T> OnPanic for *mut T {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> OnPanic for *const T {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

/// Runs the body of an `extern "C"` function: a panic (a bug, or store code meeting a
/// corrupt shared block) must not unwind into C, which aborts the host program. It fails
/// the call instead: errno EIO, the function's error value, and one line on stderr.
#[inline(always)]
pub(crate) fn catch_panic<R: OnPanic>(name: &str, f: impl FnOnce() -> R) -> R {
    catch_panic_or(name, R::on_panic(), f)
}

/// [`catch_panic`] with an explicit error value (functions that return an error number).
/// Inlined, as the call it wraps: a 64-byte write is a few dozen instructions, and a frame
/// more is a tenth of them.
#[inline(always)]
pub(crate) fn catch_panic_or<R>(name: &str, fail: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            report_panic(name, payload);
            fail
        }
    }
}

/// One line on stderr for a panic the boundary caught; errno EIO.
#[cold]
#[inline(never)]
fn report_panic(name: &str, payload: Box<dyn std::any::Any + Send>) {
    let what = LAST_PANIC
        .try_with(|p| p.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| panic_text(&*payload));
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("cascade: {name}: internal error ({what}); the call fails with EIO\n").as_bytes(),
    );
    set_errno(libc::EIO);
}

thread_local! {
    /// The last panic's message and place, left by the hook for [`catch_panic_or`].
    static LAST_PANIC: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

/// A panic hook that prints nothing for the library's own panics (the boundary prints one
/// line naming the call) and keeps their place and message for it; other panics (a Rust
/// program linked with `libcascade_wrap.a` shares this hook) go to the previous hook.
fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let place = info.location().map(|l| (l.file().to_string(), l.line()));
        let ours = cfg!(not(cascade_wrap))
            || place
                .as_ref()
                .is_some_and(|(file, _)| file.contains("cascade-"));
        if !ours {
            previous(info);
            return;
        }
        let text = panic_text(info.payload());
        let text = match place {
            Some((file, line)) => format!("{text} at {file}:{line}"),
            None => text,
        };
        let _ = LAST_PANIC.try_with(|p| p.set(Some(text)));
    }));
}

/// Finds the next definition of a libc function (dlsym RTLD_NEXT), once. Evaluates to
/// `Option<fn pointer>`.
macro_rules! real {
    ($name:ident : fn($($arg:ty),*) -> $ret:ty) => {{
        static PTR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut p = PTR.load(std::sync::atomic::Ordering::Relaxed);
        if p == 0 {
            p = $crate::interpose::resolve_once(&PTR, concat!(stringify!($name), "\0"));
        }
        if p == 0 {
            None
        } else {
            // SAFETY: the symbol is the libc function of this name, whose C signature the
            // caller spells out.
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p) })
        }
    }};
}
pub(crate) use real;

/// [`real!`]'s first call: finds the definition and keeps it in `cache`. Cold and out of
/// line, so that a wrapper's pass-through path needs no frame of its own.
#[cold]
#[inline(never)]
pub(crate) fn resolve_once(cache: &std::sync::atomic::AtomicUsize, name_nul: &str) -> usize {
    let p = next_definition(name_nul);
    cache.store(p, std::sync::atomic::Ordering::Relaxed);
    p
}

/// The next definition of a wrapped function. Preloaded: the one after ours in the lookup
/// order (dlsym RTLD_NEXT). Statically linked with `ld --wrap` (the `cascade-wrap` build):
/// `__real_NAME`, which the linker binds to the original, found through a table the build
/// script generates from intercepted.txt.
pub(crate) fn next_definition(name_nul: &str) -> usize {
    #[cfg(cascade_wrap)]
    {
        extern "C" {
            fn cascade_wrap_real(name: *const std::ffi::c_char) -> *mut std::ffi::c_void;
        }
        // SAFETY: a NUL-terminated name; the generated C table only compares strings.
        unsafe { cascade_wrap_real(name_nul.as_ptr() as *const std::ffi::c_char) as usize }
    }
    #[cfg(not(cascade_wrap))]
    {
        // SAFETY: dlsym with a NUL-terminated name; a null result means "none".
        unsafe {
            libc::dlsym(
                libc::RTLD_NEXT,
                name_nul.as_ptr() as *const std::ffi::c_char,
            ) as usize
        }
    }
}

/// Calls the real function, or fails with ENOSYS if libc has none.
macro_rules! call_real {
    ($name:ident : fn($($arg:ty),*) -> $ret:ty, $fail:expr; $($val:expr),*) => {{
        match $crate::interpose::real!($name: fn($($arg),*) -> $ret) {
            // SAFETY: forwarding the caller's arguments unchanged to the real function.
            Some(f) => unsafe { f($($val),*) },
            None => {
                $crate::interpose::set_errno(libc::ENOSYS);
                $fail
            }
        }
    }};
}
pub(crate) use call_real;

/// The entries of a NULL-terminated array of C strings (argv, envp), without the NULL; none
/// for a null array.
///
/// # Safety
/// `array` is null or a NULL-terminated array of pointers.
pub(crate) unsafe fn c_array(array: *const *const c_char) -> Vec<*const c_char> {
    let mut out = Vec::new();
    if array.is_null() {
        return out;
    }
    loop {
        // SAFETY: NULL-terminated per the contract; `out.len()` never passes the NULL.
        let p = unsafe { *array.add(out.len()) };
        if p.is_null() {
            return out;
        }
        out.push(p);
    }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Reports a store error the C way: errno and -1.
pub(crate) fn fail(e: &Error) -> i32 {
    set_errno(e.errno());
    -1
}

pub(crate) fn fail_ssize(e: &Error) -> isize {
    set_errno(e.errno());
    -1
}

// ---- configuration and the store --------------------------------------------------------

/// The mount prefix ("/cascade" unless CASCADE_MOUNT says otherwise), without a trailing '/'.
pub(crate) fn mount() -> &'static str {
    static MOUNT: OnceLock<String> = OnceLock::new();
    MOUNT.get_or_init(|| {
        let m = std::env::var("CASCADE_MOUNT").unwrap_or_default();
        let m = if m.starts_with('/') && m.len() > 1 {
            m
        } else {
            "/cascade".to_string()
        };
        m.trim_end_matches('/').to_string()
    })
}

/// The attached store, attached on first use (CASCADE_STORE, else the user's default).
static STORE_CELL: OnceLock<Result<Store, Error>> = OnceLock::new();

pub(crate) fn store() -> Result<&'static Store, Error> {
    STORE_CELL
        .get_or_init(|| {
            let name = std::env::var("CASCADE_STORE")
                .unwrap_or_else(|_| cascade_store::default_store_name());
            let store = Store::attach(&name)?;
            if is_the_job() {
                store.start_map_in();
            }
            Ok(store)
        })
        .as_ref()
        .map_err(|e| e.clone())
}

/// Set by `cascade run` to its own pid: the process it started (the job) maps the store in
/// as soon as it attaches it (docs/store-layout.md, "Memory and faults").
const MAP_IN_PARENT_ENV: &str = "CASCADE_MAP_IN_PARENT";

/// Whether this process is the one `cascade run` started: it will write checkpoints, so it
/// maps the store's memory in at attach rather than at its first checkpoint. Its children
/// (a shell's `ls`, say) do not: they may only look at the namespace.
fn is_the_job() -> bool {
    let Some(parent) = std::env::var(MAP_IN_PARENT_ENV)
        .ok()
        .and_then(|v| v.parse::<libc::pid_t>().ok())
    else {
        return false;
    };
    // SAFETY: getppid cannot fail.
    parent == unsafe { libc::getppid() }
}

// ---- paths ------------------------------------------------------------------------------

/// The virtual working directory while the process is "inside" the mount (store path).
static VIRTUAL_CWD: RwLock<Option<String>> = RwLock::new(None);

pub(crate) fn virtual_cwd() -> Option<String> {
    VIRTUAL_CWD
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// `rel` joined onto the virtual working directory, if there is one (the directory is not
/// copied out first: one allocation per relative path).
fn in_virtual_cwd(rel: &str) -> Option<String> {
    VIRTUAL_CWD
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_deref()
        .map(|cwd| join_store(cwd, rel))
}

pub(crate) fn set_virtual_cwd(cwd: Option<String>) {
    *VIRTUAL_CWD.write().unwrap_or_else(|p| p.into_inner()) = cwd;
}

/// Lexically normalises an absolute path ("." and ".." and repeated '/').
fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = String::with_capacity(path.len());
    for p in parts {
        out.push('/');
        out.push_str(p);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The part of `p` below the mount ("" for the mount itself), if `p` starts with it.
fn below_mount(p: &str) -> Option<&str> {
    let rest = p.strip_prefix(mount())?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The store path for an absolute host path, if it lies under the mount: borrowed from `abs`
/// unless it had to be normalised (a path without "/." or "//", the usual case, allocates
/// nothing: every call that takes a path asks this first).
///
/// Whether it does is decided lexically (so "/cascade/../etc" is the host's /etc); below
/// the mount the path is handed to the store as written, so that ".." is walked through
/// directories that must exist, as the kernel does.
pub(crate) fn store_path_of(abs: &str) -> Option<Cow<'_, str>> {
    if !abs.contains("/.") && !abs.contains("//") {
        return below_mount(abs).map(|rest| Cow::Borrowed(or_root(rest)));
    }
    let norm = normalise(abs);
    let below = below_mount(&norm)?;
    Some(match below_mount(abs) {
        Some(rest) => Cow::Borrowed(or_root(rest)),
        // e.g. "//cascade/x": only the normalised form starts with the mount.
        None => Cow::Owned(or_root(below).to_string()),
    })
}

/// The store path of what lies below the mount: "" (the mount itself) is the root.
fn or_root(rest: &str) -> &str {
    if rest.is_empty() {
        "/"
    } else {
        rest
    }
}

/// Joins a relative path onto a store directory path (walked by the store, not normalised).
pub(crate) fn join_store(dir: &str, rel: &str) -> String {
    let mut joined = String::with_capacity(dir.len() + 1 + rel.len());
    joined.push_str(dir);
    if !dir.ends_with('/') {
        joined.push('/');
    }
    joined.push_str(rel);
    joined
}

/// Classifies a C path: `Some(store path)` when Cascade serves it.
///
/// # Safety
/// `path` is null or a NUL-terminated string that stays unchanged for `'a` (the store path
/// may borrow from it: the wrapped call's argument, for the call).
pub(crate) unsafe fn classify<'a>(path: *const c_char) -> Option<Cow<'a, str>> {
    classify_at(libc::AT_FDCWD, path)
}

/// Like [`classify`], relative to directory descriptor `dirfd` (an `*at` call).
///
/// # Safety
/// As [`classify`].
pub(crate) unsafe fn classify_at<'a>(dirfd: i32, path: *const c_char) -> Option<Cow<'a, str>> {
    if path.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated and unchanged for 'a per the caller's contract.
    let bytes = unsafe { CStr::from_ptr::<'a>(path) }.to_bytes();
    let s = std::str::from_utf8(bytes).ok()?;
    if s.starts_with('/') {
        return store_path_of(s);
    }
    if s.is_empty() {
        return None;
    }
    if dirfd != libc::AT_FDCWD {
        if let Some(e) = fds::entry(dirfd) {
            // Resolved from the directory's inode: right after renames, and ENOTDIR for a
            // file descriptor, as the kernel says.
            return Some(Cow::Owned(e.file.anchored(s)));
        }
        return host_dir_into_mount(dirfd, s).map(Cow::Owned);
    }
    in_virtual_cwd(s).map(Cow::Owned)
}

/// The store path of an application path given to the C API (`cascade_commit`): absolute
/// under the mount prefix, or relative to the current directory (the virtual one inside the
/// mount, else the kernel's). EINVAL for a path outside the mount, ENOENT for "".
pub(crate) fn app_store_path(path: &str) -> Result<String, Error> {
    if path.is_empty() {
        return Err(Error::new(libc::ENOENT, "empty path"));
    }
    let outside = || {
        Error::new(
            libc::EINVAL,
            format!("{path} is not under the Cascade mount prefix {}", mount()),
        )
    };
    if path.starts_with('/') {
        return store_path_of(path).map(Cow::into_owned).ok_or_else(outside);
    }
    if let Some(joined) = in_virtual_cwd(path) {
        return Ok(joined);
    }
    let cwd = std::env::current_dir().map_err(|e| Error::from_io(&e, "getcwd"))?;
    let cwd = cwd.to_str().ok_or_else(outside)?;
    store_path_of(&format!("{cwd}/{path}"))
        .map(Cow::into_owned)
        .ok_or_else(outside)
}

/// A host directory descriptor plus a relative path can still lead into the mount (rsync
/// walks "/" then "cascade" with openat). Only when the path could — it has ".." or a
/// component of the mount path — is the descriptor's directory looked up (one readlink).
fn host_dir_into_mount(dirfd: i32, rel: &str) -> Option<String> {
    let mount_parts: Vec<&str> = mount().split('/').filter(|c| !c.is_empty()).collect();
    if !rel
        .split('/')
        .any(|c| c == ".." || mount_parts.contains(&c))
    {
        return None;
    }
    let dir = std::fs::read_link(format!("/proc/self/fd/{dirfd}")).ok()?;
    let dir = dir.to_str()?;
    if !dir.starts_with('/') {
        return None;
    }
    store_path_of(&normalise(&format!("{dir}/{rel}"))).map(Cow::into_owned)
}

// ---- the fd table -----------------------------------------------------------------------

/// Descriptors above this are never Cascade's (open returns EMFILE rather than use one).
pub(crate) const MAX_FDS: usize = 1 << 16;

/// What a Cascade descriptor refers to. Shared by dup'ed descriptors in this process; the
/// offset lives in the store's description table, shared across processes.
pub(crate) struct Entry {
    pub file: File,
    pub desc: OpenDescription,
    /// Store path at open time (for `*at` calls, fchdir and fstat of directories).
    pub path: String,
    /// Descriptor of this file's lock file, opened on the first flock/fcntl lock.
    pub lock_fd: OnceLock<i32>,
    /// Opened as a directory (stays true after the directory is removed).
    pub is_dir: bool,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(fd) = self.lock_fd.get() {
            // SAFETY: the lock-file descriptor belongs to this entry alone.
            unsafe { libc::syscall(libc::SYS_close, *fd) };
        }
    }
}

impl Entry {
    /// The entry's description, None once it was freed (through the file's own block: no
    /// store handle on the path of every read and write).
    #[inline(always)]
    pub(crate) fn description(&self) -> Option<cascade_store::Description<'_>> {
        self.file.description(self.desc)
    }
}

/// One flag per descriptor: the check on every non-Cascade call is one load.
static IS_CASCADE: [AtomicBool; MAX_FDS] = [const { AtomicBool::new(false) }; MAX_FDS];
/// Per descriptor: this process image holds one of its description's references (it opened
/// or dup'ed it, inherited it over fork, or was handed it at exec), so it gives that
/// reference back when it ends. A descriptor inherited otherwise (a vfork child's exec that
/// did not go through the wrappers) is not: it is left to whoever holds the reference.
static OWNED: [AtomicBool; MAX_FDS] = [const { AtomicBool::new(false) }; MAX_FDS];

/// The environment variable that tells a new program image which of its inherited Cascade
/// descriptors' references it was handed (comma-separated fd numbers). Read and removed at
/// load, so that it never reaches a program the wrappers did not start.
pub(crate) const HANDED_FDS_ENV: &str = "CASCADE_HANDED_FDS";
/// The entries, each behind its own lock (held for the duration of a call on it, so a
/// racing close cannot free an entry in use).
static ENTRIES: [SlotLock; MAX_FDS] = [const { SlotLock::new() }; MAX_FDS];
/// Per descriptor: the entry its slot holds, for [`with_entry`]'s lock-free readers.
static PUBLISHED: [AtomicPtr<Entry>; MAX_FDS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_FDS];

/// A descriptor's slot behind a futex lock of our own, not `std::sync::Mutex`, because a
/// fork child must be able to take it back: a thread of the parent that held it at the fork
/// (inside a read or write on that descriptor) does not exist in the child, and would hold
/// it there for ever (the child's first call on the descriptor, or the fork handler, would
/// hang). [`after_fork_in_child`] releases every slot lock with [`SlotLock::reset_in_child`].
pub(crate) struct SlotLock {
    /// 0 free, 1 held, 2 held and someone may wait.
    state: std::sync::atomic::AtomicU32,
    entry: std::cell::UnsafeCell<Option<Arc<Entry>>>,
}

// SAFETY: the entry is reached only through a SlotGuard, which exists only while `state`
// says the lock is held by its holder (mutual exclusion as a Mutex gives).
unsafe impl Sync for SlotLock {}

pub(crate) struct SlotGuard<'a>(&'a SlotLock);

impl SlotLock {
    const fn new() -> SlotLock {
        SlotLock {
            state: std::sync::atomic::AtomicU32::new(0),
            entry: std::cell::UnsafeCell::new(None),
        }
    }

    fn lock(&self) -> SlotGuard<'_> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        if self.state.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            while self.state.swap(2, Acquire) != 0 {
                // SAFETY: futex(2) wait on a live word while it is 2; spurious wake-ups loop.
                unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        self.state.as_ptr(),
                        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                        2u32,
                        std::ptr::null::<libc::timespec>(),
                    )
                };
            }
        }
        SlotGuard(self)
    }

    fn try_lock(&self) -> Option<SlotGuard<'_>> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        self.state
            .compare_exchange(0, 1, Acquire, Relaxed)
            .ok()
            .map(|_| SlotGuard(self))
    }

    /// In a fork child (one thread): frees the lock whatever held it in the parent.
    fn reset_in_child(&self) {
        self.state.store(0, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.0.state.swap(0, std::sync::atomic::Ordering::Release) == 2 {
            // SAFETY: futex(2) wake on a live word.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.0.state.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    1,
                )
            };
        }
    }
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = Option<Arc<Entry>>;
    fn deref(&self) -> &Self::Target {
        // SAFETY: the guard holds the lock (see `unsafe impl Sync`).
        unsafe { &*self.0.entry.get() }
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: the guard holds the lock, so this is the only reference.
        unsafe { &mut *self.0.entry.get() }
    }
}

pub(crate) fn is_cascade_fd(fd: i32) -> bool {
    (0..MAX_FDS as i32).contains(&fd) && IS_CASCADE[fd as usize].load(Relaxed)
}

fn slot(fd: i32) -> SlotGuard<'static> {
    ENTRIES[fd as usize].lock()
}

/// Tracks `fd` as a descriptor of `entry` whose reference this process image holds.
pub(crate) fn register(fd: i32, entry: Arc<Entry>) {
    register_as(fd, entry, true);
}

fn register_as(fd: i32, entry: Arc<Entry>, owned: bool) {
    let replaced = {
        let mut s = slot(fd);
        PUBLISHED[fd as usize].store(Arc::as_ptr(&entry).cast_mut(), Release);
        s.replace(entry)
    };
    OWNED[fd as usize].store(owned, Relaxed);
    IS_CASCADE[fd as usize].store(true, Relaxed);
    if replaced.is_some() {
        hazard::wait_for_readers(fd);
    }
}

pub(crate) fn unregister(fd: i32) -> Option<Arc<Entry>> {
    if !is_cascade_fd(fd) {
        return None;
    }
    IS_CASCADE[fd as usize].store(false, Relaxed);
    OWNED[fd as usize].store(false, Relaxed);
    let entry = take_entry(&mut slot(fd), fd);
    entry.is_some().then(|| hazard::wait_for_readers(fd));
    entry
}

/// Takes `fd`'s entry out of its locked slot and unpublishes it; the caller waits for the
/// lock-free readers ([`hazard::wait_for_readers`]) before dropping it.
fn take_entry(slot: &mut SlotGuard<'_>, fd: i32) -> Option<Arc<Entry>> {
    PUBLISHED[fd as usize].store(std::ptr::null_mut(), Release);
    slot.take()
}

/// True if this process image holds `fd`'s reference (see [`OWNED`]).
pub(crate) fn owns(fd: i32) -> bool {
    is_cascade_fd(fd) && OWNED[fd as usize].load(Relaxed)
}

pub(crate) fn lookup(fd: i32) -> Option<Arc<Entry>> {
    if !is_cascade_fd(fd) {
        return None;
    }
    slot(fd).clone()
}

/// Runs `f` on `fd`'s entry without a lock or a reference count (the read and write paths:
/// [`hazard`] keeps the entry alive until `f` returns); None for a descriptor that is not
/// Cascade's. Calls on one descriptor may run at once, as in the kernel: the offset is
/// advanced under the file's lock (writes) or by compare-and-swap (reads).
#[inline]
pub(crate) fn with_entry<T>(fd: i32, f: impl FnOnce(&Entry, &Caller) -> T) -> Option<T> {
    if !is_cascade_fd(fd) {
        return None;
    }
    let Some(hazard) = hazard::Hazard::enter(fd) else {
        return slot(fd).as_deref().map(|e| f(e, &Caller(None)));
    };
    let entry = PUBLISHED[fd as usize].load(Acquire);
    // SAFETY: a published entry is owned by its slot; whoever unpublishes it waits until no
    // hazard record names `fd` (this one does until `hazard` drops) before dropping it.
    unsafe { entry.as_ref() }.map(|e| f(e, &Caller(Some(&hazard))))
}

/// A descriptor's entry held as [`with_entry`] holds it (by this thread's hazard record),
/// for a fast path that cannot panic, run before the panic boundary (the usual small
/// write). A struct and not a closure, so that the path inlines into the wrapper whole.
pub(crate) struct HeldEntry {
    hazard: hazard::Hazard,
    entry: std::ptr::NonNull<Entry>,
}

impl HeldEntry {
    /// `fd`'s entry; None where [`with_entry`] would take its slot lock's path or finds no
    /// entry.
    #[inline(always)]
    pub(crate) fn of(fd: i32) -> Option<HeldEntry> {
        let hazard = hazard::Hazard::enter(fd)?;
        let entry = PUBLISHED.get(usize::try_from(fd).ok()?)?.load(Acquire);
        Some(HeldEntry {
            hazard,
            entry: std::ptr::NonNull::new(entry)?,
        })
    }

    #[inline(always)]
    pub(crate) fn entry(&self) -> &Entry {
        // SAFETY: as in with_entry: the entry lives while this thread's hazard record names
        // its descriptor, which it does until `self.hazard` drops.
        unsafe { self.entry.as_ref() }
    }

    /// The calling thread's store lock holder value ([`Caller::holder`]).
    #[inline(always)]
    pub(crate) fn holder(&self) -> cascade_store::LockHolder {
        self.hazard.holder()
    }
}

/// The thread making a [`with_entry`] call: through its hazard record, or (the slot lock's
/// path) not.
pub(crate) struct Caller<'a>(Option<&'a hazard::Hazard>);

impl Caller<'_> {
    /// The thread's store lock holder value: kept in its hazard record, so that a write
    /// reads one per-thread word (the record's index), not a second one in the store.
    #[inline]
    pub(crate) fn holder(&self) -> cascade_store::LockHolder {
        match self.0 {
            Some(hazard) => hazard.holder(),
            None => cascade_store::LockHolder::this_thread(),
        }
    }
}

/// All registered descriptors (fork handler).
pub(crate) fn all_entries() -> Vec<(i32, Arc<Entry>)> {
    (0..MAX_FDS as i32)
        .filter(|&fd| is_cascade_fd(fd))
        .filter_map(|fd| lookup(fd).map(|e| (fd, e)))
        .collect()
}

// ---- process start, fork, exec ----------------------------------------------------------

/// Adopts Cascade descriptors inherited over exec: their memfds are named
/// `cascade-ofd:<slot>:<nonce>`, and the store's description table knows the rest.
fn adopt_inherited() {
    let handed: Vec<i32> = std::env::var(HANDED_FDS_ENV)
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.parse().ok())
        .collect();
    if !handed.is_empty() || std::env::var_os(HANDED_FDS_ENV).is_some() {
        // Loading runs before the program's threads: nothing reads the environment yet.
        std::env::remove_var(HANDED_FDS_ENV);
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for ent in dir.flatten() {
        let Some(fd) = ent.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(ent.path()) else {
            continue;
        };
        let Some(desc) = OpenDescription::from_fd_link(&target.to_string_lossy()) else {
            continue;
        };
        if fd as usize >= MAX_FDS {
            continue;
        }
        let Ok(store) = store() else { return };
        let Some(d) = store.description(desc) else {
            continue;
        };
        if let Ok(file) = store.reopen(d.ino(), d.generation(), d.flags()) {
            let is_dir = file.is_dir();
            register_as(
                fd,
                Arc::new(Entry {
                    file,
                    desc,
                    path: String::new(),
                    lock_fd: OnceLock::new(),
                    is_dir,
                }),
                handed.contains(&fd),
            );
        }
    }
}

/// False in a child that shares this process's memory (vfork, posix_spawn's clone): its
/// descriptors' references are the parent's, so it must not change the table (see
/// [`close_all_at_exit`]). The owner is recorded at load and in a fork child.
pub(crate) fn owns_its_table() -> bool {
    cascade_store::memory_owner::is_this_process()
}

/// Closes this process's Cascade descriptors at a normal end (exit, return from main, the
/// last thread ending, _exit), as the kernel closes the others, so that their files end
/// closed rather than torn: only a process killed while writing leaves a torn file. With
/// `flush` (exit, not _exit), stdio buffers are written first: glibc flushes them only
/// after the libraries' destructors. Entries whose lock another thread holds are left to
/// the kernel (and the store's sweep).
pub(crate) fn close_all_at_exit(flush: bool) {
    if !owns_its_table() {
        return;
    }
    if flush {
        // SAFETY: fflush(NULL) flushes every open stream.
        unsafe { libc::fflush(std::ptr::null_mut()) };
    }
    let Some(Ok(store)) = STORE_CELL.get() else {
        return;
    };
    for fd in 0..MAX_FDS as i32 {
        if !owns(fd) {
            continue;
        }
        let Some(mut entry) = ENTRIES[fd as usize].try_lock() else {
            continue;
        };
        IS_CASCADE[fd as usize].store(false, Relaxed);
        OWNED[fd as usize].store(false, Relaxed);
        if let Some(e) = take_entry(&mut entry, fd) {
            if hazard::has_readers(fd) {
                // In use by another thread: left like a held slot lock.
                PUBLISHED[fd as usize].store(Arc::as_ptr(&e).cast_mut(), Release);
                *entry = Some(e);
                continue;
            }
            store.release_description(e.desc);
            // SAFETY: closing a descriptor this process owns and no longer tracks.
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
    }
}

/// The child inherits every descriptor: each must name its description (not the anchor).
#[boundary]
extern "C" fn before_fork() {
    sysio::name_anchored_descriptors();
}

#[boundary]
extern "C" fn after_fork_in_child() {
    cascade_store::memory_owner::record();
    hazard::after_fork_in_child();
    // The parent's other threads are gone, and so is any slot lock one of them held.
    for (fd, lock) in ENTRIES.iter().enumerate() {
        if IS_CASCADE[fd].load(Relaxed) || lock.state.load(Relaxed) != 0 {
            lock.reset_in_child();
        }
    }
    // Every inherited Cascade descriptor is one more reference to its description, this
    // child's.
    for (fd, e) in all_entries() {
        if let Some(d) = e.description() {
            d.add_ref();
            OWNED[fd as usize].store(true, Relaxed);
        }
    }
    mapping::pins_after_fork();
}

#[boundary]
extern "C" fn on_load() {
    install_panic_hook();
    cascade_store::memory_owner::record();
    hazard::register_process();
    // The set*id wrappers report every change of the ids new files are given.
    cascade_store::ownership::creator_ids::keep();
    // SAFETY: registering a plain function as the fork child handler.
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_in_child)) };
    if std::env::var_os("CASCADE_CWD").is_some() {
        set_virtual_cwd(
            std::env::var("CASCADE_CWD")
                .ok()
                .filter(|c| c.starts_with('/')),
        );
    }
    adopt_inherited();
    stdio::adopt_standard_streams();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[boundary]
extern "C" fn on_unload() {
    close_all_at_exit(true);
    mapping::unpin_range(0, 0, true);
    // Hand this process's batch of free chunks back at a normal exit (the store handle is
    // static and never dropped); after kill -9 the next allocator-lock holder reclaims it.
    if let Some(Ok(s)) = STORE_CELL.get() {
        s.release_batch();
    }
}

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    /// A path under the mount is handed to the store as written, borrowed from the caller's
    /// string (no allocation on the usual call); only a path whose written form does not start
    /// with the mount is normalised into a new one. Assumes the default mount, `/cascade`
    /// (the test process does not set CASCADE_MOUNT).
    #[test]
    fn store_paths_borrow_the_callers_path_unless_it_needs_normalising() {
        let m = super::mount();
        let borrowed = |abs: &str, want: &str| match super::store_path_of(abs) {
            Some(Cow::Borrowed(p)) => assert_eq!(p, want, "{abs}"),
            other => panic!("{abs}: {other:?}, want borrowed {want}"),
        };
        borrowed(m, "/");
        borrowed(&format!("{m}/"), "/");
        borrowed(&format!("{m}/run/ckpt.0"), "/run/ckpt.0");
        // Lexically below the mount, walked by the store as written.
        borrowed(&format!("{m}/run/../ckpt.0"), "/run/../ckpt.0");
        borrowed(&format!("{m}/./x"), "/./x");
        match super::store_path_of(&format!("/{m}/x")) {
            Some(Cow::Owned(p)) => assert_eq!(p, "/x"),
            other => panic!("//cascade/x: {other:?}"),
        }
        for outside in [
            format!("{m}x/y"),
            format!("{m}/../etc"),
            "/etc/passwd".to_string(),
            "/".to_string(),
        ] {
            assert_eq!(super::store_path_of(&outside), None, "{outside}");
        }
        assert_eq!(super::join_store("/run", "a/b"), "/run/a/b");
        assert_eq!(super::join_store("/", "a"), "/a");
    }

    /// The panic boundary: a panic in a wrapper's body fails the call (its error value and
    /// errno EIO) instead of unwinding into C. Unit-tested here since the store no longer
    /// panics on a damaged block, the one way a program could make the library panic.
    #[test]
    fn a_panic_in_a_call_fails_it_with_eio() {
        super::set_errno(0);
        let r: i32 = super::catch_panic_or("test_call", -1, || panic!("deliberate"));
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EIO)
        );
    }
}
