//! Shared helpers of the model tests: comparing
//! arrays, and opening the official_a checkpoint.

#![allow(dead_code)]

pub mod compare;

use std::path::Path;

use ds41_engine::model::Model;

/// The official_a checkpoint, its Engram token map built from its own (stub) tokenizer.json
/// as the official code builds it.
pub fn official_a_model(up: &Path) -> Model {
    Model::open(&up.join("official_a/checkpoint")).unwrap()
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
