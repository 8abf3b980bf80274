//! The WASTE command profile (`profiles/waste-test-forward.yaml`) end to end through
//! `ds41 certify --engine PROFILE`, without a WASTE binary: a fake `test_forward` (a shell
//! script in `$WASTE_BIN`) emits the documented raw layouts — last-token logits as raw f32,
//! the last token's per-layer streams (WASTE_DUMP_HIDDEN), the route dump (WASTE_DUMP_ROUTE)
//! — cut from the reference's own token-at-a-time trace of the same synthetic checkpoint. A
//! correct fake passes; one answering garbage fails with the reason; one that hangs times out.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_engine::model::{IndexK, Model, Numerics};
use ds41_engine::testing::{options, run_chunks};

const TOKENS: [u32; 12] = [3, 7, 11, 5, 19, 23, 2, 41, 8, 64, 17, 90];

/// `test_forward CONTAINER ids,ids,... out.bin 0` (CONTAINER.md §12.1), imitated: the answer
/// for n tokens was precomputed into $FAKE_DATA/n/.
const FAKE: &str = r#"#!/bin/sh
model=$1; ids=$2; out=$3
[ -f "$model/manifest.json" ] || { echo "test_forward: cannot open container $model" >&2; exit 1; }
n=$(printf '%s' "$ids" | tr ',' '\n' | grep -c .)
case "$FAKE_MODE" in
  hang) exec sleep 60;;
esac
d="$FAKE_DATA/$n"
[ -d "$d" ] || { echo "fake: no data for n=$n in $d" >&2; printf '\000\000\200\077' > "$out"; exit 0; }   # load probe: one float
cp "$d/logits.f32" "$out"
[ -n "$WASTE_DUMP_HIDDEN" ] && cp "$d/hidden.f32" "$WASTE_DUMP_HIDDEN"
# a build dumping every token's streams (the per-token, per-layer hidden dump)
[ "$FAKE_MODE" = per-token ] && cp "$d/hidden_all.f32" "$WASTE_DUMP_HIDDEN"
[ -n "$WASTE_DUMP_ROUTE" ] && cp "$d/route.txt" "$WASTE_DUMP_ROUTE"
# a broken build: the logits file holds its progress text instead of floats
[ "$FAKE_MODE" = garbage ] && echo 'Loading model... 100%' > "$out"
exit 0
"#;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The fake engine's bin directory and precomputed answers, from the reference run
/// token at a time (as WASTE runs, WASTE_CHUNK unset) on synthetic:waste-tiny/container@0.
fn fake_waste(root: &Path) -> PathBuf {
    let model_dir = root.join("model");
    ds41_conformance::synthetic::generate("waste-tiny", "container", 0, &model_dir).unwrap();
    let model = Model::open(&model_dir).unwrap();
    let cfg = model.config().clone();
    // Token at a time, as WASTE runs with WASTE_CHUNK unset.
    let trace = run_chunks(
        &model,
        &TOKENS,
        &[1; TOKENS.len()],
        &options(Numerics::Exact, IndexK::AsShipped),
    );
    let (l, cell, k, v) = (
        cfg.n_layers,
        cfg.hc_mult * cfg.dim,
        trace.topk_experts,
        trace.vocab,
    );
    let data = root.join("data");
    for n in 1..=TOKENS.len() {
        let d = data.join(n.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let row = trace
            .logits_positions
            .iter()
            .position(|&p| p == n as i64 - 1)
            .unwrap();
        std::fs::write(
            d.join("logits.f32"),
            f32_bytes(&trace.logits[row * v..(row + 1) * v]),
        )
        .unwrap();
        let t = n - 1;
        std::fs::write(
            d.join("hidden.f32"),
            f32_bytes(&trace.residual[t * l * cell..(t + 1) * l * cell]),
        )
        .unwrap();
        std::fs::write(
            d.join("hidden_all.f32"),
            f32_bytes(&trace.residual[..n * l * cell]),
        )
        .unwrap();
        let mut route = String::new();
        for pos in 0..n {
            for layer in 0..l {
                let c = (pos * l + layer) * k;
                let ids: Vec<String> = trace.experts[c..c + k]
                    .iter()
                    .map(|x| x.to_string())
                    .collect();
                let ws: Vec<String> = trace.expert_weights[c..c + k]
                    .iter()
                    .map(|x| format!("{x:.6}"))
                    .collect();
                let la = vec!["0"; k];
                route += &format!(
                    "{pos} {layer} {} {} {}\n",
                    ids.join(" "),
                    ws.join(" "),
                    la.join(" ")
                );
            }
        }
        std::fs::write(d.join("route.txt"), route).unwrap();
    }
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("test_forward");
    std::fs::write(&script, FAKE).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// Cases for the profile: the repository's WASTE-shaped residual case (last-token dumps,
/// prefix lengths) plus its load case, with a 5 s timeout.
fn cases(root: &Path) -> PathBuf {
    cases_with_timeout(root, "cases", 5)
}

/// The same cases with a timeout of `timeout_s` seconds (the hanging engine needs no more
/// than one: every request of it hangs), in `root/name`.
fn cases_with_timeout(root: &Path, name: &str, timeout_s: u32) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("residual")).unwrap();
    std::fs::create_dir_all(dir.join("loader")).unwrap();
    std::fs::write(
        dir.join("residual/waste_profile.yaml"),
        format!(
            "family: residual\ncases:\n  - name: waste-tiny-last-token\n    model: synthetic:waste-tiny/container\n    golden: reference\n    tokens: {TOKENS:?}\n    prefill: 1\n    numerics: exact\n    index_k: as-shipped\n    prefix_lengths: [1, 2, 3, 4, 12]\n    require: [logits, residual]\n    timeout_s: {timeout_s}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("loader/waste_profile.yaml"),
        format!("family: loader\ncases:\n  - name: waste-tiny-loads\n    model: synthetic:waste-tiny/container\n    expect: accept\n    timeout_s: {timeout_s}\n"),
    )
    .unwrap();
    dir
}

fn repository_profile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/waste-test-forward.yaml")
}

fn certify(bin: &Path, data: &Path, cases: &Path, mode: &str) -> (i32, String) {
    certify_with(&repository_profile(), bin, data, cases, mode)
}

fn certify_with(
    profile: &Path,
    bin: &Path,
    data: &Path,
    cases: &Path,
    mode: &str,
) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(["certify", "--verbose", "--engine"])
        .arg(profile)
        .arg("--cases")
        .arg(cases)
        .env("WASTE_BIN", bin)
        .env("FAKE_DATA", data)
        .env("FAKE_MODE", mode)
        .env_remove("DS41_UPSTREAM")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn waste_profile_certifies_a_fake_test_forward_and_fails_bad_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let bin = fake_waste(tmp);
    let (data, cases) = (tmp.join("data"), cases(tmp));

    let (code, out) = certify(&bin, &data, &cases, "good");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("PASS          residual::waste_profile::waste-tiny-last-token"),
        "{out}"
    );
    assert!(out.contains("prefix lengths [1, 2, 3, 4, 12]"), "{out}");
    assert!(out.contains("engine waste 0.8.0 (profile:"), "{out}");

    let (code, out) = certify(&bin, &data, &cases, "garbage");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL          residual::waste_profile::waste-tiny-last-token"),
        "{out}"
    );
    assert!(
        out.contains("engine answered garbage") && out.contains("bytes"),
        "{out}"
    );

    let (code, out) = certify(&bin, &data, &cases_with_timeout(tmp, "hang", 1), "hang");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("timed out after 1.0s"), "{out}");
    // the run went on to the next case after the hang
    assert!(out.contains("[2/2]"), "{out}");
}

/// WASTE's `test_forward` with a per-token hidden dump prints the last token's logits next
/// to every token's streams: the logits row it gives is compared at its position, the
/// streams token by token, in one run.
#[test]
fn last_token_logits_next_to_a_per_token_dump_are_matched_by_position() {
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let bin = fake_waste(tmp);
    let (data, cases) = (tmp.join("data"), cases(tmp));
    let text = std::fs::read_to_string(repository_profile())
        .unwrap()
        .replace("layout: last_token_layers_f32", "layout: tokens_layers_f32");
    let profile = tmp.join("per-token.yaml");
    std::fs::write(&profile, text).unwrap();
    let (code, out) = certify_with(&profile, &bin, &data, &cases, "per-token");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("PASS          residual::waste_profile::waste-tiny-last-token"),
        "{out}"
    );
    assert!(
        !out.contains("prefix lengths"),
        "one run, not one per prefix: {out}"
    );
}

/// A profile reading `{env.WASTE_BIN}` without WASTE_BIN set is a configuration error
/// before any case runs, not a failure of every case.
#[test]
fn an_unset_waste_bin_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = cases(tmp.path());
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(["certify", "--engine"])
        .arg(repository_profile())
        .arg("--cases")
        .arg(&cases)
        .env_remove("WASTE_BIN")
        .env_remove("DS41_UPSTREAM")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("WASTE_BIN") && err.contains("not set"),
        "{err}"
    );
}
