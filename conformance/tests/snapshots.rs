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
