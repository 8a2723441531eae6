//! Commands about the store as a whole: init, status, fsck, destroy, config.

use std::process::ExitCode;
use std::time::Instant;

use cascade_config::{format_rate, format_size, Config, JobIdentity, Source, Value};
use cascade_store::{Prefault, Status, Store};
use serde_json::json;

use crate::failure::{Failure, EXIT_FAILURE};
use crate::format::{percent, time};

/// Attaches to the configured store, with a hint when there is none.
pub fn attach(config: &Config) -> Result<Store, Failure> {
    let name = config.store_name();
    Store::attach(name).map_err(|err| {
        if err.errno() == libc::ENOENT {
            Failure::new(format!(
                "no store named {name} (create it with 'cascade init', or choose one with --store)"
            ))
        } else {
            Failure::store(&format!("store {name}"), &err)
        }
    })
}

pub fn init(config: &Config) -> Result<ExitCode, Failure> {
    let params = config.store_config()?;
    let started = Instant::now();
    let store = Store::create(&params).map_err(|err| {
        if err.errno() == libc::EEXIST {
            Failure::new(format!(
                "store {} already exists (remove it first with 'cascade destroy')",
                params.name
            ))
        } else {
            Failure::store(&format!("store {}", params.name), &err)
        }
    })?;
    let usable_after = started.elapsed().as_secs_f64();
    // A background prefault runs in this process, which is about to exit; wait for it so
    // the whole block is faulted in and report how early the store was usable.
    if params.prefault == Prefault::Background {
        store.wait_prefault();
    }
    let prefaulted_after = started.elapsed().as_secs_f64();
    let status = store.status();

    println!("created store {}", status.name);
    println!(
        "  memory     {} in {} chunks of {} (shared-memory block {})",
        format_size(status.memory_capacity),
        chunks(status.memory_capacity, status.chunk_size),
        format_size(status.chunk_size),
        format_size(status.block_bytes)
    );
    match &status.spill_path {
        Some(path) if status.spill_capacity > 0 => println!(
            "  spill      {} in {} chunks at {}",
            format_size(status.spill_capacity),
            chunks(status.spill_capacity, status.chunk_size),
            path.display()
        ),
        _ => println!("  spill      off"),
    }
    println!("  max files  {} (files plus directories)", status.max_files);
    let memory = status.memory_capacity;
    match params.prefault {
        Prefault::Foreground => println!(
            "  created    in {usable_after:.3} s, including prefault of {} ({})",
            format_size(memory),
            format_rate(memory, usable_after)
        ),
        Prefault::Background => println!(
            "  created    usable after {usable_after:.3} s; background prefault of {} done after {prefaulted_after:.3} s ({})",
            format_size(memory),
            format_rate(memory, prefaulted_after)
        ),
        Prefault::Off => println!(
            "  created    in {usable_after:.3} s; no prefault (pages fault in on first write)"
        ),
    }
    // Only a prefaulted block says how /dev/shm hands out its pages.
    if params.prefault != Prefault::Off {
        match store.huge_page_bytes() {
            Some(0) => println!(
                "  huge pages none: /dev/shm gives 4 KiB pages, so a process's first writes run at about a third of memory speed; `mount -o remount,huge=advise /dev/shm` enables them (docs/operations.md)"
            ),
            Some(bytes) => println!(
                "  huge pages {} of the block in 2 MiB pages: a process's first writes run at memory speed",
                format_size(bytes)
            ),
            None => {}
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn chunks(bytes: u64, chunk_size: u64) -> u64 {
    bytes.checked_div(chunk_size).unwrap_or(0)
}

pub fn status(config: &Config, as_json: bool) -> Result<ExitCode, Failure> {
    let cascade_lifecycle::StatusReport {
        status,
        others,
        agent,
    } = cascade_lifecycle::status_report(&attach(config)?);
    if as_json {
        println!(
            "{}",
            cascade_lifecycle::status_json(&status, &others, agent.as_ref())
        );
    } else {
        print_status(&status, &others);
        let dedup_line = agent
            .as_ref()
            .filter(|a| !a.dedup_compression.is_empty())
            .map(|a| {
                format!(
                    "dedup        {} checkpoints, {} of file data, {} stored; compression {}",
                    a.dedup_checkpoints,
                    format_size(a.dedup_bytes),
                    format_size(a.dedup_stored_bytes),
                    a.dedup_compression
                )
            });
        match agent {
            Some(a) => println!(
                "agent        pid {} -> {}{}: {}uploaded {} files ({}), {} checkpoints complete, {} evicted, {} fetched, {} pending ({}), {} failures{}",
                a.pid,
                if a.staging.is_empty() {
                    String::new()
                } else {
                    format!("{} -> ", a.staging)
                },
                a.durable,
                if a.staging.is_empty() {
                    String::new()
                } else if a.staged_given_up > 0 {
                    format!(
                        "staged {} files ({}), {} sent again from the node (their server did not answer), ",
                        a.staged_files,
                        format_size(a.staged_bytes),
                        a.staged_given_up
                    )
                } else {
                    format!("staged {} files ({}), ", a.staged_files, format_size(a.staged_bytes))
                },
                a.uploaded_files,
                format_size(a.uploaded_bytes),
                a.markers,
                a.evicted_checkpoints,
                a.fetched_files,
                a.pending_files,
                format_size(a.pending_bytes),
                a.failures,
                a.last_error
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default()
            ),
            None => println!("agent        none running"),
        }
        if let Some(line) = dedup_line {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(s: &Status, others: &[u32]) {
    println!("store        {} (created {})", s.name, time(s.created));
    println!(
        "memory       {} used of {} ({}%), chunks of {}",
        format_size(s.memory_used),
        format_size(s.memory_capacity),
        percent(s.memory_used, s.memory_capacity),
        format_size(s.chunk_size)
    );
    match &s.spill_path {
        Some(path) if s.spill_capacity > 0 => println!(
            "spilled      {} used of {} ({}%) in {}",
            format_size(s.spill_used),
            format_size(s.spill_capacity),
            percent(s.spill_used, s.spill_capacity),
            path.display()
        ),
        _ => println!("spilled      spill off"),
    }
    println!(
        "leased       {} (free chunks reserved by attached processes)",
        format_size(s.leased_bytes)
    );
    println!(
        "files        {} files, {} dirs ({} of {} entries)",
        s.files,
        s.dirs,
        s.files + s.dirs,
        s.max_files
    );
    let pids: Vec<String> = others.iter().map(u32::to_string).collect();
    if pids.is_empty() {
        println!("attached     no other processes");
    } else {
        println!("attached     {} processes: {}", pids.len(), pids.join(" "));
    }
    if s.prefaulted_bytes >= s.memory_capacity {
        println!("prefault     done ({})", format_size(s.memory_capacity));
    } else {
        println!(
            "prefault     {} of {} ({}%)",
            format_size(s.prefaulted_bytes),
            format_size(s.memory_capacity),
            percent(s.prefaulted_bytes, s.memory_capacity)
        );
    }
    match &s.last_enospc {
        Some(e) => println!(
            "last ENOSPC  {} (pid {}, {})",
            e.reason,
            e.pid,
            time(e.time)
        ),
        None => println!("last ENOSPC  none"),
    }
}

pub fn fsck(config: &Config, repair: bool, as_json: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let report = store
        .fsck(repair)
        .map_err(|err| Failure::store(&format!("store {}", store.name()), &err))?;
    let code = if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILURE)
    };
    if as_json {
        let texts = |v: &[String]| v.to_vec();
        println!(
            "{}",
            json!({
                "store": store.name(),
                "clean": report.is_clean(),
                "files": report.files,
                "dirs": report.dirs,
                "chunks_used": report.chunks_used,
                "chunks_free": report.chunks_free,
                "chunks_leased": report.chunks_leased,
                "errors": texts(&report.errors),
                "warnings": texts(&report.warnings),
                "repaired": texts(&report.repaired),
            })
        );
        return Ok(code);
    }
    for error in &report.errors {
        println!("error: {error}");
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
    for fixed in &report.repaired {
        println!("repaired: {fixed}");
    }
    println!(
        "{}: {} files, {} dirs; chunks {} used, {} free, {} leased; {} errors, {} warnings{}",
        store.name(),
        report.files,
        report.dirs,
        report.chunks_used,
        report.chunks_free,
        report.chunks_leased,
        report.errors.len(),
        report.warnings.len(),
        if repair {
            format!(", {} repaired", report.repaired.len())
        } else {
            String::new()
        }
    );
    if report.is_clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(EXIT_FAILURE))
    }
}

pub fn destroy(config: &Config, force: bool) -> Result<ExitCode, Failure> {
    let name = config.store_name();
    let destroyed = if force {
        Store::destroy_forced(name)
    } else {
        Store::destroy(name)
    };
    destroyed.map_err(|err| match err.errno() {
        libc::ENOENT => Failure::new(format!("no store named {name}")),
        libc::EBUSY => Failure::new(format!(
            "{err} (use 'cascade destroy --force' to destroy it anyway)"
        )),
        _ => Failure::store(&format!("store {name}"), &err),
    })?;
    println!("destroyed store {name}");
    Ok(ExitCode::SUCCESS)
}

pub fn show_config(config: &Config, as_json: bool) -> Result<ExitCode, Failure> {
    if as_json {
        let settings: Vec<serde_json::Value> = config
            .entries()
            .iter()
            .map(|e| {
                let value = match &e.value {
                    Value::Text(text) => json!(cascade_config::redacted(text)),
                    Value::Secret(_) => json!(e.value.to_string()),
                    Value::Bytes(n) | Value::Count(n) => json!(n),
                    Value::Millis(ms) => json!(*ms as f64 / 1000.0),
                };
                let from = match &e.source {
                    Source::Flag(_) => "flag",
                    Source::Env(_) => "env",
                    Source::File(_) => "file",
                    Source::Default(_) => "default",
                };
                json!({
                    "key": e.def.key,
                    "env": e.def.env,
                    "value": value,
                    "from": from,
                    "source": e.source.to_string(),
                })
            })
            .collect();
        let document = json!({
            "config_files": config.files().read.iter().map(|(path, chosen_by)| json!({"path": path, "chosen_by": chosen_by})).collect::<Vec<_>>(),
            "settings": settings,
            "job": config.job().map(|job| job_json(&job)),
            "namespace": sourced_json(json!(config.namespace()), namespace_source(config)),
        });
        println!("{document}");
    } else {
        println!("config files: {}", config.files());
        let entries = config.entries();
        let key_width = entries.iter().map(|e| e.def.key.len()).max().unwrap_or(0);
        let value_width = entries
            .iter()
            .map(|e| e.value.to_string().len())
            .max()
            .unwrap_or(0);
        for e in entries {
            println!(
                "{:<key_width$}  {:<value_width$}  {}",
                e.def.key,
                e.value.to_string(),
                e.source
            );
        }
        match config.job() {
            Some(job) => println!(
                "job: {} (name {}), node {} of {} nodes",
                job.id.value, job.name.value, job.node.value, job.nodes.value
            ),
            None => println!("job: none (a single-node run)"),
        }
        match config.namespace() {
            "" => println!("namespace: none ({})", namespace_source(config)),
            ns => println!("namespace: {ns} ({})", namespace_source(config)),
        }
    }
    // Each value can be fine alone and still not make a store (capacity below one chunk).
    config.store_config()?;
    Ok(ExitCode::SUCCESS)
}

/// Where `job.namespace` came from, as `cascade config` prints sources.
fn namespace_source(config: &Config) -> String {
    config
        .get("job.namespace")
        .map(|e| e.source.to_string())
        .unwrap_or_default()
}

fn sourced_json(value: serde_json::Value, source: impl std::fmt::Display) -> serde_json::Value {
    json!({ "value": value, "source": source.to_string() })
}

/// The job's identity for `cascade config --json`: each field's value and source.
fn job_json(job: &JobIdentity) -> serde_json::Value {
    json!({
        "id": sourced_json(json!(job.id.value), &job.id.source),
        "name": sourced_json(json!(job.name.value), &job.name.source),
        "node": sourced_json(json!(job.node.value), &job.node.source),
        "nodes": sourced_json(json!(job.nodes.value), &job.nodes.source),
        "node_names": job.node_names.as_ref().map(|n| sourced_json(json!(n.value), &n.source)),
    })
}
