//! Which vector instruction set the kernels run with, detected once at run time, and the
//! x86 kernels that use it.
//!
//! A kernel either has one body compiled per level (`#[target_feature]`), or a hand-written
//! vector copy whose operations may be reordered only where MODEL.md §5.4 makes the result
//! order-free (the exact FP8/FP4 block sums of rule C1). Either way every level gives the same
//! bits. `DS41_SIMD=portable` (or `avx2`, `avx512`, `avx512vnni`, `amx`) caps the level, to
//! compare or to rule the vector paths out when in doubt.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod avx2_digits;
pub mod avx2_fp4_prefill;
#[cfg(target_arch = "x86_64")]
pub mod avx2_fp8_prefill;
#[cfg(target_arch = "x86_64")]
pub mod avx2_prefill;
#[cfg(target_arch = "x86_64")]
pub mod avx2_scales;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod vnni;
pub mod vnni_prefill;
pub mod vnni_words;
#[cfg(target_arch = "x86_64")]
pub mod vq;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The target's baseline (SSE2 on x86_64).
    Portable,
    /// AVX2, FMA and F16C.
    Avx2,
    /// [`Level::Avx2`] plus AVX-512 F, BW, DQ, VL and VBMI.
    Avx512,
    /// [`Level::Avx512`] plus AVX-512 VNNI (byte dot products: the exact integer FP4 block sums
    /// of `vnni::fp4_c1_block8_vnni` and, for a prefill, `vnni_prefill`).
    Avx512Vnni,
    /// [`Level::Avx512Vnni`] plus AMX tiles with byte products (AMX-TILE, AMX-INT8), the OS
    /// permitting them: a prefill's exact integer FP4 block sums (`amx`).
    Amx,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx512,
        Level::Avx512Vnni,
        Level::Amx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512vnni",
            Level::Amx => "amx",
        }
    }
}

/// `acc + x · w` where both factors are f32 values widened to f64: their product is exact,
/// so a fused multiply-add (used at the levels whose CPUs have one) rounds once, exactly like
/// the separate multiply and add, and every copy of a kernel gives the same bits. Meant for
/// bodies inlined into a `#[target_feature]` copy, where `level` is a constant (elsewhere
/// `mul_add` would be a library call).
#[inline(always)]
pub(crate) fn madd(level: Level, acc: f64, x: f64, w: f64) -> f64 {
    if level >= Level::Avx2 {
        x.mul_add(w, acc)
    } else {
        acc + x * w
    }
}

/// The argument checks of every C1 prefill kernel (a slab of weight rows against every input
/// row of a call): at most `max_rows` weight rows with a scale row each, `out` holding `rows`
/// sums per weight row, and every weight row holding `blocks` blocks of `block_bytes` code
/// bytes and one scale byte each.
pub(crate) fn check_prefill_rows(
    out: &[f32],
    rows: usize,
    blocks: usize,
    (codes, block_bytes): (&[&[u8]], usize),
    scales: &[&[u8]],
    max_rows: usize,
) {
    let nw = codes.len();
    assert!(nw <= max_rows && scales.len() == nw && out.len() == nw * rows);
    assert!(codes.iter().all(|c| c.len() >= blocks * block_bytes));
    assert!(scales.iter().all(|s| s.len() >= blocks));
}

/// `rows` (at least one) as `N` kernel lanes, the lanes past the last row repeating the first:
/// every lane reads a row, its sums are not read, and the rows' exponent and step ranges stay
/// those of the rows present.
pub(crate) fn lanes_of_rows<'a, const N: usize>(rows: &[&'a [u8]]) -> [&'a [u8]; N] {
    std::array::from_fn(|i| rows.get(i).copied().unwrap_or(rows[0]))
}

/// No cap: [`cap_level`]'s "none".
const UNCAPPED: u8 = u8::MAX;

static CAP: AtomicU8 = AtomicU8::new(UNCAPPED);

/// Run the kernels at most at `cap` from now on (`None` lifts it). Tests use it to run every
/// copy of a kernel; since all give the same bits, a concurrent caller is not disturbed.
pub fn cap_level(cap: Option<Level>) {
    CAP.store(cap.map_or(UNCAPPED, |l| l as u8), Ordering::Relaxed);
}

/// The level the kernels use.
pub fn level() -> Level {
    let cap = CAP.load(Ordering::Relaxed);
    let best = available();
    Level::ALL
        .into_iter()
        .filter(|&l| l <= best && (l as u8) <= cap)
        .max()
        .unwrap_or(Level::Portable)
}

/// The best level of this CPU, capped by `DS41_SIMD` (`portable`, `avx2`, `avx512`,
/// `avx512vnni` or `amx`; another value is reported on stderr once and ignored).
pub fn available() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = match std::env::var("DS41_SIMD") {
            Err(_) => Level::Amx,
            Ok(v) => Level::ALL
                .into_iter()
                .find(|l| l.name() == v)
                .unwrap_or_else(|| {
                    eprintln!(
                        "ds41: DS41_SIMD={v:?} is none of portable, avx2, avx512, avx512vnni, \
                         amx; ignored"
                    );
                    Level::Amx
                }),
        };
        detected().min(cap)
    })
}

#[cfg(target_arch = "x86_64")]
fn detected() -> Level {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vbmi");
    let vnni = avx512 && is_x86_feature_detected!("avx512vnni");
    match (avx2, avx512, vnni) {
        (true, true, true) if amx::usable() => Level::Amx,
        (true, true, true) => Level::Avx512Vnni,
        (true, true, false) => Level::Avx512,
        (true, false, _) => Level::Avx2,
        _ => Level::Portable,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> Level {
    Level::Portable
}

/// C1 block sums and block decoders on release FP8/FP4 codes with AVX2.
///
/// An e4m3 code's magnitude bits moved under an IEEE half's exponent give a half equal to the
/// code's value times 2^−8, subnormal codes included; an e2m1 nibble likewise gives its value
/// times 2^−14. F16C widens eight halves to f32 at once (exactly), so no table lookup is made
/// per weight. Every product `x · value · 2^−s` is exact in f64 and so is their sum (the C1
/// argument in `linear`), so the lanes may add in any order, and multiplying the sum by 2^s
/// gives exactly the portable kernel's block sum.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::super::quant::BLOCK;
    use std::arch::x86_64::*;

    /// `Σ x[k] · e4m3(code[k])`, or `None` if a code is NaN (left to the table path).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp8_block_sum(x: &[f64; BLOCK], codes: &[u8; BLOCK]) -> Option<f64> {
        let c = _mm256_loadu_si256(codes.as_ptr().cast());
        let mag = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
        if _mm256_movemask_epi8(_mm256_cmpeq_epi8(mag, _mm256_set1_epi8(0x7F))) != 0 {
            return None;
        }
        let mut acc = [_mm256_setzero_pd(); 4];
        for (h, bytes) in [_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c)]
            .into_iter()
            .enumerate()
        {
            let w = _mm256_cvtepu8_epi16(bytes);
            let half = _mm256_or_si256(
                _mm256_and_si256(_mm256_slli_epi16::<7>(w), _mm256_set1_epi16(0x3F80)),
                _mm256_and_si256(_mm256_slli_epi16::<8>(w), _mm256_set1_epi16(i16::MIN)),
            );
            let k = 16 * h;
            madd8(&mut acc[..2], x, k, _mm256_castsi256_si128(half));
            madd8(&mut acc[2..], x, k + 8, _mm256_extracti128_si256::<1>(half));
        }
        Some(sum(acc) * 256.0)
    }

    /// `Σ x[k] · e2m1(nibble k)` over a block of packed FP4 (low nibble first).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp4_block_sum(x: &[f64; BLOCK], codes: &[u8; BLOCK / 2]) -> f64 {
        let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(codes.as_ptr().cast()));
        let half = |n: __m256i| {
            _mm256_or_si256(
                _mm256_and_si256(_mm256_slli_epi16::<9>(n), _mm256_set1_epi16(0x0E00)),
                _mm256_and_si256(_mm256_slli_epi16::<12>(n), _mm256_set1_epi16(i16::MIN)),
            )
        };
        let lo = half(_mm256_and_si256(w, _mm256_set1_epi16(0xF)));
        let hi = half(_mm256_srli_epi16::<4>(w));
        // Interleaving within each 128-bit lane puts columns 0..8 and 16..24 in `a`, 8..16
        // and 24..32 in `b`.
        let a = _mm256_unpacklo_epi16(lo, hi);
        let b = _mm256_unpackhi_epi16(lo, hi);
        let mut acc = [_mm256_setzero_pd(); 4];
        madd8(&mut acc[..2], x, 0, _mm256_castsi256_si128(a));
        madd8(&mut acc[2..], x, 8, _mm256_castsi256_si128(b));
        madd8(&mut acc[..2], x, 16, _mm256_extracti128_si256::<1>(a));
        madd8(&mut acc[2..], x, 24, _mm256_extracti128_si256::<1>(b));
        sum(acc) * 16384.0
    }

    /// Eight weight rows of one 32-column block of e4m3 codes, decoded into columns
    /// `i .. i + 8` of a column-major block: `w[k][i + j] = code[j][k] · s[j]` as the exact
    /// f64 the table decoder gives (codes transposed in registers, widened by F16C, the
    /// halves' 2^−8 put back into the scale). `false`, nothing written, if a code is NaN
    /// (left to the table decoder). The scales must not overflow f32 with any code
    /// (`SAFE_SCALE_BYTE` in `matvec`).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp8_tile<const W: usize>(
        rows: [&[u8; BLOCK]; 8],
        s: &[f64; 8],
        w: &mut [[f64; W]; BLOCK],
        i: usize,
    ) -> bool {
        assert!(i + 8 <= W, "tile columns {i}.. outside a block of {W}");
        let r: [__m256i; 8] = std::array::from_fn(|j| _mm256_loadu_si256(rows[j].as_ptr().cast()));
        let mut nan = _mm256_setzero_si256();
        for v in r {
            let mag = _mm256_and_si256(v, _mm256_set1_epi8(0x7F));
            nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(mag, _mm256_set1_epi8(0x7F)));
        }
        if _mm256_movemask_epi8(nan) != 0 {
            return false;
        }
        let v = transpose_8x32(r);
        let scale = row_scales(s, 256.0);
        for lane in 0..2 {
            for (q, &vq) in v.iter().enumerate() {
                let bytes = if lane == 0 {
                    _mm256_castsi256_si128(vq)
                } else {
                    _mm256_extracti128_si256::<1>(vq)
                };
                let c = _mm256_cvtepu8_epi16(bytes);
                let half = _mm256_or_si256(
                    _mm256_and_si256(_mm256_slli_epi16::<7>(c), _mm256_set1_epi16(0x3F80)),
                    _mm256_and_si256(_mm256_slli_epi16::<8>(c), _mm256_set1_epi16(i16::MIN)),
                );
                let k = 16 * lane + 2 * q;
                store_column(&mut w[k][i..i + 8], _mm256_castsi256_si128(half), &scale);
                store_column(
                    &mut w[k + 1][i..i + 8],
                    _mm256_extracti128_si256::<1>(half),
                    &scale,
                );
            }
        }
        true
    }

    /// [`fp8_tile`] for packed FP4 rows (16 bytes each, low nibble first). Code 8 ("−0") is
    /// +0.0 as in the table (`dtype::e2m1_pair`): a −0.0 weight could change the sign of a
    /// zero chain.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp4_tile<const W: usize>(
        rows: [&[u8; BLOCK / 2]; 8],
        s: &[f64; 8],
        w: &mut [[f64; W]; BLOCK],
        i: usize,
    ) {
        assert!(i + 8 <= W, "tile columns {i}.. outside a block of {W}");
        let r: [__m128i; 8] = std::array::from_fn(|j| _mm_loadu_si128(rows[j].as_ptr().cast()));
        // Bytes j0..j7 of rows (0,1), (2,3), .. interleaved, then j8..j15.
        let t: [__m128i; 8] = std::array::from_fn(|n| {
            let (a, b) = (r[2 * (n / 2)], r[2 * (n / 2) + 1]);
            if n % 2 == 0 {
                _mm_unpacklo_epi8(a, b)
            } else {
                _mm_unpackhi_epi8(a, b)
            }
        });
        // Four rows' bytes (rows 0..4 or 4..8) per byte position: j0..4, j4..8, j8..12, j12..16.
        let u = |p: usize, q: usize| -> [__m128i; 4] {
            [
                _mm_unpacklo_epi16(t[p], t[q]),
                _mm_unpackhi_epi16(t[p], t[q]),
                _mm_unpacklo_epi16(t[p + 1], t[q + 1]),
                _mm_unpackhi_epi16(t[p + 1], t[q + 1]),
            ]
        };
        let (lo4, hi4) = (u(0, 2), u(4, 6));
        let scale = row_scales(s, 16384.0);
        let half = |n: __m256i| {
            let mag = _mm256_and_si256(_mm256_slli_epi16::<9>(n), _mm256_set1_epi16(0x0E00));
            let sign = _mm256_and_si256(_mm256_slli_epi16::<12>(n), _mm256_set1_epi16(i16::MIN));
            let zero = _mm256_cmpeq_epi16(mag, _mm256_setzero_si256());
            _mm256_or_si256(mag, _mm256_andnot_si256(zero, sign))
        };
        for g in 0..4 {
            let pairs = [
                _mm_unpacklo_epi32(lo4[g], hi4[g]),
                _mm_unpackhi_epi32(lo4[g], hi4[g]),
            ];
            for (p, v) in pairs.into_iter().enumerate() {
                // Byte positions j, j + 1 of the eight rows: columns 2j .. 2j + 4.
                let k = 2 * (4 * g + 2 * p);
                let c = _mm256_cvtepu8_epi16(v);
                let lo = half(_mm256_and_si256(c, _mm256_set1_epi16(0xF)));
                let hi = half(_mm256_srli_epi16::<4>(c));
                store_column(&mut w[k][i..i + 8], _mm256_castsi256_si128(lo), &scale);
                store_column(&mut w[k + 1][i..i + 8], _mm256_castsi256_si128(hi), &scale);
                store_column(
                    &mut w[k + 2][i..i + 8],
                    _mm256_extracti128_si256::<1>(lo),
                    &scale,
                );
                store_column(
                    &mut w[k + 3][i..i + 8],
                    _mm256_extracti128_si256::<1>(hi),
                    &scale,
                );
            }
        }
    }

    /// Rule C2 for 32 weight rows over one block: `acc[i] = fma(x[k], w[k][i], acc[i])` for
    /// k increasing, the rows being the lanes of eight vectors kept in registers (enough
    /// independent chains to hide the multiply-add's latency). The product is exact, so this
    /// is the portable `acc + x · w` to the bit.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn chains_32(acc: &mut [f64; 32], x: &[f64], w: &[[f64; 32]]) {
        let mut a: [__m256d; 8] = std::array::from_fn(|j| _mm256_loadu_pd(acc[4 * j..].as_ptr()));
        for (wk, &xk) in w.iter().zip(x) {
            let xb = _mm256_set1_pd(xk);
            for (j, aj) in a.iter_mut().enumerate() {
                *aj = _mm256_fmadd_pd(xb, _mm256_loadu_pd(wk[4 * j..].as_ptr()), *aj);
            }
        }
        for (j, aj) in a.into_iter().enumerate() {
            _mm256_storeu_pd(acc[4 * j..].as_mut_ptr(), aj);
        }
    }

    /// An 8×8 tile of f32 values transposed: `rows[i]` holds row i's eight columns, the result's
    /// `[c]` holds column c of the eight rows (one row per lane).
    ///
    /// AVX instructions only, inlined into kernels of every level that has them.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn columns8(r: [__m256; 8]) -> [__m256; 8] {
        let mut t = [_mm256_setzero_ps(); 8];
        for (i, ti) in t.iter_mut().enumerate() {
            let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            *ti = if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            };
        }
        // Per 128-bit half: rows 0..4 (u[0..4]) and 4..8 (u[4..8]) of columns 0..4 / 4..8.
        let mut u = [_mm256_setzero_ps(); 8];
        for (i, ui) in u.iter_mut().enumerate() {
            let (a, b) = (
                t[4 * (i / 4) + (i % 4) / 2],
                t[4 * (i / 4) + (i % 4) / 2 + 2],
            );
            *ui = if i % 2 == 0 {
                _mm256_shuffle_ps::<0x44>(a, b)
            } else {
                _mm256_shuffle_ps::<0xEE>(a, b)
            };
        }
        let mut columns = [_mm256_setzero_ps(); 8];
        for (c, column) in columns.iter_mut().enumerate() {
            let (lo, hi) = (u[c % 4], u[4 + c % 4]);
            *column = if c < 4 {
                _mm256_permute2f128_ps::<0x20>(lo, hi)
            } else {
                _mm256_permute2f128_ps::<0x31>(lo, hi)
            };
        }
        columns
    }

    /// Eight bf16 values (their bits) widened to f32. A signalling NaN is left signalling here:
    /// the kernels' next step, the widening to f64, sets its quiet bit and keeps its payload, so
    /// the f64 is the one `dtype::bf16_to_f32` (which quiets first) leads to.
    ///
    /// AVX2 instructions only, inlined into kernels of every level that has them.
    #[inline(always)]
    pub(in crate::model::simd) unsafe fn bf16_values(bits: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }

    /// Eight stored bf16 or f32 weight rows (little-endian) over one 32-column block, decoded
    /// into columns `i .. i + 8` of a column-major block: `w[k][i + j]` = row j's value at k,
    /// widened to f64 as the row decoder does (`dtype::bf16_to_f32` or the f32 itself, then
    /// `f64::from`; see [`bf16_values`] for a NaN). Each 8×8 tile is transposed in registers
    /// ([`columns8`]), so the block is written a column of eight rows at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dense_columns<const W: usize>(
        rows: [&[u8]; 8],
        bf16: bool,
        w: &mut [[f64; W]; BLOCK],
        i: usize,
    ) {
        let width = if bf16 { 2 } else { 4 };
        assert!(i + 8 <= W && rows.iter().all(|r| r.len() >= BLOCK * width));
        for tile in 0..BLOCK / 8 {
            let mut r = [_mm256_setzero_ps(); 8];
            for (v, row) in r.iter_mut().zip(&rows) {
                let at = row[8 * width * tile..].as_ptr();
                *v = if bf16 {
                    bf16_values(_mm_loadu_si128(at.cast()))
                } else {
                    _mm256_loadu_ps(at.cast())
                };
            }
            for (c, column) in columns8(r).into_iter().enumerate() {
                let out = w[8 * tile + c][i..i + 8].as_mut_ptr();
                _mm256_storeu_pd(out, _mm256_cvtps_pd(_mm256_castps256_ps128(column)));
                _mm256_storeu_pd(
                    out.add(4),
                    _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(column)),
                );
            }
        }
    }

    /// Eight rows of 32 bytes to columns: result `q` holds columns `2q, 2q + 1` (each the
    /// eight rows' bytes in order) in its low 128 bits and `16 + 2q, 17 + 2q` in its high.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::model::simd) unsafe fn transpose_8x32(r: [__m256i; 8]) -> [__m256i; 8] {
        // Row pairs interleaved byte by byte: columns 0..8 (16..24), then 8..16 (24..32).
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi8(a, b)
            } else {
                _mm256_unpackhi_epi8(a, b)
            }
        });
        // Rows 0..4 (4..8) per column: columns 0..4, 4..8, 8..12, 12..16 (+16 high).
        let u = |p: usize, q: usize| -> [__m256i; 4] {
            [
                _mm256_unpacklo_epi16(t[p], t[q]),
                _mm256_unpackhi_epi16(t[p], t[q]),
                _mm256_unpacklo_epi16(t[p + 1], t[q + 1]),
                _mm256_unpackhi_epi16(t[p + 1], t[q + 1]),
            ]
        };
        let (lo4, hi4) = (u(0, 2), u(4, 6));
        std::array::from_fn(|q| {
            if q % 2 == 0 {
                _mm256_unpacklo_epi32(lo4[q / 2], hi4[q / 2])
            } else {
                _mm256_unpackhi_epi32(lo4[q / 2], hi4[q / 2])
            }
        })
    }

    /// The rows' scales times `unit` (the halves' 2^−8 or 2^−14 put back; exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row_scales(s: &[f64; 8], unit: f64) -> [__m256d; 2] {
        let u = _mm256_set1_pd(unit);
        [
            _mm256_mul_pd(_mm256_loadu_pd(s.as_ptr()), u),
            _mm256_mul_pd(_mm256_loadu_pd(s.as_ptr().add(4)), u),
        ]
    }

    /// One column of eight rows: `out[j] = value_j · scale_j` (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_column(out: &mut [f64], halves: __m128i, scale: &[__m256d; 2]) {
        let out: &mut [f64; 8] = out.try_into().expect("eight rows");
        let f = _mm256_cvtph_ps(halves);
        let lo = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), scale[0]);
        let hi = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(f)), scale[1]);
        _mm256_storeu_pd(out.as_mut_ptr(), lo);
        _mm256_storeu_pd(out.as_mut_ptr().add(4), hi);
    }

    /// `acc += x[k..k + 8] · halves` (eight halves widened to f64), two lanes of four.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn madd8(acc: &mut [__m256d], x: &[f64; BLOCK], k: usize, halves: __m128i) {
        let f = _mm256_cvtph_ps(halves);
        let xs = x[k..k + 8].as_ptr();
        acc[0] = _mm256_fmadd_pd(
            _mm256_loadu_pd(xs),
            _mm256_cvtps_pd(_mm256_castps256_ps128(f)),
            acc[0],
        );
        acc[1] = _mm256_fmadd_pd(
            _mm256_loadu_pd(xs.add(4)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(f)),
            acc[1],
        );
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum(acc: [__m256d; 4]) -> f64 {
        let v = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
        let pair = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)))
    }
}

#[cfg(test)]
mod tests {
    use super::{check_prefill_rows, lanes_of_rows};

    /// Two weight rows of two 16-byte blocks, their scales, and an output for three input rows.
    fn call(
        codes: &[&[u8]],
        scales: &[&[u8]],
        out_len: usize,
        max_rows: usize,
    ) -> std::thread::Result<()> {
        let out = vec![0f32; out_len];
        std::panic::catch_unwind(|| check_prefill_rows(&out, 3, 2, (codes, 16), scales, max_rows))
    }

    #[test]
    fn prefill_arguments_are_refused_unless_every_row_holds_the_blocks() {
        let (code, short, scale) = ([0u8; 32], [0u8; 31], [0u8; 2]);
        assert!(call(&[&code, &code], &[&scale, &scale], 6, 8).is_ok());
        assert!(call(&[&code, &short], &[&scale, &scale], 6, 8).is_err());
        assert!(call(&[&code, &code], &[&scale, &scale[..1]], 6, 8).is_err());
        assert!(call(&[&code, &code], &[&scale], 6, 8).is_err());
        assert!(call(&[&code, &code], &[&scale, &scale], 5, 8).is_err());
        assert!(call(&[&code, &code], &[&scale, &scale], 6, 1).is_err());
    }

    #[test]
    fn lanes_past_the_rows_repeat_the_first() {
        let rows: [&[u8]; 2] = [&[1], &[2]];
        assert_eq!(lanes_of_rows::<4>(&rows), [&[1u8][..], &[2], &[1], &[1]]);
    }
}
