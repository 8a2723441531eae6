//! Heatmaps: the Hilbert layout, the colours, and the PNGs written for a real analysis,
//! decoded again with the png crate.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use cascade_analyze::analyze::Options;
use cascade_analyze::heatmap::{
    file_name, hilbert_d2xy, viridis, write_all, Heatmap, ABSENT, BACKGROUND, INK, MIN_WIDTH_PX,
    UNCHANGED,
};
use cascade_analyze::{analyze, scan};
use cascade_testkit::random;
use tempfile::TempDir;

/// (width, height, RGB pixels) of a PNG.
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = fs::File::open(path).expect("open png");
    let decoder = png::Decoder::new(std::io::BufReader::new(file));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn pixel(image: &(u32, u32, Vec<u8>), x: u32, y: u32) -> [u8; 3] {
    let at = ((y * image.0 + x) * 3) as usize;
    [image.2[at], image.2[at + 1], image.2[at + 2]]
}

/// The colour at the centre of cell `d` of the curve.
fn cell(image: &(u32, u32, Vec<u8>), heatmap: &Heatmap, d: u64) -> [u8; 3] {
    let (x, y) = hilbert_d2xy(heatmap.side(), d);
    let scale = heatmap.scale();
    let (x0, y0) = heatmap.map_origin();
    pixel(
        image,
        x0 + x * scale + scale / 2,
        y0 + y * scale + scale / 2,
    )
}

#[test]
fn the_hilbert_curve_visits_every_cell_once_through_neighbours() {
    for order in 0..=6u32 {
        let side = 1u32 << order;
        let cells = u64::from(side) * u64::from(side);
        let mut seen = HashSet::new();
        let mut previous: Option<(u32, u32)> = None;
        for d in 0..cells {
            let (x, y) = hilbert_d2xy(side, d);
            assert!(x < side && y < side);
            assert!(seen.insert((x, y)), "order {order}: ({x}, {y}) twice");
            if let Some((px, py)) = previous {
                assert_eq!(px.abs_diff(x) + py.abs_diff(y), 1, "order {order}, d {d}");
            }
            previous = Some((x, y));
        }
        assert_eq!(hilbert_d2xy(side, 0), (0, 0));
        // The first half of the curve stays in the left half of the square.
        for d in 0..cells / 2 {
            assert!(order == 0 || hilbert_d2xy(side, d).0 < side / 2);
        }
    }
}

#[test]
fn viridis_runs_from_dark_purple_to_yellow() {
    assert_eq!(viridis(0.0), UNCHANGED);
    assert_eq!(viridis(0.0), [0x44, 0x01, 0x54]);
    assert_eq!(viridis(1.0), [0xfd, 0xe7, 0x25]);
    assert_eq!(viridis(-3.0), viridis(0.0));
    assert_eq!(viridis(7.0), viridis(1.0));
    assert_eq!(viridis(f64::NAN), viridis(0.0));
    let luminance =
        |c: [u8; 3]| 299 * u32::from(c[0]) + 587 * u32::from(c[1]) + 114 * u32::from(c[2]);
    let mut last = 0;
    for i in 0..=20 {
        let l = luminance(viridis(f64::from(i) / 20.0));
        assert!(l >= last, "viridis gets lighter");
        last = l;
    }
}

#[test]
fn sizes_follow_the_number_of_regions() {
    let heatmap = |regions: u64| Heatmap {
        name: "x".into(),
        region_size: 4096,
        regions,
        transitions: 2,
        changes: vec![0; regions as usize],
    };
    // (regions, order, cells drawn, map size in pixels)
    for (regions, order, cells, map) in [
        (0, 0, (1, 1), (512, 512)),
        (1, 0, (1, 1), (512, 512)),
        (2, 1, (1, 2), (256, 512)),
        (3, 1, (2, 2), (512, 512)),
        (4, 1, (2, 2), (512, 512)),
        (5, 2, (2, 4), (256, 512)),
        (1000, 5, (32, 32), (512, 512)),
        (32_768, 8, (128, 256), (256, 512)),
        (262_144, 9, (512, 512), (512, 512)),
        (262_145, 10, (512, 1024), (512, 1024)),
        (1 << 20, 10, (1024, 1024), (1024, 1024)),
    ] {
        let h = heatmap(regions);
        assert_eq!(h.order(), order, "{regions} regions");
        assert_eq!(h.cells(), cells, "{regions} regions");
        assert_eq!(h.map_size(), map, "{regions} regions");
        // The map centred under the title, at least MIN_WIDTH_PX wide, the legend below.
        let (w, hgt) = h.image_size();
        assert_eq!(w, map.0.max(MIN_WIDTH_PX), "{regions} regions");
        let (x0, y0) = h.map_origin();
        assert_eq!(x0, (w - map.0) / 2, "{regions} regions");
        assert!(y0 >= 20, "{regions} regions: a title band above the map");
        assert!(
            hgt >= y0 + map.1 + 60,
            "{regions} regions: a legend below the map"
        );
        let (rw, rh, pixels) = h.render();
        assert_eq!((rw, rh), (w, hgt));
        assert_eq!(pixels.len(), (w * hgt * 3) as usize);
    }
}

/// Pixels of `colour` in rows `rows` of an image.
fn count_in_rows(
    image: &(u32, u32, Vec<u8>),
    rows: std::ops::Range<u32>,
    colour: [u8; 3],
) -> usize {
    rows.flat_map(|y| (0..image.0).map(move |x| (x, y)))
        .filter(|&(x, y)| pixel(image, x, y) == colour)
        .count()
}

#[test]
fn the_title_names_the_file_and_the_legend_says_what_the_colours_count() {
    let make = |name: &str, transitions: u32| Heatmap {
        name: name.into(),
        region_size: 8192,
        regions: 100,
        transitions,
        changes: vec![0; 100],
    };
    let h = make("rank0/model.bin", 4);
    let (name, what) = h.title();
    assert_eq!(name, "rank0/model.bin");
    assert!(
        what.contains("5 snapshots") && what.contains("100 regions of 8 KiB"),
        "{what}"
    );
    let legend = h.legend();
    assert!(legend.contains("of the 4 snapshot transitions"), "{legend}");
    assert!(legend.contains("yellow, every time"), "{legend}");

    // The title band has text in it, and a different name draws different text.
    let image = h.render();
    let (_, y0) = h.map_origin();
    assert!(count_in_rows(&image, 0..y0, INK) > 200);
    let other = make("rank1/model.bin", 4).render();
    assert_ne!(
        image.2[..(y0 * image.0 * 3) as usize],
        other.2[..(y0 * image.0 * 3) as usize]
    );
    // The legend has the colour bar's both ends, the grey swatch and text.
    let below = y0 + h.map_size().1;
    assert!(count_in_rows(&image, below..image.1, INK) > 500);
    assert!(count_in_rows(&image, below..image.1, ABSENT) > 0);
    assert!(count_in_rows(&image, below..image.1, viridis(1.0)) > 0);
    // A name too long for a line wraps: the map moves down, nothing is cut off.
    let long = make(&"x/".repeat(100), 4);
    assert!(long.map_origin().1 > y0);
    assert_eq!(long.image_size().0, h.image_size().0);
}

#[test]
fn file_names_are_sanitised_and_unique() {
    assert_eq!(file_name("grid.npy"), "grid.npy.png");
    assert_eq!(file_name("rank0/state.bin"), "rank0__state.bin.png");
    assert_eq!(file_name("a b:c"), "a_b_c.png");
    assert_eq!(file_name(""), "file.png");
    assert_eq!(file_name(".."), "file...png");
    let dir = TempDir::new().expect("tempdir");
    let make = |name: &str| Heatmap {
        name: name.into(),
        region_size: 4096,
        regions: 1,
        transitions: 0,
        changes: vec![0],
    };
    let written = write_all(
        &[make("a b"), make("a_b"), make("a:b")],
        &dir.path().join("new/dir"),
    )
    .expect("write");
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a_b.png", "a_b-2.png", "a_b-3.png"]);
    assert!(written.iter().all(|p| p.exists()));
}

fn analyse_and_plot(paths: &[PathBuf], out: &Path) -> (Vec<Heatmap>, Vec<PathBuf>) {
    let series = scan(paths).expect("scan");
    let options = Options {
        heatmaps: true,
        ..Options::default()
    };
    let report = analyze(&series, &options, &|_| {}).expect("analyze");
    let written = write_all(&report.heatmaps, out).expect("plot");
    (report.heatmaps, written)
}

#[test]
fn an_unchanged_file_is_all_the_unchanged_colour() {
    let dir = TempDir::new().expect("tempdir");
    let data = random(1000 * 4096, 1); // 1000 regions: a 32 x 32 map of 16-pixel cells
    let mut paths = Vec::new();
    for i in 0..3 {
        let snap = dir.path().join(format!("s{i}"));
        fs::create_dir_all(snap.join("rank0")).expect("mkdir");
        fs::write(snap.join("rank0/model.bin"), &data).expect("write");
        paths.push(snap);
    }
    let out = dir.path().join("plots");
    let (heatmaps, written) = analyse_and_plot(&paths, &out);
    assert_eq!(written, [out.join("rank0__model.bin.png")]);
    let heatmap = &heatmaps[0];
    let image = decode(&written[0]);
    assert_eq!((image.0, image.1), heatmap.image_size());
    assert_eq!(heatmap.map_size(), (512, 512));
    let (x0, y0) = heatmap.map_origin();
    let map_height = y0 + 512;
    let mut unchanged = 0;
    let mut absent = 0;
    for y in y0..map_height {
        for x in x0..x0 + 512 {
            match pixel(&image, x, y) {
                UNCHANGED => unchanged += 1,
                ABSENT => absent += 1,
                other => panic!("({x}, {y}) is {other:?}"),
            }
        }
    }
    assert_eq!(unchanged, 1000 * 256);
    assert_eq!(absent, 24 * 256);
    for d in 0..1000 {
        assert_eq!(cell(&image, heatmap, d), UNCHANGED);
    }
    for d in 1000..1024 {
        assert_eq!(cell(&image, heatmap, d), ABSENT);
    }
    // The legend: white background, the colour bar from the unchanged colour to yellow.
    assert_eq!(pixel(&image, 2, map_height + 1), BACKGROUND);
    assert_eq!(pixel(&image, 9, map_height + 16), UNCHANGED);
    assert_eq!(pixel(&image, image.0 - 10, map_height + 16), viridis(1.0));
}

#[test]
fn changed_regions_get_the_colour_of_their_count() {
    let dir = TempDir::new().expect("tempdir");
    let mut data = random(64 * 4096, 2);
    let mut paths = Vec::new();
    // Block 5 changes in every transition, block 9 in the first only, the rest never.
    for step in 0..4 {
        if step > 0 {
            data[5 * 4096] = data[5 * 4096].wrapping_add(1);
        }
        if step == 1 {
            data[9 * 4096 + 100] ^= 1;
        }
        let path = dir.path().join(format!("ckpt{step}.dat"));
        fs::write(&path, &data).expect("write");
        paths.push(path);
    }
    let out = dir.path().join("plots");
    let (heatmaps, written) = analyse_and_plot(&paths, &out);
    assert_eq!(written, [out.join("ckpt0.dat.png")]);
    let heatmap = &heatmaps[0];
    assert_eq!(heatmap.transitions, 3);
    assert_eq!(heatmap.changes[5], 3);
    assert_eq!(heatmap.changes[9], 1);
    assert_eq!(heatmap.changes.iter().sum::<u32>(), 4);
    let image = decode(&written[0]);
    assert_eq!((image.0, image.1), heatmap.image_size());
    assert_eq!(cell(&image, heatmap, 5), viridis(1.0));
    assert_eq!(cell(&image, heatmap, 9), viridis(1.0 / 3.0));
    assert_eq!(cell(&image, heatmap, 0), UNCHANGED);
    assert_eq!(cell(&image, heatmap, 63), UNCHANGED);
}
