//! The DSpark draft head (MODEL.md §10.1; `DSparkBlock`, `DSparkAttention`,
//! `DSparkMarkovHead`, `DSparkConfidenceHead` and `Transformer.forward_spec` of the official
//! `model.py`, which is the authority where the outline differs, goldens/ERRATA.md `dspark_*`).
//!
//! After every forward of the main model, a [`Drafter`] takes `main_hidden` (the streams
//! entering the target layers, after Engram, averaged over the hc copies, concatenated) and
//! the id the main model sampled:
//!
//! * `main_x = main_norm(main_proj(main_hidden))`; every stage's attention writes the roped
//!   (FP8-QDQ'd upstream) key `kv_norm(wkv main_x)` of each position into its own window ring
//!   (slot p mod window). A prefill at position 0 only seeds the rings.
//! * A decode step at position p > 0 then drafts a block of `block_size` positions p+1 ..:
//!   ids `[last id, noise × (block_size − 1)]`, embedded and expanded to hc copies, through
//!   the stages (mHC blocks whose attention is non-causal: every draft row attends the filled
//!   ring slots in slot order, then every draft key), collapsed with the last stage's `pre`,
//!   normed by the last stage's `norm`, through the main model's head.
//! * The Markov head adds, step by step, `markov_head.head(markov_head.embed[id])` to the
//!   step's logits, where id is the id sampled at the previous step (the last id for step 0);
//!   each step samples its id by argmax (temperature 0). The confidence head projects
//!   `[collapsed stream, Markov embedding]` of every step to one f32.
//!
//! The container layout drops the MTP stages (CONTAINER.md §8): DSpark runs on the release
//! layout only.

mod attention;
pub mod trace;

use std::sync::Arc;

use super::block::{Block, BlockOutput};
use super::defects::Defect;
use super::handoff::IndexK;
use super::hyper_connection::collapse;
use super::linear::{Linear, LinearKind};
use super::norm::RmsNorm;
use super::numerics::Numerics;
use super::pool::PoolVec;
use super::rope::Rope;
use super::{Chunk, LayerCtx, Model, Options};
use crate::checkpoint::{Checkpoint, Layout};
use crate::config::{Config, DsparkConfig};
use crate::{Error, Result};

/// The loaded DSpark stages and heads (weights stay in the checkpoint's mmap).
pub struct Dspark {
    pub cfg: DsparkConfig,
    stages: Vec<Block>,
    main_proj: Linear,
    main_norm: RmsNorm,
    norm: RmsNorm,
    markov_embed: String,
    markov_head: Linear,
    confidence: Linear,
}

impl Dspark {
    /// The stages `mtp.{s}.*` of a release-layout checkpoint whose config has DSpark
    /// arguments; `Ok(None)` when it has none.
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config) -> Result<Option<Dspark>> {
        let Some(d) = cfg.dspark.clone() else {
            return Ok(None);
        };
        if ckpt.layout() != Layout::Release {
            return Ok(None); // CONTAINER.md §8: the container drops the MTP stages
        }
        if let Some(&bad) = d.target_layer_ids.iter().find(|&&l| l >= cfg.n_layers) {
            return Err(Error::Config {
                field: "dspark_target_layer_ids".into(),
                rule: format!(
                    "layer {bad} is not a backbone layer (n_layers {})",
                    cfg.n_layers
                ),
            });
        }
        if d.noise_token_id as usize >= cfg.vocab_size {
            return Err(Error::Config {
                field: "dspark_noise_token_id".into(),
                rule: format!("{} is outside the vocabulary", d.noise_token_id),
            });
        }
        let n = cfg.n_mtp_layers;
        let last = format!("mtp.{}.", n - 1);
        let stages = (0..n)
            .map(|s| Block::load_at(ckpt, cfg, cfg.n_layers + s, &format!("mtp.{s}.")))
            .collect::<Result<Vec<_>>>()?;
        let width = cfg.dim * d.target_layer_ids.len();
        super::expect_shape(ckpt.as_ref(), "mtp.0.main_proj.weight", &[cfg.dim, width])?;
        let markov_embed = format!("{last}markov_head.embed.weight");
        super::expect_shape(
            ckpt.as_ref(),
            &markov_embed,
            &[cfg.vocab_size, d.markov_rank],
        )?;
        let confidence = format!("{last}confidence_head.proj.weight");
        super::expect_shape(ckpt.as_ref(), &confidence, &[1, cfg.dim + d.markov_rank])?;
        Ok(Some(Dspark {
            stages,
            main_proj: Linear::load(ckpt, "mtp.0.main_proj.weight", LinearKind::Fp8)?,
            main_norm: RmsNorm::load(ckpt.as_ref(), "mtp.0.main_norm.weight", cfg.norm_eps)?,
            norm: RmsNorm::load(ckpt.as_ref(), &format!("{last}norm.weight"), cfg.norm_eps)?,
            markov_head: Linear::load(
                ckpt,
                &format!("{last}markov_head.head.weight"),
                LinearKind::F32,
            )?,
            confidence: Linear::load(ckpt, &confidence, LinearKind::F32)?,
            markov_embed,
            cfg: d,
        }))
    }

    pub fn stages(&self) -> usize {
        self.stages.len()
    }
}

/// One drafted block.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Position of the main model's token the draft follows (draft row i is at p + 1 + i).
    pub position: usize,
    /// `[last id, draft 1 .. block_size]` (`output_ids` of `forward_head`).
    pub ids: Vec<u32>,
    /// Logits of every draft row after its Markov bias, [block_size, vocab].
    pub logits: Vec<f32>,
    /// Confidence of every draft row, [block_size].
    pub confidence: Vec<f32>,
}

/// Watches (and in teacher-forced replay, substitutes into) one draft step. Every method
/// defaults to doing nothing.
#[allow(unused_variables)]
pub trait DraftObserver {
    /// `main_hidden` of the chunk's rows, [rows, targets · dim].
    fn main_hidden(&mut self, chunk: Chunk, main_hidden: &mut PoolVec<f32>) {}
    /// `main_x` of the chunk's rows, [rows, dim].
    fn main_x(&mut self, chunk: Chunk, main_x: &[f32]) {}
    /// The draft block's ids `[last id, noise ...]` before embedding.
    fn draft_ids(&mut self, position: usize, ids: &mut [u32]) {}
    /// The stream entering stage `stage` [block, hc, dim] and its incoming `pre` [block, hc].
    fn stage_input(&mut self, stage: usize, stream: &mut PoolVec<f32>, pre: &mut PoolVec<f32>) {}
    /// What stage `stage` returned.
    fn stage_output(&mut self, stage: usize, out: &BlockOutput) {}
    /// The last stage's collapse input `pre` [block, hc], the collapsed rows [block, dim]
    /// and the head's logits before the Markov bias [block, vocab].
    fn head(&mut self, pre: &[f32], hidden: &[f32], logits: &[f32]) {}
    /// Markov step `step` sampled `id` (draft id `step + 1`; the next step's bias reads it).
    fn sampled(&mut self, step: usize, id: &mut u32) {}
    /// Markov step `step`: its bias [vocab] and embedding [rank].
    fn markov(&mut self, step: usize, bias: &[f32], embed: &[f32]) {}
    /// The finished draft.
    fn draft(&mut self, draft: &Draft) {}
}

/// Observes nothing.
pub struct Unobserved;

impl DraftObserver for Unobserved {}

/// The draft head's per-sequence state: one window ring per stage, and the options.
pub struct Drafter<'m> {
    model: &'m Model,
    dspark: &'m Dspark,
    options: Options,
    rope: Rope,
    /// Per stage `[window, head_dim]`: the key of main position p in slot p mod window.
    rings: Vec<Vec<f32>>,
    /// Positions whose keys are in the rings (the next main position).
    position: usize,
}

impl<'m> Drafter<'m> {
    /// A drafter for one sequence of `model` (release layout with DSpark stages).
    pub fn new(model: &'m Model, options: Options) -> Result<Drafter<'m>> {
        let dspark = model.dspark()?;
        let cfg = model.config();
        let ring = vec![0.0; cfg.window_size * cfg.head_dim];
        Ok(Drafter {
            model,
            dspark,
            // MTP stages are ratio 0: base rope theta, no YaRN.
            rope: Rope::for_layer(cfg, 0, options.numerics, &options.defects),
            rings: vec![ring; dspark.stages.len()],
            position: 0,
            options,
        })
    }

    /// Follow the main model's forward over `chunk`: `main_hidden` [rows, targets · dim] of
    /// its rows (`Session::main_hidden`) and the id it sampled after the last row. A prefill at
    /// position 0 seeds the rings and drafts nothing (`None`); a single-token decode step
    /// drafts a block. Chunks of several rows after position 0 are not defined by the
    /// official code and are refused.
    pub fn step(
        &mut self,
        chunk: Chunk,
        main_hidden: &[f32],
        last_id: u32,
        observer: &mut dyn DraftObserver,
    ) -> Result<Option<Draft>> {
        let cfg = self.model.config();
        let d = cfg.dim;
        let width = d * self.dspark.cfg.target_layer_ids.len();
        if chunk.start != self.position {
            return Err(Error::Model(format!(
                "DSpark: the drafter has seen {} positions, the chunk starts at {}",
                self.position, chunk.start
            )));
        }
        if chunk.start > 0 && chunk.rows != 1 {
            return Err(Error::Model(format!(
                "DSpark drafts after a prefill at position 0 or a single-token decode step; \
                 got {} rows at position {}",
                chunk.rows, chunk.start
            )));
        }
        if main_hidden.len() != chunk.rows * width {
            return Err(Error::Model(format!(
                "DSpark: main_hidden has {} values, {} rows × {width} expected",
                main_hidden.len(),
                chunk.rows
            )));
        }
        if last_id as usize >= cfg.vocab_size {
            return Err(Error::Model(format!(
                "DSpark: last id {last_id} is outside the vocabulary"
            )));
        }
        let numerics = self.options.numerics;
        let mut hidden = PoolVec::from_slice(main_hidden);
        observer.main_hidden(chunk, &mut hidden);
        let mut main_x = PoolVec::filled(chunk.rows * d, 0.0f32);
        self.dspark
            .main_proj
            .forward(&hidden, chunk.rows, &mut main_x, numerics)?;
        self.dspark.main_norm.forward_inplace(&mut main_x, numerics);
        observer.main_x(chunk, &main_x);
        self.position = chunk.total();
        if chunk.start == 0 {
            for s in 0..self.dspark.stages.len() {
                let ctx = self.ctx();
                let keys = self.dspark.stages[s].attn.window_keys(
                    &ctx,
                    &main_x,
                    chunk.rows,
                    chunk.start,
                )?;
                attention::write_ring(&mut self.rings[s], &keys, chunk, cfg.head_dim);
            }
            return Ok(None);
        }
        self.draft(chunk.start, &main_x, last_id, observer)
            .map(Some)
    }

    /// The widths of this drafter's trace cells.
    pub fn dims(&self) -> trace::Dims {
        let cfg = self.model.config();
        trace::Dims {
            stages: self.dspark.stages.len(),
            block: self.dspark.cfg.block_size,
            hc: cfg.hc_mult,
            dim: cfg.dim,
            vocab: cfg.vocab_size,
            rank: self.dspark.cfg.markov_rank,
            targets: self.dspark.cfg.target_layer_ids.len(),
        }
    }

    fn ctx(&self) -> LayerCtx<'_> {
        layer_ctx(self.model, &self.options, &self.rope)
    }

    /// The draft block after main position `p` (§10.1).
    fn draft(
        &mut self,
        p: usize,
        main_x: &[f32],
        last_id: u32,
        observer: &mut dyn DraftObserver,
    ) -> Result<Draft> {
        let model = self.model;
        let cfg = model.config();
        let (hc, d, vocab) = (cfg.hc_mult, cfg.dim, cfg.vocab_size);
        let block = self.dspark.cfg.block_size;
        let numerics = self.options.numerics;

        let mut ids = vec![self.dspark.cfg.noise_token_id; block];
        ids[0] = last_id;
        observer.draft_ids(p, &mut ids);
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "DSpark: draft id {bad} is outside the vocabulary"
            )));
        }
        let (mut x, mut pre) = super::session::embed_expanded(model, &ids, numerics)?;

        for s in 0..self.dspark.stages.len() {
            observer.stage_input(s, &mut x, &mut pre);
            let ctx = layer_ctx(self.model, &self.options, &self.rope);
            let stage = &self.dspark.stages[s];
            let ring = &mut self.rings[s];
            let out = stage.forward_with(&ctx, block, &x, &pre, |u, out| {
                attention::draft_attention(&stage.attn, &ctx, p, main_x, u, ring, out)
            })?;
            observer.stage_output(s, &out);
            x = out.stream;
            pre = out.pre;
        }

        // The last stage's collapse, norm, and the main model's head for every draft row.
        let mut hidden = PoolVec::filled(block * d, 0.0f32);
        for r in 0..block {
            collapse(
                &x[r * hc * d..(r + 1) * hc * d],
                &pre[r * hc..(r + 1) * hc],
                &mut hidden[r * d..(r + 1) * d],
                numerics,
            );
        }
        let mut normed = PoolVec::from_slice(&hidden);
        self.dspark.norm.forward_inplace(&mut normed, numerics);
        let mut logits = vec![0.0f32; block * vocab];
        model
            .head()
            .forward(&normed, block, &mut logits, numerics)?;
        observer.head(&pre, &hidden, &logits);

        // The Markov head, sequential over the block: each step's bias comes from the id the
        // previous step sampled.
        let rank = self.dspark.cfg.markov_rank;
        let mut out_ids = Vec::with_capacity(block + 1);
        out_ids.push(ids[0]); // the block's first id, as the observer left it
        let mut embeds = PoolVec::filled(block * rank, 0.0f32);
        let mut bias = PoolVec::filled(vocab, 0.0f32);
        for i in 0..block {
            let id = if self.options.defects.has(Defect::MarkovBiasFromFirstId) {
                out_ids[0]
            } else {
                out_ids[i]
            };
            if id as usize >= vocab {
                return Err(Error::Model(format!(
                    "DSpark: Markov step {i} reads id {id}, outside the vocabulary"
                )));
            }
            let embed = &mut embeds[i * rank..(i + 1) * rank];
            model
                .checkpoint()
                .rows_f32(&self.dspark.markov_embed, id as usize, embed)?;
            numerics.round(embed);
            self.dspark
                .markov_head
                .forward(embed, 1, &mut bias, numerics)?;
            let row = &mut logits[i * vocab..(i + 1) * vocab];
            for (l, b) in row.iter_mut().zip(bias.iter()) {
                *l += b;
            }
            observer.markov(i, &bias, embed);
            let mut sampled = argmax(row);
            observer.sampled(i, &mut sampled);
            out_ids.push(sampled);
        }

        let mut joined = PoolVec::filled(block * (d + rank), 0.0f32);
        for r in 0..block {
            let row = &mut joined[r * (d + rank)..(r + 1) * (d + rank)];
            row[..d].copy_from_slice(&hidden[r * d..(r + 1) * d]);
            row[d..].copy_from_slice(&embeds[r * rank..(r + 1) * rank]);
        }
        let mut confidence = vec![0.0f32; block];
        self.dspark
            .confidence
            .forward(&joined, block, &mut confidence, numerics)?;
        let draft = Draft {
            position: p,
            ids: out_ids,
            logits,
            confidence,
        };
        observer.draft(&draft);
        Ok(draft)
    }
}

/// The context of a stage: MTP stages have no compressed KV, so no `index_k` hand-off.
fn layer_ctx<'a>(model: &'a Model, options: &'a Options, rope: &'a Rope) -> LayerCtx<'a> {
    LayerCtx {
        cfg: model.config(),
        ckpt: model.checkpoint().as_ref(),
        numerics: options.numerics,
        index_k: IndexK::AsShipped,
        defects: &options.defects,
        rope,
        image_rows: &[],
    }
}

/// `sample` at temperature 0: the first index of the largest value (`torch.argmax`).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// One target layer's slice of `main_hidden` for one row: the mean over the hc copies of the
/// stream [hc, dim] (`Tensor.mean` of bf16 accumulates in f32, then rounds).
pub fn mean_over_copies(stream: &[f32], hc: usize, out: &mut [f32], numerics: Numerics) {
    let d = out.len();
    let scale = 1.0 / hc as f32;
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for k in 0..hc {
            acc += stream[k * d + i];
        }
        *o = acc * scale;
    }
    numerics.round(out);
}
