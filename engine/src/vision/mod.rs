//! Vision input (MODEL.md §10.2): image bytes → the ViT's patch tensor, exactly as the
//! official `inference/image_processor.py` makes it with Pillow.
//!
//! * [`decode`] — PNG bytes → RGB, as Pillow's `open` + `convert("RGB")`;
//! * [`grid`] — the pixel size and token grid of an image (upscale, multiples of 14, shrink);
//! * [`resample`] — Pillow's fixed-point BICUBIC resize;
//! * [`preprocess`] — `ImageOps.pad` on grey, bf16 normalisation, patches;
//! * [`tower`] — the ViT and the aligner (upstream numerics, to rounding);
//! * [`span`] — an image's token span in the language model, and prompts with image markers.

pub mod decode;
pub mod grid;
pub mod preprocess;
pub mod resample;
pub mod span;
pub mod tower;

pub use grid::{plan_image_grid, GridPlan};
pub use preprocess::{load_image, preprocess_bytes, preprocess_rgb, ImagePatches};
pub use resample::RgbImage;
pub use span::{expand_markers, span_types, ImageInput, TokenType};

use std::path::Path;

use crate::config::{Config, VisionConfig};
use crate::{Error, Result};

/// The release's vision config (MODEL.md §2.1: `vision_config` of `config.json`, the `vision_*`
/// keys of `inference/config.json`).
pub fn release_vision_config() -> VisionConfig {
    VisionConfig {
        n_layers: 32,
        dim: 1024,
        n_heads: 16,
        inter_dim: 2816,
        patch_size: 14,
        downsample_ratio: 3,
        max_n_token: 1024,
        min_pixels: 544 * 544,
        max_wh_ratio: None,
        rope_theta: 10000.0,
    }
}

/// The vision config of a checkpoint directory (its `config.json`) or of a config file: the
/// release `config.json` (HF names, `vision_config`) or `inference/config.json` (`vision_*`).
pub fn vision_config_from(path: &Path) -> Result<VisionConfig> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let value = crate::config::read_json(&file)?;
    let hf = value.get("vision_config").is_some() || value.get("text_config").is_some();
    let config = if hf {
        Config::from_release_value(&value)
    } else {
        Config::from_inference_value(&value)
    }
    .map_err(|e| crate::config::in_file_err(&file, e))?;
    config.vision.ok_or_else(|| Error::Config {
        field: "vision_config".into(),
        rule: format!(
            "the config has no vision tower, so no image preprocessing (in {})",
            file.display()
        ),
    })
}
