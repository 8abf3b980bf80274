//! Shared helpers of the model tests: comparing arrays, opening the official_a checkpoint,
//! and writing WASTE's synthetic test container.

#![allow(dead_code)]

pub mod compare;

use std::path::Path;

use ds41_engine::model::Model;

/// The official_a checkpoint, its Engram token map built from its own (stub) tokenizer.json
/// as the official code builds it.
pub fn official_a_model(up: &Path) -> Model {
    Model::open(&up.join("official_a/checkpoint")).unwrap()
}

#[allow(unused_imports)]
pub use ds41_engine::testing::upstream;

/// WASTE's synthetic DS41 test container ([`ds41_synthetic::waste_test_container`]); the
/// directory lives as long as the returned guard.
pub fn waste_container() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("waste-tiny-s0");
    ds41_synthetic::waste_test_container(&out).unwrap();
    (dir, out)
}

/// A golden of this repository (`goldens/REL`).
pub fn golden(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../goldens")
        .join(rel)
}

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
