//! The discrete decisions a trace records (TRACE.md), typed, with their golden selection
//! margins (`margin.*`, official_a README: 0 = exact tie, inf = no competition or not
//! recorded), compared as sets and tallied per decision tensor.

use std::collections::BTreeSet;

use serde::Serialize;

use super::{CompareReport, Divergence, FlipEvent, FlipKind, MetricStatus, SubOp};
use crate::trace::TraceFile;

/// A decision, in the order a block makes them: the candidate writer's kept blocks, the
/// indexer's top-k, the routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// `candidates.L{layer}`: [T, blocks], made by the candidate writer only.
    Candidates { layer: usize },
    /// `topk.L{layer}`: [T, index_topk], made by an index source only.
    TopK { layer: usize },
    /// `experts`: [T, L, K], made by every layer.
    Experts,
}

impl Decision {
    /// The trace tensor holding it.
    pub fn tensor(self) -> String {
        match self {
            Decision::Candidates { layer } => format!("candidates.L{layer}"),
            Decision::TopK { layer } => format!("topk.L{layer}"),
            Decision::Experts => "experts".into(),
        }
    }
    pub fn subop(self) -> SubOp {
        match self {
            Decision::Candidates { .. } => SubOp::Candidates,
            Decision::TopK { .. } => SubOp::TopK,
            Decision::Experts => SubOp::Experts,
        }
    }
    /// Is it made by layer `l`?
    pub fn made_at(self, l: usize) -> bool {
        match self {
            Decision::Candidates { layer } | Decision::TopK { layer } => layer == l,
            Decision::Experts => true,
        }
    }
    /// A routing decision (its own fragile cap), else an index-side selection.
    pub fn is_routing(self) -> bool {
        self == Decision::Experts
    }
    /// The index-side layers a trace records decisions for, from its tensor names.
    fn index_side(trace: &TraceFile) -> Vec<Decision> {
        let mut out: Vec<Decision> = trace
            .tensors
            .keys()
            .filter_map(|k| {
                if let Some(l) = k.strip_prefix("topk.L") {
                    l.parse().ok().map(|layer| Decision::TopK { layer })
                } else if let Some(l) = k.strip_prefix("candidates.L") {
                    l.parse().ok().map(|layer| Decision::Candidates { layer })
                } else {
                    None
                }
            })
            .collect();
        out.sort_by_key(|d| (d.layer_of(), *d));
        out
    }
    fn layer_of(self) -> usize {
        match self {
            Decision::Candidates { layer } | Decision::TopK { layer } => layer,
            Decision::Experts => 0,
        }
    }
}

/// One decision tensor present in the golden and the engine trace, row-aligned, with its
/// tally.
pub struct Track {
    pub decision: Decision,
    golden: Vec<i64>,
    engine: Vec<i64>,
    golden_width: usize,
    engine_width: usize,
    margins: Option<Vec<f64>>,
    layers: usize,
    compared: usize,
    identical: usize,
    robust: Vec<String>,
}

/// A decision that differs from the golden at one (token, layer).
pub struct Mismatch {
    pub margin: f64,
    pub detail: String,
}

impl Track {
    fn row(&self, t: usize, l: usize) -> usize {
        match self.decision {
            Decision::Experts => t * self.layers + l,
            _ => t,
        }
    }

    /// Compare the decision at (t, l) (which must be made at l), counting it.
    pub fn check(&mut self, t: usize, l: usize) -> Option<Mismatch> {
        let row = self.row(t, l);
        let set = |v: &[i64], w: usize| -> BTreeSet<i64> {
            v[row * w..(row + 1) * w]
                .iter()
                .copied()
                .filter(|&x| x >= 0)
                .collect()
        };
        let (g, e) = (
            set(&self.golden, self.golden_width),
            set(&self.engine, self.engine_width),
        );
        self.compared += 1;
        if g == e {
            self.identical += 1;
            return None;
        }
        Some(Mismatch {
            margin: self.margins.as_ref().map_or(f64::INFINITY, |m| {
                m.get(row).copied().unwrap_or(f64::INFINITY)
            }),
            detail: format!(
                "golden only {:?}, engine only {:?}",
                g.difference(&e).collect::<Vec<_>>(),
                e.difference(&g).collect::<Vec<_>>()
            ),
        })
    }

    /// Log a mismatch: excused when its golden margin is at most `limit`; otherwise it is a
    /// ROBUST mismatch, a divergence. Returns whether it was excused.
    pub fn flip(
        &mut self,
        r: &mut CompareReport,
        t: usize,
        l: usize,
        m: Mismatch,
        limit: f64,
        rule: super::ExcuseRule,
        why_not: &str,
    ) -> bool {
        let excused = rule.excuses(m.margin, limit);
        r.flips.push(FlipEvent {
            kind: FlipKind::Decision(self.decision),
            token: t,
            layer: l,
            margin: m.margin,
            excuse_limit: limit,
            excused,
            detail: m.detail.clone(),
        });
        if !excused {
            // Within the limit but not excused: an exact tie the engine's claimed canonical
            // tie rule decides.
            let (metric, why_not) = if m.margin <= limit {
                (
                    "tie order",
                    "is an exact tie, which the claimed canonical tie rule decides",
                )
            } else {
                ("decision set", why_not)
            };
            self.robust.push(format!(
                "token {t} layer {l} (golden margin {:.3}) {}",
                m.margin, m.detail
            ));
            r.note_divergence(Divergence {
                token: t,
                layer: Some(l),
                subop: self.decision.subop(),
                metric: metric.into(),
                value: m.margin,
                threshold: limit.max(0.0),
                detail: format!(
                    "{}: {}; golden margin {:.3} {why_not}",
                    self.decision.tensor(),
                    m.detail,
                    m.margin
                ),
            });
        }
        excused
    }
}

/// The golden's selection margins, by decision.
#[derive(Default)]
pub struct Margins {
    by_tensor: std::collections::BTreeMap<Decision, Vec<f64>>,
    layers: usize,
}

impl Margins {
    pub fn of(golden: &TraceFile, layers: usize) -> Margins {
        let mut by_tensor = std::collections::BTreeMap::new();
        let mut all = Decision::index_side(golden);
        all.push(Decision::Experts);
        for d in all {
            if let Some(m) = golden.get(&format!("margin.{}", d.tensor())) {
                by_tensor.insert(d, m.as_f64());
            }
        }
        // margin.topk.L{l} may exist without a topk tensor in a golden; margins of layers the
        // golden has no decision tensor for are simply unused.
        Margins { by_tensor, layers }
    }
    pub fn has(&self, d: Decision) -> bool {
        self.by_tensor.contains_key(&d)
    }
    pub fn get(&self, d: Decision, t: usize, l: usize) -> f64 {
        let row = match d {
            Decision::Experts => t * self.layers + l,
            _ => t,
        };
        self.by_tensor
            .get(&d)
            .and_then(|m| m.get(row).copied())
            .unwrap_or(f64::INFINITY)
    }
}

/// Every decision the golden records, in block order (index-side by layer, then experts),
/// with the engine's counterpart. An absent engine tensor is NotChecked; a misshapen one
/// fails; both are left out of the returned tracks.
pub fn tracks(
    golden: &TraceFile,
    engine: &TraceFile,
    tokens: usize,
    layers: usize,
    r: &mut CompareReport,
) -> (Vec<Track>, Vec<Decision>) {
    let mut all = Decision::index_side(golden);
    if golden.get("experts").is_some() {
        all.push(Decision::Experts);
    }
    let margins = Margins::of(golden, layers);
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for d in all {
        let name = d.tensor();
        let Some(g) = golden.get(&name) else { continue };
        let Some(e) = engine.get(&name) else {
            r.not_checked(&name);
            missing.push(d);
            continue;
        };
        let lead: &[usize] = if d.is_routing() {
            &[tokens, layers]
        } else {
            &[tokens]
        };
        let rank = lead.len() + 1;
        if e.shape.len() != rank
            || g.shape.len() != rank
            || e.shape[..rank - 1] != *lead
            || g.shape[..rank - 1] != *lead
        {
            r.shape_mismatch(&name, &e.shape, &g.shape);
            missing.push(d);
            continue;
        }
        out.push(Track {
            decision: d,
            golden: g.as_i64().into_owned(),
            engine: e.as_i64().into_owned(),
            golden_width: g.shape[rank - 1],
            engine_width: e.shape[rank - 1],
            margins: margins.by_tensor.get(&d).cloned(),
            layers,
            compared: 0,
            identical: 0,
            robust: Vec::new(),
        });
    }
    (out, missing)
}

/// One metric per track: Fail on a ROBUST mismatch, insufficient coverage when nothing was
/// compared, else Pass.
pub fn summarise(tracks: &[Track], r: &mut CompareReport) {
    for k in tracks {
        let flips: Vec<&FlipEvent> = r
            .flips
            .iter()
            .filter(|f| f.kind == FlipKind::Decision(k.decision) && f.excused)
            .collect();
        let ties = flips.iter().filter(|f| f.is_exact_tie()).count();
        let mut text = format!(
            "{}/{} compared identical; flips excused {} ({ties} exact ties)",
            k.identical,
            k.compared,
            flips.len()
        );
        if let Some(first) = k.robust.first() {
            text += &format!("; {} ROBUST mismatch(es), first at {first}", k.robust.len());
        }
        let status = if !k.robust.is_empty() {
            MetricStatus::Fail
        } else if k.compared == 0 {
            text += "; nothing compared";
            MetricStatus::Vacuous
        } else {
            MetricStatus::Pass
        };
        r.add(&k.decision.tensor(), status, text, None, None);
    }
}
