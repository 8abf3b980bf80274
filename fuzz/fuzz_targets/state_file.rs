//! A session state file (docs/STATE.md) decoded for the synthetic `tiny` model.
#![no_main]
use std::path::Path;
use std::sync::OnceLock;

use ds41_engine::config::Config;
use ds41_engine::model::Options;
use libfuzzer_sys::fuzz_target;

fn config() -> &'static Config {
    static CELL: OnceLock<Config> = OnceLock::new();
    CELL.get_or_init(|| {
        Config::from_release_json(&ds41_fuzz::release().pristine.join("config.json"))
            .expect("tiny config")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ =
        ds41_engine::state::decode(data, Path::new("fuzz.state"), config(), &Options::default());
});
