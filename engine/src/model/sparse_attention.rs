//! Sparse attention over an index list with a per-head sink (MODEL.md §5.7).
//!
//! One query row `q [H, Dh]` attends to the rows of a shared key = value set `kv [rows, Dh]`
//! named by an index list (`−1` = unused slot). The sink joins the softmax denominator only:
//! it is neither scaled nor part of the max.
//!
//! Reduction orders (C2, MODEL.md §5.4), identical in both regimes:
//! * a score is `f32(Σ_d q[d]·kv[d]) · scale`: the dot accumulated in f64 in increasing d,
//!   rounded once to f32, then an f32 product with the scale;
//! * a probability sum and a P·V column `Σ_j p_j·kv_j[d]` are accumulated in f64 in list order
//!   (over the list entries of a 64-block in the upstream regime, over all valid entries in the
//!   exact regime) and rounded once to f32.
//!
//! Callers lay the list out as the reference does (window entries first, oldest position
//! first, then compressed entries ascending), so the valid entries come in the same order in
//! prefill and decode; the exact regime then depends only on that order, not on where the
//! `−1` placeholders sit.

use std::cell::Cell;

use super::parallel::{for_each_chunk, worth_parallel};

use super::numerics::Numerics;
use super::quant::bf16;
use super::simd::{self, madd, Level};
use crate::{Error, Result};

/// Index-list block of the upstream kernel's online softmax.
pub const KERNEL_BLOCK: usize = 64;
/// The kernel's finite initial running max (so an all-placeholder row gives 0, not NaN).
const RUNNING_MAX_INIT: f32 = -1e30;

/// Attend `q` (`[H, Dh]`) to `kv` rows selected by `idx`, writing `out` (`[H, Dh]`).
/// `sink` holds one logit per head; `scale` multiplies the f32 dot products.
///
/// * [`Numerics::Exact`]: closed form over the valid indices — `M` = max valid score,
///   `out = Σ e^{s_j−M} kv_j / (Σ e^{s_j−M} + e^{sink−M})` with f32 exponentials; 0 when no
///   index is valid; an overflowing `e^{sink−M}` (sink − M ≳ 88) gives 0, as in the reference.
/// * [`Numerics::Upstream`]: the kernel's online softmax over 64-entry blocks in list order,
///   running max from −1e30, placeholders occupying list positions, probabilities rounded to
///   bf16 before P·V (the denominator keeps them in f32), accumulator rescaled between blocks,
///   output rounded to bf16.
///
/// Errors (never panics) on inconsistent lengths or an index outside `-1..rows`.
pub fn sparse_attention(
    q: &[f32],
    kv: &[f32],
    sink: &[f32],
    idx: &[i64],
    scale: f32,
    numerics: Numerics,
    out: &mut [f32],
) -> Result<()> {
    let heads = sink.len();
    if heads == 0 || !q.len().is_multiple_of(heads) {
        return Err(Error::Model(format!(
            "sparse attention: q has {} values, not a multiple of {heads} heads",
            q.len()
        )));
    }
    let dh = q.len() / heads;
    if dh == 0 || !kv.len().is_multiple_of(dh) || out.len() != q.len() {
        return Err(Error::Model(format!(
            "sparse attention: head width {dh}, kv has {} values, out has {} (want {})",
            kv.len(),
            out.len(),
            q.len()
        )));
    }
    let rows = (kv.len() / dh) as i64;
    if let Some((pos, &bad)) = idx.iter().enumerate().find(|(_, &j)| j < -1 || j >= rows) {
        return Err(Error::Model(format!(
            "sparse attention: index list entry {pos} is {bad}, outside -1..{rows}"
        )));
    }
    attend_groups(simd::level(), (q, kv, sink), idx, scale, numerics, out);
    Ok(())
}

/// [`sparse_attention`] on checked inputs, its groups of heads compiled for `level`.
fn attend_groups(
    level: Level,
    (q, kv, sink): (&[f32], &[f32], &[f32]),
    idx: &[i64],
    scale: f32,
    numerics: Numerics,
    out: &mut [f32],
) {
    let dh = q.len() / sink.len();
    let parallel = worth_parallel(out.len() * idx.len());
    for_each_chunk(out, HEAD_LANES * dh, parallel, |g, o| {
        let heads = HEAD_LANES * g..HEAD_LANES * g + o.len() / dh;
        let group = Group {
            q: &q[heads.start * dh..heads.end * dh],
            sinks: &sink[heads],
            kv,
            dh,
            idx,
            scale,
            numerics,
        };
        attend_at(level, group, o);
    });
}

/// Heads attended together: their score chains run side by side, one f64 lane each.
const HEAD_LANES: usize = 8;

/// Keys whose score chains advance together (independent chains hide the add's latency).
const KEY_CHAINS: usize = 4;

/// One call's work for up to [`HEAD_LANES`] heads: their queries and sinks, the key = value
/// rows, the index list, the scale and the regime.
#[derive(Clone, Copy)]
struct Group<'a> {
    q: &'a [f32],
    sinks: &'a [f32],
    kv: &'a [f32],
    dh: usize,
    idx: &'a [i64],
    scale: f32,
    numerics: Numerics,
}

impl Group<'_> {
    fn heads(&self) -> usize {
        self.sinks.len()
    }

    fn kv_row(&self, j: usize) -> &[f32] {
        &self.kv[j * self.dh..(j + 1) * self.dh]
    }
}

/// [`attend`] compiled for `level` (every copy gives the same bits).
fn attend_at(level: Level, group: Group, out: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` is at most what the CPU has: AVX-512 F at least here.
        l if l >= Level::Avx512 => unsafe { attend_avx512(group, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` is at most what the CPU has: AVX2 and FMA at least here.
        l if l >= Level::Avx2 => unsafe { attend_avx2(group, out) },
        _ => attend(Level::Portable, group, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn attend_avx512(group: Group, out: &mut [f32]) {
    attend(Level::Avx512, group, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(group: Group, out: &mut [f32]) {
    attend(Level::Avx2, group, out)
}

/// One group of heads, either regime. The queries are transposed into columns of one value
/// per head, so that a key's row is read once for the group and each head's score chain
/// sits in its own lane; the per-head work after the scores is [`exact_heads`] or
/// [`upstream_heads`].
#[inline(always)]
fn attend(level: Level, group: Group, out: &mut [f32]) {
    let idx = group.idx;
    let (dh, heads) = (group.dh, group.heads());
    let score_rows = match group.numerics {
        Numerics::Exact => idx.len(),
        Numerics::Upstream => KERNEL_BLOCK.min(idx.len()),
    };
    // Taken and returned by hand: a closure would be compiled without the caller's target
    // features (its multiply-adds became library calls).
    let mut scratch = F64_SCRATCH.with(Cell::take);
    scratch.clear();
    scratch.resize(HEAD_LANES * (dh + score_rows) + heads * dh + dh, 0.0);
    let (columns, rest) = scratch.split_at_mut(HEAD_LANES * dh);
    let (scores, rest) = rest.split_at_mut(HEAD_LANES * score_rows);
    let (sums, row) = rest.split_at_mut(heads * dh);
    let columns = columns.as_chunks_mut::<HEAD_LANES>().0;
    for (h, qh) in group.q.chunks_exact(dh).enumerate() {
        for (column, &v) in columns.iter_mut().zip(qh) {
            column[h] = f64::from(v);
        }
    }
    let work = Work {
        level,
        group,
        columns,
    };
    let buffers = Buffers {
        scores: scores.as_chunks_mut::<HEAD_LANES>().0,
        sums,
        row,
    };
    match group.numerics {
        Numerics::Exact => exact_heads(work, buffers, out),
        Numerics::Upstream => upstream_heads(work, buffers, out),
    }
    F64_SCRATCH.with(|c| c.set(scratch));
}

/// What the per-head steps share: the level, the group and its query columns.
#[derive(Clone, Copy)]
struct Work<'a> {
    level: Level,
    group: Group<'a>,
    columns: &'a [[f64; HEAD_LANES]],
}

impl Work<'_> {
    /// `scores[i][h]` for the valid entries `j = idx[i]`: head h's score of key j,
    /// `f32(Σ_d q[d]·kv_j[d]) · scale` with the dot one f64 chain from +0.0 in increasing d
    /// (a product of two f32 is exact in f64, so a fused multiply-add is each step of the
    /// scalar sum). Rows of placeholders are left as they are.
    #[inline(always)]
    fn scores(&self, idx: &[i64], scores: &mut [[f64; HEAD_LANES]]) {
        let mut valid = idx
            .iter()
            .enumerate()
            .filter(|&(_, &j)| j >= 0)
            .map(|(i, &j)| (i, j as usize));
        loop {
            let mut batch = [(0, 0); KEY_CHAINS];
            let mut count = 0;
            for (slot, entry) in batch.iter_mut().zip(valid.by_ref()) {
                *slot = entry;
                count += 1;
            }
            if count == 0 {
                return;
            }
            // Short batches repeat their first key; the repeats are not stored.
            let keys: [&[f32]; KEY_CHAINS] = std::array::from_fn(|c| {
                let (_, j) = batch[if c < count { c } else { 0 }];
                self.group.kv_row(j)
            });
            let chains = self.chains(keys);
            for (&(i, _), chain) in batch[..count].iter().zip(chains) {
                scores[i] = chain.map(|dot| f64::from((dot as f32) * self.group.scale));
            }
        }
    }

    /// The dots of [`KEY_CHAINS`] keys with every head of the group.
    #[inline(always)]
    fn chains(&self, keys: [&[f32]; KEY_CHAINS]) -> [[f64; HEAD_LANES]; KEY_CHAINS] {
        let dh = self.group.dh;
        let keys = keys.map(|k| &k[..dh]);
        let mut acc = [[0f64; HEAD_LANES]; KEY_CHAINS];
        for (d, column) in self.columns[..dh].iter().enumerate() {
            for (chain, key) in acc.iter_mut().zip(&keys) {
                let k = f64::from(key[d]);
                for (a, &q) in chain.iter_mut().zip(column) {
                    *a = madd(self.level, *a, q, k);
                }
            }
        }
        acc
    }

    /// `sum[d] += p · row[d]` for a head's running P·V sum (`p` a widened f32 or bf16, `row`
    /// a widened f32 row: the products are exact in f64).
    #[inline(always)]
    fn add_scaled(&self, sum: &mut [f64], p: f64, row: &[f64]) {
        for (a, &v) in sum.iter_mut().zip(row) {
            *a = madd(self.level, *a, p, v);
        }
    }
}

/// A group's working memory: the scores (entries × heads), one running sum per head and
/// head width, and one key = value row widened to f64.
struct Buffers<'a> {
    scores: &'a mut [[f64; HEAD_LANES]],
    sums: &'a mut [f64],
    row: &'a mut [f64],
}

/// The closed form of §5.7 for each head of the group.
#[inline(always)]
fn exact_heads(work: Work, buffers: Buffers, out: &mut [f32]) {
    let idx = work.group.idx;
    let (scores, num, row) = (buffers.scores, buffers.sums, buffers.row);
    let (group, dh) = (work.group, work.group.dh);
    if idx.iter().all(|&j| j < 0) {
        out.fill(0.0);
        return;
    }
    work.scores(idx, scores);
    let heads = group.heads();
    let mut max = [f32::NEG_INFINITY; HEAD_LANES];
    for (s, _) in scores.iter().zip(idx).filter(|&(_, &j)| j >= 0) {
        for (m, &v) in max.iter_mut().zip(s) {
            *m = m.max(v as f32);
        }
    }
    num.fill(0.0);
    let mut den = [0f64; HEAD_LANES];
    for (s, &j) in scores.iter().zip(idx).filter(|&(_, &j)| j >= 0) {
        widen(group.kv_row(j as usize), row);
        for h in 0..heads {
            let e = (s[h] as f32 - max[h]).exp();
            den[h] += f64::from(e);
            work.add_scaled(&mut num[h * dh..(h + 1) * dh], f64::from(e), row);
        }
    }
    for h in 0..heads {
        let den = den[h] + f64::from((group.sinks[h] - max[h]).exp());
        for (o, &n) in out[h * dh..(h + 1) * dh].iter_mut().zip(&num[h * dh..]) {
            *o = (n / den) as f32;
        }
    }
}

/// The kernel's blocked online softmax (⚠K detail of §5.7) for each head of the group.
#[inline(always)]
fn upstream_heads(work: Work, buffers: Buffers, out: &mut [f32]) {
    let idx = work.group.idx;
    let (scores, pv, row) = (buffers.scores, buffers.sums, buffers.row);
    let (group, dh, heads) = (work.group, work.group.dh, work.group.heads());
    let acc = out; // f32 accumulators, rescaled between blocks
    acc.fill(0.0);
    let mut running_max = [RUNNING_MAX_INIT; HEAD_LANES];
    let mut den = [0f32; HEAD_LANES];
    for block in idx.chunks(KERNEL_BLOCK) {
        let scores = &mut scores[..block.len()];
        work.scores(block, scores);
        let mut new_max = [0f32; HEAD_LANES];
        let mut rescale = [0f32; HEAD_LANES];
        for h in 0..heads {
            let mut block_max = f32::NEG_INFINITY;
            for (s, &j) in scores.iter().zip(block) {
                block_max = block_max.max(if j >= 0 {
                    s[h] as f32
                } else {
                    f32::NEG_INFINITY
                });
            }
            new_max[h] = running_max[h].max(block_max);
            rescale[h] = (running_max[h] - new_max[h]).exp();
        }
        pv.fill(0.0);
        let mut p_sum = [0f64; HEAD_LANES];
        for (s, &j) in scores.iter().zip(block) {
            if j < 0 {
                continue; // p = exp(−inf) = 0: contributes nothing to either sum
            }
            widen(group.kv_row(j as usize), row);
            for h in 0..heads {
                let p = (s[h] as f32 - new_max[h]).exp();
                p_sum[h] += f64::from(p);
                work.add_scaled(&mut pv[h * dh..(h + 1) * dh], f64::from(bf16(p)), row);
            }
        }
        for h in 0..heads {
            den[h] = den[h] * rescale[h] + p_sum[h] as f32;
            for (a, &b) in acc[h * dh..(h + 1) * dh].iter_mut().zip(&pv[h * dh..]) {
                *a = *a * rescale[h] + b as f32;
            }
            running_max[h] = new_max[h];
        }
    }
    for h in 0..heads {
        let den = den[h] + (group.sinks[h] - running_max[h]).exp();
        for a in acc[h * dh..(h + 1) * dh].iter_mut() {
            *a = bf16(*a / den);
        }
    }
}

/// A key = value row widened to f64 once for every head of the group.
#[inline(always)]
fn widen(src: &[f32], dst: &mut [f64]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = f64::from(v);
    }
}

thread_local! {
    static F64_SCRATCH: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index loops mirror the formulas
mod tests {
    use super::*;
    use crate::model::linear::tests::Rng;

    struct Case {
        heads: usize,
        dh: usize,
        q: Vec<f32>,
        kv: Vec<f32>,
        sink: Vec<f32>,
    }

    fn case(heads: usize, dh: usize, rows: usize, seed: u64, upstream: bool) -> Case {
        let mut rng = Rng::new(seed);
        let mut gen = |n: usize, amp: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    let v = rng.uniform() * amp;
                    if upstream {
                        bf16(v)
                    } else {
                        v
                    }
                })
                .collect()
        };
        let q = gen(heads * dh, 3.0);
        let kv = gen(rows * dh, 2.0);
        let sink = gen(heads, 2.0);
        Case {
            heads,
            dh,
            q,
            kv,
            sink,
        }
    }

    /// The §5.7 closed formula in f64 (test oracle).
    fn naive(c: &Case, idx: &[i64], scale: f32) -> Vec<f64> {
        let mut out = vec![0f64; c.heads * c.dh];
        for h in 0..c.heads {
            let qh = &c.q[h * c.dh..(h + 1) * c.dh];
            let valid: Vec<usize> = idx
                .iter()
                .filter(|&&j| j >= 0)
                .map(|&j| j as usize)
                .collect();
            if valid.is_empty() {
                continue;
            }
            let s: Vec<f64> = valid
                .iter()
                .map(|&j| {
                    let k = &c.kv[j * c.dh..(j + 1) * c.dh];
                    qh.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let den: f64 =
                s.iter().map(|v| (v - m).exp()).sum::<f64>() + (c.sink[h] as f64 - m).exp();
            for (e, &j) in s.iter().zip(&valid) {
                let p = (e - m).exp() / den;
                for d in 0..c.dh {
                    out[h * c.dh + d] += p * c.kv[j * c.dh + d] as f64;
                }
            }
        }
        out
    }

    fn run(c: &Case, idx: &[i64], scale: f32, numerics: Numerics) -> Vec<f32> {
        let mut out = vec![f32::NAN; c.q.len()];
        sparse_attention(&c.q, &c.kv, &c.sink, idx, scale, numerics, &mut out).unwrap();
        out
    }

    fn max_rel(got: &[f32], want: &[f64]) -> f64 {
        let num: f64 = got
            .iter()
            .zip(want)
            .map(|(g, w)| (*g as f64 - w).powi(2))
            .sum();
        let den: f64 = want.iter().map(|w| w * w).sum();
        (num / den.max(1e-300)).sqrt()
    }

    /// A decode-style list: 150 entries with placeholders in front, then compressed indices.
    fn list(rows: usize) -> Vec<i64> {
        let mut idx: Vec<i64> = vec![-1; 20];
        idx.extend((0..rows as i64).rev().step_by(2));
        idx.extend([-1, -1, 3, 5, -1]);
        idx
    }

    #[test]
    fn exact_matches_the_closed_formula() {
        let c = case(4, 64, 200, 1, false);
        let idx = list(200);
        let scale = (64f32).powf(-0.5);
        let got = run(&c, &idx, scale, Numerics::Exact);
        assert!(max_rel(&got, &naive(&c, &idx, scale)) < 1e-6);
    }

    #[test]
    fn upstream_is_within_bf16_of_the_closed_formula() {
        let c = case(4, 64, 200, 2, true);
        let idx = list(200);
        let scale = (64f32).powf(-0.5);
        let got = run(&c, &idx, scale, Numerics::Upstream);
        let rel = max_rel(&got, &naive(&c, &idx, scale));
        assert!(rel < 1e-2 && rel > 0.0, "rel {rel}");
        assert!(got.iter().all(|&v| bf16(v) == v));
    }

    #[test]
    fn exact_ignores_placeholder_layout_upstream_follows_the_blocks() {
        // The same valid entries with the placeholders at the front or at the end.
        let c = case(3, 32, 300, 3, true);
        let valid: Vec<i64> = (0..100).map(|j| j * 3).collect();
        let mut front = vec![-1; 28];
        front.extend(&valid);
        let mut back = valid.clone();
        back.extend(vec![-1; 28]);
        let scale = 0.2;
        assert_eq!(
            run(&c, &front, scale, Numerics::Exact),
            run(&c, &back, scale, Numerics::Exact)
        );
        assert_eq!(
            run(&c, &valid, scale, Numerics::Exact),
            run(&c, &back, scale, Numerics::Exact)
        );
        // Upstream: trailing placeholders leave the 64-partition of the valid entries unchanged;
        // leading ones shift it (the documented prefill/decode difference of §5.7).
        let up_valid = run(&c, &valid, scale, Numerics::Upstream);
        assert_eq!(up_valid, run(&c, &back, scale, Numerics::Upstream));
        assert_ne!(up_valid, run(&c, &front, scale, Numerics::Upstream));
    }

    #[test]
    fn upstream_matches_a_blockwise_kernel_emulation() {
        // Independent vectorised emulation of the kernel port (whole-block vectors).
        let c = case(2, 16, 150, 4, true);
        let idx = list(150);
        let scale = 0.25f32;
        let got = run(&c, &idx, scale, Numerics::Upstream);
        for h in 0..c.heads {
            let qh = &c.q[h * c.dh..(h + 1) * c.dh];
            let mut acc = vec![0f32; c.dh];
            let mut sum = 0f32;
            let mut mx = -1e30f32;
            for blk in idx.chunks(64) {
                let s: Vec<f32> = blk
                    .iter()
                    .map(|&j| {
                        if j < 0 {
                            return f32::NEG_INFINITY;
                        }
                        let k = &c.kv[j as usize * c.dh..(j as usize + 1) * c.dh];
                        let d: f64 = qh.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                        d as f32 * scale
                    })
                    .collect();
                let new = s.iter().cloned().fold(mx, f32::max);
                let alpha = (mx - new).exp();
                let p: Vec<f32> = s.iter().map(|v| (v - new).exp()).collect();
                sum = sum * alpha + p.iter().map(|&v| v as f64).sum::<f64>() as f32;
                for d in 0..c.dh {
                    let pv: f64 = blk
                        .iter()
                        .zip(&p)
                        .filter(|(j, _)| **j >= 0)
                        .map(|(&j, &pj)| bf16(pj) as f64 * c.kv[j as usize * c.dh + d] as f64)
                        .sum();
                    acc[d] = acc[d] * alpha + pv as f32;
                }
                mx = new;
            }
            sum += (c.sink[h] - mx).exp();
            for d in 0..c.dh {
                assert_eq!(got[h * c.dh + d], bf16(acc[d] / sum), "head {h} dim {d}");
            }
        }
    }

    #[test]
    fn sink_is_in_the_denominator_only() {
        let mut c = case(2, 8, 10, 5, false);
        let idx: Vec<i64> = (0..10).collect();
        // A sink of -inf is plain softmax; a sink far above the scores drives the output to 0
        // (e^{sink-M} overflows past ~88, as in the reference) in both regimes.
        c.sink = vec![f32::NEG_INFINITY, 200.0];
        for numerics in [Numerics::Exact, Numerics::Upstream] {
            let got = run(&c, &idx, 0.5, numerics);
            assert!(got[8..].iter().all(|&v| v == 0.0), "{numerics}");
            assert!(got[..8].iter().any(|&v| v != 0.0));
        }
        let plain = naive(&c, &idx, 0.5);
        assert!(max_rel(&run(&c, &idx, 0.5, Numerics::Exact)[..8], &plain[..8]) < 1e-6);
        // The sink is not scaled: with scale 0 every score is 0, so each weight is 1/(n + e^sink).
        c.sink = vec![0.0, 1.0];
        let got = run(&c, &idx, 0.0, Numerics::Exact);
        for h in 0..2 {
            let den = 10.0 + (c.sink[h] as f64).exp();
            for d in 0..8 {
                let want: f64 = (0..10).map(|j| c.kv[j * 8 + d] as f64).sum::<f64>() / den;
                assert!((got[h * 8 + d] as f64 - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn an_all_placeholder_list_gives_zeros() {
        let c = case(3, 16, 5, 6, true);
        for numerics in [Numerics::Exact, Numerics::Upstream] {
            assert!(run(&c, &[-1; 70], 1.0, numerics).iter().all(|&v| v == 0.0));
            assert!(run(&c, &[], 1.0, numerics).iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn thread_count_does_not_change_the_result() {
        let c = case(8, 32, 100, 7, true);
        let idx = list(100);
        for numerics in [Numerics::Exact, Numerics::Upstream] {
            let at = |n: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap();
                pool.install(|| run(&c, &idx, 0.3, numerics))
            };
            assert_eq!(at(1), at(2));
        }
    }

    /// §5.7 head by head, each score one scalar f64 chain, each P·V column a scalar f64 sum
    /// in list order: the definition the grouped, lane-per-head kernels must equal bit for bit.
    fn per_head(c: &Case, idx: &[i64], scale: f32, numerics: Numerics) -> Vec<f32> {
        let dh = c.dh;
        let row = |j: i64| &c.kv[j as usize * dh..(j as usize + 1) * dh];
        let mut out = vec![0f32; c.q.len()];
        for h in 0..c.heads {
            let qh = &c.q[h * dh..(h + 1) * dh];
            let score = |j: i64| {
                let mut dot = 0f64;
                for (&a, &b) in qh.iter().zip(row(j)) {
                    dot += f64::from(a) * f64::from(b);
                }
                (dot as f32) * scale
            };
            let o = &mut out[h * dh..(h + 1) * dh];
            match numerics {
                Numerics::Exact => {
                    let valid: Vec<i64> = idx.iter().copied().filter(|&j| j >= 0).collect();
                    if valid.is_empty() {
                        continue;
                    }
                    let s: Vec<f32> = valid.iter().map(|&j| score(j)).collect();
                    let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let (mut num, mut den) = (vec![0f64; dh], 0f64);
                    for (&sj, &j) in s.iter().zip(&valid) {
                        let e = (sj - max).exp();
                        den += f64::from(e);
                        for (n, &v) in num.iter_mut().zip(row(j)) {
                            *n += f64::from(e) * f64::from(v);
                        }
                    }
                    den += f64::from((c.sink[h] - max).exp());
                    for (o, n) in o.iter_mut().zip(num) {
                        *o = (n / den) as f32;
                    }
                }
                Numerics::Upstream => {
                    let (mut running, mut den) = (RUNNING_MAX_INIT, 0f32);
                    for block in idx.chunks(KERNEL_BLOCK) {
                        let s: Vec<f32> = block
                            .iter()
                            .map(|&j| if j >= 0 { score(j) } else { f32::NEG_INFINITY })
                            .collect();
                        let new = s.iter().fold(running, |m, &v| m.max(v));
                        let rescale = (running - new).exp();
                        let (mut pv, mut p_sum) = (vec![0f64; dh], 0f64);
                        for (&sj, &j) in s.iter().zip(block).filter(|&(_, &j)| j >= 0) {
                            let p = (sj - new).exp();
                            p_sum += f64::from(p);
                            for (a, &v) in pv.iter_mut().zip(row(j)) {
                                *a += f64::from(bf16(p)) * f64::from(v);
                            }
                        }
                        den = den * rescale + p_sum as f32;
                        for (a, b) in o.iter_mut().zip(pv) {
                            *a = *a * rescale + b as f32;
                        }
                        running = new;
                    }
                    let den = den + (c.sink[h] - running).exp();
                    for a in o.iter_mut() {
                        *a = bf16(*a / den);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn grouped_heads_equal_the_per_head_definition_at_every_level() {
        // 11 heads: a full group of eight and a short one; odd head widths; lists shorter
        // than a kernel block, with placeholders anywhere, and several blocks long.
        let cases = [
            (11, 24, 90, 11),
            (3, 7, 40, 12),
            (9, 64, 300, 13),
            (8, 16, 6, 14),
        ];
        for (heads, dh, rows, seed) in cases {
            for upstream in [false, true] {
                let mut c = case(heads, dh, rows, seed, upstream);
                // Dimensions 1 and 2 add ±2^40 to every dot, after dimension 0's small term:
                // that term keeps its low bits only if the chain runs in increasing d.
                for h in 0..heads {
                    c.q[h * dh + 1] = 1048576.0;
                    c.q[h * dh + 2] = -1048576.0;
                }
                for j in 0..rows {
                    c.kv[j * dh + 1] = 1048576.0;
                    c.kv[j * dh + 2] = 1048576.0;
                }
                let mut lists = vec![list(rows), (0..rows as i64).rev().collect::<Vec<_>>()];
                lists.push(vec![-1, 2, -1, 0, 4, -1, 1]);
                lists.push(vec![-1; 3]);
                let numerics = if upstream {
                    Numerics::Upstream
                } else {
                    Numerics::Exact
                };
                for idx in &lists {
                    let want = per_head(&c, idx, 0.3, numerics);
                    for level in Level::ALL.into_iter().filter(|&l| l <= simd::available()) {
                        let mut got = vec![f32::NAN; c.q.len()];
                        let inputs = (&c.q[..], &c.kv[..], &c.sink[..]);
                        attend_groups(level, inputs, idx, 0.3, numerics, &mut got);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{heads} heads of {dh}, {} entries, {numerics}, {level:?}",
                            idx.len()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let c = case(2, 8, 4, 8, false);
        let mut out = vec![0f32; 16];
        let call = |idx: &[i64], out: &mut [f32]| {
            sparse_attention(&c.q, &c.kv, &c.sink, idx, 1.0, Numerics::Exact, out)
        };
        assert!(call(&[4], &mut out)
            .unwrap_err()
            .to_string()
            .contains("entry 0 is 4"));
        assert!(call(&[0, -2], &mut out).is_err());
        assert!(call(&[0], &mut out[..15]).is_err());
        assert!(sparse_attention(
            &c.q[..15],
            &c.kv,
            &c.sink,
            &[0],
            1.0,
            Numerics::Exact,
            &mut out
        )
        .is_err());
    }
}
