//! `ds41`: the command-line front end. Each subcommand lives in its own module under
//! `cli/`; this file only dispatches. Exit codes: 0 success / conformant, 1 a check or
//! comparison failed / non-conformant, 2 usage, input or harness error, 74 a memory-mapped
//! checkpoint file was truncated while in use (`ds41_engine::io::EXIT_MAPPED_FILE_CHANGED`;
//! one line on stderr names the file).

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ds41",
    version,
    about = "Make DeepSeek-V4.1-Flash implementations checkable"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Certify an engine against the conformance suite (default: the built-in reference on
    /// freshly generated synthetic checkpoints).
    Certify(cli::certify::Args),
    /// Describe a checkpoint directory: layout, config, layer roles, parameter counts.
    Inspect(cli::inspect::Args),
    /// Write a seeded synthetic checkpoint (or a mutant of one).
    Synth(cli::synth::Args),
    /// Run the reference forward pass and write a trace (safetensors).
    Forward(cli::forward::Args),
    /// Run the reference's DSpark draft head over a schedule and write a DSpark trace; with
    /// --replay, teacher-forced from a DSpark golden and judged against it.
    Dspark(cli::dspark::Args),
    /// Benchmark the reference engine (prefill/decode tokens/s, peak RSS) or its kernels.
    Bench(cli::bench::Args),
    /// Gates computed from an engine's outputs (`spec-window`: does speculation pay in bytes)
    /// or a conversion (`converter`: does a container hold the release's weights).
    Gate(cli::gate::Args),
    /// Convert a release checkpoint into a WASTE v0 container (the project's own converter).
    Convert(cli::convert::Args),
    /// Tokenize text with a tokenizer.json.
    Tokenize(cli::tokenize::Args),
    /// Write the wide tokenizer corpus (JSON lines).
    Corpus(cli::corpus::Args),
    /// Render a conversation to a DSML prompt.
    Render(cli::render::Args),
    /// Parse a DSML completion into a message.
    Parse(cli::parse::Args),
    /// Preprocess an image for the vision tower (patches + grid), exactly as the official code.
    Preprocess(cli::preprocess::Args),
    /// Serve the built-in reference over the JSON-lines engine protocol (PROTOCOL.md).
    ServeAdapter(cli::serve_adapter::Args),
    /// Check a certificate written by `ds41 certify --report DIR`.
    VerifyCertificate(cli::verify_certificate::Args),
    /// Check or regenerate the goldens and their provenance; list the errata register.
    Goldens(cli::goldens::Args),
}

/// Exit status of a process whose output pipe was closed (`ds41 ... | head`): what a shell
/// reports for a process ended by SIGPIPE, 128 + 13.
const BROKEN_PIPE_EXIT: i32 = 141;

/// `ds41 ... | head` must end quietly when the reader goes away. Rust ignores SIGPIPE, so a
/// write to the closed pipe fails with EPIPE: `println!` panics with "failed printing to
/// stdout", an explicit writer returns the error. Both end the process quietly here. (SIGPIPE
/// is not restored to its default action: the harness writes to engine subprocesses, and an
/// engine that dies must fail its case, not kill the run.)
fn exit_quietly_on_broken_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        default_hook(info);
    }));
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Certify(a) => cli::certify::run(a),
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Synth(a) => cli::synth::run(a),
        Command::Forward(a) => cli::forward::run(a),
        Command::Dspark(a) => cli::dspark::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Gate(a) => cli::gate::run(a),
        Command::Convert(a) => cli::convert::run(a),
        Command::Tokenize(a) => cli::tokenize::run(a),
        Command::Corpus(a) => cli::corpus::run(a),
        Command::Render(a) => cli::render::run(a),
        Command::Parse(a) => cli::parse::run(a),
        Command::Preprocess(a) => cli::preprocess::run(a),
        Command::ServeAdapter(a) => cli::serve_adapter::run(a),
        Command::VerifyCertificate(a) => cli::verify_certificate::run(a),
        Command::Goldens(a) => cli::goldens::run(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) if is_broken_pipe(&err) => std::process::exit(BROKEN_PIPE_EXIT),
        Err(err) => {
            eprintln!("ds41: error: {err:#}");
            std::process::exit(2);
        }
    }
}
