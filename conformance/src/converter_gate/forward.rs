//! Forward agreement of the two layouts: the reference runs the release and the container on
//! the same tokens (exact numerics, so the only difference is the container's quantisation),
//! and the container's traces are compared with the release's as an engine's with a golden,
//! by the harness's own comparisons in a tolerance profile (`gates/<profile>.yaml`, normally
//! `quantized`):
//! * teacher-forced replay (`compare::compare_replay`): every block of the container
//!   recomputed from the release's own block inputs, so each (token, layer) cell shows the
//!   quantisation's local effect, nothing cascades and every cell is compared;
//! * end to end (`compare::compare`): logits rows, residual cells and decisions with the
//!   profile's fragile-flip excuse (an excused flip excludes what it feeds, so on a model with
//!   a near-tied early decision this may compare little; the replay always compares all).

use std::path::Path;

use ds41_engine::model::{ForwardJob, IndexK, Numerics, Options, TokenMap};
use ds41_engine::trace::TraceFile;
use ds41_synthetic::rng::SplitMix64;
use serde::Serialize;

use crate::compare::{compare as compare_traces, compare_replay, CompareReport};
use crate::gates::Gates;

#[derive(Debug, Clone, Serialize)]
pub struct ForwardReport {
    pub profile: String,
    pub tokens: Vec<u32>,
    pub prefill: usize,
    pub replay: CompareReport,
    pub end_to_end: CompareReport,
    /// Whether `end_to_end` counts in the verdict (`gates/converter.yaml`).
    pub end_to_end_judged: bool,
    /// Why `replay` does not count in the verdict, when it does not.
    pub replay_not_judged: Option<String>,
    /// One line per failing metric (the first divergence first).
    pub failures: Vec<String>,
}

/// The gate's token ids: `n` ids below `vocab` from a fixed seed.
pub fn gate_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut r = SplitMix64::for_object(0, "converter-gate:tokens");
    (0..n).map(|_| r.below(vocab as u64) as u32).collect()
}

fn run(
    model: &Path,
    tokens: &[u32],
    prefill: usize,
    replay: Option<&Path>,
) -> anyhow::Result<TraceFile> {
    let job = ForwardJob {
        model: model.to_path_buf(),
        tokens: tokens.to_vec(),
        prefill: Some(prefill),
        options: Options {
            numerics: Numerics::Exact,
            index_k: IndexK::AsShipped,
            ..Options::default()
        },
        token_map: TokenMap::FromCheckpoint,
        replay: replay.map(Path::to_path_buf),
        load_state: None,
        save_state: None,
        sub_ops: true,
        images: Vec::new(),
    };
    let trace = job
        .run()
        .map_err(|e| anyhow::anyhow!("forward on {}: {e}", model.display()))?
        .trace;
    Ok(TraceFile::from_bytes(&trace.to_bytes()?, model)?)
}

pub fn compare(
    release: &Path,
    container: &Path,
    tokens: &[u32],
    prefill: usize,
    gates: &Gates,
    judge_end_to_end: bool,
    replay_not_judged: Option<String>,
) -> anyhow::Result<ForwardReport> {
    let golden = run(release, tokens, prefill, None)?;
    let dir = crate::interrupt::ScratchDir::new("ds41-converter-gate-")?;
    let golden_path = dir.path().join("release.safetensors");
    golden.write(&golden_path)?;
    let forced = run(container, &[], prefill, Some(&golden_path))?;
    let engine = run(container, tokens, prefill, None)?;
    let replay = compare_replay(&golden, &forced, gates);
    let end_to_end = compare_traces(&golden, &engine, gates);
    let mut failures = Vec::new();
    let judged = [
        ("replay", &replay, replay_not_judged.is_none()),
        ("end to end", &end_to_end, judge_end_to_end),
    ];
    for (what, c, _) in judged.iter().filter(|j| j.2) {
        if c.failed() {
            failures.extend(
                c.failure_summary()
                    .lines()
                    .map(|l| format!("forward {what} ({} profile): {l}", gates.profile)),
            );
        }
    }
    Ok(ForwardReport {
        profile: gates.profile.to_string(),
        tokens: tokens.to_vec(),
        prefill,
        replay,
        end_to_end,
        end_to_end_judged: judge_end_to_end,
        replay_not_judged,
        failures,
    })
}
