//! Engram hash family (CONTRACT.md §1, MODEL.md §6.6.1): hash ids from token ids alone, no
//! weights, so a text-only engine can be certified on Engram hashing and on the DEAD-slot
//! latch that no text-only forward pass ever exercises. Every id must match exactly; a
//! mismatch names the first token, Engram layer and column.

use std::path::{Path, PathBuf};

use crate::case::{Case, DataRef, ModelRef};
use crate::engine_api::{Capability, Engine, EngramHashRequest, EngramHashes};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, require_layout, timeout, Context, Details};

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

/// A model directory without weights, assembled from data files (Engram hashing needs only the
/// config and the tokenizer): `config.json`, `tokenizer.json`, optionally the token map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightlessModel {
    pub config: DataRef,
    pub tokenizer: DataRef,
    /// `engram_token_map_int32.npy` (otherwise the engine builds the map from the tokenizer).
    #[serde(default)]
    pub token_map: Option<DataRef>,
}

/// Expected Engram hash ids: a JSON golden (`engram_hash_golden_real.json` shape: `input_ids`
/// [1,S] and `ids` naming a [1,S,layers,cols] key; `dead` naming a list of DEAD positions) or,
/// without `ids`, a trace-format safetensors golden (`input_ids`, `engram_hash`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngramGolden {
    pub file: DataRef,
    #[serde(default)]
    pub ids: Option<String>,
    #[serde(default)]
    pub dead: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngramRelation {
    /// MODEL.md §6.6.1: at every position p, the ids with DEAD slots equal the text-only ids
    /// of the sequence whose positions up to the last DEAD slot ≤ p all hold the pad token
    /// (a latched block reads the pad at every longer shift). Needs no golden.
    DeadLatches,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngramSpec {
    /// A checkpoint whose Engram constants and token map are used, or...
    #[serde(default)]
    pub model: Option<ModelRef>,
    /// ...a weightless model directory.
    #[serde(default)]
    pub weightless: Option<WeightlessModel>,
    /// Compare against a golden, or...
    #[serde(default)]
    pub golden: Option<EngramGolden>,
    /// ...check a relation on `tokens` with `dead` positions and `pad_token`.
    #[serde(default)]
    pub relation: Option<EngramRelation>,
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    #[serde(default)]
    pub dead: Vec<usize>,
    /// The raw token id of the Engram pad (`engram_pad_id`).
    #[serde(default)]
    pub pad_token: Option<u32>,
    /// A safetensors file with an `engram_token_map` tensor to use instead of the model's map.
    #[serde(default)]
    pub engram_token_map: Option<DataRef>,
}

/// Ids `[tokens][layers][cols]` with the positions marked DEAD that produced them.
struct Expected {
    tokens: Vec<u32>,
    dead: Vec<usize>,
    ids: EngramHashes,
}

impl super::CheckFamily for EngramSpec {
    fn models(&self) -> Vec<ModelRef> {
        self.model.iter().cloned().collect()
    }

    fn data(&self) -> Vec<&DataRef> {
        let mut out: Vec<&DataRef> = Vec::new();
        if let Some(w) = &self.weightless {
            out.extend([&w.config, &w.tokenizer]);
            out.extend(&w.token_map);
        }
        out.extend(self.golden.as_ref().map(|g| &g.file));
        out.extend(&self.engram_token_map);
        out
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        if s.model.is_some() == s.weightless.is_some() {
            return Err("give exactly one of `model` and `weightless`".into());
        }
        if s.golden.is_some() == s.relation.is_some() {
            return Err("give exactly one of `golden` and `relation`".into());
        }
        if let Some(g) = &s.golden {
            if s.tokens.is_some() || !s.dead.is_empty() || s.pad_token.is_some() {
                return Err("field `golden`: tokens and dead positions come from the golden; give none of `tokens`, `dead`, `pad_token`".into());
            }
            if g.ids.is_none() && g.dead.is_some() {
                return Err("field `golden.dead`: only for JSON goldens (with `ids`)".into());
            }
        }
        if s.relation.is_some() {
            let n = s.tokens.as_ref().map_or(0, Vec::len);
            if n == 0 {
                return Err("field `tokens`: required (non-empty) by a relation".into());
            }
            if s.dead.is_empty() {
                return Err("field `dead`: a latching relation needs DEAD positions".into());
            }
            if let Some(&bad) = s.dead.iter().find(|&&p| p >= n) {
                return Err(format!("field `dead`: {bad} is not inside 0..{n}"));
            }
            if s.pad_token.is_none() {
                return Err("field `pad_token`: required by a relation".into());
            }
        }
        Ok(())
    }

    fn run(
        &self,
        case: &Case,
        engine: &mut dyn Engine,
        ctx: &Context,
        details: &mut Details,
    ) -> Result<Outcome, Outcome> {
        let s = self;
        if let Some(o) = require(engine, &[Capability::EngramHash]) {
            return Ok(o);
        }
        let model = match (&s.model, &s.weightless) {
            (Some(m), _) => {
                if let Some(o) = require_layout(engine, ctx, m)? {
                    return Ok(o);
                }

                ctx.checkpoint(m, details)?
            }
            (None, Some(w)) => {
                let dir = ctx.scratch(case)?;
                link(&ctx.data(&w.config)?, &dir.join("config.json"))?;
                link(&ctx.data(&w.tokenizer)?, &dir.join("tokenizer.json"))?;
                if let Some(m) = &w.token_map {
                    link(&ctx.data(m)?, &dir.join("engram_token_map_int32.npy"))?;
                }
                dir
            }
            (None, None) => return Err(Outcome::error("no model (validated on load)")),
        };
        let token_map = match &s.engram_token_map {
            Some(d) => Some(ctx.data(d)?),
            None => None,
        };
        let mut hash = |tokens: &[u32], dead: &[usize], map: Option<PathBuf>| {
            let req = EngramHashRequest {
                model: model.clone(),
                tokens: tokens.to_vec(),
                dead: dead.to_vec(),
                engram_token_map: map,
            };
            let ids = engine
                .engram_hash(&req, timeout(case))
                .map_err(|e| engine_failure("engram_hash", e))?;
            Ok::<_, Outcome>(ids)
        };
        match (&s.golden, s.relation) {
            (Some(g), _) => {
                let want = read_golden(g, ctx)?;
                let got = hash(&want.tokens, &want.dead, token_map)?;
                details.notes.push(format!(
                    "{} tokens, DEAD positions {:?}",
                    want.tokens.len(),
                    want.dead
                ));
                Ok(judge(&got, &want.ids, "", details))
            }
            (None, Some(EngramRelation::DeadLatches)) => {
                let tokens = s.tokens.clone().unwrap_or_default();
                let pad = s.pad_token.unwrap_or_default();
                // Anchor: the text-only ids equal the built-in reference's (whose hashing the
                // upstream goldens certify), so a constant answer cannot satisfy the relation.
                let text_req = EngramHashRequest {
                    model: model.clone(),
                    tokens: tokens.clone(),
                    dead: vec![],
                    engram_token_map: token_map.clone(),
                };
                let anchor = ctx
                    .reference
                    .lock()
                    .map_err(|_| Outcome::error("reference engine lock poisoned"))?
                    .engram_hash(&text_req, timeout(case))
                    .map_err(|e| {
                        Outcome::error(format!("the built-in reference could not hash: {e}"))
                    })?;
                let text_only = hash(&tokens, &[], token_map.clone())?;
                let o = judge(
                    &text_only,
                    &anchor,
                    "text only, against the built-in reference",
                    details,
                );
                if o != Outcome::Pass {
                    return Ok(o);
                }
                let with_dead = hash(&tokens, &s.dead, token_map.clone())?;
                if let Some(o) = shape_mismatch(&with_dead, &anchor, "with DEAD slots") {
                    return Ok(o);
                }
                // Positions grouped by the last DEAD slot at or before them (None: before any).
                let mut groups: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
                for p in 0..tokens.len() {
                    let last = s.dead.iter().copied().filter(|&q| q <= p).max();
                    match groups.last_mut() {
                        Some((l, ps)) if *l == last => ps.push(p),
                        _ => groups.push((last, vec![p])),
                    }
                }
                for (last, positions) in &groups {
                    let (text_ids, what) = match *last {
                        None => (
                            text_only.clone(),
                            "positions before the first DEAD slot against the text-only run"
                                .to_string(),
                        ),
                        Some(q) => {
                            let mut padded = tokens.clone();
                            padded[..=q].iter_mut().for_each(|t| *t = pad);
                            (
                                hash(&padded, &[], token_map.clone())?,
                                format!(
                                    "positions {}..={} against the text-only run with tokens 0..={q} set to the pad {pad}",
                                    positions[0],
                                    positions[positions.len() - 1]
                                ),
                            )
                        }
                    };
                    if let Some(o) = shape_mismatch(&text_ids, &anchor, "text only") {
                        return Ok(o);
                    }
                    let rows = |ids: &EngramHashes| -> EngramHashes {
                        positions.iter().map(|&p| ids[p].clone()).collect()
                    };
                    let o = judge_offset(
                        &rows(&with_dead),
                        &rows(&text_ids),
                        positions[0],
                        &what,
                        details,
                    );
                    if o != Outcome::Pass {
                        return Ok(o);
                    }
                }
                details.notes.push(format!(
                    "{} tokens, DEAD positions {:?}: {} text-only runs agree",
                    tokens.len(),
                    s.dead,
                    groups.len()
                ));
                Ok(Outcome::Pass)
            }
            (None, None) => Err(Outcome::error("no golden or relation (validated on load)")),
        }
    }
}

/// Put `src` at `dst` (a symlink; a copy where links are unavailable).
pub(crate) fn link(src: &Path, dst: &Path) -> Result<(), Outcome> {
    // A relative target would be read from the link's own directory.
    let src = &crate::locations::absolute(src);
    #[cfg(unix)]
    let r = std::os::unix::fs::symlink(src, dst);
    #[cfg(not(unix))]
    let r = std::fs::copy(src, dst).map(|_| ());
    r.map_err(|e| Outcome::error(format!("{} -> {}: {e}", src.display(), dst.display())))
}

fn judge(got: &EngramHashes, want: &EngramHashes, what: &str, details: &mut Details) -> Outcome {
    judge_offset(got, want, 0, what, details)
}

/// Exact comparison; positions are reported from `first_pos` on.
fn judge_offset(
    got: &EngramHashes,
    want: &EngramHashes,
    first_pos: usize,
    what: &str,
    details: &mut Details,
) -> Outcome {
    let ctx = if what.is_empty() {
        String::new()
    } else {
        format!(" ({what})")
    };
    let shape = |v: &EngramHashes| {
        let l = v.first().map_or(0, Vec::len);
        let c = v.first().and_then(|r| r.first()).map_or(0, Vec::len);
        (
            v.len(),
            l,
            c,
            v.iter()
                .all(|r| r.len() == l && r.iter().all(|x| x.len() == c)),
        )
    };
    let (gt, gl, gc, regular) = shape(got);
    let (wt, wl, wc, _) = shape(want);
    if !regular || (gt, gl, gc) != (wt, wl, wc) {
        return Outcome::fail(format!(
            "engine returned ids of shape [{gt}, {gl}, {gc}]{}, expected [{wt}, {wl}, {wc}]{ctx}",
            if regular { "" } else { " (ragged)" }
        ));
    }
    let mut bad = 0usize;
    let mut first = None;
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        for (l, (gr, wr)) in g.iter().zip(w).enumerate() {
            for (c, (a, b)) in gr.iter().zip(wr).enumerate() {
                if a != b {
                    bad += 1;
                    first.get_or_insert((t + first_pos, l, c, *a, *b));
                }
            }
        }
    }
    let total = wt * wl * wc;
    details
        .notes
        .push(format!("{}/{total} hash ids identical{ctx}", total - bad));
    match first {
        None => Outcome::Pass,
        Some((t, l, c, a, b)) => Outcome::fail(format!(
            "{bad}/{total} Engram hash ids differ{ctx}; first at token {t}, Engram layer index {l}, column {c} (= (n − 2) · n_heads + head): expected {b}, got {a}"
        )),
    }
}

/// [tokens, layers, cols] and whether every row has that shape.
fn shape(v: &EngramHashes) -> (usize, usize, usize, bool) {
    let l = v.first().map_or(0, Vec::len);
    let c = v.first().and_then(|r| r.first()).map_or(0, Vec::len);
    let regular = v
        .iter()
        .all(|r| r.len() == l && r.iter().all(|x| x.len() == c));
    (v.len(), l, c, regular)
}

/// A Fail when `got` is ragged or not shaped like `want`.
fn shape_mismatch(got: &EngramHashes, want: &EngramHashes, what: &str) -> Option<Outcome> {
    let (gt, gl, gc, regular) = shape(got);
    let (wt, wl, wc, _) = shape(want);
    (!regular || (gt, gl, gc) != (wt, wl, wc)).then(|| {
        let ctx = if what.is_empty() {
            String::new()
        } else {
            format!(" ({what})")
        };
        Outcome::fail(format!(
            "engine returned ids of shape [{gt}, {gl}, {gc}]{}, expected [{wt}, {wl}, {wc}]{ctx}",
            if regular { "" } else { " (ragged)" }
        ))
    })
}

fn read_golden(g: &EngramGolden, ctx: &Context) -> Result<Expected, Outcome> {
    let path = ctx.data(&g.file)?;
    let err = |m: String| Outcome::error(format!("{}: {m}", path.display()));
    match &g.ids {
        Some(key) => {
            let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
            let tokens: Vec<Vec<u32>> = serde_json::from_value(v["input_ids"].clone())
                .map_err(|e| err(format!("field `input_ids` ([1, S] ids): {e}")))?;
            let ids: Vec<EngramHashes> = serde_json::from_value(v[key.as_str()].clone())
                .map_err(|e| err(format!("field `{key}` ([1, S, layers, cols] ids): {e}")))?;
            let dead: Vec<usize> = match &g.dead {
                Some(k) => serde_json::from_value(v[k.as_str()].clone())
                    .map_err(|e| err(format!("field `{k}` (positions): {e}")))?,
                None => vec![],
            };
            let (Some(tokens), Some(ids)) = (tokens.into_iter().next(), ids.into_iter().next())
            else {
                return Err(err("empty batch in `input_ids` or the ids".into()));
            };
            if ids.len() != tokens.len() {
                return Err(err(format!(
                    "`{key}` has {} positions, `input_ids` {}",
                    ids.len(),
                    tokens.len()
                )));
            }
            Ok(Expected { tokens, dead, ids })
        }
        None => {
            let f = ds41_engine::trace::TraceFile::read(&path).map_err(|e| err(e.to_string()))?;
            let (_, input) = f
                .i64("input_ids")
                .ok_or_else(|| err("no I64 `input_ids`".into()))?;
            let (shape, hashes) = f
                .i64("engram_hash")
                .ok_or_else(|| err("no I64 `engram_hash`".into()))?;
            let [t, l, c] = shape[..] else {
                return Err(err(format!(
                    "`engram_hash` has shape {shape:?}, expected [tokens, layers, cols]"
                )));
            };
            if t != input.len() {
                return Err(err(format!(
                    "`engram_hash` has {t} positions, `input_ids` {}",
                    input.len()
                )));
            }
            let ids = hashes
                .chunks_exact(l * c)
                .map(|tok| tok.chunks_exact(c).map(<[i64]>::to_vec).collect())
                .collect();
            Ok(Expected {
                tokens: input.iter().map(|&x| x as u32).collect(),
                dead: vec![],
                ids,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_mismatch_is_named_and_counted() {
        let want: EngramHashes = vec![vec![vec![1, 2], vec![3, 4]], vec![vec![5, 6], vec![7, 8]]];
        let mut d = Details::default();
        assert_eq!(judge(&want, &want, "", &mut d), Outcome::Pass);
        let mut got = want.clone();
        got[1][1][0] = 9;
        got[1][1][1] = 10;
        match judge_offset(&got, &want, 4, "", &mut d) {
            Outcome::Fail { reason } => assert!(
                reason.starts_with("2/8 Engram hash ids differ")
                    && reason.contains("token 5, Engram layer index 1, column 0")
                    && reason.contains("expected 7, got 9"),
                "{reason}"
            ),
            o => panic!("{o:?}"),
        }
        let ragged: EngramHashes = vec![vec![vec![1, 2], vec![3]], vec![vec![5, 6], vec![7, 8]]];
        assert!(
            matches!(judge(&ragged, &want, "", &mut d), Outcome::Fail { reason } if reason.contains("ragged"))
        );
    }
}
