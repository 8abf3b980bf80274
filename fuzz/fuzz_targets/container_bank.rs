//! A WASTE container whose first expert bank (`experts-L*.bin`) is the input; every expert
//! of an accepted bank is read and CRC-checked.
#![no_main]
use ds41_engine::checkpoint::{Checkpoint, ContainerCheckpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fx = ds41_fuzz::container();
    let banks = fx.files(|n| n.starts_with("experts-L") && n.ends_with(".bin"));
    let Some(bank) = banks.first() else { return };
    fx.with_file(bank, data, |dir| {
        if let Ok(ck) = ContainerCheckpoint::open(dir) {
            let layer: usize = bank
                .trim_start_matches("experts-L")
                .trim_end_matches(".bin")
                .parse()
                .unwrap_or(0);
            for e in 0..ck.config().n_routed_experts {
                let _ = ck.verify_record_crc(layer, e);
            }
            for name in ck.names() {
                if name.starts_with(&format!("layers.{layer}.ffn.experts.")) {
                    let _ = ck.tensor_f32(&name);
                }
            }
        }
    });
});
