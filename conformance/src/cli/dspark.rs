//! `ds41 dspark`: run the reference's DSpark draft head (MODEL.md §10.1) over a schedule of
//! the main model and write a DSpark trace (docs/TRACE.md "DSpark"). With `--replay GOLDEN`
//! the drafter is teacher-forced from a DSpark golden, and the first tensor, step and stage
//! where the run leaves it beyond the `upstream` replay gates is printed. Release layout only:
//! the container drops the MTP stages (CONTAINER.md §8).

use std::path::PathBuf;

use anyhow::{bail, Context};
use ds41_conformance::families::dspark::replay_limit;
use ds41_conformance::gates::Gates;
use ds41_engine::model::dspark::trace;
use ds41_engine::model::{DefectSet, Model, Options};
use ds41_engine::trace::TraceFile;

#[derive(clap::Args)]
pub struct Args {
    /// Release-layout checkpoint with `mtp.*` stages.
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated token ids (with --replay: default = the golden's input_ids).
    #[arg(long, value_delimiter = ',')]
    pub tokens: Vec<u32>,
    /// Tokens prefilled at position 0; a draft follows every later (decode) token (default:
    /// all but the last; with --replay: the golden's).
    #[arg(long)]
    pub prefill: Option<usize>,
    /// Numerics profile: upstream (bf16 + fake-quant) or exact (pure f32).
    #[arg(long, default_value = "upstream")]
    pub numerics: String,
    /// Output DSpark trace (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Teacher-forced from this DSpark golden (goldens/official/*/dspark_*.safetensors).
    #[arg(long)]
    pub replay: Option<PathBuf>,
    /// Inject a defect (negative control); repeatable.
    #[arg(long = "defect")]
    pub defects: Vec<String>,
    /// After the given tokens, decode this many more, each the main model's greedy id: a
    /// generated run, whose drafts `ds41 gate spec-window --dspark` can score.
    #[arg(long, default_value_t = 0)]
    pub generate: usize,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let golden = match &args.replay {
        Some(p) => Some(TraceFile::read(p).with_context(|| format!("--replay {}", p.display()))?),
        None => None,
    };
    let tokens: Vec<u32> = match (&golden, args.tokens.is_empty()) {
        (Some(g), true) => g.input_ids()?,
        (_, false) => args.tokens.clone(),
        (None, true) => bail!("--tokens is required without --replay"),
    };
    let prefill = match (args.prefill, &golden) {
        (Some(p), _) => p,
        (None, Some(g)) => g
            .prefill()?
            .context("the golden's metadata has no `prefill`; give --prefill")?,
        (None, None) => tokens.len().saturating_sub(1).max(1),
    };
    let options = Options {
        numerics: args
            .numerics
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?,
        defects: DefectSet::parse(&args.defects).map_err(|e| anyhow::anyhow!(e))?,
        ..Options::default()
    };
    let model = Model::open(&args.model)?;
    let t = trace::run_and_generate(
        &model,
        &options,
        &tokens,
        prefill,
        golden.as_ref(),
        args.generate,
    )?;
    t.write(&args.out)?;
    let drafts = t.i64("dspark.output_ids").map_or(0, |(s, _)| s[0]);
    println!(
        "wrote {} ({drafts} drafts after a prefill of {prefill}, {} numerics)",
        args.out.display(),
        options.numerics.as_str()
    );
    if let Some(g) = &golden {
        let gates = upstream_gates()?;
        let (t, notes) = trace::excuse_draft_flips(g, &t);
        match trace::first_divergence(g, &t, |n| replay_limit(&gates, n)) {
            None => {
                for n in notes {
                    println!("excused draft id flip: {n}");
                }
                println!("replay: within the upstream replay gates")
            }
            Some(d) => {
                println!("replay: first divergence: {d}");
                return Ok(1);
            }
        }
    }
    Ok(0)
}

/// The `upstream` profile as built into this binary (gates/upstream.yaml).
fn upstream_gates() -> anyhow::Result<Gates> {
    let (_, bytes) = ds41_conformance::embedded::files()
        .iter()
        .find(|(p, _)| *p == "gates/upstream.yaml")
        .context("gates/upstream.yaml is not built into this binary")?;
    serde_yaml::from_slice(bytes).context("gates/upstream.yaml")
}
