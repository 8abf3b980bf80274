//! `ds41 convert`: convert a release checkpoint into a WASTE v0 container with the project's
//! own converter (`ds41_conformance::convert`), e.g. to prove `ds41 gate converter` on a
//! faithful pair, or, with `--defect`, on a known-bad one.

use std::path::PathBuf;

use ds41_conformance::convert::{convert, vq::VqParams, ConvertOptions, ConverterDefect, DEFECTS};

#[derive(clap::Args)]
pub struct Args {
    /// Release checkpoint directory (config.json + safetensors).
    #[arg(long, required_unless_present = "list_defects")]
    pub release: Option<PathBuf>,
    /// New (or empty) output directory for the container.
    #[arg(long, required_unless_present = "list_defects")]
    pub out: Option<PathBuf>,
    /// Bits of the bulk of the trunk: 8 (Q8G) or 4 (Q4G, as WASTE's converter).
    #[arg(long, default_value_t = 8)]
    pub trunk_bits: u8,
    /// Engram table bits: 4 or 8.
    #[arg(long, default_value_t = 4)]
    pub engram_bits: u8,
    /// Keep trunk tensors with fewer elements in F32 (WASTE's converter: 65536).
    #[arg(long, default_value_t = 0)]
    pub f32_below: usize,
    /// k-means iterations per codebook stage.
    #[arg(long, default_value_t = VqParams::default().iters)]
    pub vq_iters: usize,
    /// Training vectors per (layer, kind) at most (a strided sample beyond that).
    #[arg(long, default_value_t = VqParams::default().max_train)]
    pub vq_train: usize,
    /// Seed of the k-means initialisation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Convert with one deliberate mistake (negative control for `ds41 gate converter`).
    #[arg(long)]
    pub defect: Option<String>,
    /// List the defects and exit.
    #[arg(long)]
    pub list_defects: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    if a.list_defects {
        for d in DEFECTS {
            println!("{:<22} {}", d.name, d.description);
        }
        return Ok(0);
    }
    let (Some(release), Some(out)) = (a.release, a.out) else {
        anyhow::bail!("--release and --out are required");
    };
    let defect = a
        .defect
        .as_deref()
        .map(str::parse::<ConverterDefect>)
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    let o = ConvertOptions {
        trunk_bits: a.trunk_bits,
        engram_bits: a.engram_bits,
        f32_below: a.f32_below,
        vq: VqParams {
            iters: a.vq_iters,
            max_train: a.vq_train,
            seed: a.seed,
        },
        defect,
    };
    let done = convert(&release, &out, &o)?;
    println!(
        "{} -> {}: {} trunk tensors, {} experts in {} banks, {} Engram tables; {} release tensors dropped ({} scale companions){}",
        release.display(),
        out.display(),
        done.trunk_tensors,
        done.experts,
        done.expert_layers,
        done.engram_tables,
        done.dropped.len(),
        done.dropped.iter().filter(|d| d.0.ends_with(".scale")).count(),
        defect.map_or(String::new(), |d| format!("; defect `{}`", d.info().name)),
    );
    Ok(0)
}
