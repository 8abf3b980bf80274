//! Tokenizer family (CONTRACT.md §1.2): ids exactly equal on a corpus (counted, never
//! "N-1/N"), and the text path's security boundary: no added/control token id ever.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::case::Case;
use crate::case::{DataRef, ModelRef};
use crate::engine_api::{Capability, Engine, TokenizeRequest};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, timeout, Context, Details};
use crate::wide_digest::{ids_record, text_record, Stream, WideDigest};

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------- case spec

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerCheck {
    /// Ids equal the expected ids (from `corpus` or `ids`).
    Ids,
    /// No id is an added/control token (the text path's security boundary).
    NoControlIds,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSpec {
    /// `tokenizer.json` (or a checkpoint directory).
    pub tokenizer: DataRef,
    /// JSON lines with `text` and `ids` (or only `text`, with `expected_ids`).
    #[serde(default)]
    pub corpus: Option<DataRef>,
    /// The expected ids of `corpus` from another JSON-lines file, line for line: `key` names
    /// the id list of each line (goldens/tokenizer/curated_ids.jsonl: `markup`, `text`).
    #[serde(default)]
    pub expected_ids: Option<ExpectedIds>,
    /// A wide-corpus digest (goldens/tokenizer/wide_*.digest.json): the corpus is regenerated
    /// from its seed and size (TOKENIZER.md §9) and the ids are judged per chunk by sha256.
    #[serde(default)]
    pub wide_digest: Option<DataRef>,
    #[serde(default)]
    pub texts: Vec<String>,
    #[serde(default)]
    pub ids: Vec<Vec<u32>>,
    pub markup: bool,
    pub check: TokenizerCheck,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedIds {
    pub file: DataRef,
    pub key: String,
}

pub fn run(
    case: &Case,
    s: &TokenizerSpec,
    engine: &mut dyn Engine,
    ctx: &Context,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    if let Some(o) = require(engine, &[Capability::Tokenize]) {
        return Ok(o);
    }
    let tokenizer = ctx.data(&s.tokenizer)?;
    if let Some(d) = &s.wide_digest {
        return run_wide_digest(case, s, &tokenizer, &ctx.data(d)?, engine, details);
    }
    let (texts, expected) = match &s.corpus {
        Some(c) => {
            let expected = match &s.expected_ids {
                Some(e) => Some((ctx.data(&e.file)?, e.key.as_str())),
                None => None,
            };
            read_corpus(&ctx.data(c)?, expected)?
        }
        None => (s.texts.clone(), s.ids.clone()),
    };
    let got = match tokenize(case, s, &tokenizer, &texts, engine)? {
        Ok(ids) => ids,
        Err(fail) => return Ok(fail),
    };
    match s.check {
        TokenizerCheck::Ids => {
            let bad: Vec<usize> = (0..texts.len())
                .filter(|&i| got[i] != expected[i])
                .collect();
            details.notes.push(format!(
                "{}/{} strings identical",
                texts.len() - bad.len(),
                texts.len()
            ));
            if bad.is_empty() {
                Ok(Outcome::Pass)
            } else {
                let shown: Vec<String> = bad
                    .iter()
                    .take(3)
                    .map(|&i| {
                        format!(
                            "#{i} {:?}: expected {:?}, got {:?}",
                            texts[i], expected[i], got[i]
                        )
                    })
                    .collect();
                Ok(Outcome::fail(format!(
                    "{}/{} strings tokenized differently; first: {}",
                    bad.len(),
                    texts.len(),
                    shown.join("; ")
                )))
            }
        }
        TokenizerCheck::NoControlIds => {
            let added = added_token_ids(&tokenizer)?;
            let bad: Vec<(usize, u32)> = got
                .iter()
                .enumerate()
                .flat_map(|(i, ids)| {
                    ids.iter()
                        .filter(|id| added.contains(id))
                        .map(move |&id| (i, id))
                })
                .collect();
            details.notes.push(format!(
                "{} texts, {} added-token ids produced on the text path",
                texts.len(),
                bad.len()
            ));
            Ok(match bad.first() {
                None => Outcome::Pass,
                Some(&(i, id)) => Outcome::fail(format!(
                    "the text path produced control/added token id {id} for {:?} ({} such ids in all)",
                    texts[i],
                    bad.len()
                )),
            })
        }
    }
}

impl super::CheckFamily for TokenizerSpec {
    fn models(&self) -> Vec<ModelRef> {
        Vec::new()
    }

    fn data(&self) -> Vec<&DataRef> {
        std::iter::once(&self.tokenizer)
            .chain(&self.corpus)
            .chain(self.expected_ids.as_ref().map(|e| &e.file))
            .chain(&self.wide_digest)
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        let have_texts = !s.texts.is_empty();
        let sources = usize::from(s.corpus.is_some())
            + usize::from(have_texts)
            + usize::from(s.wide_digest.is_some());
        if sources != 1 {
            return Err("give exactly one of `corpus`, `texts` and `wide_digest`".into());
        }
        if s.expected_ids.is_some() && s.corpus.is_none() {
            return Err("field `expected_ids`: only with `corpus`".into());
        }
        if s.wide_digest.is_some() && s.check != TokenizerCheck::Ids {
            return Err("field `check`: a wide digest is judged by ids".into());
        }
        if s.check == TokenizerCheck::Ids && have_texts && s.ids.len() != s.texts.len() {
            return Err(format!(
                "field `ids`: {} lists for {} texts",
                s.ids.len(),
                s.texts.len()
            ));
        }
        if s.check == TokenizerCheck::NoControlIds && s.markup {
            return Err(
                "field `check`: no_control_ids applies to the text path (markup: false)".into(),
            );
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
        run(case, self, engine, ctx, details)
    }
}

/// The engine's ids for `texts`: Ok(Err(Fail)) when it answers with the wrong number of lists.
fn tokenize(
    case: &Case,
    s: &TokenizerSpec,
    tokenizer: &Path,
    texts: &[String],
    engine: &mut dyn Engine,
) -> Result<Result<Vec<Vec<u32>>, Outcome>, Outcome> {
    let req = TokenizeRequest {
        tokenizer: tokenizer.to_path_buf(),
        texts: texts.to_vec(),
        markup: s.markup,
    };
    let got = engine
        .tokenize(&req, timeout(case))
        .map_err(|e| engine_failure("tokenize", e))?;
    if got.len() != texts.len() {
        return Ok(Err(Outcome::fail(format!(
            "engine returned {} id lists for {} texts",
            got.len(),
            texts.len()
        ))));
    }
    Ok(Ok(got))
}

/// The non-empty lines of a JSON-lines file, parsed, with their line numbers.
fn json_lines(path: &Path) -> Result<Vec<(usize, serde_json::Value)>, Outcome> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Outcome::error(format!("{}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line)
                .map(|v| (n + 1, v))
                .map_err(|e| Outcome::error(format!("{} line {}: {e}", path.display(), n + 1)))
        })
        .collect()
}

/// `texts` from the corpus's `text` fields; ids from its `ids` fields or, with `expected`,
/// from that file's `key` field, line for line.
fn read_corpus(
    path: &Path,
    expected: Option<(PathBuf, &str)>,
) -> Result<(Vec<String>, Vec<Vec<u32>>), Outcome> {
    let field = |file: &Path, n: usize, v: &serde_json::Value, key: &str| {
        serde_json::from_value::<Vec<u32>>(v[key].clone())
            .map_err(|e| Outcome::error(format!("{} line {n}: field `{key}`: {e}", file.display())))
    };
    let lines = json_lines(path)?;
    let mut texts = Vec::new();
    for (n, v) in &lines {
        let t = v["text"].as_str().ok_or_else(|| {
            Outcome::error(format!("{} line {n}: no string `text`", path.display()))
        })?;
        texts.push(t.to_string());
    }
    let ids = match expected {
        None => lines
            .iter()
            .map(|(n, v)| field(path, *n, v, "ids"))
            .collect::<Result<Vec<_>, _>>()?,
        Some((file, key)) => {
            let want = json_lines(&file)?;
            if want.len() != lines.len() {
                return Err(Outcome::error(format!(
                    "{}: {} lines for the {} strings of {}",
                    file.display(),
                    want.len(),
                    lines.len(),
                    path.display()
                )));
            }
            want.iter()
                .map(|(n, v)| field(&file, *n, v, key))
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    if texts.is_empty() {
        return Err(Outcome::error(format!("{}: empty corpus", path.display())));
    }
    Ok((texts, ids))
}

/// The wide corpus regenerated from a digest's seed, its ids judged per chunk by sha256.
fn run_wide_digest(
    case: &Case,
    s: &TokenizerSpec,
    tokenizer: &Path,
    digest: &Path,
    engine: &mut dyn Engine,
    details: &mut Details,
) -> Result<Outcome, Outcome> {
    let d = WideDigest::load(digest).map_err(Outcome::error)?;
    let texts = d.strings();
    let generated = d.compare(
        Stream::Texts,
        &texts.iter().map(|t| text_record(t)).collect::<Vec<_>>(),
    );
    if !generated.equal() {
        return Err(Outcome::error(format!(
            "{}: the regenerated corpus (seed {}, n {}) does not match the digest's texts \
             (chunks starting at {:?}): the harness's generator is wrong",
            digest.display(),
            d.seed,
            d.n,
            generated.differing_chunks
        )));
    }
    let got = match tokenize(case, s, tokenizer, &texts, engine)? {
        Ok(ids) => ids,
        Err(fail) => return Ok(fail),
    };
    let ids = d.compare(
        Stream::Ids,
        &got.iter().map(|i| ids_record(i)).collect::<Vec<_>>(),
    );
    let chunks = d.chunks.len();
    details.notes.push(format!(
        "{} strings regenerated from seed {}; ids identical in {}/{chunks} chunks of {}",
        texts.len(),
        d.seed,
        chunks - ids.differing_chunks.len(),
        d.chunk_size
    ));
    if ids.equal() {
        return Ok(Outcome::Pass);
    }
    let first = ids.differing_chunks.first().copied().unwrap_or(0);
    // The digest leaves out the recipe's curated strings, which `ds41 corpus` writes first.
    let line = first + ds41_engine::tokenizer::corpus::curated().len();
    Ok(Outcome::fail(format!(
        "ids differ in {} of {chunks} chunks of {} strings (starting at {:?}); the first such \
         chunk starts with {:?}: compare lines {line}..{} of `ds41 corpus --wide {} --seed {} \
         --no-extra --tokenizer TOKENIZER` (the reference's ids) with the engine's",
        ids.differing_chunks.len(),
        d.chunk_size,
        ids.differing_chunks,
        texts.get(first).map(String::as_str).unwrap_or(""),
        line + d.chunk_size,
        d.n,
        d.seed
    )))
}

/// Ids of every `added_tokens` entry of a tokenizer.json (or `DIR/tokenizer.json`).
pub fn added_token_ids(path: &std::path::Path) -> Result<BTreeSet<u32>, Outcome> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .map_err(|e| Outcome::error(format!("{}: {e}", file.display())))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Outcome::error(format!("{}: {e}", file.display())))?;
    let list = v["added_tokens"]
        .as_array()
        .ok_or_else(|| Outcome::error(format!("{}: no `added_tokens` list", file.display())))?;
    Ok(list
        .iter()
        .filter_map(|t| t["id"].as_u64())
        .map(|x| x as u32)
        .collect())
}
