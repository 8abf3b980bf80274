//! `ds41 gate`: acceptance gates computed from an engine's outputs rather than compared with
//! a golden. `spec-window`: whether speculative decoding pays in bytes on a model, from a
//! decode trace's routed experts (`ds41_conformance::spec_window`).

use std::path::PathBuf;

use anyhow::{bail, Context};

use ds41_conformance::footprint::{footprint, routed_sets, WeightBytes};
use ds41_conformance::spec_window::{plot, spec_window};
use ds41_conformance::trace::TraceFile;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub gate: Gate,
}

#[derive(clap::Subcommand)]
pub enum Gate {
    /// Bytes a verify pass over K consecutive decode tokens reads, relative to one token
    /// (the tokens per pass speculation must yield to pay), per K, per layer and overall.
    SpecWindow(SpecWindowArgs),
    /// Whether a WASTE container holds a release's model: tensor accounting, per-tensor
    /// round-trip error against the release's exact dequantisation, Engram statements, and
    /// forward agreement (thresholds: gates/converter.yaml).
    Converter(ConverterArgs),
}

#[derive(clap::Args)]
pub struct ConverterArgs {
    /// The release checkpoint the container was converted from.
    #[arg(long)]
    pub release: PathBuf,
    /// The WASTE v0 container to certify.
    #[arg(long)]
    pub container: PathBuf,
    /// Directory holding converter.yaml and the tolerance profiles (default: the gates built
    /// into this binary).
    #[arg(long)]
    pub gates: Option<PathBuf>,
    /// Skip the forward comparison of the two layouts.
    #[arg(long)]
    pub no_forward: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write converter.json here.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct SpecWindowArgs {
    /// The checkpoint the trace was made on (stored bytes of every expert).
    #[arg(long)]
    pub model: PathBuf,
    /// A trace with `experts` [tokens, layers, top-k] (any engine's; docs/TRACE.md).
    #[arg(long)]
    pub trace: PathBuf,
    /// Largest window.
    #[arg(long, default_value_t = 8)]
    pub max_k: usize,
    /// First trace row to use (e.g. the prefill length, to use decode tokens only).
    #[arg(long, default_value_t = 0)]
    pub first_token: usize,
    /// Per-draft acceptance rate (0..1, e.g. from a DSpark run): say whether speculation pays.
    #[arg(long)]
    pub acceptance: Option<f64>,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write spec-window.json and spec-window.svg here.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    match a.gate {
        Gate::SpecWindow(a) => spec_window_gate(a),
        Gate::Converter(a) => super::gate_converter::run(a),
    }
}

fn spec_window_gate(a: SpecWindowArgs) -> anyhow::Result<i32> {
    if let Some(r) = a.acceptance {
        if !(0.0..=1.0).contains(&r) {
            bail!("--acceptance {r}: a per-draft acceptance rate is in [0, 1]");
        }
    }
    if a.max_k == 0 {
        bail!("--max-k must be at least 1");
    }
    let ckpt = ds41_engine::checkpoint::open(&a.model)
        .with_context(|| format!("opening {}", a.model.display()))?;
    let weights = WeightBytes::of(ckpt.as_ref())?;
    let trace = TraceFile::read(&a.trace)?;
    let t = trace.get("experts").with_context(|| {
        format!(
            "{}: no `experts` tensor (capability trace.experts)",
            a.trace.display()
        )
    })?;
    let &[tokens, layers, k] = t.shape.as_slice() else {
        bail!(
            "{}: `experts` has shape {:?}, expected [tokens, layers, top-k]",
            a.trace.display(),
            t.shape
        );
    };
    if k == 0 || k > ckpt.config().n_routed_experts {
        bail!(
            "{}: `experts` holds {k} experts per token and layer, the model routes to 1..={}",
            a.trace.display(),
            ckpt.config().n_routed_experts
        );
    }
    if layers != ckpt.config().n_layers {
        bail!(
            "{}: `experts` covers {layers} layers, the model at {} has {}",
            a.trace.display(),
            a.model.display(),
            ckpt.config().n_layers
        );
    }
    if a.first_token >= tokens {
        bail!(
            "--first-token {}: the trace has {tokens} tokens",
            a.first_token
        );
    }
    let ids = t.as_i64();
    let n_experts = ckpt.config().n_routed_experts as i64;
    if let Some(at) = ids.iter().position(|&e| e < -1 || e >= n_experts) {
        let (tok, l) = (at / (layers * k), at / k % layers);
        bail!(
            "{}: `experts` token {tok} layer {l} names expert {}, outside -1..{n_experts}",
            a.trace.display(),
            ids[at]
        );
    }
    let routed = routed_sets(&ids[a.first_token * layers * k..], layers, k);
    let rows = spec_window(&weights, &routed, a.max_k, a.acceptance);
    if let Some(dir) = &a.report {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("spec-window.json"),
            serde_json::to_string_pretty(&rows)?,
        )?;
        let title = format!(
            "spec window: {} tokens of {}",
            routed.len(),
            a.trace.file_name().unwrap_or_default().to_string_lossy()
        );
        std::fs::write(dir.join("spec-window.svg"), plot(&rows, &title))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    println!(
        "{} decode tokens, {layers} layers, top-{k}; one token reads {:.2} MB ({:.2} MB trunk + head)",
        routed.len(),
        footprint(&weights, &routed).total() as f64 / 1e6,
        (weights.trunk + weights.head) as f64 / 1e6
    );
    println!(
        "{:>3} {:>8} {:>13} {:>13} {:>16}{}",
        "K",
        "windows",
        "experts ratio",
        "tokens needed",
        "drafts accepted",
        if a.acceptance.is_some() {
            "  expected  pays"
        } else {
            ""
        }
    );
    for r in &rows {
        let pays = match (r.expected_tokens, r.pays) {
            (Some(e), Some(p)) => format!("  {e:>8.2}  {}", if p { "yes" } else { "no" }),
            _ => String::new(),
        };
        println!(
            "{:>3} {:>8} {:>13.2} {:>13.2} {:>16.2}{pays}",
            r.k, r.windows, r.expert_ratio, r.total_ratio, r.break_even_accepted
        );
    }
    Ok(0)
}
