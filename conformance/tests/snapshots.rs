//! insta snapshots of the human-readable outputs: reports (`ds41 certify`'s
//! summary and per-case log, the errata register), inspect output and prompts (`ds41 render`,
//! plain and as segments, and `ds41 parse` of a reply). Kept in goldens/snapshots/ (the
//! snapshot header names this test as its provenance; `ds41 goldens check` requires that
//! header). Update with `INSTA_UPDATE=always cargo test -p ds41-conformance --test snapshots`
//! and review the diff.

use std::process::{Command, Output};

fn run_ds41(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DS41_UPSTREAM")
        .env_remove("DS41_RELEASE")
        .env("HF_HUB_CACHE", "/nonexistent/ds41-snapshot-test")
        .output()
        .expect("run ds41")
}

fn ds41(args: &[&str]) -> String {
    let out = run_ds41(args);
    assert!(
        out.status.success(),
        "ds41 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

macro_rules! snapshot {
    ($name:expr, $value:expr) => {
        insta::with_settings!({
            snapshot_path => "../../goldens/snapshots",
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($name, $value);
        })
    };
}

#[test]
fn errata_register_listing() {
    snapshot!("goldens_errata", ds41(&["goldens", "errata"]));
}

/// `inspect` output with its first line (the machine-specific path) replaced.
fn redact_path(text: String) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    assert!(
        first.starts_with("path:"),
        "unexpected first line {first:?}"
    );
    std::iter::once("path:    <redacted>")
        .chain(lines)
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn inspect_release_config() {
    let config = ds41_engine::testing::release().join("config.json");
    let text = ds41(&["inspect", config.to_str().expect("utf-8 path")]);
    snapshot!("inspect_release_config", redact_path(text));
}

#[test]
fn inspect_tiny_synthetic_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let out = out.to_str().expect("utf-8 path");
    ds41(&["synth", "--preset", "tiny", "--seed", "1", "--out", out]);
    snapshot!("inspect_tiny_seed1", redact_path(ds41(&["inspect", out])));
}

#[test]
fn render_prompt_with_tools_and_response_format() {
    let prompt = ds41(&[
        "render",
        "--conversation",
        "../goldens/dsml/20_tools_and_response_format.json",
    ]);
    snapshot!("render_tools_and_response_format", prompt);
}

#[test]
fn render_segments_of_a_tool_call() {
    let segments = ds41(&[
        "render",
        "--conversation",
        "../goldens/dsml/13_tool_call_typed_params.json",
        "--segments",
    ]);
    snapshot!("render_segments_tool_call", segments);
}

#[test]
fn parse_a_thinking_reply_with_a_tool_call() {
    let dir = tempfile::tempdir().unwrap();
    let completion = dir.path().join("reply.txt");
    std::fs::write(
        &completion,
        "Need the weather.</think>Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n\
         <｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n\
         <｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n\
         </｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
    )
    .unwrap();
    let message = ds41(&[
        "parse",
        "--thinking",
        "--completion",
        completion.to_str().expect("utf-8 path"),
    ]);
    snapshot!("parse_thinking_tool_call", message);
}

/// Replace what differs between runs: the work directory and wall-clock times (`0.17s`).
fn redact_run(text: &str, work: &str) -> String {
    let is_time =
        |w: &str| w.len() > 1 && w.ends_with('s') && w[..w.len() - 1].parse::<f64>().is_ok();
    let redact_word = |word: &str| {
        let core = word.trim_start_matches('(').trim_end_matches([')', ',']);
        if is_time(core) {
            word.replace(core, "<time>")
        } else {
            word.to_string()
        }
    };
    text.replace(work, "<work>")
        .lines()
        .map(|line| {
            let words: Vec<String> = line.split(' ').map(redact_word).collect();
            words.join(" ") + "\n"
        })
        .collect()
}

#[test]
fn certify_report_with_an_injected_defect() {
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().to_str().expect("utf-8 path");
    let out = run_ds41(&[
        "certify",
        "--filter",
        "residual::synthetic::tiny-release-exact-owner-prefill",
        "--filter",
        "loader::synthetic::mutant-tiny-release.missing-scale",
        "--defect",
        "no-attention-sink",
        "--verbose",
        "--work-dir",
        work_dir,
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a defect must make certify fail"
    );
    let report = format!(
        "--- stdout (summary) ---\n{}--- stderr (progress and reasons) ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    snapshot!("certify_no_attention_sink", redact_run(&report, work_dir));
}
