//! The libc (and liburing/libaio) functions through which a dynamically linked program can
//! touch files, for `cascade check-binary`: a program that imports one of these that
//! libcascade does not intercept may reach the real file system (or the backing memfd)
//! where it meant a Cascade file.
//!
//! Each entry is (symbol, note). The note says what the function does and, where it is not
//! obvious, why wrapping its neighbours is not enough (glibc functions that call `open` or
//! `read` internally do so without going through the PLT, so a wrapper of `open` does not
//! see them). Fortified (`__*_chk`) and 64-bit (`*64`) forms are separate symbols and are
//! listed separately. Functions that only use the standard streams (`printf`, `puts`) are
//! not listed.

const OPEN: &str = "opens a file by path";
const TEMP: &str = "creates a temporary file (glibc opens it internally, not through open)";
const TEMP_NAME: &str = "makes a temporary file name (glibc checks the directory internally)";
const CLOSE: &str = "closes descriptors";
const DATA: &str = "reads or writes file data";
const FORTIFY: &str = "fortified (_FORTIFY_SOURCE) form of a read function";
const SIZE: &str = "file size, allocation or access-pattern advice";
const SYNC: &str = "flushes file data or metadata";
const FD: &str = "descriptor operation";
const LOCK: &str = "file lock";
const STAT: &str = "file metadata";
const STATFS: &str = "file-system capacity";
const LIMITS: &str = "file-system limit by path (glibc runs statfs internally)";
const ACCESS: &str = "permission check by path";
const NAMES: &str = "creates, removes or renames a name";
const LINKS: &str = "hard or symbolic link";
const NODES: &str = "creates a device node or FIFO";
const ATTRS: &str = "changes permissions, owner or times";
const PATHS: &str = "resolves a path";
const DIRS: &str = "reads a directory";
const WALK: &str = "walks or matches a directory tree (glibc opens directories internally)";
const CWD: &str = "working directory";
const MMAP: &str = "memory mapping";
const COPY: &str = "copies between descriptors inside the kernel";
const XATTR: &str = "extended attributes";
const AIO: &str = "POSIX asynchronous I/O (glibc's helper threads read and write internally)";
const LIBAIO: &str = "Linux native AIO (libaio: system calls, not libc)";
const URING: &str = "io_uring (liburing: system calls, not libc)";
const STDIO_OPEN: &str = "opens or re-opens a stdio stream";
const STDIO: &str = "stdio stream operation";
const STDIO_FORTIFY: &str = "fortified (_FORTIFY_SOURCE) form of a stdio function";
const STDIO_QUERY: &str = "stdio stream state query (glibc extension, gnulib uses it)";
const WIDE: &str = "wide-character stdio stream operation";
const NOTIFY: &str = "file change notification";
const HANDLE: &str = "file handle by path";
const EXEC: &str = "starts a program (carries the working directory inside the mount)";
const EXEC_VIA: &str =
    "starts a program (glibc calls execve internally, so the execve wrapper does not see it)";
const SPAWN: &str = "runs a command through /bin/sh (glibc spawns it internally)";
const SPAWN_FILE: &str =
    "spawn file action: the child opens the path or changes to it inside glibc";
const LOAD: &str = "loads a shared object by path (the dynamic linker opens it, not open)";
const EXIT: &str = "ends the process without exit handlers (libcascade's end-of-process work \
does not run)";
const SYSCALL: &str =
    "raw system call: bypasses every libc wrapper (Rust's std makes statx this way)";
const IDS: &str = "changes the effective ids new files are owned by (libcascade keeps them)";

/// Every file-I/O function `cascade check-binary` looks for in a program's imports, with a
/// short note for its report, grouped by family.
pub const FILE_IO_FUNCTIONS: &[(&str, &str)] = &[
    // Opening and closing.
    ("open", OPEN),
    ("open64", OPEN),
    ("openat", OPEN),
    ("openat64", OPEN),
    ("creat", OPEN),
    ("creat64", OPEN),
    ("__open_2", OPEN),
    ("__open64_2", OPEN),
    ("__openat_2", OPEN),
    ("__openat64_2", OPEN),
    ("mkstemp", TEMP),
    ("mkstemp64", TEMP),
    ("mkostemp", TEMP),
    ("mkostemp64", TEMP),
    ("mkstemps", TEMP),
    ("mkstemps64", TEMP),
    ("mkostemps", TEMP),
    ("mkostemps64", TEMP),
    ("mkdtemp", TEMP),
    ("tmpfile", TEMP),
    ("tmpfile64", TEMP),
    ("tempnam", TEMP_NAME),
    ("tmpnam", TEMP_NAME),
    ("close", CLOSE),
    ("close_range", CLOSE),
    ("closefrom", CLOSE),
    // Data.
    ("read", DATA),
    ("write", DATA),
    ("pread", DATA),
    ("pread64", DATA),
    ("pwrite", DATA),
    ("pwrite64", DATA),
    ("readv", DATA),
    ("writev", DATA),
    ("preadv", DATA),
    ("preadv64", DATA),
    ("pwritev", DATA),
    ("pwritev64", DATA),
    ("preadv2", DATA),
    ("preadv64v2", DATA),
    ("pwritev2", DATA),
    ("pwritev64v2", DATA),
    ("__read_chk", FORTIFY),
    ("__pread_chk", FORTIFY),
    ("__pread64_chk", FORTIFY),
    // Offsets, sizes, allocation, sync.
    ("lseek", SIZE),
    ("lseek64", SIZE),
    ("ftruncate", SIZE),
    ("ftruncate64", SIZE),
    ("truncate", SIZE),
    ("truncate64", SIZE),
    ("fallocate", SIZE),
    ("fallocate64", SIZE),
    ("posix_fallocate", SIZE),
    ("posix_fallocate64", SIZE),
    ("posix_fadvise", SIZE),
    ("posix_fadvise64", SIZE),
    ("readahead", SIZE),
    ("fsync", SYNC),
    ("fdatasync", SYNC),
    ("sync_file_range", SYNC),
    ("syncfs", SYNC),
    // Descriptors and locks.
    ("dup", FD),
    ("dup2", FD),
    ("dup3", FD),
    ("fcntl", FD),
    ("fcntl64", FD),
    ("ioctl", FD),
    ("flock", LOCK),
    ("lockf", LOCK),
    ("lockf64", LOCK),
    // Metadata.
    ("stat", STAT),
    ("stat64", STAT),
    ("lstat", STAT),
    ("lstat64", STAT),
    ("fstat", STAT),
    ("fstat64", STAT),
    ("fstatat", STAT),
    ("fstatat64", STAT),
    ("newfstatat", STAT),
    ("statx", STAT),
    ("__xstat", STAT),
    ("__xstat64", STAT),
    ("__lxstat", STAT),
    ("__lxstat64", STAT),
    ("__fxstat", STAT),
    ("__fxstat64", STAT),
    ("__fxstatat", STAT),
    ("__fxstatat64", STAT),
    ("statfs", STATFS),
    ("statfs64", STATFS),
    ("fstatfs", STATFS),
    ("fstatfs64", STATFS),
    ("statvfs", STATFS),
    ("statvfs64", STATFS),
    ("fstatvfs", STATFS),
    ("fstatvfs64", STATFS),
    ("pathconf", LIMITS),
    ("access", ACCESS),
    ("faccessat", ACCESS),
    ("faccessat2", ACCESS),
    ("eaccess", ACCESS),
    ("euidaccess", ACCESS),
    // The namespace.
    ("unlink", NAMES),
    ("unlinkat", NAMES),
    ("remove", NAMES),
    ("rename", NAMES),
    ("renameat", NAMES),
    ("renameat2", NAMES),
    ("mkdir", NAMES),
    ("mkdirat", NAMES),
    ("rmdir", NAMES),
    ("link", LINKS),
    ("linkat", LINKS),
    ("symlink", LINKS),
    ("symlinkat", LINKS),
    // Starting programs.
    ("execve", EXEC),
    ("execvpe", EXEC),
    ("fexecve", EXEC),
    ("posix_spawn", EXEC),
    ("posix_spawnp", EXEC),
    ("execveat", EXEC),
    ("execv", EXEC_VIA),
    ("execvp", EXEC_VIA),
    ("execl", EXEC_VIA),
    ("execlp", EXEC_VIA),
    ("execle", EXEC_VIA),
    ("posix_spawn_file_actions_addopen", SPAWN_FILE),
    ("posix_spawn_file_actions_addchdir_np", SPAWN_FILE),
    ("posix_spawn_file_actions_destroy", SPAWN_FILE),
    ("system", SPAWN),
    ("popen", SPAWN),
    // Loading code and ending the process.
    ("dlopen", LOAD),
    ("dlmopen", LOAD),
    ("_exit", EXIT),
    ("_Exit", EXIT),
    // Links, nodes, attributes, paths.
    ("readlink", LINKS),
    ("readlinkat", LINKS),
    ("__readlink_chk", LINKS),
    ("__readlinkat_chk", LINKS),
    ("mknod", NODES),
    ("mknodat", NODES),
    ("__xmknod", NODES),
    ("__xmknodat", NODES),
    ("mkfifo", NODES),
    ("mkfifoat", NODES),
    ("chmod", ATTRS),
    ("umask", ATTRS),
    ("setuid", IDS),
    ("seteuid", IDS),
    ("setreuid", IDS),
    ("setresuid", IDS),
    ("setgid", IDS),
    ("setegid", IDS),
    ("setregid", IDS),
    ("setresgid", IDS),
    ("fchmod", ATTRS),
    ("fchmodat", ATTRS),
    ("lchmod", ATTRS),
    ("chown", ATTRS),
    ("fchown", ATTRS),
    ("lchown", ATTRS),
    ("fchownat", ATTRS),
    ("utime", ATTRS),
    ("utimes", ATTRS),
    ("lutimes", ATTRS),
    ("futimes", ATTRS),
    ("futimesat", ATTRS),
    ("utimensat", ATTRS),
    ("futimens", ATTRS),
    ("realpath", PATHS),
    ("__realpath_chk", PATHS),
    ("canonicalize_file_name", PATHS),
    ("name_to_handle_at", HANDLE),
    ("open_by_handle_at", HANDLE),
    // Directories.
    ("opendir", DIRS),
    ("fdopendir", DIRS),
    ("readdir", DIRS),
    ("readdir64", DIRS),
    ("readdir_r", DIRS),
    ("readdir64_r", DIRS),
    ("rewinddir", DIRS),
    ("seekdir", DIRS),
    ("telldir", DIRS),
    ("closedir", DIRS),
    ("dirfd", DIRS),
    ("getdents64", DIRS),
    ("getdirentries", DIRS),
    ("getdirentries64", DIRS),
    ("scandir", WALK),
    ("scandir64", WALK),
    ("scandirat", WALK),
    ("scandirat64", WALK),
    ("ftw", WALK),
    ("ftw64", WALK),
    ("nftw", WALK),
    ("nftw64", WALK),
    ("fts_open", WALK),
    ("fts64_open", WALK),
    ("fts_read", WALK),
    ("fts64_read", WALK),
    ("fts_children", WALK),
    ("fts64_children", WALK),
    ("fts_set", WALK),
    ("fts64_set", WALK),
    ("fts_close", WALK),
    ("fts64_close", WALK),
    ("glob", WALK),
    ("glob64", WALK),
    ("globfree", WALK),
    ("globfree64", WALK),
    ("chdir", CWD),
    ("fchdir", CWD),
    ("getcwd", CWD),
    ("__getcwd_chk", CWD),
    ("get_current_dir_name", CWD),
    ("getwd", CWD),
    // Mappings and in-kernel copies.
    ("mmap", MMAP),
    ("mmap64", MMAP),
    ("munmap", MMAP),
    ("mremap", MMAP),
    ("msync", MMAP),
    ("sendfile", COPY),
    ("sendfile64", COPY),
    ("copy_file_range", COPY),
    ("splice", COPY),
    ("tee", COPY),
    ("vmsplice", COPY),
    // Extended attributes.
    ("getxattr", XATTR),
    ("lgetxattr", XATTR),
    ("fgetxattr", XATTR),
    ("setxattr", XATTR),
    ("lsetxattr", XATTR),
    ("fsetxattr", XATTR),
    ("listxattr", XATTR),
    ("llistxattr", XATTR),
    ("flistxattr", XATTR),
    ("removexattr", XATTR),
    ("lremovexattr", XATTR),
    ("fremovexattr", XATTR),
    // Asynchronous I/O.
    ("aio_read", AIO),
    ("aio_read64", AIO),
    ("aio_write", AIO),
    ("aio_write64", AIO),
    ("aio_fsync", AIO),
    ("aio_fsync64", AIO),
    ("aio_error", AIO),
    ("aio_error64", AIO),
    ("aio_return", AIO),
    ("aio_return64", AIO),
    ("aio_suspend", AIO),
    ("aio_suspend64", AIO),
    ("aio_cancel", AIO),
    ("aio_cancel64", AIO),
    ("lio_listio", AIO),
    ("lio_listio64", AIO),
    ("io_setup", LIBAIO),
    ("io_submit", LIBAIO),
    ("io_getevents", LIBAIO),
    ("io_cancel", LIBAIO),
    ("io_destroy", LIBAIO),
    ("io_uring_setup", URING),
    ("io_uring_enter", URING),
    ("io_uring_register", URING),
    ("io_uring_queue_init", URING),
    ("io_uring_queue_init_params", URING),
    ("io_uring_queue_init_mem", URING),
    ("io_uring_submit", URING),
    ("io_uring_submit_and_wait", URING),
    ("io_uring_get_sqe", URING),
    ("io_uring_wait_cqe", URING),
    ("io_uring_register_files", URING),
    ("io_uring_register_buffers", URING),
    ("inotify_add_watch", NOTIFY),
    ("fanotify_mark", NOTIFY),
    ("syscall", SYSCALL),
    // stdio: opening and the descriptor under a stream.
    ("fopen", STDIO_OPEN),
    ("fopen64", STDIO_OPEN),
    ("fdopen", STDIO_OPEN),
    ("freopen", STDIO_OPEN),
    ("freopen64", STDIO_OPEN),
    ("fileno", STDIO),
    ("fileno_unlocked", STDIO),
    ("fclose", STDIO),
    ("fcloseall", STDIO),
    // stdio: data.
    ("fread", STDIO),
    ("fread_unlocked", STDIO),
    ("fwrite", STDIO),
    ("fwrite_unlocked", STDIO),
    ("fgets", STDIO),
    ("fgets_unlocked", STDIO),
    ("fputs", STDIO),
    ("fputs_unlocked", STDIO),
    ("fgetc", STDIO),
    ("fgetc_unlocked", STDIO),
    ("fputc", STDIO),
    ("fputc_unlocked", STDIO),
    ("getc", STDIO),
    ("getc_unlocked", STDIO),
    ("_IO_getc", STDIO),
    ("putc", STDIO),
    ("putc_unlocked", STDIO),
    ("_IO_putc", STDIO),
    ("ungetc", STDIO),
    ("getline", STDIO),
    ("getdelim", STDIO),
    ("__getdelim", STDIO),
    ("fprintf", STDIO),
    ("vfprintf", STDIO),
    ("fscanf", STDIO),
    ("vfscanf", STDIO),
    ("__isoc99_fscanf", STDIO),
    ("__isoc99_vfscanf", STDIO),
    ("__isoc23_fscanf", STDIO),
    ("__isoc23_vfscanf", STDIO),
    ("__uflow", STDIO),
    ("__overflow", STDIO),
    ("__fprintf_chk", STDIO_FORTIFY),
    ("__vfprintf_chk", STDIO_FORTIFY),
    ("__fread_chk", STDIO_FORTIFY),
    ("__fread_unlocked_chk", STDIO_FORTIFY),
    ("__fgets_chk", STDIO_FORTIFY),
    ("__fgets_unlocked_chk", STDIO_FORTIFY),
    ("fgetwc", WIDE),
    ("fputwc", WIDE),
    ("fgetws", WIDE),
    ("fputws", WIDE),
    ("fwprintf", WIDE),
    ("vfwprintf", WIDE),
    // stdio: position, buffering, state.
    ("fseek", STDIO),
    ("fseeko", STDIO),
    ("fseeko64", STDIO),
    ("ftell", STDIO),
    ("ftello", STDIO),
    ("ftello64", STDIO),
    ("fgetpos", STDIO),
    ("fgetpos64", STDIO),
    ("fsetpos", STDIO),
    ("fsetpos64", STDIO),
    ("rewind", STDIO),
    ("fflush", STDIO),
    ("fflush_unlocked", STDIO),
    ("setvbuf", STDIO),
    ("setbuf", STDIO),
    ("setbuffer", STDIO),
    ("setlinebuf", STDIO),
    ("feof", STDIO),
    ("feof_unlocked", STDIO),
    ("ferror", STDIO),
    ("ferror_unlocked", STDIO),
    ("clearerr", STDIO),
    ("clearerr_unlocked", STDIO),
    ("__fpending", STDIO_QUERY),
    ("__freading", STDIO_QUERY),
    ("__fwriting", STDIO_QUERY),
    ("__freadable", STDIO_QUERY),
    ("__fwritable", STDIO_QUERY),
    ("__fbufsize", STDIO_QUERY),
    ("__flbf", STDIO_QUERY),
    ("__fpurge", STDIO_QUERY),
    ("fpurge", STDIO_QUERY),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercepted::Intercepted;

    fn note(name: &str) -> Option<&'static str> {
        FILE_IO_FUNCTIONS
            .iter()
            .find(|(function, _)| *function == name)
            .map(|(_, note)| *note)
    }

    #[test]
    fn names_are_unique_and_cover_the_intercepted_list() {
        let mut names: Vec<&str> = FILE_IO_FUNCTIONS.iter().map(|(n, _)| *n).collect();
        let count = names.len();
        assert!(count >= 150, "only {count} names");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "duplicate names in FILE_IO_FUNCTIONS");

        // Whatever libcascade intercepts is file I/O; a name missing here would never be
        // reported as intercepted (nor as missing), which hides mistakes in either list.
        let list = Intercepted::load().expect("intercepted.txt parses");
        for name in list.wrapped.iter().chain(&list.through_glibc) {
            assert!(note(name).is_some(), "{name} is not in FILE_IO_FUNCTIONS");
        }
        assert_eq!(note("getxattr"), Some(XATTR));
        assert_eq!(note("malloc"), None);
    }
}
