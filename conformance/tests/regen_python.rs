//! The Python side of goldens/regen/, run from `cargo test` (harness: libtest-mimic, so a
//! trial that cannot run is reported as *ignored* with its reason, never as passed):
//!
//! * `regen_python::model` — goldens/regen/model/test_*.py: the torch kernels against
//!   hand-computed cases and an exact rational reference, run_official.py on its toy stand-in;
//! * `regen_python::scripts` — goldens/regen/test_regen*.py: the DSML, tokenizer and WASTE
//!   drivers on toys and forged inputs;
//! * `regen_python::torch-kernels-vs-engine` — the torch kernels against this engine's upstream
//!   profile, bit for bit, on official_a weights (regen_python/torch_kernels.rs);
//! * `regen_python::engram-map-vs-official` — the engine's Engram token map against the
//!   official engram.py on every tokenizer we have (regen_python/engram_map.rs); needs
//!   `DS41_OFFICIAL_INFERENCE`, the release `inference/` directory;
//! * `regen_python::dspark-goldens-reproduce` — goldens/regen/model/run_dspark.py on a freshly
//!   synthesised `dspark` seed 6 reproduces the committed DSpark golden `dspark_p18_d06` tensor
//!   for tensor, and its teacher-forced run from that golden gives it back bit for bit; needs
//!   `DS41_OFFICIAL_INFERENCE`;
//! * `regen_python::vision-preprocess-random-vs-official` — the engine's image preprocessing
//!   against the official `image_processor.py` on a fresh random PNG corpus
//!   (goldens/regen/vision_preprocess.py --random; seed `DS41_VISION_SEED`, default 1), bit for
//!   bit; needs `DS41_OFFICIAL_INFERENCE`;
//! * `regen_python::vision-tower-vs-official` — the engine's vision tower and aligner against
//!   the official `vision.py` on small random weights (regen_python/vision_tower.rs); needs
//!   `DS41_OFFICIAL_INFERENCE`;
//! * `regen_python::vision-span-goldens-reproduce` — goldens/regen/vision_span.py reproduces
//!   goldens/vision/span/expected.json byte for byte (regen_python/vision_span.rs); needs
//!   `DS41_OFFICIAL_INFERENCE`, `DS41_OFFICIAL_ENCODING` (the release `encoding/` directory
//!   with `encoding.py`) and a release snapshot's `tokenizer.json` (`DS41_RELEASE`);
//! * `regen_python::waste-containers-vs-make_test_container` — `ds41 synth --preset waste-tiny
//!   --layout container --seed S` against WASTE's `make_test_container.py --ds41 --seed S`, and
//!   `waste-vq4p` against the same with `--index-bits 6`, seeds 0-3, byte for byte; needs
//!   `DS41_WASTE`, a WASTE checkout.
//! * `regen_python::waste-converter-output-vs-oracle` — WASTE's `tools/convert.py` on a synthetic
//!   release checkpoint (VQ3R and VQ4P experts): both containers open and run in the reference,
//!   and on the VQ3R one the reference agrees with WASTE's oracle at the exact gates; Q4G and
//!   Q3G trunks pass the converter gate's round trip against the release; needs
//!   `DS41_WASTE` (its `convert.py` imports `mxfp4.py`, `hf_tokenizer.py`, `ds41_engram.py` and
//!   `ds41_preflight.py` from `tools/`).
//! * `regen_python::comparer-vs-compare-py` — the harness's trace comparison against
//!   `shared/tools/compare.py` (`DS41_COMPARE_PY`, else `../shared/tools/compare.py` beside
//!   the checkout): the suite's residual cases on committed goldens, the reference's traces of
//!   each case's run clean and with defects, judged with the case's gates: the same verdict and
//!   failing metrics (regen_python/comparer_vs_compare_py.rs).
//! * `regen_python::waste-vision-vs-oracle` — the reference's vision tower, aligner and image
//!   span on two vision containers (the `vision` preset's and `make_test_container.py --ds41
//!   --vision`'s) against WASTE's `tools/ds41_vision_ref.py`, stage by stage at its 1e-4 limit,
//!   and its grid planning against the reference's over the PNG corpus
//!   (regen_python/waste_vision.rs); needs `DS41_WASTE`.
//!
//! `DS41_PYTHON` names a Python with goldens/regen/requirements.txt installed, e.g.
//! `DS41_PYTHON=/tmp/ds41-venv/bin/python DS41_RELEASE=../shared/release cargo test -p
//! ds41-conformance --test regen_python` (about 40 s). Set but lacking the pinned packages is a
//! failure. `DS41_UPSTREAM` and `DS41_TOKENIZER_WHEEL` are passed through (the Python tests that
//! need them say `SKIPPED` when unset).

#[path = "regen_python/comparer_vs_compare_py.rs"]
mod comparer_vs_compare_py;
#[path = "regen_python/engram_map.rs"]
mod engram_map;
#[path = "regen_python/torch_kernels.rs"]
mod torch_kernels;
#[path = "regen_python/vision_span.rs"]
mod vision_span;
#[path = "regen_python/vision_tower.rs"]
mod vision_tower;
#[path = "regen_python/waste_converter.rs"]
mod waste_converter;
#[path = "regen_python/waste_vision.rs"]
mod waste_vision;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Run `cmd` (described as `what` in errors) and require success; its stderr makes the error.
fn run_ok(cmd: &mut Command, what: &str) -> Result<std::process::Output, Failed> {
    let out = cmd.output().map_err(|e| format!("run {what}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!("{what} failed:\n{}", String::from_utf8_lossy(&out.stderr)).into())
    }
}

/// Run one `unittest discover` and require that tests ran and all passed.
fn unittest(python: &Path, dir: &str, pattern: &str) -> Result<Completion, Failed> {
    let out = Command::new(python)
        .args(["-B", "-m", "unittest", "discover", "-s", dir, "-p", pattern])
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("run {python:?}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("{dir}: python tests failed:\n{stderr}").into());
    }
    let ran = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or(0);
    if ran == 0 {
        return Err(format!("{dir}: no test ran:\n{stderr}").into());
    }
    eprintln!("{dir}: {ran} python tests ran, all passed");
    for line in stderr
        .lines()
        .filter_map(|l| l.find("SKIPPED").map(|i| &l[i..]))
    {
        eprintln!("  {line}");
    }
    Ok(Completion::Completed)
}

/// The Python named by DS41_PYTHON, after checking it has the pinned packages.
fn regen_python() -> Result<PathBuf, String> {
    let python = std::env::var_os("DS41_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or("SKIPPED: DS41_PYTHON not set (a Python with goldens/regen/requirements.txt)")?;
    let probe = Command::new(&python)
        .args(["-c", "import torch, tokenizers, safetensors, numpy, PIL"])
        .output()
        .map_err(|e| format!("DS41_PYTHON={python:?} cannot be run: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "DS41_PYTHON={python:?} lacks the pinned regen dependencies:\n{}",
            String::from_utf8_lossy(&probe.stderr)
        ));
    }
    Ok(python)
}

/// The path an environment variable names, if set and not empty.
fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The release `inference/` directory named by `DS41_OFFICIAL_INFERENCE`, or the skip.
fn official_inference() -> Result<PathBuf, Completion> {
    std::env::var_os("DS41_OFFICIAL_INFERENCE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            Completion::ignored_with(
                "SKIPPED: DS41_OFFICIAL_INFERENCE not set (the release inference/ directory)",
            )
        })
}

fn main() {
    let args = Arguments::from_args();
    let upstream = std::env::var_os("DS41_UPSTREAM").filter(|v| !v.is_empty());
    if std::env::var_os("DS41_PYTHON").is_none_or(|v| v.is_empty()) {
        eprintln!(
            "SKIPPED: DS41_PYTHON not set: the goldens/regen Python tests are reported as ignored"
        );
    }
    // A missing DS41_PYTHON is a skip; a DS41_PYTHON that cannot run the tests is a failure.
    let need_python = || -> Result<Option<PathBuf>, Failed> {
        match regen_python() {
            Ok(p) => Ok(Some(p)),
            Err(reason) if reason.starts_with("SKIPPED") => Ok(None),
            Err(reason) => Err(reason.into()),
        }
    };
    let skipped = || Completion::ignored_with("SKIPPED: DS41_PYTHON not set");
    let trials = vec![
        Trial::ignorable_test("regen_python::model", move || match need_python()? {
            Some(py) => unittest(&py, "goldens/regen/model", "test_*.py"),
            None => Ok(skipped()),
        }),
        Trial::ignorable_test("regen_python::scripts", move || match need_python()? {
            Some(py) => unittest(&py, "goldens/regen", "test_regen*.py"),
            None => Ok(skipped()),
        }),
        Trial::ignorable_test("regen_python::torch-kernels-vs-engine", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let Some(up) = upstream.clone() else {
                return Ok(Completion::ignored_with("SKIPPED: DS41_UPSTREAM not set"));
            };
            torch_kernels::torch_kernels_equal_the_engine_bit_for_bit(&py, Path::new(&up));
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test("regen_python::engram-map-vs-official", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let inference = match official_inference() {
                Ok(dir) => dir,
                Err(skip) => return Ok(skip),
            };
            engram_map::engram_map_equals_official(
                &py,
                &inference,
                env_path("DS41_RELEASE").as_deref(),
                env_path("DS41_UPSTREAM").as_deref(),
            );
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test("regen_python::dspark-goldens-reproduce", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let Some(inference) =
                std::env::var_os("DS41_OFFICIAL_INFERENCE").filter(|v| !v.is_empty())
            else {
                return Ok(Completion::ignored_with(
                    "SKIPPED: DS41_OFFICIAL_INFERENCE not set (the release inference/ directory)",
                ));
            };
            dspark_goldens_reproduce(&py, Path::new(&inference))?;
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test("regen_python::vision-golden-reproduces", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let inference = match official_inference() {
                Ok(dir) => dir,
                Err(skip) => return Ok(skip),
            };
            vision_golden_reproduces(&py, &inference)?;
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test(
            "regen_python::vision-preprocess-random-vs-official",
            move || {
                let Some(py) = need_python()? else {
                    return Ok(skipped());
                };
                let inference = match official_inference() {
                    Ok(dir) => dir,
                    Err(skip) => return Ok(skip),
                };
                vision_random_corpus_equals_official(&py, &inference)?;
                Ok(Completion::Completed)
            },
        ),
        Trial::ignorable_test("regen_python::vision-tower-vs-official", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let inference = match official_inference() {
                Ok(dir) => dir,
                Err(skip) => return Ok(skip),
            };
            vision_tower::tower_matches_official(&py, &inference);
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test("regen_python::vision-span-goldens-reproduce", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let inference = match official_inference() {
                Ok(dir) => dir,
                Err(skip) => return Ok(skip),
            };
            let (Some(encoding), Some(release)) =
                (env_path("DS41_OFFICIAL_ENCODING"), env_path("DS41_RELEASE"))
            else {
                return Ok(Completion::ignored_with(
                    "SKIPPED: DS41_OFFICIAL_ENCODING (the release encoding/ directory) or \
                     DS41_RELEASE (a release snapshot, for tokenizer.json) not set",
                ));
            };
            vision_span::span_golden_reproduces(
                &py,
                &inference,
                &encoding,
                &release.join("tokenizer.json"),
            );
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test(
            "regen_python::waste-containers-vs-make_test_container",
            move || {
                let Some(py) = need_python()? else {
                    return Ok(skipped());
                };
                let Some(waste) = std::env::var_os("DS41_WASTE").filter(|v| !v.is_empty()) else {
                    return Ok(Completion::ignored_with(
                    "SKIPPED: DS41_WASTE not set (a WASTE checkout with tools/make_test_container.py)",
                ));
                };
                waste_containers_equal_make_test_container(&py, Path::new(&waste))?;
                Ok(Completion::Completed)
            },
        ),
        Trial::ignorable_test(
            "regen_python::waste-converter-output-vs-oracle",
            move || {
                let Some(py) = need_python()? else {
                    return Ok(skipped());
                };
                let Some(waste) = env_path("DS41_WASTE") else {
                    return Ok(Completion::ignored_with(
                        "SKIPPED: DS41_WASTE not set (a WASTE checkout with tools/convert.py and \
                     tools/ds41_ref.py)",
                    ));
                };
                waste_converter::converted_containers_agree_with_the_oracle(&py, &waste)?;
                Ok(Completion::Completed)
            },
        ),
        Trial::ignorable_test("regen_python::comparer-vs-compare-py", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let Some(script) = comparer_vs_compare_py::compare_py() else {
                return Ok(Completion::ignored_with(
                    "SKIPPED: no compare.py (DS41_COMPARE_PY not set and no \
                     ../shared/tools/compare.py beside the checkout)",
                ));
            };
            comparer_vs_compare_py::verdicts_agree(&py, &script)?;
            Ok(Completion::Completed)
        }),
        Trial::ignorable_test("regen_python::waste-vision-vs-oracle", move || {
            let Some(py) = need_python()? else {
                return Ok(skipped());
            };
            let Some(waste) = env_path("DS41_WASTE") else {
                return Ok(Completion::ignored_with(
                    "SKIPPED: DS41_WASTE not set (a WASTE checkout with tools/ds41_vision_ref.py \
                     and tools/make_test_container.py)",
                ));
            };
            waste_vision::towers_agree_with_the_oracle(&py, &waste)?;
            Ok(Completion::Completed)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}

/// run_dspark.py reproduces goldens/official/dspark_s6/dspark_p18_d06 (forward and replay).
fn dspark_goldens_reproduce(python: &Path, inference: &Path) -> Result<(), Failed> {
    let root = repo_root();
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ckpt = tmp.path().join("dspark-seed6");
    ds41_synthetic::generate("dspark", ds41_engine::checkpoint::Layout::Release, 6, &ckpt)
        .map_err(|e| e.to_string())?;
    let golden = root.join("goldens/official/dspark_s6/dspark_p18_d06.safetensors");
    let want = ds41_engine::trace::TraceFile::read(&golden).map_err(|e| e.to_string())?;
    let tokens: Vec<String> = want
        .i64("input_ids")
        .unwrap()
        .1
        .iter()
        .map(|t| t.to_string())
        .collect();
    let tokens = tokens.join(",");
    let args = ["--tokens", tokens.as_str(), "--prefill", "18"].map(OsString::from);
    reproduces(
        python,
        "run_dspark.py",
        &args,
        &ckpt,
        inference,
        &golden,
        tmp.path(),
    )
}

/// Run `goldens/regen/model/SCRIPT` on `ckpt` with `args`, forward and teacher-forced from
/// `golden` (`--replay`), and require the golden's tensors back exactly from both.
fn reproduces(
    python: &Path,
    script: &str,
    args: &[OsString],
    ckpt: &Path,
    inference: &Path,
    golden: &Path,
    tmp: &Path,
) -> Result<(), Failed> {
    let want = ds41_engine::trace::TraceFile::read(golden).map_err(|e| e.to_string())?;
    for replay in [false, true] {
        let out = tmp.join(format!("reproduced-{replay}.safetensors"));
        let mut cmd = Command::new(python);
        cmd.arg(repo_root().join("goldens/regen/model").join(script))
            .arg("--inference")
            .arg(inference)
            .arg("--checkpoint")
            .arg(ckpt)
            .args(args)
            .arg("--out")
            .arg(&out);
        if replay {
            cmd.arg("--replay").arg(golden);
        }
        let run = cmd.output().map_err(|e| e.to_string())?;
        if !run.status.success() {
            return Err(
                format!("{script} failed:\n{}", String::from_utf8_lossy(&run.stderr)).into(),
            );
        }
        let got = ds41_engine::trace::TraceFile::read(&out).map_err(|e| e.to_string())?;
        if got.tensors != want.tensors {
            let differ: Vec<String> = want
                .tensors
                .keys()
                .filter(|k| got.tensors.get(*k) != want.tensors.get(*k))
                .map(|k| how_far(k, &got, &want))
                .collect();
            return Err(format!(
                "replay {replay}: tensors differ from the golden:\n  {}\n(bit-exact \
                 reproduction depends on torch's CPU kernels: goldens/README.md, 'CPU dependence')",
                differ.join("\n  ")
            )
            .into());
        }
    }
    Ok(())
}

/// How tensor `name` of `got` differs from `want`'s: how many values, and for f32 by how much
/// at most, so a last-bit difference reads apart from a wrong result.
fn how_far(
    name: &str,
    got: &ds41_engine::trace::TraceFile,
    want: &ds41_engine::trace::TraceFile,
) -> String {
    match (got.f32(name), want.f32(name)) {
        (Some((gs, g)), Some((ws, w))) if gs == ws => {
            let (count, max) = g
                .iter()
                .zip(w)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .fold((0usize, 0f32), |(n, m), (a, b)| {
                    (n + 1, m.max((a - b).abs()))
                });
            format!(
                "{name}: {count} of {} values, max |difference| {max:e}",
                w.len()
            )
        }
        _ => match (got.i64(name), want.i64(name)) {
            (Some((gs, g)), Some((ws, w))) if gs == ws => {
                let count = g.iter().zip(w).filter(|(a, b)| a != b).count();
                format!("{name}: {count} of {} values", w.len())
            }
            _ => format!("{name}: missing, or of another shape or type"),
        },
    }
}

/// run_vision.py reproduces goldens/official/vision_s7/p15_d06 from a fresh checkpoint, the
/// PNGs and the prompt its provenance names (forward and teacher-forced replay).
fn vision_golden_reproduces(python: &Path, inference: &Path) -> Result<(), Failed> {
    let root = repo_root();
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ckpt = tmp.path().join("vision-seed7");
    ds41_synthetic::generate("vision", ds41_engine::checkpoint::Layout::Release, 7, &ckpt)
        .map_err(|e| e.to_string())?;
    let golden = root.join("goldens/official/vision_s7/p15_d06.safetensors");
    let provenance: serde_json::Value = serde_json::from_slice(
        &std::fs::read(golden.with_file_name("p15_d06.safetensors.provenance.json"))
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let command = provenance["command"].as_str().unwrap_or_default();
    let tokens = command
        .split_whitespace()
        .skip_while(|w| *w != "--tokens")
        .nth(1)
        .ok_or("provenance command without --tokens")?;
    let images: Vec<String> = provenance["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| {
            i["name"].as_str().is_some_and(|n| {
                n.strip_prefix("image")
                    .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(|i| i["path"].as_str().unwrap_or_default().to_string())
        .collect();
    let mut args = ["--tokens", tokens, "--prefill", "15"]
        .map(OsString::from)
        .to_vec();
    for image in &images {
        args.push("--image".into());
        args.push(root.join(image).into_os_string());
    }
    reproduces(
        python,
        "run_vision.py",
        &args,
        &ckpt,
        inference,
        &golden,
        tmp.path(),
    )
}

/// `ds41 synth --preset waste-tiny --layout container --seed S` equals WASTE's
/// `tools/make_test_container.py OUT --ds41 --seed S` byte for byte, for the seeds the goldens
/// use (0: the tests' container, 1-3: goldens/waste_oracle/).
fn waste_containers_equal_make_test_container(python: &Path, waste: &Path) -> Result<(), Failed> {
    let script = waste.join("tools/make_test_container.py");
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut bad = Vec::new();
    let variants = [
        ("waste-tiny", &[][..]),
        ("waste-vq4p", &["--index-bits", "6"][..]),
    ];
    for seed in 0..4u64 {
        for (preset, flags) in variants {
            let theirs = tmp.path().join(format!("waste-{preset}-{seed}"));
            run_ok(
                Command::new(python)
                    .arg(&script)
                    .arg(&theirs)
                    .args(["--ds41", "--seed", &seed.to_string()])
                    .args(flags),
                &format!("{script:?} --seed {seed} {flags:?}"),
            )?;
            let ours = tmp.path().join(format!("ours-{preset}-{seed}"));
            let g =
                ds41_synthetic::generate(preset, ds41_synthetic::Layout::Container, seed, &ours)
                    .map_err(|e| e.to_string())?;
            let mut names: Vec<String> = std::fs::read_dir(&theirs)
                .map_err(|e| e.to_string())?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let want = ds41_synthetic::hash_files(&theirs, &names).map_err(|e| e.to_string())?;
            let got = ds41_synthetic::hash_files(&ours, &g.files).map_err(|e| e.to_string())?;
            for n in &names {
                if got.get(n) != want.get(n) {
                    bad.push(format!("{preset} seed {seed}: {n}"));
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("files differing from make_test_container.py: {bad:?}").into())
    }
}

/// A random PNG corpus (random sizes, colour types and configs), made and run through the
/// official `load_image` by goldens/regen/vision_preprocess.py, then checked against the engine.
fn vision_random_corpus_equals_official(python: &Path, inference: &Path) -> Result<(), Failed> {
    let seed = std::env::var("DS41_VISION_SEED").unwrap_or_else(|_| "1".into());
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    run_ok(
        Command::new(python)
            .args([
                "-W",
                "ignore",
                "goldens/regen/vision_preprocess.py",
                "--inference",
            ])
            .arg(inference)
            .arg("--out")
            .arg(tmp.path())
            .args(["--random", "40", "--seed", &seed])
            .current_dir(repo_root()),
        "vision_preprocess.py --random",
    )?;
    let report = ds41_conformance::vision_goldens::check_corpus(tmp.path())?;
    eprintln!(
        "random vision corpus (seed {seed}): {} images, {} of {} cases bit-exact",
        report.images, report.exact, report.cases
    );
    if report.cases == 0 || !report.failures.is_empty() {
        return Err(format!(
            "{} of {} cases differ:\n{}",
            report.failures.len(),
            report.cases,
            report.failures.join("\n")
        )
        .into());
    }
    Ok(())
}
