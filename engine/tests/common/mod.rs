//! Builders for small checkpoints written into a tempdir by the reader tests.
#![allow(dead_code)]

use ds41_engine::checkpoint::names::{expected_tensors, TensorClass};
use ds41_engine::config::Config;
use serde_json::{json, Value};
use std::path::Path;

pub mod container;

#[allow(unused_imports)] // not every test binary reads upstream data
pub use ds41_engine::testing::upstream;

/// A deterministic byte stream (64-bit LCG, top byte).
pub struct Bytes(u64);
impl Bytes {
    pub fn new(seed: u64) -> Self {
        Bytes(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u8 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 56) as u8
    }
    pub fn fill(&mut self, n: usize, f: impl Fn(u8) -> u8) -> Vec<u8> {
        (0..n).map(|_| f(self.next())).collect()
    }
}

/// One tensor to write: name, safetensors dtype, shape, raw bytes.
#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Serialise tensors in order with contiguous offsets.
pub fn safetensors_bytes(ts: &[T]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for t in ts {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let h = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for t in ts {
        out.extend_from_slice(&t.data);
    }
    out
}

/// A tiny HF config.json (4 layers: window-only, ratio-2 source, ratio-2 consumer, ratio-1
/// source + candidate writer; Engram before layers 0 and 1) that meets the kernel rules.
pub fn tiny_release_config() -> Value {
    json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "text_config": {
            "vocab_size": 64, "hidden_size": 64, "moe_intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_lora_rank": 16, "o_groups": 2,
            "swiglu_limit": 1.0, "rms_norm_eps": 1e-20,
            "rope_theta": 10000, "rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 32},
            "n_routed_experts": 2, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
            "sliding_window": 8, "compress_ratios": [0, 2, 2, 1],
            "compress_rope_theta": 160000,
            "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3],
            "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
            "candidate_source_layer_id": 3, "candidate_topk_blocks": 2, "candidate_block_size": 4,
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "engram_layer_ids": [0, 1], "engram_num_embeddings": [240, 306],
            "engram_max_ngram_size": 3, "engram_vocab_size": 50, "engram_n_heads": 2, "engram_head_dim": 32,
            "engram_pad_token_id": 2, "engram_compressed_vocab_size": 32,
            "num_nextn_predict_layers": 0
        }
    })
}

/// Every expected tensor of `cfg` in release storage (FP8 32x32 linears, FP4 experts, FP8-row
/// Engram tables, F32 hc/sink/bias, BF16 rest), with deterministic contents.
pub fn release_tensors(cfg: &Config) -> Vec<T> {
    let mut out = Vec::new();
    for (i, t) in expected_tensors(cfg).into_iter().enumerate() {
        let mut g = Bytes::new(i as u64 + 1);
        let n: usize = t.shape.iter().product();
        let (r, c) = (t.shape[0], *t.shape.last().unwrap());
        // e4m3 codes without the NaN pair; scales near 2^0.
        let code = |b: u8| if b & 0x7F == 0x7F { 0x3F } else { b };
        let scale = |b: u8| 120 + (b % 10);
        let stem = t.name.strip_suffix(".weight").map(str::to_string);
        match t.class {
            TensorClass::Linear => {
                out.push(T {
                    name: t.name.clone(),
                    dtype: "F8_E4M3",
                    shape: t.shape.clone(),
                    data: g.fill(n, code),
                });
                let ss = vec![r.div_ceil(32), c.div_ceil(32)];
                let sn = ss.iter().product();
                out.push(T {
                    name: format!("{}.scale", stem.unwrap()),
                    dtype: "F8_E8M0",
                    shape: ss,
                    data: g.fill(sn, scale),
                });
            }
            TensorClass::Expert => {
                out.push(T {
                    name: t.name.clone(),
                    dtype: "I8",
                    shape: vec![r, c / 2],
                    data: g.fill(n / 2, |b| b),
                });
                out.push(T {
                    name: format!("{}.scale", stem.unwrap()),
                    dtype: "F8_E8M0",
                    shape: vec![r, c / 32],
                    data: g.fill(r * c / 32, scale),
                });
            }
            TensorClass::EngramTable => {
                out.push(T {
                    name: t.name.clone(),
                    dtype: "F8_E4M3",
                    shape: t.shape.clone(),
                    data: g.fill(n, code),
                });
                out.push(T {
                    name: format!("{}.scale", stem.unwrap()),
                    dtype: "F8_E8M0",
                    shape: vec![r, c.div_ceil(32)],
                    data: g.fill(r * c.div_ceil(32), scale),
                });
            }
            TensorClass::Dense => {
                let f32_kind = t.name.contains(".hc_")
                    || t.name.ends_with("attn_sink")
                    || t.name.contains("gate.bias");
                if f32_kind {
                    let data = (0..n)
                        .flat_map(|k| ((k as f32 * 0.25) - 1.0).to_le_bytes())
                        .collect();
                    out.push(T {
                        name: t.name.clone(),
                        dtype: "F32",
                        shape: t.shape.clone(),
                        data,
                    });
                } else {
                    // bf16 of small finite values
                    let data = (0..n)
                        .flat_map(|_| {
                            half::bf16::from_f32((g.next() as f32 - 128.0) / 64.0)
                                .to_bits()
                                .to_le_bytes()
                        })
                        .collect();
                    out.push(T {
                        name: t.name.clone(),
                        dtype: "BF16",
                        shape: t.shape.clone(),
                        data,
                    });
                }
            }
        }
    }
    out
}

/// Write config.json + model.safetensors into `dir`.
pub fn write_release(dir: &Path, config: &Value, tensors: &[T]) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(config).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("model.safetensors"), safetensors_bytes(tensors)).unwrap();
}

pub fn tiny_config() -> Config {
    Config::from_release_value(&tiny_release_config()).unwrap()
}
