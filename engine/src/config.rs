//! Model configuration (MODEL.md §2).
//!
//! Field names are the inference (`ModelArgs`) names; `from_release_json` maps the HF
//! `config.json` keys onto them (MODEL.md §2.1) and `from_container_manifest` the WASTE
//! manifest `config` (CONTAINER.md §9–§10.1). `validate` is the `cfg_sane` step (§2.2).
//!
//! OWNER: readers helper (issue 2). The field list is the shared interface: other modules
//! code against these names.

use serde::{Deserialize, Serialize};

/// Typed DS41 text (and vision header) configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    /// Residual width D.
    pub dim: usize,
    pub moe_inter_dim: usize,
    pub n_layers: usize,
    pub n_mtp_layers: usize,
    pub n_heads: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub n_activated_experts: usize,
    /// Always "sqrtsoftplus" for DS41.
    pub score_func: String,
    pub norm_topk_prob: bool,
    pub route_scale: f32,
    pub swiglu_limit: f32,
    pub q_lora_rank: usize,
    pub head_dim: usize,
    pub rope_head_dim: usize,
    pub norm_eps: f32,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub window_size: usize,
    pub compress_ratios: Vec<usize>,
    pub kv_source_layers: Vec<usize>,
    pub index_source_layers: Vec<usize>,
    /// `None` when the config has no candidate source (inference value -1).
    pub candidate_source_layer: Option<usize>,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    pub original_seq_len: usize,
    pub rope_factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub engram_layer_ids: Vec<usize>,
    pub engram_vocab_size: u64,
    pub engram_num_embeddings: Vec<u64>,
    pub engram_max_ngram_size: usize,
    pub engram_n_heads: usize,
    pub engram_head_dim: usize,
    /// Raw token id whose compressed id fills missing Engram history (release: 2).
    /// A container states the pad directly as a compressed id in `engram.json`; see
    /// `engram_pad_is_compressed`.
    pub engram_pad_id: i64,
    pub engram_compressed_vocab_size: usize,
    /// Layers whose routers carry `gate.bias_vl` (vision enabled in the release; the
    /// container's `routing_bias_vl`).
    pub routing_bias_vl: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub image_token_id: Option<u32>,
    /// Vision header, present in the release config; the tower itself is not implemented yet.
    pub vision: Option<VisionConfig>,
}

/// `vision_config` of the release (MODEL.md §2.1, last rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub inter_dim: usize,
    pub patch_size: usize,
    pub downsample_ratio: usize,
    pub max_n_token: usize,
    pub min_pixels: usize,
    pub max_wh_ratio: Option<f64>,
    pub rope_theta: f64,
}
