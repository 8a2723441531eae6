//! `cascade drain` and `cascade restore`, run as the real binary against a real store and the
//! durable tier's directory backend.

mod support;
use cascade_testkit::pattern;
use support::{s, Sandbox};

#[test]
fn drain_then_restore_round_trips_through_a_directory() {
    let sb = Sandbox::new("ckpt");
    // 256 KiB of memory and a spill file, so the bigger file spills.
    sb.ok(&[
        "init",
        "--capacity",
        "256KiB",
        "--chunk-size",
        "64KiB",
        "--max-files",
        "64",
        "--spill-size",
        "4MiB",
        "--prefault",
        "off",
    ]);
    let a: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let b: Vec<u8> = (0..400_000u32).map(|i| (i * 13 % 253) as u8).collect();
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("a"), &a).unwrap();
    std::fs::write(local.join("b"), &b).unwrap();
    sb.ok(&["mkdir", "-p", "/ckpt.0001/sub"]);
    sb.ok(&["put", s(&local.join("a")), "/ckpt.0001/rank0.dat"]);
    sb.ok(&["put", s(&local.join("b")), "/ckpt.0001/sub/rank1.dat"]);

    let durable = sb.dir.path().join("durable");
    let url = format!("file://{}", durable.display());
    let out = sb.ok(&["drain", "/ckpt.0001", "--durable", &url]);
    assert!(out.contains("2 files, 500000 bytes"), "{out}");
    assert!(out.contains("GB/s") && out.contains(" s, "), "{out}");
    assert!(durable.join("ckpt.0001/.cascade-complete").exists());
    assert_eq!(
        std::fs::read(durable.join("ckpt.0001/sub/rank1.dat")).unwrap(),
        b
    );

    let dest = sb.dir.path().join("restored");
    let out = sb.ok(&["restore", "ckpt.0001", s(&dest), "--durable", &url]);
    assert!(out.contains("2 files, 500000 bytes"), "{out}");
    assert_eq!(std::fs::read(dest.join("rank0.dat")).unwrap(), a);
    assert_eq!(std::fs::read(dest.join("sub/rank1.dat")).unwrap(), b);

    sb.ok(&[
        "restore",
        "ckpt.0001",
        "/copy",
        "--from",
        &url,
        "--into-store",
    ]);
    let got = sb.dir.path().join("got");
    sb.ok(&["get", "/copy/sub/rank1.dat", s(&got)]);
    assert_eq!(std::fs::read(&got).unwrap(), b);

    // Errors: one line, exit 1.
    let line = sb.fails(&["drain", "/missing", "--durable", &url], 1);
    assert!(
        line.contains("/missing: No such file or directory"),
        "{line}"
    );
    std::fs::remove_file(durable.join("ckpt.0001/.cascade-complete")).unwrap();
    let line = sb.fails(&["restore", "ckpt.0001", s(&dest), "--durable", &url], 1);
    assert!(line.contains("not complete"), "{line}");
    let line = sb.fails(&["restore", "ckpt.0001", "--durable", "s3://"], 1);
    assert!(line.contains("durable store"), "{line}");
    // No durable store given or configured.
    let line = sb.fails(&["drain", "/ckpt.0001"], 1);
    assert!(
        line.contains("--durable") && line.contains("CASCADE_DURABLE"),
        "{line}"
    );
    let help = sb.ok(&["restore", "--help"]);
    assert!(
        help.contains("--into-store") && help.contains("marker"),
        "{help}"
    );
}

#[test]
fn drain_with_dedup_stores_repeats_once_and_restores_verified() {
    let sb = Sandbox::new("ckpt");
    sb.ok(&[
        "init",
        "--capacity",
        "32MiB",
        "--max-files",
        "64",
        "--prefault",
        "off",
    ]);
    let a = pattern(3 << 20, 1);
    let mut a2 = a.clone();
    a2[1 << 20..(1 << 20) + 4096].copy_from_slice(&pattern(4096, 2));
    let b: Vec<u8> = (0..1_000_000u32).map(|i| (i % 7) as u8).collect();
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("a"), &a).unwrap();
    std::fs::write(local.join("a2"), &a2).unwrap();
    std::fs::write(local.join("b"), &b).unwrap();
    sb.ok(&["mkdir", "-p", "/ck1", "/ck2"]);
    sb.ok(&["put", s(&local.join("a")), "/ck1/a.dat"]);
    sb.ok(&["put", s(&local.join("b")), "/ck1/b.dat"]);
    sb.ok(&["put", s(&local.join("a2")), "/ck2/a.dat"]);
    sb.ok(&["put", s(&local.join("b")), "/ck2/b.dat"]);

    let durable = sb.dir.path().join("durable");
    let url = format!("file://{}", durable.display());
    let dedup = ["--dedup", "cdc:avg=16KiB", "--compress", "zstd:1"];
    let out = sb.ok(&[&["drain", "/ck1", "--durable", &url][..], &dedup[..]].concat());
    assert!(
        out.contains("2 files, 4145728 bytes") && out.contains("dedup repository"),
        "{out}"
    );
    // The second checkpoint: only the chunks around the changed 4 KiB are new.
    let out = sb.ok(&[&["drain", "/ck2", "--durable", &url][..], &dedup[..]].concat());
    let new_line = out
        .lines()
        .find(|l| l.contains("chunks new"))
        .unwrap_or_else(|| panic!("no chunk line: {out}"));
    let new_chunks: u64 = new_line
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{new_line}"));
    assert!(
        (1..=6).contains(&new_chunks),
        "a 4 KiB change stored {new_chunks} chunks: {out}"
    );
    // Not the plain layout: no marker, no data objects; the repository holds it.
    assert!(!durable.join("ck1/.cascade-complete").exists());
    assert!(!durable.join("ck1/a.dat").exists());
    assert!(durable.join(".cascade-dedup/manifests/ck2.json").exists());

    let dest = sb.dir.path().join("restored");
    let out = sb.ok(&["restore", "ck1", s(&dest), "--durable", &url]);
    assert!(out.contains("2 files, 4145728 bytes"), "{out}");
    assert!(std::fs::read(dest.join("a.dat")).unwrap() == a);
    assert!(std::fs::read(dest.join("b.dat")).unwrap() == b);
    sb.ok(&["restore", "ck2", "/back", "--durable", &url, "--into-store"]);
    let got = sb.dir.path().join("got");
    sb.ok(&["get", "/back/a.dat", s(&got)]);
    assert!(std::fs::read(&got).unwrap() == a2);

    // A flipped byte in a pack: one line, exit 1, nothing restored.
    let packs = durable.join(".cascade-dedup/packs");
    for sub in std::fs::read_dir(&packs).unwrap() {
        for pack in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let path = pack.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 1;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let bad = sb.dir.path().join("bad");
    let line = sb.fails(&["restore", "ck1", s(&bad), "--durable", &url], 1);
    assert!(line.contains("corrupt"), "{line}");
    let left: Vec<_> = std::fs::read_dir(&bad)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a failed restore left {left:?}");

    // Bad specs: one line each.
    let line = sb.fails(
        &["drain", "/ck1", "--durable", &url, "--dedup", "cdc:avg=1"],
        1,
    );
    assert!(line.contains("cdc:avg=1"), "{line}");
    let line = sb.fails(
        &["drain", "/ck1", "--durable", &url, "--compress", "gzip"],
        1,
    );
    assert!(line.contains("gzip"), "{line}");
}

/// `cascade drain --dedup` killed with SIGKILL after it wrote packs but before its index and
/// manifest: the earlier checkpoint still restores, the killed one has no manifest (restore
/// refuses it), and draining it again completes and restores byte for byte.
#[test]
fn drain_with_dedup_killed_mid_checkpoint_loses_nothing_complete() {
    let sb = Sandbox::new("ckpt");
    sb.ok(&[
        "init",
        "--capacity",
        "400MiB",
        "--max-files",
        "64",
        "--prefault",
        "off",
    ]);
    let small = pattern(1 << 20, 3);
    let big = pattern(300 << 20, 4);
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("small"), &small).unwrap();
    std::fs::write(local.join("big"), &big).unwrap();
    sb.ok(&["mkdir", "-p", "/ck1", "/ck2"]);
    sb.ok(&["put", s(&local.join("small")), "/ck1/s.dat"]);
    sb.ok(&["put", s(&local.join("big")), "/ck2/b.dat"]);
    let durable = sb.dir.path().join("durable");
    let url = format!("file://{}", durable.display());
    sb.ok(&["drain", "/ck1", "--durable", &url, "--dedup", "fixed:64KiB"]);

    // Many packs: the first appears long before the last, and the index comes last.
    let mut drain = sb
        .command(&["drain", "/ck2", "--durable", &url, "--dedup", "fixed:64KiB"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn drain");
    let packs = durable.join(".cascade-dedup/packs");
    let count_packs = || -> usize {
        std::fs::read_dir(&packs)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| std::fs::read_dir(e.path()).map_or(0, |p| p.count()))
                    .sum()
            })
            .unwrap_or(0)
    };
    let before = count_packs();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while count_packs() < before + 2 {
        assert!(
            drain.try_wait().expect("try_wait").is_none(),
            "the drain finished before it could be killed"
        );
        assert!(std::time::Instant::now() < deadline, "no pack appeared");
        std::thread::yield_now();
    }
    assert!(
        drain.try_wait().expect("try_wait").is_none(),
        "finished too early"
    );
    drain.kill().expect("SIGKILL");
    drain.wait().expect("reap");
    assert!(!durable.join(".cascade-dedup/manifests/ck2.json").exists());

    let dest = sb.dir.path().join("r1");
    sb.ok(&["restore", "ck1", s(&dest), "--durable", &url]);
    assert!(std::fs::read(dest.join("s.dat")).unwrap() == small);
    let line = sb.fails(
        &[
            "restore",
            "ck2",
            s(&sb.dir.path().join("r2")),
            "--from",
            &url,
        ],
        1,
    );
    assert!(line.contains("not complete"), "{line}");

    sb.ok(&["drain", "/ck2", "--durable", &url, "--dedup", "fixed:64KiB"]);
    let dest = sb.dir.path().join("r2");
    sb.ok(&["restore", "ck2", s(&dest), "--durable", &url]);
    assert!(std::fs::read(dest.join("b.dat")).unwrap() == big);
}

/// `len` bytes of float32 "weights", each scaled by `1 + nudge`: a training step that moves
/// every value a little.
fn weights(len: usize, nudge: f32) -> Vec<u8> {
    (0..len / 4)
        .flat_map(|i| ((i as f32 * 0.37).sin() * (1.0 + nudge)).to_le_bytes())
        .collect()
}

/// "D as deltas against CKPT" from drain's output, if it names a base.
fn deltas_in(out: &str) -> Option<(u64, String)> {
    let (before, after) = out.split_once(" as deltas against ")?;
    let count = before.rsplit(' ').next()?.parse().ok()?;
    let base = after.split([',', ' ']).next()?.to_string();
    Some((count, base))
}

/// Bytes stored, from drain's "..., N stored" line.
fn stored_in(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.contains("chunks new"))
        .unwrap_or_else(|| panic!("no chunk line: {out}"));
    line.rsplit(", ").next().unwrap_or_default().to_string()
}

#[test]
fn drain_with_dedup_stores_the_next_checkpoint_as_deltas_against_the_previous_one() {
    let sb = Sandbox::new("ckpt-delta");
    sb.ok(&["init", "--capacity", "64MiB", "--prefault", "off"]);
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).unwrap();
    let versions = [weights(4 << 20, 0.0), weights(4 << 20, 1e-6)];
    sb.ok(&["mkdir", "-p", "/run/ck.1", "/run/ck.2"]);
    for (i, data) in versions.iter().enumerate() {
        let file = local.join(format!("v{i}"));
        std::fs::write(&file, data).unwrap();
        let ckpt = format!("/run/ck.{}", i + 1);
        sb.ok(&["put", s(&file), &format!("{ckpt}/model.bin")]);
        sb.ok(&["commit", &ckpt]);
    }
    // Fixed chunks: a chunk of the next version lies exactly on its base (a content-defined
    // cut may straddle two base chunks; the part past the first is not XORed).
    let dedup = ["--dedup", "fixed:16KiB", "--compress", "zstd:1"];
    let drain = |ckpt: &str, repo: &str, extra: &[&str]| {
        let url = format!("file://{}", sb.dir.path().join(repo).display());
        sb.ok(&[&["drain", ckpt, "--durable", &url][..], &dedup[..], extra].concat())
    };
    // Without deltas, then with (the default).
    drain("/run/ck.1", "plain", &["--delta", "off"]);
    let without = drain("/run/ck.2", "plain", &["--delta", "off"]);
    assert_eq!(deltas_in(&without), None, "{without}");
    let first = drain("/run/ck.1", "delta", &[]);
    assert_eq!(deltas_in(&first), None, "nothing before it: {first}");
    let with = drain("/run/ck.2", "delta", &[]);
    let (deltas, base) = deltas_in(&with).unwrap_or_else(|| panic!("{with}"));
    assert_eq!(base, "run/ck.1", "{with}");
    assert!(deltas > 0, "{with}");
    let bytes = |text: String| -> u64 {
        let n = text.trim_end_matches(" stored");
        n.parse::<u64>()
            .ok()
            .or_else(|| cascade_config::parse_size(n).ok())
            .unwrap_or_else(|| panic!("{text}"))
    };
    let (with_bytes, without_bytes) = (bytes(stored_in(&with)), bytes(stored_in(&without)));
    eprintln!("ck.2: {with_bytes} bytes stored with deltas, {without_bytes} without");
    assert!(
        with_bytes * 2 < without_bytes,
        "with deltas {with_bytes} bytes stored, without {without_bytes}"
    );

    let url = format!("file://{}", sb.dir.path().join("delta").display());
    for (i, data) in versions.iter().enumerate() {
        let dest = sb.dir.path().join(format!("restored-{i}"));
        sb.ok(&[
            "restore",
            &format!("run/ck.{}", i + 1),
            s(&dest),
            "--from",
            &url,
        ]);
        assert!(
            std::fs::read(dest.join("model.bin")).unwrap() == *data,
            "ck.{} differs",
            i + 1
        );
    }
}
