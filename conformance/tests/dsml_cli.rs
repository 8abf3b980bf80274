//! `ds41 render` and `ds41 parse` end to end, on the built binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ds41(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .output()
        .expect("run ds41")
}

fn goldens() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/dsml")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn render_prints_exactly_the_golden_prompt() {
    for stem in [
        "01_chat_system_two_turns",
        "11_tools_force_keep_thinking",
        "35_context_continuation",
    ] {
        let input = goldens().join(format!("{stem}.json"));
        let want = std::fs::read_to_string(goldens().join(format!("{stem}.txt"))).unwrap();
        let out = ds41(&["render", "--conversation", input.to_str().unwrap()]);
        assert!(out.status.success(), "{stem}: {}", stderr(&out));
        assert_eq!(
            stdout(&out),
            want,
            "{stem}: no newline added, bytes identical"
        );
    }
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn render_official_cases_of_the_release() {
    let dir = ds41_engine::testing::release().join("encoding/tests");
    for n in 1..=5 {
        let input = dir.join(format!("test_input_{n}.json"));
        let want = std::fs::read_to_string(dir.join(format!("test_output_{n}.txt"))).unwrap();
        let out = ds41(&["render", "--conversation", input.to_str().unwrap()]);
        assert!(out.status.success(), "case {n}: {}", stderr(&out));
        assert_eq!(stdout(&out), want, "case {n}");
    }
}

#[test]
fn flags_apply_unless_the_file_sets_mode_and_effort() {
    let tmp = tempfile::tempdir().unwrap();
    let list = write(
        tmp.path(),
        "list.json",
        r#"[{"role": "user", "content": "q"}]"#,
    );
    let out = ds41(&[
        "render",
        "--conversation",
        &list,
        "--thinking-mode",
        "thinking",
        "--reasoning-effort",
        "42",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 42 (range 1-100, the higher the value, the more thorough the reasoning)\n\n<｜User｜>q<｜Assistant｜><think>"
    );
    // Default mode is chat.
    let out = ds41(&["render", "--conversation", &list]);
    assert_eq!(
        stdout(&out),
        "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think>"
    );
    // The file's own mode and effort win.
    let obj = write(
        tmp.path(),
        "case.json",
        r#"{"thinking_mode": "thinking", "reasoning_effort": "low", "messages": [{"role": "user", "content": "q"}]}"#,
    );
    let out = ds41(&[
        "render",
        "--conversation",
        &obj,
        "--thinking-mode",
        "chat",
        "--reasoning-effort",
        "max",
    ]);
    assert!(
        stdout(&out).contains("Reasoning Effort: 50 "),
        "{}",
        stdout(&out)
    );
    // A bad effort flag is refused with the reference's message.
    let out = ds41(&[
        "render",
        "--conversation",
        &list,
        "--reasoning-effort",
        "xhigh",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("Invalid reasoning effort for deepseek_v41: xhigh"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn segments_keep_user_markers_as_text() {
    let input = goldens().join("34_literal_markers_pass_through.json");
    let out = ds41(&[
        "render",
        "--conversation",
        input.to_str().unwrap(),
        "--segments",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let segments: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let segments = segments.as_array().unwrap();
    let controls: Vec<&str> = segments
        .iter()
        .filter_map(|s| s["control"].as_str())
        .collect();
    // The tool result's literal `｜DSML｜`, EOS, `</think>` and `<｜Assistant｜>` stay inside text.
    let tool_text = segments
        .iter()
        .filter_map(|s| s["text"].as_str())
        .find(|t| t.contains("<tool_result>"))
        .unwrap();
    assert!(tool_text.contains("</｜DSML｜ calls> <｜end▁of▁sentence｜> </think> <｜Assistant｜>"));
    assert_eq!(
        controls
            .iter()
            .filter(|c| **c == "<｜end▁of▁sentence｜>")
            .count(),
        1
    );
    assert_eq!(controls.last(), Some(&"<think>"));
    let ids: Vec<u64> = segments.iter().filter_map(|s| s["id"].as_u64()).collect();
    assert_eq!(ids[..2], [0, 128799]);
}

#[test]
fn bad_conversations_name_the_message_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]"#,
            "messages[1].role: Unknown role: robot",
        ),
        (
            r#"[{"role": "developer", "content": "b"}]"#,
            "messages[0].role: Unknown role: developer",
        ),
        (
            r#"[{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]"#,
            "messages[1].tool_calls[0].function.arguments: missing",
        ),
        (r#"[{"content": "a"}]"#, "messages[0].role: missing"),
        (
            r#"{"messages": [{"role": "user", "content": "a"}"#,
            "not valid JSON",
        ),
        (r#"{"msgs": []}"#, "messages: missing"),
        (
            r#"[{"role": "user", "content": [{"type": "text", "text": 5}]}]"#,
            "messages[0].content[0].text: expected a string",
        ),
    ];
    for (i, (json, want)) in cases.iter().enumerate() {
        let path = write(tmp.path(), &format!("bad{i}.json"), json);
        let out = ds41(&["render", "--conversation", &path]);
        assert_eq!(out.status.code(), Some(2), "{json}");
        assert!(stdout(&out).is_empty());
        let err = stderr(&out);
        assert!(err.contains(want) && err.contains(&path), "{json}: {err}");
    }
    let out = ds41(&["render", "--conversation", "/nonexistent/x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/x.json"));
}

#[test]
fn parse_prints_the_reference_shape_and_rejects_with_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let good = write(
        tmp.path(),
        "good.txt",
        "  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"ns::lookup\">\n<｜DSML｜ parameter name=\"query\" string=\"true\">välue</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
    );
    let out = ds41(&["parse", "--completion", &good, "--thinking"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "{\"role\": \"assistant\", \"content\": \"summary\", \"reasoning_content\": \"  reason  \", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"lookup\", \"arguments\": \"{\\\"query\\\": \\\"välue\\\", \\\"limit\\\": 2}\"}, \"namespace\": \"ns\"}]}\n"
    );
    // Chat mode: the same text has a `</think>` in its content.
    let out = ds41(&["parse", "--completion", &good]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("AssertionError: Unexpected special token '</think>' in content"),
        "{}",
        stderr(&out)
    );
    // Strict rejects a truncated answer; tolerant accepts it and reports the repair.
    let cut = write(tmp.path(), "cut.txt", "Hello");
    let out = ds41(&["parse", "--completion", &cut]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("missing EOS token"));
    let out = ds41(&["parse", "--completion", &cut, "--tolerant"]);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out),
        "{\"role\": \"assistant\", \"content\": \"Hello\", \"reasoning_content\": \"\", \"tool_calls\": []}\n"
    );
    assert!(stderr(&out).contains("MissingEos"));
    // Not UTF-8: named with the byte offset.
    let bad = tmp.path().join("bad.txt");
    std::fs::write(&bad, b"ok\xff").unwrap();
    let out = ds41(&["parse", "--completion", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("@ byte 2"), "{}", stderr(&out));
}
