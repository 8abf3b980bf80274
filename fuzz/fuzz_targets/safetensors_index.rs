//! A sharded release checkpoint whose `model.safetensors.index.json` is the input.
#![no_main]
use ds41_engine::checkpoint::ReleaseCheckpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fx = ds41_fuzz::release_sharded();
    fx.with_file("model.safetensors.index.json", data, |dir| {
        let _ = ReleaseCheckpoint::open(dir);
    });
});
