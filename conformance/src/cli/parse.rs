//! `ds41 parse`: a completion (the text generated after the prompt's header) back into an
//! assistant message (DSML.md §3, §4), printed as one JSON line in the reference parser's shape:
//! `{"role", "content", "reasoning_content", "tool_calls": [{"type": "function", "function":
//! {"name", "arguments"}, "namespace"?}]}`. A completion the strict grammar rejects exits 1
//! with the reason; with `--tolerant` every repair is listed on stderr.

use anyhow::Context;
use ds41_engine::dsml::{self, ParseMode, ThinkingMode};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The completion text (UTF-8), exactly as generated.
    #[arg(long, value_name = "FILE")]
    pub completion: PathBuf,
    /// The completion was generated in thinking mode (it starts with the reasoning).
    #[arg(long)]
    pub thinking: bool,
    /// Use the tolerant server grammar instead of the strict reference parser.
    #[arg(long)]
    pub tolerant: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let path = args.completion.display().to_string();
    let bytes = std::fs::read(&args.completion).with_context(|| format!("reading {path}"))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{path} @ byte {}: not valid UTF-8",
            e.utf8_error().valid_up_to()
        )
    })?;
    let thinking_mode = if args.thinking {
        ThinkingMode::Thinking
    } else {
        ThinkingMode::Chat
    };
    let mode = if args.tolerant {
        ParseMode::tolerant(thinking_mode)
    } else {
        ParseMode::strict(thinking_mode)
    };
    match dsml::parse(&text, mode) {
        Ok(message) => {
            for recovery in &message.recoveries {
                eprintln!("ds41 parse: recovered: {recovery:?}");
            }
            println!("{}", dsml::json_py::dumps(&message.to_json()));
            Ok(0)
        }
        Err(err) => {
            let reason = err.reference_error().unwrap_or_else(|| err.to_string());
            eprintln!(
                "ds41 parse: {path}: rejected by the strict grammar ({}): {reason}",
                err.location
            );
            Ok(1)
        }
    }
}
