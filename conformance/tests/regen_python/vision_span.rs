//! goldens/regen/vision_span.py, run afresh with the official `image_processor.py` and
//! `encoding.py`, reproduces the committed span goldens byte for byte: on the release tokenizer
//! and inference config (goldens/vision/span) and on a freshly synthesised `vision` preset,
//! seed 7 (goldens/vision/span_synthetic).

use std::path::Path;
use std::process::Command;

pub fn span_golden_reproduces(python: &Path, inference: &Path, encoding: &Path, tokenizer: &Path) {
    reproduce(
        python,
        inference,
        encoding,
        &["--tokenizer".as_ref(), tokenizer.as_os_str()],
        "span",
    );
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("vision-seed7");
    ds41_synthetic::generate(
        "vision",
        ds41_engine::checkpoint::Layout::Release,
        7,
        &model,
    )
    .unwrap();
    reproduce(
        python,
        inference,
        encoding,
        &["--model".as_ref(), model.as_os_str()],
        "span_synthetic",
    );
}

fn reproduce(
    python: &Path,
    inference: &Path,
    encoding: &Path,
    source: &[&std::ffi::OsStr],
    golden: &str,
) {
    let tmp = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(python)
        .args(["-W", "ignore"])
        .arg(root.join("goldens/regen/vision_span.py"))
        .arg("--inference")
        .arg(inference)
        .arg("--encoding")
        .arg(encoding)
        .args(source)
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
    let committed =
        std::fs::read(root.join(format!("goldens/vision/{golden}/expected.json"))).unwrap();
    assert!(
        fresh == committed,
        "the official prepare_vl_inputs no longer gives goldens/vision/{golden}/expected.json \
         ({} bytes fresh, {} committed)",
        fresh.len(),
        committed.len()
    );
}
