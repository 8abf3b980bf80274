//! Prefill / decode / chunked-prefill equalities (MODEL.md §7.3, §8) and
//! determinism across thread counts, on the official_a checkpoint (`DS41_UPSTREAM`) and on
//! WASTE's synthetic container (`waste-tiny` seed 0).

mod model_common;
use model_common as common;

use std::path::Path;

use ds41_engine::model::{IndexK, Model, Numerics};
use ds41_engine::testing::{
    bit_equal, decode_schedule as schedule, first_difference, last_logits, options, run_chunks,
};
use ds41_engine::trace::{Trace, TraceFile};

fn open_model(dir: &Path) -> Model {
    common::official_a_model(dir)
}

const WASTE_IDS: [u32; 16] = [3, 7, 11, 5, 19, 23, 2, 41, 8, 64, 17, 90, 4, 8, 200, 31];

fn ids(up: &Path) -> Vec<u32> {
    let g =
        TraceFile::read(&up.join("official_a/p48_d00/golden_prefill_only.safetensors")).unwrap();
    g.i64("input_ids")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as u32)
        .collect()
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn exact_owner_prefill_decode_chunked_are_bit_identical() {
    let up = common::upstream();
    let model = open_model(&up);
    let ids = ids(&up);
    let opts = options(Numerics::Exact, IndexK::Owner);
    let full = run_chunks(&model, &ids, &[48], &opts);
    // Chunk boundaries at n·r − 1, n·r, n·r + 1 and W ± 1 (r = 2, W = 8), plus pure decode.
    for chunks in [
        schedule(1, 48),
        schedule(5, 48),
        schedule(37, 48),
        vec![7, 9, 1, 1, 13, 2, 3, 12],
        vec![8, 1, 8, 31],
        vec![3, 4, 5, 36],
    ] {
        let other = run_chunks(&model, &ids, &chunks, &opts);
        assert_eq!(first_difference(&full, &other), None, "chunks {chunks:?}");
        assert_eq!(full.engram_hash, other.engram_hash);
        assert_eq!(full.experts, other.experts);
        for l in &full.index_layers {
            assert_eq!(full.topk[l], other.topk[l], "topk.L{l}, chunks {chunks:?}");
        }
        assert!(
            bit_equal(last_logits(&full), last_logits(&other)),
            "logits, chunks {chunks:?}"
        );
    }
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn upstream_owner_schedules_are_bit_identical_on_official_a() {
    // Window 8 + index_topk 8 fit in one 64-entry kernel block, so the list-layout exception of
    // MODEL.md §5.7 cannot show here: every schedule must agree bit for bit.
    let up = common::upstream();
    let model = open_model(&up);
    let ids = ids(&up);
    let opts = options(Numerics::Upstream, IndexK::Owner);
    let full = run_chunks(&model, &ids, &[48], &opts);
    for chunks in [
        schedule(1, 48),
        schedule(5, 48),
        schedule(37, 48),
        vec![7, 9, 1, 1, 13, 2, 3, 12],
    ] {
        let other = run_chunks(&model, &ids, &chunks, &opts);
        assert_eq!(first_difference(&full, &other), None, "chunks {chunks:?}");
    }
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn as_shipped_differs_exactly_where_model_md_8_says() {
    // official_a: ratio-2 owner = layer 2, index_topk 8. The shipped hand-off can only change
    // the output at even decode positions p with p div 2 > 8, i.e. from p = 18 on (§8.2).
    let up = common::upstream();
    let model = open_model(&up);
    let ids = ids(&up);
    for numerics in [Numerics::Exact, Numerics::Upstream] {
        let shipped = options(numerics, IndexK::AsShipped);
        let owner = options(numerics, IndexK::Owner);
        let prefill_shipped = run_chunks(&model, &ids, &[48], &shipped);
        let prefill_owner = run_chunks(&model, &ids, &[48], &owner);
        // Prefill: every owner emits, so both behaviours agree.
        assert_eq!(first_difference(&prefill_shipped, &prefill_owner), None);
        let decode_shipped = run_chunks(&model, &ids, &schedule(1, 48), &shipped);
        let decode_owner = run_chunks(&model, &ids, &schedule(1, 48), &owner);
        assert_eq!(first_difference(&decode_owner, &prefill_owner), None);
        // As shipped, token-at-a-time first departs at p = 18, in layer 2 (the owner).
        assert_eq!(
            first_difference(&decode_shipped, &decode_owner),
            Some((18, 2)),
            "{numerics}"
        );
        // Chunks of ≥ 2 tokens always contain an emitting position: equal to one prefill.
        let chunked = run_chunks(&model, &ids, &[7, 9, 2, 13, 2, 3, 12], &shipped);
        assert_eq!(first_difference(&chunked, &prefill_shipped), None);
    }
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn results_do_not_depend_on_the_thread_count() {
    let up = common::upstream();
    let model = open_model(&up);
    let ids = ids(&up);
    for numerics in [Numerics::Exact, Numerics::Upstream] {
        let opts = options(numerics, IndexK::AsShipped);
        let runs: Vec<Trace> = [1, 3]
            .iter()
            .map(|&n| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap();
                pool.install(|| run_chunks(&model, &ids, &schedule(20, 48), &opts))
            })
            .collect();
        assert_eq!(first_difference(&runs[0], &runs[1]), None);
        assert!(bit_equal(&runs[0].logits, &runs[1].logits));
    }
}

#[test]
fn waste_container_schedules() {
    // WASTE synthetic container: window 4, ratio-2 owner = layer 2, index_topk 4, so the
    // shipped hand-off first shows at the even decode position p = 10 (MODEL.md §8.2).
    let (_guard, container) = common::waste_container();
    let model = Model::open(&container).unwrap();
    let ids = WASTE_IDS;
    let n = ids.len();
    // Upstream numerics do not apply: q_lora_rank 48 is not a whole number of FP8 blocks.
    for numerics in [Numerics::Exact] {
        let owner = options(numerics, IndexK::Owner);
        let shipped = options(numerics, IndexK::AsShipped);
        let full = run_chunks(&model, &ids, &[n], &owner);
        for chunks in [
            schedule(1, n),
            schedule(3, n),
            vec![3, 1, 2, 5, 1, 4],
            vec![4, 5, 7],
        ] {
            let other = run_chunks(&model, &ids, &chunks, &owner);
            assert_eq!(
                first_difference(&full, &other),
                None,
                "{numerics} chunks {chunks:?}"
            );
        }
        let a = run_chunks(&model, &ids, &schedule(1, n), &shipped);
        let b = run_chunks(&model, &ids, &schedule(1, n), &owner);
        assert_eq!(first_difference(&a, &b), Some((10, 2)), "{numerics}");
        assert_eq!(
            first_difference(&run_chunks(&model, &ids, &[n], &shipped), &full),
            None
        );
    }
}
