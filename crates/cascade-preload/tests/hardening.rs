//! Issue 22 ("Hardening"): the library must neither abort nor hang its host program, and
//! must do what the running kernel does. Each test runs a real program (a C program compiled
//! here, or shell tools) under `cascade run` with the real library.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::Output;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cascade_store::Store;

mod common;
use common::compile_c;
use common::env::Env;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        stderr(out)
    )
}

/// Finding 2: `open(O_CREAT|O_DIRECTORY)` does on the store what the kernel does on a host
/// directory (Linux 6.4 and later: EINVAL, nothing created), whatever is at the path.
#[test]
fn creat_with_o_directory_does_what_the_kernel_does() {
    const SRC: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void try_open(const char *dir, const char *name, int flags) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    errno = 0;
    int fd = open(p, flags, 0644);
    int e = errno;
    struct stat st;
    const char *what = "missing";
    if (stat(p, &st) == 0)
        what = S_ISDIR(st.st_mode) ? "dir" : S_ISREG(st.st_mode) ? "file" : "other";
    printf("%s flags=%#x: %s %s; then %s\n", name, flags, fd >= 0 ? "fd" : "-1",
           fd >= 0 ? "" : strerror(e), what);
    if (fd >= 0)
        close(fd);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    const char *d = argv[1];
    char p[4096];
    snprintf(p, sizeof p, "%s/adir", d);
    if (mkdir(p, 0755) != 0) { perror("mkdir"); return 1; }
    snprintf(p, sizeof p, "%s/afile", d);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) { perror("create"); return 1; }
    close(fd);
    const int cd = O_CREAT | O_DIRECTORY;
    try_open(d, "new", cd | O_WRONLY);
    try_open(d, "new2", cd | O_RDONLY);
    try_open(d, "new3", cd | O_RDWR | O_EXCL);
    try_open(d, "adir", cd | O_RDONLY);
    try_open(d, "adir", cd | O_WRONLY);
    try_open(d, "afile", cd | O_WRONLY);
    try_open(d, "afile", cd | O_RDWR | O_EXCL);
    try_open(d, "nodir/x", cd | O_WRONLY);
    return 0;
}
"#;
    let exe = compile_c("creat_directory", SRC, &[]);
    let exe = exe.to_str().expect("utf-8 path");
    let env = Env::new();
    let host_dir = env.tmp.join("host");
    std::fs::create_dir(&host_dir).expect("host dir");
    // The same program on a host directory and on the store (both under the library).
    let host = env.command(exe, &[host_dir.to_str().expect("utf-8")]);
    assert!(host.status.success(), "{}", show(&host));
    env.mkdir_store("/d");
    let ours = env.command(exe, &[&format!("{}/d", env.mount)]);
    assert!(ours.status.success(), "{}", show(&ours));
    assert_eq!(stdout(&ours), stdout(&host), "store vs host directory");
}

/// Finding 8c: the library reads the umask without changing it, so a thread that sets it
/// never sees another value come back while other threads create files.
#[test]
fn threads_creating_files_leave_another_threads_umask_alone() {
    const SRC: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;
static atomic_int stop;

static void *creator(void *arg) {
    long id = (long)arg;
    char p[4096];
    long n = 0;
    while (!atomic_load(&stop)) {
        snprintf(p, sizeof p, "%s/t%ld-%ld", dir, id, n++ % 8);
        int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0666);
        if (fd < 0) { perror(p); exit(1); }
        close(fd);
        if (mkdir(p, 0777) == 0) rmdir(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    dir = argv[1];
    pthread_t t[3];
    for (long i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, creator, (void *)i);
    /* Set the mask, then read it back by setting it again: the old value must be ours. */
    long lost = 0;
    for (int i = 0; i < 200000; i++) {
        mode_t v = (i & 1) ? 027 : 002;
        umask(v);
        mode_t back = umask(v);
        if (back != v)
            lost++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    /* And the mask still applies to creation on the store. */
    umask(077);
    char p[4096];
    snprintf(p, sizeof p, "%s/private", dir);
    int fd = open(p, O_CREAT | O_WRONLY, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(p); return 1; }
    printf("lost %ld mode %o\n", lost, (unsigned)(st.st_mode & 07777));
    return 0;
}
"#;
    let exe = compile_c("umask_threads", SRC, &["-lpthread"]);
    let env = Env::new();
    env.mkdir_store("/u");
    let out = env.command(
        exe.to_str().expect("utf-8 path"),
        &[&format!("{}/u", env.mount)],
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(stdout(&out), "lost 0 mode 600\n", "{}", show(&out));
}

/// Finding 8b: a fork while another thread is inside a call on a Cascade descriptor (and so
/// holds its slot lock) gives a child that can use that descriptor: the child does not hang.
/// The parent bounds each wait with an alarm that kills a hung child.
#[test]
fn fork_while_another_thread_is_in_a_cascade_call_does_not_hang_the_child() {
    const SRC: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int fd;
static atomic_int stop;
static volatile pid_t child;

static void *writer(void *arg) {
    (void)arg;
    char buf[4096];
    memset(buf, 'w', sizeof buf);
    while (!atomic_load(&stop)) {
        if (pwrite(fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf) { perror("pwrite"); _exit(1); }
    }
    return NULL;
}

static void on_alarm(int sig) {
    (void)sig;
    if (child > 0)
        kill(child, SIGKILL);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    fd = open(argv[1], O_CREAT | O_RDWR, 0644);
    if (fd < 0) { perror(argv[1]); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    char first[4096];
    memset(first, 'w', sizeof first);
    if (pwrite(fd, first, sizeof first, 0) != (ssize_t)sizeof first) { perror("pwrite"); return 1; }
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    int hung = 0;
    for (int i = 0; i < 300 && !hung; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            struct stat st;
            char c;
            if (fstat(fd, &st) != 0 || pread(fd, &c, 1, 0) != 1 || c != 'w')
                _exit(3);
            _exit(0);
        }
        child = pid;
        alarm(20);
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        alarm(0);
        child = 0;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
            printf("child %d hung\n", i);
            hung = 1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("child %d failed: %#x\n", i, status);
            hung = 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    if (!hung)
        printf("ok\n");
    return 0;
}
"#;
    let exe = compile_c("fork_in_call", SRC, &["-lpthread"]);
    let env = Env::new();
    let out = env.command(
        exe.to_str().expect("utf-8 path"),
        &[&format!("{}/shared", env.mount)],
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(stdout(&out), "ok\n", "{}", show(&out));
}

/// Finding 8d: an agent that accepts a read-through request and never answers makes the
/// open fail with EIO and one line after CASCADE_FETCH_TIMEOUT, instead of hanging it.
#[test]
fn a_hung_agent_fails_the_open_after_the_fetch_timeout() {
    let env = Env::new();
    let socket = Store::agent_socket_path(&env.name);
    std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("lock dir");
    let listener = UnixListener::bind(&socket).expect("bind the agent socket");
    let (done_tx, done_rx) = mpsc::channel::<()>();
    // Some: connections held unanswered; None once the bound has passed (then closed at once).
    let held = Arc::new(Mutex::new(Some(Vec::new())));
    // The hung agent: answers `cascade run`'s STATUS (as an agent without counters), takes
    // every read-through request and says nothing until the program has ended — or, so that
    // a library without a timeout fails this test rather than hanging it, for 60 s.
    let releaser = {
        let held = held.clone();
        std::thread::spawn(move || {
            let _ = done_rx.recv_timeout(Duration::from_secs(60));
            held.lock().unwrap().take();
        })
    };
    let agent = {
        let held = held.clone();
        std::thread::spawn(move || {
            let mut requests = Vec::new();
            loop {
                let Ok((conn, _)) = listener.accept() else {
                    break;
                };
                let mut line = String::new();
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                if line == "STATUS\n" {
                    let _ = (&conn).write_all(b"ERR 22 unknown request\n");
                    continue;
                }
                if line == "QUIT\n" {
                    break;
                }
                requests.push(line);
                if let Some(held) = held.lock().unwrap().as_mut() {
                    held.push(conn);
                }
            }
            requests
        })
    };
    let start = Instant::now();
    let out = env
        .cascade_run("/bin/cat", &[&format!("{}/ckpt/latest", env.mount)])
        .env("CASCADE_FETCH_TIMEOUT", "0.5")
        .output()
        .expect("run cat");
    let took = start.elapsed();
    let _ = done_tx.send(());
    {
        let mut quit = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
        quit.write_all(b"QUIT\n").expect("quit");
    }
    let requests = agent.join().expect("agent thread");
    releaser.join().expect("releaser thread");
    let err = stderr(&out);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(
        err.contains("Input/output error"),
        "cat should fail with EIO: {}",
        show(&out)
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("cascade: ")).collect();
    assert_eq!(lines.len(), 1, "one line from the library: {}", show(&out));
    assert!(
        lines[0].contains("did not answer within 0.5 s")
            && lines[0].contains("CASCADE_FETCH_TIMEOUT"),
        "{}",
        show(&out)
    );
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

// ---- finding 8a: a corrupt store block fails calls, it does not abort the program ---------

/// Offsets inside the store's inode record (crates/cascade-store/src/layout.rs, `Inode`,
/// 704 bytes, 64-aligned): the parent link, the first child, the first name slot. The test
/// checks them against the store's own inode numbers before it writes anything.
const INODE_LINK: usize = 72;
const INODE_FIRST_CHILD: usize = 144;
const INODE_NAME: usize = 192;

/// The shared-memory file of the test's store.
fn shm_file(env: &Env) -> std::path::PathBuf {
    std::path::Path::new("/dev/shm").join(env.name.trim_start_matches('/'))
}

/// The offset of the inode record whose first name slot holds `name` (unique in the store).
fn inode_offset(shm: &[u8], name: &str) -> usize {
    let mut needle = name.as_bytes().to_vec();
    needle.push(0);
    let hits: Vec<usize> = shm
        .windows(needle.len())
        .enumerate()
        .filter(|(p, w)| *w == needle.as_slice() && *p >= INODE_NAME && (p - INODE_NAME) % 64 == 0)
        .map(|(p, _)| p - INODE_NAME)
        .collect();
    assert_eq!(hits.len(), 1, "inode records named {name}: {hits:?}");
    hits[0]
}

fn u32_at(shm: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(shm[at..at + 4].try_into().expect("4 bytes"))
}

fn ino_of(env: &Env, dir: &str, name: &str) -> u32 {
    let entries = env.store().read_dir(dir).expect("read_dir");
    let e = entries
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} not in {dir}"));
    u32::try_from(e.ino).expect("inode number")
}

/// Writes `bytes` at `offset` of the store's shared-memory file (behind the store's back).
fn scribble(env: &Env, offset: usize, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(shm_file(env))
        .expect("open the store's shm file");
    f.write_all_at(bytes, offset as u64).expect("scribble");
}

/// A directory whose first-child link points outside the inode table: listing it is EIO
/// (store code that indexed the inode table with the link panicked, and the panic, unwinding
/// into the `opendir` wrapper, aborted `ls`).
#[test]
fn a_corrupt_directory_link_is_eio_for_ls_not_an_abort() {
    let env = Env::new();
    env.mkdir_store("/hardening-d2");
    env.ok("echo one > $M/hardening-d2/only-child");
    let shm = std::fs::read(shm_file(&env)).expect("read the shm file");
    let dir = inode_offset(&shm, "hardening-d2");
    let child = ino_of(&env, "/hardening-d2", "only-child");
    assert_eq!(u32_at(&shm, dir + INODE_FIRST_CHILD), child, "layout moved");
    scribble(&env, dir + INODE_FIRST_CHILD, &0x7fff_fff0u32.to_le_bytes());
    let out = env.sh("ls $M/hardening-d2");
    assert!(out.status.code().is_some(), "ls died: {}", show(&out));
    assert!(!out.status.success(), "{}", show(&out));
    assert!(
        stderr(&out).contains("Input/output error"),
        "{}",
        show(&out)
    );
}

/// A damaged store block (a parent link read from the shared block pointing past the inode
/// table) fails the call with EIO and the program goes on. The directory's parent link is
/// broken after it was opened, so the `openat` of `../victim` relative to it resolves `..`
/// to the broken link: the store checks the link where it loads it and returns EIO ("store
/// block is damaged"). It once asserted there, and the panic boundary caught that; the
/// boundary itself is unit-tested in src/interpose/mod.rs, as nothing outside can make the
/// library panic any more.
#[test]
fn a_damaged_block_fails_the_call_with_eio_and_the_program_goes_on() {
    const SRC: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dfd < 0) { perror(argv[1]); return 1; }
    int shm = open(argv[2], O_RDWR);
    if (shm < 0) { perror(argv[2]); return 1; }
    unsigned char garbage[4] = {0xf0, 0xff, 0xff, 0x7f};
    if (pwrite(shm, garbage, 4, atol(argv[3])) != 4) { perror("pwrite"); return 1; }
    errno = 0;
    int fd = openat(dfd, "../victim", O_WRONLY);
    printf("openat %d %s\n", fd < 0 ? -1 : 0, strerror(errno));
    printf("still running\n");
    return 0;
}
"#;
    let exe = compile_c("panic_boundary", SRC, &[]);
    let env = Env::new();
    env.mkdir_store("/hardening-d1");
    env.ok("echo data > $M/hardening-d1/victim");
    let shm = std::fs::read(shm_file(&env)).expect("read the shm file");
    let dir = inode_offset(&shm, "hardening-d1");
    let victim = inode_offset(&shm, "victim");
    let dir_ino = ino_of(&env, "/", "hardening-d1");
    assert_eq!(
        u32_at(&shm, victim + INODE_LINK),
        dir_ino,
        "layout moved: the victim's parent link"
    );
    let out = env.command(
        exe.to_str().expect("utf-8 path"),
        &[
            &format!("{}/hardening-d1", env.mount),
            shm_file(&env).to_str().expect("utf-8 path"),
            &(dir + INODE_LINK).to_string(),
        ],
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        stdout(&out),
        "openat -1 Input/output error\nstill running\n",
        "{}",
        show(&out)
    );
    // An error, not a caught panic.
    assert!(!stderr(&out).contains("internal error"), "{}", show(&out));
}

/// Finding 8d, an agent that stopped accepting: once its listen backlog (here the one
/// connection `listen(fd, 0)` queues) is full, `connect` waits for CASCADE_FETCH_TIMEOUT and
/// the open fails with EIO and one line, as for an agent that stopped answering (not the
/// silent ENOENT of "no agent"). Run with LD_PRELOAD directly: `cascade run` would itself
/// wait on this socket for its STATUS request.
#[test]
fn an_agent_that_stopped_accepting_fails_the_open_after_the_fetch_timeout() {
    let env = Env::new();
    let socket = Store::agent_socket_path(&env.name);
    std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("lock dir");
    let path = std::ffi::CString::new(socket.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: plain socket/bind/listen on a zeroed sockaddr_un filled with a short path; every
    // result is checked; the descriptor is closed at the end of the test.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket");
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_bytes_with_nul();
        assert!(bytes.len() <= addr.sun_path.len(), "socket path too long");
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        assert_eq!(
            libc::bind(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len
            ),
            0,
            "bind"
        );
        assert_eq!(libc::listen(fd, 0), 0, "listen");
        fd
    };
    let lib = common::library_dir().join("libcascade.so");
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", "cat $M/a/x; cat $M/b/y"])
        .env("LD_PRELOAD", &lib)
        .env("CASCADE_STORE", &env.name)
        .env("CASCADE_MOUNT", &env.mount)
        .env("M", &env.mount)
        .env("CASCADE_FETCH_TIMEOUT", "0.3")
        .output()
        .expect("run sh");
    // SAFETY: closing the listening socket made above.
    unsafe { libc::close(fd) };
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{}", show(&out));
    for (cat, path) in [(0, "/a"), (2, "/b")] {
        assert!(
            lines[cat].starts_with(&format!("cascade: {}{path}: ", env.mount))
                && lines[cat].contains("did not answer within 0.3 s"),
            "{}",
            show(&out)
        );
        assert!(
            lines[cat + 1].contains("Input/output error"),
            "{}",
            show(&out)
        );
    }
}

/// The library keeps the effective ids new files are given: a program that changes them
/// (seteuid to drop privileges, a raw system call that changes one thread's) must still
/// create files owned as the kernel would own them. Compared with the same program on a host
/// directory.
#[test]
fn files_created_after_a_change_of_ids_are_owned_as_the_kernel_owns_them() {
    const SRC: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *dir;

static void create(const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_WRONLY | O_EXCL, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(p); exit(1); }
    close(fd);
    printf("%s %u:%u\n", name, (unsigned)st.st_uid, (unsigned)st.st_gid);
}

static int go[2];

/* Started before the change (a new thread copies its creator's ids), creates after it. */
static void *other_thread(void *arg) {
    char c;
    if (read(go[0], &c, 1) != 1) { perror("read"); exit(1); }
    create((const char *)arg);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    dir = argv[1];
    if (chmod(dir, 0777) != 0) { perror("chmod"); return 1; }
    create("root-first");
    if (setegid(65534) != 0 || seteuid(65534) != 0) { perror("seteuid"); return 1; }
    create("dropped");
    if (seteuid(0) != 0 || setegid(0) != 0) { perror("seteuid back"); return 1; }
    create("restored");
    pthread_t t;
    if (pipe(go) != 0 || pthread_create(&t, NULL, other_thread, "other-thread") != 0) return 1;
    /* A raw system call changes the calling thread's ids only. */
    if (syscall(SYS_setresuid, -1, 1234, -1) != 0) { perror("setresuid"); return 1; }
    create("this-thread");
    if (write(go[1], "g", 1) != 1) return 1;
    pthread_join(t, NULL);
    return 0;
}
"#;
    assert_eq!(
        cascade_store::ownership::euid(),
        0,
        "this test changes ids: run it as root (scripts/test.sh does)"
    );
    let exe = compile_c("ids_change", SRC, &["-lpthread"]);
    let expected =
        "root-first 0:0\ndropped 65534:65534\nrestored 0:0\nthis-thread 1234:0\nother-thread 0:0\n";
    let host_dir = std::env::temp_dir().join(format!("cascade-ids-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host_dir);
    std::fs::create_dir(&host_dir).expect("host dir");
    let host = std::process::Command::new(&exe)
        .arg(&host_dir)
        .output()
        .expect("run on the host");
    let _ = std::fs::remove_dir_all(&host_dir);
    assert!(host.status.success(), "{}", show(&host));
    assert_eq!(stdout(&host), expected, "the kernel itself");
    let env = Env::new();
    env.mkdir_store("/ids");
    let ours = env.command(
        exe.to_str().expect("utf-8 path"),
        &[&format!("{}/ids", env.mount)],
    );
    assert!(ours.status.success(), "{}", show(&ours));
    assert_eq!(stdout(&ours), expected, "{}", show(&ours));
}

/// A vfork child shares its parent's memory until it execs, and its exec kills any thread
/// it started wherever that thread is: dash vforks to run a command with a redirection, and
/// its child read the stored script, started the store's populate thread, and the exec
/// killed that thread inside the dynamic loader's lock, so dash hung in its next dlsym. The
/// library must start no thread in such a child, and the parent must still start its own.
/// The program counts the threads started in it by defining pthread_create itself.
#[test]
fn a_vfork_child_that_reads_a_stored_file_starts_no_thread() {
    const SRC: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static create_fn real_create;
/* In memory the vfork child shares: the parent sees the child's count. */
static volatile int started;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
    started++;
    return real_create(t, a, f, arg);
}

static int read_it(const char *path) {
    char buf[64];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    return n == 6 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    real_create = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    if (!real_create) return 3;
    started = 0;
    pid_t child = vfork();
    if (child == 0)
        _exit(read_it(argv[1]) != 0);
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 1;
    if (WEXITSTATUS(status) != 0) { fprintf(stderr, "the vfork child could not read\n"); return 1; }
    printf("threads started by the vfork child: %d\n", started);
    started = 0;
    if (read_it(argv[1]) != 0) { perror("read in the parent"); return 1; }
    printf("threads started by the parent: %d\n", started);
    return 0;
}
"#;
    let exe = compile_c("vfork_reader", SRC, &["-rdynamic", "-ldl"]);
    // Prefaulted at creation: a process that touches data maps those pages in with a thread.
    let env = Env::with_prefault(cascade_store::Prefault::Foreground);
    env.ok("printf stored > \"$M/data\"");
    let out = env.command(
        exe.to_str().expect("utf-8 path"),
        &[&format!("{}/data", env.mount)],
    );
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        stdout(&out),
        "threads started by the vfork child: 0\nthreads started by the parent: 1\n",
        "{}",
        show(&out)
    );
}
