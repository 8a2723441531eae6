/*
 * pio: the I/O of the interposition benchmarks, done with plain POSIX calls (open, write,
 * read, lseek, stat, close, unlink). `cascade-bench preload` compiles it with `cc -O2` and
 * runs it with LD_PRELOAD=libcascade.so against files under the Cascade mount, and without
 * the library against tmpfs (/dev/shm); it never knows which.
 *
 * It speaks the protocol of the Rust children (bench/src/child.rs): set-up, "READY" on
 * stdout, wait for "GO" on stdin (the start barrier), run the timed part, print one JSON
 * result line, wait for EOF on stdin (the end barrier), then check and clean up.
 *
 * It is the I/O program of the FUSE suite too (bench/src/fuse.rs: FUSE mounts, LD_PRELOAD,
 * tmpfs, local disk), which uses write, read, memcpy and probe with aligned=1.
 *
 * usage: pio MODE key=value...
 *   write    path= bytes= io= [aligned=1] [fsync=1] [rewrite=1] [warm=DIR]   create (rewrite=1:
 *            open an existing file, not truncated, and keep it), bytes/io write() calls,
 *            [fsync, mark "write_end" before it], close; the size is checked
 *   read     path= bytes= io= [aligned=1] [period=N] [dontneed=1] [warm=DIR]   open, read()
 *            until bytes, close; checks the last buffer (the file holds the pattern of seed
 *            2, repeated every `period` bytes, default io); dontneed=1: posix_fadvise
 *            (DONTNEED) in set-up
 *   memcpy   shm= bytes= io= read=0|1           memcpy into (read=1: out of) a MAP_SHARED
 *            /dev/shm object created, pre-faulted and written once in set-up; removed after
 *   paired   path= shm= offset= bytes= io= pairs= read=0|1 [warm=DIR]
 *            rounds of: the file phase (as write/read; a new file path-K per round for
 *            writes) and memcpy into (out of) a MAP_SHARED slice of the /dev/shm object shm
 *            at offset, taking turns, each phase timed
 *   sweep    path= sizes=SIZE:CALLS,... [read=1] [rewrite=1] [warm=DIR]   per size, a new
 *            file written with CALLS write() calls of SIZE bytes (one phase per size); read=1:
 *            the file is written untimed and the phase reads it back with CALLS read() calls;
 *            rewrite=1: the file is not new but one a child process wrote and exited (set-up,
 *            untimed), opened with O_TRUNC, as the next run of a job rewrites its files;
 *            before each phase the core probe (core_probe, "probe_ns" in the result)
 *   replay   path= sizes=FILE [warm=DIR]        write() calls of the sizes in FILE
 *            (little-endian u32 each) into one new file
 *   meta     dir= files= passes= [warm=DIR]     create+write 4 KiB+close `files` files, then
 *            stat each `passes` times, then unlink them (one phase each)
 *   probe    path=                              (no protocol) create path with 4 KiB and keep
 *            it: the bench checks in the store that the library served it
 *   mdtest   dir= files= rank= [shared=1] [warm=DIR]   mdtest-style: create (empty), stat,
 *            remove `files` files in dir/p<rank> (shared=1: in dir itself), a phase each
 *   passthru path= region= calls64= calls4k= rounds=   write() and read() of 64 B and 4 KiB
 *            on one file, cycling over its first `region` bytes (lseek back to 0 at the end);
 *            the four phases `rounds` times in turn
 *
 * warm=DIR: stat(DIR) and a one-byte scratch file in it during set-up (with the library
 * loaded, that attaches the store and starts its populate thread), then
 * wait until the store's populate thread is done (this process has one thread again), as
 * the Rust children do with Store::map_in. Without it, the attach happens in the
 * timed part: what a program that just started sees ("cold").
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int g_argc;
static char **g_argv;

static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "pio %s: ", g_argc > 1 ? g_argv[1] : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *opt(const char *key)
{
    size_t n = strlen(key);
    for (int i = 2; i < g_argc; i++)
        if (strncmp(g_argv[i], key, n) == 0 && g_argv[i][n] == '=')
            return g_argv[i] + n + 1;
    return NULL;
}

static const char *need(const char *key)
{
    const char *v = opt(key);
    if (!v)
        die("missing %s=", key);
    return v;
}

static uint64_t num(const char *key, const char *v)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || end == v)
        die("%s=%s is not a number", key, v);
    return x;
}

static uint64_t need_u64(const char *key)
{
    return num(key, need(key));
}

static uint64_t opt_u64(const char *key, uint64_t def)
{
    const char *v = opt(key);
    return v ? num(key, v) : def;
}

/* The same pattern as fill_pattern in bench/src/util.rs (xorshift64, no zero bytes). */
static void fill_pattern(unsigned char *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t v = x | 0x0101010101010101ull;
        size_t n = len - i < 8 ? len - i : 8;
        for (size_t k = 0; k < n; k++)
            buf[i + k] = (unsigned char)(v >> (8 * k));
    }
}

/*
 * Buffers. The alignment of the source relative to the destination matters to memcpy on
 * some CPUs (on the AMD EPYC this was written on, 4-256 KiB copies from 16 bytes past a page
 * boundary run 25-45 % slower than from a page boundary), so every method of a comparison
 * must use the same kind: page-aligned buffers for sweep and replay (the Rust store-API jobs
 * of those use page-aligned ones too), malloc'd ones for the 1 MiB benchmarks (write, read,
 * paired; aligned=1 makes them page-aligned), exactly like the Rust children of the node-store benchmarks, whose Vec comes from
 * the same glibc malloc (16 bytes past a page boundary at these sizes).
 */
static unsigned char *alloc_aligned(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1))
        die("out of memory (%zu bytes)", len);
    memset(p, 1, len);
    return p;
}

static unsigned char *alloc_malloc(size_t len)
{
    unsigned char *p = malloc(len ? len : 1);
    if (!p)
        die("out of memory (%zu bytes)", len);
    memset(p, 1, len);
    return p;
}

/* The buffer of write and read: page-aligned with aligned=1, else malloc'd. */
static unsigned char *alloc_io(size_t len)
{
    return opt_u64("aligned", 0) ? alloc_aligned(len) : alloc_malloc(len);
}

/* Keeps the compiler from dropping copies whose results nobody reads. */
static inline void clobber(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* ---- protocol ---------------------------------------------------------------------------- */

static pid_t g_parent;
static uint64_t g_t_setup;

static void put(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(1, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("writing to stdout: %s", strerror(errno));
        s += w;
        n -= (size_t)w;
    }
}

static uint64_t barrier(double *setup_s)
{
    *setup_s = (double)(now_ns() - g_t_setup) / 1e9;
    put("READY\n", 6);
    char line[16];
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || c == '\n')
            break;
        if (n < sizeof line - 1)
            line[n++] = c;
    }
    uint64_t start = now_ns();
    line[n] = 0;
    if (strcmp(line, "GO") != 0 || getppid() != g_parent)
        die("the parent did not release the start barrier");
    return start;
}

/* The JSON result line (fields of ChildResult in bench/src/child.rs). */
static char g_json[1 << 16];
static size_t g_len;

static void js(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_json + g_len, sizeof g_json - g_len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof g_json - g_len)
        die("result too long");
    g_len += (size_t)n;
}

#define MAX_PHASES 256
static struct {
    char name[32];
    uint64_t s, e;
} g_phases[MAX_PHASES];
static int g_nphases;
static uint64_t g_write_end; /* the "write_end" mark (write with fsync=1), 0 for none */
static double g_probe[MAX_PHASES]; /* core_probe() before each sweep phase, ns per round */
static int g_nprobes;

/* How much of its core this process has right now: ns per round of eight independent
 * one-cycle integer operations, the best of three short runs (an interrupt does not count;
 * a busy neighbour lasting seconds does). A core that runs them side by side does a round in
 * about two cycles; a host that runs another guest's thread on the same physical core (SMT)
 * takes issue slots from it, and the round slows by up to 2x, while a chain of dependent
 * operations does not. The library's small-write path is such wide code, so the bench shows
 * the probe next to its ns per call (bench/README.md, "Core sharing"). */
static double core_probe(void)
{
    enum { ROUNDS = 1 << 16 };
    double best = 1e30;
    for (int run = 0; run < 3; run++) {
        uint64_t a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8;
        uint64_t t0 = now_ns();
        for (int i = 0; i < ROUNDS; i++) {
            a ^= b; c <<= 1; d |= e; f -= g; h >>= 1; b ^= a; e |= d; g -= f;
            __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g), "+r"(h));
        }
        double ns = (double)(now_ns() - t0) / ROUNDS;
        best = ns < best ? ns : best;
    }
    return best;
}

static void phase(const char *name, uint64_t s, uint64_t e)
{
    if (g_nphases == MAX_PHASES)
        die("too many phases");
    snprintf(g_phases[g_nphases].name, sizeof g_phases[0].name, "%s", name);
    g_phases[g_nphases].s = s;
    g_phases[g_nphases].e = e;
    g_nphases++;
}

/* Prints the result, then blocks until the parent closes our stdin (everyone is done). */
static void finish(uint64_t start, uint64_t end, uint64_t bytes, uint64_t calls, double setup_s)
{
    g_len = 0;
    js("{\"start_ns\":%llu,\"end_ns\":%llu,\"bytes\":%llu,\"calls\":%llu,\"setup_s\":%.6f,"
       "\"phases\":[",
       (unsigned long long)start, (unsigned long long)end, (unsigned long long)bytes,
       (unsigned long long)calls, setup_s);
    for (int i = 0; i < g_nphases; i++)
        js("%s[\"%s\",%llu,%llu]", i ? "," : "", g_phases[i].name,
           (unsigned long long)g_phases[i].s, (unsigned long long)g_phases[i].e);
    js("]");
    if (g_write_end)
        js(",\"marks\":{\"write_end\":%llu}", (unsigned long long)g_write_end);
    if (g_nprobes) {
        js(",\"probe_ns\":[");
        for (int i = 0; i < g_nprobes; i++)
            js("%s%.4f", i ? "," : "", g_probe[i]);
        js("]");
    }
    js("}\n");
    put(g_json, g_len);
    char junk[256];
    for (;;) {
        ssize_t r = read(0, junk, sizeof junk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
    }
}

/* ---- helpers ----------------------------------------------------------------------------- */

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        die("opendir /proc/self/task: %s", strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* warm=DIR: attach the store now and wait for its populate thread. Only a data access
 * starts that thread (a stat attaches the store without mapping its memory in), so one byte
 * is written to a scratch file in DIR, which is removed again. */
static void warm_up(void)
{
    const char *dir = opt("warm");
    if (!dir)
        return;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("warm-up: stat %s: %s", dir, strerror(errno));
    char scratch[4096];
    snprintf(scratch, sizeof scratch, "%s/.pio-warm-%d", dir, (int)getpid());
    int fd = open(scratch, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, "w", 1) != 1 || close(fd) != 0 || unlink(scratch) != 0)
        die("warm-up: scratch file %s: %s", scratch, strerror(errno));
    uint64_t t0 = now_ns();
    while (thread_count() > 1) {
        if (now_ns() - t0 > 60000000000ull)
            die("warm-up: the store's populate thread did not finish in 60 s");
        usleep(2000);
    }
}

static void write_full(int fd, const unsigned char *buf, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write %s: %s", path, w < 0 ? strerror(errno) : "wrote nothing");
        buf += w;
        n -= (size_t)w;
    }
}

static void read_full(int fd, unsigned char *buf, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("read %s: %s", path, strerror(errno));
        if (r == 0)
            die("read %s: unexpected end of file", path);
        buf += r;
        n -= (size_t)r;
    }
}

static int open_or_die(const char *path, int flags)
{
    int fd = open(path, flags, 0600);
    if (fd < 0)
        die("open %s: %s", path, strerror(errno));
    return fd;
}

static void close_or_die(int fd, const char *path)
{
    if (close(fd) != 0)
        die("close %s: %s", path, strerror(errno));
}

/* After the run: the file has the expected size; then remove it. */
static void check_and_unlink(const char *path, uint64_t size)
{
    struct stat st;
    if (stat(path, &st) != 0)
        die("stat %s: %s", path, strerror(errno));
    if ((uint64_t)st.st_size != size)
        die("%s has %lld bytes, expected %llu", path, (long long)st.st_size,
            (unsigned long long)size);
    if (unlink(path) != 0)
        die("unlink %s: %s", path, strerror(errno));
}

/* Writes a new file with bytes/io calls; returns the number of write() calls. */
/* Opens `path` with `flags` and writes `bytes` with `io`-byte write() calls. */
static void write_opened(const char *path, int flags, const unsigned char *src, uint64_t bytes,
                         uint64_t io)
{
    int fd = open_or_die(path, flags);
    for (uint64_t off = 0; off < bytes; off += io)
        write_full(fd, src, io, path);
    close_or_die(fd, path);
}

static void write_file(const char *path, const unsigned char *src, uint64_t bytes, uint64_t io)
{
    write_opened(path, O_WRONLY | O_CREAT | O_EXCL, src, bytes, io);
}

/* A child process writes `path` with one `io`-byte write and exits: the file the last run
 * of a job left (sweep rewrite=1). */
static void written_by_an_exited_process(const char *path, const unsigned char *src, uint64_t io)
{
    pid_t child = fork();
    if (child < 0)
        die("fork: %s", strerror(errno));
    if (child == 0) {
        write_file(path, src, io, io);
        _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the child that writes %s failed", path);
}

static void read_file(const char *path, unsigned char *buf, uint64_t bytes, uint64_t io)
{
    int fd = open_or_die(path, O_RDONLY);
    for (uint64_t off = 0; off < bytes; off += io) {
        read_full(fd, buf, io, path);
        clobber(buf);
    }
    close_or_die(fd, path);
}

static void check_sizes(uint64_t bytes, uint64_t io)
{
    if (io == 0 || bytes % io != 0)
        die("bytes=%llu is not a multiple of io=%llu", (unsigned long long)bytes,
            (unsigned long long)io);
}

/* ---- modes ------------------------------------------------------------------------------- */

static void mode_write(void)
{
    const char *path = need("path");
    uint64_t bytes = need_u64("bytes"), io = need_u64("io");
    int do_sync = opt_u64("fsync", 0) != 0, rewrite = opt_u64("rewrite", 0) != 0;
    check_sizes(bytes, io);
    unsigned char *src = alloc_io(io);
    fill_pattern(src, io, 1);
    warm_up();
    struct stat st;
    if (rewrite && (stat(path, &st) != 0 || (uint64_t)st.st_size < bytes))
        die("rewrite: %s must exist with at least %llu bytes", path, (unsigned long long)bytes);
    double setup_s;
    uint64_t start = barrier(&setup_s);
    int fd = open_or_die(path, rewrite ? O_WRONLY : O_WRONLY | O_CREAT | O_EXCL);
    for (uint64_t off = 0; off < bytes; off += io)
        write_full(fd, src, io, path);
    if (do_sync) {
        g_write_end = now_ns();
        if (fsync(fd) != 0)
            die("fsync %s: %s", path, strerror(errno));
    }
    close_or_die(fd, path);
    uint64_t end = now_ns();
    finish(start, end, bytes, bytes / io, setup_s);
    if (!rewrite)
        check_and_unlink(path, bytes);
    else if (stat(path, &st) != 0 || (uint64_t)st.st_size < bytes)
        die("%s has fewer than %llu bytes", path, (unsigned long long)bytes);
}

static void mode_read(void)
{
    const char *path = need("path");
    uint64_t bytes = need_u64("bytes"), io = need_u64("io"), period = opt_u64("period", io);
    check_sizes(bytes, io);
    if (period < io || period % io != 0)
        die("period=%llu must be a multiple of io", (unsigned long long)period);
    unsigned char *buf = alloc_io(io), *want = alloc_io(period);
    fill_pattern(want, period, 2);
    warm_up();
    if (opt_u64("dontneed", 0)) {
        int fd = open_or_die(path, O_RDONLY);
        int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (e != 0)
            die("posix_fadvise %s: %s", path, strerror(e));
        close(fd);
    }
    double setup_s;
    uint64_t start = barrier(&setup_s);
    read_file(path, buf, bytes, io);
    uint64_t end = now_ns();
    if (memcmp(buf, want + (bytes - io) % period, io) != 0)
        die("%s: the data read back differs from what was written", path);
    finish(start, end, bytes, bytes / io, setup_s);
}

static void mode_memcpy(void)
{
    const char *shm = need("shm");
    uint64_t bytes = need_u64("bytes"), io = need_u64("io"), rd = need_u64("read");
    const uint64_t mib = 1 << 20;
    check_sizes(bytes, io);
    if (io > mib || mib % io != 0)
        die("io=%llu must divide 1 MiB", (unsigned long long)io);
    unsigned char *buf = alloc_aligned(io), *block = alloc_aligned(mib);
    fill_pattern(buf, io, 1);
    fill_pattern(block, mib, 2);
    int fd = open_or_die(shm, O_RDWR | O_CREAT | O_EXCL);
    if (ftruncate(fd, (off_t)bytes) != 0)
        die("ftruncate %s: %s", shm, strerror(errno));
    unsigned char *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        die("mmap %s: %s", shm, strerror(errno));
    close(fd);
    if (madvise(map, bytes, MADV_POPULATE_WRITE) != 0)
        die("madvise(MADV_POPULATE_WRITE) %s: %s", shm, strerror(errno));
    for (uint64_t off = 0; off < bytes; off += mib)
        memcpy(map + off, block, bytes - off < mib ? bytes - off : mib);
    double setup_s;
    uint64_t start = barrier(&setup_s);
    if (rd) {
        for (uint64_t off = 0; off < bytes; off += io) {
            memcpy(buf, map + off, io);
            clobber(buf);
        }
    } else {
        for (uint64_t off = 0; off < bytes; off += io)
            memcpy(map + off, buf, io);
        clobber(map);
    }
    uint64_t end = now_ns();
    if (rd && memcmp(buf, block + (bytes - io) % mib, io) != 0)
        die("memcpy read: wrong data");
    finish(start, end, bytes, bytes / io, setup_s);
    munmap(map, bytes);
    if (unlink(shm) != 0)
        die("unlink %s: %s", shm, strerror(errno));
}

static unsigned char *map_shm_slice(const char *shm, uint64_t offset, uint64_t bytes)
{
    char p[512];
    snprintf(p, sizeof p, "/dev/shm/%s", shm[0] == '/' ? shm + 1 : shm);
    int fd = open_or_die(p, O_RDWR);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
    if (m == MAP_FAILED)
        die("mmap %s: %s", p, strerror(errno));
    /* Map its pages into this process, as Store::attach + map_in do for the store. */
    if (madvise(m, bytes, MADV_POPULATE_WRITE) != 0)
        die("madvise(MADV_POPULATE_WRITE) %s: %s", p, strerror(errno));
    close(fd);
    return m;
}

static void mode_paired(void)
{
    const char *path = need("path"), *shm = need("shm");
    uint64_t offset = need_u64("offset"), bytes = need_u64("bytes"), io = need_u64("io");
    uint64_t pairs = need_u64("pairs"), rd = need_u64("read");
    check_sizes(bytes, io);
    unsigned char *src = alloc_malloc(io), *buf = alloc_malloc(io);
    fill_pattern(src, io, rd ? 2 : 1);
    unsigned char *map = map_shm_slice(shm, offset, bytes);
    if (rd)
        for (uint64_t off = 0; off < bytes; off += io)
            memcpy(map + off, src, io);
    warm_up();
    double setup_s;
    uint64_t start = barrier(&setup_s);
    char name[512];
    for (uint64_t k = 0; k < pairs; k++) {
        /* Which one goes first alternates. */
        for (int j = 0; j < 2; j++) {
            int file_phase = (k % 2 == 0) ? j == 1 : j == 0;
            uint64_t t0 = now_ns();
            if (file_phase && !rd) {
                snprintf(name, sizeof name, "%s-%llu", path, (unsigned long long)k);
                write_file(name, src, bytes, io);
            } else if (file_phase) {
                read_file(path, buf, bytes, io);
            } else if (!rd) {
                for (uint64_t off = 0; off < bytes; off += io)
                    memcpy(map + off, src, io);
                clobber(map);
            } else {
                for (uint64_t off = 0; off < bytes; off += io) {
                    memcpy(buf, map + off, io);
                    clobber(buf);
                }
            }
            uint64_t t1 = now_ns();
            phase(file_phase ? "preload" : "memcpy-shm", t0, t1);
            if (file_phase && !rd)
                check_and_unlink(name, bytes);
        }
    }
    uint64_t end = now_ns();
    if (rd && memcmp(buf, src, io) != 0)
        die("%s: the data read back differs from what was written", path);
    finish(start, end, bytes * 2 * pairs, 2 * pairs * (bytes / io), setup_s);
}

#define MAX_SIZES 64

static void mode_sweep(void)
{
    const char *path = need("path"), *spec = need("sizes");
    uint64_t size[MAX_SIZES], calls[MAX_SIZES], maxs = 0;
    int n = 0;
    for (const char *p = spec; *p;) {
        unsigned long long s, c;
        int used;
        if (n == MAX_SIZES || sscanf(p, "%llu:%llu%n", &s, &c, &used) != 2 || s == 0)
            die("bad sizes=%s", spec);
        size[n] = s;
        calls[n++] = c;
        maxs = s > maxs ? s : maxs;
        p += used;
        if (*p == ',')
            p++;
    }
    int reading = opt_u64("read", 0) != 0, rewrite = opt_u64("rewrite", 0) != 0;
    unsigned char *src = alloc_aligned(maxs), *dst = alloc_aligned(maxs);
    fill_pattern(src, maxs, 1);
    warm_up();
    double setup_s;
    uint64_t start = barrier(&setup_s), bytes = 0, ncalls = 0;
    char name[512], ph[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s-%llu", path, (unsigned long long)size[i]);
        g_probe[g_nprobes++] = core_probe();
        uint64_t t0 = now_ns(), t1;
        if (reading) {
            /* read=1: the file is written untimed, then read back with size[i] reads. */
            write_file(name, src, size[i] * calls[i], size[i]);
            int fd = open_or_die(name, O_RDONLY);
            t0 = now_ns();
            for (uint64_t k = 0; k < calls[i]; k++)
                read_full(fd, dst, size[i], name);
            t1 = now_ns();
            close_or_die(fd, name);
        } else if (rewrite) {
            written_by_an_exited_process(name, src, size[i]);
            t0 = now_ns();
            write_opened(name, O_WRONLY | O_TRUNC, src, size[i] * calls[i], size[i]);
            t1 = now_ns();
        } else {
            write_file(name, src, size[i] * calls[i], size[i]);
            t1 = now_ns();
        }
        snprintf(ph, sizeof ph, "%llu", (unsigned long long)size[i]);
        phase(ph, t0, t1);
        check_and_unlink(name, size[i] * calls[i]);
        bytes += size[i] * calls[i];
        ncalls += calls[i];
    }
    finish(start, now_ns(), bytes, ncalls, setup_s);
}

static void mode_replay(void)
{
    const char *path = need("path"), *file = need("sizes");
    int sfd = open_or_die(file, O_RDONLY);
    struct stat st;
    if (fstat(sfd, &st) != 0 || st.st_size % 4 != 0)
        die("%s: not a list of u32 sizes", file);
    size_t n = (size_t)st.st_size / 4;
    uint32_t *sizes = malloc(n * 4 + 1);
    if (!sizes)
        die("out of memory");
    read_full(sfd, (unsigned char *)sizes, n * 4, file);
    close(sfd);
    uint64_t total = 0, maxs = 0;
    for (size_t i = 0; i < n; i++) {
        total += sizes[i];
        maxs = sizes[i] > maxs ? sizes[i] : maxs;
    }
    unsigned char *src = alloc_aligned(maxs);
    fill_pattern(src, maxs, 1);
    warm_up();
    double setup_s;
    uint64_t start = barrier(&setup_s);
    int fd = open_or_die(path, O_WRONLY | O_CREAT | O_EXCL);
    for (size_t i = 0; i < n; i++)
        write_full(fd, src, sizes[i], path);
    close_or_die(fd, path);
    uint64_t end = now_ns();
    finish(start, end, total, n, setup_s);
    check_and_unlink(path, total);
}

static void mode_meta(void)
{
    const char *dir = need("dir");
    uint64_t files = need_u64("files"), passes = need_u64("passes");
    size_t w = strlen(dir) + 16;
    char *names = malloc(files * w + 1);
    if (!names)
        die("out of memory");
    for (uint64_t i = 0; i < files; i++)
        snprintf(names + i * w, w, "%s/f%07llu", dir, (unsigned long long)i);
    unsigned char *src = alloc_aligned(4096);
    fill_pattern(src, 4096, 1);
    warm_up();
    if (mkdir(dir, 0755) != 0)
        die("mkdir %s: %s", dir, strerror(errno));
    double setup_s;
    uint64_t start = barrier(&setup_s);
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < files; i++) {
        const char *p = names + i * w;
        int fd = open_or_die(p, O_WRONLY | O_CREAT | O_EXCL);
        write_full(fd, src, 4096, p);
        close_or_die(fd, p);
    }
    uint64_t t1 = now_ns();
    phase("create", t0, t1);
    struct stat st;
    for (uint64_t k = 0; k < passes; k++)
        for (uint64_t i = 0; i < files; i++) {
            const char *p = names + i * w;
            if (stat(p, &st) != 0)
                die("stat %s: %s", p, strerror(errno));
            if (st.st_size != 4096)
                die("%s has %lld bytes, expected 4096", p, (long long)st.st_size);
        }
    uint64_t t2 = now_ns();
    phase("stat", t1, t2);
    for (uint64_t i = 0; i < files; i++) {
        const char *p = names + i * w;
        if (unlink(p) != 0)
            die("unlink %s: %s", p, strerror(errno));
    }
    uint64_t t3 = now_ns();
    phase("unlink", t2, t3);
    finish(start, t3, files * 4096, files * (3 + passes), setup_s);
    if (rmdir(dir) != 0)
        die("rmdir %s: %s", dir, strerror(errno));
}

/* mdtest-style: `files` empty files created (open O_CREAT|O_EXCL, close), each stat'ed
   once, then removed, one phase each. shared=1: all processes in one directory `dir`
   (names carry `rank`), else a directory of its own, dir/p<rank>. */
static void mode_mdtest(void)
{
    const char *dir = need("dir");
    uint64_t files = need_u64("files"), rank = need_u64("rank");
    int shared = opt_u64("shared", 0) != 0;
    char own[512];
    if (shared)
        snprintf(own, sizeof own, "%s", dir);
    else
        snprintf(own, sizeof own, "%s/p%llu", dir, (unsigned long long)rank);
    size_t w = strlen(own) + 32;
    char *names = malloc(files * w + 1);
    if (!names)
        die("out of memory");
    for (uint64_t i = 0; i < files; i++)
        snprintf(names + i * w, w, "%s/r%llu.f%07llu", own, (unsigned long long)rank,
                 (unsigned long long)i);
    warm_up();
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        die("mkdir %s: %s", dir, strerror(errno));
    if (!shared && mkdir(own, 0755) != 0)
        die("mkdir %s: %s", own, strerror(errno));
    double setup_s;
    uint64_t start = barrier(&setup_s);
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < files; i++) {
        const char *p = names + i * w;
        close_or_die(open_or_die(p, O_WRONLY | O_CREAT | O_EXCL), p);
    }
    uint64_t t1 = now_ns();
    phase("create", t0, t1);
    struct stat st;
    for (uint64_t i = 0; i < files; i++) {
        const char *p = names + i * w;
        if (stat(p, &st) != 0 || st.st_size != 0)
            die("stat %s: %s", p, strerror(errno));
    }
    uint64_t t2 = now_ns();
    phase("stat", t1, t2);
    for (uint64_t i = 0; i < files; i++) {
        const char *p = names + i * w;
        if (unlink(p) != 0)
            die("unlink %s: %s", p, strerror(errno));
    }
    uint64_t t3 = now_ns();
    phase("remove", t2, t3);
    finish(start, t3, 0, files * 3, setup_s);
    if (!shared && rmdir(own) != 0)
        die("rmdir %s: %s", own, strerror(errno));
}

static void mode_passthru(void)
{
    const char *path = need("path");
    uint64_t region = need_u64("region"), c64 = need_u64("calls64"), c4k = need_u64("calls4k");
    uint64_t rounds = need_u64("rounds");
    check_sizes(region, 4096);
    unsigned char *src = alloc_aligned(4096), *buf = alloc_aligned(4096);
    fill_pattern(src, 4096, 1);
    int fd = open_or_die(path, O_RDWR | O_CREAT | O_EXCL);
    /* Write the region once, so the timed calls find its pages allocated. */
    for (uint64_t off = 0; off < region; off += 4096)
        write_full(fd, src, 4096, path);
    double setup_s;
    uint64_t start = barrier(&setup_s), bytes = 0;
    static const struct {
        const char *name;
        int wr;
        size_t sz;
    } ops[] = {{"write-64", 1, 64}, {"write-4096", 1, 4096}, {"read-64", 0, 64}, {"read-4096", 0, 4096}};
    const size_t nops = sizeof ops / sizeof ops[0];
    for (size_t k = 0; k < rounds * nops; k++) {
        size_t o = k % nops;
        uint64_t calls = ops[o].sz == 64 ? c64 : c4k, pos = 0;
        size_t sz = ops[o].sz;
        uint64_t t0 = now_ns();
        if (lseek(fd, 0, SEEK_SET) != 0)
            die("lseek %s: %s", path, strerror(errno));
        for (uint64_t i = 0; i < calls; i++) {
            if (pos + sz > region) {
                if (lseek(fd, 0, SEEK_SET) != 0)
                    die("lseek %s: %s", path, strerror(errno));
                pos = 0;
            }
            ssize_t r = ops[o].wr ? write(fd, src, sz) : read(fd, buf, sz);
            if (r != (ssize_t)sz)
                die("%s %s: %s", ops[o].wr ? "write" : "read", path,
                    r < 0 ? strerror(errno) : "short transfer");
            clobber(buf);
            pos += sz;
        }
        phase(ops[o].name, t0, now_ns());
        bytes += calls * sz;
    }
    uint64_t end = now_ns();
    finish(start, end, bytes, 2 * rounds * (c64 + c4k), setup_s);
    close(fd);
    if (unlink(path) != 0)
        die("unlink %s: %s", path, strerror(errno));
}

static void mode_probe(void)
{
    const char *path = need("path");
    unsigned char *src = alloc_aligned(4096);
    fill_pattern(src, 4096, 1);
    int fd = open_or_die(path, O_WRONLY | O_CREAT | O_EXCL);
    write_full(fd, src, 4096, path);
    close_or_die(fd, path);
}

int main(int argc, char **argv)
{
    g_t_setup = now_ns();
    g_argc = argc;
    g_argv = argv;
    g_parent = getppid();
    if (argc < 2)
        die("usage: pio write|read|memcpy|paired|sweep|replay|meta|mdtest|passthru|probe key=value...");
    const char *m = argv[1];
    if (!strcmp(m, "write"))
        mode_write();
    else if (!strcmp(m, "read"))
        mode_read();
    else if (!strcmp(m, "memcpy"))
        mode_memcpy();
    else if (!strcmp(m, "paired"))
        mode_paired();
    else if (!strcmp(m, "sweep"))
        mode_sweep();
    else if (!strcmp(m, "replay"))
        mode_replay();
    else if (!strcmp(m, "meta"))
        mode_meta();
    else if (!strcmp(m, "mdtest"))
        mode_mdtest();
    else if (!strcmp(m, "passthru"))
        mode_passthru();
    else if (!strcmp(m, "probe"))
        mode_probe();
    else
        die("unknown mode %s", m);
    return 0;
}
