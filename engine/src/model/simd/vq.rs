//! Decode loops over container VQ rows (CONTAINER.md §4.2; MODEL.md §5.4) with AVX-512 or
//! AVX2: 32 rows of one 64-row index band, their vectors decoded straight into the reduction.
//!
//! A weight is `f32(scale · (((0 + e_0) + e_1) + …))`, the stages' f16 codebook entries
//! (widened to f32) added in f32 in stage order, as `checkpoint::vq_vector` computes it; each
//! row's vector is one 8-lane f32 sum. Eight rows' vectors are transposed in registers into
//! eight columns of one value per row, widened to f64 and multiplied into the rows' chains,
//! one multiply-add per column in increasing k: the chains of the generic kernels, bit for
//! bit. The band layout puts the 32 rows' indices of a vector side by side (one run of
//! bytes), so a vector's indices arrive in one or two cache lines, and the four groups of
//! eight rows are independent chains (four vectors of eight with AVX-512, eight of four with
//! AVX2, [`RowChains`]), which hides the multiply-add latency.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::{load_chains, store_chains};
use super::x86::columns8;
use crate::checkpoint::{vq_indices, VQ_ROW_BAND, VQ_WIDTH};

/// Rows per loop: half an index band.
pub const VQ_RUN_ROWS: usize = 32;

/// Vectors ahead of the one in use at which the loops ask for a vector's indices.
const INDEX_AHEAD: usize = 8;

/// 32 rows of a VQ matrix inside one index band, as the loops read them: `S` stages of `E`
/// entries each; four six-bit indices in three bytes when `PACKED` (VQ4P), else one byte per
/// stage.
#[derive(Clone, Copy)]
pub struct VqRun<'a, const S: usize, const E: usize, const PACKED: bool> {
    pub books: [&'a [[f32; VQ_WIDTH]; E]; S],
    /// The matrix's index bytes.
    pub indices: &'a [u8],
    /// Where the rows' run of indices for vector 0 starts in `indices`; vector v's run is a
    /// band's vector further on each (`first + v · STRIDE`).
    pub first: usize,
    /// The rows' scales, as f32.
    pub scales: &'a [f32; VQ_RUN_ROWS],
}

impl<const S: usize, const E: usize, const PACKED: bool> VqRun<'_, S, E, PACKED> {
    /// Index bytes per vector of one row.
    const BYTES: usize = if PACKED { 3 } else { S };
    /// Index bytes per vector of a whole band (CONTAINER.md §4.2: `[N/8][64 rows][bytes]`).
    const STRIDE: usize = VQ_ROW_BAND * Self::BYTES;
}

/// The 32 rows' f64 chains in registers, as one vector per group of eight rows (AVX-512) or
/// two (AVX2): how a column of a group's eight f32 values is multiplied into them. Inlined
/// into the loops, which have the target features (the methods' safety condition: the CPU
/// has the implementing vectors' features).
trait RowChains: Copy {
    /// All chains at `acc`.
    unsafe fn load(acc: &[f64; VQ_RUN_ROWS]) -> Self;
    /// Every chain from +0.0.
    unsafe fn zero() -> Self;
    unsafe fn store(self, acc: &mut [f64; VQ_RUN_ROWS]);
    /// Group g's chains: `chain = fma(x, f64(column), chain)`, row by row.
    unsafe fn step(&mut self, g: usize, x: f64, column: __m256);
    /// Group g's chains rounded to f32.
    unsafe fn rounded(&self, g: usize) -> __m256;
}

impl RowChains for [__m512d; 4] {
    #[inline(always)]
    unsafe fn load(acc: &[f64; VQ_RUN_ROWS]) -> Self {
        load_chains(acc)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        [_mm512_setzero_pd(); 4]
    }
    #[inline(always)]
    unsafe fn store(self, acc: &mut [f64; VQ_RUN_ROWS]) {
        store_chains(acc, self);
    }
    #[inline(always)]
    unsafe fn step(&mut self, g: usize, x: f64, column: __m256) {
        self[g] = _mm512_fmadd_pd(_mm512_set1_pd(x), _mm512_cvtps_pd(column), self[g]);
    }
    #[inline(always)]
    unsafe fn rounded(&self, g: usize) -> __m256 {
        _mm512_cvtpd_ps(self[g])
    }
}

impl RowChains for [__m256d; 8] {
    #[inline(always)]
    unsafe fn load(acc: &[f64; VQ_RUN_ROWS]) -> Self {
        std::array::from_fn(|h| _mm256_loadu_pd(acc[4 * h..].as_ptr()))
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        [_mm256_setzero_pd(); 8]
    }
    #[inline(always)]
    unsafe fn store(self, acc: &mut [f64; VQ_RUN_ROWS]) {
        for (h, chain) in self.into_iter().enumerate() {
            _mm256_storeu_pd(acc[4 * h..].as_mut_ptr(), chain);
        }
    }
    #[inline(always)]
    unsafe fn step(&mut self, g: usize, x: f64, column: __m256) {
        let x = _mm256_set1_pd(x);
        let (low, high) = (
            _mm256_castps256_ps128(column),
            _mm256_extractf128_ps::<1>(column),
        );
        self[2 * g] = _mm256_fmadd_pd(x, _mm256_cvtps_pd(low), self[2 * g]);
        self[2 * g + 1] = _mm256_fmadd_pd(x, _mm256_cvtps_pd(high), self[2 * g + 1]);
    }
    #[inline(always)]
    unsafe fn rounded(&self, g: usize) -> __m256 {
        let (low, high) = (
            _mm256_cvtpd_ps(self[2 * g]),
            _mm256_cvtpd_ps(self[2 * g + 1]),
        );
        _mm256_set_m128(high, low)
    }
}

/// Rule C2: every row's chain `acc[i]` advanced over vectors `vectors` (columns `8v ..
/// 8v + 8` each, `x` from column 0), in increasing k.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VBMI, AVX2 and FMA; `x` must hold the vectors'
/// columns and `indices` their runs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn vq_c2_run32<const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f64; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    vectors: Range<usize>,
) {
    c2_run::<[__m512d; 4], S, E, PACKED>(acc, x, rows, vectors);
}

/// [`vq_c2_run32`] with AVX2.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; as for [`vq_c2_run32`] otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vq_c2_run32_avx2<const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f64; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    vectors: Range<usize>,
) {
    c2_run::<[__m256d; 8], S, E, PACKED>(acc, x, rows, vectors);
}

#[inline(always)]
unsafe fn c2_run<C: RowChains, const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f64; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    vectors: Range<usize>,
) {
    let mut chains = C::load(acc);
    let mut columns: GroupColumns = [[_mm256_setzero_ps(); VQ_WIDTH]; VQ_RUN_ROWS / 8];
    for v in vectors {
        advance(&mut chains, x, rows, v, &mut columns);
    }
    chains.store(acc);
}

/// Rule C1 as the generic kernels apply it to VQ rows: each 32-column block (`blocks`, four
/// vectors each) one chain from +0.0, rounded to f32 and added to `acc[i]` in f32.
///
/// # Safety
/// As for [`vq_c2_run32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn vq_c1_run32<const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f32; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    blocks: Range<usize>,
) {
    c1_run::<[__m512d; 4], S, E, PACKED>(acc, x, rows, blocks);
}

/// [`vq_c1_run32`] with AVX2.
///
/// # Safety
/// As for [`vq_c2_run32_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vq_c1_run32_avx2<const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f32; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    blocks: Range<usize>,
) {
    c1_run::<[__m256d; 8], S, E, PACKED>(acc, x, rows, blocks);
}

#[inline(always)]
unsafe fn c1_run<C: RowChains, const S: usize, const E: usize, const PACKED: bool>(
    acc: &mut [f32; VQ_RUN_ROWS],
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    blocks: Range<usize>,
) {
    const VECTORS: usize = crate::model::quant::BLOCK / VQ_WIDTH;
    let mut totals = [_mm256_setzero_ps(); 4];
    for (g, total) in totals.iter_mut().enumerate() {
        *total = _mm256_loadu_ps(acc[8 * g..].as_ptr());
    }
    let mut columns: GroupColumns = [[_mm256_setzero_ps(); VQ_WIDTH]; VQ_RUN_ROWS / 8];
    for kb in blocks {
        let mut chains = C::zero();
        for v in kb * VECTORS..(kb + 1) * VECTORS {
            advance(&mut chains, x, rows, v, &mut columns);
        }
        for (g, total) in totals.iter_mut().enumerate() {
            *total = _mm256_add_ps(*total, chains.rounded(g));
        }
    }
    for (g, total) in totals.iter().enumerate() {
        _mm256_storeu_ps(acc[8 * g..].as_mut_ptr(), *total);
    }
}

/// Every group's eight columns of a vector (`advance`'s scratch, made once per loop: zero-filled
/// per vector it was a 1 KiB memset each).
type GroupColumns = [[__m256; VQ_WIDTH]; VQ_RUN_ROWS / 8];

/// The four groups' chains advanced over vector `v`'s eight columns, the groups' columns made
/// into `columns` first. Inlined into the loops, which have the target features.
#[inline(always)]
unsafe fn advance<C: RowChains, const S: usize, const E: usize, const PACKED: bool>(
    chains: &mut C,
    x: &[f64],
    rows: VqRun<S, E, PACKED>,
    v: usize,
    columns: &mut GroupColumns,
) {
    let bytes = VqRun::<S, E, PACKED>::BYTES;
    let stride = VqRun::<S, E, PACKED>::STRIDE;
    let at = rows.first + v * stride;
    let ahead = at + INDEX_AHEAD * stride;
    let mut line = ahead;
    while line < ahead + VQ_RUN_ROWS * bytes {
        if let Some(b) = rows.indices.get(line) {
            // SAFETY: a prefetch has no architectural effect, and the address is in the
            // indices.
            _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(b).cast());
        }
        line += 64;
    }
    let run = &rows.indices[at..at + VQ_RUN_ROWS * bytes];
    let xs: &[f64; VQ_WIDTH] = x[VQ_WIDTH * v..][..VQ_WIDTH].try_into().expect("vector");
    // Every group's columns first, then all chains column by column: each column's four
    // groups are independent multiply-adds, and the columns wait in memory, not the chains.
    for (g, group) in columns.iter_mut().enumerate() {
        *group = group_columns(rows, run, g);
    }
    for (c, &xc) in xs.iter().enumerate() {
        for (g, group) in columns.iter().enumerate() {
            chains.step(g, xc, group[c]);
        }
    }
}

/// Group `g`'s eight rows' vectors (from their run of indices `run`) as eight columns of
/// one value per row.
#[inline(always)]
unsafe fn group_columns<const S: usize, const E: usize, const PACKED: bool>(
    rows: VqRun<S, E, PACKED>,
    run: &[u8],
    g: usize,
) -> [__m256; 8] {
    let bytes = VqRun::<S, E, PACKED>::BYTES;
    let mut values = [_mm256_setzero_ps(); 8];
    for (i, value) in values.iter_mut().enumerate() {
        let row = 8 * g + i;
        let index = stage_indices::<S, PACKED>(&run[row * bytes..][..bytes]);
        let mut sum = _mm256_setzero_ps();
        for (book, &e) in rows.books.iter().zip(&index) {
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(book[e].as_ptr()));
        }
        *value = _mm256_mul_ps(_mm256_set1_ps(rows.scales[row]), sum);
    }
    columns8(values)
}

/// The `S` stage indices of one row's vector.
#[inline(always)]
fn stage_indices<const S: usize, const PACKED: bool>(b: &[u8]) -> [usize; S] {
    let mut index = [0; S];
    if PACKED {
        index.copy_from_slice(&vq_indices(b, true)[..S]);
    } else {
        for (ix, &byte) in index.iter_mut().zip(b) {
            *ix = usize::from(byte);
        }
    }
    index
}
