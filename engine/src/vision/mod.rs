//! Vision input (MODEL.md §10.2): image bytes → the ViT's patch tensor, exactly as the
//! official `inference/image_processor.py` makes it with Pillow.
//!
//! * [`decode`] — PNG bytes → RGB, as Pillow's `open` + `convert("RGB")`;
//! * [`grid`] — the pixel size and token grid of an image (upscale, multiples of 14, shrink);
//! * [`resample`] — Pillow's fixed-point BICUBIC resize;
//! * [`preprocess`] — `ImageOps.pad` on grey, bf16 normalisation, patches;
//! * [`patch_file`] — a preprocessed image as safetensors (patches, grid, span token types);
//! * [`tower`] — the ViT and the aligner (upstream numerics, to rounding);
//! * [`span`] — an image's token span in the language model, and prompts with image markers.

pub mod decode;
pub mod grid;
pub mod patch_file;
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

/// The config of a checkpoint directory (a release's `config.json`, a container's manifest and
/// `vision.json`) or of a config file: the release `config.json` (HF names, `vision_config`)
/// or `inference/config.json` (`vision_*`). The path returned names where a tower would be.
fn model_config_from(path: &Path) -> Result<(Config, std::path::PathBuf)> {
    if path.is_dir() && crate::io::present(&path.join("manifest.json")) {
        return Ok((
            crate::checkpoint::read_config(path)?,
            path.join("vision.json"),
        ));
    }
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
    Ok((config, file))
}

fn no_tower(file: &Path) -> Error {
    Error::Config {
        field: "vision_config".into(),
        rule: format!(
            "the config has no vision tower, so no image preprocessing (in {})",
            file.display()
        ),
    }
}

/// The vision config of a checkpoint directory or config file (see [`model_config_from`]).
pub fn vision_config_from(path: &Path) -> Result<VisionConfig> {
    let (config, file) = model_config_from(path)?;
    config.vision.ok_or_else(|| no_tower(&file))
}

/// What expanding a prompt's image markers needs from a model directory or config file: the
/// vision config and the marker token `image_token_id`.
pub fn image_inputs_config_from(path: &Path) -> Result<(VisionConfig, u32)> {
    let (config, file) = model_config_from(path)?;
    // The official code refuses images when `vision_n_layers` is 0.
    let vision = config
        .vision
        .filter(|v| v.n_layers > 0)
        .ok_or_else(|| no_tower(&file))?;
    let marker = config.image_token_id.ok_or_else(|| Error::Config {
        field: "image_token_id".into(),
        rule: format!(
            "required to place images in a prompt (in {})",
            file.display()
        ),
    })?;
    Ok((vision, marker))
}
