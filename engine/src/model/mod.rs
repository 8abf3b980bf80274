//! The DS41 text forward pass (MODEL.md §5–§7), readable top to bottom like the spec:
//!
//! * [`Model`] holds the weights (memory-mapped, dequantised per row as a step needs them);
//! * [`Session`] holds one sequence: its [`SessionState`] (§7.1) and its [`Options`]
//!   (numerics profile, `index_k` behaviour, injected defects);
//! * a forward over a chunk of tokens: Engram hashes (§6.6.1) → embedding and expand (§6.1)
//!   → for every layer, Engram (§6.6.2) then [`block::Block`] (§6.3) → final collapse,
//!   norm and head (§6.7).
//!
//! Chunk semantics: `prefill` at position 0 is the reference's prefill; `decode` is one
//! token at position > 0; a chunk of several tokens at position > 0 is defined as equal to
//! one prefill of everything so far (§7.3): every row uses the row-independent rules of the
//! whole-prefix prefill (window list of `min(T, W)` entries, K = min(index_topk, T div r)).

pub mod attention;
pub mod block;
pub mod cache;
pub mod compressor;
pub mod defects;
pub mod engram;
pub mod handoff;
pub mod hyper_connection;
pub mod indexer;
pub mod linear;
pub mod matvec;
pub mod moe;
pub mod norm;
pub mod numerics;
pub mod pool;
pub mod quant;
pub mod roles;
pub mod rope;
pub mod sparse_attention;
pub mod topk;

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::{Checkpoint, Layout};
use crate::config::Config;
use crate::trace::{Trace, TraceFile};
use crate::{Error, Result};
use pool::PoolVec;

pub use block::{Block, BlockOutput};
pub use cache::state::{CompressedState, LayerState, SessionState};
pub use defects::{Defect, DefectSet};
pub use engram::{Engram, EngramHasher};
pub use handoff::{Handoff, IndexK};
pub use linear::{Linear, LinearKind};
pub use numerics::Numerics;
pub use rope::Rope;

/// Check a 1-D tensor's length (typed error naming the tensor).
pub(crate) fn expect_len(
    _ckpt: &dyn Checkpoint,
    name: &str,
    got: usize,
    want: usize,
) -> Result<()> {
    if got != want {
        return Err(Error::Model(format!(
            "tensor `{name}` has {got} elements, the config implies {want}"
        )));
    }
    Ok(())
}

/// Check a tensor's logical shape (typed error naming the tensor).
pub(crate) fn expect_shape(ckpt: &dyn Checkpoint, name: &str, want: &[usize]) -> Result<()> {
    let got = ckpt.shape(name)?;
    if got != want {
        return Err(Error::Model(format!(
            "tensor `{name}` has shape {got:?}, the config implies {want:?}"
        )));
    }
    Ok(())
}

/// The rows of one forward: positions `start .. start + rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub rows: usize,
}

impl Chunk {
    /// `start_pos + S`: the sequence length after this forward.
    pub fn total(self) -> usize {
        self.start + self.rows
    }
    /// A single-token step after position 0 uses the decode layouts (§5.7, §6.4.2).
    pub fn decode_layout(self) -> bool {
        self.rows == 1 && self.start > 0
    }
}

/// Run options of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub numerics: Numerics,
    pub index_k: IndexK,
    pub defects: DefectSet,
}

impl Default for Options {
    /// The CLI defaults: upstream numerics, as-shipped `index_k`, no defects.
    fn default() -> Options {
        Options {
            numerics: Numerics::Upstream,
            index_k: IndexK::AsShipped,
            defects: DefectSet::none(),
        }
    }
}

/// What one layer's code needs besides weights and state.
pub struct LayerCtx<'a> {
    pub cfg: &'a Config,
    pub ckpt: &'a dyn Checkpoint,
    pub numerics: Numerics,
    pub index_k: IndexK,
    pub defects: &'a DefectSet,
    pub rope: &'a Rope,
}

/// The loaded model: config, per-layer modules (weights stay in the checkpoint's mmap).
pub struct Model {
    cfg: Config,
    ckpt: Arc<dyn Checkpoint>,
    blocks: Vec<Block>,
    /// (layer, module) for every Engram layer, in `engram_layer_ids` order.
    engrams: Vec<(usize, Engram)>,
    hasher: Option<EngramHasher>,
    norm: norm::RmsNorm,
    head: Linear,
}

impl Model {
    /// Open a checkpoint directory of either layout.
    pub fn open(dir: &Path) -> Result<Model> {
        Model::open_with_token_map(dir, None)
    }

    /// Open a checkpoint directory, taking the Engram token map from `token_map` when given
    /// (a release checkpoint ships none) instead of from the checkpoint.
    pub fn open_with_token_map(dir: &Path, token_map: Option<Vec<i32>>) -> Result<Model> {
        let ckpt: Arc<dyn Checkpoint> = Arc::from(crate::checkpoint::open(dir)?);
        let hasher = if ckpt.config().engram_layer_ids.is_empty() {
            None
        } else {
            // A release ships no map: build it from the checkpoint's tokenizer (§6.6.1).
            let token_map = match token_map {
                Some(m) => Some(m),
                None if ckpt.engram_token_map()?.is_none() => {
                    let path = dir.join("tokenizer.json");
                    let map = crate::tokenizer::Tokenizer::from_file(&path)
                        .and_then(|tok| crate::tokenizer::engram_map::compressed_token_map(&tok))
                        .map_err(|e| {
                            Error::Model(format!(
                                "building the Engram token map from {}: {e}; supply the map explicitly",
                                path.display()
                            ))
                        })?;
                    let n = crate::tokenizer::engram_map::compressed_vocab_size(&map);
                    if n != ckpt.config().engram_compressed_vocab_size {
                        return Err(Error::Config {
                            field: "engram_compressed_vocab_size".into(),
                            rule: format!(
                                "the tokenizer's compressed map has {n} ids, the config says {}",
                                ckpt.config().engram_compressed_vocab_size
                            ),
                        });
                    }
                    Some(map)
                }
                None => None,
            };
            Some(engram::hasher_for(ckpt.as_ref(), token_map)?)
        };
        Model::from_parts(ckpt, hasher)
    }

    /// Build from an open checkpoint; Engram constants come from the checkpoint's reader.
    pub fn from_checkpoint(ckpt: Arc<dyn Checkpoint>) -> Result<Model> {
        let hasher = if ckpt.config().engram_layer_ids.is_empty() {
            None
        } else {
            Some(engram::hasher_for(ckpt.as_ref(), None)?)
        };
        Model::from_parts(ckpt, hasher)
    }

    /// Build from an open checkpoint and explicitly given Engram hash constants.
    pub fn from_parts(ckpt: Arc<dyn Checkpoint>, hasher: Option<EngramHasher>) -> Result<Model> {
        let cfg = ckpt.config().clone();
        if hasher.is_none() && !cfg.engram_layer_ids.is_empty() {
            return Err(Error::Model(
                "the config has Engram layers but no hash constants were given".into(),
            ));
        }
        let blocks = (0..cfg.n_layers)
            .map(|l| Block::load(&ckpt, &cfg, l))
            .collect::<Result<Vec<_>>>()?;
        let engrams = cfg
            .engram_layer_ids
            .iter()
            .map(|&l| Engram::load(&ckpt, &cfg, l).map(|e| (l, e)))
            .collect::<Result<Vec<_>>>()?;
        expect_shape(ckpt.as_ref(), "embed.weight", &[cfg.vocab_size, cfg.dim])?;
        Ok(Model {
            norm: norm::RmsNorm::load(ckpt.as_ref(), "norm.weight", cfg.norm_eps)?,
            head: Linear::load(&ckpt, "head.weight", LinearKind::F32)?,
            cfg,
            ckpt,
            blocks,
            engrams,
            hasher,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn layout(&self) -> Layout {
        self.ckpt.layout()
    }

    pub fn checkpoint(&self) -> &Arc<dyn Checkpoint> {
        &self.ckpt
    }

    pub fn block(&self, layer: usize) -> &Block {
        &self.blocks[layer]
    }

    pub fn engram_hasher(&self) -> Option<&EngramHasher> {
        self.hasher.as_ref()
    }
}

/// Teacher forcing for replay (issue 4 item 7): the golden's own block inputs and `pre`.
pub struct Forcing<'a> {
    /// [tokens, layers, hc, dim]
    pub block_input: &'a [f32],
    /// [tokens, layers, hc]
    pub pre_mix: &'a [f32],
    /// [tokens, layers, hc, dim]: the golden block outputs (Engram is replayed on them).
    pub residual: &'a [f32],
    /// [tokens, hc]
    pub final_pre: &'a [f32],
}

impl<'a> Forcing<'a> {
    /// Borrow the forcing tensors of a golden file, checking their shapes.
    pub fn from_golden(g: &'a TraceFile, cfg: &Config) -> Result<Forcing<'a>> {
        let get = |name: &str, tail: &[usize]| -> Result<&'a [f32]> {
            let (shape, data) = g
                .f32(name)
                .ok_or_else(|| Error::Model(format!("golden has no f32 tensor `{name}`")))?;
            if shape.len() != tail.len() + 1 || shape[1..] != *tail {
                return Err(Error::Model(format!(
                    "golden tensor `{name}` has shape {shape:?}, expected [T, {tail:?}]"
                )));
            }
            Ok(data)
        };
        let (l, hc, d) = (cfg.n_layers, cfg.hc_mult, cfg.dim);
        Ok(Forcing {
            block_input: get("block_input", &[l, hc, d])?,
            pre_mix: get("pre_mix", &[l, hc])?,
            residual: get("residual", &[l, hc, d])?,
            final_pre: get("final_pre", &[hc])?,
        })
    }

    fn tokens(&self, cfg: &Config) -> usize {
        self.final_pre.len() / cfg.hc_mult
    }
}

/// One sequence being processed.
pub struct Session<'m> {
    model: &'m Model,
    options: Options,
    /// `options.index_k`, flipped by `Defect::IndexKHandoffWrong`.
    index_k: IndexK,
    ropes: Vec<Rope>,
    state: SessionState,
    logits: Vec<f32>,
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
    pub fn prefill(&mut self, tokens: &[u32], trace: &mut Trace) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Model("prefill of zero tokens".into()));
        }
        self.forward(tokens, trace, None)
    }

    /// One decode step.
    pub fn decode(&mut self, token: u32, trace: &mut Trace) -> Result<()> {
        self.forward(&[token], trace, None)
    }

    /// Teacher-forced replay of one forward (same chunk semantics), every block recomputed
    /// from the golden's `block_input` / `pre_mix` at these positions.
    pub fn replay(&mut self, tokens: &[u32], forcing: &Forcing, trace: &mut Trace) -> Result<()> {
        if self.position() + tokens.len() > forcing.tokens(&self.model.cfg) {
            return Err(Error::Model("replay runs past the golden's tokens".into()));
        }
        self.forward(tokens, trace, Some(forcing))
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
        };
        model.blocks[layer].forward(&ctx, chunk, x, pre, &mut self.state, handoff)
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        trace: &mut Trace,
        forcing: Option<&Forcing>,
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
        for &t in tokens {
            if t as usize >= cfg.vocab_size {
                return Err(Error::Model(format!(
                    "token id {t} is outside the vocabulary ({})",
                    cfg.vocab_size
                )));
            }
        }
        let first_row = trace.begin_chunk(tokens);
        let numerics = self.options.numerics;

        // §6.6.1 Engram hash ids for every row and Engram layer.
        let cols = cfg.engram_max_ngram_size.saturating_sub(1) * cfg.engram_n_heads;
        let n_eng = model.engrams.len();
        let mut hashes = PoolVec::filled(rows * n_eng * cols, 0i64);
        if let Some(h) = &model.hasher {
            for &t in tokens {
                self.state.engram_history.push(h.compressed_id(t)?);
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
                .extend(tokens.iter().map(|&t| t as i64));
        }
        if trace.enabled() {
            let o = first_row * n_eng * cols;
            trace.engram_hash[o..o + hashes.len()].copy_from_slice(&hashes);
        }

        // §6.1 embedding, expanded to hc copies; pre of layer 0 is one-hot.
        let mut x = PoolVec::filled(rows * hc * d, 0.0f32);
        let mut emb = PoolVec::filled(d, 0.0f32);
        for (r, &t) in tokens.iter().enumerate() {
            model.ckpt.rows_f32("embed.weight", t as usize, &mut emb)?;
            numerics.round(&mut emb);
            for k in 0..hc {
                x[(r * hc + k) * d..(r * hc + k + 1) * d].copy_from_slice(&emb);
            }
        }
        // Replay only: the embedded stream re-enters layer 0 (not kept on the decode path).
        let embedded = forcing.map(|_| x.clone());
        let mut pre = PoolVec::filled(rows * hc, 0.0f32);
        for r in 0..rows {
            pre[r * hc] = 1.0;
        }

        let mut handoff = Handoff::default();
        for l in 0..cfg.n_layers {
            // Replay: Engram is applied to the golden stream entering the layer.
            if let Some(f) = forcing {
                x = if l == 0 {
                    embedded.clone().unwrap_or_default()
                } else {
                    forced_rows(f.residual, chunk, cfg, l - 1, hc * d)
                };
            }
            if let Some(li) = model.engrams.iter().position(|(el, _)| *el == l) {
                let ids = gather_engram(&hashes, rows, n_eng, cols, li);
                let gates = model.engrams[li].1.forward(
                    model.ckpt.as_ref(),
                    &mut x,
                    &ids,
                    rows,
                    numerics,
                )?;
                if trace.options.sub_ops {
                    for r in 0..rows {
                        let o = ((first_row + r) * n_eng + li) * hc;
                        trace.engram_gate[o..o + hc].copy_from_slice(&gates[r * hc..(r + 1) * hc]);
                    }
                }
            }
            if trace.options.sub_ops {
                for r in 0..rows {
                    let cell = trace.cell(first_row + r, l, hc * d);
                    trace.block_input[cell].copy_from_slice(&x[r * hc * d..(r + 1) * hc * d]);
                    let cell = trace.cell(first_row + r, l, hc);
                    let p = match forcing {
                        Some(f) => forced_rows(f.pre_mix, chunk, cfg, l, hc),
                        None => pre.clone(),
                    };
                    trace.pre_mix[cell].copy_from_slice(&p[r * hc..(r + 1) * hc]);
                }
            }
            if let Some(f) = forcing {
                x = forced_rows(f.block_input, chunk, cfg, l, hc * d);
                pre = forced_rows(f.pre_mix, chunk, cfg, l, hc);
            }
            let out = self.run_block(l, chunk, &x, &pre, &mut handoff)?;
            if trace.enabled() {
                record_block(trace, first_row, l, &out, &handoff, cfg);
            }
            if trace.options.sub_ops && Some(l) == cfg.candidate_source_layer {
                record_candidates(trace, first_row, rows, &handoff, cfg);
            }
            x = out.stream;
            pre = out.pre;
        }

        // §6.7 final collapse with the last FFN pre, norm, head (last row only).
        let last = rows - 1;
        let forced_last =
            forcing.map(|f| forced_rows(f.residual, chunk, cfg, cfg.n_layers - 1, hc * d));
        let (stream, final_pre): (&[f32], &[f32]) = match (forcing, &forced_last) {
            (Some(f), Some(residual)) => (
                &residual[last * hc * d..],
                &f.final_pre[(chunk.start + last) * hc..(chunk.start + last + 1) * hc],
            ),
            _ => (&x[last * hc * d..], &pre[last * hc..]),
        };
        let mut h = PoolVec::filled(d, 0.0f32);
        hyper_connection::collapse(stream, final_pre, &mut h, numerics);
        model.norm.forward_inplace(&mut h, numerics);
        // The logits buffer of the session is reused from step to step.
        self.logits.clear();
        self.logits.resize(cfg.vocab_size, 0.0);
        model.head.forward(&h, 1, &mut self.logits, numerics)?;
        self.state.position += rows;
        trace.push_logits(chunk.start + last, &self.logits);
        Ok(())
    }
}

/// Rows of a forced [tokens, layers, width] tensor for this chunk at `layer`.
fn forced_rows(
    src: &[f32],
    chunk: Chunk,
    cfg: &Config,
    layer: usize,
    width: usize,
) -> PoolVec<f32> {
    let mut out = PoolVec::new();
    for p in chunk.start..chunk.total() {
        let o = (p * cfg.n_layers + layer) * width;
        out.extend_from_slice(&src[o..o + width]);
    }
    out
}

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

fn record_block(
    trace: &mut Trace,
    first_row: usize,
    l: usize,
    out: &BlockOutput,
    handoff: &Handoff,
    cfg: &Config,
) {
    let (hc, d, k) = (cfg.hc_mult, cfg.dim, cfg.n_activated_experts);
    let rows = out.routes.len();
    for r in 0..rows {
        let t = first_row + r;
        let cell = trace.cell(t, l, hc * d);
        trace.residual[cell].copy_from_slice(&out.stream[r * hc * d..(r + 1) * hc * d]);
        let cell = trace.cell(t, l, k);
        for (i, (e, w)) in out.routes[r]
            .experts
            .iter()
            .zip(&out.routes[r].weights)
            .enumerate()
        {
            trace.experts[cell.start + i] = *e as i32;
            trace.expert_weights[cell.start + i] = *w;
        }
        if trace.options.sub_ops {
            let cell = trace.cell(t, l, d);
            trace.attn_out[cell.clone()].copy_from_slice(&out.attn_out[r * d..(r + 1) * d]);
            trace.moe_out[cell].copy_from_slice(&out.moe_out[r * d..(r + 1) * d]);
            let cell = trace.cell(t, l, hc * d);
            trace.mid[cell].copy_from_slice(&out.mid[r * hc * d..(r + 1) * hc * d]);
        }
    }
    if cfg.index_source_layers.contains(&l) {
        let width = trace.index_topk;
        if let Some(v) = trace.topk.get_mut(&l) {
            for (r, list) in handoff.topk.iter().enumerate() {
                let row = &mut v[(first_row + r) * width..(first_row + r + 1) * width];
                row.iter_mut().for_each(|x| *x = -1);
                for (slot, &j) in row.iter_mut().zip(list.iter().filter(|&&j| j >= 0)) {
                    *slot = j as i32;
                }
            }
        }
    }
}

fn record_candidates(
    trace: &mut Trace,
    first_row: usize,
    rows: usize,
    handoff: &Handoff,
    cfg: &Config,
) {
    let keep = cfg.candidate_topk_blocks;
    let b = cfg.candidate_block_size;
    for r in 0..rows {
        let row = &mut trace.candidates[(first_row + r) * keep..(first_row + r + 1) * keep];
        row.iter_mut().for_each(|x| *x = -1);
        if let Some(mask) = handoff.candidates.as_ref().and_then(|m| m.get(r)) {
            let kept = (0..mask.len().div_ceil(b)).filter(|&blk| mask[blk * b]);
            for (slot, blk) in row.iter_mut().zip(kept) {
                *slot = blk as i32;
            }
        }
    }
}
