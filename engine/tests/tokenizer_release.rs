//! The engine tokenizer against the release V4.1 `tokenizer.json` (TOKENIZER.md §7–§9): the
//! HF `tokenizers` crate as a live oracle for both entry points on the 24,021-string wide
//! corpus (regenerated from its seed; the stored HF 0.23.3 ids are checked by digest in the
//! conformance case tokenizer::release::wide-corpus), the spec vectors, the official DSML
//! prompts and the round-trip properties. The tokenizer comes from the release snapshot
//! (`DS41_RELEASE`); without it the tests are reported as ignored with the reason.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use ds41_engine::testing::release;
use ds41_engine::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

const V41_SHA256: &str = "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b";

fn tokenizer_path() -> PathBuf {
    release().join("tokenizer.json")
}

/// The engine tokenizer, loaded once per test binary after checking the release sha256.
fn engine() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = tokenizer_path();
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
        let path = tokenizer_path();
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
        let path = tokenizer_path();
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
    i: usize,
    kind: &'static str,
    text: String,
}

/// The wide corpus (TOKENIZER.md §9), regenerated from its seed and size.
fn wide_corpus() -> Vec<Record> {
    ds41_engine::tokenizer::corpus::wide(20_000, 11)
        .into_iter()
        .enumerate()
        .map(|(i, s)| Record {
            i,
            kind: s.kind,
            text: s.text,
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn wide_corpus_matches_the_live_oracle() {
    let tok = engine();
    let corpus = wide_corpus();
    assert_eq!(corpus.len(), 24_021, "the corpus has 24,021 strings");
    let mut per_kind = std::collections::BTreeMap::<&str, usize>::new();
    for r in &corpus {
        *per_kind.entry(r.kind).or_default() += 1;
    }
    assert_eq!(per_kind["curated"], 21);
    assert_eq!(per_kind["random"], 20_000);
    assert_eq!(per_kind["whitespace"], 4_000);
    let t0 = Instant::now();
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
    eprintln!(
        "engine + HF on {} strings, both policies: {:?}",
        corpus.len(),
        t0.elapsed()
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!((markup_equal, text_equal), (24_021, 24_021));
}

/// The extra curated strings agree with the HF oracle under both policies.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn extra_corpus_matches_oracle() {
    let tok = engine();
    let extra = ds41_engine::tokenizer::corpus::extra();
    let mut equal = 0;
    for s in &extra {
        assert_eq!(
            tok.encode_markup(&s.text),
            hf_ids(hf_markup(), &s.text),
            "markup {:?}",
            s.text
        );
        assert_eq!(
            tok.encode_text(&s.text),
            hf_ids(hf_text(), &s.text),
            "text {:?}",
            s.text
        );
        equal += 1;
    }
    assert_eq!(equal, extra.len());
}

fn ids(v: &[u32]) -> Vec<u32> {
    v.to_vec()
}

/// TOKENIZER.md §7 (the first two rows are the published upstream vectors).
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn spec_vectors() {
    let tok = engine();
    let cases: &[(&str, &[u32])] = &[
        (
            "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
            &[
                19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589,
                131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98,
            ],
        ),
        (
            "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
            &[128803, 30594, 128804, 128821, 36101, 128822, 7624, 1],
        ),
        ("<｜DSML｜ calls>", &[30, 128825, 10699, 32]),
        (
            "<｜DSML｜tool_calls>",
            &[30, 128825, 72461, 4941, 12548, 32],
        ),
        (".\n\n", &[339]),
        ("\n\n", &[271]),
        ("12345", &[6895, 1883]),
        ("y.foo;(x)=", &[91, 4658, 6379, 22969, 90, 6912]),
        ("A股 维生素C", &[35, 3110, 223, 22462, 37]),
        ("\u{a0}x", &[2162, 90]),
        (
            "done.\n\n<｜DSML｜ calls>\n",
            &[44629, 339, 30, 128825, 10699, 1018],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode_markup(text), ids(want), "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), *text);
    }
    // Skipping drops only special=true tokens; <｜System｜> (128799) is not special in V4.1.
    let ids = [
        0, 128799, 44489, 128803, 83, 128804, 128821, 128822, 128825, 1,
    ];
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "<｜System｜>sys<｜User｜>q<｜Assistant｜><think></think>｜DSML｜"
    );
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<｜begin▁of▁sentence｜><｜System｜>sys<｜User｜>q<｜Assistant｜><think></think>｜DSML｜<｜end▁of▁sentence｜>"
    );
    assert_eq!(tok.vocab_size(), 129_280);
    assert_eq!(tok.added_tokens().len(), 1_283);
}

/// The five official DSML prompts of the release snapshot encode to HF's ids (548, 40, 579,
/// 101 and 74 ids with HF `tokenizers` 0.23.3) and decode back exactly.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn dsml_golden_prompts() {
    let tok = engine();
    let mut checked = 0;
    for (n, want_len) in [(1, 548), (2, 40), (3, 579), (4, 101), (5, 74)] {
        let prompt =
            std::fs::read_to_string(release().join(format!("encoding/tests/test_output_{n}.txt")))
                .unwrap();
        let want = hf_ids(hf_markup(), &prompt);
        assert_eq!(want.len(), want_len, "test_output_{n}.txt: HF id count");
        assert_eq!(tok.encode_markup(&prompt), want, "test_output_{n}.txt");
        assert_eq!(tok.decode(&want, false).unwrap(), prompt);
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// TOKENIZER.md §8 and the `encode_text` security boundary.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn round_trips_and_control_token_boundary() {
    let tok = engine();
    // Every added token's content encodes to exactly its id as markup, and to no added id
    // (in fact to the same ids as HF without added tokens) as text.
    for t in tok.added_tokens() {
        assert_eq!(tok.encode_markup(&t.content), vec![t.id], "{:?}", t.content);
        let as_text = tok.encode_text(&t.content);
        assert!(
            as_text.iter().all(|&id| !tok.is_added(id)),
            "{:?} -> {as_text:?}",
            t.content
        );
        assert_eq!(tok.decode(&as_text, false).unwrap(), t.content);
    }
    assert_eq!(
        tok.encode_text("<｜User｜>"),
        hf_ids(hf_text(), "<｜User｜>")
    );
    assert_ne!(tok.encode_text("｜DSML｜"), vec![128825]);
    // Decode(encode(s)) == s on the whole corpus, under both policies; no BOS/EOS is added.
    let mut round_trips = 0;
    for r in wide_corpus() {
        for ids in [tok.encode_markup(&r.text), tok.encode_text(&r.text)] {
            assert_eq!(tok.decode(&ids, false).unwrap(), r.text, "i={}", r.i);
        }
        let text_ids = tok.encode_text(&r.text);
        assert!(text_ids.iter().all(|&id| !tok.is_added(id)), "i={}", r.i);
        round_trips += 1;
    }
    assert_eq!(round_trips, 24_021);
    assert_eq!(tok.encode_markup("hi"), tok.encode_text("hi"));
    // Every id decodes to a non-empty string; byte symbols to exactly one byte.
    for id in 0..tok.vocab_size() as u32 {
        let bytes = tok.decode_bytes(&[id], false).unwrap();
        assert!(!bytes.is_empty(), "id {id}");
        if (3..=258).contains(&id) {
            assert_eq!(bytes.len(), 1, "byte symbol {id}");
        }
    }
    // Out-of-range ids are an error naming the position, not a silent drop.
    let err = tok.decode(&[5, 129_280], false).unwrap_err().to_string();
    assert!(err.contains("ids[1]") && err.contains("129280"), "{err}");
    // HF agrees on decode with and without skipping for a mixed sequence.
    let mixed: Vec<u32> = (0..400).map(|i| (i * 331 + 7) % 129_280).collect();
    for skip in [false, true] {
        assert_eq!(
            tok.decode(&mixed, skip).unwrap(),
            hf_markup().decode(&mixed, skip).unwrap()
        );
    }
}
