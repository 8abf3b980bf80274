//! Run reports (CONTRACT.md §8): the machine-readable `report.json`, JUnit XML, per-layer
//! divergence plots, the certificate, and the human progress lines and summary table.

pub mod certificate;
pub mod float;
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
    #[serde(with = "float")]
    pub seconds: f64,
    pub summary: Summary,
    pub verdict: String,
    pub checkpoints: Vec<CheckpointRecord>,
    /// The expected-failure list the run applied (CONTRACT.md §6), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_failures: Option<ExpectedFailuresRecord>,
    /// The run compared exact ties strictly (`--canonical-ties`).
    #[serde(default)]
    pub canonical_ties: bool,
    pub results: Vec<CaseResult>,
}

/// Which expected-failure list a run applied: where it was read from, its sha256 (so the
/// exact waivers are pinned), the engine it names and its number of entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailuresRecord {
    pub path: String,
    pub sha256: String,
    pub engine: String,
    pub entries: usize,
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::certificate::{self, ReportCheck};
    use super::float::same;
    use super::*;
    use crate::compare::{Divergence, MetricStatus, SubOp};
    use crate::runner::{Details, DivergenceRecord, MetricRecord};

    /// A report with `x[i]` in its i-th numeric field: every `f64` a report can carry.
    fn report(x: [f64; 7]) -> RunReport {
        let details = Details {
            metrics: vec![MetricRecord {
                run: "12 tokens".into(),
                name: "residual".into(),
                status: MetricStatus::Fail,
                text: "over".into(),
            }],
            first_divergence: Some(DivergenceRecord {
                run: "12 tokens".into(),
                at: Divergence {
                    token: 1,
                    layer: Some(2),
                    subop: SubOp::TopK,
                    metric: "decision set".into(),
                    value: x[0],
                    threshold: x[1],
                    detail: String::new(),
                },
            }),
            per_layer: vec![("12 tokens".into(), vec![Some(x[2]), Some(x[3])])],
            residual_threshold: Some(x[4]),
            fragile_flips: 1,
            exact_ties: 1,
            notes: vec![],
            models: vec![],
        };
        let result = CaseResult {
            name: "residual::x::y".into(),
            family: "residual".into(),
            profile: "exact".into(),
            outcome: Outcome::fail("diverged"),
            seconds: x[5],
            rerun: String::new(),
            details,
        };
        let summary = Summary::of([&result]);
        RunReport {
            contract_version: crate::CONTRACT_VERSION.into(),
            case_list_hash: "0".repeat(64),
            cases_dir: "cases".into(),
            engine: EngineIdentity {
                name: "e".into(),
                version: "1".into(),
                commit: Some("c".into()),
                driver: "test".into(),
            },
            capabilities: vec!["load".into()],
            profile: "exact".into(),
            filter: Some("residual".into()),
            seconds: x[6],
            verdict: summary.verdict().into(),
            summary,
            checkpoints: vec![],
            expected_failures: None,
            canonical_ties: false,
            results: vec![result],
        }
    }

    fn numbers(r: &RunReport) -> Vec<f64> {
        let c = &r.results[0];
        let d = &c.details.first_divergence.as_ref().unwrap().at;
        let pl = &c.details.per_layer[0].1;
        vec![
            d.value,
            d.threshold,
            pl[0].unwrap(),
            pl[1].unwrap(),
            c.details.residual_threshold.unwrap(),
            c.seconds,
            r.seconds,
        ]
    }

    fn any_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::NAN),
            Just(-0.0),
            any::<f64>(),
        ]
    }

    // A fixed seed keeps the default tests deterministic.
    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(41), ..ProptestConfig::default() })]
        /// Every number of report.json, finite or not, reads back as written, and the
        /// certificate issued with the report verifies against it.
        #[test]
        fn report_numbers_round_trip_and_certify(x in proptest::array::uniform7(any_f64())) {
            let rep = report(x);
            let dir = tempfile::tempdir().unwrap();
            write_report_dir(&rep, dir.path()).unwrap();
            let text = std::fs::read_to_string(dir.path().join("report.json")).unwrap();
            prop_assert!(!text.contains("null"), "{}", text);
            let back: RunReport = serde_json::from_str(&text).unwrap();
            for (a, b) in numbers(&rep).into_iter().zip(numbers(&back)) {
                prop_assert!(same(a, b), "{} read back as {}", a, b);
            }
            prop_assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
            let report_json = dir.path().join("report.json");
            let (_, findings) = certificate::verify(
                &dir.path().join("certificate.json"),
                ReportCheck::File(&report_json),
                None,
            )
            .unwrap();
            let bad: Vec<_> = findings.iter().filter(|f| !f.ok).collect();
            prop_assert!(bad.is_empty(), "{:?}", bad);
        }
    }
}
