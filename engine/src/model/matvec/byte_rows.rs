//! The rows the AVX-512 kernels read (MODEL.md §5.4; rule C2, one chain per lane, and rule
//! C1's block sums): one enum over every stored form they serve, so the row walks of
//! `MatVec::c2_rows8` and `MatVec::c1_byte_rows8`, and a prefill's eight-row block decode
//! (`ByteRows::columns8`), are written once.

use super::{eight, release_scales8, BLOCK, TILE};
use crate::checkpoint::{DenseDtype, QuantKind, QuantView, VqView, WeightView, VQ_WIDTH};
use crate::dtype::f16_to_f32;
use crate::model::simd;
use crate::model::simd::avx512::F32Rows;

/// Weight rows the AVX-512 C2 kernels read: release FP8/FP4 codes with E8M0 scales,
/// container Q8G/Q4G codes whose f16 groups are whole 32-column blocks, container VQ
/// vectors, or bf16 / f32 rows.
#[derive(Clone, Copy)]
pub(super) enum ByteRows<'a> {
    Quant(QuantView<'a>),
    Vq(VqView<'a>),
    /// `bf16` or f32 little-endian rows of `cols` values.
    Dense {
        bf16: bool,
        cols: usize,
        bytes: &'a [u8],
    },
    Grouped(GroupedRows<'a>),
}

/// Eight rows' VQ vectors over one block, decoded by [`ByteRows::block8`]: the caller's, one
/// per task, since zeroing a fresh one per block cost a tenth of a container decode.
pub(super) type VqBlock = [[f32; BLOCK]; TILE];

/// Container Q8G / Q4G rows whose f16 groups are whole 32-column blocks.
#[derive(Clone, Copy)]
pub(super) struct GroupedRows<'a> {
    bits: u8,
    group: usize,
    groups: usize,
    row_bytes: usize,
    codes: &'a [u8],
    scales: &'a [u8],
}

impl<'a> GroupedRows<'a> {
    /// Row `r`'s f16 group scales (two bytes per group, group 0 first).
    #[inline(always)]
    fn scale_row(&self, r: usize) -> &'a [u8] {
        &self.scales[2 * r * self.groups..][..2 * self.groups]
    }

    /// The f16 scales of the group holding column `k0`, for rows `r .. r + 8`, as f64.
    #[inline(always)]
    fn scales8(&self, r: usize, k0: usize) -> [f64; TILE] {
        let g = k0 / self.group;
        eight(
            #[inline(always)]
            |i| {
                let at = 2 * ((r + i) * self.groups + g);
                f64::from(f16_to_f32(u16::from_le_bytes([
                    self.scales[at],
                    self.scales[at + 1],
                ])))
            },
        )
    }
}

impl<'a> ByteRows<'a> {
    pub(super) fn of(view: WeightView<'a>) -> Option<Self> {
        match view {
            WeightView::Quant(v) => Some(ByteRows::Quant(v)),
            WeightView::Vq(v) => Some(ByteRows::Vq(v)),
            WeightView::Dense {
                dtype, cols, bytes, ..
            } if dtype != DenseDtype::F16 => Some(ByteRows::Dense {
                bf16: dtype == DenseDtype::Bf16,
                cols,
                bytes,
            }),
            WeightView::Grouped {
                bits,
                cols,
                group,
                row_bytes,
                codes,
                scales,
                ..
            } if group.is_multiple_of(BLOCK) => Some(ByteRows::Grouped(GroupedRows {
                bits,
                group,
                groups: cols.div_ceil(group),
                row_bytes,
                codes,
                scales,
            })),
            _ => None,
        }
    }

    /// Whether a byte holds two weights.
    #[inline(always)]
    pub(super) fn packed(&self) -> bool {
        match self {
            ByteRows::Quant(v) => v.kind == QuantKind::Fp4,
            ByteRows::Grouped(g) => g.bits == 4,
            ByteRows::Vq(_) | ByteRows::Dense { .. } => false,
        }
    }

    /// Byte offset of column `k` in a row.
    #[inline(always)]
    pub(super) fn offset(&self, k: usize) -> usize {
        match *self {
            ByteRows::Dense { bf16, .. } => k * if bf16 { 2 } else { 4 },
            _ if self.packed() => k / 2,
            _ => k,
        }
    }

    /// The stored bytes of weight row `r`, where a row is contiguous (not VQ's banded
    /// indices).
    #[inline(always)]
    pub(super) fn row(&self, r: usize) -> &'a [u8] {
        match *self {
            ByteRows::Quant(v) => {
                let n = if v.kind == QuantKind::Fp4 {
                    v.cols / 2
                } else {
                    v.cols
                };
                &v.codes[r * n..][..n]
            }
            ByteRows::Grouped(g) => &g.codes[r * g.row_bytes..][..g.row_bytes],
            ByteRows::Vq(_) => &[],
            ByteRows::Dense { cols, bytes, .. } => {
                let n = self.offset(cols);
                &bytes[r * n..][..n]
            }
        }
    }

    /// The f16 group scales of container Q4G rows `r .. r + 8` for the VNNI nibble loop,
    /// where groups are whole column blocks; `None` for other rows.
    #[inline(always)]
    pub(super) fn nibble_scales(&self, r: usize) -> Option<simd::vnni::NibbleScales<'a>> {
        match *self {
            ByteRows::Grouped(g) if g.bits == 4 => Some(simd::vnni::NibbleScales::Q4 {
                rows: eight(
                    #[inline(always)]
                    |i| g.scale_row(r + i),
                ),
                blocks_per_group: g.group / BLOCK,
            }),
            _ => None,
        }
    }

    /// Container Q8G / Q4G rows `r .. r + 32` for the 32-row C2 loop, where groups are
    /// whole column blocks; `None` for other rows.
    #[inline(always)]
    pub(super) fn int_rows32(&self, r: usize) -> Option<simd::avx512::IntRows32<'a>> {
        let ByteRows::Grouped(g) = *self else {
            return None;
        };
        Some(simd::avx512::IntRows32 {
            nibbles: g.bits == 4,
            scales: std::array::from_fn(|i| g.scale_row(r + i)),
            blocks_per_group: g.group / BLOCK,
        })
    }

    /// The stored bytes of rows `r .. r + n` where rows are contiguous, cut at the end of the
    /// weight (none for VQ's banded indices).
    #[inline(always)]
    pub(super) fn rows_span(&self, r: usize, n: usize) -> &'a [u8] {
        let (bytes, stride) = match *self {
            ByteRows::Quant(v) => (v.codes, self.offset(v.cols)),
            ByteRows::Grouped(g) => (g.codes, g.row_bytes),
            ByteRows::Vq(_) => return &[],
            ByteRows::Dense { bytes, cols, .. } => (bytes, self.offset(cols)),
        };
        let from = (r * stride).min(bytes.len());
        &bytes[from..(from + n * stride).min(bytes.len())]
    }

    /// The 32 bytes at `at` of eight rows.
    #[inline(always)]
    pub(super) fn byte_blocks<'r>(rows: &[&'r [u8]; TILE], at: usize) -> [&'r [u8; BLOCK]; TILE] {
        eight(
            #[inline(always)]
            |i| rows[i][at..][..BLOCK].try_into().expect("block"),
        )
    }

    /// The 16 bytes (32 packed values) at `at` of eight rows.
    #[inline(always)]
    pub(super) fn packed_blocks<'r>(
        rows: &[&'r [u8]; TILE],
        at: usize,
    ) -> [&'r [u8; BLOCK / 2]; TILE] {
        eight(
            #[inline(always)]
            |i| rows[i][at..][..BLOCK / 2].try_into().expect("half block"),
        )
    }

    /// Rows `r .. r + 8` of the full block at `k0` into columns `i .. i + 8` of a
    /// column-major block (a prefill task's weights), the f64 values the generic row decoder
    /// gives; `false`, nothing written, where that decoder takes the block: release codes
    /// with a scale that could overflow f32 or a NaN code, group scales that are not finite,
    /// and bf16 / f32 rows.
    ///
    /// Only called where the CPU has AVX-512 (F, BW, VL, VBMI).
    #[inline(always)]
    pub(super) fn columns8<const W: usize>(
        &self,
        r: usize,
        k0: usize,
        w: &mut [[f64; W]; BLOCK],
        i: usize,
    ) -> bool {
        let rows: [&[u8]; TILE] = eight(
            #[inline(always)]
            |j| self.row(r + j),
        );
        let at = self.offset(k0);
        match *self {
            ByteRows::Quant(v) => {
                let Some(s) = release_scales8(&v, r, k0) else {
                    return false;
                };
                if self.packed() {
                    // SAFETY: the caller's CPU has AVX-512.
                    unsafe { simd::avx512::fp4_columns(Self::packed_blocks(&rows, at), &s, w, i) };
                    true
                } else {
                    // SAFETY: as above.
                    unsafe { simd::avx512::fp8_columns(Self::byte_blocks(&rows, at), &s, w, i) }
                }
            }
            ByteRows::Grouped(g) => {
                let s = g.scales8(r, k0);
                if !s.iter().all(|v| v.is_finite()) {
                    return false;
                }
                if self.packed() {
                    // SAFETY: as above.
                    unsafe { simd::avx512::q4_columns(Self::packed_blocks(&rows, at), &s, w, i) };
                } else {
                    // SAFETY: as above.
                    unsafe { simd::avx512::q8_columns(Self::byte_blocks(&rows, at), &s, w, i) };
                }
                true
            }
            ByteRows::Vq(v) => {
                let mut values: VqBlock = [[0.0; BLOCK]; TILE];
                v.vectors(r, k0 / VQ_WIDTH, &mut values);
                for (j, row) in values.iter().enumerate() {
                    for (wk, &x) in w.iter_mut().zip(row) {
                        wk[i + j] = f64::from(x);
                    }
                }
                true
            }
            ByteRows::Dense { .. } => false,
        }
    }

    /// One C1 step of rows `r .. r + 8` over the full block at `k0`: `acc[i] += f32(P_i)`.
    /// (With the input's integer blocks, Q4G rows take the VNNI nibble loop instead, which
    /// leaves only the blocks whose scales this step declines too.)
    /// Container Q8G/Q4G codes sum exactly (see `simd::avx512::q8_c1_block8`); VQ vectors and
    /// bf16 / f32 rows are not on a grid whose sums are exact, so each block is one chain
    /// from +0.0 in increasing k (the C2 kernel from zero), as the generic block sum adds it.
    /// `false`, nothing changed, for release codes (their own kernels serve them) and where
    /// the kernel leaves the block to the generic decode.
    ///
    /// Only called at [`Level::Avx512`](simd::Level::Avx512).
    #[inline(always)]
    pub(super) fn c1_block8(
        &self,
        rows: &[&[u8]; TILE],
        r: usize,
        k0: usize,
        x: &[f64; BLOCK],
        acc: &mut [f32; TILE],
        values: &mut VqBlock,
    ) -> bool {
        match *self {
            ByteRows::Grouped(g) => {
                let s = g.scales8(r, k0);
                if !s.iter().all(|v| v.is_finite()) {
                    return false;
                }
                let at = self.offset(k0);
                if self.packed() {
                    let rows = Self::packed_blocks(rows, at);
                    // SAFETY: only reached from `task_avx512`.
                    unsafe { simd::avx512::q4_c1_block8(acc, x, rows, &s) };
                } else {
                    // SAFETY: as above.
                    unsafe { simd::avx512::q8_c1_block8(acc, x, Self::byte_blocks(rows, at), &s) };
                }
                true
            }
            ByteRows::Vq(_) | ByteRows::Dense { .. } => {
                let mut sums = [0.0f64; TILE];
                if !self.block8(rows, r, k0, x, &mut sums, values) {
                    return false;
                }
                for (a, &p) in acc.iter_mut().zip(&sums) {
                    *a += p as f32;
                }
                true
            }
            ByteRows::Quant(_) => false,
        }
    }

    /// One C2 step of rows `r .. r + 8` (their bytes `rows`, from [`Self::row`]) over the
    /// full block at `k0`; `false`, nothing changed, where the kernel leaves the block to the
    /// generic decode.
    ///
    /// Only called at [`Level::Avx512`].
    #[inline(always)]
    pub(super) fn block8(
        &self,
        rows: &[&[u8]; TILE],
        r: usize,
        k0: usize,
        x: &[f64; BLOCK],
        chains: &mut [f64; TILE],
        values: &mut VqBlock,
    ) -> bool {
        let at = self.offset(k0);
        match *self {
            ByteRows::Dense { bf16, .. } => {
                // The stored bytes, read by the kernel in place.
                let rows = if bf16 {
                    F32Rows::Bf16(eight(
                        #[inline(always)]
                        |i| rows[i][at..][..2 * BLOCK].try_into().expect("bf16 block"),
                    ))
                } else {
                    F32Rows::F32(eight(
                        #[inline(always)]
                        |i| rows[i][at..][..4 * BLOCK].try_into().expect("f32 block"),
                    ))
                };
                // SAFETY: only reached from `task_avx512`.
                unsafe { simd::avx512::f32_c2_block8(chains, x, rows) };
                true
            }
            ByteRows::Vq(v) => {
                v.vectors(r, k0 / VQ_WIDTH, values);
                // SAFETY: only reached from `task_avx512`.
                unsafe { simd::avx512::f32_c2_block8(chains, x, F32Rows::Values(values)) };
                true
            }
            ByteRows::Quant(v) => {
                let Some(s) = release_scales8(&v, r, k0) else {
                    return false;
                };
                if self.packed() {
                    let rows = Self::packed_blocks(rows, at);
                    // SAFETY: only reached from `task_avx512`.
                    unsafe { simd::avx512::fp4_c2_block8(chains, x, rows, &s) };
                    true
                } else {
                    let rows = Self::byte_blocks(rows, at);
                    // SAFETY: as above.
                    unsafe { simd::avx512::fp8_c2_block8(chains, x, rows, &s) }
                }
            }
            ByteRows::Grouped(g) => {
                let s = g.scales8(r, k0);
                if self.packed() {
                    let rows = Self::packed_blocks(rows, at);
                    // SAFETY: as above.
                    unsafe { simd::avx512::q4_c2_block8(chains, x, rows, &s) };
                } else {
                    let rows = Self::byte_blocks(rows, at);
                    // SAFETY: as above.
                    unsafe { simd::avx512::q8_c2_block8(chains, x, rows, &s) };
                }
                true
            }
        }
    }
}
