//! Session-state family (CONTRACT.md §1.4): metamorphic relations that need no stored golden
//! and hold for any engine — snapshot/restore/continue equals the uninterrupted run, a
//! chunked prefill equals token-at-a-time wherever both give logits, and a state saved on one
//! checkpoint is refused by another.

use std::path::Path;

use crate::case::{Case, DataRef, ModelRef};
use crate::compare::max_abs;
use crate::engine_api::{Capability, Engine, EngineError, ForwardRequest, RequiredCapability};
use crate::gates::ProfileName;
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, require_layout, timeout, Context, Details};
use crate::trace::TraceFile;

use crate::engine_api::{IndexK, Numerics};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// prefill(split) + save + load in a fresh request + continue == uninterrupted.
    SnapshotRestore,
    /// prefill(split) with `tokens` vs token-at-a-time: every common logits row equal.
    ChunkedPrefill,
    /// A state saved on `model` is refused when loaded into `other_model`.
    MismatchRefused,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    pub model: ModelRef,
    pub relation: Relation,
    pub tokens: Vec<u32>,
    /// Split points (token counts before the snapshot / prefill chunk sizes); one check each.
    pub splits: Vec<usize>,
    pub numerics: Numerics,
    pub index_k: IndexK,
    #[serde(default)]
    pub other_model: Option<ModelRef>,
}

impl super::CheckFamily for StateSpec {
    fn models(&self) -> Vec<ModelRef> {
        std::iter::once(&self.model)
            .chain(&self.other_model)
            .cloned()
            .collect()
    }

    fn data(&self) -> Vec<&DataRef> {
        Vec::new()
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        if s.splits.is_empty() {
            return Err("field `splits`: at least one split point".into());
        }
        if let Some(&bad) = s.splits.iter().find(|&&k| k == 0 || k >= s.tokens.len()) {
            return Err(format!(
                "field `splits`: {bad} is not inside 1..{}",
                s.tokens.len()
            ));
        }
        if (s.relation == Relation::MismatchRefused) != s.other_model.is_some() {
            return Err(
                "field `other_model`: required by (and only by) relation mismatch_refused".into(),
            );
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
        let mut caps = vec![
            Capability::Forward,
            s.numerics.capability(),
            s.index_k.capability(),
        ];
        match s.relation {
            Relation::SnapshotRestore | Relation::MismatchRefused => caps.push(Capability::State),
            Relation::ChunkedPrefill => caps.push(Capability::Prefill),
        }
        if s.splits.iter().any(|&k| k > 1) && !caps.contains(&Capability::Prefill) {
            caps.push(Capability::Prefill);
        }
        caps.push(Capability::TraceLogits);
        if let Some(o) = require(engine, &caps) {
            return Ok(o);
        }
        for m in std::iter::once(&s.model).chain(&s.other_model) {
            if let Some(o) = require_layout(engine, ctx, m)? {
                return Ok(o);
            }
        }
        let model = ctx.checkpoint(&s.model, details)?;
        let dir = ctx.scratch(case)?;
        let gate = ctx.gates_for(case).state.logits_max_abs;
        let mut failures = Vec::new();
        for &k in &s.splits {
            let r = match s.relation {
                Relation::SnapshotRestore => {
                    snapshot_restore(case, s, engine, &model, &dir, k, gate)
                }
                Relation::ChunkedPrefill => chunked(case, s, engine, &model, &dir, k, gate),
                Relation::MismatchRefused => {
                    let other = ctx.model(s.other_model.as_ref().expect("validated"))?;
                    mismatch(case, s, engine, &model, &other, &dir, k)
                }
            };
            match r {
                Ok(note) => details.notes.push(format!("split {k}: {note}")),
                Err(Fail::Verdict(o)) => return Ok(o),
                Err(Fail::Check(msg)) => failures.push(format!("split {k}: {msg}")),
            }
        }
        Ok(if failures.is_empty() {
            Outcome::Pass
        } else {
            Outcome::fail(failures.join("\n"))
        })
    }
}

enum Fail {
    /// Stop the case with this outcome (engine failure, unsupported, harness error).
    Verdict(Outcome),
    /// This split violates the relation.
    Check(String),
}

fn fwd(
    engine: &mut dyn Engine,
    case: &Case,
    req: ForwardRequest,
    what: &str,
) -> Result<TraceFile, Fail> {
    engine
        .forward(&req, timeout(case))
        .map_err(|e| Fail::Verdict(engine_failure(what, e)))?;
    TraceFile::read(&req.out)
        .map_err(|e| Fail::Verdict(Outcome::fail(format!("{what}: unreadable trace: {e:#}"))))
}

fn req(
    s: &StateSpec,
    model: &Path,
    tokens: &[u32],
    prefill: Option<usize>,
    out: std::path::PathBuf,
) -> ForwardRequest {
    ForwardRequest {
        model: model.to_path_buf(),
        tokens: tokens.to_vec(),
        prefill,
        numerics: s.numerics,
        index_k: s.index_k,
        out,
        save_state: None,
        load_state: None,
        replay: None,
        engram_token_map: None,
        images: Vec::new(),
    }
}

/// Logits rows by absolute position (`logits_positions`, or `first + row` when absent).
fn rows_by_position(t: &TraceFile, first: usize) -> Result<Vec<(usize, Vec<f64>)>, Fail> {
    let l = t
        .get("logits")
        .ok_or_else(|| Fail::Verdict(Outcome::fail("trace has no `logits`")))?;
    if l.shape.len() != 2 {
        return Err(Fail::Verdict(Outcome::fail(format!(
            "`logits` has shape {:?}, expected [steps, vocab]",
            l.shape
        ))));
    }
    let v = l.as_f64();
    let n = l.shape[1];
    let pos: Vec<usize> = match t.get("logits_positions") {
        Some(p) => p.as_i64().iter().map(|&x| x as usize).collect(),
        None => (first..first + l.shape[0]).collect(),
    };
    Ok(pos
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, v[i * n..(i + 1) * n].to_vec()))
        .collect())
}

fn compare_rows(
    a: &[(usize, Vec<f64>)],
    b: &[(usize, Vec<f64>)],
    gate: f64,
) -> Result<String, Fail> {
    let mut n = 0;
    let mut worst = 0.0f64;
    for (p, ra) in a {
        let Some((_, rb)) = b.iter().find(|(q, _)| q == p) else {
            continue;
        };
        if ra.len() != rb.len() {
            return Err(Fail::Check(format!(
                "position {p}: vocab {} vs {}",
                ra.len(),
                rb.len()
            )));
        }
        let d = max_abs(rb, ra);
        worst = worst.max(d);
        n += 1;
        if d > gate {
            return Err(Fail::Check(format!(
                "logits at position {p} differ by max|d| {d:.3e} > {gate:.1e}"
            )));
        }
    }
    if n == 0 {
        return Err(Fail::Check("no common logits positions to compare".into()));
    }
    Ok(format!(
        "{n} logits rows equal (max|d| {worst:.3e}, limit {gate:.1e})"
    ))
}

fn snapshot_restore(
    case: &Case,
    s: &StateSpec,
    engine: &mut dyn Engine,
    model: &Path,
    dir: &Path,
    k: usize,
    gate: f64,
) -> Result<String, Fail> {
    let full = fwd(
        engine,
        case,
        req(
            s,
            model,
            &s.tokens,
            Some(k),
            dir.join(format!("full-{k}.safetensors")),
        ),
        "uninterrupted run",
    )?;
    let state = dir.join(format!("state-{k}.bin"));
    let mut a = req(
        s,
        model,
        &s.tokens[..k],
        Some(k),
        dir.join(format!("a-{k}.safetensors")),
    );
    a.save_state = Some(state.clone());
    fwd(engine, case, a, "prefill + save_state")?;
    if !state.exists() {
        return Err(Fail::Verdict(Outcome::fail(format!(
            "engine reported success but wrote no state file {}",
            state.display()
        ))));
    }
    let mut b = req(
        s,
        model,
        &s.tokens[k..],
        None,
        dir.join(format!("b-{k}.safetensors")),
    );
    b.load_state = Some(state);
    let cont = fwd(engine, case, b, "load_state + continue")?;
    compare_rows(
        &rows_by_position(&full, k - 1)?,
        &rows_by_position(&cont, k)?,
        gate,
    )
}

fn chunked(
    case: &Case,
    s: &StateSpec,
    engine: &mut dyn Engine,
    model: &Path,
    dir: &Path,
    k: usize,
    gate: f64,
) -> Result<String, Fail> {
    let one = fwd(
        engine,
        case,
        req(
            s,
            model,
            &s.tokens,
            Some(1),
            dir.join("one-at-a-time.safetensors"),
        ),
        "token-at-a-time run",
    )?;
    let chunk = fwd(
        engine,
        case,
        req(
            s,
            model,
            &s.tokens,
            Some(k),
            dir.join(format!("prefill-{k}.safetensors")),
        ),
        "chunked run",
    )?;
    compare_rows(
        &rows_by_position(&one, 0)?,
        &rows_by_position(&chunk, k - 1)?,
        gate,
    )
}

fn mismatch(
    case: &Case,
    s: &StateSpec,
    engine: &mut dyn Engine,
    model: &Path,
    other: &Path,
    dir: &Path,
    k: usize,
) -> Result<String, Fail> {
    let state = dir.join(format!("state-{k}.bin"));
    let mut a = req(
        s,
        model,
        &s.tokens[..k],
        Some(k),
        dir.join(format!("a-{k}.safetensors")),
    );
    a.save_state = Some(state.clone());
    fwd(engine, case, a, "prefill + save_state")?;
    let mut b = req(
        s,
        other,
        &s.tokens[k..],
        None,
        dir.join(format!("b-{k}.safetensors")),
    );
    b.load_state = Some(state);
    match engine.forward(&b, timeout(case)) {
        Err(EngineError::Refused(m)) => Ok(format!("refused: {m}")),
        Ok(()) => Err(Fail::Check(
            "a state saved on another checkpoint was accepted".into(),
        )),
        Err(e) => Err(Fail::Verdict(engine_failure(
            "load_state on a mismatched checkpoint (a refusal was due)",
            e,
        ))),
    }
}
