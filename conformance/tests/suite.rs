//! The conformance suite as a libtest-mimic test target (`harness = false`): one trial per
//! case against the built-in reference in process, the same cases again through the JSON-lines
//! protocol (`ds41 serve-adapter` as a subprocess), the negative controls (each injected
//! defect must make a declared check fail), and self-tests of the harness with engines that
//! crash, hang, answer garbage or refuse. Filterable by name; `--list` works for nextest.
//!
//! Cases that read release files or the external official_a set are reported as ignored with
//! the reason when no release snapshot is found (DS41_RELEASE, the hub cache) or DS41_UPSTREAM
//! is unset; long-tier cases are `#[ignore]`d unless DS41_LONG=1. Through the protocol, the
//! default tier sends the first case of each request shape (family, case file, replay or not);
//! DS41_LONG=1 sends every case.

use std::path::PathBuf;
use std::sync::Arc;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use ds41_conformance::case::{Case, Spec};
use ds41_conformance::locations::ReleaseSnapshot;
use ds41_conformance::outcome::Outcome;
use ds41_conformance::protocol::AdapterEngine;
use ds41_conformance::reference::{self, ReferenceEngine};
use ds41_conformance::runner::{self, judge_case, run_case, Context, ExpectedFailures};
use ds41_conformance::selftest::{self, ControlVerdict};

fn verdict(o: &Outcome, rerun: &str, notes: &[String]) -> Result<Completion, Failed> {
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!("\nnotes: {}", notes.join("; "))
    };
    match o {
        Outcome::Pass => Ok(Completion::Completed),
        Outcome::Waived { reason, failure } => {
            eprintln!("WAIVED ({reason}): {failure}");
            Ok(Completion::Completed)
        }
        Outcome::Skipped { reason } => Ok(Completion::ignored_with(format!("SKIPPED: {reason}"))),
        Outcome::NotSupported { capability } => Err(format!(
            "the reference must support every capability; `{capability}` is missing{notes}"
        )
        .into()),
        Outcome::Fail { reason } => Err(format!("{reason}\nre-run: {rerun}{notes}").into()),
        Outcome::Error { reason } => Err(format!("harness error: {reason}{notes}").into()),
    }
}

fn ds41_bin() -> String {
    env!("CARGO_BIN_EXE_ds41").to_string()
}

fn main() {
    let args = Arguments::from_args();
    let work = tempfile::Builder::new()
        .prefix("ds41-suite-")
        .tempdir()
        .expect("temp dir");
    let cases_dir = runner::default_cases_dir();
    let suite =
        runner::load_suite(&cases_dir).unwrap_or_else(|e| panic!("loading the suite: {e:#}"));
    let mut ctx = Context::in_tree(
        work.path(),
        "cargo test -p ds41-conformance --test suite -- '{case}' --exact",
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let xfail_path = ctx.gates.dir.join("expected-failures/ds41-reference.yaml");
    let xfail = Arc::new(if xfail_path.exists() {
        ExpectedFailures::load(&xfail_path, &suite).unwrap_or_else(|e| panic!("{e:#}"))
    } else {
        ExpectedFailures::default()
    });
    let upstream = std::env::var_os("DS41_UPSTREAM")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if upstream.is_none() {
        eprintln!(
            "SKIPPED: DS41_UPSTREAM not set: cases reading upstream data are reported as ignored"
        );
    }
    let release = ReleaseSnapshot::locate(None).unwrap_or_else(|e| panic!("{e:#}"));
    if release.is_none() {
        eprintln!(
            "SKIPPED: {}",
            ds41_conformance::locations::no_release_reason()
        );
    }
    let long = std::env::var("DS41_LONG").is_ok_and(|v| v == "1");
    (ctx.upstream, ctx.release) = (upstream, release);
    let ctx = Arc::new(ctx);
    let mut trials = Vec::new();
    let mut protocol_shapes = std::collections::BTreeSet::new();
    for case in &suite {
        // In process.
        let (c, cx, x) = (case.clone(), Arc::clone(&ctx), Arc::clone(&xfail));
        trials.push(
            Trial::ignorable_test(case.name.clone(), move || {
                let mut engine = ReferenceEngine::new();
                let r = judge_case(&c, &mut engine, &cx, Some(&x));
                verdict(&r.outcome, &r.rerun, &r.details.notes)
            })
            .with_kind(case.family.as_str())
            .with_ignored_flag(case.long && !long),
        );
        // Through the protocol, the reference as a subprocess: in the default tier the first
        // case of each request shape (the in-process trial above judges the engine on every
        // case; this one the transport), every case in the long tier.
        let first_of_shape = !case.long && protocol_shapes.insert(protocol_shape(case));
        let (c, cx, x) = (case.clone(), Arc::clone(&ctx), Arc::clone(&xfail));
        trials.push(
            Trial::ignorable_test(format!("protocol::{}", case.name), move || {
                let mut engine = AdapterEngine::start(&format!("{} serve-adapter", ds41_bin()))
                    .map_err(|e| format!("{e:#}"))?;
                let r = judge_case(&c, &mut engine, &cx, Some(&x));
                let rerun = format!(
                    "cargo test -p ds41-conformance --test suite -- 'protocol::{}' --exact",
                    c.name
                );
                verdict(&r.outcome, &rerun, &r.details.notes)
            })
            .with_kind("protocol")
            .with_ignored_flag(!first_of_shape && !long),
        );
    }
    negative_controls(&suite, &ctx, &mut trials);
    replay_controls(&suite, &ctx, &mut trials);
    adapter_selftests(&suite, &ctx, &mut trials);
    let conclusion = libtest_mimic::run(&args, trials);
    drop(work);
    conclusion.exit();
}

/// What a case sends through the protocol: its family, its case file, for residual cases
/// whether it is a replay, and for vision cases the part and replay (other requests).
fn protocol_shape(case: &Case) -> String {
    let replay = match &case.spec {
        Spec::Residual(r) => format!("{}", r.replay),
        Spec::Vision(v) => format!("{:?}-{}", v.part, v.replay),
        _ => String::new(),
    };
    format!(
        "{}::{}::{replay}",
        case.family.as_str(),
        case.file.display()
    )
}

/// `selftest::defect::NAME`: each injectable defect makes at least one declared check fail;
/// `selftest::defects-declared`: every defect has a declaration.
fn negative_controls(suite: &[Case], ctx: &Arc<Context>, trials: &mut Vec<Trial>) {
    let defects = reference::defects();
    let controls = selftest::load(&selftest::default_path(), suite, &defects);
    let declared: Vec<String> = controls
        .as_ref()
        .map(|c| c.controls.iter().map(|x| x.defect.clone()).collect())
        .unwrap_or_default();
    let load_error = controls.as_ref().err().map(|e| format!("{e:#}"));
    let all = defects.clone();
    trials.push(Trial::test("selftest::defects-declared", move || {
        if let Some(e) = load_error {
            return Err(e.into());
        }
        let missing: Vec<&String> = all.iter().filter(|d| !declared.contains(d)).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(
                format!("defects without declared checks in negative-controls.yaml: {missing:?}")
                    .into(),
            )
        }
    }));
    let Ok(controls) = controls else { return };
    for ctl in controls.controls {
        let (s, cx) = (suite.to_vec(), Arc::clone(ctx));
        trials.push(
            Trial::ignorable_test(format!("selftest::defect::{}", ctl.defect), move || {
                match selftest::check_control(&ctl, &s, &cx) {
                    Ok(_) => Ok(Completion::Completed),
                    Err(ControlVerdict::Skipped(why)) => Ok(Completion::ignored_with(format!(
                        "SKIPPED: every declared check skipped: {why}"
                    ))),
                    Err(ControlVerdict::NotCaught(why) | ControlVerdict::Broken(why)) => {
                        Err(why.into())
                    }
                }
            })
            .with_kind("selftest"),
        );
    }
}

/// `selftest::replay::*`: the teacher-forced cases themselves (not just some case of a
/// control's list) fail on injected defects, localised to the block's own sub-op.
fn replay_controls(suite: &[Case], ctx: &Arc<Context>, trials: &mut Vec<Trial>) {
    let specs = [
        (
            "residual::official_a::p48-prefill-only-replay",
            "no-attention-sink",
            "sub-op `attn_out`",
        ),
        (
            "residual::official_a::p48-prefill-only-replay",
            "no-swiglu-clamp",
            "sub-op `moe_out`",
        ),
        (
            "residual::official_a::p01-d47-as-shipped-replay",
            "index-k-handoff-wrong",
            "first divergence",
        ),
        // The vision tower's stages: the rope breaks the first block, the unfold order only
        // the aligner (every ViT stage before it matches).
        (
            "vision::official::tower-601x599-exact-replay",
            "vision-rope-halves-swapped",
            "first divergence: `vision.blocks[0]`",
        ),
        (
            "vision::official::tower-601x599-upstream",
            "aligner-unfold-kw-kh",
            "first divergence: `vision.aligner`",
        ),
        // Image positions in the language model: the first image's start (token 5), layer 0.
        (
            "residual::official_vision_s7::vision-s7-p15-d06-replay",
            "gate-bias-for-image",
            "first divergence at token 5 layer 0",
        ),
        (
            "residual::official_vision_s7::vision-s7-p15-d06-replay",
            "engram-image-not-dead",
            "first divergence at token 5 layer 0",
        ),
    ];
    for (name, defect, needle) in specs {
        let (case, cx) = (
            suite.iter().find(|c| c.name == name).cloned(),
            Arc::clone(ctx),
        );
        trials.push(
            Trial::ignorable_test(format!("selftest::replay::{defect}"), move || {
                let case = case.ok_or_else(|| format!("case `{name}` missing"))?;
                let mut engine = ReferenceEngine::with_defect(defect).map_err(|e| e.to_string())?;
                match run_case(&case, &mut engine, &cx).outcome {
                    Outcome::Fail { reason } if reason.contains(needle) => Ok(Completion::Completed),
                    Outcome::Skipped { reason } => {
                        Ok(Completion::ignored_with(format!("SKIPPED: {reason}")))
                    }
                    other => Err(format!(
                        "{name} with `{defect}`: expected a Fail mentioning {needle:?}, got {other:?}"
                    )
                    .into()),
                }
            })
            .with_kind("selftest"),
        );
    }
}

const FAKE: &str = r#"mode=$1; marker=$2
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"op":"hello"'*)
      caps='["load"]'; [ "$mode" = nocaps ] && caps='[]'; [ "$mode" = engram-garbage ] && caps='["engram_hash"]'
      printf '{"id":%s,"ok":true,"result":{"protocol":"ds41-engine/1","engine":{"name":"fake-%s","version":"0"},"capabilities":%s}}\n' "$id" "$mode" "$caps";;
    *'"op":"shutdown"'*) [ "$mode" = accept ] && printf 'shutdown %s\n' "$id" >> "$marker"; printf '{"id":%s,"ok":true,"result":{}}\n' "$id"; exit 0;;
    *) case "$mode" in
         crash) echo "fake engine: imitating a segfault" >&2; exit 139;;
         crash-once) if [ -e "$marker" ]; then printf '{"id":%s,"ok":true,"result":{}}\n' "$id"; else : > "$marker"; echo "fake engine: first call dies" >&2; exit 1; fi;;
         hang) exec sleep 5;;
         garbage) echo 'Loading model... 100%';;
         refuse) printf '{"id":%s,"ok":false,"error":{"kind":"refused","message":"no thanks"}}\n' "$id";;
         engram-garbage) printf '{"id":%s,"ok":true,"result":{"ids":[[[1,2]]]}}\n' "$id";;
         accept|nocaps) printf '{"id":%s,"ok":true,"result":{}}\n' "$id";;
       esac;;
  esac
done
"#;

/// `selftest::adapter::*`: a crashing, hanging, garbage-speaking, refusing or
/// accept-everything engine fails the case with the reason, and the run goes on.
fn adapter_selftests(suite: &[Case], ctx: &Arc<Context>, trials: &mut Vec<Trial>) {
    let find = |n: &str| suite.iter().find(|c| c.name == n).cloned();
    let (Some(valid), Some(mutant), Some(engram)) = (
        find("loader::synthetic::tiny-release-loads"),
        find("loader::synthetic::mutant-tiny-release.no-attn-sink"),
        find("engram::synthetic::tiny-release-dead-latches"),
    ) else {
        trials.push(Trial::test("selftest::adapter", || {
            Err("the loader cases the self-tests use are missing".into())
        }));
        return;
    };
    let expect_fail = |needle: &'static str| -> Box<dyn Fn(&Outcome) -> Result<(), String> + Send> {
        Box::new(move |o: &Outcome| match o {
            Outcome::Fail { reason } if reason.contains(needle) => Ok(()),
            other => Err(format!(
                "expected a Fail mentioning {needle:?}, got {other:?}"
            )),
        })
    };
    let specs: Vec<(
        &str,
        Case,
        Box<dyn Fn(&Outcome) -> Result<(), String> + Send>,
    )> = vec![
        ("crash", valid.clone(), expect_fail("imitating a segfault")),
        (
            "hang",
            Case {
                timeout_s: 0.5,
                ..valid.clone()
            },
            expect_fail("timed out"),
        ),
        (
            "garbage",
            valid.clone(),
            expect_fail("Loading model... 100%"),
        ),
        (
            "refuse",
            valid.clone(),
            expect_fail("refused a valid checkpoint"),
        ),
        (
            "accept",
            mutant.clone(),
            expect_fail("accepted a broken checkpoint"),
        ),
        // Refusing everything refuses every mutant, and proves nothing: the base must load.
        (
            "refuse-mutant",
            mutant.clone(),
            expect_fail("cannot load the unmutated base"),
        ),
        (
            "nocaps",
            valid.clone(),
            Box::new(|o: &Outcome| match o {
                Outcome::NotSupported { capability } if capability == "load" => Ok(()),
                other => Err(format!("expected NotSupported(load), got {other:?}")),
            }),
        ),
        (
            "nocaps-engram",
            engram.clone(),
            Box::new(|o: &Outcome| match o {
                Outcome::NotSupported { capability } if capability == "engram_hash" => Ok(()),
                other => Err(format!("expected NotSupported(engram_hash), got {other:?}")),
            }),
        ),
        (
            "engram-garbage",
            engram.clone(),
            expect_fail("engine returned ids of shape [1, 1, 2]"),
        ),
    ];
    let dir = ctx.work_dir.join("fake-engines");
    let _ = std::fs::create_dir_all(&dir);
    let script = dir.join("fake.sh");
    let _ = std::fs::write(&script, FAKE);
    for (mode, case, check) in specs {
        let (cx, script) = (Arc::clone(ctx), script.clone());
        trials.push(
            Trial::test(format!("selftest::adapter::{mode}"), move || {
                // `MODE-engram` / `MODE-mutant`: the script's MODE on another case.
                let script_mode = ["-engram", "-mutant"]
                    .iter()
                    .find_map(|x| mode.strip_suffix(x))
                    .unwrap_or(mode);
                let mut e = AdapterEngine::start(&format!(
                    "exec sh {} {script_mode} /dev/null",
                    script.display()
                ))
                .map_err(|e| format!("{e:#}"))?;
                let r = run_case(&case, &mut e, &cx);
                check(&r.outcome).map_err(Failed::from)
            })
            .with_kind("selftest"),
        );
    }
    // `shutdown` carries the next id, like every request.
    let (cx, sc, ids) = (Arc::clone(ctx), script.clone(), dir.join("shutdown-id.log"));
    let case = valid.clone();
    trials.push(
        Trial::test("selftest::adapter::shutdown-id", move || {
            let _ = std::fs::remove_file(&ids);
            let mut e = AdapterEngine::start(&format!(
                "exec sh {} accept {}",
                sc.display(),
                ids.display()
            ))
            .map_err(|e| format!("{e:#}"))?;
            // hello (id 1), load (id 2), then shutdown when the driver is dropped
            let r = run_case(&case, &mut e, &cx);
            drop(e);
            let log = std::fs::read_to_string(&ids).unwrap_or_default();
            if r.outcome == Outcome::Pass && log.trim() == "shutdown 3" {
                Ok(())
            } else {
                Err(format!(
                    "expected Pass and `shutdown 3`, got {:?} and {log:?}",
                    r.outcome
                )
                .into())
            }
        })
        .with_kind("selftest"),
    );
    // A crash fails that case only: the next case gets a fresh engine process.
    let (cx, script, marker) = (Arc::clone(ctx), script, dir.join("crash-once.marker"));
    trials.push(
        Trial::test("selftest::adapter::run-goes-on-after-crash", move || {
            let _ = std::fs::remove_file(&marker);
            let mut e = AdapterEngine::start(&format!("exec sh {} crash-once {}", script.display(), marker.display())).map_err(|e| format!("{e:#}"))?;
            let first = run_case(&valid, &mut e, &cx);
            if !matches!(&first.outcome, Outcome::Fail { reason } if reason.contains("first call dies")) {
                return Err(format!("first call: expected a crash Fail with the engine's stderr, got {:?}", first.outcome).into());
            }
            let second = run_case(&valid, &mut e, &cx);
            if second.outcome != Outcome::Pass {
                return Err(format!("second call after the restart: expected Pass, got {:?}", second.outcome).into());
            }
            Ok(())
        })
        .with_kind("selftest"),
    );
}
