//! Where `ds41 certify` finds its data, end to end through the binary: the built-in cases,
//! gates and goldens from any directory (an installed copy of the binary, run elsewhere); a
//! release snapshot from `--release`, whose files are checked against their pins; and, without
//! one, only the cases reading release files skipped, each saying where to point `--release`.
//! The real `cargo install` from a copy of the source tree that is deleted before the run is
//! the long tier (`installed_from_a_deleted_checkout_certifies`).

use std::path::Path;
use std::process::Command;

/// Run `bin args` in `cwd` with no external data configured. A freshly copied binary can be
/// "busy" for a moment: a process another test thread forks while the copy is open for
/// writing holds that descriptor until it execs, so the run is retried briefly.
fn run(bin: &Path, cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let mut tries = 0;
    let out = loop {
        let r = Command::new(bin)
            .args(args)
            .current_dir(cwd)
            .env_remove("DS41_UPSTREAM")
            .env_remove("DS41_RELEASE")
            .env("HF_HUB_CACHE", cwd.join("no-hub-cache"))
            .output();
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.expect("run ds41"),
        }
    };
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary copied out of the build tree, as `cargo install` would place it.
fn installed_copy(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join("bin/ds41");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_ds41"), &bin).unwrap();
    bin
}

#[test]
fn a_copied_binary_certifies_from_another_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = installed_copy(tmp.path());
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // A repo: golden (goldens/traces), a repo: DSML directory and a synthetic case.
    let (code, out, err) = run(
        &bin,
        &elsewhere,
        &[
            "certify",
            "--exact",
            "--filter",
            "residual::goldens::tiny-release-p24-d00-exact-as-shipped",
            "--filter",
            "dsml::goldens::project-goldens",
            "--filter",
            "loader::synthetic::tiny-release-loads",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("CONFORMANT") && !out.contains("NON-CONFORMANT"),
        "{out}"
    );
    // The listing comes from the built-in cases too.
    let (code, list, err) = run(&bin, &elsewhere, &["certify", "--list"]);
    assert_eq!(code, 0, "{err}");
    assert!(list.lines().count() > 50, "{list}");
    assert!(
        list.contains("tokenizer::release::wide-corpus-seed11-n20000"),
        "{list}"
    );
}

#[test]
fn without_a_snapshot_only_release_cases_are_skipped_and_say_where_to_point() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, out, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ds41")),
        tmp.path(),
        &[
            "certify",
            "--verbose",
            "--filter",
            "tokenizer::release::control-literals-stay-text",
            "--filter",
            "dsml::official::official-2",
            "--filter",
            "loader::synthetic::tiny-release-loads",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("release snapshot: none found (2 case(s) reading release files are skipped"),
        "{err}"
    );
    let skipped: Vec<&str> = err.lines().filter(|l| l.contains("SKIPPED")).collect();
    assert_eq!(skipped.len(), 2, "{err}");
    assert!(
        err.contains("point --release DIR or DS41_RELEASE at a snapshot directory"),
        "{err}"
    );
    assert!(err.contains("PASS") && err.contains("loader::synthetic::tiny-release-loads"));
}

/// The external official_a set is opt-in: without --upstream its cases are not part of the
/// run (not listed, not counted as skipped); --upstream DIR adds them.
#[test]
fn the_external_set_joins_the_run_only_with_upstream() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_ds41"));
    let (code, list, err) = run(bin, tmp.path(), &["certify", "--list"]);
    assert_eq!(code, 0, "{err}");
    assert!(!list.contains("official_a"), "{list}");
    assert!(list.contains("residual::official_tiny_s1::"), "{list}");
    let (code, _, err) = run(bin, tmp.path(), &["certify", "--filter", "::official_a::"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("external case(s) need --upstream DIR"),
        "{err}"
    );
    let upstream = tmp.path().to_str().unwrap();
    let (code, list, err) = run(
        bin,
        tmp.path(),
        &["certify", "--upstream", upstream, "--list"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(list.contains("residual::official_a::"), "{list}");
    assert!(
        list.contains("loader::official_a::official-a-release-loads"),
        "{list}"
    );
}

#[test]
fn a_snapshot_with_a_wrong_file_is_an_error_naming_the_file_and_the_pins() {
    let tmp = tempfile::tempdir().unwrap();
    let snap = tmp.path().join("snapshot");
    std::fs::create_dir_all(&snap).unwrap();
    // A tokenizer.json that is not the release's (any other tokenizer).
    std::fs::write(snap.join("tokenizer.json"), b"{\"added_tokens\": []}\n").unwrap();
    let (code, out, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ds41")),
        tmp.path(),
        &[
            "certify",
            "--verbose",
            "--release",
            snap.to_str().unwrap(),
            "--filter",
            "tokenizer::release::control-literals-stay-text",
        ],
    );
    assert_eq!(code, 2, "a harness/configuration error: {out}\n{err}");
    assert!(
        err.contains("release:tokenizer.json")
            && err.contains("c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b")
            && err.contains("another model or revision"),
        "{err}"
    );
    let (code, _, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ds41")),
        tmp.path(),
        &["certify", "--release", "/nonexistent/snapshot", "--list"],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("--release /nonexistent/snapshot: not a directory"),
        "{err}"
    );
}

/// With the release snapshot (CI: ../shared/release), the release cases run and pass.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn with_the_release_snapshot_the_release_cases_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let release = ds41_engine::testing::release();
    let (code, out, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ds41")),
        tmp.path(),
        &[
            "certify",
            "--release",
            release.to_str().unwrap(),
            "--filter",
            "tokenizer::release::",
            "--filter",
            "dsml::official::",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!err.contains("SKIPPED"), "{err}");
}

/// The real thing: `cargo install` from a copy of the source tree, the copy deleted, then
/// `ds41 certify` (every case of the default tier) from an unrelated directory.
#[test]
#[cfg_attr(
    not(ds41_long),
    ignore = "long tier: set DS41_LONG=1 (builds the workspace into a fresh install root)"
)]
fn installed_from_a_deleted_checkout_certifies() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checkout = tmp.path().join("checkout");
    // The tracked files plus the working tree's changes: what a clone at this state holds.
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(&repo)
        .output()
        .expect("git ls-files");
    assert!(listed.status.success());
    for rel in listed.stdout.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let rel = std::str::from_utf8(rel).unwrap();
        let (from, to) = (repo.join(rel), checkout.join(rel));
        if from.is_file() {
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&from, &to).unwrap();
        }
    }
    let root = tmp.path().join("root");
    // Its own target directory: the running `cargo test` may hold the lock of the usual one.
    let target = std::env::var_os("DS41_INSTALL_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().join("target"));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["install", "--locked", "--path"])
        .arg(checkout.join("conformance"))
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo install");
    assert!(status.success(), "cargo install failed");
    std::fs::remove_dir_all(&checkout).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let (code, out, err) = run(&root.join("bin/ds41"), &elsewhere, &["certify"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("VERDICT: CONFORMANT"), "{out}");
}

/// The wide-digest check fails, naming the chunk, when one chunk's ids differ (here: the
/// committed digest with one chunk's hash altered, given as an external set).
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn a_wrong_chunk_of_the_wide_digest_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut digest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo.join("goldens/tokenizer/wide_seed11_n20000.digest.json")).unwrap(),
    )
    .unwrap();
    digest["chunks"][7]["ids_sha256"] = "0".repeat(64).into();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("digest.json"), digest.to_string()).unwrap();
    let cases = tmp.path().join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    std::fs::write(
        cases.join("wide.yaml"),
        "family: tokenizer\ncases:\n  - name: doctored\n    tokenizer: release:tokenizer.json\n    wide_digest: upstream:digest.json\n    markup: true\n    check: ids\n",
    )
    .unwrap();
    let release = ds41_engine::testing::release();
    let (code, out, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ds41")),
        tmp.path(),
        &[
            "certify",
            "--cases",
            cases.to_str().unwrap(),
            "--release",
            release.to_str().unwrap(),
            "--upstream",
            data.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("ids differ in 1 of 24 chunks of 1000 strings (starting at [7000])"),
        "{err}"
    );
}
