//! Rule C1's FP4 block sums for a prefill with AVX2 alone, in integers (MODEL.md §5.4).
//!
//! As in `avx2_digits`, an act-quantised input block is `x = X · 2u` with integers |X| < 2^19,
//! written as words ([`WordBlock`]): X itself where every |X| < 2^15, else its low balanced
//! digit D₀ and `Y = (X − D₀) / 2^8` for a second pass. An e2m1 value is `W / 2` with |W| ≤ 12,
//! so a block sum is `u · scale · Σ X·W`.
//!
//! A task's sixteen weight rows are two halves of eight, each half the 32-bit lanes of a
//! vector, each lane one row's pair of columns `(W[2p], W[2p + 1])` as two 16-bit words; an
//! input row's pair `(X[2p], X[2p + 1])` is broadcast once for both halves: one `vpmaddwd`
//! makes sixteen products, summed in pairs, and sixteen of them a block for a half, with no
//! horizontal sums. A block's weights are decoded once for every input row of the call (the
//! reuse a prefill has over a decode). One pass sums below 32 · 12 · 2^15 < 2^24; two combine
//! as `S₀ + 2^8 · S₁` in wrapping 32-bit arithmetic, exact because the true sum is below 32 ·
//! 12 · 2^19 < 2^28. The product with the steps and the rounding to f32 are those of every
//! other C1 kernel on the same exact block sum (`avx2_digits::block_values`), or, where every
//! step lies where rounding commutes with it (`vnni_prefill::f32_steps_exact`), `f32(S)` times
//! the step in f32, which rounds the same; the f32 sums run over the blocks in increasing
//! order from +0.0, so the bits are the same.

use super::super::parallel::{try_for_each_chunk, worth_parallel};
use super::super::quant::BLOCK;
use super::avx2_digits::WordBlock;
use super::vnni::{InputBlocks, IntegerInputs};

/// Weight rows per kernel call: one per 32-bit lane of two vectors.
pub const W_ROWS: usize = 16;

/// Every full block of a prefill's input rows as words, block-major.
#[derive(Default)]
pub struct ActWordBlocks {
    rows: usize,
    blocks: usize,
    /// `entries[kb · rows + m]`: block kb of row m.
    entries: Vec<WordBlock>,
}

impl IntegerInputs for ActWordBlocks {
    fn fill(&mut self, input: InputBlocks) -> bool {
        let (rows, blocks) = (input.rows, input.blocks);
        self.rows = rows;
        self.blocks = blocks;
        self.entries.clear();
        self.entries.resize(rows * blocks, WordBlock::ZERO);
        // A few hundred operations per entry: worth the pool for a prefill of real width.
        let parallel = worth_parallel(rows * blocks * BLOCK * BLOCK);
        try_for_each_chunk(&mut self.entries, rows, parallel, |kb, entries| {
            for (m, entry) in entries.iter_mut().enumerate() {
                *entry = WordBlock::of(input.block(m, kb)).ok_or(())?;
            }
            Ok::<(), ()>(())
        })
        .is_ok()
    }
}

#[cfg(target_arch = "x86_64")]
pub use kernel::fp4_c1_rows;

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::avx2_digits::{group_rows, pair_sums, store_row_sums, HalfSteps, HALF};
    use super::super::check_prefill_rows;
    use super::super::vnni::TWICE_E2M1;
    use super::super::x86::columns8;
    use super::{ActWordBlocks, WordBlock, BLOCK, W_ROWS};
    use crate::dtype::e8m0_to_f64;
    use std::arch::x86_64::*;

    /// Column pairs of a block: one weight vector each.
    const PAIRS: usize = BLOCK / 2;

    /// Rule C1 of up to [`W_ROWS`] release FP4 weight rows against every input row of `acts`:
    /// `out[i · rows + m] = Σ_kb f32(scale[i][kb] · u[m][kb] · Σ_k X·W)`, added in f32 in
    /// increasing kb from +0.0. `codes[i]` is row i's packed nibbles (low nibble first) and
    /// `scales[i]` its E8M0 bytes, one per block.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA. Every scale byte must keep f32 finite with every code
    /// (`SAFE_SCALE_BYTE` in `matvec`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp4_c1_rows(
        out: &mut [f32],
        acts: &ActWordBlocks,
        codes: &[&[u8]],
        scales: &[&[u8]],
    ) {
        check_prefill_rows(
            out,
            acts.rows,
            acts.blocks,
            (codes, BLOCK / 2),
            scales,
            W_ROWS,
        );
        // A task of at most eight rows would multiply a second half of zeros.
        if codes.len() <= HALF {
            halves_c1::<1>(out, acts, codes, scales);
        } else {
            halves_c1::<2>(out, acts, codes, scales);
        }
    }

    /// [`fp4_c1_rows`] with the rows in `H` halves, each input row's pair broadcast once for
    /// both (two weight vectors per broadcast: fewer operations per multiply-add).
    #[inline(always)]
    unsafe fn halves_c1<const H: usize>(
        out: &mut [f32],
        acts: &ActWordBlocks,
        codes: &[&[u8]],
        scales: &[&[u8]],
    ) {
        let (rows, blocks, nw) = (acts.rows, acts.blocks, codes.len());
        let group = group_rows(H);
        // Row m's sums of each half, in f32 from +0.0.
        let mut sums = vec![[_mm256_setzero_ps(); H]; rows];
        let mut weights = [[_mm256_setzero_si256(); PAIRS]; H];
        for kb in 0..blocks {
            for (h, w) in weights.iter_mut().enumerate() {
                *w = weight_pairs(&codes[HALF * h..nw.min(HALF * (h + 1))], kb);
            }
            let mut scale = [0f64; W_ROWS];
            for (s, row) in scale.iter_mut().zip(scales) {
                *s = e8m0_to_f64(row[kb]);
            }
            let steps = HalfSteps::<H>::new(&scale, nw);
            let entries = &acts.entries[kb * rows..][..rows];
            for (s, e) in sums.chunks_mut(group).zip(entries.chunks(group)) {
                match e.len() {
                    8 => group_block::<8, H>(s, e, &weights, &steps),
                    7 => group_block::<7, H>(s, e, &weights, &steps),
                    6 => group_block::<6, H>(s, e, &weights, &steps),
                    5 => group_block::<5, H>(s, e, &weights, &steps),
                    4 => group_block::<4, H>(s, e, &weights, &steps),
                    3 => group_block::<3, H>(s, e, &weights, &steps),
                    2 => group_block::<2, H>(s, e, &weights, &steps),
                    _ => group_block::<1, H>(s, e, &weights, &steps),
                }
            }
        }
        store_row_sums(out, &sums, nw);
    }

    /// Block `kb` of up to eight rows as `[pair p][row i] = (W[2p], W[2p + 1])` (rows past
    /// `codes` zero). Loops, not closures: a closure's body is compiled without the caller's
    /// target features, and its intrinsics become calls.
    #[inline(always)]
    unsafe fn weight_pairs(codes: &[&[u8]], kb: usize) -> [__m256i; PAIRS] {
        let table = _mm_loadu_si128(TWICE_E2M1.as_ptr().cast());
        let low_nibble = _mm_set1_epi8(0x0F);
        // Row i's columns 0..16 (`halves[0][i]`) and 16..32 (`halves[1][i]`) as words.
        let mut halves = [[_mm256_setzero_ps(); HALF]; 2];
        for (i, row) in codes.iter().enumerate() {
            let bytes = _mm_loadu_si128(row[kb * BLOCK / 2..][..BLOCK / 2].as_ptr().cast());
            let low = _mm_and_si128(bytes, low_nibble);
            let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low_nibble);
            let first = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(low, high));
            let second = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(low, high));
            halves[0][i] = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(first));
            halves[1][i] = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(second));
        }
        let mut pairs = [_mm256_setzero_si256(); PAIRS];
        for (h, half) in halves.into_iter().enumerate() {
            for (c, t) in columns8(half).into_iter().enumerate() {
                pairs[8 * h + c] = _mm256_castps_si256(t);
            }
        }
        pairs
    }

    /// One block of `N` input rows (`entries`) into their f32 `sums`.
    #[inline(always)]
    unsafe fn group_block<const N: usize, const H: usize>(
        sums: &mut [[__m256; H]],
        entries: &[WordBlock],
        weights: &[[__m256i; PAIRS]; H],
        steps: &HalfSteps<H>,
    ) {
        let weights = std::array::from_fn(|h| &weights[h]);
        let mut total =
            pair_sums::<N, H, _>(weights, std::array::from_fn(|j| &entries[j].words[0]));
        if entries.iter().any(|e| e.split) {
            // Unsplit rows' second words are zero.
            let high = pair_sums::<N, H, _>(weights, std::array::from_fn(|j| &entries[j].words[1]));
            for (t, hi) in total.iter_mut().zip(high) {
                for h in 0..H {
                    t[h] = _mm256_add_epi32(t[h], _mm256_slli_epi32::<8>(hi[h]));
                }
            }
        }
        for ((s, t), e) in sums.iter_mut().zip(total).zip(entries) {
            steps.add_values(s, t, e.unit, e.unit as f32);
        }
    }
}
