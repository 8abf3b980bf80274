//! Engram: n-gram hash lookup and gated residual write (MODEL.md §6.6).
//!
//! Hash ids are integers computed over the *compressed* token map with a latching history
//! (§6.6.1); the looked-up rows go through `engram.wkv`, giving one key per hc copy and one
//! shared value; each copy gets its own gate `σ(signed sqrt(dot))` (§6.6.2).

use std::sync::Arc;

use super::defects::{Defect, DefectSet};
use super::linear::{Linear, LinearKind};
use super::norm::rms_scale;
use super::numerics::Numerics;
use super::pool::PoolVec;
use crate::checkpoint::Checkpoint;
use crate::config::{Config, EngramHashConstants, EngramPad};
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
    /// Returns the gates [rows, hc] (for tracing).
    pub fn forward(
        &self,
        ckpt: &dyn Checkpoint,
        stream: &mut [f32],
        ids: &[i64],
        rows: usize,
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
                let gate = 1.0 / (1.0 + (-arg).exp());
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

/// The hasher of a checkpoint: the reader's constants and token map, or `token_map` when
/// given (the release ships no map; it is built from the tokenizer, MODEL.md §6.6.1).
pub fn hasher_for(ckpt: &dyn Checkpoint, token_map: Option<Vec<i32>>) -> Result<EngramHasher> {
    let consts = ckpt.engram_constants()?;
    let map = match token_map {
        Some(m) => m,
        None => ckpt.engram_token_map()?.ok_or_else(|| {
            Error::Model(
                "this checkpoint ships no Engram token map; supply one (e.g. `--engram-token-map`)"
                    .into(),
            )
        })?,
    };
    if map.len() < ckpt.config().vocab_size {
        return Err(Error::Model(format!(
            "Engram token map has {} ids, the vocabulary {}",
            map.len(),
            ckpt.config().vocab_size
        )));
    }
    EngramHasher::new(&consts, map)
}
