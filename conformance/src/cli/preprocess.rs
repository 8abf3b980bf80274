//! `ds41 preprocess`: an image file → the ViT's patch tensor, exactly as the official
//! `image_processor.load_image` makes it (MODEL.md §10.2), written as a patch file
//! (`ds41_engine::vision::patch_file`: `patches`, `grid`, `token_types`, the format an engine
//! answers the protocol's `vision_preprocess` in) whose metadata (`format` =
//! `ds41-vision-patches/1`) adds the grid numbers, the source size, the image's sha256 and the
//! vision config used.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use ds41_engine::config::VisionConfig;
use ds41_engine::vision::{self, ImagePatches};
use sha2::{Digest, Sha256};

pub const FORMAT: &str = "ds41-vision-patches/1";

#[derive(clap::Args)]
pub struct Args {
    /// Image file (PNG: every colour type and bit depth; other formats are refused).
    #[arg(long)]
    pub image: PathBuf,
    /// Output file (safetensors; written atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Vision config: a checkpoint directory, its `config.json` (HF names) or an
    /// `inference/config.json` (`vision_*` names). Default: the release's values (patch 14,
    /// 3×3 merge, at most 1024 tokens, at least 544² pixels, no aspect clamp).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

fn metadata(
    args: &Args,
    image_sha256: &str,
    cfg: &VisionConfig,
    p: &ImagePatches,
) -> BTreeMap<String, String> {
    let (n_vit_h, n_vit_w) = p.vit_grid();
    let config_source = match &args.config {
        Some(path) => path.display().to_string(),
        None => "release defaults".into(),
    };
    [
        ("format", FORMAT.to_string()),
        (
            "engine",
            format!(
                "{} {}",
                ds41_engine::ENGINE_NAME,
                ds41_engine::ENGINE_VERSION
            ),
        ),
        ("image", args.image.display().to_string()),
        ("image_sha256", image_sha256.to_string()),
        ("source_width", p.source_width.to_string()),
        ("source_height", p.source_height.to_string()),
        ("pixel_width", p.plan.best_width.to_string()),
        ("pixel_height", p.plan.best_height.to_string()),
        ("n_vit_h", n_vit_h.to_string()),
        ("n_vit_w", n_vit_w.to_string()),
        ("n_llm_h", p.plan.n_llm_h.to_string()),
        ("n_llm_w", p.plan.n_llm_w.to_string()),
        ("num_image_tokens", p.plan.num_image_tokens().to_string()),
        ("config", config_source),
        ("vision_patch_size", cfg.patch_size.to_string()),
        ("vision_downsample_ratio", cfg.downsample_ratio.to_string()),
        ("vision_max_n_token", cfg.max_n_token.to_string()),
        ("vision_min_pixels", cfg.min_pixels.to_string()),
        (
            "vision_max_wh_ratio",
            cfg.max_wh_ratio.map_or("null".into(), |r| r.to_string()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    // The output must never replace the input.
    if let (Ok(a), Ok(b)) = (args.image.canonicalize(), args.out.canonicalize()) {
        if a == b {
            bail!(
                "--out {} is the input image; refusing to overwrite it",
                args.out.display()
            );
        }
    }
    let cfg = match &args.config {
        Some(path) => vision::vision_config_from(path)?,
        None => vision::release_vision_config(),
    };
    let bytes = ds41_engine::io::read_file(
        &args.image,
        vision::decode::MAX_IMAGE_FILE_BYTES,
        "image file",
    )?;
    let patches = vision::preprocess_bytes(&bytes, &args.image, &cfg)?;
    let image_sha256 = hex::encode(Sha256::digest(&bytes));
    let (n_vit_h, n_vit_w) = patches.vit_grid();
    let out = vision::patch_file::patch_file_bytes(
        &patches,
        &metadata(&args, &image_sha256, &cfg, &patches),
    )?;
    ds41_engine::state::write_atomic(&args.out, &out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        // Every size width x height, as image sizes are written.
        "{}: {}x{} -> {}x{} pixels, {n_vit_w}x{n_vit_h} patches, {}x{} tokens ({} span positions) -> {}",
        args.image.display(),
        patches.source_width,
        patches.source_height,
        patches.plan.best_width,
        patches.plan.best_height,
        patches.plan.n_llm_w,
        patches.plan.n_llm_h,
        patches.plan.num_image_tokens(),
        args.out.display()
    );
    Ok(0)
}
