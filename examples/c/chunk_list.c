/*
 * chunk_list: write a checkpoint into a Cascade store, then read it back zero-copy.
 *
 *   chunk_list STORE_NAME [SIZE_BYTES [PATH]]
 *
 * Attaches the store STORE_NAME (which must exist: `cascade init`), writes SIZE_BYTES
 * (default 1 MiB + 1234) of pseudo-random data to PATH (default
 * /chunk_list_example/rank0.ckpt), lists the file's chunks with cascade_get_chunk_meta_list
 * and checksums the file by reading memory chunks straight from their mapped addresses and
 * spilled chunks with pread(2) on the spill file, comparing with the data it wrote.
 * Prints one summary line and exits 0 if everything matches, 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cascade.h"

_Static_assert(sizeof(cascade_chunk_meta) == 48, "cascade_chunk_meta layout");

static int fail(const char *what) {
    fprintf(stderr, "chunk_list: %s: %s (errno %d)\n", what, cascade_strerror_last(), errno);
    return 1;
}

/* FNV-1a, 64 bit. */
static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}
#define FNV_OFFSET 14695981039346656037ULL

/* pread the whole range, retrying short reads and EINTR. */
static int pread_full(int fd, unsigned char *buf, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s STORE_NAME [SIZE_BYTES [PATH]]\n", argv[0]);
        return 2;
    }
    const char *store_name = argv[1];
    size_t size = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (1u << 20) + 1234;
    const char *path = argc > 3 ? argv[3] : "/chunk_list_example/rank0.ckpt";

    cascade_store *store = cascade_attach(store_name);
    if (!store)
        return fail("attaching the store");

    /* The checkpoint: deterministic pseudo-random bytes (xorshift64). */
    unsigned char *data = malloc(size ? size : 1);
    if (!data) {
        perror("malloc");
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ULL ^ size;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data[i] = (unsigned char)(x >> 24);
    }

    /* Create the parent directory if the path has one (it may already exist). */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (slash && slash != path && (size_t)(slash - path) < sizeof dir) {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
        if (cascade_mkdir(store, dir, 0755) != 0 && errno != EEXIST)
            return fail("creating the checkpoint directory");
    }
    if (cascade_write_file(store, path, data, size) != 0)
        return fail("writing the checkpoint");

    /* Size query: with no room for entries the call fails with ERANGE and says how many. */
    size_t count = 0;
    int rc = cascade_get_chunk_meta_list(store, path, NULL, 0, &count);
    if (rc == 0 && count != 0) {
        fprintf(stderr, "chunk_list: size query returned 0 with count %zu\n", count);
        return 1;
    }
    if (rc != 0 && errno != ERANGE)
        return fail("counting the chunks");
    if (size > 0 && count == 0) {
        fprintf(stderr, "chunk_list: a %zu-byte file has no chunks\n", size);
        return 1;
    }

    cascade_chunk_meta *chunks = calloc(count ? count : 1, sizeof *chunks);
    if (!chunks) {
        perror("calloc");
        return 1;
    }
    size_t got = 0;
    if (cascade_get_chunk_meta_list(store, path, chunks, count, &got) != 0)
        return fail("listing the chunks");
    if (got != count) {
        fprintf(stderr, "chunk_list: count changed from %zu to %zu\n", count, got);
        return 1;
    }

    void *region = NULL;
    size_t region_len = 0;
    if (cascade_get_data_region(store, &region, &region_len) != 0)
        return fail("getting the data region");

    int spill_fd = -1;
    const char *spill = cascade_spill_path(store);

    unsigned char *scratch = NULL;
    uint64_t sum_chunks = FNV_OFFSET, covered = 0, next_offset = 0;
    size_t in_memory = 0, spilled = 0;
    for (size_t i = 0; i < count; i++) {
        const cascade_chunk_meta *c = &chunks[i];
        if (c->file_offset != next_offset || c->file_offset + c->length > size) {
            fprintf(stderr,
                    "chunk_list: chunk %zu (index %" PRIu64 ") covers [%" PRIu64 ", +%" PRIu64
                    "), expected to start at %" PRIu64 " in a %zu-byte file\n",
                    i, c->index, c->file_offset, c->length, next_offset, size);
            return 1;
        }
        const unsigned char *bytes;
        if (c->location == CASCADE_CHUNK_MEMORY) {
            const unsigned char *lo = region, *p = c->addr;
            if (!p || p < lo || p + c->length > lo + region_len) {
                fprintf(stderr, "chunk_list: chunk %" PRIu64 " lies outside the data region\n",
                        c->index);
                return 1;
            }
            bytes = p; /* zero copy: straight from the shared mapping */
            in_memory++;
        } else if (c->location == CASCADE_CHUNK_SPILL) {
            if (!spill)
                return fail("a chunk is spilled but the spill file is unknown");
            if (spill_fd < 0 && (spill_fd = open(spill, O_RDONLY | O_CLOEXEC)) < 0) {
                perror(spill);
                return 1;
            }
            unsigned char *grown = realloc(scratch, c->length ? c->length : 1);
            if (!grown) {
                perror("realloc");
                return 1;
            }
            scratch = grown;
            if (pread_full(spill_fd, scratch, c->length, c->spill_offset) != 0) {
                fprintf(stderr, "chunk_list: pread of spilled chunk %" PRIu64 " failed\n",
                        c->index);
                return 1;
            }
            bytes = scratch;
            spilled++;
        } else {
            fprintf(stderr, "chunk_list: chunk %" PRIu64 " has unknown location %u\n", c->index,
                    c->location);
            return 1;
        }
        if (memcmp(bytes, data + c->file_offset, c->length) != 0) {
            fprintf(stderr, "chunk_list: chunk %" PRIu64 " (%s) differs from the data written\n",
                    c->index, c->location == CASCADE_CHUNK_MEMORY ? "memory" : "spill");
            return 1;
        }
        sum_chunks = fnv1a(sum_chunks, bytes, c->length);
        covered += c->length;
        next_offset = c->file_offset + c->length;
    }

    uint64_t sum_data = fnv1a(FNV_OFFSET, data, size);
    if (covered != size || sum_chunks != sum_data) {
        fprintf(stderr,
                "chunk_list: chunks cover %" PRIu64 " of %zu bytes, checksum %016" PRIx64
                " vs %016" PRIx64 "\n",
                covered, size, sum_chunks, sum_data);
        return 1;
    }

    /* The plain read helper must agree too. */
    unsigned char *back = malloc(size ? size : 1);
    if (!back) {
        perror("malloc");
        return 1;
    }
    ssize_t n = cascade_read_file(store, path, back, size, 0);
    if (n < 0)
        return fail("reading the checkpoint back");
    if ((size_t)n != size || memcmp(back, data, size) != 0) {
        fprintf(stderr, "chunk_list: cascade_read_file returned different data\n");
        return 1;
    }

    printf("chunks=%zu memory=%zu spilled=%zu bytes=%zu checksum=%016" PRIx64 " OK\n", count,
           in_memory, spilled, size, sum_chunks);

    if (spill_fd >= 0)
        close(spill_fd);
    free(back);
    free(scratch);
    free(chunks);
    free(data);
    cascade_detach(store);
    return 0;
}
