//! Eight weight rows at once with AVX-512 (F, BW, VL, VBMI): rule C1's block sums and rule
//! C2's chains (MODEL.md §5.4).
//!
//! Every e4m3 and e2m1 value is an f64 that is zero below bit 48 (`dtype::E4M3_F64_TOP`), so a
//! weight's f64 is built from two byte lookups (`vpermi2b` over a 128-entry table, `vpshufb`
//! over 16 entries) placed into the top two bytes of a 64-bit lane by one more byte permute: no
//! conversion instruction per weight. (The FP8 decode kernels, the largest, make their top
//! bytes by arithmetic instead, at another power-of-two scale: see `lowered_top_bytes`.) Each
//! row's block is then eight f64 multiply-adds, and the eight rows' lane sums are added in one
//! transposing reduction. Every product is exact and so is any sum of them (the C1 argument of
//! MODEL.md §5.4 in `linear`), so the result is the portable kernel's block sum to the bit; the
//! scale, the rounding to f32 and the f32 accumulation over blocks are then done for the eight
//! rows as one vector, in the same order.
//!
//! Rule C2 (one f64 chain per row, k increasing) cannot reorder a row's sum, so its kernels
//! put the rows in the lanes instead: eight rows' codes are transposed by byte permutes into
//! columns, and each column is one vector multiply-add advancing the eight chains. Container
//! int8 / nibble codes are widened to f64 per column; decoded f32 rows (VQ vectors, bf16 and
//! f32 weights) are transposed eight by eight.

use super::super::quant::BLOCK;
use super::x86::{bf16_values, columns8};
use crate::dtype::{e8m0_to_f64, E2M1_F64_TOP, E4M3_F64_TOP};
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes 6 and 7 of every 64-bit lane: where the two table bytes of a value go.
const TOP_BYTES: __mmask64 = 0xC0C0_C0C0_C0C0_C0C0;

/// [`TOP_BYTES`] hidden from the optimiser, taken once per kernel call: with the constant in
/// sight LLVM turns each zero-masked byte permute into a permute and an `and` (an extra
/// micro-op per eight weights, measured).
#[inline(always)]
fn top_bytes_mask() -> __mmask64 {
    std::hint::black_box(TOP_BYTES)
}

/// `PLACE[g]`: byte permute putting bytes `8g .. 8g + 8` of the low-byte table (first source)
/// and the high-byte table (second source) into bytes 6 and 7 of lanes 0..8.
static PLACE: [[u8; 64]; 8] = placements(64);

/// Byte permutes putting value `8g + j`'s low byte (at `8g + j`) and high byte (at
/// `high + 8g + j`) into bytes 6 and 7 of lane j, for each group g of eight values.
const fn placements<const GROUPS: usize>(high: usize) -> [[u8; 64]; GROUPS] {
    let mut t = [[0u8; 64]; GROUPS];
    let mut g = 0;
    while g < GROUPS {
        let mut j = 0;
        while j < 8 {
            t[g][8 * j + 6] = (8 * g + j) as u8;
            t[g][8 * j + 7] = (high + 8 * g + j) as u8;
            j += 1;
        }
        g += 1;
    }
    t
}

/// Low and high bytes of `E4M3_F64_TOP` (sign bit clear: the code's own sign is or-ed in).
static E4M3_LOW: [u8; 128] = top_bytes(0);
static E4M3_HIGH: [u8; 128] = top_bytes(8);

const fn top_bytes(shift: u32) -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut c = 0;
    while c < 128 {
        t[c] = (E4M3_F64_TOP[c] >> shift) as u8;
        c += 1;
    }
    t
}

/// Low and high bytes of `E2M1_F64_TOP`, repeated in each 128-bit lane for `vpshufb`.
pub(super) static E2M1_LOW: [u8; 64] = nibble_bytes(0);
pub(super) static E2M1_HIGH: [u8; 64] = nibble_bytes(8);

const fn nibble_bytes(shift: u32) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = (E2M1_F64_TOP[i % 16] >> shift) as u8;
        i += 1;
    }
    t
}

/// One C1 step of eight FP8 rows over one full block: `acc[i] += f32(P_i · scale[i])` with
/// `P_i = Σ_k x[k] · e4m3(rows[i][k])` exact. `false`, nothing changed, if a code is NaN (left
/// to the table path). The scales must not overflow f32 with any code (`SAFE_SCALE_BYTE` in
/// `matvec`).
///
/// No 128-entry table and no two-source permute (three micro-ops each on Intel cores): the
/// weights are made by arithmetic as their e4m3 values times 2^−504 (`lowered_top_bytes`),
/// a row's 32 codes as one 64-byte source placed by one-source byte permutes. Every product
/// `x·w·2^−504` of an act-quantised input is a normal f64 (above 2^−670), so exact, as is any
/// sum of them (the C1 argument); the block sums are brought back by 2^504 with the scale,
/// exactly.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VBMI (and AVX2, FMA).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp8_c1_block8(
    acc: &mut [f32; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
) -> bool {
    let Some(sums) = fp8_block_sums(x, rows, PlaceMasks::new()) else {
        return false;
    };
    let scale = _mm512_loadu_pd(scale.as_ptr());
    accumulate(
        acc,
        sums,
        _mm512_mul_pd(scale, _mm512_set1_pd(LOWERING_BACK)),
    );
    true
}

/// [`fp8_c1_block8`] over the column blocks `blocks` of eight FP8 rows, in order (`x` and
/// `rows[i]` from column 0): one loop with the sums and the constants in registers. Returns
/// the first block it leaves (a NaN code, a scale above the limit), else `blocks.end`; `acc`
/// has every block before it.
///
/// # Safety
/// As for [`fp8_c1_block8`]; `x` and the rows must hold `blocks.end` full blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp8_c1_run8(
    acc: &mut [f32; 8],
    x: &[f64],
    rows: [&[u8]; 8],
    scales: RowScales,
    blocks: Range<usize>,
) -> usize {
    let (masks, back) = (PlaceMasks::new(), _mm512_set1_pd(LOWERING_BACK));
    let x = &x[..blocks.end * BLOCK];
    let rows = RowStarts::new(&rows, blocks.end * BLOCK);
    let mut total = _mm256_loadu_ps(acc.as_ptr());
    let mut stop = blocks.end;
    for kb in blocks {
        let at = kb * BLOCK;
        rows.prefetch(at);
        let xb = x[at..at + BLOCK].try_into().expect("block");
        let rb = rows.group(0, at);
        let (Some(scale), Some(sums)) = (scales.block(kb), fp8_block_sums(xb, rb, masks)) else {
            stop = kb;
            break;
        };
        total = _mm256_add_ps(total, block_values(sums, _mm512_mul_pd(scale, back)));
    }
    _mm256_storeu_ps(acc.as_mut_ptr(), total);
    stop
}

/// Bytes ahead of the one in use at which the decode loops (C1 here and in `vnni`, C2 in
/// `matvec`) ask for a row's next cache line: the kernels outrun the hardware prefetcher on
/// weights streamed from memory (FP4 ~5%, FP8 ~4% of a `wide` decode).
pub const PREFETCH_AHEAD: usize = 256;

/// E8M0 scale bytes of eight release weight rows (from column block 0), and the largest byte
/// the kernels take (one whose products with every code stay finite in f32).
#[derive(Clone, Copy)]
pub struct RowScales<'a> {
    pub bytes: ScaleBytes<'a>,
    pub limit: u8,
}

/// Where [`RowScales`] come from.
#[derive(Clone, Copy)]
pub enum ScaleBytes<'a> {
    /// One byte per column block for all eight rows (FP8: 32 × 32 blocks).
    Shared(&'a [u8]),
    /// One byte per column block and row (FP4).
    PerRow([&'a [u8]; 8]),
}

impl RowScales<'_> {
    /// Column block `kb`'s eight scales as f64, `None` if one is above the limit.
    #[inline(always)]
    pub(super) unsafe fn block(&self, kb: usize) -> Option<__m512d> {
        let bytes = match self.bytes {
            ScaleBytes::Shared(s) => {
                let b = s[kb];
                return (b <= self.limit).then(|| _mm512_set1_pd(e8m0_to_f64(b)));
            }
            // Written out: through `array::map`, an out-of-line call per block.
            ScaleBytes::PerRow(s) => u64::from_le_bytes([
                s[0][kb], s[1][kb], s[2][kb], s[3][kb], s[4][kb], s[5][kb], s[6][kb], s[7][kb],
            ]),
        };
        let b = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(bytes as i64));
        if _mm512_cmpgt_epu64_mask(b, _mm512_set1_epi64(i64::from(self.limit))) != 0 {
            return None;
        }
        // 2^(b − 127), as `e8m0_to_f64`.
        let biased = _mm512_add_epi64(b, _mm512_set1_epi64(1023 - 127));
        Some(_mm512_castsi512_pd(_mm512_slli_epi64::<52>(biased)))
    }
}

/// The byte masks of the placements ([`top_bytes_mask`]) and of [`fp8_block_sums`]' high half,
/// taken once per kernel call or loop.
#[derive(Clone, Copy)]
struct PlaceMasks {
    top_bytes: __mmask64,
    high_half: __mmask8,
}

impl PlaceMasks {
    #[inline(always)]
    fn new() -> PlaceMasks {
        // Hidden for the same reason as `top_bytes_mask`: in sight, the masked `and` becomes an
        // `and` and a lane shuffle.
        PlaceMasks {
            top_bytes: top_bytes_mask(),
            high_half: std::hint::black_box(0xF0),
        }
    }
}

/// The body of [`fp8_c1_block8`]: the eight rows' lane sums of `x · w · 2^−504`, `None` if a
/// code is NaN. Inlined into the kernels, which have the target features.
#[inline(always)]
unsafe fn fp8_block_sums(
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK]; 8],
    masks: PlaceMasks,
) -> Option<[__m512d; 8]> {
    let halves = load(&LOWERED_FIX_HALVES);
    let (sign, fifteen) = (_mm512_set1_epi8(i8::MIN), _mm512_set1_epi8(15));
    let mut doubled_max = _mm512_setzero_si512();
    // A loop, not `array::from_fn`: a closure is compiled without the caller's target
    // features, and left out of line its intrinsics became calls (20x slower, measured).
    let mut tops = [_mm512_setzero_si512(); 8];
    for (top, row) in tops.iter_mut().zip(rows) {
        // The row's 32 codes in both halves: bytes 0..32 become their low top bytes,
        // 32..64 their high ones (`lowered_top_bytes`, one lookup for both halves).
        let both = _mm512_broadcast_i64x4(_mm256_loadu_si256(row.as_ptr().cast()));
        let doubled = _mm512_add_epi8(both, both);
        doubled_max = _mm512_max_epu8(doubled_max, doubled);
        let base = _mm512_mask_and_epi64(doubled, masks.high_half, both, sign);
        let fix = _mm512_shuffle_epi8(halves, _mm512_min_epu8(doubled, fifteen));
        *top = _mm512_xor_si512(base, fix);
    }
    if has_nan(doubled_max) {
        return None;
    }
    let mut sums = [_mm512_setzero_pd(); 8];
    for (row, top) in tops.into_iter().enumerate() {
        for g in 0..4 {
            let xg = _mm512_loadu_pd(x[8 * g..].as_ptr());
            let w = _mm512_maskz_permutexvar_epi8(masks.top_bytes, load(&PLACE_ONE[g]), top);
            sums[row] = _mm512_fmadd_pd(xg, _mm512_castsi512_pd(w), sums[row]);
        }
    }
    Some(sums)
}

/// The two top bytes of the f64s equal to 64 e4m3 codes' values times 2^−504 (the rest of
/// each f64 is zero), and `2·code`. For a normal code (exponent E ≥ 1, mantissa m) the f64
/// has exponent field E + 1016 − 504 and the same mantissa: its top bytes are `2·code` (the
/// sign shifted out) and `(code & 0x80) | 0x20`. The eight subnormal magnitudes, which the
/// scaling makes normal (a subnormal f64 input costs an assist per multiply-add on Intel
/// cores), and the 0x20 come from a 16-entry fix-up looked up by `min(2·code, 15)`: 0..=14
/// exactly for the subnormal codes, 15 for all others.
#[inline(always)]
unsafe fn lowered_top_bytes(codes: __m512i) -> (__m512i, __m512i, __m512i) {
    let doubled = _mm512_add_epi8(codes, codes);
    let index = _mm512_min_epu8(doubled, _mm512_set1_epi8(15));
    let low = _mm512_xor_si512(doubled, _mm512_shuffle_epi8(load(&LOWERED_FIX_LOW), index));
    // (codes & 0x80) ^ fix: ternary-logic table of (a & b) ^ c.
    let high = _mm512_ternarylogic_epi32::<0x6A>(
        codes,
        _mm512_set1_epi8(i8::MIN),
        _mm512_shuffle_epi8(load(&LOWERED_FIX_HIGH), index),
    );
    (low, high, doubled)
}

/// Whether bytes `2·code` (maximum over several) hold a NaN code: 2·code is 0xFE exactly for
/// 0x7F and 0xFF, and no byte is larger.
#[inline(always)]
unsafe fn has_nan(doubled_max: __m512i) -> bool {
    _mm512_cmpeq_epi8_mask(doubled_max, _mm512_set1_epi8(-2)) != 0
}

/// The e4m3 value of each code's low seven bits times 2^−504, as an f64's top 16 bits (checked
/// at compile time to leave the low 48 bits zero, and to be the arithmetic of
/// `lowered_top_bytes` for every normal code).
const E4M3_LOWERED: [u16; 128] = {
    let mut t = [0u16; 128];
    let mut c = 0;
    while c < 128 {
        if c != 0x7F {
            let value = f64::from_bits((E4M3_F64_TOP[c] as u64) << 48);
            let bits = (value / LOWERING_BACK).to_bits();
            assert!(bits & 0xFFFF_FFFF_FFFF == 0);
            t[c] = (bits >> 48) as u16;
            // Exponent field E + 1016 − LOWERING: `2·code` plus that offset's top-16 bits.
            assert!(c < 8 || t[c] == ((c as u16) << 1) + (((1016 - LOWERING) as u16) << 4));
        }
        c += 1;
    }
    t
};

/// log2 of the factor the lowered weights are short of: 504, so that the normal codes' top
/// bytes are `2·code` and `(code & 0x80) | 0x20` (an exponent offset of 512 − 8).
const LOWERING: i32 = 504;
/// 2^[`LOWERING`]: what the products of [`E4M3_LOWERED`] weights are short of.
pub(super) const LOWERING_BACK: f64 = f64::from_bits(((1023 + LOWERING) as u64) << 52);

/// The exponents by which C2 chains run divided, exactly: each row's power-of-two scale's
/// and [`LOWERING`]'s (see [`fp8_c2_block8`]).
#[inline(always)]
unsafe fn lowered_exponents(scale: __m512d) -> __m512d {
    _mm512_add_pd(_mm512_getexp_pd(scale), _mm512_set1_pd(f64::from(LOWERING)))
}

/// The fix-up tables of `lowered_top_bytes` (16 entries, repeated in each 128-bit lane):
/// what to flip in `2·code` and in `code & 0x80`. Entry `2m` is the subnormal magnitude m,
/// entry 15 any normal code. `HALVES`: the low table in lanes 0 and 1, the high one in 2 and
/// 3, for a row's codes in both halves of a vector.
static LOWERED_FIX_LOW: [u8; 64] = lowered_fixes(false);
static LOWERED_FIX_HIGH: [u8; 64] = lowered_fixes(true);
static LOWERED_FIX_HALVES: [u8; 64] = {
    let mut t = LOWERED_FIX_LOW;
    let mut i = 32;
    while i < 64 {
        t[i] = LOWERED_FIX_HIGH[i];
        i += 1;
    }
    t
};

const fn lowered_fixes(high: bool) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let entry = i % 16;
        // Entry 15 stands for code 8 (any normal code: its low byte is 2·code already);
        // odd entries below 15 are never looked up.
        let (code, doubled) = match entry {
            15 => (8, 16u16),
            e if e % 2 == 0 => (e / 2, e as u16),
            _ => (0, 0),
        };
        let want = E4M3_LOWERED[code];
        t[i] = if high {
            (want >> 8) as u8
        } else {
            ((want ^ doubled) & 0xFF) as u8
        };
        if entry % 2 == 1 && entry != 15 {
            t[i] = 0;
        }
        i += 1;
    }
    t
}

/// `PLACE_ONE[g]`: byte permute from one source holding 32 values' low top bytes, then their
/// high ones (a row's 32 codes, or four columns of eight rows), putting values `8g .. 8g + 8`'
/// two bytes into bytes 6 and 7 of lanes 0..8.
static PLACE_ONE: [[u8; 64]; 4] = placements(32);

/// [`fp8_c1_block8`] for eight rows of packed FP4 (16 bytes each, low nibble first).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp4_c1_block8(
    acc: &mut [f32; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
) {
    let (mut sums, top_bytes) = ([_mm512_setzero_pd(); 8], top_bytes_mask());
    for quad in 0..2 {
        // Rows 4·quad .. 4·quad + 4, one per 128-bit lane.
        let c = lanes4(std::array::from_fn(|r| rows[4 * quad + r]));
        let (first, second) = nibble_elements(c, 0);
        for (half, codes) in [first, second].into_iter().enumerate() {
            let (lo, hi) = e2m1_top_bytes(codes);
            for g in 0..8 {
                // Lane g / 2 (a row), elements 16·half + 8·(g % 2) ..
                let row = 4 * quad + g / 2;
                let k = 16 * half + 8 * (g % 2);
                let w = place(lo, hi, g, top_bytes);
                sums[row] = _mm512_fmadd_pd(_mm512_loadu_pd(x[k..].as_ptr()), w, sums[row]);
            }
        }
    }
    accumulate(acc, sums, _mm512_loadu_pd(scale.as_ptr()));
}

/// `TRANSPOSE[h]`: byte permute from two vectors of four rows' 16 codes each (rows 0..4 in
/// the first, 4..8 in the second, one row per 128-bit lane) to columns `8h .. 8h + 8` of the
/// 16, each column's eight rows adjacent: output byte `8g + r` is row r, column `8h + g`.
static TRANSPOSE: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let mut h = 0;
    while h < 2 {
        let mut g = 0;
        while g < 8 {
            let mut r = 0;
            while r < 8 {
                let column = 8 * h + g;
                t[h][8 * g + r] = if r < 4 {
                    16 * r + column
                } else {
                    64 + 16 * (r - 4) + column
                } as u8;
                r += 1;
            }
            g += 1;
        }
        h += 1;
    }
    t
};

/// One C2 step of eight FP8 rows over one full block: for k increasing,
/// `acc[i] = fma(x[k], code[i][k] · scale[i], acc[i])`, the rows being the lanes. The product
/// is exact, so this is the portable chain to the bit. `false`, nothing changed, if a code is
/// NaN. The scales must not overflow f32 with any code.
///
/// Each row's scale is a power of two, so the block runs on the chain divided by it and by
/// 2^504 (exact) and multiplies back once: rounding commutes with a power-of-two scale
/// wherever neither side is subnormal or overflows, and with f32 inputs (the kernels' `x`)
/// every term and every chain is a multiple of 2^−285 below 2^400, so after the scalings a
/// multiple of 2^−907 below 2^24 (an f32 is a multiple of 2^−149, a code of 2^−9, a scale of
/// 2^−127 to 2^118). The weights are then `lowered_top_bytes`' f64s, placed by one-source
/// byte permutes.
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp8_c2_block8(
    acc: &mut [f64; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
) -> bool {
    let (sources, top_bytes) = (byte_halves(rows), top_bytes_mask());
    let e = lowered_exponents(_mm512_loadu_pd(scale.as_ptr()));
    let mut chain = _mm512_scalef_pd(
        _mm512_loadu_pd(acc.as_ptr()),
        _mm512_sub_pd(_mm512_setzero_pd(), e),
    );
    let mut doubled_max = _mm512_setzero_si512();
    for q in 0..4 {
        let (low, high, doubled) = lowered_top_bytes(columns(sources, q));
        doubled_max = _mm512_max_epu8(doubled_max, doubled);
        chain = chains8(chain, &x[8 * q..8 * q + 8], low, high, top_bytes);
    }
    if has_nan(doubled_max) {
        return false;
    }
    _mm512_storeu_pd(acc.as_mut_ptr(), _mm512_scalef_pd(chain, e));
    true
}

/// [`fp8_c2_block8`] for 32 rows (four groups of eight, one chain vector each) over the
/// column blocks `blocks`, in order (`x` and `rows[i]` from column 0), the four chains
/// advanced column by column in turn: one chain waits for each multiply-add, four hide most
/// of that, and the chains stay in registers from block to block. The 32 rows share one
/// scale byte per block (`scales`, shared bytes: FP8 32 × 32 blocks, rows aligned). Returns
/// the first block it leaves (a NaN code, a scale above the limit), else `blocks.end`; `acc`
/// has every block before it.
///
/// # Safety
/// As for [`fp8_c1_block8`]; `x`, the rows and `scales` must hold `blocks.end` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp8_c2_run32(
    acc: &mut [f64; 32],
    x: &[f64],
    rows: &[&[u8]; 32],
    scales: RowScales,
    blocks: Range<usize>,
) -> usize {
    let top_bytes = top_bytes_mask();
    let x = &x[..blocks.end * BLOCK];
    let rows = RowStarts::new(rows, blocks.end * BLOCK);
    let mut chains = load_chains(acc);
    let mut stop = blocks.end;
    for kb in blocks {
        let at = kb * BLOCK;
        rows.prefetch(at);
        let Some(scale) = scales.block(kb) else {
            stop = kb;
            break;
        };
        let e = lowered_exponents(scale);
        let mut scaled = chains;
        for chain in scaled.iter_mut() {
            *chain = _mm512_scalef_pd(*chain, _mm512_sub_pd(_mm512_setzero_pd(), e));
        }
        let mut doubled_max = _mm512_setzero_si512();
        for half in 0..2 {
            let mut sources = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
            for (g, source) in sources.iter_mut().enumerate() {
                *source = byte_half(&rows.group(g, at), half);
            }
            for q in 2 * half..2 * half + 2 {
                let mut halves = [[_mm512_setzero_si512(); 2]; 4];
                for (h, &pair) in halves.iter_mut().zip(&sources) {
                    let (low, high, doubled) = lowered_top_bytes(transposed(pair, q));
                    doubled_max = _mm512_max_epu8(doubled_max, doubled);
                    *h = one_source_halves(low, high);
                }
                place_columns(&mut scaled, &x[at + 8 * q..][..8], &halves, top_bytes);
            }
        }
        if has_nan(doubled_max) {
            stop = kb;
            break;
        }
        for (chain, s) in chains.iter_mut().zip(scaled) {
            *chain = _mm512_scalef_pd(s, e);
        }
    }
    store_chains(acc, chains);
    stop
}

/// [`fp4_c2_block8`] for 32 rows (four groups of eight, one chain vector each) over the
/// column blocks `blocks`, in order (`x` and `rows[i]` from column 0), as [`fp8_c2_run32`]:
/// the four chains advanced column by column in turn and kept in registers. Each group has
/// its own scales (FP4 scales are per row and block). Returns the first block it leaves (a
/// scale above the limit in any row), else `blocks.end`; `acc` has every block before it.
///
/// # Safety
/// As for [`fp8_c1_block8`]; `x`, the rows and the scales must hold `blocks.end` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp4_c2_run32(
    acc: &mut [f64; 32],
    x: &[f64],
    rows: &[&[u8]; 32],
    scales: [RowScales; 4],
    blocks: Range<usize>,
) -> usize {
    let top_bytes = top_bytes_mask();
    let x = &x[..blocks.end * BLOCK];
    let rows = RowStarts::new(rows, blocks.end * BLOCK / 2);
    let mut chains = load_chains(acc);
    let mut stop = blocks.end;
    'blocks: for kb in blocks {
        let at = kb * BLOCK / 2;
        rows.prefetch(at);
        let mut exponents = [_mm512_setzero_pd(); 4];
        for (e, s) in exponents.iter_mut().zip(&scales) {
            let Some(scale) = s.block(kb) else {
                stop = kb;
                break 'blocks;
            };
            *e = _mm512_getexp_pd(scale);
        }
        let mut scaled = chains;
        let mut sources = [[(_mm512_setzero_si512(), _mm512_setzero_si512()); 2]; 4];
        for g in 0..4 {
            scaled[g] =
                _mm512_scalef_pd(chains[g], _mm512_sub_pd(_mm512_setzero_pd(), exponents[g]));
            sources[g] = nibble_halves(rows.group(g, at), 0);
        }
        for q in 0..4 {
            let mut halves = [[_mm512_setzero_si512(); 2]; 4];
            for (h, &source) in halves.iter_mut().zip(&sources) {
                let (low, high) = e2m1_top_bytes(columns(source, q));
                *h = one_source_halves(low, high);
            }
            let xq = &x[kb * BLOCK + 8 * q..][..8];
            place_columns(&mut scaled, xq, &halves, top_bytes);
        }
        for ((chain, s), e) in chains.iter_mut().zip(scaled).zip(exponents) {
            *chain = _mm512_scalef_pd(s, e);
        }
    }
    store_chains(acc, chains);
    stop
}

/// Eight FP8 rows of one full block into columns `i .. i + 8` of a column-major block (a
/// prefill task's weights): `w[k][i + r] = e4m3(rows[r][k]) · scale[r]`, exact, so the f64
/// the generic decoder widens from its exact f32 product (a code times a scale byte ≤
/// `SAFE_SCALE_BYTE` in `matvec` is a normal or subnormal f32 without rounding). `false`,
/// nothing written, if a code is NaN.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
pub unsafe fn fp8_columns<const W: usize>(
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
    w: &mut [[f64; W]; BLOCK],
    i: usize,
) -> bool {
    let sources = byte_halves(rows);
    let nan = sources
        .iter()
        .fold(0, |m, &(a, b)| m | e4m3_nan(a) | e4m3_nan(b));
    if nan != 0 {
        return false;
    }
    for q in 0..4 {
        let (lo, hi) = e4m3_top_bytes(columns(sources, q));
        store_columns(w, i, 8 * q, placed(lo, hi), scale);
    }
    true
}

/// [`fp8_columns`] for eight rows of packed FP4 (16 bytes each, low nibble first).
///
/// # Safety
/// As for [`fp8_columns`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
pub unsafe fn fp4_columns<const W: usize>(
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
    w: &mut [[f64; W]; BLOCK],
    i: usize,
) {
    let sources = nibble_halves(rows, 0);
    for q in 0..4 {
        let (lo, hi) = e2m1_top_bytes(columns(sources, q));
        store_columns(w, i, 8 * q, placed(lo, hi), scale);
    }
}

/// Eight columns' values times the rows' scales into `w[k + g][i .. i + 8]`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_columns<const W: usize>(
    w: &mut [[f64; W]; BLOCK],
    i: usize,
    k: usize,
    values: [__m512d; 8],
    scale: &[f64; 8],
) {
    let scale = _mm512_loadu_pd(scale.as_ptr());
    for (wk, v) in w[k..k + 8].iter_mut().zip(values) {
        let column: &mut [f64; 8] = (&mut wk[i..i + 8]).try_into().expect("eight rows");
        _mm512_storeu_pd(column.as_mut_ptr(), _mm512_mul_pd(v, scale));
    }
}

/// The eight columns whose table bytes are `lo`, `hi` (byte `8g + r`: column g, row r).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn placed(lo: __m512i, hi: __m512i) -> [__m512d; 8] {
    let (mut values, top_bytes) = ([_mm512_setzero_pd(); 8], top_bytes_mask());
    for (g, v) in values.iter_mut().enumerate() {
        *v = place(lo, hi, g, top_bytes);
    }
    values
}

/// The chains `acc` divided by their rows' power-of-two `scale` (exactly, by exponent), and
/// the exponents, with which `_mm512_scalef_pd` multiplies them back.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn unscaled(acc: &[f64; 8], scale: &[f64; 8]) -> (__m512d, __m512d) {
    let e = _mm512_getexp_pd(_mm512_loadu_pd(scale.as_ptr()));
    let chain = _mm512_scalef_pd(
        _mm512_loadu_pd(acc.as_ptr()),
        _mm512_sub_pd(_mm512_setzero_pd(), e),
    );
    (chain, e)
}

/// [`fp8_c2_block8`] for eight rows of packed FP4 (16 bytes each, low nibble first).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn fp4_c2_block8(
    acc: &mut [f64; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
) {
    let (sources, top_bytes) = (nibble_halves(rows, 0), top_bytes_mask());
    let (mut chain, e) = unscaled(acc, scale);
    for q in 0..4 {
        let (lo, hi) = e2m1_top_bytes(columns(sources, q));
        chain = chains8(chain, &x[8 * q..8 * q + 8], lo, hi, top_bytes);
    }
    _mm512_storeu_pd(acc.as_mut_ptr(), _mm512_scalef_pd(chain, e));
}

/// [`fp8_c2_block8`] for eight rows of container Q8G codes (int8, 32 per row): the weight is
/// `code · scale[i]` (exact: eight bits times an f16).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn q8_c2_block8(
    acc: &mut [f64; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
) {
    int_chains(acc, x, byte_halves(rows), scale);
}

/// [`q8_c2_block8`] for container Q4G codes (16 bytes per row, low nibble first, value
/// `nibble − 8`).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn q4_c2_block8(
    acc: &mut [f64; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
) {
    int_chains(acc, x, nibble_halves(rows, 8), scale);
}

/// [`fp8_c1_block8`] for eight rows of container Q8G codes: `acc[i] += f32(P_i · scale[i])`
/// with `P_i = Σ_k x[k] · code[i][k]`. For act-quantised inputs (rule C1) every product and
/// every sum is exact in f64 (at most 11 significant bits per product over a 40-bit range),
/// and so is `P_i` times an f16 scale: the generic kernel's `Σ x·(code·scale)` to the bit.
/// The scales must be finite.
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn q8_c1_block8(
    acc: &mut [f32; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
) {
    int_sums(acc, x, byte_halves(rows), scale);
}

/// Container Q8G / Q4G rows for [`int_c2_run32`]: the kind of code, and each row's f16 group
/// scales (two bytes per group, group 0 first), `blocks_per_group` column blocks per group.
#[derive(Clone, Copy)]
pub struct IntRows32<'a> {
    pub nibbles: bool,
    pub scales: [&'a [u8]; 32],
    pub blocks_per_group: usize,
}

/// [`q8_c2_block8`] / [`q4_c2_block8`] for 32 rows (four groups of eight, one chain vector
/// each) over the column blocks `blocks`, in order (`x` and `rows[i]` from column 0): two
/// groups' chains advanced column by column in turn, the chains in registers from block to
/// block (one chain waits on each multiply-add). The same products and multiply-adds as the
/// eight-row step: every scale is taken, as there.
///
/// # Safety
/// As for [`fp8_c1_block8`]; `x`, the rows and the scales must hold `blocks.end` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn int_c2_run32(
    acc: &mut [f64; 32],
    x: &[f64],
    rows: &[&[u8]; 32],
    codes: IntRows32,
    blocks: Range<usize>,
) {
    let block_bytes = if codes.nibbles { BLOCK / 2 } else { BLOCK };
    let rows = RowStarts::new(rows, blocks.end * block_bytes);
    let mut chains = load_chains(acc);
    for kb in blocks {
        let at = kb * block_bytes;
        rows.prefetch(at);
        let mut sources = [[(_mm512_setzero_si512(), _mm512_setzero_si512()); 2]; 4];
        let mut scales = [_mm512_setzero_pd(); 4];
        for g in 0..4 {
            sources[g] = if codes.nibbles {
                nibble_halves(rows.group(g, at), 8)
            } else {
                byte_halves(rows.group(g, at))
            };
            let group: &[&[u8]; 8] = codes.scales[8 * g..8 * g + 8].try_into().expect("eight");
            scales[g] = f16_scales8(group, 2 * (kb / codes.blocks_per_group));
        }
        let xb = &x[kb * BLOCK..][..BLOCK];
        for q in 0..4 {
            for pair in 0..2 {
                let (g0, g1) = (2 * pair, 2 * pair + 1);
                let (a, b) = (int_columns(sources[g0], q), int_columns(sources[g1], q));
                for c in 0..8 {
                    let xc = _mm512_set1_pd(xb[8 * q + c]);
                    chains[g0] = _mm512_fmadd_pd(xc, _mm512_mul_pd(a[c], scales[g0]), chains[g0]);
                    chains[g1] = _mm512_fmadd_pd(xc, _mm512_mul_pd(b[c], scales[g1]), chains[g1]);
                }
            }
        }
    }
    store_chains(acc, chains);
}

/// The f16 scales at byte `at` of eight rows' scale bytes, as f64 (exactly).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn f16_scales8(rows: &[&[u8]; 8], at: usize) -> __m512d {
    _mm512_cvtps_pd(_mm256_cvtph_ps(f16_bits8(rows, at)))
}

/// The f16 bit patterns at byte `at` of eight rows' scale bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn f16_bits8(rows: &[&[u8]; 8], at: usize) -> __m128i {
    let mut halves = [0u16; 8];
    for (h, row) in halves.iter_mut().zip(rows) {
        *h = u16::from_le_bytes([row[at], row[at + 1]]);
    }
    _mm_loadu_si128(halves.as_ptr().cast())
}

/// [`q8_c1_block8`] for container Q4G codes (value `nibble − 8`).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn q4_c1_block8(
    acc: &mut [f32; 8],
    x: &[f64; BLOCK],
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
) {
    int_sums(acc, x, nibble_halves(rows, 8), scale);
}

/// The C1 step of eight rows of int8 values in the two-pairs layout of [`byte_halves`]: each
/// row's values widened to f64 and summed in lanes, then [`accumulate`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")]
unsafe fn int_sums(
    acc: &mut [f32; 8],
    x: &[f64; BLOCK],
    sources: [(__m512i, __m512i); 2],
    scale: &[f64; 8],
) {
    let mut sums = [_mm512_setzero_pd(); 8];
    for (h, (a, b)) in sources.into_iter().enumerate() {
        let (x_lo, x_hi) = (
            _mm512_loadu_pd(x[16 * h..].as_ptr()),
            _mm512_loadu_pd(x[16 * h + 8..].as_ptr()),
        );
        for (quad, v) in [a, b].into_iter().enumerate() {
            let lanes = [
                _mm512_castsi512_si128(v),
                _mm512_extracti32x4_epi32::<1>(v),
                _mm512_extracti32x4_epi32::<2>(v),
                _mm512_extracti32x4_epi32::<3>(v),
            ];
            for (l, lane) in lanes.into_iter().enumerate() {
                let row = 4 * quad + l;
                let ints = _mm512_cvtepi8_epi32(lane);
                let lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(ints));
                let hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(ints));
                sums[row] = _mm512_fmadd_pd(x_lo, lo, sums[row]);
                sums[row] = _mm512_fmadd_pd(x_hi, hi, sums[row]);
            }
        }
    }
    accumulate(acc, sums, _mm512_loadu_pd(scale.as_ptr()));
}

/// The C2 chains of eight rows over 32 columns of int8 values, given as two pairs of
/// four-row vectors (columns 0..16, 16..32; see [`columns`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")]
unsafe fn int_chains(
    acc: &mut [f64; 8],
    x: &[f64; BLOCK],
    sources: [(__m512i, __m512i); 2],
    scale: &[f64; 8],
) {
    let mut chain = _mm512_loadu_pd(acc.as_ptr());
    let s = _mm512_loadu_pd(scale.as_ptr());
    for q in 0..4 {
        for (g, values) in int_columns(sources, q).into_iter().enumerate() {
            let w = _mm512_mul_pd(values, s);
            chain = _mm512_fmadd_pd(_mm512_set1_pd(x[8 * q + g]), w, chain);
        }
    }
    _mm512_storeu_pd(acc.as_mut_ptr(), chain);
}

/// Columns `8q .. 8q + 8` of eight rows of int8 values in the two-pairs layout of
/// [`byte_halves`], each column's eight rows widened to f64.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn int_columns(sources: [(__m512i, __m512i); 2], q: usize) -> [__m512d; 8] {
    let columns = columns(sources, q);
    // 128-bit lane l: columns 2l and 2l + 1, eight rows each.
    let lanes = [
        _mm512_castsi512_si128(columns),
        _mm512_extracti32x4_epi32::<1>(columns),
        _mm512_extracti32x4_epi32::<2>(columns),
        _mm512_extracti32x4_epi32::<3>(columns),
    ];
    let mut out = [_mm512_setzero_pd(); 8];
    for (l, lane) in lanes.into_iter().enumerate() {
        let ints = _mm512_cvtepi8_epi32(lane);
        out[2 * l] = _mm512_cvtepi32_pd(_mm512_castsi512_si256(ints));
        out[2 * l + 1] = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(ints));
    }
    out
}

/// Eight container Q8G rows of one full block into columns `i .. i + 8` of a column-major
/// block: `w[k][i + r] = code[r][k] · scale[r]`, exact (eight bits times an f16), so the f64
/// the generic decoder widens from its f32 product.
///
/// # Safety
/// As for [`fp8_columns`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
pub unsafe fn q8_columns<const W: usize>(
    rows: [&[u8; BLOCK]; 8],
    scale: &[f64; 8],
    w: &mut [[f64; W]; BLOCK],
    i: usize,
) {
    let sources = byte_halves(rows);
    for q in 0..4 {
        store_columns(w, i, 8 * q, int_columns(sources, q), scale);
    }
}

/// [`q8_columns`] for container Q4G rows (value `nibble − 8`).
///
/// # Safety
/// As for [`fp8_columns`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
pub unsafe fn q4_columns<const W: usize>(
    rows: [&[u8; BLOCK / 2]; 8],
    scale: &[f64; 8],
    w: &mut [[f64; W]; BLOCK],
    i: usize,
) {
    let sources = nibble_halves(rows, 8);
    for q in 0..4 {
        store_columns(w, i, 8 * q, int_columns(sources, q), scale);
    }
}

/// N ≤ 16 input rows' chains over one full block of eight weight rows (a prefill step of
/// `matvec`'s `dot_rows`): for k increasing, `acc[j][i] = fma(x[j][k], w[k][i], acc[j][i])`,
/// input row j's eight chains one vector, its block `x[j]`. Each chain's operations are
/// `dot_rows`'s, so the bits are the same (its factors are f32 values widened: exact
/// products, see `madd`). The input blocks are one run so that each multiply-add reads its
/// input at a constant offset: from rows a run-time stride apart, the addresses were a chain
/// of additions per k that held the loop to one multiply-add per cycle (measured).
///
/// # Safety
/// The CPU must have AVX-512 F (and AVX2, FMA).
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn dot_rows<const N: usize>(
    acc: &mut [[f64; 8]; N],
    x: &[[f64; BLOCK]; N],
    w: &[[f64; 8]; BLOCK],
) {
    let chains = advance_rows::<N>(
        std::array::from_fn(|j| _mm512_loadu_pd(acc[j].as_ptr())),
        x,
        w,
    );
    for (a, chain) in acc.iter_mut().zip(chains) {
        _mm512_storeu_pd(a.as_mut_ptr(), chain);
    }
}

/// Rule C1's step of [`dot_rows`]: each block's chains from +0, k increasing (so also on
/// weights whose block sums are not exact: VQ vectors, bf16 / f32 rows), rounded to f32 and
/// added to input row j's eight sums `sums[j]`, as `matvec`'s task does per element.
///
/// # Safety
/// As for [`dot_rows`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn c1_rows<const N: usize>(
    sums: &mut [[f32; 8]; N],
    x: &[[f64; BLOCK]; N],
    w: &[[f64; 8]; BLOCK],
) {
    let blocks = advance_rows([_mm512_setzero_pd(); N], x, w);
    for (s, block) in sums.iter_mut().zip(blocks) {
        let sum = _mm256_add_ps(_mm256_loadu_ps(s.as_ptr()), _mm512_cvtpd_ps(block));
        _mm256_storeu_ps(s.as_mut_ptr(), sum);
    }
}

/// `$kernel::<N>(args)` for N = `$rows` (1 to 16): the kernels take their input row count as
/// a constant, so that their chains are registers.
macro_rules! with_input_rows {
    ($rows:expr, $kernel:ident($($arg:expr),*)) => {
        match $rows {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            5 => $kernel::<5>($($arg),*),
            6 => $kernel::<6>($($arg),*),
            7 => $kernel::<7>($($arg),*),
            8 => $kernel::<8>($($arg),*),
            9 => $kernel::<9>($($arg),*),
            10 => $kernel::<10>($($arg),*),
            11 => $kernel::<11>($($arg),*),
            12 => $kernel::<12>($($arg),*),
            13 => $kernel::<13>($($arg),*),
            14 => $kernel::<14>($($arg),*),
            15 => $kernel::<15>($($arg),*),
            16 => $kernel::<16>($($arg),*),
            n => unreachable!("a group of {n} input rows (1 to 16)"),
        }
    };
}

/// [`dot_rows`] for `acc.len()` (1 to 16) input rows, `x` their blocks (as many).
///
/// # Safety
/// As for [`dot_rows`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn dot_rows_any(acc: &mut [[f64; 8]], x: &[[f64; BLOCK]], w: &[[f64; 8]; BLOCK]) {
    with_input_rows!(acc.len(), dot_rows(rows_of_mut(acc), rows_of(x), w));
}

/// [`c1_rows`] for `sums.len()` (1 to 16) input rows, `x` their blocks (as many).
///
/// # Safety
/// As for [`dot_rows`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn c1_rows_any(sums: &mut [[f32; 8]], x: &[[f64; BLOCK]], w: &[[f64; 8]; BLOCK]) {
    with_input_rows!(sums.len(), c1_rows(rows_of_mut(sums), rows_of(x), w));
}

/// `rows` as an array of the matched length (the caller matched `sums`' or `acc`'s, and
/// passes as many input blocks).
fn rows_of<T, const N: usize>(rows: &[T]) -> &[T; N] {
    rows.try_into().expect("as many input blocks as rows")
}

/// [`rows_of`] for the mutable outputs.
fn rows_of_mut<T, const N: usize>(rows: &mut [T]) -> &mut [T; N] {
    rows.try_into().expect("the matched row count")
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn advance_rows<const N: usize>(
    mut chains: [__m512d; N],
    x: &[[f64; BLOCK]; N],
    w: &[[f64; 8]; BLOCK],
) -> [__m512d; N] {
    for (k, wk) in w.iter().enumerate() {
        let wk = _mm512_loadu_pd(wk.as_ptr());
        for (chain, xj) in chains.iter_mut().zip(x) {
            *chain = _mm512_fmadd_pd(_mm512_set1_pd(xj[k]), wk, *chain);
        }
    }
    chains
}

/// Eight rows of 32 values for [`f32_c2_block8`]: decoded f32 values (VQ vectors), or the
/// stored little-endian bytes of f32 or bf16 rows, read in place.
#[derive(Clone, Copy)]
pub enum F32Rows<'a> {
    Values(&'a [[f32; BLOCK]; 8]),
    F32([&'a [u8; 4 * BLOCK]; 8]),
    Bf16([&'a [u8; 2 * BLOCK]; 8]),
}

/// [`fp8_c2_block8`] for eight rows of 32 f32 values ([`F32Rows`]): each 8×8 tile
/// transposed in registers, each column widened to f64 and one multiply-add. A bf16 value
/// widens as `dtype::bf16_to_f32` does ([`bf16_values`]).
///
/// # Safety
/// As for [`fp8_c1_block8`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn f32_c2_block8(acc: &mut [f64; 8], x: &[f64; BLOCK], rows: F32Rows) {
    let mut chain = _mm512_loadu_pd(acc.as_ptr());
    for tile in 0..BLOCK / 8 {
        // Loops, not `array::from_fn` closures: a closure the compiler leaves out of line
        // (it did, once unrelated code was added to this file) costs a fifth of a decode.
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, ri) in r.iter_mut().enumerate() {
            *ri = match rows {
                F32Rows::Values(v) => _mm256_loadu_ps(v[i][8 * tile..].as_ptr()),
                F32Rows::F32(b) => _mm256_loadu_ps(b[i][32 * tile..].as_ptr().cast()),
                F32Rows::Bf16(b) => bf16_values(_mm_loadu_si128(b[i][16 * tile..].as_ptr().cast())),
            };
        }
        let columns = columns8(r);
        for (c, &column) in columns.iter().enumerate() {
            let w = _mm512_cvtps_pd(column);
            chain = _mm512_fmadd_pd(_mm512_set1_pd(x[8 * tile + c]), w, chain);
        }
    }
    _mm512_storeu_pd(acc.as_mut_ptr(), chain);
}

/// [`f32_c2_block8`] for 32 stored bf16 or f32 rows (little-endian; four groups of eight,
/// one chain vector each) over the column blocks `blocks`, in order (`x` and `rows[i]` from
/// column 0), as [`int_c2_run32`]: two groups' chains advanced column by column in turn,
/// the chains in registers from block to block (one chain waits on each multiply-add). Each
/// pair of groups takes its whole block before the next pair, so that every row's block is
/// read front to back at once: tile by tile across all 32 rows, a 1024² f32 weight in L3 ran
/// at two thirds of the rate (measured).
///
/// # Safety
/// As for [`fp8_c1_block8`]; `x` and the rows must hold `blocks.end` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dense_c2_run32(
    acc: &mut [f64; 32],
    x: &[f64],
    rows: &[&[u8]; 32],
    bf16: bool,
    blocks: Range<usize>,
) {
    let block_bytes = BLOCK * if bf16 { 2 } else { 4 };
    let rows = RowStarts::new(rows, blocks.end * block_bytes);
    let mut chains = load_chains(acc);
    for kb in blocks {
        let at = kb * block_bytes;
        let mut line = at;
        while line < at + block_bytes {
            rows.prefetch(line);
            line += 64;
        }
        for pair in 0..2 {
            let (g0, g1) = (2 * pair, 2 * pair + 1);
            for tile in 0..BLOCK / 8 {
                let xt = &x[kb * BLOCK + 8 * tile..][..8];
                let a = columns8(dense_tile(&rows, g0, at, tile, bf16));
                let b = columns8(dense_tile(&rows, g1, at, tile, bf16));
                for (c, &xc) in xt.iter().enumerate() {
                    let xc = _mm512_set1_pd(xc);
                    chains[g0] = _mm512_fmadd_pd(xc, _mm512_cvtps_pd(a[c]), chains[g0]);
                    chains[g1] = _mm512_fmadd_pd(xc, _mm512_cvtps_pd(b[c]), chains[g1]);
                }
            }
        }
    }
    store_chains(acc, chains);
}

/// Columns `8·tile .. 8·tile + 8` of group `g`'s eight stored rows, from byte `at` (a block's
/// start), as f32 values (one row per vector). AVX2 instructions only: the AVX2 loop reads
/// its rows with it too.
#[inline(always)]
pub(super) unsafe fn dense_tile(
    rows: &RowStarts<32>,
    g: usize,
    at: usize,
    tile: usize,
    bf16: bool,
) -> [__m256; 8] {
    let mut values = [_mm256_setzero_ps(); 8];
    if bf16 {
        for (v, row) in values.iter_mut().zip(rows.group::<16>(g, at + 16 * tile)) {
            *v = bf16_values(_mm_loadu_si128(row.as_ptr().cast()));
        }
    } else {
        for (v, row) in values.iter_mut().zip(rows.group::<32>(g, at + 32 * tile)) {
            *v = _mm256_loadu_ps(row.as_ptr().cast());
        }
    }
    values
}

/// Eight rows of 32 bytes as two pairs of four-row vectors: columns 0..16 of rows 0..4 and
/// of rows 4..8, then columns 16..32 (one row per 128-bit lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn byte_halves(rows: [&[u8; BLOCK]; 8]) -> [(__m512i, __m512i); 2] {
    [byte_half(&rows, 0), byte_half(&rows, 1)]
}

/// Half `h` of [`byte_halves`]: columns `16h .. 16h + 16` of rows 0..4 and of rows 4..8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn byte_half(rows: &[&[u8; BLOCK]; 8], h: usize) -> (__m512i, __m512i) {
    let quarter = |first: usize| {
        lanes4(std::array::from_fn(|r| {
            rows[first + r][16 * h..16 * h + 16]
                .try_into()
                .expect("16 codes")
        }))
    };
    (quarter(0), quarter(4))
}

/// [`byte_halves`] for eight rows of packed nibbles (16 bytes, low nibble first), each
/// element a byte `nibble − minus`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn nibble_halves(rows: [&[u8; BLOCK / 2]; 8], minus: i8) -> [(__m512i, __m512i); 2] {
    let ((a0, a1), (b0, b1)) = (
        nibble_elements(lanes4(std::array::from_fn(|r| rows[r])), minus),
        nibble_elements(lanes4(std::array::from_fn(|r| rows[4 + r])), minus),
    );
    [(a0, b0), (a1, b1)]
}

/// Four rows of 16 packed bytes (one per 128-bit lane) as bytes `nibble − minus` in element
/// order: each lane's elements 0..16, then 16..32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn nibble_elements(c: __m512i, minus: i8) -> (__m512i, __m512i) {
    let nibble = _mm512_set1_epi8(0x0F);
    let minus = _mm512_set1_epi8(minus);
    let even = _mm512_sub_epi8(_mm512_and_si512(c, nibble), minus);
    let odd = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(c), nibble), minus);
    (
        _mm512_unpacklo_epi8(even, odd),
        _mm512_unpackhi_epi8(even, odd),
    )
}

/// Columns `8q .. 8q + 8` of [`byte_halves`]' eight rows: byte `8g + r` is row r, column
/// `8q + g`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn columns(sources: [(__m512i, __m512i); 2], q: usize) -> __m512i {
    transposed(sources[q / 2], q)
}

/// [`columns`] from the half of [`byte_halves`] that holds column block `q`.
#[inline(always)]
unsafe fn transposed((a, b): (__m512i, __m512i), q: usize) -> __m512i {
    _mm512_permutex2var_epi8(a, load(&TRANSPOSE[q % 2]), b)
}

/// Eight columns' low and high top bytes (byte `8g + r`: column g, row r) as two one-source
/// vectors for [`PLACE_ONE`]: columns 0..4's low bytes then their high ones, and 4..8's.
#[inline(always)]
unsafe fn one_source_halves(low: __m512i, high: __m512i) -> [__m512i; 2] {
    [
        _mm512_inserti64x4::<1>(low, _mm512_castsi512_si256(high)),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(low, high),
    ]
}

/// The low and high table bytes of 64 e4m3 codes: the table index is the code's low seven
/// bits, its sign is or-ed into the high byte.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn e4m3_top_bytes(c: __m512i) -> (__m512i, __m512i) {
    let (low, high) = (&E4M3_LOW, &E4M3_HIGH);
    let lo = _mm512_permutex2var_epi8(load(&low[..64]), c, load(&low[64..]));
    let hi = _mm512_permutex2var_epi8(load(&high[..64]), c, load(&high[64..]));
    (
        lo,
        _mm512_ternarylogic_epi32::<0xF8>(hi, c, _mm512_set1_epi8(i8::MIN)),
    )
}

/// The low and high table bytes of 64 e2m1 nibbles (one per byte).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn e2m1_top_bytes(c: __m512i) -> (__m512i, __m512i) {
    (
        _mm512_shuffle_epi8(load(&E2M1_LOW), c),
        _mm512_shuffle_epi8(load(&E2M1_HIGH), c),
    )
}

/// Which of 64 e4m3 codes are NaN (0x7F, 0xFF).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn e4m3_nan(c: __m512i) -> __mmask64 {
    _mm512_cmpeq_epi8_mask(
        _mm512_or_si512(c, _mm512_set1_epi8(i8::MIN)),
        _mm512_set1_epi8(-1),
    )
}

/// Four rows of 16 bytes, row r in 128-bit lane r.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) unsafe fn lanes4(rows: [&[u8; 16]; 4]) -> __m512i {
    let lane = |r: usize| _mm_loadu_si128(rows[r].as_ptr().cast());
    _mm512_inserti32x4::<3>(
        _mm512_inserti32x4::<2>(
            _mm512_inserti32x4::<1>(_mm512_castsi128_si512(lane(0)), lane(1)),
            lane(2),
        ),
        lane(3),
    )
}

/// Eight columns (`x` their inputs) of eight rows' values, the columns' top bytes in `lo`,
/// `hi` (byte `8g + r`: column g, row r): `chain = fma(x[g], value, chain)`, g increasing.
/// Each four columns' low and high bytes are first put in one vector, so that each column is
/// placed by a one-source permute (a two-source one is three micro-ops on Intel cores).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")]
unsafe fn chains8(
    chain: __m512d,
    x: &[f64],
    lo: __m512i,
    hi: __m512i,
    top_bytes: __mmask64,
) -> __m512d {
    let mut chains = [chain];
    place_columns(&mut chains, x, &[one_source_halves(lo, hi)], top_bytes);
    chains[0]
}

/// [`chains8`] for `N` groups of eight rows at once (`halves[g]`: group g's columns as
/// [`one_source_halves`] gives them), the groups' chains advanced column by column in turn:
/// one chain waits on each multiply-add, several hide most of that.
#[inline(always)]
unsafe fn place_columns<const N: usize>(
    chains: &mut [__m512d; N],
    x: &[f64],
    halves: &[[__m512i; 2]; N],
    top_bytes: __mmask64,
) {
    let x: &[f64; 8] = x.try_into().expect("eight columns");
    for (column, &xc) in x.iter().enumerate() {
        let xc = _mm512_set1_pd(xc);
        let index = load(&PLACE_ONE[column % 4]);
        for (chain, h) in chains.iter_mut().zip(halves) {
            let w = _mm512_maskz_permutexvar_epi8(top_bytes, index, h[column / 4]);
            *chain = _mm512_fmadd_pd(xc, _mm512_castsi512_pd(w), *chain);
        }
    }
}

/// The four groups' chain vectors of a 32-row loop, from `acc`.
#[inline(always)]
pub(super) unsafe fn load_chains(acc: &[f64; 32]) -> [__m512d; 4] {
    let mut chains = [_mm512_setzero_pd(); 4];
    for (g, chain) in chains.iter_mut().enumerate() {
        *chain = _mm512_loadu_pd(acc[8 * g..].as_ptr());
    }
    chains
}

/// [`load_chains`]' inverse.
#[inline(always)]
pub(super) unsafe fn store_chains(acc: &mut [f64; 32], chains: [__m512d; 4]) {
    for (g, chain) in chains.iter().enumerate() {
        _mm512_storeu_pd(acc[8 * g..].as_mut_ptr(), *chain);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn load(bytes: &[u8]) -> __m512i {
    let bytes: &[u8; 64] = bytes.try_into().expect("64 table bytes");
    _mm512_loadu_si512(bytes.as_ptr().cast())
}

/// Eight f64 whose top bytes are bytes `8g .. 8g + 8` of `lo` and `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn place(lo: __m512i, hi: __m512i, g: usize, top_bytes: __mmask64) -> __m512d {
    let index = load(&PLACE[g]);
    _mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(top_bytes, lo, index, hi))
}

/// `acc[i] += f32(Σ lanes of sums[i] · scale[i])`, the eight lane sums taken together.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi")]
unsafe fn accumulate(acc: &mut [f32; 8], s: [__m512d; 8], scale: __m512d) {
    let sum = _mm256_add_ps(_mm256_loadu_ps(acc.as_ptr()), block_values(s, scale));
    _mm256_storeu_ps(acc.as_mut_ptr(), sum);
}

/// `f32(Σ lanes of sums[i] · scale[i])` for the eight rows, the lane sums taken together.
#[inline(always)]
unsafe fn block_values(s: [__m512d; 8], scale: __m512d) -> __m256 {
    // Pairs of rows: per 128-bit lane, (row a, row b) partial sums.
    let pair =
        |a: __m512d, b: __m512d| _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
    // Two such: 128-bit lanes 0+1 and 2+3 of each, rows a, b, c, d in order.
    let quad = |ab: __m512d, cd: __m512d| {
        _mm512_add_pd(
            _mm512_shuffle_f64x2::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f64x2::<0b11_01_11_01>(ab, cd),
        )
    };
    let (q0, q1) = (
        quad(pair(s[0], s[1]), pair(s[2], s[3])),
        quad(pair(s[4], s[5]), pair(s[6], s[7])),
    );
    let total = _mm512_add_pd(
        _mm512_shuffle_f64x2::<0b10_00_10_00>(q0, q1),
        _mm512_shuffle_f64x2::<0b11_01_11_01>(q0, q1),
    );
    _mm512_cvtpd_ps(_mm512_mul_pd(total, scale))
}

/// At each new cache line `at` of the rows, ask for their lines [`PREFETCH_AHEAD`] bytes on.
#[inline(always)]
pub fn prefetch_rows(rows: &[&[u8]], at: usize) {
    if at.is_multiple_of(64) {
        for row in rows {
            prefetch(row, at + PREFETCH_AHEAD);
        }
    }
}

/// Weight rows as a decode loop reads them, block by block: where each starts, and a length
/// every row has, checked once per loop. Taking each block as a checked slice of each row
/// cost a third of the 32-row FP8 loop's instructions (a length loaded, compared and
/// branched on per row and block, measured); here a block's reads need one comparison.
#[derive(Clone, Copy)]
pub struct RowStarts<'a, const N: usize> {
    starts: [*const u8; N],
    len: usize,
    rows: std::marker::PhantomData<&'a [u8]>,
}

impl<'a, const N: usize> RowStarts<'a, N> {
    /// The first `len` bytes of each row. Panics if a row is shorter: the loops' callers
    /// promise every block the loop reads.
    #[inline(always)]
    pub fn new(rows: &[&'a [u8]; N], len: usize) -> Self {
        assert!(
            rows.iter().all(|r| r.len() >= len),
            "a weight row shorter than the blocks its loop reads"
        );
        RowStarts {
            starts: rows.map(<[u8]>::as_ptr),
            len,
            rows: std::marker::PhantomData,
        }
    }

    /// The `B` bytes at `at` of group `g`'s eight rows (rows `8g .. 8g + 8`).
    #[inline(always)]
    pub fn group<const B: usize>(&self, g: usize, at: usize) -> [&'a [u8; B]; 8] {
        assert!(
            at + B <= self.len && 8 * g + 8 <= N,
            "a block past the rows' checked length"
        );
        let block = |i: usize| -> &'a [u8; B] {
            // SAFETY: row `8g + i` has `len` bytes from its start (`new`), and `at + B ≤ len`.
            unsafe { &*self.starts[8 * g + i].add(at).cast::<[u8; B]>() }
        };
        [
            block(0),
            block(1),
            block(2),
            block(3),
            block(4),
            block(5),
            block(6),
            block(7),
        ]
    }

    /// [`prefetch_rows`] for these rows (nothing past their checked length).
    #[inline(always)]
    pub fn prefetch(&self, at: usize) {
        let ahead = at + PREFETCH_AHEAD;
        if at.is_multiple_of(64) && ahead < self.len {
            for start in self.starts {
                // SAFETY: a prefetch has no architectural effect, and the address is inside
                // the row (`ahead < len`).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(ahead).cast()) };
            }
        }
    }
}

/// The weight rows a decode task reads after its current eight (the next eight rows, one
/// contiguous run of bytes), asked into the L2 cache a share per column block while the
/// current rows are summed: by the time the task moves on they are there, whatever the row
/// length (eight rows walked block by block are eight streams for the hardware prefetcher,
/// each restarting at every page).
#[derive(Clone, Copy)]
pub struct NextRows<'a> {
    bytes: &'a [u8],
    /// Bytes of `bytes` per column block of the current rows.
    per_block: usize,
}

impl<'a> NextRows<'a> {
    /// `bytes` spread over `blocks` column blocks.
    pub fn over(bytes: &'a [u8], blocks: usize) -> Self {
        NextRows {
            bytes,
            per_block: bytes.len().div_ceil(blocks.max(1)),
        }
    }

    /// Nothing to ask for.
    pub const NONE: NextRows<'static> = NextRows {
        bytes: &[],
        per_block: 0,
    };

    /// Ask for the share of column block `kb`.
    #[inline(always)]
    pub fn fetch(&self, kb: usize) {
        let at = kb * self.per_block;
        let mut line = at;
        while line < at + self.per_block {
            if let Some(b) = self.bytes.get(line) {
                // SAFETY: a prefetch has no architectural effect, and the address is in
                // `bytes`.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(std::ptr::from_ref(b).cast()) };
            }
            line += 64;
        }
    }
}

/// Ask for the cache line of `bytes[at]` (nothing past the end: a row's last lines are
/// already on their way).
#[inline(always)]
pub fn prefetch(bytes: &[u8], at: usize) {
    if let Some(b) = bytes.get(at) {
        // SAFETY: a prefetch has no architectural effect, and the address is in `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(b).cast()) };
    }
}
