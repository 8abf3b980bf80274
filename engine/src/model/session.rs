//! One sequence being processed, and the forward pass over a chunk of its tokens (MODEL.md
//! §6, §7.3) written as the spec's steps. What the pass computes along the way is handed to
//! an [`Observer`]; the trace recorder and teacher-forced replay are observers, so this file
//! holds the semantics only.

use super::block::BlockOutput;
use super::cache::state::{CompressedState, SessionState};
use super::defects::Defect;
use super::handoff::{Handoff, IndexK};
use super::hyper_connection;
use super::image_span::{EncodedImage, ImageEncoder};
use super::pool::PoolVec;
use super::rope::Rope;
use super::{Chunk, LayerCtx, Model, Options};
use crate::vision::span::sequence_types;
use crate::vision::{ImageInput, TokenType};
use crate::{Error, Result};

/// Watches a forward pass. At the block boundaries it may also substitute the stream the
/// pass continues from (teacher-forced replay); the plain pass leaves everything as computed.
/// Every method defaults to doing nothing.
#[allow(unused_variables)]
pub trait Observer {
    /// A chunk of `tokens` starts.
    fn begin_chunk(&mut self, chunk: Chunk, tokens: &[u32]) {}
    /// The token type of every row of a chunk that holds image spans (not called for
    /// text-only chunks).
    fn token_types(&mut self, chunk: Chunk, types: &[TokenType]) {}
    /// Image number `image` of the chunk went through the tower and aligner and was merged.
    fn image_encoded(&mut self, image: usize, encoded: &EncodedImage) {}
    /// The chunk's Engram hash ids, [rows, Engram layers, columns] (§6.6.1).
    fn engram_hashes(&mut self, hashes: &[i64]) {}
    /// The stream entering layer `layer` before its Engram step (if it has one), [rows, hc,
    /// dim]: the embedding copies at layer 0, else the previous block's output.
    fn layer_input(&mut self, chunk: Chunk, layer: usize, stream: &mut PoolVec<f32>) {}
    /// The gates of Engram layer number `engram` (its index in `engram_layer_ids`), [rows, hc].
    fn engram_gates(&mut self, engram: usize, gates: &[f32]) {}
    /// The stream entering block `layer` ([rows, hc, dim], after Engram) and its incoming
    /// `pre` ([rows, hc]).
    fn block_input(
        &mut self,
        chunk: Chunk,
        layer: usize,
        stream: &mut PoolVec<f32>,
        pre: &mut PoolVec<f32>,
    ) {
    }
    /// What block `layer` returned, and the hand-off as it left it.
    fn block_output(&mut self, layer: usize, out: &BlockOutput, handoff: &Handoff) {}
    /// The stream and `pre` the final collapse reads (§6.7), [rows, hc, dim] and [rows, hc].
    fn final_input(&mut self, chunk: Chunk, stream: &mut PoolVec<f32>, pre: &mut PoolVec<f32>) {}
    /// The logits of the chunk's last position.
    fn logits(&mut self, position: usize, logits: &[f32]) {}
}

/// Observes nothing: a forward pass that keeps only the logits.
pub struct Unobserved;

impl Observer for Unobserved {}

/// One sequence being processed.
pub struct Session<'m> {
    pub(super) model: &'m Model,
    options: Options,
    /// `options.index_k`, flipped by `Defect::IndexKHandoffWrong`.
    index_k: IndexK,
    ropes: Vec<Rope>,
    state: SessionState,
    logits: Vec<f32>,
    /// DSpark `main_hidden` of the last forward's rows, [rows, targets · dim] (empty without
    /// DSpark stages).
    main_hidden: Vec<f32>,
    /// The vision tower and span delimiters, read at the first image.
    image_encoder: Option<ImageEncoder>,
    /// Per row of the chunk being run, whether it lies in an image span (empty: text only).
    image_rows: Vec<bool>,
}

impl<'m> Session<'m> {
    pub fn new(model: &'m Model, options: Options) -> Session<'m> {
        let cfg = &model.cfg;
        let ropes = (0..cfg.n_layers)
            .map(|l| {
                Rope::for_layer(
                    cfg,
                    cfg.compress_ratios[l],
                    options.numerics,
                    &options.defects,
                )
            })
            .collect();
        let index_k = if options.defects.has(Defect::IndexKHandoffWrong) {
            options.index_k.flipped()
        } else {
            options.index_k
        };
        Session {
            model,
            index_k,
            ropes,
            state: SessionState::new(cfg),
            logits: Vec::new(),
            main_hidden: Vec::new(),
            image_encoder: None,
            image_rows: Vec::new(),
            options,
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Reserve the growing per-sequence state (compressed caches, index keys, Engram history)
    /// for `tokens` positions, so later steps do not reallocate it.
    pub fn reserve(&mut self, tokens: usize) {
        self.state.reserve(&self.model.cfg, tokens);
    }

    /// Number of tokens processed (the position of the next token).
    pub fn position(&self) -> usize {
        self.state.position
    }

    /// The logits of the last position of the last forward.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// DSpark `main_hidden` of the last forward's rows, [rows, targets · dim]: the streams
    /// entering the target layers (after Engram), averaged over the hc copies (MODEL.md
    /// §10.1; empty when the model has no DSpark stages).
    pub fn main_hidden(&self) -> &[f32] {
        &self.main_hidden
    }

    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// Replace the sequence state (a restore). The caller checks compatibility; the shapes
    /// are checked here.
    pub fn set_state(&mut self, mut state: SessionState) -> Result<()> {
        let fresh = SessionState::new(&self.model.cfg);
        let ok = state.layers.len() == fresh.layers.len()
            && state.layers.iter().zip(&fresh.layers).all(|(a, b)| {
                a.window.len() == b.window.len() && a.compressed.is_some() == b.compressed.is_some()
            })
            && state.engram_history.len() == state.position;
        self.model.cfg.check_positions(state.position)?;
        if !ok {
            return Err(Error::Model(
                "session state does not match the model's shapes".into(),
            ));
        }
        if self.options.defects.has(Defect::StateWithoutPoolingGroup) {
            for c in state
                .layers
                .iter_mut()
                .filter_map(|l| l.compressed.as_mut())
            {
                let fresh = CompressedState::new(c.ratio, c.head_dim, c.index_head_dim);
                c.group_kv = fresh.group_kv;
                c.group_score = fresh.group_score;
            }
        }
        self.state = state;
        Ok(())
    }

    /// Process `tokens` as one chunk: a prefill at position 0, or a chunk equal to one
    /// prefill of everything so far at position > 0.
    pub fn prefill(&mut self, tokens: &[u32], observer: &mut dyn Observer) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Model("prefill of zero tokens".into()));
        }
        self.forward(tokens, observer)
    }

    /// Prefill `tokens` at position 0 with image spans in them (MODEL.md §6.1): each image's
    /// span (`ImageInput::span`) must hold `image_token_id` at every position; use
    /// [`crate::vision::expand_markers`] to build both from a prompt with one marker per
    /// image. Spans must lie in the first chunk: at a later position this is refused.
    pub fn prefill_with_images(
        &mut self,
        tokens: &[u32],
        images: &[ImageInput],
        observer: &mut dyn Observer,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Model("prefill of zero tokens".into()));
        }
        self.forward_chunk(tokens, images, observer)
    }

    /// One decode step.
    pub fn decode(&mut self, token: u32, observer: &mut dyn Observer) -> Result<()> {
        self.forward(&[token], observer)
    }

    /// Block-level API: run block `layer` on `chunk` from a given input stream and incoming
    /// `pre`, updating this session's caches and the hand-off. Does not advance the position.
    pub fn run_block(
        &mut self,
        layer: usize,
        chunk: Chunk,
        x: &[f32],
        pre: &[f32],
        handoff: &mut Handoff,
    ) -> Result<BlockOutput> {
        let model = self.model;
        let ctx = LayerCtx {
            cfg: &model.cfg,
            ckpt: model.ckpt.as_ref(),
            numerics: self.options.numerics,
            index_k: self.index_k,
            defects: &self.options.defects,
            rope: &self.ropes[layer],
            image_rows: &self.image_rows,
        };
        model.blocks[layer].forward(&ctx, chunk, x, pre, &mut self.state, handoff)
    }

    /// One forward over `tokens` (same chunk semantics as [`Session::prefill`]).
    pub(super) fn forward(&mut self, tokens: &[u32], observer: &mut dyn Observer) -> Result<()> {
        self.forward_chunk(tokens, &[], observer)
    }

    /// The token types of a chunk with `images` (MODEL.md §6.1 step 1), after checking that
    /// the model has a vision tower and that the spans may be placed here.
    fn image_types(
        &mut self,
        chunk: Chunk,
        tokens: &[u32],
        images: &[ImageInput],
    ) -> Result<Vec<TokenType>> {
        let cfg = &self.model.cfg;
        let image_token = match (cfg.image_token_id, &cfg.vision) {
            (Some(id), Some(v)) if v.n_layers > 0 => id,
            _ => {
                return Err(Error::Model(
                    "the model has no vision tower (vision_config absent or 0 layers) but \
                     images were given"
                        .into(),
                ))
            }
        };
        if chunk.start != 0 {
            return Err(Error::Model(format!(
                "image spans must lie in the first prefill chunk (position 0); this chunk \
                 starts at position {}",
                chunk.start
            )));
        }
        if self.image_encoder.is_none() {
            self.image_encoder = Some(ImageEncoder::load(self.model, self.options.numerics)?);
        }
        sequence_types(tokens, image_token, images)
    }

    /// One forward over `tokens` with image spans (`images` empty: text only).
    pub(super) fn forward_chunk(
        &mut self,
        tokens: &[u32],
        images: &[ImageInput],
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let model = self.model;
        let cfg = &model.cfg;
        let (hc, d) = (cfg.hc_mult, cfg.dim);
        let chunk = Chunk {
            start: self.state.position,
            rows: tokens.len(),
        };
        let rows = chunk.rows;
        cfg.check_positions(chunk.start.saturating_add(rows))?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary ({})",
                cfg.vocab_size
            )));
        }
        let types = if images.is_empty() {
            Vec::new()
        } else {
            self.image_types(chunk, tokens, images)?
        };
        self.image_rows.clear();
        self.image_rows.extend(types.iter().map(|t| t.in_image()));
        // §6.6: image positions are DEAD in the Engram history and get Engram gate 0.
        let engram_dead: &[bool] = if self.options.defects.has(Defect::EngramImageNotDead) {
            &[]
        } else {
            &self.image_rows
        };
        let engram_dead = engram_dead.to_vec();
        let dead = |r: usize| engram_dead.get(r).copied().unwrap_or(false);
        observer.begin_chunk(chunk, tokens);
        if !types.is_empty() {
            observer.token_types(chunk, &types);
        }
        let numerics = self.options.numerics;

        // §6.6.1 Engram hash ids for every row and Engram layer.
        let cols = cfg.engram_max_ngram_size.saturating_sub(1) * cfg.engram_n_heads;
        let n_eng = model.engrams.len();
        let mut hashes = PoolVec::filled(rows * n_eng * cols, 0i64);
        if let Some(h) = &model.hasher {
            for (r, &t) in tokens.iter().enumerate() {
                let entry = if dead(r) {
                    super::engram::DEAD
                } else {
                    h.compressed_id(t)?
                };
                self.state.engram_history.push(entry);
            }
            for r in 0..rows {
                for li in 0..n_eng {
                    let o = (r * n_eng + li) * cols;
                    h.hash(
                        &self.state.engram_history,
                        chunk.start + r,
                        li,
                        &self.options.defects,
                        &mut hashes[o..o + cols],
                    );
                }
            }
        } else {
            self.state
                .engram_history
                .extend(tokens.iter().enumerate().map(|(r, &t)| {
                    if dead(r) {
                        super::engram::DEAD
                    } else {
                        t as i64
                    }
                }));
        }
        observer.engram_hashes(&hashes);

        let (mut x, mut pre) = embed_expanded(model, tokens, numerics)?;
        if let Some(encoder) = self.image_encoder.as_ref().filter(|_| !images.is_empty()) {
            let encoded = encoder.merge(images, &types, &mut x, hc, numerics)?;
            for (i, e) in encoded.iter().enumerate() {
                observer.image_encoded(i, e);
            }
        }

        let targets: &[usize] = match &model.dspark {
            Some(ds) => &ds.cfg.target_layer_ids,
            None => &[],
        };
        let hidden_after = self.options.defects.has(Defect::MainHiddenAfterBlock);
        let width = targets.len() * d;
        self.main_hidden.clear();
        self.main_hidden.resize(rows * width, 0.0);
        let mut handoff = Handoff::default();
        for l in 0..cfg.n_layers {
            // §6.6.2 Engram adds to the stream entering the block.
            observer.layer_input(chunk, l, &mut x);
            if let Some(li) = model.engrams.iter().position(|(el, _)| *el == l) {
                let ids = gather_engram(&hashes, rows, n_eng, cols, li);
                let gates = model.engrams[li].1.forward(
                    model.ckpt.as_ref(),
                    &mut x,
                    &ids,
                    rows,
                    &engram_dead,
                    numerics,
                )?;
                observer.engram_gates(li, &gates);
            }
            observer.block_input(chunk, l, &mut x, &mut pre);
            let out = self.run_block(l, chunk, &x, &pre, &mut handoff)?;
            observer.block_output(l, &out, &handoff);
            for (i, _) in targets.iter().enumerate().filter(|(_, &t)| t == l) {
                let stream = if hidden_after { &out.stream } else { &x };
                for r in 0..rows {
                    let o = r * width + i * d;
                    super::dspark::mean_over_copies(
                        &stream[r * hc * d..(r + 1) * hc * d],
                        hc,
                        &mut self.main_hidden[o..o + d],
                        numerics,
                    );
                }
            }
            x = out.stream;
            pre = out.pre;
        }

        // §6.7 final collapse with the last FFN pre, norm, head (last row only).
        observer.final_input(chunk, &mut x, &mut pre);
        let last = rows - 1;
        let mut h = PoolVec::filled(d, 0.0f32);
        hyper_connection::collapse(&x[last * hc * d..], &pre[last * hc..], &mut h, numerics);
        model.norm.forward_inplace(&mut h, numerics);
        // The logits buffer of the session is reused from step to step.
        self.logits.clear();
        self.logits.resize(cfg.vocab_size, 0.0);
        model.head.forward(&h, 1, &mut self.logits, numerics)?;
        self.state.position += rows;
        self.image_rows.clear();
        observer.logits(chunk.start + last, &self.logits);
        Ok(())
    }
}

/// §6.1: the embedding rows of `tokens`, expanded to hc copies ([rows, hc, dim]), and the
/// one-hot `pre` ([rows, hc]) the first block collapses with. The DSpark draft block starts
/// the same way (§10.1).
pub(super) fn embed_expanded(
    model: &Model,
    tokens: &[u32],
    numerics: super::Numerics,
) -> Result<(PoolVec<f32>, PoolVec<f32>)> {
    let (hc, d, rows) = (model.cfg.hc_mult, model.cfg.dim, tokens.len());
    let mut x = PoolVec::filled(rows * hc * d, 0.0f32);
    let mut emb = PoolVec::filled(d, 0.0f32);
    for (r, &t) in tokens.iter().enumerate() {
        model.ckpt.rows_f32("embed.weight", t as usize, &mut emb)?;
        numerics.round(&mut emb);
        for k in 0..hc {
            x[(r * hc + k) * d..(r * hc + k + 1) * d].copy_from_slice(&emb);
        }
    }
    let mut pre = PoolVec::filled(rows * hc, 0.0f32);
    for r in 0..rows {
        pre[r * hc] = 1.0;
    }
    Ok((x, pre))
}

/// The hash ids of Engram layer number `li` for every row, [rows, cols].
fn gather_engram(
    hashes: &[i64],
    rows: usize,
    n_eng: usize,
    cols: usize,
    li: usize,
) -> PoolVec<i64> {
    let mut ids = PoolVec::new();
    for r in 0..rows {
        let o = (r * n_eng + li) * cols;
        ids.extend_from_slice(&hashes[o..o + cols]);
    }
    ids
}
