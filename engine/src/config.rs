//! Model configuration (MODEL.md §2, §3; CONTAINER.md §9–§10.1).
//!
//! Field names are the inference (`ModelArgs`) names. Three readers fill them:
//! * [`Config::from_release_json`]: the HF `config.json` of the release (MODEL.md §2.1);
//! * [`Config::from_inference_json`]: `inference/config.json` (`ModelArgs` names), also the
//!   `{"model_args": ...}` wrapper of `golden_tiny/meta.json`;
//! * [`Config::from_container_manifest`]: the WASTE manifest `config`, flat (CONTAINER.md
//!   §10.1) or converted from the release (text keys at the top, HF wrapper under `_outer`).
//!
//! Every constructor validates ([`Config::validate`], the `cfg_sane` step of MODEL.md §2.2 and
//! CONTAINER.md §9); the layer-role helpers below (MODEL.md §3) assume a validated config.
//!
//! The field list is the shared interface: other modules
//! code against these names.

mod engram;
mod numpy_rng;
mod parse;
mod validate;

pub use engram::{release_primes, EngramHashConstants, EngramLayerHash, EngramPad};
pub(crate) use parse::{container_vision, in_file as in_file_err, parse_json_bytes, read_json};

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
    /// `true` when `engram_pad_id` is already a *compressed* id (a WASTE container's
    /// `engram.json` `pad_id`, CONTAINER.md §6 / §11.3 item 9); `false` when it is a raw token
    /// id whose compressed id `map[engram_pad_id]` is the pad (the release, MODEL.md §6.6.1).
    #[serde(default)]
    pub engram_pad_is_compressed: bool,
    /// The largest number of positions a sequence may have (HF `max_position_embeddings`;
    /// `None` when the config does not state it). Forwards and restored states beyond it are
    /// refused ([`Config::check_positions`]).
    #[serde(default)]
    pub max_position: Option<usize>,
    /// The DSpark draft head's arguments (MODEL.md §10.1) when the model has MTP stages
    /// (`n_mtp_layers > 0` and `dspark_block_size > 0`); `None` otherwise.
    #[serde(default)]
    pub dspark: Option<DsparkConfig>,
}

/// The `dspark_*` model arguments (MODEL.md §2.1, §10.1; `ModelArgs` of the official code).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DsparkConfig {
    /// Draft positions per block: the last sampled id, then `block_size - 1` noise ids.
    pub block_size: usize,
    pub noise_token_id: u32,
    /// Backbone layers whose *input* stream (after Engram, averaged over the hc copies) is
    /// concatenated into `main_hidden`, in this order.
    pub target_layer_ids: Vec<usize>,
    pub markov_rank: usize,
    /// Routed experts of the stages' MoE; 0 = the backbone's `n_routed_experts`.
    pub n_routed_experts: usize,
    /// Experts per token of the stages' MoE; 0 = the backbone's `n_activated_experts`.
    pub n_activated_experts: usize,
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

/// What one layer does in the CSA2 hand-off (MODEL.md §3), as a value for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerRole {
    pub layer: usize,
    pub ratio: usize,
    /// Ratio 0 and no compressed KV: attends its window only.
    pub window_only: bool,
    pub kv_source: bool,
    pub index_source: bool,
    /// Source of the compressed KV this layer reads (itself when it is a KV source).
    pub kv_from: Option<usize>,
    /// Layer whose top-k selection this layer uses (itself when it is an index source).
    pub topk_from: Option<usize>,
    /// For index sources: the layer whose index-key cache the indexer scores against.
    pub index_keys_from: Option<usize>,
    pub candidate_writer: bool,
    /// Index source after the candidate source: its selection is masked to candidate blocks.
    pub candidate_consumer: bool,
    /// Position in `engram_layer_ids` when an Engram lookup precedes this layer.
    pub engram: Option<usize>,
    pub mtp: bool,
}

impl Config {
    /// Refuse a sequence of `end` positions beyond [`Config::max_position`].
    pub fn check_positions(&self, end: usize) -> crate::Result<()> {
        match self.max_position {
            Some(max) if end > max => Err(crate::Error::PositionLimit {
                end: end as u64,
                max,
            }),
            _ => Ok(()),
        }
    }

    /// Compression ratio of layer `l` (0 = window-only; also 0 beyond the list).
    pub fn ratio(&self, l: usize) -> usize {
        self.compress_ratios.get(l).copied().unwrap_or(0)
    }

    pub fn is_kv_source(&self, l: usize) -> bool {
        self.kv_source_layers.contains(&l)
    }

    pub fn is_index_source(&self, l: usize) -> bool {
        self.index_source_layers.contains(&l)
    }

    pub fn is_candidate_source(&self, l: usize) -> bool {
        self.candidate_source_layer == Some(l)
    }

    /// An index source after the candidate source: masks its selection to the candidate blocks.
    pub fn is_candidate_consumer(&self, l: usize) -> bool {
        matches!(self.candidate_source_layer, Some(c) if l > c && l < self.n_layers && self.is_index_source(l))
    }

    /// The most recent KV source ≤ `l` whose compressed KV layer `l` reads; `None` for a
    /// ratio-0 (window-only or MTP) layer.
    pub fn kv_source_for(&self, l: usize) -> Option<usize> {
        if self.ratio(l) == 0 {
            return None;
        }
        self.kv_source_layers
            .iter()
            .copied()
            .filter(|&s| s <= l)
            .max()
    }

    /// The most recent index source ≤ `l` whose top-k selection layer `l` uses; `None` for a
    /// ratio-0 layer.
    pub fn index_source_for(&self, l: usize) -> Option<usize> {
        if self.ratio(l) == 0 {
            return None;
        }
        self.index_source_layers
            .iter()
            .copied()
            .filter(|&s| s <= l)
            .max()
    }

    /// For an index source: the owner of the index-key cache its indexer scores against
    /// (itself for a KV source, else the most recent KV source). `None` for other layers.
    pub fn index_keys_source_for(&self, l: usize) -> Option<usize> {
        if !self.is_index_source(l) {
            return None;
        }
        self.kv_source_for(l)
    }

    /// Index of `l` in `engram_layer_ids` (0 for the first Engram layer) or `None`.
    pub fn engram_index(&self, l: usize) -> Option<usize> {
        self.engram_layer_ids.iter().position(|&e| e == l)
    }

    /// Routed and activated expert counts of layer `l`: the backbone's, or for an MTP stage
    /// (`l >= n_layers`) the DSpark ones where they are set (`ModelArgs.get_moe_config`).
    pub fn moe_experts(&self, l: usize) -> (usize, usize) {
        match (&self.dspark, l >= self.n_layers) {
            (Some(d), true) => (
                non_zero_or(d.n_routed_experts, self.n_routed_experts),
                non_zero_or(d.n_activated_experts, self.n_activated_experts),
            ),
            _ => (self.n_routed_experts, self.n_activated_experts),
        }
    }

    /// Rows of the mHC mixing matrices: pre (hc) + post (hc) + comb (hc²) = (2 + hc)·hc.
    pub fn hc_mix_rows(&self) -> usize {
        (2 + self.hc_mult) * self.hc_mult
    }

    /// Hash columns per Engram layer: (max_ngram − 1) · n_heads.
    pub fn engram_columns(&self) -> usize {
        self.engram_max_ngram_size.saturating_sub(1) * self.engram_n_heads
    }

    /// MODEL.md §2.2 item 8: with this, selected level-2 entries are never −∞. Not an error
    /// when false (the synthetic WASTE container violates it), but worth a warning.
    pub fn candidate_coverage_ok(&self) -> bool {
        match self.candidate_source_layer {
            None => true,
            Some(_) => {
                (self.candidate_topk_blocks.saturating_sub(1)) * self.candidate_block_size + 1
                    >= self.index_topk
            }
        }
    }

    /// The full role of layer `l` (backbone `0..n_layers`, MTP `n_layers..`).
    pub fn layer_role(&self, l: usize) -> LayerRole {
        let ratio = self.ratio(l);
        LayerRole {
            layer: l,
            ratio,
            window_only: ratio == 0,
            kv_source: self.is_kv_source(l),
            index_source: self.is_index_source(l),
            kv_from: self.kv_source_for(l),
            topk_from: self.index_source_for(l),
            index_keys_from: self.index_keys_source_for(l),
            candidate_writer: self.is_candidate_source(l),
            candidate_consumer: self.is_candidate_consumer(l),
            engram: self.engram_index(l),
            mtp: l >= self.n_layers,
        }
    }

    /// Roles of every layer, MTP stages included.
    pub fn layer_roles(&self) -> Vec<LayerRole> {
        (0..self.n_layers + self.n_mtp_layers)
            .map(|l| self.layer_role(l))
            .collect()
    }
}

fn non_zero_or(v: usize, default: usize) -> usize {
    if v == 0 {
        default
    } else {
        v
    }
}
