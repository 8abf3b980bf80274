//! `ds41 certify`: run the conformance suite against an engine (CONTRACT.md).
//!
//! `--engine reference` (default) is the built-in reference in process; a path ending in
//! `.yaml`/`.yml` is a command profile; anything else is a command speaking PROTOCOL.md.
//! With no arguments: generate the synthetic presets the suite uses into a temporary
//! directory and certify the built-in reference. Exit: 0 conformant, 1 non-conformant,
//! 2 harness or configuration error (including selecting zero cases).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{anyhow, bail};

use ds41_conformance::engine_api::Engine;
use ds41_conformance::gates::{GateSet, ProfileName};
use ds41_conformance::locations::ReleaseSnapshot;
use ds41_conformance::reference::ReferenceEngine;
use ds41_conformance::report::{self, human, RunReport, Summary};
use ds41_conformance::runner::{self, Context, ExpectedFailures, ModelStore};

#[derive(clap::Args)]
pub struct Args {
    /// `reference`, a command profile (`*.yaml`), or a command speaking the JSON-lines protocol.
    #[arg(long, default_value = "reference")]
    pub engine: String,
    /// Inject a defect into the built-in reference (negative controls; see --list-defects).
    #[arg(long)]
    pub defect: Option<String>,
    /// List the defects --defect can inject, and exit.
    #[arg(long)]
    pub list_defects: bool,
    /// The engine breaks exact ties by the canonical rule (largest first, equal values ->
    /// lower index): decisions at golden margin 0 are compared strictly, not excused.
    #[arg(long)]
    pub canonical_ties: bool,
    /// Case directory (default: the cases built into this binary).
    #[arg(long)]
    pub cases: Option<PathBuf>,
    /// Tolerance profiles directory (default: the gates built into this binary).
    #[arg(long)]
    pub gates: Option<PathBuf>,
    /// Run only cases whose name contains this (repeatable).
    #[arg(long)]
    pub filter: Vec<String>,
    /// Filters match whole case names.
    #[arg(long)]
    pub exact: bool,
    /// Judge every case by at least this profile (`quantized` for requantised engines).
    #[arg(long, default_value = "exact")]
    pub profile: String,
    /// Also run the long tier.
    #[arg(long)]
    pub long: bool,
    /// Expected-failure list (default: gates/expected-failures/<engine name>.yaml if present).
    #[arg(long)]
    pub expected_failures: Option<PathBuf>,
    /// Seconds a protocol engine may take to answer its first `hello` (a restart later in the
    /// run counts against the case's own timeout).
    #[arg(long, default_value_t = ds41_conformance::protocol::DEFAULT_HELLO_TIMEOUT.as_secs_f64(), value_parser = parse_hello_timeout)]
    pub hello_timeout: f64,
    /// Write report.json, junit.xml, plots/ and certificate.json here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Print the JSON report on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// A snapshot of the DeepSeek-V4.1-Flash release (default: $DS41_RELEASE, else the
    /// Hugging Face hub cache); its tokenizer, configs and encoding tests are verified against
    /// their pins. Without one, only the cases reading release files are skipped.
    #[arg(long)]
    pub release: Option<PathBuf>,
    /// The external upstream data set (default: $DS41_UPSTREAM): the official_a goldens. Its
    /// cases join the run only when it is given.
    #[arg(long)]
    pub upstream: Option<PathBuf>,
    /// Keep generated models and engine outputs here instead of a temporary directory.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// List the selected cases and exit.
    #[arg(long)]
    pub list: bool,
    /// Show notes and reasons for every case.
    #[arg(long, short)]
    pub verbose: bool,
}

fn parse_hello_timeout(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds in (0, 86400]")),
    }
}

pub fn make_engine(
    spec: &str,
    defect: Option<&str>,
    hello_timeout: std::time::Duration,
) -> anyhow::Result<Box<dyn Engine>> {
    if spec == "reference" {
        return Ok(Box::new(match defect {
            None => ReferenceEngine::new(),
            Some(d) => ReferenceEngine::with_defect(d)?,
        }));
    }
    if defect.is_some() {
        bail!("--defect applies to the built-in reference only");
    }
    if spec.ends_with(".yaml") || spec.ends_with(".yml") {
        return Ok(Box::new(ds41_conformance::profile::ProfileEngine::new(
            std::path::Path::new(spec),
        )?));
    }
    Ok(Box::new(
        ds41_conformance::protocol::AdapterEngine::start_within(spec, hello_timeout)?,
    ))
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let started = Instant::now();
    if a.list_defects {
        for d in ds41_conformance::reference::defects() {
            println!("{d}");
        }
        return Ok(0);
    }
    let _tmp;
    let work_dir = match &a.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            // Checkpoint paths under it are handed to engines, which may run elsewhere.
            ds41_conformance::locations::absolute(d)
        }
        None => {
            _tmp = ds41_conformance::interrupt::ScratchDir::new("ds41-certify-")?;
            _tmp.path().to_path_buf()
        }
    };
    // The cases, gates and goldens built into the binary, written out for this run: the same
    // from any directory, with or without the source tree.
    let repo_root = ds41_conformance::embedded::materialize(
        &tempfile::Builder::new()
            .prefix("data-")
            .tempdir_in(&work_dir)?
            .keep(),
    )?;
    let cases_dir = a
        .cases
        .clone()
        .unwrap_or_else(|| repo_root.join(ds41_conformance::embedded::CASES_DIR));
    let gates = GateSet::load(
        &a.gates
            .clone()
            .unwrap_or_else(|| repo_root.join(ds41_conformance::embedded::GATES_DIR)),
    )?;
    let run_profile = ProfileName::parse(&a.profile).ok_or_else(|| {
        anyhow!(
            "--profile `{}`: expected exact, upstream or quantized",
            a.profile
        )
    })?;
    let all = runner::load_suite(&cases_dir)?;
    let upstream = a
        .upstream
        .clone()
        .or_else(|| {
            std::env::var_os("DS41_UPSTREAM")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .map(|d| ds41_conformance::locations::absolute(&d));
    // The external set is opt-in: without --upstream its cases are not part of the run (not
    // run, not counted as skipped); the run header says how many it would add.
    let (external, suite): (Vec<_>, Vec<_>) = all
        .iter()
        .cloned()
        .partition(|c| c.needs_upstream() && upstream.is_none());
    let cases = runner::select(suite, &a.filter, a.exact, a.long);
    let external = runner::select(external, &a.filter, a.exact, a.long).len();
    if cases.is_empty() {
        bail!(
            "no case selected (filters {:?}{}{}; {} cases in {})",
            a.filter,
            if a.long { "" } else { ", long tier excluded" },
            if external > 0 {
                format!(", {external} external case(s) need --upstream DIR")
            } else {
                String::new()
            },
            all.len(),
            cases_dir.display()
        );
    }
    // Before anything runs: a --release / DS41_RELEASE that is not a directory is an error.
    let release = ReleaseSnapshot::locate(a.release.as_deref())?;
    if a.list {
        for c in &cases {
            println!("{}", c.name);
        }
        return Ok(0);
    }
    let mut engine = make_engine(
        &a.engine,
        a.defect.as_deref(),
        std::time::Duration::from_secs_f64(a.hello_timeout),
    )?;
    let identity = engine.identity();
    let xfail_path = a.expected_failures.clone().or_else(|| {
        let p = gates
            .dir
            .join("expected-failures")
            .join(format!("{}.yaml", identity.name));
        p.exists().then_some(p)
    });
    let xfail = match &xfail_path {
        Some(p) => Some((ExpectedFailures::load(p, &all)?, report::sha256_file(p)?)),
        None => None,
    };
    let mut rerun = format!(
        "cargo run --release -- certify --engine {}",
        shell_quote(&a.engine)
    );
    if let Some(d) = &a.defect {
        rerun += &format!(" --defect {}", shell_quote(d));
    }
    if a.cases.is_some() {
        rerun += &format!(" --cases {}", shell_quote(&cases_dir.display().to_string()));
    }
    if run_profile != ProfileName::Exact {
        rerun += &format!(" --profile {run_profile}");
    }
    for (flag, dir) in [("--release", &a.release), ("--upstream", &a.upstream)] {
        if let Some(d) = dir {
            rerun += &format!(" {flag} {}", shell_quote(&d.display().to_string()));
        }
    }
    if a.canonical_ties {
        rerun += " --canonical-ties";
    }
    rerun += " --exact --verbose --filter '{case}'";
    let ctx = Context {
        repo_root,
        cases_dir: cases_dir.clone(),
        gates,
        run_profile,
        canonical_ties: a.canonical_ties,
        upstream: upstream.clone(),
        release,
        work_dir: work_dir.clone(),
        models: ModelStore::new(work_dir.join("models")),
        reference: Mutex::new(Box::new(ReferenceEngine::new())),
        rerun_template: rerun,
    };
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "ds41 certify: {} case(s), engine {} {} ({}), profile {}",
        cases.len(),
        identity.name,
        identity.version,
        identity.driver,
        run_profile,
    );
    let _ = writeln!(err, "{}", data_roots_line(&ctx, &cases, external));
    runner::pregenerate(&cases, &ctx, |line| {
        let _ = writeln!(err, "{line}");
    });
    let results = runner::run_cases(
        &cases,
        engine.as_mut(),
        &ctx,
        xfail.as_ref().map(|x| &x.0),
        |i, r| human::progress_line(&mut err, i + 1, cases.len(), r, a.verbose),
    );
    let summary = Summary::of(&results);
    let mut checkpoints = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in &results {
        for (model, dir) in &r.details.models {
            if seen.insert(model.clone()) {
                match report::hash_checkpoint(model, std::path::Path::new(dir)) {
                    Ok(c) => checkpoints.push(c),
                    Err(e) => eprintln!("ds41 certify: cannot hash checkpoint {model}: {e:#}"),
                }
            }
        }
    }
    let rep = RunReport {
        contract_version: ds41_conformance::CONTRACT_VERSION.into(),
        case_list_hash: report::case_list_hash(&cases),
        cases_dir: cases_dir.display().to_string(),
        engine: identity,
        capabilities: engine
            .capabilities()
            .iter()
            .map(|c| c.as_str().to_string())
            .collect(),
        profile: run_profile.as_str().into(),
        filter: if a.filter.is_empty() {
            None
        } else {
            Some(a.filter.join(" | "))
        },
        seconds: started.elapsed().as_secs_f64(),
        verdict: summary.verdict().into(),
        summary,
        checkpoints,
        expected_failures: match (&xfail_path, &xfail) {
            (Some(p), Some((x, sha256))) => Some(report::ExpectedFailuresRecord {
                path: p.display().to_string(),
                sha256: sha256.clone(),
                engine: x.engine.clone(),
                entries: x.entries.len(),
            }),
            _ => None,
        },
        canonical_ties: a.canonical_ties,
        results,
    };
    if let Some(d) = &a.report {
        report::write_report_dir(&rep, d)?;
        let _ = writeln!(err, "report: {}", d.display());
    }
    if let Some(j) = &a.junit {
        std::fs::write(j, report::junit::render(&rep))
            .map_err(|e| anyhow!("{}: {e}", j.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
        human::summary_table(&mut err, &rep);
    } else {
        human::summary_table(&mut std::io::stdout(), &rep);
    }
    drop(engine);
    Ok(rep.summary.exit_code())
}

/// Where the release files and the upstream set come from, and what is skipped without them.
fn data_roots_line(
    ctx: &Context,
    cases: &[ds41_conformance::case::Case],
    external: usize,
) -> String {
    use ds41_conformance::locations::Found;
    let release = match &ctx.release {
        Some(r) => {
            let via = match r.found {
                Found::Flag => "--release",
                Found::Env => "DS41_RELEASE",
                Found::HubCache => "hub cache",
            };
            format!("{} ({via})", r.dir.display())
        }
        None => format!(
            "none found ({} case(s) reading release files are skipped; point --release DIR at a snapshot)",
            cases.iter().filter(|c| c.needs_release()).count()
        ),
    };
    let upstream = match &ctx.upstream {
        Some(u) => u.display().to_string(),
        None if external == 0 => "not given".to_string(),
        None => format!(
            "not given ({external} external case(s) not in this run; --upstream DIR adds them)"
        ),
    };
    format!("release snapshot: {release}; upstream set: {upstream}")
}
