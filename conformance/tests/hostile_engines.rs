//! Engines that misbehave, through both drivers (a protocol adapter and a command profile)
//! and through `ds41 certify`: endless output, silence, deaf stdin, garbage, signals,
//! processes left behind. Each must become a named failure within the case deadline, leave
//! the harness bounded in memory and usable, and leave no engine process alive.
//!
//! The fake engines are small shell scripts. Every process they start records its pid, so
//! a test can check that none survives.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ds41_conformance::engine_api::*;
use ds41_conformance::profile::ProfileEngine;
use ds41_conformance::protocol::AdapterEngine;

/// A protocol engine that answers `hello`, then misbehaves as `$MODE` says. It and a
/// grandchild (`sleep`) record their pids in `$PIDS`.
const PROTOCOL_ENGINE: &str = r#"
echo $$ >> "$PIDS"
sleep 300 &
echo $! >> "$PIDS"
idof() { printf '%s' "$1" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p'; }
IFS= read -r line || exit 0
id=$(idof "$line")
[ "$MODE" = no-hello ] && { echo 'Loading weights... 12%'; sleep 300; }
[ "$MODE" = mute ] && sleep 300
# answers the first hello only: every restarted engine stays silent
[ "$MODE" = hello-once ] && [ -e "$PIDS.started" ] && sleep 300
[ "$MODE" = hello-once ] && { : > "$PIDS.started"; MODE=segv; }
printf '{"id":%s,"ok":true,"result":{"protocol":"ds41-engine/1","engine":{"name":"hostile","version":"0"},"capabilities":["parse"]}}\n' "$id"
[ "$MODE" = deaf ] && sleep 300
while IFS= read -r line; do
  id=$(idof "$line")
  case "$line" in *'"shutdown"'*) exit 0;; esac
  case "$MODE" in
    hang) sleep 300;;
    garbage) echo 'Traceback (most recent call last):';;
    wrong-id) printf '{"id":%s,"ok":true,"result":{"message":{}}}\n' $((id + 7));;
    half-line) printf '{"id":%s,"ok":tr' "$id"; sleep 300;;
    blank-lines) exec yes '';;
    endless-line) exec tr '\0' x < /dev/zero;;
    stderr-flood) head -c 300000000 /dev/zero >&2; sleep 300;;
    non-utf8) printf '\377\376 {"id":%s}\n' "$id";;
    segv) kill -SEGV $$;;
    *) printf '{"id":%s,"ok":true,"result":{"message":{"role":"assistant","content":"ok"}}}\n' "$id";;
  esac
done
"#;

struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("engine.sh"), PROTOCOL_ENGINE).unwrap();
        Fake { dir }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// The `--engine` command for `mode`, its pids recorded in `pids-MODE`.
    fn command(&self, mode: &str) -> String {
        format!(
            "MODE={mode} PIDS={} exec sh {}",
            self.path(&format!("pids-{mode}")).display(),
            self.path("engine.sh").display()
        )
    }
    fn pids(&self, mode: &str) -> Vec<u32> {
        read_pids(&self.path(&format!("pids-{mode}")))
    }
}

/// The pids a fake engine recorded (one per line).
fn read_pids(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

/// Alive and not a zombie waiting for its (new) parent to reap it.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Every recorded process is gone (allowing a moment for the kernel to deliver SIGKILL).
fn assert_all_gone(what: &str, pids: &[u32]) {
    assert!(!pids.is_empty(), "{what}: the fake engine recorded no pid");
    let until = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
    }
    assert!(
        left.is_empty(),
        "{what}: engine processes {left:?} survived"
    );
}

fn parse_req(completion: String) -> ParseRequest {
    ParseRequest {
        completion,
        thinking: false,
        tolerant: false,
    }
}

/// One request to a protocol engine in `mode`: the error, how long it took, and whether
/// the engine's processes are gone afterwards (the adapter dropped).
fn protocol_call(mode: &str, completion: String, timeout: Duration) -> (EngineError, Duration) {
    let fake = Fake::new();
    let mut engine = AdapterEngine::start(&fake.command(mode)).unwrap();
    let started = Instant::now();
    let r = engine.parse(&parse_req(completion), timeout);
    let took = started.elapsed();
    // The failed engine's group is ended at once, before the adapter is dropped.
    assert_all_gone(mode, &fake.pids(mode));
    drop(engine);
    (r.expect_err(mode), took)
}

#[test]
fn endless_blank_lines_fail_within_the_deadline() {
    let (e, took) = protocol_call("blank-lines", "x".into(), Duration::from_secs(5));
    assert!(
        matches!(&e, EngineError::Garbage(m) if m.contains("more than 64 MiB on stdout without a complete reply")),
        "{e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn an_endless_line_is_garbage_not_an_allocation() {
    let (e, _) = protocol_call("endless-line", "x".into(), Duration::from_secs(20));
    assert!(
        matches!(&e, EngineError::Garbage(m) if m.contains("MiB on stdout")),
        "{e}"
    );
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_stderr_flood_is_kept_as_a_bounded_tail() {
    let before = rss_kib();
    let (e, _) = protocol_call("stderr-flood", "x".into(), Duration::from_secs(3));
    assert!(matches!(e, EngineError::Timeout(..)), "{e}");
    let grown = rss_kib().saturating_sub(before);
    // 300 MB went through stderr; the harness keeps a few KiB of it.
    // (Other tests of this binary run alongside: one may hold a 64 MiB reply buffer.)
    assert!(grown < 200 << 10, "the harness grew by {grown} KiB");
}

#[test]
fn an_engine_that_stops_reading_stdin_times_out() {
    let (e, took) = protocol_call("deaf", "x".repeat(2 << 20), Duration::from_secs(1));
    assert!(matches!(e, EngineError::Timeout(..)), "{e}");
    assert!(e.to_string().contains("stopped reading its stdin"), "{e}");
    assert!(took < Duration::from_secs(4), "{took:?}");
}

#[test]
fn protocol_failures_are_named() {
    let cases: [(&str, &str); 5] = [
        ("garbage", "not a protocol reply"),
        ("wrong-id", "reply for id"),
        ("non-utf8", "not UTF-8 (invalid byte 0xff at offset 0"),
        ("segv", "was killed by signal 11 (SIGSEGV)"),
        ("hang", "timed out after 0.5s"),
    ];
    for (mode, words) in cases {
        let (e, _) = protocol_call(mode, "x".into(), Duration::from_millis(500));
        assert!(e.to_string().contains(words), "{mode}: {e}");
    }
    // A plain hang read its request: it is not blamed on stdin.
    let (e, _) = protocol_call("hang", "x".into(), Duration::from_millis(500));
    assert!(!e.to_string().contains("stdin"), "{e}");
    // A half line is no reply: the deadline ends the wait.
    let (e, _) = protocol_call("half-line", "x".into(), Duration::from_millis(500));
    assert!(matches!(e, EngineError::Timeout(..)), "{e}");
}

/// Restarting a discarded engine is part of the next request: a restarted engine that
/// never says hello fails that request at its deadline.
#[test]
fn a_restarted_engine_that_never_says_hello_times_out_with_the_case() {
    let fake = Fake::new();
    let mut engine = AdapterEngine::start(&fake.command("hello-once")).unwrap();
    let t = Duration::from_millis(500);
    let r = engine.parse(&parse_req("x".into()), t);
    assert!(matches!(r, Err(EngineError::Crashed(_))), "{r:?}");
    let started = Instant::now();
    let r = engine.parse(&parse_req("x".into()), t);
    assert!(matches!(r, Err(EngineError::Timeout(..))), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(engine);
    assert_all_gone("hello-once", &fake.pids("hello-once"));
}

#[test]
fn an_engine_that_never_says_hello_leaves_nothing_behind() {
    let fake = Fake::new();
    let e = AdapterEngine::start(&fake.command("no-hello"))
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("not a protocol reply"), "{e:#}");
    assert_all_gone("no-hello", &fake.pids("no-hello"));
}

/// The first hello is bounded by the start's own timeout (`certify --hello-timeout`), and
/// the error says which bound it was.
#[test]
fn a_mute_engine_fails_its_first_hello_at_the_hello_timeout() {
    let fake = Fake::new();
    let started = Instant::now();
    let e = AdapterEngine::start_within(&fake.command("mute"), Duration::from_millis(300))
        .err()
        .unwrap();
    let text = format!("{e:#}");
    assert!(
        text.contains("timed out after 0.3s") && text.contains("--hello-timeout"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_all_gone("mute", &fake.pids("mute"));
}

#[test]
fn a_working_engine_is_shut_down_with_its_children() {
    let fake = Fake::new();
    let mut engine = AdapterEngine::start(&fake.command("ok")).unwrap();
    let m = engine.parse(&parse_req("x".into()), Duration::from_secs(5));
    assert_eq!(m.unwrap()["content"], "ok");
    drop(engine);
    assert_all_gone("ok", &fake.pids("ok"));
}

// ----------------------------------------------------------------------- command profiles

fn profile(dir: &Path, body: &str) -> ProfileEngine {
    let p = dir.join("profile.yaml");
    std::fs::write(
        &p,
        format!("engine: {{name: hostile, version: '0'}}\n{body}"),
    )
    .unwrap();
    ProfileEngine::new(&p).unwrap()
}

fn render_with(dir: &Path, script: &str, timeout: Duration) -> (EngineResult<String>, Duration) {
    let script_file = dir.join("render.sh");
    std::fs::write(&script_file, script).unwrap();
    let mut e = profile(
        dir,
        &format!(
            "capabilities: [render]\nrefusal_exit_codes: [3]\nrender:\n  command: [sh, {}]\n",
            script_file.display()
        ),
    );
    let started = Instant::now();
    let r = e.render(
        &RenderRequest {
            conversation: serde_json::json!([]),
            thinking_mode: None,
            reasoning_effort: None,
        },
        timeout,
    );
    (r, started.elapsed())
}

/// A script that records its pid, starts a `sleep` in the background (pid recorded too),
/// then runs `then`; and the file of pids.
fn with_grandchild(dir: &Path, then: &str) -> (String, PathBuf) {
    let pids = dir.join("pids");
    let p = pids.display();
    (
        format!("echo $$ >> {p}; sleep 30 & echo $! >> {p}; {then}\n"),
        pids,
    )
}

#[test]
fn a_profile_command_whose_child_holds_stdout_does_not_hang() {
    let d = tempfile::tempdir().unwrap();
    let (script, pids) = with_grandchild(d.path(), "echo '<prompt>'; exit 0");
    let (r, took) = render_with(d.path(), &script, Duration::from_secs(20));
    let e = r.unwrap_err();
    assert!(
        e.to_string()
            .contains("exited with status 0 but left a process holding its stdout open"),
        "{e}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_all_gone("background child", &read_pids(&pids));
}

#[test]
fn a_profile_timeout_ends_the_grandchildren() {
    let d = tempfile::tempdir().unwrap();
    let (script, pids) = with_grandchild(d.path(), "sleep 300");
    let (r, took) = render_with(d.path(), &script, Duration::from_millis(500));
    assert!(matches!(r, Err(EngineError::Timeout(..))), "{r:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_all_gone("profile timeout", &read_pids(&pids));
}

#[test]
fn profile_failures_are_named() {
    let d = tempfile::tempdir().unwrap();
    let t = Duration::from_secs(20);
    let cases: [(&str, &str); 5] = [
        ("exec yes", "wrote more than 64 MiB on stdout (killed)"),
        (
            "printf 'ok\\377'",
            "its stdout is not UTF-8 (invalid byte 0xff at offset 2 of 3)",
        ),
        ("kill -SEGV $$", "was killed by signal 11 (SIGSEGV)"),
        ("echo 'no such container' >&2; exit 3", "engine refused:"),
        (
            "echo 'Traceback' >&2; exit 1",
            "exited with status 1, not a declared refusal exit code (declared: [3])",
        ),
    ];
    for (script, words) in cases {
        let (r, _) = render_with(d.path(), script, t);
        let e = r.unwrap_err().to_string();
        assert!(e.contains(words), "{script}: {e}");
    }
    let (r, _) = render_with(d.path(), "echo 'no such container' >&2; exit 3", t);
    assert!(
        matches!(&r, Err(EngineError::Refused(m)) if m.contains("no such container")),
        "{r:?}"
    );
    let (r, _) = render_with(d.path(), "echo Traceback >&2; exit 1", t);
    assert!(
        matches!(&r, Err(EngineError::Crashed(m)) if m.contains("Traceback")),
        "{r:?}"
    );
}

/// Output files that are not files: a FIFO nobody writes (reading it would block) and a
/// link to `/dev/zero` (reading it would never end) are garbage, at once.
#[test]
fn forward_outputs_that_are_not_regular_files_are_garbage() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"vocab_size": 8, "num_hidden_layers": 1, "hc_mult": 1, "hidden_size": 4}"#,
    )
    .unwrap();
    for (make, words) in [
        ("mkfifo {out_dir}/logits.f32", "not a regular file"),
        ("ln -s /dev/zero {out_dir}/logits.f32", "not a regular file"),
        (
            "head -c 40 /dev/zero > {out_dir}/logits.f32",
            "40 bytes, expected 32",
        ),
    ] {
        let mut e = profile(
            d.path(),
            &format!(
                "capabilities: [forward, numerics.exact, index_k.owner]\nforward:\n  command: [sh, -c, '{make}']\n  outputs:\n    logits: {{file: '{{out_dir}}/logits.f32', layout: last_token_f32}}\n"
            ),
        );
        let started = Instant::now();
        let r = e.forward(
            &ForwardRequest {
                model: model.clone(),
                tokens: vec![1, 2],
                prefill: None,
                numerics: Numerics::Exact,
                index_k: IndexK::Owner,
                out: d.path().join("trace.safetensors"),
                save_state: None,
                load_state: None,
                replay: None,
                engram_token_map: None,
                images: Vec::new(),
            },
            Duration::from_secs(10),
        );
        assert!(
            matches!(&r, Err(EngineError::Garbage(m)) if m.contains(words)),
            "{make}: {r:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{make}");
    }
}

// ------------------------------------------------------------------------ `ds41 certify`

/// Three DSML parse cases with a one-second deadline: nothing to generate, quick to run.
fn parse_cases(dir: &Path) -> PathBuf {
    let cases = dir.join("cases/dsml");
    std::fs::create_dir_all(&cases).unwrap();
    let mut text = String::from("family: dsml\ncases:\n");
    for i in 0..3 {
        text += &format!(
            "  - name: p{i}\n    parse: {{completion: \"x{i}\", expected: {{role: assistant, content: ok}}}}\n    timeout_s: 1\n"
        );
    }
    std::fs::write(cases.join("parse.yaml"), text).unwrap();
    dir.join("cases")
}

fn certify(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ds41"))
        .arg("certify")
        .args(args)
        .env_remove("DS41_UPSTREAM")
        .output()
        .unwrap()
}

/// No engine process survives `ds41 certify`, whatever the engine did; every case of the
/// run is judged (the run goes on after each failure).
#[test]
fn no_engine_process_survives_certify() {
    let fake = Fake::new();
    let cases = parse_cases(fake.dir.path());
    let modes = [
        "hang",
        "garbage",
        "wrong-id",
        "half-line",
        "blank-lines",
        "no-hello",
        "ok",
    ];
    let runs: Vec<_> = modes
        .iter()
        .map(|mode| {
            let (cmd, cases) = (fake.command(mode), cases.clone());
            std::thread::spawn(move || {
                certify(&["--engine", &cmd, "--cases", cases.to_str().unwrap()])
            })
        })
        .collect();
    for (mode, run) in modes.iter().zip(runs) {
        let out = run.join().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let want = match *mode {
            "ok" => 0,
            "no-hello" => 2,
            _ => 1,
        };
        assert_eq!(out.status.code(), Some(want), "{mode}: {text}");
        if want == 1 {
            assert_eq!(
                text.matches("failed: dsml::parse::p").count(),
                3,
                "{mode}: {text}"
            );
        }
        assert_all_gone(mode, &fake.pids(mode));
    }
}

/// Engines in their own process groups miss the terminal's Ctrl-C: a harness ended by
/// SIGINT or SIGTERM ends them first, and removes the scratch directory it wrote its data to.
#[test]
fn a_harness_ended_by_a_signal_takes_its_engines_along() {
    let fake = Fake::new();
    let cases = parse_cases(fake.dir.path());
    for (signal, mode) in [("INT", "hang"), ("TERM", "deaf")] {
        let tmp = tempfile::tempdir().unwrap();
        let mut certify = Command::new(env!("CARGO_BIN_EXE_ds41"))
            .args(["certify", "--engine", &fake.command(mode), "--cases"])
            .arg(&cases)
            .env_remove("DS41_UPSTREAM")
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait until the engine and its grandchild are up.
        let until = Instant::now() + Duration::from_secs(10);
        while fake.pids(mode).len() < 2 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(certify.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        let ended = certify.wait().unwrap();
        assert!(!ended.success(), "{signal}: {ended:?}");
        assert_eq!(
            ended.signal(),
            Some(if signal == "INT" {
                libc::SIGINT
            } else {
                libc::SIGTERM
            }),
            "ended by its signal: {ended:?}"
        );
        assert_all_gone(&format!("SIG{signal}"), &fake.pids(mode));
        let left = left_behind(tmp.path());
        assert!(left.is_empty(), "SIG{signal}: left behind {left:?}");
    }
}

/// Ctrl-C in the middle of a run (here the reference's own, no engine process involved)
/// ends it by that signal, and the scratch directory with the written-out cases, goldens and
/// synthetic checkpoints goes with it; so it does after `kill -9`, which no handler sees.
#[test]
fn an_interrupted_certify_leaves_no_scratch_directory() {
    for signal in [libc::SIGINT, libc::SIGKILL] {
        let tmp = tempfile::tempdir().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ds41"))
            .args(["certify", "--exact"])
            .env_remove("DS41_UPSTREAM")
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Interrupt once the run is writing its data out (the embedded gates are among the
        // first files).
        let written = |p: &Path| {
            std::fs::read_dir(p)
                .unwrap()
                .filter_map(|e| std::fs::read_dir(e.ok()?.path()).ok())
                .flatten()
                .any(|data| data.is_ok_and(|d| d.path().join("gates").is_dir()))
        };
        let until = Instant::now() + Duration::from_secs(60);
        while !written(tmp.path()) {
            assert!(
                Instant::now() < until,
                "certify wrote no scratch data in 60 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: signals the child this test started and has not yet reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
        let done = child.wait_with_output().unwrap();
        assert_eq!(
            done.status.signal(),
            Some(signal),
            "{:?}: {}",
            done.status,
            String::from_utf8_lossy(&done.stderr)
        );
        let left = left_behind(tmp.path());
        assert!(left.is_empty(), "signal {signal}: left behind {left:?}");
    }
}

/// A data file that is a symbolic link out of its root is refused, and nothing of the file
/// it points to reaches the report.
#[test]
fn a_symlink_out_of_the_data_root_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("secret.txt");
    std::fs::write(&outside, "SECRET-CONTENT do not show\n").unwrap();
    let root = d.path().join("upstream");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("tokenizer.json")).unwrap();
    let cases = d.path().join("cases/tokenizer");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::write(
        cases.join("t.yaml"),
        "family: tokenizer\ncases:\n  - name: linked\n    tokenizer: upstream:tokenizer.json\n    texts: [a]\n    ids: [[1]]\n    markup: false\n    check: ids\n",
    )
    .unwrap();
    let out = certify(&[
        "--verbose",
        "--cases",
        d.path().join("cases").to_str().unwrap(),
        "--upstream",
        root.to_str().unwrap(),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("outside"), "{text}");
    assert!(!text.contains("SECRET-CONTENT"), "{text}");
}

/// What is still in `dir` once the cleaner of an ended harness has had up to 10 s to remove
/// its scratch directories (it runs after the harness is gone).
fn left_behind(dir: &Path) -> Vec<std::ffi::OsString> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        if left.is_empty() || std::time::Instant::now() > until {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
