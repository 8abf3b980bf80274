//! A prefill's multiply-adds over one decoded 32-column block with AVX2 (MODEL.md §5.4): eight
//! weight rows (the lanes of two vectors) times up to [`INPUTS`] input rows, whose chains stay
//! in registers for the whole block.
//!
//! Each chain is exactly the portable one, `acc = fma(x[k], w[k][i], acc)` in increasing k (the
//! product of two f32 values widened to f64 is exact, so the fused and the separate
//! multiply-add agree): rule C2's chains advance as they are, rule C1's start from +0.0 and
//! their block sums are rounded to f32 and added to the rows' f32 sums, as the portable kernel
//! does one value at a time. Only the grouping changes: twelve chains in flight hide the
//! multiply-add's latency on two units, where the generic loop's eight did not, and its scalar
//! f64→f32 steps become one conversion per four sums.

use super::super::quant::BLOCK;
use std::arch::x86_64::*;

/// Weight rows of a block: two vectors of four f64 lanes.
pub const ROWS: usize = 8;

/// Input rows advanced together: twelve chain registers, two of weights and one broadcast
/// input of the sixteen.
const INPUTS: usize = 6;

/// Where the input rows' values for the block are: row j's 32 values at `x[first + j · stride
/// ..]`.
#[derive(Clone, Copy)]
pub struct InputRows<'a> {
    pub x: &'a [f64],
    pub first: usize,
    pub stride: usize,
}

impl InputRows<'_> {
    /// Row j's block; panics (a caller's bug) if it is not inside `x`.
    #[inline(always)]
    fn block(&self, j: usize) -> &[f64; BLOCK] {
        self.x[self.first + j * self.stride..][..BLOCK]
            .try_into()
            .expect("a whole block")
    }
}

/// Rule C2: `chains[j][i]` advanced over the block `w` (`w[k][i]` = weight row i, column k) by
/// input row j's values, for every input row of `chains`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn c2_block(chains: &mut [[f64; ROWS]], x: InputRows, w: &[[f64; ROWS]; BLOCK]) {
    for_groups(chains.len(), |j0, n| {
        let group = &mut chains[j0..j0 + n];
        match n {
            INPUTS => c2_group::<INPUTS>(group, x, j0, w),
            5 => c2_group::<5>(group, x, j0, w),
            4 => c2_group::<4>(group, x, j0, w),
            3 => c2_group::<3>(group, x, j0, w),
            2 => c2_group::<2>(group, x, j0, w),
            _ => c2_group::<1>(group, x, j0, w),
        }
    });
}

/// Rule C1: `sums[j][i] += (Σ_k x_j[k] · w[k][i]) as f32`, the block sum a chain from +0.0 in
/// increasing k, for every input row of `sums`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn c1_block(sums: &mut [[f32; ROWS]], x: InputRows, w: &[[f64; ROWS]; BLOCK]) {
    for_groups(sums.len(), |j0, n| {
        let group = &mut sums[j0..j0 + n];
        match n {
            INPUTS => c1_group::<INPUTS>(group, x, j0, w),
            5 => c1_group::<5>(group, x, j0, w),
            4 => c1_group::<4>(group, x, j0, w),
            3 => c1_group::<3>(group, x, j0, w),
            2 => c1_group::<2>(group, x, j0, w),
            _ => c1_group::<1>(group, x, j0, w),
        }
    });
}

/// `(first, count)` of the groups of at most [`INPUTS`] rows `0..rows` are taken in.
#[inline(always)]
fn for_groups(rows: usize, mut f: impl FnMut(usize, usize)) {
    for j0 in (0..rows).step_by(INPUTS) {
        f(j0, INPUTS.min(rows - j0));
    }
}

#[inline(always)]
unsafe fn c2_group<const N: usize>(
    chains: &mut [[f64; ROWS]],
    x: InputRows,
    j0: usize,
    w: &[[f64; ROWS]; BLOCK],
) {
    let mut acc: [[__m256d; 2]; N] = std::array::from_fn(|j| {
        let c = chains[j].as_ptr();
        [_mm256_loadu_pd(c), _mm256_loadu_pd(c.add(4))]
    });
    advance(&mut acc, x, j0, w);
    for (c, a) in chains.iter_mut().zip(acc) {
        _mm256_storeu_pd(c.as_mut_ptr(), a[0]);
        _mm256_storeu_pd(c.as_mut_ptr().add(4), a[1]);
    }
}

#[inline(always)]
unsafe fn c1_group<const N: usize>(
    sums: &mut [[f32; ROWS]],
    x: InputRows,
    j0: usize,
    w: &[[f64; ROWS]; BLOCK],
) {
    let mut acc = [[_mm256_setzero_pd(); 2]; N];
    advance(&mut acc, x, j0, w);
    for (s, a) in sums.iter_mut().zip(acc) {
        // `vcvtpd2ps` rounds to nearest, as `as f32` does.
        let block = _mm256_set_m128(_mm256_cvtpd_ps(a[1]), _mm256_cvtpd_ps(a[0]));
        let total = _mm256_add_ps(_mm256_loadu_ps(s.as_ptr()), block);
        _mm256_storeu_ps(s.as_mut_ptr(), total);
    }
}

/// The chains of input rows `j0 .. j0 + N` over the block, k increasing.
#[inline(always)]
unsafe fn advance<const N: usize>(
    acc: &mut [[__m256d; 2]; N],
    x: InputRows,
    j0: usize,
    w: &[[f64; ROWS]; BLOCK],
) {
    let xs: [&[f64; BLOCK]; N] = std::array::from_fn(|j| x.block(j0 + j));
    for (k, wk) in w.iter().enumerate() {
        let (w0, w1) = (
            _mm256_loadu_pd(wk.as_ptr()),
            _mm256_loadu_pd(wk.as_ptr().add(4)),
        );
        for (a, xj) in acc.iter_mut().zip(&xs) {
            let xb = _mm256_set1_pd(xj[k]);
            a[0] = _mm256_fmadd_pd(xb, w0, a[0]);
            a[1] = _mm256_fmadd_pd(xb, w1, a[1]);
        }
    }
}
