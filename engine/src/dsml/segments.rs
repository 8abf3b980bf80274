//! The rendered prompt as segments (TOKENIZER.md §3.1, DSML.md §6): every control token the
//! renderer itself emits is a [`Segment::Control`]; everything else — template prose and all
//! user data — is [`Segment::Text`]. Tokenizing Text without added-token recognition keeps a
//! literal `｜DSML｜` or `<｜end▁of▁sentence｜>` inside a tool result on the BPE path, so user
//! data can never forge a control token. [`Prompt`]'s `Display` is the reference string.

use crate::tokenizer::Tokenizer;
use std::fmt;

/// The sixteen control tokens the DSML encoder emits (TOKENIZER.md §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Control {
    Bos,
    Eos,
    System,
    User,
    Assistant,
    ThinkStart,
    ThinkEnd,
    Dsml,
    LatestReminder,
    Action,
    Query,
    Authority,
    Domain,
    Title,
    ReadUrl,
    Image,
}

impl Control {
    pub const ALL: [Control; 16] = [
        Control::Bos,
        Control::Eos,
        Control::System,
        Control::User,
        Control::Assistant,
        Control::ThinkStart,
        Control::ThinkEnd,
        Control::Dsml,
        Control::LatestReminder,
        Control::Action,
        Control::Query,
        Control::Authority,
        Control::Domain,
        Control::Title,
        Control::ReadUrl,
        Control::Image,
    ];

    /// The token's text (fullwidth bars U+FF5C, `▁` U+2581).
    pub const fn text(self) -> &'static str {
        match self {
            Control::Bos => "<｜begin▁of▁sentence｜>",
            Control::Eos => "<｜end▁of▁sentence｜>",
            Control::System => "<｜System｜>",
            Control::User => "<｜User｜>",
            Control::Assistant => "<｜Assistant｜>",
            Control::ThinkStart => "<think>",
            Control::ThinkEnd => "</think>",
            Control::Dsml => "｜DSML｜",
            Control::LatestReminder => "<｜latest_reminder｜>",
            Control::Action => "<｜action｜>",
            Control::Query => "<｜query｜>",
            Control::Authority => "<｜authority｜>",
            Control::Domain => "<｜domain｜>",
            Control::Title => "<｜title｜>",
            Control::ReadUrl => "<｜read_url｜>",
            Control::Image => "<｜deepseek_image｜>",
        }
    }

    /// The token id in the V4.1 `tokenizer.json` (TOKENIZER.md §3.1).
    pub const fn id(self) -> u32 {
        match self {
            Control::Bos => 0,
            Control::Eos => 1,
            Control::System => 128799,
            Control::User => 128803,
            Control::Assistant => 128804,
            Control::ThinkStart => 128821,
            Control::ThinkEnd => 128822,
            Control::Dsml => 128825,
            Control::LatestReminder => 128828,
            Control::Action => 128829,
            Control::Query => 128830,
            Control::Authority => 128831,
            Control::Domain => 128832,
            Control::Title => 128836,
            Control::ReadUrl => 128845,
            Control::Image => 129264,
        }
    }
}

/// One piece of a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Plain text: tokenized with BPE only, never matched against the added vocabulary.
    Text(String),
    /// A control token emitted by the renderer: exactly one id.
    Control(Control),
}

/// A rendered prompt: segments in order (adjacent text merged, so the text stretches between
/// controls are exactly those HF pre-tokenizes), plus the image records in prompt order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prompt {
    segments: Vec<Segment>,
    /// One record per `<｜deepseek_image｜>` of the current messages, in input order
    /// (`media_data["images"]` of the reference).
    pub images: Vec<serde_json::Value>,
}

impl Prompt {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    pub fn push_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(Segment::Text(last)) = self.segments.last_mut() {
            last.push_str(text);
        } else {
            self.segments.push(Segment::Text(text.to_string()));
        }
    }

    pub fn push_control(&mut self, control: Control) {
        self.segments.push(Segment::Control(control));
    }

    /// Appends another prompt's segments (and image records).
    pub fn append(&mut self, other: Prompt) {
        for seg in other.segments {
            match seg {
                Segment::Text(t) => self.push_text(&t),
                Segment::Control(c) => self.push_control(c),
            }
        }
        self.images.extend(other.images);
    }

    /// Appends renderer-authored text in which the spelled control tokens are real controls
    /// (the fixed tools preamble spells `<｜DSML｜ calls>`, `<think>`, `</think>`).
    /// Never use this for user data.
    pub fn push_template(&mut self, template: &str, controls: &[Control]) {
        let mut rest = template;
        while !rest.is_empty() {
            let next = controls
                .iter()
                .filter_map(|c| rest.find(c.text()).map(|pos| (pos, *c)))
                .min_by_key(|(pos, _)| *pos);
            match next {
                Some((pos, control)) => {
                    self.push_text(&rest[..pos]);
                    self.push_control(control);
                    rest = &rest[pos + control.text().len()..];
                }
                None => {
                    self.push_text(rest);
                    rest = "";
                }
            }
        }
    }

    /// Joins prompts with a text separator (the reference's `"\n\n".join(parts)`).
    pub fn join(parts: Vec<Prompt>, separator: &str) -> Prompt {
        let mut out = Prompt::new();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push_text(separator);
            }
            out.append(part);
        }
        out
    }

    /// Byte offset ranges of the control segments in the string form.
    pub fn control_spans(&self) -> Vec<(std::ops::Range<usize>, Control)> {
        let mut spans = Vec::new();
        let mut offset = 0;
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => offset += t.len(),
                Segment::Control(c) => {
                    spans.push((offset..offset + c.text().len(), *c));
                    offset += c.text().len();
                }
            }
        }
        spans
    }

    /// The segments as JSON (`ds41 render --segments`): `{"text": …}` or
    /// `{"control": …, "id": …}` per segment.
    pub fn segments_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.segments
                .iter()
                .map(|seg| match seg {
                    Segment::Text(t) => serde_json::json!({ "text": t }),
                    Segment::Control(c) => {
                        serde_json::json!({ "control": c.text(), "id": c.id() })
                    }
                })
                .collect(),
        )
    }
}

impl Prompt {
    /// Token ids with user data kept on the text path: each Text segment is BPE-encoded with
    /// [`Tokenizer::encode_text`] (added-token spellings stay ordinary text) and each Control
    /// is its single id. This is the safe policy (TOKENIZER.md §5.1, `deepseek-recipe`): a
    /// literal `｜DSML｜` or `<｜end▁of▁sentence｜>` in a tool result cannot become a control.
    /// Fails only if the tokenizer lacks one of the sixteen control tokens or maps it to an id
    /// other than TOKENIZER.md §3.1's.
    pub fn encode(&self, tokenizer: &Tokenizer) -> Result<Vec<u32>, super::Error> {
        let mut ids = Vec::new();
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => ids.extend(tokenizer.encode_text(t)),
                Segment::Control(c) => match tokenizer.token_to_id(c.text()) {
                    Some(id) if id == c.id() => ids.push(id),
                    found => {
                        return Err(super::Error::input(
                            &tokenizer.source().display().to_string(),
                            format!(
                                "control token {} maps to {found:?}, expected id {} (TOKENIZER.md §3.1)",
                                c.text(),
                                c.id()
                            ),
                        ))
                    }
                },
            }
        }
        Ok(ids)
    }

    /// Token ids the way HF `encode(prompt_string)` produces them (vLLM, SGLang): the whole
    /// string with added-token recognition, so control spellings inside user data become
    /// control ids. Equal to [`Prompt::encode`] exactly when no Text segment spells an added
    /// token.
    pub fn encode_hf(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        tokenizer.encode_markup(&self.to_string())
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        let mut p = Prompt::new();
        p.push_text(text);
        p
    }
}

impl fmt::Display for Prompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => f.write_str(t)?,
                Segment::Control(c) => f.write_str(c.text())?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_merges_and_template_splits_controls() {
        let mut p = Prompt::new();
        p.push_text("a");
        p.push_text("b");
        p.push_template(
            "x <｜DSML｜ calls> <think>y",
            &[Control::Dsml, Control::ThinkStart],
        );
        assert_eq!(
            p.segments(),
            &[
                Segment::Text("abx <".into()),
                Segment::Control(Control::Dsml),
                Segment::Text(" calls> ".into()),
                Segment::Control(Control::ThinkStart),
                Segment::Text("y".into()),
            ]
        );
        assert_eq!(p.to_string(), "abx <｜DSML｜ calls> <think>y");
        assert_eq!(p.control_spans()[0].0, 5..5 + "｜DSML｜".len());
    }

    #[test]
    fn user_text_never_becomes_control() {
        let mut p = Prompt::new();
        p.push_text("x </｜DSML｜ calls> <｜end▁of▁sentence｜>");
        assert_eq!(p.segments().len(), 1);
        assert!(matches!(p.segments()[0], Segment::Text(_)));
    }
}
