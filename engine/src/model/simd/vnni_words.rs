//! Rule C1's FP8 block sums for a prefill, with AVX-512 VNNI on 16-bit words (MODEL.md §5.4).
//!
//! An act-quantised input block is `x = X · 2u` with integers X ([`reduced_block_integers`],
//! their common power of two moved into u). An e4m3 code is `M · 2^e · 2^−9` with a 4-bit M
//! (the implicit bit included) and `e` its exponent field less one (0 for subnormals), so a
//! weight row's block is `W · 2^(e_min − 9)` with `W = ±M · 2^(e − e_min)`, e_min the least
//! exponent of its nonzero codes. The block sum is then `u · 2^(e_min − 8) · Σ X·W`, exact in
//! integers. `vpdpwssd` adds two signed 16-bit products per 32-bit lane: sixteen input rows sit
//! in the lanes, two columns each, and a weight row's two columns are broadcast. Both sides are
//! cut into digits so that every partial sum fits 32 bits: X into one word where |X| < 2^15,
//! else two (`X = X₀ + 2^15 X₁`, |X₀| ≤ 2^14); W into one word where its exponents span at most
//! 7 (|W| ≤ 1920, the usual case), else two bytes' worth (`W = W₀ + 2^8 W₁`, |W₀| < 2^8, |W₁| ≤
//! 1920). So each partial sum is below 32 · 1920 · 2^15 < 2^31. A single pair's sum is used as
//! it is; several are recombined exactly in f64. The scaling, the rounding to f32 and the
//! additions over the blocks in increasing order are the f64 kernels' operations on the same
//! exact block sum ([`super::vnni_prefill::scaled_block_sums`]), so the bits are theirs.

use super::super::parallel::{try_for_each_chunk, worth_parallel};
use super::super::quant::BLOCK;
use super::vnni::{reduced_block_integers, InputBlocks, IntegerInputs};
use super::vnni_prefill::LaneUnits;

/// Input rows per group (one per 32-bit lane).
const GROUP: usize = 16;

/// Weight rows per kernel call (`matvec`'s prefill task where this kernel runs).
pub const W_ROWS: usize = 16;

/// Column pairs per block.
const PAIRS: usize = BLOCK / 2;

/// Largest |X| held in one word.
const ONE_WORD: i32 = i16::MAX as i32;

/// One block of sixteen input rows: X as one or two words per value, column pairs in lanes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct GroupBlock {
    /// `words[d][c][m]`: digit d of X at columns 2c (low half) and 2c + 1 (high half) of row
    /// m of the group.
    words: [[[i32; GROUP]; PAIRS]; 2],
    /// u per row.
    units: LaneUnits,
    /// Words per value: 1, or 2 where some |X| exceeds [`ONE_WORD`].
    digits: usize,
}

const EMPTY: GroupBlock = GroupBlock {
    words: [[[0; GROUP]; PAIRS]; 2],
    units: LaneUnits::NONE,
    digits: 1,
};

/// Every full block of a prefill's input rows as words, sixteen rows per group.
#[derive(Default)]
pub struct ActWords {
    rows: usize,
    groups: usize,
    blocks: usize,
    /// `entries[kb · groups + g]`: block kb of rows `16g ..`.
    entries: Vec<GroupBlock>,
}

impl IntegerInputs for ActWords {
    fn fill(&mut self, input: InputBlocks) -> bool {
        let (rows, blocks) = (input.rows, input.blocks);
        self.rows = rows;
        self.groups = rows.div_ceil(GROUP);
        self.blocks = blocks;
        self.entries.clear();
        self.entries.resize(self.groups * blocks, EMPTY);
        let groups = self.groups;
        // About a thousand operations per row and block: worth the pool at real widths.
        let parallel = worth_parallel(rows * blocks * BLOCK * BLOCK);
        try_for_each_chunk(&mut self.entries, groups, parallel, |kb, entries| {
            for (g, entry) in entries.iter_mut().enumerate() {
                let mut ints = [[0i32; BLOCK]; GROUP];
                for (lane, m) in (GROUP * g..rows.min(GROUP * g + GROUP)).enumerate() {
                    let (x, unit) = reduced_block_integers(input.block(m, kb)).ok_or(())?;
                    ints[lane] = x;
                    entry.units.set(lane, unit);
                }
                entry.set_words(&ints);
            }
            Ok::<(), ()>(())
        })
        .is_ok()
    }
}

impl GroupBlock {
    /// The words of sixteen rows' integers (rows past the end zero).
    fn set_words(&mut self, ints: &[[i32; BLOCK]; GROUP]) {
        let wide = ints.iter().flatten().any(|v| v.abs() > ONE_WORD);
        self.digits = if wide { 2 } else { 1 };
        for (m, row) in ints.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                // Balanced: X₀ in [−2^14, 2^14), X₁ = (X − X₀) / 2^15, |X₁| ≤ 2^4 + 1.
                let (low, high) = if wide {
                    let low = ((v + (1 << 14)) & 0x7FFF) - (1 << 14);
                    (low, (v - low) >> 15)
                } else {
                    (v, 0)
                };
                let (c, half) = (k / 2, 16 * (k % 2));
                for (d, digit) in [low, high].into_iter().enumerate() {
                    let word = &mut self.words[d][c][m];
                    *word |= ((digit as u32 & 0xFFFF) << half) as i32;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use kernel::fp8_c1_rows;

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::avx512::prefetch_rows;
    use super::super::vnni_prefill::{f32_steps_exact, scaled_block_sums, scaled_f64_sums};
    use super::{ActWords, GroupBlock, BLOCK, GROUP, PAIRS, W_ROWS};
    use crate::dtype::e8m0_to_f64;
    use std::arch::x86_64::*;

    /// One block of a weight row as words: `W` in one word per value, or two (low byte,
    /// then the rest), column pairs in the dwords.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct RowWords {
        words: [[i32; PAIRS]; 2],
        digits: usize,
        /// e_min − 8: the block sum is `u · 2^(e_min − 8) · Σ X·W` before the scale.
        exponent: i32,
    }

    /// Rule C1 of up to [`W_ROWS`] release FP8 weight rows against every input row of `acts`:
    /// `out[i · rows + m] = Σ_kb f32(scale[i][kb] · Σ_k x[m][k] · e4m3(code[i][k]))`, added in
    /// f32 in increasing kb from +0.0. `codes[i]` is row i's e4m3 bytes and `scales[i]` its
    /// E8M0 bytes, one per block. `false` where a code is NaN (`out` is then unspecified; the
    /// generic path rewrites it).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, DQ, VL and VNNI. The rows and scales must hold the
    /// blocks of `acts`, every scale byte must keep f32 finite (`SAFE_SCALE_BYTE` in
    /// `matvec`), at most [`W_ROWS`] rows, `out` `rows` per row.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2")]
    pub unsafe fn fp8_c1_rows(
        out: &mut [f32],
        acts: &ActWords,
        codes: &[&[u8]],
        scales: &[&[u8]],
    ) -> bool {
        let (rows, groups, blocks) = (acts.rows, acts.groups, acts.blocks);
        let nw = codes.len();
        assert!(nw <= W_ROWS && scales.len() == nw && out.len() == nw * rows);
        assert!(codes.iter().all(|c| c.len() >= blocks * BLOCK));
        assert!(scales.iter().all(|s| s.len() >= blocks));
        out.fill(0.0);
        let mut weights = [RowWords {
            words: [[0; PAIRS]; 2],
            digits: 1,
            exponent: 0,
        }; W_ROWS];
        for kb in 0..blocks {
            // Sixteen rows streamed at once: more than the hardware prefetcher follows.
            prefetch_rows(codes, kb * BLOCK);
            for (w, row) in weights.iter_mut().zip(codes) {
                let block = row[kb * BLOCK..][..BLOCK].try_into().expect("a block");
                if !row_words(block, w) {
                    return false;
                }
            }
            for g in 0..groups {
                let group = &acts.entries[kb * groups + g];
                let m0 = g * GROUP;
                let mask: __mmask16 = ((1u32 << (rows - m0).min(GROUP)) - 1) as u16;
                let x: [__m512i; PAIRS] =
                    std::array::from_fn(|c| _mm512_loadu_si512(group.words[0][c].as_ptr().cast()));
                for (i, w) in weights[..nw].iter().enumerate() {
                    // Exact: a power of two from 2^−135 (an f32 subnormal) to 2^125.
                    let step = e8m0_to_f64(scales[i][kb])
                        * f64::from_bits(((1023 + w.exponent) as u64) << 52);
                    let v = if w.digits == 1 && group.digits == 1 {
                        let f32 = f32_steps_exact(group.units.range(), (step, step));
                        scaled_block_sums(pair_sum(&x, &w.words[0]), group.units.steps(step, f32))
                    } else {
                        combined(group, &x, w, step)
                    };
                    let dst = out[i * rows + m0..].as_mut_ptr();
                    let total = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst), v);
                    _mm512_mask_storeu_ps(dst, mask, total);
                }
            }
        }
        true
    }

    /// `Σ_c` of the input words `x[c]` (lanes = rows) times the weight's pair `w[c]`.
    #[inline(always)]
    unsafe fn pair_sum(x: &[__m512i; PAIRS], w: &[i32; PAIRS]) -> __m512i {
        let mut acc = _mm512_setzero_si512();
        for (xc, &wc) in x.iter().zip(w) {
            acc = _mm512_dpwssd_epi32(acc, *xc, _mm512_set1_epi32(wc));
        }
        acc
    }

    /// A block sum from several digit pairs: each pair's sum (below 2^31) times its power of
    /// two, added exactly in f64 (the total is below 2^42), then scaled and rounded once.
    #[inline(always)]
    unsafe fn combined(
        group: &GroupBlock,
        x0: &[__m512i; PAIRS],
        w: &RowWords,
        step: f64,
    ) -> __m512 {
        let (mut lo, mut hi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        for dx in 0..group.digits {
            let x: [__m512i; PAIRS] = if dx == 0 {
                *x0
            } else {
                std::array::from_fn(|c| _mm512_loadu_si512(group.words[1][c].as_ptr().cast()))
            };
            for dw in 0..w.digits {
                let s = pair_sum(&x, &w.words[dw]);
                let weight = _mm512_set1_pd(f64::from_bits(
                    (1023 + 15 * dx as u64 + 8 * dw as u64) << 52,
                ));
                lo = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(s)), weight, lo);
                hi = _mm512_fmadd_pd(
                    _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(s)),
                    weight,
                    hi,
                );
            }
        }
        scaled_f64_sums((lo, hi), group.units.f64_steps(step))
    }

    /// A weight row's block of e4m3 codes as words into `w`; `false` for a NaN code.
    #[inline(always)]
    unsafe fn row_words(codes: &[u8; BLOCK], w: &mut RowWords) -> bool {
        let c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(codes.as_ptr().cast()));
        let magnitude = _mm512_and_si512(c, _mm512_set1_epi16(0x7F));
        if _mm512_cmpeq_epi16_mask(magnitude, _mm512_set1_epi16(0x7F)) != 0 {
            return false;
        }
        let field = _mm512_srli_epi16::<3>(magnitude);
        let normal = _mm512_test_epi16_mask(field, field);
        let one = _mm512_set1_epi16(1);
        // The implicit bit of normal codes.
        let m = _mm512_or_si512(
            _mm512_and_si512(c, _mm512_set1_epi16(7)),
            _mm512_maskz_mov_epi16(normal, _mm512_set1_epi16(8)),
        );
        let e = _mm512_mask_sub_epi16(field, normal, field, one);
        let nonzero = _mm512_test_epi16_mask(m, m);
        // Bit e of a lane for each nonzero code; their union gives the least and largest e.
        let present = _mm512_reduce_or_epi32(_mm512_maskz_sllv_epi16(nonzero, one, e)) as u32;
        let present = (present | present >> 16) & 0xFFFF;
        let negative = _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x80));
        let (e_min, e_max) = if present == 0 {
            (0, 0)
        } else {
            (present.trailing_zeros(), 31 - present.leading_zeros())
        };
        w.exponent = e_min as i32 - 8;
        let shift = _mm512_sub_epi16(e, _mm512_set1_epi16(e_min as i16));
        if e_max - e_min <= 7 {
            // |W| ≤ 15 · 2^7: one word. Zero codes give 0 whatever their shift.
            let v = _mm512_maskz_sllv_epi16(nonzero, m, shift);
            let v = _mm512_mask_sub_epi16(v, negative, _mm512_setzero_si512(), v);
            _mm512_storeu_si512(w.words[0].as_mut_ptr().cast(), v);
            w.digits = 1;
            return true;
        }
        // Wider: in 32-bit lanes, then split into the low byte and the rest, each signed.
        let (lo0, hi0) = split_wide(
            _mm512_castsi512_si256(m),
            _mm512_castsi512_si256(shift),
            nonzero as u16,
        );
        let (lo1, hi1) = split_wide(
            _mm512_extracti64x4_epi64::<1>(m),
            _mm512_extracti64x4_epi64::<1>(shift),
            (nonzero >> 16) as u16,
        );
        for (d, (a, b)) in [(lo0, lo1), (hi0, hi1)].into_iter().enumerate() {
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
            let v = _mm512_mask_sub_epi16(v, negative, _mm512_setzero_si512(), v);
            _mm512_storeu_si512(w.words[d].as_mut_ptr().cast(), v);
        }
        w.digits = 2;
        true
    }

    /// Sixteen values `M << shift` (zero outside `nonzero`) as their low bytes and the rest,
    /// in words.
    #[inline(always)]
    unsafe fn split_wide(m: __m256i, shift: __m256i, nonzero: __mmask16) -> (__m256i, __m256i) {
        let v = _mm512_maskz_sllv_epi32(
            nonzero,
            _mm512_cvtepu16_epi32(m),
            _mm512_cvtepu16_epi32(shift),
        );
        (
            _mm512_cvtepi32_epi16(_mm512_and_si512(v, _mm512_set1_epi32(0xFF))),
            _mm512_cvtepi32_epi16(_mm512_srli_epi32::<8>(v)),
        )
    }
}
