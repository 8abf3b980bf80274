// Build-time switches for tests that need data from outside the repository (included by the
// crates' build.rs). libtest decides `#[ignore]` at compile time, so a test that needs
// `DS41_UPSTREAM`, a release snapshot (`DS41_RELEASE`) or the long tier (`DS41_LONG=1`) is
// compiled with `#[cfg_attr(not(CFG), ignore = "why")]` and reported as ignored, with the
// reason, when the variable is unset: never as passed. Changing a variable rebuilds the crate.

const SWITCHES: [(&str, &str); 3] = [
    ("DS41_UPSTREAM", "ds41_upstream"),
    ("DS41_RELEASE", "ds41_release"),
    ("DS41_LONG", "ds41_long"),
];

fn external_data_cfg() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../build-support/external_data_cfg.rs");
    for (var, cfg) in SWITCHES {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        let on = match std::env::var(var) {
            Ok(v) if var == "DS41_LONG" => v == "1",
            Ok(v) => !v.is_empty(),
            Err(_) => false,
        };
        if on {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
