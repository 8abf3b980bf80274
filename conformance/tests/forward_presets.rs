//! The reference forward pass on freshly generated synthetic presets, both
//! layouts: chunked prefill == one prefill == prefill + decode (exact + owner, bit for bit;
//! upstream + owner on the release layout, where window 8 + index_topk 8 fit one kernel
//! block), the as-shipped hand-off departing exactly at MODEL.md §8.2's position, and
//! thread-count determinism. Needs no upstream data.

use ds41_engine::checkpoint::Layout;
use ds41_engine::model::{IndexK, Model, Numerics};
use ds41_engine::testing::{
    bit_equal, decode_schedule as schedule, first_difference, last_logits, options,
    run_chunks as run,
};

fn generate(layout: Layout) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    ds41_synthetic::generate("tiny", layout, 7, &out).unwrap();
    let model = Model::open(&out).unwrap();
    (dir, model)
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 509 + 3).collect()
}

fn check_layout(layout: Layout, numerics_list: &[Numerics]) {
    let (_dir, model) = generate(layout);
    let n = 40;
    let ids = ids(n);
    for &numerics in numerics_list {
        let owner = options(numerics, IndexK::Owner);
        let shipped = options(numerics, IndexK::AsShipped);
        let full = run(&model, &ids, &[n], &owner);
        for chunks in [
            schedule(1, n),
            schedule(9, n),
            vec![7, 1, 8, 9, 2, 1, 12],
            vec![3, 4, 5, 28],
        ] {
            let other = run(&model, &ids, &chunks, &owner);
            assert_eq!(
                first_difference(&full, &other),
                None,
                "{layout:?} {numerics} chunks {chunks:?}"
            );
            assert!(bit_equal(last_logits(&full), last_logits(&other)));
        }
        // tiny: the ratio-2 owner is layer 1, index_topk 8 → first even p with p/2 > 8 is 18.
        let a = run(&model, &ids, &schedule(1, n), &shipped);
        let b = run(&model, &ids, &schedule(1, n), &owner);
        assert_eq!(
            first_difference(&a, &b),
            Some((18, 1)),
            "{layout:?} {numerics}"
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let single = pool.install(|| run(&model, &ids, &schedule(9, n), &shipped));
        let multi = run(&model, &ids, &schedule(9, n), &shipped);
        assert_eq!(first_difference(&single, &multi), None);
    }
}

#[test]
fn tiny_release_schedules() {
    check_layout(Layout::Release, &[Numerics::Exact, Numerics::Upstream]);
}

#[test]
fn tiny_container_schedules() {
    check_layout(Layout::Container, &[Numerics::Exact]);
}
