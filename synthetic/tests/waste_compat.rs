//! The `waste-tiny` container is WASTE's `make_test_container.py --ds41` output byte for byte
//! (CONTAINER.md §10, §15 step 1): compared file by file with `upstream/waste_ds41_synth/`.

use ds41_engine::testing::upstream;
use ds41_synthetic::{generate, hash_files, Layout};

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn waste_tiny_container_seed0_equals_upstream_files() {
    let up = upstream();
    let reference = up.join("waste_ds41_synth/container");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let g = generate("waste-tiny", Layout::Container, 0, &out).unwrap();
    let ours = hash_files(&out, &g.files).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&reference)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 13, "upstream container: {names:?}");
    let theirs = hash_files(&reference, &names).unwrap();
    let mut bad = Vec::new();
    for n in &names {
        if ours.get(n) != theirs.get(n) {
            bad.push(n.clone());
        }
    }
    assert!(
        bad.is_empty(),
        "files differing from WASTE's seed-0 container: {bad:?}"
    );
}
