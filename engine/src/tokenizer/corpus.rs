//! The wide tokenizer corpus (TOKENIZER.md §9, WASTE `tokdiff --wide N`), generated in Rust.
//!
//! In order: 21 curated strings; N random strings of 1–24 characters drawn from every 7th
//! code point of U+0020..U+2FFFF without surrogates (27,790 code points); max(200, N/5)
//! whitespace-run strings; strings containing NUL are dropped. The random draws use CPython's
//! MT19937 stream ([`PythonRandom`]), so `wide(20000, 11)` reproduces the 24,021 texts of the
//! release golden `wide_corpus_seed11_n20000.jsonl` exactly.
//!
//! [`extra`] adds curated strings the recipe lacks (combining marks, digits of other
//! scripts, emoji sequences, CR/LF, the DSML markers and control-token spellings, …).

use super::python_random::PythonRandom;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusString {
    /// `curated`, `random`, `whitespace` (the recipe) or `extra`.
    pub kind: &'static str,
    pub text: String,
}

/// The recipe's 21 curated strings (records 0–20 of the release golden).
pub fn curated() -> Vec<String> {
    let short = [
        "The capital of France is",
        "Hello, world!",
        "Write a C function that parses a JSON array of integers.",
        "int main(void) { return 0; }",
        "La capitale d'Italia e' Roma, e la popolazione e' 60.000.000.",
        "  indented\n\ttabbed\n\nblank line",
        "numbers 1234567 and 42 and 007",
        "snake_case CamelCase SCREAMING_CASE kebab-case",
        "don't can't we've I'll you're it's",
        "emoji: cafe naive Zurich",
        "x=1;y=2;/*comment*/ printf(\"%d\\n\", x+y);",
        "Perche' non funziona? Perche' si'.",
    ];
    let mut out: Vec<String> = short.iter().map(|s| s.to_string()).collect();
    out.push("好".repeat(86));
    out.push("好".repeat(200));
    out.push("=".repeat(400));
    out.push(format!("{}\n{}", "-".repeat(300), "=".repeat(300)));
    out.push("\n".repeat(300));
    out.push("a".repeat(400));
    out.push(format!("{}! {} fine", "好".repeat(90), "=".repeat(300)));
    out.push("A股 维生素C 和C罗聊QQ音乐".to_string());
    out.push("中文abc mixed 汉字test".to_string());
    out
}

/// The random-string pool: `range(0x20, 0x2FFFF, 7)` without surrogates.
pub fn random_pool() -> Vec<char> {
    (0x20u32..0x2FFFF)
        .step_by(7)
        .filter_map(char::from_u32)
        .collect()
}

const WHITESPACE: [char; 6] = [' ', '\t', '\u{A0}', '\u{3000}', '\u{2009}', '\u{2002}'];
const WS_PREFIXES: [&str; 4] = ["", "a", "1", "中"];
const WS_SUFFIXES: [&str; 5] = ["", "b", "2", "。", "\n"];

/// The recipe corpus for `n` random strings and RNG seed `seed`.
pub fn wide(n: usize, seed: u64) -> Vec<CorpusString> {
    let mut rng = PythonRandom::new(seed);
    let pool = random_pool();
    let mut out: Vec<CorpusString> = curated()
        .into_iter()
        .map(|text| CorpusString {
            kind: "curated",
            text,
        })
        .collect();
    for _ in 0..n {
        let len = rng.randint(1, 24);
        let text = (0..len).map(|_| *rng.choice(&pool)).collect();
        out.push(CorpusString {
            kind: "random",
            text,
        });
    }
    for _ in 0..(n / 5).max(200) {
        let mut text = rng.choice(&WS_PREFIXES).to_string();
        let k = rng.randint(1, 4);
        for _ in 0..k {
            text.push(*rng.choice(&WHITESPACE));
        }
        let suffix = *rng.choice(&WS_SUFFIXES);
        text.push_str(suffix);
        out.push(CorpusString {
            kind: "whitespace",
            text,
        });
    }
    out.retain(|s| !s.text.contains('\0'));
    out
}

/// Curated strings beyond the recipe, covering TOKENIZER.md §5.2's list and §10's pitfalls.
pub fn extra() -> Vec<CorpusString> {
    let texts = [
        // Digits of other scripts, fractions, circled and fullwidth digits.
        "１２３４５ ①②③④ ½¾ ٣٤٥٦ ०१२३४ ߀߁߂ 𝟘𝟙𝟚𝟛 12345678",
        "x²³ ⅧⅨ 〇一二三 ¹²³⁴",
        // Combining marks: precomposed vs decomposed, stacks, marks after digits/spaces.
        "Cafe\u{301} naïve e\u{301}\u{302}\u{303} 1\u{301} \u{301}x \u{20DD}",
        "ค่ำคืน हिन्दी தமிழ் ກ່າວ",
        // Hangul syllables and jamo, Hiragana/Katakana with the prolonged mark and halfwidth.
        "한국어 텍스트 각 カタカナー ひらがな ｶﾀｶﾅ ㈱",
        // Emoji: ZWJ family, flags, skin tones, keycaps, variation selectors.
        "👨\u{200D}👩\u{200D}👧 🇮🇹🇯🇵 👍🏽 1\u{FE0F}\u{20E3} ❤\u{FE0F} 🫠",
        // CR/LF combinations with punctuation and spaces.
        "a\r\nb\r\n\r\nc.\r\n d\n\r e;\n\n\n  f",
        "end.\n\n<｜DSML｜ calls>\n",
        // Whitespace variety, incl. multi-byte spaces before letters/digits/CJK and at the end.
        "a\u{A0}\u{A0}b \u{3000}中 \u{2009}1\u{2002}\u{2002}x \u{205F}\u{1680}y\u{85}z  \t",
        "\u{200B}zero\u{200D}width\u{FEFF}bom",
        // Control-token spellings as data, and near misses.
        "<｜User｜>hi<｜Assistant｜><think>x</think>｜DSML｜<｜end▁of▁sentence｜>",
        "<｜System｜>sys<｜begin▁of▁sentence｜><｜▁pad▁｜><|place_holder_mm_span_0442|>",
        "<｜DSML｜tool_calls> <｜User| <|User｜> ｜DSML <think></think",
        "<｜deepseek_image｜><｜latest_reminder｜><｜action｜><dsml:</dsml:",
        // Punctuation + ASCII letter gluing and mixed scripts.
        "y.foo;(x)= _result .NET (x) \"quoted\" 'single' --flag=value",
        "Ελληνικά русский עִבְרִית العربية ქართული Ꭰ",
        "A股 维生素C 和C罗聊QQ音乐 中文abc mixed 汉字test 日本語のテキスト",
        // Private use, unassigned and noncharacters, C1 controls, replacement char.
        "\u{E000}\u{F8FF}\u{378}\u{FFFE}\u{10FFFF}\u{80}\u{9F}\u{FFFD}",
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    ];
    texts
        .iter()
        .map(|t| CorpusString {
            kind: "extra",
            text: t.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_sizes() {
        assert_eq!(random_pool().len(), 27_790);
        assert_eq!(curated().len(), 21);
        let c = wide(100, 11);
        assert_eq!(c.len(), 21 + 100 + 200);
        assert_eq!(c, wide(100, 11), "deterministic");
        assert_ne!(c, wide(100, 12));
    }
}
