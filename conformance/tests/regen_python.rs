//! Runs the Python tests of goldens/regen/ (the kernels against hand-computed cases, the
//! official-model driver on its toy stand-in, the DSML and WASTE drivers on toys) when a Python
//! with goldens/regen/requirements.txt installed is named by `DS41_REGEN_PYTHON`, e.g.
//! `DS41_REGEN_PYTHON=/tmp/ds41-venv/bin/python cargo test -p ds41-conformance --test regen_python`.
//! About a minute; skipped (with the reason on stderr) when the variable is unset.

use std::path::Path;
use std::process::Command;

#[test]
fn regen_python_tests() {
    let Some(python) = std::env::var_os("DS41_REGEN_PYTHON").filter(|v| !v.is_empty()) else {
        eprintln!(
            "SKIPPED: DS41_REGEN_PYTHON not set (a Python with goldens/regen/requirements.txt)"
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (dir, pattern) in [
        ("goldens/regen/model", "test_*.py"),
        ("goldens/regen", "test_regen*.py"),
    ] {
        let out = Command::new(&python)
            .args(["-B", "-m", "unittest", "discover", "-s", dir, "-p", pattern])
            .current_dir(&root)
            .output()
            .expect("run python");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{dir}: python tests failed:\n{stderr}"
        );
        let ran = stderr
            .lines()
            .find_map(|l| {
                l.strip_prefix("Ran ")?
                    .split_whitespace()
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .unwrap_or(0);
        assert!(ran > 0, "{dir}: no test ran:\n{stderr}");
        eprintln!("{dir}: {ran} python tests passed");
    }
}
