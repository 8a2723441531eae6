//! Turns the results into bench/results/node-store.md (tables) and node-store.json.

use crate::benches::{Opts, Results, Row};
use crate::util::{size_str, Interference, Machine, Stats};
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub goal: String,
    pub measured: String,
    /// None when the benchmark was not run.
    pub met: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub generated_utc: String,
    pub duration_s: f64,
    pub command: String,
    /// Git commit of the workspace that was measured.
    pub source: String,
    pub machine: &'a Machine,
    pub interference: Interference,
    pub options: &'a Opts,
    pub targets: Vec<Target>,
    pub results: &'a Results,
}

/// memcpy-shm GB/s to compare the sweep with: the paired runs' median, else the table's.
fn sweep_base(r: &Results, procs: usize) -> Option<f64> {
    r.tight_pairs
        .iter()
        .find(|t| t.kind == "write" && t.procs == procs)
        .map(|t| t.memcpy_shm_gbps.median)
        .or_else(|| find(&r.writes, "memcpy-shm", procs).map(|b| b.gbps.median))
}

fn find<'a>(rows: &'a [Row], method: &str, procs: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.method == method && r.procs == procs)
}

fn ratio(a: Option<&Row>, b: Option<&Row>) -> Option<f64> {
    let (a, b) = (a?, b?);
    let r = a.gbps.median / b.gbps.median;
    r.is_finite().then_some(r)
}

fn ratio_str(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x"))
}

fn stats_str(s: &Stats) -> String {
    if s.samples.len() <= 1 {
        format!("{:.2}", s.median)
    } else {
        format!("{:.2} [{:.2}–{:.2}]", s.median, s.min, s.max)
    }
}

pub fn targets(opts: &Opts, r: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    // Targets use the paired runs: Cascade and memcpy-shm alternating inside the same
    // processes, the ratio taken between neighbouring phases (see bench/README.md).
    let per_proc = |rows: &[Row], kind: &str, ours: &str, base: &str| -> (String, Option<bool>) {
        let mut parts = Vec::new();
        let mut met = None;
        for &p in &opts.procs {
            let Some(tp) = r
                .tight_pairs
                .iter()
                .find(|t| t.kind == kind && t.procs == p)
            else {
                continue;
            };
            let x = tp.ratio.median;
            let tables = ratio(find(rows, ours, p), find(rows, base, p))
                .map_or_else(String::new, |t| format!("; separate runs {t:.2}x"));
            parts.push(format!(
                "{p} proc: **{x:.2}x** [{:.2}–{:.2}] ({:.2} vs {:.2} GB/s{tables})",
                tp.ratio.min, tp.ratio.max, tp.cascade_gbps.median, tp.memcpy_shm_gbps.median
            ));
            met = Some(met.unwrap_or(true) && x >= 0.9);
        }
        let s = if parts.is_empty() {
            "not run".to_string()
        } else {
            parts.join("; ")
        };
        (s, met)
    };
    let (m, met) = per_proc(&r.writes, "write", "cascade", "memcpy-shm");
    out.push(Target {
        name: "1 MiB writes".into(),
        goal: ">= 0.9x memcpy into pre-faulted MAP_SHARED /dev/shm".into(),
        measured: m,
        met,
    });
    let (m, met) = match &r.steady {
        Some(s) => {
            let x = s.cascade.steady.median / s.tmpfs.steady.median;
            (
                format!(
                    "{x:.2}x ({:.2} vs {:.2} GB/s)",
                    s.cascade.steady.median, s.tmpfs.steady.median
                ),
                Some(x >= 3.0),
            )
        }
        None => ("not run".into(), None),
    };
    out.push(Target {
        name: "steady-state checkpointing".into(),
        goal: ">= 3x tmpfs (write new, delete oldest)".into(),
        measured: m,
        met,
    });
    let devs: Vec<(usize, f64, f64)> = r
        .spill
        .iter()
        .filter(|s| s.deviation_pct.is_finite())
        .map(|s| (s.procs, s.share_pct, s.deviation_pct))
        .collect();
    let (m, met) = match devs.iter().max_by(|a, b| a.2.abs().total_cmp(&b.2.abs())) {
        Some(&(p, share, d)) => (
            format!("worst {d:+.1} % (at {share} % spilled, {p} proc)"),
            Some(d.abs() <= 15.0),
        ),
        None => ("not run".into(), None),
    };
    out.push(Target {
        name: "spill-over".into(),
        goal: "within 15 % of size/(mem/T_mem + ssd/T_ssd)".into(),
        measured: m,
        met,
    });
    let (m, met) = per_proc(&r.readback, "read", "cascade-read", "memcpy-shm-read");
    out.push(Target {
        name: "read-back".into(),
        goal: ">= 0.9x memcpy from pre-faulted /dev/shm".into(),
        measured: m,
        met,
    });
    out
}

/// The "## Machine" section both suites print: the machine's facts, the suite's own rows
/// (`extra`, after /dev/shm), and how quiet the machine was during the run.
pub fn machine_table(s: &mut String, m: &Machine, extra: &[(String, String)], i: &Interference) {
    let _ = writeln!(s, "\n## Machine\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| CPU | {} |", m.cpu_model);
    let _ = writeln!(s, "| cores | {} |", m.cores);
    let _ = writeln!(s, "| kernel | {} |", m.kernel);
    let _ = writeln!(s, "| RAM | {} GiB |", m.ram_gib);
    let _ = writeln!(
        s,
        "| transparent huge pages (anon / shmem) | {} / {} |",
        m.thp_anon, m.thp_shmem
    );
    let _ = writeln!(s, "| /dev/shm | {} |", m.shm_fs);
    for (name, value) in extra {
        let _ = writeln!(s, "| {name} | {value} |");
    }
    let _ = writeln!(
        s,
        "| CPU used by other processes and kernel threads during the run | {:.1} % of all \
         cores (steal {:.1} %); load average {} at start, {} at end |",
        i.other_cpu_pct, i.steal_pct, i.loadavg_start, i.loadavg_end
    );
    let _ = writeln!(
        s,
        "| waits for an idle machine before a measurement | {} of {} gave up after {:.1} s \
         (median wait {:.2} s) |",
        i.settle_timeouts, i.settles, i.settle_max_s, i.settle_median_s
    );
}

pub fn markdown(rep: &Report) -> String {
    let mut s = String::new();
    let o = rep.options;
    let r = rep.results;
    let _ = writeln!(s, "# Cascade node store (L0): benchmarks\n");
    let _ = writeln!(
        s,
        "Generated by `bench/run.sh` ({}) on {} UTC from commit {}; the run took {:.0} s.\n",
        rep.command, rep.generated_utc, rep.source, rep.duration_s
    );
    let _ = writeln!(
        s,
        "GB/s = 10^9 bytes per second. Each figure is the median of {} runs ({} for disk \
         writes, steady state and the chunk sweep, {} per spill-over point), [min–max] in \
         brackets. Ratios divide medians by the medians of baselines measured in the same run. \
         Multi-process figures are aggregates: total bytes / (last finish − common start), with \
         every process released at once by a pipe barrier after its set-up. Everything goes \
         through the store's Rust API (`File::write_at` / `read_at`). See bench/README.md.\n",
        o.reps, o.slow_reps, o.spill_reps
    );
    if rep.interference.other_cpu_pct > 10.0 {
        let _ = writeln!(
            s,
            "**Warning:** other processes and kernel threads used {:.0} % of the CPUs during \
             this run (load average {} at start); the figures are disturbed by them.\n",
            rep.interference.other_cpu_pct, rep.interference.loadavg_start
        );
    }
    let _ = writeln!(s, "## Targets (issue 2)\n");
    let _ = writeln!(
        s,
        "Write and read ratios come from paired runs: in the same processes, Cascade and \
         memcpy into (out of) the pre-faulted /dev/shm baseline alternate {} times each \
         (which one goes first alternates), and each Cascade phase is divided by the memcpy \
         phase next to it: median [min–max] of those ratios, then the medians of both. On a shared VM \
         memory bandwidth drifts over seconds, so separate runs (the tables below; their ratio \
         of medians is given too) are much noisier.\n",
        o.reps.max(3)
    );
    let _ = writeln!(s, "| target | goal | measured | met |\n|---|---|---|---|");
    for t in &rep.targets {
        let met = match t.met {
            Some(true) => "**yes**",
            Some(false) => "**NO**",
            None => "not run",
        };
        let _ = writeln!(s, "| {} | {} | {} | {} |", t.name, t.goal, t.measured, met);
    }
    let diag: Vec<String> = r
        .tight_pairs
        .iter()
        .map(|p| {
            format!(
                "{}s, {} proc: {:.2}x [{:.2}–{:.2}] ({:.2} vs {:.2} GB/s)",
                p.kind,
                p.procs,
                p.ratio_chunks.median,
                p.ratio_chunks.min,
                p.ratio_chunks.max,
                p.cascade_gbps.median,
                p.store_chunks_gbps.median
            )
        })
        .collect();
    if !diag.is_empty() {
        let _ = writeln!(
            s,
            "\nDiagnostic, not a target: in the same paired runs, Cascade against a raw memcpy \
             into (out of) the same file's chunks through the zero-copy chunk-list API, i.e. \
             the same shared memory without the write/read path: {}. A ratio near 1 here means \
             any gap to memcpy-shm comes from the memory pages, not from the store's code.",
            diag.join("; ")
        );
    }
    let m = rep.machine;
    machine_table(
        &mut s,
        m,
        &[
            (
                format!("disk baseline ({})", o.disk_dir.display()),
                m.disk_fs.clone(),
            ),
            (
                format!("spill file ({})", o.spill_dir.display()),
                m.spill_fs.clone(),
            ),
        ],
        &rep.interference,
    );

    if !r.creation.is_empty() {
        let _ = writeln!(s, "\n## Store creation (`Prefault::Foreground`)\n");
        let _ = writeln!(
            s,
            "Wall time of `Store::create`, which returns once every page of the data region is \
             faulted in; not included in any bandwidth below.\n"
        );
        let _ = writeln!(
            s,
            "| store | memory | chunk | spill file | create time (s) | prefault GB/s |\n|---|---|---|---|---|---|"
        );
        for c in &r.creation {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.3} | {:.2} |",
                c.store,
                size_str(c.capacity),
                size_str(c.chunk_size),
                if c.spill_bytes > 0 {
                    size_str(c.spill_bytes)
                } else {
                    "-".into()
                },
                c.seconds,
                c.gbps
            );
        }
    }

    if !r.writes.is_empty() {
        let _ = writeln!(
            s,
            "\n## 1. {} writes, {} per process\n",
            size_str(o.io),
            size_str(o.size)
        );
        let _ = writeln!(
            s,
            "Timed: open/create + all writes + close (memcpy rows: the copies only). \
             `disk-write` stops the clock after the last write(); `disk-write+fsync` after \
             fsync and close (same runs). `memcpy-shm` copies into a /dev/shm object that the \
             parent created, pre-faulted (MADV_POPULATE_WRITE) and wrote once right after the \
             store and that every repetition reuses, i.e. with the store's life cycle (the \
             store's memory is also written once after creation, see bench/README.md); \
             `memcpy-shm-fresh` into one the child created and pre-faulted just before. \
             Set-up = median per-process time before the barrier (attach and map the store, \
             pre-fault buffers).\n"
        );
        let _ = writeln!(
            s,
            "| method | procs | GB/s | vs memcpy anon | vs memcpy shm | vs tmpfs write | set-up (s) |\n|---|---|---|---|---|---|---|"
        );
        for row in &r.writes {
            let p = row.procs;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {:.2} |",
                row.method,
                p,
                stats_str(&row.gbps),
                ratio_str(ratio(Some(row), find(&r.writes, "memcpy-anon", p))),
                ratio_str(ratio(Some(row), find(&r.writes, "memcpy-shm", p))),
                ratio_str(ratio(Some(row), find(&r.writes, "tmpfs-write", p))),
                row.setup_s
            );
        }
    }

    if let Some(st) = &r.steady {
        let _ = writeln!(
            s,
            "\n## 2. Steady-state checkpointing, 1 process\n\nEach round creates a new {} \
             checkpoint file, writes it with {} writes, closes it, and from round {} on deletes \
             the oldest so that {} remain; the round's time covers all of it. Steady state = \
             rounds {}..{}.\n",
            size_str(st.bytes),
            size_str(o.io),
            st.keep + 1,
            st.keep,
            st.keep + 1,
            st.rounds
        );
        let _ = writeln!(
            s,
            "| round | Cascade GB/s | tmpfs GB/s | Cascade / tmpfs |\n|---|---|---|---|"
        );
        for (i, (c, t)) in st
            .cascade
            .per_round
            .iter()
            .zip(st.tmpfs.per_round.iter())
            .enumerate()
        {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2}x |",
                i + 1,
                stats_str(c),
                stats_str(t),
                c.median / t.median
            );
        }
        let _ = writeln!(
            s,
            "| **steady state** | **{}** | **{}** | **{:.2}x** |",
            stats_str(&st.cascade.steady),
            stats_str(&st.tmpfs.steady),
            st.cascade.steady.median / st.tmpfs.steady.median
        );
    }

    if !r.sweep.is_empty() {
        let _ = writeln!(
            s,
            "\n## 3. Chunk-size sweep (paper 000, Figure 6), {} per process\n",
            size_str(o.size)
        );
        let _ = writeln!(
            s,
            "A fresh store per chunk size. Write size {} or the chunk size when larger. The \
             memcpy-shm reference is the median memcpy-shm (1 MiB copies) of the paired write \
             runs of benchmark 1 in this run. Note that plain memcpy itself is slower in pieces \
             under 1 MiB on this CPU (about 11.5 vs 16-17 GB/s into a pre-faulted /dev/shm \
             mapping, measured by hand), and with 32-64 MiB writes the source buffer no longer \
             fits in the caches; chunks below 1 MiB split every 1 MiB write into smaller \
             copies.\n",
            size_str(o.io)
        );
        let mut hdr = String::from("| chunk | write size | create (s) |");
        let mut sep = String::from("|---|---|---|");
        for &p in &o.procs {
            let _ = write!(hdr, " {p} proc GB/s | vs memcpy shm |");
            sep.push_str("---|---|");
        }
        let _ = writeln!(s, "{hdr}\n{sep}");
        let mut sizes: Vec<u64> = r.sweep.iter().map(|x| x.chunk_size).collect();
        sizes.dedup();
        for cs in sizes {
            let rows: Vec<_> = r.sweep.iter().filter(|x| x.chunk_size == cs).collect();
            let Some(first) = rows.first() else { continue };
            let mut line = format!(
                "| {} | {} | {:.3} |",
                size_str(cs),
                size_str(first.io),
                first.creation_s
            );
            for &p in &o.procs {
                match rows.iter().find(|x| x.procs == p) {
                    Some(x) => {
                        let base = sweep_base(r, p);
                        let _ = write!(
                            line,
                            " {} | {} |",
                            stats_str(&x.gbps),
                            ratio_str(base.map(|b| x.gbps.median / b))
                        );
                    }
                    None => line.push_str(" - | - |"),
                }
            }
            let _ = writeln!(s, "{line}");
        }
    }

    if !r.spill.is_empty() {
        let _ = writeln!(
            s,
            "\n## 4. Spill-over (paper 000, Table 3), {} per process\n",
            size_str(o.spill_size)
        );
        let _ = writeln!(
            s,
            "One store per process count, with memory for all the data and a spill file. For \
             a share s, a filler file written by a helper process first occupies s of the \
             memory, so that exactly that share of the measured writes must go to the spill \
             file; every share thus uses the same memory and the same spill file. Timed: \
             create + writes + `File::sync` (fdatasync of the spill file) + close, split into \
             the write phase and the sync phase. The repetitions visit all shares in turn, \
             starting one further each time, so that drift of the machine spreads over all \
             of them. Formula: size / (mem/T_mem + ssd/T_ssd) with the real spilled bytes; \
             T_mem and T_ssd are solved from the 0 % and 100 % runs. The very first run \
             (100 % into a spill file never written before) is reported apart: on this VM it \
             is several times slower than every later run.\n"
        );
        for mdl in &r.spill_model {
            let _ = writeln!(
                s,
                "- {} proc: T_mem = {:.2} GB/s, T_ssd = {:.2} GB/s; first run (100 %, spill file \
                 never written before): {:.2} GB/s",
                mdl.procs, mdl.t_mem_gbps, mdl.t_ssd_gbps, mdl.first_run_gbps
            );
        }
        let _ = writeln!(
            s,
            "\n| procs | spilled (target) | spilled (real) | measured GB/s | formula GB/s | deviation | writes (ms) | sync (ms) |\n|---|---|---|---|---|---|---|---|"
        );
        for x in &r.spill {
            let _ = writeln!(
                s,
                "| {} | {} % | {:.2} % | {} | {:.2} | {:+.1} % | {:.0} | {:.0} |",
                x.procs,
                x.share_pct,
                x.spilled_bytes as f64 * 100.0 / x.total_bytes as f64,
                stats_str(&x.gbps),
                x.predicted_gbps,
                x.deviation_pct,
                x.write_s.median * 1e3,
                x.sync_s.median * 1e3
            );
        }
    }

    if !r.readback.is_empty() {
        let _ = writeln!(
            s,
            "\n## 5. Read-back, {} reads, {} per process\n",
            size_str(o.io),
            size_str(o.size)
        );
        let _ = writeln!(
            s,
            "Files written beforehand by the parent process; each child opens its own file \
             and reads it into one {} buffer (open + reads + close timed). memcpy-shm-read \
             copies out of its slice of the baseline /dev/shm object (created with the store, \
             filled by the child during set-up).\n",
            size_str(o.io)
        );
        let _ = writeln!(
            s,
            "| method | procs | GB/s | vs memcpy shm | vs tmpfs read | set-up (s) |\n|---|---|---|---|---|---|"
        );
        for row in &r.readback {
            let p = row.procs;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.2} |",
                row.method,
                p,
                stats_str(&row.gbps),
                ratio_str(ratio(Some(row), find(&r.readback, "memcpy-shm-read", p))),
                ratio_str(ratio(Some(row), find(&r.readback, "tmpfs-read", p))),
                row.setup_s
            );
        }
    }
    s
}

/// "2025-01-31 12:34:56" for a Unix time in seconds (UTC; no time-zone database needed).
pub fn utc_string(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Writes a suite's results as `<out>/<name>.md` and `<out>/<name>.json`, then prints its
/// targets (if it has any) and the files written on stderr.
pub fn write_results(
    out: &std::path::Path,
    name: &str,
    md: &str,
    rep: &impl Serialize,
    targets: &[Target],
    duration_s: f64,
) -> crate::util::Res<()> {
    use crate::util::Context;
    let json = serde_json::to_string_pretty(rep).ctx(|| "encoding results as JSON")?;
    let md_path = out.join(format!("{name}.md"));
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&md_path, md).ctx(|| format!("writing {}", md_path.display()))?;
    std::fs::write(&json_path, json + "\n").ctx(|| format!("writing {}", json_path.display()))?;
    if !targets.is_empty() {
        eprintln!("\nTargets:");
    }
    for t in targets {
        let met = match t.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not run",
        };
        eprintln!(
            "  {:<40} {:<50} {met}\n      {}",
            t.name, t.goal, t.measured
        );
    }
    eprintln!(
        "wrote {} and {} ({duration_s:.0} s)",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}
