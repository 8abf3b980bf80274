//! `ds41 bench`: throughput of the reference engine (issue 4 item 6).
//!
//! * `--model DIR`: prefill tokens/s (one chunk of `--prefill` tokens at position 0), decode
//!   tokens/s (`--tokens` single-token steps after it) and peak RSS (`VmHWM`), for a
//!   checkpoint such as the synthetic `wide` preset (`ds41 synth --preset wide`).
//! * `--kernels`: the canonical linear kernels (MODEL.md §5.4 C1/C2) at release width
//!   (5120 × 5120), on an in-memory FP8 weight (e4m3 codes + 32x32 E8M0 scales, read through
//!   `weight_view` as from a mapped checkpoint), with 1 row (decode) and `--rows` rows
//!   (prefill). Needs no checkpoint.
//!
//! Numbers are wall-clock on this machine with the current rayon pool (`RAYON_NUM_THREADS`),
//! plus the CPU time of all threads (on a shared machine the wall clock includes waiting).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use ds41_engine::checkpoint::{
    Checkpoint, DenseDtype, Layout, QuantKind, QuantView, Storage, WeightView,
};
use ds41_engine::config::{Config, EngramHashConstants};
use ds41_engine::model::{IndexK, Linear, LinearKind, Model, Numerics, Options, Session};
use ds41_engine::trace::Trace;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (release layout or WASTE container).
    #[arg(long, required_unless_present = "kernels")]
    pub model: Option<PathBuf>,
    /// Decode steps to time after the prefill.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Tokens prefilled as one chunk at position 0.
    #[arg(long, default_value_t = 32)]
    pub prefill: usize,
    /// Numerics profile: upstream or exact.
    #[arg(long, default_value = "upstream")]
    pub numerics: String,
    /// Index-key hand-off: as-shipped or owner.
    #[arg(long = "index-k", default_value = "as-shipped")]
    pub index_k: String,
    /// Benchmark the linear kernels at release width instead of a model.
    #[arg(long)]
    pub kernels: bool,
    /// Rows of the prefill-shaped kernel call (`--kernels`).
    #[arg(long, default_value_t = 32)]
    pub rows: usize,
    /// Repetitions per kernel measurement (`--kernels`; the best is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let numerics: Numerics = args
        .numerics
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    if args.kernels {
        return kernels(&args, numerics);
    }
    let index_k: IndexK = args
        .index_k
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let dir = args.model.as_ref().context("--model is required")?;
    if args.prefill == 0 {
        bail!("--prefill must be at least 1");
    }
    let t0 = Instant::now();
    let model = Model::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let open_s = t0.elapsed().as_secs_f64();
    let cfg = model.config();
    let options = Options {
        numerics,
        index_k,
        ..Options::default()
    };
    let ids: Vec<u32> = (0..(args.prefill + args.tokens) as u64)
        .map(|i| ((i * 2654435761 + 17) % cfg.vocab_size as u64) as u32)
        .collect();
    let mut session = Session::new(&model, options);
    let mut trace = Trace::disabled();
    let (t, c) = (Instant::now(), cpu_seconds());
    session.prefill(&ids[..args.prefill], &mut trace)?;
    let (prefill_s, prefill_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
    let (t, c) = (Instant::now(), cpu_seconds());
    for &id in &ids[args.prefill..] {
        session.decode(id, &mut trace)?;
    }
    let (decode_s, decode_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
    println!(
        "model      {} ({:?}, dim {}, {} layers)",
        dir.display(),
        model.layout(),
        cfg.dim,
        cfg.n_layers
    );
    println!(
        "numerics   {numerics}, index-k {index_k}, threads {}",
        rayon::current_num_threads()
    );
    println!("open       {:.3} s", open_s);
    println!(
        "prefill    {} tokens in {:.3} s = {:.2} tokens/s (cpu {:.3} s)",
        args.prefill,
        prefill_s,
        args.prefill as f64 / prefill_s,
        prefill_cpu
    );
    if args.tokens > 0 {
        println!(
            "decode     {} steps in {:.3} s = {:.2} tokens/s ({:.1} ms/token, cpu {:.1} ms/token)",
            args.tokens,
            decode_s,
            args.tokens as f64 / decode_s,
            decode_s * 1e3 / args.tokens as f64,
            decode_cpu * 1e3 / args.tokens as f64
        );
    }
    println!("peak RSS   {}", peak_rss());
    Ok(0)
}

/// `VmHWM` of this process (Linux), e.g. "123.4 MiB".
fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or("unavailable (no /proc/self/status)".into(), |kib| {
            format!("{:.1} MiB", kib / 1024.0)
        })
}

/// CPU time of every thread of this process so far (Linux `/proc/self/task/*/schedstat`;
/// 0 elsewhere): on a shared machine it shows the work a call did, whatever the wall clock.
fn cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

/// Time the linear kernels at release width on an in-memory FP8 weight.
fn kernels(args: &Args, numerics: Numerics) -> anyhow::Result<i32> {
    const D: usize = 5120;
    let ckpt: Arc<dyn Checkpoint> = Arc::new(MemWeights::fp8_random(D, D)?);
    let x: Vec<f32> = (0..args.rows.max(1) * D)
        .map(|i| (((i * 7919) % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    println!(
        "linear kernels, weight {D} x {D}, numerics {numerics}, threads {}",
        rayon::current_num_threads()
    );
    let kinds = [
        ("FP8 (C1 in upstream)", "w", LinearKind::Fp8),
        ("BF16 (C2)", "w", LinearKind::Bf16),
        ("F32 (C2)", "w32", LinearKind::F32),
    ];
    for (label, name, kind) in kinds {
        let lin = Linear::load(&ckpt, name, kind)?;
        for rows in [1, args.rows.max(1)] {
            let mut y = vec![0f32; rows * D];
            let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..args.reps.max(1) {
                let (t, c) = (Instant::now(), cpu_seconds());
                lin.forward(&x[..rows * D], rows, &mut y, numerics)?;
                best = best.min(t.elapsed().as_secs_f64());
                best_cpu = best_cpu.min(cpu_seconds() - c);
            }
            println!(
                "  {label:<22} rows {rows:>4}: {:>9.2} ms/call  {:>6.2} GMAC/s  (cpu {:>8.2} ms/call)",
                best * 1e3,
                (rows * D * D) as f64 / best / 1e9,
                best_cpu * 1e3
            );
        }
    }
    println!("peak RSS   {}", peak_rss());
    Ok(0)
}

/// One in-memory weight stored as FP8 codes with 32x32 E8M0 block scales, served as `w`
/// (stored FP8: the FP8 and BF16 kinds accept it, C1 applies) and as `w32` (its exact values
/// stored F32). Both are read by the kernels through `weight_view`, like a mapped checkpoint.
struct MemWeights {
    shape: Vec<usize>,
    codes: Vec<u8>,
    scales: Vec<u8>,
    values: Vec<f32>,
    f32_bytes: Vec<u8>,
    cfg: Config,
}

impl MemWeights {
    fn fp8_random(out: usize, inp: usize) -> anyhow::Result<MemWeights> {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let codes: Vec<u8> = (0..out * inp)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let code = (s % 256) as u8;
                if code & 0x7F == 0x7F {
                    0
                } else {
                    code
                }
            })
            .collect();
        let (bo, bi) = (out.div_ceil(32), inp.div_ceil(32));
        // 2^-10 .. 2^-12 by block, like trained weights.
        let scales: Vec<u8> = (0..bo * bi).map(|b| 117 - (b % 3) as u8).collect();
        let values: Vec<f32> = (0..out * inp)
            .map(|i| {
                let (n, k) = (i / inp, i % inp);
                ds41_engine::dtype::e4m3_to_f32(codes[i])
                    * ds41_engine::dtype::e8m0_to_f32(scales[(n / 32) * bi + k / 32])
            })
            .collect();
        let f32_bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(MemWeights {
            shape: vec![out, inp],
            codes,
            scales,
            values,
            f32_bytes,
            cfg: bench_config()?,
        })
    }
}

/// The `wide` preset's config (release widths); the kernel bench reads none of it, but a
/// checkpoint must have one.
fn bench_config() -> anyhow::Result<Config> {
    let p = ds41_synthetic::Preset::by_name("wide").context("the `wide` preset is missing")?;
    let v = ds41_synthetic::release::inference_config(&p.geometry, p.geometry.vocab_size);
    Ok(Config::from_inference_value(&v)?)
}

impl Checkpoint for MemWeights {
    fn layout(&self) -> Layout {
        Layout::Release
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn contains(&self, name: &str) -> bool {
        name == "w" || name == "w32"
    }
    fn names(&self) -> Vec<String> {
        vec!["w".into(), "w32".into()]
    }
    fn shape(&self, _: &str) -> ds41_engine::Result<Vec<usize>> {
        Ok(self.shape.clone())
    }
    fn storage(&self, name: &str) -> ds41_engine::Result<Storage> {
        Ok(if name == "w32" {
            Storage::F32
        } else {
            Storage::Fp8Block
        })
    }
    fn tensor_f32(&self, _: &str) -> ds41_engine::Result<Vec<f32>> {
        Ok(self.values.clone())
    }
    fn rows_f32(&self, _: &str, first: usize, out: &mut [f32]) -> ds41_engine::Result<()> {
        let start = first * self.shape[1];
        out.copy_from_slice(&self.values[start..start + out.len()]);
        Ok(())
    }
    fn quant_view(&self, name: &str) -> ds41_engine::Result<Option<QuantView<'_>>> {
        Ok((name == "w").then(|| QuantView {
            kind: QuantKind::Fp8Block,
            rows: self.shape[0],
            cols: self.shape[1],
            codes: &self.codes,
            scales: &self.scales,
            scale_cols: self.shape[1].div_ceil(32),
        }))
    }
    fn weight_view(&self, name: &str) -> ds41_engine::Result<Option<WeightView<'_>>> {
        if name == "w32" {
            return Ok(Some(WeightView::Dense {
                dtype: DenseDtype::F32,
                rows: self.shape[0],
                cols: self.shape[1],
                bytes: &self.f32_bytes,
            }));
        }
        Ok(self.quant_view(name)?.map(WeightView::Quant))
    }
    fn engram_constants(&self) -> ds41_engine::Result<EngramHashConstants> {
        Err(ds41_engine::Error::Model(
            "the kernel bench has no Engram".into(),
        ))
    }
    fn engram_token_map(&self) -> ds41_engine::Result<Option<Vec<i32>>> {
        Ok(None)
    }
}
