//! (b) The harness catches differences: a file present on one side only, a file whose
//! contents differ, a write that comes up one byte short, and a byte flipped behind the
//! harness's back. Each run must exit 1 with a report that says where and what.

mod common;

use std::process::Output;

use common::*;

fn assert_mismatch(out: &Output) -> String {
    let report = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a mismatch (exit 1)\nstdout: {}\nstderr: {report}",
        text(&out.stdout)
    );
    assert!(report.contains("MISMATCH"), "{report}");
    report
}

/// The report's line that starts with `prefix` (after indentation).
fn line<'a>(report: &'a str, prefix: &str) -> &'a str {
    report
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{report}"))
}

#[test]
fn a_file_on_one_side_only_is_caught_before_the_first_op() {
    let s = sides();
    std::fs::create_dir(&s.a).unwrap();
    std::fs::create_dir(&s.b).unwrap();
    std::fs::write(s.a.join("extra"), b"only on A").unwrap();
    let report = assert_mismatch(&output_within(
        diff_command(11, 100, &s.a, &s.b, &[]),
        RUN_TIMEOUT,
    ));
    assert_eq!(mismatch_op(&report), 0, "{report}");
    assert!(report.contains("seed=11"), "{report}");
    assert!(line(&report, "op:").contains("tree comparison"), "{report}");
    assert!(
        line(&report, "A (").contains("extra: file mode=")
            && line(&report, "A (").contains("size=9"),
        "{report}"
    );
    assert!(line(&report, "B (").ends_with("extra: missing"), "{report}");
}

#[test]
fn different_contents_are_located_to_the_byte() {
    let s = sides();
    std::fs::create_dir(&s.a).unwrap();
    std::fs::create_dir(&s.b).unwrap();
    std::fs::write(s.a.join("f"), b"0123456789").unwrap();
    std::fs::write(s.b.join("f"), b"0123456x89").unwrap();
    let report = assert_mismatch(&output_within(
        diff_command(12, 100, &s.a, &s.b, &[]),
        RUN_TIMEOUT,
    ));
    assert_eq!(mismatch_op(&report), 0, "{report}");
    assert!(
        report.contains("contents differ: lengths 10 and 10, first difference at byte 7: A 37 38 39 / B 78 38 39"),
        "{report}"
    );
}

#[test]
fn a_short_write_is_caught_at_that_write() {
    let s = sides();
    let seed = 21;
    let out = output_within(
        diff_command(seed, 2000, &s.a, &s.b, &["--sabotage", "short-write@300"]),
        RUN_TIMEOUT,
    );
    let report = assert_mismatch(&out);
    let at = mismatch_op(&report);
    assert!(at >= 300, "caught before the fault was made: {report}");
    let op = line(&report, "op:");
    assert!(
        op.contains("write(") || op.contains("writev("),
        "not caught at the write: {report}"
    );
    // A wrote one byte less than B: "A (...): N-1" and "B (...): N".
    let count = |side: &str| -> u64 {
        line(&report, side)
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no byte count for {side}: {report}"))
    };
    assert_eq!(count("A (") + 1, count("B ("), "{report}");
    // The history: the 20 ops before, numbered up to the failing one.
    let history: Vec<&str> = report
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('#'))
        .collect();
    assert_eq!(history.len(), 20, "{report}");
    assert!(
        history[19].starts_with(&format!("#{} ", at - 1)),
        "{report}"
    );
    assert!(
        line(&report, "replay:").contains(&format!("--seed {seed} --ops 2000")),
        "{report}"
    );
    assert!(line(&report, "slot").contains(": A fd "), "{report}");
}

#[test]
fn a_byte_changed_behind_the_harness_is_caught_by_a_read_or_the_next_tree_check() {
    let s = sides();
    let out = output_within(
        diff_command(
            31,
            3000,
            &s.a,
            &s.b,
            &["--sabotage", "flip-byte@500", "--check-every", "50"],
        ),
        RUN_TIMEOUT,
    );
    let report = assert_mismatch(&out);
    let at = mismatch_op(&report);
    assert!(
        (500..=550).contains(&at),
        "expected the fault after op 500 caught by op 550: {report}"
    );
    assert!(
        report.contains("bytes read differ") || report.contains("contents differ"),
        "{report}"
    );
}

#[test]
fn without_the_fault_the_same_runs_pass() {
    // The seeds and settings of the tests above, unsabotaged: the failures there are the
    // faults', not the seeds'.
    for (seed, ops, extra) in [(21, 2000, vec![]), (31, 3000, vec!["--check-every", "50"])] {
        let s = sides();
        let out = output_within(diff_command(seed, ops, &s.a, &s.b, &extra), RUN_TIMEOUT);
        assert!(
            out.status.success(),
            "seed {seed}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn the_libc_level_catches_a_flipped_byte_too() {
    let s = sides();
    let report = assert_mismatch(&output_within(
        diff_command(
            5,
            400,
            &s.a,
            &s.b,
            // A tree check after every op: the flipped file cannot be rewritten unseen.
            &[
                "--level",
                "libc",
                "--sabotage",
                "flip-byte@60",
                "--check-every",
                "1",
            ],
        ),
        RUN_TIMEOUT,
    ));
    assert_eq!(mismatch_op(&report), 60, "{report}");
    assert!(line(&report, "op:").contains("tree comparison"), "{report}");
    assert!(
        line(&report, "replay:").contains("--level libc"),
        "{report}"
    );
}
