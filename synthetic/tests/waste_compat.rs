//! The `waste-tiny` container is WASTE's `make_test_container.py --ds41` output byte for byte
//! (CONTAINER.md §10, §15 step 1). Seed 0 (the script's default) is pinned here by the sha256
//! of each file the script writes at Penguinjanator/warp 8d5405d8; with a WASTE checkout
//! (`DS41_WASTE`), `regen_python::waste-containers-vs-make_test_container` runs the script
//! itself for seeds 0-3 and compares.

use ds41_synthetic::{hash_files, waste_test_container};

/// `make_test_container.py OUT --ds41` (seed 0): file name and sha256.
const WASTE_SEED0: [(&str, &str); 13] = [
    (
        "codebooks.bin",
        "e63ac7b9d409470815285edbaf9219611146fad0837cffb758e36943af86635f",
    ),
    (
        "engram-L1.bin",
        "903e6878e07a01f9313a3676dddd9c725aaddf87f0df71add07db9fffd6dda4c",
    ),
    (
        "engram-L3.bin",
        "6753159317b5ebdd38c628b48570bf727cffe515a9c147a70976c163805f3610",
    ),
    (
        "engram-tokmap.bin",
        "8808405eec6fbe306fe3369f88daed79dd5613ddbb5e801f632b01d6218c5f08",
    ),
    (
        "engram.json",
        "67eae7a7eca74dc48cca61eeccaec28384bc68655b0c6df03e70052a13df961a",
    ),
    (
        "experts-L0.bin",
        "4382297106f82eea35053e4cea3adaeed19b3ff3d2523bd3b1580d634ca988c6",
    ),
    (
        "experts-L1.bin",
        "13e44dfd145bfaf3a5b42d8b4ccec0847360485d090037ada5863bf76bef7215",
    ),
    (
        "experts-L2.bin",
        "556e8be4285b8f6122729909939b15d1965c97b20427e7440478142b8cdd5029",
    ),
    (
        "experts-L3.bin",
        "7ab5139b06a9f81be239193c9780267d102e46e0b8302429096ccb395877b3dc",
    ),
    (
        "experts-L4.bin",
        "5ee71b8038b6ad8fa4f7294d46b7394998cc3fb942cbd5f0fb94d965cb09c009",
    ),
    (
        "experts-L5.bin",
        "5fd87ba053766e2f8020115c8abe2259d7d11773dae59b260156fda08687aa94",
    ),
    (
        "manifest.json",
        "8f648cd76c2c6f920b475004076e9c9555919f31a527d6634955a6c116b1b998",
    ),
    (
        "trunk.bin",
        "25039d00a515fffc39a354f399cb014016dded4296d52ac37d8a2a33332ffc0d",
    ),
];

#[test]
fn waste_tiny_container_seed0_equals_wastes_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let g = waste_test_container(&out).unwrap();
    let ours = hash_files(&out, &g.files).unwrap();
    let bad: Vec<String> = WASTE_SEED0
        .iter()
        .filter(|(name, sha)| ours.get(*name).map(String::as_str) != Some(*sha))
        .map(|(name, sha)| format!("{name}: ours {:?}, WASTE's {sha}", ours.get(*name)))
        .collect();
    assert!(
        bad.is_empty(),
        "files differing from WASTE's seed-0 container:\n{}",
        bad.join("\n")
    );
    // Beyond WASTE's files, only the generator's own record.
    let extra: Vec<&String> = g
        .files
        .iter()
        .filter(|f| !WASTE_SEED0.iter().any(|(n, _)| n == f) && *f != "ds41-synthetic.json")
        .collect();
    assert!(extra.is_empty(), "files WASTE does not write: {extra:?}");
}
