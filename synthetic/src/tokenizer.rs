//! The synthetic `tokenizer.json` and its Engram compressed token map (TOKENIZER.md §2, §6;
//! MODEL.md §6.6.1).
//!
//! Two shapes:
//!
//! * **Byte-level BPE** (`tiny`, `tiny-sharded`, `wide`): ids 0/1/2 are the specials
//!   BOS/EOS/pad (inside the BPE vocab, as in the release); ids 3..258 are the 256 byte symbols
//!   in the release's order (printable bytes by value, then the 68 remapped bytes); ids 259..
//!   are merge results, rank r producing id 259 + r. Merges spell short ASCII "syllable" words
//!   in lower case, capitalised and with a leading space (`Ġ`), so different ids normalise to
//!   the same Engram key and the compressed map is far from the identity.
//! * **Stub** (`waste-tiny`): ids 0/1/2 specials, id k ≥ 3 is the word `w{k}`; no merges.
//!   Single-id decodes are all distinct, so the map is the identity, as in WASTE's container
//!   (`engram-tokmap.bin` is the identity there). Encoding text with it is not meaningful.
//!
//! The compressed map (`compressed_token_map`) follows MODEL.md §6.6.1 with the engine's
//! normaliser (`ds41_engine::tokenizer::engram_map::normalize`) on each token's decoded bytes:
//! every non-special token decodes to ASCII or to a lone byte ≥ 0x80 (which decodes to U+FFFD,
//! so its key is the raw token string). A dev-test checks the map against HF `tokenizers`.

use ds41_engine::tokenizer::engram_map::normalize;
use serde_json::{json, Value};

pub const SPECIALS: [&str; 3] = [
    "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<\u{ff5c}\u{2581}pad\u{2581}\u{ff5c}>",
];

/// Which tokenizer a preset writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    ByteBpe,
    Stub,
}

/// A built vocabulary: token strings (in byte-symbol form) by id, and the merges.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub kind: TokenizerKind,
    pub tokens: Vec<String>,
    pub merges: Vec<(String, String)>,
}

/// GPT-2 `bytes_to_unicode`: printable bytes map to themselves, the 68 others to U+0100...
pub fn byte_symbol(b: u8) -> char {
    if is_printable_byte(b) {
        char::from(b)
    } else {
        let idx = (0..b).filter(|&x| !is_printable_byte(x)).count() as u32;
        char::from_u32(0x100 + idx).expect("valid code point")
    }
}

fn is_printable_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The 256 byte symbols in id order (ids 3..258): printable bytes by value, then the rest.
pub fn byte_order() -> Vec<u8> {
    let mut v: Vec<u8> = (0..=255u8).filter(|&b| is_printable_byte(b)).collect();
    v.extend((0..=255u8).filter(|&b| !is_printable_byte(b)));
    v
}

fn symbol_byte(c: char) -> Option<u8> {
    (0..=255u8).find(|&b| byte_symbol(b) == c)
}

impl Vocab {
    /// The vocabulary of a preset's tokenizer (whose size is known to be buildable).
    pub fn build(kind: TokenizerKind, vocab_size: usize) -> Vocab {
        Self::try_build(kind, vocab_size).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Vocab::build`] for any size: why not, when this tokenizer cannot have `vocab_size`
    /// ids.
    pub fn try_build(kind: TokenizerKind, vocab_size: usize) -> Result<Vocab, String> {
        let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
        let mut merges = Vec::new();
        if vocab_size < tokens.len() {
            return Err(format!(
                "{vocab_size} ids leave no room for the {} special tokens",
                tokens.len()
            ));
        }
        match kind {
            TokenizerKind::Stub => tokens.extend((3..vocab_size).map(|k| format!("w{k}"))),
            TokenizerKind::ByteBpe => {
                if vocab_size < 259 {
                    return Err(format!(
                        "a byte-level BPE needs at least 259 ids (3 specials, 256 bytes), not {vocab_size}"
                    ));
                }
                tokens.extend(byte_order().into_iter().map(|b| byte_symbol(b).to_string()));
                let mut known: std::collections::HashSet<String> = tokens.iter().cloned().collect();
                let mut ranks: std::collections::HashMap<(String, String), usize> =
                    Default::default();
                // Each word gets the merges BPE needs to make it one token *under the ranks
                // already present* (so every merge result is reachable by encoding): encode
                // it, join the first two pieces, repeat.
                'words: for word in word_list() {
                    loop {
                        if tokens.len() == vocab_size {
                            break 'words;
                        }
                        let pieces = bpe(&word, &ranks);
                        if pieces.len() == 1 {
                            break;
                        }
                        let joined = format!("{}{}", pieces[0], pieces[1]);
                        if !known.insert(joined.clone()) {
                            break; // already spelled by another split: skip this word
                        }
                        ranks.insert((pieces[0].clone(), pieces[1].clone()), merges.len());
                        merges.push((pieces[0].clone(), pieces[1].clone()));
                        tokens.push(joined);
                    }
                }
                if tokens.len() != vocab_size {
                    return Err(format!(
                        "the synthetic byte-level BPE has at most {} ids (its word list ends \
                         there), not {vocab_size}",
                        tokens.len()
                    ));
                }
            }
        }
        Ok(Vocab {
            kind,
            tokens,
            merges,
        })
    }

    /// The bytes a single id decodes to (specials: their UTF-8 content).
    pub fn decode_bytes(&self, id: usize) -> Vec<u8> {
        if id < 3 || self.kind == TokenizerKind::Stub {
            return self.tokens[id].as_bytes().to_vec();
        }
        self.tokens[id]
            .chars()
            .map(|c| symbol_byte(c).expect("byte symbol"))
            .collect()
    }

    /// MODEL.md §6.6.1 key of one id.
    fn engram_key(&self, id: usize) -> String {
        if id < 3 {
            // Specials contain U+FF5C/U+2581; they can equal no ASCII key and differ from each
            // other after normalisation, so their content stands for their key.
            return format!("\u{0}special:{}", self.tokens[id]);
        }
        let bytes = self.decode_bytes(id);
        let text = match String::from_utf8(bytes) {
            Ok(t) => t,
            // Partial UTF-8 decodes to U+FFFD: the key is the raw token string.
            Err(_) => return format!("\u{0}raw:{}", self.tokens[id]),
        };
        assert!(
            text.is_ascii(),
            "synthetic vocab is ASCII apart from lone high bytes"
        );
        let key = normalize(&text);
        if key.is_empty() {
            text
        } else {
            key
        }
    }

    /// token id → compressed id, assigned in order of first appearance (MODEL.md §6.6.1).
    pub fn compressed_token_map(&self) -> Vec<i32> {
        let mut seen: std::collections::HashMap<String, i32> = Default::default();
        (0..self.tokens.len())
            .map(|id| {
                let n = seen.len() as i32;
                *seen.entry(self.engram_key(id)).or_insert(n)
            })
            .collect()
    }

    /// The HF `tokenizer.json` document (shape of the release file, TOKENIZER.md §2).
    pub fn to_json(&self) -> Value {
        let added: Vec<Value> = SPECIALS
            .iter()
            .enumerate()
            .map(|(id, content)| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let mut vocab = serde_json::Map::new();
        for (id, t) in self.tokens.iter().enumerate() {
            vocab.insert(t.clone(), json!(id));
        }
        let merges: Vec<Value> = self
            .merges
            .iter()
            .map(|(a, b)| json!(format!("{a} {b}")))
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": []},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
                {"type": "Split", "pattern": {"Regex": "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+"}, "behavior": "Isolated", "invert": false},
                {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": Value::Object(vocab),
                "merges": merges,
            }
        })
    }
}

/// Standard BPE on one word of byte symbols: repeatedly merge the adjacent pair of lowest rank.
fn bpe(word: &str, ranks: &std::collections::HashMap<(String, String), usize>) -> Vec<String> {
    let mut pieces: Vec<String> = word.chars().map(String::from).collect();
    loop {
        let best = (0..pieces.len().saturating_sub(1))
            .filter_map(|i| {
                ranks
                    .get(&(pieces[i].clone(), pieces[i + 1].clone()))
                    .map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { return pieces };
        let right = pieces.remove(i + 1);
        pieces[i].push_str(&right);
    }
}

/// The words the merges spell, in order: for each consonant-vowel syllable pair, the lower
/// case word, the capitalised word, and both with a leading space (byte symbol `Ġ`).
fn word_list() -> Vec<String> {
    let cons = "tnskmhrdlbpgvfwzcjy";
    let vows = "aeiou";
    let syll: Vec<String> = cons
        .chars()
        .flat_map(|c| vows.chars().map(move |v| format!("{c}{v}")))
        .collect();
    let mut words = Vec::new();
    for round in 0..syll.len() {
        for (i, s) in syll.iter().enumerate() {
            let w = if round == 0 {
                s.clone()
            } else {
                format!("{s}{}", syll[(i + round) % syll.len()])
            };
            let mut cap = w.clone();
            cap[..1].make_ascii_uppercase();
            let space = byte_symbol(b' ');
            words.push(w.clone());
            words.push(cap.clone());
            words.push(format!("{space}{w}"));
            words.push(format!("{space}{cap}"));
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ids_follow_the_release_order() {
        let v = Vocab::build(TokenizerKind::ByteBpe, 512);
        // TOKENIZER.md §6: `!` = 3, `A` = 35, 0xFF = 190, 0x00 = 191, LF = 201, space = 223.
        assert_eq!(v.tokens[3], "!");
        assert_eq!(v.tokens[35], "A");
        assert_eq!(v.decode_bytes(190), vec![0xFF]);
        assert_eq!(v.decode_bytes(191), vec![0x00]);
        assert_eq!(v.decode_bytes(201), b"\n".to_vec());
        assert_eq!(v.decode_bytes(223), b" ".to_vec());
        assert_eq!(v.tokens.len(), 512);
        assert_eq!(v.merges.len(), 512 - 259);
    }

    #[test]
    fn compressed_map_merges_case_and_space_variants() {
        let v = Vocab::build(TokenizerKind::ByteBpe, 512);
        let m = v.compressed_token_map();
        // 'a' (67) collides with 'A' (35); tab/LF/CR collide with the first of them (tab, 200);
        // space (223) too; \x0b and \x0c strip to "" and keep their own keys.
        assert_eq!(m[67], m[35]);
        assert_eq!(m[201], m[200]);
        assert_eq!(m[223], m[200]);
        assert_ne!(m[202], m[200]);
        assert_eq!(&m[..3], &[0, 1, 2]);
        // Merge results: "ta", "Ta", " ta", " Ta" share one compressed id.
        let id = |s: &str| v.tokens.iter().position(|t| t == s).unwrap();
        let g = byte_symbol(b' ');
        assert_eq!(m[id("Ta")], m[id("ta")]);
        assert_eq!(m[id(&format!("{g}Ta"))], m[id("ta")]);
        let distinct: std::collections::HashSet<_> = m.iter().collect();
        assert!(
            distinct.len() < 400,
            "map should compress well: {}",
            distinct.len()
        );
    }

    #[test]
    fn stub_map_is_identity() {
        let v = Vocab::build(TokenizerKind::Stub, 256);
        let m = v.compressed_token_map();
        assert!(m.iter().enumerate().all(|(i, &c)| c as usize == i));
    }
}
