//! `ds41 forward`: run the reference forward pass and write a trace (docs/TRACE.md).
//!
//! Prefills the first N tokens at position 0 (default: all), decodes the rest one token per
//! step. With `--replay GOLDEN`, every block is recomputed from the golden's own
//! `block_input` / `pre_mix` (teacher forcing) in the same schedule. The work is the engine's
//! `ForwardJob`, the same the harness's in-process reference runs.

use std::path::PathBuf;

use anyhow::{bail, Context};
use ds41_engine::model::{DefectSet, ForwardJob, ImageSource, IndexK, Options, TokenMap};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (release layout or WASTE container).
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated token ids (with --replay: default = the golden's input_ids).
    #[arg(long, value_delimiter = ',')]
    pub tokens: Vec<u32>,
    /// Tokens prefilled at position 0 (default: all; with --replay: the golden's schedule).
    #[arg(long)]
    pub prefill: Option<usize>,
    /// Numerics profile: upstream (bf16 + fake-quant, canonical sums) or exact (pure f32).
    #[arg(long, default_value = "upstream")]
    pub numerics: String,
    /// Index-key hand-off: as-shipped (what model.py computes) or owner (the fix).
    #[arg(long = "index-k", default_value = "as-shipped")]
    pub index_k: String,
    /// Output trace (safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Teacher-forced replay against this golden (needs block_input, pre_mix, residual, final_pre).
    #[arg(long)]
    pub replay: Option<PathBuf>,
    /// Also record sub-op tensors (attn_out, moe_out, mid, block_input, pre_mix, engram_gate,
    /// final_pre, candidates), as the harness's reference always does. Always on with
    /// --replay.
    #[arg(long)]
    pub sub_ops: bool,
    /// Inject a defect (negative control); repeatable. Names: see `Defect::ALL_NAMES`.
    #[arg(long = "defect")]
    pub defects: Vec<String>,
    /// Engram token map (int32 `.npy`, or a safetensors file with `engram_token_map`, e.g. a
    /// golden) to use instead of the checkpoint's own (shipped, or built from its
    /// tokenizer.json): e.g. to run a checkpoint with another tokenizer's map.
    #[arg(long = "engram-token-map")]
    pub engram_token_map: Option<PathBuf>,
    /// Save the session state after the given tokens (docs/STATE.md; atomic write).
    #[arg(long = "save-state")]
    pub save_state: Option<PathBuf>,
    /// Continue from a saved session state. `--prefill N` then processes the first N given
    /// tokens as one chunk (default 0: every token is a decode step with its own logits row).
    #[arg(long = "load-state")]
    pub load_state: Option<PathBuf>,
    /// An image (PNG); repeatable. Each replaces, in order, one image marker of --tokens (the
    /// model's `image_token_id`, `<｜deepseek_image｜>` in the release tokenizer), expanded to
    /// the image's span. --prefill counts a marker as one token and must cover every marker.
    #[arg(long = "image")]
    pub images: Vec<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let job = ForwardJob {
        model: args.model.clone(),
        tokens: args.tokens.clone(),
        prefill: args.prefill,
        options: Options {
            numerics: args
                .numerics
                .parse()
                .map_err(|e: String| anyhow::anyhow!(e))?,
            index_k: args
                .index_k
                .parse::<IndexK>()
                .map_err(|e: String| anyhow::anyhow!(e))?,
            defects: DefectSet::parse(&args.defects).map_err(|e| anyhow::anyhow!(e))?,
        },
        token_map: args
            .engram_token_map
            .clone()
            .map_or(TokenMap::FromCheckpoint, TokenMap::File),
        replay: args.replay.clone(),
        load_state: args.load_state.clone(),
        save_state: args.save_state.clone(),
        sub_ops: args.sub_ops,
        images: args.images.iter().cloned().map(ImageSource::File).collect(),
    };
    if job.tokens.is_empty() && job.replay.is_none() {
        bail!("--tokens is required (comma-separated ids)");
    }
    let out = job
        .run()
        .with_context(|| format!("ds41 forward on {}", args.model.display()))?;
    out.trace
        .write(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "ds41 forward: {} tokens (prefill {}, {} decode steps), {}, index-k {} -> {}",
        out.tokens,
        out.prefill,
        out.tokens - out.prefill,
        job.options.numerics,
        job.options.index_k,
        args.out.display()
    );
    Ok(0)
}
