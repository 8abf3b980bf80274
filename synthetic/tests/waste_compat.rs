//! The `waste-tiny` container is WASTE's `make_test_container.py --ds41` output byte for byte,
//! and `waste-vq4p` its `--ds41 --index-bits 6` output (CONTAINER.md §10, §15 step 1). Seed 0
//! (the script's default) is pinned here by the sha256 of each file the script writes at
//! Penguinjanator/warp 8d5405d8; with a WASTE checkout (`DS41_WASTE`),
//! `regen_python::waste-containers-vs-make_test_container` runs the script itself for seeds 0-3
//! and compares.

use ds41_synthetic::{generate, hash_files, Layout};

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

/// `make_test_container.py OUT --ds41 --index-bits 6` (seed 0): file name and sha256.
const WASTE_VQ4P_SEED0: [(&str, &str); 13] = [
    (
        "codebooks.bin",
        "d35db8a68efba4b9f4ddacb87ceced3590dee46366fe262d0bf055ea59ce9635",
    ),
    (
        "engram-L1.bin",
        "366110bd63e313fe040f1b48b44af523a536b327680fd93670a7ae8eb2d78535",
    ),
    (
        "engram-L3.bin",
        "6bf91588442a5301a9e77b91643c937d151f9861d419609d2d4fbcc8178abe42",
    ),
    (
        "engram-tokmap.bin",
        "8808405eec6fbe306fe3369f88daed79dd5613ddbb5e801f632b01d6218c5f08",
    ),
    (
        "engram.json",
        "aca2fc92f04c9b87fd3ccce9faff4cd7eee342d1fcfd5f00444dbaccdffbfc61",
    ),
    (
        "experts-L0.bin",
        "155c448950b23ea4098a9f471b21f214b8b513141387f13f6be735db177f8c8e",
    ),
    (
        "experts-L1.bin",
        "8fefd2f5283665bac5653b674bb5a48ff8aa14795ca4d9b31d0ba17d683a3284",
    ),
    (
        "experts-L2.bin",
        "ba84b07fce6bfe15929eb3fb60ffd8debb296532a21b85f70bc4391ba9a5361e",
    ),
    (
        "experts-L3.bin",
        "dcbbb2fd6fce106abda7821351a545a7c4008df419bf13aa5caf132656e795b1",
    ),
    (
        "experts-L4.bin",
        "e66b9090eedcc53c6cc78f60b1f72e7c1779a67e41db5259ebe318ad550f8bf0",
    ),
    (
        "experts-L5.bin",
        "5d6773aebb5398317716a4b6f895b1162376db79fbfa25dc1698c920bf2fc484",
    ),
    (
        "manifest.json",
        "cf22bf0edc9e9b50e490ab9373c066e75d506a090e7ab154e60939ef98bec11b",
    ),
    (
        "trunk.bin",
        "25039d00a515fffc39a354f399cb014016dded4296d52ac37d8a2a33332ffc0d",
    ),
];

/// `preset`'s seed-0 container has exactly WASTE's files, byte for byte, and only the
/// generator's own record besides.
fn assert_equals_wastes_files(preset: &str, pins: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let g = generate(preset, Layout::Container, 0, &out).unwrap();
    let ours = hash_files(&out, &g.files).unwrap();
    let bad: Vec<String> = pins
        .iter()
        .filter(|(name, sha)| ours.get(*name).map(String::as_str) != Some(*sha))
        .map(|(name, sha)| format!("{name}: ours {:?}, WASTE's {sha}", ours.get(*name)))
        .collect();
    assert!(
        bad.is_empty(),
        "{preset}: files differing from WASTE's seed-0 container:\n{}",
        bad.join("\n")
    );
    let extra: Vec<&String> = g
        .files
        .iter()
        .filter(|f| !pins.iter().any(|(n, _)| n == f) && *f != "ds41-synthetic.json")
        .collect();
    assert!(
        extra.is_empty(),
        "{preset}: files WASTE does not write: {extra:?}"
    );
}

#[test]
fn waste_tiny_container_seed0_equals_wastes_files() {
    assert_equals_wastes_files("waste-tiny", &WASTE_SEED0);
}

#[test]
fn waste_vq4p_container_seed0_equals_wastes_files() {
    assert_equals_wastes_files("waste-vq4p", &WASTE_VQ4P_SEED0);
}
