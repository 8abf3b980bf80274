//! The committed goldens pass `goldens check`, and the check is proven to fail: flipping one
//! byte of any golden, or of a repository input, in a temporary copy makes it fail with that
//! file named.

use std::path::{Path, PathBuf};

use ds41_conformance::goldens::check::list_files;
use ds41_conformance::goldens::{check, upstream_from_env, CheckOptions, Report, Status};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("conformance/ has a parent")
        .to_path_buf()
}

fn options(root: &Path) -> CheckOptions {
    CheckOptions {
        repo_root: root.to_path_buf(),
        goldens_dir: None,
        upstream: upstream_from_env(),
        release: ds41_conformance::goldens::release_snapshot_dir().unwrap(),
        deep: false,
        ds41: PathBuf::from(env!("CARGO_BIN_EXE_ds41")),
    }
}

fn failures(report: &Report) -> Vec<String> {
    report.failures().map(|f| f.to_string()).collect()
}

fn copy_tree(from: &Path, to: &Path) {
    for rel in list_files(from).unwrap() {
        let dst = to.join(&rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), dst).unwrap();
    }
}

/// A temporary repository holding a copy of goldens/ (inputs recorded as `repo` live there).
fn temp_repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&repo_root().join("goldens"), &tmp.path().join("goldens"));
    tmp
}

fn flip_first_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    assert!(!bytes.is_empty(), "{} is empty", path.display());
    bytes[0] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// Everything the repository alone can verify (and, with them, upstream data and a release
/// snapshot). The checks that need that data are proven to run by the two tests below, which
/// are reported as ignored without it instead of counting its skipped checks as passed.
#[test]
fn committed_goldens_pass_check() {
    let report = check(&options(&repo_root())).unwrap();
    assert!(report.goldens > 0, "no goldens found");
    assert_eq!(failures(&report), Vec::<String>::new());
    assert!(report.count(Status::Ok) > 0);
}

/// Findings skipped for want of the data whose missing-data message contains `marker`.
fn skipped_for(report: &Report, marker: &str) -> usize {
    report
        .findings
        .iter()
        .filter(|f| f.status == Status::Skip && f.message.contains(marker))
        .count()
}

/// With the data (`opts`) every check skipped without it (`without`) runs and passes: the
/// skips disappear and nothing fails. Returns the Ok counts with and without the data.
fn the_data_verifies_what_its_absence_skips(
    opts: CheckOptions,
    without: CheckOptions,
    marker: &str,
) -> (usize, usize) {
    let (with_data, without_data) = (check(&opts).unwrap(), check(&without).unwrap());
    assert!(
        skipped_for(&without_data, marker) > 0,
        "nothing depends on this data ({marker}): the test proves nothing"
    );
    assert_eq!(failures(&with_data), Vec::<String>::new());
    assert_eq!(skipped_for(&with_data, marker), 0);
    (with_data.count(Status::Ok), without_data.count(Status::Ok))
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn goldens_upstream_references_verify() {
    let opts = options(&repo_root());
    let without = CheckOptions {
        upstream: None,
        ..options(&repo_root())
    };
    // The errata's upstream references only have to exist (a missing one is a Fail).
    the_data_verifies_what_its_absence_skips(opts, without, "DS41_UPSTREAM not set");
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a release snapshot)"
)]
fn goldens_release_inputs_verify() {
    let opts = options(&repo_root());
    assert!(opts.release.is_some(), "DS41_RELEASE names no snapshot");
    let without = CheckOptions {
        release: None,
        ..options(&repo_root())
    };
    let (with_data, without_data) =
        the_data_verifies_what_its_absence_skips(opts, without, "no release snapshot");
    assert!(with_data > without_data, "no release input was verified");
}

#[test]
fn reference_engine_goldens_reproduce() {
    // Re-runs `ds41 synth` + `ds41 forward` for every reference-engine golden: a change in the
    // engine's output fails here until the goldens are reviewed and blessed.
    let opts = options(&repo_root());
    let mut report = Report::default();
    ds41_conformance::goldens::check::rerun_reference(&opts, &mut report).unwrap();
    assert!(
        report.count(Status::Ok) > 0,
        "no reference-engine golden re-ran"
    );
    assert_eq!(failures(&report), Vec::<String>::new());
}

#[test]
fn flipping_a_byte_of_any_golden_fails_naming_it() {
    let goldens: Vec<String> = list_files(&repo_root().join("goldens"))
        .unwrap()
        .into_iter()
        .filter(|r| !r.starts_with("regen/") && !r.ends_with(".md") && !r.ends_with(".yaml"))
        .filter(|r| !r.ends_with(".provenance.json") && !r.ends_with(".snap"))
        .collect();
    assert!(!goldens.is_empty());
    // Every golden damaged at once, one check: each must be reported on its own (one copy
    // and one check instead of one per golden keeps this fast as goldens/ grows).
    let tmp = temp_repo();
    for rel in &goldens {
        flip_first_byte(&tmp.path().join("goldens").join(rel));
    }
    let report = check(&options(tmp.path())).unwrap();
    let fails = failures(&report);
    for rel in &goldens {
        assert!(
            fails
                .iter()
                .any(|f| f.contains(rel.as_str()) && f.contains("sha256 mismatch")),
            "flipping a byte of {rel} was not reported: {fails:?}"
        );
    }
}

#[test]
fn changing_a_repo_input_fails_naming_the_input() {
    let tmp = temp_repo();
    let corpus = tmp.path().join("goldens/tokenizer/curated_corpus.jsonl");
    // Rewrite the corpus and its own hand-written record consistently: only the record that
    // uses it as an input may fail.
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    text.push_str("{\"text\": \"extra\", \"why\": \"test\"}\n");
    std::fs::write(&corpus, text).unwrap();
    let report = check(&options(tmp.path())).unwrap();
    let fails = failures(&report);
    assert!(
        fails.iter().any(
            |f| f.contains("curated_ids.jsonl.provenance.json") && f.contains("input `corpus`")
        ),
        "{fails:?}"
    );
}

#[test]
fn a_golden_without_provenance_fails() {
    let tmp = temp_repo();
    std::fs::write(tmp.path().join("goldens/tokenizer/stray.json"), "{}").unwrap();
    std::fs::remove_file(
        tmp.path()
            .join("goldens/tokenizer/curated_ids.jsonl.provenance.json"),
    )
    .unwrap();
    let fails = failures(&check(&options(tmp.path())).unwrap());
    for name in ["stray.json", "curated_ids.jsonl"] {
        assert!(
            fails
                .iter()
                .any(|f| f.contains(name) && f.contains("no provenance record")),
            "{name}: {fails:?}"
        );
    }
}

#[test]
fn a_broken_record_fails_naming_the_field() {
    let tmp = temp_repo();
    let sidecar = tmp
        .path()
        .join("goldens/tokenizer/curated_ids.jsonl.provenance.json");
    let text = std::fs::read_to_string(&sidecar)
        .unwrap()
        .replace("{input:corpus}", "{input:korpus}");
    std::fs::write(&sidecar, text).unwrap();
    let fails = failures(&check(&options(tmp.path())).unwrap());
    assert!(
        fails
            .iter()
            .any(|f| f.contains("curated_ids.jsonl.provenance.json") && f.contains("`command`")),
        "{fails:?}"
    );
}

mod bless {
    use super::*;
    use ds41_conformance::goldens::bless::{bless, BlessOptions};
    use ds41_conformance::goldens::diff::Change;

    /// A temporary repository with one reference-engine record whose "engine" is `printf`, and
    /// a generated input standing in for a `ds41 synth` checkpoint.
    fn fixture(value: &str) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("goldens/traces");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.txt"), "old\n").unwrap();
        let record = serde_json::json!({
            "schema": "ds41-golden-provenance/1",
            "description": "test record",
            "generator": {"kind": "reference-engine", "name": "ds41-reference", "version": "0"},
            "command": format!("cat {{input:model}}/w.bin > /dev/null && printf '{value}\\n' > {{out}}/t.txt"),
            "synthetic": {"preset": "tiny", "seed": 1},
            "inputs": [{"name": "model", "location": "generated", "path": "tiny-seed1",
                        "sha256": "0".repeat(64), "command": "printf weights > {out}/w.bin"}],
            "outputs": [{"path": "t.txt", "sha256": null}],
        });
        std::fs::write(
            dir.join("t.txt.provenance.json"),
            serde_json::to_string_pretty(&record).unwrap(),
        )
        .unwrap();
        tmp
    }

    fn options(root: &Path, ci: bool, dry_run: bool) -> BlessOptions {
        BlessOptions {
            repo_root: root.to_path_buf(),
            goldens_dir: None,
            upstream: None,
            ds41: PathBuf::from(env!("CARGO_BIN_EXE_ds41")),
            filter: None,
            dry_run,
            ci,
        }
    }

    #[test]
    fn refuses_under_ci() {
        let tmp = fixture("new");
        let err = bless(&options(tmp.path(), true, false)).unwrap_err();
        assert!(err.to_string().contains("CI is set"), "{err}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("goldens/traces/t.txt")).unwrap(),
            "old\n"
        );
    }

    #[test]
    fn regenerates_reports_the_change_and_then_checks_clean() {
        let tmp = fixture("new");
        let before = check(&super::options(tmp.path())).unwrap();
        assert!(failures(&before)
            .iter()
            .any(|f| f.contains("never blessed")));

        let dry = bless(&options(tmp.path(), false, true)).unwrap();
        assert!(matches!(
            dry[0].outputs[0].1,
            Change::Text { differing: 1, .. }
        ));
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("goldens/traces/t.txt")).unwrap(),
            "old\n",
            "dry run wrote"
        );

        let done = bless(&options(tmp.path(), false, false)).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].record_changed);
        assert_eq!(
            done[0].inputs_changed.len(),
            1,
            "generated input hash recorded"
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("goldens/traces/t.txt")).unwrap(),
            "new\n"
        );
        let mut deep = super::options(tmp.path());
        deep.deep = true;
        let report = check(&deep).unwrap();
        assert_eq!(failures(&report), Vec::<String>::new());
        assert!(report
            .findings
            .iter()
            .any(|f| f.status == Status::Ok && f.message.contains("input `model`")));

        // Blessing again changes nothing.
        let again = bless(&options(tmp.path(), false, false)).unwrap();
        assert_eq!(again[0].outputs[0].1, Change::Identical);
        assert!(!again[0].record_changed);

        // The engine "changes" (same recorded hashes, different output): the re-run check
        // fails naming the golden, and a dry run is allowed under CI.
        let side = tmp.path().join("goldens/traces/t.txt.provenance.json");
        let text = std::fs::read_to_string(&side)
            .unwrap()
            .replace("printf 'new", "printf 'newer");
        std::fs::write(&side, text).unwrap();
        assert!(failures(&check(&super::options(tmp.path())).unwrap()).is_empty());
        let mut report = Report::default();
        ds41_conformance::goldens::check::rerun_reference(&super::options(tmp.path()), &mut report)
            .unwrap();
        let fails = failures(&report);
        assert!(
            fails
                .iter()
                .any(|f| f.contains("t.txt") && f.contains("different result")),
            "{fails:?}"
        );
        assert!(bless(&options(tmp.path(), true, true)).is_ok());
    }

    #[test]
    fn a_failing_generator_is_reported_with_its_stderr() {
        let tmp = fixture("new");
        let side = tmp.path().join("goldens/traces/t.txt.provenance.json");
        let text = std::fs::read_to_string(&side).unwrap().replace(
            "printf weights",
            "echo no-synth >&2; exit 7; printf weights",
        );
        std::fs::write(&side, text).unwrap();
        let err = bless(&options(tmp.path(), false, false))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-synth") && err.contains("t.txt.provenance.json"),
            "{err}"
        );
    }
}

#[test]
fn unreviewed_or_headerless_insta_snapshots_fail() {
    let tmp = temp_repo();
    let snaps = tmp.path().join("goldens/snapshots");
    std::fs::create_dir_all(&snaps).unwrap();
    std::fs::write(snaps.join("a.snap.new"), "---\nsource: x\n---\nv\n").unwrap();
    std::fs::write(snaps.join("b.snap"), "no header\n").unwrap();
    let fails = failures(&check(&options(tmp.path())).unwrap());
    assert!(
        fails
            .iter()
            .any(|f| f.contains("a.snap.new") && f.contains("unreviewed")),
        "{fails:?}"
    );
    assert!(
        fails
            .iter()
            .any(|f| f.contains("b.snap") && f.contains("header")),
        "{fails:?}"
    );
}
