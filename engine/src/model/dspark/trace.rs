//! The DSpark trace (docs/TRACE.md "DSpark"): what a draft step computes, recorded under the
//! names the official goldens use (goldens/regen/model/run_dspark.py), teacher-forced replay
//! from such a golden, and the first divergence between two traces.
//!
//! Per token of the main model: `dspark.main_hidden` [N, targets·dim], `dspark.main_x`
//! [N, dim]. Per draft step (a decode step at position p, `dspark.positions`): the draft ids
//! `dspark.input_ids` [steps, block]; per stage `block_input`, `mid`, `residual` [steps,
//! stages, block, hc, dim], `pre_mix`, `out_pre` [.., hc], `attn_out`, `moe_out` [.., dim],
//! `experts`, `expert_weights` [.., k]; then `final_pre` [steps, block, hc], `hidden` (the
//! collapsed rows) [steps, block, dim], `head_logits`, `markov_bias`, `logits` [steps, block,
//! vocab], `markov_embed` [steps, block, rank], `output_ids` [steps, block + 1], `confidence`
//! [steps, block].

use std::collections::BTreeMap;

use super::super::block::BlockOutput;
use super::super::pool::PoolVec;
use super::super::{Chunk, Model, Options, Session};
use super::{Draft, DraftObserver, Drafter};
use crate::trace::{TraceData, TraceFile, TraceTensor};
use crate::{Error, Result};

/// One recorded tensor: the values of every step appended, and the shape of one step.
#[derive(Default)]
struct Column {
    cell: Vec<usize>,
    f32: Vec<f32>,
    i64: Vec<i64>,
    rows: usize,
}

/// Records a DSpark run (an observer); with a golden, also forces it (teacher-forced replay:
/// the golden's `main_hidden`, draft ids, stage inputs and Markov ids replace the run's own).
pub struct DraftRecorder<'g> {
    dims: Dims,
    columns: BTreeMap<&'static str, Column>,
    forcing: Option<&'g TraceFile>,
    step: usize,
    sampled_own: Vec<u32>,
}

/// The widths a DSpark trace's cells have ([`super::Drafter::dims`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub stages: usize,
    pub block: usize,
    pub hc: usize,
    pub dim: usize,
    pub vocab: usize,
    pub rank: usize,
    /// Target layers (`main_hidden` holds `targets · dim` values per token).
    pub targets: usize,
}

impl<'g> DraftRecorder<'g> {
    pub fn new(dims: Dims) -> DraftRecorder<'g> {
        DraftRecorder {
            dims,
            columns: BTreeMap::new(),
            forcing: None,
            step: 0,
            sampled_own: Vec::new(),
        }
    }

    /// A recorder that replays `golden` (teacher-forced).
    pub fn replaying(dims: Dims, golden: &'g TraceFile) -> DraftRecorder<'g> {
        DraftRecorder {
            forcing: Some(golden),
            ..DraftRecorder::new(dims)
        }
    }

    fn put_f32(&mut self, name: &'static str, cell: &[usize], v: &[f32]) {
        let c = self.columns.entry(name).or_default();
        c.cell = cell.to_vec();
        c.f32.extend_from_slice(v);
        c.rows += 1;
    }

    fn put_i64(&mut self, name: &'static str, cell: &[usize], v: impl IntoIterator<Item = i64>) {
        let c = self.columns.entry(name).or_default();
        c.cell = cell.to_vec();
        c.i64.extend(v);
        c.rows += 1;
    }

    /// Row `index` (along the first axis) of the golden's tensor `name`.
    fn golden_row(&self, name: &str, index: usize) -> Option<Vec<f32>> {
        let t = self.forcing?.get(name)?;
        let v = t.as_f64();
        let n = t.len() / t.shape().first().copied().unwrap_or(1).max(1);
        let (lo, hi) = (index * n, (index + 1) * n);
        (hi <= v.len()).then(|| v[lo..hi].iter().map(|&x| x as f32).collect())
    }

    fn golden_stage(&self, name: &str, stage: usize, stages: usize) -> Option<Vec<f32>> {
        let t = self.forcing?.get(name)?;
        let per_step = t.len() / t.shape().first().copied().unwrap_or(1).max(1);
        let n = per_step / stages.max(1);
        let lo = self.step * per_step + stage * n;
        let v = t.as_f64();
        (lo + n <= v.len()).then(|| v[lo..lo + n].iter().map(|&x| x as f32).collect())
    }

    /// The trace: every column as one tensor [rows, cell...].
    pub fn into_trace(self) -> TraceFile {
        let stages = self.dims.stages;
        let mut out = TraceFile::default();
        for (name, c) in self.columns {
            let mut shape = if PER_STAGE.contains(&name) {
                vec![c.rows / stages.max(1), stages]
            } else {
                vec![c.rows]
            };
            shape.extend(&c.cell);
            let t = if c.i64.is_empty() && !c.f32.is_empty() {
                TraceTensor::f32(shape, c.f32)
            } else {
                TraceTensor::i64(shape, c.i64)
            };
            out.tensors.insert(name.to_string(), t);
        }
        out.metadata
            .insert("format".into(), "ds41-dspark-trace/1".into());
        out
    }
}

impl DraftObserver for DraftRecorder<'_> {
    fn main_hidden(&mut self, chunk: Chunk, main_hidden: &mut PoolVec<f32>) {
        let width = main_hidden.len() / chunk.rows.max(1);
        for r in 0..chunk.rows {
            if let Some(g) = self.golden_row("dspark.main_hidden", chunk.start + r) {
                if g.len() == width {
                    main_hidden[r * width..(r + 1) * width].copy_from_slice(&g);
                }
            }
            let row = main_hidden[r * width..(r + 1) * width].to_vec();
            self.put_f32("dspark.main_hidden", &[width], &row);
        }
    }

    fn main_x(&mut self, chunk: Chunk, main_x: &[f32]) {
        let d = main_x.len() / chunk.rows.max(1);
        for r in 0..chunk.rows {
            self.put_f32("dspark.main_x", &[d], &main_x[r * d..(r + 1) * d]);
        }
    }

    fn draft_ids(&mut self, position: usize, ids: &mut [u32]) {
        if let Some(g) = self.golden_row("dspark.input_ids", self.step) {
            if g.len() == ids.len() {
                ids.iter_mut().zip(&g).for_each(|(i, &v)| *i = v as u32);
            }
        }
        self.put_i64("dspark.positions", &[], [position as i64]);
        self.put_i64(
            "dspark.input_ids",
            &[ids.len()],
            ids.iter().map(|&i| i64::from(i)),
        );
    }

    fn stage_input(&mut self, stage: usize, stream: &mut PoolVec<f32>, pre: &mut PoolVec<f32>) {
        let stages = self.dims.stages;
        if let Some(g) = self.golden_stage("dspark.block_input", stage, stages) {
            if g.len() == stream.len() {
                stream.copy_from_slice(&g);
            }
        }
        if let Some(g) = self.golden_stage("dspark.pre_mix", stage, stages) {
            if g.len() == pre.len() {
                pre.copy_from_slice(&g);
            }
        }
        let (b, hc, d) = (self.dims.block, self.dims.hc, self.dims.dim);
        self.put_f32("dspark.block_input", &[b, hc, d], stream);
        self.put_f32("dspark.pre_mix", &[b, hc], pre);
    }

    fn stage_output(&mut self, _stage: usize, out: &BlockOutput) {
        let (b, hc, d) = (self.dims.block, self.dims.hc, self.dims.dim);
        self.put_f32("dspark.attn_out", &[b, d], &out.attn_out);
        self.put_f32("dspark.mid", &[b, hc, d], &out.mid);
        self.put_f32("dspark.moe_out", &[b, d], &out.moe_out);
        self.put_f32("dspark.residual", &[b, hc, d], &out.stream);
        self.put_f32("dspark.out_pre", &[b, hc], &out.pre);
        let k = out.routes.first().map_or(0, |r| r.experts.len());
        let experts: Vec<i64> = out
            .routes
            .iter()
            .flat_map(|r| r.experts.iter().map(|&e| e as i64))
            .collect();
        let weights: Vec<f32> = out
            .routes
            .iter()
            .flat_map(|r| r.weights.iter().copied())
            .collect();
        self.put_i64("dspark.experts", &[b, k], experts);
        self.put_f32("dspark.expert_weights", &[b, k], &weights);
    }

    fn head(&mut self, pre: &[f32], hidden: &[f32], logits: &[f32]) {
        let (b, hc, d, v) = (
            self.dims.block,
            self.dims.hc,
            self.dims.dim,
            self.dims.vocab,
        );
        self.put_f32("dspark.final_pre", &[b, hc], pre);
        self.put_f32("dspark.hidden", &[b, d], hidden);
        self.put_f32("dspark.head_logits", &[b, v], logits);
    }

    fn sampled(&mut self, step: usize, id: &mut u32) {
        // recorded as sampled (in `draft`); only the next steps read the golden's
        self.sampled_own.push(*id);
        if let Some(g) = self.golden_row("dspark.output_ids", self.step) {
            if let Some(&v) = g.get(step + 1) {
                *id = v as u32;
            }
        }
    }

    fn markov(&mut self, _step: usize, bias: &[f32], embed: &[f32]) {
        let c = self.columns.entry("dspark.markov_bias").or_default();
        c.f32.extend_from_slice(bias);
        let c = self.columns.entry("dspark.markov_embed").or_default();
        c.f32.extend_from_slice(embed);
    }

    fn draft(&mut self, draft: &Draft) {
        let (b, v, rank) = (self.dims.block, self.dims.vocab, self.dims.rank);
        self.put_f32("dspark.logits", &[b, v], &draft.logits);
        self.put_f32("dspark.confidence", &[b], &draft.confidence);
        // The ids this run sampled (under replay, the golden's went on to the next steps).
        let own = std::mem::take(&mut self.sampled_own);
        let ids = draft.ids[..1].iter().chain(&own).map(|&i| i64::from(i));
        self.put_i64("dspark.output_ids", &[b + 1], ids);
        for (name, cell) in [
            ("dspark.markov_bias", [b, v]),
            ("dspark.markov_embed", [b, rank]),
        ] {
            let c = self.columns.entry(name).or_default();
            c.rows += 1;
            c.cell = cell.to_vec();
        }
        self.step += 1;
    }
}

/// How far a cell of one tensor may be from the golden: the largest |Δ| and the relative
/// L2 distance `‖Δ‖ / ‖golden‖` (a cell fails when either is exceeded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub max_abs: f64,
    pub rel_l2: f64,
}

impl Limit {
    /// Bit for bit (integers: equal).
    pub const EXACT: Limit = Limit {
        max_abs: 0.0,
        rel_l2: 0.0,
    };
}

/// Where a DSpark trace first leaves a golden: the tensor, the draft step (or token, for
/// `main_hidden` / `main_x`), the stage where it has one, and the largest difference there.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub tensor: String,
    /// The draft step (the token for `main_hidden` / `main_x`).
    pub step: usize,
    pub stage: Option<usize>,
    pub max_abs: f64,
    pub rel_l2: f64,
    pub limit: Limit,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stage = self
            .stage
            .map(|s| format!(" stage {s}"))
            .unwrap_or_default();
        let at = if matches!(self.tensor.as_str(), "dspark.main_hidden" | "dspark.main_x") {
            "token"
        } else {
            "step"
        };
        write!(
            f,
            "`{}` first differs at {at} {}{stage}: max |Δ| {:.3e} (limit {:.1e}), rel L2 {:.3e} \
             (limit {:.1e})",
            self.tensor,
            self.step,
            self.max_abs,
            self.limit.max_abs,
            self.rel_l2,
            self.limit.rel_l2
        )
    }
}

/// The order a draft step computes in: a divergence is reported at the earliest of these.
pub const ORDER: &[&str] = &[
    "dspark.main_hidden",
    "dspark.main_x",
    "dspark.input_ids",
    "dspark.attn_out",
    "dspark.mid",
    "dspark.experts",
    "dspark.moe_out",
    "dspark.residual",
    "dspark.out_pre",
    "dspark.final_pre",
    "dspark.hidden",
    "dspark.head_logits",
    "dspark.markov_bias",
    "dspark.logits",
    "dspark.output_ids",
    "dspark.confidence",
];

/// The tensors with a stage axis ([steps, stages, ...]).
const PER_STAGE: &[&str] = &[
    "dspark.block_input",
    "dspark.pre_mix",
    "dspark.attn_out",
    "dspark.mid",
    "dspark.experts",
    "dspark.expert_weights",
    "dspark.moe_out",
    "dspark.residual",
    "dspark.out_pre",
];

/// The first cell (in computation order: step, then stage, then [`ORDER`]) where `got`
/// differs from `golden` by more than `limit(tensor)` allows. A tensor missing from `got`, or
/// of another shape, is a divergence at step 0 with an infinite difference.
pub fn first_divergence(
    golden: &TraceFile,
    got: &TraceFile,
    limit: impl Fn(&str) -> Limit,
) -> Option<Divergence> {
    let missing = |tensor: String, name: &str| Divergence {
        tensor,
        step: 0,
        stage: None,
        max_abs: f64::INFINITY,
        rel_l2: f64::INFINITY,
        limit: limit(name),
    };
    let steps = golden.get("dspark.positions").map_or(0, |t| t.len());
    let tokens = golden.get("dspark.main_x").map_or(0, |t| t.shape()[0]);
    let mut found: Option<(usize, usize, usize, Divergence)> = None;
    for (order, &name) in ORDER.iter().enumerate() {
        let (Some(g), Some(o)) = (golden.get(name), got.get(name)) else {
            if golden.get(name).is_some() {
                return Some(missing(format!("{name} (not reported)"), name));
            }
            continue;
        };
        if g.shape() != o.shape() {
            let what = format!("{name} (shape {:?}, golden {:?})", o.shape(), g.shape());
            return Some(missing(what, name));
        }
        let per_token = matches!(name, "dspark.main_hidden" | "dspark.main_x");
        let rows = if per_token { tokens } else { steps };
        let stages = if PER_STAGE.contains(&name) {
            g.shape()[1]
        } else {
            1
        };
        let (gv, ov) = (g.as_f64(), o.as_f64());
        let n = gv.len() / (rows * stages).max(1);
        for r in 0..rows {
            for s in 0..stages {
                let span = (r * stages + s) * n..(r * stages + s + 1) * n;
                let (worst, rel) = cell_distance(&gv[span.clone()], &ov[span]);
                let lim = limit(name);
                if worst > lim.max_abs || rel > lim.rel_l2 || worst.is_nan() {
                    // main_x of token t belongs before the draft step at position t.
                    let step_key = if per_token {
                        golden_step_of_token(golden, r)
                    } else {
                        r
                    };
                    let key = (step_key, s, order);
                    if found.as_ref().is_none_or(|f| key < (f.0, f.1, f.2)) {
                        found = Some((
                            key.0,
                            key.1,
                            key.2,
                            Divergence {
                                tensor: name.into(),
                                step: r,
                                stage: (stages > 1 || PER_STAGE.contains(&name)).then_some(s),
                                max_abs: worst,
                                rel_l2: rel,
                                limit: lim,
                            },
                        ));
                    }
                    break;
                }
            }
        }
    }
    found.map(|f| f.3)
}

/// Max |Δ| and relative L2 distance of a cell (0 for bit-equal values, NaN-propagating).
fn cell_distance(golden: &[f64], got: &[f64]) -> (f64, f64) {
    let (mut worst, mut num, mut den) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in golden.iter().zip(got) {
        let d = if a.to_bits() == b.to_bits() {
            0.0
        } else {
            (a - b).abs()
        };
        if d.is_nan() || d > worst {
            worst = d;
        }
        num += d * d;
        den += a * a;
    }
    let rel = if num == 0.0 { 0.0 } else { (num / den).sqrt() };
    (worst, rel)
}

/// The draft step that first reads token `t`'s `main_x` (every step at a position ≥ t does,
/// through the ring; the step at position t first).
fn golden_step_of_token(golden: &TraceFile, t: usize) -> usize {
    let Some(p) = golden.get("dspark.positions") else {
        return 0;
    };
    p.as_i64()
        .iter()
        .position(|&x| x as usize >= t)
        .unwrap_or(usize::MAX)
}

/// A replay golden must hold every forced tensor in this model's and schedule's shape (a
/// golden of another geometry is refused, never half forced).
fn check_forcing(g: &TraceFile, d: Dims, tokens: usize, prefill: usize) -> Result<()> {
    let steps = tokens - prefill;
    let want: [(&str, Vec<usize>); 5] = [
        ("dspark.main_hidden", vec![tokens, d.targets * d.dim]),
        ("dspark.input_ids", vec![steps, d.block]),
        (
            "dspark.block_input",
            vec![steps, d.stages, d.block, d.hc, d.dim],
        ),
        ("dspark.pre_mix", vec![steps, d.stages, d.block, d.hc]),
        ("dspark.output_ids", vec![steps, d.block + 1]),
    ];
    for (name, shape) in want {
        let got = g.get(name).map(|t| t.shape().to_vec());
        if got.as_deref() != Some(shape.as_slice()) {
            return Err(Error::Model(format!(
                "replay golden {}: `{name}` has shape {got:?}, this model and schedule need {shape:?}",
                g.path.display()
            )));
        }
    }
    Ok(())
}

/// Run the main model over `tokens` (a prefill of `prefill`, then single-token decode steps)
/// with a [`Drafter`] following it, and return the DSpark trace. With `replay`, the drafter
/// is teacher-forced from that golden (its `main_hidden`, draft ids, stage inputs and Markov
/// ids); the main model still runs, but only its positions matter then.
pub fn run(
    model: &Model,
    options: &Options,
    tokens: &[u32],
    prefill: usize,
    replay: Option<&TraceFile>,
) -> Result<TraceFile> {
    run_and_generate(model, options, tokens, prefill, replay, 0)
}

/// [`run`], then `generate` more decode steps, each fed the main model's greedy (argmax) id
/// of the step before: the trace's `input_ids` are then the model's own continuation, which
/// is what measuring draft acceptance needs (`ds41 gate spec-window --dspark`).
pub fn run_and_generate(
    model: &Model,
    options: &Options,
    tokens: &[u32],
    prefill: usize,
    replay: Option<&TraceFile>,
    generate: usize,
) -> Result<TraceFile> {
    if replay.is_some() && generate > 0 {
        return Err(Error::Model(
            "DSpark run: a replay follows its golden's tokens and generates none".into(),
        ));
    }
    if prefill == 0 || prefill > tokens.len() {
        return Err(Error::Model(format!(
            "DSpark run: prefill {prefill} outside 1..={}",
            tokens.len()
        )));
    }
    let mut session = Session::new(model, options.clone());
    let mut drafter = Drafter::new(model, options.clone())?;
    let dims = drafter.dims();
    if let Some(g) = replay {
        check_forcing(g, dims, tokens.len(), prefill)?;
    }
    let mut rec = match replay {
        Some(g) => DraftRecorder::replaying(dims, g),
        None => DraftRecorder::new(dims),
    };
    let mut tokens = tokens.to_vec();
    let total = tokens.len() + generate;
    session.reserve(total);
    let mut start = 0;
    while start < total {
        let rows = if start == 0 {
            session.prefill(&tokens[..prefill], &mut crate::model::session::Unobserved)?;
            prefill
        } else {
            session.decode(tokens[start], &mut crate::model::session::Unobserved)?;
            1
        };
        let last = super::argmax(session.logits());
        drafter.step(Chunk { start, rows }, session.main_hidden(), last, &mut rec)?;
        start += rows;
        if start == tokens.len() && start < total {
            tokens.push(last);
        }
    }
    let mut trace = rec.into_trace();
    trace.tensors.insert(
        "input_ids".into(),
        TraceTensor::i64(
            vec![tokens.len()],
            tokens.iter().map(|&t| i64::from(t)).collect(),
        ),
    );
    trace.metadata.insert("prefill".into(), prefill.to_string());
    trace
        .metadata
        .insert("numerics".into(), options.numerics.as_str().into());
    trace.metadata.insert(
        "mode".into(),
        if replay.is_some() {
            "replay"
        } else {
            "forward"
        }
        .into(),
    );
    Ok(trace)
}

/// End to end, a draft row may sample another id than the golden where the golden's top
/// two are closer than the drift the row's logits show (a near tie that a bf16-correct
/// engine may flip, as the official code itself does under another summation order; see
/// goldens/official/*/dspark_calibration.json). Such a flip is excused when the golden's
/// margin between its id and ours is within twice the row's max |Δ| of the final logits;
/// the rows after it in its block are fed by the other id (Markov bias, confidence) and are
/// not compared. Returns `got` with those rows replaced by the golden's, and one note per
/// excused flip; an unexcused flip is left in place for [`first_divergence`] to report.
pub fn excuse_draft_flips(golden: &TraceFile, got: &TraceFile) -> (TraceFile, Vec<String>) {
    let mut out = got.clone();
    let mut notes = Vec::new();
    let (Some(g_ids), Some(o_ids), Some(g_log), Some(o_log)) = (
        golden.i64("dspark.output_ids"),
        got.i64("dspark.output_ids"),
        golden.f32("dspark.logits"),
        got.f32("dspark.logits"),
    ) else {
        return (out, notes);
    };
    if g_ids.0 != o_ids.0 || g_log.0 != o_log.0 || g_log.0.len() != 3 {
        return (out, notes);
    }
    let (steps, block, vocab) = (g_log.0[0], g_log.0[1], g_log.0[2]);
    let mut masked: Vec<(usize, usize)> = Vec::new();
    for s in 0..steps {
        for r in 0..block {
            let (gi, oi) = (
                g_ids.1[s * (block + 1) + r + 1],
                o_ids.1[s * (block + 1) + r + 1],
            );
            if gi == oi {
                continue;
            }
            let row = (s * block + r) * vocab;
            let (gl, ol) = (&g_log.1[row..row + vocab], &o_log.1[row..row + vocab]);
            let drift = gl
                .iter()
                .zip(ol)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let margin = gl[gi as usize] - gl.get(oi as usize).copied().unwrap_or(f32::NAN);
            if margin.is_finite() && margin <= 2.0 * drift {
                notes.push(format!(
                    "step {s} row {r}: sampled {oi}, golden {gi} (golden margin {margin:.3e} \
                     within twice the row's drift {drift:.3e}); rows after it not compared"
                ));
                masked.push((s, r));
            }
            break;
        }
    }
    // The excused id and every row after it in its block: the golden's values.
    for (name, rows, first) in [
        ("dspark.output_ids", block + 1, 1),
        ("dspark.markov_bias", block, 0),
        ("dspark.logits", block, 0),
        ("dspark.confidence", block, 0),
    ] {
        let (Some(g), Some(o)) = (golden.get(name), out.tensors.get_mut(name)) else {
            continue;
        };
        let width = g.len() / (steps * rows).max(1);
        for &(s, r) in &masked {
            let span = (s * rows + r + first) * width..(s + 1) * rows * width;
            match (&g.data, &mut o.data) {
                (TraceData::F32(g), TraceData::F32(o)) => o[span.clone()].copy_from_slice(&g[span]),
                (TraceData::I64(g), TraceData::I64(o)) => o[span.clone()].copy_from_slice(&g[span]),
                _ => {}
            }
        }
    }
    (out, notes)
}
