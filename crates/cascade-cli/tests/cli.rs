//! Runs the real `cascade` binary against real stores. Each test gets its own store name
//! (/cascade-test-<pid>-<n>), temp dir, HOME and empty config file, with the environment
//! cleared, so tests neither see nor touch a developer's stores and settings. Stores are
//! destroyed when the test's sandbox is dropped, also when the test fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use cascade_testkit::pattern;
use serde_json::Value;
use tempfile::TempDir;

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
const MIB: usize = 1 << 20;

static NEXT_STORE: AtomicUsize = AtomicUsize::new(0);

struct Sandbox {
    dir: TempDir,
    store: String,
    config_file: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        let n = NEXT_STORE.fetch_add(1, Ordering::Relaxed);
        let store = format!("/cascade-test-{}-{n}", std::process::id());
        let config_file = dir.path().join("empty.toml");
        std::fs::write(&config_file, "").expect("write empty config");
        Sandbox {
            dir,
            store,
            config_file,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spill_path(&self) -> PathBuf {
        self.path("store.spill")
    }

    /// `cascade ARGS` with only this sandbox's settings in its environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(CASCADE);
        command
            .args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("CASCADE_STORE", &self.store)
            .env("CASCADE_CONFIG", &self.config_file)
            .env("CASCADE_SPILL_PATH", self.spill_path());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run cascade")
    }

    /// Runs a command with `input` fed to its standard input through a pipe.
    fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cascade");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let input = input.to_vec();
        // A separate writer, so a child that stops reading cannot deadlock the test.
        let feeder = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().expect("wait for cascade");
        feeder.join().expect("feeder thread").expect("feed stdin");
        out
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "cascade {args:?} failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command that must fail with `code` and exactly one line on stderr; returns it.
    fn fails(&self, args: &[&str], code: i32) -> String {
        failure_line(self.run(args), code, args)
    }

    /// A 64 MiB store with 64 KiB chunks, no spill and no prefault: quick to create.
    fn init_small(&self) {
        self.init(&["--capacity", "64MiB", "--spill-size", "0"]);
    }

    fn init(&self, extra: &[&str]) {
        let mut args = vec!["init", "--chunk-size", "64KiB", "--max-files", "1024"];
        if !extra.contains(&"--prefault") {
            args.extend(["--prefault", "off"]);
        }
        args.extend(extra);
        self.ok(&args);
    }

    fn status_json(&self) -> Value {
        serde_json::from_str(&self.ok(&["status", "--json"])).expect("status --json is JSON")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Most tests leave a store behind (--force: a failed test may leave a writer
        // attached); a test that never made one gets an error here, which is fine.
        let _ = self.run(&["destroy", "--force"]);
    }
}

fn failure_line(out: Output, code: i32, args: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "cascade {args:?}: exit code; stderr: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "cascade {args:?}: one line, got {stderr:?}"
    );
    assert!(stderr.starts_with("cascade: "), "{stderr:?}");
    assert!(!stderr.contains("panicked"), "{stderr:?}");
    stderr.trim_end().to_string()
}

/// A temp path as a command-line argument (temp dirs are always UTF-8 here).
fn arg(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

fn write_local(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write local file");
}

#[test]
fn put_then_get_returns_the_same_bytes() {
    let sb = Sandbox::new();
    sb.init_small();
    // Not a multiple of the chunk or the 1 MiB buffer, to cover partial last pieces.
    let data = pattern(3 * MIB + 12345, 7);
    let local_in = sb.path("in.dat");
    let local_out = sb.path("out.dat");
    write_local(&local_in, &data);

    let put = sb.ok(&["put", "-p", arg(&local_in), "/ckpt.0001/rank0.dat"]);
    assert!(put.contains(&format!("{} bytes", data.len())), "{put}");
    assert!(put.contains("GB/s"), "{put}");

    let get = sb.ok(&["get", "/ckpt.0001/rank0.dat", arg(&local_out)]);
    assert!(get.contains(&format!("{} bytes", data.len())), "{get}");
    assert!(
        std::fs::read(&local_out).expect("read back") == data,
        "bytes differ"
    );

    let stat = sb.ok(&["stat", "/ckpt.0001/rank0.dat"]);
    assert!(stat.contains(&format!("size    {} ", data.len())), "{stat}");
}

#[test]
fn put_from_pipes_and_get_to_pipes() {
    let sb = Sandbox::new();
    sb.init_small();
    let data = pattern(2 * MIB + 3, 11);

    let put = sb.run_with_stdin(&["put", "-", "/piped.dat"], &data);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = sb.run(&["get", "/piped.dat", "-"]);
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(get.stdout == data, "stdout differs from what went in");
    // The summary goes to stderr so it does not mix with the data.
    assert!(String::from_utf8_lossy(&get.stderr).contains("GB/s"));

    // A path that names a pipe is streamed too: positional I/O would fail on it.
    let put = sb.run_with_stdin(&["put", "/dev/stdin", "/named-pipe.dat"], &data);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = sb.run(&["get", "/named-pipe.dat", "/dev/stdout"]);
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(get.stdout == data, "/dev/stdout differs from what went in");
}

#[test]
fn mkdir_ls_stat_rm() {
    let sb = Sandbox::new();
    sb.init_small();
    sb.ok(&["mkdir", "/a"]);
    sb.ok(&["mkdir", "-p", "/a/b/c", "/x/y"]);
    let err = sb.fails(&["mkdir", "/a"], 1);
    assert_eq!(err, "cascade: /a: File exists");
    let err = sb.fails(&["mkdir", "/no/such/parent"], 1);
    assert!(err.contains("No such file or directory"), "{err}");

    let local = sb.path("weights.bin");
    write_local(&local, &pattern(100_000, 3));
    // An existing directory as destination gets the local file's name, as with cp.
    sb.ok(&["put", arg(&local), "/a"]);

    assert_eq!(sb.ok(&["ls"]), "a\nx\n");
    assert_eq!(sb.ok(&["ls", "/a"]), "b\nweights.bin\n");
    let long = sb.ok(&["ls", "-l", "/a"]);
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(lines.len(), 2, "{long}");
    assert!(
        lines[0].starts_with("drwxr-xr-x") && lines[0].ends_with(" b"),
        "{long}"
    );
    assert!(
        lines[1].starts_with("-rw") && lines[1].contains(" 100000 "),
        "{long}"
    );
    assert!(lines[1].ends_with(" weights.bin"), "{long}");

    let stat = sb.ok(&["stat", "/a/weights.bin"]);
    assert!(stat.contains("regular file"), "{stat}");
    assert!(stat.contains("size    100000 "), "{stat}");
    assert!(sb.ok(&["stat", "/a/b"]).contains("directory"));

    let err = sb.fails(&["rm", "/a"], 1);
    assert!(err.starts_with("cascade: /a: Is a directory"), "{err}");
    sb.ok(&["rm", "/a/weights.bin"]);
    assert_eq!(sb.ok(&["ls", "/a"]), "b\n");
    sb.ok(&["rm", "-r", "/a", "/x"]);
    assert_eq!(sb.ok(&["ls", "/"]), "");
    assert_eq!(
        sb.fails(&["stat", "/a"], 1),
        "cascade: /a: No such file or directory"
    );
    let err = sb.fails(&["rm", "-r", "/"], 1);
    assert!(err.contains("refusing to remove"), "{err}");
}

#[test]
fn missing_store_file_and_local_paths_are_one_line_errors() {
    let sb = Sandbox::new();
    let err = sb.fails(&["ls"], 1);
    assert!(
        err.contains(&format!("no store named {}", sb.store)),
        "{err}"
    );
    sb.fails(&["status"], 1);
    sb.fails(&["destroy"], 1);

    sb.init_small();
    assert_eq!(
        sb.fails(&["get", "/ckpt/a", arg(&sb.path("o"))], 1),
        "cascade: /ckpt/a: No such file or directory"
    );
    let missing_local = sb.path("nope.dat");
    assert_eq!(
        sb.fails(&["put", arg(&missing_local), "/x"], 1),
        format!(
            "cascade: {}: No such file or directory",
            missing_local.display()
        )
    );
    let err = sb.fails(&["init", "--capacity", "64MiB", "--spill-size", "0"], 1);
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn bad_flags_and_values_are_one_line_errors() {
    let sb = Sandbox::new();
    let err = sb.fails(&["init", "--bogus"], 2);
    assert!(err.contains("--bogus"), "{err}");
    assert!(err.contains("cascade init --help"), "{err}");
    sb.fails(&["frobnicate"], 2);
    sb.fails(&["put", "only-one-arg"], 2);

    assert_eq!(
        sb.fails(&["init", "--capacity", "12x"], 1),
        "cascade: --capacity=\"12x\": not a size (expected e.g. 4KiB, 1MiB, 8GiB)"
    );
    let out = sb
        .command(&["config"])
        .env("CASCADE_CHUNK_SIZE", "12x")
        .output()
        .expect("run");
    assert_eq!(
        failure_line(out, 1, &["config"]),
        "cascade: CASCADE_CHUNK_SIZE=\"12x\": not a size (expected e.g. 4KiB, 1MiB, 8GiB)"
    );
    let err = sb.fails(&["init", "--chunk-size", "3000"], 1);
    assert!(err.contains("power of two"), "{err}");
    let err = sb.fails(&["init", "--capacity", "16KiB", "--chunk-size", "64KiB"], 1);
    assert!(err.contains("less than one chunk"), "{err}");
    let err = sb.fails(&["--config", arg(&sb.path("absent.toml")), "ls"], 1);
    assert!(
        err.contains("absent.toml (from --config): No such file"),
        "{err}"
    );
}

#[test]
fn config_shows_each_value_and_where_it_came_from() {
    let sb = Sandbox::new();
    let file = sb.path("cascade.toml");
    std::fs::write(
        &file,
        "[store]\ncapacity = \"32MiB\"\nchunk_size = \"128KiB\"\nmax_files = 100\n",
    )
    .expect("write config");
    let run = |json: bool| {
        let mut args = vec!["--config", arg(&file), "config", "--max-files", "300"];
        if json {
            args.push("--json");
        }
        let out = sb
            .command(&args)
            .env("CASCADE_CAPACITY", "48MiB")
            .env("CASCADE_MAX_FILES", "200")
            .output()
            .expect("run config");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let doc: Value = serde_json::from_str(&run(true)).expect("config --json is JSON");
    let setting = |key: &str| {
        doc["settings"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["key"] == key))
            .cloned()
            .unwrap_or_else(|| panic!("no {key} in {doc}"))
    };
    assert_eq!(setting("store.max_files")["value"], 300);
    assert_eq!(setting("store.max_files")["from"], "flag");
    assert_eq!(setting("store.capacity")["value"], 48 << 20);
    assert_eq!(setting("store.capacity")["from"], "env");
    assert_eq!(setting("store.chunk_size")["value"], 128 << 10);
    assert_eq!(setting("store.chunk_size")["from"], "file");
    assert_eq!(setting("store.prefault")["value"], "foreground");
    assert_eq!(setting("store.prefault")["from"], "default");
    assert_eq!(setting("store.name")["value"], sb.store.as_str());
    assert_eq!(setting("store.name")["from"], "env");

    let text = run(false);
    assert!(text.contains("flag --max-files"), "{text}");
    assert!(text.contains("env CASCADE_CAPACITY"), "{text}");
    assert!(text.contains(&format!("file {}", file.display())), "{text}");
    assert!(
        text.contains(&format!("config files: {} (--config)", file.display())),
        "{text}"
    );

    // --store beats CASCADE_STORE.
    let named = sb.ok(&["--store", "/other-name", "config", "--json"]);
    assert!(named.contains("\"/other-name\""), "{named}");
}

#[test]
fn init_reports_geometry_and_timing_and_destroy_removes_everything() {
    let sb = Sandbox::new();
    let out = sb.ok(&[
        "init",
        "--capacity",
        "8MiB",
        "--chunk-size",
        "64KiB",
        "--spill-size",
        "4MiB",
        "--prefault",
        "foreground",
    ]);
    assert!(out.contains("8 MiB in 128 chunks of 64 KiB"), "{out}");
    assert!(
        out.contains(&format!(
            "4 MiB in 64 chunks at {}",
            sb.spill_path().display()
        )),
        "{out}"
    );
    assert!(out.contains("including prefault"), "{out}");

    let shm_object = PathBuf::from(format!("/dev/shm{}", sb.store));
    assert!(shm_object.exists(), "{} missing", shm_object.display());
    assert!(sb.spill_path().exists(), "spill file missing");
    let status = sb.status_json();
    assert_eq!(status["prefaulted_bytes"], status["memory_capacity"]);

    sb.ok(&["destroy"]);
    assert!(!shm_object.exists(), "shm object left behind");
    assert!(!sb.spill_path().exists(), "spill file left behind");
    sb.fails(&["status"], 1);
}

#[test]
fn status_counts_files_and_used_bytes() {
    let sb = Sandbox::new();
    sb.init_small();
    let local = sb.path("f");
    write_local(&local, &pattern(MIB + 1, 5));
    sb.ok(&["mkdir", "/d"]);
    sb.ok(&["put", arg(&local), "/d/f"]);

    let status = sb.status_json();
    assert_eq!(status["name"], sb.store.as_str());
    assert_eq!(status["files"], 1);
    assert_eq!(status["memory_capacity"], 64 << 20);
    let used = status["memory_used"].as_u64().expect("memory_used");
    // 1 MiB + 1 byte takes 17 chunks of 64 KiB.
    assert!(used >= 17 * 65536, "used {used}");
    assert!(status["last_enospc"].is_null(), "{status}");

    let text = sb.ok(&["status"]);
    assert!(text.contains("64 MiB"), "{text}");
    assert!(text.contains("last ENOSPC  none"), "{text}");
}

#[test]
fn fsck_of_a_clean_store_exits_zero() {
    let sb = Sandbox::new();
    sb.init_small();
    let local = sb.path("f");
    write_local(&local, &pattern(300_000, 9));
    sb.ok(&["put", "-p", arg(&local), "/c/f"]);
    let report = sb.ok(&["fsck"]);
    assert!(report.contains("0 errors"), "{report}");
    let repaired = sb.ok(&["fsck", "--repair"]);
    assert!(repaired.contains("0 errors"), "{repaired}");
}

#[test]
fn fsck_finds_corruption_and_exits_one() {
    let sb = Sandbox::new();
    sb.init(&["--capacity", "1MiB", "--spill-size", "0"]);
    let name = "victim-file-7f3a9c";
    let local = sb.path("v");
    write_local(&local, b"some checkpoint bytes");
    sb.ok(&["put", arg(&local), &format!("/{name}")]);

    // Break the store from outside, as a stray write would: wherever the block holds the
    // file's name, put a '/' in it, which no valid name can contain.
    let shm_object = PathBuf::from(format!("/dev/shm{}", sb.store));
    let mut block = std::fs::read(&shm_object).expect("read shm object");
    let mut hits = 0;
    let mut at = 0;
    while let Some(pos) = find(&block[at..], name.as_bytes()) {
        block[at + pos] = b'/';
        hits += 1;
        at += pos + name.len();
    }
    assert!(hits > 0, "name not found in the block");
    std::fs::write(&shm_object, &block).expect("write shm object");

    let out = sb.run(&["fsck"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.lines().any(|l| l.starts_with("error: ")), "{report}");
    assert!(!report.contains(" 0 errors"), "{report}");
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn destroy_refuses_while_a_process_is_attached() {
    let sb = Sandbox::new();
    sb.init_small();
    let mut writer = sb
        .command(&["put", "-", "/streaming.dat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn put");
    let mut stdin = writer.stdin.take().expect("stdin");
    // One full buffer makes the writer store a chunk; then it waits for more input.
    stdin.write_all(&pattern(MIB, 1)).expect("feed put");
    let pid = u64::from(writer.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = sb.status_json();
        let attached = status["attached_pids"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if attached.iter().any(|p| p.as_u64() == Some(pid)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writer never attached: {status}"
        );
    }

    let err = sb.fails(&["destroy"], 1);
    assert!(err.contains("--force"), "{err}");
    sb.ok(&["status"]);

    drop(stdin);
    let out = writer.wait_with_output().expect("writer finishes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sb.ok(&["destroy"]);
}

#[test]
fn put_larger_than_the_store_fails_with_enospc_and_status_says_why() {
    let sb = Sandbox::new();
    sb.init(&["--capacity", "1MiB", "--spill-size", "0"]);
    let data = pattern(3 * MIB, 13);
    let local = sb.path("big.dat");
    write_local(&local, &data);

    let err = sb.fails(&["put", arg(&local), "/big.dat"], 1);
    assert!(
        err.starts_with("cascade: /big.dat: No space left on device"),
        "{err}"
    );
    assert!(err.contains("cascade status"), "{err}");

    let status = sb.status_json();
    let reason = status["last_enospc"]["reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "no ENOSPC reason in {status}");
    let text = sb.ok(&["status"]);
    assert!(text.contains(&format!("last ENOSPC  {reason}")), "{text}");

    // What was written before the store filled up is intact.
    let out = sb.path("prefix.dat");
    sb.ok(&["get", "/big.dat", arg(&out)]);
    let kept = std::fs::read(&out).expect("read prefix");
    assert!(
        !kept.is_empty() && kept.len() <= MIB,
        "kept {} bytes",
        kept.len()
    );
    assert!(
        kept[..] == data[..kept.len()],
        "kept bytes differ from the source"
    );
    assert_eq!(sb.run(&["fsck"]).status.code(), Some(0));
}

#[test]
fn every_command_has_help_that_explains_units_and_defaults() {
    let sb = Sandbox::new();
    let top = sb.ok(&["--help"]);
    for command in [
        "init", "status", "ls", "stat", "put", "get", "rm", "mkdir", "fsck", "destroy", "config",
    ] {
        assert!(top.contains(command), "{command} missing from --help");
        let help = sb.ok(&[command, "--help"]);
        assert!(help.contains("Usage: cascade"), "{command}: {help}");
    }
    let init = sb.ok(&["init", "--help"]);
    for needle in [
        "CASCADE_CAPACITY",
        "25% of RAM",
        "64KiB",
        "--spill-size",
        "0 disables spill",
    ] {
        assert!(init.contains(needle), "init --help lacks {needle:?}");
    }
    assert!(sb.ok(&["put", "--help"]).contains("GB/s is decimal"));
}
