/* ckptwriter: the checkpoint writers of the durable and staging suites, run under
 * `cascade run` (compiled with cc at the start of the run). DATAFILE is mapped and
 * pre-faulted before the clock starts; every file is written with write(2) in PIECE-byte
 * calls and closed. Times are CLOCK_MONOTONIC.
 *
 * ckptwriter PATH SIZE PIECE DATAFILE cli|lib CASCADE CKPT
 *   Writes SIZE bytes to PATH (creating its directory), then commits the checkpoint: "cli"
 *   runs `CASCADE commit CKPT` (fork + exec, waits for it); "lib" calls
 *   cascade_commit(dirname(PATH)) of the preloaded libcascade.so (include/cascade.h) in this
 *   process. Prints {"start_ns","written_ns","committed_ns","start_unix_ns"}: start before
 *   mkdir/open, written after close, the CLOCK_REALTIME start.
 * ckptwriter ranks DIR N SIZE PIECE DATAFILE
 *   Forks N writers. Writer K maps bytes K*SIZE..(K+1)*SIZE of DATAFILE, creates
 *   DIR/rankK.dat, reports ready, waits for the common start, writes and closes. The parent
 *   releases all writers at once (it closes the write end of a pipe they block on) once every
 *   one is ready. Prints one line per writer, {"rank":K,"start_ns":..,"closed_ns":..}, then
 *   {"start_ns":T} with the release time.
 * ckptwriter relay PATH SIZE PIECE DATAFILE OFFSET CASCADE CKPT
 *   One rank of the jobs suite, driven over stdin: maps SIZE bytes of DATAFILE at OFFSET,
 *   prints READY and waits for a line. GO starts the clock: writes PATH as above and prints
 *   "WRITTEN START END". Then the next line: COMMIT runs `CASCADE commit CKPT` and prints
 *   "COMMITTED END"; anything else (EXIT, EOF) ends it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *arg) {
    fprintf(stderr, "ckptwriter: %s %s: %s\n", what, arg, strerror(errno));
    exit(1);
}

static void say(const char *line) {
    size_t n = strlen(line), done = 0;
    while (done < n) {
        ssize_t k = write(1, line + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) exit(1);
        done += (size_t)k;
    }
}

static volatile unsigned char sink;

/* SIZE bytes of DATAFILE from OFFSET, mapped and pre-faulted. */
static const unsigned char *map_data(const char *datafile, size_t size, off_t offset) {
    int dfd = open(datafile, O_RDONLY);
    if (dfd < 0) die("open", datafile);
    const unsigned char *data = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, dfd, offset);
    if (data == MAP_FAILED) die("mmap", datafile);
    for (size_t i = 0; i < size; i += 4096) sink ^= data[i];
    return data;
}

static void write_all(int fd, const unsigned char *data, size_t size, size_t piece,
                      const char *path) {
    size_t done = 0;
    while (done < size) {
        size_t want = size - done < piece ? size - done : piece;
        ssize_t k = write(fd, data + done, want);
        if (k < 0) {
            if (errno == EINTR) continue;
            die("write", path);
        }
        done += (size_t)k;
    }
    if (close(fd) != 0) die("close", path);
}

/* Runs `CASCADE commit CKPT` and waits for it; 0 when it succeeded. */
static int commit_cli(const char *cascade, const char *ckpt) {
    pid_t pid = fork();
    if (pid < 0) die("fork", "");
    if (pid == 0) {
        execl(cascade, cascade, "commit", ckpt, (char *)NULL);
        fprintf(stderr, "ckptwriter: exec %s: %s\n", cascade, strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) die("waitpid", "");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "ckptwriter: %s commit %s failed (status %d)\n", cascade, ckpt, st);
        return 1;
    }
    return 0;
}

/* The directory of PATH, into `dir`. */
static void dir_of(const char *path, char *dir, size_t len) {
    snprintf(dir, len, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;
}

static int relay(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: ckptwriter relay PATH SIZE PIECE DATAFILE OFFSET CASCADE CKPT\n");
        return 2;
    }
    const char *path = argv[2], *cascade = argv[7], *ckpt = argv[8];
    size_t size = strtoull(argv[3], NULL, 10), piece = strtoull(argv[4], NULL, 10);
    const unsigned char *data = map_data(argv[5], size, (off_t)strtoull(argv[6], NULL, 10));
    char dir[4096], line[256];
    dir_of(path, dir, sizeof dir);
    say("READY\n");
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "GO", 2) != 0) return 0;
    uint64_t start = ns(CLOCK_MONOTONIC);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open", path);
    write_all(fd, data, size, piece, path);
    snprintf(line, sizeof line, "WRITTEN %llu %llu\n", (unsigned long long)start,
             (unsigned long long)ns(CLOCK_MONOTONIC));
    say(line);
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "COMMIT", 6) != 0) return sink == 256;
    if (commit_cli(cascade, ckpt) != 0) return 1;
    snprintf(line, sizeof line, "COMMITTED %llu\n", (unsigned long long)ns(CLOCK_MONOTONIC));
    say(line);
    return sink == 256;
}

static int ranks(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: ckptwriter ranks DIR N SIZE PIECE DATAFILE\n");
        return 2;
    }
    const char *dir = argv[2], *datafile = argv[6];
    int n = atoi(argv[3]);
    size_t size = strtoull(argv[4], NULL, 10), piece = strtoull(argv[5], NULL, 10);
    if (n <= 0 || size == 0 || piece == 0) {
        fprintf(stderr, "ckptwriter: bad arguments\n");
        return 2;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0) die("pipe", "");
    for (int k = 0; k < n; k++) {
        pid_t pid = fork();
        if (pid < 0) die("fork", "");
        if (pid > 0) continue;
        close(ready[0]);
        close(go[1]);
        const unsigned char *data = map_data(datafile, size, (off_t)k * (off_t)size);
        char path[4096];
        snprintf(path, sizeof path, "%s/rank%d.dat", dir, k);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("open", path);
        if (write(ready[1], "r", 1) != 1) die("write", "ready pipe");
        char c;
        while (read(go[0], &c, 1) < 0 && errno == EINTR) {}
        uint64_t start = ns(CLOCK_MONOTONIC);
        write_all(fd, data, size, piece, path);
        uint64_t closed = ns(CLOCK_MONOTONIC);
        char line[256];
        snprintf(line, sizeof line, "{\"rank\":%d,\"start_ns\":%llu,\"closed_ns\":%llu}\n", k,
                 (unsigned long long)start, (unsigned long long)closed);
        say(line);
        _exit(sink == 256);
    }
    close(ready[1]);
    close(go[0]);
    for (int got = 0; got < n;) {
        char buf[64];
        ssize_t k = read(ready[0], buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            fprintf(stderr, "ckptwriter: a writer died before it was ready\n");
            return 1;
        }
        got += (int)k;
    }
    uint64_t start = ns(CLOCK_MONOTONIC);
    close(go[1]);
    int failed = 0;
    for (int k = 0; k < n; k++) {
        int st;
        while (wait(&st) < 0)
            if (errno != EINTR) die("wait", "");
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    }
    if (failed) {
        fprintf(stderr, "ckptwriter: a writer failed\n");
        return 1;
    }
    char line[128];
    snprintf(line, sizeof line, "{\"start_ns\":%llu}\n", (unsigned long long)start);
    say(line);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "ranks") == 0) return ranks(argc, argv);
    if (argc > 1 && strcmp(argv[1], "relay") == 0) return relay(argc, argv);
    if (argc != 8 || (strcmp(argv[5], "cli") != 0 && strcmp(argv[5], "lib") != 0)) {
        fprintf(stderr, "usage: ckptwriter PATH SIZE PIECE DATAFILE cli|lib CASCADE CKPT\n");
        return 2;
    }
    const char *path = argv[1], *datafile = argv[4], *cascade = argv[6], *ckpt = argv[7];
    int lib = strcmp(argv[5], "lib") == 0;
    size_t size = strtoull(argv[2], NULL, 10), piece = strtoull(argv[3], NULL, 10);
    int (*commit)(const char *) = NULL;
    const char *(*why)(void) = NULL;
    if (lib) {
        commit = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cascade_commit");
        why = (const char *(*)(void))dlsym(RTLD_DEFAULT, "cascade_strerror_last");
        if (!commit) {
            fprintf(stderr, "ckptwriter: no cascade_commit (libcascade.so not preloaded?)\n");
            return 1;
        }
    }
    const unsigned char *data = map_data(datafile, size, 0);
    char dir[4096];
    dir_of(path, dir, sizeof dir);

    uint64_t start = ns(CLOCK_MONOTONIC), start_unix = ns(CLOCK_REALTIME);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open", path);
    write_all(fd, data, size, piece, path);
    uint64_t written = ns(CLOCK_MONOTONIC);
    if (lib) {
        if (commit(dir) != 0) {
            fprintf(stderr, "ckptwriter: cascade_commit(%s): %s\n", dir,
                    why ? why() : strerror(errno));
            return 1;
        }
    } else if (commit_cli(cascade, ckpt) != 0) {
        return 1;
    }
    uint64_t committed = ns(CLOCK_MONOTONIC);
    printf("{\"start_ns\":%llu,\"written_ns\":%llu,\"committed_ns\":%llu,\"start_unix_ns\":%llu}\n",
           (unsigned long long)start, (unsigned long long)written,
           (unsigned long long)committed, (unsigned long long)start_unix);
    return sink == 256;
}
