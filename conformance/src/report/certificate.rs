//! The certificate (CONTRACT.md §8, after VK-GL-CTS submission packages): what was run (the
//! contract version and a hash of the selected cases), on what (engine identity, checkpoint
//! file hashes, profile), with which results, bound together by a sha256 digest and to the
//! report.json it summarises. `ds41 verify-certificate` re-checks all of it. The digest
//! detects any edit; it is not a signature (whoever can run the suite can issue one).

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{CheckpointRecord, RunReport, Summary};
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

/// Verify a certificate: its digest, its internal consistency (summary and verdict agree
/// with the listed results), the report it names (if `report` is given), the current
/// contract version and case list (if `current_cases_hash` is given).
pub fn verify(
    cert_path: &Path,
    report: Option<&Path>,
    current_cases_hash: Option<&str>,
) -> anyhow::Result<(Certificate, Vec<Finding>)> {
    let bytes =
        std::fs::read(cert_path).map_err(|e| anyhow::anyhow!("{}: {e}", cert_path.display()))?;
    let cert: Certificate = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a certificate: {e}", cert_path.display()))?;
    let mut f = Vec::new();
    let mut add = |ok: bool, check: &str, detail: String| {
        f.push(Finding {
            ok,
            check: check.into(),
            detail,
        })
    };
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
    let line = |s: &Summary| {
        format!(
            "{} results: {} pass, {} fail, {} not supported, {} waived, {} skipped, {} error",
            s.total, s.pass, s.fail, s.not_supported, s.waived, s.skipped, s.error
        )
    };
    add(
        s == cert.summary,
        "summary",
        if s == cert.summary {
            line(&s)
        } else {
            format!(
                "the listed results give {}; the certificate's summary says {}",
                line(&s),
                line(&cert.summary)
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
    if let Some(rp) = report {
        match std::fs::read(rp) {
            Ok(b) => {
                let h = hex::encode(Sha256::digest(&b));
                add(
                    h == cert.report_sha256,
                    "report",
                    format!("{} sha256 {h}", rp.display()),
                );
                match serde_json::from_slice::<RunReport>(&b) {
                    Ok(rep) => compare_with_report(&cert, &rep, &mut add),
                    Err(e) => add(
                        false,
                        "report results",
                        format!("{}: not a run report: {e}", rp.display()),
                    ),
                }
            }
            Err(e) => add(false, "report", format!("{}: {e}", rp.display())),
        }
    }
    Ok((cert, f))
}

/// The report the certificate summarises must say the same: run identity, checkpoint hashes,
/// summary, verdict and every case's outcome (naming the first that differs).
fn compare_with_report(
    cert: &Certificate,
    rep: &RunReport,
    add: &mut impl FnMut(bool, &str, String),
) {
    let mut differ = Vec::new();
    if rep.case_list_hash != cert.case_list_hash {
        differ.push(format!(
            "case_list_hash (report {}, certificate {})",
            rep.case_list_hash, cert.case_list_hash
        ));
    }
    if rep.engine != cert.engine {
        differ.push("engine".to_string());
    }
    if rep.profile != cert.profile {
        differ.push(format!(
            "profile (report {}, certificate {})",
            rep.profile, cert.profile
        ));
    }
    if rep.checkpoints != cert.checkpoints {
        let which = rep
            .checkpoints
            .iter()
            .zip(&cert.checkpoints)
            .find(|(a, b)| a != b)
            .map(|(a, _)| format!(" of `{}`", a.model))
            .unwrap_or_default();
        differ.push(format!("checkpoint hashes{which}"));
    }
    if rep.summary != cert.summary || rep.verdict != cert.verdict {
        differ.push(format!(
            "summary/verdict (report `{}`, certificate `{}`)",
            rep.verdict, cert.verdict
        ));
    }
    add(
        differ.is_empty(),
        "report header",
        if differ.is_empty() {
            "run identity, checkpoint hashes, summary and verdict agree".into()
        } else {
            format!("the report disagrees on {}", differ.join(", "))
        },
    );
    let mut mismatch = None;
    for i in 0..rep.results.len().max(cert.results.len()) {
        match (rep.results.get(i), cert.results.get(i)) {
            (Some(a), Some(b)) if a.name == b.name && a.outcome.label() == b.status => {}
            (Some(a), Some(b)) if a.name == b.name => {
                mismatch = Some(format!(
                    "case `{}`: report {}, certificate {}",
                    a.name,
                    a.outcome.label(),
                    b.status
                ));
            }
            (Some(a), _) => {
                mismatch = Some(format!(
                    "case `{}` of the report is not in the certificate",
                    a.name
                ));
            }
            (None, Some(b)) => {
                mismatch = Some(format!(
                    "case `{}` of the certificate is not in the report",
                    b.name
                ));
            }
            (None, None) => {}
        }
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
