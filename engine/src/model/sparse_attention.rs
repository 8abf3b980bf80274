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

use super::numerics::{dot_f64_wide, Numerics};
use super::quant::bf16;
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
    let kv_row = |j: i64| &kv[j as usize * dh..(j as usize + 1) * dh];

    let parallel = worth_parallel(out.len() * idx.len());
    for_each_chunk(out, dh, parallel, |h, o| {
        let (qh, sink_h) = (&q[h * dh..(h + 1) * dh], sink[h]);
        match numerics {
            Numerics::Exact => exact_head(qh, idx, &kv_row, sink_h, scale, o),
            Numerics::Upstream => upstream_head(qh, idx, &kv_row, sink_h, scale, o),
        }
    });
    Ok(())
}

fn score(qh: &[f32], k: &[f32], scale: f32) -> f32 {
    (dot_f64_wide(qh, k) as f32) * scale
}

/// The closed form of §5.7 for one head.
fn exact_head<'a>(
    qh: &[f32],
    idx: &[i64],
    kv_row: &impl Fn(i64) -> &'a [f32],
    sink: f32,
    scale: f32,
    out: &mut [f32],
) {
    with_f64_scratch(idx.len() + out.len(), |scratch| {
        let (scores, num) = scratch.split_at_mut(idx.len());
        let mut max = f32::NEG_INFINITY;
        let mut any = false;
        for (s, &j) in scores.iter_mut().zip(idx) {
            if j >= 0 {
                let v = score(qh, kv_row(j), scale);
                *s = f64::from(v);
                max = max.max(v);
                any = true;
            }
        }
        if !any {
            out.fill(0.0);
            return;
        }
        num.fill(0.0);
        let mut den = 0f64;
        for (&s, &j) in scores.iter().zip(idx) {
            if j >= 0 {
                let e = (s as f32 - max).exp();
                den += f64::from(e);
                for (n, &v) in num.iter_mut().zip(kv_row(j)) {
                    *n += f64::from(e) * f64::from(v);
                }
            }
        }
        den += f64::from((sink - max).exp());
        for (o, &n) in out.iter_mut().zip(num.iter()) {
            *o = (n / den) as f32;
        }
    });
}

/// The kernel's blocked online softmax for one head (⚠K detail of §5.7).
fn upstream_head<'a>(
    qh: &[f32],
    idx: &[i64],
    kv_row: &impl Fn(i64) -> &'a [f32],
    sink: f32,
    scale: f32,
    out: &mut [f32],
) {
    let dh = out.len();
    with_f64_scratch(KERNEL_BLOCK + dh, |scratch| {
        let (scores, pv) = scratch.split_at_mut(KERNEL_BLOCK);
        let acc = out; // f32 accumulator, rescaled between blocks
        acc.fill(0.0);
        let mut running_max = RUNNING_MAX_INIT;
        let mut den = 0f32;
        for block in idx.chunks(KERNEL_BLOCK) {
            let mut block_max = f32::NEG_INFINITY;
            for (s, &j) in scores.iter_mut().zip(block) {
                let v = if j >= 0 {
                    score(qh, kv_row(j), scale)
                } else {
                    f32::NEG_INFINITY
                };
                block_max = block_max.max(v);
                *s = f64::from(v);
            }
            let new_max = running_max.max(block_max);
            let rescale = (running_max - new_max).exp();
            pv.fill(0.0);
            let mut p_sum = 0f64;
            for (&s, &j) in scores.iter().zip(block) {
                if j < 0 {
                    continue; // p = exp(−inf) = 0: contributes nothing to either sum
                }
                let p = (s as f32 - new_max).exp();
                p_sum += f64::from(p);
                let p_bf16 = f64::from(bf16(p));
                for (a, &v) in pv.iter_mut().zip(kv_row(j)) {
                    *a += p_bf16 * f64::from(v);
                }
            }
            den = den * rescale + p_sum as f32;
            for (a, &b) in acc.iter_mut().zip(pv.iter()) {
                *a = *a * rescale + b as f32;
            }
            running_max = new_max;
        }
        let den = den + (sink - running_max).exp();
        for a in acc.iter_mut() {
            *a = bf16(*a / den);
        }
    });
}

thread_local! {
    static F64_SCRATCH: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
}

/// Run `f` on this thread's reusable f64 buffer of length `len` (taken out while in use).
fn with_f64_scratch<R>(len: usize, f: impl FnOnce(&mut [f64]) -> R) -> R {
    let mut buf = F64_SCRATCH.with(Cell::take);
    buf.clear();
    buf.resize(len, 0.0);
    let r = f(&mut buf);
    F64_SCRATCH.with(|c| c.set(buf));
    r
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
