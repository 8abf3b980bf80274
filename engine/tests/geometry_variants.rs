//! Geometries no preset has (`ds41 synth --set`), which the official code runs: the reference
//! opens and runs them with the official semantics. Differential runs against model.py on such
//! geometries found each of these.

use std::path::{Path, PathBuf};

use ds41_engine::checkpoint::Layout;
use ds41_engine::model::{Defect, DefectSet, IndexK, Model, Numerics, Options, Session};
use ds41_engine::testing::bit_equal;
use ds41_engine::trace::{Trace, TraceFile, TraceOptions};

const IDS: [u32; 12] = [3, 7, 11, 5, 19, 23, 2, 41, 8, 64, 17, 90];

/// `tiny` with `overrides`, written into a fresh directory.
fn tiny_with(overrides: &[(&str, serde_json::Value)]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    ds41_synthetic::generate_with(&ds41_synthetic::Options {
        preset: "tiny".into(),
        layout: Layout::Release,
        seed: 0,
        out_dir: dir.clone(),
        mutant: None,
        force: false,
        overrides: overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    })
    .unwrap();
    (tmp, dir)
}

/// Prefill of `prefill` tokens, then decode steps, with sub-op tensors recorded.
fn run(dir: &Path, prefill: usize, options: Options) -> Trace {
    let model = Model::open(dir).unwrap();
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: true,
        },
    );
    let mut s = Session::new(&model, options);
    s.prefill(&IDS[..prefill], &mut trace).unwrap();
    for &t in &IDS[prefill..] {
        s.decode(t, &mut trace).unwrap();
    }
    trace
}

fn profile(numerics: Numerics, defects: DefectSet) -> Options {
    Options {
        numerics,
        index_k: IndexK::AsShipped,
        defects,
    }
}

/// `swiglu_limit: 0` (`ModelArgs`' default) disables the SwiGLU clamps (model.py clamps only
/// when the limit is > 0): the run equals the no-clamp negative control bit for bit, in both
/// profiles, where clamping at 0 would zero every expert's up branch.
#[test]
fn a_zero_swiglu_limit_means_no_clamp() {
    let (_tmp, dir) = tiny_with(&[("swiglu_limit", serde_json::json!(0))]);
    for numerics in [Numerics::Upstream, Numerics::Exact] {
        let plain = run(&dir, 5, profile(numerics, DefectSet::none()));
        let unclamped = run(
            &dir,
            5,
            profile(numerics, DefectSet::new([Defect::NoSwigluClamp])),
        );
        assert!(bit_equal(&plain.logits, &unclamped.logits), "{numerics}");
        assert!(plain.logits.iter().all(|x| x.is_finite()));
    }
}

/// A model without Engram layers runs, and its trace has no Engram tensors at all (the
/// official driver writes none; an empty one beside a golden without it broke comparers).
#[test]
fn a_model_without_engram_writes_no_engram_tensors() {
    let (tmp, dir) = tiny_with(&[("engram_layer_ids", serde_json::json!([]))]);
    let trace = run(&dir, 5, Options::default());
    let path = tmp.path().join("trace.safetensors");
    trace.write(&path).unwrap();
    let file = TraceFile::read(&path).unwrap();
    for name in ["engram_hash", "engram_gate"] {
        assert!(file.get(name).is_none(), "{name} written");
    }
    for name in ["logits", "residual", "experts", "attn_out"] {
        assert!(file.get(name).is_some(), "{name} missing");
    }
}

/// A window-only layer between a KV source and its consumer (ratios 0,2,0,2,1,1): the
/// release layout allows it (each layer reads the most recent source, MODEL.md §6.4.5) and
/// the reference runs it, prefill and decode alike in the exact profile.
#[test]
fn a_split_ratio_group_runs_in_the_release_layout() {
    let (_tmp, dir) = tiny_with(&[
        ("compress_ratios", serde_json::json!([0, 2, 0, 2, 1, 1])),
        ("kv_source_layer_ids", serde_json::json!([1, 4])),
        ("index_source_layer_ids", serde_json::json!([1, 4, 5])),
        ("candidate_source_layer_id", serde_json::json!(4)),
    ]);
    let exact = |prefill| run(&dir, prefill, profile(Numerics::Exact, DefectSet::none()));
    let (whole, stepped) = (exact(IDS.len()), exact(1));
    let last = |t: &Trace| t.logits[t.logits.len() - t.vocab..].to_vec();
    assert!(bit_equal(&last(&whole), &last(&stepped)));
}
