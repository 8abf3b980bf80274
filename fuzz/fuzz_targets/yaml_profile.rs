//! A command profile (YAML) loaded and validated.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = ds41_fuzz::scratch_file("profile.yaml", data);
    let _ = ds41_conformance::profile::Profile::load(&path);
});
