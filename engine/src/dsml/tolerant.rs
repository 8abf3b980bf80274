//! The tolerant reply grammar (DSML.md §4): what deployed servers (vLLM's `deepseek_v41`
//! parser, SGLang's detector, DeepSeek's `deepseek-recipe` output parser) accept beyond the
//! strict reference. It never fails; every repair is recorded as a [`Recovery`], so a harness
//! can tell a clean parse from a repaired one.
//!
//! Profile (each rule cites the server behaviour it models):
//! * **missing EOS** is accepted (truncated generations; recipe flushes on finish);
//!   text after an EOS is dropped and reported;
//! * **reasoning**: a duplicate leading `<think>` is absorbed (vLLM); a tool block opened
//!   inside the reasoning ends it implicitly (vLLM, recipe); no `</think>` at all means the
//!   whole text is reasoning (vLLM starts in REASONING);
//! * **content**: a stray `</think>` is removed (vLLM absorbs it, recipe skips it); leading
//!   newlines are kept (unlike recipe) so clean completions parse as in strict mode;
//! * **block opening**: any number of newlines before `<｜DSML｜ calls>` (vLLM does not require
//!   the `\n\n`; recipe accepts any newlines), and the V4 spellings `tool_calls` / `invoke` /
//!   `parameter` without the leading space (recipe closes on both);
//! * **marker variants** seen from hosted APIs (DSML.md §5: `lsdefine/GenericAgent` #804,
//!   `local-inference-lab/vllm` PR #417): `<｜｜DSML｜｜…>`, `‖DSML‖`, ASCII `|DSML|`. The strict
//!   grammar, like the reference, treats these as plain content;
//! * **truncated markup**: a half-written marker at the very end is dropped; an unterminated
//!   parameter, invoke or block keeps what was written (recipe's flush);
//! * **values**: `string="false"` text that is not JSON falls back to a JSON string (vLLM);
//!   a duplicate parameter keeps the first value;
//! * **after the block**: text is dropped and reported (recipe skips it as invalid).
//!
//! Relation to the strict grammar: on every completion the strict grammar accepts and the
//! renderer writes back unchanged, the two give the same message (property
//! `tolerant_grammar_is_total` in `engine/tests/dsml_roundtrip.rs`), except when a tool name,
//! parameter name or value itself spells a marker or control token: the strict grammar reads
//! field by field and keeps such a spelling inside the field, the tolerant one looks for
//! markers first (as streaming servers do) and lets it end the field.

use super::json_py;
use super::message::ThinkingMode;
use super::parse::{decode_call, find_earliest, ParsedMessage, ParsedToolCall, CALLS_START};
use super::segments::Control;

/// One repair the tolerant grammar made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// No `<｜end▁of▁sentence｜>`.
    MissingEos,
    /// Text after the first EOS, dropped.
    TextAfterEos(String),
    /// A leading `<think>` in thinking mode (the header already opened the reasoning).
    DuplicateThinkStart,
    /// Thinking mode without `</think>`: everything became reasoning.
    MissingThinkEnd,
    /// The tool block opened inside the reasoning and ended it.
    ImplicitThinkEnd,
    /// `</think>` inside the content, removed (count).
    StrayThinkEnd(usize),
    /// The block was not preceded by exactly `"\n\n"`.
    LooseBlockPrefix,
    /// V4 tag spellings (`<｜DSML｜tool_calls>`, `invoke`, `parameter` without the space).
    V4Tags,
    /// A DSML marker spelled other than `｜DSML｜` (`｜｜DSML｜｜`, `‖DSML‖`, ASCII `|DSML|`).
    MarkerVariant(String),
    /// The text ended inside markup (a parameter, invoke or the block was not closed).
    Truncated,
    /// A partial marker at the end of the text was dropped.
    PartialMarker(String),
    /// A `string="false"` value that is not JSON was kept as a string (parameter name).
    NonJsonValue(String),
    /// A repeated parameter name; the first value was kept.
    DuplicateParameter(String),
    /// A parameter tag without a readable `name="…" string="…">` header, skipped.
    MalformedParameter(String),
    /// An invoke without a readable name, skipped.
    MalformedInvoke(String),
    /// Text after the block, dropped.
    TextAfterCalls(String),
    /// A literal `｜DSML｜` left in content or reasoning (not a well-formed block).
    LiteralDsml,
}

/// The DSML marker as the model writes it, then the variants hosted APIs and other servers
/// have been seen to produce (DSML.md §5: `<｜｜DSML｜｜…>`, `‖DSML‖`, ASCII `|DSML|`).
const DSML_VARIANTS: [&str; 4] = ["｜DSML｜", "｜｜DSML｜｜", "‖DSML‖", "|DSML|"];

/// Every accepted spelling of each marker. Index `k` is DSML variant `k / 2` with the V4.1
/// spaced tag names (`k` even) or the V4 ones (`k` odd: `tool_calls`, `invoke`, `parameter`).
struct Spellings {
    /// `invoke` then `close`: where the next invoke or the end of the block is, in one scan.
    invoke_or_close: Vec<String>,
    open: Vec<String>,
    close: Vec<String>,
    invoke: Vec<String>,
    invoke_close: Vec<String>,
    param: Vec<String>,
    param_close: Vec<String>,
}

fn spellings() -> &'static Spellings {
    static CELL: std::sync::OnceLock<Spellings> = std::sync::OnceLock::new();
    CELL.get_or_init(|| {
        let each = |f: &dyn Fn(&str, &str, &str, &str) -> String| {
            DSML_VARIANTS
                .iter()
                .flat_map(|d| {
                    [
                        f(d, " calls", " invoke", " parameter"),
                        f(d, "tool_calls", "invoke", "parameter"),
                    ]
                })
                .collect::<Vec<_>>()
        };
        let invoke = each(&|d, _, i, _| format!("<{d}{i}"));
        let close = each(&|d, c, _, _| format!("</{d}{c}>"));
        Spellings {
            invoke_or_close: invoke.iter().chain(&close).cloned().collect(),
            open: each(&|d, c, _, _| format!("<{d}{c}>")),
            close,
            invoke,
            invoke_close: each(&|d, _, i, _| format!("</{d}{i}>")),
            param: each(&|d, _, _, p| format!("<{d}{p}")),
            param_close: each(&|d, _, _, p| format!("</{d}{p}>")),
        }
    })
}

/// The repairs made so far. Kinds reported once per completion (V4 tags, each marker
/// variant, truncation) are remembered in a bit set, so noting them again costs nothing
/// however many per-parameter repairs the list already holds.
#[derive(Default)]
struct Recorder {
    list: Vec<Recovery>,
    noted: u8,
}

impl Recorder {
    fn push(&mut self, r: Recovery) {
        self.list.push(r);
    }

    /// Push `r` unless this once-per-completion kind (bit `bit`) was already pushed.
    fn push_once(&mut self, bit: u8, r: impl FnOnce() -> Recovery) {
        if self.noted & bit == 0 {
            self.noted |= bit;
            self.list.push(r());
        }
    }

    fn truncated(&mut self) {
        self.push_once(1, || Recovery::Truncated);
    }
}

/// Records a non-canonical spelling (once per kind).
fn note_spelling(rec: &mut Recorder, index: usize) {
    if index % 2 == 1 {
        rec.push_once(2, || Recovery::V4Tags);
    }
    let variant = index / 2;
    if variant > 0 {
        rec.push_once(4 << variant, || {
            Recovery::MarkerVariant(DSML_VARIANTS[variant].to_string())
        });
    }
}

/// The earliest occurrence of any of `needles` in `hay`: (position, needle index), in one
/// pass (see [`find_earliest`]).
fn find_any(hay: &str, needles: &[String]) -> Option<(usize, usize)> {
    find_earliest(hay, needles)
}

/// If `text` ends with a proper prefix (≥ 1 char) of any marker, the length of that suffix.
fn partial_marker_suffix(text: &str) -> usize {
    let sp = spellings();
    let canonical = [
        &sp.open[0],
        &sp.close[0],
        &sp.invoke[0],
        &sp.invoke_close[0],
        &sp.param[0],
        &sp.param_close[0],
    ];
    let markers = canonical.iter().map(|s| s.as_str()).chain([
        CALLS_START,
        Control::Eos.text(),
        Control::ThinkEnd.text(),
    ]);
    let mut best = 0;
    for m in markers {
        for (cut, _) in m.char_indices().skip(1) {
            let prefix = &m[..cut];
            if prefix.len() > best && text.ends_with(prefix) && prefix != "\n" {
                best = prefix.len();
            }
        }
    }
    best
}

pub(crate) fn parse_tolerant(completion: &str, mode: ThinkingMode) -> ParsedMessage {
    let mut rec = Recorder::default();
    let eos = Control::Eos.text();
    let mut text = match completion.find(eos) {
        Some(pos) => {
            let after = &completion[pos + eos.len()..];
            if !after.is_empty() {
                rec.push(Recovery::TextAfterEos(after.to_string()));
            }
            &completion[..pos]
        }
        None => {
            rec.push(Recovery::MissingEos);
            let cut = partial_marker_suffix(completion);
            if cut > 0 {
                rec.push(Recovery::PartialMarker(
                    completion[completion.len() - cut..].to_string(),
                ));
            }
            &completion[..completion.len() - cut]
        }
    };

    let mut reasoning = String::new();
    if mode == ThinkingMode::Thinking {
        if let Some(rest) = text.strip_prefix(Control::ThinkStart.text()) {
            rec.push(Recovery::DuplicateThinkStart);
            text = rest;
        }
        let think_end = text.find(Control::ThinkEnd.text());
        let open = find_any(text, &spellings().open).map(|(p, _)| p);
        match (think_end, open) {
            (Some(t), o) if o.is_none_or(|o| t < o) => {
                reasoning = text[..t].to_string();
                text = &text[t + Control::ThinkEnd.text().len()..];
            }
            (_, Some(o)) => {
                rec.push(Recovery::ImplicitThinkEnd);
                reasoning = text[..o].trim_end_matches('\n').to_string();
                text = &text[text[..o].trim_end_matches('\n').len()..];
            }
            (None, None) => {
                rec.push(Recovery::MissingThinkEnd);
                reasoning = text.to_string();
                text = "";
            }
            (Some(_), _) => unreachable!(),
        }
    }

    // Content up to the block.
    let (content_part, block) = match find_any(text, &spellings().open) {
        Some((pos, which)) => {
            let before = &text[..pos];
            let content = match before.strip_suffix("\n\n") {
                Some(c) => c,
                None => {
                    rec.push(Recovery::LooseBlockPrefix);
                    before.trim_end_matches('\n')
                }
            };
            note_spelling(&mut rec, which);
            (content, Some(&text[pos + spellings().open[which].len()..]))
        }
        None => (text, None),
    };
    let stray = content_part.matches(Control::ThinkEnd.text()).count();
    let mut content = content_part.to_string();
    if stray > 0 {
        rec.push(Recovery::StrayThinkEnd(stray));
        content = content.replace(Control::ThinkEnd.text(), "");
    }
    if content.contains(Control::Dsml.text()) || reasoning.contains(Control::Dsml.text()) {
        rec.push(Recovery::LiteralDsml);
    }

    let tool_calls = match block {
        Some(body) => parse_block(body, &mut rec),
        None => Vec::new(),
    };
    ParsedMessage {
        content,
        reasoning_content: reasoning,
        tool_calls,
        recoveries: rec.list,
    }
}

fn parse_block(mut body: &str, rec: &mut Recorder) -> Vec<ParsedToolCall> {
    let mut calls = Vec::new();
    let mut closed = false;
    loop {
        let sp = spellings();
        let n = sp.invoke.len();
        match find_any(body, &sp.invoke_or_close) {
            Some((i, wi)) if wi < n => {
                note_spelling(rec, wi);
                let (call, rest) = parse_invoke(&body[i + sp.invoke[wi].len()..], rec);
                if let Some(call) = call {
                    calls.push(call);
                }
                body = rest;
            }
            Some((c, w)) => {
                let wc = w - n;
                note_spelling(rec, wc);
                let after = &body[c + sp.close[wc].len()..];
                if !after.is_empty() {
                    rec.push(Recovery::TextAfterCalls(after.to_string()));
                }
                closed = true;
                break;
            }
            None => break,
        }
    }
    if !closed {
        rec.truncated();
    }
    calls
}

/// One invoke, from just after `<｜DSML｜ invoke`: the call (if its name is readable) and the
/// text after `</｜DSML｜ invoke>` (or the end).
fn parse_invoke<'t>(text: &'t str, rec: &mut Recorder) -> (Option<ParsedToolCall>, &'t str) {
    let sp = spellings();
    let (inner, rest, complete) = match find_any(text, &sp.invoke_close) {
        Some((p, w)) => (&text[..p], &text[p + sp.invoke_close[w].len()..], true),
        None => (text, "", false),
    };
    if !complete {
        rec.truncated();
    }
    let header_end = find_any(inner, &sp.param).map_or(inner.len(), |(p, _)| p);
    let header = &inner[..header_end];
    let name = header
        .trim_start()
        .strip_prefix("name=\"")
        .and_then(|h| h.find("\">").map(|e| &h[..e]));
    let Some(name) = name else {
        rec.push(Recovery::MalformedInvoke(header.to_string()));
        return (None, rest);
    };
    let mut params: Vec<(String, String, bool)> = Vec::new();
    let mut keys = std::collections::HashSet::new();
    let mut body = &inner[header_end..];
    while let Some((p, w)) = find_any(body, &sp.param) {
        note_spelling(rec, w);
        let after = &body[p + sp.param[w].len()..];
        let (param, next) = match find_any(after, &sp.param_close) {
            Some((e, we)) => (&after[..e], &after[e + sp.param_close[we].len()..]),
            None => {
                rec.truncated();
                (after, "")
            }
        };
        body = next;
        let parsed = param.strip_prefix(" name=\"").and_then(|r| {
            let (k, rest) = r.split_once('"')?;
            let rest = rest.trim_start().strip_prefix("string=\"")?;
            let (flag, value) = rest.split_once("\">")?;
            Some((k, flag, value))
        });
        let Some((key, flag, value)) = parsed else {
            rec.push(Recovery::MalformedParameter(param.to_string()));
            continue;
        };
        if !keys.insert(key) {
            rec.push(Recovery::DuplicateParameter(key.to_string()));
            continue;
        }
        let is_string = flag != "false";
        let value = value.to_string();
        if !is_string && json_py::loads(&value).is_err() {
            rec.push(Recovery::NonJsonValue(key.to_string()));
            params.push((key.to_string(), value, true));
        } else {
            params.push((key.to_string(), value, is_string));
        }
    }
    let call = decode_call(name, &params).unwrap_or_else(|_| {
        // An unsplittable `a::b::c` name stays whole.
        let mut c = decode_call("", &params).unwrap_or_else(|_| unreachable!());
        c.name = name.to_string();
        c
    });
    (Some(call), rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsml::{parse, ParseMode};

    fn tol(text: &str, mode: ThinkingMode) -> ParsedMessage {
        parse(text, ParseMode::tolerant(mode)).unwrap()
    }

    #[test]
    fn clean_completions_parse_as_in_strict_mode() {
        let text = "  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"lookup\">\n<｜DSML｜ parameter name=\"query\" string=\"true\">value</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";
        let strict = parse(text, ParseMode::strict(ThinkingMode::Thinking)).unwrap();
        let loose = tol(text, ThinkingMode::Thinking);
        assert_eq!(strict, loose);
        assert!(loose.recoveries.is_empty());
    }

    #[test]
    fn implicit_end_of_reasoning() {
        let m = tol(
            "reason\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
            ThinkingMode::Thinking,
        );
        assert_eq!(m.reasoning_content, "reason");
        assert_eq!(m.tool_calls.len(), 1);
        assert_eq!(m.tool_calls[0].arguments, "{}");
        assert_eq!(m.recoveries, vec![Recovery::ImplicitThinkEnd]);
    }

    #[test]
    fn truncated_parameter_keeps_what_was_written() {
        let m = tol(
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">val</｜DSML｜ para",
            ThinkingMode::Thinking,
        );
        assert_eq!(m.tool_calls[0].arguments, "{\"a\": \"val\"}");
        assert!(m.recoveries.contains(&Recovery::MissingEos));
        assert!(m.recoveries.contains(&Recovery::Truncated));
        assert!(m
            .recoveries
            .contains(&Recovery::PartialMarker("</｜DSML｜ para".into())));
    }

    #[test]
    fn stray_think_end_and_non_json_values() {
        let m = tol(
            "</think>a</think>b<｜end▁of▁sentence｜>",
            ThinkingMode::Thinking,
        );
        assert_eq!(
            (m.content.as_str(), &m.recoveries[..]),
            ("ab", &[Recovery::StrayThinkEnd(1)][..])
        );
        let m = tol(
            "</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"false\">not json</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
            ThinkingMode::Thinking,
        );
        assert_eq!(m.tool_calls[0].arguments, "{\"a\": \"not json\"}");
        assert_eq!(
            m.recoveries,
            vec![Recovery::MissingEos, Recovery::NonJsonValue("a".into())]
        );
        // Chat mode: a leading </think> (already in the header) is absorbed.
        let m = tol("</think>Hello", ThinkingMode::Chat);
        assert_eq!(m.content, "Hello");
    }

    #[test]
    fn v4_spellings_and_loose_prefix() {
        let m = tol(
            "x\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ns::g\">\n<｜DSML｜parameter name=\"y\" string=\"false\">true</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>tail<｜end▁of▁sentence｜>",
            ThinkingMode::Chat,
        );
        assert_eq!(m.content, "x");
        assert_eq!(m.tool_calls[0].namespace.as_deref(), Some("ns"));
        assert_eq!(m.tool_calls[0].arguments, "{\"y\": true}");
        assert!(m.recoveries.contains(&Recovery::V4Tags));
        assert!(m.recoveries.contains(&Recovery::LooseBlockPrefix));
        assert!(m
            .recoveries
            .contains(&Recovery::TextAfterCalls("tail".into())));
    }

    #[test]
    fn reasoning_only_truncation() {
        let m = tol("still thinking", ThinkingMode::Thinking);
        assert_eq!(m.reasoning_content, "still thinking");
        assert_eq!(m.content, "");
        assert_eq!(
            m.recoveries,
            vec![Recovery::MissingEos, Recovery::MissingThinkEnd]
        );
    }

    #[test]
    fn marker_variants_from_hosted_apis() {
        for d in ["|DSML|", "｜｜DSML｜｜", "‖DSML‖"] {
            let text = format!(
                "ok\n\n<{d} calls>\n<{d} invoke name=\"f\">\n<{d} parameter name=\"a\" string=\"false\">1</{d} parameter>\n</{d} invoke>\n</{d} calls><｜end▁of▁sentence｜>"
            );
            let m = tol(&text, ThinkingMode::Chat);
            assert_eq!(m.content, "ok", "{d}");
            assert_eq!(m.tool_calls[0].arguments, "{\"a\": 1}", "{d}");
            assert_eq!(
                m.recoveries,
                vec![Recovery::MarkerVariant(d.to_string())],
                "{d}"
            );
            // Strict, like the reference: no tool call is ever read from these. `｜｜DSML｜｜`
            // contains the DSML token, so it is an error; the others stay content.
            match parse(&text, ParseMode::strict(ThinkingMode::Chat)) {
                Ok(strict) => {
                    assert!(strict.tool_calls.is_empty() && strict.content.contains("calls>"))
                }
                Err(e) => {
                    assert!(d.contains("｜DSML｜") && e.message.contains("'｜DSML｜' in content"))
                }
            }
        }
    }
}
