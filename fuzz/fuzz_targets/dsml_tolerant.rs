//! A completion parsed with the tolerant grammar (never fails), in both thinking modes.
#![no_main]
use ds41_engine::dsml::{parse, ParseMode, ThinkingMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for mode in [ThinkingMode::Chat, ThinkingMode::Thinking] {
        assert!(parse(text, ParseMode::tolerant(mode)).is_ok());
    }
});
