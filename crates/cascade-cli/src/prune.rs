//! `cascade prune`: retention of the durable store's dedup repository — forget old
//! checkpoints, then collect the packs no remaining checkpoint uses (docs/dedup.md, "Garbage
//! collection").

use std::process::ExitCode;
use std::sync::Arc;

use cascade_config::format_size;
use cascade_dedup::repo::{GcOptions, PruneReport, PruneSelection, Repo, DEFAULT_PREFIX};
use cascade_durable::DurableStore;

use crate::failure::Failure;

pub const DETAILS: &str = "Checkpoints stored with dedup (drain --dedup, the agent with \
dedup on) share chunks in packs. prune forgets checkpoints (their manifests), then deletes \
the packs no remaining checkpoint uses; a pack a kept checkpoint still uses stays whole, so \
some bytes of forgotten checkpoints may stay in it ('unreclaimed'). Packs a writer that \
started before this run may still use are left for a later prune ('waiting for writers'); \
running prune again later finishes them. Nothing is read but the repository's small \
records: no pack data. --keep-last N keeps the N newest checkpoints, by when their manifests \
were written; a checkpoint in the plain layout (with a .cascade-complete marker) is not \
touched. Sizes are binary (1 MiB = 2^20 bytes), with the exact byte count in parentheses. \
S3 credentials come from the URL or CASCADE_S3_* / AWS_* variables.";

/// `--keep-last N`: a whole number, at least 1 (forgetting every checkpoint takes naming them).
pub fn parse_keep(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("keep at least 1 checkpoint (to forget them all, name them)".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a number of checkpoints")),
    }
}

fn failure(durable: &DurableStore, e: impl std::fmt::Display) -> Failure {
    Failure::new(format!("{}: dedup repository: {e}", durable.name()))
}

fn bytes(n: u64) -> String {
    format!("{} ({n} bytes)", format_size(n))
}

pub fn prune(
    url: &str,
    checkpoints: &[String],
    keep: Option<u64>,
    dry_run: bool,
    orphans: bool,
    as_json: bool,
) -> Result<ExitCode, Failure> {
    let selection = match keep {
        Some(n) => PruneSelection::KeepNewest(usize::try_from(n).unwrap_or(usize::MAX)),
        None => PruneSelection::Checkpoints(checkpoints.to_vec()),
    };
    let durable = Arc::new(crate::checkpoint::open_durable_for_reading(url)?);
    let repo = Repo::open_for_maintenance(durable.clone(), DEFAULT_PREFIX)
        .map_err(|e| failure(&durable, e))?
        .ok_or_else(|| {
            Failure::new(format!(
                "{}: no dedup repository ({DEFAULT_PREFIX}/) to prune",
                durable.name()
            ))
        })?;
    let report = repo
        .prune(
            &selection,
            &GcOptions {
                dry_run,
                orphans,
                ..GcOptions::default()
            },
        )
        .map_err(|e| failure(&durable, e))?;
    if as_json {
        let gc = &report.gc;
        println!(
            "{}",
            serde_json::json!({
                "dry_run": gc.dry_run,
                "forgotten": report.forgotten,
                "kept": report.kept,
                "packs_deleted": gc.packs_deleted,
                "bytes_freed": gc.bytes_freed,
                "packs_unreclaimed": gc.packs_unreclaimed,
                "bytes_unreclaimed": gc.bytes_unreclaimed,
                "packs_waiting": gc.packs_waiting,
                "sessions_waited_for": gc.sessions_waited_for,
                "orphans_found": gc.orphans_found,
                "orphans_deleted": gc.orphans_deleted,
                "orphan_bytes_freed": gc.orphan_bytes_freed,
                "orphans_waiting": gc.orphans_waiting,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    if dry_run {
        for name in &report.forgotten {
            println!("would forget {name}");
        }
    } else {
        for name in &report.forgotten {
            crate::format::detail_line(&format!("forgot {name}"));
        }
    }
    for name in &report.kept {
        crate::format::detail_line(&format!("kept {name}"));
    }
    crate::format::summary_line(&summary(&report));
    Ok(ExitCode::SUCCESS)
}

/// One line: checkpoints forgotten, packs deleted, bytes freed and unreclaimed, packs waiting.
fn summary(report: &PruneReport) -> String {
    let gc = &report.gc;
    let total = report.forgotten.len() + report.kept.len();
    let (head, forgot, delete, free) = if gc.dry_run {
        ("prune --dry-run", "would forget", "would delete", "free")
    } else {
        ("prune", "forgot", "deleted", "freed")
    };
    let mut line = format!(
        "{head}: {forgot} {} of {total} checkpoints, {delete} {} packs, {free} {}, {} \
         unreclaimed in {} packs kept checkpoints share, {} packs waiting for {} writers",
        report.forgotten.len(),
        gc.packs_deleted,
        bytes(gc.bytes_freed),
        bytes(gc.bytes_unreclaimed),
        gc.packs_unreclaimed,
        gc.packs_waiting,
        gc.sessions_waited_for
    );
    if gc.orphans_found + gc.orphans_deleted + gc.orphans_waiting > 0 {
        line.push_str(&format!(
            "; orphaned packs (no index names them): {delete} {} ({free} {}), {} found for \
             a later prune, {} waiting for writers",
            gc.orphans_deleted,
            bytes(gc.orphan_bytes_freed),
            gc.orphans_found,
            gc.orphans_waiting
        ));
    }
    line
}
