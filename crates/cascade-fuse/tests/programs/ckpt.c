/* A checkpoint writer and checker for tests/mount.rs, built with `gcc -static` so that the
 * preload library cannot reach it: its files reach the store only through the FUSE mount.
 *
 *   ckpt write DIR    writes the checkpoint below DIR (which must exist)
 *   ckpt verify DIR   reads it back and checks every byte, the sizes and the listing
 *
 * Every data file is written to NAME.tmp with pwrite at scattered offsets (odd chunks
 * backwards, then even chunks forwards), fsync'ed, closed and renamed to NAME; sparse.dat is
 * extended with ftruncate and written in the middle; MANIFEST is written last, the same way.
 * The bytes are pattern(seed, offset), computed identically by ckpt.go and tests/mount.rs.
 * Exit 0 on success, 1 with a message on stderr on any failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct spec {
    const char *name;
    uint64_t size;
    uint64_t seed;
};

static const struct spec FILES[] = {
    {"rank0.dat", 3u * 1048576u + 5u, 1},
    {"rank1.dat", 1048576u, 2},
    {"rank2.dat", 4096u + 17u, 3},
    {"empty.dat", 0, 4},
};
#define NFILES (sizeof FILES / sizeof FILES[0])

/* sparse.dat: SPARSE_SIZE bytes, zeros except SPARSE_LEN pattern bytes at SPARSE_AT. */
#define SPARSE_SIZE (2u * 1048576u + 100u)
#define SPARSE_AT 1234567u
#define SPARSE_LEN 1000u
#define SPARSE_SEED 5u

#define CHUNK (3u * 65536u + 7u)

static uint8_t pattern(uint64_t seed, uint64_t off) {
    uint64_t v = (off ^ (seed << 40)) * 0x9E3779B97F4A7C15ull;
    v ^= v >> 29;
    return (uint8_t)(v >> 24);
}

static void fail(const char *what, const char *path) {
    fprintf(stderr, "ckpt: %s %s: %s\n", what, path, errno ? strerror(errno) : "mismatch");
    exit(1);
}

static void fill(uint8_t *buf, uint64_t seed, uint64_t off, size_t len) {
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(seed, off + i);
}

static void pwrite_all(int fd, const uint8_t *buf, size_t len, uint64_t off, const char *path) {
    while (len > 0) {
        ssize_t n = pwrite(fd, buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail("pwrite", path);
        buf += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
}

static void finish(int fd, const char *tmp, const char *final) {
    if (fsync(fd) != 0)
        fail("fsync", tmp);
    if (close(fd) != 0)
        fail("close", tmp);
    if (rename(tmp, final) != 0)
        fail("rename", tmp);
}

static void write_file(const char *dir, const struct spec *s, uint8_t *buf) {
    char tmp[4096], final[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, s->name);
    snprintf(final, sizeof final, "%s/%s", dir, s->name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        fail("open", tmp);
    uint64_t chunks = (s->size + CHUNK - 1) / CHUNK;
    /* Odd chunks from the last one down, then even chunks from the first one up. */
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t k = 0; k < chunks; k++) {
            uint64_t c = pass == 0 ? chunks - 1 - k : k;
            if ((c % 2 == 1) != (pass == 0))
                continue;
            uint64_t off = c * CHUNK;
            size_t len = (size_t)(s->size - off < CHUNK ? s->size - off : CHUNK);
            fill(buf, s->seed, off, len);
            pwrite_all(fd, buf, len, off, tmp);
        }
    }
    finish(fd, tmp, final);
}

static void write_sparse(const char *dir, uint8_t *buf) {
    char tmp[4096], final[4096];
    snprintf(tmp, sizeof tmp, "%s/sparse.dat.tmp", dir);
    snprintf(final, sizeof final, "%s/sparse.dat", dir);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        fail("open", tmp);
    if (ftruncate(fd, SPARSE_SIZE) != 0)
        fail("ftruncate", tmp);
    fill(buf, SPARSE_SEED, SPARSE_AT, SPARSE_LEN);
    pwrite_all(fd, buf, SPARSE_LEN, SPARSE_AT, tmp);
    finish(fd, tmp, final);
}

static int manifest(char *out, size_t cap) {
    int n = 0;
    for (size_t i = 0; i < NFILES; i++)
        n += snprintf(out + n, cap - (size_t)n, "%s %llu\n", FILES[i].name,
                      (unsigned long long)FILES[i].size);
    n += snprintf(out + n, cap - (size_t)n, "sparse.dat %u\n", SPARSE_SIZE);
    return n;
}

static void do_write(const char *dir) {
    uint8_t *buf = malloc(CHUNK);
    if (!buf)
        fail("malloc", dir);
    for (size_t i = 0; i < NFILES; i++)
        write_file(dir, &FILES[i], buf);
    write_sparse(dir, buf);
    free(buf);

    char tmp[4096], final[4096], text[1024];
    snprintf(tmp, sizeof tmp, "%s/MANIFEST.tmp", dir);
    snprintf(final, sizeof final, "%s/MANIFEST", dir);
    int len = manifest(text, sizeof text);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0)
        fail("open", tmp);
    /* Sequential write()s, a few bytes at a time. */
    for (int off = 0; off < len; off += 7) {
        size_t n = (size_t)(len - off < 7 ? len - off : 7);
        if (write(fd, text + off, n) != (ssize_t)n)
            fail("write", tmp);
    }
    finish(fd, tmp, final);

    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0)
        fail("open", dir);
    if (fsync(dfd) != 0)
        fail("fsync", dir);
    close(dfd);
    printf("wrote %zu files in %s\n", NFILES + 2, dir);
}

/* Reads `path` whole with read() in 1 MiB calls and checks size and every byte against
 * expect(off). Returns the size read. */
static uint64_t check(const char *path, uint64_t size, uint8_t (*expect)(uint64_t, uint64_t),
                      uint64_t seed) {
    struct stat st;
    if (stat(path, &st) != 0)
        fail("stat", path);
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) {
        errno = 0;
        fprintf(stderr, "ckpt: %s: size %lld, expected %llu\n", path, (long long)st.st_size,
                (unsigned long long)size);
        exit(1);
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        fail("open", path);
    static uint8_t buf[1048576];
    uint64_t off = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail("read", path);
        if (n == 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != expect(seed, off + (uint64_t)i)) {
                fprintf(stderr, "ckpt: %s: byte %llu differs\n", path,
                        (unsigned long long)(off + (uint64_t)i));
                exit(1);
            }
        }
        off += (uint64_t)n;
    }
    /* A pread in the middle, too. */
    if (size > 10) {
        uint8_t b;
        if (pread(fd, &b, 1, (off_t)(size / 2)) != 1)
            fail("pread", path);
        if (b != expect(seed, size / 2)) {
            errno = 0;
            fail("pread mismatch", path);
        }
    }
    close(fd);
    if (off != size) {
        errno = 0;
        fail("short read", path);
    }
    return off;
}

static uint8_t sparse_byte(uint64_t seed, uint64_t off) {
    return off >= SPARSE_AT && off < SPARSE_AT + SPARSE_LEN ? pattern(seed, off) : 0;
}

static void do_verify(const char *dir) {
    char path[4096];
    uint64_t total = 0;
    for (size_t i = 0; i < NFILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, FILES[i].name);
        total += check(path, FILES[i].size, pattern, FILES[i].seed);
    }
    snprintf(path, sizeof path, "%s/sparse.dat", dir);
    total += check(path, SPARSE_SIZE, sparse_byte, SPARSE_SEED);

    char want[1024], got[1024];
    int len = manifest(want, sizeof want);
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        fail("open", path);
    ssize_t n = read(fd, got, sizeof got);
    close(fd);
    if (n != len || memcmp(want, got, (size_t)len) != 0) {
        errno = 0;
        fail("contents of", path);
    }

    /* Exactly the final names: no .tmp left behind. */
    DIR *d = opendir(dir);
    if (!d)
        fail("opendir", dir);
    size_t names = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        names++;
        if (strstr(e->d_name, ".tmp")) {
            errno = 0;
            fail("left behind:", e->d_name);
        }
    }
    closedir(d);
    if (names != NFILES + 2) {
        fprintf(stderr, "ckpt: %s holds %zu names, expected %zu\n", dir, names, NFILES + 2);
        exit(1);
    }
    printf("verified %zu files, %llu bytes in %s\n", NFILES + 2, (unsigned long long)total,
           dir);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ckpt write|verify DIR\n");
        return 2;
    }
    if (strcmp(argv[1], "write") == 0)
        do_write(argv[2]);
    else if (strcmp(argv[1], "verify") == 0)
        do_verify(argv[2]);
    else {
        fprintf(stderr, "usage: ckpt write|verify DIR\n");
        return 2;
    }
    return 0;
}
