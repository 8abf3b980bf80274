//! `ds41 tokenize` and `ds41 corpus` end to end (TOKENIZER.md §7, §9). The tokenize tests need
//! a release snapshot (`DS41_RELEASE`) for its tokenizer.json.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn ds41() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds41"))
}

fn tokenizer() -> PathBuf {
    ds41_engine::testing::release().join("tokenizer.json")
}

/// Runs `ds41 args` with `stdin`; returns (exit code, stdout, stderr).
fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = ds41()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ds41");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn tokenize_batch_single_and_decode() {
    let tok = tokenizer();
    let tok = tok.to_str().unwrap();
    let input = "\"<｜DSML｜ calls>\"\n\"12345\"\n\"\\u00a0x\"\n";
    let (code, out, err) = run(
        &["tokenize", "--tokenizer", tok, "--jsonl", "--markup"],
        input,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "[30,128825,10699,32]\n[6895,1883]\n[2162,90]\n");
    // As data, the control-token spelling is ordinary BPE.
    let (code, out, _) = run(&["tokenize", "--tokenizer", tok, "--jsonl"], input);
    assert_eq!(code, 0);
    let first: Vec<u32> = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(!first.contains(&128825), "{first:?}");
    // Non-batch: argument or stdin.
    let (_, out, _) = run(
        &["tokenize", "--tokenizer", tok, "--markup", "<｜User｜>你好"],
        "",
    );
    assert_eq!(out, "[128803,30594]\n");
    let (_, out, _) = run(&["tokenize", "--tokenizer", tok, "--markup"], ".\n\n");
    assert_eq!(out, "[339]\n");
    let (code, out, _) = run(
        &[
            "tokenize",
            "--tokenizer",
            tok,
            "--decode",
            "--skip-special",
            "[0,128799,44489,1]",
        ],
        "",
    );
    assert_eq!(code, 0);
    assert_eq!(out, "\"<｜System｜>sys\"\n");
    // A bad batch line is an input error naming the line.
    let (code, _, err) = run(
        &["tokenize", "--tokenizer", tok, "--jsonl"],
        "\"ok\"\nnot json\n",
    );
    assert_eq!(code, 2);
    assert!(err.contains("stdin line 2"), "{err}");
}

#[test]
fn tokenize_missing_tokenizer_is_an_error() {
    let (code, _, err) = run(
        &[
            "tokenize",
            "--tokenizer",
            "/nonexistent/tokenizer.json",
            "x",
        ],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
}

#[test]
fn corpus_is_deterministic_and_sized() {
    let (code, a, err) = run(
        &["corpus", "--wide", "50", "--seed", "11", "--no-extra"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = a
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 21 + 50 + 200);
    assert_eq!(lines[0]["text"], "The capital of France is");
    assert_eq!(lines[21]["kind"], "random");
    assert_eq!(lines[270]["kind"], "whitespace");
    let (_, b, _) = run(
        &["corpus", "--wide", "50", "--seed", "11", "--no-extra"],
        "",
    );
    assert_eq!(a, b);
    let (_, c, _) = run(
        &["corpus", "--wide", "50", "--seed", "12", "--no-extra"],
        "",
    );
    assert_ne!(a, c);
    let (_, d, _) = run(&["corpus", "--wide", "50"], "");
    assert!(d.lines().count() > 271 && d.contains("\"kind\":\"extra\""));
}
