//! The forward job: one request (model, tokens, schedule, options, replay or state files) in,
//! one trace (docs/TRACE.md) out. `ds41 forward` and the harness's in-process reference both
//! run exactly this, so what `certify` checks is what the command computes.

use std::path::PathBuf;

use super::{Forcing, Model, Options, Session, TokenMap};
use crate::trace::{Trace, TraceFile, TraceOptions};
use crate::Error;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct ForwardJob {
    /// Checkpoint directory (release layout or WASTE container).
    pub model: PathBuf,
    /// Token ids. Empty with `replay`: the golden's `input_ids`.
    pub tokens: Vec<u32>,
    /// Tokens processed as the first chunk at position 0. Default: all of them; with
    /// `replay` the golden's `prefill` metadata; after `load_state` 0 (every given token is
    /// a decode step).
    pub prefill: Option<usize>,
    pub options: Options,
    pub token_map: TokenMap,
    /// Teacher-forced replay against this golden (needs block_input, pre_mix, residual,
    /// final_pre).
    pub replay: Option<PathBuf>,
    /// Continue from this saved session state (docs/STATE.md).
    pub load_state: Option<PathBuf>,
    /// Save the session state after the tokens (atomic write).
    pub save_state: Option<PathBuf>,
    /// Record the sub-op tensors too (always with `replay`).
    pub sub_ops: bool,
}

/// Why a job did not produce a trace: a request the engine will not run (a checkpoint it
/// cannot open, an impossible schedule, a state from another model), or a failure while
/// running one.
#[derive(Debug)]
pub enum JobError {
    Refused(Error),
    Failed(Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Refused(e) | JobError::Failed(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for JobError {}

/// The trace of a finished job, and the schedule it ran.
#[derive(Debug)]
pub struct JobOutput {
    pub trace: Trace,
    pub tokens: usize,
    pub prefill: usize,
}

impl ForwardJob {
    /// Run the job; the trace is returned, not written.
    pub fn run(&self) -> Result<JobOutput, JobError> {
        let refused = |reason: String| JobError::Refused(Error::Model(reason));
        let golden = match &self.replay {
            Some(p) => Some(TraceFile::read(p).map_err(JobError::Refused)?),
            None => None,
        };
        let tokens = match &golden {
            Some(g) if self.tokens.is_empty() => g.input_ids().map_err(JobError::Refused)?,
            _ => self.tokens.clone(),
        };
        let n = tokens.len();
        let restoring = self.load_state.is_some();
        if restoring && golden.is_some() {
            return Err(refused(
                "a loaded state cannot be combined with replay".into(),
            ));
        }
        let prefill = match (self.prefill, &golden) {
            (Some(p), _) => p,
            (None, Some(g)) => g.prefill().map_err(JobError::Refused)?.ok_or_else(|| {
                refused("the golden does not state its prefill length; give it".into())
            })?,
            (None, None) if restoring => 0,
            (None, None) => n,
        };
        if n == 0 || prefill > n || (prefill == 0 && !restoring) {
            return Err(refused(format!(
                "prefill {prefill} must be between 1 and the number of tokens ({n})"
            )));
        }

        let model = Model::open_with_token_map(&self.model, self.token_map.clone())
            .map_err(JobError::Refused)?;
        let sub_ops = self.sub_ops || golden.is_some();
        let mut trace = Trace::new(
            model.config(),
            TraceOptions {
                enabled: true,
                sub_ops,
            },
        );
        let mut session = Session::new(&model, self.options.clone());
        if let Some(p) = &self.load_state {
            // A state from another checkpoint or run configuration is refused, naming the field.
            crate::state::restore(&model, &mut session, p).map_err(JobError::Refused)?;
        }
        let start = session.position();
        let chunks = std::iter::once(&tokens[..prefill])
            .filter(|c| !c.is_empty())
            .chain(tokens[prefill..].chunks(1));
        match &golden {
            Some(g) => {
                let forcing = Forcing::from_golden(g, model.config()).map_err(JobError::Refused)?;
                for chunk in chunks {
                    session
                        .replay(chunk, &forcing, &mut trace)
                        .map_err(JobError::Failed)?;
                }
            }
            None => {
                for chunk in chunks {
                    session
                        .prefill(chunk, &mut trace)
                        .map_err(JobError::Failed)?;
                }
            }
        }

        let m = &mut trace.metadata;
        let mut put = |k: &str, v: String| m.insert(k.into(), v);
        put("engine", crate::ENGINE_NAME.into());
        put("version", crate::ENGINE_VERSION.into());
        put("layout", format!("{:?}", model.layout()).to_lowercase());
        put("numerics", self.options.numerics.to_string());
        put("index-k", self.options.index_k.to_string());
        put(
            "tie_rule",
            "largest first; equal values -> lower index".into(),
        );
        put(
            "topk_convention",
            "compressed positions (no window offset), ascending, -1 = none".into(),
        );
        put(
            "logits_rows",
            "row 0 = prefill (last position), row i = decode step i".into(),
        );
        put("prefill", prefill.to_string());
        put("decode_steps", (n - prefill).to_string());
        put(
            "mode",
            if golden.is_some() {
                "replay"
            } else {
                "forward"
            }
            .into(),
        );
        if !self.options.defects.is_empty() {
            put("defects", self.options.defects.to_string());
        }
        if let Some(p) = &self.load_state {
            put("loaded_state", p.display().to_string());
            put("start_position", start.to_string());
        }
        // Weights overwritten in place while the forward ran would change the results
        // silently: no trace or state is handed out then.
        model
            .checkpoint()
            .verify_unchanged()
            .map_err(JobError::Failed)?;
        if let Some(p) = &self.save_state {
            crate::state::save(&model, &session, p).map_err(JobError::Failed)?;
        }
        Ok(JobOutput {
            trace,
            tokens: n,
            prefill,
        })
    }
}
