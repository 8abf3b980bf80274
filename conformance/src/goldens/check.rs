//! `ds41 goldens check`: every file under goldens/ is covered by exactly one provenance record,
//! and every recorded sha256 (outputs, inputs) matches the bytes on disk. Problems are
//! collected, not thrown, so one run lists all of them, each naming its file.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::command;
use super::errata::{Errata, GoldenRef};
use super::hashing::{sha256_file, sha256_path};
use super::provenance::{Location, Provenance, SIDECAR_SUFFIX};
use super::GoldenError;
use crate::interrupt::ScratchDir;

/// Files under goldens/ that are documentation or tooling, not goldens.
fn is_exempt(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    rel.starts_with("regen/")
        || name == "README.md"
        || name == ".gitignore"
        || name == ".gitkeep"
        || rel == "ERRATA.md"
        || rel == "errata.yaml"
        || rel.contains("/__pycache__/")
}

#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub repo_root: PathBuf,
    /// Defaults to `<repo_root>/goldens`.
    pub goldens_dir: Option<PathBuf>,
    pub upstream: Option<PathBuf>,
    /// The release snapshot directory, if one was found (`release` inputs).
    pub release: Option<PathBuf>,
    /// Rebuild generated inputs (e.g. `ds41 synth`) and compare their hashes.
    pub deep: bool,
    /// The `ds41` binary used for `ds41 ...` commands in `--deep` mode.
    pub ds41: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Fail,
    Skip,
}

#[derive(Debug, Clone)]
pub struct Finding {
    pub status: Status,
    /// The golden, record or input the finding is about.
    pub subject: PathBuf,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        write!(f, "{tag} {}: {}", self.subject.display(), self.message)
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub records: usize,
    pub goldens: usize,
}

impl Report {
    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }
    pub fn failures(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.status == Status::Fail)
    }
    fn push(&mut self, status: Status, subject: &Path, message: impl Into<String>) {
        self.findings.push(Finding {
            status,
            subject: subject.to_path_buf(),
            message: message.into(),
        });
    }
}

/// Run every check; `Err` only when goldens/ itself cannot be read.
pub fn check(opts: &CheckOptions) -> Result<Report, GoldenError> {
    let goldens_dir = opts
        .goldens_dir
        .clone()
        .unwrap_or_else(|| opts.repo_root.join("goldens"));
    let mut report = Report::default();
    let files = list_files(&goldens_dir)?;

    let errata_path = goldens_dir.join("errata.yaml");
    let errata = if errata_path.exists() {
        match Errata::load(&errata_path) {
            Ok(e) => {
                check_errata_refs(&e, &errata_path, opts, &mut report);
                Some(e)
            }
            Err(e) => {
                report.push(Status::Fail, &errata_path, e.to_string());
                None
            }
        }
    } else {
        None
    };

    let mut covered: BTreeMap<String, PathBuf> = BTreeMap::new();
    for rel in files.iter().filter(|r| r.ends_with(SIDECAR_SUFFIX)) {
        let sidecar = goldens_dir.join(rel);
        report.records += 1;
        let record = match Provenance::load(&sidecar) {
            Ok(r) => r,
            Err(e) => {
                report.push(Status::Fail, &sidecar, e.to_string());
                continue;
            }
        };
        let base = rel.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        for out in &record.outputs {
            let out_rel = if base.is_empty() {
                out.path.clone()
            } else {
                format!("{base}/{}", out.path)
            };
            if let Some(other) = covered.insert(out_rel.clone(), sidecar.clone()) {
                report.push(
                    Status::Fail,
                    &goldens_dir.join(&out_rel),
                    format!(
                        "covered by two records: {} and {}",
                        other.display(),
                        sidecar.display()
                    ),
                );
            }
            check_output(&goldens_dir.join(&out_rel), out, &sidecar, &mut report);
        }
        check_inputs(&record, &sidecar, opts, &mut report);
        for (id, behaviour) in &record.errata {
            match &errata {
                Some(e) => {
                    if let Err(reason) = e.behaviour(id, behaviour) {
                        report.push(Status::Fail, &sidecar, format!("field `errata`: {reason}"));
                    }
                }
                None => report.push(
                    Status::Fail,
                    &sidecar,
                    format!("names erratum `{id}` but goldens/errata.yaml is missing or invalid"),
                ),
            }
        }
    }

    for rel in &files {
        if rel.ends_with(SIDECAR_SUFFIX) || is_exempt(rel) {
            continue;
        }
        let path = goldens_dir.join(rel);
        if rel.ends_with(".snap.new") || rel.ends_with(".pending-snap") {
            report.push(
                Status::Fail,
                &path,
                "unreviewed insta snapshot (run `cargo insta review`)",
            );
        } else if rel.ends_with(".snap") {
            report.goldens += 1;
            check_insta_header(&path, &mut report);
        } else {
            report.goldens += 1;
            if !covered.contains_key(rel) {
                report.push(
                    Status::Fail,
                    &path,
                    "no provenance record covers this file (add `<name>.provenance.json`, see goldens/README.md)",
                );
            }
        }
    }
    Ok(report)
}

fn check_output(path: &Path, out: &super::provenance::Output, sidecar: &Path, report: &mut Report) {
    let Some(expected) = &out.sha256 else {
        report.push(
            Status::Fail,
            path,
            format!(
                "never blessed (sha256 is null in {}); run `ds41 goldens bless`",
                sidecar.display()
            ),
        );
        return;
    };
    if !path.is_file() {
        report.push(
            Status::Fail,
            path,
            format!("missing (listed in {})", sidecar.display()),
        );
        return;
    }
    match sha256_file(path) {
        Ok(actual) if &actual == expected => {
            let size = std::fs::metadata(path).map(|m| m.len()).ok();
            match (out.bytes, size) {
                (Some(b), Some(s)) if b != s => report.push(
                    Status::Fail,
                    path,
                    format!("size {s} bytes, record says {b}"),
                ),
                _ => report.push(Status::Ok, path, "sha256 matches its record"),
            }
        }
        Ok(actual) => report.push(
            Status::Fail,
            path,
            format!(
                "sha256 mismatch: file has {actual}, {} records {expected}",
                sidecar.display()
            ),
        ),
        Err(e) => report.push(Status::Fail, path, e.to_string()),
    }
}

fn check_inputs(record: &Provenance, sidecar: &Path, opts: &CheckOptions, report: &mut Report) {
    for input in &record.inputs {
        let label = format!("input `{}` ({})", input.name, input.path);
        let resolved = match input.location {
            Location::Repo => opts.repo_root.join(&input.path),
            Location::Upstream => match &opts.upstream {
                Some(u) => u.join(&input.path),
                None => {
                    report.push(
                        Status::Skip,
                        sidecar,
                        format!("{label}: SKIPPED: DS41_UPSTREAM not set"),
                    );
                    continue;
                }
            },
            Location::Release => match &opts.release {
                Some(r) => r.join(&input.path),
                None => {
                    report.push(
                        Status::Skip,
                        sidecar,
                        format!(
                            "{label}: SKIPPED: {}",
                            crate::locations::no_release_reason()
                        ),
                    );
                    continue;
                }
            },
            Location::External => {
                report.push(
                    Status::Skip,
                    sidecar,
                    format!(
                        "{label}: external input, not verifiable here (recorded sha256 {})",
                        input.sha256
                    ),
                );
                continue;
            }
            Location::Generated => {
                if !opts.deep {
                    report.push(
                        Status::Skip,
                        sidecar,
                        format!("{label}: generated input, rebuilt only with --deep"),
                    );
                    continue;
                }
                match materialise(input, sidecar, opts) {
                    Ok((_tmp, hash)) => {
                        compare_input(&hash, &input.sha256, &label, sidecar, report);
                    }
                    Err(e) => report.push(Status::Fail, sidecar, format!("{label}: {e}")),
                }
                continue;
            }
        };
        if !resolved.exists() {
            report.push(
                Status::Fail,
                sidecar,
                format!("{label}: {} does not exist", resolved.display()),
            );
            continue;
        }
        match sha256_path(&resolved) {
            Ok(hash) => compare_input(&hash, &input.sha256, &label, sidecar, report),
            Err(e) => report.push(Status::Fail, sidecar, format!("{label}: {e}")),
        }
    }
}

fn compare_input(actual: &str, expected: &str, label: &str, sidecar: &Path, report: &mut Report) {
    if actual == expected {
        report.push(Status::Ok, sidecar, format!("{label}: sha256 matches"));
    } else {
        report.push(
            Status::Fail,
            sidecar,
            format!("{label}: sha256 mismatch: input has {actual}, record says {expected}"),
        );
    }
}

/// Re-run every reference-engine record (a bless dry run) and add a failure for each output
/// whose content differs from the committed golden.
pub fn rerun_reference(opts: &CheckOptions, report: &mut Report) -> Result<(), GoldenError> {
    let results = super::bless::bless(&super::bless::BlessOptions {
        repo_root: opts.repo_root.clone(),
        goldens_dir: opts.goldens_dir.clone(),
        upstream: opts.upstream.clone(),
        ds41: opts.ds41.clone(),
        filter: None,
        dry_run: true,
        ci: false,
    })?;
    for r in results {
        for (path, change) in r.outputs {
            if change.is_unchanged() {
                report.push(Status::Ok, &path, "re-run reproduces it");
            } else {
                report.push(
                    Status::Fail,
                    &path,
                    format!(
                        "re-running its command gives a different result ({}); review and `ds41 goldens bless`",
                        change.to_string().trim_end()
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Build a generated input in a fresh temporary directory; returns it (kept alive) and its
/// tree hash.
pub fn materialise(
    input: &super::provenance::Input,
    sidecar: &Path,
    opts: &CheckOptions,
) -> Result<(ScratchDir, String), GoldenError> {
    let tmp =
        ScratchDir::new("ds41-goldens-").map_err(|e| GoldenError::io(&std::env::temp_dir(), e))?;
    let out = tmp.path().join(&input.name);
    std::fs::create_dir_all(&out).map_err(|e| GoldenError::io(&out, e))?;
    let template = input.command.as_deref().unwrap_or_default();
    let cmd = command::expand(template, &out, &BTreeMap::new(), &opts.ds41).map_err(|reason| {
        GoldenError::Field {
            path: sidecar.to_path_buf(),
            field: format!("inputs.{}.command", input.name),
            reason,
        }
    })?;
    command::run(&cmd, &opts.repo_root, sidecar)?;
    let hash = sha256_path(&out)?;
    Ok((tmp, hash))
}

fn check_insta_header(path: &Path, report: &mut Report) {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let header = text
                .strip_prefix("---\n")
                .and_then(|rest| rest.split_once("\n---\n").map(|(h, _)| h));
            match header {
                Some(h) if h.lines().any(|l| l.starts_with("source:")) => report.push(
                    Status::Ok,
                    path,
                    "insta snapshot; provenance in its header (source test)",
                ),
                _ => report.push(
                    Status::Fail,
                    path,
                    "an insta snapshot must start with a `---` header naming its `source:`",
                ),
            }
        }
        Err(e) => report.push(Status::Fail, path, e.to_string()),
    }
}

fn check_errata_refs(
    errata: &Errata,
    errata_path: &Path,
    opts: &CheckOptions,
    report: &mut Report,
) {
    let mut missing_upstream = BTreeSet::new();
    for e in &errata.errata {
        for b in &e.behaviours {
            for g in &b.goldens {
                let Some(r) = GoldenRef::parse(g) else {
                    continue;
                };
                match r.resolve(&opts.repo_root, opts.upstream.as_deref()) {
                    Some(p) if p.exists() => {}
                    Some(p) => report.push(
                        Status::Fail,
                        errata_path,
                        format!(
                            "erratum `{}` behaviour `{}`: golden {} does not exist",
                            e.id,
                            b.name,
                            p.display()
                        ),
                    ),
                    None => {
                        missing_upstream.insert(e.id.clone());
                    }
                }
            }
        }
    }
    if !missing_upstream.is_empty() {
        report.push(
            Status::Skip,
            errata_path,
            format!(
                "upstream golden references of {} not checked: SKIPPED: DS41_UPSTREAM not set",
                missing_upstream.into_iter().collect::<Vec<_>>().join(", ")
            ),
        );
    }
}

/// Every regular file below `dir`, as `/`-separated relative paths, sorted.
pub fn list_files(dir: &Path) -> Result<Vec<String>, GoldenError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), GoldenError> {
        for entry in std::fs::read_dir(dir).map_err(|e| GoldenError::io(dir, e))? {
            let entry = entry.map_err(|e| GoldenError::io(dir, e))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(|e| GoldenError::io(&path, e))?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() {
                let rel = path.strip_prefix(root).expect("below root");
                out.push(
                    rel.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}
