//! Baselines the suites measure in the same run: memcpy, tmpfs, local disk and the direct
//! write to the durable store, and the C checkpoint writer run under `cascade run`.

use crate::net::WireWatch;
use crate::util::{self, now_ns, Context, Res};
use cascade_durable::{DurableStore, UploadItem};
use serde::Deserialize;
use std::io::Write;
use std::path::Path;

/// Before every measurement: flush dirty pages (the S3 server and the disk baseline leave up
/// to a GiB of them) and wait for an idle machine.
pub(crate) fn settle() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
    util::settle();
}

/// Removes every object under `ckpt/` in the durable store.
pub(crate) fn clear_remote(store: &DurableStore, ckpt: &str) -> Res<()> {
    for obj in store.list(ckpt).ctx(|| format!("listing {ckpt}/"))? {
        store
            .delete(&obj.path)
            .ctx(|| format!("deleting {}", obj.path))?;
    }
    Ok(())
}

/// One direct-s3 upload, in seconds: the whole call, and when 99 % of the bytes the link
/// carried during it had gone through (None without a counter).
pub(crate) fn direct_s3(
    store: &DurableStore,
    data: &[u8],
    ckpt: &str,
    dev: &str,
) -> Res<(f64, Option<f64>)> {
    clear_remote(store, ckpt)?;
    settle();
    let watch = WireWatch::start(dev);
    let t0 = now_ns();
    let r = store
        .upload_checkpoint(ckpt, vec![UploadItem::from_bytes("data.bin", data)])
        .ctx(|| format!("direct-s3: uploading {ckpt}"));
    let t1 = now_ns();
    let wire = watch.and_then(|w| w.finish());
    r?;
    clear_remote(store, ckpt)?;
    Ok((
        (t1 - t0) as f64 / 1e9,
        wire.map(|(_, end)| end.saturating_sub(t0) as f64 / 1e9),
    ))
}

/// (write seconds, write + fsync + close seconds).
pub(crate) fn direct_dir(dir: &Path, data: &[u8], piece: usize) -> Res<(f64, f64)> {
    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
    let path = dir.join("data.bin");
    let _ = std::fs::remove_file(&path);
    settle();
    let t0 = now_ns();
    let mut f = std::fs::File::create(&path).ctx(|| format!("creating {}", path.display()))?;
    for p in data.chunks(piece) {
        f.write_all(p)
            .ctx(|| format!("writing {}", path.display()))?;
    }
    let t1 = now_ns();
    f.sync_all()
        .ctx(|| format!("fsync of {}", path.display()))?;
    drop(f);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("fsync of {}", dir.display()))?;
    let t2 = now_ns();
    std::fs::remove_file(&path).ctx(|| format!("removing {}", path.display()))?;
    Ok(((t1 - t0) as f64 / 1e9, (t2 - t0) as f64 / 1e9))
}

/// The checkpoint writer run under `cascade run` (compiled with cc at the start of the run).
pub(crate) const WRITER_C: &str = r#"
/* ckptwriter PATH SIZE PIECE DATAFILE cli|lib CASCADE CKPT
 * Writes SIZE bytes of DATAFILE (mapped and pre-faulted before the clock starts) to PATH
 * (creating its directory) with write(2) in PIECE-byte calls and closes it. Then commits the
 * checkpoint: "cli" runs `CASCADE commit CKPT` (fork + exec, waits for it); "lib" calls
 * cascade_commit(dirname(PATH)) of the preloaded libcascade.so (include/cascade.h) in this
 * process. Prints one JSON line with CLOCK_MONOTONIC times: start (before mkdir/open),
 * written (after close), committed, and the CLOCK_REALTIME start. */
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

int main(int argc, char **argv) {
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
    int dfd = open(datafile, O_RDONLY);
    if (dfd < 0) die("open", datafile);
    const unsigned char *data = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, dfd, 0);
    if (data == MAP_FAILED) die("mmap", datafile);
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < size; i += 4096) sink ^= data[i];
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = 0;

    uint64_t start = ns(CLOCK_MONOTONIC), start_unix = ns(CLOCK_REALTIME);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open", path);
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
    uint64_t written = ns(CLOCK_MONOTONIC);
    if (lib) {
        if (commit(dir) != 0) {
            fprintf(stderr, "ckptwriter: cascade_commit(%s): %s\n", dir,
                    why ? why() : strerror(errno));
            return 1;
        }
    } else {
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
    }
    uint64_t committed = ns(CLOCK_MONOTONIC);
    printf("{\"start_ns\":%llu,\"written_ns\":%llu,\"committed_ns\":%llu,\"start_unix_ns\":%llu}\n",
           (unsigned long long)start, (unsigned long long)written,
           (unsigned long long)committed, (unsigned long long)start_unix);
    return sink == 256;
}
"#;

#[derive(Deserialize)]
pub(crate) struct WriterOut {
    pub(crate) start_ns: u64,
    pub(crate) written_ns: u64,
    pub(crate) committed_ns: u64,
    pub(crate) start_unix_ns: u64,
}

/// memcpy of `data` into a pre-faulted private buffer, seconds.
pub(crate) fn memcpy_s(data: &[u8], buf: &mut [u8]) -> f64 {
    settle();
    let t0 = now_ns();
    buf.copy_from_slice(data);
    let t1 = now_ns();
    std::hint::black_box(&buf);
    (t1 - t0) as f64 / 1e9
}

/// write(2) of `data` in `piece`-byte calls into a new tmpfs file, then close; seconds.
pub(crate) fn tmpfs_s(path: &Path, data: &[u8], piece: usize) -> Res<f64> {
    let _ = std::fs::remove_file(path);
    settle();
    let t0 = now_ns();
    let mut f = std::fs::File::create(path).ctx(|| format!("creating {}", path.display()))?;
    for c in data.chunks(piece) {
        f.write_all(c)
            .ctx(|| format!("writing {}", path.display()))?;
    }
    drop(f);
    let t1 = now_ns();
    std::fs::remove_file(path).ctx(|| format!("removing {}", path.display()))?;
    Ok((t1 - t0) as f64 / 1e9)
}

/// The checkpoint data, once per run: a new /dev/shm file of `bytes` (the C writers map it
/// too), filled with a non-zero xorshift pattern (not compressible), mapped.
pub(crate) fn data_file(path: &Path, bytes: u64, seed: u64) -> Res<memmap2::MmapMut> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(|| format!("creating {}", path.display()))?;
    f.set_len(bytes)
        .ctx(|| format!("sizing {}", path.display()))?;
    // SAFETY: the file was just created by this process, which alone writes it; it is not
    // truncated while mapped.
    let mut map =
        unsafe { memmap2::MmapMut::map_mut(&f) }.ctx(|| format!("mapping {}", path.display()))?;
    util::fill_pattern(&mut map, seed);
    Ok(map)
}
