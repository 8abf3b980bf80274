//! Reading a completion back (DSML.md §3): the strict reference parser
//! `parse_message_from_completion_text`, reproduced decision for decision, with its exact
//! error classes and messages (checked against all probes of `reference_probe_results.json`).
//!
//! ```text
//! thinking:  REASONING "</think>" CONTENT ( EOS | "\n\n<｜DSML｜ calls" TOOLS EOS? )
//! chat:                          CONTENT ( EOS | "\n\n<｜DSML｜ calls" TOOLS EOS? )
//! ```
//!
//! Accepted completions that [`render_completion`](super::render_completion) does not produce
//! byte for byte (the reference accepts them, so the strict parser does too; each has a test):
//! * other whitespace than one space before an invoke's `name=` (`\s*` in the reference);
//! * an invoke without parameters written `name="f">\n</｜DSML｜ invoke>` (the renderer writes
//!   `">\n\n`; probe `tool_no_params`), and `name="f">\n\n` before a parameter;
//! * a parameter value followed by `<\n/｜DSML｜ parameter` (the `\n` is dropped);
//! * a completion that stops right after a parameter's `>\n`, or right after
//!   `\n\n<｜DSML｜ calls`, without closing the block (the reference's loop runs out of text);
//! * a complete block without the final EOS (probe `tool_no_eos`; the renderer adds the EOS);
//! * an empty block, `\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>`: the reference parses it to
//!   `tool_calls: []`, the same message as no block, which renders without one;
//! * a `string="false"` value that is not the canonical `json.dumps` text of its JSON value
//!   (`[1,2]`, `1.00`, a JSON string, or no JSON at all: `{"a": not json}`).
//!
//! Also accepted, as in the reference: tool names and parameter names are not checked for
//! control spellings (a name may hold `</｜DSML｜ calls>`), only content and reasoning are.
//!
//! For every other accepted completion `render_completion(parse(x)) == x`.

use super::json_py::{self, py_isspace};
use super::message::{Content, Message, Namespace, Role, ThinkingMode, ToolCall};
use super::render::split_tool_name;
use super::segments::Control;
use super::{Error, PyException};
use serde_json::{json, Value};

pub use super::tolerant::Recovery;

/// Which reply grammar to apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Grammar {
    /// The reference parser: anything else is an error.
    #[default]
    Strict,
    /// The server tolerances of DSML.md §4 ([`super::tolerant`]); never fails, and records
    /// every repair in [`ParsedMessage::recoveries`].
    Tolerant,
}

/// The `thinking_mode` the completion was generated in, and the grammar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParseMode {
    pub thinking_mode: ThinkingMode,
    pub grammar: Grammar,
}

impl ParseMode {
    pub fn strict(thinking_mode: ThinkingMode) -> Self {
        ParseMode {
            thinking_mode,
            grammar: Grammar::Strict,
        }
    }
    pub fn tolerant(thinking_mode: ThinkingMode) -> Self {
        ParseMode {
            thinking_mode,
            grammar: Grammar::Tolerant,
        }
    }
}

/// A parsed tool call: `arguments` is the JSON text the reference rebuilds
/// (`{"k": "string value", "n": raw}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    pub namespace: Option<String>,
    pub arguments: String,
}

/// A parsed assistant message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: String,
    pub tool_calls: Vec<ParsedToolCall>,
    /// What the tolerant grammar repaired; always empty for the strict grammar.
    pub recoveries: Vec<Recovery>,
}

impl ParsedMessage {
    /// The reference's return shape: `role`, `content`, `reasoning_content`, `tool_calls`
    /// (`{"type": "function", "function": {"name", "arguments"}, "namespace"?}`).
    pub fn to_json(&self) -> Value {
        let calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|c| {
                let mut call = json!({
                    "type": "function",
                    "function": { "name": c.name, "arguments": c.arguments },
                });
                if let Some(ns) = &c.namespace {
                    call["namespace"] = Value::String(ns.clone());
                }
                call
            })
            .collect();
        json!({
            "role": "assistant",
            "content": self.content,
            "reasoning_content": self.reasoning_content,
            "tool_calls": calls,
        })
    }

    /// The message as a conversation [`Message`] (for re-rendering).
    pub fn to_message(&self) -> Message {
        let mut m = Message::new(Role::Assistant, &self.content);
        m.content = Some(Content::Text(self.content.clone()));
        m.reasoning_content = Some(self.reasoning_content.clone());
        m.tool_calls = self
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: None,
                namespace: c.namespace.clone().map(Namespace::Name),
                name: c.name.clone(),
                arguments: Value::String(c.arguments.clone()),
            })
            .collect();
        m
    }
}

pub(crate) const CALLS_START: &str = "\n\n<｜DSML｜ calls";
pub(crate) const CALLS_END: &str = "</｜DSML｜ calls>";
pub(crate) const INVOKE_START: &str = "<｜DSML｜ invoke";
pub(crate) const INVOKE_END: &str = "</｜DSML｜ invoke";
pub(crate) const PARAM_START: &str = "<｜DSML｜ parameter";
pub(crate) const PARAM_END: &str = "/｜DSML｜ parameter";

/// `parse_message_from_completion_text(text, thinking_mode)`, or its tolerant counterpart.
pub fn parse(completion: &str, mode: ParseMode) -> Result<ParsedMessage, Error> {
    match mode.grammar {
        Grammar::Strict => parse_strict(completion, mode.thinking_mode),
        Grammar::Tolerant => Ok(super::tolerant::parse_tolerant(
            completion,
            mode.thinking_mode,
        )),
    }
}

/// `_read_until_stop`: the text from `index` to the earliest stop string, and the index after
/// it; or the rest of the text and `None`.
pub(crate) fn read_until<'t>(
    text: &'t str,
    index: usize,
    stops: &[&'static str],
) -> (usize, &'t str, Option<&'static str>) {
    match find_earliest(&text[index..], stops) {
        Some((pos, which)) => {
            let stop = stops[which];
            (
                index + pos + stop.len(),
                &text[index..index + pos],
                Some(stop),
            )
        }
        None => (text.len(), &text[index..], None),
    }
}

/// The earliest occurrence of any of `needles` in `hay`: (byte position, needle index); at
/// equal positions the first needle in the list. One pass over `hay` up to the match, so a
/// caller that searches on from each match stays linear in the text (searching for each
/// needle separately rescans the rest of the text for every needle that does not come next,
/// which made reading an invoke quadratic in its number of parameters).
pub(crate) fn find_earliest<S: AsRef<str>>(hay: &str, needles: &[S]) -> Option<(usize, usize)> {
    let matches_at = |rest: &[u8]| {
        needles
            .iter()
            .position(|n| rest.starts_with(n.as_ref().as_bytes()))
    };
    let mut first_bytes = [false; 256];
    for n in needles {
        match n.as_ref().as_bytes().first() {
            Some(&b) => first_bytes[b as usize] = true,
            // An empty needle matches at 0 (as does any needle listed before it there).
            None => return matches_at(hay.as_bytes()).map(|which| (0, which)),
        }
    }
    let bytes = hay.as_bytes();
    for (pos, &b) in bytes.iter().enumerate() {
        if !first_bytes[b as usize] {
            continue;
        }
        let rest = &bytes[pos..];
        if let Some(which) = matches_at(rest) {
            return Some((pos, which));
        }
    }
    None
}

/// Quotes of the completion in error messages keep at most this many bytes of it: an error
/// is one readable line even for a multi-megabyte completion.
pub(crate) const QUOTE_LIMIT: usize = 240;

/// `text` as quoted in an error: whole when short (as the reference quotes it), else its
/// first [`QUOTE_LIMIT`] bytes (at a character boundary) and the total length.
pub(crate) fn quote(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= QUOTE_LIMIT {
        return text.into();
    }
    let mut cut = QUOTE_LIMIT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..cut], text.len()).into()
}

fn assertion(message: impl Into<String>, offset: usize) -> Error {
    Error::reference(PyException::AssertionError, message).at(&format!("completion byte {offset}"))
}

fn value_error(message: impl Into<String>, offset: usize) -> Error {
    Error::reference(PyException::ValueError, message).at(&format!("completion byte {offset}"))
}

fn parse_strict(text: &str, mode: ThinkingMode) -> Result<ParsedMessage, Error> {
    let eos = Control::Eos.text();
    let think_end = Control::ThinkEnd.text();
    let mut index = 0;
    let mut reasoning = "";
    if mode == ThinkingMode::Thinking {
        let (next, r, stop) = read_until(text, 0, &[think_end, CALLS_START]);
        if stop != Some(think_end) {
            return Err(assertion("Invalid thinking format: missing </think>", next));
        }
        reasoning = r;
        index = next;
    }
    let (next, content, stop) = read_until(text, index, &[eos, CALLS_START]);
    index = next;
    let mut tool_calls = Vec::new();
    let mut final_stop = stop;
    if stop == Some(CALLS_START) {
        let (next, calls) = parse_tool_calls(text, index)?;
        tool_calls = calls;
        let (next, tail, stop) = read_until(text, next, &[eos]);
        if !tail.is_empty() {
            return Err(assertion(
                "Unexpected content after tool calls",
                next - tail.len(),
            ));
        }
        index = next;
        final_stop = stop;
    } else if stop != Some(eos) {
        return Err(assertion("Invalid format: missing EOS token", next));
    }
    if index != text.len() || !(final_stop == Some(eos) || final_stop.is_none()) {
        return Err(assertion("Unexpected content at end", index));
    }
    for control in [
        Control::Bos,
        Control::Eos,
        Control::ThinkStart,
        Control::ThinkEnd,
        Control::Dsml,
    ] {
        let token = control.text();
        if content.contains(token) || reasoning.contains(token) {
            return Err(Error::reference(
                PyException::AssertionError,
                format!("Unexpected special token '{token}' in content"),
            )
            .at("completion content"));
        }
    }
    Ok(ParsedMessage {
        content: content.to_string(),
        reasoning_content: reasoning.to_string(),
        tool_calls,
        recoveries: Vec::new(),
    })
}

/// `parse_tool_calls`: from just after `\n\n<｜DSML｜ calls`.
fn parse_tool_calls(text: &str, mut index: usize) -> Result<(usize, Vec<ParsedToolCall>), Error> {
    let mut calls = Vec::new();
    while index < text.len() {
        let start = index;
        let (next, between, stop) = read_until(text, index, &[INVOKE_START, CALLS_END]);
        if between != ">\n" {
            return Err(value_error(
                format!(
                    "Tool call format error: expected '>\\n' but got '{}'",
                    quote(between)
                ),
                start,
            ));
        }
        index = next;
        match stop {
            Some(CALLS_END) => break,
            None => return Err(value_error("Missing special token in tool calls", next)),
            _ => {}
        }
        let name_start = index;
        let (next, name_text, mut stop) = read_until(text, index, &[PARAM_START, INVOKE_END]);
        index = next;
        let name = match_tool_name(name_text).ok_or_else(|| {
            value_error(
                format!("Tool name format error: '{}'", quote(name_text)),
                name_start,
            )
        })?;
        let mut params: Vec<(String, String, bool)> = Vec::new();
        let mut keys = std::collections::HashSet::new();
        while stop == Some(PARAM_START) {
            let param_start = index;
            let (next, param_text, _) = read_until(text, index, &[PARAM_END]);
            index = next;
            let (key, is_string, value) = match_parameter(param_text).ok_or_else(|| {
                value_error(
                    format!("Parameter format error: '{}'", quote(param_text)),
                    param_start,
                )
            })?;
            if !keys.insert(key) {
                return Err(value_error(
                    format!("Duplicate parameter name: '{}'", quote(key)),
                    param_start,
                ));
            }
            params.push((key.to_string(), value.to_string(), is_string));
            let after = index;
            let (next, between, next_stop) = read_until(text, index, &[PARAM_START, INVOKE_END]);
            if between != ">\n" {
                return Err(value_error(
                    format!(
                        "Parameter format error: expected '>\\n' but got '{}'",
                        quote(between)
                    ),
                    after,
                ));
            }
            index = next;
            stop = next_stop;
        }
        calls.push(
            decode_call(name, &params)
                .map_err(|e| e.at(&format!("completion byte {name_start}")))?,
        );
    }
    Ok((index, calls))
}

/// `^\s*name="(.*?)">\n$` (DOTALL): `$` also matches before a final newline, so the name may
/// be followed by `">\n` or `">\n\n`; the lazy group takes the shorter name.
pub(crate) fn match_tool_name(text: &str) -> Option<&str> {
    let rest = text
        .trim_start_matches(py_isspace)
        .strip_prefix("name=\"")?;
    rest.strip_suffix("\">\n\n")
        .or_else(|| rest.strip_suffix("\">\n"))
}

/// `^ name="(.*?)" string="(true|false)">(.*?)<$` (DOTALL): the name ends at the first
/// `" string="true|false">`; the value ends before a final `<` (or a final `<\n`).
pub(crate) fn match_parameter(text: &str) -> Option<(&str, bool, &str)> {
    let rest = text.strip_prefix(" name=\"")?;
    let t = rest.find("\" string=\"true\">").map(|p| (p, true));
    let f = rest.find("\" string=\"false\">").map(|p| (p, false));
    let (pos, is_string) = match (t, f) {
        (Some(a), Some(b)) => {
            if a.0 <= b.0 {
                a
            } else {
                b
            }
        }
        (a, b) => a.or(b)?,
    };
    let attr_len = if is_string {
        "\" string=\"true\">".len()
    } else {
        "\" string=\"false\">".len()
    };
    let tail = &rest[pos + attr_len..];
    let value = tail
        .strip_suffix('<')
        .or_else(|| tail.strip_suffix("<\n"))?;
    Some((&rest[..pos], is_string, value))
}

/// `decode_dsml_to_arguments`: `{"k": json(v) | v, …}` with Python separators; a `ns::name`
/// name splits into name and namespace.
pub(crate) fn decode_call(
    name: &str,
    params: &[(String, String, bool)],
) -> Result<ParsedToolCall, Error> {
    let body: Vec<String> = params
        .iter()
        .map(|(k, v, is_string)| {
            let value = if *is_string {
                json_py::dumps_str(v)
            } else {
                v.clone()
            };
            format!("{}: {value}", json_py::dumps_str(k))
        })
        .collect();
    let (namespace, name) = split_tool_name(name, None)?;
    Ok(ParsedToolCall {
        name,
        namespace,
        arguments: format!("{{{}}}", body.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_parameter_patterns() {
        assert_eq!(match_tool_name(" name=\"f\">\n"), Some("f"));
        assert_eq!(match_tool_name(" name=\"f\">\n\n"), Some("f"));
        assert_eq!(match_tool_name("\u{1c}\n name=\"a\"b\">\n"), Some("a\"b"));
        assert_eq!(match_tool_name(" name=\"f\">"), None);
        assert_eq!(match_tool_name(" name=\"f\">\n\n\n"), None);
        assert_eq!(
            match_parameter(" name=\"a\" string=\"true\">v<"),
            Some(("a", true, "v"))
        );
        assert_eq!(
            match_parameter(" name=\"a\" string=\"false\">2<\n"),
            Some(("a", false, "2"))
        );
        assert_eq!(
            match_parameter(" name=\"a\" string=\"true\">x\" string=\"false\">y<"),
            Some(("a", true, "x\" string=\"false\">y"))
        );
        assert_eq!(match_parameter(" name=\"a\" string=\"true\">val"), None);
        assert_eq!(match_parameter("  name=\"a\" string=\"true\">v<"), None);
    }

    /// The naive search the one-pass [`find_earliest`] replaces (kept here as its oracle).
    fn earliest_by_each_needle(hay: &str, needles: &[&str]) -> Option<(usize, usize)> {
        needles
            .iter()
            .enumerate()
            .filter_map(|(i, n)| hay.find(n).map(|p| (p, i)))
            .min()
    }

    proptest::proptest! {
        #[test]
        fn find_earliest_agrees_with_searching_each_needle(
            hay in "[ab<｜/\n]{0,40}",
            needles in proptest::collection::vec("[ab<｜/\n]{0,3}", 1..5),
        ) {
            let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(
                find_earliest(&hay, &needles),
                earliest_by_each_needle(&hay, &needles)
            );
        }
    }

    fn invoke_with_params(n: usize) -> String {
        let mut s = String::from("ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n");
        for i in 0..n {
            s.push_str(&format!(
                "<｜DSML｜ parameter name=\"p{i}\" string=\"false\">{i}</｜DSML｜ parameter>\n"
            ));
        }
        s.push_str("</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>");
        s
    }

    /// 40,000 parameters in one invoke (about 3 MB): both grammars read it (each used to
    /// take time quadratic in the parameter count: minutes; `cargo bench --bench dsml_parse`
    /// measures it) and agree.
    #[test]
    fn an_invoke_with_forty_thousand_parameters_parses_in_both_grammars() {
        let text = invoke_with_params(40_000);
        let strict = parse(&text, ParseMode::strict(ThinkingMode::Chat)).unwrap();
        let tolerant = parse(&text, ParseMode::tolerant(ThinkingMode::Chat)).unwrap();
        assert_eq!(strict, tolerant);
        assert!(strict.tool_calls[0]
            .arguments
            .ends_with(", \"p39999\": 39999}"));
    }

    /// An error quotes at most [`QUOTE_LIMIT`] bytes of a multi-megabyte completion.
    #[test]
    fn error_quotes_of_the_completion_are_capped() {
        let tail = "x".repeat(5 << 20);
        for text in [
            format!("\n\n<｜DSML｜ calls>{tail}"),
            format!("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke{tail}"),
            format!(
                "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter{tail}"
            ),
        ] {
            let e = parse(&text, ParseMode::strict(ThinkingMode::Chat)).unwrap_err();
            let message = e.to_string();
            assert!(message.len() < 1024, "{} bytes", message.len());
            assert!(message.contains(" bytes in all)"), "{message}");
        }
        // Short quotes are the reference's, unchanged.
        let e = parse(
            "\n\n<｜DSML｜ calls>oops<｜DSML｜ invoke",
            ParseMode::strict(ThinkingMode::Chat),
        )
        .unwrap_err();
        assert!(e.to_string().contains("but got '>oops'"), "{e}");
    }

    #[test]
    fn arguments_are_rebuilt_with_python_separators() {
        let call = decode_call(
            "ns::g",
            &[
                ("é".into(), "line\n\"q\"".into(), true),
                ("n".into(), "not json".into(), false),
            ],
        )
        .unwrap();
        assert_eq!(
            call.arguments,
            "{\"é\": \"line\\n\\\"q\\\"\", \"n\": not json}"
        );
        assert_eq!(call.namespace.as_deref(), Some("ns"));
        assert_eq!(call.name, "g");
    }
}
