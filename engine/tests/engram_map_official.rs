//! The Engram token map built from any byte-level BPE tokenizer.json equals what the official
//! `build_compressed_token_map` (release `inference/engram.py`) builds from it:
//!
//! * goldens/engram_maps/NAME.map.json are the official code's maps of NAME.tokenizer.json,
//!   tokenizers made to reach its corners (normalisation collisions, partial UTF-8, raw
//!   strings, byte fallback, added and special tokens, ids with gaps and reassigned added
//!   ids); written by goldens/regen/engram_token_map.py, which the Python-gated trial
//!   `regen_python::engram-map-vs-official` reruns;
//! * official_a's stub tokenizer gives the map its goldens carry (`DS41_UPSTREAM`);
//! * what the map does not depend on (the pre-tokenizer) does not stop it, and what it cannot
//!   do without (a BPE model, the ByteLevel decoder) is refused naming the field.

use std::path::{Path, PathBuf};

use ds41_engine::tokenizer::engram_map::{token_map, token_map_from_file};
use ds41_engine::Error;
use sha2::{Digest, Sha256};

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../goldens/engram_maps")
}

#[test]
fn maps_equal_the_official_goldens() {
    let mut checked = 0;
    for entry in std::fs::read_dir(goldens()).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".map.json"))
        else {
            continue;
        };
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let tokenizer = goldens().join(format!("{name}.tokenizer.json"));
        let bytes = std::fs::read(&tokenizer).unwrap();
        assert_eq!(
            golden["sha256"].as_str().unwrap(),
            hex::encode(Sha256::digest(&bytes)),
            "{name}: the golden was made from another tokenizer.json"
        );
        let want: Vec<i32> = golden["map"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        let got = token_map(&bytes, &tokenizer).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: len(tokenizer)");
        if let Some(id) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{name}: token {id} maps to {}, the official code to {}",
                got[id], want[id]
            );
        }
        assert_eq!(
            golden["compressed_vocab_size"].as_u64().unwrap() as usize,
            ds41_engine::tokenizer::engram_map::compressed_vocab_size(&got)
        );
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} goldens found");
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_stub_tokenizer_gives_its_goldens_map() {
    let up = ds41_engine::testing::upstream();
    let golden = ds41_engine::trace::TraceFile::read(
        &up.join("official_a/p48_d00/golden_prefill_only.safetensors"),
    )
    .unwrap();
    let want: Vec<i32> = golden
        .i64("engram_token_map")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as i32)
        .collect();
    let got = token_map_from_file(&up.join("official_a/checkpoint/tokenizer.json")).unwrap();
    assert_eq!(got, want);
}

/// A minimal byte-level BPE tokenizer.json with `model` and `decoder` replaced.
fn tokenizer_json(model_type: Option<&str>, decoder: serde_json::Value) -> Vec<u8> {
    let mut model = serde_json::json!({"vocab": {"a": 0, "b": 1, "Ġ": 2}, "merges": []});
    if let Some(t) = model_type {
        model["type"] = t.into();
    }
    serde_json::to_vec(&serde_json::json!({
        "added_tokens": [],
        "pre_tokenizer": {"type": "Whitespace"},
        "decoder": decoder,
        "model": model,
    }))
    .unwrap()
}

#[test]
fn only_the_model_and_decoder_are_required() {
    let byte_level = serde_json::json!({"type": "ByteLevel"});
    let p = Path::new("t.json");
    // Any pre-tokenizer: the map does not read it.
    assert_eq!(
        token_map(&tokenizer_json(Some("BPE"), byte_level.clone()), p).unwrap(),
        vec![0, 1, 2]
    );
    let refused = |bytes: Vec<u8>, field: &str| match token_map(&bytes, p) {
        Err(Error::Tokenizer {
            field: f, reason, ..
        }) => {
            assert_eq!(f, field, "{reason}");
            reason
        }
        other => panic!("expected a refusal naming `{field}`, got {other:?}"),
    };
    let r = refused(
        tokenizer_json(Some("WordPiece"), byte_level.clone()),
        "model.type",
    );
    assert!(r.contains("WordPiece"), "{r}");
    refused(tokenizer_json(None, byte_level), "model.type");
    let r = refused(
        tokenizer_json(Some("BPE"), serde_json::json!({"type": "ByteFallback"})),
        "decoder",
    );
    assert!(r.contains("ByteLevel"), "{r}");
    refused(
        tokenizer_json(Some("BPE"), serde_json::Value::Null),
        "decoder",
    );
    // Two tokens on one id: HF keeps either, so there is no official map to match.
    let dup = br#"{"decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}}"#;
    refused(dup.to_vec(), "model.vocab");
    assert!(matches!(
        token_map(b"{not json", p),
        Err(Error::Format { .. })
    ));
}
