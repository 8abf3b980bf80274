//! One backbone block with single-pass mHC and the staggered `pre` (MODEL.md §6.3).
//!
//! A block takes its input stream X ([rows, hc, dim]) and the incoming `pre` P ([rows, hc])
//! and returns its output stream Z and its outgoing `pre` (the FFN pre, computed from the
//! attention sublayer's output stream). This is also the unit of teacher-forced replay.

use std::sync::Arc;

use super::attention::Attention;
use super::cache::state::SessionState;
use super::defects::Defect;
use super::handoff::Handoff;
use super::hyper_connection::{collapse, expand, HcMix, HcSite};
use super::moe::{Moe, Route};
use super::norm::RmsNorm;
use super::pool::PoolVec;
use super::{Chunk, LayerCtx};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::Result;

pub struct Block {
    pub layer: usize,
    attn_norm: RmsNorm,
    ffn_norm: RmsNorm,
    hc_attn: HcSite,
    hc_ffn: HcSite,
    pub attn: Attention,
    pub moe: Moe,
    hc: usize,
    dim: usize,
}

/// What a block returns, with its sub-op outputs for the trace.
#[derive(Debug, Clone)]
pub struct BlockOutput {
    /// Z: the output stream [rows, hc, dim].
    pub stream: PoolVec<f32>,
    /// The outgoing `pre` [rows, hc] (this block's FFN pre).
    pub pre: PoolVec<f32>,
    /// Attention output after `wo_b`, before the expand [rows, dim].
    pub attn_out: PoolVec<f32>,
    /// The stream after the attention expand (FFN input stream) [rows, hc, dim].
    pub mid: PoolVec<f32>,
    /// MoE output before the expand [rows, dim].
    pub moe_out: PoolVec<f32>,
    pub routes: PoolVec<Route>,
}

impl Block {
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize) -> Result<Block> {
        Block::load_at(ckpt, cfg, layer, &format!("layers.{layer}."))
    }

    /// A block whose tensors are named `{p}...`: `layers.{layer}.` for the backbone,
    /// `mtp.{s}.` for DSpark stage s (layer id `n_layers + s`, MODEL.md §4.4).
    pub fn load_at(
        ckpt: &Arc<dyn Checkpoint>,
        cfg: &Config,
        layer: usize,
        p: &str,
    ) -> Result<Block> {
        Ok(Block {
            layer,
            attn_norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}attn_norm.weight"), cfg.norm_eps)?,
            ffn_norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}ffn_norm.weight"), cfg.norm_eps)?,
            hc_attn: HcSite::load(ckpt, p, "attn", cfg.hc_mult, cfg.hc_eps, cfg.norm_eps)?,
            hc_ffn: HcSite::load(ckpt, p, "ffn", cfg.hc_mult, cfg.hc_eps, cfg.norm_eps)?,
            attn: Attention::load_at(ckpt, cfg, layer, &format!("{p}attn."))?,
            moe: Moe::load_at(ckpt, cfg, layer, &format!("{p}ffn."))?,
            hc: cfg.hc_mult,
            dim: cfg.dim,
        })
    }

    /// Run the block on the chunk's rows.
    pub fn forward(
        &self,
        ctx: &LayerCtx,
        chunk: Chunk,
        x: &[f32],
        pre_in: &[f32],
        state: &mut SessionState,
        handoff: &mut Handoff,
    ) -> Result<BlockOutput> {
        self.forward_with(ctx, chunk.rows, x, pre_in, |u, out| {
            self.attn.forward(ctx, chunk, u, state, handoff, out)
        })
    }

    /// The block around a given attention: `attention(u, out)` maps the normed collapsed
    /// rows `u` [rows, dim] to the attention output `out` [rows, dim] (the backbone's CSA2
    /// attention, or a DSpark stage's draft attention).
    pub fn forward_with(
        &self,
        ctx: &LayerCtx,
        rows: usize,
        x: &[f32],
        pre_in: &[f32],
        attention: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
    ) -> Result<BlockOutput> {
        let (hc, d) = (self.hc, self.dim);
        let numerics = ctx.numerics;
        let staggered = !ctx.defects.has(Defect::PreNotStaggered);
        let iters = ctx.defects.sinkhorn_iters(ctx.cfg.hc_sinkhorn_iters);

        // Attention sublayer: coefficients from X, collapse with the incoming pre.
        let mix_a: PoolVec<HcMix> = self.hc_attn.coefficients(x, rows, iters, numerics)?;
        let mut u = PoolVec::filled(rows * d, 0.0f32);
        for t in 0..rows {
            let pre: &[f32] = if staggered {
                &pre_in[t * hc..(t + 1) * hc]
            } else {
                &mix_a[t].pre
            };
            collapse(
                &x[t * hc * d..(t + 1) * hc * d],
                pre,
                &mut u[t * d..(t + 1) * d],
                numerics,
            );
        }
        self.attn_norm.forward_inplace(&mut u, numerics);
        let mut attn_out = PoolVec::filled(rows * d, 0.0f32);
        attention(&u, &mut attn_out)?;
        let mut mid = PoolVec::filled(rows * hc * d, 0.0f32);
        for t in 0..rows {
            let span = t * hc * d..(t + 1) * hc * d;
            expand(
                &x[span.clone()],
                &attn_out[t * d..(t + 1) * d],
                &mix_a[t],
                &mut mid[span],
                numerics,
            );
        }

        // FFN sublayer: coefficients from Y, collapse with the attention pre.
        let mix_f: PoolVec<HcMix> = self.hc_ffn.coefficients(&mid, rows, iters, numerics)?;
        let mut v = PoolVec::filled(rows * d, 0.0f32);
        for t in 0..rows {
            let pre: &[f32] = if staggered {
                &mix_a[t].pre
            } else {
                &mix_f[t].pre
            };
            collapse(
                &mid[t * hc * d..(t + 1) * hc * d],
                pre,
                &mut v[t * d..(t + 1) * d],
                numerics,
            );
        }
        self.ffn_norm.forward_inplace(&mut v, numerics);
        let routes = self
            .moe
            .route(&v, rows, ctx.image_rows, numerics, ctx.defects)?;
        let mut moe_out = PoolVec::filled(rows * d, 0.0f32);
        self.moe
            .forward(&v, rows, &routes, &mut moe_out, numerics, ctx.defects)?;
        let mut stream = PoolVec::filled(rows * hc * d, 0.0f32);
        for t in 0..rows {
            let span = t * hc * d..(t + 1) * hc * d;
            expand(
                &mid[span.clone()],
                &moe_out[t * d..(t + 1) * d],
                &mix_f[t],
                &mut stream[span],
                numerics,
            );
        }
        let pre = mix_f.iter().flat_map(|m| m.pre.iter().copied()).collect();
        Ok(BlockOutput {
            stream,
            pre,
            attn_out,
            mid,
            moe_out,
            routes,
        })
    }
}
