//! Trace comparison (CONTRACT.md §5), following ../shared/tools/compare.py (normal mode):
//! Engram hash ids exact; discrete decisions (routed expert sets, indexer top-k sets) exact,
//! token-major in processing order, except *fragile flips* in profiles that excuse them — a
//! flip is excused when the golden's selection margin is at most
//! `min(cap, floor + factor * drift upstream of it)`, counted, and everything it can influence
//! (that token from that layer on, later tokens from that layer on) is excluded; residual rel
//! L2 per (token, layer) cell; logits rel L2, max abs and argmax per compared step. Unlike
//! compare.py a non-finite engine value is always a failure.

use serde::{Deserialize, Serialize};

use crate::gates::{ArgmaxRule, Gates};
use crate::trace::TraceFile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricStatus {
    Pass,
    Fail,
    Info,
    /// The engine trace lacks this tensor.
    NotChecked,
    /// Present but nothing was left to compare after exclusions.
    Vacuous,
}

#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    pub name: String,
    pub status: MetricStatus,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
}

/// Where the engine first left the golden, in forward order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub token: usize,
    pub layer: Option<usize>,
    /// `engram_hash`, `topk.L{l}`, `experts`, `block_input`, `attn_out`, `mid`, `moe_out`,
    /// `residual` (block output) or `logits`.
    pub subop: String,
    pub metric: String,
    pub value: f64,
    pub threshold: f64,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlipEvent {
    pub kind: String,
    pub token: usize,
    pub layer: usize,
    pub margin: f64,
    pub excuse_limit: f64,
    pub excused: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct CompareReport {
    pub metrics: Vec<Metric>,
    pub first_divergence: Option<Divergence>,
    /// Worst compared residual rel L2 per layer over all tokens (None: nothing compared).
    pub per_layer_worst: Vec<Option<f64>>,
    pub flips: Vec<FlipEvent>,
    pub residual_threshold: f64,
}

impl CompareReport {
    pub fn failed(&self) -> bool {
        self.metrics.iter().any(|m| m.status == MetricStatus::Fail)
    }
    pub fn excused_flips(&self) -> usize {
        self.flips.iter().filter(|f| f.excused).count()
    }
    fn add(
        &mut self,
        name: &str,
        status: MetricStatus,
        text: String,
        worst: Option<f64>,
        limit: Option<f64>,
    ) {
        self.metrics.push(Metric {
            name: name.into(),
            status,
            text,
            worst,
            limit,
        });
    }
    /// One line per failing metric, for a failure reason.
    pub fn failure_summary(&self) -> String {
        let mut parts: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| m.status == MetricStatus::Fail)
            .map(|m| format!("{}: {}", m.name, m.text))
            .collect();
        if let Some(d) = &self.first_divergence {
            parts.insert(
                0,
                format!(
                    "first divergence: token {}{} sub-op `{}`: {} {:.3e} > {:.3e}{}",
                    d.token,
                    d.layer.map(|l| format!(" layer {l}")).unwrap_or_default(),
                    d.subop,
                    d.metric,
                    d.value,
                    d.threshold,
                    if d.detail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", d.detail)
                    }
                ),
            );
        }
        parts.join("\n")
    }
}

/// rel L2 = ||e - g|| / ||g|| (||e - g|| when g = 0); non-finite engine values give +inf.
pub fn rel_l2(e: &[f64], g: &[f64]) -> f64 {
    if e.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = e
        .iter()
        .zip(g)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let n: f64 = g.iter().map(|b| b * b).sum::<f64>().sqrt();
    if n > 0.0 {
        d / n
    } else {
        d
    }
}

pub fn max_abs(e: &[f64], g: &[f64]) -> f64 {
    e.iter()
        .zip(g)
        .map(|(a, b)| {
            if a.is_finite() {
                (a - b).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Index of the largest value, ties -> lower index.
pub fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Indices of the `k` largest values (ties -> lower index).
pub fn top_k(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        v[b].partial_cmp(&v[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

fn id_set(row: &[i64]) -> std::collections::BTreeSet<i64> {
    row.iter().copied().filter(|&x| x >= 0).collect()
}

/// Compare an engine trace with a golden (both already restricted to the same tokens).
pub fn compare(golden: &TraceFile, engine: &TraceFile, gates: &Gates) -> CompareReport {
    let mut r = CompareReport {
        residual_threshold: gates.residual.rel_l2,
        ..Default::default()
    };
    let strict = !gates.decisions.excuse_fragile_flips;
    let dg = &gates.decisions;
    let gres = golden.get("residual");
    let (t_n, l_n) = match gres {
        Some(t) if t.shape.len() >= 2 => (t.shape[0], t.shape[1]),
        _ => {
            let steps = golden.get("logits").map(|t| t.shape[0]).unwrap_or(0);
            (steps, 0)
        }
    };

    compare_engram(&mut r, golden, engine);

    // ---------------------------------------------- discrete decisions + residual, token-major
    let topk_layers = index_source_layers(golden);
    let ge = golden.get("experts");
    let ee = engine.get("experts").filter(|e| {
        ge.is_some_and(|g| {
            e.shape.len() == 3 && e.shape[0] == t_n && e.shape[1] == l_n && g.shape.len() == 3
        })
    });
    if let (Some(e), Some(g)) = (engine.get("experts"), ge) {
        if ee.is_none() {
            r.add(
                "experts",
                MetricStatus::Fail,
                format!("shape {:?} != golden {:?}", e.shape, g.shape),
                None,
                None,
            );
        }
    }
    let mut have_topk = std::collections::BTreeMap::new();
    for &l in &topk_layers {
        let name = format!("topk.L{l}");
        match engine.get(&name) {
            Some(e) if e.shape.first() == Some(&t_n) => {
                have_topk.insert(l, e.clone());
            }
            Some(e) => r.add(
                &name,
                MetricStatus::Fail,
                format!("{:?} rows != {} tokens", e.shape.first(), t_n),
                None,
                None,
            ),
            None => {}
        }
    }
    let margin_exp = golden.get("margin.experts").map(|m| m.as_f64());
    let margin_topk: std::collections::BTreeMap<usize, Vec<f64>> = topk_layers
        .iter()
        .filter_map(|&l| {
            golden
                .get(&format!("margin.topk.L{l}"))
                .map(|m| (l, m.as_f64()))
        })
        .collect();
    let m_exp = |t: usize, l: usize| {
        margin_exp
            .as_ref()
            .map(|m| m[t * l_n + l])
            .unwrap_or(f64::INFINITY)
    };
    let m_topk = |t: usize, l: usize| margin_topk.get(&l).map(|m| m[t]).unwrap_or(f64::INFINITY);

    let eres = engine.get("residual");
    let res_ok = match (gres, eres) {
        (Some(g), Some(e)) => {
            let ok = e.shape.len() >= 2
                && e.shape[0] == g.shape[0]
                && e.shape[1] == g.shape[1]
                && e.len() == g.len();
            if !ok {
                r.add(
                    "residual",
                    MetricStatus::Fail,
                    format!("shape {:?} != golden {:?}", e.shape, g.shape),
                    None,
                    None,
                );
            }
            ok
        }
        _ => false,
    };
    let (gv, ev) = if res_ok {
        (gres.unwrap().as_f64(), eres.unwrap().as_f64())
    } else {
        (vec![], vec![])
    };
    let cell_len = if res_ok {
        gres.unwrap().len() / (t_n * l_n).max(1)
    } else {
        0
    };
    let mut cell = vec![f64::NAN; t_n * l_n];
    let mut colmax = vec![0.0f64; l_n];
    let mut excl = vec![l_n; t_n];
    let mut frontier = l_n;
    let mut cnt: std::collections::BTreeMap<String, (usize, usize)> =
        std::collections::BTreeMap::new();
    let mut robust: std::collections::BTreeMap<String, Vec<(usize, usize, f64, String)>> =
        Default::default();
    let (gexp, eexp, k_exp) = match (ge, ee) {
        (Some(g), Some(e)) => (g.as_i64(), e.as_i64(), (g.shape[2], e.shape[2])),
        _ => (Default::default(), Default::default(), (0, 0)),
    };
    let allowed = |kind: &str, l: usize, colmax: &[f64]| -> f64 {
        if strict {
            return -1.0;
        }
        let cap = if kind == "experts" {
            dg.fragile_cap_experts
        } else {
            dg.fragile_cap_topk
        };
        if !res_ok {
            return cap;
        }
        let up = colmax[..l].iter().copied().fold(0.0, f64::max);
        cap.min(dg.fragile_floor + dg.fragile_factor * up)
    };
    for t in 0..t_n {
        excl[t] = frontier;
        for l in 0..l_n {
            if l >= frontier {
                break;
            }
            let mut tripped = false;
            if let Some(e) = have_topk.get(&l) {
                let name = format!("topk.L{l}");
                let g = golden.get(&name).unwrap();
                let (gs, es) = (
                    id_set(&g.as_i64()[t * g.row_len()..(t + 1) * g.row_len()]),
                    id_set(&e.as_i64()[t * e.row_len()..(t + 1) * e.row_len()]),
                );
                let c = cnt.entry(name.clone()).or_default();
                c.0 += 1;
                if gs == es {
                    c.1 += 1;
                } else {
                    let detail = format!(
                        "golden only {:?}, engine only {:?}",
                        gs.difference(&es).collect::<Vec<_>>(),
                        es.difference(&gs).collect::<Vec<_>>()
                    );
                    let lim = allowed("topk", l, &colmax);
                    flip(
                        &mut r,
                        &mut robust,
                        &name,
                        t,
                        l,
                        m_topk(t, l),
                        lim,
                        detail,
                        strict,
                        &mut frontier,
                    );
                    tripped = true;
                }
            }
            if !tripped && ee.is_some() {
                let c = cnt.entry("experts".into()).or_default();
                c.0 += 1;
                let gs = id_set(&gexp[(t * l_n + l) * k_exp.0..(t * l_n + l + 1) * k_exp.0]);
                let es = id_set(&eexp[(t * l_n + l) * k_exp.1..(t * l_n + l + 1) * k_exp.1]);
                if gs == es {
                    c.1 += 1;
                } else {
                    let detail = format!("golden {:?}, engine {:?}", gs, es);
                    let lim = allowed("experts", l, &colmax);
                    flip(
                        &mut r,
                        &mut robust,
                        "experts",
                        t,
                        l,
                        m_exp(t, l),
                        lim,
                        detail,
                        strict,
                        &mut frontier,
                    );
                    tripped = true;
                }
            }
            if tripped && !strict {
                excl[t] = excl[t].min(l);
                break;
            }
            if res_ok {
                let o = (t * l_n + l) * cell_len;
                let v = rel_l2(&ev[o..o + cell_len], &gv[o..o + cell_len]);
                cell[t * l_n + l] = v;
                colmax[l] = colmax[l].max(v);
                if v > gates.residual.rel_l2 && !strict {
                    let missing_dec =
                        ee.is_none() || (topk_layers.contains(&l) && !have_topk.contains_key(&l));
                    let fragile_here = m_exp(t, l) <= allowed("experts", l, &colmax)
                        || (margin_topk.contains_key(&l)
                            && m_topk(t, l) <= allowed("topk", l, &colmax));
                    if missing_dec && fragile_here {
                        let m = m_exp(t, l).min(m_topk(t, l));
                        r.flips.push(FlipEvent {
                            kind: "residual(assumed)".into(),
                            token: t,
                            layer: l,
                            margin: m,
                            excuse_limit: allowed("experts", l, &colmax),
                            excused: true,
                            detail: format!("rel L2 {v:.3e} at a fragile golden decision; the trace has no decisions to prove it"),
                        });
                        frontier = frontier.min(l);
                        excl[t] = excl[t].min(l);
                        cell[t * l_n + l] = f64::NAN;
                        break;
                    }
                }
            }
        }
        excl[t] = excl[t].min(frontier);
    }
    for (name, (n, same)) in &cnt {
        let rb = robust.get(name).map(|v| v.as_slice()).unwrap_or(&[]);
        let excused = r
            .flips
            .iter()
            .filter(|f| &f.kind == name && f.excused)
            .count();
        let mut text = format!("{same}/{n} compared identical; fragile flips excused {excused}");
        if let Some((t, l, m, det)) = rb.first() {
            text += &format!("; {} ROBUST mismatch(es), first at token {t} layer {l} (golden margin {m:.3}) {det}", rb.len());
        }
        r.add(
            name,
            if rb.is_empty() {
                MetricStatus::Pass
            } else {
                MetricStatus::Fail
            },
            text,
            None,
            None,
        );
    }
    for &l in &topk_layers {
        let name = format!("topk.L{l}");
        if engine.get(&name).is_none() {
            r.add(
                &name,
                MetricStatus::NotChecked,
                "absent from the engine trace".into(),
                None,
                None,
            );
        }
    }
    if ge.is_some() && engine.get("experts").is_none() {
        r.add(
            "experts",
            MetricStatus::NotChecked,
            "absent from the engine trace".into(),
            None,
            None,
        );
    }
    let n_excused = r.excused_flips();
    match dg.max_fragile {
        Some(max) if n_excused > max => r.add(
            "fragile_flips",
            MetricStatus::Fail,
            format!("{n_excused} excused flips > allowed {max}"),
            None,
            None,
        ),
        _ => r.add(
            "fragile_flips",
            MetricStatus::Info,
            if strict {
                "none excused (profile compares decisions strictly)".into()
            } else {
                format!(
                    "{n_excused} excused; later tokens compared only below the first flipped layer"
                )
            },
            Some(n_excused as f64),
            None,
        ),
    }

    // ------------------------------------------------------------------------------ residual
    if res_ok {
        let thr = gates.residual.rel_l2;
        let compared = cell.iter().filter(|v| !v.is_nan()).count();
        let worst = cell
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(0.0, f64::max);
        r.per_layer_worst = (0..l_n)
            .map(|l| {
                let vals: Vec<f64> = (0..t_n)
                    .map(|t| cell[t * l_n + l])
                    .filter(|v| !v.is_nan())
                    .collect();
                if vals.is_empty() {
                    None
                } else {
                    Some(vals.iter().copied().fold(0.0, f64::max))
                }
            })
            .collect();
        let over: Vec<(usize, usize)> = (0..t_n)
            .flat_map(|t| (0..l_n).map(move |l| (t, l)))
            .filter(|&(t, l)| cell[t * l_n + l] > thr)
            .collect();
        let mut text = format!(
            "{compared}/{} cells compared, worst rel L2 {worst:.3e} (limit {thr:.1e})",
            t_n * l_n
        );
        if let Some(&(t, l)) = over.first() {
            let lowest = over.iter().map(|x| x.1).min().unwrap_or(l);
            text += &format!("; {} cells over; first diverging cell token {t} layer {l}; lowest diverging layer {lowest}", over.len());
            let subop = localise_subop(golden, engine, t, l, thr);
            note_divergence(
                &mut r,
                Divergence {
                    token: t,
                    layer: Some(l),
                    subop: subop.0,
                    metric: "rel_l2".into(),
                    value: cell[t * l_n + l],
                    threshold: thr,
                    detail: subop.1,
                },
            );
        }
        let status = if !over.is_empty() {
            MetricStatus::Fail
        } else if compared == 0 {
            MetricStatus::Vacuous
        } else {
            MetricStatus::Pass
        };
        r.add("residual", status, text, Some(worst), Some(thr));
    } else if gres.is_some() && eres.is_none() {
        r.add(
            "residual",
            MetricStatus::NotChecked,
            "absent from the engine trace".into(),
            None,
            None,
        );
    }

    // ------------------------------------------------------------------------------ logits
    compare_logits(&mut r, golden, engine, gates, &excl, l_n, strict);
    r
}

/// Compare a teacher-forced replay trace with its golden (compare.py `--replay`): the engine
/// recomputed every block from the golden's own `block_input` / `pre_mix`, so nothing cascades.
/// Engram hash ids exact; every (token, layer) cell of `attn_out`, `moe_out`, `residual` and
/// (when dumped) `block_input` compared against the profile's replay thresholds; a flipped
/// decision is excused only when its golden margin is at most the fixed `replay.fragile_floor`
/// (no drift factor; never in profiles that compare decisions strictly), and then only the
/// cells it feeds directly are skipped: an expert flip skips that cell's `moe_out` and
/// `residual`, a top-k flip at index source l skips the token's cells from l up to the next
/// index source. Logits (the engine's head on the golden final stream): every step.
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
    let floor = if gates.decisions.excuse_fragile_flips {
        rg.fragile_floor
    } else {
        -1.0
    };
    compare_engram(&mut r, golden, engine);

    // ------------------------------------------------------------ discrete decisions, per cell
    let topk_layers = index_source_layers(golden);
    let next_source = |l: usize| {
        topk_layers
            .iter()
            .copied()
            .filter(|&x| x > l)
            .min()
            .unwrap_or(l_n)
    };
    // skip_all: a top-k flip feeds every sub-op of its layers; skip_moe: an expert flip feeds
    // that cell's moe_out and residual.
    let mut skip_all = vec![false; t_n * l_n];
    let mut skip_moe = vec![false; t_n * l_n];
    let rows = |name: &str, want: &[usize]| -> Option<std::borrow::Cow<'_, [i64]>> {
        let (g, e) = (golden.get(name)?, engine.get(name)?);
        if e.shape.len() < want.len()
            || e.shape[..want.len()] != *want
            || g.shape.len() != e.shape.len()
        {
            return None;
        }
        Some(e.as_i64())
    };
    let margins = |name: &str| golden.get(name).map(|m| m.as_f64());
    let mut decision_tensors: Vec<(String, usize, Option<Vec<f64>>)> = topk_layers
        .iter()
        .map(|&l| {
            (
                format!("topk.L{l}"),
                l,
                margins(&format!("margin.topk.L{l}")),
            )
        })
        .collect();
    decision_tensors.push(("experts".into(), usize::MAX, margins("margin.experts")));
    let mut present = std::collections::BTreeMap::new();
    for (name, l, _) in &decision_tensors {
        let want: Vec<usize> = if *l == usize::MAX {
            vec![t_n, l_n]
        } else {
            vec![t_n]
        };
        match (golden.get(name), engine.get(name)) {
            (None, _) => {}
            (Some(_), None) => r.add(
                name,
                MetricStatus::NotChecked,
                "absent from the engine trace".into(),
                None,
                None,
            ),
            (Some(g), Some(e)) => match rows(name, &want) {
                Some(ev) => {
                    present.insert(
                        name.clone(),
                        (
                            g.as_i64().into_owned(),
                            ev.into_owned(),
                            g.row_len(),
                            e.row_len(),
                        ),
                    );
                }
                None => r.add(
                    name,
                    MetricStatus::Fail,
                    format!("shape {:?} != golden {:?}", e.shape, g.shape),
                    None,
                    None,
                ),
            },
        }
    }
    let mut cnt: std::collections::BTreeMap<String, (usize, usize, Vec<String>)> =
        Default::default();
    let exp_width = |w: usize| w / l_n.max(1);
    for t in 0..t_n {
        for l in 0..l_n {
            for (name, src, margin) in &decision_tensors {
                let is_exp = *src == usize::MAX;
                if (!is_exp && *src != l) || (is_exp && skip_all[t * l_n + l]) {
                    continue;
                }
                let Some((gv, ev, gw, ew)) = present.get(name) else {
                    continue;
                };
                let (gs, es) = if is_exp {
                    let (gk, ek) = (exp_width(*gw), exp_width(*ew));
                    let c = t * l_n + l;
                    (
                        id_set(&gv[c * gk..(c + 1) * gk]),
                        id_set(&ev[c * ek..(c + 1) * ek]),
                    )
                } else {
                    (
                        id_set(&gv[t * gw..(t + 1) * gw]),
                        id_set(&ev[t * ew..(t + 1) * ew]),
                    )
                };
                let c = cnt.entry(name.clone()).or_default();
                c.0 += 1;
                if gs == es {
                    c.1 += 1;
                    continue;
                }
                let m = margin
                    .as_ref()
                    .map(|m| if is_exp { m[t * l_n + l] } else { m[t] })
                    .unwrap_or(f64::INFINITY);
                let excused = m <= floor;
                let detail = format!(
                    "golden only {:?}, engine only {:?}",
                    gs.difference(&es).collect::<Vec<_>>(),
                    es.difference(&gs).collect::<Vec<_>>()
                );
                r.flips.push(FlipEvent {
                    kind: name.clone(),
                    token: t,
                    layer: l,
                    margin: m,
                    excuse_limit: floor,
                    excused,
                    detail: detail.clone(),
                });
                if excused {
                    if is_exp {
                        skip_moe[t * l_n + l] = true;
                    } else {
                        for x in l..next_source(l) {
                            skip_all[t * l_n + x] = true;
                        }
                    }
                } else {
                    c.2.push(format!(
                        "token {t} layer {l} (golden margin {m:.3}) {detail}"
                    ));
                    note_divergence(
                        &mut r,
                        Divergence {
                            token: t,
                            layer: Some(l),
                            subop: name.clone(),
                            metric: "decision set".into(),
                            value: m,
                            threshold: floor.max(0.0),
                            detail: format!(
                                "{detail}; golden margin {m:.3} above the replay fragile floor"
                            ),
                        },
                    );
                }
            }
        }
    }
    for (name, (n, same, robust)) in &cnt {
        let excused = r
            .flips
            .iter()
            .filter(|f| &f.kind == name && f.excused)
            .count();
        let mut text = format!("{same}/{n} identical; excused flips {excused}");
        if let Some(first) = robust.first() {
            text += &format!("; {} ROBUST mismatch(es), first at {first}", robust.len());
        }
        let status = if robust.is_empty() {
            MetricStatus::Pass
        } else {
            MetricStatus::Fail
        };
        r.add(name, status, text, None, None);
    }
    let n_excused = r.excused_flips();
    r.add(
        "fragile_flips",
        MetricStatus::Info,
        if floor < 0.0 {
            "none excused (profile compares decisions strictly)".into()
        } else {
            format!("{n_excused} excused (golden margin <= {floor:e}); the cells they feed directly are skipped")
        },
        Some(n_excused as f64),
        None,
    );

    // -------------------------------------------------- per-cell streams, in forward order
    for (name, thr) in [
        ("block_input", rg.engram_rel_l2),
        ("attn_out", rg.attn_rel_l2),
        ("moe_out", rg.moe_rel_l2),
        ("residual", rg.residual_rel_l2),
    ] {
        let (Some(g), Some(e)) = (golden.get(name), engine.get(name)) else {
            let why = if golden.get(name).is_none() {
                "absent from the golden"
            } else if name == "block_input" {
                "absent from the engine trace (the Engram step is not checked)"
            } else {
                "absent from the engine trace"
            };
            r.add(name, MetricStatus::NotChecked, why.into(), None, None);
            continue;
        };
        if e.shape != g.shape || g.shape.len() < 2 || g.shape[0] != t_n || g.shape[1] != l_n {
            r.add(
                name,
                MetricStatus::Fail,
                format!("shape {:?} != golden {:?}", e.shape, g.shape),
                None,
                None,
            );
            continue;
        }
        let (gv, ev) = (g.as_f64(), e.as_f64());
        let w = g.len() / (t_n * l_n).max(1);
        let mut per_layer: Vec<Option<f64>> = vec![None; l_n];
        let (mut compared, mut worst, mut over) = (0usize, 0.0f64, Vec::new());
        for t in 0..t_n {
            for (l, layer_worst) in per_layer.iter_mut().enumerate() {
                let i = t * l_n + l;
                let skipped = match name {
                    "block_input" => false,
                    "attn_out" => skip_all[i],
                    _ => skip_all[i] || skip_moe[i],
                };
                if skipped {
                    continue;
                }
                let v = rel_l2(&ev[i * w..(i + 1) * w], &gv[i * w..(i + 1) * w]);
                compared += 1;
                worst = worst.max(v);
                *layer_worst = Some(layer_worst.unwrap_or(0.0).max(v));
                if v > thr {
                    over.push((t, l, v));
                }
            }
        }
        let mut text = format!(
            "{compared}/{} cells compared, worst rel L2 {worst:.3e} (limit {thr:.1e})",
            t_n * l_n
        );
        if let Some(&(t, l, v)) = over.first() {
            let mut layers: Vec<usize> = over.iter().map(|x| x.1).collect();
            layers.sort_unstable();
            layers.dedup();
            text += &format!(
                "; {} cells over; first token {t} layer {l}; layers over {layers:?}",
                over.len()
            );
            note_divergence(
                &mut r,
                Divergence {
                    token: t,
                    layer: Some(l),
                    subop: name.into(),
                    metric: "rel_l2".into(),
                    value: v,
                    threshold: thr,
                    detail: "teacher-forced: this block's own computation differs".into(),
                },
            );
        }
        if name == "residual" {
            r.per_layer_worst = per_layer;
        }
        let status = if !over.is_empty() {
            MetricStatus::Fail
        } else if compared == 0 {
            MetricStatus::Vacuous
        } else {
            MetricStatus::Pass
        };
        r.add(name, status, text, Some(worst), Some(thr));
    }

    // ----------------------------------------- logits on the golden final stream, every step
    let mut lg = gates.clone();
    lg.logits.rel_l2 = rg.logits_rel_l2;
    lg.logits.max_abs = rg.logits_max_abs;
    compare_logits(&mut r, golden, engine, &lg, &vec![l_n; t_n], l_n, false);
    r
}

/// Engram hash ids: exact everywhere, never excused.
fn compare_engram(r: &mut CompareReport, golden: &TraceFile, engine: &TraceFile) {
    if let Some(g) = golden.get("engram_hash") {
        match engine.get("engram_hash") {
            None => r.add(
                "engram_hash",
                MetricStatus::NotChecked,
                "absent from the engine trace".into(),
                None,
                None,
            ),
            Some(e) if e.shape != g.shape => r.add(
                "engram_hash",
                MetricStatus::Fail,
                format!("shape {:?} != golden {:?}", e.shape, g.shape),
                None,
                None,
            ),
            Some(e) => {
                let (gv, ev, n) = (g.as_i64(), e.as_i64(), g.row_len());
                let bad: Vec<usize> = (0..g.shape[0])
                    .filter(|&t| gv[t * n..(t + 1) * n] != ev[t * n..(t + 1) * n])
                    .collect();
                if let Some(&t) = bad.first() {
                    let col = (0..n)
                        .find(|&c| gv[t * n + c] != ev[t * n + c])
                        .unwrap_or(0);
                    note_divergence(
                        r,
                        Divergence {
                            token: t,
                            layer: None,
                            subop: "engram_hash".into(),
                            metric: "ids differing".into(),
                            value: 1.0,
                            threshold: 0.0,
                            detail: format!(
                                "flat column {col}: golden {} engine {}",
                                gv[t * n + col],
                                ev[t * n + col]
                            ),
                        },
                    );
                }
                r.add(
                    "engram_hash",
                    if bad.is_empty() {
                        MetricStatus::Pass
                    } else {
                        MetricStatus::Fail
                    },
                    format!(
                        "{}/{} tokens identical{}",
                        g.shape[0] - bad.len(),
                        g.shape[0],
                        bad.first()
                            .map(|t| format!("; first bad token {t}"))
                            .unwrap_or_default()
                    ),
                    None,
                    Some(0.0),
                );
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn flip(
    r: &mut CompareReport,
    robust: &mut std::collections::BTreeMap<String, Vec<(usize, usize, f64, String)>>,
    kind: &str,
    t: usize,
    l: usize,
    margin: f64,
    limit: f64,
    detail: String,
    strict: bool,
    frontier: &mut usize,
) {
    let excused = margin <= limit;
    r.flips.push(FlipEvent {
        kind: kind.into(),
        token: t,
        layer: l,
        margin,
        excuse_limit: limit,
        excused,
        detail: detail.clone(),
    });
    if !excused {
        note_divergence(
            r,
            Divergence {
                token: t,
                layer: Some(l),
                subop: kind.into(),
                metric: "decision set".into(),
                value: margin,
                threshold: limit.max(0.0),
                detail: format!("{detail}; golden margin {margin:.3} above the excuse limit"),
            },
        );
        robust
            .entry(kind.into())
            .or_default()
            .push((t, l, margin, detail));
    }
    if !strict {
        *frontier = (*frontier).min(l);
    }
}

/// Keep the earliest divergence in forward order (token, then layer).
fn note_divergence(r: &mut CompareReport, d: Divergence) {
    let key = |d: &Divergence| (d.token, d.layer.unwrap_or(0));
    if r.first_divergence
        .as_ref()
        .is_none_or(|old| key(&d) < key(old))
    {
        r.first_divergence = Some(d);
    }
}

/// At a diverging (token, layer) cell, name the first sub-op in forward order whose output
/// already differs (when both traces carry sub-op tensors).
fn localise_subop(
    golden: &TraceFile,
    engine: &TraceFile,
    t: usize,
    l: usize,
    thr: f64,
) -> (String, String) {
    let mut seen = Vec::new();
    for name in ["block_input", "attn_out", "mid", "moe_out"] {
        let (Some(g), Some(e)) = (golden.get(name), engine.get(name)) else {
            continue;
        };
        if g.shape != e.shape || g.shape.len() < 2 {
            continue;
        }
        let n = g.len() / (g.shape[0] * g.shape[1]);
        let o = (t * g.shape[1] + l) * n;
        let v = rel_l2(&e.as_f64()[o..o + n], &g.as_f64()[o..o + n]);
        seen.push(format!("{name} {v:.2e}"));
        if v > thr {
            return (
                name.to_string(),
                format!("sub-op rel L2: {}", seen.join(", ")),
            );
        }
    }
    if seen.is_empty() {
        ("residual".into(), "block output; the traces carry no sub-op tensors (attn_out, moe_out) to localise further".into())
    } else {
        (
            "residual".into(),
            format!(
                "sub-ops within limit ({}); the mix/expand differs",
                seen.join(", ")
            ),
        )
    }
}

fn compare_logits(
    r: &mut CompareReport,
    golden: &TraceFile,
    engine: &TraceFile,
    gates: &Gates,
    excl: &[usize],
    l_n: usize,
    strict: bool,
) {
    let Some(gl) = golden.get("logits") else {
        return;
    };
    let Some(el) = engine.get("logits") else {
        r.add(
            "logits",
            MetricStatus::NotChecked,
            "absent from the engine trace".into(),
            None,
            None,
        );
        return;
    };
    let gpos: Option<Vec<usize>> = golden
        .get("logits_positions")
        .map(|p| p.as_i64().iter().map(|&x| x as usize).collect());
    let epos: Option<Vec<usize>> = engine
        .get("logits_positions")
        .map(|p| p.as_i64().iter().map(|&x| x as usize).collect());
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
    } else if let Some(gp) = &gpos {
        if el.shape.first() == Some(&excl.len()) {
            Some(gp.iter().copied().enumerate().collect())
        } else {
            None
        }
    } else {
        None
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
    let lg = &gates.logits;
    let (mut ncmp, mut worst_rl, mut worst_ma, mut am_eq) = (0, 0.0f64, 0.0f64, 0);
    let mut first_bad: Option<String> = None;
    for &(i, row) in &rows {
        let p = gpos.as_ref().map(|g| g[i]).unwrap_or(i);
        let compared = strict || l_n == 0 || excl.get(p).is_none_or(|&x| x >= l_n);
        if !compared {
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
        let ok = rl <= lg.rel_l2 && ma <= lg.max_abs && am_ok;
        if !ok && first_bad.is_none() {
            first_bad = Some(format!("first failing step {i} (pos {p}): rel L2 {rl:.3e}, max|d| {ma:.3e}, argmax golden {ga} engine {ea}"));
            let (metric, value, threshold) = if rl > lg.rel_l2 {
                ("rel_l2", rl, lg.rel_l2)
            } else if ma > lg.max_abs {
                ("max_abs", ma, lg.max_abs)
            } else {
                ("argmax", ea as f64, ga as f64)
            };
            note_divergence(
                r,
                Divergence {
                    token: p,
                    layer: None,
                    subop: "logits".into(),
                    metric: metric.into(),
                    value,
                    threshold,
                    detail: format!("step {i}; argmax golden {ga} engine {ea}"),
                },
            );
        }
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
        MetricStatus::Vacuous
    } else {
        MetricStatus::Pass
    };
    r.add("logits", status, text, Some(worst_rl), Some(lg.rel_l2));
}

/// The index-source layers a trace carries (`topk.L{l}` tensors), ascending.
fn index_source_layers(trace: &TraceFile) -> Vec<usize> {
    // Sorted numerically: the tensor map's key order puts `topk.L10` before `topk.L2`.
    let mut layers: Vec<usize> = trace
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix("topk.L").and_then(|x| x.parse().ok()))
        .collect();
    layers.sort_unstable();
    layers
}

#[cfg(test)]
mod tests {
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
}
