//! `ds41 render`: a conversation file (official test-case format, DSML.md §1) to its DSML
//! prompt, byte-identical to `encode_case`. Prints exactly the prompt (no newline added), or
//! with `--segments` the text/control segments as JSON.

use anyhow::Context;
use ds41_engine::dsml::{self, ReasoningEffort, ThinkingMode};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Conversation JSON: a list of messages, or an object with `messages` and optional
    /// `tools`, `thinking_mode`, `reasoning_effort`, `context` (and the project extension
    /// `drop_thinking`). Case-level tools attach to the first message.
    #[arg(long, value_name = "FILE.json")]
    pub conversation: PathBuf,
    /// Thinking mode when the file does not set one.
    #[arg(long, value_name = "chat|thinking", default_value = "chat")]
    pub thinking_mode: String,
    /// Reasoning effort when the file does not set one: 1–100, low, high or max.
    #[arg(long, value_name = "E")]
    pub reasoning_effort: Option<String>,
    /// Print the prompt as JSON segments (`{"text"}` / `{"control", "id"}`) instead.
    #[arg(long)]
    pub segments: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let path = args.conversation.display().to_string();
    let mode: ThinkingMode = args
        .thinking_mode
        .parse()
        .map_err(|e: dsml::Error| anyhow::anyhow!("--thinking-mode: {e}"))?;
    let effort = match &args.reasoning_effort {
        Some(e) => Some(
            e.parse::<ReasoningEffort>()
                .map_err(|err| anyhow::anyhow!("--reasoning-effort: {err}"))?,
        ),
        None => None,
    };
    let text =
        std::fs::read_to_string(&args.conversation).with_context(|| format!("reading {path}"))?;
    let case = dsml::load_case(&text).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let options = case.options(mode, effort);
    let prompt =
        dsml::render(&case.conversation, &options).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let mut out = std::io::stdout().lock();
    if args.segments {
        let segments = prompt.segments_json();
        let items = segments.as_array().map(Vec::as_slice).unwrap_or_default();
        writeln!(out, "[")?;
        for (i, seg) in items.iter().enumerate() {
            let comma = if i + 1 < items.len() { "," } else { "" };
            writeln!(out, "  {}{comma}", dsml::json_py::dumps(seg))?;
        }
        writeln!(out, "]")?;
    } else {
        out.write_all(prompt.to_string().as_bytes())?;
    }
    out.flush()?;
    Ok(0)
}
