//! The trace recorder: a [`Trace`] observes a forward pass and keeps, per token and layer,
//! what docs/TRACE.md lists (rows in processing order).

use super::block::BlockOutput;
use super::handoff::Handoff;
use super::image_span::EncodedImage;
use super::pool::PoolVec;
use super::session::Observer;
use super::Chunk;
use crate::trace::Trace;
use crate::vision::TokenType;

impl Observer for Trace {
    fn begin_chunk(&mut self, _chunk: Chunk, tokens: &[u32]) {
        self.chunk_row = Trace::begin_chunk(self, tokens);
    }

    fn token_types(&mut self, _chunk: Chunk, types: &[TokenType]) {
        if self.enabled() {
            let o = self.chunk_row;
            for (slot, t) in self.token_types[o..o + types.len()].iter_mut().zip(types) {
                *slot = t.code();
            }
        }
    }

    fn image_encoded(&mut self, _image: usize, encoded: &EncodedImage) {
        if self.enabled() {
            self.images.push(encoded.clone());
        }
    }

    fn engram_hashes(&mut self, hashes: &[i64]) {
        if self.enabled() {
            let o = self.chunk_row * self.engram_layers * self.engram_cols;
            self.engram_hash[o..o + hashes.len()].copy_from_slice(hashes);
        }
    }

    fn engram_gates(&mut self, engram: usize, gates: &[f32]) {
        if !self.options.sub_ops {
            return;
        }
        let (hc, n_eng) = (self.hc, self.engram_layers);
        for (r, row) in gates.chunks_exact(hc).enumerate() {
            let o = ((self.chunk_row + r) * n_eng + engram) * hc;
            self.engram_gate[o..o + hc].copy_from_slice(row);
        }
    }

    fn block_input(
        &mut self,
        chunk: Chunk,
        layer: usize,
        stream: &mut PoolVec<f32>,
        pre: &mut PoolVec<f32>,
    ) {
        if !self.options.sub_ops {
            return;
        }
        let (hc, d) = (self.hc, self.dim);
        for r in 0..chunk.rows {
            let cell = self.cell(self.chunk_row + r, layer, hc * d);
            self.block_input[cell].copy_from_slice(&stream[r * hc * d..(r + 1) * hc * d]);
            let cell = self.cell(self.chunk_row + r, layer, hc);
            self.pre_mix[cell].copy_from_slice(&pre[r * hc..(r + 1) * hc]);
        }
    }

    fn block_output(&mut self, layer: usize, out: &BlockOutput, handoff: &Handoff) {
        if !self.enabled() {
            return;
        }
        let (hc, d, k) = (self.hc, self.dim, self.topk_experts);
        let first = self.chunk_row;
        for (r, route) in out.routes.iter().enumerate() {
            let t = first + r;
            let cell = self.cell(t, layer, hc * d);
            self.residual[cell].copy_from_slice(&out.stream[r * hc * d..(r + 1) * hc * d]);
            let cell = self.cell(t, layer, k);
            for (i, (e, w)) in route.experts.iter().zip(&route.weights).enumerate() {
                self.experts[cell.start + i] = *e as i32;
                self.expert_weights[cell.start + i] = *w;
            }
            self.margin_experts[t * self.n_layers + layer] = route.margin;
            if self.options.sub_ops {
                let cell = self.cell(t, layer, d);
                self.attn_out[cell.clone()].copy_from_slice(&out.attn_out[r * d..(r + 1) * d]);
                self.moe_out[cell].copy_from_slice(&out.moe_out[r * d..(r + 1) * d]);
                let cell = self.cell(t, layer, hc * d);
                self.mid[cell].copy_from_slice(&out.mid[r * hc * d..(r + 1) * hc * d]);
            }
        }
        if self.index_layers.contains(&layer) {
            self.record_selection(layer, handoff);
        }
        if Some(layer) == self.candidate_layer {
            self.record_candidates(out.routes.len(), handoff);
        }
    }

    fn final_input(&mut self, _chunk: Chunk, _stream: &mut PoolVec<f32>, pre: &mut PoolVec<f32>) {
        if self.options.sub_ops {
            let o = self.chunk_row * self.hc;
            self.final_pre[o..o + pre.len()].copy_from_slice(pre);
        }
    }

    fn logits(&mut self, position: usize, logits: &[f32]) {
        self.push_logits(position, logits);
    }
}

impl Trace {
    /// `topk.L{layer}` and its margins for the chunk's rows.
    fn record_selection(&mut self, layer: usize, handoff: &Handoff) {
        let (width, first) = (self.index_topk, self.chunk_row);
        if let Some(v) = self.topk.get_mut(&layer) {
            for (r, list) in handoff.topk.iter().enumerate() {
                let row = &mut v[(first + r) * width..(first + r + 1) * width];
                row.iter_mut().for_each(|x| *x = -1);
                for (slot, &j) in row.iter_mut().zip(list.iter().filter(|&&j| j >= 0)) {
                    *slot = j as i32;
                }
            }
        }
        if let Some(v) = self.margin_topk.get_mut(&layer) {
            v[first..first + handoff.topk_margins.len()].copy_from_slice(&handoff.topk_margins);
        }
    }

    /// The candidate source's kept blocks (sub-ops only) and their margins.
    fn record_candidates(&mut self, rows: usize, handoff: &Handoff) {
        let first = self.chunk_row;
        if handoff.candidates.is_some() {
            let m = &handoff.candidate_margins;
            self.margin_candidates[first..first + m.len()].copy_from_slice(m);
        }
        if !self.options.sub_ops {
            return;
        }
        let (keep, b) = (self.candidate_keep, self.candidate_block);
        for r in 0..rows {
            let row = &mut self.candidates[(first + r) * keep..(first + r + 1) * keep];
            row.iter_mut().for_each(|x| *x = -1);
            if let Some(mask) = handoff.candidates.as_ref().and_then(|m| m.get(r)) {
                let kept = (0..mask.len().div_ceil(b)).filter(|&blk| mask[blk * b]);
                for (slot, blk) in row.iter_mut().zip(kept) {
                    *slot = blk as i32;
                }
            }
        }
    }
}
