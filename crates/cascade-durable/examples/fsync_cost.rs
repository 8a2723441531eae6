//! What the fsyncs of a directory store cost: the time to upload a checkpoint of `files`
//! files of `mib` MiB each (version, data and checksum object per file, then the marker),
//! through the store (every write fsynced) and, for comparison, the same writes through
//! object_store's `LocalFileSystem` alone (no fsync), alternately `rounds` times.
//!
//! `cargo run --release -p cascade-durable --example fsync_cost -- DIR [files] [mib] [rounds]`

use std::time::Instant;

use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};

use cascade_durable::{DurableStore, UploadItem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(
        args.next()
            .ok_or("usage: fsync_cost DIR [files] [mib] [rounds]")?,
    );
    let files: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let mib: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let data: Vec<Vec<u8>> = (0..files)
        .map(|i| (0..mib << 20).map(|j| (j * 31 + i * 7) as u8).collect())
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    println!(
        "{files} files of {mib} MiB, {rounds} rounds, in {}",
        dir.display()
    );
    for round in 0..rounds {
        let synced_dir = dir.join(format!("synced-{round}"));
        let store = DurableStore::open(synced_dir.to_str().ok_or("not UTF-8")?)?;
        let t = Instant::now();
        let items = data
            .iter()
            .enumerate()
            .map(|(i, d)| UploadItem::from_bytes(format!("rank{i}.dat"), d))
            .collect();
        store.upload_checkpoint("ckpt.0001", items)?;
        let synced = t.elapsed().as_secs_f64();

        let plain_dir = dir.join(format!("plain-{round}"));
        std::fs::create_dir_all(&plain_dir)?;
        let local = LocalFileSystem::new_with_prefix(&plain_dir)?;
        let t = Instant::now();
        rt.block_on(async {
            let put = |key: String, bytes: Vec<u8>| {
                let local = &local;
                async move {
                    local
                        .put(&StorePath::parse(key)?, PutPayload::from(bytes))
                        .await
                        .map(drop)
                        .map_err(Box::<dyn std::error::Error>::from)
                }
            };
            let mut listed = String::new();
            for (i, d) in data.iter().enumerate() {
                put(
                    format!("ckpt.0001/.rank{i}.dat.cascade-version"),
                    b"1\n".to_vec(),
                )
                .await?;
                let sum = blake3::hash(d).to_hex().to_string();
                put(format!("ckpt.0001/rank{i}.dat"), d.clone()).await?;
                put(
                    format!("ckpt.0001/rank{i}.dat.blake3"),
                    format!("{sum}  rank{i}.dat\n").into_bytes(),
                )
                .await?;
                listed.push_str(&sum);
            }
            put(
                "ckpt.0001/.cascade-complete".to_string(),
                listed.into_bytes(),
            )
            .await
        })?;
        let plain = t.elapsed().as_secs_f64();
        let total = (files * mib) as f64;
        println!(
            "round {round}: fsynced {synced:.3} s ({:.0} MiB/s), without fsync {plain:.3} s \
             ({:.0} MiB/s): {:.3} ms more per file",
            total / synced,
            total / plain,
            (synced - plain) * 1e3 / files as f64
        );
        std::fs::remove_dir_all(&synced_dir)?;
        std::fs::remove_dir_all(&plain_dir)?;
    }
    Ok(())
}
