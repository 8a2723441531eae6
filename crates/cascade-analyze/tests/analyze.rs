//! The analysis engine on synthetic series whose answers are known: identical snapshots,
//! exactly K of N blocks changed, random and compressible data, insertions, files that come
//! and go, windows of any size giving the same answers; and its errors.

use std::fs;
use std::path::{Path, PathBuf};

use cascade_analyze::analyze::{ChunkingReport, Options, Report};
use cascade_analyze::{analyze, scan};
use cascade_dedup::Chunking;
use cascade_testkit::{counting_doubles, random};
use tempfile::TempDir;

fn write(path: &Path, data: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    fs::write(path, data).expect("write");
}

fn run(paths: &[PathBuf], options: &Options) -> Report {
    let series = scan(paths).expect("scan");
    let done = std::sync::atomic::AtomicU64::new(0);
    let report = analyze(&series, options, &|n| {
        done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    })
    .expect("analyze");
    assert_eq!(
        done.into_inner(),
        series.total_bytes(),
        "progress adds up to the series"
    );
    report
}

fn chunking<'a>(report: &'a Report, spec: &str) -> &'a ChunkingReport {
    report
        .chunkings
        .iter()
        .find(|c| c.spec == spec)
        .unwrap_or_else(|| panic!("no {spec} in the report"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn identical_snapshots_dedup_by_the_number_of_snapshots() {
    let dir = TempDir::new().expect("tempdir");
    let a = random((1 << 20) + 1000, 1);
    let b = random(300_000, 2);
    let mut paths = Vec::new();
    for step in 1..=3 {
        let snap = dir.path().join(format!("ckpt.{step}"));
        write(&snap.join("a.bin"), &a);
        write(&snap.join("sub/b.bin"), &b);
        paths.push(snap);
    }
    let report = run(&paths, &Options::default());
    assert_eq!(report.snapshots.len(), 3);
    assert_eq!(report.files, 6);
    let each = (a.len() + b.len()) as u64;
    assert_eq!(report.total_bytes, 3 * each);
    assert_eq!(
        report
            .chunkings
            .iter()
            .map(|c| c.spec.as_str())
            .collect::<Vec<_>>(),
        ["fixed:512B", "fixed:4KiB", "fixed:8KiB", "cdc:avg=64KiB"]
    );
    for c in &report.chunkings {
        assert!(close(c.dedup_ratio, 3.0), "{}: {}", c.spec, c.dedup_ratio);
        assert_eq!(c.total_bytes, 3 * each);
        assert_eq!(c.unique_bytes, each);
        assert_eq!(c.chunks, 3 * c.unique_chunks);
        assert_eq!(c.snapshots[0].new_bytes, each);
        for (i, s) in c.snapshots.iter().enumerate() {
            if i > 0 {
                assert_eq!(s.new_chunks, 0, "{} #{}", c.spec, s.index);
                assert_eq!(s.duplicate_bytes, each);
            }
            assert_eq!(s.cumulative_unique_bytes, each);
            assert!(close(s.cumulative_dedup_ratio, (i + 1) as f64));
        }
    }
    assert_eq!(report.snapshots[0].same_offset_fraction_4k, None);
    for s in &report.snapshots[1..] {
        assert_eq!(s.same_offset_fraction_4k, Some(1.0));
        assert_eq!(s.same_offset_blocks_4k, Some(s.blocks_4k));
    }
    // 1 MiB + 1000 bytes is 257 blocks; 300,000 bytes 74.
    assert_eq!(report.snapshots[0].blocks_4k, 257 + 74);
    // Random data: nothing to compress.
    let comp = report.compression.as_ref().expect("compression");
    assert_eq!(comp.chunking, "cdc:avg=64KiB");
    assert_eq!(comp.unique_bytes, each);
    for codec in &comp.codecs {
        assert_eq!(codec.stored_bytes, each);
        assert_eq!(codec.compressed_chunks, 0);
        assert!(close(codec.compression_ratio, 1.0));
        assert!(close(codec.dedup_compression_ratio, 3.0));
    }
}

#[test]
fn a_series_of_single_files_is_matched_whatever_the_names() {
    let dir = TempDir::new().expect("tempdir");
    let data = random(200_000, 5);
    let paths: Vec<PathBuf> = (1..=4)
        .map(|i| {
            let p = dir.path().join(format!("rank0.step{i}.dat"));
            write(&p, &data);
            p
        })
        .collect();
    let options = Options {
        heatmaps: true,
        ..Options::default()
    };
    let report = run(&paths, &options);
    for c in &report.chunkings {
        assert!(close(c.dedup_ratio, 4.0), "{}", c.spec);
    }
    assert_eq!(report.snapshots[3].same_offset_fraction_4k, Some(1.0));
    assert_eq!(report.heatmaps.len(), 1);
    let heatmap = &report.heatmaps[0];
    assert_eq!(heatmap.name, "rank0.step1.dat");
    assert_eq!(heatmap.transitions, 3);
    assert_eq!(heatmap.region_size, 4096);
    assert_eq!(heatmap.regions, 49);
    assert!(heatmap.changes.iter().all(|&c| c == 0));
}

#[test]
fn k_changed_blocks_of_n_leave_n_minus_k_at_the_same_offset() {
    let dir = TempDir::new().expect("tempdir");
    let n_full = 300;
    let old = random(n_full * 4096 + 100, 9); // 301 blocks, the last one 100 bytes
    let n = n_full + 1;
    let changed = [
        0usize, 1, 7, 64, 65, 100, 150, 199, 200, 201, 255, 256, 280, 299, 300,
    ];
    let mut new = old.clone();
    for &block in &changed {
        new[block * 4096 + 17] ^= 0xff;
    }
    let first = dir.path().join("1");
    let second = dir.path().join("2");
    write(&first.join("state.bin"), &old);
    write(&second.join("state.bin"), &new);
    let options = Options {
        heatmaps: true,
        ..Options::default()
    };
    let report = run(&[first, second], &options);
    let k = changed.len();
    let s = &report.snapshots[1];
    assert_eq!(s.blocks_4k, n as u64);
    assert_eq!(s.same_offset_blocks_4k, Some((n - k) as u64));
    let fraction = s.same_offset_fraction_4k.expect("fraction");
    assert!(close(fraction, (n - k) as f64 / n as f64), "{fraction}");
    // Under fixed 4 KiB chunks exactly the changed blocks are new.
    let fixed = chunking(&report, "fixed:4KiB");
    assert_eq!(fixed.snapshots[1].new_chunks, k as u64);
    assert_eq!(fixed.snapshots[1].duplicate_chunks, (n - k) as u64);
    // The heatmap counts one change in exactly those blocks.
    let heatmap = &report.heatmaps[0];
    assert_eq!(heatmap.name, "state.bin");
    assert_eq!(heatmap.regions, n as u64);
    assert_eq!(heatmap.transitions, 1);
    for (block, &count) in heatmap.changes.iter().enumerate() {
        assert_eq!(count, u32::from(changed.contains(&block)), "block {block}");
    }
}

#[test]
fn random_data_has_ratio_one_and_does_not_compress() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("noise.bin");
    write(&path, &random(3 << 20, 12));
    let report = run(&[path], &Options::default());
    for c in &report.chunkings {
        assert!(close(c.dedup_ratio, 1.0), "{}: {}", c.spec, c.dedup_ratio);
        assert_eq!(c.unique_chunks, c.chunks);
    }
    let comp = report.compression.expect("compression");
    for codec in &comp.codecs {
        assert!(close(codec.compression_ratio, 1.0), "{codec:?}");
        assert_eq!(codec.compressed_chunks, 0);
    }
    assert_eq!(
        comp.codecs
            .iter()
            .map(|c| c.codec.as_str())
            .collect::<Vec<_>>(),
        ["zstd:1", "zstd:3"]
    );
    assert_eq!(report.snapshots[0].same_offset_fraction_4k, None);
}

#[test]
fn compressible_data_compresses_and_repeats_within_a_snapshot_count() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("md.restart");
    write(&path, &counting_doubles(2 << 20, 7, 1000));
    let block = random(4096, 13);
    let repeated = dir.path().join("repeated.bin");
    write(&repeated, &block.repeat(100));
    let report = run(&[path, repeated], &Options::default());
    let comp = report.compression.as_ref().expect("compression");
    for codec in &comp.codecs {
        assert!(codec.compression_ratio > 3.0, "{codec:?}");
        assert!(codec.compressed_chunks > 0);
    }
    // The second snapshot is one 4 KiB block 100 times: 1 new chunk, 99 duplicates.
    let fixed = chunking(&report, "fixed:4KiB");
    assert_eq!(fixed.snapshots[1].chunks, 100);
    assert_eq!(fixed.snapshots[1].new_chunks, 1);
    assert_eq!(fixed.snapshots[1].duplicate_chunks, 99);
    assert_eq!(fixed.snapshots[1].duplicate_bytes, 99 * 4096);
    let fixed512 = chunking(&report, "fixed:512B");
    assert_eq!(fixed512.snapshots[1].new_chunks, 8);
}

#[test]
fn cdc_finds_data_shifted_by_an_insertion_fixed_chunks_do_not() {
    let dir = TempDir::new().expect("tempdir");
    let data = random(4 << 20, 21);
    let mut shifted = b"x".to_vec();
    shifted.extend_from_slice(&data);
    let first = dir.path().join("a");
    let second = dir.path().join("b");
    write(&first.join("f"), &data);
    write(&second.join("f"), &shifted);
    let report = run(&[first, second], &Options::default());
    let cdc = chunking(&report, "cdc:avg=64KiB");
    assert!(cdc.dedup_ratio > 1.9, "{}", cdc.dedup_ratio);
    let fixed = chunking(&report, "fixed:4KiB");
    assert!(fixed.dedup_ratio < 1.01, "{}", fixed.dedup_ratio);
    assert_eq!(report.snapshots[1].same_offset_blocks_4k, Some(0));
}

#[test]
fn files_that_appear_and_disappear_count_as_changed() {
    let dir = TempDir::new().expect("tempdir");
    let keep = random(40_960, 30);
    let gone = random(8192, 31);
    let born = random(12_288, 32);
    let s1 = dir.path().join("s1");
    let s2 = dir.path().join("s2");
    write(&s1.join("keep"), &keep);
    write(&s1.join("gone"), &gone);
    write(&s1.join("empty"), b"");
    write(&s2.join("keep"), &keep);
    write(&s2.join("born"), &born);
    write(&s2.join("empty"), b"");
    let options = Options {
        heatmaps: true,
        ..Options::default()
    };
    let report = run(&[s1, s2], &options);
    let s = &report.snapshots[1];
    assert_eq!(s.files, 3);
    assert_eq!(s.blocks_4k, 13);
    assert_eq!(s.same_offset_blocks_4k, Some(10));
    let names: Vec<&str> = report.heatmaps.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["born", "empty", "gone", "keep"]);
    let by_name = |name: &str| {
        report
            .heatmaps
            .iter()
            .find(|h| h.name == name)
            .expect("heatmap")
    };
    assert_eq!(by_name("born").changes, [1, 1, 1]);
    assert_eq!(by_name("gone").changes, [1, 1]);
    assert_eq!(by_name("keep").changes, [0; 10]);
    assert_eq!(by_name("empty").regions, 0);
}

#[test]
fn results_do_not_depend_on_the_window() {
    let dir = TempDir::new().expect("tempdir");
    // Random data with repeats at odd offsets, spanning several 1 MiB windows.
    let base = random(5 << 20, 40);
    let mut data = base.clone();
    data.extend_from_slice(&base[12_345..(1 << 20) + 777]);
    data.extend_from_slice(&counting_doubles(700_001, 7, 1000));
    let mut later = data.clone();
    later[3_000_000..3_100_000].copy_from_slice(&random(100_000, 41));
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    write(&a, &data);
    write(&b, &later);
    let mut small = Options::default();
    for spec in [
        "cdc:avg=1MiB",
        "cdc:avg=4KiB",
        "fixed:1536",
        "fixed:1MiB",
        "cdc:min=64,avg=256,max=1024",
    ] {
        small.add_chunking(spec.parse().expect(spec));
    }
    let large = Options {
        window: 64 << 20,
        ..small.clone()
    };
    small.window = 1; // rounded up to 1 MiB
    let paths = [a, b];
    let with_small = run(&paths, &small);
    let with_large = run(&paths, &large);
    let strip = |r: &Report| {
        let mut v = serde_json::to_value(r).expect("json");
        for key in ["elapsed_seconds", "throughput_mb_per_s", "threads"] {
            v.as_object_mut().expect("object").remove(key);
        }
        v
    };
    assert_eq!(strip(&with_small), strip(&with_large));
    // And the CDC chunks are the ones the slice chunker finds over the whole file.
    for spec in [
        "cdc:avg=64KiB",
        "cdc:avg=1MiB",
        "cdc:min=64,avg=256,max=1024",
    ] {
        let c: Chunking = spec.parse().expect(spec);
        let expected = (c.split(&data).count() + c.split(&later).count()) as u64;
        assert_eq!(
            chunking(&with_small, &c.to_string()).chunks,
            expected,
            "{spec}"
        );
    }
}

#[test]
fn json_has_the_documented_fields() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("x");
    write(&path, &random(100_000, 50));
    let report = run(&[path.clone(), path], &Options::default());
    let v = serde_json::to_value(&report).expect("json");
    for key in [
        "format",
        "snapshots",
        "files",
        "total_bytes",
        "chunkings",
        "compression",
        "elapsed_seconds",
        "throughput_mb_per_s",
        "threads",
        "plots",
    ] {
        assert!(v.get(key).is_some(), "no {key}");
    }
    assert_eq!(v["format"], "cascade-analyze/1");
    for key in [
        "index",
        "path",
        "files",
        "bytes",
        "blocks_4k",
        "same_offset_blocks_4k",
        "same_offset_fraction_4k",
    ] {
        assert!(v["snapshots"][1].get(key).is_some(), "no snapshots[].{key}");
    }
    let c = &v["chunkings"][3];
    for key in [
        "spec",
        "chunks",
        "unique_chunks",
        "total_bytes",
        "unique_bytes",
        "duplicate_bytes",
        "dedup_ratio",
        "snapshots",
        "size_histogram",
    ] {
        assert!(c.get(key).is_some(), "no chunkings[].{key}");
    }
    assert!(c["size_histogram"].is_array());
    assert!(v["chunkings"][0]["size_histogram"].is_null());
    for key in [
        "index",
        "chunks",
        "bytes",
        "new_chunks",
        "new_bytes",
        "duplicate_chunks",
        "duplicate_bytes",
        "cumulative_chunks",
        "cumulative_bytes",
        "cumulative_unique_chunks",
        "cumulative_unique_bytes",
        "cumulative_duplicate_chunks",
        "cumulative_duplicate_bytes",
        "cumulative_dedup_ratio",
    ] {
        assert!(
            c["snapshots"][0].get(key).is_some(),
            "no chunkings[].snapshots[].{key}"
        );
    }
    for key in ["min_bytes", "max_bytes", "chunks", "bytes"] {
        assert!(
            c["size_histogram"][0].get(key).is_some(),
            "no size_histogram[].{key}"
        );
    }
    let comp = &v["compression"];
    for key in ["chunking", "unique_chunks", "unique_bytes", "codecs"] {
        assert!(comp.get(key).is_some(), "no compression.{key}");
    }
    for key in [
        "codec",
        "stored_bytes",
        "compressed_chunks",
        "compression_ratio",
        "dedup_compression_ratio",
    ] {
        assert!(comp["codecs"][0].get(key).is_some(), "no codecs[].{key}");
    }
}

#[test]
fn the_histogram_counts_every_cdc_chunk_once() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("x");
    write(&path, &random(3 << 20, 60));
    let report = run(&[path], &Options::default());
    let cdc = chunking(&report, "cdc:avg=64KiB");
    let histogram = cdc.size_histogram.as_ref().expect("histogram");
    assert_eq!(histogram.iter().map(|b| b.chunks).sum::<u64>(), cdc.chunks);
    assert_eq!(
        histogram.iter().map(|b| b.bytes).sum::<u64>(),
        cdc.total_bytes
    );
    for b in histogram {
        assert!(b.min_bytes.is_power_of_two());
        assert_eq!(b.max_bytes, 2 * b.min_bytes - 1);
    }
}

#[test]
fn the_text_report_has_every_section() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("x");
    write(&path, &counting_doubles(1 << 20, 7, 1000));
    let report = run(&[path.clone(), path], &Options::default());
    let text = report.to_text();
    for needle in [
        "2 snapshots, 2 files",
        "1 MB = 10^6 bytes",
        "Snapshots",
        "100.00 %",
        "Dedup over the series",
        "fixed:512B",
        "cdc:avg=64KiB",
        "2.00",
        "Compression of the",
        "zstd:1",
        "zstd:3",
        "Per snapshot",
        "CDC chunk sizes",
        "MB/s",
    ] {
        assert!(text.contains(needle), "no '{needle}' in:\n{text}");
    }
}

#[test]
fn scan_errors_name_the_path() {
    let dir = TempDir::new().expect("tempdir");
    let missing = dir.path().join("missing");
    let err = scan(std::slice::from_ref(&missing)).expect_err("missing");
    assert_eq!(
        err.to_string(),
        format!("{}: No such file or directory", missing.display())
    );
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).expect("mkdir");
    let err = scan(std::slice::from_ref(&empty)).expect_err("empty");
    assert!(err
        .to_string()
        .starts_with(&format!("{}: ", empty.display())));
    assert!(err.to_string().contains("no files"), "{err}");
    let err = scan(&[empty.clone(), empty.clone()]).expect_err("all empty");
    assert!(err.to_string().contains("no files"), "{err}");
    let err = scan(&[Path::new("/dev/null")]).expect_err("device");
    assert_eq!(
        err.to_string(),
        "/dev/null: not a regular file or directory"
    );
    let none: [&Path; 0] = [];
    assert!(scan(&none).is_err());
    // An empty directory in a series with files is just an empty snapshot.
    let full = dir.path().join("full");
    write(&full.join("f"), b"data");
    let series = scan(&[empty, full]).expect("scan");
    assert_eq!(series.file_count(), 1);
}

#[test]
fn symlinks_below_a_directory_are_skipped() {
    let dir = TempDir::new().expect("tempdir");
    let snap = dir.path().join("s");
    write(&snap.join("real"), b"0123456789");
    std::os::unix::fs::symlink(snap.join("real"), snap.join("link")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent", snap.join("dangling")).expect("symlink");
    let series = scan(&[snap]).expect("scan");
    assert_eq!(series.snapshots[0].files.len(), 1);
    assert_eq!(series.snapshots[0].files[0].rel, Path::new("real"));
}

#[test]
fn a_file_that_vanishes_after_the_scan_is_an_error_naming_it() {
    let dir = TempDir::new().expect("tempdir");
    let path = dir.path().join("x");
    write(&path, b"abc");
    let series = scan(std::slice::from_ref(&path)).expect("scan");
    fs::remove_file(&path).expect("rm");
    let err = analyze(&series, &Options::default(), &|_| {}).expect_err("gone");
    assert_eq!(
        err.to_string(),
        format!("{}: No such file or directory", path.display())
    );
}
