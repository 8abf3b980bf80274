//! Container/loader family (CONTRACT.md §1): valid checkpoints load; every mutant of
//! ds41-synthetic is refused — a crash or an acceptance is a failure. A refusal proves
//! something only from an engine that loads the same checkpoint unmutated, so a mutant case
//! first loads its base: an engine that refuses everything fails every mutant case.

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Capability, Engine, EngineError, LoadRequest};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, require_layout, timeout, Context, Details};

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadExpect {
    Accept,
    Refuse,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderSpec {
    /// One model, or...
    #[serde(default)]
    pub model: Option<ModelRef>,
    /// ...every mutant of ds41-synthetic for this `PRESET/LAYOUT` (expands to one case each).
    #[serde(default)]
    pub all_mutants_of: Option<String>,
    pub expect: LoadExpect,
    /// Checked for the reference engine only: its refusal names one of these (other engines
    /// word their own errors; they only have to refuse).
    #[serde(default)]
    pub error_mentions: Vec<String>,
    /// After opening, run the read-time payload check (`load` with `verify: true`): for
    /// corruption an open cannot see without reading the whole expert bank.
    #[serde(default)]
    pub verify: bool,
    /// With `all_mutants_of`: the mutants that are caught at read time, not at open; their
    /// cases load with `verify: true`. Each must be a mutant of the expansion.
    #[serde(default)]
    pub read_time_mutants: Vec<String>,
}

impl super::CheckFamily for LoaderSpec {
    fn models(&self) -> Vec<ModelRef> {
        let mut out: Vec<ModelRef> = self.model.iter().cloned().collect();
        // A mutant case loads its unmutated base first.
        if let Some(ModelRef::Mutant { preset, layout, .. }) = &self.model {
            out.push(ModelRef::Synthetic {
                preset: preset.clone(),
                layout: layout.clone(),
                seed: crate::synthetic::MUTANT_BASE_SEED,
            });
        }
        out
    }

    fn data(&self) -> Vec<&DataRef> {
        Vec::new()
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        if s.model.is_some() == s.all_mutants_of.is_some() {
            return Err("give exactly one of `model` and `all_mutants_of`".into());
        }
        if let Some(m) = &s.all_mutants_of {
            let ok = m
                .split_once('/')
                .is_some_and(|(p, l)| !p.is_empty() && matches!(l, "release" | "container"));
            if !ok {
                return Err(format!(
                    "field `all_mutants_of`: `{m}` is not PRESET/LAYOUT"
                ));
            }
            if s.expect != LoadExpect::Refuse {
                return Err("field `expect`: mutants must be refused".into());
            }
        }
        Ok(())
    }

    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let s = self;
        let mut caps = vec![Capability::Load];
        if s.verify {
            caps.push(Capability::LoadVerify);
        }
        if let Some(o) = require(engine, &caps) {
            return Ok(o);
        }
        let Some(model) = &s.model else {
            return Err(Outcome::error(format!(
                "`all_mutants_of: {}` did not expand into mutant cases (no such mutants in this build, or a bad `read_time_mutants`)",
                s.all_mutants_of.as_deref().unwrap_or("")
            )));
        };
        if let Some(o) = require_layout(engine, ctx, model)? {
            return Ok(o);
        }
        let dir = ctx.checkpoint(model, details)?;
        let req = LoadRequest {
            model: dir.clone(),
            verify: s.verify,
        };
        if s.verify {
            details
                .notes
                .push("load with the read-time payload check (verify: true)".into());
        }
        if s.expect == LoadExpect::Refuse {
            if let Some(o) = load_base(case, model, s.verify, engine, ctx, details)? {
                return Ok(o);
            }
        }
        let res = engine.load(&req, timeout(case));
        Ok(match (s.expect, res) {
            (LoadExpect::Accept, Ok(())) => Outcome::Pass,
            (LoadExpect::Accept, Err(EngineError::Refused(m))) => {
                Outcome::fail(format!("refused a valid checkpoint ({model}): {m}"))
            }
            (LoadExpect::Refuse, Ok(())) => Outcome::fail(format!(
                "accepted a broken checkpoint ({model}); expected a refusal{}",
                if s.error_mentions.is_empty() {
                    String::new()
                } else {
                    format!(" naming one of {:?}", s.error_mentions)
                }
            )),
            (LoadExpect::Refuse, Err(EngineError::Refused(m))) => {
                details.notes.push(format!("refusal: {m}"));
                let named = s.error_mentions.is_empty()
                    || s.error_mentions.iter().any(|w| m.contains(w.as_str()));
                if super::is_reference(engine) && !named {
                    Outcome::fail(format!("refused, but for another reason: expected the error to name one of {:?}, got: {m}", s.error_mentions))
                } else {
                    Outcome::Pass
                }
            }
            (_, Err(e @ EngineError::Unsupported(..))) => engine_failure("load", e),
            (_, Err(e)) => Outcome::fail(format!(
                "loading {model}: {e} (a typed refusal or acceptance was due; a crash, a signal or \
                 an undeclared exit status is not a refusal)"
            )),
        })
    }
}

/// For a mutant: load the unmutated checkpoint it was made from (same preset, layout and
/// seed). `Some(outcome)` ends the case: the engine cannot load the base, so its refusal of
/// the mutant would prove nothing.
fn load_base(
    case: &Case,
    model: &ModelRef,
    verify: bool,
    engine: &mut dyn Engine,
    ctx: &Context,
    details: &mut Details,
) -> Result<Option<Outcome>, Outcome> {
    let ModelRef::Mutant { preset, layout, .. } = model else {
        return Ok(None);
    };
    let base = ModelRef::Synthetic {
        preset: preset.clone(),
        layout: layout.clone(),
        seed: crate::synthetic::MUTANT_BASE_SEED,
    };
    let dir = ctx.checkpoint(&base, details)?;
    let req = LoadRequest { model: dir, verify };
    Ok(match engine.load(&req, timeout(case)) {
        Ok(()) => {
            details
                .notes
                .push(format!("the unmutated base {base} loads"));
            None
        }
        Err(e @ EngineError::Unsupported(..)) => {
            Some(engine_failure("load (the unmutated base)", e))
        }
        Err(e) => Some(Outcome::fail(format!(
            "cannot load the unmutated base {base} ({e}): a refusal of the mutant proves nothing"
        ))),
    })
}

/// Expand `all_mutants_of: PRESET/LAYOUT` into one case per mutant.
pub fn expand(cases: Vec<Case>) -> Vec<Case> {
    let mut out = Vec::new();
    for c in cases {
        let crate::case::Spec::Loader(s) = &c.spec else {
            out.push(c);
            continue;
        };
        let Some(of) = &s.all_mutants_of else {
            out.push(c);
            continue;
        };
        let (preset, layout) = of.split_once('/').unwrap_or((of.as_str(), ""));
        let mutants = crate::synthetic::list_mutants(preset, layout);
        if mutants.is_empty() {
            out.push(c);
            continue;
        }
        if let Some(bad) = s
            .read_time_mutants
            .iter()
            .find(|r| !mutants.iter().any(|m| &&m.name == r))
        {
            // Keep the unexpanded case: running it reports the configuration error.
            let mut e = c.clone();
            e.spec = crate::case::Spec::Loader(LoaderSpec {
                all_mutants_of: Some(format!(
                    "{of} (read_time_mutants names `{bad}`, which is not one of its mutants)"
                )),
                ..s.clone()
            });
            out.push(e);
            continue;
        }
        for m in mutants {
            let mut e = c.clone();
            e.name = format!("{}.{}", c.name, m.name);
            e.description = format!("{preset}/{layout} with {}: must be refused", m.description);
            e.spec = crate::case::Spec::Loader(LoaderSpec {
                model: Some(ModelRef::Mutant {
                    preset: preset.into(),
                    layout: layout.into(),
                    mutant: m.name.clone(),
                }),
                all_mutants_of: None,
                expect: LoadExpect::Refuse,
                error_mentions: m.mentions.clone(),
                verify: s.read_time_mutants.contains(&m.name),
                read_time_mutants: Vec::new(),
            });
            out.push(e);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
