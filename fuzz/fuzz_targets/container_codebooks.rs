//! A WASTE container whose `codebooks.bin` is the input.
#![no_main]
use ds41_engine::checkpoint::ContainerCheckpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fx = ds41_fuzz::container();
    fx.with_file("codebooks.bin", data, |dir| {
        let _ = ContainerCheckpoint::open(dir);
    });
});
