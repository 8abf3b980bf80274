//! The result vocabulary of CONTRACT.md §3 (after VK-GL-CTS): every case ends in exactly one
//! outcome. `Skipped` is not a verdict about the engine: a prerequisite of the *suite* (e.g.
//! upstream data) is missing, and it is never counted as a pass.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// Every check of the case held.
    Pass,
    /// A check failed, or the engine crashed, hung or answered garbage.
    Fail { reason: String },
    /// The engine lacks a capability the case needs (declared in its hello / profile).
    NotSupported { capability: String },
    /// The case failed, and an expected-failure list entry waives it with a reason.
    Waived { reason: String, failure: String },
    /// A suite prerequisite (upstream data) is missing; the case did not run.
    Skipped { reason: String },
    /// The harness itself could not prepare or judge the case (bad data, missing generator):
    /// no verdict about the engine; `ds41 certify` exits 2.
    Error { reason: String },
}

impl Outcome {
    pub fn fail(reason: impl Into<String>) -> Self {
        Outcome::Fail {
            reason: reason.into(),
        }
    }
    pub fn skipped(reason: impl Into<String>) -> Self {
        Outcome::Skipped {
            reason: reason.into(),
        }
    }
    pub fn not_supported(capability: impl Into<String>) -> Self {
        Outcome::NotSupported {
            capability: capability.into(),
        }
    }
    /// Short upper-case label used in progress lines, tables and JUnit.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail { .. } => "FAIL",
            Outcome::NotSupported { .. } => "NOT-SUPPORTED",
            Outcome::Waived { .. } => "WAIVED",
            Outcome::Skipped { .. } => "SKIPPED",
            Outcome::Error { .. } => "ERROR",
        }
    }
    /// The one-line reason, if the outcome carries one.
    pub fn reason(&self) -> Option<String> {
        match self {
            Outcome::Pass => None,
            Outcome::Fail { reason } | Outcome::Skipped { reason } | Outcome::Error { reason } => {
                Some(reason.clone())
            }
            Outcome::NotSupported { capability } => {
                Some(format!("engine lacks capability `{capability}`"))
            }
            Outcome::Waived { reason, failure } => Some(format!("{reason} (failure: {failure})")),
        }
    }
    pub fn error(reason: impl Into<String>) -> Self {
        Outcome::Error {
            reason: reason.into(),
        }
    }
    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail { .. })
    }
}
