//! Threads using one descriptor at once (issue 24, item 1). Reads and writes take neither
//! a lock nor a reference count on the descriptor (docs/interposition.md, "Descriptors");
//! these check what the kernel promises for a regular file all the same: write(2) and
//! read(2) on one description move its offset atomically, and a close or dup2 racing a
//! call never frees what that call uses. Each runs a real C program under `cascade run`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Output, Stdio};

mod common;
use common::compile_c;
use common::env::Env;

const SRC: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { THREADS = 4, EACH = 5000, REC = 64 };
static int fd;
static atomic_int stop;
static atomic_long failures;

/* A record: thread number and sequence number, then filler. */
static void record(char *r, int t, int i) {
    memset(r, 'a' + t, REC);
    snprintf(r, REC, "%d:%d:", t, i);
}

static void *appender(void *arg) {
    int t = (int)(long)arg;
    char r[REC];
    for (int i = 0; i < EACH; i++) {
        record(r, t, i);
        if (write(fd, r, REC) != REC) { perror("write"); exit(1); }
    }
    return NULL;
}

static unsigned char seen[THREADS][EACH];

static void *reader(void *arg) {
    (void)arg;
    char r[REC];
    for (;;) {
        ssize_t n = read(fd, r, REC);
        if (n == 0) return NULL;
        if (n != REC) { perror("read"); exit(1); }
        int t, i;
        if (sscanf(r, "%d:%d:", &t, &i) != 2 || t < 0 || t >= THREADS || i < 0 || i >= EACH) {
            printf("torn record\n"); exit(1);
        }
        __atomic_add_fetch(&seen[t][i], 1, __ATOMIC_RELAXED);
    }
}

static void *pwriter(void *arg) {
    int t = (int)(long)arg;
    char r[REC];
    record(r, t, 0);
    while (!atomic_load(&stop)) {
        ssize_t n = pwrite(fd, r, REC, (off_t)t * REC);
        if (n != REC && !(n < 0 && errno == EBADF)) { atomic_fetch_add(&failures, 1); }
    }
    return NULL;
}

/* "churn": waves of more threads than the library has hazard records (256), all inside
   write() on one descriptor at once; the threads of a wave end before the next starts, so
   its threads reuse the records the last one's gave back at their exit. */
enum { WAVES = 3, WAVE = 300, EACH_IN_WAVE = 20 };
static pthread_barrier_t together;
static unsigned char churn_seen[WAVES * WAVE][EACH_IN_WAVE];

static void *churner(void *arg) {
    int t = (int)(long)arg;
    char r[REC];
    pthread_barrier_wait(&together);
    for (int i = 0; i < EACH_IN_WAVE; i++) {
        record(r, t % 26, i);
        snprintf(r, REC, "%d:%d:", t, i);
        if (write(fd, r, REC) != REC) { perror("write"); exit(1); }
    }
    return NULL;
}

static int churn(const char *path) {
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) { perror(path); return 1; }
    static pthread_t wave[WAVE];
    for (int w = 0; w < WAVES; w++) {
        pthread_barrier_init(&together, NULL, WAVE);
        for (long t = 0; t < WAVE; t++)
            if (pthread_create(&wave[t], NULL, churner, (void *)(w * WAVE + t)) != 0) { printf("pthread_create\n"); return 1; }
        for (int t = 0; t < WAVE; t++) pthread_join(wave[t], NULL);
        pthread_barrier_destroy(&together);
    }
    off_t end = lseek(fd, 0, SEEK_END);
    if (end != (off_t)WAVES * WAVE * EACH_IN_WAVE * REC) { printf("size %lld\n", (long long)end); return 1; }
    char r[REC];
    for (off_t at = 0; at < end; at += REC) {
        int t, i;
        if (pread(fd, r, REC, at) != REC || sscanf(r, "%d:%d:", &t, &i) != 2 || t < 0 || t >= WAVES * WAVE || i < 0 || i >= EACH_IN_WAVE) {
            printf("torn record at %lld\n", (long long)at); return 1;
        }
        churn_seen[t][i]++;
    }
    for (int t = 0; t < WAVES * WAVE; t++)
        for (int i = 0; i < EACH_IN_WAVE; i++)
            if (churn_seen[t][i] != 1) { printf("record %d:%d written %d times\n", t, i, churn_seen[t][i]); return 1; }
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    pthread_t th[THREADS];
    if (!strcmp(argv[1], "write-read")) {
        fd = open(argv[2], O_CREAT | O_TRUNC | O_RDWR, 0600);
        if (fd < 0) { perror(argv[2]); return 1; }
        for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, appender, (void *)t);
        for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        off_t end = lseek(fd, 0, SEEK_CUR);
        if (end != (off_t)THREADS * EACH * REC) { printf("offset %lld after the writes\n", (long long)end); return 1; }
        lseek(fd, 0, SEEK_SET);
        for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, reader, (void *)t);
        for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        for (int t = 0; t < THREADS; t++)
            for (int i = 0; i < EACH; i++)
                if (seen[t][i] != 1) { printf("record %d:%d read %d times\n", t, i, seen[t][i]); return 1; }
        printf("ok\n");
        return 0;
    }
    if (!strcmp(argv[1], "churn")) return churn(argv[2]);
    if (!strcmp(argv[1], "replace")) {
        char other[4096];
        snprintf(other, sizeof other, "%s.other", argv[2]);
        fd = open(argv[2], O_CREAT | O_RDWR, 0600);
        int keep = dup(fd);
        if (fd < 0 || keep < 0) { perror(argv[2]); return 1; }
        for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, pwriter, (void *)t);
        for (int round = 0; round < 3000; round++) {
            int o = open(other, O_CREAT | O_RDWR, 0600);
            if (o < 0 || dup2(o, fd) != fd || close(o) != 0) { perror("replace"); return 1; }
            if (close(fd) != 0) { perror("close"); return 1; }
            if (dup2(keep, fd) != fd) { perror("dup2 back"); return 1; }
        }
        atomic_store(&stop, 1);
        for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
        if (atomic_load(&failures)) { printf("%ld failed calls\n", atomic_load(&failures)); return 1; }
        printf("ok\n");
        return 0;
    }
    if (!strcmp(argv[1], "heir")) {
        /* The parent opens (an anchored descriptor), forks and dies by SIGKILL; the child
           waits for that (EOF on a pipe only the parent held open), asks for a sweep, then
           writes through the inherited descriptor. */
        fd = open(argv[2], O_CREAT | O_TRUNC | O_WRONLY, 0600);
        if (fd < 0 || write(fd, "parent;", 7) != 7) { perror(argv[2]); return 1; }
        int p[2];
        if (pipe(p) != 0) { perror("pipe"); return 1; }
        pid_t child = fork();
        if (child < 0) { perror("fork"); return 1; }
        if (child > 0) {
            raise(SIGKILL);
            return 1;
        }
        close(p[1]);
        char c;
        if (read(p[0], &c, 1) != 0) { printf("pipe\n"); return 1; }
        printf("sweep now\n");
        fflush(stdout);
        char go[8];
        if (!fgets(go, sizeof go, stdin)) { printf("no go\n"); return 1; }
        if (write(fd, "child", 5) != 5) { perror("write after the sweep"); return 1; }
        if (close(fd) != 0) { perror("close"); return 1; }
        printf("ok\n");
        return 0;
    }
    return 2;
}
"#;

fn run(mode: &str, file: &str) -> Output {
    let exe = compile_c("shared_descriptors", SRC, &["-lpthread"]);
    let env = Env::new();
    let out = env.command(
        exe.to_str().expect("utf-8 path"),
        &[mode, &format!("{}/{file}", env.mount)],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text == "ok\n",
        "{mode}: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn threads_writing_and_reading_one_descriptor_each_get_their_own_bytes() {
    run("write-read", "records");
}

/// Threads beyond the hazard records (they take the slot lock), threads ending and new ones
/// reusing their records: every write lands once.
#[test]
fn waves_of_more_threads_than_hazard_records_each_write_their_own_bytes() {
    run("churn", "churn");
}

#[test]
fn a_descriptor_replaced_and_closed_under_running_writers_is_never_used_after_it_is_freed() {
    run("replace", "target");
}

/// A descriptor inherited over fork keeps its description alive in sweeps after the process
/// that opened it (and holds it through its anchor, not a named memfd) was killed.
#[test]
fn a_description_inherited_over_fork_outlives_its_killed_opener() {
    let exe = compile_c("shared_descriptors", SRC, &["-lpthread"]);
    let env = Env::new();
    let mut child = env
        .cascade_run(
            exe.to_str().expect("utf-8 path"),
            &["heir", &format!("{}/heir", env.mount)],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // The heir speaks once its parent is dead; `cascade run` waits for the parent only,
    // so the heir's output comes through the pipe it inherited.
    let first = lines.next().expect("a line").expect("read");
    assert_eq!(first, "sweep now");
    env.store().sweep_descriptions();
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("go");
    drop(stdin);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let mut errors = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut errors);
    }
    let _ = child.wait();
    assert_eq!(
        rest,
        ["ok"],
        "the heir could not write after the sweep: {errors}"
    );
    assert_eq!(env.read_store("/heir"), b"parent;child");
}
