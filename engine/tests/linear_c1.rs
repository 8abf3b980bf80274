//! The linear kernel's C1 (MODEL.md §5.4) on a real release checkpoint: for every FP8 and FP4
//! weight of official_a, `Linear::forward` in the upstream profile (which sums dequantised
//! values exactly in f64) equals C1 computed literally from the stored codes and E8M0 scales
//! (`Checkpoint::quant_view`): integer block sums, rounded once to f32, times both scales,
//! accumulated in f32, rounded to bf16. Needs `DS41_UPSTREAM`.

use std::sync::Arc;

use ds41_engine::checkpoint::{self, Checkpoint, QuantKind, QuantView, Storage};
use ds41_engine::dtype::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use ds41_engine::model::linear::{Linear, LinearKind};
use ds41_engine::model::quant::{act_quant_fp8, bf16};
use ds41_engine::model::Numerics;
use ds41_engine::testing::upstream;

/// The stored weight code of (n, k) as an integer multiple of 2^-shift, and that shift.
fn weight_int(v: &QuantView, n: usize, k: usize) -> (i64, i32) {
    let c = v.code(n, k);
    match v.kind {
        QuantKind::Fp4 => ((e2m1_to_f32(c) * 2.0) as i64, 1),
        _ => ((e4m3_to_f32(c) * 512.0) as i64, 9),
    }
}

/// MODEL.md §5.4 C1, literally, from codes.
fn c1_from_codes(x: &[f32], v: &QuantView) -> Vec<f32> {
    let (out, inp) = (v.rows, v.cols);
    let xb: Vec<f32> = x.iter().map(|&a| bf16(a)).collect();
    let (qa, sa) = act_quant_fp8(&xb);
    (0..out)
        .map(|n| {
            let mut acc = 0f32;
            for kb in 0..inp / 32 {
                let mut p: i64 = 0;
                let mut shift = 9;
                for k in kb * 32..kb * 32 + 32 {
                    let a = (e4m3_to_f32(qa[k]) * 512.0) as i64;
                    let (w, s) = weight_int(v, n, k);
                    shift = s;
                    p += a * w;
                }
                let p_f32 = (p as f64 * 2f64.powi(-9 - shift)) as f32;
                acc += p_f32 * sa[kb] * e8m0_to_f32(v.scale_byte(n, kb * 32));
            }
            bf16(acc)
        })
        .collect()
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn upstream_linear_equals_c1_on_stored_codes_for_every_quantised_weight() {
    let up = upstream();
    let ckpt: Arc<dyn Checkpoint> =
        Arc::from(checkpoint::open(&up.join("official_a/checkpoint")).unwrap());
    let mut checked = 0;
    for name in ckpt.names() {
        let storage = ckpt.storage(&name).unwrap();
        let kind = match storage {
            Storage::Fp8Block => LinearKind::Fp8,
            Storage::Fp4 => LinearKind::Fp4,
            _ => continue,
        };
        let Some(view) = ckpt.quant_view(&name).unwrap() else {
            continue;
        };
        let lin = Linear::load(&ckpt, &name, kind).unwrap();
        // A spread of magnitudes so blocks get different activation scales.
        let x: Vec<f32> = (0..view.cols)
            .map(|k| ((k * 7919 % 613) as f32 / 306.5 - 1.0) * 2f32.powi((k % 9) as i32 - 4))
            .collect();
        let mut y = vec![0f32; view.rows];
        lin.forward(&x, 1, &mut y, Numerics::Upstream).unwrap();
        let want = c1_from_codes(&x, &view);
        let bad = (0..y.len()).find(|&i| y[i].to_bits() != want[i].to_bits());
        assert!(
            bad.is_none(),
            "{name}: output {bad:?} differs from C1 on codes"
        );
        checked += 1;
    }
    assert!(checked > 20, "only {checked} quantised weights checked");
    eprintln!("linear_c1: {checked} FP8/FP4 weights equal C1 on their stored codes");
}
