//! The vision preprocessing corpus check: every (image, config) case of an `expected.json`
//! (schema `ds41-vision-preprocess/1`, written by goldens/regen/vision_preprocess.py from the
//! official `image_processor.load_image`) against the engine's `vision::preprocess`, bit for
//! bit: the grid numbers, and the sha256 of the bf16 patch tensor, whole and per row of patches
//! (so a mismatch names the first patch row that differs).

use std::collections::BTreeMap;
use std::path::Path;

use ds41_engine::config::VisionConfig;
use ds41_engine::vision::{preprocess_bytes, ImagePatches};
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub const SCHEMA: &str = "ds41-vision-preprocess/1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    schema: String,
    pillow: String,
    configs: BTreeMap<String, CaseConfig>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseConfig {
    vision_patch_size: usize,
    vision_downsample_ratio: usize,
    vision_max_n_token: usize,
    vision_min_pixels: usize,
    vision_max_wh_ratio: Option<f64>,
}

impl CaseConfig {
    /// Only the preprocessing fields matter; the tower's are left at zero.
    fn vision(&self) -> VisionConfig {
        VisionConfig {
            n_layers: 0,
            dim: 0,
            n_heads: 0,
            inter_dim: 0,
            patch_size: self.vision_patch_size,
            downsample_ratio: self.vision_downsample_ratio,
            max_n_token: self.vision_max_n_token,
            min_pixels: self.vision_min_pixels,
            max_wh_ratio: self.vision_max_wh_ratio,
            rope_theta: 0.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    image: String,
    config: String,
    png_sha256: String,
    #[allow(dead_code)] // documentation: Pillow's mode of the opened file
    pillow_mode: String,
    source_size: [usize; 2],
    n_vit: [usize; 2],
    n_llm: [usize; 2],
    pixel_size: [usize; 2],
    patches_shape: [usize; 4],
    patches_sha256: String,
    row_sha256_16: Vec<String>,
}

/// What a corpus check found.
#[derive(Debug, Default)]
pub struct CorpusReport {
    pub pillow: String,
    pub images: usize,
    pub cases: usize,
    pub exact: usize,
    /// One line per case that differs, naming the image, the config and what differs first.
    pub failures: Vec<String>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The patch tensor's bytes as torch stores a bf16 tensor on a little-endian machine.
fn patch_bytes(patches: &ImagePatches, range: std::ops::Range<usize>) -> Vec<u8> {
    patches.patches[range]
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .collect()
}

fn check_case(dir: &Path, case: &Case, cfg: &VisionConfig) -> Result<(), String> {
    let path = dir.join(&case.image);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if sha256_hex(&bytes) != case.png_sha256 {
        return Err("the PNG's sha256 is not the one recorded (corpus changed)".into());
    }
    let got = preprocess_bytes(&bytes, &path, cfg).map_err(|e| e.to_string())?;
    let (n_vit_h, n_vit_w) = got.vit_grid();
    let found = (
        [got.source_width, got.source_height],
        [n_vit_h, n_vit_w],
        [got.plan.n_llm_h, got.plan.n_llm_w],
        [got.plan.best_height, got.plan.best_width],
    );
    let want = (case.source_size, case.n_vit, case.n_llm, case.pixel_size);
    if found != want {
        return Err(format!(
            "grid: (source [w,h], n_vit, n_llm, pixels [h,w]) = {found:?}, official {want:?}"
        ));
    }
    let per_patch = got.patch_len();
    if case.patches_shape != [n_vit_h * n_vit_w, 3, cfg.patch_size, cfg.patch_size] {
        return Err(format!("official patch shape {:?}", case.patches_shape));
    }
    let row_len = n_vit_w * per_patch;
    for (row, want) in case.row_sha256_16.iter().enumerate() {
        let digest = sha256_hex(&patch_bytes(&got, row * row_len..(row + 1) * row_len));
        if &digest[..16] != want {
            return Err(format!(
                "patch row {row} (of {n_vit_h}) is the first that differs (patches {}..{})",
                row * n_vit_w,
                (row + 1) * n_vit_w
            ));
        }
    }
    if sha256_hex(&patch_bytes(&got, 0..got.patches.len())) != case.patches_sha256 {
        return Err("patch tensor sha256 differs (every row digest matched)".into());
    }
    Ok(())
}

/// Check every case of `dir/expected.json`.
pub fn check_corpus(dir: &Path) -> Result<CorpusReport, String> {
    let path = dir.join("expected.json");
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let expected: Expected =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if expected.schema != SCHEMA {
        return Err(format!(
            "{}: schema {:?}, expected {SCHEMA:?}",
            path.display(),
            expected.schema
        ));
    }
    let mut report = CorpusReport {
        pillow: expected.pillow.clone(),
        ..CorpusReport::default()
    };
    let mut images = std::collections::BTreeSet::new();
    for case in &expected.cases {
        images.insert(case.image.as_str());
        report.cases += 1;
        let Some(cfg) = expected.configs.get(&case.config) else {
            report.failures.push(format!(
                "{} [{}]: no such config in expected.json",
                case.image, case.config
            ));
            continue;
        };
        match check_case(dir, case, &cfg.vision()) {
            Ok(()) => report.exact += 1,
            Err(why) => report
                .failures
                .push(format!("{} [{}]: {why}", case.image, case.config)),
        }
    }
    report.images = images.len();
    Ok(report)
}
