//! A tokenizer.json: loading, then encoding and decoding a short mixed text.
#![no_main]
use std::path::Path;

use ds41_engine::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = Tokenizer::from_json_bytes(data, Path::new("tokenizer.json")) {
        let ids = t.encode_markup("Hello, 世界! <｜begin▁of▁sentence｜> 123\n\t x");
        let _ = t.decode(&ids, false);
    }
});
