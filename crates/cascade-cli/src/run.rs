//! `cascade run -- CMD ARGS...`: runs a program with libcascade.so preloaded, so that paths
//! under the mount prefix are files of the node store. The `cascade run`s of a node (one per
//! rank) share the store and one agent, and the last to end runs the end of the job
//! ([`ranks`], docs/agent.md).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cascade_config::Config;
use cascade_store::Store;

use crate::binary::companion_paths;
use crate::failure::{Failure, EXIT_USAGE};
use crate::lifecycle::EmbeddedAgent;

mod ranks;
use cascade_agent::CheckpointRules;
use ranks::Ranks;

/// The preload library's file name.
pub const PRELOAD_LIB: &str = "libcascade.so";
/// Environment variable that names the preload library explicitly.
pub const PRELOAD_LIB_ENV: &str = "CASCADE_PRELOAD_LIB";

/// Signals `cascade run` passes on to its child instead of dying of them itself.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How long `cascade run` with an embedded agent waits at the end for the job's checkpoints
/// to reach the durable store.
const DRAIN_AT_EXIT: Duration = Duration::from_secs(3600);

/// Exit codes for a command that could not be started, as shells use them.
const EXIT_CANNOT_EXECUTE: u8 = 126;
const EXIT_NOT_FOUND: u8 = 127;

/// Fails (exit 2) when no command was given; checked before anything else happens.
pub fn require_command(command: &[OsString]) -> Result<(), Failure> {
    if command.is_empty() {
        return Err(Failure {
            message: "run: no command given (usage: cascade run [--mount PATH] -- CMD [ARGS...])"
                .to_string(),
            code: EXIT_USAGE,
        });
    }
    Ok(())
}

pub fn run(config: &Config, command: &[OsString]) -> Result<ExitCode, Failure> {
    require_command(command)?;
    let library = find_preload_lib()?;
    // Block the forwarded signals before anything else, so every thread of this process
    // (the store's prefault thread too) inherits the mask and none dies of them; they stay
    // pending until the forwarding thread collects them, after the child exists.
    let signals = SignalSet::block(&FORWARDED)?;
    // The prefix exists as an (empty) host directory, like a mount point, so that paths the
    // kernel resolves itself ("/cascade/..", a host dirfd walking into it) behave. Best
    // effort: without permission to create it, everything else still works. Made before the
    // umask below: it is no checkpoint data.
    let _ = std::fs::create_dir_all(config.mount_prefix());
    // Checkpoint data the embedded agent writes is private; the program gets this umask back.
    let user_umask = crate::umask::restrict(config)?;
    let durable = EmbeddedAgent::open_configured(config)?;
    let store = attach_or_create(config)?;
    // Joining and starting the agent under the registry's lock: a rank ending meanwhile
    // either sees this one alive, or has stopped its agent before this one looks for one.
    let mut ranks = Ranks::of_store(store.name());
    let embedded = {
        let lock = ranks.lock()?;
        ranks.join(&lock, &store)?;
        EmbeddedAgent::start_if_needed(config, &store, durable)?
    };
    let ran = run_child(config, &store, &library, command, signals, user_umask);
    let outcome = match &ran {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!(
            "rank pid {} exited with {status}",
            std::process::id()
        )),
        Err(failure) => Some(format!(
            "rank pid {}: {}",
            std::process::id(),
            failure.message
        )),
    };
    let ended = end_of_rank(config, &store, &mut ranks, embedded, outcome.as_deref());
    if let Err(failure) = &ended {
        eprintln!("cascade: {}", failure.message);
    }
    let code = exit_code(ran?);
    if ended.is_err() && code == 0 {
        return Ok(ExitCode::from(crate::failure::EXIT_FAILURE));
    }
    drop(store);
    Ok(ExitCode::from(code))
}

/// Runs the command with the library preloaded, passing the forwarded signals on to it.
fn run_child(
    config: &Config,
    store: &Store,
    library: &Path,
    command: &[OsString],
    signals: SignalSet,
    user_umask: libc::mode_t,
) -> Result<std::process::ExitStatus, Failure> {
    let mut child_command = std::process::Command::new(&command[0]);
    child_command
        .args(&command[1..])
        .env("LD_PRELOAD", preload_value(library))
        .env("CASCADE_STORE", store.name())
        .env("CASCADE_MOUNT", config.mount_prefix())
        // The child maps the store in when it attaches it, not at its first checkpoint
        // (cascade-preload: `is_the_job`); its own children do not.
        .env("CASCADE_MAP_IN_PARENT", std::process::id().to_string());
    for var in secret_variables() {
        child_command.env_remove(var);
    }
    let unblock = signals.set;
    // SAFETY: the closure runs in the forked (single-threaded) child before exec and only
    // calls umask and sigprocmask, which are async-signal-safe.
    unsafe {
        child_command.pre_exec(move || {
            // The program's own files follow the umask it was started with.
            libc::umask(user_umask);
            // The child gets the signal mask this process started with, not our blocking.
            if libc::sigprocmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut()) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let child = child_command
        .spawn()
        .map_err(|e| spawn_failure(&command[0], &e))?;
    wait_forwarding(child, signals)
}

/// Variables holding a secret Cascade itself consumed, which the application does not get:
/// the staging secret and job credential, Cascade's own S3 secret key and session token, and a durable-store URL
/// (durable.url, stage_server.drain_to) that carries a secret key. AWS_* credentials stay:
/// they are every AWS tool's, and the application may use them itself (docs/security.md).
fn secret_variables() -> Vec<OsString> {
    let always = [
        "CASCADE_STAGING_SECRET",
        "CASCADE_STAGING_CREDENTIAL",
        "CASCADE_S3_SECRET_ACCESS_KEY",
        "CASCADE_S3_SESSION_TOKEN",
    ];
    let mut vars: Vec<OsString> = always.iter().map(OsString::from).collect();
    for url_var in ["CASCADE_DURABLE", "CASCADE_STAGE_DRAIN_TO"] {
        match std::env::var(url_var) {
            Ok(url) if cascade_secret::redact_url(&url) == url => {}
            Err(std::env::VarError::NotPresent) => {}
            // With a secret in it, or not UTF-8 (not checked, so not passed on either).
            _ => vars.push(OsString::from(url_var)),
        }
    }
    vars
}

/// The end of one rank (`failure`: how it failed, if it did). The last live rank of the node
/// runs the end of the job; the rank holding the embedded agent keeps it running until every
/// other rank has ended, then drains and stops it; a last rank that finds no agent alive (its
/// holder was killed) starts one just to drain, when a durable store is configured. With a
/// node-level agent nobody drains here: that is the epilog's `cascade drain`/`cascade wait`.
fn end_of_rank(
    config: &Config,
    store: &Store,
    ranks: &mut Ranks,
    mut embedded: Option<EmbeddedAgent>,
    failure: Option<&str>,
) -> Result<(), Failure> {
    if let Some(what) = failure {
        ranks.record_failure(&ranks.lock()?, what);
    }
    let expected = ranks_expected(config);
    let mut waited_for_ranks = false;
    loop {
        let lock = ranks.lock()?;
        if !ranks.others_alive(&lock).is_empty() {
            if embedded.is_none() {
                // Another rank ends the job (and the agent, if it holds it).
                ranks.leave(&lock);
                return Ok(());
            }
            drop(lock);
            wait_for_other_ranks(ranks);
            continue;
        }
        // A rank that ends before its neighbour on the node has started is not the last: wait
        // (a while) for the ranks the launcher started here to join.
        if let Some((expected, from)) = expected.as_ref().filter(|_| !waited_for_ranks) {
            let expected = *expected;
            if ranks.joined() < expected as usize {
                drop(lock);
                waited_for_ranks = !wait_for_ranks_to_join(ranks, expected as usize);
                if waited_for_ranks {
                    eprintln!(
                        "cascade: {} of {expected} ranks on this node ({from}) ran under \
                         'cascade run' within {} s; ending the job on this node without the others",
                        ranks.joined(),
                        RANKS_JOIN_WAIT.as_secs()
                    );
                }
                continue;
            }
        }
        // The last live rank of the node: the end of the job is this one's.
        let before = ranks.round_start(&lock, store);
        let rules = CheckpointRules::parse(config.text("checkpoint.rules")).unwrap_or_default();
        crate::lifecycle::end_of_job(store, ranks.all_succeeded(&lock), before.as_ref(), &rules);
        // Ranks joining from now on start over (best effort: without the record, the next
        // end of the job commits by what is not durable yet, as a single `cascade run` did).
        let _ = ranks.start_round(&lock, store);
        if embedded.is_none() && store.agent_pid().is_none() {
            let durable = EmbeddedAgent::open_configured(config)?;
            embedded = EmbeddedAgent::start_if_needed(config, store, durable)?;
        }
        let Some(agent) = &embedded else {
            ranks.leave(&lock);
            return Ok(());
        };
        drop(lock);
        let drained = agent.drain(DRAIN_AT_EXIT);
        let lock = ranks.lock()?;
        if !ranks.others_alive(&lock).is_empty() {
            // Ranks joined during the drain: the agent serves them, and the job ends again
            // when they have.
            continue;
        }
        if let Some(agent) = embedded.take() {
            agent.stop();
        }
        ranks.leave(&lock);
        return drained;
    }
}

/// How often the rank holding the agent looks whether the other ranks have ended.
const RANKS_POLL: Duration = Duration::from_millis(20);

/// How long the last live rank on a node waits for the node's other ranks to start.
const RANKS_JOIN_WAIT: Duration = Duration::from_secs(10);

/// How many ranks the job runs on this node (`job.node_ranks`; None: do not wait), and
/// where that came from.
fn ranks_expected(config: &Config) -> Option<(u32, String)> {
    let n = u32::try_from(config.number("job.node_ranks")).ok()?;
    let source = config.get("job.node_ranks")?.source.to_string();
    (n > 0).then_some((n, source))
}

/// Waits until `expected` ranks have joined the round or another rank is alive (true), or
/// [`RANKS_JOIN_WAIT`] went by (false).
fn wait_for_ranks_to_join(ranks: &Ranks, expected: usize) -> bool {
    let deadline = Instant::now() + RANKS_JOIN_WAIT;
    while Instant::now() < deadline {
        if ranks.joined() >= expected || ranks.any_other_alive() {
            return true;
        }
        std::thread::sleep(RANKS_POLL);
    }
    false
}

/// Returns once no other rank is alive (they ended, or were killed).
fn wait_for_other_ranks(ranks: &Ranks) {
    while ranks.any_other_alive() {
        std::thread::sleep(RANKS_POLL);
    }
}

/// The exit code of `cascade run`: the child's, or 128 + the signal that killed it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        (None, None) => u8::MAX,
    }
}

fn spawn_failure(program: &OsStr, err: &std::io::Error) -> Failure {
    let shown = program.to_string_lossy();
    match err.kind() {
        std::io::ErrorKind::NotFound => Failure {
            message: format!("{shown}: command not found"),
            code: EXIT_NOT_FOUND,
        },
        _ => Failure {
            message: format!("{shown}: {}", cascade_config::io_text(err)),
            code: EXIT_CANNOT_EXECUTE,
        },
    }
}

/// Attaches the configured store, or creates it with the configured parameters when there
/// is none. An existing store is used as it is, whatever its parameters.
pub fn attach_or_create(config: &Config) -> Result<Store, Failure> {
    let name = config.store_name();
    // A store another process has just created is empty until its creator sizes it: the
    // ranks of a node start at once, so one of them may look in between. It tries again
    // while the store is empty, and once more after it has been sized.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut sized_since = false;
    loop {
        match attach_or_create_once(config) {
            Err(_) if !sized_since && std::time::Instant::now() < deadline => {
                sized_since = !being_created(name);
                if !sized_since {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            done => return done,
        }
    }
}

/// The store `name` exists but has no size yet: its creator is between creating and sizing
/// it.
fn being_created(name: &str) -> bool {
    let path = Path::new("/dev/shm").join(name.trim_start_matches('/'));
    std::fs::metadata(path).is_ok_and(|meta| meta.len() == 0)
}

fn attach_or_create_once(config: &Config) -> Result<Store, Failure> {
    let name = config.store_name();
    let failed = |err: &cascade_store::Error| Failure::store(&format!("store {name}"), err);
    match Store::attach(name) {
        Ok(store) => Ok(store),
        Err(err) if err.errno() == libc::ENOENT => {
            let params = config.store_config()?;
            match Store::create(&params) {
                Ok(store) => Ok(store),
                // Another process created it in between: use theirs.
                Err(err) if err.errno() == libc::EEXIST => {
                    Store::attach(name).map_err(|e| failed(&e))
                }
                Err(err) => Err(failed(&err)),
            }
        }
        Err(err) => Err(failed(&err)),
    }
}

/// Finds libcascade.so: `$CASCADE_PRELOAD_LIB` if set, else next to the `cascade`
/// executable, else in `../lib` from it. The result is absolute and usable in LD_PRELOAD.
pub fn find_preload_lib() -> Result<PathBuf, Failure> {
    let found = match std::env::var_os(PRELOAD_LIB_ENV).filter(|v| !v.is_empty()) {
        Some(value) => {
            let path = PathBuf::from(&value);
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => path,
                Ok(_) => {
                    return Err(Failure::new(format!(
                        "{PRELOAD_LIB_ENV}={}: not a file",
                        path.display()
                    )))
                }
                Err(e) => {
                    return Err(Failure::new(format!(
                        "{PRELOAD_LIB_ENV}={}: {}",
                        path.display(),
                        cascade_config::io_text(&e)
                    )))
                }
            }
        }
        None => {
            let candidates = companion_paths(PRELOAD_LIB)?;
            match candidates.iter().find(|p| p.is_file()) {
                Some(path) => path.clone(),
                None => {
                    let looked: Vec<String> =
                        candidates.iter().map(|p| p.display().to_string()).collect();
                    return Err(Failure::new(format!(
                        "cannot find {PRELOAD_LIB} (looked for {}); build it with 'cargo build \
-p cascade-preload' or set {PRELOAD_LIB_ENV} to its path",
                        looked.join(" and ")
                    )));
                }
            }
        }
    };
    let absolute =
        std::path::absolute(&found).map_err(|e| Failure::io(&found.display().to_string(), &e))?;
    let absolute = normalise(&absolute);
    if absolute
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|b| b" :".contains(b))
    {
        return Err(Failure::new(format!(
            "{}: LD_PRELOAD cannot hold a path with a space or a colon; set {PRELOAD_LIB_ENV} to \
a path without them",
            absolute.display()
        )));
    }
    Ok(absolute)
}

/// Removes "." and resolves ".." lexically ("/x/bin/../lib" is "/x/lib").
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// LD_PRELOAD for the child: our library first, then whatever was preloaded already (minus
/// our own library, so nested `cascade run`s do not load it twice).
fn preload_value(library: &Path) -> OsString {
    let ours = library.as_os_str().as_bytes();
    let mut value = ours.to_vec();
    if let Some(existing) = std::env::var_os("LD_PRELOAD") {
        for entry in existing
            .as_bytes()
            .split(|b| b" :".contains(b))
            .filter(|entry| !entry.is_empty() && *entry != ours)
        {
            value.push(b':');
            value.extend_from_slice(entry);
        }
    }
    OsString::from_vec(value)
}

/// Signals blocked in this thread (and so in every thread it starts).
struct SignalSet {
    set: libc::sigset_t,
}

impl SignalSet {
    fn block(signals: &[libc::c_int]) -> Result<SignalSet, Failure> {
        // SAFETY: sigemptyset/sigaddset initialise and fill a local set; pthread_sigmask
        // only changes this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &signal in signals {
                libc::sigaddset(&mut set, signal);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                let err = std::io::Error::from_raw_os_error(rc);
                return Err(Failure::io("blocking signals", &err));
            }
            Ok(SignalSet { set })
        }
    }

    /// Waits for one of the signals; returns it and whether the kernel sent it (the
    /// terminal's ^C, or a hangup, which reach the whole foreground process group).
    fn wait(&self) -> Option<(libc::c_int, bool)> {
        loop {
            // SAFETY: siginfo_t is plain data; sigwaitinfo fills it.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: the set was initialised in block().
            let signal = unsafe { libc::sigwaitinfo(&self.set, &mut info) };
            if signal > 0 {
                return Some((signal, info.si_code == libc::SI_KERNEL));
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
        }
    }
}

/// The child's pid while it can be signalled; None once it has exited (it is not reaped
/// before this says so, so the pid cannot be reused while a signal is being sent to it).
type Running = Arc<Mutex<Option<libc::pid_t>>>;

/// Waits for the child while a thread forwards the blocked signals to it.
fn wait_forwarding(
    mut child: Child,
    signals: SignalSet,
) -> Result<std::process::ExitStatus, Failure> {
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| Failure::new(format!("child pid {} out of range", child.id())))?;
    let running: Running = Arc::new(Mutex::new(Some(pid)));
    let forwarder_running = Arc::clone(&running);
    std::thread::Builder::new()
        .name("cascade-signals".to_string())
        .spawn(move || forward(&signals, &forwarder_running))
        .map_err(|e| Failure::io("starting the signal-forwarding thread", &e))?;

    wait_until_exited(child.id()).map_err(|e| Failure::io("waiting for the command", &e))?;
    *running.lock().unwrap_or_else(PoisonError::into_inner) = None;
    child
        .wait()
        .map_err(|e| Failure::io("waiting for the command", &e))
}

/// Runs on its own thread until the process exits: passes each forwarded signal on to the
/// child, except those the kernel sent to the terminal's foreground process group, which
/// the child (in the same group) has received already.
fn forward(signals: &SignalSet, running: &Mutex<Option<libc::pid_t>>) {
    while let Some((signal, from_kernel)) = signals.wait() {
        if from_kernel {
            continue;
        }
        let child = *running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pid) = child {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Blocks until the child has terminated, leaving it unreaped (a zombie) for `Child::wait`.
fn wait_until_exited(pid: u32) -> std::io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child without reaping it.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                libc::id_t::from(pid),
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_resolves_dots_lexically() {
        assert_eq!(
            normalise(Path::new("/opt/cascade/bin/../lib/./libcascade.so")),
            PathBuf::from("/opt/cascade/lib/libcascade.so")
        );
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        use std::process::ExitStatus;
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
