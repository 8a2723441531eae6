//! `cascade run`, `cascade link-flags` and `cascade check-binary`, with the real binary.
//!
//! `run` tests use the real libcascade.so (built here with `cargo build -p cascade-preload`,
//! as the preload crate's own C tests do) and their own store, created by `run` itself with
//! small parameters and destroyed when the test's sandbox is dropped, also when it fails.
//! `check-binary` tests compile their subjects here: C programs with `cc` (dynamic, static
//! and static-PIE, and shared libraries with programs linked against them) and a Go program
//! with `go build`; they also walk the libraries of python3 and GROMACS's `gmx` (Debian
//! package gromacs).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use cascade_testkit::{
    build, output_within, preload_library, repo_root, wait_output, with_default_signal_actions,
};

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
const MIB: u64 = 1 << 20;
/// How long a child process may take before a test gives up on it.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The functions of intercepted.txt: (wrapped, covered through glibc).
fn intercepted() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(repo_root().join("crates/cascade-preload/intercepted.txt"))
        .expect("read intercepted.txt");
    let mut wrapped = BTreeSet::new();
    let mut glibc = BTreeSet::new();
    for line in text.lines() {
        let entry = line.split('#').next().unwrap_or_default().trim();
        match entry.strip_prefix('=') {
            Some(name) => glibc.insert(name.trim().to_string()),
            None if !entry.is_empty() => wrapped.insert(entry.to_string()),
            None => false,
        };
    }
    (wrapped, glibc)
}

static NEXT_STORE: AtomicUsize = AtomicUsize::new(0);

/// One test's temp dir, store name and empty config file; `cascade` runs with only these
/// (and PATH) in its environment. Stores made under the names in `stores` are destroyed on
/// drop.
struct Sandbox {
    dir: TempDir,
    store: String,
    config_file: PathBuf,
    stores: Vec<String>,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        let n = NEXT_STORE.fetch_add(1, Ordering::Relaxed);
        let store = format!("/cascade-test-{}-run{n}", std::process::id());
        let config_file = dir.path().join("empty.toml");
        std::fs::write(&config_file, "").expect("write empty config");
        Sandbox {
            dir,
            stores: vec![store.clone()],
            store,
            config_file,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `cascade ARGS` (the given executable) with a clean environment: small, quick store
    /// parameters for a store that `run` creates, and the built libcascade.so.
    fn command_of(&self, exe: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(exe);
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("CASCADE_STORE", &self.store)
            .env("CASCADE_CONFIG", &self.config_file)
            .env("CASCADE_CAPACITY", "64MiB")
            .env("CASCADE_CHUNK_SIZE", "64KiB")
            .env("CASCADE_MAX_FILES", "1024")
            .env("CASCADE_SPILL_SIZE", "0")
            .env("CASCADE_PREFAULT", "off")
            .env("CASCADE_PRELOAD_LIB", preload_library());
        // The tests of signals expect their default actions, wherever the tests run from.
        with_default_signal_actions(&mut command);
        command
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_of(Path::new(CASCADE), args)
    }

    fn run(&self, args: &[&str]) -> Output {
        output_within(self.command(args), TIMEOUT)
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        succeeded(self.run(args), args)
    }

    fn status_json(&self) -> Value {
        serde_json::from_str(&self.ok(&["status", "--json"])).expect("status --json is JSON")
    }

    fn store_exists(&self) -> bool {
        Path::new(&format!("/dev/shm{}", self.store)).exists()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for store in &self.stores {
            // A test that never created this store gets an error here, which is fine.
            let _ = Command::new(CASCADE)
                .args(["--store", store, "destroy", "--force"])
                .env_clear()
                .env("CASCADE_CONFIG", &self.config_file)
                .output();
        }
    }
}

fn succeeded(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "cascade {args:?} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts exit `code` and exactly one line on stderr, starting "cascade: "; returns it.
fn failure_line(out: &Output, code: i32, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit; stderr: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "{what}: one line, got {stderr:?}"
    );
    assert!(stderr.starts_with("cascade: "), "{what}: {stderr:?}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr:?}");
    stderr.trim_end().to_string()
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------
// cascade run

#[test]
fn run_propagates_exit_codes_and_deaths_by_signal() {
    let sb = Sandbox::new();
    for (script, code) in [
        ("exit 0", 0),
        ("exit 7", 7),
        ("exit 255", 255),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
        ("kill -INT $$", 130),
    ] {
        let out = sb.run(&["run", "--", "sh", "-c", script]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "sh -c {script:?}: {out:?} stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The child's output passes straight through.
    let out = sb.run(&[
        "run",
        "sh",
        "-c",
        "echo to-stdout; echo to-stderr >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-stdout\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-stderr\n");
}

#[test]
fn run_gives_the_child_the_library_store_and_mount() {
    let sb = Sandbox::new();
    let show = "printf '%s\\n' \"$LD_PRELOAD\" \"$CASCADE_STORE\" \"$CASCADE_MOUNT\"";
    let lib = preload_library().display().to_string();

    let out = sb.ok(&["run", "--", "sh", "-c", show]);
    assert_eq!(out, format!("{lib}\n{}\n/cascade\n", sb.store));

    // --mount is normalised; CASCADE_MOUNT is the fallback.
    let out = sb.ok(&["run", "--mount", "/scratch//ckpt/", "--", "sh", "-c", show]);
    assert!(out.ends_with("\n/scratch/ckpt\n"), "{out}");
    let out = succeeded(
        output_within(
            {
                let mut c = sb.command(&["run", "--", "sh", "-c", show]);
                c.env("CASCADE_MOUNT", "/from/env");
                c
            },
            TIMEOUT,
        ),
        &["run"],
    );
    assert!(out.ends_with("\n/from/env\n"), "{out}");

    // --store names the store the child gets (and that run creates).
    let mut sb = sb;
    let other = format!("{}-other", sb.store);
    sb.stores.push(other.clone());
    let out = sb.ok(&["--store", &other, "run", "--", "sh", "-c", show]);
    assert_eq!(out, format!("{lib}\n{other}\n/cascade\n"));

    // An LD_PRELOAD already set stays, after ours; ours is not added twice.
    let mut command = sb.command(&["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\""]);
    command.env("LD_PRELOAD", format!("libm.so.6 {lib}"));
    let out = succeeded(output_within(command, TIMEOUT), &["run"]);
    let entries: Vec<&str> = out.trim_end().split([':', ' ']).collect();
    assert_eq!(entries, [lib.as_str(), "libm.so.6"]);

    // The library is really loaded into the child (grep reads its own memory map).
    let out = sb.ok(&[
        "run",
        "--",
        "grep",
        "-c",
        "libcascade.so",
        "/proc/self/maps",
    ]);
    let count: u32 = out.trim().parse().expect("grep -c prints a count");
    assert!(count > 0, "libcascade.so is not mapped in the child");

    // A bad mount prefix is a one-line error before anything runs.
    let out = sb.run(&["run", "--mount", "relative", "--", "sh", "-c", "echo ran"]);
    let err = failure_line(&out, 1, "run --mount relative");
    assert!(err.contains("--mount=\"relative\""), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn run_creates_the_store_when_missing_keeps_it_attached_and_leaves_it() {
    let sb = Sandbox::new();
    assert!(!sb.store_exists());
    // The child is `cascade status`: the store exists while it runs, and `cascade run`
    // (the child's parent) is attached to it.
    let child = sb
        .command(&["run", "--", CASCADE, "status", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cascade run");
    let run_pid = u64::from(child.id());
    let out = wait_output(child, TIMEOUT).expect("the child");
    let stdout = succeeded(out, &["run", "--", "cascade", "status"]);
    let inner: Value = serde_json::from_str(&stdout).expect("status --json is JSON");
    assert_eq!(inner["name"], sb.store.as_str());
    let attached = inner["attached_pids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        attached.iter().any(|p| p.as_u64() == Some(run_pid)),
        "cascade run ({run_pid}) not attached while its child ran: {inner}"
    );
    // Created with the configured parameters.
    assert_eq!(inner["memory_capacity"], 64 * MIB);
    assert_eq!(inner["chunk_size"], 64 * 1024);
    assert_eq!(inner["max_files"], 1024);

    // Left in place, with nobody attached any more.
    assert!(sb.store_exists());
    let after = sb.status_json();
    assert_eq!(after["attached_pids"], serde_json::json!([]), "{after}");
}

#[test]
fn run_uses_an_existing_store_whatever_its_parameters() {
    let sb = Sandbox::new();
    sb.ok(&[
        "init",
        "--capacity",
        "2MiB",
        "--chunk-size",
        "4KiB",
        "--max-files",
        "16",
    ]);
    // The configured parameters (64 MiB, 64 KiB chunks) differ; run attaches all the same.
    let out = sb.ok(&["run", "--", "sh", "-c", "echo \"$CASCADE_STORE\""]);
    assert_eq!(out, format!("{}\n", sb.store));
    let status = sb.status_json();
    assert_eq!(status["memory_capacity"], 2 * MIB);
    assert_eq!(status["chunk_size"], 4096);
}

#[test]
fn run_without_a_command_is_a_usage_error() {
    let sb = Sandbox::new();
    for args in [
        &["run"][..],
        &["run", "--"],
        &["run", "--mount", "/x", "--"],
    ] {
        let out = sb.run(args);
        let err = failure_line(&out, 2, &format!("{args:?}"));
        assert!(err.contains("no command given"), "{err}");
        assert!(err.contains("cascade run"), "{err}");
    }
    assert!(
        !sb.store_exists(),
        "a run without a command created the store"
    );
}

#[test]
fn run_of_a_missing_or_unrunnable_program_exits_127_or_126() {
    let sb = Sandbox::new();
    let out = sb.run(&["run", "--", "no-such-program-4a7f"]);
    let err = failure_line(&out, 127, "missing program");
    assert_eq!(err, "cascade: no-such-program-4a7f: command not found");

    let not_executable = sb.path("data.txt");
    std::fs::write(&not_executable, "just text\n").expect("write file");
    let path = not_executable.to_str().expect("utf-8 temp path");
    let out = sb.run(&["run", "--", path]);
    let err = failure_line(&out, 126, "not executable");
    assert!(err.contains("Permission denied"), "{err}");
}

#[test]
fn run_finds_the_library_next_to_the_executable_or_in_lib() {
    let sb = Sandbox::new();
    let show = ["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\""];

    // An explicit CASCADE_PRELOAD_LIB that does not exist is an error, not a fallback.
    let mut command = sb.command(&show);
    command.env("CASCADE_PRELOAD_LIB", sb.path("missing.so"));
    let err = failure_line(
        &output_within(command, TIMEOUT),
        1,
        "missing CASCADE_PRELOAD_LIB",
    );
    assert!(
        err.contains("CASCADE_PRELOAD_LIB=") && err.contains("No such file"),
        "{err}"
    );

    // A copy of cascade with no library beside it or in ../lib.
    let bin = sb.path("prefix/bin");
    let lib = sb.path("prefix/lib");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    let exe = bin.join("cascade");
    std::fs::copy(CASCADE, &exe).expect("copy cascade");
    let alone = |exe: &Path| {
        let mut command = sb.command_of(exe, &show);
        command.env_remove("CASCADE_PRELOAD_LIB");
        output_within(command, TIMEOUT)
    };
    let err = failure_line(&alone(&exe), 1, "no library");
    assert!(err.contains("cannot find libcascade.so"), "{err}");
    assert!(err.contains("CASCADE_PRELOAD_LIB"), "{err}");

    // ../lib/libcascade.so, as installed; the path is given without "..".
    std::fs::create_dir_all(&lib).expect("mkdir lib");
    std::fs::copy(preload_library(), lib.join("libcascade.so")).expect("copy library");
    let out = succeeded(alone(&exe), &show);
    assert_eq!(out, format!("{}\n", lib.join("libcascade.so").display()));

    // Next to the executable wins over ../lib.
    std::fs::copy(preload_library(), bin.join("libcascade.so")).expect("copy library");
    let out = succeeded(alone(&exe), &show);
    assert_eq!(out, format!("{}\n", bin.join("libcascade.so").display()));
}

#[test]
fn run_forwards_termination_signals_to_the_child() {
    let sb = Sandbox::new();
    for (signal, code) in [
        (libc::SIGTERM, 143),
        (libc::SIGINT, 130),
        (libc::SIGHUP, 129),
    ] {
        // The child says it is running, then waits on its stdin, which stays open.
        let mut child = sb
            .command(&["run", "--", "sh", "-c", "echo ready; exec cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cascade run");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read ready");
        assert_eq!(line, "ready\n");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
        // SAFETY: signalling our own child process (cascade run), not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let out = wait_output(child, TIMEOUT).expect("the child");
        drop(stdin);
        let status: ExitStatus = out.status;
        // cascade run itself exits normally, with the code of a child killed by `signal`.
        assert_eq!(
            status.code(),
            Some(code),
            "signal {signal}: {status:?}, stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn run_help_explains_the_environment_and_exit_codes() {
    let sb = Sandbox::new();
    let help = sb.ok(&["run", "--help"]);
    for needle in [
        "LD_PRELOAD",
        "CASCADE_STORE",
        "CASCADE_MOUNT",
        "CASCADE_PRELOAD_LIB",
        "--mount",
        "/cascade",
        "128",
        "SIGTERM",
        "check-binary",
    ] {
        assert!(
            help.contains(needle),
            "run --help lacks {needle:?}:\n{help}"
        );
    }
    let top = sb.ok(&["--help"]);
    for command in ["run", "link-flags", "check-binary"] {
        assert!(top.contains(command), "{command} missing from --help");
    }
    let config = sb.ok(&["config"]);
    assert!(
        config
            .lines()
            .any(|l| l.starts_with("mount.prefix") && l.contains("/cascade")),
        "{config}"
    );
}

// ---------------------------------------------------------------------------------------
// cascade link-flags

#[test]
fn link_flags_wrap_every_wrapped_function_and_no_glibc_covered_one() {
    build(&["cascade-preload", "cascade-wrap"]); // libcascade_wrap.a, which link-flags names
    let sb = Sandbox::new();
    let out = sb.run(&["link-flags"]);
    assert!(out.status.success(), "{out:?}");
    let lines = stdout_lines(&out);
    let (wrapped, glibc) = intercepted();

    let flags: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("-Wl,--wrap="))
        .collect();
    assert!(flags.contains(&"open"), "{lines:?}");
    assert!(flags.contains(&"write"), "{lines:?}");
    let listed: BTreeSet<String> = flags.iter().map(|f| f.to_string()).collect();
    assert_eq!(listed.len(), flags.len(), "a function is wrapped twice");
    assert_eq!(listed, wrapped);
    for name in &glibc {
        assert!(!listed.contains(name), "{name} is covered through glibc");
    }
    assert!(lines.iter().all(|l| !l.contains("==")), "{lines:?}");

    // Then the static archive's path and the system libraries it needs.
    let others: Vec<&String> = lines.iter().filter(|l| !l.starts_with("-Wl,")).collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match others.as_slice() {
        [archive, libs @ ..] => {
            assert!(out.status.success(), "{stderr}");
            assert!(archive.ends_with("/libcascade_wrap.a"), "{archive}");
            assert!(Path::new(archive.as_str()).is_file());
            assert_eq!(
                libs.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
                ["-lpthread", "-ldl", "-lm", "-lrt"]
            );
            assert!(stderr.is_empty(), "{stderr}");
        }
        [] => panic!("no archive path: {stderr}"),
    }
}

// ---------------------------------------------------------------------------------------
// cascade check-binary

/// Compiles a C program with `cc` and returns the executable.
fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write C source");
    let exe = dir.join(name);
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .args(["-O0", "-U_FORTIFY_SOURCE", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {name} {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn check_binary(sb: &Sandbox, program: &Path) -> Output {
    check_binary_with(sb, program, &[])
}

/// check-binary with extra environment variables (LD_LIBRARY_PATH).
fn check_binary_with(sb: &Sandbox, program: &Path, env: &[(&str, &Path)]) -> Output {
    let mut command = sb.command(&["check-binary", program.to_str().expect("utf-8 path")]);
    for (name, value) in env {
        command.env(name, value);
    }
    output_within(command, TIMEOUT)
}

/// The lines of a report that say a needed library was not found.
fn not_found_lines(out: &Output) -> Vec<String> {
    stdout_lines(out)
        .into_iter()
        .filter(|l| l.contains(" => not found (needed by "))
        .collect()
}

/// The report of a dynamic program: the names said to be missing, and the summary line.
fn missing_names(out: &Output) -> (Vec<String>, String) {
    let (importers, summary) = missing_importers(out);
    (
        importers.into_iter().map(|(name, _)| name).collect(),
        summary,
    )
}

/// The report of a dynamic program: each missing name with the objects said to import it
/// (in report order), and the summary line. Not-found lines are left out.
fn missing_importers(out: &Output) -> (Vec<(String, Vec<String>)>, String) {
    let lines = stdout_lines(out);
    let (summary, listed) = lines.split_last().expect("check-binary printed nothing");
    let not_found = not_found_lines(out);
    let missing = listed
        .iter()
        .filter(|l| !not_found.contains(l))
        .map(|l| {
            assert!(l.contains("not intercepted: "), "{l}");
            let name = l.split_whitespace().next().unwrap_or_default().to_string();
            let (_, importers) = l.rsplit_once("; imported by ").expect("importers listed");
            (name, importers.split(", ").map(str::to_string).collect())
        })
        .collect();
    (missing, summary.clone())
}

/// The number in "... of PROG and its N libraries ..." of a summary line (0 without).
fn libraries_walked(summary: &str) -> usize {
    summary
        .split_once(" and its ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(|n| n.parse().expect("a count of libraries"))
        .unwrap_or(0)
}

const C_MAIN_IO: &str = r#"
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[16];
    int fd = open(argc > 1 ? argv[1] : "/dev/null", O_RDONLY);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n < 0;
}
"#;

#[test]
fn check_binary_of_a_program_using_only_intercepted_calls_passes() {
    let sb = Sandbox::new();
    let exe = compile_c(sb.dir.path(), "plain_io", C_MAIN_IO, &[]);
    let out = check_binary(&sb, &exe);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout,
        format!(
            "all 3 file-I/O imports of {} are intercepted\n",
            exe.display()
        )
    );
}

#[test]
fn check_binary_lists_the_file_io_imports_that_are_not_intercepted() {
    let sb = Sandbox::new();
    // File-I/O calls of several families, some of which Cascade is unlikely ever to
    // intercept (fanotify, file handles); which ones are missing comes from intercepted.txt.
    let source = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/fanotify.h>
#include <sys/xattr.h>
int main(void) {
    char name[] = "/tmp/check-binary-XXXXXX";
    char value[8];
    int fd = mkstemp(name);
    if (fd < 0) return 1;
    getxattr(name, "user.x", value, sizeof value);
    int watch = fanotify_init(0, 0);
    fanotify_mark(watch, FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, name);
    struct file_handle *handle = malloc(sizeof *handle + 128);
    int mount_id;
    handle->handle_bytes = 128;
    name_to_handle_at(AT_FDCWD, name, handle, &mount_id, 0);
    int again = open(name, O_RDONLY);
    read(again, value, 1);
    close(again);
    close(fd);
    unlink(name);
    return 0;
}
"#;
    let exe = compile_c(sb.dir.path(), "some_io", source, &[]);
    let out = check_binary(&sb, &exe);
    let (wrapped, glibc) = intercepted();
    let imported = [
        "close",
        "getxattr",
        "fanotify_mark",
        "mkstemp",
        "name_to_handle_at",
        "open",
        "read",
        "unlink",
    ];
    let expected: Vec<&str> = imported
        .iter()
        .copied()
        .filter(|n| !wrapped.contains(*n) && !glibc.contains(*n))
        .collect();
    assert!(out.stderr.is_empty(), "{out:?}");
    if expected.is_empty() {
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "all {} file-I/O imports of {} are intercepted\n",
                imported.len(),
                exe.display()
            )
        );
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let (mut names, summary) = missing_names(&out);
    names.sort();
    assert_eq!(names, expected);
    assert_eq!(
        summary,
        format!(
            "{} of {} file-I/O imports of {} are not intercepted",
            expected.len(),
            imported.len(),
            exe.display()
        )
    );
}

#[test]
fn check_binary_of_cat_agrees_with_its_exit_code_and_nm() {
    let sb = Sandbox::new();
    let cat = Path::new("/bin/cat");
    let out = check_binary(&sb, cat);
    let (wrapped, glibc) = intercepted();
    let nm = Command::new("nm")
        .args(["-D", "--undefined-only", "/bin/cat"])
        .output()
        .expect("run nm (binutils)");
    assert!(nm.status.success(), "nm failed");
    let imports: BTreeSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|s| s.split('@').next().unwrap_or(s).to_string())
        .collect();
    match out.status.code() {
        Some(0) => {
            let lines = stdout_lines(&out);
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(lines[0].starts_with("all "), "{lines:?}");
            assert!(lines[0].ends_with(" file-I/O imports of /bin/cat are intercepted"));
        }
        Some(1) => {
            let (names, summary) = missing_names(&out);
            assert!(!names.is_empty());
            assert!(
                summary.starts_with(&format!("{} of ", names.len()))
                    && summary.ends_with(" file-I/O imports of /bin/cat are not intercepted"),
                "{summary}"
            );
            for name in &names {
                assert!(imports.contains(name), "{name} is not imported by cat");
                assert!(!wrapped.contains(name) && !glibc.contains(name), "{name}");
            }
        }
        other => panic!("exit {other:?}: {out:?}"),
    }
    // cat reads and writes through read/write, which are intercepted: never listed.
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in ["open", "read", "write", "close"] {
        assert!(imports.contains(name), "cat does not import {name}?");
        assert!(
            !stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{stdout}"
        );
    }

    // A bare name is looked up in PATH, as a shell would.
    let by_name = sb.run(&["check-binary", "cat"]);
    assert_eq!(by_name.status.code(), out.status.code());
}

/// A shared library whose file I/O is mkstemp and nftw, which the program linked against it
/// does not call itself, and fanotify_mark, which it does.
const C_LIB_WALK: &str = r#"
#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/fanotify.h>
static int visit(const char *p, const struct stat *s, int flag, struct FTW *w) {
    (void)p; (void)s; (void)flag; (void)w;
    return 0;
}
int walk_scratch(const char *dir) {
    char name[] = "/tmp/check-binary-lib-XXXXXX";
    int fd = mkstemp(name);
    fanotify_mark(fanotify_init(0, 0), FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, dir);
    return fd + nftw(dir, visit, 4, FTW_PHYS);
}
"#;

/// A program whose own file I/O is open/read/close and fanotify_mark, and which calls
/// the library's walk_scratch.
const C_MAIN_WALK: &str = r#"
#include <fcntl.h>
#include <sys/fanotify.h>
#include <unistd.h>
int walk_scratch(const char *dir);
int main(int argc, char **argv) {
    char c;
    int fd = open("/dev/null", O_RDONLY);
    read(fd, &c, 1);
    close(fd);
    fanotify_mark(fanotify_init(0, 0), FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, "/");
    return walk_scratch(argc > 1 ? argv[1] : ".") < 0;
}
"#;

/// Builds `dir/libwalk.so.1` (soname libwalk.so.1) and returns it.
fn build_walk_library(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("library dir");
    compile_c(
        dir,
        "libwalk.so.1",
        C_LIB_WALK,
        &["-shared", "-fPIC", "-Wl,-soname,libwalk.so.1"],
    )
}

/// The file-I/O functions of the library and the program that are not intercepted, sorted.
fn walk_expected() -> Vec<&'static str> {
    let (wrapped, glibc) = intercepted();
    // The program's and the library's importer lists are checked on this one.
    assert!(
        !wrapped.contains("fanotify_mark") && !glibc.contains("fanotify_mark"),
        "these tests need a file-I/O function that Cascade does not intercept"
    );
    let mut expected: Vec<&str> = ["fanotify_mark", "mkstemp", "nftw"]
        .into_iter()
        .filter(|n| !wrapped.contains(*n) && !glibc.contains(*n))
        .collect();
    expected.sort();
    expected
}

/// The report on the walk program with libwalk.so.1 found: the library is the importer of
/// its own functions, both objects of fanotify_mark.
fn assert_walk_report(out: &Output, exe: &Path, what: &str) {
    assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
    assert!(out.stderr.is_empty(), "{what}: {out:?}");
    assert!(not_found_lines(out).is_empty(), "{what}: {out:?}");
    let (missing, summary) = missing_importers(out);
    let mut names: Vec<&str> = missing.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(names, walk_expected(), "{what}: {out:?}");
    for (name, importers) in &missing {
        let expected = if name == "fanotify_mark" {
            vec!["uses_walk", "libwalk.so.1"]
        } else {
            vec!["libwalk.so.1"]
        };
        assert_eq!(importers, &expected, "{what}: {name}");
    }
    // open, read, close, fanotify_mark, mkstemp, nftw.
    assert_eq!(
        summary,
        format!(
            "{} of 6 file-I/O imports of {} and its 1 library are not intercepted",
            missing.len(),
            exe.display()
        ),
        "{what}"
    );
}

#[test]
fn check_binary_walks_into_a_library_found_through_origin() {
    let sb = Sandbox::new();
    let lib_dir = sb.path("lib");
    let lib = build_walk_library(&lib_dir);
    // $ORIGIN is the program's directory for the dynamic linker: ../lib from bin/. Both
    // DT_RUNPATH (the default of current linkers) and the older DT_RPATH.
    let bin = sb.path("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    for tags in ["--enable-new-dtags", "--disable-new-dtags"] {
        let exe = compile_c(
            &bin,
            "uses_walk",
            C_MAIN_WALK,
            &[
                lib.to_str().expect("utf-8 path"),
                "-Wl,-rpath,$ORIGIN/../lib",
                &format!("-Wl,{tags}"),
            ],
        );
        // The dynamic linker agrees on where the library is.
        let ldd = Command::new("ldd").arg(&exe).output().expect("run ldd");
        let ldd = String::from_utf8_lossy(&ldd.stdout);
        let loaded = ldd
            .lines()
            .find_map(|l| l.trim().strip_prefix("libwalk.so.1 => "))
            .and_then(|rest| rest.split_whitespace().next())
            .map(|path| std::fs::canonicalize(path).expect("ldd's path exists"));
        assert_eq!(
            loaded,
            Some(std::fs::canonicalize(&lib).expect("lib")),
            "{tags}: {ldd}"
        );
        let out = check_binary(&sb, &exe);
        assert_walk_report(&out, &exe, tags);
    }
}

#[test]
fn check_binary_reports_a_library_that_is_not_found_and_finds_it_in_ld_library_path() {
    let sb = Sandbox::new();
    let lib_dir = sb.path("elsewhere");
    let lib = build_walk_library(&lib_dir);
    let exe = compile_c(
        sb.dir.path(),
        "uses_walk",
        C_MAIN_WALK,
        &[lib.to_str().expect("utf-8 path")],
    );

    let out = check_binary(&sb, &exe);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert_eq!(
        not_found_lines(&out),
        ["libwalk.so.1 => not found (needed by uses_walk); its imports are not checked"]
    );
    // The program's own imports are still checked.
    let (missing, summary) = missing_importers(&out);
    assert_eq!(
        missing,
        [("fanotify_mark".to_string(), vec!["uses_walk".to_string()])]
    );
    assert_eq!(
        summary,
        format!(
            "1 of 4 file-I/O imports of {} are not intercepted; 1 needed library was not found",
            exe.display()
        )
    );

    // LD_LIBRARY_PATH reaches it, as it reaches the dynamic linker.
    let out = check_binary_with(&sb, &exe, &[("LD_LIBRARY_PATH", &lib_dir)]);
    assert_walk_report(&out, &exe, "LD_LIBRARY_PATH");
}

/// check-binary on an installed program: it walks the program's libraries (as many as ldd
/// lists at most, glibc's own not walked), and every importer it names is the program or
/// one of them. Whether all is intercepted depends on intercepted.txt, so is not asserted.
fn assert_walks_libraries_of(program: &Path, at_least: usize) {
    let sb = Sandbox::new();
    let out = check_binary(&sb, program);
    assert!(out.stderr.is_empty(), "{out:?}");
    assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
    let ldd = Command::new("ldd").arg(program).output().expect("run ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
    let ldd_names: Vec<&str> = ldd
        .lines()
        .filter(|l| l.contains(" => /"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();

    assert!(not_found_lines(&out).is_empty(), "{out:?}");
    let (missing, summary) = missing_importers(&out);
    let walked = libraries_walked(&summary);
    assert!(
        walked >= at_least && walked <= ldd_names.len(),
        "{} walked {walked} libraries, ldd lists {}: {summary}\n{ldd}",
        program.display(),
        ldd_names.len()
    );
    let own_name = program
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    for (name, importers) in &missing {
        for importer in importers {
            assert!(
                *importer == own_name || ldd_names.contains(&importer.as_str()),
                "{name}: importer {importer} is not in ldd's list:\n{ldd}"
            );
        }
    }
    // Every file-I/O function the program and its libraries import is wrapped (issue 20).
    assert!(
        missing.is_empty() && out.status.code() == Some(0) && summary.starts_with("all "),
        "{} imports functions Cascade does not intercept: {missing:?}\n{summary}",
        program.display()
    );
}

#[test]
fn check_binary_walks_the_libraries_of_python3() {
    // libz and libexpat (Debian); libc and libm are glibc's.
    assert_walks_libraries_of(Path::new("/usr/bin/python3"), 1);
}

#[test]
fn check_binary_walks_the_libraries_of_gromacs() {
    let gmx = on_path("gmx").expect("no gmx: install the Debian package gromacs");
    // libgromacs and what it loads: libstdc++, libgomp, FFTW, BLAS, hwloc, ...
    assert_walks_libraries_of(&gmx, 10);
}

#[test]
fn check_binary_says_plainly_that_static_programs_are_out_of_reach() {
    let sb = Sandbox::new();
    for (name, flag) in [("static_io", "-static"), ("static_pie_io", "-static-pie")] {
        let exe = compile_c(sb.dir.path(), name, C_MAIN_IO, &[flag]);
        let out = check_binary(&sb, &exe);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stdout}");
        assert!(stdout.contains("statically linked"), "{flag}: {stdout}");
        assert!(
            stdout.contains("LD_PRELOAD cannot reach"),
            "{flag}: {stdout}"
        );
        assert!(stdout.contains("cascade mount"), "{flag}: {stdout}");
        assert!(!stdout.contains("Go"), "{flag}: {stdout}");
    }
}

/// A command on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The go command: on PATH, or where the Go distribution installs it.
fn go() -> PathBuf {
    on_path("go")
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
        .expect("no go command: install golang-go (scripts/test.sh does)")
}

#[test]
fn check_binary_says_plainly_that_go_programs_are_out_of_reach() {
    let sb = Sandbox::new();
    let src = sb.path("hello.go");
    std::fs::write(
        &src,
        "package main\n\nimport \"os\"\n\nfunc main() { os.WriteFile(\"/dev/null\", []byte(\"x\"), 0o644) }\n",
    )
    .expect("write Go source");
    let exe = sb.path("hello-go");
    let gocache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache");
    let out = Command::new(go())
        .arg("build")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .current_dir(sb.dir.path())
        .env("GOCACHE", &gocache)
        .env("GOTOOLCHAIN", "local")
        .env("GO111MODULE", "off")
        .env("CGO_ENABLED", "0")
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = check_binary(&sb, &exe);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("is a statically linked Go program"),
        "{stdout}"
    );
    assert!(stdout.contains("LD_PRELOAD cannot reach"), "{stdout}");
    assert!(stdout.contains("cascade mount"), "{stdout}");
}

#[test]
fn check_binary_of_something_that_is_not_a_program_is_a_one_line_error() {
    let sb = Sandbox::new();
    let text = sb.path("notes.txt");
    std::fs::write(&text, "not a program\n").expect("write text");
    let err = failure_line(&check_binary(&sb, &text), 2, "text file");
    assert_eq!(
        err,
        format!(
            "cascade: {}: not an ELF file (no ELF magic number)",
            text.display()
        )
    );

    let script = sb.path("job.sh");
    std::fs::write(&script, "#!/bin/bash -e\necho hi\n").expect("write script");
    let err = failure_line(&check_binary(&sb, &script), 2, "script");
    assert!(err.contains("script for /bin/bash -e"), "{err}");

    let missing = sb.path("absent");
    let err = failure_line(&check_binary(&sb, &missing), 2, "missing");
    assert_eq!(
        err,
        format!("cascade: {}: No such file or directory", missing.display())
    );
    let err = failure_line(&check_binary(&sb, sb.dir.path()), 2, "directory");
    assert!(err.ends_with(": Is a directory"), "{err}");

    // Truncated ELF: the magic number and nothing else that makes sense.
    let broken = sb.path("broken.elf");
    std::fs::write(&broken, b"\x7fELF\x02\x01\x01\0garbage").expect("write broken");
    let err = failure_line(&check_binary(&sb, &broken), 2, "broken ELF");
    assert!(err.contains("not an ELF file"), "{err}");

    let out = sb.run(&["check-binary"]);
    failure_line(&out, 2, "no PROG");
}
