//! Rule C1 for one input row over packed nibbles (release FP4, container Q4G) and container Q8G
//! bytes, eight weight rows at a time, summed in integers with AVX2 (MODEL.md §5.4).
//!
//! As for the VNNI kernels (`vnni_prefill`), an act-quantised input block is `x = X · 2u` with
//! integers |X| < 2^19 ([`reduced_block_integers`]), written in balanced base-256 digits
//! `X = D₀ + 2^8 D₁ + 2^16 D₂` (signed bytes; most blocks need two). A nibble stands for `W / 2`
//! with `W = 2 · e2m1` (FP4, |W| ≤ 12) or for `W = nibble − 8` (Q4G), so the block sum is
//! `u · Σ X·W` or `2u · Σ X·W`. The kernel multiplies the unsigned bytes `W + c` (c = 12 for
//! FP4; for Q4G, c = 8 and `W + c` is the nibble itself) by the digits with `vpmaddubsw`, which
//! sums pairs of products into 16 bits (at most 2 · 24 · 128, far from saturating), widens the
//! pairs into 32-bit lanes with `vpmaddwd` (by 1 or 2^8, the third digit shifted by 8 more), and
//! takes `c · Σ X` back once per block. |Σ X·W| < 32 · 12 · 2^19 < 2^28, so the wrapping 32-bit
//! sums are exact in any order. The product with the steps (scale · u, exact: powers of two, or
//! an f16 times one) and the rounding to f32 are the f64 kernel's (`avx2::fp8_c1_run8`) operations
//! on the same exact block sum, so the bits are the same.
//!
//! Container Q8G rows (a signed byte per weight) take words instead: `vpmaddwd` of the codes,
//! sign-extended, with X where |X| < 2^15 (|Σ| < 32 · 2^7 · 2^15 = 2^27), else with its low
//! digit and the rest `Y = (X − D₀) / 2^8` (|Y| < 2^11) in a second pass shifted by 8; the true
//! sum stays below 32 · 2^7 · 2^19 = 2^31, so the wrapping sums are exact.

use super::super::quant::BLOCK;
use super::vnni::{balanced_digits, reduced_block_integers, DIGITS};

/// One input block in the kernel's integer form.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct DigitBlock {
    /// `digits[i]`: digit i of X, the even columns (0, 2, …, 30) in bytes 0..16 and the odd
    /// ones in bytes 16..32, the order in which the kernel unpacks a row's nibbles (low
    /// nibbles into the low 128-bit lane).
    digits: [[i8; BLOCK]; DIGITS],
    /// u: input k is `X[k] · 2u`.
    unit: f64,
    /// Σ X (|Σ X| < 2^24).
    sum: i32,
    /// The digits X needs (1 to 3; the others are zero).
    count: u8,
}

impl DigitBlock {
    /// The block of `x`, or `None` where it is not act-quantised.
    fn of(x: &[f64; BLOCK]) -> Option<DigitBlock> {
        let (x, unit) = reduced_block_integers(x)?;
        let mut block = DigitBlock {
            digits: [[0; BLOCK]; DIGITS],
            unit,
            sum: 0,
            count: 1,
        };
        for (k, &v) in x.iter().enumerate() {
            let (digits, needed) = balanced_digits(v);
            let at = k / 2 + BLOCK / 2 * (k % 2);
            for (plane, d) in block.digits.iter_mut().zip(digits) {
                plane[at] = d;
            }
            block.sum += v;
            block.count = block.count.max(needed);
        }
        Some(block)
    }

    /// The digits X needs (1 to 3).
    pub fn digit_count(&self) -> u8 {
        self.count
    }
}

/// An input row's full blocks in the nibble kernel's integer form (a per-thread buffer,
/// reused).
#[derive(Default)]
pub struct NibbleInputs(Vec<DigitBlock>);

impl NibbleInputs {
    /// The full blocks of `x`; `None` if a block is not act-quantised.
    pub fn fill(&mut self, x: &[f64]) -> Option<&[DigitBlock]> {
        self.0.clear();
        for xb in x.chunks_exact(BLOCK) {
            self.0
                .push(DigitBlock::of(xb.try_into().expect("a block"))?);
        }
        Some(&self.0)
    }
}

/// One input block in the Q8G kernel's integer form.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct WordBlock {
    /// `words[0]`: X where every |X| < 2^15 (`split` false), else D₀, X's low balanced digit;
    /// `words[1]`: then `Y = (X − D₀) / 2^8`, else zero. Columns in order.
    pub(super) words: [[i16; BLOCK]; 2],
    /// u: input k is `X[k] · 2u`.
    pub(super) unit: f64,
    pub(super) split: bool,
}

/// |X| bound (exclusive) for X itself as a word.
const WORD_LIMIT: i32 = 1 << 15;

impl WordBlock {
    /// A block of zeros (a placeholder until filled).
    pub(super) const ZERO: WordBlock = WordBlock {
        words: [[0; BLOCK]; 2],
        unit: 0.0,
        split: false,
    };

    /// The block of `x`, or `None` where it is not act-quantised.
    pub(super) fn of(x: &[f64; BLOCK]) -> Option<WordBlock> {
        let (x, unit) = reduced_block_integers(x)?;
        let split = x.iter().any(|v| v.abs() >= WORD_LIMIT);
        let mut block = WordBlock {
            words: [[0; BLOCK]; 2],
            unit,
            split,
        };
        for (k, &v) in x.iter().enumerate() {
            if split {
                let (d, _) = balanced_digits(v);
                block.words[0][k] = i16::from(d[0]);
                block.words[1][k] = i16::from(d[1]) + 256 * i16::from(d[2]);
            } else {
                block.words[0][k] = v as i16;
            }
        }
        Some(block)
    }

    /// Whether X takes two passes (some |X| ≥ 2^15).
    pub fn is_split(&self) -> bool {
        self.split
    }
}

/// An input row's full blocks in the Q8G kernel's integer form (a per-thread buffer, reused).
#[derive(Default)]
pub struct ByteInputs(Vec<WordBlock>);

impl ByteInputs {
    /// The full blocks of `x`; `None` if a block is not act-quantised.
    pub fn fill(&mut self, x: &[f64]) -> Option<&[WordBlock]> {
        self.0.clear();
        for xb in x.chunks_exact(BLOCK) {
            self.0.push(WordBlock::of(xb.try_into().expect("a block"))?);
        }
        Some(&self.0)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use kernel::{f64_block_values, group_rows, pair_sums, store_row_sums, HalfSteps, HALF};
#[cfg(target_arch = "x86_64")]
pub use kernel::{nibble_c1_run8, q8_c1_run8};

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::avx2::{prefetch, Codes, LateBlock, LateTotal, Scales};
    use super::super::avx2_scales::{with_block_scales, BlockScales};
    use super::super::vnni::TWICE_E2M1;
    use super::super::vnni_prefill::{f32_steps_exact, scale_range};
    use super::{DigitBlock, WordBlock, BLOCK};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// C1 over the column blocks `blocks` of eight rows of nibble codes (`codes` FP4 or Q4G), in
    /// order: `acc[i] += f32(P_i · scale_i)` per block with `P_i` the exact block sum. `x[kb]` is
    /// block kb of the input, `rows[i]` and `scales` row i's codes and scales from block 0.
    /// Returns the first block it leaves (a scale [`Scales`] does not take), else `blocks.end`;
    /// `acc` then has every block before it.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x`, `rows` and `scales` must hold `blocks.end`
    /// blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn nibble_c1_run8(
        codes: Codes,
        acc: &mut [f32; 8],
        x: &[DigitBlock],
        rows: [&[u8]; 8],
        scales: Scales<8>,
        blocks: Range<usize>,
    ) -> usize {
        with_block_scales!(scales, blocks.clone(), |s| match codes {
            Codes::Fp4 => run8::<true>(acc, x, rows, s, blocks),
            Codes::Q4 => run8::<false>(acc, x, rows, s, blocks),
            Codes::Fp8 | Codes::Q8 => panic!("the digit kernel reads nibble codes only"),
        })
    }

    /// [`nibble_c1_run8`] for FP4 (`FP4`: nibbles looked up as `2 · e2m1 + 12`) or Q4G (the
    /// nibbles as they are).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run8<const FP4: bool>(
        acc: &mut [f32; 8],
        x: &[DigitBlock],
        rows: [&[u8]; 8],
        scales: impl BlockScales<8>,
        blocks: Range<usize>,
    ) -> usize {
        const BYTES: usize = BLOCK / 2;
        let (offset, unit_factor) = if FP4 { (12, 1.0) } else { (8, 2.0) };
        let x = &x[..blocks.end];
        let rows = rows.map(|r| &r[..blocks.end * BYTES]);
        let table = _mm256_add_epi8(
            _mm256_loadu_si256(TWICE_E2M1.as_ptr().cast()),
            _mm256_set1_epi8(offset as i8),
        );
        let base = rows.map(<[u8]>::as_ptr);
        let mut total = LateTotal::new(_mm256_loadu_ps(acc.as_ptr()));
        let mut stop = blocks.end;
        for kb in blocks {
            let at = kb * BYTES;
            prefetch(&rows, at);
            let Some(scale) = scales.vectors::<2>(kb, |l| l) else {
                stop = kb;
                break;
            };
            let xb = &x[kb];
            let codes = base.map(|row| row.add(at));
            let sums = match xb.count {
                1 => block_sums8::<FP4, 1>(xb, &codes, table),
                2 => block_sums8::<FP4, 2>(xb, &codes, table),
                _ => block_sums8::<FP4, 3>(xb, &codes, table),
            };
            let sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(offset * xb.sum));
            total.add(IntBlock {
                sums,
                scale,
                unit: unit_factor * xb.unit,
            });
        }
        _mm256_storeu_ps(acc.as_mut_ptr(), total.finish());
        stop
    }

    /// C1 over the column blocks `blocks` of eight container Q8G rows, in order: `acc[i] +=
    /// f32(P_i · scale_i)` per block with `P_i` the exact block sum. `x[kb]` is block kb of the
    /// input, `rows[i]` and `scales` (f16 group scales) row i's codes and scales from block 0.
    /// Returns the first block it leaves (a scale [`Scales`] does not take), else `blocks.end`;
    /// `acc` then has every block before it.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x`, `rows` and `scales` must hold `blocks.end`
    /// blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_c1_run8(
        acc: &mut [f32; 8],
        x: &[WordBlock],
        rows: [&[u8]; 8],
        scales: Scales<8>,
        blocks: Range<usize>,
    ) -> usize {
        with_block_scales!(scales, blocks.clone(), |s| q8_run8(acc, x, rows, s, blocks))
    }

    /// [`q8_c1_run8`] with its scales' reader.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_run8(
        acc: &mut [f32; 8],
        x: &[WordBlock],
        rows: [&[u8]; 8],
        scales: impl BlockScales<8>,
        blocks: Range<usize>,
    ) -> usize {
        let x = &x[..blocks.end];
        let rows = rows.map(|r| &r[..blocks.end * BLOCK]);
        let base = rows.map(<[u8]>::as_ptr);
        let mut total = LateTotal::new(_mm256_loadu_ps(acc.as_ptr()));
        let mut stop = blocks.end;
        for kb in blocks {
            let at = kb * BLOCK;
            prefetch(&rows, at);
            let Some(scale) = scales.vectors::<2>(kb, |l| l) else {
                stop = kb;
                break;
            };
            let xb = &x[kb];
            let codes = base.map(|row| row.add(at));
            let sums = if xb.split {
                word_sums8::<true>(xb, &codes)
            } else {
                word_sums8::<false>(xb, &codes)
            };
            total.add(IntBlock {
                sums,
                scale,
                unit: 2.0 * xb.unit,
            });
        }
        _mm256_storeu_ps(acc.as_mut_ptr(), total.finish());
        stop
    }

    /// Eight rows' integer block sums, their scales and unit: the values [`block_values`].
    #[derive(Clone, Copy)]
    struct IntBlock {
        sums: __m256i,
        scale: [__m256d; 2],
        unit: f64,
    }

    impl LateBlock for IntBlock {
        type Totals = __m256;

        #[inline(always)]
        unsafe fn add_to(self, totals: __m256) -> __m256 {
            _mm256_add_ps(totals, block_values(self.sums, self.scale, self.unit))
        }
    }

    /// The eight rows' block values `f32(S_i · scale_i · unit)` from their integer sums S (row i
    /// in lane i), scales of rows 0..4 and 4..8: the product is exact, so it rounds once.
    #[inline(always)]
    unsafe fn block_values(sums: __m256i, scale: [__m256d; 2], unit: f64) -> __m256 {
        let low = _mm256_cvtepi32_pd(_mm256_castsi256_si128(sums));
        let high = _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(sums));
        f64_block_values([low, high], scale, unit)
    }

    /// An input block's X as words, column pairs `(X[2p], X[2p + 1])` in the dwords: what the
    /// prefill kernels broadcast (`avx2_fp4_prefill`, `avx2_fp8_prefill`).
    pub(in crate::model::simd) trait WordPairs {
        fn pair(&self, p: usize) -> i32;
    }

    impl WordPairs for [i16; BLOCK] {
        #[inline(always)]
        fn pair(&self, p: usize) -> i32 {
            (u32::from(self[2 * p] as u16) | u32::from(self[2 * p + 1] as u16) << 16) as i32
        }
    }

    impl WordPairs for [i32; BLOCK / 2] {
        #[inline(always)]
        fn pair(&self, p: usize) -> i32 {
            self[p]
        }
    }

    /// `Σ_p vpmaddwd(weights[h][p], x_j's pair p broadcast)` for each input row j and each
    /// of `H` weight vectors h: eight weight rows' sums over these words per vector (row i in
    /// lane i), wrapping. The input rows advance together so that each weight vector is
    /// loaded once for all of them, and each broadcast serves the `H` vectors.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn pair_sums<const N: usize, const H: usize, X: WordPairs>(
        weights: [&[__m256i; BLOCK / 2]; H],
        xs: [&X; N],
    ) -> [[__m256i; H]; N] {
        let mut acc = [[_mm256_setzero_si256(); H]; N];
        for p in 0..BLOCK / 2 {
            for (a, x) in acc.iter_mut().zip(&xs) {
                let x = _mm256_set1_epi32(x.pair(p));
                for (a, w) in a.iter_mut().zip(&weights) {
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(w[p], x));
                }
            }
        }
        acc
    }

    /// Weight rows of one vector in the prefill kernels (`avx2_fp4_prefill`,
    /// `avx2_fp8_prefill`), whose tasks are one such half or two.
    pub(in crate::model::simd) const HALF: usize = 8;

    /// Input rows whose sums advance together in a prefill kernel over `halves` halves: of
    /// the sixteen registers, `halves` sums per input row, `halves` weight vectors and one
    /// broadcast input.
    pub(in crate::model::simd) const fn group_rows(halves: usize) -> usize {
        if halves == 1 {
            8
        } else {
            6
        }
    }

    /// One block's steps of `H` halves of weight rows (each a power of two: an E8M0 scale,
    /// times a power of two for FP8): in f64, rows 0..4 and 4..8 of each half; in f32 (exact,
    /// f32 subnormals included); and the range of the rows present, which decides where the
    /// f32 form is exact.
    pub(in crate::model::simd) struct HalfSteps<const H: usize> {
        pub(in crate::model::simd) f64: [[__m256d; 2]; H],
        f32: [__m256; H],
        range: (f64, f64),
    }

    impl<const H: usize> HalfSteps<H> {
        /// From each row's step (`steps[r]`, the first `present` rows present; the others
        /// any value, their lanes never read).
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn new(steps: &[f64; 2 * HALF], present: usize) -> Self {
            let mut out = HalfSteps {
                f64: [[_mm256_setzero_pd(); 2]; H],
                f32: [_mm256_setzero_ps(); H],
                range: scale_range(&steps[..present]),
            };
            for h in 0..H {
                let half = &steps[HALF * h..];
                let (low, high) = (
                    _mm256_loadu_pd(half.as_ptr()),
                    _mm256_loadu_pd(half[4..].as_ptr()),
                );
                out.f64[h] = [low, high];
                out.f32[h] = _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low));
            }
            out
        }

        /// `sums[h] += f32(S_h · step · u)` for one input row's block sums `S_h` (every half,
        /// wrapping 32-bit lanes holding the true sums) and unit u (`unit_f32` its f32): in f32
        /// where every step times u lies where rounding commutes with it
        /// ([`f32_steps_exact`]), as `f32(S) · f32(step · u)`, else in f64 ([`block_values`]).
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn add_values(
            &self,
            sums: &mut [__m256; H],
            s: [__m256i; H],
            unit: f64,
            unit_f32: f32,
        ) {
            if f32_steps_exact((unit, unit), self.range) {
                let unit = _mm256_set1_ps(unit_f32);
                for ((sum, s), steps) in sums.iter_mut().zip(s).zip(&self.f32) {
                    let step = _mm256_mul_ps(*steps, unit);
                    *sum = _mm256_add_ps(*sum, _mm256_mul_ps(_mm256_cvtepi32_ps(s), step));
                }
            } else {
                for ((sum, s), steps) in sums.iter_mut().zip(s).zip(&self.f64) {
                    *sum = _mm256_add_ps(*sum, block_values(s, *steps, unit));
                }
            }
        }
    }

    /// Input row m's f32 sums (`sums[m][h]`, weight row 8h + i in lane i) into `out[r · rows
    /// + m]` for the first `nw` weight rows r.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn store_row_sums<const H: usize>(
        out: &mut [f32],
        sums: &[[__m256; H]],
        nw: usize,
    ) {
        let rows = sums.len();
        for (m, s) in sums.iter().enumerate() {
            let mut lanes = [0f32; 16];
            for (h, v) in s.iter().enumerate() {
                _mm256_storeu_ps(lanes[8 * h..].as_mut_ptr(), *v);
            }
            for (r, &v) in lanes[..nw].iter().enumerate() {
                out[r * rows + m] = v;
            }
        }
    }

    /// [`block_values`] of exact sums held in f64 (rows 0..4 and 4..8).
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn f64_block_values(
        sums: [__m256d; 2],
        scale: [__m256d; 2],
        unit: f64,
    ) -> __m256 {
        let unit = _mm256_set1_pd(unit);
        let low = _mm256_cvtpd_ps(_mm256_mul_pd(sums[0], _mm256_mul_pd(scale[0], unit)));
        let high = _mm256_cvtpd_ps(_mm256_mul_pd(sums[1], _mm256_mul_pd(scale[1], unit)));
        _mm256_set_m128(high, low)
    }

    /// The eight rows' `Σ X·code` over one block (wrapping 32-bit lanes, row i in lane i), from
    /// the block's words (two passes where `SPLIT`) and the rows' 32 signed codes each.
    #[inline(always)]
    unsafe fn word_sums8<const SPLIT: bool>(xb: &WordBlock, codes: &[*const u8; 8]) -> __m256i {
        let w0 = [
            _mm256_load_si256(xb.words[0].as_ptr().cast()),
            _mm256_load_si256(xb.words[0][16..].as_ptr().cast()),
        ];
        let w1 = [
            _mm256_load_si256(xb.words[1].as_ptr().cast()),
            _mm256_load_si256(xb.words[1][16..].as_ptr().cast()),
        ];
        let mut lanes = [_mm256_setzero_si256(); 8];
        for (lane, &row) in lanes.iter_mut().zip(codes) {
            let c = [
                _mm256_cvtepi8_epi16(_mm_loadu_si128(row.cast())),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(row.add(16).cast())),
            ];
            let mut s = _mm256_add_epi32(
                _mm256_madd_epi16(c[0], w0[0]),
                _mm256_madd_epi16(c[1], w0[1]),
            );
            if SPLIT {
                let rest = _mm256_add_epi32(
                    _mm256_madd_epi16(c[0], w1[0]),
                    _mm256_madd_epi16(c[1], w1[1]),
                );
                s = _mm256_add_epi32(s, _mm256_slli_epi32::<8>(rest));
            }
            *lane = s;
        }
        row_sums8(lanes)
    }

    /// A row's 32 nibble codes (16 bytes at `codes`) as the unsigned bytes `W + c`: lane 0 the
    /// low nibbles (even columns), lane 1 the high ones (odd columns); FP4 nibbles looked up in
    /// `table`, Q4G nibbles as they are.
    #[inline(always)]
    unsafe fn weight_bytes<const FP4: bool>(codes: *const u8, table: __m256i) -> __m256i {
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(codes.cast()));
        let shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        let nibbles = _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
        if FP4 {
            _mm256_shuffle_epi8(table, nibbles)
        } else {
            nibbles
        }
    }

    /// The eight rows' `Σ X·(W + c)` over one block (wrapping 32-bit lanes, row i in lane i),
    /// from the block's first `N` digits and the rows' codes ([`weight_bytes`]).
    #[inline(always)]
    unsafe fn block_sums8<const FP4: bool, const N: usize>(
        xb: &DigitBlock,
        codes: &[*const u8; 8],
        table: __m256i,
    ) -> __m256i {
        let (ones, step) = (_mm256_set1_epi16(1), _mm256_set1_epi16(1 << 8));
        let d = [
            _mm256_load_si256(xb.digits[0].as_ptr().cast()),
            _mm256_load_si256(xb.digits[1].as_ptr().cast()),
            _mm256_load_si256(xb.digits[2].as_ptr().cast()),
        ];
        let mut lanes = [_mm256_setzero_si256(); 8];
        for (lane, &row) in lanes.iter_mut().zip(codes) {
            let w = weight_bytes::<FP4>(row, table);
            let mut s = _mm256_madd_epi16(_mm256_maddubs_epi16(w, d[0]), ones);
            if N > 1 {
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(w, d[1]), step));
            }
            if N > 2 {
                let top = _mm256_madd_epi16(_mm256_maddubs_epi16(w, d[2]), step);
                s = _mm256_add_epi32(s, _mm256_slli_epi32::<8>(top));
            }
            *lane = s;
        }
        row_sums8(lanes)
    }

    /// Each of eight rows' lane vectors summed, row i into lane i (wrapping).
    #[inline(always)]
    unsafe fn row_sums8(lanes: [__m256i; 8]) -> __m256i {
        // Pairwise sums: lane l of `quads[q]` holds part of row 4q + l (both 128-bit halves).
        let pairs = [
            _mm256_hadd_epi32(lanes[0], lanes[1]),
            _mm256_hadd_epi32(lanes[2], lanes[3]),
            _mm256_hadd_epi32(lanes[4], lanes[5]),
            _mm256_hadd_epi32(lanes[6], lanes[7]),
        ];
        let quads = [
            _mm256_hadd_epi32(pairs[0], pairs[1]),
            _mm256_hadd_epi32(pairs[2], pairs[3]),
        ];
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(quads[0], quads[1]),
            _mm256_permute2x128_si256::<0x31>(quads[0], quads[1]),
        )
    }
}
