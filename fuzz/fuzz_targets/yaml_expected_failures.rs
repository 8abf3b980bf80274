//! An expected-failures list (YAML) checked against the real suite's case names.
#![no_main]
use std::sync::OnceLock;

use ds41_conformance::case::Case;
use libfuzzer_sys::fuzz_target;

fn cases() -> &'static Vec<Case> {
    static CELL: OnceLock<Vec<Case>> = OnceLock::new();
    CELL.get_or_init(|| {
        ds41_conformance::runner::load_suite(&ds41_fuzz::repo_root().join("conformance/cases"))
            .unwrap_or_default()
    })
}

fuzz_target!(|data: &[u8]| {
    let (_dir, path) = ds41_fuzz::scratch_file("expected-failures.yaml", data);
    let _ = ds41_conformance::runner::ExpectedFailures::load(&path, cases());
});
