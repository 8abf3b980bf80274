//! Every logical tensor a geometry implies, by canonical release name (MODEL.md §4.2–§4.4),
//! with its release storage kind and how its values are drawn.
//!
//! "Logical" means the dequantised tensor: an FP8 weight and its `.scale` are one entry here;
//! the release writer expands it into the two stored tensors, the container writer maps it to
//! a trunk entry, an expert-bank kind or an Engram file (CONTAINER.md §8).

use crate::preset::Geometry;
use ds41_engine::config::release_primes;

/// Release storage of a logical tensor (MODEL.md §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    F32,
    Bf16,
    /// `F8_E4M3` weight + `F8_E8M0` scale per 32×32 block.
    Fp8,
    /// Routed expert: `I8` packed FP4 + `F8_E8M0` per row and 32 inputs.
    Fp4,
    /// Engram table: `F8_E4M3` rows + `F8_E8M0` per row and 32 elements.
    EngramTable,
}

/// How values are chosen (magnitudes keep activations finite and non-degenerate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Uniform in [lo, hi).
    Uniform(f64, f64),
    /// A linear map: RMS `gain / sqrt(fan_in)` with fan_in = the last dimension, so an input
    /// of unit RMS gives outputs of RMS ≈ gain.
    Linear(f64),
    /// A norm weight: uniform in [0.75, 1.25).
    Norm,
}

impl Init {
    /// Target RMS of the values for a tensor with this last dimension.
    pub fn target_rms(self, fan_in: usize) -> f64 {
        match self {
            Init::Uniform(lo, hi) => ((lo * lo + lo * hi + hi * hi) / 3.0).sqrt(),
            Init::Linear(gain) => gain / (fan_in as f64).sqrt(),
            Init::Norm => 1.0,
        }
    }
}

/// Gain of every expert matrix (shared and routed): with unit-RMS inputs from `ffn_norm`,
/// pre-activations have RMS ≈ 1.2 (E8M0 rounding and jitter), so a `swiglu_limit` of 1.0
/// (`tiny`) clamps the gate on ~21 % and the up branch on ~43 % of elements (measured by
/// `tests/reach.rs`) — both clamps fire, neither saturates.
pub const EXPERT_GAIN: f64 = 1.0;

#[derive(Debug, Clone, PartialEq)]
pub struct Logical {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Kind,
    pub init: Init,
    /// Layer index, `None` for top-level tensors (used for sharding and container grouping).
    pub layer: Option<usize>,
    /// `(copy, of)`: slice `copy` along the first axis holds the values drawn for slice `of`
    /// (what was drawn for `copy` is discarded). Empty for every tensor but the router's of a
    /// geometry with [`RouterTie`](crate::preset::RouterTie)s.
    pub copies: Vec<(usize, usize)>,
}

impl Logical {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len() - 1]
            .iter()
            .product::<usize>()
            .max(1)
    }
    pub fn cols(&self) -> usize {
        *self.shape.last().expect("non-empty shape")
    }
}

/// Apply a tensor's [`Logical::copies`] to its values (or codes, or scales) laid out with
/// `per_slice` items per first-axis slice.
pub fn copy_slices<T: Copy>(copies: &[(usize, usize)], values: &mut [T], per_slice: usize) {
    for &(copy, of) in copies {
        values.copy_within(of * per_slice..(of + 1) * per_slice, copy * per_slice);
    }
}

/// Rows of each Engram table: the sum of the layer's primes, which are the engine's
/// (`release_primes`, MODEL.md §6.6.1), so reader and writer cannot disagree.
pub fn engram_rows(g: &Geometry) -> Vec<u64> {
    release_primes(g)
        .iter()
        .map(|l| l.iter().flatten().sum())
        .collect()
}

/// All logical tensors of a geometry, in release order: embed, layers, norm, head.
pub fn logical_tensors(g: &Geometry) -> Vec<Logical> {
    use Init::*;
    use Kind::*;
    let top = |name: &str, shape: Vec<usize>, kind, init| Logical {
        name: name.into(),
        shape,
        kind,
        init,
        layer: None,
        copies: Vec::new(),
    };
    let mut v = vec![top(
        "embed.weight",
        vec![g.vocab_size, g.dim],
        Bf16,
        Uniform(-1.0, 1.0),
    )];
    let (hc, d) = (g.hc_mult, g.dim);
    let (heads_dim, index_dim) = (g.n_heads * g.head_dim, g.index_n_heads * g.index_head_dim);
    let rows = engram_rows(g);
    // Backbone blocks `layers.{l}.`, then the DSpark stages `mtp.{s}.` (layer id n_layers + s:
    // window-only blocks with the stage extras of MODEL.md §4.4).
    for l in 0..g.n_layers + g.n_mtp_layers {
        // (name below `layers.{l}.`, shape, storage, values), in release order.
        let mut layer: Vec<(String, Vec<usize>, Kind, Init)> = Vec::new();
        let mut add = |entries: Vec<(&str, Vec<usize>, Kind, Init)>| {
            layer.extend(
                entries
                    .into_iter()
                    .map(|(n, s, k, i)| (n.to_string(), s, k, i)),
            );
        };
        if let Some(i) = g.engram_layer_ids.iter().position(|&e| e == l) {
            let table = vec![rows[i] as usize, g.engram_head_dim];
            add(vec![
                (
                    "engram.embed.weight",
                    table,
                    EngramTable,
                    Uniform(-1.7, 1.7),
                ),
                (
                    "engram.wkv.weight",
                    vec![(hc + 1) * d, g.engram_in_dim()],
                    Fp8,
                    Linear(1.0),
                ),
                ("engram.q_weight", vec![hc, d], Bf16, Uniform(-1.5, 1.5)),
                ("engram.k_weight", vec![hc, d], Bf16, Uniform(-1.5, 1.5)),
            ]);
        }
        add(vec![
            ("attn_norm.weight", vec![d], Bf16, Norm),
            ("ffn_norm.weight", vec![d], Bf16, Norm),
        ]);
        for site in ["attn", "ffn"] {
            let mixes = (2 + hc) * hc;
            add(vec![
                (
                    &format!("hc_{site}_fn"),
                    vec![mixes, hc * d],
                    F32,
                    Linear(1.0),
                ),
                (
                    &format!("hc_{site}_base"),
                    vec![mixes],
                    F32,
                    Uniform(-1.0, 1.0),
                ),
                (&format!("hc_{site}_scale"), vec![3], F32, Uniform(0.5, 1.5)),
            ]);
        }
        let wo_a = vec![g.o_groups * g.o_lora_rank, heads_dim / g.o_groups];
        add(vec![
            ("attn.wq_a.weight", vec![g.q_lora_rank, d], Fp8, Linear(1.0)),
            ("attn.q_norm.weight", vec![g.q_lora_rank], Bf16, Norm),
            (
                "attn.wq_b.weight",
                vec![heads_dim, g.q_lora_rank],
                Fp8,
                Linear(1.5),
            ),
            ("attn.wkv.weight", vec![g.head_dim, d], Fp8, Linear(1.0)),
            ("attn.kv_norm.weight", vec![g.head_dim], Bf16, Norm),
            ("attn.wo_a.weight", wo_a, Fp8, Linear(1.0)),
            (
                "attn.wo_b.weight",
                vec![d, g.o_groups * g.o_lora_rank],
                Fp8,
                Linear(1.0),
            ),
            ("attn.attn_sink", vec![g.n_heads], F32, Uniform(-2.0, 2.0)),
        ]);
        if g.is_kv_source(l) {
            add(vec![(
                "attn.compressor.wkv.weight",
                vec![g.head_dim, d],
                Bf16,
                Linear(1.0),
            )]);
            if g.compress_ratios[l] > 1 {
                add(vec![(
                    "attn.compressor.wgate.weight",
                    vec![g.head_dim, d],
                    Bf16,
                    Linear(2.0),
                )]);
            }
            add(vec![(
                "attn.compressor.norm.weight",
                vec![g.head_dim],
                Bf16,
                Norm,
            )]);
        }
        if g.is_index_source(l) {
            add(vec![
                (
                    "attn.indexer.wq_b.weight",
                    vec![index_dim, g.q_lora_rank],
                    Fp8,
                    Linear(1.0),
                ),
                (
                    "attn.indexer.weights_proj.weight",
                    vec![g.index_n_heads, d],
                    Bf16,
                    Linear(1.0),
                ),
            ]);
            if g.is_kv_source(l) {
                add(vec![
                    (
                        "attn.indexer.wk.weight",
                        vec![g.index_head_dim, g.head_dim],
                        Bf16,
                        Linear(1.0),
                    ),
                    (
                        "attn.indexer.k_norm.weight",
                        vec![g.index_head_dim],
                        Bf16,
                        Norm,
                    ),
                ]);
            }
        }
        // MTP stages may route over their own expert count (`dspark_n_routed_experts`).
        let n_routed = g.moe_experts(l).0;
        add(vec![
            ("ffn.gate.weight", vec![n_routed, d], Bf16, Linear(2.0)),
            ("ffn.gate.bias", vec![n_routed], F32, Uniform(-0.5, 0.5)),
        ]);
        if g.routing_bias_vl {
            add(vec![(
                "ffn.gate.bias_vl",
                vec![n_routed],
                F32,
                Uniform(-3.0, 3.0),
            )]);
        }
        let experts = [
            ("w1", vec![g.moe_inter_dim, d]),
            ("w2", vec![d, g.moe_inter_dim]),
            ("w3", vec![g.moe_inter_dim, d]),
        ];
        for (w, shape) in &experts {
            let name = format!("ffn.shared_experts.{w}.weight");
            add(vec![(&name, shape.clone(), Fp8, Linear(EXPERT_GAIN))]);
        }
        for e in 0..n_routed {
            for (w, shape) in &experts {
                let name = format!("ffn.experts.{e}.{w}.weight");
                add(vec![(&name, shape.clone(), Fp4, Linear(EXPERT_GAIN))]);
            }
        }
        if l >= g.n_layers {
            layer.extend(dspark_extras(g, l - g.n_layers));
        }
        let prefix = if l < g.n_layers {
            format!("layers.{l}.")
        } else {
            format!("mtp.{}.", l - g.n_layers)
        };
        // Tied experts share their gate row and their biases (MODEL.md §6.5: equal selection keys).
        let copies: Vec<(usize, usize)> = g
            .router_ties
            .iter()
            .filter(|t| t.layer == l)
            .map(|t| (t.copy, t.expert))
            .collect();
        v.extend(layer.into_iter().map(|(name, shape, kind, init)| {
            let router = name.starts_with("ffn.gate.");
            Logical {
                name: format!("{prefix}{name}"),
                shape,
                kind,
                init,
                layer: Some(l),
                copies: if router { copies.clone() } else { Vec::new() },
            }
        }));
    }
    v.push(top("norm.weight", vec![d], Bf16, Norm));
    v.push(top("head.weight", vec![g.vocab_size, d], Bf16, Linear(2.0)));
    v.extend(vision_tensors(g));
    v
}

/// The vision tower, aligner and span delimiters (MODEL.md §4.4, names as vision.py's modules
/// under `vision.` / `aligner.`), all BF16; none without a vision config.
fn vision_tensors(g: &Geometry) -> Vec<Logical> {
    use Init::*;
    let Some(vc) = g.vision.as_ref().filter(|v| v.n_layers > 0) else {
        return Vec::new();
    };
    let (vd, inter, d) = (vc.dim, vc.inter_dim, g.dim);
    let patch = 3 * vc.patch_size * vc.patch_size;
    let cell = vd * vc.downsample_ratio * vc.downsample_ratio;
    // (name, shape, values) in vision.py's module order.
    let mut v: Vec<(String, Vec<usize>, Init)> = Vec::new();
    let linear = |v: &mut Vec<_>, name: String, o: usize, i: usize, bias: bool| {
        v.push((format!("{name}.weight"), vec![o, i], Linear(1.0)));
        if bias {
            v.push((format!("{name}.bias"), vec![o], Uniform(-0.1, 0.1)));
        }
    };
    linear(&mut v, "vision.patch_embed.proj".into(), vd, patch, true);
    for b in 0..vc.n_layers {
        let p = format!("vision.blocks.{b}");
        v.push((format!("{p}.norm1.weight"), vec![vd], Norm));
        linear(&mut v, format!("{p}.attn.wqkv"), 3 * vd, vd, true);
        linear(&mut v, format!("{p}.attn.wo"), vd, vd, true);
        v.push((format!("{p}.norm2.weight"), vec![vd], Norm));
        linear(&mut v, format!("{p}.mlp.w1"), 2 * inter, vd, false);
        linear(&mut v, format!("{p}.mlp.w2"), vd, inter, false);
    }
    v.push(("vision.norm.weight".into(), vec![vd], Norm));
    linear(&mut v, "aligner.w1".into(), d, cell, true);
    linear(&mut v, "aligner.w2".into(), d, d, true);
    for name in ["image_start", "image_end", "image_newline"] {
        v.push((name.into(), vec![d], Uniform(-1.0, 1.0)));
    }
    v.into_iter()
        .map(|(name, shape, init)| Logical {
            name,
            shape,
            kind: Kind::Bf16,
            init,
            layer: None,
            copies: Vec::new(),
        })
        .collect()
}

/// The tensors only DSpark stage `stage` has (MODEL.md §4.4; `DSparkBlock` of model.py): the
/// first projects the target layers' streams (`main_proj`, `main_norm`), the last carries the
/// final norm, the Markov head and the confidence head.
fn dspark_extras(g: &Geometry, stage: usize) -> Vec<(String, Vec<usize>, Kind, Init)> {
    let dspark = g
        .dspark
        .as_ref()
        .expect("a geometry with MTP stages has DSpark arguments");
    let (d, rank) = (g.dim, dspark.markov_rank);
    let mut out = Vec::new();
    let mut add =
        |n: &str, shape: Vec<usize>, kind, init| out.push((n.to_string(), shape, kind, init));
    if stage == 0 {
        let targets = dspark.target_layer_ids.len();
        add(
            "main_proj.weight",
            vec![d, d * targets],
            Kind::Fp8,
            Init::Linear(1.0),
        );
        add("main_norm.weight", vec![d], Kind::Bf16, Init::Norm);
    }
    if stage + 1 == g.n_mtp_layers {
        add("norm.weight", vec![d], Kind::Bf16, Init::Norm);
        add(
            "markov_head.embed.weight",
            vec![g.vocab_size, rank],
            Kind::Bf16,
            Init::Uniform(-1.0, 1.0),
        );
        add(
            "markov_head.head.weight",
            vec![g.vocab_size, rank],
            Kind::Bf16,
            Init::Linear(1.0),
        );
        add(
            "confidence_head.proj.weight",
            vec![1, d + rank],
            Kind::Bf16,
            Init::Linear(1.0),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    #[test]
    fn tiny_primes_match_golden_tiny() {
        // MODEL.md §11.2: engram_vocab_size 100, n ≤ 3, 2 heads → 101 103 107 109 | 113 127 131 137.
        let g = Preset::by_name("tiny").unwrap().geometry;
        assert_eq!(
            release_primes(&g),
            vec![
                vec![vec![101, 103], vec![107, 109]],
                vec![vec![113, 127], vec![131, 137]]
            ]
        );
        assert_eq!(engram_rows(&g), vec![420, 508]);
    }

    #[test]
    fn waste_tiny_primes_match_container() {
        // CONTAINER.md §10.2: 1009 1013 | 1019 1021 (4062), 1031 1033 | 1039 1049 (4152).
        let g = Preset::by_name("waste-tiny").unwrap().geometry;
        assert_eq!(engram_rows(&g), vec![4062, 4152]);
    }

    #[test]
    fn release_primes_and_rows() {
        // MODEL.md §6.6.1: release rows 384006168 and 384016682 from engram_vocab_size 16e6.
        let mut g = Preset::by_name("tiny").unwrap().geometry;
        g.engram_vocab_size = 16_000_000;
        g.engram_max_ngram_size = 4;
        g.engram_n_heads = 8;
        g.engram_layer_ids = vec![1, 14];
        assert_eq!(engram_rows(&g), vec![384_006_168, 384_016_682]);
        assert_eq!(release_primes(&g)[0][0][0], 16_000_057);
    }

    #[test]
    fn tiny_tensor_count_follows_roles() {
        // 6 layers × (30 common incl. bias_vl... counted as logical tensors) — check role extras.
        let g = Preset::by_name("tiny").unwrap().geometry;
        let t = logical_tensors(&g);
        let has = |n: &str| t.iter().any(|x| x.name == n);
        assert!(has("layers.1.attn.compressor.wgate.weight"));
        assert!(!has("layers.3.attn.compressor.wgate.weight"));
        assert!(has("layers.3.attn.indexer.wk.weight"));
        assert!(has("layers.5.attn.indexer.wq_b.weight"));
        assert!(!has("layers.5.attn.indexer.wk.weight"));
        assert!(!has("layers.2.attn.indexer.wq_b.weight"));
        assert!(has("layers.0.engram.embed.weight") && has("layers.1.engram.wkv.weight"));
        assert!(!has("layers.2.engram.wkv.weight"));
    }
}
