//! The harness's trace comparison against `shared/tools/compare.py`, the script that defines it
//! (its README: "the comparison semantics the project's own residual check should follow").
//! Pairs: the committed official goldens of the release-layout sets, each against the
//! reference's trace of the same run, clean and with semantic defects injected, end to end
//! and teacher-forced. Both judge every pair with the `upstream` profile's thresholds (passed
//! to compare.py as its arguments); they must give the same verdict and fail the same metrics.
//! Seen 700 of 700 pairs agree on every official set with fourteen defects (2026-12-05).

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_conformance::compare::{compare, compare_replay};
use ds41_conformance::gates::{GateSet, Gates, ProfileName};
use ds41_conformance::trace::TraceFile;
use libtest_mimic::Failed;

/// Official sets on release-layout presets: (set, preset, seed).
const SETS: [(&str, &str, u64); 5] = [
    ("tiny_s1", "tiny", 1),
    ("grouped_s3", "grouped", 3),
    ("tied_router_s5", "tied-router", 5),
    ("window_mtp_s4", "window-mtp", 4),
    ("off_release_s8", "off-release", 8),
];

/// Goldens per set (the first, by name: different prefill schedules).
const GOLDENS_PER_SET: usize = 2;

/// The clean reference and defects that fail some pairs and pass others.
const DEFECTS: [Option<&str>; 6] = [
    None,
    Some("no-attention-sink"),
    Some("sinkhorn-iters=19"),
    Some("index-k-handoff-wrong"),
    Some("candidate-pin-missing"),
    Some("no-yarn"),
];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    EndToEnd,
    Replay,
}

struct Pair {
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

pub fn verdicts_agree(python: &Path, script: &Path) -> Result<(), Failed> {
    let gates = GateSet::load(&super::repo_root().join("gates")).map_err(|e| e.to_string())?;
    let gates = gates.get(ProfileName::Upstream);
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
                        .map(|p| script_failures(python, script, gates, p, &json))
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
    let mut verdicts = [[0usize; 2]; 2];
    for (pair, theirs) in pairs.iter().zip(judged) {
        let theirs = theirs?;
        let ours = harness_failures(gates, pair)?;
        verdicts[pair.mode as usize][usize::from(ours.is_empty())] += 1;
        if ours != theirs {
            disagreements.push(format!(
                "{:?} {}: harness fails {ours:?}, compare.py fails {theirs:?}",
                pair.mode,
                pair.trace.display()
            ));
        }
    }
    // Both verdicts must occur in both modes, or the agreement says nothing.
    if verdicts.iter().flatten().any(|&n| n == 0) {
        disagreements.push(format!(
            "vacuous: [end to end, replay] x [fail, pass] counts {verdicts:?}"
        ));
    }
    if disagreements.is_empty() {
        Ok(())
    } else {
        Err(disagreements.join("\n").into())
    }
}

/// The reference's traces (`ds41 forward`, and `--replay` from the golden) for every set,
/// golden and defect.
fn make_pairs(tmp: &Path) -> Result<Vec<Pair>, Failed> {
    let mut pairs = Vec::new();
    for (set, preset, seed) in SETS {
        let checkpoint = tmp.join(set);
        ds41_synthetic::generate(preset, ds41_synthetic::Layout::Release, seed, &checkpoint)
            .map_err(|e| e.to_string())?;
        let dir = super::repo_root().join("goldens/official").join(set);
        let mut goldens: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with('p') && name.ends_with(".safetensors")
            })
            .collect();
        goldens.sort();
        for golden in goldens.into_iter().take(GOLDENS_PER_SET) {
            let file = TraceFile::read(&golden).map_err(|e| e.to_string())?;
            let ids = file.input_ids().map_err(|e| e.to_string())?;
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            let stem = golden.file_stem().unwrap_or_default().to_string_lossy();
            let prefill: String = stem[1..].chars().take_while(char::is_ascii_digit).collect();
            let index_k = if stem.ends_with("_owner") {
                "owner"
            } else {
                "as-shipped"
            };
            for defect in DEFECTS {
                let tag = format!("{set}.{stem}.{}", defect.unwrap_or("clean"));
                let end_to_end = tmp.join(format!("{tag}.forward.safetensors"));
                let replay = tmp.join(format!("{tag}.replay.safetensors"));
                let forward = |args: &[&str], out: &Path| -> Result<(), Failed> {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds41"));
                    cmd.arg("forward")
                        .arg("--model")
                        .arg(&checkpoint)
                        .args(["--index-k", index_k])
                        .args(args)
                        .arg("--out")
                        .arg(out);
                    if let Some(d) = defect {
                        cmd.args(["--defect", d]);
                    }
                    super::run_ok(&mut cmd, &format!("ds41 forward ({tag})")).map(|_| ())
                };
                let joined = ids.join(",");
                forward(
                    &["--tokens", &joined, "--prefill", &prefill, "--sub-ops"],
                    &end_to_end,
                )?;
                forward(&["--replay", &golden.to_string_lossy()], &replay)?;
                for (mode, trace) in [(Mode::EndToEnd, end_to_end), (Mode::Replay, replay)] {
                    pairs.push(Pair {
                        mode,
                        golden: golden.clone(),
                        trace,
                    });
                }
            }
        }
    }
    Ok(pairs)
}

/// The metrics the harness fails, sorted.
fn harness_failures(gates: &Gates, pair: &Pair) -> Result<Vec<String>, Failed> {
    let golden = TraceFile::read(&pair.golden).map_err(|e| e.to_string())?;
    let engine = TraceFile::read(&pair.trace).map_err(|e| e.to_string())?;
    let report = match pair.mode {
        Mode::EndToEnd => compare(&golden, &engine, gates),
        Mode::Replay => compare_replay(&golden, &engine, gates),
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
    gates: &Gates,
    pair: &Pair,
    json: &Path,
) -> Result<Vec<String>, String> {
    let number = |v: f64| v.to_string();
    let d = &gates.decisions;
    let mut args: Vec<String> = match pair.mode {
        Mode::EndToEnd => vec![
            "--residual-rel-l2".into(),
            number(gates.residual.rel_l2),
            "--logits-rel-l2".into(),
            number(gates.logits.rel_l2),
            "--logits-max-abs".into(),
            number(gates.logits.max_abs),
            "--fragile-floor".into(),
            number(d.fragile_floor),
            "--fragile-factor".into(),
            number(d.fragile_factor),
            "--fragile-cap-topk".into(),
            number(d.fragile_cap_topk),
            "--fragile-cap-experts".into(),
            number(d.fragile_cap_experts),
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
