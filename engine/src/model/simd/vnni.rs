//! Rule C1's FP4 block sums in integers, with AVX-512 VNNI (MODEL.md §5.4).
//!
//! A C1 input block is act-quantised: every value is an e4m3 value times the block's
//! power-of-two scale s, so a multiple of 2^−9 · s of magnitude at most 448 · s. For the power
//! of two `u = 2^(floor(log2 max|x|) − 18)`, which is at most 2^−10 · s, every input is an
//! integer `X · u` with |X| < 2^19 ([`block_integers`] checks it and declines otherwise). Every
//! e2m1 value is an integer `W / 2` with |W| ≤ 12. The block sum is then `u/2 · Σ X·W`, and
//! |Σ X·W| < 32 · 12 · 2^19 < 2^28: exact in 32-bit integers, in any order. `vpdpbusd` adds
//! four unsigned-byte × signed-byte products per 32-bit lane, so |X| is split into three byte
//! planes (its sign moved onto W) and the three sums are recombined by shifts. The product
//! with the scales and the rounding to f32 are those of the f64 kernel
//! (`avx512::fp4_c1_block8`), on the same exact value, so the bits are the same.

use super::super::quant::BLOCK;

/// One 32-column C1 input block as integers: byte planes of |X| and the signs, for the even
/// columns (0, 2, …, 30) and the odd ones, which the kernel pairs with the low and high
/// nibbles of the packed codes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActBlock {
    /// `planes[2p + h][j]`: bits 8p .. 8p + 8 of |X| at column 2j + h.
    planes: [[u8; 16]; 6],
    /// Bit j of `signs[h]`: X at column 2j + h is negative.
    signs: [u16; 2],
    /// The value of one step of Σ X·W: u / 2.
    unit: f64,
}

/// |X| bound (exclusive): three byte planes.
const X_LIMIT: f64 = (1u32 << 19) as f64;

impl ActBlock {
    /// The block as integers, or `None` where an input is not finite or not an integer
    /// multiple of the unit chosen from the largest magnitude (not an act-quantised block).
    pub fn of(x: &[f64; BLOCK]) -> Option<ActBlock> {
        let (x, unit) = block_integers(x)?;
        let mut block = ActBlock {
            unit,
            ..ActBlock::default()
        };
        for (k, &v) in x.iter().enumerate() {
            let m = v.unsigned_abs();
            let (j, h) = (k / 2, k % 2);
            for p in 0..3 {
                block.planes[2 * p + h][j] = (m >> (8 * p)) as u8;
            }
            if v < 0 {
                block.signs[h] |= 1 << j;
            }
        }
        Some(block)
    }

    /// The block's integers X, signed, and its unit: input k is `X[k] · 2 · unit`.
    pub fn integers(&self) -> ([i32; BLOCK], f64) {
        let x = std::array::from_fn(|k| {
            let (j, h) = (k / 2, k % 2);
            let m = (0..3).fold(0i32, |m, p| {
                m | i32::from(self.planes[2 * p + h][j]) << (8 * p)
            });
            if self.signs[h] >> j & 1 == 1 {
                -m
            } else {
                m
            }
        });
        (x, self.unit)
    }

    /// The inputs the block stands for, `±|X| · 2 · unit` (+0 for X = 0).
    pub fn inputs(&self) -> [f64; BLOCK] {
        let (x, unit) = self.integers();
        x.map(|v| f64::from(v) * 2.0 * unit)
    }
}

/// An act-quantised input block as integers X, signed, and its unit: input k is
/// `X[k] · 2 · unit` with |X| < 2^19 and `2 · unit = 2^(floor(log2 max|x|) − 18)`; `None`
/// where an input is not finite or not such a multiple (not an act-quantised block). Every
/// input ±0 gives X = 0 and unit 1. The integer forms of all the integer kernels come from
/// here.
pub fn block_integers(x: &[f64; BLOCK]) -> Option<([i32; BLOCK], f64)> {
    // `max` passes over a NaN; the loop below refuses it (but for all-zero blocks here).
    let amax = x.iter().fold(0f64, |m, v| m.max(v.abs()));
    if amax == 0.0 && x.iter().all(|&v| v == 0.0) {
        // Every input ±0: the sum is +0, whatever the unit.
        return Some(([0; BLOCK], 1.0));
    }
    if !amax.is_normal() {
        return None;
    }
    // floor(log2 amax) from the exponent field; 2^(18 − e) and 2^(e − 19) built the same
    // way, both normal for any normal amax of an f32 input.
    let field = (amax.to_bits() >> 52) as i64;
    let (up, unit) = (1023 + 1023 + 18 - field, field - 19);
    if !(1..2047).contains(&up) || !(1..2047).contains(&unit) {
        return None;
    }
    let to_steps = f64::from_bits((up as u64) << 52);
    let mut integers = [0i32; BLOCK];
    let mut exact = true;
    // No early exit, so that the loop vectorises; the verdict is taken once at the end.
    for (i, &v) in integers.iter_mut().zip(x) {
        // Exact: a power of two, far from the f64 limits. An integer below the limit
        // round-trips through i32; NaN and larger values do not (the conversion saturates).
        let n = v * to_steps;
        *i = n as i32;
        exact &= f64::from(*i) == n && n.abs() < X_LIMIT;
    }
    exact.then(|| (integers, f64::from_bits((unit as u64) << 52)))
}

/// [`block_integers`] with the largest power of two dividing every X moved into the unit (at
/// most 2^18: |X| < 2^19), so that the integers are as small as the values' spread allows.
pub fn reduced_block_integers(x: &[f64; BLOCK]) -> Option<([i32; BLOCK], f64)> {
    let (x, unit) = block_integers(x)?;
    let common = x.iter().fold(0i32, |bits, &v| bits | v);
    let shift = if common == 0 {
        0
    } else {
        common.trailing_zeros()
    };
    Some((x.map(|v| v >> shift), unit * f64::from(1u32 << shift)))
}

/// Base-256 digits of an |X| < 2^19, at most.
pub const DIGITS: usize = 3;

/// `X = D₀ + 2^8 D₁ + 2^16 D₂` in balanced digits (−128 ≤ Dᵢ ≤ 127, so that they are signed
/// bytes), and how many of them X needs (at least one; the rest are zero).
pub fn balanced_digits(v: i32) -> ([i8; DIGITS], u8) {
    let (mut digits, mut used, mut rest) = ([0i8; DIGITS], 1, v);
    for (i, d) in digits.iter_mut().enumerate() {
        *d = rest as i8;
        rest = (rest - i32::from(*d)) >> 8;
        if *d != 0 || rest != 0 {
            used = used.max(i as u8 + 1);
        }
    }
    debug_assert_eq!(rest, 0, "|X| < 2^19 has three digits");
    (digits, used)
}

/// A prefill's input rows as its kernels read them, a 32-column block at a time.
#[derive(Clone, Copy)]
pub struct InputBlocks<'a> {
    /// Row m's block kb starts at `x[m · stride + off + 32 kb]`.
    pub x: &'a [f64],
    pub stride: usize,
    pub off: usize,
    pub rows: usize,
    /// Full blocks per row.
    pub blocks: usize,
}

impl<'a> InputBlocks<'a> {
    /// Row m's block kb.
    pub fn block(&self, m: usize, kb: usize) -> &'a [f64; BLOCK] {
        let at = m * self.stride + self.off + kb * BLOCK;
        self.x[at..at + BLOCK].try_into().expect("a block")
    }
}

/// A prefill's act-quantised input rows in the integer form one prefill kernel reads.
pub trait IntegerInputs {
    /// Fill from every block of `input`; `false` (contents unspecified) if some block is not
    /// act-quantised.
    fn fill(&mut self, input: InputBlocks) -> bool;
}

/// The integer form of every full block of `x`, into `out`; `false` (out unspecified) if a
/// block has none.
pub fn act_blocks(x: &[f64], out: &mut Vec<ActBlock>) -> bool {
    out.clear();
    for xb in x.chunks_exact(BLOCK) {
        match ActBlock::of(xb.try_into().expect("a block")) {
            Some(b) => out.push(b),
            None => return false,
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
pub(super) use kernel::TWICE_E2M1;
#[cfg(target_arch = "x86_64")]
pub use kernel::{
    fp4_c1_block8_vnni, index_dots_vnni, nibble_c1_run8_vnni, q4_c1_block8_vnni, NibbleScales,
};

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::avx512::{f16_bits8, lanes4, NextRows, RowScales, RowStarts};
    use super::{ActBlock, BLOCK};
    use crate::model::index_grid::{KeyTile, TILE_KEYS};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// `2 · e2m1(n)` as a signed byte for every nibble n (bit 3 the sign), in each 128-bit lane.
    pub(in crate::model::simd) static TWICE_E2M1: [i8; 64] = {
        const HALF: [i8; 8] = [0, 1, 2, 3, 4, 6, 8, 12];
        let mut t = [0i8; 64];
        let mut i = 0;
        while i < 64 {
            let n = i % 16;
            t[i] = if n < 8 { HALF[n] } else { -HALF[n - 8] };
            i += 1;
        }
        t
    };

    /// `nibble − 8` (a container Q4G value) as a signed byte for every nibble, in each
    /// 128-bit lane.
    static NIBBLE_MINUS_8: [i8; 64] = {
        let mut t = [0i8; 64];
        let mut i = 0;
        while i < 64 {
            t[i] = (i % 16) as i8 - 8;
            i += 1;
        }
        t
    };

    /// Permutation gathering row i's total (element 0 of 128-bit lane i for rows 0..4, element
    /// 2 of lane i − 4 for rows 4..8) into 32-bit element i.
    static ROW_TOTALS: [i32; 16] = [0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0];

    /// One C1 step of eight FP4 rows over one full block, as `avx512::fp4_c1_block8`:
    /// `acc[i] += f32(P_i · scale[i])` with `P_i = Σ_k x[k] · e2m1(rows[i][k])`, here summed
    /// exactly in integers from `x`'s [`ActBlock`]. The scales must not overflow f32 with any
    /// code (`SAFE_SCALE_BYTE` in `matvec`).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, VL, VBMI and VNNI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    pub unsafe fn fp4_c1_block8_vnni(
        acc: &mut [f32; 8],
        x: &ActBlock,
        rows: [&[u8; BLOCK / 2]; 8],
        scale: &[f64; 8],
    ) {
        let steps = _mm512_mul_pd(_mm512_loadu_pd(scale.as_ptr()), _mm512_set1_pd(x.unit));
        nibble_c1_block8(acc, x, rows, &TWICE_E2M1, steps);
    }

    /// [`fp4_c1_block8_vnni`] for container Q4G rows (value `nibble − 8`, `scale[i]` the
    /// group's f16 scale as f64), as `avx512::q4_c1_block8`: `acc[i] += f32(P_i · scale[i])`.
    /// The block sum is `2 · unit · Σ X·(nibble − 8)`, |Σ| < 32 · 8 · 2^19, and its product
    /// with the scale is exact in f64 (an f16 has 11 significant bits), so the bits are the
    /// f64 kernel's.
    ///
    /// # Safety
    /// As for [`fp4_c1_block8_vnni`]; the scales must be finite.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    pub unsafe fn q4_c1_block8_vnni(
        acc: &mut [f32; 8],
        x: &ActBlock,
        rows: [&[u8; BLOCK / 2]; 8],
        scale: &[f64; 8],
    ) {
        let steps = _mm512_mul_pd(
            _mm512_loadu_pd(scale.as_ptr()),
            _mm512_set1_pd(2.0 * x.unit),
        );
        nibble_c1_block8(acc, x, rows, &NIBBLE_MINUS_8, steps);
    }

    /// Where the nibble loop finds each column block's eight row scales.
    #[derive(Clone, Copy)]
    pub enum NibbleScales<'a> {
        /// Release FP4: E8M0 bytes per row and block.
        Fp4(RowScales<'a>),
        /// Container Q4G: row i's f16 group scales in `rows[i]` (two bytes per group, group 0
        /// first), `blocks_per_group` column blocks per group.
        Q4 {
            rows: [&'a [u8]; 8],
            blocks_per_group: usize,
        },
    }

    impl NibbleScales<'_> {
        /// Block `kb`'s eight scales as f64; `None` where the single-block kernels do not
        /// take them either (an E8M0 byte above the limit, an f16 that is not finite).
        #[inline(always)]
        unsafe fn block(&self, kb: usize) -> Option<__m512d> {
            match *self {
                NibbleScales::Fp4(s) => s.block(kb),
                NibbleScales::Q4 {
                    rows,
                    blocks_per_group,
                } => {
                    let bits = f16_bits8(&rows, 2 * (kb / blocks_per_group));
                    let exponent = _mm_set1_epi16(0x7C00);
                    let special = _mm_cmpeq_epi16(_mm_and_si128(bits, exponent), exponent);
                    (_mm_movemask_epi8(special) == 0)
                        .then(|| _mm512_cvtps_pd(_mm256_cvtph_ps(bits)))
                }
            }
        }
    }

    /// [`fp4_c1_block8_vnni`] (release FP4) or [`q4_c1_block8_vnni`] (container Q4G, by the
    /// kind of `scales`) over the column blocks `blocks` of eight rows, in order (`x[kb]`
    /// block kb's integers, `rows[i]` from column 0): one loop with the sums and the
    /// constants in registers, the next rows asked for on the way (`next`). Returns the
    /// first block it leaves (a scale the single-block kernels do not take), else
    /// `blocks.end`; `acc` has every block before it.
    ///
    /// # Safety
    /// As for [`fp4_c1_block8_vnni`]; `x`, the rows and the scales must hold `blocks.end`
    /// blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    pub unsafe fn nibble_c1_run8_vnni(
        acc: &mut [f32; 8],
        x: &[ActBlock],
        rows: [&[u8]; 8],
        scales: NibbleScales,
        next: NextRows,
        blocks: Range<usize>,
    ) -> usize {
        const BYTES: usize = BLOCK / 2;
        // The kernels' values and steps: FP4 codes as twice their e2m1 value, Q4G nibbles as
        // `nibble − 8` with the input's unit doubled.
        let (table, unit_factor) = match scales {
            NibbleScales::Fp4(_) => (&TWICE_E2M1, 1.0),
            NibbleScales::Q4 { .. } => (&NIBBLE_MINUS_8, 2.0),
        };
        let x = &x[..blocks.end];
        let rows = RowStarts::new(&rows, blocks.end * BYTES);
        let mut total = _mm256_loadu_ps(acc.as_ptr());
        let mut stop = blocks.end;
        for kb in blocks {
            let at = kb * BYTES;
            rows.prefetch(at);
            next.fetch(kb);
            let Some(scale) = scales.block(kb) else {
                stop = kb;
                break;
            };
            let rb = rows.group(0, at);
            let steps = _mm512_mul_pd(scale, _mm512_set1_pd(unit_factor * x[kb].unit));
            let values = nibble_block_values(&x[kb], rb, table, steps);
            total = _mm256_add_ps(total, values);
        }
        _mm256_storeu_ps(acc.as_mut_ptr(), total);
        stop
    }

    /// `acc[i] += f32(steps[i] · Σ_k X[k] · table[nibble[i][k]])`, the sum exact in 32-bit
    /// lanes (|table| ≤ 12).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    unsafe fn nibble_c1_block8(
        acc: &mut [f32; 8],
        x: &ActBlock,
        rows: [&[u8; BLOCK / 2]; 8],
        table: &[i8; 64],
        steps: __m512d,
    ) {
        let sum = _mm256_add_ps(
            _mm256_loadu_ps(acc.as_ptr()),
            nibble_block_values(x, rows, table, steps),
        );
        _mm256_storeu_ps(acc.as_mut_ptr(), sum);
    }

    /// `f32(steps[i] · Σ_k X[k] · table[nibble[i][k]])` for the eight rows. Inlined into the
    /// kernels, which have the target features.
    #[inline(always)]
    unsafe fn nibble_block_values(
        x: &ActBlock,
        rows: [&[u8; BLOCK / 2]; 8],
        table: &[i8; 64],
        steps: __m512d,
    ) -> __m256 {
        let table = _mm512_loadu_si512(table.as_ptr().cast());
        let nibble = _mm512_set1_epi8(0x0F);
        let zero = _mm512_setzero_si512();
        // A loop, not `array::from_fn`: a closure is compiled without the kernels' target
        // features, and left out of line its intrinsics become calls.
        let mut planes = [zero; 6];
        for (plane, bytes) in planes.iter_mut().zip(&x.planes) {
            *plane = _mm512_broadcast_i32x4(_mm_loadu_si128(bytes.as_ptr().cast()));
        }
        // A column's sign applies to the four rows, one per 128-bit lane.
        let signs = x.signs.map(|s| u64::from(s) * 0x0001_0001_0001_0001);
        let mut totals = [zero; 2];
        for (quad, total) in totals.iter_mut().enumerate() {
            let c = lanes4(std::array::from_fn(|r| rows[4 * quad + r]));
            // Low nibbles: the even columns; high nibbles: the odd ones.
            let halves = [
                _mm512_and_si512(c, nibble),
                _mm512_and_si512(_mm512_srli_epi16::<4>(c), nibble),
            ];
            let mut sums = [zero; 3];
            for (h, codes) in halves.into_iter().enumerate() {
                let w = _mm512_shuffle_epi8(table, codes);
                let w = _mm512_mask_sub_epi8(w, signs[h], zero, w);
                for (p, sum) in sums.iter_mut().enumerate() {
                    *sum = _mm512_dpbusd_epi32(*sum, planes[2 * p + h], w);
                }
            }
            *total = _mm512_add_epi32(
                sums[0],
                _mm512_add_epi32(
                    _mm512_slli_epi32::<8>(sums[1]),
                    _mm512_slli_epi32::<16>(sums[2]),
                ),
            );
        }
        // 128-bit lane l of totals[q]: four partial sums of row 4q + l.
        let (a, b) = (totals[0], totals[1]);
        let pairs = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
        let both = _mm512_add_epi32(pairs, _mm512_shuffle_epi32::<0b10_11_00_01>(pairs));
        let rows = _mm512_permutexvar_epi32(_mm512_loadu_si512(ROW_TOTALS.as_ptr().cast()), both);
        let sums = _mm512_cvtepi32_pd(_mm512_castsi512_si256(rows));
        _mm512_cvtpd_ps(_mm512_mul_pd(sums, steps))
    }

    /// One index head's dots with a tile of keys, both on the grid (`index_grid`):
    /// `dots[j] = Σ_b u_q[b] · u_k[b][j] · Σ_{k∈b} c_q c_k`, added over the blocks in order from
    /// −0.0. Each block's sum is `Σ (c_q + 128) c_k − 128 Σ c_k` in 32-bit lanes, one key per
    /// lane; its products with the units are exact in f64.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and VNNI; `query` and `tile` have the same block count.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    pub unsafe fn index_dots_vnni(
        dots: &mut [f64; TILE_KEYS],
        (biased, q_units): (&[[u8; BLOCK]], &[f64]),
        tile: &KeyTile,
    ) {
        debug_assert_eq!(biased.len() * 8, tile.codes.len());
        let mut d = [_mm512_set1_pd(-0.0); TILE_KEYS / 8];
        for (b, (q, &q_unit)) in biased.iter().zip(q_units).enumerate() {
            let mut acc = [_mm512_setzero_si512(); 2];
            for (g, codes) in tile.codes[8 * b..8 * b + 8].iter().enumerate() {
                let qg = _mm512_set1_epi32(i32::from_le_bytes(
                    q[4 * g..4 * g + 4].try_into().expect("four codes"),
                ));
                for (h, a) in acc.iter_mut().enumerate() {
                    let k = _mm512_loadu_si512(codes[64 * h..].as_ptr().cast());
                    *a = _mm512_dpbusd_epi32(*a, qg, k);
                }
            }
            let unit = _mm512_set1_pd(q_unit);
            for (h, a) in acc.into_iter().enumerate() {
                let bias = _mm512_slli_epi32::<7>(_mm512_loadu_si512(
                    tile.sums[b][16 * h..].as_ptr().cast(),
                ));
                let s = _mm512_sub_epi32(a, bias);
                let halves = [_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s)];
                for (i, half) in halves.into_iter().enumerate() {
                    let lane = 8 * (2 * h + i);
                    let k_unit = _mm512_loadu_pd(tile.units[b][lane..].as_ptr());
                    let v = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(half), k_unit), unit);
                    d[2 * h + i] = _mm512_add_pd(d[2 * h + i], v);
                }
            }
        }
        for (i, di) in d.into_iter().enumerate() {
            _mm512_storeu_pd(dots[8 * i..].as_mut_ptr(), di);
        }
    }
}
