//! Which tensors a config implies (MODEL.md §4.2–§4.4), with their logical shapes and the
//! storage each layout may use for them, and the container ↔ release name mapping
//! (CONTAINER.md §8).
//!
//! The forward pass reads exactly [`expected_tensors`]; both readers refuse a checkpoint that
//! lacks one of them, by name. MTP stages and the vision tower are not required (the text
//! forward pass does not use them); if present they are still served by name.

use super::{Layout, Storage};
use crate::config::Config;

/// What kind of tensor an expected name is, which fixes the storage it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorClass {
    /// A linear stored FP8 in the release (`attn.wq_a`, `shared_experts.w1`, ...).
    Linear,
    /// A routed expert matrix: FP4 in the release, a VQ3R record in a container.
    Expert,
    /// Anything else: norms, hc_*, sink, router, BF16 linears, embed/head.
    Dense,
    /// An Engram table: FP8 rows in the release, `engram-L{n}.bin` in a container.
    EngramTable,
}

impl TensorClass {
    /// Storage a layout may use for this class.
    pub fn allowed(self, layout: Layout) -> &'static [Storage] {
        use Storage::*;
        match (layout, self) {
            (Layout::Release, TensorClass::Linear) => &[Fp8Block, Bf16, F16, F32],
            (Layout::Release, TensorClass::Expert) => &[Fp4, Fp8Block, Bf16, F16, F32],
            (Layout::Release, TensorClass::Dense) => &[Bf16, F16, F32],
            (Layout::Release, TensorClass::EngramTable) => &[Fp8Rows, Bf16, F16, F32],
            (Layout::Container, TensorClass::Linear | TensorClass::Dense) => &[F32, Q8G, Q4G, Q3G],
            (Layout::Container, TensorClass::Expert) => &[Vq3r, Vq2r, Vq4p],
            (Layout::Container, TensorClass::EngramTable) => &[EngramRows],
        }
    }
}

/// One tensor the config implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub class: TensorClass,
}

/// Every tensor the text forward pass reads, in checkpoint order (top level, then per layer).
pub fn expected_tensors(cfg: &Config) -> Vec<ExpectedTensor> {
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, class: TensorClass| {
        out.push(ExpectedTensor { name, shape, class })
    };
    use TensorClass::*;
    let d = cfg.dim;
    add("embed.weight".into(), vec![cfg.vocab_size, d], Dense);
    for l in 0..cfg.n_layers {
        let p = |s: &str| format!("layers.{l}.{s}");
        add(p("attn_norm.weight"), vec![d], Dense);
        add(p("ffn_norm.weight"), vec![d], Dense);
        for site in ["attn", "ffn"] {
            add(
                p(&format!("hc_{site}_fn")),
                vec![cfg.hc_mix_rows(), cfg.hc_mult * d],
                Dense,
            );
            add(
                p(&format!("hc_{site}_base")),
                vec![cfg.hc_mix_rows()],
                Dense,
            );
            add(p(&format!("hc_{site}_scale")), vec![3], Dense);
        }
        let qdim = cfg.n_heads * cfg.head_dim;
        add(p("attn.wq_a.weight"), vec![cfg.q_lora_rank, d], Linear);
        add(p("attn.q_norm.weight"), vec![cfg.q_lora_rank], Dense);
        add(p("attn.wq_b.weight"), vec![qdim, cfg.q_lora_rank], Linear);
        add(p("attn.wkv.weight"), vec![cfg.head_dim, d], Linear);
        add(p("attn.kv_norm.weight"), vec![cfg.head_dim], Dense);
        add(
            p("attn.wo_a.weight"),
            vec![cfg.o_groups * cfg.o_lora_rank, qdim / cfg.o_groups],
            Linear,
        );
        add(
            p("attn.wo_b.weight"),
            vec![d, cfg.o_groups * cfg.o_lora_rank],
            Linear,
        );
        add(p("attn.attn_sink"), vec![cfg.n_heads], Dense);
        if cfg.is_kv_source(l) {
            add(
                p("attn.compressor.wkv.weight"),
                vec![cfg.head_dim, d],
                Dense,
            );
            if cfg.ratio(l) > 1 {
                add(
                    p("attn.compressor.wgate.weight"),
                    vec![cfg.head_dim, d],
                    Dense,
                );
            }
            add(p("attn.compressor.norm.weight"), vec![cfg.head_dim], Dense);
        }
        if cfg.is_index_source(l) {
            add(
                p("attn.indexer.wq_b.weight"),
                vec![cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank],
                Linear,
            );
            add(
                p("attn.indexer.weights_proj.weight"),
                vec![cfg.index_n_heads, d],
                Dense,
            );
            if cfg.is_kv_source(l) {
                add(
                    p("attn.indexer.wk.weight"),
                    vec![cfg.index_head_dim, cfg.head_dim],
                    Dense,
                );
                add(
                    p("attn.indexer.k_norm.weight"),
                    vec![cfg.index_head_dim],
                    Dense,
                );
            }
        }
        if let Some(i) = cfg.engram_index(l) {
            let rows = cfg.engram_num_embeddings[i] as usize;
            add(
                p("engram.embed.weight"),
                vec![rows, cfg.engram_head_dim],
                EngramTable,
            );
            add(
                p("engram.wkv.weight"),
                vec![
                    (cfg.hc_mult + 1) * d,
                    cfg.engram_columns() * cfg.engram_head_dim,
                ],
                Linear,
            );
            add(p("engram.q_weight"), vec![cfg.hc_mult, d], Dense);
            add(p("engram.k_weight"), vec![cfg.hc_mult, d], Dense);
        }
        add(p("ffn.gate.weight"), vec![cfg.n_routed_experts, d], Dense);
        add(p("ffn.gate.bias"), vec![cfg.n_routed_experts], Dense);
        if cfg.routing_bias_vl {
            add(p("ffn.gate.bias_vl"), vec![cfg.n_routed_experts], Dense);
        }
        let i = cfg.moe_inter_dim;
        add(p("ffn.shared_experts.w1.weight"), vec![i, d], Linear);
        add(p("ffn.shared_experts.w3.weight"), vec![i, d], Linear);
        add(p("ffn.shared_experts.w2.weight"), vec![d, i], Linear);
        for e in 0..cfg.n_routed_experts {
            add(p(&format!("ffn.experts.{e}.w1.weight")), vec![i, d], Expert);
            add(p(&format!("ffn.experts.{e}.w3.weight")), vec![i, d], Expert);
            add(p(&format!("ffn.experts.{e}.w2.weight")), vec![d, i], Expert);
        }
    }
    add("norm.weight".into(), vec![d], Dense);
    add("head.weight".into(), vec![cfg.vocab_size, d], Dense);
    out
}

/// Where a canonical name lives in a WASTE container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerName {
    /// A `trunk.bin` entry with this container name.
    Trunk(String),
    /// Kind κ (0 gate = w1, 1 up = w3, 2 down = w2) of record `expert` in `experts-L{layer}.bin`.
    Expert {
        layer: usize,
        expert: usize,
        kind: usize,
    },
    /// The rows of `engram-L{layer}.bin`.
    EngramTable { layer: usize },
    /// Not stored by a container (`.scale` companions, `mtp.*`, unknown names).
    NotStored,
}

/// Per-layer pairs (release suffix, container suffix) under `layers.L.` / `model.layers.L.`.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "hc_attn_fn"),
    ("hc_attn_base", "hc_attn_base"),
    ("hc_attn_scale", "hc_attn_scale"),
    ("hc_ffn_fn", "hc_ffn_fn"),
    ("hc_ffn_base", "hc_ffn_base"),
    ("hc_ffn_scale", "hc_ffn_scale"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_a_layernorm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"),
    ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_layernorm.weight"),
    ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"),
    ("attn.attn_sink", "self_attn.attn_sink"),
    (
        "attn.compressor.wkv.weight",
        "self_attn.compress.kv_proj.weight",
    ),
    (
        "attn.compressor.wgate.weight",
        "self_attn.compress.gate_proj.weight",
    ),
    (
        "attn.compressor.norm.weight",
        "self_attn.compress.norm.weight",
    ),
    (
        "attn.indexer.wq_b.weight",
        "self_attn.indexer.q_b_proj.weight",
    ),
    (
        "attn.indexer.weights_proj.weight",
        "self_attn.indexer.weights_proj.weight",
    ),
    ("attn.indexer.wk.weight", "self_attn.indexer.k_proj.weight"),
    (
        "attn.indexer.k_norm.weight",
        "self_attn.indexer.k_layernorm.weight",
    ),
    ("engram.wkv.weight", "engram.wkv.weight"),
    ("engram.q_weight", "engram.q_weight"),
    ("engram.k_weight", "engram.k_weight"),
    ("ffn.gate.weight", "block_sparse_moe.gate.weight"),
    (
        "ffn.gate.bias",
        "block_sparse_moe.gate.e_score_correction_bias",
    ),
    (
        "ffn.gate.bias_vl",
        "block_sparse_moe.gate.e_score_correction_bias_vl",
    ),
    (
        "ffn.shared_experts.w1.weight",
        "block_sparse_moe.shared_experts.gate_proj.weight",
    ),
    (
        "ffn.shared_experts.w3.weight",
        "block_sparse_moe.shared_experts.up_proj.weight",
    ),
    (
        "ffn.shared_experts.w2.weight",
        "block_sparse_moe.shared_experts.down_proj.weight",
    ),
];

/// Top-level pairs and prefix pairs (release, container).
const TOP_NAMES: &[(&str, &str)] = &[
    ("embed.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("head.weight", "lm_head.weight"),
    ("image_start", "model.image_start"),
    ("image_end", "model.image_end"),
    ("image_newline", "model.image_newline"),
];
const PREFIXES: &[(&str, &str)] = &[("vision.", "vision_tower."), ("aligner.", "mm_projector.")];

/// Expert matrix names: w1 = gate (κ 0), w3 = up (κ 1), w2 = down (κ 2).
pub const EXPERT_KINDS: [&str; 3] = ["w1", "w3", "w2"];

/// `"layers.L.rest"` → `(L, rest)`.
fn split_layer<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (l, rest) = rest.split_once('.')?;
    if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) || (l.len() > 1 && l.starts_with('0'))
    {
        return None;
    }
    Some((l.parse().ok()?, rest))
}

/// Map a canonical release name to its place in a container (CONTAINER.md §8).
pub fn release_to_container(name: &str) -> ContainerName {
    if let Some(&(_, c)) = TOP_NAMES.iter().find(|(r, _)| *r == name) {
        return ContainerName::Trunk(c.to_string());
    }
    for (r, c) in PREFIXES {
        if let Some(rest) = name.strip_prefix(r) {
            return ContainerName::Trunk(format!("{c}{rest}"));
        }
    }
    let Some((l, rest)) = split_layer(name, "layers.") else {
        return ContainerName::NotStored;
    };
    if rest == "engram.embed.weight" {
        return ContainerName::EngramTable { layer: l };
    }
    if let Some(e) = rest.strip_prefix("ffn.experts.") {
        if let Some((e, w)) = e.split_once('.') {
            let expert_ok = !e.is_empty()
                && e.bytes().all(|b| b.is_ascii_digit())
                && (e.len() == 1 || !e.starts_with('0'));
            if let (true, Ok(expert)) = (expert_ok, e.parse::<usize>()) {
                // (no allocation: the expert path is read on every decode step)
                let stem = w.strip_suffix(".weight");
                if let Some(kind) = EXPERT_KINDS.iter().position(|k| stem == Some(*k)) {
                    return ContainerName::Expert {
                        layer: l,
                        expert,
                        kind,
                    };
                }
            }
        }
        return ContainerName::NotStored;
    }
    match LAYER_NAMES.iter().find(|(r, _)| *r == rest) {
        Some((_, c)) => ContainerName::Trunk(format!("model.layers.{l}.{c}")),
        None => ContainerName::NotStored,
    }
}

/// Map a container trunk name (prefix already stripped) to its canonical release name.
pub fn container_to_release(name: &str) -> Option<String> {
    if let Some(&(r, _)) = TOP_NAMES.iter().find(|(_, c)| *c == name) {
        return Some(r.to_string());
    }
    for (r, c) in PREFIXES {
        if let Some(rest) = name.strip_prefix(c) {
            return Some(format!("{r}{rest}"));
        }
    }
    let (l, rest) = split_layer(name, "model.layers.")?;
    LAYER_NAMES
        .iter()
        .find(|(_, c)| *c == rest)
        .map(|(r, _)| format!("layers.{l}.{r}"))
}

/// Canonical name of kind κ of expert `e` in layer `l`.
pub fn expert_name(l: usize, e: usize, kind: usize) -> String {
    format!("layers.{l}.ffn.experts.{e}.{}.weight", EXPERT_KINDS[kind])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_name_round_trips() {
        for (r, c) in LAYER_NAMES {
            let rel = format!("layers.7.{r}");
            let con = format!("model.layers.7.{c}");
            assert_eq!(
                release_to_container(&rel),
                ContainerName::Trunk(con.clone())
            );
            assert_eq!(container_to_release(&con), Some(rel));
        }
        for (r, c) in TOP_NAMES {
            assert_eq!(release_to_container(r), ContainerName::Trunk(c.to_string()));
            assert_eq!(container_to_release(c).as_deref(), Some(*r));
        }
        assert_eq!(
            container_to_release("vision_tower.blocks.3.attn.wqkv.weight").as_deref(),
            Some("vision.blocks.3.attn.wqkv.weight")
        );
    }

    #[test]
    fn experts_and_engram_tables() {
        assert_eq!(
            release_to_container("layers.3.ffn.experts.5.w1.weight"),
            ContainerName::Expert {
                layer: 3,
                expert: 5,
                kind: 0
            }
        );
        assert_eq!(
            release_to_container("layers.3.ffn.experts.5.w3.weight"),
            ContainerName::Expert {
                layer: 3,
                expert: 5,
                kind: 1
            }
        );
        assert_eq!(
            release_to_container("layers.3.ffn.experts.5.w2.weight"),
            ContainerName::Expert {
                layer: 3,
                expert: 5,
                kind: 2
            }
        );
        assert_eq!(expert_name(3, 5, 2), "layers.3.ffn.experts.5.w2.weight");
        assert_eq!(
            release_to_container("layers.1.engram.embed.weight"),
            ContainerName::EngramTable { layer: 1 }
        );
        for bad in [
            "layers.1.engram.embed.scale",
            "layers.3.ffn.experts.5.w1.scale",
            "layers.3.ffn.experts.05.w1.weight",
            "layers.x.attn_norm.weight",
            "layers.01.attn_norm.weight",
            "mtp.0.attn_norm.weight",
            "",
        ] {
            assert_eq!(release_to_container(bad), ContainerName::NotStored, "{bad}");
        }
    }
}
