//! Baselines the suites measure in the same run: memcpy, tmpfs, local disk and the direct
//! write to the durable store, and the C checkpoint writer run under `cascade run`.

use crate::net::WireWatch;
use crate::procs::{one_line, Node};
use crate::util::{self, now_ns, Context, Res};
use cascade_durable::{DurableStore, UploadItem};
use serde::Deserialize;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;

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

/// The checkpoint writers run under `cascade run` (bench/ckptwriter.c, compiled with cc at
/// the start of the run): one file and its commit, or N ranks with a common start.
pub(crate) const WRITER_C: &str = include_str!("../ckptwriter.c");

/// `cascade run -- ckptwriter FILE SIZE PIECE DATAFILE MODE CASCADE /NAME` on `node` (FILE
/// under the mount prefix `mount`: NAME/data.bin), committed with `mode` (cli or lib).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_ckptwriter(
    node: &Node,
    writer: &Path,
    mount: &str,
    name: &str,
    size: u64,
    piece: u64,
    datafile: &Path,
    mode: &str,
) -> Res<WriterOut> {
    let file = format!("{mount}/{name}/data.bin");
    let mut cmd = node.cmd();
    cmd.args(["run", "--"]).arg(writer).arg(&file);
    cmd.args([size.to_string(), piece.to_string()])
        .arg(datafile)
        .arg(mode);
    let out = cmd
        .arg(&node.bin)
        .arg(format!("/{name}"))
        .stdin(Stdio::null())
        .output();
    let out = out.ctx(|| "running cascade run -- ckptwriter")?;
    if !out.status.success() {
        return util::err(format!(
            "cascade run -- ckptwriter {file} failed ({}): {}",
            out.status,
            one_line(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    line.and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| util::BenchError(format!("ckptwriter printed no timing line: {stdout:?}")))
}

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
