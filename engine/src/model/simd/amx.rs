//! Rule C1's FP4 block sums for a prefill, in AMX tiles (MODEL.md §5.4).
//!
//! As in `vnni`, an act-quantised input block is `x = X · 2u` with integers |X| < 2^19
//! ([`block_integers`]) and an e2m1 value is `W / 2` with |W| ≤ 12, so a block sum is
//! `u · Σ X·W`, |Σ X·W| < 2^28: exact in 32-bit integers, in any order. A tile product adds
//! signed-byte products into 32-bit lanes, so X is cut into three limbs of seven bits,
//! `X = X₀ + 2^7 X₁ + 2^14 X₂`, each carrying X's sign (|Xᵢ| ≤ 127): one tile per limb holds
//! a block of sixteen input rows, and one tile holds a block of sixteen weight rows' W. The
//! three limb sums are recombined by shifts (each term below 2^28), multiplied by the exact
//! power-of-two step `scale · u` and rounded to f32 once, then added over the blocks in
//! increasing order in f32: the f64 kernels' operations on the same exact block sum, so the
//! bits are theirs.

use super::super::quant::BLOCK;
use super::vnni::{block_integers, InputBlocks, IntegerInputs};
use super::vnni_prefill::LaneUnits;

/// Input rows per limb tile (the tile's 64-byte rows hold four columns of sixteen rows).
pub const TILE_ROWS: usize = 16;

/// Weight rows per kernel call (`matvec`'s prefill task where this kernel runs): a full
/// tile, since a block's tile steps wait on each other and a larger product per step costs
/// no longer.
pub const W_ROWS: usize = 16;

/// Limbs per input value.
const LIMBS: usize = 3;

/// Bits per limb.
const LIMB_BITS: u32 = 7;

/// One limb of one block of sixteen input rows, laid out as a tile product's right operand:
/// byte `64r + 4m + j` is the limb of row m at column `4r + j`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct LimbTile([i8; BLOCK * TILE_ROWS]);

/// Every full block of a prefill's input rows as limb tiles (sixteen rows per tile, missing
/// rows zero), with each row's unit per block.
#[derive(Default)]
pub struct ActTiles {
    rows: usize,
    groups: usize,
    blocks: usize,
    /// `tiles[kb · groups + g]`: block kb of rows `16g ..`, one tile per limb.
    tiles: Vec<[LimbTile; LIMBS]>,
    /// `units[kb · groups + g]`: the units of rows `16g ..` at block kb.
    units: Vec<LaneUnits>,
}

impl IntegerInputs for ActTiles {
    fn fill(&mut self, input: InputBlocks) -> bool {
        let (rows, blocks) = (input.rows, input.blocks);
        self.rows = rows;
        self.groups = rows.div_ceil(TILE_ROWS);
        self.blocks = blocks;
        let n = blocks * self.groups;
        self.tiles.clear();
        self.tiles
            .resize(n, [LimbTile([0; BLOCK * TILE_ROWS]); LIMBS]);
        self.units.clear();
        self.units.resize(n, LaneUnits::NONE);
        for m in 0..rows {
            let (g, lane) = (m / TILE_ROWS, m % TILE_ROWS);
            for kb in 0..blocks {
                let Some((integers, unit)) = block_integers(input.block(m, kb)) else {
                    return false;
                };
                let at = kb * self.groups + g;
                self.units[at].set(lane, unit);
                for (k, &v) in integers.iter().enumerate() {
                    let byte = 4 * TILE_ROWS * (k / 4) + 4 * lane + k % 4;
                    let magnitude = v.unsigned_abs();
                    for (p, tile) in self.tiles[at].iter_mut().enumerate() {
                        let limb = (magnitude >> (LIMB_BITS * p as u32) & 0x7F) as i8;
                        tile.0[byte] = if v < 0 { -limb } else { limb };
                    }
                }
            }
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
pub use kernel::{fp4_c1_rows, usable};

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::super::check_prefill_rows;
    use super::super::vnni::TWICE_E2M1;
    use super::super::vnni_prefill::{f32_steps_exact, scale_range, scaled_block_sums};
    use super::{ActTiles, LimbTile, LIMBS, LIMB_BITS, TILE_ROWS, W_ROWS};
    use crate::dtype::e8m0_to_f64;
    use crate::model::quant::BLOCK;
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// Whether this CPU and OS run AMX tiles with 8-bit products (AMX-TILE, AMX-INT8), asking
    /// Linux once for the tile data permission (without it the first tile instruction faults).
    pub fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            // SAFETY: CPUID leaves 0, 1 and 7 exist on every x86_64 CPU; XGETBV only runs
            // where CPUID reports OSXSAVE.
            let cpu = unsafe {
                let leaf7 = __cpuid_count(7, 0);
                let osxsave = __cpuid(1).ecx >> 27 & 1 == 1;
                let tile_int8 = leaf7.edx >> 24 & 3 == 3;
                // XCR0 bits 17 and 18: the OS saves the tile configuration and data.
                tile_int8 && osxsave && _xgetbv(0) >> 17 & 3 == 3
            };
            cpu && permitted()
        })
    }

    #[cfg(target_os = "linux")]
    fn permitted() -> bool {
        /// `arch_prctl` code asking for an extended state component, and the tile data's.
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a request for a permission; it changes nothing else.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn permitted() -> bool {
        false
    }

    /// The tile configuration (palette 1): tiles 0..3 the limb sums (sixteen weight rows ×
    /// sixteen input rows of i32), tile 3 the weights (sixteen rows × 32 bytes), tiles 4..7
    /// the input limbs (eight rows of four columns × sixteen input rows).
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    impl Config {
        const fn new() -> Config {
            let mut c = [0u8; 64];
            c[0] = 1;
            let mut t = 0;
            while t < 7 {
                // Bytes per row (little-endian u16 at 16 + 2t), then rows (byte 48 + t).
                c[16 + 2 * t] = if t == 3 { BLOCK as u8 } else { 64 };
                c[48 + t] = if t < 4 {
                    W_ROWS as u8
                } else {
                    (BLOCK / 4) as u8
                };
                t += 1;
            }
            Config(c)
        }
    }

    static CONFIG: Config = Config::new();

    /// One block of the weight rows as a tile's left operand: row i's 32 values `W`.
    #[repr(C, align(64))]
    struct WeightTile([i8; W_ROWS * BLOCK]);

    /// The three limb sums of one block: `[limb][weight row][input row]`.
    #[repr(C, align(64))]
    struct Sums([[[i32; TILE_ROWS]; W_ROWS]; LIMBS]);

    /// Rule C1 of up to [`W_ROWS`] release FP4 weight rows against every input row of `acts`:
    /// `out[i · rows + m] = Σ_kb f32(scale[i][kb] · u[m][kb] · Σ_k X·W)`, added in f32 in
    /// increasing kb from +0.0. `codes[i]` is row i's packed nibbles (low nibble first) and
    /// `scales[i]` its E8M0 bytes, one per block.
    ///
    /// # Safety
    /// [`usable`] must have returned true, and the CPU must have AVX-512 F, BW, DQ, VL and
    /// VBMI.
    /// The rows and scales must hold the blocks of `acts`, every scale byte must keep f32
    /// finite (`SAFE_SCALE_BYTE` in `matvec`), at most [`W_ROWS`] rows, `out` `rows` per row.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2")]
    pub unsafe fn fp4_c1_rows(out: &mut [f32], acts: &ActTiles, codes: &[&[u8]], scales: &[&[u8]]) {
        let (rows, groups, blocks) = (acts.rows, acts.groups, acts.blocks);
        check_prefill_rows(out, rows, blocks, (codes, BLOCK / 2), scales, W_ROWS);
        let nw = codes.len();
        out.fill(0.0);
        let mut weights = WeightTile([0; W_ROWS * BLOCK]);
        let mut sums = Sums([[[0; TILE_ROWS]; W_ROWS]; LIMBS]);
        let table = _mm256_loadu_si256(TWICE_E2M1.as_ptr().cast());
        let nibble = _mm_set1_epi8(0x0F);
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        for kb in 0..blocks {
            for (i, row) in codes.iter().enumerate() {
                let c = _mm_loadu_si128(row[kb * BLOCK / 2..].as_ptr().cast());
                let lo = _mm_and_si128(c, nibble);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(c), nibble);
                // Columns in order: a byte's low nibble, then its high one.
                let n = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                let w = _mm256_shuffle_epi8(table, n);
                _mm256_storeu_si256(weights.0[i * BLOCK..].as_mut_ptr().cast(), w);
            }
            asm!(
                "tileloadd tmm3, [{w} + {stride}*1]",
                w = in(reg) weights.0.as_ptr(),
                stride = in(reg) BLOCK,
                options(nostack, readonly),
            );
            let scale: [f64; W_ROWS] =
                std::array::from_fn(|i| scales.get(i).map_or(0.0, |s| e8m0_to_f64(s[kb])));
            let scale_range = scale_range(&scale[..nw]);
            for g in 0..groups {
                let at = kb * groups + g;
                group_sums(&acts.tiles[at], &mut sums);
                let units = &acts.units[at];
                // Every step `scale · u` and every u in the range where f32 arithmetic gives
                // the f64 kernel's value (the usual case): one f32 conversion and product.
                let f32_steps = f32_steps_exact(units.range(), scale_range);
                let m0 = g * TILE_ROWS;
                let lanes = (rows - m0).min(TILE_ROWS);
                let mask: __mmask16 = ((1u32 << lanes) - 1) as u16;
                for (i, &scale) in scale.iter().enumerate().take(nw) {
                    let s = _mm512_add_epi32(
                        _mm512_loadu_si512(sums.0[0][i].as_ptr().cast()),
                        _mm512_add_epi32(
                            _mm512_slli_epi32::<LIMB_BITS>(_mm512_loadu_si512(
                                sums.0[1][i].as_ptr().cast(),
                            )),
                            _mm512_slli_epi32::<{ 2 * LIMB_BITS }>(_mm512_loadu_si512(
                                sums.0[2][i].as_ptr().cast(),
                            )),
                        ),
                    );
                    let v = scaled_block_sums(s, units.steps(scale, f32_steps));
                    let dst = out[i * rows + m0..].as_mut_ptr();
                    let total = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst), v);
                    _mm512_mask_storeu_ps(dst, mask, total);
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }

    /// The three limb sums of the weight tile (tile 3) with one block of sixteen input rows.
    #[inline(always)]
    unsafe fn group_sums(limbs: &[LimbTile; LIMBS], sums: &mut Sums) {
        const STRIDE: usize = 4 * TILE_ROWS;
        asm!(
            "tileloadd tmm4, [{a} + {stride}*1]",
            "tileloadd tmm5, [{b} + {stride}*1]",
            "tileloadd tmm6, [{c} + {stride}*1]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tdpbssd tmm0, tmm3, tmm4",
            "tdpbssd tmm1, tmm3, tmm5",
            "tdpbssd tmm2, tmm3, tmm6",
            "tilestored [{s0} + {stride}*1], tmm0",
            "tilestored [{s1} + {stride}*1], tmm1",
            "tilestored [{s2} + {stride}*1], tmm2",
            a = in(reg) limbs[0].0.as_ptr(),
            b = in(reg) limbs[1].0.as_ptr(),
            c = in(reg) limbs[2].0.as_ptr(),
            s0 = in(reg) sums.0[0].as_mut_ptr(),
            s1 = in(reg) sums.0[1].as_mut_ptr(),
            s2 = in(reg) sums.0[2].as_mut_ptr(),
            stride = in(reg) STRIDE,
            options(nostack),
        );
    }
}
