//! Change heatmaps (paper 003, Figure 3): one PNG per file of a series. The file is divided
//! into regions (4 KiB blocks, or 4 KiB times a power of two so that there are at most
//! 1024 x 1024), each region is counted once for every snapshot transition in which any of
//! its blocks changed, and the regions are laid out along a Hilbert curve, so that regions
//! near each other in the file stay near each other in the picture.
//!
//! Layout of the image, top to bottom, so that it reads without the docs:
//! - a title band: "Change heatmap: " and the file's name (bold), then how many snapshots and
//!   regions of what size, and where the curve starts;
//! - the map: a square of `side` x `side` cells, `side` = 2^order the smallest power of two
//!   with side^2 >= regions; each cell is `scale` x `scale` pixels, with scale =
//!   max(1, 512 / side), so the map is at least 512 pixels tall. Region i is the cell at the
//!   i-th point of the curve, which starts at the top-left corner and ends at the top-right
//!   one. The first half of the curve fills the left half of the square, so when the regions
//!   fit in half the cells only the left half is drawn. Colours are viridis from dark purple
//!   (never changed) to yellow (changed in every transition); cells past the end of the file
//!   are grey. The map is centred in an image at least [`MIN_WIDTH_PX`] wide;
//! - a legend: the colour of each change count from 0 (left) to the number of transitions
//!   (right) with the counts under it, a sentence saying what the colour counts, and the grey
//!   of "past the end of the file".
//!
//! The PNG also carries the title and the legend as text (iTXt `Title` and `Description`).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::analyze::Error;

/// Most cells a heatmap has (1024 x 1024).
pub const MAX_CELLS: u64 = 1 << 20;
/// Smallest width of the map in pixels (small maps get bigger cells).
pub const MIN_SIDE_PX: u32 = 512;
/// Smallest width of the image: room for the title and legend text beside a half-width map.
pub const MIN_WIDTH_PX: u32 = 512;
/// Colour of cells past the end of the file.
pub const ABSENT: [u8; 3] = [0xc8, 0xc8, 0xc8];
/// Colour of the title band's and the legend's background.
pub const BACKGROUND: [u8; 3] = [0xff, 0xff, 0xff];
/// Colour of the text.
pub const INK: [u8; 3] = [0x20, 0x20, 0x20];

/// Margin around the text, in pixels.
const MARGIN: u32 = 8;
/// Glyphs are 8 x 8 pixels (font8x8); a line of text is 12 pixels.
const GLYPH: u32 = 8;
const LINE: u32 = 12;
/// Height of the legend's colour bar.
const BAR: u32 = 16;

/// Viridis at 0.0, 0.1, ..., 1.0 (matplotlib's values), interpolated linearly between.
const VIRIDIS: [[u8; 3]; 11] = [
    [0x44, 0x01, 0x54],
    [0x48, 0x24, 0x75],
    [0x41, 0x44, 0x87],
    [0x35, 0x5f, 0x8d],
    [0x2a, 0x78, 0x8e],
    [0x21, 0x91, 0x8c],
    [0x22, 0xa8, 0x84],
    [0x44, 0xbf, 0x70],
    [0x7a, 0xd1, 0x51],
    [0xbd, 0xdf, 0x26],
    [0xfd, 0xe7, 0x25],
];

/// Colour of cells that never changed: viridis(0), dark purple.
pub const UNCHANGED: [u8; 3] = VIRIDIS[0];

/// The change counts of one file over a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// The file's path relative to its snapshot directory, or the file name for a series
    /// of single files.
    pub name: String,
    /// Bytes per region (a multiple of 4 KiB).
    pub region_size: u64,
    /// Regions of the largest version of the file.
    pub regions: u64,
    /// Transitions in the series (snapshots - 1): the highest possible count.
    pub transitions: u32,
    /// Per region, in how many transitions it changed.
    pub changes: Vec<u32>,
}

/// Viridis at `t` in 0..=1 (clamped).
pub fn viridis(t: f64) -> [u8; 3] {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let x = t * (VIRIDIS.len() - 1) as f64;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    let mix = |k: usize| (f64::from(a[k]) + (f64::from(b[k]) - f64::from(a[k])) * f).round() as u8;
    [mix(0), mix(1), mix(2)]
}

/// Point `d` of the Hilbert curve that fills a `side` x `side` square (side a power of
/// two): (x, y), starting at (0, 0) and ending at (side - 1, 0).
pub fn hilbert_d2xy(side: u32, d: u64) -> (u32, u32) {
    let (mut x, mut y) = (0u64, 0u64);
    let mut t = d;
    let mut s = 1u64;
    while s < u64::from(side) {
        let rx = 1 & (t / 2);
        let ry = 1 & (t ^ rx);
        if ry == 0 {
            if rx == 1 {
                x = s - 1 - x;
                y = s - 1 - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        x += s * rx;
        y += s * ry;
        t /= 4;
        s *= 2;
    }
    (x as u32, y as u32)
}

impl Heatmap {
    /// The Hilbert curve's order: the smallest k with 4^k >= regions.
    pub fn order(&self) -> u32 {
        let mut k = 0;
        while (1u64 << (2 * k)) < self.regions {
            k += 1;
        }
        k
    }

    /// Cells per side of the map.
    pub fn side(&self) -> u32 {
        1 << self.order()
    }

    /// Pixels per cell side.
    pub fn scale(&self) -> u32 {
        (MIN_SIDE_PX / self.side()).max(1)
    }

    /// (columns, rows) of cells drawn: the whole square, or its left half when the regions
    /// fit there.
    pub fn cells(&self) -> (u32, u32) {
        let side = self.side();
        if side >= 2 && self.regions <= u64::from(side) * u64::from(side) / 2 {
            (side / 2, side)
        } else {
            (side, side)
        }
    }

    /// (width, height) of the image: title band, map and legend.
    pub fn image_size(&self) -> (u32, u32) {
        let layout = self.layout();
        (layout.width, layout.height)
    }

    /// (x, y) of the map's top-left pixel in the image.
    pub fn map_origin(&self) -> (u32, u32) {
        let layout = self.layout();
        (layout.map_x, layout.map_y)
    }

    /// (width, height) of the map in pixels.
    pub fn map_size(&self) -> (u32, u32) {
        let (columns, rows) = self.cells();
        (columns * self.scale(), rows * self.scale())
    }

    /// Colour of a region that changed in `changes` transitions.
    pub fn colour(&self, changes: u32) -> [u8; 3] {
        if self.transitions == 0 {
            UNCHANGED
        } else {
            viridis(f64::from(changes) / f64::from(self.transitions))
        }
    }

    /// The title: the file's name, then what the map shows.
    pub fn title(&self) -> (String, String) {
        let snapshots = u64::from(self.transitions) + 1;
        let what = format!(
            "{snapshots} snapshot{}: {} region{} of {} (a cell each), in file order along a \
             Hilbert curve from the top-left corner",
            if snapshots == 1 { "" } else { "s" },
            self.regions,
            if self.regions == 1 { "" } else { "s" },
            binary_size(self.region_size),
        );
        (self.name.clone(), what)
    }

    /// What the colours mean, as the legend says it.
    pub fn legend(&self) -> String {
        let t = self.transitions;
        if t == 0 {
            "colour: in how many snapshot transitions a region changed; a single snapshot has \
             none, so every region is 0 (dark purple)"
                .to_string()
        } else {
            format!(
                "colour: in how many of the {t} snapshot transition{} a region changed, from 0 \
                 (dark purple, never) to {t} (yellow, every time)",
                if t == 1 { "" } else { "s" }
            )
        }
    }

    /// Where everything goes: text wrapped to the image's width.
    fn layout(&self) -> Layout {
        let (map_w, map_h) = self.map_size();
        let width = map_w.max(MIN_WIDTH_PX);
        let chars = ((width - 2 * MARGIN) / GLYPH) as usize;
        let (name, what) = self.title();
        let name = wrap(&format!("Change heatmap: {name}"), chars);
        let what = wrap(&what, chars);
        let title_h = MARGIN + (name.len() + what.len()) as u32 * LINE + MARGIN / 2;
        let legend = wrap(&self.legend(), chars);
        // Gap, bar, counts, the sentence, the grey swatch's line.
        let legend_h = MARGIN + BAR + 4 + LINE + 4 + (legend.len() as u32 + 1) * LINE + MARGIN;
        Layout {
            width,
            height: title_h + map_h + legend_h,
            map_x: (width - map_w) / 2,
            map_y: title_h,
            name,
            what,
            legend,
        }
    }

    /// The image as RGB rows, top to bottom: (width, height, pixels).
    pub fn render(&self) -> (u32, u32, Vec<u8>) {
        let layout = self.layout();
        let (width, height) = (layout.width, layout.height);
        let mut canvas = Canvas {
            width: width as usize,
            height: height as usize,
            pixels: vec![0u8; width as usize * height as usize * 3],
        };
        canvas.fill(0, 0, width, height, BACKGROUND);
        // The title band.
        let mut y = MARGIN;
        for line in &layout.name {
            canvas.text(MARGIN, y, line, true);
            y += LINE;
        }
        for line in &layout.what {
            canvas.text(MARGIN, y, line, false);
            y += LINE;
        }
        // The map.
        let side = self.side();
        let scale = self.scale();
        let (columns, rows) = self.cells();
        let cells = u64::from(columns) * u64::from(rows);
        for d in 0..cells {
            let rgb = match self.changes.get(d as usize) {
                Some(&c) if d < self.regions => self.colour(c),
                _ => ABSENT,
            };
            let (x, y) = hilbert_d2xy(side, d);
            canvas.fill(
                layout.map_x + x * scale,
                layout.map_y + y * scale,
                scale,
                scale,
                rgb,
            );
        }
        // The legend: the colour bar, one step per count, the counts under their steps.
        let top = layout.map_y + rows * scale + MARGIN;
        let bar = width - 2 * MARGIN;
        let steps = self.transitions + 1;
        for x in 0..bar {
            let count = (u64::from(x) * u64::from(steps) / u64::from(bar)) as u32;
            canvas.fill(MARGIN + x, top, 1, BAR, self.colour(count.min(steps - 1)));
        }
        let counts_y = top + BAR + 4;
        let step_w = bar / steps;
        // Every count if they fit, else every k-th; the last one always.
        let label_w = (self.transitions.to_string().len() as u32 + 2) * GLYPH;
        let every = label_w.div_ceil(step_w.max(1)).max(1);
        for count in 0..steps {
            if count % every != 0 && count != steps - 1 {
                continue;
            }
            if count != steps - 1 && (steps - 1 - count) < every {
                continue; // would overlap the last label
            }
            let label = count.to_string();
            let w = label.len() as u32 * GLYPH;
            let at = u64::from(count) * u64::from(bar) / u64::from(steps);
            let centre = MARGIN + at as u32 + bar / (2 * steps);
            let x = centre
                .saturating_sub(w / 2)
                .clamp(MARGIN, width - MARGIN - w);
            canvas.text(x, counts_y, &label, false);
        }
        let mut y = counts_y + LINE + 4;
        for line in &layout.legend {
            canvas.text(MARGIN, y, line, false);
            y += LINE;
        }
        canvas.fill(MARGIN, y, 2 * GLYPH, GLYPH, ABSENT);
        canvas.text(
            MARGIN + 3 * GLYPH,
            y,
            "grey: past the end of the file",
            false,
        );
        (width, height, canvas.pixels)
    }

    /// Writes the image as an 8-bit RGB PNG, with the title and legend as text chunks.
    pub fn write_png(&self, path: &Path) -> Result<(), Error> {
        let (width, height, pixels) = self.render();
        let file = File::create(path).map_err(|e| Error::io(path, &e))?;
        let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let png_error = |e: png::EncodingError| Error {
            path: path.to_path_buf(),
            message: format!("writing PNG: {e}"),
        };
        let (name, what) = self.title();
        encoder
            .add_itxt_chunk("Title".into(), format!("Change heatmap of {name}"))
            .map_err(png_error)?;
        encoder
            .add_itxt_chunk(
                "Description".into(),
                format!(
                    "{what}. {}; grey: past the end of the file. Made by cascade analyze --plot.",
                    self.legend()
                ),
            )
            .map_err(png_error)?;
        let mut writer = encoder.write_header().map_err(png_error)?;
        writer.write_image_data(&pixels).map_err(png_error)?;
        writer.finish().map_err(png_error)
    }
}

/// Positions and wrapped text of one image.
struct Layout {
    width: u32,
    height: u32,
    map_x: u32,
    map_y: u32,
    name: Vec<String>,
    what: Vec<String>,
    legend: Vec<String>,
}

/// An RGB image being drawn; drawing past its edges is clipped.
struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    fn fill(&mut self, x0: u32, y0: u32, w: u32, h: u32, rgb: [u8; 3]) {
        let (x0, y0) = (x0 as usize, y0 as usize);
        for y in y0..(y0 + h as usize).min(self.height) {
            for x in x0..(x0 + w as usize).min(self.width) {
                let at = (y * self.width + x) * 3;
                self.pixels[at..at + 3].copy_from_slice(&rgb);
            }
        }
    }

    /// Draws `text` in the 8 x 8 font from (x, y), bold by drawing it twice a pixel apart.
    /// Characters outside ASCII are drawn as `?`.
    fn text(&mut self, x: u32, y: u32, text: &str, bold: bool) {
        for (i, ch) in text.chars().enumerate() {
            let code = if ch.is_ascii() && !ch.is_ascii_control() {
                ch as usize
            } else {
                usize::from(b'?')
            };
            let glyph = font8x8::legacy::BASIC_LEGACY[code];
            let left = x + i as u32 * GLYPH;
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..GLYPH {
                    // font8x8: bit 0 is the leftmost pixel.
                    if bits & (1 << col) != 0 {
                        let w = if bold { 2 } else { 1 };
                        self.fill(left + col, y + row as u32, w, 1, INK);
                    }
                }
            }
        }
    }
}

/// `text` in lines of at most `width` characters, broken at spaces where possible (a word
/// longer than a line, such as a long path, is cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line: Vec<char> = Vec::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let word: Vec<char> = word.chars().collect();
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(line.drain(..).collect());
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.extend(word);
        while line.len() > width {
            let rest = line.split_off(width);
            lines.push(line.iter().collect());
            line = rest;
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line.iter().collect());
    }
    lines
}

/// Bytes in binary units: "4 KiB", "1 MiB", "12288 B".
fn binary_size(bytes: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= size && bytes % size == 0 {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} B")
}

/// The PNG file name for a file's heatmap: its relative path with `/` turned into `__` and
/// anything but letters, digits, `.`, `-` and `_` into `_`, plus `.png`.
pub fn file_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for ch in name.chars() {
        match ch {
            '/' => out.push_str("__"),
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') => out.push(c),
            _ => out.push('_'),
        }
    }
    if out.is_empty() || out.chars().all(|c| c == '.') {
        out = format!("file{out}");
    }
    out.push_str(".png");
    out
}

/// Writes every heatmap into `dir` (created if missing): the paths written, in order. Two
/// names that sanitize alike get `-2`, `-3`, ... before `.png`.
pub fn write_all(heatmaps: &[Heatmap], dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    let mut used = std::collections::HashSet::new();
    let mut written = Vec::with_capacity(heatmaps.len());
    for heatmap in heatmaps {
        let base = file_name(&heatmap.name);
        let mut name = base.clone();
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("{}-{n}.png", base.trim_end_matches(".png"));
            n += 1;
        }
        let path = dir.join(&name);
        heatmap.write_png(&path)?;
        written.push(path);
    }
    Ok(written)
}
