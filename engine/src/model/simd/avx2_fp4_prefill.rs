//! Rule C1's FP4 block sums for a prefill with AVX2 alone, in integers (MODEL.md §5.4).
//!
//! As in `avx2_digits`, an act-quantised input block is `x = X · 2u` with integers |X| < 2^19,
//! written as words ([`WordBlock`]): X itself where every |X| < 2^15, else its low balanced
//! digit D₀ and `Y = (X − D₀) / 2^8` for a second pass. An e2m1 value is `W / 2` with |W| ≤ 12,
//! so a block sum is `u · scale · Σ X·W`.
//!
//! The eight weight rows of a task are the 32-bit lanes of a vector, each lane one row's pair
//! of columns `(W[2p], W[2p + 1])` as two 16-bit words, and an input row's pair `(X[2p],
//! X[2p + 1])` is broadcast to every lane: one `vpmaddwd` makes sixteen products, summed in
//! pairs, and sixteen of them a block for eight rows, with no horizontal sums. A block's
//! weights are decoded once for every input row of the call (the reuse a prefill has over a
//! decode). One pass sums below 32 · 12 · 2^15 < 2^24; two combine as `S₀ + 2^8 · S₁` in
//! wrapping 32-bit arithmetic, exact because the true sum is below 32 · 12 · 2^19 < 2^28. The
//! product with the steps and the rounding to f32 are those of every other C1 kernel on the
//! same exact block sum (`avx2_digits::block_values`), and the f32 sums run over the blocks in
//! increasing order from +0.0, so the bits are the same.

use super::super::parallel::{try_for_each_chunk, worth_parallel};
use super::super::quant::BLOCK;
use super::avx2_digits::WordBlock;
use super::vnni::{InputBlocks, IntegerInputs};

/// Weight rows per kernel call: one per 32-bit lane.
pub const W_ROWS: usize = 8;

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
    use super::super::avx2_digits::{block_values, pair_sums, store_row_sums};
    use super::super::check_prefill_rows;
    use super::super::vnni::TWICE_E2M1;
    use super::super::x86::columns8;
    use super::{ActWordBlocks, WordBlock, BLOCK, W_ROWS};
    use crate::dtype::e8m0_to_f64;
    use std::arch::x86_64::*;

    /// Input rows whose sums advance together: eight registers of sums, one of weights and
    /// one broadcast input.
    const GROUP: usize = 8;

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
        let (rows, blocks) = (acts.rows, acts.blocks);
        check_prefill_rows(out, rows, blocks, (codes, BLOCK / 2), scales, W_ROWS);
        let nw = codes.len();
        // Row m's eight sums, in f32 from +0.0.
        let mut sums = vec![_mm256_setzero_ps(); rows];
        for kb in 0..blocks {
            let weights = weight_pairs(codes, kb);
            let scale: [f64; W_ROWS] =
                std::array::from_fn(|i| scales.get(i).map_or(0.0, |s| e8m0_to_f64(s[kb])));
            let scale = [
                _mm256_loadu_pd(scale.as_ptr()),
                _mm256_loadu_pd(scale[4..].as_ptr()),
            ];
            let entries = &acts.entries[kb * rows..][..rows];
            for (group, entries) in sums.chunks_mut(GROUP).zip(entries.chunks(GROUP)) {
                match entries.len() {
                    GROUP => group_block::<GROUP>(group, entries, &weights, scale),
                    7 => group_block::<7>(group, entries, &weights, scale),
                    6 => group_block::<6>(group, entries, &weights, scale),
                    5 => group_block::<5>(group, entries, &weights, scale),
                    4 => group_block::<4>(group, entries, &weights, scale),
                    3 => group_block::<3>(group, entries, &weights, scale),
                    2 => group_block::<2>(group, entries, &weights, scale),
                    _ => group_block::<1>(group, entries, &weights, scale),
                }
            }
        }
        store_row_sums(out, &sums, nw);
    }

    /// Block `kb` of the rows as `[pair p][row i] = (W[2p], W[2p + 1])` (rows past `codes`
    /// zero). Loops, not closures: a closure's body is compiled without the caller's target
    /// features, and its intrinsics become calls.
    #[inline(always)]
    unsafe fn weight_pairs(codes: &[&[u8]], kb: usize) -> [__m256i; PAIRS] {
        let table = _mm_loadu_si128(TWICE_E2M1.as_ptr().cast());
        let low_nibble = _mm_set1_epi8(0x0F);
        // Row i's columns 0..16 (`halves[0][i]`) and 16..32 (`halves[1][i]`) as words.
        let mut halves = [[_mm256_setzero_ps(); W_ROWS]; 2];
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
    unsafe fn group_block<const N: usize>(
        sums: &mut [__m256],
        entries: &[WordBlock],
        weights: &[__m256i; PAIRS],
        scale: [__m256d; 2],
    ) {
        let mut total = pair_sums::<N, _>(weights, std::array::from_fn(|j| &entries[j].words[0]));
        if entries.iter().any(|e| e.split) {
            // Unsplit rows' second words are zero.
            let high = pair_sums::<N, _>(weights, std::array::from_fn(|j| &entries[j].words[1]));
            for (t, h) in total.iter_mut().zip(high) {
                *t = _mm256_add_epi32(*t, _mm256_slli_epi32::<8>(h));
            }
        }
        for ((s, t), e) in sums.iter_mut().zip(total).zip(entries) {
            *s = _mm256_add_ps(*s, block_values(t, scale, e.unit));
        }
    }
}
