//! CSA2 attention (MODEL.md §6.4): query low-rank path, window ring, compressor and indexer
//! of source layers, one joint sparse softmax with a per-head sink, inverse rope, grouped
//! low-rank output projection.

use std::sync::Arc;

use super::cache::state::SessionState;
use super::compressor::Compressor;
use super::defects::Defect;
use super::handoff::Handoff;
use super::indexer::Indexer;
use super::linear::{Linear, LinearKind};
use super::norm::{rms_scale, RmsNorm};
use super::numerics::Numerics;
use super::parallel::{try_for_each_chunk, worth_parallel};
use super::pool::PoolVec;
use super::quant;
use super::sparse_attention::sparse_attention;
use super::{Chunk, LayerCtx};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::{Error, Result};

/// `wo_a` (§6.4.7): group g maps heads `g·H/G .. (g+1)·H/G` (concatenated) through rows
/// `g·rank .. (g+1)·rank`. A BF16 matmul: f64 accumulation (rule C2), bf16 out upstream.
/// Rows are decoded on the fly from the mapped checkpoint.
pub struct GroupedOutput {
    linear: Linear,
    groups: usize,
    rank: usize,
}

impl GroupedOutput {
    fn load(ckpt: &Arc<dyn Checkpoint>, name: &str, cfg: &Config) -> Result<GroupedOutput> {
        let group_width = cfg.n_heads / cfg.o_groups * cfg.head_dim;
        super::expect_shape(
            ckpt.as_ref(),
            name,
            &[cfg.o_groups * cfg.o_lora_rank, group_width],
        )?;
        Ok(GroupedOutput {
            linear: Linear::load(ckpt, name, LinearKind::Bf16)?,
            groups: cfg.o_groups,
            rank: cfg.o_lora_rank,
        })
    }

    fn forward(&self, o: &[f32], rows: usize, z: &mut [f32], numerics: Numerics) -> Result<()> {
        self.linear
            .forward_grouped(o, rows, self.groups, z, numerics)
    }
}

pub struct Attention {
    layer: usize,
    ratio: usize,
    n_heads: usize,
    head_dim: usize,
    q_lora: usize,
    window: usize,
    norm_eps: f32,
    wq_a: Linear,
    q_norm: RmsNorm,
    wq_b: Linear,
    wkv: Linear,
    kv_norm: RmsNorm,
    wo_a: GroupedOutput,
    wo_b: Linear,
    sink: Vec<f32>,
    pub compressor: Option<Compressor>,
    pub indexer: Option<Indexer>,
    /// The KV source whose compressed cache this layer attends (ratio > 0).
    kv_source: Option<usize>,
}

impl Attention {
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize) -> Result<Attention> {
        Attention::load_at(ckpt, cfg, layer, &format!("layers.{layer}.attn."))
    }

    /// The attention of layer `layer` with tensors named `{p}...`.
    pub fn load_at(
        ckpt: &Arc<dyn Checkpoint>,
        cfg: &Config,
        layer: usize,
        p: &str,
    ) -> Result<Attention> {
        let ratio = cfg.compress_ratios[layer];
        let kv_source = if ratio > 0 {
            super::roles::most_recent(&cfg.kv_source_layers, layer)
        } else {
            None
        };
        if ratio > 0 && kv_source.is_none() {
            return Err(Error::Config {
                field: "kv_source_layers".into(),
                rule: format!("layer {layer} has ratio {ratio} but no KV source at or below it"),
            });
        }
        // MTP stages never compress or index, whatever the source lists say (model.py).
        let backbone = layer < cfg.n_layers;
        let is_kv_source = backbone && cfg.kv_source_layers.contains(&layer);
        let is_index_source = backbone && cfg.index_source_layers.contains(&layer);
        let sink = ckpt.tensor_f32(&format!("{p}attn_sink"))?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{p}attn_sink"),
            sink.len(),
            cfg.n_heads,
        )?;
        Ok(Attention {
            layer,
            ratio,
            n_heads: cfg.n_heads,
            head_dim: cfg.head_dim,
            q_lora: cfg.q_lora_rank,
            window: cfg.window_size,
            norm_eps: cfg.norm_eps,
            wq_a: Linear::load(ckpt, &format!("{p}wq_a.weight"), LinearKind::Fp8)?,
            q_norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}q_norm.weight"), cfg.norm_eps)?,
            wq_b: Linear::load(ckpt, &format!("{p}wq_b.weight"), LinearKind::Fp8)?,
            wkv: Linear::load(ckpt, &format!("{p}wkv.weight"), LinearKind::Fp8)?,
            kv_norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}kv_norm.weight"), cfg.norm_eps)?,
            wo_a: GroupedOutput::load(ckpt, &format!("{p}wo_a.weight"), cfg)?,
            wo_b: Linear::load(ckpt, &format!("{p}wo_b.weight"), LinearKind::Fp8)?,
            sink,
            compressor: if is_kv_source {
                Some(Compressor::load(ckpt, cfg, layer)?)
            } else {
                None
            },
            indexer: if is_index_source {
                Some(Indexer::load(ckpt, cfg, layer, is_kv_source)?)
            } else {
                None
            },
            kv_source,
        })
    }

    /// Attention of the chunk's rows `u` ([rows, dim], normed). Updates this layer's state
    /// (window ring, compressed caches) and the hand-off; writes `out` ([rows, dim]).
    pub fn forward(
        &self,
        ctx: &LayerCtx,
        chunk: Chunk,
        u: &[f32],
        state: &mut SessionState,
        handoff: &mut Handoff,
        out: &mut [f32],
    ) -> Result<()> {
        let (rows, nh, dh) = (chunk.rows, self.n_heads, self.head_dim);
        let numerics = ctx.numerics;
        let upstream = numerics == Numerics::Upstream;
        let fp4_ties = quant::Fp4Ties::for_defects(ctx.defects);

        // §6.4.1 query path, §6.4.2 window key of every row.
        let (qr, q) = self.queries(ctx, u, rows, chunk.start)?;
        let kv = self.window_keys(ctx, u, rows, chunk.start)?;

        // §6.4.3 compressor and the owner's index keys (§6.4.4), then publish (§8).
        if let Some(comp) = &self.compressor {
            let cache = state.layers[self.layer]
                .compressed
                .as_mut()
                .ok_or_else(|| {
                    Error::Model(format!(
                        "layer {}: KV source without a compressed cache",
                        self.layer
                    ))
                })?;
            let emitted = comp.push(u, rows, chunk.start, cache, numerics)?;
            if let Some(first) = emitted.first() {
                if first.index != cache.len() {
                    return Err(Error::Model(format!(
                        "layer {}: compressed entry {} emitted with {} entries cached",
                        self.layer,
                        first.index,
                        cache.len()
                    )));
                }
            }
            if let Some(ix) = self.indexer.as_ref().filter(|ix| ix.is_owner()) {
                let keys = ix.keys(&emitted, self.ratio, ctx.rope, numerics, fp4_ties)?;
                cache.index_keys.extend(&keys);
            }
            for e in emitted.iter() {
                let mut latent = e.latent.clone();
                ctx.rope
                    .rotate(&mut latent, dh, e.index * self.ratio, false, numerics);
                if upstream {
                    quant::fp4_qdq_e4m3_ties(&mut latent, fp4_ties);
                }
                cache.latents.extend_from_slice(&latent);
            }
            let owner = self.indexer.as_ref().is_some_and(|ix| ix.is_owner());
            if owner && ctx.index_k.owner_publishes(!emitted.is_empty()) {
                state.published_index_k = Some(self.layer);
            }
        }

        // §6.4.4 indexer: selection for this layer and the layers reusing it.
        if let Some(ix) = &self.indexer {
            ix.select(ctx, self.layer, self.ratio, chunk, &qr, u, state, handoff)?;
        }

        // §6.4.7 core attention: one joint softmax over window + compressed entries.
        let compressed = match self.kv_source {
            Some(src) => Some(state.layers[src].compressed.as_ref().ok_or_else(|| {
                Error::Model(format!("layer {src}: KV source without a compressed cache"))
            })?),
            None => None,
        };
        let ring = &state.layers[self.layer].window;
        let sink = self.sink(ctx);
        let scale = (dh as f64).powf(-0.5) as f32;
        let mut o = PoolVec::filled(rows * nh * dh, 0.0f32);
        let w = self.window;
        let total = chunk.total();
        // Rows in parallel in a prefill; one decode row runs here (its heads may still
        // spread over the pool in `sparse_attention`).
        let selected = match compressed {
            Some(_) => handoff.topk.first().map_or(0, |v| v.len()),
            None => 0,
        };
        let parallel = rows > 1 && worth_parallel(rows * (total.min(w) + selected) * nh * dh);
        try_for_each_chunk(&mut o, nh * dh, parallel, |t, o_row| {
            let p = chunk.start + t;
            // Window list in the upstream layout (§5.7): decode = ring slots oldest
            // first, −1 at the front; prefill = min(T, W) entries ascending, −1 at the end.
            let window_list: PoolVec<i64> = if chunk.decode_layout() {
                (0..w)
                    .map(|i| p as i64 - w as i64 + 1 + i as i64)
                    .map(|q| q.max(-1))
                    .collect()
            } else {
                let first = (p + 1).saturating_sub(w);
                (0..total.min(w))
                    .map(|i| first + i)
                    .map(|q| if q > p { -1 } else { q as i64 })
                    .collect()
            };
            let comp_list: &[i64] = match compressed {
                Some(_) => handoff.topk.get(t).map(|v| v.as_slice()).unwrap_or(&[]),
                None => &[],
            };
            let n = window_list.len() + comp_list.len();
            let mut kv_buf = PoolVec::filled(n * dh, 0.0f32);
            let mut idx = PoolVec::filled(n, -1i64);
            for (i, &q) in window_list.iter().enumerate() {
                if q < 0 {
                    continue;
                }
                let q = q as usize;
                let src = if q >= chunk.start {
                    &kv[(q - chunk.start) * dh..(q - chunk.start + 1) * dh]
                } else {
                    &ring[(q % w) * dh..(q % w + 1) * dh]
                };
                kv_buf[i * dh..(i + 1) * dh].copy_from_slice(src);
                idx[i] = i as i64;
            }
            if let Some(cache) = compressed {
                for (i, &j) in comp_list.iter().enumerate() {
                    if j < 0 {
                        continue;
                    }
                    let slot = window_list.len() + i;
                    let j = j as usize;
                    if j >= cache.len() {
                        return Err(Error::Model(format!(
                            "layer {}: selected compressed entry {j} but the cache holds {}",
                            self.layer,
                            cache.len()
                        )));
                    }
                    kv_buf[slot * dh..(slot + 1) * dh].copy_from_slice(cache.latent(j));
                    idx[slot] = slot as i64;
                }
            }
            sparse_attention(
                &q[t * nh * dh..(t + 1) * nh * dh],
                &kv_buf,
                &sink,
                &idx,
                scale,
                numerics,
                o_row,
            )
        })?;

        // The ring keeps the newest W keys: slot p mod W.
        let ring = &mut state.layers[self.layer].window;
        for t in rows.saturating_sub(w)..rows {
            let slot = (chunk.start + t) % w;
            ring[slot * dh..(slot + 1) * dh].copy_from_slice(&kv[t * dh..(t + 1) * dh]);
        }

        self.project_output(ctx, &mut o, rows, chunk.start, out)
    }

    /// §6.4.1: the normed low-rank query `qr` [rows, q_lora] and the roped queries
    /// [rows, heads, head_dim] of rows at positions `start ..`.
    pub(super) fn queries(
        &self,
        ctx: &LayerCtx,
        u: &[f32],
        rows: usize,
        start: usize,
    ) -> Result<(PoolVec<f32>, PoolVec<f32>)> {
        let (nh, dh, numerics) = (self.n_heads, self.head_dim, ctx.numerics);
        let mut qr = PoolVec::filled(rows * self.q_lora, 0.0f32);
        self.wq_a.forward(u, rows, &mut qr, numerics)?;
        self.q_norm.forward_inplace(&mut qr, numerics);
        let mut q = PoolVec::filled(rows * nh * dh, 0.0f32);
        self.wq_b.forward(&qr, rows, &mut q, numerics)?;
        if ctx.defects.has(Defect::PerHeadQueryNorm) {
            for head in q.chunks_exact_mut(dh) {
                let r = rms_scale(head, self.norm_eps);
                head.iter_mut().for_each(|v| *v *= r);
                numerics.round(head);
            }
        }
        for (t, row) in q.chunks_exact_mut(nh * dh).enumerate() {
            ctx.rope.rotate(row, dh, start + t, false, numerics);
        }
        Ok((qr, q))
    }

    /// §6.4.2: the window key of every row, [rows, head_dim]: `kv_norm(wkv u)` roped at its
    /// position, FP8 fake-quantised over the whole vector upstream.
    pub(super) fn window_keys(
        &self,
        ctx: &LayerCtx,
        u: &[f32],
        rows: usize,
        start: usize,
    ) -> Result<PoolVec<f32>> {
        let (dh, numerics) = (self.head_dim, ctx.numerics);
        let mut kv = PoolVec::filled(rows * dh, 0.0f32);
        self.wkv.forward(u, rows, &mut kv, numerics)?;
        self.kv_norm.forward_inplace(&mut kv, numerics);
        for (t, row) in kv.chunks_exact_mut(dh).enumerate() {
            ctx.rope.rotate(row, dh, start + t, false, numerics);
            if numerics == Numerics::Upstream {
                quant::act_quant_fp8_inplace(row);
            }
        }
        Ok(kv)
    }

    /// §6.4.7 after the softmax: inverse rope of the attention output `o` [rows, heads,
    /// head_dim] at positions `start ..`, then the grouped low-rank projection into `out`.
    pub(super) fn project_output(
        &self,
        ctx: &LayerCtx,
        o: &mut [f32],
        rows: usize,
        start: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (nh, dh, numerics) = (self.n_heads, self.head_dim, ctx.numerics);
        if !ctx.defects.has(Defect::NoInverseRope) {
            for (t, row) in o.chunks_exact_mut(nh * dh).enumerate() {
                ctx.rope.rotate(row, dh, start + t, true, numerics);
            }
        }
        let mut z = PoolVec::filled(rows * self.wo_a.groups * self.wo_a.rank, 0.0f32);
        self.wo_a.forward(o, rows, &mut z, numerics)?;
        self.wo_b.forward(&z, rows, out, numerics)
    }

    /// The per-head sink logits (−∞ under the no-sink defect: the sink never joins).
    pub(super) fn sink(&self, ctx: &LayerCtx) -> PoolVec<f32> {
        if ctx.defects.has(Defect::NoAttentionSink) {
            PoolVec::filled(self.n_heads, f32::NEG_INFINITY)
        } else {
            PoolVec::from_slice(&self.sink)
        }
    }

    pub(super) fn heads(&self) -> (usize, usize) {
        (self.n_heads, self.head_dim)
    }

    pub(super) fn window(&self) -> usize {
        self.window
    }
}
