//! Checks against the vision goldens of the official code:
//!
//! * [`check_corpus`] — every (image, config) case of an `expected.json` (schema
//!   `ds41-vision-preprocess/1`, written by goldens/regen/vision_preprocess.py from the official
//!   `image_processor.load_image`) against the engine's `vision::preprocess`, bit for bit: the
//!   grid numbers, and the sha256 of the bf16 patch tensor, whole and per row of patches (so a
//!   mismatch names the first patch row that differs);
//! * [`check_tower`] — the official `vision.py` tower and aligner outputs (written by
//!   goldens/regen/vision_tower.py) against the engine's `vision::tower` in both profiles.

use std::collections::BTreeMap;
use std::path::Path;

use ds41_engine::config::VisionConfig;
use ds41_engine::model::Numerics;
use ds41_engine::vision::tower::VisionTower;
use ds41_engine::vision::{preprocess_bytes, ImagePatches};
use half::bf16;
use safetensors::{Dtype, SafeTensors};
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

/// The corpus images the tower goldens are made from (goldens/regen/vision_tower.py's
/// arguments): 3x8 and 8x3 patch grids, and 14x15 (the aligner pads the height).
pub const TOWER_IMAGES: [&str; 3] = [
    "rgb8_100x37_upscale",
    "rgb8_37x100_upscale",
    "rgb8_601x599_odd",
];

/// What a tower check found: per profile, the worst rel L2 end to end and teacher-forced.
#[derive(Debug, Default)]
pub struct TowerReport {
    /// `(profile, images, worst end to end, worst teacher-forced)`.
    pub profiles: Vec<(Numerics, usize, f64, f64)>,
    pub failures: Vec<String>,
}

impl TowerReport {
    pub fn summary(&self) -> String {
        self.profiles
            .iter()
            .map(|(n, images, e2e, forced)| {
                format!(
                    "vision tower ({n}) vs official on {images} images: worst rel L2 {e2e:.2e} \
                     end to end, {forced:.2e} teacher-forced"
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Rel L2 limits (end to end, one stage fed the official input). Upstream: bf16 keeps 8
/// significant bits (rel. step 2^-8 ≈ 3.9e-3), and torch's and our sums round differently
/// before each bf16 rounding. Exact: f32 rounding only.
fn tower_limits(numerics: Numerics) -> (f64, f64) {
    match numerics {
        Numerics::Upstream => (1e-2, 5e-3),
        Numerics::Exact => (5e-6, 5e-6),
    }
}

fn tensor_f32(st: &SafeTensors, name: &str) -> Result<Vec<f32>, String> {
    let t = st.tensor(name).map_err(|e| format!("`{name}`: {e}"))?;
    Ok(match t.dtype() {
        Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => t
            .data()
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        d => return Err(format!("`{name}`: dtype {d:?}, expected F32 or BF16")),
    })
}

fn rel_l2(ours: &[f32], theirs: &[f32]) -> f64 {
    let (mut d2, mut t2) = (0f64, 0f64);
    for (a, b) in ours.iter().zip(theirs) {
        let d = f64::from(*a) - f64::from(*b);
        d2 += d * d;
        t2 += f64::from(*b) * f64::from(*b);
    }
    if ours.len() != theirs.len() {
        return f64::INFINITY;
    }
    (d2 / t2).sqrt()
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The tower goldens in `dir` (weights.safetensors + IMAGE.DTYPE.safetensors, written by
/// goldens/regen/vision_tower.py) against the engine's tower in both profiles, each image
/// preprocessed by the engine from `images/IMAGE.png` (its patches must hash as the official
/// ones did): every stage end to end and teacher-forced (fed the official input of that stage).
pub fn check_tower(dir: &Path, images: &Path) -> Result<TowerReport, String> {
    let weights_path = dir.join("weights.safetensors");
    let bytes = read_file(&weights_path)?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| e.to_string())?;
    let config_text = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("config"))
        .ok_or("weights.safetensors: no `config` metadata")?;
    let small: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(config_text).map_err(|e| e.to_string())?;
    let get = |k: &str| {
        small
            .get(k)
            .and_then(|v| v.as_f64())
            .ok_or(format!("weights.safetensors config: no number `{k}`"))
    };
    let config = VisionConfig {
        n_layers: get("vision_n_layers")? as usize,
        dim: get("vision_dim")? as usize,
        n_heads: get("vision_n_heads")? as usize,
        inter_dim: get("vision_inter_dim")? as usize,
        patch_size: get("vision_patch_size")? as usize,
        downsample_ratio: get("vision_downsample_ratio")? as usize,
        max_n_token: get("vision_max_n_token")? as usize,
        min_pixels: get("vision_min_pixels")? as usize,
        max_wh_ratio: None,
        rope_theta: get("vision_rope_theta")?,
    };
    let weights = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let mut report = TowerReport::default();
    for (numerics, dtype) in [
        (Numerics::Upstream, "bfloat16"),
        (Numerics::Exact, "float32"),
    ] {
        let (max_e2e, max_forced) = tower_limits(numerics);
        let tower = VisionTower::load(&config, get("dim")? as usize, numerics, |name| {
            tensor_f32(&weights, name).map_err(ds41_engine::Error::Model)
        })
        .map_err(|e| e.to_string())?;
        let (mut worst_e2e, mut worst_forced, mut n_images) = (0f64, 0f64, 0);
        for name in TOWER_IMAGES {
            let golden_path = dir.join(format!("{name}.{dtype}.safetensors"));
            let golden_bytes = read_file(&golden_path)?;
            let (_, gmeta) =
                SafeTensors::read_metadata(&golden_bytes).map_err(|e| e.to_string())?;
            let want_patches = gmeta
                .metadata()
                .as_ref()
                .and_then(|m| m.get("patches_sha256").cloned())
                .unwrap_or_default();
            let golden = SafeTensors::deserialize(&golden_bytes).map_err(|e| e.to_string())?;
            let png = images.join(format!("{name}.png"));
            let patches =
                ds41_engine::vision::load_image(&png, &config).map_err(|e| e.to_string())?;
            let ours = patches.patches.len();
            if sha256_hex(&patch_bytes(&patches, 0..ours)) != want_patches {
                report
                    .failures
                    .push(format!("{name}: the patches differ from the official ones"));
                continue;
            }
            let (n_h, n_w) = patches.vit_grid();
            let got = tower.forward(&patches).map_err(|e| e.to_string())?;
            let input: Vec<f32> = patches.patches.iter().map(|v| v.to_f32()).collect();
            let want = |t: &str| tensor_f32(&golden, t);
            // (stage, end-to-end output, teacher-forced output)
            let mut stages = vec![(
                "embed".to_string(),
                tower.embed(&input),
                tower.embed(&input),
            )];
            for b in 0..config.n_layers {
                let input = if b == 0 {
                    "embed".into()
                } else {
                    format!("block.{}", b - 1)
                };
                let forced = tower.block(b, &want(&input)?, n_h, n_w);
                stages.push((format!("block.{b}"), got.blocks[b].clone(), forced));
            }
            let last = format!("block.{}", config.n_layers - 1);
            stages.push((
                "vit".into(),
                got.vit.clone(),
                tower.final_norm(&want(&last)?),
            ));
            stages.push((
                "aligner".into(),
                got.aligner.clone(),
                tower.align(&want("vit")?, n_h, n_w),
            ));
            for (stage, e2e, forced) in stages {
                let theirs = want(&stage)?;
                let (r_e2e, r_forced) = (rel_l2(&e2e, &theirs), rel_l2(&forced, &theirs));
                if r_forced >= max_forced {
                    report.failures.push(format!(
                        "{numerics} {name}: teacher-forced `{stage}` is off: rel L2 {r_forced:.3e} (limit {max_forced:.0e})"
                    ));
                } else if r_e2e >= max_e2e {
                    report.failures.push(format!(
                        "{numerics} {name}: `{stage}` is the first stage off end to end: rel L2 {r_e2e:.3e} (limit {max_e2e:.0e})"
                    ));
                }
                worst_e2e = worst_e2e.max(r_e2e);
                worst_forced = worst_forced.max(r_forced);
            }
            n_images += 1;
        }
        report
            .profiles
            .push((numerics, n_images, worst_e2e, worst_forced));
    }
    Ok(report)
}
