//! The certificate (CONTRACT.md §8, after VK-GL-CTS submission packages): what was run (the
//! contract version and a hash of the selected cases), on what (engine identity, checkpoint
//! file hashes, profile), with which results, bound together by a sha256 digest and to the
//! report.json it summarises. `ds41 verify-certificate` re-checks all of it. The digest
//! detects any edit; it is not a signature (whoever can run the suite can issue one).

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{CheckpointRecord, ExpectedFailuresRecord, RunReport, Summary};
use crate::engine_api::EngineIdentity;

pub const KIND: &str = "ds41-conformance-certificate/1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseStatus {
    pub name: String,
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    pub kind: String,
    pub contract_version: String,
    pub harness_version: String,
    pub case_list_hash: String,
    pub filter: Option<String>,
    pub engine: EngineIdentity,
    pub capabilities: Vec<String>,
    pub profile: String,
    pub checkpoints: Vec<CheckpointRecord>,
    pub summary: Summary,
    pub verdict: String,
    pub results: Vec<CaseStatus>,
    /// The expected-failure list applied (its sha256 pins the exact waivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_failures: Option<ExpectedFailuresRecord>,
    /// Exact ties were compared strictly (`--canonical-ties`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub canonical_ties: bool,
    /// sha256 of the report.json issued with this certificate.
    pub report_sha256: String,
    /// sha256 of this certificate serialised with `digest` empty.
    pub digest: String,
}

impl Certificate {
    pub fn issue(r: &RunReport, report_json: &[u8]) -> Certificate {
        let mut c = Certificate {
            kind: KIND.into(),
            contract_version: r.contract_version.clone(),
            harness_version: env!("CARGO_PKG_VERSION").into(),
            case_list_hash: r.case_list_hash.clone(),
            filter: r.filter.clone(),
            engine: r.engine.clone(),
            capabilities: r.capabilities.clone(),
            profile: r.profile.clone(),
            checkpoints: r.checkpoints.clone(),
            summary: r.summary.clone(),
            verdict: r.verdict.clone(),
            results: r
                .results
                .iter()
                .map(|x| CaseStatus {
                    name: x.name.clone(),
                    status: x.outcome.label().into(),
                })
                .collect(),
            expected_failures: r.expected_failures.clone(),
            canonical_ties: r.canonical_ties,
            report_sha256: hex::encode(Sha256::digest(report_json)),
            digest: String::new(),
        };
        c.digest = c.compute_digest();
        c
    }

    pub fn compute_digest(&self) -> String {
        let mut c = self.clone();
        c.digest = String::new();
        hex::encode(Sha256::digest(serde_json::to_vec(&c).unwrap_or_default()))
    }
}

/// One finding of a verification (all are collected, not just the first).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub ok: bool,
    pub check: String,
    pub detail: String,
}

/// Where the report.json a certificate summarises is, for [`verify`].
#[derive(Debug, Clone, Copy)]
pub enum ReportCheck<'a> {
    /// Check against this report.json.
    File(&'a Path),
    /// None was given and none lies beside the certificate (expected at this path): refused,
    /// since without it the capabilities, checkpoints and results rest on the digest alone,
    /// which anyone can recompute.
    Missing(&'a Path),
    /// Explicitly not checked (`--no-report`).
    Skipped,
}

/// The fields a certificate may have: any other is refused (the digest covers only these).
const FIELDS: [&str; 16] = [
    "kind",
    "contract_version",
    "harness_version",
    "case_list_hash",
    "filter",
    "engine",
    "capabilities",
    "profile",
    "checkpoints",
    "summary",
    "verdict",
    "results",
    "expected_failures",
    "canonical_ties",
    "report_sha256",
    "digest",
];

/// Verify a certificate: its fields, its digest, its internal consistency (summary and
/// verdict agree with the listed results), the report it summarises (every field the
/// certificate derives from report.json must be what that report gives), the current
/// contract version and case list (if `current_cases_hash` is given).
pub fn verify(
    cert_path: &Path,
    report: ReportCheck,
    current_cases_hash: Option<&str>,
) -> anyhow::Result<(Certificate, Vec<Finding>)> {
    let bytes =
        std::fs::read(cert_path).map_err(|e| anyhow::anyhow!("{}: {e}", cert_path.display()))?;
    let raw: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", cert_path.display()))?;
    let cert: Certificate = serde_json::from_value(raw.clone())
        .map_err(|e| anyhow::anyhow!("{}: not a certificate: {e}", cert_path.display()))?;
    let mut f = Vec::new();
    let mut add = |ok: bool, check: &str, detail: String| {
        f.push(Finding {
            ok,
            check: check.into(),
            detail,
        })
    };
    let unknown: Vec<&String> = raw
        .as_object()
        .map(|o| o.keys().filter(|k| !FIELDS.contains(&k.as_str())).collect())
        .unwrap_or_default();
    add(
        unknown.is_empty(),
        "fields",
        if unknown.is_empty() {
            "no unknown field".into()
        } else {
            format!("unknown field(s) {unknown:?}, not covered by the digest")
        },
    );
    add(cert.kind == KIND, "kind", format!("`{}`", cert.kind));
    let d = cert.compute_digest();
    add(
        d == cert.digest,
        "digest",
        if d == cert.digest {
            "matches the content".into()
        } else {
            format!("content hashes to {d}, certificate says {}", cert.digest)
        },
    );
    add(
        cert.contract_version == crate::CONTRACT_VERSION,
        "contract version",
        format!(
            "certificate {} / this harness {}",
            cert.contract_version,
            crate::CONTRACT_VERSION
        ),
    );
    let mut s = Summary {
        total: cert.results.len(),
        ..Default::default()
    };
    for r in &cert.results {
        match r.status.as_str() {
            "PASS" => s.pass += 1,
            "FAIL" => s.fail += 1,
            "NOT-SUPPORTED" => s.not_supported += 1,
            "WAIVED" => s.waived += 1,
            "SKIPPED" => s.skipped += 1,
            "ERROR" => s.error += 1,
            _ => {}
        }
    }
    add(
        s == cert.summary,
        "summary",
        if s == cert.summary {
            summary_line(&s)
        } else {
            format!(
                "the listed results give {}; the certificate's summary says {} ({})",
                summary_line(&s),
                summary_line(&cert.summary),
                summary_differences(&s, &cert.summary, "results", "summary")
            )
        },
    );
    add(
        s.verdict() == cert.verdict,
        "verdict",
        format!(
            "results give `{}`, certificate says `{}`",
            s.verdict(),
            cert.verdict
        ),
    );
    if let Some(h) = current_cases_hash {
        add(
            h == cert.case_list_hash,
            "case list",
            if h == cert.case_list_hash {
                "matches the current suite".into()
            } else {
                format!(
                    "the current suite hashes to {h}, the certificate to {}",
                    cert.case_list_hash
                )
            },
        );
    }
    match report {
        ReportCheck::Skipped => add(
            true,
            "report",
            "not checked (--no-report): capabilities, checkpoints and results rest on the digest alone".into(),
        ),
        ReportCheck::Missing(p) => add(
            false,
            "report",
            format!(
                "{} does not exist: give the report.json the certificate was issued with \
                 (--report FILE), or --no-report to check the certificate alone",
                p.display()
            ),
        ),
        ReportCheck::File(rp) => match std::fs::read(rp) {
            Ok(b) => {
                let h = hex::encode(Sha256::digest(&b));
                add(
                    h == cert.report_sha256,
                    "report",
                    format!(
                        "{} sha256 {h}{}",
                        rp.display(),
                        if h == cert.report_sha256 {
                            String::new()
                        } else {
                            format!(", certificate says {}", cert.report_sha256)
                        }
                    ),
                );
                match serde_json::from_slice::<RunReport>(&b) {
                    Ok(rep) => compare_with_report(&cert, &rep, &b, &mut add),
                    Err(e) => add(
                        false,
                        "report results",
                        format!("{}: not a run report: {e}", rp.display()),
                    ),
                }
            }
            Err(e) => add(false, "report", format!("{}: {e}", rp.display())),
        },
    }
    Ok((cert, f))
}

fn summary_line(s: &Summary) -> String {
    format!(
        "{} results: {} pass, {} fail, {} not supported, {} waived, {} skipped, {} error",
        s.total, s.pass, s.fail, s.not_supported, s.waived, s.skipped, s.error
    )
}

/// `fail: report 1, certificate 0; pass: ...` for the counts that differ.
fn summary_differences(a: &Summary, b: &Summary, a_name: &str, b_name: &str) -> String {
    let counts = |s: &Summary| {
        [
            ("total", s.total),
            ("pass", s.pass),
            ("fail", s.fail),
            ("not_supported", s.not_supported),
            ("waived", s.waived),
            ("skipped", s.skipped),
            ("error", s.error),
        ]
    };
    counts(a)
        .iter()
        .zip(counts(b))
        .filter(|(x, y)| x.1 != y.1)
        .map(|(x, y)| format!("{}: {a_name} {}, {b_name} {}", x.0, x.1, y.1))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The report the certificate summarises must give the same certificate: the certificate is
/// re-issued from report.json and every field compared (the digest is no signature — an
/// edited field with a recomputed digest is caught here), naming each that differs; then
/// every case's outcome, naming the first that differs.
fn compare_with_report(
    cert: &Certificate,
    rep: &RunReport,
    report_json: &[u8],
    add: &mut impl FnMut(bool, &str, String),
) {
    let mut expected = Certificate::issue(rep, report_json);
    // Not derived from the report: the harness that issued it, the digest (checked above),
    // the report's own hash (the `report` finding) and the results (below).
    expected.harness_version = cert.harness_version.clone();
    expected.digest = cert.digest.clone();
    expected.report_sha256 = cert.report_sha256.clone();
    expected.results = cert.results.clone();
    let mut differ = Vec::new();
    let (want, got) = (
        serde_json::to_value(&expected).unwrap_or_default(),
        serde_json::to_value(cert).unwrap_or_default(),
    );
    let null = serde_json::Value::Null;
    for field in FIELDS {
        let (w, g) = (
            want.get(field).unwrap_or(&null),
            got.get(field).unwrap_or(&null),
        );
        if w == g {
            continue;
        }
        differ.push(match field {
            "summary" => format!(
                "summary ({})",
                summary_differences(&rep.summary, &cert.summary, "report", "certificate")
            ),
            "checkpoints" => {
                let which = rep
                    .checkpoints
                    .iter()
                    .zip(&cert.checkpoints)
                    .find(|(a, b)| a != b)
                    .map(|(a, _)| format!(" of `{}`", a.model))
                    .unwrap_or_default();
                format!(
                    "checkpoint hashes{which} (report {} checkpoint(s), certificate {})",
                    rep.checkpoints.len(),
                    cert.checkpoints.len()
                )
            }
            "capabilities" => {
                let only = |a: &[String], b: &[String]| -> Vec<String> {
                    a.iter().filter(|x| !b.contains(x)).cloned().collect()
                };
                format!(
                    "capabilities (report only {:?}, certificate only {:?})",
                    only(&rep.capabilities, &cert.capabilities),
                    only(&cert.capabilities, &rep.capabilities)
                )
            }
            other => format!("{other} (report {w}, certificate {g})"),
        });
    }
    add(
        differ.is_empty(),
        "report header",
        if differ.is_empty() {
            "every field the report gives agrees (run identity, capabilities, checkpoint hashes, \
             expected failures, summary and verdict)"
                .into()
        } else {
            format!("the report disagrees on {}", differ.join(", "))
        },
    );
    let mut mismatch = None;
    for i in 0..rep.results.len().max(cert.results.len()) {
        mismatch = match (rep.results.get(i), cert.results.get(i)) {
            (Some(a), Some(b)) if a.name == b.name && a.outcome.label() == b.status => None,
            (Some(a), Some(b)) if a.name == b.name => Some(format!(
                "case `{}`: report {}, certificate {}",
                a.name,
                a.outcome.label(),
                b.status
            )),
            (Some(a), _) => Some(format!(
                "case `{}` of the report is not in the certificate (report {} cases, certificate {})",
                a.name,
                rep.results.len(),
                cert.results.len()
            )),
            (None, Some(b)) => Some(format!(
                "case `{}` of the certificate is not in the report (report {} cases, certificate {})",
                b.name,
                rep.results.len(),
                cert.results.len()
            )),
            (None, None) => None,
        };
        if mismatch.is_some() {
            break;
        }
    }
    add(
        mismatch.is_none(),
        "report results",
        mismatch.unwrap_or_else(|| {
            format!(
                "{} per-case outcomes agree with the certificate",
                cert.results.len()
            )
        }),
    );
}
