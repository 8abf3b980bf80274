//! Reading a HF `tokenizer.json` (TOKENIZER.md §2, §5, §6) into checked parts.
//!
//! Supported: byte-level BPE (`model.type` BPE without dropout, unk token, subword prefix or
//! suffix, byte fallback or `ignore_merges`), merges as `"a b"` or `["a", "b"]`, an empty
//! normaliser, the DS41 pre-tokenizer (compared verbatim, since it is implemented by hand),
//! `ByteLevel` decoder and post-processor (or none), and added tokens whose `single_word`,
//! `lstrip` and `rstrip` are false. Anything else is refused with the field that differs.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use super::added_tokens::AddedToken;
use super::byte_level::BYTE_TO_CHAR;
use crate::{Error, Result};

/// The DS41 pre-tokenizer, exactly as `tokenizer.json` spells it (JSON-decoded).
pub const DS41_SPLIT_PATTERNS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

#[derive(Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedTokenJson>,
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    pre_tokenizer: Value,
    #[serde(default)]
    post_processor: Value,
    #[serde(default)]
    decoder: Value,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedTokenJson {
    id: u32,
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default = "default_true")]
    normalized: bool,
    #[serde(default)]
    special: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    vocab: foldhash::HashMap<String, u32>,
    merges: Vec<MergeJson>,
}

/// One merge: `"a b"` or `["a", "b"]`. Deserialised by hand because serde's untagged enums
/// buffer every value, which is slow over 127,741 merges.
enum MergeJson {
    Joined(String),
    Pair([String; 2]),
}

impl<'de> Deserialize<'de> for MergeJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = MergeJson;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a merge \"a b\" or [\"a\", \"b\"]")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<MergeJson, E> {
                Ok(MergeJson::Joined(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                v: String,
            ) -> std::result::Result<MergeJson, E> {
                Ok(MergeJson::Joined(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<MergeJson, A::Error> {
                use serde::de::Error;
                let left: String = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let right: String = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(3, &self));
                }
                Ok(MergeJson::Pair([left, right]))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// What the tokenizer is built from.
pub struct Parts {
    /// Token string of every id (vocab spelling, or the added token's content).
    pub tokens: Vec<String>,
    pub added: Vec<AddedToken>,
    pub byte_ids: [u32; 256],
    /// (left, right, result) ids in rank order.
    pub merges: Vec<(u32, u32, u32)>,
}

pub fn parse(bytes: &[u8], file: &Path) -> Result<Parts> {
    let json: TokenizerJson = serde_json::from_slice(bytes).map_err(|e| Error::Format {
        file: file.to_path_buf(),
        offset: json_error_offset(bytes, &e),
        reason: e.to_string(),
    })?;
    let bad = |field: &str, reason: String| Error::Tokenizer {
        file: file.to_path_buf(),
        field: field.to_string(),
        reason,
    };
    check_components(&json).map_err(|(field, reason)| bad(&field, reason))?;
    let model = &json.model;

    // Ids: the vocab plus the added tokens must cover 0..size exactly once per id, so no id
    // can reach the number of entries. Checked before the id table is allocated: one huge id
    // must be refused, not allocated for.
    let entries = model.vocab.len() + json.added_tokens.len();
    if let Some((s, &id)) = model.vocab.iter().find(|(_, &id)| id as usize >= entries) {
        return Err(bad(
            "model.vocab",
            format!(
                "{s:?} has id {id}, beyond the {entries} entries of vocab and added_tokens \
                 (ids must cover 0..size)"
            ),
        ));
    }
    if let Some((i, t)) = json
        .added_tokens
        .iter()
        .enumerate()
        .find(|(_, t)| t.id as usize >= entries)
    {
        return Err(bad(
            &format!("added_tokens[{i}]"),
            format!(
                "id {} is beyond the {entries} entries of vocab and added_tokens \
                 (ids must cover 0..size)",
                t.id
            ),
        ));
    }
    let size = model
        .vocab
        .values()
        .chain(json.added_tokens.iter().map(|t| &t.id))
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut tokens: Vec<Option<String>> = vec![None; size];
    for (s, &id) in &model.vocab {
        if let Some(other) = tokens[id as usize].replace(s.clone()) {
            return Err(bad(
                "model.vocab",
                format!("{other:?} and {s:?} share id {id}"),
            ));
        }
    }
    let mut added_ids = foldhash::HashSet::default();
    let mut added = Vec::with_capacity(json.added_tokens.len());
    let mut seen_content = foldhash::HashSet::default();
    for (i, t) in json.added_tokens.iter().enumerate() {
        let field = format!("added_tokens[{i}]");
        if t.single_word || t.lstrip || t.rstrip {
            return Err(bad(
                &field,
                "single_word, lstrip and rstrip must be false (not supported)".into(),
            ));
        }
        if t.content.is_empty() {
            return Err(bad(&field, "empty content".into()));
        }
        if !seen_content.insert(t.content.as_str()) {
            return Err(bad(&field, format!("duplicate content {:?}", t.content)));
        }
        if !added_ids.insert(t.id) {
            return Err(bad(&field, format!("duplicate id {}", t.id)));
        }
        match &tokens[t.id as usize] {
            Some(existing) if existing != &t.content => {
                return Err(bad(
                    &field,
                    format!(
                        "id {} is vocab entry {existing:?}, not {:?}",
                        t.id, t.content
                    ),
                ))
            }
            _ => tokens[t.id as usize] = Some(t.content.clone()),
        }
        added.push(AddedToken {
            id: t.id,
            content: t.content.clone(),
            special: t.special,
            normalized: t.normalized,
        });
    }
    let tokens = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| t.ok_or_else(|| bad("model.vocab", format!("no token has id {id}"))))
        .collect::<Result<Vec<String>>>()?;

    let mut byte_ids = [0u32; 256];
    for (b, id) in byte_ids.iter_mut().enumerate() {
        let symbol = BYTE_TO_CHAR[b].to_string();
        *id = *model.vocab.get(&symbol).ok_or_else(|| {
            bad(
                "model.vocab",
                format!("byte 0x{b:02X} (symbol {symbol:?}) is missing"),
            )
        })?;
    }

    let mut merges = Vec::with_capacity(model.merges.len());
    let mut joined = String::new();
    for (rank, m) in model.merges.iter().enumerate() {
        let field = || format!("model.merges[{rank}]");
        let (left, right) = match m {
            MergeJson::Pair([l, r]) => (l.as_str(), r.as_str()),
            MergeJson::Joined(s) => match s.split_once(' ') {
                Some((l, r)) if !r.contains(' ') => (l, r),
                _ => return Err(bad(&field(), format!("{s:?} is not two tokens \"a b\""))),
            },
        };
        let id_of = |s: &str| {
            model
                .vocab
                .get(s)
                .copied()
                .ok_or_else(|| bad(&field(), format!("{s:?} is not in the vocab")))
        };
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        merges.push((id_of(left)?, id_of(right)?, id_of(&joined)?));
    }
    Ok(Parts {
        tokens,
        added,
        byte_ids,
        merges,
    })
}

/// The byte offset of a JSON syntax error (serde_json reports 1-based line and column).
fn json_error_offset(bytes: &[u8], e: &serde_json::Error) -> u64 {
    let line_start: usize = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(e.line().saturating_sub(1))
        .map(<[u8]>::len)
        .sum();
    (line_start + e.column().saturating_sub(1)) as u64
}

type FieldError = (String, String);

fn check_components(json: &TokenizerJson) -> std::result::Result<(), FieldError> {
    let err = |field: &str, reason: String| Err((field.to_string(), reason));
    let m = &json.model;
    if m.kind.as_deref().is_some_and(|k| k != "BPE") {
        return err("model.type", format!("{:?} is not BPE", m.kind));
    }
    for (field, set) in [
        ("model.dropout", m.dropout.is_some_and(|d| d != 0.0)),
        ("model.unk_token", m.unk_token.is_some()),
        (
            "model.continuing_subword_prefix",
            m.continuing_subword_prefix.is_some(),
        ),
        ("model.end_of_word_suffix", m.end_of_word_suffix.is_some()),
        ("model.byte_fallback", m.byte_fallback),
        ("model.ignore_merges", m.ignore_merges),
    ] {
        if set {
            return err(
                field,
                "must be unset for byte-level BPE (not supported)".into(),
            );
        }
    }
    let empty_sequence = json!({"type": "Sequence", "normalizers": []});
    if !(json.normalizer.is_null() || json.normalizer == empty_sequence) {
        return err("normalizer", "only an empty normaliser is supported".into());
    }
    check_pre_tokenizer(&json.pre_tokenizer)?;
    for (field, v, may_be_null) in [
        ("post_processor", &json.post_processor, true),
        ("decoder", &json.decoder, false),
    ] {
        let is_byte_level = v.get("type").and_then(Value::as_str) == Some("ByteLevel");
        if !(is_byte_level || (may_be_null && v.is_null())) {
            return err(field, format!("must be ByteLevel, found {v}"));
        }
    }
    Ok(())
}

fn check_pre_tokenizer(v: &Value) -> std::result::Result<(), FieldError> {
    let err = |field: String, reason: String| Err((field, reason));
    if v.get("type").and_then(Value::as_str) != Some("Sequence") {
        return err(
            "pre_tokenizer.type".into(),
            "must be the DS41 Sequence".into(),
        );
    }
    let steps = match v.get("pretokenizers").and_then(Value::as_array) {
        Some(s) if s.len() == 4 => s,
        _ => {
            return err(
                "pre_tokenizer.pretokenizers".into(),
                "must be the DS41 three Splits and ByteLevel".into(),
            )
        }
    };
    for (i, pattern) in DS41_SPLIT_PATTERNS.iter().enumerate() {
        let want = json!({"type": "Split", "pattern": {"Regex": pattern},
                          "behavior": "Isolated", "invert": false});
        if steps[i] != want {
            return err(
                format!("pre_tokenizer.pretokenizers[{i}]"),
                format!("is {}, expected the DS41 split {want}", steps[i]),
            );
        }
    }
    let byte_level = &steps[3];
    let flag = |k: &str| byte_level.get(k).and_then(Value::as_bool);
    if byte_level.get("type").and_then(Value::as_str) != Some("ByteLevel")
        || flag("add_prefix_space") != Some(false)
        || flag("use_regex") != Some(false)
    {
        return err(
            "pre_tokenizer.pretokenizers[3]".into(),
            format!("is {byte_level}, expected ByteLevel without prefix space or regex"),
        );
    }
    Ok(())
}

/// Reads a tokenizer.json (a regular file of at most [`crate::io::MAX_TOKENIZER_BYTES`]),
/// naming it in the error.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    crate::io::read_file(path, crate::io::MAX_TOKENIZER_BYTES, "tokenizer.json")
}
