//! Round-trip properties of DSML (DSML.md §3): rendered assistant messages parse back to
//! themselves, and accepted completions re-render to themselves (up to the documented
//! non-canonical forms the reference also accepts).

use ds41_engine::dsml::{
    self, json_py, render_completion, Control, ParseMode, ParsedMessage, ParsedToolCall,
    ThinkingMode,
};
use proptest::prelude::*;
use serde_json::{Map, Value};

const CONTROLS: [&str; 5] = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
];

/// Text that may hold quotes, markup-like characters, newlines and non-ASCII, but no control
/// spelling (those are errors in content by §3).
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 ]{1,6}",
            Just("\n".to_string()),
            Just("\n\n".to_string()),
            Just("\"".to_string()),
            Just("<".to_string()),
            Just(">".to_string()),
            Just("/".to_string()),
            Just("\\".to_string()),
            Just("é日本😀".to_string()),
            Just("｜".to_string()),
            Just("<｜User｜>".to_string()),
            Just("\t\u{1}".to_string()),
            Just("DSML".to_string()),
            Just("think>".to_string()),
        ],
        0..8,
    )
    .prop_map(|parts| parts.concat())
    .prop_filter("no control spellings", |s| {
        CONTROLS.iter().all(|c| !s.contains(c))
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(|x| serde_json::Number::from_f64(x)
                .map(Value::Number)
                .unwrap_or(Value::Null)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((text(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn tool_call() -> impl Strategy<Value = ParsedToolCall> {
    let key = "[a-zA-Z_é日][a-zA-Z0-9_é日 -]{0,8}";
    (
        "[a-zA-Z_é日][a-zA-Z0-9_.é日-]{0,10}",
        proptest::option::of("[a-z][a-z0-9_]{0,5}"),
        proptest::collection::vec((key, json_value()), 0..4),
    )
        .prop_map(|(name, namespace, params)| {
            let mut map = Map::new();
            for (k, v) in params {
                map.insert(k, v);
            }
            ParsedToolCall {
                name,
                namespace,
                // Python's json.dumps of the arguments dict: the canonical text.
                arguments: json_py::dumps(&Value::Object(map)),
            }
        })
}

fn message(mode: ThinkingMode) -> impl Strategy<Value = ParsedMessage> {
    (text(), text(), proptest::collection::vec(tool_call(), 0..3)).prop_map(
        move |(content, reasoning, tool_calls)| ParsedMessage {
            content,
            reasoning_content: if mode == ThinkingMode::Thinking {
                reasoning
            } else {
                String::new()
            },
            tool_calls,
            recoveries: Vec::new(),
        },
    )
}

fn mode() -> impl Strategy<Value = ThinkingMode> {
    prop_oneof![Just(ThinkingMode::Chat), Just(ThinkingMode::Thinking)]
}

// Every property runs from a fixed seed, so the default tests are deterministic; new inputs
// come from the fuzz campaign (fuzz/: dsml_strict, dsml_tolerant), and any shrunk failure is
// kept in dsml_roundtrip.proptest-regressions.
proptest! {
    #![proptest_config(ProptestConfig { cases: 400, rng_seed: proptest::test_runner::RngSeed::Fixed(41), ..ProptestConfig::default() })]

    /// parse(render(m)) == m for every canonical assistant message.
    #[test]
    fn rendered_messages_parse_back((mode, m) in mode().prop_flat_map(|mode| (Just(mode), message(mode)))) {
        let completion = render_completion(&m.to_message(), mode).unwrap().to_string();
        let parsed = dsml::parse(&completion, ParseMode::strict(mode));
        prop_assert_eq!(parsed.as_ref().ok(), Some(&m), "completion {:?} -> {:?}", completion, parsed);
        // The tolerant grammar agrees on clean input and reports no repair.
        let loose = dsml::parse(&completion, ParseMode::tolerant(mode)).unwrap();
        prop_assert_eq!(&loose, &m);
    }
}

/// Pieces of completions: well-formed markup, its V4 spellings, and broken fragments.
fn piece() -> impl Strategy<Value = String> {
    let good_value = prop_oneof![
        Just(("true", "v".to_string())),
        Just(("true", "line\n\"q\" <b>".to_string())),
        Just(("false", "2".to_string())),
        Just(("false", "[1, 2]".to_string())),
        Just(("false", "{\"k\": null}".to_string())),
    ];
    prop_oneof![
        text(),
        Just("\n\n<｜DSML｜ calls>\n".to_string()),
        "[a-z]{1,3}(::[a-z]{1,2})?".prop_map(|n| format!("<｜DSML｜ invoke name=\"{n}\">\n")),
        ("[a-c]", good_value).prop_map(|(k, (s, v))| format!(
            "<｜DSML｜ parameter name=\"{k}\" string=\"{s}\">{v}</｜DSML｜ parameter>\n"
        )),
        Just("</｜DSML｜ invoke>\n".to_string()),
        Just("</｜DSML｜ calls>".to_string()),
        Just(Control::Eos.text().to_string()),
        Just("</think>".to_string()),
        Just("<｜DSML｜tool_calls>\n".to_string()),
        Just("\n".to_string()),
        Just("<｜DSML｜ parameter name=\"a\" string=\"true\">cut".to_string()),
    ]
}

/// A well-formed completion built from the grammar (possibly with V4.1 quirks like duplicate
/// keys), then 0–2 random pieces inserted at random character positions.
fn shaped_completion() -> impl Strategy<Value = (ThinkingMode, String)> {
    let value = prop_oneof![
        text().prop_map(|v| ("true", v)),
        Just(("false", "2".to_string())),
        Just(("false", "[1, 2]".to_string())),
        Just(("false", "{\"k\": null}".to_string())),
        Just(("false", "-0.5".to_string())),
    ];
    let param = ("[a-c]", value).prop_map(|(k, (s, v))| {
        format!("<｜DSML｜ parameter name=\"{k}\" string=\"{s}\">{v}</｜DSML｜ parameter>")
    });
    let invoke = (
        "[a-z]{1,3}(::[a-z]{1,2})?",
        proptest::collection::vec(param, 0..3),
    )
        .prop_map(|(n, ps)| {
            format!(
                "<｜DSML｜ invoke name=\"{n}\">\n{}\n</｜DSML｜ invoke>",
                ps.join("\n")
            )
        });
    let block = proptest::option::of(proptest::collection::vec(invoke, 0..3)).prop_map(|b| {
        b.map(|invokes| {
            format!(
                "\n\n<｜DSML｜ calls>\n{}\n</｜DSML｜ calls>",
                invokes.join("\n")
            )
        })
    });
    (
        mode(),
        text(),
        text(),
        block,
        any::<bool>(),
        proptest::collection::vec((any::<prop::sample::Index>(), piece()), 0..3),
    )
        .prop_map(|(mode, reasoning, content, block, eos, inserts)| {
            let mut x = String::new();
            if mode == ThinkingMode::Thinking {
                x.push_str(&reasoning);
                x.push_str("</think>");
            }
            x.push_str(&content);
            let has_block = block.is_some();
            x.push_str(&block.unwrap_or_default());
            if eos || !has_block {
                x.push_str(Control::Eos.text());
            }
            for (at, piece) in inserts {
                let bounds: Vec<usize> =
                    x.char_indices().map(|(i, _)| i).chain([x.len()]).collect();
                let pos = bounds[at.index(bounds.len())];
                x.insert_str(pos, &piece);
            }
            (mode, x)
        })
}

/// Accepted forms that the renderer writes differently (the list in `engine/src/dsml/parse.rs`).
fn known_non_canonical(x: &str, parsed: &ParsedMessage) -> bool {
    let non_canonical_value =
        parsed
            .tool_calls
            .iter()
            .any(|c| match json_py::loads(&c.arguments) {
                Ok(v) => json_py::dumps(&v) != c.arguments,
                Err(_) => true,
            })
            || x.contains("string=\"false\">\"");
    let loose_invoke_name = x
        .match_indices("<｜DSML｜ invoke")
        .any(|(i, m)| !x[i + m.len()..].starts_with(" name=\""));
    loose_invoke_name
        || x.contains("\">\n</｜DSML｜ invoke")
        || x.contains("\">\n\n<｜DSML｜ parameter")
        || x.contains("<\n/｜DSML｜ parameter")
        || (x.contains("\n\n<｜DSML｜ calls") && !x.contains("</｜DSML｜ calls>"))
        || (x.contains("\n\n<｜DSML｜ calls") && parsed.tool_calls.is_empty())
        || !x.ends_with(Control::Eos.text())
        || non_canonical_value
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, rng_seed: proptest::test_runner::RngSeed::Fixed(41), ..ProptestConfig::default() })]

    /// For every completion the strict grammar accepts: re-rendering reproduces it byte for
    /// byte (unless it is one of the documented non-canonical forms), and the re-rendered text
    /// is a fixed point of parse-then-render.
    #[test]
    fn accepted_completions_render_back((mode, x) in shaped_completion()) {
        if let Ok(parsed) = dsml::parse(&x, ParseMode::strict(mode)) {
            let again = render_completion(&parsed.to_message(), mode).unwrap().to_string();
            if !known_non_canonical(&x, &parsed) {
                prop_assert_eq!(&again, &x);
            }
            // The re-rendered text is canonical: it parses, and renders to itself.
            let reparsed = dsml::parse(&again, ParseMode::strict(mode)).unwrap();
            let third = render_completion(&reparsed.to_message(), mode).unwrap().to_string();
            prop_assert_eq!(&third, &again);
            if !known_non_canonical(&x, &parsed) {
                prop_assert_eq!(reparsed, parsed);
            }
        }
    }
}

#[test]
fn each_non_canonical_form_is_accepted_and_normalised() {
    let th = ParseMode::strict(ThinkingMode::Thinking);
    let cases = [
        // (accepted text, what the renderer writes for it)
        (
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
        ),
        (
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n<｜DSML｜ parameter name=\"a\" string=\"true\">v<\n/｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">v</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
        ),
        (
            // Runs out of text after a parameter: accepted as a complete call.
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">v</｜DSML｜ parameter>\n",
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">v</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
        ),
        (
            // Runs out right after the block opening: no calls, and not an error.
            "r</think>x\n\n<｜DSML｜ calls",
            "r</think>x<｜end▁of▁sentence｜>",
        ),
    ];
    for (accepted, normal) in cases {
        let parsed = dsml::parse(accepted, th).unwrap_or_else(|e| panic!("{accepted:?}: {e}"));
        let rendered = render_completion(&parsed.to_message(), ThinkingMode::Thinking)
            .unwrap()
            .to_string();
        assert_eq!(rendered, normal);
        assert_eq!(dsml::parse(&rendered, th).unwrap(), parsed);
    }
}

/// The shape fuzz above is not vacuous: a fixed-seed sample holds many accepted completions,
/// canonical ones with tool calls among them, in both modes.
#[test]
fn shape_fuzz_reaches_accepted_completions() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = shaped_completion();
    let (mut accepted, mut canonical_with_calls) = (0, 0);
    for _ in 0..3000 {
        let (mode, x) = strategy.new_tree(&mut runner).unwrap().current();
        if let Ok(p) = dsml::parse(&x, ParseMode::strict(mode)) {
            accepted += 1;
            if !p.tool_calls.is_empty() && !known_non_canonical(&x, &p) {
                canonical_with_calls += 1;
            }
        }
    }
    eprintln!(
        "shape fuzz: {accepted}/3000 accepted, {canonical_with_calls} canonical with tool calls"
    );
    assert!(
        accepted >= 100 && canonical_with_calls >= 5,
        "{accepted} accepted, {canonical_with_calls} with calls"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, rng_seed: proptest::test_runner::RngSeed::Fixed(41), ..ProptestConfig::default() })]

    /// The tolerant grammar is total: any text, including cut-off and mangled DSML, gives a
    /// message (never a panic), and a strict-accepted canonical completion parses the same.
    #[test]
    fn tolerant_grammar_is_total((mode, x) in shaped_completion(), cut in any::<prop::sample::Index>()) {
        let bounds: Vec<usize> = x.char_indices().map(|(i, _)| i).chain([x.len()]).collect();
        let prefix = &x[..bounds[cut.index(bounds.len())]];
        for text in [x.as_str(), prefix] {
            let loose = dsml::parse(text, ParseMode::tolerant(mode)).unwrap();
            if let Ok(strict) = dsml::parse(text, ParseMode::strict(mode)) {
                // Where strict reads a name or value that swallows markup (it reads field by
                // field), tolerant lets the marker end the field (it looks for markers first).
                let markup_in_names = strict.tool_calls.iter().any(|c| {
                    let full = format!("{}::{}", c.namespace.as_deref().unwrap_or(""), c.name);
                    full.contains("\">") || CONTROLS.iter().any(|t| full.contains(t) || c.arguments.contains(t))
                });
                if !known_non_canonical(text, &strict) && !markup_in_names {
                    prop_assert_eq!(&loose, &strict, "{:?}", text);
                }
            }
        }
    }
}
