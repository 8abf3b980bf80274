//! Trace comparison (CONTRACT.md §4–§5), following ../shared/tools/compare.py: Engram hash ids
//! exact; discrete decisions (candidate blocks, indexer top-k sets, routed expert sets) exact
//! except the flips the profile excuses — *fragile flips* in bf16 profiles and *exact ties*
//! (golden margin 0) in every profile unless the engine claims the canonical tie rule — which
//! are counted and exclude what they feed; per (token, layer) cells of the streams by rel L2;
//! logits rel L2, max abs and argmax per compared row. Unlike compare.py a non-finite engine
//! value always fails, and a check that compared nothing fails ("insufficient coverage").
//!
//! Two modes share the machinery: [`compare`] (end to end, a flip excludes everything it can
//! influence) and [`compare_replay`] (teacher-forced, every cell judged on its own).

mod decisions;
mod grid;
mod logits;
mod metrics;
mod normal;
mod position;
mod replay;

use serde::{Deserialize, Serialize};

pub use decisions::Decision;
pub use metrics::{argmax, max_abs, rel_l2, top_k};
pub use normal::compare;
pub use position::{Divergence, SubOp};
pub use replay::compare_replay;

use crate::gates::Gates;
use crate::trace::TraceFile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricStatus {
    Pass,
    Fail,
    Info,
    /// The engine trace lacks this tensor.
    NotChecked,
    /// Present in both traces, but nothing was left to compare after exclusions. Never a
    /// pass: a case that requires the tensor fails (insufficient coverage).
    Vacuous,
}

impl MetricStatus {
    /// Does this status make its case fail? (Vacuous fails a case only where the case
    /// requires that tensor: see [`CompareReport::uncovered`].)
    pub fn fails(self) -> bool {
        self == MetricStatus::Fail
    }
}

/// Is metric `name` one of the tensors a case requires (`topk` = every `topk.L{l}`)?
pub fn is_required(name: &str, require: &[String]) -> bool {
    require
        .iter()
        .any(|r| r == name || (r == "topk" && name.starts_with("topk.L")))
}

#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    pub name: String,
    pub status: MetricStatus,
    pub text: String,
    #[serde(
        with = "crate::report::float::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub worst: Option<f64>,
    #[serde(
        with = "crate::report::float::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub limit: Option<f64>,
}

/// What a mismatched decision was, for the flip log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlipKind {
    Decision(Decision),
    /// A residual cell over its threshold at a fragile golden decision the engine's trace
    /// does not record (compare.py `residual(assumed)`).
    AssumedFromResidual,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlipEvent {
    pub kind: FlipKind,
    pub token: usize,
    pub layer: usize,
    #[serde(with = "crate::report::float")]
    pub margin: f64,
    #[serde(with = "crate::report::float")]
    pub excuse_limit: f64,
    pub excused: bool,
    pub detail: String,
}

impl FlipEvent {
    /// An excused flip of an exact tie (golden margin 0).
    pub fn is_exact_tie(&self) -> bool {
        self.excused && self.margin == 0.0
    }
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct CompareReport {
    pub metrics: Vec<Metric>,
    pub first_divergence: Option<Divergence>,
    /// Worst compared residual rel L2 per layer over all tokens (None: nothing compared).
    #[serde(with = "crate::report::float::vec_option")]
    pub per_layer_worst: Vec<Option<f64>>,
    pub flips: Vec<FlipEvent>,
    #[serde(with = "crate::report::float")]
    pub residual_threshold: f64,
}

impl CompareReport {
    pub fn failed(&self) -> bool {
        self.metrics.iter().any(|m| m.status.fails())
    }
    /// The metrics of required tensors that compared nothing (insufficient coverage).
    pub fn uncovered<'a>(&'a self, require: &'a [String]) -> impl Iterator<Item = &'a Metric> {
        self.metrics
            .iter()
            .filter(|m| m.status == MetricStatus::Vacuous && is_required(&m.name, require))
    }
    pub fn excused_flips(&self) -> usize {
        self.flips.iter().filter(|f| f.excused).count()
    }
    pub fn exact_ties(&self) -> usize {
        self.flips.iter().filter(|f| f.is_exact_tie()).count()
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
    fn not_checked(&mut self, name: &str) {
        self.add(
            name,
            MetricStatus::NotChecked,
            "absent from the engine trace".into(),
            None,
            None,
        );
    }
    fn shape_mismatch(&mut self, name: &str, engine: &[usize], golden: &[usize]) {
        self.add(
            name,
            MetricStatus::Fail,
            format!("shape {engine:?} != golden {golden:?}"),
            None,
            None,
        );
    }
    /// Keep the earliest divergence in causal order.
    fn note_divergence(&mut self, d: Divergence) {
        if self
            .first_divergence
            .as_ref()
            .is_none_or(|old| d.precedes(old))
        {
            self.first_divergence = Some(d);
        }
    }
    /// One line per failing metric, for a failure reason.
    pub fn failure_summary(&self) -> String {
        let mut parts: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| m.status.fails())
            .map(|m| format!("{}: {}", m.name, m.text))
            .collect();
        if let Some(d) = &self.first_divergence {
            parts.insert(0, format!("first divergence: {}", d.headline()));
        }
        parts.join("\n")
    }
}

/// Which decision flips a comparison excuses (CONTRACT.md §4).
#[derive(Debug, Clone, Copy)]
struct ExcuseRule {
    /// The profile's fragile-flip rule (bf16 profiles).
    fragile: bool,
    /// Exact ties (golden margin 0) are excused in every profile unless the engine claims
    /// the canonical tie rule (`decisions.strict_ties`).
    ties: bool,
}

impl ExcuseRule {
    fn of(gates: &Gates) -> ExcuseRule {
        ExcuseRule {
            fragile: gates.decisions.excuse_fragile_flips,
            ties: !gates.decisions.strict_ties,
        }
    }
    /// Nothing is excused: every mismatch fails and everything is compared.
    fn strict(self) -> bool {
        !self.fragile && !self.ties
    }
    /// The largest golden margin excused when the fragile rule would allow `fragile_limit`.
    fn limit(self, fragile_limit: f64) -> f64 {
        if self.fragile {
            fragile_limit
        } else if self.ties {
            0.0
        } else {
            -1.0
        }
    }
    /// Whether a flip at golden `margin` is excused under `limit`. An engine that claims the
    /// canonical tie rule answers for every exact tie (margin 0), in every profile: the fragile
    /// rule still excuses near ties, never exact ones (a reversed tie order is then caught in
    /// bf16 runs too).
    fn excuses(self, margin: f64, limit: f64) -> bool {
        margin <= limit && (self.ties || margin != 0.0)
    }
}

/// The `fragile_flips` line: how many flips were excused and why; Fail past `max`.
fn flips_metric(r: &mut CompareReport, rule: ExcuseRule, max: Option<usize>, effect: &str) {
    let (n, ties) = (r.excused_flips(), r.exact_ties());
    if let Some(max) = max.filter(|&m| n > m) {
        let text = format!("{n} excused flips > allowed {max}");
        return r.add("fragile_flips", MetricStatus::Fail, text, None, None);
    }
    let text = if rule.strict() {
        "none excused (the profile compares decisions strictly and ties are strict: the engine \
         claims the canonical tie rule)"
            .to_string()
    } else if !rule.fragile {
        format!("{n} exact ties (golden margin 0) excused; {effect}")
    } else {
        format!("{n} excused ({ties} exact ties); {effect}")
    };
    r.add(
        "fragile_flips",
        MetricStatus::Info,
        text,
        Some(n as f64),
        None,
    );
}

/// Trace metadata naming the backbone layer of each Engram layer (config `engram_layer_ids`,
/// comma-separated; TRACE.md). With it, an Engram hash divergence is placed at the layer
/// that reads the hashes instead of before every block of its token.
pub const ENGRAM_LAYERS_METADATA: &str = "engram_layer_ids";

/// The golden's [`ENGRAM_LAYERS_METADATA`], when present and well formed.
fn engram_layer_ids(golden: &TraceFile) -> Option<Vec<usize>> {
    golden
        .metadata
        .get(ENGRAM_LAYERS_METADATA)?
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect()
}

/// Engram hash ids: exact everywhere, never excused.
fn compare_engram(r: &mut CompareReport, golden: &TraceFile, engine: &TraceFile) {
    // No Engram layers (absent, or an empty [tokens, 0, cols] tensor): nothing to compare.
    let Some(g) = golden
        .get("engram_hash")
        .filter(|g| g.shape.get(1) != Some(&0))
    else {
        return;
    };
    let e = match engine.get("engram_hash") {
        None => return r.not_checked("engram_hash"),
        Some(e) if e.shape != g.shape || g.shape.is_empty() => {
            return r.shape_mismatch("engram_hash", &e.shape, &g.shape)
        }
        Some(e) => e,
    };
    let (gv, ev, n) = (g.as_i64(), e.as_i64(), g.row_len());
    let bad: Vec<usize> = (0..g.shape[0])
        .filter(|&t| gv[t * n..(t + 1) * n] != ev[t * n..(t + 1) * n])
        .collect();
    if let Some(&t) = bad.first() {
        let col = (0..n)
            .find(|&c| gv[t * n + c] != ev[t * n + c])
            .unwrap_or(0);
        let values = format!("golden {} engine {}", gv[t * n + col], ev[t * n + col]);
        // [T, n_engram_layers, columns]: the first differing column names its Engram layer,
        // hence (with the layer ids) the block that reads it.
        let located = match (g.shape.as_slice(), engram_layer_ids(golden)) {
            (&[_, n_el, cols], Some(ids)) if ids.len() == n_el && cols > 0 => {
                let (k, c) = (col / cols, col % cols);
                Some((ids[k], format!("Engram layer {k}, column {c}: {values}")))
            }
            _ => None,
        };
        let (layer, detail) = match located {
            Some((l, d)) => (Some(l), d),
            None => (None, format!("flat column {col}: {values}")),
        };
        r.note_divergence(Divergence {
            token: t,
            layer,
            subop: SubOp::EngramHash,
            metric: "ids differing".into(),
            value: 1.0,
            threshold: 0.0,
            detail,
        });
    }
    let status = if !bad.is_empty() {
        MetricStatus::Fail
    } else if g.shape[0] == 0 {
        MetricStatus::Vacuous
    } else {
        MetricStatus::Pass
    };
    r.add(
        "engram_hash",
        status,
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

#[cfg(test)]
mod tests;
