//! An image file → the ViT's patch tensor, as the official `image_processor.load_image` makes it
//! (MODEL.md §10.2, preprocessing): RGB conversion, grid plan, Pillow's `ImageOps.pad` (or, when
//! `max_wh_ratio` applies, a plain resize), normalisation to bf16, patches in row-major grid
//! order, each flattened as (channel, dy, dx).

use std::path::Path;

use half::bf16;

use super::decode::{decode_rgb, MAX_IMAGE_FILE_BYTES, MAX_IMAGE_PIXELS};
use super::grid::{plan_image_grid, GridPlan};
use super::resample::{resize_bicubic, RgbImage};
use crate::config::VisionConfig;
use crate::Result;

/// The pad colour of `ImageOps.pad` in the official pipeline.
pub const PAD_GREY: [u8; 3] = [127, 127, 127];

/// One image, ready for the ViT.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePatches {
    /// Size of the decoded image, before any resize.
    pub source_width: usize,
    pub source_height: usize,
    pub plan: GridPlan,
    pub patch_size: usize,
    /// `[n_vit_h · n_vit_w, 3, patch, patch]`, row-major.
    pub patches: Vec<bf16>,
}

impl ImagePatches {
    /// The ViT patch grid (rows, columns).
    pub fn vit_grid(&self) -> (usize, usize) {
        self.plan.vit_grid(self.patch_size)
    }

    /// Values per patch: 3 · patch² (588 for DS41).
    pub fn patch_len(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }
}

/// Read, decode and preprocess an image file (PNG; see `decode`).
pub fn load_image(path: &Path, cfg: &VisionConfig) -> Result<ImagePatches> {
    let bytes = crate::io::read_file(path, MAX_IMAGE_FILE_BYTES, "image file")?;
    preprocess_bytes(&bytes, path, cfg)
}

/// Preprocess an image file's bytes; `file` names it in errors.
pub fn preprocess_bytes(bytes: &[u8], file: &Path, cfg: &VisionConfig) -> Result<ImagePatches> {
    let image = decode_rgb(bytes, file, MAX_IMAGE_PIXELS)?;
    preprocess_rgb(&image, cfg)
}

/// Preprocess a decoded RGB image.
pub fn preprocess_rgb(image: &RgbImage, cfg: &VisionConfig) -> Result<ImagePatches> {
    let plan = plan_image_grid(image.width, image.height, cfg)?;
    let drawn = draw(image, &plan, cfg);
    Ok(ImagePatches {
        source_width: image.width,
        source_height: image.height,
        plan,
        patch_size: cfg.patch_size,
        patches: patchify(&drawn, cfg.patch_size),
    })
}

/// The image at the planned pixel size: stretched when `max_wh_ratio` says so, else fitted
/// inside and centred on grey (`ImageOps.pad`).
pub fn draw(image: &RgbImage, plan: &GridPlan, cfg: &VisionConfig) -> RgbImage {
    let (w, h) = (plan.best_width, plan.best_height);
    let stretch = cfg
        .max_wh_ratio
        .is_some_and(|ratio| image.width as f64 >= ratio * image.height as f64);
    if stretch {
        return resize(image, w, h);
    }
    pad(image, w, h)
}

/// `Image.resize` with BICUBIC: a copy when the size does not change.
fn resize(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    if (image.width, image.height) == (width, height) {
        return image.clone();
    }
    resize_bicubic(image, width, height)
}

/// Python's `round` on a float: half to even.
fn round_py(v: f64) -> usize {
    v.round_ties_even() as usize
}

/// `ImageOps.pad(image, (width, height), color=(127, 127, 127))` with BICUBIC and centring
/// (0.5, 0.5). `ImageOps.contain` keeps the aspect ratio by recomputing one side as
/// `round(h / w · width)` (or `round(w / h · height)`), Python rounding, half to even; the
/// offset of the fitted image is `round((target − fitted) · 0.5)`, half to even as well.
pub fn pad(image: &RgbImage, width: usize, height: usize) -> RgbImage {
    let (iw, ih) = (image.width as f64, image.height as f64);
    let (mut fit_w, mut fit_h) = (width, height);
    let im_ratio = iw / ih;
    let dest_ratio = width as f64 / height as f64;
    if im_ratio != dest_ratio {
        if im_ratio > dest_ratio {
            fit_h = round_py(ih / iw * width as f64);
        } else {
            fit_w = round_py(iw / ih * height as f64);
        }
    }
    if (fit_w, fit_h) == (width, height) {
        return resize(image, width, height);
    }
    let mut out = RgbImage::filled(width, height, PAD_GREY);
    // `contain` returns an empty image when a side rounds to 0: all grey.
    if fit_w == 0 || fit_h == 0 {
        return out;
    }
    let fitted = resize(image, fit_w, fit_h);
    if fit_w != width {
        out.paste(&fitted, round_py((width - fit_w) as f64 * 0.5), 0);
    } else {
        out.paste(&fitted, 0, round_py((height - fit_h) as f64 * 0.5));
    }
    out
}

/// The bf16 value of each 8-bit level: `((v / 255) − 0.5) / 0.5` in f32, then round to
/// nearest even, as the official code computes it with torch.
fn normalised_levels() -> [bf16; 256] {
    std::array::from_fn(|v| {
        let x = v as f32 / 255.0;
        bf16::from_f32((x - 0.5) / 0.5)
    })
}

/// Cut `[3, H, W]` into `[n_h · n_w, 3, p, p]` patches, row-major over the grid.
fn patchify(image: &RgbImage, p: usize) -> Vec<bf16> {
    let levels = normalised_levels();
    let (n_h, n_w) = (image.height / p, image.width / p);
    let mut out = Vec::with_capacity(n_h * n_w * 3 * p * p);
    for gy in 0..n_h {
        for gx in 0..n_w {
            for c in 0..3 {
                for dy in 0..p {
                    let row = (gy * p + dy) * image.width;
                    for dx in 0..p {
                        out.push(levels[image.pixels[(row + gx * p + dx) * 3 + c] as usize]);
                    }
                }
            }
        }
    }
    out
}
