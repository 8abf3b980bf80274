//! RMSNorm (MODEL.md §5.5): `y = w · (x · rsqrt(mean(x²) + eps))`, computed in f32 with the
//! mean accumulated in f64 (canonical rule C2, §5.4); output rounded to bf16 upstream.

use super::numerics::Numerics;
use crate::checkpoint::Checkpoint;

/// `rsqrt(mean(x²) + eps)` with the sum of squares accumulated in f64 in index order.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn load(ckpt: &dyn Checkpoint, name: &str, eps: f32) -> crate::Result<RmsNorm> {
        Ok(RmsNorm {
            weight: ckpt.tensor_f32(name)?,
            eps,
        })
    }

    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// Normalise each `dim`-wide row of `x` in place.
    pub fn forward_inplace(&self, x: &mut [f32], numerics: Numerics) {
        for row in x.chunks_exact_mut(self.weight.len()) {
            let r = rms_scale(row, self.eps);
            for (v, w) in row.iter_mut().zip(&self.weight) {
                *v = *w * (*v * r);
            }
            numerics.round(row);
        }
    }
}
