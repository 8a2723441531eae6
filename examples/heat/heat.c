/*
 * heat.c - a small, real simulation that checkpoints like an HPC code: Cascade's demo and
 * test subject.
 *
 * It solves the 2-D heat equation on an N x N grid with an explicit finite-difference
 * scheme (5-point stencil, alpha = 0.2, edges held at 0.0, a hot square in the middle at the
 * start and a constant source of +1.0 per step at the centre point), and every K steps
 * writes a checkpoint directory DIR/ckpt.<step> holding the grid (grid.bin, raw doubles,
 * written with open/write/close in chunks of at most 8 MiB) and meta.txt (step, n and the
 * FNV-1a 64 of grid.bin, written with stdio). It then publishes the checkpoint by writing
 * DIR/latest.tmp and rename()ing it onto DIR/latest, and restarts from DIR/latest when it
 * finds one, after verifying the checksum. The computation is deterministic, so a run that
 * crashed and restarted ends with the same grid, bit for bit, as an uninterrupted one.
 *
 * Why it exists: `cascade demo` and the tests need a real computation that checkpoints
 * (not a synthetic `dd`), with a crash in the middle of a checkpoint write that can be
 * reproduced (--kill-at-step), a restart, and per-checkpoint "stall" times: how long the
 * computation is stopped for each checkpoint's I/O, from before creating its directory to
 * after the rename onto latest (cascade_commit included; the grid's checksum is computed
 * just before, and old checkpoints are removed by --keep just after, outside the timing).
 * The same unmodified binary runs under `cascade run` with --dir below the mount prefix
 * (/cascade/...) and directly on a normal directory as the baseline.
 *
 * After a checkpoint's files are closed it calls int cascade_commit(const char *path) if
 * the process has one (looked up with dlsym, so the program needs no Cascade library to
 * build or run; under plain execution the lookup finds nothing and is skipped).
 *
 * The program never deletes checkpoints unless asked: retention is Cascade's job, and under
 * Cascade the demo passes --keep 0. --keep K is for the direct-write baseline, so that it
 * does not fill the disk.
 *
 * Build: cc -O2 -Wall -Wextra -Werror -o heat heat.c -lm -ldl   (C11; libc, libm, libdl)
 * Run:   ./heat --dir DIR [--n N] [--steps S] [--every K] [--keep K] [--kill-at-step M]
 *               [--no-commit] [--find-latest] [--fsync] [--quiet]   (./heat --help for details)
 *
 * --fsync makes each checkpoint durable before the run goes on, as a checkpoint on a parallel
 * file system must be: fsync of grid.bin and meta.txt, of the checkpoint's directory, and of
 * DIR after the rename onto latest (all inside the stall). The demo's honest baseline.
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNK ((size_t)8 << 20) /* largest single write() of grid.bin */
#define ALPHA 0.2
#define HOT 100.0
#define SOURCE 1.0
#define MAX_N 65536L

static const char *prog = "heat";

struct options {
    const char *dir;
    long n, steps, every, kill_at, keep;
    int commit, quiet, find_latest, sync;
};

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: %s --dir DIR [OPTIONS]\n"
            "\n"
            "Solves the 2-D heat equation on an N x N grid (explicit finite differences) and\n"
            "checkpoints every K steps to DIR/ckpt.<step>/{grid.bin,meta.txt}, published by\n"
            "renaming DIR/latest.tmp onto DIR/latest. Restarts from DIR/latest if it exists.\n"
            "\n"
            "Options:\n"
            "  --dir DIR           checkpoint directory (required; created if missing)\n"
            "  --n N               grid side, the grid is N*N doubles (default 1024, 3..%ld)\n"
            "  --steps S           total number of steps (default 200)\n"
            "  --every K           checkpoint every K steps (default 20)\n"
            "  --keep K            after publishing, remove checkpoints older than the newest\n"
            "                      K (default 0 = keep all; under Cascade the demo passes 0,\n"
            "                      retention is Cascade's job)\n"
            "  --kill-at-step M    simulate a crash: SIGKILL itself halfway through writing\n"
            "                      the grid of the checkpoint of step M (a multiple of K)\n"
            "  --no-commit         do not call cascade_commit on the checkpoint\n"
            "  --fsync             make each checkpoint durable inside its stall: fsync\n"
            "                      grid.bin, meta.txt, latest and the directories (what a\n"
            "                      checkpoint on a parallel file system has to wait for)\n"
            "  --find-latest       restart from the newest DIR/ckpt.<step> holding a meta.txt,\n"
            "                      found by listing DIR, instead of from DIR/latest (as restart\n"
            "                      logic that globs for its checkpoint does)\n"
            "  --quiet             print only the final line\n"
            "  --help              print this help\n"
            "\n"
            "Prints 'checkpoint step=<s> bytes=<b> stall_ms=<ms>' per checkpoint and a final\n"
            "line 'final step=<S> fnv1a64=<hex> checkpoints=<c> total_stall_ms=<ms>\n"
            "mean_stall_ms=<ms>'. A stall runs from before creating the checkpoint's\n"
            "directory to after the rename onto latest. Exit status: 0 done, 1 I/O or\n"
            "checkpoint error, 2 usage.\n",
            prog, MAX_N);
}

/* A usage error: one line on stderr, exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try --help)\n");
    exit(2);
}

/* A runtime failure: one line on stderr, exit 1. */
__attribute__((noreturn)) static void fail(const char *what, const char *path, int err)
{
    if (err)
        fprintf(stderr, "%s: %s %s: %s\n", prog, what, path, strerror(err));
    else
        fprintf(stderr, "%s: %s: %s\n", prog, path, what);
    exit(1);
}

#include "heat_common.h"

static void parse_args(int argc, char **argv, struct options *o)
{
    enum {
        O_DIR = 256, O_N, O_STEPS, O_EVERY, O_KILL, O_KEEP, O_NOCOMMIT, O_FIND, O_FSYNC_OPT, O_QUIET,
        O_HELP
    };
    static const struct option longopts[] = {
        {"dir", required_argument, NULL, O_DIR},
        {"n", required_argument, NULL, O_N},
        {"steps", required_argument, NULL, O_STEPS},
        {"every", required_argument, NULL, O_EVERY},
        {"kill-at-step", required_argument, NULL, O_KILL},
        {"keep", required_argument, NULL, O_KEEP},
        {"no-commit", no_argument, NULL, O_NOCOMMIT},
        {"find-latest", no_argument, NULL, O_FIND},
        {"fsync", no_argument, NULL, O_FSYNC_OPT},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    *o = (struct options){.n = 1024, .steps = 200, .every = 20, .commit = 1};
    opterr = 0; /* our own one-line messages */
    for (;;) {
        int c = getopt_long(argc, argv, ":", longopts, NULL);
        if (c == -1)
            break;
        switch (c) {
        case O_DIR:
            if (optarg[0] == '\0')
                bad_usage("--dir: empty directory name");
            o->dir = optarg;
            break;
        case O_N:
            o->n = parse_long("--n", optarg, 3, MAX_N);
            break;
        case O_STEPS:
            o->steps = parse_long("--steps", optarg, 0, 999999);
            break;
        case O_EVERY:
            o->every = parse_long("--every", optarg, 1, 999999);
            break;
        case O_KILL:
            o->kill_at = parse_long("--kill-at-step", optarg, 1, 999999);
            break;
        case O_KEEP:
            o->keep = parse_long("--keep", optarg, 0, 999999);
            break;
        case O_NOCOMMIT:
            o->commit = 0;
            break;
        case O_FIND:
            o->find_latest = 1;
            break;
        case O_FSYNC_OPT:
            o->sync = 1;
            break;
        case O_QUIET:
            o->quiet = 1;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        case ':':
            bad_usage("%s: missing value", argv[optind - 1]);
            break;
        default:
            bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        bad_usage("unexpected argument '%s'", argv[optind]);
    if (!o->dir)
        bad_usage("--dir DIR is required");
    if (o->kill_at && o->kill_at % o->every != 0)
        bad_usage("--kill-at-step must be a checkpoint step (a multiple of --every)");
}


/* ---------------------------------------------------------------------------------------
 * The simulation */

static void initial_grid(double *u, long n)
{
    size_t nn = (size_t)n * (size_t)n;
    for (size_t i = 0; i < nn; i++)
        u[i] = 0.0;
    long side = n / 8 > 0 ? n / 8 : 1;
    long lo = n / 2 - side / 2;
    for (long i = lo; i < lo + side; i++)
        for (long j = lo; j < lo + side; j++)
            if (i > 0 && i < n - 1 && j > 0 && j < n - 1)
                u[(size_t)i * (size_t)n + (size_t)j] = HOT;
}

/* One explicit step from u into v (boundaries of v stay 0.0). */
static void advance(const double *restrict u, double *restrict v, long n)
{
    size_t N = (size_t)n;
    for (size_t i = 1; i < N - 1; i++) {
        const double *up = u + (i - 1) * N, *row = u + i * N, *down = u + (i + 1) * N;
        double *out = v + i * N;
        for (size_t j = 1; j < N - 1; j++)
            out[j] = row[j] + ALPHA * (down[j] + up[j] + row[j + 1] + row[j - 1] - 4.0 * row[j]);
    }
    v[(N / 2) * N + N / 2] += SOURCE;
}

typedef int (*commit_fn)(const char *path);

/* --fsync: makes what fd holds durable, or fails with a one-line error. */
static void sync_fd(const struct options *o, int fd, const char *path)
{
    if (o->sync && fsync(fd) != 0)
        fail("cannot fsync", path, errno);
}

/* --fsync: makes directory `dir`'s entries durable. */
static void sync_dir(const struct options *o, const char *dir)
{
    if (!o->sync)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open", dir, errno);
    sync_fd(o, fd, dir);
    close(fd);
}

/* Writes, commits and publishes the checkpoint of step s, whose grid u has the FNV-1a 64
 * `sum`; returns its bytes. */
static long long checkpoint(const struct options *o, const double *u, long s, uint64_t sum)
{
    size_t grid_bytes = (size_t)o->n * (size_t)o->n * sizeof(double);
    char name[32], ck[PATH_MAX], path[PATH_MAX];
    snprintf(name, sizeof name, "ckpt.%06ld", s);
    join(ck, o->dir, name);

    if (mkdir(ck, 0755) != 0 && errno != EEXIST)
        fail("cannot create directory", ck, errno);

    /* grid.bin: open/write/close */
    join(path, ck, "grid.bin");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail("cannot create", path, errno);
    const char *bytes = (const char *)u;
    if (o->kill_at == s) {
        /* The simulated crash: half the grid is in the file, then SIGKILL. */
        if (write_all(fd, bytes, grid_bytes / 2) != 0)
            fail("cannot write", path, errno);
        fflush(stdout);
        raise(SIGKILL);
    }
    if (write_all(fd, bytes, grid_bytes) != 0)
        fail("cannot write", path, errno);
    sync_fd(o, fd, path);
    if (close(fd) != 0)
        fail("cannot close", path, errno);

    /* meta.txt: stdio */
    join(path, ck, "meta.txt");
    FILE *f = fopen(path, "w");
    if (!f)
        fail("cannot create", path, errno);
    int meta = fprintf(f, "step=%ld\nn=%ld\nfnv1a64=%016" PRIx64 "\n", s, o->n, sum);
    if (meta < 0 || fflush(f) != 0)
        fail("cannot write", path, errno);
    sync_fd(o, fileno(f), path);
    if (fclose(f) != 0)
        fail("cannot write", path, errno);
    sync_dir(o, ck);

    /* Tell Cascade the checkpoint is complete, if this process has Cascade. */
    if (o->commit) {
        void *sym = dlsym(RTLD_DEFAULT, "cascade_commit");
        commit_fn commit;
        /* POSIX's way to turn dlsym's object pointer into a function pointer. */
        memcpy(&commit, &sym, sizeof commit);
        if (sym) {
            char abs[PATH_MAX], cwd[PATH_MAX];
            const char *target = ck;
            if (ck[0] != '/' && getcwd(cwd, sizeof cwd)) {
                int len = snprintf(abs, sizeof abs, "%s/%s", cwd, ck);
                if (len > 0 && len < (int)sizeof abs)
                    target = abs;
            }
            errno = 0;
            if (commit(target) != 0)
                fprintf(stderr, "%s: warning: cascade_commit(%s) failed: %s\n", prog, target,
                        strerror(errno));
        }
    }

    /* Publish: DIR/latest.tmp, renamed onto DIR/latest. */
    char tmp[PATH_MAX], latest[PATH_MAX], line[40];
    join(tmp, o->dir, "latest.tmp");
    join(latest, o->dir, "latest");
    int len = snprintf(line, sizeof line, "%s\n", name);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail("cannot create", tmp, errno);
    if (write_all(fd, line, (size_t)len) != 0)
        fail("cannot write", tmp, errno);
    sync_fd(o, fd, tmp);
    if (close(fd) != 0)
        fail("cannot close", tmp, errno);
    if (rename(tmp, latest) != 0)
        fail("cannot rename", tmp, errno);
    sync_dir(o, o->dir);

    return (long long)grid_bytes + meta;
}

static long load_checkpoint(const struct options *o, double *u, const char *name,
                            const char *ck);

/* --find-latest: the name of the newest DIR/ckpt.<step> with a meta.txt (written after the
 * grid, so a checkpoint cut short by a crash is passed over), found by listing DIR; 0 when
 * there is none. */
static int newest_listed(const struct options *o, char *name, size_t size)
{
    DIR *d = opendir(o->dir);
    if (!d)
        fail("cannot list", o->dir, errno);
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = ckpt_step(e->d_name);
        char ck[PATH_MAX], meta[PATH_MAX];
        struct stat st;
        if (s <= best)
            continue;
        join(ck, o->dir, e->d_name);
        join(meta, ck, "meta.txt");
        if (stat(meta, &st) == 0 && S_ISREG(st.st_mode)) {
            best = s;
            snprintf(name, size, "%s", e->d_name);
        }
    }
    closedir(d);
    return best >= 0;
}

/* Loads the checkpoint DIR/latest names (with --find-latest: the newest one listed) into u;
 * returns its step, or -1 when there is none. Any problem with the checkpoint is a one-line
 * error and exit 1. */
static long restart(const struct options *o, double *u)
{
    char latest[PATH_MAX], name[256], ck[PATH_MAX];
    if (o->find_latest) {
        if (!newest_listed(o, name, sizeof name))
            return -1;
        join(ck, o->dir, name);
        return load_checkpoint(o, u, name, ck);
    }
    join(latest, o->dir, "latest");
    int fd = open(latest, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return -1;
        fail("cannot open", latest, errno);
    }
    ssize_t got = read_full(fd, name, sizeof name - 1);
    if (got < 0)
        fail("cannot read", latest, errno);
    close(fd);
    name[got] = '\0';
    name[strcspn(name, "\n")] = '\0';
    if (name[0] == '\0' || strchr(name, '/') || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0)
        fail("does not name a checkpoint directory", latest, 0);
    join(ck, o->dir, name);
    return load_checkpoint(o, u, name, ck);
}

/* Loads checkpoint directory `ck` (named `name` in DIR) into u, verified; returns its step. */
static long load_checkpoint(const struct options *o, double *u, const char *name,
                            const char *ck)
{
    char path[PATH_MAX];
    ssize_t got;
    int fd;

    /* meta.txt */
    join(path, ck, "meta.txt");
    FILE *f = fopen(path, "r");
    if (!f)
        fail("cannot open", path, errno);
    long step, n;
    uint64_t want;
    char hex[17];
    int fields = fscanf(f, "step=%ld n=%ld fnv1a64=%16[0-9a-f]", &step, &n, hex);
    fclose(f);
    if (fields != 3 || step < 0 || strlen(hex) != 16)
        fail("malformed checkpoint metadata", path, 0);
    want = strtoull(hex, NULL, 16);
    if (n != o->n) {
        fprintf(stderr, "%s: %s: checkpoint has n=%ld but --n is %ld\n", prog, path, n, o->n);
        exit(1);
    }

    /* grid.bin */
    size_t grid_bytes = (size_t)o->n * (size_t)o->n * sizeof(double);
    join(path, ck, "grid.bin");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("cannot open", path, errno);
    got = read_full(fd, (char *)u, grid_bytes);
    if (got < 0)
        fail("cannot read", path, errno);
    char extra;
    ssize_t more = got == (ssize_t)grid_bytes ? read_full(fd, &extra, 1) : 0;
    close(fd);
    if (got != (ssize_t)grid_bytes) {
        fprintf(stderr, "%s: %s: short file: %zd of %zu bytes\n", prog, path, got, grid_bytes);
        exit(1);
    }
    if (more != 0)
        fail("longer than the grid of --n", path, 0);
    uint64_t sum = fnv1a64(u, grid_bytes);
    if (sum != want) {
        fprintf(stderr, "%s: %s: checksum mismatch: fnv1a64 %016" PRIx64 ", meta.txt says %016"
                PRIx64 "\n", prog, path, sum, want);
        exit(1);
    }
    if (!o->quiet)
        printf("restarted from %s step=%ld\n", name, step);
    return step;
}

int main(int argc, char **argv)
{
    struct options o;
    parse_args(argc, argv, &o);
    /* Line-buffered, so the lines printed before a crash are not lost in a pipe's buffer. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    size_t nn = (size_t)o.n * (size_t)o.n;
    double *u = malloc(nn * sizeof *u), *v = malloc(nn * sizeof *v);
    if (!u || !v)
        fail("cannot allocate the grid", o.dir, ENOMEM);

    mkdir_p(o.dir);
    long s = restart(&o, u);
    if (s < 0) {
        s = 0;
        initial_grid(u, o.n);
        if (!o.quiet)
            printf("starting fresh\n");
    }
    memcpy(v, u, nn * sizeof *u); /* boundaries of both buffers are the fixed 0.0 */

    long written = 0;
    double total_ms = 0.0;
    while (s < o.steps) {
        advance(u, v, o.n);
        double *t = u;
        u = v;
        v = t;
        s++;
        if (s % o.every == 0) {
            /* The checksum for meta.txt is computed before the stall is timed: FNV-1a goes
             * a byte at a time (about 37 ms for a 32 MiB grid on a 2020s core), the same on
             * every storage target, and would otherwise hide the I/O time the stall is
             * meant to compare. */
            uint64_t sum = fnv1a64(u, nn * sizeof *u);
            double start = now_ms();
            long long bytes = checkpoint(&o, u, s, sum);
            double ms = now_ms() - start;
            written++;
            total_ms += ms;
            if (!o.quiet)
                printf("checkpoint step=%ld bytes=%lld stall_ms=%.3f\n", s, bytes, ms);
            if (o.keep > 0)
                prune(o.dir, o.keep, s);
        }
    }

    printf("final step=%ld fnv1a64=%016" PRIx64 " checkpoints=%ld total_stall_ms=%.3f "
           "mean_stall_ms=%.3f\n",
           s, fnv1a64(u, nn * sizeof *u), written, total_ms,
           written ? total_ms / (double)written : 0.0);
    free(u);
    free(v);
    return 0;
}
