//! The WASTE v0 container layout (CONTAINER.md §1–§10): `manifest.json`, `trunk.bin`
//! (F32/Q8G/Q4G), `experts-L{n}.bin` (4 KiB VQ3R records with the 48-byte WEXP header and a
//! CRC-32), `codebooks.bin` (WCBK), `engram-L{n}.bin`, `engram.json`, `engram-tokmap.bin` and
//! `specials.json` (escaped non-ASCII).
//!
//! One writer serves two draw policies ([`Draws`]): [`WasteDraws`] reproduces WASTE's
//! `make_test_container.py --ds41` (one `random.Random(seed)` stream in file order, §10.2), and
//! [`NativeDraws`] draws each object from its own SplitMix64 stream with magnitudes chosen for
//! non-degenerate activations. The file order and structure are the same for both.

use crate::draw::{self, Q4_CODE_RMS, Q8_CODE_RMS, VQ_CODE_RMS};
use crate::inventory::{copy_slices, logical_tensors, Init, Logical, EXPERT_GAIN};
use crate::preset::{decimal, Geometry, Preset};
use crate::rng::SplitMix64;
use crate::tokenizer::{Vocab, SPECIALS};
use crate::SynthError;
use ds41_engine::checkpoint::names::{release_to_container, ContainerName};
use ds41_engine::config::release_primes;
use ds41_engine::dsml::json_py::{self, DumpOptions};
use ds41_engine::tokenizer::python_random::PythonRandom;
use half::f16;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

pub const WEXP_MAGIC: u32 = 0x5058_4557;
pub const WCBK_MAGIC: u32 = 0x4B42_4357;
pub const FMT_VQ3R: u8 = 4;
pub const FMT_VQ4P: u8 = 8;
/// VQ3R's stages and codebook entries ([`ExpertCodes::VQ3R`]).
pub const STAGES: usize = 3;
pub const VEC_DIM: usize = 8;
pub const ENTRIES: usize = 256;
pub const INDEX_BLOCK: usize = 64;
pub const GROUP: usize = 128;
pub const ENGRAM_GROUP: usize = 32;
pub const ENGRAM_BITS: usize = 4;

/// How the routed experts are coded (CONTAINER.md §4.2): VQ3R (3 stages of 256 entries, one
/// index byte per stage) or VQ4P (4 stages of 64 entries, the four 6-bit indices packed into
/// 3 bytes), as `make_test_container.py --index-bits 8 | 6` writes them; other byte-per-stage
/// counts as WASTE's `convert.py --stages N --entries E` writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertCodes {
    pub stages: usize,
    pub entries: usize,
    pub packed: bool,
}

impl ExpertCodes {
    pub const VQ3R: Self = Self {
        stages: STAGES,
        entries: ENTRIES,
        packed: false,
    };
    pub const VQ4P: Self = Self {
        stages: 4,
        entries: 64,
        packed: true,
    };
    /// The WEXP header's `fmt`.
    fn record_fmt(self) -> u8 {
        if self.packed {
            FMT_VQ4P
        } else {
            FMT_VQ3R
        }
    }
    /// Index bytes per (row, vector).
    fn bytes_per_vector(self) -> usize {
        if self.packed {
            3
        } else {
            self.stages
        }
    }
    /// One (row, vector)'s indices as stored: a byte per stage, or VQ4P's little-endian
    /// packing (`s0 | s1 << 6 | s2 << 12 | s3 << 18` in 3 bytes, CONTAINER.md §4.2).
    fn place(self, indices: impl Iterator<Item = u8>, out: &mut [u8]) {
        if self.packed {
            let word = indices
                .enumerate()
                .fold(0u32, |w, (s, i)| w | u32::from(i) << (6 * s));
            out.copy_from_slice(&word.to_le_bytes()[..3]);
        } else {
            for (o, i) in out.iter_mut().zip(indices) {
                *o = i;
            }
        }
    }
    /// The manifest's `expert_quant` (key order and values as WASTE's writers put them; a
    /// byte-per-stage coding with two stages is named VQ2R, as convert.py names it).
    fn manifest(self) -> Value {
        let name = if self.stages == 2 { "VQ2R" } else { "VQ3R" };
        let mut q = json!({"fmt": name, "stages": self.stages, "vec_dim": VEC_DIM,
                           "entries": self.entries, "index_block": INDEX_BLOCK,
                           "bits_per_weight": self.stages});
        if self.packed {
            q["fmt"] = json!("VQ4P");
            q["bits_per_weight"] = json!((self.stages * 6) as f64 / VEC_DIM as f64);
            q["index_bits"] = json!(6);
        }
        q
    }
}

/// Source of every drawn number in a container, called in file order.
pub trait Draws {
    /// F32 tensor values.
    fn f32s(&mut self, name: &str, n: usize, init: Init, fan_in: usize) -> Vec<f32>;
    /// Q8G (`bits` 8) or Q4G (`bits` 4): ints for `rows × padded` columns and f16 scale bits
    /// for `rows × groups`.
    fn quantised(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        bits: u8,
        rms: f64,
    ) -> (Vec<i8>, Vec<u16>);
    /// One codebook: `entries × VEC_DIM` f16 bits.
    fn codebook(&mut self, id: usize, entries: usize) -> Vec<u16>;
    /// Indices of one kind of one expert, `[stage][m · (n / 8)]`, vectors row-major.
    fn expert_indices(
        &mut self,
        layer: usize,
        expert: usize,
        kind: usize,
        m: usize,
        n: usize,
        codes: ExpertCodes,
    ) -> Vec<Vec<u8>>;
    /// Row scales (f16 bits) of one kind of one expert.
    fn expert_scales(
        &mut self,
        layer: usize,
        expert: usize,
        kind: usize,
        m: usize,
        rms: f64,
    ) -> Vec<u16>;
    /// Hash multipliers of one Engram layer.
    fn multipliers(&mut self, layer: usize, n: usize, compressed_vocab: usize) -> Vec<u64>;
    /// One whole Engram table: per row `dim/2` packed nibble bytes then `dim/32` f16 scales.
    fn engram_table(&mut self, layer: usize, rows: usize, dim: usize) -> Vec<u8>;
}

/// WASTE's generator (CONTAINER.md §10.2): one CPython `random.Random(seed)` stream.
pub struct WasteDraws {
    rng: PythonRandom,
}

impl WasteDraws {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: PythonRandom::new(seed),
        }
    }
    fn f16s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<u16> {
        (0..n)
            .map(|_| draw::f16_bits(self.rng.uniform(lo, hi)))
            .collect()
    }
}

impl Draws for WasteDraws {
    fn f32s(&mut self, _: &str, n: usize, _: Init, _: usize) -> Vec<f32> {
        (0..n).map(|_| self.rng.uniform(-0.5, 0.5) as f32).collect()
    }
    fn quantised(
        &mut self,
        _: &str,
        rows: usize,
        cols: usize,
        bits: u8,
        _: f64,
    ) -> (Vec<i8>, Vec<u16>) {
        let groups = cols.div_ceil(GROUP);
        let (lo, hi) = if bits == 8 { (-127, 128) } else { (-8, 8) };
        let ints = (0..rows * groups * GROUP)
            .map(|_| self.rng.randrange(lo, hi) as i8)
            .collect();
        (ints, self.f16s(rows * groups, 0.002, 0.02))
    }
    fn codebook(&mut self, _: usize, entries: usize) -> Vec<u16> {
        self.f16s(entries * VEC_DIM, -0.3, 0.3)
    }
    fn expert_indices(
        &mut self,
        _: usize,
        _: usize,
        _: usize,
        m: usize,
        n: usize,
        codes: ExpertCodes,
    ) -> Vec<Vec<u8>> {
        (0..codes.stages)
            .map(|_| {
                (0..m * (n / VEC_DIM))
                    .map(|_| self.rng.randbelow(codes.entries as u32) as u8)
                    .collect()
            })
            .collect()
    }
    fn expert_scales(&mut self, _: usize, _: usize, _: usize, m: usize, _: f64) -> Vec<u16> {
        self.f16s(m, 0.01, 0.05)
    }
    fn multipliers(&mut self, _: usize, n: usize, _: usize) -> Vec<u64> {
        (0..n)
            .map(|_| u64::from(self.rng.randbelow(1 << 20)) * 2 + 1)
            .collect()
    }
    fn engram_table(&mut self, _: usize, rows: usize, dim: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows * row_bytes(dim));
        for _ in 0..rows {
            out.extend((0..dim * ENGRAM_BITS / 8).map(|_| self.rng.randbelow(256) as u8));
            for s in self.f16s(dim / ENGRAM_GROUP, 0.01, 0.05) {
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        out
    }
}

/// Native draws: one SplitMix64 stream per object (see `rng` and `draw`).
pub struct NativeDraws {
    seed: u64,
}

impl NativeDraws {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }
    fn rng(&self, key: &str) -> SplitMix64 {
        SplitMix64::for_object(self.seed, &format!("container:{key}"))
    }
}

impl Draws for NativeDraws {
    fn f32s(&mut self, name: &str, n: usize, init: Init, fan_in: usize) -> Vec<f32> {
        let mut r = self.rng(name);
        (0..n)
            .map(|_| draw::plain(&mut r, init, fan_in) as f32)
            .collect()
    }
    fn quantised(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        bits: u8,
        rms: f64,
    ) -> (Vec<i8>, Vec<u16>) {
        let groups = cols.div_ceil(GROUP);
        let padded = groups * GROUP;
        let mut r = self.rng(name);
        let (lo, hi, code_rms) = if bits == 8 {
            (-127, 127, Q8_CODE_RMS)
        } else {
            (-8, 7, Q4_CODE_RMS)
        };
        let mut ints = vec![0i8; rows * padded];
        for row in 0..rows {
            for c in 0..cols {
                ints[row * padded + c] = r.range_i64(lo, hi) as i8;
            }
        }
        let mut s = self.rng(&format!("{name}#scales"));
        let scales = (0..rows * groups)
            .map(|_| draw::f16_scale(&mut s, rms, code_rms).0)
            .collect();
        (ints, scales)
    }
    fn codebook(&mut self, id: usize, entries: usize) -> Vec<u16> {
        let mut r = self.rng(&format!("codebook:{id}"));
        (0..entries * VEC_DIM)
            .map(|_| draw::vq_entry(&mut r).0)
            .collect()
    }
    fn expert_indices(
        &mut self,
        layer: usize,
        e: usize,
        kind: usize,
        m: usize,
        n: usize,
        codes: ExpertCodes,
    ) -> Vec<Vec<u8>> {
        let mut r = self.rng(&format!("experts-L{layer}.{e}.{kind}"));
        (0..codes.stages)
            .map(|_| {
                (0..m * (n / VEC_DIM))
                    .map(|_| r.below(codes.entries as u64) as u8)
                    .collect()
            })
            .collect()
    }
    fn expert_scales(
        &mut self,
        layer: usize,
        e: usize,
        kind: usize,
        m: usize,
        rms: f64,
    ) -> Vec<u16> {
        let mut r = self.rng(&format!("experts-L{layer}.{e}.{kind}#scales"));
        (0..m)
            .map(|_| draw::f16_scale(&mut r, rms, VQ_CODE_RMS).0)
            .collect()
    }
    fn multipliers(&mut self, layer: usize, n: usize, compressed_vocab: usize) -> Vec<u64> {
        // MODEL.md §6.6.1: M = 2·draw + 1 with draw < ((2^63 − 1) div cvocab) div 2.
        let bound = (i64::MAX as u64 / compressed_vocab.max(1) as u64) / 2;
        let mut r = self.rng(&format!("engram-L{layer}#multipliers"));
        (0..n).map(|_| 2 * r.below(bound) + 1).collect()
    }
    fn engram_table(&mut self, layer: usize, rows: usize, dim: usize) -> Vec<u8> {
        let mut r = self.rng(&format!("engram-L{layer}"));
        let mut out = Vec::with_capacity(rows * row_bytes(dim));
        for _ in 0..rows {
            out.extend((0..dim / 2).map(|_| r.below(256) as u8));
            for _ in 0..dim / ENGRAM_GROUP {
                out.extend_from_slice(&draw::f16_scale(&mut r, 1.0, Q4_CODE_RMS).0.to_le_bytes());
            }
        }
        out
    }
}

/// A file written front to back, counting its bytes (offsets for the manifest).
struct Sink {
    path: std::path::PathBuf,
    w: std::io::BufWriter<std::fs::File>,
    len: usize,
}

impl Sink {
    fn create(path: &Path) -> Result<Sink, SynthError> {
        let f = std::fs::File::create(path).map_err(|e| SynthError::io(path, e))?;
        Ok(Sink {
            path: path.to_path_buf(),
            w: std::io::BufWriter::with_capacity(1 << 20, f),
            len: 0,
        })
    }
    fn put(&mut self, b: &[u8]) -> Result<(), SynthError> {
        use std::io::Write;
        self.w
            .write_all(b)
            .map_err(|e| SynthError::io(&self.path, e))?;
        self.len += b.len();
        Ok(())
    }
    fn len(&self) -> usize {
        self.len
    }
    fn finish(mut self) -> Result<(), SynthError> {
        use std::io::Write;
        self.w.flush().map_err(|e| SynthError::io(&self.path, e))
    }
}

pub fn row_bytes(dim: usize) -> usize {
    dim * ENGRAM_BITS / 8 + (dim / ENGRAM_GROUP) * 2
}

/// Trunk storage format (CONTAINER.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fmt {
    F32 = 0,
    Q8G = 2,
    Q4G = 3,
}

/// One trunk tensor in file order: container name, canonical release name, shape, format, init.
#[derive(Debug, Clone)]
pub struct TrunkTensor {
    pub name: String,
    pub release: String,
    pub shape: Vec<usize>,
    pub fmt: Fmt,
    pub init: Init,
    /// The logical tensor's copied slices ([`Logical::copies`]).
    pub copies: Vec<(usize, usize)>,
}

/// The trunk in the order of CONTAINER.md §10.2 item 1 (names per §8). Shapes and value
/// recipes are the logical tensors' ([`logical_tensors`]); this function only names, orders
/// and formats them.
pub fn trunk_tensors(g: &Geometry) -> Vec<TrunkTensor> {
    let logical: BTreeMap<String, Logical> = logical_tensors(g)
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    trunk_names(g)
        .into_iter()
        .map(|(name, release, fmt)| {
            let t = logical
                .get(&release)
                .unwrap_or_else(|| panic!("trunk tensor {name}: no logical tensor {release}"));
            TrunkTensor {
                name,
                release,
                shape: t.shape.clone(),
                fmt,
                init: t.init,
                copies: t.copies.clone(),
            }
        })
        .collect()
}

/// (container name, release name, format) of every trunk tensor, in trunk order.
fn trunk_names(g: &Geometry) -> Vec<(String, String, Fmt)> {
    use Fmt::*;
    let top = |c: &str, r: &str, fmt| (c.to_string(), r.to_string(), fmt);
    let mut v = vec![top("model.embed_tokens.weight", "embed.weight", Q8G)];
    for l in 0..g.n_layers {
        // Names below `model.layers.{l}.` (container) and `layers.{l}.` (release).
        let mut add = |entries: &[(&str, &str, Fmt)]| {
            v.extend(entries.iter().map(|&(c, r, fmt)| {
                (
                    format!("model.layers.{l}.{c}"),
                    format!("layers.{l}.{r}"),
                    fmt,
                )
            }));
        };
        add(&[
            ("input_layernorm.weight", "attn_norm.weight", F32),
            ("post_attention_layernorm.weight", "ffn_norm.weight", F32),
        ]);
        for site in ["attn", "ffn"] {
            let (f, b, s) = (
                format!("hc_{site}_fn"),
                format!("hc_{site}_base"),
                format!("hc_{site}_scale"),
            );
            add(&[(&f, &f, Q8G), (&b, &b, F32), (&s, &s, F32)]);
        }
        add(&[
            ("self_attn.q_a_proj.weight", "attn.wq_a.weight", Q4G),
            ("self_attn.q_a_layernorm.weight", "attn.q_norm.weight", F32),
            ("self_attn.q_b_proj.weight", "attn.wq_b.weight", Q4G),
            ("self_attn.kv_proj.weight", "attn.wkv.weight", Q4G),
            ("self_attn.kv_layernorm.weight", "attn.kv_norm.weight", F32),
            ("self_attn.o_a_proj.weight", "attn.wo_a.weight", Q4G),
            ("self_attn.o_b_proj.weight", "attn.wo_b.weight", Q4G),
            ("self_attn.attn_sink", "attn.attn_sink", F32),
        ]);
        if g.is_kv_source(l) {
            add(&[
                (
                    "self_attn.compress.kv_proj.weight",
                    "attn.compressor.wkv.weight",
                    Q4G,
                ),
                (
                    "self_attn.compress.norm.weight",
                    "attn.compressor.norm.weight",
                    F32,
                ),
            ]);
            if g.compress_ratios[l] > 1 {
                add(&[(
                    "self_attn.compress.gate_proj.weight",
                    "attn.compressor.wgate.weight",
                    Q4G,
                )]);
            }
        }
        if g.is_index_source(l) {
            add(&[
                (
                    "self_attn.indexer.q_b_proj.weight",
                    "attn.indexer.wq_b.weight",
                    Q4G,
                ),
                (
                    "self_attn.indexer.weights_proj.weight",
                    "attn.indexer.weights_proj.weight",
                    Q4G,
                ),
            ]);
            if g.is_kv_source(l) {
                add(&[
                    (
                        "self_attn.indexer.k_proj.weight",
                        "attn.indexer.wk.weight",
                        Q4G,
                    ),
                    (
                        "self_attn.indexer.k_layernorm.weight",
                        "attn.indexer.k_norm.weight",
                        F32,
                    ),
                ]);
            }
        }
        if g.engram_index(l).is_some() {
            add(&[
                ("engram.wkv.weight", "engram.wkv.weight", Q4G),
                ("engram.q_weight", "engram.q_weight", F32),
                ("engram.k_weight", "engram.k_weight", F32),
            ]);
        }
        add(&[
            ("block_sparse_moe.gate.weight", "ffn.gate.weight", Q4G),
            (
                "block_sparse_moe.gate.e_score_correction_bias",
                "ffn.gate.bias",
                F32,
            ),
        ]);
        if g.routing_bias_vl {
            add(&[(
                "block_sparse_moe.gate.e_score_correction_bias_vl",
                "ffn.gate.bias_vl",
                F32,
            )]);
        }
        add(&[
            (
                "block_sparse_moe.shared_experts.gate_proj.weight",
                "ffn.shared_experts.w1.weight",
                Q4G,
            ),
            (
                "block_sparse_moe.shared_experts.up_proj.weight",
                "ffn.shared_experts.w3.weight",
                Q4G,
            ),
            (
                "block_sparse_moe.shared_experts.down_proj.weight",
                "ffn.shared_experts.w2.weight",
                Q4G,
            ),
        ]);
    }
    v.push(top("model.norm.weight", "norm.weight", F32));
    v.push(top("lm_head.weight", "head.weight", Q8G));
    // The vision tower, aligner and span delimiters (CONTAINER.md §8: `vision_tower.*`,
    // `mm_projector.*`, `model.image_*`): matrices Q8G, vectors F32.
    for t in logical_tensors(g).iter().filter(|t| is_vision(&t.name)) {
        let ContainerName::Trunk(container) = release_to_container(&t.name) else {
            unreachable!("vision tensors are trunk tensors");
        };
        let fmt = if t.shape.len() == 2 { Q8G } else { F32 };
        v.push((container, t.name.clone(), fmt));
    }
    v
}

/// A tensor of the vision side (tower, aligner, span delimiters).
fn is_vision(release: &str) -> bool {
    release.starts_with("vision.")
        || release.starts_with("aligner.")
        || release.starts_with("image_")
}

/// `vision.json` (CONTAINER.md §7): the tower config under the HF `vision_config` keys plus
/// `"tower": "ds41"`, the language model's width and the image token.
fn vision_json(g: &Geometry) -> Option<Value> {
    let v = g.vision.as_ref().filter(|v| v.n_layers > 0)?;
    let mut json = Map::new();
    json.insert("tower".into(), json!("ds41"));
    json.extend(crate::release::hf_vision_keys(v));
    json.insert("out_hidden_size".into(), json!(g.dim));
    json.insert(
        "media_placeholder_token_id".into(),
        json!(g.image_token_id?),
    );
    Some(Value::Object(json))
}

/// The flat manifest config (CONTAINER.md §10.1, key order of WASTE's generator).
pub fn flat_config(g: &Geometry, compressed_vocab: usize, rows: &[u64]) -> Value {
    json!({
        "model_type": "deepseek_v41_text",
        "architectures": ["DeepseekV41ForCausalLM"],
        "hidden_size": g.dim,
        "num_hidden_layers": g.n_layers,
        "first_k_dense_replace": 0,
        "moe_intermediate_size": g.moe_inter_dim,
        "num_experts": g.n_routed_experts,
        "num_experts_per_token": g.n_activated_experts,
        "num_shared_experts": 1,
        "moe_renormalize": true,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": decimal(g.route_scale),
        "num_attention_heads": g.n_heads,
        "qk_rope_head_dim": g.rope_head_dim,
        "q_lora_rank": g.q_lora_rank,
        "rms_norm_eps": decimal(g.norm_eps),
        "vocab_size": g.vocab_size,
        "tie_word_embeddings": false,
        "bos_token_id": g.bos_token_id,
        "eos_token_id": g.eos_token_id,
        "head_dim": g.head_dim,
        "o_groups": g.o_groups,
        "o_lora_rank": g.o_lora_rank,
        "sliding_window": g.window_size,
        "scoring_func": "sqrtsoftplus",
        "routing_bias_vl": g.routing_bias_vl,
        "swiglu_limit": decimal(g.swiglu_limit),
        "hidden_act": "silu",
        "hc_mult": g.hc_mult,
        "hc_sinkhorn_iters": g.hc_sinkhorn_iters,
        "hc_eps": decimal(g.hc_eps),
        // The container drops the MTP stages (CONTAINER.md §8), and with them their ratios.
        "compress_ratios": g.compress_ratios[..g.n_layers],
        "kv_source_layer_ids": g.kv_source_layers,
        "index_source_layer_ids": g.index_source_layers,
        "candidate_source_layer_id": g.candidate_source_layer.map(|c| c as i64).unwrap_or(-1),
        "candidate_topk_blocks": g.candidate_topk_blocks,
        "candidate_block_size": g.candidate_block_size,
        "compress_rope_theta": g.compress_rope_theta,
        "index_n_heads": g.index_n_heads,
        "index_head_dim": g.index_head_dim,
        "index_topk": g.index_topk,
        "index_kpool": 1,
        "engram_layer_ids": g.engram_layer_ids,
        "engram_max_ngram_size": g.engram_max_ngram_size,
        "engram_n_heads": g.engram_n_heads,
        "engram_head_dim": g.engram_head_dim,
        "engram_vocab_size": g.engram_vocab_size,
        "engram_pad_token_id": g.engram_pad_id,
        "rope_theta": g.rope_theta,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": g.rope_factor,
            "beta_fast": g.beta_fast as i64,
            "beta_slow": g.beta_slow as i64,
            "original_max_position_embeddings": g.original_seq_len
        },
        "engram_num_embeddings": rows,
        "engram_compressed_vocab_size": compressed_vocab
    })
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Q8G (`bits` 8: two's-complement bytes) or Q4G (`bits` 4: nibble = v + 8, low nibble
/// first) codes of whole padded rows (CONTAINER.md §3).
pub fn pack_grouped(ints: &[i8], bits: u8) -> Vec<u8> {
    if bits == 8 {
        ints.iter().map(|&x| x as u8).collect()
    } else {
        ints.chunks(2)
            .map(|p| {
                let hi = p.get(1).map_or(8, |&x| (x + 8) as u8);
                ((p[0] + 8) as u8) | (hi << 4)
            })
            .collect()
    }
}

/// One `codebooks.bin` record (CONTAINER.md §5): the 16-byte WCBK header, then
/// `entries.len() / VEC_DIM` entries of `VEC_DIM` f16 values. Its `fmt` is VQ3R's whatever
/// the experts' format, as WASTE's writers (convert.py, make_test_container.py) put it.
pub fn codebook_record(id: usize, entries: &[u16]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    put_u32(&mut out, 0, WCBK_MAGIC);
    put_u16(&mut out, 4, id as u16);
    out[6] = FMT_VQ3R;
    out[7] = VEC_DIM as u8;
    put_u32(&mut out, 8, (entries.len() / VEC_DIM) as u32);
    out.extend(entries.iter().flat_map(|x| x.to_le_bytes()));
    out
}

/// One expert record of `rec` bytes (CONTAINER.md §4): the WEXP header with its CRC, the
/// three kinds' index blocks (`idx[kind][stage][row · (N/8) + vector]`, placed into the
/// `[ceil(M/64)][N/8][64][bytes per vector]` blocking), their f16 row scales, zero padding.
/// `kinds` are the (M, N) of gate, up, down.
#[allow(clippy::needless_range_loop)] // index loops mirror the blocking formula
#[allow(clippy::too_many_arguments)]
pub fn expert_record(
    layer: usize,
    expert: usize,
    codebook_base: usize,
    rec: usize,
    kinds: [(usize, usize); 3],
    codes: ExpertCodes,
    idx: &[Vec<Vec<u8>>],
    scales: &[Vec<u16>],
) -> Vec<u8> {
    let mut r = vec![0u8; rec];
    let mut off = 48;
    let mut offs = [0usize; 3];
    for k in 0..3 {
        offs[k] = off;
        let (m, n) = kinds[k];
        let nv = n / VEC_DIM;
        let bpv = codes.bytes_per_vector();
        for row in 0..m {
            for v in 0..nv {
                let at =
                    off + (((row / INDEX_BLOCK) * nv + v) * INDEX_BLOCK + row % INDEX_BLOCK) * bpv;
                let stages = idx[k].iter().map(|stage| stage[row * nv + v]);
                codes.place(stages, &mut r[at..at + bpv]);
            }
        }
        off += index_block_bytes(m, n, codes);
    }
    let chan = off;
    for sc in scales {
        for s in sc {
            r[off..off + 2].copy_from_slice(&s.to_le_bytes());
            off += 2;
        }
    }
    put_u32(&mut r, 0, WEXP_MAGIC);
    put_u16(&mut r, 4, layer as u16);
    put_u16(&mut r, 6, expert as u16);
    r[8] = codes.record_fmt();
    put_u16(&mut r, 10, codebook_base as u16);
    put_u32(&mut r, 16, (rec / 4096) as u32);
    put_u32(&mut r, 20, offs[0] as u32);
    put_u32(&mut r, 24, offs[1] as u32);
    put_u32(&mut r, 28, offs[2] as u32);
    put_u32(&mut r, 32, chan as u32);
    let crc = crc32fast::hash(&r[48..off]);
    put_u32(&mut r, 36, crc);
    r
}

/// Bytes of one kind's index block: `[ceil(M/64)][N/8][64][bytes per vector]`.
fn index_block_bytes(m: usize, n: usize, codes: ExpertCodes) -> usize {
    m.div_ceil(INDEX_BLOCK) * (n / VEC_DIM) * INDEX_BLOCK * codes.bytes_per_vector()
}

/// Size of one expert record (header + indices + scales, padded to 4 KiB).
pub fn record_size(g: &Geometry, codes: ExpertCodes) -> usize {
    record_bytes(g.moe_inter_dim, g.dim, codes)
}

/// [`record_size`] for experts of `moe_inter_dim` i and `dim` d.
pub fn record_bytes(i: usize, d: usize, codes: ExpertCodes) -> usize {
    let payload =
        48 + 2 * index_block_bytes(i, d, codes) + index_block_bytes(d, i, codes) + 2 * (2 * i + d);
    payload.div_ceil(4096) * 4096
}

/// Expected dequantised values, by canonical release name (filled only when asked).
pub type Values = BTreeMap<String, Vec<f32>>;

fn f16v(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Write the container into `dir`. With `values`, also record every tensor's exact values
/// (trunk, experts by `layers.L.ffn.experts.E.wK.weight`, Engram tables by
/// `layers.L.engram.embed.weight`).
pub fn write(
    p: &Preset,
    seed: u64,
    dir: &Path,
    mut values: Option<&mut Values>,
) -> Result<Vec<String>, SynthError> {
    let g = &p.geometry;
    let mut draws: Box<dyn Draws> = if p.waste_compat {
        Box::new(WasteDraws::new(seed))
    } else {
        Box::new(NativeDraws::new(seed))
    };
    let vocab = Vocab::build(p.tokenizer, g.vocab_size);
    let map = vocab.compressed_token_map();
    let compressed = map.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut files = Vec::new();
    let write_file = |name: &str, bytes: &[u8], files: &mut Vec<String>| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| SynthError::io(&path, e))?;
        files.push(name.to_string());
        Ok::<(), SynthError>(())
    };

    // 1. Trunk.
    let mut trunk = Sink::create(&dir.join("trunk.bin"))?;
    files.push("trunk.bin".to_string());
    let mut entries = Vec::new();
    for t in trunk_tensors(g) {
        let cols = *t.shape.last().expect("shape");
        let rows: usize = t.shape[..t.shape.len() - 1]
            .iter()
            .product::<usize>()
            .max(1);
        let off = trunk.len();
        let mut e = Map::new();
        e.insert("name".into(), json!(t.name));
        e.insert("fmt".into(), json!(t.fmt as u8));
        e.insert("off".into(), json!(off));
        e.insert("shape".into(), json!(t.shape));
        match t.fmt {
            Fmt::F32 => {
                let mut v = draws.f32s(&t.name, rows * cols, t.init, cols);
                copy_slices(&t.copies, &mut v, rows * cols / t.shape[0]);
                for x in &v {
                    trunk.put(&x.to_le_bytes())?;
                }
                if let Some(vals) = values.as_deref_mut() {
                    vals.insert(t.release.clone(), v);
                }
            }
            Fmt::Q8G | Fmt::Q4G => {
                let bits = if t.fmt == Fmt::Q8G { 8 } else { 4 };
                let (mut ints, mut scales) =
                    draws.quantised(&t.name, rows, cols, bits, t.init.target_rms(cols));
                let groups = cols.div_ceil(GROUP);
                let padded = groups * GROUP;
                let slice_rows = rows / t.shape[0];
                copy_slices(&t.copies, &mut ints, slice_rows * padded);
                copy_slices(&t.copies, &mut scales, slice_rows * groups);
                trunk.put(&pack_grouped(&ints, bits))?;
                let scale_off = trunk.len();
                let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
                trunk.put(&scale_bytes)?;
                e.insert("group".into(), json!(GROUP));
                e.insert("scale_off".into(), json!(scale_off));
                if let Some(vals) = values.as_deref_mut() {
                    let mut v = Vec::with_capacity(rows * cols);
                    for r in 0..rows {
                        for c in 0..cols {
                            v.push(
                                f32::from(ints[r * padded + c])
                                    * f16v(scales[r * groups + c / GROUP]),
                            );
                        }
                    }
                    vals.insert(t.release.clone(), v);
                }
            }
        }
        e.insert("bytes".into(), json!(trunk.len() - off));
        entries.push(Value::Object(e));
    }

    // 2. Codebooks and expert banks, layer by layer.
    let mut codebooks = Vec::new();
    let mut layers = Map::new();
    let codes = p.expert_codes;
    let rec = record_size(g, codes);
    let (i_dim, d) = (g.moe_inter_dim, g.dim);
    let kinds = [(i_dim, d), (i_dim, d), (d, i_dim)]; // gate (w1), up (w3), down (w2)
    let kind_names = ["w1", "w3", "w2"];
    for l in 0..g.n_layers {
        let base = l * 3 * codes.stages;
        let mut books = Vec::new();
        for k in 0..3 * codes.stages {
            let id = base + k;
            let cb = draws.codebook(id, codes.entries);
            codebooks.extend_from_slice(&codebook_record(id, &cb));
            books.push(cb);
        }
        let file = format!("experts-L{l}.bin");
        let mut bank = Sink::create(&dir.join(&file))?;
        files.push(file.clone());
        for e in 0..g.n_routed_experts {
            let idx: Vec<Vec<Vec<u8>>> = (0..3)
                .map(|k| draws.expert_indices(l, e, k, kinds[k].0, kinds[k].1, codes))
                .collect();
            let scales: Vec<Vec<u16>> = (0..3)
                .map(|k| {
                    draws.expert_scales(
                        l,
                        e,
                        k,
                        kinds[k].0,
                        Init::Linear(EXPERT_GAIN).target_rms(kinds[k].1),
                    )
                })
                .collect();
            let r = expert_record(l, e, base, rec, kinds, codes, &idx, &scales);
            if let Some(vals) = values.as_deref_mut() {
                for k in 0..3 {
                    let (m, n) = kinds[k];
                    let nv = n / VEC_DIM;
                    let mut v = Vec::with_capacity(m * n);
                    for row in 0..m {
                        let sc = f16v(scales[k][row]);
                        for vi in 0..nv {
                            for t in 0..VEC_DIM {
                                let sum: f32 = (0..codes.stages)
                                    .map(|s| {
                                        f16v(
                                            books[k * codes.stages + s][usize::from(
                                                idx[k][s][row * nv + vi],
                                            ) * VEC_DIM
                                                + t],
                                        )
                                    })
                                    .sum();
                                v.push(sc * sum);
                            }
                        }
                    }
                    vals.insert(
                        format!("layers.{l}.ffn.experts.{e}.{}.weight", kind_names[k]),
                        v,
                    );
                }
            }
            bank.put(&r)?;
        }
        let bank_bytes = bank.len();
        bank.finish()?;
        layers.insert(
            l.to_string(),
            json!({"file": file, "experts": g.n_routed_experts, "bytes": bank_bytes, "codebook_base": base}),
        );
    }

    // 3. Engram: constants (multipliers drawn per layer), then the tables.
    let primes = release_primes(g);
    let pad = usize::try_from(g.engram_pad_id).expect("a preset's Engram pad is a token id");
    let pad_compressed = map[pad];
    let mut eng_layers = Vec::new();
    for (i, &l) in g.engram_layer_ids.iter().enumerate() {
        let mults = draws.multipliers(l, g.engram_max_ngram_size, compressed);
        let flat: Vec<u64> = primes[i].iter().flatten().copied().collect();
        let offsets: Vec<u64> = flat
            .iter()
            .scan(0u64, |acc, &p| {
                let o = *acc;
                *acc += p;
                Some(o)
            })
            .collect();
        eng_layers.push(
            json!({"layer": l, "multipliers": mults, "primes": primes[i], "offsets": offsets}),
        );
    }
    let engram_json = json!({
        "compressed_vocab_size": compressed,
        "pad_id": pad_compressed,
        "max_ngram_size": g.engram_max_ngram_size,
        "n_heads": g.engram_n_heads,
        "head_dim": g.engram_head_dim,
        "layers": eng_layers,
    });
    let mut engram_manifest = Map::new();
    let mut rows_all = Vec::new();
    for (i, &l) in g.engram_layer_ids.iter().enumerate() {
        let rows: u64 = primes[i].iter().flatten().sum();
        rows_all.push(rows);
        let dim = g.engram_head_dim;
        let table = draws.engram_table(l, rows as usize, dim);
        if let Some(vals) = values.as_deref_mut() {
            let rb = row_bytes(dim);
            let mut v = Vec::with_capacity(rows as usize * dim);
            for row in table.chunks(rb) {
                for j in 0..dim {
                    let byte = row[j / 2];
                    let nib = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                    let at = dim / 2 + (j / ENGRAM_GROUP) * 2;
                    let s = u16::from_le_bytes([row[at], row[at + 1]]);
                    v.push((f32::from(nib) - 8.0) * f16v(s));
                }
            }
            vals.insert(format!("layers.{l}.engram.embed.weight"), v);
        }
        let file = format!("engram-L{l}.bin");
        write_file(&file, &table, &mut files)?;
        engram_manifest.insert(
            l.to_string(),
            json!({"rows": rows, "dim": dim, "group": ENGRAM_GROUP, "bits": ENGRAM_BITS,
                   "row_bytes": row_bytes(dim), "bytes": table.len()}),
        );
    }
    write_file(
        "engram.json",
        json_py::dumps_with(&engram_json, DumpOptions::file(1)).as_bytes(),
        &mut files,
    )?;
    let tokmap: Vec<u8> = map.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_file("engram-tokmap.bin", &tokmap, &mut files)?;
    trunk.finish()?;
    write_file("codebooks.bin", &codebooks, &mut files)?;

    // 4. Manifest (and, for native presets, the escaped specials).
    let manifest = json!({
        "format_version": 0,
        "arch": "deepseek_v41_text",
        "tensor_prefix": "",
        "config": flat_config(g, compressed, &rows_all),
        "expert_quant": codes.manifest(),
        "layers": layers,
        "trunk": entries,
        "engram": engram_manifest,
    });
    write_file(
        "manifest.json",
        json_py::dumps_with(&manifest, DumpOptions::file(1)).as_bytes(),
        &mut files,
    )?;
    if let Some(vision) = vision_json(g) {
        write_file(
            "vision.json",
            json_py::dumps_with(&vision, DumpOptions::file(1)).as_bytes(),
            &mut files,
        )?;
    }
    if !p.waste_compat {
        let specials: Vec<Value> = SPECIALS
            .iter()
            .enumerate()
            .map(|(id, t)| json!({"id": id, "text": t}))
            .collect();
        write_file(
            "specials.json",
            json_py::dumps_with(&Value::Array(specials), DumpOptions::file(1)).as_bytes(),
            &mut files,
        )?;
    }
    files.sort();
    Ok(files)
}
