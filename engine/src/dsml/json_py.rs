//! Python `json` compatibility (DSML.md §2.2, §2.3, §3): the reference encoder writes every JSON
//! fragment with `json.dumps(value, ensure_ascii=False)` and reads tool arguments with
//! `json.loads`. Byte-exact prompts need the same text, so this module reproduces
//!
//! * `dumps`: separators `", "` and `": "`, key order preserved (serde_json `preserve_order`),
//!   non-ASCII written raw, only `"`, `\\` and U+0000–U+001F escaped, floats in Python `repr`
//!   form (`1.0`, `1e-05`, `1e+16`);
//! * `loads`: serde_json, plus an explicit refusal of the inputs Python reads differently
//!   (integer literals beyond 64 bits, which Python keeps exact, and the `NaN` / `Infinity`
//!   literals Python accepts). Refusing is deliberate: silently rounding would change the prompt.
//! * `truthy` and `py_str`: Python truthiness and `str()` of a JSON value, used where the
//!   reference tests `if value:` or formats a value into an error message.

use serde_json::Value;
use std::fmt::Write as _;

/// `json.dumps(value, ensure_ascii=False)`.
pub fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// `json.dumps(text, ensure_ascii=False)` for a string.
pub fn dumps_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    write_str(&mut out, text);
    out
}

fn write_value(out: &mut String, value: &Value) {
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
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k);
                out.push_str(": ");
                write_value(out, v);
            }
            out.push('}');
        }
    }
}

/// Python's `json` string escaping with `ensure_ascii=False` (`ESCAPE` in `json/encoder.py`):
/// only `"`, `\`, and the C0 controls are escaped; everything else is written raw.
fn write_str(out: &mut String, s: &str) {
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
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
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
