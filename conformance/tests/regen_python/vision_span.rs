//! goldens/regen/vision_span.py, run afresh with the official `image_processor.py` and
//! `encoding.py` on the release tokenizer and inference config, reproduces the committed span
//! golden (goldens/vision/span/expected.json) byte for byte.

use std::path::Path;
use std::process::Command;

pub fn span_golden_reproduces(python: &Path, inference: &Path, encoding: &Path, tokenizer: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(python)
        .args(["-W", "ignore"])
        .arg(root.join("goldens/regen/vision_span.py"))
        .arg("--inference")
        .arg(inference)
        .arg("--encoding")
        .arg(encoding)
        .arg("--tokenizer")
        .arg(tokenizer)
        .arg("--out")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vision_span.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh = std::fs::read(tmp.path().join("expected.json")).unwrap();
    let committed = std::fs::read(root.join("goldens/vision/span/expected.json")).unwrap();
    assert!(
        fresh == committed,
        "the official prepare_vl_inputs no longer gives goldens/vision/span/expected.json \
         ({} bytes fresh, {} committed)",
        fresh.len(),
        committed.len()
    );
}
