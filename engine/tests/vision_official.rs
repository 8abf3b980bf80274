//! Image spans in the language model (MODEL.md §6.1, §10.2) against the official model.py with
//! its vision.py and image_processor.py (goldens/official/vision_s7/, made by
//! goldens/regen/model/run_vision.py) on the synthetic `vision` preset: two own PNGs whose ViT
//! grids are not multiples of 3 (the aligner's zero padding), text around and between them.
//!
//! * preprocessing: the engine's patches equal the official ones bit for bit;
//! * the tower teacher-forced stage by stage (each stage from the golden's input);
//! * the language model teacher-forced (`ForwardJob` replay): bit-exact in every discrete
//!   decision and bf16 sublayer output, as for text;
//! * end to end within the `upstream` gates;
//! * the negative controls `gate-bias-for-image` and `engram-image-not-dead` are caught, the
//!   first diverging tensor named.

use std::path::PathBuf;

use ds41_engine::checkpoint::Layout;
use ds41_engine::model::{
    Defect, DefectSet, ForwardJob, ImageSource, Model, Numerics, Options, TokenMap,
};
use ds41_engine::trace::{TraceFile, TraceTensor};
use ds41_engine::vision::tower::VisionTower;
use ds41_engine::vision::TokenType;

const SET: &str = "vision_s7";
const SCHEDULE: &str = "p15_d06";
const PRESET: &str = "vision";
const SEED: u64 = 7;
/// The golden's images (goldens/vision/preprocess/images), in prompt order (run_vision.py SETS).
const IMAGES: &[&str] = &["rgb8_601x599_odd.png", "rgb8_100x37_upscale.png"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden() -> TraceFile {
    let path = repo()
        .join("goldens/official")
        .join(SET)
        .join(format!("{SCHEDULE}.safetensors"));
    TraceFile::read(&path).unwrap()
}

fn image_paths() -> Vec<PathBuf> {
    IMAGES
        .iter()
        .map(|n| repo().join("goldens/vision/preprocess/images").join(n))
        .collect()
}

fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ds41_synthetic::generate(PRESET, Layout::Release, SEED, dir.path()).unwrap();
    dir
}

/// The golden's prompt: its input ids with every span folded back to one marker, and the
/// prefill in those units.
fn prompt(g: &TraceFile) -> (Vec<u32>, usize) {
    let ids = g.input_ids().unwrap();
    let types = g.i64("token_types").unwrap().1;
    let prefill = g.prefill().unwrap().unwrap();
    let (mut out, mut given_prefill) = (Vec::new(), 0);
    for (p, (&t, &ty)) in ids.iter().zip(types).enumerate() {
        if ty == TokenType::Text.code() || ty == TokenType::ImageStart.code() {
            out.push(t);
            if p < prefill {
                given_prefill += 1;
            }
        }
    }
    (out, given_prefill)
}

/// Run the golden's schedule through `ForwardJob` (as `ds41 forward --image` does):
/// teacher-forced from the golden (`replay`) or end to end.
fn run(dir: &std::path::Path, numerics: Numerics, defects: DefectSet, replay: bool) -> TraceFile {
    let g = golden();
    let (tokens, prefill) = prompt(&g);
    let golden_path = repo()
        .join("goldens/official")
        .join(SET)
        .join(format!("{SCHEDULE}.safetensors"));
    let job = ForwardJob {
        model: dir.to_path_buf(),
        tokens: if replay { Vec::new() } else { tokens },
        prefill: if replay { None } else { Some(prefill) },
        options: Options {
            numerics,
            defects,
            ..Options::default()
        },
        token_map: TokenMap::FromCheckpoint,
        replay: replay.then_some(golden_path),
        load_state: None,
        save_state: None,
        sub_ops: true,
        images: image_paths().into_iter().map(ImageSource::File).collect(),
    };
    let out = job.run().unwrap();
    TraceFile::from_bytes(&out.trace.to_bytes().unwrap(), std::path::Path::new("trace")).unwrap()
}

/// (max |Δ|, rel L2, elements not bit-equal) of `b` against `a`.
fn distance(a: &TraceTensor, b: &TraceTensor) -> (f64, f64, usize) {
    let (a, b) = (a.as_f64(), b.as_f64());
    assert_eq!(a.len(), b.len());
    let (mut max, mut num, mut den, mut inexact) = (0f64, 0f64, 0f64, 0usize);
    for (x, y) in a.iter().zip(&b) {
        let d = (x - y).abs();
        max = max.max(d);
        num += d * d;
        den += x * x;
        inexact += usize::from(x.to_bits() != y.to_bits());
    }
    (max, (num / den.max(1e-300)).sqrt(), inexact)
}

fn tensor(t: &TraceFile, name: &str) -> TraceTensor {
    t.get(name)
        .unwrap_or_else(|| panic!("{}: no `{name}`", t.path.display()))
        .clone()
}

fn f32_rows(t: &TraceFile, name: &str) -> Vec<f32> {
    t.f32(name).unwrap().1.to_vec()
}

#[test]
fn preprocessing_equals_the_official_patches() {
    let g = golden();
    let dir = checkpoint();
    let model = Model::open(dir.path()).unwrap();
    let vision = model.config().vision.clone().unwrap();
    for (i, path) in image_paths().iter().enumerate() {
        let p = ds41_engine::vision::load_image(path, &vision).unwrap();
        let grid = g.i64(&format!("vision.I{i}.grid")).unwrap().1.to_vec();
        let (vh, vw) = p.vit_grid();
        assert_eq!(
            [vh, vw, p.plan.n_llm_h, p.plan.n_llm_w].map(|v| v as i64),
            grid[1..],
            "image {i} grid"
        );
        let ours: Vec<f32> = p.patches.iter().map(|v| v.to_f32()).collect();
        let theirs = f32_rows(&g, &format!("vision.I{i}.patches"));
        assert!(ours == theirs, "image {i}: patches differ");
    }
}

/// Each tower stage from the golden's own input: the patch embedding and the aligner are
/// bit-exact, the final norm too; the ViT blocks agree to bf16 rounding (torch sums its bf16
/// attention and GEMMs in another order; the engine's sums are canonical).
#[test]
fn tower_teacher_forced_stage_by_stage() {
    let g = golden();
    let dir = checkpoint();
    let model = Model::open(dir.path()).unwrap();
    let tower = VisionTower::from_checkpoint(model.checkpoint().as_ref(), Numerics::Upstream)
        .unwrap();
    for i in 0..IMAGES.len() {
        let p = format!("vision.I{i}");
        let grid = g.i64(&format!("{p}.grid")).unwrap().1.to_vec();
        let (vh, vw) = (grid[1] as usize, grid[2] as usize);
        let embed = tower.embed(&f32_rows(&g, &format!("{p}.patches")));
        let want_embed = f32_rows(&g, &format!("{p}.embed"));
        let (_, blocks) = g.f32(&format!("{p}.blocks")).unwrap();
        let per_block = vh * vw * tower.config.dim;
        let mut figures = Vec::new();
        let exact = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x != y).count();
        figures.push(format!("embed {} inexact", exact(&embed, &want_embed)));
        assert_eq!(exact(&embed, &want_embed), 0, "{p}.embed");
        let mut input = want_embed.clone();
        for b in 0..tower.blocks.len() {
            let ours = tower.block(b, &input, vh, vw);
            let want = &blocks[b * per_block..(b + 1) * per_block];
            let (max, rel, inexact) = distance(
                &TraceTensor::f32(vec![want.len()], want.to_vec()),
                &TraceTensor::f32(vec![ours.len()], ours.clone()),
            );
            figures.push(format!(
                "block {b} rel L2 {rel:.2e} max {max:.2e} ({inexact}/{} inexact)",
                want.len()
            ));
            assert!(rel < 1e-2, "{p} block {b}: rel L2 {rel}");
            input = want.to_vec();
        }
        let vit = tower.final_norm(&input);
        assert_eq!(exact(&vit, &f32_rows(&g, &format!("{p}.vit"))), 0, "{p}.vit");
        let aligner = tower.align(&f32_rows(&g, &format!("{p}.vit")), vh, vw);
        let want = f32_rows(&g, &format!("{p}.aligner"));
        figures.push(format!("aligner {} inexact", exact(&aligner, &want)));
        assert_eq!(exact(&aligner, &want), 0, "{p}.aligner");
        eprintln!("{p}: {}", figures.join("; "));
    }
}

/// Tensors bit-exact in replay: the decisions and every bf16 tensor that does not pass
/// through an mHC expand (as for text, engine/tests/dspark_official.rs).
const REPLAY_EXACT: &[&str] = &[
    "input_ids",
    "token_types",
    "engram_hash",
    "experts",
    "attn_out",
    "moe_out",
];

/// Streams out of an mHC expand: one bf16 ulp in a few elements where the f32 mix
/// projection's summation order moves a rounding (MKL's order against the canonical f64).
const REPLAY_EXPAND: &[&str] = &["residual", "mid", "block_input"];

#[test]
fn replay_is_bit_exact_on_the_text_path() {
    let g = golden();
    let dir = checkpoint();
    let t = run(dir.path(), Numerics::Upstream, DefectSet::none(), true);
    for name in REPLAY_EXACT {
        let (_, _, inexact) = distance(&tensor(&g, name), &tensor(&t, name));
        eprintln!("{name}: {inexact} of {} inexact", tensor(&g, name).len());
        assert_eq!(inexact, 0, "{name} is not bit-exact in replay");
    }
    for name in REPLAY_EXPAND {
        let (max, rel, inexact) = distance(&tensor(&g, name), &tensor(&t, name));
        eprintln!(
            "{name}: {inexact} of {} inexact, rel L2 {rel:.2e}, max {max:.2e}",
            tensor(&g, name).len()
        );
        assert!(rel < 1e-3, "{name}: rel L2 {rel}");
    }
    let (max, rel, _) = distance(&tensor(&g, "logits"), &tensor(&t, "logits"));
    eprintln!("logits: rel L2 {rel:.2e}, max {max:.2e}");
    assert!(max < 1e-3, "logits max |Δ| {max}");
}

/// End to end: the `upstream` profile's relative limits (gates/upstream.yaml: streams 0.06,
/// logits 0.05), the span layout exact.
#[test]
fn end_to_end_within_the_upstream_gates() {
    let g = golden();
    let dir = checkpoint();
    let t = run(dir.path(), Numerics::Upstream, DefectSet::none(), false);
    for name in ["input_ids", "token_types"] {
        assert_eq!(tensor(&g, name), tensor(&t, name), "{name}");
    }
    for (name, limit) in [
        ("vision.I0.vit", 0.02),
        ("vision.I0.aligner", 0.02),
        ("vision.I1.vit", 0.02),
        ("vision.I1.aligner", 0.02),
        ("residual", 0.06),
        ("logits", 0.05),
    ] {
        let (max, rel, inexact) = distance(&tensor(&g, name), &tensor(&t, name));
        eprintln!("{name}: rel L2 {rel:.2e}, max {max:.2e}, {inexact} inexact");
        assert!(rel < limit, "{name}: rel L2 {rel} over {limit}");
    }
}

/// The first tensor, in the order a forward computes them, where a replay departs from the
/// golden beyond its replay limit, and the first token there.
fn first_divergence(g: &TraceFile, t: &TraceFile) -> Option<(String, usize)> {
    let order = [
        "token_types",
        "engram_hash",
        "block_input",
        "attn_out",
        "experts",
        "moe_out",
        "residual",
        "logits",
    ];
    for name in order {
        let (a, b) = (tensor(g, name), tensor(t, name));
        let row = a.row_len();
        let (a, b) = (a.as_f64(), b.as_f64());
        let tolerance = if REPLAY_EXPAND.contains(&name) {
            1e-2
        } else {
            0.0
        };
        let bad = a.iter().zip(&b).position(|(x, y)| {
            (x - y).abs() > tolerance * x.abs().max(1.0) || (tolerance == 0.0 && x != y)
        });
        if let Some(i) = bad {
            return Some((name.to_string(), i / row));
        }
    }
    None
}

/// Each vision negative control, replayed against the golden, departs first at the tensor
/// it breaks, at the first image position.
#[test]
fn negative_controls_are_caught_at_the_tensor_they_break() {
    let g = golden();
    let dir = checkpoint();
    let first_image = g.i64("vision.I0.grid").unwrap().1[0] as usize;
    assert_eq!(first_divergence(&g, &run(dir.path(), Numerics::Upstream, DefectSet::none(), true)), None);
    for (defect, tensor_name) in [
        (Defect::GateBiasForImage, "experts"),
        (Defect::EngramImageNotDead, "engram_hash"),
    ] {
        let t = run(dir.path(), Numerics::Upstream, DefectSet::new([defect]), true);
        let got = first_divergence(&g, &t);
        eprintln!("{defect}: first divergence {got:?}");
        assert_eq!(
            got,
            Some((tensor_name.to_string(), first_image)),
            "{defect}"
        );
    }
}

/// The exact profile has no f32 oracle: its image path is checked for determinism and for
/// the controls changing what they act on.
#[test]
fn exact_profile_is_deterministic_and_sees_the_controls() {
    let dir = checkpoint();
    let a = run(dir.path(), Numerics::Exact, DefectSet::none(), false);
    let b = run(dir.path(), Numerics::Exact, DefectSet::none(), false);
    assert_eq!(a.tensors, b.tensors);
    let first_image = a.i64("vision.I0.grid").unwrap().1[0] as usize;
    for (defect, name) in [
        (Defect::GateBiasForImage, "experts"),
        (Defect::EngramImageNotDead, "engram_hash"),
    ] {
        let t = run(dir.path(), Numerics::Exact, DefectSet::new([defect]), false);
        let got = first_divergence(&a, &t);
        assert_eq!(got, Some((name.to_string(), first_image)), "{defect}");
    }
}

fn job(dir: &std::path::Path, tokens: Vec<u32>, prefill: Option<usize>, images: Vec<PathBuf>) -> ForwardJob {
    ForwardJob {
        model: dir.to_path_buf(),
        tokens,
        prefill,
        options: Options::default(),
        token_map: TokenMap::FromCheckpoint,
        replay: None,
        load_state: None,
        save_state: None,
        sub_ops: false,
        images: images.into_iter().map(ImageSource::File).collect(),
    }
}

#[test]
fn image_requests_the_engine_will_not_run_are_refused_by_name() {
    let dir = checkpoint();
    let marker = ds41_synthetic::preset::VISION_IMAGE_TOKEN;
    let img = image_paths()[1].clone();
    let refused = |j: ForwardJob, want: &str| {
        let e = j.run().expect_err(want).to_string();
        assert!(e.contains(want), "`{e}` does not say `{want}`");
    };
    // More images than markers, and the other way round.
    refused(job(dir.path(), vec![5, 6], None, vec![img.clone()]), "0 image marker(s)");
    refused(job(dir.path(), vec![5, marker, marker], None, vec![img.clone()]), "2 image marker(s)");
    // A marker after the prefill: spans lie in the first chunk.
    refused(
        job(dir.path(), vec![5, 6, marker], Some(2), vec![img.clone()]),
        "must lie in the first chunk",
    );
    // An unreadable image is named.
    let missing = dir.path().join("no-such.png");
    refused(job(dir.path(), vec![5, marker], None, vec![missing]), "no-such.png");
    let not_png = dir.path().join("config.json");
    refused(job(dir.path(), vec![5, marker], None, vec![not_png]), "config.json");
    // A model without a vision tower.
    let text = tempfile::tempdir().unwrap();
    ds41_synthetic::generate("tiny", Layout::Release, 1, text.path()).unwrap();
    refused(job(text.path(), vec![5, 6], None, vec![img]), "no vision tower");
}

#[test]
fn sessions_refuse_image_spans_after_position_zero() {
    let dir = checkpoint();
    let model = Model::open(dir.path()).unwrap();
    let marker = ds41_synthetic::preset::VISION_IMAGE_TOKEN;
    let vision = model.config().vision.clone().unwrap();
    let patches = ds41_engine::vision::load_image(&image_paths()[1], &vision).unwrap();
    let (tokens, images) =
        ds41_engine::vision::expand_markers(&[marker], marker, vec![patches]).unwrap();
    let mut s = ds41_engine::model::Session::new(&model, Options::default());
    let mut obs = ds41_engine::model::session::Unobserved;
    s.prefill(&[5, 6], &mut obs).unwrap();
    let e = s
        .prefill_with_images(&tokens, &images, &mut obs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("first prefill chunk"), "{e}");
}
