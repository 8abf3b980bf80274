//! JSON text exactly as CPython's `json.dump(obj, f, indent=N)` writes it (default
//! `ensure_ascii=True`, separators `","`/`": "` with indentation, floats by `repr`).
//!
//! The container files are written this way so the `waste-tiny` container is byte-identical to
//! WASTE's Python generator (CONTAINER.md §10.2 item 4), and so non-ASCII text such as the
//! DS41 special tokens is written with `\uXXXX` escapes a reader must decode (§7).

use serde_json::Value;

pub fn to_string(v: &Value, indent: usize) -> String {
    let mut out = String::new();
    write_value(v, indent, 0, &mut out);
    out
}

fn write_value(v: &Value, indent: usize, level: usize, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                out.push_str(&py_float_repr(f));
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(indent, level + 1, out);
                write_value(x, indent, level + 1, out);
            }
            newline(indent, level, out);
            out.push(']');
        }
        Value::Object(m) => {
            if m.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(indent, level + 1, out);
                write_str(k, out);
                out.push_str(": ");
                write_value(x, indent, level + 1, out);
            }
            newline(indent, level, out);
            out.push('}');
        }
    }
}

fn newline(indent: usize, level: usize, out: &mut String) {
    out.push('\n');
    out.extend(std::iter::repeat(' ').take(indent * level));
}

/// `json.encoder.py_encode_basestring_ascii`.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", u));
                }
            }
        }
    }
    out.push('"');
}

/// CPython `float.__repr__`: the shortest round-tripping digits, fixed notation when the
/// decimal exponent is in [−4, 16), otherwise `d.ddde±XX`.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let sci = format!("{:e}", f); // shortest digits, e.g. "1.5e-5", "4e4"
    let (mant, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= n - 1 {
            format!("{}{}.0", digits, "0".repeat((exp - (n - 1)) as usize))
        } else if exp >= 0 {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        };
        format!("{sign}{body}")
    } else {
        let (a, b) = digits.split_at(1);
        let m = if b.is_empty() {
            a.to_string()
        } else {
            format!("{a}.{b}")
        };
        format!(
            "{sign}{m}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_cpython() {
        for (f, s) in [
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (2.0, "2.0"),
            (40000.0, "40000.0"),
            (0.1, "0.1"),
            (1e-20, "1e-20"),
            (123.456, "123.456"),
            (1e16, "1e+16"),
            (0.0001, "0.0001"),
            (-2.5e-7, "-2.5e-07"),
            (1234567890123456.0, "1234567890123456.0"),
        ] {
            assert_eq!(py_float_repr(f), s);
        }
    }

    #[test]
    fn layout_matches_json_dump_indent_1() {
        let v = json!({"a": [1, 2], "b": {"c": "x\u{ff5c}"}, "d": [], "e": 2.0});
        assert_eq!(
            to_string(&v, 1),
            "{\n \"a\": [\n  1,\n  2\n ],\n \"b\": {\n  \"c\": \"x\\uff5c\"\n },\n \"d\": [],\n \"e\": 2.0\n}"
        );
        // Astral characters become surrogate pairs.
        assert_eq!(to_string(&json!("\u{1F600}"), 1), "\"\\ud83d\\ude00\"");
    }
}
