//! `ds41 bench`: throughput of the reference engine against what the machine allows.
//!
//! * `--model DIR`: prefill tokens/s (one chunk of `--prefill` tokens at position 0), decode
//!   tokens/s (`--tokens` single-token steps after it) and peak RSS (`VmHWM`), for a
//!   checkpoint such as the synthetic `wide` preset (`ds41 synth --preset wide`). Next to
//!   them, the floors: the bytes one decode token reads (`footprint`) over the read
//!   bandwidth measured in the same run, and the multiply-adds one prefill token needs over
//!   the measured multiply-add rate (`machine`); `--json` prints all of it as one object.
//! * `--kernels`: the canonical linear kernels (MODEL.md §5.4 C1/C2) at release width
//!   (5120 × 5120, or `--width`), on an in-memory FP8 weight (e4m3 codes + 32x32 E8M0
//!   scales, read through `weight_view` as from a mapped checkpoint), with 1 row (decode) and
//!   `--rows` rows (prefill). Needs no checkpoint. A small width (e.g. 128) times many calls
//!   per repetition and shows a small model's per-call costs.
//!
//! Numbers are wall-clock on this machine with the current rayon pool (`RAYON_NUM_THREADS`),
//! plus the CPU time of all threads (on a shared machine the wall clock includes waiting).

mod machine;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use ds41_conformance::footprint::{self, WeightBytes};
use ds41_engine::checkpoint::{
    Checkpoint, DenseDtype, Layout, QuantKind, QuantView, Storage, WeightView,
};
use ds41_engine::config::{Config, EngramHashConstants};
use ds41_engine::model::{IndexK, Linear, LinearKind, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceOptions};

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
    /// Square weight width of the kernel measurement (`--kernels`): 5120 is the release
    /// width, a small one (e.g. 128) shows a small model's per-call costs.
    #[arg(long, default_value_t = 5120)]
    pub width: usize,
    /// Repetitions per kernel measurement (`--kernels`; the best is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Print the model measurement as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
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
    let mut session = Session::new(&model, options.clone());
    // Expert ids are recorded so the footprint counts the experts these tokens were routed
    // to; the copies a trace makes are negligible next to the weights a step reads.
    let mut trace = Trace::new(
        cfg,
        TraceOptions {
            enabled: true,
            sub_ops: false,
        },
    );
    let (t, c) = (Instant::now(), cpu_seconds());
    session.prefill(&ids[..args.prefill], &mut trace)?;
    let (prefill_s, prefill_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
    // The same prefill again in a fresh session: the first one also paid for mapping the
    // checkpoint's pages into the process (page faults, a one-off per process), which a
    // decode step after it no longer pays; the ratio of the two per-token costs is taken warm.
    let (t, c) = (Instant::now(), cpu_seconds());
    Session::new(&model, options).prefill(&ids[..args.prefill], &mut Trace::disabled())?;
    let (warm_s, warm_cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
    // Sampled between steps (a /proc read, outside the timed work it would disturb little
    // but is kept out anyway): the peak of the process's own memory, weights excluded.
    let mut private_mib = private_rss_mib();
    let mut decode_s = 0.0;
    let mut decode_cpu = 0.0;
    for &id in &ids[args.prefill..] {
        let (t, c) = (Instant::now(), cpu_seconds());
        session.decode(id, &mut trace)?;
        decode_s += t.elapsed().as_secs_f64();
        decode_cpu += cpu_seconds() - c;
        private_mib = match (private_mib, private_rss_mib()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let (k, layers) = (cfg.n_activated_experts, cfg.n_layers);
    let decoded: Vec<i64> = trace.experts[args.prefill * layers * k..]
        .iter()
        .map(|&e| i64::from(e))
        .collect();
    let routed = footprint::routed_sets(&decoded, layers, k);
    let fp = footprint::footprint(&WeightBytes::of(model.checkpoint().as_ref())?, &routed);
    // Before the machine measurement, whose buffer would dominate it.
    let peak_rss_mib = peak_rss_mib();
    let checkpoint_bytes = directory_bytes(dir);
    let bandwidth = machine::read_bandwidth();
    let mac_rate = machine::multiply_add_rate(machine::Float::F64);
    let mac_rate_f32 = machine::multiply_add_rate(machine::Float::F32);
    let m = Measurement {
        model: dir.display().to_string(),
        layout: format!("{:?}", model.layout()).to_lowercase(),
        dim: cfg.dim,
        layers: cfg.n_layers,
        numerics: numerics.to_string(),
        index_k: index_k.to_string(),
        threads: rayon::current_num_threads(),
        simd: ds41_engine::model::simd::level().name().to_string(),
        open_s,
        prefill_tokens: args.prefill,
        prefill_s,
        prefill_cpu_s: prefill_cpu,
        prefill_cpu_ms_per_token: prefill_cpu * 1e3 / args.prefill as f64,
        prefill_floor_ms_per_token: fp.multiply_adds as f64 / mac_rate * 1e3,
        prefill_ceiling: ceiling(numerics, fp.multiply_adds, mac_rate, mac_rate_f32),
        multiply_adds_per_token: fp.multiply_adds,
        warm_prefill_s: warm_s,
        warm_prefill_cpu_s: warm_cpu,
        decode_tokens: args.tokens,
        decode_s,
        decode_ms_per_token: decode_s * 1e3 / args.tokens.max(1) as f64,
        decode_cpu_ms_per_token: decode_cpu * 1e3 / args.tokens.max(1) as f64,
        decode_floor_ms_per_token: fp.total() as f64 / bandwidth * 1e3,
        bytes_per_decode_token: fp.total(),
        footprint: fp,
        read_bandwidth_gb_s: bandwidth / 1e9,
        multiply_adds_per_s: mac_rate,
        multiply_adds_f32_per_s: mac_rate_f32,
        peak_rss_mib,
        peak_private_mib: private_mib,
        checkpoint_bytes,
        machine_memory_bytes: machine_memory_bytes(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else {
        m.print();
    }
    Ok(0)
}

/// The least a prefilled token's multiply-adds can cost as float multiply-adds, so the most a
/// decode step can cost over it. `exact`: rule C2 makes each product one f64 multiply-add
/// (MODEL.md §5.4). `upstream`: the f32 peak, a bound on any float form (the C1 kernels' integer
/// digit products are not bound by it, but an exact e4m3 × e4m3 product takes several).
#[derive(serde::Serialize)]
struct Ceiling {
    float: &'static str,
    ms_per_token: f64,
}

fn ceiling(numerics: Numerics, multiply_adds: u64, f64_rate: f64, f32_rate: f64) -> Ceiling {
    let (float, rate) = match numerics {
        Numerics::Exact => ("f64", f64_rate),
        Numerics::Upstream => ("f32", f32_rate),
    };
    Ceiling {
        float,
        ms_per_token: multiply_adds as f64 / rate * 1e3,
    }
}

/// One model measurement (`--json` prints it as is).
#[derive(serde::Serialize)]
struct Measurement {
    model: String,
    layout: String,
    dim: usize,
    layers: usize,
    numerics: String,
    index_k: String,
    threads: usize,
    /// The kernels' vector level (`DS41_SIMD=portable` forces the baseline).
    simd: String,
    open_s: f64,
    prefill_tokens: usize,
    prefill_s: f64,
    prefill_cpu_s: f64,
    prefill_cpu_ms_per_token: f64,
    /// Multiply-adds per token over the measured f64 multiply-add rate: the compute floor of
    /// a prefill whose products were all f64 multiply-adds (the integer kernels of rule C1
    /// make several products per instruction and can go below it).
    prefill_floor_ms_per_token: f64,
    /// The least a prefilled token can cost with float multiply-adds in this profile.
    prefill_ceiling: Ceiling,
    multiply_adds_per_token: u64,
    /// The same prefill in a second session, the checkpoint's pages already mapped.
    warm_prefill_s: f64,
    warm_prefill_cpu_s: f64,
    decode_tokens: usize,
    decode_s: f64,
    decode_ms_per_token: f64,
    decode_cpu_ms_per_token: f64,
    /// Bytes per decode token over the measured read bandwidth.
    decode_floor_ms_per_token: f64,
    bytes_per_decode_token: u64,
    footprint: footprint::Footprint,
    read_bandwidth_gb_s: f64,
    /// f64 multiply-adds per second, all threads.
    multiply_adds_per_s: f64,
    multiply_adds_f32_per_s: f64,
    /// `VmHWM`: resident pages, the memory-mapped checkpoint's file pages included.
    peak_rss_mib: Option<f64>,
    /// The largest `RssAnon` seen after prefill and after each decode step: the process's own
    /// memory (run state, caches, scratch), without the checkpoint's evictable file pages.
    peak_private_mib: Option<f64>,
    /// Bytes of the checkpoint's files, next to the machine's memory (`MemTotal`).
    checkpoint_bytes: Option<u64>,
    machine_memory_bytes: Option<u64>,
}

impl Measurement {
    fn print(&self) {
        let mb = |b: u64| b as f64 / 1e6;
        let f = &self.footprint;
        println!(
            "model      {} ({}, dim {}, {} layers)",
            self.model, self.layout, self.dim, self.layers
        );
        println!(
            "numerics   {}, index-k {}, threads {}, simd {}",
            self.numerics, self.index_k, self.threads, self.simd
        );
        println!("open       {:.3} s", self.open_s);
        println!(
            "machine    read bandwidth {:.1} GB/s, multiply-adds {:.2} G/s f64, {:.2} G/s f32 (all threads)",
            self.read_bandwidth_gb_s,
            self.multiply_adds_per_s / 1e9,
            self.multiply_adds_f32_per_s / 1e9
        );
        println!(
            "prefill    {} tokens in {:.3} s = {:.2} tokens/s (cpu {:.3} s, {:.2} ms/token; \
             f64 multiply-add floor {:.2} ms/token, ratio {:.1})",
            self.prefill_tokens,
            self.prefill_s,
            self.prefill_tokens as f64 / self.prefill_s,
            self.prefill_cpu_s,
            self.prefill_cpu_ms_per_token,
            self.prefill_floor_ms_per_token,
            self.prefill_s * 1e3 / self.prefill_tokens as f64 / self.prefill_floor_ms_per_token
        );
        let per_token = |s: f64| s * 1e3 / self.prefill_tokens as f64;
        println!(
            "  warm     again in a new session, pages mapped: {:.3} s (cpu {:.3} s, {:.2} ms/token)",
            self.warm_prefill_s,
            self.warm_prefill_cpu_s,
            per_token(self.warm_prefill_cpu_s)
        );
        if self.decode_tokens > 0 {
            println!(
                "decode     {} steps in {:.3} s = {:.2} tokens/s ({:.2} ms/token, cpu {:.2} ms/token)",
                self.decode_tokens,
                self.decode_s,
                self.decode_tokens as f64 / self.decode_s,
                self.decode_ms_per_token,
                self.decode_cpu_ms_per_token
            );
            println!(
                "  floor    {:.1} MB/token (trunk {:.1}, head {:.1}, embedding row {:.3}, Engram rows \
                 {:.3}, routed experts {:.1}) / {:.1} GB/s = {:.2} ms/token; ratio {:.1}",
                mb(f.total()),
                mb(f.trunk),
                mb(f.head),
                mb(f.embedding_row),
                mb(f.engram_rows),
                mb(f.routed_experts),
                self.read_bandwidth_gb_s,
                self.decode_floor_ms_per_token,
                self.decode_ms_per_token / self.decode_floor_ms_per_token
            );
            println!(
                "  vs warm prefill: a decode step costs {:.1}x a prefilled token (wall), {:.1}x (cpu)",
                self.decode_ms_per_token / per_token(self.warm_prefill_s),
                self.decode_cpu_ms_per_token / per_token(self.warm_prefill_cpu_s)
            );
            let c = &self.prefill_ceiling;
            println!(
                "  ceiling  a token's {:.3} G multiply-adds at the {} peak take {:.2} ms: with float \
                 multiply-adds a decode step costs at most {:.1}x a prefilled token",
                self.multiply_adds_per_token as f64 / 1e9,
                c.float,
                c.ms_per_token,
                self.decode_ms_per_token / c.ms_per_token
            );
        }
        let mib =
            |m: Option<f64>| m.map_or("unavailable (no /proc)".into(), |m| format!("{m:.1} MiB"));
        println!(
            "peak RSS   {} (mapped checkpoint pages included); private {}",
            mib(self.peak_rss_mib),
            mib(self.peak_private_mib)
        );
        let gb =
            |b: Option<u64>| b.map_or("unknown".into(), |b| format!("{:.2} GB", b as f64 / 1e9));
        println!(
            "memory     checkpoint {} on disk, machine {}",
            gb(self.checkpoint_bytes),
            gb(self.machine_memory_bytes)
        );
    }
}

/// A `kB` line of `/proc/self/status` (Linux) in MiB.
fn status_mib(key: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

fn private_rss_mib() -> Option<f64> {
    status_mib("RssAnon")
}

/// `MemTotal` of `/proc/meminfo` in bytes (Linux).
fn machine_memory_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Total size of the regular files under `dir` (the checkpoint as stored).
fn directory_bytes(dir: &std::path::Path) -> Option<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let meta = entry.metadata().ok()?;
        total += if meta.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Some(total)
}

/// `VmHWM` of this process in MiB (Linux).
fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM")
}

/// [`peak_rss_mib`] for a human, e.g. "123.4 MiB".
fn peak_rss() -> String {
    peak_rss_mib().map_or("unavailable (no /proc/self/status)".into(), |m| {
        format!("{m:.1} MiB")
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
    let d = args.width;
    if d == 0 || !d.is_multiple_of(32) {
        bail!("--width must be a positive multiple of 32, found {d}");
    }
    let ckpt: Arc<dyn Checkpoint> = Arc::new(MemWeights::fp8_random(d, d)?);
    let x: Vec<f32> = (0..args.rows.max(1) * d)
        .map(|i| (((i * 7919) % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    println!(
        "linear kernels, weight {d} x {d}, numerics {numerics}, threads {}, simd {}",
        rayon::current_num_threads(),
        ds41_engine::model::simd::level().name()
    );
    let kinds = [
        ("FP8 (C1 in upstream)", "w", LinearKind::Fp8),
        ("FP4 (C1 in upstream)", "w4", LinearKind::Fp4),
        ("FP8 read as BF16 (C2)", "w", LinearKind::Bf16),
        ("BF16 (C2)", "w16", LinearKind::Bf16),
        ("F32 (C2)", "w32", LinearKind::F32),
    ];
    for (label, name, kind) in kinds {
        let lin = Linear::load(&ckpt, name, kind)?;
        for rows in [1, args.rows.max(1)] {
            let mut y = vec![0f32; rows * d];
            // Small weights are timed over enough calls (~2^26 multiply-adds) to be measurable.
            let calls = ((1usize << 26) / (rows * d * d)).max(1);
            let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..args.reps.max(1) {
                let (t, c) = (Instant::now(), cpu_seconds());
                for _ in 0..calls {
                    lin.forward(&x[..rows * d], rows, &mut y, numerics)?;
                }
                best = best.min(t.elapsed().as_secs_f64() / calls as f64);
                best_cpu = best_cpu.min((cpu_seconds() - c) / calls as f64);
            }
            println!(
                "  {label:<22} rows {rows:>4}: {:>9.4} ms/call  {:>6.2} GMAC/s  (cpu {:>8.4} ms/call)",
                best * 1e3,
                (rows * d * d) as f64 / best / 1e9,
                best_cpu * 1e3
            );
        }
    }
    println!("peak RSS   {}", peak_rss());
    Ok(0)
}

/// One in-memory weight stored as FP8 codes with 32x32 E8M0 block scales, served as `w`
/// (stored FP8: the FP8 and BF16 kinds accept it, C1 applies), as `w16` and as `w32` (its
/// exact values stored BF16 and F32); and an FP4 weight of the same shape (packed e2m1, an
/// E8M0 scale per row and 32-column block, as the routed experts), `w4`. All are read by the
/// kernels through `weight_view`, like a mapped checkpoint.
struct MemWeights {
    shape: Vec<usize>,
    codes: Vec<u8>,
    scales: Vec<u8>,
    fp4_codes: Vec<u8>,
    fp4_scales: Vec<u8>,
    values: Vec<f32>,
    f32_bytes: Vec<u8>,
    bf16_bytes: Vec<u8>,
    cfg: Config,
}

impl MemWeights {
    fn fp8_random(out: usize, inp: usize) -> anyhow::Result<MemWeights> {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut uniform = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32
        };
        // Near-normal values (four uniforms' sum, unit variance, at most ±3.5) times 128, so
        // that a block's small values reach about a dozen exponents below its largest, as a
        // normal draw's do (uniform random bytes spread every block over all sixteen).
        let codes: Vec<u8> = (0..out * inp)
            .map(|_| {
                let g = ((0..4).map(|_| uniform()).sum::<f32>() - 2.0) * 3f32.sqrt();
                ds41_engine::model::quant::e4m3_encode(g * 128.0)
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
        // Two nibbles of the FP8 codes' bits per byte; scales by row and block.
        let fp4_codes = codes[..out * inp / 2].to_vec();
        let fp4_scales = (0..out * bi).map(|b| 117 - (b % 3) as u8).collect();
        // Exact: an e4m3 value times a power of two has at most four significant bits.
        let bf16_bytes = values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        Ok(MemWeights {
            shape: vec![out, inp],
            codes,
            scales,
            fp4_codes,
            fp4_scales,
            values,
            f32_bytes,
            bf16_bytes,
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
        matches!(name, "w" | "w4" | "w16" | "w32")
    }
    fn names(&self) -> Vec<String> {
        vec!["w".into(), "w4".into(), "w16".into(), "w32".into()]
    }
    fn shape(&self, _: &str) -> ds41_engine::Result<Vec<usize>> {
        Ok(self.shape.clone())
    }
    fn storage(&self, name: &str) -> ds41_engine::Result<Storage> {
        Ok(match name {
            "w32" => Storage::F32,
            "w16" => Storage::Bf16,
            "w4" => Storage::Fp4,
            _ => Storage::Fp8Block,
        })
    }
    fn tensor_f32(&self, name: &str) -> ds41_engine::Result<Vec<f32>> {
        let mut all = vec![0.0; self.shape[0] * self.shape[1]];
        self.rows_f32(name, 0, &mut all)?;
        Ok(all)
    }
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> ds41_engine::Result<()> {
        let cols = self.shape[1];
        if name != "w4" {
            out.copy_from_slice(&self.values[first * cols..first * cols + out.len()]);
            return Ok(());
        }
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            let r = first + i;
            for (k, pair) in row.chunks_exact_mut(2).enumerate() {
                let s =
                    ds41_engine::dtype::e8m0_to_f32(self.fp4_scales[r * cols / 32 + 2 * k / 32]);
                let [lo, hi] = ds41_engine::dtype::e2m1_pair(self.fp4_codes[r * cols / 2 + k]);
                pair.copy_from_slice(&[lo * s, hi * s]);
            }
        }
        Ok(())
    }
    fn quant_view(&self, name: &str) -> ds41_engine::Result<Option<QuantView<'_>>> {
        let (kind, codes, scales, scale_cols) = match name {
            "w" => (
                QuantKind::Fp8Block,
                &self.codes,
                &self.scales,
                self.shape[1].div_ceil(32),
            ),
            "w4" => (
                QuantKind::Fp4,
                &self.fp4_codes,
                &self.fp4_scales,
                self.shape[1] / 32,
            ),
            _ => return Ok(None),
        };
        Ok(Some(QuantView {
            kind,
            rows: self.shape[0],
            cols: self.shape[1],
            codes,
            scales,
            scale_cols,
        }))
    }
    fn weight_view(&self, name: &str) -> ds41_engine::Result<Option<WeightView<'_>>> {
        let dense = |dtype, bytes| {
            Ok(Some(WeightView::Dense {
                dtype,
                rows: self.shape[0],
                cols: self.shape[1],
                bytes,
            }))
        };
        match name {
            "w32" => return dense(DenseDtype::F32, &self.f32_bytes),
            "w16" => return dense(DenseDtype::Bf16, &self.bf16_bytes),
            _ => {}
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
