/* heat_common.h - the helpers examples/heat/heat.c and examples/heat_mpi/heat_mpi.c share:
 * option parsing, FNV-1a, time, paths, whole reads and writes, and pruning old checkpoint
 * directories. Included by both after they define `prog` (the program's name for messages),
 * `MAX_CHUNK` (the largest single write() or read()), and the noreturn
 * `bad_usage(fmt, ...)` and `fail(what, path, err)`, which end the program their own way
 * (heat_mpi aborts every rank). Functions are `static inline` so that one a program does not
 * use draws no warning. */

#ifndef HEAT_COMMON_H
#define HEAT_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FNV_BASIS UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

static inline long parse_long(const char *opt, const char *text, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < min || v > max)
        bad_usage("%s: invalid value '%s' (want an integer in %ld..%ld)", opt, text, min, max);
    return v;
}


static inline uint64_t fnv1a64_continue(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static inline uint64_t fnv1a64(const void *data, size_t len)
{
    return fnv1a64_continue(FNV_BASIS, data, len);
}

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* snprintf into a PATH_MAX buffer, failing (exit 1) when the path does not fit. */
static inline void join(char *out, const char *a, const char *b)
{
    int len = snprintf(out, PATH_MAX, "%s/%s", a, b);
    if (len < 0 || len >= PATH_MAX)
        fail("path too long", a, 0);
}

/* mkdir -p: creates every missing component; an existing directory is fine. */
static inline void mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf)
        fail("path too long", path, 0);
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                fail("cannot create directory", buf, errno);
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0)
        fail("cannot create directory", path, errno);
    if (!S_ISDIR(st.st_mode))
        fail("cannot create directory", path, ENOTDIR);
}

/* write() all of buf, in chunks of at most MAX_CHUNK, retrying short writes and EINTR. */
static inline int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        size_t chunk = len < MAX_CHUNK ? len : MAX_CHUNK;
        ssize_t n = write(fd, buf, chunk);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* read() up to len bytes, retrying short reads and EINTR; returns the bytes read (less
 * than len only at end of file) or -1. */
static inline ssize_t read_full(int fd, char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done < MAX_CHUNK ? len - done : MAX_CHUNK;
        ssize_t n = read(fd, buf + done, chunk);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

/* Removes a directory tree (opendir/readdir/lstat/unlink/rmdir only). */
static inline int remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char child[PATH_MAX];
        join(child, path, e->d_name);
        struct stat st;
        if (lstat(child, &st) != 0)
            rc = -1;
        else if (S_ISDIR(st.st_mode) ? remove_tree(child) != 0 : unlink(child) != 0)
            rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0)
        rc = -1;
    return rc;
}

/* The step of a checkpoint directory's name "ckpt.NNNNNN", or -1. */
static inline long ckpt_step(const char *name)
{
    if (strncmp(name, "ckpt.", 5) != 0 || name[5] == '\0')
        return -1;
    long step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > 99999999)
            return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static inline int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* --keep K: removes the checkpoint directories older than the newest K at or
 * before `published` (heat_mpi: rank 0 only). Directories of later steps (left by a crashed
 * earlier run) are left alone: this run rewrites them when it gets there. */
static inline void prune(const char *dir, long keep, long published)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "%s: warning: cannot list %s: %s\n", prog, dir, strerror(errno));
        return;
    }
    long *steps = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = ckpt_step(e->d_name);
        if (s < 0 || s > published)
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown)
                fail("out of memory", dir, ENOMEM);
            steps = grown;
        }
        steps[count++] = s;
    }
    closedir(d);
    if (count > 0)
        qsort(steps, count, sizeof *steps, cmp_long_desc);
    for (size_t i = (size_t)keep; i < count; i++) {
        char name[32], path[PATH_MAX];
        snprintf(name, sizeof name, "ckpt.%06ld", steps[i]);
        join(path, dir, name);
        if (remove_tree(path) != 0)
            fprintf(stderr, "%s: warning: cannot remove %s: %s\n", prog, path, strerror(errno));
    }
    free(steps);
}

#endif /* HEAT_COMMON_H */
