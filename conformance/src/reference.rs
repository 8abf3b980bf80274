//! The built-in reference engine behind the `Engine` trait, in process (CONTRACT.md §2a).
//! Each capability is wired to the engine module that implements it; a module that has not
//! landed yet leaves its capability out, so its cases are NotSupported rather than passed.
//! Each call runs on a worker thread so a case timeout is enforced even in process.

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use crate::engine_api::*;

/// An injected defect for negative controls (CONTRACT.md §7), by name.
pub type DefectName = String;

#[derive(Clone, Default)]
pub struct ReferenceEngine {
    pub defect: Option<DefectName>,
}

impl ReferenceEngine {
    pub fn new() -> ReferenceEngine {
        ReferenceEngine { defect: None }
    }

    /// The reference with one injected defect (see `defects()`).
    pub fn with_defect(name: &str) -> anyhow::Result<ReferenceEngine> {
        if !defects().iter().any(|d| d == name) {
            anyhow::bail!("unknown defect `{name}` (known: {})", defects().join(", "));
        }
        Ok(ReferenceEngine {
            defect: Some(name.to_string()),
        })
    }
}

/// Defects injected by this adapter around engine modules that have no defect switch of
/// their own: the tokenizer's text path and the DSML renderer's tag spelling.
pub const ADAPTER_DEFECTS: [(&str, &str); 2] = [
    (
        "text-path-allows-control-tokens",
        "tokenize's text path recognises added/control tokens (encode_markup)",
    ),
    (
        "dsml-v4-tag-spelling",
        "rendered tool calls use the V4 spellings `<｜DSML｜tool_calls>` / `invoke` / `parameter`",
    ),
];

/// Every defect the reference can inject: the forward pass's own (`engine::model::Defect`,
/// with the Sinkhorn count fixed at 19 of 20) and the adapter's.
pub fn defects() -> Vec<String> {
    ds41_engine::model::Defect::ALL_NAMES
        .iter()
        .map(|d| {
            if *d == "sinkhorn-iters=N" {
                "sinkhorn-iters=19".to_string()
            } else {
                d.to_string()
            }
        })
        .chain(ADAPTER_DEFECTS.iter().map(|d| d.0.to_string()))
        .collect()
}

/// Run `f` on a worker thread; give up after `timeout` (the thread is left to finish).
fn with_timeout<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> EngineResult<T> + Send + 'static,
) -> EngineResult<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("ds41-reference-call".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                Err(EngineError::Crashed(format!(
                    "reference panicked: {}",
                    panic_text(&p)
                )))
            });
            let _ = tx.send(r);
        })
        .map_err(|e| EngineError::Failed(format!("cannot start a worker thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(EngineError::Timeout(timeout, None)),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(EngineError::Crashed("worker thread vanished".into()))
        }
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

impl Engine for ReferenceEngine {
    fn identity(&self) -> EngineIdentity {
        EngineIdentity {
            name: ds41_engine::ENGINE_NAME.into(),
            version: ds41_engine::ENGINE_VERSION.into(),
            commit: option_env!("DS41_GIT_COMMIT").map(String::from),
            driver: match &self.defect {
                None => "reference".into(),
                Some(d) => format!("reference with injected defect `{d}`"),
            },
        }
    }

    fn capabilities(&self) -> BTreeSet<Capability> {
        use Capability::*;
        [
            Load,
            LoadVerify,
            LayoutRelease,
            LayoutContainer,
            Tokenize,
            Render,
            Parse,
            Forward,
            Trace,
            TraceLogits,
            TraceResidual,
            TraceExperts,
            TraceTopk,
            TraceEngramHash,
            TraceSubOps,
            Prefill,
            State,
            Replay,
            NumericsExact,
            NumericsUpstream,
            IndexKAsShipped,
            IndexKOwner,
            EngramHash,
            Dspark,
        ]
        .into_iter()
        .collect()
    }

    fn load(&mut self, req: &LoadRequest, timeout: Duration) -> EngineResult<()> {
        use ds41_engine::checkpoint::{self, ContainerCheckpoint, Layout};
        let (dir, verify) = (req.model.clone(), req.verify);
        with_timeout(timeout, move || {
            let refused = |e: ds41_engine::Error| EngineError::Refused(e.to_string());
            // Opening reads headers and the index only; the CRC of every expert record is a
            // read-time check, run on request (`ds41 inspect --verify`).
            if verify && checkpoint::detect_layout(&dir).map_err(refused)? == Layout::Container {
                let c = ContainerCheckpoint::open(&dir).map_err(refused)?;
                c.verify_all_crc().map_err(refused)?;
                return Ok(());
            }
            checkpoint::open(&dir).map(|_| ()).map_err(refused)
        })
    }

    fn tokenize(
        &mut self,
        req: &TokenizeRequest,
        timeout: Duration,
    ) -> EngineResult<Vec<Vec<u32>>> {
        let req = req.clone();
        let markup =
            req.markup || self.defect.as_deref() == Some("text-path-allows-control-tokens");
        with_timeout(timeout, move || {
            let file = if req.tokenizer.is_dir() {
                req.tokenizer.join("tokenizer.json")
            } else {
                req.tokenizer.clone()
            };
            let tok = ds41_engine::tokenizer::Tokenizer::from_file(&file)
                .map_err(|e| EngineError::Refused(e.to_string()))?;
            Ok(req
                .texts
                .iter()
                .map(|t| {
                    if markup {
                        tok.encode_markup(t)
                    } else {
                        tok.encode_text(t)
                    }
                })
                .collect())
        })
    }

    fn render(&mut self, req: &RenderRequest, timeout: Duration) -> EngineResult<String> {
        use ds41_engine::dsml;
        let req = req.clone();
        let v4_tags = self.defect.as_deref() == Some("dsml-v4-tag-spelling");
        with_timeout(timeout, move || {
            let refuse = |e: dsml::Error| {
                EngineError::Refused(e.reference_error().unwrap_or_else(|| e.to_string()))
            };
            let mode: dsml::ThinkingMode = req
                .thinking_mode
                .as_deref()
                .unwrap_or("chat")
                .parse()
                .map_err(refuse)?;
            let effort = match &req.reasoning_effort {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(s)) => {
                    Some(s.parse::<dsml::ReasoningEffort>().map_err(refuse)?)
                }
                Some(v) => Some(
                    v.to_string()
                        .parse::<dsml::ReasoningEffort>()
                        .map_err(refuse)?,
                ),
            };
            let case = dsml::load_case(&req.conversation.to_string()).map_err(refuse)?;
            let prompt = dsml::render(&case.conversation, &case.options(mode, effort))
                .map_err(refuse)?
                .to_string();
            Ok(if v4_tags {
                prompt
                    .replace("｜DSML｜ calls>", "｜DSML｜tool_calls>")
                    .replace("｜DSML｜ invoke", "｜DSML｜invoke")
                    .replace("｜DSML｜ parameter", "｜DSML｜parameter")
            } else {
                prompt
            })
        })
    }

    fn parse(&mut self, req: &ParseRequest, timeout: Duration) -> EngineResult<serde_json::Value> {
        use ds41_engine::dsml;
        let req = req.clone();
        with_timeout(timeout, move || {
            let thinking = if req.thinking {
                dsml::ThinkingMode::Thinking
            } else {
                dsml::ThinkingMode::Chat
            };
            let mode = if req.tolerant {
                dsml::ParseMode::tolerant(thinking)
            } else {
                dsml::ParseMode::strict(thinking)
            };
            match dsml::parse(&req.completion, mode) {
                Ok(m) => Ok(m.to_json()),
                Err(e) => Err(EngineError::Refused(
                    e.reference_error().unwrap_or_else(|| e.to_string()),
                )),
            }
        })
    }

    fn forward(&mut self, req: &ForwardRequest, timeout: Duration) -> EngineResult<()> {
        let req = req.clone();
        let defect = self.defect.clone();
        with_timeout(timeout, move || forward(&req, defect.as_deref()))
    }

    fn engram_hash(
        &mut self,
        req: &EngramHashRequest,
        timeout: Duration,
    ) -> EngineResult<EngramHashes> {
        let req = req.clone();
        let defect = self.defect.clone();
        with_timeout(timeout, move || engram_hash(&req, defect.as_deref()))
    }

    fn dspark(&mut self, req: &DsparkRequest, timeout: Duration) -> EngineResult<()> {
        let req = req.clone();
        let defect = self.defect.clone();
        with_timeout(timeout, move || dspark(&req, defect.as_deref()))
    }
}

/// The DSpark draft head over the request's schedule (PROTOCOL.md `dspark`): bad input (no
/// DSpark stages, a container, a prefill outside the tokens) is refused with the reason.
fn dspark(req: &DsparkRequest, defect: Option<&str>) -> EngineResult<()> {
    use ds41_engine::model::{dspark::trace, Model, Options};
    let refused = |e: ds41_engine::Error| EngineError::Refused(e.to_string());
    let model = Model::open(&req.model).map_err(refused)?;
    let golden = match &req.replay {
        Some(p) => Some(ds41_engine::trace::TraceFile::read(p).map_err(refused)?),
        None => None,
    };
    let options = Options {
        numerics: req.numerics,
        defects: forward_defects(defect),
        ..Options::default()
    };
    let t =
        trace::run(&model, &options, &req.tokens, req.prefill, golden.as_ref()).map_err(refused)?;
    t.write(&req.out)
        .map_err(|e| EngineError::Failed(e.to_string()))
}

/// The defects of the forward pass named by `defect` (adapter defects act elsewhere).
fn forward_defects(defect: Option<&str>) -> ds41_engine::model::DefectSet {
    use ds41_engine::model::{Defect, DefectSet};
    match defect.map(|d| d.parse::<Defect>()) {
        Some(Ok(d)) => DefectSet::new([d]),
        _ => DefectSet::none(),
    }
}

/// Does `dir` hold weights (a release checkpoint or a container)? A directory with only a
/// `config.json` and a tokenizer is a weightless model: enough for Engram hashing.
fn has_weights(dir: &std::path::Path) -> bool {
    [
        "model.safetensors",
        "model.safetensors.index.json",
        "manifest.json",
    ]
    .iter()
    .any(|f| dir.join(f).is_file())
}

/// Engram hash ids (PROTOCOL.md `engram_hash`) with the engine's own hashing function, so an
/// injected `engram-pad-not-latching` acts here exactly as in a forward pass.
fn engram_hash(req: &EngramHashRequest, defect: Option<&str>) -> EngineResult<EngramHashes> {
    use ds41_engine::model::engram::DEAD;
    use ds41_engine::model::{EngramHasher, Model};
    let refused = |e: ds41_engine::Error| EngineError::Refused(e.to_string());
    let defects = forward_defects(defect);
    let token_map = token_map_source(&req.engram_token_map);
    let hasher = if has_weights(&req.model) {
        let model = Model::open_with_token_map(&req.model, token_map).map_err(refused)?;
        model.engram_hasher().cloned().ok_or_else(|| {
            EngineError::Refused(format!(
                "{}: the model has no Engram layers",
                req.model.display()
            ))
        })?
    } else {
        EngramHasher::for_weightless_release(&req.model, &token_map).map_err(refused)?
    };
    let n = req.tokens.len();
    if let Some(&p) = req.dead.iter().find(|&&p| p >= n) {
        return Err(EngineError::Refused(format!(
            "dead position {p} is outside the {n} tokens"
        )));
    }
    let history = req
        .tokens
        .iter()
        .enumerate()
        .map(|(p, &t)| {
            if req.dead.contains(&p) {
                Ok(DEAD)
            } else {
                hasher.compressed_id(t)
            }
        })
        .collect::<ds41_engine::Result<Vec<i64>>>()
        .map_err(refused)?;
    let cols = hasher.columns();
    Ok((0..n)
        .map(|p| {
            (0..hasher.layers.len())
                .map(|li| {
                    let mut row = vec![0i64; cols];
                    hasher.hash(&history, p, li, &defects, &mut row);
                    row
                })
                .collect()
        })
        .collect())
}

/// The Engram token map a request names: the file, else the model's own.
fn token_map_source(file: &Option<std::path::PathBuf>) -> ds41_engine::model::TokenMap {
    use ds41_engine::model::TokenMap;
    file.clone()
        .map_or(TokenMap::FromCheckpoint, TokenMap::File)
}

/// One forward request, run as `ds41 forward` runs it (the engine's `ForwardJob`), sub-ops
/// recorded.
pub fn forward_job(req: &ForwardRequest, defect: Option<&str>) -> ds41_engine::model::ForwardJob {
    use ds41_engine::model::{ForwardJob, Options};
    ForwardJob {
        model: req.model.clone(),
        tokens: req.tokens.clone(),
        prefill: req.prefill,
        options: Options {
            numerics: req.numerics,
            index_k: req.index_k,
            defects: forward_defects(defect),
        },
        token_map: token_map_source(&req.engram_token_map),
        replay: req.replay.clone(),
        load_state: req.load_state.clone(),
        save_state: req.save_state.clone(),
        sub_ops: true,
        images: Vec::new(),
    }
}

fn forward(req: &ForwardRequest, defect: Option<&str>) -> EngineResult<()> {
    use ds41_engine::model::JobError;
    let out = forward_job(req, defect).run().map_err(|e| match e {
        JobError::Refused(e) => EngineError::Refused(e.to_string()),
        JobError::Failed(e) => EngineError::Failed(e.to_string()),
    })?;
    out.trace
        .write(&req.out)
        .map_err(|e| EngineError::Failed(e.to_string()))
}
