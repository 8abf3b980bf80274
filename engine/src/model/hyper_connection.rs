//! Manifold hyper-connections, single pass with staggered `pre` (MODEL.md §5.8, §6.3).
//!
//! The stream is `hc` copies of width D. Each sublayer computes mixes from its input stream
//! (an f32 matvec of the rms-scaled flat stream), turns them into `pre`, `post` and a
//! doubly-stochastic `comb` with 20 Sinkhorn iterations, collapses the copies with the
//! *previous* sublayer's `pre`, and expands its output back with `post` and `comb`.
//! The 4-term sums are sequential in f32 (rule C3, §5.4).

use std::sync::Arc;

use super::linear::{Linear, LinearKind};
use super::norm::rms_scale;
use super::numerics::Numerics;
use super::pool::{poolable, PoolVec};
use crate::checkpoint::Checkpoint;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The coefficients of one sublayer for one token.
#[derive(Debug, Clone, PartialEq)]
pub struct HcMix {
    /// Collapse weights `pre[k]` (used by the NEXT sublayer's collapse).
    pub pre: PoolVec<f32>,
    /// Expand weights for the sublayer output.
    pub post: PoolVec<f32>,
    /// `comb[j * hc + k]`: weight of source copy j in destination copy k.
    pub comb: PoolVec<f32>,
}

poolable!(HcMix => HC_MIXES);

/// `hc_{site}_fn`, `hc_{site}_base`, `hc_{site}_scale` of one sublayer (site = attn | ffn).
pub struct HcSite {
    hc: usize,
    mix_fn: Linear,
    base: Vec<f32>,
    scale: Vec<f32>,
    eps: f32,
    norm_eps: f32,
}

impl HcSite {
    pub fn load(
        ckpt: &Arc<dyn Checkpoint>,
        prefix: &str,
        site: &str,
        hc: usize,
        hc_eps: f32,
        norm_eps: f32,
    ) -> crate::Result<HcSite> {
        let mix_fn = Linear::load(ckpt, &format!("{prefix}hc_{site}_fn"), LinearKind::F32)?;
        let base = ckpt.tensor_f32(&format!("{prefix}hc_{site}_base"))?;
        let scale = ckpt.tensor_f32(&format!("{prefix}hc_{site}_scale"))?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{prefix}hc_{site}_base"),
            base.len(),
            (2 + hc) * hc,
        )?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{prefix}hc_{site}_scale"),
            scale.len(),
            3,
        )?;
        Ok(HcSite {
            hc,
            mix_fn,
            base,
            scale,
            eps: hc_eps,
            norm_eps,
        })
    }

    /// Mixes and Sinkhorn for every token row of `stream` ([rows, hc, D]).
    pub fn coefficients(
        &self,
        stream: &[f32],
        rows: usize,
        iters: usize,
        numerics: Numerics,
    ) -> crate::Result<PoolVec<HcMix>> {
        let n_mix = (2 + self.hc) * self.hc;
        let mut mixes = PoolVec::filled(rows * n_mix, 0.0f32);
        // An f32 linear in both regimes (MODEL.md §4.8).
        self.mix_fn.forward(stream, rows, &mut mixes, numerics)?;
        let width = stream.len() / rows;
        Ok((0..rows)
            .map(|t| {
                let r = rms_scale(&stream[t * width..(t + 1) * width], self.norm_eps);
                let m: PoolVec<f32> = mixes[t * n_mix..(t + 1) * n_mix]
                    .iter()
                    .map(|v| v * r)
                    .collect();
                self.split_sinkhorn(&m, iters)
            })
            .collect())
    }

    /// `hc_split_sinkhorn` (§5.8), all f32.
    pub fn split_sinkhorn(&self, m: &[f32], iters: usize) -> HcMix {
        let hc = self.hc;
        let (s, b, eps) = (&self.scale, &self.base, self.eps);
        let pre = (0..hc).map(|k| sigmoid(m[k] * s[0] + b[k]) + eps).collect();
        let post = (0..hc)
            .map(|k| 2.0 * sigmoid(m[hc + k] * s[1] + b[hc + k]))
            .collect();
        let mut c: PoolVec<f32> = (0..hc * hc)
            .map(|i| m[2 * hc + i] * s[2] + b[2 * hc + i])
            .collect();
        // Row softmax, eps added after the division.
        for j in 0..hc {
            let row = &mut c[j * hc..(j + 1) * hc];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for v in row.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            for v in row.iter_mut() {
                *v = *v / sum + eps;
            }
        }
        normalise_columns(&mut c, hc, eps);
        for _ in 1..iters {
            normalise_rows(&mut c, hc, eps);
            normalise_columns(&mut c, hc, eps);
        }
        HcMix { pre, post, comb: c }
    }
}

fn normalise_rows(c: &mut [f32], hc: usize, eps: f32) {
    for j in 0..hc {
        let row = &mut c[j * hc..(j + 1) * hc];
        let mut sum = 0.0f32;
        for v in row.iter() {
            sum += *v;
        }
        for v in row.iter_mut() {
            *v /= sum + eps;
        }
    }
}

fn normalise_columns(c: &mut [f32], hc: usize, eps: f32) {
    for k in 0..hc {
        let mut sum = 0.0f32;
        for j in 0..hc {
            sum += c[j * hc + k];
        }
        for j in 0..hc {
            c[j * hc + k] /= sum + eps;
        }
    }
}

/// `u = Σ_k pre_k · X_k` (sequential f32), rounded at the sublayer boundary.
pub fn collapse(stream: &[f32], pre: &[f32], out: &mut [f32], numerics: Numerics) {
    let d = out.len();
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (k, w) in pre.iter().enumerate() {
            acc += w * stream[k * d + i];
        }
        *o = acc;
    }
    numerics.round(out);
}

/// `Y_k = post_k · a + Σ_j comb[j,k] · X_j` (sequential f32), rounded.
pub fn expand(stream: &[f32], a: &[f32], mix: &HcMix, out: &mut [f32], numerics: Numerics) {
    let d = a.len();
    let hc = mix.post.len();
    // Per element the same sequence as `acc = 0; acc += comb·s_j (j increasing); post·a + acc`,
    // written a whole row at a time so that the loops run over contiguous elements.
    for (k, o) in out.chunks_exact_mut(d).enumerate().take(hc) {
        o.fill(0.0);
        for (j, s) in stream.chunks_exact(d).enumerate().take(hc) {
            let c = mix.comb[j * hc + k];
            for (acc, &x) in o.iter_mut().zip(s) {
                *acc += c * x;
            }
        }
        for (acc, &x) in o.iter_mut().zip(a) {
            // `post·a + acc` in that operand order, as the definition writes it (the order
            // decides which NaN's payload survives when both are NaN).
            #[allow(clippy::assign_op_pattern)]
            {
                *acc = mix.post[k] * x + *acc;
            }
        }
    }
    numerics.round(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-at-a-time expansion gives, per element, the bits of the element-at-a-time
    /// definition (MODEL.md §5.4 C3: the four-term sums in f32, j increasing, from 0.0), signed
    /// zeros and both regimes included.
    #[test]
    fn expand_is_the_elementwise_definition() {
        let (hc, d) = (4, 37);
        let mut state = 9u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = ((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 3.0;
            match state % 11 {
                0 => 0.0,
                1 => -0.0,
                _ => v,
            }
        };
        let stream: Vec<f32> = (0..hc * d).map(|_| next()).collect();
        let a: Vec<f32> = (0..d).map(|_| next()).collect();
        let mix = HcMix {
            pre: (0..hc).map(|_| next()).collect(),
            post: (0..hc).map(|_| next()).collect(),
            comb: (0..hc * hc).map(|_| next()).collect(),
        };
        for numerics in [Numerics::Upstream, Numerics::Exact] {
            let mut want = vec![0f32; hc * d];
            for k in 0..hc {
                for i in 0..d {
                    let mut acc = 0.0f32;
                    for j in 0..hc {
                        acc += mix.comb[j * hc + k] * stream[j * d + i];
                    }
                    want[k * d + i] = mix.post[k] * a[i] + acc;
                }
            }
            numerics.round(&mut want);
            let mut got = vec![f32::NAN; hc * d];
            expand(&stream, &a, &mix, &mut got, numerics);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{numerics}");
        }
    }
}
