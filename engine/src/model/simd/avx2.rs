//! A decode (one input row) over release FP8/FP4 or container Q4G/Q8G weight rows with AVX2 alone
//! (MODEL.md §5.4): rule C1's block sums on FP8 eight rows a call, four a pass
//! ([`fp8_c1_run8`]; on nibbles they are taken in integers, `avx2_digits`) and rule C2's
//! chains sixteen rows at a time ([`c2_run16`]); over stored bf16 rows, rule C2's chains 32
//! rows at a time ([`dense_c2_run32`]).
//!
//! As in `avx512`, a weight's f64 is built, not converted: every e4m3 value times 2^−1016
//! ([`fp8_raw_bytes_of`]), every e2m1 value and every `nibble − 8` is an f64 whose low 48 bits
//! are zero, so two bytes per weight (made by byte arithmetic and 16-entry `vpshufb` lookups)
//! placed at bytes 6 and 7 of a 64-bit lane by one more `vpshufb` give four weights ready for a
//! multiply-add (a Q8G code has too many significant bits for that: it is placed at the bottom
//! of 2^52 instead). AVX2's byte shuffles stay inside 128-bit lanes, so in C1 the weights of
//! one vector are not four neighbouring columns; the input row is instead copied once per call
//! into that lane order ([`InputLanes`]), which is harmless because every product is exact and
//! so is any sum of them (the C1 argument in `linear`): the block sum is the portable kernel's
//! to the bit. The scale, the rounding to f32 and the f32 accumulation over blocks follow for
//! the eight rows as one vector, in the portable order. C2 cannot reorder a row's sum, so
//! there the rows are the lanes and each column one multiply-add per four rows, in increasing
//! k.

use super::super::quant::BLOCK;
pub use super::avx2_scales::Scales;
use super::avx2_scales::{with_block_scales, BlockScales};
use super::avx512::{dense_tile, RowStarts, E2M1_HIGH, E2M1_LOW, LOWERING_BACK, PREFETCH_AHEAD};
use super::vnni::block_integers;
use super::x86::columns8;
use std::arch::x86_64::*;
use std::ops::Range;

/// The stored code kinds the kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codes {
    /// e4m3, a byte per weight.
    Fp8,
    /// e2m1, two weights per byte (low nibble first).
    Fp4,
    /// Container Q4G: `nibble − 8`, two weights per byte (low nibble first).
    Q4,
    /// Container Q8G: a signed byte per weight.
    Q8,
}

impl Codes {
    /// Code bytes per 32-column block.
    fn block_bytes(self) -> usize {
        match self {
            Codes::Fp8 | Codes::Q8 => BLOCK,
            Codes::Fp4 | Codes::Q4 => BLOCK / 2,
        }
    }

    /// The power of two the kernels' products are short of (`avx512`'s lowering for e4m3).
    fn back(self) -> f64 {
        match self {
            Codes::Fp8 => LOWERING_BACK,
            Codes::Fp4 | Codes::Q4 | Codes::Q8 => 1.0,
        }
    }
}

/// `FP8_ORDER[p]`: the block column whose weight the FP8 C1 kernel puts at position p of a
/// block (four positions per vector, eight vectors). The two bytes of every weight are
/// interleaved by `vpunpck{l,h}bw`, which take columns 0..8 and 16..24 (low) or 8..16 and
/// 24..32 (high) into the two 128-bit lanes; placement j takes words 2j, 2j + 1 of each lane.
static FP8_ORDER: [usize; BLOCK] = {
    let mut order = [0; BLOCK];
    let mut p = 0;
    while p < BLOCK {
        let (half, j, e) = (p / 16, (p / 4) % 4, p % 4);
        order[p] = 8 * half + 16 * (e / 2) + 2 * j + e % 2;
        p += 1;
    }
    order
};

/// Asks for the rows' cache lines [`PREFETCH_AHEAD`] bytes past `at` (the loops outrun the
/// hardware prefetcher on weights streamed from memory), once per 64 bytes of a row: a block
/// of FP4 codes is a quarter of a line.
#[inline(always)]
pub(super) unsafe fn prefetch<const N: usize>(rows: &[&[u8]; N], at: usize) {
    // Rows of equal length: ahead in one, ahead in all.
    if at.is_multiple_of(64) && at + PREFETCH_AHEAD < rows[0].len() {
        for row in rows {
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(at + PREFETCH_AHEAD).cast());
        }
    }
}

/// A block's value, held until the next block's sums are made ([`LateTotal`]).
pub(super) trait LateBlock: Copy {
    /// The rows' f32 totals.
    type Totals: Copy;
    /// `totals` plus this block's values.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    unsafe fn add_to(self, totals: Self::Totals) -> Self::Totals;
}

/// The decode loops' f32 totals, each block's value added one block late: in program order
/// its reduction and rounding would wait on the sums just made, and this way they run beside
/// the next block's. The same additions in the same order.
pub(super) struct LateTotal<B: LateBlock> {
    totals: B::Totals,
    held: Option<B>,
}

impl<B: LateBlock> LateTotal<B> {
    pub(super) fn new(totals: B::Totals) -> Self {
        Self { totals, held: None }
    }

    /// Adds the held block's value and holds `block`.
    #[inline(always)]
    pub(super) unsafe fn add(&mut self, block: B) {
        if let Some(held) = self.held.replace(block) {
            self.totals = held.add_to(self.totals);
        }
    }

    /// The totals with the held block's value added.
    #[inline(always)]
    pub(super) unsafe fn finish(self) -> B::Totals {
        match self.held {
            Some(held) => held.add_to(self.totals),
            None => self.totals,
        }
    }
}

/// Four FP8 rows' lane sums of a block (short of [`LOWERING_BACK`]) and their scales: the
/// values `f32(P_i · scale_i)`.
#[derive(Clone, Copy)]
struct Fp8Block {
    sums: [__m256d; 4],
    scale: __m256d,
}

impl LateBlock for Fp8Block {
    type Totals = __m128;

    #[inline(always)]
    unsafe fn add_to(self, totals: __m128) -> __m128 {
        let back = _mm256_set1_pd(LOWERING_BACK);
        let values = _mm256_mul_pd(row_totals(self.sums), _mm256_mul_pd(self.scale, back));
        _mm_add_ps(totals, _mm256_cvtpd_ps(values))
    }
}

/// Low and high top bytes of the f64 of `nibble − 8` (container Q4G values), repeated in each
/// 128-bit lane for `vpshufb`.
static Q4_LOW: [u8; 64] = q4_top_bytes(0);
static Q4_HIGH: [u8; 64] = q4_top_bytes(8);

const fn q4_top_bytes(shift: u32) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let bits = ((i % 16) as f64 - 8.0).to_bits();
        // Four significant bits at most: the low 48 bits are zero.
        assert!(bits & 0xFFFF_FFFF_FFFF == 0);
        t[i] = ((bits >> 48) >> shift) as u8;
        i += 1;
    }
    t
}

/// An input row's full blocks in the FP8 C1 kernel's lane order (a per-thread buffer,
/// reused).
#[derive(Default)]
pub struct InputLanes(Vec<f64>);

impl InputLanes {
    /// The full blocks of `x` in [`FP8_ORDER`], times [`FP8_RAISE`]; `None` if a block is not
    /// act-quantised (`vnni::block_integers`), whose sums the lanes could not reorder exactly.
    pub fn fill(&mut self, x: &[f64]) -> Option<&[f64]> {
        self.0.clear();
        for xb in x.chunks_exact(BLOCK) {
            let xb: &[f64; BLOCK] = xb.try_into().expect("a block");
            block_integers(xb)?;
            self.0.extend(FP8_ORDER.iter().map(|&k| xb[k] * FP8_RAISE));
        }
        Some(&self.0)
    }
}

/// `PLACE[j]`: puts the words 2j and 2j + 1 of each 128-bit lane into bytes 6, 7 and 14, 15
/// (the top of the lane's two f64s), zeroing the rest.
static PLACE: [[u8; 32]; 4] = word_placement(6);

/// `PLACE_LOW[j]`: puts the same words into bytes 0, 1 and 8, 9 (the bottom of the lane's two
/// f64s), zeroing the rest.
static PLACE_LOW: [[u8; 32]; 4] = word_placement(0);

/// `vpshufb` indices putting the words 2j and 2j + 1 of each 128-bit lane at bytes `at`,
/// `at + 1` and `at + 8`, `at + 9` (table j), zeroing the rest.
const fn word_placement(at: usize) -> [[u8; 32]; 4] {
    let mut t = [[0x80u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut lane = 0;
        while lane < 2 {
            let base = 16 * lane + at;
            t[j][base] = (4 * j) as u8;
            t[j][base + 1] = (4 * j + 1) as u8;
            t[j][base + 8] = (4 * j + 2) as u8;
            t[j][base + 9] = (4 * j + 3) as u8;
            lane += 1;
        }
        j += 1;
    }
    t
}

/// C1 over the column blocks `blocks` of eight release FP8 weight rows, in order: `acc[i] +=
/// f32(P_i · 2^(scale_i − 127))` per block with `P_i` the exact block sum. `lanes` is the
/// input in [`InputLanes`] order (raised by [`FP8_RAISE`]), `rows[i]` and `scales[i]` row i's
/// codes and E8M0 bytes from block 0. Returns the first block it leaves (a scale [`Scales`]
/// does not take, a NaN code), else `blocks.end`; `acc` then has every block before it.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `lanes`, `rows` and `scales` must hold
/// `blocks.end` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fp8_c1_run8(
    acc: &mut [f32; 8],
    lanes: &[f64],
    rows: [&[u8]; 8],
    scales: Scales<8>,
    blocks: Range<usize>,
) -> usize {
    with_block_scales!(scales, blocks.clone(), |s| fp8_run8(
        acc, lanes, rows, s, blocks
    ))
}

/// [`fp8_c1_run8`] with its scales' reader: rows 0..4 over the blocks, then rows 4..8 as far
/// as the first four went. A pass over four rows keeps its words and chains in registers
/// (eight rows at a time spilled, and ran ~30% slower). The eight rows leave at one block: if
/// the second four leave earlier, the first four are redone from `acc` up to there (a NaN
/// code or a large scale: rare).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fp8_run8(
    acc: &mut [f32; 8],
    lanes: &[f64],
    rows: [&[u8]; 8],
    scales: impl BlockScales<8>,
    blocks: Range<usize>,
) -> usize {
    let start = *acc;
    let quad = |q: usize| {
        [
            rows[4 * q],
            rows[4 * q + 1],
            rows[4 * q + 2],
            rows[4 * q + 3],
        ]
    };
    let (low, high) = acc.split_at_mut(4);
    let low: &mut [f32; 4] = low.try_into().expect("four rows");
    let high: &mut [f32; 4] = high.try_into().expect("four rows");
    let stop = fp8_run4(low, lanes, quad(0), scales, 0, blocks.clone());
    let stop_high = fp8_run4(high, lanes, quad(1), scales, 1, blocks.start..stop);
    if stop_high < stop {
        low.copy_from_slice(&start[..4]);
        fp8_run4(low, lanes, quad(0), scales, 0, blocks.start..stop_high);
    }
    stop_high
}

/// [`fp8_c1_run8`] over the four rows `rows` (rows `4·quad ..` of the scales), returning the
/// first block they leave.
#[inline(always)]
unsafe fn fp8_run4(
    acc: &mut [f32; 4],
    lanes: &[f64],
    rows: [&[u8]; 4],
    scales: impl BlockScales<8>,
    quad: usize,
    blocks: Range<usize>,
) -> usize {
    let lanes = &lanes[..blocks.end * BLOCK];
    let rows = rows.map(|r| &r[..blocks.end * BLOCK]);
    let mut total = LateTotal::new(_mm_loadu_ps(acc.as_ptr()));
    let mut stop = blocks.end;
    for kb in blocks {
        let at = kb * BLOCK;
        prefetch(&rows, at);
        let Some([scale]) = scales.vectors::<1>(kb, |l| 4 * quad + l) else {
            stop = kb;
            break;
        };
        let xb: &[f64; BLOCK] = lanes[kb * BLOCK..][..BLOCK].try_into().expect("block");
        let mut doubled_max = _mm256_setzero_si256();
        let mut words = [[_mm256_setzero_si256(); 2]; 4];
        // Four rows' words, then their sums side by side: independent chains.
        for (row, w) in rows.iter().zip(words.iter_mut()) {
            let (low, high) = fp8_raw_bytes(row[at..].as_ptr());
            doubled_max = _mm256_max_epu8(doubled_max, low);
            *w = [
                _mm256_unpacklo_epi8(low, high),
                _mm256_unpackhi_epi8(low, high),
            ];
        }
        let sums = block_sums4(xb, &words);
        // 2·code is 0xFE exactly for the NaN codes 0x7F and 0xFF, and no byte is larger.
        let nan = _mm256_cmpeq_epi8(doubled_max, _mm256_set1_epi8(-2));
        if _mm256_movemask_epi8(nan) != 0 {
            stop = kb;
            break;
        }
        total.add(Fp8Block { sums, scale });
    }
    _mm_storeu_ps(acc.as_mut_ptr(), total.finish());
    stop
}

/// A 16-entry byte lookup (the table repeated in each 128-bit lane) of every byte of `index`.
#[inline(always)]
unsafe fn look_up(table: &[u8; 64], index: __m256i) -> __m256i {
    _mm256_shuffle_epi8(_mm256_loadu_si256(table.as_ptr().cast()), index)
}

/// What an input is multiplied by before it meets the raw FP8 weights of [`fp8_raw_bytes_of`]
/// (e4m3 · 2^−1016): 2^512, so that each product is the input times the weight times 2^−504,
/// exactly `avx512`'s lowered product (what [`LOWERING_BACK`] takes back). An f32 input times
/// 2^512 stays below 2^640, and a product stays above 2^−670: far from the f64 limits.
pub const FP8_RAISE: f64 = f64::from_bits((1023 + 512) << 52);

/// The top bytes of the f64s of a row's 32 e4m3 codes times 2^−1016 ([`fp8_raw_bytes_of`]).
#[inline(always)]
unsafe fn fp8_raw_bytes(codes: *const u8) -> (__m256i, __m256i) {
    fp8_raw_bytes_of(_mm256_loadu_si256(codes.cast()))
}

/// The top bytes of the f64s of 32 e4m3 codes times 2^−1016: `2·code` (the exponent's low
/// four bits and the mantissa; also what the NaN test reads) and `code & 0x80` (the sign). An
/// e4m3 code is an f64 with the exponent bias left out: exponent field e gives
/// (1 + m/8)·2^(e − 1023), e4m3's (1 + m/8)·2^(e − 7) times 2^−1016, and e = 0 gives the f64
/// subnormal (m/8)·2^−1022, e4m3's (m/8)·2^−6 times the same, so no code needs a fix-up.
/// (Subnormal inputs cost the multiply-adds nothing extra on the Zen 3 cores measured; the
/// bits never depend on it.)
#[inline(always)]
unsafe fn fp8_raw_bytes_of(c: __m256i) -> (__m256i, __m256i) {
    let doubled = _mm256_add_epi8(c, c);
    let sign = _mm256_and_si256(c, _mm256_set1_epi8(i8::MIN));
    (doubled, sign)
}

/// Four rows' `Σ_p lanes[p] · w[p]` over one block (four lanes of partial sums each), from
/// their weights' words (the top bytes interleaved by `vpunpck{l,h}bw`), placed into f64s in
/// [`InputLanes`] order. The rows' chains advance side by side.
#[inline(always)]
unsafe fn block_sums4(lanes: &[f64; BLOCK], words: &[[__m256i; 2]; 4]) -> [__m256d; 4] {
    // Each half in its own chains: eight chains of four steps.
    let mut sums = [[_mm256_setzero_pd(); 4]; 2];
    for (h, half) in sums.iter_mut().enumerate() {
        for (j, place) in PLACE.iter().enumerate() {
            let x = _mm256_loadu_pd(lanes[16 * h + 4 * j..].as_ptr());
            let place = _mm256_loadu_si256(place.as_ptr().cast());
            for (sum, w) in half.iter_mut().zip(words) {
                let weights = _mm256_castsi256_pd(_mm256_shuffle_epi8(w[h], place));
                *sum = _mm256_fmadd_pd(x, weights, *sum);
            }
        }
    }
    std::array::from_fn(|r| _mm256_add_pd(sums[0][r], sums[1][r]))
}

/// The four rows' totals of their lane sums, as one vector (exact, so in any order).
#[inline(always)]
unsafe fn row_totals(sums: [__m256d; 4]) -> __m256d {
    let (a, b) = (
        _mm256_hadd_pd(sums[0], sums[1]),
        _mm256_hadd_pd(sums[2], sums[3]),
    );
    _mm256_add_pd(
        _mm256_permute2f128_pd::<0x20>(a, b),
        _mm256_permute2f128_pd::<0x31>(a, b),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fp8_lane_order_is_a_permutation_of_a_block() {
        let mut seen = FP8_ORDER;
        seen.sort_unstable();
        assert_eq!(seen, std::array::from_fn::<usize, BLOCK, _>(|k| k));
    }
}

/// Rule C2 over the column blocks `blocks` of sixteen release weight rows, in order: each
/// row's f64 chain `acc = fma(x[k], w[k], acc)`, k increasing, with `w = code · 2^(scale −
/// 127)` exactly the table decoder's value. The rows are the lanes: a block's codes are
/// transposed by byte unpacks (rows 0..8 in the low 128-bit lanes, 8..16 in the high ones),
/// and chain vector j holds rows 2j, 2j + 1, 8 + 2j, 9 + 2j ([`c2_row_of_lane`]). FP8 weights
/// are built raw and the input raised as in [`fp8_c1_run8`]; the power the products are short
/// of and the scales are taken out of the chains for the block instead (see the loop), other
/// scales go onto each weight.
/// Each product is exact, so the fused multiply-add rounds as the portable `acc + x · w`
/// does. Returns the first block it leaves (a scale [`Scales`] does not take, a NaN code),
/// else `blocks.end`; `acc` then holds every block before it.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x`, `rows` and `scales` must hold `blocks.end`
/// blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn c2_run16(
    codes: Codes,
    acc: &mut [f64; 16],
    x: &[f64],
    rows: [&[u8]; 16],
    scales: Scales<16>,
    blocks: Range<usize>,
) -> usize {
    with_block_scales!(scales, blocks.clone(), |s| c2_run16_with(
        codes, acc, x, rows, s, blocks
    ))
}

/// [`c2_run16`] with its scales' reader.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn c2_run16_with<S: BlockScales<16>>(
    codes: Codes,
    acc: &mut [f64; 16],
    x: &[f64],
    rows: [&[u8]; 16],
    scales: S,
    blocks: Range<usize>,
) -> usize {
    let block_bytes = codes.block_bytes();
    let back = _mm256_set1_pd(codes.back());
    let x = &x[..blocks.end * BLOCK];
    let rows = rows.map(|r| &r[..blocks.end * block_bytes]);
    let mut chains: [__m256d; 4] = std::array::from_fn(|j| {
        let r = c2_row_of_lane(4 * j);
        _mm256_setr_pd(acc[r], acc[r + 1], acc[r + 8], acc[r + 9])
    });
    // Every block overwrites all of `columns` it reads, all of `words` and of `raised`: made
    // once per call (zero-filling 1 KiB per block was ~6% of a decode).
    let mut columns = [[_mm256_setzero_si256(); 8]; 2];
    let mut words = [_mm256_setzero_si256(); BLOCK];
    let mut raised = [0f64; BLOCK];
    let placement = match codes {
        Codes::Q8 => Placement::Low,
        Codes::Fp8 | Codes::Fp4 | Codes::Q4 => Placement::Top,
    };
    let mut stop = blocks.end;
    for kb in blocks {
        let at = kb * block_bytes;
        prefetch(&rows, at);
        let Some(factor) = scales.vectors::<4>(kb, c2_row_of_lane) else {
            stop = kb;
            break;
        };
        let factor = factor.map(|f| _mm256_mul_pd(f, back));
        // Sixteen bytes of each row per half block (FP8: columns 16h ..; FP4: 32 columns).
        for (h, half) in columns.iter_mut().enumerate().take(block_bytes / 16) {
            let loaded: [__m256i; 8] = std::array::from_fn(|i| {
                let lo = rows[i][at + 16 * h..].as_ptr();
                let hi = rows[i + 8][at + 16 * h..].as_ptr();
                _mm256_loadu2_m128i(hi.cast(), lo.cast())
            });
            *half = super::x86::transpose_8x32(loaded);
        }
        // Every column's weights first (a NaN code leaves the block untouched).
        let mut doubled_max = _mm256_setzero_si256();
        match codes {
            Codes::Fp8 => {
                for (n, pair) in columns.iter().flatten().enumerate() {
                    // `pair`: columns 16h + 2q and 16h + 2q + 1 (n = 8h + q).
                    let (low, high) = fp8_raw_bytes_of(*pair);
                    doubled_max = _mm256_max_epu8(doubled_max, low);
                    words[2 * n] = _mm256_unpacklo_epi8(low, high);
                    words[2 * n + 1] = _mm256_unpackhi_epi8(low, high);
                }
            }
            Codes::Q8 => {
                // Seven significant bits do not fit a top word: each code goes to the low word
                // as `code + 128`, made an f64 below (`Placement::Low`).
                let bias = _mm256_set1_epi8(i8::MIN);
                for (n, pair) in columns.iter().flatten().enumerate() {
                    let biased = _mm256_xor_si256(*pair, bias);
                    words[2 * n] = _mm256_unpacklo_epi8(biased, _mm256_setzero_si256());
                    words[2 * n + 1] = _mm256_unpackhi_epi8(biased, _mm256_setzero_si256());
                }
            }
            Codes::Fp4 | Codes::Q4 => {
                let (low_table, high_table) = match codes {
                    Codes::Q4 => (&Q4_LOW, &Q4_HIGH),
                    _ => (&E2M1_LOW, &E2M1_HIGH),
                };
                for (q, pair) in columns[0].iter().enumerate() {
                    // `pair`: bytes 2q and 2q + 1, i.e. columns 4q .. 4q + 4.
                    let low = _mm256_and_si256(*pair, _mm256_set1_epi8(0x0F));
                    let high =
                        _mm256_and_si256(_mm256_srli_epi16::<4>(*pair), _mm256_set1_epi8(0x0F));
                    let (l0, l1) = (look_up(low_table, low), look_up(high_table, low));
                    let (h0, h1) = (look_up(low_table, high), look_up(high_table, high));
                    words[4 * q] = _mm256_unpacklo_epi8(l0, l1);
                    words[4 * q + 1] = _mm256_unpacklo_epi8(h0, h1);
                    words[4 * q + 2] = _mm256_unpackhi_epi8(l0, l1);
                    words[4 * q + 3] = _mm256_unpackhi_epi8(h0, h1);
                }
            }
        }
        let nan = _mm256_cmpeq_epi8(doubled_max, _mm256_set1_epi8(-2));
        if _mm256_movemask_epi8(nan) != 0 {
            stop = kb;
            break;
        }
        let mut xb: &[f64; BLOCK] = x[kb * BLOCK..][..BLOCK].try_into().expect("block");
        if codes == Codes::Fp8 {
            // Raw FP8 weights meet a raised input. The factor is a constant here: a vector
            // of it held through the loop took a register the chains then lost to the stack
            // (the f16-scale path ran ~1.8x slower). A loop of intrinsics: `map`'s closure
            // was not inlined.
            let raise = _mm256_set1_pd(FP8_RAISE);
            for (to, from) in raised.chunks_exact_mut(4).zip(xb.chunks_exact(4)) {
                let v = _mm256_mul_pd(_mm256_loadu_pd(from.as_ptr()), raise);
                _mm256_storeu_pd(to.as_mut_ptr(), v);
            }
            xb = &raised;
        }
        if S::POWERS_OF_TWO {
            // The chains run divided by their rows' factors for the block, so that the
            // weights multiply the input as built; powers of two, far from the f64 limits
            // (every chain value is a sum of products of f32 values with scales above
            // 2^−128), so the division, the multiply-adds' roundings and the multiplication
            // back are exact images of the unscaled ones.
            for (chain, f) in chains.iter_mut().zip(factor) {
                *chain = _mm256_div_pd(*chain, f);
            }
            chains = column_steps(chains, &words, placement, xb, None);
            for (chain, f) in chains.iter_mut().zip(factor) {
                *chain = _mm256_mul_pd(*chain, f);
            }
        } else {
            // Other scales go onto each weight (a product of a few bits and an f16: exact).
            chains = column_steps(chains, &words, placement, xb, Some(factor));
        }
    }
    for (j, chain) in chains.into_iter().enumerate() {
        let mut lanes = [0f64; 4];
        _mm256_storeu_pd(lanes.as_mut_ptr(), chain);
        for (l, v) in lanes.into_iter().enumerate() {
            acc[c2_row_of_lane(4 * j + l)] = v;
        }
    }
    stop
}

/// How a column's words become its weights' f64s.
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    /// The word is the top of the f64 ([`PLACE`]).
    Top,
    /// The word is `code + 128` for a Q8G code: put at the bottom of `2^52` (exact below
    /// 2^52) and `2^52 + 128` taken back, exactly.
    Low,
}

/// [`c2_run16`]'s chains advanced over one block: column k's sixteen weights (`words[k]`,
/// rows 0..8 in the low 128-bit lane, 8..16 in the high one) placed into the four chain
/// vectors (times the chain vectors' `factors`, if given), each one multiply-add by `x[k]`.
#[inline(always)]
unsafe fn column_steps(
    chains: [__m256d; 4],
    words: &[__m256i; BLOCK],
    placement: Placement,
    x: &[f64; BLOCK],
    factors: Option<[__m256d; 4]>,
) -> [__m256d; 4] {
    // A loop per placement: with the choice inside the loop, both forms' constants stayed
    // live and the f16-scale path's chains went to the stack (~1.8x slower).
    match placement {
        Placement::Top => placed_steps(chains, words, Placement::Top, x, factors),
        Placement::Low => placed_steps(chains, words, Placement::Low, x, factors),
    }
}

/// [`column_steps`] with `placement` a constant once inlined.
#[inline(always)]
unsafe fn placed_steps(
    mut chains: [__m256d; 4],
    words: &[__m256i; BLOCK],
    placement: Placement,
    x: &[f64; BLOCK],
    factors: Option<[__m256d; 4]>,
) -> [__m256d; 4] {
    let two_52 = _mm256_set1_pd(4_503_599_627_370_496.0);
    let biased_zero = _mm256_set1_pd(4_503_599_627_370_496.0 + 128.0);
    for (w, &xk) in words.iter().zip(x) {
        let xk = _mm256_set1_pd(xk);
        for (j, chain) in chains.iter_mut().enumerate() {
            let mut weights = if placement == Placement::Top {
                let place = _mm256_loadu_si256(PLACE[j].as_ptr().cast());
                _mm256_castsi256_pd(_mm256_shuffle_epi8(*w, place))
            } else {
                let place = _mm256_loadu_si256(PLACE_LOW[j].as_ptr().cast());
                let low = _mm256_shuffle_epi8(*w, place);
                let biased = _mm256_or_pd(_mm256_castsi256_pd(low), two_52);
                _mm256_sub_pd(biased, biased_zero)
            };
            if let Some(f) = factors {
                weights = _mm256_mul_pd(weights, f[j]);
            }
            *chain = _mm256_fmadd_pd(xk, weights, *chain);
        }
    }
    chains
}

/// Rule C2 over the column blocks `blocks` of 32 stored bf16 rows (little-endian, from column
/// 0, as `x`), in order: row i's f64 chain `acc[i] = fma(x[k], w[k], acc[i])`, k
/// increasing, with `w` the value the row decoder gives (`avx512::dense_tile`'s widening).
/// The rows are the lanes of eight chain vectors (rows `4j .. 4j + 4`); each 8×8 tile of a
/// group of eight rows is transposed in registers and each column widened to f64. The product
/// of an f32 input and a bf16 or f32 weight is exact, so the fused multiply-add rounds as the
/// portable `acc + x · w` does. Every cache line of a block is asked for
/// [`PREFETCH_AHEAD`] bytes ahead in each row: 32 rows walked at once are more streams than
/// the hardware prefetcher follows.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x` and the rows must hold `blocks.end` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dense_c2_run32(
    acc: &mut [f64; 32],
    x: &[f64],
    rows: &[&[u8]; 32],
    blocks: Range<usize>,
) {
    // Stored f32 rows stay in eight-row tasks (`MatVec::dense_view`).
    let block_bytes = 2 * BLOCK;
    let x = &x[..blocks.end * BLOCK];
    let rows = RowStarts::new(rows, blocks.end * block_bytes);
    let mut chains = [_mm256_setzero_pd(); 8];
    for (j, chain) in chains.iter_mut().enumerate() {
        *chain = _mm256_loadu_pd(acc[4 * j..].as_ptr());
    }
    for kb in blocks {
        let at = kb * block_bytes;
        for line in (at..at + block_bytes).step_by(64) {
            rows.prefetch(line);
        }
        // Two groups of eight rows at a time: four chains per column, each group's tile
        // transposed once.
        for pair in 0..2 {
            let (g0, g1) = (2 * pair, 2 * pair + 1);
            for tile in 0..BLOCK / 8 {
                let xt = &x[kb * BLOCK + 8 * tile..][..8];
                let a = columns8(dense_tile(&rows, g0, at, tile, true));
                let b = columns8(dense_tile(&rows, g1, at, tile, true));
                for (c, &xc) in xt.iter().enumerate() {
                    let xc = _mm256_set1_pd(xc);
                    for (g, column) in [(g0, a[c]), (g1, b[c])] {
                        let low = _mm256_cvtps_pd(_mm256_castps256_ps128(column));
                        let high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(column));
                        chains[2 * g] = _mm256_fmadd_pd(xc, low, chains[2 * g]);
                        chains[2 * g + 1] = _mm256_fmadd_pd(xc, high, chains[2 * g + 1]);
                    }
                }
            }
        }
    }
    for (j, chain) in chains.into_iter().enumerate() {
        _mm256_storeu_pd(acc[4 * j..].as_mut_ptr(), chain);
    }
}

/// The row of [`c2_run16`]'s chain lane `l` (lane `l % 4` of chain vector `l / 4`).
pub const fn c2_row_of_lane(l: usize) -> usize {
    let (j, lane) = (l / 4, l % 4);
    2 * j + lane % 2 + 8 * (lane / 2)
}
