//! Where in the forward pass something diverged, ordered causally (CONTRACT.md §5): by token,
//! then — within a token — the Engram hash ids (a function of the token ids alone, computed
//! before any block), then layer by layer the sub-ops in the order a block computes them,
//! then the logits after the last layer.

use serde::{Deserialize, Serialize};

/// A sub-op of the forward pass, in the order a block computes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SubOp {
    /// Engram hash ids (a function of the token ids; placed at the layer whose Engram reads
    /// them when the trace names the Engram layers, else before every block of the token).
    EngramHash,
    /// The stream entering the block, after its Engram (`block_input`).
    BlockInput,
    /// The candidate writer's kept candidate blocks (`candidates.L{c}`).
    Candidates,
    /// The indexer's top-k (`topk.L{l}`).
    TopK,
    AttnOut,
    /// The stream after the attention sublayer's expand (`mid`).
    Mid,
    /// The routed expert set (`experts`).
    Experts,
    MoeOut,
    /// The block's output stream (`residual`).
    BlockOutput,
    /// The logits, after the last layer.
    Logits,
}

impl SubOp {
    /// The name used in reports (the trace tensor's name, `residual` for the block output).
    pub fn as_str(self) -> &'static str {
        match self {
            SubOp::EngramHash => "engram_hash",
            SubOp::BlockInput => "block_input",
            SubOp::Candidates => "candidates",
            SubOp::TopK => "topk",
            SubOp::AttnOut => "attn_out",
            SubOp::Mid => "mid",
            SubOp::Experts => "experts",
            SubOp::MoeOut => "moe_out",
            SubOp::BlockOutput => "residual",
            SubOp::Logits => "logits",
        }
    }

    /// Parse a report name; `topk.L{l}` / `candidates.L{c}` (reports before contract 1.2.0
    /// named decisions by their tensor) are accepted.
    pub fn parse(s: &str) -> Option<SubOp> {
        let base = s.split_once(".L").map_or(s, |(b, _)| b);
        [
            SubOp::EngramHash,
            SubOp::BlockInput,
            SubOp::Candidates,
            SubOp::TopK,
            SubOp::AttnOut,
            SubOp::Mid,
            SubOp::Experts,
            SubOp::MoeOut,
            SubOp::BlockOutput,
            SubOp::Logits,
        ]
        .into_iter()
        .find(|x| x.as_str() == base)
    }
}

impl std::fmt::Display for SubOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for SubOp {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for SubOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SubOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SubOp, D::Error> {
        let s = String::deserialize(d)?;
        SubOp::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown sub-op `{s}`")))
    }
}

/// Where the engine first left the golden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub token: usize,
    /// None for the logits (not inside one block), and for Engram hash ids whose layer is
    /// not known.
    pub layer: Option<usize>,
    pub subop: SubOp,
    pub metric: String,
    #[serde(with = "crate::report::float")]
    pub value: f64,
    #[serde(with = "crate::report::float")]
    pub threshold: f64,
    pub detail: String,
}

/// The causal position of a divergence: its sort key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    BeforeBlocks,
    Block(usize, SubOp),
    AfterBlocks,
}

impl Divergence {
    fn causal_key(&self) -> (usize, Stage) {
        let stage = match (self.subop, self.layer) {
            (SubOp::Logits, _) => Stage::AfterBlocks,
            (op, Some(l)) => Stage::Block(l, op),
            (_, None) => Stage::BeforeBlocks,
        };
        (self.token, stage)
    }

    /// Does `self` come strictly before `other` in causal order?
    pub fn precedes(&self, other: &Divergence) -> bool {
        self.causal_key() < other.causal_key()
    }

    /// `token 1 layer 2 sub-op `attn_out`: rel_l2 3.1e-2 > 1.5e-2 (detail)`; a mismatch
    /// that is a divergence without exceeding a threshold (an exact tie decided otherwise
    /// than the claimed canonical rule) says so instead of a false `>`.
    pub fn headline(&self) -> String {
        let measure = if self.value > self.threshold {
            format!("{:.3e} > {:.3e}", self.value, self.threshold)
        } else {
            format!(
                "differs at golden margin {:.3e} (compared strictly)",
                self.value
            )
        };
        let mut s = format!(
            "token {}{} sub-op `{}`: {} {measure}",
            self.token,
            self.layer
                .map(|l| format!(" layer {l}"))
                .unwrap_or_default(),
            self.subop,
            self.metric,
        );
        if !self.detail.is_empty() {
            s += &format!(" ({})", self.detail);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(token: usize, layer: Option<usize>, subop: SubOp) -> Divergence {
        Divergence {
            token,
            layer,
            subop,
            metric: String::new(),
            value: 0.0,
            threshold: 0.0,
            detail: String::new(),
        }
    }

    #[test]
    fn causal_order_is_token_then_layer_then_block_order_with_logits_last() {
        let order = [
            at(0, Some(3), SubOp::BlockOutput),
            at(0, None, SubOp::Logits),
            at(1, None, SubOp::EngramHash),
            at(1, Some(0), SubOp::BlockInput),
            at(1, Some(0), SubOp::TopK),
            at(1, Some(0), SubOp::AttnOut),
            at(1, Some(0), SubOp::Mid),
            at(1, Some(0), SubOp::Experts),
            at(1, Some(0), SubOp::MoeOut),
            at(1, Some(0), SubOp::BlockOutput),
            at(1, Some(2), SubOp::AttnOut),
            at(1, None, SubOp::Logits),
        ];
        for w in order.windows(2) {
            assert!(w[0].precedes(&w[1]), "{:?} before {:?}", w[0], w[1]);
            assert!(!w[1].precedes(&w[0]));
        }
    }

    #[test]
    fn a_strict_tie_headline_claims_no_exceeded_threshold() {
        let mut d = at(3, Some(1), SubOp::TopK);
        d.metric = "tie order".into();
        assert_eq!(
            d.headline(),
            "token 3 layer 1 sub-op `topk`: tie order differs at golden margin 0.000e0 (compared strictly)"
        );
        d.metric = "rel_l2".into();
        (d.value, d.threshold) = (0.5, 0.25);
        assert_eq!(
            d.headline(),
            "token 3 layer 1 sub-op `topk`: rel_l2 5.000e-1 > 2.500e-1"
        );
    }

    #[test]
    fn sub_op_names_round_trip_and_legacy_tensor_names_parse() {
        for s in [
            "engram_hash",
            "topk",
            "experts",
            "residual",
            "logits",
            "mid",
        ] {
            assert_eq!(SubOp::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(SubOp::parse("topk.L10"), Some(SubOp::TopK));
        assert_eq!(SubOp::parse("candidates.L4"), Some(SubOp::Candidates));
        assert_eq!(SubOp::parse("bogus"), None);
    }
}
