//! The two third-party engines of `adapters/` run through the harness as a user would run
//! them (harness: libtest-mimic, so a trial that cannot run is reported as *ignored* with its
//! reason, never as passed):
//!
//! * `adapters::official::*` — the official `inference/model.py` (adapters/official), named by
//!   `DS41_OFFICIAL_INFERENCE` (a release `inference/` directory);
//! * `adapters::waste-oracle::*` — WASTE's f32 oracle (adapters/waste-oracle), named by
//!   `DS41_WASTE` (a WASTE checkout with `tools/ds41_ref.py`).
//!
//! Each runs a few cases it must pass, a few it must declare NotSupported (what it cannot do),
//! and copies with an injected bug that must Fail with the headline naming the first diverging
//! token, layer and sub-op. `DS41_PYTHON` names the Python (torch, safetensors, tokenizers,
//! sympy), as for tests/regen_python.rs, e.g.
//! `DS41_PYTHON=/work/venv/bin/python DS41_OFFICIAL_INFERENCE=/path/inference
//! DS41_WASTE=/path/waste cargo test -p ds41-conformance --test adapters`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use ds41_conformance::case::Case;
use ds41_conformance::outcome::Outcome;
use ds41_conformance::protocol::AdapterEngine;
use ds41_conformance::runner::{self, run_case, Context};

/// What a trial expects of one case.
#[derive(Clone)]
enum Expect {
    Pass,
    NotSupported(&'static str),
    /// Fail, with the headline's first divergence containing this text.
    FailAt(&'static str),
}

struct Adapter {
    /// Trial name prefix and script directory under adapters/.
    name: &'static str,
    /// Environment variable naming the upstream code, and the adapter flag taking it.
    env: &'static str,
    flag: &'static str,
    /// (case, extra adapter arguments, expectation).
    trials: Vec<(&'static str, &'static str, Expect)>,
}

fn adapters() -> Vec<Adapter> {
    use Expect::*;
    // The configuration that reproduces official_a (made by the same code with these kernels
    // and the goldens' tie rule) bit for bit.
    const AS_GOLDENS: &str = "--ties canonical --kernels tt-metal";
    vec![
        Adapter {
            name: "official",
            env: "DS41_OFFICIAL_INFERENCE",
            flag: "--inference",
            trials: vec![
                ("loader::synthetic::tiny-release-loads", "", Pass),
                (
                    "loader::synthetic::mutant-tiny-release.no-attn-sink",
                    "",
                    Pass,
                ),
                (
                    "loader::synthetic::tiny-container-loads",
                    "",
                    NotSupported("layout.container"),
                ),
                (
                    "residual::goldens::tiny-release-p01-d23-exact-as-shipped",
                    "",
                    NotSupported("numerics.exact"),
                ),
                ("engram::synthetic::tiny-release-dead-latches", "", Pass),
                (
                    "state::synthetic::tiny-release-snapshot-restore-upstream-as-shipped",
                    "",
                    Pass,
                ),
                // Reference goldens: bit-identical up to token 10, then one bf16 rounding is
                // amplified by a decision flip whose margin these goldens do not record yet.
                (
                    "residual::goldens::tiny-release-p09-d15-upstream-as-shipped",
                    "--ties canonical",
                    Pass,
                ),
                // official_a (needs DS41_UPSTREAM): bit for bit, forward and replay.
                ("residual::official_a::p37-d11-as-shipped", AS_GOLDENS, Pass),
                // The DSpark draft head through the protocol: the official code meets its own
                // DSpark goldens end to end and replayed (bit for bit with these kernels).
                ("dspark::official::dspark-s6-p18-d06", AS_GOLDENS, Pass),
                ("dspark::official::dspark-s6-p18-d06-replay", AS_GOLDENS, Pass),
                ("dspark::official::window-mtp-s4-p37-d11-replay", AS_GOLDENS, Pass),
                // The vision family: the official image_processor.py and vision.py meet their
                // own goldens through the protocol (bit for bit), the exact profile is not
                // theirs, image spans in forward are not served; a swapped rope is caught at
                // the first block.
                ("vision::official::preprocess-small-budget", "", Pass),
                ("vision::official::tower-601x599-upstream", "", Pass),
                ("vision::official::tower-vision-s7-image0-upstream-replay", "", Pass),
                (
                    "vision::official::tower-601x599-exact",
                    "",
                    NotSupported("numerics.exact"),
                ),
                (
                    "residual::official_vision_s7::vision-s7-p15-d06-replay",
                    "",
                    NotSupported("vision.forward"),
                ),
                (
                    "vision::official::tower-601x599-upstream-replay",
                    "--inject vision-rope-swapped",
                    FailAt("`vision.blocks[0]`"),
                ),
                (
                    "dspark::official::dspark-s6-p18-d06-replay",
                    "--ties canonical --kernels tt-metal --inject draft-causal",
                    FailAt("`dspark.attn_out` first differs at step 0 stage 0"),
                ),
                (
                    "residual::official_a::p37-d11-owner-replay",
                    AS_GOLDENS,
                    Pass,
                ),
                (
                    "residual::official_a::p37-d11-as-shipped",
                    "--ties canonical --kernels tt-metal --inject no-sink",
                    FailAt("token 0 layer 0 sub-op `attn_out`"),
                ),
                (
                    "residual::official_a::p37-d11-as-shipped-replay",
                    "--ties canonical --kernels tt-metal --inject no-yarn",
                    FailAt("sub-op `attn_out`"),
                ),
                (
                    "residual::official_a::p01-d47-as-shipped",
                    "--ties canonical --kernels tt-metal --inject owner-in-as-shipped",
                    FailAt(
                        "token 18 layer 2 sub-op `topk`: decision set 1.553e-1 > 5.000e-3 (topk.L2",
                    ),
                ),
                // The official code with the canonical tie rule meets the repo's official golden
                // on its exact ties; a reversed top-k tie order is caught as such (bf16 profile).
                (
                    "residual::canonical_ties::tiny-s1-p01-d19-as-shipped-canonical-ties",
                    "--ties canonical --kernels tt-metal",
                    Pass,
                ),
                (
                    "residual::canonical_ties::tiny-s1-p01-d19-as-shipped-canonical-ties",
                    "--ties canonical --kernels tt-metal --inject ties-reversed",
                    FailAt("tie order"),
                ),
                // The same for the MoE router alone, on the tied-router golden (exact router
                // ties from token 0 layer 4 on, no exact index ties): its first tie is named.
                (
                    "residual::canonical_ties::tied-router-s5-p05-d15-as-shipped-canonical-ties",
                    AS_GOLDENS,
                    Pass,
                ),
                (
                    "residual::canonical_ties::tied-router-s5-p05-d15-as-shipped-canonical-ties-replay",
                    AS_GOLDENS,
                    Pass,
                ),
                (
                    "residual::canonical_ties::tied-router-s5-p05-d15-as-shipped-canonical-ties",
                    "--ties canonical --kernels tt-metal --inject gate-ties-reversed",
                    FailAt("token 0 layer 4 sub-op `experts`: tie order"),
                ),
                (
                    "residual::canonical_ties::tied-router-s5-p05-d15-as-shipped-canonical-ties-replay",
                    "--ties canonical --kernels tt-metal --inject gate-ties-reversed",
                    FailAt("token 0 layer 4 sub-op `experts`: tie order"),
                ),
                // Without the canonical claim the set's replay cases judge every cell but the
                // exact ties', whatever order torch.topk gives them.
                (
                    "residual::official_tied_router_s5::tied-router-s5-p05-d15-as-shipped-replay",
                    "--ties torch --kernels tt-metal",
                    Pass,
                ),
                // The synthetic goldens carry no sub-op tensors: the block output is named.
                (
                    "residual::goldens::tiny-release-p09-d15-upstream-as-shipped",
                    "--ties canonical --inject no-sink",
                    FailAt("token 0 layer 0 sub-op"),
                ),
            ],
        },
        Adapter {
            name: "waste-oracle",
            env: "DS41_WASTE",
            flag: "--waste",
            trials: vec![
                (
                    "residual::goldens::tiny-container-p01-d23-exact-as-shipped",
                    "",
                    Pass,
                ),
                ("residual::waste_oracle::as-shipped", "", Pass),
                (
                    "residual::goldens::tiny-container-p09-d15-exact-as-shipped",
                    "",
                    NotSupported("prefill"),
                ),
                (
                    "residual::goldens::tiny-container-p01-d23-upstream-owner",
                    "",
                    NotSupported("numerics.upstream"),
                ),
                (
                    "loader::synthetic::tiny-container-loads",
                    "",
                    NotSupported("load"),
                ),
                ("engram::synthetic::tiny-container-dead-latches", "", Pass),
                (
                    "state::synthetic::tiny-container-snapshot-restore",
                    "",
                    NotSupported("index_k.owner"),
                ),
                (
                    "residual::goldens::tiny-container-p01-d23-exact-as-shipped",
                    "--inject no-sink",
                    FailAt("token 0 layer 0 sub-op"),
                ),
                // YaRN changes the compressed layers' rotation from the first token on: the
                // first diverging cell is token 1, layer 1 (the first compressed layer), which
                // the headline must name rather than that token's logits.
                (
                    "residual::goldens::tiny-container-p01-d23-exact-as-shipped",
                    "--inject no-yarn",
                    FailAt("token 1 layer 1 sub-op `residual`"),
                ),
            ],
        },
    ]
}

fn python() -> Result<Option<PathBuf>, String> {
    let Some(py) = std::env::var_os("DS41_PYTHON").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let probe = std::process::Command::new(&py)
        .args(["-c", "import torch, safetensors, tokenizers, sympy"])
        .output()
        .map_err(|e| format!("DS41_PYTHON={py:?} cannot be run: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "DS41_PYTHON={py:?} lacks the adapters' dependencies (torch, safetensors, tokenizers, sympy):\n{}",
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
    Ok(Some(PathBuf::from(py)))
}

fn check(outcome: &Outcome, expect: &Expect) -> Result<(), String> {
    match (expect, outcome) {
        (Expect::Pass, Outcome::Pass) => Ok(()),
        (Expect::NotSupported(c), Outcome::NotSupported { capability })
            if capability == c || capability.starts_with(&format!("{c}:")) =>
        {
            Ok(())
        }
        (Expect::FailAt(at), Outcome::Fail { reason }) => {
            let headline = reason.lines().next().unwrap_or("");
            if headline.contains(at) {
                Ok(())
            } else {
                Err(format!(
                    "the failure's headline does not name {at:?}:\n{reason}"
                ))
            }
        }
        _ => Err(format!(
            "expected {}, got {outcome:?}",
            match expect {
                Expect::Pass => "Pass".to_string(),
                Expect::NotSupported(c) => format!("NotSupported({c})"),
                Expect::FailAt(at) => format!("a Fail at {at:?}"),
            }
        )),
    }
}

fn main() {
    let args = Arguments::from_args();
    let work = tempfile::Builder::new()
        .prefix("ds41-adapters-")
        .tempdir()
        .expect("temp dir");
    let suite = runner::load_suite(&runner::default_cases_dir())
        .unwrap_or_else(|e| panic!("loading the suite: {e:#}"));
    let mut ctx = Context::in_tree(
        work.path(),
        "cargo test -p ds41-conformance --test adapters -- '{case}' --exact",
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    ctx.upstream = std::env::var_os("DS41_UPSTREAM")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let ctx = Arc::new(ctx);
    let python = python();
    let mut trials = Vec::new();
    for a in adapters() {
        let code = std::env::var_os(a.env).filter(|v| !v.is_empty());
        let script = runner::repo_root()
            .join("adapters")
            .join(a.name)
            .join("adapter.py");
        for (i, (case_name, extra, expect)) in a.trials.into_iter().enumerate() {
            let case: Option<Case> = suite.iter().find(|c| c.name == case_name).cloned();
            let label = if extra.is_empty() {
                format!("adapters::{}::{case_name}", a.name)
            } else {
                format!(
                    "adapters::{}::{case_name}::{}#{i}",
                    a.name,
                    extra.replace(' ', "_")
                )
            };
            let (cx, python, code, script) = (
                Arc::clone(&ctx),
                python.clone(),
                code.clone(),
                script.clone(),
            );
            trials.push(Trial::ignorable_test(label, move || {
                let py = match python? {
                    Some(p) => p,
                    None => {
                        return Ok(Completion::ignored_with(
                            "SKIPPED: DS41_PYTHON not set (a Python with torch, safetensors, tokenizers, sympy)",
                        ))
                    }
                };
                let Some(code) = code else {
                    return Ok(Completion::ignored_with(format!(
                        "SKIPPED: {} not set (where the upstream code is)",
                        a.env
                    )));
                };
                let case = case.ok_or_else(|| format!("no case {case_name} in the suite"))?;
                let cmd = format!(
                    "exec {} {} {} {} {extra}",
                    quote(&py),
                    quote(&script),
                    a.flag,
                    quote(Path::new(&code))
                );
                let mut engine = AdapterEngine::start(&cmd).map_err(|e| format!("{e:#}"))?;
                let r = run_case(&case, &mut engine, &cx);
                if let Outcome::Skipped { reason } = &r.outcome {
                    return Ok(Completion::ignored_with(format!("SKIPPED: {reason}")));
                }
                check(&r.outcome, &expect)
                    .map(|_| Completion::Completed)
                    .map_err(Failed::from)
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    drop(work);
    conclusion.exit();
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}
