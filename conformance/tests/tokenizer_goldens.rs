//! Cross-check of goldens/tokenizer/curated_ids.jsonl (made by HF `tokenizers` 0.23.3 from PyPI,
//! goldens/regen/tokenizer_ids.py) against the HF `tokenizers` Rust crate on the same release
//! tokenizer.json: two builds of the oracle must agree on every string and both entry points
//! before an engine is judged by the golden. Needs a release snapshot (`DS41_RELEASE`).

use std::path::{Path, PathBuf};

use ds41_conformance::goldens::hashing::sha256_file;
use tokenizers::Tokenizer;

const TOKENIZER_SHA256: &str = "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b";

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/tokenizer")
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn curated_ids_agree_with_the_rust_tokenizers_crate() {
    let path = ds41_engine::testing::release().join("tokenizer.json");
    assert_eq!(
        sha256_file(&path).unwrap(),
        TOKENIZER_SHA256,
        "{}",
        path.display()
    );
    let json = std::fs::read_to_string(&path).unwrap();
    let markup = Tokenizer::from_bytes(json.as_bytes()).unwrap();
    let mut spec: serde_json::Value = serde_json::from_str(&json).unwrap();
    spec["added_tokens"] = serde_json::json!([]);
    let plain = Tokenizer::from_bytes(serde_json::to_vec(&spec).unwrap()).unwrap();

    let corpus = lines(&goldens().join("curated_corpus.jsonl"));
    let expected = lines(&goldens().join("curated_ids.jsonl"));
    assert_eq!(
        corpus.len(),
        expected.len(),
        "corpus and golden line counts"
    );
    let mut mismatches = Vec::new();
    for (i, (c, e)) in corpus.iter().zip(&expected).enumerate() {
        assert_eq!(e["i"].as_u64(), Some(i as u64));
        let text = c["text"].as_str().unwrap();
        for (name, tok) in [("markup", &markup), ("text", &plain)] {
            let got = tok.encode(text, false).unwrap().get_ids().to_vec();
            if got != ids(&e[name]) {
                mismatches.push(format!("line {i} {name} {text:?}: crate {got:?}"));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} id lists differ:\n{}",
        mismatches.len(),
        2 * corpus.len(),
        mismatches.join("\n")
    );
}

// --- the engine's tokenizer and corpus generator judged by the goldens ------------------------

use ds41_conformance::wide_digest::{ids_record, Stream, WideDigest};

fn digest() -> WideDigest {
    WideDigest::load(&goldens().join("wide_seed11_n20000.digest.json")).unwrap()
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn engine_tokenizer_matches_the_wide_digest_and_curated_goldens() {
    let path = ds41_engine::testing::release().join("tokenizer.json");
    assert_eq!(sha256_file(&path).unwrap(), TOKENIZER_SHA256);
    let tok = ds41_engine::tokenizer::Tokenizer::from_file(&path).unwrap();

    let d = digest();
    let records: Vec<Vec<u8>> = d
        .strings()
        .iter()
        .map(|s| ids_record(&tok.encode_markup(s)))
        .collect();
    let c = d.compare(Stream::Ids, &records);
    assert!(c.equal(), "markup ids differ: {c:?}");

    let corpus = lines(&goldens().join("curated_corpus.jsonl"));
    let expected = lines(&goldens().join("curated_ids.jsonl"));
    let mut mismatches = Vec::new();
    for (i, (c, e)) in corpus.iter().zip(&expected).enumerate() {
        let text = c["text"].as_str().unwrap();
        if tok.encode_markup(text) != ids(&e["markup"]) {
            mismatches.push(format!("line {i} markup {text:?}"));
        }
        if tok.encode_text(text) != ids(&e["text"]) {
            mismatches.push(format!("line {i} text {text:?}"));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
