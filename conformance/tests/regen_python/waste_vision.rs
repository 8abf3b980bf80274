//! The reference's vision tower on WASTE containers against WASTE's own vision oracle
//! (`tools/ds41_vision_ref.py` at Penguinjanator/warp 8d5405d8: the release's `vision.py`
//! transcribed, weights read from the container, torch f32). Two containers: the project's
//! `vision` preset in the container layout and WASTE's `make_test_container.py --ds41 --vision`
//! (its own `vision.json`: another placeholder id, a wider aligner output). For corpus images
//! whose grids need the aligner's padding, a single patch, one row of patches and one column:
//! the patch embedding, every ViT block, the final norm and the whole image span (delimiters,
//! rows, newlines: the first hyper-connection copy of layer 0's input) each within the oracle's
//! own limit, rel L2 below 1e-4 (the exact profile's gate); and the oracle's `--plan` (its
//! transcription of the release's grid planning) gives every corpus image the grid the
//! reference's preprocessing does.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_engine::trace::TraceFile;
use ds41_engine::vision;
use libtest_mimic::Failed;

/// Padded grids, a square one, a single patch, one row and one column of patches.
const IMAGES: [&str; 5] = [
    "rgb8_601x599_odd",
    "rgb8_640x480",
    "rgb8_13x7",
    "rgb8_1000x10_wide",
    "rgb8_10x1000_tall",
];

pub fn towers_agree_with_the_oracle(python: &Path, waste: &Path) -> Result<(), Failed> {
    let oracle = waste.join("tools/ds41_vision_ref.py");
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ours = tmp.path().join("ours");
    ds41_synthetic::generate("vision", ds41_synthetic::Layout::Container, 0, &ours)
        .map_err(|e| e.to_string())?;
    let theirs = tmp.path().join("theirs");
    super::run_ok(
        Command::new(python)
            .arg(waste.join("tools/make_test_container.py"))
            .arg(&theirs)
            .args(["--ds41", "--vision"]),
        "make_test_container.py --ds41 --vision",
    )?;
    let corpus = super::repo_root().join("goldens/vision/preprocess/images");
    let mut failures = Vec::new();
    for container in [&ours, &theirs] {
        failures.extend(plans_agree(python, &oracle, container, &corpus)?);
        for image in IMAGES {
            let png = corpus.join(format!("{image}.png"));
            failures.extend(
                stages_agree(python, &oracle, container, &png, None, tmp.path())?
                    .into_iter()
                    .map(|(_, message)| message),
            );
        }
    }
    // Negative controls: each known vision defect is caught, first at the stage it breaks.
    let png = corpus.join(format!("{}.png", IMAGES[0]));
    for (defect, first) in [
        ("vision-rope-halves-swapped", "block0"),
        ("aligner-unfold-kw-kh", "span"),
    ] {
        let caught = stages_agree(python, &oracle, &theirs, &png, Some(defect), tmp.path())?;
        let stages: Vec<&str> = caught.iter().map(|(stage, _)| stage.as_str()).collect();
        if stages.first() != Some(&first) {
            failures.push(format!(
                "defect {defect}: the oracle flagged stages {stages:?}, expected the first to be \
                 {first}"
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// Every stage the oracle offers against the reference's trace of one image (exact profile,
/// with `defect` injected if given): the stages the oracle flags, in order, with its words.
fn stages_agree(
    python: &Path,
    oracle: &Path,
    container: &Path,
    png: &Path,
    defect: Option<&str>,
    tmp: &Path,
) -> Result<Vec<(String, String)>, Failed> {
    let (cfg, marker) = vision::image_inputs_config_from(container).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(png).map_err(|e| e.to_string())?;
    let patches = vision::preprocess_bytes(&bytes, png, &cfg).map_err(|e| e.to_string())?;
    let (vit_h, vit_w) = patches.vit_grid();
    let pixels = tmp.join("pixels.bin");
    let values: Vec<u8> = patches
        .patches
        .iter()
        .flat_map(|v| v.to_f32().to_le_bytes())
        .collect();
    std::fs::write(&pixels, values).map_err(|e| e.to_string())?;

    let trace = tmp.join("trace.safetensors");
    let mut forward = Command::new(env!("CARGO_BIN_EXE_ds41"));
    forward
        .args(["forward", "--numerics", "exact", "--sub-ops"])
        .args(["--tokens", &format!("1,{marker},2")])
        .arg("--model")
        .arg(container)
        .arg("--image")
        .arg(png)
        .arg("--out")
        .arg(&trace);
    if let Some(defect) = defect {
        forward.args(["--defect", defect]);
    }
    super::run_ok(&mut forward, "ds41 forward --image")?;
    let trace = TraceFile::read(&trace).map_err(|e| e.to_string())?;
    let tensor = |name: &str| {
        trace
            .f32(name)
            .ok_or_else(|| format!("the trace lacks {name}"))
    };

    let mut stages: Vec<(String, Vec<f32>)> = Vec::new();
    stages.push(("embed".into(), tensor("vision.I0.embed")?.1.to_vec()));
    let (shape, blocks) = tensor("vision.I0.blocks")?;
    let per_block = blocks.len() / shape[0];
    for (b, block) in blocks.chunks_exact(per_block).enumerate() {
        stages.push((format!("block{b}"), block.to_vec()));
    }
    stages.push(("post".into(), tensor("vision.I0.vit")?.1.to_vec()));
    // The span occupies positions 1.. of the prompt; layer 0's input holds its embeddings.
    let (shape, input) = tensor("block_input")?;
    let (layers, copies, dim) = (shape[1], shape[2], shape[3]);
    let span_len = patches.plan.num_image_tokens();
    let span: Vec<f32> = (1..=span_len)
        .flat_map(|t| {
            let at = t * layers * copies * dim;
            input[at..at + dim].to_vec()
        })
        .collect();
    stages.push(("span".into(), span));

    let mut failures = Vec::new();
    let engine = tmp.join("engine.bin");
    for (stage, values) in stages {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&engine, bytes).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(python);
        cmd.arg(oracle)
            .arg("--container")
            .arg(container)
            .arg("--pixels")
            .arg(&pixels)
            .args(["--grid", &format!("{vit_h}x{vit_w}")])
            .arg("--engine")
            .arg(&engine);
        if stage != "span" {
            cmd.args(["--stage", &stage]);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("run ds41_vision_ref.py: {e}"))?;
        // The oracle exits 1 when the engine's tensor is 1e-4 or more away (rel L2), and
        // fails otherwise on a shape it cannot read.
        if !out.status.success() {
            let message = format!(
                "{} {} {stage}: {}{}",
                name(container),
                name(png),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            failures.push((stage, message));
        }
    }
    Ok(failures)
}

/// The oracle's grid planning (its `plan_image_grid`, what `--plan` prints) against the
/// reference's preprocessing, over the whole corpus: one Python process, sizes on stdin.
fn plans_agree(
    python: &Path,
    oracle: &Path,
    container: &Path,
    corpus: &Path,
) -> Result<Vec<String>, Failed> {
    let cfg = vision::vision_config_from(container).map_err(|e| e.to_string())?;
    let mut pngs: Vec<PathBuf> = std::fs::read_dir(corpus)
        .map_err(|e| e.to_string())?
        .map(|e| e.map(|e| e.path()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    pngs.retain(|p| p.extension().is_some_and(|e| e == "png"));
    pngs.sort();
    let mut sizes = String::new();
    let mut ours = Vec::new();
    for png in &pngs {
        let bytes = std::fs::read(png).map_err(|e| e.to_string())?;
        let p = vision::preprocess_bytes(&bytes, png, &cfg).map_err(|e| e.to_string())?;
        sizes += &format!("{} {}\n", p.source_width, p.source_height);
        let plan = &p.plan;
        ours.push(format!(
            "{} {} {} {}",
            plan.best_height, plan.best_width, plan.n_llm_h, plan.n_llm_w
        ));
    }
    let script = "import json, os, sys\n\
        sys.path.insert(0, os.path.dirname(sys.argv[1]))\n\
        from ds41_vision_ref import plan_image_grid\n\
        vj = json.load(open(os.path.join(sys.argv[2], 'vision.json')))\n\
        for line in sys.stdin:\n    \
            w, h = map(int, line.split())\n    \
            print(*plan_image_grid(w, h, vj))\n";
    let mut child = Command::new(python)
        .args(["-c", script])
        .arg(oracle)
        .arg(container)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("run ds41_vision_ref.plan_image_grid: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    std::io::Write::write_all(&mut stdin, sizes.as_bytes()).map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "plan_image_grid failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let theirs: Vec<&str> = stdout.lines().collect();
    if theirs.len() != pngs.len() {
        return Err(format!("{} plans for {} images", theirs.len(), pngs.len()).into());
    }
    let mut failures = Vec::new();
    for ((png, ours), theirs) in pngs.iter().zip(&ours).zip(theirs) {
        if ours != theirs {
            failures.push(format!(
                "{} {}: plan (box h, w, tokens h, w) {theirs}, reference {ours}",
                name(container),
                name(png)
            ));
        }
    }
    Ok(failures)
}

fn name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}
