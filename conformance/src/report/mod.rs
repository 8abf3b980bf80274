//! Run reports (CONTRACT.md §8): the machine-readable `report.json`, JUnit XML, per-layer
//! divergence plots, the certificate, and the human progress lines and summary table.

pub mod certificate;
pub mod human;
pub mod junit;
pub mod svg;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::case::Case;
use crate::engine_api::EngineIdentity;
use crate::outcome::Outcome;
use crate::runner::CaseResult;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub total: usize,
    pub pass: usize,
    pub fail: usize,
    pub not_supported: usize,
    pub waived: usize,
    pub skipped: usize,
    pub error: usize,
}

impl Summary {
    pub fn of<'a>(results: impl IntoIterator<Item = &'a CaseResult>) -> Summary {
        let mut s = Summary::default();
        for r in results {
            s.total += 1;
            match r.outcome {
                Outcome::Pass => s.pass += 1,
                Outcome::Fail { .. } => s.fail += 1,
                Outcome::NotSupported { .. } => s.not_supported += 1,
                Outcome::Waived { .. } => s.waived += 1,
                Outcome::Skipped { .. } => s.skipped += 1,
                Outcome::Error { .. } => s.error += 1,
            }
        }
        s
    }

    /// `conformant` (no Fail, no Error, at least one Pass), `non-conformant` (a Fail, or
    /// nothing verified at all), or `error` (the harness could not judge a case).
    pub fn verdict(&self) -> &'static str {
        if self.error > 0 {
            "error"
        } else if self.fail > 0 || self.pass == 0 {
            "non-conformant"
        } else {
            "conformant"
        }
    }

    /// Exit status for `ds41 certify`: 0 conformant, 1 non-conformant, 2 harness error.
    pub fn exit_code(&self) -> i32 {
        match self.verdict() {
            "conformant" => 0,
            "non-conformant" => 1,
            _ => 2,
        }
    }
}

/// A checkpoint a run used, with the sha256 of each of its files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub model: String,
    pub files: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub contract_version: String,
    pub case_list_hash: String,
    pub cases_dir: String,
    pub engine: EngineIdentity,
    pub capabilities: Vec<String>,
    pub profile: String,
    pub filter: Option<String>,
    pub seconds: f64,
    pub summary: Summary,
    pub verdict: String,
    pub checkpoints: Vec<CheckpointRecord>,
    pub results: Vec<CaseResult>,
}

/// sha256 over the selected cases' names and full content (not their on-disk paths), so a
/// certificate pins exactly which checks were run with which data and thresholds.
pub fn case_list_hash(cases: &[Case]) -> String {
    let mut h = Sha256::new();
    for c in cases {
        let v = serde_json::json!({
            "name": c.name, "profile": c.profile, "tolerance": c.tolerance,
            "timeout_s": c.timeout_s, "long": c.long, "spec": c.spec,
        });
        h.update(v.to_string().as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let mut f =
        std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Hash every regular file of a checkpoint directory (recursively, sorted).
pub fn hash_checkpoint(model: &str, dir: &Path) -> anyhow::Result<CheckpointRecord> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut all: Vec<PathBuf> = Vec::new();
    while let Some(d) = stack.pop() {
        if d.is_file() {
            all.push(d);
            continue;
        }
        for e in std::fs::read_dir(&d).map_err(|e| anyhow::anyhow!("{}: {e}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                all.push(p);
            }
        }
    }
    all.sort();
    for p in all {
        let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
        files.push((rel, sha256_file(&p)?));
    }
    Ok(CheckpointRecord {
        model: model.to_string(),
        files,
    })
}

/// Write report.json, junit.xml, plots/*.svg and certificate.json into `dir`.
pub fn write_report_dir(report: &RunReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let json = serde_json::to_vec_pretty(report)?;
    std::fs::write(dir.join("report.json"), &json)?;
    std::fs::write(dir.join("junit.xml"), junit::render(report))?;
    let plots = dir.join("plots");
    for r in &report.results {
        if let Some(svg) = svg::per_layer_plot(r) {
            std::fs::create_dir_all(&plots)?;
            std::fs::write(plots.join(format!("{}.svg", svg::file_stem(&r.name))), svg)?;
        }
    }
    let cert = certificate::Certificate::issue(report, &json);
    std::fs::write(
        dir.join("certificate.json"),
        serde_json::to_vec_pretty(&cert)?,
    )?;
    Ok(())
}
