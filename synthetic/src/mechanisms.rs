//! Which mechanisms a prefill of `prefill` tokens followed by `decode` single-token steps
//! reaches, computed from the geometry alone (MODEL.md §6.4, §7.2, §11.1). The
//! data-dependent ones (every expert chosen, both SwiGLU clamps firing, attention not
//! uniform) need the forward pass; see the tests in `tests/reach.rs`.

use crate::preset::Geometry;

/// One structural mechanism and whether the schedule reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    pub mechanism: &'static str,
    pub reached: bool,
    /// Why (the position or count that decides it).
    pub because: String,
}

pub fn reach(g: &Geometry, prefill: usize, decode: usize) -> Vec<Reach> {
    let total = prefill + decode;
    let last = total.saturating_sub(1); // last absolute position
    let mut v = Vec::new();
    let mut add = |mechanism, reached, because: String| {
        v.push(Reach {
            mechanism,
            reached,
            because,
        })
    };
    let w = g.window_size;
    add(
        "window ring wraps in prefill",
        prefill > w,
        format!("prefill {prefill} > window {w}"),
    );
    add(
        "window ring wraps in decode",
        decode > 0 && total > w,
        format!("positions up to {last} with window {w}"),
    );
    let r2 = g
        .kv_source_layers
        .iter()
        .any(|&l| g.compress_ratios[l] == 2);
    add(
        "ratio-2 group completed",
        r2 && total >= 2,
        format!("{total} tokens, groups of 2"),
    );
    add(
        "ratio-2 partial group carried from prefill into decode",
        r2 && prefill % 2 == 1 && decode > 0,
        format!("odd prefill {prefill} then {decode} decode steps"),
    );
    add(
        "ratio-2 indexer discards positions (index_k defect visible in decode)",
        r2 && total / 2 > g.index_topk,
        format!(
            "{} compressed positions vs index_topk {}",
            total / 2,
            g.index_topk
        ),
    );
    let r1 = g
        .kv_source_layers
        .iter()
        .any(|&l| g.compress_ratios[l] == 1);
    add(
        "ratio-1 indexer discards positions",
        r1 && total > g.index_topk,
        format!(
            "{total} compressed positions vs index_topk {}",
            g.index_topk
        ),
    );
    let consumer = g
        .candidate_source_layer
        .is_some_and(|c| g.index_source_layers.iter().any(|&l| l > c));
    let blocks = total.div_ceil(g.candidate_block_size.max(1));
    add(
        "candidate filter removes blocks for a consumer",
        consumer && blocks > g.candidate_topk_blocks,
        format!(
            "{blocks} blocks of {} vs candidate_topk_blocks {}; consumer after the writer: {consumer}",
            g.candidate_block_size, g.candidate_topk_blocks
        ),
    );
    add(
        "YaRN positions beyond original_seq_len",
        total > g.original_seq_len,
        format!(
            "positions up to {last} vs original_seq_len {}",
            g.original_seq_len
        ),
    );
    add(
        "Engram n-gram history fills (n = max_ngram)",
        !g.engram_layer_ids.is_empty() && total >= g.engram_max_ngram_size,
        format!("{total} tokens, max n-gram {}", g.engram_max_ngram_size),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    #[test]
    fn tiny_with_the_recommended_schedule_reaches_everything_structural() {
        let g = Preset::by_name("tiny").unwrap().geometry;
        for r in reach(&g, 37, 24) {
            assert!(r.reached, "{}: {}", r.mechanism, r.because);
        }
    }

    #[test]
    fn four_tokens_reach_almost_nothing() {
        // WASTE's lesson: a 4-token test is green over mechanisms that never ran.
        let g = Preset::by_name("tiny").unwrap().geometry;
        let r = reach(&g, 4, 0);
        assert!(
            !r.iter()
                .find(|x| x.mechanism.starts_with("window ring wraps in prefill"))
                .unwrap()
                .reached
        );
        assert!(
            !r.iter()
                .find(|x| x.mechanism.starts_with("candidate filter"))
                .unwrap()
                .reached
        );
    }

    #[test]
    fn waste_tiny_never_consumes_candidates() {
        let g = Preset::by_name("waste-tiny").unwrap().geometry;
        let r = reach(&g, 12, 0);
        assert!(
            !r.iter()
                .find(|x| x.mechanism.starts_with("candidate filter"))
                .unwrap()
                .reached
        );
        assert!(
            r.iter()
                .find(|x| x.mechanism.starts_with("ratio-1 indexer"))
                .unwrap()
                .reached
        );
    }
}
