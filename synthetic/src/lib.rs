//! ds41-synthetic: seeded DS41 test checkpoints in both layouts, and mutants.
//!
//! * [`generate`] writes a complete checkpoint directory from `(preset, layout, seed)`:
//!   the release layout (MODEL.md §2, §4; module [`release`]) or the WASTE v0 container
//!   (CONTAINER.md §1–§10; module [`container`]). Same inputs, same bytes, on every machine.
//! * [`list_presets`] / [`list_mutants`] describe what exists, as data: every mutant states the
//!   typed reader error it must provoke, so a harness can run "every mutant is refused".
//! * Values are drawn directly as storage codes ([`draw`]), so reading back yields exactly the
//!   drawn values; [`expected_values`] returns them for round-trip tests.
//!
//! Module map: [`rng`] (streams), [`preset`] (geometry), [`inventory`] (tensor names/shapes),
//! [`tokenizer`] (tokenizer.json + Engram map), [`draw`], [`release`], [`container`],
//! [`mutants`], [`mechanisms`] (what a sequence reaches); Python-compatible JSON text comes from the engine's
//! `ds41_engine::dsml::json_py`, CPython `random` from `ds41_engine::tokenizer::python_random`.

#![recursion_limit = "256"]

pub mod container;
pub mod draw;
pub mod inventory;
pub mod mechanisms;
pub mod mutants;
pub mod preset;
pub mod release;
pub mod rng;
pub mod tokenizer;

pub use ds41_engine::checkpoint::Layout;
pub use mutants::{list_mutants, Expected, MutantInfo};
pub use preset::Preset;

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Name of the provenance record written next to every generated checkpoint.
pub const SIDECAR: &str = "ds41-synthetic.json";
/// Bumped whenever the bytes a (preset, layout, seed) produces change.
pub const GENERATOR_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The OS reason is written inline, so it is not also a `source()` (a chain printer would
    /// repeat it).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("unknown preset `{0}` (known: {known})", known = preset::PRESET_NAMES.join(", "))]
    UnknownPreset(String),
    #[error("unknown mutant `{0}` (see `ds41 synth --list`)")]
    UnknownMutant(String),
    #[error("mutant `{mutant}` does not apply to {what}")]
    MutantNotApplicable { mutant: String, what: String },
    #[error("preset `{preset}` has no {layout} layout: {why}")]
    LayoutNotSupported {
        preset: &'static str,
        layout: &'static str,
        why: &'static str,
    },
    #[error("{0}: directory is not empty; pass --force to replace a previous synthetic checkpoint there")]
    NonEmptyDir(PathBuf),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    /// A geometry override (`ds41 synth --set KEY=VALUE`) that cannot be applied.
    #[error("--set {key}: {reason}")]
    Override { key: String, reason: String },
}

impl SynthError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        SynthError::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Options {
    pub preset: String,
    pub layout: Layout,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub mutant: Option<String>,
    /// Replace a previous synthetic checkpoint in `out_dir` (only files listed in its
    /// provenance record are removed; anything else in the directory is kept).
    pub force: bool,
    /// `text_config` keys replaced in the preset's geometry ([`Preset::with_overrides`]).
    pub overrides: Vec<(String, serde_json::Value)>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Generated {
    pub dir: PathBuf,
    /// Files written, relative to `dir`, sorted (the provenance record included).
    pub files: Vec<String>,
    /// Files that were already in `dir` and were left alone (only possible with `force`).
    pub kept: Vec<String>,
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Release => "release",
        Layout::Container => "container",
    }
}

/// Preset listing for `ds41 synth --list` and the harness.
#[derive(Debug, Clone)]
pub struct PresetInfo {
    pub name: &'static str,
    /// Layouts this preset can be written in.
    pub layouts: Vec<Layout>,
    pub description: &'static str,
    pub large: bool,
    pub reach: &'static str,
}

pub fn list_presets() -> Vec<PresetInfo> {
    Preset::all()
        .into_iter()
        .map(|p| PresetInfo {
            name: p.name,
            layouts: [Layout::Release, Layout::Container]
                .into_iter()
                .filter(|&l| p.unsupported(l).is_none())
                .collect(),
            description: p.description,
            large: p.large,
            reach: p.reach,
        })
        .collect()
}

/// WASTE's own synthetic DS41 test container: `waste-tiny` seed 0 in the container layout is
/// byte-identical to WASTE's `tools/make_test_container.py OUT --ds41` (default seed 0) at
/// Penguinjanator/warp 8d5405d8 (pinned by tests/waste_compat.rs), so tests and goldens use it
/// wherever they need that container.
pub fn waste_test_container(out_dir: &Path) -> Result<Generated, SynthError> {
    generate("waste-tiny", Layout::Container, 0, out_dir)
}

/// Write `preset` in `layout` with `seed` into `out_dir` (created if missing; must be empty).
pub fn generate(
    preset: &str,
    layout: Layout,
    seed: u64,
    out_dir: &Path,
) -> Result<Generated, SynthError> {
    generate_with(&Options {
        preset: preset.to_string(),
        layout,
        seed,
        out_dir: out_dir.to_path_buf(),
        mutant: None,
        force: false,
        overrides: Vec::new(),
    })
}

/// [`generate`] with a mutant and the overwrite policy.
pub fn generate_with(o: &Options) -> Result<Generated, SynthError> {
    let p = Preset::by_name(&o.preset)
        .ok_or_else(|| SynthError::UnknownPreset(o.preset.clone()))?
        .with_overrides(&o.overrides, o.layout)?;
    let mutant = match &o.mutant {
        None => None,
        Some(m) => {
            let info = mutants::find(m).ok_or_else(|| SynthError::UnknownMutant(m.clone()))?;
            mutants::check_applicable(&info, &p, o.layout)?;
            Some(info)
        }
    };
    if let Some(why) = p.unsupported(o.layout) {
        return Err(SynthError::LayoutNotSupported {
            preset: p.name,
            layout: layout_name(o.layout),
            why,
        });
    }
    let kept = prepare_dir(&o.out_dir, o.force)?;
    let dir = &o.out_dir;
    let mut files = match o.layout {
        Layout::Release => {
            let edit = mutant
                .as_ref()
                .map(|m| mutants::release_edit(m, &p))
                .unwrap_or_default();
            release::write_edited(&p, o.seed, dir, &edit)?
        }
        Layout::Container => container::write(&p, o.seed, dir, None)?,
    };
    if let Some(m) = &mutant {
        mutants::apply_after(m, &p, o.layout, dir, &files)?;
    }
    files.push(SIDECAR.to_string());
    files.sort();
    files.dedup();
    let mut sidecar = serde_json::json!({
        "generator": "ds41-synthetic",
        "generator_version": GENERATOR_VERSION,
        "preset": p.name,
        "layout": match o.layout { Layout::Release => "release", Layout::Container => "container" },
        "seed": o.seed,
        "mutant": o.mutant,
        "files": files,
        "reach": p.reach,
    });
    if !o.overrides.is_empty() {
        // Only then: the record of a plain preset stays byte-identical.
        sidecar["overrides"] = o.overrides.iter().cloned().collect();
    }
    release::write_json(&dir.join(SIDECAR), &sidecar)?;
    Ok(Generated {
        dir: dir.clone(),
        files,
        kept,
    })
}

/// Create `dir` or check it is empty; with `force`, remove the files a previous run listed in
/// its provenance record and keep (and report) everything else.
fn prepare_dir(dir: &Path, force: bool) -> Result<Vec<String>, SynthError> {
    std::fs::create_dir_all(dir).map_err(|e| SynthError::io(dir, e))?;
    let mut present: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| SynthError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    present.sort();
    if present.is_empty() {
        return Ok(vec![]);
    }
    if !force {
        return Err(SynthError::NonEmptyDir(dir.to_path_buf()));
    }
    let sidecar = dir.join(SIDECAR);
    let previous: Vec<String> = std::fs::read(&sidecar)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("files").cloned())
        .and_then(|f| serde_json::from_value(f).ok())
        .unwrap_or_default();
    for f in &previous {
        // Only plain relative names we wrote ourselves (e.g. `inference/config.json`).
        if f.contains("..") || Path::new(f).is_absolute() {
            continue;
        }
        let path = dir.join(f);
        if path.is_file() {
            std::fs::remove_file(&path).map_err(|e| SynthError::io(&path, e))?;
        }
    }
    let _ = std::fs::remove_dir(dir.join("inference")); // only succeeds when empty
    let mut kept: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| SynthError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    kept.sort();
    Ok(kept)
}

/// Exact values of every tensor as drawn, by canonical release name (dequantised, row-major).
/// Only for the small presets: this materialises the whole model.
pub fn expected_values(
    preset: &str,
    layout: Layout,
    seed: u64,
) -> Result<BTreeMap<String, Vec<f32>>, SynthError> {
    let p = Preset::by_name(preset).ok_or_else(|| SynthError::UnknownPreset(preset.to_string()))?;
    if let Some(why) = p.unsupported(layout) {
        return Err(SynthError::LayoutNotSupported {
            preset: p.name,
            layout: layout_name(layout),
            why,
        });
    }
    match layout {
        Layout::Release => Ok(inventory::logical_tensors(&p.geometry)
            .iter()
            .map(|t| (t.name.clone(), release::logical_values(seed, t)))
            .collect()),
        Layout::Container => {
            static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = std::env::temp_dir().join(format!(
                "ds41-synth-expect-{}-{n}-{preset}-{seed}",
                std::process::id()
            ));
            std::fs::create_dir_all(&tmp).map_err(|e| SynthError::io(&tmp, e))?;
            let mut vals = BTreeMap::new();
            let r = container::write(&p, seed, &tmp, Some(&mut vals));
            let _ = std::fs::remove_dir_all(&tmp);
            r.map(|_| vals)
        }
    }
}

/// sha256 (hex) of every file in a generated directory, by relative name.
pub fn hash_files(dir: &Path, files: &[String]) -> Result<BTreeMap<String, String>, SynthError> {
    let mut out = BTreeMap::new();
    for f in files {
        let path = dir.join(f);
        let mut h = Sha256::new();
        let mut file = std::fs::File::open(&path).map_err(|e| SynthError::io(&path, e))?;
        std::io::copy(&mut file, &mut h).map_err(|e| SynthError::io(&path, e))?;
        out.insert(f.clone(), hex::encode(h.finalize()));
    }
    Ok(out)
}
