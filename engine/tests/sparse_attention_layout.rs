//! MODEL.md §5.7 / §7.3: the upstream sparse-attention list-layout exception, on a custom
//! synthetic model built to reach it.
//!
//! The upstream kernel walks a row's index list in 64-entry blocks with an online softmax and
//! bf16 probabilities, and −1 placeholders occupy list positions. A prefill row lists
//! `min(T, W)` window entries (−1s at the end), a decode row lists `W` (−1s at the front), and
//! the compressed entries follow. When `W + index_topk > 64` the list spans two kernel blocks,
//! so before the window is full the two layouts partition the same entries differently and
//! the upstream regime is not chunking-invariant: §7.3 promises prefill(N) + decode(1) ==
//! prefill(N + 1) bit for bit only once the window is full (N ≥ W). The exact regime has no
//! list layout and stays bit-identical everywhere (with the owner hand-off).
//!
//! The model is the `tiny` preset with window 64, index_topk 64 and 16 heads (decode lists of
//! 64 + min(64, p + 1) entries on its ratio-1 layers: the window block and the compressed
//! block are separate kernel blocks, where a short prefill row holds both in one). Needs no
//! upstream data.

use ds41_engine::model::{IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceOptions};
use ds41_synthetic::preset::Preset;

const WINDOW: usize = 64;
const INDEX_TOPK: usize = 64;
const TOKENS: usize = 72;
const HEADS: usize = 16;
const _: () = assert!(
    WINDOW + INDEX_TOPK > 64,
    "the lists must span two kernel blocks"
);

fn generate() -> (tempfile::TempDir, Model) {
    let mut preset = Preset::by_name("tiny").expect("tiny preset");
    preset.geometry.window_size = WINDOW;
    preset.geometry.index_topk = INDEX_TOPK;
    preset.geometry.n_heads = HEADS;
    let dir = tempfile::tempdir().unwrap();
    ds41_synthetic::release::write(&preset, 5, dir.path()).unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(model.config().window_size, WINDOW);
    assert_eq!(model.config().index_topk, INDEX_TOPK);
    (dir, model)
}

fn ids() -> Vec<u32> {
    (0..TOKENS as u32).map(|i| (i * 53 + 7) % 509 + 3).collect()
}

/// The trace of running `ids` as `chunks` (the first a prefill at 0; a 1-token chunk after 0
/// decodes).
fn run(model: &Model, ids: &[u32], chunks: &[usize], options: &Options) -> Trace {
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: false,
        },
    );
    let mut s = Session::new(model, options.clone());
    let mut at = 0;
    for &n in chunks {
        if n == 1 && at > 0 {
            s.decode(ids[at], &mut trace).unwrap();
        } else {
            s.prefill(&ids[at..at + n], &mut trace).unwrap();
        }
        at += n;
    }
    assert_eq!(at, ids.len());
    trace
}

/// First token whose block outputs (any layer) or last-row logits differ in any bit.
fn first_difference(a: &Trace, b: &Trace) -> Option<usize> {
    let w = a.n_layers * a.hc * a.dim;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let residual = (0..a.tokens)
        .find(|&t| bits(&a.residual[t * w..(t + 1) * w]) != bits(&b.residual[t * w..(t + 1) * w]));
    let last = |t: &Trace| bits(&t.logits[t.logits.len() - t.vocab..]);
    residual.or((last(a) != last(b)).then_some(a.tokens - 1))
}

fn decode_after(prefill: usize) -> Vec<usize> {
    std::iter::once(prefill)
        .chain(std::iter::repeat_n(1, TOKENS - prefill))
        .collect()
}

fn options(numerics: Numerics) -> Options {
    Options {
        numerics,
        index_k: IndexK::Owner,
        ..Options::default()
    }
}

#[test]
fn upstream_layout_exception_before_the_window_is_full() {
    let (_dir, model) = generate();
    let ids = ids();
    let full_steps = [
        decode_after(WINDOW),
        decode_after(WINDOW + 3),
        vec![WINDOW + 1, 2, 5],
    ];
    // Chunks before the window is full (p < W − 1 = 63): a prefill of T < W tokens lists
    // T + min(K, T) entries per row, one prefill of all tokens W + K, a decode row W + min(K,
    // p + 1): the 64-entry blocks partition the same valid entries differently.
    let early = [
        decode_after(20),
        vec![20, 1, 1, 1, 1, 1, 10, 1, 1, 1, 1, 1, 32],
    ];
    let up = options(Numerics::Upstream);
    let full = run(&model, &ids, &[TOKENS], &up);
    // Every chunk boundary at or past W: every row lists W window entries; bit-identical.
    for chunks in &full_steps {
        let other = run(&model, &ids, chunks, &up);
        assert_eq!(
            first_difference(&full, &other),
            None,
            "upstream, chunks {chunks:?}"
        );
    }
    // Decode steps before the window is full: the 64-entry kernel blocks partition the lists
    // differently, and the upstream regime departs there, and only there.
    for chunks in &early {
        let other = run(&model, &ids, chunks, &up);
        let t = first_difference(&full, &other);
        eprintln!("upstream, chunks {chunks:?}: first difference at token {t:?}");
        assert!(
            t.is_some_and(|t| t < WINDOW - 1),
            "upstream, chunks {chunks:?}: expected a departure before the window is full \
             (p < {}), got {t:?}",
            WINDOW - 1
        );
    }
    // Sharper: prefill(N) + decode(1) against prefill(N + 1) with N + 1 + min(K, N + 1) ≤ 64,
    // so every prefill row is one kernel block and the rows before N agree; the decode row
    // (W window entries with placeholders in front, then the compressed list: two blocks)
    // departs at exactly position N.
    for n in [20, 30] {
        let a = run(&model, &ids[..n + 1], &[n, 1], &up);
        let b = run(&model, &ids[..n + 1], &[n + 1], &up);
        assert_eq!(
            first_difference(&a, &b),
            Some(n),
            "upstream, prefill({n}) + decode"
        );
    }
    // The exact regime has no list layout: bit-identical on every schedule.
    let exact = options(Numerics::Exact);
    let full = run(&model, &ids, &[TOKENS], &exact);
    for chunks in full_steps
        .iter()
        .chain(&early)
        .chain([&vec![7, 9, 1, 1, 13, 2, 3, 36]])
    {
        let other = run(&model, &ids, chunks, &exact);
        assert_eq!(
            first_difference(&full, &other),
            None,
            "exact, chunks {chunks:?}"
        );
    }
}

#[test]
fn lists_within_one_kernel_block_do_not_depart() {
    // Control: the same early schedules with W + index_topk ≤ 64 (window 40, index_topk 24)
    // stay bit-identical in the upstream regime, so the departure above is the 64-block
    // partition and nothing else.
    let mut preset = Preset::by_name("tiny").expect("tiny preset");
    preset.geometry.window_size = 40;
    preset.geometry.index_topk = 24;
    let dir = tempfile::tempdir().unwrap();
    ds41_synthetic::release::write(&preset, 5, dir.path()).unwrap();
    let model = Model::open(dir.path()).unwrap();
    let ids = ids();
    let up = options(Numerics::Upstream);
    let full = run(&model, &ids, &[TOKENS], &up);
    for chunks in [
        decode_after(20),
        vec![20, 1, 1, 1, 1, 1, 10, 1, 1, 1, 1, 1, 32],
    ] {
        let other = run(&model, &ids, &chunks, &up);
        assert_eq!(
            first_difference(&full, &other),
            None,
            "upstream, chunks {chunks:?}"
        );
    }
}
