//! Per (token, layer) cells of a stream (`residual`, `block_input`, `attn_out`, `mid`,
//! `moe_out`): reading both traces' tensors, and the one summary both comparison modes give
//! of a grid of cell values.

use super::{rel_l2, CompareReport, Divergence, MetricStatus, SubOp};
use crate::trace::TraceFile;

/// A stream tensor [T, L, ...] present in both traces with the same shape.
pub struct Stream {
    golden: Vec<f64>,
    engine: Vec<f64>,
    width: usize,
    layers: usize,
}

impl Stream {
    /// `Ok(None)`: absent from the golden or the engine (NotChecked is the caller's call);
    /// `Err(())`: misshapen, already reported as a Fail.
    pub fn load(
        r: &mut CompareReport,
        golden: &TraceFile,
        engine: &TraceFile,
        name: &str,
        tokens: usize,
        layers: usize,
    ) -> Result<Option<Stream>, ()> {
        let (Some(g), Some(e)) = (golden.get(name), engine.get(name)) else {
            return Ok(None);
        };
        if e.shape != g.shape || g.shape.len() < 2 || g.shape[..2] != [tokens, layers] {
            r.shape_mismatch(name, &e.shape, &g.shape);
            return Err(());
        }
        Ok(Some(Stream {
            width: g.len() / (tokens * layers).max(1),
            golden: g.as_f64(),
            engine: e.as_f64(),
            layers,
        }))
    }

    /// rel L2 of cell (t, l).
    pub fn rel(&self, t: usize, l: usize) -> f64 {
        let o = (t * self.layers + l) * self.width;
        rel_l2(
            &self.engine[o..o + self.width],
            &self.golden[o..o + self.width],
        )
    }
}

/// Compared cell values of one stream (None = not compared: excluded or skipped).
pub struct CellGrid {
    tokens: usize,
    layers: usize,
    cells: Vec<Option<f64>>,
}

impl CellGrid {
    pub fn new(tokens: usize, layers: usize) -> CellGrid {
        CellGrid {
            tokens,
            layers,
            cells: vec![None; tokens * layers],
        }
    }

    pub fn set(&mut self, t: usize, l: usize, v: Option<f64>) {
        self.cells[t * self.layers + l] = v;
    }

    /// The largest compared value in layers `< l` (the drift already present upstream).
    pub fn max_below(&self, l: usize) -> f64 {
        (0..self.tokens)
            .flat_map(|t| (0..l).map(move |x| (t, x)))
            .filter_map(|(t, x)| self.cells[t * self.layers + x])
            .fold(0.0, f64::max)
    }

    /// Add the stream's metric `name` (Fail when a cell is over `threshold`, insufficient
    /// coverage when nothing was compared) and its first diverging cell as a divergence at
    /// the sub-op and with the detail `locate` gives for that cell. Returns the worst value per
    /// layer (None: nothing compared in that layer).
    pub fn summarise(
        &self,
        r: &mut CompareReport,
        name: &str,
        threshold: f64,
        locate: impl FnOnce(usize, usize) -> (SubOp, String),
    ) -> Vec<Option<f64>> {
        let at = |t: usize, l: usize| self.cells[t * self.layers + l];
        let mut per_layer = vec![None; self.layers];
        let (mut compared, mut worst, mut over) = (0usize, 0.0f64, Vec::new());
        for t in 0..self.tokens {
            for (l, lw) in per_layer.iter_mut().enumerate() {
                let Some(v) = at(t, l) else { continue };
                compared += 1;
                worst = worst.max(v);
                *lw = Some(lw.unwrap_or(0.0f64).max(v));
                if v > threshold {
                    over.push((t, l, v));
                }
            }
        }
        let mut text = format!(
            "{compared}/{} cells compared, worst rel L2 {worst:.3e} (limit {threshold:.1e})",
            self.tokens * self.layers
        );
        let first_over = over.first().copied();
        if let Some((t, l, v)) = first_over {
            let mut layers: Vec<usize> = over.iter().map(|x| x.1).collect();
            layers.sort_unstable();
            layers.dedup();
            text += &format!(
                "; {} cells over; first diverging cell token {t} layer {l}; layers over {layers:?}",
                over.len()
            );
            let (subop, detail) = locate(t, l);
            r.note_divergence(Divergence {
                token: t,
                layer: Some(l),
                subop,
                metric: "rel_l2".into(),
                value: v,
                threshold,
                detail,
            });
        }
        let status = if first_over.is_some() {
            MetricStatus::Fail
        } else if compared == 0 {
            text += "; nothing compared";
            MetricStatus::Vacuous
        } else {
            MetricStatus::Pass
        };
        r.add(name, status, text, Some(worst), Some(threshold));
        per_layer
    }
}
