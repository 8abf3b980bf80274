//! `ds41 serve-adapter`: the built-in reference behind the JSON-lines protocol of
//! PROTOCOL.md on stdin/stdout, so the protocol is exercised by the suite itself and outside
//! harnesses can drive the reference. Diagnostics go to stderr only.

#[derive(clap::Args)]
pub struct Args {
    /// Inject a defect (negative controls).
    #[arg(long)]
    pub defect: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let mut engine = match &a.defect {
        None => ds41_conformance::reference::ReferenceEngine::new(),
        Some(d) => ds41_conformance::reference::ReferenceEngine::with_defect(d)?,
    };
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    ds41_conformance::protocol::serve(&mut engine, stdin, stdout)?;
    Ok(0)
}
