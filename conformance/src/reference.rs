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

/// Every defect the reference can inject, with a description.
pub fn defects() -> Vec<String> {
    ADAPTER_DEFECTS.iter().map(|d| d.0.to_string()).collect()
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
        Err(mpsc::RecvTimeoutError::Timeout) => Err(EngineError::Timeout(timeout)),
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
        [
            Capability::Load,
            Capability::Tokenize,
            Capability::Render,
            Capability::Parse,
        ]
        .into_iter()
        .collect()
    }

    fn load(&mut self, req: &LoadRequest, timeout: Duration) -> EngineResult<()> {
        let dir = req.model.clone();
        with_timeout(timeout, move || match ds41_engine::checkpoint::open(&dir) {
            Ok(_) => Ok(()),
            Err(e) => Err(EngineError::Refused(e.to_string())),
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

    fn forward(&mut self, _req: &ForwardRequest, _timeout: Duration) -> EngineResult<()> {
        Err(EngineError::Unsupported(Capability::Forward))
    }
}
