//! Weight access by canonical (release) tensor name, for both checkpoint layouts
//! (MODEL.md §4, CONTAINER.md §1–§8).
//!
//! OWNER: readers helper (issue 2). The trait below is the shared interface the forward
//! pass codes against; implementations live in `release` and `container`.

use crate::config::Config;

/// Which on-disk layout a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// The official release: `config.json` + safetensors.
    Release,
    /// The WASTE v0 container directory.
    Container,
}

/// How a tensor is stored, so the upstream numerics can pick the matching linear (MODEL.md
/// §4.8) and a report can say what was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    F32,
    Bf16,
    F16,
    /// FP8 e4m3 with E8M0 32x32 block scales.
    Fp8Block,
    /// Packed FP4 (e2m1) with per-row-per-32 E8M0 scales.
    Fp4,
    /// Container int8 with f16 group scales.
    Q8G,
    /// Container int4 with f16 group scales.
    Q4G,
    /// Container VQ3R expert record.
    Vq3r,
    /// Container Engram rows (int4/int8 with f16 group scales).
    EngramRows,
}

/// Read access to the weights of one checkpoint. Names are canonical release names
/// (`layers.3.attn.wq_a.weight`); a container maps its own names onto them. Nothing here
/// materialises a whole checkpoint: each call dequantises only what it is asked for.
pub trait Checkpoint: Send + Sync {
    fn layout(&self) -> Layout;
    fn config(&self) -> &Config;
    fn contains(&self, name: &str) -> bool;
    /// Logical shape of the dequantised tensor (e.g. FP4 `[out, in]`, not the packed bytes).
    fn shape(&self, name: &str) -> crate::Result<Vec<usize>>;
    fn storage(&self, name: &str) -> crate::Result<Storage>;
    /// Dequantise the whole tensor to f32, row-major.
    fn tensor_f32(&self, name: &str) -> crate::Result<Vec<f32>>;
    /// Dequantise rows `[first, first + out.len() / cols)` of a 2-D tensor into `out`.
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> crate::Result<()>;
}
