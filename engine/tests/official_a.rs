//! Upstream profile vs the official model (`DS41_UPSTREAM/official_a`):
//! all four schedules × both `index_k` behaviours, end to end with the set's
//! `recommended_compare_args` and teacher-forced with its `recommended_replay_args`, using
//! the verdict rules of `shared/tools/compare.py` (ported in `model_common::compare`).

mod model_common;
use model_common as common;

use std::path::Path;

use common::compare::{compare, compare_replay, Limits, Report};
use ds41_engine::model::{Forcing, IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceFile, TraceOptions};

const GOLDENS: [(&str, usize, IndexK); 7] = [
    ("p01_d47/golden_ref_defect", 1, IndexK::AsShipped),
    ("p01_d47/golden_index_owner_fixed", 1, IndexK::Owner),
    ("p05_d43/golden_ref_defect", 5, IndexK::AsShipped),
    ("p05_d43/golden_index_owner_fixed", 5, IndexK::Owner),
    ("p37_d11/golden_ref_defect", 37, IndexK::AsShipped),
    ("p37_d11/golden_index_owner_fixed", 37, IndexK::Owner),
    ("p48_d00/golden_prefill_only", 48, IndexK::AsShipped),
];

fn limits(up: &Path, key: &str) -> Limits {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(up.join("official_a/meta.json")).unwrap()).unwrap();
    let args: Vec<String> = meta[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    Limits::from_args(&args)
}

fn input_ids(g: &TraceFile) -> Vec<u32> {
    g.i64("input_ids")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as u32)
        .collect()
}

fn run(model: &Model, g: &TraceFile, prefill: usize, index_k: IndexK, replay: bool) -> Trace {
    let ids = input_ids(g);
    let options = Options {
        numerics: Numerics::Upstream,
        index_k,
        ..Options::default()
    };
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: replay,
        },
    );
    let mut s = Session::new(model, options);
    if replay {
        let forcing = Forcing::from_golden(g, model.config()).unwrap();
        s.replay(&ids[..prefill], &forcing, &mut trace).unwrap();
        for i in prefill..ids.len() {
            s.replay(&ids[i..i + 1], &forcing, &mut trace).unwrap();
        }
    } else {
        s.prefill(&ids[..prefill], &mut trace).unwrap();
        for &t in &ids[prefill..] {
            s.decode(t, &mut trace).unwrap();
        }
    }
    trace
}

fn summary(name: &str, rep: &Report) -> String {
    let layers = |k: &str| {
        rep.worst
            .get(k)
            .map(|v| {
                v.iter()
                    .map(|x| format!("{x:.1e}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    let mut s = format!(
        "{name}: fragile flips {}/{} decisions; logits {}/{} steps compared, worst rel L2 {:.2e}, max|d| {:.2e}; residual per layer [{}]",
        rep.fragile_flips, rep.decisions_compared, rep.logits_compared, rep.logits_steps, rep.logits_worst_rel, rep.logits_worst_abs,
        layers("residual")
    );
    for k in ["attn_out", "moe_out", "block_input"] {
        if rep.worst.contains_key(k) {
            s += &format!("; {k} [{}]", layers(k));
        }
    }
    s
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_end_to_end_within_recommended_compare_args() {
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let lim = limits(&up, "recommended_compare_args");
    let mut failures = Vec::new();
    for (name, prefill, index_k) in GOLDENS {
        let g = TraceFile::read(&up.join(format!("official_a/{name}.safetensors"))).unwrap();
        let tr = run(&model, &g, prefill, index_k, false);
        let rep = compare(&g, &tr, &lim);
        eprintln!("{}", summary(name, &rep));
        failures.extend(rep.failures.iter().map(|f| format!("{name}: {f}")));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_replay_within_recommended_replay_args() {
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let lim = limits(&up, "recommended_replay_args");
    let mut failures = Vec::new();
    for (name, prefill, index_k) in GOLDENS {
        let g = TraceFile::read(&up.join(format!("official_a/{name}.safetensors"))).unwrap();
        let tr = run(&model, &g, prefill, index_k, true);
        let rep = compare_replay(&g, &tr, &lim);
        eprintln!("{}", summary(name, &rep));
        // Replayed, a correct engine flips no decision at all on this set.
        assert_eq!(rep.fragile_flips, 0, "{name}");
        failures.extend(rep.failures.iter().map(|f| format!("{name}: {f}")));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_replay_catches_a_wrong_index_k_behaviour() {
    // The check must be able to fail: replaying the as-shipped golden with the owner fix.
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let lim = limits(&up, "recommended_replay_args");
    let g = TraceFile::read(&up.join("official_a/p01_d47/golden_ref_defect.safetensors")).unwrap();
    let rep = compare_replay(&g, &run(&model, &g, 1, IndexK::Owner, true), &lim);
    assert!(!rep.failures.is_empty());
}

/// The margins the reference records are the official goldens' `margin.*` (same definition,
/// names and layout): replayed from the golden's own block inputs, the indexer sees the
/// golden's bf16 scores, so its top-k and candidate-block margins are bit-identical in every
/// cell (∞ where nothing competes, 0 on exact ties); the router's f32 scores differ in the
/// last bits, so its margins agree on every ∞ and 0 and to 1e-3 elsewhere.
#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_replay_margins_equal_the_goldens() {
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let trace_file =
        |t: &Trace| TraceFile::from_bytes(&t.to_bytes().unwrap(), Path::new("replay")).unwrap();
    for (name, prefill, index_k) in GOLDENS {
        let g = TraceFile::read(&up.join(format!("official_a/{name}.safetensors"))).unwrap();
        let tr = trace_file(&run(&model, &g, prefill, index_k, true));
        let names: Vec<&String> = g
            .tensors
            .keys()
            .filter(|k| k.starts_with("margin."))
            .collect();
        assert_eq!(names.len(), 5, "{name}");
        for key in names {
            let want = g.f32(key).unwrap();
            let got = tr.f32(key).unwrap_or_else(|| panic!("{name}: no {key}"));
            assert_eq!(want.0, got.0, "{name} {key} shape");
            for (i, (&w, &o)) in want.1.iter().zip(got.1).enumerate() {
                let same_kind = (w == 0.0) == (o == 0.0) && w.is_infinite() == o.is_infinite();
                let ok = if key == "margin.experts" {
                    same_kind && (w.is_infinite() || (w - o).abs() <= 1e-3)
                } else {
                    w.to_bits() == o.to_bits()
                };
                assert!(ok, "{name} {key}[{i}]: golden {w}, reference {o}");
            }
        }
    }
}

/// Cells where the official code disagrees with itself: its `attn_out` at (token, layer)
/// differs between two schedules although everything that cell depends on is bit-identical
/// (`block_input` of every token up to it at every layer up to it, hence the same caches,
/// compressed entries and hand-offs). Such a cell shows two equally valid operation orders
/// of the official code (prefill batches the rows, decode runs one): an engine can match
/// only one of them.
fn official_self_disagreements(a: &TraceFile, b: &TraceFile) -> Vec<(usize, usize)> {
    let (shape, xa) = a.f32("block_input").unwrap();
    let xb = b.f32("block_input").unwrap().1;
    let (oa, ob) = (a.f32("attn_out").unwrap().1, b.f32("attn_out").unwrap().1);
    let (t_n, l_n) = (shape[0], shape[1]);
    let row = shape[2] * shape[3];
    let d = oa.len() / (t_n * l_n);
    let same_input = |t: usize, l: usize| {
        let o = (t * l_n + l) * row;
        xa[o..o + row] == xb[o..o + row]
    };
    let mut cells = Vec::new();
    for l in 0..l_n {
        for t in 0..t_n {
            let inputs_equal = (0..=t).all(|s| (0..=l).all(|m| same_input(s, m)));
            let o = (t * l_n + l) * d;
            if inputs_equal && oa[o..o + d] != ob[o..o + d] {
                cells.push((t, l));
            }
        }
    }
    cells
}

/// Replayed, `attn_out` is bit-exact in every cell of every schedule except where the
/// official code itself gives two answers for the same inputs: at official_a's (token 13,
/// layer 3) its prefill schedules (p37_d11, p48_d00) differ from its decode schedules
/// (p01_d47, p05_d43) in 4 of 128 elements by one bf16 ulp; the reference, row-independent,
/// gives the decode value in every schedule.
#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_replay_attn_out_is_bit_exact_except_where_the_official_code_disagrees_with_itself() {
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let goldens: Vec<(&str, TraceFile)> = GOLDENS
        .iter()
        .map(|(name, _, _)| {
            let path = up.join(format!("official_a/{name}.safetensors"));
            (*name, TraceFile::read(&path).unwrap())
        })
        .collect();
    for (name, prefill, index_k) in GOLDENS {
        let g = &goldens.iter().find(|(n, _)| *n == name).unwrap().1;
        let tr = run(&model, g, prefill, index_k, true);
        let (want, got) = (g.f32("attn_out").unwrap().1, &tr.attn_out);
        let d = model.config().dim;
        let l_n = model.config().n_layers;
        let inexact: Vec<(usize, usize)> = (0..want.len() / d)
            .filter(|&c| want[c * d..(c + 1) * d] != got[c * d..(c + 1) * d])
            .map(|c| (c / l_n, c % l_n))
            .collect();
        let explained: Vec<(usize, usize)> = goldens
            .iter()
            .filter(|(other, _)| *other != name)
            .flat_map(|(_, o)| official_self_disagreements(g, o))
            .collect();
        eprintln!("{name}: replay attn_out inexact cells {inexact:?}");
        for &(t, l) in &inexact {
            assert!(
                explained.contains(&(t, l)),
                "{name}: attn_out at (token, layer) {:?} is not bit-exact and the official \
                 code does not disagree with itself there",
                (t, l)
            );
            // ... and the reference gives the official code's other answer, bit for bit.
            let o = (t * l_n + l) * d;
            assert!(
                goldens
                    .iter()
                    .any(|(_, other)| other.f32("attn_out").unwrap().1[o..o + d] == got[o..o + d]),
                "{name}: at {:?} the reference matches neither official answer",
                (t, l)
            );
        }
        if prefill < 37 {
            assert!(inexact.is_empty(), "{name}: {inexact:?}");
        }
    }
}
