//! Log events of the agent and the staging server: `tracing` events written to stderr one
//! line each, with an RFC 3339 timestamp (UTC) and the level, as text or as JSON (for log
//! collectors); lines that repeat are collapsed.
//!
//! Code that may run without [`init`] (libraries embedded in `cascade run` or in Python) logs
//! through [`info!`](crate::info) / [`warn!`](crate::warn) / [`error!`](crate::error): once
//! `init` ran they are `tracing` events, before that (or without it) plain `eprintln!` lines,
//! as those programs always printed them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// How a line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `2026-01-02T03:04:05.678901Z  WARN message key=value`
    Text,
    /// `{"timestamp":"...","level":"WARN","target":"...","message":"...",...}`
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err("expected text or json".into()),
        }
    }
}

/// What [`init`] sets up.
#[derive(Debug, Clone)]
pub struct LogOptions {
    pub format: Format,
    /// An `EnvFilter` directive list: a level (`info`), or per target
    /// (`warn,cascade_agent=debug`).
    pub filter: String,
    /// Warnings and errors alike (same place, same text up to its numbers) shown per
    /// `window`; the rest are counted and reported as one line "... (repeated K times)".
    /// 0 = no limit.
    pub repeats: u32,
    pub window: Duration,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions {
            format: Format::Text,
            filter: "info".into(),
            repeats: 5,
            window: Duration::from_secs(60),
        }
    }
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether [`init`] installed the subscriber (the macros log through `tracing` then).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Installs the process's subscriber. Keep the guard until the end: dropping it reports the
/// repeats still held back.
pub fn init(opts: &LogOptions) -> Result<Guard, String> {
    let filter = EnvFilter::builder()
        .parse(&opts.filter)
        .map_err(|e| format!("log filter {:?}: {e}", opts.filter))?;
    let lines = Arc::new(Lines {
        format: opts.format,
        limit: Mutex::new(Limit {
            repeats: opts.repeats,
            window: opts.window,
            kinds: HashMap::new(),
            swept: Instant::now(),
        }),
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(LineLayer(lines.clone()))
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))?;
    INSTALLED.store(true, Ordering::Relaxed);
    Ok(Guard(lines))
}

/// Reports held-back repeats when dropped (at the end of `main`).
pub struct Guard(Arc<Lines>);

impl Drop for Guard {
    fn drop(&mut self) {
        let held = std::mem::take(&mut lock(&self.0.limit).kinds);
        for (_, kind) in held {
            if let Some(line) = kind.summary() {
                self.0.write(&line);
            }
        }
    }
}

/// An event as it is written.
#[derive(Debug, Clone)]
struct Line {
    level: Level,
    target: &'static str,
    message: String,
    fields: Vec<(&'static str, String)>,
    /// Alike lines not shown before this one.
    repeated: u64,
}

struct Lines {
    format: Format,
    limit: Mutex<Limit>,
}

struct Limit {
    repeats: u32,
    window: Duration,
    /// Per kind of line (call site, text with digits masked): its window.
    kinds: HashMap<(usize, String), Kind>,
    swept: Instant,
}

struct Kind {
    since: Instant,
    shown: u32,
    hidden: u64,
    /// The last line hidden (what the summary shows).
    last: Option<Line>,
}

impl Kind {
    fn summary(self) -> Option<Line> {
        let mut line = self.last?;
        line.repeated = self.hidden;
        Some(line)
    }
}

/// Kinds tracked at most: past that, new kinds are shown untracked (a flood of distinct
/// lines is not what this limits, and the table must not grow without bound).
const MAX_KINDS: usize = 4096;

impl Limit {
    /// Whether `line` (from call site `site`) is shown, and summaries of windows that ended.
    fn admit(&mut self, site: usize, line: &Line) -> (bool, Vec<Line>) {
        // Info and below are one line per event by design (`-v`: a line per file); what
        // repeats without bound is failures, a retry loop against a dead server.
        if self.repeats == 0 || line.level > Level::WARN {
            return (true, Vec::new());
        }
        let now = Instant::now();
        let mut summaries = Vec::new();
        // Windows that ended are reported and forgotten now and then, not only when a line
        // of their kind comes again (it may never come).
        if now.duration_since(self.swept) >= self.window / 4 {
            self.swept = now;
            let window = self.window;
            let ended: Vec<(usize, String)> = self
                .kinds
                .iter()
                .filter(|(_, k)| now.duration_since(k.since) >= window)
                .map(|(key, _)| key.clone())
                .collect();
            for key in ended {
                if let Some(line) = self.kinds.remove(&key).and_then(Kind::summary) {
                    summaries.push(line);
                }
            }
        }
        let key = (site, mask_digits(&line.message));
        let full = self.kinds.len() >= MAX_KINDS;
        match self
            .kinds
            .get(&key)
            .map(|k| now.duration_since(k.since) >= self.window)
        {
            Some(true) => {
                if let Some(k) = self.kinds.get_mut(&key) {
                    if let Some(summary) = std::mem::replace(k, Kind::new(now)).summary() {
                        summaries.push(summary);
                    }
                }
            }
            Some(false) => {}
            None if full => return (true, summaries),
            None => {
                self.kinds.insert(key.clone(), Kind::new(now));
            }
        }
        let Some(kind) = self.kinds.get_mut(&key) else {
            return (true, summaries);
        };
        if kind.shown < self.repeats {
            kind.shown += 1;
            (true, summaries)
        } else {
            kind.hidden += 1;
            kind.last = Some(line.clone());
            (false, summaries)
        }
    }
}

impl Kind {
    fn new(now: Instant) -> Kind {
        Kind {
            since: now,
            shown: 0,
            hidden: 0,
            last: None,
        }
    }
}

/// "upload of /c.7 failed (attempt 3)" and "(attempt 4)" are the same kind of line.
fn mask_digits(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

impl Lines {
    fn write(&self, line: &Line) {
        let text = match self.format {
            Format::Text => text_line(line),
            Format::Json => json_line(line),
        };
        // One write per line, so that lines of concurrent threads do not interleave.
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

fn text_line(line: &Line) -> String {
    let mut out = format!("{} {:>5} ", timestamp(SystemTime::now()), line.level);
    out.push_str(&one_line(&line.message));
    for (k, v) in &line.fields {
        let _ = write!(out, " {k}={}", one_line(v));
    }
    if line.repeated > 0 {
        let _ = write!(out, " (repeated {} times)", line.repeated);
    }
    out.push('\n');
    out
}

fn json_line(line: &Line) -> String {
    // Built in this order (timestamp, level, target, message, then the event's own fields)
    // for people reading the raw lines; each value is escaped by serde_json.
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let mut message = line.message.clone();
    if line.repeated > 0 {
        let _ = write!(message, " (repeated {} times)", line.repeated);
    }
    let mut out = format!(
        "{{\"timestamp\":{},\"level\":{},\"target\":{},\"message\":{}",
        text(&timestamp(SystemTime::now())),
        text(line.level.as_str()),
        text(line.target),
        text(&message)
    );
    if line.repeated > 0 {
        let _ = write!(out, ",\"repeated\":{}", line.repeated);
    }
    let reserved = ["timestamp", "level", "target", "message", "repeated"];
    for (k, v) in line.fields.iter().filter(|(k, _)| !reserved.contains(k)) {
        let _ = write!(out, ",{}:{}", text(k), text(v));
    }
    out.push_str("}\n");
    out
}

/// A message on one line whatever it holds.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\n', '\r']) {
        s.replace('\n', "\\n").replace('\r', "\\r").into()
    } else {
        s.into()
    }
}

/// RFC 3339 in UTC with microseconds: 2026-01-02T03:04:05.678901Z.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_micros()
    )
}

/// Year, month, day of a day count since 1970-01-01 (Howard Hinnant's algorithm, proleptic
/// Gregorian calendar; `cascade ls -l` and `stat` use it too).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

struct LineLayer(Arc<Lines>);

impl<S: Subscriber> Layer<S> for LineLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = Line {
            level: *meta.level(),
            target: meta.target(),
            message: fields.message,
            fields: fields.others,
            repeated: 0,
        };
        // A callsite's metadata is a static: its address names the place in the code.
        let site = meta as *const _ as usize;
        let (show, summaries) = lock(&self.0.limit).admit(site, &line);
        for s in &summaries {
            self.0.write(s);
        }
        if show {
            self.0.write(&line);
        }
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.others.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.others.push((field.name(), text));
        }
    }
}

/// A poisoned lock only means a thread panicked while logging: the table is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An info event ([`tracing::info!`]), or an `eprintln!` line where no subscriber was set
/// up with [`init`].
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        if $crate::log::installed() {
            $crate::tracing::info!($($arg)+)
        } else {
            ::std::eprintln!($($arg)+)
        }
    };
}

/// A warning ([`tracing::warn!`]), or an `eprintln!` line without [`init`].
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        if $crate::log::installed() {
            $crate::tracing::warn!($($arg)+)
        } else {
            ::std::eprintln!($($arg)+)
        }
    };
}

/// An error ([`tracing::error!`]), or an `eprintln!` line without [`init`].
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        if $crate::log::installed() {
            $crate::tracing::error!($($arg)+)
        } else {
            ::std::eprintln!($($arg)+)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::new(1_704_164_645, 678_901_000);
        assert_eq!(timestamp(t), "2024-01-02T03:04:05.678901Z");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(timestamp(leap), "2000-02-29T00:00:00.000000Z");
    }

    fn line(message: &str) -> Line {
        Line {
            level: Level::WARN,
            target: "t",
            message: message.into(),
            fields: Vec::new(),
            repeated: 0,
        }
    }

    #[test]
    fn repeats_past_the_limit_are_counted_and_summarised() {
        let mut limit = Limit {
            repeats: 2,
            window: Duration::from_secs(3600),
            kinds: HashMap::new(),
            swept: Instant::now(),
        };
        let shown: Vec<bool> = (0..5)
            .map(|i| limit.admit(1, &line(&format!("attempt {i} failed"))).0)
            .collect();
        assert_eq!(shown, [true, true, false, false, false]);
        // Another place, or other text, is another kind.
        assert!(limit.admit(2, &line("attempt 9 failed")).0);
        assert!(limit.admit(1, &line("something else")).0);
        // Info lines are never held back.
        let mut info = line("attempt 1 failed");
        info.level = Level::INFO;
        assert!((0..5).all(|_| limit.admit(1, &info).0));
        let held = std::mem::take(&mut limit.kinds);
        let summaries: Vec<Line> = held.into_values().filter_map(Kind::summary).collect();
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].repeated, 3);
        assert_eq!(summaries[0].message, "attempt 4 failed");
        assert!(text_line(&summaries[0]).ends_with(" (repeated 3 times)\n"));
        let mut with_field = summaries[0].clone();
        with_field.fields.push(("path", "/a\"b".into()));
        let json: serde_json::Value =
            serde_json::from_str(&json_line(&with_field)).expect("JSON line");
        assert_eq!(json["message"], "attempt 4 failed (repeated 3 times)");
        assert_eq!(json["repeated"], 3);
        assert_eq!(json["path"], "/a\"b");
        assert_eq!(json["level"], "WARN");
    }
}
