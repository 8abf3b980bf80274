//! The engine's vision tower and aligner against the official `inference/vision.py`, freshly
//! run by goldens/regen/vision_tower.py (small seeded random weights, corpus PNGs), with the
//! same check as the committed goldens (`vision_goldens::check_tower`).

use std::path::Path;
use std::process::Command;

use ds41_conformance::vision_goldens::{check_tower, TOWER_IMAGES};

pub fn tower_matches_official(python: &Path, inference: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let images = root.join("goldens/vision/preprocess/images");
    let mut cmd = Command::new(python);
    cmd.args(["-W", "ignore"])
        .arg(root.join("goldens/regen/vision_tower.py"))
        .arg("--inference")
        .arg(inference)
        .arg("--out")
        .arg(tmp.path());
    for name in TOWER_IMAGES {
        cmd.arg(images.join(format!("{name}.png")));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "vision_tower.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = check_tower(tmp.path(), &images).unwrap();
    eprintln!("{}", report.summary());
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n"));
}
