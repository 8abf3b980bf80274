//! The release layout (MODEL.md §2.1, §4): root `config.json` (HF wrapper with `text_config`),
//! `inference/config.json` (`ModelArgs` names), safetensors with every tensor the config implies
//! (single file or index + shards), `tokenizer.json`.
//!
//! Tensors are streamed: the header is computed from shapes alone, then each tensor's bytes
//! are drawn row by row straight into the file, so even `wide` never sits in memory.

use crate::draw::{self, E4M3_CODE_RMS, FP4_CODE_RMS};
use crate::inventory::{copy_slices, engram_rows, logical_tensors, Kind, Logical};
use crate::preset::{decimal, Geometry, Preset, Sharding};
use crate::rng::SplitMix64;
use crate::tokenizer::Vocab;
use crate::SynthError;
use ds41_engine::config::{DsparkConfig, VisionConfig};
use serde_json::{json, Value};
use std::io::{BufWriter, Write};
use std::path::Path;

/// Which part of a logical tensor a stored tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// F32 or BF16 values.
    Plain,
    /// e4m3 codes (FP8 linears, Engram rows) or packed FP4 bytes (routed experts).
    Codes,
    /// The E8M0 `.scale` companion.
    Scale,
}

/// One tensor as stored in a safetensors file.
#[derive(Debug, Clone)]
pub struct Stored {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub part: Part,
    pub logical: Logical,
}

impl Stored {
    pub fn nbytes(&self) -> usize {
        let n: usize = self.shape.iter().product();
        match self.dtype {
            "F32" => 4 * n,
            "BF16" => 2 * n,
            _ => n,
        }
    }
}

fn scale_name(weight: &str) -> String {
    weight
        .strip_suffix(".weight")
        .map(|s| format!("{s}.scale"))
        .unwrap_or_else(|| format!("{weight}.scale"))
}

/// Expand logical tensors into stored ones with release names, dtypes and shapes.
pub fn stored_tensors(g: &Geometry) -> Vec<Stored> {
    let mut out = Vec::new();
    for t in logical_tensors(g) {
        let (r, c) = (t.rows(), t.cols());
        let mk = |name: String, dtype, shape, part| Stored {
            name,
            dtype,
            shape,
            part,
            logical: t.clone(),
        };
        match t.kind {
            Kind::F32 => out.push(mk(t.name.clone(), "F32", t.shape.clone(), Part::Plain)),
            Kind::Bf16 => out.push(mk(t.name.clone(), "BF16", t.shape.clone(), Part::Plain)),
            Kind::Fp8 => {
                out.push(mk(t.name.clone(), "F8_E4M3", t.shape.clone(), Part::Codes));
                out.push(mk(
                    scale_name(&t.name),
                    "F8_E8M0",
                    vec![r.div_ceil(32), c.div_ceil(32)],
                    Part::Scale,
                ));
            }
            Kind::Fp4 => {
                out.push(mk(t.name.clone(), "I8", vec![r, c / 2], Part::Codes));
                out.push(mk(
                    scale_name(&t.name),
                    "F8_E8M0",
                    vec![r, c / 32],
                    Part::Scale,
                ));
            }
            Kind::EngramTable => {
                out.push(mk(t.name.clone(), "F8_E4M3", t.shape.clone(), Part::Codes));
                out.push(mk(
                    scale_name(&t.name),
                    "F8_E8M0",
                    vec![r, c / 32],
                    Part::Scale,
                ));
            }
        }
    }
    out
}

fn code_rms(kind: Kind) -> f64 {
    if kind == Kind::Fp4 {
        FP4_CODE_RMS
    } else {
        E4M3_CODE_RMS
    }
}

/// Draw the bytes of one stored tensor, row by row, into `w`.
pub fn write_stored(seed: u64, s: &Stored, w: &mut dyn Write) -> std::io::Result<()> {
    let mut rng = SplitMix64::for_object(seed, &s.name);
    let t = &s.logical;
    let fan_in = t.cols();
    let row_len = *s.shape.last().unwrap_or(&1);
    let rows = s.shape[..s.shape.len().saturating_sub(1)]
        .iter()
        .product::<usize>()
        .max(1);
    let mut buf = Vec::with_capacity(row_len * 4);
    // A tensor with copied slices (router ties) is small: drawn whole, then copied, then written.
    let mut whole = Vec::new();
    for _ in 0..rows {
        buf.clear();
        for _ in 0..row_len {
            match (s.part, s.dtype) {
                (Part::Plain, "F32") => buf.extend_from_slice(
                    &(draw::plain(&mut rng, t.init, fan_in) as f32).to_le_bytes(),
                ),
                (Part::Plain, _) => {
                    buf.extend_from_slice(&draw::bf16(&mut rng, t.init, fan_in).0.to_le_bytes())
                }
                (Part::Codes, "I8") => buf.push(draw::fp4_pair(&mut rng).0),
                (Part::Codes, _) => buf.push(draw::e4m3(&mut rng).0),
                (Part::Scale, _) => buf.push(draw::e8m0(
                    &mut rng,
                    t.init.target_rms(fan_in),
                    code_rms(t.kind),
                )),
            }
        }
        if t.copies.is_empty() {
            w.write_all(&buf)?;
        } else {
            whole.extend_from_slice(&buf);
        }
    }
    if !t.copies.is_empty() {
        assert_eq!(
            s.part,
            Part::Plain,
            "{}: only plain tensors have copies",
            s.name
        );
        let per_slice = whole.len() / t.shape[0];
        copy_slices(&t.copies, &mut whole, per_slice);
        w.write_all(&whole)?;
    }
    Ok(())
}

/// The exact dequantised values of one logical tensor as drawn for the release layout
/// (row-major, logical shape). Used by round-trip tests; cheap for the small presets only.
pub fn logical_values(seed: u64, t: &Logical) -> Vec<f32> {
    let (rows, cols) = (t.rows(), t.cols());
    let mut rng = SplitMix64::for_object(seed, &t.name);
    let plain = |mut values: Vec<f32>| {
        copy_slices(&t.copies, &mut values, t.numel() / t.shape[0]);
        values
    };
    match t.kind {
        Kind::F32 => plain(
            (0..t.numel())
                .map(|_| draw::plain(&mut rng, t.init, cols) as f32)
                .collect(),
        ),
        Kind::Bf16 => plain(
            (0..t.numel())
                .map(|_| draw::bf16(&mut rng, t.init, cols).1)
                .collect(),
        ),
        Kind::Fp8 | Kind::EngramTable | Kind::Fp4 => {
            let mut srng = SplitMix64::for_object(seed, &scale_name(&t.name));
            let (srows, scols) = if t.kind == Kind::Fp8 {
                (rows.div_ceil(32), cols.div_ceil(32))
            } else {
                (rows, cols / 32)
            };
            let scales: Vec<f32> = (0..srows * scols)
                .map(|_| {
                    draw::e8m0_value(draw::e8m0(
                        &mut srng,
                        t.init.target_rms(cols),
                        code_rms(t.kind),
                    ))
                })
                .collect();
            let scale_at = |i: usize, j: usize| {
                let si = if t.kind == Kind::Fp8 { i / 32 } else { i };
                scales[si * scols + j / 32]
            };
            let mut v = Vec::with_capacity(rows * cols);
            for i in 0..rows {
                let mut j = 0;
                while j < cols {
                    if t.kind == Kind::Fp4 {
                        let (_, pair) = draw::fp4_pair(&mut rng);
                        v.push(pair[0] * scale_at(i, j));
                        v.push(pair[1] * scale_at(i, j + 1));
                        j += 2;
                    } else {
                        v.push(draw::e4m3(&mut rng).1 * scale_at(i, j));
                        j += 1;
                    }
                }
            }
            v
        }
    }
}

/// The safetensors header for `tensors` (in order), padded with spaces to 8 bytes.
pub fn safetensors_header(tensors: &[Stored]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        let end = off + t.nbytes();
        map.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(map)).expect("header serialises");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    h
}

/// Write one safetensors file holding `tensors` in order.
pub fn write_safetensors(seed: u64, path: &Path, tensors: &[Stored]) -> Result<(), SynthError> {
    let io = |e| SynthError::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let header = safetensors_header(tensors);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for t in tensors {
        write_stored(seed, t, &mut w).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Which shard a stored tensor belongs to under [`Sharding::ReleaseLike`].
fn shard_key(s: &Stored) -> String {
    match s.logical.layer {
        None if s.name == "embed.weight" => "0-embed".into(),
        None => "2-head".into(),
        Some(l) if s.name.contains(".engram.embed.") => format!("3-engram-{l:05}"),
        Some(l) => format!("1-layer-{l:05}"),
    }
}

/// Which of `files` shards a stored tensor belongs to under [`Sharding::Files`]: consecutive
/// runs of layers (MTP stages counted after the backbone), embed first, head + norm last.
fn file_index(g: &Geometry, s: &Stored, files: usize) -> usize {
    let blocks = g.n_layers + g.n_mtp_layers;
    match s.logical.layer {
        None if s.name == "embed.weight" => 0,
        None => files - 1,
        Some(l) => l * files / blocks,
    }
}

/// Group stored tensors into files: `(file name, tensors)`.
pub fn plan_files(p: &Preset) -> Vec<(String, Vec<Stored>)> {
    let all = stored_tensors(&p.geometry);
    let mut groups: std::collections::BTreeMap<String, Vec<Stored>> = Default::default();
    match p.sharding {
        Sharding::Single => return vec![("model.safetensors".into(), all)],
        Sharding::ReleaseLike => {
            for s in all {
                groups.entry(shard_key(&s)).or_default().push(s);
            }
        }
        Sharding::Files(n) => {
            for s in all {
                let i = file_index(&p.geometry, &s, n);
                groups.entry(format!("{i:05}")).or_default().push(s);
            }
        }
    }
    let n = groups.len();
    groups
        .into_values()
        .enumerate()
        .map(|(i, ts)| (format!("model-{:05}-of-{:05}.safetensors", i + 1, n), ts))
        .collect()
}

/// The `dspark_*` arguments to write: the geometry's, or the values a model without DSpark
/// stages carries (block size 0 = no stages built).
fn dspark_args(g: &Geometry) -> DsparkConfig {
    g.dspark.clone().unwrap_or(DsparkConfig {
        block_size: 0,
        noise_token_id: 0,
        target_layer_ids: Vec::new(),
        markov_rank: 256,
        n_routed_experts: 0,
        n_activated_experts: 0,
    })
}

/// The HF root `config.json` (MODEL.md §2.1 key names); a geometry with a vision tower adds
/// the root `image_token_id` and `vision_config`.
pub fn root_config(g: &Geometry, compressed_vocab: usize) -> Value {
    let mut config = text_root_config(g, compressed_vocab);
    if let (Some(v), Some(id)) = (&g.vision, g.image_token_id) {
        let root = config.as_object_mut().expect("an object");
        root.insert("image_token_id".into(), json!(id));
        let mut vision = serde_json::Map::new();
        vision.insert("model_type".into(), json!("deepseek_v41_vision"));
        vision.extend(hf_vision_keys(v));
        root.insert("vision_config".into(), Value::Object(vision));
    }
    config
}

/// The tower's keys as the HF `vision_config` spells them (also the body of a container's
/// `vision.json`, CONTAINER.md §7).
pub fn hf_vision_keys(v: &VisionConfig) -> serde_json::Map<String, Value> {
    let keys = json!({
        "num_hidden_layers": v.n_layers,
        "hidden_size": v.dim,
        "num_attention_heads": v.n_heads,
        "intermediate_size": v.inter_dim,
        "patch_size": v.patch_size,
        "rope_theta": v.rope_theta,
        "downsample_ratio": v.downsample_ratio,
        "max_image_tokens": v.max_n_token,
        "min_pixels": v.min_pixels,
        "max_wh_ratio": v.max_wh_ratio
    });
    match keys {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

fn text_root_config(g: &Geometry, compressed_vocab: usize) -> Value {
    let dspark = dspark_args(g);
    json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "transformers_version": "5.6.0",
        "bos_token_id": g.bos_token_id,
        "eos_token_id": g.eos_token_id,
        "pad_token_id": g.pad_token_id,
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [32, 32],
            "scale_fmt": "ue8m0",
            "expert_dtype": "fp4"
        },
        "text_config": {
            "model_type": "deepseek_v41_text",
            "vocab_size": g.vocab_size,
            "hidden_size": g.dim,
            "moe_intermediate_size": g.moe_inter_dim,
            "num_hidden_layers": g.n_layers,
            "num_attention_heads": g.n_heads,
            "num_key_value_heads": 1,
            "head_dim": g.head_dim,
            "qk_rope_head_dim": g.rope_head_dim,
            "q_lora_rank": g.q_lora_rank,
            "o_lora_rank": g.o_lora_rank,
            "o_groups": g.o_groups,
            "hidden_act": "silu",
            "swiglu_limit": decimal(g.swiglu_limit),
            "rms_norm_eps": decimal(g.norm_eps),
            "attention_bias": false,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": true,
            "tie_word_embeddings": false,
            "max_position_embeddings": 4096,
            "rope_theta": g.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": g.rope_factor,
                "beta_fast": g.beta_fast,
                "beta_slow": g.beta_slow,
                "original_max_position_embeddings": g.original_seq_len
            },
            "n_routed_experts": g.n_routed_experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": g.n_activated_experts,
            "scoring_func": "sqrtsoftplus",
            "topk_method": "noaux_tc",
            "norm_topk_prob": true,
            "routed_scaling_factor": decimal(g.route_scale),
            "sliding_window": g.window_size,
            "compress_ratios": g.compress_ratios,
            "compress_rope_theta": g.compress_rope_theta,
            "kv_source_layer_ids": g.kv_source_layers,
            "index_source_layer_ids": g.index_source_layers,
            "index_n_heads": g.index_n_heads,
            "index_head_dim": g.index_head_dim,
            "index_topk": g.index_topk,
            "candidate_source_layer_id": g.candidate_source_layer.map(|c| c as i64).unwrap_or(-1),
            "candidate_topk_blocks": g.candidate_topk_blocks,
            "candidate_block_size": g.candidate_block_size,
            "hc_mult": g.hc_mult,
            "hc_sinkhorn_iters": g.hc_sinkhorn_iters,
            "hc_eps": decimal(g.hc_eps),
            "engram_layer_ids": g.engram_layer_ids,
            "engram_num_embeddings": engram_rows(g),
            "engram_max_ngram_size": g.engram_max_ngram_size,
            "engram_vocab_size": g.engram_vocab_size,
            "engram_n_heads": g.engram_n_heads,
            "engram_head_dim": g.engram_head_dim,
            "engram_pad_token_id": g.engram_pad_id,
            "engram_compressed_vocab_size": compressed_vocab,
            "num_nextn_predict_layers": g.n_mtp_layers,
            "dspark_block_size": dspark.block_size,
            "dspark_noise_token_id": dspark.noise_token_id,
            "dspark_target_layer_ids": dspark.target_layer_ids,
            "dspark_markov_rank": dspark.markov_rank,
            "dspark_n_routed_experts": dspark.n_routed_experts,
            "dspark_num_experts_per_tok": dspark.n_activated_experts
        }
    })
}

/// `inference/config.json` (the `ModelArgs` names, MODEL.md §2.1 first column).
pub fn inference_config(g: &Geometry, compressed_vocab: usize) -> Value {
    let mut config = text_inference_config(g, compressed_vocab);
    if let (Some(v), Some(id)) = (&g.vision, g.image_token_id) {
        let args = config.as_object_mut().expect("an object");
        for (key, value) in [
            ("vision_n_layers", json!(v.n_layers)),
            ("vision_dim", json!(v.dim)),
            ("vision_n_heads", json!(v.n_heads)),
            ("vision_inter_dim", json!(v.inter_dim)),
            ("vision_patch_size", json!(v.patch_size)),
            ("vision_downsample_ratio", json!(v.downsample_ratio)),
            ("vision_max_n_token", json!(v.max_n_token)),
            ("vision_min_pixels", json!(v.min_pixels)),
            ("vision_max_wh_ratio", json!(v.max_wh_ratio)),
            ("vision_rope_theta", json!(v.rope_theta)),
            ("image_token_id", json!(id)),
        ] {
            args.insert(key.into(), value);
        }
    }
    config
}

fn text_inference_config(g: &Geometry, compressed_vocab: usize) -> Value {
    let dspark = dspark_args(g);
    json!({
        "vocab_size": g.vocab_size,
        "dim": g.dim,
        "moe_inter_dim": g.moe_inter_dim,
        "n_layers": g.n_layers,
        "n_mtp_layers": g.n_mtp_layers,
        "dspark_block_size": dspark.block_size,
        "dspark_noise_token_id": dspark.noise_token_id,
        "dspark_target_layer_ids": dspark.target_layer_ids,
        "dspark_markov_rank": dspark.markov_rank,
        "dspark_n_routed_experts": dspark.n_routed_experts,
        "dspark_n_activated_experts": dspark.n_activated_experts,
        "n_heads": g.n_heads,
        "n_routed_experts": g.n_routed_experts,
        "n_shared_experts": 1,
        "n_activated_experts": g.n_activated_experts,
        "score_func": "sqrtsoftplus",
        "route_scale": decimal(g.route_scale),
        "swiglu_limit": decimal(g.swiglu_limit),
        "q_lora_rank": g.q_lora_rank,
        "head_dim": g.head_dim,
        "rope_head_dim": g.rope_head_dim,
        "norm_eps": decimal(g.norm_eps),
        "o_groups": g.o_groups,
        "o_lora_rank": g.o_lora_rank,
        "window_size": g.window_size,
        "kv_source_layers": g.kv_source_layers,
        "index_source_layers": g.index_source_layers,
        "original_seq_len": g.original_seq_len,
        "rope_theta": g.rope_theta,
        "rope_factor": g.rope_factor,
        "beta_fast": g.beta_fast,
        "beta_slow": g.beta_slow,
        "index_n_heads": g.index_n_heads,
        "index_head_dim": g.index_head_dim,
        "index_topk": g.index_topk,
        "candidate_source_layer": g.candidate_source_layer.map(|c| c as i64).unwrap_or(-1),
        "candidate_topk_blocks": g.candidate_topk_blocks,
        "candidate_block_size": g.candidate_block_size,
        "hc_mult": g.hc_mult,
        "hc_sinkhorn_iters": g.hc_sinkhorn_iters,
        "hc_eps": decimal(g.hc_eps),
        "engram_layer_ids": g.engram_layer_ids,
        "engram_vocab_size": g.engram_vocab_size,
        "engram_num_embeddings": engram_rows(g),
        "engram_max_ngram_size": g.engram_max_ngram_size,
        "engram_pad_id": g.engram_pad_id,
        "engram_compressed_vocab_size": compressed_vocab,
        "dtype": "fp8",
        "expert_dtype": "fp4",
        "compress_rope_theta": g.compress_rope_theta,
        "compress_ratios": g.compress_ratios,
        "vision_n_layers": 0,
        "engram_n_heads": g.engram_n_heads,
        "engram_head_dim": g.engram_head_dim
    })
}

fn tokenizer_config() -> Value {
    let tok = |c: &str| {
        json!({"__type": "AddedToken", "content": c, "lstrip": false, "normalized": true,
               "rstrip": false, "single_word": false})
    };
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "bos_token": tok(crate::tokenizer::SPECIALS[0]),
        "clean_up_tokenization_spaces": false,
        "eos_token": tok(crate::tokenizer::SPECIALS[1]),
        "legacy": true,
        "model_max_length": 1048576,
        "pad_token": tok(crate::tokenizer::SPECIALS[1]),
        "sp_model_kwargs": {},
        "unk_token": null,
        "tokenizer_class": "PreTrainedTokenizerFast"
    })
}

pub(crate) fn write_json(path: &Path, v: &Value) -> Result<(), SynthError> {
    let mut s = serde_json::to_string_pretty(v).expect("json serialises");
    s.push('\n');
    std::fs::write(path, s).map_err(|e| SynthError::io(path, e))
}

/// Changes a mutant makes before the release layout is written.
#[derive(Debug, Clone, Default)]
pub struct ReleaseEdit {
    /// Stored tensors left out (the index still lists none of them).
    pub drop: Vec<String>,
    /// Stored tensors written with another dtype of the same element size.
    pub retype: Vec<(String, &'static str)>,
    /// Stored tensors written with another shape (bytes drawn for the new shape).
    pub reshape: Vec<(String, Vec<usize>)>,
    /// Config keys replaced: (HF `text_config` key, inference key, value).
    pub config: Vec<(&'static str, &'static str, Value)>,
}

impl ReleaseEdit {
    fn apply(&self, ts: Vec<Stored>) -> Vec<Stored> {
        ts.into_iter()
            .filter(|t| !self.drop.contains(&t.name))
            .map(|mut t| {
                if let Some((_, d)) = self.retype.iter().find(|(n, _)| *n == t.name) {
                    t.dtype = d;
                }
                if let Some((_, s)) = self.reshape.iter().find(|(n, _)| *n == t.name) {
                    t.shape = s.clone();
                }
                t
            })
            .collect()
    }
}

/// Write a complete release-layout checkpoint into `dir` (which exists and is empty).
pub fn write(p: &Preset, seed: u64, dir: &Path) -> Result<Vec<String>, SynthError> {
    write_edited(p, seed, dir, &ReleaseEdit::default())
}

/// [`write`] with a mutant's edits applied.
pub fn write_edited(
    p: &Preset,
    seed: u64,
    dir: &Path,
    edit: &ReleaseEdit,
) -> Result<Vec<String>, SynthError> {
    let g = &p.geometry;
    let vocab = Vocab::build(p.tokenizer, g.vocab_size);
    let map = vocab.compressed_token_map();
    let compressed = map.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut files = Vec::new();
    let mut root = root_config(g, compressed);
    let mut inference = inference_config(g, compressed);
    for (hf, inf, v) in &edit.config {
        root["text_config"][*hf] = v.clone();
        inference[*inf] = v.clone();
    }
    write_json(&dir.join("config.json"), &root)?;
    files.push("config.json".to_string());
    std::fs::create_dir_all(dir.join("inference")).map_err(|e| SynthError::io(dir, e))?;
    write_json(&dir.join("inference/config.json"), &inference)?;
    files.push("inference/config.json".into());
    write_json(&dir.join("tokenizer.json"), &vocab.to_json())?;
    files.push("tokenizer.json".into());
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config())?;
    files.push("tokenizer_config.json".into());
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": g.bos_token_id, "eos_token_id": g.eos_token_id, "transformers_version": "5.6.0"}),
    )?;
    files.push("generation_config.json".into());
    let plan: Vec<(String, Vec<Stored>)> = plan_files(p)
        .into_iter()
        .map(|(f, ts)| (f, edit.apply(ts)))
        .collect();
    if p.sharding != Sharding::Single {
        let mut weight_map = serde_json::Map::new();
        let mut total = 0usize;
        for (file, ts) in &plan {
            for t in ts {
                weight_map.insert(t.name.clone(), json!(file));
                total += t.nbytes();
            }
        }
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
        files.push("model.safetensors.index.json".into());
    }
    for (file, ts) in &plan {
        write_safetensors(seed, &dir.join(file), ts)?;
        files.push(file.clone());
    }
    Ok(files)
}
