//! `ds41 synth` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`ds41 synth` is not implemented yet")
}
