//! The harness's trace comparison against `shared/tools/compare.py`, the script that defines it
//! (its README makes it the definition the project's residual check follows).
//! Pairs: the committed official goldens of the release-layout sets (`upstream` profile) and
//! the reference's exact goldens of the `tiny` container (`exact` profile), each against the
//! reference's trace of the same run, clean and with semantic defects injected, end to end
//! and teacher-forced. Both judge every pair with its profile's thresholds and excuse rule
//! (passed to compare.py as its arguments); they must give the same verdict and fail the same
//! metrics (in a profile without the fragile rule, compare.py's failures a subset of the
//! harness's, which compares on past a robust flip).
//! Seen 700 of 700 pairs agree on every official set with fourteen defects (2026-12-05).

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_conformance::compare::{compare, compare_replay};
use ds41_conformance::gates::{GateSet, Gates, ProfileName};
use ds41_conformance::trace::TraceFile;
use libtest_mimic::Failed;

/// Where the goldens come from and how the reference's traces of their runs are made.
struct Source {
    /// Directory under goldens/.
    dir: &'static str,
    /// A golden's file name starts with this and contains each of `contains`.
    prefix: &'static str,
    contains: &'static [&'static str],
    preset: &'static str,
    layout: ds41_synthetic::Layout,
    seed: u64,
    numerics: &'static str,
    profile: ProfileName,
    /// The goldens hold the streams a teacher-forced run needs (`block_input`, `pre_mix`).
    replay: bool,
}

const fn official(dir: &'static str, preset: &'static str, seed: u64) -> Source {
    Source {
        dir,
        prefix: "p",
        contains: &[],
        preset,
        layout: ds41_synthetic::Layout::Release,
        seed,
        numerics: "upstream",
        profile: ProfileName::Upstream,
        replay: true,
    }
}

/// The official sets on release-layout presets (the bf16 regime and its fragile-flip rule),
/// and the reference's own exact-profile goldens on the `tiny` container (f32: only exact
/// ties excused).
const SOURCES: [Source; 6] = [
    official("official/tiny_s1", "tiny", 1),
    official("official/grouped_s3", "grouped", 3),
    official("official/tied_router_s5", "tied-router", 5),
    official("official/window_mtp_s4", "window-mtp", 4),
    official("official/off_release_s8", "off-release", 8),
    Source {
        dir: "traces",
        prefix: "tiny_container_s1_",
        contains: &["_exact_"],
        preset: "tiny",
        layout: ds41_synthetic::Layout::Container,
        seed: 1,
        numerics: "exact",
        profile: ProfileName::Exact,
        replay: false,
    },
];

/// Goldens per source (the first, by name: different prefill schedules).
const GOLDENS_PER_SOURCE: usize = 2;

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
    profile: ProfileName,
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
    let gates = &gates;
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
                        .map(|p| script_failures(python, script, gates.get(p.profile), p, &json))
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
        let profile = gates.get(pair.profile);
        let ours = harness_failures(profile, pair)?;
        let counts = verdicts
            .entry(format!("{} {:?}", pair.profile, pair.mode))
            .or_insert([0usize; 2]);
        counts[usize::from(ours.is_empty())] += 1;
        // Under the fragile rule both leave out what any flip feeds, so they fail the same
        // metrics. Without it the harness compares on past a robust flip, to report all that
        // differs, where compare.py stops: the same verdict, compare.py's failures a subset.
        let agree = if profile.decisions.excuse_fragile_flips || pair.mode == Mode::Replay {
            ours == theirs
        } else {
            ours.is_empty() == theirs.is_empty() && theirs.iter().all(|m| ours.contains(m))
        };
        if !agree {
            disagreements.push(format!(
                "{} {:?} {}: harness fails {ours:?}, compare.py fails {theirs:?}",
                pair.profile,
                pair.mode,
                pair.trace.display()
            ));
        }
    }
    // Both verdicts must occur in each profile and mode, or the agreement says nothing.
    let combinations: std::collections::BTreeSet<String> = SOURCES
        .iter()
        .flat_map(|s| {
            let modes: &[Mode] = if s.replay {
                &[Mode::EndToEnd, Mode::Replay]
            } else {
                &[Mode::EndToEnd]
            };
            modes.iter().map(move |m| format!("{} {m:?}", s.profile))
        })
        .collect();
    if verdicts.len() != combinations.len() || verdicts.values().flatten().any(|&n| n == 0) {
        disagreements.push(format!("vacuous: [fail, pass] counts {verdicts:?}"));
    }
    if disagreements.is_empty() {
        Ok(())
    } else {
        Err(disagreements.join("\n").into())
    }
}

/// The reference's traces (`ds41 forward`, and `--replay` from the golden) for every source,
/// golden and defect.
fn make_pairs(tmp: &Path) -> Result<Vec<Pair>, Failed> {
    let mut pairs = Vec::new();
    for source in &SOURCES {
        let checkpoint = tmp.join(format!(
            "{}-{}-{:?}",
            source.preset, source.seed, source.layout
        ));
        if !checkpoint.exists() {
            ds41_synthetic::generate(source.preset, source.layout, source.seed, &checkpoint)
                .map_err(|e| e.to_string())?;
        }
        let dir = super::repo_root().join("goldens").join(source.dir);
        let mut goldens: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.ends_with(".safetensors")
                    && name.starts_with(source.prefix)
                    && source.contains.iter().all(|f| name.contains(f))
                    && run_of(&name).is_some()
            })
            .collect();
        goldens.sort();
        for golden in goldens.into_iter().take(GOLDENS_PER_SOURCE) {
            let file = TraceFile::read(&golden).map_err(|e| e.to_string())?;
            let ids = file.input_ids().map_err(|e| e.to_string())?;
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            let name = golden.file_name().unwrap_or_default().to_string_lossy();
            let (prefill, index_k) = run_of(&name).expect("filtered above");
            let stem = golden.file_stem().unwrap_or_default().to_string_lossy();
            for defect in DEFECTS {
                let tag = format!("{stem}.{}", defect.unwrap_or("clean"));
                let end_to_end = tmp.join(format!("{tag}.forward.safetensors"));
                let replay = tmp.join(format!("{tag}.replay.safetensors"));
                let forward = |args: &[&str], out: &Path| -> Result<(), Failed> {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds41"));
                    cmd.arg("forward")
                        .arg("--model")
                        .arg(&checkpoint)
                        .args(["--index-k", index_k, "--numerics", source.numerics])
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
                let mut runs = vec![(Mode::EndToEnd, end_to_end)];
                if source.replay {
                    forward(&["--replay", &golden.to_string_lossy()], &replay)?;
                    runs.push((Mode::Replay, replay));
                }
                for (mode, trace) in runs {
                    pairs.push(Pair {
                        profile: source.profile,
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

/// The schedule a golden's file name states: `…pNN_dMM[_…][_as-shipped|_owner]` gives the
/// prefill NN and the index-key hand-off (as-shipped unless named).
fn run_of(name: &str) -> Option<(String, &'static str)> {
    let prefill = name.match_indices('p').find_map(|(i, _)| {
        let digits: String = name[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let starts_field = i == 0 || name[..i].ends_with('_');
        (starts_field && !digits.is_empty()).then_some(digits)
    })?;
    let index_k = if name.contains("_owner") {
        "owner"
    } else {
        "as-shipped"
    };
    Some((prefill, index_k))
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
