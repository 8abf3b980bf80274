//! Checks against the vision goldens of the official code:
//!
//! * [`check_corpus`] — every (image, config) case of an `expected.json` (schema
//!   `ds41-vision-preprocess/1`, written by goldens/regen/vision_preprocess.py from the official
//!   `image_processor.load_image`) against the engine's `vision::preprocess`, bit for bit: the
//!   grid numbers, and the sha256 of the bf16 patch tensor, whole and per row of patches (so a
//!   mismatch names the first patch row that differs);
//! * [`check_tower`] — the official `vision.py` tower and aligner outputs (written by
//!   goldens/regen/vision_tower.py) against the engine's `vision::tower` in both profiles.
//!
//! The comparisons themselves ([`judge_preprocessed`], [`first_divergence`]) also judge any
//! engine's answers in the `vision` check family.

use std::collections::BTreeMap;
use std::path::Path;

use ds41_engine::config::VisionConfig;
use ds41_engine::model::Numerics;
use ds41_engine::trace::{TraceFile, TraceTensor};
use ds41_engine::vision::patch_file::grid_values;
use ds41_engine::vision::span_types;
use ds41_engine::vision::tower::{ForcedStages, VisionTower};
use ds41_engine::vision::{preprocess_bytes, ImagePatches};

use crate::engine_api::VisionPreprocessConfig;
use crate::gates::{GateSet, VisionGates};
use half::bf16;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub const SCHEMA: &str = "ds41-vision-preprocess/1";

/// A preprocessing corpus golden (`expected.json`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    schema: String,
    pub pillow: String,
    pub configs: BTreeMap<String, CaseConfig>,
    pub cases: Vec<Case>,
}

impl Expected {
    /// Read and check the schema of `path`.
    pub fn read(path: &Path) -> Result<Expected, String> {
        read_json_golden(path, SCHEMA, |e: &Expected| &e.schema)
    }
}

/// A JSON golden whose `schema` (as `schema_of` reads it) must be `schema`; errors name the file.
pub fn read_json_golden<T: serde::de::DeserializeOwned>(
    path: &Path,
    schema: &str,
    schema_of: impl Fn(&T) -> &str,
) -> Result<T, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let golden: T =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let found = schema_of(&golden);
    if found != schema {
        return Err(format!(
            "{}: schema {found:?}, expected {schema:?}",
            path.display()
        ));
    }
    Ok(golden)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseConfig {
    vision_patch_size: usize,
    vision_downsample_ratio: usize,
    vision_max_n_token: usize,
    vision_min_pixels: usize,
    vision_max_wh_ratio: Option<f64>,
}

impl CaseConfig {
    /// The preprocessing fields as a protocol request carries them.
    pub fn request_config(&self) -> VisionPreprocessConfig {
        VisionPreprocessConfig {
            patch_size: self.vision_patch_size,
            downsample_ratio: self.vision_downsample_ratio,
            max_image_tokens: self.vision_max_n_token,
            min_pixels: self.vision_min_pixels,
            max_wh_ratio: self.vision_max_wh_ratio,
        }
    }

    /// Only the preprocessing fields matter; the tower's are left at zero.
    fn vision(&self) -> VisionConfig {
        self.request_config().vision_config()
    }
}

/// One (image, config) case of a corpus golden.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Relative to the corpus directory.
    pub image: String,
    pub config: String,
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

/// One preprocessed image as an engine answers it (the patch file of
/// `ds41_engine::vision::patch_file`).
pub struct Preprocessed {
    /// `n_vit_h, n_vit_w, n_llm_h, n_llm_w, pixel_height, pixel_width`.
    pub grid: Vec<i64>,
    pub patches_shape: Vec<usize>,
    /// The bf16 patches as little-endian bytes.
    pub patch_bytes: Vec<u8>,
    pub token_types: Vec<i64>,
}

impl Preprocessed {
    /// The engine's own preprocessing, in process.
    fn of(p: &ImagePatches) -> Preprocessed {
        let (n_vit_h, n_vit_w) = p.vit_grid();
        Preprocessed {
            grid: grid_values(p).to_vec(),
            patches_shape: vec![n_vit_h * n_vit_w, 3, p.patch_size, p.patch_size],
            patch_bytes: patch_bytes(p, 0..p.patches.len()),
            token_types: span_types(p.plan.n_llm_h, p.plan.n_llm_w)
                .into_iter()
                .map(|t| t.code())
                .collect(),
        }
    }
}

/// Does `got` hold exactly the official pipeline's output for `case`? The error says what
/// differs first: the grid, the shape, the span's token types, or the first patch row (by its
/// digest) that differs.
pub fn judge_preprocessed(case: &Case, got: &Preprocessed) -> Result<(), String> {
    let want_grid: Vec<i64> = [case.n_vit, case.n_llm, case.pixel_size]
        .concat()
        .iter()
        .map(|&v| v as i64)
        .collect();
    if got.grid != want_grid {
        return Err(format!(
            "grid (n_vit_h, n_vit_w, n_llm_h, n_llm_w, pixel height, pixel width) {:?}, official {want_grid:?}",
            got.grid
        ));
    }
    if got.patches_shape != case.patches_shape {
        return Err(format!(
            "patches shape {:?}, official {:?}",
            got.patches_shape, case.patches_shape
        ));
    }
    let want_types = official_span_types(case.n_llm[0], case.n_llm[1]);
    if got.token_types != want_types {
        let at = got
            .token_types
            .iter()
            .zip(&want_types)
            .position(|(a, b)| a != b)
            .unwrap_or(got.token_types.len().min(want_types.len()));
        return Err(format!(
            "span token types differ first at position {at} ({} types, official {})",
            got.token_types.len(),
            want_types.len()
        ));
    }
    let (n_vit_h, n_vit_w) = (case.n_vit[0], case.n_vit[1]);
    let row_len = n_vit_w * case.patches_shape[1..].iter().product::<usize>() * 2;
    for (row, want) in case.row_sha256_16.iter().enumerate() {
        let bytes = got
            .patch_bytes
            .get(row * row_len..(row + 1) * row_len)
            .unwrap_or_default();
        if &sha256_hex(bytes)[..16] != want {
            return Err(format!(
                "patch row {row} (of {n_vit_h}) is the first that differs (patches {}..{})",
                row * n_vit_w,
                (row + 1) * n_vit_w
            ));
        }
    }
    if sha256_hex(&got.patch_bytes) != case.patches_sha256 {
        return Err("patch tensor sha256 differs (every row digest matched)".into());
    }
    Ok(())
}

/// The official span layout (`image_processor.image_token_types`) written position by position,
/// apart from the engine's own construction so the check does not echo it: START, then rows of
/// n_llm_w IMAGE each closed by a NEW_LINE, then END (the span goldens check the engine's).
fn official_span_types(n_llm_h: usize, n_llm_w: usize) -> Vec<i64> {
    let len = n_llm_h * (n_llm_w + 1) + 2;
    (0..len)
        .map(|i| match i {
            0 => 0,
            _ if i == len - 1 => 3,
            _ if (i - 1) % (n_llm_w + 1) == n_llm_w => 2,
            _ => 1,
        })
        .collect()
}

/// The corpus image of `case`, its recorded sha256 checked (the corpus must not have changed).
pub fn case_image(dir: &Path, case: &Case) -> Result<(std::path::PathBuf, Vec<u8>), String> {
    let path = dir.join(&case.image);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if sha256_hex(&bytes) != case.png_sha256 {
        return Err(format!(
            "{}: the PNG's sha256 is not the one recorded (corpus changed)",
            case.image
        ));
    }
    Ok((path, bytes))
}

fn check_case(dir: &Path, case: &Case, cfg: &VisionConfig) -> Result<(), String> {
    let (path, bytes) = case_image(dir, case)?;
    let got = preprocess_bytes(&bytes, &path, cfg).map_err(|e| e.to_string())?;
    if [got.source_width, got.source_height] != case.source_size {
        return Err(format!(
            "source size [w, h] {:?}, official {:?}",
            [got.source_width, got.source_height],
            case.source_size
        ));
    }
    judge_preprocessed(case, &Preprocessed::of(&got))
}

/// Check every case of `dir/expected.json`.
pub fn check_corpus(dir: &Path) -> Result<CorpusReport, String> {
    let expected = Expected::read(&dir.join("expected.json"))?;
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

/// The tower gates of a numerics profile (gates/, `vision`).
pub fn tower_gates(numerics: Numerics) -> Result<VisionGates, String> {
    let gates =
        GateSet::load(&crate::runner::repo_root().join("gates")).map_err(|e| e.to_string())?;
    let profile = match numerics {
        Numerics::Exact => crate::gates::ProfileName::Exact,
        Numerics::Upstream => crate::gates::ProfileName::Upstream,
    };
    Ok(gates.get(profile).vision.clone())
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

/// The contract's rel L2 (CONTRACT.md §5, `compare::rel_l2`: a non-finite engine value never
/// passes) on f32 stages; stages of different lengths are infinitely far apart.
fn rel_l2(ours: &[f32], theirs: &[f32]) -> f64 {
    if ours.len() != theirs.len() {
        return f64::INFINITY;
    }
    let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    crate::compare::rel_l2(&widen(ours), &widen(theirs))
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// One stage of the tower: its name (`vision.embed`, `vision.blocks[b]`, `vision.norm`,
/// `vision.aligner`) and its output values.
pub type Stage = (String, Vec<f32>);

/// The stages of a tower golden of goldens/regen/vision_tower.py (tensors `embed`, `block.B`,
/// `vit`, `aligner`), in computation order.
pub fn golden_stages(golden: &TraceFile, n_layers: usize) -> Result<Vec<Stage>, String> {
    let get = |name: &str| -> Result<Vec<f32>, String> {
        golden
            .f32(name)
            .map(|(_, v)| v.to_vec())
            .ok_or_else(|| format!("{}: no `{name}`", golden.path.display()))
    };
    let mut stages = vec![("vision.embed".to_string(), get("embed")?)];
    for b in 0..n_layers {
        stages.push((format!("vision.blocks[{b}]"), get(&format!("block.{b}"))?));
    }
    stages.push(("vision.norm".into(), get("vit")?));
    stages.push(("vision.aligner".into(), get("aligner")?));
    Ok(stages)
}

/// The stages of image `i` of a forward golden with image spans (`vision.I{i}.embed`,
/// `.blocks` [layers, n, dim], `.vit`, `.aligner`; docs/TRACE.md), in computation order.
pub fn forward_golden_stages(
    golden: &TraceFile,
    i: usize,
    n_layers: usize,
) -> Result<Vec<Stage>, String> {
    let mut renamed = TraceFile::default();
    for (from, to) in [
        ("embed", "vision.embed"),
        ("blocks", "vision.blocks"),
        ("vit", "vision.norm"),
        ("aligner", "vision.aligner"),
    ] {
        let name = format!("vision.I{i}.{from}");
        let t = golden
            .get(&name)
            .ok_or_else(|| format!("{}: no `{name}`", golden.path.display()))?;
        renamed.tensors.insert(to.into(), t.clone());
    }
    trace_stages(&renamed, n_layers)
        .map_err(|e| format!("{}: image {i}: {e}", golden.path.display()))
}

/// Does image `i` of a forward golden (its `vision.I{i}.patches`, the official patches as
/// values) hold exactly these patches?
pub fn forward_golden_patches_match(
    golden: &TraceFile,
    i: usize,
    patches: &ImagePatches,
) -> Result<(), String> {
    let name = format!("vision.I{i}.patches");
    let (_, want) = golden.f32(&name).ok_or_else(|| format!("no `{name}`"))?;
    let ours: Vec<f32> = patches.patches.iter().map(|v| v.to_f32()).collect();
    if ours.as_slice() != want {
        return Err(format!("`{name}` differs from the image's patches"));
    }
    Ok(())
}

/// The stages of an engine's tower trace (PROTOCOL.md `vision_tower`): `vision.embed` [n, dim],
/// `vision.blocks` [layers, n, dim], `vision.norm` [n, dim], `vision.aligner` [cells, llm_dim].
pub fn trace_stages(trace: &TraceFile, n_layers: usize) -> Result<Vec<Stage>, String> {
    let get = |name: &str| -> Result<(&[usize], &[f32]), String> {
        trace
            .f32(name)
            .ok_or_else(|| format!("the trace has no float tensor `{name}`"))
    };
    let (embed_shape, embed) = get("vision.embed")?;
    let (blocks_shape, blocks) = get("vision.blocks")?;
    let want: Vec<usize> = std::iter::once(n_layers)
        .chain(embed_shape.iter().copied())
        .collect();
    if blocks_shape != want.as_slice() {
        return Err(format!(
            "`vision.blocks` has shape {blocks_shape:?}, expected {want:?} ({n_layers} blocks \
             of `vision.embed`'s shape)"
        ));
    }
    let mut stages = vec![("vision.embed".to_string(), embed.to_vec())];
    for (b, chunk) in blocks.chunks(embed.len().max(1)).enumerate() {
        stages.push((format!("vision.blocks[{b}]"), chunk.to_vec()));
    }
    stages.push(("vision.norm".into(), get("vision.norm")?.1.to_vec()));
    stages.push(("vision.aligner".into(), get("vision.aligner")?.1.to_vec()));
    Ok(stages)
}

/// The stages of a golden as the tower request's replay file (the protocol's names).
pub fn replay_file(golden: &[Stage], embed_shape: &[usize]) -> TraceFile {
    let mut file = TraceFile::default();
    let stage = |name: &str| -> Vec<f32> {
        golden
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let blocks: Vec<f32> = golden
        .iter()
        .filter(|(n, _)| n.starts_with("vision.blocks["))
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    let n_blocks = golden
        .iter()
        .filter(|(n, _)| n.starts_with("vision.blocks["))
        .count();
    let mut put = |name: &str, shape: Vec<usize>, v: Vec<f32>| {
        file.tensors.insert(name.into(), TraceTensor::f32(shape, v));
    };
    put("vision.embed", embed_shape.to_vec(), stage("vision.embed"));
    put(
        "vision.blocks",
        std::iter::once(n_blocks)
            .chain(embed_shape.iter().copied())
            .collect(),
        blocks,
    );
    put("vision.norm", embed_shape.to_vec(), stage("vision.norm"));
    file
}

/// The first stage, in computation order, whose rel L2 against the golden exceeds `limit` (or
/// whose size differs), as a sentence naming it; and the worst rel L2 seen.
pub fn first_divergence(golden: &[Stage], got: &[Stage], limit: f64) -> (f64, Option<String>) {
    let mut worst = 0f64;
    for (want, have) in golden.iter().zip(got) {
        let name = &want.0;
        if have.1.len() != want.1.len() {
            return (
                f64::INFINITY,
                Some(format!(
                    "`{name}` has {} values, the golden {}",
                    have.1.len(),
                    want.1.len()
                )),
            );
        }
        let r = rel_l2(&have.1, &want.1);
        worst = worst.max(r);
        if r > limit {
            return (
                worst,
                Some(format!("`{name}`: rel L2 {r:.3e} (limit {limit:.1e})")),
            );
        }
    }
    if got.len() < golden.len() {
        return (
            f64::INFINITY,
            Some(format!("`{}` is missing", golden[got.len()].0)),
        );
    }
    (worst, None)
}

/// The tower goldens in `dir` (weights.safetensors + IMAGE.DTYPE.safetensors, written by
/// goldens/regen/vision_tower.py) against the engine's tower in both profiles, each image
/// preprocessed by the engine from `images/IMAGE.png` (its patches must hash as the official
/// ones did): every stage end to end and teacher-forced (fed the official input of that stage),
/// within the profile's `vision` gates.
pub fn check_tower(dir: &Path, images: &Path) -> Result<TowerReport, String> {
    let weights_path = dir.join("weights.safetensors");
    let bytes = read_file(&weights_path)?;
    let (config, llm_dim) = tower_config(&bytes)?;
    let weights = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let mut report = TowerReport::default();
    for (numerics, dtype) in [
        (Numerics::Upstream, "bfloat16"),
        (Numerics::Exact, "float32"),
    ] {
        let gates = tower_gates(numerics)?;
        let tower = VisionTower::load(&config, llm_dim, numerics, |name| {
            tensor_f32(&weights, name).map_err(ds41_engine::Error::Model)
        })
        .map_err(|e| e.to_string())?;
        let (mut worst_e2e, mut worst_forced, mut n_images) = (0f64, 0f64, 0);
        for name in TOWER_IMAGES {
            let golden = TraceFile::read(&dir.join(format!("{name}.{dtype}.safetensors")))
                .map_err(|e| e.to_string())?;
            let png = images.join(format!("{name}.png"));
            let patches =
                ds41_engine::vision::load_image(&png, &config).map_err(|e| e.to_string())?;
            if let Err(why) = golden_patches_match(&golden, &patches) {
                report.failures.push(format!("{name}: {why}"));
                continue;
            }
            let (n_h, n_w) = patches.vit_grid();
            let want = golden_stages(&golden, config.n_layers)?;
            let values: Vec<f32> = patches.patches.iter().map(|v| v.to_f32()).collect();
            let stages = |out: ds41_engine::vision::tower::TowerOutput| -> Vec<Stage> {
                let mut s = vec![("vision.embed".to_string(), out.embed)];
                s.extend(
                    out.blocks
                        .into_iter()
                        .enumerate()
                        .map(|(b, v)| (format!("vision.blocks[{b}]"), v)),
                );
                s.push(("vision.norm".into(), out.vit));
                s.push(("vision.aligner".into(), out.aligner));
                s
            };
            let e2e = stages(tower.forward(&patches).map_err(|e| e.to_string())?);
            let forced_blocks: Vec<Vec<f32>> = want[1..=config.n_layers]
                .iter()
                .map(|(_, v)| v.clone())
                .collect();
            let forced = ForcedStages {
                embed: &want[0].1,
                blocks: &forced_blocks,
                vit: &want[config.n_layers + 1].1,
            };
            let replayed = stages(
                tower
                    .run(&values, n_h, n_w, Some(&forced))
                    .map_err(|e| e.to_string())?,
            );
            let (r_forced, forced_fail) =
                first_divergence(&want, &replayed, gates.tower_replay_rel_l2);
            let (r_e2e, e2e_fail) = first_divergence(&want, &e2e, gates.tower_rel_l2);
            if let Some(why) = forced_fail {
                report
                    .failures
                    .push(format!("{numerics} {name}: teacher-forced: {why}"));
            } else if let Some(why) = e2e_fail {
                report
                    .failures
                    .push(format!("{numerics} {name}: end to end: {why}"));
            }
            worst_e2e = worst_e2e.max(r_e2e);
            worst_forced = worst_forced.max(r_forced);
            n_images += 1;
        }
        report
            .profiles
            .push((numerics, n_images, worst_e2e, worst_forced));
    }
    Ok(report)
}

/// Does `golden` (a tower golden, metadata `patches_sha256`) belong to these patches?
pub fn golden_patches_match(golden: &TraceFile, patches: &ImagePatches) -> Result<(), String> {
    let want = golden
        .metadata
        .get("patches_sha256")
        .cloned()
        .unwrap_or_default();
    if sha256_hex(&patch_bytes(patches, 0..patches.patches.len())) != want {
        return Err("the patches differ from the official ones".into());
    }
    Ok(())
}

/// The tower's vision config and the language model's width, from the `config` metadata of a
/// tower weights file (goldens/vision/tower/weights.safetensors: the `ModelArgs` names).
pub fn tower_config(weights: &[u8]) -> Result<(VisionConfig, usize), String> {
    let (_, meta) = SafeTensors::read_metadata(weights).map_err(|e| e.to_string())?;
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
    Ok((config, get("dim")? as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, v: &[f32]) -> Stage {
        (name.to_string(), v.to_vec())
    }

    #[test]
    fn the_first_stage_past_the_limit_is_named_and_nan_never_passes() {
        let golden = [
            stage("vision.embed", &[1.0, 2.0]),
            stage("vision.norm", &[3.0, 4.0]),
        ];
        let close = [
            stage("vision.embed", &[1.0, 2.0]),
            stage("vision.norm", &[3.0, 4.001]),
        ];
        assert_eq!(first_divergence(&golden, &close, 1e-3).1, None);
        let nan = [
            stage("vision.embed", &[1.0, f32::NAN]),
            stage("vision.norm", &[3.0, 4.0]),
        ];
        let (worst, d) = first_divergence(&golden, &nan, 1e-3);
        assert!(worst.is_infinite() && d.unwrap().contains("`vision.embed`"));
        let off = [
            stage("vision.embed", &[1.0, 2.0]),
            stage("vision.norm", &[3.0, 5.0]),
        ];
        assert!(first_divergence(&golden, &off, 1e-3)
            .1
            .unwrap()
            .contains("`vision.norm`"));
        let short = [stage("vision.embed", &[1.0, 2.0])];
        assert!(first_divergence(&golden, &short, 1e-3)
            .1
            .unwrap()
            .contains("missing"));
        // An all-zero golden stage: the contract's absolute distance, not a division by zero.
        let zero = [stage("vision.embed", &[0.0, 0.0])];
        assert_eq!(
            first_divergence(&zero, &[stage("vision.embed", &[0.0, 0.0])], 0.0).1,
            None
        );
        assert!(
            first_divergence(&zero, &[stage("vision.embed", &[0.0, 1.0])], 0.5)
                .1
                .is_some()
        );
    }
}
