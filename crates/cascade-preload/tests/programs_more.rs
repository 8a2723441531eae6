//! More real programs, run under `cascade run` (so through the interposition library), each
//! on a store of its own: rsync, h5py, a gfortran program, fio with verification and an Open MPI job with its
//! restart. The programs come from Debian packages that scripts/test.sh installs (rsync,
//! python3-h5py, gfortran, fio, openmpi-bin, libopenmpi-dev); a missing one fails the test
//! with a message saying so rather than skipping it.
//!
//! Where it can, each test checks what the program wrote through the store's own API, and
//! shows that the program's own verification is live by corrupting a byte in the store and
//! watching the check fail.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use cascade_testkit::pattern;
use common::env::Env;

/// Fails the test when a program the test needs is not installed.
fn require(prog: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    assert!(
        found || Path::new(prog).is_file(),
        "{prog} is not installed: install the Debian package {package} (scripts/test.sh does)"
    );
}

/// Compiles `source` with `compiler` (cc, mpicc, gfortran...) into the scratch dir.
fn compile(env: &Env, compiler: &str, name: &str, source: &str) -> String {
    let src = env.tmp.join(name);
    std::fs::write(&src, source).unwrap();
    let exe = env.tmp.join(format!("{name}.bin"));
    let out = Command::new(compiler)
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe.to_str().unwrap().to_string()
}

// ---- rsync ----------------------------------------------------------------------------------

#[test]
fn rsync_tree_into_the_mount_and_back_out() {
    require("rsync", "rsync");
    let env = Env::new();
    let t = &env.tmp;
    std::fs::create_dir_all(t.join("tree/ckpt/rank.0/deep")).unwrap();
    std::fs::create_dir_all(t.join("tree/emptydir")).unwrap();
    let data = pattern(3_000_000, 11);
    std::fs::write(t.join("tree/ckpt/rank.0/data"), &data).unwrap();
    std::fs::write(t.join("tree/ckpt/rank.0/deep/small"), pattern(77, 12)).unwrap();
    std::fs::write(t.join("tree/meta"), pattern(100_000, 13)).unwrap();
    std::fs::write(t.join("tree/empty"), b"").unwrap();
    // Modes and times rsync -a must carry (no symlinks: the store has none).
    env.ok("chmod 600 $T/tree/meta && chmod 700 $T/tree/ckpt && touch -d '2001-02-03 04:05:06' $T/tree/ckpt/rank.0/data");

    // Host -> Cascade.
    env.ok("rsync -a $T/tree $M/");
    assert_eq!(env.read_store("/tree/ckpt/rank.0/data"), data);
    assert_eq!(
        env.read_store("/tree/ckpt/rank.0/deep/small"),
        pattern(77, 12)
    );
    assert!(env.read_store("/tree/empty").is_empty());
    assert!(env.store().read_dir("/tree/emptydir").unwrap().is_empty());
    assert_eq!(env.store().stat("/tree/meta").unwrap().mode & 0o7777, 0o600);
    assert_eq!(env.store().stat("/tree/ckpt").unwrap().mode & 0o7777, 0o700);
    let mtime = env.store().stat("/tree/ckpt/rank.0/data").unwrap().mtime;
    let want = std::fs::metadata(t.join("tree/ckpt/rank.0/data"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    assert_eq!(mtime / 1_000_000_000, want.as_secs() as i64, "mtime kept");
    // A second run finds nothing to do: sizes, times and modes in the store all match.
    assert_eq!(env.ok("rsync -a -i $T/tree $M/"), "");
    // One file changed (same size, new time): rsync sends that one alone.
    std::fs::write(t.join("tree/meta"), pattern(100_000, 14)).unwrap();
    env.ok("touch -d '2002-03-04 05:06:07' $T/tree/meta");
    let changed = env.ok("rsync -a -i $T/tree $M/");
    assert_eq!(
        changed.lines().collect::<Vec<_>>(),
        [">f..t...... tree/meta"],
        "{changed}"
    );
    assert_eq!(env.read_store("/tree/meta"), pattern(100_000, 14));

    // Cascade -> host: the same tree, with the same modes and times.
    env.ok("rsync -a $M/tree $T/back/ && diff -r $T/tree $T/back/tree");
    let listing = "find tree -exec stat -c '%n %F %a %s %Y' {} + | sort";
    let orig = env.ok(&format!("cd $T && {listing}"));
    let back = env.ok(&format!("cd $T/back && {listing}"));
    assert_eq!(orig.lines().count(), 9, "{orig}");
    assert_eq!(orig, back);
}

// ---- h5py -------------------------------------------------------------------------------------

const H5PY_SCRIPT: &str = r#"
import os, sys, h5py, numpy as np
p = os.environ["M"] + "/h5/ckpt.h5"
rng = np.random.default_rng(7)
field = rng.standard_normal((300, 200, 10))
index = np.arange(1_000_000, dtype=np.int64).reshape(1000, 1000)
if sys.argv[1] == "write":
    with h5py.File(p, "w") as f:
        f.create_dataset("state/field", data=field, chunks=(50, 50, 10),
                         compression="gzip", compression_opts=4, shuffle=True)
        f.create_dataset("state/index", data=index, chunks=(100, 1000), compression="lzf")
        g = f.create_dataset("grow", shape=(0, 64), maxshape=(None, 64), chunks=(16, 64), dtype="f4")
        for i in range(10):
            g.resize((i + 1) * 16, axis=0)
            g[i * 16:(i + 1) * 16] = i
        f.attrs["step"] = 42
    # Read back in the same process, then update in place.
    with h5py.File(p, "r") as f:
        assert np.array_equal(f["state/field"][...], field)
    with h5py.File(p, "r+") as f:
        f["state/field"][0, 0, :] = -1.0
    print("written")
else:
    field[0, 0, :] = -1.0
    with h5py.File(p, "r") as f:
        assert f.attrs["step"] == 42
        d = f["state/field"]
        assert d.chunks == (50, 50, 10) and d.compression == "gzip", (d.chunks, d.compression)
        assert np.array_equal(d[...], field), "field differs"
        assert np.array_equal(d[17:233, 5:7, 3], field[17:233, 5:7, 3]), "hyperslab differs"
        i = f["state/index"]
        assert i.compression == "lzf" and np.array_equal(i[...], index), "index differs"
        assert i.id.get_storage_size() < index.nbytes // 2, "index not compressed"
        g = f["grow"]
        assert g.shape == (160, 64), g.shape
        assert all((g[k * 16:(k + 1) * 16] == k).all() for k in range(10)), "grow differs"
    print("verified")
"#;

#[test]
fn h5py_chunked_compressed_dataset_written_and_read_back() {
    require("/usr/bin/python3", "python3");
    let env = Env::new();
    let check = env.command(
        "/usr/bin/python3",
        &["-c", "import h5py, numpy; print(h5py.__version__)"],
    );
    assert!(
        check.status.success(),
        "h5py is not installed for /usr/bin/python3: install the Debian package python3-h5py \
         (scripts/test.sh does):\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    env.mkdir_store("/h5");
    let script = env.tmp.join("ckpt_h5.py");
    std::fs::write(&script, H5PY_SCRIPT).unwrap();
    let script = script.to_str().unwrap();
    assert_eq!(
        env.run("/usr/bin/python3", &[script, "write"]).trim(),
        "written"
    );
    // A fresh process (the restart) reads it back.
    assert_eq!(
        env.run("/usr/bin/python3", &[script, "read"]).trim(),
        "verified"
    );
    let bytes = env.read_store("/h5/ckpt.h5");
    assert_eq!(
        &bytes[..8],
        b"\x89HDF\r\n\x1a\n",
        "an HDF5 file in the store"
    );
    // A corrupted chunk (the last of "grow": uncompressed, 16 x 64 times 9.0f32) is noticed.
    let needle = 9.0f32.to_le_bytes().repeat(16 * 64);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("the last chunk of 'grow' is in the file");
    env.corrupt_store("/h5/ckpt.h5", at as u64 + 100, &[0xff; 4]);
    let out = env.command("/usr/bin/python3", &[script, "read"]);
    assert!(!out.status.success(), "corruption went unnoticed");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("grow differs"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- gfortran ---------------------------------------------------------------------------------

const FORTRAN_SOURCE: &str = r#"
! ckpt write: writes both files, then verifies them; ckpt read: verifies them (the restart).
program ckpt
  implicit none
  character(len=512) :: m, seqf, dirf
  character(len=8) :: mode
  integer, parameter :: n = 100000, nrec = 64, rl = 256
  real(8), allocatable :: a(:), b(:)
  integer :: i, j, ios, u, k, reclen
  integer :: ivec(rl), jvec(rl)
  character(len=16) :: tag

  call get_command_argument(1, mode)
  call get_environment_variable("M", m)
  seqf = trim(m) // "/fortran/seq.dat"
  dirf = trim(m) // "/fortran/direct.dat"
  allocate(a(n), b(n))
  do i = 1, n
    a(i) = i * 0.25d0
  end do
  inquire(iolength=reclen) ivec

  if (mode == "write") then
    ! Unformatted sequential: a header, then five records of different lengths.
    open(newunit=u, file=seqf, form="unformatted", access="sequential", status="replace", iostat=ios)
    if (ios /= 0) stop 1
    write(u) "header-record-v1", n
    do k = 1, 5
      write(u) k, a(1:n/k)
    end do
    close(u)
    ! Unformatted direct access: fixed-length records, written last to first.
    open(newunit=u, file=dirf, form="unformatted", access="direct", recl=reclen, status="replace", iostat=ios)
    if (ios /= 0) stop 11
    do i = nrec, 1, -1
      ivec = [(i * 1000 + j, j = 1, rl)]
      write(u, rec=i) ivec
    end do
    close(u)
    ! Reopen and rewrite one record in place; it and its neighbour read back right.
    open(newunit=u, file=dirf, form="unformatted", access="direct", recl=reclen, status="old", iostat=ios)
    if (ios /= 0) stop 12
    ivec = -7
    write(u, rec=10) ivec
    read(u, rec=10) jvec
    if (any(jvec /= -7)) stop 14
    read(u, rec=11) jvec
    if (jvec(1) /= 11001) stop 15
    close(u)
  end if

  open(newunit=u, file=seqf, form="unformatted", access="sequential", status="old", iostat=ios)
  if (ios /= 0) stop 2
  read(u) tag, j
  if (tag /= "header-record-v1" .or. j /= n) stop 3
  do k = 1, 5
    b = 0
    read(u) j, b(1:n/k)
    if (j /= k) stop 4
    if (any(b(1:n/k) /= a(1:n/k))) stop 5
  end do
  read(u, iostat=ios) j
  if (.not. is_iostat_end(ios)) stop 6
  ! Backspace over the end of file and the last record, rewind to the header.
  backspace(u)
  backspace(u)
  read(u) j
  if (j /= 5) stop 7
  rewind(u)
  read(u) tag
  if (tag /= "header-record-v1") stop 8
  close(u)

  open(newunit=u, file=dirf, form="unformatted", access="direct", recl=reclen, status="old", &
       action="read", iostat=ios)
  if (ios /= 0) stop 21
  do i = nrec, 1, -1
    read(u, rec=i) jvec
    if (i == 10) then
      if (any(jvec /= -7)) stop 22
    else
      if (any(jvec /= [(i * 1000 + j, j = 1, rl)])) stop 23
    end if
  end do
  read(u, rec=nrec + 1, iostat=ios) jvec
  if (ios == 0) stop 24
  close(u)
  inquire(file=dirf, size=k)
  if (k /= nrec * rl * 4) stop 25
  print "(a,i0)", "ok ", k
end program ckpt
"#;

fn le_i32(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn gfortran_unformatted_sequential_and_direct_access() {
    require("gfortran", "gfortran");
    let env = Env::new();
    let exe = compile(&env, "gfortran", "ckpt.f90", FORTRAN_SOURCE);
    env.mkdir_store("/fortran");
    assert_eq!(env.run(&exe, &["write"]).trim(), "ok 65536");

    // The sequential file as gfortran lays it out: each record between 4-byte length markers.
    let seq = env.read_store("/fortran/seq.dat");
    let mut at = 0;
    let mut lens = Vec::new();
    while at < seq.len() {
        let len = le_i32(&seq, at) as usize;
        assert_eq!(le_i32(&seq, at + 4 + len) as usize, len, "closing marker");
        lens.push(len);
        at += len + 8;
    }
    let n = 100_000;
    let want: Vec<usize> = std::iter::once(16 + 4)
        .chain((1..=5).map(|k| 4 + 8 * (n / k)))
        .collect();
    assert_eq!(lens, want);
    assert_eq!(&seq[4..20], b"header-record-v1");
    // Record k = 3 (the fourth) holds k, then a(i) = i / 4.
    let r3 = lens[..3].iter().map(|l| l + 8).sum::<usize>() + 4;
    assert_eq!(le_i32(&seq, r3), 3);
    let a1000 = f64::from_le_bytes(seq[r3 + 4 + 999 * 8..r3 + 4 + 1000 * 8].try_into().unwrap());
    assert_eq!(a1000, 250.0);

    // The direct-access file: record i (1-based) at (i - 1) * 1024 holds i * 1000 + j.
    let direct = env.read_store("/fortran/direct.dat");
    assert_eq!(direct.len(), 64 * 1024);
    assert_eq!(le_i32(&direct, 0), 1001);
    assert_eq!(le_i32(&direct, 63 * 1024 + 255 * 4), 64256);
    assert_eq!(le_i32(&direct, 9 * 1024 + 17 * 4), -7);

    // A restarted run reads and verifies both files.
    assert_eq!(env.run(&exe, &["read"]).trim(), "ok 65536");
    // Its checks are live: a corrupted direct-access record (record 13) stops it with 23.
    env.corrupt_store("/fortran/direct.dat", 12 * 1024 + 8, &[0xff; 4]);
    let out = env.command(&exe, &["read"]);
    assert_eq!(
        out.status.code(),
        Some(23),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- fio ----------------------------------------------------------------------------------------

#[test]
fn fio_psync_with_crc32c_verify() {
    require("fio", "fio");
    let env = Env::new();
    env.mkdir_store("/fio");
    // 64 MiB per job: 4 KiB random writes and 1 MiB sequential writes, each block carrying a
    // crc32c header that fio checks on the read-back pass.
    let job = format!(
        "[global]\n\
         ioengine=psync\n\
         directory={}/fio\n\
         size=64m\n\
         verify=crc32c\n\
         verify_fatal=1\n\
         verify_dump=0\n\
         \n\
         [small]\n\
         rw=randwrite\n\
         bs=4k\n\
         \n\
         [large]\n\
         rw=write\n\
         bs=1m\n",
        env.mount
    );
    std::fs::write(env.tmp.join("job.fio"), job).unwrap();
    let out = env.command(
        "fio",
        &["--output-format=json", "--output=fio.json", "job.fio"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fio failed ({}):\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("verify"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.tmp.join("fio.json")).unwrap())
            .expect("fio's JSON report");
    let jobs = report["jobs"].as_array().expect("jobs");
    let mut names: Vec<&str> = jobs
        .iter()
        .map(|j| j["jobname"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["large", "small"]);
    for j in jobs {
        assert_eq!(j["error"], 0, "{j}");
        assert_eq!(j["write"]["io_bytes"], 64 << 20, "all written: {j}");
        assert_eq!(
            j["read"]["io_bytes"],
            64 << 20,
            "all read back and verified: {j}"
        );
    }
    for f in ["/fio/small.0.0", "/fio/large.0.0"] {
        assert_eq!(env.store().stat(f).unwrap().size, 64 << 20, "{f}");
    }

    // A second fio process verifies what the first wrote.
    let out = env.command("fio", &["--verify_only", "--output=verify.txt", "job.fio"]);
    assert!(
        out.status.success(),
        "verify_only failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // And it notices a corrupted block.
    env.corrupt_store("/fio/small.0.0", 123_456, b"XXXX");
    let out = env.command("fio", &["--verify_only", "--output=verify2.txt", "job.fio"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "corruption went unnoticed");
    assert!(
        stderr.contains("verify failed at file") && stderr.contains("small.0.0 offset 122880"),
        "{stderr}"
    );
}

// ---- Open MPI -----------------------------------------------------------------------------------

const MPI_SOURCE: &str = r#"
/* mpickpt write: every rank writes its own checkpoint file (stdio);
   mpickpt read: a restarted job, of any size, shares out and verifies all of them (POSIX). */
#include <mpi.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define N (1 << 20) /* doubles per rank: 8 MiB */
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); MPI_Abort(MPI_COMM_WORLD, 3); } while (0)
static double value(int rank, long i) { return rank * 1e7 + i * 0.5; }
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/mpi/ckpt.1", getenv("M"));
    double *buf = malloc(N * sizeof(double));
    int hdr[2];
    if (argc > 1 && strcmp(argv[1], "write") == 0) {
        if (rank == 0 && mkdir(dir, 0755) != 0) FAIL("mkdir %s: %s\n", dir, strerror(errno));
        MPI_Barrier(MPI_COMM_WORLD);
        for (long i = 0; i < N; i++) buf[i] = value(rank, i);
        snprintf(path, sizeof path, "%s/rank%04d.ckpt", dir, rank);
        FILE *f = fopen(path, "wb");
        if (!f) FAIL("fopen %s: %s\n", path, strerror(errno));
        hdr[0] = rank;
        hdr[1] = size;
        if (fwrite(hdr, sizeof hdr, 1, f) != 1 || fwrite(buf, sizeof(double), N, f) != N || fclose(f) != 0)
            FAIL("write %s: %s\n", path, strerror(errno));
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) printf("wrote %d\n", size);
    } else {
        snprintf(path, sizeof path, "%s/rank0000.ckpt", dir);
        int fd = open(path, O_RDONLY);
        if (fd < 0 || read(fd, hdr, sizeof hdr) != sizeof hdr) FAIL("read %s: %s\n", path, strerror(errno));
        close(fd);
        int nfiles = hdr[1], checked = 0;
        for (int r = rank; r < nfiles; r += size) {
            snprintf(path, sizeof path, "%s/rank%04d.ckpt", dir, r);
            struct stat st;
            if (stat(path, &st) != 0) FAIL("stat %s: %s\n", path, strerror(errno));
            if (st.st_size != (off_t)(sizeof hdr + N * sizeof(double))) FAIL("%s: size %ld\n", path, (long)st.st_size);
            fd = open(path, O_RDONLY);
            if (fd < 0) FAIL("open %s: %s\n", path, strerror(errno));
            if (read(fd, hdr, sizeof hdr) != sizeof hdr || hdr[0] != r || hdr[1] != nfiles) FAIL("%s: header\n", path);
            size_t want = N * sizeof(double), got = 0;
            while (got < want) {
                ssize_t n = read(fd, (char *)buf + got, want - got);
                if (n <= 0) FAIL("read %s: %zd %s\n", path, n, strerror(errno));
                got += n;
            }
            char extra;
            if (read(fd, &extra, 1) != 0) FAIL("%s: longer than written\n", path);
            close(fd);
            for (long i = 0; i < N; i++)
                if (buf[i] != value(r, i)) FAIL("%s: element %ld is %g\n", path, i, buf[i]);
            checked++;
        }
        int total = 0;
        MPI_Reduce(&checked, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("restarted on %d ranks, verified %d files\n", size, total);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
"#;

fn mpirun(env: &Env, np: &str, exe: &str, mode: &str) -> Output {
    env.command(
        "mpirun",
        &[
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            np,
            "-x",
            "LD_PRELOAD",
            "-x",
            "CASCADE_STORE",
            "-x",
            "CASCADE_MOUNT",
            "-x",
            "M",
            exe,
            mode,
        ],
    )
}

fn stdout_of(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn mpi_ranks_write_checkpoints_and_a_restarted_job_reads_them() {
    require("mpicc", "libopenmpi-dev");
    require("mpirun", "openmpi-bin");
    let env = Env::new();
    let exe = compile(&env, "mpicc", "mpickpt.c", MPI_SOURCE);
    env.mkdir_store("/mpi");

    let out = mpirun(&env, "4", &exe, "write");
    assert_eq!(stdout_of(&out, "mpirun -np 4 write").trim(), "wrote 4");
    let mut files: Vec<String> = env
        .store()
        .read_dir("/mpi/ckpt.1")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "rank0000.ckpt",
            "rank0001.ckpt",
            "rank0002.ckpt",
            "rank0003.ckpt"
        ]
    );
    // Rank 2's file, read through the store: header, then value(2, i) = 2e7 + i / 2.
    let f = env.read_store("/mpi/ckpt.1/rank0002.ckpt");
    assert_eq!(f.len(), 8 + (8 << 20));
    assert_eq!((le_i32(&f, 0), le_i32(&f, 4)), (2, 4));
    let at = 8 + 8 * 12345;
    assert_eq!(
        f64::from_le_bytes(f[at..at + 8].try_into().unwrap()),
        2e7 + 12345.0 * 0.5
    );

    // The restart, on a different number of ranks.
    let out = mpirun(&env, "2", &exe, "read");
    assert_eq!(
        stdout_of(&out, "mpirun -np 2 read").trim(),
        "restarted on 2 ranks, verified 4 files"
    );
    // The restart's checks are live.
    env.corrupt_store("/mpi/ckpt.1/rank0003.ckpt", 8 + 8 * 777, &[0xff; 8]);
    let out = mpirun(&env, "2", &exe, "read");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "corruption went unnoticed");
    assert!(stderr.contains("rank0003.ckpt: element 777 is"), "{stderr}");
}
