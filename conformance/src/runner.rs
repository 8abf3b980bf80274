//! Running cases against an engine (CONTRACT.md §2–§3, §6): resolve models and data, dispatch
//! each case to its family, turn engine errors into outcomes, apply the expected-failure list,
//! and hand each result to the caller as it completes (progress display, libtest trials).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::case::{Case, DataRef, ModelRef};
use crate::compare::{CompareReport, Divergence, Metric, MetricStatus};
use crate::engine_api::{Capability, Engine, EngineError};
use crate::gates::{GateSet, Gates, ProfileName};
use crate::locations::DataRoots;
use crate::outcome::Outcome;

/// Load the suite: every case file under `dir`, with generated expansions (one loader case
/// per applicable mutant).
pub fn load_suite(dir: &Path) -> anyhow::Result<Vec<Case>> {
    let cases = crate::families::loader::expand(crate::case::load_cases(dir)?);
    for w in cases.windows(2) {
        if w[0].name == w[1].name {
            bail!("case `{}` is defined twice", w[0].name);
        }
    }
    Ok(cases)
}

/// Everything a case needs besides the engine.
pub struct Context {
    pub repo_root: PathBuf,
    pub cases_dir: PathBuf,
    pub gates: GateSet,
    /// The run's profile: a case is judged by the looser of its own profile and this one.
    pub run_profile: ProfileName,
    /// The engine claims the canonical tie rule: exact ties are compared strictly
    /// (`ds41 certify --canonical-ties`; CONTRACT.md §4).
    pub canonical_ties: bool,
    /// The external upstream set (`--upstream` / DS41_UPSTREAM), if given.
    pub upstream: Option<PathBuf>,
    /// The release snapshot (`--release` / DS41_RELEASE / the hub cache), if found.
    pub release: Option<crate::locations::ReleaseSnapshot>,
    /// Scratch space for generated models and engine outputs (a temp dir).
    pub work_dir: PathBuf,
    pub models: ModelStore,
    /// The built-in reference, for `golden: reference` cases; serialised behind a lock.
    pub reference: Mutex<Box<dyn Engine>>,
    /// How to re-run one case from a shell (`{case}` is replaced by the case name).
    pub rerun_template: String,
}

impl Context {
    /// A context over this source tree's cases and gates, judged in the exact run profile with
    /// ties excused and no external data roots (callers set `upstream` / `release`), scratch
    /// space under `work_dir`; the test harnesses' common set-up.
    pub fn in_tree(work_dir: &Path, rerun_template: &str) -> anyhow::Result<Context> {
        Ok(Context {
            repo_root: repo_root(),
            cases_dir: default_cases_dir(),
            gates: GateSet::load(&default_gates_dir())?,
            run_profile: ProfileName::Exact,
            canonical_ties: false,
            upstream: None,
            release: None,
            work_dir: work_dir.to_path_buf(),
            models: ModelStore::new(work_dir.join("models")),
            reference: Mutex::new(Box::new(crate::reference::ReferenceEngine::new())),
            rerun_template: rerun_template.to_string(),
        })
    }

    pub fn gates_for(&self, case: &Case) -> Gates {
        let p = case.profile.max(self.run_profile);
        self.gates.get(p).with_overrides(&case.tolerance)
    }

    /// The data roots of this run (crate::locations resolves every data reference).
    pub fn roots(&self) -> DataRoots<'_> {
        DataRoots {
            repo: &self.repo_root,
            release: self.release.as_ref(),
            upstream: self.upstream.as_deref(),
        }
    }

    pub fn data(&self, d: &DataRef) -> Result<PathBuf, Outcome> {
        self.roots().data(d)
    }

    pub fn model(&self, m: &ModelRef) -> Result<PathBuf, Outcome> {
        if let Some(upstream) = self.roots().upstream_model(m) {
            return upstream;
        }
        self.models
            .resolve(m)
            .map_err(|e| Outcome::error(format!("{m}: {e:#}")))
    }

    /// Resolve a checkpoint a case runs on, recording it for the certificate.
    pub fn checkpoint(&self, m: &ModelRef, details: &mut Details) -> Result<PathBuf, Outcome> {
        let dir = self.model(m)?;
        details
            .models
            .push((m.to_string(), dir.display().to_string()));
        Ok(dir)
    }

    /// Skipped, with the option that supplies it, when a data root this case reads is absent.
    pub fn missing_data(&self, case: &Case) -> Option<Outcome> {
        if case.needs_release() && self.release.is_none() {
            return Some(Outcome::skipped(crate::locations::no_release_reason()));
        }
        if case.needs_upstream() && self.upstream.is_none() {
            return Some(Outcome::skipped(crate::locations::NO_UPSTREAM_REASON));
        }
        None
    }

    pub fn rerun_command(&self, case: &str) -> String {
        self.rerun_template.replace("{case}", case)
    }

    /// A fresh scratch directory for one case.
    pub fn scratch(&self, case: &Case) -> Result<PathBuf, Outcome> {
        let safe: String = case
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // Unique per call: the same case may run concurrently in process and through the
        // protocol adapter, and the two must never share files.
        let base = self.work_dir.join("cases");
        let io_err = |e: std::io::Error| Outcome::error(format!("{}: {e}", base.display()));
        std::fs::create_dir_all(&base).map_err(io_err)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{safe}-"))
            .tempdir_in(&base)
            .map_err(io_err)?;
        Ok(dir.keep())
    }
}

/// Generated synthetic checkpoints and mutants, made once per run and shared by cases.
pub struct ModelStore {
    root: PathBuf,
    made: Mutex<BTreeMap<ModelRef, PathBuf>>,
}

impl ModelStore {
    pub fn new(root: PathBuf) -> ModelStore {
        ModelStore {
            root,
            made: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn resolve(&self, m: &ModelRef) -> anyhow::Result<PathBuf> {
        let mut made = self
            .made
            .lock()
            .map_err(|_| anyhow!("model store lock poisoned"))?;
        if let Some(p) = made.get(m) {
            return Ok(p.clone());
        }
        let dir = match m {
            ModelRef::Synthetic {
                preset,
                layout,
                seed,
            } => {
                let dir = self.root.join(format!("{preset}-{layout}-{seed}"));
                crate::synthetic::generate(preset, layout, *seed, &dir)?;
                dir
            }
            ModelRef::Mutant {
                preset,
                layout,
                mutant,
            } => {
                let dir = self.root.join(format!("{preset}-{layout}-mutant-{mutant}"));
                crate::synthetic::generate_mutant(preset, layout, mutant, &dir)?;
                dir
            }
            ModelRef::Upstream(_) => bail!("upstream models are resolved by the context"),
        };
        made.insert(m.clone(), dir.clone());
        Ok(dir)
    }

    /// The models generated so far, for the certificate.
    pub fn generated(&self) -> Vec<(ModelRef, PathBuf)> {
        self.made
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

/// What a case leaves behind besides its outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Details {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_divergence: Option<DivergenceRecord>,
    /// Per-layer worst residual rel L2 per compared run (name, values), for the SVG plot.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::report::float::named_series"
    )]
    pub per_layer: Vec<(String, Vec<Option<f64>>)>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::report::float::option"
    )]
    pub residual_threshold: Option<f64>,
    /// Decision flips excused (fragile flips and exact ties).
    #[serde(default)]
    pub fragile_flips: usize,
    /// Of those, flips at an exact tie (golden margin 0).
    #[serde(default)]
    pub exact_ties: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Checkpoints the case ran on: (model ref, directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricRecord {
    pub run: String,
    pub name: String,
    pub status: MetricStatus,
    pub text: String,
}

/// A comparison's first divergence, with the run (e.g. `prefix 3`) it was found in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DivergenceRecord {
    pub run: String,
    #[serde(flatten)]
    pub at: Divergence,
}

impl Details {
    /// Record one comparison (named `run`, e.g. `prefix 3`). The first divergence kept is
    /// the first run's (runs are independent forwards, not points of one forward).
    pub fn absorb(&mut self, run: &str, r: &CompareReport) {
        for Metric {
            name, status, text, ..
        } in &r.metrics
        {
            self.metrics.push(MetricRecord {
                run: run.into(),
                name: name.clone(),
                status: *status,
                text: text.clone(),
            });
        }
        if let (None, Some(d)) = (&self.first_divergence, &r.first_divergence) {
            self.first_divergence = Some(DivergenceRecord {
                run: run.into(),
                at: d.clone(),
            });
        }
        if !r.per_layer_worst.is_empty() {
            self.per_layer.push((run.into(), r.per_layer_worst.clone()));
            self.residual_threshold = Some(r.residual_threshold);
        }
        self.fragile_flips += r.excused_flips();
        self.exact_ties += r.exact_ties();
    }
}

/// The result of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    pub name: String,
    pub family: String,
    pub profile: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    #[serde(with = "crate::report::float")]
    pub seconds: f64,
    pub rerun: String,
    #[serde(default)]
    pub details: Details,
}

/// Map an engine error to an outcome (a refusal where an answer was due is a failure).
pub fn engine_failure(what: &str, e: EngineError) -> Outcome {
    match e {
        EngineError::Unsupported(c, why) => Outcome::not_supported(match why {
            Some(why) => format!("{c}: {why}"),
            None => c.to_string(),
        }),
        other => Outcome::fail(format!("{what}: {other}")),
    }
}

/// `Some(NotSupported)` when the engine lacks any of `caps`.
pub fn require(engine: &dyn Engine, caps: &[Capability]) -> Option<Outcome> {
    let have = engine.capabilities();
    caps.iter()
        .find(|c| !have.contains(c))
        .map(|c| Outcome::not_supported(c.as_str()))
}

/// `Some(NotSupported)` when the engine cannot read the layout of model `m` (capability
/// `layout.release` / `layout.container`): synthetic and mutant models name their layout, an
/// upstream directory is recognised by its files (one that is neither needs no layout
/// capability; the engine's answer judges it).
pub fn require_layout(
    engine: &dyn Engine,
    ctx: &Context,
    m: &ModelRef,
) -> Result<Option<Outcome>, Outcome> {
    let layout = match m.layout() {
        Some(l) => Some(l),
        None => ds41_engine::checkpoint::detect_layout(&ctx.model(m)?).ok(),
    };
    Ok(layout.and_then(|l| require(engine, &[Capability::for_layout(l)])))
}

pub fn timeout(case: &Case) -> Duration {
    Duration::from_secs_f64(case.timeout_s)
}

/// Run one case (never panics on engine behaviour; a panic inside a family is caught and
/// reported as a harness error).
pub fn run_case(case: &Case, engine: &mut dyn Engine, ctx: &Context) -> CaseResult {
    let start = Instant::now();
    let mut details = Details::default();
    let outcome = if let Some(skipped) = ctx.missing_data(case) {
        skipped
    } else {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::families::run(case, engine, ctx, &mut details)
        }));
        match r {
            Ok(o) => o,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                Outcome::error(format!("harness panicked: {}", msg.unwrap_or_default()))
            }
        }
    };
    CaseResult {
        name: case.name.clone(),
        family: case.family.as_str().into(),
        profile: case.profile.max(ctx.run_profile).as_str().into(),
        outcome,
        seconds: start.elapsed().as_secs_f64(),
        rerun: ctx.rerun_command(&case.name),
        details,
    }
}

/// Run one case and apply the expected-failure list: the result as reported.
pub fn judge_case(
    case: &Case,
    engine: &mut dyn Engine,
    ctx: &Context,
    xfail: Option<&ExpectedFailures>,
) -> CaseResult {
    let mut r = run_case(case, engine, ctx);
    if let Some(x) = xfail {
        x.apply(&mut r);
    }
    r
}

/// The case loop of a run: every case in order on one engine, each judged result handed to
/// `each` (its 0-based index, the result) as it completes.
pub fn run_cases(
    cases: &[Case],
    engine: &mut dyn Engine,
    ctx: &Context,
    xfail: Option<&ExpectedFailures>,
    mut each: impl FnMut(usize, &CaseResult),
) -> Vec<CaseResult> {
    let mut results = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        let r = judge_case(case, engine, ctx, xfail);
        each(i, &r);
        results.push(r);
    }
    results
}

/// Generate the synthetic checkpoints the cases use, up front, with a line each for `log`
/// (a model that cannot be generated is reported by the cases that use it).
pub fn pregenerate(cases: &[Case], ctx: &Context, mut log: impl FnMut(String)) {
    let models: std::collections::BTreeSet<ModelRef> = cases
        .iter()
        .flat_map(|c| c.spec.family().models())
        .filter(|m| matches!(m, ModelRef::Synthetic { .. }))
        .collect();
    for m in models {
        let t = Instant::now();
        log(match ctx.models.resolve(&m) {
            Ok(dir) => format!(
                "generated {m} in {:.2}s -> {}",
                t.elapsed().as_secs_f64(),
                dir.display()
            ),
            Err(e) => format!("cannot generate {m}: {e:#} (its cases will report the error)"),
        });
    }
}

// ----------------------------------------------------------------- expected-failure lists

/// Per-engine expected failures (CONTRACT.md §6), e.g. `gates/expected-failures/NAME.yaml`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailures {
    pub engine: String,
    #[serde(default)]
    pub entries: Vec<ExpectedFailure>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailure {
    pub case: String,
    /// Why (an issue link or errata entry); required.
    pub reason: String,
}

impl ExpectedFailures {
    pub fn load(path: &Path, known_cases: &[Case]) -> anyhow::Result<ExpectedFailures> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let de = serde_yaml::Deserializer::from_str(&text);
        let x: ExpectedFailures = serde_path_to_error::deserialize(de)
            .map_err(|e| anyhow!("{}: field `{}`: {}", path.display(), e.path(), e.inner()))?;
        for (i, e) in x.entries.iter().enumerate() {
            if !known_cases.iter().any(|c| c.name == e.case) {
                bail!(
                    "{}: entries[{i}]: case `{}` does not exist in the suite",
                    path.display(),
                    e.case
                );
            }
            if e.reason.trim().is_empty() {
                bail!("{}: entries[{i}]: field `reason` is empty", path.display());
            }
        }
        Ok(x)
    }

    /// Waive an expected failure; an expected failure that passes is itself a failure.
    pub fn apply(&self, result: &mut CaseResult) {
        let Some(e) = self.entries.iter().find(|e| e.case == result.name) else {
            return;
        };
        result.outcome = match std::mem::replace(&mut result.outcome, Outcome::Pass) {
            Outcome::Fail { reason } => Outcome::Waived { reason: e.reason.clone(), failure: reason },
            Outcome::Pass => Outcome::fail(format!(
                "listed as an expected failure ({}) but it passed: remove it from the expected-failure list of `{}`",
                e.reason, self.engine
            )),
            other => other,
        };
    }
}

/// Select cases by substring filters (any matches; `exact`: whole-name equality), dropping the
/// long tier unless asked for.
pub fn select(cases: Vec<Case>, filters: &[String], exact: bool, long: bool) -> Vec<Case> {
    cases
        .into_iter()
        .filter(|c| long || !c.long)
        .filter(|c| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        &c.name == f
                    } else {
                        c.name.contains(f.as_str())
                    }
                })
        })
        .collect()
}

/// Default locations inside the source tree (the `ds41` binary is run from the repository).
pub fn default_cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cases")
}
pub fn default_gates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gates")
}
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(outcome: Outcome) -> CaseResult {
        CaseResult {
            name: "loader::x::a".into(),
            family: "loader".into(),
            profile: "exact".into(),
            outcome,
            seconds: 0.0,
            rerun: String::new(),
            details: Details::default(),
        }
    }

    #[test]
    fn expected_failure_waives_a_fail_and_fails_a_pass() {
        let x = ExpectedFailures {
            engine: "e".into(),
            entries: vec![ExpectedFailure {
                case: "loader::x::a".into(),
                reason: "issue 12".into(),
            }],
        };
        let mut r = result(Outcome::fail("boom"));
        x.apply(&mut r);
        assert!(
            matches!(&r.outcome, Outcome::Waived { reason, failure } if reason == "issue 12" && failure == "boom")
        );
        let mut r = result(Outcome::Pass);
        x.apply(&mut r);
        assert!(r.outcome.is_fail());
        let mut r = result(Outcome::not_supported("state"));
        x.apply(&mut r);
        assert!(matches!(r.outcome, Outcome::NotSupported { .. }));
    }
}
