//! Turns the interposition results into bench/results/interposition.md and .json.

use crate::preload::{POpts, PResults, Row};
use crate::report::Target;
use crate::util::{size_str, Interference, Machine, Stats};
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub suite: &'static str,
    pub generated_utc: String,
    pub duration_s: f64,
    pub command: String,
    /// Git commit of the workspace that was measured.
    pub source: String,
    /// The preloaded library: path and modification time.
    pub library: String,
    pub cc: String,
    pub machine: &'a Machine,
    pub interference: Interference,
    pub options: &'a POpts,
    pub targets: Vec<Target>,
    pub results: &'a PResults,
}

fn find<'a>(rows: &'a [Row], method: &str, procs: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.method == method && r.procs == procs)
}

fn find_io<'a>(rows: &'a [Row], method: &str, procs: usize, io: u64) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.method == method && r.procs == procs && r.io == io)
}

fn st(s: &Stats) -> String {
    st_prec(s, 2)
}

fn st_prec(s: &Stats, p: usize) -> String {
    if s.samples.len() <= 1 {
        format!("{:.p$}", s.median)
    } else {
        format!("{:.p$} [{:.p$}–{:.p$}]", s.median, s.min, s.max)
    }
}

/// Large counts: "12.3 M", "456 k".
fn count(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn count_st(s: &Stats) -> String {
    if s.samples.len() <= 1 {
        count(s.median)
    } else {
        format!("{} [{}–{}]", count(s.median), count(s.min), count(s.max))
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if (a / b).is_finite() => format!("{:.2}x", a / b),
        _ => "n/a".into(),
    }
}

fn rep_ratio<'a>(r: &'a PResults, what: &str, procs: usize) -> Option<&'a Stats> {
    r.rep_ratios
        .iter()
        .find(|x| x.procs == procs && x.what.contains(what))
        .map(|x| &x.ratio)
}

pub fn targets(opts: &POpts, r: &PResults) -> Vec<Target> {
    let mut out = Vec::new();
    // 1. 1 MiB writes against the store API.
    let mut parts = Vec::new();
    let mut met = None;
    for &p in &opts.procs {
        let Some(n) = r
            .normalised
            .iter()
            .find(|n| n.kind == "write" && n.procs == p)
        else {
            continue;
        };
        let sep = match (
            find(&r.writes, "preload", p),
            find(&r.writes, "store-api", p),
            rep_ratio(r, "write preload/store-api", p),
        ) {
            (Some(a), Some(b), Some(rr)) => format!(
                "; separate runs {:.2} vs {:.2} GB/s, per repetition {:.2}x [{:.2}–{:.2}]",
                a.gbps.median, b.gbps.median, rr.median, rr.min, rr.max
            ),
            _ => String::new(),
        };
        parts.push(format!(
            "{p} proc: **{:.2}x** [{:.2}–{:.2}]{sep}",
            n.ratio, n.low, n.high
        ));
        met = Some(met.unwrap_or(true) && n.ratio >= 0.9);
    }
    out.push(Target {
        name: "1 MiB writes through the library".into(),
        goal: ">= 0.9x the store API (`File::write_at`)".into(),
        measured: if parts.is_empty() {
            "not run".into()
        } else {
            parts.join("; ")
        },
        met,
    });
    // 2. 64-byte writes against tmpfs.
    let mut parts = Vec::new();
    let mut met = None;
    for &p in &opts.procs {
        let (Some(a), Some(b), Some(rr)) = (
            find_io(&r.sweep, "preload", p, 64),
            find_io(&r.sweep, "tmpfs", p, 64),
            rep_ratio(r, "64 B preload/tmpfs", p),
        ) else {
            continue;
        };
        parts.push(format!(
            "{p} proc: **{:.1}x** [{:.1}–{:.1}] ({} vs {} calls/s; {:.0} vs {:.0} ns per call)",
            rr.median,
            rr.min,
            rr.max,
            count(a.calls_per_s.median),
            count(b.calls_per_s.median),
            a.ns_per_call.median,
            b.ns_per_call.median
        ));
        met = Some(met.unwrap_or(true) && rr.median >= 10.0);
    }
    out.push(Target {
        name: "64-byte writes".into(),
        goal: ">= 10x the write() calls per second into tmpfs".into(),
        measured: if parts.is_empty() {
            "not run".into()
        } else {
            parts.join("; ")
        },
        met,
    });
    // 6. Pass-through overhead.
    let (m, met) = if r.passthrough.is_empty() {
        ("not run".to_string(), None)
    } else {
        let worst = r
            .passthrough
            .iter()
            .map(|x| x.ratio.median)
            .fold(f64::MIN, f64::max);
        (
            r.passthrough
                .iter()
                .map(|x| {
                    format!(
                        "{}: **{:+.1} %** [{:+.1}–{:+.1}]",
                        x.op,
                        (x.ratio.median - 1.0) * 100.0,
                        (x.ratio.min - 1.0) * 100.0,
                        (x.ratio.max - 1.0) * 100.0
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Some(worst < 1.05),
        )
    };
    out.push(Target {
        name: "overhead on non-Cascade files".into(),
        goal: "< 5 % (tmpfs file, with vs without LD_PRELOAD)".into(),
        measured: m,
        met,
    });
    out
}

pub fn markdown(rep: &Report) -> String {
    let mut s = String::new();
    let o = rep.options;
    let r = rep.results;
    let _ = writeln!(s, "# Cascade interposition (LD_PRELOAD): benchmarks\n");
    let _ = writeln!(
        s,
        "Generated by `bench/run.sh` (interposition {}) on {} UTC from commit {}; the run took {:.0} s.\n",
        rep.command, rep.generated_utc, rep.source, rep.duration_s
    );
    let _ = writeln!(
        s,
        "A small C program (`bench/preload/pio.c`, compiled with `cc -O2`, {}) does the I/O with plain POSIX \
         calls. **preload**: it runs with `LD_PRELOAD=libcascade.so` (a private copy of {}) \
         on files under `CASCADE_MOUNT={}`; \
         **tmpfs**: the same program without the library on files in /dev/shm; **store-api**: \
         the node-store benchmark's Rust children calling `File::write_at` / `read_at` \
         directly; **memcpy-shm**: memcpy into (out of) a pre-faulted MAP_SHARED /dev/shm \
         object. All of it in the same run, the methods taking turns within each repetition. \
         GB/s = 10^9 bytes/s. Each figure is the median of {} runs, [min–max] in brackets. \
         Multi-process figures are aggregates (total / (last finish − common start)); \
         ns per call is per process. See bench/README.md.\n",
        rep.cc, rep.library, o.mount, o.reps
    );
    if rep.interference.other_cpu_pct > 10.0 {
        let _ = writeln!(
            s,
            "**Warning:** other processes and kernel threads used {:.0} % of the CPUs during \
             this run (load average {} at start); the figures are disturbed by them.\n",
            rep.interference.other_cpu_pct, rep.interference.loadavg_start
        );
    }
    let _ = writeln!(s, "## Targets (issue 3)\n");
    let _ = writeln!(
        s,
        "1 MiB writes: the library and the store API cannot run in one process, so each is \
         paired with memcpy-shm in its own processes (the two alternate {} times, which one \
         goes first alternating; ratio per round), and the target ratio is (preload / \
         memcpy-shm) / (store API / memcpy-shm), medians, with the range from the extremes. \
         The separate runs (table 1) and their per-repetition ratio are given too. 64-byte \
         writes: calls per second, ratio within each repetition. Pass-through: the same \
         program with and without the library, alternating, ratio of ns per call within each \
         pair ({} pairs).\n",
        o.reps.max(3),
        o.pass_reps
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
    headline(&mut s, o, r);
    machine(&mut s, rep);
    creation(&mut s, r);
    writes(&mut s, o, r);
    sweep(&mut s, o, r);
    replay(&mut s, o, r);
    meta(&mut s, o, r);
    reads(&mut s, o, r);
    passthrough(&mut s, o, r);
    s
}

/// The figures the issue asks for without a target.
fn headline(s: &mut String, o: &POpts, r: &PResults) {
    let mut lines = Vec::new();
    for &p in &o.procs {
        if let (Some(a), Some(b)) = (find(&r.replay, "preload", p), find(&r.replay, "tmpfs", p)) {
            lines.push(format!(
                "checkpoint write mix (paper 001, Table 2), {p} proc: {:.2} vs {:.2} GB/s = **{:.2}x tmpfs** ({} vs {} calls/s)",
                a.gbps.median,
                b.gbps.median,
                a.gbps.median / b.gbps.median,
                count(a.calls_per_s.median),
                count(b.calls_per_s.median)
            ));
        }
    }
    for &p in &o.procs {
        let (Some(a), Some(b)) = (
            r.meta
                .iter()
                .find(|m| m.method == "preload" && m.procs == p),
            r.meta.iter().find(|m| m.method == "tmpfs" && m.procs == p),
        ) else {
            continue;
        };
        lines.push(format!(
            "metadata, {p} proc: create+write 4 KiB+close {} vs {} files/s = **{:.2}x tmpfs**; stat {} vs {} stats/s = **{:.2}x tmpfs**",
            count(a.create_per_s.median),
            count(b.create_per_s.median),
            a.create_per_s.median / b.create_per_s.median,
            count(a.stat_per_s.median),
            count(b.stat_per_s.median),
            a.stat_per_s.median / b.stat_per_s.median
        ));
    }
    for &p in &o.procs {
        let (Some(a), Some(b), Some(c), Some(k)) = (
            find(&r.readback, "preload", p),
            find(&r.readback, "tmpfs", p),
            find(&r.readback, "memcpy-shm", p),
            find(&r.readback, "preload-cold", p),
        ) else {
            continue;
        };
        lines.push(format!(
            "restart reads (1 MiB), {p} proc: {:.2} GB/s = **{:.2}x tmpfs** ({:.2}), {:.2}x memcpy-shm ({:.2}); a freshly started process (store attach in the timed part): {:.2} GB/s",
            a.gbps.median,
            a.gbps.median / b.gbps.median,
            b.gbps.median,
            a.gbps.median / c.gbps.median,
            c.gbps.median,
            k.gbps.median
        ));
    }
    for &p in &o.procs {
        if let (Some(a), Some(k)) = (
            find(&r.writes, "preload", p),
            find(&r.writes, "preload-cold", p),
        ) {
            lines.push(format!(
                "1 MiB writes by a freshly started process (store attach in the timed part), {p} proc: {:.2} GB/s, {:.2}x the warmed-up figure ({:.2} GB/s)",
                k.gbps.median,
                k.gbps.median / a.gbps.median,
                a.gbps.median
            ));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(s, "\nWithout a target in the issue (medians):\n");
        for l in lines {
            let _ = writeln!(s, "- {l}");
        }
    }
}

fn machine(s: &mut String, rep: &Report) {
    crate::report::machine_table(
        s,
        rep.machine,
        &[
            ("C compiler".to_string(), rep.cc.clone()),
            ("preloaded library".to_string(), rep.library.clone()),
        ],
        &rep.interference,
    );
}

fn creation(s: &mut String, r: &PResults) {
    if r.creation.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Stores (`Prefault::Foreground`)\n");
    let _ = writeln!(
        s,
        "Created by the bench with the store API; creation (fault-in of all memory) is in no \
         figure below. The main store serves benchmarks 1, 2, 3 and 5; the metadata store has \
         4 KiB chunks so that a 4 KiB file takes 4 KiB of memory as in tmpfs (what a create \
         costs does not depend on the chunk size).\n"
    );
    let _ = writeln!(
        s,
        "| store | memory | chunk | create time (s) | prefault GB/s |\n|---|---|---|---|---|"
    );
    for c in &r.creation {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3} | {:.2} |",
            c.store,
            size_str(c.capacity),
            size_str(c.chunk_size),
            c.seconds,
            c.gbps
        );
    }
}

/// Table of 1 MiB writes or reads.
fn bandwidth_table(s: &mut String, rows: &[Row]) {
    let _ = writeln!(
        s,
        "| method | procs | GB/s | vs store API | vs memcpy shm | vs tmpfs | set-up (s) |\n|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let p = row.procs;
        let g = |m: &str| find(rows, m, p).map(|x| x.gbps.median);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} |",
            row.method,
            p,
            st(&row.gbps),
            ratio(Some(row.gbps.median), g("store-api")),
            ratio(Some(row.gbps.median), g("memcpy-shm")),
            ratio(Some(row.gbps.median), g("tmpfs")),
            row.setup_s
        );
    }
}

fn pairs(s: &mut String, r: &PResults, kind: &str) {
    let mut any = false;
    for cp in r.c_pairs.iter().filter(|c| c.kind == kind) {
        let Some(tp) = r
            .store_pairs
            .iter()
            .find(|t| t.kind == kind && t.procs == cp.procs)
        else {
            continue;
        };
        let Some(n) = r
            .normalised
            .iter()
            .find(|n| n.kind == kind && n.procs == cp.procs)
        else {
            continue;
        };
        if !any {
            let _ = writeln!(
                s,
                "\nPaired runs (ratio per round, median [min–max]; GB/s medians):\n\n| procs | preload / memcpy-shm (C program) | store API / memcpy-shm (Rust) | preload / store API (normalised) |\n|---|---|---|---|"
            );
            any = true;
        }
        let _ = writeln!(
            s,
            "| {} | {:.2}x [{:.2}–{:.2}] ({:.2} vs {:.2}) | {:.2}x [{:.2}–{:.2}] ({:.2} vs {:.2}) | **{:.2}x** [{:.2}–{:.2}] |",
            cp.procs,
            cp.ratio.median,
            cp.ratio.min,
            cp.ratio.max,
            cp.preload_gbps.median,
            cp.memcpy_shm_gbps.median,
            tp.ratio.median,
            tp.ratio.min,
            tp.ratio.max,
            tp.cascade_gbps.median,
            tp.memcpy_shm_gbps.median,
            n.ratio,
            n.low,
            n.high
        );
    }
}

fn writes(s: &mut String, o: &POpts, r: &PResults) {
    if r.writes.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## 1. {} writes, {} per process\n",
        size_str(o.io),
        size_str(o.size)
    );
    let _ = writeln!(
        s,
        "Timed: open(O_CREAT|O_EXCL) + all write() calls + close (memcpy: the copies only). \
         `preload` attaches the store during set-up and waits until the library's attach has \
         mapped the store into the process (set-up column); `preload-cold` is a process that \
         was just started: the library attaches the store on the first open, inside the \
         timed part, and the writes run while the store's pages are still being mapped into \
         the process by the attach's background thread. `store-api` is `File::write_at` of \
         a new store file (node-store benchmark 1's `cascade`); `memcpy-shm` copies into the \
         process's slice of a /dev/shm object created, pre-faulted and written once with the \
         store.\n"
    );
    bandwidth_table(s, &r.writes);
    pairs(s, r, "write");
}

fn sweep(s: &mut String, o: &POpts, r: &PResults) {
    if r.sweep.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## 2. Small writes: calls per second by write size\n");
    let _ = writeln!(
        s,
        "Per write size, a new file written with back-to-back write() calls (store API: \
         `File::write_at`), one phase per size in the same process, each timed from the open \
         to the close. ns per call = per process, phase time / calls (includes the open and \
         close). The 64 B row is the target. `interposition-sweep.png` plots it.\n"
    );
    for &p in &o.procs {
        if !r.sweep.iter().any(|x| x.procs == p) {
            continue;
        }
        let _ = writeln!(
            s,
            "{p} process{}:\n\n| write size | calls per process | preload ns/call | store API ns/call | tmpfs ns/call | preload calls/s | tmpfs calls/s | preload vs tmpfs | preload vs store API | preload GB/s | tmpfs GB/s |\n|---|---|---|---|---|---|---|---|---|---|---|",
            if p > 1 { "es" } else { "" }
        );
        for &(size, calls) in &o.sweep {
            let (Some(a), Some(b), Some(c)) = (
                find_io(&r.sweep, "preload", p, size),
                find_io(&r.sweep, "store-api", p, size),
                find_io(&r.sweep, "tmpfs", p, size),
            ) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                size_str(size),
                count(calls as f64),
                st_prec(&a.ns_per_call, 0),
                st_prec(&b.ns_per_call, 0),
                st_prec(&c.ns_per_call, 0),
                count_st(&a.calls_per_s),
                count_st(&c.calls_per_s),
                ratio(Some(a.calls_per_s.median), Some(c.calls_per_s.median)),
                ratio(Some(a.calls_per_s.median), Some(b.calls_per_s.median)),
                st(&a.gbps),
                st(&c.gbps)
            );
        }
        let _ = writeln!(s);
    }
}

fn replay(s: &mut String, o: &POpts, r: &PResults) {
    if r.replay.is_empty() {
        return;
    }
    let writes: u64 = r.mix.iter().map(|m| m.writes).sum();
    let bytes: u64 = r.mix.iter().map(|m| m.bytes).sum();
    let _ = writeln!(
        s,
        "\n## 3. Replay of a system-level checkpoint's write sizes (paper 001, Table 2)\n"
    );
    let _ = writeln!(
        s,
        "Table 2 profiles a BLCR checkpoint of NPB LU.C.64 (975 writes, 23 MB per process). \
         The bench generates a deterministic sequence of {writes} writes ({:.1} MB) with that \
         mix: per size class, the paper's share of the writes, sizes spread evenly around the \
         class's mean size (its share of the data / its writes), shuffled with a fixed seed; \
         each process replays it with back-to-back write() calls into one new file (store \
         API: `File::write_at`). Timed: open + all writes + close.\n",
        bytes as f64 / 1e6
    );
    let _ = writeln!(
        s,
        "| size class | paper: % of writes | paper: % of data | generated writes | % of writes | % of data |\n|---|---|---|---|---|---|"
    );
    for m in &r.mix {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
            m.class, m.paper_writes_pct, m.paper_data_pct, m.writes, m.writes_pct, m.data_pct
        );
    }
    let _ = writeln!(
        s,
        "\n| method | procs | GB/s | calls/s | ns per call (mean) | vs tmpfs | vs store API |\n|---|---|---|---|---|---|---|"
    );
    for row in &r.replay {
        let g = |m: &str| find(&r.replay, m, row.procs).map(|x| x.gbps.median);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.method,
            row.procs,
            st(&row.gbps),
            count_st(&row.calls_per_s),
            st_prec(&row.ns_per_call, 0),
            ratio(Some(row.gbps.median), g("tmpfs")),
            ratio(Some(row.gbps.median), g("store-api"))
        );
    }
    let _ = o;
}

fn meta(s: &mut String, o: &POpts, r: &PResults) {
    if r.meta.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## 4. Metadata: create + write 4 KiB + close, stat, unlink\n"
    );
    let _ = writeln!(
        s,
        "Each process works in its own new directory: {} times open(O_CREAT|O_EXCL) + write \
         4 KiB + close, then {} passes of stat() over all of them, then unlink() of each \
         (store API: `Store::open` + `write_at` + drop, `Store::stat`, `Store::unlink`). \
         Rates are aggregates over the processes; µs and ns per operation are per process.\n",
        o.meta_files, o.meta_passes
    );
    let _ = writeln!(
        s,
        "| method | procs | creates/s | µs per create | stats/s | ns per stat | unlinks/s | create vs tmpfs | stat vs tmpfs |\n|---|---|---|---|---|---|---|---|---|"
    );
    for m in &r.meta {
        let t = r
            .meta
            .iter()
            .find(|x| x.method == "tmpfs" && x.procs == m.procs);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            m.method,
            m.procs,
            count_st(&m.create_per_s),
            st_prec(&m.create_us, 2),
            count_st(&m.stat_per_s),
            st_prec(&m.stat_ns, 0),
            count_st(&m.unlink_per_s),
            ratio(
                Some(m.create_per_s.median),
                t.map(|t| t.create_per_s.median)
            ),
            ratio(Some(m.stat_per_s.median), t.map(|t| t.stat_per_s.median))
        );
    }
}

fn reads(s: &mut String, o: &POpts, r: &PResults) {
    if r.readback.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## 5. Restart: read back {} files with {} reads\n",
        size_str(o.size),
        size_str(o.io)
    );
    let _ = writeln!(
        s,
        "The files are written by the parent first (store API, and write() to tmpfs); each \
         process opens its own file and reads it with read() into one buffer (store API: \
         `File::read_at`), open + reads + close timed; the last buffer is checked. \
         `preload-cold` is the restart case proper: a process that was just started, whose \
         first open attaches the store inside the timed part. `memcpy-shm` copies out of the \
         process's slice of the baseline /dev/shm object.\n"
    );
    bandwidth_table(s, &r.readback);
    pairs(s, r, "read");
}

fn passthrough(s: &mut String, o: &POpts, r: &PResults) {
    if r.passthrough.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## 6. Overhead on non-Cascade files\n");
    let _ = writeln!(
        s,
        "One process writes and reads a tmpfs file with write()/read() of 64 B and 4 KiB, \
         cycling over its first {} (pages allocated during set-up; lseek back to 0 at the \
         end; cache-resident, so the system calls are as cheap as they get), each kind of call {} times in turn, the fastest of them counting (ns per \
         call); the same with and without `LD_PRELOAD` of the library (which then only \
         passes the calls through); {} pairs of processes, which one runs first \
         alternating. Overhead = with / without − 1, per pair.\n",
        size_str(o.pass_region),
        crate::preload::PASS_ROUNDS,
        o.pass_reps
    );
    let _ = writeln!(
        s,
        "| call | calls | without library (ns/call) | with library (ns/call) | overhead |\n|---|---|---|---|---|"
    );
    for x in &r.passthrough {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:+.1} % [{:+.1}–{:+.1}] |",
            x.op,
            count(x.calls as f64),
            st_prec(&x.plain_ns, 0),
            st_prec(&x.preload_ns, 0),
            (x.ratio.median - 1.0) * 100.0,
            (x.ratio.min - 1.0) * 100.0,
            (x.ratio.max - 1.0) * 100.0
        );
    }
}
