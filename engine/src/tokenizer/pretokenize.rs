//! The DS41 pre-tokenizer (TOKENIZER.md §5.2), written out by hand: three isolating splits in
//! sequence, each applied to every piece the previous one produced.
//!
//! 1. `\p{N}{1,3}`
//! 2. `[一-龥぀-ゟ゠-ヿ]+`
//! 3. ``[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|``
//!    `` ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+``
//!
//! "Isolated" means each match is a piece and each stretch between matches is a piece too.
//! Matching is leftmost-first over the alternatives with greedy quantifiers; every rule below
//! says which backtracking outcome of the regex it reproduces. All positions are in
//! characters, so `\s+(?!\S)` backs off one character, never one byte. Within a piece the
//! regex sees the piece alone: its end satisfies the lookahead.

use super::unicode_class::{classes, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, WHITE_SPACE};

/// Extra flags beyond the Unicode classes.
const CJK_KANA: u16 = 1 << 8;
const ASCII_LETTER: u16 = 1 << 9;
const ASCII_PUNCT: u16 = 1 << 10;
const CR_LF: u16 = 1 << 11;
const SPACE: u16 = 1 << 12;

const L: u16 = LETTER as u16;
const M: u16 = MARK as u16;
const N: u16 = NUMBER as u16;
const P: u16 = PUNCTUATION as u16;
const S: u16 = SYMBOL as u16;
const WS: u16 = WHITE_SPACE as u16;

/// One character of the text: its byte offset and its class flags.
#[derive(Clone, Copy, Debug)]
struct Ch {
    pos: u32,
    flags: u16,
}

fn flags(c: char) -> u16 {
    let mut f = u16::from(classes(c));
    match c {
        '\u{4E00}'..='\u{9FA5}' | '\u{3040}'..='\u{309F}' | '\u{30A0}'..='\u{30FF}' => {
            f |= CJK_KANA
        }
        'A'..='Z' | 'a'..='z' => f |= ASCII_LETTER,
        '\r' | '\n' => f |= CR_LF,
        ' ' => f |= SPACE,
        c if c.is_ascii_punctuation() => f |= ASCII_PUNCT,
        _ => {}
    }
    f
}

/// Reusable buffer for [`split`].
#[derive(Default)]
pub struct Scratch {
    chars: Vec<Ch>,
}

/// Calls `emit(start, end)` with the byte range of every pre-token of `text`, in order. The
/// ranges tile `text` exactly.
pub fn split(text: &str, scratch: &mut Scratch, mut emit: impl FnMut(usize, usize)) {
    let chars = &mut scratch.chars;
    chars.clear();
    chars.extend(text.char_indices().map(|(pos, c)| Ch {
        pos: pos as u32,
        flags: flags(c),
    }));
    let n = chars.len();
    let byte_at = |i: usize| {
        if i < n {
            chars[i].pos as usize
        } else {
            text.len()
        }
    };
    let chars = &chars[..];
    split_digits(chars, 0, n, &mut |a, b| {
        split_cjk(chars, a, b, &mut |a, b| {
            split_main(chars, a, b, &mut |a, b| emit(byte_at(a), byte_at(b)))
        })
    });
}

/// Emits the matches of `find(i)` (returning the match end) and the gaps between them over
/// the character range `[a, b)`.
#[inline]
fn isolate(
    a: usize,
    b: usize,
    mut find: impl FnMut(usize) -> Option<usize>,
    emit: &mut dyn FnMut(usize, usize),
) {
    let mut gap = a;
    let mut i = a;
    while i < b {
        match find(i) {
            Some(end) => {
                if gap < i {
                    emit(gap, i);
                }
                emit(i, end);
                i = end;
                gap = end;
            }
            None => i += 1,
        }
    }
    if gap < b {
        emit(gap, b);
    }
}

/// End of the run of characters having any of `mask`, starting at `i`, bounded by `b`.
#[inline]
fn run_end(chars: &[Ch], mut i: usize, b: usize, mask: u16) -> usize {
    while i < b && chars[i].flags & mask != 0 {
        i += 1;
    }
    i
}

/// Split 1: `\p{N}{1,3}`.
fn split_digits(chars: &[Ch], a: usize, b: usize, emit: &mut dyn FnMut(usize, usize)) {
    isolate(
        a,
        b,
        |i| {
            let end = run_end(chars, i, b.min(i + 3), N);
            (end > i).then_some(end)
        },
        emit,
    );
}

/// Split 2: `[一-龥぀-ゟ゠-ヿ]+`.
fn split_cjk(chars: &[Ch], a: usize, b: usize, emit: &mut dyn FnMut(usize, usize)) {
    isolate(
        a,
        b,
        |i| {
            let end = run_end(chars, i, b, CJK_KANA);
            (end > i).then_some(end)
        },
        emit,
    );
}

/// Split 3: the main pattern.
fn split_main(chars: &[Ch], a: usize, b: usize, emit: &mut dyn FnMut(usize, usize)) {
    isolate(a, b, |i| match_main(chars, i, b), emit);
}

/// The end of the main pattern's match starting at character `i` of a piece ending at `b`.
fn match_main(chars: &[Ch], i: usize, b: usize) -> Option<usize> {
    let f = chars[i].flags;
    let next = if i + 1 < b { chars[i + 1].flags } else { 0 };

    // 1. [ASCII punctuation][A-Za-z]+
    if f & ASCII_PUNCT != 0 && next & ASCII_LETTER != 0 {
        return Some(run_end(chars, i + 1, b, ASCII_LETTER));
    }
    // 2. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : with the optional character if a letter/mark
    //    run follows it, else (backtracking) without it.
    if f & (CR_LF | L | P | S) == 0 && next & (L | M) != 0 {
        return Some(run_end(chars, i + 1, b, L | M));
    }
    if f & (L | M) != 0 {
        return Some(run_end(chars, i, b, L | M));
    }
    // 3. ` ?[\p{P}\p{S}]+[\r\n]*` (a space is neither P nor S, so it only counts as the prefix).
    let ps_start = if f & SPACE != 0 { i + 1 } else { i };
    if ps_start < b && chars[ps_start].flags & (P | S) != 0 {
        let end = run_end(chars, ps_start, b, P | S);
        return Some(run_end(chars, end, b, CR_LF));
    }
    if f & WS == 0 {
        return None;
    }
    let ws_end = run_end(chars, i, b, WS);
    // 4. `\s*[\r\n]+`: greedy `\s*` backs off to the last CR/LF of the whitespace run.
    if let Some(last_crlf) = (i..ws_end).rev().find(|&k| chars[k].flags & CR_LF != 0) {
        return Some(last_crlf + 1);
    }
    // 5. `\s+(?!\S)`: the whole run at the end of the piece, else the run minus its last
    //    character if that leaves at least one.
    if ws_end == b {
        return Some(ws_end);
    }
    if ws_end - i >= 2 {
        return Some(ws_end - 1);
    }
    // 6. `\s+`
    Some(ws_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(text, &mut Scratch::default(), |a, b| out.push(&text[a..b]));
        out
    }

    #[test]
    fn spec_examples() {
        assert_eq!(pieces("12345"), ["123", "45"]);
        assert_eq!(pieces("y.foo;(x)="), ["y", ".foo", ";(", "x", ")="]);
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(".\n\n"), [".\n\n"]);
        assert_eq!(pieces("\n\n"), ["\n\n"]);
        assert_eq!(pieces("A股 维生素C"), ["A", "股", " ", "维生素", "C"]);
        assert_eq!(pieces("\u{a0}x"), ["\u{a0}x"]);
        assert_eq!(pieces("a  \u{3000}b"), ["a", "  ", "\u{3000}b"]);
        assert_eq!(pieces("x   "), ["x", "   "]);
        assert_eq!(pieces(" \n \n  x"), [" \n \n", " ", " x"]);
        assert_eq!(pieces("١٢٣٤"), ["١٢٣", "٤"]);
        assert_eq!(pieces("e\u{301}\u{301}"), ["e\u{301}\u{301}"]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }
}
