//! Chunking specs, chunkers and scores: specs parse and print back, the chunkers cover their
//! input exactly, CDC cut points survive an insertion, the streaming chunker agrees with the
//! slice chunker.

use std::collections::HashSet;
use std::io::Read;

use cascade_dedup::chunking::{format_size, parse_size};
use cascade_dedup::score::{from_hex, short_key, to_hex};
use cascade_dedup::{score, Chunking};
use cascade_testkit::random;

fn parse(spec: &str) -> Chunking {
    spec.parse()
        .unwrap_or_else(|e| panic!("{spec} does not parse: {e}"))
}

fn parse_error(spec: &str) -> String {
    match spec.parse::<Chunking>() {
        Ok(c) => panic!("{spec} parsed as {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn specs_parse_into_the_right_values() {
    assert_eq!(parse("fixed:4KiB"), Chunking::Fixed { size: 4096 });
    assert_eq!(parse("fixed:512"), Chunking::Fixed { size: 512 });
    assert_eq!(parse("fixed:512B"), Chunking::Fixed { size: 512 });
    assert_eq!(parse("fixed:1MiB"), Chunking::Fixed { size: 1 << 20 });
    assert_eq!(parse("FIXED:8k"), Chunking::Fixed { size: 8192 });
    assert_eq!(
        parse("cdc:avg=64KiB"),
        Chunking::Cdc {
            min: 16 << 10,
            avg: 64 << 10,
            max: 256 << 10
        }
    );
    assert_eq!(parse("cdc:avg=64KiB"), Chunking::DEFAULT_CDC);
    assert_eq!(
        parse("cdc:min=16KiB,avg=64KiB,max=256KiB"),
        Chunking::DEFAULT_CDC
    );
    assert_eq!(
        parse("cdc:max=1MiB, avg=128KiB"),
        Chunking::Cdc {
            min: 32 << 10,
            avg: 128 << 10,
            max: 1 << 20
        }
    );
    // The extremes of FastCDC's ranges.
    assert_eq!(
        parse("cdc:avg=256"),
        Chunking::Cdc {
            min: 64,
            avg: 256,
            max: 1024
        }
    );
    assert_eq!(
        parse("cdc:avg=4MiB"),
        Chunking::Cdc {
            min: 1 << 20,
            avg: 4 << 20,
            max: 16 << 20
        }
    );
}

#[test]
fn specs_round_trip_through_display() {
    for spec in [
        "fixed:512B",
        "fixed:4KiB",
        "fixed:8KiB",
        "fixed:1MiB",
        "fixed:1536B",
        "cdc:avg=64KiB",
        "cdc:avg=1MiB",
        "cdc:min=8KiB,avg=64KiB,max=128KiB",
        "cdc:min=100B,avg=1000B,max=10000B",
    ] {
        let chunking = parse(spec);
        assert_eq!(chunking.to_string(), spec);
        assert_eq!(parse(&chunking.to_string()), chunking);
    }
    // Non-canonical spellings print canonically.
    assert_eq!(parse("fixed:4096").to_string(), "fixed:4KiB");
    assert_eq!(parse("fixed:512").to_string(), "fixed:512B");
    assert_eq!(
        parse("cdc:min=16KiB,avg=64KiB,max=256KiB").to_string(),
        "cdc:avg=64KiB"
    );
}

#[test]
fn bad_specs_get_one_line_errors_that_name_them() {
    let cases = [
        ("fixed:256", "out of range"),
        ("fixed:2MiB", "out of range"),
        ("fixed:", "expected fixed:SIZE"),
        ("fixed:4KB", "binary units"),
        ("fixed:4XiB", "unknown unit"),
        ("fixed:lots", "not a size"),
        ("fixed:99999999999999999999", "too large"),
        ("cdc:avg=128", "avg=128B is out of range"),
        ("cdc:avg=8MiB", "out of range"),
        ("cdc:min=32,avg=64KiB", "min=32B is out of range"),
        ("cdc:avg=64KiB,max=32MiB", "max=32MiB is out of range"),
        ("cdc:min=128KiB,avg=64KiB", "min <= avg <= max"),
        ("cdc:avg=64KiB,max=32KiB", "min <= avg <= max"),
        ("cdc:min=16KiB", "expected cdc:avg=SIZE"),
        ("cdc:avg=64KiB,avg=32KiB", "given twice"),
        ("cdc:avg=64KiB,mean=1", "unknown parameter"),
        ("cdc:64KiB", "expected NAME=SIZE"),
        ("rabin:4KiB", "expected fixed:SIZE or cdc:avg=SIZE"),
        ("", "expected fixed:SIZE or cdc:avg=SIZE"),
    ];
    for (spec, why) in cases {
        let message = parse_error(spec);
        assert!(!message.contains('\n'), "{spec}: {message}");
        assert!(
            message.contains(&format!("'{spec}'")),
            "{spec}: message does not name the spec: {message}"
        );
        assert!(message.contains(why), "{spec}: {message} lacks '{why}'");
    }
}

#[test]
fn sizes_parse_and_format() {
    assert_eq!(parse_size("512"), Ok(512));
    assert_eq!(parse_size("512b"), Ok(512));
    assert_eq!(parse_size("64KiB"), Ok(64 << 10));
    assert_eq!(parse_size("64k"), Ok(64 << 10));
    assert_eq!(parse_size("2mib"), Ok(2 << 20));
    assert!(parse_size("1.5MiB").is_err());
    assert_eq!(format_size(512), "512B");
    assert_eq!(format_size(1536), "1536B");
    assert_eq!(format_size(4096), "4KiB");
    assert_eq!(format_size(3 << 20), "3MiB");
}

#[test]
fn validate_and_clamp_cover_hand_built_values() {
    let bad = Chunking::Cdc {
        min: 1,
        avg: 1 << 30,
        max: 2,
    };
    assert!(bad.validate().is_err());
    let clamped = bad.clamped();
    assert!(clamped.validate().is_ok(), "{clamped:?}");
    // Splitting with out-of-range values clamps rather than panics.
    let data = random(100_000, 1);
    let total: usize = bad.split(&data).map(|r| r.len()).sum();
    assert_eq!(total, data.len());
    let tiny = Chunking::Fixed { size: 0 };
    assert!(tiny.validate().is_err());
    assert_eq!(tiny.split(&data).next(), Some(0..512));
}

/// Ranges that are contiguous, non-empty, start at 0 and end at `len`.
fn assert_covers(ranges: &[std::ops::Range<usize>], len: usize, what: &str) {
    let mut at = 0;
    for r in ranges {
        assert_eq!(r.start, at, "{what}: gap or overlap at {at}");
        assert!(r.end > r.start, "{what}: empty chunk at {at}");
        at = r.end;
    }
    assert_eq!(at, len, "{what}: chunks end at {at}, data at {len}");
}

#[test]
fn chunkers_cover_the_data_exactly_in_order() {
    let chunkings = [
        parse("fixed:512"),
        parse("fixed:4KiB"),
        parse("fixed:1536"),
        parse("fixed:1MiB"),
        parse("cdc:avg=4KiB"),
        Chunking::DEFAULT_CDC,
        parse("cdc:min=64,avg=256,max=1024"),
    ];
    for len in [0usize, 1, 511, 512, 513, 4095, 4096, 100_000, 3 << 20] {
        let data = random(len, len as u64);
        for chunking in chunkings {
            let ranges: Vec<_> = chunking.split(&data).collect();
            assert_covers(&ranges, len, &format!("{chunking} over {len} bytes"));
            match chunking {
                Chunking::Fixed { size } => {
                    let size = size as usize;
                    assert_eq!(ranges.len(), len.div_ceil(size));
                    assert!(ranges.iter().all(|r| r.len() <= size));
                    assert!(ranges.iter().rev().skip(1).all(|r| r.len() == size));
                }
                Chunking::Cdc { min, max, .. } => {
                    assert!(ranges.iter().all(|r| r.len() <= max as usize));
                    // Only the last chunk may be shorter than the minimum.
                    assert!(ranges.iter().rev().skip(1).all(|r| r.len() >= min as usize));
                }
            }
        }
    }
}

#[test]
fn cdc_average_is_near_the_target() {
    let data = random(8 << 20, 7);
    let chunks = Chunking::DEFAULT_CDC.split(&data).count();
    let average = data.len() / chunks;
    assert!(
        (32 << 10..=128 << 10).contains(&average),
        "average chunk {average} bytes for avg=64KiB"
    );
}

#[test]
fn cdc_boundaries_survive_an_insertion_at_the_front() {
    let data = random(8 << 20, 3);
    let mut shifted = vec![0x5a];
    shifted.extend_from_slice(&data);
    for chunking in [Chunking::DEFAULT_CDC, parse("cdc:avg=8KiB")] {
        let scores = |d: &[u8]| -> Vec<_> { chunking.split(d).map(|r| score(&d[r])).collect() };
        let before: HashSet<_> = scores(&data).into_iter().collect();
        let after = scores(&shifted);
        let kept = after.iter().filter(|s| before.contains(*s)).count();
        assert!(
            kept * 100 >= after.len() * 95,
            "{chunking}: only {kept} of {} chunks kept their score",
            after.len()
        );
        assert!(
            after.len() - kept <= 2,
            "{chunking}: {kept}/{}",
            after.len()
        );
    }
    // Fixed-size chunks, by contrast, all move.
    let fixed = parse("fixed:4KiB");
    let before: HashSet<_> = fixed.split(&data).map(|r| score(&data[r])).collect();
    let kept = fixed
        .split(&shifted)
        .filter(|r| before.contains(&score(&shifted[r.clone()])))
        .count();
    assert!(kept <= 1, "{kept} fixed chunks kept their score");
}

/// A reader that hands out at most `step` bytes per read, to exercise refills.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn streaming_chunker_matches_the_slice_chunker() {
    let data = random((5 << 20) + 12_345, 11);
    for chunking in [
        Chunking::DEFAULT_CDC,
        parse("cdc:avg=4KiB"),
        parse("fixed:4KiB"),
        parse("fixed:1536"),
    ] {
        let expected: Vec<_> = chunking.split(&data).collect();
        for step in [usize::MAX, 1000, 65_537] {
            let reader = Trickle { data: &data, step };
            let mut got = Vec::new();
            for item in chunking.stream(reader) {
                let (offset, bytes) = item.expect("read");
                let start = usize::try_from(offset).expect("offset");
                assert_eq!(bytes, &data[start..start + bytes.len()]);
                got.push(start..start + bytes.len());
            }
            assert_eq!(got, expected, "{chunking}, reads of {step}");
        }
    }
    assert!(Chunking::DEFAULT_CDC.stream(&[][..]).next().is_none());
    assert!(parse("fixed:512").stream(&[][..]).next().is_none());
}

#[test]
fn streaming_chunker_reports_read_errors() {
    struct Failing;
    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    for chunking in [Chunking::DEFAULT_CDC, parse("fixed:4KiB")] {
        let mut stream = chunking.stream(Failing);
        let err = stream.next().expect("an item").expect_err("an error");
        assert!(err.to_string().contains("disk on fire"), "{err}");
        assert!(stream.next().is_none());
    }
}

#[test]
fn scores_are_blake3_and_hex_round_trips() {
    let s = score(b"abc");
    assert_eq!(
        to_hex(&s),
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    );
    assert_eq!(from_hex(&to_hex(&s)), Ok(s));
    assert_eq!(from_hex(&to_hex(&s).to_uppercase()), Ok(s));
    assert!(from_hex("abc").is_err());
    assert!(from_hex(&"g".repeat(64)).is_err());
    assert_ne!(short_key(&score(b"a")), short_key(&score(b"b")));
}
