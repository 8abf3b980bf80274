//! The harness's view of `ds41-synthetic` (issue 3): generate presets and mutants on demand,
//! and list the mutants with the error each must be refused with.

use std::path::Path;

/// One mutant and (a fragment of) the error the reference must refuse it with.
#[derive(Debug, Clone, PartialEq)]
pub struct MutantInfo {
    pub name: String,
    pub expected_error: String,
}

pub fn generate(preset: &str, layout: &str, seed: u64, dir: &Path) -> anyhow::Result<()> {
    let _ = (preset, layout, seed, dir);
    anyhow::bail!(
        "ds41-synthetic cannot generate presets yet (issue 3 has not landed in this build)"
    )
}

pub fn generate_mutant(preset: &str, layout: &str, mutant: &str, dir: &Path) -> anyhow::Result<()> {
    let _ = (preset, layout, mutant, dir);
    anyhow::bail!(
        "ds41-synthetic cannot generate mutants yet (issue 3 has not landed in this build)"
    )
}

pub fn list_presets() -> Vec<String> {
    Vec::new()
}

pub fn list_mutants(layout: &str) -> Vec<MutantInfo> {
    let _ = layout;
    Vec::new()
}
