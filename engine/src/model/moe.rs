//! Mixture of experts with a sqrt-softplus router (MODEL.md §6.5).
//!
//! Router in f32: `s = sqrt(softplus(W_gate · v))`; selection by `s + bias` (`bias_vl` for
//! image positions only), weights from the UNBIASED scores, renormalised with a literal
//! +1e-20, times `route_scale`. Experts: clamped SwiGLU with the routing weight applied
//! before `w2`. Routed terms are summed per token in ascending expert id, then the shared
//! expert is added.

use std::sync::Arc;

use super::defects::{Defect, DefectSet};
use super::linear::{Linear, LinearKind};
use super::numerics::Numerics;
use super::pool::{poolable, PoolVec};
use super::topk::{select, Selection};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::Result;

/// PyTorch softplus (β = 1, threshold 20), in f32; never underflows to 0 (§5.2).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (x.exp() as f64).ln_1p() as f32
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// One SwiGLU expert (`w1` gate, `w3` up, `w2` down).
pub struct Expert {
    w1: Linear,
    w2: Linear,
    w3: Linear,
    inter: usize,
}

impl Expert {
    fn load(
        ckpt: &Arc<dyn Checkpoint>,
        prefix: &str,
        kind: LinearKind,
        inter: usize,
    ) -> Result<Expert> {
        Ok(Expert {
            w1: Linear::load(ckpt, &format!("{prefix}w1.weight"), kind)?,
            w2: Linear::load(ckpt, &format!("{prefix}w2.weight"), kind)?,
            w3: Linear::load(ckpt, &format!("{prefix}w3.weight"), kind)?,
            inter,
        })
    }

    /// `w2(bf16(weight · SiLU(min(g, lim)) · clamp(up, ±lim)))` for `rows` rows of `x`.
    fn forward(
        &self,
        x: &[f32],
        rows: usize,
        weights: Option<&[f32]>,
        limit: Option<f32>,
        out: &mut [f32],
        numerics: Numerics,
    ) -> Result<()> {
        let mut g = PoolVec::filled(rows * self.inter, 0.0f32);
        let mut up = PoolVec::filled(rows * self.inter, 0.0f32);
        self.w1.forward(x, rows, &mut g, numerics)?;
        self.w3.forward(x, rows, &mut up, numerics)?;
        for t in 0..rows {
            let w = weights.map(|w| w[t]);
            for i in t * self.inter..(t + 1) * self.inter {
                let (mut gv, mut uv) = (g[i], up[i]);
                if let Some(lim) = limit {
                    uv = uv.clamp(-lim, lim);
                    gv = gv.min(lim);
                }
                let mut h = silu(gv) * uv;
                if let Some(w) = w {
                    h *= w;
                }
                g[i] = h;
            }
        }
        numerics.round(&mut g);
        self.w2.forward(&g, rows, out, numerics)
    }
}

/// Routing decision of one token.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Expert ids in selection order (selection key descending, ties → lower id).
    pub experts: PoolVec<usize>,
    /// Routing weights aligned with `experts`.
    pub weights: PoolVec<f32>,
    /// Selection margin of the routing decision (`topk::Selection::margin`).
    pub margin: f32,
}

poolable!(Route => ROUTES);

pub struct Moe {
    gate: Linear,
    bias: Vec<f32>,
    /// `gate.bias_vl`: the selection bias of image positions (present when the checkpoint
    /// has a vision tower, `routing_bias_vl`).
    bias_vl: Option<Vec<f32>>,
    experts: Vec<Expert>,
    shared: Expert,
    n_routed: usize,
    top_k: usize,
    route_scale: f32,
    swiglu_limit: f32,
    norm_topk_prob: bool,
    dim: usize,
}

impl Moe {
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize) -> Result<Moe> {
        Moe::load_at(ckpt, cfg, layer, &format!("layers.{layer}.ffn."))
    }

    /// The MoE of layer `layer` with tensors named `{p}...` (an MTP stage routes over its
    /// own expert counts, [`Config::moe_experts`]).
    pub fn load_at(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize, p: &str) -> Result<Moe> {
        let (n_routed, top_k) = cfg.moe_experts(layer);
        let bias = ckpt.tensor_f32(&format!("{p}gate.bias"))?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{p}gate.bias"),
            bias.len(),
            n_routed,
        )?;
        // Only image positions read it: a checkpoint without it runs text as before and
        // refuses images at routing time.
        let name = format!("{p}gate.bias_vl");
        let bias_vl = if cfg.routing_bias_vl && ckpt.contains(&name) {
            let v = ckpt.tensor_f32(&name)?;
            super::expect_len(ckpt.as_ref(), &name, v.len(), n_routed)?;
            Some(v)
        } else {
            None
        };
        let experts = (0..n_routed)
            .map(|e| {
                Expert::load(
                    ckpt,
                    &format!("{p}experts.{e}."),
                    LinearKind::Fp4,
                    cfg.moe_inter_dim,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Moe {
            gate: Linear::load(ckpt, &format!("{p}gate.weight"), LinearKind::F32)?,
            bias,
            bias_vl,
            experts,
            shared: Expert::load(
                ckpt,
                &format!("{p}shared_experts."),
                LinearKind::Fp8,
                cfg.moe_inter_dim,
            )?,
            n_routed,
            top_k,
            route_scale: cfg.route_scale,
            swiglu_limit: cfg.swiglu_limit,
            norm_topk_prob: cfg.norm_topk_prob,
            dim: cfg.dim,
        })
    }

    /// Route every row of `v` ([rows, dim]): text positions select with `gate.bias`, rows
    /// flagged in `image_rows` (empty: none) with `gate.bias_vl` (MODEL.md §6.5, §10.2).
    pub fn route(
        &self,
        v: &[f32],
        rows: usize,
        image_rows: &[bool],
        numerics: Numerics,
        defects: &DefectSet,
    ) -> Result<PoolVec<Route>> {
        let image_bias = if defects.has(Defect::GateBiasForImage) {
            &self.bias
        } else {
            match &self.bias_vl {
                Some(b) => b,
                None if image_rows.iter().any(|&i| i) => {
                    return Err(crate::Error::Model(
                        "image positions need `gate.bias_vl`, which this checkpoint lacks".into(),
                    ))
                }
                None => &self.bias,
            }
        };
        let mut logits = PoolVec::filled(rows * self.n_routed, 0.0f32);
        self.gate.forward(v, rows, &mut logits, numerics)?;
        let ties_reversed =
            defects.has(Defect::TopkTiesReversed) || defects.has(Defect::GateTiesReversed);
        logits
            .chunks_exact(self.n_routed)
            .enumerate()
            .map(|(t, l)| {
                let scores: PoolVec<f32> = l.iter().map(|&x| softplus(x).sqrt()).collect();
                let bias = if image_rows.get(t).copied().unwrap_or(false) {
                    image_bias
                } else {
                    &self.bias
                };
                let keys: PoolVec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                let Selection {
                    indices: experts,
                    margin,
                } = select(&keys, self.top_k, ties_reversed, "MoE router")?;
                let from = if defects.has(Defect::BiasInRoutingWeights) {
                    &keys
                } else {
                    &scores
                };
                let mut weights: PoolVec<f32> = experts.iter().map(|&e| from[e]).collect();
                if self.norm_topk_prob && self.top_k > 1 {
                    let sum = weights.iter().map(|&w| w as f64).sum::<f64>() as f32;
                    weights.iter_mut().for_each(|w| *w /= sum + 1e-20);
                }
                weights.iter_mut().for_each(|w| *w *= self.route_scale);
                Ok(Route {
                    experts,
                    weights,
                    margin,
                })
            })
            .collect()
    }

    /// `y = Σ_{e ascending} w_e · expert_e(v) + shared(v)` for every row; output rounded.
    pub fn forward(
        &self,
        v: &[f32],
        rows: usize,
        routes: &[Route],
        out: &mut [f32],
        numerics: Numerics,
        defects: &DefectSet,
    ) -> Result<()> {
        let d = self.dim;
        // A limit of 0 (`ModelArgs`' default) means no clamp: model.py clamps only when
        // `swiglu_limit > 0` (MODEL.md §6.5).
        let clamps = self.swiglu_limit > 0.0 && !defects.has(Defect::NoSwigluClamp);
        let limit = clamps.then_some(self.swiglu_limit);
        out.iter_mut().for_each(|y| *y = 0.0);
        // Batch the rows routed to each expert; the canonical linear is row-independent, so
        // this equals running each token alone (prefill == decode).
        for e in 0..self.n_routed {
            let (mut idx, mut w) = (PoolVec::<usize>::new(), PoolVec::<f32>::new());
            for (t, r) in routes.iter().enumerate() {
                if let Some(k) = r.experts.iter().position(|&x| x == e) {
                    idx.push(t);
                    w.push(r.weights[k]);
                }
            }
            if idx.is_empty() {
                continue;
            }
            let mut x = PoolVec::<f32>::new();
            for &t in &idx {
                x.extend_from_slice(&v[t * d..(t + 1) * d]);
            }
            let mut y = PoolVec::filled(idx.len() * d, 0.0f32);
            self.experts[e].forward(&x, idx.len(), Some(&w), limit, &mut y, numerics)?;
            for (i, &t) in idx.iter().enumerate() {
                for (o, a) in out[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[i * d..(i + 1) * d])
                {
                    *o += a;
                }
            }
        }
        let mut shared = PoolVec::filled(rows * d, 0.0f32);
        self.shared
            .forward(v, rows, None, limit, &mut shared, numerics)?;
        for (o, s) in out.iter_mut().zip(&shared) {
            *o += s;
        }
        numerics.round(out);
        Ok(())
    }
}
