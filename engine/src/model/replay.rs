//! Teacher-forced replay (upstream `official_a/README.md`, "Checking an engine block by
//! block"): every block is recomputed from the golden's own `block_input` / `pre_mix` at its
//! positions, Engram is applied to the golden's stream entering the layer, and the head reads
//! the golden's final stream. Replay is an [`Observer`] that substitutes those tensors and
//! passes everything the pass computes on to the observer that records it.

use super::block::BlockOutput;
use super::handoff::Handoff;
use super::image_span::EncodedImage;
use super::pool::PoolVec;
use super::session::{Observer, Session};
use super::Chunk;
use crate::config::Config;
use crate::trace::TraceFile;
use crate::vision::{ImageInput, TokenType};
use crate::{Error, Result};

/// The golden tensors a replay forces.
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
        let forcing = Forcing {
            block_input: get("block_input", &[l, hc, d])?,
            pre_mix: get("pre_mix", &[l, hc])?,
            residual: get("residual", &[l, hc, d])?,
            final_pre: get("final_pre", &[hc])?,
        };
        let tokens = forcing.tokens(cfg);
        if [
            forcing.block_input.len() / (l * hc * d),
            forcing.pre_mix.len() / (l * hc),
            forcing.residual.len() / (l * hc * d),
        ]
        .iter()
        .any(|&t| t != tokens)
        {
            return Err(Error::Model(
                "golden forcing tensors disagree on the number of tokens".into(),
            ));
        }
        Ok(forcing)
    }

    fn tokens(&self, cfg: &Config) -> usize {
        self.final_pre.len() / cfg.hc_mult
    }
}

impl Session<'_> {
    /// Teacher-forced replay of one forward (same chunk semantics as `prefill`), every block
    /// recomputed from the golden's `block_input` / `pre_mix` at these positions; what is
    /// computed goes to `observer`.
    pub fn replay(
        &mut self,
        tokens: &[u32],
        forcing: &Forcing,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        self.replay_with_images(tokens, &[], forcing, observer)
    }

    /// [`Session::replay`] of a chunk with image spans (as [`Session::prefill_with_images`]):
    /// the images are encoded and merged as in a forward; the blocks then run on the golden's
    /// inputs.
    pub fn replay_with_images(
        &mut self,
        tokens: &[u32],
        images: &[ImageInput],
        forcing: &Forcing,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let cfg = &self.model.cfg;
        if self.position() + tokens.len() > forcing.tokens(cfg) {
            return Err(Error::Model("replay runs past the golden's tokens".into()));
        }
        let mut replay = Replay {
            forcing,
            cfg,
            inner: observer,
        };
        self.forward_chunk(tokens, images, &mut replay)
    }
}

/// The forcing observer: substitutes the golden's stream, forwards everything to `inner`.
struct Replay<'f, 'o> {
    forcing: &'f Forcing<'f>,
    cfg: &'f Config,
    inner: &'o mut dyn Observer,
}

impl Replay<'_, '_> {
    /// Rows of a forced [tokens, layers, width] tensor for this chunk at `layer`.
    fn rows(&self, src: &[f32], chunk: Chunk, layer: usize, width: usize) -> PoolVec<f32> {
        let mut out = PoolVec::new();
        for p in chunk.start..chunk.total() {
            let o = (p * self.cfg.n_layers + layer) * width;
            out.extend_from_slice(&src[o..o + width]);
        }
        out
    }
}

impl Observer for Replay<'_, '_> {
    fn begin_chunk(&mut self, chunk: Chunk, tokens: &[u32]) {
        self.inner.begin_chunk(chunk, tokens);
    }

    fn token_types(&mut self, chunk: Chunk, types: &[TokenType]) {
        self.inner.token_types(chunk, types);
    }

    fn image_encoded(&mut self, image: usize, encoded: &EncodedImage) {
        self.inner.image_encoded(image, encoded);
    }

    fn engram_hashes(&mut self, hashes: &[i64]) {
        self.inner.engram_hashes(hashes);
    }

    /// Engram is replayed on the golden's stream: its previous block output (layer 0 keeps
    /// the embedding, which the golden does not carry separately).
    fn layer_input(&mut self, chunk: Chunk, layer: usize, stream: &mut PoolVec<f32>) {
        if layer > 0 {
            let width = self.cfg.hc_mult * self.cfg.dim;
            *stream = self.rows(self.forcing.residual, chunk, layer - 1, width);
        }
        self.inner.layer_input(chunk, layer, stream);
    }

    fn engram_gates(&mut self, engram: usize, gates: &[f32]) {
        self.inner.engram_gates(engram, gates);
    }

    /// Recorded: the engine's own Engram step on the golden stream, with the golden `pre`;
    /// then the block runs on the golden's `block_input`.
    fn block_input(
        &mut self,
        chunk: Chunk,
        layer: usize,
        stream: &mut PoolVec<f32>,
        pre: &mut PoolVec<f32>,
    ) {
        let (hc, d) = (self.cfg.hc_mult, self.cfg.dim);
        *pre = self.rows(self.forcing.pre_mix, chunk, layer, hc);
        self.inner.block_input(chunk, layer, stream, pre);
        *stream = self.rows(self.forcing.block_input, chunk, layer, hc * d);
    }

    fn block_output(&mut self, layer: usize, out: &BlockOutput, handoff: &Handoff) {
        self.inner.block_output(layer, out, handoff);
    }

    /// The head reads the golden's last block output, collapsed with the golden `final_pre`.
    fn final_input(&mut self, chunk: Chunk, stream: &mut PoolVec<f32>, pre: &mut PoolVec<f32>) {
        let (l, hc, d) = (self.cfg.n_layers, self.cfg.hc_mult, self.cfg.dim);
        *stream = self.rows(self.forcing.residual, chunk, l - 1, hc * d);
        *pre = PoolVec::from_slice(&self.forcing.final_pre[chunk.start * hc..chunk.total() * hc]);
        self.inner.final_input(chunk, stream, pre);
    }

    fn logits(&mut self, position: usize, logits: &[f32]) {
        self.inner.logits(position, logits);
    }
}
