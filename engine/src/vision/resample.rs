//! Pillow's convolution resize (`Image.resize` with BICUBIC on an 8-bit RGB image), replicated
//! to the bit. The facts, from Pillow's `src/libImaging/Resample.c` and its documentation:
//!
//! * Separable: two passes, the first one's result rounded and clipped to 8 bits. Usually the
//!   horizontal pass (only over the source rows the vertical pass will read) comes first; Pillow
//!   13 runs the vertical one first when the height shrinks much more than the width
//!   ([`vertical_first`]). A pass whose size does not change is skipped.
//! * Per output index `i`: `scale = in/out`, `filterscale = max(scale, 1)`, `support = 2 ·
//!   filterscale` (bicubic's support is 2), `center = (i + 0.5) · scale`; the taps run from
//!   `trunc(center − support + 0.5)` (at least 0) to `trunc(center + support + 0.5)` (at most
//!   `in`); tap `j` weighs `bicubic((j − center + 0.5) · (1 / filterscale))` (Keys' cubic with a =
//!   −0.5, evaluated in f64 in Pillow's operation order), and the weights are divided by their
//!   sum when it is non-zero.
//! * The weights become 22-bit fixed point (`PRECISION_BITS = 32 − 8 − 2`), rounding half away
//!   from zero; a pixel is `clip8((1 << 21) + Σ sample · weight)`, where `clip8` takes the sum
//!   `>> 22` (arithmetic shift) and clamps it to 0..=255.
//!
//! Only what DS41's preprocessing reaches is here: BICUBIC, the whole source as the box, three
//! 8-bit channels.

/// An 8-bit RGB image, rows top to bottom, pixels interleaved `r, g, b`.
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

impl std::fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RgbImage({}x{})", self.width, self.height)
    }
}

impl RgbImage {
    /// An image of one colour.
    pub fn filled(width: usize, height: usize, rgb: [u8; 3]) -> RgbImage {
        let mut pixels = Vec::with_capacity(width * height * 3);
        for _ in 0..width * height {
            pixels.extend_from_slice(&rgb);
        }
        RgbImage {
            width,
            height,
            pixels,
        }
    }

    /// Copy `other` into this image with its top-left corner at (`x`, `y`) (Pillow's `paste`
    /// of an image that fits).
    pub fn paste(&mut self, other: &RgbImage, x: usize, y: usize) {
        assert!(x + other.width <= self.width && y + other.height <= self.height);
        for row in 0..other.height {
            let dst = ((y + row) * self.width + x) * 3;
            let src = row * other.width * 3;
            self.pixels[dst..dst + other.width * 3]
                .copy_from_slice(&other.pixels[src..src + other.width * 3]);
        }
    }
}

/// Fixed-point fraction bits of the 8-bit resampler's weights.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Keys' cubic convolution kernel with a = −0.5, Pillow's `bicubic_filter` (support 2). The
/// operation order is Pillow's: the f64 results must match to the last bit, because a weight
/// that lands on a rounding boundary of the fixed-point conversion changes a pixel.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

const BICUBIC_SUPPORT: f64 = 2.0;

/// The taps of one resampling pass: for output index `i`, source indices
/// `first[i] .. first[i] + weights[i].len()` with their fixed-point weights.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for a box covering the whole source
/// (`in0 = 0`, `in1 = in_size`, both f32 in Pillow, exact here).
fn taps(in_size: usize, out_size: usize) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = BICUBIC_SUPPORT * filterscale;
    let inv_filterscale = 1.0 / filterscale;
    let mut first = Vec::with_capacity(out_size);
    let mut weights = Vec::with_capacity(out_size);
    for i in 0..out_size {
        let center = (i as f64 + 0.5) * scale;
        // C's (int) conversion truncates toward zero, as `as i64` does.
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let mut w: Vec<f64> = (lo..hi)
            .map(|j| bicubic((j as f64 - center + 0.5) * inv_filterscale))
            .collect();
        let sum: f64 = w.iter().sum();
        if sum != 0.0 {
            for v in &mut w {
                *v /= sum;
            }
        }
        let one = (1u32 << PRECISION_BITS) as f64;
        let fixed = w
            .iter()
            .map(|&v| {
                if v < 0.0 {
                    (-0.5 + v * one) as i32
                } else {
                    (0.5 + v * one) as i32
                }
            })
            .collect();
        first.push(lo);
        weights.push(fixed);
    }
    Taps { first, weights }
}

fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Pillow 13 runs the vertical pass first when the height shrinks by more than twice what the
/// width shrinks by (in pixels; a growing width counts negative):
/// `in_h > out_h && in_h − out_h > 2 · (in_w − out_w)`. Which pass comes first matters: the
/// first pass's output is rounded to 8 bits. (Pillow ≤ 12 always ran the horizontal pass
/// first. Found by probing Pillow 13.0.0 on 2,040 size pairs, boundaries included, and
/// consistent with its change log: "if height is scaled down significantly more than width,
/// resize vertically first"; goldens/ERRATA.md, `vision_resampling`.)
fn vertical_first(src: &RgbImage, width: usize, height: usize) -> bool {
    let shrink_h = src.height as i64 - height as i64;
    let shrink_w = src.width as i64 - width as i64;
    shrink_h > 0 && shrink_h > 2 * shrink_w
}

/// The horizontal pass over source rows `rows` (all of them, or only those the vertical pass
/// will read when it comes second).
fn horizontal_pass(src: &RgbImage, taps: &Taps, rows: std::ops::Range<usize>) -> RgbImage {
    let width = taps.first.len();
    let mut out = Vec::with_capacity(width * rows.len() * 3);
    for y in rows.clone() {
        let line = &src.pixels[y * src.width * 3..][..src.width * 3];
        for x in 0..width {
            let mut sum = [HALF; 3];
            for (t, &k) in taps.weights[x].iter().enumerate() {
                let p = &line[(taps.first[x] + t) * 3..][..3];
                for c in 0..3 {
                    sum[c] += p[c] as i32 * k;
                }
            }
            out.extend(sum.map(clip8));
        }
    }
    RgbImage {
        width,
        height: rows.len(),
        pixels: out,
    }
}

/// The vertical pass; `row_offset` is the first source row `src` holds.
fn vertical_pass(src: &RgbImage, taps: &Taps, row_offset: usize) -> RgbImage {
    let height = taps.first.len();
    let mut out = Vec::with_capacity(src.width * height * 3);
    for y in 0..height {
        let first = taps.first[y] - row_offset;
        for x in 0..src.width {
            let mut sum = [HALF; 3];
            for (t, &k) in taps.weights[y].iter().enumerate() {
                let p = &src.pixels[((first + t) * src.width + x) * 3..][..3];
                for c in 0..3 {
                    sum[c] += p[c] as i32 * k;
                }
            }
            out.extend(sum.map(clip8));
        }
    }
    RgbImage {
        width: src.width,
        height,
        pixels: out,
    }
}

/// `Image.resize((width, height), BICUBIC)` of an RGB image (Pillow 13's `ImagingResampleInner`).
pub fn resize_bicubic(src: &RgbImage, width: usize, height: usize) -> RgbImage {
    assert!(width > 0 && height > 0 && src.width > 0 && src.height > 0);
    let need_horizontal = width != src.width;
    let need_vertical = height != src.height;
    let horizontal = taps(src.width, width);
    let vertical = taps(src.height, height);
    if vertical_first(src, width, height) {
        // need_vertical holds here: the height shrinks.
        let tall = vertical_pass(src, &vertical, 0);
        return if need_horizontal {
            horizontal_pass(&tall, &horizontal, 0..tall.height)
        } else {
            tall
        };
    }
    if !need_horizontal {
        return if need_vertical {
            vertical_pass(src, &vertical, 0)
        } else {
            src.clone()
        };
    }
    // Only the source rows the vertical pass reads go through the horizontal pass.
    let row_first = vertical.first[0];
    let row_end = vertical.first[height - 1] + vertical.weights[height - 1].len();
    let wide = horizontal_pass(src, &horizontal, row_first..row_end);
    if need_vertical {
        vertical_pass(&wide, &vertical, row_first)
    } else {
        wide
    }
}
