//! Tokenizer family (CONTRACT.md §1.2): ids exactly equal on a corpus (counted, never
//! "N-1/N"), and the text path's security boundary: no added/control token id ever.

use std::collections::BTreeSet;

use crate::case::{Case, DataRef, ModelRef, TokenizerCheck, TokenizerSpec};
use crate::engine_api::{Capability, Engine, TokenizeRequest};
use crate::outcome::Outcome;
use crate::runner::{engine_failure, require, timeout, Context, Details};

impl super::CheckFamily for TokenizerSpec {
    fn models(&self) -> Vec<ModelRef> {
        Vec::new()
    }

    fn data(&self) -> Vec<&DataRef> {
        std::iter::once(&self.tokenizer)
            .chain(&self.corpus)
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        let s = self;
        let have_texts = !s.texts.is_empty();
        if s.corpus.is_some() == have_texts {
            return Err("give exactly one of `corpus` and `texts`".into());
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
        let s = self;
        if let Some(o) = require(engine, &[Capability::Tokenize]) {
            return Ok(o);
        }
        let tokenizer = ctx.data(&s.tokenizer)?;
        let (texts, expected) = match &s.corpus {
            Some(c) => read_corpus(&ctx.data(c)?)?,
            None => (s.texts.clone(), s.ids.clone()),
        };
        let req = TokenizeRequest {
            tokenizer: tokenizer.clone(),
            texts: texts.clone(),
            markup: s.markup,
        };
        let got = engine
            .tokenize(&req, timeout(case))
            .map_err(|e| engine_failure("tokenize", e))?;
        if got.len() != texts.len() {
            return Ok(Outcome::fail(format!(
                "engine returned {} id lists for {} texts",
                got.len(),
                texts.len()
            )));
        }
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
}

fn read_corpus(path: &std::path::Path) -> Result<(Vec<String>, Vec<Vec<u32>>), Outcome> {
    #[derive(serde::Deserialize)]
    struct Line {
        text: String,
        ids: Vec<u32>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Outcome::error(format!("{}: {e}", path.display())))?;
    let mut texts = Vec::new();
    let mut ids = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let l: Line = serde_json::from_str(line)
            .map_err(|e| Outcome::error(format!("{} line {}: {e}", path.display(), n + 1)))?;
        texts.push(l.text);
        ids.push(l.ids);
    }
    if texts.is_empty() {
        return Err(Outcome::error(format!("{}: empty corpus", path.display())));
    }
    Ok((texts, ids))
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
