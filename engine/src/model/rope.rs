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

/// YaRN parameters of compressing layers (MODEL.md §5.6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub original_seq_len: usize,
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

impl Rope {
    /// The table of a layer with compression ratio `ratio`: ratio 0 → `rope_theta` without
    /// YaRN; ratio > 0 → `compress_rope_theta` with YaRN (when `original_seq_len > 0`).
    pub fn for_layer(cfg: &Config, ratio: usize, numerics: Numerics, defects: &DefectSet) -> Rope {
        let yarn = (ratio > 0 && cfg.original_seq_len > 0).then_some(Yarn {
            original_seq_len: cfg.original_seq_len,
            factor: cfg.rope_factor,
            beta_fast: cfg.beta_fast,
            beta_slow: cfg.beta_slow,
        });
        let theta = if ratio > 0 {
            cfg.compress_rope_theta
        } else {
            cfg.rope_theta
        };
        Rope::new(theta, yarn, cfg.rope_head_dim, numerics, defects)
    }

    /// A table of rope width `r` and base `theta`.
    pub fn new(
        theta: f64,
        yarn: Option<Yarn>,
        r: usize,
        numerics: Numerics,
        defects: &DefectSet,
    ) -> Rope {
        let yarn = yarn.filter(|_| !defects.has(Defect::NoYarn));
        let half = r / 2;
        let (low, high) = match yarn {
            Some(y) => {
                let orig = y.original_seq_len as f64;
                let lo = correction_dim(y.beta_fast, r as f64, theta, orig);
                let hi = correction_dim(y.beta_slow, r as f64, theta, orig);
                (lo.floor().max(0.0), hi.ceil().min(r as f64 - 1.0))
            }
            None => (0.0, 0.0),
        };
        let freqs = match numerics {
            Numerics::Exact => (0..half)
                .map(|i| {
                    let mut f = 1.0 / theta.powf((2 * i) as f64 / r as f64);
                    if let Some(y) = yarn {
                        let ramp = ((i as f64 - low) / (high - low).max(1e-3)).clamp(0.0, 1.0);
                        let smooth = 1.0 - ramp;
                        f = f / y.factor * (1.0 - smooth) + f * smooth;
                    }
                    f as f32
                })
                .collect(),
            Numerics::Upstream => (0..half)
                .map(|i| {
                    let exponent = (2 * i) as f32 / r as f32;
                    let mut f = 1.0f32 / (theta as f32).powf(exponent);
                    if let Some(y) = yarn {
                        let (low, high) = (low as f32, high as f32);
                        let span = if high == low { 1e-3 } else { high - low };
                        let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                        let smooth = 1.0 - ramp;
                        f = f / y.factor as f32 * (1.0 - smooth) + f * smooth;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(orig: usize, factor: f64) -> Option<Yarn> {
        Some(Yarn {
            original_seq_len: orig,
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
        })
    }

    /// MODEL.md §5.6 worked values: pairs below `low` keep their frequency, pairs at or above
    /// `high` are divided by the factor, in both regimes.
    #[test]
    fn yarn_ramp_bounds() {
        for (theta, orig, factor, r, low, high) in [
            (160000.0, 65536, 16.0, 64, 15, 25),
            (160000.0, 32, 4.0, 16, 0, 2),
            (40000.0, 16, 4.0, 8, 0, 1),
        ] {
            for n in [Numerics::Exact, Numerics::Upstream] {
                let ramped = Rope::new(theta, yarn(orig, factor), r, n, &DefectSet::none());
                let plain = Rope::new(
                    theta,
                    yarn(orig, factor),
                    r,
                    n,
                    &DefectSet::new([Defect::NoYarn]),
                );
                for i in 0..r / 2 {
                    let (y, p) = (ramped.freqs()[i] as f64, plain.freqs()[i] as f64);
                    if i <= low {
                        assert_eq!(y, p, "pair {i} below the ramp");
                    } else if i >= high {
                        assert!(
                            (y - p / factor).abs() <= 1e-6 * p,
                            "pair {i} above the ramp"
                        );
                    } else {
                        assert!(y < p && y > p / factor, "pair {i} inside the ramp");
                    }
                }
            }
            let w = Rope::new(10000.0, None, r, Numerics::Exact, &DefectSet::none());
            assert_eq!(w.freqs()[1], (1.0 / 10000f64.powf(2.0 / r as f64)) as f32);
        }
    }

    #[test]
    fn rotation_is_adjacent_pairs_on_the_tail_and_inverts() {
        let rope = Rope::new(10000.0, None, 4, Numerics::Exact, &DefectSet::none());
        let orig = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut x = orig;
        rope.rotate(&mut x, 6, 5, false, Numerics::Exact);
        assert_eq!(x[..2], orig[..2], "the leading no-rope dims stay");
        let phi = 5.0f32 * rope.freqs()[0];
        let (c0, s0) = ((phi as f64).cos() as f32, (phi as f64).sin() as f32);
        assert_eq!(x[2], 3.0 * c0 - 4.0 * s0);
        assert_eq!(x[3], 3.0 * s0 + 4.0 * c0);
        rope.rotate(&mut x, 6, 5, true, Numerics::Exact);
        for (a, b) in x.iter().zip(orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
