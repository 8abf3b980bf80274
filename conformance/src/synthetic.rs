//! The harness's view of `ds41-synthetic`: generate presets and mutants on demand,
//! and list, per preset and layout, the mutants with the refusal each must provoke.

use std::path::Path;

use ds41_synthetic::{Layout, Preset};

/// One mutant and what its refusal must mention (any one of `mentions`).
#[derive(Debug, Clone, PartialEq)]
pub struct MutantInfo {
    pub name: String,
    pub description: String,
    pub mentions: Vec<String>,
}

pub fn layout(name: &str) -> anyhow::Result<Layout> {
    match name {
        "release" => Ok(Layout::Release),
        "container" => Ok(Layout::Container),
        other => anyhow::bail!("unknown layout `{other}` (release or container)"),
    }
}

pub fn generate(preset: &str, layout_name: &str, seed: u64, dir: &Path) -> anyhow::Result<()> {
    ds41_synthetic::generate(preset, layout(layout_name)?, seed, dir)?;
    Ok(())
}

/// The seed every mutant is generated from: its unmutated base is `PRESET/LAYOUT@0`.
pub const MUTANT_BASE_SEED: u64 = 0;

pub fn generate_mutant(
    preset: &str,
    layout_name: &str,
    mutant: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    ds41_synthetic::generate_with(&ds41_synthetic::Options {
        preset: preset.into(),
        layout: layout(layout_name)?,
        seed: MUTANT_BASE_SEED,
        out_dir: dir.to_path_buf(),
        mutant: Some(mutant.into()),
        force: false,
        overrides: Vec::new(),
    })?;
    Ok(())
}

/// Presets that are small enough for the default run (the `large` ones are benchmarks).
pub fn small_presets() -> Vec<String> {
    ds41_synthetic::list_presets()
        .into_iter()
        .filter(|p| !p.large)
        .map(|p| p.name.to_string())
        .collect()
}

/// The mutants that apply to `preset` in `layout_name`.
pub fn list_mutants(preset: &str, layout_name: &str) -> Vec<MutantInfo> {
    let (Some(p), Ok(l)) = (Preset::by_name(preset), layout(layout_name)) else {
        return Vec::new();
    };
    ds41_synthetic::list_mutants()
        .into_iter()
        .filter(|m| ds41_synthetic::mutants::check_applicable(m, &p, l).is_ok())
        .map(|m| MutantInfo {
            name: m.name.into(),
            description: m.description.into(),
            mentions: m.expect.mentions.iter().map(|s| s.to_string()).collect(),
        })
        .collect()
}
