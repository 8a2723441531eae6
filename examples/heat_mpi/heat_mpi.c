/*
 * heat_mpi.c - the MPI version of examples/heat/heat.c: the same 2-D heat equation, the
 * same final grid bit for bit, but computed by P ranks that checkpoint one file per rank
 * and can restart with a different number of ranks (N-to-M).
 *
 * Physics (identical to heat.c): N x N grid, explicit 5-point stencil, alpha = 0.2, edges
 * held at 0.0, a hot square (100.0) of side N/8 in the middle at the start, +1.0 per step at
 * the centre point (N/2, N/2). Each point is updated with exactly heat.c's expression, in
 * the same operation order, from the same inputs, so every rank computes the same doubles
 * as the serial code (build both with the same compiler and flags; no -ffast-math).
 *
 * Decomposition: rank r of P owns the whole rows [r*N/P, (r+1)*N/P) (integer division) and
 * keeps one halo row above and below, exchanged with its neighbours (MPI_Sendrecv) before
 * every step. 1 <= P <= N.
 *
 * Checkpoint of step s, every K steps, in DIR/ckpt.<s> (s printed %06ld like heat.c):
 *   rank.<r>.bin   rank r's rows, raw doubles, row-major, written by rank r with
 *                  open/write/close in chunks of at most 8 MiB
 *   meta.<r>.txt   written by rank r (stdio): step=, n=, nranks=, rank=, row_begin=,
 *                  row_end= (exclusive), fnv1a64= (FNV-1a 64 of rank.<r>.bin)
 *   meta.txt       written by rank 0 once every rank's files are closed: step=, n=,
 *                  nranks=, fnv1a64= (FNV-1a 64 of the whole grid, row-major: the same
 *                  value heat.c writes for the same grid). It is computed without
 *                  gathering the grid: FNV-1a is a running state over the bytes, so rank 0
 *                  hashes its rows and passes the state to rank 1, which continues over its
 *                  rows, and so on in rank order (a chain of MPI_Send/MPI_Recv of 8 bytes).
 * Order: every rank creates the directory (mkdir, EEXIST is fine: on a cluster every node
 * may have its own store), writes its two files and closes them; an MPI_Allreduce of the
 * bytes written (a barrier: no rank leaves it before every rank has closed its files) is
 * followed by rank 0 writing meta.txt, the cascade_commit call(s) (see --commit-by), and
 * rank 0 publishing the checkpoint by writing DIR/latest.tmp and rename()ing it onto
 * DIR/latest, as heat.c does. A directory left by a crashed run (the step is reached
 * again after a restart) is reused: rank 0 first removes its meta.txt and the files of
 * ranks >= P, so a published checkpoint never holds stale files of another rank count.
 *
 * Restart rule (N-to-M): when DIR/latest exists, rank 0 reads it and the checkpoint's
 * meta.txt (step, n, writer rank count Q, whole-grid checksum) and broadcasts them. Every
 * rank then reads all Q meta.<q>.txt (they must agree on step, n and Q, and their row
 * ranges must tile 0..N in rank order), and for every writer q whose rows overlap the rows
 * it now owns reads the whole rank.<q>.bin, checks its size ((row_end-row_begin)*N*8) and
 * its FNV-1a against meta.<q>.txt, and copies the overlapping rows. Finally the chained
 * FNV-1a of the loaded grid must equal meta.txt's. Any failure: one line on stderr from the
 * lowest rank that saw it (the ranks agree with an MPI_Allreduce first), exit 1 on every
 * rank. So a checkpoint written by any number of ranks restarts on any number of ranks.
 *
 * Fallback (--fallback): when a file of the checkpoint latest names is missing (on a cluster,
 * a node lost before its part of the checkpoint was durable: Cascade's read-through refuses
 * the files of such a checkpoint), every rank gives it up and the checkpoint K steps before
 * it is tried, and so on; without --fallback a missing file is an error like any other.
 *
 * Crash simulation: --kill-at-step M makes rank --kill-rank R (default 0) write half of its
 * rank.<R>.bin of checkpoint M and then raise(SIGKILL); mpirun then ends the other ranks.
 * Checkpoint M is never published (latest still names the one before).
 *
 * cascade_commit(path) is looked up with dlsym (the program builds and runs without
 * Cascade; under plain execution the lookup finds nothing and the call is skipped), and
 * called with the checkpoint directory's absolute path after every rank's files are closed
 * and meta.txt is written, before latest is published. --commit-by chooses who calls it:
 * rank0 (default, one call per job), node (the lowest rank of each node; the node's name is
 * $CASCADE_NODE if set, else MPI_Get_processor_name, so tests can simulate nodes), or all
 * (every rank). With node or all, a second barrier makes rank 0 publish latest only after
 * every commit returned.
 *
 * Output, from rank 0 only, in heat.c's formats (so the demo parses both):
 *   starting fresh
 *   restarted from ckpt.<s> step=<s> written_by=<Q> ranks=<P>
 *   checkpoint step=<s> bytes=<b> stall_ms=<ms>      b: all files of the checkpoint
 *   final step=<S> fnv1a64=<hex> checkpoints=<c> total_stall_ms=<ms> mean_stall_ms=<ms> ranks=<P>
 * The final fnv1a64 is the FNV-1a 64 of the whole grid (chained as above): equal to heat.c's
 * for the same --n and --steps, whatever P and however many restarts. A stall is measured
 * on rank 0 from before creating the checkpoint's directory to after the rename onto
 * latest, so it includes waiting for the slowest rank's write; the checksums are computed
 * before it and --keep's pruning (rank 0) after it, as in heat.c.
 *
 * Build: mpicc -O2 -Wall -Wextra -Werror -o heat_mpi heat_mpi.c -lm -ldl   (or `make` here)
 *        C11 with GNU extensions, the compiler's default dialect, like heat.c's build line:
 *        the dialect sets the floating-point contraction default (-std=c11 means
 *        -ffp-contract=off, gnu means fast), so both must be built the same way for their
 *        grids to agree bit for bit on targets with fused multiply-add.
 * Run:   mpirun -np P ./heat_mpi --dir DIR [--n N] [--steps S] [--every K] [--keep K]
 *               [--kill-at-step M] [--kill-rank R] [--commit-by rank0|node|all]
 *               [--no-commit] [--quiet]          (./heat_mpi --help for details)
 *        As root add --allow-run-as-root; with more ranks than cores, --oversubscribe.
 *        Started without mpirun it runs as a single rank (MPI singleton).
 * Exit status: 0 done, 1 I/O or checkpoint error, 2 usage (every rank exits the same way;
 * mpirun adds its own report of the non-zero exit). A SIGKILLed rank ends the job.
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
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

#define MAX_CHUNK ((size_t)8 << 20) /* largest single write() of a rank file */
#define ALPHA 0.2
#define HOT 100.0
#define SOURCE 1.0
#define MAX_N 65536L
#define TAG_HALO_UP 1
#define TAG_HALO_DOWN 2
#define TAG_FNV 3
#define NODE_NAME_MAX 256
#define ERROR_MAX 1024

static const char *prog = "heat_mpi";
static int rank, nranks;

enum commit_by { COMMIT_RANK0, COMMIT_NODE, COMMIT_ALL };

struct options {
    const char *dir;
    long n, steps, every, kill_at, kill_rank, keep;
    enum commit_by commit_by;
    int commit, quiet, fallback;
};

/* This rank's part of the grid: rows [lo, hi) of the N x N grid, stored with a halo row
 * above and below: local row 0 is global row lo-1, local row i is global row lo+i-1. */
struct slab {
    long n, lo, hi;
    double *u, *v; /* (hi - lo + 2) * n doubles each */
};

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: mpirun -np P %s --dir DIR [OPTIONS]\n"
            "\n"
            "Solves the 2-D heat equation on an N x N grid (explicit finite differences, the\n"
            "same computation and result as examples/heat/heat.c) on P ranks, each owning a\n"
            "band of rows, and checkpoints every K steps to DIR/ckpt.<step>/: rank.<r>.bin and\n"
            "meta.<r>.txt per rank, meta.txt from rank 0, published by renaming\n"
            "DIR/latest.tmp onto DIR/latest. Restarts from DIR/latest if it exists, with any\n"
            "number of ranks (each reads its rows from the files that hold them).\n"
            "\n"
            "Options:\n"
            "  --dir DIR           checkpoint directory (required; created if missing)\n"
            "  --n N               grid side, the grid is N*N doubles (default 1024, 3..%ld,\n"
            "                      at least the number of ranks)\n"
            "  --steps S           total number of steps (default 200)\n"
            "  --every K           checkpoint every K steps (default 20)\n"
            "  --keep K            after publishing, rank 0 removes checkpoints older than the\n"
            "                      newest K (default 0 = keep all; retention is Cascade's job)\n"
            "  --kill-at-step M    simulate a crash: rank R (--kill-rank) SIGKILLs itself\n"
            "                      halfway through writing its file of checkpoint M (a\n"
            "                      multiple of K)\n"
            "  --kill-rank R       the rank that crashes at --kill-at-step (default 0)\n"
            "  --commit-by WHO     who calls cascade_commit on the checkpoint directory:\n"
            "                      rank0 (default), node (lowest rank per node; node name\n"
            "                      $CASCADE_NODE, else the MPI processor name) or all\n"
            "  --no-commit         do not call cascade_commit\n"
            "  --fallback          when a file of the checkpoint latest names is missing (a\n"
            "                      node lost before its part was durable), restart from the\n"
            "                      checkpoint K steps before it instead, and so on\n"
            "  --quiet             print only the final line\n"
            "  --help              print this help\n"
            "\n"
            "Rank 0 prints 'checkpoint step=<s> bytes=<b> stall_ms=<ms>' per checkpoint and a\n"
            "final line 'final step=<S> fnv1a64=<hex> checkpoints=<c> total_stall_ms=<ms>\n"
            "mean_stall_ms=<ms> ranks=<P>'; fnv1a64 is of the whole grid, as heat.c's. A stall\n"
            "runs on rank 0 from before creating the checkpoint's directory to after the\n"
            "rename onto latest. Exit status: 0 done, 1 I/O or checkpoint error, 2 usage.\n",
            prog, MAX_N);
}

/* Ends every rank with `status` after a clean MPI_Finalize (all ranks must call it). */
__attribute__((noreturn)) static void finish(int status)
{
    MPI_Finalize();
    exit(status);
}

/* A usage error, seen identically by every rank: one line on stderr from rank 0, exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char *fmt, ...)
{
    if (rank == 0) {
        va_list ap;
        fprintf(stderr, "%s: ", prog);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, " (try --help)\n");
    }
    finish(2);
}

/* A runtime failure on this rank alone (the others may be waiting in a collective): one
 * line on stderr, then MPI_Abort ends the whole job with status 1. */
__attribute__((noreturn)) static void fail(const char *what, const char *path, int err)
{
    if (err)
        fprintf(stderr, "%s: rank %d: %s %s: %s\n", prog, rank, what, path, strerror(err));
    else
        fprintf(stderr, "%s: rank %d: %s: %s\n", prog, rank, path, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

#include "heat_common.h"

static void parse_args(int argc, char **argv, struct options *o)
{
    enum {
        O_DIR = 256, O_N, O_STEPS, O_EVERY, O_KILL, O_KILL_RANK, O_KEEP, O_COMMIT_BY,
        O_NOCOMMIT, O_QUIET, O_FALLBACK, O_HELP
    };
    static const struct option longopts[] = {
        {"dir", required_argument, NULL, O_DIR},
        {"n", required_argument, NULL, O_N},
        {"steps", required_argument, NULL, O_STEPS},
        {"every", required_argument, NULL, O_EVERY},
        {"kill-at-step", required_argument, NULL, O_KILL},
        {"kill-rank", required_argument, NULL, O_KILL_RANK},
        {"keep", required_argument, NULL, O_KEEP},
        {"commit-by", required_argument, NULL, O_COMMIT_BY},
        {"no-commit", no_argument, NULL, O_NOCOMMIT},
        {"quiet", no_argument, NULL, O_QUIET},
        {"fallback", no_argument, NULL, O_FALLBACK},
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
        case O_KILL_RANK:
            o->kill_rank = parse_long("--kill-rank", optarg, 0, INT_MAX);
            break;
        case O_KEEP:
            o->keep = parse_long("--keep", optarg, 0, 999999);
            break;
        case O_COMMIT_BY:
            if (strcmp(optarg, "rank0") == 0)
                o->commit_by = COMMIT_RANK0;
            else if (strcmp(optarg, "node") == 0)
                o->commit_by = COMMIT_NODE;
            else if (strcmp(optarg, "all") == 0)
                o->commit_by = COMMIT_ALL;
            else
                bad_usage("--commit-by: invalid value '%s' (want rank0, node or all)", optarg);
            break;
        case O_NOCOMMIT:
            o->commit = 0;
            break;
        case O_QUIET:
            o->quiet = 1;
            break;
        case O_FALLBACK:
            o->fallback = 1;
            break;
        case O_HELP:
            if (rank == 0)
                usage(stdout);
            finish(0);
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
    if (o->kill_rank >= nranks)
        bad_usage("--kill-rank %ld: there are only %d ranks", o->kill_rank, nranks);
    if (o->n < nranks)
        bad_usage("--n %ld is less than the number of ranks (%d): every rank needs a row",
                  o->n, nranks);
}


/* "rank.<r>.bin" -> r, "meta.<r>.txt" -> r, else -1. */
static long rank_file_rank(const char *name)
{
    const char *suffix;
    if (strncmp(name, "rank.", 5) == 0)
        suffix = ".bin";
    else if (strncmp(name, "meta.", 5) == 0)
        suffix = ".txt";
    else
        return -1;
    const char *p = name + 5;
    long r = 0;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (r > 99999999)
            return -1;
        r = r * 10 + (*p - '0');
    }
    return strcmp(p, suffix) == 0 ? r : -1;
}

/* Rank 0, when the checkpoint directory already existed (left by a crashed run that got
 * this far): removes its meta.txt and the files of ranks >= P, so that the checkpoint this
 * run publishes holds only its own files. */
static void remove_stale(const char *ck)
{
    DIR *d = opendir(ck);
    if (!d)
        fail("cannot list", ck, errno);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long r = rank_file_rank(e->d_name);
        if (strcmp(e->d_name, "meta.txt") != 0 && r < nranks)
            continue;
        char path[PATH_MAX];
        join(path, ck, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT)
            fail("cannot remove", path, errno);
    }
    closedir(d);
}

/* ---------------------------------------------------------------------------------------
 * The simulation */

static long row_begin(int r, long n)
{
    return (long)(((long long)r * n) / nranks);
}

static size_t slab_rows(const struct slab *g)
{
    return (size_t)(g->hi - g->lo);
}

/* Global row i (lo-1 <= i <= hi) of buffer buf. */
static double *slab_row(const struct slab *g, double *buf, long i)
{
    return buf + (size_t)(i - g->lo + 1) * (size_t)g->n;
}

/* heat.c's initial_grid, restricted to this rank's rows (halos are filled by exchange). */
static void initial_slab(struct slab *g)
{
    long n = g->n;
    size_t total = (slab_rows(g) + 2) * (size_t)n;
    for (size_t i = 0; i < total; i++)
        g->u[i] = 0.0;
    long side = n / 8 > 0 ? n / 8 : 1;
    long lo = n / 2 - side / 2;
    for (long i = lo; i < lo + side; i++) {
        if (i < g->lo || i >= g->hi)
            continue;
        for (long j = lo; j < lo + side; j++)
            if (i > 0 && i < n - 1 && j > 0 && j < n - 1)
                slab_row(g, g->u, i)[j] = HOT;
    }
}

/* Fills u's halo rows from the neighbours' edge rows. */
static void exchange_halos(struct slab *g)
{
    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    int down = rank < nranks - 1 ? rank + 1 : MPI_PROC_NULL;
    int count = (int)g->n;
    /* my first row goes up, the row below my last one comes from below */
    MPI_Sendrecv(slab_row(g, g->u, g->lo), count, MPI_DOUBLE, up, TAG_HALO_UP,
                 slab_row(g, g->u, g->hi), count, MPI_DOUBLE, down, TAG_HALO_UP,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    /* my last row goes down, the row above my first one comes from above */
    MPI_Sendrecv(slab_row(g, g->u, g->hi - 1), count, MPI_DOUBLE, down, TAG_HALO_DOWN,
                 slab_row(g, g->u, g->lo - 1), count, MPI_DOUBLE, up, TAG_HALO_DOWN,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

/* One explicit step from u into v on this rank's rows, with heat.c's expression (the
 * boundary rows and columns of v stay 0.0), then swaps u and v. */
static void advance(struct slab *g)
{
    exchange_halos(g);
    size_t N = (size_t)g->n;
    long first = g->lo > 1 ? g->lo : 1, end = g->hi < g->n - 1 ? g->hi : g->n - 1;
    for (long i = first; i < end; i++) {
        const double *up = slab_row(g, g->u, i - 1), *row = slab_row(g, g->u, i),
                     *down = slab_row(g, g->u, i + 1);
        double *out = slab_row(g, g->v, i);
        for (size_t j = 1; j < N - 1; j++)
            out[j] = row[j] + ALPHA * (down[j] + up[j] + row[j + 1] + row[j - 1] - 4.0 * row[j]);
    }
    long centre = g->n / 2;
    if (centre >= g->lo && centre < g->hi)
        slab_row(g, g->v, centre)[centre] += SOURCE;
    double *t = g->u;
    g->u = g->v;
    g->v = t;
}

/* FNV-1a 64 of the whole grid, row-major, without gathering it: each rank continues the
 * running hash of the ranks before it over its own rows. Collective; every rank gets it. */
static uint64_t grid_fnv1a64(const struct slab *g)
{
    uint64_t h = FNV_BASIS;
    if (rank > 0)
        MPI_Recv(&h, 1, MPI_UINT64_T, rank - 1, TAG_FNV, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    h = fnv1a64_continue(h, slab_row(g, g->u, g->lo), slab_rows(g) * (size_t)g->n *
                         sizeof(double));
    if (rank < nranks - 1)
        MPI_Send(&h, 1, MPI_UINT64_T, rank + 1, TAG_FNV, MPI_COMM_WORLD);
    MPI_Bcast(&h, 1, MPI_UINT64_T, nranks - 1, MPI_COMM_WORLD);
    return h;
}

/* ---------------------------------------------------------------------------------------
 * Checkpoint */

typedef int (*commit_fn)(const char *path);

static void cascade_commit_if_present(const char *ck)
{
    void *sym = dlsym(RTLD_DEFAULT, "cascade_commit");
    commit_fn commit;
    /* POSIX's way to turn dlsym's object pointer into a function pointer. */
    memcpy(&commit, &sym, sizeof commit);
    if (!sym)
        return;
    char abs[PATH_MAX], cwd[PATH_MAX];
    const char *target = ck;
    if (ck[0] != '/' && getcwd(cwd, sizeof cwd)) {
        int len = snprintf(abs, sizeof abs, "%s/%s", cwd, ck);
        if (len > 0 && len < (int)sizeof abs)
            target = abs;
    }
    errno = 0;
    if (commit(target) != 0)
        fprintf(stderr, "%s: rank %d: warning: cascade_commit(%s) failed: %s\n", prog, rank,
                target, strerror(errno));
}

/* Writes a small text file with stdio; returns its bytes. */
__attribute__((format(printf, 2, 3))) static long write_text(const char *path,
                                                              const char *fmt, ...)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fail("cannot create", path, errno);
    va_list ap;
    va_start(ap, fmt);
    int len = vfprintf(f, fmt, ap);
    va_end(ap);
    if (len < 0)
        fail("cannot write", path, errno);
    if (fclose(f) != 0)
        fail("cannot write", path, errno);
    return len;
}

/* Writes, commits and publishes the checkpoint of step s (collective). `mine` is the
 * FNV-1a 64 of this rank's rows, `whole` that of the whole grid; `committer` says whether
 * this rank calls cascade_commit. Returns the bytes of all the checkpoint's files (on
 * rank 0; the others return their share). */
static long long checkpoint(const struct options *o, const struct slab *g, long s,
                            uint64_t mine, uint64_t whole, int committer)
{
    size_t bytes_mine = slab_rows(g) * (size_t)g->n * sizeof(double);
    char name[32], file[64], ck[PATH_MAX], path[PATH_MAX];
    snprintf(name, sizeof name, "ckpt.%06ld", s);
    join(ck, o->dir, name);

    /* Every rank creates the directory: on a cluster each node may have its own store. */
    if (mkdir(ck, 0755) != 0) {
        if (errno != EEXIST)
            fail("cannot create directory", ck, errno);
        if (rank == 0)
            remove_stale(ck);
    }

    /* rank.<r>.bin: open/write/close */
    snprintf(file, sizeof file, "rank.%d.bin", rank);
    join(path, ck, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        fail("cannot create", path, errno);
    const char *bytes = (const char *)slab_row(g, g->u, g->lo);
    if (o->kill_at == s && o->kill_rank == rank) {
        /* The simulated crash: half of this rank's rows are in the file, then SIGKILL. */
        if (write_all(fd, bytes, bytes_mine / 2) != 0)
            fail("cannot write", path, errno);
        fflush(stdout);
        raise(SIGKILL);
    }
    if (write_all(fd, bytes, bytes_mine) != 0)
        fail("cannot write", path, errno);
    if (close(fd) != 0)
        fail("cannot close", path, errno);

    /* meta.<r>.txt: stdio */
    snprintf(file, sizeof file, "meta.%d.txt", rank);
    join(path, ck, file);
    long meta = write_text(path,
                           "step=%ld\nn=%ld\nnranks=%d\nrank=%d\nrow_begin=%ld\nrow_end=%ld\n"
                           "fnv1a64=%016" PRIx64 "\n",
                           s, g->n, nranks, rank, g->lo, g->hi, mine);

    /* Every rank's files are closed when this returns, on every rank. */
    long long mine_total = (long long)bytes_mine + meta, total = 0;
    MPI_Allreduce(&mine_total, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

    if (rank == 0) {
        join(path, ck, "meta.txt");
        total += write_text(path, "step=%ld\nn=%ld\nnranks=%d\nfnv1a64=%016" PRIx64 "\n", s,
                            g->n, nranks, whole);
    }

    /* Tell Cascade the checkpoint is complete, if this process has Cascade. */
    if (o->commit) {
        int others_commit = o->commit_by != COMMIT_RANK0;
        if (others_commit)
            MPI_Barrier(MPI_COMM_WORLD); /* meta.txt is written */
        if (committer)
            cascade_commit_if_present(ck);
        if (others_commit)
            MPI_Barrier(MPI_COMM_WORLD); /* every commit returned */
    }

    /* Publish (rank 0): DIR/latest.tmp, renamed onto DIR/latest. */
    if (rank == 0) {
        char tmp[PATH_MAX], latest[PATH_MAX], line[40];
        join(tmp, o->dir, "latest.tmp");
        join(latest, o->dir, "latest");
        int len = snprintf(line, sizeof line, "%s\n", name);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            fail("cannot create", tmp, errno);
        if (write_all(fd, line, (size_t)len) != 0)
            fail("cannot write", tmp, errno);
        if (close(fd) != 0)
            fail("cannot close", tmp, errno);
        if (rename(tmp, latest) != 0)
            fail("cannot rename", tmp, errno);
    }
    return total;
}

/* Whether this rank calls cascade_commit under --commit-by. */
static int is_committer(const struct options *o)
{
    if (o->commit_by == COMMIT_ALL)
        return 1;
    if (o->commit_by == COMMIT_RANK0)
        return rank == 0;
    /* COMMIT_NODE: the lowest rank among those with the same node name. */
    char mine[NODE_NAME_MAX] = {0};
    const char *env = getenv("CASCADE_NODE");
    if (env && env[0]) {
        snprintf(mine, sizeof mine, "%s", env);
    } else {
        int len = 0;
        char proc[MPI_MAX_PROCESSOR_NAME];
        MPI_Get_processor_name(proc, &len);
        snprintf(mine, sizeof mine, "%.*s", len, proc);
    }
    char *all = malloc((size_t)nranks * NODE_NAME_MAX);
    if (!all)
        fail("out of memory", "node names", ENOMEM);
    MPI_Allgather(mine, NODE_NAME_MAX, MPI_CHAR, all, NODE_NAME_MAX, MPI_CHAR, MPI_COMM_WORLD);
    int lowest = rank;
    for (int r = 0; r < rank; r++)
        if (strncmp(all + (size_t)r * NODE_NAME_MAX, mine, NODE_NAME_MAX) == 0) {
            lowest = r;
            break;
        }
    free(all);
    return lowest == rank;
}

/* ---------------------------------------------------------------------------------------
 * Restart */

/* What rank 0 finds in DIR/latest and the checkpoint's meta.txt, broadcast to all. */
struct latest_info {
    int status; /* 0 none (start fresh), 1 found, 2 error (rank 0 printed it) */
    int writers;
    long step;
    uint64_t fnv;
    char name[256];
};

/* A restart error on this rank: kept until the ranks agree on who reports. */
static char restart_error[ERROR_MAX];
/* Set with restart_error when the error is a file of the checkpoint that does not exist. */
static int restart_missing;

__attribute__((format(printf, 1, 2))) static void restart_fail(const char *fmt, ...)
{
    if (restart_error[0])
        return; /* the first problem is the one to report */
    va_list ap;
    va_start(ap, fmt);
    int len = snprintf(restart_error, sizeof restart_error, "%s: ", prog);
    vsnprintf(restart_error + len, sizeof restart_error - (size_t)len, fmt, ap);
    va_end(ap);
}

/* Collective: if any rank has a restart error, the lowest such rank prints it (one line)
 * and every rank exits 1. */
static void restart_agree(void)
{
    int mine = restart_error[0] ? rank : nranks, first = nranks;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == nranks)
        return;
    if (first == rank) {
        fprintf(stderr, "%s\n", restart_error);
        fflush(stderr);
    }
    finish(1);
}

/* Parses "key=value" lines with unsigned/signed integer or hex values into the fields
 * wanted; returns 0 when every wanted key was found exactly once. */
struct meta_field {
    const char *key;
    int hex;
    long *num;
    uint64_t *hexval;
    int seen;
};

static int read_meta(const char *path, struct meta_field *fields, size_t count)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        restart_missing = errno == ENOENT && !restart_error[0];
        restart_fail("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char line[256];
    int bad = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strchr(line, '=');
        if (!eq) {
            bad = 1;
            break;
        }
        *eq = '\0';
        const char *value = eq + 1;
        for (size_t i = 0; i < count; i++) {
            if (strcmp(line, fields[i].key) != 0)
                continue;
            char *end;
            errno = 0;
            if (fields[i].hex) {
                if (strlen(value) != 16)
                    bad = 1;
                *fields[i].hexval = strtoull(value, &end, 16);
            } else {
                *fields[i].num = strtol(value, &end, 10);
                if (*fields[i].num < 0)
                    bad = 1;
            }
            if (errno || end == value || *end != '\0' || fields[i].seen)
                bad = 1;
            fields[i].seen = 1;
        }
    }
    fclose(f);
    for (size_t i = 0; i < count; i++)
        if (!fields[i].seen)
            bad = 1;
    if (bad) {
        restart_fail("%s: malformed checkpoint metadata", path);
        return -1;
    }
    return 0;
}

static void read_checkpoint_meta(const struct options *o, struct latest_info *info_out);

/* Rank 0: DIR/latest and the checkpoint's meta.txt. */
static struct latest_info read_latest(const struct options *o)
{
    struct latest_info info = {0};
    char latest[PATH_MAX];
    join(latest, o->dir, "latest");
    int fd = open(latest, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return info; /* status 0: start fresh */
        restart_fail("%s: cannot open: %s", latest, strerror(errno));
        info.status = 2;
        return info;
    }
    ssize_t got = read_full(fd, info.name, sizeof info.name - 1);
    int err = errno;
    close(fd);
    info.status = 2;
    if (got < 0) {
        restart_fail("%s: cannot read: %s", latest, strerror(err));
        return info;
    }
    info.name[got] = '\0';
    info.name[strcspn(info.name, "\n")] = '\0';
    if (info.name[0] == '\0' || strchr(info.name, '/') || strcmp(info.name, ".") == 0 ||
        strcmp(info.name, "..") == 0) {
        restart_fail("%s: does not name a checkpoint directory", latest);
        return info;
    }
    read_checkpoint_meta(o, &info);
    return info;
}

/* Rank 0: the meta.txt of the checkpoint info->name (status 1 if it is sound, else 2). */
static void read_checkpoint_meta(const struct options *o, struct latest_info *info_out)
{
    struct latest_info info = *info_out;
    char ck[PATH_MAX], path[PATH_MAX];
    info.status = 2;
    join(ck, o->dir, info.name);
    join(path, ck, "meta.txt");
    long n = 0, writers = 0;
    struct meta_field fields[] = {
        {"step", 0, &info.step, NULL, 0},
        {"n", 0, &n, NULL, 0},
        {"nranks", 0, &writers, NULL, 0},
        {"fnv1a64", 1, NULL, &info.fnv, 0},
    };
    if (read_meta(path, fields, sizeof fields / sizeof fields[0]) == 0) {
        if (n != o->n)
            restart_fail("%s: checkpoint has n=%ld but --n is %ld", path, n, o->n);
        else if (writers < 1 || writers > n)
            restart_fail("%s: nranks=%ld is not in 1..%ld", path, writers, n);
        else {
            info.writers = (int)writers;
            info.status = 1;
        }
    }
    *info_out = info;
}

/* Every rank: reads the rows it owns from the rank files of the checkpoint `info` names
 * (see the restart rule in the header). Problems are recorded with restart_fail. */
static void load_rows(const struct options *o, const struct latest_info *info, struct slab *g)
{
    char ck[PATH_MAX], path[PATH_MAX], file[64];
    join(ck, o->dir, info->name);
    long expect_begin = 0;
    size_t row_bytes = (size_t)g->n * sizeof(double);
    for (int q = 0; q < info->writers; q++) {
        snprintf(file, sizeof file, "meta.%d.txt", q);
        join(path, ck, file);
        long step = 0, n = 0, writers = 0, wrank = 0, begin = 0, end = 0;
        uint64_t want = 0;
        struct meta_field fields[] = {
            {"step", 0, &step, NULL, 0},         {"n", 0, &n, NULL, 0},
            {"nranks", 0, &writers, NULL, 0},    {"rank", 0, &wrank, NULL, 0},
            {"row_begin", 0, &begin, NULL, 0},   {"row_end", 0, &end, NULL, 0},
            {"fnv1a64", 1, NULL, &want, 0},
        };
        if (read_meta(path, fields, sizeof fields / sizeof fields[0]) != 0)
            return;
        if (step != info->step || n != g->n || writers != info->writers || wrank != q) {
            restart_fail("%s: step=%ld n=%ld nranks=%ld rank=%ld do not match the checkpoint "
                         "(step=%ld n=%ld nranks=%d rank=%d)",
                         path, step, n, writers, wrank, info->step, g->n, info->writers, q);
            return;
        }
        if (begin != expect_begin || end <= begin || end > n ||
            (q == info->writers - 1 && end != n)) {
            restart_fail("%s: rows %ld..%ld do not continue the rows of the ranks before "
                         "(next row %ld of %ld)", path, begin, end, expect_begin, n);
            return;
        }
        expect_begin = end;
        if (end <= g->lo || begin >= g->hi)
            continue; /* none of my rows */

        /* The whole file, checked against its checksum, then the rows I own. */
        snprintf(file, sizeof file, "rank.%d.bin", q);
        join(path, ck, file);
        size_t want_bytes = (size_t)(end - begin) * row_bytes;
        char *buf = malloc(want_bytes);
        if (!buf) {
            restart_fail("%s: cannot allocate %zu bytes", path, want_bytes);
            return;
        }
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            restart_missing = errno == ENOENT && !restart_error[0];
            restart_fail("%s: cannot open: %s", path, strerror(errno));
            free(buf);
            return;
        }
        ssize_t got = read_full(fd, buf, want_bytes);
        int err = errno;
        char extra;
        ssize_t more = got == (ssize_t)want_bytes ? read_full(fd, &extra, 1) : 0;
        close(fd);
        if (got < 0)
            restart_fail("%s: cannot read: %s", path, strerror(err));
        else if (got != (ssize_t)want_bytes)
            restart_fail("%s: short file: %zd of %zu bytes", path, got, want_bytes);
        else if (more != 0)
            restart_fail("%s: longer than rows %ld..%ld of meta.%d.txt", path, begin, end, q);
        else {
            uint64_t sum = fnv1a64(buf, want_bytes);
            if (sum != want)
                restart_fail("%s: checksum mismatch: fnv1a64 %016" PRIx64 ", meta.%d.txt says "
                             "%016" PRIx64, path, sum, q, want);
        }
        if (restart_error[0]) {
            free(buf);
            return;
        }
        long from = begin > g->lo ? begin : g->lo, to = end < g->hi ? end : g->hi;
        memcpy(slab_row(g, g->u, from), buf + (size_t)(from - begin) * row_bytes,
               (size_t)(to - from) * row_bytes);
        free(buf);
    }
}

/* Collective: true if some rank's restart error is a missing file of the checkpoint. */
static int missing_anywhere(void)
{
    int mine = restart_missing, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}

/* Loads the checkpoint DIR/latest names into g->u; returns its step, or -1 when there is
 * no DIR/latest. Any problem: one line on stderr and exit 1 on every rank. Collective. */
static long restart(const struct options *o, struct slab *g)
{
    struct latest_info info = {0};
    if (rank == 0)
        info = read_latest(o);
    /* With --fallback, a missing meta.txt is handled like a missing rank file below. */
    if (!(o->fallback && missing_anywhere()))
        restart_agree();
    MPI_Bcast(&info, (int)sizeof info, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (info.status == 0)
        return -1;

    size_t total = (slab_rows(g) + 2) * (size_t)g->n;
    for (;;) {
        for (size_t i = 0; i < total; i++)
            g->u[i] = 0.0;
        if (info.status == 1)
            load_rows(o, &info, g);
        if (!o->fallback || !missing_anywhere())
            break;
        /* Not whole here: the checkpoint K steps before, if there is one. */
        long step = info.status == 1 ? info.step : ckpt_step(info.name);
        long before = step - o->every;
        if (rank == 0 && !o->quiet)
            printf("%s is not whole (a file is missing): trying the checkpoint before it\n",
                   info.name);
        restart_error[0] = '\0';
        restart_missing = 0;
        if (before < o->every || before % o->every != 0) {
            if (rank == 0)
                restart_fail("%s/%s: not whole, and no whole checkpoint before it", o->dir,
                             info.name);
            break;
        }
        if (rank == 0) {
            snprintf(info.name, sizeof info.name, "ckpt.%06ld", before);
            read_checkpoint_meta(o, &info);
            info.step = info.status == 1 ? info.step : before;
        }
        MPI_Bcast(&info, (int)sizeof info, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
    restart_agree();

    uint64_t sum = grid_fnv1a64(g);
    if (rank == 0 && sum != info.fnv)
        restart_fail("%s/%s: the rank files' grid has fnv1a64 %016" PRIx64 ", meta.txt says "
                     "%016" PRIx64, o->dir, info.name, sum, info.fnv);
    restart_agree();
    if (rank == 0 && !o->quiet)
        printf("restarted from %s step=%ld written_by=%d ranks=%d\n", info.name, info.step,
               info.writers, nranks);
    return info.step;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    struct options o;
    parse_args(argc, argv, &o);
    /* Line-buffered, so the lines printed before a crash are not lost in a pipe's buffer. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    struct slab g = {.n = o.n, .lo = row_begin(rank, o.n), .hi = row_begin(rank + 1, o.n)};
    size_t local = (slab_rows(&g) + 2) * (size_t)o.n;
    g.u = malloc(local * sizeof *g.u);
    g.v = malloc(local * sizeof *g.v);
    if (!g.u || !g.v)
        fail("cannot allocate the grid", o.dir, ENOMEM);

    if (rank == 0)
        mkdir_p(o.dir);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 0)
        mkdir_p(o.dir); /* another node's store, or a no-op */
    int committer = is_committer(&o);

    long s = restart(&o, &g);
    if (s < 0) {
        s = 0;
        initial_slab(&g);
        if (rank == 0 && !o.quiet)
            printf("starting fresh\n");
    }
    memcpy(g.v, g.u, local * sizeof *g.u); /* boundaries of both buffers are the fixed 0.0 */

    long written = 0;
    double total_ms = 0.0;
    size_t bytes_mine = slab_rows(&g) * (size_t)o.n * sizeof(double);
    while (s < o.steps) {
        advance(&g);
        s++;
        if (s % o.every == 0) {
            /* Checksums before the stall is timed, as in heat.c. */
            uint64_t mine = fnv1a64(slab_row(&g, g.u, g.lo), bytes_mine);
            uint64_t whole = grid_fnv1a64(&g);
            double start = now_ms();
            long long bytes = checkpoint(&o, &g, s, mine, whole, committer);
            double ms = now_ms() - start;
            written++;
            total_ms += ms;
            if (rank == 0 && !o.quiet)
                printf("checkpoint step=%ld bytes=%lld stall_ms=%.3f\n", s, bytes, ms);
            if (rank == 0 && o.keep > 0)
                prune(o.dir, o.keep, s);
        }
    }

    uint64_t sum = grid_fnv1a64(&g);
    if (rank == 0)
        printf("final step=%ld fnv1a64=%016" PRIx64 " checkpoints=%ld total_stall_ms=%.3f "
               "mean_stall_ms=%.3f ranks=%d\n",
               s, sum, written, total_ms, written ? total_ms / (double)written : 0.0, nranks);
    free(g.u);
    free(g.v);
    finish(0);
}
