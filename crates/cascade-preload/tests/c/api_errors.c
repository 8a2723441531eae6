/*
 * api_errors STORE MISSING_STORE: checks the error contract of include/cascade.h.
 * STORE must exist, have no spill file, and hold less than 4 MiB of memory; MISSING_STORE
 * must not exist. Prints "api_errors OK" and exits 0 if every check holds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cascade.h"

static int failures = 0;

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "api_errors.c:%d: check failed: %s (errno %d, last error \"%s\")\n", \
                    __LINE__, #cond, errno, cascade_strerror_last());                         \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

/* Expects `call` to fail with `rc_fail` and errno `err`, and a non-empty message. */
#define EXPECT_ERR(call, rc_fail, err)                                                        \
    do {                                                                                      \
        errno = 0;                                                                            \
        long long rc_ = (long long)(call);                                                    \
        int e_ = errno;                                                                       \
        if (rc_ != (long long)(rc_fail) || e_ != (err) || cascade_strerror_last()[0] == '\0') { \
            fprintf(stderr, "api_errors.c:%d: %s returned %lld errno %d (%s), wanted %d\n",   \
                    __LINE__, #call, rc_, e_, strerror(e_), (err));                           \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

static cascade_store *g_store;

static void *other_thread(void *arg) {
    (void)arg;
    /* A fresh thread has no last error; its own failure does not touch the main thread's. */
    int ok = cascade_strerror_last()[0] == '\0';
    size_t n;
    ok = ok && cascade_get_chunk_meta_list(g_store, "/thread-missing", NULL, 0, &n) == -1;
    ok = ok && errno == ENOENT && strstr(cascade_strerror_last(), "thread-missing") != NULL;
    return ok ? (void *)1 : NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s STORE MISSING_STORE\n", argv[0]);
        return 2;
    }
    CHECK(cascade_strerror_last() != NULL && cascade_strerror_last()[0] == '\0');

    errno = 0;
    CHECK(cascade_attach(argv[2]) == NULL);
    CHECK(errno == ENOENT);
    CHECK(strstr(cascade_strerror_last(), "cascade_attach") != NULL);

    cascade_store *s = cascade_attach(argv[1]);
    if (!s) {
        fprintf(stderr, "attach %s: %s\n", argv[1], cascade_strerror_last());
        return 1;
    }
    g_store = s;

    /* The default store may or may not exist; either way the call behaves. */
    errno = 0;
    cascade_store *dflt = cascade_attach(NULL);
    CHECK(dflt != NULL || errno == ENOENT);
    cascade_detach(dflt);
    cascade_detach(NULL);

    EXPECT_ERR(cascade_spill_path(s), 0, ENOENT);
    EXPECT_ERR(cascade_spill_path(NULL), 0, EINVAL);

    size_t n = 12345;
    void *addr = NULL;
    size_t len = 0;
    EXPECT_ERR(cascade_get_data_region(s, NULL, &len), -1, EINVAL);
    EXPECT_ERR(cascade_get_data_region(s, &addr, NULL), -1, EINVAL);
    EXPECT_ERR(cascade_get_data_region(NULL, &addr, &len), -1, EINVAL);
    CHECK(cascade_get_data_region(s, &addr, &len) == 0 && addr != NULL && len > 0);

    EXPECT_ERR(cascade_get_chunk_meta_list(s, "/missing", NULL, 0, &n), -1, ENOENT);
    EXPECT_ERR(cascade_get_chunk_meta_list(s, NULL, NULL, 0, &n), -1, EINVAL);
    EXPECT_ERR(cascade_get_chunk_meta_list(s, "/missing", NULL, 4, &n), -1, EINVAL);
    EXPECT_ERR(cascade_get_chunk_meta_list(s, "/missing", NULL, 0, NULL), -1, EINVAL);

    static unsigned char buf[100000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + 1);

    EXPECT_ERR(cascade_write_file(s, "/d/f", buf, sizeof buf), -1, ENOENT);
    CHECK(cascade_mkdir(s, "/d", 0755) == 0);
    EXPECT_ERR(cascade_mkdir(s, "/d", 0755), -1, EEXIST);
    EXPECT_ERR(cascade_write_file(s, "/d/f", NULL, 5), -1, EINVAL);
    EXPECT_ERR(cascade_write_file(s, NULL, buf, 5), -1, EINVAL);
    EXPECT_ERR(cascade_write_file(s, "/d", buf, 5), -1, EISDIR);
    CHECK(cascade_write_file(s, "/d/f", buf, sizeof buf) == 0);

    /* Too small an array: ERANGE, the needed count, and the array left alone. */
    cascade_chunk_meta metas[64];
    memset(metas, 0xAB, sizeof metas);
    n = 0;
    EXPECT_ERR(cascade_get_chunk_meta_list(s, "/d/f", metas, 1, &n), -1, ERANGE);
    CHECK(n >= 2 && n < 64);
    unsigned char untouched[sizeof metas[0]];
    memset(untouched, 0xAB, sizeof untouched);
    CHECK(memcmp(&metas[0], untouched, sizeof untouched) == 0);
    size_t needed = n;
    CHECK(cascade_get_chunk_meta_list(s, "/d/f", metas, 64, &n) == 0);
    CHECK(n == needed);
    CHECK(memcmp(&metas[n], untouched, sizeof untouched) == 0);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(metas[i].location == CASCADE_CHUNK_MEMORY);
        CHECK(metas[i].addr != NULL && metas[i].spill_offset == 0);
        CHECK(i == 0 || metas[i].index > metas[i - 1].index);
        CHECK(memcmp(metas[i].addr, buf + metas[i].file_offset, metas[i].length) == 0);
        total += metas[i].length;
    }
    CHECK(total == sizeof buf);

    /* Reads: short at end of file, 0 past it, errors for what is not a file. */
    unsigned char back[200];
    CHECK(cascade_read_file(s, "/d/f", back, 100, 99990) == 10);
    CHECK(memcmp(back, buf + 99990, 10) == 0);
    CHECK(cascade_read_file(s, "/d/f", back, 100, 100000) == 0);
    CHECK(cascade_read_file(s, "/d/f", back, 100, 1ull << 40) == 0);
    CHECK(cascade_read_file(s, "/d/f", NULL, 0, 0) == 0);
    EXPECT_ERR(cascade_read_file(s, "/d/f", NULL, 10, 0), -1, EINVAL);
    EXPECT_ERR(cascade_read_file(s, "/d/none", back, 10, 0), -1, ENOENT);
    EXPECT_ERR(cascade_read_file(s, "/d", back, 10, 0), -1, EISDIR);
    EXPECT_ERR(cascade_read_file(s, "/d/f/x", back, 10, 0), -1, ENOTDIR);

    /* An empty file has no chunks. */
    CHECK(cascade_write_file(s, "/d/empty", NULL, 0) == 0);
    n = 99;
    CHECK(cascade_get_chunk_meta_list(s, "/d/empty", NULL, 0, &n) == 0 && n == 0);

    /* Rewriting truncates. */
    CHECK(cascade_write_file(s, "/d/f", buf, 10) == 0);
    CHECK(cascade_read_file(s, "/d/f", back, sizeof back, 0) == 10);

    /* Full store: ENOSPC with a message; the store stays usable. */
    size_t big_len = 4u << 20;
    unsigned char *big = calloc(1, big_len);
    CHECK(big != NULL);
    memset(big, 0x5A, big_len);
    EXPECT_ERR(cascade_write_file(s, "/d/big", big, big_len), -1, ENOSPC);
    CHECK(cascade_unlink(s, "/d/big") == 0);
    free(big);
    CHECK(cascade_write_file(s, "/d/after", buf, sizeof buf) == 0);

    EXPECT_ERR(cascade_unlink(s, "/d/none"), -1, ENOENT);
    EXPECT_ERR(cascade_unlink(s, "/d"), -1, EISDIR);

    /* The last error is per thread. */
    EXPECT_ERR(cascade_unlink(s, "/main-missing"), -1, ENOENT);
    pthread_t t;
    void *thread_ok = NULL;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    CHECK(pthread_join(t, &thread_ok) == 0);
    CHECK(thread_ok != NULL);
    CHECK(strstr(cascade_strerror_last(), "main-missing") != NULL);

    cascade_detach(s);
    if (failures) {
        fprintf(stderr, "api_errors: %d checks failed\n", failures);
        return 1;
    }
    printf("api_errors OK\n");
    return 0;
}
