//! `ds41 synth`: write a seeded synthetic checkpoint (or a mutant of one) — issue 3.
//!
//! `ds41 synth --preset P --layout release|container --seed S --out DIR [--mutant NAME] [--force]`
//! `ds41 synth --list` prints the presets and mutants (with the error each mutant must provoke).

use anyhow::Context;
use ds41_synthetic::{list_mutants, list_presets, Layout, Options};
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LayoutArg {
    Release,
    Container,
}

#[derive(clap::Args)]
pub struct Args {
    /// Preset name (`ds41 synth --list` shows them).
    #[arg(long, required_unless_present = "list")]
    preset: Option<String>,
    /// On-disk layout to write.
    #[arg(long, value_enum, default_value = "release")]
    layout: LayoutArg,
    /// Seed of the random streams (same preset, layout and seed give the same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory (created if missing; must be empty unless --force).
    #[arg(long, required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Remove or corrupt one thing (see --list).
    #[arg(long)]
    mutant: Option<String>,
    /// Replace a previous synthetic checkpoint in --out. Only files listed in its
    /// ds41-synthetic.json are removed; anything else there is kept.
    #[arg(long)]
    force: bool,
    /// List presets and mutants, then exit.
    #[arg(long)]
    list: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.list {
        println!("presets:");
        for p in list_presets() {
            let large = if p.large { " [large]" } else { "" };
            println!("  {:<14}{large} {}", p.name, p.description);
        }
        println!("mutants (layout: expected refusal):");
        for m in list_mutants() {
            let layouts: Vec<&str> = m
                .layouts
                .iter()
                .map(|l| match l {
                    Layout::Release => "release",
                    Layout::Container => "container",
                })
                .collect();
            println!(
                "  {:<24} [{}] {} -> {}",
                m.name,
                layouts.join(","),
                m.description,
                m.expect
            );
        }
        return Ok(0);
    }
    let (Some(preset), Some(out)) = (args.preset, args.out) else {
        anyhow::bail!("--preset and --out are required");
    };
    let layout = match args.layout {
        LayoutArg::Release => Layout::Release,
        LayoutArg::Container => Layout::Container,
    };
    let generated = ds41_synthetic::generate_with(&Options {
        preset: preset.clone(),
        layout,
        seed: args.seed,
        out_dir: out.clone(),
        mutant: args.mutant.clone(),
        force: args.force,
    })
    .with_context(|| format!("writing preset `{preset}` to {}", out.display()))?;
    let what = args
        .mutant
        .map(|m| format!(" (mutant {m})"))
        .unwrap_or_default();
    println!(
        "wrote {} files for preset {preset}{what}, seed {} to {}",
        generated.files.len(),
        args.seed,
        generated.dir.display()
    );
    if !generated.kept.is_empty() {
        println!(
            "kept files not written by ds41 synth: {}",
            generated.kept.join(", ")
        );
    }
    Ok(0)
}
