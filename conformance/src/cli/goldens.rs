//! `ds41 goldens check|bless|errata` — goldens with provenance (goldens/README.md).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Subcommand;

use ds41_conformance::goldens::bless::{bless, BlessOptions};
use ds41_conformance::goldens::{self, check, CheckOptions, Errata, Status};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Args)]
struct Common {
    /// Repository root (default: found upward from the current directory).
    #[arg(long)]
    repo: Option<PathBuf>,
    /// Upstream data directory (default: $DS41_UPSTREAM).
    #[arg(long)]
    upstream: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Action {
    /// Verify every golden's provenance record: output and input sha256, coverage, errata ids.
    Check {
        #[command(flatten)]
        common: Common,
        /// Also rebuild generated inputs (e.g. `ds41 synth` checkpoints) and compare hashes.
        #[arg(long)]
        deep: bool,
        /// Also re-run every reference-engine golden's command and fail where the output
        /// differs from the committed golden (the engine changed: review, then bless).
        #[arg(long)]
        rerun: bool,
        /// Print passing items too.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Regenerate the reference-engine goldens, print what changed, rewrite them (not in CI).
    Bless {
        #[command(flatten)]
        common: Common,
        /// Only records whose path contains this string.
        #[arg(long)]
        filter: Option<String>,
        /// Show the diff without writing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// List the errata register (goldens/errata.yaml).
    Errata {
        #[command(flatten)]
        common: Common,
        /// Print the register as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn repo_root(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match flag {
        Some(p) => Ok(p),
        None => {
            let cwd = std::env::current_dir().context("current directory")?;
            goldens::find_repo_root(&cwd).with_context(|| {
                format!(
                    "no repository root (a directory with goldens/ and Cargo.toml) above {}; pass --repo",
                    cwd.display()
                )
            })
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let ds41 = std::env::current_exe().context("locating the ds41 binary")?;
    match args.action {
        Action::Check {
            common,
            deep,
            rerun,
            verbose,
        } => {
            let root = repo_root(common.repo)?;
            let opts = CheckOptions {
                repo_root: root.clone(),
                goldens_dir: None,
                upstream: common.upstream.or_else(goldens::upstream_from_env),
                release: goldens::release_snapshot_dir()?,
                deep,
                ds41,
            };
            let mut report = check(&opts)?;
            if rerun {
                goldens::check::rerun_reference(&opts, &mut report)?;
            }
            for f in &report.findings {
                if f.status != Status::Ok || verbose {
                    let mut shown = f.clone();
                    if let Ok(rel) = f.subject.strip_prefix(&root) {
                        shown.subject = rel.to_path_buf();
                    }
                    println!("{shown}");
                }
            }
            let failed = report.count(Status::Fail);
            println!(
                "goldens check: {} golden file(s), {} record(s): {} ok, {} failed, {} skipped",
                report.goldens,
                report.records,
                report.count(Status::Ok),
                failed,
                report.count(Status::Skip)
            );
            Ok(if failed == 0 { 0 } else { 1 })
        }
        Action::Bless {
            common,
            filter,
            dry_run,
        } => {
            let opts = BlessOptions {
                repo_root: repo_root(common.repo)?,
                goldens_dir: None,
                upstream: common.upstream.or_else(goldens::upstream_from_env),
                ds41,
                filter,
                dry_run,
                ci: std::env::var_os("CI").is_some_and(|v| !v.is_empty()),
            };
            let results = bless(&opts)?;
            if results.is_empty() {
                bail!("no reference-engine golden matched; nothing to bless");
            }
            let mut changed = 0;
            for r in &results {
                println!("{}", r.sidecar.display());
                for i in &r.inputs_changed {
                    println!("  input changed: {i}");
                }
                for (path, change) in &r.outputs {
                    if !change.is_unchanged() {
                        changed += 1;
                    }
                    let name = path.file_name().unwrap_or_default().to_string_lossy();
                    print!("  {name}: {change}");
                    if !change.to_string().ends_with('\n') {
                        println!();
                    }
                }
            }
            println!(
                "goldens bless: {} record(s), {changed} output(s) changed{}",
                results.len(),
                if dry_run {
                    " (dry run: nothing written)"
                } else {
                    ""
                }
            );
            Ok(0)
        }
        Action::Errata { common, json } => {
            let root = repo_root(common.repo)?;
            let errata = Errata::load(&root.join("goldens/errata.yaml"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&errata)?);
            } else {
                for e in &errata.errata {
                    let names: Vec<_> = e.behaviours.iter().map(|b| b.name.as_str()).collect();
                    println!(
                        "{:<27} {:<17} default {:<16} [{}]  {}",
                        e.id,
                        e.class.as_str(),
                        e.default,
                        names.join("|"),
                        e.title
                    );
                }
            }
            Ok(0)
        }
    }
}
