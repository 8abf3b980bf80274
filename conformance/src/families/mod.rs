//! One module per check family (CONTRACT.md §1). Each takes a validated case, an engine and
//! the run context, and returns the case's outcome, filling `details` for the report.

pub mod dsml;
pub mod engram;
pub mod loader;
pub mod residual;
pub mod state;
pub mod tokenizer;

use crate::case::{Case, Spec};
use crate::engine_api::Engine;
use crate::outcome::Outcome;
use crate::runner::{Context, Details};

pub fn run(case: &Case, engine: &mut dyn Engine, ctx: &Context, details: &mut Details) -> Outcome {
    let r = match &case.spec {
        Spec::Loader(s) => loader::run(case, s, engine, ctx, details),
        Spec::Tokenizer(s) => tokenizer::run(case, s, engine, ctx, details),
        Spec::Dsml(s) => dsml::run(case, s, engine, ctx, details),
        Spec::State(s) => state::run(case, s, engine, ctx, details),
        Spec::Residual(s) => residual::run(case, s, engine, ctx, details),
        Spec::Engram(s) => engram::run(case, s, engine, ctx, details),
    };
    r.unwrap_or_else(|o| o)
}

/// Is this engine the built-in reference (in process or behind `ds41 serve-adapter`)? Only
/// the reference is held to the exact wording of its refusals.
pub fn is_reference(engine: &dyn Engine) -> bool {
    engine.identity().name == ds41_engine::ENGINE_NAME
}
