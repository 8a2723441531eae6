//! `cascade analyze`, run as the real binary on small series made here: the text report,
//! `--json`, `--plot` (PNGs decoded again), `--chunking`, and one-line errors with exit 1.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tempfile::TempDir;

use cascade_testkit::pattern;
use cascade_testkit::real_series;

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
/// viridis(0): the colour of regions that never changed.
const UNCHANGED: [u8; 3] = [0x44, 0x01, 0x54];
/// viridis(1): regions that changed in every transition.
const ALWAYS: [u8; 3] = [0xfd, 0xe7, 0x25];
/// The colour of the title and legend text.
const INK: [u8; 3] = [0x20, 0x20, 0x20];

fn cascade(args: &[&str], home: &Path) -> Output {
    Command::new(CASCADE)
        .args(args)
        .env_clear()
        .env("HOME", home)
        .output()
        .expect("run cascade")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Three checkpoint directories: `frozen.bin` never changes, `state.bin` changes its second
/// half at every step.
fn series(dir: &Path) -> Vec<PathBuf> {
    let frozen = pattern(256 * 1024, 1);
    let mut state = pattern(512 * 1024, 2);
    (1..=3)
        .map(|step| {
            let ckpt = dir.join(format!("ckpt.{step}"));
            fs::create_dir_all(ckpt.join("rank0")).expect("mkdir");
            let half = state.len() / 2;
            let fresh = pattern(state.len() - half, 100 + step);
            state[half..].copy_from_slice(&fresh);
            fs::write(ckpt.join("frozen.bin"), &frozen).expect("write");
            fs::write(ckpt.join("rank0/state.bin"), &state).expect("write");
            ckpt
        })
        .collect()
}

fn strs(paths: &[PathBuf]) -> Vec<&str> {
    paths.iter().map(|p| p.to_str().expect("utf-8")).collect()
}

#[test]
fn prints_a_text_report() {
    let dir = TempDir::new().expect("tempdir");
    let paths = series(dir.path());
    let mut args = vec!["analyze"];
    args.extend(strs(&paths));
    let out = cascade(&args, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out.stderr.is_empty(),
        "no progress bar off a terminal: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    for needle in [
        "3 snapshots, 6 files",
        "1 MB = 10^6 bytes",
        "same offset",
        "fixed:512B",
        "fixed:4KiB",
        "fixed:8KiB",
        "cdc:avg=64KiB",
        "zstd:1",
        "zstd:3",
        "CDC chunk sizes",
        "MB/s",
    ] {
        assert!(stdout.contains(needle), "no '{needle}' in:\n{stdout}");
    }
    // frozen (64 blocks) + unchanged first half of state (64 of 128): 128 of 192 blocks.
    assert!(stdout.contains("66.67 %"), "{stdout}");
}

#[test]
fn json_report_has_the_figures() {
    let dir = TempDir::new().expect("tempdir");
    let paths = series(dir.path());
    let mut args = vec!["analyze", "--json", "--dedup", "fixed:64KiB"];
    args.extend(strs(&paths));
    let out = cascade(&args, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["format"], "cascade-analyze/1");
    assert_eq!(report["files"], 6);
    let total = 3 * (256 + 512) * 1024;
    assert_eq!(report["total_bytes"], total);
    let specs: Vec<&str> = report["chunkings"]
        .as_array()
        .expect("chunkings")
        .iter()
        .map(|c| c["spec"].as_str().expect("spec"))
        .collect();
    assert_eq!(
        specs,
        [
            "fixed:512B",
            "fixed:4KiB",
            "fixed:8KiB",
            "cdc:avg=64KiB",
            "fixed:64KiB"
        ]
    );
    // Unique: frozen once, state's first half once, its second half three times.
    let unique = (256 + 256 + 3 * 256) * 1024;
    let fixed = &report["chunkings"][1];
    assert_eq!(fixed["unique_bytes"], unique);
    let ratio = fixed["dedup_ratio"].as_f64().expect("ratio");
    assert!(
        (ratio - total as f64 / unique as f64).abs() < 1e-9,
        "{ratio}"
    );
    let snaps = report["snapshots"].as_array().expect("snapshots");
    assert!(snaps[0]["same_offset_fraction_4k"].is_null());
    let fraction = snaps[2]["same_offset_fraction_4k"]
        .as_f64()
        .expect("fraction");
    assert!((fraction - 128.0 / 192.0).abs() < 1e-9, "{fraction}");
    assert_eq!(fixed["snapshots"][1]["new_bytes"], 256 * 1024);
    assert_eq!(fixed["snapshots"][2]["cumulative_unique_bytes"], unique);
    assert!(report["compression"]["codecs"][0]["compression_ratio"].is_number());
    assert!(report["chunkings"][3]["size_histogram"].is_array());
    assert_eq!(report["plots"], Value::Array(Vec::new()));
}

/// (width, height, RGB) of a PNG.
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = fs::File::open(path).expect("open png");
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn pixel(image: &(u32, u32, Vec<u8>), x: u32, y: u32) -> [u8; 3] {
    let at = ((y * image.0 + x) * 3) as usize;
    [image.2[at], image.2[at + 1], image.2[at + 2]]
}

/// The first row whose pixel at column x has the unchanged colour: the map's top.
fn map_top(image: &(u32, u32, Vec<u8>), x: u32) -> u32 {
    (0..image.1)
        .find(|&y| pixel(image, x, y) == UNCHANGED)
        .expect("a map")
}

/// Pixels of `colour` in rows `rows`.
fn count(image: &(u32, u32, Vec<u8>), rows: std::ops::Range<u32>, colour: [u8; 3]) -> usize {
    rows.flat_map(|y| (0..image.0).map(move |x| (x, y)))
        .filter(|&(x, y)| pixel(image, x, y) == colour)
        .count()
}

/// The PNG's UTF-8 text chunks by keyword.
fn png_texts(path: &Path) -> std::collections::HashMap<String, String> {
    let file = fs::File::open(path).expect("open png");
    let reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .expect("png header");
    reader
        .info()
        .utf8_text
        .iter()
        .map(|t| (t.keyword.clone(), t.get_text().expect("text")))
        .collect()
}

#[test]
fn plot_writes_a_heatmap_per_file() {
    let dir = TempDir::new().expect("tempdir");
    let paths = series(dir.path());
    let plots = dir.path().join("plots");
    let mut args = vec!["analyze", "--plot", plots.to_str().expect("utf-8")];
    args.extend(strs(&paths));
    let out = cascade(&args, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let frozen = plots.join("frozen.bin.png");
    let state = plots.join("rank0__state.bin.png");
    assert!(stdout.contains("Wrote 2 heatmaps"), "{stdout}");
    assert!(stdout.contains(frozen.to_str().expect("utf-8")), "{stdout}");
    assert!(stdout.contains(state.to_str().expect("utf-8")), "{stdout}");

    // frozen.bin: 64 regions, an 8 x 8 map of 64-pixel cells, all unchanged, below a title
    // band and above a legend taller than the old 36-pixel strip of two numbers.
    let image = decode(&frozen);
    let top = map_top(&image, 16);
    assert!(top >= 20, "a title band above the map");
    assert_eq!(image.0, 512);
    assert!(
        image.1 >= top + 512 + 60,
        "a legend below the map: {}",
        image.1
    );
    for y in top..top + 512 {
        for x in 0..512 {
            assert_eq!(pixel(&image, x, y), UNCHANGED, "({x}, {y})");
        }
    }
    assert!(count(&image, 0..top, INK) > 200, "title text");
    assert!(count(&image, top + 512..image.1, INK) > 500, "legend text");
    assert!(
        count(&image, top + 512..image.1, ALWAYS) > 0,
        "the colour bar"
    );
    let texts = png_texts(&frozen);
    assert_eq!(texts["Title"], "Change heatmap of frozen.bin");
    let description = &texts["Description"];
    assert!(
        description.contains("3 snapshots: 64 regions of 4 KiB"),
        "{description}"
    );
    assert!(
        description.contains("of the 2 snapshot transitions"),
        "{description}"
    );
    // state.bin: 128 regions, the left half of a 16 x 16 map (32-pixel cells), centred in an
    // image 512 wide. The first quarter of the curve (the file's first half, never changed)
    // fills the top-left quarter of the square, the second (the file's second half, changed
    // in both transitions) the bottom-left one.
    let image = decode(&state);
    assert_eq!(image.0, 512);
    let (x0, y0) = (128, map_top(&image, 128 + 16));
    assert_eq!(pixel(&image, x0 + 16, y0 + 16), UNCHANGED);
    assert_eq!(pixel(&image, x0 + 240, y0 + 240), UNCHANGED);
    assert_eq!(pixel(&image, x0 + 16, y0 + 500), ALWAYS);
    assert_eq!(pixel(&image, x0 + 240, y0 + 272), ALWAYS);
    assert_eq!(
        png_texts(&state)["Title"],
        "Change heatmap of rank0/state.bin"
    );

    // With --json the files written are listed there.
    let mut args = vec![
        "analyze",
        "--json",
        "--plot",
        plots.to_str().expect("utf-8"),
    ];
    args.extend(strs(&paths));
    let out = cascade(&args, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let listed: Vec<&str> = report["plots"]
        .as_array()
        .expect("plots")
        .iter()
        .map(|p| p.as_str().expect("path"))
        .collect();
    assert_eq!(
        listed,
        [
            frozen.to_str().expect("utf-8"),
            state.to_str().expect("utf-8")
        ]
    );
}

fn assert_one_line_failure(out: &Output, code: i32, expected: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("cascade: "), "{stderr}");
    assert!(stderr.contains(expected), "'{expected}' not in {stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn errors_are_one_line() {
    let dir = TempDir::new().expect("tempdir");
    let home = dir.path();
    let paths = series(dir.path());
    let missing = dir.path().join("ckpt.9");
    let missing_str = missing.to_str().expect("utf-8");

    let out = cascade(&["analyze", strs(&paths)[0], missing_str], home);
    assert_one_line_failure(
        &out,
        1,
        &format!("{missing_str}: No such file or directory"),
    );

    let empty = dir.path().join("empty");
    fs::create_dir(&empty).expect("mkdir");
    let empty_str = empty.to_str().expect("utf-8");
    let out = cascade(&["analyze", empty_str], home);
    assert_one_line_failure(&out, 1, &format!("{empty_str}: no files to analyse"));

    let out = cascade(&["analyze", "/dev/null"], home);
    assert_one_line_failure(&out, 1, "/dev/null: not a regular file or directory");

    // --plot into something that is a file.
    let file = paths[0].join("frozen.bin");
    let out = cascade(
        &[
            "analyze",
            "--plot",
            file.to_str().expect("utf-8"),
            strs(&paths)[0],
        ],
        home,
    );
    assert_one_line_failure(&out, 1, file.to_str().expect("utf-8"));

    // Usage errors: exit 2.
    let out = cascade(&["analyze"], home);
    assert_one_line_failure(&out, 2, "PATH");
    let out = cascade(
        &["analyze", "--chunking", "fixed:100", strs(&paths)[0]],
        home,
    );
    assert_one_line_failure(&out, 2, "fixed chunk size 100B is out of range");
    let out = cascade(
        &["analyze", "--chunking", "cdc:avg=64KB", strs(&paths)[0]],
        home,
    );
    assert_one_line_failure(&out, 2, "binary units");
}

#[test]
fn real_series_show_what_the_papers_measured() {
    let dir = TempDir::new().expect("tempdir");
    let report = |name: &str| -> Value {
        real_series::make_quick(dir.path(), &[name]);
        let paths = real_series::snapshots(dir.path(), name);
        assert_eq!(paths.len(), 3, "{name}: {paths:?}");
        let mut args = vec!["analyze", "--json"];
        args.extend(strs(&paths));
        let out = cascade(&args, dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let same_offset = |r: &Value, i: usize| {
        r["snapshots"][i]["same_offset_fraction_4k"]
            .as_f64()
            .expect("fraction")
    };
    let zstd1 = |r: &Value| {
        r["compression"]["codecs"]
            .as_array()
            .expect("codecs")
            .iter()
            .find(|c| c["codec"] == "zstd:1")
            .and_then(|c| c["compression_ratio"].as_f64())
            .expect("zstd:1 ratio")
    };

    // Molecular dynamics: every atom moves, so no 4 KiB block repeats between restarts, but
    // integers stored as doubles compress 1.5-1.8x.
    let lammps = report("lammps");
    for i in 1..3 {
        assert!(same_offset(&lammps, i) < 0.01, "lammps snapshot {i}");
    }
    let ratio = zstd1(&lammps);
    assert!((1.5..2.2).contains(&ratio), "lammps zstd:1 {ratio}");

    // Training with a frozen layer and a sparsely updated embedding: a large share of the
    // 4 KiB blocks repeats at the same offset.
    let torch = report("torch");
    for i in 1..3 {
        let f = same_offset(&torch, i);
        assert!(f > 0.3, "torch snapshot {i}: {f}");
    }
    let fixed4k = &torch["chunkings"][1];
    assert_eq!(fixed4k["spec"], "fixed:4KiB");
    assert!(
        fixed4k["dedup_ratio"].as_f64().expect("ratio") > 1.3,
        "{fixed4k}"
    );
}
