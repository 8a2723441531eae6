//! `cascade analyze PATH...`: how much a series of checkpoints repeats itself (dedup under
//! fixed and content-defined chunking), how well its unique data compresses, and where in
//! each file the changes are. The engine is the cascade-analyze crate; docs/dedup.md explains
//! every figure.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use cascade_analyze::analyze::Options;
use cascade_analyze::heatmap;
use cascade_dedup::Chunking;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::failure::Failure;

pub const ABOUT: &str = "Reads a series of checkpoints (files or directories, given in the \
order they were written) and reports how much of the series repeats itself, as the cento \
paper (Figures 3-6) analysed it. A directory is walked recursively (regular files only, \
symbolic links skipped); its files are matched with the previous snapshot's by relative path. \
Nothing is written except with --plot.

What the numbers mean:
  same offset      per snapshot, the share of its 4 KiB blocks identical to the block at the \
same offset of the same file in the previous snapshot (what an incremental checkpoint that \
skips unchanged blocks would save)
  dedup ratio      per chunking (fixed 512 B, 4 KiB, 8 KiB and CDC avg 64 KiB; --dedup adds \
more): total bytes of the series / bytes of its unique chunks (each distinct chunk, by BLAKE3, \
stored once); 1.00 means nothing repeats, 5.00 for five identical snapshots
  new / duplicate  per snapshot and chunking: chunks first seen in that snapshot, and chunks \
already seen earlier in the series (or earlier in the same snapshot), with cumulative sums
  compression      zstd levels 1 and 3 over the unique CDC chunks, a chunk kept compressed only \
if that saves at least 1/8 of it; ratio = unique bytes / stored bytes; dedup+compression = \
total bytes / stored bytes
  chunk sizes      how the CDC chunk sizes fall into power-of-two buckets
  heatmaps         with --plot DIR, one PNG per file: the file in 4 KiB regions (larger for \
files over 4 GiB) laid along a Hilbert curve, coloured by in how many snapshot transitions each \
region changed (dark purple: never; yellow: every time; grey: past the end of the file)

Sizes are decimal (1 MB = 10^6 bytes) in the text report and bytes in --json. The analysis \
uses every core and reads each file in 64 MiB windows, so files larger than memory are fine; \
its memory grows with the unique data (about 80 MB per GB for the 512-byte chunking). A \
progress bar is shown on a terminal.";

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Print the report as JSON (sizes in bytes; field names in docs/dedup.md)
    #[arg(long)]
    pub json: bool,
    /// Write a change heatmap PNG per file into DIR (created if missing)
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Analyse this chunking too, e.g. fixed:64KiB, cdc:avg=16KiB or
    /// cdc:min=8KiB,avg=32KiB,max=128KiB (repeatable; the spec of the agent's --dedup; also
    /// --chunking)
    #[arg(long = "dedup", alias = "chunking", value_name = "SPEC")]
    pub chunkings: Vec<Chunking>,
    /// The snapshots, oldest first: files, or directories of files
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

pub fn analyze(args: &AnalyzeArgs) -> Result<ExitCode, Failure> {
    let fail = |err: cascade_analyze::Error| Failure::new(err.to_string());
    let series = cascade_analyze::scan(&args.paths).map_err(fail)?;
    let mut options = Options::default();
    for chunking in &args.chunkings {
        options.add_chunking(*chunking);
    }
    options.heatmaps = args.plot.is_some();
    if let Some(dir) = &args.plot {
        // Before the analysis, which may take a while: an unusable DIR fails at once.
        std::fs::create_dir_all(dir).map_err(|e| Failure::io(&dir.display().to_string(), &e))?;
    }
    let bar = progress_bar(series.total_bytes());
    let result = cascade_analyze::analyze(&series, &options, &|bytes| bar.inc(bytes));
    bar.finish_and_clear();
    let mut report = result.map_err(fail)?;
    if let Some(dir) = &args.plot {
        let written = heatmap::write_all(&report.heatmaps, dir).map_err(fail)?;
        report.plots = written.iter().map(|p| p.display().to_string()).collect();
    }
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(format!("JSON report: {e}")))?;
        json.push('\n');
        json
    } else {
        let mut text = report.to_text();
        if let Some(dir) = &args.plot {
            text.push_str(&format!(
                "Wrote {} heatmap{} into {}:\n",
                report.plots.len(),
                if report.plots.len() == 1 { "" } else { "s" },
                dir.display()
            ));
            for plot in &report.plots {
                text.push_str(&format!("  {plot}\n"));
            }
        }
        text
    };
    io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| Failure::io("standard output", &e))?;
    Ok(ExitCode::SUCCESS)
}

/// A byte progress bar on stderr when a person is watching.
fn progress_bar(total: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "analysing {bar:40} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(total).with_style(style)
}
