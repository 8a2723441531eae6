//! Small formatting helpers for CLI output.

use cascade_store::{FileKind, TimeNs};

/// "2026-11-21 09:18:01 UTC" for nanoseconds since the epoch (UTC, so no time-zone database
/// is needed and output is the same on every node).
pub fn time(ns: TimeNs) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = cascade_observe::log::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// "drwxr-xr-x" as ls prints it.
pub fn mode(kind: FileKind, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(if kind == FileKind::Dir { 'd' } else { '-' });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// Joins a store directory and an entry name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// Percentage of `part` in `whole`, "0.0" when whole is zero.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0".to_string()
    } else {
        format!("{:.1}", part as f64 * 100.0 / whole as f64)
    }
}

/// `-v` and `-q` (global flags) for the commands that report what they moved: set once by
/// `main`, read where a summary or a per-file line is printed.
static VERBOSITY: std::sync::atomic::AtomicI8 = std::sync::atomic::AtomicI8::new(0);

pub fn set_verbosity(verbose: bool, quiet: bool) {
    let level = i8::from(verbose) - i8::from(quiet);
    VERBOSITY.store(level, std::sync::atomic::Ordering::Relaxed);
}

/// Prints a command's summary line on standard output, unless `-q`.
pub fn summary_line(line: &str) {
    if VERBOSITY.load(std::sync::atomic::Ordering::Relaxed) >= 0 {
        println!("{line}");
    }
}

/// Prints a line of detail on standard output with `-v`.
pub fn detail_line(line: &str) {
    if VERBOSITY.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        println!("{line}");
    }
}

/// Whether `-q` was given.
pub fn quiet() -> bool {
    VERBOSITY.load(std::sync::atomic::Ordering::Relaxed) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time(951_782_400 * 1_000_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(time(1_700_000_000_123_456_789), "2023-11-14 22:13:20 UTC");
        assert_eq!(time(-1_000_000_000), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn formats_modes_like_ls() {
        assert_eq!(mode(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode(FileKind::File, 0o640), "-rw-r-----");
    }

    #[test]
    fn joins_store_paths() {
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/ckpt", "a"), "/ckpt/a");
        assert_eq!(percent(1, 4), "25.0");
        assert_eq!(percent(1, 0), "0.0");
    }
}
