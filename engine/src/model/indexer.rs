//! Lightning indexer and the two-level top-k (MODEL.md §6.4.4, §6.4.6).
//!
//! Index keys come from the KV source's pre-rope latent (`k_norm(wk(latent))`, roped at the
//! group's first position, FP4/E8M0-QDQ'd upstream). Queries come from `qr` (`wq_b`, roped,
//! FP4/E8M0-QDQ'd per head). `score[t] = Σ_h relu(iq_h · key_t) · w_h`, a bf16 number
//! upstream. The candidate source turns its scores into candidate blocks (with the newest
//! reachable block pinned); index sources after it mask their scores to those blocks.

use std::cell::Cell;
use std::sync::Arc;

use super::parallel::{for_each_chunk, worth_parallel};

use super::cache::state::IndexKeys;
use super::cache::state::SessionState;
use super::compressor::Emitted;
use super::defects::{Defect, DefectSet};
use super::handoff::Handoff;
use super::index_grid::{KeyTile, QueryGrid, TILE_KEYS};
use super::linear::{Linear, LinearKind};
use super::norm::RmsNorm;
use super::numerics::Numerics;
use super::pool::PoolVec;
use super::quant;
use super::rope::Rope;
use super::simd::{self, Level};
use super::topk;
use super::{Chunk, LayerCtx};
use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::{Error, Result};

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

    /// `score[t] = Σ_h relu(iq_h · key_t) · w_h` for t < n. Each dot is one f64 chain in
    /// increasing index from the empty sum's start (rule C2, as `Iterator::sum` adds);
    /// `KEY_LANES` keys are scored together, one per vector lane. Where the query and a tile of
    /// keys are on the integer grid (`index_grid`, upstream), that tile's dots are the exact
    /// integer sums, which are the chain's.
    pub fn scores(
        &self,
        iq: &[f32],
        w: &[f32],
        keys: &IndexKeys,
        n: usize,
        numerics: Numerics,
    ) -> PoolVec<f32> {
        let heads = Heads {
            iq,
            w,
            dim: self.head_dim,
        };
        score_all(simd::level(), &heads, keys, n, numerics)
    }
}

/// [`Indexer::scores`] at `level`.
fn score_all(
    level: Level,
    heads: &Heads,
    keys: &IndexKeys,
    n: usize,
    numerics: Numerics,
) -> PoolVec<f32> {
    let hd = heads.dim;
    let mut scores = PoolVec::filled(n, 0.0f32);
    let parallel = worth_parallel(n * heads.w.len() * hd);
    // The integer dots are VNNI's; a query off the grid (e.g. the exact profile) has none.
    let query = if level >= Level::Avx512Vnni {
        QueryGrid::of(heads.iq, hd, keys.grid().blocks())
    } else {
        None
    };
    let rows = keys.rows();
    for_each_chunk(&mut scores, KEY_LANES, parallel, |g, out| {
        let tile_rows = &rows[g * KEY_LANES * hd..][..out.len() * hd];
        let grid = query.as_ref().and_then(|q| {
            let tile = keys.grid().tile(g)?;
            tile.range
                .fits_with(q.range)
                .then_some(GridDots { query: q, tile })
        });
        score_keys_at(level, heads, tile_rows, grid, out, numerics)
    });
    scores
}

/// A query and a tile of keys both on the integer grid, their dots exact in the chain
/// (`index_grid`). Only made at [`Level::Avx512Vnni`].
#[derive(Clone, Copy)]
struct GridDots<'a> {
    query: &'a QueryGrid,
    tile: KeyTile<'a>,
}

impl GridDots<'_> {
    /// Head `h`'s dots with the tile's keys.
    #[inline(always)]
    fn head(&self, h: usize, dots: &mut [f64; KEY_LANES]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `GridDots` is made only where the CPU has VNNI (`score_all`); query and
        // tile have the same block count (the query's is read off the keys).
        unsafe {
            simd::vnni::index_dots_vnni(dots, self.query.head(h), &self.tile)
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (self.query, self.tile, dots);
            unreachable!("grid dots of head {h}: VNNI is x86's");
        }
    }
}

/// One query's index heads: queries `iq` [heads, dim] and weights `w` [heads].
#[derive(Clone, Copy)]
struct Heads<'a> {
    iq: &'a [f32],
    w: &'a [f32],
    dim: usize,
}

/// [`score_keys`] compiled for `level` (every copy gives the same bits).
fn score_keys_at(
    level: Level,
    heads: &Heads,
    keys: &[f32],
    grid: Option<GridDots>,
    out: &mut [f32],
    numerics: Numerics,
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` is at most what the CPU has: AVX-512 and VNNI here.
        l if l >= Level::Avx512Vnni => unsafe { score_keys_vnni(heads, keys, grid, out, numerics) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` is at most what the CPU has: AVX2 and FMA at least here.
        l if l >= Level::Avx2 => unsafe { score_keys_avx2(heads, keys, grid, out, numerics) },
        _ => score_keys(Level::Portable, heads, keys, grid, out, numerics),
    }
}

/// With the grid's kernel inlined into the heads' loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn score_keys_vnni(
    heads: &Heads,
    keys: &[f32],
    grid: Option<GridDots>,
    out: &mut [f32],
    numerics: Numerics,
) {
    score_keys(Level::Avx512Vnni, heads, keys, grid, out, numerics)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_keys_avx2(
    heads: &Heads,
    keys: &[f32],
    grid: Option<GridDots>,
    out: &mut [f32],
    numerics: Numerics,
) {
    score_keys(Level::Avx2, heads, keys, grid, out, numerics)
}

/// [`Indexer::scores`] for up to [`KEY_LANES`] keys (`keys` [out.len(), dim]): per head
/// every key's dot, either from `grid` or from the keys transposed into columns, every key's
/// chain advancing over the columns (a product of two f32 is exact in f64, so
/// multiply-then-add is each step of the scalar sum), the keys being independent chains in
/// vector lanes; the heads' terms are added to the keys' totals in head order.
#[inline(always)]
fn score_keys(
    level: Level,
    heads: &Heads,
    keys: &[f32],
    grid: Option<GridDots>,
    out: &mut [f32],
    numerics: Numerics,
) {
    let hd = heads.dim;
    let start = std::iter::empty::<f64>().sum::<f64>();
    let (mut columns, mut q) = KEY_SCRATCH.with(Cell::take);
    columns.clear();
    if grid.is_none() {
        // Lanes past `out.len()` stay zero and are never written out.
        columns.resize(hd, [0.0; KEY_LANES]);
        for (l, key) in keys.chunks_exact(hd).enumerate() {
            for (c, &k) in columns.iter_mut().zip(key) {
                c[l] = f64::from(k);
            }
        }
    }
    let mut total = [0f64; KEY_LANES];
    for (h, (qh, &wh)) in heads.iq.chunks_exact(hd).zip(heads.w).enumerate() {
        let mut dot = [start; KEY_LANES];
        match &grid {
            Some(grid) => grid.head(h, &mut dot),
            None => {
                q.clear();
                q.extend(qh.iter().map(|&v| f64::from(v)));
                #[cfg(target_arch = "x86_64")]
                if level >= Level::Avx2 {
                    // SAFETY: `level` is Avx2 or above only inside `score_keys_avx2` / `_vnni`.
                    unsafe { simd::x86::chains_32(&mut dot, &q, &columns) };
                }
                if level < Level::Avx2 {
                    for (&qd, c) in q.iter().zip(columns.iter()) {
                        for (a, &k) in dot.iter_mut().zip(c) {
                            *a += qd * k;
                        }
                    }
                }
            }
        }
        // One loop per regime, so neither tests the regime per lane.
        if numerics.is_upstream() {
            for (t, &d) in total.iter_mut().zip(&dot) {
                *t += f64::from(quant::bf16(quant::bf16(d as f32).max(0.0) * wh));
            }
        } else {
            for (t, &d) in total.iter_mut().zip(&dot) {
                *t += f64::from((d as f32).max(0.0) * wh);
            }
        }
    }
    for (o, &t) in out.iter_mut().zip(&total) {
        *o = numerics.round1(t as f32);
    }
    KEY_SCRATCH.with(|c| c.set((columns, q)));
}

/// Index keys scored together by [`Indexer::scores`]: independent chains, one per lane, as
/// many as the 32-row chain kernel advances at once.
const KEY_LANES: usize = 32;
// One scorer call is one tile of the keys' integer form.
const _: () = assert!(KEY_LANES == TILE_KEYS);

thread_local! {
    /// [`score_keys`]' transposed keys and one head's query in f64, reused (taken while in
    /// use).
    static KEY_SCRATCH: Cell<(Vec<[f64; KEY_LANES]>, Vec<f64>)> =
        const { Cell::new((Vec::new(), Vec::new())) };
}

/// Candidate blocks of the candidate source for one query (§6.4.6): `scores` over the
/// chunk's `compress_len` positions (causally masked), `visible` = compressed positions the
/// query can reach. Returns a mask over the positions and the margin of the block choice.
pub fn candidate_mask(
    scores: &[f32],
    visible: usize,
    block: usize,
    keep: usize,
    defects: &DefectSet,
) -> Result<(PoolVec<bool>, f32)> {
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
    let kept = topk::select(
        &block_scores,
        keep.min(n_blocks),
        defects.has(Defect::TopkTiesReversed),
        "candidate blocks",
    )?;
    let mut mask = PoolVec::filled(n, false);
    for &b in kept.indices.iter() {
        if block_scores[b] == f32::NEG_INFINITY {
            continue;
        }
        for m in &mut mask[b * block..n.min((b + 1) * block)] {
            *m = true;
        }
    }
    Ok((mask, kept.margin))
}

/// Index selection for one query (§6.4.4): the `k` highest scores (tie rule), ascending,
/// with positions the query cannot see (`t ≥ visible`) mapped to −1; and the margin.
pub fn select(
    scores: &[f32],
    k: usize,
    visible: usize,
    defects: &DefectSet,
) -> Result<(PoolVec<i64>, f32)> {
    let mut chosen = topk::select(
        scores,
        k,
        defects.has(Defect::TopkTiesReversed),
        "index selection",
    )?;
    chosen.indices.sort_unstable();
    let list = chosen
        .indices
        .iter()
        .map(|&t| if t < visible { t as i64 } else { -1 })
        .collect();
    Ok((list, chosen.margin))
}

impl Indexer {
    /// Scores, causality, candidate blocks and top-k of index source `layer` (ratio `r`) for
    /// every row of the chunk (§6.4.4, §6.4.6), written to the hand-off with their margins.
    /// A candidate consumer's margin is the lower of its own and the candidate source's, as
    /// the official goldens record it: either decision flipping can change the selection.
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        ctx: &LayerCtx,
        layer: usize,
        r: usize,
        chunk: Chunk,
        qr: &[f32],
        u: &[f32],
        state: &SessionState,
        handoff: &mut Handoff,
    ) -> Result<()> {
        let cfg = ctx.cfg;
        let is_candidate_source = Some(layer) == cfg.candidate_source_layer;
        let is_candidate_consumer = cfg.candidate_source_layer.is_some_and(|c| layer > c);
        let compress_len = chunk.total() / r;
        if compress_len == 0 {
            if is_candidate_source {
                handoff.candidates = None;
            }
            handoff.topk = (0..chunk.rows).map(|_| PoolVec::new()).collect();
            handoff.topk_margins = PoolVec::filled(chunk.rows, f32::INFINITY);
            return Ok(());
        }
        let published = state.published_index_k.ok_or_else(|| {
            Error::Model(format!(
                "layer {layer}: no index-key cache has been published yet"
            ))
        })?;
        let keys = state.layers[published].compressed.as_ref().ok_or_else(|| {
            Error::Model(format!(
                "layer {published}: published index keys of a layer without a cache"
            ))
        })?;
        if keys.index_key_count() < compress_len {
            return Err(Error::Model(format!(
                "layer {layer}: needs {compress_len} index keys but layer {published} published {}",
                keys.index_key_count()
            )));
        }
        let fp4_ties = quant::Fp4Ties::for_defects(ctx.defects);
        let (iq, w) = self.queries(
            qr,
            u,
            chunk.rows,
            chunk.start,
            ctx.rope,
            ctx.numerics,
            fp4_ties,
        )?;
        let (nh, hd) = (self.n_heads, self.head_dim);
        let k = cfg.index_topk.min(compress_len);
        let mut masks = PoolVec::new();
        let mut block_margins = PoolVec::new();
        let mut lists = PoolVec::new();
        let mut margins = PoolVec::new();
        for t in 0..chunk.rows {
            let p = chunk.start + t;
            let visible = (p + 1) / r;
            let mut scores = self.scores(
                &iq[t * nh * hd..(t + 1) * nh * hd],
                &w[t * nh..(t + 1) * nh],
                &keys.index_keys,
                compress_len,
                ctx.numerics,
            );
            for s in scores.iter_mut().skip(visible) {
                *s = f32::NEG_INFINITY;
            }
            let mut floor = f32::INFINITY;
            if is_candidate_source {
                let (mask, margin) = candidate_mask(
                    &scores,
                    visible,
                    cfg.candidate_block_size,
                    cfg.candidate_topk_blocks,
                    ctx.defects,
                )?;
                masks.push(mask);
                block_margins.push(margin);
            } else if is_candidate_consumer {
                let missing = || Error::Model(format!("layer {layer}: candidate blocks missing"));
                let mask = handoff
                    .candidates
                    .as_ref()
                    .and_then(|m| m.get(t))
                    .ok_or_else(missing)?;
                for (s, keep) in scores.iter_mut().zip(mask) {
                    if !keep {
                        *s = f32::NEG_INFINITY;
                    }
                }
                floor = *handoff.candidate_margins.get(t).ok_or_else(missing)?;
            }
            let (list, margin) = select(&scores, k, visible, ctx.defects)?;
            lists.push(list);
            margins.push(margin.min(floor));
        }
        if is_candidate_source {
            handoff.candidates = Some(masks);
            handoff.candidate_margins = block_margins;
        }
        handoff.topk = lists;
        handoff.topk_margins = margins;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::index_grid::GridBlock;
    use super::*;

    /// The scalar definition: per key and head one f64 `sum` in increasing index.
    fn scalar_score(heads: &Heads, key: &[f32], numerics: Numerics) -> f32 {
        let mut acc = 0.0f64;
        for (q, &wh) in heads.iq.chunks_exact(heads.dim).zip(heads.w) {
            let dot: f64 = q.iter().zip(key).map(|(a, b)| *a as f64 * *b as f64).sum();
            let dot = numerics.round1(dot as f32).max(0.0);
            acc += numerics.round1(dot * wh) as f64;
        }
        numerics.round1(acc as f32)
    }

    /// Keys scored a lane each give the scalar definition's bits, for every group size, in
    /// both profiles and at every vector level (zero dots included: a ReLU at exactly 0).
    #[test]
    fn keys_scored_together_equal_the_scalar_sums() {
        let mut state = 1u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                * if state.is_multiple_of(7) { 0.0 } else { 1.0 }
        };
        let (n_heads, dim) = (9, 24);
        // Each head's first two weights are large and every key's first two values cancel
        // through them: in increasing order the small terms after them add exactly, in any
        // order that meets them first their sum is rounded at the large scale.
        let iq: Vec<f32> = (0..n_heads * dim)
            .map(|i| if i % dim < 2 { 1.5e9 } else { next() * 1e3 })
            .collect();
        let w: Vec<f32> = (0..n_heads).map(|_| next()).collect();
        let heads = Heads {
            iq: &iq,
            w: &w,
            dim,
        };
        for n in 1..=KEY_LANES {
            let keys: Vec<f32> = (0..n * dim)
                .map(|i| match i % dim {
                    0 => 3.0e9,
                    1 => -3.0e9,
                    _ => next() * 3.0,
                })
                .collect();
            for numerics in [Numerics::Upstream, Numerics::Exact] {
                let want: Vec<f32> = keys
                    .chunks_exact(dim)
                    .map(|k| scalar_score(&heads, k, numerics))
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for level in Level::ALL.into_iter().filter(|&l| l <= simd::available()) {
                    let mut got = vec![f32::NAN; n];
                    score_keys_at(level, &heads, &keys, None, &mut got, numerics);
                    assert_eq!(bits(&got), bits(&want), "{n} keys {numerics} {level:?}");
                }
            }
        }
    }

    /// Every grid dot of `keys`' first `n` keys (by its definition, `KeyTile::dots`) against
    /// the f64 chain of rule C2, head by head: equal wherever the tile fits the query's spread.
    /// Returns the tiles that fit, those declined, and the declined ones where some grid dot
    /// differs from its chain.
    fn grid_against_chains(iq: &[f32], keys: &IndexKeys, n: usize) -> (usize, usize, usize) {
        let dim = keys.rows().len() / keys.count();
        let query =
            QueryGrid::of(iq, dim, dim / quant::BLOCK).expect("a QDQ'd query is on the grid");
        let (mut fit, mut declined, mut differ) = (0, 0, 0);
        for g in 0..n.div_ceil(KEY_LANES) {
            let tile = keys.grid().tile(g).expect("QDQ'd keys are on the grid");
            let fits = tile.range.fits_with(query.range);
            let mut differs = false;
            for (h, qh) in iq.chunks_exact(dim).enumerate() {
                let dots = tile.dots(query.head(h));
                let tile_keys = keys.rows()[g * KEY_LANES * dim..n * dim].chunks_exact(dim);
                for (j, key) in tile_keys.take(KEY_LANES).enumerate() {
                    let chain: f64 = qh
                        .iter()
                        .zip(key)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    // `==`: a zero's sign may differ (erased by the ReLU).
                    if fits {
                        assert!(
                            dots[j] == chain,
                            "tile {g} head {h} key {j}: {} vs {chain}",
                            dots[j]
                        );
                    }
                    differs |= dots[j] != chain;
                }
            }
            if fits {
                fit += 1;
            } else {
                declined += 1;
                differ += usize::from(differs);
            }
        }
        (fit, declined, differ)
    }

    /// Scores at every level this CPU has (the grid's integer dots at VNNI) equal the
    /// portable chains' bits, in both profiles.
    fn scores_agree_at_every_level(heads: &Heads, keys: &IndexKeys, n: usize, what: &str) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for numerics in [Numerics::Upstream, Numerics::Exact] {
            let want = score_all(Level::Portable, heads, keys, n, numerics);
            for level in Level::ALL.into_iter().filter(|&l| l <= simd::available()) {
                let got = score_all(level, heads, keys, n, numerics);
                assert_eq!(bits(&got), bits(&want), "{what}, {numerics}, {level:?}");
            }
        }
    }

    /// Keys and queries FP4-QDQ'd as upstream, over 1 to 4 blocks, with block scales from
    /// 2^−140 to 2^100 and zero blocks: every grid dot of a tile that fits the spread bound
    /// equals its f64 chain (on any CPU), and so do the scores at every level this CPU has.
    /// Sizes 1..=70 keys cover partial tiles.
    #[test]
    fn grid_dots_give_the_chains_bits() {
        let mut state = 7u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let (mut fit, mut declined) = (0, 0);
        for case in 0..48 {
            let blocks = 1 + case % 4;
            let dim = blocks * quant::BLOCK;
            let n_heads = 3;
            // Per case a spread of block exponents: narrow (always on the grid), then wide
            // (tiles declined).
            let spread = [4, 20, 60, 240][case / 12] as u64;
            let block = |next: &mut dyn FnMut() -> u64, out: &mut Vec<f32>| {
                let kind = next() % 16;
                let e = (next() % (spread + 1)) as i32 - (spread as i32) / 2;
                let e = e.clamp(-140, 100);
                for _ in 0..quant::BLOCK {
                    let v = match kind {
                        0 => 0.0,
                        _ => (next() % 2001) as f32 / 1000.0 - 1.0,
                    };
                    out.push(v * 2f32.powi(e));
                }
                let at = out.len() - quant::BLOCK;
                quant::fp4_qdq_e8m0(&mut out[at..]);
            };
            let mut iq = Vec::new();
            for _ in 0..n_heads * blocks {
                block(&mut next, &mut iq);
            }
            let w: Vec<f32> = (0..n_heads)
                .map(|_| (next() % 1000) as f32 / 500.0)
                .collect();
            let n = 1 + (next() % 70) as usize;
            let mut rows = Vec::new();
            for _ in 0..n * blocks {
                block(&mut next, &mut rows);
            }
            let keys = IndexKeys::from_rows(dim, rows);
            let (f, d, _) = grid_against_chains(&iq, &keys, n);
            fit += f;
            declined += d;
            let heads = Heads {
                iq: &iq,
                w: &w,
                dim,
            };
            scores_agree_at_every_level(
                &heads,
                &keys,
                n,
                &format!("case {case}: {n} keys of {dim}"),
            );
        }
        assert!(
            fit > 20 && declined > 5,
            "{fit} tiles on the grid, {declined} declined"
        );
    }

    /// Blocks 0 and 2 of every key cancel through the query; block 1's terms are 2^-51. Where
    /// block 0's sum is at least 8, the chain rounds each of them away before block 2 cancels
    /// it, while their sum (2^-46) is not rounded away: the blocks' integer sums are not the
    /// chain there. The spread bound must decline such a tile (a looser bound fails here).
    #[test]
    fn the_spread_bound_declines_a_tile_whose_chain_rounds() {
        let dim = 3 * quant::BLOCK;
        let outer: Vec<f32> = (0..quant::BLOCK)
            .map(|i| ((i % 7) as f32 - 3.0) / 2.0)
            .collect();
        let iq = [outer.clone(), vec![1.0; quant::BLOCK], outer].concat();
        let w = [1.0f32];
        let mut rows = Vec::new();
        for key in 0..KEY_LANES {
            let big: Vec<f32> = (0..quant::BLOCK)
                .map(|i| ((i * 5 + key) % 13) as f32 - 6.0)
                .collect();
            rows.extend(&big);
            rows.extend([2f32.powi(-51); quant::BLOCK]);
            rows.extend(big.iter().map(|v| -v));
        }
        let keys = IndexKeys::from_rows(dim, rows);
        assert_eq!(
            grid_against_chains(&iq, &keys, KEY_LANES),
            (0, 1, 1),
            "the tile is declined, and its grid dots are not the chains"
        );
        let heads = Heads {
            iq: &iq,
            w: &w,
            dim,
        };
        scores_agree_at_every_level(&heads, &keys, KEY_LANES, "cancelling blocks");
    }

    /// Values off the grid (not QDQ'd, or not finite) give no integer form: such a key's tile,
    /// or such a query, is scored by the chains.
    #[test]
    fn values_off_the_grid_have_no_integer_form() {
        let mut block = [0.25f32; quant::BLOCK];
        assert!(GridBlock::of(&block).is_some());
        block[3] = 0.3;
        assert!(
            GridBlock::of(&block).is_none(),
            "0.3 is no multiple of 2^-8"
        );
        block[3] = 1.0 / 128.0;
        let g = GridBlock::of(&block).expect("multiples of 2^-8 with the max 0.25");
        assert_eq!((g.codes[0], g.codes[3], g.exp), (64, 2, Some(-8)));
        block[3] = 1.0 / 1024.0;
        assert!(GridBlock::of(&block).is_none(), "below the unit");
        for bad in [f32::NAN, f32::INFINITY] {
            block[3] = bad;
            assert!(GridBlock::of(&block).is_none(), "{bad}");
        }
        let mut zeros = [0.0f32; quant::BLOCK];
        zeros[5] = -0.0;
        assert_eq!(GridBlock::of(&zeros).map(|g| g.exp), Some(None));
        zeros[5] = f32::NAN;
        assert!(GridBlock::of(&zeros).is_none(), "a NaN among zeros");
        // A key off the grid takes its tile off; the next tile is unaffected.
        let dim = quant::BLOCK;
        let mut rows = vec![0.5f32; (KEY_LANES + 1) * dim];
        rows[7 * dim] = 0.3;
        let keys = IndexKeys::from_rows(dim, rows);
        assert!(keys.grid().tile(0).is_none());
        assert!(keys.grid().tile(1).is_some());
        // Widths that are no multiple of the block have no integer form at all.
        let keys = IndexKeys::from_rows(24, vec![0.5; 48]);
        assert!(keys.grid().tile(0).is_none());
    }
}
