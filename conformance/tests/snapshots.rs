//! insta snapshots of human-readable outputs, kept in goldens/snapshots/ (the snapshot header
//! names this test as its provenance; `ds41 goldens check` requires that header). Update with
//! `INSTA_UPDATE=always cargo test -p ds41-conformance --test snapshots` and review the diff.

use std::process::Command;

fn ds41(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run ds41");
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
fn inspect_release_config() {
    let Some(upstream) = ds41_conformance::goldens::upstream_from_env() else {
        eprintln!("SKIPPED: DS41_UPSTREAM not set");
        return;
    };
    let config = upstream.join("config/config.json");
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
