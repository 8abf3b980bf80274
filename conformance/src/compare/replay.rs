//! Teacher-forced comparison (compare.py `--replay`): the engine recomputed every block from
//! the golden's own `block_input` / `pre_mix`, so nothing cascades. Every (token, layer) cell
//! of `block_input`, `attn_out`, `moe_out` and `residual` is judged against the profile's
//! replay thresholds; a flipped decision is excused only when its golden margin is at most the
//! fixed `replay.fragile_floor` (no drift factor; exact ties only in profiles that compare
//! decisions strictly), and then only the cells it feeds directly are skipped: an expert flip
//! skips that cell's `moe_out` and `residual`, an index-side flip at layer l skips the token's
//! cells from l up to the next index source. Logits (the engine's head on the golden final
//! stream): every step.

use super::decisions::{self, Decision};
use super::grid::{CellGrid, Stream};
use super::logits::compare_logits;
use super::{compare_engram, CompareReport, ExcuseRule, MetricStatus, SubOp};
use crate::gates::{Gates, LogitGates};
use crate::trace::TraceFile;

pub fn compare_replay(golden: &TraceFile, engine: &TraceFile, gates: &Gates) -> CompareReport {
    let rg = &gates.replay;
    let mut r = CompareReport {
        residual_threshold: rg.residual_rel_l2,
        ..Default::default()
    };
    let Some((t_n, l_n)) = golden
        .get("residual")
        .filter(|g| g.shape.len() >= 2)
        .map(|g| (g.shape[0], g.shape[1]))
    else {
        r.add(
            "residual",
            MetricStatus::Fail,
            "the golden has no [tokens, layers, ...] `residual`: not a replay golden".into(),
            None,
            None,
        );
        return r;
    };
    let rule = ExcuseRule::of(gates);
    let limit = rule.limit(rg.fragile_floor);
    compare_engram(&mut r, golden, engine);

    // ------------------------------------------------------------ decisions, per cell
    let (mut tracks, _) = decisions::tracks(golden, engine, t_n, l_n, &mut r);
    let mut sources: Vec<usize> = golden
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix("topk.L").and_then(|x| x.parse().ok()))
        .collect();
    sources.sort_unstable();
    let next_source = |l: usize| sources.iter().copied().find(|&x| x > l).unwrap_or(l_n);
    // skip_all: an index-side flip feeds every sub-op of its layers; skip_moe: an expert flip
    // feeds that cell's moe_out and residual.
    let mut skip_all = vec![false; t_n * l_n];
    let mut skip_moe = vec![false; t_n * l_n];
    for t in 0..t_n {
        for l in 0..l_n {
            for k in tracks.iter_mut().filter(|k| k.decision.made_at(l)) {
                if skip_all[t * l_n + l] {
                    break;
                }
                let Some(m) = k.check(t, l) else { continue };
                if !k.flip(
                    &mut r,
                    t,
                    l,
                    m,
                    limit,
                    rule,
                    "above the replay fragile floor",
                ) {
                    continue;
                }
                if k.decision == Decision::Experts {
                    skip_moe[t * l_n + l] = true;
                } else {
                    for x in l..next_source(l) {
                        skip_all[t * l_n + x] = true;
                    }
                }
            }
        }
    }
    decisions::summarise(&tracks, &mut r);
    super::flips_metric(
        &mut r,
        rule,
        None,
        "the cells they feed directly are skipped",
    );

    // -------------------------------------------------- per-cell streams, in block order
    for (name, subop, threshold) in [
        ("block_input", SubOp::BlockInput, rg.engram_rel_l2),
        ("attn_out", SubOp::AttnOut, rg.attn_rel_l2),
        ("moe_out", SubOp::MoeOut, rg.moe_rel_l2),
        ("residual", SubOp::BlockOutput, rg.residual_rel_l2),
    ] {
        let stream = match Stream::load(&mut r, golden, engine, name, t_n, l_n) {
            Err(()) => continue,
            Ok(Some(s)) => s,
            Ok(None) => {
                let why = if golden.get(name).is_none() {
                    "absent from the golden"
                } else if subop == SubOp::BlockInput {
                    "absent from the engine trace (the Engram step is not checked)"
                } else {
                    "absent from the engine trace"
                };
                r.add(name, MetricStatus::NotChecked, why.into(), None, None);
                continue;
            }
        };
        let mut grid = CellGrid::new(t_n, l_n);
        for t in 0..t_n {
            for l in 0..l_n {
                let i = t * l_n + l;
                let skipped = match subop {
                    SubOp::BlockInput => false,
                    SubOp::AttnOut => skip_all[i],
                    _ => skip_all[i] || skip_moe[i],
                };
                if !skipped {
                    grid.set(t, l, Some(stream.rel(t, l)));
                }
            }
        }
        let s = grid.summarise(&mut r, name, threshold, |_, _| {
            (
                subop,
                "teacher-forced: this block's own computation differs".into(),
            )
        });
        if subop == SubOp::BlockOutput {
            r.per_layer_worst = s;
        }
    }

    // ----------------------------------------- logits on the golden final stream, every step
    let lg = LogitGates {
        rel_l2: rg.logits_rel_l2,
        max_abs: rg.logits_max_abs,
        ..gates.logits.clone()
    };
    compare_logits(&mut r, golden, engine, &lg, t_n, |_| true);
    r
}
