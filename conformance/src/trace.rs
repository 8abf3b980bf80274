//! Reading and writing trace files (the safetensors format of issue 4 item 4, documented in
//! docs/TRACE.md) as the harness sees them: named tensors widened to f64 or i64, plus the
//! string metadata. Goldens that predate the format (the WASTE oracle's raw f32 files) are
//! converted into the same shape here, so every comparison has one input type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    pub fn f(shape: Vec<usize>, v: Vec<f64>) -> Tensor {
        Tensor {
            shape,
            data: Data::F(v),
        }
    }
    pub fn i(shape: Vec<usize>, v: Vec<i64>) -> Tensor {
        Tensor {
            shape,
            data: Data::I(v),
        }
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values as f64 (integers converted).
    pub fn as_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F(v) => v.clone(),
            Data::I(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    /// Values as i64 (floats truncated; used for id tensors only).
    pub fn as_i64(&self) -> Vec<i64> {
        match &self.data {
            Data::I(v) => v.clone(),
            Data::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }
    /// Size of one slice along axis 0.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
    /// Rows `idx` along axis 0, in that order.
    pub fn select_rows(&self, idx: &[usize]) -> Tensor {
        let n = self.row_len();
        let mut shape = self.shape.clone();
        if shape.is_empty() {
            return self.clone();
        }
        shape[0] = idx.len();
        match &self.data {
            Data::F(v) => Tensor::f(
                shape,
                idx.iter()
                    .flat_map(|&r| v[r * n..(r + 1) * n].to_vec())
                    .collect(),
            ),
            Data::I(v) => Tensor::i(
                shape,
                idx.iter()
                    .flat_map(|&r| v[r * n..(r + 1) * n].to_vec())
                    .collect(),
            ),
        }
    }
}

/// A trace: tensors by name plus metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceFile {
    pub path: PathBuf,
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

impl TraceFile {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Read a safetensors trace. Any malformed byte is an error naming the file (an engine
    /// answering garbage must fail its case, never crash the harness).
    pub fn read(path: &Path) -> anyhow::Result<TraceFile> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read trace", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| anyhow!("{}: bad safetensors header: {e}", path.display()))?;
        let metadata: BTreeMap<String, String> = meta
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let t =
                decode(&view).map_err(|e| anyhow!("{}: tensor `{name}`: {e}", path.display()))?;
            tensors.insert(name, t);
        }
        Ok(TraceFile {
            path: path.to_path_buf(),
            tensors,
            metadata,
        })
    }

    /// Write as safetensors (F32 for floats, I64/I32 for ids as named by `int32`).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let mut header = serde_json::Map::new();
        if !self.metadata.is_empty() {
            header.insert("__metadata__".into(), serde_json::to_value(&self.metadata)?);
        }
        let mut payload = Vec::new();
        for (name, t) in &self.tensors {
            let start = payload.len();
            let dtype = match &t.data {
                Data::F(v) => {
                    for x in v {
                        payload.extend_from_slice(&(*x as f32).to_le_bytes());
                    }
                    "F32"
                }
                Data::I(v) => {
                    for x in v {
                        payload.extend_from_slice(&x.to_le_bytes());
                    }
                    "I64"
                }
            };
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [start, payload.len()]}),
            );
        }
        let mut h = serde_json::to_vec(&serde_json::Value::Object(header))?;
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = Vec::with_capacity(8 + h.len() + payload.len());
        out.extend_from_slice(&(h.len() as u64).to_le_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(&payload);
        std::fs::write(path, out).with_context(|| format!("{}: cannot write trace", path.display()))
    }

    /// The same trace restricted to the given token rows (tensors whose axis 0 is the token
    /// axis) and to the logits rows at those positions.
    pub fn select_tokens(&self, tokens: &[usize]) -> TraceFile {
        let t_all = self
            .get("residual")
            .map(|r| r.shape[0])
            .or_else(|| self.get("input_ids").map(|r| r.shape[0]));
        let mut out = TraceFile {
            path: self.path.clone(),
            metadata: self.metadata.clone(),
            ..Default::default()
        };
        for (name, t) in &self.tensors {
            let token_axis = Some(t.shape.first().copied().unwrap_or(0)) == t_all
                && !matches!(
                    name.as_str(),
                    "logits" | "logits_positions" | "engram_token_map"
                );
            if token_axis {
                out.tensors.insert(name.clone(), t.select_rows(tokens));
            } else if name != "logits" && name != "logits_positions" {
                out.tensors.insert(name.clone(), t.clone());
            }
        }
        if let Some(logits) = self.get("logits") {
            let pos: Vec<usize> = match self.get("logits_positions") {
                Some(p) => p.as_i64().iter().map(|&x| x as usize).collect(),
                None => (0..logits.shape[0]).collect(),
            };
            let rows: Vec<usize> = tokens
                .iter()
                .filter_map(|t| pos.iter().position(|p| p == t))
                .collect();
            let kept: Vec<i64> = rows.iter().map(|&r| pos[r] as i64).collect();
            out.tensors
                .insert("logits".into(), logits.select_rows(&rows));
            out.tensors
                .insert("logits_positions".into(), Tensor::i(vec![kept.len()], kept));
        }
        out
    }
}

fn decode(view: &safetensors::tensor::TensorView<'_>) -> anyhow::Result<Tensor> {
    use safetensors::Dtype;
    let shape = view.shape().to_vec();
    let b = view.data();
    let n: usize = shape.iter().product();
    let want = |w: usize| -> anyhow::Result<()> {
        if b.len() != n * w {
            bail!("{} bytes for shape {:?}", b.len(), shape);
        }
        Ok(())
    };
    Ok(match view.dtype() {
        Dtype::F64 => {
            want(8)?;
            Tensor::f(
                shape,
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        }
        Dtype::F32 => {
            want(4)?;
            Tensor::f(
                shape,
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
            )
        }
        Dtype::F16 => {
            want(2)?;
            Tensor::f(
                shape,
                b.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                    .collect(),
            )
        }
        Dtype::BF16 => {
            want(2)?;
            Tensor::f(
                shape,
                b.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                    .collect(),
            )
        }
        Dtype::I64 => {
            want(8)?;
            Tensor::i(
                shape,
                b.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        }
        Dtype::I32 => {
            want(4)?;
            Tensor::i(
                shape,
                b.chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            )
        }
        Dtype::I16 => {
            want(2)?;
            Tensor::i(
                shape,
                b.chunks_exact(2)
                    .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                    .collect(),
            )
        }
        Dtype::I8 => {
            want(1)?;
            Tensor::i(shape, b.iter().map(|&x| x as i8 as i64).collect())
        }
        Dtype::U8 => {
            want(1)?;
            Tensor::i(shape, b.iter().map(|&x| x as i64).collect())
        }
        other => bail!("unsupported dtype {other:?}"),
    })
}

/// Read a raw little-endian f32 file of exactly `n` values.
pub fn read_raw_f32(path: &Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let b = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if b.len() != n * 4 {
        bail!(
            "{}: {} bytes, expected {} ({} little-endian f32)",
            path.display(),
            b.len(),
            n * 4,
            n
        );
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect())
}

/// Read a raw little-endian f32 file whose length must be a multiple of `row`; returns rows.
pub fn read_raw_f32_rows(path: &Path, row: usize) -> anyhow::Result<(usize, Vec<f64>)> {
    let b = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if row == 0 || b.len() % (row * 4) != 0 || b.is_empty() {
        bail!(
            "{}: {} bytes is not a whole number of {}-float rows",
            path.display(),
            b.len(),
            row
        );
    }
    let v: Vec<f64> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect();
    Ok((v.len() / row, v))
}

/// The WASTE oracle outputs (CONTAINER.md §10.4) as a golden trace: `logits` [12, vocab] with
/// positions 0..12 (row t-1 = after t tokens), `residual` [12, layers, hc, dim].
pub fn waste_oracle_golden(
    oracle_dir: &Path,
    variant: &str,
    vocab: usize,
    layers: usize,
    hc: usize,
    dim: usize,
) -> anyhow::Result<TraceFile> {
    let lpath = oracle_dir.join(format!("logits_prefix_{variant}.f32"));
    let (steps, logits) = read_raw_f32_rows(&lpath, vocab)?;
    let hpath = oracle_dir.join(format!("hidden_{variant}.f32"));
    let hidden = read_raw_f32(&hpath, steps * layers * hc * dim)?;
    let mut t = TraceFile {
        path: oracle_dir.to_path_buf(),
        ..Default::default()
    };
    t.tensors
        .insert("logits".into(), Tensor::f(vec![steps, vocab], logits));
    t.tensors.insert(
        "logits_positions".into(),
        Tensor::i(vec![steps], (0..steps as i64).collect()),
    );
    t.tensors.insert(
        "residual".into(),
        Tensor::f(vec![steps, layers, hc, dim], hidden),
    );
    t.metadata
        .insert("set".into(), format!("waste_ds41_synth oracle ({variant})"));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_round_trip_and_token_selection() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TraceFile::default();
        t.tensors.insert(
            "residual".into(),
            Tensor::f(vec![3, 2, 1, 2], (0..12).map(|x| x as f64).collect()),
        );
        t.tensors.insert(
            "experts".into(),
            Tensor::i(vec![3, 2, 1], vec![1, 2, 3, 4, 5, 6]),
        );
        t.tensors.insert(
            "logits".into(),
            Tensor::f(vec![2, 2], vec![0.5, 1.5, 2.5, 3.5]),
        );
        t.tensors
            .insert("logits_positions".into(), Tensor::i(vec![2], vec![1, 2]));
        t.metadata.insert("engine".into(), "x".into());
        let p = dir.path().join("t.safetensors");
        t.write(&p).unwrap();
        let back = TraceFile::read(&p).unwrap();
        assert_eq!(back.tensors, t.tensors);
        assert_eq!(back.metadata["engine"], "x");
        let s = back.select_tokens(&[2]);
        assert_eq!(
            s.get("residual").unwrap().as_f64(),
            vec![8.0, 9.0, 10.0, 11.0]
        );
        assert_eq!(s.get("experts").unwrap().as_i64(), vec![5, 6]);
        assert_eq!(s.get("logits").unwrap().as_f64(), vec![2.5, 3.5]);
        assert_eq!(s.get("logits_positions").unwrap().as_i64(), vec![2]);
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
