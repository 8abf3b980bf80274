//! `ds41 synth` end to end through the binary: listing, writing, refusing to overwrite,
//! `--force`, mutants, and the typed refusal of an inapplicable mutant.

use std::process::Command;

fn ds41(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn list_names_every_preset_and_mutant() {
    let (code, out, _) = ds41(&["synth", "--list"]);
    assert_eq!(code, 0);
    for p in ds41_synthetic::list_presets() {
        assert!(out.contains(p.name), "{}", p.name);
    }
    for m in ds41_synthetic::list_mutants() {
        assert!(
            out.contains(m.name) && out.contains(&m.expect.to_string()),
            "{}",
            m.name
        );
    }
}

#[test]
fn writes_refuses_to_overwrite_and_forces() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ck");
    let out_s = out.to_str().unwrap();
    let (code, stdout, stderr) = ds41(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "container",
        "--seed",
        "9",
        "--out",
        out_s,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("wrote"), "{stdout}");
    assert!(out.join("manifest.json").is_file() && out.join("specials.json").is_file());
    let before = std::fs::read(out.join("trunk.bin")).unwrap();

    let (code, _, stderr) = ds41(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "container",
        "--seed",
        "10",
        "--out",
        out_s,
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not empty"), "{stderr}");
    assert_eq!(
        std::fs::read(out.join("trunk.bin")).unwrap(),
        before,
        "nothing overwritten"
    );

    std::fs::write(out.join("my-notes.txt"), "keep me").unwrap();
    let (code, stdout, stderr) = ds41(&[
        "synth", "--preset", "tiny", "--layout", "release", "--out", out_s, "--force",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("my-notes.txt"),
        "reports what it kept: {stdout}"
    );
    assert!(
        !out.join("trunk.bin").exists(),
        "the previous container's files are gone"
    );
    assert!(out.join("model.safetensors").is_file());
    assert_eq!(
        std::fs::read_to_string(out.join("my-notes.txt")).unwrap(),
        "keep me"
    );
}

#[test]
fn mutants_are_written_and_inapplicable_ones_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let (code, _, stderr) = ds41(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "container",
        "--mutant",
        "bad-crc",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let side: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ds41-synthetic.json")).unwrap()).unwrap();
    assert_eq!(side["mutant"], "bad-crc");
    let err = ds41_synthetic::mutants::read_everything(&out).unwrap_err();
    assert!(
        ds41_synthetic::mutants::find("bad-crc")
            .unwrap()
            .expect
            .matches(&err),
        "{err}"
    );

    let out2 = tmp.path().join("n");
    let (code, _, stderr) = ds41(&[
        "synth",
        "--preset",
        "tiny",
        "--layout",
        "release",
        "--mutant",
        "bad-crc",
        "--out",
        out2.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("does not apply"), "{stderr}");
    let (code, _, stderr) = ds41(&[
        "synth",
        "--preset",
        "waste-tiny",
        "--layout",
        "release",
        "--out",
        out2.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no release layout"), "{stderr}");
}
