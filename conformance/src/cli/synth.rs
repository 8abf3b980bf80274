//! `ds41 synth`: write a seeded synthetic checkpoint (or a mutant of one).
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
    /// Replace a `text_config` key of the preset's release config.json, the value as JSON
    /// (repeatable; e.g. `--set hc_mult=2 --set 'compress_ratios=[0,2,0,2,1,1]'`): the preset
    /// at a geometry of your choosing. Derived keys (Engram rows, compressed vocabulary) are
    /// recomputed.
    #[arg(long = "set", value_name = "KEY=JSON", value_parser = parse_override)]
    overrides: Vec<(String, serde_json::Value)>,
    /// List presets and mutants, then exit.
    #[arg(long)]
    list: bool,
}

fn parse_override(arg: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}`: expected KEY=JSON"))?;
    let value = serde_json::from_str(value)
        .map_err(|e| format!("`{key}`: the value `{value}` is not JSON ({e})"))?;
    Ok((key.to_string(), value))
}

/// `--list`: presets (with what they reach) and mutants (with the refusal each must provoke).
/// A closed pipe (`ds41 synth --list | head`) ends the listing quietly.
fn print_list() -> anyhow::Result<i32> {
    use std::fmt::Write as _;
    let mut out = String::from("presets:\n");
    for p in list_presets() {
        let large = if p.large { " [large]" } else { "" };
        let layouts: Vec<&str> = p.layouts.iter().map(|&l| layout_name(l)).collect();
        writeln!(
            out,
            "  {:<14}{large} [{}] {}",
            p.name,
            layouts.join(","),
            p.description
        )?;
        writeln!(out, "  {:<14} reaches: {}", "", p.reach)?;
    }
    out.push_str("mutants (layout: expected refusal):\n");
    for m in list_mutants() {
        let layouts: Vec<&str> = m.layouts.iter().map(|&l| layout_name(l)).collect();
        writeln!(
            out,
            "  {:<24} [{}] {} -> {}",
            m.name,
            layouts.join(","),
            m.description,
            m.expect
        )?;
    }
    match std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

fn layout_name(l: Layout) -> &'static str {
    match l {
        Layout::Release => "release",
        Layout::Container => "container",
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.list {
        return print_list();
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
        overrides: args.overrides.clone(),
    })
    .with_context(|| format!("writing preset `{preset}` to {}", out.display()))?;
    let mut what = args
        .mutant
        .map(|m| format!(" (mutant {m})"))
        .unwrap_or_default();
    for (key, value) in &args.overrides {
        what += &format!(" {key}={value}");
    }
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
