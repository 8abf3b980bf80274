//! The engine tokenizer against the release V4.1 `tokenizer.json` (TOKENIZER.md §7–§9):
//! the stored HF 0.23.3 ids of the 24,021-string wide corpus, the HF `tokenizers` crate as a
//! live oracle for both entry points, the spec vectors, the DSML goldens and the round-trip
//! properties. Needs `DS41_UPSTREAM`; without it every test prints a skip reason.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use ds41_engine::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

const V41_SHA256: &str = "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b";

fn upstream() -> Option<PathBuf> {
    match std::env::var_os("DS41_UPSTREAM") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            eprintln!("SKIPPED: DS41_UPSTREAM not set");
            None
        }
    }
}

fn tokenizer_path(up: &std::path::Path) -> PathBuf {
    up.join("tokenizer/tokenizer.json")
}

/// The engine tokenizer, loaded once per test binary after checking the release sha256.
fn engine() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = tokenizer_path(&upstream().expect("checked by caller"));
        let bytes = std::fs::read(&path).expect("read tokenizer.json");
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            V41_SHA256,
            "{path:?} is not the V4.1 file"
        );
        let t0 = Instant::now();
        let tok = Tokenizer::from_json_bytes(&bytes, &path).expect("load");
        eprintln!("engine: loaded {path:?} in {:?}", t0.elapsed());
        tok
    })
}

/// HF `tokenizers` with the file as shipped (`encode_markup`'s oracle).
fn hf_markup() -> &'static tokenizers::Tokenizer {
    static TOK: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = tokenizer_path(&upstream().expect("checked by caller"));
        let t0 = Instant::now();
        let tok = tokenizers::Tokenizer::from_file(&path).expect("HF loads the V4.1 file");
        eprintln!("hf: loaded in {:?}", t0.elapsed());
        tok
    })
}

/// HF `tokenizers` with `added_tokens` emptied (`encode_text`'s oracle: plain BPE only).
fn hf_text() -> &'static tokenizers::Tokenizer {
    static TOK: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = tokenizer_path(&upstream().expect("checked by caller"));
        let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        json["added_tokens"] = Value::Array(vec![]);
        tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap()
    })
}

fn hf_ids(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false)
        .expect("HF encodes")
        .get_ids()
        .to_vec()
}

struct Record {
    i: u64,
    kind: String,
    text: String,
    ids: Vec<u32>,
}

fn wide_corpus(up: &std::path::Path) -> Vec<Record> {
    let path = up.join("tokenizer/wide_corpus_seed11_n20000.jsonl");
    let data = std::fs::read_to_string(&path).expect("read wide corpus");
    data.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("corpus line is JSON");
            Record {
                i: v["i"].as_u64().unwrap(),
                kind: v["kind"].as_str().unwrap().to_string(),
                text: v["text"].as_str().unwrap().to_string(),
                ids: v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect(),
            }
        })
        .collect()
}

fn codepoints(s: &str) -> String {
    s.chars().map(|c| format!("U+{:04X} ", c as u32)).collect()
}

#[test]
fn wide_corpus_matches_stored_hf_ids_and_live_oracle() {
    let Some(up) = upstream() else { return };
    let tok = engine();
    let corpus = wide_corpus(&up);
    assert_eq!(corpus.len(), 24_021, "the golden has 24,021 strings");
    let t0 = Instant::now();
    let mut stored_equal = 0usize;
    let mut per_kind = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    let mut failures = Vec::new();
    for r in &corpus {
        let got = tok.encode_markup(&r.text);
        let entry = per_kind.entry(r.kind.as_str()).or_default();
        entry.1 += 1;
        if got == r.ids {
            stored_equal += 1;
            entry.0 += 1;
        } else if failures.len() < 10 {
            failures.push(format!(
                "i={} {:?} [{}]\n  want {:?}\n  got  {:?}",
                r.i,
                r.text,
                codepoints(&r.text),
                r.ids,
                got
            ));
        }
    }
    let engine_time = t0.elapsed();
    eprintln!("engine encode_markup on {} strings: {engine_time:?}; per kind (equal, total): {per_kind:?}", corpus.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(stored_equal, 24_021);
    assert_eq!(per_kind["curated"], (21, 21));
    assert_eq!(per_kind["random"], (20_000, 20_000));
    assert_eq!(per_kind["whitespace"], (4_000, 4_000));

    // The live oracle, both policies.
    let (mut markup_equal, mut text_equal) = (0usize, 0usize);
    let mut failures = Vec::new();
    for r in &corpus {
        if hf_ids(hf_markup(), &r.text) == tok.encode_markup(&r.text) {
            markup_equal += 1;
        } else {
            failures.push(format!("markup i={}", r.i));
        }
        if hf_ids(hf_text(), &r.text) == tok.encode_text(&r.text) {
            text_equal += 1;
        } else {
            failures.push(format!("text i={}", r.i));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!((markup_equal, text_equal), (24_021, 24_021));
}
