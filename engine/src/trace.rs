//! Forward-pass traces: what the reference (or any engine) computed, per token and layer, in
//! the safetensors format documented in `docs/TRACE.md` (issue 4 item 4).
//!
//! A [`Trace`] is filled by `model::Session` as tokens are processed (token-major rows in
//! processing order) and written with [`Trace::write`]; [`TraceFile::read`] reads any file
//! of the format back (including goldens with extra tensors).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::config::Config;
use crate::{Error, Result};

/// Which optional tensors a trace records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// Record per-token data at all (off: only the last logits are kept by the session).
    pub enabled: bool,
    /// Also record `attn_out`, `moe_out`, `mid`, `block_input`, `pre_mix`, `engram_gate` and
    /// `candidates.L{c}`.
    pub sub_ops: bool,
}

/// Per-token, per-layer record of a forward run.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub options: TraceOptions,
    pub vocab: usize,
    pub n_layers: usize,
    pub hc: usize,
    pub dim: usize,
    pub topk_experts: usize,
    pub index_topk: usize,
    pub index_layers: Vec<usize>,
    pub engram_layers: usize,
    pub engram_cols: usize,
    pub candidate_layer: Option<usize>,
    pub candidate_keep: usize,
    /// Tokens recorded so far.
    pub tokens: usize,
    pub input_ids: Vec<i64>,
    /// [steps, vocab]: one row per forward (its last position).
    pub logits: Vec<f32>,
    pub logits_positions: Vec<i64>,
    /// [tokens, layers, hc, dim]
    pub residual: Vec<f32>,
    /// [tokens, layers, topk]
    pub experts: Vec<i32>,
    pub expert_weights: Vec<f32>,
    /// index-source layer → [tokens, index_topk]
    pub topk: BTreeMap<usize, Vec<i32>>,
    /// [tokens, engram_layers, cols]
    pub engram_hash: Vec<i64>,
    /// Sub-ops (only with `options.sub_ops`).
    pub attn_out: Vec<f32>,
    pub moe_out: Vec<f32>,
    pub mid: Vec<f32>,
    pub block_input: Vec<f32>,
    pub pre_mix: Vec<f32>,
    pub engram_gate: Vec<f32>,
    /// [tokens, candidate_keep]: kept candidate blocks, ascending, −1 padded.
    pub candidates: Vec<i32>,
    /// Free-form metadata written into `__metadata__` (engine, numerics, index-k, ...).
    pub metadata: BTreeMap<String, String>,
}

impl Trace {
    /// A trace that records nothing per token.
    pub fn disabled() -> Trace {
        Trace::default()
    }

    /// An empty trace for a model with this config.
    pub fn new(cfg: &Config, options: TraceOptions) -> Trace {
        Trace {
            options,
            vocab: cfg.vocab_size,
            n_layers: cfg.n_layers,
            hc: cfg.hc_mult,
            dim: cfg.dim,
            topk_experts: cfg.n_activated_experts,
            index_topk: cfg.index_topk,
            index_layers: cfg.index_source_layers.clone(),
            engram_layers: cfg.engram_layer_ids.len(),
            engram_cols: cfg.engram_max_ngram_size.saturating_sub(1) * cfg.engram_n_heads,
            candidate_layer: cfg.candidate_source_layer,
            candidate_keep: cfg.candidate_topk_blocks,
            ..Trace::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.options.enabled
    }

    /// Make room for `rows` more tokens (zero / −1 filled); returns the first new token row.
    pub fn begin_chunk(&mut self, ids: &[u32]) -> usize {
        let first = self.tokens;
        if !self.enabled() {
            return first;
        }
        let rows = ids.len();
        let (l, hc, d) = (self.n_layers, self.hc, self.dim);
        self.input_ids.extend(ids.iter().map(|&t| t as i64));
        self.residual.resize((first + rows) * l * hc * d, 0.0);
        self.experts
            .resize((first + rows) * l * self.topk_experts, -1);
        self.expert_weights
            .resize((first + rows) * l * self.topk_experts, 0.0);
        for &li in &self.index_layers {
            self.topk
                .entry(li)
                .or_default()
                .resize((first + rows) * self.index_topk, -1);
        }
        self.engram_hash
            .resize((first + rows) * self.engram_layers * self.engram_cols, 0);
        if self.options.sub_ops {
            self.attn_out.resize((first + rows) * l * d, 0.0);
            self.moe_out.resize((first + rows) * l * d, 0.0);
            self.mid.resize((first + rows) * l * hc * d, 0.0);
            self.block_input.resize((first + rows) * l * hc * d, 0.0);
            self.pre_mix.resize((first + rows) * l * hc, 0.0);
            self.engram_gate
                .resize((first + rows) * self.engram_layers * hc, 0.0);
            if self.candidate_layer.is_some() {
                self.candidates
                    .resize((first + rows) * self.candidate_keep, -1);
            }
        }
        self.tokens += rows;
        first
    }

    /// Offset of (token, layer) in a [tokens, layers, width] tensor.
    pub fn cell(&self, token: usize, layer: usize, width: usize) -> std::ops::Range<usize> {
        let o = (token * self.n_layers + layer) * width;
        o..o + width
    }

    /// Append one logits row (the last position of a forward).
    pub fn push_logits(&mut self, position: usize, row: &[f32]) {
        if self.enabled() {
            self.logits.extend_from_slice(row);
            self.logits_positions.push(position as i64);
        }
    }

    /// Serialise to safetensors bytes (format: docs/TRACE.md).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let t = self.tokens;
        let (l, hc, d) = (self.n_layers, self.hc, self.dim);
        let steps = self.logits_positions.len();
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![
            (
                "input_ids".into(),
                Dtype::I64,
                vec![t],
                le_bytes(&self.input_ids),
            ),
            (
                "logits".into(),
                Dtype::F32,
                vec![steps, self.vocab],
                le_bytes(&self.logits),
            ),
            (
                "logits_positions".into(),
                Dtype::I64,
                vec![steps],
                le_bytes(&self.logits_positions),
            ),
            (
                "residual".into(),
                Dtype::F32,
                vec![t, l, hc, d],
                le_bytes(&self.residual),
            ),
            (
                "experts".into(),
                Dtype::I32,
                vec![t, l, self.topk_experts],
                le_bytes(&self.experts),
            ),
            (
                "expert_weights".into(),
                Dtype::F32,
                vec![t, l, self.topk_experts],
                le_bytes(&self.expert_weights),
            ),
            (
                "engram_hash".into(),
                Dtype::I64,
                vec![t, self.engram_layers, self.engram_cols],
                le_bytes(&self.engram_hash),
            ),
        ];
        for (li, v) in &self.topk {
            tensors.push((
                format!("topk.L{li}"),
                Dtype::I32,
                vec![t, self.index_topk],
                le_bytes(v),
            ));
        }
        if self.options.sub_ops {
            tensors.push((
                "attn_out".into(),
                Dtype::F32,
                vec![t, l, d],
                le_bytes(&self.attn_out),
            ));
            tensors.push((
                "moe_out".into(),
                Dtype::F32,
                vec![t, l, d],
                le_bytes(&self.moe_out),
            ));
            tensors.push((
                "mid".into(),
                Dtype::F32,
                vec![t, l, hc, d],
                le_bytes(&self.mid),
            ));
            tensors.push((
                "block_input".into(),
                Dtype::F32,
                vec![t, l, hc, d],
                le_bytes(&self.block_input),
            ));
            tensors.push((
                "pre_mix".into(),
                Dtype::F32,
                vec![t, l, hc],
                le_bytes(&self.pre_mix),
            ));
            tensors.push((
                "engram_gate".into(),
                Dtype::F32,
                vec![t, self.engram_layers, hc],
                le_bytes(&self.engram_gate),
            ));
            if let Some(c) = self.candidate_layer {
                tensors.push((
                    format!("candidates.L{c}"),
                    Dtype::I32,
                    vec![t, self.candidate_keep],
                    le_bytes(&self.candidates),
                ));
            }
        }
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, dt, shape, data)| {
                TensorView::new(*dt, shape.clone(), data)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| Error::Model(format!("trace tensor `{n}`: {e}")))
            })
            .collect::<Result<_>>()?;
        let meta: std::collections::HashMap<String, String> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        safetensors::serialize(views, Some(meta)).map_err(|e| Error::Model(format!("trace: {e}")))
    }

    /// Write atomically (temp file + rename) to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        let tmp = path.with_extension("safetensors.tmp");
        std::fs::write(&tmp, &bytes).map_err(|source| Error::Io {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn le_bytes<T: LeBytes>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(std::mem::size_of_val(v));
    for x in v {
        x.put(&mut out);
    }
    out
}

trait LeBytes {
    fn put(&self, out: &mut Vec<u8>);
}
impl LeBytes for f32 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl LeBytes for i32 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl LeBytes for i64 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// One tensor of a trace file, widened: floats to f32, integers to i64.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceTensor {
    F32 { shape: Vec<usize>, data: Vec<f32> },
    I64 { shape: Vec<usize>, data: Vec<i64> },
}

impl TraceTensor {
    pub fn shape(&self) -> &[usize] {
        match self {
            TraceTensor::F32 { shape, .. } | TraceTensor::I64 { shape, .. } => shape,
        }
    }
}

/// A trace (or golden) file read back: every tensor plus the metadata.
#[derive(Debug, Clone, Default)]
pub struct TraceFile {
    pub tensors: BTreeMap<String, TraceTensor>,
    pub metadata: BTreeMap<String, String>,
}

impl TraceFile {
    pub fn read(path: &Path) -> Result<TraceFile> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<TraceFile> {
        let bad = |reason: String| Error::Format {
            file: path.to_path_buf(),
            offset: 0,
            reason,
        };
        let (_, meta) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let mut out = TraceFile {
            metadata: meta
                .metadata()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            ..Default::default()
        };
        for (name, view) in st.tensors() {
            let shape = view.shape().to_vec();
            let d = view.data();
            let t = match view.dtype() {
                Dtype::F32 => TraceTensor::F32 {
                    shape,
                    data: d
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                },
                Dtype::F64 => TraceTensor::F32 {
                    shape,
                    data: d
                        .chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                        .collect(),
                },
                Dtype::BF16 => TraceTensor::F32 {
                    shape,
                    data: d
                        .chunks_exact(2)
                        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                        .collect(),
                },
                Dtype::I32 => TraceTensor::I64 {
                    shape,
                    data: d
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                        .collect(),
                },
                Dtype::I64 => TraceTensor::I64 {
                    shape,
                    data: d
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect(),
                },
                other => return Err(bad(format!("tensor `{name}`: unsupported dtype {other:?}"))),
            };
            out.tensors.insert(name, t);
        }
        Ok(out)
    }

    /// An f32 tensor by name, with its shape.
    pub fn f32(&self, name: &str) -> Option<(&[usize], &[f32])> {
        match self.tensors.get(name)? {
            TraceTensor::F32 { shape, data } => Some((shape, data)),
            _ => None,
        }
    }

    /// An integer tensor by name, with its shape.
    pub fn i64(&self, name: &str) -> Option<(&[usize], &[i64])> {
        match self.tensors.get(name)? {
            TraceTensor::I64 { shape, data } => Some((shape, data)),
            _ => None,
        }
    }
}
