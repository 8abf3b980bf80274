//! The spec-window gate: does speculative decoding pay on this model, in bytes?
//!
//! A speculative step verifies K consecutive tokens (the real one and K − 1 drafts) in one
//! pass. The pass reads the trunk and head once, and every routed expert that any of the K
//! tokens is routed to: the union of their expert sets, layer by layer. One decode token reads
//! the trunk, the head and its own experts. The ratio of the two is what a pass costs in
//! one-token reads; the pass pays when it yields at least that many tokens (the real one plus
//! the accepted drafts). MoE layers whose consecutive tokens share few experts make the ratio
//! approach K (WASTE measured 3.45 at K = 5 on other MoE models: 3.45 tokens per pass needed).
//!
//! Input: any engine's decode trace (`experts` [tokens, layers, top-k]) and the checkpoint it
//! ran on (stored bytes per expert, `footprint::WeightBytes`).

use std::collections::BTreeSet;

use crate::footprint::WeightBytes;

/// The figures of one window length.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WindowRow {
    pub k: usize,
    /// Windows of K consecutive tokens averaged over.
    pub windows: usize,
    /// Mean routed-expert bytes of a window (union per layer) over those of one token.
    pub expert_ratio: f64,
    /// The same with everything a pass reads: trunk and head once, embedding and Engram rows
    /// per token, the experts' union. The tokens per pass needed to break even on bytes.
    pub total_ratio: f64,
    /// Accepted drafts per pass needed to break even (`total_ratio − 1`, of K − 1 drafts).
    pub break_even_accepted: f64,
    /// With a per-draft acceptance rate: the expected tokens per pass (drafts accepted until
    /// the first rejection), and whether that reaches `total_ratio`.
    pub expected_tokens: Option<f64>,
    pub pays: Option<bool>,
    /// `expert_ratio` per layer (layers without routed experts: 1).
    pub per_layer: Vec<f64>,
}

/// Expected tokens from one pass over K tokens when each draft is accepted with probability
/// `a`, independently, until the first rejection: 1 + a + … + a^(K−1).
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    (0..k).map(|i| a.powi(i as i32)).sum()
}

/// The table for K = 1..=max_k over `experts[t][l]` (the routed experts of token t at layer
/// l). A K longer than the trace gives no row.
pub fn spec_window(
    w: &WeightBytes,
    experts: &[Vec<Vec<usize>>],
    max_k: usize,
    acceptance: Option<f64>,
) -> Vec<WindowRow> {
    let layers = experts.iter().map(Vec::len).max().unwrap_or(0);
    let tokens = experts.len();
    let bytes_of = |l: usize, set: &mut dyn Iterator<Item = usize>| -> u64 {
        set.map(|e| w.expert(l, e)).sum()
    };
    // Mean expert bytes of one token, per layer.
    let single: Vec<f64> = (0..layers)
        .map(|l| {
            let sum: u64 = experts
                .iter()
                .map(|t| bytes_of(l, &mut t.get(l).into_iter().flatten().copied()))
                .sum();
            sum as f64 / tokens.max(1) as f64
        })
        .collect();
    let single_total: f64 = single.iter().sum();
    let per_token_small = (w.embedding_row + w.engram_rows) as f64;
    let once = (w.trunk + w.head) as f64;
    let one_token = once + per_token_small + single_total;
    let mut rows = Vec::new();
    for k in 1..=max_k.min(tokens) {
        let windows = tokens - k + 1;
        let union: Vec<f64> = (0..layers)
            .map(|l| {
                let sum: u64 = (0..windows)
                    .map(|s| {
                        let set: BTreeSet<usize> = experts[s..s + k]
                            .iter()
                            .flat_map(|t| t.get(l).into_iter().flatten().copied())
                            .collect();
                        bytes_of(l, &mut set.into_iter())
                    })
                    .sum();
                sum as f64 / windows as f64
            })
            .collect();
        let union_total: f64 = union.iter().sum();
        let total_ratio = (once + k as f64 * per_token_small + union_total) / one_token;
        let expected = acceptance.map(|a| expected_tokens(a, k));
        rows.push(WindowRow {
            k,
            windows,
            expert_ratio: if single_total > 0.0 {
                union_total / single_total
            } else {
                1.0
            },
            total_ratio,
            break_even_accepted: total_ratio - 1.0,
            expected_tokens: expected,
            pays: expected.map(|e| e >= total_ratio),
            per_layer: union
                .iter()
                .zip(&single)
                .map(|(u, s)| if *s > 0.0 { u / s } else { 1.0 })
                .collect(),
        });
    }
    rows
}

/// The table as an SVG plot: tokens per pass needed (total and experts only) against K, the
/// no-sharing diagonal, and the expected tokens per pass when an acceptance rate is given.
pub fn plot(rows: &[WindowRow], title: &str) -> String {
    let (w, h, ml, mr, mt, mb) = (640.0, 360.0, 60.0, 200.0, 40.0, 45.0);
    let kmax = rows.last().map_or(1, |r| r.k).max(2) as f64;
    let ymax = kmax;
    let x = |k: f64| ml + (w - ml - mr) * (k - 1.0) / (kmax - 1.0);
    let y = |v: f64| mt + (h - mt - mb) * (ymax - v.clamp(0.0, ymax)) / (ymax - 0.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{ml}\" y=\"20\" font-size=\"13\">{}</text>\n",
        crate::report::junit::escape(title)
    );
    for v in 0..=ymax as usize {
        let yy = y(v as f64);
        s += &format!("<line x1=\"{ml}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>\n", w - mr, ml - 6.0, yy + 4.0);
    }
    for r in rows {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            x(r.k as f64),
            h - mb + 16.0,
            r.k
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">K (tokens per pass)</text>\n",
        (ml + w - mr) / 2.0,
        h - 8.0
    );
    let line = |pts: Vec<(f64, f64)>, color: &str, dash: &str, label: &str, slot: usize| {
        let p: Vec<String> = pts
            .iter()
            .map(|&(k, v)| format!("{:.1},{:.1}", x(k), y(v)))
            .collect();
        let ly = mt + 16.0 * slot as f64;
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>\n<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/><text x=\"{:.1}\" y=\"{:.1}\">{label}</text>\n",
            p.join(" "),
            w - mr + 10.0,
            w - mr + 30.0,
            w - mr + 35.0,
            ly + 4.0
        )
    };
    s += &line(
        rows.iter().map(|r| (r.k as f64, r.k as f64)).collect(),
        "#999",
        "4,3",
        "K (nothing shared)",
        0,
    );
    s += &line(
        rows.iter().map(|r| (r.k as f64, r.total_ratio)).collect(),
        "#1f77b4",
        "",
        "needed: all weights",
        1,
    );
    s += &line(
        rows.iter().map(|r| (r.k as f64, r.expert_ratio)).collect(),
        "#d62728",
        "",
        "needed: experts only",
        2,
    );
    if rows.iter().all(|r| r.expected_tokens.is_some()) && !rows.is_empty() {
        s += &line(
            rows.iter()
                .map(|r| (r.k as f64, r.expected_tokens.unwrap_or(0.0)))
                .collect(),
            "#2ca02c",
            "",
            "expected tokens/pass",
            3,
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers, 4 experts of 100 bytes each, trunk+head 1000, nothing per token besides.
    fn weights() -> WeightBytes {
        let mut w = WeightBytes {
            trunk: 900,
            head: 100,
            ..WeightBytes::default()
        };
        for l in 0..2 {
            for e in 0..4 {
                w.experts.insert((l, e), (100, 10));
            }
        }
        w
    }

    #[test]
    fn identical_routing_costs_nothing_extra_and_disjoint_routing_costs_k_times_the_experts() {
        let same = vec![vec![vec![0, 1], vec![2, 3]]; 6];
        let rows = spec_window(&weights(), &same, 3, None);
        assert!(rows
            .iter()
            .all(|r| r.expert_ratio == 1.0 && r.total_ratio == 1.0));
        // Layer 0 alternates {0,1} / {2,3}: a window of 2 reads all four experts there.
        let alternating: Vec<Vec<Vec<usize>>> = (0..6)
            .map(|t| vec![if t % 2 == 0 { vec![0, 1] } else { vec![2, 3] }, vec![0, 1]])
            .collect();
        let rows = spec_window(&weights(), &alternating, 3, None);
        let k2 = &rows[1];
        assert_eq!(k2.windows, 5);
        assert_eq!(k2.per_layer, vec![2.0, 1.0]);
        assert_eq!(k2.expert_ratio, 1.5); // (400 + 200) / (200 + 200)
        assert_eq!(k2.total_ratio, 1600.0 / 1400.0);
        assert!((k2.break_even_accepted - 200.0 / 1400.0).abs() < 1e-12);
    }

    #[test]
    fn acceptance_decides_whether_it_pays() {
        let disjoint: Vec<Vec<Vec<usize>>> = (0..8).map(|t| vec![vec![t % 4]]).collect();
        let mut w = weights();
        (w.trunk, w.head) = (0, 0);
        let rows = spec_window(&w, &disjoint, 4, Some(0.5));
        // Nothing shared and nothing else read: K tokens per pass needed.
        assert_eq!(rows[3].total_ratio, 4.0);
        assert_eq!(rows[3].expected_tokens, Some(1.875));
        assert_eq!(rows[3].pays, Some(false));
        assert_eq!(rows[0].pays, Some(true));
        assert!(plot(&rows, "t").contains("expected tokens/pass"));
    }
}
