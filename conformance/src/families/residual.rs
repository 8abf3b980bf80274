//! Layer-residual family (CONTRACT.md §1.5): the engine's trace against a golden — per-layer
//! streams, logits and the exact discrete decisions, with fragile flips counted in bf16
//! profiles (compare.rs). Engines that dump only the last token are run once per prefix
//! length (CONTAINER.md §15: 1, 2, 3, 4 and 12 tokens).

use std::path::Path;

use crate::case::{Case, DataRef, ModelRef};
use crate::compare::{compare, compare_replay, is_required, MetricStatus};
use crate::engine_api::{Capability, Engine, ForwardRequest, RequiredCapability};
use crate::gates::{Gates, ProfileName};
use crate::outcome::Outcome;
use crate::runner::{
    engine_failure, require, require_layout, timeout, Context, Details, DivergenceRecord,
};
use crate::trace::TraceFile;

use crate::engine_api::{IndexK, Numerics};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

/// `reference`, `{file: DATA}` or `{waste_oracle: {dir: DATA, variant: as_shipped|owner}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GoldenSpec {
    /// Computed live by the built-in reference engine (test-backend-ops style).
    Reference,
    /// A trace-format safetensors golden.
    File(DataRef),
    /// The WASTE oracle's raw f32 outputs (CONTAINER.md §10.4).
    WasteOracle { dir: DataRef, variant: String },
}

impl<'de> Deserialize<'de> for GoldenSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Waste {
            dir: DataRef,
            variant: String,
        }
        let v = serde_yaml::Value::deserialize(d)?;
        let expected = "`reference`, `{file: DATA}` or `{waste_oracle: {dir: DATA, variant: as_shipped|owner}}`";
        match &v {
            serde_yaml::Value::String(s) if s == "reference" => Ok(GoldenSpec::Reference),
            serde_yaml::Value::Mapping(m) if m.len() == 1 => {
                let (k, inner) = m.iter().next().unwrap();
                match k.as_str() {
                    Some("file") => Ok(GoldenSpec::File(
                        DataRef::deserialize(inner.clone()).map_err(D::Error::custom)?,
                    )),
                    Some("waste_oracle") => {
                        let w = Waste::deserialize(inner.clone()).map_err(D::Error::custom)?;
                        if !matches!(w.variant.as_str(), "as_shipped" | "owner") {
                            return Err(D::Error::custom(format!(
                                "waste_oracle variant `{}` is not as_shipped or owner",
                                w.variant
                            )));
                        }
                        Ok(GoldenSpec::WasteOracle {
                            dir: w.dir,
                            variant: w.variant,
                        })
                    }
                    _ => Err(D::Error::custom(format!("expected {expected}"))),
                }
            }
            _ => Err(D::Error::custom(format!("expected {expected}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualSpec {
    pub model: ModelRef,
    pub golden: GoldenSpec,
    /// Token ids; omit to use the golden's `input_ids`.
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    /// First chunk size, inside 1..=tokens (None: the golden's stated one, else all tokens in
    /// one prefill).
    #[serde(default)]
    pub prefill: Option<usize>,
    pub numerics: Numerics,
    pub index_k: IndexK,
    /// For engines that dump the last token only: run once per prefix length.
    #[serde(default)]
    pub prefix_lengths: Vec<usize>,
    /// A file with the Engram token map to use instead of the checkpoint's own (int32 `.npy`,
    /// or a safetensors file with an `engram_token_map` tensor): a map from elsewhere, e.g.
    /// another tokenizer's.
    #[serde(default)]
    pub engram_token_map: Option<DataRef>,
    /// Dump tensors the engine must provide (a missing one is NotSupported, never Pass).
    #[serde(default = "default_require")]
    pub require: Vec<String>,
    /// Teacher-forced replay (compare.py `--replay`): the engine recomputes every block from
    /// the golden's own `block_input` / `pre_mix` (capability `replay`) and is judged per
    /// cell by the profile's `replay` thresholds. Needs a `{file: ...}` golden carrying them.
    #[serde(default)]
    pub replay: bool,
    /// The golden and every engine run on this case break exact ties by the canonical rule
    /// (largest first, equal values -> lower index): decisions at golden margin 0 are then
    /// compared strictly instead of excused (CONTRACT.md §4).
    #[serde(default)]
    pub canonical_ties: bool,
    /// Image files, in prompt order, for a golden with image spans (MODEL.md §10.2): the
    /// tokens are the golden's `input_ids` with each span (its `token_types`) folded back to
    /// one marker, the prefill counted likewise, and the engine expands them (capability
    /// `vision.forward`).
    #[serde(default)]
    pub images: Vec<DataRef>,
}

fn default_require() -> Vec<String> {
    vec!["logits".into()]
}

impl super::CheckFamily for ResidualSpec {
    fn models(&self) -> Vec<ModelRef> {
        vec![self.model.clone()]
    }

    fn data(&self) -> Vec<&DataRef> {
        let golden = match &self.golden {
            GoldenSpec::Reference => None,
            GoldenSpec::File(d) => Some(d),
            GoldenSpec::WasteOracle { dir, .. } => Some(dir),
        };
        golden
            .into_iter()
            .chain(&self.engram_token_map)
            .chain(&self.images)
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        if let Some(t) = &s.tokens {
            if t.is_empty() {
                return Err("field `tokens`: empty".into());
            }
            if let Some(p) = s.prefill {
                if p == 0 || p > t.len() {
                    return Err(format!(
                        "field `prefill`: {p} is not inside 1..={}",
                        t.len()
                    ));
                }
            }
            if let Some(&bad) = s.prefix_lengths.iter().find(|&&k| k == 0 || k > t.len()) {
                return Err(format!(
                    "field `prefix_lengths`: {bad} is not inside 1..={}",
                    t.len()
                ));
            }
        } else if matches!(s.golden, GoldenSpec::Reference) {
            return Err("field `tokens`: required when the golden is the live reference".into());
        }
        if s.replay {
            if !matches!(s.golden, GoldenSpec::File(_)) {
                return Err(
                    "field `replay`: needs a `{file: ...}` golden with block_input and pre_mix"
                        .into(),
                );
            }
            if s.tokens.is_some() || !s.prefix_lengths.is_empty() {
                return Err("field `replay`: the tokens are the golden's `input_ids`; give neither `tokens` nor `prefix_lengths`".into());
            }
        }
        if !s.images.is_empty()
            && (!matches!(s.golden, GoldenSpec::File(_))
                || s.tokens.is_some()
                || !s.prefix_lengths.is_empty())
        {
            return Err(
                "field `images`: needs a `{file: ...}` golden with `token_types` (its \
                        input ids are the tokens) and neither `tokens` nor `prefix_lengths`"
                    .into(),
            );
        }
        let known = crate::engine_api::TRACE_TENSORS.map(|(n, _)| n);
        if let Some(bad) = s.require.iter().find(|r| !known.contains(&r.as_str())) {
            return Err(format!(
                "field `require`: unknown dump tensor `{bad}` (known: {})",
                known.join(", ")
            ));
        }
        Ok(())
    }

    fn default_profile(&self) -> ProfileName {
        super::profile_of(self.numerics)
    }

    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let s = self;
        let mut caps = vec![Capability::Forward];
        // In the quantized profile the requested numerics are advisory: the engine runs what it runs.
        if ctx.run_profile < ProfileName::Quantized {
            caps.push(s.numerics.capability());
        }
        caps.push(s.index_k.capability());
        caps.extend(trace_capabilities(s));
        if s.replay {
            caps.push(Capability::Replay);
        }
        if !s.images.is_empty() {
            caps.push(Capability::VisionForward);
        }
        if let Some(o) = require(engine, &caps) {
            return Ok(o);
        }
        if let Some(o) = require_layout(engine, ctx, &s.model)? {
            return Ok(o);
        }
        let model = ctx.checkpoint(&s.model, details)?;
        let dir = ctx.scratch(case)?;
        let token_map = match &s.engram_token_map {
            Some(d) => Some(ctx.data(d)?),
            None => None,
        };
        let mut golden = load_golden(s, &model, ctx, &dir, case)?;
        note_engram_layers(&mut golden, &model);
        let images = s
            .images
            .iter()
            .map(|d| ctx.data(d))
            .collect::<Result<Vec<_>, Outcome>>()?;
        // With images: the prompt with one marker per span, the prefill likewise, and the
        // number of positions the engine expands it to.
        let image_prompt = if images.is_empty() {
            None
        } else {
            Some(image_prompt(&golden, s.prefill)?)
        };
        let tokens: Vec<u32> = match (&s.tokens, &image_prompt) {
            (_, Some((folded, _, _))) => folded.clone(),
            (Some(t), None) => t.clone(),
            (None, None) => golden
                .get("input_ids")
                .ok_or_else(|| {
                    Outcome::error("case gives no tokens and the golden has no `input_ids`")
                })?
                .as_i64()
                .iter()
                .map(|&x| x as u32)
                .collect(),
        };
        let prefill = match &image_prompt {
            Some((_, p, _)) => *p,
            None => schedule_prefill(s.prefill, &golden, tokens.len(), details)?,
        };
        let positions = image_prompt.as_ref().map_or(tokens.len(), |p| p.2);
        if prefill > 1 && !engine.capabilities().contains(&Capability::Prefill) {
            return Ok(Outcome::not_supported(Capability::Prefill.as_str()));
        }
        let gates = gates_for(case, s, ctx);
        let golden_tokens = golden
            .get("residual")
            .map(|r| r.shape[0])
            .unwrap_or(tokens.len());
        if golden_tokens < positions {
            return Err(Outcome::error(format!(
                "golden covers {golden_tokens} tokens, the case runs {positions}"
            )));
        }
        let golden = golden.select_tokens(&(0..positions).collect::<Vec<_>>());
        if s.replay {
            return replay(
                case, s, engine, ctx, details, &golden, tokens, prefill, &images, &dir,
            );
        }

        let run = |engine: &mut dyn Engine, n: usize| -> Result<TraceFile, Outcome> {
            let req = ForwardRequest {
                model: model.clone(),
                tokens: tokens[..n].to_vec(),
                prefill: Some(prefill.min(n)),
                numerics: s.numerics,
                index_k: s.index_k,
                out: dir.join(format!("engine-{n}.safetensors")),
                save_state: None,
                load_state: None,
                replay: None,
                engram_token_map: token_map.clone(),
                images: images.clone(),
            };
            engine
                .forward(&req, timeout(case))
                .map_err(|e| engine_failure("forward", e))?;
            TraceFile::read(&req.out)
                .map_err(|e| Outcome::fail(format!("forward: unreadable trace: {e:#}")))
        };
        let full = run(engine, tokens.len())?;
        check_required(&full, s)?;
        let rows = full
            .get("residual")
            .map(|r| r.shape[0])
            .or_else(|| full.get("logits").map(|l| l.shape[0]))
            .unwrap_or(0);
        let mut failed = false;
        if rows >= positions || positions == 1 {
            let r = compare(&golden, &full, &gates);
            failed |= r.failed();
            details.absorb(&format!("{positions} tokens"), &r);
        } else {
            // A last-token-only engine: one run per prefix length, each against that token.
            let mut lengths = s.prefix_lengths.clone();
            if lengths.is_empty() {
                lengths.push(tokens.len());
            }
            details.notes.push(format!(
                "the engine dumps the last token only; comparing prefix lengths {lengths:?}"
            ));
            for &n in &lengths {
                let t = if n == tokens.len() {
                    full.clone()
                } else {
                    run(engine, n)?
                };
                let r = compare(
                    &golden.select_tokens(&[n - 1]),
                    &last_token_view(&t, n),
                    &gates,
                );
                failed |= r.failed();
                details.absorb(&format!("prefix {n}"), &r);
            }
        }
        note_flips(details, &gates);
        Ok(verdict(details, failed, s))
    }
}

/// Teacher-forced replay: one run recomputing every block from the golden's own inputs,
/// compared cell by cell (compare.rs `compare_replay`).
#[allow(clippy::too_many_arguments)]
fn replay(
    case: &Case,
    s: &ResidualSpec,
    engine: &mut dyn Engine,
    ctx: &Context,
    details: &mut Details,
    golden: &TraceFile,
    tokens: Vec<u32>,
    prefill: usize,
    images: &[std::path::PathBuf],
    dir: &Path,
) -> Result<Outcome, Outcome> {
    let GoldenSpec::File(g) = &s.golden else {
        return Err(Outcome::error("replay needs a golden file"));
    };
    let n = golden.get("residual").map_or(tokens.len(), |r| r.shape[0]);
    let req = ForwardRequest {
        model: ctx.model(&s.model)?,
        tokens,
        prefill: Some(prefill),
        numerics: s.numerics,
        index_k: s.index_k,
        out: dir.join("engine-replay.safetensors"),
        save_state: None,
        load_state: None,
        replay: Some(ctx.data(g)?),
        engram_token_map: match &s.engram_token_map {
            Some(d) => Some(ctx.data(d)?),
            None => None,
        },
        images: images.to_vec(),
    };
    engine
        .forward(&req, timeout(case))
        .map_err(|e| engine_failure("forward (replay)", e))?;
    let trace = TraceFile::read(&req.out)
        .map_err(|e| Outcome::fail(format!("forward (replay): unreadable trace: {e:#}")))?;
    check_required(&trace, s)?;
    let gates = gates_for(case, s, ctx);
    let r = compare_replay(golden, &trace, &gates);
    details.absorb(&format!("replay of {n} tokens"), &r);
    note_flips(details, &gates);
    Ok(verdict(details, r.failed(), s))
}

/// The first chunk the case runs over its `n` tokens: the case's `prefill`, else the one the
/// golden states it was made with (metadata `prefill`), else all `n` in one chunk. Outside
/// `1..=n` is an error of the case (never clamped). A case may run another schedule than its
/// golden's (causal attention makes prefill rows equal decode rows), but the golden's as-shipped
/// index-key hand-off and its logits rows belong to its own, so that is noted.
fn schedule_prefill(
    case: Option<usize>,
    golden: &TraceFile,
    n: usize,
    details: &mut Details,
) -> Result<usize, Outcome> {
    let stated = golden
        .prefill()
        .map_err(|e| Outcome::error(format!("golden: {e}")))?;
    let (prefill, source) = match (case, stated) {
        (Some(p), _) => (p, "field `prefill`"),
        (None, Some(g)) => (g, "the golden's metadata `prefill`"),
        (None, None) => (n, "the case's tokens"),
    };
    if prefill == 0 || prefill > n {
        return Err(Outcome::error(format!(
            "{source}: {prefill} is not inside 1..={n} (the tokens the case runs)"
        )));
    }
    if let Some(g) = stated.filter(|&g| g != prefill) {
        details.notes.push(format!(
            "the case runs prefill {prefill}; the golden was made with prefill {g} (its metadata), \
             whose as-shipped index-key hand-off and logits rows may differ from this schedule's"
        ));
    }
    Ok(prefill)
}

/// A golden with image spans as a prompt: its input ids with each span folded to one marker,
/// the prefill in those units (the case's, else the golden's), and the expanded length.
fn image_prompt(
    golden: &TraceFile,
    prefill: Option<usize>,
) -> Result<(Vec<u32>, usize, usize), Outcome> {
    use ds41_engine::model::job::{fold_spans, folded_prefill};
    let bad = |e: ds41_engine::Error| Outcome::error(format!("golden: {e}"));
    let ids = golden.input_ids().map_err(bad)?;
    let (folded, spans) = fold_spans(golden, &ids).map_err(bad)?;
    let prefill = match prefill {
        Some(p) => p,
        None => folded_prefill(golden.prefill().map_err(bad)?.unwrap_or(ids.len()), &spans),
    };
    Ok((folded, prefill, ids.len()))
}

/// The case verdict: Pass, or Fail naming the first divergence, every failing metric and
/// every required tensor that compared nothing (insufficient coverage: never a pass).
fn verdict(details: &Details, failed: bool, s: &ResidualSpec) -> Outcome {
    let mut reason = String::new();
    if failed {
        if let Some(DivergenceRecord { run, at }) = &details.first_divergence {
            reason += &format!("[{run}] first divergence at {}", at.headline());
        }
        for m in details.metrics.iter().filter(|m| m.status.fails()) {
            reason += &format!("\n[{}] {}: {}", m.run, m.name, m.text);
        }
    }
    let required = |name: &str| is_required(name, &s.require);
    for m in details
        .metrics
        .iter()
        .filter(|m| m.status == MetricStatus::Vacuous && required(&m.name))
    {
        reason += &format!(
            "\n[{}] insufficient coverage: the case requires `{}`, and nothing of it was compared ({})",
            m.run, m.name, m.text
        );
    }
    for r in &s.require {
        let judged = details.metrics.iter().any(|m| {
            is_required(&m.name, std::slice::from_ref(r)) && m.status != MetricStatus::NotChecked
        });
        if !judged {
            reason += &format!(
                "\ninsufficient coverage: the case requires `{r}`, and no comparison judged it \
                 (the golden has none to compare)"
            );
        }
    }
    if reason.is_empty() {
        Outcome::Pass
    } else {
        Outcome::fail(reason.trim().to_string())
    }
}

/// Note the excused flips of every run, exact ties apart.
fn note_flips(details: &mut Details, gates: &Gates) {
    if details.fragile_flips > 0 {
        details.notes.push(format!(
            "{} decision flips excused (profile {}), {} of them exact ties (golden margin 0){}",
            details.fragile_flips,
            gates.profile,
            details.exact_ties,
            if gates.decisions.strict_ties {
                ""
            } else {
                "; the cells they feed are skipped"
            }
        ));
    }
}

/// The case's gates; exact ties are strict when the run or the case says the engine follows
/// the canonical tie rule.
fn gates_for(case: &Case, s: &ResidualSpec, ctx: &Context) -> Gates {
    let mut g = ctx.gates_for(case);
    g.decisions.strict_ties |= ctx.canonical_ties || s.canonical_ties;
    g
}

/// A last-token-only trace may still carry per-token tensors (e.g. a route dump appended at
/// every step): keep only their last row so they line up with the last-token golden.
fn last_token_view(t: &TraceFile, n: usize) -> TraceFile {
    let mut out = t.clone();
    for (name, x) in out.tensors.iter_mut() {
        if n > 1 && x.shape.first() == Some(&n) && !name.starts_with("logits") {
            *x = x.select_rows(&[n - 1]);
        }
    }
    out
}

/// The trace capabilities a case needs: one per tensor it requires (docs/TRACE.md), so an
/// engine that dumps only some tensors is NotSupported on the cases needing the others.
pub fn trace_capabilities(s: &ResidualSpec) -> Vec<Capability> {
    let mut caps: Vec<Capability> = s
        .require
        .iter()
        .filter_map(|r| Capability::for_trace_tensor(r))
        .collect();
    caps.sort();
    caps.dedup();
    caps
}

fn check_required(t: &TraceFile, s: &ResidualSpec) -> Result<(), Outcome> {
    for r in &s.require {
        let present = if r == "topk" || r == "candidates" {
            let prefix = format!("{r}.L");
            t.tensors.keys().any(|k| k.starts_with(&prefix))
        } else {
            t.get(r).is_some()
        };
        if !present {
            return Err(Outcome::fail(format!(
                "the engine's trace lacks `{r}`, which this case requires"
            )));
        }
    }
    Ok(())
}

fn load_golden(
    s: &ResidualSpec,
    model: &Path,
    ctx: &Context,
    dir: &Path,
    case: &Case,
) -> Result<TraceFile, Outcome> {
    match &s.golden {
        GoldenSpec::File(d) => {
            let p = ctx.data(d)?;
            let golden =
                TraceFile::read(&p).map_err(|e| Outcome::error(format!("golden: {e:#}")))?;
            // A golden is data a user may bring: rows misaligned with its positions are its
            // error, not a divergence of the engine.
            golden
                .check_position_rows()
                .map_err(|e| Outcome::error(format!("golden: {e}")))?;
            Ok(golden)
        }
        GoldenSpec::WasteOracle { dir: odir, variant } => {
            let p = ctx.data(odir)?;
            let d = model_dims(model).map_err(|e| Outcome::error(format!("{e:#}")))?;
            crate::trace::waste_oracle_golden(&p, variant, d.vocab, d.layers, d.hc, d.dim)
                .map_err(|e| Outcome::error(format!("golden: {e:#}")))
        }
        GoldenSpec::Reference => {
            let tokens = s
                .tokens
                .clone()
                .ok_or_else(|| Outcome::error("live golden needs tokens"))?;
            let req = ForwardRequest {
                model: model.to_path_buf(),
                prefill: Some(s.prefill.unwrap_or(tokens.len())),
                tokens,
                numerics: s.numerics,
                index_k: s.index_k,
                out: dir.join("golden-reference.safetensors"),
                save_state: None,
                load_state: None,
                replay: None,
                engram_token_map: None,
                images: Vec::new(),
            };
            let mut reference = ctx
                .reference
                .lock()
                .map_err(|_| Outcome::error("reference engine lock poisoned"))?;
            reference.forward(&req, timeout(case)).map_err(|e| {
                Outcome::error(format!(
                    "the built-in reference could not make the golden: {e}"
                ))
            })?;
            TraceFile::read(&req.out).map_err(|e| Outcome::error(format!("golden: {e:#}")))
        }
    }
}

/// The sizes a raw golden needs, read from the checkpoint's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub vocab: usize,
    pub layers: usize,
    pub hc: usize,
    pub dim: usize,
}

/// Read vocab, layer count, hc_mult and width from `config.json` (root or `text_config`) or
/// a container's `manifest.json` `config` (HF key names). Lenient on purpose: a command
/// profile needs only these four to lay out an engine's raw outputs.
pub fn model_dims(model: &Path) -> anyhow::Result<Dims> {
    let (file, key) = if model.join("manifest.json").exists() {
        (model.join("manifest.json"), Some("config"))
    } else {
        (model.join("config.json"), None)
    };
    let text =
        std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let root: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut cfg = match key {
        Some(k) => root[k].clone(),
        None => root.clone(),
    };
    if cfg.get("text_config").is_some() {
        cfg = cfg["text_config"].clone();
    }
    let get = |names: &[&str]| -> anyhow::Result<usize> {
        names
            .iter()
            .find_map(|n| cfg.get(*n).and_then(|v| v.as_u64()))
            .map(|v| v as usize)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: config has none of the fields {names:?}",
                    file.display()
                )
            })
    };
    Ok(Dims {
        vocab: get(&["vocab_size"])?,
        layers: get(&["num_hidden_layers", "n_layers"])?,
        hc: get(&["hc_mult"])?,
        dim: get(&["hidden_size", "dim"])?,
    })
}

/// Name the model's Engram layers in the golden's metadata (unless the golden names its own),
/// so an Engram hash divergence is placed at the layer that reads it. A model whose config
/// cannot be read leaves the golden as it is: the divergence then sits before the blocks.
fn note_engram_layers(golden: &mut TraceFile, model: &Path) {
    use crate::compare::ENGRAM_LAYERS_METADATA;
    if golden.metadata.contains_key(ENGRAM_LAYERS_METADATA) {
        return;
    }
    if let Ok(c) = ds41_engine::checkpoint::read_config(model) {
        let ids: Vec<String> = c.engram_layer_ids.iter().map(usize::to_string).collect();
        golden
            .metadata
            .insert(ENGRAM_LAYERS_METADATA.into(), ids.join(","));
    }
}

#[cfg(test)]
mod engram_layer_tests {
    use super::*;

    /// The golden learns the model's Engram layers from its config (both layouts), and keeps
    /// layers it names itself.
    #[test]
    fn the_golden_is_told_the_models_engram_layers() {
        use crate::compare::ENGRAM_LAYERS_METADATA;
        let tmp = tempfile::tempdir().unwrap();
        for layout in ["release", "container"] {
            let dir = tmp.path().join(layout);
            crate::synthetic::generate("tiny", layout, 1, &dir).unwrap();
            let want = ds41_engine::checkpoint::read_config(&dir)
                .unwrap()
                .engram_layer_ids
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",");
            assert!(!want.is_empty(), "tiny has Engram layers");
            let mut g = TraceFile::default();
            note_engram_layers(&mut g, &dir);
            assert_eq!(g.metadata[ENGRAM_LAYERS_METADATA], want, "{layout}");
            g.metadata.insert(ENGRAM_LAYERS_METADATA.into(), "7".into());
            note_engram_layers(&mut g, &dir);
            assert_eq!(g.metadata[ENGRAM_LAYERS_METADATA], "7");
        }
        // An unreadable model leaves the golden alone.
        let mut g = TraceFile::default();
        note_engram_layers(&mut g, tmp.path());
        assert!(g.metadata.is_empty());
    }
}
