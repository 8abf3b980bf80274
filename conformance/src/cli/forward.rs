//! `ds41 forward` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`ds41 forward` is not implemented yet")
}
