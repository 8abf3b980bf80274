//! The patch file: one preprocessed image as safetensors, as `ds41 preprocess` writes it and an
//! engine answers the protocol's `vision_preprocess` (conformance/PROTOCOL.md):
//!
//! * `patches` — BF16 `[n_vit_h · n_vit_w, 3, p, p]`, patches in row-major grid order;
//! * `grid` — I64 `[6]`: `n_vit_h, n_vit_w, n_llm_h, n_llm_w, pixel_height, pixel_width`;
//! * `token_types` — I64, the image's span in the LLM ([`TokenType`](super::span::TokenType)
//!   codes): `[START] ([IMAGE]×n_llm_w [NEWLINE])×n_llm_h [END]`.
//!
//! The tower request reads `patches` and `grid` back ([`PatchFile::read`]).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;

use super::preprocess::ImagePatches;
use super::span::span_types;
use crate::trace::{safetensors_bytes, RawTensor, TraceFile};
use crate::{Error, Result};

/// The `grid` tensor's values of preprocessed patches.
pub fn grid_values(p: &ImagePatches) -> [i64; 6] {
    let (n_vit_h, n_vit_w) = p.vit_grid();
    [
        n_vit_h,
        n_vit_w,
        p.plan.n_llm_h,
        p.plan.n_llm_w,
        p.plan.best_height,
        p.plan.best_width,
    ]
    .map(|v| v as i64)
}

/// The patch file's bytes, with `metadata`.
pub fn patch_file_bytes(p: &ImagePatches, metadata: &BTreeMap<String, String>) -> Result<Vec<u8>> {
    let (n_vit_h, n_vit_w) = p.vit_grid();
    let types: Vec<i64> = span_types(p.plan.n_llm_h, p.plan.n_llm_w)
        .into_iter()
        .map(|t| t.code())
        .collect();
    let ints = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let tensors = vec![
        RawTensor {
            name: "patches".into(),
            dtype: Dtype::BF16,
            shape: vec![n_vit_h * n_vit_w, 3, p.patch_size, p.patch_size],
            data: p
                .patches
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect(),
        },
        RawTensor {
            name: "grid".into(),
            dtype: Dtype::I64,
            shape: vec![6],
            data: ints(&grid_values(p)),
        },
        RawTensor {
            name: "token_types".into(),
            dtype: Dtype::I64,
            shape: vec![types.len()],
            data: ints(&types),
        },
    ];
    safetensors_bytes(tensors, metadata)
}

/// A patch file read back: the patch values (bf16 values as f32) and the ViT grid.
pub struct PatchFile {
    pub patches: Vec<f32>,
    pub patch_size: usize,
    pub n_vit_h: usize,
    pub n_vit_w: usize,
}

impl PatchFile {
    /// Read `patches` and `grid`, refusing shapes that do not agree, with the file named.
    pub fn read(path: &Path) -> Result<PatchFile> {
        let file = TraceFile::read(path)?;
        let bad = |reason: String| Error::Format {
            file: path.to_path_buf(),
            offset: 0,
            reason,
        };
        let (shape, patches) = file
            .f32("patches")
            .ok_or_else(|| bad("no float tensor `patches`".into()))?;
        let (_, grid) = file
            .i64("grid")
            .ok_or_else(|| bad("no integer tensor `grid`".into()))?;
        if grid.len() != 6 || grid.iter().any(|&v| v < 0) {
            return Err(bad(format!("`grid` must hold 6 counts, got {grid:?}")));
        }
        let (n_vit_h, n_vit_w) = (grid[0] as usize, grid[1] as usize);
        let patch_size = shape.get(2).copied().unwrap_or(0);
        let want = [n_vit_h * n_vit_w, 3, patch_size, patch_size];
        if shape != want || patch_size == 0 {
            return Err(bad(format!(
                "`patches` has shape {shape:?}; the grid {n_vit_h}x{n_vit_w} needs {want:?}"
            )));
        }
        Ok(PatchFile {
            patches: patches.to_vec(),
            patch_size,
            n_vit_h,
            n_vit_w,
        })
    }
}
