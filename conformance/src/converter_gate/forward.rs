//! Forward agreement of the two layouts: the reference runs the release and the container on
//! the same tokens (exact numerics, so the only difference is the container's quantisation),
//! and the container's trace is compared with the release's as an engine's trace with a
//! golden, by the harness's own comparison (`compare::compare`) in a tolerance profile
//! (`gates/<profile>.yaml`, normally `quantized`): logits rows, per-layer residual cells, the
//! discrete decisions with the profile's fragile-flip excuse.

use std::path::Path;

use ds41_engine::model::{ForwardJob, IndexK, Numerics, Options, TokenMap};
use ds41_engine::trace::TraceFile;
use ds41_synthetic::rng::SplitMix64;
use serde::Serialize;

use crate::compare::{compare as compare_traces, CompareReport};
use crate::gates::Gates;

#[derive(Debug, Clone, Serialize)]
pub struct ForwardReport {
    pub profile: String,
    pub tokens: Vec<u32>,
    pub prefill: usize,
    pub comparison: CompareReport,
    /// One line per failing metric (the first divergence first).
    pub failures: Vec<String>,
}

/// The gate's token ids: `n` ids below `vocab` from a fixed seed.
pub fn gate_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut r = SplitMix64::for_object(0, "converter-gate:tokens");
    (0..n).map(|_| r.below(vocab as u64) as u32).collect()
}

fn run(model: &Path, tokens: &[u32], prefill: usize) -> anyhow::Result<TraceFile> {
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
        replay: None,
        load_state: None,
        save_state: None,
        sub_ops: true,
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
) -> anyhow::Result<ForwardReport> {
    let golden = run(release, tokens, prefill)?;
    let engine = run(container, tokens, prefill)?;
    let comparison = compare_traces(&golden, &engine, gates);
    let failures = if comparison.failed() {
        comparison
            .failure_summary()
            .lines()
            .map(|l| format!("forward ({} profile): {l}", gates.profile))
            .collect()
    } else {
        Vec::new()
    };
    Ok(ForwardReport {
        profile: gates.profile.to_string(),
        tokens: tokens.to_vec(),
        prefill,
        comparison,
        failures,
    })
}
