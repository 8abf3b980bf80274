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

use std::path::Path;
use std::process::Command;

use ds41_engine::model::{IndexK, Model, Numerics};
use ds41_engine::testing::{decode_schedule, options, run_chunks};
use ds41_engine::trace::{Trace, TraceFile};
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
    let ours = run_exact(&vq3r)?;
    let logits = run_exact(&vq4p)?.logits;
    if !logits.iter().all(|x| x.is_finite()) {
        return Err("the VQ4P container's logits are not all finite".into());
    }

    // The oracle cannot read VQ4P (a byte per stage from 256-entry books), so VQ3R only.
    let golden = tmp.path().join("oracle.safetensors");
    let ids: Vec<String> = IDS.iter().map(u32::to_string).collect();
    super::run_ok(
        Command::new(python)
            .arg(super::repo_root().join("goldens/regen/waste_oracle.py"))
            .args(["--waste".as_ref(), waste.as_os_str()])
            .args(["--python".as_ref(), python.as_os_str()])
            .args(["--container".as_ref(), vq3r.as_os_str()])
            .args(["--ids", &ids.join(",")])
            .args(["--out".as_ref(), golden.as_os_str()]),
        "waste_oracle.py",
    )?;
    let want = TraceFile::read(&golden).map_err(|e| e.to_string())?;
    for (name, got) in [("logits", &ours.logits), ("residual", &ours.residual)] {
        let (_, theirs) = want
            .f32(name)
            .ok_or_else(|| format!("oracle trace lacks {name}"))?;
        let rel = rel_l2(got, theirs)?;
        // The exact profile's gate (gates/exact.yaml).
        if rel > 1e-4 {
            return Err(format!("{name}: rel L2 {rel:.3e} against the oracle (gate 1e-4)").into());
        }
    }

    quantised_trunks_pass_the_round_trip(python, waste, tmp.path())
}

/// The reference on `IDS` token at a time, exact numerics, as-shipped hand-off: the oracle's
/// schedule (errata `waste_schedule`).
fn run_exact(dir: &Path) -> Result<Trace, Failed> {
    let model = Model::open(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let opts = options(Numerics::Exact, IndexK::AsShipped);
    Ok(run_chunks(
        &model,
        &IDS,
        &decode_schedule(1, IDS.len()),
        &opts,
    ))
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

/// `model.safetensors.index.json` naming every tensor of the checkpoint's one file (its
/// header only is read: an 8-byte length, then the JSON).
fn write_single_shard_index(dir: &Path) -> Result<(), Failed> {
    use std::io::Read;
    let file = "model.safetensors";
    let mut f = std::fs::File::open(dir.join(file)).map_err(|e| e.to_string())?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| e.to_string())?;
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| e.to_string())?;
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
    let script = waste.join("tools/convert.py");
    super::run_ok(
        Command::new(python)
            .arg(&script)
            .args(["--src".as_ref(), src.as_os_str()])
            .args(["--out".as_ref(), out.as_os_str()])
            .args(["--reclaim", "dry"])
            .args(flags)
            .current_dir(waste),
        &format!("{script:?} {flags:?}"),
    )?;
    Ok(())
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
