//! `ds41 verify-certificate CERT`: check a certificate's fields, digest and consistency, the
//! report.json it was issued with (required unless `--no-report`), the contract version, and
//! that the current suite still holds the cases it lists with the same content. Exit 0 valid,
//! 1 invalid, 2 unreadable.

use std::path::PathBuf;

use ds41_conformance::report::certificate;
use ds41_conformance::runner;

#[derive(clap::Args)]
pub struct Args {
    /// certificate.json
    pub certificate: PathBuf,
    /// The report.json it was issued with (default: report.json next to the certificate).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Compare the case list with this suite (default: the repository's conformance/cases).
    #[arg(long)]
    pub cases: Option<PathBuf>,
    /// Do not compare the case list with a suite.
    #[arg(long)]
    pub no_cases: bool,
    /// Check the certificate alone, without its report.json (the capabilities, checkpoints
    /// and results then rest on the digest, which anyone can recompute).
    #[arg(long, conflicts_with = "report")]
    pub no_report: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let beside = a.certificate.with_file_name("report.json");
    let report = match &a.report {
        _ if a.no_report => certificate::ReportCheck::Skipped,
        Some(p) => certificate::ReportCheck::File(p),
        None if beside.exists() => certificate::ReportCheck::File(&beside),
        None => certificate::ReportCheck::Missing(&beside),
    };
    let bytes = std::fs::read(&a.certificate)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.certificate.display()))?;
    let names: Vec<String> = serde_json::from_slice::<certificate::Certificate>(&bytes)
        .map(|c| c.results.into_iter().map(|r| r.name).collect())
        .unwrap_or_default();
    let current = if a.no_cases {
        None
    } else {
        let dir = a.cases.clone().unwrap_or_else(runner::default_cases_dir);
        let all = runner::load_suite(&dir)?;
        let selected: Vec<_> = names
            .iter()
            .filter_map(|n| all.iter().find(|c| &c.name == n).cloned())
            .collect();
        if selected.len() == names.len() {
            Some(ds41_conformance::report::case_list_hash(&selected))
        } else {
            Some(format!(
                "(the current suite lacks {} of the certified cases)",
                names.len() - selected.len()
            ))
        }
    };
    let (cert, findings) = certificate::verify(&a.certificate, report, current.as_deref())?;
    println!(
        "certificate {} — engine {} {} ({}), profile {}, verdict {}",
        a.certificate.display(),
        cert.engine.name,
        cert.engine.version,
        cert.engine.driver,
        cert.profile,
        cert.verdict.to_uppercase()
    );
    for f in &findings {
        println!(
            "  {:<4} {:<16} {}",
            if f.ok { "ok" } else { "BAD" },
            f.check,
            f.detail
        );
    }
    let bad = findings.iter().filter(|f| !f.ok).count();
    println!(
        "{}",
        if bad == 0 {
            "VALID".to_string()
        } else {
            format!("INVALID ({bad} check(s) failed)")
        }
    );
    Ok(if bad == 0 { 0 } else { 1 })
}
