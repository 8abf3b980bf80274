//! Rotary position embedding (MODEL.md §5.6).
//!
//! Two schedules: window-only layers (ratio 0) use `rope_theta` without YaRN; compressing
//! layers use `compress_rope_theta` with the YaRN ramp and no mscale. A layer uses its one
//! table for everything it rotates. Pairs are adjacent and interleaved on the LAST
//! `rope_head_dim` elements of a vector.
//!
//! Frequencies: the upstream regime computes them in f32 (`f32 pow`, f32 ramp, f32 blend);
//! the exact regime in f64, rounded once to f32 (what the WASTE oracle does). The angle is
//! the f32 product `f32(p) · freq_i` in both.

use super::defects::{Defect, DefectSet};
use super::numerics::Numerics;
use crate::config::Config;

/// One layer's rope table: the per-pair inverse frequencies.
#[derive(Debug, Clone)]
pub struct Rope {
    freqs: Vec<f32>,
    /// Rotate adjacent pairs (correct) or split halves (negative control).
    split_halves: bool,
    /// Negative control: rotate the FIRST rope_head_dim dims instead of the last.
    leading_dims: bool,
}

/// YaRN correction dimension (MODEL.md §5.6), in f64.
fn correction_dim(rotations: f64, dim: f64, base: f64, orig: f64) -> f64 {
    dim * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

impl Rope {
    /// The table of a layer with compression ratio `ratio`.
    pub fn for_layer(cfg: &Config, ratio: usize, numerics: Numerics, defects: &DefectSet) -> Rope {
        let compressed = ratio > 0;
        let theta = if compressed {
            cfg.compress_rope_theta
        } else {
            cfg.rope_theta
        };
        let yarn = compressed && cfg.original_seq_len > 0 && !defects.has(Defect::NoYarn);
        let r = cfg.rope_head_dim;
        let half = r / 2;
        let (low, high) = {
            let lo = correction_dim(cfg.beta_fast, r as f64, theta, cfg.original_seq_len as f64);
            let hi = correction_dim(cfg.beta_slow, r as f64, theta, cfg.original_seq_len as f64);
            let low = lo.floor().max(0.0);
            let high = hi.ceil().min(r as f64 - 1.0);
            (low, high)
        };
        let freqs = match numerics {
            Numerics::Exact => (0..half)
                .map(|i| {
                    let mut f = 1.0 / theta.powf((2 * i) as f64 / r as f64);
                    if yarn {
                        let ramp = ((i as f64 - low) / (high - low).max(1e-3)).clamp(0.0, 1.0);
                        let smooth = 1.0 - ramp;
                        f = f / cfg.rope_factor * (1.0 - smooth) + f * smooth;
                    }
                    f as f32
                })
                .collect(),
            Numerics::Upstream => (0..half)
                .map(|i| {
                    let exponent = (2 * i) as f32 / r as f32;
                    let mut f = 1.0f32 / (theta as f32).powf(exponent);
                    if yarn {
                        let (low, high) = (low as f32, high as f32);
                        let span = if high == low { 1e-3 } else { high - low };
                        let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                        let smooth = 1.0 - ramp;
                        f = f / cfg.rope_factor as f32 * (1.0 - smooth) + f * smooth;
                    }
                    f
                })
                .collect(),
        };
        Rope {
            freqs,
            split_halves: defects.has(Defect::RopeNonAdjacentPairs),
            leading_dims: defects.has(Defect::RopeWrongDims),
        }
    }

    pub fn freqs(&self) -> &[f32] {
        &self.freqs
    }

    /// Rotate every `width`-wide vector of `x` by the angle of position `pos`
    /// (`inverse` rotates by −φ). Only the last `rope_head_dim` elements move.
    pub fn rotate(
        &self,
        x: &mut [f32],
        width: usize,
        pos: usize,
        inverse: bool,
        numerics: Numerics,
    ) {
        let r = self.freqs.len() * 2;
        let p = pos as f32;
        // cos/sin of the f32 angle, evaluated in f64 and rounded once (within an ulp of libm).
        let mut cs = [(0.0f32, 0.0f32); 64];
        let mut table = Vec::new();
        let cs: &mut [(f32, f32)] = if self.freqs.len() <= 64 {
            &mut cs[..self.freqs.len()]
        } else {
            table.resize(self.freqs.len(), (0.0, 0.0));
            &mut table
        };
        for (i, f) in self.freqs.iter().enumerate() {
            let phi = (p * f) as f64;
            let s = phi.sin() as f32;
            cs[i] = (phi.cos() as f32, if inverse { -s } else { s });
        }
        for v in x.chunks_exact_mut(width) {
            let tail = if self.leading_dims {
                &mut v[..r]
            } else {
                &mut v[width - r..]
            };
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (ia, ib) = if self.split_halves {
                    (i, i + r / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (a, b) = (tail[ia], tail[ib]);
                tail[ia] = a * c - b * s;
                tail[ib] = a * s + b * c;
            }
            numerics.round(tail);
        }
    }
}
