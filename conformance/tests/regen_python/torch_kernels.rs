//! The regen drivers' torch kernels (goldens/regen/model/ds41_kernels.py, which stand in for the
//! six CUDA kernels when the official model.py makes goldens) against this engine's upstream
//! profile, bit for bit, on the same inputs:
//!
//! * `act_quant` ↔ [`act_quant_fp8`] (codes and scales); `fp4_act_quant` E8M0/32 and E4M3/16
//!   ↔ [`fp4_qdq_e8m0`] / [`fp4_qdq_e4m3`] — blocks of zeros, of values under the floors, and
//!   random bf16 values over 40 binades (so rounding ties occur);
//! * `fp8_gemm` / `fp4_gemm` ↔ [`Linear::forward`] on real FP8 and packed-FP4 weights of
//!   `official_a` (E8M0 scales, 32×32 and per-row blocks);
//! * `sparse_attn` ↔ [`sparse_attention`] (three 64-entry blocks, −1 placeholders, an empty
//!   list, a dominant sink);
//! * `hc_split_sinkhorn` ↔ [`HcSite::split_sinkhorn`] with official_a's `hc_attn` scale/base;
//! * `stable_topk` (run_official.py's replacement of `torch.topk`) ↔ [`topk`] on rows full of
//!   ties, ±0 and ±∞.
//!
//! Needs `DS41_PYTHON` (a Python with goldens/regen/requirements.txt) and `DS41_UPSTREAM`
//! (regen_python.rs reports the trial as ignored, with the reason, when either is unset).
//! Panics (a failed trial) naming every kernel whose bits differ.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use ds41_engine::checkpoint::{self, Checkpoint};
use ds41_engine::model::hyper_connection::HcSite;
use ds41_engine::model::linear::{Linear, LinearKind};
use ds41_engine::model::quant::{act_quant_fp8, bf16, fp4_qdq_e4m3, fp4_qdq_e8m0};
use ds41_engine::model::sparse_attention::sparse_attention;
use ds41_engine::model::topk::topk;
use ds41_engine::model::Numerics;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

/// Weights of official_a the GEMM probe multiplies by: FP8 with 32×32 scale blocks (K = 128
/// and 64, N not a multiple of 32·blocks), packed FP4 experts (K = 128 and 64).
const WEIGHTS: [(&str, LinearKind); 6] = [
    ("layers.2.attn.wq_a.weight", LinearKind::Fp8),
    ("layers.2.attn.wq_b.weight", LinearKind::Fp8),
    ("layers.2.attn.wo_b.weight", LinearKind::Fp8),
    ("layers.2.engram.wkv.weight", LinearKind::Fp8),
    ("layers.2.ffn.experts.1.w1.weight", LinearKind::Fp4),
    ("layers.2.ffn.experts.3.w2.weight", LinearKind::Fp4),
];

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// A bf16-exact value `signed · 2^e`.
    fn bf16_scaled(&mut self, e: i32) -> f32 {
        bf16(self.signed() * 2f32.powi(e))
    }
}

struct Tensors(Vec<(String, Dtype, Vec<usize>, Vec<u8>)>);
impl Tensors {
    fn f32(&mut self, name: &str, shape: &[usize], v: &[f32]) {
        assert_eq!(shape.iter().product::<usize>(), v.len(), "{name}");
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.0
            .push((name.into(), Dtype::F32, shape.to_vec(), bytes));
    }
    fn i64(&mut self, name: &str, shape: &[usize], v: &[i64]) {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.0
            .push((name.into(), Dtype::I64, shape.to_vec(), bytes));
    }
    fn write(&self, path: &Path) {
        let views: Vec<(String, TensorView)> = self
            .0
            .iter()
            .map(|(n, dt, shape, data)| {
                (
                    n.clone(),
                    TensorView::new(*dt, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    }
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("probe output `{name}`: {e}"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Count (and show the first few of) the elements whose bits differ.
fn bit_mismatches(what: &str, torch: &[f32], engine: &[f32], failures: &mut Vec<String>) {
    assert_eq!(torch.len(), engine.len(), "{what}: lengths");
    let bad: Vec<usize> = (0..torch.len())
        .filter(|&i| torch[i].to_bits() != engine[i].to_bits())
        .collect();
    eprintln!("{what}: {} values, {} differ", torch.len(), bad.len());
    if let Some(&i) = bad.first() {
        failures.push(format!(
            "{what}: {} of {} values differ; first at {i}: torch {:e} engine {:e}",
            bad.len(),
            torch.len(),
            torch[i],
            engine[i]
        ));
    }
}

pub fn torch_kernels_equal_the_engine_bit_for_bit(python: &Path, upstream: &Path) {
    let ckpt_dir = upstream.join("official_a/checkpoint");
    let ckpt: Arc<dyn Checkpoint> = Arc::from(checkpoint::open(&ckpt_dir).unwrap());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut input = Tensors(Vec::new());

    // Quantisation rows: zeros, values under every floor, then one binade per 32-block.
    let (rows, cols) = (6, 128);
    let mut x = vec![0f32; rows * cols];
    for (i, v) in x.iter_mut().enumerate() {
        let (r, c) = (i / cols, i % cols);
        *v = match r {
            0 => 0.0,
            1 => rng.bf16_scaled(-24),
            _ => rng.bf16_scaled(((r * 4 + c / 32) as i32 * 7) % 41 - 20),
        };
    }
    x[2 * cols + 5] = -0.0;
    input.f32("x", &[rows, cols], &x);

    // GEMM activations (the probe uses the first K columns for a weight of width K).
    let gemm_rows = 3;
    let gx: Vec<f32> = (0..gemm_rows * 128)
        .map(|i| rng.bf16_scaled((i % 7) as i32 - 3))
        .collect();
    input.f32("gemm.x", &[gemm_rows, 128], &gx);

    // Sparse attention: 5 query rows over 150 keys, index lists of 140 entries (3 blocks).
    let (s, h, d, n, t) = (5usize, 4usize, 32usize, 150usize, 140usize);
    let q: Vec<f32> = (0..s * h * d).map(|_| rng.bf16_scaled(0)).collect();
    let kv: Vec<f32> = (0..n * d).map(|_| rng.bf16_scaled(1)).collect();
    let sink = vec![0.5f32, -2.0, 0.0, 3.0];
    let mut idx = vec![-1i64; s * t];
    for row in 0..s {
        for j in 0..t {
            idx[row * t + j] = match row {
                3 => -1,                                 // nothing valid
                _ if rng.next().is_multiple_of(5) => -1, // placeholders
                _ => (rng.next() % n as u64) as i64,
            };
        }
    }
    let scale = 0.125f32 * 3.0;
    input.f32("attn.q", &[s, h, d], &q);
    input.f32("attn.kv", &[n, d], &kv);
    input.f32("attn.sink", &[h], &sink);
    input.i64("attn.idx", &[s, t], &idx);
    input.f32("attn.scale", &[1], &[scale]);

    // Hyper-connection split and Sinkhorn with official_a's layer-0 attention site.
    let (hc, iters, eps) = (4usize, 20usize, 1e-6f32);
    let n_mix = (2 + hc) * hc;
    let site = HcSite::load(&ckpt, "layers.0.", "attn", hc, eps, 1e-20).unwrap();
    let mix_rows = 8;
    let mixes: Vec<f32> = (0..mix_rows * n_mix)
        .map(|i| rng.signed() * 2f32.powi((i % 5) as i32 - 1))
        .collect();
    input.f32("hc.mixes", &[mix_rows, n_mix], &mixes);
    input.f32(
        "hc.scale",
        &[3],
        &ckpt.tensor_f32("layers.0.hc_attn_scale").unwrap(),
    );
    input.f32(
        "hc.base",
        &[n_mix],
        &ckpt.tensor_f32("layers.0.hc_attn_base").unwrap(),
    );
    input.f32("hc.hc", &[1], &[hc as f32]);
    input.f32("hc.eps", &[1], &[eps]);
    input.f32("hc.iters", &[1], &[iters as f32]);

    // Top-k rows drawn from a handful of levels, so most decisions are ties.
    let (topk_rows, topk_n, topk_k) = (16usize, 40usize, 12usize);
    let levels = [
        0.5f32,
        -0.0,
        0.0,
        1.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.5,
        -1.0,
    ];
    let topk_values: Vec<f32> = (0..topk_rows * topk_n)
        .map(|_| levels[(rng.next() % levels.len() as u64) as usize])
        .collect();
    input.f32("topk.values", &[topk_rows, topk_n], &topk_values);
    input.f32("topk.k", &[1], &[topk_k as f32]);

    let dir = tempfile::tempdir().unwrap();
    let (in_path, out_path) = (
        dir.path().join("in.safetensors"),
        dir.path().join("out.safetensors"),
    );
    input.write(&in_path);
    let names: Vec<&str> = WEIGHTS.iter().map(|(n, _)| *n).collect();
    let probe =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/regen/model/kernel_probe.py");
    let run = Command::new(python)
        .arg("-B")
        .arg(&probe)
        .arg("--inputs")
        .arg(&in_path)
        .arg("--out")
        .arg(&out_path)
        .arg("--checkpoint")
        .arg(&ckpt_dir)
        .arg("--weights")
        .arg(names.join(","))
        .output()
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    assert!(
        run.status.success(),
        "kernel_probe.py failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(&out_path).unwrap();
    let out = SafeTensors::deserialize(&bytes).unwrap();
    let mut failures = Vec::new();

    // act_quant: codes and scales.
    let (codes, scales) = act_quant_fp8(&x);
    let torch_codes = out.tensor("act_quant.codes").unwrap();
    assert_eq!(torch_codes.dtype(), Dtype::U8);
    let differing = codes
        .iter()
        .zip(torch_codes.data())
        .filter(|(a, b)| a != b)
        .count();
    eprintln!(
        "act_quant codes: {} values, {differing} differ",
        codes.len()
    );
    if differing > 0 {
        failures.push(format!(
            "act_quant codes: {differing} of {} differ",
            codes.len()
        ));
    }
    bit_mismatches(
        "act_quant scales",
        &f32s(&out, "act_quant.scales"),
        &scales,
        &mut failures,
    );
    let mut e8m0 = x.clone();
    fp4_qdq_e8m0(&mut e8m0);
    bit_mismatches(
        "fp4_act_quant e8m0/32",
        &f32s(&out, "fp4_e8m0"),
        &e8m0,
        &mut failures,
    );
    let mut e4m3 = x.clone();
    fp4_qdq_e4m3(&mut e4m3);
    bit_mismatches(
        "fp4_act_quant e4m3/16",
        &f32s(&out, "fp4_e4m3"),
        &e4m3,
        &mut failures,
    );

    // GEMMs on official_a's weights.
    for (name, kind) in WEIGHTS {
        let lin = Linear::load(&ckpt, name, kind).unwrap();
        let k = lin.in_features();
        let xk: Vec<f32> = gx.chunks_exact(128).flat_map(|r| r[..k].to_vec()).collect();
        let mut y = vec![0f32; gemm_rows * lin.out_features()];
        lin.forward(&xk, gemm_rows, &mut y, Numerics::Upstream)
            .unwrap();
        bit_mismatches(
            &format!("{kind:?} gemm {name}"),
            &f32s(&out, &format!("gemm.{name}")),
            &y,
            &mut failures,
        );
    }

    // Sparse attention, one query row at a time.
    let mut attn = vec![0f32; s * h * d];
    for row in 0..s {
        sparse_attention(
            &q[row * h * d..(row + 1) * h * d],
            &kv,
            &sink,
            &idx[row * t..(row + 1) * t],
            scale,
            Numerics::Upstream,
            &mut attn[row * h * d..(row + 1) * h * d],
        )
        .unwrap();
    }
    bit_mismatches("sparse_attn", &f32s(&out, "attn.out"), &attn, &mut failures);
    assert!(
        attn.iter().any(|&v| v != 0.0),
        "sparse attention probe is all zeros: not a test"
    );

    // Hyper-connection coefficients.
    let (mut pre, mut post, mut comb) = (Vec::new(), Vec::new(), Vec::new());
    for m in mixes.chunks_exact(n_mix) {
        let mix = site.split_sinkhorn(m, iters);
        pre.extend(mix.pre);
        post.extend(mix.post);
        comb.extend(mix.comb);
    }
    bit_mismatches(
        "hc_split_sinkhorn pre",
        &f32s(&out, "hc.pre"),
        &pre,
        &mut failures,
    );
    bit_mismatches(
        "hc_split_sinkhorn post",
        &f32s(&out, "hc.post"),
        &post,
        &mut failures,
    );
    bit_mismatches(
        "hc_split_sinkhorn comb",
        &f32s(&out, "hc.comb"),
        &comb,
        &mut failures,
    );

    // The tie rule.
    let torch_topk = out.tensor("topk.indices").unwrap();
    assert_eq!(torch_topk.dtype(), Dtype::I64);
    let torch_idx: Vec<i64> = torch_topk
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let engine_idx: Vec<i64> = topk_values
        .chunks_exact(topk_n)
        .flat_map(|row| topk(row, topk_k, false, "probe").unwrap())
        .map(|i| i as i64)
        .collect();
    let differing = (0..engine_idx.len())
        .filter(|&i| torch_idx[i] != engine_idx[i])
        .count();
    eprintln!(
        "stable_topk: {} indices, {differing} differ",
        engine_idx.len()
    );
    if differing > 0 {
        failures.push(format!(
            "stable_topk: {differing} of {} indices differ",
            engine_idx.len()
        ));
    }

    assert!(
        failures.is_empty(),
        "torch kernels and the engine disagree:\n{}\n(torch's CPU kernels depend on the machine: \
         goldens/README.md, 'CPU dependence')",
        failures.join("\n")
    );
}
