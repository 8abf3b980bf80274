//! Rule C1's FP8 block sums for a prefill with AVX2 alone, in integers (MODEL.md §5.4).
//!
//! The forms are `vnni_words`': an act-quantised input block is `x = X · 2u` with integers X,
//! as words where |X| < 2^15 and as balanced base-256 digits ([`ActWords`]); a weight row's
//! block of e4m3 codes is `W · 2^(e_min − 9)` with `W = ±M · 2^(e − e_min)`, M the 4-bit
//! mantissa with its implicit bit, e the exponent field less one (0 for subnormals) and e_min
//! the least e of the row's nonzero codes in the block. The block sum is
//! `u · 2^(e_min − 8) · Σ X·W`, the integer sum exact.
//!
//! A task's sixteen weight rows are two halves of eight, each half the 32-bit lanes of a
//! vector, each lane one row's pair of columns `(W[2p], W[2p + 1])` as two words; an input
//! row's pair is broadcast once for both halves, and `vpmaddwd` makes sixteen products summed
//! in pairs per half, sixteen of them a block. A block's weights are decoded once for every
//! input row of the call, the reuse a prefill has over a decode. One pass is exact where every
//! row's exponents span at most 11 (W fits a word) and `max|W| · Σ|X|` is below 2^31 (the
//! wrapping sums then equal the true one). The others take `vnni_words`' passes: X's digits
//! against W's words (each pass below 32 · 128 · 2^15 = 2^27), or, where W spans more (one
//! block of eight rows in seven of `ds41 bench --kernels`' random weights), W's low byte and
//! the rest `|W| >> 8` (below 2^10) against X's words (below 2^30) or digits; the passes are
//! recombined exactly in f64 (the total is below 2^42). Each half takes its own form; input
//! rows whose X fits words, the common case, run six at a time (eight with one half) against
//! both; digits, one input row and one half at a time. The product with the steps and the
//! rounding to f32 are those of every other C1 kernel on the same exact block sum
//! (`avx2_digits::f64_block_values`), or, where one pass gives the sum and every step lies
//! where rounding commutes with it (`vnni_prefill::f32_steps_exact`), `f32(S)` times the step
//! in f32, which rounds the same; the f32 sums run over the blocks in increasing order from
//! +0.0, so the bits are the same.

use super::super::quant::BLOCK;
use super::avx2_digits::{
    f64_block_values, group_rows, pair_sums, store_row_sums, HalfSteps, HALF,
};
use super::vnni_words::{ActWords, RowDigits, RowWords, PAIRS};
use super::x86::columns8;
use super::{check_prefill_rows, lanes_of_rows};
use crate::dtype::e8m0_to_f64;
use std::arch::x86_64::*;

/// Weight rows per kernel call: one per 32-bit lane of two vectors.
pub const W_ROWS: usize = 16;

/// The widest exponent span for which `|W| ≤ 15 · 2^span` fits a signed word.
const WORD_SPAN: i8 = 11;

/// `vpshufb` tables of a shift s ≤ 14: the low byte of 2^s (`POW_LOW`) and the high one.
static POW_LOW: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 0, 0, 0, 0, 0, 0, 0, 0];
static POW_HIGH: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, 128];

/// One weight row's block as bytes: M with its implicit bit, the shift `e − e_min`, and the
/// code itself (its sign).
#[derive(Clone, Copy)]
struct RowBytes {
    mantissa: __m256i,
    shift: __m256i,
    code: __m256i,
}

/// Block kb of eight weight rows (lanes), two columns a dword, pair p at `[p]`.
struct WeightBlock {
    /// Whether every row's exponents span at most [`WORD_SPAN`], so that W fits a word.
    whole: bool,
    /// W (where `whole`).
    words: [__m256i; PAIRS],
    /// W's low byte (`[0]`) and the rest (`[1]`), signed (where not `whole`).
    split: [[__m256i; PAIRS]; 2],
    /// A bound on max|W| (where `whole`).
    largest: u64,
    /// Each row's step `scale · 2^(e_min − 8)`: powers of two from 2^−135 (an f32
    /// subnormal) to 2^124.
    steps: [f64; HALF],
}

impl WeightBlock {
    /// Before the first block.
    unsafe fn empty() -> WeightBlock {
        let zero = _mm256_setzero_si256();
        WeightBlock {
            whole: true,
            words: [zero; PAIRS],
            split: [[zero; PAIRS]; 2],
            largest: 0,
            steps: [0.0; HALF],
        }
    }

    /// W's parts, each a pass against X, part d weighing 2^(8d): its words where `whole`, else
    /// its low bytes and the rest.
    fn parts(&self) -> &[[__m256i; PAIRS]] {
        if self.whole {
            std::slice::from_ref(&self.words)
        } else {
            &self.split
        }
    }
}

/// Rule C1 of up to [`W_ROWS`] release FP8 weight rows against every input row of `acts`:
/// `out[i · rows + m] = Σ_kb f32(scale[i][kb] · Σ_k x[m][k] · e4m3(code[i][k]))`, added in f32
/// in increasing kb from +0.0. `codes[i]` is row i's e4m3 bytes and `scales[i]` its E8M0
/// bytes, one per block. `false` where a code is NaN (`out` is then unspecified; the generic
/// path rewrites it).
///
/// # Safety
/// The CPU must have AVX2 and FMA. Every scale byte must keep f32 finite with every code
/// (`SAFE_SCALE_BYTE` in `matvec`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fp8_c1_rows(
    out: &mut [f32],
    acts: &ActWords,
    codes: &[&[u8]],
    scales: &[&[u8]],
) -> bool {
    check_prefill_rows(out, acts.rows, acts.blocks, (codes, BLOCK), scales, W_ROWS);
    match codes.len() {
        0 => true,
        // A task of at most eight rows would decode and multiply a second half of zeros.
        1..=HALF => halves_c1::<1>(out, acts, codes, scales),
        _ => halves_c1::<2>(out, acts, codes, scales),
    }
}

/// [`fp8_c1_rows`] with the rows in `H` halves of eight lanes (a short half repeating its
/// first row), each input row's pair broadcast once for every half.
#[inline(always)]
unsafe fn halves_c1<const H: usize>(
    out: &mut [f32],
    acts: &ActWords,
    codes: &[&[u8]],
    scales: &[&[u8]],
) -> bool {
    let (rows, blocks, nw) = (acts.rows, acts.blocks, codes.len());
    let half = |h: usize| HALF * h..nw.min(HALF * (h + 1));
    let codes: [[&[u8]; HALF]; H] = std::array::from_fn(|h| lanes_of_rows(&codes[half(h)]));
    let scales: [[&[u8]; HALF]; H] = std::array::from_fn(|h| lanes_of_rows(&scales[half(h)]));
    let group_size = group_rows(H);
    // Row m's sums of each half, in f32 from +0.0.
    let mut sums = vec![[_mm256_setzero_ps(); H]; rows];
    let mut w: [WeightBlock; H] = [(); H].map(|()| WeightBlock::empty());
    // Input rows whose X fits words, gathered a group at a time (indices into the entries).
    let mut group = [0usize; 8];
    for kb in 0..blocks {
        for (w, (codes, scales)) in w.iter_mut().zip(codes.iter().zip(&scales)) {
            if !weight_block(w, codes, scales, kb) {
                return false;
            }
        }
        let mut steps = [0f64; W_ROWS];
        for (s, w) in steps.chunks_exact_mut(HALF).zip(&w) {
            s.copy_from_slice(&w.steps);
        }
        let steps = HalfSteps::<H>::new(&steps, HALF * H);
        // One pass of X's words against whole halves' words is exact below 2^31; split
        // halves' passes always are (module note).
        let mut largest = 0;
        for w in w.iter().filter(|w| w.whole) {
            largest = largest.max(w.largest);
        }
        let at = kb * rows;
        let (entries, digits) = (&acts.entries[at..][..rows], &acts.digits[at..][..rows]);
        let mut n = 0;
        for (m, e) in entries.iter().enumerate() {
            if !(e.in_words() && largest * u64::from(e.sum) < 1 << 31) {
                for ((s, w), steps) in sums[m].iter_mut().zip(&w).zip(steps.f64) {
                    *s = _mm256_add_ps(*s, by_passes(w, steps, e, &digits[m]));
                }
                continue;
            }
            group[n] = m;
            n += 1;
            if n == group_size {
                grouped_block(n, &mut sums, &group, entries, (&w, &steps));
                n = 0;
            }
        }
        grouped_block(n, &mut sums, &group, entries, (&w, &steps));
    }
    store_row_sums(out, &sums, nw);
    true
}

/// The first `n` entries of `group` (indices into `entries`, X as words, each summed exactly
/// by the halves' words in one pass or by split words in two) into their f32 `sums`.
#[inline(always)]
unsafe fn grouped_block<const H: usize>(
    n: usize,
    sums: &mut [[__m256; H]],
    group: &[usize; 8],
    entries: &[RowWords],
    w: (&[WeightBlock; H], &HalfSteps<H>),
) {
    match n {
        0 => {}
        1 => passes_block::<1, H>(sums, group, entries, w),
        2 => passes_block::<2, H>(sums, group, entries, w),
        3 => passes_block::<3, H>(sums, group, entries, w),
        4 => passes_block::<4, H>(sums, group, entries, w),
        5 => passes_block::<5, H>(sums, group, entries, w),
        6 => passes_block::<6, H>(sums, group, entries, w),
        7 => passes_block::<7, H>(sums, group, entries, w),
        _ => passes_block::<8, H>(sums, group, entries, w),
    }
}

/// [`grouped_block`] of `N` entries. Where every half is whole, one pass whose 32-bit sums
/// are the block sums, scaled in f32 where that is exact and else in f64
/// ([`HalfSteps::add_values`]); otherwise a first pass over every half's first part and a
/// second over the split halves' rest, added exactly in f64.
#[inline(always)]
unsafe fn passes_block<const N: usize, const H: usize>(
    sums: &mut [[__m256; H]],
    group: &[usize; 8],
    entries: &[RowWords],
    (w, steps): (&[WeightBlock; H], &HalfSteps<H>),
) {
    let xs: [&[i32; PAIRS]; N] = std::array::from_fn(|j| &entries[group[j]].words);
    let first = pair_sums::<N, H, _>(std::array::from_fn(|h| &w[h].parts()[0]), xs);
    if w.iter().all(|w| w.whole) {
        for (&m, s) in group.iter().zip(first) {
            let e = &entries[m];
            steps.add_values(&mut sums[m], s, e.unit, e.unit_f32);
        }
        return;
    }
    let mut totals = [[[_mm256_setzero_pd(); 2]; H]; N];
    for (t, s) in totals.iter_mut().zip(first) {
        for ([lo, hi], s) in t.iter_mut().zip(s) {
            add_pass(lo, hi, s, 0);
        }
    }
    for (h, w) in w.iter().enumerate().filter(|(_, w)| !w.whole) {
        for (t, [s]) in totals
            .iter_mut()
            .zip(pair_sums::<N, 1, _>([&w.split[1]], xs))
        {
            let [lo, hi] = &mut t[h];
            add_pass(lo, hi, s, 1);
        }
    }
    for (&m, t) in group.iter().zip(totals) {
        for ((sum, t), steps) in sums[m].iter_mut().zip(t).zip(steps.f64) {
            *sum = _mm256_add_ps(*sum, f64_block_values(t, steps, entries[m].unit));
        }
    }
}

/// `(lo, hi) += 2^(8 · digit) · s`, the eight sums of a pass, exactly in f64.
#[inline(always)]
unsafe fn add_pass(lo: &mut __m256d, hi: &mut __m256d, s: __m256i, digit: usize) {
    let power = _mm256_set1_pd(f64::from_bits((1023 + 8 * digit as u64) << 52));
    *lo = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(s)), power, *lo);
    *hi = _mm256_fmadd_pd(
        _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(s)),
        power,
        *hi,
    );
}

/// A block sum of one half in several passes (module note), each pass's sums times its power
/// of two, added exactly in f64, then scaled and rounded once: X's digits against whole words
/// or split ones (X as words is [`passes_block`]).
#[inline(always)]
unsafe fn by_passes(
    w: &WeightBlock,
    steps: [__m256d; 2],
    e: &RowWords,
    digits: &RowDigits,
) -> __m256 {
    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    // Digits are base 256, and W's low byte counts as one.
    for (dx, x) in digits[..usize::from(e.digit_count)].iter().enumerate() {
        for (dw, wd) in w.parts().iter().enumerate() {
            let [[s]] = pair_sums::<1, 1, _>([wd], [x]);
            add_pass(&mut lo, &mut hi, s, dx + dw);
        }
    }
    f64_block_values([lo, hi], steps, e.unit)
}

/// Block kb of the eight rows into `w`: the codes as bytes, each row's e_min, the span, then
/// the words (or split words) and the steps; `false` for a NaN code. Loops, not closures: a
/// closure's body is compiled without the caller's target features.
#[inline(always)]
unsafe fn weight_block(
    w: &mut WeightBlock,
    codes: &[&[u8]; HALF],
    scales: &[&[u8]; HALF],
    kb: usize,
) -> bool {
    let zero = _mm256_setzero_si256();
    let (one, seven, fifteen) = (
        _mm256_set1_epi8(1),
        _mm256_set1_epi8(7),
        _mm256_set1_epi8(15),
    );
    let mut rows = [RowBytes {
        mantissa: zero,
        shift: zero,
        code: zero,
    }; HALF];
    let (mut nan, mut span) = (zero, zero);
    let mut steps = [0f64; HALF];
    for (i, row) in rows.iter_mut().enumerate() {
        let code = _mm256_loadu_si256(codes[i][kb * BLOCK..][..BLOCK].as_ptr().cast());
        let magnitude = _mm256_and_si256(code, _mm256_set1_epi8(0x7F));
        nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(magnitude, _mm256_set1_epi8(0x7F)));
        // A word's shift carries the next byte's low bits into bits 5.., masked off.
        let field = _mm256_and_si256(_mm256_srli_epi16::<3>(magnitude), fifteen);
        // Normal codes (field ≥ 1): the implicit bit 8 and e = field − 1; subnormals e = 0.
        let implicit = _mm256_slli_epi16::<3>(_mm256_min_epu8(field, one));
        let mantissa = _mm256_or_si256(_mm256_and_si256(code, seven), implicit);
        let e = _mm256_subs_epu8(field, one);
        // Zero codes take no part in the least exponent: 15 is above every e.
        let unused = _mm256_and_si256(_mm256_cmpeq_epi8(mantissa, zero), fifteen);
        let e_min = least_byte(_mm256_or_si256(e, unused));
        // Zero codes' shifts saturate at 0 (their W is 0 whatever the shift).
        let shift = _mm256_subs_epu8(e, _mm256_set1_epi8(e_min as i8));
        span = _mm256_max_epu8(span, shift);
        *row = RowBytes {
            mantissa,
            shift,
            code,
        };
        // 2^(e_min − 8) (e_min ≤ 15 for a row of zeros), exact times the E8M0 scale.
        let power = f64::from_bits((1023 + u64::from(e_min) - 8) << 52);
        steps[i] = e8m0_to_f64(scales[i][kb]) * power;
    }
    if _mm256_movemask_epi8(nan) != 0 {
        return false;
    }
    w.steps = steps;
    // Spans are at most 14: signed comparisons hold.
    let wide = _mm256_cmpgt_epi8(span, _mm256_set1_epi8(WORD_SPAN));
    w.whole = _mm256_movemask_epi8(wide) == 0;
    let pow_low = _mm256_broadcastsi128_si256(_mm_loadu_si128(POW_LOW.as_ptr().cast()));
    let pow_high = _mm256_broadcastsi128_si256(_mm_loadu_si128(POW_HIGH.as_ptr().cast()));
    if w.whole {
        let most = 255 - least_byte(_mm256_xor_si256(span, _mm256_set1_epi8(-1)));
        w.largest = 15 << most;
    }
    // `[d][h][i]`: row i's words from the byte unpacks `h` (`byte_words`): W itself (d = 0)
    // where whole, else its low byte (d = 0) and the rest (d = 1).
    let mut halves = [[[_mm256_setzero_ps(); HALF]; 2]; 2];
    for (i, r) in rows.iter().enumerate() {
        let (low, high) = (
            _mm256_shuffle_epi8(pow_low, r.shift),
            _mm256_shuffle_epi8(pow_high, r.shift),
        );
        // Words whose sign is the code's, never zero (`vpsignw` would zero the product).
        let signs = _mm256_or_si256(r.code, one);
        for h in 0..2 {
            let mantissa = byte_words(h, r.mantissa, zero);
            let signs = byte_words(h, signs, signs);
            if w.whole {
                // M · 2^s, below 15 · 2^11.
                let v = _mm256_mullo_epi16(mantissa, byte_words(h, low, high));
                halves[0][h][i] = _mm256_castsi256_ps(_mm256_sign_epi16(v, signs));
                continue;
            }
            // `M · 2^s` where s < 8 (below 2^11), else 0; its low byte, and the rest with
            // `M · 2^(s − 8)` where s ≥ 8.
            let below = _mm256_mullo_epi16(mantissa, byte_words(h, low, zero));
            let low_byte = _mm256_and_si256(below, _mm256_set1_epi16(0xFF));
            let rest = _mm256_add_epi16(
                _mm256_srli_epi16::<8>(below),
                _mm256_mullo_epi16(mantissa, byte_words(h, high, zero)),
            );
            halves[0][h][i] = _mm256_castsi256_ps(_mm256_sign_epi16(low_byte, signs));
            halves[1][h][i] = _mm256_castsi256_ps(_mm256_sign_epi16(rest, signs));
        }
    }
    let [first, second] = halves;
    if w.whole {
        place_pairs(&mut w.words, first);
    } else {
        place_pairs(&mut w.split[0], first);
        place_pairs(&mut w.split[1], second);
    }
    true
}

/// Bytes `a` (low) and `b` (high) interleaved into words: columns 0..8 and 16..24 for
/// `h = 0`, 8..16 and 24..32 for `h = 1` (unpacks work within 128-bit lanes).
#[inline(always)]
unsafe fn byte_words(h: usize, a: __m256i, b: __m256i) -> __m256i {
    if h == 0 {
        _mm256_unpacklo_epi8(a, b)
    } else {
        _mm256_unpackhi_epi8(a, b)
    }
}

/// Eight rows' words from the low (`halves[0]`) and high (`halves[1]`) byte unpacks
/// ([`byte_words`]), whose dword t holds the pair `t + 4h + 4 ⌊t / 4⌋`, as the vectors of
/// pairs, one row per lane.
#[inline(always)]
unsafe fn place_pairs(pairs: &mut [__m256i; PAIRS], halves: [[__m256; HALF]; 2]) {
    for (h, half) in halves.into_iter().enumerate() {
        for (t, column) in columns8(half).into_iter().enumerate() {
            pairs[t + 4 * h + 4 * (t / 4)] = _mm256_castps_si256(column);
        }
    }
}

/// The least of 32 unsigned bytes.
#[inline(always)]
unsafe fn least_byte(v: __m256i) -> u8 {
    let v = _mm_min_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    // Each word's low byte meets its high one (the shift's zeros leave the high byte 0).
    let v = _mm_min_epu8(v, _mm_srli_epi16::<8>(v));
    (_mm_cvtsi128_si32(_mm_minpos_epu16(v)) & 0xFF) as u8
}
