//! Byte-level decoding of the stored number formats (MODEL.md §4.5): e4m3 (e4m3fn), e2m1
//! (packed FP4), e8m0 scale bytes, bf16 and f16. Every decoder is exact: each stored value is
//! representable in f32, and a dequantised weight `code · 2^(s−127)` is an exact f32 product.

/// f32 bit patterns of the 256 e4m3fn codes, built with integer arithmetic only.
const E4M3_BITS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut c = 0;
    while c < 256 {
        let sign = ((c as u32) >> 7) << 31;
        let e = ((c >> 3) & 0xF) as u32;
        let m = (c & 7) as u32;
        t[c] = if e == 0xF && m == 7 {
            0x7FC0_0000 | sign // 0x7F / 0xFF: NaN (no infinities in e4m3fn)
        } else if e == 0 {
            if m == 0 {
                sign
            } else {
                // subnormal m·2^-9: normalise the 3-bit mantissa into f32.
                let k = 31 - m.leading_zeros(); // position of the leading 1, 0..=2
                let exp = k + 127 - 9;
                sign | (exp << 23) | ((m - (1 << k)) << (23 - k))
            }
        } else {
            sign | ((e + 127 - 7) << 23) | (m << 20)
        };
        c += 1;
    }
    t
};

/// Decode one e4m3fn byte (OCP float8, bias 7, `0x7F`/`0xFF` NaN, max ±448).
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    f32::from_bits(E4M3_BITS[code as usize])
}

/// The e2m1 magnitudes of codes 0..8; bit 3 is the sign.
const E2M1_MAGNITUDE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decode one e2m1 nibble (low 4 bits of `code`). Code 8 ("−0") decodes to +0.0, as in
/// `convert.py`'s table (MODEL.md §4.5).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let mag = E2M1_MAGNITUDE[(code & 7) as usize];
    if code & 8 != 0 && mag != 0.0 {
        -mag
    } else {
        mag
    }
}

/// f32 bit patterns of the 16 e2m1 codes (code 8 → +0.0).
const E2M1_BITS: [u32; 16] = {
    const MAG: [u32; 8] = [
        0,
        0x3F00_0000,
        0x3F80_0000,
        0x3FC0_0000,
        0x4000_0000,
        0x4040_0000,
        0x4080_0000,
        0x40C0_0000,
    ];
    let mut t = [0u32; 16];
    let mut c = 0;
    while c < 16 {
        let m = MAG[c & 7];
        t[c] = if c >= 8 && m != 0 { m | 0x8000_0000 } else { m };
        c += 1;
    }
    t
};

/// Both e2m1 values of one packed FP4 byte: `[low nibble (even element), high nibble]`.
#[inline]
pub fn e2m1_pair(byte: u8) -> [f32; 2] {
    [
        f32::from_bits(E2M1_BITS[(byte & 0xF) as usize]),
        f32::from_bits(E2M1_BITS[(byte >> 4) as usize]),
    ]
}

/// The 256 e4m3fn codes widened to f64 (for the matrix-vector kernels, which multiply in
/// f64; `E4M3_F64[c] == e4m3_to_f32(c) as f64`).
pub static E4M3_F64: [f64; 256] = {
    let mut t = [0f64; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = f32::from_bits(E4M3_BITS[c]) as f64;
        c += 1;
    }
    t
};

/// Both e2m1 values of every packed FP4 byte widened to f64 (`[low nibble, high nibble]`,
/// equal to [`e2m1_pair`]).
pub static E2M1_PAIR_F64: [[f64; 2]; 256] = {
    let mut t = [[0f64; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [
            f32::from_bits(E2M1_BITS[b & 0xF]) as f64,
            f32::from_bits(E2M1_BITS[b >> 4]) as f64,
        ];
        b += 1;
    }
    t
};

/// The top 16 bits of the f64 of every e4m3 magnitude code (0..128; sign bit clear) and of every
/// e2m1 nibble. Every such value has at most four significant bits, so its f64 is zero below
/// bit 48 (asserted when the tables are built) and these two bytes alone are the number: a
/// vector kernel builds the f64 with two byte lookups and no conversion.
pub const E4M3_F64_TOP: [u16; 128] = {
    let mut t = [0u16; 128];
    let mut c = 0;
    while c < 128 {
        t[c] = f64_top16(f32::from_bits(E4M3_BITS[c]) as f64);
        c += 1;
    }
    t
};

/// [`E4M3_F64_TOP`] for the 16 e2m1 nibbles (code 8 is +0.0).
pub const E2M1_F64_TOP: [u16; 16] = {
    let mut t = [0u16; 16];
    let mut c = 0;
    while c < 16 {
        t[c] = f64_top16(f32::from_bits(E2M1_BITS[c]) as f64);
        c += 1;
    }
    t
};

const fn f64_top16(v: f64) -> u16 {
    let bits = v.to_bits();
    // NaN (e4m3 0x7F) is the one value with low bits; kernels leave NaN codes to the tables.
    assert!(bits & 0xFFFF_FFFF_FFFF == 0 || v.is_nan());
    (bits >> 48) as u16
}

/// Decode one E8M0 scale byte: `2^(b − 127)`; 255 is NaN; 0 is 2^−127 (an f32 subnormal).
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        b => f32::from_bits((b as u32) << 23),
    }
}

/// [`e8m0_to_f32`] widened to f64, for bytes 0..=254 (every one a normal f64: `2^(b − 127)`).
#[inline(always)]
pub fn e8m0_to_f64(b: u8) -> f64 {
    debug_assert!(b != 255, "E8M0 255 is NaN");
    f64::from_bits((u64::from(b) + 1023 - 127) << 52)
}

/// bf16 → f32: the bf16 bits are the upper half of the f32 (exact), and a NaN gets its quiet
/// bit set, as the `half` crate's conversion does (bit-identical to it for all 65,536 inputs).
/// Written out so it is always inlined: the kernels call it once per weight, and an
/// out-of-line call cost about a tenth of a small model's decode step.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    let quiet = if bits & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    f32::from_bits(((bits | quiet) as u32) << 16)
}

/// IEEE binary16 → f32 (exact), bit-identical to the `half` crate's conversion for all 65,536
/// inputs (a NaN keeps its payload and gets its quiet bit set). Written out, with no branch:
/// the crate's function is a call that tests the CPU's features each time, and the kernels
/// decode a row scale per row and block.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let h = u32::from(bits);
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7FFF;
    // Finite: the magnitude bits under f32's exponent field are the value times 2^-112 (a
    // subnormal half becomes a subnormal f32, exactly), and 2^112 puts the bias back.
    let finite = (f32::from_bits(magnitude << 13) * f32::from_bits((127 + 112) << 23)).to_bits();
    let payload = (magnitude & 0x3FF) << 13;
    let quiet = if payload != 0 { 0x0040_0000 } else { 0 };
    let special = 0x7F80_0000 | payload | quiet;
    f32::from_bits(sign | if magnitude >= 0x7C00 { special } else { finite })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 shortcut is the f32 decoder widened, for every byte but NaN's 255 (0 is an f32
    /// subnormal: the case a wrong bias would miss first).
    #[test]
    fn e8m0_to_f64_is_the_f32_decoder_widened() {
        for b in 0..=254u8 {
            assert_eq!(
                e8m0_to_f64(b).to_bits(),
                f64::from(e8m0_to_f32(b)).to_bits(),
                "byte {b}"
            );
        }
    }

    #[test]
    fn bf16_to_f32_is_the_half_crates_conversion_bit_for_bit() {
        for bits in 0..=u16::MAX {
            assert_eq!(
                bf16_to_f32(bits).to_bits(),
                half::bf16::from_bits(bits).to_f32().to_bits(),
                "{bits:#06x}"
            );
        }
    }

    #[test]
    fn f16_to_f32_is_the_half_crates_conversion_bit_for_bit() {
        for bits in 0..=u16::MAX {
            assert_eq!(
                f16_to_f32(bits).to_bits(),
                half::f16::from_bits(bits).to_f32().to_bits(),
                "{bits:#06x}"
            );
        }
    }

    /// Independent definition straight from MODEL.md §4.5 in f64.
    fn e4m3_reference(code: u8) -> f64 {
        let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code >> 3) & 0xF) as i32;
        let m = (code & 7) as f64;
        if e == 0xF && code & 7 == 7 {
            return f64::NAN;
        }
        if e == 0 {
            s * (m / 8.0) * 2f64.powi(-6)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    #[test]
    fn e4m3_all_256_codes() {
        for c in 0..=255u8 {
            let got = e4m3_to_f32(c);
            let want = e4m3_reference(c);
            if want.is_nan() {
                assert!(got.is_nan(), "code {c:#04x} must be NaN");
                assert!(c == 0x7F || c == 0xFF);
            } else {
                assert_eq!(got as f64, want, "code {c:#04x}");
                assert_eq!(got.is_sign_negative(), c & 0x80 != 0, "sign of {c:#04x}");
                // every value is a multiple of 2^-9
                assert_eq!((want * 512.0).fract(), 0.0);
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        let nans = (0..=255u8).filter(|&c| e4m3_to_f32(c).is_nan()).count();
        assert_eq!(nans, 2);
    }

    #[test]
    fn e2m1_all_16_codes() {
        let want = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for c in 0..16u8 {
            assert_eq!(e2m1_to_f32(c), want[c as usize], "code {c}");
            // only the low nibble counts
            assert_eq!(e2m1_to_f32(c | 0xF0).to_bits(), e2m1_to_f32(c).to_bits());
        }
        for b in 0..=255u8 {
            let [lo, hi] = e2m1_pair(b);
            assert_eq!(lo.to_bits(), e2m1_to_f32(b & 0xF).to_bits());
            assert_eq!(hi.to_bits(), e2m1_to_f32(b >> 4).to_bits());
        }
        // code 8 is +0.0, not -0.0 (convert.py's table)
        assert_eq!(e2m1_to_f32(8).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn wide_tables_equal_the_f32_decoders() {
        for c in 0..=255u8 {
            let (a, b) = (E4M3_F64[c as usize], f64::from(e4m3_to_f32(c)));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{c}"
            );
            let [lo, hi] = e2m1_pair(c);
            assert_eq!(E2M1_PAIR_F64[c as usize], [f64::from(lo), f64::from(hi)]);
        }
    }

    #[test]
    fn e8m0_all_256_bytes() {
        for b in 0..=255u8 {
            let got = e8m0_to_f32(b);
            if b == 255 {
                assert!(got.is_nan());
            } else {
                assert_eq!(got as f64, 2f64.powi(b as i32 - 127), "byte {b}");
            }
        }
        assert_eq!(e8m0_to_f32(127), 1.0);
    }

    #[test]
    fn dequantised_products_are_exact() {
        // e4m3 · e8m0 in f32 equals the f64 product for every code and scale: no rounding,
        // even in the subnormal range reached with scale 2^-127.
        for c in 0..=255u8 {
            for s in 0..255u8 {
                let got = e4m3_to_f32(c) * e8m0_to_f32(s);
                let want = e4m3_reference(c) * 2f64.powi(s as i32 - 127);
                if want.is_nan() {
                    assert!(got.is_nan());
                } else if want.abs() < f32::MAX as f64 {
                    assert_eq!(got as f64, want, "code {c:#04x} scale {s}");
                }
            }
        }
    }

    #[test]
    fn bf16_and_f16_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let b = bf16_to_f32(bits);
            if b.is_nan() {
                assert!(half::bf16::from_bits(bits).is_nan());
            } else {
                // bf16 is the top half of an f32
                assert_eq!(b.to_bits(), (bits as u32) << 16);
            }
            let h = f16_to_f32(bits);
            let e = (bits >> 10) & 0x1F;
            let m = (bits & 0x3FF) as f64;
            let s = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
            let want = match e {
                0 => s * m * 2f64.powi(-24),
                0x1F if m == 0.0 => s * f64::INFINITY,
                0x1F => f64::NAN,
                e => s * (1.0 + m / 1024.0) * 2f64.powi(e as i32 - 15),
            };
            if want.is_nan() {
                assert!(h.is_nan());
            } else {
                assert_eq!(h as f64, want, "f16 {bits:#06x}");
            }
        }
    }
}
