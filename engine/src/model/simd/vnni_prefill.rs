//! Rule C1's FP4 block sums for a prefill, with AVX-512 VNNI (MODEL.md §5.4).
//!
//! As in `vnni`, an act-quantised input block is `x = X · 2u` with integers |X| < 2^19
//! ([`block_integers`](super::vnni::block_integers)) and an e2m1 value is `W / 2` with |W| ≤
//! 12, so a block sum is `u · Σ X·W`, |Σ X·W| < 2^28: exact in 32-bit integers, in any order.
//! Here sixteen weight rows sit in the lanes of a vector, four columns each, as the unsigned
//! bytes `W + 12`; an input row's four columns are broadcast to every lane as signed bytes, so
//! one `vpdpbusd` makes 64 products. X is written in balanced base-256 digits
//! (`X = D₀ + 2^8 D₁ + 2^16 D₂`, each −128 ≤ Dᵢ ≤ 127) after dividing out its block's common
//! power of two, so most blocks need two digits, some one; the digit sums are recombined by
//! shifts and the offset `−12 · Σ X` is added, in wrapping 32-bit arithmetic, which is exact
//! because the true sum fits. The product with the scales, the rounding to f32 and the addition
//! over the blocks in increasing order are the f64 kernels' operations on the same exact block
//! sum ([`scaled_block_sums`]), so the bits are theirs.

use super::super::parallel::{try_for_each_chunk, worth_parallel};
use super::super::quant::BLOCK;
use super::vnni::{balanced_digits, reduced_block_integers, InputBlocks, IntegerInputs, DIGITS};

/// Weight rows per kernel call: one per 32-bit lane.
pub const W_ROWS: usize = 16;

/// `W + 12` is unsigned; its excess over `W` is taken back once per block.
const W_OFFSET: i32 = 12;

/// One input row's block: its digits, its unit and the offset that `W + 12` adds.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct RowBlock {
    /// `digits[i][k]`: digit i of X at column k (zero above the block's digit count).
    digits: [[i8; BLOCK]; DIGITS],
    /// u: input k is `X[k] · 2u`.
    unit: f64,
    /// `−12 · Σ X` (below 2^28 in magnitude).
    offset: i32,
    /// u as f32 (exact where the block's unit range is inside `F32_STEPS`).
    unit_f32: f32,
    /// The digits X needs (at least one).
    digit_count: u8,
}

const EMPTY: RowBlock = RowBlock {
    digits: [[0; BLOCK]; DIGITS],
    unit: 0.0,
    offset: 0,
    unit_f32: 0.0,
    digit_count: 1,
};

/// The units u of sixteen input rows, one per lane of a kernel's block sums (0 for rows past
/// the end), as f64 and as f32, and the least and the largest of the rows present: the input
/// side of the f32 steps of [`scaled_block_sums`] (AMX tiles).
#[derive(Clone, Copy, Debug)]
pub struct LaneUnits {
    units: [f64; LANES],
    /// The same as f32 (exact where `range` is inside `F32_STEPS`).
    units_f32: [f32; LANES],
    range: (f64, f64),
}

/// f32 lanes of a 512-bit vector.
const LANES: usize = 16;

impl LaneUnits {
    /// No row present yet.
    pub const NONE: LaneUnits = LaneUnits {
        units: [0.0; LANES],
        units_f32: [0.0; LANES],
        range: (f64::INFINITY, 0.0),
    };

    /// Row `lane`'s unit.
    pub fn set(&mut self, lane: usize, unit: f64) {
        self.units[lane] = unit;
        self.units_f32[lane] = unit as f32;
        self.range = (self.range.0.min(unit), self.range.1.max(unit));
    }
}

/// Every full block of a prefill's input rows as digits, block-major.
#[derive(Default)]
pub struct ActDigits {
    rows: usize,
    blocks: usize,
    /// `entries[kb · rows + m]`: block kb of row m.
    entries: Vec<RowBlock>,
    /// Per block, the most digits any row needs (the kernel runs that many for every row,
    /// so its loop does not branch per row).
    digit_counts: Vec<u8>,
    /// Per block, the least and the largest unit of its rows.
    unit_ranges: Vec<(f64, f64)>,
}

impl IntegerInputs for ActDigits {
    fn fill(&mut self, input: InputBlocks) -> bool {
        let (rows, blocks) = (input.rows, input.blocks);
        self.rows = rows;
        self.blocks = blocks;
        self.entries.clear();
        self.entries.resize(rows * blocks, EMPTY);
        // About a thousand operations per entry: worth the pool for a prefill of real width.
        let parallel = worth_parallel(rows * blocks * BLOCK * BLOCK);
        let filled = try_for_each_chunk(
            &mut self.entries,
            rows,
            parallel,
            |kb, entries| -> Result<(), ()> {
                for (m, entry) in entries.iter_mut().enumerate() {
                    entry.set(reduced_block_integers(input.block(m, kb)).ok_or(())?);
                }
                Ok(())
            },
        );
        if filled.is_err() {
            return false;
        }
        self.digit_counts.clear();
        self.unit_ranges.clear();
        for entries in self.entries.chunks_exact(rows) {
            let digits = entries.iter().map(|e| e.digit_count).max().unwrap_or(1);
            let units = entries.iter().fold((f64::INFINITY, 0f64), |(lo, hi), e| {
                (lo.min(e.unit), hi.max(e.unit))
            });
            self.digit_counts.push(digits);
            self.unit_ranges.push(units);
        }
        true
    }
}

impl RowBlock {
    /// Set from an act-quantised block's reduced integers (so that the digits carry only the
    /// values' own spread).
    fn set(&mut self, (x, unit): ([i32; BLOCK], f64)) {
        self.unit = unit;
        self.unit_f32 = unit as f32;
        let mut sum = 0i32;
        let mut used = 1;
        for (k, &v) in x.iter().enumerate() {
            sum += v;
            let (d, needed) = balanced_digits(v);
            for (digits, d) in self.digits.iter_mut().zip(d) {
                digits[k] = d;
            }
            used = used.max(needed);
        }
        // |Σ X| < 32 · 2^19: the product stays below 2^28.
        self.offset = -W_OFFSET * sum;
        self.digit_count = used;
    }
}

#[cfg(target_arch = "x86_64")]
pub use kernel::fp4_c1_rows;
#[cfg(target_arch = "x86_64")]
pub(in crate::model::simd) use kernel::{
    f32_steps_exact, scale_range, scaled_block_sums, scaled_f64_sums, LaneSteps,
};

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::check_prefill_rows;
    use super::super::vnni::TWICE_E2M1;
    use super::{ActDigits, LaneUnits, RowBlock, BLOCK, W_OFFSET, W_ROWS};
    use crate::dtype::e8m0_to_f64;
    use std::arch::x86_64::*;

    /// Powers of two for which `f32(S) · step` is `f32(S · step)` for every |S| < 2^28: the
    /// product neither overflows nor leaves the normal range, where rounding commutes with
    /// the power of two.
    const F32_STEPS: (f64, f64) = (1.0 / (1u128 << 126) as f64, (1u128 << 100) as f64);

    /// Whether f32 steps give the f64 steps' values for inputs whose units lie in `units` and
    /// weights whose scales lie in `scales`: every unit and every product of the two inside
    /// [`F32_STEPS`].
    #[inline(always)]
    pub(in crate::model::simd) fn f32_steps_exact(units: (f64, f64), scales: (f64, f64)) -> bool {
        F32_STEPS.0 <= units.0
            && units.1 <= F32_STEPS.1
            && F32_STEPS.0 <= scales.0 * units.0
            && scales.1 * units.1 <= F32_STEPS.1
    }

    /// The least and the largest of `scales` (a loop: a fold's closure was compiled out of
    /// line, a call per block).
    #[inline(always)]
    pub(in crate::model::simd) fn scale_range(scales: &[f64]) -> (f64, f64) {
        let (mut lo, mut hi) = (f64::INFINITY, 0f64);
        for &s in scales {
            (lo, hi) = (lo.min(s), hi.max(s));
        }
        (lo, hi)
    }

    impl LaneUnits {
        /// Each lane's step `step · u`, in f32 where `f32` (the caller checked
        /// [`f32_steps_exact`] for its steps), else in f64.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F.
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn steps(&self, step: f64, f32: bool) -> Steps {
            if f32 {
                let units = _mm512_loadu_ps(self.units_f32.as_ptr());
                return Steps::F32(_mm512_mul_ps(units, _mm512_set1_ps(step as f32)));
            }
            let (lo, hi) = self.f64_steps(step);
            Steps::F64(lo, hi)
        }

        /// Each lane's step `step · u` in f64 (low and high eight lanes).
        ///
        /// # Safety
        /// The CPU must have AVX-512 F.
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn f64_steps(&self, step: f64) -> (__m512d, __m512d) {
            let s = _mm512_set1_pd(step);
            (
                _mm512_mul_pd(_mm512_loadu_pd(self.units.as_ptr()), s),
                _mm512_mul_pd(_mm512_loadu_pd(self.units[8..].as_ptr()), s),
            )
        }

        /// The least and the largest unit of the rows present.
        pub(in crate::model::simd) fn range(&self) -> (f64, f64) {
            self.range
        }
    }

    /// The power-of-two step of sixteen exact block sums, as f32 where every step and factor
    /// lies inside [`F32_STEPS`], else as f64 (low and high eight lanes).
    #[derive(Clone, Copy)]
    pub(in crate::model::simd) enum Steps {
        F32(__m512),
        F64(__m512d, __m512d),
    }

    /// One block's steps of sixteen weight rows (one per lane): as f64 (low and high eight
    /// lanes) and as f32, and whether f32 steps give the f64 steps' values for every input
    /// row of the block ([`f32_steps_exact`]).
    #[derive(Clone, Copy)]
    pub(in crate::model::simd) struct LaneSteps {
        lo: __m512d,
        hi: __m512d,
        f32: __m512,
        f32_exact: bool,
    }

    impl LaneSteps {
        /// From the f64 steps, each a power of two that f32 holds (2^−149 up to 2^127).
        ///
        /// # Safety
        /// The CPU must have AVX-512 F and DQ.
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn new(
            (lo, hi): (__m512d, __m512d),
            f32_exact: bool,
        ) -> LaneSteps {
            let f32 = _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm512_cvtpd_ps(lo)),
                _mm512_cvtpd_ps(hi),
            );
            LaneSteps {
                lo,
                hi,
                f32,
                f32_exact,
            }
        }

        /// The steps for an input row of unit u (`unit_f32`, u as f32): in f32 where exact.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F.
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn times(&self, unit: f64, unit_f32: f32) -> Steps {
            if self.f32_exact {
                return Steps::F32(_mm512_mul_ps(self.f32, _mm512_set1_ps(unit_f32)));
            }
            let (lo, hi) = self.times_f64(unit);
            Steps::F64(lo, hi)
        }

        /// The steps for an input row of unit u, in f64.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F.
        #[inline(always)]
        pub(in crate::model::simd) unsafe fn times_f64(&self, unit: f64) -> (__m512d, __m512d) {
            let unit = _mm512_set1_pd(unit);
            (_mm512_mul_pd(self.lo, unit), _mm512_mul_pd(self.hi, unit))
        }
    }

    /// `f32(S · step)` for sixteen exact block sums S (|S| < 2^28): with f32 steps, S rounds
    /// to f32 first, which the power of two then scales exactly.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and DQ.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn scaled_block_sums(s: __m512i, steps: Steps) -> __m512 {
        match steps {
            Steps::F32(step) => _mm512_mul_ps(_mm512_cvtepi32_ps(s), step),
            Steps::F64(lo, hi) => scaled_f64_sums(
                (
                    _mm512_cvtepi32_pd(_mm512_castsi512_si256(s)),
                    _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(s)),
                ),
                (lo, hi),
            ),
        }
    }

    /// `f32(S · step)` for sixteen exact sums S held in f64 (low and high eight lanes) and
    /// their f64 steps: one product and one rounding each.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and DQ.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn scaled_f64_sums(
        (lo, hi): (__m512d, __m512d),
        (step_lo, step_hi): (__m512d, __m512d),
    ) -> __m512 {
        _mm512_insertf32x8::<1>(
            _mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_mul_pd(lo, step_lo))),
            _mm512_cvtpd_ps(_mm512_mul_pd(hi, step_hi)),
        )
    }

    /// Rule C1 of up to [`W_ROWS`] release FP4 weight rows against every input row of `acts`:
    /// `out[i · rows + m] = Σ_kb f32(scale[i][kb] · u[m][kb] · Σ_k X·W)`, added in f32 in
    /// increasing kb from +0.0. `codes[i]` is row i's packed nibbles (low nibble first) and
    /// `scales[i]` its E8M0 bytes, one per block.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, DQ, VL, VBMI and VNNI. The rows and scales must hold
    /// the blocks of `acts`, every scale byte must keep f32 finite (`SAFE_SCALE_BYTE` in
    /// `matvec`), at most [`W_ROWS`] rows, `out` `rows` per row.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512vnni,avx2")]
    pub unsafe fn fp4_c1_rows(
        out: &mut [f32],
        acts: &ActDigits,
        codes: &[&[u8]],
        scales: &[&[u8]],
    ) {
        let (rows, blocks) = (acts.rows, acts.blocks);
        check_prefill_rows(out, rows, blocks, (codes, BLOCK / 2), scales, W_ROWS);
        let nw = codes.len();
        // Row m's sixteen sums, in f32 from +0.0.
        let mut sums = vec![_mm512_setzero_ps(); rows];
        for kb in 0..blocks {
            let weights = weight_columns(codes, kb);
            let scale: [f64; W_ROWS] =
                std::array::from_fn(|i| scales.get(i).map_or(0.0, |s| e8m0_to_f64(s[kb])));

            // Each an f32 value: a scale byte up to 245 (2^−127 a subnormal one).
            let block = LaneSteps::new(
                (
                    _mm512_loadu_pd(scale.as_ptr()),
                    _mm512_loadu_pd(scale[8..].as_ptr()),
                ),
                f32_steps_exact(acts.unit_ranges[kb], scale_range(&scale[..nw])),
            );
            let entries = &acts.entries[kb * rows..][..rows];
            match acts.digit_counts[kb] {
                1 => rows_block::<1>(&mut sums, entries, &weights, &block),
                2 => rows_block::<2>(&mut sums, entries, &weights, &block),
                _ => rows_block::<3>(&mut sums, entries, &weights, &block),
            }
        }
        for (m, s) in sums.iter().enumerate() {
            let mut lanes = [0f32; W_ROWS];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *s);
            for (i, &v) in lanes[..nw].iter().enumerate() {
                out[i * rows + m] = v;
            }
        }
    }

    /// `vpermt2d` indices gathering, from two quads of rows (row 4q + l's dword j at 4l + j,
    /// the second quad from 16), dword j of all eight rows then dword j + 1: j = 0, then 2.
    static GATHER_DWORDS: [[i32; 16]; 2] = {
        let mut t = [[0; 16]; 2];
        let mut p = 0;
        while p < 32 {
            let (j, r) = (2 * (p / 16) + (p % 16) / 8, p % 8);
            t[p / 16][p % 16] = (r / 4 * 16 + 4 * (r % 4) + j) as i32;
            p += 1;
        }
        t
    };

    /// Add block `entries` (one per input row) of the weight rows in `w` to `sums`, with `D`
    /// digits per input value.
    #[inline(always)]
    unsafe fn rows_block<const D: usize>(
        sums: &mut [__m512],
        entries: &[RowBlock],
        w: &[__m512i; 8],
        scales: &LaneSteps,
    ) {
        for (sum, e) in sums.iter_mut().zip(entries) {
            let mut acc = [_mm512_setzero_si512(); D];
            acc[0] = _mm512_set1_epi32(e.offset);
            for (a, digits) in acc.iter_mut().zip(&e.digits) {
                let columns = digits.as_ptr().cast::<i32>();
                for (c, &wc) in w.iter().enumerate() {
                    let x = _mm512_set1_epi32(columns.add(c).read_unaligned());
                    *a = _mm512_dpbusd_epi32(*a, wc, x);
                }
            }
            // Wrapping adds: each digit sum times its power of 256 may leave 32 bits, their
            // total (the exact block sum) does not.
            let mut s = acc[0];
            if D >= 2 {
                s = _mm512_add_epi32(s, _mm512_slli_epi32::<8>(acc[1]));
            }
            if D >= 3 {
                s = _mm512_add_epi32(s, _mm512_slli_epi32::<16>(acc[2]));
            }
            *sum = _mm512_add_ps(*sum, scaled_block_sums(s, scales.times(e.unit, e.unit_f32)));
        }
    }

    /// Block kb of up to sixteen rows of packed nibbles as eight vectors, vector c holding in
    /// lane i the bytes `W + 12` of row i at columns `4c .. 4c + 4` (rows past the end
    /// zero codes, whose sums are never read).
    #[inline(always)]
    unsafe fn weight_columns(codes: &[&[u8]], kb: usize) -> [__m512i; 8] {
        // Within each row's 16 bytes, dword j gathers bytes 2j, 2j+1 (columns 4j .. 4j + 4)
        // and 2j+8, 2j+9 (columns 16 + 4j ..).
        let pick = _mm512_broadcast_i32x4(_mm_setr_epi8(
            0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
        ));
        let mut quads = [_mm512_setzero_si512(); 4];
        for (q, quad) in quads.iter_mut().enumerate() {
            let z = _mm512_castsi128_si512(packed_row(codes, 4 * q, kb));
            let z = _mm512_inserti32x4::<1>(z, packed_row(codes, 4 * q + 1, kb));
            let z = _mm512_inserti32x4::<2>(z, packed_row(codes, 4 * q + 2, kb));
            let z = _mm512_inserti32x4::<3>(z, packed_row(codes, 4 * q + 3, kb));
            *quad = _mm512_shuffle_epi8(z, pick);
        }
        // Quad q holds row 4q + l's dword j at 4l + j. Gather dword j (and j + 1) of eight
        // rows, then join the two halves of the sixteen rows.
        let (i01, i23) = (
            _mm512_loadu_si512(GATHER_DWORDS[0].as_ptr().cast()),
            _mm512_loadu_si512(GATHER_DWORDS[1].as_ptr().cast()),
        );
        let top01 = _mm512_permutex2var_epi32(quads[0], i01, quads[1]);
        let top23 = _mm512_permutex2var_epi32(quads[0], i23, quads[1]);
        let low01 = _mm512_permutex2var_epi32(quads[2], i01, quads[3]);
        let low23 = _mm512_permutex2var_epi32(quads[2], i23, quads[3]);
        let dwords = [
            _mm512_shuffle_i64x2::<0x44>(top01, low01),
            _mm512_shuffle_i64x2::<0xEE>(top01, low01),
            _mm512_shuffle_i64x2::<0x44>(top23, low23),
            _mm512_shuffle_i64x2::<0xEE>(top23, low23),
        ];
        // Nibbles at bit offsets 0, 4, 8, 12 of each dword are columns 4j .. 4j + 4, at 16 ..
        // 28 columns 16 + 4j ..; the byte table reads a byte's low six bits, repeating every
        // sixteen entries, so the neighbouring nibble's bits do not matter.
        let low = _mm512_set1_epi64(0x2C28_2420_0C08_0400);
        let high = _mm512_set1_epi64(0x3C38_3430_1C18_1410);
        let table = _mm512_add_epi8(
            _mm512_loadu_si512(TWICE_E2M1.as_ptr().cast()),
            _mm512_set1_epi8(W_OFFSET as i8),
        );
        let mut w = [_mm512_setzero_si512(); 8];
        for (j, &d) in dwords.iter().enumerate() {
            w[j] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(low, d), table);
            w[j + 4] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(high, d), table);
        }
        w
    }

    /// Block kb of row i's packed nibbles (zero past the last row). A function, not a
    /// closure: a closure's body would not be inlined into the kernel's vector code.
    #[inline(always)]
    unsafe fn packed_row(codes: &[&[u8]], i: usize, kb: usize) -> __m128i {
        match codes.get(i) {
            Some(c) => _mm_loadu_si128(c[kb * BLOCK / 2..][..BLOCK / 2].as_ptr().cast()),
            None => _mm_setzero_si128(),
        }
    }
}
