//! Byte sizes as people write them: "4GiB", "512MiB", "64k", "1M", "1.5G", "4096".
//!
//! Single-letter and `iB` suffixes are binary (k = KiB = 1024), because chunk sizes and
//! capacities are powers of two; `kB`/`MB`/`GB`/`TB` are decimal, as in dd and systemd.
//! Suffix letters are case-insensitive; a space may separate number and unit.

/// What every size error says after the offending text.
pub const SIZE_HINT: &str = "not a size (expected e.g. 4KiB, 1MiB, 8GiB)";

const KIB: u64 = 1 << 10;

/// Parses a size; the error is a short phrase to put after the setting and its value.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier = unit_multiplier(unit.trim_start()).ok_or_else(|| SIZE_HINT.to_string())?;
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(SIZE_HINT.to_string());
    }
    if !fraction.is_empty() && multiplier == 1 {
        return Err("a byte count must be a whole number".to_string());
    }
    let too_large = || "too large (more than 16 EiB)".to_string();
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(too_large)?;
    // Fractions are exact to the byte; digits past the 18th are below a byte for any unit.
    if !fraction.bytes().all(|d| d.is_ascii_digit()) {
        return Err(SIZE_HINT.to_string());
    }
    let digits = &fraction[..fraction.len().min(18)];
    if !digits.is_empty() {
        let numerator: u128 = digits.parse().map_err(|_| SIZE_HINT.to_string())?;
        let part = u128::from(multiplier) * numerator / 10u128.pow(digits.len() as u32);
        let part = u64::try_from(part).map_err(|_| too_large())?;
        bytes = bytes.checked_add(part).ok_or_else(too_large)?;
    }
    Ok(bytes)
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let lower = unit.to_ascii_lowercase();
    let power = |p: u32| KIB.pow(p);
    let decimal = |p: u32| 1000u64.pow(p);
    Some(match lower.as_str() {
        "" | "b" => 1,
        "k" | "kib" => power(1),
        "m" | "mib" => power(2),
        "g" | "gib" => power(3),
        "t" | "tib" => power(4),
        "p" | "pib" => power(5),
        "kb" => decimal(1),
        "mb" => decimal(2),
        "gb" => decimal(3),
        "tb" => decimal(4),
        "pb" => decimal(5),
        _ => return None,
    })
}

/// Formats bytes for people: exact units when they fit ("64 KiB", "4 GiB"), else two
/// decimals ("1.50 GiB"); plain bytes below 1 KiB.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < KIB {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    let mut divisor = KIB;
    while unit + 1 < UNITS.len() && bytes / divisor >= KIB {
        unit += 1;
        divisor *= KIB;
    }
    // divisor is a power of two, so the low bits say whether it divides exactly.
    if bytes & (divisor - 1) == 0 {
        format!("{} {}", bytes / divisor, UNITS[unit])
    } else {
        format!("{:.2} {}", bytes as f64 / divisor as f64, UNITS[unit])
    }
}

/// Bytes per second as decimal gigabytes per second, the unit storage bandwidth is quoted in.
pub fn format_rate(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "- GB/s".to_string();
    }
    format!("{:.2} GB/s", bytes as f64 / seconds / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_units_with_and_without_ib() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("8 GiB"), Ok(8 << 30));
        assert_eq!(parse_size("1mib"), Ok(1 << 20));
    }

    #[test]
    fn plain_bytes_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("17B"), Ok(17));
        assert_eq!(parse_size("1kB"), Ok(1000));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
    }

    #[test]
    fn fractions_are_exact_to_the_byte() {
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0.25M"), Ok(256 << 10));
        assert_eq!(parse_size(".5k"), Ok(512));
        assert_eq!(parse_size("1.1k"), Ok(1126));
    }

    #[test]
    fn rejects_what_is_not_a_size() {
        for bad in [
            "", "12x", "GiB", "1.2.3k", "-4k", "4 GiBs", "k4", "0x10", ".",
        ] {
            assert_eq!(parse_size(bad), Err(SIZE_HINT.to_string()), "input {bad:?}");
        }
        assert_eq!(
            parse_size("1.5"),
            Err("a byte count must be a whole number".to_string())
        );
    }

    #[test]
    fn rejects_overflow_instead_of_wrapping() {
        assert!(parse_size("16384P").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(parse_size("16383P"), Ok(16383 << 50));
    }

    #[test]
    fn formats_exact_and_fractional_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(64 << 10), "64 KiB");
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(1536 << 20), "1.50 GiB");
        assert_eq!(format_rate(2_000_000_000, 0.5), "4.00 GB/s");
    }
}
