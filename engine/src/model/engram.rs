//! Engram: n-gram hash lookup and gated residual write (MODEL.md §6.6).
//!
//! Hash ids are integers computed over the *compressed* token map with a latching history
//! (§6.6.1); the looked-up rows go through `engram.wkv`, giving one key per hc copy and one
//! shared value; each copy gets its own gate `σ(signed sqrt(dot))` (§6.6.2).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::defects::{Defect, DefectSet};
use super::linear::{Linear, LinearKind};
use super::norm::rms_scale;
use super::numerics::Numerics;
use super::pool::PoolVec;
use crate::checkpoint::Checkpoint;
use crate::config::{Config, EngramHashConstants, EngramPad};
use crate::tokenizer::engram_map::compressed_vocab_size;
use crate::{Error, Result};

/// History entry of a position that takes no part in n-grams (an image position).
pub const DEAD: i64 = -1;

/// Hash constants of one Engram layer (§6.6.1). Columns are `(n − 2) · n_heads + head`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngramLayerConsts {
    /// `M[d]` for shifts d = 0 .. max_ngram − 1.
    pub multipliers: Vec<i64>,
    /// One prime per column.
    pub primes: Vec<i64>,
    /// Exclusive prefix sums of `primes` (row offset of each column in the table).
    pub offsets: Vec<i64>,
}

/// Everything hashing needs: per-layer constants, the compressed pad and the token map.
#[derive(Debug, Clone)]
pub struct EngramHasher {
    pub layers: Vec<EngramLayerConsts>,
    /// The *compressed* id that fills blocked history slots.
    pub pad: i64,
    /// Raw token id → compressed id.
    pub token_map: Arc<Vec<i32>>,
    pub max_ngram: usize,
    pub n_heads: usize,
}

impl EngramHasher {
    pub fn columns(&self) -> usize {
        (self.max_ngram - 1) * self.n_heads
    }

    /// The compressed id of a raw token (the history entry of a text position).
    pub fn compressed_id(&self, token: u32) -> Result<i64> {
        self.token_map
            .get(token as usize)
            .map(|&c| c as i64)
            .ok_or_else(|| {
                Error::Model(format!(
                    "token id {token} is outside the Engram token map ({} ids)",
                    self.token_map.len()
                ))
            })
    }

    /// Hash ids of position `p` for Engram layer index `li` into `out` (`columns()` long).
    pub fn hash(&self, history: &[i64], p: usize, li: usize, defects: &DefectSet, out: &mut [i64]) {
        let consts = &self.layers[li];
        let latch = !defects.has(Defect::EngramPadNotLatching);
        let mut blocked = false;
        let mut x = 0i64;
        for d in 0..self.max_ngram {
            let slot_blocked = p < d || history[p - d] == DEAD;
            blocked = if latch {
                blocked || slot_blocked
            } else {
                slot_blocked
            };
            let tok = if blocked { self.pad } else { history[p - d] };
            let prod = tok.wrapping_mul(consts.multipliers[d]);
            x = if d == 0 { prod } else { x ^ prod };
            if d >= 1 {
                let n = d + 1;
                for h in 0..self.n_heads {
                    let c = (n - 2) * self.n_heads + h;
                    out[c] = x.rem_euclid(consts.primes[c]) + consts.offsets[c];
                }
            }
        }
    }
}

/// The Engram module of one layer (§6.6.2).
pub struct Engram {
    table: String,
    head_dim: usize,
    dim: usize,
    hc: usize,
    norm_eps: f32,
    wkv: Linear,
    /// `q_weight ⊙ k_weight` [hc, dim]; only the product is ever used.
    omega: Vec<f32>,
}

impl Engram {
    pub fn load(ckpt: &Arc<dyn Checkpoint>, cfg: &Config, layer: usize) -> Result<Engram> {
        let p = format!("layers.{layer}.engram.");
        let q = ckpt.tensor_f32(&format!("{p}q_weight"))?;
        let k = ckpt.tensor_f32(&format!("{p}k_weight"))?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{p}q_weight"),
            q.len(),
            cfg.hc_mult * cfg.dim,
        )?;
        super::expect_len(
            ckpt.as_ref(),
            &format!("{p}k_weight"),
            k.len(),
            cfg.hc_mult * cfg.dim,
        )?;
        Ok(Engram {
            table: format!("{p}embed.weight"),
            head_dim: cfg.engram_head_dim,
            dim: cfg.dim,
            hc: cfg.hc_mult,
            norm_eps: cfg.norm_eps,
            wkv: Linear::load(ckpt, &format!("{p}wkv.weight"), LinearKind::Fp8)?,
            omega: q.iter().zip(&k).map(|(a, b)| a * b).collect(),
        })
    }

    /// Apply the gated write to `stream` ([rows, hc, dim]) given each row's hash ids.
    /// Rows flagged in `shut` (image positions; empty: none) get gate 0, as `engram.py`'s
    /// token mask does: the write `h + 0 · value` still runs, so the stream passes unchanged.
    /// Returns the gates [rows, hc] (for tracing).
    pub fn forward(
        &self,
        ckpt: &dyn Checkpoint,
        stream: &mut [f32],
        ids: &[i64],
        rows: usize,
        shut: &[bool],
        numerics: Numerics,
    ) -> Result<PoolVec<f32>> {
        let cols = ids.len() / rows;
        let (d, hc) = (self.dim, self.hc);
        let mut e = PoolVec::filled(rows * cols * self.head_dim, 0.0f32);
        for (row, &id) in e.chunks_exact_mut(self.head_dim).zip(ids) {
            ckpt.rows_f32(&self.table, id as usize, row)?;
        }
        numerics.round(&mut e);
        let mut kv = PoolVec::filled(rows * (hc + 1) * d, 0.0f32);
        self.wkv.forward(&e, rows, &mut kv, numerics)?;
        let scale = (d as f64).powf(-0.5) as f32;
        let mut gates = PoolVec::filled(rows * hc, 0.0f32);
        for t in 0..rows {
            let kv_t = &kv[t * (hc + 1) * d..(t + 1) * (hc + 1) * d];
            let value = &kv_t[hc * d..];
            for k in 0..hc {
                let key = &kv_t[k * d..(k + 1) * d];
                let h = &mut stream[(t * hc + k) * d..(t * hc + k + 1) * d];
                let rho = rms_scale(h, self.norm_eps) * rms_scale(key, self.norm_eps);
                let omega = &self.omega[k * d..(k + 1) * d];
                let mut acc = 0.0f64;
                for i in 0..d {
                    acc += (h[i] * omega[i] * key[i]) as f64;
                }
                let dot = acc as f32 * rho * scale;
                let arg = dot.abs().max(1e-6).sqrt().copysign(dot);
                let gate = if shut.get(t).copied().unwrap_or(false) {
                    0.0
                } else {
                    1.0 / (1.0 + (-arg).exp())
                };
                gates[t * hc + k] = gate;
                for i in 0..d {
                    h[i] += gate * value[i];
                }
                numerics.round(h);
            }
        }
        Ok(gates)
    }
}

impl EngramHasher {
    /// Build from the reader's constants and a token map. The pad is mapped through the
    /// token map when the checkpoint states it as a raw token id (release), and used as is
    /// when it is already compressed (container `engram.json`).
    pub fn new(consts: &EngramHashConstants, token_map: Vec<i32>) -> Result<EngramHasher> {
        let pad = match consts.pad {
            EngramPad::Compressed(c) => c,
            EngramPad::RawToken(t) => *usize::try_from(t)
                .ok()
                .and_then(|t| token_map.get(t))
                .ok_or_else(|| {
                    Error::Model(format!("Engram pad token {t} is outside the token map"))
                })? as i64,
        };
        let layers = consts
            .layers
            .iter()
            .map(|l| {
                let primes: Vec<i64> = l.primes.iter().flatten().map(|&p| p as i64).collect();
                EngramLayerConsts {
                    multipliers: l.multipliers.clone(),
                    offsets: l.offsets.iter().map(|&o| o as i64).collect(),
                    primes,
                }
            })
            .collect::<Vec<_>>();
        for (i, l) in layers.iter().enumerate() {
            if l.multipliers.len() < consts.max_ngram_size
                || l.primes.len() != (consts.max_ngram_size - 1) * consts.n_heads
                || l.offsets.len() != l.primes.len()
            {
                return Err(Error::Model(format!(
                    "Engram layer index {i}: constants have inconsistent sizes"
                )));
            }
        }
        Ok(EngramHasher {
            layers,
            pad,
            token_map: Arc::new(token_map),
            max_ngram: consts.max_ngram_size,
            n_heads: consts.n_heads,
        })
    }
}

/// Where the Engram token map comes from (MODEL.md §6.6.1). Resolved here only.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum TokenMap {
    /// The map the checkpoint ships (a container's, a release sidecar
    /// `engram_token_map_int32.npy`), else the one built from its `tokenizer.json`.
    #[default]
    FromCheckpoint,
    /// A file: an int32 `.npy` array, or a safetensors file with an `engram_token_map`
    /// tensor (a golden trace carries one).
    File(PathBuf),
    /// These values.
    Given(Vec<i32>),
}

impl From<Option<Vec<i32>>> for TokenMap {
    fn from(map: Option<Vec<i32>>) -> TokenMap {
        map.map_or(TokenMap::FromCheckpoint, TokenMap::Given)
    }
}

impl TokenMap {
    /// The map of the model in `dir` whose checkpoint ships `shipped` (if any), whichever its
    /// source checked the same way ([`check_map`]).
    pub fn resolve(&self, dir: &Path, shipped: Option<Vec<i32>>, cfg: &Config) -> Result<Vec<i32>> {
        let (map, source) = match self {
            TokenMap::Given(m) => (m.clone(), "the given Engram token map".to_string()),
            TokenMap::File(p) => (read_token_map(p)?, p.display().to_string()),
            TokenMap::FromCheckpoint => match shipped {
                Some(m) => (
                    m,
                    format!("the Engram token map shipped in {}", dir.display()),
                ),
                None => {
                    let path = dir.join("tokenizer.json");
                    let map = crate::tokenizer::engram_map::token_map_from_file(&path)?;
                    (
                        map,
                        format!("the Engram token map {} builds", path.display()),
                    )
                }
            },
        };
        check_map(&map, cfg, &source)?;
        Ok(map)
    }
}

/// Read a token map from an int32 `.npy` file or a safetensors file's `engram_token_map`.
pub fn read_token_map(path: &Path) -> Result<Vec<i32>> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.starts_with(b"\x93NUMPY") {
        return crate::checkpoint::release::npy_i32_vector(path, &bytes);
    }
    let file = crate::trace::TraceFile::from_bytes(&bytes, path)?;
    let bad = |reason: String| Error::Format {
        file: path.to_path_buf(),
        offset: 0,
        reason,
    };
    let (shape, map) = file.i64("engram_token_map").ok_or_else(|| {
        bad(
            "neither an int32 .npy file nor a safetensors file with an integer \
             `engram_token_map` tensor"
                .into(),
        )
    })?;
    if shape.len() != 1 {
        return Err(bad(format!(
            "`engram_token_map` has shape {shape:?}, expected one dimension"
        )));
    }
    map.iter()
        .enumerate()
        .map(|(i, &x)| {
            i32::try_from(x).map_err(|_| {
                bad(format!(
                    "`engram_token_map`[{i}] = {x} is out of the int32 range"
                ))
            })
        })
        .collect()
}

impl EngramHasher {
    /// The hasher of a weightless release directory (`config.json` and `tokenizer.json`,
    /// optionally the upstream `engram_token_map_int32.npy`): the release recipe applied to
    /// the config (§6.6.1); the map as `source` says, the sidecar counting as shipped.
    pub fn for_weightless_release(dir: &Path, source: &TokenMap) -> Result<EngramHasher> {
        use crate::checkpoint::release::{npy_i32_vector, TOKMAP_NPY};
        let cfg = Config::from_release_json(&dir.join("config.json"))?;
        let consts = EngramHashConstants::for_release(&cfg)?;
        let npy = dir.join(TOKMAP_NPY);
        let shipped = if npy.is_file() {
            let b = std::fs::read(&npy).map_err(|source| Error::Io {
                path: npy.clone(),
                source,
            })?;
            Some(npy_i32_vector(&npy, &b)?)
        } else {
            None
        };
        let map = source.resolve(dir, shipped, &cfg)?;
        EngramHasher::new(&consts, map)
    }
}

/// A token map (read from `source`) must hold compressed ids only, `0 ..` the config's count,
/// and reach that count. (It may stop short of the vocabulary, as the official map of a
/// tokenizer with gaps in its ids does: hashing such a token is then an error naming it.)
fn check_map(map: &[i32], cfg: &Config, source: &str) -> Result<()> {
    let ids = cfg.engram_compressed_vocab_size;
    if let Some((t, id)) = map
        .iter()
        .enumerate()
        .find(|&(_, &id)| usize::try_from(id).map_or(true, |id| id >= ids))
    {
        return Err(Error::Model(format!(
            "{source}: token {t} maps to {id}, not a compressed id (0..{ids}, config \
             engram_compressed_vocab_size)"
        )));
    }
    let n = compressed_vocab_size(map);
    if n != cfg.engram_compressed_vocab_size {
        return Err(Error::Config {
            field: "engram_compressed_vocab_size".into(),
            rule: format!(
                "{source} has {} entries and {n} compressed ids; the config says vocab_size {} \
                 and {} compressed ids",
                map.len(),
                cfg.vocab_size,
                cfg.engram_compressed_vocab_size
            ),
        });
    }
    Ok(())
}

/// The hasher of an open checkpoint in `dir`: its constants, the map as `source` says.
pub fn hasher_for(ckpt: &dyn Checkpoint, dir: &Path, source: &TokenMap) -> Result<EngramHasher> {
    let consts = ckpt.engram_constants()?;
    let shipped = match source {
        TokenMap::FromCheckpoint => ckpt.engram_token_map()?,
        _ => None,
    };
    let map = source.resolve(dir, shipped, ckpt.config())?;
    EngramHasher::new(&consts, map)
}
