//! The two numerics regimes and the canonical reductions (MODEL.md §5.1, §5.4 C2/C3).
//!
//! * [`Numerics::Upstream`]: the official code's bf16 rounding points and fake-quant steps,
//!   with this project's canonical summation orders.
//! * [`Numerics::Exact`]: pure f32 on exactly dequantised weights; nothing rounds to bf16.
//!
//! C2 — every reduction that is not an FP8/FP4 block GEMM or a 4-term hyper-connection sum —
//! accumulates in f64 in increasing index order and rounds once to f32 ([`dot_f64`],
//! [`sum_f64`], [`mean_sq_f64`]). An f32·f32 product is exact in f64, so a C2 dot only rounds
//! at each f64 addition, and its result never depends on how many rows a call processes.

use std::fmt;
use std::str::FromStr;

use super::quant::round_bf16;

/// The numerics regime of a run (MODEL.md §5.1). Recorded in every trace and state file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Numerics {
    /// bf16 rounding points and QDQ steps of the official code, canonical reductions.
    Upstream,
    /// Pure f32 on exactly dequantised weights.
    Exact,
}

impl Numerics {
    /// A **[bf16]** rounding point: rounds in the upstream regime, does nothing in exact.
    #[inline]
    pub fn round(self, xs: &mut [f32]) {
        if self == Numerics::Upstream {
            round_bf16(xs);
        }
    }

    /// The scalar form of [`Numerics::round`].
    #[inline]
    pub fn round1(self, x: f32) -> f32 {
        match self {
            Numerics::Upstream => super::quant::bf16(x),
            Numerics::Exact => x,
        }
    }

    /// Whether the upstream QDQ steps and bf16 points apply.
    #[inline]
    pub fn is_upstream(self) -> bool {
        self == Numerics::Upstream
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Numerics::Upstream => "upstream",
            Numerics::Exact => "exact",
        }
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "upstream" => Ok(Numerics::Upstream),
            "exact" => Ok(Numerics::Exact),
            other => Err(format!(
                "unknown numerics `{other}` (expected `upstream` or `exact`)"
            )),
        }
    }
}

/// C2 dot product: `Σ a[k]·b[k]` accumulated in f64 in increasing k, rounded once to f32.
/// The slices must have equal length.
#[inline]
pub fn dot_f64(a: &[f32], b: &[f32]) -> f32 {
    dot_f64_wide(a, b) as f32
}

/// C2 dot product before its final rounding (for callers that round to bf16 or divide first).
#[inline]
pub fn dot_f64_wide(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        acc += f64::from(x) * f64::from(y);
    }
    acc
}

/// C2 sum: f64 accumulation in increasing index order, rounded once to f32.
#[inline]
pub fn sum_f64(xs: &[f32]) -> f32 {
    xs.iter().fold(0f64, |acc, &x| acc + f64::from(x)) as f32
}

/// C2 mean of squares (the RMSNorm statistic): `Σ x²` in f64 in index order, divided by the
/// length in f64, rounded once to f32.
#[inline]
pub fn mean_sq_f64(xs: &[f32]) -> f32 {
    if xs.is_empty() {
        return 0.0;
    }
    (dot_f64_wide(xs, xs) / xs.len() as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for n in [Numerics::Upstream, Numerics::Exact] {
            assert_eq!(n.to_string().parse::<Numerics>().unwrap(), n);
        }
        assert!("bf16".parse::<Numerics>().is_err());
        assert_eq!(
            serde_json::to_string(&Numerics::Exact).unwrap(),
            "\"exact\""
        );
    }

    #[test]
    fn round_only_in_upstream() {
        let x = 1.0f32 + f32::EPSILON;
        let mut a = [x];
        Numerics::Exact.round(&mut a);
        assert_eq!(a[0], x);
        Numerics::Upstream.round(&mut a);
        assert_eq!(a[0], 1.0);
    }

    #[test]
    fn dot_rounds_once() {
        // 1 + 2^-30 - 1 in f32 accumulation would lose the small term; f64 keeps it.
        let a = [1.0f32, 2f32.powi(-30), -1.0];
        let b = [1.0f32, 1.0, 1.0];
        assert_eq!(dot_f64(&a, &b), 2f32.powi(-30));
        assert_eq!(sum_f64(&a), 2f32.powi(-30));
        assert_eq!(mean_sq_f64(&[3.0, 4.0]), 12.5);
    }
}
