//! O_DIRECT arenas (docs/staging-arenas.md, "Arenas" and "Direct and buffered arenas"), with
//! real servers on 127.0.0.1 and a real directory as the durable store; the arenas on the
//! disk under /var/tmp (not tmpfs), where the server writes them with O_DIRECT.
//!
//! 1. files of awkward sizes (1 byte, a block less one, a block, a block and one, several
//!    MiB crossing the 4 MiB extent limit, split over Write frames at unaligned offsets,
//!    several segments in one frame so that some data is not aligned in the receive buffer)
//!    are acknowledged, every arena file is whole blocks, and they drain bit for bit;
//! 2. a server process killed with SIGKILL after a Sync (its drain blocked by a broken
//!    durable store) recovers every acknowledged file from its padded arenas and, restarted
//!    with a good store, drains them bit for bit.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cascade_staging::client::OutSegment;
use cascade_staging::Connection;
use cascade_testkit::random;
use common::{assert_drained, digest, disk_dir, poll_status, InProcessServer, ServerProcess};

const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "job1";
/// Environment of a server process started by [`ServerProcess::start`].
const BLOCK: u64 = cascade_staging::engine::BLOCK as u64;

/// Whether `dir` is on tmpfs (there the server falls back to buffered arenas).
fn on_tmpfs(dir: &Path) -> bool {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: an all-zero statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` a valid, writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statfs {}", dir.display());
    st.f_type == libc::TMPFS_MAGIC
}

/// The files of the tests: (key, bytes).
fn files() -> Vec<(String, Vec<u8>)> {
    [1usize, 4095, 4096, 4097, (3 << 20) + 123, (9 << 20) + 5]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("ckpt/f{i}.dat"), random(n, 100 + i as u64)))
        .collect()
}

/// Sends `files`: the four small ones in one Write frame (their data back to back, so only
/// the first is aligned in the server's receive buffer), each larger one in Write frames of
/// 1 MiB + 4321 bytes (unaligned offsets), then Sync.
fn send(c: &mut Connection, files: &[(String, Vec<u8>)]) {
    let small: Vec<_> = files.iter().filter(|(_, d)| d.len() <= 8192).collect();
    let seals: Vec<_> = small
        .iter()
        .map(|(k, d)| c.seal(k, 1, d.len() as u64, digest(d)))
        .collect();
    let datas: Vec<[&[u8]; 1]> = small.iter().map(|(_, d)| [d.as_slice()]).collect();
    let segs: Vec<OutSegment> = small
        .iter()
        .zip(seals)
        .zip(&datas)
        .map(|(((k, d), seal), data)| OutSegment {
            key: k,
            stamp: 1,
            size: d.len() as u64,
            offset: 0,
            seal: Some(seal),
            data,
        })
        .collect();
    c.write(&segs).expect("write the small files");
    for (k, d) in files.iter().filter(|(_, d)| d.len() > 8192) {
        let piece = (1 << 20) + 4321;
        common::write_pieces(c, k, d, piece, 0..d.len().div_ceil(piece), digest(d));
    }
    c.sync().expect("sync");
}

/// The arena files in `dir` and their lengths.
fn arenas(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .expect("list the arena directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("arena-") && n.ends_with(".log"))
        })
        .map(|p| {
            let len = std::fs::metadata(&p).expect("stat an arena").len();
            (p, len)
        })
        .collect();
    v.sort();
    v
}

/// Every arena file is whole blocks (direct mode) and together they hold at least the
/// files' bytes padded extent by extent.
fn assert_padded(dir: &Path, files: &[(String, Vec<u8>)]) {
    let a = arenas(dir);
    assert!(!a.is_empty(), "no arena in {}", dir.display());
    for (p, len) in &a {
        assert_eq!(len % BLOCK, 0, "{} is {len} bytes", p.display());
    }
    let total: u64 = a.iter().map(|(_, l)| l).sum();
    let least: u64 = files
        .iter()
        .map(|(_, d)| (d.len() as u64).div_ceil(BLOCK) * BLOCK)
        .sum();
    assert!(
        total >= least,
        "arenas hold {total} bytes, padded files {least}"
    );
}

#[test]
fn padded_o_direct_extents_are_acknowledged_and_drain_bit_for_bit() {
    let arena_dir = disk_dir();
    let direct = !on_tmpfs(arena_dir.path());
    let dir = arena_dir.path().join("arenas");
    let d2 = dir.clone();
    let srv = InProcessServer::bind(2, move |o, _| o.dir = d2);
    let files = files();
    let mut c = srv.client(NS, DEADLINE);
    send(&mut c, &files);
    if direct {
        assert_padded(&dir, &files);
    }
    // Read back from the arenas while they are there (the server may have drained and
    // reclaimed a file already: then Read finds nothing, and the drain check below covers
    // it).
    for (k, d) in &files {
        let mut out = Vec::new();
        if c.read(k, 0, d.len() as u32, &mut out)
            .expect("read")
            .is_some()
        {
            assert!(out == *d, "{k}: read back other bytes");
        }
    }
    let n = files.len() as u64;
    poll_status(
        "drained",
        DEADLINE,
        || {
            let mut q = srv.client(NS, DEADLINE);
            let s = q.status().expect("status");
            q.goodbye();
            s
        },
        |s| s.drained_files >= n,
    );
    assert_drained(NS, &srv.durable, &files);
    c.goodbye();
    srv.stop();
}

/// The server processes of [`ServerProcess::start`] (common::serve_in_child).
#[test]
fn child_server_process() {
    common::serve_in_child(|_| {}, |server| eprintln!("arenas: {}", server.arena_io()));
}

#[test]
fn a_server_killed_with_sigkill_recovers_its_padded_extents() {
    let arena_dir = disk_dir();
    let direct = !on_tmpfs(arena_dir.path());
    let dir = arena_dir.path().join("arenas");
    let durable_dir = tempfile::tempdir().expect("temporary directory");
    let durable = durable_dir.path().to_path_buf();
    // The drain cannot create <durable>/<namespace>/...: a file is in the way.
    std::fs::write(durable.join(NS), b"in the way\n").expect("block the durable store");
    let files = files();
    let mut server = ServerProcess::start(&dir, &durable, DEADLINE);
    assert!(
        server
            .daemon
            .log()
            .contains(if direct { "O_DIRECT" } else { "buffered" }),
        "the server's log does not say how it writes arenas: {}",
        server.daemon.log()
    );
    {
        let mut c = server.connect(NS, DEADLINE);
        send(&mut c, &files);
        // An unacknowledged, unsealed file after the Sync: dropped at recovery.
        c.write(&[OutSegment {
            key: "ckpt/partial.dat",
            stamp: 1,
            size: 10_000,
            offset: 0,
            seal: None,
            data: &[&random(5000, 9)],
        }])
        .expect("write a partial file");
    }
    assert_eq!(server.status(NS, DEADLINE).drained_files, 0);
    if direct {
        assert_padded(&dir, &files);
    }
    let status = server.daemon.kill9();
    assert!(!status.success(), "{status}");

    std::fs::remove_file(durable.join(NS)).expect("unblock the durable store");
    server = ServerProcess::start(&dir, &durable, DEADLINE);
    let n = files.len() as u64;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = server.status(NS, DEADLINE);
        if s.drained_files >= n {
            break;
        }
        assert!(Instant::now() < deadline, "not drained in time: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_drained(NS, &durable, &files);
    assert!(!durable.join(NS).join("ckpt/partial.dat").exists());
    server.daemon.kill9();
}
