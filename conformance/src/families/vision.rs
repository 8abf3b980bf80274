//! Vision family (MODEL.md §10.2; PROTOCOL.md `vision_*`): an engine's image pipeline against
//! the official code's goldens, one part per case:
//!
//! * `preprocess` — every image of a corpus golden (goldens/vision/preprocess, the official
//!   `image_processor.load_image`) through `vision_preprocess`, bit-exact: the grid, the span's
//!   token types and the bf16 patches (the first differing patch row named);
//! * `tower` — the tower and aligner of a checkpoint on one image's patches through
//!   `vision_tower`, every stage (`vision.embed`, each block, `vision.norm`, `vision.aligner`)
//!   against the official `vision.py`'s outputs within the profile's `vision` gates, end to end or
//!   teacher-forced (`replay: true`), the first diverging stage named. A golden made on tower
//!   weights alone (goldens/vision/tower) is run on a checkpoint the harness makes by grafting
//!   those weights onto `model` (a release-layout checkpoint of the same language-model width);
//! * `span` — a prompt with image markers and its images through `vision_span`: the expanded token
//!   ids and token types exact (goldens/vision/span, the official `prepare_vl_inputs`), or a
//!   refusal where the official code raises (a marker count that differs from the image count).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::engram::{link, WeightlessModel};
use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{
    Capability, Engine, EngineError, Numerics, RequiredCapability, VisionPreprocessRequest,
    VisionSpanRequest, VisionTowerRequest,
};
use crate::gates::ProfileName;
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, require_layout, timeout, Context, Details};
use crate::vision_goldens::{self as vg, Expected, Preprocessed};
use ds41_engine::trace::TraceFile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionPart {
    Preprocess,
    Tower,
    Span,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionSpec {
    pub part: VisionPart,
    /// preprocess, span: the golden (`expected.json`); tower: the official stage outputs of one
    /// image (`IMAGE.DTYPE.safetensors`).
    pub golden: DataRef,
    /// preprocess: only the golden's cases of this config (all when absent).
    #[serde(default)]
    pub config: Option<String>,
    /// tower: the checkpoint (with `tower_weights`: the one they are grafted onto); span: the
    /// model whose config and tokenizer are used (or `weightless`).
    #[serde(default)]
    pub model: Option<ModelRef>,
    /// tower: a tower by its release names with its `config` metadata
    /// (goldens/vision/tower/weights.safetensors), grafted onto `model`.
    #[serde(default)]
    pub tower_weights: Option<DataRef>,
    /// tower: the image the golden was made from.
    #[serde(default)]
    pub image: Option<DataRef>,
    /// tower: the numerics profile the golden was made under.
    #[serde(default)]
    pub numerics: Option<Numerics>,
    /// tower: the image's index in a forward golden with image spans (its `vision.I{i}.*`
    /// stages, goldens/official/vision_*); absent for a tower golden (goldens/vision/tower).
    #[serde(default)]
    pub golden_image: Option<usize>,
    /// tower: teacher-forced from the golden (capability `replay`).
    #[serde(default)]
    pub replay: bool,
    /// span: the model directory's files (config with `vision_config` and `image_token_id`,
    /// tokenizer), or `model`.
    #[serde(default)]
    pub weightless: Option<WeightlessModel>,
    /// span: the golden case's name.
    #[serde(default)]
    pub span: Option<String>,
}

impl super::CheckFamily for VisionSpec {
    fn models(&self) -> Vec<ModelRef> {
        self.model.iter().cloned().collect()
    }

    fn data(&self) -> Vec<&DataRef> {
        let mut d = vec![&self.golden];
        d.extend(&self.tower_weights);
        d.extend(&self.image);
        if let Some(w) = &self.weightless {
            d.extend([&w.config, &w.tokenizer]);
        }
        d
    }

    fn validate(&self) -> Result<(), String> {
        let given = |name: &str, present: bool, wanted: bool| -> Result<(), String> {
            match (present, wanted) {
                (true, false) => Err(format!("`{name}` is not a field of part {:?}", self.part)),
                (false, true) => Err(format!("part {:?} needs `{name}`", self.part)),
                _ => Ok(()),
            }
        };
        let p = self.part;
        let tower = p == VisionPart::Tower;
        given(
            "config",
            self.config.is_some(),
            self.config.is_some() && p == VisionPart::Preprocess,
        )?;
        let span = p == VisionPart::Span;
        given(
            "model",
            self.model.is_some(),
            tower || (span && self.model.is_some()),
        )?;
        given("image", self.image.is_some(), tower)?;
        given("numerics", self.numerics.is_some(), tower)?;
        given(
            "tower_weights",
            self.tower_weights.is_some(),
            self.tower_weights.is_some() && tower,
        )?;
        given("replay", self.replay, self.replay && tower)?;
        given(
            "golden_image",
            self.golden_image.is_some(),
            self.golden_image.is_some() && tower,
        )?;
        if self.golden_image.is_some() && self.tower_weights.is_some() {
            return Err(
                "`golden_image` names an image of a forward golden, run on `model` itself; \
                        `tower_weights` belong to a tower golden"
                    .into(),
            );
        }
        given(
            "weightless",
            self.weightless.is_some(),
            span && self.model.is_none(),
        )?;
        given("span", self.span.is_some(), p == VisionPart::Span)?;
        Ok(())
    }

    fn default_profile(&self) -> ProfileName {
        self.numerics.map_or(ProfileName::Exact, super::profile_of)
    }

    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        match self.part {
            VisionPart::Preprocess => self.run_preprocess(case, engine, ctx, details),
            VisionPart::Tower => self.run_tower(case, engine, ctx, details),
            VisionPart::Span => self.run_span(case, engine, ctx, details),
        }
    }
}

impl VisionSpec {
    fn run_preprocess(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        if let Some(o) = require(engine, &[Capability::VisionPreprocess]) {
            return Ok(o);
        }
        let path = ctx.data(&self.golden)?;
        let expected = Expected::read(&path).map_err(Outcome::error)?;
        let corpus = path.parent().unwrap_or(Path::new("."));
        let dir = ctx.scratch(case)?;
        // The case's timeout bounds all its images together.
        let deadline = std::time::Instant::now() + timeout(case);
        let mut checked = 0;
        for (i, golden) in expected.cases.iter().enumerate() {
            if self.config.as_ref().is_some_and(|c| c != &golden.config) {
                continue;
            }
            let config = expected.configs.get(&golden.config).ok_or_else(|| {
                Outcome::error(format!("{}: no config `{}`", path.display(), golden.config))
            })?;
            let (image, _) = vg::case_image(corpus, golden).map_err(Outcome::error)?;
            let req = VisionPreprocessRequest {
                image,
                config: config.request_config(),
                out: dir.join(format!("patches-{i}.safetensors")),
            };
            let what = format!("{} [{}]", golden.image, golden.config);
            engine
                .vision_preprocess(
                    &req,
                    deadline.saturating_duration_since(std::time::Instant::now()),
                )
                .map_err(|e| engine_failure(&format!("vision_preprocess {what}"), e))?;
            let got = read_patch_file(&req.out)
                .map_err(|e| Outcome::fail(format!("{what}: the patch file: {e}")))?;
            vg::judge_preprocessed(golden, &got)
                .map_err(|e| Outcome::fail(format!("{what}: {e}")))?;
            let _ = std::fs::remove_file(&req.out);
            checked += 1;
        }
        if checked == 0 {
            return Ok(Outcome::error(format!(
                "no golden case has config {:?}",
                self.config
            )));
        }
        details.notes.push(format!(
            "{checked} images bit-exact (official pipeline, Pillow {})",
            expected.pillow
        ));
        Ok(Outcome::Pass)
    }

    fn run_tower(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let (Some(model), Some(image), Some(numerics)) = (&self.model, &self.image, self.numerics)
        else {
            return Err(Outcome::error(
                "tower: model, image, numerics (validated on load)",
            ));
        };
        let mut caps = vec![Capability::VisionTower, numerics.capability()];
        if self.replay {
            caps.push(Capability::Replay);
        }
        if let Some(o) = require(engine, &caps) {
            return Ok(o);
        }
        if let Some(o) = require_layout(engine, ctx, model)? {
            return Ok(o);
        }
        let dir = ctx.scratch(case)?;
        let base = ctx.checkpoint(model, details)?;
        let golden_path = ctx.data(&self.golden)?;
        let golden =
            TraceFile::read(&golden_path).map_err(|e| Outcome::error(format!("golden: {e:#}")))?;
        let (checkpoint, vision) = match &self.tower_weights {
            Some(w) => {
                let weights = ctx.data(w)?;
                let grafted = dir.join("model");
                let vision = graft_tower(&base, &weights, &grafted)?;
                (grafted, vision)
            }
            None => {
                let vision = ds41_engine::vision::vision_config_from(&base)
                    .map_err(|e| Outcome::error(e.to_string()))?;
                (base, vision)
            }
        };
        // The patches come from the reference's preprocessing, which must give the golden's
        // own (so the tower is judged apart from the engine's preprocessing).
        let patches = ds41_engine::vision::load_image(&ctx.data(image)?, &vision)
            .map_err(|e| Outcome::error(e.to_string()))?;
        match self.golden_image {
            None => vg::golden_patches_match(&golden, &patches),
            Some(i) => vg::forward_golden_patches_match(&golden, i, &patches),
        }
        .map_err(|e| Outcome::error(format!("golden and image disagree: {e}")))?;
        let patch_file = dir.join("patches.safetensors");
        let bytes =
            ds41_engine::vision::patch_file::patch_file_bytes(&patches, &Default::default())
                .map_err(|e| Outcome::error(e.to_string()))?;
        std::fs::write(&patch_file, bytes).map_err(|e| Outcome::error(e.to_string()))?;
        let want = match self.golden_image {
            None => vg::golden_stages(&golden, vision.n_layers),
            Some(i) => vg::forward_golden_stages(&golden, i, vision.n_layers),
        }
        .map_err(Outcome::error)?;
        let replay = if self.replay {
            let (n_h, n_w) = patches.vit_grid();
            let file = vg::replay_file(&want, &[n_h * n_w, vision.dim]);
            let path = dir.join("replay.safetensors");
            file.write(&path)
                .map_err(|e| Outcome::error(format!("replay file: {e}")))?;
            Some(path)
        } else {
            None
        };
        let req = VisionTowerRequest {
            model: checkpoint,
            patches: patch_file,
            numerics,
            out: dir.join("engine-tower.safetensors"),
            replay,
        };
        engine
            .vision_tower(&req, timeout(case))
            .map_err(|e| engine_failure("vision_tower", e))?;
        let trace = TraceFile::read(&req.out)
            .map_err(|e| Outcome::fail(format!("vision_tower: unreadable trace: {e:#}")))?;
        let got = vg::trace_stages(&trace, vision.n_layers)
            .map_err(|e| Outcome::fail(format!("vision_tower: {e}")))?;
        let gates = ctx.gates_for(case).vision;
        let limit = if self.replay {
            gates.tower_replay_rel_l2
        } else {
            gates.tower_rel_l2
        };
        let (worst, divergence) = vg::first_divergence(&want, &got, limit);
        details.notes.push(format!(
            "{} stages, {}: worst rel L2 {worst:.2e} (limit {limit:.1e})",
            want.len(),
            if self.replay {
                "teacher-forced"
            } else {
                "end to end"
            }
        ));
        Ok(match divergence {
            None => Outcome::Pass,
            Some(d) => Outcome::fail(format!("first divergence: {d}")),
        })
    }

    fn run_span(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let Some(name) = &self.span else {
            return Err(Outcome::error("span: span (validated on load)"));
        };
        if let Some(o) = require(engine, &[Capability::VisionSpan]) {
            return Ok(o);
        }
        let path = ctx.data(&self.golden)?;
        let golden = SpanGolden::read(&path).map_err(Outcome::error)?;
        let want = golden
            .cases
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| Outcome::error(format!("{}: no case `{name}`", path.display())))?;
        let model = match (&self.model, &self.weightless) {
            (Some(m), _) => ctx.checkpoint(m, details)?,
            (None, Some(w)) => {
                let dir = ctx.scratch(case)?;
                link(&ctx.data(&w.config)?, &dir.join("config.json"))?;
                link(&ctx.data(&w.tokenizer)?, &dir.join("tokenizer.json"))?;
                dir
            }
            (None, None) => return Err(Outcome::error("span: no model (validated on load)")),
        };
        let images = want
            .images
            .iter()
            .map(|p| ctx.data(&DataRef::Repo(p.clone())))
            .collect::<Result<Vec<PathBuf>, Outcome>>()?;
        let req = VisionSpanRequest {
            model,
            prompt: want.prompt.clone(),
            images,
        };
        let answer = engine.vision_span(&req, timeout(case));
        if let Some(error) = &want.error {
            return Ok(match answer {
                Err(EngineError::Refused(m)) => {
                    details
                        .notes
                        .push(format!("refused as the official code is ({error}): {m}"));
                    Outcome::Pass
                }
                Ok(s) => Outcome::fail(format!(
                    "accepted ({} tokens) where the official code raises: {error}",
                    s.tokens.len()
                )),
                Err(e) => engine_failure("vision_span", e),
            });
        }
        let got = answer.map_err(|e| engine_failure("vision_span", e))?;
        let (Some(tokens), Some(types)) = (&want.tokens, &want.token_types) else {
            return Err(Outcome::error(format!(
                "{}: case `{name}` has neither tokens nor an error",
                path.display()
            )));
        };
        if let Some(o) = first_difference("token id", &got.tokens, tokens, types) {
            return Ok(o);
        }
        if let Some(o) = first_difference("token type", &got.token_types, types, types) {
            return Ok(o);
        }
        details.notes.push(format!(
            "{} tokens, {} images, exact",
            tokens.len(),
            want.images.len()
        ));
        Ok(Outcome::Pass)
    }
}

/// The first position where `got` differs from `want` (or the length), with the golden's token
/// type there (text, or where in an image span).
fn first_difference<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: &[T],
    types: &[i64],
) -> Option<Outcome> {
    let at = got.iter().zip(want).position(|(a, b)| a != b);
    let at = match at {
        Some(p) => p,
        None if got.len() == want.len() => return None,
        None => got.len().min(want.len()),
    };
    let kind = match types.get(at) {
        Some(-1) => "text",
        Some(0) => "image start",
        Some(1) => "image row",
        Some(2) => "image new line",
        Some(3) => "image end",
        _ => "past the end",
    };
    Some(Outcome::fail(format!(
        "{what}s differ first at position {at} ({kind}): {:?}, official {:?} ({} positions, official {})",
        got.get(at),
        want.get(at),
        got.len(),
        want.len()
    )))
}

/// A span golden (goldens/vision/span/expected.json, goldens/regen/vision_span.py).
#[derive(Deserialize)]
struct SpanGolden {
    schema: String,
    cases: Vec<SpanCase>,
}

#[derive(Deserialize)]
struct SpanCase {
    name: String,
    prompt: String,
    /// Repository paths.
    images: Vec<String>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    token_types: Option<Vec<i64>>,
    #[serde(default)]
    error: Option<String>,
}

const SPAN_SCHEMA: &str = "ds41-vision-span/1";

impl SpanGolden {
    fn read(path: &Path) -> Result<SpanGolden, String> {
        vg::read_json_golden(path, SPAN_SCHEMA, |g: &SpanGolden| &g.schema)
    }
}

/// An engine's patch file: `patches` must be BF16 (bit-exactness is judged on the bf16 values),
/// `grid` and `token_types` integers.
fn read_patch_file(path: &Path) -> Result<Preprocessed, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let patches = st
        .tensor("patches")
        .map_err(|_| "no tensor `patches`".to_string())?;
    if patches.dtype() != safetensors::Dtype::BF16 {
        return Err(format!("`patches` is {:?}, must be BF16", patches.dtype()));
    }
    let file = TraceFile::from_bytes(&bytes, path).map_err(|e| e.to_string())?;
    let ints = |name: &str| -> Result<Vec<i64>, String> {
        file.i64(name)
            .map(|(_, v)| v.to_vec())
            .ok_or_else(|| format!("no integer tensor `{name}`"))
    };
    Ok(Preprocessed {
        grid: ints("grid")?,
        patches_shape: patches.shape().to_vec(),
        patch_bytes: patches.data().to_vec(),
        token_types: ints("token_types")?,
    })
}

/// Make `out` a release checkpoint: `base`'s files (linked) with the tower of `weights` added
/// as one more shard, named in the index, and its config in `config.json` (`vision_config`)
/// and, when `base` has one, `inference/config.json` (the `vision_*` keys). Returns the
/// tower's config. The tower's aligner must have the language model's width.
fn graft_tower(
    base: &Path,
    weights: &Path,
    out: &Path,
) -> Result<ds41_engine::config::VisionConfig, Outcome> {
    let io = |p: &Path, e: std::io::Error| Outcome::error(format!("{}: {e}", p.display()));
    let json = |p: &Path, e: serde_json::Error| Outcome::error(format!("{}: {e}", p.display()));
    let bytes = std::fs::read(weights).map_err(|e| io(weights, e))?;
    let (vision, llm_dim) = vg::tower_config(&bytes).map_err(Outcome::error)?;
    let config_path = base.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).map_err(|e| io(&config_path, e))?)
            .map_err(|e| json(&config_path, e))?;
    let width = config
        .pointer("/text_config/hidden_size")
        .or_else(|| config.get("hidden_size"))
        .and_then(|v| v.as_u64());
    if width != Some(llm_dim as u64) {
        return Err(Outcome::error(format!(
            "{}: the tower's aligner has width {llm_dim}, the model's hidden_size is {width:?}",
            weights.display()
        )));
    }
    // A sharded release checkpoint: the tower becomes one more shard of its index.
    let index_path = base.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).map_err(|e| io(&index_path, e))?)
            .map_err(|e| json(&index_path, e))?;
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    for entry in std::fs::read_dir(base).map_err(|e| io(base, e))? {
        let entry = entry.map_err(|e| io(base, e))?;
        let name = entry.file_name();
        if name == "config.json" || name == "model.safetensors.index.json" || name == "inference" {
            continue;
        }
        let dst = out.join(&name);
        if !dst.exists() {
            link(&entry.path(), &dst)?;
        }
    }
    const SHARD: &str = "model-vision.safetensors";
    let shard = out.join(SHARD);
    if !shard.exists() {
        link(weights, &shard)?;
    }
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Outcome::error(format!("{}: {e}", weights.display())))?;
    for name in st.names() {
        index["weight_map"][name] = SHARD.into();
    }
    config["vision_config"] = serde_json::json!({
        "num_hidden_layers": vision.n_layers,
        "hidden_size": vision.dim,
        "num_attention_heads": vision.n_heads,
        "intermediate_size": vision.inter_dim,
        "patch_size": vision.patch_size,
        "downsample_ratio": vision.downsample_ratio,
        "max_image_tokens": vision.max_n_token,
        "min_pixels": vision.min_pixels,
        "max_wh_ratio": vision.max_wh_ratio,
        "rope_theta": vision.rope_theta,
    });
    let mut files = vec![
        (out.join("config.json"), config),
        (out.join("model.safetensors.index.json"), index),
    ];
    let inference_path = base.join("inference/config.json");
    if inference_path.is_file() {
        let mut inference: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&inference_path).map_err(|e| io(&inference_path, e))?,
        )
        .map_err(|e| json(&inference_path, e))?;
        for (key, value) in [
            ("vision_n_layers", serde_json::json!(vision.n_layers)),
            ("vision_dim", vision.dim.into()),
            ("vision_n_heads", vision.n_heads.into()),
            ("vision_inter_dim", vision.inter_dim.into()),
            ("vision_patch_size", vision.patch_size.into()),
            ("vision_downsample_ratio", vision.downsample_ratio.into()),
            ("vision_max_n_token", vision.max_n_token.into()),
            ("vision_min_pixels", vision.min_pixels.into()),
            (
                "vision_max_wh_ratio",
                serde_json::json!(vision.max_wh_ratio),
            ),
            ("vision_rope_theta", vision.rope_theta.into()),
        ] {
            inference[key] = value;
        }
        let dir = out.join("inference");
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        files.push((dir.join("config.json"), inference));
    }
    for (path, value) in &files {
        let text = serde_json::to_vec_pretty(value).map_err(|e| json(path, e))?;
        std::fs::write(path, text).map_err(|e| io(path, e))?;
    }
    Ok(vision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        crate::runner::repo_root()
    }

    /// Bit-exactness is judged on bf16 values: patches in another dtype are refused by name.
    #[test]
    fn a_patch_file_must_hold_bf16_patches() {
        use ds41_engine::trace::{safetensors_bytes, RawTensor};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let tensor = |name: &str, dtype, shape: Vec<usize>, bytes: usize| RawTensor {
            name: name.into(),
            dtype,
            shape,
            data: vec![0; bytes],
        };
        let file = |patches| {
            safetensors_bytes(
                vec![
                    patches,
                    tensor("grid", safetensors::Dtype::I64, vec![6], 48),
                    tensor("token_types", safetensors::Dtype::I64, vec![4], 32),
                ],
                &Default::default(),
            )
            .unwrap()
        };
        let shape = vec![1, 3, 14, 14];
        std::fs::write(
            &path,
            file(tensor(
                "patches",
                safetensors::Dtype::F32,
                shape.clone(),
                588 * 4,
            )),
        )
        .unwrap();
        let err = read_patch_file(&path).err().unwrap();
        assert!(err.contains("`patches` is F32, must be BF16"), "{err}");
        std::fs::write(
            &path,
            file(tensor("patches", safetensors::Dtype::BF16, shape, 588 * 2)),
        )
        .unwrap();
        assert_eq!(read_patch_file(&path).unwrap().patch_bytes.len(), 588 * 2);
    }

    /// A tower whose aligner does not have the model's width is not grafted onto it.
    #[test]
    fn a_tower_of_another_width_is_not_grafted() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("vision");
        ds41_synthetic::generate("vision", ds41_synthetic::Layout::Release, 7, &base).unwrap();
        let weights = repo().join("goldens/vision/tower/weights.safetensors");
        let err = graft_tower(&base, &weights, &dir.path().join("out"))
            .err()
            .unwrap();
        assert!(
            matches!(&err, Outcome::Error { reason } if reason.contains("aligner has width 128") && reason.contains("hidden_size is Some(64)")),
            "{err:?}"
        );
    }
}
