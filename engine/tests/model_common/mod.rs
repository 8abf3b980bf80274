//! Shared helpers of the model tests: comparing
//! arrays, and opening the official_a checkpoint.

#![allow(dead_code)]

pub mod compare;

use std::path::Path;

use ds41_engine::model::Model;
use ds41_engine::trace::TraceFile;

/// The official_a checkpoint with the Engram token map its goldens carry (its stub
/// tokenizer.json is not a DS41 tokenizer, which the tokenizer module refuses).
pub fn official_a_model(up: &Path) -> Model {
    Model::open_with_token_map(
        &up.join("official_a/checkpoint"),
        Some(official_a_token_map(up)),
    )
    .unwrap()
}

/// The Engram token map every official_a golden carries.
pub fn official_a_token_map(up: &Path) -> Vec<i32> {
    let g =
        TraceFile::read(&up.join("official_a/p48_d00/golden_prefill_only.safetensors")).unwrap();
    g.i64("engram_token_map")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as i32)
        .collect()
}

pub use ds41_engine::testing::upstream;

pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((*x as f64) - (*y as f64)).powi(2))
        .sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    if n > 0.0 {
        (d / n).sqrt()
    } else {
        d.sqrt()
    }
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}
