//! The converter gate (`ds41 gate converter --release R --container C`): certifies that a
//! WASTE v0 container made by any converter holds the release's model.
//!
//! 1. Accounting ([`accounting`]): every release tensor renamed into the container
//!    (CONTAINER.md §8) or deliberately dropped (MTP stages, `.scale` companions); nothing
//!    unrenamed, missing, extra or reshaped. Read from the manifest, so a container the reader
//!    refuses is still accounted for.
//! 2. Config: the container's config states the release's model (every field the engine
//!    reads; the pad is compared as a compressed id in step 4, and MTP stages may be dropped).
//! 3. Round trip ([`roundtrip`]): per tensor (per expert matrix), the container's dequantised
//!    values against the release's exact dequantisation, judged by the container's storage;
//!    every expert record's CRC-32 is checked as it is decoded.
//! 4. Engram ([`engram`]): token map and hash constants identical, tables within their
//!    quantisation.
//! 5. Forward ([`forward`]): the two layouts' reference forwards agree in a tolerance profile
//!    (teacher-forced replay judged; end to end judged when `gates/converter.yaml` says so).
//!
//! Thresholds: `gates/converter.yaml` ([`thresholds`]). Every failure line names the tensor,
//! file or field.

pub mod accounting;
pub mod engram;
pub mod forward;
pub mod roundtrip;
pub mod thresholds;

use std::path::{Path, PathBuf};

use anyhow::Context;
use ds41_engine::checkpoint::container::ContainerOptions;
use ds41_engine::checkpoint::{self, Checkpoint, ContainerCheckpoint, Layout};
use serde::Serialize;
use serde_json::Value;

use crate::gates::Gates;
use accounting::Accounting;
use engram::{EngramReport, EngramSteps};
use forward::ForwardReport;
use roundtrip::{ExpertSummary, FormatSummary, TensorError};
pub use thresholds::ConverterGates;

/// What the gate found.
#[derive(Debug, Clone, Serialize)]
pub struct ConverterReport {
    pub release: PathBuf,
    pub container: PathBuf,
    pub accounting: Accounting,
    /// The container reader's refusal, when it refused.
    pub container_refused: Option<String>,
    /// Config fields that differ: (field, release, container).
    pub config_differences: Vec<(String, String, String)>,
    pub formats: Vec<FormatSummary>,
    pub experts: Option<ExpertSummary>,
    pub tensors: Vec<TensorError>,
    pub engram: EngramReport,
    pub forward: Option<ForwardReport>,
    /// Every failure, one line each, naming what failed.
    pub failures: Vec<String>,
    pub pass: bool,
}

/// Config fields a conversion may legitimately change: the pad becomes a compressed id
/// (compared with the token map, [`engram`]), and the MTP stages may be dropped (with them
/// the DSpark arguments, CONTAINER.md §8).
const CONFIG_EXEMPT: &[&str] = &[
    "engram_pad_id",
    "engram_pad_is_compressed",
    "n_mtp_layers",
    "dspark",
];

fn config_differences(
    release: &dyn Checkpoint,
    container: &dyn Checkpoint,
) -> Vec<(String, String, String)> {
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) = (
        serde_json::to_value(release.config()),
        serde_json::to_value(container.config()),
    ) else {
        return vec![("config".into(), "?".into(), "?".into())];
    };
    a.iter()
        .filter(|(k, _)| !CONFIG_EXEMPT.contains(&k.as_str()))
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, v)| {
            (
                k.clone(),
                v.to_string(),
                b.get(k).map_or("absent".into(), Value::to_string),
            )
        })
        .collect()
}

/// Run the gate. `Err` is bad input (a release that does not open, a container directory
/// without a readable manifest); a container that converts badly is a report with failures.
/// `forward`: the tolerance profile of step 5 (`None` skips it).
pub fn run(
    release_dir: &Path,
    container_dir: &Path,
    g: &ConverterGates,
    forward: Option<&Gates>,
) -> anyhow::Result<ConverterReport> {
    let release = checkpoint::open(release_dir)
        .with_context(|| format!("opening the release {}", release_dir.display()))?;
    if release.layout() != Layout::Release {
        anyhow::bail!(
            "{}: --release must be a release checkpoint (this is a WASTE container)",
            release_dir.display()
        );
    }
    // Before the manifest is read: a release given as --container is named as such.
    if checkpoint::detect_layout(container_dir).ok() == Some(Layout::Release) {
        anyhow::bail!(
            "{}: --container must be a WASTE container (manifest.json)",
            container_dir.display()
        );
    }
    let manifest_path = container_dir.join("manifest.json");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(&manifest_path)
            .with_context(|| format!("reading {}", manifest_path.display()))?,
    )
    .with_context(|| format!("{}: not JSON", manifest_path.display()))?;

    let mut notes = Vec::new();
    let (placed, extra) =
        accounting::manifest_places(&manifest, release.config().n_routed_experts, &mut notes);
    let accounting = accounting::account(release.as_ref(), &placed, extra);
    let mut failures = accounting.failures();
    failures.extend(
        notes
            .into_iter()
            .map(|n| format!("{}: {n}", manifest_path.display())),
    );

    let mut report = ConverterReport {
        release: release_dir.to_path_buf(),
        container: container_dir.to_path_buf(),
        accounting,
        container_refused: None,
        config_differences: Vec::new(),
        formats: Vec::new(),
        experts: None,
        tensors: Vec::new(),
        engram: EngramReport::default(),
        forward: None,
        failures: Vec::new(),
        pass: false,
    };
    // Every expert record's CRC-32 is checked as it is decoded (WASTE_VERIFY=1).
    let opened =
        ContainerCheckpoint::open_with(container_dir, ContainerOptions { verify_crc: true });
    let container: Box<dyn Checkpoint> = match opened {
        Ok(c) => Box::new(c),
        Err(e) => {
            let why = format!(
                "the container reader refuses {}: {e}",
                container_dir.display()
            );
            failures.push(why.clone());
            report.container_refused = Some(why);
            report.failures = failures;
            return Ok(report);
        }
    };

    report.config_differences = config_differences(release.as_ref(), container.as_ref());
    for (k, a, b) in &report.config_differences {
        failures.push(format!("manifest config `{k}`: container {b}, release {a}"));
    }

    let (steps, bits) = EngramSteps::open(container_dir, &manifest);
    report.tensors = roundtrip::round_trip(
        release.as_ref(),
        container.as_ref(),
        &report.accounting.paired,
        &bits,
        &steps,
        g,
    );
    report.formats = roundtrip::summarise(&report.tensors);
    report.experts = roundtrip::expert_summary(&report.tensors);
    failures.extend(
        report
            .tensors
            .iter()
            .filter_map(|t| t.failure.as_ref().map(|f| format!("`{}`: {f}", t.name))),
    );

    report.engram = engram::check(release.as_ref(), release_dir, container.as_ref());
    failures.extend(report.engram.failures.iter().cloned());

    if let Some(profile) = forward {
        let cfg = release.config();
        let tokens = forward::gate_tokens(g.forward.tokens, cfg.vocab_size);
        let low_bit: Vec<&str> = report
            .tensors
            .iter()
            .filter(|t| t.format == "Q4G" || t.format == "Q3G")
            .map(|t| t.name.as_str())
            .collect();
        let replay_not_judged = (!low_bit.is_empty() && !g.forward.judge_replay_low_bit_trunk)
            .then(|| {
                format!(
                    "{} trunk tensors at 4 or 3 bits (first `{}`): the replay limits are set for \
                     an F32 / Q8G trunk; the round trip judges these weights",
                    low_bit.len(),
                    low_bit[0]
                )
            });
        match forward::compare(
            release_dir,
            container_dir,
            &tokens,
            g.forward.prefill,
            profile,
            g.forward.judge_end_to_end,
            replay_not_judged,
        ) {
            Ok(f) => {
                failures.extend(f.failures.iter().cloned());
                report.forward = Some(f);
            }
            Err(e) => failures.push(format!("forward: {e:#}")),
        }
    }
    report.pass = failures.is_empty();
    report.failures = failures;
    Ok(report)
}
