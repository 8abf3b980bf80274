//! `ds41 forward`: run the reference forward pass and write a trace (docs/TRACE.md).
//!
//! Prefills the first N tokens at position 0 (default: all), decodes the rest one token per
//! step. With `--replay GOLDEN`, every block is recomputed from the golden's own
//! `block_input` / `pre_mix` (teacher forcing, issue 4 item 7) in the same schedule.

use std::path::PathBuf;

use anyhow::{bail, Context};
use ds41_engine::model::{Defect, DefectSet, Forcing, IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceFile, TraceOptions};

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
    /// candidates). Always on with --replay.
    #[arg(long)]
    pub sub_ops: bool,
    /// Inject a defect (negative control); repeatable. Names: see `Defect::ALL_NAMES`.
    #[arg(long = "defect")]
    pub defects: Vec<String>,
    /// Engram token map (int32 `.npy`, or a safetensors file with `engram_token_map`, e.g. a
    /// golden) for a release checkpoint whose tokenizer cannot build it. With --replay the
    /// golden's own map is used when it carries one.
    #[arg(long = "engram-token-map")]
    pub engram_token_map: Option<PathBuf>,
    /// Save the session state after the given tokens (docs/STATE.md; atomic write).
    #[arg(long = "save-state")]
    pub save_state: Option<PathBuf>,
    /// Continue from a saved session state. `--prefill N` then processes the first N given
    /// tokens as one chunk (default 0: every token is a decode step with its own logits row).
    #[arg(long = "load-state")]
    pub load_state: Option<PathBuf>,
}

/// Read a token map from an int32 `.npy` file or a safetensors file's `engram_token_map`.
fn read_token_map(path: &std::path::Path) -> anyhow::Result<Vec<i32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(b"\x93NUMPY") {
        let (major, hl_at) = (bytes[6], 8);
        let (hlen, data_at) = if major == 1 {
            (
                u16::from_le_bytes([bytes[hl_at], bytes[hl_at + 1]]) as usize,
                hl_at + 2,
            )
        } else {
            let b: [u8; 4] = bytes[hl_at..hl_at + 4].try_into()?;
            (u32::from_le_bytes(b) as usize, hl_at + 4)
        };
        let header = std::str::from_utf8(
            bytes
                .get(data_at..data_at + hlen)
                .context("truncated .npy header")?,
        )?;
        if !header.contains("'<i4'") || header.contains("'fortran_order': True") {
            bail!(
                "{}: expected a C-order little-endian int32 array, header {header}",
                path.display()
            );
        }
        return Ok(bytes[data_at + hlen..]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect());
    }
    let file = TraceFile::from_bytes(&bytes, path)?;
    let (_, map) = file
        .i64("engram_token_map")
        .with_context(|| format!("{} has no `engram_token_map` tensor", path.display()))?;
    map.iter()
        .map(|&x| i32::try_from(x).context("token map value out of range"))
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let numerics: Numerics = args
        .numerics
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let index_k: IndexK = args
        .index_k
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let defects = DefectSet::new(
        args.defects
            .iter()
            .map(|d| d.parse::<Defect>().map_err(|e| anyhow::anyhow!(e)))
            .collect::<anyhow::Result<Vec<_>>>()?,
    );
    let golden = match &args.replay {
        Some(p) => {
            Some(TraceFile::read(p).with_context(|| format!("reading golden {}", p.display()))?)
        }
        None => None,
    };
    let token_map = match (&args.engram_token_map, &golden) {
        (Some(p), _) => Some(read_token_map(p)?),
        (None, Some(g)) => g
            .i64("engram_token_map")
            .map(|(_, m)| m.iter().map(|&x| x as i32).collect()),
        (None, None) => None,
    };
    let model = Model::open_with_token_map(&args.model, token_map)
        .with_context(|| format!("opening {}", args.model.display()))?;
    let tokens: Vec<u32> = match (&golden, args.tokens.is_empty()) {
        (_, false) => args.tokens.clone(),
        (Some(g), true) => g
            .i64("input_ids")
            .context("golden has no input_ids; pass --tokens")?
            .1
            .iter()
            .map(|&t| u32::try_from(t).context("golden input_ids holds a negative id"))
            .collect::<anyhow::Result<_>>()?,
        (None, true) => bail!("--tokens is required (comma-separated ids)"),
    };
    if tokens.is_empty() {
        bail!("--tokens is empty");
    }
    let prefill = match (args.prefill, &golden) {
        (Some(n), _) => n,
        (None, Some(g)) => match g.metadata.get("prefill") {
            Some(s) => s
                .parse()
                .with_context(|| format!("golden metadata prefill = {s:?}"))?,
            None => bail!("the golden does not state its prefill length; pass --prefill"),
        },
        (None, None) if args.load_state.is_some() => 0,
        (None, None) => tokens.len(),
    };
    if args.load_state.is_some() && golden.is_some() {
        bail!("--load-state cannot be combined with --replay");
    }
    if args.load_state.is_some() && prefill <= tokens.len() {
        // After a restore, 0 prefilled tokens is allowed.
    } else if prefill == 0 || prefill > tokens.len() {
        bail!(
            "--prefill {prefill} must be between 1 and the number of tokens ({})",
            tokens.len()
        );
    }

    let options = Options {
        numerics,
        index_k,
        defects: defects.clone(),
    };
    let sub_ops = args.sub_ops || golden.is_some();
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops,
        },
    );
    let mut session = Session::new(&model, options);
    if let Some(p) = &args.load_state {
        ds41_engine::state::restore(&model, &mut session, p)
            .with_context(|| format!("loading state {}", p.display()))?;
    }
    match &golden {
        Some(g) => {
            let forcing = Forcing::from_golden(g, model.config())?;
            session.replay(&tokens[..prefill], &forcing, &mut trace)?;
            for i in prefill..tokens.len() {
                session.replay(&tokens[i..i + 1], &forcing, &mut trace)?;
            }
        }
        None => {
            if prefill > 0 {
                session.prefill(&tokens[..prefill], &mut trace)?;
            }
            for &t in &tokens[prefill..] {
                session.decode(t, &mut trace)?;
            }
        }
    }
    let m = &mut trace.metadata;
    m.insert("engine".into(), ds41_engine::ENGINE_NAME.into());
    m.insert("version".into(), ds41_engine::ENGINE_VERSION.into());
    m.insert(
        "layout".into(),
        format!("{:?}", model.layout()).to_lowercase(),
    );
    m.insert("numerics".into(), numerics.to_string());
    m.insert("index-k".into(), index_k.to_string());
    m.insert(
        "tie_rule".into(),
        "largest first; equal values -> lower index".into(),
    );
    m.insert(
        "topk_convention".into(),
        "compressed positions (no window offset), ascending, -1 = none".into(),
    );
    m.insert(
        "logits_rows".into(),
        "row 0 = prefill (last position), row i = decode step i".into(),
    );
    m.insert("prefill".into(), prefill.to_string());
    m.insert("decode_steps".into(), (tokens.len() - prefill).to_string());
    m.insert(
        "mode".into(),
        if golden.is_some() {
            "replay"
        } else {
            "forward"
        }
        .into(),
    );
    if !defects.is_empty() {
        m.insert("defects".into(), defects.to_string());
    }
    if let Some(p) = &args.load_state {
        m.insert("loaded_state".into(), p.display().to_string());
        m.insert(
            "start_position".into(),
            (session.position() - tokens.len()).to_string(),
        );
    }
    // Weights overwritten in place while the forward ran would change the results silently.
    model
        .checkpoint()
        .verify_unchanged()
        .context("the checkpoint changed while the forward ran; no trace or state written")?;
    if let Some(p) = &args.save_state {
        ds41_engine::state::save(&model, &session, p)
            .with_context(|| format!("saving state {}", p.display()))?;
    }
    trace
        .write(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "ds41 forward: {} tokens (prefill {prefill}, {} decode steps), {numerics}, index-k {index_k} -> {}",
        tokens.len(),
        tokens.len() - prefill,
        args.out.display()
    );
    Ok(0)
}
