//! A small synthetic byte-level BPE `tokenizer.json` with the DS41 pre-tokenizer: the engine
//! must agree with the HF `tokenizers` crate on it for both merge encodings, and must refuse
//! malformed or unsupported files with an error naming the field or byte offset. Runs without
//! upstream data.

use std::path::Path;

use ds41_engine::tokenizer::byte_level::BYTE_TO_CHAR;
use ds41_engine::tokenizer::load::DS41_SPLIT_PATTERNS;
use ds41_engine::tokenizer::{corpus, Tokenizer};
use ds41_engine::Error;
use serde_json::{json, Value};

const MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("=", "="),
    ("==", "=="),
    ("Ċ", "Ċ"),
    ("Ġ", "Ġ"),
    ("å", "¥"),
    ("å¥", "½"),
    ("1", "2"),
    ("12", "3"),
    ("ï", "½"),
    ("ï½", "ľ"),
    ("Ġ", "in"),
    ("o", "r"),
    ("Ġ", "w"),
    ("Ġw", "or"),
];

fn added(id: u32, content: &str, special: bool, normalized: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": normalized, "special": special})
}

/// The synthetic file; `pairs` selects the `[["a", "b"]]` merge encoding.
fn synthetic(pairs: bool) -> Value {
    let mut vocab = serde_json::Map::new();
    for (id, s) in ["<s>", "</s>", "<pad>"].iter().enumerate() {
        vocab.insert(s.to_string(), json!(id));
    }
    // Byte symbols in the DS41 order: printable bytes by value, then the remapped ones.
    let mut symbols: Vec<char> = BYTE_TO_CHAR.to_vec();
    symbols.sort_by_key(|&c| (c as u32 >= 0x100, c as u32));
    for c in symbols {
        let id = vocab.len();
        vocab.insert(c.to_string(), json!(id));
    }
    let mut merges = Vec::new();
    for (a, b) in MERGES {
        let id = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(id));
        merges.push(if pairs {
            json!([a, b])
        } else {
            json!(format!("{a} {b}"))
        });
    }
    let n = vocab.len() as u32;
    let splits: Vec<Value> = DS41_SPLIT_PATTERNS
        .iter()
        .map(|p| json!({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false}))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            added(0, "<s>", true, false),
            added(1, "</s>", true, false),
            added(2, "<pad>", true, false),
            added(n, "<|user|>", false, false),
            added(n + 1, "<|sys|>", false, true),
            added(n + 2, "｜DSML｜", false, false),
            added(n + 3, "<|user|>x", true, false),
        ],
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            splits[0], splits[1], splits[2],
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    })
}

fn load(v: &Value) -> Result<Tokenizer, Error> {
    Tokenizer::from_json_bytes(
        &serde_json::to_vec_pretty(v).unwrap(),
        Path::new("synthetic.json"),
    )
}

fn hf(v: &Value) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_bytes(serde_json::to_vec(v).unwrap())
        .expect("HF loads the synthetic file")
}

fn texts() -> Vec<String> {
    let mut t: Vec<String> = corpus::wide(1500, 5).into_iter().map(|s| s.text).collect();
    t.extend(corpus::extra().into_iter().map(|s| s.text));
    t.extend(
        [
            "the in the world ==== 12345 好好好",
            "<|user|>x<|user|>y<|sys|> <|sys|><|user|",
            "a<|sys|>｜DSML｜b <｜DSML｜ calls>",
            "\n\n\n   \n\t\n",
        ]
        .map(String::from),
    );
    t
}

#[test]
fn agrees_with_hf_for_both_merge_encodings() {
    for pairs in [false, true] {
        let v = synthetic(pairs);
        let tok = load(&v).unwrap();
        let hf_markup = hf(&v);
        let mut plain = v.clone();
        plain["added_tokens"] = json!([
            added(0, "<s>", true, false),
            added(1, "</s>", true, false),
            added(2, "<pad>", true, false)
        ]);
        let hf_text = hf(&plain);
        let texts = texts();
        let mut equal = 0;
        for t in &texts {
            let want = hf_markup
                .encode(t.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(tok.encode_markup(t), want, "markup {t:?}");
            let want = hf_text
                .encode(t.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(tok.encode_text(t), want, "text {t:?}");
            let ids = tok.encode_markup(t);
            for skip in [false, true] {
                assert_eq!(
                    tok.decode(&ids, skip).unwrap(),
                    hf_markup.decode(&ids, skip).unwrap()
                );
            }
            equal += 1;
        }
        assert_eq!(equal, texts.len());
        // Leftmost-longest: "<|user|>x" (special) wins over "<|user|>".
        let n = tok.token_to_id("<|user|>").unwrap();
        assert_eq!(tok.encode_markup("<|user|>x"), vec![n + 3]);
        assert!(tok.is_special(n + 3) && !tok.is_special(n) && tok.is_special(0));
    }
}

fn field_error(v: &Value) -> (String, String) {
    match load(v) {
        Err(Error::Tokenizer { field, reason, .. }) => (field, reason),
        Err(other) => panic!("expected a field error, got {other}"),
        Ok(_) => panic!("accepted a bad file"),
    }
}

#[test]
fn refuses_bad_files_naming_the_field() {
    let base = synthetic(false);
    let mut v = base.clone();
    v["model"]["merges"][3] = json!("i nn");
    let (field, reason) = field_error(&v);
    assert_eq!(field, "model.merges[3]");
    assert!(reason.contains("\"nn\""), "{reason}");

    let mut v = base.clone();
    v["model"]["merges"][5] = json!("a b c");
    assert_eq!(field_error(&v).0, "model.merges[5]");

    let mut v = base.clone();
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let id = vocab.remove("Ġ").unwrap();
    vocab.insert("not-a-byte".into(), id);
    v["model"]["merges"] = json!([]);
    let (field, reason) = field_error(&v);
    assert_eq!(field, "model.vocab");
    assert!(reason.contains("0x20"), "{reason}");

    let mut v = base.clone();
    v["normalizer"] = json!({"type": "NFC"});
    assert_eq!(field_error(&v).0, "normalizer");

    let mut v = base.clone();
    v["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = json!(r"\s+");
    assert_eq!(field_error(&v).0, "pre_tokenizer.pretokenizers[2]");

    let mut v = base.clone();
    v["added_tokens"][4]["lstrip"] = json!(true);
    assert_eq!(field_error(&v).0, "added_tokens[4]");

    // A gap in the ids (an id skipped, still below the number of entries).
    let mut v = base.clone();
    let n = base["model"]["vocab"].as_object().unwrap().len();
    v["added_tokens"][3]["id"] = json!(n + 5);
    let (field, reason) = field_error(&v);
    assert_eq!(field, "model.vocab");
    assert!(reason.contains("no token has id"), "{reason}");

    let mut v = base.clone();
    v["added_tokens"][3]["id"] = json!(5);
    assert_eq!(field_error(&v).0, "added_tokens[3]");

    let mut v = base.clone();
    v["model"]["type"] = json!("WordPiece");
    assert_eq!(field_error(&v).0, "model.type");

    let mut v = base.clone();
    v["model"]["byte_fallback"] = json!(true);
    assert_eq!(field_error(&v).0, "model.byte_fallback");

    let mut v = base.clone();
    v["decoder"] = Value::Null;
    assert_eq!(field_error(&v).0, "decoder");
}

/// One id far beyond the vocabulary (in the vocab or in added_tokens) is refused naming it,
/// before anything is allocated for it (a table sized by the largest id would need ~100 GB).
#[test]
fn a_huge_id_is_refused_before_allocation() {
    let base = synthetic(false);
    let mut v = base.clone();
    v["model"]["vocab"]["Ġt"] = json!(u32::MAX);
    let (field, reason) = field_error(&v);
    assert_eq!(field, "model.vocab");
    assert!(
        reason.contains("4294967295") && reason.contains("\"Ġt\""),
        "{reason}"
    );

    let mut v = base.clone();
    v["added_tokens"][5]["id"] = json!(u32::MAX);
    let (field, reason) = field_error(&v);
    assert_eq!(field, "added_tokens[5]");
    assert!(reason.contains("id 4294967295 is beyond"), "{reason}");
}

#[test]
fn json_syntax_error_names_the_byte_offset() {
    let mut bytes = serde_json::to_vec_pretty(&synthetic(false)).unwrap();
    let at = bytes.windows(7).position(|w| w == b"\"model\"").unwrap();
    bytes.insert(at, b'#');
    match Tokenizer::from_json_bytes(&bytes, Path::new("broken.json")) {
        Err(Error::Format { file, offset, .. }) => {
            assert_eq!(file, Path::new("broken.json"));
            assert_eq!(offset, at as u64, "offset of the stray byte");
        }
        other => panic!("expected a format error, got {other:?}"),
    }
    let missing = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err();
    assert!(missing.to_string().contains("/nonexistent/tokenizer.json"));
}
