//! Rule C1's FP8 block sums for a prefill, with AVX-512 VNNI on 16-bit words (MODEL.md §5.4).
//!
//! An act-quantised input block is `x = X · 2u` with integers X ([`reduced_block_integers`],
//! their common power of two moved into u). An e4m3 code is `M · 2^e · 2^−9` with a 4-bit M
//! (the implicit bit included) and `e` its exponent field less one (0 for subnormals), so a
//! weight row's block is `W · 2^(e_min − 9)` with `W = ±M · 2^(e − e_min)`, e_min the least
//! exponent of its nonzero codes. The block sum is then `u · 2^(e_min − 8) · Σ X·W`, exact in
//! integers. `vpdpwssd` adds two signed 16-bit products per 32-bit lane: sixteen weight rows
//! sit in the lanes, two columns each, and an input row's two columns are broadcast, so a
//! weight block's words (and each row's e_min, a vertical minimum over its lane) are made once
//! for every input row of the prefill.
//!
//! One pass over words suffices where X and W fit a word and the sum fits 32 bits (the
//! additions wrap, so only the true sum must fit): `|Σ X·W| ≤ min(max|W| · Σ|X|, max|X| ·
//! Σ|W|)` below 2^31, W's maximum and sums taken over the sixteen rows. Trained blocks mostly
//! pass. Otherwise the sum is taken in several passes, each below 2^31: X cut into balanced
//! base-256 digits (`X = D₀ + 2^8 D₁ + 2^16 D₂`, |Dᵢ| ≤ 128) against W's words (each pass
//! below 32 · 128 · 2^15 = 2^27); where some row's exponents span more than 11 (W no longer
//! fits a word), W cut into its low byte and the rest (`W = W₀ + 2^8 W₁`, |W₁| < 2^10) against
//! X's words (below 32 · 2^15 · 2^10 = 2^30) or, where X is wider than a word, its digits.
//! The passes are recombined exactly in f64 (the total is below 2^42). The scaling, the
//! rounding to f32 and the additions over the blocks in increasing order are the f64 kernels'
//! operations on the same exact block sum ([`super::vnni_prefill::scaled_block_sums`]), so the
//! bits are theirs.

use super::super::parallel::{try_for_each_chunk, worth_parallel};
use super::super::quant::BLOCK;
use super::vnni::{balanced_digits, reduced_block_integers, InputBlocks, IntegerInputs, DIGITS};

/// Weight rows per kernel call (one per 32-bit lane; `matvec`'s prefill task where this
/// kernel runs).
pub const W_ROWS: usize = 16;

/// Column pairs per block.
pub(super) const PAIRS: usize = BLOCK / 2;

/// What one pass over words reads of an input row's block: X as words, column pairs in the
/// dwords, and the bounds that decide whether one pass is exact.
#[derive(Clone, Copy)]
// Read by the x86-64 kernel alone; elsewhere the form is built but never used.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct RowWords {
    /// `words[c]`: X at columns 2c (low half) and 2c + 1 (high half), where max|X| fits a
    /// word (else unset).
    pub(super) words: [i32; PAIRS],
    /// u: input k is `X[k] · 2u`.
    pub(super) unit: f64,
    /// u as f32 (exact where the block's unit range is inside the f32 steps' range).
    pub(super) unit_f32: f32,
    /// max|X| and Σ|X| (below 2^24).
    largest: u32,
    pub(super) sum: u32,
    /// The base-256 digits X needs (at least one).
    pub(super) digit_count: u8,
}

const EMPTY: RowWords = RowWords {
    words: [0; PAIRS],
    unit: 0.0,
    unit_f32: 0.0,
    largest: 0,
    sum: 0,
    digit_count: 1,
};

/// An input row's block as balanced base-256 digits: `digits[d][c]`, digit d of X at columns
/// 2c and 2c + 1, as words.
pub(super) type RowDigits = [[i32; PAIRS]; DIGITS];

/// Every full block of a prefill's input rows as words, block-major: `[kb · rows + m]` is
/// block kb of row m.
#[derive(Default)]
pub struct ActWords {
    pub(super) rows: usize,
    pub(super) blocks: usize,
    /// What every block's one pass reads.
    pub(super) entries: Vec<RowWords>,
    /// The digits, apart: read only where one pass is not exact.
    pub(super) digits: Vec<RowDigits>,
    /// Per block, the least and the largest unit of its rows.
    unit_ranges: Vec<(f64, f64)>,
}

impl IntegerInputs for ActWords {
    fn fill(&mut self, input: InputBlocks) -> bool {
        let (rows, blocks) = (input.rows, input.blocks);
        self.rows = rows;
        self.blocks = blocks;
        self.entries.clear();
        self.entries.resize(rows * blocks, EMPTY);
        self.digits.clear();
        self.digits.resize(rows * blocks, [[0; PAIRS]; DIGITS]);
        // About a thousand operations per row and block: worth the pool at real widths.
        let parallel = worth_parallel(rows * blocks * BLOCK * BLOCK);
        // Block kb's words and digits, side by side.
        let mut by_block: Vec<_> = self
            .entries
            .chunks_mut(rows)
            .zip(self.digits.chunks_mut(rows))
            .collect();
        let filled = try_for_each_chunk(&mut by_block, 1, parallel, |kb, block| {
            let (entries, digits) = &mut block[0];
            for (m, (entry, digit)) in entries.iter_mut().zip(digits.iter_mut()).enumerate() {
                let (x, unit) = reduced_block_integers(input.block(m, kb)).ok_or(())?;
                let count;
                (*digit, count) = row_digits(&x);
                *entry = RowWords::of(&x, unit, count);
            }
            Ok::<(), ()>(())
        });
        if filled.is_err() {
            return false;
        }
        self.unit_ranges.clear();
        for entries in self.entries.chunks_exact(rows) {
            let units = entries.iter().fold((f64::INFINITY, 0f64), |(lo, hi), e| {
                (lo.min(e.unit), hi.max(e.unit))
            });
            self.unit_ranges.push(units);
        }
        true
    }
}

impl RowWords {
    /// Whether X fits words (`words` is set).
    pub(super) fn in_words(&self) -> bool {
        self.largest <= i16::MAX as u32
    }

    /// From an act-quantised block's reduced integers and unit.
    fn of(x: &[i32; BLOCK], unit: f64, digit_count: u8) -> RowWords {
        let largest = x.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        let mut row = RowWords {
            unit,
            unit_f32: unit as f32,
            largest,
            sum: x.iter().map(|v| v.unsigned_abs()).sum(),
            digit_count,
            ..EMPTY
        };
        if row.in_words() {
            row.words = pairs(x);
        }
        row
    }
}

/// Values in words, column pairs in the dwords (each |v| < 2^15).
fn pairs(values: &[i32; BLOCK]) -> [i32; PAIRS] {
    std::array::from_fn(|c| {
        let (low, high) = (values[2 * c], values[2 * c + 1]);
        ((low as u32 & 0xFFFF) | (high as u32) << 16) as i32
    })
}

/// X in balanced base-256 digits (`X = Σ 2^(8d) D_d`, −128 ≤ D_d ≤ 127), as words, and how
/// many it needs (at least one).
fn row_digits(x: &[i32; BLOCK]) -> (RowDigits, u8) {
    let mut digits = [[0i32; BLOCK]; DIGITS];
    let mut used = 1;
    for (k, &v) in x.iter().enumerate() {
        let (d, needed) = balanced_digits(v);
        for (digit, d) in digits.iter_mut().zip(d) {
            digit[k] = i32::from(d);
        }
        used = used.max(needed);
    }
    (digits.map(|d| pairs(&d)), used)
}

#[cfg(target_arch = "x86_64")]
pub use kernel::fp8_c1_rows;

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::avx512::RowStarts;
    use super::super::vnni_prefill::{
        f32_steps_exact, scaled_block_sums, scaled_f64_sums, LaneSteps,
    };
    use super::super::{check_prefill_rows, lanes_of_rows};
    use super::{ActWords, RowDigits, RowWords, BLOCK, PAIRS, W_ROWS};
    use std::arch::x86_64::*;

    /// Block kb of sixteen weight rows (lanes) as words, two columns per dword.
    struct WeightBlock {
        /// Whether every row's exponents span at most 11, so that W fits a word.
        whole: bool,
        /// `words[c]`: every row's W at columns 2c (low half) and 2c + 1 (where `whole`).
        words: [__m512i; PAIRS],
        /// max|W| and the largest Σ|W| of a row (where `whole`).
        largest: u64,
        sum: u64,
        /// `split[d][c]`: W's low byte (d = 0) and the rest (d = 1), the same way (where not
        /// `whole`).
        split: [[__m512i; PAIRS]; 2],
        /// Each row's step `scale · 2^(e_min − 8)`.
        steps: LaneSteps,
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
        let (rows, blocks) = (acts.rows, acts.blocks);
        check_prefill_rows(out, rows, blocks, (codes, BLOCK), scales, W_ROWS);
        let nw = codes.len();
        if nw == 0 {
            return true;
        }
        let (code_rows, scale_rows): ([&[u8]; W_ROWS], [&[u8]; W_ROWS]) =
            (lanes_of_rows(codes), lanes_of_rows(scales));
        let codes = RowStarts::new(&code_rows, blocks * BLOCK);
        let scales = RowStarts::new(&scale_rows, blocks);
        // Row m's sixteen sums, in f32 from +0.0.
        let mut sums = vec![_mm512_setzero_ps(); rows];
        let zero = _mm512_setzero_si512();
        let mut w = WeightBlock {
            whole: true,
            words: [zero; PAIRS],
            largest: 0,
            sum: 0,
            split: [[zero; PAIRS]; 2],
            steps: LaneSteps::new((_mm512_setzero_pd(), _mm512_setzero_pd()), false),
        };
        for kb in 0..blocks {
            if !weight_block(&mut w, &codes, &scales, kb, acts.unit_ranges[kb]) {
                return false;
            }
            let at = kb * rows;
            let (entries, digits) = (&acts.entries[at..][..rows], &acts.digits[at..][..rows]);
            for ((sum, e), d) in sums.iter_mut().zip(entries).zip(digits) {
                let one_pass = w.whole
                    && e.in_words()
                    && (w.largest * u64::from(e.sum)).min(w.sum * u64::from(e.largest)) < 1 << 31;
                let v = if one_pass {
                    let steps = w.steps.times(e.unit, e.unit_f32);
                    scaled_block_sums(word_sum(&w.words, &e.words), steps)
                } else {
                    by_digits(&w, e, d)
                };
                *sum = _mm512_add_ps(*sum, v);
            }
        }
        for (m, s) in sums.iter().enumerate() {
            let mut lanes = [0f32; W_ROWS];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *s);
            for (i, &v) in lanes[..nw].iter().enumerate() {
                out[i * rows + m] = v;
            }
        }
        true
    }

    /// `Σ_c` of the weight words `w[c]` (lanes = rows) times the input's pair `x[c]`, in two
    /// chains (even and odd c): integer sums, exact in any order.
    #[inline(always)]
    unsafe fn word_sum(w: &[__m512i; PAIRS], x: &[i32; PAIRS]) -> __m512i {
        let (mut even, mut odd) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for c in (0..PAIRS).step_by(2) {
            even = _mm512_dpwssd_epi32(even, w[c], _mm512_set1_epi32(x[c]));
            odd = _mm512_dpwssd_epi32(odd, w[c + 1], _mm512_set1_epi32(x[c + 1]));
        }
        _mm512_add_epi32(even, odd)
    }

    /// A block sum in several passes (module note), each pass's sum times its power of two,
    /// added exactly in f64, then scaled and rounded once: X's digits against whole words; X
    /// as words, where it fits, against split ones, else its digits.
    #[inline(always)]
    unsafe fn by_digits(w: &WeightBlock, e: &RowWords, digits: &RowDigits) -> __m512 {
        let (mut lo, mut hi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let (xs, weights): (&[[i32; PAIRS]], &[[__m512i; PAIRS]]) = if w.whole {
            (
                &digits[..usize::from(e.digit_count)],
                std::slice::from_ref(&w.words),
            )
        } else if e.in_words() {
            (std::slice::from_ref(&e.words), &w.split)
        } else {
            (&digits[..usize::from(e.digit_count)], &w.split)
        };
        // Digits are base 256; X as words counts as one digit.
        for (dx, x) in xs.iter().enumerate() {
            for (dw, wd) in weights.iter().enumerate() {
                let s = word_sum(wd, x);
                let power = _mm512_set1_pd(f64::from_bits((1023 + 8 * (dx + dw) as u64) << 52));
                lo = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(s)), power, lo);
                hi = _mm512_fmadd_pd(
                    _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(s)),
                    power,
                    hi,
                );
            }
        }
        scaled_f64_sums((lo, hi), w.steps.times_f64(e.unit))
    }

    /// `vpshufb` patterns (each 128-bit lane) taking bytes 0, 1 (`LOW`) or 2, 3 (`HIGH`) of
    /// every dword into the low bytes of its two words, or into the high bytes (`_UP`); the
    /// other bytes zero.
    const LOW: [i8; 16] = pattern(0, 0);
    const HIGH: [i8; 16] = pattern(2, 0);
    const LOW_UP: [i8; 16] = pattern(0, 1);
    const HIGH_UP: [i8; 16] = pattern(2, 1);

    const fn pattern(first: i8, at: usize) -> [i8; 16] {
        let mut p = [-128i8; 16];
        let mut d = 0;
        while d < 4 {
            p[4 * d + at] = 4 * d as i8 + first;
            p[4 * d + 2 + at] = 4 * d as i8 + first + 1;
            d += 1;
        }
        p
    }

    /// Block kb of the sixteen weight rows into `w`: its words (or split words), their
    /// bounds and each row's step (in f32 where exact for input units in `units`); `false`
    /// for a NaN code.
    #[inline(always)]
    unsafe fn weight_block(
        w: &mut WeightBlock,
        codes: &RowStarts<W_ROWS>,
        scales: &RowStarts<W_ROWS>,
        kb: usize,
        units: (f64, f64),
    ) -> bool {
        // Sixteen rows streamed at once: more than the hardware prefetcher follows.
        codes.prefetch(kb * BLOCK);
        let quads = code_quads(codes, kb);
        let (zero, seven, one) = (
            _mm512_setzero_si512(),
            _mm512_set1_epi8(7),
            _mm512_set1_epi8(1),
        );
        let mut mantissas = [zero; 8];
        let mut exponents = [zero; 8];
        let (mut least, mut most) = (_mm512_set1_epi8(15), zero);
        let mut nan = 0u64;
        for (j, &c) in quads.iter().enumerate() {
            let magnitude = _mm512_and_si512(c, _mm512_set1_epi8(0x7F));
            nan |= _mm512_cmpeq_epi8_mask(magnitude, _mm512_set1_epi8(0x7F));
            // No byte shift: a word's shift carries the next byte's low bits into bits 5 ..
            let field = _mm512_and_si512(_mm512_srli_epi16::<3>(magnitude), _mm512_set1_epi8(15));
            let normal = _mm512_test_epi8_mask(field, field);
            // The implicit bit of normal codes.
            let m = _mm512_or_si512(
                _mm512_and_si512(c, seven),
                _mm512_maskz_mov_epi8(normal, _mm512_set1_epi8(8)),
            );
            let e = _mm512_mask_sub_epi8(field, normal, field, one);
            let nonzero = _mm512_test_epi8_mask(m, m);
            least = _mm512_mask_min_epu8(least, nonzero, least, e);
            most = _mm512_mask_max_epu8(most, nonzero, most, e);
            let negative = _mm512_test_epi8_mask(c, _mm512_set1_epi8(-128));
            mantissas[j] = _mm512_mask_sub_epi8(m, negative, zero, m);
            exponents[j] = e;
        }
        if nan != 0 {
            return false;
        }
        // Each row's least and largest exponent: the four bytes of its dword. A row without a
        // nonzero code (least 15 above most 0) takes e_min 0.
        let least = row_least(least);
        let most = row_most(most);
        let empty = _mm512_cmpgt_epu32_mask(least, most);
        let least = _mm512_mask_mov_epi32(least, empty, zero);
        // |W| < 16 · 2^span: a word for spans up to 11.
        w.whole = _mm512_reduce_max_epu32(_mm512_sub_epi32(most, least)) <= 11;
        // e_min in every byte of its row's dword.
        let least_bytes = _mm512_mullo_epi32(least, _mm512_set1_epi32(0x0101_0101));
        let lows = [pattern16(&LOW), pattern16(&HIGH)];
        if w.whole {
            let ups = [pattern16(&LOW_UP), pattern16(&HIGH_UP)];
            let (mut largest, mut sums) = (zero, zero);
            for j in 0..8 {
                let shift = _mm512_sub_epi8(exponents[j], least_bytes);
                for (h, (&low, &up)) in lows.iter().zip(&ups).enumerate() {
                    // ±M as a word (from the high byte, arithmetic), times 2^shift (≤ 11 for
                    // nonzero codes; zero codes give 0 whatever their count).
                    let m = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(mantissas[j], up));
                    let v = _mm512_sllv_epi16(m, _mm512_shuffle_epi8(shift, low));
                    w.words[2 * j + h] = v;
                    let magnitude = _mm512_abs_epi16(v);
                    largest = _mm512_max_epu16(largest, magnitude);
                    sums = _mm512_dpwssd_epi32(sums, magnitude, _mm512_set1_epi16(1));
                }
            }
            let largest = _mm512_max_epu32(
                _mm512_and_si512(largest, _mm512_set1_epi32(0xFFFF)),
                _mm512_srli_epi32::<16>(largest),
            );
            w.largest = u64::from(_mm512_reduce_max_epu32(largest));
            w.sum = u64::from(_mm512_reduce_max_epu32(sums));
        } else {
            let eight = _mm512_set1_epi16(8);
            for j in 0..8 {
                let shift = _mm512_sub_epi8(exponents[j], least_bytes);
                for (h, &low) in lows.iter().enumerate() {
                    let shift = _mm512_shuffle_epi8(shift, low);
                    let signed = _mm512_shuffle_epi8(mantissas[j], low);
                    let negative = _mm512_test_epi16_mask(signed, _mm512_set1_epi16(0x80));
                    let m = _mm512_abs_epi8(signed);
                    // |W| = M << shift (≤ 14): its low byte, and the rest (M << (shift − 8),
                    // or M >> (8 − shift); the count that is out of range gives 0).
                    let low_byte =
                        _mm512_and_si512(_mm512_sllv_epi16(m, shift), _mm512_set1_epi16(0xFF));
                    let rest = _mm512_or_si512(
                        _mm512_sllv_epi16(m, _mm512_sub_epi16(shift, eight)),
                        _mm512_srlv_epi16(m, _mm512_sub_epi16(eight, shift)),
                    );
                    for (d, v) in [low_byte, rest].into_iter().enumerate() {
                        w.split[d][2 * j + h] = _mm512_mask_sub_epi16(v, negative, zero, v);
                    }
                }
            }
        }
        // The steps: E8M0 byte b and e_min give 2^(b − 127 + e_min − 8), as f64 fields.
        let mut bytes = [0i32; W_ROWS];
        for g in 0..2 {
            for (b, s) in bytes[8 * g..].iter_mut().zip(scales.group::<1>(g, kb)) {
                *b = i32::from(s[0]);
            }
        }
        let fields = _mm512_add_epi32(
            _mm512_add_epi32(_mm512_loadu_si512(bytes.as_ptr().cast()), least),
            _mm512_set1_epi32(1023 - 127 - 8),
        );
        let field = |f: i32| f64::from_bits((f as u64) << 52);
        let range = (
            field(_mm512_reduce_min_epi32(fields)),
            field(_mm512_reduce_max_epi32(fields)),
        );
        // Each an f32 value: from 2^−135 (a subnormal) to 2^124 (scale bytes up to 245).
        w.steps = LaneSteps::new(
            (
                power_of_two(_mm512_castsi512_si256(fields)),
                power_of_two(_mm512_extracti64x4_epi64::<1>(fields)),
            ),
            f32_steps_exact(units, range),
        );
        true
    }

    /// The f64 powers of two of eight biased exponent fields.
    #[inline(always)]
    unsafe fn power_of_two(fields: __m256i) -> __m512d {
        _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_cvtepi32_epi64(fields)))
    }

    /// A `vpshufb` pattern in every 128-bit lane.
    #[inline(always)]
    unsafe fn pattern16(p: &[i8; 16]) -> __m512i {
        _mm512_broadcast_i32x4(_mm_loadu_si128(p.as_ptr().cast()))
    }

    /// The least of each dword's four bytes, as the dword.
    #[inline(always)]
    unsafe fn row_least(v: __m512i) -> __m512i {
        // Byte 0 meets byte 2, then byte 1 (itself met with 3); the zeros shifted in never
        // reach byte 0.
        let v = _mm512_min_epu8(v, _mm512_srli_epi32::<16>(v));
        let v = _mm512_min_epu8(v, _mm512_srli_epi32::<8>(v));
        _mm512_and_si512(v, _mm512_set1_epi32(0xFF))
    }

    /// The largest of each dword's four bytes, as the dword.
    #[inline(always)]
    unsafe fn row_most(v: __m512i) -> __m512i {
        let v = _mm512_max_epu8(v, _mm512_srli_epi32::<16>(v));
        let v = _mm512_max_epu8(v, _mm512_srli_epi32::<8>(v));
        _mm512_and_si512(v, _mm512_set1_epi32(0xFF))
    }

    /// `vpermt2d` indices taking, from two vectors of two rows each (row 2p's eight dwords,
    /// then row 2p + 1's), dword j of the four rows at `4 jj + r`, j = 4h + jj: `[h]`.
    static FOUR_ROWS: [[i32; 16]; 2] = {
        let mut t = [[0; 16]; 2];
        let mut p = 0;
        while p < 32 {
            let (h, jj, r) = (p / 16, (p % 16) / 4, p % 4);
            t[h][p % 16] = (8 * r + 4 * h + jj) as i32;
            p += 1;
        }
        t
    };

    /// `vpermt2d` indices taking, from two such four-row vectors (rows 8h' + 4s + r), their
    /// dwords jj = 2t and 2t + 1 of all eight rows: `[t]`, jj's eight rows at `8 (jj − 2t)`.
    static EIGHT_ROWS: [[i32; 16]; 2] = {
        let mut t = [[0; 16]; 2];
        let mut p = 0;
        while p < 32 {
            let (tt, s, src, r) = (p / 16, (p % 16) / 8, (p % 8) / 4, p % 4);
            t[tt][p % 16] = (16 * src + 4 * (2 * tt + s) + r) as i32;
            p += 1;
        }
        t
    };

    /// Block kb of the sixteen weight rows as eight vectors, vector j holding in lane i row
    /// i's codes at columns 4j .. 4j + 4: two rows a vector, then three rounds of exchanges.
    #[inline(always)]
    unsafe fn code_quads(codes: &RowStarts<W_ROWS>, kb: usize) -> [__m512i; 8] {
        let mut pairs = [_mm512_setzero_si512(); 8];
        for g in 0..2 {
            let rows = codes.group::<BLOCK>(g, kb * BLOCK);
            for (p, pair) in pairs[4 * g..][..4].iter_mut().enumerate() {
                let (a, b) = (rows[2 * p], rows[2 * p + 1]);
                *pair = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(a.as_ptr().cast())),
                    _mm256_loadu_si256(b.as_ptr().cast()),
                );
            }
        }
        let four = [table(&FOUR_ROWS[0]), table(&FOUR_ROWS[1])];
        let eight = [table(&EIGHT_ROWS[0]), table(&EIGHT_ROWS[1])];
        // fours[q][h]: rows 4q .. 4q + 4, dwords 4h .. 4h + 4.
        let mut fours = [[_mm512_setzero_si512(); 2]; 4];
        for (q, f) in fours.iter_mut().enumerate() {
            for (h, v) in f.iter_mut().enumerate() {
                *v = _mm512_permutex2var_epi32(pairs[2 * q], four[h], pairs[2 * q + 1]);
            }
        }
        // eights[g][2h + t]: rows 8g .. 8g + 8, dwords 4h + 2t and 4h + 2t + 1.
        let mut eights = [[_mm512_setzero_si512(); 4]; 2];
        for (g, e) in eights.iter_mut().enumerate() {
            for (i, v) in e.iter_mut().enumerate() {
                let (h, t) = (i / 2, i % 2);
                *v = _mm512_permutex2var_epi32(fours[2 * g][h], eight[t], fours[2 * g + 1][h]);
            }
        }
        let mut quads = [_mm512_setzero_si512(); 8];
        for i in 0..4 {
            quads[2 * i] = _mm512_shuffle_i64x2::<0x44>(eights[0][i], eights[1][i]);
            quads[2 * i + 1] = _mm512_shuffle_i64x2::<0xEE>(eights[0][i], eights[1][i]);
        }
        quads
    }

    /// A table of sixteen dword indices.
    #[inline(always)]
    unsafe fn table(t: &[i32; 16]) -> __m512i {
        _mm512_loadu_si512(t.as_ptr().cast())
    }
}
