//! The workspace is rustfmt-clean: `cargo fmt --all -- --check` from the workspace root. Where
//! rustfmt is not installed the trial is reported ignored with that reason, never passed.

use std::path::Path;
use std::process::Command;

use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let trial = Trial::test("workspace_is_rustfmt_clean", check);
    let trial = match rustfmt_missing() {
        Some(why) => trial.with_ignored_flag(true).with_kind(why),
        None => trial,
    };
    libtest_mimic::run(&args, vec![trial]).exit();
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn rustfmt_missing() -> Option<&'static str> {
    let ok = Command::new(cargo())
        .args(["fmt", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!ok).then_some("SKIPPED: `cargo fmt` (rustfmt) is not installed")
}

fn check() -> Result<(), Failed> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(cargo())
        .args(["fmt", "--all", "--", "--check"])
        .current_dir(&root)
        .output()
        .map_err(|e| format!("running cargo fmt: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let diff = String::from_utf8_lossy(&out.stdout);
    let files: Vec<&str> = diff
        .lines()
        .filter_map(|l| l.strip_prefix("Diff in "))
        .collect();
    Err(format!(
        "`cargo fmt --all -- --check` failed (run `cargo fmt --all`); first places: {}{}",
        files.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
        String::from_utf8_lossy(&out.stderr)
    )
    .into())
}
