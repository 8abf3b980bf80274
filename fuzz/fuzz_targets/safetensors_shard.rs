//! A release checkpoint whose `model.safetensors` is the input (valid config.json): header
//! parsing, tensor table checks, and reading every tensor the open accepted.
#![no_main]
use ds41_engine::checkpoint::{Checkpoint, ReleaseCheckpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fx = ds41_fuzz::release();
    fx.with_file("model.safetensors", data, |dir| {
        if let Ok(ck) = ReleaseCheckpoint::open(dir) {
            for name in ck.names() {
                let _ = ck.tensor_f32(&name);
            }
        }
    });
});
