//! Engram hashing constants (MODEL.md §6.6.1, CONTAINER.md §6): per Engram layer the
//! multipliers, the primes `[n-2][head]` and the row offsets (exclusive prefix sums of the
//! primes in column order `col = (n-2)·n_heads + head`).
//!
//! Sources, by layout:
//! * **release**: primes are recomputed (smallest primes > `engram_vocab_size − 1`, handed
//!   out in order, never reused, first Engram layer first). Multipliers follow numpy's
//!   `default_rng(10007·layer_id)` recipe, reproduced by [`super::numpy_rng`], which matches
//!   every published value (MODEL.md §6.6.1 for the release, golden_tiny/README.md for the
//!   tiny goldens). A sidecar `engram_hash_constants.json` next to the weights, when present,
//!   is read and must agree (see `checkpoint::release`).
//! * **container**: `engram.json` states everything, with the pad as a compressed id.

use super::numpy_rng::engram_multipliers;
use super::Config;
use crate::{Error, Result};
use serde::Serialize;

/// Hash constants of one Engram layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngramLayerHash {
    /// Backbone layer id the lookup precedes.
    pub layer: usize,
    /// `M[d]` for shifts d = 0..max_ngram_size.
    pub multipliers: Vec<i64>,
    /// `primes[n-2][head]`.
    pub primes: Vec<Vec<u64>>,
    /// Row offset of each column, `(max_ngram−1)·n_heads` entries.
    pub offsets: Vec<u64>,
}

impl EngramLayerHash {
    /// Table rows = sum of the primes.
    pub fn rows(&self) -> u64 {
        self.primes.iter().flatten().sum()
    }
}

/// The Engram pad, either as the raw token id (release: `map[pad]` is used) or already as a
/// compressed id (container `engram.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EngramPad {
    RawToken(i64),
    Compressed(i64),
}

/// All Engram hash constants of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngramHashConstants {
    pub max_ngram_size: usize,
    pub n_heads: usize,
    pub compressed_vocab_size: usize,
    pub pad: EngramPad,
    pub layers: Vec<EngramLayerHash>,
}

/// Deterministic Miller–Rabin, exact for every u64 (bases = the first 12 primes).
pub(crate) fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    for p in BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let mul = |a: u64, b: u64| ((a as u128 * b as u128) % n as u128) as u64;
    let pow = |mut b: u64, mut e: u64| {
        let mut r = 1u64;
        while e > 0 {
            if e & 1 == 1 {
                r = mul(r, b);
            }
            b = mul(b, b);
            e >>= 1;
        }
        r
    };
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    'base: for a in BASES {
        let mut x = pow(a, d);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul(x, x);
            if x == n - 1 {
                continue 'base;
            }
        }
        return false;
    }
    true
}

/// Primes `[layer][n-2][head]` as the release recipe hands them out (MODEL.md §6.6.1).
/// Empty when the config has no Engram layers or nonsensical sizes.
pub fn release_primes(cfg: &Config) -> Vec<Vec<Vec<u64>>> {
    let per_n = cfg.engram_n_heads;
    let ns = cfg.engram_max_ngram_size.saturating_sub(1);
    let mut next = cfg.engram_vocab_size.saturating_sub(1);
    let mut take = || {
        next += 1;
        while !is_prime(next) {
            next += 1;
        }
        next
    };
    cfg.engram_layer_ids
        .iter()
        .map(|_| {
            (0..ns)
                .map(|_| (0..per_n).map(|_| take()).collect())
                .collect()
        })
        .collect()
}

/// Exclusive prefix sums of the primes in column order.
pub fn offsets_of(primes: &[Vec<u64>]) -> Vec<u64> {
    let mut acc = 0u64;
    primes
        .iter()
        .flatten()
        .map(|&p| {
            let o = acc;
            acc += p;
            o
        })
        .collect()
}

impl EngramHashConstants {
    /// The release recipe applied to `cfg` (primes recomputed, multipliers from the numpy
    /// PCG64 port). Refused when the multiplier bound falls outside the ported path.
    pub fn for_release(cfg: &Config) -> Result<Self> {
        let primes = release_primes(cfg);
        let mut layers = Vec::with_capacity(primes.len());
        for (&layer, p) in cfg.engram_layer_ids.iter().zip(primes) {
            let multipliers = engram_multipliers(
                layer,
                cfg.engram_compressed_vocab_size as u64,
                cfg.engram_max_ngram_size,
            )
            .ok_or_else(|| Error::Config {
                field: "engram_compressed_vocab_size".into(),
                rule: format!(
                    "the multiplier bound for {} compressed ids is served by numpy's 32-bit \
                     path, which is not ported; supply engram_hash_constants.json",
                    cfg.engram_compressed_vocab_size
                ),
            })?;
            layers.push(EngramLayerHash {
                layer,
                multipliers,
                offsets: offsets_of(&p),
                primes: p,
            });
        }
        Ok(EngramHashConstants {
            max_ngram_size: cfg.engram_max_ngram_size,
            n_heads: cfg.engram_n_heads,
            compressed_vocab_size: cfg.engram_compressed_vocab_size,
            pad: if cfg.engram_pad_is_compressed {
                EngramPad::Compressed(cfg.engram_pad_id)
            } else {
                EngramPad::RawToken(cfg.engram_pad_id)
            },
            layers,
        })
    }

    /// Check shapes and arithmetic against a config: one entry per Engram layer, in order;
    /// `max_ngram_size` multipliers; `[max_ngram−1][n_heads]` primes, all prime; offsets the
    /// exclusive prefix sums; row totals equal `engram_num_embeddings`; each multiplier odd
    /// and positive with `max_token · M` inside i64.
    pub fn check_against(&self, cfg: &Config, what: &str) -> Result<()> {
        let bad = |field: &str, rule: String| Error::Config {
            field: format!("{what}.{field}"),
            rule,
        };
        if self.max_ngram_size != cfg.engram_max_ngram_size {
            return Err(bad(
                "max_ngram_size",
                format!(
                    "is {} but the config says {}",
                    self.max_ngram_size, cfg.engram_max_ngram_size
                ),
            ));
        }
        if self.n_heads != cfg.engram_n_heads {
            return Err(bad(
                "n_heads",
                format!(
                    "is {} but the config says {}",
                    self.n_heads, cfg.engram_n_heads
                ),
            ));
        }
        let ids: Vec<usize> = self.layers.iter().map(|l| l.layer).collect();
        if ids != cfg.engram_layer_ids {
            return Err(bad(
                "layers",
                format!(
                    "cover layers {ids:?} but the config's engram_layer_ids are {:?}",
                    cfg.engram_layer_ids
                ),
            ));
        }
        let max_tok = self.compressed_vocab_size.max(1) as i128 - 1;
        for (i, l) in self.layers.iter().enumerate() {
            if l.multipliers.len() != self.max_ngram_size {
                return Err(bad(
                    &format!("layers[{i}].multipliers"),
                    format!(
                        "has {} entries, max_ngram_size is {}",
                        l.multipliers.len(),
                        self.max_ngram_size
                    ),
                ));
            }
            for &m in &l.multipliers {
                if m <= 0 || m % 2 == 0 || (m as i128) * max_tok > i64::MAX as i128 {
                    return Err(bad(
                        &format!("layers[{i}].multipliers"),
                        format!(
                            "{m} must be odd, positive and small enough that token·M fits in int64"
                        ),
                    ));
                }
            }
            let shape_ok = l.primes.len() + 1 == self.max_ngram_size
                && l.primes.iter().all(|r| r.len() == self.n_heads);
            if !shape_ok {
                return Err(bad(
                    &format!("layers[{i}].primes"),
                    format!(
                        "must be [{}][{}]",
                        self.max_ngram_size.saturating_sub(1),
                        self.n_heads
                    ),
                ));
            }
            if let Some(p) = l.primes.iter().flatten().find(|&&p| !is_prime(p)) {
                return Err(bad(
                    &format!("layers[{i}].primes"),
                    format!("{p} is not prime"),
                ));
            }
            if l.offsets != offsets_of(&l.primes) {
                return Err(bad(
                    &format!("layers[{i}].offsets"),
                    "must be the exclusive prefix sums of the primes in (n, head) order".into(),
                ));
            }
            if l.rows() != cfg.engram_num_embeddings[i] {
                return Err(bad(
                    &format!("layers[{i}].primes"),
                    format!(
                        "sum to {} but engram_num_embeddings[{i}] is {}",
                        l.rows(),
                        cfg.engram_num_embeddings[i]
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miller_rabin_agrees_with_trial_division() {
        let naive = |n: u64| {
            n >= 2
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        };
        for n in 0..20_000u64 {
            assert_eq!(is_prime(n), naive(n), "{n}");
        }
        assert!(is_prime(18446744073709551557)); // largest u64 prime
        assert!(!is_prime(3215031751)); // strong pseudoprime to bases 2,3,5,7
    }

    #[test]
    fn offsets_are_exclusive_prefix_sums() {
        assert_eq!(
            offsets_of(&[vec![101, 103], vec![107, 109]]),
            [0, 101, 204, 311]
        );
    }
}
