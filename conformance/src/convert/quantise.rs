//! Symmetric scalar group quantisation with f16 scales: the trunk's Q8G / Q4G rows
//! (CONTAINER.md §3) and the Engram table rows (§6). A group's scale is its largest magnitude
//! over the largest code (127 or 7), rounded to f16; each value is rounded to the nearest
//! multiple of that f16 scale and clamped to the code range.

use half::f16;

/// The codes and scales of `rows` quantised rows.
#[derive(Debug, Clone, Default)]
pub struct GroupedRows {
    /// `rows × padded_cols` codes (padding columns are 0).
    pub ints: Vec<i8>,
    /// `rows × groups` f16 scale bits, row-major (row, group).
    pub scales: Vec<u16>,
}

/// The largest code of a bit width (the scale maps a group's largest magnitude onto it).
fn max_code(bits: u8) -> f32 {
    if bits == 8 {
        127.0
    } else {
        7.0
    }
}

/// Quantise row-major `values` (`cols` per row) in groups of `group` columns to `bits` (4 or
/// 8). Each row is padded with zero codes to `padded_cols` (≥ cols, a multiple of `group`).
/// `Err` names the first group whose scale does not fit an f16 (a magnitude above
/// 65504 · the largest code, or a non-finite value): (row, column).
pub fn quantise_rows(
    values: &[f32],
    cols: usize,
    padded_cols: usize,
    group: usize,
    bits: u8,
) -> Result<GroupedRows, (usize, usize)> {
    let rows = values.len() / cols.max(1);
    let groups = padded_cols / group;
    let (lo, hi) = if bits == 8 {
        (-128.0, 127.0)
    } else {
        (-8.0, 7.0)
    };
    let mut out = GroupedRows {
        ints: vec![0; rows * padded_cols],
        scales: vec![0; rows * groups],
    };
    for r in 0..rows {
        let row = &values[r * cols..(r + 1) * cols];
        for g in 0..groups {
            let cells = &row[(g * group).min(cols)..((g + 1) * group).min(cols)];
            let amax = cells.iter().fold(0f32, |m, x| m.max(x.abs()));
            if !amax.is_finite() || cells.iter().any(|x| x.is_nan()) {
                return Err((r, g * group));
            }
            let scale = f16::from_f32(amax / max_code(bits));
            if !scale.is_finite() {
                return Err((r, g * group));
            }
            out.scales[r * groups + g] = scale.to_bits();
            let s = scale.to_f32();
            if s == 0.0 {
                continue;
            }
            for (c, &x) in cells.iter().enumerate() {
                out.ints[r * padded_cols + g * group + c] = (x / s).round().clamp(lo, hi) as i8;
            }
        }
    }
    Ok(out)
}

/// The values a [`GroupedRows`] decodes to (CONTAINER.md §3): `int · f32(scale)`.
pub fn dequantise_row(
    q: &GroupedRows,
    r: usize,
    cols: usize,
    padded_cols: usize,
    group: usize,
) -> Vec<f32> {
    let groups = padded_cols / group;
    (0..cols)
        .map(|c| {
            f32::from(q.ints[r * padded_cols + c])
                * f16::from_bits(q.scales[r * groups + c / group]).to_f32()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_within_half_a_step_and_padding_is_zero() {
        let cols = 200;
        let values: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        for bits in [4u8, 8] {
            let q = quantise_rows(&values, cols, 256, 128, bits).unwrap();
            assert_eq!(q.ints.len(), 2 * 256);
            assert!(q.ints[200..256].iter().all(|&x| x == 0));
            for r in 0..2 {
                let back = dequantise_row(&q, r, cols, 256, 128);
                for (c, (&b, &v)) in back.iter().zip(&values[r * cols..]).enumerate() {
                    let step = f16::from_bits(q.scales[r * 2 + c / 128]).to_f32();
                    assert!(
                        (b - v).abs() <= 0.5 * step * 1.001,
                        "bits {bits} r {r} c {c}"
                    );
                }
            }
        }
        // A zero group has scale 0 and zero codes.
        let q = quantise_rows(&[0.0; 8], 8, 8, 8, 4).unwrap();
        assert_eq!((q.scales[0], q.ints.iter().all(|&x| x == 0)), (0, true));
    }

    #[test]
    fn values_beyond_an_f16_scale_are_refused_with_their_place() {
        let mut v = vec![1.0f32; 256];
        v[130] = 1e9;
        assert_eq!(quantise_rows(&v, 128, 128, 128, 4).unwrap_err(), (1, 0));
        v[130] = f32::NAN;
        assert_eq!(quantise_rows(&v, 128, 128, 128, 8).unwrap_err(), (1, 0));
    }
}
