//! Runs the Python tests of goldens/regen/ (the kernels against hand-computed cases, the
//! official-model driver on its toy stand-in, the DSML, tokenizer and WASTE drivers on toys)
//! when `DS41_PYTHON` names a Python with goldens/regen/requirements.txt installed, e.g.
//! `DS41_PYTHON=/tmp/ds41-venv/bin/python cargo test -p ds41-conformance --test regen_python`.
//! About 30 s. Without the variable the test prints `SKIPPED: ...` and returns; with it, a
//! Python that lacks torch (or any failing or absent Python test) fails the test.
//! `DS41_UPSTREAM` and `DS41_TOKENIZER_WHEEL` are passed through (the Python tests that need
//! them skip, saying so, when unset).

use std::path::Path;
use std::process::Command;

#[test]
fn regen_python_tests() {
    let Some(python) = std::env::var_os("DS41_PYTHON").filter(|v| !v.is_empty()) else {
        eprintln!(
            "SKIPPED: DS41_PYTHON not set (a Python with goldens/regen/requirements.txt, \
             e.g. /tmp/ds41-venv/bin/python)"
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let probe = Command::new(&python)
        .args(["-c", "import torch, tokenizers, safetensors, numpy"])
        .output()
        .unwrap_or_else(|e| panic!("DS41_PYTHON={python:?} cannot be run: {e}"));
    assert!(
        probe.status.success(),
        "DS41_PYTHON={python:?} lacks the pinned regen dependencies:\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    for (dir, pattern) in [
        ("goldens/regen/model", "test_*.py"),
        ("goldens/regen", "test_regen*.py"),
    ] {
        let out = Command::new(&python)
            .args(["-B", "-m", "unittest", "discover", "-s", dir, "-p", pattern])
            .current_dir(&root)
            .output()
            .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
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
        let skipped: Vec<&str> = stderr.lines().filter(|l| l.contains("SKIPPED")).collect();
        eprintln!("{dir}: {ran} python tests ran, all passed");
        for line in skipped {
            eprintln!("  {line}");
        }
    }
}
