//! Test support (feature `test-support`): running one token sequence under different
//! prefill / decode / chunk schedules and locating where two traces first differ — the
//! schedule equalities of MODEL.md §7.3 and §8, shared by engine/tests/schedules.rs (official_a,
//! the WASTE container) and conformance/tests/forward_presets.rs (the synthetic presets).

use crate::model::{IndexK, Model, Numerics, Options, Session};
use crate::trace::{Trace, TraceOptions};

/// Default options with the given numerics and `index_k` behaviour.
pub fn options(numerics: Numerics, index_k: IndexK) -> Options {
    Options {
        numerics,
        index_k,
        ..Options::default()
    }
}

/// Run `ids` as consecutive chunks of the given sizes (the first is the prefill); a chunk of
/// one token after position 0 is a decode step. Panics (this is test code) when a step fails
/// or the chunks do not cover `ids` exactly.
pub fn run_chunks(model: &Model, ids: &[u32], chunks: &[usize], options: &Options) -> Trace {
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: false,
        },
    );
    let mut session = Session::new(model, options.clone());
    let mut at = 0;
    for &n in chunks {
        if n == 1 && at > 0 {
            session.decode(ids[at], &mut trace).unwrap();
        } else {
            session.prefill(&ids[at..at + n], &mut trace).unwrap();
        }
        at += n;
    }
    assert_eq!(
        at,
        ids.len(),
        "chunks {chunks:?} do not cover {} ids",
        ids.len()
    );
    trace
}

/// A prefill of `prefill` tokens followed by single-token decode steps up to `total`.
pub fn decode_schedule(prefill: usize, total: usize) -> Vec<usize> {
    std::iter::once(prefill)
        .chain(std::iter::repeat_n(1, total - prefill))
        .collect()
}

/// The first (token, layer) whose block output (`residual`) differs in any bit.
pub fn first_difference(a: &Trace, b: &Trace) -> Option<(usize, usize)> {
    let width = a.hc * a.dim;
    (0..a.tokens)
        .flat_map(|t| (0..a.n_layers).map(move |l| (t, l)))
        .find(|&(t, l)| {
            let cell = a.cell(t, l, width);
            a.residual[cell.clone()]
                .iter()
                .zip(&b.residual[cell])
                .any(|(x, y)| x.to_bits() != y.to_bits())
        })
}

/// The logits row of the last step.
pub fn last_logits(trace: &Trace) -> &[f32] {
    &trace.logits[trace.logits.len() - trace.vocab..]
}

/// Whether two rows are equal bit for bit (so −0 ≠ +0 and NaNs compare by payload).
pub fn bit_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The upstream data directory (`DS41_UPSTREAM`) for a test compiled with the `ds41_upstream`
/// cfg (build-support/external_data_cfg.rs): tests that need it carry
/// `#[cfg_attr(not(ds41_upstream), ignore = "...")]`, so this is only called when it was set
/// at build time. Unset now (a stale build) is a test failure saying so, never a pass.
pub fn upstream() -> std::path::PathBuf {
    external_dir("DS41_UPSTREAM", "upstream data (e.g. ../shared/upstream)")
}

/// The release snapshot (`DS41_RELEASE`: a Hugging Face snapshot directory of
/// DeepSeek-V4.1-Flash, or a data-only copy such as ../shared/release), for tests compiled
/// with the `ds41_release` cfg; see [`upstream`].
pub fn release() -> std::path::PathBuf {
    external_dir("DS41_RELEASE", "a DeepSeek-V4.1-Flash release snapshot")
}

fn external_dir(var: &str, what: &str) -> std::path::PathBuf {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => panic!(
            "{var} is not set, but this test was built with it: set {var} to {what} or rebuild \
             without it (then the test is reported as ignored)"
        ),
    }
}
