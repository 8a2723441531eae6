//! drain and restore: move a checkpoint between the node store and the durable tier through
//! the agent's data path (crate cascade-agent).

use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cascade_agent::DedupOptions;
use cascade_config::{format_rate, format_size, Config};
use cascade_dedup::repo::{Repo, DEFAULT_PREFIX};
use cascade_dedup::{Chunking, Compression};
use cascade_durable::{DurableKey, DurableStore};
use indicatif::{ProgressBar, ProgressStyle};

use crate::admin::attach;
use crate::failure::Failure;

fn agent_failure(err: cascade_agent::Error) -> Failure {
    Failure::new(err.to_string())
}

fn open_durable(url: &str) -> Result<DurableStore, Failure> {
    DurableStore::open(url).map_err(|e| Failure::new(e.to_string()))
}

/// Opens a durable store to read from: a directory must exist (opening one creates it, which
/// is right for writers and wrong for a mistyped restore).
pub fn open_durable_for_reading(url: &str) -> Result<DurableStore, Failure> {
    let spec = cascade_durable::Spec::parse(url).map_err(|e| Failure::new(e.to_string()))?;
    if let cascade_durable::Spec::Dir(dir) = &spec {
        if !dir.is_dir() {
            return Err(Failure::new(format!(
                "durable store {}: no such directory",
                spec.describe()
            )));
        }
    }
    open_durable(url)
}

/// A byte progress bar on stderr when a person is watching.
fn progress_bar(total: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(total).with_style(style)
}

fn summary(verb: &str, from: &str, to: &str, report: &cascade_agent::Report) -> String {
    format!(
        "{verb} {from} -> {to}: {} files, {} bytes ({}) in {:.3} s, {}",
        report.files.len(),
        report.bytes,
        format_size(report.bytes),
        report.seconds,
        format_rate(report.bytes, report.seconds)
    )
}

/// The summary line (not with -q) and, with -v, a line per file: path, size and BLAKE3.
fn print_report(verb: &str, from: &str, to: &str, report: &cascade_agent::Report) {
    crate::format::summary_line(&summary(verb, from, to, report));
    for f in &report.files {
        crate::format::detail_line(&format!(
            "  {} {} bytes blake3 {}",
            f.path, f.size, f.blake3
        ));
    }
}

/// Bytes of the checkpoint at `path` in the store (for the progress bar's length).
fn store_bytes(store: &cascade_store::Store, path: &str) -> u64 {
    let Ok(meta) = store.stat(path) else { return 0 };
    if !meta.is_dir() {
        return meta.size;
    }
    let mut total = 0;
    for entry in store.read_dir(path).unwrap_or_default() {
        total += store_bytes(
            store,
            &format!("{}/{}", path.trim_end_matches('/'), entry.name),
        );
    }
    total
}

/// The configured dedup settings (`dedup.chunking`, `dedup.compress`, `dedup.delta`); None
/// when dedup is off.
pub fn dedup_options(config: &Config) -> Result<Option<DedupOptions>, Failure> {
    let chunking = config.text("dedup.chunking");
    if chunking == "off" {
        return Ok(None);
    }
    let bad = |e: String| Failure::new(e);
    let chunking = chunking
        .parse::<Chunking>()
        .map_err(|e| bad(e.to_string()))?;
    let spec = config.text("dedup.compress");
    let compression = match spec {
        "off" => Compression::None,
        "auto" => Compression::Zstd {
            level: cascade_dedup::adaptive::AUTO_MIN_LEVEL,
        },
        spec => spec
            .parse::<Compression>()
            .map_err(|e| bad(e.to_string()))?,
    };
    Ok(Some(DedupOptions {
        chunking,
        compression,
        delta: config.text("dedup.delta") == "on",
        adaptive: spec == "auto",
        session_lease: Duration::from_millis(config.number("dedup.session_lease")),
    }))
}

/// The dedup repository in `durable`, opened for writing with the configured chunking and
/// compression; None when dedup is off.
fn repo_for_writing(config: &Config, durable: &Arc<DurableStore>) -> Result<Option<Repo>, Failure> {
    let Some(d) = dedup_options(config)? else {
        return Ok(None);
    };
    Repo::open_with_lease(
        durable.clone(),
        DEFAULT_PREFIX,
        d.chunking,
        d.compression,
        d.session_lease,
    )
    .map(Some)
    .map_err(|e| Failure::new(format!("{}: dedup repository: {e}", durable.name())))
}

/// The dedup repository in `durable` if there is one (restore reads it when a checkpoint has
/// no plain marker).
fn repo_for_reading(durable: &Arc<DurableStore>) -> Result<Option<Repo>, Failure> {
    Repo::open_existing(durable.clone(), DEFAULT_PREFIX)
        .map_err(|e| Failure::new(format!("{}: dedup repository: {e}", durable.name())))
}

/// A drain's or restore's report as one JSON document (docs/cli-json.md).
fn report_json(
    verb: &str,
    from: &str,
    to: &str,
    report: &cascade_agent::Report,
    dedup: Option<serde_json::Value>,
) -> String {
    let files: Vec<serde_json::Value> = report
        .files
        .iter()
        .map(|f| serde_json::json!({"path": f.path, "size": f.size, "blake3": f.blake3}))
        .collect();
    serde_json::json!({
        "operation": verb,
        "from": from,
        "to": to,
        "checkpoint": report.checkpoint,
        "files": files,
        "bytes": report.bytes,
        "seconds": report.seconds,
        "dedup": dedup,
    })
    .to_string()
}

pub fn drain(config: &Config, path: &str, url: &str, as_json: bool) -> Result<ExitCode, Failure> {
    crate::umask::restrict(config)?;
    let store = attach(config)?;
    let ckpt = cascade_agent::checkpoint_name(path).map_err(agent_failure)?;
    store.stat(path).map_err(|err| Failure::store(path, &err))?;
    let durable = Arc::new(open_durable(url)?);
    if let Some(repo) = repo_for_writing(config, &durable)? {
        let bar = progress_bar(store_bytes(&store, path));
        let delta = dedup_options(config)?.is_some_and(|d| d.delta);
        let drained = cascade_agent::drain_checkpoint_dedup(&store, path, &repo, delta, &|n| {
            bar.set_position(n)
        });
        let (report, stats, against) = match drained {
            Ok(done) => done,
            Err(err) => {
                bar.abandon();
                return Err(agent_failure(err));
            }
        };
        bar.finish_and_clear();
        let stored = stats.stored_data_bytes + stats.stored_tree_bytes;
        if as_json {
            let dedup = serde_json::json!({
                "chunking": repo.chunking().to_string(),
                "compression": repo.compression().to_string(),
                "chunks": stats.chunks,
                "new_chunks": stats.new_chunks,
                "new_bytes": stats.new_bytes,
                "delta_chunks": stats.delta_chunks,
                "delta_base": against,
                "stored_bytes": stored,
            });
            let to = durable.name().trim_end_matches('/');
            println!("{}", report_json("drain", path, to, &report, Some(dedup)));
            return Ok(ExitCode::SUCCESS);
        }
        let to = format!(
            "{} (dedup repository, {}, {})",
            durable.name().trim_end_matches('/'),
            repo.chunking(),
            repo.compression()
        );
        print_report("drain", path, &to, &report);
        let against = against.map_or(String::new(), |base| {
            format!(", {} as deltas against {base}", stats.delta_chunks)
        });
        crate::format::summary_line(&format!(
            "  {} of {} chunks new ({}){against}, {} stored",
            stats.new_chunks,
            stats.chunks,
            format_size(stats.new_bytes),
            format_size(stored)
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let bar = progress_bar(store_bytes(&store, path));
    let report = cascade_agent::drain_checkpoint(&store, path, &durable, &|n| bar.set_position(n));
    let report = match report {
        Ok(report) => report,
        Err(err) => {
            bar.abandon();
            return Err(agent_failure(err));
        }
    };
    bar.finish_and_clear();
    let to = format!("{}/{ckpt}", durable.name().trim_end_matches('/'));
    if as_json {
        println!("{}", report_json("drain", path, &to, &report, None));
    } else {
        print_report("drain", path, &to, &report);
    }
    Ok(ExitCode::SUCCESS)
}

/// The checkpoint's size from its marker (or its dedup manifest), for the progress bar.
fn marker_bytes(durable: &DurableStore, repo: Option<&Repo>, ckpt: &str) -> Result<u64, Failure> {
    match durable.read_marker(ckpt) {
        Ok(Some(marker)) => Ok(marker.total_bytes),
        // restore_* report a missing checkpoint with the full message.
        Ok(None) => Ok(repo
            .and_then(|r| {
                r.read_manifest(&DurableKey::from_store_path(ckpt))
                    .ok()
                    .flatten()
            })
            .map_or(0, |m| m.files.iter().map(|f| f.size).sum())),
        Err(e) => Err(Failure::new(e.to_string())),
    }
}

fn last_component(ckpt: &str) -> &str {
    ckpt.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(ckpt)
}

/// `cascade restore CKPT [DEST]` into a local directory; with `partial`, a checkpoint of
/// several nodes that is not complete gives the files of the nodes whose parts are in, and
/// the restore fails (exit 1) naming the missing nodes.
pub fn restore_local(
    ckpt: &str,
    dest: Option<&str>,
    url: &str,
    partial: bool,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    let durable = Arc::new(open_durable_for_reading(url)?);
    let repo = repo_for_reading(&durable)?;
    let dest = PathBuf::from(dest.unwrap_or_else(|| last_component(ckpt)));
    let bar = progress_bar(marker_bytes(&durable, repo.as_ref(), ckpt)?);
    let set = |n| bar.set_position(n);
    if !partial {
        let report = cascade_agent::restore_checkpoint(&durable, repo.as_ref(), ckpt, &dest, &set);
        return finish_restore(report, bar, ckpt, &dest.display().to_string(), as_json);
    }
    let restored =
        cascade_agent::restore_partial_checkpoint(&durable, repo.as_ref(), ckpt, &dest, &set);
    let (report, missing) = match restored {
        Ok((report, missing)) => (Ok(report), missing),
        Err(e) => (Err(e), None),
    };
    let code = finish_restore(report, bar, ckpt, &dest.display().to_string(), as_json)?;
    match missing {
        Some(parts) => Err(Failure::new(format!(
            "{ckpt} is not complete: restored the files of {}",
            parts.describe()
        ))),
        None => Ok(code),
    }
}

pub fn restore_into_store(
    config: &Config,
    ckpt: &str,
    dest: Option<&str>,
    url: &str,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let durable = Arc::new(open_durable_for_reading(url)?);
    let repo = repo_for_reading(&durable)?;
    let default_dest = format!("/{}", ckpt.trim_matches('/'));
    let dest = dest.unwrap_or(&default_dest);
    let bar = progress_bar(marker_bytes(&durable, repo.as_ref(), ckpt)?);
    let report =
        cascade_agent::restore_into_store(&durable, repo.as_ref(), ckpt, &store, dest, &|n| {
            bar.set_position(n)
        });
    finish_restore(report, bar, ckpt, dest, as_json)
}

fn finish_restore(
    report: cascade_agent::Result<cascade_agent::Report>,
    bar: ProgressBar,
    ckpt: &str,
    dest: &str,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    match report {
        Ok(report) => {
            bar.finish_and_clear();
            if as_json {
                println!("{}", report_json("restore", ckpt, dest, &report, None));
            } else {
                print_report("restore", ckpt, dest, &report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            bar.abandon();
            Err(agent_failure(err))
        }
    }
}
