//! WASTE's own converter (`tools/convert.py` at Penguinjanator/warp 8d5405d8) on a synthetic
//! release checkpoint: the containers it writes open in the reference, and with VQ3R experts
//! the reference agrees with WASTE's f32 oracle (`tools/ds41_ref.py`) on them at the exact
//! gates. These are the containers an engine author actually has; the synthetic ones are
//! written by this project's generator.
//!
//! The source is `vision` seed 7 with `moe_intermediate_size` 64: the converter's pre-flight
//! check wants a vision tower, and the oracle reads only expert row counts that fill whole
//! 64-row index blocks. convert.py reads sharded checkpoints only, so the single file gets a
//! `model.safetensors.index.json`; it writes `engram.json` and `engram-tokmap.bin` only on its
//! `--reclaim` path, so it runs with `--reclaim dry` (which deletes nothing).
//!
//! convert.py keeps trunk tensors under 65,536 elements in F32, so a second source at hidden
//! 256 (q_lora 256, 8 heads) gets quantised trunk linears: converted with the default Q4G bulk
//! and with `--trunk-bits 3` (Q3G), each must pass the converter gate's round trip against the
//! release (`ds41 gate converter` without its forward step), which a misread bit stream fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_engine::model::{IndexK, Model, Numerics};
use ds41_engine::testing::{decode_schedule, options, run_chunks};
use ds41_engine::trace::TraceFile;
use libtest_mimic::Failed;

const IDS: [u32; 8] = [3, 7, 11, 5, 19, 23, 2, 41];

pub fn converted_containers_agree_with_the_oracle(
    python: &Path,
    waste: &Path,
) -> Result<(), Failed> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = tmp.path().join("src");
    release_source(&src, &[("moe_intermediate_size", 64)])?;

    let vq3r = tmp.path().join("vq3r");
    convert(python, waste, &src, &vq3r, &[])?;
    let vq4p = tmp.path().join("vq4p");
    convert(
        python,
        waste,
        &src,
        &vq4p,
        &["--index-bits", "6", "--stages", "4", "--entries", "64"],
    )?;

    let opts = options(Numerics::Exact, IndexK::AsShipped);
    let schedule = decode_schedule(1, IDS.len());
    for dir in [&vq3r, &vq4p] {
        let model = Model::open(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        run_chunks(&model, &IDS, &schedule, &opts);
    }

    // The oracle cannot read VQ4P (a byte per stage from 256-entry books), so VQ3R only.
    let golden = tmp.path().join("oracle.safetensors");
    let ids: Vec<String> = IDS.iter().map(u32::to_string).collect();
    let out = Command::new(python)
        .arg(super::repo_root().join("goldens/regen/waste_oracle.py"))
        .args(["--waste".as_ref(), waste.as_os_str()])
        .args(["--python".as_ref(), python.as_os_str()])
        .args(["--container".as_ref(), vq3r.as_os_str()])
        .args(["--ids", &ids.join(",")])
        .args(["--out".as_ref(), golden.as_os_str()])
        .output()
        .map_err(|e| format!("run waste_oracle.py: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "waste_oracle.py failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    quantised_trunks_pass_the_round_trip(python, waste, tmp.path())?;

    let want = TraceFile::read(&golden).map_err(|e| e.to_string())?;
    let model = Model::open(&vq3r).map_err(|e| e.to_string())?;
    let got = run_chunks(&model, &IDS, &schedule, &opts);
    for (name, ours) in [("logits", &got.logits), ("residual", &got.residual)] {
        let (_, theirs) = want
            .f32(name)
            .ok_or_else(|| format!("oracle trace lacks {name}"))?;
        let rel = rel_l2(ours, theirs)?;
        // The exact profile's gate (gates/exact.yaml).
        if rel > 1e-4 {
            return Err(format!("{name}: rel L2 {rel:.3e} against the oracle (gate 1e-4)").into());
        }
    }
    Ok(())
}

/// `vision` seed 7 in the release layout with these `text_config` values, indexed as convert.py
/// wants.
fn release_source(dir: &Path, overrides: &[(&str, u64)]) -> Result<(), Failed> {
    ds41_synthetic::generate_with(&ds41_synthetic::Options {
        preset: "vision".into(),
        layout: ds41_synthetic::Layout::Release,
        seed: 7,
        out_dir: dir.to_path_buf(),
        mutant: None,
        force: false,
        overrides: overrides
            .iter()
            .map(|&(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect(),
    })
    .map_err(|e| e.to_string())?;
    write_single_shard_index(dir)
}

/// Q4G and Q3G trunks written by convert.py hold the release's weights by the converter gate.
fn quantised_trunks_pass_the_round_trip(
    python: &Path,
    waste: &Path,
    tmp: &Path,
) -> Result<(), Failed> {
    let src = tmp.join("src-wide");
    release_source(
        &src,
        &[
            ("moe_intermediate_size", 64),
            ("hidden_size", 256),
            ("q_lora_rank", 256),
            ("num_attention_heads", 8),
        ],
    )?;
    let gates =
        ds41_conformance::converter_gate::ConverterGates::load(&super::repo_root().join("gates"))
            .map_err(|e| e.to_string())?;
    for (bits, format) in [("4", "Q4G"), ("3", "Q3G")] {
        let out = tmp.join(format!("trunk-{bits}"));
        convert(python, waste, &src, &out, &["--trunk-bits", bits])?;
        let r = ds41_conformance::converter_gate::run(&src, &out, &gates, None)
            .map_err(|e| e.to_string())?;
        if !r.pass {
            return Err(format!("--trunk-bits {bits}: {:#?}", r.failures).into());
        }
        if !r.formats.iter().any(|f| f.format == format) {
            return Err(format!("--trunk-bits {bits}: no {format} tensor was judged").into());
        }
    }
    Ok(())
}

/// `model.safetensors.index.json` naming every tensor of the checkpoint's one file.
fn write_single_shard_index(dir: &Path) -> Result<(), Failed> {
    let file = "model.safetensors";
    let bytes = std::fs::read(dir.join(file)).map_err(|e| e.to_string())?;
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).map_err(|e| e.to_string())?;
    let weight_map: serde_json::Map<String, serde_json::Value> = header
        .keys()
        .filter(|k| *k != "__metadata__")
        .map(|k| (k.clone(), serde_json::json!(file)))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
        .map_err(|e| e.to_string().into())
}

fn convert(
    python: &Path,
    waste: &Path,
    src: &Path,
    out: &Path,
    flags: &[&str],
) -> Result<(), Failed> {
    let script: PathBuf = waste.join("tools/convert.py");
    let run = Command::new(python)
        .arg(&script)
        .args(["--src".as_ref(), src.as_os_str()])
        .args(["--out".as_ref(), out.as_os_str()])
        .args(["--reclaim", "dry"])
        .args(flags)
        .current_dir(waste)
        .output()
        .map_err(|e| format!("run {script:?}: {e}"))?;
    if run.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{script:?} {flags:?} failed:\n{}",
            String::from_utf8_lossy(&run.stderr)
        )
        .into())
    }
}

fn rel_l2(ours: &[f32], theirs: &[f32]) -> Result<f64, Failed> {
    if ours.len() != theirs.len() {
        return Err(format!(
            "{} values against the oracle's {}",
            ours.len(),
            theirs.len()
        )
        .into());
    }
    let (mut d, mut n) = (0f64, 0f64);
    for (&a, &b) in ours.iter().zip(theirs) {
        d += (f64::from(a) - f64::from(b)).powi(2);
        n += f64::from(b).powi(2);
    }
    Ok((d / n).sqrt())
}
