//! Human output: one progress line per case as it completes (failures with their reason and
//! the command that re-runs them), then a summary table per family and the verdict.

use std::io::Write;

use super::{RunReport, Summary};
use crate::outcome::Outcome;
use crate::runner::CaseResult;

pub fn progress_line(out: &mut impl Write, i: usize, n: usize, r: &CaseResult, verbose: bool) {
    let w = n.to_string().len();
    let _ = writeln!(
        out,
        "[{:>w$}/{n}] {:<13} {}  ({:.2}s)",
        i,
        r.outcome.label(),
        r.name,
        r.seconds,
        w = w
    );
    let show_reason = match &r.outcome {
        Outcome::Fail { .. } | Outcome::Error { .. } | Outcome::Waived { .. } => true,
        Outcome::NotSupported { .. } | Outcome::Skipped { .. } => verbose,
        Outcome::Pass => false,
    };
    if show_reason {
        if let Some(reason) = r.outcome.reason() {
            for line in reason.lines().take(12) {
                let _ = writeln!(out, "      {line}");
            }
        }
        if r.outcome.is_fail() {
            let _ = writeln!(out, "      re-run: {}", r.rerun);
        }
    }
    if verbose {
        for note in &r.details.notes {
            let _ = writeln!(out, "      note: {note}");
        }
    }
}

pub fn summary_table(out: &mut impl Write, report: &RunReport) {
    let families: std::collections::BTreeSet<&str> =
        report.results.iter().map(|r| r.family.as_str()).collect();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<10} {:>6} {:>6} {:>6} {:>8} {:>7} {:>8} {:>6}",
        "family", "cases", "pass", "fail", "not-sup", "waived", "skipped", "error"
    );
    let row = |out: &mut dyn Write, name: &str, s: &Summary| {
        let _ = writeln!(
            out,
            "{:<10} {:>6} {:>6} {:>6} {:>8} {:>7} {:>8} {:>6}",
            name, s.total, s.pass, s.fail, s.not_supported, s.waived, s.skipped, s.error
        );
    };
    for f in families {
        row(
            out,
            f,
            &Summary::of(report.results.iter().filter(|r| r.family == f)),
        );
    }
    row(out, "total", &report.summary);
    let _ = writeln!(out);
    // Why cases were not verdicts, grouped by reason (a skip is never a silent pass).
    let mut grouped: std::collections::BTreeMap<(String, String), (usize, Vec<&str>)> =
        Default::default();
    for r in &report.results {
        let key = match &r.outcome {
            Outcome::Skipped { reason } => ("skipped", reason.clone()),
            Outcome::NotSupported { capability } => (
                "not supported",
                format!("the engine lacks capability `{capability}`"),
            ),
            _ => continue,
        };
        let e = grouped.entry((key.0.to_string(), key.1)).or_default();
        e.0 += 1;
        if !e.1.contains(&r.family.as_str()) {
            e.1.push(&r.family);
        }
    }
    for ((kind, reason), (n, families)) in &grouped {
        let _ = writeln!(
            out,
            "{kind}: {n} case(s) ({}): {reason}",
            families.join(", ")
        );
    }
    let failed: Vec<&str> = report
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail { .. } | Outcome::Error { .. }))
        .map(|r| r.name.as_str())
        .collect();
    for name in failed.iter().take(20) {
        let _ = writeln!(out, "failed: {name}");
    }
    if failed.len() > 20 {
        let _ = writeln!(out, "failed: ... and {} more", failed.len() - 20);
    }
    if !grouped.is_empty() || !failed.is_empty() {
        let _ = writeln!(out);
    }
    let e = &report.engine;
    let _ = writeln!(
        out,
        "engine {} {} ({}), profile {}, contract {}, {:.1}s",
        e.name, e.version, e.driver, report.profile, report.contract_version, report.seconds
    );
    let s = &report.summary;
    let mut caveats = Vec::new();
    if s.not_supported > 0 {
        caveats.push(format!("{} not supported", s.not_supported));
    }
    if s.skipped > 0 {
        caveats.push(format!(
            "{} skipped (missing data: see the reasons above)",
            s.skipped
        ));
    }
    if s.waived > 0 {
        caveats.push(format!("{} waived", s.waived));
    }
    let _ = writeln!(
        out,
        "VERDICT: {}{}",
        report.verdict.to_uppercase(),
        if caveats.is_empty() {
            String::new()
        } else {
            format!(" ({})", caveats.join(", "))
        }
    );
}
