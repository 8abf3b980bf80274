//! The DS41 text forward pass (MODEL.md §5–§7), readable top to bottom like the spec:
//!
//! * [`Model`] holds the weights (memory-mapped, dequantised per row as a step needs them);
//! * [`Session`] (`session.rs`) holds one sequence: its [`SessionState`] (§7.1) and its
//!   [`Options`] (numerics profile, `index_k` behaviour, injected defects), and runs a forward
//!   over a chunk of tokens: Engram hashes (§6.6.1) → embedding and expand (§6.1) → for every
//!   layer, Engram (§6.6.2) then [`block::Block`] (§6.3) → final collapse, norm and head (§6.7);
//! * what a forward computes along the way goes to an [`Observer`]: the trace recorder
//!   (`record.rs`) is one, teacher-forced replay (`replay.rs`) another, which also substitutes
//!   the golden's stream at the block boundaries.
//!
//! Chunk semantics: `prefill` at position 0 is the reference's prefill; `decode` is one
//! token at position > 0; a chunk of several tokens at position > 0 is defined as equal to
//! one prefill of everything so far (§7.3): every row uses the row-independent rules of the
//! whole-prefix prefill (window list of `min(T, W)` entries, K = min(index_topk, T div r)).

pub mod attention;
pub mod block;
pub mod cache;
pub mod compressor;
pub mod defects;
pub mod dspark;
pub mod engram;
pub mod handoff;
pub mod hyper_connection;
pub mod image_span;
pub mod index_grid;
pub mod indexer;
pub mod job;
pub mod linear;
pub mod matvec;
pub mod moe;
pub mod norm;
pub mod numerics;
mod parallel;
pub mod pool;
pub mod quant;
mod record;
pub mod replay;
pub mod roles;
pub mod rope;
pub mod session;
pub mod simd;
pub mod sparse_attention;
pub mod topk;

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::{Checkpoint, Layout};
use crate::config::Config;
use crate::{Error, Result};

pub use block::{Block, BlockOutput};
pub use cache::state::{CompressedState, IndexKeys, LayerState, SessionState};
pub use defects::{Defect, DefectSet};
pub use engram::{Engram, EngramHasher, TokenMap};
pub use handoff::{Handoff, IndexK};
pub use job::{ForwardJob, ImageSource, JobError, JobOutput};
pub use linear::{Linear, LinearKind};
pub use numerics::Numerics;
pub use replay::Forcing;
pub use rope::Rope;
pub use session::{Observer, Session};

/// Check a 1-D tensor's length (typed error naming the tensor).
pub(crate) fn expect_len(
    _ckpt: &dyn Checkpoint,
    name: &str,
    got: usize,
    want: usize,
) -> Result<()> {
    if got != want {
        return Err(Error::Model(format!(
            "tensor `{name}` has {got} elements, the config implies {want}"
        )));
    }
    Ok(())
}

/// Check a tensor's logical shape (typed error naming the tensor).
pub(crate) fn expect_shape(ckpt: &dyn Checkpoint, name: &str, want: &[usize]) -> Result<()> {
    let got = ckpt.shape(name)?;
    if got != want {
        return Err(Error::Model(format!(
            "tensor `{name}` has shape {got:?}, the config implies {want:?}"
        )));
    }
    Ok(())
}

/// The rows of one forward: positions `start .. start + rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub rows: usize,
}

impl Chunk {
    /// `start_pos + S`: the sequence length after this forward.
    pub fn total(self) -> usize {
        self.start + self.rows
    }
    /// A single-token step after position 0 uses the decode layouts (§5.7, §6.4.2).
    pub fn decode_layout(self) -> bool {
        self.rows == 1 && self.start > 0
    }
}

/// Run options of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub numerics: Numerics,
    pub index_k: IndexK,
    pub defects: DefectSet,
}

impl Default for Options {
    /// The CLI defaults: upstream numerics, as-shipped `index_k`, no defects.
    fn default() -> Options {
        Options {
            numerics: Numerics::Upstream,
            index_k: IndexK::AsShipped,
            defects: DefectSet::none(),
        }
    }
}

/// What one layer's code needs besides weights and state.
pub struct LayerCtx<'a> {
    pub cfg: &'a Config,
    pub ckpt: &'a dyn Checkpoint,
    pub numerics: Numerics,
    pub index_k: IndexK,
    pub defects: &'a DefectSet,
    pub rope: &'a Rope,
    /// Per row of the chunk, whether it lies in an image span (routes with `gate.bias_vl`);
    /// empty for text-only chunks.
    pub image_rows: &'a [bool],
}

/// The loaded model: config, per-layer modules (weights stay in the checkpoint's mmap).
pub struct Model {
    cfg: Config,
    ckpt: Arc<dyn Checkpoint>,
    blocks: Vec<Block>,
    /// (layer, module) for every Engram layer, in `engram_layer_ids` order.
    engrams: Vec<(usize, Engram)>,
    hasher: Option<EngramHasher>,
    norm: norm::RmsNorm,
    head: Linear,
    /// The DSpark draft head (release layout with `mtp.*` stages and `dspark_*` arguments).
    dspark: Option<dspark::Dspark>,
}

impl Model {
    /// Open a checkpoint directory of either layout (the Engram token map from the
    /// checkpoint, or built from its tokenizer).
    pub fn open(dir: &Path) -> Result<Model> {
        Model::open_with_token_map(dir, TokenMap::FromCheckpoint)
    }

    /// Open a checkpoint directory, the Engram token map as `token_map` says.
    pub fn open_with_token_map(dir: &Path, token_map: impl Into<TokenMap>) -> Result<Model> {
        let ckpt: Arc<dyn Checkpoint> = Arc::from(crate::checkpoint::open(dir)?);
        let hasher = if ckpt.config().engram_layer_ids.is_empty() {
            None
        } else {
            Some(engram::hasher_for(ckpt.as_ref(), dir, &token_map.into())?)
        };
        Model::from_parts(ckpt, hasher)
    }

    /// Build from an open checkpoint and explicitly given Engram hash constants.
    pub fn from_parts(ckpt: Arc<dyn Checkpoint>, hasher: Option<EngramHasher>) -> Result<Model> {
        let cfg = ckpt.config().clone();
        if hasher.is_none() && !cfg.engram_layer_ids.is_empty() {
            return Err(Error::Model(
                "the config has Engram layers but no hash constants were given".into(),
            ));
        }
        let blocks = (0..cfg.n_layers)
            .map(|l| Block::load(&ckpt, &cfg, l))
            .collect::<Result<Vec<_>>>()?;
        let engrams = cfg
            .engram_layer_ids
            .iter()
            .map(|&l| Engram::load(&ckpt, &cfg, l).map(|e| (l, e)))
            .collect::<Result<Vec<_>>>()?;
        expect_shape(ckpt.as_ref(), "embed.weight", &[cfg.vocab_size, cfg.dim])?;
        let dspark = dspark::Dspark::load(&ckpt, &cfg)?;
        Ok(Model {
            dspark,
            norm: norm::RmsNorm::load(ckpt.as_ref(), "norm.weight", cfg.norm_eps)?,
            head: Linear::load(&ckpt, "head.weight", LinearKind::F32)?,
            cfg,
            ckpt,
            blocks,
            engrams,
            hasher,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn layout(&self) -> Layout {
        self.ckpt.layout()
    }

    pub fn checkpoint(&self) -> &Arc<dyn Checkpoint> {
        &self.ckpt
    }

    pub fn block(&self, layer: usize) -> &Block {
        &self.blocks[layer]
    }

    /// The output head (`head.weight`, f32), shared by the DSpark draft head.
    pub fn head(&self) -> &Linear {
        &self.head
    }

    /// The DSpark draft head, or why this model has none.
    pub fn dspark(&self) -> Result<&dspark::Dspark> {
        self.dspark.as_ref().ok_or_else(|| {
            Error::Model(match self.layout() {
                Layout::Release => "this model has no DSpark stages (n_mtp_layers or \
                                    dspark_block_size is 0)"
                    .into(),
                Layout::Container => "DSpark runs on the release layout only: the container \
                                      layout drops the MTP stages (CONTAINER.md §8)"
                    .into(),
            })
        })
    }

    pub fn engram_hasher(&self) -> Option<&EngramHasher> {
        self.hasher.as_ref()
    }
}
