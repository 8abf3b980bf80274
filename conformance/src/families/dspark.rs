//! DSpark family: an engine's DSpark draft head (MODEL.md §10.1; PROTOCOL.md `dspark`)
//! against a golden DSpark trace of the official code (goldens/official/*/dspark_*,
//! goldens/regen/model/run_dspark.py), end to end or teacher-forced (`replay: true`), judged
//! in computation order so a failure names the first diverging tensor, draft step and stage.
//!
//! Thresholds are the case profile's (gates/): in replay, `attn_out` / `moe_out` at the
//! replay attention / MoE rel L2, the streams (`mid`, `residual`, the collapsed `hidden`) and
//! the f32 `pre` vectors at the replay residual rel L2, the head, Markov and final logits and
//! the confidence at the replay logits max |Δ| and rel L2; end to end, `main_hidden`, `main_x`,
//! the streams at the residual rel L2 and the logits at the logits rel L2 (the sublayer
//! outputs are judged in replay only, as in the residual family). Draft ids, routed experts
//! and the draft's input ids are exact, except a draft id at a near tie (the golden's margin
//! within twice the row's logits drift), which is excused, noted, and the rest of its block
//! not compared. DSpark is release-layout only: the container drops the MTP stages
//! (CONTAINER.md §8).

use serde::{Deserialize, Serialize};

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Capability, DsparkRequest, Engine, Numerics, RequiredCapability};
use crate::gates::{Gates, ProfileName};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, require_layout, timeout, Context, Details};
use crate::trace::TraceFile;
use ds41_engine::model::dspark::trace::{excuse_draft_flips, first_divergence, Limit};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsparkSpec {
    /// A release-layout checkpoint with `mtp.*` stages.
    pub model: ModelRef,
    /// A DSpark trace of the official code; its `input_ids` and `prefill` metadata give the
    /// schedule.
    pub golden: DataRef,
    pub numerics: Numerics,
    /// Teacher-forced from the golden (capability `replay`).
    #[serde(default)]
    pub replay: bool,
}

impl super::CheckFamily for DsparkSpec {
    fn models(&self) -> Vec<ModelRef> {
        vec![self.model.clone()]
    }

    fn data(&self) -> Vec<&DataRef> {
        vec![&self.golden]
    }

    fn validate(&self) -> Result<(), String> {
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
        let mut caps = vec![Capability::Dspark, self.numerics.capability()];
        if self.replay {
            caps.push(Capability::Replay);
        }
        if let Some(o) = require(engine, &caps) {
            return Ok(o);
        }
        if let Some(o) = require_layout(engine, ctx, &self.model)? {
            return Ok(o);
        }
        let model = ctx.checkpoint(&self.model, details)?;
        let dir = ctx.scratch(case)?;
        let golden_path = ctx.data(&self.golden)?;
        let golden =
            TraceFile::read(&golden_path).map_err(|e| Outcome::error(format!("golden: {e:#}")))?;
        golden
            .check_position_rows()
            .map_err(|e| Outcome::error(format!("golden: {e}")))?;
        let tokens: Vec<u32> = golden
            .get("input_ids")
            .ok_or_else(|| Outcome::error("the golden has no `input_ids`"))?
            .as_i64()
            .iter()
            .map(|&t| t as u32)
            .collect();
        // A golden is data a user may bring: its schedule outside its tokens is its error.
        let prefill = golden
            .prefill()
            .map_err(|e| Outcome::error(format!("golden: {e}")))?
            .ok_or_else(|| Outcome::error("the golden's metadata has no `prefill`"))?;
        if prefill == 0 || prefill > tokens.len() {
            return Err(Outcome::error(format!(
                "the golden's metadata `prefill`: {prefill} is not inside 1..={} (its input_ids)",
                tokens.len()
            )));
        }
        let req = DsparkRequest {
            model,
            tokens,
            prefill,
            numerics: self.numerics,
            out: dir.join("engine-dspark.safetensors"),
            replay: self.replay.then_some(golden_path),
        };
        engine
            .dspark(&req, timeout(case))
            .map_err(|e| engine_failure("dspark", e))?;
        let trace = TraceFile::read(&req.out)
            .map_err(|e| Outcome::fail(format!("dspark: unreadable trace: {e:#}")))?;
        let (trace, excused) = excuse_draft_flips(&golden, &trace);
        details.notes.extend(
            excused
                .iter()
                .map(|n| format!("excused draft id flip: {n}")),
        );
        let gates = ctx.gates_for(case);
        let limit = |name: &str| {
            if self.replay {
                replay_limit(&gates, name)
            } else {
                e2e_limit(&gates, name)
            }
        };
        let steps = golden.get("dspark.positions").map_or(0, |t| t.len());
        details.notes.push(format!(
            "{} draft steps after a prefill of {prefill}, {}",
            steps,
            if self.replay {
                "teacher-forced"
            } else {
                "end to end"
            }
        ));
        Ok(match first_divergence(&golden, &trace, limit) {
            None if steps > 0 => Outcome::Pass,
            None => Outcome::fail("insufficient coverage: the golden has no draft step"),
            Some(d) => Outcome::fail(format!("first divergence: {d}")),
        })
    }
}

fn stream_or_decision(name: &str, rel_l2: f64) -> Option<Limit> {
    match name {
        "dspark.input_ids" | "dspark.experts" | "dspark.output_ids" => Some(Limit::EXACT),
        "dspark.main_hidden" | "dspark.main_x" | "dspark.residual" | "dspark.hidden" => {
            Some(Limit {
                max_abs: f64::INFINITY,
                rel_l2,
            })
        }
        _ => None,
    }
}

/// Teacher-forced limits of one DSpark tensor under the profile's replay gates.
pub fn replay_limit(g: &Gates, name: &str) -> Limit {
    let r = &g.replay;
    if let Some(l) = stream_or_decision(name, r.residual_rel_l2) {
        return l;
    }
    let rel = |rel_l2| Limit {
        max_abs: f64::INFINITY,
        rel_l2,
    };
    match name {
        "dspark.attn_out" => rel(r.attn_rel_l2),
        "dspark.moe_out" => rel(r.moe_rel_l2),
        "dspark.mid" | "dspark.out_pre" | "dspark.final_pre" => rel(r.residual_rel_l2),
        _ => Limit {
            max_abs: r.logits_max_abs,
            rel_l2: r.logits_rel_l2,
        },
    }
}

/// End-to-end limits of one DSpark tensor under the profile's gates (the sublayer outputs
/// and `pre` vectors are judged in replay only; the logits' max |Δ| is not applied per draft
/// row, which inherits the main model's drift through `main_hidden`).
pub fn e2e_limit(g: &Gates, name: &str) -> Limit {
    if let Some(l) = stream_or_decision(name, g.residual.rel_l2) {
        return l;
    }
    match name {
        "dspark.head_logits" | "dspark.markov_bias" | "dspark.logits" | "dspark.confidence" => {
            Limit {
                max_abs: f64::INFINITY,
                rel_l2: g.logits.rel_l2,
            }
        }
        _ => Limit {
            max_abs: f64::INFINITY,
            rel_l2: f64::INFINITY,
        },
    }
}
