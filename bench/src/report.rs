//! The one results writer. A suite hands over its report (header, options, results) and its
//! tables; `<suite>.json` gets all of it, and `<suite>.md` is rendered from that JSON: a header
//! naming the machine, the targets and verdicts, the tables. What each table measures and how
//! is described once, in bench/README.md.

use crate::util::{self, Context, CpuSnap, Interference, Machine, Res};
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A goal of the suite and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub goal: String,
    pub measured: String,
    /// None when the benchmark was not run.
    pub met: Option<bool>,
}

impl Target {
    pub fn new(name: &str, goal: &str, measured: String, met: Option<bool>) -> Target {
        let (name, goal) = (name.to_string(), goal.to_string());
        Target {
            name,
            goal,
            measured,
            met,
        }
    }
}

/// One markdown table: a title, the column heads, the cells.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with the column heads of `head`, "a | b | c".
    pub fn new(title: impl Into<String>, head: &str) -> Table {
        let (title, head, rows) = (title.into(), cells(head), Vec::new());
        Table { title, head, rows }
    }

    /// A table with the column heads `head`.
    pub fn with_head<S: ToString>(title: impl Into<String>, head: &[S]) -> Table {
        let (title, rows) = (title.into(), Vec::new());
        let head = head.iter().map(S::to_string).collect();
        Table { title, head, rows }
    }

    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows
            .push(cells.into_iter().map(|c| c.to_string()).collect());
    }

    /// A two-column table of names and values.
    pub fn pairs<S: ToString>(title: &str, pairs: impl IntoIterator<Item = (S, S)>) -> Table {
        let mut t = Table::with_head(title, &["", ""]);
        for (k, v) in pairs {
            t.row([k.to_string(), v.to_string()]);
        }
        t
    }
}

/// Builds a suite's tables row by row: a title, a head line, rows ("| a | b |"), and verdict
/// lines.
#[derive(Default)]
pub struct Md {
    pub tables: Vec<Table>,
    pub verdicts: Vec<String>,
    pub title: String,
}

impl Md {
    /// The title of the tables that follow.
    pub fn title(&mut self, title: String) {
        self.title = title;
    }

    /// Starts a table with the head line "| a | b |".
    pub fn head(&mut self, line: &str) {
        let (title, head, rows) = (self.title.clone(), cells(line), Vec::new());
        self.tables.push(Table { title, head, rows });
    }

    /// A row "| a | b |" of the current table.
    pub fn row(&mut self, line: String) {
        if let Some(t) = self.tables.last_mut() {
            t.rows.push(cells(&line));
        }
    }

    pub fn verdict(&mut self, line: String) {
        self.verdicts.push(line);
    }

    pub fn push(&mut self, t: Table) {
        self.tables.push(t);
    }
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split(" | ").map(|c| c.trim().to_string()).collect()
}

/// What every report starts with: when, from which source, on which machine, how quiet it was.
#[derive(Debug, Serialize)]
pub struct Header {
    pub generated_utc: String,
    pub duration_s: f64,
    pub command: String,
    /// Git commit of the workspace that was measured.
    pub source: String,
    pub machine: Machine,
    pub interference: Interference,
    /// CPU of the S3 server of bench/netns-s3.sh during the run, % of all cores: part of what
    /// is measured, so not counted as interference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3_server_cpu_pct: Option<f64>,
}

/// A suite run from its start: the machine, the CPU counters and the clock.
pub struct RunClock {
    pub machine: Machine,
    load0: String,
    cpu0: CpuSnap,
    t0: u64,
    started: u64,
    server0: Option<u64>,
}

impl RunClock {
    pub fn start(disk_dir: &Path, spill_dir: &Path) -> RunClock {
        let machine = util::machine(disk_dir, spill_dir);
        eprintln!(
            "cascade-bench: {} ({} cores), kernel {}, {} GiB RAM; names {}-*",
            machine.cpu_model,
            machine.cores,
            machine.kernel,
            machine.ram_gib,
            util::prefix(std::process::id())
        );
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let server0 = crate::net::server_ticks();
        let (load0, cpu0, t0) = (util::loadavg(), util::cpu_snap(), util::now_ns());
        RunClock {
            machine,
            load0,
            cpu0,
            t0,
            started,
            server0,
        }
    }

    pub fn elapsed_s(&self) -> f64 {
        (util::now_ns() - self.t0) as f64 / 1e9
    }

    /// The header at the end of the run, naming the source `source_dirs` of the workspace.
    pub fn finish(self, source_dirs: &[&str]) -> Header {
        let duration_s = self.elapsed_s();
        let cores = self.machine.cores;
        let mut interference = util::interference(&self.cpu0, &util::cpu_snap(), cores, self.load0);
        let s3_server_cpu_pct = match (self.server0, crate::net::server_ticks()) {
            (Some(a), Some(b)) => {
                let wall_ticks = duration_s * 100.0 * cores.max(1) as f64;
                Some((b.saturating_sub(a) as f64 / wall_ticks * 1000.0).round() / 10.0)
            }
            _ => None,
        };
        if let Some(own) = s3_server_cpu_pct {
            let other = (interference.other_cpu_pct - own).max(0.0);
            interference.other_cpu_pct = (other * 10.0).round() / 10.0;
        }
        if interference.other_cpu_pct > 10.0 {
            eprintln!(
                "warning: other processes used {:.0} % of the CPUs during the run; numbers are disturbed",
                interference.other_cpu_pct
            );
        }
        Header {
            generated_utc: utc_string(self.started),
            duration_s,
            command: command_line(),
            source: source_version_of(source_dirs),
            machine: self.machine,
            interference,
            s3_server_cpu_pct,
        }
    }
}

/// Writes `<out>/<name>.json` (the report with its tables) and `<out>/<name>.md` rendered from
/// that JSON, then prints the targets and the files written on stderr.
pub fn write(out: &Path, name: &str, title: &str, rep: &impl Serialize, md: Md) -> Res<()> {
    let mut v = serde_json::to_value(rep).ctx(|| "encoding results as JSON")?;
    if let Value::Object(m) = &mut v {
        m.insert("verdicts".into(), md.verdicts.into());
        let t = serde_json::to_value(&md.tables).ctx(|| "encoding tables as JSON")?;
        m.insert("tables".into(), t);
    }
    let json = serde_json::to_string_pretty(&v).ctx(|| "encoding results as JSON")?;
    let md_path = out.join(format!("{name}.md"));
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&json_path, json + "\n").ctx(|| format!("writing {}", json_path.display()))?;
    std::fs::write(&md_path, markdown(name, title, &v))
        .ctx(|| format!("writing {}", md_path.display()))?;
    for t in v["targets"].as_array().into_iter().flatten() {
        let (name, goal) = (
            t["name"].as_str().unwrap_or(""),
            t["goal"].as_str().unwrap_or(""),
        );
        let measured = t["measured"].as_str().unwrap_or("");
        eprintln!(
            "  {name:<40} {goal:<50} {}\n      {measured}",
            met_word(&t["met"])
        );
    }
    let duration_s = v["duration_s"].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "wrote {} and {} ({duration_s:.0} s)",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}

fn met_word(met: &Value) -> &'static str {
    match met.as_bool() {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "not run",
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        v => v.to_string(),
    }
}

/// The markdown of a report's JSON: header, targets, verdicts, tables.
pub fn markdown(name: &str, title: &str, v: &Value) -> String {
    let mut s = format!("# {title}\n\n");
    let m = &v["machine"];
    let _ = writeln!(
        s,
        "{} ({} cores, {} GiB RAM), kernel {}. Suite {name} (`{}`) on {} UTC from {}; {:.0} \
         s. How it measures: bench/README.md.\n",
        text(&m["cpu_model"]),
        text(&m["cores"]),
        text(&m["ram_gib"]),
        text(&m["kernel"]),
        text(&v["command"]),
        text(&v["generated_utc"]),
        text(&v["source"]),
        v["duration_s"].as_f64().unwrap_or(f64::NAN)
    );
    let other = v["interference"]["other_cpu_pct"].as_f64().unwrap_or(0.0);
    if other > 10.0 {
        let _ = writeln!(
            s,
            "**Warning:** other processes used {other:.0} % of the CPUs.\n"
        );
    }
    let targets = v["targets"].as_array().cloned().unwrap_or_default();
    if !targets.is_empty() {
        let _ = writeln!(s, "| target | goal | measured | met |\n|---|---|---|---|");
        for t in &targets {
            let met = match t["met"].as_bool() {
                Some(true) => "**yes**",
                Some(false) => "**NO**",
                None => "not run",
            };
            let (n, g, x) = (text(&t["name"]), text(&t["goal"]), text(&t["measured"]));
            let _ = writeln!(s, "| {n} | {g} | {x} | {met} |");
        }
        s.push('\n');
    }
    let verdicts = v["verdicts"].as_array().cloned().unwrap_or_default();
    for line in &verdicts {
        let _ = writeln!(s, "- {}", text(line));
    }
    if !verdicts.is_empty() {
        s.push('\n');
    }
    for t in v["tables"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "## {}\n", text(&t["title"]));
        let head: Vec<String> = t["head"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let _ = writeln!(
            s,
            "| {} |\n|{}",
            head.join(" | "),
            "---|".repeat(head.len())
        );
        for row in t["rows"].as_array().into_iter().flatten() {
            let cells: Vec<String> = row.as_array().into_iter().flatten().map(text).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s.push('\n');
    }
    s.truncate(s.trim_end().len());
    s.push('\n');
    s
}

/// The machine table every suite ends with: its facts, the suite's own rows (`extra`), and
/// how quiet the machine was during the run.
pub fn machine_table(h: &Header, extra: Vec<(String, String)>) -> Table {
    let (m, i) = (&h.machine, &h.interference);
    let mut rows = vec![
        (
            "CPU".to_string(),
            format!("{} ({} cores)", m.cpu_model, m.cores),
        ),
        ("kernel".into(), m.kernel.clone()),
        ("RAM".into(), format!("{} GiB", m.ram_gib)),
        (
            "transparent huge pages (anon / shmem)".into(),
            format!("{} / {}", m.thp_anon, m.thp_shmem),
        ),
        ("/dev/shm".into(), m.shm_fs.clone()),
    ];
    rows.extend(extra);
    rows.push((
        "CPU of other processes".into(),
        format!(
            "{:.1} % of all cores (steal {:.1} %); load {} at start, {} at end",
            i.other_cpu_pct, i.steal_pct, i.loadavg_start, i.loadavg_end
        ),
    ));
    rows.push((
        "waits for an idle machine".into(),
        format!(
            "{} of {} gave up after {:.1} s (median wait {:.2} s)",
            i.settle_timeouts, i.settles, i.settle_max_s, i.settle_median_s
        ),
    ));
    Table::pairs("Machine", rows)
}

/// "2025-01-31 12:34:56" for a Unix time in seconds (UTC; no time-zone database needed).
pub fn utc_string(unix: u64) -> String {
    let secs = unix % 86_400;
    let (y, m, d) = cascade_observe::log::civil_from_days((unix / 86_400) as i64);
    let (h, min, sec) = (secs / 3600, secs / 60 % 60, secs % 60);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{sec:02}")
}

/// "abc1234", or "abc1234 + uncommitted changes in crates/cascade-store, bench": what was
/// measured (changes to bench/results do not count).
pub fn source_version_of(dirs: &[&str]) -> String {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty: Vec<&str> = dirs
        .iter()
        .copied()
        .filter(|dir| {
            let exclude = format!(":(exclude){dir}/results");
            git(&["status", "--porcelain", "--", dir, &exclude]).is_some_and(|s| !s.is_empty())
        })
        .collect();
    if dirty.is_empty() {
        head
    } else {
        format!("{head} + uncommitted changes in {}", dirty.join(", "))
    }
}

/// "path (modified 2026-11-21 10:20:10 UTC)", or "path (missing)".
pub fn describe(p: &Path) -> String {
    let p: PathBuf = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let Ok(md) = std::fs::metadata(&p) else {
        return format!("{} (missing)", p.display());
    };
    let when = md
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| format!(" (modified {} UTC)", utc_string(d.as_secs())))
        .unwrap_or_default();
    format!("{}{when}", p.display())
}

/// The arguments of this run after the subcommand, with the value of --url (it holds the S3
/// secret) left out.
pub fn command_line() -> String {
    let mut out: Vec<String> = Vec::new();
    let mut hide_next = false;
    for arg in std::env::args().skip(2) {
        if hide_next {
            out.push("<hidden>".into());
            hide_next = false;
        } else if arg == "--url" {
            out.push(arg);
            hide_next = true;
        } else if arg.starts_with("--url=") {
            out.push("--url=<hidden>".into());
        } else {
            out.push(arg);
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_renders_targets_verdicts_and_tables_from_json() {
        let mut md = Md::default();
        md.verdict("fast enough".into());
        md.title("Speeds".into());
        md.head("| method | GB/s |");
        md.row("| memcpy | 12.00 |".into());
        let v = serde_json::json!({
            "machine": {"cpu_model": "CPU X", "cores": 2, "ram_gib": 4.0, "kernel": "6.1"},
            "command": "--quick", "generated_utc": "2026-01-01 00:00:00", "source": "abc1234",
            "duration_s": 3.0, "interference": {"other_cpu_pct": 1.0},
            "targets": [{"name": "writes", "goal": ">= 1x", "measured": "2x", "met": true}],
            "verdicts": md.verdicts, "tables": md.tables,
        });
        let out = markdown("demo", "Demo", &v);
        assert!(out.starts_with("# Demo\n\nCPU X (2 cores, 4.0 GiB RAM), kernel 6.1."));
        assert!(out.contains("| writes | >= 1x | 2x | **yes** |"));
        assert!(out.contains("- fast enough\n"));
        assert!(out.contains("## Speeds\n\n| method | GB/s |\n|---|---|\n| memcpy | 12.00 |\n"));
        assert!(!out.contains("Warning"));
    }
}
