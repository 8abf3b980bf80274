//! The synthetic tokenizer.json against HF `tokenizers` (the oracle the release map was built
//! with, MODEL.md §6.6.1): it loads, round-trips text, and its single-id decodes under the
//! upstream normaliser chain give exactly the compressed map we document and write.

use ds41_synthetic::tokenizer::{TokenizerKind, Vocab};
use tokenizers::normalizers::{Lowercase, Replace, Sequence, Strip, StripAccents, NFD, NFKC};
use tokenizers::{NormalizedString, Normalizer, NormalizerWrapper, Tokenizer};

fn upstream_normalizer() -> Sequence {
    let n = |x: NormalizerWrapper| x;
    Sequence::new(vec![
        n(NFKC.into()),
        n(NFD.into()),
        n(StripAccents.into()),
        n(Lowercase.into()),
        n(Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::Regex("[ \t\r\n]+".into()),
            " ",
        )
        .unwrap()
        .into()),
        n(Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::Regex("^ $".into()),
            "\u{E000}",
        )
        .unwrap()
        .into()),
        n(Strip::new(true, true).into()),
        n(Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::String("\u{E000}".into()),
            " ",
        )
        .unwrap()
        .into()),
    ])
}

/// `build_compressed_token_map` as MODEL.md §6.6.1 states it, on top of HF `tokenizers`.
fn oracle_map(tok: &Tokenizer, n: usize) -> Vec<i32> {
    let norm = upstream_normalizer();
    let mut seen = std::collections::HashMap::new();
    (0..n as u32)
        .map(|id| {
            let text = tok.decode(&[id], false).unwrap();
            let key = if text.contains('\u{FFFD}') {
                tok.id_to_token(id).unwrap()
            } else {
                let mut s = NormalizedString::from(text.as_str());
                norm.normalize(&mut s).unwrap();
                let k = s.get().to_string();
                if k.is_empty() {
                    text
                } else {
                    k
                }
            };
            let next = seen.len() as i32;
            *seen.entry(key).or_insert(next)
        })
        .collect()
}

fn check(kind: TokenizerKind, n: usize) {
    let vocab = Vocab::build(kind, n);
    let json = serde_json::to_string(&vocab.to_json()).unwrap();
    let tok: Tokenizer = json.parse().unwrap();
    assert_eq!(tok.get_vocab_size(true), n);
    assert_eq!(oracle_map(&tok, n), vocab.compressed_token_map());
}

#[test]
fn byte_bpe_map_matches_hf_tokenizers() {
    check(TokenizerKind::ByteBpe, 512);
}

#[test]
fn stub_map_matches_hf_tokenizers() {
    check(TokenizerKind::Stub, 256);
}

#[test]
fn byte_bpe_encodes_and_decodes_text() {
    let vocab = Vocab::build(TokenizerKind::ByteBpe, 512);
    let tok: Tokenizer = serde_json::to_string(&vocab.to_json())
        .unwrap()
        .parse()
        .unwrap();
    for text in [
        "Ta ta ka Ne nu",
        "hello, world!\n\tÜber 123 数字",
        "\u{ff5c} \u{1F600}",
    ] {
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
    }
    // Merges are used: " ta" is one token, not two.
    let enc = tok.encode("ka ta", false).unwrap();
    assert_eq!(enc.get_ids().len(), 2, "{:?}", enc.get_tokens());
    // The specials are added tokens.
    let enc = tok
        .encode("<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>ta", false)
        .unwrap();
    assert_eq!(enc.get_ids()[0], 0);
}
