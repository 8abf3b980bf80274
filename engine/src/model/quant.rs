//! Rounding and fake-quantisation primitives of the upstream regime (MODEL.md §1, §5.2, §5.3).
//!
//! * [`bf16`] / [`round_bf16`]: IEEE binary32 → bfloat16, round to nearest, ties to even.
//! * [`pow2ceil`]: the kernel's power-of-two scale rounding (exponent-bit construction).
//! * [`e4m3_encode`] / [`e2m1_encode`]: saturating RNE encoders onto the OCP FP8 e4m3fn and
//!   FP4 e2m1 grids. Decoding lives in [`crate::dtype`] (one decoder for the whole tree).
//! * [`act_quant_fp8`], [`fp4_qdq_e8m0`], [`fp4_qdq_e4m3`]: the three block QDQ steps.
//!
//! Everything here is exact, scalar and deterministic: an encoder never rounds twice (the value
//! is rounded once, in f64, on the target grid's quantum) and a QDQ value is representable in
//! bf16, so the in-place forms lose nothing beyond the quantisation itself.

/// Activation block width of the FP8 act-quant and of the E8M0 FP4 QDQ.
pub const BLOCK: usize = 32;
/// Block width of the E4M3-scaled FP4 QDQ of compressed latents.
pub const BLOCK_E4M3_SCALED: usize = 16;
/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// e2m1 magnitudes indexed by the 3-bit code (bits 0–2 of a nibble).
pub const E2M1_GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Round an f32 to the nearest bfloat16 (ties to even) and return it widened back to f32.
/// NaN stays NaN (quietened); ±inf and ±0 are preserved; overflow past the largest bf16 gives
/// ±inf, as IEEE rounding requires.
#[inline]
pub fn bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    // NaN: keep sign and payload top bits, force the quiet bit so truncation cannot give inf.
    let nan = (bits & 0xFFFF_0000) | 0x0040_0000;
    // Add half an ulp minus one, plus the lsb of the kept part: the classic RNE bias.
    let lsb = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7FFF + lsb) & 0xFFFF_0000;
    // Both computed and one selected, with no branch, so loops of roundings vectorise.
    f32::from_bits(if x.is_nan() { nan } else { rounded })
}

/// Round every element to bf16 in place.
#[inline]
pub fn round_bf16(xs: &mut [f32]) {
    for x in xs {
        *x = bf16(*x);
    }
}

/// Round an f64 once to f32 and then to bf16. This is the project's rule for a bf16 output
/// of an f32-accumulating operation summed canonically in f64 (MODEL.md §5.4 C1/C2): the
/// reference produces an f32 result and its [bf16] point rounds that.
#[inline]
pub fn bf16_of_f64(x: f64) -> f32 {
    bf16(x as f32)
}

/// `2^ceil(log2 t)` for a positive f32, built from the exponent bits exactly as the kernel's
/// `fast_round_scale` does (MODEL.md §5.2): e = biased exponent, m = mantissa bits, result
/// `2^(e − 127 + (m ≠ 0))`. For subnormal t the result is 2^−126 (e = 0, m ≠ 0); for t above
/// the largest power of two below f32::MAX it is +inf. Callers floor t so that t > 0.
#[inline]
pub fn pow2ceil(t: f32) -> f32 {
    let bits = t.to_bits();
    let e = (bits >> 23) & 0xFF;
    let m = bits & 0x7F_FFFF;
    let e_out = e + u32::from(m != 0);
    f32::from_bits(e_out << 23)
}

/// Round `a ≥ 0` (finite) to the nearest multiple of `quantum` (a power of two), ties to even
/// multiple. Exact: `a / quantum` is exact in f64, and is taken as a product with the
/// reciprocal (also a power of two, so the same value without a division's latency); for
/// 0 ≤ v < 2^52 adding and removing 2^52 rounds v to an integer with the FPU's
/// round-to-nearest-even (the sum's ulp is 1), which is `round_ties_even` without the library
/// call it compiles to on baseline x86-64; every larger f64 is an integer already.
#[inline]
fn round_to_quantum(a: f64, quantum: f64) -> f64 {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    // 2^-k from the exponent field of 2^k (a normal power of two: 2^-9 ..= 2^5 here).
    let field = quantum.to_bits() >> 52;
    debug_assert!(
        quantum.to_bits() & ((1 << 52) - 1) == 0 && (1..2046).contains(&field),
        "{quantum} is a normal power of two"
    );
    let v = a * f64::from_bits((2046 - field) << 52);
    debug_assert!(v >= 0.0, "{a} / {quantum}");
    if v < TWO_52 {
        (v + TWO_52) - TWO_52
    } else {
        v // already an integer
    }
}

/// Encode an f32 as an OCP float8 e4m3fn byte: explicit clamp to ±448, then round to nearest,
/// ties to even (MODEL.md §1). The sign of zero is kept (−0.0 → 0x80). NaN encodes as 0x7F
/// (e4m3fn's NaN); callers never pass one.
pub fn e4m3_encode(x: f32) -> u8 {
    e4m3_quantise(x).0
}

/// Round an f32 onto the e4m3fn grid (saturating at ±448, RNE), returning the byte and its
/// exact value. Avoids a decode round trip in the QDQ loops.
#[inline]
pub fn e4m3_quantise(x: f32) -> (u8, f32) {
    if x.is_nan() {
        return (0x7F, f32::NAN);
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs().min(E4M3_MAX));
    // Binade of a: subnormals (a < 2^-6) share the quantum 2^-9; a normal binade [2^e, 2^(e+1))
    // has quantum 2^(e-3).
    let e = if a < 2f64.powi(-6) {
        -7
    } else {
        // exponent of an f64 normal: exact floor(log2 a)
        ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023
    };
    // 2^(e-3) built from its exponent bits (e - 3 ∈ [-9, 5]): `powi` with a run-time
    // exponent is a library call, once per quantised activation.
    let quantum = if e < -6 {
        2f64.powi(-9)
    } else {
        f64::from_bits(((e - 3 + 1023) as u64) << 52)
    };
    let n = round_to_quantum(a, quantum); // subnormal: 0..=8; normal: 8..=16
    let value = n * quantum;
    let code = if e < -6 {
        n as u8 // n = 8 is 2^-6, whose code 0x08 is exactly (exp 1, mantissa 0)
    } else {
        (((e + 7) << 3) + n as i32 - 8) as u8 // n = 16 carries into the next exponent
    };
    let value = value as f32;
    (sign | code, if sign != 0 { -value } else { value })
}

/// [`e4m3_quantise`]'s value for an input already clamped to ±448 (or NaN), with no branch, so
/// that a block's roundings vectorise. `magic` is 2^23 times the quantum of the input's binade
/// (2^(e−3), or 2^−9 below 2^−6), so the f32 sum `|x| + magic` is rounded to nearest-even on
/// exactly that quantum (`magic` is an even multiple of it: ties go to the even code) and
/// removing `magic` again is exact.
#[inline(always)]
pub fn e4m3_round_clamped(x: f32) -> f32 {
    let bits = x.to_bits();
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    let binade = ((bits >> 23) & 0xFF).max(127 - 6);
    let magic = f32::from_bits((binade + 20) << 23);
    let rounded = ((a + magic) - magic).to_bits() | (bits & 0x8000_0000);
    if x.is_nan() {
        f32::NAN
    } else {
        f32::from_bits(rounded)
    }
}

/// Encode an f32 as an e2m1 nibble (bit 3 = sign, bits 0–2 index [`E2M1_GRID`]): round to the
/// nearest grid value with ties to the even code, saturating at ±6 (MODEL.md §1, §5.3). The
/// midpoints go .25→0, .75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4. The sign of zero is kept
/// (−0.0 and small negatives → code 8). NaN (never passed) encodes as +0.
pub fn e2m1_encode(x: f32) -> u8 {
    e2m1_quantise(x).0
}

/// How an e2m1 rounding breaks an exact tie between two grid values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fp4Ties {
    /// MODEL.md §1 / §5.3: to the even code (the official kernels' RNE).
    #[default]
    ToEven,
    /// Away from zero: the injected defect `fp4-ties-away-from-even` (negative control).
    AwayFromZero,
}

impl Fp4Ties {
    /// The rule a run uses: ties to even unless the defect is injected.
    pub fn for_defects(defects: &super::defects::DefectSet) -> Fp4Ties {
        if defects.has(super::defects::Defect::Fp4TiesAwayFromEven) {
            Fp4Ties::AwayFromZero
        } else {
            Fp4Ties::ToEven
        }
    }
}

/// Round onto the e2m1 grid, returning the nibble and its value (same rules as [`e2m1_encode`]).
#[inline]
pub fn e2m1_quantise(x: f32) -> (u8, f32) {
    e2m1_quantise_ties(x, Fp4Ties::ToEven)
}

/// [`e2m1_quantise`] with an explicit tie rule.
#[inline]
pub fn e2m1_quantise_ties(x: f32, ties: Fp4Ties) -> (u8, f32) {
    if x.is_nan() {
        return (0, 0.0);
    }
    let sign: u8 = if x.is_sign_negative() { 8 } else { 0 };
    let a = x.abs();
    // The grid has quantum 0.5 on [0, 2], 1 on [2, 4], 2 on [4, 6]; round on the quantum of the
    // binade that contains a (boundaries 2 and 4 are grid points, so either side agrees there).
    let (base_code, base, quantum) = if a < 2.0 {
        (0u8, 0.0f64, 0.5f64)
    } else if a < 4.0 {
        (4, 2.0, 1.0)
    } else {
        (6, 4.0, 2.0)
    };
    let steps = match ties {
        Fp4Ties::ToEven => round_to_quantum(f64::from(a) - base, quantum), // a - base is exact
        Fp4Ties::AwayFromZero => ((f64::from(a) - base) / quantum).round(), // halves go up
    };
    let code = (f64::from(base_code) + steps).min(7.0) as u8; // saturate at ±6
    let value = E2M1_GRID[code as usize];
    (sign | code, if sign != 0 { -value } else { value })
}

/// FP8 block-32 activation quantisation with a power-of-two (ue8m0) scale, MODEL.md §5.3:
/// per block `a = max(max|x|, 1e-4)`, `s = pow2ceil(a · f32(1/448))`,
/// `q = e4m3(clamp(x / s, ±448))`. Returns the e4m3 codes (same length as `x`) and one scale
/// per block. `x.len()` must be a multiple of 32 (the caller checks and names the tensor).
pub fn act_quant_fp8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    debug_assert_eq!(x.len() % BLOCK, 0);
    let mut codes = vec![0u8; x.len()];
    let mut scales = Vec::with_capacity(x.len() / BLOCK);
    for (xb, cb) in x.chunks_exact(BLOCK).zip(codes.chunks_exact_mut(BLOCK)) {
        let s = act_quant_scale(xb);
        for (c, &v) in cb.iter_mut().zip(xb) {
            *c = e4m3_quantise((v / s).clamp(-E4M3_MAX, E4M3_MAX)).0;
        }
        scales.push(s);
    }
    (codes, scales)
}

/// The ue8m0 scale of one act-quant block.
#[inline]
fn act_quant_scale(block: &[f32]) -> f32 {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
    pow2ceil(amax * (1.0f32 / E4M3_MAX))
}

/// [`act_quant_fp8`] writing the dequantised values `q · s` back (the window-key QDQ and the
/// GEMM input). Each value is exact in bf16.
pub fn act_quant_fp8_inplace(x: &mut [f32]) {
    debug_assert_eq!(x.len() % BLOCK, 0);
    for xb in x.chunks_exact_mut(BLOCK) {
        let s = act_quant_scale(xb);
        for v in xb.iter_mut() {
            *v = e4m3_round_clamped((*v / s).clamp(-E4M3_MAX, E4M3_MAX)) * s;
        }
    }
}

/// FP4 QDQ with E8M0 scales, block 32 (indexer queries and index keys), MODEL.md §5.3:
/// `a = max(max|x|, 6·2^−126)`, `s = pow2ceil(a · f32(1/6))`, value = `e2m1(clamp(x/s, ±6)) · s`.
pub fn fp4_qdq_e8m0(x: &mut [f32]) {
    fp4_qdq_e8m0_ties(x, Fp4Ties::ToEven)
}

/// [`fp4_qdq_e8m0`] with an explicit tie rule (the negative control's switch).
pub fn fp4_qdq_e8m0_ties(x: &mut [f32], ties: Fp4Ties) {
    debug_assert_eq!(x.len() % BLOCK, 0);
    for xb in x.chunks_exact_mut(BLOCK) {
        let amax = xb
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(6.0 * 2f32.powi(-126));
        let s = pow2ceil(amax * (1.0f32 / E2M1_MAX));
        for v in xb.iter_mut() {
            *v = e2m1_quantise_ties((*v / s).clamp(-E2M1_MAX, E2M1_MAX), ties).1 * s;
        }
    }
}

/// FP4 QDQ with E4M3 scales, block 16 (compressed KV latents), MODEL.md §5.3:
/// `a = max(max|x|, 6·2^−9)`, `s = e4m3(a / 6)` (f32 division then RNE), value =
/// `e2m1(clamp(x / s, ±6)) · s` with an f32 **division** by the widened scale.
pub fn fp4_qdq_e4m3(x: &mut [f32]) {
    fp4_qdq_e4m3_ties(x, Fp4Ties::ToEven)
}

/// [`fp4_qdq_e4m3`] with an explicit tie rule (the negative control's switch).
pub fn fp4_qdq_e4m3_ties(x: &mut [f32], ties: Fp4Ties) {
    debug_assert_eq!(x.len() % BLOCK_E4M3_SCALED, 0);
    for xb in x.chunks_exact_mut(BLOCK_E4M3_SCALED) {
        let amax = xb
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(6.0 * 2f32.powi(-9));
        let s = e4m3_quantise(amax / E2M1_MAX).1;
        for v in xb.iter_mut() {
            *v = e2m1_quantise_ties((*v / s).clamp(-E2M1_MAX, E2M1_MAX), ties).1 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent e4m3fn decoder written from MODEL.md §4.5 (test oracle only).
    fn e4m3_value(code: u8) -> Option<f64> {
        if code & 0x7F == 0x7F {
            return None; // NaN
        }
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code >> 3) & 0xF);
        let m = f64::from(code & 7);
        let mag = if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        Some(sign * mag)
    }

    fn e2m1_value(code: u8) -> f64 {
        let mag = f64::from(E2M1_GRID[usize::from(code & 7)]);
        if code & 8 != 0 {
            -mag
        } else {
            mag
        }
    }

    /// Brute-force RNE onto a finite grid: nearest value, ties to the code whose lowest bit
    /// is 0 (the even code). `grid` lists (code, value) for non-negative values.
    fn nearest_even(a: f64, grid: &[(u8, f64)]) -> u8 {
        let mut best: Option<(u8, f64)> = None;
        for &(c, v) in grid {
            let d = (v - a).abs();
            best = match best {
                None => Some((c, d)),
                Some((bc, bd)) if d < bd || (d == bd && c & 1 == 0 && bc & 1 == 1) => Some((c, d)),
                keep => keep,
            };
        }
        best.unwrap().0
    }

    fn e4m3_positive_grid() -> Vec<(u8, f64)> {
        (0u8..0x7F).map(|c| (c, e4m3_value(c).unwrap())).collect()
    }

    #[test]
    fn bf16_matches_half_crate_near_every_rounding_boundary() {
        let lows = [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234];
        for hi in 0u32..=0xFFFF {
            for &lo in &lows {
                let x = f32::from_bits((hi << 16) | lo);
                let got = bf16(x);
                let want = half::bf16::from_f32(x).to_f32();
                if x.is_nan() {
                    assert!(got.is_nan(), "{x:e}");
                    assert_eq!(got.is_sign_negative(), x.is_sign_negative());
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "bits {:#010x}", x.to_bits());
                }
            }
        }
    }

    #[test]
    fn bf16_ties_go_to_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even mantissa (1.0) wins.
        assert_eq!(bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: 1 + 2^-6 has the even mantissa.
        assert_eq!(bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(bf16(f32::MAX), f32::INFINITY);
        assert_eq!(bf16(-0.0).to_bits(), (-0.0f32).to_bits());
        let mut xs = [1.0 + 2f32.powi(-8), f32::NAN];
        round_bf16(&mut xs);
        assert_eq!(xs[0], 1.0);
        assert!(xs[1].is_nan());
    }

    /// The add-and-remove-2^52 rounding is `round_ties_even` for every magnitude: halves,
    /// the binades where the sum's ulp changes (2^51, 2^52, 2^53) and beyond, at every
    /// quantum the encoders use.
    #[test]
    fn round_to_quantum_is_round_ties_even_at_every_magnitude() {
        for q in -9..=5 {
            let quantum = 2f64.powi(q);
            for e in [0, 1, 2, 3, 20, 50, 51, 52, 53, 60, 1000] {
                let base = 2f64.powi(e);
                for frac in [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 3.5] {
                    for v in [base + frac, base - frac, frac] {
                        let v = v.max(0.0);
                        let a = v * quantum;
                        assert_eq!(
                            round_to_quantum(a, quantum).to_bits(),
                            v.round_ties_even().to_bits(),
                            "{v} quanta of {quantum}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pow2ceil_is_two_to_the_ceiling_of_log2() {
        let check = |t: f32| {
            let r = pow2ceil(t);
            let want = 2f64.powf(f64::from(t).log2().ceil());
            assert_eq!(f64::from(r), want, "t = {t:e}");
            // Definition: the least power of two that is >= t.
            assert!(f64::from(r) >= f64::from(t) && f64::from(r) / 2.0 < f64::from(t));
        };
        // Every normal exponent with boundary mantissas.
        for e in 1u32..254 {
            for m in [0u32, 1, 2, 0x40_0000, 0x7F_FFFE, 0x7F_FFFF, 0x12_3456] {
                check(f32::from_bits((e << 23) | m));
            }
        }
        // A pseudo-random sweep (xorshift, fixed seed).
        let mut s = 0x9E37_79B9u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let bits = s & 0x7FFF_FFFF;
            let e = bits >> 23;
            if (1..254).contains(&e) {
                check(f32::from_bits(bits));
            }
        }
        assert_eq!(pow2ceil(1.0), 1.0);
        assert_eq!(pow2ceil(1.000_000_1), 2.0);
        assert_eq!(pow2ceil(0.75), 1.0);
    }

    #[test]
    fn e4m3_encode_inverts_every_code() {
        for c in 0u8..=255 {
            if let Some(v) = e4m3_value(c) {
                let (code, value) = e4m3_quantise(v as f32);
                assert_eq!(code, c, "code {c:#04x} (value {v})");
                assert_eq!(f64::from(value), v);
                assert_eq!(e4m3_encode(v as f32), c);
            }
        }
        assert_eq!(e4m3_encode(f32::NAN), 0x7F);
    }

    #[test]
    fn encoders_invert_the_tree_decoders_on_every_code() {
        // The readers' decoders (crate::dtype) and these encoders must agree on all codes.
        for c in 0u8..=255 {
            let v = crate::dtype::e4m3_to_f32(c);
            if v.is_nan() {
                assert_eq!(c & 0x7F, 0x7F);
                continue;
            }
            assert_eq!(e4m3_encode(v), c, "e4m3 code {c:#04x}");
            assert_eq!(Some(f64::from(v)), e4m3_value(c));
        }
        for c in 0u8..16 {
            let v = crate::dtype::e2m1_to_f32(c);
            // Code 8 ("−0") decodes to +0.0 in convert.py's table, which encodes back to 0.
            let want = if c == 8 && !v.is_sign_negative() {
                0
            } else {
                c
            };
            assert_eq!(e2m1_encode(v), want, "e2m1 code {c}");
            assert_eq!(f64::from(v).abs(), e2m1_value(c).abs());
        }
    }

    /// The branch-free rounding gives `e4m3_quantise`'s value on every bf16 (what the
    /// act-quant divides: a bf16 value over a power of two), every midpoint and one ulp either
    /// side, and a sweep of every 251st f32 within ±448.
    #[test]
    fn e4m3_round_clamped_is_the_quantiser_on_clamped_inputs() {
        let check = |x: f32| {
            let x = x.clamp(-E4M3_MAX, E4M3_MAX);
            let (got, want) = (e4m3_round_clamped(x), e4m3_quantise(x).1);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "x = {x:e}: {got:e}, want {want:e}"
            );
        };
        for bits in 0u16..=0xFFFF {
            check(half::bf16::from_bits(bits).to_f32());
        }
        for w in e4m3_positive_grid().windows(2) {
            let mid = ((w[0].1 + w[1].1) / 2.0) as f32;
            for x in [mid, mid.next_down(), mid.next_up()] {
                check(x);
                check(-x);
            }
        }
        for bits in (0..=448f32.to_bits()).step_by(251) {
            check(f32::from_bits(bits));
            check(-f32::from_bits(bits));
        }
    }

    #[test]
    fn e4m3_encode_is_nearest_even_on_every_bf16_and_every_midpoint() {
        let grid = e4m3_positive_grid();
        let check = |x: f32| {
            let (code, value) = e4m3_quantise(x);
            let a = f64::from(x.abs()).min(448.0);
            let want = nearest_even(a, &grid) | if x.is_sign_negative() { 0x80 } else { 0 };
            assert_eq!(code, want, "x = {x:e}");
            assert_eq!(Some(f64::from(value)), e4m3_value(code));
        };
        for bits in 0u16..=0xFFFF {
            let x = half::bf16::from_bits(bits).to_f32();
            if x.is_finite() {
                check(x);
            }
        }
        // Midpoints between neighbouring codes, and one f32 ulp either side.
        for w in grid.windows(2) {
            let mid = ((w[0].1 + w[1].1) / 2.0) as f32;
            for x in [mid, mid.next_down(), mid.next_up()] {
                check(x);
                check(-x);
            }
        }
        // Saturation (explicit clamp, never NaN) and the largest code.
        assert_eq!(e4m3_encode(448.0), 0x7E);
        assert_eq!(e4m3_encode(464.0), 0x7E);
        assert_eq!(e4m3_encode(1e30), 0x7E);
        assert_eq!(e4m3_encode(f32::INFINITY), 0x7E);
        assert_eq!(e4m3_encode(-1e30), 0xFE);
        assert_eq!(e4m3_encode(-0.0), 0x80);
        // Smallest subnormal 2^-9; half of it is a tie that rounds to zero (even).
        assert_eq!(e4m3_encode(2f32.powi(-9)), 0x01);
        assert_eq!(e4m3_encode(2f32.powi(-10)), 0x00);
        assert_eq!(e4m3_encode(3.0 * 2f32.powi(-10)), 0x02);
    }

    #[test]
    fn e2m1_encode_inverts_every_code_and_sends_midpoints_to_even() {
        for c in 0u8..16 {
            let v = e2m1_value(c);
            let x = if c == 8 { -0.0f32 } else { v as f32 };
            assert_eq!(e2m1_encode(x), c, "code {c}");
        }
        let mids = [
            (0.25f32, 0.0f32),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
        ];
        for (m, want) in mids {
            assert_eq!(e2m1_quantise(m).1, want, "+{m}");
            assert_eq!(e2m1_quantise(-m).1, -want, "-{m}");
            let upper = *E2M1_GRID.iter().find(|&&g| g > m).unwrap();
            let lower = *E2M1_GRID.iter().rev().find(|&&g| g < m).unwrap();
            assert_eq!(e2m1_quantise(m.next_up()).1, upper, "just above {m}");
            assert_eq!(e2m1_quantise(m.next_down()).1, lower, "just below {m}");
        }
        let grid: Vec<(u8, f64)> = (0u8..8).map(|c| (c, e2m1_value(c))).collect();
        for bits in 0u16..=0xFFFF {
            let x = half::bf16::from_bits(bits).to_f32();
            if x.is_finite() {
                let a = f64::from(x.abs()).min(6.0);
                let want = nearest_even(a, &grid) | if x.is_sign_negative() { 8 } else { 0 };
                assert_eq!(e2m1_encode(x), want, "x = {x:e}");
            }
        }
        assert_eq!(e2m1_encode(f32::INFINITY), 7);
        assert_eq!(e2m1_encode(-100.0), 15);
    }

    /// A reproducible stream of bf16-valued activations with a spread of magnitudes.
    fn activations(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = ((s >> 40) as f64) / (1u64 << 24) as f64 * 2.0 - 1.0;
                let mag = 2f64.powi((i % 7) as i32 * 3 - 9);
                bf16((u * mag) as f32)
            })
            .collect()
    }

    #[test]
    fn act_quant_fp8_blocks() {
        let x = activations(32 * 64, 7);
        let (codes, scales) = act_quant_fp8(&x);
        assert_eq!(scales.len(), 64);
        let mut inplace = x.clone();
        act_quant_fp8_inplace(&mut inplace);
        let grid = e4m3_positive_grid();
        for (b, &s) in scales.iter().enumerate() {
            let xb = &x[b * 32..(b + 1) * 32];
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
            // A power of two, the least one that keeps amax/s within the e4m3 range.
            assert_eq!(s, pow2ceil(amax * (1.0 / 448.0)));
            assert_eq!(s.to_bits() & 0x7F_FFFF, 0);
            for k in 0..32 {
                let i = b * 32 + k;
                let v = e4m3_value(codes[i]).unwrap();
                // The code is the nearest-even e4m3 of x/s (exact division by a power of two).
                let a = (f64::from(x[i]) / f64::from(s)).abs().min(448.0);
                assert_eq!(
                    codes[i] & 0x7F,
                    nearest_even(a, &grid),
                    "block {b} elem {k}"
                );
                // In-place form writes q·s, exactly representable in bf16.
                assert_eq!(f64::from(inplace[i]), v * f64::from(s));
                assert_eq!(bf16(inplace[i]), inplace[i]);
            }
        }
        // An all-zero block takes the amax floor 1e-4 and stays zero.
        let (c0, s0) = act_quant_fp8(&[0.0; 32]);
        assert!(c0.iter().all(|&c| c == 0));
        assert_eq!(s0[0], pow2ceil(1e-4f32 * (1.0 / 448.0)));
        assert_eq!(s0[0], 2f32.powi(-22));
    }

    #[test]
    fn fp4_qdq_midpoints_with_unit_scale() {
        // amax 6 gives scale 1 in both variants, so the values are the e2m1 rounding itself.
        let pattern = [6.0f32, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
        let want = [6.0f32, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0];
        let mut x32: Vec<f32> = (0..32)
            .map(|i| pattern[i % 8] * if i >= 16 { -1.0 } else { 1.0 })
            .collect();
        let mut x16 = x32[..16].to_vec();
        fp4_qdq_e8m0(&mut x32);
        fp4_qdq_e4m3(&mut x16);
        for i in 0..32 {
            let w = want[i % 8] * if i >= 16 { -1.0 } else { 1.0 };
            assert_eq!(x32[i], w, "e8m0 elem {i}");
            if i < 16 {
                assert_eq!(x16[i], w, "e4m3 elem {i}");
            }
        }
    }

    #[test]
    fn fp4_qdq_scales() {
        // E8M0: amax 7 → s = pow2ceil(7/6) = 2; 7/2 = 3.5 → 4 (tie to even) → 8, clamped grid.
        let mut x = vec![0f32; 32];
        x[0] = 7.0;
        x[1] = 1.0; // 0.5 → 0.5 → 1.0
        x[2] = 0.4; // 0.2 → 0 → 0
        fp4_qdq_e8m0(&mut x);
        assert_eq!(&x[..3], &[8.0, 1.0, 0.0]);
        // E4M3: amax 7 → s = e4m3(7/6 = 1.1666…) = 1.125; 7/1.125 = 6.22 → clamp 6 → 6.75.
        let mut y = vec![0f32; 16];
        y[0] = 7.0;
        y[1] = -1.0; // -0.888… → -1 → -1.125
        fp4_qdq_e4m3(&mut y);
        assert_eq!(&y[..2], &[6.75, -1.125]);
        // Zero blocks stay zero (the amax floors keep the scale nonzero).
        let mut z = vec![0f32; 32];
        fp4_qdq_e8m0(&mut z);
        fp4_qdq_e4m3(&mut z);
        assert!(z.iter().all(|&v| v == 0.0));
        // Every QDQ value is a bf16 and each block maps onto at most 15 distinct values.
        let mut a = activations(32 * 40, 3);
        let mut b = a.clone();
        fp4_qdq_e8m0(&mut a);
        fp4_qdq_e4m3(&mut b);
        assert!(a.iter().chain(&b).all(|&v| bf16(v) == v));
    }
}
