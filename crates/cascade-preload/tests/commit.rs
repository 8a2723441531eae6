//! cascade_commit (include/cascade.h) from C programs linked with -lcascade, run under
//! `cascade run` and on their own, on a real store; the commit, busy, torn and error cases
//! are checked in the store's lifecycle state from this process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use cascade_store::Store;

mod common;
use common::compile_c_with_cascade;
use common::env::Env;

const PROGRAM: &str = r#"
#include <cascade.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char M[512];

static const char *at(const char *rel) {
    static char buf[4][1024];
    static int n;
    char *p = buf[n++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", M, rel);
    return p;
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) { perror(path); exit(10); }
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) { perror("write"); exit(11); }
    if (close(fd) != 0) { perror("close"); exit(12); }
}

/* Expects cascade_commit(path) to give `want_errno` (0: success). */
static void expect(const char *path, int want_errno, const char *what) {
    errno = 0;
    int rc = cascade_commit(path);
    int e = errno;
    if (want_errno == 0 ? rc != 0 : (rc != -1 || e != want_errno)) {
        fprintf(stderr, "%s: cascade_commit(%s) = %d, errno %d (%s), wanted errno %d; last: %s\n",
                what, path ? path : "NULL", rc, e, strerror(e), want_errno,
                cascade_strerror_last());
        exit(20);
    }
    if (want_errno != 0) {
        const char *msg = cascade_strerror_last();
        if (strncmp(msg, "cascade_commit: ", 16) != 0) {
            fprintf(stderr, "%s: unexpected last error %s\n", what, msg);
            exit(21);
        }
        printf("%s: %s\n", what, msg);
    }
}

int main(int argc, char **argv) {
    const char *m = getenv("CASCADE_MOUNT");
    snprintf(M, sizeof M, "%s", m ? m : "/cascade");
    const char *mode = argc > 1 ? argv[1] : "";

    if (strcmp(mode, "main") == 0) {
        if (mkdir(at("ckpt.1"), 0755) != 0) { perror("mkdir"); return 2; }
        write_file(at("ckpt.1/a.dat"), "alpha");
        write_file(at("ckpt.1/b.dat"), "bravo");
        expect(at("ckpt.1"), 0, "commit");

        /* A file still open for writing. */
        if (mkdir(at("ckpt.busy"), 0755) != 0) { perror("mkdir"); return 2; }
        int fd = open(at("ckpt.busy/f"), O_CREAT | O_WRONLY, 0644);
        if (fd < 0 || write(fd, "x", 1) != 1) { perror("busy"); return 3; }
        expect(at("ckpt.busy"), EBUSY, "busy");
        close(fd);

        expect(at("missing"), ENOENT, "missing");
        expect(M, EINVAL, "root");
        expect(at("ckpt.1/a.dat"), EINVAL, "nested");
        expect("/tmp/not-cascade", EINVAL, "outside");
        expect(NULL, EINVAL, "null");

        /* A checkpoint holding a committed one cannot be committed. */
        if (mkdir(at("outer"), 0755) != 0 || mkdir(at("outer/inner"), 0755) != 0) return 4;
        write_file(at("outer/inner/r0"), "inner");
        expect(at("outer/inner"), 0, "inner");
        expect(at("outer"), EINVAL, "outer");

        /* Relative to a working directory inside the mount. */
        if (chdir(M) != 0) { perror("chdir"); return 5; }
        if (mkdir("ckpt.3", 0755) != 0) { perror("mkdir rel"); return 6; }
        write_file("ckpt.3/r0.dat", "relative");
        expect("ckpt.3", 0, "relative");
        if (chdir("ckpt.3") != 0) { perror("chdir 2"); return 7; }
        expect("../ckpt.busy", 0, "dotdot");
        puts("main OK");
        return 0;
    }
    if (strcmp(mode, "hold") == 0) {
        /* Opens ckpt.2/x.dat for writing and waits to be killed. */
        mkdir(at("ckpt.2"), 0755);
        int fd = open(at("ckpt.2/x.dat"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || write(fd, "partial", 7) != 7) { perror("hold"); return 2; }
        printf("pid %d\n", (int)getpid());
        fflush(stdout);
        for (;;)
            pause();
    }
    if (strcmp(mode, "commit") == 0 && argc > 2) {
        errno = 0;
        int rc = cascade_commit(argv[2]);
        printf("rc=%d errno=%d msg=%s\n", rc, rc ? errno : 0, rc ? cascade_strerror_last() : "");
        return 0;
    }
    if (strcmp(mode, "rewrite") == 0 && argc > 2) {
        int fd = open(argv[2], O_WRONLY | O_TRUNC);
        if (fd < 0 || write(fd, "complete", 8) != 8 || close(fd) != 0) { perror("rewrite"); return 2; }
        puts("rewritten");
        return 0;
    }
    fprintf(stderr, "usage: commit_prog main|hold|commit PATH|rewrite PATH\n");
    return 64;
}
"#;

fn program() -> String {
    compile_c_with_cascade("commit_prog", PROGRAM)
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn root_entry(store: &Store, path: &str) -> cascade_store::LifeEntry {
    store
        .life_tree(path)
        .unwrap_or_else(|e| panic!("life_tree {path}: {e}"))
        .into_iter()
        .next()
        .expect("an entry")
}

#[test]
fn commit_records_the_checkpoint_and_reports_each_error() {
    let env = Env::new();
    let exe = program();
    let out = env.run(&exe, &["main"]);
    assert!(out.contains("main OK"), "{out}");
    // The one-line reasons name what is wrong.
    let m = &env.mount;
    assert!(
        out.contains(&format!(
            "busy: cascade_commit: {m}/ckpt.busy/f is still open for writing: Device or resource busy"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "missing: cascade_commit: {m}/missing: No such file or directory"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "nested: cascade_commit: {m}/ckpt.1/a.dat is inside the committed checkpoint {m}/ckpt.1;"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("root: cascade_commit: {m}: ")),
        "{out}"
    );
    assert!(
        out.contains(
            "outside: cascade_commit: /tmp/not-cascade is not under the Cascade mount prefix"
        ),
        "{out}"
    );
    assert!(
        out.contains("outer: cascade_commit: ") && out.contains("committed checkpoint"),
        "{out}"
    );

    let store = env.store();
    let c1 = root_entry(store, "/ckpt.1");
    assert!(c1.committed, "{c1:?}");
    assert!(c1.commit_seq > 0, "{c1:?}");
    let tree = store.life_tree("/ckpt.1").unwrap();
    assert_eq!(tree.len(), 3, "{tree:?}");
    assert!(tree[1..]
        .iter()
        .all(|e| !e.committed && e.writers == 0 && !e.torn));

    // Nothing else got committed by the failed calls; the later ones did, in order.
    assert!(!root_entry(store, "/outer").committed);
    let inner = root_entry(store, "/outer/inner");
    let rel = root_entry(store, "/ckpt.3");
    let busy = root_entry(store, "/ckpt.busy");
    assert!(inner.committed && rel.committed && busy.committed);
    assert!(c1.commit_seq < inner.commit_seq, "{c1:?} {inner:?}");
    assert!(inner.commit_seq < rel.commit_seq, "{inner:?} {rel:?}");
    assert!(rel.commit_seq < busy.commit_seq, "{rel:?} {busy:?}");
    assert!(!root_entry(store, "/ckpt.1/a.dat").committed);
}

#[test]
fn commit_works_in_a_program_linked_with_lcascade_without_cascade_run() {
    let env = Env::new();
    let exe = program();
    env.mkdir_store("/solo");
    env.store()
        .open(
            "/solo/r0",
            &cascade_store::OpenOptions::new().write(true).create(true),
        )
        .and_then(|f| f.write_all_at(b"data", 0))
        .expect("write /solo/r0");
    let out = Command::new(&exe)
        .args(["commit", &format!("{}/solo", env.mount)])
        .env_remove("LD_PRELOAD")
        .env("CASCADE_STORE", &env.name)
        .env("CASCADE_MOUNT", &env.mount)
        .output()
        .expect("run the program");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "rc=0 errno=0 msg="
    );
    let solo = root_entry(env.store(), "/solo");
    assert!(solo.committed && solo.commit_seq > 0, "{solo:?}");
}

#[test]
fn a_file_left_open_by_a_killed_writer_is_torn_until_rewritten() {
    let env = Env::new();
    let exe = program();
    let mut child = env
        .cascade_run(&exe, &["hold"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the holder's pid");
    let pid: i32 = line
        .trim()
        .strip_prefix("pid ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("holder said {line:?}"));
    let store = env.store();
    let x = root_entry(store, "/ckpt.2/x.dat");
    assert_eq!((x.writers, x.torn), (1, false), "{x:?}");

    // SAFETY: kill(2) of the program this test started (its pid, printed by itself).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = child.wait().expect("wait for cascade run");
    assert!(!status.success(), "{status}");

    // `cascade run` sweeps when its command ends: the dead writer's description is freed
    // (its claimer is dead, however young it is) and the file it was writing is torn. A sweep
    // from here finds nothing left to free.
    assert_eq!(store.sweep_descriptions(), 0);
    let x = root_entry(store, "/ckpt.2/x.dat");
    assert!(x.torn, "{x:?}");
    assert_eq!(x.writers, 0, "{x:?}");

    let ckpt = format!("{}/ckpt.2", env.mount);
    let out = env.run(&exe, &["commit", &ckpt]);
    assert!(
        out.starts_with(&format!("rc=-1 errno={} ", libc::EIO)),
        "{out}"
    );
    assert!(out.contains("x.dat is incomplete"), "{out}");
    assert!(!root_entry(store, "/ckpt.2").committed);

    let out = env.run(&exe, &["rewrite", &format!("{ckpt}/x.dat")]);
    assert_eq!(out.trim(), "rewritten");
    let x = root_entry(store, "/ckpt.2/x.dat");
    assert!(!x.torn, "{x:?}");
    assert_eq!(env.read_store("/ckpt.2/x.dat"), b"complete");
    let out = env.run(&exe, &["commit", &ckpt]);
    assert_eq!(out.trim(), "rc=0 errno=0 msg=");
    let c2 = root_entry(store, "/ckpt.2");
    assert!(c2.committed && c2.commit_seq > 0, "{c2:?}");
}
