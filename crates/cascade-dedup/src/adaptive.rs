//! The adaptive zstd level (`dedup.compress = auto`, docs/dedup.md, "Adaptive level"): after
//! each checkpoint a writer stored, the agent compares how long its own ingest (cutting,
//! hashing, compressing: the CPU) took with how long the durable store took to acknowledge the
//! packs (the link), and compresses one level harder for the next checkpoint only while the
//! link is the bottleneck, one level lighter while the CPU is — and goes back and stays below
//! a level whose step up did not shrink the new data by at least [`MIN_GAIN`] (data like
//! LAMMPS restarts, where harder levels cost CPU for a few per mille). Decisions depend only
//! on the measured figures handed in, so they are tested without timing.

use crate::compress::ZSTD_LEVELS;

/// The level the agent starts at, and never goes below, with `auto`: the fastest level that
/// keeps the reduction goals on the bench series (bench/results/dedup.md, "Choosing the
/// default").
pub const AUTO_MIN_LEVEL: i32 = -2;
/// The hardest level `auto` goes to: past it zstd costs several times the CPU for a few
/// per cent of size on checkpoint data.
pub const AUTO_MAX_LEVEL: i32 = 6;
/// The link must take this much longer than the CPU before the level goes up (hysteresis:
/// a harder level costs CPU time, and a level that only just makes the link the bottleneck
/// must not flip back and forth).
pub const RAISE_WHEN_LINK_OVER_CPU: f64 = 1.25;
/// The CPU must take this much longer than the link before the level goes down.
pub const LOWER_WHEN_CPU_OVER_LINK: f64 = 1.05;
/// Checkpoints smaller than this (file bytes) say too little about rates: the level stays.
pub const MIN_SAMPLE_BYTES: u64 = 8 << 20;
/// A step up must shrink what is uploaded per byte of new data by at least this share, else
/// the level goes back and the step is not tried again for [`RETRY_AFTER`] checkpoints.
pub const MIN_GAIN: f64 = 0.02;
/// Checkpoints after which a level that did not pay is tried again (the data may change).
pub const RETRY_AFTER: u32 = 16;

/// What one checkpoint's store cost: the bytes the writer took in and the seconds its ingest
/// worked (wall time less the time it waited for uploads), and the bytes the durable store
/// acknowledged and the seconds at least one upload was in flight.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Measured {
    pub input_bytes: u64,
    pub ingest_seconds: f64,
    pub uploaded_bytes: u64,
    pub upload_seconds: f64,
    /// Bytes of the chunks the repository lacked (what compression worked on).
    pub new_bytes: u64,
}

impl Measured {
    /// Bytes uploaded per byte of new data, when there was enough new data to tell.
    pub fn stored_fraction(&self) -> Option<f64> {
        (self.new_bytes >= MIN_SAMPLE_BYTES)
            .then(|| self.uploaded_bytes as f64 / self.new_bytes as f64)
    }

    /// Ingest rate, bytes of file data per second of the writer's own work.
    pub fn ingest_rate(&self) -> Option<f64> {
        rate(self.input_bytes, self.ingest_seconds)
    }

    /// Upload rate, bytes the durable store acknowledged per second of uploading.
    pub fn upload_rate(&self) -> Option<f64> {
        rate(self.uploaded_bytes, self.upload_seconds)
    }

    /// Which side bounded this checkpoint, or None when the sample is too small to say.
    pub fn bottleneck(&self) -> Option<Bottleneck> {
        if self.input_bytes < MIN_SAMPLE_BYTES
            || !self.ingest_seconds.is_finite()
            || !self.upload_seconds.is_finite()
            || self.ingest_seconds <= 0.0
        {
            return None;
        }
        let (cpu, link) = (self.ingest_seconds, self.upload_seconds.max(0.0));
        Some(if link > cpu * RAISE_WHEN_LINK_OVER_CPU {
            Bottleneck::Link
        } else if cpu > link * LOWER_WHEN_CPU_OVER_LINK {
            Bottleneck::Cpu
        } else {
            Bottleneck::Balanced
        })
    }
}

fn rate(bytes: u64, seconds: f64) -> Option<f64> {
    (seconds > 0.0 && seconds.is_finite()).then(|| bytes as f64 / seconds)
}

/// Which side a checkpoint's store waited on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bottleneck {
    /// Uploads took clearly longer than the ingest: compressing harder saves link time.
    Link,
    /// The ingest took longer than the uploads: compressing lighter saves CPU time.
    Cpu,
    /// Within the hysteresis band: keep the level.
    Balanced,
}

/// The zstd level next to `level` in direction `up` (zstd has no level 0: -1 and 1 are
/// neighbours), kept within `min ..= max` and the levels specs accept.
pub fn step_level(level: i32, up: bool, min: i32, max: i32) -> i32 {
    let next = match (up, level) {
        (true, -1) => 1,
        (false, 1) => -1,
        (true, l) => l + 1,
        (false, l) => l - 1,
    };
    let (lo, hi) = bounds(min, max);
    if (lo..=hi).contains(&next) && next != 0 {
        next
    } else {
        clamp_level(level, min, max)
    }
}

/// `min ..= max` within the levels specs accept (and never empty).
fn bounds(min: i32, max: i32) -> (i32, i32) {
    let lo = min.clamp(*ZSTD_LEVELS.start(), *ZSTD_LEVELS.end());
    (lo, max.clamp(lo, *ZSTD_LEVELS.end()))
}

/// `level` brought within `min ..= max` (and never 0, which zstd has no fast level for).
pub fn clamp_level(level: i32, min: i32, max: i32) -> i32 {
    let (lo, hi) = bounds(min, max);
    match level.clamp(lo, hi) {
        0 if hi >= 1 => 1,
        0 => -1,
        l => l,
    }
}

/// The level for the next checkpoint, after one stored at `level` that measured `m`: one
/// harder while the link is the bottleneck, one lighter while the CPU is, else the same;
/// always within `min ..= max`.
pub fn next_level(level: i32, min: i32, max: i32, m: &Measured) -> i32 {
    match m.bottleneck() {
        Some(Bottleneck::Link) => step_level(level, true, min, max),
        Some(Bottleneck::Cpu) => step_level(level, false, min, max),
        Some(Bottleneck::Balanced) | None => clamp_level(level, min, max),
    }
}

/// The adaptive level across checkpoints: [`next_level`] on the bottleneck, plus a ceiling
/// learnt from steps up that did not pay.
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    pub level: i32,
    pub min: i32,
    pub max: i32,
    /// The highest level to step up to for now (below `max` after a step that did not pay).
    pub ceiling: i32,
    /// Checkpoints since the ceiling came down.
    held: u32,
    /// The level before the last step up and what it stored per byte of new data.
    raised_from: Option<(i32, f64)>,
}

/// Why the level moved (or not) after a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Bottleneck(Option<Bottleneck>),
    /// The last step up shrank the new data by less than [`MIN_GAIN`]: back, and held.
    DidNotPay,
}

impl Controller {
    /// Starts at `min` (the level that keeps the reduction goals).
    pub fn new(min: i32, max: i32) -> Controller {
        let level = clamp_level(min, min, max);
        Controller {
            level,
            min,
            max,
            ceiling: clamp_level(max, min, max),
            held: 0,
            raised_from: None,
        }
    }

    /// The level for the next checkpoint after one stored at `self.level` measured `m`.
    pub fn observe(&mut self, m: &Measured) -> Reason {
        if self.ceiling < self.max {
            self.held += 1;
            if self.held >= RETRY_AFTER {
                self.ceiling = clamp_level(self.max, self.min, self.max);
                self.held = 0;
            }
        }
        let fraction = m.stored_fraction();
        if let (Some((from, before)), Some(now)) = (self.raised_from.take(), fraction) {
            if now > before * (1.0 - MIN_GAIN) {
                self.level = from;
                self.ceiling = from;
                self.held = 0;
                return Reason::DidNotPay;
            }
        }
        let next = clamp_level(
            next_level(self.level, self.min, self.max, m),
            self.min,
            self.ceiling,
        );
        if next > self.level {
            // Judged on the next checkpoint; without a measure of this one, not judged.
            self.raised_from = fraction.map(|f| (self.level, f));
        }
        self.level = next;
        Reason::Bottleneck(m.bottleneck())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn measured(input: u64, ingest_s: f64, uploaded: u64, upload_s: f64) -> Measured {
        Measured {
            input_bytes: input,
            ingest_seconds: ingest_s,
            uploaded_bytes: uploaded,
            upload_seconds: upload_s,
            new_bytes: input,
        }
    }

    #[test]
    fn the_controller_climbs_while_each_step_shrinks_the_data() {
        let mut c = Controller::new(-2, 6);
        assert_eq!(c.level, -2);
        // Link-bound, and every level stores 5 % less than the one before.
        let mut uploaded = 400_000_000f64;
        let mut seen = vec![c.level];
        for _ in 0..9 {
            let m = measured(GB, 1.0, uploaded as u64, 3.0);
            assert_eq!(c.observe(&m), Reason::Bottleneck(Some(Bottleneck::Link)));
            seen.push(c.level);
            uploaded *= 0.95;
        }
        assert_eq!(seen, [-2, -1, 1, 2, 3, 4, 5, 6, 6, 6]);
    }

    #[test]
    fn a_step_up_that_does_not_shrink_the_data_goes_back_and_is_held() {
        // LAMMPS-like: link-bound by latency, but a harder level stores 0.2 % less.
        let mut c = Controller::new(-2, 6);
        let m = measured(32_000_000, 0.1, 19_480_000, 0.3);
        assert_eq!(c.observe(&m), Reason::Bottleneck(Some(Bottleneck::Link)));
        assert_eq!(c.level, -1);
        let m = measured(32_000_000, 0.1, 19_440_000, 0.3);
        assert_eq!(c.observe(&m), Reason::DidNotPay);
        assert_eq!((c.level, c.ceiling), (-2, -2));
        // Held there while the link stays the bottleneck...
        for _ in 0..RETRY_AFTER - 1 {
            c.observe(&measured(32_000_000, 0.1, 19_480_000, 0.3));
            assert_eq!((c.level, c.ceiling), (-2, -2));
        }
        // ... then tried again.
        c.observe(&measured(32_000_000, 0.1, 19_480_000, 0.3));
        assert_eq!((c.level, c.ceiling), (-1, 6));
    }

    #[test]
    fn the_controller_comes_down_when_the_cpu_is_the_bottleneck() {
        let mut c = Controller::new(-2, 6);
        c.level = 3;
        let busy = measured(GB, 3.0, 300_000_000, 1.0);
        assert_eq!(c.observe(&busy), Reason::Bottleneck(Some(Bottleneck::Cpu)));
        assert_eq!(c.level, 2);
        for _ in 0..5 {
            c.observe(&busy);
        }
        assert_eq!(c.level, -2, "never below the floor");
    }

    #[test]
    fn a_slow_link_raises_the_level_step_by_step_up_to_the_ceiling() {
        // 1 GB in at 1 GB/s, 330 MB out over a 1 Gbit/s link: 2.6 s of link against 1 s.
        let m = measured(GB, 1.0, 330_000_000, 2.64);
        assert_eq!(m.bottleneck(), Some(Bottleneck::Link));
        let mut level = -2;
        let mut seen = vec![level];
        for _ in 0..10 {
            level = next_level(level, -2, 6, &m);
            seen.push(level);
        }
        assert_eq!(seen, [-2, -1, 1, 2, 3, 4, 5, 6, 6, 6, 6]);
    }

    #[test]
    fn a_busy_cpu_lowers_the_level_down_to_the_floor() {
        // 1 GB in at 0.4 GB/s, the packs acknowledged in 0.5 s: the CPU bounds it.
        let m = measured(GB, 2.5, 330_000_000, 0.5);
        assert_eq!(m.bottleneck(), Some(Bottleneck::Cpu));
        assert_eq!(next_level(3, -1, 6, &m), 2);
        assert_eq!(next_level(1, -1, 6, &m), -1, "no level 0");
        assert_eq!(next_level(-1, -1, 6, &m), -1, "never below the floor");
        assert_eq!(next_level(-3, -7, 6, &m), -4);
    }

    #[test]
    fn within_the_hysteresis_band_the_level_stays() {
        // The link 10 % slower than the CPU: not enough to pay for a harder level.
        let m = measured(GB, 1.0, 330_000_000, 1.1);
        assert_eq!(m.bottleneck(), Some(Bottleneck::Balanced));
        assert_eq!(next_level(2, -1, 6, &m), 2);
        // The CPU 3 % slower than the link: not enough to give up reduction.
        let m = measured(GB, 1.03, 330_000_000, 1.0);
        assert_eq!(m.bottleneck(), Some(Bottleneck::Balanced));
        assert_eq!(next_level(2, -1, 6, &m), 2);
    }

    #[test]
    fn small_or_unmeasured_checkpoints_keep_the_level() {
        let tiny = measured(1 << 20, 0.001, 1 << 20, 1.0);
        assert_eq!(tiny.bottleneck(), None);
        assert_eq!(next_level(1, -1, 6, &tiny), 1);
        let no_time = measured(GB, 0.0, GB, 0.0);
        assert_eq!(no_time.bottleneck(), None);
        assert_eq!(next_level(-1, -1, 6, &no_time), -1);
        let nan = measured(GB, f64::NAN, GB, 1.0);
        assert_eq!(nan.bottleneck(), None);
        // Everything deduplicated: nothing uploaded, the CPU is all there is.
        let all_dup = measured(GB, 1.0, 0, 0.0);
        assert_eq!(all_dup.bottleneck(), Some(Bottleneck::Cpu));
        assert_eq!(next_level(2, -1, 6, &all_dup), 1);
    }

    #[test]
    fn levels_outside_the_bounds_come_back_within_them() {
        let balanced = measured(GB, 1.0, GB, 1.0);
        assert_eq!(next_level(9, -1, 6, &balanced), 6);
        assert_eq!(next_level(-5, -1, 6, &balanced), -1);
        assert_eq!(step_level(19, true, 1, 25), 19, "zstd's own ceiling");
        assert_eq!(step_level(-7, false, -30, 1), -7, "zstd's own floor");
    }

    #[test]
    fn rates_are_bytes_per_second_of_each_side() {
        let m = measured(GB, 2.0, 250_000_000, 2.0);
        assert_eq!(m.ingest_rate(), Some(0.5e9));
        assert_eq!(m.upload_rate(), Some(125e6));
        assert_eq!(measured(GB, 0.0, 0, 0.0).upload_rate(), None);
    }
}
