/* Reads a directory with getdents64 in small (4 KiB) batches, as readdir does on a kernel
 * whose FUSE readdir fills one page per call, for tests/mount.rs:
 *
 *   listing list DIR     counts the entries (no . and ..), failing on a name seen twice
 *   listing unlink DIR   unlinks every entry as soon as its batch is read, then reads on
 *
 * Prints "N entries in C calls" (the calls that returned entries). Exit 1 on any error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct dirent64_raw {
    unsigned long long ino;
    long long off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

#define MAX_NAMES 100000

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "list") != 0 && strcmp(argv[1], "unlink") != 0)) {
        fprintf(stderr, "usage: listing list|unlink DIR\n");
        return 2;
    }
    int do_unlink = strcmp(argv[1], "unlink") == 0;
    int fd = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        perror(argv[2]);
        return 1;
    }
    static char *names[MAX_NAMES];
    size_t count = 0, calls = 0;
    char buf[4096];
    for (;;) {
        long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n < 0) {
            perror("getdents64");
            return 1;
        }
        if (n == 0)
            break;
        calls++;
        for (long p = 0; p < n;) {
            struct dirent64_raw *e = (struct dirent64_raw *)(buf + p);
            p += e->reclen;
            if (strcmp(e->name, ".") == 0 || strcmp(e->name, "..") == 0)
                continue;
            if (count == MAX_NAMES) {
                fprintf(stderr, "more than %d entries\n", MAX_NAMES);
                return 1;
            }
            names[count++] = strdup(e->name);
            if (do_unlink && unlinkat(fd, e->name, 0) != 0) {
                perror(e->name);
                return 1;
            }
        }
    }
    qsort(names, count, sizeof names[0], cmp);
    for (size_t i = 1; i < count; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            fprintf(stderr, "%s listed twice\n", names[i]);
            return 1;
        }
    }
    printf("%zu entries in %zu calls\n", count, calls);
    return 0;
}
