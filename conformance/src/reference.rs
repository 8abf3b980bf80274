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

/// Every defect the reference can inject.
pub fn defects() -> Vec<String> {
    Vec::new()
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
        BTreeSet::new()
    }

    fn load(&mut self, _req: &LoadRequest, timeout: Duration) -> EngineResult<()> {
        with_timeout(timeout, || Err(EngineError::Unsupported(Capability::Load)))
    }

    fn tokenize(
        &mut self,
        _req: &TokenizeRequest,
        _timeout: Duration,
    ) -> EngineResult<Vec<Vec<u32>>> {
        Err(EngineError::Unsupported(Capability::Tokenize))
    }

    fn render(&mut self, _req: &RenderRequest, _timeout: Duration) -> EngineResult<String> {
        Err(EngineError::Unsupported(Capability::Render))
    }

    fn parse(
        &mut self,
        _req: &ParseRequest,
        _timeout: Duration,
    ) -> EngineResult<serde_json::Value> {
        Err(EngineError::Unsupported(Capability::Parse))
    }

    fn forward(&mut self, _req: &ForwardRequest, _timeout: Duration) -> EngineResult<()> {
        Err(EngineError::Unsupported(Capability::Forward))
    }
}
