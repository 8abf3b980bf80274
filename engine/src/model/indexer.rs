//! Lightning indexer and the two-level top-k (MODEL.md §6.4.4, §6.4.6).
//!
//! Index keys come from the KV source's pre-rope latent (`k_norm(wk(latent))`, roped at the
//! group's first position, FP4/E8M0-QDQ'd upstream). Queries come from `qr` (`wq_b`, roped,
//! FP4/E8M0-QDQ'd per head). `score[t] = Σ_h relu(iq_h · key_t) · w_h`, a bf16 number
//! upstream. The candidate source turns its scores into candidate blocks (with the newest
//! reachable block pinned); index sources after it mask their scores to those blocks.

use std::sync::Arc;

use rayon::prelude::*;

use super::compressor::Emitted;
use super::defects::{Defect, DefectSet};
use super::linear::{Linear, LinearKind};
use super::norm::RmsNorm;
use super::numerics::Numerics;
use super::pool::PoolVec;
use super::quant;
use super::rope::Rope;
use super::topk::topk;
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::Result;

/// Index-key projection of an index-key owner (a KV source).
pub struct IndexKeyProj {
    wk: Linear,
    k_norm: RmsNorm,
}

pub struct Indexer {
    n_heads: usize,
    head_dim: usize,
    wq_b: Linear,
    weights_proj: Linear,
    /// `index_head_dim^-½ · index_n_heads^-½` as an f32 (1/64 in the release).
    weight_scale: f32,
    keys: Option<IndexKeyProj>,
}

impl Indexer {
    pub fn load(
        ckpt: &Arc<dyn Checkpoint>,
        cfg: &Config,
        layer: usize,
        owner: bool,
    ) -> Result<Indexer> {
        let p = format!("layers.{layer}.attn.indexer.");
        let keys = if owner {
            Some(IndexKeyProj {
                wk: Linear::load(ckpt, &format!("{p}wk.weight"), LinearKind::Bf16)?,
                k_norm: RmsNorm::load(ckpt.as_ref(), &format!("{p}k_norm.weight"), cfg.norm_eps)?,
            })
        } else {
            None
        };
        let scale = (cfg.index_head_dim as f64).powf(-0.5) * (cfg.index_n_heads as f64).powf(-0.5);
        Ok(Indexer {
            n_heads: cfg.index_n_heads,
            head_dim: cfg.index_head_dim,
            wq_b: Linear::load(ckpt, &format!("{p}wq_b.weight"), LinearKind::Fp8)?,
            weights_proj: Linear::load(ckpt, &format!("{p}weights_proj.weight"), LinearKind::Bf16)?,
            weight_scale: scale as f32,
            keys,
        })
    }

    pub fn is_owner(&self) -> bool {
        self.keys.is_some()
    }

    /// Index keys of freshly emitted latents ([n, index_head_dim], in `emitted` order).
    pub fn keys(
        &self,
        emitted: &[Emitted],
        ratio: usize,
        rope: &Rope,
        numerics: Numerics,
        ties: quant::Fp4Ties,
    ) -> Result<PoolVec<f32>> {
        let proj = self.keys.as_ref().ok_or_else(|| {
            crate::Error::Model("indexer without key projection asked for keys".into())
        })?;
        let n = emitted.len();
        let x: PoolVec<f32> = emitted
            .iter()
            .flat_map(|e| e.latent.iter().copied())
            .collect();
        let mut k = PoolVec::filled(n * self.head_dim, 0.0f32);
        proj.wk.forward(&x, n, &mut k, numerics)?;
        proj.k_norm.forward_inplace(&mut k, numerics);
        for (row, e) in k.chunks_exact_mut(self.head_dim).zip(emitted) {
            rope.rotate(row, self.head_dim, e.index * ratio, false, numerics);
            if numerics == Numerics::Upstream {
                quant::fp4_qdq_e8m0_ties(row, ties);
            }
        }
        Ok(k)
    }

    /// Per-row queries [rows, heads, head_dim] and head weights [rows, heads].
    #[allow(clippy::too_many_arguments)]
    pub fn queries(
        &self,
        qr: &[f32],
        u: &[f32],
        rows: usize,
        start: usize,
        rope: &Rope,
        numerics: Numerics,
        ties: quant::Fp4Ties,
    ) -> Result<(PoolVec<f32>, PoolVec<f32>)> {
        let w_q = self.n_heads * self.head_dim;
        let mut iq = PoolVec::filled(rows * w_q, 0.0f32);
        self.wq_b.forward(qr, rows, &mut iq, numerics)?;
        for (t, row) in iq.chunks_exact_mut(w_q).enumerate() {
            rope.rotate(row, self.head_dim, start + t, false, numerics);
            if numerics == Numerics::Upstream {
                for head in row.chunks_exact_mut(self.head_dim) {
                    quant::fp4_qdq_e8m0_ties(head, ties);
                }
            }
        }
        let mut w = PoolVec::filled(rows * self.n_heads, 0.0f32);
        self.weights_proj.forward(u, rows, &mut w, numerics)?;
        for v in w.iter_mut() {
            *v = numerics.round1(*v * self.weight_scale);
        }
        Ok((iq, w))
    }

    /// `score[t] = Σ_h relu(iq_h · key_t) · w_h` for t < n (keys [≥n, head_dim]).
    pub fn scores(
        &self,
        iq: &[f32],
        w: &[f32],
        keys: &[f32],
        n: usize,
        numerics: Numerics,
    ) -> PoolVec<f32> {
        let hd = self.head_dim;
        let mut scores = PoolVec::filled(n, 0.0f32);
        scores.par_iter_mut().enumerate().for_each(|(t, score)| {
            let key = &keys[t * hd..(t + 1) * hd];
            let mut acc = 0.0f64;
            for h in 0..self.n_heads {
                let q = &iq[h * hd..(h + 1) * hd];
                let dot: f64 = q.iter().zip(key).map(|(a, b)| *a as f64 * *b as f64).sum();
                let dot = numerics.round1(dot as f32).max(0.0);
                acc += numerics.round1(dot * w[h]) as f64;
            }
            *score = numerics.round1(acc as f32);
        });
        scores
    }
}

/// Candidate blocks of the candidate source for one query (§6.4.6): `scores` over the
/// chunk's `compress_len` positions (causally masked), `visible` = compressed positions the
/// query can reach. Returns a mask over the positions.
pub fn candidate_mask(
    scores: &[f32],
    visible: usize,
    block: usize,
    keep: usize,
    defects: &DefectSet,
) -> Result<PoolVec<bool>> {
    let n = scores.len();
    let n_blocks = n.div_ceil(block);
    let mut block_scores: PoolVec<f32> = (0..n_blocks)
        .map(|b| {
            scores[b * block..n.min((b + 1) * block)]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    if visible > 0 && !defects.has(Defect::CandidatePinMissing) {
        block_scores[(visible - 1) / block] = f32::INFINITY;
    }
    let kept = topk(
        &block_scores,
        keep.min(n_blocks),
        defects.has(Defect::TopkTiesReversed),
        "candidate blocks",
    )?;
    let mut mask = PoolVec::filled(n, false);
    for &b in kept.iter() {
        if block_scores[b] == f32::NEG_INFINITY {
            continue;
        }
        for m in &mut mask[b * block..n.min((b + 1) * block)] {
            *m = true;
        }
    }
    Ok(mask)
}

/// Index selection for one query (§6.4.4): the `k` highest scores (tie rule), ascending,
/// with positions the query cannot see (`t ≥ visible`) mapped to −1.
pub fn select(
    scores: &[f32],
    k: usize,
    visible: usize,
    defects: &DefectSet,
) -> Result<PoolVec<i64>> {
    let mut chosen = topk(
        scores,
        k,
        defects.has(Defect::TopkTiesReversed),
        "index selection",
    )?;
    chosen.sort_unstable();
    Ok(chosen
        .iter()
        .map(|&t| if t < visible { t as i64 } else { -1 })
        .collect())
}
