//! Negative controls: every injected defect must change what the reference
//! computes — end to end on the official_a checkpoint where the small model reaches the
//! mechanism, and on constructed inputs for the two that cannot show end to end
//! (candidate pin, top-k tie order).

mod model_common;
use model_common as common;

use ds41_engine::model::indexer::{candidate_mask, select};
use ds41_engine::model::topk::topk;
use ds41_engine::model::{Defect, DefectSet, IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceOptions};

fn run(model: &Model, ids: &[u32], options: Options) -> Trace {
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: false,
        },
    );
    let mut s = Session::new(model, options);
    s.prefill(&ids[..1], &mut trace).unwrap();
    for &t in &ids[1..] {
        s.decode(t, &mut trace).unwrap();
    }
    trace
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn every_defect_changes_the_official_a_run() {
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(up.join("official_a/meta.json")).unwrap()).unwrap();
    let ids: Vec<u32> = meta["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let base_opts = Options {
        numerics: Numerics::Upstream,
        index_k: IndexK::AsShipped,
        defects: DefectSet::none(),
    };
    let base = run(&model, &ids, base_opts.clone());
    let defects = [
        Defect::NoAttentionSink,
        Defect::NoInverseRope,
        Defect::PerHeadQueryNorm,
        Defect::RopeNonAdjacentPairs,
        Defect::RopeWrongDims,
        Defect::NoYarn,
        Defect::SinkhornIters(19),
        Defect::PreNotStaggered,
        Defect::BiasInRoutingWeights,
        Defect::NoSwigluClamp,
        Defect::IndexKHandoffWrong,
        Defect::Fp4TiesAwayFromEven,
    ];
    for d in defects {
        let damaged = run(
            &model,
            &ids,
            Options {
                defects: DefectSet::new([d]),
                ..base_opts.clone()
            },
        );
        let logits = max_abs(&base.logits, &damaged.logits);
        let hashes_differ = base.engram_hash != damaged.engram_hash;
        eprintln!("{d}: max |Δ logits| {logits:.3e}, Engram hashes differ: {hashes_differ}");
        assert!(
            logits > 1e-2 || hashes_differ,
            "defect {d} left the run unchanged"
        );
    }
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn engram_pad_not_latching_is_visible_with_a_dead_history_slot() {
    // In text-only runs only the sequence start blocks a shift, which latches by itself; a
    // DEAD slot (an image position) is where latching matters.
    let up = common::upstream();
    let model = common::official_a_model(&up);
    let h = model.engram_hasher().unwrap();
    // max_ngram 3: shifts 0, 1, 2. At position 3 shift 1 is DEAD; with the latch shift 2 is
    // padded too, without it shift 2 reads the live token 11 — the trigram columns differ.
    // At position 4 only shift 2 is DEAD: both agree.
    let history = [10, 11, ds41_engine::model::engram::DEAD, 12, 13];
    let cols = h.columns();
    let hash = |p: usize, d: DefectSet| {
        let mut out = vec![0i64; cols];
        h.hash(&history, p, 0, &d, &mut out);
        out
    };
    let latch = DefectSet::new([Defect::EngramPadNotLatching]);
    let (good, bad) = (hash(3, DefectSet::none()), hash(3, latch.clone()));
    let bigram = cols / 2;
    assert_eq!(good[..bigram], bad[..bigram]);
    assert_ne!(good[bigram..], bad[bigram..]);
    assert_eq!(hash(4, DefectSet::none()), hash(4, latch));
}

#[test]
fn candidate_pin_missing_is_visible_on_constructed_scores() {
    // Newest reachable position 9 (block 2 of 4-wide blocks) has a low score: the pin keeps it.
    let scores = [
        5.0,
        4.0,
        3.0,
        2.0,
        1.0,
        1.0,
        1.0,
        1.0,
        -3.0,
        -2.0,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
    ];
    let (good, _) = candidate_mask(&scores, 10, 4, 2, &DefectSet::none()).unwrap();
    let (bad, _) = candidate_mask(
        &scores,
        10,
        4,
        2,
        &DefectSet::new([Defect::CandidatePinMissing]),
    )
    .unwrap();
    assert!(good[8] && good[9] && !good[4]);
    assert!(!bad[8] && bad[4]);
}

#[test]
fn reversed_tie_rule_is_visible_on_constructed_scores() {
    let scores = [0.0, 1.0, 0.0, 0.0, -1.0];
    assert_eq!(topk(&scores, 2, false, "t").unwrap(), vec![1, 0]);
    assert_eq!(topk(&scores, 2, true, "t").unwrap(), vec![1, 3]);
    // The tie decides membership: the selection margin says so (0).
    let (list, margin) = select(&scores, 2, 5, &DefectSet::none()).unwrap();
    assert_eq!((list.to_vec(), margin), (vec![0, 1], 0.0));
    assert_eq!(
        select(&scores, 2, 5, &DefectSet::new([Defect::TopkTiesReversed]))
            .unwrap()
            .0
            .to_vec(),
        vec![1, 3]
    );
}

#[test]
fn fp4_ties_away_from_even_is_visible_on_constructed_blocks() {
    use ds41_engine::model::quant::{fp4_qdq_e4m3_ties, fp4_qdq_e8m0_ties, Fp4Ties};
    // Every e2m1 midpoint (and its negative) in a block whose largest magnitude is 6, so the
    // scale is exactly 1 for both QDQ flavours and the block rounds the midpoints themselves.
    let mids = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let to_even = [0.0f32, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0];
    let away = [0.5f32, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let block = |n: usize| {
        let mut b = vec![6.0f32; n];
        for (i, &m) in mids.iter().enumerate() {
            b[i] = m;
            b[n / 2 + i] = -m;
        }
        b
    };
    let check = |got: &[f32], want: &[f32], n: usize, what: &str| {
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(got[i], w, "{what}: +{}", mids[i]);
            assert_eq!(got[n / 2 + i], -w, "{what}: -{}", mids[i]);
        }
    };
    let undamaged = Fp4Ties::for_defects(&DefectSet::none());
    let damaged = Fp4Ties::for_defects(&DefectSet::new([Defect::Fp4TiesAwayFromEven]));
    assert_eq!(undamaged, Fp4Ties::ToEven);
    for (n, qdq) in [
        (32, fp4_qdq_e8m0_ties as fn(&mut [f32], Fp4Ties)),
        (16, fp4_qdq_e4m3_ties as fn(&mut [f32], Fp4Ties)),
    ] {
        let mut good = block(n);
        qdq(&mut good, undamaged);
        check(&good, &to_even, n, "reference (ties to even)");
        let mut bad = block(n);
        qdq(&mut bad, damaged);
        check(&bad, &away, n, "defect (ties away from zero)");
        // Off the midpoints the two rules agree.
        let mut a = vec![
            0.3f32, 1.1, 2.6, 4.9, -0.7, 6.0, 0.0, 1.0, 3.0, 5.5, -2.2, 0.1, 0.6, 1.6, 2.9, -6.0,
        ];
        a.resize(n, 0.4);
        let mut b = a.clone();
        qdq(&mut a, undamaged);
        qdq(&mut b, damaged);
        assert_eq!(a, b);
    }
}

#[test]
fn defect_names_round_trip() {
    for d in [
        Defect::NoYarn,
        Defect::SinkhornIters(7),
        Defect::TopkTiesReversed,
        Defect::GateTiesReversed,
        Defect::IndexKHandoffWrong,
    ] {
        assert_eq!(d.to_string().parse::<Defect>().unwrap(), d);
    }
    assert!("no-such-defect".parse::<Defect>().is_err());
}
