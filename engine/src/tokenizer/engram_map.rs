//! The Engram compressed token map (MODEL.md §6.6.1): every token id is mapped to a smaller
//! id shared by all tokens whose decoded text normalises to the same key.
//!
//! For each id in order: decode it alone (special tokens kept); if the text contains U+FFFD
//! (a partial UTF-8 token) the key is the raw token string, otherwise the normalised text (or
//! the text itself when that is empty). Keys get compressed ids 0, 1, 2, … in order of first
//! appearance. On the V4.1 tokenizer this gives 99,092 ids (test `engram_map_release`).
//!
//! The map depends on Unicode tables (MODEL.md §6.6.1 ⚠). Upstream builds it with the HF
//! `tokenizers` normalizers, whose NFKC, NFD and combining-mark tables come from the
//! `unicode-normalization-alignments` crate (Unicode 9.0) and whose lowercasing is Rust's
//! `char::to_lowercase`; this module uses exactly those, so it agrees with HF on every input
//! (test `normalizer_equals_hf`), not only on the release vocabulary.

use unicode_normalization_alignments::char::is_combining_mark;
use unicode_normalization_alignments::UnicodeNormalization;

use super::Tokenizer;
use crate::Result;

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

/// The key a token id is grouped by.
fn key(tokenizer: &Tokenizer, id: u32) -> Result<String> {
    let text = tokenizer.decode(&[id], false)?;
    if text.contains('\u{FFFD}') {
        return Ok(tokenizer.token(id).unwrap_or_default().to_string());
    }
    let normalized = normalize(&text);
    Ok(if normalized.is_empty() {
        text
    } else {
        normalized
    })
}

/// `map[id]` = compressed id, for every id of the tokenizer (added tokens included).
pub fn compressed_token_map(tokenizer: &Tokenizer) -> Result<Vec<i32>> {
    let mut compressed = foldhash::HashMap::<String, i32>::default();
    (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            let next = compressed.len() as i32;
            Ok(*compressed.entry(key(tokenizer, id)?).or_insert(next))
        })
        .collect()
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
        assert_eq!(normalize("\u{3000}"), "");
    }
}
