//! One module per check family (CONTRACT.md §1), each implementing [`CheckFamily`] for its
//! case spec: the models and data a case declares, its validation, its default profile, and
//! how it runs (returning the case's outcome, filling `details` for the report).

pub mod dsml;
pub mod dspark;
pub mod engram;
pub mod loader;
pub mod residual;
pub mod state;
pub mod tokenizer;
pub mod vision;

use serde::{Deserialize, Serialize};

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Engine, Numerics};
use crate::gates::ProfileName;
use crate::outcome::Outcome;
use crate::runner::{Context, Details};

/// Declares the check families: for each, its variant, the name a case file gives in
/// `family:`, and its case spec (defined in its own module, which implements
/// [`CheckFamily`] for it). This generates `Family` (the names) and `Spec` (a parsed case's
/// family-specific fields), their parsing and their dispatch.
macro_rules! check_families {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal => $spec:ty, )*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum Family {
            $( $(#[$doc])* #[serde(rename = $name)] $variant, )*
        }

        impl Family {
            pub const ALL: &'static [Family] = &[$(Family::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $( Family::$variant => $name, )*
                }
            }

            /// A case's own fields (the common ones removed) as this family's spec; unknown
            /// fields are refused, the error names the field under `at`.
            pub(crate) fn parse_spec(self, fields: serde_yaml::Value, at: &str) -> anyhow::Result<Spec> {
                Ok(match self {
                    $( Family::$variant => Spec::$variant(crate::case::typed(fields, at)?), )*
                })
            }
        }

        /// A case's family-specific fields.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(untagged)]
        pub enum Spec {
            $( $variant($spec), )*
        }

        impl Spec {
            /// The family that declares and runs this spec.
            pub fn family(&self) -> &dyn CheckFamily {
                match self {
                    $( Spec::$variant(s) => s, )*
                }
            }
        }
    };
}

// Adding a family: its module (the spec and its `CheckFamily` impl) and one line here.
check_families! {
    /// Container/loader: presets load, every mutant is refused.
    Loader = "loader" => loader::LoaderSpec,
    /// Tokenizer: exact ids on a corpus, control tokens only on the markup path.
    Tokenizer = "tokenizer" => tokenizer::TokenizerSpec,
    /// DSML: render goldens byte-exact, parse results exact.
    Dsml = "dsml" => dsml::DsmlSpec,
    /// Session state: metamorphic relations (snapshot/restore, chunking, refusal).
    State = "state" => state::StateSpec,
    /// Layer residuals + discrete decisions against a golden trace.
    Residual = "residual" => residual::ResidualSpec,
    /// Engram hash ids from token ids alone (no weights), exact.
    Engram = "engram" => engram::EngramSpec,
    /// DSpark draft head against the official code's DSpark goldens (release layout).
    Dspark = "dspark" => dspark::DsparkSpec,
    /// Vision: preprocessing, tower and image spans against the official code's goldens.
    Vision = "vision" => vision::VisionSpec,
}

/// A check family (CONTRACT.md §1): what its cases declare and how one runs, implemented by
/// each family's case spec and registered in `check_families!` above.
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
