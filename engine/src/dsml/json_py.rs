//! Python `json` compatibility (DSML.md §2.2, §2.3, §3): the reference encoder writes every JSON
//! fragment with `json.dumps(value, ensure_ascii=False)` and reads tool arguments with
//! `json.loads`. Byte-exact prompts need the same text, so this module reproduces
//!
//! * `dumps`: separators `", "` and `": "`, key order preserved (serde_json `preserve_order`),
//!   non-ASCII written raw, only `"`, `\\` and U+0000–U+001F escaped, floats in Python `repr`
//!   form (`1.0`, `1e-05`, `1e+16`); `dumps_with` adds the `ensure_ascii` and `indent` forms
//!   (ds41-synthetic writes WASTE's container JSON files with `json.dump(v, f, indent=1)`);
//! * `loads`: serde_json, plus an explicit refusal of the inputs Python reads differently
//!   (integer literals beyond 64 bits, which Python keeps exact, and the `NaN` / `Infinity`
//!   literals Python accepts). Refusing is deliberate: silently rounding would change the prompt.
//! * `truthy` and `py_str`: Python truthiness and `str()` of a JSON value, used where the
//!   reference tests `if value:` or formats a value into an error message.

use serde_json::Value;
use std::fmt::Write as _;

/// The `json.dumps` keyword arguments this project writes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpOptions {
    /// `ensure_ascii`: everything outside printable ASCII as `\uXXXX` (surrogate pairs above
    /// U+FFFF); otherwise only `"`, `\\` and the C0 controls are escaped.
    pub ensure_ascii: bool,
    /// `indent`: `None` writes one line with separators `", "` / `": "`; `Some(n)` puts every
    /// item on its own line indented by n spaces per level, with separators `","` / `": "`.
    pub indent: Option<usize>,
}

impl DumpOptions {
    /// `json.dumps(value, ensure_ascii=False)`: the DSML encoder's form.
    pub const DSML: DumpOptions = DumpOptions {
        ensure_ascii: false,
        indent: None,
    };

    /// `json.dump(value, f, indent=n)` with the default `ensure_ascii=True` (how WASTE's
    /// generator writes container JSON files, CONTAINER.md §10.2).
    pub const fn file(indent: usize) -> DumpOptions {
        DumpOptions {
            ensure_ascii: true,
            indent: Some(indent),
        }
    }
}

/// `json.dumps(value, ensure_ascii=False)`.
pub fn dumps(value: &Value) -> String {
    dumps_with(value, DumpOptions::DSML)
}

/// `json.dumps(value, ...)` with the given options.
pub fn dumps_with(value: &Value, options: DumpOptions) -> String {
    let mut out = String::new();
    write_value(&mut out, value, options, 0);
    out
}

/// `json.dumps(text, ensure_ascii=False)` for a string.
pub fn dumps_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    write_str(&mut out, text, false);
    out
}

fn write_value(out: &mut String, value: &Value, options: DumpOptions, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                out.push_str(&float_repr(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => write_str(out, s, options.ensure_ascii),
        Value::Array(items) => {
            write_container(out, ('[', ']'), items, options, level, |out, item| {
                write_value(out, item, options, level + 1)
            })
        }
        Value::Object(map) => {
            write_container(out, ('{', '}'), map, options, level, |out, (k, v)| {
                write_str(out, k, options.ensure_ascii);
                out.push_str(": ");
                write_value(out, v, options, level + 1);
            })
        }
    }
}

/// Brackets, separators and (with an indent) line breaks around the items of an array or
/// object; an empty container is `[]` / `{}` in every form.
fn write_container<I: IntoIterator>(
    out: &mut String,
    (open, close): (char, char),
    items: I,
    options: DumpOptions,
    level: usize,
    mut write_item: impl FnMut(&mut String, I::Item),
) {
    let newline = |out: &mut String, indent: usize, level: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent * level));
    };
    out.push(open);
    let mut empty = true;
    for (i, item) in items.into_iter().enumerate() {
        empty = false;
        if i > 0 {
            out.push_str(if options.indent.is_some() { "," } else { ", " });
        }
        if let Some(indent) = options.indent {
            newline(out, indent, level + 1);
        }
        write_item(out, item);
    }
    if let (Some(indent), false) = (options.indent, empty) {
        newline(out, indent, level);
    }
    out.push(close);
}

/// Python's `json` string escaping (`ESCAPE` / `ESCAPE_ASCII` in `json/encoder.py`).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c if ensure_ascii || (c as u32) < 0x20 => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `float.__repr__`: the shortest round-tripping digits, fixed notation when the decimal
/// exponent is in [-4, 16), scientific (`1e+16`, `1.5e-07`) otherwise; `.0` on integral values.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` prints the shortest round-tripping digits, as Python's repr does.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// Why `loads` did not return a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadsError {
    /// Not JSON for Python either (`json.loads` raises): callers fall back like the reference.
    NotJson(String),
    /// Valid for Python but not representable here without changing its meaning.
    Unsupported(String),
}

/// `json.loads(text)`, refusing what Python would read differently from serde_json.
pub fn loads(text: &str) -> Result<Value, LoadsError> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => match find_wide_integer(text) {
            Some(lit) => Err(LoadsError::Unsupported(format!(
                "integer literal {lit} does not fit in 64 bits (Python keeps it exact)"
            ))),
            None => Ok(v),
        },
        Err(e) => {
            if let Some(lit) = find_python_only_literal(text) {
                Err(LoadsError::Unsupported(format!(
                    "the literal {lit} is accepted by Python's json module but is not JSON"
                )))
            } else {
                Err(LoadsError::NotJson(e.to_string()))
            }
        }
    }
}

/// Visits the bare (non-string) tokens of JSON-ish text.
fn bare_tokens(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b if b.is_ascii_alphanumeric() || b == b'-' || b == b'+' || b == b'.' => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'-' | b'+' | b'.'))
                {
                    i += 1;
                }
                tokens.push(&text[start..i]);
            }
            _ => i += 1,
        }
    }
    tokens
}

fn find_wide_integer(text: &str) -> Option<String> {
    bare_tokens(text).into_iter().find_map(|tok| {
        let digits = tok.strip_prefix('-').unwrap_or(tok);
        let integral = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        let fits = tok.parse::<i64>().is_ok() || tok.parse::<u64>().is_ok();
        (integral && !fits).then(|| tok.to_string())
    })
}

fn find_python_only_literal(text: &str) -> Option<String> {
    bare_tokens(text)
        .into_iter()
        .find(|tok| {
            matches!(*tok, "NaN" | "Infinity" | "-Infinity")
                || (tok
                    .trim_start_matches('-')
                    .starts_with(|c: char| c.is_ascii_digit())
                    && tok.parse::<f64>().is_ok_and(f64::is_infinite))
        })
        .map(str::to_string)
}

/// Python truthiness of a JSON value (`if value:`).
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Python `str()` of the value json.loads would have produced; used in error messages that
/// the reference formats with an f-string.
pub fn py_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

fn py_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match n.as_f64() {
            Some(x) if !n.is_i64() && !n.is_u64() => float_repr(x)
                .replace("Infinity", "inf")
                .replace("NaN", "nan"),
            _ => n.to_string(),
        },
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("'{k}': {}", py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `str.isspace()` (what `\s` matches in a `str` regex): Rust's White_Space set plus
/// the four C0 separators U+001C–U+001F, which Python counts as whitespace.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumps_matches_python_separators_and_escapes() {
        let v = json!({"b": [1, 2.5, true, null], "a": "é\"\\\n\u{1}\u{7f}", "c": {}});
        assert_eq!(
            dumps(&v),
            "{\"b\": [1, 2.5, true, null], \"a\": \"é\\\"\\\\\\n\\u0001\u{7f}\", \"c\": {}}"
        );
    }

    #[test]
    fn indented_ascii_matches_json_dump_indent_1() {
        let v = json!({"a": [1, 2], "b": {"c": "x\u{ff5c}\u{7f}"}, "d": [], "e": 2.0});
        assert_eq!(
            dumps_with(&v, DumpOptions::file(1)),
            "{\n \"a\": [\n  1,\n  2\n ],\n \"b\": {\n  \"c\": \"x\\uff5c\\u007f\"\n },\n \"d\": [],\n \"e\": 2.0\n}"
        );
        // Astral characters become surrogate pairs.
        assert_eq!(
            dumps_with(&json!("\u{1F600}"), DumpOptions::file(2)),
            "\"\\ud83d\\ude00\""
        );
    }

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3.11 `repr(float)` outputs.
        let cases = [
            (1.0, "1.0"),
            (1.5, "1.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e20, "1.2345e+20"),
            (123456.789, "123456.789"),
            (1e100, "1e+100"),
            (f64::INFINITY, "Infinity"),
            (1e-20, "1e-20"),
            (-2.5e-7, "-2.5e-07"),
            (1234567890123456.0, "1234567890123456.0"),
            (40000.0, "40000.0"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn loads_refuses_what_python_reads_differently() {
        assert!(loads("{\"a\": 1}").is_ok());
        assert!(matches!(loads("not json"), Err(LoadsError::NotJson(_))));
        assert!(matches!(
            loads("{\"a\": NaN}"),
            Err(LoadsError::Unsupported(_))
        ));
        assert!(matches!(loads("[1e400]"), Err(LoadsError::Unsupported(_))));
        assert!(matches!(
            loads("[123456789012345678901234]"),
            Err(LoadsError::Unsupported(_))
        ));
        assert!(loads("[18446744073709551615, -9223372036854775808]").is_ok());
        // Digits inside strings are not literals.
        assert!(loads("[\"123456789012345678901234\"]").is_ok());
    }

    #[test]
    fn truthiness_and_str() {
        assert!(!truthy(&json!({})) && !truthy(&json!(0)) && !truthy(&json!("")));
        assert!(truthy(&json!({"type": "json_object"})) && truthy(&json!(0.5)));
        assert_eq!(py_str(&json!(true)), "True");
        assert_eq!(py_str(&json!(1.5)), "1.5");
        assert_eq!(py_str(&json!("xhigh")), "xhigh");
    }
}
