//! `ds41 certify` and `ds41 verify-certificate` end to end through the binary: a certificate
//! from a real run verifies; every kind of tampering (a result changed, a case removed, the
//! case-list hash or a checkpoint hash altered — with or without recomputing the digest) is
//! refused with exit code 1 and a finding naming what is wrong.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ds41_conformance::report::certificate::Certificate;
use ds41_engine::trace::TraceFile;

fn ds41(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .env_remove("DS41_UPSTREAM")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One real certify run (two fast cases on a generated tiny checkpoint), shared by the tests.
fn certified() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let report = tmp.path().join("report");
        let (code, out, err) = ds41(&[
            "certify",
            "--exact",
            "--filter",
            "loader::synthetic::tiny-release-loads",
            "--filter",
            "residual::synthetic::tiny-release-exact-owner-prefill",
            "--report",
            report.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "certify failed:\n{out}\n{err}");
        (tmp, report)
    })
    .1
}

/// A copy of the certified report directory whose certificate is edited by `edit`; with
/// `redigest` the digest is recomputed so only the deeper checks can notice.
fn tampered(name: &str, redigest: bool, edit: impl FnOnce(&mut Certificate)) -> PathBuf {
    let src = certified();
    let dir = src.with_file_name(format!("tampered-{name}-{redigest}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("report.json"), dir.join("report.json")).unwrap();
    let mut cert: Certificate =
        serde_json::from_slice(&std::fs::read(src.join("certificate.json")).unwrap()).unwrap();
    edit(&mut cert);
    if redigest {
        cert.digest = cert.compute_digest();
    }
    let path = dir.join("certificate.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&cert).unwrap()).unwrap();
    path
}

fn verify(cert: &Path) -> (i32, String) {
    let (code, out, err) = ds41(&["verify-certificate", cert.to_str().unwrap()]);
    (code, format!("{out}{err}"))
}

/// Exit 1, INVALID, and each `(check, words)` reported BAD with those words in its line.
fn assert_refused(cert: &Path, bad: &[(&str, &str)]) {
    let (code, out) = verify(cert);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("INVALID"), "{out}");
    for (check, words) in bad {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("BAD") && l.contains(check))
            .unwrap_or_else(|| panic!("no BAD `{check}` finding:\n{out}"));
        assert!(
            line.contains(words),
            "`{check}` should mention {words:?}: {line}\n{out}"
        );
    }
}

#[test]
fn a_real_certificate_verifies() {
    let cert = certified().join("certificate.json");
    let (code, out) = verify(&cert);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("VALID") && !out.contains("BAD"), "{out}");
    assert!(out.contains("CONFORMANT"), "{out}");
    let c: Certificate = serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    assert_eq!(c.results.len(), 2);
    assert!(
        c.checkpoints
            .iter()
            .any(|k| k.model.contains("tiny") && !k.files.is_empty()),
        "{:?}",
        c.checkpoints
    );
}

#[test]
fn a_changed_result_is_refused() {
    let edit = |c: &mut Certificate| c.results[1].status = "FAIL".into();
    assert_refused(
        &tampered("result", false, edit),
        &[("digest", "certificate says")],
    );
    assert_refused(
        &tampered("result", true, edit),
        &[
            ("summary", "1 fail"),
            ("verdict", "non-conformant"),
            ("report results", "report PASS, certificate FAIL"),
        ],
    );
}

#[test]
fn a_removed_case_is_refused() {
    let edit = |c: &mut Certificate| {
        c.results.remove(0);
    };
    assert_refused(
        &tampered("removed", false, edit),
        &[("digest", "hashes to")],
    );
    assert_refused(
        &tampered("removed", true, edit),
        &[
            ("summary", "1 results"),
            ("case list", "current suite"),
            ("report results", "not in the certificate"),
        ],
    );
}

#[test]
fn an_altered_case_list_hash_is_refused() {
    let edit = |c: &mut Certificate| c.case_list_hash = "0".repeat(64);
    assert_refused(&tampered("cases", false, edit), &[("digest", "hashes to")]);
    assert_refused(
        &tampered("cases", true, edit),
        &[
            ("case list", "current suite"),
            ("report header", "case_list_hash"),
        ],
    );
}

#[test]
fn an_altered_checkpoint_hash_is_refused() {
    let edit = |c: &mut Certificate| {
        let f = &mut c.checkpoints[0].files[0].1;
        *f = f.chars().rev().collect();
    };
    assert_refused(
        &tampered("checkpoint", false, edit),
        &[("digest", "hashes to")],
    );
    assert_refused(
        &tampered("checkpoint", true, edit),
        &[("report header", "checkpoint hashes")],
    );
}

#[test]
fn an_edited_report_is_refused() {
    let src = certified();
    let dir = src.with_file_name("tampered-report");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("certificate.json"), dir.join("certificate.json")).unwrap();
    let text = std::fs::read_to_string(src.join("report.json")).unwrap();
    std::fs::write(
        dir.join("report.json"),
        text.replacen("\"pass\"", "\"fail\"", 1),
    )
    .unwrap();
    assert_refused(&dir.join("certificate.json"), &[("report", "sha256")]);
}

fn xfail_list(dir: &Path, case: &str) -> PathBuf {
    let p = dir.join(format!("xfail-{}.yaml", case.replace(':', "_")));
    std::fs::write(
        &p,
        format!("engine: ds41-reference\nentries:\n  - case: {case}\n    reason: constructed for the test\n"),
    )
    .unwrap();
    p
}

#[test]
fn an_expected_failure_that_passes_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let case = "loader::synthetic::tiny-release-loads";
    let list = xfail_list(tmp.path(), case);
    let (code, out, err) = ds41(&[
        "certify",
        "--exact",
        "--filter",
        case,
        "--verbose",
        "--expected-failures",
        list.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}\n{err}");
    let all = format!("{out}{err}");
    assert!(
        all.contains("but it passed: remove it from the expected-failure list"),
        "{all}"
    );
}

#[test]
fn an_expected_failure_that_fails_is_waived_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let failing = "residual::synthetic::tiny-release-exact-owner-prefill";
    let list = xfail_list(tmp.path(), failing);
    let (code, out, err) = ds41(&[
        "certify",
        "--exact",
        "--filter",
        failing,
        "--filter",
        "loader::synthetic::tiny-release-loads",
        "--defect",
        "no-attention-sink",
        "--verbose",
        "--expected-failures",
        list.to_str().unwrap(),
    ]);
    let all = format!("{out}{err}");
    assert_eq!(
        code, 0,
        "a waived failure plus a pass is conformant:\n{all}"
    );
    assert!(
        all.contains("WAIVED") && all.contains("constructed for the test"),
        "{all}"
    );
}

#[test]
fn an_expected_failure_naming_no_case_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let list = xfail_list(tmp.path(), "loader::synthetic::no-such-case");
    let (code, out, err) = ds41(&[
        "certify",
        "--filter",
        "loader::synthetic::tiny-release-loads",
        "--expected-failures",
        list.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("no-such-case") && err.contains("does not exist"),
        "{err}"
    );
}

/// `ds41 ... | head` ends quietly: no panic, no error message, the conventional SIGPIPE status.
#[test]
fn a_closed_output_pipe_ends_the_process_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // Far more than a pipe buffer holds, so the writer must see the reader go away.
    {
        let args = ["corpus", "--wide", "50000"];
        let mut child = Command::new(env!("CARGO_BIN_EXE_ds41"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        drop(out);
        let done = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&done.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
        assert_eq!(done.status.code(), Some(141), "{args:?}: {:?}", done.status);
    }
}

/// `ds41 forward` twice on the same input writes byte-identical trace files (sorted header),
/// so traces can be pinned by sha256.
#[test]
fn forward_traces_are_byte_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    let (code, _, err) = ds41(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "release",
        "--out",
        model.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let run = |name: &str| {
        let out = tmp.path().join(name);
        let (code, _, err) = ds41(&[
            "forward",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            "5,17,200,3,99",
            "--prefill",
            "2",
            "--sub-ops",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        std::fs::read(out).unwrap()
    };
    let (a, b) = (run("a.safetensors"), run("b.safetensors"));
    assert!(a.len() > 1000);
    assert!(a == b, "two runs wrote different bytes");
}

/// The digest is not a signature: an edited capability list with a recomputed digest is
/// caught against report.json, naming what differs.
#[test]
fn an_edited_capability_list_is_refused() {
    let edit = |c: &mut Certificate| c.capabilities.push("trace.everything".into());
    assert_refused(
        &tampered("capabilities", true, edit),
        &[(
            "report header",
            "capabilities (report only [], certificate only [\"trace.everything\"])",
        )],
    );
}

#[test]
fn an_edited_summary_names_the_counts_that_differ() {
    let edit = |c: &mut Certificate| {
        c.summary.pass += 1;
        c.summary.total += 1;
    };
    assert_refused(
        &tampered("summary", true, edit),
        &[
            ("summary", "pass: results 2, summary 3"),
            ("report header", "pass: report 2, certificate 3"),
        ],
    );
}

/// A field the digest does not cover is refused, not ignored.
#[test]
fn an_unknown_field_is_refused() {
    let src = certified();
    let dir = src.with_file_name("tampered-unknown-field");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("report.json"), dir.join("report.json")).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("certificate.json")).unwrap()).unwrap();
    v["reviewed_by"] = "someone".into();
    let path = dir.join("certificate.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    assert_refused(&path, &[("fields", "reviewed_by")]);
}

/// Without its report.json a certificate is not VALID, unless asked to be checked alone.
#[test]
fn a_certificate_without_its_report_needs_an_explicit_flag() {
    let src = certified();
    let dir = src.with_file_name("alone");
    std::fs::create_dir_all(&dir).unwrap();
    let cert = dir.join("certificate.json");
    std::fs::copy(src.join("certificate.json"), &cert).unwrap();
    assert_refused(&cert, &[("report", "--no-report")]);
    let (code, out, err) = ds41(&["verify-certificate", cert.to_str().unwrap(), "--no-report"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("VALID") && out.contains("not checked"),
        "{out}"
    );
}

/// The expected-failure list a run applied is pinned in report and certificate by sha256.
#[test]
fn the_expected_failure_list_used_is_recorded_with_its_sha256() {
    let tmp = tempfile::tempdir().unwrap();
    let failing = "residual::synthetic::tiny-release-exact-owner-prefill";
    let list = xfail_list(tmp.path(), failing);
    let report = tmp.path().join("report");
    let (code, out, err) = ds41(&[
        "certify",
        "--exact",
        "--filter",
        failing,
        "--filter",
        "loader::synthetic::tiny-release-loads",
        "--defect",
        "no-attention-sink",
        "--expected-failures",
        list.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let cert: Certificate =
        serde_json::from_slice(&std::fs::read(report.join("certificate.json")).unwrap()).unwrap();
    let x = cert.expected_failures.expect("the list is recorded");
    let sha = ds41_conformance::report::sha256_file(&list).unwrap();
    assert_eq!((x.sha256.as_str(), x.entries), (sha.as_str(), 1));
    let (code, out, _) = ds41(&[
        "verify-certificate",
        report.join("certificate.json").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
}

/// `certify --help` names only flags that exist.
#[test]
fn certify_help_names_only_existing_flags() {
    let (code, help, _) = ds41(&["certify", "--help"]);
    assert_eq!(code, 0);
    for flag in help
        .split(|c: char| c.is_whitespace() || "(),;`'".contains(c))
        .filter(|w| w.starts_with("--") && w.len() > 2)
    {
        let flag = flag.trim_end_matches(['.', ':']);
        let (code, _, err) = ds41(&["certify", flag, "--help"]);
        assert!(
            !err.contains("unexpected argument"),
            "`certify --help` names {flag}, which does not exist (exit {code}): {err}"
        );
    }
    let (code, out, err) = ds41(&["certify", "--list-defects"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == "no-attention-sink"), "{out}");
}

/// A case directory holding one residual case against the official golden
/// `tiny_s1/p01_d19_as-shipped` (made with prefill 1 over 20 tokens), with `prefill` as given
/// (absent when None).
fn tiny_s1_case(dir: &Path, prefill: Option<usize>) -> PathBuf {
    let cases = dir.join("cases/residual");
    std::fs::create_dir_all(&cases).unwrap();
    let prefill = prefill.map_or(String::new(), |p| format!("    prefill: {p}\n"));
    std::fs::write(
        cases.join("schedule.yaml"),
        format!(
            "family: residual\ncases:\n  - name: tiny-s1-d19\n    model: synthetic:tiny/release@1\n    \
             golden: {{file: repo:goldens/official/tiny_s1/p01_d19_as-shipped.safetensors}}\n{prefill}    \
             numerics: upstream\n    index_k: as-shipped\n    require: [logits, residual, experts, topk]\n"
        ),
    )
    .unwrap();
    dir.join("cases")
}

#[test]
fn a_case_runs_its_goldens_schedule_and_a_prefill_past_its_tokens_is_a_case_error() {
    let tmp = tempfile::tempdir().unwrap();
    let certify = |prefill: Option<usize>| {
        let dir = tmp.path().join(format!("{prefill:?}"));
        let cases = tiny_s1_case(&dir, prefill);
        ds41(&["certify", "--cases", cases.to_str().unwrap(), "--verbose"])
    };
    // No prefill in the case: the golden's own (metadata `prefill` = 1), which passes.
    let (code, out, err) = certify(None);
    assert_eq!(code, 0, "{out}\n{err}");
    // Beyond the 20 tokens: an error of the case, not a verdict on the engine.
    let (code, out, err) = certify(Some(21));
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("field `prefill`: 21 is not inside 1..=20"),
        "{out}\n{err}"
    );
    // Another schedule than the golden's is run as asked, and said.
    let (_, out, err) = certify(Some(20));
    assert!(
        format!("{out}{err}").contains("the golden was made with prefill 1"),
        "{out}\n{err}"
    );
}

/// The repository golden `rel`, edited, written as `out`.
fn doctored_golden(rel: &str, out: &Path, edit: fn(&mut TraceFile)) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut golden = TraceFile::read(&repo.join(rel)).unwrap();
    edit(&mut golden);
    golden.write(out).unwrap();
}

#[test]
fn goldens_whose_schedule_or_rows_do_not_fit_their_tokens_are_errors_of_the_golden() {
    const TINY: &str = "goldens/official/tiny_s1/p01_d19_as-shipped.safetensors";
    const TINY_CASE: &str = "model: synthetic:tiny/release@1\n    index_k: as-shipped\n    \
                             require: [logits]\n    golden: {file: upstream:";
    const DSPARK: &str = "goldens/official/dspark_s6/dspark_p09_d15.safetensors";
    const DSPARK_CASE: &str = "model: synthetic:dspark/release@6\n    golden: upstream:";
    fn states_prefill(g: &mut TraceFile, p: &str) {
        g.metadata.insert("prefill".into(), p.into());
    }
    fn first_rows(g: &mut TraceFile, name: &str, rows: usize) {
        let kept = g.tensors[name].select_rows(&(0..rows).collect::<Vec<_>>());
        g.tensors.insert(name.into(), kept);
    }
    /// A golden made wrong, the case using it and what the error must say.
    struct Doctored {
        name: &'static str,
        family: &'static str,
        golden: &'static str,
        edit: fn(&mut TraceFile),
        /// The case's fields up to its golden file's name.
        case: &'static str,
        says: &'static str,
    }
    let doctored = [
        Doctored {
            name: "prefill",
            family: "residual",
            golden: TINY,
            edit: |g| states_prefill(g, "21"),
            case: TINY_CASE,
            says: "the golden's metadata `prefill`: 21 is not inside 1..=20",
        },
        Doctored {
            name: "rows",
            family: "residual",
            golden: TINY,
            edit: |g| first_rows(g, "topk.L1", 19),
            case: TINY_CASE,
            says: "`topk.L1` has shape [19, 8], but the trace has 20 positions",
        },
        Doctored {
            name: "logits",
            family: "residual",
            golden: TINY,
            edit: |g| first_rows(g, "logits", 19),
            case: TINY_CASE,
            says: "`logits` has 19 rows, `logits_positions` names 20",
        },
        Doctored {
            name: "prefill",
            family: "dspark",
            golden: DSPARK,
            edit: |g| states_prefill(g, "0"),
            case: DSPARK_CASE,
            says: "the golden's metadata `prefill`: 0 is not inside 1..=",
        },
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (data, cases) = (tmp.path().join("data"), tmp.path().join("cases"));
    std::fs::create_dir_all(&data).unwrap();
    for d in &doctored {
        let (name, family, case) = (d.name, d.family, d.case);
        let file = format!("{name}-{family}.safetensors");
        doctored_golden(d.golden, &data.join(&file), d.edit);
        let close = if family == "residual" { "}" } else { "" };
        std::fs::create_dir_all(cases.join(family)).unwrap();
        std::fs::write(
            cases.join(format!("{family}/{name}.yaml")),
            format!(
                "family: {family}\ncases:\n  - name: {name}\n    {case}{file}{close}\n    \
                 numerics: upstream\n"
            ),
        )
        .unwrap();
    }
    let (code, out, err) = ds41(&[
        "certify",
        "--cases",
        cases.to_str().unwrap(),
        "--upstream",
        data.to_str().unwrap(),
    ]);
    let all = format!("{out}{err}");
    assert_eq!(code, 2, "{all}");
    for d in &doctored {
        assert!(all.contains(d.says), "{} {}: {all}", d.family, d.name);
    }
    assert_eq!(all.matches("ERROR  ").count(), doctored.len(), "{all}");
}
