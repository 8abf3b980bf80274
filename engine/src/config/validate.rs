//! `cfg_sane`: bounds on every field and the topology invariants of MODEL.md §2.2 and
//! CONTAINER.md §9. Each failure is an [`Error::Config`] naming the field and the rule.

use super::engram::release_primes;
use super::Config;
use crate::{Error, Result};

fn fail(field: &str, rule: impl Into<String>) -> Error {
    Error::Config {
        field: field.to_string(),
        rule: rule.into(),
    }
}

fn check(ok: bool, field: &str, rule: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(fail(field, rule()))
    }
}

fn bounded(field: &str, v: usize, lo: usize, hi: usize) -> Result<()> {
    check((lo..=hi).contains(&v), field, || {
        format!("{v} is outside the sane range {lo}..={hi}")
    })
}

fn finite_pos(field: &str, v: f64) -> Result<()> {
    check(v.is_finite() && v > 0.0, field, || {
        format!("must be finite and > 0, got {v}")
    })
}

fn finite_nonneg(field: &str, v: f64) -> Result<()> {
    check(v.is_finite() && v >= 0.0, field, || {
        format!("must be finite and >= 0, got {v}")
    })
}

/// Layer-id lists: strictly increasing, inside the backbone.
fn layer_list(field: &str, ids: &[usize], n_layers: usize) -> Result<()> {
    for (i, &l) in ids.iter().enumerate() {
        check(l < n_layers, field, || {
            format!("layer {l} is not a backbone layer (n_layers = {n_layers})")
        })?;
        if i > 0 {
            check(ids[i - 1] < l, field, || {
                format!("must be strictly increasing ({} then {l})", ids[i - 1])
            })?;
        }
    }
    Ok(())
}

impl Config {
    /// Bounds and topology invariants every DS41 engine needs (MODEL.md §2.2 items 1–7 except
    /// the kernel divisibility rules, which [`Config::validate_upstream_kernels`] checks, and
    /// CONTAINER.md §9 `cfg_sane`). §2.2 item 8 is reported by
    /// [`Config::candidate_coverage_ok`], not refused.
    pub fn validate(&self) -> Result<()> {
        self.validate_bounds()?;
        self.validate_topology()?;
        self.validate_engram()
    }

    fn validate_bounds(&self) -> Result<()> {
        bounded("vocab_size", self.vocab_size, 1, 1 << 24)?;
        bounded("dim", self.dim, 1, 1 << 16)?;
        bounded("n_layers", self.n_layers, 1, 1024)?;
        bounded("n_mtp_layers", self.n_mtp_layers, 0, 64)?;
        bounded("n_heads", self.n_heads, 1, 4096)?;
        bounded("head_dim", self.head_dim, 1, 1 << 13)?;
        bounded("rope_head_dim", self.rope_head_dim, 2, self.head_dim.max(2))?;
        check(
            self.rope_head_dim.is_multiple_of(2),
            "rope_head_dim",
            || format!("must be even (rotary pairs), got {}", self.rope_head_dim),
        )?;
        check(self.head_dim >= self.rope_head_dim, "head_dim", || {
            format!(
                "must be >= rope_head_dim ({} < {})",
                self.head_dim, self.rope_head_dim
            )
        })?;
        bounded("q_lora_rank", self.q_lora_rank, 1, 1 << 16)?;
        bounded("o_groups", self.o_groups, 1, self.n_heads)?;
        check(
            self.n_heads.is_multiple_of(self.o_groups),
            "o_groups",
            || {
                format!(
                    "n_heads ({}) must be divisible by o_groups ({})",
                    self.n_heads, self.o_groups
                )
            },
        )?;
        bounded("o_lora_rank", self.o_lora_rank, 1, 1 << 16)?;
        bounded("moe_inter_dim", self.moe_inter_dim, 1, 1 << 16)?;
        bounded("n_routed_experts", self.n_routed_experts, 1, 1 << 16)?;
        bounded(
            "n_activated_experts",
            self.n_activated_experts,
            1,
            self.n_routed_experts,
        )?;
        check(self.n_shared_experts == 1, "n_shared_experts", || {
            format!(
                "must be 1 (the reference asserts it), got {}",
                self.n_shared_experts
            )
        })?;
        check(self.score_func == "sqrtsoftplus", "score_func", || {
            format!(
                "must be \"sqrtsoftplus\" for DS41, got {:?}",
                self.score_func
            )
        })?;
        finite_pos("route_scale", self.route_scale as f64)?;
        finite_nonneg("swiglu_limit", self.swiglu_limit as f64)?;
        finite_nonneg("norm_eps", self.norm_eps as f64)?;
        finite_nonneg("hc_eps", self.hc_eps as f64)?;
        bounded("window_size", self.window_size, 1, 1 << 20)?;
        bounded("index_n_heads", self.index_n_heads, 1, 4096)?;
        bounded("index_head_dim", self.index_head_dim, 1, 1 << 13)?;
        check(
            self.index_head_dim >= self.rope_head_dim,
            "index_head_dim",
            || {
                format!(
                    "must be >= rope_head_dim ({} < {})",
                    self.index_head_dim, self.rope_head_dim
                )
            },
        )?;
        bounded("index_topk", self.index_topk, 1, 1 << 24)?;
        finite_pos("rope_theta", self.rope_theta)?;
        finite_pos("compress_rope_theta", self.compress_rope_theta)?;
        check(
            self.rope_factor.is_finite() && self.rope_factor >= 1.0,
            "rope_factor",
            || format!("must be finite and >= 1, got {}", self.rope_factor),
        )?;
        bounded("original_seq_len", self.original_seq_len, 1, 1 << 30)?;
        finite_pos("beta_fast", self.beta_fast)?;
        finite_pos("beta_slow", self.beta_slow)?;
        check(self.beta_fast >= self.beta_slow, "beta_fast", || {
            format!(
                "must be >= beta_slow ({} < {})",
                self.beta_fast, self.beta_slow
            )
        })?;
        bounded("hc_mult", self.hc_mult, 1, 64)?;
        check(self.hc_mult.is_power_of_two(), "hc_mult", || {
            format!(
                "must be a power of two (assumed by the kernel), got {}",
                self.hc_mult
            )
        })?;
        bounded("hc_sinkhorn_iters", self.hc_sinkhorn_iters, 1, 1000)?;
        for (field, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("image_token_id", self.image_token_id),
        ] {
            if let Some(id) = id {
                check((id as usize) < self.vocab_size, field, || {
                    format!("{id} is not a token id (vocab_size = {})", self.vocab_size)
                })?;
            }
        }
        Ok(())
    }

    fn validate_topology(&self) -> Result<()> {
        let n = self.n_layers;
        check(
            self.compress_ratios.len() == n + self.n_mtp_layers,
            "compress_ratios",
            || {
                format!(
                    "must have n_layers + n_mtp_layers = {} entries, has {}",
                    n + self.n_mtp_layers,
                    self.compress_ratios.len()
                )
            },
        )?;
        for (l, &r) in self.compress_ratios.iter().enumerate() {
            check(r <= 128, "compress_ratios", || {
                format!("ratio {r} of layer {l} is outside the sane range 0..=128")
            })?;
            if l >= n {
                check(r == 0, "compress_ratios", || {
                    format!("MTP entry {l} must be 0, got {r}")
                })?;
            }
        }
        layer_list("kv_source_layers", &self.kv_source_layers, n)?;
        layer_list("index_source_layers", &self.index_source_layers, n)?;
        for &s in &self.kv_source_layers {
            check(self.ratio(s) > 0, "kv_source_layers", || {
                format!("layer {s} has ratio 0 and cannot compress")
            })?;
            check(self.is_index_source(s), "kv_source_layers", || {
                format!(
                    "KV source {s} must also be an index source (index keys come from the KV \
                     source's indexer)"
                )
            })?;
        }
        for &s in &self.index_source_layers {
            check(self.ratio(s) > 0, "index_source_layers", || {
                format!("layer {s} has ratio 0 and has no compressed positions to index")
            })?;
        }
        for l in 0..n {
            let r = self.ratio(l);
            if r == 0 {
                continue;
            }
            match self.kv_source_for(l) {
                None => {
                    return Err(fail(
                        "kv_source_layers",
                        format!("layer {l} has ratio {r} but no KV source at or below it"),
                    ))
                }
                Some(s) => check(self.ratio(s) == r, "compress_ratios", || {
                    format!(
                        "layer {l} has ratio {r} but its most recent KV source {s} has ratio {}",
                        self.ratio(s)
                    )
                })?,
            }
            match self.index_source_for(l) {
                None => {
                    return Err(fail(
                        "index_source_layers",
                        format!("layer {l} has ratio {r} but no index source at or below it"),
                    ))
                }
                Some(s) => check(self.ratio(s) == r, "compress_ratios", || {
                    format!(
                        "layer {l} has ratio {r} but its most recent index source {s} has \
                         ratio {}",
                        self.ratio(s)
                    )
                })?,
            }
        }
        if let Some(c) = self.candidate_source_layer {
            check(c < n, "candidate_source_layer", || {
                format!("layer {c} is not a backbone layer (n_layers = {n})")
            })?;
            check(self.is_index_source(c), "candidate_source_layer", || {
                format!("layer {c} must be an index source")
            })?;
            check(self.ratio(c) == 1, "candidate_source_layer", || {
                format!("layer {c} must have ratio 1, has {}", self.ratio(c))
            })?;
            bounded(
                "candidate_topk_blocks",
                self.candidate_topk_blocks,
                1,
                1 << 24,
            )?;
            bounded(
                "candidate_block_size",
                self.candidate_block_size,
                1,
                1 << 16,
            )?;
        }
        Ok(())
    }

    /// [`Config::validate`] plus what WASTE's `cfg_sane` adds for a container (CONTAINER.md
    /// §9): ratios group contiguously, each group starting at its KV source. The release
    /// layout does not need it: the official code hands each layer the most recent source's
    /// cache (MODEL.md §6.4.5), so a window-only layer may sit between a source and its
    /// consumers.
    pub fn validate_container(&self) -> Result<()> {
        self.validate()?;
        for l in 0..self.n_layers {
            let r = self.ratio(l);
            if r > 0 && (l == 0 || self.ratio(l - 1) != r) {
                check(self.is_kv_source(l), "compress_ratios", || {
                    format!(
                        "layer {l} starts a run of ratio {r} but is not a KV source (a \
                         container's ratio groups must each start with their source, \
                         CONTAINER.md §9)"
                    )
                })?;
            }
        }
        Ok(())
    }

    fn validate_engram(&self) -> Result<()> {
        layer_list("engram_layer_ids", &self.engram_layer_ids, self.n_layers)?;
        let layers = self.engram_layer_ids.len();
        check(
            self.engram_num_embeddings.len() == layers,
            "engram_num_embeddings",
            || {
                format!(
                    "must have one entry per Engram layer ({layers}), has {}",
                    self.engram_num_embeddings.len()
                )
            },
        )?;
        if layers == 0 {
            return Ok(());
        }
        bounded("engram_layer_ids", layers, 1, 64)?;
        bounded("engram_max_ngram_size", self.engram_max_ngram_size, 2, 8)?;
        bounded("engram_n_heads", self.engram_n_heads, 1, 64)?;
        bounded("engram_head_dim", self.engram_head_dim, 1, 1 << 14)?;
        check(
            (2..=1u64 << 40).contains(&self.engram_vocab_size),
            "engram_vocab_size",
            || {
                format!(
                    "{} is outside the sane range 2..=2^40",
                    self.engram_vocab_size
                )
            },
        )?;
        bounded(
            "engram_compressed_vocab_size",
            self.engram_compressed_vocab_size,
            1,
            self.vocab_size,
        )?;
        let pad_limit = if self.engram_pad_is_compressed {
            self.engram_compressed_vocab_size
        } else {
            self.vocab_size
        };
        check(
            self.engram_pad_id >= 0 && (self.engram_pad_id as u64) < pad_limit as u64,
            "engram_pad_id",
            || {
                format!(
                    "{} is not a {} id (< {pad_limit})",
                    self.engram_pad_id,
                    if self.engram_pad_is_compressed {
                        "compressed"
                    } else {
                        "token"
                    }
                )
            },
        )?;
        let primes = release_primes(self);
        for (i, (p, &rows)) in primes.iter().zip(&self.engram_num_embeddings).enumerate() {
            let sum: u64 = p.iter().flatten().sum();
            check(sum == rows, "engram_num_embeddings", || {
                format!(
                    "entry {i} (layer {}) is {rows} but the sum of that layer's primes is {sum}",
                    self.engram_layer_ids[i]
                )
            })?;
        }
        Ok(())
    }

    /// MODEL.md §2.2 item 7, divisibility rules of the upstream FP8/FP4 kernels: every K of an
    /// FP8/FP4 linear and every FP8 activation block axis a multiple of 32, the FP4 fake-quant
    /// axes of the indexer a multiple of 32 and of compressed KV a multiple of 16. Release-layout
    /// checkpoints (stored FP8/FP4) and the upstream numerics regime need these; the WASTE
    /// container (exact regime, q_lora 48) does not satisfy them and does not need to.
    pub fn validate_upstream_kernels(&self) -> Result<()> {
        let m32 = |field: &str, what: &str, v: usize| {
            check(v.is_multiple_of(32), field, || {
                format!("{what} = {v} must be a multiple of 32 (FP8/FP4 block kernels)")
            })
        };
        m32("dim", "K of wq_a/wkv/shared experts/routed w1,w3", self.dim)?;
        m32(
            "q_lora_rank",
            "K of wq_b and indexer.wq_b",
            self.q_lora_rank,
        )?;
        m32(
            "o_lora_rank",
            "K of wo_b (o_groups·o_lora_rank)",
            self.o_groups * self.o_lora_rank,
        )?;
        m32(
            "head_dim",
            "K of wo_a per group (n_heads·head_dim/o_groups)",
            self.n_heads * self.head_dim / self.o_groups,
        )?;
        m32("moe_inter_dim", "K of w2", self.moe_inter_dim)?;
        m32(
            "head_dim",
            "FP8 window-key block axis (head_dim)",
            self.head_dim,
        )?;
        m32(
            "index_head_dim",
            "FP4 indexer q/k block axis",
            self.index_head_dim,
        )?;
        check(self.head_dim.is_multiple_of(16), "head_dim", || {
            format!(
                "compressed-KV FP4 block axis = {} must be a multiple of 16",
                self.head_dim
            )
        })?;
        if !self.engram_layer_ids.is_empty() {
            m32(
                "engram_head_dim",
                "K of engram.wkv ((max_ngram-1)·n_heads·head_dim) and the FP8 row block",
                self.engram_head_dim,
            )?;
        }
        Ok(())
    }
}
