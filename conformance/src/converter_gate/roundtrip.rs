//! Per-tensor round trip: the container's dequantised values against the release's exact
//! dequantisation, read a row range at a time from both readers (never a whole checkpoint),
//! judged by the container's storage of the tensor (`gates/converter.yaml`).

use std::collections::BTreeMap;

use ds41_engine::checkpoint::names::{release_to_container, ContainerName};
use ds41_engine::checkpoint::{Checkpoint, Storage};
use rayon::prelude::*;
use serde::Serialize;

use super::thresholds::ConverterGates;

/// The per-value quantisation step of an Engram table (its group's f16 scale), for the
/// "within its quantisation" check; `None` for other tensors.
pub trait StepSource: Sync {
    fn steps(&self, name: &str, first_row: usize, out: &mut [f32]) -> Option<()>;
}

/// One tensor's round trip.
#[derive(Debug, Clone, Serialize)]
pub struct TensorError {
    pub name: String,
    /// The container's storage: F32, Q8G, Q4G, Q3G, VQ3R, VQ2R, VQ4P, Engram4, Engram8.
    pub format: String,
    pub rel_l2: f64,
    pub worst_row: usize,
    pub worst_row_rel_l2: f64,
    /// Largest |container − release| in units of the value's quantisation step (Engram).
    pub max_steps: Option<f64>,
    pub limit: f64,
    /// Why it failed (None: passed).
    pub failure: Option<String>,
    /// ||container − release||² and ||release||² (for per-expert figures).
    #[serde(skip)]
    pub sums: (f64, f64),
}

/// The storage label and rel L2 limit of a container tensor.
fn label_and_limit(storage: Storage, bits: Option<usize>, g: &ConverterGates) -> (String, f64) {
    match (storage, bits) {
        (Storage::Q8G, _) => ("Q8G".into(), g.trunk.q8g_rel_l2),
        (Storage::Q4G, _) => ("Q4G".into(), g.trunk.q4g_rel_l2),
        (Storage::Q3G, _) => ("Q3G".into(), g.trunk.q3g_rel_l2),
        (Storage::Vq3r, _) => ("VQ3R".into(), g.experts.vq3r_rel_l2),
        // The same 3 bits per weight as VQ3R (CONTAINER.md §2), so the same limit.
        (Storage::Vq4p, _) => ("VQ4P".into(), g.experts.vq3r_rel_l2),
        // Two bits per weight: no limit of its own is calibrated, so VQ3R's, the closest.
        (Storage::Vq2r, _) => ("VQ2R".into(), g.experts.vq3r_rel_l2),
        (Storage::EngramRows, Some(8)) => ("Engram8".into(), g.engram.rel_l2_8bit),
        (Storage::EngramRows, _) => ("Engram4".into(), g.engram.rel_l2_4bit),
        _ => ("F32".into(), g.trunk.f32_rel_l2),
    }
}

fn rel(d: f64, n: f64) -> f64 {
    if n > 0.0 {
        (d / n).sqrt()
    } else {
        d.sqrt()
    }
}

/// Round trip of one tensor present in both with the same shape.
fn one(
    release: &dyn Checkpoint,
    container: &dyn Checkpoint,
    name: &str,
    engram_bits: &BTreeMap<usize, usize>,
    steps: &dyn StepSource,
    g: &ConverterGates,
) -> TensorError {
    let fail = |format: String, why: String| TensorError {
        name: name.into(),
        format,
        rel_l2: f64::INFINITY,
        worst_row: 0,
        worst_row_rel_l2: f64::INFINITY,
        max_steps: None,
        limit: 0.0,
        failure: Some(why),
        sums: (f64::INFINITY, 0.0),
    };
    let storage = match container.storage(name) {
        Ok(s) => s,
        Err(e) => return fail("?".into(), format!("the container reader: {e}")),
    };
    let bits = match release_to_container(name) {
        ContainerName::EngramTable { layer } => engram_bits.get(&layer).copied(),
        _ => None,
    };
    let (format, limit) = label_and_limit(storage, bits, g);
    let shape = match release.shape(name) {
        Ok(s) => s,
        Err(e) => return fail(format, format!("the release reader: {e}")),
    };
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let rows = shape.iter().product::<usize>() / cols;
    let chunk = ((1 << 18) / cols).max(1);
    let (mut d_all, mut n_all) = (0f64, 0f64);
    let (mut worst_row, mut worst) = (0usize, 0f64);
    let mut max_steps: Option<f64> = None;
    let (mut r_buf, mut c_buf, mut s_buf) = (Vec::new(), Vec::new(), Vec::new());
    for first in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - first);
        r_buf.resize(n * cols, 0.0);
        c_buf.resize(n * cols, 0.0);
        if let Err(e) = release.rows_f32(name, first, &mut r_buf) {
            return fail(format, format!("the release reader: {e}"));
        }
        if let Err(e) = container.rows_f32(name, first, &mut c_buf) {
            return fail(format, format!("the container reader: {e}"));
        }
        s_buf.resize(n * cols, 0.0);
        let have_steps = steps.steps(name, first, &mut s_buf).is_some();
        for j in 0..n {
            let (mut d, mut nn) = (0f64, 0f64);
            for c in j * cols..(j + 1) * cols {
                let (x, y) = (f64::from(c_buf[c]), f64::from(r_buf[c]));
                let e = if x.is_finite() { x - y } else { f64::INFINITY };
                d += e * e;
                nn += y * y;
                if have_steps {
                    let s = f64::from(s_buf[c]);
                    let k = if e == 0.0 {
                        0.0
                    } else if s > 0.0 {
                        e.abs() / s
                    } else {
                        f64::INFINITY
                    };
                    max_steps = Some(max_steps.map_or(k, |m: f64| m.max(k)));
                }
            }
            d_all += d;
            n_all += nn;
            let r = rel(d, nn);
            if r > worst || first + j == 0 {
                worst = r;
                worst_row = first + j;
            }
        }
    }
    let rel_l2 = rel(d_all, n_all);
    let row_limit = g.row_factor * limit;
    // NaN fails every limit.
    let over = |x: f64, limit: f64| x.is_nan() || x > limit;
    let failure = if over(rel_l2, limit) {
        Some(format!("{format} round trip rel L2 {rel_l2:.4} > {limit}"))
    } else if over(worst, row_limit) {
        Some(format!(
            "{format} row {worst_row} rel L2 {worst:.4} > {row_limit:.4} ({} × the tensor limit)",
            g.row_factor
        ))
    } else {
        match max_steps {
            Some(k) if over(k, g.engram.max_steps) => Some(format!(
                "a value is {k:.2} quantisation steps from the release's (limit {})",
                g.engram.max_steps
            )),
            _ => None,
        }
    };
    TensorError {
        name: name.into(),
        format,
        rel_l2,
        worst_row,
        worst_row_rel_l2: worst,
        max_steps,
        limit,
        failure,
        sums: (d_all, n_all),
    }
}

/// Round trip of every paired tensor, in the given order (tensors run in parallel; each one's
/// figures come from a fixed-order sum, so the result does not depend on the thread count).
/// VQ3R matrices above `outlier_factor` × the median of their (layer, kind) fail too.
pub fn round_trip(
    release: &dyn Checkpoint,
    container: &dyn Checkpoint,
    names: &[String],
    engram_bits: &BTreeMap<usize, usize>,
    steps: &dyn StepSource,
    g: &ConverterGates,
) -> Vec<TensorError> {
    let mut out: Vec<TensorError> = names
        .par_iter()
        .map(|n| one(release, container, n, engram_bits, steps, g))
        .collect();
    let mut groups: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for t in &out {
        if let ContainerName::Expert { layer, kind, .. } = release_to_container(&t.name) {
            groups.entry((layer, kind)).or_default().push(t.rel_l2);
        }
    }
    let medians: BTreeMap<(usize, usize), f64> = groups
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, v[v.len() / 2])
        })
        .collect();
    for t in &mut out {
        if t.failure.is_some() {
            continue;
        }
        if let ContainerName::Expert { layer, kind, .. } = release_to_container(&t.name) {
            let m = medians[&(layer, kind)];
            if t.rel_l2 > g.experts.outlier_factor * m {
                t.failure = Some(format!(
                    "VQ3R round trip rel L2 {:.4} is {:.1}× the median {m:.4} of layer {layer}'s {} matrices (limit {}×)",
                    t.rel_l2,
                    t.rel_l2 / m,
                    ["w1", "w3", "w2"][kind],
                    g.experts.outlier_factor
                ));
            }
        }
    }
    out
}

/// Figures of one storage format.
#[derive(Debug, Clone, Serialize)]
pub struct FormatSummary {
    pub format: String,
    pub tensors: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub limit: f64,
    pub failed: usize,
}

pub fn summarise(t: &[TensorError]) -> Vec<FormatSummary> {
    let mut by: BTreeMap<&str, Vec<&TensorError>> = BTreeMap::new();
    for e in t {
        by.entry(e.format.as_str()).or_default().push(e);
    }
    by.into_iter()
        .map(|(f, v)| {
            let mut r: Vec<f64> = v.iter().map(|e| e.rel_l2).collect();
            r.sort_by(f64::total_cmp);
            FormatSummary {
                format: f.into(),
                tensors: v.len(),
                min: r[0],
                median: r[r.len() / 2],
                max: r[r.len() - 1],
                limit: v[0].limit,
                failed: v.iter().filter(|e| e.failure.is_some()).count(),
            }
        })
        .collect()
}

/// Per-expert figures (the three matrices of an expert together), as WASTE reports them.
#[derive(Debug, Clone, Serialize)]
pub struct ExpertSummary {
    pub experts: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    /// The expert with the largest error, `layers.L.ffn.experts.E`.
    pub worst: String,
    /// (layer, min, max) of the per-expert figures, layer by layer.
    pub per_layer: Vec<(usize, f64, f64)>,
}

/// Per expert: the rel L2 of its three matrices together.
pub fn expert_summary(t: &[TensorError]) -> Option<ExpertSummary> {
    let mut per: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
    for e in t {
        if let ContainerName::Expert { layer, expert, .. } = release_to_container(&e.name) {
            let s = per.entry((layer, expert)).or_default();
            s.0 += e.sums.0;
            s.1 += e.sums.1;
        }
    }
    if per.is_empty() {
        return None;
    }
    let mut v: Vec<(f64, (usize, usize))> =
        per.into_iter().map(|(k, (d, n))| (rel(d, n), k)).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (worst, (l, e)) = v[v.len() - 1];
    let mut per_layer: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for &(x, (layer, _)) in &v {
        let r = per_layer.entry(layer).or_insert((x, x));
        *r = (r.0.min(x), r.1.max(x));
    }
    Some(ExpertSummary {
        per_layer: per_layer.into_iter().map(|(l, (a, b))| (l, a, b)).collect(),
        experts: v.len(),
        min: v[0].0,
        median: v[v.len() / 2].0,
        max: worst,
        worst: format!("layers.{l}.ffn.experts.{e}"),
    })
}
