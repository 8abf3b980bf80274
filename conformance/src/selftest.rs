//! Negative controls (CONTRACT.md §7): the declared map from each injectable defect of the
//! reference to the checks that must catch it, and the check of that claim.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::case::Case;
use crate::outcome::Outcome;
use crate::runner::{run_case, Context};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    pub defect: String,
    pub cases: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Controls {
    pub controls: Vec<Control>,
}

pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("negative-controls.yaml")
}

/// Load the declarations and check them against the suite and the defect list: every
/// defect declared once, every declared case existing.
pub fn load(path: &Path, suite: &[Case], defects: &[String]) -> anyhow::Result<Controls> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let de = serde_yaml::Deserializer::from_str(&text);
    let c: Controls = serde_path_to_error::deserialize(de)
        .map_err(|e| anyhow::anyhow!("{}: field `{}`: {}", path.display(), e.path(), e.inner()))?;
    for (i, ctl) in c.controls.iter().enumerate() {
        if !defects.contains(&ctl.defect) {
            anyhow::bail!(
                "{}: controls[{i}]: `{}` is not a defect the reference can inject",
                path.display(),
                ctl.defect
            );
        }
        if ctl.cases.is_empty() {
            anyhow::bail!(
                "{}: controls[{i}] (`{}`): no cases declared",
                path.display(),
                ctl.defect
            );
        }
        for name in &ctl.cases {
            if !suite.iter().any(|s| &s.name == name) {
                anyhow::bail!(
                    "{}: controls[{i}] (`{}`): case `{name}` does not exist",
                    path.display(),
                    ctl.defect
                );
            }
        }
    }
    Ok(c)
}

/// Run the declared cases against the reference with `defect` injected. Ok(summary) when at
/// least one Fails; Err(why) otherwise. A declared case that is Skipped (no upstream data) does
/// not count either way; if every declared case is skipped, the control is reported skipped.
pub fn check_control(
    ctl: &Control,
    suite: &[Case],
    ctx: &Context,
) -> Result<String, ControlVerdict> {
    let mut engine = crate::reference::ReferenceEngine::with_defect(&ctl.defect)
        .map_err(|e| ControlVerdict::Broken(e.to_string()))?;
    let mut lines = Vec::new();
    let mut caught = 0;
    let mut ran = 0;
    for name in &ctl.cases {
        let case = suite
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| ControlVerdict::Broken(format!("case `{name}` missing")))?;
        let r = run_case(case, &mut engine, ctx);
        match &r.outcome {
            Outcome::Fail { reason } => {
                caught += 1;
                ran += 1;
                lines.push(format!(
                    "{name}: FAIL (caught): {}",
                    reason.lines().next().unwrap_or("")
                ));
            }
            Outcome::Skipped { reason } => lines.push(format!("{name}: skipped: {reason}")),
            o => {
                ran += 1;
                lines.push(format!("{name}: {} (not caught)", o.label()));
            }
        }
    }
    if ran == 0 {
        return Err(ControlVerdict::Skipped(lines.join("; ")));
    }
    if caught == 0 {
        return Err(ControlVerdict::NotCaught(format!(
            "defect `{}` made no declared check fail:\n{}",
            ctl.defect,
            lines.join("\n")
        )));
    }
    Ok(format!(
        "{caught}/{ran} declared checks caught `{}`",
        ctl.defect
    ))
}

#[derive(Debug)]
pub enum ControlVerdict {
    NotCaught(String),
    Skipped(String),
    Broken(String),
}
