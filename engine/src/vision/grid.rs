//! How large an image is drawn and how many tokens it costs: the official
//! `image_processor.py`'s `plan_image_grid`, `safe_resize` and `solve_resize_ratio`
//! (MODEL.md §10.2, steps 1–2). Python's float arithmetic is f64 here, operation for operation,
//! so the plan is the same for every size; `powf(0.5)` is the C `pow` Python's `**` calls.

use crate::config::VisionConfig;
use crate::{Error, Result};

/// The pixel size an image is drawn at and the token grid the aligner makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridPlan {
    /// Rows and columns of the LLM token grid (after the 3×3 merge).
    pub n_llm_h: usize,
    pub n_llm_w: usize,
    /// Pixel height and width, multiples of the patch size.
    pub best_height: usize,
    pub best_width: usize,
}

impl GridPlan {
    /// The ViT patch grid (rows, columns).
    pub fn vit_grid(&self, patch_size: usize) -> (usize, usize) {
        (self.best_height / patch_size, self.best_width / patch_size)
    }

    /// Positions of the image's span in the LLM: `[START] ([IMAGE]×n_w [NEWLINE])×n_h [END]`.
    pub fn num_image_tokens(&self) -> usize {
        num_image_tokens(self.n_llm_h, self.n_llm_w)
    }
}

pub fn num_image_tokens(n_llm_h: usize, n_llm_w: usize) -> usize {
    n_llm_h * (n_llm_w + 1) + 2
}

/// The token grid the aligner produces from a patch grid of this pixel size.
pub fn llm_grid(best_height: usize, best_width: usize, cfg: &VisionConfig) -> (usize, usize) {
    let d = cfg.downsample_ratio;
    (
        (best_height / cfg.patch_size).div_ceil(d),
        (best_width / cfg.patch_size).div_ceil(d),
    )
}

/// The largest aspect-preserving pixel size whose token grid fits `max_n_token`
/// (`solve_resize_ratio`; `height` and `width` may be fractional when `max_wh_ratio` clamped them).
fn solve_resize_ratio(height: f64, width: f64, cfg: &VisionConfig) -> (usize, usize) {
    let (p, max_n) = (cfg.patch_size, cfg.max_n_token);
    let r = height / width;
    let max_w = ((max_n - 2) as f64 / r + 0.25).sqrt() - 0.5;
    let max_h = max_w * r;
    let cell = p * cfg.downsample_ratio;
    if max_w < 1.0 {
        // very tall: one column
        return ((max_n - 2) / 2 * cell, cell);
    }
    if max_h < 1.0 {
        // very wide: one row
        return (cell, (max_n - 3) * cell);
    }
    let beta = f64::min(
        max_w.floor() * cell as f64 / width,
        max_h.floor() * cell as f64 / height,
    );
    let snap = |side: f64| (side * beta / p as f64).floor() as usize * p;
    (snap(height), snap(width))
}

/// Refuse preprocessing fields the planning arithmetic cannot use (the official code would
/// divide by zero or plan an empty image).
pub fn check_preprocessing_config(cfg: &VisionConfig) -> Result<()> {
    let bad = |field: &str, rule: String| {
        Err(Error::Config {
            field: format!("vision_config.{field}"),
            rule,
        })
    };
    if cfg.patch_size == 0 {
        return bad("patch_size", "must be at least 1".into());
    }
    if cfg.downsample_ratio == 0 {
        return bad("downsample_ratio", "must be at least 1".into());
    }
    if cfg.max_n_token < 4 {
        // The smallest span, one image token: [START] [IMAGE] [NEWLINE] [END].
        return bad(
            "max_image_tokens",
            format!("{} leaves no room for an image", cfg.max_n_token),
        );
    }
    if let Some(r) = cfg.max_wh_ratio {
        if !(r.is_finite() && r > 0.0) {
            return bad(
                "max_wh_ratio",
                format!("must be a positive number, got {r}"),
            );
        }
    }
    Ok(())
}

/// Plan the resize of an image of `width` × `height` pixels (`plan_image_grid` + `safe_resize`).
pub fn plan_image_grid(width: usize, height: usize, cfg: &VisionConfig) -> Result<GridPlan> {
    check_preprocessing_config(cfg)?;
    if width == 0 || height == 0 {
        return Err(Error::Model(format!(
            "an image of {width}x{height} pixels has no pixels to plan a grid for"
        )));
    }
    let p = cfg.patch_size as f64;
    let (mut width, mut height) = (width as f64, height as f64);
    if let Some(ratio) = cfg.max_wh_ratio {
        if width > height * ratio {
            width = height * ratio;
        }
    }
    let pixels = width * height;
    if pixels < cfg.min_pixels as f64 {
        let ratio = (cfg.min_pixels as f64 / pixels).powf(0.5);
        // Python's int() truncates toward zero.
        width = (width * ratio).trunc();
        height = (height * ratio).trunc();
    }
    let mut best_width = ((width / p).ceil() * p) as usize;
    let mut best_height = ((height / p).ceil() * p) as usize;
    let (mut n_llm_h, mut n_llm_w) = llm_grid(best_height, best_width, cfg);
    if num_image_tokens(n_llm_h, n_llm_w) > cfg.max_n_token {
        (best_height, best_width) = solve_resize_ratio(height, width, cfg);
        (n_llm_h, n_llm_w) = llm_grid(best_height, best_width, cfg);
        if num_image_tokens(n_llm_h, n_llm_w) > cfg.max_n_token
            || best_height == 0
            || best_width == 0
        {
            // The official code asserts here; it cannot happen for the release config.
            return Err(Error::Model(format!(
                "no grid of at most {} tokens found for a {width}x{height} image \
                 (shrunk to {best_width}x{best_height})",
                cfg.max_n_token
            )));
        }
    }
    Ok(GridPlan {
        n_llm_h,
        n_llm_w,
        best_height,
        best_width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::release_vision_config;

    #[test]
    fn small_images_are_upscaled_to_the_minimum_pixel_count() {
        // 1x1: ratio 544, 544x544 -> multiples of 14: 546x546, 39x39 patches, 13x13 tokens.
        let plan = plan_image_grid(1, 1, &release_vision_config()).unwrap();
        assert_eq!(
            (
                plan.best_width,
                plan.best_height,
                plan.n_llm_w,
                plan.n_llm_h
            ),
            (546, 546, 13, 13)
        );
        assert_eq!(plan.num_image_tokens(), 13 * 14 + 2);
    }

    #[test]
    fn every_plan_fits_the_token_budget() {
        let cfg = release_vision_config();
        for (w, h) in [
            (1, 100_000),
            (100_000, 1),
            (4000, 3000),
            (3000, 4000),
            (9999, 7),
            (545, 546),
        ] {
            let plan = plan_image_grid(w, h, &cfg).unwrap();
            assert!(
                plan.num_image_tokens() <= cfg.max_n_token,
                "{w}x{h}: {plan:?}"
            );
            assert!(plan.best_width.is_multiple_of(14) && plan.best_height.is_multiple_of(14));
        }
    }

    #[test]
    fn unusable_configs_are_refused_by_field() {
        let mut cfg = release_vision_config();
        cfg.patch_size = 0;
        let err = plan_image_grid(10, 10, &cfg).unwrap_err().to_string();
        assert!(err.contains("vision_config.patch_size"), "{err}");
        let mut cfg = release_vision_config();
        cfg.max_wh_ratio = Some(f64::NAN);
        assert!(plan_image_grid(10, 10, &cfg).is_err());
        let mut cfg = release_vision_config();
        cfg.max_n_token = 2;
        assert!(plan_image_grid(10, 10, &cfg).is_err());
    }
}
