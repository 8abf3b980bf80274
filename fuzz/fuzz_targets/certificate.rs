//! A certificate (JSON) verified as `ds41 verify-certificate --no-report` does.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = ds41_fuzz::scratch_file("certificate.json", data);
    let _ = ds41_conformance::report::certificate::verify(
        &path,
        ds41_conformance::report::certificate::ReportCheck::Skipped,
        None,
    );
});
