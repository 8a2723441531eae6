//! posix_spawn, its file actions, system and popen. glibc runs them in a child that shares
//! the parent's memory (clone(CLONE_VM|CLONE_VFORK)) and opens, changes directory and
//! execs through internal calls, which no preload sees. So:
//!
//! - the program: a stored one is run by the plan of exec.rs;
//! - `addopen` of a store path opens the file in the parent at once (close-on-exec) and
//!   adds a `dup2` of it onto the child's descriptor instead; the parent's copy is closed by
//!   `posix_spawn_file_actions_destroy`. An open that fails is reported by posix_spawn, as
//!   glibc's child would make it. Differences from a kernel file system: the file is
//!   created or truncated when the action is added, not when the child runs, and a relative
//!   path is taken from the working directory then, not after an earlier `addchdir`;
//! - `addchdir_np` into the store is kept aside and given to the child as its virtual
//!   working directory (CASCADE_CWD); the child's kernel directory stays the parent's;
//! - the child is given one reference to every inheritable Cascade descriptor (and to each
//!   `addopen` one), named in its environment (HANDED_FDS_ENV), so that it gives them back
//!   when it ends; system and popen pass the environment as it is, so the list goes there
//!   for the duration of the call.

use super::process::{owned_fds, rewrite_env};
use super::*;
use libc::{c_int, c_uint, pid_t, posix_spawn_file_actions_t, posix_spawnattr_t};
use std::collections::HashMap;
use std::ffi::c_char;

/// An `addopen` of a store path: the child's action is a dup2 of `placeholder` (a
/// close-on-exec descriptor of /dev/null in the parent) onto `child_fd`; at posix_spawn the
/// store file is opened over the placeholder, and put back to /dev/null afterwards.
struct PendingOpen {
    placeholder: c_int,
    child_fd: c_int,
    path: String,
    oflag: c_int,
    mode: c_uint,
}

/// What the wrappers added to a file-actions object, by its address.
#[derive(Default)]
struct Extra {
    opens: Vec<PendingOpen>,
    /// The store directory of the last `addchdir_np` into the store, if no host one came after.
    cwd: Option<String>,
}

static EXTRAS: Mutex<Option<HashMap<usize, Extra>>> = Mutex::new(None);

fn with_extras<T>(f: impl FnOnce(&mut HashMap<usize, Extra>) -> T) -> T {
    let mut guard = EXTRAS.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// A close-on-exec descriptor of /dev/null, through the wrappers (not a Cascade one), or
/// over `at` when given.
fn dev_null(at: Option<c_int>) -> c_int {
    // SAFETY: a constant path; the raw call bypasses nothing Cascade needs.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    match at {
        Some(target) if fd >= 0 => {
            // SAFETY: the dup3 wrapper forgets a Cascade file at `target`, if any.
            unsafe { fds::dup3(fd, target, libc::O_CLOEXEC) };
            // SAFETY: our own descriptor.
            unsafe { sysio::close(fd) };
            target
        }
        _ => fd,
    }
}

/// # Safety
/// C ABI: `path` is NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "posix_spawn_file_actions_addopen"))]
#[boundary(libc::EIO)]
pub unsafe extern "C" fn posix_spawn_file_actions_addopen(
    actions: *mut posix_spawn_file_actions_t,
    fd: c_int,
    path: *const c_char,
    oflag: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: per the C contract.
    let Some(p) = (unsafe { classify(path) }) else {
        return call_real!(posix_spawn_file_actions_addopen: fn(*mut posix_spawn_file_actions_t, c_int, *const c_char, c_int, c_uint) -> c_int, libc::ENOSYS; actions, fd, path, oflag, mode);
    };
    if fd < 0 {
        return libc::EBADF;
    }
    let placeholder = dev_null(None);
    if placeholder < 0 {
        return errno_now();
    }
    let added = call_real!(posix_spawn_file_actions_adddup2: fn(*mut posix_spawn_file_actions_t, c_int, c_int) -> c_int, libc::ENOSYS; actions, placeholder, fd);
    if added != 0 {
        // SAFETY: our own descriptor.
        unsafe { sysio::close(placeholder) };
        return added;
    }
    with_extras(|x| {
        x.entry(actions as usize)
            .or_default()
            .opens
            .push(PendingOpen {
                placeholder,
                child_fd: fd,
                path: p.into_owned(),
                oflag,
                mode,
            })
    });
    0
}

fn errno_now() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Opens the pending store files of a spawn over their placeholders, in order; the first
/// failure is the spawn's errno (later files are not opened, as the child would not have).
fn open_pending(opens: &[(c_int, String, c_int, c_uint)]) -> Result<(), c_int> {
    for (placeholder, path, oflag, mode) in opens {
        let f =
            sysio::open_store_path(path, oflag | libc::O_CLOEXEC, *mode).map_err(|e| e.errno())?;
        // SAFETY: the dup3 wrapper shares the store file's entry at the placeholder.
        let r = unsafe { fds::dup3(f, *placeholder, libc::O_CLOEXEC) };
        // SAFETY: our own descriptor.
        unsafe { sysio::close(f) };
        if r < 0 {
            return Err(errno_now());
        }
    }
    Ok(())
}

/// # Safety
/// C ABI: `path` is NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "posix_spawn_file_actions_addchdir_np"))]
#[boundary(libc::EIO)]
pub unsafe extern "C" fn posix_spawn_file_actions_addchdir_np(
    actions: *mut posix_spawn_file_actions_t,
    path: *const c_char,
) -> c_int {
    // SAFETY: per the C contract.
    match unsafe { classify(path) } {
        Some(p) => {
            with_extras(|x| x.entry(actions as usize).or_default().cwd = Some(p.into_owned()));
            0
        }
        None => {
            with_extras(|x| {
                if let Some(extra) = x.get_mut(&(actions as usize)) {
                    extra.cwd = None;
                }
            });
            call_real!(posix_spawn_file_actions_addchdir_np: fn(*mut posix_spawn_file_actions_t, *const c_char) -> c_int, libc::ENOSYS; actions, path)
        }
    }
}

/// # Safety
/// C ABI.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "posix_spawn_file_actions_destroy"))]
#[boundary(libc::EIO)]
pub unsafe extern "C" fn posix_spawn_file_actions_destroy(
    actions: *mut posix_spawn_file_actions_t,
) -> c_int {
    if let Some(extra) = with_extras(|x| x.remove(&(actions as usize))) {
        for open in extra.opens {
            // SAFETY: our own placeholder descriptor.
            unsafe { sysio::close(open.placeholder) };
        }
    }
    call_real!(posix_spawn_file_actions_destroy: fn(*mut posix_spawn_file_actions_t) -> c_int, libc::ENOSYS; actions)
}

/// One reference more for the child to every description in `entries`; undone by
/// [`give_back`] when the child did not start.
fn take_refs(entries: &[Arc<Entry>]) {
    for e in entries {
        if let Some(d) = e.description() {
            d.add_ref();
        }
    }
}

fn give_back(entries: &[Arc<Entry>]) {
    if let Ok(s) = store() {
        for e in entries {
            s.release_description(e.desc);
        }
    }
}

/// The descriptors a child inherits with a reference of its own: the inheritable Cascade
/// ones this image holds, and the targets of `addopen`s (`opened`: placeholder and child
/// descriptor, the store file open at the placeholder). As (child fd, entry).
fn inherited(opened: &[(c_int, c_int)]) -> Vec<(c_int, Arc<Entry>)> {
    if !owns_its_table() {
        return Vec::new();
    }
    super::sysio::name_anchored_descriptors();
    let mut out = owned_fds(false);
    for &(placeholder, child_fd) in opened {
        if let Some(e) = lookup(placeholder) {
            out.retain(|(fd, _)| *fd != child_fd);
            out.push((child_fd, e));
        }
    }
    out
}

/// glibc's posix_spawn or posix_spawnp.
type RealSpawn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const posix_spawn_file_actions_t,
    *const posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// posix_spawn and posix_spawnp.
///
/// # Safety
/// C ABI of posix_spawn.
unsafe fn spawn(real: RealSpawn, search: bool, args: SpawnArgs) -> c_int {
    let actions = args.2;
    let (cwd, opens) = with_extras(|x| {
        let extra = (!actions.is_null())
            .then(|| x.get(&(actions as usize)))
            .flatten();
        let opens: Vec<(c_int, String, c_int, c_uint, c_int)> = extra.map_or_else(Vec::new, |e| {
            e.opens
                .iter()
                .map(|o| (o.placeholder, o.path.clone(), o.oflag, o.mode, o.child_fd))
                .collect()
        });
        (extra.and_then(|e| e.cwd.clone()), opens)
    });
    let pending: Vec<(c_int, String, c_int, c_uint)> = opens
        .iter()
        .map(|(p, path, flag, mode, _)| (*p, path.clone(), *flag, *mode))
        .collect();
    // The placeholders go back to /dev/null however the spawn ends (the actions may be used
    // again).
    let reset = || {
        for (placeholder, ..) in &opens {
            dev_null(Some(*placeholder));
        }
    };
    if let Err(errno) = open_pending(&pending) {
        reset();
        return errno;
    }
    let opened: Vec<(c_int, c_int)> = opens.iter().map(|(p, .., child)| (*p, *child)).collect();
    let children = inherited(&opened);
    // SAFETY: the caller's arguments, per the C contract.
    let r = unsafe { spawn_opened(real, search, args, cwd, children) };
    reset();
    r
}

/// The arguments of posix_spawn, as the caller gave them.
type SpawnArgs = (
    *mut pid_t,
    *const c_char,
    *const posix_spawn_file_actions_t,
    *const posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
);

/// posix_spawn once the store files of `addopen`s are open: the plan for a stored program,
/// the environment, and the child's references (`children`).
///
/// # Safety
/// `args` per the C contract of posix_spawn.
unsafe fn spawn_opened(
    real: RealSpawn,
    search: bool,
    args: SpawnArgs,
    cwd: Option<String>,
    children: Vec<(c_int, Arc<Entry>)>,
) -> c_int {
    let (pid, path, actions, attr, argv, envp) = args;
    if let Some(dir) = &cwd {
        let is_dir = store().and_then(|s| s.stat(dir)).map(|m| m.is_dir());
        match is_dir {
            Ok(true) => {}
            Ok(false) => return libc::ENOTDIR,
            Err(e) => return e.errno(),
        }
    }
    // A bare name for posix_spawnp is searched by glibc on the host's PATH.
    // SAFETY: NUL-terminated per the contract.
    let bare = search && !unsafe { CStr::from_ptr(path) }.to_bytes().contains(&b'/');
    let argv = argv as *const *const c_char;
    let plan = if bare {
        None
    } else {
        // SAFETY: per the contract.
        unsafe { exec::plan(path, argv) }
    };
    let plan = match plan {
        Some(Err(e)) => return e.errno(),
        Some(Ok(plan)) => Some(plan),
        None => None,
    };
    let handed: Vec<c_int> = children.iter().map(|(fd, _)| *fd).collect();
    // SAFETY: per the contract.
    let env = unsafe { rewrite_env(envp as *const *const c_char, cwd, &handed) };
    let entries: Vec<Arc<Entry>> = children.into_iter().map(|(_, e)| e).collect();
    take_refs(&entries);
    let (run_path, args) = match &plan {
        Some(plan) => (plan.path.as_ptr(), plan.argv_ptrs(argv)),
        None => (path, Vec::new()),
    };
    let run_argv = if plan.is_some() { args.as_ptr() } else { argv };
    // SAFETY: forwarding the caller's arguments, with the path, argv and environment
    // replaced by ones that live until the call returns.
    let r = unsafe {
        real(
            pid,
            run_path,
            actions,
            attr,
            run_argv as *const *mut c_char,
            env.ptrs.as_ptr() as *const *mut c_char,
        )
    };
    if r != 0 {
        give_back(&entries);
    }
    r
}

macro_rules! spawn_wrapper {
    ($name:ident, $search:expr) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary(libc::EIO)]
        pub unsafe extern "C" fn $name(
            pid: *mut pid_t,
            path: *const c_char,
            actions: *const posix_spawn_file_actions_t,
            attr: *const posix_spawnattr_t,
            argv: *const *mut c_char,
            envp: *const *mut c_char,
        ) -> c_int {
            let Some(real) = real!($name: fn(*mut pid_t, *const c_char, *const posix_spawn_file_actions_t, *const posix_spawnattr_t, *const *mut c_char, *const *mut c_char) -> c_int) else {
                return libc::ENOSYS;
            };
            // SAFETY: per the C contract.
            unsafe { spawn(real, $search, (pid, path, actions, attr, argv, envp)) }
        }
    };
}
spawn_wrapper!(posix_spawn, false);
spawn_wrapper!(posix_spawnp, true);

/// Runs `call` (system or popen, which start `/bin/sh` with the process's environment)
/// with CASCADE_CWD and the handed descriptors set in that environment, and the child's
/// references taken; `started(result)` says whether a child was started.
fn with_child_env<T>(call: impl FnOnce() -> T, started: impl Fn(&T) -> bool) -> T {
    let children = inherited(&[]);
    let handed: Vec<String> = children.iter().map(|(fd, _)| fd.to_string()).collect();
    let entries: Vec<Arc<Entry>> = children.into_iter().map(|(_, e)| e).collect();
    let previous_cwd = std::env::var_os("CASCADE_CWD");
    match virtual_cwd() {
        Some(cwd) => std::env::set_var("CASCADE_CWD", cwd),
        None => std::env::remove_var("CASCADE_CWD"),
    }
    if !handed.is_empty() {
        std::env::set_var(HANDED_FDS_ENV, handed.join(","));
    }
    take_refs(&entries);
    let result = call();
    if !started(&result) {
        give_back(&entries);
    }
    std::env::remove_var(HANDED_FDS_ENV);
    match previous_cwd {
        Some(cwd) => std::env::set_var("CASCADE_CWD", cwd),
        None => std::env::remove_var("CASCADE_CWD"),
    }
    result
}

/// # Safety
/// C ABI: `command` is null or NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "system"))]
#[boundary]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    if command.is_null() {
        return call_real!(system: fn(*const c_char) -> c_int, 0; command);
    }
    with_child_env(
        || call_real!(system: fn(*const c_char) -> c_int, -1; command),
        |status| *status != -1,
    )
}

/// # Safety
/// C ABI: `command` and `mode` are NUL-terminated.
#[cfg_attr(not(cascade_wrap), no_mangle)]
#[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", "popen"))]
#[boundary]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    with_child_env(
        || call_real!(popen: fn(*const c_char, *const c_char) -> *mut libc::FILE, std::ptr::null_mut(); command, mode),
        |stream| !stream.is_null(),
    )
}
