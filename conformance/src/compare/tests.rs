//! Unit tests of both comparison modes on a hand-made 3-token, 2-layer trace.
use super::*;

/// The named integer tensor of `t`, to damage in place; panics when it is absent or not
/// integer, so a test cannot pass because its damage silently did not happen.
fn ints<'a>(t: &'a mut TraceFile, name: &str) -> &'a mut Vec<i64> {
    match t.tensors.get_mut(name).map(|x| &mut x.data) {
        Some(TraceData::I64(v)) => v,
        _ => panic!("test trace has no integer tensor `{name}`"),
    }
}

/// [`ints`] for float tensors.
fn floats<'a>(t: &'a mut TraceFile, name: &str) -> &'a mut Vec<f32> {
    match t.tensors.get_mut(name).map(|x| &mut x.data) {
        Some(TraceData::F32(v)) => v,
        _ => panic!("test trace has no float tensor `{name}`"),
    }
}
use crate::gates::{GateSet, ProfileName};
use crate::trace::{TraceData, TraceTensor};

fn gates(p: ProfileName) -> Gates {
    GateSet::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../gates"))
        .unwrap()
        .get(p)
        .clone()
}

/// T=3 tokens, L=2 layers, cell of 4 values, vocab 5, experts top-2 of 4, one index layer.
fn golden() -> TraceFile {
    let mut g = TraceFile::default();
    let res: Vec<f32> = (0..24).map(|i| 1.0 + i as f32 * 0.1).collect();
    g.tensors
        .insert("residual".into(), TraceTensor::f32(vec![3, 2, 2, 2], res));
    g.tensors.insert(
        "experts".into(),
        TraceTensor::i64(vec![3, 2, 2], vec![0, 1, 1, 2, 2, 3, 0, 3, 1, 3, 0, 2]),
    );
    g.tensors.insert(
        "margin.experts".into(),
        TraceTensor::f32(vec![3, 2], vec![0.5, 0.5, 0.001, 0.5, 0.5, 0.5]),
    );
    g.tensors.insert(
        "topk.L1".into(),
        TraceTensor::i64(vec![3, 2], vec![0, -1, 0, 1, 1, 2]),
    );
    g.tensors.insert(
        "margin.topk.L1".into(),
        TraceTensor::f32(vec![3], vec![0.5, 0.5, 0.5]),
    );
    g.tensors.insert(
        "engram_hash".into(),
        TraceTensor::i64(vec![3, 1, 2], vec![5, 6, 7, 8, 9, 10]),
    );
    g.tensors.insert(
        "logits".into(),
        TraceTensor::f32(vec![3, 5], (0..15).map(|i| (i % 5) as f32).collect()),
    );
    g.tensors.insert(
        "logits_positions".into(),
        TraceTensor::i64(vec![3], vec![0, 1, 2]),
    );
    g
}

#[test]
fn identical_trace_passes_every_profile() {
    for p in ProfileName::ALL {
        let r = compare(&golden(), &golden(), &gates(p));
        assert!(!r.failed(), "{p}: {}", r.failure_summary());
        assert!(r
            .metrics
            .iter()
            .any(|m| m.name == "residual" && m.status == MetricStatus::Pass));
        assert!(r
            .metrics
            .iter()
            .any(|m| m.name == "topk.L1" && m.status == MetricStatus::Pass));
    }
}

#[test]
fn residual_drift_is_localised_to_token_and_layer() {
    let mut e = golden();
    {
        let v = floats(&mut e, "residual");
        // token 1, layer 1 = cell 3
        for x in &mut v[12..16] {
            *x *= 1.01;
        }
    }
    let r = compare(&golden(), &e, &gates(ProfileName::Exact));
    assert!(r.failed());
    let d = r.first_divergence.clone().unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.as_str()),
        (1, Some(1), "residual")
    );
    assert!((d.value - 0.01).abs() < 1e-6, "{}", d.value);
    // the upstream profile tolerates 1 %
    assert!(!compare(&golden(), &e, &gates(ProfileName::Upstream)).failed());
}

#[test]
fn fragile_flip_is_excused_and_counted_only_where_allowed() {
    let mut e = golden();
    // token 1 layer 0: golden {2,3} margin 0.001 -> engine {1,3}
    {
        let v = ints(&mut e, "experts");
        v[4] = 1;
    }
    let up = compare(&golden(), &e, &gates(ProfileName::Upstream));
    assert!(!up.failed(), "{}", up.failure_summary());
    assert_eq!(up.excused_flips(), 1);
    let ex = compare(&golden(), &e, &gates(ProfileName::Exact));
    assert!(ex.failed(), "exact profile compares decisions strictly");
    assert_eq!(ex.first_divergence.unwrap().subop, "experts");
}

#[test]
fn robust_flip_fails_even_when_fragile_flips_are_excused() {
    let mut e = golden();
    // token 0 layer 1: golden {1,2} margin 0.5 -> engine {1,3}
    {
        let v = ints(&mut e, "experts");
        v[3] = 3;
    }
    let r = compare(&golden(), &e, &gates(ProfileName::Upstream));
    assert!(r.failed());
    let d = r.first_divergence.clone().unwrap();
    assert_eq!((d.token, d.layer), (0, Some(1)));
    assert!(r.failure_summary().contains("ROBUST"));
}

/// A model without Engram layers: the golden's hash tensor is absent or empty, and an engine
/// that writes none (or an empty one) is neither failed nor reported as not checked.
#[test]
fn no_engram_layers_compares_no_engram_hash() {
    let mut g = golden();
    g.tensors.insert(
        "engram_hash".into(),
        TraceTensor::i64(vec![3, 0, 2], Vec::new()),
    );
    let mut e = golden();
    e.tensors.remove("engram_hash");
    for (golden, engine) in [(&g, &e), (&g, &g), (&e, &e)] {
        let r = compare(golden, engine, &gates(ProfileName::Upstream));
        assert!(!r.failed(), "{}", r.failure_summary());
        assert!(
            r.metrics.iter().all(|m| m.name != "engram_hash"),
            "{:?}",
            r.metrics.iter().map(|m| &m.name).collect::<Vec<_>>()
        );
    }
}

#[test]
fn engram_hash_and_topk_are_exact() {
    let mut e = golden();
    {
        let v = ints(&mut e, "engram_hash");
        v[3] = 99;
    }
    let r = compare(&golden(), &e, &gates(ProfileName::Quantized));
    assert!(r.failed());
    assert_eq!(r.first_divergence.clone().unwrap().subop, "engram_hash");
    let mut e = golden();
    {
        let v = ints(&mut e, "topk.L1");
        v[4] = 0; // token 2: {1,2} -> {0,2}
    }
    let r = compare(&golden(), &e, &gates(ProfileName::Upstream));
    assert!(r.failed(), "a top-k flip with margin 0.5 is robust");
}

#[test]
fn logits_argmax_and_nan_fail() {
    let mut e = golden();
    {
        let v = floats(&mut e, "logits");
        v[5] = f32::NAN;
    }
    let r = compare(&golden(), &e, &gates(ProfileName::Quantized));
    assert!(r.failed());
    let d = r.first_divergence.unwrap();
    assert_eq!((d.token, d.subop.as_str()), (1, "logits"));
}

#[test]
fn missing_tensors_are_not_checked_not_passed() {
    let mut e = TraceFile::default();
    e.tensors
        .insert("logits".into(), golden().tensors["logits"].clone());
    let r = compare(&golden(), &e, &gates(ProfileName::Exact));
    assert!(!r.failed());
    for name in ["residual", "experts", "topk.L1", "engram_hash"] {
        assert!(
            r.metrics
                .iter()
                .any(|m| m.name == name && m.status == MetricStatus::NotChecked),
            "{name}: {:?}",
            r.metrics
        );
    }
}

/// The golden of `golden()` plus the sub-op tensors a replay golden carries.
fn replay_golden() -> TraceFile {
    let mut g = golden();
    let cells = |w: usize, base: f32| (0..6 * w).map(|i| base + i as f32 * 0.05).collect();
    g.tensors.insert(
        "block_input".into(),
        TraceTensor::f32(vec![3, 2, 2, 2], cells(4, 1.0)),
    );
    g.tensors.insert(
        "attn_out".into(),
        TraceTensor::f32(vec![3, 2, 2], cells(2, 2.0)),
    );
    g.tensors.insert(
        "moe_out".into(),
        TraceTensor::f32(vec![3, 2, 2], cells(2, 3.0)),
    );
    g
}

fn scale_cell(t: &mut TraceFile, name: &str, cell: usize, f: f32) {
    let x = &t.tensors[name];
    let w = x.row_len() / x.shape[1];
    for y in &mut floats(t, name)[cell * w..(cell + 1) * w] {
        *y *= f;
    }
}

#[test]
fn replay_identical_passes_and_checks_every_cell() {
    for p in ProfileName::ALL {
        let r = compare_replay(&replay_golden(), &replay_golden(), &gates(p));
        assert!(!r.failed(), "{p}: {}", r.failure_summary());
        for name in [
            "attn_out",
            "moe_out",
            "residual",
            "block_input",
            "logits",
            "experts",
        ] {
            let m = r.metrics.iter().find(|m| m.name == name).unwrap();
            assert_eq!(m.status, MetricStatus::Pass, "{p} {name}: {}", m.text);
        }
        let res = r.metrics.iter().find(|m| m.name == "residual").unwrap();
        assert!(res.text.starts_with("6/6 cells compared"), "{}", res.text);
    }
}

#[test]
fn replay_localises_the_first_diverging_sub_op() {
    // token 1 layer 1 = cell 3: its attention output differs by 2 %.
    let mut e = replay_golden();
    scale_cell(&mut e, "attn_out", 3, 1.02);
    let r = compare_replay(&replay_golden(), &e, &gates(ProfileName::Upstream));
    assert!(r.failed());
    let d = r.first_divergence.clone().unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.as_str()),
        (1, Some(1), "attn_out")
    );
    // ... which the end-to-end comparison, blind to sub-ops here, would not see at all.
    assert!(!compare(&replay_golden(), &e, &gates(ProfileName::Upstream)).failed());
    // An Engram step (block_input) difference is its own sub-op.
    let mut e = replay_golden();
    scale_cell(&mut e, "block_input", 0, 1.05);
    let d = compare_replay(&replay_golden(), &e, &gates(ProfileName::Upstream))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.as_str()),
        (0, Some(0), "block_input")
    );
}

#[test]
fn replay_flip_is_excused_only_below_the_fixed_floor_and_skips_its_cells() {
    let up = gates(ProfileName::Upstream);
    // token 1 layer 0: golden {2,3} with margin 0.001 <= floor 0.004 -> engine {1,3}, and
    // the cells that routing decision feeds (moe_out, residual of that cell) differ.
    let mut g = replay_golden();
    let mut e = replay_golden();
    {
        let v = ints(&mut e, "experts");
        v[4] = 1;
    }
    scale_cell(&mut e, "moe_out", 2, 1.5);
    scale_cell(&mut e, "residual", 2, 1.5);
    let r = compare_replay(&g, &e, &up);
    assert!(!r.failed(), "{}", r.failure_summary());
    assert_eq!(r.excused_flips(), 1);
    let m = r.metrics.iter().find(|m| m.name == "residual").unwrap();
    assert!(m.text.starts_with("5/6 cells compared"), "{}", m.text);
    // the same margin above the floor is robust (the normal-mode drift factor does not apply)
    {
        let v = floats(&mut g, "margin.experts");
        v[2] = 0.01;
    }
    let r = compare_replay(&g, &e, &up);
    assert!(r.failed());
    assert_eq!(r.first_divergence.unwrap().subop, "experts");
    // the exact profile excuses nothing
    assert!(compare_replay(&replay_golden(), &e, &gates(ProfileName::Exact)).failed());
    // a top-k flip below the floor skips the token's cells up to the next index source
    let mut g = replay_golden();
    {
        let v = floats(&mut g, "margin.topk.L1");
        v[2] = 0.0;
    }
    let mut e = replay_golden();
    {
        let v = ints(&mut e, "topk.L1");
        v[4] = 0;
    }
    scale_cell(&mut e, "attn_out", 5, 2.0);
    let r = compare_replay(&g, &e, &up);
    assert!(!r.failed(), "{}", r.failure_summary());
    let m = r.metrics.iter().find(|m| m.name == "attn_out").unwrap();
    assert!(m.text.starts_with("5/6 cells compared"), "{}", m.text);
}

#[test]
fn replay_logits_use_the_replay_thresholds_on_every_step() {
    let mut e = replay_golden();
    {
        let v = floats(&mut e, "logits");
        v[7] += 0.01; // far inside the end-to-end limits, outside replay's 1e-3
    }
    let up = gates(ProfileName::Upstream);
    assert!(!compare(&replay_golden(), &e, &up).failed());
    let r = compare_replay(&replay_golden(), &e, &up);
    assert!(r.failed());
    assert_eq!(r.first_divergence.unwrap().subop, "logits");
}

/// With the Engram layers known, a wrong hash id is placed at the layer that reads it: after
/// a divergence in an earlier layer of the same token, before anything in that layer.
#[test]
fn an_engram_hash_divergence_sits_at_its_engram_layer() {
    let mut g = golden();
    g.metadata.insert(ENGRAM_LAYERS_METADATA.into(), "1".into());
    let mut e = g.clone();
    ints(&mut e, "engram_hash")[3] = 99; // token 1, Engram layer 0 (backbone layer 1), column 1
    let d = compare(&g, &e, &gates(ProfileName::Exact))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop),
        (1, Some(1), SubOp::EngramHash),
        "{d:?}"
    );
    assert!(d.detail.contains("Engram layer 0, column 1"), "{d:?}");
    // Layer 0 of the same token diverged first.
    scale_cell(&mut e, "residual", 2, 1.5);
    let d = compare(&g, &e, &gates(ProfileName::Exact))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop),
        (1, Some(0), SubOp::BlockOutput),
        "{d:?}"
    );
    // Without the metadata the hash divergence comes before every block of its token.
    let d = compare(&golden(), &e, &gates(ProfileName::Exact))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop),
        (1, None, SubOp::EngramHash),
        "{d:?}"
    );
}

#[test]
fn first_divergence_is_the_earliest_point_in_causal_order() {
    // token 1: layer 1 block output diverges, and (as a consequence) its logits row.
    let mut e = golden();
    scale_cell(&mut e, "residual", 3, 1.5);
    floats(&mut e, "logits")[5..10].copy_from_slice(&[9.0, 0.0, 0.0, 0.0, 0.0]);
    // token 2: a wrong Engram hash id, later in causal order than anything at token 1.
    ints(&mut e, "engram_hash")[4] = 99;
    let d = compare(&golden(), &e, &gates(ProfileName::Exact))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.to_string()),
        (1, Some(1), "residual".to_string()),
        "{d:?}"
    );
    // Logits come after the last layer of their token, and before the next token.
    let mut e = golden();
    floats(&mut e, "logits")[5..10].copy_from_slice(&[9.0, 0.0, 0.0, 0.0, 0.0]);
    scale_cell(&mut e, "residual", 4, 1.5);
    let d = compare(&golden(), &e, &gates(ProfileName::Exact))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.to_string()),
        (1, None, "logits".to_string())
    );
    // Within a cell of a replay: attn_out comes before the block output.
    let mut e = replay_golden();
    scale_cell(&mut e, "residual", 1, 1.5);
    scale_cell(&mut e, "attn_out", 3, 1.5);
    scale_cell(&mut e, "moe_out", 2, 1.5);
    let d = compare_replay(&replay_golden(), &e, &gates(ProfileName::Upstream))
        .first_divergence
        .unwrap();
    assert_eq!(
        (d.token, d.layer, d.subop.to_string()),
        (0, Some(1), "residual".to_string())
    );
}

#[test]
fn exact_tie_is_excused_in_the_exact_profile_and_skips_what_it_feeds() {
    let mut g = golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = golden();
    ints(&mut e, "topk.L1")[4] = 0; // token 2: {1,2} -> {0,2}, an exact tie in the golden
    scale_cell(&mut e, "residual", 5, 1.5); // token 2 layer 1: fed by that decision
    let r = compare(&g, &e, &gates(ProfileName::Exact));
    assert!(!r.failed(), "{}", r.failure_summary());
    assert_eq!(r.excused_flips(), 1);
    let res = r.metrics.iter().find(|m| m.name == "residual").unwrap();
    assert!(res.text.starts_with("5/6 cells compared"), "{}", res.text);
    // the same flip at a margin above 0 is still a failure in the exact profile
    floats(&mut g, "margin.topk.L1")[2] = 1e-6;
    assert!(compare(&g, &e, &gates(ProfileName::Exact)).failed());
    // replay: the same rule
    let mut g = replay_golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = replay_golden();
    ints(&mut e, "topk.L1")[4] = 0;
    scale_cell(&mut e, "attn_out", 5, 2.0);
    let r = compare_replay(&g, &e, &gates(ProfileName::Exact));
    assert!(!r.failed(), "{}", r.failure_summary());
    assert_eq!(r.excused_flips(), 1);
}

#[test]
fn a_check_that_compared_nothing_fails() {
    // An excused flip at token 0, layer 0 excludes every residual cell and logits row.
    let mut g = golden();
    floats(&mut g, "margin.experts")[0] = 0.0;
    let mut e = golden();
    ints(&mut e, "experts")[0] = 3; // token 0 layer 0: {0,1} -> {3,1}
    let r = compare(&g, &e, &gates(ProfileName::Upstream));
    assert_eq!(r.excused_flips(), 1);
    let require: Vec<String> = ["logits", "residual", "topk"].map(String::from).into();
    let uncovered: Vec<&str> = r.uncovered(&require).map(|m| m.name.as_str()).collect();
    assert_eq!(
        uncovered,
        ["topk.L1", "residual", "logits"],
        "{:?}",
        r.metrics
    );
    assert_eq!(r.uncovered(&["experts".to_string()]).count(), 0);
}

#[test]
fn canonical_ties_keep_exact_ties_strict() {
    let mut g = golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = golden();
    ints(&mut e, "topk.L1")[4] = 0;
    let mut strict = gates(ProfileName::Exact);
    strict.decisions.strict_ties = true;
    let r = compare(&g, &e, &strict);
    assert!(r.failed());
    assert_eq!(r.excused_flips(), 0);
    let d = r.first_divergence.unwrap();
    assert_eq!((d.token, d.layer, d.subop), (2, Some(1), SubOp::TopK));
    let mut g = replay_golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = replay_golden();
    ints(&mut e, "topk.L1")[4] = 0;
    assert!(compare_replay(&g, &e, &strict).failed());
}

#[test]
fn canonical_ties_are_strict_in_the_bf16_profile_too() {
    let mut g = golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = golden();
    ints(&mut e, "topk.L1")[4] = 0;
    let mut up = gates(ProfileName::Upstream);
    assert!(
        !compare(&g, &e, &up).failed(),
        "an exact tie is fragile by default"
    );
    up.decisions.strict_ties = true;
    let r = compare(&g, &e, &up);
    assert!(r.failed(), "{}", r.failure_summary());
    assert_eq!(r.first_divergence.unwrap().subop, SubOp::TopK);
    let mut g = replay_golden();
    floats(&mut g, "margin.topk.L1")[2] = 0.0;
    let mut e = replay_golden();
    ints(&mut e, "topk.L1")[4] = 0;
    assert!(compare_replay(&g, &e, &up).failed());
}

#[test]
fn compare_report_numbers_survive_json() {
    let mut e = golden();
    ints(&mut e, "experts")[3] = 3; // robust flip, golden margin 0.5
    let mut g = golden();
    floats(&mut g, "margin.experts")[1] = f32::INFINITY;
    floats(&mut e, "residual")[0] = f32::NAN;
    let r = compare(&g, &e, &gates(ProfileName::Upstream));
    let d = r.first_divergence.clone().unwrap();
    assert!(d.value.is_infinite() || d.value.is_nan(), "{d:?}");
    let json = serde_json::to_string(&d).unwrap();
    let back: Divergence = serde_json::from_str(&json).unwrap();
    assert!(crate::report::float::same(back.value, d.value), "{json}");
    assert!(serde_json::to_string(&r)
        .unwrap()
        .contains(r#""value":"inf""#));
}

#[test]
fn a_golden_decision_short_of_the_tokens_is_a_shape_mismatch_not_a_panic() {
    let mut g = golden();
    let short = g.tensors["topk.L1"].select_rows(&[0, 1]);
    g.tensors.insert("topk.L1".into(), short);
    let r = compare(&g, &golden(), &gates(ProfileName::Exact));
    assert!(r.failed());
    assert!(
        r.metrics
            .iter()
            .any(|m| m.name == "topk.L1" && m.status.fails()),
        "{:?}",
        r.metrics
    );
}
