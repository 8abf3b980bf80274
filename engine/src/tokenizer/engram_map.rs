//! The Engram compressed token map (MODEL.md §6.6.1): every token id is mapped to a smaller
//! id shared by all tokens whose decoded text normalises to the same key.
//!
//! The official `build_compressed_token_map` (upstream `inference/engram.py`) runs over
//! `range(len(tokenizer))` of a HF tokenizer: decode the id alone (special tokens kept); if
//! the text contains U+FFFD (a partial UTF-8 token) the key is the raw token string,
//! otherwise the normalised text (or the text itself when that is empty). Keys get
//! compressed ids 0, 1, 2, … in order of first appearance. On the V4.1 tokenizer this gives
//! 99,092 ids (test `engram_map_release`).
//!
//! Only the vocabulary, the added tokens and the decoder take part, so this reads just those
//! from `tokenizer.json` (any byte-level BPE: BPE model, `ByteLevel` decoder; the
//! pre-tokenizer and normaliser do not matter) and reproduces what HF `tokenizers` makes of
//! them, including its quirks:
//! * added tokens get their ids in file order, the `id` field notwithstanding: an existing
//!   token (vocabulary or earlier added) keeps its id; new ones are numbered on from the
//!   number of vocabulary entries. An added id shadows a vocabulary entry of the same id.
//!   Empty contents are ignored.
//! * `len(tokenizer)` is the number of distinct token strings (vocabulary ∪ added), so with
//!   gaps in the ids the map stops short of the largest id, and an id that names no token
//!   decodes to "" (its key).
//! * the `ByteLevel` decoder maps a token through the byte symbols only if every character is
//!   one; otherwise the token's own UTF-8 is kept. Invalid UTF-8 becomes U+FFFD
//!   (`String::from_utf8_lossy`, the function HF uses).
//!
//! `engine/tests/engram_map_official.rs` checks all of this against maps the official code
//! built (goldens/engram_maps/), and the trial `regen_python::engram-map-vs-official` against
//! the official code itself.
//!
//! The map depends on Unicode tables (MODEL.md §6.6.1 ⚠). Upstream builds it with the HF
//! `tokenizers` normalizers, whose NFKC, NFD and combining-mark tables come from the
//! `unicode-normalization-alignments` crate (Unicode 9.0) and whose lowercasing is Rust's
//! `char::to_lowercase`; this module uses exactly those, so it agrees with HF on every input
//! (test `normalizer_equals_hf`), not only on the release vocabulary.

use std::path::Path;

use serde::Deserialize;
use unicode_normalization_alignments::char::is_combining_mark;
use unicode_normalization_alignments::UnicodeNormalization;

use super::byte_level::token_bytes;
use crate::{Error, Result};

/// Stands in for a lone space so that `Strip` does not erase it (upstream `engram.py`).
const SENTINEL: char = '\u{E000}';

/// The upstream normaliser: NFKC → NFD → StripAccents → Lowercase → `[ \t\r\n]+` → " " →
/// `^ $` → sentinel → Strip → sentinel → " ".
pub fn normalize(text: &str) -> String {
    let nfkc: String = text.nfkc().map(|(c, _)| c).collect();
    let stripped: String = nfkc
        .nfd()
        .map(|(c, _)| c)
        .filter(|&c| !is_combining_mark(c))
        .flat_map(char::to_lowercase)
        .collect();
    let mut collapsed = String::with_capacity(stripped.len());
    let mut in_run = false;
    for c in stripped.chars() {
        if matches!(c, ' ' | '\t' | '\r' | '\n') {
            if !in_run {
                collapsed.push(' ');
            }
            in_run = true;
        } else {
            collapsed.push(c);
            in_run = false;
        }
    }
    if collapsed == " " {
        collapsed = SENTINEL.to_string();
    }
    collapsed
        .trim_matches(char::is_whitespace)
        .replace(SENTINEL, " ")
}

/// The parts of `tokenizer.json` the map depends on.
#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedTokenJson>,
    #[serde(default)]
    decoder: serde_json::Value,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedTokenJson {
    content: String,
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    vocab: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Token ids as HF `tokenizers` assigns them (module documentation).
struct Vocabulary {
    /// id → token string (an added token shadows a vocabulary entry).
    tokens: foldhash::HashMap<u32, String>,
    /// `len(tokenizer)`: distinct token strings.
    len: usize,
}

impl Vocabulary {
    fn parse(bytes: &[u8], file: &Path) -> Result<Vocabulary> {
        let json: TokenizerJson = serde_json::from_slice(bytes).map_err(|e| Error::Format {
            file: file.to_path_buf(),
            offset: 0,
            reason: format!("line {} column {}: {e}", e.line(), e.column()),
        })?;
        let refuse = |field: &str, reason: String| Error::Tokenizer {
            file: file.to_path_buf(),
            field: field.into(),
            reason,
        };
        match json.model.kind.as_deref() {
            Some("BPE") => {}
            Some(other) => {
                return Err(refuse(
                    "model.type",
                    format!("the Engram token map needs a byte-level BPE model, not {other:?}"),
                ))
            }
            None => {
                return Err(refuse(
                    "model.type",
                    "missing: the Engram token map needs a byte-level BPE model".into(),
                ))
            }
        }
        match json.decoder.get("type").and_then(|t| t.as_str()) {
            Some("ByteLevel") => {}
            _ => {
                return Err(refuse(
                    "decoder",
                    format!(
                        "the Engram token map needs the ByteLevel decoder, found {}",
                        json.decoder
                    ),
                ))
            }
        }
        let vocab = json
            .model
            .vocab
            .ok_or_else(|| refuse("model.vocab", "missing".into()))?;
        let mut ids = foldhash::HashMap::<String, u32>::default();
        let mut tokens = foldhash::HashMap::<u32, String>::default();
        for (token, id) in vocab {
            let id = id
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| refuse("model.vocab", format!("{token:?} has id {id}")))?;
            if let Some(other) = tokens.insert(id, token.clone()) {
                // HF keeps one of the two depending on hash order: no defined map exists.
                return Err(refuse(
                    "model.vocab",
                    format!("{other:?} and {token:?} share id {id}"),
                ));
            }
            ids.insert(token, id);
        }
        // New added tokens are numbered on from the number of vocabulary entries.
        let mut next = ids.len() as u32;
        let mut added = foldhash::HashMap::<String, u32>::default();
        for t in json.added_tokens.iter().filter(|t| !t.content.is_empty()) {
            let id = match added.get(&t.content).or_else(|| ids.get(&t.content)) {
                Some(&id) => id,
                None => {
                    next += 1;
                    next - 1
                }
            };
            added.insert(t.content.clone(), id);
            tokens.insert(id, t.content.clone());
        }
        let len = ids.len() + added.keys().filter(|k| !ids.contains_key(*k)).count();
        Ok(Vocabulary { tokens, len })
    }

    /// HF `decode([id], skip_special_tokens=False)` with the ByteLevel decoder.
    fn decode(&self, id: u32) -> String {
        match self.tokens.get(&id) {
            Some(token) => String::from_utf8_lossy(&token_bytes(token)).into_owned(),
            None => String::new(),
        }
    }

    /// The key `id` is grouped by.
    fn key(&self, id: u32) -> String {
        let text = self.decode(id);
        if text.contains('\u{FFFD}') {
            return self.tokens.get(&id).cloned().unwrap_or_default();
        }
        let normalized = normalize(&text);
        if normalized.is_empty() {
            text
        } else {
            normalized
        }
    }
}

/// The official map of a `tokenizer.json` given as bytes: `map[id]` = compressed id for the
/// ids `0 .. len(tokenizer)`.
pub fn token_map(bytes: &[u8], file: &Path) -> Result<Vec<i32>> {
    let vocab = Vocabulary::parse(bytes, file)?;
    let mut compressed = foldhash::HashMap::<String, i32>::default();
    Ok((0..vocab.len as u32)
        .map(|id| {
            let next = compressed.len() as i32;
            *compressed.entry(vocab.key(id)).or_insert(next)
        })
        .collect())
}

/// The official map of a `tokenizer.json` file.
pub fn token_map_from_file(path: &Path) -> Result<Vec<i32>> {
    let bytes = crate::io::read_file(path, crate::io::MAX_TOKENIZER_BYTES, "tokenizer.json")?;
    token_map(&bytes, path)
}

/// Number of distinct compressed ids in a map (its maximum plus one).
pub fn compressed_vocab_size(map: &[i32]) -> usize {
    map.iter().map(|&c| c as usize + 1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizer_steps() {
        assert_eq!(normalize("Ġ"), "g");
        assert_eq!(normalize(" Hello"), "hello");
        assert_eq!(normalize(" "), " ");
        assert_eq!(normalize("\n\n"), " ");
        assert_eq!(normalize("\t \n"), " ");
        assert_eq!(normalize("  x\t\ty  "), "x y");
        assert_eq!(normalize("Café"), "cafe");
        assert_eq!(normalize("ﬁ"), "fi");
        assert_eq!(normalize("Ｈｅｌｌｏ"), "hello");
        assert_eq!(
            normalize("\u{3000}"),
            " ",
            "NFKC makes U+3000 a space; a lone space survives"
        );
    }
}
