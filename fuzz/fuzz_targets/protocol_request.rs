//! Request lines served by the built-in reference over the engine protocol (the
//! `ds41 serve-adapter` side, PROTOCOL.md). Requests naming a model (`load`, `forward`,
//! `engram_hash`) are skipped: they open checkpoints named by the input, which is the
//! checkpoint targets' business, and a forward is too slow for a fuzz input.
#![no_main]
use ds41_conformance::protocol::serve;
use ds41_conformance::reference::ReferenceEngine;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.windows(5).any(|w| w == b"model") {
        return;
    }
    let mut engine = ReferenceEngine::new();
    let mut out = Vec::new();
    let _ = serve(&mut engine, data, &mut out);
});
