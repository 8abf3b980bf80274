//! Release-layout reader (MODEL.md §4): loading, exact dequantisation, refusals.
#![recursion_limit = "256"]
// Reference values are the exact f64 reprs of f32 results from an independent decode.
#![allow(clippy::excessive_precision, clippy::too_many_arguments)]
mod common;

use common::*;
use ds41_engine::checkpoint::{
    self, names::expected_tensors, Checkpoint, Layout, QuantKind, ReleaseCheckpoint, Storage,
};
use ds41_engine::config::Config;
use ds41_engine::dtype::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use ds41_engine::Error;
use serde_json::json;
use std::path::Path;

fn open_err(dir: &Path) -> Error {
    match checkpoint::open(dir) {
        Ok(_) => panic!("{} should have been refused", dir.display()),
        Err(e) => e,
    }
}

fn tiny_dir(tensors: &[T]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_release(d.path(), &tiny_release_config(), tensors);
    d
}

#[test]
fn tiny_release_loads_and_dequantises_exactly() {
    let cfg = tiny_config();
    let ts = release_tensors(&cfg);
    let d = tiny_dir(&ts);
    let ck = checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.layout(), Layout::Release);
    let find = |n: &str| ts.iter().find(|t| t.name == n).unwrap();

    // FP8 32x32 block weight: element by element from the raw bytes.
    let w = find("layers.1.attn.wq_b.weight");
    let s = find("layers.1.attn.wq_b.scale");
    let (rows, cols) = (w.shape[0], w.shape[1]);
    assert_eq!(ck.storage(&w.name).unwrap(), Storage::Fp8Block);
    let got = ck.tensor_f32(&w.name).unwrap();
    for r in 0..rows {
        for c in 0..cols {
            let want = e4m3_to_f32(w.data[r * cols + c])
                * e8m0_to_f32(s.data[(r / 32) * s.shape[1] + c / 32]);
            assert_eq!(got[r * cols + c].to_bits(), want.to_bits(), "({r},{c})");
        }
    }
    // rows_f32 equals the slice of the whole tensor, at any offset.
    let mut part = vec![0.0; 3 * cols];
    ck.rows_f32(&w.name, 33, &mut part).unwrap();
    assert_eq!(&part[..], &got[33 * cols..36 * cols]);
    let v = ck.quant_view(&w.name).unwrap().unwrap();
    assert_eq!(
        (v.kind, v.rows, v.cols, v.scale_cols),
        (QuantKind::Fp8Block, rows, cols, s.shape[1])
    );
    assert_eq!(v.codes, &w.data[..]);
    assert_eq!(v.scale_byte(40, 5), s.data[s.shape[1]]);

    // FP4 expert: logical [out, in], low nibble = even column, per-row-per-32 scales.
    let w = find("layers.2.ffn.experts.1.w2.weight");
    let s = find("layers.2.ffn.experts.1.w2.scale");
    let shape = ck.shape(&w.name).unwrap();
    assert_eq!(shape, vec![w.shape[0], w.shape[1] * 2]);
    assert_eq!(ck.storage(&w.name).unwrap(), Storage::Fp4);
    let got = ck.tensor_f32(&w.name).unwrap();
    let cols = shape[1];
    for r in 0..shape[0] {
        for c in 0..cols {
            let b = w.data[r * cols / 2 + c / 2];
            let nib = if c % 2 == 0 { b & 0xF } else { b >> 4 };
            let want = e2m1_to_f32(nib) * e8m0_to_f32(s.data[r * (cols / 32) + c / 32]);
            assert_eq!(got[r * cols + c].to_bits(), want.to_bits());
        }
    }
    let v = ck.quant_view(&w.name).unwrap().unwrap();
    assert_eq!(v.kind, QuantKind::Fp4);
    assert_eq!(v.code(3, 5), w.data[3 * cols / 2 + 2] >> 4);

    // FP8 Engram rows: one scale per row and 32 columns.
    let w = find("layers.1.engram.embed.weight");
    assert_eq!(ck.storage(&w.name).unwrap(), Storage::Fp8Rows);
    let mut row = vec![0.0; 32];
    ck.rows_f32(&w.name, 100, &mut row).unwrap();
    let s = find("layers.1.engram.embed.scale");
    for c in 0..32 {
        assert_eq!(
            row[c],
            e4m3_to_f32(w.data[100 * 32 + c]) * e8m0_to_f32(s.data[100])
        );
    }

    // BF16 and F32 pass through; scales decode as powers of two.
    let n = find("layers.0.attn_norm.weight");
    let got = ck.tensor_f32(&n.name).unwrap();
    assert_eq!(
        got[5],
        half::bf16::from_le_bytes([n.data[10], n.data[11]]).to_f32()
    );
    assert_eq!(ck.tensor_f32("layers.0.hc_attn_base").unwrap()[3], -0.25);
    assert_eq!(
        ck.storage("layers.1.attn.wq_b.scale").unwrap(),
        Storage::E8m0
    );
    assert!(ck
        .quant_view("layers.0.attn_norm.weight")
        .unwrap()
        .is_none());

    // Out-of-range rows and bad lengths are errors, not panics.
    assert!(ck
        .rows_f32("layers.1.attn.wq_b.weight", 63, &mut vec![0.0; 2 * 32])
        .is_err());
    assert!(ck
        .rows_f32("layers.1.attn.wq_b.weight", 0, &mut [0.0; 33])
        .is_err());
    assert!(ck
        .rows_f32("layers.1.attn.wq_b.weight", usize::MAX, &mut [0.0; 32])
        .is_err());
    assert!(matches!(
        ck.tensor_f32("no.such"),
        Err(Error::Tensor { .. })
    ));
}

#[test]
fn sharded_release_with_index_loads() {
    let cfg = tiny_config();
    let ts = release_tensors(&cfg);
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("config.json"),
        serde_json::to_vec(&tiny_release_config()).unwrap(),
    )
    .unwrap();
    let (a, b) = ts.split_at(ts.len() / 2);
    std::fs::write(
        d.path().join("model-00001-of-00002.safetensors"),
        safetensors_bytes(a),
    )
    .unwrap();
    std::fs::write(
        d.path().join("model-00002-of-00002.safetensors"),
        safetensors_bytes(b),
    )
    .unwrap();
    let mut map = serde_json::Map::new();
    for t in a {
        map.insert(t.name.clone(), json!("model-00001-of-00002.safetensors"));
    }
    for t in b {
        map.insert(t.name.clone(), json!("model-00002-of-00002.safetensors"));
    }
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    let ck = checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.names().len(), ts.len());
    let last = &b[b.len() - 1];
    assert_eq!(
        ck.tensor_f32(&last.name).unwrap().len(),
        last.shape.iter().product::<usize>()
    );

    // An index naming a missing shard.
    let mut bad = index.clone();
    bad["weight_map"]["embed.weight"] = json!("model-00003-of-00002.safetensors");
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::to_vec(&bad).unwrap(),
    )
    .unwrap();
    let e = open_err(d.path()).to_string();
    assert!(
        e.contains("model-00003-of-00002.safetensors") && e.contains("does not exist"),
        "{e}"
    );
    // An index naming the wrong shard for a tensor.
    let mut bad = index.clone();
    bad["weight_map"]["embed.weight"] = json!("model-00002-of-00002.safetensors");
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::to_vec(&bad).unwrap(),
    )
    .unwrap();
    let e = open_err(d.path()).to_string();
    assert!(e.contains("embed.weight"), "{e}");
    // Path escapes are refused.
    let mut bad = index.clone();
    bad["weight_map"]["embed.weight"] = json!("../model-00001-of-00002.safetensors");
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::to_vec(&bad).unwrap(),
    )
    .unwrap();
    assert!(open_err(d.path())
        .to_string()
        .contains("plain relative file name"));
}

#[test]
fn every_missing_required_tensor_is_refused_by_name() {
    let cfg = tiny_config();
    let all = release_tensors(&cfg);
    let expected = expected_tensors(&cfg);
    assert!(expected.len() > 100);
    for t in &expected {
        // drop the tensor and its scale companion
        let stem = t.name.strip_suffix(".weight").map(|s| format!("{s}.scale"));
        let kept: Vec<T> = all
            .iter()
            .filter(|x| x.name != t.name && Some(&x.name) != stem.as_ref())
            .cloned()
            .collect();
        let d = tiny_dir(&kept);
        match open_err(d.path()) {
            Error::Tensor { tensor, reason, .. } => {
                assert_eq!(tensor, t.name);
                assert!(reason.contains("missing"), "{reason}");
            }
            other => panic!("{}: {other}", t.name),
        }
    }
}

#[test]
fn wrong_shape_and_dtype_are_refused() {
    let cfg = tiny_config();
    let all = release_tensors(&cfg);
    let with = |f: &dyn Fn(&mut Vec<T>)| {
        let mut ts = all.clone();
        f(&mut ts);
        let d = tiny_dir(&ts);
        open_err(d.path()).to_string()
    };
    let idx = |ts: &Vec<T>, n: &str| ts.iter().position(|t| t.name == n).unwrap();
    // norm with the wrong length
    let e = with(&|ts| {
        let i = idx(ts, "layers.2.ffn_norm.weight");
        ts[i].shape = vec![32];
        ts[i].data.truncate(64);
    });
    assert!(
        e.contains("layers.2.ffn_norm.weight") && e.contains("shape [32]"),
        "{e}"
    );
    // norm stored as I64
    let e = with(&|ts| {
        let i = idx(ts, "layers.2.ffn_norm.weight");
        ts[i].dtype = "I64";
        ts[i].shape = vec![16];
    });
    assert!(
        e.contains("layers.2.ffn_norm.weight") && e.contains("unsupported dtype I64"),
        "{e}"
    );
    // an FP4 expert where a dense norm belongs: norm as F8 without scale
    let e = with(&|ts| {
        let i = idx(ts, "layers.2.ffn_norm.weight");
        ts[i].dtype = "F8_E4M3";
        ts[i].data.truncate(64);
    });
    assert!(e.contains("without a `.scale`"), "{e}");
    // I8 without scale companion
    let e = with(&|ts| {
        ts.retain(|t| t.name != "layers.0.ffn.experts.1.w3.scale");
    });
    assert!(
        e.contains("layers.0.ffn.experts.1.w3.weight")
            && e.contains("I8 tensor without a `.scale`"),
        "{e}"
    );
    // scale of the wrong shape
    let e = with(&|ts| {
        let i = idx(ts, "layers.0.attn.wq_a.scale");
        ts[i].shape = vec![ts[i].shape[1], ts[i].shape[0]];
    });
    assert!(
        e.contains("tensor `layers.0.attn.wq_a.weight`")
            && e.contains("layers.0.attn.wq_a.scale")
            && e.contains("does not fit"),
        "{e}"
    );
    // scale with the wrong dtype
    let e = with(&|ts| {
        let i = idx(ts, "layers.0.attn.wq_a.scale");
        ts[i].dtype = "U8";
    });
    assert!(e.contains("layers.0.attn.wq_a"), "{e}");
    // orphan scale
    let e = with(&|ts| {
        ts.push(T {
            name: "layers.0.attn_norm.scale".into(),
            dtype: "F8_E8M0",
            shape: vec![1],
            data: vec![127],
        });
    });
    assert!(
        e.contains("`layers.0.attn_norm.weight`") && e.contains("BF16 cannot carry"),
        "{e}"
    );
    // a quantised weight stored as F8_E5M2: named, not its scale
    let e = with(&|ts| {
        let i = idx(ts, "layers.0.attn.wq_a.weight");
        ts[i].dtype = "F8_E5M2";
    });
    assert!(
        e.contains("`layers.0.attn.wq_a.weight`") && e.contains("F8_E5M2"),
        "{e}"
    );
    // a dropped expert weight whose scale stayed behind
    let e = with(&|ts| ts.retain(|t| t.name != "layers.3.ffn.experts.1.w2.weight"));
    assert!(
        e.contains("`layers.3.ffn.experts.1.w2.weight`: is missing"),
        "{e}"
    );
    // a Dense tensor stored FP8 (router must be BF16/F32)
    let e = with(&|ts| {
        let i = idx(ts, "layers.1.ffn.gate.weight");
        ts[i].dtype = "F8_E4M3";
        let half_len = ts[i].data.len() / 2;
        ts[i].data.truncate(half_len);
        ts.push(T {
            name: "layers.1.ffn.gate.scale".into(),
            dtype: "F8_E8M0",
            shape: vec![1, 2],
            data: vec![127, 127],
        });
    });
    assert!(
        e.contains("layers.1.ffn.gate.weight") && e.contains("Fp8Block"),
        "{e}"
    );
}

#[test]
fn broken_safetensors_headers_are_refused() {
    let cfg = tiny_config();
    let all = release_tensors(&cfg);
    let good = safetensors_bytes(&all);
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("config.json"),
        serde_json::to_vec(&tiny_release_config()).unwrap(),
    )
    .unwrap();
    let try_bytes = |b: &[u8]| {
        std::fs::write(d.path().join("model.safetensors"), b).unwrap();
        open_err(d.path())
    };
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&good[8..8 + header_len]).unwrap();
    let rewrite = |h: &serde_json::Value| {
        let hb = serde_json::to_vec(h).unwrap();
        let mut out = (hb.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&hb);
        out.extend_from_slice(&good[8 + header_len..]);
        out
    };
    // truncated shard
    let e = try_bytes(&good[..good.len() - 1]);
    assert!(
        matches!(&e, Error::Format { reason, .. } if reason.contains("safetensors")),
        "{e}"
    );
    // overlapping offsets: two tensors sharing bytes
    let mut h = header.clone();
    let s = h["embed.weight"]["data_offsets"][0].clone();
    h["head.weight"]["data_offsets"][0] = s;
    let e = try_bytes(&rewrite(&h));
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    // out-of-range end
    let mut h = header.clone();
    h["norm.weight"]["data_offsets"][1] = json!(1u64 << 40);
    let e = try_bytes(&rewrite(&h));
    assert!(matches!(e, Error::Format { .. }), "{e}");
    // header length beyond the file
    let mut b = good.clone();
    b[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    assert!(matches!(try_bytes(&b), Error::Format { .. }));
    // empty file
    assert!(matches!(try_bytes(&[]), Error::Format { .. }));
}

#[test]
fn release_config_from_tempdir_must_validate() {
    let mut cfg = tiny_release_config();
    cfg["text_config"]["n_shared_experts"] = json!(2);
    let d = tempfile::tempdir().unwrap();
    write_release(d.path(), &cfg, &[]);
    match open_err(d.path()) {
        Error::Config { field, rule } => {
            assert_eq!(field, "n_shared_experts");
            assert!(
                rule.contains("must be 1") && rule.contains("config.json"),
                "{rule}"
            );
        }
        e => panic!("{e}"),
    }
}

/// Reference sums from an independent Python decode (tools in the report): f64 sum, f64 sum
/// of |x|, element [5, 7], last element.
fn check_sums(
    ck: &dyn Checkpoint,
    name: &str,
    rows: usize,
    cols: usize,
    sum: f64,
    abs: f64,
    e57: f32,
    last: f32,
) {
    assert_eq!(ck.shape(name).unwrap(), vec![rows, cols], "{name}");
    let v = ck.tensor_f32(name).unwrap();
    let s: f64 = v.iter().map(|&x| x as f64).sum();
    let a: f64 = v.iter().map(|&x| x.abs() as f64).sum();
    assert_eq!(
        (s, a, v[5 * cols + 7], v[v.len() - 1]),
        (sum, abs, e57, last),
        "{name}"
    );
}

fn load_everything(ck: &dyn Checkpoint) {
    for t in expected_tensors(ck.config()) {
        let v = ck.tensor_f32(&t.name).unwrap();
        assert_eq!(v.len(), t.shape.iter().product::<usize>(), "{}", t.name);
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{} has non-finite values",
            t.name
        );
    }
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_checkpoint_loads() {
    let up = upstream();
    let ck = checkpoint::open(&up.join("official_a/checkpoint")).unwrap();
    assert_eq!(ck.layout(), Layout::Release);
    let c = ck.config();
    assert_eq!(
        (c.n_layers, c.dim, c.compress_ratios.clone()),
        (7, 128, vec![0, 0, 2, 2, 1, 1, 1])
    );
    load_everything(ck.as_ref());
    check_sums(
        ck.as_ref(),
        "layers.2.attn.wq_a.weight",
        64,
        128,
        0.8164482116699219,
        927.9098091125488,
        0.03515625,
        0.0703125,
    );
    check_sums(
        ck.as_ref(),
        "layers.2.ffn.experts.1.w2.weight",
        128,
        64,
        -6.6953125,
        646.2890625,
        0.125,
        -0.1875,
    );
    check_sums(
        ck.as_ref(),
        "layers.2.engram.embed.weight",
        508,
        32,
        13.930389404296875,
        12834.719360351562,
        -0.6875,
        -0.125,
    );
    assert_eq!(
        ck.storage("layers.2.engram.embed.weight").unwrap(),
        Storage::Fp8Rows
    );
    // bias_vl is present although the config has no vision: served, not required.
    assert!(ck.contains("layers.0.ffn.gate.bias_vl"));
}

/// A release file opened with the `inference/config.json` form of the config (ModelArgs
/// names) reads the same tensors as the checkpoint directory opened with its HF config.
#[test]
fn synthetic_release_loads_with_inference_config() {
    let d = tempfile::tempdir().unwrap();
    ds41_synthetic::generate("tiny", Layout::Release, 1, d.path()).unwrap();
    let cfg = Config::from_inference_json(&d.path().join("inference/config.json")).unwrap();
    let by_dir = checkpoint::open(d.path()).unwrap();
    assert_eq!(cfg.kv_source_layers, by_dir.config().kv_source_layers);
    let ck = ReleaseCheckpoint::open_files(&[d.path().join("model.safetensors")], cfg).unwrap();
    assert_eq!(ck.names(), by_dir.names());
    load_everything(&ck);
}

fn npy_i32(values: &[i32]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<i4', 'fortran_order': False, 'shape': ({},), }}",
        values.len()
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    values
        .iter()
        .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
    b
}

#[test]
fn release_token_map_sidecars() {
    let cfg = tiny_config();
    let d = tiny_dir(&release_tensors(&cfg));
    assert_eq!(
        checkpoint::open(d.path())
            .unwrap()
            .engram_token_map()
            .unwrap(),
        None
    );
    let map: Vec<i32> = (0..64).map(|t| t / 2).collect();
    std::fs::write(d.path().join("engram_token_map_int32.npy"), npy_i32(&map)).unwrap();
    assert_eq!(
        checkpoint::open(d.path())
            .unwrap()
            .engram_token_map()
            .unwrap(),
        Some(map.clone())
    );
    // the raw form wins and is checked: 31 compressed ids instead of 32
    let short: Vec<u8> = (0..64)
        .flat_map(|t: i32| (t.min(61) / 2).to_le_bytes())
        .collect();
    std::fs::write(d.path().join("engram-tokmap.bin"), short).unwrap();
    let e = checkpoint::open(d.path())
        .unwrap()
        .engram_token_map()
        .unwrap_err()
        .to_string();
    assert!(e.contains("compressed id 31 never occurs"), "{e}");
    std::fs::remove_file(d.path().join("engram-tokmap.bin")).unwrap();
    std::fs::write(
        d.path().join("engram_token_map_int32.npy"),
        &npy_i32(&map)[..100],
    )
    .unwrap();
    assert!(checkpoint::open(d.path())
        .unwrap()
        .engram_token_map()
        .is_err());
}

/// The release map the official engram.py builds from the release tokenizer
/// (goldens/engram/): 129280 ids, 99092 compressed ids, token 2 → 2, and the sha256 of its raw
/// int32 payload as publicly reported (MODEL.md §6.6.1).
#[test]
fn release_token_map_reads() {
    use sha2::Digest;
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../goldens/engram/release_token_map_int32.npy");
    let map =
        ds41_engine::checkpoint::release::npy_i32_vector(&p, &std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(map.len(), 129280);
    assert_eq!(map[2], 2);
    assert_eq!(*map.iter().max().unwrap(), 99091);
    let raw: Vec<u8> = map.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&raw)),
        "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481"
    );
}
