//! Weight access by canonical (release) tensor name, for both checkpoint layouts
//! (MODEL.md §4, CONTAINER.md §1–§8).
//!
//! * [`open`] detects the layout of a directory and returns a `Box<dyn Checkpoint>`;
//! * [`release`]: `config.json` + `model.safetensors` (or an index + shards), memory-mapped;
//! * [`container`]: a WASTE v0 container directory;
//! * [`names`]: the tensors a config implies (names, logical shapes, allowed storage) and the
//!   container ↔ release name mapping.
//!
//! Opening checks everything that can be checked without reading weights: the config
//! (`cfg_sane`), the presence, shape and storage of every tensor the config implies, file
//! structure (safetensors headers, bank record headers, codebooks, Engram tables). Weights are
//! dequantised only when asked for, a tensor, a row range or one expert at a time.
//!
//! OWNER: readers helper (issue 2). The trait below is the shared interface the forward
//! pass codes against.

pub mod container;
pub mod names;
pub mod release;

use crate::config::{Config, EngramHashConstants};
use crate::{Error, Result};
use std::path::Path;

pub use container::ContainerCheckpoint;
pub use release::ReleaseCheckpoint;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Storage {
    F32,
    Bf16,
    F16,
    /// FP8 e4m3 with E8M0 32x32 block scales.
    Fp8Block,
    /// FP8 e4m3 rows with one E8M0 scale per row and 32 columns (release Engram tables).
    Fp8Rows,
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
    /// An E8M0 scale tensor (`<w>.scale` of the release), decoded to powers of two.
    E8m0,
}

/// Which quantised layout a [`QuantView`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum QuantKind {
    /// `codes`: e4m3 `[rows, cols]`; `scales`: E8M0 `[ceil(rows/32), ceil(cols/32)]`.
    Fp8Block,
    /// `codes`: e4m3 `[rows, cols]`; `scales`: E8M0 `[rows, ceil(cols/32)]`.
    Fp8Rows,
    /// `codes`: packed e2m1 `[rows, cols/2]` (low nibble = even column); `scales`: E8M0
    /// `[rows, ceil(cols/32)]`.
    Fp4,
}

/// The stored codes and scales of a quantised release weight, borrowed from the mapped file,
/// for block-exact GEMMs (MODEL.md §5.4 C1). `rows`/`cols` are the logical shape.
#[derive(Debug, Clone, Copy)]
pub struct QuantView<'a> {
    pub kind: QuantKind,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    /// Columns of the scale matrix, `ceil(cols / 32)`.
    pub scale_cols: usize,
}

impl QuantView<'_> {
    /// The E8M0 scale byte that applies to element `(r, c)`.
    #[inline]
    pub fn scale_byte(&self, r: usize, c: usize) -> u8 {
        let sr = match self.kind {
            QuantKind::Fp8Block => r / 32,
            QuantKind::Fp8Rows | QuantKind::Fp4 => r,
        };
        self.scales[sr * self.scale_cols + c / 32]
    }

    /// The stored code of element `(r, c)` (a whole e4m3 byte, or an e2m1 nibble).
    #[inline]
    pub fn code(&self, r: usize, c: usize) -> u8 {
        match self.kind {
            QuantKind::Fp4 => {
                let b = self.codes[r * (self.cols / 2) + c / 2];
                if c % 2 == 0 {
                    b & 0xF
                } else {
                    b >> 4
                }
            }
            _ => self.codes[r * self.cols + c],
        }
    }
}

/// Read access to the weights of one checkpoint. Names are canonical release names
/// (`layers.3.attn.wq_a.weight`); a container maps its own names onto them. Nothing here
/// materialises a whole checkpoint: each call dequantises only what it is asked for.
///
/// Every tensor [`names::expected_tensors`] lists for the config is guaranteed present with
/// its logical shape once [`open`] has returned.
pub trait Checkpoint: Send + Sync {
    fn layout(&self) -> Layout;
    fn config(&self) -> &Config;
    fn contains(&self, name: &str) -> bool;
    /// Every canonical tensor name this checkpoint serves (sorted). For a release this
    /// includes the `.scale` companions; for a container, one name per expert matrix.
    fn names(&self) -> Vec<String>;
    /// Logical shape of the dequantised tensor (e.g. FP4 `[out, in]`, not the packed bytes).
    fn shape(&self, name: &str) -> Result<Vec<usize>>;
    fn storage(&self, name: &str) -> Result<Storage>;
    /// Dequantise the whole tensor to f32, row-major.
    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>>;
    /// Dequantise rows `[first, first + out.len() / cols)` of a tensor into `out`. A tensor
    /// of rank r ≥ 2 is viewed as `[prod(shape[..r-1]), shape[r-1]]`; rank 1 as one row.
    /// `out.len()` must be a multiple of the row length.
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> Result<()>;
    /// The stored codes and scales of an FP8/FP4 release weight (`None` for any other
    /// storage, including every container tensor).
    fn quant_view(&self, name: &str) -> Result<Option<QuantView<'_>>>;
    /// Engram hashing constants (multipliers, primes, offsets, pad) for this checkpoint.
    fn engram_constants(&self) -> Result<EngramHashConstants>;
    /// Token id → Engram compressed id when the checkpoint ships the map (a container's
    /// `engram-tokmap.bin`); `None` for the release, whose map is built from the tokenizer
    /// (MODEL.md §6.6.1, `tokenizer` module).
    fn engram_token_map(&self) -> Result<Option<Vec<i32>>>;
}

/// Open a checkpoint directory, detecting its layout: `manifest.json` ⇒ WASTE container;
/// `config.json` with `model.safetensors` or `model.safetensors.index.json` ⇒ release.
pub fn open(dir: &Path) -> Result<Box<dyn Checkpoint>> {
    match detect_layout(dir)? {
        Layout::Container => Ok(Box::new(ContainerCheckpoint::open(dir)?)),
        Layout::Release => Ok(Box::new(ReleaseCheckpoint::open(dir)?)),
    }
}

/// Which layout `dir` holds, from its file names alone.
pub fn detect_layout(dir: &Path) -> Result<Layout> {
    if !dir.is_dir() {
        return Err(Error::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        });
    }
    if dir.join("manifest.json").is_file() {
        return Ok(Layout::Container);
    }
    if dir.join("config.json").is_file()
        && (dir.join("model.safetensors").is_file()
            || dir.join("model.safetensors.index.json").is_file())
    {
        return Ok(Layout::Release);
    }
    Err(Error::Format {
        file: dir.to_path_buf(),
        offset: 0,
        reason: "neither a WASTE container (manifest.json) nor a release checkpoint (config.json \
                 + model.safetensors or model.safetensors.index.json)"
            .into(),
    })
}

/// Helper for implementations: a tensor error.
pub(crate) fn tensor_err(file: &Path, tensor: &str, reason: impl Into<String>) -> Error {
    Error::Tensor {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        reason: reason.into(),
    }
}

/// Helper for implementations: rows × cols view of a shape (rank 0/1 = one row).
pub(crate) fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape.split_last() {
        None => (1, 1),
        Some((&c, rest)) => (rest.iter().product(), c),
    }
}

/// Helper for implementations: validate a `rows_f32` request, returning the row count.
pub(crate) fn check_rows_request(
    file: &Path,
    name: &str,
    shape: &[usize],
    first: usize,
    out_len: usize,
) -> Result<usize> {
    let (rows, cols) = rows_cols(shape);
    if cols == 0 || out_len % cols != 0 {
        return Err(tensor_err(
            file,
            name,
            format!("output length {out_len} is not a multiple of the row length {cols}"),
        ));
    }
    let n = out_len / cols;
    if first.checked_add(n).map_or(true, |end| end > rows) {
        return Err(tensor_err(
            file,
            name,
            format!(
                "rows {first}..{} requested, tensor has {rows}",
                first.saturating_add(n)
            ),
        ));
    }
    Ok(n)
}
