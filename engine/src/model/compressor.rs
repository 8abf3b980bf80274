//! KV compressor of a KV source (MODEL.md §6.4.3, §7.2).
//!
//! Ratio 1: one latent per token, `norm(wkv(u))` (BF16 linear). Ratio 2: tokens are grouped
//! by absolute position {2j, 2j+1}; the f32 kv rows of a group are pooled with a softmax of
//! the f32 gate rows taken over the group members independently per channel, then cast to
//! bf16 (upstream) and normed. Entry j is emitted when token `j·r + r − 1` is processed; its
//! rope position is j·r. Tokens are fed one at a time through the open-group state, which is
//! exactly what a prefill of complete groups computes, so prefill and decode agree.

use std::sync::Arc;

use super::cache::state::CompressedState;
use super::linear::{Linear, LinearKind};
use super::norm::RmsNorm;
use super::numerics::Numerics;
use super::pool::{poolable, PoolVec};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::Result;

pub struct Compressor {
    ratio: usize,
    head_dim: usize,
    wkv: Linear,
    wgate: Option<Linear>,
    norm: RmsNorm,
}

/// A latent emitted in this forward, before rope and quantisation.
pub struct Emitted {
    /// Compressed index j.
    pub index: usize,
    /// Normed latent (pre-rope, pre-quant): what the indexer turns into a key.
    pub latent: PoolVec<f32>,
}

poolable!(Emitted => EMITTED);

impl Compressor {
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize) -> Result<Compressor> {
        let p = format!("layers.{layer}.attn.compressor.");
        let ratio = cfg.compress_ratios[layer];
        // Ratio-2 projections are promoted to f32 at load; ratio 1 stays a BF16 linear (§4.7).
        let kind = if ratio > 1 {
            LinearKind::F32
        } else {
            LinearKind::Bf16
        };
        Ok(Compressor {
            ratio,
            head_dim: cfg.head_dim,
            wkv: Linear::load(ckpt, &format!("{p}wkv.weight"), kind)?,
            wgate: if ratio > 1 {
                Some(Linear::load(ckpt, &format!("{p}wgate.weight"), kind)?)
            } else {
                None
            },
            norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}norm.weight"), cfg.norm_eps)?,
        })
    }

    pub fn ratio(&self) -> usize {
        self.ratio
    }

    /// Feed the chunk's rows `u` ([rows, dim], positions start..start+rows) through the
    /// compressor; returns the latents emitted, in index order.
    pub fn push(
        &self,
        u: &[f32],
        rows: usize,
        start: usize,
        state: &mut CompressedState,
        numerics: Numerics,
    ) -> Result<PoolVec<Emitted>> {
        let dh = self.head_dim;
        let mut kv = PoolVec::filled(rows * dh, 0.0f32);
        self.wkv.forward(u, rows, &mut kv, numerics)?;
        let mut out = PoolVec::new();
        if self.ratio == 1 {
            self.norm.forward_inplace(&mut kv, numerics);
            for t in 0..rows {
                out.push(Emitted {
                    index: start + t,
                    latent: PoolVec::from_slice(&kv[t * dh..(t + 1) * dh]),
                });
            }
            return Ok(out);
        }
        let r = self.ratio;
        let mut score = PoolVec::filled(rows * dh, 0.0f32);
        if let Some(g) = &self.wgate {
            g.forward(u, rows, &mut score, numerics)?;
        }
        for t in 0..rows {
            let p = start + t;
            let slot = p % r;
            state.group_kv[slot * dh..(slot + 1) * dh].copy_from_slice(&kv[t * dh..(t + 1) * dh]);
            state.group_score[slot * dh..(slot + 1) * dh]
                .copy_from_slice(&score[t * dh..(t + 1) * dh]);
            if !(p + 1).is_multiple_of(r) {
                continue;
            }
            let mut latent = PoolVec::filled(dh, 0.0f32);
            for (c, l) in latent.iter_mut().enumerate() {
                let max = (0..r)
                    .map(|s| state.group_score[s * dh + c])
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for s in 0..r {
                    sum += (state.group_score[s * dh + c] - max).exp();
                }
                let mut acc = 0.0f32;
                for s in 0..r {
                    let w = (state.group_score[s * dh + c] - max).exp() / sum;
                    acc += state.group_kv[s * dh + c] * w;
                }
                *l = acc;
            }
            // The group is consumed: the next one starts empty.
            state.group_kv.iter_mut().for_each(|v| *v = 0.0);
            state
                .group_score
                .iter_mut()
                .for_each(|v| *v = f32::NEG_INFINITY);
            numerics.round(&mut latent);
            self.norm.forward_inplace(&mut latent, numerics);
            out.push(Emitted {
                index: p / r,
                latent,
            });
        }
        Ok(out)
    }
}
