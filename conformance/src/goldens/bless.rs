//! `ds41 goldens bless`: re-run the command of every reference-engine golden (generator kind
//! `reference-engine`), show what changed, then rewrite the outputs and their records. Local
//! only: refused when `CI` is set — CI checks goldens, it never writes them. A dry run (also
//! what `goldens check --rerun` does) is allowed anywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::check::{list_files, materialise, CheckOptions};
use super::command;
use super::diff::{diff, Change};
use super::hashing::{sha256_bytes, sha256_path};
use super::provenance::{GeneratorKind, Location, Provenance, SIDECAR_SUFFIX};
use super::GoldenError;
use crate::interrupt::ScratchDir;

#[derive(Debug, Clone)]
pub struct BlessOptions {
    pub repo_root: PathBuf,
    pub goldens_dir: Option<PathBuf>,
    pub upstream: Option<PathBuf>,
    pub ds41: PathBuf,
    /// Only records whose path contains this string.
    pub filter: Option<String>,
    /// Compute and show the diff, write nothing.
    pub dry_run: bool,
    /// Whether the `CI` environment variable is set (bless refuses then).
    pub ci: bool,
}

#[derive(Debug)]
pub struct Blessed {
    pub sidecar: PathBuf,
    pub outputs: Vec<(PathBuf, Change)>,
    /// Inputs whose hash differs from the record (the reason outputs may have changed).
    pub inputs_changed: Vec<String>,
    pub record_changed: bool,
}

pub fn bless(opts: &BlessOptions) -> Result<Vec<Blessed>, GoldenError> {
    if opts.ci && !opts.dry_run {
        return Err(GoldenError::Refused(
            "refusing to bless: CI is set (goldens are regenerated locally and reviewed; CI only checks them)".into(),
        ));
    }
    let goldens_dir = opts
        .goldens_dir
        .clone()
        .unwrap_or_else(|| opts.repo_root.join("goldens"));
    let check_opts = CheckOptions {
        repo_root: opts.repo_root.clone(),
        goldens_dir: Some(goldens_dir.clone()),
        upstream: opts.upstream.clone(),
        release: super::release_snapshot_dir()?,
        deep: true,
        ds41: opts.ds41.clone(),
    };
    let mut results = Vec::new();
    let mut built = Built::new();
    for rel in list_files(&goldens_dir)?
        .into_iter()
        .filter(|r| r.ends_with(SIDECAR_SUFFIX))
    {
        if let Some(f) = &opts.filter {
            if !rel.contains(f.as_str()) {
                continue;
            }
        }
        let sidecar = goldens_dir.join(&rel);
        let record = Provenance::load(&sidecar)?;
        if record.generator.kind != GeneratorKind::ReferenceEngine {
            continue;
        }
        results.push(bless_one(
            &sidecar,
            record,
            &check_opts,
            opts.dry_run,
            &mut built,
        )?);
    }
    Ok(results)
}

/// Generated inputs already built in this run, by command: records sharing a checkpoint
/// (e.g. one `ds41 synth` for many traces) build it once.
type Built = BTreeMap<String, (ScratchDir, String)>;

fn bless_one(
    sidecar: &Path,
    mut record: Provenance,
    opts: &CheckOptions,
    dry_run: bool,
    built: &mut Built,
) -> Result<Blessed, GoldenError> {
    let mut paths = BTreeMap::new();
    let mut inputs_changed = Vec::new();
    for input in record.inputs.iter_mut() {
        let (path, hash) = match input.location {
            Location::Repo => {
                let p = opts.repo_root.join(&input.path);
                let h = sha256_path(&p)?;
                (p, h)
            }
            Location::Upstream => {
                let root = opts.upstream.as_ref().ok_or_else(|| {
                    GoldenError::Refused(format!(
                        "{}: input `{}` is upstream data: set DS41_UPSTREAM",
                        sidecar.display(),
                        input.name
                    ))
                })?;
                let p = root.join(&input.path);
                let h = sha256_path(&p)?;
                (p, h)
            }
            Location::Release => {
                let root = opts.release.as_ref().ok_or_else(|| {
                    GoldenError::Refused(format!(
                        "{}: input `{}` is a release file: {}",
                        sidecar.display(),
                        input.name,
                        crate::locations::no_release_reason()
                    ))
                })?;
                let p = root.join(&input.path);
                let h = sha256_path(&p)?;
                (p, h)
            }
            Location::External => {
                return Err(GoldenError::Field {
                    path: sidecar.to_path_buf(),
                    field: format!("inputs.{}.location", input.name),
                    reason: "a reference-engine golden cannot depend on an external input".into(),
                })
            }
            Location::Generated => {
                let key = format!("{}\n{}", input.name, input.command.as_deref().unwrap_or(""));
                if !built.contains_key(&key) {
                    let made = materialise(input, sidecar, opts)?;
                    built.insert(key.clone(), made);
                }
                let (tmp, h) = &built[&key];
                (tmp.path().join(&input.name), h.clone())
            }
        };
        if hash != input.sha256 {
            inputs_changed.push(format!(
                "{}: {} -> {}",
                input.name,
                short(&input.sha256),
                short(&hash)
            ));
            input.sha256 = hash;
        }
        paths.insert(input.name.clone(), path);
    }

    let out_dir =
        ScratchDir::new("ds41-goldens-").map_err(|e| GoldenError::io(&std::env::temp_dir(), e))?;
    let cmd =
        command::expand(&record.command, out_dir.path(), &paths, &opts.ds41).map_err(|reason| {
            GoldenError::Field {
                path: sidecar.to_path_buf(),
                field: "command".into(),
                reason,
            }
        })?;
    command::run(&cmd, &opts.repo_root, sidecar)?;

    let base = sidecar.parent().unwrap_or(Path::new("."));
    let mut outputs = Vec::new();
    for out in record.outputs.iter_mut() {
        let produced = out_dir.path().join(&out.path);
        let mut new = std::fs::read(&produced).map_err(|e| GoldenError::Command {
            path: sidecar.to_path_buf(),
            command: cmd.clone(),
            reason: format!("did not produce output `{}`: {e}", out.path),
        })?;
        let target = base.join(&out.path);
        let change = match std::fs::read(&target) {
            Ok(old) => {
                let change = diff(&out.path, &old, &new);
                if change.is_unchanged() {
                    new = old; // keep the committed bytes: no churn for an equivalent rewrite
                }
                change
            }
            Err(_) => Change::New,
        };
        if !dry_run && !change.is_unchanged() {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| GoldenError::io(parent, e))?;
            }
            std::fs::write(&target, &new).map_err(|e| GoldenError::io(&target, e))?;
        }
        out.sha256 = Some(sha256_bytes(&new));
        out.bytes = Some(new.len() as u64);
        outputs.push((target, change));
    }
    record.generator.name = ds41_engine::ENGINE_NAME.to_string();
    record.generator.version = ds41_engine::ENGINE_VERSION.to_string();
    let before = std::fs::read_to_string(sidecar).map_err(|e| GoldenError::io(sidecar, e))?;
    let after = record.to_json();
    let record_changed = before != after;
    if !dry_run && record_changed {
        record.save(sidecar)?;
    }
    Ok(Blessed {
        sidecar: sidecar.to_path_buf(),
        outputs,
        inputs_changed,
        record_changed,
    })
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}
