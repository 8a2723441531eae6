//! `cascade mount` with real mounts and real programs: the `cascade` binary serving a node
//! store of the test's own through FUSE on a temporary directory, used by coreutils, tar,
//! Python, a static C program and a Go program, next to the preload library (`cascade run`),
//! the store API and the agent. No mocks, no sleeps as synchronisation: every wait polls a
//! log line, the store or a process's exit with a deadline. The tests run one at a time (the
//! test kit's serial lock): they kill processes and the machine has two cores.
//!
//! 1. coreutils: `mkdir -p`, `cp` (a 5 MiB file, an empty one, a small one), `mv` of files
//!    and directories across directories (also over an existing file), `rm`, `rmdir`,
//!    `truncate -s` down and up, `chmod` (seen by `stat` and the store), `touch -d` (mtime
//!    stored to the nanosecond), `ls`, `dd bs=1M` in and out and `conv=notrunc` in place,
//!    `sha256sum` / `cmp` against the originals; concurrent `dd` writers on four files and
//!    on two halves of one file;
//!    tar: `tar cf` of a tree (many small files, odd sizes, modes, mtimes) into the mount,
//!    `tar xf` of it into the mount, then out again (archive file and pipe): the trees,
//!    modes and mtimes are identical;
//!    Python: write + `os.fsync` + `os.rename` + `os.stat`, a shared `mmap` written and
//!    `msync`ed then read with `read()`, `pwrite` then read through the mapping,
//!    `os.statvfs`; `df` reports the store's capacity and usage (store status);
//! 2. a statically linked C program (`gcc -static`, checked with `ldd`) writes a checkpoint
//!    (pwrite at scattered offsets, fsync, tmp + rename, ftruncate to extend, a manifest),
//!    reads it back and verifies it; the test checks the bytes through the mount, the store
//!    API and `cascade get`, and that the program's verify notices a byte changed in the
//!    store;
//! 3. the same with a Go program (`CGO_ENABLED=0 go build`, std library only);
//! 4. mixed access with no remount: written through FUSE, read by a preloaded program and
//!    the store API; written by preloaded programs (`sh -c 'echo > ...'`, `cp`, `dd
//!    conv=notrunc`) and the store API, read through the mount at once (also through a file
//!    already open there); renames and removals by a preloaded program seen at once, and a
//!    file open through the mount still readable after them;
//! 5. `kill -9` of the daemon while a writer writes through the mount: the writer gets
//!    ENOTCONN/ECONNABORTED, the mount ENOTCONN; `cascade mount` on the same directory works
//!    again; closed files are byte-identical, `cascade fsck` finds no errors, the file being
//!    written is torn (`cascade ls --levels`) and holds only bytes the writer wrote (or
//!    zeros); the mount is usable afterwards;
//! 6. `cascade umount` with a file open (exit 1, one line), SIGTERM with a file open (the
//!    daemon says so and keeps serving), umount once closed (the daemon exits 0, printing
//!    "unmounted"), `--lazy` with a file open, SIGTERM with nothing open; the errors:
//!    umount of a plain directory, mount on a missing directory, on a regular file, and on a
//!    directory already mounted (exit 1, one line each);
//! 7. the agent drains a checkpoint written through the mount: `cascade commit`, `cascade
//!    wait --level durable`, and the durable directory holds the same bytes with matching
//!    `.blake3` files and a complete marker;
//! 8. `--kernel-cache`: a write through the preload library is seen at the next open;
//! 9. a directory of 700 entries read with getdents64 in 4 KiB batches (a C program): every
//!    name once, also when each batch is unlinked before the next one is read.
//! 10. a store of 8 MiB memory + 16 MiB spill: a 20 MiB file written with `dd conv=fsync`
//!     spills and reads back, `stat -f` counts memory and spill, writing past the
//!     capacity fails with ENOSPC and leaves the earlier file intact.
//!
//! FUSE sends RELEASE asynchronously (close(2) returns before the daemon has released the
//! file), so before a `cascade commit` or a kill the tests wait for the store to show no
//! writer.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, UNIX_EPOCH};

use cascade_store::{OpenOptions, Store};
use cascade_testkit::*;

/// Every store of these tests: 256 MiB of memory, no spill (so it is also what df reports).
const CAPACITY: u64 = 256 << 20;
/// Longest any program of these tests may run.
const RUN: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs")
}

fn s(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// `prog args...` with the test's environment minus anything of Cascade's.
fn command<S: AsRef<OsStr>>(prog: impl AsRef<OsStr>, args: &[S]) -> Command {
    let mut cmd = Command::new(prog);
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CASCADE_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` (at most [`RUN`]) and asserts that it succeeded.
fn run_ok(cmd: Command) -> Out {
    let what = format!("{cmd:?}");
    let out = run_with_timeout(cmd, RUN);
    assert!(out.ok(), "{what} failed: {out}");
    out
}

/// Runs `prog args...` and asserts that it succeeded.
fn sh<S: AsRef<OsStr>>(prog: &str, args: &[S]) -> Out {
    run_ok(command(prog, args))
}

/// The byte at `off` of the pattern `seed` (the same formula as programs/ckpt.c and .go).
fn pat(seed: u64, off: u64) -> u8 {
    let mut v = (off ^ (seed << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    v ^= v >> 29;
    (v >> 24) as u8
}

fn pattern_at(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pat(seed, off + i)).collect()
}

/// `n` bytes of `(i * step + add) % 251` (the same formula as programs/posix_ops.py).
fn periodic(n: usize, step: usize, add: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * step + add) % 251) as u8).collect()
}

/// Asserts equal bytes without printing megabytes: sizes, BLAKE3s and the first difference.
#[track_caller]
fn assert_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes (BLAKE3 {}), expected {} bytes ({}); first difference at {:?}",
            got.len(),
            b3(got),
            want.len(),
            b3(want),
            first
        );
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The store's bytes of `path` through a fresh attach (not the test's own handle).
fn store_read(name: &str, path: &str) -> Vec<u8> {
    let store = Store::attach(name).unwrap_or_else(|e| panic!("attach {name}: {e}"));
    read_store_file(&store, path)
}

/// The errno of `Store::stat(path)`, None if it exists.
fn store_errno(env: &Env, path: &str) -> Option<i32> {
    env.store().stat(path).err().map(|e| e.errno())
}

/// `cascade get PATH LOCAL`, returning the bytes it wrote to LOCAL.
fn cascade_get(env: &Env, path: &str) -> Vec<u8> {
    let local = env
        .tmp
        .path()
        .join(format!("get-{}", path.replace('/', "_")));
    env.cascade_ok(&["get", path, &s(&local)], &[]);
    let data = read(&local);
    std::fs::remove_file(&local).expect("remove");
    data
}

/// `cascade fsck` exits 0 and reports no errors.
fn assert_fsck_clean(env: &Env) {
    let out = env.cascade(&["fsck"], &[]);
    assert!(
        out.ok() && out.stdout.contains(" 0 errors"),
        "cascade fsck: {out}"
    );
}

/// Waits until no file at or below `path` has a writer. FUSE sends RELEASE asynchronously:
/// close(2) returns before the daemon has released the file, and so may the program.
fn wait_released(env: &Env, path: &str) {
    wait_for(
        &format!("the files below {path} to be released"),
        Duration::from_secs(30),
        || {
            env.store()
                .life_tree(path)
                .is_ok_and(|tree| tree.iter().all(|e| e.writers == 0))
        },
    );
}

/// Names in a directory (through whatever file system it is on), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// A `cascade mount` daemon serving the test's store on a directory of its own. Dropped:
/// the mount is detached (lazily) and the daemon killed, so a failing test leaves nothing
/// mounted; the store itself goes with the test's [`Env`] (declare the Mount after it).
struct Mount {
    daemon: Daemon,
    dir: PathBuf,
    tmp: Option<tempfile::TempDir>,
}

impl Mount {
    fn start(env: &Env, extra: &[&str]) -> Mount {
        let tmp = tempfile::Builder::new()
            .prefix("cascade-fuse-test-")
            .tempdir()
            .expect("tempdir");
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).expect("mkdir mountpoint");
        let daemon = Mount::spawn(env, &dir, extra);
        Mount {
            daemon,
            dir,
            tmp: Some(tmp),
        }
    }

    /// `cascade mount DIR EXTRA...`, once it has printed its start line and the kernel lists
    /// the mount.
    fn spawn(env: &Env, dir: &Path, extra: &[&str]) -> Daemon {
        let mut cmd = env.cli();
        cmd.arg("mount").arg(dir).args(extra);
        let mut d = Daemon::spawn(cmd, &format!("cascade mount {}", dir.display()));
        let prefix = format!("cascade mount: store {} on {} (", env.name, dir.display());
        let line = d.wait_line("its start line", Duration::from_secs(30), |l| {
            l.starts_with(&prefix)
        });
        assert!(
            line.ends_with(&format!("; pid {})", d.pid())),
            "start line: {line}"
        );
        assert!(
            cascade_fuse::is_cascade_mount(dir).expect("read mountinfo"),
            "{} is not listed as a Cascade mount after: {line}",
            dir.display()
        );
        d
    }

    /// A path under the mount (`rel` may start with '/').
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel.trim_start_matches('/'))
    }

    fn p(&self, rel: &str) -> String {
        s(&self.path(rel))
    }

    fn dir_str(&self) -> String {
        s(&self.dir)
    }

    /// Mounts again on the same directory (after the daemon was killed).
    fn remount(&mut self, env: &Env) {
        assert!(!self.daemon.alive(), "the old daemon is still running");
        self.daemon = Mount::spawn(env, &self.dir, &[]);
    }

    /// Waits for the daemon to exit after an unmount: status 0, its "unmounted" line, and
    /// the kernel no longer lists the mount.
    fn assert_exits_unmounted(&mut self) {
        let status = self.daemon.wait(Duration::from_secs(30));
        assert!(
            status.success(),
            "cascade mount: {status}\n{}",
            self.daemon.log()
        );
        let want = format!("cascade mount: {} unmounted", self.dir.display());
        assert!(
            self.daemon.lines().contains(&want),
            "no {want:?} line:\n{}",
            self.daemon.log()
        );
        assert!(
            !cascade_fuse::is_cascade_mount(&self.dir).expect("read mountinfo"),
            "{} is still mounted",
            self.dir.display()
        );
    }

    /// `cascade umount DIR`, which must succeed, and the daemon's clean exit.
    fn unmount(&mut self, env: &Env) {
        let out = env.cascade(&["umount", &self.dir_str()], &[]);
        assert!(
            out.ok() && out.stderr.is_empty(),
            "cascade umount: {out}\ndaemon:\n{}",
            self.daemon.log()
        );
        self.assert_exits_unmounted();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if cascade_fuse::is_cascade_mount(&self.dir).unwrap_or(true) {
            let _ = cascade_fuse::unmount(&self.dir, true);
        }
        if cascade_fuse::is_cascade_mount(&self.dir).unwrap_or(true) {
            // Never remove a directory tree through a live mount: leave it behind.
            std::mem::forget(self.tmp.take());
        }
        // The daemon is killed and reaped by its own Drop, the directory removed by tmp's.
    }
}

// ---------------------------------------------------------------------------------------
// 1. coreutils, tar, Python, df
// ---------------------------------------------------------------------------------------

#[test]
fn coreutils_work_through_the_mount() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-coreutils", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let src = env.tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir src");
    let big = pattern_at(11, 0, 5 * MIB + 123);
    let small = b"hello cascade\n".to_vec();
    let (src_big, src_empty, src_small) = (
        src.join("big.bin"),
        src.join("empty"),
        src.join("small.txt"),
    );
    write(&src_big, &big);
    write(&src_empty, b"");
    write(&src_small, &small);

    // mkdir -p, cp
    sh("mkdir", &["-p", &m.p("d1/d2/d3")]);
    assert!(m.path("d1/d2/d3").is_dir());
    assert!(env.store().stat("/d1/d2/d3").expect("stat").is_dir());
    sh(
        "cp",
        &[&s(&src_big), &s(&src_empty), &s(&src_small), &m.p("d1/")],
    );
    let sums = sh("sha256sum", &[&s(&src_big), &m.p("d1/big.bin")]).stdout;
    let digests: Vec<&str> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        digests.len() == 2 && digests[0] == digests[1],
        "sha256sum of the original and the copy:\n{sums}"
    );
    sh("cmp", &[&s(&src_big), &m.p("d1/big.bin")]);
    sh("cmp", &[&s(&src_empty), &m.p("d1/empty")]);
    sh("cmp", &[&s(&src_small), &m.p("d1/small.txt")]);
    assert_bytes(&env.read("/d1/big.bin"), &big, "store /d1/big.bin after cp");
    assert_eq!(env.store().stat("/d1/empty").expect("stat").size, 0);
    assert_eq!(env.read("/d1/small.txt"), small);

    // ls
    let listed: Vec<String> = sh("ls", &["-1", &m.p("d1")])
        .stdout
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(listed, ["big.bin", "d2", "empty", "small.txt"]);
    let long = sh("ls", &["-ln", &m.p("d1/big.bin")]).stdout;
    assert!(long.contains(&format!(" {} ", big.len())), "ls -ln: {long}");

    // mv across directories: a file, then a directory, then over an existing file
    sh("mv", &[&m.p("d1/big.bin"), &m.p("d1/d2/d3/moved.bin")]);
    assert!(!m.path("d1/big.bin").exists());
    assert_eq!(store_errno(&env, "/d1/big.bin"), Some(libc::ENOENT));
    sh("cmp", &[&s(&src_big), &m.p("d1/d2/d3/moved.bin")]);
    sh("mv", &[&m.p("d1/d2"), &m.p("top2")]);
    assert_eq!(names(&m.path("d1")), ["empty", "small.txt"]);
    assert_bytes(
        &env.read("/top2/d3/moved.bin"),
        &big,
        "store /top2/d3/moved.bin",
    );
    write(&m.path("top2/x"), b"to be replaced");
    sh("mv", &[&m.p("d1/small.txt"), &m.p("top2/x")]);
    assert_eq!(read(&m.path("top2/x")), small);
    assert_eq!(names(&m.path("top2")), ["d3", "x"]);

    // rm, rmdir
    sh("rm", &[&m.p("top2/x")]);
    assert!(!m.path("top2/x").exists());
    assert_eq!(store_errno(&env, "/top2/x"), Some(libc::ENOENT));
    let refused = run_with_timeout(command("rmdir", &[&m.p("top2")]), RUN);
    assert!(
        !refused.ok() && refused.stderr.contains("not empty"),
        "rmdir of a directory that is not empty: {refused}"
    );
    sh("mkdir", &[&m.p("gone")]);
    sh("rmdir", &[&m.p("gone")]);
    assert!(!m.path("gone").exists());
    assert_eq!(store_errno(&env, "/gone"), Some(libc::ENOENT));

    // truncate -s down, then up (zeros)
    sh("cp", &[&s(&src_big), &m.p("d1/t.bin")]);
    sh("truncate", &["-s", "1000", &m.p("d1/t.bin")]);
    assert_eq!(
        std::fs::metadata(m.path("d1/t.bin")).expect("stat").len(),
        1000
    );
    assert_eq!(env.store().stat("/d1/t.bin").expect("stat").size, 1000);
    assert_bytes(
        &read(&m.path("d1/t.bin")),
        &big[..1000],
        "t.bin cut to 1000",
    );
    sh("truncate", &["-s", "3M", &m.p("d1/t.bin")]);
    let mut want = big[..1000].to_vec();
    want.resize(3 * MIB, 0);
    assert_bytes(&read(&m.path("d1/t.bin")), &want, "t.bin extended to 3M");
    assert_bytes(
        &env.read("/d1/t.bin"),
        &want,
        "store /d1/t.bin extended to 3M",
    );

    // chmod
    sh("chmod", &["640", &m.p("d1/t.bin")]);
    assert_eq!(
        sh("stat", &["-c", "%a", &m.p("d1/t.bin")]).stdout.trim(),
        "640"
    );
    assert_eq!(
        env.store().stat("/d1/t.bin").expect("stat").mode & 0o7777,
        0o640
    );
    sh("chmod", &["700", &m.p("d1")]);
    assert_eq!(
        std::fs::metadata(m.path("d1"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777,
        0o700
    );
    assert_eq!(env.store().stat("/d1").expect("stat").mode & 0o7777, 0o700);

    // touch -d (an existing file), touch (a new one)
    sh(
        "touch",
        &["-d", "2001-02-03 04:05:06.5 UTC", &m.p("d1/empty")],
    );
    assert_eq!(
        sh("stat", &["-c", "%Y", &m.p("d1/empty")]).stdout.trim(),
        "981173106"
    );
    assert_eq!(
        env.store().stat("/d1/empty").expect("stat").mtime,
        981_173_106_500_000_000
    );
    let meta = std::fs::metadata(m.path("d1/empty")).expect("stat");
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (981_173_106, 500_000_000)
    );
    sh("touch", &[&m.p("d1/new")]);
    assert_eq!(env.store().stat("/d1/new").expect("stat").size, 0);

    // dd in and out with 1 MiB blocks, then in place
    sh(
        "dd",
        &[
            &format!("if={}", s(&src_big)),
            &format!("of={}", m.p("dd.bin")),
            "bs=1M",
        ],
    );
    let out = env.tmp.path().join("dd.out");
    sh(
        "dd",
        &[
            &format!("if={}", m.p("dd.bin")),
            &format!("of={}", s(&out)),
            "bs=1M",
        ],
    );
    sh("cmp", &[&s(&src_big), &s(&out)]);
    sh(
        "dd",
        &[
            &format!("if={}", s(&src_small)),
            &format!("of={}", m.p("dd.bin")),
            "bs=1M",
            "seek=2",
            "conv=notrunc",
        ],
    );
    let mut want = big.clone();
    want[2 * MIB..2 * MIB + small.len()].copy_from_slice(&small);
    assert_bytes(
        &read(&m.path("dd.bin")),
        &want,
        "dd.bin after dd conv=notrunc",
    );
    assert_bytes(&cascade_get(&env, "/dd.bin"), &want, "cascade get /dd.bin");

    // Concurrent writers (the daemon's threads, parallel direct writes): four dd processes
    // on four files, and two on disjoint halves of one file.
    let sources: Vec<(PathBuf, Vec<u8>)> = (0..4)
        .map(|i| {
            let data = pattern_at(60 + i, 0, 6 * MIB + i as usize);
            let p = src.join(format!("par{i}"));
            write(&p, &data);
            (p, data)
        })
        .collect();
    let mut writers: Vec<Daemon> = sources
        .iter()
        .enumerate()
        .map(|(i, (p, _))| {
            let args = [
                format!("if={}", s(p)),
                format!("of={}", m.p(&format!("par{i}"))),
                "bs=1M".to_string(),
            ];
            Daemon::spawn(command("dd", &args), &format!("dd #{i}"))
        })
        .collect();
    let half = 3 * MIB;
    for (i, skip) in [(0, 0), (1, 3)] {
        let args = [
            format!("if={}", s(&sources[0].0)),
            format!("of={}", m.p("halves")),
            "bs=1M".to_string(),
            "count=3".to_string(),
            format!("skip={skip}"),
            format!("seek={skip}"),
            "conv=notrunc".to_string(),
        ];
        writers.push(Daemon::spawn(
            command("dd", &args),
            &format!("dd half #{i}"),
        ));
    }
    for w in &mut writers {
        let status = w.wait(RUN);
        assert!(status.success(), "{}: {status}\n{}", w.what, w.log());
    }
    for (i, (_, data)) in sources.iter().enumerate() {
        assert_bytes(&read(&m.path(&format!("par{i}"))), data, &format!("par{i}"));
    }
    assert_bytes(
        &read(&m.path("halves")),
        &sources[0].1[..2 * half],
        "halves written by two dd at once",
    );

    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!("coreutils_work_through_the_mount: {:.1} s", secs(t0));
}

/// A source tree for tar: nested and empty directories, many small files, odd sizes, several
/// modes, and whole-second mtimes (what a tar archive keeps).
fn make_tree(root: &Path) -> usize {
    for (dir, mode) in [
        ("a", 0o755),
        ("a/b", 0o750),
        ("a/b/c", 0o755),
        ("d", 0o755),
        ("e-empty", 0o700),
    ] {
        let p = root.join(dir);
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let mut files: Vec<(String, usize, u32)> = vec![
        ("a/zero".into(), 0, 0o644),
        ("a/one".into(), 1, 0o600),
        ("a/b/page".into(), 4096, 0o644),
        ("a/b/c/odd".into(), 65537, 0o755),
        ("a/b/c/big".into(), 2 * MIB + 3, 0o644),
        ("top.txt".into(), 100, 0o444),
    ];
    files.extend((0..40).map(|i| (format!("d/f{i:03}"), i * 37, 0o644)));
    let stamp = |i: usize| UNIX_EPOCH + Duration::from_secs(1_500_000_000 + i as u64 * 1000);
    for (i, (rel, len, mode)) in files.iter().enumerate() {
        let p = root.join(rel);
        write(&p, &pattern_at(100 + i as u64, 0, *len));
        File::options()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_modified(stamp(i)))
            .expect("set mtime");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).expect("chmod");
    }
    // Directories last: creating the files changed their mtimes.
    for (i, dir) in ["a/b/c", "a/b", "a", "d", "e-empty"].iter().enumerate() {
        File::open(root.join(dir))
            .and_then(|f| f.set_modified(stamp(1000 + i)))
            .expect("set directory mtime");
    }
    files.len() + 5
}

/// What a tree holds: relative path → (is a directory, mode bits, mtime in seconds, bytes).
fn tree_of(root: &Path) -> BTreeMap<String, (bool, u32, i64, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (bool, u32, i64, Vec<u8>)>) {
        for e in
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        {
            let p = e.expect("entry").path();
            let meta = std::fs::symlink_metadata(&p).expect("lstat");
            let rel = s(p.strip_prefix(root).expect("below root"));
            let data = if meta.is_file() { read(&p) } else { Vec::new() };
            out.insert(
                rel,
                (meta.is_dir(), meta.mode() & 0o7777, meta.mtime(), data),
            );
            if meta.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[track_caller]
fn assert_same_tree(got: &Path, want: &Path, entries: usize) {
    let (g, w) = (tree_of(got), tree_of(want));
    assert_eq!(w.len(), entries, "the source tree");
    assert_eq!(
        g.keys().collect::<Vec<_>>(),
        w.keys().collect::<Vec<_>>(),
        "names in {} and {}",
        got.display(),
        want.display()
    );
    for (rel, (dir, mode, mtime, data)) in &w {
        let (gdir, gmode, gmtime, gdata) = &g[rel];
        assert_eq!(
            (gdir, gmode, gmtime),
            (dir, mode, mtime),
            "{rel}: (directory, mode, mtime) in {} vs {}",
            got.display(),
            want.display()
        );
        assert_bytes(gdata, data, &format!("{rel} in {}", got.display()));
    }
}

#[test]
fn tar_round_trips_a_tree_through_the_mount() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-tar", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let src = env.tmp.path().join("src");
    let entries = make_tree(&src);

    // The archive is written into the mount, then extracted into the mount from there.
    sh("tar", &["cf", &m.p("tree.tar"), "-C", &s(&src), "."]);
    let listed = sh("tar", &["tf", &m.p("tree.tar")]).stdout;
    assert_eq!(listed.lines().count(), entries + 1, "tar tf:\n{listed}");
    std::fs::create_dir(m.path("tree")).expect("mkdir tree");
    sh("tar", &["xf", &m.p("tree.tar"), "-C", &m.p("tree")]);
    assert_same_tree(&m.path("tree"), &src, entries);
    sh("diff", &["-r", &s(&src), &m.p("tree")]);
    assert_bytes(
        &env.read("/tree/a/b/c/big"),
        &read(&src.join("a/b/c/big")),
        "store /tree/a/b/c/big",
    );

    // Out again: the archive file, and a pipe from the extracted tree.
    let out1 = env.tmp.path().join("out1");
    let out2 = env.tmp.path().join("out2");
    std::fs::create_dir(&out1).expect("mkdir");
    std::fs::create_dir(&out2).expect("mkdir");
    sh("tar", &["xf", &m.p("tree.tar"), "-C", &s(&out1)]);
    assert_same_tree(&out1, &src, entries);
    sh(
        "sh",
        &[
            "-c",
            &format!(
                "tar cf - -C '{}' . | tar xf - -C '{}'",
                m.p("tree"),
                s(&out2)
            ),
        ],
    );
    assert_same_tree(&out2, &src, entries);

    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "tar_round_trips_a_tree_through_the_mount: {:.1} s",
        secs(t0)
    );
}

#[test]
fn python_fsync_rename_stat_mmap_and_statvfs() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-python", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let script = programs().join("posix_ops.py");
    let out = sh(
        "python3",
        &[&s(&script), &m.dir_str(), &CAPACITY.to_string()],
    );
    assert_eq!(out.stdout.trim(), "ok", "{out}");

    // From outside: the store holds what Python wrote and saw.
    assert_bytes(
        &env.read("/py/sub/state.bin"),
        &periodic(3 * MIB + 11, 1, 0),
        "store /py/sub/state.bin",
    );
    assert_eq!(store_errno(&env, "/py/state.tmp"), Some(libc::ENOENT));
    let size = 2 * MIB + 3 * 4096 + 5;
    let mut want = periodic(size, 7, 3);
    let at = 100 * 4096 + 3;
    want[at..at + 17].copy_from_slice(b"HELLO-FROM-PWRITE");
    want[size - 17..].copy_from_slice(b"SECOND-DESCRIPTOR");
    assert_bytes(
        &store_read(&env.name, "/py/mapped.bin"),
        &want,
        "store /py/mapped.bin",
    );

    // df: the store's capacity, and its usage as the store counts it.
    let df = sh(
        "df",
        &["-B1", "--output=source,size,used,avail", &m.dir_str()],
    )
    .stdout;
    let fields: Vec<&str> = df.lines().nth(1).unwrap_or("").split_whitespace().collect();
    let status = env.store().status();
    let want_used = status.memory_used + status.spill_used;
    assert_eq!(
        fields,
        [
            format!("cascade:{}", env.name.trim_start_matches('/')),
            CAPACITY.to_string(),
            want_used.to_string(),
            (CAPACITY - want_used).to_string()
        ],
        "df:\n{df}"
    );
    assert_eq!(status.memory_capacity + status.spill_capacity, CAPACITY);
    assert!(want_used >= (3 + 2) * MIB as u64, "store usage {want_used}");

    m.unmount(&env);
    eprintln!(
        "python_fsync_rename_stat_mmap_and_statvfs: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 2, 3. A static C program and a Go program write and verify a checkpoint
// ---------------------------------------------------------------------------------------

/// The files programs/ckpt.c and programs/ckpt.go write: name → bytes.
fn ckpt_expected() -> Vec<(&'static str, Vec<u8>)> {
    let mut sparse = vec![0u8; 2 * MIB + 100];
    sparse[1_234_567..1_234_567 + 1000].copy_from_slice(&pattern_at(5, 1_234_567, 1000));
    let files = [
        ("rank0.dat", 3 * MIB + 5),
        ("rank1.dat", MIB),
        ("rank2.dat", 4096 + 17),
        ("empty.dat", 0),
    ];
    let mut manifest = String::new();
    let mut out = Vec::new();
    for (i, (name, len)) in files.into_iter().enumerate() {
        manifest.push_str(&format!("{name} {len}\n"));
        out.push((name, pattern_at(i as u64 + 1, 0, len)));
    }
    manifest.push_str(&format!("sparse.dat {}\n", sparse.len()));
    out.push(("sparse.dat", sparse));
    out.push(("MANIFEST", manifest.into_bytes()));
    out
}

/// `exe` must be statically linked: out of the preload library's reach.
fn assert_static(exe: &Path) {
    let out = run_with_timeout(command("ldd", &[exe]), RUN);
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains("not a dynamic executable"),
        "ldd {}: {out}",
        exe.display()
    );
}

/// Runs `exe write DIR` then `exe verify DIR` (DIR = `/<dir>` under the mount), then checks
/// the checkpoint from outside: through the mount, the store API and `cascade get`; finally
/// that `exe verify` notices one byte changed through the store.
fn checkpoint_program(env: &Env, m: &Mount, exe: &Path, dir: &str) {
    assert_static(exe);
    std::fs::create_dir(m.path(dir)).expect("mkdir checkpoint directory");
    let wrote = run_ok(command(exe, &["write", &m.p(dir)]));
    assert_eq!(
        wrote.stdout.trim(),
        format!("wrote 6 files in {}", m.p(dir))
    );
    let verified = run_ok(command(exe, &["verify", &m.p(dir)]));
    let expected = ckpt_expected();
    let total: usize = expected
        .iter()
        .filter(|(n, _)| *n != "MANIFEST")
        .map(|(_, d)| d.len())
        .sum();
    assert_eq!(
        verified.stdout.trim(),
        format!("verified 6 files, {total} bytes in {}", m.p(dir))
    );

    let mut want_names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    want_names.sort();
    assert_eq!(names(&m.path(dir)), want_names, "listing through the mount");
    let mut in_store: Vec<String> = env
        .store()
        .read_dir(dir)
        .expect("read_dir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    in_store.sort();
    assert_eq!(in_store, want_names, "listing in the store");
    for (name, data) in &expected {
        let path = format!("{dir}/{name}");
        assert_bytes(
            &read(&m.path(&path)),
            data,
            &format!("{path} through the mount"),
        );
        assert_bytes(&env.read(&path), data, &format!("{path} in the store"));
        assert_bytes(
            &cascade_get(env, &path),
            data,
            &format!("cascade get {path}"),
        );
        let meta = env.store().stat(&path).expect("stat");
        assert_eq!(meta.mode & 0o7777, 0o644, "{path}: mode");
    }

    // The program's check is a real one: a byte changed behind its back is found.
    let victim = format!("{dir}/rank0.dat");
    let at = 2 * MIB as u64 + 12345;
    let f = env
        .store()
        .open(&victim, &OpenOptions::new().write(true))
        .expect("open for writing");
    f.write_all_at(&[!pat(1, at)], at).expect("write");
    drop(f);
    let caught = run_with_timeout(command(exe, &["verify", &m.p(dir)]), RUN);
    assert!(
        caught.status.code() == Some(1) && caught.stderr.contains(&format!("byte {at} differs")),
        "{} verify after a byte was changed in the store: {caught}",
        exe.display()
    );
}

#[test]
fn static_c_program_writes_and_verifies_a_checkpoint() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-static-c", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let exe = env.tmp.path().join("ckpt-static");
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_string());
    sh(
        &cc,
        &[
            "-static",
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            &s(&exe),
            &s(&programs().join("ckpt.c")),
        ],
    );
    checkpoint_program(&env, &m, &exe, "/ckpt-c");
    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "static_c_program_writes_and_verifies_a_checkpoint: {:.1} s",
        secs(t0)
    );
}

/// The go command: on PATH, or where the Go distribution installs it (scripts/test.sh).
fn go() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("go"))
        .find(|p| p.is_file())
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
        .expect("no go command on PATH or in /usr/local/go/bin: install Go (scripts/test.sh does)")
}

#[test]
fn go_program_writes_and_verifies_a_checkpoint() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-go", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let exe = env.tmp.path().join("ckpt-go");
    let gopath = env.tmp.path().join("gopath");
    // The build cache outlives the test (compiling the std library takes a while); it is
    // the one tests of cascade-cli use, in the target's scratch directory.
    let gocache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache");
    let mut build = command(
        go(),
        &[
            OsStr::new("build"),
            OsStr::new("-o"),
            exe.as_os_str(),
            programs().join("ckpt.go").as_os_str(),
        ],
    );
    build
        .current_dir(env.tmp.path())
        .env("GOCACHE", &gocache)
        .env("GOPATH", &gopath)
        .env("GOTOOLCHAIN", "local")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0");
    run_ok(build);
    checkpoint_program(&env, &m, &exe, "/ckpt-go");
    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "go_program_writes_and_verifies_a_checkpoint: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 4. FUSE, the preload library and the store API on the same files, no remount
// ---------------------------------------------------------------------------------------

/// `cascade run --mount PREFIX -- ARGS...`: a program with the preload library, which sees
/// the store's `/x` as `PREFIX/x`.
fn preloaded(env: &Env, prefix: &str, args: &[&str]) -> Out {
    let mut cmd = env.cli();
    cmd.args(["run", "--mount", prefix, "--"]).args(args);
    run_with_timeout(cmd, RUN)
}

fn preloaded_ok(env: &Env, prefix: &str, args: &[&str]) -> Out {
    let out = preloaded(env, prefix, args);
    assert!(out.ok(), "cascade run -- {args:?}: {out}");
    out
}

#[test]
fn fuse_preload_and_store_api_see_each_others_changes_at_once() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-mix", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let prefix = format!("/cascade-fusemix-{}", std::process::id());
    let _prefix_dir = RemoveDir(prefix.clone());
    assert!(
        !Path::new(&prefix).exists() || names(Path::new(&prefix)).is_empty(),
        "{prefix} exists on the host with files in it"
    );
    let pre = |rel: &str| format!("{prefix}/{}", rel.trim_start_matches('/'));
    let local = env.tmp.path().join("local");
    std::fs::create_dir(&local).expect("mkdir");

    // Written through FUSE: read by a preloaded program (cmp against a local copy, cat) and
    // through the store API.
    let a = pattern_at(21, 0, 3 * MIB + 7);
    std::fs::create_dir(m.path("mix")).expect("mkdir through the mount");
    write(&m.path("mix/a.bin"), &a);
    write(&m.path("mix/note.txt"), b"written through FUSE\n");
    write(&local.join("a.bin"), &a);
    preloaded_ok(
        &env,
        &prefix,
        &["cmp", &pre("mix/a.bin"), &s(&local.join("a.bin"))],
    );
    let other = local.join("other.bin");
    write(&other, &pattern_at(22, 0, a.len()));
    let differs = preloaded(&env, &prefix, &["cmp", &pre("mix/a.bin"), &s(&other)]);
    assert_eq!(
        differs.status.code(),
        Some(1),
        "cmp of different files: {differs}"
    );
    let cat = preloaded_ok(&env, &prefix, &["cat", &pre("mix/note.txt")]);
    assert_eq!(cat.stdout, "written through FUSE\n");
    assert_bytes(
        &store_read(&env.name, "/mix/a.bin"),
        &a,
        "/mix/a.bin through the store API",
    );
    assert!(
        !Path::new(&pre("mix/a.bin")).exists(),
        "the preloaded programs must have read the store, not the host's {prefix}"
    );

    // Written by preloaded programs and the store API: seen through the mount at once.
    preloaded_ok(
        &env,
        &prefix,
        &[
            "sh",
            "-c",
            &format!("echo hello-from-preload > {}", pre("mix/b.txt")),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(m.path("mix/b.txt")).expect("read b.txt through the mount"),
        "hello-from-preload\n"
    );
    let c = pattern_at(23, 0, 2 * MIB + 99);
    write(&local.join("c.bin"), &c);
    preloaded_ok(
        &env,
        &prefix,
        &["cp", &s(&local.join("c.bin")), &pre("mix/c.bin")],
    );
    assert_bytes(
        &read(&m.path("mix/c.bin")),
        &c,
        "c.bin (cp under cascade run) through the mount",
    );
    let d = pattern_at(24, 0, 70_000);
    env.write("/mix/d.bin", &d);
    assert_bytes(
        &read(&m.path("mix/d.bin")),
        &d,
        "d.bin (store API) through the mount",
    );

    // A file open through the mount sees an in-place write by a preloaded program on its
    // next read, and its new size.
    let open = File::open(m.path("mix/c.bin")).expect("open through the mount");
    let mut buf = vec![0u8; 4096];
    open.read_exact_at(&mut buf, 3 * 4096).expect("read");
    assert_bytes(
        &buf,
        &c[3 * 4096..4 * 4096],
        "c.bin block 3 before the patch",
    );
    let patch = pattern_at(25, 0, 4096);
    write(&local.join("patch"), &patch);
    preloaded_ok(
        &env,
        &prefix,
        &[
            "dd",
            &format!("if={}", s(&local.join("patch"))),
            &format!("of={}", pre("mix/c.bin")),
            "bs=4096",
            "seek=3",
            "conv=notrunc",
        ],
    );
    open.read_exact_at(&mut buf, 3 * 4096).expect("read");
    assert_bytes(
        &buf,
        &patch,
        "c.bin block 3 through the open file after dd conv=notrunc",
    );
    preloaded_ok(
        &env,
        &prefix,
        &["sh", "-c", &format!("printf tail >> {}", pre("mix/c.bin"))],
    );
    assert_eq!(
        open.metadata().expect("fstat").len(),
        c.len() as u64 + 4,
        "size through the open file after an append by a preloaded program"
    );
    let mut tail = [0u8; 4];
    open.read_exact_at(&mut tail, c.len() as u64)
        .expect("read the appended bytes");
    assert_eq!(&tail, b"tail");

    // Renames and removals by a preloaded program are seen at once; the open file follows
    // its inode, not its old name.
    preloaded_ok(&env, &prefix, &["mkdir", &pre("mix2")]);
    assert!(m.path("mix2").is_dir(), "mkdir by a preloaded program");
    preloaded_ok(
        &env,
        &prefix,
        &["mv", &pre("mix/b.txt"), &pre("mix2/b2.txt")],
    );
    assert!(
        !m.path("mix/b.txt").exists(),
        "mix/b.txt after mv by a preloaded program"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("mix2/b2.txt")).expect("read the renamed file"),
        "hello-from-preload\n"
    );
    assert_eq!(
        names(&m.path("mix")),
        ["a.bin", "c.bin", "d.bin", "note.txt"]
    );
    preloaded_ok(
        &env,
        &prefix,
        &["mv", &pre("mix/c.bin"), &pre("mix2/c-moved.bin")],
    );
    assert_eq!(names(&m.path("mix2")), ["b2.txt", "c-moved.bin"]);
    open.read_exact_at(&mut buf, 3 * 4096)
        .expect("read after the rename");
    assert_bytes(
        &buf,
        &patch,
        "c.bin block 3 through the open file after its rename",
    );
    preloaded_ok(&env, &prefix, &["rm", &pre("mix2/c-moved.bin")]);
    assert_eq!(names(&m.path("mix2")), ["b2.txt"]);
    assert_eq!(
        errno_of(std::fs::metadata(m.path("mix2/c-moved.bin"))),
        Some(libc::ENOENT)
    );
    open.read_exact_at(&mut buf, 0)
        .expect("read after the removal");
    assert_bytes(
        &buf,
        &c[..4096],
        "c.bin block 0 through the open file after its removal",
    );
    drop(open);

    // And a rename through the mount is seen by a preloaded program at once.
    std::fs::rename(m.path("mix/a.bin"), m.path("mix2/a-moved.bin")).expect("rename");
    preloaded_ok(
        &env,
        &prefix,
        &["cmp", &pre("mix2/a-moved.bin"), &s(&local.join("a.bin"))],
    );
    let gone = preloaded(&env, &prefix, &["cat", &pre("mix/a.bin")]);
    assert!(
        !gone.ok() && gone.stderr.contains("No such file"),
        "cat of the old name: {gone}"
    );

    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "fuse_preload_and_store_api_see_each_others_changes_at_once: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 5. kill -9 of the daemon while a program writes through the mount
// ---------------------------------------------------------------------------------------

#[test]
fn daemon_killed_mid_write_loses_nothing_closed_and_mounts_again() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-kill9", CAPACITY);
    let mut m = Mount::start(&env, &[]);

    // Closed before the kill: written with std::fs and cp.
    std::fs::create_dir(m.path("keep")).expect("mkdir");
    let closed = [
        ("keep/a.bin", pattern_at(31, 0, 4 * MIB + 1)),
        ("keep/b.bin", vec![0x5a]),
        ("keep/empty", Vec::new()),
    ];
    for (rel, data) in &closed {
        write(&m.path(rel), data);
    }
    let copied = pattern_at(32, 0, 3 * MIB);
    let local = env.tmp.path().join("copied.bin");
    write(&local, &copied);
    sh("cp", &[&s(&local), &m.p("keep/copied.bin")]);
    wait_released(&env, "/keep");

    // A writer that goes on until a write fails, caught with 8 MiB or more written.
    let mut writer = Daemon::spawn(
        command(
            "python3",
            &[&s(&programs().join("writer.py")), &m.p("keep/big.bin")],
        ),
        "writer.py",
    );
    wait_for(
        "big.bin to grow past 8 MiB",
        Duration::from_secs(60),
        || {
            env.store()
                .stat("/keep/big.bin")
                .is_ok_and(|meta| meta.size >= 8 * MIB as u64)
        },
    );
    let before = env.levels();
    assert!(
        levels_line(&before, "/keep/big.bin").is_some_and(|l| l.contains("writing")),
        "big.bin while written:\n{before}"
    );
    m.daemon.kill9();

    // The writer's next write fails, and so does any access to the mount.
    let status = writer.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "writer: {status}\n{}", writer.log());
    let log = writer.log();
    assert!(
        log.contains(&format!("errno {}", libc::ENOTCONN))
            || log.contains(&format!("errno {}", libc::ECONNABORTED)),
        "the writer's error: {log}"
    );
    assert_eq!(errno_of(std::fs::metadata(&m.dir)), Some(libc::ENOTCONN));
    assert_eq!(errno_of(std::fs::read_dir(&m.dir)), Some(libc::ENOTCONN));
    assert!(
        cascade_fuse::is_cascade_mount(&m.dir).expect("mountinfo"),
        "the dead mount is still listed until cleared"
    );

    // Mounted again on the same directory.
    m.remount(&env);
    for (rel, data) in &closed {
        assert_bytes(
            &read(&m.path(rel)),
            data,
            &format!("{rel} through the new mount"),
        );
        assert_bytes(
            &env.read(&format!("/{rel}")),
            data,
            &format!("/{rel} in the store"),
        );
    }
    assert_bytes(
        &read(&m.path("keep/copied.bin")),
        &copied,
        "keep/copied.bin",
    );
    assert_fsck_clean(&env);
    let after = env.levels();
    assert!(
        levels_line(&after, "/keep/big.bin").is_some_and(|l| l.contains("torn (writer died)")),
        "big.bin after the daemon's death:\n{after}"
    );
    for (rel, _) in &closed {
        let line = levels_line(&after, &format!("/{rel}")).unwrap_or("");
        assert!(
            line.contains("dirty"),
            "/{rel} after the daemon's death:\n{after}"
        );
    }
    // The torn file holds only what the writer wrote (or zeros, where a block was cut).
    let big = read(&m.path("keep/big.bin"));
    assert!(
        big.len() >= 8 * MIB && big.len() <= 64 * MIB,
        "big.bin: {} bytes",
        big.len()
    );
    assert_eq!(
        big.len() as u64,
        env.store().stat("/keep/big.bin").expect("stat").size
    );
    if let Some(bad) = big
        .iter()
        .enumerate()
        .position(|(i, &b)| b != (i % 256) as u8 && b != 0)
    {
        panic!(
            "big.bin: byte {bad} is {}, which the writer never wrote there",
            big[bad]
        );
    }

    // The new mount works: the torn file is replaced, more is written.
    write(&m.path("keep/big.bin"), b"rewritten");
    assert_eq!(read(&m.path("keep/big.bin")), b"rewritten");
    let levels = env.levels();
    assert!(
        levels_line(&levels, "/keep/big.bin").is_some_and(|l| l.contains("dirty")),
        "big.bin rewritten:\n{levels}"
    );
    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "daemon_killed_mid_write_loses_nothing_closed_and_mounts_again: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 6. Unmounting, and the command-line errors
// ---------------------------------------------------------------------------------------

/// A failed `cascade` command: exit 1 and exactly one line on stderr, returned.
#[track_caller]
fn one_line_failure(out: &Out) -> String {
    assert_eq!(out.status.code(), Some(1), "{out}");
    let lines = out.err_lines();
    assert_eq!(lines.len(), 1, "not one line on stderr: {out}");
    lines[0].to_string()
}

#[test]
fn umount_refuses_while_files_are_open_and_errors_are_one_line() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-umount", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    write(&m.path("f.txt"), b"x");
    let open = File::open(m.path("f.txt")).expect("open");

    // Busy: `cascade umount` refuses, and so does SIGTERM (the daemon keeps serving).
    let busy = env.cascade(&["umount", &m.dir_str()], &[]);
    assert_eq!(
        one_line_failure(&busy),
        format!(
            "cascade: {}: files are open under the mount; close them first, or use --lazy",
            m.dir_str()
        )
    );
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(m.daemon.pid() as i32, libc::SIGTERM) };
    m.daemon
        .wait_line("its refusal to unmount", Duration::from_secs(30), |l| {
            l.contains("not unmounted, files are open under it")
        });
    assert!(
        m.daemon.alive(),
        "the daemon exited on SIGTERM with a file open"
    );
    assert_eq!(
        read(&m.path("f.txt")),
        b"x",
        "read through the mount after SIGTERM"
    );
    let mut one = [0u8; 1];
    open.read_exact_at(&mut one, 0)
        .expect("read through the open file");
    assert_eq!(&one, b"x");

    // Closed: `cascade umount` succeeds, the daemon prints "unmounted" and exits 0.
    drop(open);
    m.unmount(&env);
    let again = env.cascade(&["umount", &m.dir_str()], &[]);
    assert_eq!(
        one_line_failure(&again),
        format!(
            "cascade: {}: no Cascade file system is mounted there",
            m.dir_str()
        )
    );

    // umount of a plain directory; mount on a missing directory, a file, a mounted one.
    let plain = env.tmp.path().join("plain");
    std::fs::create_dir(&plain).expect("mkdir");
    let out = env.cascade(&["umount", &s(&plain)], &[]);
    assert_eq!(
        one_line_failure(&out),
        format!(
            "cascade: {}: no Cascade file system is mounted there",
            s(&plain)
        )
    );
    let missing = env.tmp.path().join("missing");
    let out = env.cascade(&["mount", &s(&missing)], &[]);
    let line = one_line_failure(&out);
    assert!(
        line.starts_with(&format!("cascade: {}: ", s(&missing))) && line.contains("No such file"),
        "{line}"
    );
    let file = env.tmp.path().join("regular");
    write(&file, b"");
    let out = env.cascade(&["mount", &s(&file)], &[]);
    let line = one_line_failure(&out);
    assert!(
        line.starts_with(&format!("cascade: {}: ", s(&file))) && line.contains("Not a directory"),
        "{line}"
    );
    let mut m2 = Mount::start(&env, &[]);
    let out = env.cascade(&["mount", &m2.dir_str()], &[]);
    let line = one_line_failure(&out);
    assert!(line.contains("already mounted"), "{line}");
    assert!(
        m2.daemon.alive(),
        "the first daemon died of a second mount on its directory"
    );
    assert!(
        m2.path("f.txt").is_file(),
        "the first mount is not serving any more"
    );

    // --lazy with a file open: detached at once, the daemon exits once it is closed.
    let open = File::open(m2.path("f.txt")).expect("open");
    env.cascade_ok(&["umount", "--lazy", &m2.dir_str()], &[]);
    assert!(
        !cascade_fuse::is_cascade_mount(&m2.dir).expect("mountinfo"),
        "still listed after umount --lazy"
    );
    assert!(
        !m2.path("f.txt").exists(),
        "the directory still shows the store"
    );
    open.read_exact_at(&mut one, 0)
        .expect("read through the open file after --lazy");
    assert_eq!(&one, b"x");
    assert!(
        m2.daemon.alive(),
        "the daemon exited with a file still open"
    );
    drop(open);
    m2.assert_exits_unmounted();

    // SIGTERM with nothing open unmounts.
    let mut m3 = Mount::start(&env, &[]);
    // SAFETY: as above.
    unsafe { libc::kill(m3.daemon.pid() as i32, libc::SIGTERM) };
    m3.assert_exits_unmounted();
    eprintln!(
        "umount_refuses_while_files_are_open_and_errors_are_one_line: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 7. The agent drains a checkpoint written through the mount
// ---------------------------------------------------------------------------------------

#[test]
fn agent_drains_a_checkpoint_written_through_the_mount() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-agent", CAPACITY);
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir(&durable).expect("mkdir durable");
    let mut agent = env.agent(&s(&durable), &[]);
    let mut m = Mount::start(&env, &[]);

    let files = [
        expected("rank0.dat", pattern_at(41, 0, 5 * MIB + 3)),
        expected("sub/rank1.dat", pattern_at(42, 0, MIB)),
        expected("empty.dat", Vec::new()),
        expected("meta.txt", b"step 42\n".to_vec()),
    ];
    std::fs::create_dir_all(m.path("ckdir/sub")).expect("mkdir through the mount");
    for f in &files[1..] {
        write(&m.path(&format!("ckdir/{}", f.rel)), &f.data);
    }
    // The big one with cp (1 MiB writes).
    let local = env.tmp.path().join("rank0.dat");
    write(&local, &files[0].data);
    sh("cp", &[&s(&local), &m.p("ckdir/rank0.dat")]);

    wait_released(&env, "/ckdir");
    env.cascade_ok(&["commit", "/ckdir"], &[]);
    env.cascade_ok(
        &["wait", "/ckdir", "--level", "durable", "--timeout", "60"],
        &[],
    );
    for f in &files {
        let object = durable.join("ckdir").join(&f.rel);
        assert_bytes(
            &read(&object),
            &f.data,
            &format!("durable {}", object.display()),
        );
        let sidecar = std::fs::read_to_string(format!("{}.blake3", object.display()))
            .unwrap_or_else(|e| panic!("{}.blake3: {e}", object.display()));
        let base = f.rel.rsplit('/').next().expect("name");
        assert_eq!(
            sidecar,
            format!("{}  {base}\n", f.blake3),
            "{}.blake3",
            object.display()
        );
    }
    let store = durable_at(&durable);
    assert_durable_checkpoint(&store, "ckdir", &files.iter().collect::<Vec<_>>());
    let levels = env.levels();
    assert!(
        levels_line(&levels, "/ckdir/").is_some_and(|l| l.contains("complete")),
        "{levels}"
    );
    assert!(
        agent.log().contains("ckdir"),
        "the agent's log does not mention ckdir:\n{}",
        agent.log()
    );
    m.unmount(&env);
    stop_agent(&mut agent);
    eprintln!(
        "agent_drains_a_checkpoint_written_through_the_mount: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 8. --kernel-cache
// ---------------------------------------------------------------------------------------

#[test]
fn kernel_cache_mount_sees_preload_writes_at_the_next_open() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-kcache", CAPACITY);
    let mut m = Mount::start(&env, &["--kernel-cache"]);
    assert!(
        m.daemon.lines()[0].contains("kernel cache"),
        "start line: {}",
        m.daemon.log()
    );
    let prefix = format!("/cascade-fusekc-{}", std::process::id());
    let _prefix_dir = RemoveDir(prefix.clone());

    let first = pattern_at(51, 0, 2 * MIB);
    write(&m.path("f.bin"), &first);
    assert_bytes(&read(&m.path("f.bin")), &first, "f.bin read twice (cached)");
    assert_bytes(&read(&m.path("f.bin")), &first, "f.bin read twice (cached)");
    let second = pattern_at(52, 0, 2 * MIB);
    let local = env.tmp.path().join("second.bin");
    write(&local, &second);
    preloaded_ok(
        &env,
        &prefix,
        &[
            "dd",
            &format!("if={}", s(&local)),
            &format!("of={prefix}/f.bin"),
            "bs=1M",
            "conv=notrunc",
        ],
    );
    assert_bytes(&read(&m.path("f.bin")), &second, "f.bin at the next open");
    sh("cmp", &[&s(&local), &m.p("f.bin")]);
    m.unmount(&env);
    eprintln!(
        "kernel_cache_mount_sees_preload_writes_at_the_next_open: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 9. Listing a big directory in batches while its entries are removed
// ---------------------------------------------------------------------------------------

#[test]
fn listing_a_directory_in_batches_skips_nothing_while_entries_are_removed() {
    let (_serial, t0) = begin();
    let env = Env::new("fuse-listing", CAPACITY);
    let mut m = Mount::start(&env, &[]);
    let exe = env.tmp.path().join("listing");
    sh(
        "gcc",
        &[
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            &s(&exe),
            &s(&programs().join("listing.c")),
        ],
    );
    const N: usize = 700;
    std::fs::create_dir(m.path("many")).expect("mkdir");
    let mut want: Vec<String> = (0..N)
        .map(|i| format!("checkpoint-shard-with-a-long-name-{i:05}.dat"))
        .collect();
    for name in &want {
        write(&m.path(&format!("many/{name}")), b"");
    }
    want.sort();
    assert_eq!(names(&m.path("many")), want, "listing through the mount");

    // Read in 4 KiB batches: several round trips, each name once.
    let listed = run_ok(command(&exe, &["list", &m.p("many")])).stdout;
    let calls: usize = listed
        .trim()
        .strip_prefix(&format!("{N} entries in "))
        .and_then(|rest| rest.strip_suffix(" calls"))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("listing list: {listed}"));
    assert!(calls > 3, "{N} entries in only {calls} getdents calls");

    // Each batch unlinked before the next is read: still every entry, once.
    let unlinked = run_ok(command(&exe, &["unlink", &m.p("many")])).stdout;
    assert!(
        unlinked.starts_with(&format!("{N} entries in ")),
        "listing unlink: {unlinked}"
    );
    assert_eq!(names(&m.path("many")), Vec::<String>::new());
    assert!(env.store().read_dir("/many").expect("read_dir").is_empty());
    std::fs::remove_dir(m.path("many")).expect("rmdir the emptied directory");
    m.unmount(&env);
    eprintln!(
        "listing_a_directory_in_batches_skips_nothing_while_entries_are_removed: {:.1} s",
        secs(t0)
    );
}

// ---------------------------------------------------------------------------------------
// 10. Spill-over, fsync and a full store through the mount
// ---------------------------------------------------------------------------------------

/// A store of 8 MiB of memory and a 16 MiB spill file: a 20 MiB file written through the
/// mount spills, `fsync` (dd conv=fsync) succeeds and the bytes read back; df counts memory
/// plus spill; writing past the whole capacity fails with ENOSPC (dd says "No space left on
/// device") and leaves the earlier file intact.
#[test]
fn spilled_files_fsync_and_a_full_store_gives_enospc() {
    let (_serial, t0) = begin();
    let name = format!("/cascade-faults-fuse-spill-{}", std::process::id());
    let _ = Store::destroy_forced(&name);
    let spill_dir = tempfile::tempdir().expect("spill dir");
    let store = Store::create(&cascade_store::StoreConfig {
        name: name.clone(),
        capacity: 8 * MIB as u64,
        chunk_size: 1 << 20,
        max_files: 1024,
        spill: Some(cascade_store::SpillConfig {
            path: spill_dir.path().join("spill"),
            size: 16 * MIB as u64,
        }),
        prefault: cascade_store::Prefault::Off,
    })
    .expect("create the store");
    let env = Env::with(name, Some(store));
    let mut m = Mount::start(&env, &[]);

    let data = pattern_at(77, 0, 20 * MIB);
    let src = env.tmp.path().join("src.bin");
    write(&src, &data);
    sh(
        "dd",
        &[
            format!("if={}", s(&src)),
            format!("of={}", m.p("big.bin")),
            "bs=1M".to_string(),
            "conv=fsync".to_string(),
        ],
    );
    let status = env.store().status();
    assert!(
        status.spill_used >= 12 * MIB as u64,
        "the file did not spill: {status:?}"
    );
    assert_bytes(
        &read(&m.path("big.bin")),
        &data,
        "big.bin through the mount",
    );
    assert_bytes(&env.read("/big.bin"), &data, "store /big.bin");

    // statvfs: memory and spill together.
    let vfs = sh("stat", &["-f", "-c", "%b %S", &m.dir_str()]).stdout;
    let (blocks, bsize) = vfs
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("stat -f: {vfs:?}"));
    let total: u64 = blocks.parse::<u64>().expect("blocks") * bsize.parse::<u64>().expect("bsize");
    assert_eq!(total, 24 * MIB as u64, "stat -f: {vfs}");

    // Full: 8 MiB more do not fit in the 4 MiB left.
    let out = run_with_timeout(
        command(
            "dd",
            &[
                "if=/dev/zero".to_string(),
                format!("of={}", m.p("overflow.bin")),
                "bs=1M".to_string(),
                "count=8".to_string(),
            ],
        ),
        RUN,
    );
    assert!(!out.ok(), "dd past the capacity succeeded: {out}");
    assert!(
        out.stderr.contains("No space left on device"),
        "dd past the capacity: {out}"
    );
    assert_bytes(&read(&m.path("big.bin")), &data, "big.bin after ENOSPC");
    std::fs::remove_file(m.path("overflow.bin")).expect("rm overflow.bin");
    assert_fsck_clean(&env);
    m.unmount(&env);
    eprintln!(
        "spilled_files_fsync_and_a_full_store_gives_enospc: {:.1} s",
        secs(t0)
    );
}
