//! Table cells shared by every suite: statistics, ratios, medians, optional numbers.

use crate::util::Stats;

/// "1.23" for one sample, "1.23 [1.10–1.40]" (median [min–max]) for several.
pub fn st(s: &Stats) -> String {
    st_prec(s, 2)
}

/// [`st`] with `prec` decimals.
pub fn st_prec(s: &Stats, prec: usize) -> String {
    if s.samples.len() <= 1 {
        format!("{:.prec$}", s.median)
    } else {
        format!("{:.prec$} [{:.prec$}–{:.prec$}]", s.median, s.min, s.max)
    }
}

/// [`st`] of an optional statistic, "n/a" without one.
pub fn st_opt(s: Option<&Stats>) -> String {
    s.map_or_else(|| "n/a".into(), st)
}

/// a / b when both are there and the quotient is finite.
pub fn ratio(a: impl Into<Option<f64>>, b: impl Into<Option<f64>>) -> Option<f64> {
    let r = a.into()? / b.into()?;
    r.is_finite().then_some(r)
}

/// "1.23x", or "n/a".
pub fn x(r: Option<f64>) -> String {
    x_prec(r, 2)
}

/// [`x`] with `prec` decimals.
pub fn x_prec(r: Option<f64>, prec: usize) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.prec$}x"))
}

/// "1.23" with `prec` decimals, or "n/a".
pub fn num(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or_else(|| "n/a".into(), |v| format!("{v:.prec$}"))
}

/// Seconds and the rate they give for `bytes`: "1.23 [1.1–1.4] (0.870 GB/s)".
pub fn secs_gbps(s: &Stats, bytes: u64) -> String {
    format!("{} ({:.3} GB/s)", st(s), bytes as f64 / s.median / 1e9)
}

/// The median of integers (the upper middle one for an even count), 0 for none.
pub fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Large counts: "12.3 M", "456 k".
pub fn count(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// [`count`] of a statistic, with its range.
pub fn count_st(s: &Stats) -> String {
    if s.samples.len() <= 1 {
        count(s.median)
    } else {
        format!("{} [{}–{}]", count(s.median), count(s.min), count(s.max))
    }
}

/// A ratio as a change in per cent with its range: "+1.2 % [-0.3–+2.0]".
pub fn pct_change(r: &Stats) -> String {
    let p = |v: f64| (v - 1.0) * 100.0;
    format!("{:+.1} % [{:+.1}–{:+.1}]", p(r.median), p(r.min), p(r.max))
}

/// a / b as "1.23x", with 3 decimals below 0.1x; "n/a" when not finite.
pub fn ratio_fine(a: f64, b: f64) -> String {
    let r = a / b;
    let p = if r < 0.1 { 3 } else { 2 };
    if r.is_finite() {
        format!("{r:.p$}x")
    } else {
        "n/a".into()
    }
}

/// [`st`] with 3 decimals below 0.1.
pub fn st_fine(s: &Stats) -> String {
    st_prec(s, if s.median < 0.1 { 3 } else { 2 })
}
