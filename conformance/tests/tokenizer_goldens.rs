//! Cross-check of goldens/tokenizer/curated_ids.jsonl (made by HF `tokenizers` 0.23.3 from PyPI,
//! goldens/regen/tokenizer_ids.py) against the HF `tokenizers` Rust crate on the same upstream
//! tokenizer.json: two builds of the oracle must agree on every string and both entry points
//! before an engine is judged by the golden. Needs `DS41_UPSTREAM`.

use std::path::{Path, PathBuf};

use ds41_conformance::goldens::hashing::sha256_file;
use ds41_conformance::goldens::upstream_from_env;
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
fn curated_ids_agree_with_the_rust_tokenizers_crate() {
    let Some(upstream) = upstream_from_env() else {
        eprintln!("SKIPPED: DS41_UPSTREAM not set");
        return;
    };
    let path = upstream.join("tokenizer/tokenizer.json");
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

use sha2::{Digest, Sha256};

/// The canonical streams of goldens/README.md ("wide digest"): per string, texts as
/// `u32le(len utf8) ++ utf8`, ids as `u32le(count) ++ u32le(id)…`.
fn text_record(text: &str) -> Vec<u8> {
    let mut out = (text.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

fn ids_record(ids: &[u32]) -> Vec<u8> {
    let mut out = (ids.len() as u32).to_le_bytes().to_vec();
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

fn digest() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(goldens().join("wide_seed11_n20000.digest.json")).unwrap(),
    )
    .unwrap()
}

/// The recipe strings the digest covers (random + whitespace), from the engine's generator.
fn wide_strings(d: &serde_json::Value) -> Vec<String> {
    let (n, seed) = (d["n"].as_u64().unwrap(), d["seed"].as_u64().unwrap());
    ds41_engine::tokenizer::corpus::wide(n as usize, seed)
        .into_iter()
        .filter(|s| s.kind != "curated")
        .map(|s| s.text)
        .collect()
}

/// Compare per-chunk hashes of a stream with the digest; returns the differing chunk starts.
fn differing_chunks(d: &serde_json::Value, key: &str, records: &[Vec<u8>]) -> (String, Vec<u64>) {
    let size = d["chunk_size"].as_u64().unwrap() as usize;
    let mut all = Sha256::new();
    let mut bad = Vec::new();
    for (chunk, want) in records.chunks(size).zip(d["chunks"].as_array().unwrap()) {
        let mut h = Sha256::new();
        for r in chunk {
            h.update(r);
            all.update(r);
        }
        if hex::encode(h.finalize()) != want[key].as_str().unwrap() {
            bad.push(want["first"].as_u64().unwrap());
        }
    }
    (hex::encode(all.finalize()), bad)
}

#[test]
fn engine_wide_corpus_generator_matches_the_digest() {
    let d = digest();
    let strings = wide_strings(&d);
    assert_eq!(
        strings.len() as u64,
        d["strings"].as_u64().unwrap(),
        "string count"
    );
    let records: Vec<Vec<u8>> = strings.iter().map(|s| text_record(s)).collect();
    let (total, bad) = differing_chunks(&d, "texts_sha256", &records);
    assert!(
        bad.is_empty(),
        "texts differ in the chunks starting at {bad:?}"
    );
    assert_eq!(total, d["texts_sha256"].as_str().unwrap());
}

#[test]
fn engine_tokenizer_matches_the_wide_digest_and_curated_goldens() {
    let Some(upstream) = upstream_from_env() else {
        eprintln!("SKIPPED: DS41_UPSTREAM not set");
        return;
    };
    let path = upstream.join("tokenizer/tokenizer.json");
    assert_eq!(sha256_file(&path).unwrap(), TOKENIZER_SHA256);
    let tok = ds41_engine::tokenizer::Tokenizer::from_file(&path).unwrap();

    let d = digest();
    let records: Vec<Vec<u8>> = wide_strings(&d)
        .iter()
        .map(|s| ids_record(&tok.encode_markup(s)))
        .collect();
    let (total, bad) = differing_chunks(&d, "ids_sha256", &records);
    assert!(
        bad.is_empty(),
        "markup ids differ in the chunks starting at {bad:?}"
    );
    assert_eq!(total, d["ids_sha256"].as_str().unwrap());

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
