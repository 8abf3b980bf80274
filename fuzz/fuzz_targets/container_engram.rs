//! A WASTE container with one Engram file replaced by the input: the first byte picks
//! `engram.json`, `engram-tokmap.bin` or an `engram-L*.bin` table (rows read back).
#![no_main]
use ds41_engine::checkpoint::{Checkpoint, ContainerCheckpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let fx = ds41_fuzz::container();
    let mut files = vec!["engram.json".to_string(), "engram-tokmap.bin".to_string()];
    files.extend(fx.files(|n| n.starts_with("engram-L") && n.ends_with(".bin")));
    let file = &files[pick as usize % files.len()];
    fx.with_file(file, data, |dir| {
        if let Ok(ck) = ContainerCheckpoint::open(dir) {
            let _ = ck.engram_constants();
            let _ = ck.engram_token_map();
            for name in ck.names() {
                if name.contains(".engram.embed") {
                    let _ = ck.tensor_f32(&name);
                }
            }
        }
    });
});
