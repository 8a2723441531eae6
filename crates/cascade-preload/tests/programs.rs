//! Real programs (coreutils, tar, sh, python, C stdio, C++ streams) on a real store, run
//! under `cascade run` (so through the interposition library), checked against the same work
//! done on the host or against the store's own API.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use cascade_store::Store;
use cascade_testkit::pattern;
use common::env::Env;

fn random_file(path: &Path, len: usize, seed: u64) {
    std::fs::write(path, pattern(len, seed)).expect("write source file");
}

#[test]
fn coreutils_copy_list_move_remove() {
    let env = Env::new();
    random_file(&env.tmp.join("src.bin"), 3_000_000, 1);
    env.ok("mkdir -p $M/ckpt.1/sub && cp $T/src.bin $M/ckpt.1/rank0.dat && cmp $T/src.bin $M/ckpt.1/rank0.dat");
    assert_eq!(
        env.read_store("/ckpt.1/rank0.dat"),
        std::fs::read(env.tmp.join("src.bin")).unwrap()
    );
    let ls = env.ok("ls -la $M/ckpt.1");
    assert!(
        ls.contains("rank0.dat") && ls.contains("sub") && ls.contains("3000000"),
        "{ls}"
    );
    assert_eq!(
        env.ok("stat -c '%s %F' $M/ckpt.1/rank0.dat").trim(),
        "3000000 regular file"
    );
    env.ok(
        "dd if=$T/src.bin of=$M/ckpt.1/dd.dat bs=1M status=none && cmp $T/src.bin $M/ckpt.1/dd.dat",
    );
    env.ok("cat $M/ckpt.1/rank0.dat > $T/back.bin && cmp $T/src.bin $T/back.bin");
    env.ok("mv $M/ckpt.1 $M/ckpt.2 && test -f $M/ckpt.2/rank0.dat && test ! -e $M/ckpt.1");
    let found = env.ok("find $M -type f | sort");
    assert_eq!(found.lines().count(), 2, "{found}");
    let du = env.ok("du -sb $M/ckpt.2 | cut -f1");
    assert!(du.trim().parse::<u64>().unwrap() >= 6_000_000, "{du}");
    env.ok("rm -r $M/ckpt.2 && test ! -e $M/ckpt.2");
    assert_eq!(env.store().status().memory_used, 0, "rm frees the chunks");
}

#[test]
fn tar_round_trip_in_both_directions() {
    let env = Env::new();
    std::fs::create_dir_all(env.tmp.join("tree/a/b")).unwrap();
    random_file(&env.tmp.join("tree/a/one"), 100_000, 2);
    random_file(&env.tmp.join("tree/a/b/two"), 1_500_000, 3);
    std::fs::write(env.tmp.join("tree/empty"), b"").unwrap();
    // host -> Cascade: extract into the store; Cascade -> host: archive from the store.
    env.ok("cd $T && tar cf $T/in.tar tree && mkdir $M/x && tar xf $T/in.tar -C $M/x");
    env.ok("tar cf $T/out.tar -C $M/x tree && mkdir $T/back && tar xf $T/out.tar -C $T/back");
    env.ok("diff -r $T/tree $T/back/tree");
    // An archive written into the store, read back by tar.
    env.ok("tar cf $M/arch.tar -C $T tree && tar tf $M/arch.tar | sort > $T/list && grep -q 'tree/a/b/two' $T/list");
}

#[test]
fn shell_redirections_share_the_offset_across_exec() {
    let env = Env::new();
    env.ok("echo one > $M/log && echo two >> $M/log && { echo three; cat $M/log; echo four; } > $M/log2");
    assert_eq!(env.read_store("/log"), b"one\ntwo\n");
    assert_eq!(env.read_store("/log2"), b"three\none\ntwo\nfour\n");
    // A program writing with stdio to an inherited descriptor (ls, printf).
    env.ok("mkdir $M/d && touch $M/d/a $M/d/b && ls $M/d > $M/listing && printf '%s-%d\\n' x 7 >> $M/listing");
    assert_eq!(env.read_store("/listing"), b"a\nb\nx-7\n");
}

#[test]
fn python_file_api_walk_pickle_mmap_and_cwd() {
    let env = Env::new();
    let script = r#"
import os, sys, mmap, shutil, pickle
M = os.environ["M"]
os.makedirs(M + "/py/d", exist_ok=True)
with open(M + "/py/f.txt", "w") as f:
    f.write("hello\n" * 1000)
assert open(M + "/py/f.txt").read() == "hello\n" * 1000
assert sorted(os.listdir(M + "/py")) == ["d", "f.txt"]
assert [w[0] for w in os.walk(M)] == [M, M + "/py", M + "/py/d"]
assert sorted(e.name for e in os.scandir(M + "/py")) == ["d", "f.txt"]
pickle.dump({"w": list(range(100))}, open(M + "/py/p.pkl", "wb"))
assert pickle.load(open(M + "/py/p.pkl", "rb")) == {"w": list(range(100))}
with open(M + "/py/f.txt", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    assert m[:5] == b"hello"
    m[0:5] = b"HELLO"
    m.close()
assert open(M + "/py/f.txt").read(6) == "HELLO\n"
shutil.copytree(M + "/py", M + "/py2")
assert sorted(os.listdir(M + "/py2")) == ["d", "f.txt", "p.pkl"]
os.chdir(M + "/py")
assert os.getcwd() == M + "/py"
assert open("p.pkl", "rb").read() == open(M + "/py2/p.pkl", "rb").read()
try:
    import numpy as np
    a = np.arange(200000.0)
    np.save(M + "/py/a.npy", a)
    assert (np.load(M + "/py/a.npy") == a).all()
except ImportError:
    pass
print("ok")
"#;
    let out = env.command("/usr/bin/python3", &["-c", script]);
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// Compiles a C or C++ program, runs it under `cascade run`, and expects it to print "ok".
fn run_c(env: &Env, compiler: &str, name: &str, source: &str) {
    let exe = compile(env, compiler, name, source);
    let out = env.command(exe.to_str().unwrap(), &[]);
    assert!(
        out.status.success(),
        "{name}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// Compiles a C or C++ program into the scratch dir.
fn compile(env: &Env, compiler: &str, name: &str, source: &str) -> PathBuf {
    let src = env.tmp.join(name);
    std::fs::write(&src, source).unwrap();
    let exe = env.tmp.join(format!("{name}.bin"));
    let out = Command::new(compiler)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run compiler");
    assert!(
        out.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn c_stdio_and_errno_exactly_as_the_kernel() {
    let env = Env::new();
    run_c(
        &env,
        "cc",
        "stdio.c",
        r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s (errno %d)\n", __LINE__, #c, errno); return 1; } } while (0)
#define FAILS(call, e) do { errno = 0; CHECK((call) == -1 && errno == (e)); } while (0)
int main(void) {
    const char *m = getenv("M");
    char p[512], q[512], line[128];
    snprintf(p, sizeof p, "%s/data.txt", m);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 1000; i++) fprintf(f, "line %d\n", i);
    CHECK(fileno(f) > 2);
    CHECK(fclose(f) == 0);
    f = fopen(p, "r");
    CHECK(f != NULL);
    int n = 0;
    while (fgets(line, sizeof line, f)) n++;
    CHECK(n == 1000);
    CHECK(fseek(f, 5, SEEK_SET) == 0 && fgetc(f) == '0' && ftell(f) == 6);
    rewind(f);
    int v;
    CHECK(fscanf(f, "line %d", &v) == 1 && v == 0);
    CHECK(fclose(f) == 0);
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == 8890 && S_ISREG(st.st_mode));
    /* errno as the kernel gives it */
    snprintf(q, sizeof q, "%s/missing", m);
    FAILS(open(q, O_RDONLY), ENOENT);
    FAILS(open(p, O_CREAT | O_EXCL | O_WRONLY, 0644), EEXIST);
    snprintf(q, sizeof q, "%s/dir", m);
    CHECK(mkdir(q, 0755) == 0);
    FAILS(mkdir(q, 0755), EEXIST);
    FAILS(open(q, O_WRONLY), EISDIR);
    FAILS(unlink(q), EISDIR);
    snprintf(q, sizeof q, "%s/data.txt/x", m);
    FAILS(open(q, O_RDONLY), ENOTDIR);
    FAILS(open(p, O_RDONLY | O_DIRECTORY), ENOTDIR);
    snprintf(q, sizeof q, "%s/dir/f", m);
    CHECK(close(open(q, O_CREAT | O_WRONLY, 0644)) == 0);
    snprintf(q, sizeof q, "%s/dir", m);
    FAILS(rmdir(q), ENOTEMPTY);
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0);
    FAILS(write(fd, "x", 1), EBADF);
    CHECK(close(fd) == 0);
    FAILS(close(fd), EBADF);
    char longname[400];
    memset(longname, 'x', sizeof longname);
    longname[399] = 0;
    snprintf(q, sizeof q, "%s/%s", m, longname);
    FAILS(open(q, O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
    /* O_APPEND, dup sharing the offset, lseek */
    fd = open(p, O_WRONLY | O_APPEND);
    int fd2 = dup(fd);
    CHECK(fd2 > fd && write(fd2, "end\n", 4) == 4 && lseek(fd, 0, SEEK_CUR) == 8894);
    CHECK(fcntl(fd, F_GETFL) & O_APPEND);
    CHECK(close(fd) == 0 && close(fd2) == 0);
    puts("ok");
    return 0;
}
"#,
    );
}

#[test]
fn cpp_streams_write_and_read_back() {
    let env = Env::new();
    run_c(
        &env,
        "c++",
        "streams.cpp",
        r#"
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>
int main() {
    std::string p = std::string(std::getenv("M")) + "/ckpt.bin";
    std::vector<double> v(100000);
    for (size_t i = 0; i < v.size(); i++) v[i] = i * 0.5;
    {
        std::ofstream out(p, std::ios::binary);
        out.write(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(double));
        if (!out) return 1;
    }
    std::vector<double> w(v.size());
    std::ifstream in(p, std::ios::binary);
    in.read(reinterpret_cast<char *>(w.data()), w.size() * sizeof(double));
    if (!in || w != v) return 2;
    std::cout << "ok" << std::endl;
    return 0;
}
"#,
    );
    assert_eq!(env.read_store("/ckpt.bin").len(), 800_000);
}

#[test]
fn paths_outside_the_mount_are_untouched() {
    let env = Env::new();
    env.ok("echo host > $T/plain && cat $T/plain > $T/copy && cmp $T/plain $T/copy");
    assert_eq!(std::fs::read(env.tmp.join("copy")).unwrap(), b"host\n");
    assert!(env.store().read_dir("/").unwrap().is_empty());
}

#[test]
fn flock_and_record_locks_conflict_between_opens_and_processes() {
    let env = Env::new();
    run_c(
        &env,
        "cc",
        "locks.c",
        r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s (errno %d)\n", __LINE__, #c, errno); return 1; } } while (0)
int main(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/locked", getenv("M"));
    int a = open(p, O_CREAT | O_RDWR, 0644), b = open(p, O_RDWR);
    CHECK(a >= 0 && b >= 0);
    CHECK(flock(a, LOCK_EX) == 0);
    errno = 0;
    CHECK(flock(b, LOCK_EX | LOCK_NB) == -1 && errno == EWOULDBLOCK);
    CHECK(flock(a, LOCK_UN) == 0 && flock(b, LOCK_EX | LOCK_NB) == 0 && flock(b, LOCK_UN) == 0);
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 100 };
    CHECK(fcntl(a, F_SETLK, &fl) == 0);
    pid_t child = fork();
    if (child == 0) {
        int c = open(p, O_RDWR);
        struct flock want = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 50, .l_len = 10 };
        _exit(fcntl(c, F_SETLK, &want) == -1 && (errno == EAGAIN || errno == EACCES) ? 0 : 1);
    }
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(close(a) == 0 && close(b) == 0 && unlink(p) == 0);
    puts("ok");
    return 0;
}
"#,
    );
    // unlink removed the file's lock file from the store's lock directory.
    let locks = Store::lock_dir(&env.name);
    let left: Vec<_> = std::fs::read_dir(&locks)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains('.') && n.chars().next().is_some_and(|c| c.is_ascii_digit()))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "lock files left in {}: {left:?}",
        locks.display()
    );
}

#[test]
fn working_directory_inside_the_mount_follows_exec() {
    let env = Env::new();
    env.ok("mkdir -p $M/r/s && touch $M/r/s/f");
    let m = &env.mount;
    // /bin/sh (dash) passes its own environment list to execve.
    assert_eq!(env.ok("cd $M/r && /bin/pwd").trim(), format!("{m}/r"));
    assert_eq!(env.ok("cd $M/r/s && ls").trim(), "f");
    // Leaving the mount in a child must not leave a stale virtual directory behind.
    assert_eq!(
        env.ok("cd $M/r && bash -c 'cd /tmp && /bin/pwd'").trim(),
        "/tmp"
    );
    // Python's subprocess with an explicit env (without CASCADE_CWD).
    let script = r#"
import os, subprocess
os.chdir(os.environ["M"] + "/r")
env = {k: v for k, v in os.environ.items() if k != "CASCADE_CWD"}
print(subprocess.run(["/bin/pwd"], env=env, capture_output=True, text=True).stdout.strip())
"#;
    let out = env.command("/usr/bin/python3", &["-c", script]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{m}/r")
    );
}

#[test]
fn links_are_refused_clearly() {
    let env = Env::new();
    env.ok("touch $M/x");
    let out = env.sh("ln -s x $M/l");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"));
    let out = env.sh("ln $M/x $M/hard");
    assert!(!out.status.success());
}

/// The listed calls that the programs above do not reach directly, each checked in C.
#[test]
fn every_listed_call_family_in_c() {
    let env = Env::new();
    run_c(
        &env,
        "cc",
        "calls.c",
        r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s (errno %d)\n", __LINE__, #c, errno); return 1; } } while (0)
int main(void) {
    const char *m = getenv("M");
    char p[512], q[512], r[PATH_MAX];
    snprintf(p, sizeof p, "%s/f", m);
    /* creat, pwritev2/preadv2, fallocate, posix_fallocate, sync_file_range, SEEK_DATA/HOLE */
    int fd = creat(p, 0600);
    CHECK(fd >= 0);
    struct iovec iov[2] = { { "abc", 3 }, { "defg", 4 } };
    CHECK(pwritev2(fd, iov, 2, 0, 0) == 7);
    CHECK(fallocate(fd, 0, 0, 4096) == 0 && posix_fallocate(fd, 0, 8192) == 0);
    CHECK(sync_file_range(fd, 0, 0, 0) == 0 && fdatasync(fd) == 0);
    CHECK(lseek(fd, 0, SEEK_DATA) == 0 && lseek(fd, 0, SEEK_HOLE) == 8192);
    CHECK(close(fd) == 0);
    fd = open(p, O_RDWR);
    char a[3], b[4];
    struct iovec in[2] = { { a, 3 }, { b, 4 } };
    CHECK(preadv2(fd, in, 2, 0, 0) == 7 && memcmp(a, "abc", 3) == 0 && memcmp(b, "defg", 4) == 0);
    /* dup3, F_DUPFD_CLOEXEC, F_GETFD/F_SETFD */
    int d = dup3(fd, 100, O_CLOEXEC);
    CHECK(d == 100 && (fcntl(d, F_GETFD) & FD_CLOEXEC));
    int e = fcntl(fd, F_DUPFD_CLOEXEC, 200);
    CHECK(e >= 200 && fcntl(e, F_SETFD, 0) == 0 && fcntl(e, F_GETFD) == 0);
    CHECK(lseek(e, 2, SEEK_SET) == 2 && lseek(fd, 0, SEEK_CUR) == 2);
    close(d); close(e);
    /* mmap MAP_PRIVATE: private writes stay private */
    char *map = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(map != MAP_FAILED && map[0] == 'a');
    map[0] = 'Z';
    CHECK(pread(fd, a, 1, 0) == 1 && a[0] == 'a' && munmap(map, 8192) == 0);
    /* sendfile works; splice and copy_file_range ask the caller to fall back */
    snprintf(q, sizeof q, "%s/copy", m);
    int out = open(q, O_CREAT | O_WRONLY, 0644);
    off_t off = 0;
    CHECK(sendfile(out, fd, &off, 7) == 7 && off == 7);
    errno = 0;
    CHECK(copy_file_range(fd, NULL, out, NULL, 7, 0) == -1 && errno == EXDEV);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    errno = 0;
    CHECK(splice(fd, NULL, pipefd[1], NULL, 7, 0) == -1 && errno == EINVAL);
    close(out);
    /* statfs / statvfs report the store's capacity */
    struct statfs sf; struct statvfs sv;
    CHECK(statfs(m, &sf) == 0 && fstatfs(fd, &sf) == 0 && sf.f_blocks > 0 && sf.f_bfree <= sf.f_blocks);
    CHECK(statvfs(p, &sv) == 0 && fstatvfs(fd, &sv) == 0 && sv.f_bsize > 0 && sv.f_namemax == 255);
    /* attributes are stored */
    CHECK(chmod(p, 0640) == 0 && fchmod(fd, 0604) == 0);
    CHECK(chown(p, 1234, 5678) == 0 && fchown(fd, -1, 42) == 0);
    struct timespec ts[2] = { { 1000, 0 }, { 2000, 500 } };
    CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    struct stat st;
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0604 && st.st_uid == 1234 && st.st_gid == 42);
    CHECK(st.st_atime == 1000 && st.st_mtime == 2000 && st.st_mtim.tv_nsec == 500);
    CHECK(futimens(fd, NULL) == 0 && fstat(fd, &st) == 0 && st.st_mtime > 2000);
    CHECK(access(p, R_OK | W_OK) == 0 && faccessat(AT_FDCWD, p, F_OK, 0) == 0);
    close(fd);
    /* realpath resolves inside the store */
    snprintf(q, sizeof q, "%s/./sub/../f", m);
    snprintf(r, sizeof r, "%s/sub", m);
    CHECK(mkdir(r, 0755) == 0);
    CHECK(realpath(q, r) != NULL && strcmp(r, p) == 0);
    /* renameat2 RENAME_NOREPLACE */
    snprintf(q, sizeof q, "%s/copy", m);
    errno = 0;
    CHECK(renameat2(AT_FDCWD, q, AT_FDCWD, p, RENAME_NOREPLACE) == -1 && errno == EEXIST);
    /* directories: readdir_r, telldir/seekdir, rewinddir, dirfd, fchdir, getdents64 */
    DIR *dir = opendir(m);
    CHECK(dir != NULL && dirfd(dir) >= 0);
    struct dirent ent, *res;
    int n = 0; long mark = -1;
    while (readdir_r(dir, &ent, &res) == 0 && res) { if (n == 1) mark = telldir(dir); n++; }
    CHECK(n == 5); /* . .. copy f sub */
    seekdir(dir, mark);
    CHECK(readdir(dir) != NULL);
    rewinddir(dir);
    CHECK(readdir(dir) != NULL);
    int dfd = open(m, O_RDONLY | O_DIRECTORY);
    char buf[4096];
    long got = getdents64(dfd, buf, sizeof buf);
    CHECK(got > 0);
    CHECK(fchdir(dirfd(dir)) == 0 && getcwd(r, sizeof r) && strcmp(r, m) == 0);
    CHECK(access("f", F_OK) == 0);
    closedir(dir);
    close(dfd);
    puts("ok");
    return 0;
}
"#,
    );
}
