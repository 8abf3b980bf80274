//! Logits rows: aligned by absolute position, judged by rel L2, max |Δ| and argmax.

use super::{argmax, max_abs, rel_l2, top_k, CompareReport, Divergence, MetricStatus, SubOp};
use crate::gates::{ArgmaxRule, LogitGates};
use crate::trace::TraceFile;

/// Compare the logits rows whose position `include` admits. `tokens` is the golden's token
/// count (an engine may give one row per token).
pub fn compare_logits(
    r: &mut CompareReport,
    golden: &TraceFile,
    engine: &TraceFile,
    lg: &LogitGates,
    tokens: usize,
    include: impl Fn(usize) -> bool,
) {
    let Some(gl) = golden.get("logits") else {
        return;
    };
    let Some(el) = engine.get("logits") else {
        return r.not_checked("logits");
    };
    let positions = |t: &TraceFile| -> Option<Vec<usize>> {
        t.get("logits_positions")
            .map(|p| p.as_i64().iter().map(|&x| x as usize).collect())
    };
    let (gpos, epos) = (positions(golden), positions(engine));
    let steps = gl.shape[0];
    // (golden row, engine row) pairs. With positions on both sides, every row the engine
    // gives is matched to the golden row of the same position (an engine may print the last
    // token's logits only next to a per-token dump); at least one must match.
    let rows: Option<Vec<(usize, usize)>> = if let (Some(ep), Some(gp)) = (&epos, &gpos) {
        let pairs: Vec<(usize, usize)> = gp
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let row = ep.iter().position(|x| x == p)?;
                el.shape
                    .first()
                    .is_some_and(|&n| row < n)
                    .then_some((i, row))
            })
            .collect();
        Some(pairs).filter(|p| !p.is_empty())
    } else if el.shape.first() == Some(&steps) {
        Some((0..steps).map(|i| (i, i)).collect())
    } else {
        gpos.as_ref()
            .filter(|_| el.shape.first() == Some(&tokens))
            .map(|gp| gp.iter().copied().enumerate().collect())
    };
    let vocab = gl.row_len();
    let Some(rows) = rows.filter(|_| el.shape.len() == 2 && el.row_len() == vocab) else {
        r.add(
            "logits",
            MetricStatus::Fail,
            format!(
                "cannot align engine logits {:?} with golden {:?}",
                el.shape, gl.shape
            ),
            None,
            None,
        );
        return;
    };
    let (gv, ev) = (gl.as_f64(), el.as_f64());
    let (mut ncmp, mut worst_rl, mut worst_ma, mut am_eq) = (0, 0.0f64, 0.0f64, 0);
    let mut first_bad: Option<String> = None;
    for &(i, row) in &rows {
        let p = gpos.as_ref().map_or(i, |g| g[i]);
        if !include(p) {
            continue;
        }
        let g = &gv[i * vocab..(i + 1) * vocab];
        let e = &ev[row * vocab..(row + 1) * vocab];
        let (rl, ma) = (rel_l2(e, g), max_abs(e, g));
        let (ga, ea) = (argmax(g), argmax(e));
        let am_ok = match lg.argmax {
            ArgmaxRule::Exact => ga == ea,
            ArgmaxRule::Top5 => top_k(e, 5).contains(&ga),
        };
        ncmp += 1;
        worst_rl = worst_rl.max(rl);
        worst_ma = worst_ma.max(ma);
        am_eq += usize::from(ga == ea);
        if rl <= lg.rel_l2 && ma <= lg.max_abs && am_ok || first_bad.is_some() {
            continue;
        }
        first_bad = Some(format!("first failing step {i} (pos {p}): rel L2 {rl:.3e}, max|d| {ma:.3e}, argmax golden {ga} engine {ea}"));
        let (metric, value, threshold) = if rl > lg.rel_l2 {
            ("rel_l2", rl, lg.rel_l2)
        } else if ma > lg.max_abs {
            ("max_abs", ma, lg.max_abs)
        } else {
            ("argmax", ea as f64, ga as f64)
        };
        r.note_divergence(Divergence {
            token: p,
            layer: None,
            subop: SubOp::Logits,
            metric: metric.into(),
            value,
            threshold,
            detail: format!("step {i}; argmax golden {ga} engine {ea}"),
        });
    }
    let mut text = format!(
        "{ncmp}/{} steps compared; worst rel L2 {worst_rl:.3e} (limit {:.1e}), worst max|d| {worst_ma:.3e} (limit {:.1e}); argmax equal {am_eq}/{ncmp}",
        steps,
        lg.rel_l2,
        lg.max_abs
    );
    if let Some(b) = &first_bad {
        text += &format!("; {b}");
    }
    let status = if first_bad.is_some() {
        MetricStatus::Fail
    } else if ncmp == 0 {
        text += "; nothing compared";
        MetricStatus::Vacuous
    } else {
        MetricStatus::Pass
    };
    r.add("logits", status, text, Some(worst_rl), Some(lg.rel_l2));
}
