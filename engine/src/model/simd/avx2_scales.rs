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
use std::mem::MaybeUninit;
use std::ops::Range;

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
/// the column blocks `$blocks` (a range): one copy of the body per reader.
macro_rules! with_block_scales {
    ($scales:expr, $blocks:expr, |$s:ident| $body:expr) => {{
        let blocks: std::ops::Range<usize> = $blocks;
        match $scales {
            $crate::model::simd::avx2_scales::Scales::E8m0 { rows, limit } => {
                use $crate::model::simd::avx2_scales::{E8m0Blocks, E8m0Rows};
                let mut buffer = E8m0Blocks::buffer();
                // SAFETY: the kernels expanding this run with AVX2.
                if let Some($s) =
                    unsafe { E8m0Blocks::of(&mut buffer, rows, limit, blocks.clone()) }
                {
                    $body
                } else {
                    let $s = E8m0Rows::new(rows, limit, blocks.end);
                    $body
                }
            }
            $crate::model::simd::avx2_scales::Scales::F16 {
                rows,
                blocks_per_group,
            } => {
                let $s = $crate::model::simd::avx2_scales::F16Rows::new(
                    rows,
                    blocks_per_group,
                    blocks.end,
                );
                $body
            }
        }
    }};
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

    #[inline(always)]
    unsafe fn widen(bytes: i64) -> __m256d {
        e8m0_widen(bytes)
    }
}

/// The low four bytes as E8M0 scales, 2^(b − 127) from the exponent field as `e8m0_to_f64`
/// (bytes 1..=254).
#[inline(always)]
unsafe fn e8m0_widen(bytes: i64) -> __m256d {
    let b = _mm256_cvtepu8_epi64(_mm_cvtsi64_si128(bytes));
    let biased = _mm256_add_epi64(b, _mm256_set1_epi64x(1023 - 127));
    _mm256_castsi256_pd(_mm256_slli_epi64::<52>(biased))
}

/// The most column blocks [`E8m0Blocks`] holds (16384 columns); longer rows are read as
/// [`E8m0Rows`].
pub const TRANSPOSED_BLOCKS: usize = 512;

/// E8M0 scale rows transposed once per kernel call into a buffer of the caller's, block-major
/// (`[kb][row]`): a block's scales for four rows are then one 32-bit load, where reading them
/// from the rows takes a load, a shift and an or per row (a quarter of the FP4 decode loop's
/// time). The first block of the call with a byte past the limit in any row is found while
/// transposing, and the reader leaves every row there: the kernels read all their rows in
/// each block, or end at the earliest such block anyway.
#[derive(Clone, Copy)]
pub struct E8m0Blocks<'a, const N: usize> {
    /// Blocks `first ..` of the call, up to the first refused one.
    blocks: &'a [[u8; N]],
    first: usize,
}

impl<'a, const N: usize> E8m0Blocks<'a, N> {
    /// A buffer for [`Self::of`].
    #[inline(always)]
    pub fn buffer() -> [MaybeUninit<[u8; N]>; TRANSPOSED_BLOCKS] {
        [MaybeUninit::uninit(); TRANSPOSED_BLOCKS]
    }

    /// `rows`' scales of the column blocks `blocks` transposed into `buffer`; `None` where
    /// there are more than it holds, or N is not eight (the kernels of eight rows read them
    /// four consecutive rows at a time; the sixteen-row C2 loop reads them in its chains'
    /// order, which the rows reader serves without a transposition).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    ///
    /// # Panics
    /// If a row holds fewer than `blocks.end` scales.
    #[inline(always)]
    pub unsafe fn of(
        buffer: &'a mut [MaybeUninit<[u8; N]>; TRANSPOSED_BLOCKS],
        rows: [&[u8]; N],
        limit: u8,
        blocks: Range<usize>,
    ) -> Option<Self> {
        if blocks.len() > TRANSPOSED_BLOCKS || N != 8 {
            return None;
        }
        // SAFETY: every row holds `blocks.end` bytes, so `blocks.start` is inside it.
        let starts =
            checked_starts(rows, blocks.end, "E8M0").map(|p| unsafe { p.add(blocks.start) });
        let buffer = &mut buffer[..blocks.len()];
        // SAFETY: the caller's AVX2; every row holds the blocks from `starts`.
        let refused = unsafe { transpose_scales(buffer, &starts, limit) };
        // SAFETY: `transpose_scales` wrote every byte of the blocks before the first refused.
        let written =
            unsafe { &*(&buffer[..refused] as *const [MaybeUninit<[u8; N]>] as *const [[u8; N]]) };
        Some(Self {
            blocks: written,
            first: blocks.start,
        })
    }
}

/// `buffer[kb][r] = *starts[r].add(kb)`, eight rows and sixteen blocks at a time by byte,
/// word and dword unpacks, up to the first block with a byte above `limit`, which it returns
/// (`buffer.len()` if none); the tail, and the sixteen blocks holding that byte, one byte at a
/// time.
///
/// # Safety
/// The CPU must have AVX2; every row must hold `buffer.len()` bytes; N a multiple of eight.
#[target_feature(enable = "avx2")]
unsafe fn transpose_scales<const N: usize>(
    buffer: &mut [MaybeUninit<[u8; N]>],
    starts: &[*const u8; N],
    limit: u8,
) -> usize {
    let blocks = buffer.len();
    let out = buffer.as_mut_ptr().cast::<u8>();
    let above = _mm_set1_epi8(limit as i8);
    // Where the byte-at-a-time loop starts: the tail, or the run with a byte past the limit.
    let mut bytewise = blocks - blocks % 16;
    for kb in (0..bytewise).step_by(16) {
        let mut past = _mm_setzero_si128();
        for g in (0..N).step_by(8) {
            let mut r = [_mm_setzero_si128(); 8];
            for (i, v) in r.iter_mut().enumerate() {
                // SAFETY: the row holds blocks kb..kb + 16.
                *v = unsafe { _mm_loadu_si128(starts[g + i].add(kb).cast()) };
                past = _mm_or_si128(past, _mm_subs_epu8(*v, above));
            }
            // Pairs of rows by byte, then fours by word, then eights by dword: vector j of
            // the last step holds blocks 2j and 2j + 1 (rows g..g + 8 each).
            let a: [__m128i; 8] = [
                _mm_unpacklo_epi8(r[0], r[1]),
                _mm_unpackhi_epi8(r[0], r[1]),
                _mm_unpacklo_epi8(r[2], r[3]),
                _mm_unpackhi_epi8(r[2], r[3]),
                _mm_unpacklo_epi8(r[4], r[5]),
                _mm_unpackhi_epi8(r[4], r[5]),
                _mm_unpacklo_epi8(r[6], r[7]),
                _mm_unpackhi_epi8(r[6], r[7]),
            ];
            let b: [__m128i; 8] = [
                _mm_unpacklo_epi16(a[0], a[2]),
                _mm_unpackhi_epi16(a[0], a[2]),
                _mm_unpacklo_epi16(a[1], a[3]),
                _mm_unpackhi_epi16(a[1], a[3]),
                _mm_unpacklo_epi16(a[4], a[6]),
                _mm_unpackhi_epi16(a[4], a[6]),
                _mm_unpacklo_epi16(a[5], a[7]),
                _mm_unpackhi_epi16(a[5], a[7]),
            ];
            for q in 0..4 {
                let pair = [
                    _mm_unpacklo_epi32(b[q], b[q + 4]),
                    _mm_unpackhi_epi32(b[q], b[q + 4]),
                ];
                for (h, two) in pair.into_iter().enumerate() {
                    let first = kb + 4 * q + 2 * h;
                    // SAFETY: blocks `first` and `first + 1` are in the buffer, rows g..g + 8
                    // eight bytes each.
                    unsafe {
                        _mm_storel_epi64(out.add(first * N + g).cast(), two);
                        _mm_storel_epi64(
                            out.add((first + 1) * N + g).cast(),
                            _mm_unpackhi_epi64(two, two),
                        );
                    }
                }
            }
        }
        if _mm_testz_si128(past, past) == 0 {
            bytewise = kb;
            break;
        }
    }
    for kb in bytewise..blocks {
        let mut refused = false;
        for (r, start) in starts.iter().enumerate() {
            // SAFETY: the row holds block kb, and the buffer does.
            let byte = unsafe {
                let byte = *start.add(kb);
                out.add(kb * N + r).write(byte);
                byte
            };
            refused |= byte > limit;
        }
        if refused {
            return kb;
        }
    }
    blocks
}

impl<const N: usize> BlockScales<N> for E8m0Blocks<'_, N> {
    const POWERS_OF_TWO: bool = true;
    const FIELD_BITS: usize = 8;

    #[inline(always)]
    fn position(&self, kb: usize) -> usize {
        kb
    }

    /// (This reader's `vectors` reads whole blocks; a field is checked like any slice.)
    #[inline(always)]
    unsafe fn field(&self, row: usize, at: usize) -> u16 {
        u16::from(self.blocks[at - self.first][row])
    }

    #[inline(always)]
    fn refuses(&self, _byte: u16) -> bool {
        // The blocks end before the first refused one (`transpose_scales`).
        false
    }

    #[inline(always)]
    unsafe fn widen(bytes: i64) -> __m256d {
        e8m0_widen(bytes)
    }

    /// Four consecutive rows' bytes as one load; other row orders as the rows reader does.
    #[inline(always)]
    unsafe fn vectors<const V: usize>(
        &self,
        kb: usize,
        row_of: impl Fn(usize) -> usize,
    ) -> Option<[__m256d; V]> {
        let block = self.blocks.get(kb.wrapping_sub(self.first))?;
        let mut out = [_mm256_setzero_pd(); V];
        for (v, o) in out.iter_mut().enumerate() {
            let first = row_of(4 * v);
            let word = if (1..4).all(|l| row_of(4 * v + l) == first + l) {
                let four = [
                    block[first],
                    block[first + 1],
                    block[first + 2],
                    block[first + 3],
                ];
                i64::from(u32::from_le_bytes(four))
            } else {
                let byte = |r: usize| u16::from(block[r]);
                let [word] = fours::<N, 1>(8, |l| row_of(4 * v + l), byte, |_| false)?;
                word
            };
            *o = e8m0_widen(word);
        }
        Some(out)
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
