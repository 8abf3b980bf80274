//! The gates directory with one profile file replaced by the input (first byte picks which).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let names = ["exact.yaml", "upstream.yaml", "quantized.yaml"];
    for n in names {
        std::fs::copy(
            ds41_fuzz::repo_root().join("gates").join(n),
            dir.path().join(n),
        )
        .expect("copy gates");
    }
    std::fs::write(dir.path().join(names[pick as usize % 3]), data).expect("write");
    let _ = ds41_conformance::gates::GateSet::load(dir.path());
});
