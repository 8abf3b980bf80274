//! The vision tower and aligner (MODEL.md §10.2) in both numerics profiles. `Upstream` is what
//! the official `inference/vision.py` computes with torch's bf16 default dtype: every tensor
//! torch holds in bf16 is rounded to bf16 here at the same point (linear outputs, rope,
//! attention, SiLU·up, residual sums, norms); `Exact` rounds nothing (the official code under
//! an f32 default dtype). Reductions are the project's canonical ones (f64 in index order,
//! MODEL.md §5.4 C2), so results agree with torch to rounding, not bit for bit.
//!
//! * ViT: `patch_embed` (Linear 588 → dim), blocks of pre-norm attention with a 2-D
//!   split-halves rope (head dims `[0, hd/2)` rotate by row·f_i for the first hd/4 frequencies
//!   and col·f_i for the rest, paired with dims `[hd/2, hd)`), bidirectional softmax attention
//!   (scale 1/√hd; as torch's bf16 CPU kernel, the exponentials weighting v are bf16), a
//!   SiLU-gated MLP (`w1` = [gate; up], no biases), a final RMSNorm (eps 1e-6,
//!   f32 weight);
//! * aligner: the `[n_h, n_w, dim]` grid zero-padded bottom/right to multiples of r, cut in
//!   r×r cells in row-major order, each flattened as (channel, kh, kw) → Linear → erf-GELU →
//!   Linear.

use super::preprocess::ImagePatches;
use crate::checkpoint::Checkpoint;
use crate::config::VisionConfig;
use crate::model::numerics::{dot_f64_wide, mean_sq_f64};
use crate::model::Numerics;
use crate::{Error, Result};

const NORM_EPS: f32 = 1e-6;

/// A dense linear layer `y = x Wᵀ + b`, weights as f32 values (bf16 in the checkpoint).
pub struct VisionLinear {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl VisionLinear {
    /// Rows of `x` ([n, in]) → [n, out], each output rounded once (the bias is added before
    /// the rounding, as torch's fused addmm does).
    fn forward(&self, x: &[f32], num: Numerics) -> Vec<f32> {
        let n = x.len() / self.in_dim;
        let mut y = Vec::with_capacity(n * self.out_dim);
        for row in x.chunks_exact(self.in_dim) {
            for (o, w) in self.weight.chunks_exact(self.in_dim).enumerate() {
                let bias = self.bias.as_ref().map_or(0.0, |b| f64::from(b[o]));
                y.push(num.round1((dot_f64_wide(row, w) + bias) as f32));
            }
        }
        y
    }
}

pub struct VisionBlock {
    pub norm1: Vec<f32>,
    pub wqkv: VisionLinear,
    pub wo: VisionLinear,
    pub norm2: Vec<f32>,
    pub w1: VisionLinear,
    pub w2: VisionLinear,
}

pub struct VisionTower {
    pub config: VisionConfig,
    pub numerics: Numerics,
    pub patch_embed: VisionLinear,
    pub blocks: Vec<VisionBlock>,
    pub norm: Vec<f32>,
    pub aligner_w1: VisionLinear,
    pub aligner_w2: VisionLinear,
}

/// The tower's outputs: the patch embedding and each block's output `[n, dim]`, the final
/// norm's, the aligner's `[cells, llm_dim]`.
#[derive(Debug, Clone)]
pub struct TowerOutput {
    pub embed: Vec<f32>,
    pub blocks: Vec<Vec<f32>>,
    pub vit: Vec<f32>,
    pub aligner: Vec<f32>,
}

fn rms_norm(x: &[f32], weight: &[f32], num: Numerics) -> Vec<f32> {
    let dim = weight.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(dim) {
        let r = 1.0 / (mean_sq_f64(row) + NORM_EPS).sqrt();
        out.extend(row.iter().zip(weight).map(|(v, w)| num.round1(w * (v * r))));
    }
    out
}

impl VisionTower {
    /// Read the tower by its release names (`vision.*`, `aligner.*`; MODEL.md §4.4) from
    /// `tensor(name) -> f32 values`; `llm_dim` is the language model's width.
    pub fn load(
        config: &VisionConfig,
        llm_dim: usize,
        numerics: Numerics,
        tensor: impl Fn(&str) -> Result<Vec<f32>>,
    ) -> Result<VisionTower> {
        let (dim, inter) = (config.dim, config.inter_dim);
        // Heads split the width, and each head's rope pairs halves that split again into rows
        // and columns.
        if config.n_heads == 0
            || !dim.is_multiple_of(config.n_heads)
            || !(dim / config.n_heads).is_multiple_of(4)
        {
            return Err(Error::Config {
                field: "vision_config.num_attention_heads".into(),
                rule: format!(
                    "{} heads must split hidden_size {dim} into heads of a multiple of 4 dims",
                    config.n_heads
                ),
            });
        }
        let patch = 3 * config.patch_size * config.patch_size;
        let cell = dim * config.downsample_ratio * config.downsample_ratio;
        let read = |name: &str, len: usize| -> Result<Vec<f32>> {
            let v = tensor(name)?;
            if v.len() != len {
                return Err(Error::Model(format!(
                    "vision tensor `{name}`: {} values, expected {len}",
                    v.len()
                )));
            }
            Ok(v)
        };
        let linear =
            |name: &str, out_dim: usize, in_dim: usize, bias: bool| -> Result<VisionLinear> {
                Ok(VisionLinear {
                    weight: read(&format!("{name}.weight"), out_dim * in_dim)?,
                    bias: if bias {
                        Some(read(&format!("{name}.bias"), out_dim)?)
                    } else {
                        None
                    },
                    out_dim,
                    in_dim,
                })
            };
        let blocks = (0..config.n_layers)
            .map(|b| {
                let p = format!("vision.blocks.{b}");
                Ok(VisionBlock {
                    norm1: read(&format!("{p}.norm1.weight"), dim)?,
                    wqkv: linear(&format!("{p}.attn.wqkv"), 3 * dim, dim, true)?,
                    wo: linear(&format!("{p}.attn.wo"), dim, dim, true)?,
                    norm2: read(&format!("{p}.norm2.weight"), dim)?,
                    w1: linear(&format!("{p}.mlp.w1"), 2 * inter, dim, false)?,
                    w2: linear(&format!("{p}.mlp.w2"), dim, inter, false)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(VisionTower {
            config: config.clone(),
            numerics,
            patch_embed: linear("vision.patch_embed.proj", dim, patch, true)?,
            blocks,
            norm: read("vision.norm.weight", dim)?,
            aligner_w1: linear("aligner.w1", llm_dim, cell, true)?,
            aligner_w2: linear("aligner.w2", llm_dim, llm_dim, true)?,
        })
    }

    /// The tower of a checkpoint in either layout (tensors by their canonical release names:
    /// a container's `vision_tower.*` / `mm_projector.*` are mapped onto `vision.*` /
    /// `aligner.*`), with the language model's width from its config.
    pub fn from_checkpoint(ckpt: &dyn Checkpoint, numerics: Numerics) -> Result<VisionTower> {
        let config = ckpt.config();
        let vision = config
            .vision
            .as_ref()
            .filter(|v| v.n_layers > 0)
            .ok_or_else(|| Error::Config {
                field: "vision_config.num_hidden_layers".into(),
                rule: "the checkpoint has no vision tower".into(),
            })?;
        VisionTower::load(vision, config.dim, numerics, |name| ckpt.tensor_f32(name))
    }

    /// cos and sin `[n, hd/2]` of the 2-D rope for an `n_h × n_w` grid (`get_vision_cos_sin`).
    fn rope_tables(&self, n_h: usize, n_w: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.config.dim / self.config.n_heads / 2;
        let theta = self.config.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..half / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / half as f32))
            .collect();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for r in 0..n_h {
            for c in 0..n_w {
                for pos in [r, c] {
                    for f in &inv_freq {
                        let a = pos as f32 * f;
                        cos.push(a.cos());
                        sin.push(a.sin());
                    }
                }
            }
        }
        (cos, sin)
    }

    fn attention(&self, block: &VisionBlock, x: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let num = self.numerics;
        let dim = self.config.dim;
        let heads = self.config.n_heads;
        let hd = dim / heads;
        let half = hd / 2;
        let n = x.len() / dim;
        let qkv = block.wqkv.forward(&rms_norm(x, &block.norm1, num), num);
        // q, k rotated and rounded to bf16: [n, heads, hd]
        let rotate = |part: usize| -> Vec<f32> {
            let mut out = vec![0f32; n * dim];
            for t in 0..n {
                let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
                for h in 0..heads {
                    let src = &qkv[t * 3 * dim + part * dim + h * hd..][..hd];
                    let dst = &mut out[t * dim + h * hd..][..hd];
                    for i in 0..half {
                        let (x1, x2) = (src[i], src[half + i]);
                        dst[i] = num.round1(x1 * c[i] - x2 * s[i]);
                        dst[half + i] = num.round1(x2 * c[i] + x1 * s[i]);
                    }
                }
            }
            out
        };
        let (q, k) = (rotate(0), rotate(1));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut o = vec![0f32; n * dim];
        let mut scores = vec![0f32; n];
        for h in 0..heads {
            for i in 0..n {
                let qi = &q[i * dim + h * hd..][..hd];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let kj = &k[j * dim + h * hd..][..hd];
                    *s = dot_f64_wide(qi, kj) as f32 * scale;
                    max = max.max(*s);
                }
                // torch's CPU flash attention (bf16) sums the f32 exponentials for the
                // normaliser but rounds them to bf16 before weighting v.
                let mut total = 0f32;
                for s in scores.iter_mut() {
                    let e = (*s - max).exp();
                    total += e;
                    *s = num.round1(e);
                }
                for d in 0..hd {
                    let mut acc = 0f32;
                    for (j, p) in scores.iter().enumerate() {
                        acc += p * qkv[j * 3 * dim + 2 * dim + h * hd + d];
                    }
                    o[i * dim + h * hd + d] = num.round1(acc / total);
                }
            }
        }
        block.wo.forward(&o, num)
    }

    fn mlp(&self, block: &VisionBlock, x: &[f32]) -> Vec<f32> {
        let num = self.numerics;
        let inter = self.config.inter_dim;
        let gu = block.w1.forward(&rms_norm(x, &block.norm2, num), num);
        let mut act = Vec::with_capacity(gu.len() / 2);
        for row in gu.chunks_exact(2 * inter) {
            let (gate, up) = row.split_at(inter);
            for (g, u) in gate.iter().zip(up) {
                let silu = num.round1(g / (1.0 + (-g).exp()));
                act.push(num.round1(silu * u));
            }
        }
        block.w2.forward(&act, num)
    }

    /// `patch_embed` of the patches `[n, 3·p²]`.
    pub fn embed(&self, patches: &[f32]) -> Vec<f32> {
        self.patch_embed.forward(patches, self.numerics)
    }

    /// Block `b` on its input `x` (`[n_h · n_w, dim]`, row-major grid): for a whole run, or
    /// teacher-forced from another implementation's block input.
    pub fn block(&self, b: usize, x: &[f32], n_h: usize, n_w: usize) -> Vec<f32> {
        let (cos, sin) = self.rope_tables(n_h, n_w);
        self.block_with(&self.blocks[b], x, &cos, &sin)
    }

    fn block_with(&self, block: &VisionBlock, x: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let num = self.numerics;
        let a = self.attention(block, x, cos, sin);
        let x: Vec<f32> = x.iter().zip(&a).map(|(p, q)| num.round1(p + q)).collect();
        let m = self.mlp(block, &x);
        x.iter().zip(&m).map(|(p, q)| num.round1(p + q)).collect()
    }

    /// Run the tower on one image's patches (preprocessed with this tower's patch size).
    pub fn forward(&self, image: &ImagePatches) -> Result<TowerOutput> {
        if image.patch_size != self.config.patch_size {
            return Err(Error::Model(format!(
                "patches of {0}x{0} pixels for a tower with patch size {1}",
                image.patch_size, self.config.patch_size
            )));
        }
        let (n_h, n_w) = image.vit_grid();
        let patches: Vec<f32> = image.patches.iter().map(|v| v.to_f32()).collect();
        let embed = self.embed(&patches);
        let mut x = embed.clone();
        let (cos, sin) = self.rope_tables(n_h, n_w);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            x = self.block_with(block, &x, &cos, &sin);
            blocks.push(x.clone());
        }
        let vit = self.final_norm(&x);
        let aligner = self.align(&vit, n_h, n_w);
        Ok(TowerOutput {
            embed,
            blocks,
            vit,
            aligner,
        })
    }

    /// The final RMSNorm of the ViT.
    pub fn final_norm(&self, x: &[f32]) -> Vec<f32> {
        rms_norm(x, &self.norm, self.numerics)
    }

    /// The aligner: r×r cells (zero padded), features (channel, kh, kw), two linears.
    pub fn align(&self, vit: &[f32], n_h: usize, n_w: usize) -> Vec<f32> {
        let num = self.numerics;
        let (dim, r) = (self.config.dim, self.config.downsample_ratio);
        let (cells_h, cells_w) = (n_h.div_ceil(r), n_w.div_ceil(r));
        let mut cells = Vec::with_capacity(cells_h * cells_w * dim * r * r);
        for ch in 0..cells_h {
            for cw in 0..cells_w {
                for c in 0..dim {
                    for kh in 0..r {
                        for kw in 0..r {
                            let (y, x) = (ch * r + kh, cw * r + kw);
                            let v = if y < n_h && x < n_w {
                                vit[(y * n_w + x) * dim + c]
                            } else {
                                0.0
                            };
                            cells.push(v);
                        }
                    }
                }
            }
        }
        let h = self.aligner_w1.forward(&cells, num);
        let g: Vec<f32> = h.iter().map(|&v| num.round1(gelu_erf(v))).collect();
        self.aligner_w2.forward(&g, num)
    }
}

extern "C" {
    /// The C library's single-precision error function (libm).
    fn erff(x: f32) -> f32;
}

/// GELU with the exact erf form (torch's default `F.gelu`).
fn gelu_erf(x: f32) -> f32 {
    // SAFETY: erff is a pure function of its argument, defined for every f32.
    let e = unsafe { erff(x * std::f32::consts::FRAC_1_SQRT_2) };
    0.5 * x * (1.0 + e)
}
