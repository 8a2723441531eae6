/*
 * cascade.h - C API of the Cascade node store (L0).
 *
 * Link with -lcascade (libcascade.so or libcascade.a, built by
 * `cargo build -p cascade-preload`; the static library also needs -lpthread -ldl -lm).
 *
 * A node store is one POSIX shared-memory block per node holding a small file system and
 * the file data in fixed-size chunks, with a spill file on local SSD for chunks that do not
 * fit in memory. Store paths are absolute inside the store ("/ckpt.0001/rank0.dat"); they
 * are not paths of the host file system and must be valid UTF-8.
 *
 * Conventions for every function below:
 *  - Failure is reported by a return value of NULL or -1; errno is then set to the reason
 *    (errno is unspecified after a successful call) and cascade_strerror_last() returns a
 *    one-line message for it. The errno values are the ones the matching POSIX call would
 *    give: ENOENT, EEXIST, ENOTDIR, EISDIR, EINVAL, ENOSPC (store full, or its file table
 *    full), ENAMETOOLONG, EFBIG, ERANGE (cascade_get_chunk_meta_list only). A NULL pointer
 *    where one is required fails with EINVAL. An internal error fails with EIO; no Rust
 *    panic ever unwinds into the caller.
 *  - Thread safety: a cascade_store handle may be used by any number of threads at once,
 *    except that cascade_detach must not run concurrently with any other call on the same
 *    handle (nor may the handle be used after it). Many processes may attach the same store.
 *  - Ownership: the handle belongs to the caller until cascade_detach. Strings returned by
 *    the library belong to the library (never free them); their lifetime is stated per
 *    function. Buffers passed in stay the caller's.
 */
#ifndef CASCADE_H
#define CASCADE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An attached store (opaque). */
typedef struct cascade_store cascade_store;

/* cascade_chunk_meta.location */
#define CASCADE_CHUNK_MEMORY 0u /* in the shared-memory data region */
#define CASCADE_CHUNK_SPILL 1u  /* in the spill file */

/* One chunk of a file, as returned by cascade_get_chunk_meta_list (48 bytes on LP64). */
typedef struct cascade_chunk_meta {
    uint64_t index;        /* logical chunk number (file offset / chunk size) */
    uint64_t file_offset;  /* file offset of the chunk's first byte (index * chunk size): the
                              chunk holds file bytes [file_offset, file_offset + length) */
    uint32_t chunk_id;     /* physical chunk id in the store */
    uint32_t location;     /* CASCADE_CHUNK_MEMORY or CASCADE_CHUNK_SPILL */
    void *addr;            /* memory chunks: the data's address in this process (inside the
                              region of cascade_get_data_region); spilled chunks: NULL */
    uint64_t spill_offset; /* spilled chunks: byte offset in the spill file
                              (cascade_spill_path); memory chunks: 0 */
    uint64_t length;       /* bytes of file data in the chunk: the chunk size, less at the
                              end of the file */
} cascade_chunk_meta;

/*
 * Attaches the store called `name` (a POSIX shm name such as "/cascade-1000"); NULL means the
 * caller's default store "/cascade-<uid>". The store must exist (create it with
 * `cascade init`). Returns a handle to release with cascade_detach, or NULL with errno:
 * ENOENT (no such store), EINVAL (not a Cascade store, or a different format version or
 * layout: the block is left untouched), EACCES (another user's store), ENOMEM.
 */
cascade_store *cascade_attach(const char *name);

/*
 * Detaches and frees the handle; the store and its files stay. Pointers obtained through
 * this handle (data region, chunk addresses, spill path) become invalid. NULL is ignored.
 * Never fails.
 */
void cascade_detach(cascade_store *store);

/*
 * The paper's get_data_region: stores the address and size in bytes of the store's
 * shared-memory data region, as mapped in this process, in *addr and *len. The region
 * stays mapped until cascade_detach. Returns 0, or -1 with errno EINVAL (NULL argument).
 */
int cascade_get_data_region(cascade_store *store, void **addr, size_t *len);

/*
 * The paper's get_chunk_meta_list: describes the chunks holding the data of file `path`,
 * in order of their logical index. Holes (never-written ranges, which read as zeros) have
 * no chunk. Writes up to `capacity` entries to `out` and the number of chunks to *count.
 * `out` may be NULL when `capacity` is 0 (a size query).
 *
 * Returns 0 on success. If `capacity` is smaller than the number of chunks it returns -1
 * with errno ERANGE, writes nothing to `out` and sets *count to the number needed: call
 * again with a larger array. Other failures: -1 with errno ENOENT, ENOTDIR, EISDIR,
 * EINVAL (NULL argument), ENAMETOOLONG.
 *
 * The list is a snapshot: the addresses and offsets stay right as long as nobody
 * truncates, unlinks or writes the file (which may free or move its chunks), so take it
 * from a closed, complete file (a finished checkpoint). Read spilled chunks from the spill
 * file with pread(2) at spill_offset.
 */
int cascade_get_chunk_meta_list(cascade_store *store, const char *path, cascade_chunk_meta *out,
                                size_t capacity, size_t *count);

/*
 * The path of the store's spill file on the host file system. The string belongs to the
 * handle and is valid until cascade_detach. Returns NULL with errno ENOENT if the store
 * has no spill file, or EINVAL for a NULL handle.
 */
const char *cascade_spill_path(cascade_store *store);

/*
 * Creates file `path` (mode 0644) or truncates it if it exists, and writes `len` bytes of
 * `buf` to it from offset 0; the data is visible to every attached process when the call
 * returns. The parent directory must exist. `buf` may be NULL when `len` is 0.
 * Returns 0, or -1 with errno: ENOENT (parent missing), ENOTDIR, EISDIR, ENOSPC (store full:
 * the file then holds what fitted; see `cascade status` for why), EFBIG, ENAMETOOLONG,
 * EINVAL.
 */
int cascade_write_file(cascade_store *store, const char *path, const void *buf, size_t len);

/*
 * Reads up to `len` bytes of file `path` from `offset` into `buf` (holes read as zeros).
 * Returns the number of bytes read, less than `len` only at end of file and 0 at or past
 * it, or -1 with errno ENOENT, EISDIR, ENOTDIR, EINVAL. `buf` may be NULL when `len` is 0.
 */
ssize_t cascade_read_file(cascade_store *store, const char *path, void *buf, size_t len,
                          uint64_t offset);

/*
 * Creates directory `path` with permission bits `mode`; its parent must exist.
 * Returns 0, or -1 with errno EEXIST, ENOENT, ENOTDIR, ENOSPC (file table full), EINVAL.
 */
int cascade_mkdir(cascade_store *store, const char *path, uint32_t mode);

/*
 * Removes file `path` and frees its chunks at once.
 * Returns 0, or -1 with errno ENOENT, EISDIR, ENOTDIR, EINVAL.
 */
int cascade_unlink(cascade_store *store, const char *path);

/*
 * Commits the checkpoint at PATH (a directory or a single file, given as an application path
 * under the mount prefix, e.g. "/cascade/ckpt.0042", or relative to the current directory):
 * from now on it is a checkpoint that the node agent drains to the durable store and that
 * retention counts. Call it after every file of the checkpoint is closed.
 *
 * Unlike the functions above it takes no handle: it uses the store of the process (the one
 * the interposition serves the mount from: $CASCADE_STORE, else "/cascade-<uid>") and the
 * mount prefix ($CASCADE_MOUNT, else "/cascade"). It works under `cascade run` and in a
 * program linked with -lcascade. Relative paths resolve against the current directory,
 * including a working directory inside the mount (chdir("/cascade/run1")).
 *
 * Returns 0, or -1 with errno set: EBUSY a file below is still open for writing, EIO a file
 * below was left incomplete by a process that died, ENOENT no such path (or the process's
 * store does not exist), EINVAL the mount root or a path outside the mount, or a checkpoint
 * nested in another (a committed checkpoint inside PATH, or PATH inside one).
 * cascade_strerror_last() gives the one-line reason.
 */
int cascade_commit(const char *path);

/*
 * A one-line description of the last failure of a cascade_* call on the calling thread,
 * e.g. "cascade_attach: /cascade-1000: No such file or directory", or "" if none failed yet.
 * The string belongs to the library and is valid until the next failing cascade_* call on
 * the same thread. Thread-safe; never fails.
 */
const char *cascade_strerror_last(void);

#ifdef __cplusplus
}
#endif

#endif /* CASCADE_H */
