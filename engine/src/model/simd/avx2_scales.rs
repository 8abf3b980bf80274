//! The block scales the AVX2 decode kernels read (`avx2`, `avx2_digits`): release E8M0 bytes
//! or container f16 group scales, a vector of four rows' scales per block.
//!
//! A kernel takes [`Scales`] and picks the reader once per call ([`with_block_scales`]): the
//! kind is then known inside the block loop, and every row is checked once to hold the call's
//! blocks, so a block's scales are plain loads and one branch on the limits rather than a
//! bounds check, a compare and a branch per row (a tenth of the FP8 decode kernel's time
//! when they were).
//!
//! The readers fill their vectors with plain loops and methods rather than `array::from_fn`:
//! its closures are compiled apart from the kernels, without their target features, and were
//! called once per lane and block.

use std::arch::x86_64::*;

/// A block's scales for the kernels' rows.
#[derive(Clone, Copy)]
pub enum Scales<'a, const N: usize> {
    /// Release E8M0 bytes, one per row and column block (from block 0), and the largest byte
    /// taken (one whose products with every code stay finite in f32).
    E8m0 { rows: [&'a [u8]; N], limit: u8 },
    /// Container f16 group scales, two bytes per row and group (from group 0), groups of
    /// whole column blocks; only finite ones are taken.
    F16 {
        rows: [&'a [u8]; N],
        blocks_per_group: usize,
    },
}

/// Runs `$body` with `$s` bound to the reader of `$scales` (a [`BlockScales`]) checked for
/// `$blocks` column blocks: one copy of the body per scale kind.
macro_rules! with_block_scales {
    ($scales:expr, $blocks:expr, |$s:ident| $body:expr) => {
        match $scales {
            $crate::model::simd::avx2_scales::Scales::E8m0 { rows, limit } => {
                let $s = $crate::model::simd::avx2_scales::E8m0Rows::new(rows, limit, $blocks);
                $body
            }
            $crate::model::simd::avx2_scales::Scales::F16 {
                rows,
                blocks_per_group,
            } => {
                let $s =
                    $crate::model::simd::avx2_scales::F16Rows::new(rows, blocks_per_group, $blocks);
                $body
            }
        }
    };
}
pub(super) use with_block_scales;

/// A kernel's reader of its rows' block scales: a scale field per row and block, packed four
/// rows to a word and widened four at a time ([`BlockScales::vectors`]).
pub trait BlockScales<const N: usize>: Copy {
    /// Whether every scale is a power of two (E8M0).
    const POWERS_OF_TWO: bool;
    /// The width of a scale field in a packed word.
    const FIELD_BITS: usize;

    /// Where column block `kb`'s field starts in a row (once per block, not per row).
    fn position(&self, kb: usize) -> usize;

    /// Row `row`'s scale field at `at`.
    ///
    /// # Safety
    /// `row < N`, and `at` must be the position of a block below the blocks the reader was
    /// made for.
    unsafe fn field(&self, row: usize, at: usize) -> u16;

    /// Whether the kernels leave a block with this field.
    fn refuses(&self, field: u16) -> bool;

    /// Four rows' fields (row l at bit `FIELD_BITS · l`) as f64, exactly.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    unsafe fn widen(four: i64) -> __m256d;

    /// Column block `kb`'s scales as f64 (exactly), lane l of vector v from row
    /// `row_of(4v + l)` (all N rows, or some of them); `None` where the kernels leave the
    /// block.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C; `kb` must be below the blocks the reader was made
    /// for.
    #[inline(always)]
    unsafe fn vectors<const V: usize>(
        &self,
        kb: usize,
        row_of: impl Fn(usize) -> usize,
    ) -> Option<[__m256d; V]> {
        let at = self.position(kb);
        // SAFETY: the caller's conditions, and row_of gives rows below N.
        let field = |r: usize| unsafe { self.field(r, at) };
        let words = fours::<N, V>(Self::FIELD_BITS, row_of, field, |f| self.refuses(f))?;
        let mut out = [_mm256_setzero_pd(); V];
        for (o, four) in out.iter_mut().zip(words) {
            *o = Self::widen(four);
        }
        Some(out)
    }
}

/// E8M0 scale rows, each checked to hold a kernel call's blocks.
#[derive(Clone, Copy)]
pub struct E8m0Rows<const N: usize> {
    rows: [*const u8; N],
    limit: u8,
}

impl<const N: usize> E8m0Rows<N> {
    /// # Panics
    /// If a row holds fewer than `blocks` scales.
    pub fn new(rows: [&[u8]; N], limit: u8, blocks: usize) -> Self {
        Self {
            rows: checked_starts(rows, blocks, "E8M0"),
            limit,
        }
    }
}

impl<const N: usize> BlockScales<N> for E8m0Rows<N> {
    const POWERS_OF_TWO: bool = true;
    const FIELD_BITS: usize = 8;

    #[inline(always)]
    fn position(&self, kb: usize) -> usize {
        kb
    }

    #[inline(always)]
    unsafe fn field(&self, row: usize, at: usize) -> u16 {
        // SAFETY: every row holds the reader's blocks, and `at` is one of them.
        u16::from(unsafe { *self.rows[row].add(at) })
    }

    #[inline(always)]
    fn refuses(&self, byte: u16) -> bool {
        byte > u16::from(self.limit)
    }

    /// The low four bytes as E8M0 scales, 2^(b − 127) from the exponent field as
    /// `e8m0_to_f64` (bytes 1..=254).
    #[inline(always)]
    unsafe fn widen(bytes: i64) -> __m256d {
        let b = _mm256_cvtepu8_epi64(_mm_cvtsi64_si128(bytes));
        let biased = _mm256_add_epi64(b, _mm256_set1_epi64x(1023 - 127));
        _mm256_castsi256_pd(_mm256_slli_epi64::<52>(biased))
    }
}

/// f16 group scale rows, each checked to hold a kernel call's blocks.
#[derive(Clone, Copy)]
pub struct F16Rows<const N: usize> {
    rows: [*const u8; N],
    blocks_per_group: usize,
}

impl<const N: usize> F16Rows<N> {
    /// # Panics
    /// If a row holds fewer than the groups of `blocks` blocks, or a group no block.
    pub fn new(rows: [&[u8]; N], blocks_per_group: usize, blocks: usize) -> Self {
        assert!(blocks_per_group > 0, "f16 scale groups of no block");
        let groups = blocks.div_ceil(blocks_per_group);
        Self {
            rows: checked_starts(rows, 2 * groups, "f16"),
            blocks_per_group,
        }
    }
}

impl<const N: usize> BlockScales<N> for F16Rows<N> {
    const POWERS_OF_TWO: bool = false;
    const FIELD_BITS: usize = 16;

    #[inline(always)]
    fn position(&self, kb: usize) -> usize {
        2 * (kb / self.blocks_per_group)
    }

    #[inline(always)]
    unsafe fn field(&self, row: usize, at: usize) -> u16 {
        // SAFETY: every row holds the groups of the reader's blocks, and `at` starts one.
        unsafe { u16::from_le_bytes([*self.rows[row].add(at), *self.rows[row].add(at + 1)]) }
    }

    /// Only finite scales: no exponent field all ones.
    #[inline(always)]
    fn refuses(&self, half: u16) -> bool {
        half & 0x7C00 == 0x7C00
    }

    #[inline(always)]
    unsafe fn widen(halves: i64) -> __m256d {
        _mm256_cvtps_pd(_mm_cvtph_ps(_mm_cvtsi64_si128(halves)))
    }
}

/// Where the scale rows start, once each is checked to hold `bytes` bytes (`kind` names them in
/// the panic).
fn checked_starts<const N: usize>(rows: [&[u8]; N], bytes: usize, kind: &str) -> [*const u8; N] {
    for (i, row) in rows.iter().enumerate() {
        assert!(
            row.len() >= bytes,
            "{kind} scale row {i} holds {} bytes of {bytes}",
            row.len()
        );
    }
    rows.map(<[u8]>::as_ptr)
}

/// Block scale fields (`bits` wide) of four rows per word: row `row_of(4v + l)`'s `field` at
/// bit `bits · l` of word v; `None` if one is `refused`. Scalar, so that its closures need no
/// target features: [`BlockScales::vectors`] widens the words in its own loop.
#[inline(always)]
fn fours<const N: usize, const V: usize>(
    bits: usize,
    row_of: impl Fn(usize) -> usize,
    field: impl Fn(usize) -> u16,
    refused: impl Fn(u16) -> bool,
) -> Option<[i64; V]> {
    const { assert!(4 * V <= N, "a vector holds four of the rows' scales") };
    let mut words = [0i64; V];
    let mut refuse = false;
    for (v, word) in words.iter_mut().enumerate() {
        for l in 0..4 {
            let f = field(row_of(4 * v + l));
            refuse |= refused(f);
            *word |= i64::from(f) << (bits * l);
        }
    }
    (!refuse).then_some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readers' values and refusals need AVX2 and are trials of `tests/simd_kernels.rs`;
    /// their length checks are plain code.
    #[test]
    fn rows_short_of_the_blocks_are_refused() {
        let (full, short) = ([1u8; 8], [1u8; 7]);
        let e8m0 = |last: &'static [u8]| {
            std::panic::catch_unwind(move || {
                E8m0Rows::<4>::new([&full, &full, &full, last], 254, 8)
            })
        };
        assert!(e8m0(&[1; 8]).is_ok());
        assert!(e8m0(&[1; 7]).is_err());
        // f16: 8 blocks in groups of three are three groups, six bytes.
        let f16 = |last: &'static [u8], per_group: usize| {
            std::panic::catch_unwind(move || {
                F16Rows::<4>::new([&short, &short, &short, last], per_group, 8)
            })
        };
        assert!(f16(&[0; 6], 3).is_ok());
        assert!(f16(&[0; 5], 3).is_err());
        assert!(f16(&[0; 6], 0).is_err());
    }
}
