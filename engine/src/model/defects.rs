//! Injected defects for the harness's negative controls.
//!
//! Each defect is a switch read at the one place it acts (grep for `Defect::Name`). The
//! undamaged path pays one branch on an almost-always-empty set.

use std::fmt;
use std::str::FromStr;

/// A deliberate deviation from MODEL.md, used to prove that a check can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Defect {
    /// §5.7: drop the per-head sink from the softmax denominator.
    NoAttentionSink,
    /// §6.4.7: skip the inverse rope of the attention output.
    NoInverseRope,
    /// §12 item 3: V4's weightless per-head RMSNorm on the queries after `wq_b`.
    PerHeadQueryNorm,
    /// §5.6: rotate split halves instead of adjacent pairs.
    RopeNonAdjacentPairs,
    /// §5.6: rotate the first rope_head_dim dims instead of the last.
    RopeWrongDims,
    /// §5.6: no YaRN ramp on compressed layers.
    NoYarn,
    /// §5.8: run this many Sinkhorn iterations instead of `hc_sinkhorn_iters`.
    SinkhornIters(usize),
    /// §6.3: collapse each sublayer with its own `pre` (V4) instead of the staggered one.
    PreNotStaggered,
    /// §6.5: take the routing weights from the biased scores.
    BiasInRoutingWeights,
    /// §6.5: no SwiGLU clamps.
    NoSwigluClamp,
    /// §5.3: FP4 (e2m1) QDQ rounds ties away from zero instead of to even (upstream profile:
    /// indexer queries and keys, compressed latents).
    Fp4TiesAwayFromEven,
    /// §6.6.1: a blocked shift does not block longer shifts.
    EngramPadNotLatching,
    /// §8: use the other `index_k` behaviour than the one selected.
    IndexKHandoffWrong,
    /// §6.4.6: do not pin the block holding the newest reachable position.
    CandidatePinMissing,
    /// §5.10: among equal values the HIGHER index wins (every top-k: router, indexer, candidates).
    TopkTiesReversed,
    /// §6.5 with §5.10: among equal router selection keys the HIGHER expert id wins; every
    /// other top-k keeps the canonical rule.
    GateTiesReversed,
    /// §7.1: a restored state loses the compressors' open pooling groups (the kv
    /// rows and scores of a ratio-r group not yet emitted), as a snapshot that saved only the
    /// emitted latents would.
    StateWithoutPoolingGroup,
    /// §10.1: a causal mask inside the DSpark draft block (draft row i attends draft keys
    /// 0..=i only; the block is non-causal).
    DraftCausalMask,
    /// §10.1: every Markov bias step reads the block's first id (the last sampled id) instead
    /// of the id sampled at the previous step.
    MarkovBiasFromFirstId,
    /// §10.1: `main_hidden` from the streams leaving the target layers (their block output)
    /// instead of the streams entering them.
    MainHiddenAfterBlock,
    /// §10.2: the vision rope's two halves swapped: the first hd/4 frequencies rotate by the
    /// patch's column and the rest by its row (rows first is the official order).
    VisionRopeHalvesSwapped,
    /// §10.2: the aligner flattens each 3×3 cell as (channel, kw, kh) instead of
    /// (channel, kh, kw).
    AlignerUnfoldKwKh,
    /// §6.5, §10.2: image positions route with `gate.bias` instead of `gate.bias_vl`.
    GateBiasForImage,
    /// §6.6, §10.2: image positions enter the Engram history as ordinary tokens (the image
    /// token id, not DEAD) and their Engram gate is computed instead of 0.
    EngramImageNotDead,
}

impl Defect {
    pub const ALL_NAMES: &'static [&'static str] = &[
        "no-attention-sink",
        "no-inverse-rope",
        "per-head-query-norm",
        "rope-non-adjacent-pairs",
        "rope-wrong-dims",
        "no-yarn",
        "sinkhorn-iters=N",
        "pre-not-staggered",
        "bias-in-routing-weights",
        "no-swiglu-clamp",
        "fp4-ties-away-from-even",
        "engram-pad-not-latching",
        "index-k-handoff-wrong",
        "candidate-pin-missing",
        "topk-ties-reversed",
        "gate-ties-reversed",
        "state-without-pooling-group",
        "draft-causal-mask",
        "markov-bias-from-first-id",
        "main-hidden-after-block",
        "vision-rope-halves-swapped",
        "aligner-unfold-kw-kh",
        "gate-bias-for-image",
        "engram-image-not-dead",
    ];
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Defect::NoAttentionSink => "no-attention-sink",
            Defect::NoInverseRope => "no-inverse-rope",
            Defect::PerHeadQueryNorm => "per-head-query-norm",
            Defect::RopeNonAdjacentPairs => "rope-non-adjacent-pairs",
            Defect::RopeWrongDims => "rope-wrong-dims",
            Defect::NoYarn => "no-yarn",
            Defect::SinkhornIters(n) => return write!(f, "sinkhorn-iters={n}"),
            Defect::PreNotStaggered => "pre-not-staggered",
            Defect::BiasInRoutingWeights => "bias-in-routing-weights",
            Defect::NoSwigluClamp => "no-swiglu-clamp",
            Defect::Fp4TiesAwayFromEven => "fp4-ties-away-from-even",
            Defect::EngramPadNotLatching => "engram-pad-not-latching",
            Defect::IndexKHandoffWrong => "index-k-handoff-wrong",
            Defect::CandidatePinMissing => "candidate-pin-missing",
            Defect::TopkTiesReversed => "topk-ties-reversed",
            Defect::GateTiesReversed => "gate-ties-reversed",
            Defect::StateWithoutPoolingGroup => "state-without-pooling-group",
            Defect::DraftCausalMask => "draft-causal-mask",
            Defect::MarkovBiasFromFirstId => "markov-bias-from-first-id",
            Defect::MainHiddenAfterBlock => "main-hidden-after-block",
            Defect::VisionRopeHalvesSwapped => "vision-rope-halves-swapped",
            Defect::AlignerUnfoldKwKh => "aligner-unfold-kw-kh",
            Defect::GateBiasForImage => "gate-bias-for-image",
            Defect::EngramImageNotDead => "engram-image-not-dead",
        };
        f.write_str(s)
    }
}

impl FromStr for Defect {
    type Err = String;
    fn from_str(s: &str) -> Result<Defect, String> {
        if let Some(n) = s.strip_prefix("sinkhorn-iters=") {
            let n = n
                .parse()
                .map_err(|_| format!("defect `{s}`: iteration count is not a number"))?;
            return Ok(Defect::SinkhornIters(n));
        }
        Ok(match s {
            "no-attention-sink" => Defect::NoAttentionSink,
            "no-inverse-rope" => Defect::NoInverseRope,
            "per-head-query-norm" => Defect::PerHeadQueryNorm,
            "rope-non-adjacent-pairs" => Defect::RopeNonAdjacentPairs,
            "rope-wrong-dims" => Defect::RopeWrongDims,
            "no-yarn" => Defect::NoYarn,
            "pre-not-staggered" => Defect::PreNotStaggered,
            "bias-in-routing-weights" => Defect::BiasInRoutingWeights,
            "no-swiglu-clamp" => Defect::NoSwigluClamp,
            "fp4-ties-away-from-even" => Defect::Fp4TiesAwayFromEven,
            "engram-pad-not-latching" => Defect::EngramPadNotLatching,
            "index-k-handoff-wrong" => Defect::IndexKHandoffWrong,
            "candidate-pin-missing" => Defect::CandidatePinMissing,
            "topk-ties-reversed" => Defect::TopkTiesReversed,
            "gate-ties-reversed" => Defect::GateTiesReversed,
            "state-without-pooling-group" => Defect::StateWithoutPoolingGroup,
            "draft-causal-mask" => Defect::DraftCausalMask,
            "markov-bias-from-first-id" => Defect::MarkovBiasFromFirstId,
            "main-hidden-after-block" => Defect::MainHiddenAfterBlock,
            "vision-rope-halves-swapped" => Defect::VisionRopeHalvesSwapped,
            "aligner-unfold-kw-kh" => Defect::AlignerUnfoldKwKh,
            "gate-bias-for-image" => Defect::GateBiasForImage,
            "engram-image-not-dead" => Defect::EngramImageNotDead,
            _ => {
                return Err(format!(
                    "unknown defect `{s}` (known: {})",
                    Defect::ALL_NAMES.join(", ")
                ))
            }
        })
    }
}

/// The defects injected into one run (empty for the reference).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefectSet(Vec<Defect>);

impl DefectSet {
    pub fn none() -> DefectSet {
        DefectSet(Vec::new())
    }
    pub fn new(defects: impl IntoIterator<Item = Defect>) -> DefectSet {
        DefectSet(defects.into_iter().collect())
    }
    /// The set named by `names` (command-line `--defect` values); an unknown name is refused.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> std::result::Result<DefectSet, String> {
        names
            .iter()
            .map(|n| n.as_ref().parse::<Defect>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(DefectSet)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn has(&self, d: Defect) -> bool {
        self.0.contains(&d)
    }
    pub fn iter(&self) -> impl Iterator<Item = &Defect> {
        self.0.iter()
    }
    /// Sinkhorn iteration count: the config's, unless overridden by a defect.
    pub fn sinkhorn_iters(&self, configured: usize) -> usize {
        self.0
            .iter()
            .find_map(|d| match d {
                Defect::SinkhornIters(n) => Some(*n),
                _ => None,
            })
            .unwrap_or(configured)
    }
}

impl fmt::Display for DefectSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        f.write_str(&names.join(","))
    }
}
