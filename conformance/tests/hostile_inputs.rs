//! The `ds41` commands on hostile engine-side inputs:
//! * a tokenizer.json with one huge id: `tokenize` and `serve-adapter` refuse it with the
//!   field named (the adapter session goes on); `forward` (whose Engram map reader follows HF
//!   and allocates nothing by id) ends normally;
//! * a FIFO where a tokenizer.json is expected is refused at once;
//! * a checkpoint another process changes while `ds41 forward` runs: a file truncated under
//!   the memory map ends the process with one line naming it and the documented exit status;
//!   bytes overwritten in place are detected before the trace is written, which is refused.
//!   Deterministic: the engine's test hook (`DS41_TEST_PAUSE_AFTER_OPEN`) pauses the process
//!   right after the checkpoint is opened; the test changes the file and lets it go on.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use ds41_engine::checkpoint::PAUSE_AFTER_OPEN_ENV;
use ds41_engine::io::EXIT_MAPPED_FILE_CHANGED;
use ds41_synthetic::Layout;

fn generate(layout: Layout) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    ds41_synthetic::generate("tiny", layout, 11, &model).unwrap();
    (dir, model)
}

/// Start `ds41 forward` paused after opening; run `change` on the paused process's files;
/// let it finish.
fn forward_changing(dir: &Path, model: &Path, change: impl FnOnce()) -> (Output, PathBuf) {
    let flag = dir.join("paused");
    let trace = dir.join("trace.safetensors");
    let child: Child = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(["forward", "--model"])
        .arg(model)
        .args(["--tokens", "5,9,13,2,7,7,30", "--prefill", "4", "--out"])
        .arg(&trace)
        .env(PAUSE_AFTER_OPEN_ENV, &flag)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !flag.exists() {
        assert!(
            Instant::now() < deadline,
            "ds41 forward never reached the pause"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    change();
    std::fs::remove_file(&flag).unwrap();
    (child.wait_with_output().unwrap(), trace)
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn assert_one_line_truncation_error(out: &Output, file: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(EXIT_MAPPED_FILE_CHANGED),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{stderr}");
    assert!(
        lines[0].contains(&file.display().to_string()) && lines[0].contains("truncated"),
        "{stderr}"
    );
}

#[test]
fn a_release_shard_truncated_during_forward_is_one_line_naming_it() {
    let (dir, model) = generate(Layout::Release);
    let shard = model.join("model.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    let (out, trace) = forward_changing(dir.path(), &model, || truncate(&shard, len / 8));
    assert_one_line_truncation_error(&out, &shard);
    assert!(!trace.exists());
}

#[test]
fn container_trunk_and_bank_truncated_during_forward_are_one_line_naming_them() {
    for file in ["trunk.bin", "experts-L1.bin"] {
        let (dir, model) = generate(Layout::Container);
        let path = model.join(file);
        assert!(
            path.is_file(),
            "{file} missing from the synthetic container"
        );
        let (out, trace) = forward_changing(dir.path(), &model, || truncate(&path, 0));
        assert_one_line_truncation_error(&out, &path);
        assert!(!trace.exists());
    }
}

#[test]
fn bytes_overwritten_in_place_during_forward_refuse_the_trace() {
    for (layout, file) in [
        (Layout::Release, "model.safetensors"),
        (Layout::Container, "trunk.bin"),
    ] {
        let (dir, model) = generate(layout);
        let path = model.join(file);
        let len = std::fs::metadata(&path).unwrap().len();
        let (out, trace) = forward_changing(dir.path(), &model, || {
            // Same inode and length; new bytes in the middle; a new modification time
            // (set explicitly: a coarse file-system clock could otherwise keep the old one).
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0u8; 64], len / 2).unwrap();
            f.set_modified(SystemTime::now() + Duration::from_secs(3))
                .unwrap();
        });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{layout:?}: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string())
                && stderr.contains("changed on disk while in use"),
            "{layout:?}: {stderr}"
        );
        assert!(!trace.exists(), "{layout:?}: a trace was written");
    }
}

/// The synthetic release with one vocab id raised to 2^32 − 1 in its tokenizer.json.
fn release_with_huge_token_id() -> (tempfile::TempDir, PathBuf) {
    let (dir, model) = generate(Layout::Release);
    let path = model.join("tokenizer.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let key = vocab.keys().next_back().unwrap().clone();
    vocab.insert(key, serde_json::json!(u32::MAX));
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    (dir, model)
}

fn ds41(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that does not read stdin may exit before the write (broken pipe): fine.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn assert_refused_naming(out: &Output, words: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for w in words {
        assert!(stderr.contains(w), "`{w}` not in:\n{stderr}");
    }
}

#[test]
fn a_huge_token_id_is_refused_by_tokenize_and_serve_adapter_and_forward_survives() {
    let (_dir, model) = release_with_huge_token_id();
    let tok = model.join("tokenizer.json");
    let tok = tok.to_str().unwrap();
    let words = ["model.vocab", "4294967295"];
    assert_refused_naming(&ds41(&["tokenize", "--tokenizer", tok], b"hello"), &words);
    // `forward` builds the Engram token map with its own reader, which follows HF (sparse
    // ids allowed, nothing allocated by id): it must end normally, never abort.
    let m = model.to_str().unwrap();
    let args = [
        "forward",
        "--model",
        m,
        "--tokens",
        "5,9",
        "--out",
        "/dev/null",
    ];
    let out = ds41(&args, b"");
    assert!(
        out.status.code().is_some(),
        "forward died from a signal: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let requests = format!(
        "{{\"id\": 1, \"op\": \"hello\", \"protocol\": \"ds41-engine/1\"}}\n\
         {{\"id\": 2, \"op\": \"tokenize\", \"tokenizer\": {tok:?}, \"texts\": [\"hi\"], \"markup\": false}}\n\
         {{\"id\": 3, \"op\": \"hello\", \"protocol\": \"ds41-engine/1\"}}\n"
    );
    let out = ds41(&["serve-adapter"], requests.as_bytes());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replies: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), 3, "{stdout}");
    assert_eq!(replies[1]["ok"], false, "{stdout}");
    let message = replies[1]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("model.vocab") && message.contains("4294967295"),
        "{message}"
    );
    assert_eq!(
        replies[2]["ok"], true,
        "the session did not go on: {stdout}"
    );
}

#[test]
fn a_fifo_tokenizer_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("tokenizer.json");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = ds41(&["tokenize", "--tokenizer", fifo.to_str().unwrap()], b"hi");
    assert_refused_naming(&out, &["tokenizer.json", "is a FIFO, not a regular file"]);
}
