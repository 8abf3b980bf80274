//! Splitting text on added tokens (TOKENIZER.md §5.1), as HF `tokenizers` does: first a
//! leftmost-longest scan for the tokens with `normalized: false` over the whole text, then a
//! leftmost-longest scan for the `normalized: true` tokens over the stretches left between
//! those matches. With the empty normaliser of DS41 the `normalized` flag changes nothing
//! else; the two passes only matter when tokens of the two groups overlap.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// One entry of `added_tokens` in `tokenizer.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    pub special: bool,
    pub normalized: bool,
}

/// A stretch of the input: plain text to pre-tokenize, or an added token's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    Text { start: usize, end: usize },
    Token(u32),
}

#[derive(Debug, Clone)]
struct Matcher {
    automaton: AhoCorasick,
    ids: Vec<u32>,
}

impl Matcher {
    fn new(tokens: &[&AddedToken]) -> Option<Self> {
        if tokens.is_empty() {
            return None;
        }
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|t| t.content.as_str()))
            .expect("an automaton over a few thousand short strings builds");
        Some(Matcher {
            automaton,
            ids: tokens.iter().map(|t| t.id).collect(),
        })
    }

    /// Emits the matches in `text[start..end]` and the text stretches between them.
    fn for_each(&self, text: &str, start: usize, end: usize, emit: &mut dyn FnMut(Segment)) {
        let mut at = start;
        for m in self.automaton.find_iter(&text[start..end]) {
            let (m_start, m_end) = (start + m.start(), start + m.end());
            if at < m_start {
                emit(Segment::Text {
                    start: at,
                    end: m_start,
                });
            }
            emit(Segment::Token(self.ids[m.pattern().as_usize()]));
            at = m_end;
        }
        if at < end {
            emit(Segment::Text { start: at, end });
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AddedTokenSplitter {
    raw: Option<Matcher>,
    normalized: Option<Matcher>,
}

impl AddedTokenSplitter {
    pub fn new(tokens: &[AddedToken]) -> Self {
        let (normalized, raw): (Vec<&AddedToken>, Vec<&AddedToken>) =
            tokens.iter().partition(|t| t.normalized);
        AddedTokenSplitter {
            raw: Matcher::new(&raw),
            normalized: Matcher::new(&normalized),
        }
    }

    /// Calls `emit` for every segment of `text`, in order.
    pub fn split(&self, text: &str, emit: &mut dyn FnMut(Segment)) {
        let mut second_pass = |segment: Segment| match (segment, &self.normalized) {
            (Segment::Text { start, end }, Some(m)) => m.for_each(text, start, end, &mut *emit),
            _ => emit(segment),
        };
        match &self.raw {
            Some(m) => m.for_each(text, 0, text.len(), &mut second_pass),
            None if text.is_empty() => {}
            None => second_pass(Segment::Text {
                start: 0,
                end: text.len(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u32, content: &str, normalized: bool) -> AddedToken {
        AddedToken {
            id,
            content: content.into(),
            special: false,
            normalized,
        }
    }

    fn segments(s: &AddedTokenSplitter, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        s.split(text, &mut |seg| {
            out.push(match seg {
                Segment::Text { start, end } => text[start..end].to_string(),
                Segment::Token(id) => format!("#{id}"),
            })
        });
        out
    }

    #[test]
    fn leftmost_longest_then_normalized_pass() {
        let s = AddedTokenSplitter::new(&[
            tok(1, "<a>", false),
            tok(2, "<a>b", false),
            tok(3, "b<", true),
            tok(4, "xy", true),
        ]);
        assert_eq!(segments(&s, "<a>bc"), ["#2", "c"]);
        // The raw pass claims "<a>" first although the normalized "b<" starts earlier.
        assert_eq!(segments(&s, "b<a>"), ["b", "#1"]);
        assert_eq!(segments(&s, "1xy2<a>xy"), ["1", "#4", "2", "#1", "#4"]);
        assert_eq!(segments(&s, ""), Vec::<String>::new());
    }
}
