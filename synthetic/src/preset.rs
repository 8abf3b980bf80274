//! The presets (names are interface) and their geometry (MODEL.md §2, §11; CONTAINER.md §10.1).
//!
//! A [`Geometry`] is an `engine::config::Config` (the inference `ModelArgs` names) plus the
//! tokenizer's pad id; the writers turn it into the release `config.json` or the container
//! manifest's flat config, and the readers must parse back the same `Config`.

use std::collections::BTreeSet;

use ds41_engine::checkpoint::Layout;
use ds41_engine::config::{release_primes, Config, DsparkConfig, VisionConfig};

use crate::container::ExpertCodes;
use crate::tokenizer::{TokenizerKind, Vocab};
use crate::SynthError;

/// `text_config` keys a writer computes from the others (MODEL.md §6.6.1: the Engram rows are
/// the sums of each layer's primes; the compressed vocabulary comes from the tokenizer).
const DERIVED_KEYS: [&str; 2] = ["engram_num_embeddings", "engram_compressed_vocab_size"];

/// Everything the writers need to know about one synthetic model: the engine's own
/// [`Config`] (the inference `ModelArgs` names, so the field list lives in one place) plus the
/// one tokenizer fact the config does not carry. Dereferences to the `Config`.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub args: Config,
    /// `pad_token_id` of the tokenizer files (not a `ModelArgs` field).
    pub pad_token_id: u32,
    /// Routed experts whose router entries are copies of another's (none for most presets).
    pub router_ties: Vec<RouterTie>,
}

/// On backbone layer `layer`, routed expert `copy` gets expert `expert`'s gate row
/// (`ffn.gate.weight`) and bias entries (`ffn.gate.bias`, `ffn.gate.bias_vl`). Their router
/// logits, sqrt-softplus scores and selection keys are then equal bit for bit in every
/// numerics profile (MODEL.md §6.5: the same f32 dot product of the same row, then
/// elementwise), so whenever the pair straddles the top-k boundary the selection is decided
/// by the tie rule alone (§5.10) and the golden's expert margin is exactly 0. Their expert
/// weights stay different, so the tie rule is visible in `moe_out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterTie {
    pub layer: usize,
    pub expert: usize,
    pub copy: usize,
}

impl std::ops::Deref for Geometry {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.args
    }
}

impl std::ops::DerefMut for Geometry {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.args
    }
}

impl Geometry {
    /// Complete `args` with what follows from the rest: the Engram table rows (the primes of
    /// MODEL.md §6.6.1) and the compressed vocabulary of the preset's tokenizer.
    fn new(args: Config, pad_token_id: u32, tokenizer: TokenizerKind) -> Geometry {
        Self::try_new(args, pad_token_id, tokenizer).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Geometry::new`] for arguments no preset wrote: why not, when the tokenizer cannot
    /// have `vocab_size` ids.
    fn try_new(
        mut args: Config,
        pad_token_id: u32,
        tokenizer: TokenizerKind,
    ) -> Result<Geometry, String> {
        args.engram_num_embeddings = release_primes(&args)
            .iter()
            .map(|layer| layer.iter().flatten().sum())
            .collect();
        let map = Vocab::try_build(tokenizer, args.vocab_size)?.compressed_token_map();
        args.engram_compressed_vocab_size = map.iter().collect::<BTreeSet<_>>().len();
        Ok(Geometry {
            args,
            pad_token_id,
            router_ties: Vec::new(),
        })
    }

    /// The same geometry with `n_mtp` DSpark stages appended (window-only, ratio 0), stored
    /// as `mtp.{s}.*` tensors.
    fn with_dspark(mut self, n_mtp: usize, dspark: DsparkConfig) -> Geometry {
        self.args.n_mtp_layers = n_mtp;
        self.args
            .compress_ratios
            .extend(std::iter::repeat_n(0, n_mtp));
        self.args.dspark = Some(dspark);
        self
    }

    /// Width of one Engram lookup: (max_ngram − 1) · n_heads rows of head_dim.
    pub fn engram_in_dim(&self) -> usize {
        self.engram_columns() * self.engram_head_dim
    }
}

/// An f32 config value as the f64 with the same shortest decimal (1e-6f32 → 1e-06, not
/// 9.999999974752427e-07), so the JSON writers print what a person wrote in the preset.
pub fn decimal(x: f32) -> f64 {
    x.to_string()
        .parse()
        .expect("an f32's decimal form is an f64")
}

/// How the release layout splits tensors over files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// One `model.safetensors`.
    Single,
    /// `model.safetensors.index.json` + shards like the release's: embed; one per layer;
    /// head + norm; Engram tables (MODEL.md §4.1).
    ReleaseLike,
    /// `model.safetensors.index.json` + this many shards of consecutive layers (embed in the
    /// first, head + norm in the last, MTP stages after the backbone).
    Files(usize),
}

/// One named preset.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub geometry: Geometry,
    pub tokenizer: TokenizerKind,
    pub sharding: Sharding,
    /// Container layout reproduces WASTE's `make_test_container.py --ds41` byte for byte.
    pub waste_compat: bool,
    /// How the container layout codes the routed experts (the release layout stores FP4).
    pub expert_codes: ExpertCodes,
    /// A generated checkpoint is large: keep it out of the default test suite.
    pub large: bool,
    /// Why the release layout cannot hold this geometry (`None`: both layouts work).
    pub no_release: Option<&'static str>,
    /// Why the container layout cannot hold this geometry (`None`: it can).
    pub no_container: Option<&'static str>,
    /// What a sequence reaches, in prose (the computable part is `mechanisms::reach`).
    pub reach: &'static str,
}

/// Names of every preset, in listing order.
pub const PRESET_NAMES: [&str; 12] = [
    "tiny",
    "tiny-sharded",
    "grouped",
    "window-mtp",
    "dspark",
    "tied-router",
    "off-release",
    "vision",
    "waste-tiny",
    "waste-vq4p",
    "wide",
    "wide-deep",
];

impl Preset {
    /// Why this preset cannot be written in `layout` (`None`: it can).
    pub fn unsupported(&self, layout: ds41_engine::checkpoint::Layout) -> Option<&'static str> {
        match layout {
            ds41_engine::checkpoint::Layout::Release => self.no_release,
            ds41_engine::checkpoint::Layout::Container => self.no_container,
        }
    }

    pub fn by_name(name: &str) -> Option<Preset> {
        Some(match name {
            "tiny" => tiny(Sharding::Single, "tiny"),
            "tiny-sharded" => tiny(Sharding::ReleaseLike, "tiny-sharded"),
            "grouped" => grouped(),
            "window-mtp" => window_mtp(),
            "dspark" => dspark(),
            "tied-router" => tied_router(),
            "off-release" => off_release(),
            "vision" => vision(),
            "waste-tiny" => waste_tiny(),
            "waste-vq4p" => waste_vq4p(),
            "wide" => wide(),
            "wide-deep" => wide_deep(),
            _ => return None,
        })
    }

    /// This preset at another geometry: `text_config` keys of its release `config.json`
    /// (MODEL.md §2.1 names) replaced by the given JSON values, for checks on shapes no preset
    /// has. The keys derived from the others (`engram_num_embeddings`,
    /// `engram_compressed_vocab_size`) are recomputed, not set; the result must pass the
    /// engine's config checks for `layout` (the release layout's include the kernels'
    /// divisibility rules, MODEL.md §2.2; a container's its ratio grouping, CONTAINER.md §9).
    /// Every tensor is drawn for the new shapes from the same seed streams.
    pub fn with_overrides(
        mut self,
        overrides: &[(String, serde_json::Value)],
        layout: Layout,
    ) -> Result<Preset, SynthError> {
        if overrides.is_empty() {
            return Ok(self);
        }
        let refuse = |key: &str, reason: String| SynthError::Override {
            key: key.to_string(),
            reason,
        };
        let g = &self.geometry;
        let mut root = crate::release::root_config(g, g.engram_compressed_vocab_size);
        let text = root["text_config"]
            .as_object_mut()
            .expect("the writer's text_config is an object");
        for (key, value) in overrides {
            if DERIVED_KEYS.contains(&key.as_str()) {
                return Err(refuse(
                    key,
                    "is derived from the other keys, not set".into(),
                ));
            }
            if !text.contains_key(key) || key == "model_type" {
                return Err(refuse(
                    key,
                    format!(
                        "is not a text_config key of the release config.json (keys: {})",
                        text.keys()
                            .filter(|k| *k != "model_type" && !DERIVED_KEYS.contains(&k.as_str()))
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            text.insert(key.clone(), value.clone());
        }
        let keys: Vec<&str> = overrides.iter().map(|(k, _)| k.as_str()).collect();
        let given = |e: ds41_engine::Error| refuse(&keys.join(", "), e.to_string());
        let args = Config::read_release_value(&root).map_err(given)?;
        let mut geometry = Geometry::try_new(args, g.pad_token_id, self.tokenizer)
            .map_err(|why| refuse("vocab_size", format!("the preset's tokenizer: {why}")))?;
        geometry.router_ties = g.router_ties.clone();
        match layout {
            Layout::Release => geometry
                .validate()
                .and_then(|()| geometry.validate_upstream_kernels()),
            Layout::Container => geometry.validate_container(),
        }
        .map_err(given)?;
        for t in &geometry.router_ties {
            if t.layer >= geometry.n_layers || t.expert.max(t.copy) >= geometry.n_routed_experts {
                return Err(refuse(
                    &keys.join(", "),
                    format!(
                        "the preset ties experts {} and {} on layer {}, which this geometry does not have",
                        t.expert, t.copy, t.layer
                    ),
                ));
            }
        }
        self.geometry = geometry;
        Ok(self)
    }

    pub fn all() -> Vec<Preset> {
        PRESET_NAMES
            .iter()
            .map(|n| Preset::by_name(n).expect("listed preset"))
            .collect()
    }
}

const TINY_REACH: &str = "MODEL.md §11 recipe. An odd prefill longer than the window (e.g. 37) then \
≥ 24 decode steps (61 tokens) reaches: window ring wrap (p ≥ 8) in prefill and decode; ratio-2 groups \
completed (p ≥ 1) and a partial group carried over the prefill/decode boundary (odd prefill); ratio-2 \
indexer discards positions (> 8 compressed, p ≥ 17) so the index_k defect is visible in decode; the \
ratio-1 candidate writer has > 3 blocks of 4 (p ≥ 12) so the candidate filter removes blocks for the \
index-only consumer (layer 5); YaRN at positions ≥ 32; Engram on a window-only layer (0) and the \
ratio-2 source (1) with a compressed map whose pad (raw 67, 'a') is not the identity (→ 35); top-2 of \
4 experts with a spread router; swiglu_limit 1.0 with unit-scale activations so both clamps fire.";

/// `tiny`'s model arguments (MODEL.md §11); the other presets state how they differ.
fn tiny_args() -> Config {
    Config {
        vocab_size: 512,
        dim: 128,
        moe_inter_dim: 64,
        n_layers: 6,
        n_mtp_layers: 0,
        n_heads: 4,
        n_routed_experts: 4,
        n_shared_experts: 1,
        n_activated_experts: 2,
        score_func: "sqrtsoftplus".into(),
        norm_topk_prob: true,
        route_scale: 1.5,
        swiglu_limit: 1.0,
        q_lora_rank: 64,
        head_dim: 64,
        rope_head_dim: 16,
        norm_eps: 1e-20,
        o_groups: 2,
        o_lora_rank: 32,
        window_size: 8,
        compress_ratios: vec![0, 2, 2, 1, 1, 1],
        kv_source_layers: vec![1, 3],
        index_source_layers: vec![1, 3, 5],
        candidate_source_layer: Some(3),
        candidate_topk_blocks: 3,
        candidate_block_size: 4,
        index_n_heads: 16,
        index_head_dim: 32,
        index_topk: 8,
        rope_theta: 10000.0,
        compress_rope_theta: 160000.0,
        original_seq_len: 32,
        rope_factor: 4.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        hc_mult: 4,
        hc_sinkhorn_iters: 20,
        hc_eps: 1e-6,
        engram_layer_ids: vec![0, 1],
        engram_vocab_size: 100,
        engram_num_embeddings: Vec::new(), // filled in by Geometry::new
        engram_max_ngram_size: 3,
        engram_n_heads: 2,
        engram_head_dim: 32,
        engram_pad_id: 67,
        bos_token_id: Some(0),
        eos_token_id: Some(1),
        engram_compressed_vocab_size: 0, // filled in by Geometry::new
        routing_bias_vl: true,
        image_token_id: None,
        vision: None,
        engram_pad_is_compressed: false,
        max_position: None,
        dspark: None,
    }
}

fn tiny(sharding: Sharding, name: &'static str) -> Preset {
    let g = Geometry::new(tiny_args(), 2, TokenizerKind::ByteBpe);
    Preset {
        name,
        description: if sharding == Sharding::Single {
            "MODEL.md §11 minimal model: 6 layers, one layer per role, 16 index heads, Engram on layers 0/1, non-identity compressed map"
        } else {
            "`tiny` written as model.safetensors.index.json + release-like shards (embed, one per layer, head/norm, Engram tables)"
        },
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: TINY_REACH,
    }
}

fn grouped() -> Preset {
    let g = Geometry::new(
        Config {
            dim: 256,
            n_layers: 8,
            n_heads: 8,
            n_routed_experts: 8,
            n_activated_experts: 3,
            head_dim: 64,
            rope_head_dim: 32,
            o_groups: 4,
            o_lora_rank: 32,
            window_size: 16,
            compress_ratios: vec![0, 2, 2, 2, 2, 1, 1, 1],
            kv_source_layers: vec![1, 3, 5],
            index_source_layers: vec![1, 3, 5, 7],
            candidate_source_layer: Some(5),
            candidate_topk_blocks: 5,
            candidate_block_size: 4,
            index_n_heads: 8,
            index_head_dim: 64,
            index_topk: 16,
            engram_layer_ids: vec![0, 3],
            ..tiny_args() // every other argument as in `tiny`
        },
        2,
        TokenizerKind::ByteBpe,
    );
    Preset {
        name: "grouped",
        description: "dim 256, 8 heads in 4 output groups, rope on 32 of 64 head dims, window 16, index top-16 of 8 heads x 64, 8 experts top-3, ratios 0,2,2,2,2,1,1,1, written as 4 shards",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Files(4),
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: "Two ratio-2 KV sources (1, 3) each with a consumer (2, 4), a ratio-1 source (5) that writes \
candidates (5 blocks of 4) for the index-only consumer 7; window 16 wraps from p ≥ 16; the ratio-1 indexers \
select (more than 16 compressed positions) from p ≥ 16, the ratio-2 ones from p ≥ 34 (where the as-shipped \
and owner index_k hand-offs start to differ). Partial rope (32 of 64) and 4 output groups of 2 heads.",
    }
}

fn window_mtp() -> Preset {
    let g = Geometry::new(
        Config {
            dim: 64,
            n_layers: 4,
            n_heads: 2,
            q_lora_rank: 32,
            o_lora_rank: 32,
            window_size: 32,
            compress_ratios: vec![0, 2, 1, 1],
            kv_source_layers: vec![1, 2],
            index_source_layers: vec![1, 2, 3],
            candidate_source_layer: Some(2),
            candidate_topk_blocks: 6,
            candidate_block_size: 8,
            index_n_heads: 4,
            index_head_dim: 32,
            index_topk: 40,
            original_seq_len: 16,
            ..tiny_args() // every other argument as in `tiny`
        },
        2,
        TokenizerKind::ByteBpe,
    )
    .with_dspark(
        1,
        DsparkConfig {
            block_size: 2,
            noise_token_id: 3,
            target_layer_ids: vec![2, 3],
            markov_rank: 32,
            n_routed_experts: 0,
            n_activated_experts: 0,
        },
    );
    Preset {
        name: "window-mtp",
        description: "window 32 + index top-40 (one attention row spans two 64-entry blocks), one DSpark stage stored as `mtp.0.*` (main_proj, markov and confidence heads), dim 64, 4 layers",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Single,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: "An attention row holds up to 32 window + 40 compressed entries (> 64 from p ≥ 32 on the \
ratio-1 layers), the ratio-1 indexers select from p ≥ 40, the candidate filter (6 blocks of 8 = 48 > 40) \
from p ≥ 48; YaRN from p ≥ 16. The MTP stage is stored but not run by a main-model forward.",
    }
}

/// The backbone of `dspark` and `vision`: dim 64, 5 layers (ratios 0,2,2,1,1), 4 heads of 32,
/// 8 experts top-3, window 16, no candidate filter.
fn small_backbone_args(engram_layer_ids: Vec<usize>) -> Config {
    Config {
        dim: 64,
        moe_inter_dim: 32,
        n_layers: 5,
        n_heads: 4,
        n_routed_experts: 8,
        n_activated_experts: 3,
        q_lora_rank: 32,
        head_dim: 32,
        rope_head_dim: 8,
        o_groups: 2,
        o_lora_rank: 16,
        window_size: 16,
        compress_ratios: vec![0, 2, 2, 1, 1],
        kv_source_layers: vec![1, 3],
        index_source_layers: vec![1, 3],
        candidate_source_layer: None,
        candidate_topk_blocks: 0,
        candidate_block_size: 0,
        index_n_heads: 4,
        index_head_dim: 32,
        index_topk: 8,
        engram_layer_ids,
        ..tiny_args() // every other argument as in `tiny`
    }
}

/// A DSpark head shaped like the release's (three stages, block 5, the last three layers as
/// targets, fewer and sparser experts in the stages than in the backbone), at test scale.
fn dspark() -> Preset {
    let g = Geometry::new(small_backbone_args(vec![0, 2]), 2, TokenizerKind::ByteBpe).with_dspark(
        3,
        DsparkConfig {
            block_size: 5,
            noise_token_id: 300,
            target_layer_ids: vec![2, 3, 4],
            markov_rank: 16,
            n_routed_experts: 4,
            n_activated_experts: 2,
        },
    );
    Preset {
        name: "dspark",
        description: "a release-shaped DSpark head at test scale: three stages `mtp.0..2`, block 5, noise id 300, targets = the last three of 5 layers (Engram on target 2), Markov rank 16, stages route top-2 of 4 experts (backbone top-3 of 8); dim 64, 4 heads of 32 (rope 8), window 16",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Single,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: "A prefill longer than the window (17+) seeds the stages' rings wrapped; decode steps then \
write each main position into slot p mod 16 and draft 5 positions through three non-causal stages; every \
Markov step after the first reads a drafted id. The backbone reaches a ratio-2 and a ratio-1 selection \
(p >= 16 and p >= 8); the container layout drops the stages (CONTAINER.md §8).",
    }
}

/// `tiny` with settings the release does not use but `ModelArgs` and model.py accept, each of
/// which a reference could get wrong without any release-shaped model noticing.
fn off_release() -> Preset {
    let g = Geometry::new(
        Config {
            hc_mult: 2,
            swiglu_limit: 0.0,
            n_activated_experts: 1,
            compress_ratios: vec![0, 2, 0, 2, 1, 1],
            kv_source_layers: vec![1, 4],
            index_source_layers: vec![1, 4, 5],
            candidate_source_layer: Some(4),
            engram_layer_ids: Vec::new(),
            ..tiny_args() // every other argument as in `tiny`
        },
        2,
        TokenizerKind::ByteBpe,
    );
    Preset {
        name: "off-release",
        description: "`tiny` with settings the release does not use: 2 hyper-connection copies, swiglu_limit 0 (no clamp), top-1 routing (weights not renormalised), no Engram, a window-only layer inside the ratio-2 group (ratios 0,2,0,2,1,1)",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Single,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: Some(
            "a window-only layer splits its ratio-2 group, which a container's config may not do \
             (CONTAINER.md §9)",
        ),
        reach: "hc_mult 2: the Sinkhorn mixes are 2x2 and the stream two copies; swiglu_limit 0: \
the SwiGLU runs unclamped (model.py clamps only a positive limit); top-1 of 4 experts: the single \
routing weight is the unnormalised score times route_scale (MODEL.md §6.5: renormalised only for \
top-k > 1); no Engram layer: no hash, no gate, no Engram tensors in a trace; layer 2 (ratio 0) sits \
between the ratio-2 source 1 and its consumer 3, which reads layer 1's cache and top-k (most recent \
source, MODEL.md §6.4.5); layer 4 is the ratio-1 source and candidate writer (blocks of 4) for the \
index-only consumer 5, filtering from p >= 12; window 8 wraps from p >= 8.",
    }
}

/// `tiny` whose router ties one pair of experts on every layer: the six layers tie the six
/// pairs of its 4 experts, (1,2) (0,3) (2,3) (0,1) (1,3) (0,2), the higher id copying the lower.
fn tied_router() -> Preset {
    let pairs = [(1, 2), (0, 3), (2, 3), (0, 1), (1, 3), (0, 2)];
    let mut g = Geometry::new(tiny_args(), 2, TokenizerKind::ByteBpe);
    g.router_ties = pairs
        .iter()
        .enumerate()
        .map(|(layer, &(expert, copy))| RouterTie {
            layer,
            expert,
            copy,
        })
        .collect();
    Preset {
        name: "tied-router",
        description: "`tiny` with one pair of experts per layer sharing gate row and biases (every pair of the 4 experts on one of the 6 layers): exact router ties, decided by the tie rule alone",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Single,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: "Everything `tiny` reaches (every tensor but the router's is drawn as in `tiny` for the \
same seed), plus exact router ties: on each layer two experts have equal selection keys at every \
position, and wherever that pair straddles the top-2 boundary (about one position in three) the \
expert chosen is decided by the tie rule alone (MODEL.md §5.10: the lower id) and the golden's \
`margin.experts` is exactly 0; choosing the other expert changes `moe_out` from that cell on.",
    }
}

/// A vision-language geometry at test scale: `dspark`'s backbone (Engram on a window-only and
/// a ratio-2 layer) without the draft head, plus a two-block vision tower whose images cost a
/// few tokens (MODEL.md §11.1 "optional extras": an image span reaches `bias_vl`, DEAD history
/// and gate masking).
fn vision() -> Preset {
    let mut args = small_backbone_args(vec![0, 1]);
    args.image_token_id = Some(VISION_IMAGE_TOKEN);
    args.vision = Some(VisionConfig {
        n_layers: 2,
        dim: 32,
        n_heads: 2,
        inter_dim: 48,
        patch_size: 14,
        downsample_ratio: 3,
        max_n_token: 24,
        min_pixels: 0,
        max_wh_ratio: None,
        rope_theta: 10000.0,
    });
    Preset {
        name: "vision",
        description: "a vision-language model at test scale: a 2-block ViT (width 32, 2 heads of 16, patch 14, 3x3 aligner, at most 24 tokens per image) on `dspark`'s backbone (dim 64, 5 layers, Engram on 0 and 1, 8 experts top-3), image token 511",
        geometry: Geometry::new(args, 2, TokenizerKind::ByteBpe),
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::Single,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        no_release: None,
        no_container: None,
        reach: "A prompt with image markers expands each to `[START] ([IMAGE]xw [NEWLINE])xh [END]`: image rows \
route with `gate.bias_vl` (drawn wider than `gate.bias`, so routing differs), are DEAD in the Engram history \
(text n-grams after a span stop at it) with Engram gate 0 on layers 0 and 1; a ViT grid that is not a multiple \
of 3 reaches the aligner's zero padding; spans longer than the window (16) make later text attend across them \
through the compressed caches.",
    }
}

/// The image marker of the `vision` preset (`image_token_id`; the release's is 129264).
pub const VISION_IMAGE_TOKEN: u32 = 511;

fn waste_tiny() -> Preset {
    let g = Geometry::new(
        Config {
            vocab_size: 256,
            n_routed_experts: 8,
            route_scale: 2.0,
            swiglu_limit: 10.0,
            q_lora_rank: 48,
            head_dim: 32,
            rope_head_dim: 8,
            norm_eps: 1e-5,
            o_lora_rank: 16,
            window_size: 4,
            compress_ratios: vec![0, 0, 2, 2, 1, 1],
            kv_source_layers: vec![2, 4],
            index_source_layers: vec![2, 4],
            candidate_source_layer: Some(4),
            candidate_topk_blocks: 2,
            candidate_block_size: 2,
            index_n_heads: 2,
            index_head_dim: 16,
            index_topk: 4,
            compress_rope_theta: 40000.0,
            original_seq_len: 16,
            engram_layer_ids: vec![1, 3],
            engram_vocab_size: 1000,
            engram_head_dim: 64,
            engram_pad_id: 2,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            ..tiny_args() // every other argument as in `tiny`
        },
        2,
        TokenizerKind::Stub,
    );
    Preset {
        name: "waste-tiny",
        description: "geometry of WASTE's DS41 test container (CONTAINER.md §10.1); container layout is byte-identical to make_test_container.py --ds41 for the same seed",
        geometry: g,
        tokenizer: TokenizerKind::Stub,
        sharding: Sharding::Single,
        waste_compat: true,
        expert_codes: ExpertCodes::VQ3R,
        large: false,
        // MODEL.md §2.2 item 7: every K of an FP8/FP4 linear is a multiple of 32.
        no_container: None,
        no_release: Some("q_lora_rank 48 (the K of wq_b and indexer.wq_b) is not a multiple of 32, so the release's FP8 32x32 blocks cannot store it; WASTE's geometry exists only as a container"),
        reach: "CONTAINER.md §10.3: window 4 wraps from the 5th token; ratio-2 latents every other token; \
with a 12-token prompt the ratio-1 indexer discards positions (index_topk 4) and the as-shipped vs owner \
index_k difference shows from the 11th token. Not reached (by design, it is WASTE's geometry): candidate \
consumption (no index source after layer 4), ≥ 16 index heads, a non-identity token map.",
    }
}

/// `waste-tiny` with VQ4P experts (CONTAINER.md §4.2): what `make_test_container.py --ds41
/// --index-bits 6` writes, and the expert coding WASTE's converter writes at `--index-bits 6`.
fn waste_vq4p() -> Preset {
    Preset {
        name: "waste-vq4p",
        description: "`waste-tiny` with VQ4P experts (4 stages of 64-entry codebooks, 6-bit indices packed 4 in 3 bytes); container layout is byte-identical to make_test_container.py --ds41 --index-bits 6 for the same seed",
        expert_codes: ExpertCodes::VQ4P,
        reach: "As `waste-tiny` (the same geometry and draws up to the expert codebooks), with every routed expert decoded from packed 6-bit indices over four stages; the codebook headers carry VQ3R's format code, as WASTE's writers put it.",
        ..waste_tiny()
    }
}

/// Release widths (MODEL.md §2.1: dim, heads, ranks, index heads, window, index_topk) at a
/// reduced vocabulary and expert count; `wide` and `wide-deep` differ in depth only.
fn wide_args() -> Config {
    Config {
        vocab_size: 16384,
        dim: 5120,
        moe_inter_dim: 2304,
        n_layers: 4,
        n_heads: 64,
        n_routed_experts: 16,
        n_activated_experts: 6,
        swiglu_limit: 10.0,
        q_lora_rank: 1280,
        head_dim: 512,
        rope_head_dim: 64,
        o_groups: 8,
        o_lora_rank: 1024,
        window_size: 128,
        compress_ratios: vec![0, 2, 1, 1],
        kv_source_layers: vec![1, 2],
        index_source_layers: vec![1, 2, 3],
        candidate_source_layer: Some(2),
        candidate_topk_blocks: 128,
        candidate_block_size: 8,
        index_n_heads: 32,
        index_head_dim: 128,
        index_topk: 512,
        original_seq_len: 65536,
        rope_factor: 16.0,
        engram_vocab_size: 1000,
        engram_max_ngram_size: 4,
        engram_n_heads: 8,
        engram_head_dim: 256,
        ..tiny_args() // every other argument as in `tiny`
    }
}

fn wide() -> Preset {
    let g = Geometry::new(wide_args(), 2, TokenizerKind::ByteBpe);
    Preset {
        name: "wide",
        description: "real widths (dim 5120, 64x512 heads, q_lora 1280, o 8x1024, experts 2304, index 32x128, hc 4), 4 layers, 16 experts top-6, vocab 16384: for speed/memory benchmarks (~2.4 GB, written streamed)",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::ReleaseLike,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: true,
        no_release: None,
        no_container: None,
        reach: "Release widths and release window (128) / index_topk (512): ring wrap from p ≥ 128, ratio-2 \
indexer discards from p ≥ 1025, candidate filter (128 blocks of 8) from p ≥ 1024 on the ratio-1 writer \
(layer 2) consumed by layer 3. Meant for throughput and memory at real shapes, not for numerics.",
    }
}

/// Layers of `wide-deep`: ~0.48 GB each, so 56 of them (~27 GB) exceed a 25 GB machine's RAM.
const WIDE_DEEP_LAYERS: usize = 56;

fn wide_deep() -> Preset {
    let n = WIDE_DEEP_LAYERS;
    // The release's pattern (MODEL.md §2.1) scaled to n layers: two window-only layers, then
    // ratio 2, then ratio 1; a KV source every 6 layers, more index sources in the ratio-1 half,
    // the candidate source at the first ratio-1 KV source.
    let ratio1_from = 26;
    let mut compress_ratios = vec![0, 0];
    compress_ratios.extend(std::iter::repeat_n(2, ratio1_from - 2));
    compress_ratios.extend(std::iter::repeat_n(1, n - ratio1_from));
    let kv_source_layers: Vec<usize> = (2..n).step_by(6).collect();
    let mut index_source_layers = kv_source_layers.clone();
    index_source_layers.extend((ratio1_from + 4..n).step_by(4));
    index_source_layers.sort_unstable();
    index_source_layers.dedup();
    let g = Geometry::new(
        Config {
            n_layers: n,
            compress_ratios,
            kv_source_layers,
            index_source_layers,
            candidate_source_layer: Some(ratio1_from),
            engram_layer_ids: vec![1, 14],
            ..wide_args()
        },
        2,
        TokenizerKind::ByteBpe,
    );
    Preset {
        name: "wide-deep",
        description: "`wide` at 56 layers (~27 GB, written streamed): a checkpoint larger than a 25 GB machine's RAM, for decoding from the memory-mapped file",
        geometry: g,
        tokenizer: TokenizerKind::ByteBpe,
        sharding: Sharding::ReleaseLike,
        waste_compat: false,
        expert_codes: ExpertCodes::VQ3R,
        large: true,
        no_release: None,
        no_container: None,
        reach: "As `wide`, at the depth where the weights no longer fit in memory: every decode token reads \
~16 GB of weights through the page cache. Meant for memory behaviour, not for numerics.",
    }
}
