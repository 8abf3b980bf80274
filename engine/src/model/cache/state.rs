//! ALL per-sequence state of the forward pass (MODEL.md §7.1), in one plain struct so a
//! session snapshot can serialise it field by field.
//!
//! Nothing else survives between forwards: the top-k lists, the compressed-KV pointer and
//! the candidate masks of §6.4.5 are rebuilt inside every forward (see `handoff`).

use crate::model::index_grid::KeyTiles;

/// The complete state of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// Number of tokens processed so far (= position of the next token).
    pub position: usize,
    /// One entry per backbone layer.
    pub layers: Vec<LayerState>,
    /// Engram history: compressed token id per absolute position (DEAD = −1), §6.6.1.
    pub engram_history: Vec<i64>,
    /// The as-shipped `index_k` pointer (§8.3): the layer id of the index-key owner whose key
    /// cache is currently published, `None` before any owner has published.
    pub published_index_k: Option<usize>,
}

/// State of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerState {
    /// Window ring `[window_size, head_dim]`: the roped (FP8-QDQ'd upstream) key of
    /// position p lives in slot `p mod window_size`.
    pub window: Vec<f32>,
    /// KV sources only: compressed latents, index keys and the open pooling group.
    pub compressed: Option<CompressedState>,
}

/// State owned by a KV source (MODEL.md §6.4.3–§6.4.4).
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedState {
    pub ratio: usize,
    pub head_dim: usize,
    pub index_head_dim: usize,
    /// Roped (FP4/E4M3-QDQ'd upstream) latents `[n, head_dim]`; entry j covers tokens
    /// `j·r .. j·r + r − 1`.
    pub latents: Vec<f32>,
    /// Roped (FP4/E8M0-QDQ'd upstream) index keys `[n, index_head_dim]`, same indexing.
    pub index_keys: IndexKeys,
    /// Ratio > 1: the open group's kv rows `[ratio, head_dim]` (f32), slot `p mod r`.
    pub group_kv: Vec<f32>,
    /// Ratio > 1: the open group's gate scores `[ratio, head_dim]`; −∞ = slot not filled.
    pub group_score: Vec<f32>,
}

impl CompressedState {
    pub fn new(ratio: usize, head_dim: usize, index_head_dim: usize) -> CompressedState {
        let open = if ratio > 1 { ratio * head_dim } else { 0 };
        CompressedState {
            ratio,
            head_dim,
            index_head_dim,
            latents: Vec::new(),
            index_keys: IndexKeys::new(index_head_dim),
            group_kv: vec![0.0; open],
            group_score: vec![f32::NEG_INFINITY; open],
        }
    }

    /// Number of emitted compressed entries.
    pub fn len(&self) -> usize {
        self.latents.len() / self.head_dim
    }

    pub fn is_empty(&self) -> bool {
        self.latents.is_empty()
    }

    pub fn latent(&self, j: usize) -> &[f32] {
        &self.latents[j * self.head_dim..(j + 1) * self.head_dim]
    }

    pub fn index_key_count(&self) -> usize {
        self.index_keys.count()
    }
}

/// Index keys `[n, dim]` as computed, with the integer form the index scorer reads where they
/// are on its grid (`index_grid`), kept in step as keys are appended.
#[derive(Debug, Clone)]
pub struct IndexKeys {
    dim: usize,
    rows: Vec<f32>,
    grid: KeyTiles,
}

impl IndexKeys {
    pub fn new(dim: usize) -> IndexKeys {
        IndexKeys {
            dim,
            rows: Vec::new(),
            grid: KeyTiles::new(dim),
        }
    }

    /// Keys read back from a snapshot (`[n, dim]`).
    pub fn from_rows(dim: usize, rows: Vec<f32>) -> IndexKeys {
        let mut keys = IndexKeys::new(dim);
        keys.grid.extend(&rows, dim);
        keys.rows = rows;
        keys
    }

    /// Append keys (`[n, dim]`).
    pub fn extend(&mut self, keys: &[f32]) {
        self.rows.extend_from_slice(keys);
        self.grid.extend(keys, self.dim);
    }

    pub fn rows(&self) -> &[f32] {
        &self.rows
    }

    pub fn grid(&self) -> &KeyTiles {
        &self.grid
    }

    pub fn count(&self) -> usize {
        self.rows.len().checked_div(self.dim).unwrap_or(0)
    }

    fn reserve(&mut self, keys: usize) {
        self.rows
            .reserve((keys * self.dim).saturating_sub(self.rows.len()));
        self.grid.reserve(keys);
    }
}

/// The integer form is derived from the rows: equal rows, equal keys.
impl PartialEq for IndexKeys {
    fn eq(&self, other: &IndexKeys) -> bool {
        self.dim == other.dim && self.rows == other.rows
    }
}

impl SessionState {
    /// The empty state of a fresh sequence.
    pub fn new(cfg: &crate::config::Config) -> SessionState {
        let layers = (0..cfg.n_layers)
            .map(|l| LayerState {
                window: vec![0.0; cfg.window_size * cfg.head_dim],
                compressed: cfg.kv_source_layers.contains(&l).then(|| {
                    CompressedState::new(cfg.compress_ratios[l], cfg.head_dim, cfg.index_head_dim)
                }),
            })
            .collect();
        SessionState {
            position: 0,
            layers,
            engram_history: Vec::new(),
            published_index_k: None,
        }
    }

    /// Reserve capacity for a sequence of `tokens` positions (capacity only, no state change):
    /// the growing caches then never reallocate inside a step.
    pub fn reserve(&mut self, cfg: &crate::config::Config, tokens: usize) {
        self.engram_history
            .reserve(tokens.saturating_sub(self.engram_history.len()));
        for (l, layer) in self.layers.iter_mut().enumerate() {
            if let Some(c) = layer.compressed.as_mut() {
                let entries = tokens / cfg.compress_ratios[l].max(1);
                c.latents
                    .reserve((entries * c.head_dim).saturating_sub(c.latents.len()));
                c.index_keys.reserve(entries);
            }
        }
    }
}
