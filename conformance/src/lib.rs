//! ds41-conformance: the harness that certifies DS41 engines.
//!
//! Module map (CONTRACT.md defines the rules these implement):
//! * [`case`] — the YAML case schema and its validation;
//! * [`gates`] — tolerance profiles read from `gates/`;
//! * [`outcome`] — the result vocabulary;
//! * [`engine_api`] — the engine-under-test abstraction and capability list;
//! * [`engine_process`] — engine subprocesses: process groups, deadlines, bounded reads;
//! * [`goldens`] — golden provenance, check/bless and the errata register;
//! * [`trace`], [`compare`] — trace files and the comparison metrics (fragile flips included);
//! * [`vision_goldens`] — vision preprocessing and tower against the official code's goldens;

/// The interpretation contract this harness implements (CONTRACT.md); bumped whenever a
/// rule changes so a certificate says which rules it was judged by.
pub const CONTRACT_VERSION: &str = "1.4.0";

pub mod case;
pub mod compare;
pub mod convert;
pub mod converter_gate;
pub mod embedded;
pub mod engine_api;
pub mod engine_process;
pub mod families;
pub mod footprint;
pub mod gates;
pub mod goldens;
pub mod interrupt;
pub mod locations;
pub mod outcome;
pub mod profile;
pub mod protocol;
pub mod reference;
pub mod report;
pub mod runner;
pub mod selftest;
pub mod spec_window;
pub mod synthetic;
pub mod trace;
pub mod vision_goldens;
pub mod wide_digest;

#[cfg(test)]
mod tests {
    #[test]
    fn contract_document_states_this_version() {
        let doc = include_str!("../CONTRACT.md");
        let first = doc.lines().next().unwrap_or_default();
        assert!(
            first.ends_with(&format!("version {}", super::CONTRACT_VERSION)),
            "CONTRACT.md says `{first}`, the harness {}",
            super::CONTRACT_VERSION
        );
    }
}
