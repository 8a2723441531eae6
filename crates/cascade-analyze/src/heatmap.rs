//! Change heatmaps (paper 003, Figure 3): one PNG per file of a series. The file is divided
//! into regions (4 KiB blocks, or 4 KiB times a power of two so that there are at most
//! 1024 x 1024), each region is counted once for every snapshot transition in which any of
//! its blocks changed, and the regions are laid out along a Hilbert curve, so that regions
//! near each other in the file stay near each other in the picture.
//!
//! Layout of the image: a square of `side` x `side` cells, `side` = 2^order the smallest
//! power of two with side^2 >= regions; each cell is `scale` x `scale` pixels, with scale =
//! max(1, 512 / side), so the map is at least 512 pixels tall. Region i is the cell at the
//! i-th point of the curve, which starts at the top-left corner and ends at the top-right
//! one. The first half of the curve fills the left half of the square, so when the regions
//! fit in half the cells only the left half is drawn (an image twice as tall as wide).
//! Colours are viridis from
//! dark purple (never changed) to yellow (changed in every transition); cells past the end
//! of the file are grey. Below the map, a legend strip: the colour of each change count from
//! 0 (left) to the number of transitions (right), with those two numbers under it.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::analyze::Error;

/// Most cells a heatmap has (1024 x 1024).
pub const MAX_CELLS: u64 = 1 << 20;
/// Smallest width of the map in pixels (small maps get bigger cells).
pub const MIN_SIDE_PX: u32 = 512;
/// Height of the legend strip below the map.
pub const LEGEND_HEIGHT: u32 = 36;
/// Colour of cells past the end of the file.
pub const ABSENT: [u8; 3] = [0xc8, 0xc8, 0xc8];
/// Colour of the legend strip's background.
pub const BACKGROUND: [u8; 3] = [0xff, 0xff, 0xff];
/// Colour of the legend's digits.
pub const INK: [u8; 3] = [0x20, 0x20, 0x20];

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

    /// (width, height) of the image: the map plus the legend strip.
    pub fn image_size(&self) -> (u32, u32) {
        let (columns, rows) = self.cells();
        let scale = self.scale();
        (columns * scale, rows * scale + LEGEND_HEIGHT)
    }

    /// Colour of a region that changed in `changes` transitions.
    pub fn colour(&self, changes: u32) -> [u8; 3] {
        if self.transitions == 0 {
            UNCHANGED
        } else {
            viridis(f64::from(changes) / f64::from(self.transitions))
        }
    }

    /// The image as RGB rows, top to bottom: (width, height, pixels).
    pub fn render(&self) -> (u32, u32, Vec<u8>) {
        let (width, height) = self.image_size();
        let (w, h) = (width as usize, height as usize);
        let mut pixels = vec![0u8; w * h * 3];
        let side = self.side();
        let scale = self.scale() as usize;
        let mut fill = |x0: usize, y0: usize, cw: usize, ch: usize, rgb: [u8; 3]| {
            for y in y0..(y0 + ch).min(h) {
                for x in x0..(x0 + cw).min(w) {
                    let at = (y * w + x) * 3;
                    pixels[at..at + 3].copy_from_slice(&rgb);
                }
            }
        };
        let (columns, rows) = self.cells();
        let cells = u64::from(columns) * u64::from(rows);
        for d in 0..cells {
            let rgb = match self.changes.get(d as usize) {
                Some(&c) if d < self.regions => self.colour(c),
                _ => ABSENT,
            };
            let (x, y) = hilbert_d2xy(side, d);
            fill(x as usize * scale, y as usize * scale, scale, scale, rgb);
        }
        // The legend strip.
        let top = rows as usize * scale;
        fill(0, top, w, LEGEND_HEIGHT as usize, BACKGROUND);
        let margin = 8;
        let bar = w.saturating_sub(2 * margin).max(1);
        let steps = self.transitions as usize + 1;
        for x in 0..bar {
            let count = (x * steps / bar).min(steps - 1) as u32;
            fill(margin + x, top + 4, 1, 16, self.colour(count));
        }
        let digits_y = top + 23;
        draw_number(&mut fill, 0, margin, digits_y, false);
        draw_number(&mut fill, self.transitions, w - margin, digits_y, true);
        (width, height, pixels)
    }

    /// Writes the image as an 8-bit RGB PNG.
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
        let mut writer = encoder.write_header().map_err(png_error)?;
        writer.write_image_data(&pixels).map_err(png_error)?;
        writer.finish().map_err(png_error)
    }
}

/// 3 x 5 glyphs of the digits, one row of 3 bits per entry.
const DIGITS: [[u8; 5]; 10] = [
    [0b111, 0b101, 0b101, 0b101, 0b111],
    [0b010, 0b110, 0b010, 0b010, 0b111],
    [0b111, 0b001, 0b111, 0b100, 0b111],
    [0b111, 0b001, 0b111, 0b001, 0b111],
    [0b101, 0b101, 0b111, 0b001, 0b001],
    [0b111, 0b100, 0b111, 0b001, 0b111],
    [0b111, 0b100, 0b111, 0b101, 0b111],
    [0b111, 0b001, 0b001, 0b001, 0b001],
    [0b111, 0b101, 0b111, 0b101, 0b111],
    [0b111, 0b101, 0b111, 0b001, 0b111],
];

/// Draws `n` in 2x-scaled 3 x 5 digits starting at x (or ending at x when `right`).
fn draw_number(
    fill: &mut impl FnMut(usize, usize, usize, usize, [u8; 3]),
    n: u32,
    x: usize,
    y: usize,
    right: bool,
) {
    const PX: usize = 2;
    const ADVANCE: usize = 4 * PX;
    let text = n.to_string();
    let width = text.len() * ADVANCE - PX;
    let mut left = if right { x.saturating_sub(width) } else { x };
    for ch in text.bytes() {
        let glyph = DIGITS[usize::from(ch - b'0')];
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..3 {
                if bits & (0b100 >> col) != 0 {
                    fill(left + col * PX, y + row * PX, PX, PX, INK);
                }
            }
        }
        left += ADVANCE;
    }
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
