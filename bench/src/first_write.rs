//! 1b. A job's first checkpoint: a process that attaches the store and writes at once, against
//! one that first waits until the store's pages are mapped into it. Measured on the host's
//! /dev/shm and again on a tmpfs that offers huge pages on request (`huge=advise`), mounted on
//! /dev/shm in a private mount namespace: the host's /dev/shm is never remounted (that would
//! change its superblock for every process on the machine). For that part cascade-bench runs
//! itself inside `unshare` (hidden `first-write-huge` subcommand), where it creates its own
//! store and children, and hands back one JSON line.

use crate::child::Job;
use crate::harness::run_group;
use crate::stores::{capacity_for, with_store_files, Creation};
use crate::util::{err, size_str, Context, Res, Stats, MIB};
use cascade_store::Store;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

/// The runs on one store.
#[derive(Debug, Clone, Serialize)]
pub struct FirstWrite {
    pub bytes: u64,
    pub fresh: Stats,
    pub mapped: Stats,
    /// The options /dev/shm was mounted with where the store lived (/proc/self/mounts).
    pub shm_mount: String,
    /// The store's memory.
    pub memory: u64,
    /// Bytes of the store the mapped-in processes mapped in 2 MiB pages (the least over the
    /// runs); None where their /proc/self/smaps could not be read.
    pub huge_page_bytes: Option<u64>,
}

impl FirstWrite {
    /// Fresh / mapped in, medians.
    pub fn ratio(&self) -> f64 {
        self.fresh.median / self.mapped.median
    }

    /// Whether the store's memory really was in 2 MiB pages.
    pub fn huge(&self) -> bool {
        self.huge_page_bytes.is_some_and(|b| b > 0)
    }

    /// The page size the store got, and how much of it is in 2 MiB pages.
    pub fn pages(&self) -> String {
        match self.huge_page_bytes {
            Some(0) => format!(
                "4 KiB pages (none of the store's {} in 2 MiB pages)",
                size_str(self.memory)
            ),
            Some(b) => format!(
                "2 MiB pages ({} of the store's {} in them)",
                size_str(b),
                size_str(self.memory)
            ),
            None => "page size unknown (smaps unreadable)".into(),
        }
    }

    /// "0.32x (7.89 vs 24.46 GB/s)", the ratio in bold if `bold`.
    fn measured(&self, bold: bool) -> String {
        let b = if bold { "**" } else { "" };
        format!(
            "{b}{:.2}x{b} ({:.2} vs {:.2} GB/s)",
            self.ratio(),
            self.fresh.median,
            self.mapped.median
        )
    }
}

/// The runs on a /dev/shm that offers huge pages, or why they did not happen.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HugeFirstWrite {
    Ran(FirstWrite),
    NotRun(String),
}

/// What one store's runs measured: the samples, handed back from the namespace as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct Samples {
    bytes: u64,
    fresh: Vec<f64>,
    mapped: Vec<f64>,
    shm_mount: String,
    memory: u64,
    huge_page_bytes: Option<u64>,
}

impl From<Samples> for FirstWrite {
    fn from(s: Samples) -> FirstWrite {
        FirstWrite {
            bytes: s.bytes,
            fresh: Stats::of(&s.fresh),
            mapped: Stats::of(&s.mapped),
            shm_mount: s.shm_mount,
            memory: s.memory,
            huge_page_bytes: s.huge_page_bytes,
        }
    }
}

/// The namespace's answer: its runs and its store's creation.
#[derive(Debug, Serialize, Deserialize)]
struct NsReport {
    samples: Samples,
    creation: Vec<Creation>,
}

/// The options /dev/shm is mounted with in this mount namespace (the last mount on it wins).
pub fn shm_mount_options() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"/dev/shm")).then(|| f.get(3).copied().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| "not mounted".into())
}

/// One process each, `reps` times, the order alternating: write `bytes` at once after
/// attaching (its pages still being mapped in by its populate thread), or after waiting for
/// that. `memory`: the store's memory, for the report.
pub fn runs(store: &Store, memory: u64, bytes: u64, io: u64, reps: usize) -> Res<Samples> {
    let (mut fresh, mut mapped) = (Vec::new(), Vec::new());
    let mut huge: Option<u64> = None;
    let mut smaps_ok = true;
    for rep in 0..reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let job = Job::StoreWrite {
                store: store.name().to_string(),
                path: format!("/fw-{rep}-{first}.dat"),
                bytes,
                io,
                sync: false,
                fresh: first,
                pages: !first,
            };
            let out = run_group(&[job]).ctx(|| "first write")?;
            let what = if first { "fresh process" } else { "mapped in" };
            crate::benches::report("first write", what, 1, rep, reps, out.gbps());
            if first {
                fresh.push(out.gbps());
                continue;
            }
            mapped.push(out.gbps());
            match out.children.first().and_then(|c| c.huge_page_bytes) {
                Some(b) => huge = Some(huge.map_or(b, |h| h.min(b))),
                None => smaps_ok = false,
            }
        }
    }
    Ok(Samples {
        bytes,
        fresh,
        mapped,
        shm_mount: shm_mount_options(),
        memory,
        huge_page_bytes: huge.filter(|_| smaps_ok),
    })
}

/// The options of the hidden `first-write-huge` subcommand (set by [`on_huge_pages`]).
#[derive(clap::Args, Debug)]
pub struct HugeArgs {
    #[arg(long)]
    bytes: u64,
    #[arg(long)]
    io: u64,
    #[arg(long)]
    reps: usize,
    #[arg(long)]
    chunk_size: u64,
    /// The suite's process: the parent, and the owner in the store's name.
    #[arg(long)]
    pid: u32,
}

/// The same runs on a fresh tmpfs with `huge=advise` on /dev/shm in a private mount
/// namespace; the store's creation goes into `creation`. Never fails: what went wrong is
/// the answer ("not run: why"), so the rest of the suite still runs.
pub fn on_huge_pages(
    bytes: u64,
    io: u64,
    reps: usize,
    chunk_size: u64,
    pid: u32,
    creation: &mut Vec<Creation>,
) -> HugeFirstWrite {
    eprintln!(
        "1b. the same on a tmpfs with huge=advise on /dev/shm, in a private mount namespace:"
    );
    let args = HugeArgs {
        bytes,
        io,
        reps,
        chunk_size,
        pid,
    };
    match in_namespace(&args) {
        Ok(r) => {
            creation.extend(r.creation);
            HugeFirstWrite::Ran(r.samples.into())
        }
        Err(e) => {
            // SAFETY: geteuid has no preconditions.
            let root = unsafe { libc::geteuid() } == 0;
            let why = if root {
                e.to_string()
            } else {
                format!("needs root for the mount namespace and the tmpfs: {e}")
            };
            eprintln!("  not run: {why}");
            HugeFirstWrite::NotRun(why)
        }
    }
}

/// Runs `cascade-bench first-write-huge` under `unshare --mount`, after mounting the tmpfs;
/// its progress goes to our stderr, its answer comes on its stdout.
fn in_namespace(a: &HugeArgs) -> Res<NsReport> {
    let exe = std::env::current_exe().ctx(|| "finding the bench executable")?;
    // Room for the store (its metadata is small); tmpfs allocates pages only as they are
    // written, and they all go when the namespace's last process exits.
    let tmpfs_mib = (2 * capacity_for(a.bytes, a.chunk_size)).div_ceil(MIB);
    let script =
        format!("mount -t tmpfs -o huge=advise,size={tmpfs_mib}m tmpfs /dev/shm && exec \"$@\"");
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg("sh")
        .arg(&exe)
        .arg("first-write-huge");
    for (k, v) in [
        ("--bytes", a.bytes.to_string()),
        ("--io", a.io.to_string()),
        ("--reps", a.reps.to_string()),
        ("--chunk-size", a.chunk_size.to_string()),
        ("--pid", a.pid.to_string()),
    ] {
        cmd.arg(k).arg(v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ctx(|| "spawning unshare")?;
    // Forward its stderr as it comes, keeping the last line: why it failed, if it does.
    let stderr = child.stderr.take();
    let fwd = std::thread::spawn(move || {
        let mut last = String::new();
        for line in stderr.into_iter().flat_map(|e| BufReader::new(e).lines()) {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            if !line.trim().is_empty() {
                last = line;
            }
        }
        last
    });
    let mut out = String::new();
    let read = child.stdout.take().map(|mut s| s.read_to_string(&mut out));
    let status = child.wait().ctx(|| "waiting for unshare")?;
    let last = fwd.join().unwrap_or_default();
    if !status.success() {
        return err(format!("{} ({status})", last.trim()));
    }
    if let Some(Err(e)) = read {
        return err(format!("reading its answer: {e}"));
    }
    let Some(line) = out.lines().rev().find(|l| l.starts_with('{')) else {
        return err("it printed no result");
    };
    serde_json::from_str(line).ctx(|| format!("parsing its answer {line:?}"))
}

/// The `first-write-huge` subcommand, inside the namespace: checks that /dev/shm here offers
/// huge pages, creates and burns in a store, runs [`runs`], destroys the store and prints
/// the answer.
pub fn run_in_namespace(a: HugeArgs) -> Res<()> {
    // Die with the suite, whose child this is (unshare and sh exec): an interrupted run must
    // not go on measuring for nobody. Its children see EOF on their stdin and exit too.
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets which signal this process gets; no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    if std::os::unix::process::parent_id() != a.pid {
        return err("the suite that started this is gone");
    }
    let mount = shm_mount_options();
    if !mount.split(',').any(|o| o == "huge=advise") {
        return err(format!(
            "/dev/shm here is mounted {mount}, without huge=advise"
        ));
    }
    let capacity = capacity_for(a.bytes, a.chunk_size);
    let mut creation = Vec::new();
    let samples = with_store_files(
        &mut creation,
        a.pid,
        "huge",
        capacity,
        a.chunk_size,
        4096,
        None,
        |_, store| runs(store, capacity, a.bytes, a.io, a.reps),
    )?;
    let line =
        serde_json::to_string(&NsReport { samples, creation }).ctx(|| "encoding the answer")?;
    println!("{line}");
    Ok(())
}

/// The target's measured text and whether it is met: on the host's /dev/shm (4 KiB pages
/// there unless the administrator enabled huge pages) and on the huge-page tmpfs.
pub fn target(host: Option<&FirstWrite>, huge: Option<&HugeFirstWrite>) -> (String, Option<bool>) {
    let Some(h) = host else {
        return ("not run".into(), None);
    };
    let host_met = h.ratio() >= 0.8;
    let mut text = format!(
        "host /dev/shm, {}: {}",
        if h.huge() {
            "2 MiB pages"
        } else {
            "4 KiB pages"
        },
        h.measured(host_met)
    );
    if !h.huge() && !host_met {
        text.push_str(", bound by populating 4 KiB page tables");
    }
    let mut huge_met = false;
    match huge {
        Some(HugeFirstWrite::Ran(g)) if g.huge() => {
            huge_met = g.ratio() >= 0.8;
            let m = g.measured(true);
            text.push_str(&format!(
                "; tmpfs huge=advise, {} of {} in 2 MiB pages: {m}",
                size_str(g.huge_page_bytes.unwrap_or(0)),
                size_str(g.memory)
            ));
        }
        Some(HugeFirstWrite::Ran(g)) => text.push_str(&format!(
            "; tmpfs huge=advise: the store got no huge pages ({}), {}",
            g.pages(),
            g.measured(false)
        )),
        Some(HugeFirstWrite::NotRun(why)) => {
            text.push_str(&format!("; huge pages: not run ({why})"))
        }
        None => {}
    }
    if huge_met && !host_met {
        text.push_str(
            "; met only with huge pages, which the administrator enables (docs/operations.md)",
        );
    }
    (text, Some(host_met || huge_met))
}

/// The rows of table 1b for one store: fresh, then mapped in.
pub fn rows(t: &mut crate::report::Table, shm: &str, fw: &FirstWrite) {
    use crate::format::st;
    t.row([
        format!("{shm}: {}", fw.pages()),
        "fresh: writes at once (its populate thread and its writes map the pages)".into(),
        st(&fw.fresh),
        format!("{:.2}x", fw.ratio()),
    ]);
    t.row([
        "(the same store)".into(),
        "mapped in: waits until the store's pages are mapped into it".into(),
        st(&fw.mapped),
        "1.00x".into(),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw(fresh: f64, mapped: f64, huge_page_bytes: Option<u64>) -> FirstWrite {
        FirstWrite {
            bytes: 1 << 30,
            fresh: Stats::of(&[fresh]),
            mapped: Stats::of(&[mapped]),
            shm_mount: "rw".into(),
            memory: 1152 << 20,
            huge_page_bytes,
        }
    }

    /// The target is met by the huge-page run only when its store really had huge pages, and
    /// the text then says that only huge pages meet it.
    #[test]
    fn the_target_counts_huge_pages_only_where_the_store_got_them() {
        let host = fw(7.9, 24.5, Some(0));
        let huge = HugeFirstWrite::Ran(fw(21.3, 23.3, Some(1152 << 20)));
        let (text, met) = target(Some(&host), Some(&huge));
        assert_eq!(met, Some(true), "{text}");
        assert!(text.contains("4 KiB pages: 0.32x"), "{text}");
        assert!(
            text.contains("1152 MiB of 1152 MiB in 2 MiB pages: **0.91x**"),
            "{text}"
        );
        assert!(text.contains("met only with huge pages"), "{text}");

        let none = HugeFirstWrite::Ran(fw(21.3, 23.3, Some(0)));
        let (text, met) = target(Some(&host), Some(&none));
        assert_eq!(met, Some(false), "{text}");
        assert!(text.contains("got no huge pages"), "{text}");

        let not_run = HugeFirstWrite::NotRun("no unshare".into());
        let (text, met) = target(Some(&host), Some(&not_run));
        assert_eq!(met, Some(false), "{text}");
        assert!(text.contains("huge pages: not run (no unshare)"), "{text}");
        assert_eq!(target(None, Some(&huge)), ("not run".into(), None));
    }

    /// What the namespace prints is what the suite reads back.
    #[test]
    fn the_namespace_answer_round_trips() {
        let r = NsReport {
            samples: Samples {
                bytes: 1 << 30,
                fresh: vec![21.0, 20.5],
                mapped: vec![23.0, 22.0],
                shm_mount: "rw,relatime,size=2304m,huge=advise".into(),
                memory: 1152 << 20,
                huge_page_bytes: Some(1152 << 20),
            },
            creation: Vec::new(),
        };
        let line = serde_json::to_string(&r).expect("encodes");
        let back: NsReport = serde_json::from_str(&line).expect("decodes");
        let f = FirstWrite::from(back.samples);
        assert_eq!((f.fresh.median, f.mapped.median), (20.75, 22.5));
        assert!(f.huge());
        assert!(f
            .pages()
            .starts_with("2 MiB pages (1152 MiB of the store's 1152 MiB"));
    }
}
