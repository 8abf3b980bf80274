//! Forward-pass traces: what the reference (or any engine) computed, per token and layer, in
//! the safetensors format documented in `docs/TRACE.md`.
//!
//! A [`Trace`] is filled by `model::Session` as tokens are processed (token-major rows in
//! processing order) and written with [`Trace::write`]; [`TraceFile::read`] reads any file
//! of the format back (including goldens with extra tensors).

use std::collections::BTreeMap;
use std::path::Path;

use std::borrow::Cow;
use std::path::PathBuf;

use safetensors::tensor::Dtype;

use crate::config::Config;
use crate::{Error, Result};

/// Which optional tensors a trace records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// Record per-token data at all (off: only the last logits are kept by the session).
    pub enabled: bool,
    /// Also record `attn_out`, `moe_out`, `mid`, `block_input`, `pre_mix`, `engram_gate`,
    /// `final_pre` and `candidates.L{c}`.
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
    pub candidate_block: usize,
    /// Tokens recorded so far.
    pub tokens: usize,
    /// The first row of the chunk being recorded.
    pub chunk_row: usize,
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
    /// Selection margins of every decision (`model::topk::Selection::margin`): the routing of
    /// each [token, layer], each index source's top-k per token (a candidate consumer's is
    /// the lower of its own and the candidate source's), the candidate blocks per token.
    /// ∞ where no decision was made.
    pub margin_experts: Vec<f32>,
    pub margin_topk: BTreeMap<usize, Vec<f32>>,
    pub margin_candidates: Vec<f32>,
    /// Sub-ops (only with `options.sub_ops`).
    pub attn_out: Vec<f32>,
    pub moe_out: Vec<f32>,
    pub mid: Vec<f32>,
    pub block_input: Vec<f32>,
    pub pre_mix: Vec<f32>,
    pub engram_gate: Vec<f32>,
    /// [tokens, hc]: the `pre` of the final collapse (the last block's FFN pre).
    pub final_pre: Vec<f32>,
    /// [tokens, candidate_keep]: kept candidate blocks, ascending, −1 padded.
    pub candidates: Vec<i32>,
    /// [tokens]: token types (TEXT −1, IMAGE_START 0, IMAGE 1, IMAGE_NEW_LINE 2, IMAGE_END 3);
    /// written only when a span was recorded.
    pub token_types: Vec<i64>,
    /// The vision stage of every image, in order (`vision.I{i}.*`).
    pub images: Vec<crate::model::image_span::EncodedImage>,
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
            candidate_block: cfg.candidate_block_size,
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
        self.token_types.resize(first + rows, -1);
        self.residual.resize((first + rows) * l * hc * d, 0.0);
        self.experts
            .resize((first + rows) * l * self.topk_experts, -1);
        self.expert_weights
            .resize((first + rows) * l * self.topk_experts, 0.0);
        self.margin_experts
            .resize((first + rows) * l, f32::INFINITY);
        for &li in &self.index_layers {
            self.topk
                .entry(li)
                .or_default()
                .resize((first + rows) * self.index_topk, -1);
            self.margin_topk
                .entry(li)
                .or_default()
                .resize(first + rows, f32::INFINITY);
        }
        if self.candidate_layer.is_some() {
            self.margin_candidates.resize(first + rows, f32::INFINITY);
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
            self.final_pre.resize((first + rows) * hc, 0.0);
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
        ];
        // A model without Engram layers has no hash to record; the official driver leaves the
        // tensor out then, and a comparer reading both must not meet an empty one on one side.
        if self.engram_layers > 0 {
            tensors.push((
                "engram_hash".into(),
                Dtype::I64,
                vec![t, self.engram_layers, self.engram_cols],
                le_bytes(&self.engram_hash),
            ));
        }
        for (li, v) in &self.topk {
            tensors.push((
                format!("topk.L{li}"),
                Dtype::I32,
                vec![t, self.index_topk],
                le_bytes(v),
            ));
        }
        tensors.push((
            "margin.experts".into(),
            Dtype::F32,
            vec![t, l],
            le_bytes(&self.margin_experts),
        ));
        for (li, v) in &self.margin_topk {
            tensors.push((
                format!("margin.topk.L{li}"),
                Dtype::F32,
                vec![t],
                le_bytes(v),
            ));
        }
        if let Some(c) = self.candidate_layer {
            tensors.push((
                format!("margin.candidates.L{c}"),
                Dtype::F32,
                vec![t],
                le_bytes(&self.margin_candidates),
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
            if self.engram_layers > 0 {
                tensors.push((
                    "engram_gate".into(),
                    Dtype::F32,
                    vec![t, self.engram_layers, hc],
                    le_bytes(&self.engram_gate),
                ));
            }
            tensors.push((
                "final_pre".into(),
                Dtype::F32,
                vec![t, hc],
                le_bytes(&self.final_pre),
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
        self.push_vision(&mut tensors);
        let raw: Vec<RawTensor> = tensors
            .into_iter()
            .map(|(name, dtype, shape, data)| RawTensor {
                name,
                dtype,
                shape,
                data,
            })
            .collect();
        safetensors_bytes(raw, &self.metadata)
    }

    /// Write atomically (temp file + rename) to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.to_bytes()?)
    }

    /// `token_types` and the vision stage of every image (docs/TRACE.md "Vision"), when the
    /// run had images.
    fn push_vision(&self, tensors: &mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) {
        if self.token_types.iter().all(|&t| t < 0) {
            return;
        }
        tensors.push((
            "token_types".into(),
            Dtype::I64,
            vec![self.tokens],
            le_bytes(&self.token_types),
        ));
        for (i, image) in self.images.iter().enumerate() {
            let (vh, vw) = image.vit_grid;
            let (lh, lw) = image.llm_grid;
            let n = vh * vw;
            let width = image.tower.vit.len() / n.max(1);
            let grid = [image.start, vh, vw, lh, lw].map(|v| v as i64);
            let t = &image.tower;
            let mut blocks = Vec::with_capacity(t.blocks.len() * n * width);
            for b in &t.blocks {
                blocks.extend_from_slice(b);
            }
            let p = format!("vision.I{i}");
            tensors.push((format!("{p}.grid"), Dtype::I64, vec![5], le_bytes(&grid)));
            let f32s = [
                ("embed", vec![n, width], &t.embed),
                ("blocks", vec![t.blocks.len(), n, width], &blocks),
                ("vit", vec![n, width], &t.vit),
                (
                    "aligner",
                    vec![lh * lw, t.aligner.len() / (lh * lw).max(1)],
                    &t.aligner,
                ),
            ];
            for (name, shape, v) in f32s {
                tensors.push((format!("{p}.{name}"), Dtype::F32, shape, le_bytes(v)));
            }
        }
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

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|source| Error::Io {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// One tensor to serialise: little-endian bytes of `dtype` in row-major order.
pub struct RawTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// The one safetensors writer of the trace format. Byte-deterministic: the header lists
/// `__metadata__` first (keys sorted), then the tensors sorted by name, whose data follow in
/// that order; the header is padded with spaces to 8 bytes. (The `safetensors` crate's own
/// serialiser takes the metadata as a `HashMap`, so its key order changes run to run.)
pub fn safetensors_bytes(
    mut tensors: Vec<RawTensor>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::Model(format!("trace tensor `{}` twice", w[0].name)));
    }
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(m));
    }
    let mut offset = 0usize;
    for t in &tensors {
        let want = t.shape.iter().product::<usize>() * t.dtype.bitsize() / 8;
        if t.data.len() != want {
            return Err(Error::Model(format!(
                "trace tensor `{}`: {} bytes for shape {:?} of {:?} ({want} expected)",
                t.name,
                t.data.len(),
                t.shape,
                t.dtype
            )));
        }
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": t.dtype.to_string(),
                "shape": t.shape,
                "data_offsets": [offset, offset + t.data.len()],
            }),
        );
        offset += t.data.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header))
        .map_err(|e| Error::Model(format!("trace header: {e}")))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in &tensors {
        out.extend_from_slice(&t.data);
    }
    Ok(out)
}

/// The values of a trace tensor, widened: floats to f32 (F64 narrowed: no trace or golden
/// carries more than f32 precision), integers to i64.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceData {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// One tensor of a trace file.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceTensor {
    pub shape: Vec<usize>,
    pub data: TraceData,
}

impl TraceTensor {
    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> TraceTensor {
        TraceTensor {
            shape,
            data: TraceData::F32(v),
        }
    }

    pub fn i64(shape: Vec<usize>, v: Vec<i64>) -> TraceTensor {
        TraceTensor {
            shape,
            data: TraceData::I64(v),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size of one slice along axis 0.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Values as f64 (integers converted).
    pub fn as_f64(&self) -> Vec<f64> {
        match &self.data {
            TraceData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TraceData::I64(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// Values as i64 (floats truncated; meant for id tensors).
    pub fn as_i64(&self) -> Cow<'_, [i64]> {
        match &self.data {
            TraceData::I64(v) => Cow::Borrowed(v),
            TraceData::F32(v) => Cow::Owned(v.iter().map(|&x| x as i64).collect()),
        }
    }

    /// Rows `idx` along axis 0, in that order.
    pub fn select_rows(&self, idx: &[usize]) -> TraceTensor {
        if self.shape.is_empty() {
            return self.clone();
        }
        let n = self.row_len();
        let mut shape = self.shape.clone();
        shape[0] = idx.len();
        fn pick<T: Copy>(v: &[T], idx: &[usize], n: usize) -> Vec<T> {
            idx.iter()
                .flat_map(|&r| v[r * n..(r + 1) * n].iter().copied())
                .collect()
        }
        match &self.data {
            TraceData::F32(v) => TraceTensor::f32(shape, pick(v, idx, n)),
            TraceData::I64(v) => TraceTensor::i64(shape, pick(v, idx, n)),
        }
    }

    fn to_raw(&self, name: &str) -> RawTensor {
        let (dtype, data) = match &self.data {
            TraceData::F32(v) => (Dtype::F32, le_bytes(v)),
            TraceData::I64(v) => (Dtype::I64, le_bytes(v)),
        };
        RawTensor {
            name: name.into(),
            dtype,
            shape: self.shape.clone(),
            data,
        }
    }
}

/// A trace (or golden) file: every tensor plus the metadata. This is the one reader of the
/// format; the conformance harness compares these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceFile {
    /// Where it was read from (empty for traces built in memory).
    pub path: PathBuf,
    pub tensors: BTreeMap<String, TraceTensor>,
    pub metadata: BTreeMap<String, String>,
}

impl TraceFile {
    /// Read a safetensors trace. Any malformed byte is a Format error naming the file (an
    /// engine answering garbage must fail its case, never crash the reader).
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
            path: path.to_path_buf(),
            metadata: meta
                .metadata()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            ..Default::default()
        };
        for (name, view) in st.tensors() {
            match decode(view.dtype(), view.shape().to_vec(), view.data()) {
                Ok(t) => {
                    out.tensors.insert(name, t);
                }
                // Readers ignore tensors they do not know (docs/TRACE.md), whatever their
                // dtype: an engine's own debug tensor must not sink its trace.
                Err(_) if !is_defined_tensor(&name) => {}
                Err(reason) => return Err(bad(format!("tensor `{name}`: {reason}"))),
            }
        }
        Ok(out)
    }

    /// Serialise: floats as F32, integers as I64 (byte-deterministic, see [`safetensors_bytes`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let raw = self.tensors.iter().map(|(n, t)| t.to_raw(n)).collect();
        safetensors_bytes(raw, &self.metadata)
    }

    /// Write atomically (temp file + rename) to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.to_bytes()?)
    }

    /// The run's token ids (`input_ids`), refusing a missing tensor or a negative id with
    /// the file named.
    pub fn input_ids(&self) -> Result<Vec<u32>> {
        let (_, ids) = self
            .i64("input_ids")
            .ok_or_else(|| Error::Model(format!("{} has no input_ids", self.path.display())))?;
        ids.iter()
            .map(|&t| u32::try_from(t))
            .collect::<std::result::Result<Vec<u32>, _>>()
            .map_err(|_| {
                Error::Model(format!(
                    "{}: input_ids holds a negative id",
                    self.path.display()
                ))
            })
    }

    /// Checks that every per-position tensor the format defines has one row per position of
    /// the trace (the rows of `input_ids`, else of `residual`), and the logits one row per
    /// position they name, and returns the count: rows of another count would be compared
    /// against the wrong positions.
    pub fn check_position_rows(&self) -> Result<Option<usize>> {
        let Some((counted_by, positions)) = ["input_ids", "residual"]
            .into_iter()
            .find_map(|n| Some((n, *self.get(n)?.shape.first()?)))
        else {
            return Ok(None);
        };
        let bad = |what: String| Error::Model(format!("{}: {what}", self.path.display()));
        for (name, t) in &self.tensors {
            if is_per_position(name) && t.shape.first() != Some(&positions) {
                return Err(bad(format!(
                    "`{name}` has shape {:?}, but the trace has {positions} positions (the rows \
                     of `{counted_by}`)",
                    t.shape
                )));
            }
        }
        // Logits rows are those of `logits_positions` (else positions 0, 1, ...), each a
        // position of the trace.
        if let Some(logits) = self.get("logits") {
            let rows = logits.shape.first().copied().unwrap_or(0);
            let at: Vec<i64> = match self.get("logits_positions") {
                Some(p) => p.as_i64().into_owned(),
                None => (0..rows as i64).collect(),
            };
            if at.len() != rows {
                return Err(bad(format!(
                    "`logits` has {rows} rows, `logits_positions` names {}",
                    at.len()
                )));
            }
            if let Some(p) = at
                .iter()
                .find(|&&p| usize::try_from(p).map_or(true, |p| p >= positions))
            {
                return Err(bad(format!(
                    "`logits` has a row for position {p}, outside the trace's {positions}"
                )));
            }
        }
        Ok(Some(positions))
    }

    /// The prefill length the run states in its metadata (`prefill`), if any; a value that is
    /// not a count is refused.
    pub fn prefill(&self) -> Result<Option<usize>> {
        self.metadata
            .get("prefill")
            .map(|s| {
                s.parse().map_err(|_| {
                    Error::Model(format!("{}: metadata prefill = {s:?}", self.path.display()))
                })
            })
            .transpose()
    }

    pub fn get(&self, name: &str) -> Option<&TraceTensor> {
        self.tensors.get(name)
    }

    /// An f32 tensor by name, with its shape.
    pub fn f32(&self, name: &str) -> Option<(&[usize], &[f32])> {
        let t = self.tensors.get(name)?;
        match &t.data {
            TraceData::F32(v) => Some((&t.shape, v)),
            _ => None,
        }
    }

    /// An integer tensor by name, with its shape.
    pub fn i64(&self, name: &str) -> Option<(&[usize], &[i64])> {
        let t = self.tensors.get(name)?;
        match &t.data {
            TraceData::I64(v) => Some((&t.shape, v)),
            _ => None,
        }
    }

    /// The same trace restricted to the given token rows (tensors whose axis 0 is the token
    /// axis, as `residual` or `input_ids` define it) and to the logits rows at those positions.
    pub fn select_tokens(&self, tokens: &[usize]) -> TraceFile {
        let t_all = self
            .get("residual")
            .map(|r| r.shape.first().copied().unwrap_or(0))
            .or_else(|| {
                self.get("input_ids")
                    .map(|r| r.shape.first().copied().unwrap_or(0))
            });
        let mut out = TraceFile {
            path: self.path.clone(),
            metadata: self.metadata.clone(),
            ..Default::default()
        };
        for (name, t) in &self.tensors {
            if matches!(name.as_str(), "logits" | "logits_positions") {
                continue;
            }
            // Per-image vision tensors have patch or cell rows, whatever their count.
            let token_axis = t.shape.first().copied() == t_all
                && name.as_str() != "engram_token_map"
                && !name.starts_with("vision.");
            let kept = if token_axis {
                t.select_rows(tokens)
            } else {
                t.clone()
            };
            out.tensors.insert(name.clone(), kept);
        }
        if let Some(logits) = self.get("logits") {
            let pos: Vec<usize> = match self.get("logits_positions") {
                Some(p) => p.as_i64().iter().map(|&x| x as usize).collect(),
                None => (0..logits.shape.first().copied().unwrap_or(0)).collect(),
            };
            let rows: Vec<usize> = tokens
                .iter()
                .filter_map(|t| pos.iter().position(|p| p == t))
                .collect();
            let kept: Vec<i64> = rows.iter().map(|&r| pos[r] as i64).collect();
            out.tensors
                .insert("logits".into(), logits.select_rows(&rows));
            out.tensors.insert(
                "logits_positions".into(),
                TraceTensor::i64(vec![kept.len()], kept),
            );
        }
        out
    }
}

/// Whether `name` is a tensor the trace format defines (docs/TRACE.md: run, decision, sub-op,
/// DSpark and vision tensors, and the goldens' Engram token map).
fn is_defined_tensor(name: &str) -> bool {
    const NAMES: [&str; 17] = [
        "input_ids",
        "token_types",
        "logits",
        "logits_positions",
        "residual",
        "experts",
        "expert_weights",
        "engram_hash",
        "engram_gate",
        "engram_token_map",
        "margin.experts",
        "attn_out",
        "moe_out",
        "mid",
        "block_input",
        "pre_mix",
        "final_pre",
    ];
    const FAMILIES: [&str; 6] = [
        "topk.L",
        "candidates.L",
        "margin.topk.L",
        "margin.candidates.L",
        "dspark.",
        "vision.I",
    ];
    NAMES.contains(&name) || FAMILIES.iter().any(|f| name.starts_with(f))
}

/// Whether `name` is a tensor the format defines with one row per position (docs/TRACE.md):
/// the run's ids, streams, sub-ops and decisions; not the logits (rows per `logits_positions`),
/// the Engram token map, DSpark's or the vision tower's tensors.
fn is_per_position(name: &str) -> bool {
    is_defined_tensor(name)
        && !matches!(name, "logits" | "logits_positions" | "engram_token_map")
        && !name.starts_with("dspark.")
        && !name.starts_with("vision.")
}

/// Widen one stored tensor (its byte length was checked against the shape by the safetensors
/// parser).
fn decode(dtype: Dtype, shape: Vec<usize>, b: &[u8]) -> std::result::Result<TraceTensor, String> {
    fn le<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect()
    }
    let n: usize = shape.iter().product();
    if b.len() * 8 != n * dtype.bitsize() {
        return Err(format!(
            "{} bytes for shape {shape:?} of {dtype:?}",
            b.len()
        ));
    }
    Ok(match dtype {
        Dtype::F32 => TraceTensor::f32(shape, le(b, f32::from_le_bytes)),
        Dtype::F64 => TraceTensor::f32(shape, le(b, |a| f64::from_le_bytes(a) as f32)),
        Dtype::F16 => TraceTensor::f32(shape, le(b, |a| half::f16::from_le_bytes(a).to_f32())),
        Dtype::BF16 => TraceTensor::f32(shape, le(b, |a| half::bf16::from_le_bytes(a).to_f32())),
        Dtype::I64 => TraceTensor::i64(shape, le(b, i64::from_le_bytes)),
        Dtype::I32 => TraceTensor::i64(shape, le(b, |a| i32::from_le_bytes(a) as i64)),
        Dtype::I16 => TraceTensor::i64(shape, le(b, |a| i16::from_le_bytes(a) as i64)),
        Dtype::I8 => TraceTensor::i64(shape, b.iter().map(|&x| x as i8 as i64).collect()),
        Dtype::U8 => TraceTensor::i64(shape, b.iter().map(|&x| x as i64).collect()),
        Dtype::U16 => TraceTensor::i64(shape, le(b, |a| i64::from(u16::from_le_bytes(a)))),
        Dtype::U32 => TraceTensor::i64(shape, le(b, |a| i64::from(u32::from_le_bytes(a)))),
        Dtype::U64 => {
            let values = le(b, u64::from_le_bytes)
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    i64::try_from(v)
                        .map_err(|_| format!("U64 element {i} = {v} does not fit in i64"))
                })
                .collect::<std::result::Result<_, String>>()?;
            TraceTensor::i64(shape, values)
        }
        Dtype::BOOL => TraceTensor::i64(shape, b.iter().map(|&x| i64::from(x != 0)).collect()),
        other => return Err(format!("unsupported dtype {other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selecting_tokens_leaves_per_image_tensors_whole() {
        let mut t = TraceFile::default();
        t.tensors
            .insert("input_ids".into(), TraceTensor::i64(vec![3], vec![5, 6, 7]));
        // Three patches in a three-token trace: not a token axis.
        let vit = TraceTensor::f32(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        t.tensors.insert("vision.I0.vit".into(), vit.clone());
        let s = t.select_tokens(&[2]);
        assert_eq!(s.get("input_ids").unwrap().as_i64().to_vec(), vec![7]);
        assert_eq!(s.get("vision.I0.vit"), Some(&vit));
    }

    #[test]
    fn a_runs_ids_and_prefill_are_read_or_refused_with_the_file_named() {
        let mut t = TraceFile {
            path: PathBuf::from("g.safetensors"),
            tensors: BTreeMap::new(),
            metadata: BTreeMap::new(),
        };
        assert!(t
            .input_ids()
            .unwrap_err()
            .to_string()
            .contains("g.safetensors has no input_ids"));
        assert_eq!(t.prefill().unwrap(), None);
        t.tensors
            .insert("input_ids".into(), TraceTensor::i64(vec![3], vec![5, 0, 7]));
        t.metadata.insert("prefill".into(), "2".into());
        assert_eq!(t.input_ids().unwrap(), vec![5, 0, 7]);
        assert_eq!(t.prefill().unwrap(), Some(2));
        t.tensors
            .insert("input_ids".into(), TraceTensor::i64(vec![2], vec![5, -1]));
        t.metadata.insert("prefill".into(), "two".into());
        assert!(t
            .input_ids()
            .unwrap_err()
            .to_string()
            .contains("negative id"));
        assert!(t.prefill().unwrap_err().to_string().contains("\"two\""));
    }

    fn sample() -> TraceFile {
        let mut t = TraceFile::default();
        t.tensors.insert(
            "residual".into(),
            TraceTensor::f32(vec![3, 2, 1, 2], (0..12).map(|x| x as f32).collect()),
        );
        t.tensors.insert(
            "experts".into(),
            TraceTensor::i64(vec![3, 2, 1], vec![1, 2, 3, 4, 5, 6]),
        );
        t.tensors.insert(
            "logits".into(),
            TraceTensor::f32(vec![2, 2], vec![0.5, 1.5, 2.5, 3.5]),
        );
        t.tensors.insert(
            "logits_positions".into(),
            TraceTensor::i64(vec![2], vec![1, 2]),
        );
        for (k, v) in [("engine", "x"), ("numerics", "exact"), ("index-k", "owner")] {
            t.metadata.insert(k.into(), v.into());
        }
        t
    }

    #[test]
    fn write_read_round_trip_and_token_selection() {
        let dir = tempfile::tempdir().unwrap();
        let t = sample();
        let p = dir.path().join("t.safetensors");
        t.write(&p).unwrap();
        let back = TraceFile::read(&p).unwrap();
        assert_eq!(back.tensors, t.tensors);
        assert_eq!(back.metadata, t.metadata);
        let s = back.select_tokens(&[2]);
        assert_eq!(
            s.get("residual").unwrap().as_f64(),
            vec![8.0, 9.0, 10.0, 11.0]
        );
        assert_eq!(&*s.get("experts").unwrap().as_i64(), &[5, 6]);
        assert_eq!(s.get("logits").unwrap().as_f64(), vec![2.5, 3.5]);
        assert_eq!(&*s.get("logits_positions").unwrap().as_i64(), &[2]);
    }

    #[test]
    fn writing_the_same_trace_twice_gives_identical_bytes() {
        // Many metadata keys: a HashMap-ordered header would differ between two maps built
        // independently (each HashMap has its own random hasher seed).
        let build = || {
            let mut t = sample();
            for i in 0..32 {
                t.metadata.insert(format!("key-{i}"), format!("value {i}"));
            }
            t
        };
        let (a, b) = (build().to_bytes().unwrap(), build().to_bytes().unwrap());
        assert_eq!(a, b);
        let dir = tempfile::tempdir().unwrap();
        let (pa, pb) = (
            dir.path().join("a.safetensors"),
            dir.path().join("b.safetensors"),
        );
        build().write(&pa).unwrap();
        build().write(&pb).unwrap();
        assert_eq!(std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
        // The header lists the metadata first, keys sorted, then the tensors by name.
        let n = u64::from_le_bytes(a[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&a[8..8 + n]).unwrap();
        let pos = |k: &str| header.find(&format!("\"{k}\"")).unwrap();
        assert!(pos("__metadata__") < pos("engine"));
        assert!(pos("engine") < pos("index-k") && pos("index-k") < pos("key-0"));
        assert!(pos("experts") < pos("logits") && pos("logits") < pos("residual"));
        assert!(pos("key-31") < pos("experts"));
    }

    #[test]
    fn a_model_trace_serialises_deterministically() {
        let mut tr = Trace {
            options: TraceOptions {
                enabled: true,
                sub_ops: true,
            },
            vocab: 3,
            n_layers: 2,
            hc: 1,
            dim: 2,
            topk_experts: 1,
            index_topk: 2,
            index_layers: vec![1],
            engram_layers: 1,
            engram_cols: 2,
            candidate_layer: Some(1),
            candidate_keep: 2,
            ..Trace::default()
        };
        tr.begin_chunk(&[5, 6]);
        tr.push_logits(1, &[0.1, 0.2, 0.3]);
        for i in 0..16 {
            tr.metadata.insert(format!("m{i}"), i.to_string());
        }
        let a = tr.to_bytes().unwrap();
        let b = tr.clone().to_bytes().unwrap();
        assert_eq!(a, b);
        let back = TraceFile::from_bytes(&a, Path::new("mem")).unwrap();
        assert_eq!(back.i64("experts").unwrap().0, &[2, 2, 1]);
        assert_eq!(back.f32("logits").unwrap().1, &[0.1, 0.2, 0.3]);
        assert!(back.get("candidates.L1").is_some());
    }

    #[test]
    fn narrow_and_unsigned_dtypes_are_widened_and_an_oversized_u64_is_refused() {
        let raw = |name: &str, dtype: Dtype, data: Vec<u8>, n: usize| RawTensor {
            name: name.into(),
            dtype,
            shape: vec![n],
            data,
        };
        let u16s: Vec<u8> = [7u16, 65535].iter().flat_map(|v| v.to_le_bytes()).collect();
        let u32s: Vec<u8> = [3u32, u32::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let u64s: Vec<u8> = [5u64, i64::MAX as u64]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f16s: Vec<u8> = [half::f16::from_f32(0.5), half::f16::from_f32(-2.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = safetensors_bytes(
            vec![
                raw("experts", Dtype::U16, u16s, 2),
                raw("topk.L1", Dtype::U32, u32s, 2),
                raw("input_ids", Dtype::U64, u64s, 2),
                raw("logits", Dtype::F16, f16s, 2),
            ],
            &BTreeMap::new(),
        )
        .unwrap();
        let t = TraceFile::from_bytes(&bytes, Path::new("mem")).unwrap();
        assert_eq!(t.i64("experts").unwrap().1, &[7, 65535]);
        assert_eq!(t.i64("topk.L1").unwrap().1, &[3, i64::from(u32::MAX)]);
        assert_eq!(t.i64("input_ids").unwrap().1, &[5, i64::MAX]);
        assert_eq!(t.f32("logits").unwrap().1, &[0.5, -2.0]);

        let too_big: Vec<u8> = (1u64 << 63).to_le_bytes().to_vec();
        let bytes = safetensors_bytes(
            vec![raw("experts", Dtype::U64, too_big, 1)],
            &BTreeMap::new(),
        )
        .unwrap();
        let e = TraceFile::from_bytes(&bytes, Path::new("engine.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("engine.safetensors") && e.contains("`experts`") && e.contains("i64"),
            "{e}"
        );
    }

    #[test]
    fn an_unreadable_dtype_is_ignored_on_an_unknown_tensor_and_refused_on_a_defined_one() {
        let f8 = |name: &str| RawTensor {
            name: name.into(),
            dtype: Dtype::F8_E4M3,
            shape: vec![2],
            data: vec![0x38, 0xB8],
        };
        let logits = TraceTensor::f32(vec![1, 2], vec![0.25, -1.0]).to_raw("logits");
        let bytes = safetensors_bytes(vec![f8("debug.scores"), logits], &BTreeMap::new()).unwrap();
        let t = TraceFile::from_bytes(&bytes, Path::new("engine.safetensors")).unwrap();
        assert_eq!(t.f32("logits").unwrap().1, &[0.25, -1.0]);
        assert!(t.get("debug.scores").is_none());

        for defined in ["logits", "topk.L3", "vision.I0.aligner", "dspark.logits"] {
            assert!(is_defined_tensor(defined), "{defined}");
            let bytes = safetensors_bytes(vec![f8(defined)], &BTreeMap::new()).unwrap();
            let e = TraceFile::from_bytes(&bytes, Path::new("engine.safetensors"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`{defined}`")) && e.contains("F8_E4M3"),
                "{e}"
            );
        }
    }

    #[test]
    fn garbage_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.safetensors");
        std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
        let e = TraceFile::read(&p).unwrap_err().to_string();
        assert!(e.contains("bad.safetensors"), "{e}");
    }
}
