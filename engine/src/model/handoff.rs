//! Source-to-consumer hand-off (MODEL.md §6.4.5, §8) as explicit state.
//!
//! The reference keeps four process-global slots. Here `topk_idxs` and `candidates` live in
//! a per-forward [`Handoff`] (rewritten before use in every forward), the compressed-KV slot
//! is the static role "most recent KV source at or below l", and the `index_k` slot — the
//! only one whose value survives between forwards — is `SessionState::published_index_k`.

use std::fmt;
use std::str::FromStr;

use super::pool::PoolVec;

/// Which index-key cache an index-key owner scores against (§8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum IndexK {
    /// What `model.py` and WASTE compute: an owner publishes its key cache only in a forward
    /// in which it emitted a latent; otherwise it reads whatever was published last.
    #[default]
    #[serde(rename = "as-shipped")]
    AsShipped,
    /// The fix: every owner publishes its own cache before scoring.
    #[serde(rename = "owner")]
    Owner,
}

impl IndexK {
    pub fn as_str(self) -> &'static str {
        match self {
            IndexK::AsShipped => "as-shipped",
            IndexK::Owner => "owner",
        }
    }

    /// The other behaviour (negative control `Defect::IndexKHandoffWrong`).
    pub fn flipped(self) -> IndexK {
        match self {
            IndexK::AsShipped => IndexK::Owner,
            IndexK::Owner => IndexK::AsShipped,
        }
    }

    /// Should an owner publish its own key cache in this forward?
    pub fn owner_publishes(self, emitted_this_forward: bool) -> bool {
        match self {
            IndexK::AsShipped => emitted_this_forward,
            IndexK::Owner => true,
        }
    }
}

impl fmt::Display for IndexK {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for IndexK {
    type Err = String;
    fn from_str(s: &str) -> Result<IndexK, String> {
        match s {
            "as-shipped" | "as_shipped" => Ok(IndexK::AsShipped),
            "owner" => Ok(IndexK::Owner),
            _ => Err(format!(
                "unknown index-k behaviour `{s}` (expected as-shipped or owner)"
            )),
        }
    }
}

/// Per-forward hand-off between layers (rebuilt in every forward).
#[derive(Debug, Clone, Default)]
pub struct Handoff {
    /// `topk_idxs`: per chunk row, the compressed indices selected by the most recent index
    /// source (ascending, −1 = none). Empty lists when compress_len was 0.
    pub topk: PoolVec<PoolVec<i64>>,
    /// Per chunk row, the selection margin of `topk` (`topk::Selection::margin`; for a
    /// candidate consumer the lower of its own and the candidate source's).
    pub topk_margins: PoolVec<f32>,
    /// `candidates`: per chunk row, the candidate-block mask over compressed positions, set
    /// by the candidate source when its indexer ran.
    pub candidates: Option<PoolVec<PoolVec<bool>>>,
    /// Per chunk row, the selection margin of the candidate blocks (set with `candidates`).
    pub candidate_margins: PoolVec<f32>,
}
