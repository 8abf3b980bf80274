//! `ds41 corpus --wide N --seed S`: the wide tokenizer corpus as JSON lines (TOKENIZER.md §9).
//!
//! Each line is `{"i", "kind", "text"}`, plus `"ids"` (HF-style `encode`, i.e. `encode_markup`)
//! when `--tokenizer` is given, the format of the release golden. The recipe strings come
//! first, in the recipe's order (with `--wide 20000 --seed 11` they equal the golden's 24,021
//! texts); the extra curated strings (kind `extra`) follow unless `--no-extra`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use ds41_engine::tokenizer::{corpus, Tokenizer};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Number of random strings (the corpus also has 21 curated and max(200, N/5) whitespace
    /// strings).
    #[arg(long)]
    pub wide: usize,
    /// Seed of the CPython-compatible MT19937 stream.
    #[arg(long, default_value_t = 11)]
    pub seed: u64,
    /// Leave out the extra curated strings.
    #[arg(long)]
    pub no_extra: bool,
    /// Add each string's ids under this tokenizer.json.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Write here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let tok = args
        .tokenizer
        .as_ref()
        .map(Tokenizer::from_file)
        .transpose()?;
    let mut strings = corpus::wide(args.wide, args.seed);
    if !args.no_extra {
        strings.extend(corpus::extra());
    }
    let sink: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = std::io::BufWriter::new(sink);
    for (i, s) in strings.iter().enumerate() {
        let mut record = json!({"i": i, "kind": s.kind, "text": s.text});
        if let Some(tok) = &tok {
            record["ids"] = json!(tok.encode_markup(&s.text));
        }
        writeln!(out, "{record}")?;
    }
    out.flush()?;
    Ok(0)
}
