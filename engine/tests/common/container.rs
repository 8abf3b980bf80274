//! A small WASTE v0 container written into a tempdir (CONTAINER.md §1–§7), independent of
//! the synthetic generator, so the reader tests can break any part of it.
#![allow(dead_code)]

use super::{tiny_release_config, Bytes};
use ds41_engine::checkpoint::names::{
    expected_tensors, release_to_container, ContainerName, TensorClass,
};
use ds41_engine::config::{release_primes, Config};
use serde_json::{json, Value};
use std::path::Path;

pub const STAGES: usize = 3;

/// The flat container config of the tiny model (release text keys + WASTE's normalised keys).
pub fn tiny_container_config() -> Value {
    let mut c = tiny_release_config()["text_config"].clone();
    let o = c.as_object_mut().unwrap();
    for k in [
        "n_routed_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "num_nextn_predict_layers",
        "norm_topk_prob",
    ] {
        o.remove(k);
    }
    o.insert("num_experts".into(), json!(2));
    o.insert("num_experts_per_token".into(), json!(2));
    o.insert("num_shared_experts".into(), json!(1));
    o.insert("moe_renormalize".into(), json!(true));
    o.insert("first_k_dense_replace".into(), json!(0));
    o.insert("routing_bias_vl".into(), json!(true));
    o.insert("rms_norm_eps".into(), json!(1e-5));
    o.insert("routed_scaling_factor".into(), json!(2.0));
    o.insert("bos_token_id".into(), json!(0));
    o.insert("eos_token_id".into(), json!(1));
    c
}

fn f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Write the container; returns the manifest (also written) for tests that rewrite it.
pub fn write_container(dir: &Path) -> Value {
    let config_v = tiny_container_config();
    let cfg = Config::from_container_config(&config_v).unwrap();
    let mut g = Bytes::new(7);
    // trunk
    let mut trunk: Vec<u8> = Vec::new();
    let mut entries = Vec::new();
    for t in expected_tensors(&cfg) {
        let ContainerName::Trunk(name) = release_to_container(&t.name) else {
            continue;
        };
        let (rows, cols) = (
            t.shape[..t.shape.len() - 1].iter().product::<usize>(),
            *t.shape.last().unwrap(),
        );
        let small = t.shape.iter().product::<usize>() < 256 || t.shape.len() == 1;
        let q8 = name.ends_with("embed_tokens.weight")
            || name.ends_with("lm_head.weight")
            || name.contains(".hc_") && name.ends_with("_fn");
        let off = trunk.len();
        if small && t.class == TensorClass::Dense && !q8 {
            for _ in 0..rows * cols {
                trunk.extend_from_slice(&((g.next() as f32 - 128.0) / 256.0).to_le_bytes());
            }
            entries.push(json!({"name": name, "fmt": 0, "off": off, "shape": t.shape, "bytes": rows * cols * 4}));
            continue;
        }
        let group = 128;
        let groups = cols.div_ceil(group);
        let n = groups * group;
        if q8 {
            trunk.extend(g.fill(rows * n, |b| b));
        } else {
            trunk.extend(g.fill(rows * n / 2, |b| b));
        }
        let scale_off = trunk.len();
        for _ in 0..rows * groups {
            trunk.extend_from_slice(&f16(0.002 + g.next() as f32 / 256.0 * 0.018));
        }
        entries.push(json!({"name": name, "fmt": if q8 {2} else {3}, "off": off, "shape": t.shape, "group": group, "scale_off": scale_off, "bytes": trunk.len() - off}));
    }
    std::fs::write(dir.join("trunk.bin"), &trunk).unwrap();
    // codebooks + banks
    let (inter, d) = (cfg.moe_inter_dim, cfg.dim);
    let kinds = [(inter, d), (inter, d), (d, inter)];
    let mut cb = Vec::new();
    let mut layers = serde_json::Map::new();
    for l in 0..cfg.n_layers {
        let base = cb.len() / (16 + 256 * 8 * 2);
        for k in 0..3 * STAGES {
            cb.extend_from_slice(&0x4B42_4357u32.to_le_bytes());
            cb.extend_from_slice(&((base + k) as u16).to_le_bytes());
            cb.extend_from_slice(&[4, 8]);
            cb.extend_from_slice(&256u32.to_le_bytes());
            cb.extend_from_slice(&0u32.to_le_bytes());
            for _ in 0..256 * 8 {
                cb.extend_from_slice(&f16((g.next() as f32 - 128.0) / 128.0 * 0.3));
            }
        }
        let mut bank = Vec::new();
        let mut rec_size = 0;
        for e in 0..cfg.n_routed_experts {
            let mut payload = Vec::new();
            let mut offs = [0u32; 3];
            for (k, &(m, n)) in kinds.iter().enumerate() {
                offs[k] = (48 + payload.len()) as u32;
                payload.extend(g.fill(m.div_ceil(64) * (n / 8) * 64 * STAGES, |b| b));
            }
            let chan = (48 + payload.len()) as u32;
            for _ in 0..(2 * inter + d) {
                payload.extend_from_slice(&f16(0.01 + g.next() as f32 / 256.0 * 0.04));
            }
            let crc = crc32fast::hash(&payload);
            let size = (48 + payload.len()).div_ceil(4096) * 4096;
            rec_size = size;
            let mut h = Vec::new();
            h.extend_from_slice(&0x5058_4557u32.to_le_bytes());
            h.extend_from_slice(&(l as u16).to_le_bytes());
            h.extend_from_slice(&(e as u16).to_le_bytes());
            h.extend_from_slice(&[4, 0]);
            h.extend_from_slice(&(base as u16).to_le_bytes());
            h.extend_from_slice(&[0, 0, 0, 0]);
            h.extend_from_slice(&((size / 4096) as u32).to_le_bytes());
            for o in offs {
                h.extend_from_slice(&o.to_le_bytes());
            }
            h.extend_from_slice(&chan.to_le_bytes());
            h.extend_from_slice(&crc.to_le_bytes());
            h.extend_from_slice(&[0; 8]);
            bank.extend_from_slice(&h);
            bank.extend_from_slice(&payload);
            bank.resize(bank.len().div_ceil(4096) * 4096, 0);
        }
        assert_eq!(bank.len(), rec_size * cfg.n_routed_experts);
        std::fs::write(dir.join(format!("experts-L{l}.bin")), &bank).unwrap();
        layers.insert(l.to_string(), json!({"file": format!("experts-L{l}.bin"), "experts": cfg.n_routed_experts, "bytes": bank.len(), "codebook_base": base}));
    }
    std::fs::write(dir.join("codebooks.bin"), &cb).unwrap();
    // Engram
    let primes = release_primes(&cfg);
    let mut eng_layers = Vec::new();
    let mut engram = serde_json::Map::new();
    for (i, &l) in cfg.engram_layer_ids.iter().enumerate() {
        let rows = cfg.engram_num_embeddings[i] as usize;
        let dim = cfg.engram_head_dim;
        let row_bytes = dim / 2 + dim / 32 * 2;
        let mut t = Vec::new();
        for _ in 0..rows {
            t.extend(g.fill(dim / 2, |b| b));
            for _ in 0..dim / 32 {
                t.extend_from_slice(&f16(0.01 + g.next() as f32 / 256.0 * 0.04));
            }
        }
        std::fs::write(dir.join(format!("engram-L{l}.bin")), &t).unwrap();
        engram.insert(l.to_string(), json!({"rows": rows, "dim": dim, "group": 32, "bits": 4, "row_bytes": row_bytes, "bytes": rows * row_bytes}));
        let p = &primes[i];
        let mut offsets = vec![];
        let mut acc = 0u64;
        for &x in p.iter().flatten() {
            offsets.push(acc);
            acc += x;
        }
        eng_layers.push(json!({"layer": l, "multipliers": [1209691 + 2 * i as i64, 1899629, 1499525], "primes": p, "offsets": offsets}));
    }
    let ej = json!({"compressed_vocab_size": cfg.engram_compressed_vocab_size, "pad_id": 1, "max_ngram_size": cfg.engram_max_ngram_size, "n_heads": cfg.engram_n_heads, "head_dim": cfg.engram_head_dim, "layers": eng_layers});
    std::fs::write(
        dir.join("engram.json"),
        serde_json::to_vec_pretty(&ej).unwrap(),
    )
    .unwrap();
    let tokmap: Vec<u8> = (0..cfg.vocab_size as i32)
        .flat_map(|t| (t / 2).to_le_bytes())
        .collect();
    std::fs::write(dir.join("engram-tokmap.bin"), tokmap).unwrap();
    // specials written the way WASTE's converter did: escaped
    std::fs::write(dir.join("specials.json"), "[{\"id\": 3, \"text\": \"<\\uff5cUser\\uff5c>\"}, {\"id\": 4, \"text\": \"\\ud83d\\ude00\\n\\\"q\\\"\"}]").unwrap();
    let manifest = json!({
        "format_version": 0,
        "arch": "deepseek_v41_text",
        "tensor_prefix": "",
        "config": config_v,
        "expert_quant": {"fmt": "VQ3R", "stages": 3, "vec_dim": 8, "entries": 256, "index_block": 64, "bits_per_weight": 3},
        "layers": layers,
        "trunk": entries,
        "engram": engram,
    });
    write_manifest(dir, &manifest);
    manifest
}

pub fn write_manifest(dir: &Path, m: &Value) {
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec_pretty(m).unwrap(),
    )
    .unwrap();
}
