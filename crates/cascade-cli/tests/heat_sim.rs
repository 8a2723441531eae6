//! The demo simulation `examples/heat/heat.c`: a 2-D heat-equation solver that checkpoints
//! like an HPC code (a directory per checkpoint, published by renaming `latest.tmp` onto
//! `latest`) and restarts from its newest checkpoint.
//!
//! Each test compiles heat.c with `cc` (with the flags of its header comment, -Werror
//! included) into its own temp dir. Most run it on a plain temp directory: checkpoints,
//! a crash in the middle of a checkpoint (--kill-at-step) and a restart that ends bit for bit
//! where an uninterrupted run ends, refused corrupt checkpoints, usage errors and --keep.
//! The last one runs it unmodified under `cascade run` on a real node store, following
//! interposition.rs: libcascade.so built with `cargo build -p cascade-preload`, a private
//! store (CASCADE_STORE) made by `cascade init` and removed by `cascade destroy`, also when
//! the test fails.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tempfile::TempDir;

use cascade_testkit::{compile_heat, output_within, preload_library};

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
/// How long a child process may take before a test gives up on it.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The grid side the tests use: 128 * 128 doubles, 128 KiB per checkpoint.
const N: usize = 128;
const GRID_BYTES: u64 = (N * N * 8) as u64;
/// 60 steps, a checkpoint every 10.
const RUN: [&str; 6] = ["--n", "128", "--steps", "60", "--every", "10"];

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn stderr_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// heat ARGS on the host file system.
fn heat(exe: &Path, dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(exe);
    command.arg("--dir").arg(dir).args(args);
    output_within(command, TIMEOUT)
}

/// A run that must succeed; returns its stdout lines.
fn heat_ok(exe: &Path, dir: &Path, args: &[&str]) -> Vec<String> {
    let out = heat(exe, dir, args);
    assert!(
        out.status.success(),
        "heat {args:?} failed ({:?}): {}",
        out.status,
        stderr_text(&out)
    );
    assert!(
        out.stderr.is_empty(),
        "heat {args:?}: {}",
        stderr_text(&out)
    );
    stdout_lines(&out)
}

/// Asserts exit `code`, exactly one line on stderr starting "heat: " and no final line;
/// returns the stderr line.
fn failure_line(out: &Output, code: i32, what: &str) -> String {
    let stderr = stderr_text(out);
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
    assert!(stderr.starts_with("heat: "), "{what}: {stderr:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("final "), "{what}: {stdout}");
    stderr.trim_end().to_string()
}

/// The fields of the final line, which must be the last line printed:
/// `final step=S fnv1a64=HEX checkpoints=C total_stall_ms=T mean_stall_ms=M`.
struct Final {
    step: u64,
    fnv: String,
    checkpoints: u64,
}

fn final_line(lines: &[String]) -> Final {
    let last = lines.last().expect("heat printed nothing");
    let fields: Vec<&str> = last.split(' ').collect();
    let value = |i: usize, key: &str| -> &str {
        fields
            .get(i)
            .and_then(|f| f.strip_prefix(key))
            .and_then(|f| f.strip_prefix('='))
            .unwrap_or_else(|| panic!("final line lacks {key}=: {last:?}"))
    };
    assert_eq!(fields.len(), 6, "{last:?}");
    assert_eq!(fields[0], "final", "{last:?}");
    let fnv = value(2, "fnv1a64").to_string();
    assert_eq!(fnv.len(), 16, "{last:?}");
    assert!(fnv
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let total: f64 = value(4, "total_stall_ms").parse().expect("total_stall_ms");
    let mean: f64 = value(5, "mean_stall_ms").parse().expect("mean_stall_ms");
    for ms in [value(4, "total_stall_ms"), value(5, "mean_stall_ms")] {
        assert_eq!(ms.split('.').nth(1).map(str::len), Some(3), "{last:?}");
    }
    let checkpoints: u64 = value(3, "checkpoints").parse().expect("checkpoints");
    assert!(total >= 0.0 && mean >= 0.0, "{last:?}");
    if checkpoints == 0 {
        assert_eq!(value(5, "mean_stall_ms"), "0.000", "{last:?}");
    }
    Final {
        step: value(1, "step").parse().expect("step"),
        fnv,
        checkpoints,
    }
}

/// The steps of the `checkpoint step=S bytes=B stall_ms=MS` lines; checks each line's form
/// and that bytes is the grid plus a meta.txt of `meta_len(step)` bytes.
fn checkpoint_steps(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter(|l| l.starts_with("checkpoint "))
        .map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            assert_eq!(fields.len(), 4, "{l:?}");
            let step: u64 = fields[1]
                .strip_prefix("step=")
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{l:?}"));
            let bytes: u64 = fields[2]
                .strip_prefix("bytes=")
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{l:?}"));
            assert_eq!(bytes, GRID_BYTES + meta_len(step), "{l:?}");
            let ms = fields[3].strip_prefix("stall_ms=").expect("stall_ms=");
            assert!(ms.parse::<f64>().is_ok_and(|v| v >= 0.0), "{l:?}");
            assert_eq!(ms.split('.').nth(1).map(str::len), Some(3), "{l:?}");
            step
        })
        .collect()
}

/// Bytes of meta.txt for a checkpoint of `step` with N = 128.
fn meta_len(step: u64) -> u64 {
    format!("step={step}\nn={N}\nfnv1a64={:016x}\n", 0u64).len() as u64
}

fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The names of the ckpt.* entries of a host directory, sorted.
fn checkpoint_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list checkpoint dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.starts_with("ckpt."))
        .collect();
    names.sort();
    names
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Runs the 60-step reference run into `dir`; returns the final fnv1a64.
fn reference_run(exe: &Path, dir: &Path) -> String {
    let lines = heat_ok(exe, dir, &RUN);
    final_line(&lines).fnv
}

#[test]
fn an_uninterrupted_run_writes_six_checkpoints_and_a_final_checksum() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = compile_heat(tmp.path());
    // A directory that does not exist yet, two levels deep (mkdir -p).
    let dir = tmp.path().join("out/ckpt");
    let lines = heat_ok(&exe, &dir, &RUN);
    assert_eq!(lines.first().map(String::as_str), Some("starting fresh"));
    assert_eq!(checkpoint_steps(&lines), [10, 20, 30, 40, 50, 60]);
    assert_eq!(lines.len(), 8, "{lines:?}");
    let fin = final_line(&lines);
    assert_eq!(fin.step, 60);
    assert_eq!(fin.checkpoints, 6);

    assert_eq!(
        checkpoint_dirs(&dir),
        [
            "ckpt.000010",
            "ckpt.000020",
            "ckpt.000030",
            "ckpt.000040",
            "ckpt.000050",
            "ckpt.000060"
        ]
    );
    assert_eq!(read_text(&dir.join("latest")), "ckpt.000060\n");
    assert!(!dir.join("latest.tmp").exists());
    // Every checkpoint's meta.txt carries the checksum of its grid.bin; the last one is the
    // final grid (step 60 is a checkpoint step).
    for step in [10, 20, 30, 40, 50, 60] {
        let ck = dir.join(format!("ckpt.{step:06}"));
        let grid = std::fs::read(ck.join("grid.bin")).expect("read grid.bin");
        assert_eq!(grid.len() as u64, GRID_BYTES);
        let meta = read_text(&ck.join("meta.txt"));
        assert_eq!(
            meta,
            format!("step={step}\nn={N}\nfnv1a64={}\n", fnv1a64(&grid))
        );
        if step == 60 {
            assert_eq!(fnv1a64(&grid), fin.fnv);
        }
    }

    // --quiet: the final line only. --no-commit changes nothing without Cascade.
    let quiet = tmp.path().join("quiet");
    let lines = heat_ok(
        &exe,
        &quiet,
        &[&RUN[..], &["--quiet", "--no-commit"]].concat(),
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(final_line(&lines).fnv, fin.fnv);
    // Deterministic: a second fresh run, the same result.
    assert_eq!(reference_run(&exe, &tmp.path().join("again")), fin.fnv);
}

#[test]
fn a_crash_in_the_middle_of_a_checkpoint_restarts_from_the_previous_one_bit_for_bit() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = compile_heat(tmp.path());
    let expected = reference_run(&exe, &tmp.path().join("reference"));

    let dir = tmp.path().join("crash");
    let out = heat(&exe, &dir, &[&RUN[..], &["--kill-at-step", "40"]].concat());
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{:?}: {}",
        out.status,
        stderr_text(&out)
    );
    // The lines printed before the crash were not lost (stdout is line-buffered).
    assert_eq!(checkpoint_steps(&stdout_lines(&out)), [10, 20, 30]);
    let torn = dir.join("ckpt.000040/grid.bin");
    let len = std::fs::metadata(&torn).expect("stat torn grid.bin").len();
    assert!(len < GRID_BYTES, "grid.bin of step 40 has {len} bytes");
    assert!(!dir.join("ckpt.000040/meta.txt").exists());
    assert_eq!(read_text(&dir.join("latest")), "ckpt.000030\n");

    let lines = heat_ok(&exe, &dir, &RUN);
    assert_eq!(
        lines.first().map(String::as_str),
        Some("restarted from ckpt.000030 step=30")
    );
    assert_eq!(checkpoint_steps(&lines), [40, 50, 60]);
    let fin = final_line(&lines);
    assert_eq!((fin.step, fin.checkpoints), (60, 3));
    assert_eq!(fin.fnv, expected, "the restarted run ends elsewhere");
    // The torn checkpoint was rewritten whole.
    assert_eq!(std::fs::metadata(&torn).expect("stat").len(), GRID_BYTES);
    assert_eq!(read_text(&dir.join("latest")), "ckpt.000060\n");

    // Restarting a finished run computes nothing more and ends at the same place.
    let lines = heat_ok(&exe, &dir, &RUN);
    assert_eq!(lines[0], "restarted from ckpt.000060 step=60");
    let fin = final_line(&lines);
    assert_eq!((fin.step, fin.checkpoints), (60, 0));
    assert_eq!(fin.fnv, expected);
}

#[test]
fn a_corrupt_checkpoint_is_refused_with_one_line_naming_the_file() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = compile_heat(tmp.path());
    let dir = tmp.path().join("run");
    reference_run(&exe, &dir);
    let grid = dir.join("ckpt.000060/grid.bin");
    let good = std::fs::read(&grid).expect("read grid.bin");

    // One flipped byte.
    let mut flipped = good.clone();
    flipped[good.len() / 2 + 3] ^= 0x40;
    std::fs::write(&grid, &flipped).expect("corrupt grid.bin");
    let err = failure_line(&heat(&exe, &dir, &RUN), 1, "flipped byte");
    assert!(err.contains("ckpt.000060/grid.bin"), "{err}");
    assert!(err.contains("checksum"), "{err}");

    // A short file.
    std::fs::write(&grid, &good[..1000]).expect("truncate grid.bin");
    let err = failure_line(&heat(&exe, &dir, &RUN), 1, "short file");
    assert!(err.contains("ckpt.000060/grid.bin"), "{err}");
    assert!(err.contains("short"), "{err}");

    // The right grid again, but a different --n.
    std::fs::write(&grid, &good).expect("restore grid.bin");
    let err = failure_line(&heat(&exe, &dir, &["--n", "64"]), 1, "other n");
    assert!(err.contains("n=128") && err.contains("64"), "{err}");
    // And with everything right, the restart works.
    let lines = heat_ok(&exe, &dir, &RUN);
    assert_eq!(lines[0], "restarted from ckpt.000060 step=60");
}

#[test]
fn bad_arguments_are_a_one_line_usage_error() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = compile_heat(tmp.path());
    let dir = tmp.path().join("never");
    let dir_arg = dir.to_str().expect("utf-8 temp path");
    for (args, needle) in [
        (&["--dir", dir_arg, "--n", "abc"][..], "--n"),
        (&["--n", "128"], "--dir"),
        (&[], "--dir"),
        (&["--dir", dir_arg, "--every", "0"], "--every"),
        (&["--dir", dir_arg, "--steps", "-1"], "--steps"),
        (&["--dir", dir_arg, "--bogus"], "--bogus"),
        (&["--dir", dir_arg, "extra"], "extra"),
        (&["--dir"], "--dir"),
    ] {
        let mut command = Command::new(&exe);
        command.args(args);
        let out = output_within(command, TIMEOUT);
        let err = failure_line(&out, 2, &format!("{args:?}"));
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!dir.exists(), "a usage error created the directory");

    let mut command = Command::new(&exe);
    command.arg("--help");
    let out = output_within(command, TIMEOUT);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "--dir",
        "--n",
        "--steps",
        "--every",
        "--keep",
        "--kill-at-step",
        "--no-commit",
        "--quiet",
    ] {
        assert!(help.contains(option), "--help lacks {option}:\n{help}");
    }
}

#[test]
fn keep_2_leaves_the_two_newest_checkpoints() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = compile_heat(tmp.path());
    let dir = tmp.path().join("kept");
    let lines = heat_ok(&exe, &dir, &[&RUN[..], &["--keep", "2"]].concat());
    assert_eq!(final_line(&lines).checkpoints, 6);
    assert_eq!(checkpoint_dirs(&dir), ["ckpt.000050", "ckpt.000060"]);
    assert_eq!(read_text(&dir.join("latest")), "ckpt.000060\n");
}

// ---------------------------------------------------------------------------------------
// Under `cascade run`, on a real node store

/// A temp dir, a private store name and an empty config file; `cascade` runs with only
/// these (and PATH) in its environment. The store is destroyed on drop.
struct Sandbox {
    dir: TempDir,
    store: String,
    config_file: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = format!("/cascade-test-{}-heat", std::process::id());
        let config_file = dir.path().join("empty.toml");
        std::fs::write(&config_file, "").expect("write empty config");
        Sandbox {
            dir,
            store,
            config_file,
        }
    }

    /// `cascade ARGS` with a clean environment: small, quick store parameters and the built
    /// libcascade.so.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(CASCADE);
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
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        output_within(self.command(args), TIMEOUT)
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "cascade {args:?} failed ({:?}): {}",
            out.status,
            stderr_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // After a passing test the store is gone already and this fails, which is fine.
        let _ = Command::new(CASCADE)
            .args(["--store", &self.store, "destroy", "--force"])
            .env_clear()
            .env("CASCADE_CONFIG", &self.config_file)
            .output();
    }
}

#[test]
fn under_cascade_run_the_checkpoints_are_store_files_and_the_result_is_the_same() {
    let sb = Sandbox::new();
    let exe = compile_heat(sb.dir.path());
    let exe_arg = exe.to_str().expect("utf-8 temp path");
    let plain = sb.dir.path().join("plain");
    let expected = reference_run(&exe, &plain);

    sb.ok(&["init"]);
    // The default mount prefix, which is where --dir points.
    let config = sb.ok(&["config"]);
    assert!(
        config
            .lines()
            .any(|l| l.starts_with("mount.prefix") && l.contains("/cascade")),
        "{config}"
    );
    let heat_run = |dir: &str, extra: &[&str]| {
        let args = [&["run", "--", exe_arg, "--dir", dir][..], &RUN, extra].concat();
        sb.run(&args)
    };

    let out = heat_run("/cascade/heat", &[]);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        stderr_text(&out)
    );
    // No warning either: cascade_commit, if the library has it, succeeded.
    assert!(out.stderr.is_empty(), "{}", stderr_text(&out));
    let lines = stdout_lines(&out);
    assert_eq!(lines[0], "starting fresh");
    assert_eq!(checkpoint_steps(&lines), [10, 20, 30, 40, 50, 60]);
    let fin = final_line(&lines);
    assert_eq!(fin.checkpoints, 6);
    assert_eq!(fin.fnv, expected, "under Cascade the result differs");

    // The checkpoints are in the store, not on the host, and hold the same bytes.
    let listing: Vec<String> = sb
        .ok(&["ls", "/heat"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        listing,
        [
            "ckpt.000010",
            "ckpt.000020",
            "ckpt.000030",
            "ckpt.000040",
            "ckpt.000050",
            "ckpt.000060",
            "latest"
        ]
    );
    assert!(!Path::new("/cascade/heat/latest").exists());
    for name in ["ckpt.000060/grid.bin", "ckpt.000060/meta.txt", "latest"] {
        let local = sb.dir.path().join("got");
        let local_arg = local.to_str().expect("utf-8 temp path");
        sb.ok(&["get", &format!("/heat/{name}"), local_arg]);
        assert_eq!(
            std::fs::read(&local).expect("read copy"),
            std::fs::read(plain.join(name)).expect("read plain"),
            "{name} differs between the store and the plain run"
        );
    }

    // A crash in the middle of the checkpoint of step 40, then a restart, in the store.
    let out = heat_run("/cascade/crash", &["--kill-at-step", "40"]);
    // cascade run reports a child killed by SIGKILL as 128 + 9.
    assert_eq!(out.status.code(), Some(137), "{}", stderr_text(&out));
    let stat = sb.ok(&["stat", "/crash/ckpt.000040/grid.bin"]);
    let size: u64 = stat
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("size "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no size in stat output: {stat}"));
    assert!(size < GRID_BYTES, "torn grid.bin has {size} bytes");
    let out = heat_run("/cascade/crash", &[]);
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        stderr_text(&out)
    );
    let lines = stdout_lines(&out);
    assert_eq!(lines[0], "restarted from ckpt.000030 step=30");
    assert_eq!(final_line(&lines).fnv, expected);

    let fsck = sb.run(&["fsck"]);
    assert!(
        fsck.status.success(),
        "fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    sb.ok(&["destroy"]);
}
