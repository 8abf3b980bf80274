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

/// Draft acceptance measured on a generated DSpark run (docs/TRACE.md "DSpark").
#[derive(Debug, Clone, serde::Serialize)]
pub struct MeasuredAcceptance {
    /// Draft steps scored (those whose block's targets all lie inside the run).
    pub steps: usize,
    /// Drafts per step (`dspark_block_size`).
    pub block: usize,
    /// Accepted drafts over drafts checked, each step checked until its first rejection.
    pub per_draft: f64,
    /// Mean tokens a verify pass over K tokens yields (the real one plus the drafts accepted
    /// before the first rejection, at most K − 1), for K = 1, 2, …
    pub tokens_per_pass: Vec<f64>,
}

/// Score the drafts of a DSpark run: step s follows main position `positions[s]`;
/// `output_ids[s]` = `[the main model's greedy id, B draft ids]`; draft j is accepted when it
/// equals the run's token at position p + 1 + j and every draft before it was accepted (what
/// a greedy verify pass keeps). The run must be the model's own greedy continuation (its next
/// token is always the model's id), else acceptance means nothing: the first step where it is
/// not is an error.
pub fn measured_acceptance(
    input_ids: &[i64],
    positions: &[i64],
    output_ids: &[i64],
    block: usize,
    max_k: usize,
) -> Result<MeasuredAcceptance, String> {
    let n = input_ids.len();
    let width = block + 1;
    if block == 0 || output_ids.len() != positions.len() * width {
        return Err(format!(
            "`dspark.output_ids` holds {} ids, {} steps × (block {block} + 1) expected",
            output_ids.len(),
            positions.len()
        ));
    }
    let mut accepted_per_step = Vec::new();
    for (s, &p) in positions.iter().enumerate() {
        let p = usize::try_from(p).map_err(|_| format!("step {s}: position {p}"))?;
        let out = &output_ids[s * width..][..width];
        if p + 1 < n && input_ids[p + 1] != out[0] {
            return Err(format!(
                "step {s} (position {p}): the run's next token is {}, the model's greedy id {}: \
                 not a generated run (make one with `ds41 dspark --generate N`)",
                input_ids[p + 1],
                out[0]
            ));
        }
        if p + 1 + block < n {
            let accepted = (1..=block)
                .take_while(|&j| out[j] == input_ids[p + 1 + j])
                .count();
            accepted_per_step.push(accepted);
        }
    }
    if accepted_per_step.is_empty() {
        return Err(format!(
            "no draft step has its {block} targets inside the run ({n} tokens): generate more"
        ));
    }
    let steps = accepted_per_step.len();
    let checked: usize = accepted_per_step.iter().map(|&a| (a + 1).min(block)).sum();
    let accepted: usize = accepted_per_step.iter().sum();
    let tokens_per_pass = (1..=max_k)
        .map(|k| {
            let sum: usize = accepted_per_step.iter().map(|&a| 1 + a.min(k - 1)).sum();
            sum as f64 / steps as f64
        })
        .collect();
    Ok(MeasuredAcceptance {
        steps,
        block,
        per_draft: accepted as f64 / checked.max(1) as f64,
        tokens_per_pass,
    })
}

/// Replace the rows' expected tokens per pass with the measured ones (a K beyond the block
/// plus one yields no more than the block does).
pub fn apply_measured(rows: &mut [WindowRow], m: &MeasuredAcceptance) {
    for r in rows {
        let e = m.tokens_per_pass[(r.k - 1).min(m.tokens_per_pass.len() - 1)];
        r.expected_tokens = Some(e);
        r.pays = Some(e >= r.total_ratio);
    }
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

    #[test]
    fn drafts_are_scored_until_the_first_rejection() {
        // Run 0..10; steps at positions 2, 3, 4 with block 3.
        let ids: Vec<i64> = (0..10).map(|t| 100 + t).collect();
        let positions = [2, 3, 4];
        let out = [
            103, 104, 105, 999, // both first drafts right, third wrong: 2 accepted
            104, 999, 106,
            107, // first draft wrong: 0 accepted (a later match does not count)
            105, 106, 107, 108, // all 3 accepted
        ];
        let m = measured_acceptance(&ids, &positions, &out, 3, 5).unwrap();
        assert_eq!(m.steps, 3);
        // checked: 3 + 1 + 3 = 7, accepted 5.
        assert!((m.per_draft - 5.0 / 7.0).abs() < 1e-12);
        assert_eq!(m.tokens_per_pass[0], 1.0);
        assert!((m.tokens_per_pass[1] - (2.0 + 1.0 + 2.0) / 3.0).abs() < 1e-12);
        assert!((m.tokens_per_pass[3] - (3.0 + 1.0 + 4.0) / 3.0).abs() < 1e-12);
        assert_eq!(m.tokens_per_pass[4], m.tokens_per_pass[3]);
        // A step whose targets run past the end is not scored.
        let m = measured_acceptance(&ids[..8], &positions, &out, 3, 2).unwrap();
        assert_eq!(m.steps, 2);
    }

    #[test]
    fn a_teacher_forced_run_is_refused() {
        let ids: Vec<i64> = (0..10).map(|t| 100 + t).collect();
        let e = measured_acceptance(&ids, &[2], &[555, 1, 2, 3], 3, 4).unwrap_err();
        assert!(
            e.contains("step 0 (position 2)")
                && e.contains(
                    "greedy id 555: not a generated run (make one with `ds41 dspark --generate N`)"
                ),
            "{e}"
        );
        let e = measured_acceptance(&ids, &[8], &[109, 1, 2, 3], 3, 4).unwrap_err();
        assert!(e.contains("no draft step"), "{e}");
    }

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
