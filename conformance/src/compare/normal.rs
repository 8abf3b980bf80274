//! End-to-end comparison (compare.py normal mode): decisions token-major in processing
//! order; an excused flip excludes everything it can influence — that token from that layer
//! on, and every later token from that layer on (the *frontier*).

use super::decisions::{self, Decision, Margins};
use super::grid::{CellGrid, Stream};
use super::logits::compare_logits;
use super::{compare_engram, CompareReport, ExcuseRule, FlipEvent, FlipKind, SubOp};
use crate::gates::Gates;
use crate::trace::TraceFile;

/// Compare an engine trace with a golden (both already restricted to the same tokens).
pub fn compare(golden: &TraceFile, engine: &TraceFile, gates: &Gates) -> CompareReport {
    let threshold = gates.residual.rel_l2;
    let mut r = CompareReport {
        residual_threshold: threshold,
        ..Default::default()
    };
    let rule = ExcuseRule::of(gates);
    let strict = rule.strict();
    let dg = &gates.decisions;
    let (t_n, l_n) = match golden.get("residual") {
        Some(t) if t.shape.len() >= 2 => (t.shape[0], t.shape[1]),
        _ => (golden.get("logits").map_or(0, |t| t.shape[0]), 0),
    };
    compare_engram(&mut r, golden, engine);
    let (mut tracks, missing) = decisions::tracks(golden, engine, t_n, l_n, &mut r);
    let margins = Margins::of(golden, l_n);
    let residual = if golden.get("residual").is_some() && engine.get("residual").is_none() {
        r.not_checked("residual");
        None
    } else {
        Stream::load(&mut r, golden, engine, "residual", t_n, l_n)
            .ok()
            .flatten()
    };
    // The largest golden margin excused for decision `d` at layer `l`, given the drift
    // already seen upstream (compare.py `allowed`).
    let limit = |d: Decision, l: usize, grid: &CellGrid| -> f64 {
        let cap = if d.is_routing() {
            dg.fragile_cap_experts
        } else {
            dg.fragile_cap_topk
        };
        rule.limit(match residual {
            Some(_) => cap.min(dg.fragile_floor + dg.fragile_factor * grid.max_below(l)),
            None => cap,
        })
    };

    let mut grid = CellGrid::new(t_n, l_n);
    // Cells (t, l >= excl[t]) are excluded.
    let mut excl = vec![l_n; t_n];
    let mut frontier = l_n;
    for (t, excl_t) in excl.iter_mut().enumerate() {
        *excl_t = frontier;
        for l in 0..l_n {
            if l >= frontier {
                break;
            }
            // A flip excludes what it feeds when it is excused, and in profiles with the
            // fragile rule always (compare.py); a ROBUST flip in a profile without it leaves
            // everything else compared, so the report shows all that differs.
            let mut excludes = false;
            for k in tracks.iter_mut().filter(|k| k.decision.made_at(l)) {
                if let Some(m) = k.check(t, l) {
                    let lim = limit(k.decision, l, &grid);
                    let excused = k.flip(&mut r, t, l, m, lim, "above the excuse limit");
                    excludes = excused || rule.fragile;
                    break;
                }
            }
            if excludes {
                frontier = frontier.min(l);
                *excl_t = (*excl_t).min(l);
                break;
            }
            let Some(res) = &residual else { continue };
            let v = res.rel(t, l);
            grid.set(t, l, Some(v));
            if v <= threshold || strict {
                continue;
            }
            // No decision tensors to prove it: excused only if the golden decision here
            // was fragile.
            let missing_here = missing.iter().any(|d| d.made_at(l));
            let fragile: Vec<(f64, f64)> = [Decision::Experts, Decision::TopK { layer: l }]
                .into_iter()
                .filter(|d| margins.has(*d))
                .map(|d| (margins.get(d, t, l), limit(d, l, &grid)))
                .collect();
            if missing_here && fragile.iter().any(|(m, lim)| m <= lim) {
                let margin = fragile.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
                r.flips.push(FlipEvent {
                    kind: FlipKind::AssumedFromResidual,
                    token: t,
                    layer: l,
                    margin,
                    excuse_limit: limit(Decision::Experts, l, &grid),
                    excused: true,
                    detail: format!("rel L2 {v:.3e} at a fragile golden decision; the trace has no decisions to prove it"),
                });
                grid.set(t, l, None);
                frontier = frontier.min(l);
                *excl_t = (*excl_t).min(l);
                break;
            }
        }
        *excl_t = (*excl_t).min(frontier);
    }
    decisions::summarise(&tracks, &mut r);
    super::flips_metric(
        &mut r,
        rule,
        dg.max_fragile,
        "later tokens compared only below the first flipped layer",
    );
    if residual.is_some() {
        let s = grid.summarise(&mut r, "residual", threshold, |t, l| {
            localise_subop(golden, engine, t, l, threshold)
        });
        r.per_layer_worst = s;
    }
    compare_logits(&mut r, golden, engine, &gates.logits, t_n, |p| {
        strict || l_n == 0 || excl.get(p).is_none_or(|&x| x >= l_n)
    });
    r
}

/// At a diverging (token, layer) cell, name the first sub-op in block order whose output
/// already differs (when both traces carry sub-op tensors).
fn localise_subop(
    golden: &TraceFile,
    engine: &TraceFile,
    t: usize,
    l: usize,
    threshold: f64,
) -> (SubOp, String) {
    let mut seen = Vec::new();
    for (name, op) in [
        ("block_input", SubOp::BlockInput),
        ("attn_out", SubOp::AttnOut),
        ("mid", SubOp::Mid),
        ("moe_out", SubOp::MoeOut),
    ] {
        let (Some(g), Some(e)) = (golden.get(name), engine.get(name)) else {
            continue;
        };
        if g.shape != e.shape || g.shape.len() < 2 || t >= g.shape[0] || l >= g.shape[1] {
            continue;
        }
        let n = g.len() / (g.shape[0] * g.shape[1]).max(1);
        let o = (t * g.shape[1] + l) * n;
        let v = super::rel_l2(&e.as_f64()[o..o + n], &g.as_f64()[o..o + n]);
        seen.push(format!("{name} {v:.2e}"));
        if v > threshold {
            return (op, format!("sub-op rel L2: {}", seen.join(", ")));
        }
    }
    let detail = if seen.is_empty() {
        "block output; the traces carry no sub-op tensors (attn_out, moe_out) to localise further"
            .to_string()
    } else {
        format!(
            "sub-ops within limit ({}); the mix/expand differs",
            seen.join(", ")
        )
    };
    (SubOp::BlockOutput, detail)
}
