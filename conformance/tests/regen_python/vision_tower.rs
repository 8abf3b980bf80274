//! The engine's vision tower and aligner against the official `inference/vision.py`, run by
//! goldens/regen/vision_tower.py on small seeded random weights and corpus PNGs (grids with and
//! without the aligner's zero padding): the patches bit for bit (both preprocess the same PNG);
//! every block's output, the final norm and the aligner, end to end and teacher-forced per
//! stage: the upstream profile against torch's bf16 run within bf16 rounding, the exact
//! profile against torch's f32 run within f32 rounding.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ds41_engine::config::VisionConfig;
use ds41_engine::model::Numerics;
use ds41_engine::vision::tower::VisionTower;
use safetensors::SafeTensors;

/// Rel L2 each compared tensor must stay under, end to end and for one stage fed the official
/// input. Upstream: bf16 keeps 8 significant bits (rel. step 2^-8 ≈ 3.9e-3), and torch's
/// and our sums round differently before each bf16 rounding. Exact: f32 rounding only.
fn limits(numerics: Numerics) -> (f64, f64) {
    match numerics {
        Numerics::Upstream => (1e-2, 5e-3),
        Numerics::Exact => (5e-6, 5e-6),
    }
}

const IMAGES: [&str; 3] = [
    "rgb8_100x37_upscale", // 3x8 patches: the aligner pads the width
    "rgb8_37x100_upscale", // 8x3: pads the height
    "rgb8_601x599_odd",    // 14x15: pads the height
];

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    match t.dtype() {
        safetensors::Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        safetensors::Dtype::BF16 => t
            .data()
            .chunks_exact(2)
            .map(|b| ds41_engine::dtype::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        d => panic!("{name}: dtype {d:?}"),
    }
}

fn rel_l2(ours: &[f32], theirs: &[f32]) -> (f64, f64) {
    assert_eq!(ours.len(), theirs.len());
    let (mut d2, mut t2, mut max) = (0f64, 0f64, 0f64);
    for (a, b) in ours.iter().zip(theirs) {
        let d = (*a as f64) - (*b as f64);
        d2 += d * d;
        t2 += (*b as f64) * (*b as f64);
        max = max.max(d.abs());
    }
    ((d2 / t2).sqrt(), max)
}

pub fn tower_matches_official(python: &Path, inference: &Path) {
    for numerics in [Numerics::Upstream, Numerics::Exact] {
        profile_matches_official(python, inference, numerics);
    }
}

fn profile_matches_official(python: &Path, inference: &Path, numerics: Numerics) {
    let (max_rel, max_rel_forced) = limits(numerics);
    let dtype = match numerics {
        Numerics::Upstream => "bfloat16",
        Numerics::Exact => "float32",
    };
    let tmp = tempfile::tempdir().unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision/preprocess/images");
    let mut cmd = Command::new(python);
    cmd.args(["-W", "ignore"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/regen/vision_tower.py"))
        .arg("--inference")
        .arg(inference)
        .arg("--out")
        .arg(tmp.path())
        .args(["--dtype", dtype]);
    for name in IMAGES {
        cmd.arg(corpus.join(format!("{name}.png")));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "vision_tower.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(tmp.path().join("weights.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let small: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["config"]).unwrap();
    let u = |k: &str| small[k].as_u64().unwrap() as usize;
    let config = VisionConfig {
        n_layers: u("vision_n_layers"),
        dim: u("vision_dim"),
        n_heads: u("vision_n_heads"),
        inter_dim: u("vision_inter_dim"),
        patch_size: u("vision_patch_size"),
        downsample_ratio: u("vision_downsample_ratio"),
        max_n_token: u("vision_max_n_token"),
        min_pixels: u("vision_min_pixels"),
        max_wh_ratio: None,
        rope_theta: small["vision_rope_theta"].as_f64().unwrap(),
    };
    let weights = SafeTensors::deserialize(&bytes).unwrap();
    let tower =
        VisionTower::load(&config, u("dim"), numerics, |name| Ok(f32s(&weights, name))).unwrap();
    let (mut worst, mut worst_forced) = (0f64, 0f64);
    for name in IMAGES {
        let golden = std::fs::read(tmp.path().join(format!("{name}.safetensors"))).unwrap();
        let golden = SafeTensors::deserialize(&golden).unwrap();
        let png = corpus.join(format!("{name}.png"));
        let patches = ds41_engine::vision::load_image(&png, &config).unwrap();
        let ours: Vec<f32> = patches.patches.iter().map(|v| v.to_f32()).collect();
        assert_eq!(ours, f32s(&golden, "patches"), "{name}: patches differ");
        let got = tower.forward(&patches).unwrap();
        let mut compared: Vec<(String, &[f32])> = got
            .blocks
            .iter()
            .enumerate()
            .map(|(b, v)| (format!("block.{b}"), v.as_slice()))
            .collect();
        compared.push(("vit".into(), &got.vit));
        compared.push(("aligner".into(), &got.aligner));
        // Teacher-forced: each stage from the official input of that stage.
        let (n_h, n_w) = patches.vit_grid();
        let mut forced = vec![("embed".to_string(), tower.embed(&ours))];
        for b in 0..config.n_layers {
            let input = if b == 0 {
                "embed".to_string()
            } else {
                format!("block.{}", b - 1)
            };
            let x = tower.block(b, &f32s(&golden, &input), n_h, n_w);
            forced.push((format!("block.{b}"), x));
        }
        let last = format!("block.{}", config.n_layers - 1);
        forced.push(("vit".into(), tower.final_norm(&f32s(&golden, &last))));
        forced.push((
            "aligner".into(),
            tower.align(&f32s(&golden, "vit"), n_h, n_w),
        ));
        for (tensor, ours) in &forced {
            let (rel, max) = rel_l2(ours, &f32s(&golden, tensor));
            eprintln!("  {numerics} {name} {tensor} (teacher-forced): rel L2 {rel:.2e}, max |d| {max:.2e}");
            assert!(
                rel < max_rel_forced,
                "{numerics} {name}: teacher-forced `{tensor}` is off: rel L2 {rel:.3e} (limit {max_rel_forced:.0e})"
            );
            worst_forced = worst_forced.max(rel);
        }
        for (tensor, ours) in compared {
            let (rel, max) = rel_l2(ours, &f32s(&golden, &tensor));
            eprintln!("  {numerics} {name} {tensor}: rel L2 {rel:.2e}, max |d| {max:.2e}");
            assert!(
                rel < max_rel,
                "{numerics} {name}: `{tensor}` is the first tensor off: rel L2 {rel:.3e} (limit {max_rel:.0e})"
            );
            worst = worst.max(rel);
        }
    }
    eprintln!(
        "vision tower ({numerics}) vs official: worst rel L2 {worst:.2e} end to end, {worst_forced:.2e} teacher-forced"
    );
}
