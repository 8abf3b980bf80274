//! One module per check family (CONTRACT.md §1), each implementing [`CheckFamily`] for its
//! case spec: the models and data a case declares, its validation, its default profile, and
//! how it runs (returning the case's outcome, filling `details` for the report).

pub mod dsml;
pub mod engram;
pub mod loader;
pub mod residual;
pub mod state;
pub mod tokenizer;

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Engine, Numerics};
use crate::gates::ProfileName;
use crate::outcome::Outcome;
use crate::runner::{Context, Details};

/// A check family (CONTRACT.md §1): what its cases declare and how one runs. A family is
/// one file implementing this for its case spec, registered by its variant in `case::Family`
/// and `case::Spec` (which parse a case file and dispatch to it).
pub trait CheckFamily {
    /// The checkpoints a case runs on: synthetic ones are generated up front, upstream ones
    /// make the case need `DS41_UPSTREAM`.
    fn models(&self) -> Vec<ModelRef>;
    /// The data files a case reads.
    fn data(&self) -> Vec<&DataRef>;
    /// The rules across fields the schema cannot state; the error names the field.
    fn validate(&self) -> Result<(), String>;
    /// The gate profile of a case that names none.
    fn default_profile(&self) -> ProfileName {
        ProfileName::Exact
    }
    /// Run one case: `Ok` is the case's outcome, `Err` an outcome that ended it early.
    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome>;
}

/// The profile a requested numerics is judged by.
fn profile_of(n: Numerics) -> ProfileName {
    match n {
        Numerics::Exact => ProfileName::Exact,
        Numerics::Upstream => ProfileName::Upstream,
    }
}

pub fn run(case: &Case, engine: &mut dyn Engine, ctx: &Context, details: &mut Details) -> Outcome {
    case.spec
        .family()
        .run(case, engine, ctx, details)
        .unwrap_or_else(|o| o)
}

/// Is this engine the built-in reference (in process or behind `ds41 serve-adapter`)? Only
/// the reference is held to the exact wording of its refusals.
pub fn is_reference(engine: &dyn Engine) -> bool {
    engine.identity().name == ds41_engine::ENGINE_NAME
}
