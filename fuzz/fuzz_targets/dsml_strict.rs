//! A completion parsed with the strict (reference) grammar, in both thinking modes.
#![no_main]
use ds41_engine::dsml::{parse, ParseMode, ThinkingMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for mode in [ThinkingMode::Chat, ThinkingMode::Thinking] {
        if let Err(e) = parse(text, ParseMode::strict(mode)) {
            // An error is one bounded line, whatever the input's size.
            assert!(
                e.to_string().len() < 4096,
                "error message of {} bytes",
                e.to_string().len()
            );
        }
    }
});
