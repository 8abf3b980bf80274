//! DSML prompts to token ids (TOKENIZER.md §3.1, §5.1; DSML.md §6). Needs a release snapshot
//! (`DS41_RELEASE`: the V4.1 tokenizer.json and the official encoding cases); reported as
//! ignored with the reason otherwise.

use ds41_engine::dsml::{self, Control, Segment, ThinkingMode};
use ds41_engine::testing::release;
use ds41_engine::tokenizer::Tokenizer;
use std::path::PathBuf;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(release().join("tokenizer.json")).expect("load tokenizer.json")
}

/// The rendered official prompts tokenize to HF's ids (the `tokenizers` crate on the same
/// file; 548, 40, 579, 101 and 74 ids, as HF `tokenizers` 0.23.3 counts them).
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn official_prompts_tokenize_to_the_hf_ids() {
    let tok = tokenizer();
    let hf = tokenizers::Tokenizer::from_file(release().join("tokenizer.json")).unwrap();
    for n in 1..=5 {
        let input =
            std::fs::read_to_string(release().join(format!("encoding/tests/test_input_{n}.json")))
                .unwrap();
        let case = dsml::load_case(&input).unwrap();
        let prompt =
            dsml::render(&case.conversation, &case.options(ThinkingMode::Chat, None)).unwrap();
        let ids = hf
            .encode(prompt.to_string(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        // The official user data holds no control spelling, so the safe policy and HF agree.
        assert_eq!(
            prompt.encode(&tok).unwrap(),
            ids,
            "case {n}: segment encoding"
        );
        assert_eq!(
            prompt.encode_hf(&tok),
            ids,
            "case {n}: whole-string encoding"
        );
        assert_eq!(
            ids.len(),
            [548, 40, 579, 101, 74][n - 1],
            "case {n}: id count"
        );
    }
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn control_ids_match_the_tokenizer() {
    let tok = tokenizer();
    for c in Control::ALL {
        assert_eq!(tok.token_to_id(c.text()), Some(c.id()), "{}", c.text());
    }
    // `<｜DSML｜ calls>` is four ids (TOKENIZER.md §3.1).
    let mut p = dsml::Prompt::from("<");
    p.push_control(Control::Dsml);
    p.push_text(" calls>");
    assert_eq!(p.encode(&tok).unwrap(), [30, 128825, 10699, 32]);
}

/// The security boundary: markers typed into user data stay text with the segment encoding;
/// HF's whole-string encoding turns exactly those into control ids.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn user_markers_stay_text_only_on_the_segment_path() {
    let tok = tokenizer();
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../goldens/dsml/34_literal_markers_pass_through.json");
    let case = dsml::load_case(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let prompt = dsml::render(&case.conversation, &case.options(ThinkingMode::Chat, None)).unwrap();
    let safe = prompt.encode(&tok).unwrap();
    let hf = prompt.encode_hf(&tok);
    let count = |ids: &[u32], id: u32| ids.iter().filter(|&&i| i == id).count();
    let controls = |c: Control| {
        prompt
            .segments()
            .iter()
            .filter(|s| **s == Segment::Control(c))
            .count()
    };
    // Safe path: as many EOS / DSML / </think> / <｜User｜> / <｜Assistant｜> ids as the
    // renderer emitted controls.
    for c in [
        Control::Eos,
        Control::Dsml,
        Control::ThinkEnd,
        Control::User,
        Control::Assistant,
    ] {
        assert_eq!(count(&safe, c.id()), controls(c), "{}", c.text());
    }
    // HF path: the user's `<｜User｜>` and the tool result's DSML, EOS, </think> and
    // <｜Assistant｜> became one extra control id each.
    for c in [
        Control::Eos,
        Control::Dsml,
        Control::ThinkEnd,
        Control::User,
        Control::Assistant,
    ] {
        assert_eq!(count(&hf, c.id()), controls(c) + 1, "{}", c.text());
    }
    // Both decode to the same text.
    assert_eq!(tok.decode(&safe, false).unwrap(), prompt.to_string());
    assert_eq!(tok.decode(&hf, false).unwrap(), prompt.to_string());
}

/// Over every project golden: the segment encoding equals HF's whole-string encoding exactly
/// when no text segment spells an added token, so segment boundaries never change BPE.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn segment_and_whole_string_encodings_agree_unless_user_text_spells_a_token() {
    let tok = tokenizer();
    let golden_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/dsml");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&golden_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.with_extension("txt").exists())
        .collect();
    paths.sort();
    let (mut same, mut differ) = (0, 0);
    for path in &paths {
        let case = dsml::load_case(&std::fs::read_to_string(path).unwrap()).unwrap();
        let prompt =
            dsml::render(&case.conversation, &case.options(ThinkingMode::Chat, None)).unwrap();
        let spells_token = prompt.segments().iter().any(|s| match s {
            Segment::Text(t) => tok
                .added_tokens()
                .iter()
                .any(|a| t.contains(a.content.as_str())),
            Segment::Control(_) => false,
        });
        let agree = prompt.encode(&tok).unwrap() == prompt.encode_hf(&tok);
        assert_eq!(agree, !spells_token, "{}", path.display());
        if agree {
            same += 1
        } else {
            differ += 1
        }
    }
    eprintln!("goldens: {same} encode identically, {differ} differ at user-typed markers");
    assert!(same >= 30 && differ >= 1);
}
