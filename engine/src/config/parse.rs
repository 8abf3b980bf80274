//! Reading a [`Config`] from the three JSON forms (MODEL.md §2.1, CONTAINER.md §9–§10.1).
//!
//! Every missing or mistyped key is an [`Error::Config`] naming the key path (e.g.
//! `text_config.hidden_size`) and the file. Where the container and the release spell a key
//! differently (`num_experts` / `n_routed_experts`, ...), both spellings are accepted and, if
//! both are present, must agree.

use super::{Config, DsparkConfig, VisionConfig};
use crate::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

type Obj = Map<String, Value>;

fn cfg_err(field: impl Into<String>, rule: impl Into<String>) -> Error {
    Error::Config {
        field: field.into(),
        rule: rule.into(),
    }
}

/// Read a JSON file; a syntax error names the file and the byte offset.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let bytes = crate::io::read_file(path, crate::io::MAX_JSON_BYTES, "JSON metadata file")?;
    parse_json_bytes(path, &bytes)
}

/// Parse JSON bytes (full escape decoding by serde_json); errors carry the byte offset.
pub(crate) fn parse_json_bytes(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| Error::Format {
        file: path.to_path_buf(),
        offset: byte_offset(bytes, e.line(), e.column()),
        reason: format!("invalid JSON: {e}"),
    })
}

/// serde_json reports line/column (1-based); turn them into a byte offset.
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> u64 {
    let mut offset = 0usize;
    for (i, l) in bytes.split(|&b| b == b'\n').enumerate() {
        if i + 1 == line {
            return (offset + column.saturating_sub(1).min(l.len())) as u64;
        }
        offset += l.len() + 1;
    }
    bytes.len() as u64
}

/// Typed access to one JSON object, with the key path used in errors.
pub(crate) struct Keys<'a> {
    obj: &'a Obj,
    prefix: String,
}

impl<'a> Keys<'a> {
    pub(crate) fn new(obj: &'a Obj, prefix: &str) -> Self {
        Keys {
            obj,
            prefix: prefix.to_string(),
        }
    }

    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{}", self.prefix, key)
        }
    }

    /// The value of the first present (non-null) spelling; all present spellings must agree.
    fn get_any(&self, keys: &[&str]) -> Result<Option<(String, &'a Value)>> {
        let mut found: Option<(String, &'a Value)> = None;
        for k in keys {
            if let Some(v) = self.obj.get(*k).filter(|v| !v.is_null()) {
                if let Some((fk, fv)) = &found {
                    if !json_num_eq(fv, v) {
                        return Err(cfg_err(
                            self.path(k),
                            format!("disagrees with `{fk}` ({fv} vs {v})"),
                        ));
                    }
                } else {
                    found = Some((self.path(k), v));
                }
            }
        }
        Ok(found)
    }

    fn require(&self, keys: &[&str]) -> Result<(String, &'a Value)> {
        self.get_any(keys)?
            .ok_or_else(|| cfg_err(self.path(keys[0]), "required key is missing"))
    }

    pub(crate) fn obj(&self, key: &str) -> Result<Option<Keys<'a>>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(o)) => Ok(Some(Keys::new(o, &self.path(key)))),
            Some(v) => Err(cfg_err(
                self.path(key),
                format!("expected an object, got {v}"),
            )),
        }
    }

    pub(crate) fn opt_u64(&self, keys: &[&str]) -> Result<Option<u64>> {
        self.get_any(keys)?.map(|(p, v)| as_u64(&p, v)).transpose()
    }
    pub(crate) fn u64(&self, keys: &[&str]) -> Result<u64> {
        let (p, v) = self.require(keys)?;
        as_u64(&p, v)
    }
    pub(crate) fn usize(&self, keys: &[&str]) -> Result<usize> {
        let (p, v) = self.require(keys)?;
        to_usize(&p, as_u64(&p, v)?)
    }
    pub(crate) fn opt_usize(&self, keys: &[&str]) -> Result<Option<usize>> {
        match self.get_any(keys)? {
            None => Ok(None),
            Some((p, v)) => Ok(Some(to_usize(&p, as_u64(&p, v)?)?)),
        }
    }
    pub(crate) fn i64(&self, keys: &[&str]) -> Result<i64> {
        let (p, v) = self.require(keys)?;
        as_i64(&p, v)
    }
    pub(crate) fn f64(&self, keys: &[&str]) -> Result<f64> {
        let (p, v) = self.require(keys)?;
        as_f64(&p, v)
    }
    pub(crate) fn opt_f64(&self, keys: &[&str]) -> Result<Option<f64>> {
        self.get_any(keys)?.map(|(p, v)| as_f64(&p, v)).transpose()
    }
    pub(crate) fn opt_bool(&self, keys: &[&str]) -> Result<Option<bool>> {
        self.get_any(keys)?
            .map(|(p, v)| {
                v.as_bool()
                    .ok_or_else(|| cfg_err(p, format!("expected true/false, got {v}")))
            })
            .transpose()
    }
    pub(crate) fn string(&self, keys: &[&str]) -> Result<String> {
        let (p, v) = self.require(keys)?;
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| cfg_err(p, format!("expected a string, got {v}")))
    }
    pub(crate) fn opt_string(&self, keys: &[&str]) -> Result<Option<String>> {
        self.get_any(keys)?
            .map(|(p, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| cfg_err(p, format!("expected a string, got {v}")))
            })
            .transpose()
    }
    pub(crate) fn vec_u64(&self, keys: &[&str]) -> Result<Vec<u64>> {
        let (p, v) = self.require(keys)?;
        let arr = v
            .as_array()
            .ok_or_else(|| cfg_err(&p, format!("expected a list, got {v}")))?;
        arr.iter()
            .enumerate()
            .map(|(i, x)| as_u64(&format!("{p}[{i}]"), x))
            .collect()
    }
    pub(crate) fn vec_usize(&self, keys: &[&str]) -> Result<Vec<usize>> {
        let (p, _) = self.require(keys)?;
        self.vec_u64(keys)?
            .into_iter()
            .enumerate()
            .map(|(i, x)| to_usize(&format!("{p}[{i}]"), x))
            .collect()
    }
}

fn json_num_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn as_u64(path: &str, v: &Value) -> Result<u64> {
    if let Some(x) = v.as_u64() {
        return Ok(x);
    }
    // Accept integral floats (`4.0`), which Python writers emit for int-valued fields.
    if let Some(f) = v.as_f64() {
        if f.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(&f) {
            return Ok(f as u64);
        }
    }
    Err(cfg_err(
        path,
        format!("expected a non-negative integer, got {v}"),
    ))
}

fn as_i64(path: &str, v: &Value) -> Result<i64> {
    if let Some(x) = v.as_i64() {
        return Ok(x);
    }
    if let Some(f) = v.as_f64() {
        if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
            return Ok(f as i64);
        }
    }
    Err(cfg_err(path, format!("expected an integer, got {v}")))
}

fn as_f64(path: &str, v: &Value) -> Result<f64> {
    v.as_f64()
        .ok_or_else(|| cfg_err(path, format!("expected a number, got {v}")))
}

fn to_usize(path: &str, x: u64) -> Result<usize> {
    usize::try_from(x).map_err(|_| cfg_err(path, format!("{x} does not fit in usize")))
}

fn to_u32(path: &str, x: Option<u64>) -> Result<Option<u32>> {
    x.map(|x| u32::try_from(x).map_err(|_| cfg_err(path, format!("{x} does not fit in u32"))))
        .transpose()
}

fn as_object<'a>(v: &'a Value, what: &str) -> Result<&'a Obj> {
    v.as_object()
        .ok_or_else(|| cfg_err(what, "expected a JSON object at the top level"))
}

/// Attach the file to a config error so the message says where the key was read.
pub(crate) fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::Config { field, rule } => Error::Config {
            field,
            rule: format!("{rule} (in {})", path.display()),
        },
        other => other,
    }
}

impl Config {
    /// Read and validate the release's root `config.json` (HF names, MODEL.md §2.1).
    pub fn from_release_json(path: &Path) -> Result<Config> {
        let v = read_json(path)?;
        Self::from_release_value(&v).map_err(|e| in_file(path, e))
    }

    /// [`Config::from_release_json`] on an already parsed value. A root without
    /// `text_config` is read as a flat HF text config.
    pub fn from_release_value(v: &Value) -> Result<Config> {
        let cfg = Self::read_release_value(v)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The keys of a release `config.json` value, every one present and well typed, without
    /// the invariants of [`Config::validate`]: for a writer that completes the derived keys
    /// (Engram rows, the compressed vocabulary) of a geometry before checking it.
    pub fn read_release_value(v: &Value) -> Result<Config> {
        let root = Keys::new(as_object(v, "config.json")?, "");
        let text = root.obj("text_config")?;
        let text = text.as_ref().unwrap_or(&root);
        parse_hf(text, &root)
    }

    /// Read and validate `inference/config.json` (`ModelArgs` names). A `{"model_args": {..}}`
    /// wrapper (as in `golden_tiny/meta.json`) is unwrapped.
    pub fn from_inference_json(path: &Path) -> Result<Config> {
        let v = read_json(path)?;
        Self::from_inference_value(&v).map_err(|e| in_file(path, e))
    }

    /// [`Config::from_inference_json`] on an already parsed value.
    pub fn from_inference_value(v: &Value) -> Result<Config> {
        let v = v.get("model_args").unwrap_or(v);
        let k = Keys::new(as_object(v, "model_args")?, "");
        let cfg = parse_inference(&k)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read and validate the `config` of a WASTE container's `manifest.json` (the manifest
    /// path or its directory). `engram_pad_id` is the config's raw `engram_pad_token_id`
    /// here; opening the container replaces it with `engram.json`'s compressed `pad_id`.
    pub fn from_container_manifest(path: &Path) -> Result<Config> {
        let file = if path.is_dir() {
            path.join("manifest.json")
        } else {
            path.to_path_buf()
        };
        let v = read_json(&file)?;
        let config = v
            .get("config")
            .ok_or_else(|| in_file(&file, cfg_err("config", "required key is missing")))?;
        Self::from_container_config(config).map_err(|e| in_file(&file, e))
    }

    /// The manifest's `config` value: flat (synthetic, CONTAINER.md §10.1) or converted from
    /// the release (text keys at the top, the HF wrapper under `_outer`).
    pub fn from_container_config(v: &Value) -> Result<Config> {
        let text = Keys::new(as_object(v, "config")?, "config");
        let outer = text.obj("_outer")?;
        let root = outer.as_ref().unwrap_or(&text);
        check_model_type(root)?;
        check_model_type(&text)?;
        if let Some(k) = text.opt_u64(&["first_k_dense_replace"])? {
            if k != 0 {
                return Err(cfg_err(
                    "config.first_k_dense_replace",
                    format!("must be 0 for DS41 (every layer is MoE), got {k}"),
                ));
            }
        }
        let cfg = parse_hf(&text, root)?;
        cfg.validate_container()?;
        Ok(cfg)
    }
}

/// The HF `vision_config` keys (also the tower part of a container's `vision.json`).
fn hf_vision(v: &Keys) -> Result<VisionConfig> {
    Ok(VisionConfig {
        n_layers: v.usize(&["num_hidden_layers"])?,
        dim: v.usize(&["hidden_size"])?,
        n_heads: v.usize(&["num_attention_heads"])?,
        inter_dim: v.usize(&["intermediate_size"])?,
        patch_size: v.usize(&["patch_size"])?,
        downsample_ratio: v.usize(&["downsample_ratio"])?,
        max_n_token: v.usize(&["max_image_tokens"])?,
        min_pixels: v.usize(&["min_pixels"])?,
        max_wh_ratio: v.opt_f64(&["max_wh_ratio"])?,
        rope_theta: v.f64(&["rope_theta"])?,
    })
}

/// A container's `vision.json` (CONTAINER.md §7): the tower config under the HF
/// `vision_config` keys plus `"tower": "ds41"`, `out_hidden_size` (the language model's
/// width) and `media_placeholder_token_id` (the image token). Sets `vision` and
/// `image_token_id`.
pub(crate) fn container_vision(v: &Value, cfg: &mut Config) -> Result<()> {
    let k = Keys::new(as_object(v, "vision")?, "");
    match k.obj.get("tower").and_then(Value::as_str) {
        Some("ds41") => {}
        other => {
            return Err(cfg_err(
                "tower",
                format!("expected \"ds41\", got {other:?}"),
            ))
        }
    }
    let out = k.usize(&["out_hidden_size"])?;
    if out != cfg.dim {
        return Err(cfg_err(
            "out_hidden_size",
            format!("{out}, but the language model's hidden_size is {}", cfg.dim),
        ));
    }
    let id = k.u64(&["media_placeholder_token_id"])?;
    if id >= cfg.vocab_size as u64 {
        return Err(cfg_err(
            "media_placeholder_token_id",
            format!("{id} is outside the vocabulary ({})", cfg.vocab_size),
        ));
    }
    cfg.vision = Some(hf_vision(&k)?);
    cfg.image_token_id = Some(id as u32);
    Ok(())
}

/// Refuses a config whose `model_type` names another model family, before its keys are read
/// (their errors would not say what is wrong). `arch` and `model_type` are descriptive, so
/// an absent one is accepted, and so is any `deepseek_v4*` spelling (the release writes
/// `deepseek_v41` at the root and `deepseek_v41_text` for the language model).
fn check_model_type(keys: &Keys) -> Result<()> {
    match keys.obj.get("model_type").and_then(Value::as_str) {
        Some(kind) if !kind.starts_with("deepseek_v4") => Err(cfg_err(
            keys.path("model_type"),
            format!("\"{kind}\": not a DeepSeek-V4.1 checkpoint (DS41's is deepseek_v41, its language model deepseek_v41_text)"),
        )),
        _ => Ok(()),
    }
}

/// HF / container text keys. `root` holds the wrapper keys (bos/eos/image ids, vision).
fn parse_hf(t: &Keys, root: &Keys) -> Result<Config> {
    check_model_type(root)?;
    check_model_type(t)?;
    let rope = t.obj("rope_scaling")?.ok_or_else(|| {
        cfg_err(
            t.path("rope_scaling"),
            "required key is missing (YaRN parameters)",
        )
    })?;
    if let Some(kind) = rope.opt_string(&["rope_type", "type"])? {
        if kind != "yarn" {
            return Err(cfg_err(
                rope.path("rope_type"),
                format!("only \"yarn\" is defined for DS41, got {kind:?}"),
            ));
        }
    }
    let vision = match root.obj("vision_config")? {
        Some(v) => Some(hf_vision(&v)?),
        None => None,
    };
    let vision_on = vision.as_ref().is_some_and(|v| v.n_layers > 0);
    let candidate = t.i64(&["candidate_source_layer_id"])?;
    Ok(Config {
        vocab_size: t.usize(&["vocab_size"])?,
        dim: t.usize(&["hidden_size"])?,
        moe_inter_dim: t.usize(&["moe_intermediate_size"])?,
        n_layers: t.usize(&["num_hidden_layers"])?,
        // A container drops the MTP stages (CONTAINER.md §8), so its config may omit the key.
        n_mtp_layers: t.opt_usize(&["num_nextn_predict_layers"])?.unwrap_or(0),
        n_heads: t.usize(&["num_attention_heads"])?,
        n_routed_experts: t.usize(&["n_routed_experts", "num_experts"])?,
        n_shared_experts: t.usize(&["n_shared_experts", "num_shared_experts"])?,
        n_activated_experts: t.usize(&["num_experts_per_tok", "num_experts_per_token"])?,
        score_func: t.string(&["scoring_func"])?,
        // ModelArgs default is true (MODEL.md §2.1).
        norm_topk_prob: t
            .opt_bool(&["norm_topk_prob", "moe_renormalize"])?
            .unwrap_or(true),
        route_scale: t.f64(&["routed_scaling_factor"])? as f32,
        swiglu_limit: t.f64(&["swiglu_limit"])? as f32,
        q_lora_rank: t.usize(&["q_lora_rank"])?,
        head_dim: t.usize(&["head_dim"])?,
        rope_head_dim: t.usize(&["qk_rope_head_dim"])?,
        norm_eps: t.f64(&["rms_norm_eps"])? as f32,
        o_groups: t.usize(&["o_groups"])?,
        o_lora_rank: t.usize(&["o_lora_rank"])?,
        window_size: t.usize(&["sliding_window"])?,
        compress_ratios: t.vec_usize(&["compress_ratios"])?,
        kv_source_layers: t.vec_usize(&["kv_source_layer_ids"])?,
        index_source_layers: t.vec_usize(&["index_source_layer_ids"])?,
        candidate_source_layer: candidate_layer(&t.path("candidate_source_layer_id"), candidate)?,
        candidate_topk_blocks: t.usize(&["candidate_topk_blocks"])?,
        candidate_block_size: t.usize(&["candidate_block_size"])?,
        index_n_heads: t.usize(&["index_n_heads"])?,
        index_head_dim: t.usize(&["index_head_dim"])?,
        index_topk: t.usize(&["index_topk"])?,
        rope_theta: t.f64(&["rope_theta"])?,
        compress_rope_theta: t.f64(&["compress_rope_theta"])?,
        original_seq_len: rope.usize(&["original_max_position_embeddings"])?,
        rope_factor: rope.f64(&["factor"])?,
        beta_fast: rope.f64(&["beta_fast"])?,
        beta_slow: rope.f64(&["beta_slow"])?,
        hc_mult: t.usize(&["hc_mult"])?,
        hc_sinkhorn_iters: t.usize(&["hc_sinkhorn_iters"])?,
        hc_eps: t.f64(&["hc_eps"])? as f32,
        engram_layer_ids: t.vec_usize(&["engram_layer_ids"])?,
        engram_vocab_size: t.u64(&["engram_vocab_size"])?,
        engram_num_embeddings: t.vec_u64(&["engram_num_embeddings"])?,
        engram_max_ngram_size: t.usize(&["engram_max_ngram_size"])?,
        engram_n_heads: t.usize(&["engram_n_heads"])?,
        engram_head_dim: t.usize(&["engram_head_dim"])?,
        engram_pad_id: t.i64(&["engram_pad_token_id"])?,
        engram_compressed_vocab_size: t.usize(&["engram_compressed_vocab_size"])?,
        routing_bias_vl: t.opt_bool(&["routing_bias_vl"])?.unwrap_or(vision_on),
        bos_token_id: to_u32(
            "bos_token_id",
            root.opt_u64(&["bos_token_id"])?
                .or(t.opt_u64(&["bos_token_id"])?),
        )?,
        eos_token_id: to_u32(
            "eos_token_id",
            root.opt_u64(&["eos_token_id"])?
                .or(t.opt_u64(&["eos_token_id"])?),
        )?,
        image_token_id: to_u32(
            "image_token_id",
            root.opt_u64(&["image_token_id"])?
                .or(t.opt_u64(&["image_token_id"])?),
        )?,
        vision,
        engram_pad_is_compressed: false,
        max_position: t.opt_usize(&["max_position_embeddings"])?,
        dspark: dspark_args(
            t.opt_usize(&["num_nextn_predict_layers"])?.unwrap_or(0),
            t,
            &["dspark_num_experts_per_tok"],
        )?,
    })
}

fn candidate_layer(path: &str, v: i64) -> Result<Option<usize>> {
    match v {
        -1 => Ok(None),
        v if v >= 0 => Ok(Some(v as usize)),
        v => Err(cfg_err(path, format!("must be a layer id or -1, got {v}"))),
    }
}

/// `ModelArgs` names (inference/config.json, golden_tiny meta.json).
fn parse_inference(k: &Keys) -> Result<Config> {
    let vision_layers = k.opt_usize(&["vision_n_layers"])?.unwrap_or(0);
    let vision = if vision_layers > 0 {
        Some(VisionConfig {
            n_layers: vision_layers,
            dim: k.usize(&["vision_dim"])?,
            n_heads: k.usize(&["vision_n_heads"])?,
            inter_dim: k.usize(&["vision_inter_dim"])?,
            patch_size: k.usize(&["vision_patch_size"])?,
            downsample_ratio: k.usize(&["vision_downsample_ratio"])?,
            max_n_token: k.usize(&["vision_max_n_token"])?,
            min_pixels: k.usize(&["vision_min_pixels"])?,
            max_wh_ratio: k.opt_f64(&["vision_max_wh_ratio"])?,
            rope_theta: k.f64(&["vision_rope_theta"])?,
        })
    } else {
        None
    };
    let candidate = k.i64(&["candidate_source_layer"])?;
    Ok(Config {
        vocab_size: k.usize(&["vocab_size"])?,
        dim: k.usize(&["dim"])?,
        moe_inter_dim: k.usize(&["moe_inter_dim"])?,
        n_layers: k.usize(&["n_layers"])?,
        n_mtp_layers: k.usize(&["n_mtp_layers"])?,
        n_heads: k.usize(&["n_heads"])?,
        n_routed_experts: k.usize(&["n_routed_experts"])?,
        n_shared_experts: k.usize(&["n_shared_experts"])?,
        n_activated_experts: k.usize(&["n_activated_experts"])?,
        score_func: k.string(&["score_func"])?,
        norm_topk_prob: k.opt_bool(&["norm_topk_prob"])?.unwrap_or(true),
        route_scale: k.f64(&["route_scale"])? as f32,
        swiglu_limit: k.f64(&["swiglu_limit"])? as f32,
        q_lora_rank: k.usize(&["q_lora_rank"])?,
        head_dim: k.usize(&["head_dim"])?,
        rope_head_dim: k.usize(&["rope_head_dim"])?,
        norm_eps: k.f64(&["norm_eps"])? as f32,
        o_groups: k.usize(&["o_groups"])?,
        o_lora_rank: k.usize(&["o_lora_rank"])?,
        window_size: k.usize(&["window_size"])?,
        compress_ratios: k.vec_usize(&["compress_ratios"])?,
        kv_source_layers: k.vec_usize(&["kv_source_layers"])?,
        index_source_layers: k.vec_usize(&["index_source_layers"])?,
        candidate_source_layer: candidate_layer("candidate_source_layer", candidate)?,
        candidate_topk_blocks: k.usize(&["candidate_topk_blocks"])?,
        candidate_block_size: k.usize(&["candidate_block_size"])?,
        index_n_heads: k.usize(&["index_n_heads"])?,
        index_head_dim: k.usize(&["index_head_dim"])?,
        index_topk: k.usize(&["index_topk"])?,
        rope_theta: k.f64(&["rope_theta"])?,
        compress_rope_theta: k.f64(&["compress_rope_theta"])?,
        original_seq_len: k.usize(&["original_seq_len"])?,
        rope_factor: k.f64(&["rope_factor"])?,
        beta_fast: k.f64(&["beta_fast"])?,
        beta_slow: k.f64(&["beta_slow"])?,
        hc_mult: k.usize(&["hc_mult"])?,
        hc_sinkhorn_iters: k.usize(&["hc_sinkhorn_iters"])?,
        hc_eps: k.f64(&["hc_eps"])? as f32,
        engram_layer_ids: k.vec_usize(&["engram_layer_ids"])?,
        engram_vocab_size: k.u64(&["engram_vocab_size"])?,
        engram_num_embeddings: k.vec_u64(&["engram_num_embeddings"])?,
        engram_max_ngram_size: k.usize(&["engram_max_ngram_size"])?,
        engram_n_heads: k.usize(&["engram_n_heads"])?,
        engram_head_dim: k.usize(&["engram_head_dim"])?,
        engram_pad_id: k.i64(&["engram_pad_id"])?,
        engram_compressed_vocab_size: k.usize(&["engram_compressed_vocab_size"])?,
        routing_bias_vl: vision_layers > 0,
        bos_token_id: None,
        eos_token_id: None,
        // ModelArgs carries the release default 129264 even for tiny text-only models
        // (golden_tiny, vocab 512); the id only means something with a vision tower.
        image_token_id: if vision_layers > 0 {
            to_u32("image_token_id", k.opt_u64(&["image_token_id"])?)?
        } else {
            None
        },
        vision,
        engram_pad_is_compressed: false,
        // `max_seq_len` of ModelArgs only sizes the reference's caches (MODEL.md §2.1).
        max_position: None,
        dspark: dspark_args(
            k.usize(&["n_mtp_layers"])?,
            k,
            &["dspark_n_activated_experts"],
        )?,
    })
}

/// The `dspark_*` arguments (same names in both config files but the activated-expert count):
/// `None` without MTP stages or with `dspark_block_size` 0 or absent.
fn dspark_args(n_mtp: usize, k: &Keys, activated: &[&str]) -> Result<Option<DsparkConfig>> {
    let block_size = k.opt_usize(&["dspark_block_size"])?.unwrap_or(0);
    if n_mtp == 0 || block_size == 0 {
        return Ok(None);
    }
    let noise = k.usize(&["dspark_noise_token_id"])?;
    Ok(Some(DsparkConfig {
        block_size,
        noise_token_id: u32::try_from(noise).map_err(|_| {
            cfg_err(
                k.path("dspark_noise_token_id"),
                format!("{noise} is not a token id"),
            )
        })?,
        target_layer_ids: k.vec_usize(&["dspark_target_layer_ids"])?,
        markov_rank: k.usize(&["dspark_markov_rank"])?,
        n_routed_experts: k.opt_usize(&["dspark_n_routed_experts"])?.unwrap_or(0),
        n_activated_experts: k.opt_usize(activated)?.unwrap_or(0),
    }))
}
