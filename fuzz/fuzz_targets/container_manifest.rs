//! A WASTE container whose `manifest.json` is the input (other files valid).
#![no_main]
use ds41_engine::checkpoint::ContainerCheckpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fx = ds41_fuzz::container();
    fx.with_file("manifest.json", data, |dir| {
        let _ = ContainerCheckpoint::open(dir);
    });
});
