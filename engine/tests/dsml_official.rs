//! DSML against the official encoder/parser (DSML.md §2.5, §3.1): the five official cases of
//! the release snapshot's encoding/tests byte for byte (`DS41_RELEASE`), and the project's
//! probes with what the official encoding.py answers to each (goldens/dsml_probes/, made by
//! goldens/regen/dsml_probes.py): same accepted/rejected, same output, same exception class
//! and message.

use ds41_engine::dsml::{self, case, json_py, ParseMode, RenderOptions, ThinkingMode};
use ds41_engine::testing::release;
use serde_json::Value;
use std::path::PathBuf;

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn official_cases_render_byte_for_byte() {
    for n in 1..=5 {
        let input = read(release().join(format!("encoding/tests/test_input_{n}.json")));
        let expected = read(release().join(format!("encoding/tests/test_output_{n}.txt")));
        let case = dsml::load_case(&input).unwrap_or_else(|e| panic!("case {n}: {e}"));
        // `encode_case(case, thinking_mode="chat")`.
        let options = case.options(ThinkingMode::Chat, None);
        let prompt =
            dsml::render(&case.conversation, &options).unwrap_or_else(|e| panic!("case {n}: {e}"));
        let got = prompt.to_string();
        if got != expected {
            let at = got
                .bytes()
                .zip(expected.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            panic!(
                "case {n} differs at byte {at}:\n got: {:?}\nwant: {:?}",
                &got[at.saturating_sub(40)..(at + 80).min(got.len())],
                &expected[at.saturating_sub(40)..(at + 80).min(expected.len())]
            );
        }
        if n == 5 {
            assert_eq!(prompt.images.len(), 2, "case 5 carries two image records");
            assert_eq!(prompt.images[0]["url"], "examples/images/carrots.jpeg");
        }
    }
}

/// Runs one probe: `Ok(value)` in the probe-result form or `Err("<Exception>: message")`.
fn run_probe(probe: &Value) -> Result<Value, String> {
    let call = probe["call"].as_str().unwrap();
    let mode: ThinkingMode = probe["thinking_mode"].as_str().unwrap().parse().unwrap();
    let reference = |e: dsml::Error| {
        e.reference_error()
            .unwrap_or_else(|| format!("(input error) {e}"))
    };
    if call == "parse_message_from_completion_text" {
        let text = probe["text"].as_str().unwrap();
        return dsml::parse(text, ParseMode::strict(mode))
            .map(|m| m.to_json())
            .map_err(reference);
    }
    let messages = case::messages_from_json(&probe["messages"], "messages").map_err(reference)?;
    let effort =
        dsml::ReasoningEffort::from_json(probe.get("reasoning_effort").unwrap_or(&Value::Null))
            .map_err(reference)?;
    let options = RenderOptions {
        thinking_mode: mode,
        reasoning_effort: effort,
        drop_thinking: probe
            .get("drop_thinking")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        add_default_bos_token: true,
    };
    let conversation = dsml::Conversation {
        messages,
        context: Vec::new(),
    };
    let index = probe
        .get("index")
        .and_then(Value::as_u64)
        .map(|i| i as usize);
    match call {
        "render_message" => dsml::render_message(&conversation, index.unwrap(), &options)
            .map(|p| Value::String(p.to_string()))
            .map_err(reference),
        "render_message == completion" => {
            dsml::render_message(&conversation, index.unwrap(), &options)
                .map(|p| Value::Bool(p.to_string() == probe["completion"].as_str().unwrap()))
                .map_err(reference)
        }
        c if c.starts_with("encode_messages") => {
            let prompt = dsml::render(&conversation, &options)
                .map_err(reference)?
                .to_string();
            if c.contains("first 80 characters") {
                Ok(Value::String(prompt.chars().take(80).collect()))
            } else {
                Ok(Value::String(prompt))
            }
        }
        other => panic!("unknown probe call {other}"),
    }
}

#[test]
fn all_official_probes_agree() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/dsml_probes");
    let inputs: Value = serde_json::from_str(&read(dir.join("probe_inputs.json"))).unwrap();
    let results: Value = serde_json::from_str(&read(dir.join("probe_results.json"))).unwrap();
    let probes = inputs["probes"].as_object().unwrap();
    let mut agree = 0;
    let mut failures = Vec::new();
    for (name, probe) in probes {
        let want = &results[name];
        let got = run_probe(probe);
        let same = match (&got, want["ok"].as_bool().unwrap()) {
            // Order-sensitive comparison: the reference's key order is part of its output.
            (Ok(v), true) => json_py::dumps(v) == json_py::dumps(&want["value"]),
            (Err(e), false) => e == want["error"].as_str().unwrap(),
            _ => false,
        };
        if same {
            agree += 1;
        } else {
            failures.push(format!("{name}: got {got:?}, want {want}"));
        }
    }
    eprintln!("official probes: {agree}/{} agree", probes.len());
    assert!(probes.len() >= 60, "only {} probes", probes.len());
    assert!(
        failures.is_empty(),
        "{} probes disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
