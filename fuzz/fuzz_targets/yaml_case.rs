//! A conformance case file (YAML) loaded and validated.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = ds41_fuzz::scratch_file("case.yaml", data);
    let _ = ds41_conformance::case::load_case_file(&path);
});
