//! Native draws: quantised weights are drawn directly as codes, so reading them back yields
//! exactly the drawn values and no encoder is needed (MODEL.md §4.5, CONTAINER.md §3–§6).
//!
//! Every function takes the object's own [`SplitMix64`] stream and, when asked, returns the
//! exact value of each drawn code next to its bytes. Code distributions (documented because
//! they are part of the byte output):
//!
//! * **e4m3**: one u64 per code; bit 0 sign, bits 1–3 mantissa; bits 4–9 = 0 (1 in 64) picks
//!   exponent 0 (subnormals and ±0), else exponent 4 + (bits 10.. mod 5), i.e. magnitudes
//!   2^−3 … 1.875·2. Never NaN. RMS of a code ≈ [`E4M3_CODE_RMS`].
//! * **E8M0 scale**: 127 + round(log2(target / code_rms)) + jitter, jitter uniform in {−1, 0, 1}.
//! * **FP4**: one u64 per byte; low nibble = bits 0–3, high nibble = bits 4–7 (all 16 codes,
//!   including 8 = "−0").
//! * **bf16**: an f32 uniform draw truncated to its upper 16 bits.
//! * **Q8G / Q4G ints**: uniform in [−127, 127] / [−8, 7]; padding columns are 0.
//! * **f16 scales**: target / code_rms · 2^u, u uniform in [−½, ½), rounded to f16.
//! * **VQ codebooks**: k/1024 with k uniform in [−1023, 1023] (exact in f16; any three-stage
//!   sum times an f16 scale is exact in f32, whatever the summation order).

use crate::inventory::Init;
use crate::rng::SplitMix64;
use half::f16;

pub const E4M3_CODE_RMS: f64 = 1.513;
pub const FP4_CODE_RMS: f64 = 2.926;
pub const Q8_CODE_RMS: f64 = 73.62;
pub const Q4_CODE_RMS: f64 = 4.637;
/// RMS of one dequantised VQ weight before its row scale: 3 stages of uniform(−1, 1).
pub const VQ_CODE_RMS: f64 = 1.0;

const FP4_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// One e4m3 code and its exact value.
pub fn e4m3(rng: &mut SplitMix64) -> (u8, f32) {
    let x = rng.next_u64();
    let sign = (x & 1) as u8;
    let m = ((x >> 1) & 7) as u8;
    let e = if (x >> 4) & 63 == 0 {
        0u8
    } else {
        4 + ((x >> 10) % 5) as u8
    };
    let mag = if e == 0 {
        f32::from(m) / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + f32::from(m) / 8.0) * 2f32.powi(i32::from(e) - 7)
    };
    let v = if sign == 1 { -mag } else { mag };
    ((sign << 7) | (e << 3) | m, v)
}

/// One E8M0 scale byte for values of RMS `target` built from codes of RMS `code_rms`.
pub fn e8m0(rng: &mut SplitMix64, target: f64, code_rms: f64) -> u8 {
    let base = (target / code_rms).log2().round() as i64;
    let jitter = rng.below(3) as i64 - 1;
    (127 + base + jitter).clamp(1, 254) as u8
}

/// Exact value of an E8M0 scale byte.
pub fn e8m0_value(b: u8) -> f32 {
    2f32.powi(i32::from(b) - 127)
}

/// One packed FP4 byte and the exact values of its (even, odd) elements.
pub fn fp4_pair(rng: &mut SplitMix64) -> (u8, [f32; 2]) {
    let x = rng.next_u64();
    let lo = (x & 15) as u8;
    let hi = ((x >> 4) & 15) as u8;
    (lo | (hi << 4), [fp4_value(lo), fp4_value(hi)])
}

fn fp4_value(nibble: u8) -> f32 {
    let mag = FP4_MAGNITUDES[usize::from(nibble & 7)];
    if nibble & 8 != 0 && mag != 0.0 {
        -mag
    } else {
        mag
    }
}

/// A value drawn for a plain (F32 or bf16) tensor: uniform with the init's range.
pub fn plain(rng: &mut SplitMix64, init: Init, fan_in: usize) -> f64 {
    match init {
        Init::Uniform(lo, hi) => rng.uniform(lo, hi),
        Init::Norm => rng.uniform(0.75, 1.25),
        Init::Linear(_) => {
            let a = init.target_rms(fan_in) * 3f64.sqrt();
            rng.uniform(-a, a)
        }
    }
}

/// bf16 bits (truncation of the f32 draw) and their exact value.
pub fn bf16(rng: &mut SplitMix64, init: Init, fan_in: usize) -> (u16, f32) {
    let bits = ((plain(rng, init, fan_in) as f32).to_bits() >> 16) as u16;
    (bits, f32::from_bits(u32::from(bits) << 16))
}

/// IEEE binary16 bits of `x`, correctly rounded (nearest, ties to even) straight from f64, as
/// CPython's `struct.pack('<e', x)` does. (Going through f32 first can round twice.)
pub fn f16_bits(x: f64) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7E00;
    }
    if a == 0.0 {
        return sign;
    }
    let e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    let e = if 2f64.powi(e) > a {
        e - 1
    } else if 2f64.powi(e + 1) <= a {
        e + 1
    } else {
        e
    };
    if e < -14 {
        let m = (a / 2f64.powi(-24)).round_ties_even() as u16; // subnormal (or rounds up to 0x400)
        return sign | m;
    }
    let mut m = (a / 2f64.powi(e - 10)).round_ties_even() as u32;
    let mut e = e;
    if m == 2048 {
        m = 1024;
        e += 1;
    }
    if e > 15 {
        return sign | 0x7C00;
    }
    sign | (((e + 15) as u16) << 10) | (m - 1024) as u16
}

/// An f16 group/row scale for values of RMS `target` from codes of RMS `code_rms`.
pub fn f16_scale(rng: &mut SplitMix64, target: f64, code_rms: f64) -> (u16, f32) {
    let s = f16::from_bits(f16_bits(
        target / code_rms * 2f64.powf(rng.uniform(-0.5, 0.5)),
    ));
    (s.to_bits(), s.to_f32())
}

/// A VQ codebook entry k/1024, as f16 bits and value.
pub fn vq_entry(rng: &mut SplitMix64) -> (u16, f32) {
    let k = rng.range_i64(-1023, 1023);
    let v = f16::from_bits(f16_bits(k as f64 / 1024.0));
    (v.to_bits(), v.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_rms_constants_are_right() {
        let mut r = SplitMix64::new(7);
        let n = 200_000;
        let rms = |f: &mut dyn FnMut() -> f64| {
            (0..n).map(|_| f().powi(2)).sum::<f64>().sqrt() / (n as f64).sqrt()
        };
        let e = rms(&mut || f64::from(e4m3(&mut r).1));
        assert!((e / E4M3_CODE_RMS - 1.0).abs() < 0.02, "{e}");
        let f = rms(&mut || f64::from(fp4_pair(&mut r).1[0]));
        assert!((f / FP4_CODE_RMS - 1.0).abs() < 0.02, "{f}");
    }

    #[test]
    fn f16_rounding_is_correct_from_f64() {
        // CPython: struct.pack('<e', x) for these values (ties to even, subnormals, overflow).
        assert_eq!(f16_bits(1.0), 0x3C00);
        assert_eq!(f16_bits(1.0 + 2f64.powi(-11)), 0x3C00); // tie → even
        assert_eq!(f16_bits(1.0 + 3.0 * 2f64.powi(-11)), 0x3C02); // tie → even (up)
        assert_eq!(f16_bits(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3C01); // just above the tie
        assert_eq!(f16_bits(2f64.powi(-24)), 0x0001);
        assert_eq!(f16_bits(-0.3), 0xB4CD);
        assert_eq!(f16_bits(65504.0), 0x7BFF);
        assert_eq!(f16_bits(65520.0), 0x7C00);
        assert_eq!(f16_bits(2f64.powi(-14)), 0x0400);
        for k in -1023..=1023 {
            let x = k as f64 / 1024.0;
            assert_eq!(f16::from_bits(f16_bits(x)).to_f64(), x);
        }
    }

    #[test]
    fn e4m3_codes_are_never_nan_and_values_match_the_format() {
        let mut r = SplitMix64::new(3);
        for _ in 0..10_000 {
            let (b, v) = e4m3(&mut r);
            assert!(b & 0x7F != 0x7F);
            let e = i32::from((b >> 3) & 15);
            let m = f32::from(b & 7);
            let mag = if e == 0 {
                m / 8.0 / 64.0
            } else {
                (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
            assert_eq!(v.abs(), mag);
            assert_eq!(v < 0.0, b & 0x80 != 0 && mag != 0.0);
        }
    }
}
