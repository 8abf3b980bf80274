//! The harness's trace comparison against `shared/tools/compare.py`, the script that defines it
//! (its README makes it the definition the project's residual check follows).
//! Pairs: the suite's own residual cases on committed goldens (the official sets in
//! `upstream`, end to end and teacher-forced; the reference's goldens in `exact` and
//! `upstream`), each golden against the reference's trace of the case's run, clean and with
//! semantic defects injected. Both judge every pair with the case's gates (profile, tolerance
//! overrides, tie rule; passed to compare.py as its arguments); they must give the same
//! verdict and fail the same metrics (in a profile without the fragile rule, compare.py's
//! failures a subset of the harness's, which compares on past a robust flip).
//! Seen 700 of 700 pairs agree on every official set with fourteen defects (2026-12-05).

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_conformance::case::{load_cases, DataRef, ModelRef};
use ds41_conformance::compare::{compare, compare_replay};
use ds41_conformance::families::residual::GoldenSpec;
use ds41_conformance::families::Spec;
use ds41_conformance::gates::{ArgmaxRule, GateSet, Gates, ProfileName};
use ds41_conformance::trace::TraceFile;
use libtest_mimic::Failed;

/// The clean reference and defects that fail some pairs and pass others.
const DEFECTS: [Option<&str>; 6] = [
    None,
    Some("no-attention-sink"),
    Some("sinkhorn-iters=19"),
    Some("index-k-handoff-wrong"),
    Some("candidate-pin-missing"),
    Some("no-yarn"),
];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Mode {
    EndToEnd,
    Replay,
}

struct Pair {
    /// The case's gates: its profile, its tolerance overrides, its tie rule.
    gates: Gates,
    mode: Mode,
    golden: PathBuf,
    trace: PathBuf,
}

/// `compare.py`: `DS41_COMPARE_PY`, else `../shared/tools/compare.py` beside the checkout.
pub fn compare_py() -> Option<PathBuf> {
    super::env_path("DS41_COMPARE_PY").or_else(|| {
        let beside = super::repo_root().join("../shared/tools/compare.py");
        beside.is_file().then_some(beside)
    })
}

/// Profiles and modes the cases must cover, each with both verdicts.
const COVERED: [(ProfileName, Mode); 3] = [
    (ProfileName::Upstream, Mode::EndToEnd),
    (ProfileName::Upstream, Mode::Replay),
    (ProfileName::Exact, Mode::EndToEnd),
];

pub fn verdicts_agree(python: &Path, script: &Path) -> Result<(), Failed> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let pairs = make_pairs(tmp.path())?;

    let judged: Vec<Result<Vec<String>, String>> = std::thread::scope(|scope| {
        let halves: Vec<_> = pairs
            .chunks(pairs.len().div_ceil(2))
            .enumerate()
            .map(|(i, chunk)| {
                let json = tmp.path().join(format!("report-{i}.json"));
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|p| script_failures(python, script, p, &json))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("a compare.py thread"))
            .collect()
    });

    let mut disagreements = Vec::new();
    let mut verdicts = std::collections::BTreeMap::new();
    for (pair, theirs) in pairs.iter().zip(judged) {
        let theirs = theirs?;
        let ours = harness_failures(pair)?;
        let counts = verdicts
            .entry((pair.gates.profile, pair.mode))
            .or_insert([0usize; 2]);
        counts[usize::from(ours.is_empty())] += 1;
        // Under the fragile rule both leave out what any flip feeds, so they fail the same
        // metrics. Without it the harness compares on past a robust flip, to report all that
        // differs, where compare.py stops: the same verdict, compare.py's failures a subset.
        let agree = if pair.gates.decisions.excuse_fragile_flips || pair.mode == Mode::Replay {
            ours == theirs
        } else {
            ours.is_empty() == theirs.is_empty() && theirs.iter().all(|m| ours.contains(m))
        };
        if !agree {
            disagreements.push(format!(
                "{} {:?} {}: harness fails {ours:?}, compare.py fails {theirs:?}",
                pair.gates.profile,
                pair.mode,
                pair.trace.display()
            ));
        }
    }
    // Both verdicts must occur in each profile and mode, or the agreement says nothing.
    for covered in COVERED {
        if verdicts.get(&covered).is_none_or(|c| c.contains(&0)) {
            disagreements.push(format!(
                "vacuous: {covered:?} needs both verdicts; [fail, pass] counts {verdicts:?}"
            ));
        }
    }
    if disagreements.is_empty() {
        Ok(())
    } else {
        Err(disagreements.join("\n").into())
    }
}

/// The suite's own residual cases on committed goldens and synthetic models whose gates
/// compare.py can spell (not `argmax: top5`, not the fragile rule with strict ties), each
/// against the reference's traces of its run, clean and with every defect of `DEFECTS`.
fn make_pairs(tmp: &Path) -> Result<Vec<Pair>, Failed> {
    let root = super::repo_root();
    let gate_set = GateSet::load(&root.join("gates")).map_err(|e| e.to_string())?;
    let cases = load_cases(&root.join("conformance/cases")).map_err(|e| e.to_string())?;
    let mut pairs = Vec::new();
    for case in &cases {
        let Spec::Residual(spec) = &case.spec else {
            continue;
        };
        let (
            GoldenSpec::File(DataRef::Repo(golden)),
            ModelRef::Synthetic {
                preset,
                layout,
                seed,
            },
        ) = (&spec.golden, &spec.model)
        else {
            continue;
        };
        let mut gates = gate_set.get(case.profile).with_overrides(&case.tolerance);
        gates.decisions.strict_ties |= spec.canonical_ties;
        let spellable = gates.logits.argmax == ArgmaxRule::Exact
            && !(gates.decisions.strict_ties && gates.decisions.excuse_fragile_flips);
        if !spellable || !spec.images.is_empty() || !spec.prefix_lengths.is_empty() {
            continue;
        }
        let checkpoint = tmp.join(format!("{preset}-{layout}-{seed}"));
        if !checkpoint.exists() {
            let layout = case_layout(layout)?;
            ds41_synthetic::generate(preset, layout, *seed, &checkpoint)
                .map_err(|e| e.to_string())?;
        }
        let golden = root.join(golden);
        let ids: Vec<u32> = match &spec.tokens {
            Some(ids) => ids.clone(),
            None => TraceFile::read(&golden)
                .and_then(|g| g.input_ids())
                .map_err(|e| e.to_string())?,
        };
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        let prefill = spec.prefill.unwrap_or(ids.len()).to_string();
        let mode = if spec.replay {
            Mode::Replay
        } else {
            Mode::EndToEnd
        };
        for defect in DEFECTS {
            let trace = tmp.join(format!(
                "{}.{}.safetensors",
                case.name,
                defect.unwrap_or("clean")
            ));
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds41"));
            cmd.arg("forward")
                .arg("--model")
                .arg(&checkpoint)
                .args(["--index-k", spec.index_k.as_str()])
                .args(["--numerics", spec.numerics.as_str()])
                .arg("--out")
                .arg(&trace);
            if spec.replay {
                cmd.arg("--replay").arg(&golden);
            } else {
                cmd.args([
                    "--tokens",
                    &ids.join(","),
                    "--prefill",
                    &prefill,
                    "--sub-ops",
                ]);
            }
            if let Some(d) = defect {
                cmd.args(["--defect", d]);
            }
            super::run_ok(&mut cmd, &format!("ds41 forward ({})", case.name))?;
            pairs.push(Pair {
                gates: gates.clone(),
                mode,
                golden: golden.clone(),
                trace,
            });
        }
    }
    Ok(pairs)
}

fn case_layout(layout: &str) -> Result<ds41_synthetic::Layout, Failed> {
    match layout {
        "release" => Ok(ds41_synthetic::Layout::Release),
        "container" => Ok(ds41_synthetic::Layout::Container),
        other => Err(format!("layout {other:?}").into()),
    }
}

/// The metrics the harness fails, sorted.
fn harness_failures(pair: &Pair) -> Result<Vec<String>, Failed> {
    let golden = TraceFile::read(&pair.golden).map_err(|e| e.to_string())?;
    let engine = TraceFile::read(&pair.trace).map_err(|e| e.to_string())?;
    let report = match pair.mode {
        Mode::EndToEnd => compare(&golden, &engine, &pair.gates),
        Mode::Replay => compare_replay(&golden, &engine, &pair.gates),
    };
    let mut failed: Vec<String> = report
        .metrics
        .iter()
        .filter(|m| m.status.fails())
        .map(|m| m.name.clone())
        .collect();
    failed.sort();
    Ok(failed)
}

/// The metrics compare.py fails (its `--json` report), sorted; its exit status must agree.
fn script_failures(
    python: &Path,
    script: &Path,
    pair: &Pair,
    json: &Path,
) -> Result<Vec<String>, String> {
    let gates = &pair.gates;
    let number = |v: f64| v.to_string();
    let d = &gates.decisions;
    // compare.py's spelling of the profile's excuse rule: the fragile rule's numbers; without
    // it, exact ties only (every limit 0); with neither, `--strict`. (The fragile rule
    // without exact ties has no spelling there; no profile file asks for it.)
    let fragile = |v: f64| number(if d.excuse_fragile_flips { v } else { 0.0 });
    let mut args: Vec<String> = match pair.mode {
        Mode::EndToEnd => vec![
            "--residual-rel-l2".into(),
            number(gates.residual.rel_l2),
            "--logits-rel-l2".into(),
            number(gates.logits.rel_l2),
            "--logits-max-abs".into(),
            number(gates.logits.max_abs),
            "--fragile-floor".into(),
            fragile(d.fragile_floor),
            "--fragile-factor".into(),
            fragile(d.fragile_factor),
            "--fragile-cap-topk".into(),
            fragile(d.fragile_cap_topk),
            "--fragile-cap-experts".into(),
            fragile(d.fragile_cap_experts),
        ],
        Mode::Replay => {
            let r = &gates.replay;
            vec![
                "--replay".into(),
                "--attn-rel-l2".into(),
                number(r.attn_rel_l2),
                "--moe-rel-l2".into(),
                number(r.moe_rel_l2),
                "--residual-rel-l2".into(),
                number(r.residual_rel_l2),
                "--engram-rel-l2".into(),
                number(r.engram_rel_l2),
                "--fragile-floor".into(),
                number(r.fragile_floor),
                "--logits-rel-l2".into(),
                number(r.logits_rel_l2),
                "--logits-max-abs".into(),
                number(r.logits_max_abs),
            ]
        }
    };
    if d.strict_ties {
        if d.excuse_fragile_flips {
            return Err(format!(
                "{}: compare.py cannot spell its excuse rule",
                gates.profile
            ));
        }
        args.push("--strict".into());
    }
    if let (Mode::EndToEnd, Some(n)) = (pair.mode, d.max_fragile) {
        args.extend(["--max-fragile".into(), n.to_string()]);
    }
    let out = Command::new(python)
        .arg(script)
        .arg(&pair.golden)
        .arg(&pair.trace)
        .args(["--quiet", "--json"])
        .arg(json)
        .args(&args)
        .output()
        .map_err(|e| format!("run compare.py: {e}"))?;
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(json).map_err(|e| format!("compare.py's report: {e}"))?,
    )
    .map_err(|e| format!("compare.py's report: {e}"))?;
    let mut failed: Vec<String> = report["metrics"]
        .as_object()
        .ok_or("compare.py's report has no metrics")?
        .iter()
        .filter(|(_, m)| m["status"] == "FAIL")
        .map(|(name, _)| name.clone())
        .collect();
    failed.sort();
    // Exit status 1 is its FAIL verdict; anything else is an error of the script.
    match out.status.code() {
        Some(0) if failed.is_empty() => Ok(failed),
        Some(1) if !failed.is_empty() => Ok(failed),
        code => Err(format!(
            "compare.py on {}: exit {code:?} with failing metrics {failed:?}: {}",
            pair.trace.display(),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}
