//! Raw dumps that are not trace files — the WASTE oracle's f32 outputs (CONTAINER.md §10.4)
//! and command-profile engines' raw layouts — converted into the trace type of the engine
//! (`ds41_engine::trace`, the one reader and writer of the safetensors trace format), so every
//! comparison has one input type.

use std::path::Path;

use anyhow::{bail, Context};

pub use ds41_engine::trace::{TraceData, TraceFile, TraceTensor};

/// The length of a file an engine wrote (or a dump it was given), which must be a regular
/// file: a FIFO would block the harness, a device such as `/dev/zero` never end.
pub fn regular_file_len(path: &Path) -> anyhow::Result<u64> {
    let m = std::fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if !m.is_file() {
        bail!(
            "{}: not a regular file ({:?})",
            path.display(),
            m.file_type()
        );
    }
    Ok(m.len())
}

/// Read a raw little-endian f32 file of exactly `n` values (its size is checked first).
pub fn read_raw_f32(path: &Path, n: usize) -> anyhow::Result<Vec<f32>> {
    let len = regular_file_len(path)?;
    if len != n as u64 * 4 {
        bail!(
            "{}: {} bytes, expected {} ({} little-endian f32)",
            path.display(),
            len,
            n * 4,
            n
        );
    }
    let b = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if b.len() != n * 4 {
        bail!("{}: changed while it was read", path.display());
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Read a raw little-endian f32 file whose length must be a multiple of `row`; returns rows.
pub fn read_raw_f32_rows(path: &Path, row: usize) -> anyhow::Result<(usize, Vec<f32>)> {
    regular_file_len(path)?;
    let b = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if row == 0 || b.len() % (row * 4) != 0 || b.is_empty() {
        bail!(
            "{}: {} bytes is not a whole number of {}-float rows",
            path.display(),
            b.len(),
            row
        );
    }
    let v: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
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
    t.tensors.insert(
        "logits".into(),
        TraceTensor::f32(vec![steps, vocab], logits),
    );
    t.tensors.insert(
        "logits_positions".into(),
        TraceTensor::i64(vec![steps], (0..steps as i64).collect()),
    );
    t.tensors.insert(
        "residual".into(),
        TraceTensor::f32(vec![steps, layers, hc, dim], hidden),
    );
    t.metadata
        .insert("set".into(), format!("waste_ds41_synth oracle ({variant})"));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_rows_must_be_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l.f32");
        std::fs::write(&p, [0u8; 12]).unwrap();
        assert_eq!(read_raw_f32_rows(&p, 3).unwrap().0, 1);
        let e = read_raw_f32_rows(&p, 2).unwrap_err().to_string();
        assert!(e.contains("l.f32") && e.contains("2-float rows"), "{e}");
        let e = read_raw_f32(&p, 4).unwrap_err().to_string();
        assert!(e.contains("expected 16"), "{e}");
    }
}
