//! `ds41 tokenize`: encode text (or decode ids) with a `tokenizer.json` (TOKENIZER.md).
//!
//! * `ds41 tokenize --tokenizer FILE [--markup] [TEXT]` prints one JSON id array for TEXT (or
//!   all of stdin when TEXT is absent).
//! * `--jsonl` is batch mode: every stdin line is a JSON string, every output line its JSON
//!   id array.
//! * `--decode [--skip-special]` reverses it: JSON id arrays in, JSON strings out (batch with
//!   `--jsonl`, else one array from TEXT or stdin).
//!
//! Without `--markup` the input is data (`encode_text`): spellings of control tokens such as
//! `<｜User｜>` become ordinary BPE tokens. `--markup` (`encode_markup`, HF `encode`)
//! recognises them.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use ds41_engine::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// The tokenizer.json to load.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Recognise added tokens (control tokens) in the input.
    #[arg(long)]
    pub markup: bool,
    /// Batch mode: one JSON value per stdin line, one result per stdout line.
    #[arg(long)]
    pub jsonl: bool,
    /// Decode JSON id arrays instead of encoding text.
    #[arg(long)]
    pub decode: bool,
    /// With --decode: drop special=true tokens.
    #[arg(long, requires = "decode")]
    pub skip_special: bool,
    /// The text (or, with --decode, the JSON id array); read from stdin when absent.
    pub input: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let tok = Tokenizer::from_file(&args.tokenizer)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let convert = |value: &str, what: &str| -> anyhow::Result<String> {
        if args.decode {
            let ids: Vec<u32> = serde_json::from_str(value)
                .with_context(|| format!("{what}: expected a JSON array of token ids"))?;
            let text = tok.decode(&ids, args.skip_special)?;
            Ok(serde_json::to_string(&text)?)
        } else {
            let ids = if args.markup {
                tok.encode_markup(value)
            } else {
                tok.encode_text(value)
            };
            Ok(serde_json::to_string(&ids)?)
        }
    };
    if args.jsonl {
        anyhow::ensure!(
            args.input.is_none(),
            "--jsonl reads stdin; do not pass an input argument"
        );
        for (n, line) in std::io::stdin().lock().lines().enumerate() {
            let line = line.with_context(|| format!("stdin line {}", n + 1))?;
            let what = format!("stdin line {}", n + 1);
            let value = if args.decode {
                line
            } else {
                serde_json::from_str::<String>(&line)
                    .with_context(|| format!("{what}: expected a JSON string"))?
            };
            writeln!(out, "{}", convert(&value, &what)?)?;
        }
    } else {
        let input = match args.input {
            Some(text) => text,
            None => {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading stdin (must be UTF-8)")?;
                text
            }
        };
        writeln!(out, "{}", convert(&input, "input")?)?;
    }
    out.flush()?;
    Ok(0)
}
