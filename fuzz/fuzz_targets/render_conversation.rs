//! A conversation file (the official test-case JSON) loaded and rendered, as `ds41 render`
//! does, in both thinking modes.
#![no_main]
use ds41_engine::dsml::{self, ThinkingMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(case) = dsml::load_case(text) {
        for mode in [ThinkingMode::Chat, ThinkingMode::Thinking] {
            let _ = dsml::render(&case.conversation, &case.options(mode, None));
        }
    }
});
